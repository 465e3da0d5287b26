/* text_int.h — the tokenizer's private layout, shared by
 * engine/text/tokenizer.c and engine/text/tok_*.c only (chat.c uses text.h).
 *
 * Invariants (established and checked by the loader in tok_vocab.c):
 *   1. ents[i] for i < n_ents are the vocabulary entries in file order;
 *      their bytes are arena[off .. off+len).
 *   2. slots has mask+1 entries (a power of two >= 2 n_ents); a slot holds
 *      entry index + 1, or 0 when empty; linear probing from hash & mask.
 *   3. rank_ent[r] for r < n_base is the entry of rank r or TOK_NONE.
 *   4. byte_rank[b] is the rank of the single byte b (all 256 exist).
 *   5. specials are sorted by id; ids lie in [n_base, n_vocab).
 */
#ifndef SHOAL_ENGINE_TEXT_INT_H
#define SHOAL_ENGINE_TEXT_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/text/text.h"

#define TOK_NONE UINT32_MAX

typedef struct tok_entry {
    uint32_t off;    /* into arena */
    uint32_t len;
    uint32_t rank;
    uint32_t hash;   /* low 32 bits of the key's hash, to skip most memcmps */
} tok_entry;

typedef struct tok_special {
    uint32_t id;
    uint32_t len;
    char    *text;   /* NUL-terminated, owned */
} tok_special;

/* Per-call scratch lent by the pool (tokenizer.c). */
typedef struct tok_scratch tok_scratch;

struct tokenizer {
    uint8_t   *arena;
    size_t     arena_len;
    tok_entry *ents;
    uint32_t   n_ents;
    uint32_t  *slots;
    uint32_t   mask;
    uint32_t   n_base;
    uint32_t  *rank_ent;
    uint32_t   byte_rank[256];

    tok_special *specials;   /* sorted by id */
    size_t       n_specials;
    uint32_t    *by_first;   /* special indices sorted by (first byte, longest first) */
    uint32_t     first_start[257]; /* by_first[first_start[b] .. first_start[b+1]) start with b */
    uint32_t     n_vocab;

    char        *pattern;    /* PCRE2 source */
    pcre2_code  *re;
    int          jit;        /* 1 if JIT-compiled */
    size_t       heap_min;

    pthread_mutex_t pool_mu;
    tok_scratch    *pool;
};

/* XXH3 for long keys (tok_vocab.c). */
uint64_t tok_hash_long(const uint8_t *p, size_t n);

/* Hash of a byte string as the table uses it.  Most lookups are BPE pairs
 * of a few bytes, where a library call costs more than the hashing: keys
 * up to 16 bytes are mixed inline (two unaligned loads and a multiply
 * folding, in the style of wyhash), longer ones go to XXH3. */
static inline uint64_t tok_hash(const uint8_t *p, size_t n)
{
    uint64_t a = 0, b = 0;
    if (n > 16)
        return tok_hash_long(p, n);
    if (n >= 8) {
        memcpy(&a, p, 8);
        memcpy(&b, p + n - 8, 8);
    } else if (n >= 4) {
        uint32_t x, y;
        memcpy(&x, p, 4);
        memcpy(&y, p + n - 4, 4);
        a = x;
        b = y;
    } else if (n > 0) {
        a = (uint64_t)p[0] << 16 | (uint64_t)p[n >> 1] << 8 | p[n - 1];
    }
    __uint128_t m = (__uint128_t)(a ^ 0xa0761d6478bd642full) * (b ^ 0xe7037ed1a0b428dbull ^ n);
    uint64_t h = (uint64_t)m ^ (uint64_t)(m >> 64);
    m = (__uint128_t)(h ^ 0x8ebc6af09c88c6e3ull) * 0x589965cc75374cc3ull;
    return (uint64_t)m ^ (uint64_t)(m >> 64);
}

/* Rank of a byte string, or TOK_NONE. */
static inline uint32_t tok_rank_of(const tokenizer *t, const uint8_t *p, size_t n)
{
    uint64_t h = tok_hash(p, n);
    uint32_t i = (uint32_t)h & t->mask, h32 = (uint32_t)h;
    for (;;) {
        uint32_t s = t->slots[i];
        if (s == 0)
            return TOK_NONE;
        const tok_entry *e = &t->ents[s - 1];
        if (e->hash == h32 && e->len == n && memcmp(t->arena + e->off, p, n) == 0)
            return e->rank;
        i = (i + 1) & t->mask;
    }
}

/* Free what tok_vocab.c allocated (not t itself). */
void tok_vocab_free(tokenizer *t);

/* Compile t->pattern into t->re (tok_pattern.c). */
int tok_regex_compile(tokenizer *t, shoal_err *err);

/* Length of the UTF-8 sequence starting at p[0..n) if it is one complete,
 * well-formed character, else 0 (tok_decode.c). */
size_t tok_utf8_valid_len(const uint8_t *p, size_t n);

/* Decode one valid UTF-8 character (no checks). */
static inline uint32_t tok_utf8_get(const uint8_t *p, size_t *len)
{
    uint8_t c = p[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return (uint32_t)(c & 0x1F) << 6 | (p[1] & 0x3F); }
    if (c < 0xF0) {
        *len = 3;
        return (uint32_t)(c & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    }
    *len = 4;
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 |
           (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
}

/* BPE of one piece (tok_bpe.c): appends its ranks to out. */
int tok_bpe(const tokenizer *t, tok_scratch *s, const uint8_t *p, size_t n, tokenizer_ids *out);

/* Scratch arrays for tok_bpe, grown on demand (tokenizer.c). */
int tok_scratch_bpe_arrays(tok_scratch *s, size_t n, uint32_t **a, uint32_t **b, uint32_t **c,
                           uint64_t **heap);

#endif
