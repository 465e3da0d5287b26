/* shoal_int.h — the `shoal` CLI's internals, shared by the files of
 * tools/shoal/ and by nothing else.
 *
 *   main.c      global flags, dispatch, help, exit codes
 *   conn.c      reaching shoald (or learning it is not running), opening
 *               the cache read-only or as the writer when it is not
 *   fmt.c       sizes, rates, durations, tables
 *   stats.c     shoal stats (and the JSON reading helpers)
 *   ls.c        shoal ls
 *   warm.c      shoal warm
 *   verify.c    shoal verify
 *   gc.c        shoal gc, pin, unpin, rm
 *   export.c    shoal export (--local-dir, --hf-cache)
 *   heatmap.c   shoal heatmap (SVG and --ascii)
 *   estimate.c  shoal estimate (and the disk measurement doctor shares)
 *   doctor.c    shoal doctor
 *
 * Everything that writes goes through shoald when it runs; when it does
 * not, a command that writes opens the cache as its one writer (the lock
 * keeps a daemon started meanwhile off it).  Reading never needs the lock.
 */
#ifndef SHOAL_TOOLS_SHOAL_INT_H
#define SHOAL_TOOLS_SHOAL_INT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cache/cache.h"
#include "common/buf.h"
#include "common/cli.h"
#include "common/client.h"
#include "common/err.h"
#include "common/json.h"
#include "common/path.h"
#include "common/progress.h"

/* Exit codes: every shoal program's (common/cli.h, docs/cli.md). */
enum {
    EXIT_OK_ = SHOAL_EXIT_OK,
    EXIT_FAIL = SHOAL_EXIT_FAIL,         /* the command failed; the message says why */
    EXIT_USAGE = SHOAL_EXIT_USAGE,       /* bad flags or arguments */
    EXIT_NODAEMON = SHOAL_EXIT_NODAEMON, /* the command needs shoald and it is not running */
    EXIT_NOTFOUND = SHOAL_EXIT_NOTFOUND, /* no such model in the cache / no cache at all */
    EXIT_DAMAGED = SHOAL_EXIT_DAMAGED,   /* verify found bad objects or files */
    EXIT_BUSY = SHOAL_EXIT_BUSY,         /* shoald runs and cannot do this: stop it first */
    EXIT_UPSTREAM = SHOAL_EXIT_UPSTREAM, /* the Hub failed or refused */
    EXIT_NOSPACE = SHOAL_EXIT_NOSPACE,   /* the budget or the disk is full */
    EXIT_DETACHED = SHOAL_EXIT_INTERRUPTED   /* Ctrl-C: stopped waiting (a warm job goes on) */
};

typedef struct shoal_cli {
    char home[SHOAL_PATH_MAX];
    const char *socket_path;   /* --socket, or NULL: home/shoald.sock */
    int  tty;                  /* stdout is a terminal */
    int  verbose;
    shoal_meter_cfg meter;     /* progress: NO_COLOR, HF_HUB_DISABLE_PROGRESS_BARS, --quiet */
    /* the environment doctor reads (main.c captures it; NULL when unset) */
    const char *hf_endpoint;   /* $HF_ENDPOINT */
    const char *hf_offline;    /* $HF_HUB_OFFLINE */
    const char *tmpdir;        /* $TMPDIR */
} shoal_cli;

/* ---- conn.c ---- */
/* Connect to shoald.  0; SHOAL_ENET when it is not running (err says how
 * to start it); another code for other failures. */
int  cli_connect(const shoal_cli *cli, shoal_client **out, shoal_err *err);
/* Open the cache read-only.  SHOAL_ENOTFOUND when there is no index. */
int  cli_cache_reader(const shoal_cli *cli, cache **out, shoal_err *err);
/* Open the cache as its writer (shoald not running). */
int  cli_cache_writer(const shoal_cli *cli, cache **out, shoal_err *err);
/* Map a shoal error code to an exit code. */
int  cli_exit_for(int rc);
/* Print "shoal: <msg>" on stderr and return the exit code for rc. */
int  cli_fail(int rc, const shoal_err *err);
/* A model argument as the daemon and the index know it: a directory
 * becomes its absolute path, other specs are kept.  out holds
 * SHOAL_PATH_MAX bytes. */
void cli_model_spec(const char *arg, char *out, size_t cap);
/* Parse the JSON document in b (a report from shoald or the index) into
 * *out and free b.  rc passes a failure of the call that filled b through
 * unchanged; returns 0 or a negative code (SHOAL_EFORMAT: not JSON). */
