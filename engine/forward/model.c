/* model.c — bind a K3-family snapshot directory (see forward.h part 2).
 *
 * Load order: config.json -> k3_config; model.safetensors.index.json's
 * weight_map (name -> shard file) or a lone model.safetensors; every shard
 * named there is mmap'd read-only and its header parsed (st_read_file).  Each
 * tensor is then looked up by its full name (language_model. + the k3.md §2
 * name), its dtype and shape checked, and either viewed in place (routed
 * experts, the embedding) or converted into a buffer the model owns.
 *
 * Does not own the forward pass, nor any per-sequence state.
 */
#include "engine/forward/forward.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/json.h"
#include "common/log.h"
#include "common/path.h"
#include "common/safetensors.h"
#include "engine/forward/stream_int.h"
#include "engine/plan/plan.h"

#define PREFIX "language_model."
#define NAME_MAX_LEN 256

typedef struct shard {
    char *name;
    const uint8_t *map;
    size_t size;
    st_file *st;
} shard;

/* A tensor handed in by engine_model_open_views (a shoald-bound model). */
typedef struct view_tensor {
    st_tensor t;                 /* t.name owned (strdup), without the prefix */
    const uint8_t *data;
} view_tensor;

struct engine_model_priv {
    shard *shards;
    size_t n_shards;
    shoal_json *weight_map;      /* NULL for a single-file model */
    view_tensor *views;          /* sorted by name; NULL for a directory model */
    size_t n_views;
    void (*release)(void *);     /* frees what the views point into */
    void *release_ctx;
    void **bufs;                 /* everything the model allocated */
    size_t n_bufs, cap_bufs;
    engine_spine_mat *mats;      /* derived matrices in load order (names owned) */
    size_t n_mats, cap_mats;
    spine_stream *stream;        /* the streamed part (opt.stream_layers); NULL: none */
    int stream_first;            /* its first layer (n_layers: none) */
    int cur_layer;               /* the layer being loaded; -1: the globals */
};

void engine_model_options_default(engine_model_options *o)
{
    *o = (engine_model_options){ .spine = ENGINE_SPINE_INT8, .alog = ENGINE_ALOG_PER_HEAD,
                                 .l2 = ENGINE_L2_FLA, .mla_eps = 1e-6, .pool = NULL };
}

k3_fmt engine_mat_fmt(const engine_mat *m)
{
    return m->q8.q ? K3_FMT_INT8 : m->q4.packed ? K3_FMT_INT4 : K3_FMT_F32;
}

engine_mat engine_mat_rows(const engine_mat *m, size_t r0, size_t n)
{
    engine_mat v = { .rows = n, .cols = m->cols };
    if (m->q8.q) {
        v.q8 = (kernels_q8){ m->q8.q + r0 * m->cols, m->q8.scale + r0, n, m->cols };
    } else if (m->q4.packed) {
        v.q4 = (kernels_q4){ m->q4.packed + r0 * (m->cols / 2),
                             m->q4.scale + r0 * (m->cols / KERNELS_Q4_GROUP) * 2, n, m->cols };
    } else {
        v.f32 = (kernels_f32){ m->f32.w + r0 * m->cols, n, m->cols };
    }
    return v;
}

int engine_mat_mul(kernels_pool *pool, const engine_mat *m, const float *x, size_t n,
                   float *y, kernels_act *act, shoal_err *err)
{
    int rc;
    if (!m->q8.q && !m->q4.packed)
        return kernels_f32_mul(pool, &m->f32, x, n, y, err);
    rc = kernels_act_quantize(act, x, m->cols, n, err);
    if (rc == 0)
        rc = m->q8.q ? kernels_q8_mul(pool, &m->q8, act, y, err)
                     : kernels_q4_mul(pool, &m->q4, act, y, err);
    return rc;
}

void engine_model_embed(const engine_model *m, int32_t token, float *out)
{
    size_t d = (size_t)m->cfg.hidden;
    if (m->embed_f32)
        memcpy(out, m->embed + (size_t)token * d * 4, d * sizeof(float));
    else
        kernels_bf16_to_f32(m->embed + (size_t)token * d * 2, out, d);
}

/* ---- ownership of derived buffers ---------------------------------------- */

static void *model_alloc(engine_model *m, size_t bytes, shoal_err *err)
{
    struct engine_model_priv *p = m->priv;
    void *b;

    if (p->n_bufs == p->cap_bufs) {
        size_t cap = p->cap_bufs ? p->cap_bufs * 2 : 256;
        void **nb = realloc(p->bufs, cap * sizeof *nb);
        if (!nb) {
            shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
            return NULL;
        }
        p->bufs = nb;
        p->cap_bufs = cap;
    }
    b = malloc(bytes ? bytes : 1);
    if (!b) {
        shoal_err_set(err, SHOAL_ENOMEM, "out of memory for %zu bytes", bytes);
        return NULL;
    }
    p->bufs[p->n_bufs++] = b;
    m->spine_bytes += bytes;
    return b;
}

/* ---- shards --------------------------------------------------------------- */

static int shard_open(const char *dir, const char *name, shard *s, shoal_err *err)
{
    char path[4096];
    struct stat sb;
    int fd, rc;
    void *map;

    if (strchr(name, '/') || strcmp(name, "..") == 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "index: shard name %s is not a plain file name", name);
    if (shoal_path_join(path, sizeof path, dir, name) != 0)
        return shoal_err_set(err, SHOAL_EINVAL, "%s/%s: path too long", dir, name);
    s->name = strdup(name);
    if (!s->name)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return shoal_err_set(err, errno == ENOENT ? SHOAL_ENOTFOUND : SHOAL_EIO,
                             "%s: %s", path, strerror(errno));
    rc = st_read_fd(fd, &s->st, err);
    if (rc != 0) {
        close(fd);
        return shoal_err_wrap(err, rc, "%s", path);
    }
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0) {
        close(fd);
        return shoal_err_set(err, SHOAL_EIO, "%s: cannot stat", path);
    }
    map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return shoal_err_set(err, SHOAL_EIO, "%s: mmap: %s", path, strerror(errno));
    s->map = map;
    s->size = (size_t)sb.st_size;
    return 0;
}

