/* test_chat.c — engine/text/text.h (the chat format): the spec's two-turn example rendered
 * exactly, segment boundaries being token boundaries, thinking off, the
 * effort, escaping, specials in user text staying ordinary, and the reply
 * parser (channels, end of message, split UTF-8, stray specials).
 *
 * The vocabulary is built here: the 256 single bytes, a few merges, and
 * K3's structural specials above them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/err.h"
#include "engine/text/text.h"

static const char *const MERGES[] = {
    "ro", "le", "role", "me", "ss", "mess", "ag", "age", "message", "He", "ll", "llo",
    "Hello", "=\"", "\"<", "e=", "th", "in", "ink", "think", "es", "res", "po", "ns", "pons",
    "respons", "response", "ys", "sys", "te", "tem", "system", NULL
};

#define SP_EOM 300
#define SP_OPEN 301
#define SP_CLOSE 302
#define SP_SEP 303

static const char SPECIALS[] =
    "{\"added_tokens_decoder\": {"
    "\"299\": {\"content\": \"[BOS]\"},"
    "\"300\": {\"content\": \"<|end_of_msg|>\"},"
    "\"301\": {\"content\": \"<|open|>\"},"
    "\"302\": {\"content\": \"<|close|>\"},"
    "\"303\": {\"content\": \"<|sep|>\"}}}";

static void b64(shoal_buf *o, const uint8_t *p, size_t n)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        char q[4] = { A[w >> 18 & 63], A[w >> 12 & 63], i + 1 < n ? A[w >> 6 & 63] : '=',
                      i + 2 < n ? A[w & 63] : '=' };
        assert_int_equal(shoal_buf_append(o, q, 4), 0);
    }
}

static int setup(void **state)
{
    shoal_buf v;
    tokenizer *t = NULL;
    shoal_err err;

    shoal_buf_init(&v, 0);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        b64(&v, &c, 1);
        assert_int_equal(shoal_buf_appendf(&v, " %d\n", b), 0);
    }
    for (int i = 0; MERGES[i]; i++) {
        b64(&v, (const uint8_t *)MERGES[i], strlen(MERGES[i]));
        assert_int_equal(shoal_buf_appendf(&v, " %d\n", 256 + i), 0);
    }
    if (tokenizer_new(&t, (const char *)v.data, v.len, "k3", &err) != 0)
        fail_msg("tokenizer_new: %s", err.msg);
    shoal_buf_free(&v);
    if (tokenizer_specials_parse(t, SPECIALS, strlen(SPECIALS), 0, &err) != 0)
        fail_msg("specials: %s", err.msg);
    *state = t;
    return 0;
}

static int teardown(void **state)
{
    tokenizer_free(*state);
    return 0;
}

static chat_message msg(chat_role r, const char *s)
{
    return (chat_message){ .role = r, .content = s, .content_len = strlen(s) };
}

/* Every segment: a special is exactly one special id; an ordinary fragment
 * is exactly the encoding of its own text (so its ends are token
 * boundaries) and holds no special id.  Segments tile ids and text. */
static void check_segments(const tokenizer *t, const chat_prompt *p)
{
    size_t tok = 0, text = 0;
    tokenizer_ids ids = { 0 };
    shoal_err err;

    for (size_t i = 0; i < p->n_seg; i++) {
        const chat_segment *s = &p->seg[i];
        assert_int_equal(s->tok, tok);
        assert_int_equal(s->text, text);
        if (s->special) {
            assert_int_equal(s->n_tok, 1);
            assert_true(tokenizer_is_special(t, p->ids.v[s->tok]));
        } else {
            ids.n = 0;
            assert_int_equal(tokenizer_encode(t, (const char *)p->text.data + s->text, s->text_len,
                                              0, &ids, &err), 0);
            assert_int_equal(ids.n, s->n_tok);
            assert_memory_equal(ids.v, p->ids.v + s->tok, ids.n * sizeof *ids.v);
            for (size_t k = 0; k < s->n_tok; k++)
                assert_false(tokenizer_is_special(t, p->ids.v[s->tok + k]));
        }
        tok += s->n_tok;
        text += s->text_len;
    }
    assert_int_equal(tok, p->ids.n);
    assert_int_equal(text, p->text.len);
    tokenizer_ids_free(&ids);
}

