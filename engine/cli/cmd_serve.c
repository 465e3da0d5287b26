/* cmd_serve.c — `shoal-engine serve MODEL`: the OpenAI-compatible HTTP
 * server over a local model directory (docs/server.md).
 *
 * Owns: option parsing, binding the model, the "listening on" line, signal
 * dispositions of the process.  Does not own the server (server.c) nor
 * generation.
 */
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/path.h"
#include "engine/cli/cli_int.h"
#include "engine/serve/serve.h"
#include "engine/forward/forward.h"

static void usage(FILE *f)
{
    fputs("usage: shoal-engine serve MODEL [options]\n"
          "\n"
          "Serves MODEL (a local model directory, or hf://org/name[@rev] through a\n"
          "running shoald) over an OpenAI-compatible HTTP API:\n"
          "GET /v1/models, POST /v1/chat/completions, POST /v1/completions,\n"
          "GET /health (and /v1/stats).  Stops cleanly on SIGINT or SIGTERM.\n"
          "\n"
          "  --host H            address to listen on (default 127.0.0.1)\n"
          "  --home DIR          shoald's cache directory for an hf:// MODEL\n"
          "                      (default $SHOAL_HOME, else the XDG cache)\n"
          "  --port P            port (default 8000; 0 picks a free one)\n"
          "  --api-key KEY       require 'Authorization: Bearer KEY' on /v1/*\n"
          "  --queue N           requests that may wait behind the running one\n"
          "                      (default 16; beyond: 429 with Retry-After)\n"
          "  --max-body SIZE     largest request body (default 4M; beyond: 413)\n"
          "  --model-name NAME   the model id clients use (default: MODEL's basename)\n"
          "  --threads N         compute threads (default: online cores)\n"
          "  --chunk N           prefill chunk size (default 16)\n"
          "  --spine int8|f32    spine numerics (default int8)\n"
          "  --log-level L       error|warn|info|debug (default info)\n"
          "\n"
          "Prints 'listening on http://HOST:PORT' on stdout once ready.\n", f);
}

static void on_listen(void *ctx, const char *host, int port)
{
    (void)ctx;
    printf("listening on http://%s:%d\n", host, port);
    fflush(stdout);
}

int engine_cmd_serve(int argc, char **argv)
{
    server_config cfg;
    gen_model_options mo = { 0 };
    gen_model gm;
    server_model sm;
    shoal_err err = { 0 };
    const char *model = NULL, *home_flag = NULL;
    char name[256], home[SHOAL_PATH_MAX];
    long v, cores = sysconf(_SC_NPROCESSORS_ONLN);
    shoal_log_level lvl = SHOAL_LOG_INFO;
    int rc;

    server_config_default(&cfg);
    mo.threads = cores > 0 ? (int)cores : 1;
    mo.chunk = 16;
    cfg.model_name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t sz;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (a[0] != '-') {
            if (model) {
                fprintf(stderr, "serve: more than one MODEL\n");
                return 2;
            }
            model = a;
            continue;
        }
        if (!val) {
            fprintf(stderr, "serve: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--host") == 0) cfg.host = val;
        else if (strcmp(a, "--home") == 0) home_flag = val;
        else if (strcmp(a, "--api-key") == 0) cfg.api_key = val;
        else if (strcmp(a, "--model-name") == 0) cfg.model_name = val;
        else if (strcmp(a, "--port") == 0 && shoal_long_parse(val, 0, 65535, &v) == 0) cfg.port = (int)v;
        else if (strcmp(a, "--queue") == 0 && shoal_long_parse(val, 0, 1 << 20, &v) == 0) cfg.queue = (size_t)v;
        else if (strcmp(a, "--threads") == 0 && shoal_long_parse(val, 1, 256, &v) == 0) mo.threads = (int)v;
        else if (strcmp(a, "--chunk") == 0 && shoal_long_parse(val, 1, 4096, &v) == 0) mo.chunk = (size_t)v;
        else if (strcmp(a, "--max-body") == 0 && shoal_size_parse(val, &sz) == 0 && sz >= 1024)
            cfg.max_body = (size_t)sz;
        else if (strcmp(a, "--spine") == 0 && (strcmp(val, "f32") == 0 || strcmp(val, "int8") == 0))
            mo.spine_f32 = strcmp(val, "f32") == 0;
        else if (strcmp(a, "--log-level") == 0 && shoal_log_level_parse(val, &lvl) == 0) ;
        else {
            fprintf(stderr, "serve: bad option or value: %s %s\n", a, val);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "serve: MODEL is needed (see --help)\n");
        return 2;
    }
    if (cfg.api_key && !cfg.api_key[0]) {
        fprintf(stderr, "serve: --api-key must not be empty\n");
        return 2;
    }
    shoal_log_set_level(lvl);
    if (strncmp(model, "hf://", 5) == 0) {
        shoal_env env;
        shoal_env_capture(&env);
        if (shoal_home_resolve(&env, home_flag, home, sizeof home, &err) != 0) {
            fprintf(stderr, "serve: %s: no cache directory for shoald: %s (use --home)\n", model,
                    err.msg);
            return 1;
        }
        mo.home = home;
    }
    if (!cfg.model_name) {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", model);
        snprintf(name, sizeof name, "%s", basename(tmp));
        cfg.model_name = name;
    }
    /* A client that vanishes must not kill the server with SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    if ((rc = gen_model_open(model, &mo, &gm, &err)) != 0) {
        fprintf(stderr, "serve: %s\n", err.msg);
        return 1;
    }
    sm = (server_model){ .tok = gm.tok, .gen = gm.gen, .n_vocab = gm.backend.n_vocab,
                         .n_ctx = gm.backend.n_ctx, .eos = gm.eos };
    cfg.on_listen = on_listen;
    rc = server_run(&cfg, &sm, &err);
    if (rc != 0)
        fprintf(stderr, "serve: %s\n", err.msg);
    gen_model_close(&gm);
    return rc == 0 ? 0 : 1;
}
