/* model.c — building the model manifest from an upstream, keeping it in
 * the cache, and turning a selection into fetch items.
 *
 * Owns the layout rules of fetch.h's fetch_manifest_get(): the index's
 * file names are checked before any is used, every shard header goes
 * through the strict safetensors parser, and each routed expert must be
 * its six records back to back in checkpoint order with the sizes the
 * config implies.  Reads go through up_stat()/up_read(), so a Hub and a
 * snapshot directory give the same manifest.
 *
 * The shard headers (K3: 96 shards, three requests each, ~790 KB apiece)
 * are read by `parallel` threads, each with its own blocking Hub client
 * (up_client_new): the strict checks, retries, CDN re-resolves and the
 * token rule of the one metadata path apply unchanged, and ~300 requests
 * of at most a megabyte do not need libcurl multi's scale.  Each thread
 * also parses its shards, which is most of the build's CPU.  Results land
 * in per-shard slots; files are added to the manifest afterwards, in shard
 * order, so the manifest does not depend on which thread finished first,
 * and the first failing shard (by order) names the error.
 *
 * What a build read and is worth keeping (fetch_keep: the encoded
 * manifest, each shard's header [0, 8+N) and the bytes of tensors outside
 * the language model) is stored by fetch_manifest_get or handed to the
 * caller by fetch_manifest_build.
 */
#include "fetcher/fetch_int.h"

#include <pthread.h>
#include <stdatomic.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/json.h"
#include "common/k3_config.h"
#include "common/log.h"
#include "common/sys.h"
#include "common/safetensors.h"

#define LM_PREFIX         "language_model."
#define INDEX_FILE        "model.safetensors.index.json"
#define INDEX_MAX         (512u << 20)
#define HEADER_PROBE      100000u      /* as huggingface_hub: most headers fit */

/* Small files fetched with a model when they exist. */
static const char *const optional_files[] = {
    "tokenizer_config.json", "tiktoken.model", "generation_config.json", "tokenizer.json",
};

/* The six records of a routed expert, in checkpoint order. */
static const char *const expert_records[6] = {
    "w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
    "w2.weight_scale", "w3.weight_packed", "w3.weight_scale",
};

/* Bytes of a shard no manifest object covers (tensors outside the
 * language model), kept so the shard can be cached from end to end. */
typedef struct gap {
    uint64_t off, len;
    uint8_t *p;
} gap;

typedef struct shard {
    char    *path;
    uint32_t file;
    st_file *st;
    /* filled by the header reader (any thread) */
    char     etag[HUB_ETAG_MAX];
    uint64_t size;
    uint8_t *head;          /* [0, 8+N) when kept */
    size_t   head_len;
    gap     *gaps;
    size_t   ngaps;
    int      rc;
    shoal_err err;
} shard;

typedef struct entry {
    const char *name;       /* full name, borrowed from the index JSON */
    size_t      shard;
} entry;

typedef struct rec {
    const st_tensor *t;     /* NULL: absent */
    uint32_t         file;
} rec;

typedef struct builder {
    fetch_upstream *u;
    manifest       *m;
    const fetch_build_opts *o;
    int             keep;   /* hold the headers and gaps for fetch_keep */
    k3_config       cfg;
    shard          *shards;
    size_t          nshards, cap_shards, last_shard;
    entry          *entries;
    size_t          nentries, cap_entries;
    rec            *recs;   /* [layer][expert][6] */
    shoal_err      *err;
    int             rc;
} builder;

static int keep_build(fetch_upstream *u, const manifest *m, const builder *b, fetch_keep **out,
                      shoal_err *err);
static void manifest_key_etag(const fetch_upstream *u, char *out, size_t cap);

/* ---- reading small files ------------------------------------------------------- */

static int read_whole(fetch_upstream *u, manifest *m, const char *path, size_t max, uint8_t **out,
                      size_t *len, shoal_err *err)
{
    char etag[HUB_ETAG_MAX];
    uint64_t size;
    uint8_t *p;
    int rc = up_stat(u, path, etag, sizeof etag, &size, err);

    if (rc)
        return rc;
    if (size > max)
        return shoal_err_set(err, SHOAL_ETOOBIG, "%s is %" PRIu64 " bytes, more than %zu", path,
                             size, max);
    p = malloc(size ? size : 1);
    if (!p)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory reading %s", path);
    rc = up_read(u, path, 0, (size_t)size, p, err);
    rc = rc ? rc : manifest_file_add(m, path, etag, size, NULL, err);
    if (rc) {
        free(p);
        return rc;
    }
    *out = p;
    *len = (size_t)size;
    return 0;
}

/* ---- the index ---------------------------------------------------------------- */

