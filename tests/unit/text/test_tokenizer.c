/* test_tokenizer.c — engine/text/text.h (the tokenizer): loading and its errors, BPE merge
 * order against a naive oracle, the heap and linear merge paths, specials
 * on and off, lossy UTF-8, the streaming detokenizer, the pattern
 * translation (the && rewrite checked over every code point), slicing of
 * huge inputs, invalid UTF-8 input.
 *
 * Vocabularies are built here: ranks 0..255 are the single bytes, then the
 * test's own merges from 256 on, written in tiktoken format.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/err.h"
#include "engine/text/text.h"

/* ---- helpers ---------------------------------------------------------------- */

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

/* tiktoken text: 256 single bytes, then `extra` (NULL-terminated list of
 * C strings) at ranks 256, 257, ... */
static void vocab_text(shoal_buf *o, const char *const *extra)
{
    shoal_buf_init(o, 0);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        b64(o, &c, 1);
        assert_int_equal(shoal_buf_appendf(o, " %d\n", b), 0);
    }
    for (int i = 0; extra && extra[i]; i++) {
        b64(o, (const uint8_t *)extra[i], strlen(extra[i]));
        assert_int_equal(shoal_buf_appendf(o, " %d\n", 256 + i), 0);
    }
}

static tokenizer *make_tok(const char *const *extra, const char *pattern)
{
    shoal_buf v;
    tokenizer *t = NULL;
    shoal_err err;
    vocab_text(&v, extra);
    int rc = tokenizer_new(&t, (const char *)v.data, v.len, pattern, &err);
    if (rc)
        fail_msg("tokenizer_new: %s", err.msg);
    shoal_buf_free(&v);
    return t;
}

static void encode(const tokenizer *t, const char *s, size_t n, int flags, tokenizer_ids *ids)
{
    shoal_err err;
    ids->n = 0;
    int rc = tokenizer_encode(t, s, n, flags, ids, &err);
    if (rc)
        fail_msg("encode: %s", err.msg);
}

