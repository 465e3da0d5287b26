/* safetensors_header.c — libFuzzer target for common/safetensors.h.
 *
 * The input is a whole file: 8-byte length, JSON header, data.  Whatever the
 * bytes, the parser must not crash, leak or read out of bounds, and a header
 * it accepts must satisfy the invariants it promises (checked here, trapping
 * on a violation).  Built and run by scripts/fuzz.sh (`make fuzz`).
 *
 * fuzz-sources: common/
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/safetensors.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

static void invariants(const st_file *f, uint64_t file_size)
{
    uint64_t pos = st_data_offset(f);
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        uint64_t bytes = t->numel * st_dtype_bits(t->dtype) / 8;
        REQUIRE(t->begin == pos && t->end >= t->begin && t->end - t->begin == bytes);
        REQUIRE(t->ndim <= ST_MAX_DIMS);
        REQUIRE(st_find(f, t->name) == t);
        pos = t->end;
    }
    REQUIRE(pos == st_data_offset(f) + st_data_size(f));
    REQUIRE(file_size == ST_SIZE_UNKNOWN || pos == file_size);
    for (size_t i = 0; i < st_metadata_count(f); i++) {
        const char *k, *v;
        REQUIRE(st_metadata_at(f, i, &k, &v) == 0 && st_metadata_get(f, k) == v);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_file *f = NULL;
    uint64_t n;
    shoal_err err;

    if (size < 8)
        return 0;
    if (st_header_len(data, size, &n, &err) != 0)
        return 0;
    if (st_parse(data + 8, (size_t)n, size, &f, &err) == 0) {
        invariants(f, size);
        st_free(f);
    } else {
        REQUIRE(f == NULL && err.code < 0 && err.msg[0]);
    }
    /* The same header with the size unknown. */
    if (st_parse(data + 8, (size_t)n, ST_SIZE_UNKNOWN, &f, &err) == 0) {
        invariants(f, ST_SIZE_UNKNOWN);
        st_free(f);
    }
    return 0;
}