static size_t shard_of(builder *b, const char *path)
{
    size_t last = b->last_shard;
    if (last < b->nshards && strcmp(b->shards[last].path, path) == 0)
        return last;
    for (size_t i = 0; i < b->nshards; i++)
        if (strcmp(b->shards[i].path, path) == 0)
            return b->last_shard = i;
    if (b->nshards == b->cap_shards) {
        size_t nc = b->cap_shards ? b->cap_shards * 2 : 16;
        shard *p = realloc(b->shards, nc * sizeof *p);
        if (!p)
            return SIZE_MAX;
        b->shards = p;
        b->cap_shards = nc;
    }
    memset(&b->shards[b->nshards], 0, sizeof *b->shards);
    b->shards[b->nshards].path = strdup(path);
    if (!b->shards[b->nshards].path)
        return SIZE_MAX;
    return b->last_shard = b->nshards++;
}

static int on_weight(const char *key, shoal_json *value, void *ctx)
{
    builder *b = ctx;
    const char *file = shoal_json_str_value(value);
    size_t s;
    int rc;

    if (!file || strlen(file) != shoal_json_str_len(value))
        return b->rc = shoal_err_set(b->err, SHOAL_EFORMAT,
                                     "%s: tensor '%s' maps to a value that is not a file name",
                                     INDEX_FILE, key);
    rc = manifest_path_check(file, b->err);
    if (rc)
        return b->rc = shoal_err_wrap(b->err, rc, "%s: tensor '%s'", INDEX_FILE, key);
    if (strncmp(key, LM_PREFIX, sizeof LM_PREFIX - 1) != 0)
        return 0;   /* vision tower, projector: never read */
    s = shard_of(b, file);
    if (s == SIZE_MAX || (b->nentries == b->cap_entries
                          && !(b->cap_entries = b->cap_entries ? b->cap_entries * 2 : 1024,
                               b->entries = realloc(b->entries, b->cap_entries * sizeof *b->entries))))
        return b->rc = shoal_err_set(b->err, SHOAL_ENOMEM, "out of memory");
    b->entries[b->nentries++] = (entry){ key, s };
    return 0;
}

/* ---- shard headers ---------------------------------------------------------------- */

static int is_language(const char *name)
{
    return strncmp(name, LM_PREFIX, sizeof LM_PREFIX - 1) == 0;
}

/* The runs of tensors outside the language model, read when they are
 * small enough to keep (FETCH_KEEP_GAP_MAX per shard). */
static int read_gaps(builder *b, shard *sh, hub_client *hc)
{
    size_t n = st_count(sh->st), cap = 0;
    uint64_t total = 0;
    int rc = 0;

    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_at(sh->st, i);
        if (is_language(t->name) || t->end == t->begin)
            continue;
        total += t->end - t->begin;
        if (sh->ngaps && sh->gaps[sh->ngaps - 1].off + sh->gaps[sh->ngaps - 1].len == t->begin) {
            sh->gaps[sh->ngaps - 1].len += t->end - t->begin;
            continue;
        }
        if (sh->ngaps == cap) {
            size_t nc = cap ? cap * 2 : 4;
            gap *p = realloc(sh->gaps, nc * sizeof *p);
            if (!p)
                return shoal_err_set(&sh->err, SHOAL_ENOMEM, "out of memory");
            sh->gaps = p;
            cap = nc;
        }
        sh->gaps[sh->ngaps++] = (gap){ t->begin, t->end - t->begin, NULL };
    }
    if (total > FETCH_KEEP_GAP_MAX) {
        LOG_INFO("fetch", "%s: %" PRIu64 " bytes of tensors outside the language model are not "
                 "kept; deep verify cannot check this shard", sh->path, total);
        free(sh->gaps);
        sh->gaps = NULL;
        sh->ngaps = 0;
        return 0;
    }
    for (size_t i = 0; rc == 0 && i < sh->ngaps; i++) {
        gap *g = &sh->gaps[i];
        if (!(g->p = malloc((size_t)g->len)))
            return shoal_err_set(&sh->err, SHOAL_ENOMEM, "out of memory");
        rc = up_read_on(b->u, hc, sh->path, g->off, (size_t)g->len, g->p, &sh->err);
    }
    return rc;
}

/* Resolve, read and parse one shard's header over hc.  Any thread: it
 * touches only sh (and the upstream through its locked helpers). */
