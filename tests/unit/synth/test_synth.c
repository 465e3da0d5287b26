/* test_synth.c — synth/: the presets' layouts, bytes from (file, offset)
 * equal to a front-to-back read, the k3.md §6 values, the digests, and the
 * committed K3 table still describing what the generator makes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/safetensors.h"
#include "synth/synth.h"

static synth_model *model(synth_preset p, int layers, int experts)
{
    synth_config c;
    synth_model *m = NULL;
    shoal_err err = { 0 };
    synth_config_init(&c, p);
    assert_int_equal(synth_config_finish(&c, layers, experts, &err), 0);
    if (synth_model_new(&c, &m, &err))
        fail_msg("synth_model_new: %s", err.msg);
    return m;
}

static st_file *header_of(const synth_model *m, size_t f)
{
    uint64_t hs = synth_file_header_size(m, f);
    uint8_t *h = malloc(hs);
    st_file *st = NULL;
    shoal_err err = { 0 };
    assert_non_null(h);
    assert_int_equal(synth_read(m, f, 0, hs, h), 0);
    if (st_parse(h + 8, hs - 8, synth_file_size(m, f), &st, &err))
        fail_msg("%s: %s", synth_file_name(m, f), err.msg);
    free(h);
    return st;
}

/* ---- tiny keeps the bytes it had before synth/ existed ------------------ */

static void test_tiny_golden(void **state)
{
    /* sha256 of each file written by mkmodel before the move into synth/
     * (commit 35105fe): tiny is the k3.md §6 model, bit for bit. */
    static const char *const want[][2] = {
        { "config.json", "a78fbded9dbb6ef26de28e8b29e2ff1d4f6a31b1f490e56007da9200361c0cde" },
        { "tokenizer_config.json", "2703e7a0111232103588c84328f14b0a2d7457daf742da16ea38c841d875e40d" },
        { "tiktoken.model", "3bed5f6aa1bbe4f44969aba40a28fac5eb24622e1ab1805e5e02f377a474b59c" },
        { "model-00001-of-000003.safetensors", "d39185c7b4b51cc468c92ca5bf8521abfdb8cb269646dd404535c0993bbf9b5a" },
        { "model-00002-of-000003.safetensors", "ab4e190032047a6368bed3055f0f0953c78ec2eb3c68ae260d3386b080002825" },
        { "model-00003-of-000003.safetensors", "007d80517887c9d70b7e2b49caa4748ae9667f336c8a45464ba7cf111892df98" },
        { "model.safetensors.index.json", "baabe0c3df3a44c0e1f0b60848cb145f33aa633aefa00a12ed4115ba24996c29" },
    };
    synth_model *m = model(SYNTH_PRESET_TINY, 0, 0);
    shoal_err err = { 0 };
    (void)state;
    assert_int_equal(synth_file_count(m), 7);
    for (size_t i = 0; i < 7; i++) {
        long f = synth_file_find(m, want[i][0]);
        synth_digest d;
        assert_true(f >= 0);
        assert_int_equal(synth_digest_file(m, (size_t)f, synth_file_size(m, (size_t)f), 1, &d,
                                           &err), 0);
        assert_string_equal(d.sha256, want[i][1]);
        assert_int_equal(strlen(d.sha1), 40);
    }
    /* The index is the last file (mkmodel writes it last). */
    assert_string_equal(synth_file_name(m, 6), "model.safetensors.index.json");
    synth_model_free(m);
}

/* ---- the value rules, recomputed here ------------------------------------ */

static uint64_t fnv(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    while (*s)
        h = (h ^ (uint8_t)*s++) * 0x100000001b3ULL;
    return h;
}

