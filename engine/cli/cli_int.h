/* cli_int.h — shoal-engine's subcommands, each a main()-like entry point
 * that engine/cli/main.c dispatches to by name.  Private to engine/cli/.
 *
 * Convention: argv[0] is the subcommand's name ("tokenize"); the return
 * value is the process exit status (0 success, 1 failure, 2 usage error).
 * Commands print to stdout/stderr: they are the program's edge.
 */
#ifndef SHOAL_ENGINE_CLI_INT_H
#define SHOAL_ENGINE_CLI_INT_H

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

#endif
