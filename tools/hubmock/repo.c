/* repo.c — model directories as Hub repos: snapshots, hashes, commits, refs.
 *
 * Owns: walking a directory, hashing every file (sha256 of the content; git
 * blob sha1 of what git would store), the commit id, and the repo -> ref ->
 * snapshot tables.  Does not own HTTP (hub.c, cdn.c) nor synthesized
 * snapshots (synth_repo.c builds them and hands them over).
 *
 * The commit id is SHA-1 over the sorted lines "path\0size\0sha256\n", so
 * the same contents give the same commit whatever the directory is called.
 * Snapshots are never changed or dropped while running: moving a ref only
 * adds or re-points, so a client pinned to a commit keeps reading the bytes
 * of that commit (as long as nobody edits the directory on disk).
 */
#include "tools/hubmock/hubmock_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "common/log.h"
#include "common/path.h"

#define REPO_READ_CHUNK (1u << 20)

void hm_hex(const unsigned char *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

int hm_path_is_lfs(const char *path, uint64_t size, uint64_t threshold)
{
    const char *base = strrchr(path, '/');
    size_t n = strlen(path);
    base = base ? base + 1 : path;
    if (n >= 12 && strcmp(path + n - 12, ".safetensors") == 0)
        return 1;
    return strcmp(base, "tiktoken.model") == 0 || size >= threshold;
}

void hm_lfs_pointer_sha1(const char *sha256, uint64_t size, char out[41])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    char ptr[256], blob[320];
    int n = snprintf(ptr, sizeof ptr,
                     "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %llu\n",
                     sha256, (unsigned long long)size);
    int h = snprintf(blob, sizeof blob, "blob %d", n);

    memcpy(blob + h + 1, ptr, (size_t)n);
    EVP_Digest(blob, (size_t)(h + 1 + n), md, &mdlen, EVP_sha1(), NULL);
    hm_hex(md, mdlen, out);
}

/* sha256 of the content, and the git blob sha1 of the content. */
static int repo_hash_file(const char *abs, hm_file *f, shoal_err *err)
{
    int rc = 0, fd = open(abs, O_RDONLY | O_CLOEXEC);
    unsigned char *chunk = NULL, md[EVP_MAX_MD_SIZE];
    unsigned int mdlen;
    EVP_MD_CTX *c256 = EVP_MD_CTX_new(), *c1 = EVP_MD_CTX_new();
    uint64_t done = 0;
    char hdr[64];

    if (fd < 0) {
        rc = shoal_err_set(err, shoal_err_from_errno(errno), "open %s: %s", abs, strerror(errno));
        goto out;
    }
    chunk = malloc(REPO_READ_CHUNK);
    if (!chunk || !c256 || !c1) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory hashing %s", abs);
        goto out;
    }
    snprintf(hdr, sizeof hdr, "blob %llu", (unsigned long long)f->size);
    if (!EVP_DigestInit_ex(c256, EVP_sha256(), NULL) || !EVP_DigestInit_ex(c1, EVP_sha1(), NULL)
        || !EVP_DigestUpdate(c1, hdr, strlen(hdr) + 1)) {
        rc = shoal_err_set(err, SHOAL_EINTERNAL, "digest init failed");
        goto out;
    }
    while (done < f->size) {
        size_t want = f->size - done < REPO_READ_CHUNK ? (size_t)(f->size - done) : REPO_READ_CHUNK;
        ssize_t got = read(fd, chunk, want);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            rc = shoal_err_set(err, SHOAL_EIO, "read %s: %s", abs,
                               got < 0 ? strerror(errno) : "file shrank while hashing");
            goto out;
        }
        EVP_DigestUpdate(c256, chunk, (size_t)got);
        EVP_DigestUpdate(c1, chunk, (size_t)got);
        done += (uint64_t)got;
    }
    EVP_DigestFinal_ex(c256, md, &mdlen);
    hm_hex(md, mdlen, f->sha256);
    EVP_DigestFinal_ex(c1, md, &mdlen);
    hm_hex(md, mdlen, f->gitsha1);
    if (f->is_lfs)   /* git stores the LFS pointer: the ETag is its blob sha1 */
        hm_lfs_pointer_sha1(f->sha256, f->size, f->gitsha1);
out:
    EVP_MD_CTX_free(c256);
    EVP_MD_CTX_free(c1);
    free(chunk);
    if (fd >= 0)
        close(fd);
    return rc;
}

typedef struct walk {
    hm_file *v;
    size_t   n, cap;
    uint64_t lfs_threshold;
    char     root[SHOAL_PATH_MAX];
} walk;

