/* main.c — hubmock: a Hugging Face Hub on loopback, for tests and benchmarks.
 *
 * Owns: the command line, hashing the repos (directories and synthesized
 * models) before listening, the two ports, the ready line on stdout, and a
 * clean exit on SIGTERM/SIGINT from inside the event loop.  See
 * docs/hubmock.md.
 */
#include "tools/hubmock/hubmock_int.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/cli.h"
#include "common/log.h"
#include "common/path.h"
#include "common/platform.h"
#include "common/progress.h"

enum {
    OPT_REPO = 1, OPT_SYNTH, OPT_SYNTH_CACHE, OPT_SYNTH_JOBS, OPT_PORT, OPT_CDN_PORT, OPT_TOKEN,
    OPT_LOG, OPT_LOG_TIMES, OPT_LFS, OPT_SMALL_REDIRECT, OPT_LOG_LEVEL, OPT_FAULT,
};

static const shoal_cli_opt OPTS[] = {
    { "repo", 0, "org/name[@REV]=DIR", OPT_REPO, "serve DIR as branch main (or branch/ref REV: v1,\n"
                                                 "refs/pr/1) of org/name" },
    { "synth", 0, "org/name[@REV]=PRESET[,...]", OPT_SYNTH,
      "serve the model `mkmodel --preset PRESET ...` would write\n"
      "(tiny, slice, k3), generated per request; the options after\n"
      "the preset: layers=N, experts=N, seed=N, bad=header|sha\n"
      "(breaks its first shard: a header claiming more bytes than\n"
      "the file holds / a wrong X-Linked-Etag)" },
    { "synth-cache", 0, "FILE", OPT_SYNTH_CACHE, "etag cache of synthesized files, or none (default\n"
                                                 "$XDG_CACHE_HOME/shoal/hubmock-synth-etags.txt)" },
    { "synth-jobs", 0, "N", OPT_SYNTH_JOBS, "threads hashing synthesized files (default: CPUs)" },
    { "port", 0, "N", OPT_PORT, "the hub port (0 = any free port; default 0)" },
    { "cdn-port", 0, "N", OPT_CDN_PORT, "the CDN port (0 = any free port; default 0)" },
    { "token", 0, "T", OPT_TOKEN, "gate the repos: requests need 'Authorization: Bearer T'" },
    { "log", 0, "FILE", OPT_LOG, "JSON-lines request log, flushed per line" },
    { "log-times", 0, NULL, OPT_LOG_TIMES, "add t0_us / t1_us (start, end of each answer) to it" },
    { "lfs-threshold", 0, "SIZE", OPT_LFS, "files this large are LFS (default 10MiB; *.safetensors\n"
                                            "and tiktoken.model always are)" },
    { "small-redirect", 0, NULL, OPT_SMALL_REDIRECT,
      "small files answer a relative 307 to /api/resolve-cache/" },
    { "log-level", 0, "error|warn|info|debug", OPT_LOG_LEVEL, "diagnostics on stderr (default warn)" },
    /* faults: the key is the option's name (faults.c); also settable while
     * running with POST /_mock/faults?key=value */
    { "rate-429", 0, "P", OPT_FAULT, "share of requests answered 429" },
    { "rate-503", 0, "P", OPT_FAULT, "share of requests answered 503" },
    { "status-on", 0, "both|hub|cdn", OPT_FAULT, "ports the 429/503 apply to (default both)" },
    { "retry-after", 0, "S", OPT_FAULT, "Retry-After and RateLimit t= of the 429s (1)" },
    { "rate-reset", 0, "P", OPT_FAULT, "CDN: share of answers cut by a TCP reset" },
    { "reset-after", 0, "BYTES", OPT_FAULT, "CDN: the reset after BYTES (0: half)" },
    { "rate-truncate", 0, "P", OPT_FAULT, "CDN: share of answers closed early" },
    { "truncate-after", 0, "BYTES", OPT_FAULT, "CDN: closed after BYTES (0: half)" },
    { "rate-ignore-range", 0, "P", OPT_FAULT, "CDN: answer a Range request with the whole file" },
    { "rate-stall", 0, "P", OPT_FAULT, "CDN: share of answers that pause" },
    { "stall-secs", 0, "S", OPT_FAULT, "CDN: the pause" },
    { "stall-at", 0, "before|mid", OPT_FAULT, "CDN: where the pause falls" },
    { "bw", 0, "BYTES_PER_S", OPT_FAULT, "CDN: per-connection bandwidth cap (0 = none)" },
    { "cdn-ttl", 0, "S", OPT_FAULT, "signed CDN URL lifetime (3600)" },
    { "seed", 0, "N", OPT_FAULT, "PRNG seed that picks the faulted requests (1)" },
    { "latency", 0, "MS", OPT_FAULT, "both ports: wait MS before every answer" },
    { "hub-stall", 0, "S", OPT_FAULT, "hub port: wait S seconds before every answer" },
    { "rate-corrupt", 0, "P", OPT_FAULT, "CDN: share of answers with changed bytes" },
    { "corrupt-mode", 0, "one|all|drift", OPT_FAULT, "CDN: change one byte / every byte / one byte\n"
                                                     "differently per request" },
    { "drip-secs", 0, "S", OPT_FAULT, "CDN: send bodies one byte every S seconds" },
    { "huge-header", 0, "BYTES", OPT_FAULT, "add a response header of BYTES bytes" },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec SPEC = {
    .prog = "hubmock",
    .summary = "a Hugging Face Hub on loopback, for tests and benchmarks",
    .synopsis = "hubmock --repo org/name[@REV]=DIR | --synth org/name[@REV]=PRESET[,...]\n"
                "        [--repo ... | --synth ...] [options]",
    .about = "Serves model directories, or models synthesized on the fly, as a Hugging\n"
             "Face Hub on 127.0.0.1 (hub port) with LFS files redirected to a second,\n"
             "CDN-like port.  When ready (every etag known) it prints\n"
             "  hub http://127.0.0.1:PORT cdn http://127.0.0.1:PORT\n"
             "A developer's tool (docs/hubmock.md).  The fault options (from --rate-429\n"
             "on) can also be set while it runs: POST /_mock/faults?key=value&...",
    .opts = OPTS,
};

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    LOG_INFO("hubmock", "signal %d: stopping", (int)sig);
    event_base_loopbreak(arg);
}

