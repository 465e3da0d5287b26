/* tok_vocab.c — loading a tokenizer: the tiktoken vocabulary, its hash
 * table, the special tokens of tokenizer_config.json, model directories.
 *
 * Owns: parsing and validating `base64(bytes) SP rank` lines, the
 * open-addressing table from byte string to rank, the rank -> bytes table,
 * the specials list.  Does not own the regex (tok_pattern.c) or encoding.
 */
#include "engine/text/text_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/json.h"
#include "common/log.h"
#include "common/path.h"
#include "common/platform.h"
#include "common/sys.h"

#define VOCAB_FILE_MAX   ((size_t)1 << 30)  /* 1 GiB: far above any real vocabulary */
#define CONFIG_FILE_MAX  ((size_t)64 << 20)

uint64_t tok_hash_long(const uint8_t *p, size_t n)
{
    return XXH3_64bits(p, n);
}

/* ---- base64 -------------------------------------------------------------- */

static int b64_val(uint8_t c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decode canonical padded base64 s[0..n) into out (room for 3n/4 bytes).
 * Returns the decoded length, or -1 if s is not canonical base64: length
 * not a multiple of 4, a bad character, padding anywhere but the end, or
 * non-zero bits under the padding (two spellings of one byte string would
 * slip past the duplicate check otherwise). */
static long b64_decode(const uint8_t *s, size_t n, uint8_t *out)
{
    size_t o = 0;
    if (n == 0 || n % 4)
        return -1;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad)
                return -1;
            if ((v[k] = b64_val(s[i + k])) < 0)
                return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        if ((pad == 1 && (w & 0xFF)) || (pad == 2 && (w & 0xFFFF)))
            return -1;
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(w >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)w;
    }
    return (long)o;
}

/* ---- the table ------------------------------------------------------------- */

/* Insert entry idx; returns the entry index of an equal key already there,
 * or TOK_NONE after inserting. */
static uint32_t table_insert(tokenizer *t, uint32_t idx)
{
    tok_entry *e = &t->ents[idx];
    const uint8_t *p = t->arena + e->off;
    uint32_t i = (uint32_t)tok_hash(p, e->len) & t->mask;
    for (;;) {
        uint32_t s = t->slots[i];
        if (s == 0) {
            t->slots[i] = idx + 1;
            return TOK_NONE;
        }
        const tok_entry *o = &t->ents[s - 1];
        if (o->hash == e->hash && o->len == e->len && memcmp(t->arena + o->off, p, e->len) == 0)
            return s - 1;
        i = (i + 1) & t->mask;
    }
}

static int parse_rank(const uint8_t *s, size_t n, uint32_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 10)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v >= TOKENIZER_MAX_RANK)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* First pass: count non-empty lines and base64 bytes, to size the arrays. */
static void vocab_count(const uint8_t *p, size_t n, size_t *lines, size_t *b64)
{
    size_t i = 0;
    *lines = 0;
    *b64 = 0;
    while (i < n) {
        const uint8_t *nl = memchr(p + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - p) : n;
        if (e > i)
            (*lines)++, *b64 += e - i;
        i = e + 1;
    }
}

/* Parse one line p[0..n) (no '\n'; a trailing '\r' is allowed) as entry
 * number idx.  `lineno` is only for messages. */
static int vocab_line(tokenizer *t, const uint8_t *p, size_t n, size_t lineno, uint32_t idx,
                      uint32_t *line_of, shoal_err *err)
{
    const uint8_t *sp;
    uint32_t rank;
    long blen;
    tok_entry *e = &t->ents[idx];

    if (n && p[n - 1] == '\r')
        n--;
    sp = memchr(p, ' ', n);
    if (!sp)
        return shoal_err_set(err, SHOAL_EFORMAT, "line %zu: expected 'base64 rank'", lineno);
    if (parse_rank(sp + 1, n - (size_t)(sp + 1 - p), &rank))
        return shoal_err_set(err, SHOAL_EFORMAT, "line %zu: bad rank (want a decimal below %u)",
                             lineno, TOKENIZER_MAX_RANK);
    blen = b64_decode(p, (size_t)(sp - p), t->arena + t->arena_len);
    if (blen < 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "line %zu: bad base64 '%.*s'", lineno,
                             (int)((sp - p) > 40 ? 40 : (sp - p)), (const char *)p);
    if (blen > TOKENIZER_MAX_TOKEN_LEN)
        return shoal_err_set(err, SHOAL_ETOOBIG, "line %zu: token of %ld bytes", lineno, blen);
    e->off = (uint32_t)t->arena_len;
    e->len = (uint32_t)blen;
    e->rank = rank;
    e->hash = (uint32_t)tok_hash(t->arena + e->off, e->len);
    t->arena_len += (size_t)blen;
    line_of[idx] = (uint32_t)lineno;
    return 0;
}