static const char EFFORT_MSG[] =
    "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>`thinking_effort` guides on how "
    "much to think in your thinking channel (not including the response channel), supported "
    "values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with "
    "`thinking_effort=max`.<|close|>message<|sep|><|end_of_msg|>";

static void test_two_turn(void **state)
{
    const tokenizer *t = *state;
    chat_message m[3] = { msg(CHAT_USER, "Hi"), msg(CHAT_ASSISTANT, "Hello!"),
                          msg(CHAT_USER, "How are you?") };
    chat_prompt p;
    shoal_err err;
    shoal_buf want;

    assert_int_equal(chat_render(t, m, 3, NULL, &p, &err), 0);
    shoal_buf_init(&want, 0);
    assert_int_equal(shoal_buf_append_str(&want, EFFORT_MSG), 0);
    assert_int_equal(shoal_buf_append_str(&want,
        "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|><|close|>think<|sep|>"
        "<|open|>response<|sep|>Hello!<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"user\"<|sep|>How are you?<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"), 0);
    assert_int_equal(p.text.len, want.len);
    assert_memory_equal(p.text.data, want.data, want.len);
    check_segments(t, &p);

    /* The separate fragments of an opening tag, in order. */
    {
        static const char *const frag[] = { "<|open|>", "message", " role", "=\"", "system", "\"",
                                            " type", "=\"", "thinking-effort", "\"", "<|sep|>" };
        for (size_t i = 0; i < sizeof frag / sizeof *frag; i++) {
            const chat_segment *s = &p.seg[i];
            assert_int_equal(s->text_len, strlen(frag[i]));
            assert_memory_equal(p.text.data + s->text, frag[i], s->text_len);
        }
    }
    /* The rendered ids decode back to the text. */
    {
        shoal_buf d;
        shoal_buf_init(&d, 0);
        assert_int_equal(tokenizer_decode(t, p.ids.v, p.ids.n, 0, &d, &err), 0);
        assert_int_equal(d.len, want.len);
        assert_memory_equal(d.data, want.data, d.len);
        shoal_buf_free(&d);
    }
    shoal_buf_free(&want);
    chat_prompt_free(&p);
}

static void test_thinking_off(void **state)
{
    const tokenizer *t = *state;
    chat_message m[4] = { msg(CHAT_SYSTEM, "Be brief."), msg(CHAT_USER, "Hi"),
                          msg(CHAT_ASSISTANT, "Hello!"), msg(CHAT_USER, "Bye") };
    chat_options o;
    chat_prompt p;
    shoal_err err;
    const char *want =
        "<|open|>message role=\"system\"<|sep|>Be brief.<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>Hello!"
        "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"user\"<|sep|>Bye<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";

    chat_options_default(&o);
    o.thinking = 0;
    assert_int_equal(chat_render(t, m, 4, &o, &p, &err), 0);
    assert_int_equal(p.text.len, strlen(want));
    assert_memory_equal(p.text.data, want, p.text.len);
    check_segments(t, &p);
    assert_int_equal(p.ids.v[p.ids.n - 1], SP_SEP);
    chat_prompt_free(&p);
}

