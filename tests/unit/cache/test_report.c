/* test_report.c — the reports of cache/report.c, deep.c and maint.c on a
 * cache with a known access pattern: exact counts and hit rates per tier,
 * model, layer, expert and session; coverage from a cached manifest; model
 * specs; whole-file verification; verify, gc, rm and pin.
 *
 * `test_report --populate DIR` only builds that cache in DIR and exits: the
 * CLI's integration tests (tests/integration/test_cli_index.sh) read it.
 *
 * The fixture (all counts below are asserted):
 *   model A org/tiny@main: one shard of 8,512 bytes = spine "embed" [0,512)
 *     + 2 layers x 4 experts of 1,000 bytes; config.json; bad.bin (100
 *     bytes whose etag is the sha256 of other bytes).  Cached: embed,
 *     experts (0,0..3), (1,0), (1,1), config.json, bad.bin, the manifest.
 *   model B org/other@main: one expert (0,0) of its own; it also names
 *     config.json (shared with A).
 *   session 1 (pid 4242): disk hits (0,0)x3 (0,1) (0,2) (1,0)x2; misses
 *     (1,2) (1,3), each then 1,000 bytes in and 2 ms; a join on (1,3), 1 ms.
 *     RAM tier: 30 hits, 11 misses.
 *   session 2 (pid 4243, closed): one disk hit on (0,0).
 *   => disk 8 hits, 2 misses, 1 join; layer 0: 6/6, layer 1: 2/5.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <openssl/evp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache.h"
#include "common/json.h"
#include "common/manifest.h"
#include "tests/unit/cache/cache_testutil.h"

#define EP      "http://127.0.0.1:1"
#define COMMIT  "c0ffee0000000000000000000000000000000001"
#define COMMITB "beef000000000000000000000000000000000002"
#define SHARD   "model-00001-of-00001.safetensors"
#define SPAN    1000u
#define SHARD_SIZE (512u + 8u * SPAN)

static const char config_text[] = "{\"num_hidden_layers\": 2, \"num_experts\": 4}\n";

static void die(const char *what, const shoal_err *e)
{
    fprintf(stderr, "fixture: %s: %s\n", what, e ? e->msg : "");
    abort();
}

static void shard_bytes(uint8_t *p)
{
    for (uint32_t i = 0; i < SHARD_SIZE; i++)
        p[i] = (uint8_t)(i * 7u + 3u);
}

static void hex_digest(const EVP_MD *md, const void *head, size_t hn, const void *p, size_t n,
                       char *out)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    EVP_MD_CTX *x = EVP_MD_CTX_new();
    EVP_DigestInit_ex(x, md, NULL);
    if (hn)
        EVP_DigestUpdate(x, head, hn);
    EVP_DigestUpdate(x, p, n);
    EVP_DigestFinal_ex(x, d, &dn);
    EVP_MD_CTX_free(x);
    for (unsigned i = 0; i < dn; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

typedef struct fixture_names {
    char shard_etag[80], config_etag[80], bad_etag[80];
} fixture_names;

static fixture_names fxn;

static void put_object(cache *c, const char *etag, uint64_t off, const uint8_t *p, uint64_t len,
                       cache_kind kind, const cache_names *names)
{
    cache_writer *w = NULL;
    shoal_err e;
    cache_key k = { etag, off, len };
    if (cache_write_begin(c, &k, kind, names, &w, &e) != 0 ||
        cache_write_append(w, p, (size_t)len, &e) != 0 || cache_write_commit(w, NULL, &e) != 0)
        die("write", &e);
}

static void put_file(cache *c, const char *repo, const char *commit, const char *path,
                     const char *etag, uint64_t size)
{
    cache_file f;
    shoal_err e;
    memset(&f, 0, sizeof f);
    snprintf(f.endpoint, sizeof f.endpoint, "%s", EP);
    snprintf(f.repo, sizeof f.repo, "%s", repo);
    snprintf(f.commit, sizeof f.commit, "%s", commit);
    snprintf(f.path, sizeof f.path, "%s", path);
    snprintf(f.etag, sizeof f.etag, "%s", etag);
    f.size = size;
    if (cache_file_put(c, &f, &e) != 0)
        die("file put", &e);
}

static void put_expert(cache *c, const uint8_t *shard, int layer, int expert)
{
    cache_names n = { EP, "org/tiny", "main", COMMIT, SHARD, NULL, layer, expert };
    uint64_t off = 512u + (uint64_t)(layer * 4 + expert) * SPAN;
    put_object(c, fxn.shard_etag, off, shard + off, SPAN, CACHE_KIND_EXPERT, &n);
}

static void put_manifest(cache *c)
{
    manifest *m = manifest_new();
    manifest_tensor t;
    shoal_buf b;
    shoal_err e;
    uint32_t fi;
    cache_names n = { EP, "org/tiny", "main", COMMIT, CACHE_MANIFEST_FILE, NULL, -1, -1 };

    memset(&t, 0, sizeof t);
    t.name = "embed";
    t.offset = 0;
    t.length = 512;
    snprintf(t.dtype, sizeof t.dtype, "BF16");
    t.ndim = 2;
    t.shape[0] = 16;
    t.shape[1] = 16;
    t.is_spine = 1;
    shoal_buf_init(&b, 0);
    if (manifest_set_model(m, EP, "org/tiny", "main", COMMIT, &e) ||
        manifest_set_config(m, config_text, sizeof config_text - 1, &e) ||
        manifest_file_add(m, SHARD, fxn.shard_etag, SHARD_SIZE, &fi, &e) ||
        manifest_file_add(m, "config.json", fxn.config_etag, sizeof config_text - 1, NULL, &e))
        die("manifest", &e);
    t.file = fi;
    m->n_layers = 2;
    m->experts_per_layer = 4;
    m->expert_bytes = SPAN;
    if (manifest_tensor_add(m, &t, &e))
        die("manifest tensor", &e);
    for (uint32_t l = 0; l < 2; l++)
        for (uint32_t x = 0; x < 4; x++)
            if (manifest_expert_add(m, l, x, fi, 512u + (l * 4 + x) * SPAN, &e))
                die("manifest expert", &e);
    if (manifest_finish(m, &e) || manifest_encode(m, &b, &e))
        die("manifest encode", &e);
    put_object(c, "manifest-v1:test", 0, b.data, b.len, CACHE_KIND_DERIVED, &n);
    cache_key k = { "manifest-v1:test", 0, b.len };
    if (cache_pin(c, &k, 1, &e))
        die("pin manifest", &e);
    shoal_buf_free(&b);
    manifest_free(m);
}

static void lookup(cache *c, uint64_t session, int64_t model, int layer, int expert, int n)
{
    cache_req r = { session, model, layer, expert, CACHE_TIER_DISK };
    cache_key k = { fxn.shard_etag, 512u + (uint64_t)(layer * 4 + expert) * SPAN, SPAN };
    cache_obj o;
    for (int i = 0; i < n; i++)
        if (cache_lookup(c, &k, &r, &o, NULL) == 0)
            close(o.fd);
}

/* Build the fixture cache in dir (which must be empty or absent). */
static void fixture_build(const char *dir)
{
    static uint8_t shard[SHARD_SIZE];
    cache_config cfg;
    cache *c = NULL;
    shoal_err e;
    int64_t ma, mb;
    uint64_t s1, s2;
    char head[32];
    uint8_t badbytes[100], other[SPAN];

    shard_bytes(shard);
    hex_digest(EVP_sha256(), NULL, 0, shard, SHARD_SIZE, fxn.shard_etag);
    int hn = snprintf(head, sizeof head, "blob %zu", sizeof config_text - 1);
    hex_digest(EVP_sha1(), head, (size_t)hn + 1, config_text, sizeof config_text - 1,
               fxn.config_etag);
    hex_digest(EVP_sha256(), NULL, 0, "other bytes", 11, fxn.bad_etag);
    memset(badbytes, 0x5a, sizeof badbytes);
    memset(other, 0x11, sizeof other);

    cache_config_default(&cfg);
    cfg.max_bytes = 64ull << 20;
    cfg.no_fsync = 1;
    if (cache_open(dir, &cfg, &c, NULL, &e))
        die("open", &e);
    if (cache_model_put(c, EP, "org/tiny", "main", COMMIT, &ma, &e) ||
        cache_model_put(c, EP, "org/other", "main", COMMITB, &mb, &e))
        die("model put", &e);
    put_file(c, "org/tiny", COMMIT, SHARD, fxn.shard_etag, SHARD_SIZE);
    put_file(c, "org/tiny", COMMIT, "config.json", fxn.config_etag, sizeof config_text - 1);
    put_file(c, "org/tiny", COMMIT, "bad.bin", fxn.bad_etag, sizeof badbytes);

    cache_names sp = { EP, "org/tiny", "main", COMMIT, SHARD, "embed", -1, -1 };
    put_object(c, fxn.shard_etag, 0, shard, 512, CACHE_KIND_SPINE, &sp);
    for (int x = 0; x < 4; x++)
        put_expert(c, shard, 0, x);
    put_expert(c, shard, 1, 0);
    put_expert(c, shard, 1, 1);
    cache_names cf = { EP, "org/tiny", "main", COMMIT, "config.json", NULL, -1, -1 };
    put_object(c, fxn.config_etag, 0, (const uint8_t *)config_text, sizeof config_text - 1,
               CACHE_KIND_SMALL, &cf);
    cache_names cfb = { EP, "org/other", "main", COMMITB, "config.json", NULL, -1, -1 };
    cache_key ck = { fxn.config_etag, 0, sizeof config_text - 1 };
    if (cache_names_add(c, &ck, &cfb, &e))
        die("names add", &e);
    cache_names bb = { EP, "org/tiny", "main", COMMIT, "bad.bin", NULL, -1, -1 };
    put_object(c, fxn.bad_etag, 0, badbytes, sizeof badbytes, CACHE_KIND_SMALL, &bb);
    cache_names ob = { EP, "org/other", "main", COMMITB, SHARD, NULL, 0, 0 };
    put_object(c, "other-etag", 512, other, SPAN, CACHE_KIND_EXPERT, &ob);
    put_manifest(c);

    if (cache_session_open(c, 4242, "shoal-engine", &s1, &e) ||
        cache_session_open(c, 4243, "shoal-engine", &s2, &e))
        die("session", &e);
    lookup(c, s1, ma, 0, 0, 3);
    lookup(c, s1, ma, 0, 1, 1);
    lookup(c, s1, ma, 0, 2, 1);
    lookup(c, s1, ma, 1, 0, 2);
    lookup(c, s1, ma, 1, 2, 1);   /* misses: not cached */
    lookup(c, s1, ma, 1, 3, 1);
    for (int x = 2; x < 4; x++) {
        cache_req r = { s1, ma, 1, x, CACHE_TIER_DISK };
        cache_stats_add(c, &r, CACHE_NONE, SPAN, 0, 2000000);
    }
    cache_req rj = { s1, ma, 1, 3, CACHE_TIER_DISK };
    cache_stats_add(c, &rj, CACHE_JOIN, 0, 0, 1000000);
    cache_req rr = { s1, ma, -1, -1, CACHE_TIER_RAM };
    for (int i = 0; i < 30; i++)
        cache_stats_add(c, &rr, CACHE_HIT, 0, SPAN, 0);
    for (int i = 0; i < 11; i++)
        cache_stats_add(c, &rr, CACHE_MISS, 0, 0, 0);
    lookup(c, s2, ma, 0, 0, 1);
    if (cache_session_close(c, s2, &e) || cache_flush(c, &e))
        die("session close", &e);
    cache_close(c);
}

