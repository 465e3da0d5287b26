/* server.h — the OpenAI-compatible HTTP server (docs/server.md).
 *
 * Owns: the libevent HTTP loop (evhttp) on the caller's thread, one worker
 * thread that runs generations one at a time, the bounded FIFO of waiting
 * requests, API-key checks, disconnect detection and cancellation, server
 * statistics, clean shutdown on SIGINT/SIGTERM.  Does not own the model,
 * the tokenizer nor the generator (all borrowed), nor request parsing
 * (openai.h).
 */
#ifndef SHOAL_ENGINE_SERVER_H
#define SHOAL_ENGINE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/generate.h"
#include "engine/tokenizer.h"

typedef struct server_config {
    const char *host;          /* "127.0.0.1" */
    int         port;          /* 8000; 0 picks a free port */
    const char *api_key;       /* NULL: no key needed */
    size_t      queue;         /* waiting requests beyond the running one (16) */
    size_t      max_body;      /* request bodies above this get 413 (4 MiB) */
    const char *model_name;    /* the id /v1/models lists and requests may name */
    size_t      prefill_step;  /* prompt ids per forward call (cancellation
                                  granularity); 0: 64 */
    /* Called once the socket listens, with the bound port (for a caller
     * that prints where it is).  May be NULL. */
    void (*on_listen)(void *ctx, const char *host, int port);
    void *on_listen_ctx;
} server_config;

void server_config_default(server_config *c);

/* What generation needs, borrowed for the server's life.  gen is used by
 * the worker thread only. */
typedef struct server_model {
    const tokenizer *tok;
    generator       *gen;
    uint32_t         n_vocab;  /* ids the model accepts */
    size_t           n_ctx;    /* positions */
    uint32_t         eos;      /* <|end_of_msg|> */
} server_model;

/* Serve until SIGINT or SIGTERM (the handlers are installed for the call).
 * 0 after a clean shutdown, or a negative code (cannot bind: SHOAL_EIO,
 * with the address in err). */
int server_run(const server_config *cfg, const server_model *m, shoal_err *err);

#endif