static int collect_shard(const char *key, shoal_json *value, void *ctx)
{
    struct { engine_model *m; const char *dir; shoal_err *err; } *c = ctx;
    struct engine_model_priv *p = c->m->priv;
    const char *name = shoal_json_str_value(value);

    (void)key;
    if (!name)
        return shoal_err_set(c->err, SHOAL_EFORMAT, "index: weight_map[%s] is not a string", key);
    for (size_t i = 0; i < p->n_shards; i++)
        if (strcmp(p->shards[i].name, name) == 0)
            return 0;
    shard *ns = realloc(p->shards, (p->n_shards + 1) * sizeof *ns);
    if (!ns)
        return shoal_err_set(c->err, SHOAL_ENOMEM, "out of memory");
    p->shards = ns;
    memset(&ns[p->n_shards], 0, sizeof *ns);
    p->n_shards++;
    return shard_open(c->dir, name, &ns[p->n_shards - 1], c->err);
}

static int shards_open(engine_model *m, const char *dir, shoal_err *err)
{
    struct engine_model_priv *p = m->priv;
    char path[4096];
    struct { engine_model *m; const char *dir; shoal_err *err; } ctx = { m, dir, err };
    shoal_json *root;
    int rc;

    if (shoal_path_join(path, sizeof path, dir, "model.safetensors.index.json") != 0)
        return shoal_err_set(err, SHOAL_EINVAL, "%s: path too long", dir);
    if (access(path, F_OK) != 0) {
        p->shards = calloc(1, sizeof *p->shards);
        if (!p->shards)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        p->n_shards = 1;
        return shard_open(dir, "model.safetensors", &p->shards[0], err);
    }
    root = shoal_json_load_file(path, (size_t)1 << 30, err);
    if (!root)
        return shoal_err_wrap(err, err ? err->code : SHOAL_EFORMAT, "%s", path);
    p->weight_map = root;
    if (shoal_json_typeof(shoal_json_get(root, "weight_map")) != SHOAL_JSON_OBJECT)
        return shoal_err_set(err, SHOAL_EFORMAT, "%s: no weight_map object", path);
    rc = shoal_json_object_foreach(shoal_json_get(root, "weight_map"), collect_shard, &ctx);
    return rc < 0 ? rc : (rc ? SHOAL_EFORMAT : 0);
}

/* ---- tensor lookup and checks --------------------------------------------- */

/* Find language tensor `name` (without the prefix): its header entry and
 * its bytes in the mapping. */
static int tensor_find(engine_model *m, const char *name, const st_tensor **t,
                       const uint8_t **data, shoal_err *err)
{
    struct engine_model_priv *p = m->priv;
    char full[NAME_MAX_LEN];
    const shard *s = NULL;

    if ((size_t)snprintf(full, sizeof full, PREFIX "%s", name) >= sizeof full)
        return shoal_err_set(err, SHOAL_EINVAL, "tensor name too long: %s", name);
    if (p->views) {
        size_t lo = 0, hi = p->n_views;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            int c = strcmp(p->views[mid].t.name, name);
            if (c == 0) {
                *t = &p->views[mid].t;
                *data = p->views[mid].data;
                return 0;
            }
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        return shoal_err_set(err, SHOAL_ENOTFOUND, "tensor %s: missing from the manifest", name);
    }
    if (p->weight_map) {
        const char *sn = shoal_json_str_value(
            shoal_json_get(shoal_json_get(p->weight_map, "weight_map"), full));
        if (!sn)
            return shoal_err_set(err, SHOAL_ENOTFOUND, "tensor %s: missing from the index", full);
        for (size_t i = 0; i < p->n_shards && !s; i++)
            if (strcmp(p->shards[i].name, sn) == 0)
                s = &p->shards[i];
    } else {
        s = &p->shards[0];
    }
    if (!s || !(*t = st_find(s->st, full)))
        return shoal_err_set(err, SHOAL_ENOTFOUND, "tensor %s: missing from %s", full,
                             s ? s->name : "its shard");
    *data = s->map + (*t)->begin;
    return 0;
}

static void shape_str(const uint64_t *dims, unsigned nd, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = 0;
    used += (size_t)snprintf(out, cap, "[");
    for (unsigned i = 0; i < nd && used < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%" PRIu64, i ? "," : "", dims[i]);
    if (used < cap)
        snprintf(out + used, cap - used, "]");
}

/* Check dtype (one of two, the second may be -1) and exact shape. */
static int tensor_check(const st_tensor *t, int dt1, int dt2, unsigned nd,
                        const uint64_t *dims, shoal_err *err)
{
    char got[128], want[128];
    int shape_ok = t->ndim == nd;

    for (unsigned i = 0; shape_ok && i < nd; i++)
        shape_ok = t->shape[i] == dims[i];
    if ((int)t->dtype != dt1 && (int)t->dtype != dt2)
        return shoal_err_set(err, SHOAL_EFORMAT, "tensor %s: dtype %s, expected %s%s%s", t->name,
                             st_dtype_name(t->dtype), st_dtype_name((st_dtype)dt1),
                             dt2 >= 0 ? " or " : "", dt2 >= 0 ? st_dtype_name((st_dtype)dt2) : "");
    if (!shape_ok) {
        shape_str(t->shape, t->ndim, got, sizeof got);
        shape_str(dims, nd, want, sizeof want);
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "tensor %s: shape %s does not match the config, expected %s",
                             t->name, got, want);
    }
    return 0;
}

/* A float vector (BF16 or F32) of exactly n values, widened into a model buffer. */
static int load_vec(engine_model *m, const char *name, size_t n, float **out, shoal_err *err)
{
    const st_tensor *t;
    const uint8_t *d;
    uint64_t dims[1] = { n };
    int rc = tensor_find(m, name, &t, &d, err);

    if (rc == 0)
        rc = tensor_check(t, ST_BF16, ST_F32, 1, dims, err);
    if (rc != 0)
        return rc;
    if (!(*out = model_alloc(m, n * sizeof(float), err)))
        return SHOAL_ENOMEM;
    if (t->dtype == ST_BF16)
        kernels_bf16_to_f32(d, *out, n);
    else
        memcpy(*out, d, n * sizeof(float));
    return 0;
}

