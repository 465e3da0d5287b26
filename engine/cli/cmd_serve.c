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

typedef struct serve_opts {
    cli_opts c;
    server_config cfg;
    shoal_log_level lvl;
} serve_opts;

enum { S_HOST = CLI_OWN, S_PORT, S_API_KEY, S_QUEUE, S_MAX_BODY, S_MODEL_NAME, S_LOG_LEVEL };

static const cli_option SERVE_OPTS[] = {
    { "host", 1, S_HOST }, { "port", 1, S_PORT }, { "api-key", 1, S_API_KEY },
    { "queue", 1, S_QUEUE }, { "max-body", 1, S_MAX_BODY }, { "model-name", 1, S_MODEL_NAME },
    { "log-level", 1, S_LOG_LEVEL }, { NULL, 0, 0 },
};

static void usage(FILE *f)
{
    fputs("usage: shoal-engine serve MODEL [options]\n"
          "\n"
          "Serves MODEL (a local model directory, or hf://org/name[@rev] through a\n"
          "running shoald) over an OpenAI-compatible HTTP API:\n"
          "GET /v1/models, POST /v1/chat/completions, POST /v1/completions,\n"
          "GET /health (and /v1/stats).  Stops cleanly on SIGINT or SIGTERM.\n"
          "The memory plan is printed on stderr at load; a request past its context\n"
          "gets 400 context_length_exceeded.\n"
          "\n"
          "  --host H            address to listen on (default 127.0.0.1)\n"
          "  --port P            port (default 8000; 0 picks a free one)\n"
          "  --api-key KEY       require 'Authorization: Bearer KEY' on /v1/*\n"
          "  --queue N           requests that may wait behind the running one\n"
          "                      (default 16; beyond: 429 with Retry-After)\n"
          "  --max-body SIZE     largest request body (default 4M; beyond: 413)\n"
          "  --model-name NAME   the model id clients use (default: MODEL's basename)\n"
          "  --log-level L       error|warn|info|debug (default info)\n"
          "\n"
          "Prints 'listening on http://HOST:PORT' on stdout once ready.\n", f);
}

static int serve_own(void *ctx, int id, const char *val)
{
    serve_opts *o = ctx;
    uint64_t sz;
    long v;

    switch (id) {
    case S_HOST: o->cfg.host = val; return 0;
    case S_API_KEY: o->cfg.api_key = val; return 0;
    case S_MODEL_NAME: o->cfg.model_name = val; return 0;
    case S_PORT:
        if (shoal_long_parse(val, 0, 65535, &v) != 0)
            return -1;
        o->cfg.port = (int)v;
        return 0;
    case S_QUEUE:
        if (shoal_long_parse(val, 0, 1 << 20, &v) != 0)
            return -1;
        o->cfg.queue = (size_t)v;
        return 0;
    case S_MAX_BODY:
        if (shoal_size_parse(val, &sz) != 0 || sz < 1024)
            return -1;
        o->cfg.max_body = (size_t)sz;
        return 0;
    case S_LOG_LEVEL:
        return shoal_log_level_parse(val, &o->lvl) == 0 ? 0 : -1;
    }
    return -1;
}

static void on_listen(void *ctx, const char *host, int port)
{
    (void)ctx;
    printf("listening on http://%s:%d\n", host, port);
    fflush(stdout);
}

int engine_cmd_serve(int argc, char **argv)
{
    serve_opts o;
    gen_model_options mo = { 0 };
    gen_model gm;
    server_model sm;
    shoal_err err = { 0 };
    char name[256];
    int rc;

    memset(&o, 0, sizeof o);
    cli_opts_init(&o.c);
    server_config_default(&o.cfg);
    o.cfg.model_name = NULL;
    o.lvl = SHOAL_LOG_INFO;
    if ((rc = cli_parse("serve", argc, argv, SERVE_OPTS, serve_own, &o, usage, &o.c)) != 0)
        return rc == 1 ? 0 : 2;
    if (o.cfg.api_key && !o.cfg.api_key[0]) {
        fprintf(stderr, "serve: --api-key must not be empty\n");
        return 2;
    }
    shoal_log_set_level(o.lvl);
    if (cli_home("serve", &o.c, &err) != 0)
        return 1;
    if (!o.cfg.model_name) {
        char tmp[256];
        snprintf(tmp, sizeof tmp, "%s", o.c.model);
        snprintf(name, sizeof name, "%s", basename(tmp));
        o.cfg.model_name = name;
    }
    /* A client that vanishes must not kill the server with SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    o.c.load.plan_out = stderr;
    o.c.load.progress = cli_progress;
    mo.load = &o.c.load;
    if ((rc = gen_model_open(o.c.model, &mo, &gm, &err)) != 0) {
        fprintf(stderr, "serve: %s\n", err.msg);
        return 1;
    }
    sm = (server_model){ .tok = gm.tok, .gen = gm.gen, .n_vocab = gm.backend.n_vocab,
                         .n_ctx = gm.backend.n_ctx, .eos = gm.eos };
    o.cfg.on_listen = on_listen;
    rc = server_run(&o.cfg, &sm, &err);
    if (rc != 0)
        fprintf(stderr, "serve: %s\n", err.msg);
    gen_model_close(&gm);
    return rc == 0 ? 0 : 1;
}