/* "--rate-429" -> "rate_429" */
static int flag_key(const char *flag, char *out, size_t cap)
{
    size_t n = strlen(flag);
    if (n < 3 || n - 2 >= cap || strncmp(flag, "--", 2) != 0)
        return -1;
    for (size_t i = 2; i <= n; i++)
        out[i - 2] = flag[i] == '-' ? '_' : flag[i];
    return 0;
}

static int add_repo(hm_server *s, const char *spec, shoal_err *err)
{
    const char *eq = strchr(spec, '='), *at;
    char id[512], ref[256];
    size_t idlen;

    if (!eq || eq == spec || !eq[1])
        return shoal_err_set(err, SHOAL_EINVAL, "--repo wants org/name[@REV]=DIR, got '%s'", spec);
    at = memchr(spec, '@', (size_t)(eq - spec));
    idlen = (size_t)((at ? at : eq) - spec);
    if (idlen >= sizeof id || (at && (size_t)(eq - at - 1) >= sizeof ref) || (at && eq == at + 1))
        return shoal_err_set(err, SHOAL_EINVAL, "bad --repo '%s'", spec);
    memcpy(id, spec, idlen);
    id[idlen] = '\0';
    if (!strchr(id, '/') || strchr(strchr(id, '/') + 1, '/'))
        return shoal_err_set(err, SHOAL_EINVAL, "repo id must be org/name, got '%s'", id);
    if (at) {
        memcpy(ref, at + 1, (size_t)(eq - at - 1));
        ref[eq - at - 1] = '\0';
    } else {
        snprintf(ref, sizeof ref, "main");
    }
    return hm_repos_set(&s->repos, id, ref, eq + 1, err);
}

static int parse_port(const char *v, int *out)
{
    char *end;
    long p = strtol(v, &end, 10);
    if (*v == '\0' || *end || p < 0 || p > 65535)
        return -1;
    *out = (int)p;
    return 0;
}

