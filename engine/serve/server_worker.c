/* server_worker.c — the server's worker thread: binds the model once the
 * port is open, then takes jobs from the FIFO one at a time, renders or
 * tokenizes the prompt, runs the generator, turns tokens into text (chat:
 * think vs response channels; stop sequences; log-probabilities), and
 * posts replies or SSE chunks to the loop thread (serve_int.h has the
 * threading rules).  For an hf:// model it also keeps the daemon
 * connection: a ping every SERVER_PING_S while idle, and after a loss
 * reconnection attempts with back-off (docs/server.md "shoald restarts").
 *
 * Owns: per-job text state, the model (srv->gm), the link's timing.  Does
 * not own HTTP (server.c), JSON shapes (openai_reply.c), rendering
 * (chat.c) nor generation (generate.c).
 *
 * Stop sequences apply to the answer text: the response channel of a chat
 * reply, the whole text of a completion; reasoning is never cut by them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/event.h>

#include "common/log.h"
#include "common/sys.h"
#include "engine/text/text.h"
#include "engine/serve/serve_int.h"
#include "engine/source/source.h"

#define TAG "server"
#define SERVER_PING_S 2           /* idle: how often the daemon is asked if it is there */
#define RECONNECT_MIN_MS 100
#define RECONNECT_MAX_MS 5000
#define SERVER_BATCH_MS 10        /* a stream's events are posted at most this often */

/* The worker's view of the daemon connection (hf:// models). */
typedef struct wlink {
    uint64_t last_ping_ns, next_try_ns, backoff_ms;
    server_ratelog log;
} wlink;

typedef struct wctx {
    server *srv;
    job *j;
    int chat;
    chat_parser *parser;        /* chat */
    tokenizer_stream *ts;       /* completion */
    gen_stop *stop;
    int matched;                /* a stop sequence ended the text */
    shoal_buf reasoning, content;   /* whole replies: everything; streams: this step's */
    shoal_buf rd, cd;           /* this token's text before the stop filter */
    openai_lp_list lp_c, lp_r;  /* log-probabilities (answer / completion, reasoning):
                                   whole replies: all; streams: since the last chunk */
    size_t text_len;            /* completion text decoded so far (text_offset) */
    shoal_buf out;              /* streams: events not posted yet (SERVER_BATCH_MS) */
    uint64_t posted_ns;         /* the last post */
    openai_reply_info ri;
    int failed;                 /* posting failed: give up quietly */
} wctx;

static void wctx_free(wctx *w)
{
    chat_parser_free(w->parser);
    tokenizer_stream_free(w->ts);
    gen_stop_free(w->stop);
    shoal_buf_free(&w->reasoning);
    shoal_buf_free(&w->content);
    shoal_buf_free(&w->rd);
    shoal_buf_free(&w->cd);
    openai_lp_list_free(&w->lp_c);
    openai_lp_list_free(&w->lp_r);
    shoal_buf_free(&w->out);
}

/* Post the events held in w->out: when forced (the first, the last, an
 * error) or when SERVER_BATCH_MS passed since the last post.  Tokens that
 * come faster travel together, so the loop thread and the client wake at
 * most every few ms instead of per token: on a machine whose cores all
 * compute, each wake-up preempts a compute thread (docs/server.md,
 * "Measured"). */
static int send_out(wctx *w, int force)
{
    uint64_t now = shoal_now_ns();
    int rc;
    if (w->out.len == 0 || (!force && now - w->posted_ns < SERVER_BATCH_MS * 1000000ull))
        return 0;
    rc = server_post(w->srv, w->j, OUT_DATA, 200, &w->out);
    shoal_buf_init(&w->out, 0);
    w->posted_ns = now;
    return rc;
}

/* Point the reply info at the log-probability lists, when asked for (a
 * chunk that carries none has "logprobs": null, as OpenAI's first and last
 * chunks do). */
