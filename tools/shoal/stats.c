/* stats.c — `shoal stats`: hit rates per tier, model, layer, expert and
 * session, live from shoald or from the index when no daemon runs.
 *
 * Owns: fetching the report (docs/stats-json.md) either way and printing
 * it for people in the spirit of `ccache -s`.  The report itself is built
 * by cache/report.c for both paths, so they cannot disagree.
 */
#include "tools/shoal/shoal_int.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- JSON reading with defaults --------------------------------------------------- */

int64_t jint(const shoal_json *j, const char *path, int64_t def)
{
    shoal_json *v = j ? shoal_json_path(j, path) : NULL;
    shoal_json_type t = v ? shoal_json_typeof(v) : SHOAL_JSON_NULL;
    if (t == SHOAL_JSON_INT)
        return shoal_json_int_value(v);
    if (t == SHOAL_JSON_REAL)
        return (int64_t)shoal_json_num_value(v);
    return def;
}

double jnum(const shoal_json *j, const char *path, double def)
{
    shoal_json *v = j ? shoal_json_path(j, path) : NULL;
    shoal_json_type t = v ? shoal_json_typeof(v) : SHOAL_JSON_NULL;
    return t == SHOAL_JSON_INT || t == SHOAL_JSON_REAL ? shoal_json_num_value(v) : def;
}

const char *jstr(const shoal_json *j, const char *path, const char *def)
{
    shoal_json *v = j ? shoal_json_path(j, path) : NULL;
    return v && shoal_json_typeof(v) == SHOAL_JSON_STRING ? shoal_json_str_value(v) : def;
}

int jnull(const shoal_json *j, const char *path)
{
    shoal_json *v = j ? shoal_json_path(j, path) : NULL;
    return !v || shoal_json_typeof(v) == SHOAL_JSON_NULL;
}

void stats_model_name(const shoal_json *m, char *out, size_t cap)
{
    const char *rev = jstr(m, "revision", "");
    snprintf(out, cap, "%s%s%s", jstr(m, "repo", "?"), *rev && strcmp(rev, "local") ? "@" : "",
             strcmp(rev, "local") ? rev : "");
}

/* ---- fetching ------------------------------------------------------------------------ */

static const char *const by_names[] = { "none", "layer", "expert", "session" };

/* Ask shoald for STATS with `query`.  *out is its answer (caller frees). */
static int ask_daemon(shoal_client *c, const char *query, shoal_json **out, shoal_err *err)
{
    shoal_buf ans;
    int rc;
    *out = NULL;
    shoal_buf_init(&ans, 0);
    rc = shoal_client_stats(c, query, &ans, err);
    if (rc == 0 && !(*out = shoal_json_parse((const char *)ans.data, ans.len, err)))
        rc = shoal_err_wrap(err, SHOAL_EPROTO, "shoald's STATS reply");
    shoal_buf_free(&ans);
    return rc;
}

static int from_index(const shoal_cli *cli, const char *spec, cache_report_by by,
                      const char *source, shoal_json **out, shoal_err *err)
{
    cache *c = NULL;
    shoal_buf b;
    cache_report_opts o = { spec, by, 10, source, 0, NULL };
    int rc = cli_cache_reader(cli, &c, err);

    *out = NULL;
    shoal_buf_init(&b, 0);
    if (rc == 0)
        rc = cache_report_stats(c, &o, &b, err);
    cache_close(c);
    if (rc == 0 && !(*out = shoal_json_parse((const char *)b.data, b.len, err)))
        rc = SHOAL_EFORMAT;
    shoal_buf_free(&b);
    return rc;
}

/* The query as JSON text: {"model": spec or null, "by": ...}. */
static int query_text(const char *spec, cache_report_by by, shoal_buf *qb, shoal_err *err)
{
    shoal_json *q = shoal_json_object();
    int rc;
    if (!q)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    shoal_json_set_take(q, "model", spec ? shoal_json_new_str(spec) : shoal_json_new_null());
    shoal_json_set_str(q, "by", by_names[by]);
    rc = shoal_json_dump(q, SHOAL_JSON_COMPACT, qb);
    shoal_json_free(q);
    return rc ? shoal_err_set(err, rc, "out of memory") : 0;
}

