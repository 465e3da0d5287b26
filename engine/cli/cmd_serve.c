/* cmd_serve.c — `shoal-engine serve MODEL`: the OpenAI-compatible HTTP
 * server over a local model directory or an hf:// model (docs/server.md).
 *
 * Owns: option parsing, the API key's sources (--api-key-file,
 * SHOAL_API_KEY, --api-key), the model id, the "listening on" line, signal
 * dispositions of the process.  Does not own the server (server.c, which
 * also binds the model once its port is open) nor generation.
 */
#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/path.h"
#include "engine/cli/cli_int.h"
#include "engine/ranks/ranks.h"
#include "engine/serve/serve.h"
#include "engine/forward/forward.h"

typedef struct serve_opts {
    cli_opts c;
    server_config cfg;
    shoal_log_level lvl;
    const char *key_file;      /* --api-key-file */
    int key_arg_set;           /* --api-key was given: its copy in key_arg */
    char key_arg[4096];
    int over_ranks;            /* --experts-over-ranks (docs/mpi.md) */
    cli_ranks ranks;
} serve_opts;

enum {
    S_HOST = CLI_OWN, S_PORT, S_API_KEY, S_API_KEY_FILE, S_QUEUE, S_MAX_BODY, S_MAX_HEADER,
    S_REQUEST_TIMEOUT, S_IDLE_TIMEOUT, S_MAX_CONNECTIONS, S_MODEL_NAME, S_LOG_LEVEL,
    S_RANKS,
};

/* --expert-ram, --threads, --chunk, --spine, --home are the shared table's
 * (options.c). */
static const cli_option SERVE_OPTS[] = {
    { "host", 1, S_HOST }, { "port", 1, S_PORT }, { "api-key", 1, S_API_KEY },
    { "api-key-file", 1, S_API_KEY_FILE }, { "queue", 1, S_QUEUE },
    { "max-body", 1, S_MAX_BODY }, { "max-header", 1, S_MAX_HEADER },
    { "request-timeout", 1, S_REQUEST_TIMEOUT }, { "idle-timeout", 1, S_IDLE_TIMEOUT },
    { "max-connections", 1, S_MAX_CONNECTIONS }, { "model-name", 1, S_MODEL_NAME },
    { "log-level", 1, S_LOG_LEVEL }, { "experts-over-ranks", 0, S_RANKS }, { NULL, 0, 0 },
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
          "  --api-key-file FILE require 'Authorization: Bearer KEY' on /v1/* (and\n"
          "                      /tokenize, /detokenize), KEY the file's first line;\n"
          "                      $SHOAL_API_KEY does the same\n"
          "  --api-key KEY       the same from the command line (visible in ps)\n"
          "  --queue N           requests that may wait behind the running one\n"
          "                      (default 16; 0: none; beyond: 429 with Retry-After)\n"
          "  --max-body SIZE     largest request body (default 4M; beyond: 413)\n"
          "  --max-header SIZE   largest request line + headers (default 32K; beyond: 413)\n"
          "  --request-timeout S a request must arrive within S seconds (default 60; 408)\n"
          "  --idle-timeout S    close a connection idle for S seconds (default 30)\n"
          "  --max-connections N open connections at most (default 256)\n"
          "  --model-name NAME   the model id clients use (default: org/name for\n"
          "                      hf://org/name, else MODEL's directory name)\n"
          "  --log-level L       error|warn|info|debug (default info)\n"
          "  --experts-over-ranks  under mpirun -np N (a `make MPI=1` build): rank 0\n"
          "                      serves, ranks 1..N-1 apply the routed experts, each\n"
          "                      with its own shoald (%r in --home is the rank); docs/mpi.md\n"
          "\n"
          "The port opens first (GET /health answers 503 \"loading\" meanwhile);\n"
          "'listening on http://HOST:PORT' goes to stdout once the model is ready.\n", f);
}

/* The id clients name: org/name for hf://org/name[@rev] and for a snapshot
 * in the Hugging Face cache layout (.../models--org--name/snapshots/REV),
 * else the directory's name. */
static void default_name(const char *model, char *out, size_t cap)
{
    char tmp[1024];
    const char *m;
    size_t n;

    if (strncmp(model, "hf://", 5) == 0) {
        snprintf(out, cap, "%.*s", (int)strcspn(model + 5, "@"), model + 5);
        return;
    }
    snprintf(tmp, sizeof tmp, "%s", model);
    for (n = strlen(tmp); n > 1 && tmp[n - 1] == '/'; n--)
        tmp[n - 1] = 0;
    if ((m = strstr(tmp, "models--")) && strstr(m, "/snapshots/")) {
        const char *org = m + 8, *sep = strstr(org, "--");
        size_t end = strcspn(org, "/");
        if (sep && (size_t)(sep - org) < end) {
            snprintf(out, cap, "%.*s/%.*s", (int)(sep - org), org, (int)(end - (size_t)(sep - org) - 2),
                     sep + 2);
            return;
        }
    }
    snprintf(out, cap, "%s", basename(tmp));
}