static void lp_attach(wctx *w, int whole)
{
    int on = w->j->r.logprobs && (whole || w->lp_c.n + w->lp_r.n > 0);
    w->ri.lp = on ? &w->lp_c : NULL;
    w->ri.lp_reasoning = on && w->chat && w->j->r.thinking ? &w->lp_r : NULL;
}

/* A buffer's text, "" when nothing was ever appended. */
static const char *text_of(const shoal_buf *b)
{
    return b->data ? (const char *)b->data : "";
}

/* Send what this step produced (streams only). */
static int flush_chunk(wctx *w, int first)
{
    shoal_buf b;
    int rc;

    if (!w->j->r.stream)
        return 0;
    if (!first && w->reasoning.len == 0 && w->content.len == 0 && w->lp_c.n == 0 && w->lp_r.n == 0)
        return send_out(w, 0);   /* nothing new: what is held may be due */
    shoal_buf_init(&b, 0);
    lp_attach(w, 0);
    if (w->chat)
        rc = openai_chat_chunk(&w->ri, first, first || w->content.len ? text_of(&w->content) : NULL,
                               w->content.len, w->reasoning.len ? text_of(&w->reasoning) : NULL,
                               w->reasoning.len, w->j->r.include_usage, &b);
    else
        rc = openai_completion_chunk(&w->ri, text_of(&w->content), w->content.len,
                                     w->j->r.include_usage, &b);
    if (rc == 0)
        rc = shoal_buf_append(&w->out, b.data, b.len);
    shoal_buf_free(&b);
    if (rc == 0)
        rc = send_out(w, first);
    shoal_buf_reset(&w->reasoning);
    shoal_buf_reset(&w->content);
    w->lp_c.n = w->lp_r.n = 0;
    w->ri.lp = w->ri.lp_reasoning = NULL;
    return rc;
}

/* New answer text through the stop filter into w->content. */
static int answer_text(wctx *w)
{
    int rc = 0;
    if (w->cd.len && !w->matched) {
        rc = gen_stop_push(w->stop, (const char *)w->cd.data, w->cd.len, &w->content);
        if (rc == 1) {
            w->matched = 1;
            rc = 0;
        }
    }
    shoal_buf_reset(&w->cd);
    return rc;
}

/* One token's log-probability entry, into the list of the channel it was
 * generated in (chat: the specials that frame the channels are no text of
 * either, and go nowhere). */
static int lp_record(wctx *w, const gen_token *t, chat_channel ch)
{
    const tokenizer *tok = w->srv->m.tok;
    openai_lp_token e = { .tok.logprob = t->logprob, .text_offset = w->text_len };
    openai_lp_list *l = &w->lp_c;

    if (w->chat) {
        if (tokenizer_is_special(tok, t->id) || ch == CHAT_CH_OTHER)
            return 0;
        if (ch == CHAT_CH_THINK)
            l = &w->lp_r;
    }
    if (tokenizer_token_bytes(tok, t->id, &e.tok.bytes, &e.tok.n) != 0)
        return 0;
    for (size_t i = 0; i < t->n_top; i++) {
        openai_lp_alt *a = &e.top[e.n_top];
        a->logprob = t->top[i].logprob;
        if (tokenizer_token_bytes(tok, t->top[i].id, &a->bytes, &a->n) == 0)
            e.n_top++;
    }
    return openai_lp_push(l, &e);
}

