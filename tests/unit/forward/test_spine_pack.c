/* test_spine_pack.c — the int8 spine pack's strict parsing (it comes back
 * from shoald's cache, another process): a well-formed pack opens and hands
 * out its matrices in order; every damaged header field, a table entry
 * pointing outside the pack, a changed table, another config, another
 * format or quantizer version, and a model asking for other names, shapes
 * or dtypes are refused with a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/buf.h"
#include "engine/forward/forward.h"

static const char config[] = "{\"model_type\":\"kimi_k3\"}";

/* Two matrices: "a.weight" int8 [2, 32] (+ scales), "b.weight" f32 [1, 8]. */
static size_t make_pack(uint8_t *p, size_t cap)
{
    uint8_t *t = p + 64;
    size_t tl = 0, n;
    memset(p, 0, cap);
    /* entry a */
    t[tl] = 8; tl += 2;
    memcpy(t + tl, "a.weight", 8); tl += 8;
    t[tl++] = 0;
    shoal_wr_le64(t + tl, 2); shoal_wr_le64(t + tl + 8, 32);
    shoal_wr_le64(t + tl + 16, 192); shoal_wr_le64(t + tl + 24, 256); tl += 32;
    /* entry b */
    t[tl] = 8; tl += 2;
    memcpy(t + tl, "b.weight", 8); tl += 8;
    t[tl++] = 1;
    shoal_wr_le64(t + tl, 1); shoal_wr_le64(t + tl + 8, 8);
    shoal_wr_le64(t + tl + 16, 320); shoal_wr_le64(t + tl + 24, 0); tl += 32;
    n = 384;
    assert_true(n <= cap && 64 + tl <= 192);
    for (int i = 0; i < 64; i++)
        p[192 + i] = (uint8_t)(i - 32);
    {
        float sc[2] = { 0.5f, 0.25f }, w[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
        memcpy(p + 256, sc, sizeof sc);
        memcpy(p + 320, w, sizeof w);
    }
    memcpy(p, "SHLSPINE", 8);
    shoal_wr_le32(p + 8, SPINE_PACK_FORMAT);
    shoal_wr_le32(p + 12, SPINE_PACK_QUANT);
    shoal_wr_le32(p + 16, 2);
    shoal_wr_le64(p + 24, XXH3_64bits(config, strlen(config)));
    shoal_wr_le64(p + 32, tl);
    shoal_wr_le64(p + 40, 192);
    shoal_wr_le64(p + 48, n);
    shoal_wr_le64(p + 56, XXH3_64bits(t, tl));
    return n;
}

static void rehash_table(uint8_t *p)
{
    shoal_wr_le64(p + 56, XXH3_64bits(p + 64, shoal_rd_le64(p + 32)));
}

static int open_rc(const uint8_t *p, size_t n, shoal_err *e)
{
    spine_pack *sp = NULL;
    int rc = spine_pack_open(p, n, (const uint8_t *)config, strlen(config), &sp, e);
    if (rc == 0)
        spine_pack_free(sp);
    else
        assert_null(sp);
    return rc;
}

static void test_open_and_take(void **state)
{
    uint8_t p[512];
    size_t n = make_pack(p, sizeof p);
    spine_pack *sp = NULL;
    shoal_err e = { 0 };
    engine_mat m;
    (void)state;

    assert_int_equal(spine_pack_open(p, n, (const uint8_t *)config, strlen(config), &sp, &e), 0);
    assert_int_equal(spine_pack_count(sp), 2);
    assert_true(spine_pack_covers(sp, "a.weight"));
    assert_false(spine_pack_covers(sp, "a.weigh"));
    assert_int_equal(spine_pack_remaining(sp), 2);
    assert_int_equal(spine_pack_next(sp, "a.weight", 2, 32, 0, &m, &e), 0);
    assert_non_null(m.q8.q);
    assert_null(m.f32.w);
    assert_int_equal(m.q8.q[0], -32);
    assert_true(m.q8.scale[1] == 0.25f);
    assert_int_equal(spine_pack_next(sp, "b.weight", 1, 8, 1, &m, &e), 0);
    assert_true(m.f32.w[7] == 8.0f);
    assert_int_equal(spine_pack_remaining(sp), 0);
    assert_int_equal(spine_pack_next(sp, "c.weight", 1, 8, 1, &m, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "ends before c.weight"));

    /* what the model asks must be what the pack holds */
    spine_pack_rewind(sp);
    assert_int_equal(spine_pack_next(sp, "b.weight", 1, 8, 1, &m, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "the model needs b.weight"));
    spine_pack_rewind(sp);
    assert_int_equal(spine_pack_next(sp, "a.weight", 2, 64, 0, &m, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "config says"));
    spine_pack_rewind(sp);
    assert_int_equal(spine_pack_next(sp, "a.weight", 2, 32, 1, &m, &e), SHOAL_EFORMAT);
    spine_pack_free(sp);
    spine_pack_free(NULL);
}

static void test_refusals(void **state)
{
    uint8_t p[512], q[512];
    size_t n = make_pack(p, sizeof p);
    shoal_err e = { 0 };
    (void)state;

    /* truncated, bad magic, other versions, other config */
    assert_int_equal(open_rc(p, 63, &e), SHOAL_EFORMAT);
    assert_int_equal(open_rc(p, n - 64, &e), SHOAL_EFORMAT);   /* total length */
    memcpy(q, p, n); q[0] = 'X';
    assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
    memcpy(q, p, n); shoal_wr_le32(q + 8, 2);
    assert_int_equal(open_rc(q, n, &e), SHOAL_EUNSUPPORTED);
    memcpy(q, p, n); shoal_wr_le32(q + 12, SPINE_PACK_QUANT + 1);
    assert_int_equal(open_rc(q, n, &e), SHOAL_EUNSUPPORTED);
    {
        spine_pack *sp = NULL;
        assert_int_equal(spine_pack_open(p, n, (const uint8_t *)"{}", 2, &sp, &e), SHOAL_EFORMAT);
        assert_non_null(strstr(e.msg, "another config.json"));
    }
    /* header fields */
    memcpy(q, p, n); shoal_wr_le32(q + 20, 1);                 /* flags */
    assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
    memcpy(q, p, n); shoal_wr_le32(q + 16, 0);                 /* no matrices */
    assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
    memcpy(q, p, n); shoal_wr_le64(q + 32, 1000);              /* table past the end */
    assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
    memcpy(q, p, n); shoal_wr_le64(q + 40, 100);               /* misaligned data */
    assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
    memcpy(q, p, n); shoal_wr_le32(q + 16, 3);                 /* more entries than the table */
    assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
    memcpy(q, p, n); shoal_wr_le32(q + 16, 1);                 /* fewer: bytes left over */
    assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "after the table"));
    /* a changed table without its hash */
    memcpy(q, p, n); q[64 + 2] = 'z';
    assert_int_equal(open_rc(q, n, &e), SHOAL_ECORRUPT);
    /* entries pointing outside the pack, misaligned, bad dtype, empty */
    {
        static const struct { size_t off; uint64_t v; } bad[] = {
            { 64 + 10 + 1 + 16, 448 },     /* a: weights past the end */
            { 64 + 10 + 1 + 16, 200 },     /* a: misaligned */
            { 64 + 10 + 1 + 16, 64 },      /* a: inside the header/table */
            { 64 + 10 + 1 + 24, 384 },     /* a: scales at the very end */
            { 64 + 10 + 1, 0 },            /* a: rows 0 */
            { 64 + 10 + 1, 1ull << 40 },   /* a: rows huge */
            { 64 + 43 + 10 + 1 + 24, 256 } /* b: f32 with a scales offset */
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            memcpy(q, p, n);
            shoal_wr_le64(q + bad[i].off, bad[i].v);
            rehash_table(q);
            assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
        }
        memcpy(q, p, n); q[64 + 10] = 7;   /* dtype */
        rehash_table(q);
        assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
        memcpy(q, p, n); q[64] = 0;        /* empty name */
        rehash_table(q);
        assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
    }
    /* every single-byte change of the header or table is refused or, when
     * it opens, still keeps every matrix inside the pack */
    for (size_t i = 0; i < 150; i++) {
        spine_pack *sp = NULL;
        memcpy(q, p, n);
        q[i] ^= 0x41;
        if (spine_pack_open(q, n, (const uint8_t *)config, strlen(config), &sp, &e) == 0) {
            engine_mat m;
            while (spine_pack_remaining(sp) &&
                   spine_pack_next(sp, "a.weight", 2, 32, 0, &m, &e) == 0)
                assert_true((const uint8_t *)m.q8.q >= q + 64 && (const uint8_t *)m.q8.q + 64 <= q + n);
            spine_pack_free(sp);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_and_take),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests_name("spine_pack", tests, NULL, NULL);
}
