/* test_report_full.c — the stats report at Kimi K3's real size: 92 MoE
 * layers x 896 experts with counts of a long run (about 10M tokens of
 * top-16 routing), through the cache's public API only.
 *
 * `test_report_full --populate DIR` only builds that cache in DIR and
 * exits: tests/integration/test_cli_full.sh serves it through shoald (a
 * STATS reply past the 1 MiB frame, sent as several frames) and draws its
 * heat map.
 *
 * The fixture:
 *   model moonshotai/Kimi-K3@main with a K3-shaped manifest (93 layers,
 *   896 experts per layer, 17,547,264-byte spans in 92 shards, three spine
 *   tensors), cached as the fetcher caches it (a derived object);
 *   disk-tier counts for every (layer 1..92, expert): requests
 *   k3_requests(l, e), hits = r - r/16, joins = r/64, the rest misses.
 */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "cache/cache.h"
#include "common/json.h"
#include "common/manifest.h"
#include "common/sys.h"
#include "tests/unit/cache/cache_testutil.h"

#define EP        "https://huggingface.co"
#define K3_REPO   "moonshotai/Kimi-K3"
#define K3_COMMIT "c5d1dd4c428bd1ce8b88c5044f3b6ccde9e3b721"
#define K3_LAYERS 93u
#define K3_EXPERTS 896u
#define K3_SPAN   17547264ull
#define K3_HEAD   (1ull << 20)        /* a shard's header, before its experts */

static const char k3_config_text[] = "{\"num_hidden_layers\": 93, \"num_experts\": 896}\n";

static void die(const char *what, const shoal_err *e)
{
    fprintf(stderr, "fixture: %s: %s\n", what, e ? e->msg : "");
    abort();
}

/* Requests of expert e of MoE layer l: flat routing (150,000..209,999 —
 * the spread of top-16 of 896 over ~10M tokens), one expert in 211 four
 * times hotter and one in 307 five times colder.  The integration test
 * recomputes it (tests/integration/test_cli_full.sh). */
static uint64_t k3_requests(uint32_t l, uint32_t e)
{
    uint32_t h = l * 2654435761u + e * 40503u;
    uint64_t r = 150000u + h % 60000u;
    if ((e * 7u + l) % 211u == 0)
        r *= 4;
    if ((e * 13u + l) % 307u == 0)
        r /= 5;
    return r;
}

static void k3_shard_name(char *out, size_t cap, uint32_t n)
{
    snprintf(out, cap, "model-%05u-of-000096.safetensors", n);
}

/* The manifest the fetcher would build (experts of layer l in shard l+1,
 * the spine tensors named here in shard 94), stored as it stores it. */
static void k3_manifest_put(cache *c)
{
    static const struct { const char *name; uint64_t rows, cols; } spine[] = {
        { "lm_head.weight", 163840, 7168 },
        { "model.embed_tokens.weight", 163840, 7168 },
        { "model.norm.weight", 7168, 0 },
    };
    manifest *m = manifest_new();
    cache_names n = { EP, K3_REPO, "main", K3_COMMIT, CACHE_MANIFEST_FILE, NULL, -1, -1 };
    cache_writer *w = NULL;
    shoal_buf b;
    shoal_err e;
    uint32_t fi, spine_file = 0;
    uint64_t at = K3_HEAD;
    char path[64], etag[80];

    shoal_buf_init(&b, 0);
    if (!m || manifest_set_model(m, EP, K3_REPO, "main", K3_COMMIT, &e) ||
        manifest_set_config(m, k3_config_text, sizeof k3_config_text - 1, &e))
        die("manifest", &e);
    for (uint32_t s = 1; s <= 94; s++) {
        k3_shard_name(path, sizeof path, s);
        snprintf(etag, sizeof etag, "%064x", s);
        uint64_t size = s == 94 ? K3_HEAD + 2 * 163840ull * 7168 * 2 + 7168 * 2
                                : K3_HEAD + K3_EXPERTS * K3_SPAN;
        if (manifest_file_add(m, path, etag, size, &fi, &e))
            die("manifest file", &e);
        if (s == 94)
            spine_file = fi;
        for (uint32_t x = 0; s >= 2 && s <= K3_LAYERS && x < K3_EXPERTS; x++)
            if (manifest_expert_add(m, s - 1, x, fi, K3_HEAD + x * K3_SPAN, &e))
                die("manifest expert", &e);
    }
    for (size_t i = 0; i < sizeof spine / sizeof spine[0]; i++) {
        manifest_tensor t;
        memset(&t, 0, sizeof t);
        t.name = (char *)spine[i].name;
        t.file = spine_file;
        t.offset = at;
        t.ndim = spine[i].cols ? 2 : 1;
        t.shape[0] = spine[i].rows;
        t.shape[1] = spine[i].cols;
        t.length = spine[i].rows * (spine[i].cols ? spine[i].cols : 1) * 2;
        snprintf(t.dtype, sizeof t.dtype, "BF16");
        t.is_spine = 1;
        at += t.length;
        if (manifest_tensor_add(m, &t, &e))
            die("manifest tensor", &e);
    }
    m->n_layers = K3_LAYERS;
    m->experts_per_layer = K3_EXPERTS;
    m->expert_bytes = K3_SPAN;
    if (manifest_finish(m, &e) || manifest_encode(m, &b, &e))
        die("manifest encode", &e);
    cache_key k = { "manifest-v1:k3", 0, b.len };
    if (cache_write_begin(c, &k, CACHE_KIND_DERIVED, &n, &w, &e) ||
        cache_write_append(w, b.data, b.len, &e) || cache_write_commit(w, NULL, &e))
        die("manifest write", &e);
    shoal_buf_free(&b);
    manifest_free(m);
}

