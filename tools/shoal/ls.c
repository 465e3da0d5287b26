/* ls.c — `shoal ls`: the models a cache holds, their revisions, cached
 * bytes and coverage.  Always read from the index (read-only), which is
 * allowed beside a running shoald.
 */
#include "tools/shoal/shoal_int.h"

#include <string.h>

enum { O_JSON = 1 };

static const shoal_cli_opt ls_opts[] = {
    { "json", 0, NULL, O_JSON, "as JSON (docs/stats-json.md, \"shoal.models\")" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_ls_spec = {
    .prog = "shoal ls",
    .synopsis = "shoal ls [MODEL] [--json]",
    .about = "Models in the cache, one row per model and revision: the commit it resolved\n"
             "to last (\"+N older\": other commits of it still recorded), the endpoint\n"
             "(the Hub's host, or local), cached bytes and objects, coverage (experts\n"
             "cached of the model's total; whether the spine is complete, known once the\n"
             "model's manifest is cached).  Reads the index read-only.\n"
             "MODEL: only models matching hf://org/name[@rev], org/name[@rev] or DIR.",
    .opts = ls_opts,
};

/* Where a model comes from, short: the Hub's host (and port when not the
 * default), "local" for a directory. */
static void endpoint_short(const char *ep, char *out, size_t cap)
{
    const char *h = strstr(ep, "://");
    size_t n;
    if (!ep[0] || strncmp(ep, "file://", 7) == 0) {
        snprintf(out, cap, "local");
        return;
    }
    h = h ? h + 3 : ep;
    n = strcspn(h, "/");
    snprintf(out, cap, "%.*s", (int)n, h);
}

static int same_group(const shoal_json *a, const shoal_json *b)
{
    return strcmp(jstr(a, "endpoint", ""), jstr(b, "endpoint", "")) == 0
           && strcmp(jstr(a, "repo", ""), jstr(b, "repo", "")) == 0
           && strcmp(jstr(a, "revision", ""), jstr(b, "revision", "")) == 0;
}

/* One row per (endpoint, repo, revision): the index keeps a row per commit
 * a revision resolved to, and one per open that failed after the pin (no
 * objects, no manifest).  The row shown is the newest resolution holding
 * objects (else the newest); the others are counted in its commit column
 * ("+N older") and `--json` lists them all. */
static void print_models(const shoal_json *j)
{
    shoal_json *ms = shoal_json_get(j, "models");
    size_t n = ms ? shoal_json_array_size(ms) : 0;
    fmt_table *t;
    if (n == 0) {
        printf("No models cached in %s.\n", jstr(j, "home", "?"));
        return;
    }
    t = fmt_table_new("llllrrll", "Model", "Revision", "Commit", "Endpoint", "Cached", "Objects",
                      "Experts", "Spine", NULL);
    for (size_t i = 0; i < n; i++) {
        const shoal_json *m = shoal_json_array_at(ms, i), *best = m;
        char commit[48], sz[FMT_MAX], ob[FMT_MAX], ex[96], sp[96], p[FMT_MAX], ep[128];
        size_t older = 0, k;
        int first = 1;

        for (k = 0; k < i && first; k++)
            if (same_group(shoal_json_array_at(ms, k), m))
                first = 0;
        if (!first)
            continue;   /* shown with the group's first row */
        for (k = i + 1; k < n; k++) {
            const shoal_json *o = shoal_json_array_at(ms, k);
            int o_has = jint(o, "objects", 0) > 0, b_has = jint(best, "objects", 0) > 0;
            if (!same_group(o, m))
                continue;
            older++;
            if ((o_has && !b_has)
                || (o_has == b_has && jint(o, "resolved_ms", 0) > jint(best, "resolved_ms", 0)))
                best = o;
        }
        if (older)
            snprintf(commit, sizeof commit, "%.10s (+%zu older)", jstr(best, "commit", ""), older);
        else
            snprintf(commit, sizeof commit, "%.10s", jstr(best, "commit", ""));
        endpoint_short(jstr(best, "endpoint", ""), ep, sizeof ep);
        snprintf(ex, sizeof ex, "-");
        snprintf(sp, sizeof sp, "- (no manifest)");
        if (!jnull(best, "coverage")) {
            int64_t c = jint(best, "coverage.experts_cached", 0);
            int64_t tot = jint(best, "coverage.experts_total", 0);
            int complete = 0;
            shoal_json_bool(best, "coverage.spine_complete", &complete, NULL);
            snprintf(ex, sizeof ex, "%lld/%lld (%s)", (long long)c, (long long)tot,
                     fmt_pct(tot ? (double)c / (double)tot : 0.0, p));
            snprintf(sp, sizeof sp, "%s (%lld/%lld tensors)", complete ? "complete" : "partial",
                     (long long)jint(best, "coverage.spine_cached", 0),
                     (long long)jint(best, "coverage.spine_total", 0));
        }
        fmt_table_row(t, jstr(best, "repo", "?"), jstr(best, "revision", ""), commit, ep,
                      fmt_size((uint64_t)jint(best, "bytes", 0), sz),
                      fmt_count((uint64_t)jint(best, "objects", 0), ob), ex, sp, NULL);
    }
    fmt_table_print(t, stdout, 0);
    fmt_table_free(t);
}

int cmd_ls(shoal_cli *cli, int argc, char **argv)
{
    int json = 0, id, rc;
    char spec[SHOAL_PATH_MAX];
    const char *model = NULL, *v;
    shoal_err err = { 0, "" };
    cache *ca = NULL;
    shoal_buf b;
    shoal_json *j = NULL;
    shoal_cli_parser p;

    shoal_cli_begin(&p, &cmd_ls_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0)
        if (id == O_JSON)
            json = 1;
    if (id < 0)
        return p.exit;
    if (p.optind < argc - 1)
        return shoal_cli_usage_error(&cmd_ls_spec, "one MODEL at most");
    if (p.optind < argc) {
        if ((rc = cli_model_arg(&cmd_ls_spec, argv[p.optind], spec, sizeof spec)) != 0)
            return rc;
        model = spec;
    }
    shoal_buf_init(&b, 0);
    rc = cli_cache_reader(cli, &ca, &err);
    if (rc == 0)
        rc = cache_report_models(ca, model, &b, &err);
    cache_close(ca);
    rc = cli_json_take(rc, &b, &j, &err);
    if (rc == 0) {
        if (json) {
            cli_json_print(j);
        } else {
            print_models(j);
        }
    }
    shoal_json_free(j);
    return rc ? cli_fail(rc, &err) : EXIT_OK_;
}
