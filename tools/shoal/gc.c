/* gc.c — `shoal gc`, `pin`, `unpin` and `rm`: the commands that change
 * what the cache keeps.  Through shoald when it runs (GC, PIN: a GC runs
 * in steps there, its PROGRESS shown on a terminal); when it does not, on
 * the cache as its one writer.
 */
#include "tools/shoal/shoal_int.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- gc ------------------------------------------------------------------------- */

enum { O_MAX_SIZE = 1, O_JSON, O_LAYERS };

static const shoal_cli_opt gc_opts[] = {
    { "max-size", 0, "SIZE", O_MAX_SIZE, "the size to get down to (\"500G\", \"1.5TiB\"; default:\n"
                                         "the budget)" },
    { "json", 0, NULL, O_JSON, "the result as JSON (docs/stats-json.md, \"shoal.gc\")" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_gc_spec = {
    .prog = "shoal gc",
    .synopsis = "shoal gc [--max-size SIZE] [--json]",
    .about = "Evict the least valuable unpinned objects (the cache's eviction policy:\n"
             "recency, frequency, per-layer fairness) until the cache holds at most SIZE.\n"
             "Pinned objects stay.  Through shoald when it runs.",
    .opts = gc_opts,
};

int cmd_gc(shoal_cli *cli, int argc, char **argv)
{
    uint64_t max = 0;
    int json = 0, id, rc;
    shoal_err err = { 0, "" };
    shoal_client *cl = NULL;
    shoal_buf b;
    shoal_json *j = NULL;
    char x[FMT_MAX], y[FMT_MAX], z[FMT_MAX];
    const char *v;
    shoal_cli_parser p;
    shoal_meter meter;

    shoal_cli_begin(&p, &cmd_gc_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        if (id == O_JSON)
            json = 1;
        else if (shoal_size_parse(v, &max) != 0 || max == 0)
            return shoal_cli_bad_value(&p, v, "a size such as 500G or 1.5TiB");
    }
    if (id < 0)
        return p.exit;
    if (p.optind < argc)
        return shoal_cli_usage_error(&cmd_gc_spec, "takes no MODEL ('%s')", argv[p.optind]);
    shoal_meter_init(&meter, stderr, &cli->meter, "gc", SHOAL_METER_BYTES);
    shoal_buf_init(&b, 0);
    rc = cli_connect(cli, &cl, &err);
    if (rc == 0) {
        shoal_client_on_progress(cl, cli_show_progress, &meter);
        rc = shoal_client_gc(cl, max, &b, &err);
        cli_progress_end(&meter);
        shoal_client_close(cl);
        /* shoald answered HELLO, then went away: not "not running" (3) but
         * a request that failed (1), saying so */
        if (rc == SHOAL_ENET) {
            shoal_err_wrap(&err, SHOAL_EIO, "shoald went away during the GC (it may have "
                           "evicted part of it; see its log, restart it and run `shoal gc` "
                           "again)");
            rc = err.code = SHOAL_EIO;
        }
    } else if (rc == SHOAL_ENET) {
        cache *ca = NULL;
        shoal_err_clear(&err);
        rc = cli_cache_writer(cli, &ca, &err);
        if (rc == 0)
            rc = cache_report_gc(ca, max, &b, &err);
        cache_close(ca);
    }
    rc = cli_json_take(rc, &b, &j, &err);
    if (rc)
        return cli_fail(rc, &err);
    if (json) {
        cli_json_print(j);
    } else {
        /* shoald and the index answer with the same document (shoal.gc,
         * docs/stats-json.md). */
        int64_t freed = jint(j, "freed", 0), objs = jint(j, "objects_evicted", 0);
        int64_t target = jint(j, "max_bytes", 0), after = jint(j, "after", 0);
        int reached = after <= target;
        shoal_json_bool(j, "reached", &reached, NULL);
        printf("Freed %s (%lld objects): the cache holds %s, target %s\n",
               fmt_size((uint64_t)freed, x), (long long)objs, fmt_size((uint64_t)after, y),
               fmt_size((uint64_t)target, z));
        if (!reached)
            printf("Pinned objects (%s) keep it above the target: `shoal unpin MODEL` first.\n",
                   fmt_size((uint64_t)jint(j, "pinned", 0), x));
    }
    shoal_json_free(j);
    return EXIT_OK_;
}

/* ---- pin / unpin ------------------------------------------------------------------- */

static const shoal_cli_opt pin_opts[] = {
    { "layers", 0, "A-B", O_LAYERS, "only the experts of layers A..B (0-based)" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_pin_spec = {
    .prog = "shoal pin",
    .synopsis = "shoal pin MODEL [--layers A-B]",
    .about = "Pin (keep from eviction) every cached object of MODEL, or only its experts of\n"
             "layers A..B.  The spine and small files are always pinned.",
    .opts = pin_opts,
};

const shoal_cli_spec cmd_unpin_spec = {
    .prog = "shoal unpin",
    .synopsis = "shoal unpin MODEL [--layers A-B]",
    .about = "Let the cached objects of MODEL (or its experts of layers A..B) be evicted\n"
             "again.  The spine and small files stay pinned by kind.",
    .opts = pin_opts,
};

/* Keys of the cached objects of a model, from the index, for PIN. */
typedef struct keyset {
    shoal_key *v;
    char     **names;
    size_t     n, cap;
    int32_t    lf, ll;
} keyset;

static int key_add(const cache_entry *e, void *ctx)
{
    keyset *k = ctx;
    shoal_key key;
    const char *nm = NULL;
    memset(&key, 0, sizeof key);
    if (e->kind == CACHE_KIND_EXPERT && e->layer >= 0 && e->expert >= 0) {
        if (k->lf >= 0 && (e->layer < k->lf || e->layer > k->ll))
            return 0;
        key.kind = SHOAL_KEY_EXPERT;
        key.layer = (uint16_t)e->layer;
        key.expert = (uint32_t)e->expert;
    } else if (k->lf >= 0) {
        return 0;
    } else if (e->kind == CACHE_KIND_SPINE && e->tensor && *e->tensor) {
        key.kind = SHOAL_KEY_TENSOR;
        nm = e->tensor;
    } else if (e->kind == CACHE_KIND_SMALL && e->file && *e->file) {
        key.kind = SHOAL_KEY_FILE;
        nm = e->file;
    } else if (e->kind == CACHE_KIND_DERIVED && e->file && *e->file) {
        key.kind = SHOAL_KEY_DERIVED;   /* PUT objects (the spine pack) too */
        nm = e->file;
    } else {
        return 0;
    }
    if (k->n == k->cap) {
        size_t nc = k->cap ? k->cap * 2 : 256;
        shoal_key *p = realloc(k->v, nc * sizeof *p);
        char **q = realloc(k->names, nc * sizeof *q);
        if (p)
            k->v = p;
        if (q)
            k->names = q;
        if (!p || !q)
            return SHOAL_ENOMEM;
        k->cap = nc;
    }
    k->names[k->n] = nm ? strdup(nm) : NULL;
    key.name = k->names[k->n];
    key.name_len = (uint16_t)(nm ? strlen(nm) : 0);
    k->v[k->n++] = key;
    return 0;
}

static void keyset_free(keyset *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->names[i]);
    free(k->names);
    free(k->v);
}

/* Through shoald: OPEN the model, PIN its cached objects' keys in batches. */
static int pin_live(const shoal_cli *cli, shoal_client *cl, const char *spec, int on,
                    int32_t lf, int32_t ll, uint64_t *changed, shoal_err *err)
{
    keyset k = { NULL, NULL, 0, 0, lf, ll };
    cache *ca = NULL;
    shoal_model_info mi;
    int rc = cli_cache_reader(cli, &ca, err);

    /* The model ids of this spec, then their entries. */
    if (rc == 0) {
        shoal_buf b;
        shoal_json *j = NULL;
        shoal_buf_init(&b, 0);
        rc = cache_report_models(ca, spec, &b, err);
        if (rc == 0 && (j = shoal_json_parse((const char *)b.data, b.len, err))) {
            shoal_json *ms = shoal_json_get(j, "models");
            for (size_t i = 0; rc == 0 && i < shoal_json_array_size(ms); i++)
                rc = cache_list(ca, jint(shoal_json_array_at(ms, i), "id", 0), key_add, &k, err);
        }
        shoal_json_free(j);
        shoal_buf_free(&b);
    }
    cache_close(ca);
    memset(&mi, 0, sizeof mi);
    mi.manifest_fd = -1;
    if (rc == 0)
        rc = shoal_client_open(cl, spec, &mi, err);
    if (mi.manifest_fd >= 0)
        close(mi.manifest_fd);
    for (size_t at = 0; rc == 0 && at < k.n; at += SHOAL_PROTO_MAX_KEYS) {
        size_t n = k.n - at < SHOAL_PROTO_MAX_KEYS ? k.n - at : SHOAL_PROTO_MAX_KEYS;
        rc = shoal_client_pin(cl, mi.handle, on, k.v + at, n, err);
        if (rc == 0)
            *changed += n;
    }
    keyset_free(&k);
    return rc;
}

static int pin_cmd(shoal_cli *cli, int argc, char **argv, int on)
{
    const shoal_cli_spec *sp = on ? &cmd_pin_spec : &cmd_unpin_spec;
    int32_t lf = -1, ll = -1;
    int id, rc;
    char spec[SHOAL_PATH_MAX];
    uint64_t changed = 0;
    shoal_err err = { 0, "" };
    shoal_client *cl = NULL;
    shoal_cli_parser p;
    const char *v;

    shoal_cli_begin(&p, sp, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        int a, b, n = 0;
        if (sscanf(v, "%d-%d%n", &a, &b, &n) != 2 || v[n] || a < 0 || b < a)
            return shoal_cli_bad_value(&p, v, "A-B (0-based, A <= B)");
        lf = a;
        ll = b;
    }
    if (id < 0)
        return p.exit;
    if (p.optind != argc - 1)
        return shoal_cli_usage_error(sp, "give one MODEL");
    if ((rc = cli_model_arg(sp, argv[p.optind], spec, sizeof spec)) != 0)
        return rc;
    rc = cli_connect(cli, &cl, &err);
    if (rc == 0) {
        rc = pin_live(cli, cl, spec, on, lf, ll, &changed, &err);
        shoal_client_close(cl);
    } else if (rc == SHOAL_ENET) {
        cache *ca = NULL;
        shoal_err_clear(&err);
        rc = cli_cache_writer(cli, &ca, &err);
        if (rc == 0)
            rc = cache_model_pin(ca, spec, on, lf, ll, &changed, &err);
        cache_close(ca);
    }
    if (rc)
        return cli_fail(rc, &err);
    printf("%s %llu objects of %s\n", on ? "Pinned" : "Unpinned", (unsigned long long)changed, spec);
    return EXIT_OK_;
}

int cmd_pin(shoal_cli *cli, int argc, char **argv) { return pin_cmd(cli, argc, argv, 1); }
int cmd_unpin(shoal_cli *cli, int argc, char **argv) { return pin_cmd(cli, argc, argv, 0); }

/* ---- rm ------------------------------------------------------------------------------- */

static const shoal_cli_opt rm_opts[] = {
    { "json", 0, NULL, O_JSON, "the result as JSON (docs/stats-json.md, \"shoal.rm\")" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_rm_spec = {
    .prog = "shoal rm",
    .synopsis = "shoal rm MODEL [--json]",
    .about = "Remove every cached object of MODEL (objects another model also uses stay),\n"
             "with its records and counters.  Through shoald when it runs (refused, exit 6,\n"
             "while an engine or a warm job holds the model); else on the cache itself.",
    .opts = rm_opts,
};

int cmd_rm(shoal_cli *cli, int argc, char **argv)
{
    int json = 0, id, rc;
    char spec[SHOAL_PATH_MAX], x[FMT_MAX];
    shoal_err err = { 0, "" };
    shoal_client *cl = NULL;
    cache *ca = NULL;
    shoal_buf b;
    shoal_json *j = NULL;
    shoal_cli_parser p;
    const char *v;

    shoal_cli_begin(&p, &cmd_rm_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0)
        json = 1;
    if (id < 0)
        return p.exit;
    if (p.optind != argc - 1)
        return shoal_cli_usage_error(&cmd_rm_spec, "give one MODEL");
    if ((rc = cli_model_arg(&cmd_rm_spec, argv[p.optind], spec, sizeof spec)) != 0)
        return rc;
    shoal_buf_init(&b, 0);
    rc = cli_connect(cli, &cl, &err);
    if (rc == 0) {
        rc = shoal_client_rm(cl, spec, &b, &err);
        shoal_client_close(cl);
    } else if (rc == SHOAL_ENET) {
        shoal_err_clear(&err);
        rc = cli_cache_writer(cli, &ca, &err);
        if (rc == 0)
            rc = cache_report_rm(ca, spec, &b, &err);
        cache_close(ca);
    }
    rc = cli_json_take(rc, &b, &j, &err);
    if (rc == SHOAL_EBUSY) {   /* shoald: an engine or a job holds it */
        fprintf(stderr, "shoal rm: %s\n", err.msg);
        return EXIT_BUSY;
    }
    if (rc)
        return cli_fail(rc, &err);
    if (json) {
        cli_json_print(j);
    } else {
        shoal_json *ms = shoal_json_get(j, "models");
        for (size_t i = 0; ms && i < shoal_json_array_size(ms); i++) {
            char name[512];
            stats_model_name(shoal_json_array_at(ms, i), name, sizeof name);
            printf("Removed %s\n", name);
        }
        printf("Freed %s (%lld objects); %lld shared with other models kept\n",
               fmt_size((uint64_t)jint(j, "bytes_freed", 0), x),
               (long long)jint(j, "objects_removed", 0),
               (long long)jint(j, "objects_kept_shared", 0));
    }
    shoal_json_free(j);
    return EXIT_OK_;
}