static int repo_walk(walk *w, const char *rel, shoal_err *err)
{
    char dirpath[SHOAL_PATH_MAX];
    DIR *d;
    struct dirent *e;
    int rc = 0;

    if (shoal_path_join(dirpath, sizeof dirpath, w->root, rel[0] ? rel : "."))
        return shoal_err_set(err, SHOAL_ETOOBIG, "path too long under %s", w->root);
    d = opendir(dirpath);
    if (!d)
        return shoal_err_set(err, shoal_err_from_errno(errno), "opendir %s: %s", dirpath,
                             strerror(errno));
    while (rc == 0 && (e = readdir(d)) != NULL) {
        char sub[SHOAL_PATH_MAX], abs[SHOAL_PATH_MAX];
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0
            || strcmp(e->d_name, ".git") == 0)
            continue;
        if (snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name) >= (int)sizeof sub
            || shoal_path_join(abs, sizeof abs, w->root, sub)) {
            rc = shoal_err_set(err, SHOAL_ETOOBIG, "path too long: %s", e->d_name);
            break;
        }
        if (stat(abs, &st) != 0) {
            rc = shoal_err_set(err, shoal_err_from_errno(errno), "stat %s: %s", abs, strerror(errno));
            break;
        }
        if (S_ISDIR(st.st_mode)) {
            rc = repo_walk(w, sub, err);
        } else if (S_ISREG(st.st_mode)) {
            hm_file *f;
            if (w->n == w->cap) {
                size_t nc = w->cap ? 2 * w->cap : 16;
                hm_file *nv = realloc(w->v, nc * sizeof *nv);
                if (!nv) {
                    rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
                    break;
                }
                w->v = nv;
                w->cap = nc;
            }
            f = &w->v[w->n];
            memset(f, 0, sizeof *f);
            f->path = strdup(sub);
            if (!f->path) {
                rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
                break;
            }
            w->n++;
            f->size = (uint64_t)st.st_size;
            f->is_lfs = hm_path_is_lfs(sub, f->size, w->lfs_threshold);
            rc = repo_hash_file(abs, f, err);
        }
    }
    closedir(d);
    return rc;
}

int hm_file_cmp(const void *a, const void *b)
{
    return strcmp(((const hm_file *)a)->path, ((const hm_file *)b)->path);
}

void hm_snapshot_commit(hm_snapshot *s)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;

    EVP_DigestInit_ex(c, EVP_sha1(), NULL);
    for (size_t i = 0; i < s->nfiles; i++) {
        char size[32];
        int n = snprintf(size, sizeof size, "%llu", (unsigned long long)s->files[i].size);
        EVP_DigestUpdate(c, s->files[i].path, strlen(s->files[i].path) + 1);
        EVP_DigestUpdate(c, size, (size_t)n + 1);
        EVP_DigestUpdate(c, s->files[i].sha256, 64);
        EVP_DigestUpdate(c, "\n", 1);
    }
    EVP_DigestFinal_ex(c, md, &mdlen);
    EVP_MD_CTX_free(c);
    hm_hex(md, mdlen, s->commit);
}

int hm_snapshot_load(const char *dir, uint64_t lfs_threshold, hm_snapshot **out, shoal_err *err)
{
    walk w;
    hm_snapshot *s;
    int rc;

    memset(&w, 0, sizeof w);
    w.lfs_threshold = lfs_threshold;
    if (!realpath(dir, w.root))
        return shoal_err_set(err, shoal_err_from_errno(errno), "model directory %s: %s", dir,
                             strerror(errno));
    rc = repo_walk(&w, "", err);
    s = calloc(1, sizeof *s);
    if (rc == 0 && (!s || !(s->dir = strdup(w.root))))
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if (rc) {
        for (size_t i = 0; i < w.n; i++)
            free(w.v[i].path);
        free(w.v);
        if (s)
            free(s->dir);
        free(s);
        return rc;
    }
    qsort(w.v, w.n, sizeof *w.v, hm_file_cmp);
    s->files = w.v;
    s->nfiles = w.n;
    hm_snapshot_commit(s);
    *out = s;
    return 0;
}

void hm_snapshot_free(hm_snapshot *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nfiles; i++)
        free(s->files[i].path);
    free(s->files);
    free(s->dir);
    free(s);
}

const hm_file *hm_snapshot_file(const hm_snapshot *s, const char *path)
{
    hm_file key;
    key.path = (char *)path;
    return bsearch(&key, s->files, s->nfiles, sizeof *s->files, hm_file_cmp);
}

hm_repo *hm_repos_find(const hm_repos *rs, const char *id)
{
    for (size_t i = 0; i < rs->n; i++)
        if (strcmp(rs->v[i].id, id) == 0)
            return &rs->v[i];
    return NULL;
}