/* ---- helpers ------------------------------------------------------------------ */

typedef struct fx {
    char dir[256];
    cache *c;
} fx;

static int fx_setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    tu_tmpdir(f->dir, "report");
    fixture_build(f->dir);
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
    cfg.no_fsync = 1;
    cfg.read_only = read_only;
    if (cache_open(f->dir, &cfg, &f->c, NULL, &e))
        fail_msg("open: %s", e.msg);
}

static shoal_json *stats(fx *f, const char *model, cache_report_by by)
{
    cache_report_opts o = { model, by, 0, NULL, 0, NULL };
    shoal_buf b;
    shoal_err e;
    shoal_json *j;
    shoal_buf_init(&b, 0);
    if (cache_report_stats(f->c, &o, &b, &e))
        fail_msg("stats: %s", e.msg);
    j = shoal_json_parse((const char *)b.data, b.len, &e);
    shoal_buf_free(&b);
    assert_non_null(j);
    return j;
}

static int64_t ival(const shoal_json *j, const char *path)
{
    int64_t v = -12345;
    shoal_err e;
    if (shoal_json_int(j, path, &v, &e))
        fail_msg("%s", e.msg);
    return v;
}

static double nval(const shoal_json *j, const char *path)
{
    double v = -1;
    shoal_err e;
    if (shoal_json_num(j, path, &v, &e))
        fail_msg("%s", e.msg);
    return v;
}

