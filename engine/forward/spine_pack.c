/* spine_pack.c — write and strictly parse the int8 spine pack (see
 * forward.h part 3; the layout is documented in docs/engine.md).
 *
 *   header (64 bytes, little-endian)
 *     0  u8[8]  magic "SHLSPINE"
 *     8  u32    format (SPINE_PACK_FORMAT)
 *    12  u32    quantizer (SPINE_PACK_QUANT)
 *    16  u32    matrices n
 *    20  u32    flags (0)
 *    24  u64    XXH3-64 of config.json's bytes
 *    32  u64    table length T (the table starts at byte 64)
 *    40  u64    data offset (a multiple of 64, >= 64 + T)
 *    48  u64    total length (the pack's size)
 *    56  u64    XXH3-64 of the table
 *   table: n entries, in load order
 *     u16 name length (1..255), name, u8 dtype (0 int8, 1 f32),
 *     u64 rows, u64 cols, u64 weights offset, u64 scales offset (0 for f32)
 *   data: int8 [rows][cols] + f32 scales [rows], or f32 [rows][cols]; each
 *     array at a multiple of 64 from the pack's start.
 */
#include "engine/forward/forward.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/buf.h"
#include "common/sys.h"

#define PACK_MAGIC      "SHLSPINE"
#define PACK_NAME_MAX   255
#define PACK_MAX_MATS   (1u << 20)
#define PACK_MAX_DIM    (1ull << 31)

typedef struct pack_entry {
    const char *name;          /* into the pack, not NUL-terminated */
    uint16_t name_len;
    uint8_t  dtype;            /* 0 int8, 1 f32 */
    uint64_t rows, cols, w_off, s_off;
} pack_entry;

struct spine_pack {
    const uint8_t *data;
    uint64_t len;
    pack_entry *e;
    size_t n, next;
};

static uint64_t align_up(uint64_t v)
{
    return (v + SPINE_PACK_ALIGN - 1) / SPINE_PACK_ALIGN * SPINE_PACK_ALIGN;
}

/* ---- writing ------------------------------------------------------------------ */

typedef struct pack_out {
    int fd;
    uint64_t pos;
    XXH3_state_t *xs;
} pack_out;

static int out_write(pack_out *o, const void *p, size_t n, shoal_err *err)
{
    if (n == 0)
        return 0;
    if (shoal_write_all(o->fd, p, n) != 0)
        return shoal_err_set(err, SHOAL_EIO, "spine pack: write failed at byte %llu",
                             (unsigned long long)o->pos);
    XXH3_128bits_update(o->xs, p, n);
    o->pos += n;
    return 0;
}

static int out_pad(pack_out *o, uint64_t to, shoal_err *err)
{
    static const uint8_t zero[SPINE_PACK_ALIGN];
    while (o->pos < to) {
        size_t n = to - o->pos < sizeof zero ? (size_t)(to - o->pos) : sizeof zero;
        int rc = out_write(o, zero, n, err);
        if (rc)
            return rc;
    }
    return 0;
}

