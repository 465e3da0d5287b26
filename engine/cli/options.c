/* options.c — the one option grammar of the commands that load a model
 * (run --tokens, run --prompt, prompt, serve, plan): a shared table of
 * every tier, I/O and plan option, merged with the command's own, parsed
 * with getopt_long (`--opt=value` and `--opt value`, -h/--help,
 * --version, "unrecognized option", exit 2 for usage errors); the home
 * directory for hf:// models; the progress lines of a long load.
 *
 * Owns: the shared options' names, values, checks and help text.  Does
 * not own what the options do (engine/source/ load.c, engine/plan/).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/path.h"
#include "common/sys.h"
#include "common/version.h"
#include "engine/cli/cli_int.h"

enum {
    OPT_HELP = 'h',
    OPT_RAM = 256, OPT_CONTEXT, OPT_SPINE, OPT_EXPERT_RAM, OPT_PREFETCH, OPT_CUTOFF,
    OPT_PAGE_CACHE, OPT_READ_PART, OPT_SPINE_CACHE, OPT_SPINE_LOAD, OPT_TIMEOUT, OPT_HOME,
    OPT_THREADS, OPT_CHUNK, OPT_STATS, OPT_VERSION,
};

static const struct option SHARED[] = {
    { "ram", required_argument, NULL, OPT_RAM },
    { "context", required_argument, NULL, OPT_CONTEXT },
    { "spine", required_argument, NULL, OPT_SPINE },
    { "expert-ram", required_argument, NULL, OPT_EXPERT_RAM },
    { "prefetch", required_argument, NULL, OPT_PREFETCH },
    { "prefetch-cutoff", required_argument, NULL, OPT_CUTOFF },
    { "page-cache", required_argument, NULL, OPT_PAGE_CACHE },
    { "read-part", required_argument, NULL, OPT_READ_PART },
    { "spine-cache", required_argument, NULL, OPT_SPINE_CACHE },
    { "spine-load", required_argument, NULL, OPT_SPINE_LOAD },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "home", required_argument, NULL, OPT_HOME },
    { "threads", required_argument, NULL, OPT_THREADS },
    { "chunk", required_argument, NULL, OPT_CHUNK },
    { "stats", no_argument, NULL, OPT_STATS },
    { "help", no_argument, NULL, OPT_HELP },
    { "version", no_argument, NULL, OPT_VERSION },
};
#define N_SHARED (sizeof SHARED / sizeof SHARED[0])

const char CLI_SHARED_HELP[] =
    "\n"
    "Memory, tiers and I/O (every command that loads a model takes them):\n"
    "  --ram SIZE          plan for at most SIZE of memory (default: the smallest of\n"
    "                      MemTotal, the memory cgroup and the rlimits)\n"
    "  --context N         positions a sequence may hold (default: the plan's choice;\n"
    "                      `shoal-engine plan` shows it)\n"
    "  --spine auto|int8|int4|f32  spine numerics (default auto: int8 when it leaves a\n"
    "                      useful RAM tier, else int4; docs/engine.md)\n"
    "  --expert-ram SIZE   hf://: the RAM tier for experts (default: what the plan leaves)\n"
    "  --page-cache keep|dontneed|direct   hf://: how expert reads treat the page\n"
    "                      cache (default: direct when the experts do not fit the RAM\n"
    "                      tier, else keep; docs/performance.md)\n"
    "  --prefetch on|score|off   hf://: router lookahead prefetches (default on;\n"
    "                      score measures recall without sending)\n"
    "  --prefetch-cutoff R recall under which a layer stops prefetching (default 0.5)\n"
    "  --read-part SIZE    hf://, advanced: read each expert in parts of SIZE\n"
    "                      (rounded up to whole pages; default 1M, 4M direct)\n"
    "  --spine-cache on|off  hf://: read the spine pack shoald cached at an earlier\n"
    "                      load, or build it into the cache (default on)\n"
    "  --spine-load read|map  hf://, advanced: bring the pack into memory by reading\n"
    "                      it (default) or by mapping and locking it\n"
    "  --timeout MS        give up on shoald after MS ms without an answer (default 60000)\n"
    "  --home DIR          shoald's cache directory for hf:// models (default\n"
    "                      $SHOAL_HOME, else $XDG_CACHE_HOME/shoal, else ~/.cache/shoal)\n"
    "  --threads N         compute threads (default: online cores)\n"
    "  --chunk N           prefill chunk size (default 16)\n"
    "  --stats             the plan, timings and tier figures on stderr\n"
    "  -h, --help          this help;  --version  the version\n";

void cli_opts_init(cli_opts *o)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);

    memset(o, 0, sizeof *o);
    engine_load_options_default(&o->load);
    o->load.plan.threads = cores > 0 ? (int)cores : 1;
    o->load.plan.chunk = 16;
}

static int pick(const char *val, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (strcmp(val, names[i]) == 0)
            return i;
    return -1;
}

int cli_number(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

/* One shared option; -1 for a bad value. */
static int shared_set(cli_opts *o, int id, const char *val)
{
    static const char *const spines[] = { "int8", "int4", "f32" };
    static const char *const pcs[] = { "keep", "dontneed", "direct" };
    static const char *const pfs[] = { "on", "score", "off" };
    static const char *const onoff[] = { "on", "off" };
    static const char *const loads[] = { "read", "map" };
    engine_load_options *l = &o->load;
    long v;
    int k;

    switch (id) {
    case OPT_RAM:
        return shoal_size_parse(val, &l->plan.ram) == 0 && l->plan.ram > 0 ? 0 : -1;
    case OPT_CONTEXT:
        if (shoal_long_parse(val, 1, 1L << 40, &v) != 0)
            return -1;
        l->plan.context = v;
        return 0;
    case OPT_SPINE:
        if (strcmp(val, "auto") == 0) {
            l->plan.spine = -1;
            return 0;
        }
        return (l->plan.spine = pick(val, spines, 3)) >= 0 ? 0 : -1;
    case OPT_EXPERT_RAM:
        l->plan.expert_ram_set = 1;
        return shoal_size_parse(val, &l->plan.expert_ram) == 0 ? 0 : -1;
    case OPT_PREFETCH:
        return (l->no_prefetch = pick(val, pfs, 3)) >= 0 ? 0 : -1;
    case OPT_CUTOFF:
        return cli_number(val, 1e-9, 1, &l->prefetch_cutoff);
    case OPT_PAGE_CACHE:
        return (l->page_cache = pick(val, pcs, 3)) >= 0 ? 0 : -1;
    case OPT_READ_PART:
        return shoal_size_parse(val, &l->read_part) == 0 && l->read_part > 0 &&
               l->read_part <= (1ull << 30) ? 0 : -1;
    case OPT_SPINE_CACHE:
        if ((k = pick(val, onoff, 2)) < 0)
            return -1;
        l->spine_cache_off = k;
        return 0;
    case OPT_SPINE_LOAD:
        if ((k = pick(val, loads, 2)) < 0)
            return -1;
        l->spine_load = (spine_load_mode)k;
        return 0;
    case OPT_TIMEOUT:
        if (shoal_long_parse(val, 1, 86400000L, &v) != 0)
            return -1;
        l->timeout_ms = (int)v;
        return 0;
    case OPT_HOME:
        o->home_flag = val;
        return 0;
    case OPT_THREADS:
        if (shoal_long_parse(val, 1, 256, &v) != 0)
            return -1;
        l->plan.threads = (int)v;
        return 0;
    case OPT_CHUNK:
        if (shoal_long_parse(val, 1, 4096, &v) != 0)
            return -1;
        l->plan.chunk = (size_t)v;
        return 0;
    case OPT_STATS:
        o->stats = 1;
        return 0;
    }
    return -1;
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_option *own, cli_own_fn fn,
              void *ctx, void (*usage)(FILE *), cli_opts *o)
{
    struct option longs[N_SHARED + 64];
    size_t n = 0;
    int rc = 0;

    for (size_t i = 0; i < N_SHARED; i++)
        longs[n++] = SHARED[i];
    for (size_t i = 0; own && own[i].name && n + 1 < sizeof longs / sizeof longs[0]; i++)
        longs[n++] = (struct option){ own[i].name, own[i].has_arg ? required_argument
                                                                  : no_argument, NULL, own[i].id };
    longs[n] = (struct option){ 0 };
    opterr = 0;
    optind = 1;
    for (;;) {
        int li = -1, id = getopt_long(argc, argv, ":h", longs, &li);
        const char *name = li >= 0 ? longs[li].name : NULL;
        if (id == -1)
            break;
        if (id == '?') {
            char shortopt[3] = { '-', (char)optopt, 0 };
            fprintf(stderr, "%s: unrecognized option '%s' (see --help)\n", cmd,
                    optopt ? shortopt : argv[optind - 1]);
            return 2;
        }
        if (id == ':') {
            fprintf(stderr, "%s: option '%s' needs a value (see --help)\n", cmd, argv[optind - 1]);
            return 2;
        }
        if (id == OPT_HELP) {
            usage(stdout);
            fputs(CLI_SHARED_HELP, stdout);
            return 1;
        }
        if (id == OPT_VERSION) {
            printf("shoal-engine %s\n", SHOAL_VERSION);
            return 1;
        }
        rc = id >= CLI_OWN ? fn(ctx, id, optarg) : shared_set(o, id, optarg);
        if (rc != 0) {
            fprintf(stderr, "%s: bad value for --%s: %s (see --help)\n", cmd,
                    name ? name : "?", optarg ? optarg : "");
            return 2;
        }
    }
    for (int i = optind; i < argc; i++) {
        if (o->model) {
            fprintf(stderr, "%s: more than one MODEL (%s and %s)\n", cmd, o->model, argv[i]);
            return 2;
        }
        o->model = argv[i];
    }
    if (!o->model) {
        fprintf(stderr, "%s: MODEL is required (see --help)\n", cmd);
        return 2;
    }
    return 0;
}