/* What the command line says besides the server's own settings. */
typedef struct cli {
    int hub_port, cdn_port;
    const char *log_path;
    hm_synth_pending *synth;     /* --synth repos, hashed after parsing */
    const char *synth_cache;     /* NULL: none */
    char synth_cache_default[4096];
    int synth_jobs;
    int exit;                    /* args_apply's failure: the exit status */
} cli;

/* The default cache: $XDG_CACHE_HOME/shoal/..., else ~/.cache/shoal/... */
static const char *default_cache(cli *o)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/')
        snprintf(o->synth_cache_default, sizeof o->synth_cache_default,
                 "%s/shoal/hubmock-synth-etags.txt", xdg);
    else if (home && home[0] == '/')
        snprintf(o->synth_cache_default, sizeof o->synth_cache_default,
                 "%s/.cache/shoal/hubmock-synth-etags.txt", home);
    else
        return NULL;
    return o->synth_cache_default;
}

/* One option given, kept for the second pass. */
typedef struct given {
    int id;
    char name[40];       /* "--rate-429" */
    const char *val;
} given;

/* Repos, ports, gate, log, faults, in the order given.  Returns the
 * number of repos, or -1 after printing what is wrong. */
static int args_apply(hm_server *s, const given *g, int n, cli *o)
{
    shoal_err errbuf, *err = &errbuf;
    int nrepos = 0;

    shoal_err_clear(err);
    for (int i = 0; i < n; i++) {
        const char *v = g[i].val;
        char key[64];
        switch (g[i].id) {
        case OPT_SMALL_REDIRECT: s->small_redirect = 1; break;
        case OPT_LOG_TIMES:      s->log_times = 1; break;
        case OPT_REPO:
            if (add_repo(s, v, err)) {
                fprintf(stderr, "hubmock: %s\n", err->msg);
                o->exit = err->code == SHOAL_EINVAL ? SHOAL_EXIT_USAGE : shoal_exit_for(err->code);
                return -1;
            }
            nrepos++;
            break;
        case OPT_SYNTH:
            if (hm_synth_parse(v, &o->synth, err)) {
                fprintf(stderr, "hubmock: %s\n", err->msg);
                o->exit = SHOAL_EXIT_USAGE;
                return -1;
            }
            nrepos++;
            break;
        case OPT_SYNTH_CACHE: o->synth_cache = strcmp(v, "none") == 0 ? NULL : v; break;
        case OPT_TOKEN:       s->token = v; break;
        case OPT_LOG:         o->log_path = v; break;
        case OPT_FAULT:
            if (flag_key(g[i].name, key, sizeof key) != 0 || hm_faults_set(&s->faults, key, v, err)) {
                fprintf(stderr, "hubmock: %s (see hubmock --help)\n",
                        err->code ? err->msg : "bad fault option");
                o->exit = SHOAL_EXIT_USAGE;
                return -1;
            }
            break;
        }
    }
    return nrepos;
}

/* Parse argv: options that change how repos are hashed or logged now,
 * the rest into g (applied once logging is set up).  -1: go on; else the
 * exit status. */
static int args_parse(int argc, char **argv, hm_server *s, cli *o, shoal_log_level *level,
                      given *g, int *ng)
{
    shoal_cli_parser p;
    const char *v;
    long n;
    int id;

    shoal_cli_begin(&p, &SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case OPT_LFS:
            if (shoal_size_parse(v, &s->repos.lfs_threshold) != 0)
                return shoal_cli_bad_value(&p, v, "a size (10M)");
            break;
        case OPT_LOG_LEVEL:
            if (shoal_log_level_parse(v, level) != 0)
                return shoal_cli_bad_value(&p, v, "error, warn, info or debug");
            break;
        case OPT_SYNTH_JOBS:
            if (shoal_long_parse(v, 1, 256, &n) != 0)
                return shoal_cli_bad_value(&p, v, "1..256");
            o->synth_jobs = (int)n;
            break;
        case OPT_PORT:
        case OPT_CDN_PORT:
            if (parse_port(v, id == OPT_PORT ? &o->hub_port : &o->cdn_port))
                return shoal_cli_bad_value(&p, v, "a port, 0..65535");
            break;
        default:
            g[*ng].id = id;
            snprintf(g[*ng].name, sizeof g[*ng].name, "%s", p.name);
            g[(*ng)++].val = v;
        }
    }
    if (id < 0)
        return p.exit;
    if (p.optind < argc)
        return shoal_cli_usage_error(&SPEC, "unexpected argument '%s'", argv[p.optind]);
    return -1;
}

