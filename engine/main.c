/* main.c — shoal-engine's entry point: configures logging and dispatches
 * to a subcommand (engine/commands.h).  Owns nothing else. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/version.h"
#include "engine/commands.h"

static void usage(FILE *f)
{
    fputs("usage: shoal-engine COMMAND [options]\n"
          "\n"
          "commands:\n"
          "  run MODEL --tokens IDS [--max-tokens N] ...   greedy generation from ids\n"
          "  run MODEL --prompt TEXT [--chat] ...          generation from text\n"
          "  serve MODEL ...                               OpenAI-compatible HTTP API\n"
          "  tokenize [MODEL_DIR] ...                      text <-> token ids\n"
          "\n"
          "  shoal-engine COMMAND --help   options of a command\n"
          "  shoal-engine --version\n", f);
}

int main(int argc, char **argv)
{
    shoal_log_setup("shoal-engine", SHOAL_LOG_WARN, NULL);
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
    if (strcmp(argv[1], "tokenize") == 0)
        return engine_cmd_tokenize(argc - 1, argv + 1);
    if (strcmp(argv[1], "run") == 0)
        return engine_cmd_run(argc - 1, argv + 1);
    if (strcmp(argv[1], "prompt") == 0)
        return engine_cmd_prompt(argc - 1, argv + 1);
    if (strcmp(argv[1], "serve") == 0)
        return engine_cmd_serve(argc - 1, argv + 1);
    fprintf(stderr, "shoal-engine: unknown command %s\n", argv[1]);
    usage(stderr);
    return 2;
}