static int on_token(void *ctx, const gen_token *t)
{
    wctx *w = ctx;
    uint32_t id = t->id;
    shoal_err err;
    int rc;

    if (t->is_eos)
        return 0;
    if (w->j->r.logprobs &&
        lp_record(w, t, w->chat ? chat_parser_channel(w->parser) : CHAT_CH_RESPONSE) != 0)
        return SHOAL_ENOMEM;
    if (w->chat) {
        rc = chat_parser_push(w->parser, id, &w->rd, &w->cd, &err);
        if (rc < 0)
            return rc;
        if (w->rd.len && shoal_buf_append(&w->reasoning, w->rd.data, w->rd.len))
            return SHOAL_ENOMEM;
        shoal_buf_reset(&w->rd);
    } else if (!tokenizer_is_special(w->srv->m.tok, id)) {
        /* Specials add no text to a completion (they are not words). */
        rc = tokenizer_stream_push(w->ts, id, &w->cd, &err);
        if (rc < 0)
            return rc;
        w->text_len += w->cd.len;
    }
    if ((rc = answer_text(w)) != 0)
        return rc;
    if (flush_chunk(w, 0) != 0) {
        w->failed = 1;
        return SHOAL_ENOMEM;
    }
    return w->matched ? 1 : 0;
}

/* End of generation: flush partial characters and held-back text. */
static int finish_text(wctx *w)
{
    int rc;
    if (w->chat) {
        rc = chat_parser_finish(w->parser, &w->rd, &w->cd);
        if (rc == 0 && w->rd.len)
            rc = shoal_buf_append(&w->reasoning, w->rd.data, w->rd.len);
        shoal_buf_reset(&w->rd);
    } else {
        rc = tokenizer_stream_flush(w->ts, &w->cd);
    }
    if (rc == 0)
        rc = answer_text(w);
    if (rc == 0 && !w->matched)
        rc = gen_stop_flush(w->stop, &w->content);
    return rc;
}

