/* server_info.c — what the server says about itself and the endpoints that
 * need no generation: GET /health (and /v1/stats), GET /metrics
 * (Prometheus text exposition 0.0.4), POST /tokenize and /detokenize
 * (vLLM's shapes).  All on the loop thread (serve_int.h).
 *
 * Owns: the JSON of /health, the metric names and their help.  Does not own
 * the counters (server.c, server_conn.c and the worker keep them).
 *
 * /tokenize runs on the loop: a tokenizer is safe to share (text.h) and a
 * body is at most --max-body, so the loop waits at most that encode.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "common/json.h"
#include "common/sys.h"
#include "engine/serve/serve_int.h"

const double SERVER_TPOT_LE[SERVER_TPOT_BUCKETS] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,   0.25,   0.5,   1,    2.5,   5, 10 };

/* What one look at the server sees (taken under mu). */
typedef struct snap {
    server_counters n;
    size_t waiting;
    int running;
    server_phase phase;
    char what[96];
    uint64_t load_done, load_total;
    double load_s;
    server_link link;
    char link_err[192];
} snap;

static void take(server *srv, snap *s)
{
    pthread_mutex_lock(&srv->mu);
    s->n = srv->n;
    s->waiting = srv->q_len;
    s->running = srv->running != NULL;
    s->phase = srv->phase;
    memcpy(s->what, srv->load_what, sizeof s->what);
    s->load_done = srv->load_done;
    s->load_total = srv->load_total;
    s->load_s = (double)(srv->phase == SRV_LOADING ? shoal_now_ns() - srv->load_t0_ns
                                                   : srv->load_ns) * 1e-9;
    s->link = server_link_now(srv);
    memcpy(s->link_err, srv->link_err, sizeof s->link_err);
    pthread_mutex_unlock(&srv->mu);
}

/* ---- /health ------------------------------------------------------------------------ */

typedef struct kv {
    const char *k;
    uint64_t v;
} kv;

/* An object of integer members; NULL on no memory. */
static shoal_json *ints(const kv *m, size_t n)
{
    shoal_json *o = shoal_json_object();
    for (size_t i = 0; o && i < n; i++)
        if (shoal_json_set_int(o, m[i].k, (int64_t)m[i].v)) {
            shoal_json_free(o);
            return NULL;
        }
    return o;
}

static shoal_json *gen_obj(const snap *s)
{
    const server_counters *n = &s->n;
    const kv m[] = {
        { "last_reused_tokens", n->gen.last_reused }, { "last_computed_tokens", n->gen.last_computed },
        { "reused_tokens", n->gen.reused_tokens }, { "computed_tokens", n->gen.computed_tokens },
        { "prompt_tokens", n->gen.prompt_tokens }, { "completion_tokens", n->gen.completion_tokens },
        { "saved_live_tokens", n->gen.live_tokens }, { "saved_snapshot_tokens", n->gen.snap_tokens },
        { "last_decode_ns", n->last_decode_ns }, { "last_decode_model_ns", n->last_decode_model_ns },
        { "last_prefill_ns", n->last_prefill_ns },
        { "last_completion_tokens", n->last_completion_tokens },
    };
    return ints(m, sizeof m / sizeof *m);
}

/* "ok" serves; anything else is a 503 */
static const char *status_of(const snap *s)
{
    if (s->phase == SRV_LOADING)
        return "loading";
    if (s->phase == SRV_FAILED)
        return "failed";
    if (s->link == LINK_RECONNECTING || s->link == LINK_DOWN)
        return server_link_name(s->link);
    return "ok";
}

