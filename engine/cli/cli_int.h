/* cli_int.h — shoal-engine's subcommands, each a main()-like entry point
 * that engine/cli/main.c dispatches to by name.  Private to engine/cli/.
 *
 * Convention: argv[0] is the subcommand's name ("tokenize"); the return
 * value is the process exit status (0 success, 1 failure, 2 usage error).
 * Commands print to stdout/stderr: they are the program's edge.
 */
#ifndef SHOAL_ENGINE_CLI_INT_H
#define SHOAL_ENGINE_CLI_INT_H

#include <stdint.h>
#include <stdio.h>

#include "common/cli.h"
#include "common/err.h"
#include "common/path.h"
#include "engine/source/source.h"

/* shoal-engine tokenize: text on stdin -> token ids (or back with --decode).
 * engine/cli/cmd_tokenize.c; `shoal-engine tokenize --help` for the options. */
int engine_cmd_tokenize(int argc, char **argv);

/* shoal-engine run: greedy generation from token ids on a local model
 * directory.  engine/cli/cmd_run.c; `shoal-engine run --help` for the options. */
int engine_cmd_run(int argc, char **argv);

/* shoal-engine serve: the OpenAI-compatible HTTP server.  engine/cli/cmd_serve.c;
 * `shoal-engine serve --help` for the options. */
int engine_cmd_serve(int argc, char **argv);

/* Generation from text, streamed to the terminal: `run MODEL --prompt TEXT
 * [--chat] ...` (the run command hands its arguments over when --prompt is
 * given; `prompt` reaches it directly).  engine/cli/cmd_prompt.c. */
int engine_cmd_prompt(int argc, char **argv);

/* shoal-engine plan: the memory plan of a model, without loading its
 * weights.  engine/cli/cmd_plan.c. */
int engine_cmd_plan(int argc, char **argv);

/* shoal-engine info: version, the kernels' ISA, cores.  engine/cli/cmd_info.c. */
int engine_cmd_info(int argc, char **argv);

/* ---- the shared options (options.c) ------------------------------------------- */

/* What every model-loading command takes: the load options (the plan's,
 * shoald's, the forward pass's), MODEL, --home, --stats. */
typedef struct cli_opts {
    engine_load_options load;
    const char *model;
    const char *home_flag;     /* --home as given */
    char home[SHOAL_PATH_MAX]; /* resolved by cli_home */
    int stats;
} cli_opts;

/* A command's own option; ids from CLI_OWN up. */
#define CLI_OWN 1000
typedef struct cli_option {
    const char *name;
    int has_arg;
    int id;
} cli_option;

/* Set a command's own option; 0, or -1 for a bad value (the parser says so). */
typedef int (*cli_own_fn)(void *ctx, int id, const char *val);

/* The shared options' table (their names, values and help). */
extern const shoal_cli_opt CLI_SHARED_OPTS[];

void cli_opts_init(cli_opts *o);

/* Parse argv with the shared table and `own` (terminated by a NULL name)
 * through common/cli.h: exactly one MODEL.  0: go on; 1: --help,
 * --version (or the man page / completion parts) printed (exit 0); 2: a
 * usage error printed (exit 2). */
int cli_parse(const char *cmd, int argc, char **argv, const cli_option *own, cli_own_fn fn,
              void *ctx, void (*usage)(FILE *), cli_opts *o);

/* An hf:// MODEL's shoald home into o->load.home.  0, or 1 after printing
 * why there is none. */
int cli_home(const char *cmd, cli_opts *o, shoal_err *err);

/* --experts-over-ranks: "%r" in the resolved home (--home or SHOAL_HOME)
 * becomes the rank, so each rank reaches its own shoald (docs/mpi.md).
 * 0, or SHOAL_ETOOBIG with err filled. */
int cli_home_rank(cli_opts *o, int rank, shoal_err *err);

/* --experts-over-ranks (docs/mpi.md), for run and serve.  cli_ranks_begin
 * starts MPI and makes the home this rank's; on an owner rank it serves
 * rank 0 until the run is over and returns the exit status; on rank 0 it
 * returns -1 with o->load set up (RAM tier 0, the `bound` hook that meets
 * the owners and gives the session their source and applier, r->lead
 * once bound).  Failures before rank 0 can report them end every rank. */
struct ranks_lead;
typedef struct cli_ranks {
    int rank, timeout_ms;
    struct ranks_lead *lead;     /* rank 0, after the load */
} cli_ranks;
int cli_ranks_begin(const char *cmd, cli_opts *o, int *argc, char ***argv, cli_ranks *r);
int cli_ranks_bound(void *ctx, engine_loaded *l, shoal_err *err);

/* A whole decimal or real number in [lo, hi].  0 or -1. */
int cli_number(const char *s, double lo, double hi, double *out);

/* engine_progress_fn showing "spine: PHASE  N %  A / B ..." on stderr
 * (common/progress.h); main() calls cli_progress_setup with the
 * environment's settings first. */
struct shoal_meter_cfg;
void cli_progress_setup(const struct shoal_meter_cfg *cfg);
void cli_progress(void *ctx, const char *phase, uint64_t done, uint64_t total);

#endif
