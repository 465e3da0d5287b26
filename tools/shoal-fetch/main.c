/* main.c — shoal-fetch: fetch a model's manifest, spine and experts from a
 * Hub (or a snapshot directory) into a shoal cache.
 *
 * The program edge of fetcher/fetch.h until the daemon exists: reads
 * HF_ENDPOINT and the token here, opens the cache, builds or loads the
 * manifest, runs a session on the blocking poll loop with a progress bar on
 * stderr, and prints a summary.  Ctrl-C pauses the writers, so a rerun
 * resumes.  See docs/fetcher.md.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/cli.h"
#include "common/hfenv.h"
#include "cache/cache.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/path.h"
#include "common/progress.h"
#include "common/sys.h"
#include "fetcher/fetch.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

enum {
    OPT_HOME = 1, OPT_MANIFEST, OPT_SPINE, OPT_SMALL, OPT_EXPERTS, OPT_PARALLEL, OPT_COALESCE,
    OPT_SPLIT_MIN, OPT_STALL, OPT_BACKOFF, OPT_ATTEMPTS, OPT_SEED, OPT_NO_FSYNC, OPT_MAX_SIZE,
    OPT_VERIFY, OPT_PROGRESS, OPT_QUIET, OPT_JSON, OPT_NO_TOKEN, OPT_VERBOSE,
};

static const shoal_cli_opt OPTS[] = {
    { "home", 0, "DIR", OPT_HOME, "the cache directory (default $SHOAL_HOME, else\n"
                                  "$XDG_CACHE_HOME/shoal, else ~/.cache/shoal)" },
    { "manifest", 0, NULL, OPT_MANIFEST, "build or load the manifest and describe it" },
    { "spine", 0, NULL, OPT_SPINE, "fetch every spine tensor (and the small files)" },
    { "small", 0, NULL, OPT_SMALL, "fetch the small files (config, index, tokenizer)" },
    { "experts", 0, "SEL", OPT_EXPERTS, "all | layers:A-B | L:E,L:E,..." },
    { "parallel", 0, "N", OPT_PARALLEL, "transfers at once (default 8)" },
    { "coalesce", 0, "SIZE", OPT_COALESCE, "longest merged request (default 64MiB; 1 = never merge)" },
    { "split-min", 0, "SIZE", OPT_SPLIT_MIN, "smallest part when one object goes over several\n"
                                             "connections (default 2MiB; 0 = never split)" },
    { "stall-timeout", 0, "S", OPT_STALL, "retry a transfer silent for S seconds (default 30)" },
    { "backoff-ms", 0, "N", OPT_BACKOFF, "first retry delay (default 1000; doubles to 8000)" },
    { "max-attempts", 0, "N", OPT_ATTEMPTS, "failures in a row without progress (default 8)" },
    { "seed", 0, "N", OPT_SEED, "jitter seed (tests)" },
    { "no-fsync", 0, NULL, OPT_NO_FSYNC, "skip fsyncs in the cache (benchmarks)" },
    { "max-size", 0, "SIZE", OPT_MAX_SIZE, "the cache's byte budget (default: a share of the disk)" },
    { "verify-against", 0, "DIR", OPT_VERIFY, "after fetching, compare every selected object in the\n"
                                              "cache with the same bytes of DIR's files" },
    { "progress", 0, NULL, OPT_PROGRESS, "progress on stderr when it is not a terminal too (a\n"
                                         "line every 5 s; a terminal gets a bar by default)" },
    { "quiet", 'q', NULL, OPT_QUIET, "no progress (also HF_HUB_DISABLE_PROGRESS_BARS=1)" },
    { "json", 0, NULL, OPT_JSON, "the summary as one JSON object" },
    { "no-token", 0, NULL, OPT_NO_TOKEN, "send no token" },
    { "verbose", 'v', NULL, OPT_VERBOSE, "debug logging on stderr" },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec SPEC = {
    .prog = "shoal-fetch",
    .summary = "fetch a model's manifest, spine and experts into a shoal cache",
    .synopsis = "shoal-fetch [options] MODEL",
    .about = "MODEL is hf://org/name[@revision] (endpoint $HF_ENDPOINT, default\n"
             "https://huggingface.co) or a snapshot directory (a path or file://DIR).  It\n"
             "opens the cache as its one writer: while shoald runs, use `shoal warm`\n"
             "instead (shoald owns the cache).",
    .opts = OPTS,
    .notes = "The token comes from HF_TOKEN, HUGGING_FACE_HUB_TOKEN, or $HF_TOKEN_PATH\n"
             "(default $HF_HOME/token, ~/.cache/huggingface/token); it goes to the\n"
             "endpoint's host only.  Ctrl-C pauses: a rerun continues where it stopped.",
    .man_extra = ".SH ENVIRONMENT\n"
                 "HF_ENDPOINT, HF_TOKEN, HUGGING_FACE_HUB_TOKEN, HF_TOKEN_PATH, HF_HOME,\n"
                 "SHOAL_HOME, XDG_CACHE_HOME; NO_COLOR, HF_HUB_DISABLE_PROGRESS_BARS.\n"
                 ".SH \"SEE ALSO\"\nshoal(1), shoald(8)\n",
};

static int parse_experts(const char *s, fetch_selection *sel, int32_t **pairs)
{
    char *end;
    size_t cap = 0;
    if (strcmp(s, "all") == 0) {
        sel->all_experts = 1;
        return 0;
    }
    if (strncmp(s, "layers:", 7) == 0) {
        long a, b;
        errno = 0;
        a = strtol(s + 7, &end, 10);
        if (errno || end == s + 7 || *end != '-' || a < 0)
            return -1;
        b = strtol(end + 1, &end, 10);
        if (errno || *end || b < a || b > INT32_MAX)
            return -1;
        sel->layer_first = (int32_t)a;
        sel->layer_last = (int32_t)b;
        return 0;
    }
    while (*s) {
        long l, e;
        errno = 0;
        l = strtol(s, &end, 10);
        if (errno || end == s || *end != ':' || l < 0 || l > INT32_MAX)
            return -1;
        s = end + 1;
        e = strtol(s, &end, 10);
        if (errno || end == s || (*end && *end != ',') || e < 0 || e > INT32_MAX)
            return -1;
        if (sel->npairs * 2 + 2 > cap) {
            int32_t *p = realloc(*pairs, (cap = cap * 2 + 16) * sizeof *p);
            if (!p)
                return -1;
            *pairs = p;
        }
        (*pairs)[sel->npairs * 2] = (int32_t)l;
        (*pairs)[sel->npairs * 2 + 1] = (int32_t)e;
        sel->npairs++;
        s = *end ? end + 1 : end;
    }
    sel->pairs = *pairs;
    return sel->npairs ? 0 : -1;
}

static void on_progress(const fetch_progress *p, void *ctx)
{
    char extra[96];
    snprintf(extra, sizeof extra, "%" PRIu64 "/%" PRIu64 " objects  %" PRIu64 " retries",
             p->objects_done, p->objects_total, p->retries);
    shoal_meter_update(ctx, NULL, p->bytes_done, p->bytes_total, extra);
    if (p->finished)
        shoal_meter_end(ctx, extra);
}

/* Compare every item with the same bytes of DIR's files.  Number of
 * mismatches (missing objects count). */
