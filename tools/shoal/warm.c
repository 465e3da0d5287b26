/* warm.c — `shoal warm`: start a warm job in shoald and, with --wait,
 * follow it with the shared progress display on stderr (common/progress.h:
 * bytes, rate, ETA; a bar on a terminal, a line every few seconds
 * otherwise).  Ctrl-C stops
 * following, not the job: it belongs to shoald.
 */
#include "tools/shoal/shoal_int.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/sys.h"

#define WARM_MAX_JOBS 2
#define POLL_MS 250

enum { O_SPINE = 1, O_EXPERTS, O_WAIT, O_JOB, O_FIT, O_DRY };

static const shoal_cli_opt warm_opts[] = {
    { "spine", 0, NULL, O_SPINE, "the spine (every non-expert tensor) and small files; with\n"
                                 "the int8 pack cached, the BF16 matrices it replaces are left out" },
    { "experts", 0, "all|top:N|layers:A-B", O_EXPERTS,
      "every routed expert; the N experts asked for most (by the\n"
      "cache's counters); every expert of layers A..B (0-based)" },
    { "fit", 0, NULL, O_FIT, "warm the part that fits the budget, hottest experts first\n"
                             "(the spine is never trimmed: it fits whole or is refused)" },
    { "dry-run", 0, NULL, O_DRY, "print the plan and start nothing" },
    { "wait", 0, NULL, O_WAIT, "follow the job: progress, rate, ETA.  Ctrl-C stops\n"
                               "following; the job keeps going in shoald (exit 130)" },
    { "job", 0, "ID", O_JOB, "follow a job started earlier" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_warm_spec = {
    .prog = "shoal warm",
    .synopsis = "shoal warm MODEL [--spine] [--experts all|top:N|layers:A-B] [--fit] [--dry-run] "
                "[--wait]\n"
                "shoal warm --job ID [--wait]",
    .about = "Start a warm job in shoald: it fetches into the cache in the background, after\n"
             "what engines ask for.  Without --spine or --experts: everything.  Each job is\n"
             "planned against the budget first and the plan printed: what is cached, what it\n"
             "fetches, what would not fit, what it evicts.  A selection that does not fit is\n"
             "refused (nothing fetched, exit 8) unless --fit.  --wait exits 0 only when every\n"
             "object is cached; a job with errors exits with its last error's code (7 the\n"
             "Hub or offline, 8 no space, 1 other) and prints it.  --job ID alone prints the\n"
             "job's state or how it ended (and exits so).  Needs shoald (exit 3 when it is\n"
             "not running).",
    .opts = warm_opts,
};

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

static const char *const state_names[] = { "queued", "running", "done", "failed", "cancelled" };

static int parse_experts(const char *s, int *sel, uint32_t *a, uint32_t *b)
{
    unsigned x, y;
    int n = 0;
    if (!strcmp(s, "all")) {
        *sel = SHOAL_WARM_ALL;   /* with --spine absent, "all experts" is all */
        *a = *b = 0;
        return 0;
    }
    if (sscanf(s, "top:%u%n", &x, &n) == 1 && !s[n] && x > 0) {
        *sel = SHOAL_WARM_TOP;
        *a = x;
        *b = 0;
        return 0;
    }
    if (sscanf(s, "layers:%u-%u%n", &x, &y, &n) == 2 && !s[n] && x <= y && y < 65536) {
        *sel = SHOAL_WARM_LAYERS;
        *a = x;
        *b = y;
        return 0;
    }
    return -1;
}

typedef struct follow {
    uint64_t jobs[WARM_MAX_JOBS];
    int      njobs;
} follow;

/* The exit code of a finished job: 0 when done without an error, else by
 * its last error's code (7 upstream, 8 no space, 4 not found, else 1). */
static int job_exit(const shoal_job_status *st)
{
    int rc;
    if (st->state == 2 && st->errors == 0)
        return EXIT_OK_;
    rc = st->last_code ? cli_exit_for(st->last_code) : EXIT_FAIL;
    return rc == EXIT_OK_ || rc == EXIT_USAGE || rc == EXIT_DETACHED ? EXIT_FAIL : rc;
}

/* One line of a job's outcome (or state), and the last error if any. */
static void job_print(FILE *out, uint64_t id, const shoal_job_status *st)
{
    char a[FMT_MAX], b[FMT_MAX];
    fprintf(out, "Job %llu: %s, %u of %u objects (%s of %s), %u errors\n",
            (unsigned long long)id, state_names[st->state < 5 ? st->state : 3],
            st->objects_done, st->objects_total, fmt_size(st->bytes_done, a),
            fmt_size(st->bytes_total, b), st->errors);
    if (st->last_error[0])
        fprintf(out, "  last error (%s): %s\n", shoal_err_name(st->last_code),
                st->last_error);
}

static int follow_jobs(const shoal_cli *cli, shoal_client *cl, follow *f)
{
    shoal_err err = { 0, "" };
    struct sigaction sa;
    shoal_meter meter;

    shoal_meter_init(&meter, stderr, &cli->meter, "warm", SHOAL_METER_BYTES);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    for (;;) {
        shoal_job_status st[WARM_MAX_JOBS];
        uint64_t done = 0, total = 0;
        uint32_t od = 0, ot = 0, errors = 0;
        int finished = 1, failed = -1, rc;
        char extra[96];

        for (int i = 0; i < f->njobs; i++) {
            if ((rc = shoal_client_job(cl, f->jobs[i], &st[i], &err)) != 0) {
                shoal_meter_clear(&meter);
                return cli_fail(rc, &err);
            }
            done += st[i].bytes_done;
            total += st[i].bytes_total;
            od += st[i].objects_done;
            ot += st[i].objects_total;
            errors += st[i].errors;
            finished &= st[i].state >= 2;
            if (st[i].state >= 3)
                failed = i;
        }
        snprintf(extra, sizeof extra, "%u/%u objects%s", od, ot, errors ? " (errors)" : "");
        shoal_meter_update(&meter, NULL, done, total, extra);
        if (finished) {
            shoal_meter_end(&meter, extra);
            if (failed >= 0 || errors) {
                /* The last job that did not end clean names the outcome. */
                for (int i = 0; i < f->njobs; i++)
                    if (job_exit(&st[i]) != EXIT_OK_)
                        failed = i;
                for (int i = 0; i < f->njobs; i++)
                    job_print(stderr, f->jobs[i], &st[i]);
                fprintf(stderr, "shoal warm: failed: %u of %u objects cached, %u errors; last "
                        "error: %s\n", od, ot, errors,
                        st[failed].last_error[0] ? st[failed].last_error : "no detail");
                return job_exit(&st[failed]);
            }
            printf("Warm complete: %u objects, 0 errors\n", od);
            return EXIT_OK_;
        }
        if (interrupted)
            break;
        struct timespec ts = { 0, POLL_MS * 1000000L };
        nanosleep(&ts, NULL);
        if (interrupted)
            break;
    }
    shoal_meter_end(&meter, NULL);
    for (int i = 0; i < f->njobs; i++)
        printf("Detached: warm job %llu keeps running in shoald (`shoal warm --job %llu --wait` "
               "follows it again)\n", (unsigned long long)f->jobs[i],
               (unsigned long long)f->jobs[i]);
    fflush(stdout);
    return EXIT_DETACHED;
}

/* ---- plans --------------------------------------------------------------------------- */

static void plan_line(const char *label, const shoal_json *p, const char *key, const char *note)
{
    char path[64], a[FMT_MAX], b[FMT_MAX];
    snprintf(path, sizeof path, "%s.objects", key);
    int64_t n = jint(p, path, 0);
    snprintf(path, sizeof path, "%s.bytes", key);
    fmt_kv(stdout, 2, label, "%10s objects  %10s%s", fmt_count((uint64_t)n, a),
           fmt_size((uint64_t)jint(p, path, 0), b), n ? note : "");
}

/* Print the plan ("shoal.warm.plan"); 0 when it may start, else the exit
 * code of its refusal (the message on stderr): 8, it does not fit. */
static int plan_print(const shoal_json *p, const char *what)
{
    char a[FMT_MAX], b[FMT_MAX], c[FMT_MAX], d[FMT_MAX], note[160];
    const char *action = jstr(p, "action", "?");

    printf("Plan: %s, %s%s\n", jstr(p, "model", "?"), what,
           strcmp(action, "trim") == 0 ? " (trimmed to the budget: --fit)" : "");
    if (strcmp(jstr(p, "upstream", "online"), "offline") == 0)
        printf("  offline (HF_HUB_OFFLINE): commit %.12s, the last known; only what the cache "
               "holds can be warmed\n", jstr(p, "commit", "?"));
    else if (strcmp(jstr(p, "upstream", "online"), "unreachable") == 0)
        printf("  the Hub did not answer: commit %.12s is the revision's last known; what is "
               "not cached fails until it is back\n", jstr(p, "commit", "?"));
    plan_line("selected", p, "selected", "");
    plan_line("already cached", p, "cached", "  (kept)");
    if (jint(p, "hfcache.objects", 0))   /* verified HF cache blobs: nothing to fetch or hold */
        plan_line("in the Hugging Face cache", p, "hfcache", "  (read in place, not fetched)");
    plan_line("to fetch", p, "fetch", "");
    plan_line("would not fit", p, "not_fitting", strcmp(action, "trim") == 0 ? "  (left out)" : "");
    if (jint(p, "left_out.objects", 0))
        plan_line("left out", p, "left_out", "  (BF16 matrices its cached int8 pack replaces)");
    snprintf(note, sizeof note, "  (least valuable first: %s of experts, %s of spine)",
             fmt_size((uint64_t)jint(p, "evict.bytes_by_kind.expert", 0), a),
             fmt_size((uint64_t)jint(p, "evict.bytes_by_kind.spine", 0), b));
    plan_line("evicts", p, "evict", note);
    fmt_kv(stdout, 2, "budget", "%s: %s used, %s pinned; room for it %s",
           fmt_size((uint64_t)jint(p, "budget.budget", 0), a),
           fmt_size((uint64_t)jint(p, "budget.used", 0), b),
           fmt_size((uint64_t)jint(p, "budget.pinned", 0), c),
           fmt_size((uint64_t)jint(p, "budget.room", 0), d));
    fflush(stdout);
    if (strcmp(action, "refuse") == 0) {
        fprintf(stderr, "shoal warm: refused: %s\n", jstr(p, "message", ""));
        return EXIT_NOSPACE;
    }
    return EXIT_OK_;
}

static void selection_name(int sel, uint32_t a, uint32_t b, char *out, size_t cap)
{
    switch (sel & SHOAL_WARM_SEL_MASK) {
    case SHOAL_WARM_ALL:    snprintf(out, cap, "everything"); break;
    case SHOAL_WARM_SPINE:  snprintf(out, cap, "the spine and small files"); break;
    case SHOAL_WARM_LAYERS: snprintf(out, cap, "experts of layers %u-%u", a, b); break;
    default:                snprintf(out, cap, "the top %u experts", a); break;
    }
}

/* Plan each selection, print it, and (unless dry) start it.  A dry run's
 * second plan does not count what the first would fetch. */
static int warm_selections(shoal_client *cl, uint32_t handle, const int *sel, const uint32_t *a,
                           const uint32_t *b, int n, int dry, follow *f)
{
    shoal_err err = { 0, "" };
    int rc = EXIT_OK_;

    for (int i = 0; i < n && rc == EXIT_OK_; i++) {
        shoal_buf out;
        shoal_json *p = NULL;
        char what[96];
        int r;
        selection_name(sel[i], a[i], b[i], what, sizeof what);
        shoal_buf_init(&out, 0);
        r = shoal_client_warm_plan(cl, handle, sel[i], a[i], b[i], &out, &err);
        if ((r = cli_json_take(r, &out, &p, &err)) != 0)
            return cli_fail(r, &err);
        rc = plan_print(p, what);
        if (rc == EXIT_OK_ && (sel[i] & SHOAL_WARM_SEL_MASK) == SHOAL_WARM_TOP
            && jint(p, "selected.objects", 0) == 0) {
            fprintf(stderr, "shoal warm: --experts top:%u selects nothing: no expert of this "
                    "model has been asked for yet (top:N ranks experts by the requests the "
                    "cache counted).  Run the engine on it first, or warm --experts all or "
                    "layers:A-B\n", a[i]);
            rc = EXIT_FAIL;
        }
        shoal_json_free(p);
        /* started before the next plan, which then counts what it holds */
        if (rc == EXIT_OK_ && !dry) {
            if ((r = shoal_client_warm(cl, handle, sel[i], a[i], b[i], &f->jobs[f->njobs],
                                       &err)) != 0)
                return cli_fail(r, &err);
            f->njobs++;
        }
    }
    return rc;
}

int cmd_warm(shoal_cli *cli, int argc, char **argv)
{
    int spine = 0, experts = 0, wait = 0, fit = 0, dry = 0, id, rc, sel = SHOAL_WARM_ALL;
    uint32_t a = 0, b = 0;
    uint64_t job = 0;
    char spec[SHOAL_PATH_MAX], *end;
    shoal_err err = { 0, "" };
    shoal_client *cl = NULL;
    shoal_model_info mi;
    follow f;
    shoal_cli_parser p;
    const char *v;

    shoal_cli_begin(&p, &cmd_warm_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case O_SPINE: spine = 1; break;
        case O_EXPERTS:
            if (parse_experts(v, &sel, &a, &b) != 0)
                return shoal_cli_bad_value(&p, v, "all, top:N or layers:A-B");
            experts = 1;
            break;
        case O_WAIT: wait = 1; break;
        case O_FIT:  fit = SHOAL_WARM_F_FIT; break;
        case O_DRY:  dry = 1; break;
        case O_JOB:
            job = strtoull(v, &end, 10);
            if (*end || !job)
                return shoal_cli_bad_value(&p, v, "the job id warm printed");
            break;
        }
    }
    if (id < 0)
        return p.exit;
    if (job && (p.optind != argc || fit || dry))
        return shoal_cli_usage_error(&cmd_warm_spec, "--job ID takes only --wait");
    if (!job && p.optind != argc - 1)
        return shoal_cli_usage_error(&cmd_warm_spec, "give one MODEL (or --job ID)");
    if (!job && (rc = cli_model_arg(&cmd_warm_spec, argv[p.optind], spec, sizeof spec)) != 0)
        return rc;
    memset(&f, 0, sizeof f);
    if ((rc = cli_connect(cli, &cl, &err)) != 0) {
        if (rc == SHOAL_ENET) {
            fprintf(stderr, "shoal warm needs shoald: %s\n", err.msg);
            return EXIT_NODAEMON;
        }
        return cli_fail(rc, &err);
    }
    if (job) {
        f.jobs[f.njobs++] = job;
    } else {
        memset(&mi, 0, sizeof mi);
        mi.manifest_fd = -1;
        rc = shoal_client_open(cl, spec, &mi, &err);
        if (mi.manifest_fd >= 0)
            close(mi.manifest_fd);
        if (rc == 0 && experts && sel == SHOAL_WARM_ALL) {
            /* Every expert: the protocol's "all" would add the spine. */
            if (mi.layers == 0) {
                shoal_client_close(cl);
                fprintf(stderr, "shoal warm: %s has no layers\n", spec);
                return EXIT_FAIL;
            }
            sel = SHOAL_WARM_LAYERS;
            a = 0;
            b = (uint32_t)mi.layers - 1;
        }
        if (rc) {
            shoal_client_close(cl);
            return cli_fail(rc, &err);
        }
        {
            int sels[WARM_MAX_JOBS], n = 0;
            uint32_t as[WARM_MAX_JOBS], bs[WARM_MAX_JOBS];
            if (spine || !experts) {
                sels[n] = (experts || spine ? SHOAL_WARM_SPINE : SHOAL_WARM_ALL) | fit;
                as[n] = bs[n] = 0;
                n++;
            }
            if (experts) {
                sels[n] = sel | fit;
                as[n] = a;
                bs[n] = b;
                n++;
            }
            rc = warm_selections(cl, mi.handle, sels, as, bs, n, dry, &f);
            if (rc != EXIT_OK_ || dry) {
                shoal_client_close(cl);
                return rc;
            }
        }
        for (int i = 0; i < f.njobs; i++)
            printf("Started warm job %llu for %s\n", (unsigned long long)f.jobs[i], spec);
        fflush(stdout);
    }
    rc = EXIT_OK_;
    if (job && !wait) {
        /* --job N alone: its state now, or how it ended. */
        shoal_job_status st;
        memset(&st, 0, sizeof st);
        if ((rc = shoal_client_job(cl, job, &st, &err)) != 0) {
            shoal_client_close(cl);
            return cli_fail(rc, &err);
        }
        job_print(stdout, job, &st);
        shoal_client_close(cl);
        return st.state >= 2 ? job_exit(&st) : EXIT_OK_;
    }
    if (wait)
        rc = follow_jobs(cli, cl, &f);
    else if (f.njobs)
        printf("It runs in shoald; `shoal warm --job %llu --wait` follows it.\n",
               (unsigned long long)f.jobs[0]);
    shoal_client_close(cl);
    return rc;
}
