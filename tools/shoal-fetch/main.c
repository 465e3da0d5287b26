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
#include "common/hfenv.h"
#include "cache/cache.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/path.h"
#include "common/sys.h"
#include "fetcher/fetch.h"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
"usage: shoal-fetch [options] MODEL\n"
"\n"
"MODEL is hf://org/name[@revision] (endpoint $HF_ENDPOINT, default\n"
"https://huggingface.co) or a snapshot directory (a path or file://DIR).\n"
"\n"
"  --home DIR           the cache directory (default $SHOAL_HOME, ~/.cache/shoal)\n"
"  --manifest           build or load the manifest and describe it\n"
"  --spine              fetch every spine tensor (and the small files)\n"
"  --small              fetch the small files (config, index, tokenizer)\n"
"  --experts SEL        all | layers:A-B | L:E,L:E,...\n"
"  --parallel N         transfers at once (default 8)\n"
"  --coalesce SIZE      longest merged request (default 64MiB; 1 = never merge)\n"
"  --split-min SIZE     smallest part when one object goes over several\n"
"                       connections (default 2MiB; 0 = never split)\n"
"  --stall-timeout S    retry a transfer silent for S seconds (default 30)\n"
"  --backoff-ms N       first retry delay (default 1000; doubles to 8000)\n"
"  --max-attempts N     failures in a row without progress (default 8)\n"
"  --seed N             jitter seed (tests)\n"
"  --no-fsync           skip fsyncs in the cache (benchmarks)\n"
"  --max-size SIZE      the cache's byte budget (default: a share of the disk)\n"
"  --verify-against DIR after fetching, compare every selected object in the\n"
"                       cache with the same bytes of DIR's files\n"
"  --progress           a progress bar on stderr\n"
"  --json               the summary as one JSON object\n"
"  --no-token           send no token\n"
"  -v                   debug logging on stderr\n"
"\n"
"The token comes from HF_TOKEN, HUGGING_FACE_HUB_TOKEN, or $HF_TOKEN_PATH\n"
"(default $HF_HOME/token, ~/.cache/huggingface/token); it goes to the\n"
"endpoint's host only.  Ctrl-C pauses: a rerun continues where it stopped.\n"
"Exit status: 0 done, 1 failed, 2 bad usage, 130 interrupted.\n");
}

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

typedef struct bar {
    int      on;
    uint64_t start_ns;
} bar;

static void on_progress(const fetch_progress *p, void *ctx)
{
    bar *b = ctx;
    char done[32], total[32], rate[32];
    double eta = p->rate > 0 ? (double)(p->bytes_total - p->bytes_done) / p->rate : -1;
    int width = 30, fill = p->bytes_total ? (int)((double)p->bytes_done * width / (double)p->bytes_total) : width;
    char line[64], eta_s[32];

    if (!b->on)
        return;
    for (int i = 0; i < width; i++)
        line[i] = i < fill ? '#' : '.';
    line[width] = '\0';
    shoal_size_format(p->bytes_done, done, sizeof done);
    shoal_size_format(p->bytes_total, total, sizeof total);
    shoal_size_format((uint64_t)p->rate, rate, sizeof rate);
    if (eta < 0)
        snprintf(eta_s, sizeof eta_s, "?");
    else
        snprintf(eta_s, sizeof eta_s, "%.0fs", eta);
    fprintf(stderr, "\r[%s] %s / %s  %s/s  %" PRIu64 "/%" PRIu64 " objects  %" PRIu64
            " retries  ETA %s   ", line, done, total, rate, p->objects_done, p->objects_total,
            p->retries, eta_s);
    if (p->finished)
        fputc('\n', stderr);
    fflush(stderr);
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
    int want_manifest, spine, small, json, progress_bar, no_token, no_fsync;
    uint64_t max_size;        /* cache budget; 0: the cache's default */
} args;