static uint64_t draw(uint64_t state0, uint64_t i)
{
    uint64_t z = state0 + (i + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint8_t byte_at(const synth_model *m, size_t f, uint64_t off)
{
    uint8_t b;
    assert_int_equal(synth_read(m, f, off, 1, &b), 0);
    return b;
}

static void test_value_rules(void **state)
{
    synth_model *m = model(SYNTH_PRESET_TINY, 0, 0);
    long f = synth_file_find(m, "model-00003-of-000003.safetensors");
    st_file *st = header_of(m, (size_t)f);
    const st_tensor *t = st_find(st, "language_model.lm_head.weight");
    (void)state;
    assert_non_null(t);
    /* A BF16 matrix [1024, 256]: (2u-1)·sqrt(3/256), float, then BF16 RNE;
     * element 1000 is read alone, from the middle of the tensor. */
    uint64_t s0 = fnv("language_model.lm_head.weight");
    for (uint64_t i = 999; i < 1003; i++) {
        double u = (double)(draw(s0, i) >> 40) / 16777216.0;
        float v = (float)((2 * u - 1) * sqrt(3.0 / 256));
        uint32_t b;
        memcpy(&b, &v, 4);
        uint16_t want = (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
        uint16_t got = (uint16_t)(byte_at(m, (size_t)f, t->begin + 2 * i) |
                                  byte_at(m, (size_t)f, t->begin + 2 * i + 1) << 8);
        assert_int_equal(got, want);
    }
    st_free(st);
    synth_model_free(m);

    /* k3's experts: byte i is byte i%8 of draw i/8; scales 119 + (5b >> 8). */
    m = model(SYNTH_PRESET_K3, 2, 3);
    f = synth_file_find(m, "model-00002-of-000005.safetensors");
    st = header_of(m, (size_t)f);
    const char *pk = "language_model.model.layers.1.block_sparse_moe.experts.2.w3.weight_packed";
    const char *sc = "language_model.model.layers.1.block_sparse_moe.experts.2.w2.weight_scale";
    const st_tensor *tp = st_find(st, pk), *ts = st_find(st, sc);
    assert_non_null(tp);
    assert_non_null(ts);
    for (uint64_t i = 5; i < 27; i++) {
        uint8_t b = (uint8_t)(draw(fnv(pk), i / 8) >> (8 * (i % 8)));
        assert_int_equal(byte_at(m, (size_t)f, tp->begin + i), b);
        b = (uint8_t)(draw(fnv(sc), i / 8) >> (8 * (i % 8)));
        assert_int_equal(byte_at(m, (size_t)f, ts->begin + i), 119 + ((5 * b) >> 8));
    }
    st_free(st);
    synth_model_free(m);
}

/* ---- any range equals the same bytes of a front-to-back read ------------ */

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Compare ranges of file f against a whole read, limited to its first
 * `span` bytes (and its last ones) so big files stay cheap. */
static void ranges_check(const synth_model *m, size_t f, uint64_t *seed)
{
    uint64_t size = synth_file_size(m, f), span = size < (24u << 20) ? size : (24u << 20);
    uint8_t *all = malloc(span), *tail = malloc(4096), *got = malloc(span);
    uint64_t tail_off = size > 4096 ? size - 4096 : 0;
    assert_non_null(all);
    assert_non_null(got);
    for (uint64_t off = 0; off < span; off += 4u << 20) {
        size_t k = span - off < (4u << 20) ? (size_t)(span - off) : (4u << 20);
        assert_int_equal(synth_read(m, f, off, k, all + off), 0);
    }
    assert_int_equal(synth_read(m, f, tail_off, (size_t)(size - tail_off), tail), 0);
    for (int k = 0; k < 300; k++) {
        uint64_t a = rnd(seed) % span, n = rnd(seed) % (k < 200 ? 64 : 300000);
        if (a + n > span)
            n = span - a;
        assert_int_equal(synth_read(m, f, a, (size_t)n, got), 0);
        if (memcmp(got, all + a, n))
            fail_msg("%s: %llu bytes at %llu differ", synth_file_name(m, f),
                     (unsigned long long)n, (unsigned long long)a);
    }
    /* Byte by byte over the header's end and the first tensors. */
    uint64_t h = synth_file_header_size(m, f);
    for (uint64_t a = h > 40 ? h - 40 : 0; a < h + 600 && a < span; a++)
        assert_int_equal(byte_at(m, f, a), all[a]);
    /* The file's last bytes, one by one, and one past the end. */
    for (uint64_t a = tail_off; a < size; a += 97)
        assert_int_equal(byte_at(m, f, a), tail[a - tail_off]);
    assert_int_equal(synth_read(m, f, size, 0, got), 0);
    assert_int_equal(synth_read(m, f, size - 1, 2, got), SHOAL_ERANGE);
    assert_int_equal(synth_read(m, f, size + 1, 0, got), SHOAL_ERANGE);
    free(all);
    free(tail);
    free(got);
}

/* Every tensor boundary of a shard: the bytes on both sides, read alone
 * and read across it, agree. */
static void boundaries_check(const synth_model *m, size_t f)
{
    st_file *st = header_of(m, f);
    uint8_t a[16], b[16];
    for (size_t i = 1; i < st_count(st) && i < 400; i++) {
        uint64_t x = st_at(st, i)->begin;
        assert_int_equal(synth_read(m, f, x - 7, 14, a), 0);
        for (int k = 0; k < 14; k++)
            b[k] = byte_at(m, f, x - 7 + (uint64_t)k);
        assert_memory_equal(a, b, 14);
    }
    st_free(st);
}

static void test_ranges(void **state)
{
    const struct { synth_preset p; int layers, experts; } v[] = {
        { SYNTH_PRESET_TINY, 0, 0 }, { SYNTH_PRESET_SLICE, 0, 2 }, { SYNTH_PRESET_K3, 3, 5 },
        { SYNTH_PRESET_ORACLE, 0, 0 },
    };
    uint64_t seed = 0x2545F4914F6CDD1DULL;
    (void)state;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        synth_model *m = model(v[i].p, v[i].layers, v[i].experts);
        for (size_t f = 0; f < synth_file_count(m); f++) {
            ranges_check(m, f, &seed);
            if (synth_file_is_shard(m, f))
                boundaries_check(m, f);
        }
        assert_int_equal(synth_read(m, synth_file_count(m), 0, 1, &seed), SHOAL_EINVAL);
        synth_model_free(m);
    }
}

/* ---- the full K3 layout (k3.md §2, §8) ------------------------------------ */

static void test_k3_layout(void **state)
{
    synth_model *m = model(SYNTH_PRESET_K3, 0, 0);
    uint64_t total = 0, spine = 0, experts = 0;
    size_t tensors = 0, vision = 0, lang = 0;
    (void)state;
    assert_int_equal(synth_model_shards(m), 96);
    assert_int_equal(synth_model_tensors(m), 497220);
    assert_int_equal(synth_file_count(m), 100);
    for (size_t f = 0; f < synth_file_count(m); f++) {
        total += synth_file_size(m, f);
        if (!synth_file_is_shard(m, f))
            continue;
        st_file *st = header_of(m, f);
        size_t run = 0;
        uint64_t prev_end = 0;
        for (size_t i = 0; i < st_count(st); i++) {
            const st_tensor *t = st_at(st, i);
            tensors++;
            if (strstr(t->name, ".experts.")) {
                experts += t->end - t->begin;
                if (strstr(t->name, ".w1.weight_packed")) {
                    /* Each expert's six records form one 17,547,264-byte span
                     * right after the previous expert. */
                    const st_tensor *last = st_at(st, i + 5);
                    assert_non_null(strstr(last->name, ".w3.weight_scale"));
                    assert_int_equal(last->end - t->begin, 17547264);
                    if (run++)
                        assert_int_equal(t->begin, prev_end);
                    prev_end = last->end;
                }
            } else if (strncmp(t->name, "language_model.", 15) == 0) {
                lang++;
                spine += t->end - t->begin;
            } else {
                vision++;
                assert_true(f >= 97);      /* shards 95-96 */
            }
        }
        if (f >= 4 && f <= 95)             /* shards 2..93: one MoE layer each */
            assert_int_equal(run, 896);
        st_free(st);
    }
    assert_int_equal(tensors, 497220);
    assert_int_equal(lang, 2460);
    assert_int_equal(vision, 168);
    assert_int_equal(experts, 82432ULL * 17547264);
    assert_true(spine > 113400000000ULL && spine < 113600000000ULL);    /* 113.5 GB */
    /* Layer 5's experts in lexicographic order: 10 right after 1. */
    long f6 = synth_file_find(m, "model-00006-of-000096.safetensors");
    st_file *st = header_of(m, (size_t)f6);
    const st_tensor *e1 = st_find(st, "language_model.model.layers.5.block_sparse_moe.experts.1.w3.weight_scale");
    const st_tensor *e10 = st_find(st, "language_model.model.layers.5.block_sparse_moe.experts.10.w1.weight_packed");
    assert_non_null(e1);
    assert_non_null(e10);
    assert_int_equal(e1->end, e10->begin);
    st_free(st);
    long idx = synth_file_find(m, "model.safetensors.index.json");
    assert_true(synth_file_size(m, (size_t)idx) > 59500000 && synth_file_size(m, (size_t)idx) < 60100000);
    assert_true(total > 1560000000000ULL && total < 1561000000000ULL);
    synth_model_free(m);
}

static void test_config_limits(void **state)
{
    synth_config c;
    synth_preset p;
    shoal_err err = { 0 };
    (void)state;
    assert_int_equal(synth_preset_parse("k3", &p), 0);
    assert_int_equal(p, SYNTH_PRESET_K3);
    assert_int_equal(synth_preset_parse("huge", &p), SHOAL_EINVAL);
    synth_config_init(&c, SYNTH_PRESET_K3);
    assert_int_equal(synth_config_finish(&c, 0, 0, &err), 0);
    assert_int_equal(c.layers, 93);
    assert_int_equal(c.experts, 896);
    assert_int_equal(c.topk, 16);
    assert_int_equal(synth_expert_bytes(&c), 17547264);
    /* K3's MLA list: 4, 8, ..., 92 and 93 (1-based). */
    for (int i = 1; i <= 93; i++)
        assert_int_equal(c.is_mla[i - 1], i % 4 == 0 || i == 93);
    assert_int_equal(synth_config_finish(&c, SYNTH_MAX_LAYERS + 1, 0, &err), SHOAL_EINVAL);
    synth_config_init(&c, SYNTH_PRESET_K3);
    assert_int_equal(synth_config_finish(&c, 0, SYNTH_MAX_EXPERTS + 1, &err), SHOAL_EINVAL);
    synth_config_init(&c, SYNTH_PRESET_K3);
    assert_int_equal(synth_config_finish(&c, 8, 2, &err), 0);
    assert_int_equal(c.topk, 2);
}

/* ---- digests ----------------------------------------------------------------- */

static void test_digest_run(void **state)
{
    synth_model *m = model(SYNTH_PRESET_SLICE, 2, 2);
    size_t n = synth_file_count(m);
    synth_digest_job *jobs = calloc(n + 1, sizeof *jobs);
    shoal_err err = { 0 };
    (void)state;
    for (size_t i = 0; i < n; i++)
        jobs[i] = (synth_digest_job){ .m = m, .file = i, .len = synth_file_size(m, i) };
    jobs[n] = (synth_digest_job){ .m = m, .file = 4, .len = 1000, .want_sha1 = 1 };  /* a prefix */
    assert_int_equal(synth_digest_run(jobs, n + 1, 3, NULL, NULL, &err), 0);
    for (size_t i = 0; i <= n; i++) {
        synth_digest d;
        assert_int_equal(jobs[i].rc, 0);
        assert_int_equal(synth_digest_file(m, jobs[i].file, jobs[i].len, 0, &d, &err), 0);
        assert_string_equal(jobs[i].out.sha256, d.sha256);
    }
    assert_int_equal(strlen(jobs[n].out.sha1), 40);
    assert_string_not_equal(jobs[n].out.sha256, jobs[4].out.sha256);
    jobs[0].len = synth_file_size(m, 0) + 1;
    assert_int_equal(synth_digest_run(jobs, 1, 1, NULL, NULL, &err), SHOAL_ERANGE);
    assert_non_null(strstr(err.msg, "config.json"));
    free(jobs);
    synth_model_free(m);
}

/* The committed table (synth/k3_etags.inc) must still describe what the
 * generator makes: every name and size, every small file's digests, and
 * every file's probe (3 MiB of it; the full hash of shard 94 is checked by
 * test_hubmock_synth.sh with sha256sum). */
static void test_known_table(void **state)
{
    size_t n;
    const synth_known *k = synth_known_table(&n);
    synth_model *m = model(SYNTH_PRESET_K3, 0, 0);
    shoal_err err = { 0 };
    (void)state;
    if (!k)
        fail_msg("synth/k3_etags.inc is empty: run mkmodel --preset k3 --print-etags");
    assert_string_equal(synth_known_key(), synth_model_key(m));
    assert_int_equal(n, synth_file_count(m));
    for (size_t i = 0; i < n; i++) {
        long f = synth_file_find(m, k[i].file);
        char probe[65];
        synth_digest d;
        assert_true(f >= 0);
        assert_int_equal(k[i].size, synth_file_size(m, (size_t)f));
        assert_int_equal(synth_probe(m, (size_t)f, probe, &err), 0);
        if (strcmp(probe, k[i].probe))
            fail_msg("%s: the generator no longer makes the bytes synth/k3_etags.inc hashed; "
                     "regenerate it (docs/mkmodel.md) and bump SYNTH_GEN_VERSION", k[i].file);
        assert_int_equal(synth_known_digest(m, (size_t)f, k[i].size, &d), 1);
        assert_string_equal(d.sha256, k[i].sha256);
        assert_int_equal(synth_known_digest(m, (size_t)f, k[i].size - 1, &d), 0);
        char hdr[65];
        assert_int_equal(synth_header_sha256(m, (size_t)f, hdr, &err), 0);
        assert_string_equal(hdr, k[i].header);
        if (synth_file_size(m, (size_t)f) < (100u << 20)) {
            assert_int_equal(synth_digest_file(m, (size_t)f, k[i].size, 1, &d, &err), 0);
            assert_string_equal(d.sha256, k[i].sha256);
            assert_string_equal(d.sha1, k[i].sha1);
        }
    }
    synth_model_free(m);
}

/* A reduced k3 finds the shards it shares with K3 (same header, hence the
 * same bytes) in the table, and only those. */
static void test_known_family(void **state)
{
    synth_model *m = model(SYNTH_PRESET_K3, 2, 2), *full = model(SYNTH_PRESET_K3, 0, 0);
    static const char *const same[][2] = {
        { "model-00001-of-000005.safetensors", "model-00001-of-000096.safetensors" },
        { "model-00003-of-000005.safetensors", "model-00094-of-000096.safetensors" },
        { "model-00004-of-000005.safetensors", "model-00095-of-000096.safetensors" },
        { "model-00005-of-000005.safetensors", "model-00096-of-000096.safetensors" },
    };
    shoal_err err = { 0 };
    synth_digest d, want;
    char pa[65], pb[65];
    (void)state;
    for (size_t i = 0; i < 4; i++) {
        size_t a = (size_t)synth_file_find(m, same[i][0]), b = (size_t)synth_file_find(full, same[i][1]);
        assert_int_equal(synth_known_digest(m, a, synth_file_size(m, a), &d), 1);
        assert_int_equal(synth_known_digest(full, b, synth_file_size(full, b), &want), 1);
        assert_string_equal(d.sha256, want.sha256);
        assert_int_equal(synth_probe(m, a, pa, &err), 0);     /* and the bytes agree */
        assert_int_equal(synth_probe(full, b, pb, &err), 0);
        assert_string_equal(pa, pb);
    }
    for (size_t f = 0; f < synth_file_count(m); f++)       /* the rest must be hashed */
        if (!synth_file_is_shard(m, f) || strcmp(synth_file_name(m, f), "model-00002-of-000005.safetensors") == 0)
            assert_int_equal(synth_known_digest(m, f, synth_file_size(m, f), &d), 0);
    synth_model_free(m);
    synth_config c;
    synth_config_init(&c, SYNTH_PRESET_K3);
    c.seed = 1;
    assert_int_equal(synth_config_finish(&c, 2, 2, &err), 0);
    assert_int_equal(synth_model_new(&c, &m, &err), 0);
    assert_int_equal(synth_known_digest(m, 2 + 1, synth_file_size(m, 3), &d), 0);   /* another seed */
    synth_model_free(m);
    synth_model_free(full);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_golden),
        cmocka_unit_test(test_value_rules),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_k3_layout),
        cmocka_unit_test(test_config_limits),
        cmocka_unit_test(test_digest_run),
        cmocka_unit_test(test_known_table),
        cmocka_unit_test(test_known_family),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
