/* export.c — `shoal export`: the files of a model that the cache holds
 * completely, written out for other tools — into a plain directory
 * (--local-dir, as `huggingface-cli download --local-dir`) or into a
 * huggingface_hub cache (--hf-cache: models--org--name/{blobs,snapshots,
 * refs}, so transformers and huggingface_hub find them offline).
 *
 * A file is complete when its cached objects tile [0, size) (walked from
 * offset 0 through the index: each object's length says where the next
 * starts).  Its bytes are copied in order and hashed as they go: a file
 * whose etag is a sha256 (LFS) or a git blob sha1 is written only when the
 * bytes hash to it (exit 5 otherwise), so an export is never less true
 * than the Hub.  Reads the index read-only (allowed beside a running
 * shoald); objects evicted meanwhile make that file incomplete, nothing
 * else.
 */
#include "tools/shoal/shoal_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/hfenv.h"
#include "common/manifest.h"
#include "common/sys.h"

#define COPY_CHUNK (4u << 20)
#define LONG_PATH  (3 * SHOAL_PATH_MAX)   /* top + a repo path + a commit */

enum { O_LOCAL_DIR = 1, O_HF_CACHE, O_CACHE_DIR };

static const shoal_cli_opt export_opts[] = {
    { "local-dir", 0, "DIR", O_LOCAL_DIR, "write the files into DIR, at their repo paths" },
    { "hf-cache", 0, NULL, O_HF_CACHE, "write them into a huggingface_hub cache (blobs named by\n"
                                       "their etag, snapshot links, the revision's ref)" },
    { "cache-dir", 0, "DIR", O_CACHE_DIR, "with --hf-cache: that cache (default $HF_HUB_CACHE,\n"
                                          "else $HF_HOME/hub, else ~/.cache/huggingface/hub)" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_export_spec = {
    .prog = "shoal export",
    .synopsis = "shoal export MODEL --local-dir DIR\n"
                "shoal export MODEL --hf-cache [--cache-dir DIR]",
    .about = "Write the files of MODEL that the cache holds completely (every byte cached)\n"
             "so that other tools can use them: into DIR, or into a huggingface_hub cache.\n"
             "Each file is hashed as it is copied and written only when it matches its\n"
             "etag (sha256 or git blob sha1; exit 5 otherwise).  Files not complete are\n"
             "listed and skipped (`shoal warm MODEL` first).  Reads the index read-only.",
    .opts = export_opts,
};

/* mkdir -p of the directory part of path. */
static int parent_dirs(const char *path, shoal_err *err)
{
    char d[LONG_PATH];
    char *slash;
    snprintf(d, sizeof d, "%s", path);
    slash = strrchr(d, '/');
    if (!slash || slash == d)
        return 0;
    *slash = '\0';
    return shoal_mkdir_p(d, 0755, err);
}

/* 1 when every byte of f is cached (objects tiling [0, size)). */
static int file_complete(cache *c, const manifest_file *f, shoal_err *err)
{
    uint64_t off = 0, len;
    if (f->size == 0)
        return 0;
    while (off < f->size) {
        if (cache_lookup_length(c, f->etag, off, &len, err) != 0 || len == 0)
            return 0;
        off += len;
    }
    return off == f->size;
}

/* Copy f's objects in order into fd, hashing; 0, SHOAL_ECORRUPT (the
 * bytes do not hash to the etag), SHOAL_ENOTFOUND (an object went away) or
 * an I/O code. */
static int copy_file(cache *c, const manifest_file *f, int out, shoal_err *err)
{
    int kind = shoal_is_hex(f->etag, 64) ? 64 : shoal_is_hex(f->etag, 40) ? 40 : 0;
    EVP_MD_CTX *md = kind ? EVP_MD_CTX_new() : NULL;
    uint8_t *buf = malloc(COPY_CHUNK);
    uint64_t off = 0;
    int rc = buf && (!kind || md) ? 0 : shoal_err_set(err, SHOAL_ENOMEM, "out of memory");

    if (rc == 0 && kind) {
        EVP_DigestInit_ex(md, kind == 64 ? EVP_sha256() : EVP_sha1(), NULL);
        if (kind == 40) {
            char head[48];
            int hn = snprintf(head, sizeof head, "blob %" PRIu64, f->size);
            EVP_DigestUpdate(md, head, (size_t)hn + 1);
        }
    }
    while (rc == 0 && off < f->size) {
        cache_key key = { f->etag, off, 0 };
        cache_obj obj;
        if ((rc = cache_lookup_length(c, f->etag, off, &key.length, err)) != 0
            || (rc = cache_lookup(c, &key, NULL, &obj, err)) != 0)
            break;
        for (uint64_t done = 0; rc == 0 && done < obj.length; ) {
            size_t n = obj.length - done < COPY_CHUNK ? (size_t)(obj.length - done) : COPY_CHUNK;
            if (shoal_pread_all(obj.fd, buf, n, (off_t)done) != 0)
                rc = shoal_err_set(err, SHOAL_EIO, "reading the cached bytes of %s: %s", f->path,
                                   strerror(errno));
            else if (shoal_write_all(out, buf, n) != 0)
                rc = shoal_err_set(err, shoal_err_from_errno(errno), "writing %s: %s", f->path,
                                   strerror(errno));
            else if (kind)
                EVP_DigestUpdate(md, buf, n);
            done += n;
        }
        close(obj.fd);
        off += key.length;
    }
    if (rc == 0 && kind) {
        unsigned char dig[EVP_MAX_MD_SIZE];
        char got[2 * EVP_MAX_MD_SIZE + 1];
        unsigned int dn = 0;
        EVP_DigestFinal_ex(md, dig, &dn);
        for (unsigned i = 0; i < dn; i++)
            snprintf(got + 2 * i, 3, "%02x", dig[i]);
        if (strcmp(got, f->etag) != 0)
            rc = shoal_err_set(err, SHOAL_ECORRUPT, "%s: the cached bytes hash to %s, not to its "
                               "etag %s (run `shoal verify --deep`)", f->path, got, f->etag);
    }
    EVP_MD_CTX_free(md);
    free(buf);
    return rc;
}

/* Write f to dst (through dst.tmp, renamed when whole and right). */
static int write_one(cache *c, const manifest_file *f, const char *dst, shoal_err *err)
{
    char tmp[LONG_PATH + 16];
    int fd, rc;

    if ((rc = parent_dirs(dst, err)) != 0)
        return rc;
    snprintf(tmp, sizeof tmp, "%s.shoal-tmp", dst);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "cannot create %s: %s", tmp,
                             strerror(errno));
    rc = copy_file(c, f, fd, err);
    if (rc == 0 && fsync(fd) != 0)
        rc = shoal_err_set(err, SHOAL_EIO, "fsync %s: %s", tmp, strerror(errno));
    close(fd);
    if (rc == 0 && rename(tmp, dst) != 0)
        rc = shoal_err_set(err, SHOAL_EIO, "rename to %s: %s", dst, strerror(errno));
    if (rc)
        unlink(tmp);
    return rc;
}

/* huggingface_hub's link: snapshots/<commit>/<path> -> ../../blobs/<etag>,
 * one more ../ per directory in path. */
static int hf_link(const char *top, const char *commit, const manifest_file *f, shoal_err *err)
{
    char link[LONG_PATH], target[SHOAL_PATH_MAX];
    size_t k = 0;
    int rc;

    snprintf(link, sizeof link, "%s/snapshots/%s/%s", top, commit, f->path);
    if ((rc = parent_dirs(link, err)) != 0)
        return rc;
    for (const char *p = f->path; *p; p++)
        if (*p == '/' && k + 3 < sizeof target) {
            memcpy(target + k, "../", 3);
            k += 3;
        }
    snprintf(target + k, sizeof target - k, "../../blobs/%s", f->etag);
    unlink(link);
    if (symlink(target, link) != 0)
        return shoal_err_set(err, SHOAL_EIO, "symlink %s: %s", link, strerror(errno));
    return 0;
}

typedef struct export_tally {
    size_t done, partial;
    uint64_t bytes;
    int bad;
} export_tally;

/* Every complete file of m into dir (top: the HF cache's models--org--name,
 * or NULL for a plain directory).  -1 to go on, else an exit code. */
static int export_files(cache *c, const manifest *m, const char *top, const char *dir,
                        export_tally *t)
{
    char dst[LONG_PATH], sz[FMT_MAX];
    int rc;
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < m->nfiles; i++) {
        const manifest_file *f = &m->files[i];
        shoal_err e = { 0, "" };
        struct stat st;
        if (!file_complete(c, f, &e)) {
            printf("  partial  %s (not every byte is cached)\n", f->path);
            t->partial++;
            continue;
        }
        if (top) {
            snprintf(dst, sizeof dst, "%s/blobs/%s", top, f->etag);
            /* a blob already there of the right size is huggingface_hub's own */
            rc = stat(dst, &st) == 0 && (uint64_t)st.st_size == f->size ? 0
                                                                         : write_one(c, f, dst, &e);
            if (rc == 0)
                rc = hf_link(top, m->commit, f, &e);
        } else {
            snprintf(dst, sizeof dst, "%s/%s", dir, f->path);
            rc = write_one(c, f, dst, &e);
        }
        if (rc) {
            fprintf(stderr, "shoal export: %s\n", e.msg);
            if (rc == SHOAL_ECORRUPT)
                t->bad++;
            else if (rc != SHOAL_ENOTFOUND)
                return cli_exit_for(rc) == EXIT_OK_ ? EXIT_FAIL : cli_exit_for(rc);
            continue;
        }
        printf("  wrote    %s (%s)\n", f->path, fmt_size(f->size, sz));
        t->done++;
        t->bytes += f->size;
    }
    return -1;
}

