/* tok_decode.c — ids back to bytes and text: lossy UTF-8 and the streaming
 * detokenizer.
 *
 * Owns: UTF-8 validation, the replacement policy, tokenizer_stream.  Does
 * not own the vocabulary (tok_vocab.c).
 *
 * Replacement policy: each *maximal subpart* of an ill-formed sequence
 * becomes one U+FFFD (Unicode 15, §3.9 "U+FFFD Substitution of Maximal
 * Subparts"), which is what Python's errors="replace" and WHATWG's
 * TextDecoder do, so text we print equals what the Python tokenizer would
 * give.  E.g. F0 9F 98 (a truncated emoji) -> one U+FFFD; ED A0 80 (a
 * surrogate) -> three; C0 AF -> two.
 */
#include "engine/text/text_int.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t REPLACEMENT[3] = { 0xEF, 0xBF, 0xBD };

/* Expected length of a sequence led by c (0 for a byte that cannot lead),
 * and the allowed range of the first continuation byte. */
static size_t utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return 2;
    if (c == 0xE0) { *lo = 0xA0; return 3; }
    if (c == 0xED) { *hi = 0x9F; return 3; }
    if (c < 0xF0) return 3;
    if (c == 0xF0) { *lo = 0x90; return 4; }
    if (c < 0xF4) return 4;
    if (c == 0xF4) { *hi = 0x8F; return 4; }
    return 0;
}

/* How many bytes of p[0..n) form a well-formed prefix of one character
 * (at most its full length); *need is that full length (0: not a lead). */
static size_t utf8_prefix(const uint8_t *p, size_t n, size_t *need)
{
    uint8_t lo, hi;
    size_t k = 1;
    *need = utf8_lead(p[0], &lo, &hi);
    if (*need <= 1)
        return *need ? 1 : 0;
    if (k < n && k < *need && p[k] >= lo && p[k] <= hi) {
        k++;
        while (k < n && k < *need && p[k] >= 0x80 && p[k] <= 0xBF)
            k++;
    }
    return k;
}

size_t tok_utf8_valid_len(const uint8_t *p, size_t n)
{
    size_t need, k = utf8_prefix(p, n, &need);
    return need && k == need ? k : 0;
}

int tokenizer_utf8_lossy(const uint8_t *p, size_t n, shoal_buf *out)
{
    size_t i = 0;
    int rc = 0;
    while (i < n && rc == 0) {
        size_t start = i, need, k;
        while (i < n && p[i] < 0x80)
            i++;
        while (i < n && (k = tok_utf8_valid_len(p + i, n - i)))
            i += k;
        if (i > start) {
            rc = shoal_buf_append(out, p + start, i - start);
            continue;
        }
        k = utf8_prefix(p + i, n - i, &need);
        rc = shoal_buf_append(out, REPLACEMENT, sizeof REPLACEMENT);
        i += k ? k : 1;
    }
    return rc;
}

/* Fetch bytes of all ids first so an unknown id changes nothing. */
int tokenizer_decode(const tokenizer *t, const uint32_t *ids, size_t n, int flags,
                     shoal_buf *out, shoal_err *err)
{
    shoal_buf raw;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p;
        size_t len;
        if (tokenizer_token_bytes(t, ids[i], &p, &len))
            return shoal_err_set(err, SHOAL_ERANGE, "token id %u (position %zu) is not in the vocabulary",
                                 ids[i], i);
    }
    shoal_buf_init(&raw, 0);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const uint8_t *p;
        size_t len;
        tokenizer_token_bytes(t, ids[i], &p, &len);
        rc = shoal_buf_append((flags & TOKENIZER_DECODE_RAW) ? out : &raw, p, len);
    }
    if (rc == 0 && !(flags & TOKENIZER_DECODE_RAW))
        rc = tokenizer_utf8_lossy(raw.data, raw.len, out);
    shoal_buf_free(&raw);
    if (rc)
        shoal_err_set(err, rc, "decode: %s", shoal_strerror(rc));
    return rc;
}

/* ---- streaming --------------------------------------------------------------- */

struct tokenizer_stream {
    const tokenizer *t;
    uint8_t  pending[4];
    size_t   n_pending;
    shoal_buf tmp;
};

tokenizer_stream *tokenizer_stream_new(const tokenizer *t)
{
    tokenizer_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->t = t;
    shoal_buf_init(&s->tmp, 0);
    return s;
}

void tokenizer_stream_free(tokenizer_stream *s)
{
    if (!s)
        return;
    shoal_buf_free(&s->tmp);
    free(s);
}

size_t tokenizer_stream_pending(const tokenizer_stream *s)
{
    return s->n_pending;
}

/* Start of an incomplete but so far well-formed character at the end of
 * p[0..n), or n if there is none.  Such a tail starts with a lead byte, so
 * no earlier sequence reaches into it: decoding p up to the tail now and
 * the tail later gives what decoding everything at once gives. */
static size_t incomplete_tail(const uint8_t *p, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        size_t j = n - back, need, k;
        if (p[j] >= 0x80 && p[j] < 0xC0)
            continue;   /* a continuation byte: look further back */
        k = utf8_prefix(p + j, back, &need);
        return need > back && k == back ? j : n;
    }
    return n;
}

int tokenizer_stream_push_bytes(tokenizer_stream *s, const uint8_t *p, size_t n, shoal_buf *out)
{
    const uint8_t *q = p;
    size_t m = n, tail;
    int rc;

    if (n == 0)
        return 0;
    if (s->n_pending) {
        shoal_buf_reset(&s->tmp);
        if ((rc = shoal_buf_append(&s->tmp, s->pending, s->n_pending)) ||
            (rc = shoal_buf_append(&s->tmp, p, n)))
            return rc;
        q = s->tmp.data;
        m = s->tmp.len;
    }
    tail = incomplete_tail(q, m);
    if ((rc = tokenizer_utf8_lossy(q, tail, out)))
        return rc;
    memcpy(s->pending, q + tail, m - tail);
    s->n_pending = m - tail;
    return 0;
}

int tokenizer_stream_push(tokenizer_stream *s, uint32_t id, shoal_buf *out, shoal_err *err)
{
    const uint8_t *p;
    size_t n;
    int rc;
    if (!s->t || tokenizer_token_bytes(s->t, id, &p, &n))
        return shoal_err_set(err, SHOAL_ERANGE, "token id %u is not in the vocabulary", id);
    if ((rc = tokenizer_stream_push_bytes(s, p, n, out)))
        shoal_err_set(err, rc, "stream: %s", shoal_strerror(rc));
    return rc;
}

int tokenizer_stream_flush(tokenizer_stream *s, shoal_buf *out)
{
    int rc = tokenizer_utf8_lossy(s->pending, s->n_pending, out);
    s->n_pending = 0;
    return rc;
}