static void k3_build(const char *dir)
{
    cache_config cfg;
    cache *c = NULL;
    shoal_err e;
    int64_t model;

    cache_config_default(&cfg);
    cfg.max_bytes = 64ull << 20;
    cfg.no_fsync = 1;
    if (cache_open(dir, &cfg, &c, NULL, &e))
        die("open", &e);
    if (cache_model_put(c, EP, K3_REPO, "main", K3_COMMIT, &model, &e))
        die("model put", &e);
    k3_manifest_put(c);
    for (uint32_t l = 1; l < K3_LAYERS; l++)
        for (uint32_t x = 0; x < K3_EXPERTS; x++) {
            uint64_t r = k3_requests(l, x);
            cache_counts n = { r - r / 16, r / 16 - r / 64, r / 64, 0, (r - r / 16) * K3_SPAN, 0 };
            cache_req q = { 0, model, (int32_t)l, (int32_t)x, CACHE_TIER_DISK };
            cache_stats_add_counts(c, &q, &n);
        }
    if (cache_flush(c, &e))
        die("flush", &e);
    cache_close(c);
}

/* ---- tests --------------------------------------------------------------------- */

typedef struct fx {
    char dir[256];
    cache *c;
} fx;

static int fx_setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    tu_tmpdir(f->dir, "report-full");
    k3_build(f->dir);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fx *f = *state;
    cache_close(f->c);
    tu_rm_rf(f->dir);
    free(f);
    return 0;
}

static void fx_open(fx *f, int read_only)
{
    cache_config cfg;
    shoal_err e;
    cache_close(f->c);
    f->c = NULL;
    cache_config_default(&cfg);
    cfg.max_bytes = 64ull << 20;
    cfg.read_only = read_only;
    if (cache_open(f->dir, &cfg, &f->c, NULL, &e))
        fail_msg("open: %s", e.msg);
}

static int64_t ival(const shoal_json *j, const char *path)
{
    int64_t v = -12345;
    shoal_err e;
    if (shoal_json_int(j, path, &v, &e))
        fail_msg("%s", e.msg);
    return v;
}

/* The whole grid, exactly, and the totals it adds up to. */
static void check_grid(const shoal_json *j)
{
    shoal_json *g = shoal_json_get(j, "experts"), *ls = shoal_json_get(j, "layers");
    uint64_t total = 0;

    assert_int_equal(shoal_json_array_size(g), K3_LAYERS - 1);
    assert_int_equal(shoal_json_array_size(ls), K3_LAYERS - 1);
    for (size_t i = 0; i < shoal_json_array_size(g); i++) {
        const shoal_json *row = shoal_json_array_at(g, i);
        shoal_json *rq = shoal_json_get(row, "requests"), *hs = shoal_json_get(row, "hits");
        uint32_t l = (uint32_t)ival(row, "layer");
        uint64_t layer_sum = 0;
        assert_int_equal(l, i + 1);
        assert_int_equal(shoal_json_array_size(rq), K3_EXPERTS);
        assert_int_equal(shoal_json_array_size(hs), K3_EXPERTS);
        for (uint32_t x = 0; x < K3_EXPERTS; x++) {
            uint64_t r = k3_requests(l, x);
            assert_int_equal(shoal_json_int_value(shoal_json_array_at(rq, x)), r);
            assert_int_equal(shoal_json_int_value(shoal_json_array_at(hs, x)), r - r / 16);
            layer_sum += r;
        }
        assert_int_equal(ival(shoal_json_array_at(ls, i), "disk.requests"), layer_sum);
        total += layer_sum;
    }
    assert_int_equal(ival(j, "tiers.disk.requests"), total);
    assert_int_equal(ival(shoal_json_array_at(shoal_json_get(j, "models"), 0),
                          "coverage.experts_total"), (K3_LAYERS - 1) * K3_EXPERTS);
}

/* Both handles give the same full-size document, which is larger than one
 * protocol frame (so the daemon must send it in several). */
