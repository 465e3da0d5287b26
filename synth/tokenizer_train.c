/* tokenizer_train.c — the synthetic tiktoken.model.
 *
 * Owns: a byte-level BPE trained on the embedded corpus (corpus.c) and the
 * file format, one line per rank: base64(bytes) SP rank.
 *
 *   ranks 0..255        the single bytes 0..255, in byte order
 *   ranks 256..767      greedy merges: at each step the adjacent pair that
 *                       occurs most often in the corpus pieces wins; ties go
 *                       to the pair whose left byte string is smallest
 *                       (memcmp order, a prefix before its extensions), then
 *                       the smallest right byte string
 *
 * The corpus is first split into pieces by an ASCII rendering of K3's
 * pre-tokenizer regex (k3.md §4), so no merge crosses a piece boundary that
 * the encoder would never cross.  A merge whose bytes already have a rank
 * (the same string reached by another split) is applied without a new rank,
 * so every rank's byte string is unique, as tiktoken requires.
 *
 *   ranks 768..base-1   (k3 only: base = 163,584, K3's own) inert padding:
 *                       rank 768+k is the 3 bytes 0xF8+(k>>16), (k>>8)&255,
 *                       k&255.  Bytes 0xF8..0xFF never occur in UTF-8 and
 *                       no trained merge holds them, so no text encodes to
 *                       a padding rank; they make the vocabulary K3's size,
 *                       so the specials sit at K3's ids (163584 = [BOS]).
 *
 * Tiny and slice (base 768) have no padding.  Does not own encoding text
 * (the engine's tokenizer does).
 */
#include "synth/synth_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct tok { const uint8_t *p; size_t n; } tok;          /* bytes of a rank */
typedef struct piece { const uint8_t *p; size_t n; uint32_t *ids; size_t len; uint64_t freq; } piece;
typedef struct pair { uint32_t a, b; uint64_t count; } pair;

/* ---- ASCII pre-tokenizer -------------------------------------------------- */

static int is_upper(int c) { return c >= 'A' && c <= 'Z'; }
static int is_lower(int c) { return c >= 'a' && c <= 'z'; }
static int is_letter(int c) { return is_upper(c) || is_lower(c); }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_space(int c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static int is_nl(int c) { return c == '\r' || c == '\n'; }

/* Length of a contraction ('s 't 're 've 'm 'll 'd, any case) at s, or 0. */
static size_t contraction(const char *s, size_t left)
{
    static const char *const forms[] = { "s", "t", "re", "ve", "m", "ll", "d" };
    if (left < 2 || s[0] != '\'')
        return 0;
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        size_t k = strlen(forms[i]);
        if (left < 1 + k)
            continue;
        size_t j = 0;
        while (j < k && (s[1 + j] | 0x20) == forms[i][j])
            j++;
        if (j == k)
            return 1 + k;
    }
    return 0;
}

/* End of the letter alternatives at pos (0 if neither matches). */
static size_t letters(const char *s, size_t len, size_t pos)
{
    size_t p = pos;
    if (!is_nl(s[p]) && !is_letter(s[p]) && !is_digit(s[p]))
        p++;                                   /* [^\r\n\p{L}\p{N}]? */
    size_t u = p;
    while (u < len && is_upper(s[u]))
        u++;
    size_t l = u;
    while (l < len && is_lower(s[l]))
        l++;
    if (l > u || u > p)                        /* Lu* Ll+  |  Lu+ Ll* */
        return l + contraction(s + l, len - l);
    return 0;
}

/* One piece starting at pos; returns its end. */
static size_t pretok_next(const char *s, size_t len, size_t pos)
{
    size_t e;
    if ((e = letters(s, len, pos)) > pos)
        return e;
    if (is_digit(s[pos])) {                    /* \p{N}{1,3} */
        e = pos;
        while (e < len && e < pos + 3 && is_digit(s[e]))
            e++;
        return e;
    }
    e = pos + (s[pos] == ' ');                 /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t f = e;
    while (f < len && !is_space(s[f]) && !is_letter(s[f]) && !is_digit(s[f]))
        f++;
    if (f > e) {
        while (f < len && is_nl(s[f]))
            f++;
        return f;
    }
    e = pos;                                   /* whitespace */
    while (e < len && is_space(s[e]))
        e++;
    for (size_t k = e; k > pos; k--)           /* \s*[\r\n]+ */
        if (is_nl(s[k - 1]))
            return k;
    if (e == len || e - pos == 1)              /* \s+(?!\S), else \s+ */
        return e;
    return e - 1;
}

