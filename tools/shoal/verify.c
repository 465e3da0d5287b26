/* verify.c — `shoal verify`: every object's checksum (bad ones are
 * removed so they are never served again) and, with --deep, whole files
 * against their sha256 / git etag when every byte of them is cached.
 * Through shoald when it runs (which does the work on a worker thread and
 * sends PROGRESS, shown here on a terminal), else on the cache as its
 * writer.  What each guarantees: docs/cache-format.md, "Verify".
 */
#include "tools/shoal/shoal_int.h"

#include <string.h>
#include <unistd.h>

/* PROGRESS frames of a long call on stderr through the shared display
 * (stdout stays the result's: --json). */
void cli_show_progress(const shoal_progress *p, void *ctx)
{
    shoal_meter_update(ctx, p->phase, p->done, p->total, NULL);
}

void cli_progress_end(shoal_meter *m)
{
    shoal_meter_clear(m);
}

enum { O_DEEP = 1, O_JSON };

static const shoal_cli_opt verify_opts[] = {
    { "deep", 0, NULL, O_DEEP, "also hash every file whose every byte is cached (a shard: its\n"
                               "header, kept at OPEN, and all its tensors) and compare it with its\n"
                               "etag (sha256 for LFS files, the git blob id for small files): the\n"
                               "bytes are the ones upstream published.  A mismatch names the file." },
    { "json", 0, NULL, O_JSON, "the result as JSON (docs/stats-json.md, \"shoal.verify\")" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_verify_spec = {
    .prog = "shoal verify",
    .synopsis = "shoal verify [MODEL] [--deep] [--json]",
    .about = "Recompute the XXH3-128 checksum of every cached object (of MODEL, or all):\n"
             "each object still has the bytes it had when it was stored; a bad one is\n"
             "removed, so it is fetched again when next asked for.  Exit status 5 when\n"
             "anything was bad.  Through shoald when it runs.",
    .opts = verify_opts,
};

static int print_result(const shoal_json *j, int json)
{
    char a[FMT_MAX], b[FMT_MAX];
    int64_t bad = jint(j, "bad", 0), missing = jint(j, "missing", 0);
    int64_t dbad = jint(j, "deep.bad", 0) + jint(j, "deep.quarantined", 0);

    if (json) {
        cli_json_print(j);
    } else {
        printf("Checked %s objects (%s): %lld bad%s, %lld missing\n",
               fmt_count((uint64_t)jint(j, "checked", 0), a),
               fmt_size((uint64_t)jint(j, "bytes", 0), b), (long long)bad,
               bad ? " (removed: they will be fetched again)" : "", (long long)missing);
        if (!jnull(j, "deep")) {
            shoal_json *bf = shoal_json_path(j, "deep.bad_files");
            printf("Whole files: %lld known, %lld fully cached: %lld match their etag, %lld do NOT, "
                   "%lld have no hash etag, %lld quarantined (%s hashed)\n",
                   (long long)jint(j, "deep.files", 0), (long long)jint(j, "deep.complete", 0),
                   (long long)jint(j, "deep.ok", 0), (long long)jint(j, "deep.bad", 0),
                   (long long)jint(j, "deep.unhashable", 0),
                   (long long)jint(j, "deep.quarantined", 0),
                   fmt_size((uint64_t)jint(j, "deep.bytes", 0), a));
            for (size_t i = 0; bf && i < shoal_json_array_size(bf); i++)
                printf("  bad file: %s\n", shoal_json_str_value(shoal_json_array_at(bf, i)));
            if (jint(j, "deep.quarantined", 0))
                printf("A quarantined file failed shoald's automatic check (upstream sent bytes "
                       "that do not hash to its etag): its objects were removed and are fetched "
                       "again; see the log.\n");
            if (jint(j, "deep.bad", 0))
                printf("A bad file means upstream sent bytes that do not hash to its etag: "
                       "`shoal rm` the model and fetch it again.\n");
        }
    }
    return bad || missing || dbad ? EXIT_DAMAGED : EXIT_OK_;
}

/* shoald answered without the whole-file check: do it here, on the index
 * read-only (it only reads blobs). */
static int deep_here(const shoal_cli *cli, const char *spec, shoal_json *j, shoal_err *err)
{
    cache *ca = NULL;
    cache_deep_report r;
    shoal_buf bad;
    shoal_json *d = shoal_json_object(), *arr = shoal_json_array();
    int rc = cli_cache_reader(cli, &ca, err);

    shoal_buf_init(&bad, 0);
    if (rc == 0)
        rc = cache_verify_deep(ca, spec[0] ? spec : NULL, NULL, &r, &bad, err);
    cache_close(ca);
    if (rc == 0 && d && arr) {
        shoal_json_set_int(d, "files", (int64_t)r.files);
        shoal_json_set_int(d, "complete", (int64_t)r.complete);
        shoal_json_set_int(d, "ok", (int64_t)r.ok);
        shoal_json_set_int(d, "bad", (int64_t)r.bad);
        shoal_json_set_int(d, "unhashable", (int64_t)r.unhashable);
        shoal_json_set_int(d, "bytes", (int64_t)r.bytes);
        shoal_json_set_int(d, "quarantined", (int64_t)r.quarantined);
        for (char *p = (char *)bad.data, *nl; p && (nl = strchr(p, '\n')); p = nl + 1)
            shoal_json_append_take(arr, shoal_json_new_strn(p, (size_t)(nl - p)));
        shoal_json_set_take(d, "bad_files", arr);
        arr = NULL;
        shoal_json_set_take(j, "deep", d);
        d = NULL;
    }
    shoal_json_free(d);
    shoal_json_free(arr);
    shoal_buf_free(&bad);
    return rc;
}

int cmd_verify(shoal_cli *cli, int argc, char **argv)
{
    int deep = 0, json = 0, id, rc;
    char spec[SHOAL_PATH_MAX] = "";
    const char *v;
    shoal_err err = { 0, "" };
    shoal_client *cl = NULL;
    shoal_buf b;
    shoal_json *j = NULL;
    shoal_cli_parser p;
    shoal_meter meter;

    shoal_cli_begin(&p, &cmd_verify_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0)
        *(id == O_DEEP ? &deep : &json) = 1;
    if (id < 0)
        return p.exit;
    if (p.optind < argc - 1)
        return shoal_cli_usage_error(&cmd_verify_spec, "one MODEL at most");
    if (p.optind < argc &&
        (rc = cli_model_arg(&cmd_verify_spec, argv[p.optind], spec, sizeof spec)) != 0)
        return rc;
    shoal_meter_init(&meter, stderr, &cli->meter, "verify", SHOAL_METER_BYTES);
    shoal_buf_init(&b, 0);
    rc = cli_connect(cli, &cl, &err);
    if (rc == 0) {
        shoal_client_on_progress(cl, cli_show_progress, &meter);
        rc = shoal_client_verify(cl, spec, deep, &b, &err);
        cli_progress_end(&meter);
        shoal_client_close(cl);
    } else if (rc == SHOAL_ENET) {
        cache *ca = NULL;
        shoal_err_clear(&err);
        rc = cli_cache_writer(cli, &ca, &err);
        if (rc == 0)
            rc = cache_report_verify(ca, spec[0] ? spec : NULL, deep, &b, &err);
        cache_close(ca);
    }
    rc = cli_json_take(rc, &b, &j, &err);
    if (rc == 0 && deep && jnull(j, "deep"))
        rc = deep_here(cli, spec, j, &err);
    if (rc) {
        shoal_json_free(j);
        return cli_fail(rc, &err);
    }
    rc = print_result(j, json);
    shoal_json_free(j);
    return rc;
}