/* sw = norm ⊙ proj for an AttnRes pair (norm [D], proj [1, D]). */
static int load_sw(engine_model *m, const char *norm, const char *proj, float **out,
                   shoal_err *err)
{
    size_t n = (size_t)m->cfg.hidden;
    const st_tensor *t;
    const uint8_t *d;
    uint64_t dims[2] = { 1, n };
    float *tmp;
    int rc = load_vec(m, norm, n, out, err);

    if (rc == 0)
        rc = tensor_find(m, proj, &t, &d, err);
    if (rc == 0)
        rc = tensor_check(t, ST_BF16, ST_F32, 2, dims, err);
    if (rc != 0)
        return rc;
    tmp = malloc(n * sizeof *tmp);
    if (!tmp)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if (t->dtype == ST_BF16)
        kernels_bf16_to_f32(d, tmp, n);
    else
        memcpy(tmp, d, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        (*out)[i] *= tmp[i];
    free(tmp);
    return 0;
}

typedef struct quant_job {
    const uint8_t *src;
    int bf16;
    size_t rows, cols;
    int8_t *q;
    float *scale;
    uint8_t *q4, *q4s; /* int4 output instead: packed and BF16 scales */
    float *f32;        /* f32 output instead of q/scale */
    int rc;
} quant_job;

static void quant_run(void *ctx, int tid, int nthreads)
{
    quant_job *j = ctx;
    size_t per = (j->rows + (size_t)nthreads - 1) / (size_t)nthreads;
    size_t r0 = (size_t)tid * per, r1 = r0 + per > j->rows ? j->rows : r0 + per;
    size_t esz = j->bf16 ? 2 : 4;
    int rc = 0;

    if (r0 >= r1)
        return;
    const uint8_t *src = j->src + r0 * j->cols * esz;
    if (j->q4) {
        uint8_t *pk = j->q4 + r0 * (j->cols / 2);
        uint8_t *sc = j->q4s + r0 * (j->cols / KERNELS_Q4_GROUP) * 2;
        rc = j->bf16 ? kernels_q4_quantize_bf16(src, r1 - r0, j->cols, pk, sc, NULL)
                     : kernels_q4_quantize_f32((const float *)src, r1 - r0, j->cols, pk, sc, NULL);
    } else if (j->f32) {
        if (j->bf16)
            kernels_bf16_to_f32(src, j->f32 + r0 * j->cols, (r1 - r0) * j->cols);
        else
            memcpy(j->f32 + r0 * j->cols, src, (r1 - r0) * j->cols * 4);
    } else if (j->bf16) {
        rc = kernels_q8_quantize_bf16(src, r1 - r0, j->cols, j->q + r0 * j->cols,
                                      j->scale + r0, NULL);
    } else {
        float *tmp = malloc((r1 - r0) * j->cols * sizeof *tmp);
        rc = tmp ? 0 : SHOAL_ENOMEM;
        if (tmp) {
            memcpy(tmp, src, (r1 - r0) * j->cols * 4);
            rc = kernels_q8_quantize_f32(tmp, r1 - r0, j->cols, j->q + r0 * j->cols,
                                         j->scale + r0, NULL);
            free(tmp);
        }
    }
    if (rc != 0)
        __atomic_store_n(&j->rc, rc, __ATOMIC_RELAXED);
}

/* Remember a derived matrix (for spine_pack_write). */
static int mat_record(engine_model *m, const char *name, const engine_mat *mat, shoal_err *err)
{
    struct engine_model_priv *p = m->priv;
    if (p->n_mats == p->cap_mats) {
        size_t cap = p->cap_mats ? p->cap_mats * 2 : 128;
        engine_spine_mat *nm = realloc(p->mats, cap * sizeof *nm);
        if (!nm)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        p->mats = nm;
        p->cap_mats = cap;
    }
    if (!(p->mats[p->n_mats].name = strdup(name)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    p->mats[p->n_mats++].mat = *mat;
    return 0;
}

size_t engine_model_spine_mats(const engine_model *m, const engine_spine_mat **out)
{
    *out = m->priv->mats;
    return m->priv->n_mats;
}

/* The next matrix from the pack instead of deriving it: the format the
 * mode gives a matrix of this part and width. */
static int mat_from_pack(engine_model *m, const char *name, size_t rows, size_t cols,
                         k3_part part, engine_mat *out, shoal_err *err)
{
    k3_fmt fmt = k3_spine_fmt((k3_spine_mode)m->opt.spine, part, cols);
    int rc = spine_pack_next(m->opt.pack, name, rows, cols, fmt, out, err);
    return rc ? rc : mat_record(m, name, out, err);
}

/* Buffers for a derived matrix of format fmt: the model's own, or (when
 * building a pack) one temporary block freed after the write. */
static int mat_bufs(engine_model *m, k3_fmt fmt, quant_job *j, engine_mat *out, void **tmp,
                    int streamed, shoal_err *err)
{
    size_t rows = j->rows, cols = j->cols;
    size_t wb = fmt == K3_FMT_F32 ? rows * cols * 4 : fmt == K3_FMT_INT8 ? rows * cols
                : kernels_q4_packed_bytes(rows, cols);
    size_t sb = fmt == K3_FMT_F32 ? 0 : fmt == K3_FMT_INT8 ? rows * 4
                : kernels_q4_scale_bytes(rows, cols);
    uint8_t *w, *sc = NULL;

    *tmp = NULL;
    if (m->opt.pack_out || streamed) {
        /* the scales after the weights, at a multiple of 4 bytes */
        if (!(*tmp = malloc((wb + 3) / 4 * 4 + sb + 1)))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for %zu bytes", wb + sb);
        w = *tmp;
        sc = w + (wb + 3) / 4 * 4;
    } else if (!(w = model_alloc(m, wb, err)) || (sb && !(sc = model_alloc(m, sb, err)))) {
        return SHOAL_ENOMEM;
    }
    if (fmt == K3_FMT_F32) {
        j->f32 = (float *)w;
        out->f32 = (kernels_f32){ j->f32, rows, cols };
    } else if (fmt == K3_FMT_INT8) {
        j->q = (int8_t *)w;
        j->scale = (float *)sc;
        out->q8 = (kernels_q8){ j->q, j->scale, rows, cols };
    } else {
        j->q4 = w;
        j->q4s = sc;
        out->q4 = (kernels_q4){ j->q4, j->q4s, rows, cols };
    }
    return 0;
}

/* Convert `rows` rows of `cols` BF16/F32 values at src into a matrix of
 * the format the spine mode gives `part` (common/k3_sizes.h); when
 * building a pack, write it there and keep nothing. */
static int mat_from(engine_model *m, const char *what, const uint8_t *src, int bf16,
                    size_t rows, size_t cols, k3_part part, engine_mat *out, shoal_err *err)
{
    quant_job j = { .src = src, .bf16 = bf16, .rows = rows, .cols = cols };
    k3_fmt fmt = k3_spine_fmt((k3_spine_mode)m->opt.spine, part, cols);
    struct engine_model_priv *p = m->priv;
    int streamed = p->stream && p->cur_layer >= p->stream_first && plan_part_streamed(part);
    void *tmp = NULL;
    int rc;

    *out = (engine_mat){ .rows = rows, .cols = cols };
    if ((rc = mat_bufs(m, fmt, &j, out, &tmp, streamed, err)) != 0)
        return rc;
    kernels_pool_run(m->opt.pool, quant_run, &j);
    if (j.rc != 0) {
        free(tmp);
        return shoal_err_set(err, j.rc, "tensor %s: cannot quantize (non-finite weight?)", what);
    }
    if (streamed) {       /* to the stream file; the layer's buffer holds it when it runs */
        size_t wb = fmt == K3_FMT_F32 ? rows * cols * 4 : fmt == K3_FMT_INT8 ? rows * cols
                    : kernels_q4_packed_bytes(rows, cols);
        size_t sb = fmt == K3_FMT_F32 ? 0 : fmt == K3_FMT_INT8 ? rows * 4
                    : kernels_q4_scale_bytes(rows, cols);
        rc = spine_stream_put(p->stream, p->cur_layer, out, fmt, tmp,
                              wb, (uint8_t *)tmp + (wb + 3) / 4 * 4, sb, err);
        free(tmp);
        return rc;
    }
    if (!m->opt.pack_out)
        return mat_record(m, what, out, err);
    rc = spine_pack_writer_put(m->opt.pack_out, what, out, err);
    free(tmp);
    *out = (engine_mat){ .rows = rows, .cols = cols };
    if (rc == 0 && m->opt.progress)
        m->opt.progress(m->opt.progress_ctx, "quantizing", spine_pack_writer_done(m->opt.pack_out),
                        spine_pack_writer_length(m->opt.pack_out));
    return rc;
}

/* A 2-D float weight [rows, cols] by name. */
static int load_mat(engine_model *m, const char *name, size_t rows, size_t cols, k3_part part,
                    engine_mat *out, shoal_err *err)
{
    const st_tensor *t;
    const uint8_t *d;
    uint64_t dims[2] = { rows, cols };
    int rc;

    if (m->opt.pack)
        return mat_from_pack(m, name, rows, cols, part, out, err);
    rc = tensor_find(m, name, &t, &d, err);
    if (rc == 0)
        rc = tensor_check(t, ST_BF16, ST_F32, 2, dims, err);
    if (rc != 0)
        return rc;
    return mat_from(m, name, d, t->dtype == ST_BF16, rows, cols, part, out, err);
}

/* ---- per-layer tensors (k3.md §2) ------------------------------------------ */

/* Names are at most NAME_MAX_LEN; a longer one is cut and then simply not
 * found, which the lookup reports with the (cut) name. */
static const char *name_fmt(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *name_fmt(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return buf;
}
#define NM(buf, ...) name_fmt(buf, sizeof buf, __VA_ARGS__)

static int kda_load(engine_model *m, const char *pre, engine_kda_w *w, shoal_err *err)
{
    const k3_config *c = &m->cfg;
    size_t d = (size_t)c->hidden, hk = (size_t)c->kda_heads, dk = (size_t)c->kda_head_dim;
    size_t p = hk * dk, kw = (size_t)c->kda_conv;
    char nm[NAME_MAX_LEN];
    const char *qkv[3] = { "q", "k", "v" };
    const st_tensor *t;
    const uint8_t *data;
    int rc;

    for (int i = 0; i < 3; i++) {
        engine_mat *dst = i == 0 ? &w->q : i == 1 ? &w->k : &w->v;
        if ((rc = load_mat(m, NM(nm, "%s%s_proj.weight", pre, qkv[i]), p, d, K3_PART_KDA_PROJ,
                           dst, err)))
            return rc;
    }
    if ((rc = load_mat(m, NM(nm, "%sg_proj.weight", pre), p, d, K3_PART_KDA_PROJ, &w->g, err)) ||
        (rc = load_mat(m, NM(nm, "%so_proj.weight", pre), d, p, K3_PART_KDA_PROJ, &w->o, err)) ||
        (rc = load_mat(m, NM(nm, "%sf_a_proj.weight", pre), dk, d, K3_PART_KDA_GATE, &w->fa, err)) ||
        (rc = load_mat(m, NM(nm, "%sf_b_proj.weight", pre), p, dk, K3_PART_KDA_GATE, &w->fb, err)) ||
        (rc = load_mat(m, NM(nm, "%sb_proj.weight", pre), hk, d, K3_PART_KDA_GATE, &w->b, err)) ||
        (rc = load_vec(m, NM(nm, "%sdt_bias", pre), p, (float **)&w->dt_bias, err)) ||
        (rc = load_vec(m, NM(nm, "%so_norm.weight", pre), dk, (float **)&w->o_norm, err)))
        return rc;
    for (int i = 0; i < 3; i++) {
        uint64_t dims[3] = { p, 1, kw };
        float *taps;
        if ((rc = tensor_find(m, NM(nm, "%s%s_conv1d.weight", pre, qkv[i]), &t, &data, err)) ||
            (rc = tensor_check(t, ST_F32, ST_BF16, 3, dims, err)))
            return rc;
        if (!(taps = model_alloc(m, p * kw * sizeof(float), err)))
            return SHOAL_ENOMEM;
        if (t->dtype == ST_BF16)
            kernels_bf16_to_f32(data, taps, p * kw);
        else
            memcpy(taps, data, p * kw * sizeof(float));
        w->conv[i] = taps;
    }
    /* A_log: K3 stores [head_dim] with the per-head values first and zero
     * padding after (k3.md §3.3); per-channel mode reads it by d instead. */
    if ((rc = tensor_find(m, NM(nm, "%sA_log", pre), &t, &data, err)))
        return rc;
    size_t need = m->opt.alog == ENGINE_ALOG_PER_HEAD ? hk : dk;
    if ((t->dtype != ST_F32 && t->dtype != ST_BF16) || t->ndim != 1 || t->numel < need)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "tensor %s: expected a 1-D F32 vector of at least %zu entries", t->name, need);
    float *alog = malloc(t->numel * sizeof *alog);
    if (!alog || !(w->A = model_alloc(m, p * sizeof(float), err))) {
        free(alog);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    if (t->dtype == ST_BF16)
        kernels_bf16_to_f32(data, alog, t->numel);
    else
        memcpy(alog, data, t->numel * sizeof(float));
    for (size_t h = 0; h < hk; h++)
        for (size_t j = 0; j < dk; j++)
            w->A[h * dk + j] = expf(alog[m->opt.alog == ENGINE_ALOG_PER_HEAD ? h : j]);
    free(alog);
    return 0;
}

/* kv_b [H·(nope+vd), kl] split into W_UKᵀ per head [kl, nope] (for the
 * absorbed score q·W_UK c = (W_UKᵀ q)·c) and W_UV per head [vd, kl]. */
static int kvb_load(engine_model *m, const char *pre, engine_mla_w *w, shoal_err *err)
{
    const k3_config *c = &m->cfg;
    size_t h = (size_t)c->n_heads, nope = (size_t)c->qk_nope_dim, vd = (size_t)c->v_head_dim;
    size_t kl = (size_t)c->kv_lora_rank, per = nope + vd;
    uint64_t dims[2] = { h * per, kl };
    char nm[NAME_MAX_LEN];
    const st_tensor *t;
    const uint8_t *data;
    float *all, *ukt, *uv;
    int rc;

    if (m->opt.pack) {
        NM(nm, "%skv_b_proj.weight", pre);
        if ((rc = mat_from_pack(m, nm, h * kl, nope, K3_PART_MLA, &w->ukt, err)) != 0)
            return rc;
        return mat_from_pack(m, nm, h * vd, kl, K3_PART_MLA, &w->uv, err);
    }
    if ((rc = tensor_find(m, NM(nm, "%skv_b_proj.weight", pre), &t, &data, err)) ||
        (rc = tensor_check(t, ST_BF16, ST_F32, 2, dims, err)))
        return rc;
    all = malloc(h * per * kl * sizeof *all);
    ukt = malloc(h * kl * nope * sizeof *ukt);
    uv = malloc(h * vd * kl * sizeof *uv);
    if (!all || !ukt || !uv) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto done;
    }
    if (t->dtype == ST_BF16)
        kernels_bf16_to_f32(data, all, h * per * kl);
    else
        memcpy(all, data, h * per * kl * sizeof *all);
    for (size_t hh = 0; hh < h; hh++) {
        const float *blk = all + hh * per * kl;
        for (size_t n = 0; n < nope; n++)
            for (size_t l = 0; l < kl; l++)
                ukt[(hh * kl + l) * nope + n] = blk[n * kl + l];
        memcpy(uv + hh * vd * kl, blk + nope * kl, vd * kl * sizeof *uv);
    }
    rc = mat_from(m, nm, (const uint8_t *)ukt, 0, h * kl, nope, K3_PART_MLA, &w->ukt, err);
    if (rc == 0)
        rc = mat_from(m, nm, (const uint8_t *)uv, 0, h * vd, kl, K3_PART_MLA, &w->uv, err);
done:
    free(all);
    free(ukt);
    free(uv);
    return rc;
}

static int mla_load(engine_model *m, const char *pre, engine_mla_w *w, shoal_err *err)
{
    const k3_config *c = &m->cfg;
    size_t d = (size_t)c->hidden, h = (size_t)c->n_heads;
    size_t ql = (size_t)c->q_lora_rank, kl = (size_t)c->kv_lora_rank;
    size_t qk = (size_t)(c->qk_nope_dim + c->qk_rope_dim), vd = (size_t)c->v_head_dim;
    char nm[NAME_MAX_LEN];
    int rc;

    if ((rc = load_mat(m, NM(nm, "%sq_a_proj.weight", pre), ql, d, K3_PART_MLA, &w->q_a, err)) ||
        (rc = load_vec(m, NM(nm, "%sq_a_layernorm.weight", pre), ql, (float **)&w->q_a_norm, err)) ||
        (rc = load_mat(m, NM(nm, "%sq_b_proj.weight", pre), h * qk, ql, K3_PART_MLA, &w->q_b, err)) ||
        (rc = load_mat(m, NM(nm, "%skv_a_proj_with_mqa.weight", pre), kl + (size_t)c->qk_rope_dim,
                       d, K3_PART_MLA, &w->kv_a, err)) ||
        (rc = load_vec(m, NM(nm, "%skv_a_layernorm.weight", pre), kl, (float **)&w->kv_a_norm, err)) ||
        (rc = kvb_load(m, pre, w, err)) ||
        (rc = load_mat(m, NM(nm, "%sg_proj.weight", pre), h * vd, d, K3_PART_MLA, &w->g, err)) ||
        (rc = load_mat(m, NM(nm, "%so_proj.weight", pre), d, h * vd, K3_PART_MLA, &w->o, err)))
        return rc;
    return 0;
}

static int mlp_load(engine_model *m, const char *pre, size_t inter, k3_part part,
                    engine_mlp_w *w, shoal_err *err)
{
    size_t d = (size_t)m->cfg.hidden;
    char nm[NAME_MAX_LEN];
    int rc;

    if ((rc = load_mat(m, NM(nm, "%sgate_proj.weight", pre), inter, d, part, &w->gate, err)) ||
        (rc = load_mat(m, NM(nm, "%sup_proj.weight", pre), inter, d, part, &w->up, err)) ||
        (rc = load_mat(m, NM(nm, "%sdown_proj.weight", pre), d, inter, part, &w->down, err)))
        return rc;
    return 0;
}

/* Locate expert e's six records and check they are back to back (k3.md §2):
 * the expert is then one span starting at w1.weight_packed. */
static int expert_locate(engine_model *m, int layer, int e, const uint8_t **span, shoal_err *err)
{
    static const char *rec[6] = { "w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                                  "w2.weight_scale", "w3.weight_packed", "w3.weight_scale" };
    uint64_t I = (uint64_t)m->cfg.moe_intermediate, L = (uint64_t)m->cfg.latent;
    uint64_t shapes[6][2] = { { I, L / 2 }, { I, L / 32 }, { L, I / 2 },
                              { L, I / 32 }, { I, L / 2 }, { I, L / 32 } };
    char nm[NAME_MAX_LEN];
    const st_tensor *t;
    const uint8_t *data, *first = NULL, *prev_ptr = NULL;
    uint64_t prev_end = 0;
    int rc;

    for (int i = 0; i < 6; i++) {
        NM(nm, "model.layers.%d.block_sparse_moe.experts.%d.%s", layer, e, rec[i]);
        if ((rc = tensor_find(m, nm, &t, &data, err)) ||
            (rc = tensor_check(t, ST_U8, -1, 2, shapes[i], err)))
            return rc;
        if (i == 0)
            first = data;
        else if (t->begin != prev_end || data != prev_ptr)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "tensor %s: not right after the previous record of expert %d "
                                 "(the six records must be one contiguous span)", t->name, e);
        prev_end = t->end;
        prev_ptr = data + (t->end - t->begin);
    }
    if ((uint64_t)(prev_ptr - first) != m->cfg.expert_bytes)
        return shoal_err_set(err, SHOAL_EINTERNAL, "layer %d expert %d: span of %zu bytes",
                             layer, e, (size_t)(prev_ptr - first));
    *span = first;
    return 0;
}

static int moe_load(engine_model *m, int layer, const char *pre, engine_moe_w *w,
                    shoal_err *err)
{
    const k3_config *c = &m->cfg;
    size_t d = (size_t)c->hidden, ne = (size_t)c->n_experts, lat = (size_t)c->latent;
    size_t shared = (size_t)(c->n_shared_experts * c->moe_intermediate);
    char nm[NAME_MAX_LEN], sp[NAME_MAX_LEN];
    int rc;

    if ((rc = load_mat(m, NM(nm, "%sgate.weight", pre), ne, d, K3_PART_ROUTER, &w->gate, err)) ||
        (rc = load_vec(m, NM(nm, "%sgate.e_score_correction_bias", pre), ne, (float **)&w->bias, err)) ||
        (rc = load_mat(m, NM(nm, "%srouted_expert_down_proj.weight", pre), lat, d, K3_PART_LATENT,
                       &w->down, err)) ||
        (rc = load_mat(m, NM(nm, "%srouted_expert_up_proj.weight", pre), d, lat, K3_PART_LATENT,
                       &w->up, err)) ||
        (rc = load_vec(m, NM(nm, "%srouted_expert_norm.weight", pre), lat, (float **)&w->norm, err)) ||
        (rc = mlp_load(m, NM(sp, "%sshared_experts.", pre), shared, K3_PART_SHARED, &w->shared, err)))
        return rc;
    w->span = model_alloc(m, ne * sizeof *w->span, err);
    if (!w->span)
        return SHOAL_ENOMEM;
    memset(w->span, 0, ne * sizeof *w->span);
    if (m->priv->views)          /* experts come from an expert source, not a mapping */
        return 0;
    for (size_t e = 0; e < ne; e++)
        if ((rc = expert_locate(m, layer, (int)e, &w->span[e], err)))
            return rc;
    return 0;
}

static int layer_load(engine_model *m, int i, shoal_err *err)
{
    engine_layer_w *w = &m->layers[i];
    size_t d = (size_t)m->cfg.hidden;
    char pre[NAME_MAX_LEN], a[NAME_MAX_LEN], b[NAME_MAX_LEN];
    int rc;

    w->info = m->cfg.layers[i];
    m->priv->cur_layer = i;
    NM(pre, "model.layers.%d.", i);
    if ((rc = load_vec(m, NM(a, "%sinput_layernorm.weight", pre), d, (float **)&w->in_norm, err)) ||
        (rc = load_vec(m, NM(a, "%spost_attention_layernorm.weight", pre), d,
                       (float **)&w->post_norm, err)) ||
        (rc = load_sw(m, NM(a, "%sself_attention_res_norm.weight", pre),
                      NM(b, "%sself_attention_res_proj.weight", pre), &w->attn_sw, err)) ||
        (rc = load_sw(m, NM(a, "%smlp_res_norm.weight", pre), NM(b, "%smlp_res_proj.weight", pre),
                      &w->mlp_sw, err)))
        return rc;
    NM(a, "%sself_attn.", pre);
    rc = w->info.attn == K3_ATTN_KDA ? kda_load(m, a, &w->kda, err) : mla_load(m, a, &w->mla, err);
    if (rc != 0)
        return rc;
    if (w->info.moe)
        return moe_load(m, i, NM(a, "%sblock_sparse_moe.", pre), &w->moe, err);
    return mlp_load(m, NM(a, "%smlp.", pre), (size_t)m->cfg.intermediate, K3_PART_DENSE,
                    &w->dense, err);
}

/* ---- open / free ---------------------------------------------------------- */

static int globals_load(engine_model *m, shoal_err *err)
{
    size_t d = (size_t)m->cfg.hidden, v = (size_t)m->cfg.vocab;
    const st_tensor *t;
    const uint8_t *data;
    uint64_t dims[2] = { v, d };
    int rc = tensor_find(m, "model.embed_tokens.weight", &t, &data, err);

    if (rc == 0)
        rc = tensor_check(t, ST_BF16, ST_F32, 2, dims, err);
    if (rc != 0)
        return rc;
    m->embed = data;
    m->embed_f32 = t->dtype == ST_F32;
    if ((rc = load_sw(m, "model.output_attn_res_norm.weight",
                      "model.output_attn_res_proj.weight", &m->out_sw, err)) != 0)
        return rc;
    if ((rc = load_vec(m, "model.norm.weight", d, (float **)&m->final_norm, err)) != 0)
        return rc;
    return load_mat(m, "lm_head.weight", v, d, K3_PART_HEAD, &m->lm_head, err);
}

/* An empty model carrying the options; NULL when out of memory. */
static engine_model *model_alloc_empty(const engine_model_options *opt)
{
    engine_model *m = calloc(1, sizeof *m);
    if (!m || !(m->priv = calloc(1, sizeof *m->priv))) {
        free(m);
        return NULL;
    }
    if (opt)
        m->opt = *opt;
    else
        engine_model_options_default(&m->opt);
    return m;
}

/* The streamed part, when the options ask for one. */
static int stream_begin(engine_model *m, shoal_err *err)
{
    struct engine_model_priv *p = m->priv;
    int n = (int)m->cfg.n_layers, k = m->opt.stream_layers;

    p->stream_first = n;
    if (k <= 0)
        return 0;
    if (m->opt.pack || m->opt.pack_out)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "a streamed spine is derived at load, not "
                             "bound from a spine pack");
    p->stream_first = k >= n ? 0 : n - k;
    return spine_stream_open(m->opt.stream_dir, n, p->stream_first, &p->stream, err);
}

int engine_model_layer_ready(const engine_model *m, int layer, shoal_err *err)
{
    return m->priv ? spine_stream_ready(m->priv->stream, layer, err) : 0;
}

/* The bytes matrix x spans (weights and scales). */
static void mat_span(const engine_mat *x, const uint8_t **lo, const uint8_t **hi)
{
    const uint8_t *w, *sc = NULL;
    size_t wb, sb = 0;
    if (x->q8.q) {
        w = (const uint8_t *)x->q8.q, sc = (const uint8_t *)x->q8.scale;
        wb = x->rows * x->cols, sb = x->rows * 4;
    } else if (x->q4.packed) {
        w = x->q4.packed, sc = x->q4.scale;
        wb = kernels_q4_packed_bytes(x->rows, x->cols), sb = kernels_q4_scale_bytes(x->rows, x->cols);
    } else {
        w = (const uint8_t *)x->f32.w, wb = x->rows * x->cols * 4;
    }
    *lo = sc && sc < w ? sc : w;
    *hi = sc && sc + sb > w + wb ? sc + sb : w + wb;
}

int engine_model_stream_pack(engine_model *m, int first, int fd, uint64_t file_off,
                             uint8_t *pack, uint64_t *resident_end, shoal_err *err)
{
    struct engine_model_priv *p = m->priv;
    int n = (int)m->cfg.n_layers, rc;
    uint8_t **lo = calloc((size_t)n, sizeof *lo), **hi = calloc((size_t)n, sizeof *hi);

    if (!lo || !hi) {
        free(lo);
        free(hi);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    *resident_end = UINT64_MAX;
    for (size_t i = 0; i < p->n_mats; i++) {          /* every matrix as the pack bound it */
        const char *nm = p->mats[i].name;
        const uint8_t *a, *b;
        char *end;
        long l;
        if (strncmp(nm, "model.layers.", 13) != 0)
            continue;
        l = strtol(nm + 13, &end, 10);
        if (l < first || l >= n)
            continue;
        mat_span(&p->mats[i].mat, &a, &b);
        if (!lo[l] || a < lo[l])
            lo[l] = (uint8_t *)a;
        if (!hi[l] || b > hi[l])
            hi[l] = (uint8_t *)b;
        if ((uint64_t)(a - pack) < *resident_end)
            *resident_end = (uint64_t)(a - pack);
    }
    rc = 0;
    for (int l = first; l < n && rc == 0; l++)
        if (!lo[l])
            rc = shoal_err_set(err, SHOAL_EINTERNAL, "streamed spine: layer %d has no matrix", l);
    if (rc == 0)
        rc = spine_stream_inplace(fd, file_off, pack, n, first, lo, hi, &p->stream, err);
    for (int l = first; l < n && rc == 0; l++)       /* the lookahead reads routers ahead */
        if (m->layers[l].info.moe)
            rc = spine_stream_keep(p->stream, &m->layers[l].moe.gate, file_off, pack, err);
    free(lo);
    free(hi);
    if (rc == 0)
        p->stream_first = first;
    return rc;
}

int engine_model_stream_region(const engine_model *m, int layer, uint64_t *off, uint64_t *len)
{
    return m->priv ? spine_stream_region(m->priv->stream, layer, off, len) : SHOAL_EINVAL;
}

void engine_model_stream_expect(engine_model *m, int layer, const uint8_t xxh[16])
{
    if (m->priv)
        spine_stream_expect(m->priv->stream, layer, xxh);
}

void engine_model_stream_on_damaged(engine_model *m, engine_stream_damaged_fn fn, void *ctx)
{
    if (m->priv)
        spine_stream_on_damaged(m->priv->stream, fn, ctx);
}

void engine_model_stream_stats(const engine_model *m, engine_stream_stats *out)
{
    memset(out, 0, sizeof *out);
    out->first_layer = (int)m->cfg.n_layers;
    if (m->priv && m->priv->stream)
        spine_stream_stats(m->priv->stream, out);
}

/* Everything after the config and the tensor lookup are in place. */
static int model_bind(engine_model *m, const char *label, shoal_err *err)
{
    int rc;

    if ((m->opt.pack || m->opt.pack_out) && m->opt.spine == ENGINE_SPINE_F32)
        return shoal_err_set(err, SHOAL_EINVAL, "a spine pack holds an int8 or int4 spine only");
    if (m->opt.pack && m->opt.pack_out)
        return shoal_err_set(err, SHOAL_EINVAL, "a model is bound from a pack or builds one");
    if (m->opt.pack)
        spine_pack_rewind(m->opt.pack);
    m->build_only = m->opt.pack_out != NULL;
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if ((rc = stream_begin(m, err)) != 0)
        return rc;
    m->priv->cur_layer = -1;
    if ((rc = globals_load(m, err)) != 0)
        return rc;
    for (int64_t i = 0; i < m->cfg.n_layers && rc == 0; i++)
        rc = layer_load(m, (int)i, err);
    if (rc == 0 && m->priv->stream)
        rc = spine_stream_seal(m->priv->stream, err);
    if (rc == 0 && m->opt.pack && spine_pack_remaining(m->opt.pack) != 0)
        rc = shoal_err_set(err, SHOAL_EFORMAT, "spine pack: %zu matrices more than the model "
                           "has", spine_pack_remaining(m->opt.pack));
    if (rc == 0)
        LOG_INFO("model", "%s: %" PRId64 " layers, spine %s%s, %.1f MiB derived", label,
                 m->cfg.n_layers, k3_spine_mode_name((k3_spine_mode)m->opt.spine),
                 m->opt.pack ? " (from the pack)" : m->opt.pack_out ? " (pack built)" : "",
                 (double)m->spine_bytes / 1048576.0);
    return rc;
}

int engine_model_open(const char *dir, const engine_model_options *opt,
                      engine_model **out, shoal_err *err)
{
    char path[4096];
    engine_model *m;
    int rc;

    *out = NULL;
    if (!(m = model_alloc_empty(opt)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if (shoal_path_join(path, sizeof path, dir, "config.json") != 0) {
        rc = shoal_err_set(err, SHOAL_EINVAL, "%s: path too long", dir);
        goto done;
    }
    if ((rc = k3_config_load(path, &m->cfg, err)) != 0) {
        shoal_err_wrap(err, rc, "%s", path);
        goto done;
    }
    if ((rc = shards_open(m, dir, err)) != 0)
        goto done;
    rc = model_bind(m, dir, err);
done:
    if (rc != 0) {
        engine_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

static int view_cmp(const void *a, const void *b)
{
    return strcmp(((const view_tensor *)a)->t.name, ((const view_tensor *)b)->t.name);
}

/* Copy and check the callers' views: dtype known, bytes = numel·bits/8. */
static int views_take(engine_model *m, const engine_tensor_view *v, size_t n, shoal_err *err)
{
    struct engine_model_priv *p = m->priv;

    p->views = calloc(n ? n : 1, sizeof *p->views);
    if (!p->views)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        view_tensor *vt = &p->views[i];
        uint64_t numel = 1;
        if (!(vt->t.name = strdup(v[i].name)))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        p->n_views = i + 1;
        if (st_dtype_parse(v[i].dtype, &vt->t.dtype) != 0)
            return shoal_err_set(err, SHOAL_EUNSUPPORTED, "tensor %s: dtype %s", v[i].name,
                                 v[i].dtype);
        if (v[i].ndim > ST_MAX_DIMS)
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor %s: %u dimensions", v[i].name,
                                 v[i].ndim);
        vt->t.ndim = v[i].ndim;
        for (unsigned d = 0; d < v[i].ndim; d++) {
            vt->t.shape[d] = v[i].shape[d];
            if (v[i].shape[d] && numel > UINT64_MAX / 64 / v[i].shape[d])
                return shoal_err_set(err, SHOAL_EFORMAT, "tensor %s: shape too large", v[i].name);
            numel *= v[i].shape[d];
        }
        vt->t.numel = numel;
        vt->t.begin = 0;
        vt->t.end = v[i].length;
        if (numel * st_dtype_bits(vt->t.dtype) != v[i].length * 8)
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor %s: %" PRIu64 " bytes for %" PRIu64
                                 " %s values", v[i].name, v[i].length, numel, v[i].dtype);
        vt->data = v[i].data;
    }
    qsort(p->views, n, sizeof *p->views, view_cmp);
    for (size_t i = 1; i < n; i++)
        if (strcmp(p->views[i - 1].t.name, p->views[i].t.name) == 0)
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor %s listed twice", p->views[i].t.name);
    return 0;
}

int engine_model_open_views(const char *label, const uint8_t *config, size_t config_len,
                            const engine_tensor_view *views, size_t n,
                            void (*release)(void *), void *release_ctx,
                            const engine_model_options *opt, engine_model **out, shoal_err *err)
{
    engine_model *m;
    shoal_json *root;
    int rc;

    *out = NULL;
    if (!(m = model_alloc_empty(opt))) {
        if (release)
            release(release_ctx);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    m->priv->release = release;
    m->priv->release_ctx = release_ctx;
    root = shoal_json_parse((const char *)config, config_len, err);
    if (!root) {
        rc = shoal_err_wrap(err, err && err->code ? err->code : SHOAL_EFORMAT, "%s: config.json",
                            label);
        goto done;
    }
    rc = k3_config_parse(root, &m->cfg, err);
    shoal_json_free(root);
    if (rc != 0) {
        shoal_err_wrap(err, rc, "%s: config.json", label);
        goto done;
    }
    if ((rc = views_take(m, views, n, err)) != 0)
        goto done;
    rc = model_bind(m, label, err);
done:
    if (rc != 0) {
        engine_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void engine_model_free(engine_model *m)
{
    if (!m)
        return;
    if (m->priv) {
        struct engine_model_priv *p = m->priv;
        spine_stream_free(p->stream);
        for (size_t i = 0; i < p->n_bufs; i++)
            free(p->bufs[i]);
        free(p->bufs);
        for (size_t i = 0; i < p->n_mats; i++)
            free((char *)p->mats[i].name);
        free(p->mats);
        for (size_t i = 0; i < p->n_shards; i++) {
            if (p->shards[i].map)
                munmap((void *)p->shards[i].map, p->shards[i].size);
            st_free(p->shards[i].st);
            free(p->shards[i].name);
        }
        free(p->shards);
        shoal_json_free(p->weight_map);
        for (size_t i = 0; i < p->n_views; i++)
            free((char *)p->views[i].t.name);
        free(p->views);
        if (p->release)
            p->release(p->release_ctx);
        free(p);
    }
    free(m->layers);
    free(m);
}