/* The row of `arr` with model m and layer l. */
static shoal_json *layer_row(const shoal_json *arr, int64_t m, int64_t l)
{
    for (size_t i = 0; i < shoal_json_array_size(arr); i++) {
        shoal_json *r = shoal_json_array_at(arr, i);
        if (ival(r, "model") == m && ival(r, "layer") == l)
            return r;
    }
    fail_msg("no row for model %" PRId64 " layer %" PRId64, m, l);
    return NULL;
}

/* ---- tests --------------------------------------------------------------------- */

static void check_totals(const shoal_json *j)
{
    assert_int_equal(ival(j, "version"), 1);
    assert_int_equal(ival(j, "tiers.disk.hits"), 8);
    assert_int_equal(ival(j, "tiers.disk.misses"), 2);
    assert_int_equal(ival(j, "tiers.disk.joins"), 1);
    assert_int_equal(ival(j, "tiers.disk.requests"), 11);
    assert_true(fabs(nval(j, "tiers.disk.hit_rate") - 8.0 / 11.0) < 1e-12);
    assert_int_equal(ival(j, "tiers.disk.bytes_out"), 8 * SPAN);
    assert_int_equal(ival(j, "tiers.disk.bytes_in"), 2 * SPAN);
    assert_true(fabs(nval(j, "tiers.disk.wait_ms") - 5.0) < 1e-9);
    assert_int_equal(ival(j, "tiers.ram.hits"), 30);
    assert_int_equal(ival(j, "tiers.ram.misses"), 11);
    assert_int_equal(ival(j, "tiers.upstream.fetches"), 2);
    assert_int_equal(ival(j, "tiers.upstream.joins"), 1);
    assert_true(fabs(nval(j, "tiers.upstream.rate_bytes_per_s") - 2000.0 / 0.005) < 1e-6);
    assert_int_equal(ival(j, "served.requests"), 41);
    assert_int_equal(ival(j, "served.ram"), 30);
    assert_int_equal(ival(j, "served.disk"), 8);
    assert_int_equal(ival(j, "served.upstream"), 3);
    assert_true(fabs(nval(j, "served.hit_rate") - 38.0 / 41.0) < 1e-12);
    assert_int_equal(ival(j, "bytes.fetched"), 2 * SPAN);
    assert_int_equal(ival(j, "bytes.served"), 8 * SPAN + 30 * SPAN);
}