/* Ask shoald on c; a reply that is not "shoal.stats" v1 is refused (the
 * two programs come from different builds), never replaced by the index. */
static int ask_stats(shoal_client *c, const char *query, shoal_json **out, shoal_err *err)
{
    int rc = ask_daemon(c, query, out, err);
    if (rc == 0 && (strcmp(jstr(*out, "schema", ""), "shoal.stats") != 0 ||
                    jint(*out, "version", 0) != 1)) {
        rc = shoal_err_set(err, SHOAL_EUNSUPPORTED, "shoald answered STATS with schema '%s' "
                           "version %lld; this shoal reads shoal.stats version 1: run shoal and "
                           "shoald of the same build", jstr(*out, "schema", "?"),
                           (long long)jint(*out, "version", 0));
        shoal_json_free(*out);
        *out = NULL;
    }
    return rc;
}

/* The report: from shoald when it runs (its reply may come in several
 * frames: the client assembles them), from the index only when nothing
 * listens on the socket — *live says which, and every caller says so in
 * its output.  A daemon that runs but fails is an error, not a reason to
 * read the index instead.  With `keep` (may be NULL) a connection is
 * reused across calls (--watch: one session, not one per redraw); *keep
 * is NULL while none is open, and a kept connection that died (shoald
 * stopped or restarted) is replaced once. */
static int fetch_on(const shoal_cli *cli, shoal_client **keep, const char *spec,
                    cache_report_by by, shoal_json **out, int *live, shoal_err *err)
{
    shoal_client *c = keep ? *keep : NULL;
    shoal_buf qb;
    int rc, fresh = c == NULL;

    *out = NULL;
    *live = 0;
    shoal_buf_init(&qb, 0);
    if ((rc = query_text(spec, by, &qb, err)) != 0)
        goto done;
    for (;;) {
        if (!c && (rc = cli_connect(cli, &c, err)) != 0)
            break;
        rc = ask_stats(c, (const char *)qb.data, out, err);
        if (rc != SHOAL_ENET || fresh)
            break;
        shoal_client_close(c);      /* a kept connection died: try a new one */
        c = NULL;
        fresh = 1;
        shoal_err_clear(err);
    }
    if (rc == 0)
        *live = 1;
    if (!c && rc == SHOAL_ENET) {
        /* Nothing listens: the index alone, read-only. */
        shoal_err_clear(err);
        rc = from_index(cli, spec, by, "index", out, err);
    }
done:
    if (keep && rc == 0 && c) {
        *keep = c;
    } else {
        shoal_client_close(c);
        if (keep)
            *keep = NULL;
    }
    shoal_buf_free(&qb);
    return rc;
}

int stats_fetch(const shoal_cli *cli, const char *spec, cache_report_by by, shoal_json **out,
                int *live, shoal_err *err)
{
    return fetch_on(cli, NULL, spec, by, out, live, err);
}

/* ---- printing ------------------------------------------------------------------------ */

static void line_share(FILE *f, const char *label, uint64_t n, uint64_t total)
{
    char a[FMT_MAX], b[FMT_MAX];
    fmt_kv(f, 2, label, "%10s  %8s", fmt_count(n, a),
           total ? fmt_pct((double)n / (double)total, b) : "-");
}

static void print_requests(FILE *f, const shoal_json *j)
{
    char a[FMT_MAX], b[FMT_MAX];
    uint64_t total = (uint64_t)jint(j, "served.requests", 0);
    fmt_kv(f, 0, "Requests", "%10s", fmt_count(total, a));
    line_share(f, "served from engine RAM", (uint64_t)jint(j, "served.ram", 0), total);
    line_share(f, "served from disk cache", (uint64_t)jint(j, "served.disk", 0), total);
    line_share(f, "fetched upstream", (uint64_t)jint(j, "served.upstream", 0), total);
    fmt_kv(f, 2, "hit rate (RAM + disk)", "%10s  %8s", "",
           total ? fmt_pct(jnum(j, "served.hit_rate", 0), b) : "-");
    fputc('\n', f);
}

