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
#include <sys/random.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/log.h"
#include "common/path.h"
#include "common/version.h"

static void usage(FILE *out)
{
    fprintf(out,
"usage: hubmock --repo org/name[@REV]=DIR | --synth org/name[@REV]=PRESET[,...]\n"
"               [--repo ... | --synth ...] [options]\n"
"\n"
"Serves model directories, or models synthesized on the fly, as a Hugging\n"
"Face Hub on 127.0.0.1 (hub port) with LFS files redirected to a second,\n"
"CDN-like port.  When ready (every etag known) it prints\n"
"  hub http://127.0.0.1:PORT cdn http://127.0.0.1:PORT\n"
"\n"
"  --repo org/name=DIR      serve DIR as branch main of org/name\n"
"  --repo org/name@REV=DIR  serve DIR as branch/ref REV (e.g. v1, refs/pr/1)\n"
"  --synth org/name[@REV]=PRESET[,layers=N][,experts=N][,seed=N][,bad=header|sha]\n"
"                           serve the model `mkmodel --preset PRESET ...` would\n"
"                           write (tiny, slice, k3), generated per request; bad=\n"
"                           breaks its first shard (header claims more bytes than\n"
"                           the file holds / a wrong X-Linked-Etag)\n"
"  --synth-cache FILE|none  etag cache of synthesized files (default\n"
"                           $XDG_CACHE_HOME/shoal/hubmock-synth-etags.txt)\n"
"  --synth-jobs N           threads hashing synthesized files (default: CPUs)\n"
"  --port N, --cdn-port N   ports (0 = any free port; default 0)\n"
"  --token T                gate the repos: requests need 'Authorization: Bearer T'\n"
"  --log FILE               JSON-lines request log, flushed per line\n"
"  --log-times              add t0_us / t1_us (start, end of each answer) to it\n"
"  --lfs-threshold SIZE     files this large are LFS (default 10MiB; *.safetensors\n"
"                           and tiktoken.model always are)\n"
"  --small-redirect         small files answer a relative 307 to /api/resolve-cache/\n"
"  --log-level LEVEL        error|warn|info|debug (default warn)\n"
"\n"
"Faults (also settable while running: POST /_mock/faults?key=value&...):\n"
"  --rate-429 P --rate-503 P    share of requests answered 429 / 503\n"
"  --status-on both|hub|cdn     ports the 429/503 apply to (default both)\n"
"  --retry-after S              Retry-After and RateLimit t= of the 429s (1)\n"
"  --rate-reset P --reset-after BYTES        CDN: TCP reset after BYTES (0: half)\n"
"  --rate-truncate P --truncate-after BYTES  CDN: close after BYTES (0: half)\n"
"  --rate-ignore-range P        CDN: answer a Range request with the whole file\n"
"  --rate-stall P --stall-secs S --stall-at before|mid   CDN: pause S seconds\n"
"  --bw BYTES_PER_S             CDN: per-connection bandwidth cap (0 = none)\n"
"  --cdn-ttl S                  signed CDN URL lifetime (3600)\n"
"  --seed N                     PRNG seed that picks the faulted requests (1)\n"
"  --latency MS                 both ports: wait MS before every answer\n"
"  --hub-stall S                hub port: wait S seconds before every answer\n"
"  --rate-corrupt P --corrupt-mode one|all|drift   CDN: change one byte / every\n"
"                               byte / one byte differently per request\n"
"  --drip-secs S                CDN: send bodies one byte every S seconds\n"
"  --huge-header BYTES          add a response header of BYTES bytes\n");
}

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

/* Second pass over the flags: repos, ports, gate, log, faults.  Returns the
 * number of repos, or -1 after printing what is wrong. */
