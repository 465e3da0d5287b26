/* main.c — `shoal`, the command line to warm, inspect and manage a shoal
 * cache: global flags, the environment (read here and nowhere else), the
 * dispatch to one file per command, help and exit codes (docs/cli.md).
 */
#include "tools/shoal/shoal_int.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

typedef struct command {
    const char *name;
    int (*run)(shoal_cli *cli, int argc, char **argv);
    const shoal_cli_spec *spec;
    const char *summary;
} command;

static const command commands[] = {
    { "stats",    cmd_stats,    &cmd_stats_spec,    "hit rates per tier, model, layer and session" },
    { "ls",       cmd_ls,       &cmd_ls_spec,       "cached models: revisions, bytes, coverage" },
    { "warm",     cmd_warm,     &cmd_warm_spec,     "start (and follow) a warm job in shoald" },
    { "verify",   cmd_verify,   &cmd_verify_spec,   "check every object's checksum (--deep: whole files)" },
    { "gc",       cmd_gc,       &cmd_gc_spec,       "evict least valuable objects down to a size" },
    { "pin",      cmd_pin,      &cmd_pin_spec,      "keep a model's objects (or some layers') from eviction" },
    { "unpin",    cmd_unpin,    &cmd_unpin_spec,    "let them be evicted again" },
    { "rm",       cmd_rm,       &cmd_rm_spec,       "remove a model from the cache" },
    { "export",   cmd_export,   &cmd_export_spec,   "write a model's complete files to a dir or an HF cache" },
    { "heatmap",  cmd_heatmap,  &cmd_heatmap_spec,  "layer x expert request counts as SVG or ASCII" },
    { "estimate", cmd_estimate, &cmd_estimate_spec, "expected seconds per token: streaming, disk, RAM" },
    { "doctor",   cmd_doctor,   &cmd_doctor_spec,   "check the machine, shoald, the upstream and the engine's output" },
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

/* The same list for the help, the man page and the completion. */
static shoal_cli_cmd command_list[NCOMMANDS + 2];

enum { O_HOME = 1, O_SOCKET, O_VERBOSE, O_QUIET };

static const shoal_cli_opt OPTS[] = {
    { "home", 0, "DIR", O_HOME, "the cache directory (default: $SHOAL_HOME, else\n"
                                "$XDG_CACHE_HOME/shoal, else ~/.cache/shoal)" },
    { "socket", 0, "PATH", O_SOCKET, "shoald's socket (default: HOME/shoald.sock)" },
    { "verbose", 'v', NULL, O_VERBOSE, "log more (twice: debug)" },
    { "quiet", 'q', NULL, O_QUIET, "no progress display (also HF_HUB_DISABLE_PROGRESS_BARS=1)" },
    { NULL, 0, NULL, 0, NULL },
};

static shoal_cli_spec SPEC = {
    .prog = "shoal",
    .summary = "warm, inspect and manage the shoal cache",
    .synopsis = "shoal [--home DIR] [--socket PATH] [-v] [-q] COMMAND [ARGS]",
    .about = "Warm, inspect and manage the shoal cache that shoald serves.  Commands that\n"
             "only read ask shoald when it runs and read the index otherwise; commands that\n"
             "change the cache go through shoald when it runs.  `shoal COMMAND --help`\n"
             "describes a command.",
    .opts = OPTS,
    .notes = "Progress goes to stderr: a bar on a terminal, a line every 5 s otherwise;\n"
             "NO_COLOR turns its colour off.  Exit codes (docs/cli.md): 0 ok, 1 failed,\n"
             "2 usage, 3 shoald not running (needed), 4 not found, 5 damaged, 6 shoald\n"
             "runs and must be stopped first, 7 upstream failed, 8 no space, 130 interrupted\n"
             "(a warm job keeps going); doctor: 1 when a check failed.",
    .command_first = 1,
    .man_extra = ".SH ENVIRONMENT\n"
                 "SHOAL_HOME, XDG_CACHE_HOME, HOME (the cache directory); NO_COLOR,\n"
                 "HF_HUB_DISABLE_PROGRESS_BARS (the progress display).\n"
                 ".SH \"SEE ALSO\"\nshoald(8), shoal\\-engine(1)\n",
};

/* org/name: letters, digits, '.', '_' and '-', at most 96 each (the Hub's) */
static int name_part(const char *s, size_t n)
{
    if (n == 0 || n > 96)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
            return 0;
    return 1;
}

int cli_model_arg(const shoal_cli_spec *spec, const char *arg, char *out, size_t cap)
{
    const char *r = strncmp(arg, "hf://", 5) == 0 ? arg + 5 : arg;
    const char *slash = strchr(r, '/'), *at = strchr(r, '@');
    size_t end = at ? (size_t)(at - r) : strlen(r);
    struct stat st;

    if (r == arg && (stat(strncmp(arg, "file://", 7) == 0 ? arg + 7 : arg, &st) == 0 ||
                     arg[0] == '/' || arg[0] == '.')) {
        cli_model_spec(arg, out, cap);   /* a directory (or a path that will say why not) */
        return 0;
    }
    if (!slash || (size_t)(slash - r) >= end || !name_part(r, (size_t)(slash - r)) ||
        !name_part(slash + 1, end - (size_t)(slash - r) - 1) || (at && (!at[1] || strchr(at, ' '))))
        return shoal_cli_usage_error(spec, "'%s' is not a model: give hf://org/name[@revision], "
                                     "org/name[@revision] or a model directory", arg);
    cli_model_spec(arg, out, cap);
    return 0;
}

static void spec_finish(void)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        command_list[i] = (shoal_cli_cmd){ commands[i].name, commands[i].spec,
                                           commands[i].summary };
    command_list[NCOMMANDS] = (shoal_cli_cmd){ "help", NULL, "help COMMAND: a command's help" };
    SPEC.cmds = command_list;
}