/* Build the rank index and the hash table; check uniqueness. */
static int vocab_index(tokenizer *t, const uint32_t *line_of, shoal_err *err)
{
    uint32_t max_rank = 0, cap = 4;
    for (uint32_t i = 0; i < t->n_ents; i++)
        if (t->ents[i].rank > max_rank)
            max_rank = t->ents[i].rank;
    t->n_base = t->n_ents ? max_rank + 1 : 0;
    t->rank_ent = malloc(((size_t)t->n_base + 1) * sizeof *t->rank_ent);
    while (cap < 2 * (uint64_t)t->n_ents)
        cap <<= 1;
    t->slots = calloc(cap, sizeof *t->slots);
    if (!t->rank_ent || !t->slots)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory indexing the vocabulary");
    t->mask = cap - 1;
    memset(t->rank_ent, 0xFF, ((size_t)t->n_base + 1) * sizeof *t->rank_ent);
    for (uint32_t i = 0; i < t->n_ents; i++) {
        tok_entry *e = &t->ents[i];
        uint32_t dup;
        if (t->rank_ent[e->rank] != TOK_NONE)
            return shoal_err_set(err, SHOAL_EFORMAT, "line %u: duplicate rank %u (first on line %u)",
                                 line_of[i], e->rank, line_of[t->rank_ent[e->rank]]);
        t->rank_ent[e->rank] = i;
        if ((dup = table_insert(t, i)) != TOK_NONE)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "line %u: duplicate bytes (same as rank %u on line %u)", line_of[i],
                                 t->ents[dup].rank, line_of[dup]);
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if ((t->byte_rank[b] = tok_rank_of(t, &c, 1)) == TOK_NONE)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "the vocabulary lacks the single byte 0x%02x (byte-level BPE needs all 256)",
                                 b);
    }
    return 0;
}

static int vocab_parse(tokenizer *t, const uint8_t *p, size_t n, shoal_err *err)
{
    size_t lines, b64, i = 0, lineno = 0;
    uint32_t *line_of;
    int rc = 0;

    vocab_count(p, n, &lines, &b64);
    if (lines == 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "the vocabulary is empty");
    if (lines >= TOKENIZER_MAX_RANK || b64 > UINT32_MAX)
        return shoal_err_set(err, SHOAL_ETOOBIG, "the vocabulary is too large (%zu lines)", lines);
    t->ents = malloc(lines * sizeof *t->ents);
    t->arena = malloc(b64 / 4 * 3 + 4);
    line_of = malloc(lines * sizeof *line_of);
    if (!t->ents || !t->arena || !line_of) {
        free(line_of);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory loading %zu vocabulary lines", lines);
    }
    while (i < n && rc == 0) {
        const uint8_t *nl = memchr(p + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - p) : n;
        lineno++;
        if (e > i && !(e == i + 1 && p[i] == '\r'))
            rc = vocab_line(t, p + i, e - i, lineno, t->n_ents++, line_of, err);
        i = e + 1;
    }
    if (rc == 0)
        rc = vocab_index(t, line_of, err);
    free(line_of);
    return rc;
}

int tokenizer_new(tokenizer **out, const char *vocab, size_t vocab_len, const char *pattern,
                  shoal_err *err)
{
    tokenizer *t;
    int rc;

    *out = NULL;
    if (!vocab || !pattern)
        return shoal_err_set(err, SHOAL_EINVAL, "tokenizer_new: vocabulary and pattern are required");
    t = calloc(1, sizeof *t);
    if (!t)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    pthread_mutex_init(&t->pool_mu, NULL);
    t->heap_min = 128;
    if ((rc = vocab_parse(t, (const uint8_t *)vocab, vocab_len, err)) ||
        (rc = tokenizer_pattern_resolve(pattern, &t->pattern, err)) ||
        (rc = tok_regex_compile(t, err))) {
        tokenizer_free(t);
        return rc;
    }
    t->n_vocab = t->n_base;
    *out = t;
    return 0;
}

