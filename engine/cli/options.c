/* options.c — the one option grammar of the commands that load a model
 * (run --tokens, run --prompt, prompt, serve, plan): a shared table of
 * every tier, I/O and plan option, merged with the command's own, parsed
 * with every program's grammar (common/cli.h: `--opt=value` and `--opt
 * value`, -h/--help, --version, "unrecognized option", exit 2 for usage
 * errors, the man page and completion); the home directory for hf://
 * models; the progress of a long load (common/progress.h).
 *
 * Owns: the shared options' names, values, checks and help text.  Does
 * not own what the options do (engine/source/ load.c, engine/plan/).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/path.h"
#include "common/progress.h"
#include "common/sys.h"
#include "common/version.h"
#include "engine/cli/cli_int.h"
#include "engine/ranks/ranks.h"

enum {
    OPT_RAM = 256, OPT_CONTEXT, OPT_SPINE, OPT_EXPERT_RAM, OPT_PREFETCH, OPT_CUTOFF,
    OPT_PAGE_CACHE, OPT_READ_PART, OPT_SPINE_CACHE, OPT_SPINE_LOAD, OPT_TIMEOUT, OPT_HOME,
    OPT_THREADS, OPT_CHUNK, OPT_STATS,
};

const shoal_cli_opt CLI_SHARED_OPTS[] = {
    { "ram", 0, "SIZE", OPT_RAM, "plan for at most SIZE of memory (default: the smallest of\n"
                                 "MemTotal, the memory cgroup and the rlimits)" },
    { "context", 0, "N", OPT_CONTEXT, "positions a sequence may hold (default: the plan's\n"
                                      "choice; `shoal-engine plan` shows it)" },
    { "spine", 0, "auto|int8|int4|f32", OPT_SPINE, "spine numerics (default auto: int8 when it\n"
                                                   "leaves a useful RAM tier, else int4)" },
    { "expert-ram", 0, "SIZE", OPT_EXPERT_RAM, "hf://: the RAM tier for experts (default: what\n"
                                               "the plan leaves)" },
    { "page-cache", 0, "keep|dontneed|direct", OPT_PAGE_CACHE,
      "hf://: how expert reads treat the page cache\n"
      "(default: direct when the experts do not fit the RAM\n"
      "tier, else keep; docs/performance.md)" },
    { "prefetch", 0, "on|score|off", OPT_PREFETCH, "hf://: router lookahead prefetches (default\n"
                                                   "on; score measures recall without sending)" },
    { "prefetch-cutoff", 0, "R", OPT_CUTOFF, "recall under which a layer stops prefetching\n"
                                             "(default 0.5)" },
    { "read-part", 0, "SIZE", OPT_READ_PART, "hf://, advanced: read each expert in parts of SIZE\n"
                                             "(whole pages; default 1M, 4M direct)" },
    { "spine-cache", 0, "on|off", OPT_SPINE_CACHE, "hf://: read the spine pack shoald cached at an\n"
                                                   "earlier load, or build it (default on)" },
    { "spine-load", 0, "read|map", OPT_SPINE_LOAD, "hf://, advanced: bring the pack into memory by\n"
                                                   "reading it (default) or mapping and locking it" },
    { "timeout", 0, "MS", OPT_TIMEOUT, "give up on shoald after MS ms without an answer\n"
                                       "(default 60000)" },
    { "home", 0, "DIR", OPT_HOME, "shoald's cache directory for hf:// models (default\n"
                                  "$SHOAL_HOME, else $XDG_CACHE_HOME/shoal, else ~/.cache/shoal)" },
    { "threads", 0, "N", OPT_THREADS, "compute threads (default: online cores)" },
    { "chunk", 0, "N|auto", OPT_CHUNK, "prefill chunk: tokens per pass through a layer\n"
                                       "(default auto: the largest the memory plan allows)" },
    { "stats", 0, NULL, OPT_STATS, "the plan, timings and tier figures on stderr" },
    { NULL, 0, NULL, 0, NULL },
};

void cli_opts_init(cli_opts *o)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);

    memset(o, 0, sizeof *o);
    engine_load_options_default(&o->load);
    o->load.plan.threads = cores > 0 ? (int)cores : 1;
    o->load.plan.chunk = 0;              /* auto: the plan picks the prefill chunk */
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
        if (strcmp(val, "auto") == 0) {
            l->plan.chunk = 0;
            return 0;
        }
        if (shoal_long_parse(val, 1, PLAN_CHUNK_MAX, &v) != 0)
            return -1;
        l->plan.chunk = (size_t)v;
        return 0;
    case OPT_STATS:
        o->stats = 1;
        return 0;
    }
    return -1;
}

