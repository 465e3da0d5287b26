/* openai_parse.c — request bodies of /v1/chat/completions and
 * /v1/completions: JSON to openai_request, with an explicit allow-list per
 * endpoint (serve.h part 2 has the contract; docs/server.md the fields).
 *
 * Owns: field dispatch, type and range checks, defaults.  Does not own HTTP
 * nor anything model-specific (token ids are range-checked later, against
 * the model).
 *
 * A field set to null counts as absent, as the OpenAI API treats it (so a
 * null unknown field is not refused: it asks for nothing).
 * Fields we cannot honour are refused, never ignored: the allow-list below
 * is the whole contract, and a few OpenAI fields are accepted only at the
 * value that asks for nothing, which off-the-shelf clients send as a matter
 * of course (n 1, echo false, tools [], store false, response_format
 * {"type": "text"}, ...): anything else in them is a 400 naming the field.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/utf8.h"
#include "engine/serve/serve.h"

#define ERR_INVALID "invalid_request_error"

/* An error's text may quote the client's bytes (a JSON parser's error) or
 * be cut inside a character: each byte that is not part of valid UTF-8
 * becomes '?', or the error could not be sent back as JSON (found by
 * fuzzing). */
static void utf8_fix(char *m)
{
    for (size_t i = 0, n = strlen(m); i < n;) {
        size_t k = shoal_utf8_char_len((const uint8_t *)m + i, n - i);
        if (k == 0)
            m[i++] = '?';
        else
            i += k;
    }
}

void openai_error_set(openai_error *e, int status, const char *type, const char *param,
                      const char *code, const char *fmt, ...)
{
    va_list ap;
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    utf8_fix(e->message);
    utf8_fix(e->param);
}

int openai_error_json(const openai_error *e, shoal_buf *out)
{
    shoal_json *root = shoal_json_object(), *o = shoal_json_object();
    int rc = (!root || !o) ? -1 : 0;

    if (rc == 0)
        rc = shoal_json_set_str(o, "message", e->message) | shoal_json_set_str(o, "type", e->type) |
             shoal_json_set_take(o, "param", e->param[0] ? shoal_json_new_str(e->param)
                                                         : shoal_json_new_null()) |
             shoal_json_set_take(o, "code", e->code[0] ? shoal_json_new_str(e->code)
                                                       : shoal_json_new_null());
    if (rc == 0) {
        rc = shoal_json_set_take(root, "error", o);
        o = NULL;
    }
    if (rc == 0)
        rc = shoal_json_dump(root, SHOAL_JSON_COMPACT, out);
    shoal_json_free(o);
    shoal_json_free(root);
    return rc ? SHOAL_ENOMEM : 0;
}

