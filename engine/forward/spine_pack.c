/* spine_pack.c — lay out, write and strictly parse the spine pack (see
 * forward.h part 3; the layout is documented in docs/engine.md).
 *
 *   header (64 bytes, little-endian)
 *     0  u8[8]  magic "SHLSPINE"
 *     8  u32    format (SPINE_PACK_FORMAT)
 *    12  u32    quantizer (SPINE_PACK_QUANT)
 *    16  u32    matrices n
 *    20  u32    spine mode (0 int8, 1 int4: common/k3_sizes.h)
 *    24  u64    XXH3-64 of config.json's bytes
 *    32  u64    table length T (the table starts at byte 64)
 *    40  u64    data offset (a multiple of 64, >= 64 + T)
 *    48  u64    total length (the pack's size)
 *    56  u64    XXH3-64 of the table
 *   table: n entries, in load order (common/k3_sizes.h's walk)
 *     u16 name length (1..255), name, u8 dtype (0 int8, 1 f32, 2 int4),
 *     u64 rows, u64 cols, u64 weights offset, u64 scales offset (0 for f32)
 *   data: int8 [rows][cols] + f32 scales [rows]; int4 packed
 *     [rows][cols/2] + BF16 scales [rows][cols/32]; or f32 [rows][cols];
 *     each array at a multiple of 64 from the pack's start.
 *
 * The layout depends on the config alone, so a writer lays it out and
 * writes the header and table before the first matrix exists, then each
 * matrix as the load makes it: a pack is built holding one matrix at a
 * time.
 */
#include "engine/forward/forward.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include "common/xxh3.h"

#include "common/buf.h"
#include "common/sys.h"

#define PACK_MAGIC      "SHLSPINE"
#define PACK_NAME_MAX   255
#define PACK_MAX_MATS   (1u << 20)
#define PACK_MAX_DIM    (1ull << 31)
#define STR_(x) #x
#define STR(x) STR_(x)
#define PACK_SUFFIX     "-p" STR(SPINE_PACK_FORMAT) "-q" STR(SPINE_PACK_QUANT)

typedef struct pack_entry {
    const char *name;          /* into the pack, not NUL-terminated */
    uint16_t name_len;
    uint8_t  dtype;            /* k3_fmt: 0 int8, 1 f32, 2 int4 */
    uint64_t rows, cols, w_off, s_off;
} pack_entry;

struct spine_pack {
    const uint8_t *data;
    uint64_t len;
    pack_entry *e;
    size_t n, next;
};

const char *spine_pack_name(engine_spine mode)
{
    switch (mode) {
    case ENGINE_SPINE_INT8: return "spine-int8" PACK_SUFFIX;
    case ENGINE_SPINE_INT4: return "spine-int4-g" STR(KERNELS_Q4_GROUP) PACK_SUFFIX;
    default: return NULL;
    }
}

static uint64_t align_up(uint64_t v)
{
    return (v + SPINE_PACK_ALIGN - 1) / SPINE_PACK_ALIGN * SPINE_PACK_ALIGN;
}

/* Bytes of an entry's weights and scales. */
static void entry_sizes(uint8_t dtype, uint64_t rows, uint64_t cols, uint64_t *w, uint64_t *sc)
{
    switch (dtype) {
    case K3_FMT_INT8: *w = rows * cols; *sc = rows * 4; break;
    case K3_FMT_INT4: *w = rows * (cols / 2); *sc = rows * (cols / KERNELS_Q4_GROUP) * 2; break;
    default: *w = rows * cols * 4; *sc = 0; break;
    }
}

/* ---- writing ------------------------------------------------------------------ */

typedef struct wentry {
    char name[96];
    uint8_t dtype;
    uint64_t rows, cols, w_off, s_off;
} wentry;

struct spine_pack_writer {
    int fd;
    wentry *e;
    size_t n, cap, next;
    uint64_t pos, total, done;
    XXH3_state_t *xs;
    shoal_buf tab;              /* the table, until begin writes it */
    uint8_t hdr[SPINE_PACK_HEADER];
};

