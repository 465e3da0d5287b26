/* main.c — shoal-engine's entry point: configures logging and the
 * progress display, parses the options before the COMMAND with every
 * program's grammar (common/cli.h) and dispatches to a subcommand
 * (engine/cli/cli_int.h).  Its man page and completion gather each
 * command's part by asking the command (--help-man-section,
 * --help-completion-arm).  Owns nothing else. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "common/cli.h"
#include "common/log.h"
#include "common/platform.h"
#include "common/progress.h"
#include "engine/cli/cli_int.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    { "run", engine_cmd_run, "run MODEL --tokens IDS | --prompt TEXT: greedy generation" },
    { "serve", engine_cmd_serve, "serve MODEL: the OpenAI-compatible HTTP API" },
    { "plan", engine_cmd_plan, "plan MODEL: the memory plan, no weights read" },
    { "tokenize", engine_cmd_tokenize, "tokenize [MODEL_DIR]: text <-> token ids" },
    { "info", engine_cmd_info, "info [--json]: version, kernels' ISA, cores" },
    { "prompt", engine_cmd_prompt, "generation from text, streamed (run --prompt)" },   /* last */
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static shoal_cli_cmd command_list[NCOMMANDS + 1];

/* Each command prints its part of the man page or the completion. */
static void each_command(const char *flag)
{
    for (size_t i = 0; i < NCOMMANDS - 1; i++) {   /* prompt is run --prompt's */
        char *argv[] = { (char *)commands[i].name, (char *)flag, NULL };
        fflush(stdout);
        commands[i].run(2, argv);
    }
    fflush(stdout);
}

static void man_commands(FILE *f)
{
    (void)f;   /* the commands print on stdout, which f is */
    each_command("--help-man-section");
}

static void completion_commands(FILE *f)
{
    (void)f;
    each_command("--help-completion-arm");
}

static shoal_cli_spec SPEC = {
    .prog = "shoal-engine",
    .summary = "the Kimi K3 forward pass on CPU, its tokenizer and OpenAI server",
    .synopsis = "shoal-engine COMMAND [options]",
    .about = "Runs Kimi K3 (or a model of its family) on CPU: a local model directory, or\n"
             "hf://org/name[@rev] read through a running shoald.  `shoal-engine COMMAND\n"
             "--help` describes a command.  docs/engine.md, docs/server.md.",
    .command_first = 1,
    .man_commands = man_commands,
    .completion_commands = completion_commands,
    .man_shared = CLI_SHARED_OPTS,
    .man_extra = ".SH ENVIRONMENT\n"
                 "SHOAL_HOME, XDG_CACHE_HOME, HOME (shoald's cache directory for hf://\n"
                 "models); NO_COLOR, HF_HUB_DISABLE_PROGRESS_BARS (the load's progress).\n"
                 ".SH \"SEE ALSO\"\nshoald(8), shoal(1)\n",
};

int main(int argc, char **argv)
{
    shoal_meter_cfg mc;
    shoal_cli_parser p;
    const char *v;
    int id;

    shoal_log_setup("shoal-engine", SHOAL_LOG_WARN, NULL);
    /* an hf:// model with --page-cache dontneed keeps one descriptor per
     * expert in the RAM tier (thousands for K3): allow what the hard limit does */
    (void)shoal_fd_limit_raise();
    shoal_meter_env_capture(&mc, 0);
    cli_progress_setup(&mc);
    for (size_t i = 0; i < NCOMMANDS; i++)
        command_list[i] = (shoal_cli_cmd){ commands[i].name, NULL, commands[i].summary };
    SPEC.cmds = command_list;
    shoal_cli_begin(&p, &SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0)
        ;   /* no options of its own before the COMMAND */
    if (id < 0)
        return p.exit;
    if (p.optind >= argc)
        return shoal_cli_usage_error(&SPEC, "give a COMMAND (run, serve, plan, tokenize, info)");
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(argv[p.optind], commands[i].name) == 0)
            return commands[i].run(argc - p.optind, argv + p.optind);
    return shoal_cli_usage_error(&SPEC, "no command '%s'", argv[p.optind]);
}
