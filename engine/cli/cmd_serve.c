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
          "  --expert-ram SIZE   hf://: experts kept in RAM, e.g. 8G, 0 for none\n"
          "                      (default: half of MemAvailable)\n"
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
          "  --threads N         compute threads (default: online cores)\n"
          "  --chunk N           prefill chunk size (default 16)\n"
          "  --spine int8|f32    spine numerics (default int8)\n"
          "  --log-level L       error|warn|info|debug (default info)\n"
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
 * the argument is blanked once copied) or SHOAL_API_KEY. */
static int api_key(const char *file, char *arg, char *out, size_t cap)
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
        memset(arg, 'x', strlen(arg));
    } else if (env) {
        snprintf(out, cap, "%s", env);
    }
    return 0;
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
    shoal_err err = { 0 };
    const char *model = NULL, *home_flag = NULL, *key_file = NULL;
    char *key_arg = NULL;
    static char key[4096];
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
        else if (strcmp(a, "--api-key") == 0) key_arg = argv[i];
        else if (strcmp(a, "--api-key-file") == 0) key_file = val;
        else if (strcmp(a, "--request-timeout") == 0 && shoal_long_parse(val, 1, 86400, &v) == 0)
            cfg.request_timeout_s = (int)v;
        else if (strcmp(a, "--idle-timeout") == 0 && shoal_long_parse(val, 1, 86400, &v) == 0)
            cfg.idle_timeout_s = (int)v;
        else if (strcmp(a, "--max-connections") == 0 && shoal_long_parse(val, 1, 1 << 20, &v) == 0)
            cfg.max_connections = (size_t)v;
        else if (strcmp(a, "--expert-ram") == 0 && shoal_size_parse(val, &sz) == 0) {
            mo.expert_ram = sz;
            mo.expert_ram_set = 1;
        } else if (strcmp(a, "--max-header") == 0 && shoal_size_parse(val, &sz) == 0 && sz >= 1024 &&
                 sz <= ((uint64_t)64 << 20))
            cfg.max_header = (size_t)sz;
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
    if (api_key(key_file, key_arg, key, sizeof key) != 0)
        return 2;
    if (key_arg && !key[0]) {
        fprintf(stderr, "serve: --api-key must not be empty\n");
        return 2;
    }
    cfg.api_key = key[0] ? key : NULL;
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
        default_name(model, name, sizeof name);
        cfg.model_name = name;
    }
    /* A client that vanishes must not kill the server with SIGPIPE. */
    signal(SIGPIPE, SIG_IGN);
    cfg.model = model;
    cfg.model_opt = mo;
    cfg.on_listen = on_listen;
    rc = server_run(&cfg, &err);
    memset(key, 0, sizeof key);
    if (rc != 0)
        fprintf(stderr, "serve: %s\n", err.msg);
    return rc == 0 ? 0 : 1;
}