/* ---- training -------------------------------------------------------------- */

static int tok_cmp(tok x, tok y)
{
    size_t n = x.n < y.n ? x.n : y.n;
    int c = memcmp(x.p, y.p, n);
    return c ? c : (x.n > y.n) - (x.n < y.n);
}

static int piece_cmp(const void *a, const void *b)
{
    const piece *x = a, *y = b;
    return tok_cmp((tok){ x->p, x->n }, (tok){ y->p, y->n });
}

static int pair_cmp(const void *a, const void *b)
{
    const pair *x = a, *y = b;
    if (x->a != y->a)
        return x->a < y->a ? -1 : 1;
    return (x->b > y->b) - (x->b < y->b);
}

/* The unique corpus pieces with their counts, each as a list of byte ids. */
static int pieces_make(piece **out, size_t *count)
{
    const char *s = synth_corpus;
    size_t len = strlen(s), n = 0, u = 0;
    piece *ps = calloc(len + 1, sizeof *ps);

    if (!ps)
        return SHOAL_ENOMEM;
    for (size_t pos = 0; pos < len;) {
        size_t e = pretok_next(s, len, pos);
        if (e <= pos)
            e = pos + 1;
        ps[n++] = (piece){ (const uint8_t *)s + pos, e - pos, NULL, 0, 1 };
        pos = e;
    }
    qsort(ps, n, sizeof *ps, piece_cmp);
    for (size_t i = 0; i < n; i++) {
        if (u > 0 && piece_cmp(&ps[u - 1], &ps[i]) == 0) {
            ps[u - 1].freq++;
            continue;
        }
        ps[u++] = ps[i];
    }
    for (size_t i = 0; i < u; i++) {
        if (!(ps[i].ids = malloc(ps[i].n * sizeof *ps[i].ids))) {
            for (size_t j = 0; j < i; j++)
                free(ps[j].ids);
            free(ps);
            return SHOAL_ENOMEM;
        }
        for (size_t k = 0; k < ps[i].n; k++)
            ps[i].ids[k] = ps[i].p[k];
        ps[i].len = ps[i].n;
    }
    *out = ps;
    *count = u;
    return 0;
}

/* The most frequent adjacent pair (ties: smallest byte strings); 0 if none. */
static int best_pair(const piece *ps, size_t np, const tok *vocab, pair *scratch,
                     size_t cap, pair *best)
{
    size_t n = 0, i = 0;
    for (size_t k = 0; k < np; k++)
        for (size_t j = 0; j + 1 < ps[k].len && n < cap; j++)
            scratch[n++] = (pair){ ps[k].ids[j], ps[k].ids[j + 1], ps[k].freq };
    if (n == 0)
        return 0;
    qsort(scratch, n, sizeof *scratch, pair_cmp);
    best->count = 0;
    while (i < n) {
        pair p = scratch[i];
        for (i++; i < n && scratch[i].a == p.a && scratch[i].b == p.b; i++)
            p.count += scratch[i].count;
        int c = tok_cmp(vocab[p.a], vocab[best->a]);
        if (p.count > best->count ||
            (p.count == best->count &&
             (c < 0 || (c == 0 && tok_cmp(vocab[p.b], vocab[best->b]) < 0))))
            *best = p;
    }
    return 1;
}

static void merge_apply(piece *ps, size_t np, pair p, uint32_t id)
{
    for (size_t k = 0; k < np; k++) {
        size_t w = 0;
        for (size_t j = 0; j < ps[k].len; j++) {
            if (j + 1 < ps[k].len && ps[k].ids[j] == p.a && ps[k].ids[j + 1] == p.b) {
                ps[k].ids[w++] = id;
                j++;
            } else {
                ps[k].ids[w++] = ps[k].ids[j];
            }
        }
        ps[k].len = w;
    }
}