static int read_header(builder *b, shard *sh, hub_client *hc)
{
    fetch_upstream *u = b->u;
    uint64_t n;
    uint8_t *p = NULL;
    size_t got;
    shoal_err *err = &sh->err;
    int rc = up_stat_on(u, hc, sh->path, sh->etag, sizeof sh->etag, &sh->size, err);

    if (rc)
        return rc;
    if (sh->size < 8)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: %" PRIu64 " bytes is too short for a "
                             "safetensors file", sh->path, sh->size);
    got = (size_t)(sh->size < HEADER_PROBE ? sh->size : HEADER_PROBE);
    p = malloc(got);
    if (!p)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    rc = up_read_on(u, hc, sh->path, 0, got, p, err);
    rc = rc ? rc : st_header_len(p, sh->size, &n, err);
    if (rc == 0 && 8 + n > got) {
        uint8_t *q = realloc(p, (size_t)(8 + n));
        if (!q) {
            rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory for a %" PRIu64
                               "-byte header", n);
        } else {
            p = q;
            rc = up_read_on(u, hc, sh->path, got, (size_t)(8 + n - got), p + got, err);
        }
    }
    rc = rc ? rc : st_parse(p + 8, (size_t)n, sh->size, &sh->st, err);
    if (rc == 0 && b->keep) {
        sh->head = p;
        sh->head_len = (size_t)(8 + n);
        p = NULL;
        rc = read_gaps(b, sh, hc);
    }
    free(p);
    if (rc)
        shoal_err_wrap(err, rc, "shard %s", sh->path);
    return rc;
}

typedef struct header_pool {
    builder     *b;
    _Atomic size_t next, done;
    _Atomic int  failed;
} header_pool;

static void *header_thread(void *arg)
{
    header_pool *P = arg;
    builder *b = P->b;
    hub_client *hc = NULL;
    shoal_err e = { 0 };
    int rc = up_client_new(b->u, &hc, &e);

    for (;;) {
        size_t i = atomic_fetch_add(&P->next, 1);
        shard *sh;
        if (i >= b->nshards || atomic_load(&P->failed))
            break;
        sh = &b->shards[i];
        if (rc) {   /* no client for this thread: the shard it took fails */
            sh->err = e;
            sh->rc = rc;
        } else {
            sh->rc = read_header(b, sh, hc);
        }
        if (sh->rc) {
            atomic_store(&P->failed, 1);
            break;
        }
        if (b->o && b->o->progress)
            b->o->progress(b->o->ctx, "headers", atomic_fetch_add(&P->done, 1) + 1, b->nshards);
    }
    hub_client_free(hc);
    return NULL;
}

/* Every shard's header, `parallel` at once; then the files in shard order. */
static int read_headers(builder *b, shoal_err *err)
{
    int want = b->o && b->o->parallel > 0 ? b->o->parallel : b->u->o.parallel;
    size_t nt = want < 1 ? 1 : (size_t)want, started = 0;
    pthread_t th[64];
    header_pool P;
    int rc = 0;

    if (nt > b->nshards)
        nt = b->nshards;
    if (nt > sizeof th / sizeof th[0])
        nt = sizeof th / sizeof th[0];
    P.b = b;
    atomic_init(&P.next, 0);
    atomic_init(&P.done, 0);
    atomic_init(&P.failed, 0);
    if (b->o && b->o->progress)
        b->o->progress(b->o->ctx, "headers", 0, b->nshards);
    if (nt <= 1) {
        header_thread(&P);
    } else {
        for (; started < nt; started++)
            if (pthread_create(&th[started], NULL, header_thread, &P) != 0)
                break;
        if (started == 0)
            header_thread(&P);
        for (size_t i = 0; i < started; i++)
            pthread_join(th[i], NULL);
    }
    for (size_t i = 0; i < b->nshards; i++) {
        shard *sh = &b->shards[i];
        if (sh->rc) {
            *err = sh->err;
            return sh->rc;
        }
        if (!sh->st)   /* not reached: another shard failed first */
            return shoal_err_set(err, SHOAL_EINTERNAL, "shard %s was not read", sh->path);
    }
    for (size_t i = 0; rc == 0 && i < b->nshards; i++)
        rc = manifest_file_add(b->m, b->shards[i].path, b->shards[i].etag, b->shards[i].size,
                               &b->shards[i].file, err);
    return rc;
}

/* ---- tensors and experts ------------------------------------------------------------- */

/* Parse a canonical decimal (no sign, no leading zero) up to `end`. */
static int parse_index(const char **s, uint32_t *out)
{
    const char *p = *s;
    uint64_t v = 0;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9'))
        return -1;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > 1000000)
            return -1;
        p++;
    }
    *s = p;
    *out = (uint32_t)v;
    return 0;
}

/* "model.layers.L.block_sparse_moe.experts.E.<record>": 1 with L, E and the
 * record index, 0 if it is not an expert record. */