static void test_stats_read_only(void **state)
{
    fx *f = *state;
    fx_open(f, 1);
    shoal_json *j = stats(f, NULL, CACHE_REPORT_BY_NONE);
    const char *s = NULL;
    assert_int_equal(shoal_json_str(j, "schema", &s, NULL), 0);
    assert_string_equal(s, "shoal.stats");
    assert_int_equal(shoal_json_str(j, "source", &s, NULL), 0);
    assert_string_equal(s, "index");
    check_totals(j);
    /* A reader does not know the daemon's budget. */
    assert_int_equal(shoal_json_typeof(shoal_json_path(j, "disk.budget")), SHOAL_JSON_NULL);
    assert_int_equal(ival(j, "disk.objects"), 11);
    assert_int_equal(shoal_json_typeof(shoal_json_path(j, "daemon")), SHOAL_JSON_NULL);

    shoal_json *layers = shoal_json_get(j, "layers");
    assert_int_equal(shoal_json_array_size(layers), 2);
    shoal_json *l0 = layer_row(layers, 1, 0), *l1 = layer_row(layers, 1, 1);
    assert_int_equal(ival(l0, "disk.hits"), 6);
    assert_true(fabs(nval(l0, "disk.hit_rate") - 1.0) < 1e-12);
    assert_int_equal(ival(l1, "disk.hits"), 2);
    assert_int_equal(ival(l1, "disk.misses"), 2);
    assert_int_equal(ival(l1, "disk.joins"), 1);
    assert_true(fabs(nval(l1, "disk.hit_rate") - 0.4) < 1e-12);

    shoal_json *models = shoal_json_get(j, "models");
    assert_int_equal(shoal_json_array_size(models), 2);
    shoal_json *a = shoal_json_array_at(models, 0);
    assert_int_equal(shoal_json_str(a, "repo", &s, NULL), 0);
    assert_string_equal(s, "org/tiny");
    assert_int_equal(ival(a, "disk.hits"), 8);
    assert_int_equal(ival(a, "ram.hits"), 30);
    assert_int_equal(ival(a, "coverage.experts_cached"), 6);
    assert_int_equal(ival(a, "coverage.experts_total"), 8);
    assert_int_equal(ival(a, "coverage.spine_cached"), 1);
    int b = 0;
    assert_int_equal(shoal_json_bool(a, "coverage.spine_complete", &b, NULL), 0);
    assert_true(b);
    assert_int_equal(ival(a, "bytes_by_kind.expert"), 6 * SPAN);
    assert_int_equal(shoal_json_typeof(shoal_json_path(shoal_json_array_at(models, 1),
                                                       "coverage")), SHOAL_JSON_NULL);

    shoal_json *ss = shoal_json_get(j, "sessions");
    assert_int_equal(shoal_json_array_size(ss), 2);
    assert_int_equal(ival(j, "sessions_total"), 2);
    /* Newest first. */
    assert_int_equal(ival(shoal_json_array_at(ss, 0), "pid"), 4243);
    assert_true(ival(shoal_json_array_at(ss, 0), "ended_ms") > 0);
    assert_int_equal(ival(shoal_json_array_at(ss, 0), "disk.hits"), 1);
    assert_int_equal(ival(shoal_json_array_at(ss, 1), "disk.hits"), 7);
    assert_int_equal(ival(shoal_json_array_at(ss, 1), "ram.hits"), 30);
    assert_int_equal(ival(shoal_json_array_at(ss, 1), "ended_ms"), 0);
    assert_null(shoal_json_get(j, "experts"));
    shoal_json_free(j);
}