/* Fill vocab[256..ranks) with merged byte strings (heap copies the caller
 * frees, even on failure). */
static int train(tok *vocab, size_t ranks, shoal_err *err)
{
    piece *ps = NULL;
    size_t np = 0, total = 0, have = 256;
    pair *scratch = NULL;
    int rc = pieces_make(&ps, &np);

    if (rc)
        return shoal_err_set(err, rc, "out of memory training the tokenizer");
    for (size_t k = 0; k < np; k++)
        total += ps[k].n;
    if (!(scratch = malloc((total + 1) * sizeof *scratch))) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory training the tokenizer");
        goto out;
    }
    while (have < ranks) {
        pair p = { 0, 0, 0 };
        if (!best_pair(ps, np, vocab, scratch, total, &p)) {
            rc = shoal_err_set(err, SHOAL_EINTERNAL,
                               "the corpus allows only %zu merges, %zu wanted", have - 256,
                               ranks - 256);
            goto out;
        }
        uint8_t *cat = malloc(vocab[p.a].n + vocab[p.b].n);
        if (!cat) {
            rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory training the tokenizer");
            goto out;
        }
        memcpy(cat, vocab[p.a].p, vocab[p.a].n);
        memcpy(cat + vocab[p.a].n, vocab[p.b].p, vocab[p.b].n);
        tok m = { cat, vocab[p.a].n + vocab[p.b].n };
        uint32_t id = (uint32_t)have;
        for (size_t r = 0; r < have; r++)
            if (tok_cmp(vocab[r], m) == 0)
                id = (uint32_t)r;
        if (id == have)
            vocab[have++] = m;      /* vocab owns cat from here on */
        else
            free(cat);
        merge_apply(ps, np, p, id);
    }
out:
    for (size_t k = 0; k < np; k++)
        free(ps[k].ids);
    free(ps);
    free(scratch);
    return rc;
}

static int b64_append(shoal_buf *b, const uint8_t *p, size_t n)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        char q[4] = { a[v >> 18], a[(v >> 12) & 63], i + 1 < n ? a[(v >> 6) & 63] : '=',
                      i + 2 < n ? a[v & 63] : '=' };
        rc = shoal_buf_append(b, q, 4);
    }
    return rc;
}

#define TRAINED_RANKS 768     /* 256 bytes + 512 merges */

int synth_tiktoken_render(const synth_config *cfg, shoal_buf *out, shoal_err *err)
{
    size_t ranks = (size_t)(cfg->vocab - SYNTH_SPECIALS);
    size_t trained = ranks < TRAINED_RANKS ? ranks : TRAINED_RANKS;
    static uint8_t bytes[256];
    tok *vocab;
    int rc;

    if (ranks < 256 || (ranks > TRAINED_RANKS && ranks - TRAINED_RANKS > (8u << 16)))
        return shoal_err_set(err, SHOAL_EINVAL, "vocabulary of %d: want 512..%u", cfg->vocab,
                             TRAINED_RANKS + (8u << 16) + SYNTH_SPECIALS);
    if (!(vocab = calloc(trained, sizeof *vocab)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (int i = 0; i < 256; i++) {
        bytes[i] = (uint8_t)i;
        vocab[i] = (tok){ &bytes[i], 1 };
    }
    if ((rc = train(vocab, trained, err)))
        goto out;
    for (size_t r = 0; r < ranks && !rc; r++) {
        uint8_t pad[3];
        if (r < trained) {
            rc = b64_append(out, vocab[r].p, vocab[r].n);
        } else {
            size_t k = r - trained;
            pad[0] = (uint8_t)(0xF8 + (k >> 16));
            pad[1] = (uint8_t)(k >> 8);
            pad[2] = (uint8_t)k;
            rc = b64_append(out, pad, 3);
        }
        rc = rc ? rc : shoal_buf_appendf(out, " %zu\n", r);
    }
    if (rc)
        shoal_err_set(err, rc, "out of memory rendering tiktoken.model");
out:
    for (size_t r = 256; r < trained; r++)
        free((void *)vocab[r].p);
    free(vocab);
    return rc;
}
