/* serve_int.h — what the server's files share: server.c (the HTTP loop,
 * routing, delivery, lifecycle), server_conn.c (the listener and the
 * connections: limits, deadlines, back-off), server_info.c (/health,
 * /metrics, /tokenize, /detokenize) and server_worker.c (the worker
 * thread: loading, the daemon connection, generations).  Private to
 * engine/serve/.
 *
 * Threads and ownership:
 *   1. The loop thread owns every libevent object and the conn list, and
 *      job->req / conn / orphan / streaming / lnext; the worker never
 *      touches them.
 *   2. Queue, outbox, phase, link state and counters are under srv->mu.
 *      The worker hands output to the loop by appending an out_msg and
 *      activating srv->wake.
 *   3. A job lives from admission to its final message (OUT_REPLY or
 *      OUT_STREAM_END), which the worker posts exactly once and after which
 *      it never touches the job; the loop frees the job on that message.
 *   4. job->cancel may be set by either thread (client gone, shutdown).
 *   5. srv->gm belongs to the worker; srv->m is written once, before phase
 *      becomes SRV_READY, and read-only afterwards (the tokenizer is safe
 *      to use from many threads).
 */
#ifndef SHOAL_ENGINE_SERVE_INT_H
#define SHOAL_ENGINE_SERVE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/buf.h"
#include "engine/forward/forward.h"
#include "engine/serve/serve.h"

struct event_base;
struct event;
struct evhttp;
struct evhttp_request;
struct evhttp_connection;
struct evconnlistener;
struct bufferevent;

typedef struct server server;
typedef struct conn conn;
struct evbuffer_cb_entry;

/* What generation needs, set by the worker once the model is bound. */
typedef struct server_model {
    const tokenizer *tok;
    generator       *gen;
    uint32_t         n_vocab;  /* ids the model accepts */
    size_t           n_ctx;    /* positions */
    uint32_t         eos;      /* <|end_of_msg|> */
} server_model;

typedef enum server_phase {
    SRV_LOADING = 0,           /* the port is open, the model is being bound */
    SRV_READY = 1,
    SRV_FAILED = 2             /* the model did not open: the loop exits */
} server_phase;

/* The daemon connection of an hf:// model. */
typedef enum server_link {
    LINK_LOCAL = 0,            /* a local directory: no daemon */
    LINK_OK = 1,
    LINK_RECONNECTING = 2,     /* lost; attempts are being made */
    LINK_DOWN = 3              /* lost for more than SERVER_LINK_DOWN_S: attempts go on, slower */
} server_link;

#define SERVER_LINK_DOWN_S 10
const char *server_link_name(server_link l);   /* "local", "ok", "reconnecting", "down" */
struct server;
/* srv->link as it stands now (mu held): "reconnecting" turns "down" after
 * SERVER_LINK_DOWN_S even between attempts. */
server_link server_link_now(struct server *srv);

/* Endpoints and statuses, for the request counters of /metrics. */
typedef enum server_ep {
    EP_CHAT = 0, EP_COMPLETIONS, EP_MODELS, EP_HEALTH, EP_METRICS, EP_TOKENIZE,
    EP_DETOKENIZE, EP_OTHER, EP_COUNT
} server_ep;

const char *server_ep_name(server_ep e);
#define SERVER_N_CODES 11
extern const int SERVER_CODES[SERVER_N_CODES];   /* the statuses counted; 0: any other */

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
    int retry_after;                   /* OUT_REPLY: seconds for a Retry-After header, 0: none */
    shoal_buf body;
    struct out_msg *next;
} out_msg;

typedef struct job {
    server *srv;
    openai_request r;
    server_ep ep;
    char id[48];
    int64_t created;
    atomic_int cancel;
    out_msg fin;                       /* the final message, preallocated so
                                          ending a job cannot fail */
    struct job *qnext;                 /* queue link (mu) */
    /* loop thread only */
    struct evhttp_request *req;        /* NULL once libevent freed it */
    conn *conn;                        /* NULL once the connection closed */
    int orphan;                        /* req detached from a dead connection: ours to free */
    int streaming;                     /* reply started */
    struct job *lprev, *lnext;         /* live jobs, for disconnect polling */
} job;