static int pack_table(const engine_spine_mat *mats, size_t n, shoal_buf *tab, uint64_t *total,
                      uint64_t *data_off, shoal_err *err)
{
    uint64_t off;
    size_t tlen = 0;

    for (size_t i = 0; i < n; i++)
        tlen += 2 + strlen(mats[i].name) + 1 + 32;
    *data_off = off = align_up(SPINE_PACK_HEADER + tlen);
    for (size_t i = 0; i < n; i++) {
        const engine_mat *m = &mats[i].mat;
        size_t nl = strlen(mats[i].name);
        int f32 = m->q8.q == NULL;
        uint8_t rec[33];
        if (nl == 0 || nl > PACK_NAME_MAX)
            return shoal_err_set(err, SHOAL_EINVAL, "spine pack: tensor name of %zu bytes", nl);
        rec[0] = (uint8_t)nl;   /* u16 LE; nl <= 255 */
        rec[1] = 0;
        if (shoal_buf_append(tab, rec, 2) || shoal_buf_append(tab, mats[i].name, nl))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        rec[0] = (uint8_t)f32;
        shoal_wr_le64(rec + 1, m->rows);
        shoal_wr_le64(rec + 9, m->cols);
        shoal_wr_le64(rec + 17, off);
        off = align_up(off + m->rows * m->cols * (f32 ? 4 : 1));
        shoal_wr_le64(rec + 25, f32 ? 0 : off);
        if (!f32)
            off = align_up(off + m->rows * 4);
        if (shoal_buf_append(tab, rec, 33))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    *total = off;
    return 0;
}

int spine_pack_write(const engine_model *m, const uint8_t *config, size_t config_len, int fd,
                     uint64_t *len_out, uint8_t xxh128_out[16], shoal_err *err)
{
    const engine_spine_mat *mats;
    size_t n = engine_model_spine_mats(m, &mats);
    pack_out o = { fd, 0, XXH3_createState() };
    uint8_t hdr[SPINE_PACK_HEADER] = { 0 };
    uint64_t total = 0, data_off = 0;
    XXH128_canonical_t can;
    shoal_buf tab;
    int rc;

    shoal_buf_init(&tab, 0);
    if (!o.xs) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto done;
    }
    if (m->opt.spine != ENGINE_SPINE_INT8 || m->opt.pack || n == 0 || n > PACK_MAX_MATS) {
        rc = shoal_err_set(err, SHOAL_EINVAL, "spine pack: only a model quantized to the "
                           "int8 spine at this load can be packed");
        goto done;
    }
    if ((rc = pack_table(mats, n, &tab, &total, &data_off, err)) != 0)
        goto done;
    XXH3_128bits_reset(o.xs);
    memcpy(hdr, PACK_MAGIC, 8);
    shoal_wr_le32(hdr + 8, SPINE_PACK_FORMAT);
    shoal_wr_le32(hdr + 12, SPINE_PACK_QUANT);
    shoal_wr_le32(hdr + 16, (uint32_t)n);
    shoal_wr_le64(hdr + 24, XXH3_64bits(config, config_len));
    shoal_wr_le64(hdr + 32, tab.len);
    shoal_wr_le64(hdr + 40, data_off);
    shoal_wr_le64(hdr + 48, total);
    shoal_wr_le64(hdr + 56, XXH3_64bits(tab.data, tab.len));
    if ((rc = out_write(&o, hdr, sizeof hdr, err)) || (rc = out_write(&o, tab.data, tab.len, err)))
        goto done;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const engine_mat *mt = &mats[i].mat;
        if (mt->q8.q) {
            if ((rc = out_pad(&o, align_up(o.pos), err)) ||
                (rc = out_write(&o, mt->q8.q, mt->rows * mt->cols, err)) ||
                (rc = out_pad(&o, align_up(o.pos), err)))
                break;
            rc = out_write(&o, mt->q8.scale, mt->rows * sizeof(float), err);
        } else {
            if ((rc = out_pad(&o, align_up(o.pos), err)))
                break;
            rc = out_write(&o, mt->f32.w, mt->rows * mt->cols * sizeof(float), err);
        }
    }
    if (rc == 0)
        rc = out_pad(&o, total, err);
    if (rc == 0 && o.pos != total)
        rc = shoal_err_set(err, SHOAL_EINTERNAL, "spine pack: wrote %llu bytes, laid out %llu",
                           (unsigned long long)o.pos, (unsigned long long)total);
    if (rc == 0) {
        XXH128_canonicalFromHash(&can, XXH3_128bits_digest(o.xs));
        memcpy(xxh128_out, can.digest, 16);
        *len_out = total;
    }
done:
    XXH3_freeState(o.xs);
    shoal_buf_free(&tab);
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
    uint64_t wsize;

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
    if (e->dtype > 1 || e->rows == 0 || e->cols == 0 || e->rows >= PACK_MAX_DIM ||
        e->cols >= PACK_MAX_DIM)
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: %.*s: dtype %u, [%llu, %llu]",
                             (int)e->name_len, e->name, e->dtype, (unsigned long long)e->rows,
                             (unsigned long long)e->cols);
    wsize = e->rows * e->cols * (e->dtype ? 4u : 1u);
    if (!range_ok(e->w_off, wsize, data_off, p->len) ||
        (e->dtype == 0 && !range_ok(e->s_off, e->rows * 4, data_off, p->len)) ||
        (e->dtype == 1 && e->s_off != 0))
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: %.*s: data outside the pack "
                             "or misaligned", (int)e->name_len, e->name);
    return 0;
}

int spine_pack_open(const uint8_t *data, uint64_t len, const uint8_t *config,
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
    if (shoal_rd_le32(data + 20) != 0 || n == 0 || n > PACK_MAX_MATS ||
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

int spine_pack_next(spine_pack *p, const char *name, size_t rows, size_t cols, int f32,
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
    if (e->rows != rows || e->cols != cols || e->dtype != (f32 ? 1 : 0))
        return shoal_err_set(err, SHOAL_EFORMAT, "spine pack: %s is %s [%llu, %llu], the "
                             "config says %s [%zu, %zu]", name, e->dtype ? "f32" : "int8",
                             (unsigned long long)e->rows, (unsigned long long)e->cols,
                             f32 ? "f32" : "int8", rows, cols);
    *out = (engine_mat){ .rows = rows, .cols = cols };
    if (f32)
        out->f32 = (kernels_f32){ (const float *)(p->data + e->w_off), rows, cols };
    else
        out->q8 = (kernels_q8){ (const int8_t *)(p->data + e->w_off),
                                (const float *)(p->data + e->s_off), rows, cols };
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
