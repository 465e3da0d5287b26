/* chat.c — K3's XTML chat rendering and the streaming reply parser
 * (text.h part 2 has the grammar; docs/chat.md the rules with examples).
 *
 * Owns: turning messages into segments (specials or separately encoded
 * ordinary fragments) and the parser's small state machine.  Does not own
 * tokenization nor sampling.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/text/text.h"

/* The thinking-effort system message's text (k3.md §4), with the effort
 * spliced in where %s is.  The line break before "Now" is part of the
 * content: it sits inside a message, unlike the display-only breaks the
 * spec adds after each <|end_of_msg|>. */
static const char EFFORT_HEAD[] =
    "`thinking_effort` guides on how much to think in your thinking channel (not including "
    "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=";
static const char EFFORT_TAIL[] = "`.";

int chat_role_parse(const char *s, chat_role *out)
{
    if (strcmp(s, "system") == 0 || strcmp(s, "developer") == 0)
        *out = CHAT_SYSTEM;
    else if (strcmp(s, "user") == 0)
        *out = CHAT_USER;
    else if (strcmp(s, "assistant") == 0)
        *out = CHAT_ASSISTANT;
    else
        return SHOAL_EINVAL;
    return 0;
}

static const char *role_name(chat_role r)
{
    switch (r) {
    case CHAT_SYSTEM: return "system";
    case CHAT_USER: return "user";
    default: return "assistant";
    }
}

void chat_options_default(chat_options *o)
{
    memset(o, 0, sizeof *o);
    o->thinking = 1;
    memcpy(o->effort, "max", 4);
    o->add_generation_prompt = 1;
}

void chat_prompt_free(chat_prompt *p)
{
    if (!p)
        return;
    tokenizer_ids_free(&p->ids);
    shoal_buf_free(&p->text);
    free(p->seg);
    memset(p, 0, sizeof *p);
}

int chat_attr_escape(const char *s, size_t n, shoal_buf *out)
{
    int rc = 0;
    size_t run = 0;

    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *rep = s[i] == '&' ? "&amp;" : s[i] == '"' ? "&quot;" : NULL;
        if (!rep)
            continue;
        rc = shoal_buf_append(out, s + run, i - run);
        if (rc == 0)
            rc = shoal_buf_append_str(out, rep);
        run = i + 1;
    }
    if (rc == 0)
        rc = shoal_buf_append(out, s + run, n - run);
    return rc;
}

/* ---- rendering ------------------------------------------------------------ */

typedef struct renderer {
    const tokenizer *t;
    chat_prompt *p;
    shoal_err *err;
    uint32_t open, close, sep, eom;
} renderer;

static int seg_push(renderer *r, size_t tok0, size_t text0, int special)
{
    chat_prompt *p = r->p;
    if (p->n_seg == p->cap_seg) {
        size_t cap = p->cap_seg ? p->cap_seg * 2 : 64;
        chat_segment *s = realloc(p->seg, cap * sizeof *s);
        if (!s)
            return shoal_err_set(r->err, SHOAL_ENOMEM, "chat: out of memory");
        p->seg = s;
        p->cap_seg = cap;
    }
    p->seg[p->n_seg++] = (chat_segment){ .tok = tok0, .n_tok = p->ids.n - tok0, .text = text0,
                                         .text_len = p->text.len - text0, .special = special };
    return 0;
}

static int emit_special(renderer *r, uint32_t id)
{
    size_t tok0 = r->p->ids.n, text0 = r->p->text.len;
    const uint8_t *b;
    size_t n;

    if (tokenizer_token_bytes(r->t, id, &b, &n) != 0)
        return shoal_err_set(r->err, SHOAL_EINTERNAL, "chat: special %u has no spelling", id);
    if (tokenizer_ids_push(&r->p->ids, id) || shoal_buf_append(&r->p->text, b, n))
        return shoal_err_set(r->err, SHOAL_ENOMEM, "chat: out of memory");
    return seg_push(r, tok0, text0, 1);
}

/* One ordinary fragment, BPE-encoded on its own (no specials recognised):
 * this is what makes segment boundaries token boundaries. */
static int emit_text(renderer *r, const char *s, size_t n)
{
    size_t tok0 = r->p->ids.n, text0 = r->p->text.len;
    int rc;

    if (n == 0)
        return 0;
    rc = tokenizer_encode(r->t, s, n, 0, &r->p->ids, r->err);
    if (rc != 0)
        return rc;
    if (shoal_buf_append(&r->p->text, s, n))
        return shoal_err_set(r->err, SHOAL_ENOMEM, "chat: out of memory");
    return seg_push(r, tok0, text0, 0);
}

static int emit_str(renderer *r, const char *s)
{
    return emit_text(r, s, strlen(s));
}

/* <|open|>name[ key="value"]...<|sep|>; attrs are n_attr (key, value) pairs.
 * The name, " key", '="', the escaped value and '"' are separate segments. */