void server_health(server *srv, struct evhttp_request *req, server_ep ep)
{
    snap s;
    shoal_json *root = shoal_json_object(), *o;
    const char *st;
    shoal_buf b;
    int bad;

    take(srv, &s);
    st = status_of(&s);
    {
        const kv q[] = { { "waiting", s.waiting }, { "running", (uint64_t)s.running },
                         { "limit", srv->cfg.queue } };
        const kv rq[] = { { "admitted", s.n.requests }, { "completed", s.n.completed },
                          { "cancelled", s.n.cancelled }, { "failed", s.n.failed },
                          { "rejected_busy", s.n.rejected_busy },
                          { "rejected_unavailable", s.n.rejected_link } };
        const kv cn[] = { { "open", srv->n_conns }, { "limit", srv->cfg.max_connections },
                          { "accepted", srv->conns_accepted },
                          { "request_timeouts", srv->request_timeouts },
                          { "closed_for_room", srv->evictions },
                          { "accept_errors", srv->accept_errors },
                          { "refused_too_large", srv->refused_too_large },
                          { "refused_bad_request", srv->refused_bad_request } };
        bad = !root || shoal_json_set_str(root, "status", st) ||
              shoal_json_set_str(root, "model", srv->cfg.model_name) ||
              shoal_json_set_take(root, "queue", ints(q, 3)) ||
              shoal_json_set_take(root, "requests", ints(rq, 6)) ||
              shoal_json_set_take(root, "connections", ints(cn, 8)) ||
              shoal_json_set_take(root, "generation", gen_obj(&s));
    }
    if (!bad && s.phase == SRV_LOADING) {
        bad = !(o = shoal_json_object()) || shoal_json_set_str(o, "phase", s.what) ||
              shoal_json_set_num(o, "seconds", s.load_s) ||
              ((s.load_done || s.load_total) &&
               (shoal_json_set_int(o, "done_bytes", (int64_t)s.load_done) ||
                shoal_json_set_int(o, "total_bytes", (int64_t)s.load_total))) ||
              shoal_json_set_take(root, "loading", o);
    } else if (!bad) {
        bad = shoal_json_set_num(root, "load_seconds", s.load_s);
    }
    if (!bad && s.link != LINK_LOCAL) {
        bad = !(o = shoal_json_object()) || shoal_json_set_str(o, "state", server_link_name(s.link)) ||
              shoal_json_set_int(o, "reconnects", (int64_t)s.n.reconnects) ||
              (s.link_err[0] && shoal_json_set_str(o, "last_error", s.link_err)) ||
              shoal_json_set_take(root, "shoald", o);
    }
    if (!bad && s.phase == SRV_FAILED)
        bad = shoal_json_set_str(root, "error", srv->load_err.msg);
    shoal_buf_init(&b, 0);
    if (!bad && shoal_json_dump(root, SHOAL_JSON_COMPACT, &b) == 0)
        server_send_json(srv, req, ep, strcmp(st, "ok") == 0 ? 200 : 503, b.data, b.len);
    else
        server_send_error(srv, req, ep, 500, "server_error", NULL, NULL, "out of memory");
    shoal_buf_free(&b);
    shoal_json_free(root);
}

/* ---- /metrics -------------------------------------------------------------------------- */

#define P "shoal_engine_"

static void head(shoal_buf *b, const char *name, const char *type, const char *help)
{
    shoal_buf_appendf(b, "# HELP " P "%s %s\n# TYPE " P "%s %s\n", name, help, name, type);
}

static void val(shoal_buf *b, const char *name, const char *labels, double v)
{
    shoal_buf_appendf(b, P "%s%s%s%s %.17g\n", name, labels ? "{" : "", labels ? labels : "",
                      labels ? "}" : "", v);
}

static void one(shoal_buf *b, const char *name, const char *type, const char *help, double v)
{
    head(b, name, type, help);
    val(b, name, NULL, v);
}

static void metrics_http(server *srv, shoal_buf *b)
{
    char l[96];
    head(b, "http_requests_total", "counter", "HTTP replies sent, by endpoint and status");
    for (int e = 0; e < EP_COUNT; e++)
        for (int k = 0; k < SERVER_N_CODES; k++) {
            if (!srv->http_count[e][k])
                continue;
            if (SERVER_CODES[k])
                snprintf(l, sizeof l, "endpoint=\"%s\",code=\"%d\"", server_ep_name(e), SERVER_CODES[k]);
            else
                snprintf(l, sizeof l, "endpoint=\"%s\",code=\"other\"", server_ep_name(e));
            val(b, "http_requests_total", l, (double)srv->http_count[e][k]);
        }
    one(b, "http_request_timeouts_total", "counter",
        "connections closed with a 408: the request did not arrive within the deadline",
        (double)srv->request_timeouts);
    head(b, "http_refused_total", "counter",
         "requests libevent refused before they reached the server, by reason: too_large (413: "
         "a header past --max-header or a body past --max-body), bad_request (400: a request "
         "line or header line it could not take)");
    val(b, "http_refused_total", "reason=\"too_large\"", (double)srv->refused_too_large);
    val(b, "http_refused_total", "reason=\"bad_request\"", (double)srv->refused_bad_request);
    one(b, "connections", "gauge", "open HTTP connections", (double)srv->n_conns);
    one(b, "connections_limit", "gauge", "open HTTP connections at most",
        (double)srv->cfg.max_connections);
    one(b, "connections_accepted_total", "counter", "HTTP connections accepted",
        (double)srv->conns_accepted);
    one(b, "connections_closed_for_room_total", "counter",
        "connections closed (503) at the limit to make room: they waited longest for a request",
        (double)srv->evictions);
    one(b, "accept_errors_total", "counter",
        "accept() failures (descriptors or memory exhausted); each pauses the listener",
        (double)srv->accept_errors);
    one(b, "listener_pauses_total", "counter",
        "times the listener paused (connection limit, accept failures)",
        (double)srv->listener_pauses);
}