static int expert_name(const char *n, uint32_t *layer, uint32_t *id, int *r)
{
    static const char a[] = "model.layers.", b[] = ".block_sparse_moe.experts.";
    if (strncmp(n, a, sizeof a - 1) != 0)
        return 0;
    n += sizeof a - 1;
    if (parse_index(&n, layer) || strncmp(n, b, sizeof b - 1) != 0)
        return 0;
    n += sizeof b - 1;
    if (parse_index(&n, id) || *n != '.')
        return 0;
    n++;
    for (int i = 0; i < 6; i++)
        if (strcmp(n, expert_records[i]) == 0) {
            *r = i;
            return 1;
        }
    return 0;
}

static int add_entry(builder *b, const entry *e)
{
    const shard *sh = &b->shards[e->shard];
    const st_tensor *t = st_find(sh->st, e->name);
    const char *short_name = e->name + sizeof LM_PREFIX - 1;
    uint32_t layer, id;
    int r;

    if (!t)
        return shoal_err_set(b->err, SHOAL_EFORMAT, "tensor '%s' is in %s's weight_map but not "
                             "in %s", e->name, INDEX_FILE, sh->path);
    if (expert_name(short_name, &layer, &id, &r)) {
        rec *slot;
        if (layer >= (uint32_t)b->cfg.n_layers || id >= (uint32_t)b->cfg.n_experts)
            return shoal_err_set(b->err, SHOAL_EFORMAT, "tensor '%s': layer %" PRIu32
                                 " / expert %" PRIu32 " is outside the config (%" PRId64
                                 " layers, %" PRId64 " experts)", e->name, layer, id,
                                 b->cfg.n_layers, b->cfg.n_experts);
        slot = &b->recs[((size_t)layer * (size_t)b->cfg.n_experts + id) * 6 + (size_t)r];
        slot->t = t;
        slot->file = sh->file;
        return 0;
    }
    {
        manifest_tensor mt;
        memset(&mt, 0, sizeof mt);
        mt.name = (char *)short_name;
        mt.file = sh->file;
        mt.offset = t->begin;
        mt.length = t->end - t->begin;
        snprintf(mt.dtype, sizeof mt.dtype, "%s", st_dtype_name(t->dtype));
        mt.ndim = t->ndim;
        memcpy(mt.shape, t->shape, sizeof mt.shape);
        mt.is_spine = 1;
        return manifest_tensor_add(b->m, &mt, b->err);
    }
}

/* One expert: six records back to back in checkpoint order, each of the
 * size the config implies, one span of expert_bytes. */
static int check_expert(builder *b, uint32_t layer, uint32_t id, const uint64_t sizes[6])
{
    const rec *r = &b->recs[((size_t)layer * (size_t)b->cfg.n_experts + id) * 6];
    uint64_t total = 0;

    for (int i = 0; i < 6; i++) {
        if (!r[i].t)
            return shoal_err_set(b->err, SHOAL_EFORMAT, "MoE layer %" PRIu32 " expert %" PRIu32
                                 ": tensor 'language_model.model.layers.%" PRIu32
                                 ".block_sparse_moe.experts.%" PRIu32 ".%s' is missing",
                                 layer, id, layer, id, expert_records[i]);
        if (r[i].t->end - r[i].t->begin != sizes[i])
            return shoal_err_set(b->err, SHOAL_EFORMAT, "tensor '%s' is %" PRIu64 " bytes; the "
                                 "config implies %" PRIu64, r[i].t->name,
                                 r[i].t->end - r[i].t->begin, sizes[i]);
        if (i > 0 && (r[i].file != r[0].file || r[i].t->begin != r[i - 1].t->end))
            return shoal_err_set(b->err, SHOAL_EFORMAT, "tensor '%s' does not follow '%s' back to "
                                 "back in the same file: the expert is not one span",
                                 r[i].t->name, r[i - 1].t->name);
        total += sizes[i];
    }
    if (total != b->cfg.expert_bytes)
        return shoal_err_set(b->err, SHOAL_EFORMAT, "layer %" PRIu32 " expert %" PRIu32
                             ": span of %" PRIu64 " bytes, the config says %" PRIu64,
                             layer, id, total, b->cfg.expert_bytes);
    return manifest_expert_add(b->m, layer, id, r[0].file, r[0].t->begin, b->err);
}

static int add_experts(builder *b)
{
    uint64_t sizes[6];
    k3_expert_record_sizes(&b->cfg, sizes);
    for (uint32_t l = 0; l < (uint32_t)b->cfg.n_layers; l++) {
        for (uint32_t e = 0; e < (uint32_t)b->cfg.n_experts; e++) {
            const rec *r = &b->recs[((size_t)l * (size_t)b->cfg.n_experts + e) * 6];
            int rc;
            if (!b->cfg.layers[l].moe) {
                for (int i = 0; i < 6; i++)
                    if (r[i].t)
                        return shoal_err_set(b->err, SHOAL_EFORMAT, "tensor '%s': layer %" PRIu32
                                             " is dense in the config", r[i].t->name, l);
                continue;
            }
            rc = check_expert(b, l, e, sizes);
            if (rc)
                return rc;
        }
    }
    return 0;
}

