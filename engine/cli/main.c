/* main.c — shoal-engine's entry point: configures logging and dispatches
 * to a subcommand (engine/cli/cli_int.h).  Owns nothing else. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "common/log.h"
#include "common/version.h"
#include "engine/cli/cli_int.h"

static void usage(FILE *f)
{
    fputs("usage: shoal-engine COMMAND [options]\n"
          "\n"
          "commands:\n"
          "  run MODEL --tokens IDS [--max-tokens N] ...   greedy generation from ids\n"
          "  run MODEL --prompt TEXT [--chat] ...          generation from text\n"
          "  serve MODEL ...                               OpenAI-compatible HTTP API\n"
          "  plan MODEL [--ram SIZE] [--context N] ...     the memory plan, no weights read\n"
          "  tokenize [MODEL_DIR] ...                      text <-> token ids\n"
          "  info [--json]                                 version, kernels' ISA, cores\n"
          "\n"
          "  shoal-engine COMMAND --help   options of a command\n"
          "  shoal-engine --version\n", f);
}

int main(int argc, char **argv)
{
    struct rlimit rl;

    shoal_log_setup("shoal-engine", SHOAL_LOG_WARN, NULL);
    /* an hf:// model with --page-cache dontneed keeps one descriptor per
     * expert in the RAM tier (thousands for K3): allow what the hard limit does */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("shoal-engine %s\n", SHOAL_VERSION);
        return 0;
    }
    if (strcmp(argv[1], "info") == 0)
        return engine_cmd_info(argc - 1, argv + 1);
    if (strcmp(argv[1], "tokenize") == 0)
        return engine_cmd_tokenize(argc - 1, argv + 1);
    if (strcmp(argv[1], "run") == 0)
        return engine_cmd_run(argc - 1, argv + 1);
    if (strcmp(argv[1], "prompt") == 0)
        return engine_cmd_prompt(argc - 1, argv + 1);
    if (strcmp(argv[1], "serve") == 0)
        return engine_cmd_serve(argc - 1, argv + 1);
    if (strcmp(argv[1], "plan") == 0)
        return engine_cmd_plan(argc - 1, argv + 1);
    fprintf(stderr, "shoal-engine: unknown command %s\n", argv[1]);
    usage(stderr);
    return 2;
}