static void test_stats_writer_same_figures(void **state)
{
    fx *f = *state;
    fx_open(f, 0);
    shoal_json *j = stats(f, NULL, CACHE_REPORT_BY_LAYER);
    check_totals(j);
    assert_int_equal(ival(j, "disk.budget"), 64ll << 20);
    shoal_json_free(j);
}

static void test_stats_by_expert_grid(void **state)
{
    fx *f = *state;
    static const int64_t req0[] = { 4, 1, 1 }, hit0[] = { 4, 1, 1 };
    static const int64_t req1[] = { 2, 0, 1, 2 }, hit1[] = { 2, 0, 0, 0 };
    fx_open(f, 1);
    shoal_json *j = stats(f, NULL, CACHE_REPORT_BY_EXPERT);
    shoal_json *g = shoal_json_get(j, "experts");
    assert_int_equal(shoal_json_array_size(g), 2);
    shoal_json *g0 = layer_row(g, 1, 0), *g1 = layer_row(g, 1, 1);
    shoal_json *r0 = shoal_json_get(g0, "requests"), *h0 = shoal_json_get(g0, "hits");
    shoal_json *r1 = shoal_json_get(g1, "requests"), *h1 = shoal_json_get(g1, "hits");
    assert_int_equal(shoal_json_array_size(r0), 3);
    assert_int_equal(shoal_json_array_size(r1), 4);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(shoal_json_int_value(shoal_json_array_at(r0, i)), req0[i]);
        assert_int_equal(shoal_json_int_value(shoal_json_array_at(h0, i)), hit0[i]);
    }
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(shoal_json_int_value(shoal_json_array_at(r1, i)), req1[i]);
        assert_int_equal(shoal_json_int_value(shoal_json_array_at(h1, i)), hit1[i]);
    }
    shoal_json_free(j);
}

static void test_stats_model_filter(void **state)
{
    fx *f = *state;
    cache_report_opts o = { "org/nothing", CACHE_REPORT_BY_NONE, 0, NULL, 0, NULL };
    shoal_buf b;
    shoal_err e;
    fx_open(f, 1);
    shoal_json *j = stats(f, "hf://org/tiny@main", CACHE_REPORT_BY_NONE);
    check_totals(j);
    assert_int_equal(shoal_json_array_size(shoal_json_get(j, "models")), 1);
    shoal_json_free(j);
    j = stats(f, "org/other", CACHE_REPORT_BY_NONE);
    assert_int_equal(ival(j, "tiers.disk.requests"), 0);
    assert_int_equal(shoal_json_array_size(shoal_json_get(j, "layers")), 0);
    shoal_json_free(j);
    shoal_buf_init(&b, 0);
    assert_int_equal(cache_report_stats(f->c, &o, &b, &e), SHOAL_ENOTFOUND);
    assert_non_null(strstr(e.msg, "org/nothing"));
    shoal_buf_free(&b);
}

