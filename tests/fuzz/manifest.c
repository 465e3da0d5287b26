/* manifest.c — libFuzzer target for common/manifest.h's decoder.
 *
 * A manifest crosses a process boundary (daemon -> engine), so whatever
 * the bytes, manifest_decode() must not crash, leak or read out of bounds,
 * and a manifest it accepts must satisfy manifest_check() and encode back
 * to the same bytes.  Built and run by scripts/fuzz.sh (`make fuzz`).
 *
 * fuzz-sources: common/
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <stdlib.h>

#include <xxhash.h>

#include "common/manifest.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one(const uint8_t *data, size_t size);

/* The trailer is a checksum, which random mutations almost never satisfy;
 * so each input is also decoded with its trailer recomputed, to reach the
 * body's parser. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one(data, size);
    if (size >= 40) {
        uint8_t *p = malloc(size);
        if (!p)
            return 0;
        memcpy(p, data, size);
        {
            uint64_t h = XXH64(p, size - 8, 0);
            for (int i = 0; i < 8; i++)
                p[size - 8 + i] = (uint8_t)(h >> (8 * i));
        }
        one(p, size);
        free(p);
    }
    return 0;
}

static void one(const uint8_t *data, size_t size)
{
    manifest *m = NULL;
    shoal_buf b;
    if (manifest_decode(data, size, &m, NULL) != 0) {
        REQUIRE(m == NULL);
        return;
    }
    REQUIRE(manifest_check(m, NULL) == 0);
    for (size_t i = 0; i < m->nexperts; i++)
        REQUIRE(manifest_expert_find(m, m->experts[i].layer, m->experts[i].id) == &m->experts[i]);
    for (size_t i = 0; i < m->ntensors; i++)
        REQUIRE(manifest_tensor_find(m, m->tensors[i].name) == &m->tensors[i]);
    shoal_buf_init(&b, 0);
    REQUIRE(manifest_encode(m, &b, NULL) == 0);
    REQUIRE(b.len == size && memcmp(b.data, data, size) == 0);
    shoal_buf_free(&b);
    manifest_free(m);
}
