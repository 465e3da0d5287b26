/* gc.c — `shoal gc`, `pin`, `unpin` and `rm`: the commands that change
 * what the cache keeps.  Through shoald when it runs (GC, PIN: a GC runs
 * in steps there, its PROGRESS shown on a terminal); when it does not, on
 * the cache as its one writer.
 */
#include "tools/shoal/shoal_int.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- gc ------------------------------------------------------------------------- */

static const char gc_help[] =
    "usage: shoal gc [--max-size SIZE] [--json]\n"
    "\n"
    "Evict the least valuable unpinned objects (the cache's eviction policy:\n"
    "recency, frequency, per-layer fairness) until the cache holds at most SIZE\n"
    "(\"500G\", \"1.5TiB\"; default: its budget).  Pinned objects stay.\n";

int cmd_gc(shoal_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        { "max-size", required_argument, NULL, 'm' }, { "json", no_argument, NULL, 'j' },
        { "help", no_argument, NULL, 'h' }, { NULL, 0, NULL, 0 } };
    uint64_t max = 0;
    int json = 0, c, rc;
    shoal_err err = { 0, "" };
    shoal_client *cl = NULL;
    shoal_buf b;
    shoal_json *j = NULL;
    char x[FMT_MAX], y[FMT_MAX], z[FMT_MAX];

    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm':
            if (shoal_size_parse(optarg, &max) != 0 || max == 0) {
                fprintf(stderr, "shoal gc: --max-size takes a size such as 500G or 1.5TiB, "
                        "not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            break;
        case 'j': json = 1; break;
        case 'h': fputs(gc_help, stdout); return EXIT_OK_;
        default: fputs(gc_help, stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fputs(gc_help, stderr);
        return EXIT_USAGE;
    }
    shoal_buf_init(&b, 0);
    rc = cli_connect(cli, &cl, &err);
    if (rc == 0) {
        shoal_client_on_progress(cl, cli_show_progress, NULL);
        rc = shoal_client_gc(cl, max, &b, &err);
        cli_progress_end();
        shoal_client_close(cl);
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

static const char pin_help[] =
    "usage: shoal pin|unpin MODEL [--layers A-B]\n"
    "\n"
    "Pin (keep from eviction) or unpin every cached object of MODEL, or only its\n"
    "experts of layers A..B.  The spine and small files are always pinned.\n";

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
    static const struct option opts[] = {
        { "layers", required_argument, NULL, 'l' }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 } };
    int32_t lf = -1, ll = -1;
    int c, rc;
    char spec[SHOAL_PATH_MAX];
    uint64_t changed = 0;
    shoal_err err = { 0, "" };
    shoal_client *cl = NULL;

    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'l': {
            int a, b, n = 0;
            if (sscanf(optarg, "%d-%d%n", &a, &b, &n) != 2 || optarg[n] || a < 0 || b < a) {
                fprintf(stderr, "shoal: --layers takes A-B (0-based, A <= B), not '%s'\n", optarg);
                return EXIT_USAGE;
            }
            lf = a;
            ll = b;
            break;
        }
        case 'h': fputs(pin_help, stdout); return EXIT_OK_;
        default: fputs(pin_help, stderr); return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fputs(pin_help, stderr);
        return EXIT_USAGE;
    }
    cli_model_spec(argv[optind], spec, sizeof spec);
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

static const char rm_help[] =
    "usage: shoal rm MODEL [--json]\n"
    "\n"
    "Remove every cached object of MODEL (objects another model also uses stay),\n"
    "with its records and counters.  shoald must not be running (the protocol has\n"
    "no remove request): stop it, run `shoal rm`, start it again.\n";

int cmd_rm(shoal_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        { "json", no_argument, NULL, 'j' }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 } };
    int json = 0, c, rc;
    char spec[SHOAL_PATH_MAX], x[FMT_MAX];
    shoal_err err = { 0, "" };
    shoal_client *cl = NULL;
    cache *ca = NULL;
    shoal_buf b;
    shoal_json *j = NULL;

    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = 1; break;
        case 'h': fputs(rm_help, stdout); return EXIT_OK_;
        default: fputs(rm_help, stderr); return EXIT_USAGE;
        }
    }
    if (optind != argc - 1) {
        fputs(rm_help, stderr);
        return EXIT_USAGE;
    }
    cli_model_spec(argv[optind], spec, sizeof spec);
    if (cli_connect(cli, &cl, &err) == 0) {
        shoal_client_close(cl);
        fprintf(stderr, "shoal rm: shoald is running on %s; stop it first (the protocol has no "
                "remove request yet), then run `shoal rm %s` again\n", cli->home, spec);
        return EXIT_BUSY;
    }
    shoal_err_clear(&err);
    shoal_buf_init(&b, 0);
    rc = cli_cache_writer(cli, &ca, &err);
    if (rc == 0)
        rc = cache_report_rm(ca, spec, &b, &err);
    cache_close(ca);
    rc = cli_json_take(rc, &b, &j, &err);
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
