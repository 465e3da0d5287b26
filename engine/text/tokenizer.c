/* tokenizer.c — encoding: slicing, specials, the regex split, and the
 * per-call scratch pool.
 *
 * Owns: tokenizer_encode and the pieces it calls in order (see the steps in
 * text.h), tokenizer_ids, tokenizer_free.  Does not own loading
 * (tok_vocab.c), the pattern (tok_pattern.c), the merge loop (tok_bpe.c)
 * or decoding (tok_decode.c).
 */
#include "engine/text/text_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define JIT_STACK_MIN  (32 * 1024)
#define JIT_STACK_MAX  (4 * 1024 * 1024)

struct tok_scratch {
    pcre2_match_data   *md;
    pcre2_match_context *mc;
    pcre2_jit_stack    *js;
    uint32_t           *a, *b, *c;   /* BPE arrays, cap + 1 each */
    uint64_t           *heap;        /* 3 * cap + 4 */
    size_t              cap;
    tok_scratch        *next;
};

/* ---- ids ----------------------------------------------------------------- */

void tokenizer_ids_free(tokenizer_ids *ids)
{
    if (!ids)
        return;
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

int tokenizer_ids_push(tokenizer_ids *ids, uint32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        uint32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v)
            return SHOAL_ENOMEM;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

/* ---- scratch pool ---------------------------------------------------------- */

static void scratch_free(tok_scratch *s)
{
    if (!s)
        return;
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    pcre2_jit_stack_free(s->js);
    free(s->a);
    free(s->b);
    free(s->c);
    free(s->heap);
    free(s);
}

static tok_scratch *scratch_get(tokenizer *t)
{
    tok_scratch *s;
    pthread_mutex_lock(&t->pool_mu);
    if ((s = t->pool))
        t->pool = s->next;
    pthread_mutex_unlock(&t->pool_mu);
    if (s)
        return s;
    if (!(s = calloc(1, sizeof *s)))
        return NULL;
    s->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    s->mc = pcre2_match_context_create(NULL);
    if (t->jit) {
        s->js = pcre2_jit_stack_create(JIT_STACK_MIN, JIT_STACK_MAX, NULL);
        if (s->js && s->mc)
            pcre2_jit_stack_assign(s->mc, NULL, s->js);
    }
    if (!s->md || !s->mc || (t->jit && !s->js)) {
        scratch_free(s);
        return NULL;
    }
    return s;
}

static void scratch_put(tokenizer *t, tok_scratch *s)
{
    pthread_mutex_lock(&t->pool_mu);
    s->next = t->pool;
    t->pool = s;
    pthread_mutex_unlock(&t->pool_mu);
}

int tok_scratch_bpe_arrays(tok_scratch *s, size_t n, uint32_t **a, uint32_t **b, uint32_t **c,
                           uint64_t **heap)
{
    if (n > s->cap) {
        size_t cap = n < 256 ? 256 : n;
        uint32_t *na = realloc(s->a, (cap + 1) * sizeof *na);
        if (na)
            s->a = na;
        uint32_t *nb = realloc(s->b, (cap + 1) * sizeof *nb);
        if (nb)
            s->b = nb;
        uint32_t *nc = realloc(s->c, (cap + 1) * sizeof *nc);
        if (nc)
            s->c = nc;
        uint64_t *nh = realloc(s->heap, (3 * cap + 4) * sizeof *nh);
        if (nh)
            s->heap = nh;
        if (!na || !nb || !nc || !nh)
            return SHOAL_ENOMEM;
        s->cap = cap;
    }
    *a = s->a;
    *b = s->b;
    *c = s->c;
    *heap = s->heap;
    return 0;
}

void tokenizer_free(tokenizer *t)
{
    if (!t)
        return;
    while (t->pool) {
        tok_scratch *s = t->pool;
        t->pool = s->next;
        scratch_free(s);
    }
    pthread_mutex_destroy(&t->pool_mu);
    tok_vocab_free(t);
    free(t);
}

/* ---- one encode call ------------------------------------------------------- */

typedef struct enc {
    const tokenizer *t;
    tok_scratch     *s;
    int              flags;
    tokenizer_ids   *out;
    shoal_err       *err;
} enc;

static int enc_piece(enc *e, const uint8_t *p, size_t n)
{
    uint32_t r = tok_rank_of(e->t, p, n);
    int rc;
    if (r != TOK_NONE)
        return tokenizer_ids_push(e->out, r) ? shoal_err_set(e->err, SHOAL_ENOMEM, "out of memory") : 0;
    if ((rc = tok_bpe(e->t, e->s, p, n, e->out)))
        return shoal_err_set(e->err, rc, "out of memory in BPE (piece of %zu bytes)", n);
    return 0;
}

/* Split a valid UTF-8 segment with the regex and encode each match.
 * Text between matches is dropped, as tiktoken's find_iter drops it. */
static int enc_regex(enc *e, const uint8_t *p, size_t n)
{
    PCRE2_SIZE pos = 0;
    while (pos < n) {
        int rc = pcre2_match(e->t->re, p, n, pos, PCRE2_NO_UTF_CHECK, e->s->md, e->s->mc);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)   /* fall back to the interpreter */
            rc = pcre2_match(e->t->re, p, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->s->md, e->s->mc);
        if (rc == PCRE2_ERROR_NOMATCH)
            return 0;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return shoal_err_set(e->err, SHOAL_EINTERNAL, "regex match failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->s->md);
        if (ov[1] <= ov[0]) {
            /* Empty match (only a user pattern can produce one): step one
             * character, as Rust's find_iter does. */
            size_t l;
            pos = ov[0] + (ov[0] < n ? (tok_utf8_get(p + ov[0], &l), l) : 1);
            continue;
        }
        if ((rc = enc_piece(e, p + ov[0], ov[1] - ov[0])))
            return rc;
        pos = ov[1];
    }
    return 0;
}

/* Longest special spelled at p[0..n), or NULL. */
static const tok_special *special_at(const tokenizer *t, const uint8_t *p, size_t n)
{
    for (uint32_t i = t->first_start[p[0]]; i < t->first_start[p[0] + 1]; i++) {
        const tok_special *sp = &t->specials[t->by_first[i]];
        if (sp->len <= n && memcmp(sp->text, p, sp->len) == 0)
            return sp;
    }
    return NULL;
}

/* One slice: specials first (if allowed), then the regex between them. */
static int enc_slice(enc *e, const uint8_t *p, size_t n)
{
    const tokenizer *t = e->t;
    size_t seg = 0;
    int rc;

    if ((e->flags & TOKENIZER_ALLOW_SPECIALS) && t->n_specials) {
        for (size_t i = 0; i < n; i++) {
            const tok_special *sp;
            if (t->first_start[p[i]] == t->first_start[p[i] + 1] || !(sp = special_at(t, p + i, n - i)))
                continue;
            if ((rc = enc_regex(e, p + seg, i - seg)))
                return rc;
            if (tokenizer_ids_push(e->out, sp->id))
                return shoal_err_set(e->err, SHOAL_ENOMEM, "out of memory");
            i += sp->len - 1;
            seg = i + 1;
        }
    }
    return enc_regex(e, p + seg, n - seg);
}

/* Python's str.isspace(): bidirectional class WS, B or S, or category Zs. */
static int py_isspace(uint32_t c)
{
    if (c < 0x80)
        return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Step 1 of text.h part 1 on a valid UTF-8 run: tokenization_kimi.py cuts
 * the text into 400,000-character chunks and each chunk where a run of
 * same-class characters would pass 25,000 (its
 * _split_whitespaces_or_nonwhitespaces), then encodes each part alone. */
static int enc_valid(enc *e, const uint8_t *p, size_t n)
{
    size_t slice = 0, chunk_chars = 0, run = 0, i = 0;
    int cur_space = 0, rc;

    if (n <= TOKENIZER_RUN_CHARS || (e->flags & TOKENIZER_NO_SLICE))   /* bytes >= chars */
        return enc_slice(e, p, n);
    while (i < n) {
        size_t l;
        uint32_t c = tok_utf8_get(p + i, &l);
        int sp = py_isspace(c);
        if (chunk_chars == TOKENIZER_SLICE_CHARS) {
            if ((rc = enc_slice(e, p + slice, i - slice)))
                return rc;
            slice = i;
            chunk_chars = 0;
        }
        if (chunk_chars == 0) {
            cur_space = sp;
            run = 0;
        }
        if (cur_space != sp) {
            cur_space = sp;
            run = 1;
        } else if (++run > TOKENIZER_RUN_CHARS) {
            if ((rc = enc_slice(e, p + slice, i - slice)))
                return rc;
            slice = i;
            run = 1;
        }
        chunk_chars++;
        i += l;
    }
    return enc_slice(e, p + slice, n - slice);
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int flags,
                     tokenizer_ids *out, shoal_err *err)
{
    const uint8_t *p = (const uint8_t *)text;
    enc e = { t, NULL, flags, out, err };
    size_t i = 0, run = 0;
    int rc = 0;

    if (len == 0)
        return 0;
    /* The pool is the only mutable part of a shared tokenizer. */
    if (!(e.s = scratch_get((tokenizer *)t)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for tokenizer scratch");
    /* Valid runs go through the regex; each maximal invalid run is BPE'd
     * as one piece of raw bytes so nothing is lost. */
    while (i < len && rc == 0) {
        size_t l;
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        if ((l = tok_utf8_valid_len(p + i, len - i))) {
            i += l;
            continue;
        }
        size_t bad = i;
        while (i < len && p[i] >= 0x80 && !tok_utf8_valid_len(p + i, len - i))
            i++;
        if ((rc = enc_valid(&e, p + run, bad - run)) == 0 && (rc = tok_bpe(t, e.s, p + bad, i - bad, out)))
            shoal_err_set(err, rc, "out of memory in BPE");
        run = i;
    }
    if (rc == 0)
        rc = enc_valid(&e, p + run, len - run);
    scratch_put((tokenizer *)t, e.s);
    return rc;
}