static void metrics_queue(server *srv, const snap *s, shoal_buf *b)
{
    const server_counters *n = &s->n;
    one(b, "ready", "gauge", "1 once the model is bound and requests are served",
        s->phase == SRV_READY);
    one(b, "load_seconds", "gauge", "time the model took to bind (so far, while loading)", s->load_s);
    one(b, "queue_waiting", "gauge", "requests waiting for the worker", (double)s->waiting);
    one(b, "queue_running", "gauge", "requests generating (0 or 1)", s->running);
    one(b, "queue_limit", "gauge", "requests that may wait", (double)srv->cfg.queue);
    head(b, "generation_requests_total", "counter", "generation requests by outcome");
    val(b, "generation_requests_total", "outcome=\"completed\"", (double)n->completed);
    val(b, "generation_requests_total", "outcome=\"cancelled\"", (double)n->cancelled);
    val(b, "generation_requests_total", "outcome=\"failed\"", (double)n->failed);
    val(b, "generation_requests_total", "outcome=\"rejected_busy\"", (double)n->rejected_busy);
    val(b, "generation_requests_total", "outcome=\"rejected_unavailable\"", (double)n->rejected_link);
    one(b, "prompt_tokens_total", "counter", "prompt tokens of generation requests",
        (double)n->gen.prompt_tokens);
    one(b, "prompt_reused_tokens_total", "counter",
        "prompt tokens taken from a saved conversation state", (double)n->gen.reused_tokens);
    one(b, "completion_tokens_total", "counter", "tokens generated", (double)n->gen.completion_tokens);
    one(b, "prefill_seconds_total", "counter", "time running prompts", (double)n->prefill_ns * 1e-9);
    one(b, "decode_seconds_total", "counter", "time generating, sampling and callbacks included",
        (double)n->decode_ns * 1e-9);
    one(b, "decode_forward_seconds_total", "counter", "of the decode time, in the forward pass",
        (double)n->decode_model_ns * 1e-9);
    head(b, "time_per_output_token_seconds", "histogram",
         "a request's decode time per generated token");
    {
        uint64_t cum = 0;
        char l[32];
        for (int i = 0; i < SERVER_TPOT_BUCKETS; i++) {
            cum += n->tpot[i];
            snprintf(l, sizeof l, "le=\"%g\"", SERVER_TPOT_LE[i]);
            val(b, "time_per_output_token_seconds_bucket", l, (double)cum);
        }
        val(b, "time_per_output_token_seconds_bucket", "le=\"+Inf\"", (double)n->tpot_count);
        val(b, "time_per_output_token_seconds_sum", NULL, n->tpot_sum);
        val(b, "time_per_output_token_seconds_count", NULL, (double)n->tpot_count);
    }
}