int server_prompt_ids(const server_model *m, const openai_request *r, int check_len,
                      tokenizer_ids *ids, openai_error *e)
{
    shoal_err err;
    int rc;

    if (r->kind == OPENAI_CHAT) {
        chat_message *msgs = calloc(r->n_msgs, sizeof *msgs);
        chat_options o;
        chat_prompt p;
        if (!msgs)
            goto oom;
        for (size_t i = 0; i < r->n_msgs; i++)
            msgs[i] = (chat_message){ .role = (chat_role)r->msgs[i].role,
                                      .content = r->msgs[i].content,
                                      .content_len = r->msgs[i].content_len };
        chat_options_default(&o);
        o.thinking = r->thinking;
        snprintf(o.effort, sizeof o.effort, "%s", r->effort);
        rc = chat_render(m->tok, msgs, r->n_msgs, &o, &p, &err);
        free(msgs);
        if (rc != 0) {
            openai_error_set(e, 500, "server_error", NULL, NULL, "chat rendering failed: %s", err.msg);
            return -1;
        }
        *ids = p.ids;
        p.ids = (tokenizer_ids){ 0 };
        chat_prompt_free(&p);
    } else if (r->prompt) {
        if (tokenizer_encode(m->tok, r->prompt, r->prompt_len, 0, ids, &err) != 0) {
            openai_error_set(e, 500, "server_error", NULL, NULL, "tokenizer: %s", err.msg);
            return -1;
        }
    } else {
        for (size_t i = 0; i < r->n_prompt_ids; i++) {
            if (r->prompt_ids[i] >= m->n_vocab) {
                openai_error_set(e, 400, "invalid_request_error", "prompt", NULL,
                                 "token id %u is outside the vocabulary (%u ids)", r->prompt_ids[i],
                                 m->n_vocab);
                return -1;
            }
            if (tokenizer_ids_push(ids, r->prompt_ids[i]))
                goto oom;
        }
    }
    if (ids->n == 0) {
        openai_error_set(e, 400, "invalid_request_error", r->kind == OPENAI_CHAT ? "messages" : "prompt",
                         NULL, "the prompt is empty");
        return -1;
    }
    if (check_len && ids->n >= m->n_ctx) {
        openai_error_set(e, 400, "invalid_request_error", r->kind == OPENAI_CHAT ? "messages" : "prompt",
                         "context_length_exceeded",
                         "This model's maximum context length is %zu tokens; the prompt has %zu",
                         m->n_ctx, ids->n);
        return -1;
    }
    /* what was asked for must fit too (the memory plan's context, or the
     * model's): refused now rather than cut short at the context */
    if (check_len && r->max_tokens && ids->n + r->max_tokens > m->n_ctx) {
        openai_error_set(e, 400, "invalid_request_error", r->kind == OPENAI_CHAT ? "messages" : "prompt",
                         "context_length_exceeded",
                         "This model's maximum context length is %zu tokens. However, you requested "
                         "%zu tokens (%zu in the %s, %zu in the completion). Please reduce the "
                         "length of the %s or completion.", m->n_ctx, ids->n + r->max_tokens, ids->n,
                         r->kind == OPENAI_CHAT ? "messages" : "prompt", r->max_tokens,
                         r->kind == OPENAI_CHAT ? "messages" : "prompt");
        return -1;
    }
    return 0;
oom:
    openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

static void post_whole(wctx *w)
{
    const char *rs = NULL;
    shoal_buf b;
    int rc;

    /* reasoning_content is present (maybe empty) exactly in thinking mode. */
    if (w->j->r.thinking)
        rs = text_of(&w->reasoning);
    shoal_buf_init(&b, 0);
    lp_attach(w, 1);
    if (w->chat)
        rc = openai_chat_json(&w->ri, text_of(&w->content), w->content.len, rs, w->reasoning.len, &b);
    else
        rc = openai_completion_json(&w->ri, text_of(&w->content), w->content.len, &b);
    if (rc != 0)
        shoal_buf_free(&b);
    server_post(w->srv, w->j, OUT_REPLY, rc ? 500 : 200, &b);
}

/* The stream's last events: the text left, finish_reason, usage, [DONE]. */
static void post_stream_end(wctx *w)
{
    shoal_buf b;
    int rc;

    shoal_buf_init(&b, 0);
    rc = flush_chunk(w, 0);
    if (rc == 0)
        rc = w->chat ? openai_chat_chunk(&w->ri, 0, NULL, 0, NULL, 0, w->j->r.include_usage, &b)
                     : openai_completion_chunk(&w->ri, "", 0, w->j->r.include_usage, &b);
    if (rc == 0 && w->j->r.include_usage)
        rc = openai_usage_chunk(&w->ri, w->chat, &b);
    if (rc == 0)
        rc = openai_done_event(&b);
    if (rc == 0)
        rc = shoal_buf_append(&w->out, b.data, b.len);
    send_out(w, 1);
    shoal_buf_free(&b);
    server_post(w->srv, w->j, OUT_STREAM_END, 200, NULL);
}

/* ---- the daemon connection ------------------------------------------------------------ */

static void link_lost(server *srv, wlink *wl, const shoal_err *err)
{
    uint64_t now = shoal_now_ns();
    pthread_mutex_lock(&srv->mu);
    if (srv->link == LINK_OK) {
        srv->link = LINK_RECONNECTING;
        srv->link_lost_ns = now;
    }
    snprintf(srv->link_err, sizeof srv->link_err, "%.191s", err->msg);
    pthread_mutex_unlock(&srv->mu);
    LOG_WARN(TAG, "the connection to shoald is lost (%s): reconnecting", err->msg);
    wl->backoff_ms = RECONNECT_MIN_MS;
    wl->next_try_ns = now + RECONNECT_MIN_MS * 1000000ull;
}

static server_link link_state(server *srv)
{
    server_link l;
    pthread_mutex_lock(&srv->mu);
    l = srv->link;
    pthread_mutex_unlock(&srv->mu);
    return l;
}

/* A ping when one is due (OK), or a reconnection attempt when one is due
 * (lost).  Unlocked; on the worker. */
static void link_tend(server *srv, wlink *wl)
{
    server_link l = link_state(srv);
    uint64_t now = shoal_now_ns();
    shoal_err err = { 0 };

    if (l == LINK_LOCAL)
        return;
    if (l == LINK_OK) {
        if (now - wl->last_ping_ns < (uint64_t)SERVER_PING_S * 1000000000ull)
            return;
        wl->last_ping_ns = now;
        if (gen_model_ping(&srv->gm, &err) != 0)
            link_lost(srv, wl, &err);
        return;
    }
    if (now < wl->next_try_ns)
        return;
    if (gen_model_reconnect(&srv->gm, &err) == 0) {
        pthread_mutex_lock(&srv->mu);
        srv->link = LINK_OK;
        srv->link_err[0] = 0;
        srv->n.reconnects++;
        pthread_mutex_unlock(&srv->mu);
        LOG_INFO(TAG, "shoald is back: serving again");
        wl->last_ping_ns = shoal_now_ns();
        return;
    }
    wl->backoff_ms = wl->backoff_ms * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS : wl->backoff_ms * 2;
    wl->next_try_ns = shoal_now_ns() + wl->backoff_ms * 1000000ull;
    pthread_mutex_lock(&srv->mu);
    snprintf(srv->link_err, sizeof srv->link_err, "%.191s", err.msg);
    if (now - srv->link_lost_ns >= (uint64_t)SERVER_LINK_DOWN_S * 1000000000ull)
        srv->link = LINK_DOWN;
    pthread_mutex_unlock(&srv->mu);
    server_ratelog_note(&wl->log, TAG, "reconnecting to shoald: %s (next try in %llu ms)", err.msg,
                        (unsigned long long)wl->backoff_ms);
}

/* When the worker should wake to tend the link (absolute, CLOCK_REALTIME). */
static struct timespec link_due(server *srv, const wlink *wl)
{
    uint64_t wait_ns = srv->link == LINK_OK ? (uint64_t)SERVER_PING_S * 1000000000ull
                                            : wl->backoff_ms * 1000000ull;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    wait_ns += (uint64_t)ts.tv_nsec;
    ts.tv_sec += (time_t)(wait_ns / 1000000000ull);
    ts.tv_nsec = (long)(wait_ns % 1000000000ull);
    return ts;
}

/* ---- one job -------------------------------------------------------------------------- */

/* The sums /metrics shows, after a run. */
static void count_run(server *srv, const gen_result *res)
{
    expert_source_stats st;
    if (srv->gm.src)
        expert_source_stats_get(srv->gm.src, &st);
    pthread_mutex_lock(&srv->mu);
    srv->n.last_decode_ns = res->decode_ns;
    srv->n.last_decode_model_ns = res->decode_model_ns;
    srv->n.last_prefill_ns = res->prefill_ns;
    srv->n.last_completion_tokens = res->completion_tokens;
    srv->n.prefill_ns += res->prefill_ns;
    srv->n.decode_ns += res->decode_ns;
    srv->n.decode_model_ns += res->decode_model_ns;
    if (res->completion_tokens > 0) {
        double t = (double)res->decode_ns * 1e-9 / (double)res->completion_tokens;
        int b = 0;
        while (b < SERVER_TPOT_BUCKETS && t > SERVER_TPOT_LE[b])
            b++;
        if (b < SERVER_TPOT_BUCKETS)
            srv->n.tpot[b]++;
        srv->n.tpot_count++;
        srv->n.tpot_sum += t;
    }
    generator_stats(srv->m.gen, &srv->n.gen);
    if (srv->gm.src)
        srv->n.src = st;
    pthread_mutex_unlock(&srv->mu);
}

/* A failed generation of an hf:// model: was it the daemon going away?
 * Then the client is told so, and the link is being mended. */
static int failed_on_link(server *srv, wlink *wl, shoal_err *err)
{
    shoal_err pe = { 0 };
    if (link_state(srv) != LINK_OK || gen_model_ping(&srv->gm, &pe) == 0)
        return 0;
    link_lost(srv, wl, &pe);
    shoal_err_set(err, err->code, "the connection to shoald was lost (%s); the server is "
                  "reconnecting: retry shortly", pe.msg);
    return 1;
}

static void post_failure(server *srv, job *j, wctx *w, wlink *wl, shoal_err *err)
{
    openai_error e;
    int link = failed_on_link(srv, wl, err);

    LOG_WARN(TAG, "%s: generation failed: %s", j->id, err->msg);
    openai_error_set(&e, link ? 503 : 500, "server_error", NULL, link ? "backend_unavailable" : NULL,
                     "generation failed: %s", w->failed ? "out of memory" : err->msg);
    if (j->r.stream) {
        shoal_buf b;
        send_out(w, 1);          /* what was generated before the failure */
        shoal_buf_init(&b, 0);
        if (shoal_buf_append_str(&b, "data: ") == 0 && openai_error_json(&e, &b) == 0 &&
            shoal_buf_append_str(&b, "\n\n") == 0 && openai_done_event(&b) == 0)
            server_post(srv, j, OUT_DATA, 200, &b);
        shoal_buf_free(&b);
        server_post(srv, j, OUT_STREAM_END, 200, NULL);
    } else {
        server_post_error(srv, j, &e, link ? 2 : 0);
    }
}

/* The ids that end a reply: the eos (unless ignore_eos) and stop_token_ids.
 * n_end, or -1 with e filled. */
static int end_ids(server *srv, const openai_request *r, uint32_t *ids, openai_error *e)
{
    size_t n = 0;
    if (!r->ignore_eos)         /* ignore_eos: run to max_tokens (stop ids still end it) */
        ids[n++] = srv->m.eos;
    for (size_t i = 0; i < r->n_stop_ids; i++) {
        if (r->stop_ids[i] >= srv->m.n_vocab) {
            openai_error_set(e, 400, "invalid_request_error", "stop_token_ids", NULL,
                             "token id %u is outside the vocabulary (%u ids)", r->stop_ids[i],
                             srv->m.n_vocab);
            return -1;
        }
        ids[n++] = r->stop_ids[i];
    }
    return (int)n;
}

static void params_of(server *srv, job *j, const uint32_t *ends, size_t n_end, gen_params *gp)
{
    const openai_request *r = &j->r;
    gen_params_default(gp);
    gp->s = (gen_sampling){ .temperature = r->temperature, .top_k = r->top_k, .top_p = r->top_p,
                            .min_p = r->min_p };
    gp->pen = (gen_penalties){ .repetition = r->repetition_penalty,
                               .presence = r->presence_penalty,
                               .frequency = r->frequency_penalty };
    gp->seed = r->seed;
    gp->has_seed = r->has_seed;
    gp->max_tokens = r->max_tokens;
    gp->min_tokens = r->min_tokens;
    gp->eos = ends;
    gp->n_eos = n_end;
    gp->logprobs = r->logprobs;
    gp->top_logprobs = r->top_logprobs;
    gp->prefill_step = srv->cfg.prefill_step;
    gp->cancel = &j->cancel;
}

static int wctx_init(server *srv, job *j, wctx *w, size_t prompt_tokens)
{
    *w = (wctx){ .srv = srv, .j = j, .chat = j->r.kind == OPENAI_CHAT };
    shoal_buf_init(&w->reasoning, 0);
    shoal_buf_init(&w->content, 0);
    shoal_buf_init(&w->rd, 0);
    shoal_buf_init(&w->cd, 0);
    shoal_buf_init(&w->out, 0);
    w->stop = gen_stop_new((const char *const *)j->r.stop, j->r.n_stop);
    if (w->chat)
        w->parser = chat_parser_new(srv->m.tok, j->r.thinking);
    else
        w->ts = tokenizer_stream_new(srv->m.tok);
    w->ri = (openai_reply_info){ .id = j->id, .model = srv->cfg.model_name, .created = j->created,
                                 .prompt_tokens = prompt_tokens };
    return w->stop && (w->chat ? w->parser != NULL : w->ts != NULL) ? 0 : -1;
}

/* Run one admitted job to its final message.  Returns how it ended:
 * 0 completed, 1 cancelled, -1 failed. */
static int run_job(server *srv, job *j, wlink *wl)
{
    wctx w;
    tokenizer_ids ids = { 0 };
    openai_error e;
    gen_params gp;
    gen_result res;
    shoal_err err = { 0 };
    uint32_t ends[1 + OPENAI_MAX_STOP_IDS];
    int rc, n_end, outcome = 0;

    if ((n_end = end_ids(srv, &j->r, ends, &e)) < 0 ||
        server_prompt_ids(&srv->m, &j->r, 1, &ids, &e) != 0) {
        tokenizer_ids_free(&ids);
        server_post_error(srv, j, &e, 0);
        return -1;
    }
    if (wctx_init(srv, j, &w, ids.n) != 0) {
        openai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        server_post_error(srv, j, &e, 0);
        tokenizer_ids_free(&ids);
        wctx_free(&w);
        return -1;
    }
    if (j->r.stream) {
        server_post(srv, j, OUT_STREAM_START, 200, NULL);
        flush_chunk(&w, 1);
    }
    params_of(srv, j, ends, (size_t)n_end, &gp);
    rc = generator_run(srv->m.gen, ids.v, ids.n, &gp, on_token, &w, &res, &err);
    if (rc == 0)
        rc = finish_text(&w);
    w.ri.completion_tokens = res.completion_tokens;
    w.ri.cached_tokens = res.reused_tokens;
    /* cut short (shutdown, a client gone): as if max_tokens was reached */
    w.ri.finish_reason = w.matched || res.finish == GEN_FINISH_STOP ? "stop" : "length";
    count_run(srv, &res);
    /* Logged before the final message: after it the job is the loop's. */
    LOG_INFO(TAG, "%s: prompt %zu (reused %zu), completion %zu, %s", j->id, res.prompt_tokens,
             res.reused_tokens, res.completion_tokens, gen_finish_name(res.finish));
    if (rc == 0 && res.finish == GEN_FINISH_CANCELLED) {
        outcome = 1;
        if (j->r.stream) {
            post_stream_end(&w);      /* the client (if still there) gets a proper end */
        } else {
            openai_error_set(&e, 503, "server_error", NULL, "cancelled", "the request was cancelled");
            server_post_error(srv, j, &e, 0);
        }
    } else if (rc != 0) {
        outcome = -1;
        post_failure(srv, j, &w, wl, &err);
    } else if (j->r.stream) {
        post_stream_end(&w);
    } else {
        post_whole(&w);
    }
    tokenizer_ids_free(&ids);
    wctx_free(&w);
    return outcome;
}

/* ---- the thread ---------------------------------------------------------------------- */

/* The load's progress (engine_load_options.progress): its step and how
 * far it is for /health, then on to the caller's progress (the CLI's
 * stderr lines). */
static void on_progress(void *ctx, const char *phase, uint64_t done, uint64_t total)
{
    server *srv = ctx;
    pthread_mutex_lock(&srv->mu);
    snprintf(srv->load_what, sizeof srv->load_what, "%s", phase);
    srv->load_done = done;
    srv->load_total = total;
    pthread_mutex_unlock(&srv->mu);
    if (srv->load_chain)
        srv->load_chain(srv->load_chain_ctx, phase, done, total);
}

/* Bind the model under the plan; the loop learns the outcome through
 * srv->ready. */
static int load(server *srv)
{
    gen_model_options mo = srv->cfg.model_opt;
    engine_load_options lo;
    shoal_err err = { 0 };
    int rc;

    gen_model_load_options(&mo, &lo);
    srv->load_chain = lo.progress;
    srv->load_chain_ctx = lo.progress_ctx;
    lo.progress = on_progress;
    lo.progress_ctx = srv;
    mo.load = &lo;
    rc = gen_model_open(srv->cfg.model, &mo, &srv->gm, &err);
    pthread_mutex_lock(&srv->mu);
    srv->load_ns = shoal_now_ns() - srv->load_t0_ns;
    if (rc != 0) {
        srv->phase = SRV_FAILED;
        srv->load_err = err;
        if (!srv->load_err.code)
            srv->load_err.code = rc;
    } else {
        srv->m = (server_model){ .tok = srv->gm.tok, .gen = srv->gm.gen,
                                 .n_vocab = srv->gm.backend.n_vocab, .n_ctx = srv->gm.backend.n_ctx,
                                 .eos = srv->gm.eos };
        srv->n.expert_bytes = (uint64_t)srv->gm.model->cfg.expert_bytes;
        srv->link = srv->gm.remote ? LINK_OK : LINK_LOCAL;
        srv->phase = SRV_READY;
        snprintf(srv->load_what, sizeof srv->load_what, "ready");
        srv->load_done = srv->load_total = 0;
    }
    pthread_mutex_unlock(&srv->mu);
    event_active(srv->ready, EV_READ, 0);
    return rc;
}

/* The next job, or NULL to stop; tends the link while it waits. */
static job *next_job(server *srv, wlink *wl)
{
    job *j;
    for (;;) {
        int timed_out = 0;
        pthread_mutex_lock(&srv->mu);
        while (!srv->q_head && !srv->stopping && !timed_out) {
            if (srv->link == LINK_LOCAL) {
                pthread_cond_wait(&srv->cv, &srv->mu);
            } else {
                struct timespec ts = link_due(srv, wl);
                timed_out = pthread_cond_timedwait(&srv->cv, &srv->mu, &ts) == ETIMEDOUT;
            }
        }
        if (!srv->q_head && srv->stopping) {
            pthread_mutex_unlock(&srv->mu);
            return NULL;
        }
        if (!srv->q_head) {
            pthread_mutex_unlock(&srv->mu);
            link_tend(srv, wl);
            continue;
        }
        j = srv->q_head;
        srv->q_head = j->qnext;
        if (!srv->q_head)
            srv->q_tail = NULL;
        srv->q_len--;
        srv->running = j;
        pthread_mutex_unlock(&srv->mu);
        return j;
    }
}

void *server_worker_main(void *arg)
{
    server *srv = arg;
    wlink wl = { .last_ping_ns = shoal_now_ns(), .backoff_ms = RECONNECT_MIN_MS };
    job *j;

    if (load(srv) != 0)
        goto done;
    while ((j = next_job(srv, &wl)) != NULL) {
        int stopping, outcome;
        server_link l;
        openai_error e;

        link_tend(srv, &wl);   /* a ping when due: a lost daemon is a 503, not a 500 */
        pthread_mutex_lock(&srv->mu);
        stopping = srv->stopping;
        l = srv->link;
        pthread_mutex_unlock(&srv->mu);
        if (stopping || atomic_load(&j->cancel)) {
            openai_error_set(&e, 503, "server_error", NULL, stopping ? "shutting_down" : "cancelled",
                             stopping ? "the server is shutting down" : "the request was cancelled");
            server_post_error(srv, j, &e, 0);
            outcome = 1;
        } else if (l == LINK_RECONNECTING || l == LINK_DOWN) {
            openai_error_set(&e, 503, "server_error", NULL, "backend_unavailable",
                             "the model's shoald is not reachable (%s); retry later",
                             server_link_name(l));
            server_post_error(srv, j, &e, 2);
            outcome = -1;
        } else {
            outcome = run_job(srv, j, &wl);
        }
        pthread_mutex_lock(&srv->mu);
        srv->running = NULL;
        if (outcome == 0)
            srv->n.completed++;
        else if (outcome > 0)
            srv->n.cancelled++;
        else
            srv->n.failed++;
        pthread_mutex_unlock(&srv->mu);
    }
done:
    pthread_mutex_lock(&srv->mu);
    srv->worker_done = 1;
    pthread_mutex_unlock(&srv->mu);
    return NULL;
}