int tokenizer_load(tokenizer **out, const char *vocab_path, const char *pattern, shoal_err *err)
{
    shoal_buf b;
    int rc;

    *out = NULL;
    shoal_buf_init(&b, 0);
    if ((rc = shoal_read_file(vocab_path, VOCAB_FILE_MAX, &b, err)) == 0 &&
        (rc = tokenizer_new(out, b.data ? (const char *)b.data : "", b.len, pattern, err)))
        shoal_err_wrap(err, rc, "%s: ", vocab_path);
    shoal_buf_free(&b);
    return rc;
}

/* ---- specials ------------------------------------------------------------- */

static void specials_clear(tokenizer *t)
{
    for (size_t i = 0; i < t->n_specials; i++)
        free(t->specials[i].text);
    free(t->specials);
    free(t->by_first);
    t->specials = NULL;
    t->by_first = NULL;
    t->n_specials = 0;
    memset(t->first_start, 0, sizeof t->first_start);
    t->n_vocab = t->n_base;
}

static int cmp_special_id(const void *a, const void *b)
{
    const tok_special *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Order for matching: first byte, then longest first, so at one position
 * the first spelling that matches is the longest. */
static int cmp_first(const void *a, const void *b, void *arg)
{
    const tokenizer *t = arg;
    const tok_special *x = &t->specials[*(const uint32_t *)a];
    const tok_special *y = &t->specials[*(const uint32_t *)b];
    uint8_t fx = (uint8_t)x->text[0], fy = (uint8_t)y->text[0];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return strcmp(x->text, y->text);
}

struct specials_ctx {
    tokenizer  *t;
    tok_special *list;
    size_t      n;
    uint32_t    max_id;
    shoal_err  *err;
};

static int special_member(const char *key, shoal_json *value, void *arg)
{
    struct specials_ctx *c = arg;
    uint32_t id;
    const char *content;
    shoal_json *cj = shoal_json_get(value, "content");

    if (parse_rank((const uint8_t *)key, strlen(key), &id))
        return shoal_err_set(c->err, SHOAL_EFORMAT, "added_tokens_decoder: bad id '%s'", key);
    if (!cj || shoal_json_typeof(cj) != SHOAL_JSON_STRING)
        return shoal_err_set(c->err, SHOAL_EFORMAT, "added_tokens_decoder.%s: no content string", key);
    content = shoal_json_str_value(cj);
    if (shoal_json_str_len(cj) == 0 || strlen(content) != shoal_json_str_len(cj))
        return shoal_err_set(c->err, SHOAL_EFORMAT,
                             "added_tokens_decoder.%s: empty content or one holding NUL", key);
    c->list[c->n].id = id;
    c->list[c->n].len = (uint32_t)strlen(content);
    if (!(c->list[c->n].text = strdup(content)))
        return shoal_err_set(c->err, SHOAL_ENOMEM, "out of memory");
    c->n++;
    if (id > c->max_id)
        c->max_id = id;
    return 0;
}

/* Check ranges, fill the reserved gaps, and index the list. */
static int specials_finish(tokenizer *t, tok_special *list, size_t n, size_t cap,
                           uint32_t reserved_end, shoal_err *err)
{
    qsort(list, n, sizeof *list, cmp_special_id);
    for (size_t i = 0; i < n; i++) {
        if (list[i].id < t->n_base || list[i].id >= reserved_end)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "special token %u '%s' lies outside the reserved range [%u, %u)",
                                 list[i].id, list[i].text, t->n_base, reserved_end);
        if (i && list[i].id == list[i - 1].id)
            return shoal_err_set(err, SHOAL_EFORMAT, "special token id %u listed twice", list[i].id);
    }
    /* Fill the gaps: reserved ids nobody named. */
    for (uint32_t id = t->n_base, j = 0; id < reserved_end; id++) {
        char name[64];
        while (j < n && list[j].id < id)
            j++;
        if (j < n && list[j].id == id)
            continue;
        if (n >= cap)
            return shoal_err_set(err, SHOAL_EINTERNAL, "specials list overflow");
        snprintf(name, sizeof name, "<|reserved_token_%" PRIu32 "|>", id);
        list[n].id = id;
        list[n].len = (uint32_t)strlen(name);
        if (!(list[n].text = strdup(name)))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        n++;
    }
    qsort(list, n, sizeof *list, cmp_special_id);
    t->specials = list;
    t->n_specials = n;
    t->n_vocab = reserved_end > t->n_base ? reserved_end : t->n_base;
    if (n && !(t->by_first = malloc(n * sizeof *t->by_first)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n; i++)
        t->by_first[i] = i;
    shoal_qsort_r(t->by_first, n, sizeof *t->by_first, cmp_first, t);
    for (size_t i = 0; i < n; i++)
        t->first_start[(uint8_t)t->specials[t->by_first[i]].text[0] + 1]++;
    for (int b = 0; b < 256; b++)
        t->first_start[b + 1] += t->first_start[b];
    for (size_t i = 1; i < n; i++) {
        const tok_special *a = &t->specials[t->by_first[i - 1]], *b = &t->specials[t->by_first[i]];
        if (a->len == b->len && strcmp(a->text, b->text) == 0)
            return shoal_err_set(err, SHOAL_EFORMAT, "special tokens %u and %u share the spelling '%s'",
                                 a->id, b->id, a->text);
    }
    return 0;
}

int tokenizer_specials_parse(tokenizer *t, const char *json, size_t json_len,
                             uint32_t reserved_end, shoal_err *err)
{
    shoal_json *root = NULL, *dec = NULL;
    struct specials_ctx c = { t, NULL, 0, 0, err };
    size_t listed = 0, cap;
    int rc = 0;

    specials_clear(t);
    if (json) {
        if (!(root = shoal_json_parse(json, json_len, err)))
            return shoal_err_wrap(err, SHOAL_EFORMAT, "tokenizer_config.json: ");
        dec = shoal_json_get(root, "added_tokens_decoder");
        if (dec && shoal_json_typeof(dec) != SHOAL_JSON_OBJECT) {
            shoal_json_free(root);
            return shoal_err_set(err, SHOAL_EFORMAT, "added_tokens_decoder is not an object");
        }
        listed = dec ? shoal_json_object_size(dec) : 0;
    }
    if (reserved_end > TOKENIZER_MAX_RANK + 65536u) {
        shoal_json_free(root);
        return shoal_err_set(err, SHOAL_ERANGE, "reserved range end %u is too large", reserved_end);
    }
    cap = listed + (reserved_end > t->n_base ? reserved_end - t->n_base : 0);
    if (cap && !(c.list = calloc(cap, sizeof *c.list)))
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if (rc == 0 && listed)
        rc = shoal_json_object_foreach(dec, special_member, &c);
    if (rc == 0 && reserved_end == 0)
        reserved_end = c.n ? c.max_id + 1 : t->n_base;
    cap = listed + (reserved_end > t->n_base ? reserved_end - t->n_base : 0);
    if (rc == 0 && cap > listed) {
        tok_special *bigger = realloc(c.list, cap * sizeof *c.list);
        if (!bigger)
            rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        else {
            memset(bigger + listed, 0, (cap - listed) * sizeof *bigger);
            c.list = bigger;
        }
    }
    if (rc == 0)
        rc = specials_finish(t, c.list, c.n, cap, reserved_end, err);
    if (rc) {
        if (t->specials == c.list)
            t->specials = NULL, t->n_specials = 0;
        for (size_t i = 0; i < cap && c.list; i++)
            free(c.list[i].text);
        free(c.list);
        free(t->by_first);
        t->by_first = NULL;
        memset(t->first_start, 0, sizeof t->first_start);
        t->n_vocab = t->n_base;
    }
    shoal_json_free(root);
    return rc;
}

int tokenizer_specials_load(tokenizer *t, const char *config_path, uint32_t reserved_end,
                            shoal_err *err)
{
    shoal_buf b;
    int rc;
    shoal_buf_init(&b, 0);
    if ((rc = shoal_read_file(config_path, CONFIG_FILE_MAX, &b, err)) == 0 &&
        (rc = tokenizer_specials_parse(t, b.data ? (const char *)b.data : "", b.len, reserved_end, err)))
        shoal_err_wrap(err, rc, "%s: ", config_path);
    shoal_buf_free(&b);
    return rc;
}

/* vocab_size from config.json (root or text_config), or 0. */
static uint32_t model_vocab_size(const char *dir)
{
    char path[4096];
    shoal_json *root;
    int64_t v = 0;
    if (shoal_path_join(path, sizeof path, dir, "config.json") ||
        !(root = shoal_json_load_file(path, CONFIG_FILE_MAX, NULL)))
        return 0;
    if (shoal_json_int(root, "text_config.vocab_size", &v, NULL) &&
        shoal_json_int(root, "vocab_size", &v, NULL))
        v = 0;
    shoal_json_free(root);
    return v > 0 && v < (int64_t)TOKENIZER_MAX_RANK + 65536 ? (uint32_t)v : 0;
}

int tokenizer_model_open(tokenizer **out, const char *dir, shoal_err *err)
{
    char path[4096];
    tokenizer *t = NULL;
    int rc;

    *out = NULL;
    if (shoal_path_join(path, sizeof path, dir, "tiktoken.model"))
        return shoal_err_set(err, SHOAL_EINVAL, "model directory path too long");
    if ((rc = tokenizer_load(&t, path, "k3", err)))
        return rc;
    if (shoal_path_join(path, sizeof path, dir, "tokenizer_config.json") == 0 &&
        access(path, F_OK) == 0)
        rc = tokenizer_specials_load(t, path, model_vocab_size(dir), err);
    else
        rc = tokenizer_specials_parse(t, NULL, 0, model_vocab_size(dir), err);
    if (rc) {
        tokenizer_free(t);
        return rc;
    }
    LOG_DEBUG("tokenizer", "%s: %u base ranks, %zu specials, vocab %u", dir, t->n_base,
              t->n_specials, t->n_vocab);
    *out = t;
    return 0;
}

/* ---- queries and teardown --------------------------------------------------- */

uint32_t tokenizer_n_base(const tokenizer *t) { return t->n_base; }
uint32_t tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }
size_t tokenizer_n_specials(const tokenizer *t) { return t->n_specials; }
const char *tokenizer_pattern(const tokenizer *t) { return t->pattern; }
void tokenizer_set_heap_min(tokenizer *t, size_t n) { t->heap_min = n < 4 ? 4 : n; }

