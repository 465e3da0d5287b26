/* shard.c — write the safetensors shards and model.safetensors.index.json.
 *
 * Owns: the on-disk bytes of each shard, written streaming (never a whole
 * shard in memory) into ".NAME.partial" and renamed into place once
 * complete, so an interrupted run never leaves a valid-looking shard.  The
 * JSON header starts with {"__metadata__":{"format":"pt"}, lists tensors in
 * file order and is padded with spaces to a multiple of 8 bytes.  Does not
 * own which tensors exist (tensors.c) nor their values (weights.c).
 */
#include "tools/mkmodel/mkmodel_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/path.h"
#include "common/sys.h"

#define CHUNK (4u << 20)   /* bytes generated per write */

static int header_build(const mk_model *m, size_t lo, size_t hi, shoal_buf *out)
{
    int rc = shoal_buf_append_le64(out, 0);   /* N, patched below */
    rc = rc ? rc : shoal_buf_append_str(out, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = lo; i < hi && !rc; i++) {
        const mk_tensor *t = &m->t[i];
        rc = shoal_buf_appendf(out, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name,
                               mk_dtype_name(t->dtype));
        for (unsigned d = 0; d < t->ndim && !rc; d++)
            rc = shoal_buf_appendf(out, "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
        if (!rc)
            rc = shoal_buf_appendf(out, "],\"data_offsets\":[%llu,%llu]}",
                                   (unsigned long long)t->begin,
                                   (unsigned long long)(t->begin + t->nbytes));
    }
    rc = rc ? rc : shoal_buf_append_u8(out, '}');
    while (!rc && (out->len - 8) % 8)
        rc = shoal_buf_append_u8(out, ' ');
    if (!rc)
        shoal_wr_le64(out->data, out->len - 8);
    return rc;
}

static void progress_show(mk_progress *pr, const char *name, int final)
{
    char a[32], b[32];
    if (!pr->tty && !final)
        return;
    fprintf(stderr, "%smkmodel: %s  %s / %s (%d%%)%s", pr->tty ? "\r" : "", name,
            shoal_size_format(pr->done, a, sizeof a), shoal_size_format(pr->total, b, sizeof b),
            pr->total ? (int)(pr->done * 100 / pr->total) : 100, pr->tty && !final ? "" : "\n");
}

/* Stream the data of tensors [lo, hi) to fd. */
static int data_write(const mk_config *cfg, const mk_model *m, size_t lo, size_t hi, int fd,
                      uint8_t *buf, mk_progress *pr, const char *name, shoal_err *err)
{
    uint64_t last_shown = pr->done;

    for (size_t i = lo; i < hi; i++) {
        const mk_tensor *t = &m->t[i];
        uint64_t esize = mk_dtype_size(t->dtype), n = t->nbytes / esize;
        uint64_t state = mk_seed_state(t->name, cfg->seed), per = CHUNK / esize;
        for (uint64_t first = 0; first < n; first += per) {
            uint64_t cnt = n - first < per ? n - first : per;
            mk_fill(t, &state, first, buf, cnt);
            int rc = shoal_write_all(fd, buf, cnt * esize);
            if (rc)
                return shoal_err_set(err, rc, "writing %s: %s", name, shoal_strerror(rc));
            pr->done += cnt * esize;
            if (pr->done - last_shown >= (64u << 20)) {
                progress_show(pr, name, 0);
                last_shown = pr->done;
            }
        }
    }
    return 0;
}

static int shard_write(const mk_config *cfg, const mk_model *m, int s, size_t lo, size_t hi,
                       const char *dir, uint8_t *buf, mk_progress *pr, shoal_err *err)
{
    char name[64], tmpname[80], path[SHOAL_PATH_MAX], tmp[SHOAL_PATH_MAX];
    shoal_buf hdr;
    int fd = -1, rc;

    mk_shard_name(m, s, name, sizeof name);
    snprintf(tmpname, sizeof tmpname, ".%s.partial", name);
    if (shoal_path_join(path, sizeof path, dir, name) ||
        shoal_path_join(tmp, sizeof tmp, dir, tmpname))
        return shoal_err_set(err, SHOAL_ETOOBIG, "output path too long");
    shoal_buf_init(&hdr, 0);
    if ((rc = header_build(m, lo, hi, &hdr))) {
        shoal_err_set(err, rc, "building the header of %s", name);
        goto out;
    }
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = shoal_err_set(err, shoal_err_from_errno(errno), "%s: %s", tmp, strerror(errno));
        goto out;
    }
    if ((rc = shoal_write_all(fd, hdr.data, hdr.len))) {
        shoal_err_set(err, rc, "writing %s: %s", tmp, shoal_strerror(rc));
        goto out;
    }
    if ((rc = data_write(cfg, m, lo, hi, fd, buf, pr, name, err)))
        goto out;
    if (close(fd) != 0) {
        fd = -1;
        rc = shoal_err_set(err, shoal_err_from_errno(errno), "closing %s: %s", tmp,
                           strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) != 0)
        rc = shoal_err_set(err, shoal_err_from_errno(errno), "rename %s: %s", path,
                           strerror(errno));
    else if (pr->verbose)
        progress_show(pr, name, 1);
out:
    if (fd >= 0)
        close(fd);
    if (rc)
        unlink(tmp);
    shoal_buf_free(&hdr);
    return rc;
}

int mk_shards_write(const mk_config *cfg, const mk_model *m, const char *dir, mk_progress *pr,
                    shoal_err *err)
{
    uint8_t *buf = malloc(CHUNK);
    size_t lo = 0;
    int rc = 0;

    if (!buf)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    pr->total = m->total_bytes;
    for (int s = 0; s < m->shards && !rc; s++) {
        size_t hi = lo;
        while (hi < m->count && m->t[hi].shard == s)
            hi++;
        rc = shard_write(cfg, m, s, lo, hi, dir, buf, pr, err);
        lo = hi;
    }
    free(buf);
    return rc;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp((*(const mk_tensor *const *)a)->name, (*(const mk_tensor *const *)b)->name);
}

int mk_index_write(const mk_model *m, const char *dir, shoal_err *err)
{
    const mk_tensor **by_name = malloc((m->count + 1) * sizeof *by_name);
    char path[SHOAL_PATH_MAX], shard[64];
    shoal_buf b;
    int rc;

    if (!by_name)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; i < m->count; i++)
        by_name[i] = &m->t[i];
    qsort(by_name, m->count, sizeof *by_name, name_cmp);
    shoal_buf_init(&b, 0);
    rc = shoal_buf_appendf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n"
                           "  \"weight_map\": {\n", (unsigned long long)m->total_bytes);
    for (size_t i = 0; i < m->count && !rc; i++) {
        mk_shard_name(m, by_name[i]->shard, shard, sizeof shard);
        rc = shoal_buf_appendf(&b, "    \"%s\": \"%s\"%s\n", by_name[i]->name, shard,
                               i + 1 < m->count ? "," : "");
    }
    rc = rc ? rc : shoal_buf_append_str(&b, "  }\n}\n");
    if (rc)
        shoal_err_set(err, rc, "building model.safetensors.index.json");
    else if (shoal_path_join(path, sizeof path, dir, "model.safetensors.index.json"))
        rc = shoal_err_set(err, SHOAL_ETOOBIG, "output path too long");
    else
        rc = shoal_write_file_atomic(path, b.data, b.len, err);
    shoal_buf_free(&b);
    free(by_name);
    return rc;
}
