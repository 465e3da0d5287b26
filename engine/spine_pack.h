/* spine_pack.h — the int8 spine serialized: every matrix the engine derives
 * from the BF16 spine at load (int8 + per-row scales, or f32 for the gate
 * paths and narrow matrices), in load order, so a later load maps it
 * instead of fetching and quantizing (docs/engine.md, "Cached int8 spine").
 *
 * Owns: writing a bound model's derived matrices to a descriptor, and
 * parsing a pack strictly — it crosses a process boundary (it comes back
 * from shoald's cache), so every offset and size is checked against the
 * pack's length at open, and every matrix against what the model's config
 * expects when the model takes it (spine_pack_next).  Does not own where
 * the bytes live (the caller maps them and keeps them mapped) nor the
 * vectors, norms and the embedding (those stay their own objects).
 *
 * Threads: a pack is used by one thread (the model load).
 */
#ifndef SHOAL_ENGINE_SPINE_PACK_H
#define SHOAL_ENGINE_SPINE_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/model.h"

#define SPINE_PACK_FORMAT  1     /* the layout below */
#define SPINE_PACK_QUANT   1     /* kernels_q8_quantize_* numerics it was made with */
/* The derived-object name in shoald: format and quantizer versions are in
 * it, so a change of either is another object. */
#define SPINE_PACK_NAME    "spine-int8-p1-q1"
#define SPINE_PACK_ALIGN   64
#define SPINE_PACK_HEADER  64

typedef struct spine_pack spine_pack;

/* Write m's derived matrices (m bound with the int8 spine, not from a pack)
 * as a pack to fd from its current position, for the config whose bytes
 * are config[0..config_len).  *len_out: bytes written; xxh128_out: their
 * XXH3-128, canonical (big-endian).  0 or a negative code. */
int spine_pack_write(const engine_model *m, const uint8_t *config, size_t config_len, int fd,
                     uint64_t *len_out, uint8_t xxh128_out[16], shoal_err *err);

/* Parse the pack data[0..len) (borrowed: keep it mapped while the pack and
 * any model bound from it live) made for config[0..config_len).
 * SHOAL_EFORMAT naming what is wrong; SHOAL_EUNSUPPORTED for another format
 * or quantizer version; SHOAL_ECORRUPT when the table's hash fails. */
int spine_pack_open(const uint8_t *data, uint64_t len, const uint8_t *config,
                    size_t config_len, spine_pack **out, shoal_err *err);
void spine_pack_free(spine_pack *p);

size_t spine_pack_count(const spine_pack *p);
/* Is `name` the source tensor of some matrix in the pack? */
int spine_pack_covers(const spine_pack *p, const char *name);

/* The model's next matrix: it must be `name`, [rows, cols], f32 or int8 as
 * asked, else SHOAL_EFORMAT naming the difference.  out views the pack. */
int spine_pack_next(spine_pack *p, const char *name, size_t rows, size_t cols, int f32,
                    engine_mat *out, shoal_err *err);
/* Matrices not taken yet (0 after a complete load). */
size_t spine_pack_remaining(const spine_pack *p);
/* Start taking from the first matrix again (another load). */
void spine_pack_rewind(spine_pack *p);

#endif
