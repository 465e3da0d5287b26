/* test_spine_pack.c — the spine pack: its strict parsing (it comes back
 * from shoald's cache, another process): a well-formed pack opens and hands
 * out its matrices in order; every damaged header field, a table entry
 * pointing outside the pack, a changed table, another config, another
 * format, quantizer version or spine mode, and a model asking for other
 * names, shapes or formats are refused with a message.  And its writer:
 * laid out from a config alone, each matrix checked against the layout as
 * it is put, an int8 and an int4 pack read back byte for byte. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include <sys/mman.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/platform.h"
#include "engine/forward/forward.h"
#include "tests/lib/k3_fixture.h"

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
    int rc = spine_pack_open(p, n, ENGINE_SPINE_INT8, (const uint8_t *)config, strlen(config),
                             &sp, e);
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

    assert_int_equal(spine_pack_open(p, n, ENGINE_SPINE_INT8, (const uint8_t *)config,
                                     strlen(config), &sp, &e), 0);
    assert_int_equal(spine_pack_count(sp), 2);
    assert_true(spine_pack_covers(sp, "a.weight"));
    assert_false(spine_pack_covers(sp, "a.weigh"));
    assert_int_equal(spine_pack_remaining(sp), 2);
    assert_int_equal(spine_pack_next(sp, "a.weight", 2, 32, K3_FMT_INT8, &m, &e), 0);
    assert_non_null(m.q8.q);
    assert_null(m.f32.w);
    assert_int_equal(m.q8.q[0], -32);
    assert_true(m.q8.scale[1] == 0.25f);
    assert_int_equal(spine_pack_next(sp, "b.weight", 1, 8, K3_FMT_F32, &m, &e), 0);
    assert_true(m.f32.w[7] == 8.0f);
    assert_int_equal(spine_pack_remaining(sp), 0);
    assert_int_equal(spine_pack_next(sp, "c.weight", 1, 8, K3_FMT_F32, &m, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "ends before c.weight"));

    /* what the model asks must be what the pack holds */
    spine_pack_rewind(sp);
    assert_int_equal(spine_pack_next(sp, "b.weight", 1, 8, K3_FMT_F32, &m, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "the model needs b.weight"));
    spine_pack_rewind(sp);
    assert_int_equal(spine_pack_next(sp, "a.weight", 2, 64, K3_FMT_INT8, &m, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "config says"));
    spine_pack_rewind(sp);
    assert_int_equal(spine_pack_next(sp, "a.weight", 2, 32, K3_FMT_F32, &m, &e), SHOAL_EFORMAT);
    spine_pack_rewind(sp);
    assert_int_equal(spine_pack_next(sp, "a.weight", 2, 32, K3_FMT_INT4, &m, &e), SHOAL_EFORMAT);
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
    memcpy(q, p, n); shoal_wr_le32(q + 8, SPINE_PACK_FORMAT + 1);
    assert_int_equal(open_rc(q, n, &e), SHOAL_EUNSUPPORTED);
    memcpy(q, p, n); shoal_wr_le32(q + 8, 1);                  /* the int8-only format */
    assert_int_equal(open_rc(q, n, &e), SHOAL_EUNSUPPORTED);
    memcpy(q, p, n); shoal_wr_le32(q + 12, SPINE_PACK_QUANT + 1);
    assert_int_equal(open_rc(q, n, &e), SHOAL_EUNSUPPORTED);
    {
        spine_pack *sp = NULL;
        assert_int_equal(spine_pack_open(p, n, ENGINE_SPINE_INT8, (const uint8_t *)"{}", 2, &sp,
                                         &e), SHOAL_EFORMAT);
        assert_non_null(strstr(e.msg, "another config.json"));
    }
    /* header fields */
    memcpy(q, p, n); shoal_wr_le32(q + 20, 1);                 /* made for int4 */
    assert_int_equal(open_rc(q, n, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "int4"));
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
        memcpy(q, p, n); q[64 + 43 + 10] = 2;   /* b as int4: 8 columns is no whole group */
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
        if (spine_pack_open(q, n, ENGINE_SPINE_INT8, (const uint8_t *)config, strlen(config), &sp,
                            &e) == 0) {
            engine_mat m;
            while (spine_pack_remaining(sp) &&
                   spine_pack_next(sp, "a.weight", 2, 32, K3_FMT_INT8, &m, &e) == 0)
                assert_true((const uint8_t *)m.q8.q >= q + 64 && (const uint8_t *)m.q8.q + 64 <= q + n);
            spine_pack_free(sp);
        }
    }
}

/* ---- the writer ------------------------------------------------------------- */

typedef struct fab {
    spine_pack_writer *w;
    int put_rc;
    uint8_t seed;
} fab;

/* Bytes of a matrix made up from its position in the layout. */
static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 31 + i * 7);
}

/* A matrix of the layout's entry m with made-up bytes (f32 and scales
 * finite: the bytes are not checked as numbers). */