static int tag_open(renderer *r, const char *name, const char *const *attrs, size_t n_attr)
{
    int rc = emit_special(r, r->open);
    if (rc == 0)
        rc = emit_str(r, name);
    for (size_t i = 0; rc == 0 && i < n_attr; i++) {
        shoal_buf v;
        char key[64];
        size_t kl = strlen(attrs[2 * i]);
        if (kl + 2 > sizeof key)
            return shoal_err_set(r->err, SHOAL_EINVAL, "chat: attribute name too long");
        key[0] = ' ';
        memcpy(key + 1, attrs[2 * i], kl + 1);
        rc = emit_str(r, key);
        if (rc == 0)
            rc = emit_str(r, "=\"");
        shoal_buf_init(&v, 0);
        if (rc == 0 && chat_attr_escape(attrs[2 * i + 1], strlen(attrs[2 * i + 1]), &v))
            rc = shoal_err_set(r->err, SHOAL_ENOMEM, "chat: out of memory");
        if (rc == 0)
            rc = emit_text(r, (const char *)v.data, v.len);
        shoal_buf_free(&v);
        if (rc == 0)
            rc = emit_str(r, "\"");
    }
    if (rc == 0)
        rc = emit_special(r, r->sep);
    return rc;
}

static int tag_close(renderer *r, const char *name)
{
    int rc = emit_special(r, r->close);
    if (rc == 0)
        rc = emit_str(r, name);
    if (rc == 0)
        rc = emit_special(r, r->sep);
    return rc;
}

/* <|close|>message<|sep|><|end_of_msg|> */
static int message_end(renderer *r)
{
    int rc = tag_close(r, "message");
    return rc ? rc : emit_special(r, r->eom);
}

static int render_plain(renderer *r, chat_role role, const char *type, const char *content,
                        size_t len)
{
    const char *attrs[4] = { "role", role_name(role), "type", type };
    int rc = tag_open(r, "message", attrs, type ? 2 : 1);
    if (rc == 0)
        rc = emit_text(r, content, len);
    return rc ? rc : message_end(r);
}

/* The one rule for earlier assistant turns: with thinking on, an empty
 * think block (reasoning of past turns is not shown to the model again, as
 * Deltafin renders it; k3.md §4 ⚠), then the response block. */
static int render_assistant(renderer *r, const chat_message *m, int thinking)
{
    const char *attrs[2] = { "role", "assistant" };
    int rc = tag_open(r, "message", attrs, 1);
    if (rc == 0 && thinking) {
        rc = tag_open(r, "think", NULL, 0);
        if (rc == 0)
            rc = tag_close(r, "think");
    }
    if (rc == 0)
        rc = tag_open(r, "response", NULL, 0);
    if (rc == 0)
        rc = emit_text(r, m->content, m->content_len);
    if (rc == 0)
        rc = tag_close(r, "response");
    return rc ? rc : message_end(r);
}

static int render_effort(renderer *r, const char *effort)
{
    shoal_buf b;
    int rc;

    shoal_buf_init(&b, 0);
    if (shoal_buf_append_str(&b, EFFORT_HEAD) || shoal_buf_append_str(&b, effort) ||
        shoal_buf_append_str(&b, EFFORT_TAIL))
        rc = shoal_err_set(r->err, SHOAL_ENOMEM, "chat: out of memory");
    else
        rc = render_plain(r, CHAT_SYSTEM, "thinking-effort", (const char *)b.data, b.len);
    shoal_buf_free(&b);
    return rc;
}

static int find_special(const tokenizer *t, const char *s, uint32_t *id, shoal_err *err)
{
    if (tokenizer_special_id(t, s, id) != 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "chat: the tokenizer has no %s token", s);
    return 0;
}

static int effort_ok(const char *e)
{
    if (!*e)
        return 0;
    for (; *e; e++)
        if (!((*e >= 'a' && *e <= 'z') || (*e >= 'A' && *e <= 'Z')))
            return 0;
    return 1;
}

int chat_render(const tokenizer *t, const chat_message *msgs, size_t n, const chat_options *o,
                chat_prompt *out, shoal_err *err)
{
    chat_options def;
    renderer r = { .t = t, .p = out, .err = err };
    int rc;

    if (!o) {
        chat_options_default(&def);
        o = &def;
    }
    memset(out, 0, sizeof *out);
    shoal_buf_init(&out->text, 0);
    if (o->thinking && !effort_ok(o->effort))
        return shoal_err_set(err, SHOAL_EINVAL, "chat: thinking effort must be a word");
    rc = find_special(t, "<|open|>", &r.open, err);
    if (rc == 0)
        rc = find_special(t, "<|close|>", &r.close, err);
    if (rc == 0)
        rc = find_special(t, "<|sep|>", &r.sep, err);
    if (rc == 0)
        rc = find_special(t, "<|end_of_msg|>", &r.eom, err);
    if (rc == 0 && o->thinking)
        rc = render_effort(&r, o->effort);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (msgs[i].role == CHAT_ASSISTANT)
            rc = render_assistant(&r, &msgs[i], o->thinking);
        else
            rc = render_plain(&r, msgs[i].role, NULL, msgs[i].content, msgs[i].content_len);
    }
    if (rc == 0 && o->add_generation_prompt) {
        const char *attrs[2] = { "role", "assistant" };
        rc = tag_open(&r, "message", attrs, 1);
        if (rc == 0)
            rc = tag_open(&r, o->thinking ? "think" : "response", NULL, 0);
    }
    if (rc != 0)
        chat_prompt_free(out);
    return rc;
}

