/* test_oracle.c — synth/'s oracle preset from its files alone: tiny's
 * layout byte for byte, the promise in config.json, the counts it refuses,
 * the seed touching only the random filler, and the construction's
 * documented properties read back from the bytes (docs/mkmodel.md "The
 * oracle"): one routed expert per symbol per layer and the decoys' biases,
 * D- decoding to exactly -2 x D+, the P/Q units' e2m1 counts distinct.
 * That the sentence comes out (and breaks when a part is wrong) is
 * tests/integration/test_oracle.sh's, with the engine and the reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/json.h"
#include "common/safetensors.h"
#include "synth/synth.h"

static synth_model *model(synth_preset p, uint64_t seed)
{
    synth_config c;
    synth_model *m = NULL;
    shoal_err err = { 0 };
    synth_config_init(&c, p);
    c.seed = seed;
    assert_int_equal(synth_config_finish(&c, 0, 0, &err), 0);
    if (synth_model_new(&c, &m, &err))
        fail_msg("synth_model_new: %s", err.msg);
    return m;
}

static uint8_t *file_bytes(const synth_model *m, const char *name, uint64_t *size)
{
    long f = synth_file_find(m, name);
    assert_true(f >= 0);
    *size = synth_file_size(m, (size_t)f);
    uint8_t *b = malloc(*size + 1);
    assert_non_null(b);
    assert_int_equal(synth_read(m, (size_t)f, 0, *size, b), 0);
    b[*size] = 0;
    return b;
}

/* A tensor's bytes and its shape, wherever it lives. */
typedef struct view { uint8_t *data; uint64_t n; int64_t rows, cols; } view;

static view tensor(const synth_model *m, const char *name)
{
    view v = { 0 };
    for (size_t f = 0; f < synth_file_count(m); f++) {
        if (!synth_file_is_shard(m, f))
            continue;
        uint64_t hs = synth_file_header_size(m, f);
        uint8_t *h = malloc(hs);
        st_file *st = NULL;
        shoal_err err = { 0 };
        assert_int_equal(synth_read(m, f, 0, hs, h), 0);
        assert_int_equal(st_parse(h + 8, hs - 8, synth_file_size(m, f), &st, &err), 0);
        free(h);
        const st_tensor *t = st_find(st, name);
        if (t) {
            v.n = t->end - t->begin;
            v.rows = t->shape[0];
            v.cols = t->ndim > 1 ? t->shape[1] : 1;
            v.data = malloc(v.n);
            assert_int_equal(synth_read(m, f, t->begin, v.n, v.data), 0);
        }
        st_free(st);
        if (v.data)
            return v;
    }
    fail_msg("no tensor %s", name);
    return v;
}