static void metrics_experts(const snap *s, shoal_buf *b)
{
    const expert_source_stats *x = &s->n.src;
    char l[32];
    head(b, "expert_fetches_total", "counter", "experts delivered to the forward pass, by tier");
    for (int t = 0; t < EXPERT_TIER_COUNT; t++) {
        snprintf(l, sizeof l, "tier=\"%s\"", expert_tier_name((expert_tier)t));
        val(b, "expert_fetches_total", l, (double)x->hits[t]);
    }
    head(b, "expert_bytes_total", "counter", "expert bytes delivered, by tier");
    for (int t = 0; t < EXPERT_TIER_COUNT; t++) {
        snprintf(l, sizeof l, "tier=\"%s\"", expert_tier_name((expert_tier)t));
        val(b, "expert_bytes_total", l, (double)x->hits[t] * (double)s->n.expert_bytes);
    }
    one(b, "ram_tier_hits_total", "counter", "experts the engine's RAM tier held when used",
        (double)x->hits[EXPERT_TIER_RAM]);
    one(b, "ram_tier_misses_total", "counter", "experts used that the RAM tier did not hold",
        (double)(x->experts - x->hits[EXPERT_TIER_RAM]));
    one(b, "ram_tier_experts", "gauge", "experts resident in the RAM tier", (double)x->ram_resident);
    one(b, "ram_tier_bytes", "gauge", "bytes resident in the RAM tier", (double)x->ram_bytes);
    one(b, "ram_tier_quota_experts", "gauge", "experts per MoE layer the RAM tier may keep",
        (double)x->ram_quota);
    one(b, "expert_prefetch_guessed_total", "counter", "experts asked for ahead as a guess",
        (double)x->prefetch_sent);
    one(b, "expert_prefetch_used_total", "counter", "guessed experts a layer then used",
        (double)x->prefetch_used);
    one(b, "expert_read_bytes_total", "counter", "expert bytes read from shoald's cache",
        (double)x->read_bytes);
    one(b, "expert_wait_seconds_total", "counter", "time the forward pass waited for experts",
        (double)x->wait_ns * 1e-9);
}

void server_metrics(server *srv, struct evhttp_request *req)
{
    snap s;
    shoal_buf b;

    take(srv, &s);
    shoal_buf_init(&b, 0);
    metrics_queue(srv, &s, &b);
    metrics_http(srv, &b);
    metrics_experts(&s, &b);
    if (s.link != LINK_LOCAL) {
        static const server_link states[] = { LINK_OK, LINK_RECONNECTING, LINK_DOWN };
        char l[40];
        head(&b, "shoald_state", "gauge", "the hf:// model's daemon connection: 1 for its state");
        for (size_t i = 0; i < 3; i++) {
            snprintf(l, sizeof l, "state=\"%s\"", server_link_name(states[i]));
            val(&b, "shoald_state", l, s.link == states[i]);
        }
        one(&b, "shoald_reconnects_total", "counter", "daemon connections replaced",
            (double)s.n.reconnects);
    }
    server_send_text(srv, req, EP_METRICS, 200, "text/plain; version=0.0.4; charset=utf-8", b.data,
                     b.len);
    shoal_buf_free(&b);
}

/* ---- /tokenize, /detokenize -------------------------------------------------------------- */

static void send_err(server *srv, struct evhttp_request *req, server_ep ep, const openai_error *e)
{
    server_send_error(srv, req, ep, e->status, e->type, e->param[0] ? e->param : NULL,
                      e->code[0] ? e->code : NULL, e->message);
}

static int model_ok(server *srv, const char *asked, openai_error *e)
{
    if (!asked || server_model_matches(srv->cfg.model_name, asked))
        return 1;
    openai_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                     "The model '%.100s' does not exist; this server serves '%.100s'", asked,
                     srv->cfg.model_name);
    return 0;
}

/* {"tokens": [ids], "model"?} -> {"prompt": text} */
static int detok_field(const char *key, shoal_json *v, void *ctx)
{
    openai_error *e = ctx;
    if (strcmp(key, "tokens") == 0 || strcmp(key, "model") == 0 ||
        shoal_json_typeof(v) == SHOAL_JSON_NULL)
        return 0;
    openai_error_set(e, 400, "invalid_request_error", key, NULL,
                     "Unrecognized request argument supplied: %s", key);
    return -1;
}