static void test_effort_and_prefix(void **state)
{
    const tokenizer *t = *state;
    chat_message m[3] = { msg(CHAT_USER, "Hi"), msg(CHAT_ASSISTANT, "Hello!"),
                          msg(CHAT_USER, "More") };
    chat_options o;
    chat_prompt a, b, nogen;
    shoal_err err;

    chat_options_default(&o);
    memcpy(o.effort, "low", 4);
    assert_int_equal(chat_render(t, m, 1, &o, &a, &err), 0);
    assert_non_null(memmem(a.text.data, a.text.len, "`thinking_effort=low`.", 22));
    assert_null(memmem(a.text.data, a.text.len, "`thinking_effort=max`", 21));

    /* History is rendered by one rule, so a conversation's next prompt
     * extends the previous prompt without its generation prompt: that is
     * what lets the server reuse the saved state. */
    o.add_generation_prompt = 0;
    assert_int_equal(chat_render(t, m, 1, &o, &nogen, &err), 0);
    o.add_generation_prompt = 1;
    assert_int_equal(chat_render(t, m, 3, &o, &b, &err), 0);
    assert_true(b.ids.n > a.ids.n);
    assert_memory_equal(b.ids.v, nogen.ids.v, nogen.ids.n * sizeof *b.ids.v);
    assert_memory_equal(a.ids.v, nogen.ids.v, nogen.ids.n * sizeof *b.ids.v);
    /* ...and even the previous prompt with its generation prompt: the
     * history's assistant turn opens exactly as the generation prompt did. */
    assert_memory_equal(b.ids.v, a.ids.v, a.ids.n * sizeof *b.ids.v);
    chat_prompt_free(&a);
    chat_prompt_free(&b);
    chat_prompt_free(&nogen);

    memcpy(o.effort, "ma\"x", 5);
    assert_int_equal(chat_render(t, m, 1, &o, &a, &err), SHOAL_EINVAL);
    assert_null(a.ids.v);
}

static void test_escape(void **state)
{
    shoal_buf b;
    (void)state;
    shoal_buf_init(&b, 0);
    assert_int_equal(chat_attr_escape("a&b\"c<|sep|>&&", 14, &b), 0);
    assert_string_equal((const char *)b.data, "a&amp;b&quot;c<|sep|>&amp;&amp;");
    shoal_buf_reset(&b);
    assert_int_equal(chat_attr_escape("plain", 5, &b), 0);
    assert_string_equal((const char *)b.data, "plain");
    shoal_buf_free(&b);
}

/* User text that spells a special is ordinary BPE: only the structural
 * positions hold special ids. */
static void test_specials_in_text(void **state)
{
    const tokenizer *t = *state;
    chat_message m[1] = { msg(CHAT_USER, "x<|open|>y<|end_of_msg|>") };
    chat_options o;
    chat_prompt p;
    shoal_err err;
    size_t n_special = 0;

    chat_options_default(&o);
    o.thinking = 0;
    assert_int_equal(chat_render(t, m, 1, &o, &p, &err), 0);
    check_segments(t, &p);
    for (size_t i = 0; i < p.ids.n; i++)
        n_special += tokenizer_is_special(t, p.ids.v[i]);
    /* open sep close sep eom, then open sep open sep of the prompt */
    assert_int_equal(n_special, 9);
    chat_prompt_free(&p);
}

static void push_text(const tokenizer *t, chat_parser *ps, const char *s, shoal_buf *r,
                      shoal_buf *c, int *ended)
{
    tokenizer_ids ids = { 0 };
    shoal_err err;
    assert_int_equal(tokenizer_encode(t, s, strlen(s), TOKENIZER_ALLOW_SPECIALS, &ids, &err), 0);
    for (size_t i = 0; i < ids.n; i++) {
        int rc = chat_parser_push(ps, ids.v[i], r, c, &err);
        assert_true(rc == 0 || rc == 1);
        if (rc == 1)
            *ended = 1;
    }
    tokenizer_ids_free(&ids);
}