/* The key from a file: its first line, without surrounding blanks. */
static int key_from_file(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    struct stat st;
    size_t n;
    char *p = out;

    if (!f) {
        fprintf(stderr, "serve: --api-key-file %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        fprintf(stderr, "serve: warning: %s can be read by other users (chmod 600 it)\n", path);
    if (!fgets(out, (int)cap, f))
        out[0] = 0;
    fclose(f);
    while (*p && isspace((unsigned char)*p))
        p++;
    memmove(out, p, strlen(p) + 1);
    for (n = strlen(out); n > 0 && isspace((unsigned char)out[n - 1]); n--)
        out[n - 1] = 0;
    if (!out[0]) {
        fprintf(stderr, "serve: --api-key-file %s holds no key\n", path);
        return -1;
    }
    return 0;
}

/* One source of the key: --api-key-file, --api-key (warned: ps shows it;
 * serve_own blanked the argument once copied) or SHOAL_API_KEY. */
static int api_key(const char *file, const char *arg, char *out, size_t cap)
{
    const char *env = getenv("SHOAL_API_KEY");    /* the program's edge: lint: allow */
    out[0] = 0;
    if (file && arg) {
        fprintf(stderr, "serve: give the key once: --api-key-file or --api-key\n");
        return -1;
    }
    if (file)
        return key_from_file(file, out, cap);
    if (arg) {
        fprintf(stderr, "serve: warning: --api-key is visible to every user in ps; use "
                        "--api-key-file or SHOAL_API_KEY\n");
        snprintf(out, cap, "%s", arg);
    } else if (env) {
        snprintf(out, cap, "%s", env);
    }
    return 0;
}

static int serve_own(void *ctx, int id, const char *val)
{
    serve_opts *o = ctx;
    uint64_t sz;
    long v;

    switch (id) {
    case S_HOST: o->cfg.host = val; return 0;
    case S_API_KEY:
        /* val is argv's own bytes (getopt moves pointers, not strings):
         * copied, then blanked where ps reads them */
        snprintf(o->key_arg, sizeof o->key_arg, "%s", val);
        memset((char *)val, 'x', strlen(val));
        o->key_arg_set = 1;
        return 0;
    case S_API_KEY_FILE: o->key_file = val; return 0;
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
    case S_MAX_HEADER:
        if (shoal_size_parse(val, &sz) != 0 || sz < 1024 || sz > ((uint64_t)64 << 20))
            return -1;
        o->cfg.max_header = (size_t)sz;
        return 0;
    case S_REQUEST_TIMEOUT:
    case S_IDLE_TIMEOUT:
        if (shoal_long_parse(val, 1, 86400, &v) != 0)
            return -1;
        *(id == S_REQUEST_TIMEOUT ? &o->cfg.request_timeout_s : &o->cfg.idle_timeout_s) = (int)v;
        return 0;
    case S_MAX_CONNECTIONS:
        if (shoal_long_parse(val, 1, 1 << 20, &v) != 0)
            return -1;
        o->cfg.max_connections = (size_t)v;
        return 0;
    case S_RANKS: o->over_ranks = 1; return 0;
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
    shoal_err err = { 0 };
    static char key[4096];
    char name[256];
    int rc;

    memset(&o, 0, sizeof o);
    cli_opts_init(&o.c);
    server_config_default(&o.cfg);
    o.cfg.model_name = NULL;
    o.lvl = SHOAL_LOG_INFO;
    if ((rc = cli_parse("serve", argc, argv, SERVE_OPTS, serve_own, &o, usage, &o.c)) != 0)
        return rc == 1 ? 0 : 2;
    rc = api_key(o.key_file, o.key_arg_set ? o.key_arg : NULL, key, sizeof key);
    memset(o.key_arg, 0, sizeof o.key_arg);
    if (rc != 0)
        return 2;
    if (o.key_arg_set && !key[0]) {
        fprintf(stderr, "serve: --api-key must not be empty\n");
        return 2;
    }
    o.cfg.api_key = key[0] ? key : NULL;
    shoal_log_set_level(o.lvl);
    if (cli_home("serve", &o.c, &err) != 0)
        return 1;
    if (o.over_ranks && (rc = cli_ranks_begin("serve", &o.c, &argc, &argv, &o.ranks)) >= 0)
        return rc;
    if (!o.cfg.model_name) {
        default_name(o.c.model, name, sizeof name);
        o.cfg.model_name = name;
    }
    /* A client that vanishes must not kill the server with SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    /* the port opens first; the worker loads under the plan (printed on
     * stderr), its steps on /health and the pack's progress on stderr */
    o.c.load.plan_out = stderr;
    o.c.load.progress = cli_progress;
    mo.load = &o.c.load;
    o.cfg.model = o.c.model;
    o.cfg.model_opt = mo;
    o.cfg.on_listen = on_listen;
    rc = server_run(&o.cfg, &err);
    memset(key, 0, sizeof key);
    if (rc != 0)
        fprintf(stderr, "serve: %s\n", err.msg);
    if (o.over_ranks) {            /* rank 0: end the owners with it */
        fflush(stderr);
        if (rc != 0)
            ranks_abort(1);
        ranks_lead_free(o.ranks.lead);
        ranks_finish();
    }
    return rc == 0 ? 0 : 1;
}