static int detokenize(server *srv, shoal_json *j, shoal_buf *out, openai_error *e)
{
    shoal_json *t = shoal_json_get(j, "tokens"), *m = shoal_json_get(j, "model"), *res;
    uint32_t *ids;
    size_t n;
    shoal_buf text;
    shoal_err err;
    int rc = 0;

    if (shoal_json_object_foreach(j, detok_field, e))
        return -1;
    if (m && shoal_json_typeof(m) == SHOAL_JSON_STRING && !model_ok(srv, shoal_json_str_value(m), e))
        return -1;
    if (!t || shoal_json_typeof(t) != SHOAL_JSON_ARRAY) {
        openai_error_set(e, 400, "invalid_request_error", "tokens", NULL,
                         "'tokens' must be an array of token ids");
        return -1;
    }
    n = shoal_json_array_size(t);
    if (!(ids = malloc((n ? n : 1) * sizeof *ids))) {
        openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        shoal_json *x = shoal_json_array_at(t, i);
        int64_t id = shoal_json_typeof(x) == SHOAL_JSON_INT ? shoal_json_int_value(x) : -1;
        if (id < 0 || id >= (int64_t)srv->m.n_vocab) {
            openai_error_set(e, 400, "invalid_request_error", "tokens", NULL,
                             "'tokens' must be ids of the vocabulary (0..%u)", srv->m.n_vocab - 1);
            rc = -1;
        } else {
            ids[i] = (uint32_t)id;
        }
    }
    shoal_buf_init(&text, 0);
    if (rc == 0 && tokenizer_decode(srv->m.tok, ids, n, 0, &text, &err) != 0) {
        openai_error_set(e, 500, "server_error", NULL, NULL, "detokenize: %s", err.msg);
        rc = -1;
    }
    free(ids);
    if (rc == 0) {
        res = shoal_json_object();
        if (!res || shoal_json_set_take(res, "prompt", shoal_json_new_strn(
                        text.data ? (const char *)text.data : "", text.len)) ||
            shoal_json_dump(res, SHOAL_JSON_COMPACT, out)) {
            openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            rc = -1;
        }
        shoal_json_free(res);
    }
    shoal_buf_free(&text);
    return rc;
}

/* {"prompt": text | ids} or {"messages": [...], chat options} ->
 * {"count", "max_model_len", "tokens"}: exactly the ids the completion or
 * chat request would run. */
static int tokenize(server *srv, const char *body, size_t len, shoal_json *j, shoal_buf *out,
                    openai_error *e)
{
    openai_request r;
    tokenizer_ids ids = { 0 };
    shoal_json *res = NULL, *arr = NULL;
    int rc;

    if (openai_request_parse(shoal_json_get(j, "messages") ? OPENAI_CHAT : OPENAI_COMPLETION, body,
                             len, &r, e) != 0)
        return -1;
    rc = model_ok(srv, r.model, e) && server_prompt_ids(&srv->m, &r, 0, &ids, e) == 0 ? 0 : -1;
    if (rc == 0) {
        res = shoal_json_object();
        arr = shoal_json_array();
        rc = !res || !arr || shoal_json_set_int(res, "count", (int64_t)ids.n) ||
             shoal_json_set_int(res, "max_model_len", (int64_t)srv->m.n_ctx);
        for (size_t i = 0; rc == 0 && i < ids.n; i++)
            rc = shoal_json_append_take(arr, shoal_json_new_int(ids.v[i]));
        if (rc == 0) {
            rc = shoal_json_set_take(res, "tokens", arr);
            arr = NULL;
        }
        if (rc == 0)
            rc = shoal_json_dump(res, SHOAL_JSON_COMPACT, out);
        if (rc != 0) {
            openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            rc = -1;
        }
    }
    shoal_json_free(arr);
    shoal_json_free(res);
    tokenizer_ids_free(&ids);
    openai_request_free(&r);
    return rc;
}

void server_tokenize(server *srv, struct evhttp_request *req, int detok)
{
    server_ep ep = detok ? EP_DETOKENIZE : EP_TOKENIZE;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    shoal_err jerr;
    shoal_json *j = shoal_json_parse(body, len, &jerr);
    openai_error e;
    shoal_buf out;
    int rc;

    if (!j || shoal_json_typeof(j) != SHOAL_JSON_OBJECT) {
        openai_error_set(&e, 400, "invalid_request_error", NULL, NULL,
                         "The request body must be a JSON object%s%s", j ? "" : ": ",
                         j ? "" : jerr.msg);
        shoal_json_free(j);
        send_err(srv, req, ep, &e);
        return;
    }
    shoal_buf_init(&out, 0);
    rc = detok ? detokenize(srv, j, &out, &e) : tokenize(srv, body, len, j, &out, &e);
    if (rc == 0)
        server_send_json(srv, req, ep, 200, out.data, out.len);
    else
        send_err(srv, req, ep, &e);
    shoal_buf_free(&out);
    shoal_json_free(j);
}
