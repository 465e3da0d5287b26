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
    .about = "Models in the cache: revision, commit, cached bytes and objects, coverage\n"
             "(experts cached of the model's total; whether the spine is complete,\n"
             "known once the model's manifest is cached).  Reads the index read-only.\n"
             "MODEL: only models matching hf://org/name[@rev], org/name[@rev] or DIR.",
    .opts = ls_opts,
};

static void print_models(const shoal_json *j)
{
    shoal_json *ms = shoal_json_get(j, "models");
    size_t n = ms ? shoal_json_array_size(ms) : 0;
    fmt_table *t;
    if (n == 0) {
        printf("No models cached in %s.\n", jstr(j, "home", "?"));
        return;
    }
    t = fmt_table_new("lllrrll", "Model", "Revision", "Commit", "Cached", "Objects", "Experts",
                      "Spine", NULL);
    for (size_t i = 0; i < n; i++) {
        const shoal_json *m = shoal_json_array_at(ms, i);
        char commit[16], sz[FMT_MAX], ob[FMT_MAX], ex[96], sp[96], p[FMT_MAX];
        snprintf(commit, sizeof commit, "%.10s", jstr(m, "commit", ""));
        snprintf(ex, sizeof ex, "-");
        snprintf(sp, sizeof sp, "- (no manifest)");
        if (!jnull(m, "coverage")) {
            int64_t c = jint(m, "coverage.experts_cached", 0), tot = jint(m, "coverage.experts_total", 0);
            int complete = 0;
            shoal_json_bool(m, "coverage.spine_complete", &complete, NULL);
            snprintf(ex, sizeof ex, "%lld/%lld (%s)", (long long)c, (long long)tot,
                     fmt_pct(tot ? (double)c / (double)tot : 0.0, p));
            snprintf(sp, sizeof sp, "%s (%lld/%lld tensors)", complete ? "complete" : "partial",
                     (long long)jint(m, "coverage.spine_cached", 0),
                     (long long)jint(m, "coverage.spine_total", 0));
        }
        fmt_table_row(t, jstr(m, "repo", "?"), jstr(m, "revision", ""), commit,
                      fmt_size((uint64_t)jint(m, "bytes", 0), sz),
                      fmt_count((uint64_t)jint(m, "objects", 0), ob), ex, sp, NULL);
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
