/* serve_int.h — what server.c (the HTTP loop) and server_worker.c (the
 * generation thread) share.  Private to engine/serve/.
 *
 * Threads and ownership:
 *   1. The loop thread owns every libevent object and job->req / evcon /
 *      orphan / streaming / lnext; the worker never touches them.
 *   2. Queue, outbox and stats are under srv->mu.  The worker hands output
 *      to the loop by appending an out_msg and activating srv->wake.
 *   3. A job lives from admission to its final message (OUT_REPLY or
 *      OUT_STREAM_END), which the worker posts exactly once and after which
 *      it never touches the job; the loop frees the job on that message.
 *   4. job->cancel may be set by either thread (client gone, shutdown).
 */
#ifndef SHOAL_ENGINE_SERVE_INT_H
#define SHOAL_ENGINE_SERVE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/buf.h"
#include "engine/serve/serve.h"

struct event_base;
struct event;
struct evhttp;
struct evhttp_request;
struct evhttp_connection;

typedef struct server server;

typedef enum out_kind {
    OUT_STREAM_START = 0,              /* 200, text/event-stream */
    OUT_DATA = 1,                      /* SSE bytes */
    OUT_STREAM_END = 2,                /* final: end the chunked reply */
    OUT_REPLY = 3                      /* final: whole reply (status, JSON body) */
} out_kind;

typedef struct out_msg {
    struct job *j;
    out_kind kind;
    int status;
    shoal_buf body;
    struct out_msg *next;
} out_msg;

typedef struct job {
    server *srv;
    openai_request r;
    char id[48];
    int64_t created;
    atomic_int cancel;
    out_msg fin;                       /* the final message, preallocated so
                                          ending a job cannot fail */
    struct job *qnext;                 /* queue link (mu) */
    /* loop thread only */
    struct evhttp_request *req;        /* NULL once libevent freed it */
    struct evhttp_connection *evcon;
    int orphan;                        /* req detached from a dead connection: ours to free */
    int streaming;                     /* reply started */
    struct job *lprev, *lnext;         /* live jobs, for disconnect polling */
} job;

typedef struct server_counters {
    uint64_t requests;                 /* generation requests admitted */
    uint64_t completed, cancelled, failed;
    uint64_t rejected_busy;            /* 429 */
    uint64_t last_decode_ns;           /* the last request's decode, callbacks included */
    uint64_t last_decode_model_ns;     /* of which in the forward pass */
    uint64_t last_prefill_ns;          /* the last request's prompt run */
    uint64_t last_completion_tokens;
    gen_stats gen;                     /* copied after each run */
} server_counters;

struct server {
    server_config cfg;
    server_model m;
    struct event_base *base;
    struct evhttp *http;
    struct event *wake, *sig_int, *sig_term, *poll;
    pthread_t worker;
    int worker_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    job *q_head, *q_tail;
    size_t q_len;
    job *running;
    int stopping;
    out_msg *out_head, *out_tail;
    server_counters n;
    /* loop thread only */
    job *live;
    int shutting_down;
};

/* Worker side (server_worker.c). */
void *server_worker_main(void *arg);

/* Post a message (takes body's contents) and wake the loop.  Final kinds
 * (OUT_STREAM_END, OUT_REPLY) use the job's preallocated message and end
 * the worker's use of the job; they cannot fail.  Otherwise 0 or
 * SHOAL_ENOMEM (body freed, the job cancelled). */
int server_post(server *srv, job *j, out_kind kind, int status, shoal_buf *body);

/* Post an OpenAI-shaped error as the job's final reply. */
void server_post_error(server *srv, job *j, const openai_error *e);

#endif