static void tier_row(fmt_table *t, const char *name, const shoal_json *c)
{
    char h[FMT_MAX], m[FMT_MAX], jn[FMT_MAX], r[FMT_MAX], p[FMT_MAX];
    uint64_t req = (uint64_t)jint(c, "requests", 0);
    fmt_table_row(t, name, fmt_count((uint64_t)jint(c, "hits", 0), h),
                  fmt_count((uint64_t)jint(c, "misses", 0), m),
                  fmt_count((uint64_t)jint(c, "joins", 0), jn), fmt_count(req, r),
                  req ? fmt_pct(jnum(c, "hit_rate", 0), p) : "-", NULL);
}

static void print_tiers(FILE *f, const shoal_json *j)
{
    char a[FMT_MAX], b[FMT_MAX];
    fmt_table *t = fmt_table_new("lrrrrr", "Tier", "Hits", "Misses", "Joins", "Requests",
                                 "Hit rate", NULL);
    tier_row(t, "engine RAM", shoal_json_path(j, "tiers.ram"));
    tier_row(t, "disk cache", shoal_json_path(j, "tiers.disk"));
    fmt_table_print(t, f, 0);
    fmt_table_free(t);
    fputc('\n', f);
    fputs("Upstream\n", f);
    fmt_kv(f, 2, "fetches (disk misses)", "%10s", fmt_count((uint64_t)jint(j, "tiers.upstream.fetches", 0), a));
    fmt_kv(f, 2, "joined a transfer", "%10s", fmt_count((uint64_t)jint(j, "tiers.upstream.joins", 0), a));
    fmt_kv(f, 2, "bytes fetched", "%10s", fmt_size((uint64_t)jint(j, "bytes.fetched", 0), a));
    fmt_kv(f, 2, "rate while waiting", "%10s",
           jnull(j, "tiers.upstream.rate_bytes_per_s") ? "-"
               : fmt_rate(jnum(j, "tiers.upstream.rate_bytes_per_s", 0), b));
    fmt_kv(f, 0, "Bytes served", "%10s", fmt_size((uint64_t)jint(j, "bytes.served", 0), a));
    fputc('\n', f);
}

static void print_disk(FILE *f, const shoal_json *j)
{
    char a[FMT_MAX], b[FMT_MAX], c[FMT_MAX];
    fputs("Disk cache\n", f);
    if (jnull(j, "disk.budget"))
        fmt_kv(f, 2, "used", "%10s  (the budget is known to shoald only)",
               fmt_size((uint64_t)jint(j, "disk.used", 0), a));
    else
        fmt_kv(f, 2, "used", "%10s  of %s (%s)", fmt_size((uint64_t)jint(j, "disk.used", 0), a),
               fmt_size((uint64_t)jint(j, "disk.budget", 0), b), fmt_pct(jnum(j, "disk.use", 0), c));
    if (!jnull(j, "daemon"))
        fmt_kv(f, 2, "pinned", "%10s", fmt_size((uint64_t)jint(j, "disk.pinned", 0), a));
    if (jint(j, "disk.lifted", 0))
        fmt_kv(f, 2, "spine replaced by its pack", "%10s  (evictable)",
               fmt_size((uint64_t)jint(j, "disk.lifted", 0), a));
    fmt_kv(f, 2, "objects", "%10s", fmt_count((uint64_t)jint(j, "disk.objects", 0), a));
    if (!jnull(j, "daemon"))
        fmt_kv(f, 2, "evicted since start", "%10s  (%s)",
               fmt_count((uint64_t)jint(j, "disk.evicted", 0), a),
               fmt_size((uint64_t)jint(j, "disk.evicted_bytes", 0), b));
    fputc('\n', f);
}

/* Bytes checked against an upstream hash vs trusted on their transfer
 * (docs/daemon.md "Integrity"). */
