/* tok_bpe.c — byte-level BPE of one pre-tokenized piece, as tiktoken does it.
 *
 * Owns: the merge loop.  Does not own splitting text into pieces.
 *
 * The rule (tiktoken's _byte_pair_merge): start from single bytes; while
 * some adjacent pair of parts concatenates to a vocabulary entry, merge the
 * pair whose concatenation has the lowest rank, the leftmost one on ties;
 * then emit each part's rank.
 *
 * Two implementations of that rule:
 *  - short pieces: tiktoken's own loop (an array of part starts with the
 *    rank of each part joined to its right neighbour; after a merge only the
 *    two neighbouring ranks are recomputed, then a linear scan finds the next
 *    minimum).  O(n^2) but tiny constants.
 *  - long pieces (>= heap_min bytes): parts in a doubly linked list, pair
 *    ranks in a binary min-heap keyed (rank, start).  Stale heap entries are
 *    skipped on pop: an entry is live iff its part is alive and still has
 *    that rank.  This is exact because the byte string of a part's pair only
 *    ever grows, so a part never returns to an old rank.  O(n log n), which
 *    keeps a 25,000-character run of one symbol (a worst case for tiktoken)
 *    fast.
 * The unit tests check both against each other.
 */
#include "engine/text/text_int.h"

#include <assert.h>

/* ---- short pieces: tiktoken's loop ------------------------------------------ */

static int bpe_linear(const tokenizer *t, uint32_t *start, uint32_t *rank, uint32_t *own,
                      const uint8_t *p, size_t n, tokenizer_ids *out)
{
    size_t m = n + 1;   /* parts: start[0..m), the last one is the end sentinel */
    uint32_t min_r = TOK_NONE;
    size_t min_i = 0;

    for (size_t i = 0; i + 1 < n; i++) {
        start[i] = (uint32_t)i;
        own[i] = t->byte_rank[p[i]];
        rank[i] = tok_rank_of(t, p + i, 2);
        if (rank[i] < min_r)
            min_r = rank[i], min_i = i;
    }
    start[n - 1] = (uint32_t)(n - 1);
    own[n - 1] = t->byte_rank[p[n - 1]];
    rank[n - 1] = TOK_NONE;
    start[n] = (uint32_t)n;
    rank[n] = TOK_NONE;

    while (min_r != TOK_NONE) {
        size_t i = min_i;
        /* Merge part i with i+1: drop start[i+1]; the merged part's own
         * rank is the pair's. */
        own[i] = min_r;
        for (size_t k = i + 1; k + 1 < m; k++)
            start[k] = start[k + 1], rank[k] = rank[k + 1], own[k] = own[k + 1];
        m--;
        /* Pair ranks that changed: (i-1, i) and (i, i+1). */
        if (i > 0)
            rank[i - 1] = i + 1 < m ? tok_rank_of(t, p + start[i - 1], start[i + 1] - start[i - 1])
                                    : TOK_NONE;
        rank[i] = i + 2 < m ? tok_rank_of(t, p + start[i], start[i + 2] - start[i]) : TOK_NONE;
        min_r = TOK_NONE;
        for (size_t k = 0; k + 1 < m; k++)
            if (rank[k] < min_r)
                min_r = rank[k], min_i = k;
    }
    for (size_t k = 0; k + 1 < m; k++) {
        if (tokenizer_ids_push(out, own[k]))
            return SHOAL_ENOMEM;
    }
    return 0;
}

/* ---- long pieces: list + heap --------------------------------------------------- */

/* Heap key: rank in the high 32 bits, start offset in the low 32, so the
 * smallest key is the lowest rank and, on ties, the leftmost pair. */
static inline uint64_t hkey(uint32_t rank, uint32_t pos) { return (uint64_t)rank << 32 | pos; }

static void heap_push(uint64_t *h, size_t *n, uint64_t k)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h[parent] <= k)
            break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = k;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], last = h[--(*n)];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && h[c + 1] < h[c])
            c++;
        if (last <= h[c])
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = last;
    return top;
}

/* Parts are identified by their start offset.  nxt[s] is the start of the
 * next part (n for the last), prv[s] the previous (TOK_NONE for the first),
 * rk[s] the rank of part s joined with its next part, TOK_NONE for none or
 * for a dead part. */
static int bpe_heap(const tokenizer *t, uint32_t *nxt, uint32_t *prv, uint32_t *rk, uint64_t *heap,
                    const uint8_t *p, size_t n, tokenizer_ids *out)
{
    size_t hn = 0;
    const uint32_t end = (uint32_t)n;

    for (uint32_t i = 0; i < end; i++) {
        nxt[i] = i + 1;
        prv[i] = i ? i - 1 : TOK_NONE;
        rk[i] = i + 1 < end ? tok_rank_of(t, p + i, 2) : TOK_NONE;
        if (rk[i] != TOK_NONE)
            heap_push(heap, &hn, hkey(rk[i], i));
    }
    while (hn) {
        uint64_t k = heap_pop(heap, &hn);
        uint32_t s = (uint32_t)k, r = (uint32_t)(k >> 32), b, after;
        if (rk[s] != r)
            continue;   /* stale (part dead or re-ranked) */
        b = nxt[s];
        after = nxt[b];
        /* Merge s with b. */
        nxt[s] = after;
        if (after < end)
            prv[after] = s;
        rk[b] = TOK_NONE;
        rk[s] = after < end ? tok_rank_of(t, p + s, nxt[after] - s) : TOK_NONE;
        if (rk[s] != TOK_NONE)
            heap_push(heap, &hn, hkey(rk[s], s));
        if (prv[s] != TOK_NONE) {
            uint32_t a = prv[s];
            rk[a] = tok_rank_of(t, p + a, after - a);
            if (rk[a] != TOK_NONE)
                heap_push(heap, &hn, hkey(rk[a], a));
        }
    }
    for (uint32_t s = 0; s < end; s = nxt[s]) {
        uint32_t r = tok_rank_of(t, p + s, nxt[s] - s);
        assert(r != TOK_NONE);
        if (tokenizer_ids_push(out, r))
            return SHOAL_ENOMEM;
    }
    return 0;
}

int tok_bpe(const tokenizer *t, tok_scratch *s, const uint8_t *p, size_t n, tokenizer_ids *out)
{
    uint32_t *a, *b, *c;
    uint64_t *h;

    if (n == 0)
        return 0;
    if (n == 1)
        return tokenizer_ids_push(out, t->byte_rank[p[0]]) ? SHOAL_ENOMEM : 0;
    if (n > UINT32_MAX - 2)
        return SHOAL_ETOOBIG;
    if (tok_scratch_bpe_arrays(s, n, &a, &b, &c, &h))
        return SHOAL_ENOMEM;
    if (n < t->heap_min)
        return bpe_linear(t, a, b, c, p, n, out);
    return bpe_heap(t, a, b, c, h, p, n, out);
}