static void builder_free(builder *b)
{
    for (size_t i = 0; i < b->nshards; i++) {
        free(b->shards[i].path);
        st_free(b->shards[i].st);
        free(b->shards[i].head);
        for (size_t g = 0; g < b->shards[i].ngaps; g++)
            free(b->shards[i].gaps[g].p);
        free(b->shards[i].gaps);
    }
    free(b->shards);
    free(b->entries);
    free(b->recs);
}

static void phase(const builder *b, const char *name, uint64_t done, uint64_t total)
{
    if (b->o && b->o->progress)
        b->o->progress(b->o->ctx, name, done, total);
}

/* The "index" phase's steps: config, the index, the optional files. */
#define INDEX_STEPS (2 + sizeof optional_files / sizeof *optional_files)

static int build(fetch_upstream *u, const fetch_build_opts *o, int keep, manifest **out,
                 fetch_keep **kept, shoal_err *err)
{
    builder b;
    uint8_t *cfg_bytes = NULL, *idx = NULL;
    size_t cfg_len = 0, idx_len = 0;
    shoal_json *cj = NULL, *ij = NULL, *wm;
    int rc;

    memset(&b, 0, sizeof b);
    b.u = u;
    b.o = o;
    b.keep = keep;
    b.err = err;
    phase(&b, "index", 0, INDEX_STEPS);
    b.m = manifest_new();
    if (!b.m)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    rc = manifest_set_model(b.m, up_model_endpoint(u), u->spec.repo, u->spec.revision,
                            u->commit, err);
    rc = rc ? rc : read_whole(u, b.m, "config.json", MANIFEST_CONFIG_MAX, &cfg_bytes, &cfg_len, err);
    rc = rc ? rc : manifest_set_config(b.m, cfg_bytes, cfg_len, err);
    if (rc == 0 && !(cj = shoal_json_parse((const char *)cfg_bytes, cfg_len, err)))
        rc = shoal_err_wrap(err, SHOAL_EFORMAT, "config.json");
    if (rc == 0 && (rc = k3_config_parse(cj, &b.cfg, err)) != 0)
        shoal_err_wrap(err, rc, "config.json");
    if (rc == 0)
        phase(&b, "index", 1, INDEX_STEPS);
    rc = rc ? rc : read_whole(u, b.m, INDEX_FILE, INDEX_MAX, &idx, &idx_len, err);
    if (rc == 0)
        phase(&b, "index", 2, INDEX_STEPS);
    if (rc == 0 && !(ij = shoal_json_parse((const char *)idx, idx_len, err)))
        rc = shoal_err_wrap(err, SHOAL_EFORMAT, "%s", INDEX_FILE);
    for (size_t i = 0; rc == 0 && i < sizeof optional_files / sizeof *optional_files; i++) {
        char etag[HUB_ETAG_MAX];
        uint64_t size;
        shoal_err e2;
        int r2 = up_stat(u, optional_files[i], etag, sizeof etag, &size, &e2);
        if (r2 == 0)
            rc = manifest_file_add(b.m, optional_files[i], etag, size, NULL, err);
        else if (r2 == SHOAL_EOFFLINE)   /* offline and not in any cache: as if absent */
            LOG_INFO("fetch", "%s: left out (%s)", optional_files[i], e2.msg);
        else if (r2 != SHOAL_ENOTFOUND)
            rc = shoal_err_set(err, r2, "%s", e2.msg);
        phase(&b, "index", 3 + i, INDEX_STEPS);
    }
    if (rc == 0) {
        wm = shoal_json_get(ij, "weight_map");
        if (!wm || shoal_json_typeof(wm) != SHOAL_JSON_OBJECT)
            rc = shoal_err_set(err, SHOAL_EFORMAT, "%s has no weight_map object", INDEX_FILE);
        else if (shoal_json_object_foreach(wm, on_weight, &b) != 0)
            rc = b.rc ? b.rc : SHOAL_EFORMAT;
    }
    if (rc == 0 && !(b.recs = calloc((size_t)b.cfg.n_layers * (size_t)b.cfg.n_experts * 6,
                                     sizeof *b.recs)))
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    rc = rc ? rc : read_headers(&b, err);
    if (rc == 0)
        phase(&b, "build", 0, 0);
    for (size_t i = 0; rc == 0 && i < b.nentries; i++)
        rc = add_entry(&b, &b.entries[i]);
    if (rc == 0) {
        b.m->n_layers = (uint32_t)b.cfg.n_layers;
        b.m->experts_per_layer = (uint32_t)b.cfg.n_experts;
        b.m->expert_bytes = b.cfg.expert_bytes;
        rc = add_experts(&b);
    }
    rc = rc ? rc : manifest_finish(b.m, err);
    if (rc == 0 && keep)
        rc = keep_build(u, b.m, &b, kept, err);
    builder_free(&b);
    shoal_json_free(cj);
    shoal_json_free(ij);
    free(cfg_bytes);
    free(idx);
    if (rc) {
        manifest_free(b.m);
        return rc;
    }
    *out = b.m;
    return 0;
}

