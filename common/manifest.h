/* manifest.h — a model manifest: where every tensor and routed expert of one
 * pinned model revision lives in its upstream files.
 *
 * Owns: the data structure (model identity, config.json bytes, files,
 * non-expert tensors, expert spans), its invariants, and its versioned
 * binary encoding (docs/manifest.md has the offset table).  The fetcher
 * builds a manifest from the Hub or a snapshot directory and stores it in
 * the cache as a derived object; the daemon hands it to engines, which
 * decode it here without linking the fetcher.  Does not own reading any
 * of those files (fetcher/) nor the K3 config semantics (k3_config.h).
 *
 * Invariants (manifest_check() enforces them; manifest_decode() calls it,
 * because a manifest crosses a process boundary):
 *   1. endpoint, repo, revision, commit are strings of at most
 *      MANIFEST_STR_MAX bytes, valid UTF-8 without NUL; commit non-empty.
 *   2. Every file path passes manifest_path_check() (relative, no "..",
 *      "." or empty component, no backslash or control byte); paths are
 *      unique; etags are 1..MANIFEST_ETAG_MAX bytes.
 *   3. Tensors are sorted by name with no duplicate; each lies inside its
 *      file (offset + length <= size, no overflow); ndim <= MANIFEST_MAX_DIMS;
 *      dtype is 1..15 bytes of [A-Z0-9_].
 *   4. Experts are sorted by (layer, id) with no duplicate, layer <
 *      n_layers, id < experts_per_layer; each span [offset, offset +
 *      expert_bytes) lies inside its file, and no two spans overlap.
 *   5. expert_bytes > 0 whenever there is an expert.
 */
#ifndef SHOAL_MANIFEST_H
#define SHOAL_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"

#define MANIFEST_VERSION    1
#define MANIFEST_STR_MAX    4096
#define MANIFEST_ETAG_MAX   256
#define MANIFEST_MAX_DIMS   8
#define MANIFEST_DTYPE_MAX  16
#define MANIFEST_CONFIG_MAX (16u << 20)   /* config.json bytes */
/* The encoded size cap: K3 (82,432 experts, ~2,500 tensors) needs ~2 MB. */
#define MANIFEST_ENCODED_MAX (256u << 20)

/* One upstream file at the pinned commit. */
typedef struct manifest_file {
    char    *path;         /* "model-00001-of-000096.safetensors" */
    char    *etag;         /* sha256 (LFS) or git sha1; local: see fetcher */
    uint64_t size;
} manifest_file;

/* One non-expert language tensor (vision tensors are never listed; the
 * six records of a routed expert are listed as one span in `experts`). */
typedef struct manifest_tensor {
    char    *name;         /* without the "language_model." prefix */
    uint32_t file;         /* index into files */
    uint64_t offset;       /* absolute byte offset in the file */
    uint64_t length;       /* bytes */
    char     dtype[MANIFEST_DTYPE_MAX];     /* safetensors name: "BF16" */
    uint32_t ndim;
    uint64_t shape[MANIFEST_MAX_DIMS];
    int      is_spine;     /* 1: part of the always-needed spine */
} manifest_tensor;

/* One routed expert: six back-to-back records, expert_bytes long. */
typedef struct manifest_expert {
    uint32_t layer, id;
    uint32_t file;
    uint64_t offset;       /* absolute offset of w1.weight_packed */
} manifest_expert;

/* Value struct; arrays owned by it, freed by manifest_free(). */
typedef struct manifest {
    char    *endpoint;     /* "https://huggingface.co", "" for a directory */
    char    *repo;         /* "org/name" or the directory path */
    char    *revision;     /* as asked: "main", "refs/pr/1", a commit */
    char    *commit;       /* what it resolved to (40 hex on a Hub) */
    uint8_t *config;       /* config.json bytes */
    size_t   config_len;
    uint32_t n_layers;            /* num_hidden_layers */
    uint32_t experts_per_layer;   /* num_experts */
    uint64_t expert_bytes;        /* one span: 3·I·L·17/32 */
    manifest_file   *files;
    size_t           nfiles, cap_files;
    manifest_tensor *tensors;
    size_t           ntensors, cap_tensors;
    manifest_expert *experts;
    size_t           nexperts, cap_experts;
} manifest;

/* An empty manifest (caller frees), or NULL when out of memory. */
manifest *manifest_new(void);
void manifest_free(manifest *m);

/* Copy the model identity (NULL counts as ""). */
int manifest_set_model(manifest *m, const char *endpoint, const char *repo,
                       const char *revision, const char *commit, shoal_err *err);
/* Copy config.json's bytes (at most MANIFEST_CONFIG_MAX). */
int manifest_set_config(manifest *m, const void *p, size_t n, shoal_err *err);

/* Add a file; *index (may be NULL) gets its position.  Strings copied.
 * SHOAL_EFORMAT for a path manifest_path_check() refuses, SHOAL_EEXIST
 * for a path already present. */
int manifest_file_add(manifest *m, const char *path, const char *etag, uint64_t size,
                      uint32_t *index, shoal_err *err);
/* Index of a file by path, or -1. */
long manifest_file_find(const manifest *m, const char *path);

/* Add a tensor (t->name copied; the rest by value). */
int manifest_tensor_add(manifest *m, const manifest_tensor *t, shoal_err *err);
int manifest_expert_add(manifest *m, uint32_t layer, uint32_t id, uint32_t file,
                        uint64_t offset, shoal_err *err);

/* Sort tensors and experts and check every invariant above.  Call once
 * after the last add (decode does it itself). */
int manifest_finish(manifest *m, shoal_err *err);
/* Check the invariants of a sorted manifest (SHOAL_EFORMAT / SHOAL_ERANGE
 * naming the entry). */
int manifest_check(const manifest *m, shoal_err *err);

/* Lookups on a finished manifest, O(log n); NULL if absent.  `name`
 * without the "language_model." prefix. */
const manifest_tensor *manifest_tensor_find(const manifest *m, const char *name);
const manifest_expert *manifest_expert_find(const manifest *m, uint32_t layer, uint32_t id);

/* Append the encoding of a finished manifest to out. */
int manifest_encode(const manifest *m, shoal_buf *out, shoal_err *err);
/* Decode and check; on success *out is a new manifest (caller frees), on
 * failure NULL, with the reason in err (SHOAL_EFORMAT, SHOAL_EUNSUPPORTED
 * for another version, SHOAL_ECORRUPT for a checksum mismatch). */
int manifest_decode(const uint8_t *p, size_t n, manifest **out, shoal_err *err);

/* Is `path` a safe relative file path inside a snapshot?  0 or
 * SHOAL_EFORMAT saying why. */
int manifest_path_check(const char *path, shoal_err *err);

#endif