static void print_integrity(FILE *f, const shoal_json *j)
{
    char a[FMT_MAX], b[FMT_MAX];
    uint64_t v = (uint64_t)jint(j, "integrity.verified_bytes", 0);
    uint64_t t = (uint64_t)jint(j, "integrity.trusted_bytes", 0);
    fputs("Integrity\n", f);
    fmt_kv(f, 2, "verified against upstream hash", "%10s  %8s", fmt_size(v, a),
           v + t ? fmt_pct((double)v / (double)(v + t), b) : "-");
    fmt_kv(f, 2, "trusted on transfer", "%10s  %8s", fmt_size(t, a),
           v + t ? fmt_pct((double)t / (double)(v + t), b) : "-");
    fmt_kv(f, 2, "made here (derived)", "%10s",
           fmt_size((uint64_t)jint(j, "integrity.derived_bytes", 0), a));
    if (jint(j, "daemon.integrity.peer_verified_bytes", 0))
        fmt_kv(f, 2, "served from the HF cache", "%10s  (blobs hashed to their etag)",
               fmt_size((uint64_t)jint(j, "daemon.integrity.peer_verified_bytes", 0), a));
    if (jint(j, "integrity.mismatches", 0))
        fmt_kv(f, 2, "mismatches (quarantined)", "%10lld  (%s removed; %lld files bad now)",
               (long long)jint(j, "integrity.mismatches", 0),
               fmt_size((uint64_t)jint(j, "integrity.quarantined_bytes", 0), a),
               (long long)jint(j, "integrity.bad_files", 0));
    if (!jnull(j, "daemon.integrity") && jint(j, "daemon.integrity.files_queued", 0))
        fmt_kv(f, 2, "files waiting for a check", "%10lld",
               (long long)jint(j, "daemon.integrity.files_queued", 0));
    fputc('\n', f);
}

/* shoald's settings and where each came from (HOME/shoald.conf). */
static void print_settings(FILE *f, const shoal_json *j)
{
    char a[FMT_MAX];
    int64_t split = jint(j, "daemon.settings.split_min", 0);
    int keep = 0;
    if (jnull(j, "daemon.settings"))
        return;
    shoal_json_bool(j, "daemon.settings.keep_spine", &keep, NULL);
    fmt_kv(f, 0, "Settings", "%s", jstr(j, "daemon.settings.file", "?"));
    fmt_kv(f, 2, "max-size (budget)", "%-12s (%s)",
           jint(j, "daemon.settings.max_size", 0)
               ? fmt_size((uint64_t)jint(j, "daemon.settings.max_size", 0), a) : "auto",
           jstr(j, "daemon.settings.from.max-size", "?"));
    fmt_kv(f, 2, "parallel", "%-12lld (%s)", (long long)jint(j, "daemon.settings.parallel", 0),
           jstr(j, "daemon.settings.from.parallel", "?"));
    fmt_kv(f, 2, "split-min", "%-12s (%s)",
           split < 0 ? "never" : split == 0 ? "2.00 MiB" : fmt_size((uint64_t)split, a),
           jstr(j, "daemon.settings.from.split-min", "?"));
    fmt_kv(f, 2, "keep-spine", "%-12s (%s)", keep ? "yes" : "no",
           jstr(j, "daemon.settings.from.keep-spine", "?"));
    fputc('\n', f);
}

/* shoald's limits: what is held against each cap, and what the caps did
 * since start when they did something (docs/daemon.md "Limits"). */
static void print_limits(FILE *f, const shoal_json *j)
{
    char a[FMT_MAX], b[FMT_MAX];
    long long refused = jint(j, "daemon.limits.refused.cap", 0);
    long long room = jint(j, "daemon.limits.dropped.room", 0);
    long long dfds = jint(j, "daemon.limits.dropped.descriptors", 0);
    long long dbytes = jint(j, "daemon.limits.dropped.bytes", 0);
    long long dline = jint(j, "daemon.limits.dropped.frame_deadline", 0);
    long long pauses = jint(j, "daemon.limits.accept_pauses", 0);
    long long held = jint(j, "daemon.limits.log_lines_suppressed", 0);
    if (jnull(j, "daemon.limits"))
        return;
    fputs("Limits\n", f);
    fmt_kv(f, 2, "connections", "%lld of %lld (%lld accepted since start)",
           (long long)jint(j, "daemon.limits.connections", 0),
           (long long)jint(j, "daemon.limits.connections_limit", 0),
           (long long)jint(j, "daemon.limits.accepted", 0));
    fmt_kv(f, 2, "descriptors queued", "%lld of %lld",
           (long long)jint(j, "daemon.limits.descriptors_queued", 0),
           (long long)jint(j, "daemon.limits.descriptors_queued_limit", 0));
    fmt_kv(f, 2, "bytes held", "%s of %s",
           fmt_size((uint64_t)jint(j, "daemon.limits.buffered_bytes", 0), a),
           fmt_size((uint64_t)jint(j, "daemon.limits.buffered_bytes_limit", 0), b));
    if (refused)
        fmt_kv(f, 2, "refused at the cap", "%lld", refused);
    if (room + dfds + dbytes + dline)
        fmt_kv(f, 2, "clients dropped", "%lld  (room %lld, descriptors %lld, bytes %lld, "
               "frame deadline %lld)", room + dfds + dbytes + dline, room, dfds, dbytes, dline);
    if (pauses)
        fmt_kv(f, 2, "accept pauses", "%lld  (out of descriptors or memory)", pauses);
    if (held)
        fmt_kv(f, 2, "log lines held back", "%lld", held);
    fputc('\n', f);
}