static int is_commit(const char *s)
{
    size_t i;
    for (i = 0; s[i]; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return i == 40;
}

hm_snapshot *hm_repo_revision(const hm_repo *r, const char *rev)
{
    for (size_t i = 0; i < r->nrefs; i++)
        if (strcmp(r->refs[i].name, rev) == 0)
            return r->refs[i].snap;
    if (is_commit(rev))
        for (size_t i = 0; i < r->nsnaps; i++)
            if (strcmp(r->snaps[i]->commit, rev) == 0)
                return r->snaps[i];
    return NULL;
}

static hm_repo *repos_add(hm_repos *rs, const char *id, shoal_err *err)
{
    hm_repo *nv, *r;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    char hex[2 * EVP_MAX_MD_SIZE + 1];

    nv = realloc(rs->v, (rs->n + 1) * sizeof *nv);
    if (!nv) {
        shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        return NULL;
    }
    rs->v = nv;
    r = &rs->v[rs->n];
    memset(r, 0, sizeof *r);
    r->id = strdup(id);
    if (!r->id) {
        shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        return NULL;
    }
    EVP_Digest(id, strlen(id), md, &mdlen, EVP_sha1(), NULL);
    hm_hex(md, mdlen, hex);
    memcpy(r->bucket, hex, 24);
    r->bucket[24] = '\0';
    rs->n++;
    return r;
}

int hm_repos_set(hm_repos *rs, const char *id, const char *ref, const char *dir, shoal_err *err)
{
    hm_snapshot *snap = NULL;
    int rc = hm_snapshot_load(dir, rs->lfs_threshold, &snap, err);

    return rc ? rc : hm_repos_put(rs, id, ref, snap, err);
}

int hm_repos_put(hm_repos *rs, const char *id, const char *ref, hm_snapshot *snap,
                 shoal_err *err)
{
    hm_snapshot *known;
    hm_repo *r;

    r = hm_repos_find(rs, id);
    if (!r && !(r = repos_add(rs, id, err))) {
        hm_snapshot_free(snap);
        return SHOAL_ENOMEM;
    }
    known = hm_repo_revision(r, snap->commit);
    if (known) {
        hm_snapshot_free(snap);
        snap = known;
    } else {
        hm_snapshot **ns = realloc(r->snaps, (r->nsnaps + 1) * sizeof *ns);
        if (!ns) {
            hm_snapshot_free(snap);
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        }
        r->snaps = ns;
        r->snaps[r->nsnaps++] = snap;
    }
    for (size_t i = 0; i < r->nrefs; i++) {
        if (strcmp(r->refs[i].name, ref) == 0) {
            r->refs[i].snap = snap;
            goto done;
        }
    }
    {
        hm_ref *nr = realloc(r->refs, (r->nrefs + 1) * sizeof *nr);
        if (!nr)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        r->refs = nr;
        r->refs[r->nrefs].name = strdup(ref);
        if (!r->refs[r->nrefs].name)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        r->refs[r->nrefs].snap = snap;
        r->nrefs++;
    }
done:
    LOG_INFO("hubmock", "%s@%s -> commit %s (%zu files, %s)", id, ref, snap->commit,
             snap->nfiles, snap->dir ? snap->dir : synth_model_key(snap->synth));
    return 0;
}

const hm_file *hm_repos_blob(const hm_repos *rs, const char *sha256, const hm_snapshot **snap)
{
    for (size_t i = 0; i < rs->n; i++)
        for (size_t j = 0; j < rs->v[i].nsnaps; j++) {
            const hm_snapshot *s = rs->v[i].snaps[j];
            for (size_t k = 0; k < s->nfiles; k++)
                if (s->files[k].is_lfs && strcmp(s->files[k].sha256, sha256) == 0) {
                    *snap = s;
                    return &s->files[k];
                }
        }
    return NULL;
}

void hm_repos_free(hm_repos *rs)
{
    for (size_t i = 0; i < rs->n; i++) {
        hm_repo *r = &rs->v[i];
        for (size_t j = 0; j < r->nrefs; j++)
            free(r->refs[j].name);
        for (size_t j = 0; j < r->nsnaps; j++)
            hm_snapshot_free(r->snaps[j]);
        free(r->refs);
        free(r->snaps);
        free(r->id);
    }
    free(rs->v);
    rs->v = NULL;
    rs->n = 0;
    for (size_t i = 0; i < rs->nmodels; i++)
        synth_model_free(rs->models[i]);
    free(rs->models);
    rs->models = NULL;
    rs->nmodels = 0;
}