static float bf16(const view *v, int64_t i)
{
    uint32_t b = (uint32_t)(v->data[2 * i] | v->data[2 * i + 1] << 8) << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static float f32(const view *v, int64_t i)
{
    uint32_t b = (uint32_t)v->data[4 * i] | (uint32_t)v->data[4 * i + 1] << 8 |
                 (uint32_t)v->data[4 * i + 2] << 16 | (uint32_t)v->data[4 * i + 3] << 24;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* ---- the files: tiny's layout, the promise ---------------------------------- */

static void test_layout_and_promise(void **state)
{
    synth_model *o = model(SYNTH_PRESET_ORACLE, 0), *t = model(SYNTH_PRESET_TINY, 0);
    (void)state;
    assert_int_equal(synth_file_count(o), synth_file_count(t));
    for (size_t f = 0; f < synth_file_count(o); f++) {
        assert_string_equal(synth_file_name(o, f), synth_file_name(t, f));
        if (!strcmp(synth_file_name(o, f), "config.json"))
            continue;
        /* same sizes; headers, index and tokenizer byte for byte */
        assert_int_equal(synth_file_size(o, f), synth_file_size(t, f));
        uint64_t n = synth_file_header_size(o, f);
        uint8_t *a = malloc(n), *b = malloc(n);
        assert_int_equal(synth_read(o, f, 0, n, a), 0);
        assert_int_equal(synth_read(t, f, 0, n, b), 0);
        assert_memory_equal(a, b, n);
        free(a);
        free(b);
    }
    uint64_t size;
    uint8_t *cfg = file_bytes(o, "config.json", &size);
    shoal_err err = { 0 };
    shoal_json *j = shoal_json_parse((const char *)cfg, size, &err);
    assert_non_null(j);
    assert_string_equal(shoal_json_str_value(shoal_json_get(j, "mkmodel_preset")), "oracle");
    shoal_json *or = shoal_json_get(j, "oracle");
    assert_string_equal(shoal_json_str_value(shoal_json_get(or, "prompt")), SYNTH_ORACLE_PROMPT);
    assert_string_equal(shoal_json_str_value(shoal_json_get(or, "text")), SYNTH_ORACLE_TEXT);
    shoal_json *ids = shoal_json_get(or, "ids"), *pids = shoal_json_get(or, "prompt_ids");
    assert_int_equal(shoal_json_array_size(ids), SYNTH_ORACLE_TEXT_TOKENS);
    assert_int_equal(shoal_json_array_size(pids), SYNTH_ORACLE_PROMPT_TOKENS);
    for (int i = 0; i < SYNTH_ORACLE_TEXT_TOKENS; i++)
        assert_int_equal(shoal_json_int_value(shoal_json_array_at(ids, (size_t)i)), synth_oracle_text_ids[i]);
    /* The chain needs distinct tokens: each one's next is its own. */
    for (int i = 0; i < SYNTH_ORACLE_TEXT_TOKENS; i++)
        for (int k = 0; k < i; k++)
            assert_int_not_equal(synth_oracle_text_ids[i], synth_oracle_text_ids[k]);
    shoal_json_free(j);
    free(cfg);
    synth_model_free(o);
    synth_model_free(t);
}

static void test_counts_refused(void **state)
{
    synth_config c;
    shoal_err err = { 0 };
    (void)state;
    synth_config_init(&c, SYNTH_PRESET_ORACLE);
    assert_int_equal(synth_config_finish(&c, 4, 0, &err), SHOAL_EINVAL);
    assert_non_null(strstr(err.msg, "oracle"));
    synth_config_init(&c, SYNTH_PRESET_ORACLE);
    assert_int_equal(synth_config_finish(&c, 0, 32, &err), SHOAL_EINVAL);
    synth_config_init(&c, SYNTH_PRESET_ORACLE);
    assert_int_equal(synth_config_finish(&c, 8, 64, &err), 0);
    assert_int_equal(c.topk, 4);
    synth_preset p;
    assert_int_equal(synth_preset_parse("oracle", &p), 0);
    assert_int_equal(p, SYNTH_PRESET_ORACLE);
    assert_string_equal(synth_preset_name(p), "oracle");
}

static void test_seed_moves_only_filler(void **state)
{
    synth_model *a = model(SYNTH_PRESET_ORACLE, 0), *b = model(SYNTH_PRESET_ORACLE, 7);
    const char *q = "language_model.model.layers.1.self_attn.q_proj.weight";
    const char *g = "language_model.model.layers.2.block_sparse_moe.gate.weight";
    const char *h = "language_model.lm_head.weight";
    (void)state;
    view qa = tensor(a, q), qb = tensor(b, q), ga = tensor(a, g), gb = tensor(b, g);
    view ha = tensor(a, h), hb = tensor(b, h);
    assert_memory_not_equal(qa.data, qb.data, qa.n);     /* attention: tiny's random recipe */
    assert_memory_equal(ga.data, gb.data, ga.n);         /* routers: constructed */
    for (int i = 0; i < SYNTH_ORACLE_TEXT_TOKENS; i++)   /* the sentence's lm_head rows */
        assert_memory_equal(ha.data + 2 * 256 * synth_oracle_text_ids[i],
                            hb.data + 2 * 256 * synth_oracle_text_ids[i], 2 * 256);
    assert_memory_not_equal(ha.data, hb.data, 2 * 256);  /* row 0 is filler */
    free(qa.data), free(qb.data), free(ga.data), free(gb.data), free(ha.data), free(hb.data);
    synth_model_free(a);
    synth_model_free(b);
}

/* ---- the construction, read back ---------------------------------------------- */

static const double e2m1[16] = { 0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6 };

/* Decode record w of expert e of layer l: [rows][cols] doubles. */
static double *decode(const synth_model *m, int l, int e, int w, int64_t *rows, int64_t *cols)
{
    char pn[160], sn[160];
    snprintf(pn, sizeof pn, "language_model.model.layers.%d.block_sparse_moe.experts.%d.w%d."
             "weight_packed", l, e, w);
    snprintf(sn, sizeof sn, "language_model.model.layers.%d.block_sparse_moe.experts.%d.w%d."
             "weight_scale", l, e, w);
    view p = tensor(m, pn), s = tensor(m, sn);
    *rows = p.rows;
    *cols = 2 * p.cols;
    double *out = malloc(sizeof *out * (size_t)(*rows * *cols));
    for (int64_t r = 0; r < *rows; r++)
        for (int64_t c = 0; c < *cols; c++) {
            uint8_t b = p.data[r * p.cols + c / 2], code = c % 2 ? b >> 4 : b & 15;
            out[r * *cols + c] = ldexp(e2m1[code], s.data[r * s.cols + c / 32] - 127);
        }
    free(p.data);
    free(s.data);
    return out;
}

static void test_construction(void **state)
{
    synth_model *m = model(SYNTH_PRESET_ORACLE, 0);
    char name[160];
    (void)state;
    for (int l = 1; l < 8; l++) {
        snprintf(name, sizeof name, "language_model.model.layers.%d.block_sparse_moe.gate.weight", l);
        view g = tensor(m, name);
        snprintf(name, sizeof name, "language_model.model.layers.%d.block_sparse_moe.gate."
                 "e_score_correction_bias", l);
        view bias = tensor(m, name);
        int symbols = 0, unused = 0, dp = -1, dm = -1, trap = 0;
        for (int e = 0; e < 64; e++) {
            int big = 0, zero = 1;
            for (int c = 0; c < 256; c++) {
                float v = bf16(&g, e * 256 + c);
                big += v == 30.0f;
                zero &= v == 0.0f;
            }
            float b = f32(&bias, e);
            symbols += big == 1 && b == 0.0f;
            unused += zero && b == -1.0f;
            trap += b == -0.8f;
            if (b == 0.3f)
                *(zero ? &dm : &dp) = e;
        }
        assert_int_equal(symbols, 24);          /* one expert per symbol */
        assert_int_equal(unused, 64 - 28);
        assert_int_equal(trap, 1);
        assert_true(dp >= 0 && dm >= 0);
        /* D-: D+'s gate and up, and a down projection of exactly -2 x D+'s */
        for (int w = 1; w <= 3; w++) {
            int64_t r, c;
            double *x = decode(m, l, dp, w, &r, &c), *y = decode(m, l, dm, w, &r, &c);
            double nz = 0;
            for (int64_t i = 0; i < r * c; i++) {
                assert_true(y[i] == (w == 2 ? -2 : 1) * x[i]);
                nz += fabs(x[i]);
            }
            assert_true(nz > 0);
            free(x);
            free(y);
        }
        free(g.data);
        free(bias.data);
    }
    synth_model_free(m);
}

/* X's P/Q units (w3 rows 32..63): up sums +4 x 16 and -4 x 16, and the
 * signed count of each e2m1 magnitude over them nonzero and all distinct,
 * so no wrong table value and no swap of two keeps them cancelling. */
static void test_pq_counts(void **state)
{
    synth_model *m = model(SYNTH_PRESET_ORACLE, 0);
    char name[160];
    (void)state;
    for (int l = 1; l < 8; l++) {
        snprintf(name, sizeof name, "language_model.model.layers.%d.block_sparse_moe.gate."
                 "e_score_correction_bias", l);
        view bias = tensor(m, name);
        snprintf(name, sizeof name, "language_model.model.layers.%d.block_sparse_moe.gate.weight", l);
        view g = tensor(m, name);
        int x = -1;                  /* X: bias 0 and a router row of +8 at one marker */
        for (int e = 0; e < 64 && x < 0; e++) {
            int eights = 0, others = 0;
            for (int c = 0; c < 256; c++) {
                float v = bf16(&g, e * 256 + c);
                eights += v == 8.0f;
                others += v != 0.0f && v != 8.0f;
            }
            if (f32(&bias, e) == 0.0f && eights == 1 && !others)
                x = e;
        }
        assert_true(x >= 0);
        char pn[160];
        snprintf(pn, sizeof pn, "language_model.model.layers.%d.block_sparse_moe.experts.%d.w3."
                 "weight_packed", l, x);
        view p = tensor(m, pn);
        int count[8] = { 0 }, sums[2] = { 0 };
        for (int r = 32; r < 64; r++) {
            double u = 0;
            for (int c = 0; c < 128; c++) {
                uint8_t b = p.data[r * 64 + c / 2], code = c % 2 ? b >> 4 : b & 15;
                if (code & 7)
                    count[code & 7] += code & 8 ? -1 : 1;
                u += e2m1[code];
            }
            assert_true(u == 4.0 || u == -4.0);
            sums[u > 0]++;
        }
        assert_int_equal(sums[0], 16);
        assert_int_equal(sums[1], 16);
        for (int a = 1; a < 8; a++) {
            assert_int_not_equal(count[a], 0);
            for (int b = 1; b < a; b++)
                assert_int_not_equal(count[a], count[b]);
        }
        free(p.data);
        free(g.data);
        free(bias.data);
    }
    synth_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_promise),
        cmocka_unit_test(test_counts_refused),
        cmocka_unit_test(test_seed_moves_only_filler),
        cmocka_unit_test(test_construction),
        cmocka_unit_test(test_pq_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
