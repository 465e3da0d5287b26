/* test_spine_checked.c — the spine pack's bytes hashed as they are read
 * into memory (engine/source/spine_resident.c; docs/engine.md "Checked
 * reads"): read whole, in parts (read_part, fill, and the streamed rest
 * read only to be hashed) and mapped, with 1 and 4 readers, an object
 * that starts inside a block of its file; the hash matches the object's
 * XXH3-128, each range's own hash matches its bytes, a wrong expected hash
 * and a byte damaged in the file are a mismatch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "engine/source/source.h"

#define OBJ_OFF  ((uint64_t)4096 + 100)
#define OBJ_LEN  ((uint64_t)(21u << 20) + 1234)   /* a few 8 MiB parts and a tail */

static int fd = -1;
static uint8_t *obj;            /* the object's bytes as written */

static void hash_of(const uint8_t *p, size_t n, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}

static int setup(void **state)
{
    char path[] = "/var/tmp/shoal-test-spine-checked.XXXXXX";
    uint8_t *file;
    (void)state;
    if ((fd = mkstemp(path)) < 0)
        return -1;
    unlink(path);
    file = malloc(OBJ_OFF + OBJ_LEN + 777);
    if (!file)
        return -1;
    srand(7);
    for (size_t i = 0; i < OBJ_OFF + OBJ_LEN + 777; i++)
        file[i] = (uint8_t)(rand() >> 7);
    if (pwrite(fd, file, OBJ_OFF + OBJ_LEN + 777, 0) != (ssize_t)(OBJ_OFF + OBJ_LEN + 777))
        return -1;
    obj = malloc(OBJ_LEN);
    memcpy(obj, file + OBJ_OFF, OBJ_LEN);
    free(file);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    close(fd);
    free(obj);
    return 0;
}

static void whole(void **state)
{
    uint8_t want[16], bad[16];
    (void)state;
    hash_of(obj, OBJ_LEN, want);
    memcpy(bad, want, 16);
    bad[3] ^= 1;
    for (int mode = 0; mode < 2; mode++) {
        for (int threads = 1; threads <= 4; threads += 3) {
            spine_resident r;
            shoal_err e = { 0 };
            assert_int_equal(spine_resident_read(fd, OBJ_OFF, OBJ_LEN, (spine_load_mode)mode,
                                                 threads, want, &r, &e), 0);
            assert_memory_equal(r.data, obj, OBJ_LEN);
            assert_int_equal(spine_resident_check(&r), 1);
            spine_resident_free(&r);
            assert_int_equal(spine_resident_read(fd, OBJ_OFF, OBJ_LEN, (spine_load_mode)mode,
                                                 threads, bad, &r, &e), 0);
            assert_int_equal(spine_resident_check(&r), -1);
            spine_resident_free(&r);
            /* unchecked: nothing to say */
            assert_int_equal(spine_resident_read(fd, OBJ_OFF, OBJ_LEN, (spine_load_mode)mode,
                                                 threads, NULL, &r, &e), 0);
            assert_int_equal(spine_resident_check(&r), 0);
            spine_resident_free(&r);
        }
    }
}

/* As remote.c streams a pack: the head, then the resident part up to
 * `end`, then the rest read only to hash it, with two "layers" whose
 * ranges start at a block boundary before their first byte (as
 * spine_stream.c reads them). */
static void parts(void **state)
{
    uint64_t fill = (5u << 20) + 7, end = (13u << 20) + 5, mid = (17u << 20) + 333;
    uint8_t want[16], rx[2][16], exp[2][16];
    spine_resident_range rg[2];
    (void)state;
    hash_of(obj, OBJ_LEN, want);
    rg[0].off = (OBJ_OFF + end) / 4096 * 4096;
    rg[0].len = OBJ_OFF + mid - rg[0].off;
    rg[1].off = (OBJ_OFF + mid) / 4096 * 4096;
    rg[1].len = OBJ_OFF + OBJ_LEN - rg[1].off;
    hash_of(obj + (rg[0].off - OBJ_OFF), (size_t)rg[0].len, exp[0]);
    hash_of(obj + (rg[1].off - OBJ_OFF), (size_t)rg[1].len, exp[1]);
    for (int threads = 1; threads <= 4; threads += 3) {
        spine_resident r;
        shoal_err e = { 0 };
        assert_int_equal(spine_resident_read_part(fd, OBJ_OFF, OBJ_LEN, fill, SPINE_LOAD_READ,
                                                  threads, want, &r, &e), 0);
        assert_int_equal(spine_resident_check(&r), 0);        /* not every byte yet */
        assert_int_equal(spine_resident_fill(&r, fd, fill, end, threads, &e), 0);
        assert_memory_equal(r.data, obj, end);
        assert_int_equal(spine_resident_check(&r), 0);
        memset(rx, 0, sizeof rx);
        assert_int_equal(spine_resident_hash_rest(&r, fd, rg, 2, rx, threads, &e), 0);
        assert_int_equal(spine_resident_check(&r), 1);
        assert_memory_equal(rx[0], exp[0], 16);
        assert_memory_equal(rx[1], exp[1], 16);
        spine_resident_free(&r);
    }
    /* a byte of the rest damaged in the file: the whole hash says so */
    {
        spine_resident r;
        shoal_err e = { 0 };
        uint8_t b = obj[mid + 10] ^ 0x40;
        assert_int_equal(pwrite(fd, &b, 1, (off_t)(OBJ_OFF + mid + 10)), 1);
        assert_int_equal(spine_resident_read_part(fd, OBJ_OFF, OBJ_LEN, end, SPINE_LOAD_READ, 4,
                                                  want, &r, &e), 0);
        assert_int_equal(spine_resident_hash_rest(&r, fd, rg, 2, rx, 4, &e), 0);
        assert_int_equal(spine_resident_check(&r), -1);
        assert_memory_equal(rx[0], exp[0], 16);                /* that range is intact */
        assert_memory_not_equal(rx[1], exp[1], 16);
        spine_resident_free(&r);
        b ^= 0x40;
        assert_int_equal(pwrite(fd, &b, 1, (off_t)(OBJ_OFF + mid + 10)), 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(whole),
        cmocka_unit_test(parts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