static void test_model_matches(void **state)
{
    (void)state;
    cache_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.repo, sizeof m.repo, "org/tiny");
    snprintf(m.revision, sizeof m.revision, "main");
    snprintf(m.commit, sizeof m.commit, "abc123");
    assert_true(cache_model_matches(&m, NULL));
    assert_true(cache_model_matches(&m, "org/tiny"));
    assert_true(cache_model_matches(&m, "hf://org/tiny"));
    assert_true(cache_model_matches(&m, "hf://org/tiny@main"));
    assert_true(cache_model_matches(&m, "org/tiny@abc123"));
    assert_false(cache_model_matches(&m, "org/tiny@dev"));
    assert_false(cache_model_matches(&m, "org/tin"));
    assert_false(cache_model_matches(&m, "org/tinyx"));
    snprintf(m.repo, sizeof m.repo, "/data/models/tiny");
    assert_true(cache_model_matches(&m, "/data/models/tiny/"));
    assert_true(cache_model_matches(&m, "file:///data/models/tiny"));
    assert_false(cache_model_matches(&m, "/data/models"));
}

static void test_models_report_and_manifest(void **state)
{
    fx *f = *state;
    shoal_buf b;
    shoal_err e;
    manifest *m = NULL;
    fx_open(f, 1);
    shoal_buf_init(&b, 0);
    assert_int_equal(cache_report_models(f->c, "org/tiny", &b, &e), 0);
    shoal_json *j = shoal_json_parse((const char *)b.data, b.len, &e);
    assert_non_null(j);
    assert_int_equal(shoal_json_array_size(shoal_json_get(j, "models")), 1);
    shoal_json *a = shoal_json_array_at(shoal_json_get(j, "models"), 0);
    assert_int_equal(ival(a, "coverage.layers"), 2);
    assert_int_equal(ival(a, "coverage.experts_per_layer"), 4);
    assert_int_equal(ival(a, "coverage.spine_bytes"), 512);
    assert_int_equal(ival(a, "objects"), 11 - 1 - 0);   /* all but B's own expert */
    shoal_json_free(j);
    shoal_buf_reset(&b);
    assert_int_equal(cache_model_manifest(f->c, "org/tiny", &b, &e), 0);
    assert_int_equal(manifest_decode(b.data, b.len, &m, &e), 0);
    assert_int_equal(m->config_len, sizeof config_text - 1);
    assert_memory_equal(m->config, config_text, m->config_len);
    manifest_free(m);
    shoal_buf_reset(&b);
    assert_int_equal(cache_model_manifest(f->c, "org/other", &b, &e), SHOAL_ENOTFOUND);
    shoal_buf_free(&b);
}

static void test_deep_verify(void **state)
{
    fx *f = *state;
    cache_deep_report r;
    shoal_buf bad;
    shoal_err e;
    static uint8_t shard[SHARD_SIZE];

    fx_open(f, 1);
    shoal_buf_init(&bad, 0);
    assert_int_equal(cache_verify_deep(f->c, "org/tiny", NULL, &r, &bad, &e), 0);
    assert_int_equal(r.files, 3);
    assert_int_equal(r.complete, 2);           /* config.json, bad.bin */
    assert_int_equal(r.ok, 1);
    assert_int_equal(r.bad, 1);
    assert_string_equal((const char *)bad.data, "bad.bin\n");
    /* Cache the two missing experts: now the shard is whole and hashes. */
    fx_open(f, 0);
    shard_bytes(shard);
    put_expert(f->c, shard, 1, 2);
    put_expert(f->c, shard, 1, 3);
    shoal_buf_reset(&bad);
    assert_int_equal(cache_verify_deep(f->c, NULL, NULL, &r, &bad, &e), 0);
    assert_int_equal(r.complete, 3);
    assert_int_equal(r.ok, 2);
    assert_int_equal(r.bad, 1);
    assert_true(r.bytes >= SHARD_SIZE);
    shoal_buf_free(&bad);
}