static int w_write(spine_pack_writer *w, const void *p, size_t n, shoal_err *err)
{
    const uint8_t *b = p;
    size_t left = n;

    while (left > 0) {
        ssize_t r = pwrite(w->fd, b, left, (off_t)w->pos);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return shoal_err_set(err, errno == ENOSPC ? SHOAL_ENOSPC : SHOAL_EIO,
                                 "spine pack: write failed at byte %llu: %s",
                                 (unsigned long long)w->pos, strerror(r < 0 ? errno : EIO));
        shoal_xxh3_update(w->xs, b, (size_t)r);
        b += r;
        left -= (size_t)r;
        w->pos += (uint64_t)r;
    }
    return 0;
}

static int w_pad(spine_pack_writer *w, uint64_t to, shoal_err *err)
{
    static const uint8_t zero[4096];
    while (w->pos < to) {
        size_t n = to - w->pos < sizeof zero ? (size_t)(to - w->pos) : sizeof zero;
        int rc = w_write(w, zero, n, err);
        if (rc)
            return rc;
    }
    return 0;
}

static int w_layout(void *ctx, const k3_spine_mat *m)
{
    spine_pack_writer *w = ctx;
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 256;
        wentry *ne = realloc(w->e, cap * sizeof *ne);
        if (!ne)
            return SHOAL_ENOMEM;
        w->e = ne;
        w->cap = cap;
    }
    wentry *e = &w->e[w->n++];
    memset(e, 0, sizeof *e);
    memcpy(e->name, m->name, sizeof e->name);
    e->dtype = (uint8_t)m->fmt;
    e->rows = m->rows;
    e->cols = m->cols;
    return 0;
}

