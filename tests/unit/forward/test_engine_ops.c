/* test_engine_ops.c — the forward pass's small steps (engine/forward/forward.h part 1) against
 * hand computations, and the expert-source contract (part 4)
 * with a scripted implementation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "engine/forward/forward.h"

static void test_sigmoid(void **state)
{
    (void)state;
    assert_true(engine_sigmoid(0.0f) == 0.5f);
    assert_true(engine_sigmoid(-1000.0f) == 0.0f);
    assert_true(engine_sigmoid(1000.0f) == 1.0f);
    assert_float_equal(engine_sigmoid(2.0f), 1.0 / (1.0 + exp(-2.0)), 1e-7);
}

static void test_rmsnorm(void **state)
{
    float x[4] = { 1, 2, 3, 4 }, w[4] = { 1, 1, 2, 0.5f }, out[4];
    double inv = 1.0 / sqrt(30.0 / 4 + 1e-5);
    (void)state;
    engine_rmsnorm(x, w, 4, 1e-5, out);
    assert_float_equal(out[0], 1 * inv, 1e-6);
    assert_float_equal(out[2], 6 * inv, 1e-6);
    assert_float_equal(out[3], 2 * inv, 1e-6);
    engine_rmsnorm(x, w, 4, 1e-5, x);           /* in place */
    assert_memory_equal(x, out, sizeof out);
}

static void test_attnres_mix(void **state)
{
    float a0[2] = { 2, 0 }, a1[2] = { 1, 1 }, prefix[2] = { 0, 3 }, sw[2] = { 1, 0.5f }, out[2];
    const float *anc[2] = { a0, a1 };
    (void)state;
    /* score = Σ v·sw / sqrt(mean v² + eps), eps 0 here:
     * a0: 2 / sqrt(2); a1: 1.5 / 1; prefix: 1.5 / sqrt(4.5) */
    double s[3] = { 2 / sqrt(2.0), 1.5, 1.5 / sqrt(4.5) }, z = 0, p[3];
    for (int i = 0; i < 3; i++)
        z += exp(s[i]);
    for (int i = 0; i < 3; i++)
        p[i] = exp(s[i]) / z;
    engine_attnres_mix(prefix, anc, 2, sw, 2, 0.0, out);
    assert_float_equal(out[0], p[0] * 2 + p[1] * 1, 1e-6);
    assert_float_equal(out[1], p[1] * 1 + p[2] * 3, 1e-6);
    /* the output may alias the prefix */
    engine_attnres_mix(prefix, anc, 2, sw, 2, 0.0, prefix);
    assert_memory_equal(prefix, out, sizeof out);
    /* no anchors: the prefix itself */
    engine_attnres_mix(a1, anc, 0, sw, 2, 0.0, out);
    assert_true(out[0] == 1 && out[1] == 1);
}