int  cli_json_take(int rc, shoal_buf *b, shoal_json **out, shoal_err *err);
/* Print a JSON document, pretty, on stdout (the --json output). */
void cli_json_print(const shoal_json *j);

/* ---- fmt.c ---- */
#define FMT_MAX 64
const char *fmt_size(uint64_t bytes, char *out);       /* out: FMT_MAX bytes */
const char *fmt_rate(double bytes_per_s, char *out);
const char *fmt_pct(double ratio, char *out);          /* "72.7 %" */
const char *fmt_count(uint64_t n, char *out);          /* "12,345" */
const char *fmt_duration(double secs, char *out);      /* "850 ms", "12.4 s", "3m05s", "2h01m" */
const char *fmt_time(int64_t wall_ms, char *out);      /* local "YYYY-MM-DD HH:MM:SS" */
/* "label ......... value" with the value column at `col`. */
void fmt_kv(FILE *f, int indent, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

typedef struct fmt_table fmt_table;
/* align: one char per column, 'l' or 'r'. */
fmt_table *fmt_table_new(const char *align, ...);      /* headers, NULL-terminated */
void fmt_table_row(fmt_table *t, ...);                 /* cells, NULL-terminated */
void fmt_table_print(const fmt_table *t, FILE *f, int indent);
void fmt_table_free(fmt_table *t);

/* ---- stats.c: JSON reading with defaults ---- */
int64_t     jint(const shoal_json *j, const char *path, int64_t def);
double      jnum(const shoal_json *j, const char *path, double def);
const char *jstr(const shoal_json *j, const char *path, const char *def);
int         jnull(const shoal_json *j, const char *path);   /* missing or null */
/* Fetch the stats report: live from shoald, or from the index.  *live says
 * which.  Caller frees *out. */
int stats_fetch(const shoal_cli *cli, const char *spec, cache_report_by by, shoal_json **out,
                int *live, shoal_err *err);
/* The model's display name "repo@revision". */
void stats_model_name(const shoal_json *m, char *out, size_t cap);

/* ---- verify.c: a long call's PROGRESS frames on stderr ---- */
/* shoal_client_on_progress's callback; ctx: a shoal_meter. */
void cli_show_progress(const shoal_progress *p, void *ctx);
/* The call ended: blank a terminal's line before the result. */
void cli_progress_end(shoal_meter *m);

/* ---- commands: each returns an exit code ---- */
int cmd_stats(shoal_cli *cli, int argc, char **argv);
int cmd_ls(shoal_cli *cli, int argc, char **argv);
int cmd_warm(shoal_cli *cli, int argc, char **argv);
int cmd_verify(shoal_cli *cli, int argc, char **argv);
int cmd_gc(shoal_cli *cli, int argc, char **argv);
int cmd_pin(shoal_cli *cli, int argc, char **argv);
int cmd_unpin(shoal_cli *cli, int argc, char **argv);
int cmd_rm(shoal_cli *cli, int argc, char **argv);
int cmd_export(shoal_cli *cli, int argc, char **argv);
int cmd_heatmap(shoal_cli *cli, int argc, char **argv);
int cmd_estimate(shoal_cli *cli, int argc, char **argv);
int cmd_doctor(shoal_cli *cli, int argc, char **argv);

/* ---- estimate.c, shared with doctor.c ---- */
/* Cold read rate of dir's disk: a temporary file of `bytes` written,
 * fsynced, dropped from the page cache (POSIX_FADV_DONTNEED), read back;
 * *tmpfs set when dir is on tmpfs.  The file is unlinked at once. */
int cli_measure_disk(const char *dir, uint64_t bytes, double *rate, int *tmpfs, shoal_err *err);

/* A MODEL argument checked (hf://org/name[@rev], org/name[@rev] or a
 * directory) and put in the daemon's and index's form (cli_model_spec):
 * 0, or EXIT_USAGE after saying it is malformed (main.c). */
int cli_model_arg(const shoal_cli_spec *spec, const char *arg, char *out, size_t cap);

/* Each command's option table (for its parsing, and for shoal's man page
 * and completion: main.c lists them). */
extern const shoal_cli_spec cmd_stats_spec, cmd_ls_spec, cmd_warm_spec, cmd_verify_spec,
    cmd_gc_spec, cmd_pin_spec, cmd_unpin_spec, cmd_rm_spec, cmd_heatmap_spec, cmd_estimate_spec,
    cmd_doctor_spec, cmd_export_spec;

#endif