int main(int argc, char **argv)
{
    hm_server s;
    shoal_err err;
    cli o;
    given *g = NULL;
    shoal_meter_cfg mc;
    shoal_meter meter;
    int rc = 1, nrepos = 0, ng = 0;
    shoal_log_level level = SHOAL_LOG_WARN;
    struct event *sig_term = NULL, *sig_int = NULL;

    memset(&s, 0, sizeof s);
    memset(&o, 0, sizeof o);
    o.synth_cache = default_cache(&o);
    o.synth_jobs = (int)sysconf(_SC_NPROCESSORS_ONLN);
    shoal_err_clear(&err);
    hm_faults_defaults(&s.faults);
    s.repos.lfs_threshold = 10u << 20;
    signal(SIGPIPE, SIG_IGN);

    g = calloc((size_t)argc + 1, sizeof *g);
    if (!g) {
        fprintf(stderr, "hubmock: out of memory\n");
        return 1;
    }
    if ((rc = args_parse(argc, argv, &s, &o, &level, g, &ng)) >= 0) {
        free(g);
        return rc;
    }
    rc = 1;
    shoal_log_setup("hubmock", level, NULL);

    nrepos = args_apply(&s, g, ng, &o);
    if (nrepos < 0) {
        rc = o.exit;
        goto out;
    }
    if (nrepos == 0) {
        rc = shoal_cli_usage_error(&SPEC, "give at least one --repo org/name=DIR or --synth "
                                   "org/name=PRESET");
        goto out;
    }
    shoal_meter_env_capture(&mc, 0);
    shoal_meter_init(&meter, stderr, &mc, "hubmock:", SHOAL_METER_BYTES);
    rc = hm_synth_finish(&s, o.synth, o.synth_cache, o.synth_jobs, &meter, &err);
    o.synth = NULL;
    if (rc) {
        fprintf(stderr, "hubmock: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    rc = 1;
    hm_rng_seed(&s.rng, s.faults.seed);
    hm_rng_seed(&s.rng2, ~s.faults.seed);
    if (shoal_random(s.secret, sizeof s.secret) != 0) {
        fprintf(stderr, "hubmock: no random bytes from the kernel\n");
        goto out;
    }
    if (o.log_path && hm_reqlog_open(o.log_path, s.log_times, &s.log, &err)) {
        fprintf(stderr, "hubmock: %s\n", err.msg);
        goto out;
    }
    s.base = event_base_new();
    if (!s.base) {
        fprintf(stderr, "hubmock: cannot create the event loop\n");
        goto out;
    }
    if (hm_http_listen(&s, HM_PORT_HUB, o.hub_port, &s.hub_port, &err)
        || hm_http_listen(&s, HM_PORT_CDN, o.cdn_port, &s.cdn_port, &err)) {
        fprintf(stderr, "hubmock: %s\n", err.msg);
        goto out;
    }
    sig_term = evsignal_new(s.base, SIGTERM, on_signal, s.base);
    sig_int = evsignal_new(s.base, SIGINT, on_signal, s.base);
    if (!sig_term || !sig_int || evsignal_add(sig_term, NULL) || evsignal_add(sig_int, NULL)) {
        fprintf(stderr, "hubmock: cannot install signal handlers\n");
        goto out;
    }
    printf("hub http://127.0.0.1:%d cdn http://127.0.0.1:%d\n", s.hub_port, s.cdn_port);
    fflush(stdout);
    if (event_base_dispatch(s.base) < 0) {
        fprintf(stderr, "hubmock: event loop failed\n");
        goto out;
    }
    rc = 0;
out:
    if (sig_term)
        event_free(sig_term);
    if (sig_int)
        event_free(sig_int);
    hm_http_shutdown(&s);
    if (s.base)
        event_base_free(s.base);
    hm_reqlog_close(s.log);
    hm_synth_pending_free(o.synth);
    hm_repos_free(&s.repos);
    free(g);
    return rc;
}