/* A connection the server tracks (server_conn.c; loop thread only). */
struct conn {
    server *srv;
    struct bufferevent *bev;
    struct evhttp_connection *evcon;   /* NULL until resolved */
    uint64_t since_ns;                 /* the request being read began: the
                                          connection's start or its last reply */
    int answering;                     /* a request of it is being answered: no read deadline */
    int refused;                       /* libevent answered an error of its own on it */
    struct evbuffer_cb_entry *out_cb;  /* watches its output for those (on_out) */
    job *job;                          /* the job answering it, if any */
    conn *prev, *next;
};

/* Histogram buckets of the time per output token (seconds), /metrics. */
#define SERVER_TPOT_BUCKETS 13
extern const double SERVER_TPOT_LE[SERVER_TPOT_BUCKETS];

typedef struct server_counters {
    uint64_t requests;                 /* generation requests admitted */
    uint64_t completed, cancelled, failed;
    uint64_t rejected_busy;            /* 429 */
    uint64_t rejected_link;            /* 503: the daemon was not reachable */
    uint64_t last_decode_ns;           /* the last request's decode, callbacks included */
    uint64_t last_decode_model_ns;     /* of which in the forward pass */
    uint64_t last_prefill_ns;          /* the last request's prompt run */
    uint64_t last_completion_tokens;
    uint64_t prefill_ns, decode_ns, decode_model_ns;   /* sums over requests */
    uint64_t tpot[SERVER_TPOT_BUCKETS];   /* requests per bucket (not cumulative) */
    uint64_t tpot_count;
    double   tpot_sum;
    gen_stats gen;                     /* copied after each run */
    expert_source_stats src;           /* copied as generation runs */
    uint64_t expert_bytes;             /* one expert's span (bytes per tier = hits x this) */
    uint64_t reconnects;               /* daemon connections replaced */
} server_counters;

/* A log line that may repeat fast (accept failures): the first is logged,
 * the next ones in the same 10 s are counted and summed up in one line. */
typedef struct server_ratelog {
    uint64_t window_ns;        /* the window began (0: none open) */
    uint64_t suppressed;       /* lines not written in it */
    const char *tag;
    char last[200];            /* the last line not written */
} server_ratelog;

struct server {
    server_config cfg;
    server_model m;                    /* rule 5 */
    gen_model gm;                      /* the worker's */
    struct event_base *base;
    struct evhttp *http;
    struct event *wake, *sig_int, *sig_term, *poll, *ready, *drain;
    pthread_t worker;
    int worker_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    job *q_head, *q_tail;
    size_t q_len;
    job *running;
    int stopping;
    int worker_done;                   /* the worker left its loop */
    out_msg *out_head, *out_tail;
    server_counters n;
    server_phase phase;
    char load_what[96];                /* what the load is doing (its progress step) */
    uint64_t load_done, load_total;    /* ... and how far, when measured (bytes) */
    /* the caller's load progress, after ours (the worker's; the remote
     * keeps the callback for its life, so this outlives the load) */
    engine_progress_fn load_chain;
    void *load_chain_ctx;
    uint64_t load_t0_ns, load_ns;      /* its start, its length once done */
    shoal_err load_err;                /* SRV_FAILED: why */
    server_link link;
    uint64_t link_lost_ns;             /* when it was lost */
    char link_err[192];                /* the last failure talking to the daemon */
    /* loop thread only */
    job *live;
    int shutting_down, signals;
    uint64_t drain_deadline_ns;
    int port;
    int rc;                            /* server_run's result once the loop ends */
    /* connections (server_conn.c) */
    struct evconnlistener *lev;
    conn *conns, *pending;             /* tracked; created, not resolved yet */
    struct event *resolve, *resume;
    size_t n_conns;                    /* both lists */
    int paused_cap, paused_err, closing, lev_off, in_cap;
    uint64_t backoff_ms;
    server_ratelog accept_log, cap_log;
    uint64_t conns_accepted, accept_errors, listener_pauses, request_timeouts, evictions;
    uint64_t refused_too_large;        /* 413s libevent sent: a header or body past the limit */
    uint64_t refused_bad_request;      /* 400s it sent: a request line or header it could not
                                          take (one line past --max-header among them) */
    int warned_untracked;
    uint64_t http_count[EP_COUNT][SERVER_N_CODES];
};