static int args_apply(hm_server *s, int argc, char **argv, cli *o)
{
    shoal_err errbuf, *err = &errbuf;
    int nrepos = 0;

    shoal_err_clear(err);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char key[64];
        if (strcmp(a, "--small-redirect") == 0) {
            s->small_redirect = 1;
            continue;
        }
        if (strcmp(a, "--log-times") == 0) {
            s->log_times = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "hubmock: %s needs a value (see --help)\n", a);
            return -1;
        }
        i++;
        if (strcmp(a, "--repo") == 0) {
            if (add_repo(s, v, err)) {
                fprintf(stderr, "hubmock: %s\n", err->msg);
                return -1;
            }
            nrepos++;
        } else if (strcmp(a, "--synth") == 0) {
            if (hm_synth_parse(v, &o->synth, err)) {
                fprintf(stderr, "hubmock: %s\n", err->msg);
                return -1;
            }
            nrepos++;
        } else if (strcmp(a, "--synth-cache") == 0) {
            o->synth_cache = strcmp(v, "none") == 0 ? NULL : v;
        } else if (strcmp(a, "--synth-jobs") == 0) {
            char *end;
            long j = strtol(v, &end, 10);
            if (*end || end == v || j < 1 || j > 256) {
                fprintf(stderr, "hubmock: bad --synth-jobs '%s' (1..256)\n", v);
                return -1;
            }
            o->synth_jobs = (int)j;
        } else if (strcmp(a, "--port") == 0 || strcmp(a, "--cdn-port") == 0) {
            if (parse_port(v, a[2] == 'p' ? &o->hub_port : &o->cdn_port)) {
                fprintf(stderr, "hubmock: bad %s '%s'\n", a, v);
                return -1;
            }
        } else if (strcmp(a, "--token") == 0) {
            s->token = v;
        } else if (strcmp(a, "--log") == 0) {
            o->log_path = v;
        } else if (strcmp(a, "--lfs-threshold") == 0 || strcmp(a, "--log-level") == 0) {
            continue;   /* taken in the first pass */
        } else if (flag_key(a, key, sizeof key) != 0 || hm_faults_set(&s->faults, key, v, err)) {
            fprintf(stderr, "hubmock: %s\n", err->code ? err->msg : "bad option; see --help");
            if (!err->code)
                fprintf(stderr, "hubmock: unknown option '%s'\n", a);
            return -1;
        }
    }
    return nrepos;
}

int main(int argc, char **argv)
{
    hm_server s;
    shoal_err err;
    cli o;
    int rc = 1, nrepos = 0;
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

    /* First pass: options that change how repos are hashed or logged. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("hubmock %s\n", SHOAL_VERSION);
            return 0;
        }
        if (i + 1 < argc && strcmp(argv[i], "--lfs-threshold") == 0
            && shoal_size_parse(argv[i + 1], &s.repos.lfs_threshold) != 0) {
            fprintf(stderr, "hubmock: bad --lfs-threshold '%s'\n", argv[i + 1]);
            return 2;
        }
        if (i + 1 < argc && strcmp(argv[i], "--log-level") == 0
            && shoal_log_level_parse(argv[i + 1], &level) != 0) {
            fprintf(stderr, "hubmock: bad --log-level '%s'\n", argv[i + 1]);
            return 2;
        }
    }
    shoal_log_setup("hubmock", level, NULL);

    nrepos = args_apply(&s, argc, argv, &o);
    if (nrepos < 0)
        goto out;
    if (nrepos == 0) {
        fprintf(stderr, "hubmock: give at least one --repo org/name=DIR or --synth "
                "org/name=PRESET (see --help)\n");
        goto out;
    }
    rc = hm_synth_finish(&s, o.synth, o.synth_cache, o.synth_jobs, &err);
    o.synth = NULL;
    if (rc) {
        fprintf(stderr, "hubmock: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    rc = 1;
    hm_rng_seed(&s.rng, s.faults.seed);
    hm_rng_seed(&s.rng2, ~s.faults.seed);
    if (getrandom(s.secret, sizeof s.secret, 0) != (ssize_t)sizeof s.secret) {
        fprintf(stderr, "hubmock: getrandom failed\n");
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
    return rc;
}