static void test_route_ties_and_weights(void **state)
{
    float s[6] = { 0.1f, 0.9f, 0.9f, 0.2f, 0.5f, 0.9f }, bias[6] = { 0, 0, 0, 0.7f, 0, 0 };
    float w[3];
    int32_t ids[3];
    (void)state;
    /* biased: 0.1 0.9 0.9 0.9 0.5 0.9 -> four-way tie, lowest ids first */
    engine_route_topk(s, bias, 6, 3, 1, 1.0, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 3);
    /* weights from the unbiased scores, renormalised */
    assert_float_equal(w[0], 0.9 / 2.0, 1e-6);
    assert_float_equal(w[2], 0.2 / 2.0, 1e-6);
    /* no bias: the biggest first, ties to the lowest index */
    engine_route_topk(s, NULL, 6, 2, 0, 2.0, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_float_equal(w[0], 1.8, 1e-6);         /* not renormalised, scaled */
}

static void test_l2norm(void **state)
{
    float a[2] = { 3, 4 }, b[2] = { 3, 4 }, z[2] = { 0, 0 };
    (void)state;
    engine_l2norm(a, 2, ENGINE_L2_FLA);
    assert_float_equal(a[0], 3 / sqrt(25 + 1e-6), 1e-7);
    engine_l2norm(b, 2, ENGINE_L2_MAX);
    assert_float_equal(b[0], 0.6, 1e-7);
    assert_float_equal(b[1], 0.8, 1e-7);
    engine_l2norm(z, 2, ENGINE_L2_MAX);
    assert_true(z[0] == 0 && z[1] == 0);
}

static void test_kda_step(void **state)
{
    /* S = [[1,2],[3,4]], alpha = [0.5, 1]: decayed [[0.5,1],[3,4]];
     * k = e0: Sᵀk = [0.5,1], u = v - Sᵀk = [0.5,0];
     * S += 0.5·k uᵀ -> [[0.75,1],[3,4]]; o = Sᵀq with q = [1,1] -> [3.75,5] */
    float S[4] = { 1, 2, 3, 4 }, q[2] = { 1, 1 }, k[2] = { 1, 0 }, v[2] = { 1, 1 };
    float alpha[2] = { 0.5f, 1 }, o[2], tmp[2];
    (void)state;
    engine_kda_step(S, q, k, v, alpha, 0.5f, 2, 2, o, tmp);
    assert_float_equal(S[0], 0.75, 1e-7);
    assert_float_equal(S[1], 1.0, 1e-7);
    assert_float_equal(S[2], 3.0, 1e-7);
    assert_float_equal(S[3], 4.0, 1e-7);
    assert_float_equal(o[0], 3.75, 1e-7);
    assert_float_equal(o[1], 5.0, 1e-7);
    /* from a zero state one step writes beta·k vᵀ and reads it back */
    float Z[4] = { 0 };
    engine_kda_step(Z, k, k, v, alpha, 0.25f, 2, 2, o, tmp);
    assert_float_equal(Z[0], 0.25, 1e-7);
    assert_float_equal(Z[1], 0.25, 1e-7);
    assert_true(Z[2] == 0 && Z[3] == 0);
    assert_float_equal(o[0], 0.25, 1e-7);
}

/* ---- expert source contract -------------------------------------------------- */

static uint8_t g_span[64];

/* Delivers in reverse order; id 13 fails at the source. */
static int script_fetch(void *impl, int layer, const int32_t *ids, size_t n,
                        expert_ready_fn fn, void *ctx, shoal_err *err)
{
    (void)impl;
    for (size_t i = n; i-- > 0;) {
        int rc;
        if (ids[i] == 13) {
            shoal_err detail = { SHOAL_ENET, "upstream reset" };
            rc = fn(ctx, layer, ids[i], NULL, 0, EXPERT_TIER_NETWORK, SHOAL_ENET, &detail);
        } else {
            rc = fn(ctx, layer, ids[i], g_span, sizeof g_span,
                    ids[i] < 5 ? EXPERT_TIER_RAM : EXPERT_TIER_DISK, 0, NULL);
        }
        if (rc != 0)
            return shoal_err_set(err, rc, "callback stopped the fetch at %d", (int)ids[i]);
    }
    return 0;
}

static int g_freed;
static void script_free(void *impl)
{
    (void)impl;
    g_freed++;
}

typedef struct seen {
    int32_t order[8];
    int n, failed, stop_at;
} seen;

static int record(void *ctx, int layer, int32_t expert, const uint8_t *span, size_t bytes,
                  expert_tier tier, int status, const shoal_err *detail)
{
    seen *s = ctx;
    (void)tier;
    assert_int_equal(layer, 4);
    if (status != 0) {
        assert_null(span);
        assert_non_null(detail);
        s->failed++;
        return status;
    }
    assert_ptr_equal(span, g_span);
    assert_int_equal(bytes, sizeof g_span);
    s->order[s->n++] = expert;
    return expert == s->stop_at ? SHOAL_ECANCELED : 0;
}

static void test_expert_source(void **state)
{
    static const expert_source_ops ops = { script_fetch, script_free };
    expert_source *src = expert_source_new(&ops, NULL);
    expert_source_stats st;
    int32_t ids[3] = { 2, 7, 9 }, bad[2] = { 13, 3 };
    seen s = { .stop_at = -1 };
    shoal_err err = { 0 };
    (void)state;

    assert_non_null(src);
    assert_int_equal(expert_source_fetch(src, 4, ids, 3, record, &s, &err), 0);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.order[0], 9);           /* arrival order, not request order */
    expert_source_stats_get(src, &st);
    assert_int_equal(st.experts, 3);
    assert_int_equal(st.bytes, 3 * sizeof g_span);
    assert_int_equal(st.hits[EXPERT_TIER_RAM], 1);
    assert_int_equal(st.hits[EXPERT_TIER_DISK], 2);
    /* a failed expert reaches the callback, whose code stops the fetch */
    s = (seen){ .stop_at = -1 };
    assert_int_equal(expert_source_fetch(src, 4, bad, 2, record, &s, &err), SHOAL_ENET);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.failed, 1);
    /* a callback can stop the fetch */
    s = (seen){ .stop_at = 7 };
    assert_int_equal(expert_source_fetch(src, 4, ids, 3, record, &s, &err), SHOAL_ECANCELED);
    assert_int_equal(s.n, 2);
    /* nothing asked, nothing called */
    assert_int_equal(expert_source_fetch(src, 4, ids, 0, record, &s, &err), 0);
    expert_source_free(src);
    assert_int_equal(g_freed, 1);
    expert_source_free(NULL);
    assert_string_equal(expert_tier_name(EXPERT_TIER_LOCAL), "local");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigmoid),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_attnres_mix),
        cmocka_unit_test(test_route_ties_and_weights),
        cmocka_unit_test(test_l2norm),
        cmocka_unit_test(test_kda_step),
        cmocka_unit_test(test_expert_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