static const tok_special *special_by_id(const tokenizer *t, uint32_t id)
{
    size_t lo = 0, hi = t->n_specials;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t->specials[mid].id == id)
            return &t->specials[mid];
        if (t->specials[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int tokenizer_special_id(const tokenizer *t, const char *text, uint32_t *id)
{
    size_t n = strlen(text);
    if (n == 0)
        return SHOAL_ENOTFOUND;
    uint8_t b = (uint8_t)text[0];
    for (uint32_t i = t->first_start[b]; i < t->first_start[b + 1]; i++) {
        const tok_special *s = &t->specials[t->by_first[i]];
        if (s->len == n && memcmp(s->text, text, n) == 0) {
            *id = s->id;
            return 0;
        }
    }
    return SHOAL_ENOTFOUND;
}

int tokenizer_is_special(const tokenizer *t, uint32_t id)
{
    return special_by_id(t, id) != NULL;
}

int tokenizer_token_bytes(const tokenizer *t, uint32_t id, const uint8_t **p, size_t *n)
{
    if (id < t->n_base && t->rank_ent[id] != TOK_NONE) {
        const tok_entry *e = &t->ents[t->rank_ent[id]];
        *p = t->arena + e->off;
        *n = e->len;
        return 0;
    }
    const tok_special *s = special_by_id(t, id);
    if (!s)
        return SHOAL_ERANGE;
    *p = (const uint8_t *)s->text;
    *n = s->len;
    return 0;
}

void tok_vocab_free(tokenizer *t)
{
    specials_clear(t);
    free(t->arena);
    free(t->ents);
    free(t->slots);
    free(t->rank_ent);
    free(t->pattern);
    if (t->re)
        pcre2_code_free(t->re);
}