static void assert_ids(const tokenizer_ids *ids, const uint32_t *want, size_t n)
{
    if (ids->n != n) {
        for (size_t i = 0; i < ids->n && i < 40; i++)
            print_message("%u ", ids->v[i]);
        print_message("\n");
    }
    assert_int_equal(ids->n, n);
    for (size_t i = 0; i < n; i++)
        if (ids->v[i] != want[i])
            fail_msg("id %zu: got %u want %u", i, ids->v[i], want[i]);
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* ---- loading ------------------------------------------------------------------ */

static void expect_load_error(const char *text, int code, const char *needle)
{
    tokenizer *t = (tokenizer *)1;
    shoal_err err;
    shoal_err_clear(&err);
    assert_int_equal(tokenizer_new(&t, text, strlen(text), "k3", &err), code);
    assert_null(t);
    if (!strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
}

static void test_load_errors(void **state)
{
    shoal_buf v;
    (void)state;
    vocab_text(&v, NULL);
    /* Each case: the valid 256-line vocabulary plus one bad line 257. */
    const char *bad[][3] = {
        { "YWJj! 256\n", "line 257", "bad base64" },
        { "YWI 256\n", "line 257", "bad base64" },      /* not a multiple of 4 */
        { "YR== 256\n", "line 257", "bad base64" },     /* non-canonical padding bits */
        { "YWJj 12\n", "line 257", "duplicate rank 12 (first on line 13)" },
        { "YQ== 256\n", "line 257", "duplicate bytes (same as rank 97 on line 98)" },
        { "YWJj -1\n", "line 257", "bad rank" },
        { "YWJj 99999999999\n", "line 257", "bad rank" },
        { "YWJj\n", "line 257", "expected 'base64 rank'" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shoal_buf t;
        shoal_buf_init(&t, 0);
        assert_int_equal(shoal_buf_append(&t, v.data, v.len), 0);
        assert_int_equal(shoal_buf_append_str(&t, bad[i][0]), 0);
        expect_load_error((const char *)t.data, SHOAL_EFORMAT, bad[i][1]);
        expect_load_error((const char *)t.data, SHOAL_EFORMAT, bad[i][2]);
        shoal_buf_free(&t);
    }
    /* A missing single byte, an empty file. */
    expect_load_error("YQ== 0\nYg== 1\n", SHOAL_EFORMAT, "lacks the single byte 0x00");
    expect_load_error("\n\n", SHOAL_EFORMAT, "empty");
    /* A bad pattern is an error too. */
    {
        tokenizer *t = NULL;
        shoal_err err;
        assert_int_equal(tokenizer_new(&t, (const char *)v.data, v.len, "[a", &err), SHOAL_EINVAL);
        assert_null(t);
    }
    /* Valid with CRLF line ends and blank lines. */
    {
        shoal_buf t;
        tokenizer *tk = NULL;
        shoal_err err;
        shoal_buf_init(&t, 0);
        for (size_t i = 0; i < v.len; i++) {
            if (v.data[i] == '\n')
                assert_int_equal(shoal_buf_append_str(&t, "\r\n\n"), 0);
            else
                assert_int_equal(shoal_buf_append(&t, &v.data[i], 1), 0);
        }
        assert_int_equal(tokenizer_new(&tk, (const char *)t.data, t.len, "o200k", &err), 0);
        assert_int_equal(tokenizer_n_base(tk), 256);
        tokenizer_free(tk);
        shoal_buf_free(&t);
    }
    shoal_buf_free(&v);
    tokenizer_free(NULL);
}

/* ---- BPE ------------------------------------------------------------------------- */

static void test_bpe_known_merges(void **state)
{
    /* 256 "aa", 257 "bc", 258 "abc", 259 "yz", 260 "xy", 261 "aaa"... */
    static const char *const extra[] = { "aa", "bc", "abc", "yz", "xy", NULL };
    tokenizer *t = make_tok(extra, "k3");
    tokenizer_ids ids = { 0 };
    (void)state;

    encode(t, "aaa", 3, 0, &ids);          /* tie between the two "aa": leftmost */
    assert_ids(&ids, (uint32_t[]){ 256, 'a' }, 2);
    encode(t, "aaaaa", 5, 0, &ids);
    assert_ids(&ids, (uint32_t[]){ 256, 256, 'a' }, 3);
    encode(t, "abcd", 4, 0, &ids);         /* bc (257) first, then a+bc = abc (258) */
    assert_ids(&ids, (uint32_t[]){ 258, 'd' }, 2);
    encode(t, "xyz", 3, 0, &ids);          /* yz (259) beats xy (260) though it is right of it */
    assert_ids(&ids, (uint32_t[]){ 'x', 259 }, 2);
    encode(t, "abc", 3, 0, &ids);          /* a whole piece in the vocabulary */
    assert_ids(&ids, (uint32_t[]){ 258 }, 1);
    encode(t, "", 0, 0, &ids);
    assert_int_equal(ids.n, 0);
    tokenizer_ids_free(&ids);
    tokenizer_free(t);
}

/* Naive oracle: the rule stated literally, O(n^3). */
static size_t oracle_bpe(const tokenizer *t, const uint8_t *p, size_t n, uint32_t *out,
                         const char *const *extra)
{
    size_t starts[600], m = n;
    (void)t;
    for (size_t i = 0; i <= n; i++)
        starts[i] = i;
    for (;;) {
        size_t best = SIZE_MAX;
        uint32_t best_r = UINT32_MAX;
        for (size_t i = 0; i + 1 < m; i++) {
            size_t a = starts[i], e = starts[i + 2];
            for (uint32_t r = 0; extra[r]; r++)
                if (strlen(extra[r]) == e - a && memcmp(extra[r], p + a, e - a) == 0 && 256 + r < best_r)
                    best_r = 256 + r, best = i;
        }
        if (best == SIZE_MAX)
            break;
        memmove(&starts[best + 1], &starts[best + 2], (m - best - 1) * sizeof starts[0]);
        m--;
    }
    for (size_t i = 0; i < m; i++) {
        size_t a = starts[i], e = starts[i + 1];
        if (e - a == 1) {
            out[i] = p[a];
            continue;
        }
        out[i] = UINT32_MAX;
        for (uint32_t r = 0; extra[r]; r++)
            if (strlen(extra[r]) == e - a && memcmp(extra[r], p + a, e - a) == 0)
                out[i] = 256 + r;
    }
    return m;
}

static void test_bpe_heap_linear_oracle(void **state)
{
    /* Every string over {a,b,c} of length 2..4, in a shuffled rank order. */
    static char store[120][5];
    static const char *extra[121];
    size_t n = 0;
    (void)state;
    for (int len = 2; len <= 4; len++) {
        int total = len == 2 ? 9 : len == 3 ? 27 : 81;
        for (int k = 0; k < total; k++) {
            int x = k;
            for (int c = 0; c < len; c++, x /= 3)
                store[n][c] = (char)('a' + x % 3);
            store[n][len] = 0;
            n++;
        }
    }
    for (size_t i = n - 1; i > 0; i--) {   /* shuffle, keeping "ab.." pairs reachable */
        size_t j = rnd((uint32_t)i + 1);
        char tmp[5];
        memcpy(tmp, store[i], 5);
        memcpy(store[i], store[j], 5);
        memcpy(store[j], tmp, 5);
    }
    for (size_t i = 0; i < n; i++)
        extra[i] = store[i];
    extra[n] = NULL;

    /* "[abc]+" keeps the whole string one piece (k3 would too, but say it). */
    tokenizer *lin = make_tok(extra, "[abc]+");
    tokenizer *hp = make_tok(extra, "[abc]+");
    tokenizer_set_heap_min(lin, 1u << 30);
    tokenizer_set_heap_min(hp, 4);
    tokenizer_ids a = { 0 }, b = { 0 };
    uint32_t want[600];
    for (int iter = 0; iter < 3000; iter++) {
        char s[520];
        size_t len = 2 + rnd(iter < 2500 ? 40 : 500);
        for (size_t i = 0; i < len; i++)
            s[i] = (char)('a' + rnd(rnd(4) ? 3 : 1));   /* some long runs of 'a' */
        encode(lin, s, len, 0, &a);
        encode(hp, s, len, 0, &b);
        assert_int_equal(a.n, b.n);
        assert_memory_equal(a.v, b.v, a.n * sizeof a.v[0]);
        if (len <= 60) {
            uint32_t whole = UINT32_MAX;
            for (uint32_t r = 0; extra[r]; r++)
                if (strlen(extra[r]) == len && memcmp(extra[r], s, len) == 0)
                    whole = 256 + r;
            size_t m = whole != UINT32_MAX ? (want[0] = whole, 1)
                                           : oracle_bpe(lin, (const uint8_t *)s, len, want, extra);
            assert_int_equal(a.n, m);
            assert_memory_equal(a.v, want, m * sizeof want[0]);
        }
    }
    tokenizer_ids_free(&a);
    tokenizer_ids_free(&b);
    tokenizer_free(lin);
    tokenizer_free(hp);
}

/* ---- specials -------------------------------------------------------------------- */

static const char CONFIG[] =
    "{\"added_tokens_decoder\": {"
    " \"256\": {\"content\": \"<|open|>\", \"special\": true},"
    " \"258\": {\"content\": \"[BOS]\", \"special\": true},"
    " \"259\": {\"content\": \"<|open|>x\"}}}";

static void test_specials(void **state)
{
    tokenizer *t = make_tok(NULL, "k3");
    tokenizer_ids ids = { 0 };
    shoal_buf out;
    shoal_err err;
    uint32_t id;
    const char *text = "a <|open|> b [BOS] c<|reserved_token_257|><|open|>x";
    (void)state;

    assert_int_equal(tokenizer_specials_parse(t, CONFIG, strlen(CONFIG), 262, &err), 0);
    assert_int_equal(tokenizer_n_vocab(t), 262);
    assert_int_equal(tokenizer_n_specials(t), 6);
    assert_int_equal(tokenizer_special_id(t, "<|reserved_token_261|>", &id), 0);
    assert_int_equal(id, 261);
    assert_int_equal(tokenizer_special_id(t, "<|nope|>", &id), SHOAL_ENOTFOUND);
    assert_true(tokenizer_is_special(t, 257));
    assert_false(tokenizer_is_special(t, 97));

    /* Off: plain bytes (a bytes-only vocabulary maps each byte to itself). */
    encode(t, text, strlen(text), 0, &ids);
    assert_int_equal(ids.n, strlen(text));
    for (size_t i = 0; i < ids.n; i++)
        assert_int_equal(ids.v[i], (uint8_t)text[i]);
    /* On: the longest spelling wins at a position ("<|open|>x" over "<|open|>"). */
    encode(t, text, strlen(text), TOKENIZER_ALLOW_SPECIALS, &ids);
    assert_ids(&ids, (uint32_t[]){ 'a', ' ', 256, ' ', 'b', ' ', 258, ' ', 'c', 257, 259 }, 11);
    shoal_buf_init(&out, 0);
    assert_int_equal(tokenizer_decode(t, ids.v, ids.n, 0, &out, &err), 0);
    assert_int_equal(out.len, strlen(text));
    assert_memory_equal(out.data, text, out.len);
    /* Unknown ids: an error, output unchanged. */
    uint32_t badid[] = { 97, 262 };
    assert_int_equal(tokenizer_decode(t, badid, 2, 0, &out, &err), SHOAL_ERANGE);
    assert_int_equal(out.len, strlen(text));
    shoal_buf_free(&out);

    /* Errors: ids outside the range, duplicate spellings, bad shapes. */
    const char *bad[] = {
        "{\"added_tokens_decoder\": {\"100\": {\"content\": \"<x>\"}}}",
        "{\"added_tokens_decoder\": {\"300\": {\"content\": \"<x>\"}}}",
        "{\"added_tokens_decoder\": {\"256\": {\"content\": \"<x>\"}, \"257\": {\"content\": \"<x>\"}}}",
        "{\"added_tokens_decoder\": {\"256\": {\"content\": \"\"}}}",
        "{\"added_tokens_decoder\": {\"x\": {\"content\": \"<x>\"}}}",
        "{\"added_tokens_decoder\": [1]}",
        "{not json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shoal_err_clear(&err);
        assert_true(tokenizer_specials_parse(t, bad[i], strlen(bad[i]), 262, &err) < 0);
        assert_true(err.msg[0] != 0);
        assert_int_equal(tokenizer_n_specials(t), 0);
    }
    /* reserved_end 0: one past the highest listed id. */
    assert_int_equal(tokenizer_specials_parse(t, CONFIG, strlen(CONFIG), 0, &err), 0);
    assert_int_equal(tokenizer_n_vocab(t), 260);
    tokenizer_ids_free(&ids);
    tokenizer_free(t);
}

/* ---- decoding ----------------------------------------------------------------------- */

static void expect_lossy(const char *in, size_t n, const char *want)
{
    shoal_buf o;
    shoal_buf_init(&o, 0);
    assert_int_equal(tokenizer_utf8_lossy((const uint8_t *)in, n, &o), 0);
    if (o.len != strlen(want) || (o.len && memcmp(o.data, want, o.len)))
        fail_msg("lossy of %zu bytes gave '%.*s' want '%s'", n, (int)o.len, (const char *)o.data, want);
    shoal_buf_free(&o);
}

#define R "\xEF\xBF\xBD"

static void test_lossy_utf8(void **state)
{
    (void)state;
    expect_lossy("plain \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", 17, "plain \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
    expect_lossy("\xF0\x9F\x98", 3, R);                  /* truncated emoji: one */
    expect_lossy("\xF0\x9F\x98x", 4, R "x");
    expect_lossy("\xED\xA0\x80", 3, R R R);              /* surrogate: three */
    expect_lossy("\xC0\xAF", 2, R R);                    /* overlong: two */
    expect_lossy("a\x80" "b", 3, "a" R "b");
    expect_lossy("\xE2\x82" "x", 3, R "x");
    expect_lossy("\xF4\x90\x80\x80", 4, R R R R);        /* above U+10FFFF */
    expect_lossy("\xE0\x9F\x80", 3, R R R);              /* overlong 3-byte */
    expect_lossy("\xFF\xFE", 2, R R);
    expect_lossy("\xE2\x82\xE2\x82\xAC", 5, R "\xE2\x82\xAC");
    expect_lossy("", 0, "");
}

static void test_stream_split_emoji(void **state)
{
    tokenizer *t = make_tok(NULL, "k3");
    tokenizer_stream *s = tokenizer_stream_new(t);
    shoal_buf o;
    shoal_err err;
    const uint8_t emoji[4] = { 0xF0, 0x9F, 0x98, 0x80 };
    (void)state;

    shoal_buf_init(&o, 0);
    assert_non_null(s);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(tokenizer_stream_push(s, emoji[i], &o, &err), 0);   /* ranks = bytes */
        if (i < 3) {
            assert_int_equal(o.len, 0);                     /* never half a character */
            assert_int_equal(tokenizer_stream_pending(s), (size_t)i + 1);
        }
    }
    assert_int_equal(o.len, 4);
    assert_memory_equal(o.data, emoji, 4);
    assert_int_equal(tokenizer_stream_pending(s), 0);
    /* Unknown id: an error, nothing changes. */
    assert_int_equal(tokenizer_stream_push(s, 5000, &o, &err), SHOAL_ERANGE);
    /* A dangling partial becomes one U+FFFD at the flush. */
    shoal_buf_reset(&o);
    assert_int_equal(tokenizer_stream_push(s, 'a', &o, &err), 0);
    assert_int_equal(tokenizer_stream_push(s, 0xF0, &o, &err), 0);
    assert_int_equal(tokenizer_stream_push(s, 0x9F, &o, &err), 0);
    assert_int_equal(o.len, 1);
    assert_int_equal(tokenizer_stream_flush(s, &o), 0);
    assert_int_equal(o.len, 4);
    assert_memory_equal(o.data, "a" R, 4);
    /* A partial followed by a non-continuation: replaced at once. */
    shoal_buf_reset(&o);
    assert_int_equal(tokenizer_stream_push(s, 0xE2, &o, &err), 0);
    assert_int_equal(tokenizer_stream_push(s, 'x', &o, &err), 0);
    assert_int_equal(o.len, 4);
    assert_memory_equal(o.data, R "x", 4);

    /* Random bytes cut at random places: the stream equals the whole. */
    for (int iter = 0; iter < 2000; iter++) {
        uint8_t buf[64];
        size_t n = rnd(64);
        shoal_buf whole, part;
        static const uint8_t pool[] = { 'a', 0x80, 0x9F, 0xBF, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xED,
                                        0xA0, 0xF0, 0x9F, 0x98, 0xF4, 0x90, 0xFF, 0xC0 };
        for (size_t i = 0; i < n; i++)
            buf[i] = pool[rnd(sizeof pool)];
        shoal_buf_init(&whole, 0);
        shoal_buf_init(&part, 0);
        assert_int_equal(tokenizer_utf8_lossy(buf, n, &whole), 0);
        for (size_t i = 0; i < n;) {
            size_t k = 1 + rnd(4);
            if (k > n - i)
                k = n - i;
            size_t before = part.len;
            assert_int_equal(tokenizer_stream_push_bytes(s, buf + i, k, &part), 0);
            /* Whatever came out so far is valid UTF-8 ending on a boundary. */
            shoal_buf chk;
            shoal_buf_init(&chk, 0);
            assert_int_equal(tokenizer_utf8_lossy(part.data + before, part.len - before, &chk), 0);
            assert_int_equal(chk.len, part.len - before);
            shoal_buf_free(&chk);
            i += k;
        }
        assert_int_equal(tokenizer_stream_flush(s, &part), 0);
        assert_int_equal(part.len, whole.len);
        if (whole.len)
            assert_memory_equal(part.data, whole.data, whole.len);
        shoal_buf_free(&whole);
        shoal_buf_free(&part);
    }
    shoal_buf_free(&o);
    tokenizer_stream_free(s);
    tokenizer_stream_free(NULL);
    tokenizer_free(t);
}

/* ---- patterns ------------------------------------------------------------------------ */

static pcre2_code *compile(const char *pat)
{
    int e;
    PCRE2_SIZE eo;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &e, &eo, NULL);
    if (!c)
        fail_msg("compile %s failed at %zu", pat, (size_t)eo);
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
    return c;
}

static int matches(pcre2_code *c, pcre2_match_data *md, const uint8_t *s, size_t n)
{
    return pcre2_match(c, s, n, 0, 0, md, NULL) > 0;
}

static size_t utf8_put(uint32_t c, uint8_t *o)
{
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = (uint8_t)(0xC0 | c >> 6); o[1] = (uint8_t)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12); o[1] = (uint8_t)(0x80 | (c >> 6 & 63)); o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18); o[1] = (uint8_t)(0x80 | (c >> 12 & 63));
    o[2] = (uint8_t)(0x80 | (c >> 6 & 63)); o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

/* For each class of the K3 pattern: the translated class matches a code
 * point iff the code point is in the union and not Script=Han. */
static void check_intersection(const char *rust_class, const char *union_class)
{
    char *tr = NULL, anchored[512];
    shoal_err err;
    assert_int_equal(tokenizer_pattern_translate(rust_class, &tr, &err), 0);
    snprintf(anchored, sizeof anchored, "^%s$", tr);
    pcre2_code *cls = compile(anchored), *uni = compile(union_class), *han = compile("^\\p{sc:Han}$");
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    size_t in_class = 0, han_excluded = 0;
    for (uint32_t c = 0; c <= 0x10FFFF; c++) {
        uint8_t b[4];
        if (c >= 0xD800 && c <= 0xDFFF)
            continue;
        size_t n = utf8_put(c, b);
        int u = matches(uni, md, b, n), h = matches(han, md, b, n), got = matches(cls, md, b, n);
        if (got != (u && !h))
            fail_msg("U+%04X: class %d, union %d, Han %d (%s)", c, got, u, h, tr);
        in_class += got;
        han_excluded += u && h;
    }
    assert_true(in_class > 10000);        /* the sets are not trivially empty */
    assert_true(han_excluded > 5);        /* and Han letters were there to remove */
    pcre2_match_data_free(md);
    pcre2_code_free(cls);
    pcre2_code_free(uni);
    pcre2_code_free(han);
    free(tr);
}

static void test_intersection_all_code_points(void **state)
{
    (void)state;
    check_intersection("[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]",
                       "^[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]$");
    check_intersection("[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]", "^[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]$");
}

static void test_pattern_translate(void **state)
{
    char *o = NULL;
    shoal_err err;
    (void)state;
    assert_int_equal(tokenizer_pattern_translate("[\\p{L}&&[^\\p{Han}]]", &o, &err), 0);
    assert_string_equal(o, "(?:(?![\\p{sc:Han}])[\\p{L}])");
    free(o);
    assert_int_equal(tokenizer_pattern_translate("[a-z&&[aeiou]]x", &o, &err), 0);
    assert_string_equal(o, "(?:(?=[aeiou])[a-z])x");
    free(o);
    assert_int_equal(tokenizer_pattern_translate("[^a-z&&[^aeiou]]", &o, &err), 0);
    assert_string_equal(o, "(?:(?!(?![aeiou])[a-z])(?s:.))");
    free(o);
    assert_int_equal(tokenizer_pattern_translate("\\p{Greek}+\\P{Han}\\p{L}\\p{sc:Latin}[\\]&]", &o, &err), 0);
    assert_string_equal(o, "\\p{sc:Greek}+\\P{sc:Han}\\p{L}\\p{sc:Latin}[\\]&]");
    free(o);
    assert_int_equal(tokenizer_pattern_translate("[a&&b", &o, &err), SHOAL_EINVAL);
    assert_null(o);
    /* The named K3 pattern carries the rewrite; behaviour of a negated
     * intersection: [^a-z&&[^aeiou]] = not a consonant. */
    assert_int_equal(tokenizer_pattern_resolve("k3", &o, &err), 0);
    assert_non_null(strstr(o, "(?:(?![\\p{sc:Han}])[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])*"));
    assert_null(strstr(o, "&&"));
    free(o);
    {
        char *p = NULL;
        assert_int_equal(tokenizer_pattern_translate("^[^a-z&&[^aeiou]]$", &p, &err), 0);
        pcre2_code *c = compile(p);
        pcre2_match_data *md = pcre2_match_data_create(4, NULL);
        assert_true(matches(c, md, (const uint8_t *)"a", 1));
        assert_true(matches(c, md, (const uint8_t *)"Q", 1));
        assert_true(matches(c, md, (const uint8_t *)"\n", 1));
        assert_false(matches(c, md, (const uint8_t *)"b", 1));
        pcre2_match_data_free(md);
        pcre2_code_free(c);
        free(p);
    }
}

/* Pre-tokenizer behaviour of the K3 pattern, seen through a vocabulary
 * whose entries are the expected pieces. */
static void test_k3_pieces(void **state)
{
    static const char *const extra[] = {
        "\xE4\xB8\xAD\xE6\x96\x87",        /* 256 中文 */
        "Hello",                           /* 257 */
        " world's",                        /* 258: the contraction stays on */
        "DON'T",                           /* 259: upper case, (?i:'t) */
        "123",                             /* 260 */
        "\n\n",                            /* 261 */
        " \xE3\x80\xBC",                   /* 262 " 〼" (Common script, Han extension) */
        "\xE3\x80\x85\xE3\x80\xBB",        /* 263 々〻 (Lm, Script=Han) */
        "don't",                           /* 264 */
        " \xEF\xBB\xBF",                   /* 265 " U+FEFF": not \s in tiktoken */
        "\xC2\x85",                        /* 266 U+0085: \s in tiktoken (not in JS) */
        "\xC2\x85y",                       /* 267 */
        "a\xE3\x80\xAA",                    /* 268 a + U+302A (Mn, Script=Inherited) */
        NULL,
    };
    tokenizer *t = make_tok(extra, "k3");
    tokenizer_ids ids = { 0 };
    (void)state;
#define ENC(s) encode(t, s, sizeof s - 1, 0, &ids)
    ENC("\xE4\xB8\xAD\xE6\x96\x87Hello world's");   /* Han run, then letters */
    assert_ids(&ids, (uint32_t[]){ 256, 257, 258 }, 3);
    ENC("1234");                                     /* \p{N}{1,3} */
    assert_ids(&ids, (uint32_t[]){ 260, '4' }, 2);
    ENC("\n\nHello");
    assert_ids(&ids, (uint32_t[]){ 261, 257 }, 2);
    ENC("a \xE3\x80\xBC");                           /* 〼 is Lo, Script=Common: a letter */
    assert_ids(&ids, (uint32_t[]){ 'a', 262 }, 2);
    ENC("\xE3\x80\x85\xE3\x80\xBB");
    assert_ids(&ids, (uint32_t[]){ 263 }, 1);
    ENC("DON'T");                                    /* (?i:'t) keeps the contraction on "DON" */
    assert_ids(&ids, (uint32_t[]){ 259 }, 1);
    ENC("a\xE3\x80\xAA");                           /* a mark Han only by extension stays */
    assert_ids(&ids, (uint32_t[]){ 268 }, 1);
    ENC("don't");
    assert_ids(&ids, (uint32_t[]){ 264 }, 1);
    ENC("x \xEF\xBB\xBFy");                         /* JS's \s would give " ", "\uFEFFy" */
    assert_ids(&ids, (uint32_t[]){ 'x', 265, 'y' }, 3);
    ENC("x\xC2\x85\xC2\x85y");                       /* \s+(?!\S) backs off one NEL */
    assert_ids(&ids, (uint32_t[]){ 'x', 266, 267 }, 3);
#undef ENC
    tokenizer_ids_free(&ids);
    tokenizer_free(t);
}

/* ---- slicing and huge inputs ---------------------------------------------------------- */

static void test_slicing_huge(void **state)
{
    /* "aa" 256 then "aaa" 257 (lower pair rank than "aa" wins once formed):
     * runs of 'a' merge into groups of three, so a cut shows in the ids. */
    static const char *const extra[] = { "aaa", "aa", "  ", "    ", "        ", " a", NULL };
    tokenizer *t = make_tok(extra, "k3");
    tokenizer_ids ids = { 0 };
    shoal_buf out;
    shoal_err err;
    (void)state;

    /* 25,002 'a': cut after 25,000 (Kimi's run limit), 25000 = 3*8333 + 1. */
    size_t n = 25002;
    char *s = malloc(1100000);
    assert_non_null(s);
    memset(s, 'a', n);
    encode(t, s, n, 0, &ids);
    assert_int_equal(ids.n, 8333 + 1 + 1);
    for (size_t i = 0; i < 8333; i++)
        assert_int_equal(ids.v[i], 256);
    assert_int_equal(ids.v[8333], 'a');
    assert_int_equal(ids.v[8334], 257);
    /* 25,000 exactly: no cut. */
    encode(t, s, 24999, 0, &ids);
    assert_int_equal(ids.n, 8333);

    /* 400,000-character chunks: "a a a ..." has no long runs; the chunk
     * boundary falls between ' ' and 'a', so " a" (261) cannot form there. */
    n = 800001;
    for (size_t i = 0; i < n; i++)
        s[i] = (i % 2) ? ' ' : 'a';
    encode(t, s, n, 0, &ids);
    size_t lone_space = 0;
    for (size_t i = 0; i < ids.n; i++)
        lone_space += ids.v[i] == ' ';
    assert_int_equal(lone_space, 2);                 /* at the boundary and at the end */
    assert_int_equal(ids.n, 1 + 199999 + 1 + 1 + 200000 + 1);

    /* 1 MB of spaces then text: bounded time and memory, exact round trip. */
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    n = 1000000;
    memset(s, ' ', n);
    memcpy(s + n, "then text", 9);
    n += 9;
    encode(t, s, n, 0, &ids);
    double dt = (double)clock() / CLOCKS_PER_SEC - t0;
    assert_true(dt < 20.0);
    assert_true(ids.n < n / 4);                      /* merges happened: 8-space tokens */
    shoal_buf_init(&out, 0);
    assert_int_equal(tokenizer_decode(t, ids.v, ids.n, 0, &out, &err), 0);
    assert_int_equal(out.len, n);
    assert_memory_equal(out.data, s, n);
    shoal_buf_free(&out);
    free(s);
    tokenizer_ids_free(&ids);
    tokenizer_free(t);
}

/* Bytes that are not UTF-8 survive a round trip; valid parts still use
 * the regex and the merges. */
static void test_invalid_utf8_input(void **state)
{
    static const char *const extra[] = { "Hello", " world", "\xFF\xFE", NULL };
    static const char ALPHA[] = "Hello world \xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\n";
    tokenizer *t = make_tok(extra, "k3");
    tokenizer_ids ids = { 0 };
    shoal_buf out;
    shoal_err err;
    (void)state;

    encode(t, "Hello\xFF\xFE world\xC3", 14, 0, &ids);
    assert_ids(&ids, (uint32_t[]){ 256, 258, 257, 0xC3 }, 4);
    shoal_buf_init(&out, 0);
    for (int iter = 0; iter < 3000; iter++) {
        uint8_t buf[80];
        size_t n = rnd(80);
        for (size_t i = 0; i < n; i++)
            buf[i] = rnd(3) ? (uint8_t)ALPHA[rnd(sizeof ALPHA - 1)] : (uint8_t)rnd(256);
        encode(t, (const char *)buf, n, 0, &ids);
        shoal_buf_reset(&out);
        assert_int_equal(tokenizer_decode(t, ids.v, ids.n, TOKENIZER_DECODE_RAW, &out, &err), 0);
        assert_int_equal(out.len, n);
        if (n)
            assert_memory_equal(out.data, buf, n);
    }
    shoal_buf_free(&out);
    tokenizer_ids_free(&ids);
    tokenizer_free(t);
}

/* One tokenizer shared by threads: each encode borrows its own scratch. */
struct thread_arg {
    const tokenizer *t;
    const char      *text;
    size_t           len;
    tokenizer_ids    want;
    int              bad;
};

static void *thread_encode(void *p)
{
    struct thread_arg *a = p;
    tokenizer_ids ids = { 0 };
    for (int i = 0; i < 200 && !a->bad; i++) {
        ids.n = 0;
        if (tokenizer_encode(a->t, a->text, a->len, 0, &ids, NULL) || ids.n != a->want.n ||
            memcmp(ids.v, a->want.v, ids.n * sizeof ids.v[0]))
            a->bad = 1;
    }
    tokenizer_ids_free(&ids);
    return NULL;
}

static void test_threads(void **state)
{
    static const char *const extra[] = { "th", "the", " the", "he", "  ", "    ", "in", "ing", NULL };
    static const char *const texts[] = {
        "the thing is  that   the thinking  goes on", "\xE4\xB8\xAD\xE6\x96\x87 the end \xF0\x9F\x98\x80",
        "thththththththththththththththththththththththththththththththththththththththththththththththththththththththththththththththththththththth",
        "in in in ing ing     the",
    };
    tokenizer *t = make_tok(extra, "k3");
    struct thread_arg args[4];
    pthread_t th[4];
    (void)state;
    tokenizer_set_heap_min(t, 64);
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){ t, texts[i], strlen(texts[i]), { 0 }, 0 };
        encode(t, texts[i], args[i].len, 0, &args[i].want);
        assert_true(args[i].want.n > 0);
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, thread_encode, &args[i]), 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_false(args[i].bad);
        tokenizer_ids_free(&args[i].want);
    }
    tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_bpe_known_merges),
        cmocka_unit_test(test_bpe_heap_linear_oracle),
        cmocka_unit_test(test_specials),
        cmocka_unit_test(test_lossy_utf8),
        cmocka_unit_test(test_stream_split_emoji),
        cmocka_unit_test(test_pattern_translate),
        cmocka_unit_test(test_intersection_all_code_points),
        cmocka_unit_test(test_k3_pieces),
        cmocka_unit_test(test_slicing_huge),
        cmocka_unit_test(test_invalid_utf8_input),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