int main(int argc, char **argv)
{
    shoal_cli cli;
    shoal_env env;
    shoal_err err = { 0, "" };
    const char *home_flag = NULL, *v;
    shoal_cli_parser p;
    int i, id, quiet = 0;

    memset(&cli, 0, sizeof cli);
    spec_finish();
    shoal_cli_begin(&p, &SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case O_HOME:    home_flag = v; break;
        case O_SOCKET:  cli.socket_path = v; break;
        case O_VERBOSE: cli.verbose++; break;
        case O_QUIET:   quiet = 1; break;
        }
    }
    if (id < 0)
        return p.exit;
    i = p.optind;
    if (i >= argc)
        return shoal_cli_usage_error(&SPEC, "give a COMMAND (%s, ...)", commands[0].name);
    shoal_log_setup("shoal", cli.verbose >= 2 ? SHOAL_LOG_DEBUG
                             : cli.verbose ? SHOAL_LOG_INFO : SHOAL_LOG_WARN, NULL);
    shoal_meter_env_capture(&cli.meter, quiet);
    shoal_env_capture(&env);
    cli.hf_endpoint = getenv("HF_ENDPOINT");
    cli.hf_offline = getenv("HF_HUB_OFFLINE");
    cli.tmpdir = getenv("TMPDIR");
    if (shoal_home_resolve(&env, home_flag, cli.home, sizeof cli.home, &err) != 0) {
        fprintf(stderr, "shoal: %s (pass --home DIR or set SHOAL_HOME)\n", err.msg);
        return EXIT_USAGE;
    }
    cli.tty = isatty(STDOUT_FILENO);
    if (!strcmp(argv[i], "help")) {
        if (i + 1 < argc)
            for (size_t k = 0; k < NCOMMANDS; k++)
                if (!strcmp(argv[i + 1], commands[k].name)) {
                    shoal_cli_help(commands[k].spec, stdout);
                    return EXIT_OK_;
                }
        shoal_cli_help(&SPEC, stdout);
        return i + 1 < argc ? shoal_cli_usage_error(&SPEC, "no command '%s'", argv[i + 1])
                            : EXIT_OK_;
    }
    for (size_t k = 0; k < NCOMMANDS; k++)
        if (!strcmp(argv[i], commands[k].name))
            return commands[k].run(&cli, argc - i, argv + i);
    return shoal_cli_usage_error(&SPEC, "no command '%s'", argv[i]);
}
