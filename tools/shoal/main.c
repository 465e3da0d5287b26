/* main.c — `shoal`, the command line to warm, inspect and manage a shoal
 * cache: global flags, the environment (read here and nowhere else), the
 * dispatch to one file per command, help and exit codes (docs/cli.md).
 */
#include "tools/shoal/shoal_int.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/version.h"

typedef struct command {
    const char *name;
    int (*run)(shoal_cli *cli, int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    { "stats",    cmd_stats,    "hit rates per tier, model, layer and session" },
    { "ls",       cmd_ls,       "cached models: revisions, bytes, coverage" },
    { "warm",     cmd_warm,     "start (and follow) a warm job in shoald" },
    { "verify",   cmd_verify,   "check every object's checksum (--deep: whole files)" },
    { "gc",       cmd_gc,       "evict least valuable objects down to a size" },
    { "pin",      cmd_pin,      "keep a model's objects (or some layers') from eviction" },
    { "unpin",    cmd_unpin,    "let them be evicted again" },
    { "rm",       cmd_rm,       "remove a model from the cache" },
    { "heatmap",  cmd_heatmap,  "layer x expert request counts as SVG or ASCII" },
    { "estimate", cmd_estimate, "expected seconds per token: streaming, disk, RAM" },
    { "doctor",   cmd_doctor,   "check the machine, shoald, the upstream and the engine's output" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: shoal [--home DIR] [--socket PATH] [-v] COMMAND [ARGS]\n\n"
               "Warm, inspect and manage the shoal cache that shoald serves.\n\nCommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n"
               "  --home DIR     the cache directory (default: $SHOAL_HOME, else\n"
               "                 $XDG_CACHE_HOME/shoal, else ~/.cache/shoal)\n"
               "  --socket PATH  shoald's socket (default: HOME/shoald.sock)\n"
               "  -v             log more (repeat for debug)\n"
               "  --version      print the version\n\n"
               "`shoal COMMAND --help` describes a command.  Exit codes: 0 ok, 1 failed,\n"
               "2 usage, 3 shoald not running (needed), 4 model or cache not found,\n"
               "5 verify found damage, 6 shoald runs and must be stopped first,\n"
               "(doctor: 1 when a check failed),\n"
               "130 interrupted (a warm job keeps going).\n");
}

int cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    shoal_cli cli;
    shoal_env env;
    shoal_err err = { 0, "" };
    const char *home_flag = NULL;
    int i = 1;

    memset(&cli, 0, sizeof cli);
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--home") && i + 1 < argc) {
            home_flag = argv[++i];
        } else if (!strncmp(argv[i], "--home=", 7)) {
            home_flag = argv[i] + 7;
        } else if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
            cli.socket_path = argv[++i];
        } else if (!strcmp(argv[i], "-v")) {
            cli.verbose++;
        } else if (!strcmp(argv[i], "-vv")) {
            cli.verbose += 2;
        } else if (!strcmp(argv[i], "--version")) {
            printf("shoal %s\n", SHOAL_VERSION);
            return EXIT_OK_;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return EXIT_OK_;
        } else {
            fprintf(stderr, "shoal: unknown option %s\n\n", argv[i]);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    shoal_log_setup("shoal", cli.verbose >= 2 ? SHOAL_LOG_DEBUG
                             : cli.verbose ? SHOAL_LOG_INFO : SHOAL_LOG_WARN, NULL);
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
            for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
                if (!strcmp(argv[i + 1], commands[k].name)) {
                    char *hv[] = { argv[i + 1], "--help", NULL };
                    return commands[k].run(&cli, 2, hv);
                }
        usage(stdout);
        return EXIT_OK_;
    }
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
        if (!strcmp(argv[i], commands[k].name)) {
            optind = 1;   /* each command parses its own argv[0..] */
            return commands[k].run(&cli, argc - i, argv + i);
        }
    fprintf(stderr, "shoal: no command '%s'\n\n", argv[i]);
    usage(stderr);
    return EXIT_USAGE;
}