static void test_full_size_grid(void **state)
{
    fx *f = *state;
    for (int ro = 1; ro >= 0; ro--) {
        cache_report_opts o = { K3_REPO, CACHE_REPORT_BY_EXPERT, 0, NULL, 0, NULL };
        shoal_buf b;
        shoal_err e;
        shoal_json *j;
        fx_open(f, ro);
        shoal_buf_init(&b, 0);
        if (cache_report_stats(f->c, &o, &b, &e))
            fail_msg("stats: %s", e.msg);
        print_message("full-size stats report (%s): %zu bytes\n", ro ? "reader" : "writer", b.len);
        assert_true(b.len > (1u << 20));
        j = shoal_json_parse((const char *)b.data, b.len, &e);
        assert_non_null(j);
        check_grid(j);
        shoal_json_free(j);
        shoal_buf_free(&b);
    }
}

/* The ranking warm --experts top:N uses: every expert, hottest first, from
 * the writer's table and from the index alike, and live: counts added
 * after the open move an expert up at once. */
static int heat_ref_cmp(const void *a, const void *b)
{
    const cache_heat *x = a, *y = b;
    if (x->requests != y->requests)
        return x->requests > y->requests ? -1 : 1;
    return x->layer != y->layer ? (x->layer < y->layer ? -1 : 1) : (x->expert < y->expert ? -1 : 1);
}

static void test_heat_ranking(void **state)
{
    fx *f = *state;
    size_t total = (K3_LAYERS - 1) * K3_EXPERTS, n = 0, k = 0;
    cache_heat *ref = calloc(total, sizeof *ref), *got = NULL;
    shoal_err e;

    for (uint32_t l = 1; l < K3_LAYERS; l++)
        for (uint32_t x = 0; x < K3_EXPERTS; x++)
            ref[k++] = (cache_heat){ (int32_t)l, (int32_t)x, k3_requests(l, x) };
    qsort(ref, total, sizeof *ref, heat_ref_cmp);
    for (int ro = 1; ro >= 0; ro--) {
        fx_open(f, ro);
        uint64_t t0 = shoal_now_ns();
        if (cache_heat_top(f->c, 1, 0, &got, &n, &e))
            fail_msg("heat: %s", e.msg);
        print_message("ranking %zu experts (%s): %.1f ms\n", n, ro ? "reader, SQLite" : "writer, "
                      "in memory", (double)(shoal_now_ns() - t0) / 1e6);
        assert_int_equal(n, total);
        assert_memory_equal(got, ref, total * sizeof *ref);
        free(got);
        if (cache_heat_top(f->c, 1, 100, &got, &n, &e))
            fail_msg("heat: %s", e.msg);
        assert_int_equal(n, 100);
        assert_memory_equal(got, ref, 100 * sizeof *ref);
        free(got);
    }
    /* live: expert (5, 7) becomes the hottest */
    cache_counts more = { 10000000, 0, 0, 0, 0, 0 };
    cache_req q = { 0, 1, 5, 7, CACHE_TIER_RAM };
    cache_stats_add_counts(f->c, &q, &more);
    if (cache_heat_top(f->c, 1, 1, &got, &n, &e))
        fail_msg("heat: %s", e.msg);
    assert_int_equal(n, 1);
    assert_int_equal(got[0].layer, 5);
    assert_int_equal(got[0].expert, 7);
    assert_int_equal(got[0].requests, k3_requests(5, 7) + 10000000);
    free(got);
    free(ref);
}

/* A plan of all 82,432 experts (none cached) against the fixture's 64 MiB:
 * the first three fit (three 17.5 MB spans beside the 1.6 MB manifest,
 * so nothing is evicted), in the order given; the time is printed. */
static void test_plan_full_size(void **state)
{
    fx *f = *state;
    size_t n = (K3_LAYERS - 1) * K3_EXPERTS, k = 0;
    cache_key *keys = calloc(n, sizeof *keys);
    char (*etags)[80] = calloc(K3_LAYERS, sizeof *etags);
    uint8_t *fate = calloc(n, 1);
    cache_plan p;
    shoal_err e;

    fx_open(f, 0);
    for (uint32_t l = 1; l < K3_LAYERS; l++) {
        snprintf(etags[l], sizeof etags[l], "%064x", l + 1);
        for (uint32_t x = 0; x < K3_EXPERTS; x++)
            keys[k++] = (cache_key){ etags[l], K3_HEAD + x * K3_SPAN, K3_SPAN };
    }
    uint64_t t0 = shoal_now_ns();
    if (cache_plan_make(f->c, keys, NULL, n, 0, 0, &p, fate, &e))
        fail_msg("plan: %s", e.msg);
    print_message("planning %zu experts: %.1f ms\n", n, (double)(shoal_now_ns() - t0) / 1e6);
    assert_int_equal(p.objects, n);
    assert_int_equal(p.cached_objects, 0);
    assert_int_equal(p.pinned, 0);
    assert_int_equal(p.fetch_objects, 3);
    assert_int_equal(p.evict_objects, 0);
    assert_int_equal(p.fetch_objects + p.over_objects, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(fate[i], i < p.fetch_objects ? CACHE_PLAN_FETCH : CACHE_PLAN_OVER);
    free(keys);
    free(etags);
    free(fate);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--populate") == 0) {
        k3_build(argv[2]);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_full_size_grid, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_heat_ranking, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_plan_full_size, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