void openai_request_free(openai_request *r)
{
    if (!r)
        return;
    free(r->model);
    for (size_t i = 0; i < r->n_msgs; i++)
        free(r->msgs[i].content);
    free(r->msgs);
    free(r->prompt);
    free(r->prompt_ids);
    for (size_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* ---- helpers ------------------------------------------------------------------ */

typedef struct pctx {
    openai_request *r;
    openai_error *e;
    int has_max_tokens, has_max_completion;
    size_t max_tokens, max_completion;
    int has_stream_options;
    int has_top_logprobs;
} pctx;

static int bad(pctx *c, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(pctx *c, const char *param, const char *fmt, ...)
{
    va_list ap;
    c->e->status = 400;
    snprintf(c->e->type, sizeof c->e->type, "%s", ERR_INVALID);
    snprintf(c->e->param, sizeof c->e->param, "%s", param ? param : "");
    c->e->code[0] = 0;
    va_start(ap, fmt);
    vsnprintf(c->e->message, sizeof c->e->message, fmt, ap);
    va_end(ap);
    utf8_fix(c->e->message);
    utf8_fix(c->e->param);
    return -1;
}

static int no_memory(pctx *c)
{
    openai_error_set(c->e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static int want_number(pctx *c, const char *key, shoal_json *v, double lo, double hi, double *out)
{
    shoal_json_type t = shoal_json_typeof(v);
    double x = 0;
    if (t != SHOAL_JSON_INT && t != SHOAL_JSON_REAL)
        return bad(c, key, "'%s' must be a number", key);
    x = shoal_json_num_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return bad(c, key, "'%s' must be between %g and %g", key, lo, hi);
    *out = x;
    return 0;
}

static int want_int(pctx *c, const char *key, shoal_json *v, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t x = 0;
    if (shoal_json_typeof(v) != SHOAL_JSON_INT)
        return bad(c, key, "'%s' must be an integer", key);
    x = shoal_json_int_value(v);
    if (x < lo || x > hi)
        return bad(c, key, "'%s' must be between %lld and %lld", key, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

static int want_bool(pctx *c, const char *key, shoal_json *v, int *out)
{
    if (shoal_json_typeof(v) != SHOAL_JSON_BOOL)
        return bad(c, key, "'%s' must be a boolean", key);
    /* The empty path is the value itself. */
    return shoal_json_bool(v, "", out, NULL) == 0 ? 0 : bad(c, key, "'%s' must be a boolean", key);
}

/* ---- fields common to both endpoints ------------------------------------------- */

static int f_model(pctx *c, const char *k, shoal_json *v)
{
    if (shoal_json_typeof(v) != SHOAL_JSON_STRING)
        return bad(c, k, "'model' must be a string");
    free(c->r->model);
    c->r->model = dup_n(shoal_json_str_value(v), shoal_json_str_len(v));
    return c->r->model ? 0 : no_memory(c);
}

static int f_max_tokens(pctx *c, const char *k, shoal_json *v)
{
    int64_t x = 0;
    if (want_int(c, k, v, 1, INT32_MAX, &x))
        return -1;
    if (strcmp(k, "max_tokens") == 0) {
        c->has_max_tokens = 1;
        c->max_tokens = (size_t)x;
    } else {
        c->has_max_completion = 1;
        c->max_completion = (size_t)x;
    }
    return 0;
}

static int f_temperature(pctx *c, const char *k, shoal_json *v)
{
    return want_number(c, k, v, 0, 2, &c->r->temperature);
}

static int f_top_p(pctx *c, const char *k, shoal_json *v)
{
    return want_number(c, k, v, 0, 1, &c->r->top_p);
}

static int f_seed(pctx *c, const char *k, shoal_json *v)
{
    int64_t x = 0;
    if (want_int(c, k, v, INT64_MIN, INT64_MAX, &x))
        return -1;
    c->r->seed = (uint64_t)x;
    c->r->has_seed = 1;
    return 0;
}

static int f_stop(pctx *c, const char *k, shoal_json *v)
{
    openai_request *r = c->r;
    size_t n;

    if (shoal_json_typeof(v) == SHOAL_JSON_STRING) {
        if (!(r->stop[0] = dup_n(shoal_json_str_value(v), shoal_json_str_len(v))))
            return no_memory(c);
        r->n_stop = 1;
        return 0;
    }
    if (shoal_json_typeof(v) != SHOAL_JSON_ARRAY)
        return bad(c, k, "'stop' must be a string or an array of strings");
    n = shoal_json_array_size(v);
    if (n > OPENAI_MAX_STOP)
        return bad(c, k, "'stop' holds at most %d sequences", OPENAI_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        shoal_json *s = shoal_json_array_at(v, i);
        if (shoal_json_typeof(s) != SHOAL_JSON_STRING)
            return bad(c, k, "'stop' must be a string or an array of strings");
        if (!(r->stop[r->n_stop] = dup_n(shoal_json_str_value(s), shoal_json_str_len(s))))
            return no_memory(c);
        r->n_stop++;
    }
    return 0;
}

static int f_stream(pctx *c, const char *k, shoal_json *v)
{
    return want_bool(c, k, v, &c->r->stream);
}

static int f_ignore_eos(pctx *c, const char *k, shoal_json *v)
{
    return want_bool(c, k, v, &c->r->ignore_eos);
}

static int stream_opt(const char *key, shoal_json *v, void *ctx)
{
    pctx *c = ctx;
    if (strcmp(key, "include_usage") != 0)
        return bad(c, "stream_options", "Unrecognized stream option: '%s'", key);
    if (shoal_json_typeof(v) == SHOAL_JSON_NULL)
        return 0;
    return want_bool(c, "stream_options.include_usage", v, &c->r->include_usage);
}

static int f_stream_options(pctx *c, const char *k, shoal_json *v)
{
    if (shoal_json_typeof(v) != SHOAL_JSON_OBJECT)
        return bad(c, k, "'stream_options' must be an object");
    c->has_stream_options = 1;
    return shoal_json_object_foreach(v, stream_opt, c) ? -1 : 0;
}

static int f_user(pctx *c, const char *k, shoal_json *v)
{
    /* An end-user id for the caller's own bookkeeping; it changes nothing
     * here, and that is what the API promises too. */
    return shoal_json_typeof(v) == SHOAL_JSON_STRING ? 0 : bad(c, k, "'user' must be a string");
}

static int f_false(pctx *c, const char *k, shoal_json *v)
{
    int b;
    if (want_bool(c, k, v, &b))
        return -1;
    return b ? bad(c, k, "'%s' is not supported (only false)", k) : 0;
}

/* ---- sampling fields ------------------------------------------------------------- */

static int f_top_k(pctx *c, const char *k, shoal_json *v)
{
    int64_t x = 0;
    /* -1 is vLLM's and 0 HF's way of saying "off" */
    if (want_int(c, k, v, -1, 1 << 30, &x))
        return -1;
    c->r->top_k = x > 0 ? (uint32_t)x : 0;
    return 0;
}

static int f_min_p(pctx *c, const char *k, shoal_json *v)
{
    return want_number(c, k, v, 0, 1, &c->r->min_p);
}

static int f_repetition_penalty(pctx *c, const char *k, shoal_json *v)
{
    if (want_number(c, k, v, 0, 100, &c->r->repetition_penalty))
        return -1;
    return c->r->repetition_penalty > 0 ? 0 : bad(c, k, "'%s' must be above 0 (1 is off)", k);
}

static int f_penalty(pctx *c, const char *k, shoal_json *v)
{
    return want_number(c, k, v, -2, 2, k[0] == 'p' ? &c->r->presence_penalty
                                                   : &c->r->frequency_penalty);
}

static int f_min_tokens(pctx *c, const char *k, shoal_json *v)
{
    int64_t x = 0;
    if (want_int(c, k, v, 0, INT32_MAX, &x))
        return -1;
    c->r->min_tokens = (size_t)x;
    return 0;
}

static int f_stop_token_ids(pctx *c, const char *k, shoal_json *v)
{
    openai_request *r = c->r;
    size_t n;
    if (shoal_json_typeof(v) != SHOAL_JSON_ARRAY)
        return bad(c, k, "'stop_token_ids' must be an array of token ids");
    if ((n = shoal_json_array_size(v)) > OPENAI_MAX_STOP_IDS)
        return bad(c, k, "'stop_token_ids' holds at most %d ids", OPENAI_MAX_STOP_IDS);
    for (size_t i = 0; i < n; i++) {
        shoal_json *x = shoal_json_array_at(v, i);
        int64_t id;
        if (shoal_json_typeof(x) != SHOAL_JSON_INT || (id = shoal_json_int_value(x)) < 0 ||
            id > UINT32_MAX)
            return bad(c, k, "'stop_token_ids' must be an array of token ids");
        r->stop_ids[i] = (uint32_t)id;
    }
    r->n_stop_ids = n;
    return 0;
}

/* chat: logprobs is a boolean; completions: the number of alternatives
 * (0..20: OpenAI stops at 5, vLLM at 20), false meaning none asked */
static int f_logprobs(pctx *c, const char *k, shoal_json *v)
{
    int64_t x = 0;
    if (c->r->kind == OPENAI_CHAT)
        return want_bool(c, k, v, &c->r->logprobs);
    if (shoal_json_typeof(v) == SHOAL_JSON_BOOL) {
        int b = 0;
        want_bool(c, k, v, &b);
        return b ? bad(c, k, "'logprobs' of a completion is a count of alternatives per token "
                             "(0..%d)", GEN_TOP_LOGPROBS_MAX) : 0;
    }
    if (want_int(c, k, v, 0, GEN_TOP_LOGPROBS_MAX, &x))
        return -1;
    c->r->logprobs = 1;
    c->r->top_logprobs = (int)x;
    return 0;
}

static int f_top_logprobs(pctx *c, const char *k, shoal_json *v)
{
    int64_t x = 0;
    if (want_int(c, k, v, 0, GEN_TOP_LOGPROBS_MAX, &x))
        return -1;
    c->r->top_logprobs = (int)x;
    c->has_top_logprobs = x > 0;
    return 0;
}

/* ---- fields accepted at the value that asks for nothing -------------------------- */

static int f_tools(pctx *c, const char *k, shoal_json *v)
{
    if (shoal_json_typeof(v) == SHOAL_JSON_ARRAY && shoal_json_array_size(v) == 0)
        return 0;
    return bad(c, k, "tools are not supported (only an empty 'tools' array)");
}

static int f_tool_choice(pctx *c, const char *k, shoal_json *v)
{
    const char *s = shoal_json_str_value(v);
    if (s && (strcmp(s, "none") == 0 || strcmp(s, "auto") == 0))
        return 0;    /* with no tools, both mean "answer in text" */
    return bad(c, k, "tools are not supported ('tool_choice' may only be \"none\" or \"auto\")");
}

static int f_any_bool(pctx *c, const char *k, shoal_json *v)
{
    int b;
    return want_bool(c, k, v, &b);   /* parallel_tool_calls: nothing to call */
}

static int meta_entry(const char *key, shoal_json *v, void *ctx)
{
    pctx *c = ctx;
    (void)key;
    return shoal_json_typeof(v) == SHOAL_JSON_STRING
               ? 0 : bad(c, "metadata", "'metadata' values must be strings");
}

static int f_metadata(pctx *c, const char *k, shoal_json *v)
{
    /* the caller's own tags (OpenAI keeps them with stored completions; we
     * store nothing, so they change nothing) */
    if (shoal_json_typeof(v) != SHOAL_JSON_OBJECT || shoal_json_object_size(v) > 16)
        return bad(c, k, "'metadata' must be an object of at most 16 strings");
    return shoal_json_object_foreach(v, meta_entry, c) ? -1 : 0;
}

static int f_response_format(pctx *c, const char *k, shoal_json *v)
{
    shoal_json *t = shoal_json_get(v, "type");
    if (shoal_json_typeof(v) == SHOAL_JSON_OBJECT && shoal_json_object_size(v) == 1 && t &&
        shoal_json_typeof(t) == SHOAL_JSON_STRING && strcmp(shoal_json_str_value(t), "text") == 0)
        return 0;
    return bad(c, k, "only 'response_format' {\"type\": \"text\"} is supported");
}

static int f_one(pctx *c, const char *k, shoal_json *v)
{
    int64_t x = 0;
    if (want_int(c, k, v, 1, 128, &x))
        return -1;
    return x == 1 ? 0 : bad(c, k, "only %s = 1 is supported", k);
}

/* ---- chat fields ------------------------------------------------------------------ */

static int parse_role(const char *s, openai_role *out)
{
    if (strcmp(s, "system") == 0 || strcmp(s, "developer") == 0)
        *out = OPENAI_SYSTEM;
    else if (strcmp(s, "user") == 0)
        *out = OPENAI_USER;
    else if (strcmp(s, "assistant") == 0)
        *out = OPENAI_ASSISTANT;
    else
        return -1;
    return 0;
}

/* content: a string, null (assistant), or an array of text parts joined. */
static int msg_content(pctx *c, size_t i, shoal_json *v, openai_message *m)
{
    char param[64];
    shoal_buf b;

    snprintf(param, sizeof param, "messages[%zu].content", i);
    shoal_buf_init(&b, 0);
    if (shoal_json_typeof(v) == SHOAL_JSON_STRING) {
        if (shoal_buf_append(&b, shoal_json_str_value(v), shoal_json_str_len(v)))
            return no_memory(c);
    } else if (shoal_json_typeof(v) == SHOAL_JSON_ARRAY) {
        for (size_t k = 0; k < shoal_json_array_size(v); k++) {
            shoal_json *part = shoal_json_array_at(v, k), *t = shoal_json_get(part, "type");
            shoal_json *text = shoal_json_get(part, "text");
            if (shoal_json_object_size(part) != 2 || !t || !text ||
                shoal_json_typeof(t) != SHOAL_JSON_STRING ||
                strcmp(shoal_json_str_value(t), "text") != 0 ||
                shoal_json_typeof(text) != SHOAL_JSON_STRING) {
                shoal_buf_free(&b);
                return bad(c, param, "only text content parts ({\"type\": \"text\", \"text\": ...}) "
                                     "are supported");
            }
            if (shoal_buf_append(&b, shoal_json_str_value(text), shoal_json_str_len(text))) {
                shoal_buf_free(&b);
                return no_memory(c);
            }
        }
    } else if (shoal_json_typeof(v) != SHOAL_JSON_NULL || m->role != OPENAI_ASSISTANT) {
        return bad(c, param, "'%s' must be a string or an array of text parts", param);
    }
    m->content_len = b.len;
    m->content = b.data ? (char *)shoal_buf_take(&b, NULL) : dup_n("", 0);
    return m->content ? 0 : no_memory(c);
}

typedef struct mctx {
    pctx *c;
    size_t i;
    shoal_json *msg;
} mctx;

static int msg_field(const char *key, shoal_json *v, void *ctx)
{
    mctx *m = ctx;
    char param[80];
    if (strcmp(key, "role") == 0 || strcmp(key, "content") == 0)
        return 0;
    /* The reasoning of an earlier turn is dropped by the history rule
     * (docs/chat.md), so sending it back is fine and changes nothing. */
    if (strcmp(key, "reasoning_content") == 0 &&
        (shoal_json_typeof(v) == SHOAL_JSON_STRING || shoal_json_typeof(v) == SHOAL_JSON_NULL))
        return 0;
    if (shoal_json_typeof(v) == SHOAL_JSON_NULL &&
        (strcmp(key, "name") == 0 || strcmp(key, "tool_calls") == 0 || strcmp(key, "refusal") == 0))
        return 0;
    /* what a client's own history holds after a reply without tool calls */
    if (strcmp(key, "tool_calls") == 0 && shoal_json_typeof(v) == SHOAL_JSON_ARRAY &&
        shoal_json_array_size(v) == 0)
        return 0;
    snprintf(param, sizeof param, "messages[%zu].%s", m->i, key);
    return bad(m->c, param, "Unrecognized message field: '%s' is not supported", key);
}

static int f_messages(pctx *c, const char *k, shoal_json *v)
{
    openai_request *r = c->r;
    size_t n;

    if (shoal_json_typeof(v) != SHOAL_JSON_ARRAY || (n = shoal_json_array_size(v)) == 0)
        return bad(c, k, "'messages' must be a non-empty array");
    if (!(r->msgs = calloc(n, sizeof *r->msgs)))
        return no_memory(c);
    for (size_t i = 0; i < n; i++) {
        shoal_json *m = shoal_json_array_at(v, i), *role, *content;
        char param[64];
        mctx mc = { c, i, m };
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (shoal_json_typeof(m) != SHOAL_JSON_OBJECT)
            return bad(c, param, "each message must be an object");
        role = shoal_json_get(m, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!role || shoal_json_typeof(role) != SHOAL_JSON_STRING)
            return bad(c, param, "each message needs a 'role' string");
        if (parse_role(shoal_json_str_value(role), &r->msgs[i].role))
            return bad(c, param, "role '%s' is not supported (system, developer, user, assistant)",
                       shoal_json_str_value(role));
        r->n_msgs = i + 1;
        if (shoal_json_object_foreach(m, msg_field, &mc))
            return -1;
        content = shoal_json_get(m, "content");
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if (!content)
            return bad(c, param, "each message needs 'content'");
        if (msg_content(c, i, content, &r->msgs[i]))
            return -1;
    }
    return 0;
}

/* OpenAI's efforts onto K3's: none turns thinking off; minimal is low;
 * xhigh is max; K3's own "max" is accepted as well. */
static int f_reasoning_effort(pctx *c, const char *k, shoal_json *v)
{
    static const char *const map[][2] = {
        { "none", "" }, { "minimal", "low" }, { "low", "low" }, { "medium", "medium" },
        { "high", "high" }, { "xhigh", "max" }, { "max", "max" },
    };
    const char *s = shoal_json_str_value(v);
    if (!s)
        return bad(c, k, "'reasoning_effort' must be a string");
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (strcmp(s, map[i][0]) == 0) {
            c->r->thinking = map[i][1][0] != 0;
            if (c->r->thinking)
                snprintf(c->r->effort, sizeof c->r->effort, "%s", map[i][1]);
            return 0;
        }
    return bad(c, k, "'reasoning_effort' must be none, minimal, low, medium, high, xhigh or max");
}

static int template_kw(const char *key, shoal_json *v, void *ctx)
{
    pctx *c = ctx;
    if (strcmp(key, "thinking") != 0)
        return bad(c, "chat_template_kwargs", "Unrecognized chat_template_kwargs key: '%s'", key);
    return want_bool(c, "chat_template_kwargs.thinking", v, &c->r->thinking);
}

static int f_template_kwargs(pctx *c, const char *k, shoal_json *v)
{
    if (shoal_json_typeof(v) != SHOAL_JSON_OBJECT)
        return bad(c, k, "'chat_template_kwargs' must be an object");
    return shoal_json_object_foreach(v, template_kw, c) ? -1 : 0;
}

/* ---- completion fields ----------------------------------------------------------- */

static int f_prompt(pctx *c, const char *k, shoal_json *v)
{
    openai_request *r = c->r;
    shoal_json_type t = shoal_json_typeof(v);
    size_t n;

    if (t == SHOAL_JSON_ARRAY && shoal_json_array_size(v) == 1 &&
        shoal_json_typeof(shoal_json_array_at(v, 0)) == SHOAL_JSON_STRING) {
        v = shoal_json_array_at(v, 0);
        t = SHOAL_JSON_STRING;
    }
    if (t == SHOAL_JSON_STRING) {
        if (shoal_json_str_len(v) == 0)
            return bad(c, k, "'prompt' is empty");
        r->prompt_len = shoal_json_str_len(v);
        r->prompt = dup_n(shoal_json_str_value(v), r->prompt_len);
        return r->prompt ? 0 : no_memory(c);
    }
    if (t != SHOAL_JSON_ARRAY || (n = shoal_json_array_size(v)) == 0)
        return bad(c, k, "'prompt' must be a string, or a non-empty array of token ids "
                         "(batches are not supported)");
    if (!(r->prompt_ids = malloc(n * sizeof *r->prompt_ids)))
        return no_memory(c);
    for (size_t i = 0; i < n; i++) {
        shoal_json *x = shoal_json_array_at(v, i);
        int64_t id;
        if (shoal_json_typeof(x) != SHOAL_JSON_INT || (id = shoal_json_int_value(x)) < 0 ||
            id > UINT32_MAX)
            return bad(c, k, "'prompt' must be a string, or a non-empty array of token ids "
                             "(batches are not supported)");
        r->prompt_ids[i] = (uint32_t)id;
    }
    r->n_prompt_ids = n;
    return 0;
}

/* ---- dispatch -------------------------------------------------------------------- */

typedef int (*field_fn)(pctx *c, const char *key, shoal_json *v);

typedef struct field {
    const char *name;
    field_fn fn;
    unsigned kinds;     /* bit 0: chat, bit 1: completion */
} field;

#define CHAT 1u
#define COMP 2u

static const field FIELDS[] = {
    { "model", f_model, CHAT | COMP },
    { "messages", f_messages, CHAT },
    { "prompt", f_prompt, COMP },
    { "max_tokens", f_max_tokens, CHAT | COMP },
    { "max_completion_tokens", f_max_tokens, CHAT },
    { "temperature", f_temperature, CHAT | COMP },
    { "top_p", f_top_p, CHAT | COMP },
    { "seed", f_seed, CHAT | COMP },
    { "stop", f_stop, CHAT | COMP },
    { "stream", f_stream, CHAT | COMP },
    { "ignore_eos", f_ignore_eos, CHAT | COMP },
    { "stream_options", f_stream_options, CHAT | COMP },
    { "n", f_one, CHAT | COMP },
    { "best_of", f_one, COMP },
    { "user", f_user, CHAT | COMP },
    { "top_k", f_top_k, CHAT | COMP },
    { "min_p", f_min_p, CHAT | COMP },
    { "repetition_penalty", f_repetition_penalty, CHAT | COMP },
    { "frequency_penalty", f_penalty, CHAT | COMP },
    { "presence_penalty", f_penalty, CHAT | COMP },
    { "min_tokens", f_min_tokens, CHAT | COMP },
    { "stop_token_ids", f_stop_token_ids, CHAT | COMP },
    { "logprobs", f_logprobs, CHAT | COMP },
    { "top_logprobs", f_top_logprobs, CHAT },
    { "echo", f_false, COMP },
    { "store", f_false, CHAT },
    { "metadata", f_metadata, CHAT },
    { "tools", f_tools, CHAT },
    { "tool_choice", f_tool_choice, CHAT },
    { "parallel_tool_calls", f_any_bool, CHAT },
    { "response_format", f_response_format, CHAT },
    { "reasoning_effort", f_reasoning_effort, CHAT },
    { "chat_template_kwargs", f_template_kwargs, CHAT },
};

static int on_field(const char *key, shoal_json *v, void *ctx)
{
    pctx *c = ctx;
    unsigned kind = c->r->kind == OPENAI_CHAT ? CHAT : COMP;
    /* null is "not given" in this API, for fields we do not know too:
     * refusing it would reject clients that spell out their defaults. */
    if (shoal_json_typeof(v) == SHOAL_JSON_NULL)
        return 0;
    for (size_t i = 0; i < sizeof FIELDS / sizeof *FIELDS; i++) {
        if (strcmp(FIELDS[i].name, key) != 0 || !(FIELDS[i].kinds & kind))
            continue;
        return FIELDS[i].fn(c, key, v) ? -1 : 0;
    }
    return bad(c, key, "Unrecognized request argument supplied: %s", key);
}

int openai_request_parse(openai_kind kind, const char *body, size_t len, openai_request *r,
                         openai_error *e)
{
    shoal_err jerr;
    shoal_json *root;
    pctx c = { .r = r, .e = e };
    int rc = 0;

    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->top_p = 1.0;
    r->repetition_penalty = 1.0;
    r->thinking = 1;
    snprintf(r->effort, sizeof r->effort, "max");
    root = shoal_json_parse(body, len, &jerr);
    if (!root) {
        bad(&c, NULL, "We could not parse the JSON body of your request: %s", jerr.msg);
        return -1;
    }
    if (shoal_json_typeof(root) != SHOAL_JSON_OBJECT)
        rc = bad(&c, NULL, "The request body must be a JSON object");
    if (rc == 0 && shoal_json_object_foreach(root, on_field, &c))
        rc = -1;
    if (rc == 0 && kind == OPENAI_CHAT && r->n_msgs == 0)
        rc = bad(&c, "messages", "Missing required parameter: 'messages'");
    if (rc == 0 && kind == OPENAI_COMPLETION && !r->prompt && !r->prompt_ids)
        rc = bad(&c, "prompt", "Missing required parameter: 'prompt'");
    if (rc == 0 && c.has_stream_options && !r->stream)
        rc = bad(&c, "stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (rc == 0 && c.has_top_logprobs && !r->logprobs)
        rc = bad(&c, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    if (rc == 0) {
        if (c.has_max_completion)
            r->max_tokens = c.max_completion;
        else if (c.has_max_tokens)
            r->max_tokens = c.max_tokens;
        else if (kind == OPENAI_COMPLETION)
            r->max_tokens = 16;     /* the completions API's documented default */
        if (r->max_tokens && r->min_tokens > r->max_tokens)
            rc = bad(&c, "min_tokens", "'min_tokens' (%zu) is above the most tokens asked for (%zu)",
                     r->min_tokens, r->max_tokens);
    }
    shoal_json_free(root);
    if (rc != 0)
        openai_request_free(r);
    return rc;
}
