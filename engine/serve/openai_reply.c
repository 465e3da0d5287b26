/* openai_reply.c — response bodies and SSE chunks of the OpenAI-compatible
 * API (serve.h part 2): chat.completion, chat.completion.chunk, text_completion,
 * the usage object, log-probabilities, /v1/models.
 *
 * Owns: the JSON shapes.  Does not own HTTP nor generation.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "engine/serve/serve.h"

/* ---- log-probabilities ----------------------------------------------------------- */

int openai_lp_push(openai_lp_list *l, const openai_lp_token *t)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        openai_lp_token *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return SHOAL_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *t;
    return 0;
}

void openai_lp_list_free(openai_lp_list *l)
{
    if (!l)
        return;
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* JSON has no -inf: OpenAI sends -9999.0 for a token that cannot come. */
static double lp_num(float x)
{
    return isfinite(x) ? (double)x : -9999.0;
}

/* A token's text: its bytes as UTF-8, a broken sequence as U+FFFD. */
static shoal_json *lp_str(const openai_lp_alt *a)
{
    shoal_buf b;
    shoal_json *j;
    shoal_buf_init(&b, 0);
    if (tokenizer_utf8_lossy(a->bytes, a->n, &b) != 0) {
        shoal_buf_free(&b);
        return NULL;
    }
    j = shoal_json_new_strn(b.data ? (const char *)b.data : "", b.len);
    shoal_buf_free(&b);
    return j;
}

/* {"token", "logprob", "bytes"}: chat's entry (and its alternatives). */
static shoal_json *lp_chat_entry(const openai_lp_alt *a)
{
    shoal_json *o = shoal_json_object(), *bytes = shoal_json_array();
    int bad = !o || !bytes || shoal_json_set_take(o, "token", lp_str(a)) ||
              shoal_json_set_num(o, "logprob", lp_num(a->logprob));
    for (size_t i = 0; !bad && i < a->n; i++)
        bad = shoal_json_append_take(bytes, shoal_json_new_int(a->bytes[i]));
    if (!bad) {
        bad = shoal_json_set_take(o, "bytes", bytes);
        bytes = NULL;
    }
    shoal_json_free(bytes);
    if (bad) {
        shoal_json_free(o);
        return NULL;
    }
    return o;
}

/* [entry + "top_logprobs": [entry...]] for a list */
static shoal_json *lp_chat_list(const openai_lp_list *l)
{
    shoal_json *arr = shoal_json_array();
    for (size_t i = 0; arr && i < l->n; i++) {
        const openai_lp_token *t = &l->v[i];
        shoal_json *e = lp_chat_entry(&t->tok), *top = shoal_json_array();
        int bad = !e || !top;
        for (size_t k = 0; !bad && k < t->n_top; k++)
            bad = shoal_json_append_take(top, lp_chat_entry(&t->top[k]));
        if (!bad) {
            bad = shoal_json_set_take(e, "top_logprobs", top);
            top = NULL;
        }
        shoal_json_free(top);
        if (bad || shoal_json_append_take(arr, e)) {
            if (bad)
                shoal_json_free(e);
            shoal_json_free(arr);
            return NULL;
        }
    }
    return arr;
}

/* chat: {"content": [...], "refusal": null[, "reasoning_content": [...]]} or null */
static shoal_json *lp_chat(const openai_reply_info *ri)
{
    shoal_json *o;
    if (!ri->lp)
        return shoal_json_new_null();
    o = shoal_json_object();
    if (!o || shoal_json_set_take(o, "content", lp_chat_list(ri->lp)) ||
        shoal_json_set_take(o, "refusal", shoal_json_new_null()) ||
        (ri->lp_reasoning &&
         shoal_json_set_take(o, "reasoning_content", lp_chat_list(ri->lp_reasoning)))) {
        shoal_json_free(o);
        return NULL;
    }
    return o;
}

/* completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"},
 * the alternatives as {text: logprob} with the sampled token among them (the
 * legacy API's shape), or null */
static shoal_json *lp_completion(const openai_reply_info *ri)
{
    shoal_json *o, *tok, *lps, *tops, *offs;
    int bad;
    if (!ri->lp)
        return shoal_json_new_null();
    o = shoal_json_object();
    tok = shoal_json_array();
    lps = shoal_json_array();
    tops = shoal_json_array();
    offs = shoal_json_array();
    bad = !o || !tok || !lps || !tops || !offs;
    for (size_t i = 0; !bad && i < ri->lp->n; i++) {
        const openai_lp_token *t = &ri->lp->v[i];
        shoal_json *d = shoal_json_object(), *k;
        bad = !d;
        for (size_t a = 0; !bad && a <= t->n_top; a++) {
            const openai_lp_alt *alt = a < t->n_top ? &t->top[a] : &t->tok;
            if (!(k = lp_str(alt)) || !shoal_json_str_value(k)) {
                shoal_json_free(k);
                bad = 1;
                break;
            }
            bad = shoal_json_set_num(d, shoal_json_str_value(k), lp_num(alt->logprob));
            shoal_json_free(k);
        }
        bad = bad || shoal_json_append_take(tok, lp_str(&t->tok)) ||
              shoal_json_append_take(lps, shoal_json_new_num(lp_num(t->tok.logprob))) ||
              shoal_json_append_take(offs, shoal_json_new_int((int64_t)t->text_offset));
        if (bad || shoal_json_append_take(tops, d)) {
            if (bad)
                shoal_json_free(d);
            bad = 1;
        }
    }
    if (!bad) {
        bad = shoal_json_set_take(o, "tokens", tok) | shoal_json_set_take(o, "token_logprobs", lps) |
              shoal_json_set_take(o, "top_logprobs", tops) | shoal_json_set_take(o, "text_offset", offs);
        tok = lps = tops = offs = NULL;
    }
    shoal_json_free(tok);
    shoal_json_free(lps);
    shoal_json_free(tops);
    shoal_json_free(offs);
    if (bad) {
        shoal_json_free(o);
        return NULL;
    }
    return o;
}

static shoal_json *usage_obj(const openai_reply_info *ri)
{
    shoal_json *u = shoal_json_object(), *d = shoal_json_object();
    if (!u || !d || shoal_json_set_int(u, "prompt_tokens", (int64_t)ri->prompt_tokens) ||
        shoal_json_set_int(u, "completion_tokens", (int64_t)ri->completion_tokens) ||
        shoal_json_set_int(u, "total_tokens", (int64_t)(ri->prompt_tokens + ri->completion_tokens)) ||
        shoal_json_set_int(d, "cached_tokens", (int64_t)ri->cached_tokens)) {
        shoal_json_free(u);
        shoal_json_free(d);
        return NULL;
    }
    if (shoal_json_set_take(u, "prompt_tokens_details", d)) {
        shoal_json_free(u);
        return NULL;
    }
    return u;
}

/* {"id", "object", "created", "model"} */
static shoal_json *head(const openai_reply_info *ri, const char *object)
{
    shoal_json *o = shoal_json_object();
    if (!o || shoal_json_set_str(o, "id", ri->id) || shoal_json_set_str(o, "object", object) ||
        shoal_json_set_int(o, "created", ri->created) || shoal_json_set_str(o, "model", ri->model)) {
        shoal_json_free(o);
        return NULL;
    }
    return o;
}

static int set_finish(shoal_json *choice, const openai_reply_info *ri)
{
    return shoal_json_set_take(choice, "finish_reason", ri->finish_reason
                                                            ? shoal_json_new_str(ri->finish_reason)
                                                            : shoal_json_new_null());
}

/* Serialise root (taken) to out, as SSE data when sse. */
static int finish(shoal_json *root, int sse, shoal_buf *out)
{
    int rc = root ? 0 : SHOAL_ENOMEM;
    if (rc == 0 && sse)
        rc = shoal_buf_append_str(out, "data: ");
    if (rc == 0)
        rc = shoal_json_dump(root, SHOAL_JSON_COMPACT, out);
    if (rc == 0 && sse)
        rc = shoal_buf_append_str(out, "\n\n");
    shoal_json_free(root);
    return rc ? SHOAL_ENOMEM : 0;
}

/* root.choices = [choice]; both taken.  NULL on failure. */
static shoal_json *with_choice(shoal_json *root, shoal_json *choice)
{
    shoal_json *arr = NULL;
    if (!root || !choice || shoal_json_set_int(choice, "index", 0) || !(arr = shoal_json_array())) {
        shoal_json_free(root);
        shoal_json_free(choice);
        return NULL;
    }
    if (shoal_json_append_take(arr, choice)) {
        shoal_json_free(arr);
        shoal_json_free(root);
        return NULL;
    }
    if (shoal_json_set_take(root, "choices", arr)) {
        shoal_json_free(root);
        return NULL;
    }
    return root;
}

int openai_chat_json(const openai_reply_info *ri, const char *content, size_t content_len,
                     const char *reasoning, size_t reasoning_len, shoal_buf *out)
{
    shoal_json *root = head(ri, "chat.completion"), *choice = shoal_json_object();
    shoal_json *msg = shoal_json_object();
    int bad = !root || !choice || !msg || shoal_json_set_str(msg, "role", "assistant") ||
              shoal_json_set_take(msg, "content", shoal_json_new_strn(content, content_len)) ||
              (reasoning && shoal_json_set_take(msg, "reasoning_content",
                                                shoal_json_new_strn(reasoning, reasoning_len)));
    if (!bad) {
        bad = shoal_json_set_take(choice, "message", msg);
        msg = NULL;
    }
    if (!bad)
        bad = set_finish(choice, ri) || shoal_json_set_take(choice, "logprobs", lp_chat(ri)) ||
              shoal_json_set_take(root, "usage", usage_obj(ri));
    shoal_json_free(msg);
    if (bad) {
        shoal_json_free(root);
        shoal_json_free(choice);
        return SHOAL_ENOMEM;
    }
    return finish(with_choice(root, choice), 0, out);
}

int openai_completion_json(const openai_reply_info *ri, const char *text, size_t text_len,
                           shoal_buf *out)
{
    shoal_json *root = head(ri, "text_completion"), *choice = shoal_json_object();
    int bad = !root || !choice ||
              shoal_json_set_take(choice, "text", shoal_json_new_strn(text, text_len)) ||
              shoal_json_set_take(choice, "logprobs", lp_completion(ri)) ||
              set_finish(choice, ri) || shoal_json_set_take(root, "usage", usage_obj(ri));
    if (bad) {
        shoal_json_free(root);
        shoal_json_free(choice);
        return SHOAL_ENOMEM;
    }
    return finish(with_choice(root, choice), 0, out);
}

int openai_chat_chunk(const openai_reply_info *ri, int role, const char *content,
                      size_t content_len, const char *reasoning, size_t reasoning_len,
                      int with_usage, shoal_buf *out)
{
    shoal_json *root = head(ri, "chat.completion.chunk"), *choice = shoal_json_object();
    shoal_json *delta = shoal_json_object();
    int bad = !root || !choice || !delta || (role && shoal_json_set_str(delta, "role", "assistant")) ||
              (content && shoal_json_set_take(delta, "content",
                                              shoal_json_new_strn(content, content_len))) ||
              (reasoning && shoal_json_set_take(delta, "reasoning_content",
                                                shoal_json_new_strn(reasoning, reasoning_len)));
    if (!bad) {
        bad = shoal_json_set_take(choice, "delta", delta);
        delta = NULL;
    }
    if (!bad)
        bad = set_finish(choice, ri) || shoal_json_set_take(choice, "logprobs", lp_chat(ri)) ||
              (with_usage && shoal_json_set_take(root, "usage", shoal_json_new_null()));
    shoal_json_free(delta);
    if (bad) {
        shoal_json_free(root);
        shoal_json_free(choice);
        return SHOAL_ENOMEM;
    }
    return finish(with_choice(root, choice), 1, out);
}

int openai_completion_chunk(const openai_reply_info *ri, const char *text, size_t text_len,
                            int with_usage, shoal_buf *out)
{
    shoal_json *root = head(ri, "text_completion"), *choice = shoal_json_object();
    int bad = !root || !choice ||
              shoal_json_set_take(choice, "text", shoal_json_new_strn(text, text_len)) ||
              shoal_json_set_take(choice, "logprobs", lp_completion(ri)) ||
              set_finish(choice, ri) ||
              (with_usage && shoal_json_set_take(root, "usage", shoal_json_new_null()));
    if (bad) {
        shoal_json_free(root);
        shoal_json_free(choice);
        return SHOAL_ENOMEM;
    }
    return finish(with_choice(root, choice), 1, out);
}

int openai_usage_chunk(const openai_reply_info *ri, int chat, shoal_buf *out)
{
    shoal_json *root = head(ri, chat ? "chat.completion.chunk" : "text_completion");
    if (!root || shoal_json_set_take(root, "choices", shoal_json_array()) ||
        shoal_json_set_take(root, "usage", usage_obj(ri))) {
        shoal_json_free(root);
        return SHOAL_ENOMEM;
    }
    return finish(root, 1, out);
}

int openai_done_event(shoal_buf *out)
{
    return shoal_buf_append_str(out, "data: [DONE]\n\n") ? SHOAL_ENOMEM : 0;
}

int openai_models_json(const char *model, int64_t created, shoal_buf *out)
{
    shoal_json *root = shoal_json_object(), *arr = shoal_json_array(), *m = shoal_json_object();
    int bad = !root || !arr || !m || shoal_json_set_str(root, "object", "list") ||
              shoal_json_set_str(m, "id", model) || shoal_json_set_str(m, "object", "model") ||
              shoal_json_set_int(m, "created", created) ||
              shoal_json_set_str(m, "owned_by", "shoal");
    if (!bad) {
        bad = shoal_json_append_take(arr, m);
        m = NULL;
    }
    if (!bad) {
        bad = shoal_json_set_take(root, "data", arr);
        arr = NULL;
    }
    shoal_json_free(m);
    shoal_json_free(arr);
    if (bad) {
        shoal_json_free(root);
        return SHOAL_ENOMEM;
    }
    return finish(root, 0, out);
}
