/* test_xxh3.c — every XXH3 variant this build and CPU run (common/xxh3.h)
 * gives libxxhash's XXH3-128 for the same bytes: sizes around each of
 * XXH3's internal boundaries (16, 128, 240 bytes, its 64-byte stripes,
 * 1 KiB blocks and 256-byte internal buffer), fed whole and in uneven
 * pieces; and the dispatcher picks the best one there is. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/xxh3.h"

static void lib_hash(const uint8_t *p, size_t n, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}

static void canon(uint64_t h, uint64_t l, uint8_t out[16])
{
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(h >> (56 - 8 * i));
        out[8 + i] = (uint8_t)(l >> (56 - 8 * i));
    }
}

static void check_impl(const shoal_xxh3_impl *v, const uint8_t *buf, size_t n)
{
    uint8_t want[16], got[16];
    uint64_t h, l;
    XXH3_state_t *st = shoal_xxh3_new();
    assert_non_null(st);
    lib_hash(buf, n, want);
    v->once(buf, n, &h, &l);
    canon(h, l, got);
    if (memcmp(want, got, 16) != 0)
        fail_msg("%s: one-shot hash of %zu bytes differs from libxxhash", v->isa, n);
    v->reset(st);
    for (size_t at = 0, step = 1; at < n; step = step * 3 + 7) {   /* uneven pieces */
        size_t k = n - at < step % 5000 + 1 ? n - at : step % 5000 + 1;
        v->update(st, buf + at, k);
        at += k;
    }
    v->digest(st, &h, &l);
    canon(h, l, got);
    if (memcmp(want, got, 16) != 0)
        fail_msg("%s: streamed hash of %zu bytes differs from libxxhash", v->isa, n);
    shoal_xxh3_free(st);
}

static void test_variants_match_libxxhash(void **s)
{
    static const size_t sizes[] = { 0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 255, 256, 257,
                                    1023, 1024, 1025, 4096, 65536 + 13, 1u << 20 };
    const shoal_xxh3_impl *vs[3] = { shoal_xxh3_impl_baseline(), shoal_xxh3_impl_avx2(),
                                     shoal_xxh3_impl_avx512() };
    uint8_t *buf = malloc(1u << 20);
    uint32_t x = 12345;
    (void)s;
    assert_non_null(buf);
    for (size_t i = 0; i < 1u << 20; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 24);
    }
    assert_non_null(vs[0]);
    for (int v = 0; v < 3; v++) {
        if (!vs[v])
            continue;   /* not built here, or the CPU lacks it */
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            check_impl(vs[v], buf, sizes[i]);
        print_message("xxh3 %s: matches libxxhash\n", vs[v]->isa);
    }
    free(buf);
}

static void test_dispatch(void **s)
{
    uint8_t want[16], got[16], buf[1000];
    XXH3_state_t *st = shoal_xxh3_new();
    (void)s;
    memset(buf, 0xa5, sizeof buf);
    lib_hash(buf, sizeof buf, want);
    shoal_xxh3_once(buf, sizeof buf, got);
    assert_memory_equal(want, got, 16);
    shoal_xxh3_reset(st);
    shoal_xxh3_update(st, buf, 300);
    shoal_xxh3_update(st, buf + 300, 700);
    shoal_xxh3_digest(st, got);
    assert_memory_equal(want, got, 16);
    shoal_xxh3_free(st);
    /* the best variant there is */
    const char *want_isa = shoal_xxh3_impl_avx512() ? "avx512"
                           : shoal_xxh3_impl_avx2() ? "avx2" : "baseline";
    assert_string_equal(shoal_xxh3_isa(), want_isa);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_variants_match_libxxhash),
        cmocka_unit_test(test_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
