/* stream_int.h — the streamed part of the spine (spine_stream.c), as
 * model.c builds it and engine_model_layer_ready uses it.  Private to
 * engine/forward/.  docs/engine.md, "Smaller machines". */
#ifndef SHOAL_ENGINE_STREAM_INT_H
#define SHOAL_ENGINE_STREAM_INT_H

#include "engine/forward/forward.h"

typedef struct spine_stream spine_stream;

/* A stream for layers [first, n_layers): an unlinked file in `dir`
 * (NULL: /var/tmp: on disk, where /tmp may be RAM) that the load writes each streamed
 * matrix to, layer by layer in order. */
int spine_stream_open(const char *dir, int n_layers, int first, spine_stream **out,
                      shoal_err *err);

/* Layer `layer`'s next matrix: `dst` (the model's, it stays where it is)
 * is bound to the layer's buffer before each use; w / sc its weights and
 * scales (sc NULL, sb 0 for f32), written now and not kept. */
int spine_stream_put(spine_stream *s, int layer, engine_mat *dst, k3_fmt fmt, const void *w,
                     size_t wb, const void *sc, size_t sb, shoal_err *err);

/* After the last put: the file is flushed and dropped from the page
 * cache, reopened with O_DIRECT, the two buffers allocated and the reader
 * started. */
int spine_stream_seal(spine_stream *s, shoal_err *err);

/* Layer `layer` is about to run: wait for its bytes (read now if the
 * guess was wrong), bind its matrices, start reading the next streamed
 * layer into the other buffer.  0 at once for a layer before `first`. */
int spine_stream_ready(spine_stream *s, int layer, shoal_err *err);

/* In place: a pack whose byte 0 is at `pack` and at file offset
 * `file_off` of fd (pack - file_off % 4096 is 4 KiB-aligned), layer i's
 * matrices spanning [lo[i], hi[i]) for i in [first, n_layers), none read
 * yet.  spine_stream_keep copies matrix m's bytes out of the streamed part
 * (from the file) and rebinds it there. */
int spine_stream_inplace(int fd, uint64_t file_off, uint8_t *pack, int n_layers, int first,
                         uint8_t *const *lo, uint8_t *const *hi, spine_stream **out,
                         shoal_err *err);
int spine_stream_keep(spine_stream *s, engine_mat *m, uint64_t file_off, const uint8_t *pack,
                      shoal_err *err);

/* In place, checked: layer's file range [*off, *off + *len) that every
 * pass reads and checks against the XXH3-128 (canonical) handed in by
 * spine_stream_expect (the load hashed it as part of the whole pack's
 * check); on_damaged runs on the thread of spine_stream_ready when a
 * layer's bytes stay wrong after a second read. */
int spine_stream_region(const spine_stream *s, int layer, uint64_t *off, uint64_t *len);
void spine_stream_expect(spine_stream *s, int layer, const uint8_t xxh[16]);
void spine_stream_on_damaged(spine_stream *s, engine_stream_damaged_fn fn, void *ctx);

void spine_stream_stats(const spine_stream *s, engine_stream_stats *out);
void spine_stream_free(spine_stream *s);

#endif