static int fab_put(void *ctx, const k3_spine_mat *m)
{
    fab *f = ctx;
    engine_mat em = { .rows = m->rows, .cols = m->cols };
    size_t wb = m->fmt == K3_FMT_F32 ? m->rows * m->cols * 4 : m->fmt == K3_FMT_INT8
                ? m->rows * m->cols : kernels_q4_packed_bytes(m->rows, m->cols);
    size_t sb = m->fmt == K3_FMT_INT8 ? m->rows * 4 : m->fmt == K3_FMT_INT4
                ? kernels_q4_scale_bytes(m->rows, m->cols) : 0;
    uint8_t *w = malloc(wb), *s = malloc(sb + 1);
    fill(w, wb, f->seed);
    fill(s, sb, (uint8_t)(f->seed + 1));
    f->seed++;
    if (m->fmt == K3_FMT_F32)
        em.f32 = (kernels_f32){ (const float *)w, m->rows, m->cols };
    else if (m->fmt == K3_FMT_INT8)
        em.q8 = (kernels_q8){ (const int8_t *)w, (const float *)s, m->rows, m->cols };
    else
        em.q4 = (kernels_q4){ w, s, m->rows, m->cols };
    f->put_rc = spine_pack_writer_put(f->w, m->name, &em, NULL);
    free(w);
    free(s);
    return f->put_rc;
}

typedef struct chk {
    spine_pack *p;
    uint8_t seed;
    int bad;
} chk;

static int chk_next(void *ctx, const k3_spine_mat *m)
{
    chk *c = ctx;
    engine_mat em;
    uint8_t *want;
    size_t wb;
    if (spine_pack_next(c->p, m->name, m->rows, m->cols, m->fmt, &em, NULL) != 0)
        return c->bad = 1;
    wb = m->fmt == K3_FMT_F32 ? m->rows * m->cols * 4 : m->fmt == K3_FMT_INT8
         ? m->rows * m->cols : kernels_q4_packed_bytes(m->rows, m->cols);
    want = malloc(wb);
    fill(want, wb, c->seed++);
    const void *got = m->fmt == K3_FMT_F32 ? (const void *)em.f32.w
                      : m->fmt == K3_FMT_INT8 ? (const void *)em.q8.q : (const void *)em.q4.packed;
    c->bad |= memcmp(got, want, wb) != 0;
    free(want);
    return c->bad;
}

static void roundtrip(engine_spine mode)
{
    k3_config c;
    shoal_buf cfg;
    spine_pack_writer *w = NULL;
    spine_pack *p = NULL;
    uint8_t xxh[16];
    shoal_err e = { 0 };
    int fd = shoal_anon_file("pack");
    uint64_t len;

    shoal_buf_init(&cfg, 0);
    assert_int_equal(k3_fixture_small_config(&c), 0);
    assert_int_equal(k3_fixture_small_json(&cfg), 0);
    assert_int_equal(spine_pack_writer_new(&c, mode, cfg.data, cfg.len, &w, &e), 0);
    len = spine_pack_writer_length(w);
    /* a matrix before the header, then the header */
    engine_mat none = { .rows = 1, .cols = 1 };
    assert_int_equal(spine_pack_writer_put(w, "x", &none, &e), SHOAL_EINVAL);
    assert_int_equal(spine_pack_writer_begin(w, fd, &e), 0);
    /* finishing early, and a matrix the layout does not have next */
    assert_int_equal(spine_pack_writer_finish(w, xxh, &e), SHOAL_EINVAL);
    assert_int_equal(spine_pack_writer_put(w, "lm_head.weight", &none, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "the layout says"));
    fab f = { .w = w };
    assert_int_equal(k3_spine_walk(&c, (k3_spine_mode)mode, fab_put, &f), 0);
    assert_int_equal(spine_pack_writer_finish(w, xxh, &e), 0);
    spine_pack_writer_free(w);

    uint8_t *data = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(data != MAP_FAILED);
    assert_int_equal(lseek(fd, 0, SEEK_END), (off_t)len);
    XXH128_canonical_t can;
    XXH128_canonicalFromHash(&can, XXH3_128bits(data, len));
    assert_memory_equal(can.digest, xxh, 16);
    /* the other mode's reader refuses it; its own hands back every byte */
    assert_int_equal(spine_pack_open(data, len, mode == ENGINE_SPINE_INT8 ? ENGINE_SPINE_INT4
                                                                          : ENGINE_SPINE_INT8,
                                     cfg.data, cfg.len, &p, &e), SHOAL_EFORMAT);
    assert_int_equal(spine_pack_open(data, len, mode, cfg.data, cfg.len, &p, &e), 0);
    chk k = { .p = p };
    assert_int_equal(k3_spine_walk(&c, (k3_spine_mode)mode, chk_next, &k), 0);
    assert_false(k.bad);
    assert_int_equal(spine_pack_remaining(p), 0);
    spine_pack_free(p);
    munmap(data, len);
    close(fd);
    shoal_buf_free(&cfg);
}

static void test_writer_roundtrip(void **state)
{
    (void)state;
    roundtrip(ENGINE_SPINE_INT8);
    roundtrip(ENGINE_SPINE_INT4);
    assert_string_equal(spine_pack_name(ENGINE_SPINE_INT8), "spine-int8-p2-q2");
    assert_string_equal(spine_pack_name(ENGINE_SPINE_INT4), "spine-int4-g32-p2-q2");
    assert_null(spine_pack_name(ENGINE_SPINE_F32));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_and_take),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_writer_roundtrip),
    };
    return cmocka_run_group_tests_name("spine_pack", tests, NULL, NULL);
}