int cmd_export(shoal_cli *cli, int argc, char **argv)
{
    char spec[SHOAL_PATH_MAX], dir[SHOAL_PATH_MAX] = "", top[SHOAL_PATH_MAX] = "";
    export_tally t;
    char sz[FMT_MAX];
    const char *v, *local_dir = NULL, *cache_dir = NULL;
    int id, rc, hf = 0, bad = 0;
    size_t done = 0, partial = 0;
    uint64_t bytes = 0;
    shoal_err err = { 0, "" };
    shoal_cli_parser p;
    shoal_buf b;
    manifest *m = NULL;
    cache *c = NULL;

    shoal_cli_begin(&p, &cmd_export_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        if (id == O_LOCAL_DIR)
            local_dir = v;
        else if (id == O_HF_CACHE)
            hf = 1;
        else
            cache_dir = v;
    }
    if (id < 0)
        return p.exit;
    if (p.optind != argc - 1)
        return shoal_cli_usage_error(&cmd_export_spec, "give one MODEL");
    if (!!local_dir + hf != 1)
        return shoal_cli_usage_error(&cmd_export_spec, "give --local-dir DIR or --hf-cache");
    if (cache_dir && !hf)
        return shoal_cli_usage_error(&cmd_export_spec, "--cache-dir goes with --hf-cache");
    if ((rc = cli_model_arg(&cmd_export_spec, argv[p.optind], spec, sizeof spec)) != 0)
        return rc;
    if (hf) {
        shoal_hf_env env;
        shoal_hf_env_capture(&env);
        if (cache_dir)
            snprintf(dir, sizeof dir, "%s", cache_dir);
        else if (shoal_hf_hub_cache(&env, dir, sizeof dir) != 0)
            return shoal_cli_usage_error(&cmd_export_spec, "no HF cache to name: give --cache-dir");
    } else {
        snprintf(dir, sizeof dir, "%s", local_dir);
    }

    shoal_buf_init(&b, 0);
    rc = cli_cache_reader(cli, &c, &err);
    if (rc == 0)
        rc = cache_model_manifest(c, spec, &b, &err);
    if (rc == 0)
        rc = manifest_decode(b.data, b.len, &m, &err);
    shoal_buf_free(&b);
    if (rc) {
        cache_close(c);
        return cli_fail(rc, &err);
    }
    if (hf) {
        char dashed[2 * SHOAL_PATH_MAX / 4];
        size_t k = 0;
        if (!m->endpoint[0]) {
            fprintf(stderr, "shoal export: %s is a local directory, not a Hub model: --hf-cache "
                    "names models by their repo (use --local-dir)\n", spec);
            manifest_free(m);
            cache_close(c);
            return EXIT_USAGE;
        }
        for (const char *q = m->repo; *q && k + 2 < sizeof dashed; q++) {
            if (*q == '/')
                dashed[k++] = '-';
            dashed[k++] = *q == '/' ? '-' : *q;
        }
        dashed[k] = '\0';
        int n = snprintf(top, sizeof top, "%s/models--%s", dir, dashed);
        if (n < 0 || (size_t)n >= sizeof top) {
            fprintf(stderr, "shoal export: %s/models--%s: the path is too long; give a shorter "
                    "--cache-dir\n", dir, dashed);
            manifest_free(m);
            cache_close(c);
            return EXIT_FAIL;
        }
    }
    rc = export_files(c, m, hf ? top : NULL, dir, &t);
    if (rc >= 0) {
        manifest_free(m);
        cache_close(c);
        return rc;
    }
    done = t.done;
    partial = t.partial;
    bytes = t.bytes;
    bad = t.bad;
    if (hf && done) {
        char ref[LONG_PATH];
        snprintf(ref, sizeof ref, "%s/refs/%s", top, m->revision);
        if (strcmp(m->revision, m->commit) != 0
            && (parent_dirs(ref, &err) != 0
                || shoal_write_file_atomic(ref, m->commit, strlen(m->commit), &err) != 0))
            fprintf(stderr, "shoal export: writing %s: %s\n", ref, err.msg);
    }
    printf("Exported %zu of %zu files (%s) of %s@%.12s to %s; %zu partial%s\n", done, m->nfiles,
           fmt_size(bytes, sz), m->repo, m->commit, hf ? top : dir, partial,
           partial ? " (`shoal warm MODEL` caches the rest)" : "");
    manifest_free(m);
    cache_close(c);
    if (bad)
        return EXIT_DAMAGED;
    return done ? EXIT_OK_ : EXIT_NOTFOUND;
}