/* Parse argv into a and fo.  -1: go on; otherwise the exit status. */
static int parse_args(int argc, char **argv, args *a, fetch_options *fo)
{
    for (int i = 1; i < argc; i++) {
        const char *x = argv[i];
        int has = i + 1 < argc;
        char *end = NULL;
        if (strcmp(x, "--help") == 0 || strcmp(x, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(x, "--manifest") == 0) {
            a->want_manifest = 1;
        } else if (strcmp(x, "--spine") == 0) {
            a->spine = a->small = 1;
        } else if (strcmp(x, "--small") == 0) {
            a->small = 1;
        } else if (strcmp(x, "--json") == 0) {
            a->json = 1;
        } else if (strcmp(x, "--progress") == 0) {
            a->progress_bar = 1;
        } else if (strcmp(x, "--no-token") == 0) {
            a->no_token = 1;
        } else if (strcmp(x, "--no-fsync") == 0) {
            a->no_fsync = 1;
        } else if (strcmp(x, "-v") == 0) {
            shoal_log_set_level(SHOAL_LOG_DEBUG);
        } else if (has && strcmp(x, "--home") == 0) {
            a->home_flag = argv[++i];
        } else if (has && strcmp(x, "--experts") == 0) {
            a->experts = argv[++i];
        } else if (has && strcmp(x, "--verify-against") == 0) {
            a->verify_dir = argv[++i];
        } else if (has && strcmp(x, "--max-size") == 0) {
            if (shoal_size_parse(argv[++i], &a->max_size) || a->max_size == 0) {
                fprintf(stderr, "shoal-fetch: bad --max-size '%s'\n", argv[i]);
                return 2;
            }
        } else if (has && strcmp(x, "--split-min") == 0) {
            if (shoal_size_parse(argv[++i], &fo->split_min)) {
                fprintf(stderr, "shoal-fetch: bad --split-min '%s'\n", argv[i]);
                return 2;
            }
            if (fo->split_min == 0)
                fo->split_min = FETCH_SPLIT_NEVER;
        } else if (has && strcmp(x, "--coalesce") == 0) {
            if (shoal_size_parse(argv[++i], &fo->coalesce_bytes) || fo->coalesce_bytes == 0) {
                fprintf(stderr, "shoal-fetch: bad --coalesce '%s'\n", argv[i]);
                return 2;
            }
        } else if (has && (strcmp(x, "--parallel") == 0 || strcmp(x, "--stall-timeout") == 0
                           || strcmp(x, "--backoff-ms") == 0 || strcmp(x, "--max-attempts") == 0
                           || strcmp(x, "--seed") == 0)) {
            long v;
            errno = 0;
            v = strtol(argv[++i], &end, 10);
            if (errno || *end || v <= 0 || v > 1000000000L) {
                fprintf(stderr, "shoal-fetch: bad %s '%s'\n", x, argv[i]);
                return 2;
            }
            if (strcmp(x, "--parallel") == 0)
                fo->parallel = (int)v;
            else if (strcmp(x, "--stall-timeout") == 0)
                fo->stall_secs = v;
            else if (strcmp(x, "--backoff-ms") == 0)
                fo->backoff_ms = v;
            else if (strcmp(x, "--max-attempts") == 0)
                fo->max_attempts = (int)v;
            else
                fo->seed = (uint32_t)v;
        } else if (x[0] == '-' && x[1]) {
            fprintf(stderr, "shoal-fetch: unknown or incomplete option '%s' (see --help)\n", x);
            return 2;
        } else if (!a->model) {
            a->model = x;
        } else {
            fprintf(stderr, "shoal-fetch: too many arguments (see --help)\n");
            return 2;
        }
    }
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
    bar b = { 0, 0 };
    uint64_t t0;
    double cpu0;

    memset(&fo, 0, sizeof fo);
    memset(&a, 0, sizeof a);
    shoal_err_clear(&err);
    shoal_log_setup("shoal-fetch", SHOAL_LOG_WARN, NULL);
    r = parse_args(argc, argv, &a, &fo);
    if (r >= 0)
        return r;
    if (!a.model) {
        usage(stderr);
        return 2;
    }
    if (a.experts && parse_experts(a.experts, &sel, &pairs)) {
        fprintf(stderr, "shoal-fetch: --experts wants all, layers:A-B or L:E,L:E,... (got '%s')\n",
                a.experts);
        free(pairs);
        return 2;
    }
    sel.spine = a.spine;
    sel.small = a.small;
    shoal_env_capture(&env);
    shoal_hf_env_capture(&hfe);
    if (shoal_home_resolve(&env, a.home_flag, home, sizeof home, &err)
        || shoal_mkdir_p(home, 0700, &err)) {
        fprintf(stderr, "shoal-fetch: %s\n", err.msg);
        free(pairs);
        return 2;
    }
    fo.model = a.model;
    fo.endpoint = hfe.endpoint;
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
    if (cache_open(home, &cc, &c, NULL, &err) || fetch_upstream_open(&fo, c, &u, &err)
        || fetch_manifest_get(u, c, &m, &from_cache, &err)) {
        fprintf(stderr, "shoal-fetch: %s\n", err.msg);
        goto out;
    }
    if (a.want_manifest)
        describe_manifest(m, a.json, from_cache);
    if (fetch_select(m, &sel, &items, &nitems, &err)) {
        fprintf(stderr, "shoal-fetch: %s\n", err.msg);
        goto out;
    }
    b.on = a.progress_bar;
    b.start_ns = t0;
    if (nitems > 0) {
        if (fetch_poll_new(&loop, &err)
            || fetch_session_new(u, c, m, fetch_poll_ops(), loop, &s, &err)) {
            fprintf(stderr, "shoal-fetch: %s\n", err.msg);
            goto out;
        }
        fetch_session_on_progress(s, on_progress, &b, 250);
        if (fetch_session_add(s, items, nitems, &err) || fetch_poll_run(loop, s, &g_stop, &err)) {
            fprintf(stderr, "shoal-fetch: %s\n", err.msg);
            rc = err.code == SHOAL_ECANCELED ? 130 : 1;
            goto summary;
        }
    }
    rc = 0;
    if (a.verify_dir) {
        long bad = verify_against(c, m, items, nitems, a.verify_dir);
        if (bad != 0) {
            fprintf(stderr, "shoal-fetch: verify: %ld of %zu objects differ or are missing\n",
                    bad, nitems);
            rc = 1;
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