/* The command's spec: its usage() text (captured) as the synopsis and
 * the description, its own options listed there (so their help is "":
 * completed, not listed twice), the shared ones as a group. */
typedef struct built_spec {
    shoal_cli_spec spec;
    shoal_cli_opt opts[64];
    char prog[48];
    char *text;              /* usage()'s, split in place */
} built_spec;

static void spec_build(built_spec *b, const char *cmd, const cli_option *own,
                       void (*usage)(FILE *))
{
    size_t len = 0, n = 0;
    FILE *f = open_memstream(&b->text, &len);
    char *about;

    memset(&b->spec, 0, sizeof b->spec);
    snprintf(b->prog, sizeof b->prog, "shoal-engine %s", cmd);
    b->spec.prog = b->prog;
    b->spec.shared = CLI_SHARED_OPTS;
    b->spec.shared_title = "Memory, tiers and I/O (every command that loads a model takes them)";
    for (size_t i = 0; own && own[i].name && n + 1 < sizeof b->opts / sizeof b->opts[0]; i++)
        b->opts[n++] = (shoal_cli_opt){ own[i].name, 0, own[i].has_arg ? "VALUE" : NULL,
                                        own[i].id, "" };
    b->opts[n] = (shoal_cli_opt){ NULL, 0, NULL, 0, NULL };
    b->spec.opts = b->opts;
    if (!f)
        return;
    usage(f);
    fclose(f);
    if (!b->text)
        return;
    /* "usage: A\n       B\n\nabout..." */
    about = strstr(b->text, "\n\n");
    if (about) {
        *about = '\0';
        about += 2;
        while (*about == '\n')
            about++;
        b->spec.about = about;
        for (char *e = about + strlen(about); e > about && e[-1] == '\n'; e--)
            e[-1] = '\0';
    }
    /* the synopsis: the usage lines without their "usage: " and indentation */
    {
        char *w = b->text, *r = b->text;
        if (strncmp(r, "usage: ", 7) == 0)
            r += 7;
        for (int line_start = 0; *r; r++) {
            if (line_start && *r == ' ')
                continue;
            line_start = *r == '\n';
            *w++ = *r;
        }
        *w = '\0';
        b->spec.synopsis = b->text;
    }
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_option *own, cli_own_fn fn,
              void *ctx, void (*usage)(FILE *), cli_opts *o)
{
    built_spec b;
    shoal_cli_parser p;
    const char *v;
    int id, rc = 0;

    spec_build(&b, cmd, own, usage);
    shoal_cli_begin(&p, &b.spec, argc, argv);
    while (rc == 0 && (id = shoal_cli_next(&p, &v)) > 0)
        if ((id >= CLI_OWN ? fn(ctx, id, v) : shared_set(o, id, v)) != 0)
            rc = shoal_cli_bad_value(&p, v, NULL);
    if (rc == 0 && id < 0)
        rc = p.exit == 0 ? 1 : p.exit;
    for (int i = p.optind; rc == 0 && i < argc; i++) {
        if (o->model)
            rc = shoal_cli_usage_error(&b.spec, "more than one MODEL (%s and %s)", o->model,
                                       argv[i]);
        o->model = argv[i];
    }
    if (rc == 0 && !o->model)
        rc = shoal_cli_usage_error(&b.spec, "MODEL is required");
    free(b.text);
    return rc;
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

int cli_home_rank(cli_opts *o, int rank, shoal_err *err)
{
    char out[SHOAL_PATH_MAX];
    size_t n = 0;

    if (!o->load.home)
        return 0;
    for (const char *p = o->home; *p; p++) {
        int w = 1;
        if (p[0] == '%' && p[1] == 'r') {
            w = snprintf(out + n, sizeof out - n, "%d", rank);
            p++;
        } else if (n + 1 < sizeof out) {
            out[n] = *p;
        }
        if (w < 0 || n + (size_t)w >= sizeof out)
            return shoal_err_set(err, SHOAL_ETOOBIG, "--home %s: too long for rank %d", o->home, rank);
        n += (size_t)w;
    }
    out[n] = '\0';
    memcpy(o->home, out, n + 1);
    o->load.home = o->home;
    return 0;
}

int cli_ranks_begin(const char *cmd, cli_opts *o, int *argc, char ***argv, cli_ranks *r)
{
    ranks_world w;
    shoal_err err = { 0 };
    int rc;

    if ((rc = ranks_start(argc, argv, &w, &err)) != 0) {
        fprintf(stderr, "%s: %s\n", cmd, err.msg);
        if (w.size > 1)
            ranks_abort(1);
        ranks_finish();
        return 1;
    }
    r->rank = w.rank;
    r->timeout_ms = o->load.timeout_ms;
    if (cli_home_rank(o, w.rank, &err) != 0) {
        fprintf(stderr, "%s: rank %d: %s\n", cmd, w.rank, err.msg);
        ranks_abort(1);
    }
    if (w.rank == 0) {
        /* rank 0 fetches no expert: its RAM tier would stay empty */
        o->load.plan.expert_ram_set = 1;
        o->load.plan.expert_ram = 0;
        o->load.bound = cli_ranks_bound;
        o->load.bound_ctx = r;
        return -1;
    }
    ranks_owner_options oo = { &o->load, o->stats ? stderr : NULL };
    rc = ranks_owner_serve(o->model, &oo, &w, &err);
    if (rc != 0)
        fprintf(stderr, "%s: rank %d: %s\n", cmd, w.rank, err.msg);
    ranks_finish();
    return rc == 0 ? 0 : 1;
}

int cli_ranks_bound(void *ctx, engine_loaded *l, shoal_err *err)
{
    cli_ranks *r = ctx;
    ranks_lead_options ro = { r->timeout_ms, l->session.chunk, l->session.experts };
    int rc;

    if ((rc = ranks_lead_new(l->model, &ro, &r->lead, err)) != 0)
        return rc;
    l->session.src = ranks_lead_source(r->lead);
    l->session.applier = ranks_lead_applier(r->lead);
    return 0;
}

/* Progress of a long load step on stderr, through the one display of
 * every program (common/progress.h); main() hands the environment's
 * settings over once (cli_progress_setup). */
static shoal_meter g_meter;
static int g_meter_ready;

void cli_progress_setup(const shoal_meter_cfg *cfg)
{
    shoal_meter_init(&g_meter, stderr, cfg, "spine:", SHOAL_METER_BYTES);
    g_meter_ready = 1;
}

void cli_progress(void *ctx, const char *phase, uint64_t done, uint64_t total)
{
    (void)ctx;
    if (done == 0 && total == 0)
        return;          /* a step's name (for serve's /health): the plan block says enough */
    if (!g_meter_ready)
        cli_progress_setup(NULL);
    shoal_meter_update(&g_meter, phase, done, total, NULL);
    if (total && done >= total)
        shoal_meter_end(&g_meter, NULL);
}
