/* render.c — the JSON text of shard headers and of the index.
 *
 * Owns: the safetensors header of a shard — the 8-byte little-endian length
 * N, then {"__metadata__":{"format":"pt"}, the tensors in file order with
 * dtype, shape and data_offsets relative to the data}, padded with spaces so
 * N is a multiple of 8 — and model.safetensors.index.json, HF's layout with
 * names sorted (two-space indent).  Does not own which tensors exist
 * (tensors.c) nor their bytes (weights.c).
 */
#include "synth/synth_int.h"
#include "common/platform.h"

#include <stdlib.h>
#include <string.h>

int synth_header_render(const synth_tensors *ts, size_t lo, size_t hi, shoal_buf *out)
{
    int rc = shoal_buf_append_le64(out, 0);   /* N, patched below */
    size_t start = out->len;

    rc = rc ? rc : shoal_buf_append_str(out, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = lo; i < hi && !rc; i++) {
        const synth_tensor *t = &ts->t[i];
        rc = shoal_buf_appendf(out, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                               synth_tensor_name(ts, t), synth_dtype_name(t->dtype));
        for (unsigned d = 0; d < t->ndim && !rc; d++)
            rc = shoal_buf_appendf(out, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
        if (!rc)
            rc = shoal_buf_appendf(out, "],\"data_offsets\":[%llu,%llu]}",
                                   (unsigned long long)t->begin,
                                   (unsigned long long)(t->begin + t->nbytes));
    }
    rc = rc ? rc : shoal_buf_append_u8(out, '}');
    while (!rc && (out->len - start) % 8)
        rc = shoal_buf_append_u8(out, ' ');
    if (!rc)
        shoal_wr_le64(out->data + start - 8, out->len - start);
    return rc;
}

static int name_cmp(const void *a, const void *b, void *arg)
{
    const synth_tensors *ts = arg;
    return strcmp(synth_tensor_name(ts, *(const synth_tensor *const *)a),
                  synth_tensor_name(ts, *(const synth_tensor *const *)b));
}

int synth_index_render(const synth_tensors *ts, shoal_buf *out)
{
    const synth_tensor **by_name = malloc((ts->count + 1) * sizeof *by_name);
    char shard[64];
    int rc, last = -1;

    if (!by_name)
        return SHOAL_ENOMEM;
    for (size_t i = 0; i < ts->count; i++)
        by_name[i] = &ts->t[i];
    shoal_qsort_r(by_name, ts->count, sizeof *by_name, name_cmp, (void *)ts);
    rc = shoal_buf_appendf(out, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n"
                           "  \"weight_map\": {\n", (unsigned long long)ts->total_bytes);
    for (size_t i = 0; i < ts->count && !rc; i++) {
        if (by_name[i]->shard != last) {
            last = by_name[i]->shard;
            synth_shard_name(last, ts->shards, shard, sizeof shard);
        }
        rc = shoal_buf_appendf(out, "    \"%s\": \"%s\"%s\n", synth_tensor_name(ts, by_name[i]),
                               shard, i + 1 < ts->count ? "," : "");
    }
    rc = rc ? rc : shoal_buf_append_str(out, "  }\n}\n");
    free(by_name);
    return rc;
}