/* Offsets of every entry and the table's bytes. */
static int w_table(spine_pack_writer *w, shoal_buf *tab, uint64_t *data_off, shoal_err *err)
{
    size_t tlen = 0;
    uint64_t off;

    for (size_t i = 0; i < w->n; i++)
        tlen += 2 + strlen(w->e[i].name) + 1 + 32;
    *data_off = off = align_up(SPINE_PACK_HEADER + tlen);
    for (size_t i = 0; i < w->n; i++) {
        wentry *e = &w->e[i];
        size_t nl = strlen(e->name);
        uint64_t wb, sb;
        uint8_t rec[33];
        if (nl == 0 || nl > PACK_NAME_MAX)
            return shoal_err_set(err, SHOAL_EINVAL, "spine pack: tensor name of %zu bytes", nl);
        entry_sizes(e->dtype, e->rows, e->cols, &wb, &sb);
        e->w_off = off;
        off = align_up(off + wb);
        e->s_off = sb ? off : 0;
        off = align_up(off + sb);
        rec[0] = (uint8_t)nl;   /* u16 LE; nl <= 255 */
        rec[1] = 0;
        if (shoal_buf_append(tab, rec, 2) || shoal_buf_append(tab, e->name, nl))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        rec[0] = e->dtype;
        shoal_wr_le64(rec + 1, e->rows);
        shoal_wr_le64(rec + 9, e->cols);
        shoal_wr_le64(rec + 17, e->w_off);
        shoal_wr_le64(rec + 25, e->s_off);
        if (shoal_buf_append(tab, rec, 33))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    w->total = off;
    return 0;
}

int spine_pack_writer_new(const k3_config *c, engine_spine mode, const uint8_t *config,
                          size_t config_len, spine_pack_writer **out, shoal_err *err)
{
    spine_pack_writer *w = calloc(1, sizeof *w);
    uint8_t *hdr;
    uint64_t data_off = 0;
    int rc;

    *out = NULL;
    if (!w || !(w->xs = shoal_xxh3_new())) {
        free(w);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    shoal_buf_init(&w->tab, 0);
    hdr = w->hdr;
    w->fd = -1;
    shoal_xxh3_reset(w->xs);
    if (mode != ENGINE_SPINE_INT8 && mode != ENGINE_SPINE_INT4) {
        rc = shoal_err_set(err, SHOAL_EINVAL, "spine pack: only an int8 or int4 spine is packed");
        goto done;
    }
    if ((rc = k3_spine_walk(c, (k3_spine_mode)mode, w_layout, w)) != 0) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto done;
    }
    if (w->n == 0 || w->n > PACK_MAX_MATS) {
        rc = shoal_err_set(err, SHOAL_EINVAL, "spine pack: %zu matrices", w->n);
        goto done;
    }
    if ((rc = w_table(w, &w->tab, &data_off, err)) != 0)
        goto done;
    memcpy(hdr, PACK_MAGIC, 8);
    shoal_wr_le32(hdr + 8, SPINE_PACK_FORMAT);
    shoal_wr_le32(hdr + 12, SPINE_PACK_QUANT);
    shoal_wr_le32(hdr + 16, (uint32_t)w->n);
    shoal_wr_le32(hdr + 20, (uint32_t)mode);
    shoal_wr_le64(hdr + 24, XXH3_64bits(config, config_len));
    shoal_wr_le64(hdr + 32, w->tab.len);
    shoal_wr_le64(hdr + 40, data_off);
    shoal_wr_le64(hdr + 48, w->total);
    shoal_wr_le64(hdr + 56, XXH3_64bits(w->tab.data, w->tab.len));
done:
    if (rc != 0) {
        spine_pack_writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

uint64_t spine_pack_writer_length(const spine_pack_writer *w)
{
    return w->total;
}

int spine_pack_writer_begin(spine_pack_writer *w, int fd, shoal_err *err)
{
    int rc;
    if (w->fd >= 0 || w->pos != 0)
        return shoal_err_set(err, SHOAL_EINVAL, "spine pack: begun twice");
    w->fd = fd;
    if ((rc = w_write(w, w->hdr, sizeof w->hdr, err)) == 0)
        rc = w_write(w, w->tab.data, w->tab.len, err);
    shoal_buf_free(&w->tab);
    return rc;
}

uint64_t spine_pack_writer_done(const spine_pack_writer *w)
{
    return w->done;
}

int spine_pack_writer_put(spine_pack_writer *w, const char *name, const engine_mat *m,
                          shoal_err *err)
{
    const wentry *e;
    uint8_t dtype = (uint8_t)engine_mat_fmt(m);
    uint64_t wb, sb;
    const void *wp, *sp;
    int rc;

    if (w->fd < 0)
        return shoal_err_set(err, SHOAL_EINVAL, "spine pack: a matrix before the header");
    if (w->next >= w->n)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: %s after the layout's last "
                             "matrix", name);
    e = &w->e[w->next];
    if (strcmp(e->name, name) != 0 || e->rows != m->rows || e->cols != m->cols ||
        e->dtype != dtype)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: matrix %zu is %s %s [%zu, %zu], "
                             "the layout says %s %s [%llu, %llu]", w->next, name,
                             k3_fmt_name((k3_fmt)dtype), m->rows, m->cols, e->name,
                             k3_fmt_name((k3_fmt)e->dtype), (unsigned long long)e->rows,
                             (unsigned long long)e->cols);
    entry_sizes(dtype, e->rows, e->cols, &wb, &sb);
    wp = dtype == K3_FMT_INT8 ? (const void *)m->q8.q
         : dtype == K3_FMT_INT4 ? (const void *)m->q4.packed : (const void *)m->f32.w;
    sp = dtype == K3_FMT_INT8 ? (const void *)m->q8.scale : (const void *)m->q4.scale;
    if ((rc = w_pad(w, e->w_off, err)) || (rc = w_write(w, wp, (size_t)wb, err)))
        return rc;
    if (sb && ((rc = w_pad(w, e->s_off, err)) || (rc = w_write(w, sp, (size_t)sb, err))))
        return rc;
    w->done += wb + sb;
    w->next++;
    return 0;
}

int spine_pack_writer_finish(spine_pack_writer *w, uint8_t xxh128_out[16], shoal_err *err)
{
    XXH128_canonical_t can;
    int rc;

    if (w->fd < 0 || w->next != w->n)
        return shoal_err_set(err, SHOAL_EINVAL, "spine pack: %zu of %zu matrices written",
                             w->next, w->n);
    if ((rc = w_pad(w, w->total, err)) != 0)
        return rc;
    shoal_xxh3_digest(w->xs, can.digest);
    memcpy(xxh128_out, can.digest, 16);
    return 0;
}

void spine_pack_writer_free(spine_pack_writer *w)
{
    if (!w)
        return;
    shoal_xxh3_free(w->xs);
    shoal_buf_free(&w->tab);
    free(w->e);
    free(w);
}

int spine_pack_write(const engine_model *m, const uint8_t *config, size_t config_len, int fd,
                     uint64_t *len_out, uint8_t xxh128_out[16], shoal_err *err)
{
    const engine_spine_mat *mats;
    size_t n = engine_model_spine_mats(m, &mats);
    spine_pack_writer *w = NULL;
    int rc;

    if (m->opt.pack || m->build_only || n == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "spine pack: only a model quantized at this "
                             "load can be packed");
    if ((rc = spine_pack_writer_new(&m->cfg, m->opt.spine, config, config_len, &w, err)))
        return rc;
    rc = spine_pack_writer_begin(w, fd, err);
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = spine_pack_writer_put(w, mats[i].name, &mats[i].mat, err);
    if (rc == 0 && (rc = spine_pack_writer_finish(w, xxh128_out, err)) == 0)
        *len_out = w->total;
    spine_pack_writer_free(w);
    return rc;
}

/* ---- parsing ------------------------------------------------------------------ */

/* [off, off + size) inside [lo, len), aligned. */
static int range_ok(uint64_t off, uint64_t size, uint64_t lo, uint64_t len)
{
    return off % SPINE_PACK_ALIGN == 0 && off >= lo && off <= len && size <= len - off;
}

static int entry_parse(spine_pack *p, const uint8_t *t, uint64_t tlen, uint64_t *pos,
                       uint64_t data_off, pack_entry *e, size_t i, shoal_err *err)
{
    uint64_t wsize, ssize;

    if (tlen - *pos < 2)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: entry %zu past the table", i);
    e->name_len = shoal_rd_le16(t + *pos);
    *pos += 2;
    if (e->name_len == 0 || e->name_len > PACK_NAME_MAX || tlen - *pos < e->name_len + 33u)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: entry %zu: bad name length %u",
                             i, e->name_len);
    e->name = (const char *)t + *pos;
    *pos += e->name_len;
    if (memchr(e->name, 0, e->name_len))
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: entry %zu: NUL in its name", i);
    e->dtype = t[*pos];
    e->rows = shoal_rd_le64(t + *pos + 1);
    e->cols = shoal_rd_le64(t + *pos + 9);
    e->w_off = shoal_rd_le64(t + *pos + 17);
    e->s_off = shoal_rd_le64(t + *pos + 25);
    *pos += 33;
    if (e->dtype > 2 || e->rows == 0 || e->cols == 0 || e->rows >= PACK_MAX_DIM ||
        e->cols >= PACK_MAX_DIM || (e->dtype == K3_FMT_INT4 && e->cols % KERNELS_Q4_GROUP))
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: %.*s: dtype %u, [%llu, %llu]",
                             (int)e->name_len, e->name, e->dtype, (unsigned long long)e->rows,
                             (unsigned long long)e->cols);
    entry_sizes(e->dtype, e->rows, e->cols, &wsize, &ssize);
    if (!range_ok(e->w_off, wsize, data_off, p->len) ||
        (ssize && !range_ok(e->s_off, ssize, data_off, p->len)) ||
        (!ssize && e->s_off != 0))
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: %.*s: data outside the pack "
                             "or misaligned", (int)e->name_len, e->name);
    return 0;
}