static void print_models(FILE *f, const shoal_json *j)
{
    shoal_json *ms = shoal_json_get(j, "models");
    fmt_table *t;
    if (!ms || shoal_json_array_size(ms) == 0) {
        fprintf(f, "Models: none cached\n\n");
        return;
    }
    fputs("Models\n", f);
    t = fmt_table_new("llrrlrr", "Model", "Commit", "Cached", "Experts", "Spine", "Disk hit",
                      "RAM hit", NULL);
    for (size_t i = 0; i < shoal_json_array_size(ms); i++) {
        const shoal_json *m = shoal_json_array_at(ms, i);
        char name[512], commit[16], sz[FMT_MAX], ex[FMT_MAX], dh[FMT_MAX], rh[FMT_MAX];
        const char *spine = "-";
        stats_model_name(m, name, sizeof name);
        snprintf(commit, sizeof commit, "%.10s", jstr(m, "commit", ""));
        snprintf(ex, sizeof ex, "-");
        if (!jnull(m, "coverage")) {
            snprintf(ex, sizeof ex, "%lld/%lld", (long long)jint(m, "coverage.experts_cached", 0),
                     (long long)jint(m, "coverage.experts_total", 0));
            int complete = 0;
            shoal_json_bool(m, "coverage.spine_complete", &complete, NULL);
            spine = complete ? "complete" : "partial";
        }
        fmt_table_row(t, name, commit, fmt_size((uint64_t)jint(m, "bytes", 0), sz), ex, spine,
                      jint(m, "disk.requests", 0) ? fmt_pct(jnum(m, "disk.hit_rate", 0), dh) : "-",
                      jint(m, "ram.requests", 0) ? fmt_pct(jnum(m, "ram.hit_rate", 0), rh) : "-",
                      NULL);
    }
    fmt_table_print(t, f, 2);
    fmt_table_free(t);
    /* an open model whose upstream is not there (shoald only) */
    for (size_t i = 0; i < shoal_json_array_size(ms); i++) {
        const shoal_json *m = shoal_json_array_at(ms, i);
        const char *up = jstr(m, "upstream", "");
        char name[512];
        stats_model_name(m, name, sizeof name);
        if (strcmp(up, "offline") == 0)
            fprintf(f, "  %s: offline (HF_HUB_OFFLINE): commit %.12s, the last known; only "
                    "what the cache holds serves\n", name, jstr(m, "commit", "?"));
        else if (strcmp(up, "unreachable") == 0)
            fprintf(f, "  %s: the Hub cannot be reached: commit %.12s is the revision's last "
                    "known; what is not cached fails until it is back\n", name,
                    jstr(m, "commit", "?"));
    }
    fputc('\n', f);
}

/* The model row with this id, for names. */
static void model_name_by_id(const shoal_json *j, int64_t id, char *out, size_t cap)
{
    shoal_json *ms = shoal_json_get(j, "models");
    for (size_t i = 0; ms && i < shoal_json_array_size(ms); i++)
        if (jint(shoal_json_array_at(ms, i), "id", -1) == id) {
            stats_model_name(shoal_json_array_at(ms, i), out, cap);
            return;
        }
    snprintf(out, cap, "model %lld", (long long)id);
}