static void on_commit_count(void *ctx, const char *etag, int kind, uint64_t off, uint64_t len)
{
    (void)etag;
    (void)kind;
    (void)off;
    (void)len;
    (*(int *)ctx)++;
}

/* shoald's automatic checks: a complete file that matches is marked
 * verified (and then skipped), one that does not is quarantined (its
 * objects removed, the failure recorded and listed by verify --deep), an
 * incomplete one is left alone; the integrity figures add up. */
static void test_file_checks(void **state)
{
    fx *f = *state;
    cache_file_check r;
    cache_integrity g, g0;
    cache_deep_report dr;
    shoal_buf bad;
    shoal_err e;
    uint64_t failures = 0, bytes = 0;
    int commits = 0;
    static uint8_t shard[SHARD_SIZE];

    fx_open(f, 0);
    assert_int_equal(cache_integrity_get(f->c, &g0, &e), 0);
    assert_int_equal(g0.verified_bytes, 0);
    assert_true(g0.trusted_bytes > 0);
    assert_int_equal(cache_file_check_run(f->c, fxn.config_etag, NULL, NULL, &r, &e), 0);
    assert_true(r.known && r.complete && r.hashable && !r.already);
    assert_int_equal(r.result, 1);
    assert_int_equal(r.objs.n, 1);
    assert_string_equal(r.path, "config.json");
    assert_int_equal(cache_file_verified(f->c, fxn.config_etag, &r.objs, &e), 0);
    cache_verify_list_free(&r.objs);
    assert_int_equal(cache_file_check_run(f->c, fxn.config_etag, NULL, NULL, &r, &e), 0);
    assert_true(r.already && r.result == -1);
    cache_verify_list_free(&r.objs);

    assert_int_equal(cache_file_check_run(f->c, fxn.shard_etag, NULL, NULL, &r, &e), 0);
    assert_true(r.known && !r.complete && r.result == -1);   /* two experts missing */
    cache_verify_list_free(&r.objs);

    assert_int_equal(cache_file_check_run(f->c, fxn.bad_etag, NULL, NULL, &r, &e), 0);
    assert_true(r.complete && r.result == 0);
    assert_int_equal(r.objs.n, 1);
    assert_int_equal(cache_file_quarantine(f->c, fxn.bad_etag, r.path, r.size, &r.objs, &failures,
                                           &bytes, &e), 0);
    cache_verify_list_free(&r.objs);
    assert_int_equal(failures, 1);
    assert_int_equal(bytes, 100);
    cache_key bk = { fxn.bad_etag, 0, 100 };
    assert_int_equal(cache_remove(f->c, &bk, &e), SHOAL_ENOTFOUND);   /* not served any more */

    assert_int_equal(cache_integrity_get(f->c, &g, &e), 0);
    assert_int_equal(g.verified_bytes, sizeof config_text - 1);
    assert_int_equal(g.verified_objects, 1);
    assert_int_equal(g.trusted_bytes, g0.trusted_bytes - (sizeof config_text - 1) - 100);
    assert_int_equal(g.bad_files, 1);
    assert_int_equal(g.failures, 1);
    assert_int_equal(g.quarantined_bytes, 100);

    shoal_buf_init(&bad, 0);
    assert_int_equal(cache_verify_deep(f->c, "org/tiny", NULL, &dr, &bad, &e), 0);
    assert_int_equal(dr.quarantined, 1);
    assert_int_equal(dr.bad, 0);
    assert_string_equal((const char *)bad.data, "bad.bin (quarantined)\n");
    shoal_buf_free(&bad);

    /* The commit hook hears of every commit; the shard, once whole, checks ok. */
    cache_set_commit_hook(f->c, on_commit_count, &commits);
    shard_bytes(shard);
    put_expert(f->c, shard, 1, 2);
    put_expert(f->c, shard, 1, 3);
    assert_int_equal(commits, 2);
    cache_set_commit_hook(f->c, NULL, NULL);
    assert_int_equal(cache_file_check_run(f->c, fxn.shard_etag, NULL, NULL, &r, &e), 0);
    assert_int_equal(r.result, 1);
    assert_int_equal(r.bytes, SHARD_SIZE);
    cache_verify_list_free(&r.objs);
}