int spine_pack_open(const uint8_t *data, uint64_t len, engine_spine mode, const uint8_t *config,
                    size_t config_len, spine_pack **out, shoal_err *err)
{
    spine_pack *p;
    uint64_t tlen, data_off, pos = 0;
    uint32_t n;
    int rc = 0;

    *out = NULL;
    if (len < SPINE_PACK_HEADER || memcmp(data, PACK_MAGIC, 8) != 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: not a pack (%llu bytes)",
                             (unsigned long long)len);
    if (shoal_rd_le32(data + 8) != SPINE_PACK_FORMAT ||
        shoal_rd_le32(data + 12) != SPINE_PACK_QUANT)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "spine pack: format %u quantizer %u, this "
                             "engine makes %u / %u", shoal_rd_le32(data + 8),
                             shoal_rd_le32(data + 12), SPINE_PACK_FORMAT, SPINE_PACK_QUANT);
    n = shoal_rd_le32(data + 16);
    tlen = shoal_rd_le64(data + 32);
    data_off = shoal_rd_le64(data + 40);
    if (shoal_rd_le32(data + 20) != (uint32_t)mode)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: made for the %s spine, not %s",
                             k3_spine_mode_name((k3_spine_mode)shoal_rd_le32(data + 20)),
                             k3_spine_mode_name((k3_spine_mode)mode));
    if (n == 0 || n > PACK_MAX_MATS ||
        shoal_rd_le64(data + 48) != len || tlen > len - SPINE_PACK_HEADER ||
        data_off % SPINE_PACK_ALIGN || data_off < SPINE_PACK_HEADER + tlen || data_off > len)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: inconsistent header");
    if (shoal_rd_le64(data + 24) != XXH3_64bits(config, config_len))
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: made for another config.json");
    if (shoal_rd_le64(data + 56) != XXH3_64bits(data + SPINE_PACK_HEADER, (size_t)tlen))
        return shoal_err_set(err, SHOAL_ECORRUPT, "spine pack: the table's hash does not match");
    if (!(p = calloc(1, sizeof *p)) || !(p->e = calloc(n, sizeof *p->e))) {
        free(p);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    p->data = data;
    p->len = len;
    p->n = n;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = entry_parse(p, data + SPINE_PACK_HEADER, tlen, &pos, data_off, &p->e[i], i, err);
    if (rc == 0 && pos != tlen)
        rc = shoal_err_set(err, SHOAL_EFORMAT, "spine pack: %llu bytes after the table's "
                           "last entry", (unsigned long long)(tlen - pos));
    if (rc) {
        spine_pack_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void spine_pack_free(spine_pack *p)
{
    if (!p)
        return;
    free(p->e);
    free(p);
}

size_t spine_pack_count(const spine_pack *p)
{
    return p->n;
}

int spine_pack_covers(const spine_pack *p, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i < p->n; i++)
        if (p->e[i].name_len == nl && memcmp(p->e[i].name, name, nl) == 0)
            return 1;
    return 0;
}

int spine_pack_next(spine_pack *p, const char *name, size_t rows, size_t cols, k3_fmt fmt,
                    engine_mat *out, shoal_err *err)
{
    const pack_entry *e;
    size_t nl = strlen(name);

    if (p->next >= p->n)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: ends before %s", name);
    e = &p->e[p->next];
    if (e->name_len != nl || memcmp(e->name, name, nl) != 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: matrix %zu is %.*s, the model "
                             "needs %s", p->next, (int)e->name_len, e->name, name);
    if (e->rows != rows || e->cols != cols || e->dtype != (uint8_t)fmt)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: %s is %s [%llu, %llu], the "
                             "config says %s [%zu, %zu]", name, k3_fmt_name((k3_fmt)e->dtype),
                             (unsigned long long)e->rows, (unsigned long long)e->cols,
                             k3_fmt_name(fmt), rows, cols);
    *out = (engine_mat){ .rows = rows, .cols = cols };
    if (fmt == K3_FMT_F32)
        out->f32 = (kernels_f32){ (const float *)(p->data + e->w_off), rows, cols };
    else if (fmt == K3_FMT_INT8)
        out->q8 = (kernels_q8){ (const int8_t *)(p->data + e->w_off),
                                (const float *)(p->data + e->s_off), rows, cols };
    else
        out->q4 = (kernels_q4){ p->data + e->w_off, p->data + e->s_off, rows, cols };
    p->next++;
    return 0;
}

size_t spine_pack_remaining(const spine_pack *p)
{
    return p->n - p->next;
}

void spine_pack_rewind(spine_pack *p)
{
    p->next = 0;
}