int cli_home(const char *cmd, cli_opts *o, shoal_err *err)
{
    shoal_env env;

    if (!engine_remote_is_spec(o->model))
        return 0;
    shoal_env_capture(&env);
    if (shoal_home_resolve(&env, o->home_flag, o->home, sizeof o->home, err) != 0) {
        fprintf(stderr, "%s: %s: no cache directory for shoald: %s (use --home)\n", cmd,
                o->model, err->msg);
        return 1;
    }
    o->load.home = o->home;
    return 0;
}

/* Progress of a long load step on stderr: a line at most every 2 s (and
 * the last one), overwritten in place on a terminal. */
typedef struct progress_state {
    uint64_t last_ns;
    char phase[32];
    int tty;
} progress_state;

static progress_state g_progress;

void cli_progress(void *ctx, const char *phase, uint64_t done, uint64_t total)
{
    progress_state *ps = &g_progress;
    uint64_t now = shoal_now_ns();
    int same = strcmp(ps->phase, phase) == 0, end = total && done >= total;
    char a[32], b[32];

    (void)ctx;
    if (done == 0 && total == 0)
        return;          /* a step's name (for serve's /health): the plan block says enough */
    if (same && !end && now - ps->last_ns < 2000000000ull)
        return;
    if (!same && ps->tty && ps->phase[0])
        fputc('\n', stderr);
    ps->tty = isatty(STDERR_FILENO);
    snprintf(ps->phase, sizeof ps->phase, "%s", phase);
    ps->last_ns = now;
    shoal_size_format(done, a, sizeof a);
    shoal_size_format(total, b, sizeof b);
    if (total)
        fprintf(stderr, "spine: %s: %.0f%% (%s of %s)%s", phase, 100.0 * (double)done /
                (double)total, a, b, ps->tty && !end ? "\r" : "\n");
    else
        fprintf(stderr, "spine: %s: %s%s", phase, a, ps->tty ? "\r" : "\n");
    fflush(stderr);
}