static void print_layers(FILE *f, const shoal_json *j, int full)
{
    shoal_json *ls = shoal_json_get(j, "layers");
    size_t n = ls ? shoal_json_array_size(ls) : 0;
    char name[512], a[FMT_MAX], b[FMT_MAX], c[FMT_MAX], d[FMT_MAX], e[FMT_MAX];

    if (n == 0)
        return;
    if (full) {
        fmt_table *t = fmt_table_new("lrrrrrr", "Model", "Layer", "Hits", "Misses", "Joins",
                                     "Hit rate", "RAM hit", NULL);
        for (size_t i = 0; i < n; i++) {
            const shoal_json *r = shoal_json_array_at(ls, i);
            char l[16];
            model_name_by_id(j, jint(r, "model", 0), name, sizeof name);
            snprintf(l, sizeof l, "%lld", (long long)jint(r, "layer", 0));
            fmt_table_row(t, name, l, fmt_count((uint64_t)jint(r, "disk.hits", 0), a),
                          fmt_count((uint64_t)jint(r, "disk.misses", 0), b),
                          fmt_count((uint64_t)jint(r, "disk.joins", 0), c),
                          jint(r, "disk.requests", 0) ? fmt_pct(jnum(r, "disk.hit_rate", 0), d) : "-",
                          jint(r, "ram.requests", 0) ? fmt_pct(jnum(r, "ram.hit_rate", 0), e) : "-",
                          NULL);
        }
        fprintf(f, "Layers (disk cache)\n");
        fmt_table_print(t, f, 2);
        fmt_table_free(t);
        fputc('\n', f);
        return;
    }
    /* Summary: per model, the worst and best layer (`--by layer` lists all). */
    fprintf(f, "Layers (disk hit rate; --by layer lists every layer)\n");
    for (size_t i = 0; i < n;) {
        int64_t model = jint(shoal_json_array_at(ls, i), "model", 0);
        int64_t lo_l = -1, hi_l = -1, nl = 0;
        double lo = 2, hi = -1;
        for (; i < n && jint(shoal_json_array_at(ls, i), "model", 0) == model; i++) {
            const shoal_json *r = shoal_json_array_at(ls, i);
            if (jint(r, "disk.requests", 0) == 0)
                continue;
            double h = jnum(r, "disk.hit_rate", 0);
            nl++;
            if (h < lo) { lo = h; lo_l = jint(r, "layer", 0); }
            if (h > hi) { hi = h; hi_l = jint(r, "layer", 0); }
        }
        if (!nl)
            continue;
        model_name_by_id(j, model, name, sizeof name);
        fprintf(f, "  %s: %lld layers asked; lowest %s (layer %lld), highest %s (layer %lld)\n",
                name, (long long)nl, fmt_pct(lo, a), (long long)lo_l, fmt_pct(hi, b),
                (long long)hi_l);
    }
    fputc('\n', f);
}

/* The CLI's own connections (which asked nothing) are not worth a row. */
static int session_shown(const shoal_json *s)
{
    return strcmp(jstr(s, "program", ""), "shoal") != 0 || jint(s, "disk.requests", 0) ||
           jint(s, "ram.requests", 0);
}

static void print_sessions(FILE *f, const shoal_json *j)
{
    shoal_json *ss = shoal_json_get(j, "sessions");
    size_t n = ss ? shoal_json_array_size(ss) : 0, shown = 0;
    fmt_table *t;
    for (size_t i = 0; i < n; i++)
        shown += session_shown(shoal_json_array_at(ss, i));
    if (shown == 0)
        return;
    fprintf(f, "Recent sessions (newest first; %zu shown, %lld in all)\n", shown,
            (long long)jint(j, "sessions_total", (int64_t)n));
    t = fmt_table_new("rlrllrrrr", "ID", "Program", "PID", "Started", "State", "Requests",
                      "Disk hit", "RAM hit", "Served", NULL);
    for (size_t i = 0; i < n; i++) {
        const shoal_json *s = shoal_json_array_at(ss, i);
        if (!session_shown(s))
            continue;
        char id[24], pid[24], st[FMT_MAX], rq[FMT_MAX], dh[FMT_MAX], rh[FMT_MAX], sv[FMT_MAX];
        snprintf(id, sizeof id, "%lld", (long long)jint(s, "id", 0));
        snprintf(pid, sizeof pid, "%lld", (long long)jint(s, "pid", 0));
        uint64_t req = (uint64_t)(jint(s, "disk.requests", 0) + jint(s, "ram.hits", 0));
        fmt_table_row(t, id, jstr(s, "program", ""), pid, fmt_time(jint(s, "started_ms", 0), st),
                      jint(s, "ended_ms", 0) ? "ended" : "open", fmt_count(req, rq),
                      jint(s, "disk.requests", 0) ? fmt_pct(jnum(s, "disk.hit_rate", 0), dh) : "-",
                      jint(s, "ram.requests", 0) ? fmt_pct(jnum(s, "ram.hit_rate", 0), rh) : "-",
                      fmt_size((uint64_t)(jint(s, "disk.bytes_out", 0) + jint(s, "ram.bytes_out", 0)), sv),
                      NULL);
    }
    fmt_table_print(t, f, 2);
    fmt_table_free(t);
    fputc('\n', f);
}