/* ---- server.c ---- */

/* Post a message (takes body's contents) and wake the loop.  Final kinds
 * (OUT_STREAM_END, OUT_REPLY) use the job's preallocated message and end
 * the worker's use of the job; they cannot fail.  Otherwise 0 or
 * SHOAL_ENOMEM (body freed, the job cancelled). */
int server_post(server *srv, job *j, out_kind kind, int status, shoal_buf *body);

/* Post an OpenAI-shaped error as the job's final reply (retry_after: seconds
 * for a Retry-After header, 0 for none). */
void server_post_error(server *srv, job *j, const openai_error *e, int retry_after);

/* Replies on the loop thread, counted for /metrics under ep. */
void server_send_json(server *srv, struct evhttp_request *req, server_ep ep, int status,
                      const void *body, size_t len);
void server_send_text(server *srv, struct evhttp_request *req, server_ep ep, int status,
                      const char *content_type, const void *body, size_t len);
void server_send_error(server *srv, struct evhttp_request *req, server_ep ep, int status,
                       const char *type, const char *param, const char *code, const char *msg);
void server_count(server *srv, server_ep ep, int status);

/* The connection of job j closed (server_conn.c tells). */
void server_job_conn_closed(server *srv, job *j);

/* ---- server_conn.c ---- */

/* Listen on cfg host:port through our own listener (a connection cap and
 * accept back-off; evhttp reads the connections it accepts), set the
 * limits on srv->http, and set srv->port.  0 or SHOAL_EIO with the address. */
int server_conn_listen(server *srv, shoal_err *err);
/* Stop accepting for good (shutdown). */
void server_conn_stop_accepting(server *srv);
/* The connection tracking a request arrived on (NULL: untracked). */
conn *server_conn_of(server *srv, struct evhttp_request *req);
/* Mark a request being answered, so its connection's read deadline waits
 * for the reply to be written. */
void server_conn_answering(server *srv, struct evhttp_request *req);
/* Every 100 ms: close connections past the request deadline (408). */
void server_conn_sweep(server *srv);
/* Bytes not yet written to any connection (the shutdown drain waits). */
size_t server_conn_unsent(server *srv);
/* Teardown: let go of unresolved connections before evhttp_free. */
void server_conn_release(server *srv);
void server_ratelog_note(server_ratelog *rl, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A window that ended with lines not written: one line that counts them. */
void server_ratelog_flush(server_ratelog *rl);

/* ---- server_info.c ---- */

void server_health(server *srv, struct evhttp_request *req, server_ep ep);
void server_metrics(server *srv, struct evhttp_request *req);
void server_tokenize(server *srv, struct evhttp_request *req, int detokenize);

/* ---- server_worker.c ---- */

void *server_worker_main(void *arg);

/* The prompt ids of a request: the chat rendering, the completion's text
 * encoded, or its ids checked against the vocabulary.  check_len: refuse a
 * prompt that does not fit the context, or that with max_tokens (when set)
 * does not (400 context_length_exceeded).  0, or -1 with e filled. */
int server_prompt_ids(const server_model *m, const openai_request *r, int check_len,
                      tokenizer_ids *ids, openai_error *e);

#endif
