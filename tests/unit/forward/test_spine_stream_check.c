/* test_spine_stream_check.c — streamed layers read in place from a pack's
 * file are checked on every read against the hashes the load computed
 * (engine/forward/spine_stream.c; docs/engine.md "Checked reads"): intact
 * bytes pass, pass after pass; a byte damaged in the file after the load
 * fails the layer that holds it with SHOAL_ECORRUPT naming it (after a
 * second read), calls the owner's damaged hook with that layer, and
 * leaves the other layer readable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine/forward/stream_int.h"

#define PACK_LEN 50000
static const uint64_t lo_off[3] = { 0, 10000, 30000 }, hi_off[3] = { 0, 30000, PACK_LEN };

static int damaged_layer = -1, damaged_calls;

static void on_damaged(void *ctx, int layer)
{
    (void)ctx;
    damaged_layer = layer;
    damaged_calls++;
}

static void stream_checks(void **state)
{
    char path[] = "/var/tmp/shoal-test-stream-check.XXXXXX";
    uint8_t *file = malloc(PACK_LEN), *pack = NULL, *lo[3], *hi[3];
    spine_stream *s = NULL;
    shoal_err e = { 0 };
    int fd = mkstemp(path);
    (void)state;

    assert_true(fd >= 0);
    unlink(path);
    for (size_t i = 0; i < PACK_LEN; i++)
        file[i] = (uint8_t)(i * 131 + 7);
    assert_int_equal(pwrite(fd, file, PACK_LEN, 0), PACK_LEN);
    assert_int_equal(posix_memalign((void **)&pack, 4096, 65536), 0);
    memcpy(pack, file, 10000);             /* the resident part, as the load left it */
    for (int l = 1; l < 3; l++) {
        lo[l] = pack + lo_off[l];
        hi[l] = pack + hi_off[l];
    }
    assert_int_equal(spine_stream_inplace(fd, 0, pack, 3, 1, lo, hi, &s, &e), 0);
    for (int l = 1; l < 3; l++) {
        uint64_t off, len;
        XXH128_canonical_t c;
        assert_int_equal(spine_stream_region(s, l, &off, &len), 0);
        assert_int_equal(off, lo_off[l] / 4096 * 4096);     /* from its first block */
        assert_int_equal(off + len, hi_off[l]);
        XXH128_canonicalFromHash(&c, XXH3_128bits(file + off, (size_t)len));
        spine_stream_expect(s, l, c.digest);
    }
    assert_int_equal(spine_stream_region(s, 0, &(uint64_t){ 0 }, &(uint64_t){ 0 }), SHOAL_EINVAL);
    spine_stream_on_damaged(s, on_damaged, NULL);

    for (int pass = 0; pass < 3; pass++) {  /* intact: every read checked, every one passes */
        assert_int_equal(spine_stream_ready(s, 1, &e), 0);
        assert_memory_equal(pack + 10000, file + 10000, 20000);
        assert_int_equal(spine_stream_ready(s, 2, &e), 0);
        assert_memory_equal(pack + 30000, file + 30000, 20000);
    }
    assert_int_equal(damaged_calls, 0);

    /* layer 2's bytes damaged on disk: its next read (ahead, then again) fails */
    uint8_t b = file[40000] ^ 0x20;
    assert_int_equal(pwrite(fd, &b, 1, 40000), 1);
    assert_int_equal(spine_stream_ready(s, 1, &e), 0);
    assert_int_equal(spine_stream_ready(s, 2, &e), SHOAL_ECORRUPT);
    assert_non_null(strstr(e.msg, "layer 2 of the streamed spine read back damaged"));
    assert_int_equal(damaged_layer, 2);
    assert_int_equal(damaged_calls, 1);
    assert_int_equal(spine_stream_ready(s, 1, &e), 0);    /* layer 1 is intact */
    assert_memory_equal(pack + 10000, file + 10000, 20000);

    engine_stream_stats st;
    spine_stream_stats(s, &st);
    assert_true(st.reads >= 8);
    spine_stream_free(s);
    close(fd);
    free(pack);
    free(file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stream_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