/* ---- the manifest in the cache ------------------------------------------------------ */

static void manifest_key_etag(const fetch_upstream *u, char *out, size_t cap)
{
    char id[2 * HUB_URL_MAX];
    int n = u->local ? snprintf(id, sizeof id, "%s|%s|%s", u->endpoint, u->spec.repo, u->ident)
                     : snprintf(id, sizeof id, "%s|%s", u->endpoint, u->spec.repo);
    snprintf(out, cap, "manifest-v%d:%.200s:%016llx", MANIFEST_VERSION, u->commit,
             (unsigned long long)XXH64(id, (size_t)(n > 0 ? n : 0), 0));
}

static int load_cached(fetch_upstream *u, cache *c, manifest **out)
{
    cache_file cf;
    cache_obj obj;
    cache_key key;
    char etag[CACHE_ETAG_MAX];
    uint8_t *p;
    int rc;

    manifest_key_etag(u, etag, sizeof etag);
    if (cache_file_get(c, u->endpoint, u->spec.repo, u->commit, FETCH_MANIFEST_PATH, &cf, NULL)
        || strcmp(cf.etag, etag) != 0 || cf.size == 0 || cf.size > MANIFEST_ENCODED_MAX)
        return -1;
    key = (cache_key){ etag, 0, cf.size };
    if (cache_lookup(c, &key, NULL, &obj, NULL))
        return -1;
    p = malloc((size_t)obj.length);
    rc = p ? shoal_pread_all(obj.fd, p, (size_t)obj.length, 0) : -1;
    close(obj.fd);
    if (rc == 0)
        rc = manifest_decode(p, (size_t)obj.length, out, NULL);
    free(p);
    if (rc == 0 && strcmp((*out)->commit, u->commit) != 0) {
        manifest_free(*out);
        *out = NULL;
        rc = -1;
    }
    return rc ? -1 : 0;
}

/* ---- what a build keeps --------------------------------------------------------------- */

struct fetch_keep {
    fetch_keep_item *v;
    size_t   n, cap;
    char    *endpoint, *repo, *revision, *commit;   /* the names' model */
    char   **paths;                                 /* per item, owned */
    char   (*etags)[CACHE_ETAG_MAX + 1];
    uint8_t **data;
    cache_file manifest_rec;     /* recorded when the manifest item is done */
    size_t   manifest_item;      /* its index */
};

/* Add an item; data is taken (freed with the list, also on failure). */
static int keep_add(fetch_keep *k, const char *etag, uint64_t off, uint64_t len, cache_kind kind,
                    const char *path, uint8_t *data, int pin)
{
    if (k->n == k->cap) {
        size_t nc = k->cap ? k->cap * 2 : 16;
        void *a = realloc(k->v, nc * sizeof *k->v), *b2, *c2, *d2;
        if (a)
            k->v = a;
        b2 = realloc(k->paths, nc * sizeof *k->paths);
        if (b2)
            k->paths = b2;
        c2 = realloc(k->etags, nc * sizeof *k->etags);
        if (c2)
            k->etags = c2;
        d2 = realloc(k->data, nc * sizeof *k->data);
        if (d2)
            k->data = d2;
        if (!a || !b2 || !c2 || !d2) {
            free(data);
            return SHOAL_ENOMEM;
        }
        k->cap = nc;
    }
    snprintf(k->etags[k->n], sizeof k->etags[k->n], "%s", etag);
    k->paths[k->n] = strdup(path);
    k->data[k->n] = data;
    if (!k->paths[k->n]) {
        free(data);
        return SHOAL_ENOMEM;
    }
    k->v[k->n] = (fetch_keep_item){ { NULL, off, len }, kind, CACHE_NAMES_NONE, data, pin };
    k->n++;
    return 0;
}

/* Point every item at its strings (once the arrays stopped growing). */
static void keep_names(fetch_keep *k)
{
    for (size_t i = 0; i < k->n; i++) {
        cache_names *nm = &k->v[i].names;
        k->v[i].key.etag = k->etags[i];
        nm->endpoint = k->endpoint;
        nm->repo = k->repo;
        nm->revision = k->revision;
        nm->commit = k->commit;
        nm->file = k->paths[i];
    }
}