static void test_verify_finds_corrupt_blob(void **state)
{
    fx *f = *state;
    shoal_buf b;
    shoal_err e;
    char path[600];
    int fd;

    /* Blob ids are given in write order: 1 is the spine tensor "embed". */
    snprintf(path, sizeof path, "%s/blobs/%016x", f->dir, 1);
    fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "XXXX", 4, 10), 4);
    close(fd);
    fx_open(f, 0);
    shoal_buf_init(&b, 0);
    assert_int_equal(cache_report_verify(f->c, "org/tiny", 0, &b, &e), 0);
    shoal_json *j = shoal_json_parse((const char *)b.data, b.len, &e);
    assert_non_null(j);
    assert_int_equal(ival(j, "bad"), 1);
    assert_int_equal(ival(j, "checked"), 10);
    shoal_json_free(j);
    shoal_buf_reset(&b);
    assert_int_equal(cache_report_verify(f->c, NULL, 1, &b, &e), 0);
    j = shoal_json_parse((const char *)b.data, b.len, &e);
    assert_int_equal(ival(j, "bad"), 0);
    assert_int_equal(ival(j, "deep.bad"), 1);
    shoal_json_free(j);
    shoal_buf_free(&b);
}

static void test_gc_rm_pin(void **state)
{
    fx *f = *state;
    shoal_buf b;
    shoal_err e;
    cache_usage u;
    uint64_t changed = 0;

    fx_open(f, 0);
    shoal_buf_init(&b, 0);
    /* Pin layer 0's four experts: gc must keep them. */
    assert_int_equal(cache_model_pin(f->c, "org/tiny", 1, 0, 0, &changed, &e), 0);
    assert_int_equal(changed, 4);
    assert_int_equal(cache_report_gc(f->c, 1, &b, &e), 0);
    shoal_json *j = shoal_json_parse((const char *)b.data, b.len, &e);
    assert_non_null(j);
    assert_int_equal(ival(j, "freed"), 3 * SPAN);   /* (1,0) (1,1), B's expert */
    assert_int_equal(ival(j, "objects_evicted"), 3);
    shoal_json_free(j);
    assert_int_equal(cache_usage_get(f->c, &u, &e), 0);
    assert_int_equal(u.objects, 8);
    /* Unpinned, a gc to 6,000 bytes reaches it. */
    assert_int_equal(cache_model_pin(f->c, "org/tiny", 0, 0, 0, &changed, &e), 0);
    shoal_buf_reset(&b);
    assert_int_equal(cache_report_gc(f->c, 6000, &b, &e), 0);
    assert_int_equal(cache_usage_get(f->c, &u, &e), 0);
    assert_true(u.used <= 6000);

    /* rm B: its own objects go (already evicted here), config.json stays
     * for A; the model row goes. */
    shoal_buf_reset(&b);
    assert_int_equal(cache_report_rm(f->c, "org/other", &b, &e), 0);
    j = shoal_json_parse((const char *)b.data, b.len, &e);
    assert_int_equal(ival(j, "objects_kept_shared"), 1);
    shoal_json_free(j);
    uint64_t before = u.used;
    shoal_buf_reset(&b);
    assert_int_equal(cache_report_rm(f->c, "org/tiny", &b, &e), 0);
    j = shoal_json_parse((const char *)b.data, b.len, &e);
    assert_int_equal(ival(j, "bytes_freed"), (int64_t)before);
    shoal_json_free(j);
    assert_int_equal(cache_usage_get(f->c, &u, &e), 0);
    assert_int_equal(u.used, 0);
    assert_int_equal(u.objects, 0);
    shoal_buf_reset(&b);
    assert_int_equal(cache_report_rm(f->c, "org/tiny", &b, &e), SHOAL_ENOTFOUND);
    assert_int_equal(cache_report_models(f->c, NULL, &b, &e), 0);
    shoal_buf_free(&b);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--populate") == 0) {
        fixture_build(argv[2]);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_matches),
        cmocka_unit_test_setup_teardown(test_stats_read_only, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_stats_writer_same_figures, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_stats_by_expert_grid, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_stats_model_filter, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_models_report_and_manifest, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_deep_verify, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_file_checks, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_verify_finds_corrupt_blob, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_gc_rm_pin, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
