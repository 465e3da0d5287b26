/* write.c — putting a synthesized model where mkmodel's user wants it.
 *
 * Owns: the on-disk files (small ones written atomically; each shard
 * streamed in 4 MiB chunks into ".NAME.partial" and renamed into place once
 * complete, so an interrupted run never leaves a valid-looking shard; the
 * index last), the headers-only variant (sparse shards), one file on
 * stdout, and the digest table.  Every byte comes from synth_read(): what
 * is written is what hubmock serves for the same model.  Does not own the
 * command line (main.c).
 */
#include "tools/mkmodel/mkmodel_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/path.h"
#include "common/sys.h"

#define CHUNK (4u << 20)   /* bytes generated per write */

static void progress_show(mk_progress *pr)
{
    char phase[48];
    if (!pr->meter)
        return;
    snprintf(phase, sizeof phase, "shard %d/%d", pr->shard, pr->shards);
    shoal_meter_update(pr->meter, phase, pr->done, pr->total, NULL);
}

/* Stream bytes [off, end) of file i to fd. */
static int stream(const synth_model *m, size_t i, uint64_t off, uint64_t end, int fd,
                  uint8_t *buf, mk_progress *pr, shoal_err *err)
{
    const char *name = synth_file_name(m, i);

    while (off < end) {
        size_t k = end - off < CHUNK ? (size_t)(end - off) : CHUNK;
        int rc = synth_read(m, i, off, k, buf);
        if (rc)
            return shoal_err_set(err, rc, "generating %s: %s", name, shoal_strerror(rc));
        if ((rc = shoal_write_all(fd, buf, k)))
            return shoal_err_set(err, rc, "writing %s: %s", name, shoal_strerror(rc));
        off += k;
        if (!pr)
            continue;
        pr->done += k;
        progress_show(pr);   /* the meter decides when to draw */
    }
    return 0;
}

static int shard_write(const synth_model *m, size_t i, const char *dir, int headers_only,
                       uint8_t *buf, mk_progress *pr, shoal_err *err)
{
    const char *name = synth_file_name(m, i);
    uint64_t size = synth_file_size(m, i), hdr = synth_file_header_size(m, i);
    char tmpname[96], path[SHOAL_PATH_MAX], tmp[SHOAL_PATH_MAX];
    int fd, rc;

    snprintf(tmpname, sizeof tmpname, ".%s.partial", name);
    if (shoal_path_join(path, sizeof path, dir, name) ||
        shoal_path_join(tmp, sizeof tmp, dir, tmpname))
        return shoal_err_set(err, SHOAL_ETOOBIG, "output path too long");
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "%s: %s", tmp, strerror(errno));
    rc = stream(m, i, 0, headers_only ? hdr : size, fd, buf, headers_only ? NULL : pr, err);
    if (!rc && headers_only && ftruncate(fd, (off_t)size) != 0)
        rc = shoal_err_set(err, shoal_err_from_errno(errno), "sizing %s: %s", tmp,
                           strerror(errno));
    if (close(fd) != 0 && !rc)
        rc = shoal_err_set(err, shoal_err_from_errno(errno), "closing %s: %s", tmp,
                           strerror(errno));
    if (!rc && rename(tmp, path) != 0)
        rc = shoal_err_set(err, shoal_err_from_errno(errno), "rename %s: %s", path,
                           strerror(errno));
    if (rc)
        unlink(tmp);
    return rc;
}

static int small_write(const synth_model *m, size_t i, const char *dir, uint8_t *buf,
                       shoal_err *err)
{
    char path[SHOAL_PATH_MAX];
    uint64_t size = synth_file_size(m, i);
    uint8_t *p = size > CHUNK ? malloc(size) : buf;
    int rc;

    if (!p)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for %s", synth_file_name(m, i));
    if (shoal_path_join(path, sizeof path, dir, synth_file_name(m, i)))
        rc = shoal_err_set(err, SHOAL_ETOOBIG, "output path too long");
    else if ((rc = synth_read(m, i, 0, size, p)))
        shoal_err_set(err, rc, "generating %s", synth_file_name(m, i));
    else
        rc = shoal_write_file_atomic(path, p, size, err);
    if (p != buf)
        free(p);
    return rc;
}

int mk_model_write(const synth_model *m, const char *dir, int headers_only, mk_progress *pr,
                   shoal_err *err)
{
    uint8_t *buf = malloc(CHUNK);
    int rc = 0;

    if (!buf)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    pr->total = synth_model_tensor_bytes(m);
    pr->shards = synth_model_shards(m);
    /* The index is the last file: a directory without it is visibly
     * incomplete. */
    for (size_t i = 0; i < synth_file_count(m) && !rc; i++)
        rc = synth_file_is_shard(m, i) ? (pr->shard++, shard_write(m, i, dir, headers_only, buf,
                                                                    pr, err))
                                       : small_write(m, i, dir, buf, err);
    if (pr->meter && !rc)
        shoal_meter_end(pr->meter, NULL);
    free(buf);
    return rc;
}

int mk_file_cat(const synth_model *m, const char *name, int fd, shoal_err *err)
{
    long i = synth_file_find(m, name);
    uint8_t *buf;
    int rc;

    if (i < 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "the model has no file '%s' (its files: "
                             "config.json, tokenizer_config.json, tiktoken.model, "
                             "model.safetensors.index.json, %s ...)", name,
                             synth_file_name(m, 3));
    if (!(buf = malloc(CHUNK)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    rc = stream(m, (size_t)i, 0, synth_file_size(m, (size_t)i), fd, buf, NULL, err);
    free(buf);
    return rc;
}

static void etags_progress(void *ctx, uint64_t done, uint64_t total)
{
    shoal_meter_update(ctx, "hashed", done, total, NULL);
}

int mk_etags_print(const synth_model *m, int jobs, shoal_meter *meter, shoal_err *err)
{
    size_t n = synth_file_count(m);
    synth_digest_job *job = calloc(n, sizeof *job);
    int rc;

    if (!job)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        job[i].m = m;
        job[i].file = i;
        job[i].len = synth_file_size(m, i);
        job[i].want_sha1 = !synth_file_is_shard(m, i);
    }
    rc = synth_digest_run(job, n, jobs, meter ? etags_progress : NULL, meter, err);
    if (meter && !rc)
        shoal_meter_end(meter, NULL);
    if (!rc)
        printf("/* k3_etags.inc — generated by `bin/mkmodel --preset %s --print-etags`;\n"
               " * regenerate it (docs/mkmodel.md) whenever SYNTH_GEN_VERSION changes.\n"
               " * Rows: file, size, sha256, git blob sha1 (not for shards), probe,\n"
               " * sha256 of a shard's header. */\n"
               "#define SYNTH_KNOWN_KEY \"%s\"\n#define SYNTH_KNOWN_FAMILY \"%s\"\n",
               synth_preset_name(synth_model_config(m)->preset), synth_model_key(m),
               synth_model_family(m));
    for (size_t i = 0; i < n && !rc; i++) {
        char probe[65], hdr[65];
        if ((rc = synth_probe(m, i, probe, err)) || (rc = synth_header_sha256(m, i, hdr, err)))
            break;
        printf("SYNTH_KNOWN_ROW(\"%s\", %lluULL, \"%s\", \"%s\", \"%s\",\n                \"%s\")\n",
               synth_file_name(m, i), (unsigned long long)job[i].len, job[i].out.sha256,
               job[i].out.sha1, probe, hdr);
    }
    if (!rc && fflush(stdout) != 0)
        rc = shoal_err_set(err, SHOAL_EIO, "writing the table: %s", strerror(errno));
    free(job);
    return rc;
}