static int keep_build(fetch_upstream *u, const manifest *m, const builder *b, fetch_keep **out,
                      shoal_err *err)
{
    fetch_keep *k = calloc(1, sizeof *k);
    char etag[CACHE_ETAG_MAX];
    shoal_buf enc;
    int rc = k ? 0 : SHOAL_ENOMEM;

    shoal_buf_init(&enc, MANIFEST_ENCODED_MAX + 64);
    if (rc == 0 && (!(k->endpoint = strdup(up_model_endpoint(u))) ||
                    !(k->repo = strdup(u->spec.repo)) || !(k->revision = strdup(u->spec.revision)) ||
                    !(k->commit = strdup(u->commit))))
        rc = SHOAL_ENOMEM;
    if (rc == 0 && (rc = manifest_encode(m, &enc, err)) == 0) {
        uint8_t *p = malloc(enc.len ? enc.len : 1);
        manifest_key_etag(u, etag, sizeof etag);
        if (!p) {
            rc = SHOAL_ENOMEM;
        } else {
            memcpy(p, enc.data, enc.len);
            k->manifest_item = k->n;
            rc = keep_add(k, etag, 0, enc.len, CACHE_KIND_DERIVED, FETCH_MANIFEST_PATH, p, 1);
        }
        snprintf(k->manifest_rec.endpoint, sizeof k->manifest_rec.endpoint, "%s", u->endpoint);
        snprintf(k->manifest_rec.repo, sizeof k->manifest_rec.repo, "%s", u->spec.repo);
        snprintf(k->manifest_rec.commit, sizeof k->manifest_rec.commit, "%s", u->commit);
        snprintf(k->manifest_rec.path, sizeof k->manifest_rec.path, "%s", FETCH_MANIFEST_PATH);
        snprintf(k->manifest_rec.etag, sizeof k->manifest_rec.etag, "%s", etag);
        k->manifest_rec.size = enc.len;
    }
    for (size_t i = 0; rc == 0 && i < b->nshards; i++) {
        shard *sh = &b->shards[i];
        const up_file *uf = up_file_get(u, sh->path);
        if (!sh->head || (uf && uf->peer > 0))   /* the HF cache holds it: no copy */
            continue;
        rc = keep_add(k, sh->etag, 0, sh->head_len, CACHE_KIND_SMALL, sh->path, sh->head, 0);
        sh->head = NULL;
        for (size_t g = 0; rc == 0 && g < sh->ngaps; g++) {
            rc = keep_add(k, sh->etag, sh->gaps[g].off, sh->gaps[g].len, CACHE_KIND_SMALL,
                          sh->path, sh->gaps[g].p, 0);
            sh->gaps[g].p = NULL;
        }
    }
    shoal_buf_free(&enc);
    if (rc) {
        fetch_keep_free(k);
        return rc == SHOAL_ENOMEM ? shoal_err_set(err, rc, "out of memory") : rc;
    }
    keep_names(k);
    *out = k;
    return 0;
}

size_t fetch_keep_count(const fetch_keep *k)
{
    return k ? k->n : 0;
}

const fetch_keep_item *fetch_keep_at(const fetch_keep *k, size_t i)
{
    return k && i < k->n ? &k->v[i] : NULL;
}

int fetch_keep_done(fetch_keep *k, size_t i, cache *c, shoal_err *err)
{
    int rc = 0;
    if (i >= k->n)
        return 0;
    if (k->v[i].pin)
        rc = cache_pin(c, &k->v[i].key, 1, err);
    if (rc == 0 && i == k->manifest_item)
        rc = cache_file_put(c, &k->manifest_rec, err);
    return rc;
}

void fetch_keep_store(fetch_keep *k, cache *c)
{
    for (size_t i = 0; k && i < k->n; i++) {
        const fetch_keep_item *it = &k->v[i];
        cache_writer *w = NULL;
        shoal_err e = { 0 };
        int rc = cache_write_begin(c, &it->key, it->kind, &it->names, &w, &e);
        if (rc == 0) {
            rc = cache_write_append(w, it->data, (size_t)it->key.length, &e);
            if (rc)
                cache_write_abort(w);
            else
                rc = cache_write_commit(w, NULL, &e);
        }
        if (rc == 0 || rc == SHOAL_EEXIST)
            rc = fetch_keep_done(k, i, c, &e);
        if (rc)
            LOG_WARN("fetch", "keeping %s [%llu, +%llu) in the cache: %s", it->names.file,
                     (unsigned long long)it->key.offset, (unsigned long long)it->key.length,
                     e.msg);
    }
}