static long verify_against(cache *c, const manifest *m, const fetch_item *it, size_t n,
                           const char *dir)
{
    long bad = 0;
    size_t bufsz = 4u << 20;
    uint8_t *a = malloc(bufsz), *b = malloc(bufsz);
    if (!a || !b) {
        free(a);
        free(b);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        cache_key key = { m->files[it[i].file].etag, it[i].offset, it[i].length };
        cache_obj o;
        char path[SHOAL_PATH_MAX];
        int fd;
        if (cache_lookup(c, &key, NULL, &o, NULL) != 0) {
            fprintf(stderr, "shoal-fetch: verify: %s @%" PRIu64 "+%" PRIu64 " is not cached\n",
                    m->files[it[i].file].path, it[i].offset, it[i].length);
            bad++;
            continue;
        }
        snprintf(path, sizeof path, "%s/%s", dir, m->files[it[i].file].path);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        for (uint64_t off = 0; fd >= 0 && off < it[i].length; off += bufsz) {
            size_t k = it[i].length - off < bufsz ? (size_t)(it[i].length - off) : bufsz;
            if (o.length != it[i].length || shoal_pread_all(o.fd, a, k, (off_t)off)
                || shoal_pread_all(fd, b, k, (off_t)(it[i].offset + off)) || memcmp(a, b, k)) {
                fprintf(stderr, "shoal-fetch: verify: %s @%" PRIu64 "+%" PRIu64
                        " differs from %s\n", m->files[it[i].file].path, it[i].offset,
                        it[i].length, path);
                bad++;
                break;
            }
        }
        if (fd < 0) {
            fprintf(stderr, "shoal-fetch: verify: cannot open %s\n", path);
            bad++;
        } else {
            close(fd);
        }
        close(o.fd);
    }
    free(a);
    free(b);
    return bad;
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6
           + (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void describe_manifest(const manifest *m, int json, int from_cache)
{
    uint64_t spine = 0;
    for (size_t i = 0; i < m->ntensors; i++)
        spine += m->tensors[i].length;
    if (json)
        return;
    printf("manifest  %s %s@%s commit %s (%s)\n", m->endpoint[0] ? m->endpoint : "file://",
           m->repo, m->revision, m->commit, from_cache ? "from the cache" : "built");
    printf("files     %zu\ntensors   %zu (%" PRIu64 " bytes of spine)\n", m->nfiles, m->ntensors,
           spine);
    printf("experts   %zu x %" PRIu64 " bytes (%" PRIu32 " layers x %" PRIu32 " per MoE layer)\n",
           m->nexperts, m->expert_bytes, m->n_layers, m->experts_per_layer);
}

static void print_summary(const fetch_upstream *u, const manifest *m, int from_cache, int json,
                          int rc, double secs, double cpu)
{
    fetch_stats st;
    fetch_upstream_stats(u, &st);
    if (json) {
        printf("{\"commit\":\"%s\",\"files\":%zu,\"tensors\":%zu,\"experts\":%zu,"
               "\"manifest_from_cache\":%s,\"objects\":%" PRIu64 ",\"objects_cached\":%" PRIu64
               ",\"objects_fetched\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"bytes_fetched\":%" PRIu64
               ",\"requests\":%" PRIu64 ",\"resolves\":%" PRIu64 ",\"retries\":%" PRIu64
               ",\"refused\":%" PRIu64 ",\"resumed\":%" PRIu64 ",\"seconds\":%.3f"
               ",\"cpu_seconds\":%.3f,\"status\":%d}\n",
               fetch_upstream_commit(u), m->nfiles, m->ntensors, m->nexperts,
               from_cache ? "true" : "false", st.objects_total, st.objects_cached,
               st.objects_fetched, st.bytes_total, st.bytes_fetched, st.requests, st.resolves,
               st.retries, st.refused, st.resumed, secs, cpu, rc);
    } else {
        char sz[32], rt[32];
        shoal_size_format(st.bytes_fetched, sz, sizeof sz);
        shoal_size_format(secs > 0 ? (uint64_t)((double)st.bytes_fetched / secs) : 0, rt, sizeof rt);
        printf("objects   %" PRIu64 " asked, %" PRIu64 " already cached, %" PRIu64 " fetched\n",
               st.objects_total, st.objects_cached, st.objects_fetched);
        printf("bytes     %s fetched in %.2f s (%s/s)\n", sz, secs, rt);
        printf("requests  %" PRIu64 " (%" PRIu64 " resolves, %" PRIu64 " retries, %" PRIu64
               " refused answers, %" PRIu64 " resumed mid-object)\n", st.requests, st.resolves,
               st.retries, st.refused, st.resumed);
        printf("cpu       %.2f s", cpu);
        if (st.bytes_fetched > 0)
            printf(" (%.2f s/GB)", cpu / ((double)st.bytes_fetched / 1e9));
        printf("\n");
    }
}

/* The command line. */
typedef struct args {
    const char *home_flag, *model, *experts, *verify_dir;
    int want_manifest, spine, small, json, progress_bar, quiet, no_token, no_fsync;
    uint64_t max_size;        /* cache budget; 0: the cache's default */
} args;

/* A numeric option (the parallel ones, timeouts, the seed) into fo. */
static int set_number(const shoal_cli_parser *p, int id, const char *val, fetch_options *fo)
{
    long v;
    if (shoal_long_parse(val, 1, 1000000000L, &v) != 0)
        return shoal_cli_bad_value(p, val, "a whole number, 1..1000000000");
    switch (id) {
    case OPT_PARALLEL: fo->parallel = (int)v; break;
    case OPT_STALL:    fo->stall_secs = v; break;
    case OPT_BACKOFF:  fo->backoff_ms = v; break;
    case OPT_ATTEMPTS: fo->max_attempts = (int)v; break;
    default:           fo->seed = (uint32_t)v; break;
    }
    return 0;
}

/* Parse argv into a and fo.  -1: go on; otherwise the exit status. */
static int parse_args(int argc, char **argv, args *a, fetch_options *fo)
{
    shoal_cli_parser p;
    const char *v;
    int id, rc;

    shoal_cli_begin(&p, &SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case OPT_MANIFEST: a->want_manifest = 1; break;
        case OPT_SPINE:    a->spine = a->small = 1; break;
        case OPT_SMALL:    a->small = 1; break;
        case OPT_JSON:     a->json = 1; break;
        case OPT_PROGRESS: a->progress_bar = 1; break;
        case OPT_QUIET:    a->quiet = 1; break;
        case OPT_NO_TOKEN: a->no_token = 1; break;
        case OPT_NO_FSYNC: a->no_fsync = 1; break;
        case OPT_VERBOSE:  shoal_log_set_level(SHOAL_LOG_DEBUG); break;
        case OPT_HOME:     a->home_flag = v; break;
        case OPT_EXPERTS:  a->experts = v; break;
        case OPT_VERIFY:   a->verify_dir = v; break;
        case OPT_MAX_SIZE:
            if (shoal_size_parse(v, &a->max_size) || a->max_size == 0)
                return shoal_cli_bad_value(&p, v, "a size (500G, 1.5TiB)");
            break;
        case OPT_SPLIT_MIN:
            if (shoal_size_parse(v, &fo->split_min))
                return shoal_cli_bad_value(&p, v, "a size (2M; 0 = never split)");
            if (fo->split_min == 0)
                fo->split_min = FETCH_SPLIT_NEVER;
            break;
        case OPT_COALESCE:
            if (shoal_size_parse(v, &fo->coalesce_bytes) || fo->coalesce_bytes == 0)
                return shoal_cli_bad_value(&p, v, "a size (64M; 1 = never merge)");
            break;
        default:
            if ((rc = set_number(&p, id, v, fo)) != 0)
                return rc;
        }
    }
    if (id < 0)
        return p.exit;
    if (argc - p.optind != 1)
        return shoal_cli_usage_error(&SPEC, argc == p.optind ? "give a MODEL"
                                     : "one MODEL at a time");
    a->model = argv[p.optind];
    return -1;
}

int main(int argc, char **argv)
{
    int rc = 1, from_cache = 0, r;
    args a;
    fetch_options fo;
    fetch_selection sel = { 0, 0, 0, -1, -1, NULL, 0 };
    int32_t *pairs = NULL;
    char home[SHOAL_PATH_MAX], *token = NULL;
    shoal_hf_env hfe;
    shoal_env env;
    cache_config cc;
    cache *c = NULL;
    fetch_upstream *u = NULL;
    manifest *m = NULL;
    fetch_item *items = NULL;
    size_t nitems = 0;
    fetch_poll *loop = NULL;
    fetch_session *s = NULL;
    shoal_err err;
    shoal_meter_cfg mc;
    shoal_meter meter;
    uint64_t t0;
    double cpu0;

    memset(&fo, 0, sizeof fo);
    memset(&a, 0, sizeof a);
    shoal_err_clear(&err);
    shoal_log_setup("shoal-fetch", SHOAL_LOG_WARN, NULL);
    r = parse_args(argc, argv, &a, &fo);
    if (r >= 0)
        return r;
    if (a.experts && parse_experts(a.experts, &sel, &pairs)) {
        free(pairs);
        return shoal_cli_usage_error(&SPEC, "--experts wants all, layers:A-B or L:E,L:E,... "
                                     "(got '%s')", a.experts);
    }
    /* by default on a terminal only: a script asks with --progress */
    shoal_meter_env_capture(&mc, a.quiet || (!a.progress_bar && !isatty(STDERR_FILENO)));
    shoal_meter_init(&meter, stderr, &mc, "fetch", SHOAL_METER_BYTES);
    sel.spine = a.spine;
    sel.small = a.small;
    shoal_env_capture(&env);
    shoal_hf_env_capture(&hfe);
    if (shoal_home_resolve(&env, a.home_flag, home, sizeof home, &err)
        || shoal_mkdir_p(home, 0700, &err)) {
        fprintf(stderr, "shoal-fetch: %s\n", err.msg);
        free(pairs);
        return SHOAL_EXIT_USAGE;
    }
    fo.model = a.model;
    fo.endpoint = hfe.endpoint;
    fo.offline = shoal_hf_offline(&hfe);   /* the cache only: EOFFLINE, exit 7 */
    token = a.no_token ? NULL : shoal_hf_token(&hfe);
    fo.token = token;
    cache_config_default(&cc);
    cc.no_fsync = a.no_fsync;
    if (a.max_size)
        cc.max_bytes = a.max_size;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    t0 = shoal_now_ns();
    cpu0 = cpu_seconds();
    if (cache_open(home, &cc, &c, NULL, &err) == SHOAL_ELOCKED) {
        fprintf(stderr, "shoal-fetch: shoald owns the cache %s: use `shoal --home %s warm %s` "
                "(it fetches through shoald), or stop shoald first\n", home, home, a.model);
        rc = SHOAL_EXIT_BUSY;
        goto out;
    }
    if (err.code || fetch_upstream_open(&fo, c, &u, &err)
        || fetch_manifest_get(u, c, &m, &from_cache, &err)) {
        fprintf(stderr, "shoal-fetch: %s\n", err.msg);
        rc = shoal_exit_for(err.code);
        goto out;
    }
    if (a.want_manifest)
        describe_manifest(m, a.json, from_cache);
    if (fetch_select(m, &sel, &items, &nitems, &err)) {
        fprintf(stderr, "shoal-fetch: %s\n", err.msg);
        rc = shoal_exit_for(err.code);
        goto out;
    }
    if (nitems > 0) {
        if (fetch_poll_new(&loop, &err)
            || fetch_session_new(u, c, m, fetch_poll_ops(), loop, &s, &err)) {
            fprintf(stderr, "shoal-fetch: %s\n", err.msg);
            goto out;
        }
        fetch_session_on_progress(s, on_progress, &meter, 250);
        if (fetch_session_add(s, items, nitems, &err) || fetch_poll_run(loop, s, &g_stop, &err)) {
            shoal_meter_clear(&meter);
            fprintf(stderr, "shoal-fetch: %s\n", err.msg);
            rc = shoal_exit_for(err.code);
            goto summary;
        }
    }
    rc = 0;
    if (a.verify_dir) {
        long bad = verify_against(c, m, items, nitems, a.verify_dir);
        if (bad != 0) {
            fprintf(stderr, "shoal-fetch: verify: %ld of %zu objects differ or are missing\n",
                    bad, nitems);
            rc = SHOAL_EXIT_DAMAGED;
        } else if (!a.json) {
            printf("verified  %zu objects byte-identical to %s\n", nitems, a.verify_dir);
        }
    }
summary:
    print_summary(u, m, from_cache, a.json, rc, (double)(shoal_now_ns() - t0) / 1e9,
                  cpu_seconds() - cpu0);
out:
    fetch_session_free(s);
    fetch_poll_free(loop);
    free(items);
    manifest_free(m);
    fetch_upstream_free(u);
    cache_close(c);
    free(pairs);
    if (token) {
        memset(token, 0, strlen(token));
        free(token);
    }
    return rc;
}
