/* safetensors.h — parse and validate a safetensors header held in memory.
 *
 * Owns: the table of tensors of one .safetensors file (name, dtype, shape,
 * absolute byte range) and its `__metadata__` map, built by a strict parser
 * that refuses anything a correct writer would not produce.  Does not own
 * fetching the header bytes (hub.h does that remotely; st_read_file() reads a
 * local file) nor reading tensor data.
 *
 * File layout (hf-hub.md §5):
 *
 *   offset      size  field
 *   0           8     N, u64 little-endian: length of the JSON header
 *   8           N     UTF-8 JSON object, may start with whitespace and is
 *                     padded with trailing spaces (writers pad to 8)
 *   8+N         D     data; tensor `t` occupies [8+N+B, 8+N+E) where
 *                     "data_offsets":[B,E] are relative to 8+N
 *
 * Validation (each failure names the tensor where there is one):
 *   1. N <= ST_HEADER_MAX (SHOAL_ETOOBIG) and 8+N <= file size (SHOAL_ERANGE).
 *   2. The JSON is valid UTF-8 JSON, an object, first non-blank byte '{',
 *      no duplicate keys (SHOAL_EFORMAT).
 *   3. Every entry but `__metadata__` is {"dtype":S, "shape":[...],
 *      "data_offsets":[B,E]}; unknown members are ignored.  dtype is one of
 *      st_dtype (unknown: SHOAL_EUNSUPPORTED); shape has at most ST_MAX_DIMS
 *      non-negative integers (SHOAL_EFORMAT); B <= E are non-negative integers.
 *   4. prod(shape)·bits is a multiple of 8 (sub-byte dtypes end on a byte)
 *      and prod(shape)·bits/8 == E-B (SHOAL_EFORMAT); a product that
 *      overflows 64 bits is SHOAL_ERANGE.
 *   5. Sorted by (B, E, name), the ranges tile [0, D) with no hole and no
 *      overlap (SHOAL_EFORMAT).
 *   6. 8+N+D == file size: data past the end of the file, or trailing bytes
 *      after the last tensor, are SHOAL_ERANGE (as the Rust reference
 *      implementation does).
 *   7. `__metadata__`, if present and not null, maps strings to strings.
 *
 * Names are returned exactly as decoded from the JSON (NUL-free UTF-8).
 */
#ifndef SHOAL_SAFETENSORS_H
#define SHOAL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Largest header accepted, as the Rust reference (safetensors MAX_HEADER_SIZE). */
#define ST_HEADER_MAX 100000000ULL
/* Most dimensions a tensor may have. */
#define ST_MAX_DIMS 8
/* Pass as file_size when the size is unknown: the end-of-file checks (1,6)
 * are skipped.  Use only when the caller checks the size later. */
#define ST_SIZE_UNKNOWN UINT64_MAX

/* Every dtype of hf-hub.md §5.  Values are stable within a build only. */
typedef enum st_dtype {
    ST_F64, ST_I64, ST_U64, ST_C64,
    ST_F32, ST_I32, ST_U32,
    ST_F16, ST_BF16, ST_I16, ST_U16,
    ST_I8, ST_U8, ST_BOOL, ST_F8_E4M3, ST_F8_E5M2, ST_F8_E8M0,
    ST_F8_E4M3FNUZ, ST_F8_E5M2FNUZ,
    ST_F6_E2M3, ST_F6_E3M2,
    ST_F4,
    ST_DTYPE_COUNT
} st_dtype;

/* "BF16"; "?" for a value out of range. */
const char *st_dtype_name(st_dtype t);
/* Bits per element (64, 32, 16, 8, 6 or 4); 0 for a value out of range. */
unsigned st_dtype_bits(st_dtype t);
/* Parse an exact, case-sensitive dtype name.  0, or SHOAL_EUNSUPPORTED
 * (*out unchanged). */
int st_dtype_parse(const char *name, st_dtype *out);

/* One tensor.  Borrowed from its st_file; lives until st_free(). */
typedef struct st_tensor {
    const char *name;
    st_dtype    dtype;
    unsigned    ndim;                 /* 0 for a scalar (shape []) */
    uint64_t    shape[ST_MAX_DIMS];   /* [0, ndim) valid, rest 0 */
    uint64_t    numel;                /* product of shape (1 for a scalar) */
    uint64_t    begin, end;           /* absolute file offsets, [begin, end) */
} st_tensor;

typedef struct st_file st_file;

/* Read N from the first 8 bytes and check it against the cap and the file
 * size (validation 1).  On success *json_len = N; the JSON is the N bytes
 * at offset 8 and the data start at 8+N. */
int st_header_len(const uint8_t first8[8], uint64_t file_size, uint64_t *json_len,
                  shoal_err *err);

/* Parse and validate the N JSON bytes of a file of file_size bytes (the
 * 8-byte prefix excluded; json_len is N).  On success *out is a new table
 * (caller frees with st_free); on failure *out is NULL and err says why. */
int st_parse(const uint8_t *json, size_t json_len, uint64_t file_size, st_file **out,
             shoal_err *err);

/* Read and parse the header of a local file by pread (file_size from
 * fstat).  Same result as st_parse; SHOAL_ENOTFOUND/SHOAL_EIO for I/O. */
int st_read_file(const char *path, st_file **out, shoal_err *err);
/* Same, on an open descriptor (not closed, offset not moved). */
int st_read_fd(int fd, st_file **out, shoal_err *err);

void st_free(st_file *f);

/* Tensors in file order: by begin offset (ties: zero-size first, then by
 * name).  i < st_count(); NULL past the end. */
size_t st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, size_t i);
/* By exact name in O(log n); NULL if absent. */
const st_tensor *st_find(const st_file *f, const char *name);

/* 8+N: where the data start.  The data end at st_data_offset + st_data_size. */
uint64_t st_data_offset(const st_file *f);
uint64_t st_data_size(const st_file *f);

/* __metadata__ entries, sorted by key.  Strings borrowed from f. */
size_t st_metadata_count(const st_file *f);
int st_metadata_at(const st_file *f, size_t i, const char **key, const char **value);
/* Value for key, or NULL. */
const char *st_metadata_get(const st_file *f, const char *key);

#endif