typedef struct hot { int64_t model, layer, expert, req, hits; } hot;

static int hot_cmp(const void *a, const void *b)
{
    const hot *x = a, *y = b;
    if (x->req != y->req)
        return x->req > y->req ? -1 : 1;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    return x->expert < y->expert ? -1 : x->expert > y->expert;
}

static void print_experts(FILE *f, const shoal_json *j, size_t top)
{
    shoal_json *g = shoal_json_get(j, "experts");
    hot *v = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; g && i < shoal_json_array_size(g); i++) {
        const shoal_json *r = shoal_json_array_at(g, i);
        shoal_json *rq = shoal_json_get(r, "requests"), *hs = shoal_json_get(r, "hits");
        for (size_t e = 0; rq && e < shoal_json_array_size(rq); e++) {
            int64_t q = shoal_json_int_value(shoal_json_array_at(rq, e));
            if (!q)
                continue;
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 256;
                hot *p = realloc(v, nc * sizeof *p);
                if (!p)
                    break;
                v = p;
                cap = nc;
            }
            v[n++] = (hot){ jint(r, "model", 0), jint(r, "layer", 0), (int64_t)e, q,
                            shoal_json_int_value(shoal_json_array_at(hs, e)) };
        }
    }
    if (n == 0) {
        free(v);
        return;
    }
    qsort(v, n, sizeof *v, hot_cmp);
    fprintf(f, "Hottest experts (disk cache; %zu of %zu asked)\n", n < top ? n : top, n);
    fmt_table *t = fmt_table_new("lrrrrr", "Model", "Layer", "Expert", "Requests", "Hits",
                                 "Hit rate", NULL);
    for (size_t i = 0; i < n && i < top; i++) {
        char name[512], l[16], e[16], q[FMT_MAX], h[FMT_MAX], p[FMT_MAX];
        model_name_by_id(j, v[i].model, name, sizeof name);
        snprintf(l, sizeof l, "%lld", (long long)v[i].layer);
        snprintf(e, sizeof e, "%lld", (long long)v[i].expert);
        fmt_table_row(t, name, l, e, fmt_count((uint64_t)v[i].req, q),
                      fmt_count((uint64_t)v[i].hits, h),
                      fmt_pct((double)v[i].hits / (double)v[i].req, p), NULL);
    }
    fmt_table_print(t, f, 2);
    fmt_table_free(t);
    fputc('\n', f);
    free(v);
}

static void stats_print(FILE *f, const shoal_json *j, cache_report_by by, int live)
{
    fmt_kv(f, 0, "Cache directory", "%s", jstr(j, "home", "?"));
    if (live)
        fmt_kv(f, 0, "Source", "%s", "shoald (live)");
    else
        fmt_kv(f, 0, "Source", "%s", "index (read-only; shoald is not running)");
    if (!jnull(j, "filter.model"))
        fmt_kv(f, 0, "Model", "%s", jstr(j, "filter.model", ""));
    fputc('\n', f);
    print_requests(f, j);
    print_tiers(f, j);
    print_disk(f, j);
    print_integrity(f, j);
    print_settings(f, j);
    print_limits(f, j);
    print_models(f, j);
    print_layers(f, j, by == CACHE_REPORT_BY_LAYER);
    if (by == CACHE_REPORT_BY_EXPERT)
        print_experts(f, j, 20);
    print_sessions(f, j);
}