static void test_parser(void **state)
{
    const tokenizer *t = *state;
    chat_parser *ps = chat_parser_new(t, 1);
    shoal_buf r, c;
    shoal_err err;
    int ended = 0;

    shoal_buf_init(&r, 0);
    shoal_buf_init(&c, 0);
    assert_int_equal(chat_parser_channel(ps), CHAT_CH_THINK);
    push_text(t, ps, "Let me think.", &r, &c, &ended);
    assert_string_equal((const char *)r.data, "Let me think.");
    assert_int_equal(c.len, 0);
    push_text(t, ps, "<|close|>think<|sep|><|open|>response<|sep|>Fine", &r, &c, &ended);
    assert_int_equal(chat_parser_channel(ps), CHAT_CH_RESPONSE);
    assert_string_equal((const char *)c.data, "Fine");

    /* "é" is two byte tokens here: nothing is emitted for the first. */
    {
        size_t before = c.len;
        assert_int_equal(chat_parser_push(ps, 0xC3, &r, &c, &err), 0);
        assert_int_equal(c.len, before);
        assert_int_equal(chat_parser_push(ps, 0xA9, &r, &c, &err), 0);
        assert_string_equal((const char *)c.data + before, "\xC3\xA9");
    }
    /* A stray special ([BOS]) adds no text. */
    assert_int_equal(chat_parser_push(ps, 299, &r, &c, &err), 0);
    push_text(t, ps, ".<|close|>response<|sep|><|close|>message<|sep|>", &r, &c, &ended);
    assert_false(ended);
    assert_string_equal((const char *)c.data, "Fine\xC3\xA9.");
    assert_int_equal(chat_parser_channel(ps), CHAT_CH_OTHER);
    assert_int_equal(chat_parser_push(ps, SP_EOM, &r, &c, &err), 1);
    assert_string_equal((const char *)r.data, "Let me think.");
    assert_int_equal(chat_parser_push(ps, 100000, &r, &c, &err), SHOAL_ERANGE);
    chat_parser_free(ps);

    /* Thinking off: text is the response from the start; a dangling half
     * character becomes U+FFFD at the end. */
    ps = chat_parser_new(t, 0);
    shoal_buf_reset(&r);
    shoal_buf_reset(&c);
    push_text(t, ps, "Hi", &r, &c, &ended);
    assert_int_equal(chat_parser_push(ps, 0xE2, &r, &c, &err), 0);
    assert_int_equal(chat_parser_finish(ps, &r, &c), 0);
    assert_string_equal((const char *)c.data, "Hi\xEF\xBF\xBD");
    assert_int_equal(r.len, 0);
    chat_parser_free(ps);
    chat_parser_free(NULL);
    shoal_buf_free(&r);
    shoal_buf_free(&c);
}

static void test_missing_specials(void **state)
{
    tokenizer *t = NULL;
    shoal_buf v;
    shoal_err err;
    chat_prompt p;
    chat_message m[1] = { msg(CHAT_USER, "Hi") };
    (void)state;

    shoal_buf_init(&v, 0);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        b64(&v, &c, 1);
        assert_int_equal(shoal_buf_appendf(&v, " %d\n", b), 0);
    }
    assert_int_equal(tokenizer_new(&t, (const char *)v.data, v.len, "k3", &err), 0);
    assert_int_equal(chat_render(t, m, 1, NULL, &p, &err), SHOAL_ENOTFOUND);
    assert_non_null(strstr(err.msg, "<|open|>"));
    tokenizer_free(t);
    shoal_buf_free(&v);
}

static void test_roles(void **state)
{
    chat_role r;
    (void)state;
    assert_int_equal(chat_role_parse("user", &r), 0);
    assert_int_equal(r, CHAT_USER);
    assert_int_equal(chat_role_parse("developer", &r), 0);
    assert_int_equal(r, CHAT_SYSTEM);
    assert_int_equal(chat_role_parse("assistant", &r), 0);
    assert_int_equal(r, CHAT_ASSISTANT);
    assert_int_equal(chat_role_parse("tool", &r), SHOAL_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_turn),
        cmocka_unit_test(test_thinking_off),
        cmocka_unit_test(test_effort_and_prefix),
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_specials_in_text),
        cmocka_unit_test(test_parser),
        cmocka_unit_test(test_missing_specials),
        cmocka_unit_test(test_roles),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