/* ---- parsing ---------------------------------------------------------------- */

/* States: in a channel (text goes to reasoning, content or nowhere), or
 * inside a tag after <|open|> / <|close|> collecting its name up to
 * <|sep|>.  Opening "think" or "response" selects that channel; any other
 * open, and every close, selects CHAT_CH_OTHER (text dropped). */
enum { PS_TEXT = 0, PS_OPEN_TAG = 1, PS_CLOSE_TAG = 2 };

#define TAG_NAME_MAX 64

struct chat_parser {
    const tokenizer *t;
    tokenizer_stream *ts;
    uint32_t open, close, sep, eom;
    int have_open, have_close, have_sep, have_eom;
    int state;
    chat_channel ch;
    char name[TAG_NAME_MAX];
    size_t name_len;
};

chat_parser *chat_parser_new(const tokenizer *t, int thinking)
{
    chat_parser *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->t = t;
    if (!(p->ts = tokenizer_stream_new(t))) {
        free(p);
        return NULL;
    }
    p->have_open = tokenizer_special_id(t, "<|open|>", &p->open) == 0;
    p->have_close = tokenizer_special_id(t, "<|close|>", &p->close) == 0;
    p->have_sep = tokenizer_special_id(t, "<|sep|>", &p->sep) == 0;
    p->have_eom = tokenizer_special_id(t, "<|end_of_msg|>", &p->eom) == 0;
    p->ch = thinking ? CHAT_CH_THINK : CHAT_CH_RESPONSE;
    return p;
}

void chat_parser_free(chat_parser *p)
{
    if (!p)
        return;
    tokenizer_stream_free(p->ts);
    free(p);
}

chat_channel chat_parser_channel(const chat_parser *p)
{
    return p->ch;
}

static shoal_buf *channel_buf(chat_parser *p, shoal_buf *reasoning, shoal_buf *content)
{
    return p->ch == CHAT_CH_THINK ? reasoning : p->ch == CHAT_CH_RESPONSE ? content : NULL;
}

int chat_parser_finish(chat_parser *p, shoal_buf *reasoning, shoal_buf *content)
{
    shoal_buf *dst = channel_buf(p, reasoning, content);
    shoal_buf sink;
    int rc;

    if (dst)
        return tokenizer_stream_flush(p->ts, dst);
    shoal_buf_init(&sink, 0);
    rc = tokenizer_stream_flush(p->ts, &sink);
    shoal_buf_free(&sink);
    return rc;
}

/* The tag name is its first word ("message role=..." -> "message"). */
static chat_channel tag_channel(const chat_parser *p)
{
    size_t n = 0;
    while (n < p->name_len && p->name[n] != ' ')
        n++;
    if (n == 5 && memcmp(p->name, "think", 5) == 0)
        return CHAT_CH_THINK;
    if (n == 8 && memcmp(p->name, "response", 8) == 0)
        return CHAT_CH_RESPONSE;
    return CHAT_CH_OTHER;
}

int chat_parser_push(chat_parser *p, uint32_t id, shoal_buf *reasoning, shoal_buf *content,
                     shoal_err *err)
{
    const uint8_t *b;
    size_t n;
    int rc;

    if (tokenizer_token_bytes(p->t, id, &b, &n) != 0)
        return shoal_err_set(err, SHOAL_ERANGE, "chat: token id %u names nothing", id);
    if (tokenizer_is_special(p->t, id)) {
        int structural = (p->have_eom && id == p->eom) || (p->have_open && id == p->open) ||
                         (p->have_close && id == p->close) || (p->have_sep && id == p->sep);
        if (!structural)
            return 0;   /* a stray special outside the grammar adds no text */
        rc = chat_parser_finish(p, reasoning, content);
        if (rc != 0)
            return shoal_err_set(err, rc, "chat: out of memory");
        if (p->have_eom && id == p->eom)
            return 1;
        if (id == p->sep) {
            if (p->state == PS_OPEN_TAG)
                p->ch = tag_channel(p);
            else if (p->state == PS_CLOSE_TAG)
                p->ch = CHAT_CH_OTHER;
            p->state = PS_TEXT;
        } else {
            p->state = id == p->open ? PS_OPEN_TAG : PS_CLOSE_TAG;
            p->name_len = 0;
        }
        return 0;
    }
    if (p->state != PS_TEXT) {
        size_t room = TAG_NAME_MAX - p->name_len;
        size_t k = n < room ? n : room;
        memcpy(p->name + p->name_len, b, k);
        p->name_len += k;
        return 0;
    }
    {
        shoal_buf *dst = channel_buf(p, reasoning, content);
        return dst ? tokenizer_stream_push(p->ts, id, dst, err) : 0;
    }
}