/* ---- the command --------------------------------------------------------------------- */

static volatile sig_atomic_t stop_watch;
static void on_sigint(int sig) { (void)sig; stop_watch = 1; }

enum { O_BY = 1, O_JSON, O_WATCH, O_INTERVAL };

static const shoal_cli_opt stats_opts[] = {
    { "by", 0, "layer|expert|session", O_BY, "layer: every layer's hit rates (default: lowest and\n"
                                              "highest only); expert: the hottest experts;\n"
                                              "session: every session, not only the 10 most recent" },
    { "json", 0, NULL, O_JSON, "the report as JSON (schema: docs/stats-json.md)" },
    { "watch", 0, NULL, O_WATCH, "redraw every --interval seconds until Ctrl-C" },
    { "interval", 0, "S", O_INTERVAL, "seconds between --watch redraws (default 2)" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_stats_spec = {
    .prog = "shoal stats",
    .synopsis = "shoal stats [MODEL] [--by layer|expert|session] [--json] [--watch [--interval S]]",
    .about = "Hit rates of every tier (the engines' RAM, this disk cache, upstream), bytes\n"
             "fetched and served, disk use against the budget, per-model and per-layer hit\n"
             "rates and recent sessions.  Live from shoald when it runs; otherwise read from\n"
             "the cache index (read-only; the output says which).  MODEL: hf://org/name[@rev],\n"
             "org/name[@rev] or a model directory.",
    .opts = stats_opts,
};

int cmd_stats(shoal_cli *cli, int argc, char **argv)
{
    cache_report_by by = CACHE_REPORT_BY_NONE;
    int json = 0, watch = 0, live = 0, rc, id;
    double interval = 2.0;
    char spec[SHOAL_PATH_MAX], *end;
    const char *model = NULL, *v;
    shoal_err err = { 0, "" };
    shoal_client *conn = NULL;
    shoal_cli_parser p;

    shoal_cli_begin(&p, &cmd_stats_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case O_BY:
            if (!strcmp(v, "layer")) by = CACHE_REPORT_BY_LAYER;
            else if (!strcmp(v, "expert")) by = CACHE_REPORT_BY_EXPERT;
            else if (!strcmp(v, "session")) by = CACHE_REPORT_BY_SESSION;
            else return shoal_cli_bad_value(&p, v, "layer, expert or session");
            break;
        case O_JSON:  json = 1; break;
        case O_WATCH: watch = 1; break;
        case O_INTERVAL:
            interval = strtod(v, &end);
            if (*end || end == v || !(interval >= 0.1 && interval <= 86400))
                return shoal_cli_bad_value(&p, v, "seconds, 0.1 or more");
            break;
        }
    }
    if (id < 0)
        return p.exit;
    if (p.optind < argc - 1)
        return shoal_cli_usage_error(&cmd_stats_spec, "one MODEL at most");
    if (p.optind < argc) {
        if ((rc = cli_model_arg(&cmd_stats_spec, argv[p.optind], spec, sizeof spec)) != 0)
            return rc;
        model = spec;
    }
    if (watch)
        signal(SIGINT, on_sigint);
    do {
        shoal_json *j = NULL;
        if ((rc = fetch_on(cli, watch ? &conn : NULL, model, by, &j, &live, &err)) != 0) {
            shoal_client_close(conn);
            return cli_fail(rc, &err);
        }
        if (watch && cli->tty)
            fputs("\033[H\033[2J", stdout);
        if (json) {
            shoal_buf b;
            shoal_buf_init(&b, 0);
            shoal_json_dump(j, SHOAL_JSON_PRETTY, &b);
            fwrite(b.data, 1, b.len, stdout);
            fputc('\n', stdout);
            shoal_buf_free(&b);
        } else {
            stats_print(stdout, j, by, live);
        }
        shoal_json_free(j);
        fflush(stdout);
        if (watch && !stop_watch) {
            struct timespec ts = { (time_t)interval, (long)((interval - (double)(time_t)interval) * 1e9) };
            while (nanosleep(&ts, &ts) != 0 && !stop_watch)
                ;
        }
    } while (watch && !stop_watch);
    shoal_client_close(conn);
    return EXIT_OK_;
}
