/* model.c — a synthetic model as a list of files, and synth_read().
 *
 * Owns: the file table (names, sizes, the rendered small files and shard
 * headers), the model key, and answering a byte range of any file.  Does
 * not own the tensor list (tensors.c) nor the values (weights.c).
 *
 * A shard is [8-byte length N][N bytes of JSON header][data]; the header
 * bytes are kept rendered, and the data of a range is generated from the
 * tensors covering it, found by binary search over the shard's tensors
 * (sorted by offset).  A range may start and end inside an element: the
 * partial elements go through a small scratch buffer.
 */
#include "synth/synth_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct synth_file {
    char      name[64];
    uint64_t  size;
    shoal_buf text;          /* the whole small file, or a shard's header */
    int       is_shard;
    size_t    lo, hi;        /* a shard's tensors [lo, hi) in ts */
} synth_file;

struct synth_model {
    synth_config  cfg;
    synth_tensors ts;
    synth_file   *files;
    size_t        nfiles;
    char          key[128];
    char          family[96];
};

static int file_add_text(synth_model *m, const char *name, int (*render)(const synth_config *,
                         shoal_buf *, shoal_err *), shoal_err *err)
{
    synth_file *f = &m->files[m->nfiles++];
    int rc;

    snprintf(f->name, sizeof f->name, "%s", name);
    shoal_buf_init(&f->text, 0);
    if ((rc = render(&m->cfg, &f->text, err)))
        return rc;
    f->size = f->text.len;
    return 0;
}

static int files_build(synth_model *m, shoal_err *err)
{
    synth_tensors *ts = &m->ts;
    size_t lo = 0;
    int rc;

    m->files = calloc((size_t)ts->shards + 4, sizeof *m->files);
    if (!m->files)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if ((rc = file_add_text(m, "config.json", synth_config_render, err)) ||
        (rc = file_add_text(m, "tokenizer_config.json", synth_tokenizer_config_render, err)) ||
        (rc = file_add_text(m, "tiktoken.model", synth_tiktoken_render, err)))
        return rc;
    for (int s = 0; s < ts->shards; s++) {
        synth_file *f = &m->files[m->nfiles++];
        size_t hi = lo;
        uint64_t data = 0;
        while (hi < ts->count && ts->t[hi].shard == s)
            data += ts->t[hi++].nbytes;
        synth_shard_name(s, ts->shards, f->name, sizeof f->name);
        shoal_buf_init(&f->text, 0);
        f->is_shard = 1;
        f->lo = lo;
        f->hi = hi;
        if ((rc = synth_header_render(ts, lo, hi, &f->text)))
            return shoal_err_set(err, rc, "out of memory rendering the header of %s", f->name);
        f->size = f->text.len + data;
        lo = hi;
    }
    synth_file *idx = &m->files[m->nfiles++];
    snprintf(idx->name, sizeof idx->name, "model.safetensors.index.json");
    shoal_buf_init(&idx->text, 0);
    if ((rc = synth_index_render(ts, &idx->text)))
        return shoal_err_set(err, rc, "out of memory rendering the index");
    idx->size = idx->text.len;
    return 0;
}

int synth_model_new(const synth_config *cfg, synth_model **out, shoal_err *err)
{
    synth_model *m = calloc(1, sizeof *m);
    int rc;

    *out = NULL;
    if (!m)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    m->cfg = *cfg;
    snprintf(m->key, sizeof m->key, "gen=%d preset=%s layers=%d experts=%d seed=%llu",
             SYNTH_GEN_VERSION, synth_preset_name(cfg->preset), cfg->layers, cfg->experts,
             (unsigned long long)cfg->seed);
    snprintf(m->family, sizeof m->family, "gen=%d preset=%s seed=%llu", SYNTH_GEN_VERSION,
             synth_preset_name(cfg->preset), (unsigned long long)cfg->seed);
    if ((rc = synth_tensors_build(&m->cfg, &m->ts, err)) || (rc = files_build(m, err))) {
        synth_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void synth_model_free(synth_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nfiles; i++)
        shoal_buf_free(&m->files[i].text);
    free(m->files);
    synth_tensors_free(&m->ts);
    free(m);
}

const synth_config *synth_model_config(const synth_model *m) { return &m->cfg; }
const char *synth_model_key(const synth_model *m) { return m->key; }
const char *synth_model_family(const synth_model *m) { return m->family; }
size_t synth_model_tensors(const synth_model *m) { return m->ts.count; }
int synth_model_shards(const synth_model *m) { return m->ts.shards; }
uint64_t synth_model_tensor_bytes(const synth_model *m) { return m->ts.total_bytes; }
size_t synth_file_count(const synth_model *m) { return m->nfiles; }

const char *synth_file_name(const synth_model *m, size_t i)
{
    return i < m->nfiles ? m->files[i].name : NULL;
}

uint64_t synth_file_size(const synth_model *m, size_t i)
{
    return i < m->nfiles ? m->files[i].size : 0;
}

int synth_file_is_shard(const synth_model *m, size_t i)
{
    return i < m->nfiles && m->files[i].is_shard;
}

uint64_t synth_file_header_size(const synth_model *m, size_t i)
{
    return i < m->nfiles ? m->files[i].text.len : 0;
}

long synth_file_find(const synth_model *m, const char *name)
{
    for (size_t i = 0; i < m->nfiles; i++)
        if (strcmp(m->files[i].name, name) == 0)
            return (long)i;
    return -1;
}

/* The tensor of f holding data byte `off` (relative to the data). */
static size_t tensor_at(const synth_model *m, const synth_file *f, uint64_t off)
{
    size_t lo = f->lo, hi = f->hi;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->ts.t[mid].begin <= off)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Bytes [a, a+n) of one tensor. */
static void tensor_read(const synth_tensor *t, uint64_t a, size_t n, uint8_t *out)
{
    unsigned es = synth_dtype_size(t->dtype);
    uint8_t tmp[8];

    if (a % es) {               /* the tail of a partial first element */
        size_t skip = (size_t)(a % es), k = es - skip < n ? es - skip : n;
        synth_fill(t, a / es, 1, tmp);
        memcpy(out, tmp + skip, k);
        out += k;
        a += k;
        n -= k;
    }
    if (n >= es) {
        size_t whole = n / es;
        synth_fill(t, a / es, whole, out);
        out += whole * es;
        a += whole * es;
        n -= whole * es;
    }
    if (n) {                    /* the head of a partial last element */
        synth_fill(t, a / es, 1, tmp);
        memcpy(out, tmp, n);
    }
}

int synth_read(const synth_model *m, size_t file, uint64_t off, size_t len, void *buf)
{
    uint8_t *out = buf;
    const synth_file *f;

    if (file >= m->nfiles)
        return SHOAL_EINVAL;
    f = &m->files[file];
    if (off > f->size || len > f->size - off)
        return SHOAL_ERANGE;
    if (off < f->text.len) {
        size_t k = f->text.len - off < len ? (size_t)(f->text.len - off) : len;
        memcpy(out, f->text.data + off, k);
        out += k;
        off += k;
        len -= k;
    }
    if (len == 0)
        return 0;
    off -= f->text.len;         /* now relative to the data */
    for (size_t i = tensor_at(m, f, off); len > 0; i++) {
        const synth_tensor *t = &m->ts.t[i];
        uint64_t a = off - t->begin;
        size_t k = t->nbytes - a < len ? (size_t)(t->nbytes - a) : len;
        tensor_read(t, a, k, out);
        out += k;
        off += k;
        len -= k;
    }
    return 0;
}