void fetch_keep_free(fetch_keep *k)
{
    if (!k)
        return;
    for (size_t i = 0; i < k->n; i++) {
        free(k->paths[i]);
        free(k->data[i]);
    }
    free(k->v);
    free(k->paths);
    free(k->etags);
    free(k->data);
    free(k->endpoint);
    free(k->repo);
    free(k->revision);
    free(k->commit);
    free(k);
}

int fetch_manifest_build(fetch_upstream *u, cache *c, const fetch_build_opts *o, manifest **out,
                         int *from_cache, fetch_keep **keep, shoal_err *err)
{
    int rc;
    *out = NULL;
    if (keep)
        *keep = NULL;
    if (from_cache)
        *from_cache = 0;
    if (c && load_cached(u, c, out) == 0) {
        if (from_cache)
            *from_cache = 1;
        return 0;
    }
    rc = build(u, o, keep != NULL, out, keep, err);
    if (rc)
        return rc;
    LOG_INFO("fetch", "manifest of %s@%s: %zu files, %zu tensors, %zu experts", u->spec.repo,
             u->commit, (*out)->nfiles, (*out)->ntensors, (*out)->nexperts);
    return 0;
}

int fetch_manifest_get(fetch_upstream *u, cache *c, manifest **out, int *from_cache,
                       shoal_err *err)
{
    fetch_keep *k = NULL;
    int rc = fetch_manifest_build(u, c, NULL, out, from_cache, c ? &k : NULL, err);
    if (rc == 0 && k)
        fetch_keep_store(k, c);
    fetch_keep_free(k);
    return rc;
}

/* ---- selections ----------------------------------------------------------------------- */

static int item_cmp(const void *a, const void *b)
{
    const fetch_item *x = a, *y = b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->length < y->length ? -1 : x->length > y->length;
}

static int is_shard(const char *path)
{
    size_t n = strlen(path);
    return n > 12 && strcmp(path + n - 12, ".safetensors") == 0;
}

int fetch_select(const manifest *m, const fetch_selection *sel, fetch_item **items, size_t *n,
                 shoal_err *err)
{
    size_t cap = m->nfiles + m->ntensors + m->nexperts + 1, k = 0;
    fetch_item *it = calloc(cap, sizeof *it);

    *items = NULL;
    *n = 0;
    if (!it)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; sel->small && i < m->nfiles; i++)
        if (!is_shard(m->files[i].path) && m->files[i].size > 0)
            it[k++] = (fetch_item){ CACHE_KIND_SMALL, (uint32_t)i, 0, m->files[i].size, -1, -1,
                                    NULL, FETCH_PRIO_DEMAND };
    for (size_t i = 0; sel->spine && i < m->ntensors; i++) {
        const manifest_tensor *t = &m->tensors[i];
        if (t->is_spine && t->length > 0)
            it[k++] = (fetch_item){ CACHE_KIND_SPINE, t->file, t->offset, t->length, -1, -1,
                                    t->name, FETCH_PRIO_DEMAND };
    }
    for (size_t i = 0; i < m->nexperts; i++) {
        const manifest_expert *e = &m->experts[i];
        if (sel->all_experts || (sel->layer_first >= 0 && (int64_t)e->layer >= sel->layer_first
                                 && (int64_t)e->layer <= sel->layer_last))
            it[k++] = (fetch_item){ CACHE_KIND_EXPERT, e->file, e->offset, m->expert_bytes,
                                    (int32_t)e->layer, (int32_t)e->id, NULL, FETCH_PRIO_DEMAND };
    }
    for (size_t i = 0; i < sel->npairs; i++) {
        const manifest_expert *e;
        if (sel->pairs[2 * i] < 0 || sel->pairs[2 * i + 1] < 0
            || !(e = manifest_expert_find(m, (uint32_t)sel->pairs[2 * i],
                                          (uint32_t)sel->pairs[2 * i + 1]))) {
            free(it);
            return shoal_err_set(err, SHOAL_ENOTFOUND, "the model has no expert %d of layer %d",
                                 sel->pairs[2 * i + 1], sel->pairs[2 * i]);
        }
        if (k == cap) {
            fetch_item *p = realloc(it, (cap *= 2) * sizeof *p);
            if (!p) {
                free(it);
                return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
            }
            it = p;
        }
        it[k++] = (fetch_item){ CACHE_KIND_EXPERT, e->file, e->offset, m->expert_bytes,
                                (int32_t)e->layer, (int32_t)e->id, NULL, FETCH_PRIO_DEMAND };
    }
    qsort(it, k, sizeof *it, item_cmp);
    {   /* drop duplicates (a pair also inside a layer range) */
        size_t w = 0;
        for (size_t i = 0; i < k; i++)
            if (w == 0 || item_cmp(&it[w - 1], &it[i]) != 0)
                it[w++] = it[i];
        k = w;
    }
    *items = it;
    *n = k;
    return 0;
}
