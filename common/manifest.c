/* manifest.c — the model manifest: building, checking, binary codec.
 *
 * Owns what manifest.h promises.  The encoding (docs/manifest.md) is a
 * 32-byte header, a body read front to back with a bounds-checked cursor,
 * and an XXH64 trailer; decoding never trusts a count or a length before
 * checking it against the bytes that remain, so hostile input costs at
 * most one pass and allocations bounded by the input size.
 */
#include "common/utf8.h"
#include "common/manifest.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#define MAN_MAGIC       "SHOALMAN"
#define MAN_HDR_SIZE    32
#define MAN_TRAILER     8
#define LM_PREFIX       "language_model."

manifest *manifest_new(void)
{
    manifest *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->endpoint = strdup("");
    m->repo = strdup("");
    m->revision = strdup("");
    m->commit = strdup("");
    if (!m->endpoint || !m->repo || !m->revision || !m->commit) {
        manifest_free(m);
        return NULL;
    }
    return m;
}

void manifest_free(manifest *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nfiles; i++) {
        free(m->files[i].path);
        free(m->files[i].etag);
    }
    for (size_t i = 0; i < m->ntensors; i++)
        free(m->tensors[i].name);
    free(m->files);
    free(m->tensors);
    free(m->experts);
    free(m->config);
    free(m->endpoint);
    free(m->repo);
    free(m->revision);
    free(m->commit);
    free(m);
}

/* ---- small checks --------------------------------------------------------- */

/* Valid UTF-8 (no overlongs, surrogates or values past U+10FFFF), no NUL. */
static int utf8_ok(const uint8_t *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if (s[i] == 0 || (k = shoal_utf8_char_len(s + i, n - i)) == 0)
            return 0;
    return 1;
}

int manifest_path_check(const char *path, shoal_err *err)
{
    size_t n = path ? strlen(path) : 0, seg = 0;

    if (n == 0 || n > MANIFEST_STR_MAX)
        return shoal_err_set(err, SHOAL_EFORMAT, "file name is empty or too long");
    if (path[0] == '/')
        return shoal_err_set(err, SHOAL_EFORMAT, "file name '%s' is an absolute path", path);
    if (!utf8_ok((const uint8_t *)path, n))
        return shoal_err_set(err, SHOAL_EFORMAT, "file name is not valid UTF-8");
    for (size_t i = 0; i <= n; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c == '/' || c == '\0') {
            size_t len = i - seg;
            if (len == 0 || (len == 1 && path[seg] == '.')
                || (len == 2 && path[seg] == '.' && path[seg + 1] == '.'))
                return shoal_err_set(err, SHOAL_EFORMAT,
                                     "file name '%s' has an empty, '.' or '..' component", path);
            seg = i + 1;
        } else if (c < 0x20 || c == 0x7f || c == '\\') {
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "file name '%s' has a control character or backslash", path);
        }
    }
    return 0;
}

static int str_ok(const char *s)
{
    size_t n = strlen(s);
    return n <= MANIFEST_STR_MAX && utf8_ok((const uint8_t *)s, n);
}

static int dtype_ok(const char *d)
{
    size_t n = strnlen(d, MANIFEST_DTYPE_MAX);
    if (n == 0 || n >= MANIFEST_DTYPE_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((d[i] >= 'A' && d[i] <= 'Z') || (d[i] >= '0' && d[i] <= '9') || d[i] == '_'))
            return 0;
    return 1;
}

/* a + b <= limit without overflow. */
static int fits(uint64_t a, uint64_t b, uint64_t limit)
{
    return a <= limit && b <= limit - a;
}

/* ---- building ---------------------------------------------------------------- */

static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    size_t nc;
    void *p;
    if (n < *cap)
        return 0;
    nc = *cap ? *cap * 2 : 16;
    p = realloc(*arr, nc * elem);
    if (!p)
        return SHOAL_ENOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

static int set_str(char **dst, const char *s, shoal_err *err)
{
    char *d = strdup(s ? s : "");
    if (!d)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if (!str_ok(d)) {
        free(d);
        return shoal_err_set(err, SHOAL_EFORMAT, "model name string is too long or not UTF-8");
    }
    free(*dst);
    *dst = d;
    return 0;
}

int manifest_set_model(manifest *m, const char *endpoint, const char *repo,
                       const char *revision, const char *commit, shoal_err *err)
{
    int rc = set_str(&m->endpoint, endpoint, err);
    rc = rc ? rc : set_str(&m->repo, repo, err);
    rc = rc ? rc : set_str(&m->revision, revision, err);
    rc = rc ? rc : set_str(&m->commit, commit, err);
    return rc;
}

int manifest_set_config(manifest *m, const void *p, size_t n, shoal_err *err)
{
    uint8_t *c;
    if (n > MANIFEST_CONFIG_MAX)
        return shoal_err_set(err, SHOAL_ETOOBIG, "config.json is larger than %u bytes",
                             MANIFEST_CONFIG_MAX);
    c = malloc(n ? n : 1);
    if (!c)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if (n)
        memcpy(c, p, n);
    free(m->config);
    m->config = c;
    m->config_len = n;
    return 0;
}

long manifest_file_find(const manifest *m, const char *path)
{
    for (size_t i = 0; i < m->nfiles; i++)
        if (strcmp(m->files[i].path, path) == 0)
            return (long)i;
    return -1;
}

int manifest_file_add(manifest *m, const char *path, const char *etag, uint64_t size,
                      uint32_t *index, shoal_err *err)
{
    manifest_file *f;
    int rc = manifest_path_check(path, err);
    size_t el = etag ? strlen(etag) : 0;

    if (rc)
        return rc;
    if (el == 0 || el > MANIFEST_ETAG_MAX || !utf8_ok((const uint8_t *)etag, el))
        return shoal_err_set(err, SHOAL_EFORMAT, "file '%s': bad etag", path);
    if (manifest_file_find(m, path) >= 0)
        return shoal_err_set(err, SHOAL_EEXIST, "file '%s' listed twice", path);
    if (m->nfiles >= UINT32_MAX
        || grow((void **)&m->files, &m->cap_files, m->nfiles, sizeof *m->files))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    f = &m->files[m->nfiles];
    f->path = strdup(path);
    f->etag = strdup(etag);
    f->size = size;
    if (!f->path || !f->etag) {
        free(f->path);
        free(f->etag);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    if (index)
        *index = (uint32_t)m->nfiles;
    m->nfiles++;
    return 0;
}

int manifest_tensor_add(manifest *m, const manifest_tensor *t, shoal_err *err)
{
    manifest_tensor *d;
    if (grow((void **)&m->tensors, &m->cap_tensors, m->ntensors, sizeof *m->tensors))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    d = &m->tensors[m->ntensors];
    *d = *t;
    d->name = strdup(t->name);
    if (!d->name)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    m->ntensors++;
    return 0;
}

int manifest_expert_add(manifest *m, uint32_t layer, uint32_t id, uint32_t file,
                        uint64_t offset, shoal_err *err)
{
    if (grow((void **)&m->experts, &m->cap_experts, m->nexperts, sizeof *m->experts))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    m->experts[m->nexperts++] = (manifest_expert){ layer, id, file, offset };
    return 0;
}

static int tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const manifest_tensor *)a)->name, ((const manifest_tensor *)b)->name);
}

static int expert_cmp(const void *a, const void *b)
{
    const manifest_expert *x = a, *y = b;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return 0;
}

static int expert_pos_cmp(const void *a, const void *b)
{
    const manifest_expert *x = a, *y = b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return 0;
}

int manifest_finish(manifest *m, shoal_err *err)
{
    if (m->ntensors)
        qsort(m->tensors, m->ntensors, sizeof *m->tensors, tensor_cmp);
    if (m->nexperts)
        qsort(m->experts, m->nexperts, sizeof *m->experts, expert_cmp);
    return manifest_check(m, err);
}

/* ---- checking ------------------------------------------------------------------ */

static int check_files(const manifest *m, shoal_err *err)
{
    for (size_t i = 0; i < m->nfiles; i++) {
        const manifest_file *f = &m->files[i];
        size_t el = strlen(f->etag);
        int rc = manifest_path_check(f->path, err);
        if (rc)
            return rc;
        if (el == 0 || el > MANIFEST_ETAG_MAX || !utf8_ok((const uint8_t *)f->etag, el))
            return shoal_err_set(err, SHOAL_EFORMAT, "file '%s': bad etag", f->path);
        for (size_t j = 0; j < i; j++)
            if (strcmp(m->files[j].path, f->path) == 0)
                return shoal_err_set(err, SHOAL_EFORMAT, "file '%s' listed twice", f->path);
    }
    return 0;
}

static int check_tensors(const manifest *m, shoal_err *err)
{
    for (size_t i = 0; i < m->ntensors; i++) {
        const manifest_tensor *t = &m->tensors[i];
        if (!t->name[0] || !str_ok(t->name))
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor %zu: empty, long or non-UTF-8 name", i);
        if (i > 0 && strcmp(m->tensors[i - 1].name, t->name) >= 0)
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor '%s': not sorted or listed twice",
                                 t->name);
        /* names are stored without the prefix, which lookups strip: a
         * stored one that kept it could never be found (found by fuzzing) */
        if (strncmp(t->name, LM_PREFIX, sizeof LM_PREFIX - 1) == 0)
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor '%s': stored with the '%s' prefix",
                                 t->name, LM_PREFIX);
        if (t->file >= m->nfiles)
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor '%s': file index %" PRIu32
                                 " out of range", t->name, t->file);
        if (!fits(t->offset, t->length, m->files[t->file].size))
            return shoal_err_set(err, SHOAL_ERANGE, "tensor '%s': bytes past the end of '%s'",
                                 t->name, m->files[t->file].path);
        if (!dtype_ok(t->dtype))
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor '%s': bad dtype", t->name);
        if (t->ndim > MANIFEST_MAX_DIMS)
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor '%s': %" PRIu32 " dimensions",
                                 t->name, t->ndim);
        if (t->is_spine != 0 && t->is_spine != 1)
            return shoal_err_set(err, SHOAL_EFORMAT, "tensor '%s': bad spine flag", t->name);
    }
    return 0;
}

static int check_experts(const manifest *m, shoal_err *err)
{
    manifest_expert *byp;
    int rc = 0;

    if (m->nexperts == 0)
        return 0;
    if (m->expert_bytes == 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "experts listed but expert_bytes is 0");
    for (size_t i = 0; i < m->nexperts; i++) {
        const manifest_expert *e = &m->experts[i];
        if (i > 0 && expert_cmp(&m->experts[i - 1], e) >= 0)
            return shoal_err_set(err, SHOAL_EFORMAT, "expert (%" PRIu32 ", %" PRIu32
                                 "): not sorted or listed twice", e->layer, e->id);
        if (e->layer >= m->n_layers || e->id >= m->experts_per_layer)
            return shoal_err_set(err, SHOAL_ERANGE, "expert (%" PRIu32 ", %" PRIu32
                                 "): outside %" PRIu32 " layers x %" PRIu32 " experts",
                                 e->layer, e->id, m->n_layers, m->experts_per_layer);
        if (e->file >= m->nfiles)
            return shoal_err_set(err, SHOAL_EFORMAT, "expert (%" PRIu32 ", %" PRIu32
                                 "): file index out of range", e->layer, e->id);
        if (!fits(e->offset, m->expert_bytes, m->files[e->file].size))
            return shoal_err_set(err, SHOAL_ERANGE, "expert (%" PRIu32 ", %" PRIu32
                                 "): span past the end of '%s'", e->layer, e->id,
                                 m->files[e->file].path);
    }
    byp = malloc(m->nexperts * sizeof *byp);
    if (!byp)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    memcpy(byp, m->experts, m->nexperts * sizeof *byp);
    qsort(byp, m->nexperts, sizeof *byp, expert_pos_cmp);
    for (size_t i = 1; i < m->nexperts && rc == 0; i++)
        if (byp[i].file == byp[i - 1].file && byp[i].offset - byp[i - 1].offset < m->expert_bytes)
            rc = shoal_err_set(err, SHOAL_EFORMAT, "experts (%" PRIu32 ", %" PRIu32 ") and (%"
                               PRIu32 ", %" PRIu32 ") overlap", byp[i - 1].layer, byp[i - 1].id,
                               byp[i].layer, byp[i].id);
    free(byp);
    return rc;
}

int manifest_check(const manifest *m, shoal_err *err)
{
    int rc;
    if (!str_ok(m->endpoint) || !str_ok(m->repo) || !str_ok(m->revision) || !str_ok(m->commit))
        return shoal_err_set(err, SHOAL_EFORMAT, "model identity strings are too long or not UTF-8");
    if (!m->commit[0])
        return shoal_err_set(err, SHOAL_EFORMAT, "the manifest names no commit");
    if (m->config_len > MANIFEST_CONFIG_MAX)
        return shoal_err_set(err, SHOAL_ETOOBIG, "config.json too large");
    rc = check_files(m, err);
    rc = rc ? rc : check_tensors(m, err);
    rc = rc ? rc : check_experts(m, err);
    return rc;
}

/* ---- lookups ---------------------------------------------------------------------- */

const manifest_tensor *manifest_tensor_find(const manifest *m, const char *name)
{
    size_t lo = 0, hi = m->ntensors;
    if (strncmp(name, LM_PREFIX, sizeof LM_PREFIX - 1) == 0)
        name += sizeof LM_PREFIX - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->tensors[mid].name, name);
        if (c == 0)
            return &m->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const manifest_expert *manifest_expert_find(const manifest *m, uint32_t layer, uint32_t id)
{
    manifest_expert key = { layer, id, 0, 0 };
    return bsearch(&key, m->experts, m->nexperts, sizeof *m->experts, expert_cmp);
}

/* ---- encoding ------------------------------------------------------------------------ */

static int put_str(shoal_buf *b, const char *s, size_t n)
{
    int rc = shoal_buf_append_le32(b, (uint32_t)n);
    return rc ? rc : shoal_buf_append(b, s, n);
}

static int encode_body(const manifest *m, shoal_buf *b)
{
    int rc = put_str(b, m->endpoint, strlen(m->endpoint));
    rc = rc ? rc : put_str(b, m->repo, strlen(m->repo));
    rc = rc ? rc : put_str(b, m->revision, strlen(m->revision));
    rc = rc ? rc : put_str(b, m->commit, strlen(m->commit));
    rc = rc ? rc : put_str(b, (const char *)m->config, m->config_len);
    rc = rc ? rc : shoal_buf_append_le32(b, m->n_layers);
    rc = rc ? rc : shoal_buf_append_le32(b, m->experts_per_layer);
    rc = rc ? rc : shoal_buf_append_le64(b, m->expert_bytes);
    rc = rc ? rc : shoal_buf_append_le32(b, (uint32_t)m->nfiles);
    for (size_t i = 0; rc == 0 && i < m->nfiles; i++) {
        const manifest_file *f = &m->files[i];
        rc = put_str(b, f->path, strlen(f->path));
        rc = rc ? rc : put_str(b, f->etag, strlen(f->etag));
        rc = rc ? rc : shoal_buf_append_le64(b, f->size);
    }
    rc = rc ? rc : shoal_buf_append_le32(b, (uint32_t)m->ntensors);
    for (size_t i = 0; rc == 0 && i < m->ntensors; i++) {
        const manifest_tensor *t = &m->tensors[i];
        rc = put_str(b, t->name, strlen(t->name));
        rc = rc ? rc : shoal_buf_append_le32(b, t->file);
        rc = rc ? rc : shoal_buf_append_le64(b, t->offset);
        rc = rc ? rc : shoal_buf_append_le64(b, t->length);
        rc = rc ? rc : put_str(b, t->dtype, strlen(t->dtype));
        rc = rc ? rc : shoal_buf_append_u8(b, (uint8_t)t->ndim);
        rc = rc ? rc : shoal_buf_append_u8(b, (uint8_t)t->is_spine);
        for (uint32_t d = 0; rc == 0 && d < t->ndim; d++)
            rc = shoal_buf_append_le64(b, t->shape[d]);
    }
    rc = rc ? rc : shoal_buf_append_le32(b, (uint32_t)m->nexperts);
    for (size_t i = 0; rc == 0 && i < m->nexperts; i++) {
        const manifest_expert *e = &m->experts[i];
        rc = shoal_buf_append_le32(b, e->layer);
        rc = rc ? rc : shoal_buf_append_le32(b, e->id);
        rc = rc ? rc : shoal_buf_append_le32(b, e->file);
        rc = rc ? rc : shoal_buf_append_le64(b, e->offset);
    }
    return rc;
}

int manifest_encode(const manifest *m, shoal_buf *out, shoal_err *err)
{
    size_t start = out->len, body;
    uint8_t hdr[MAN_HDR_SIZE] = { 0 };
    int rc = manifest_check(m, err);

    if (rc)
        return rc;
    memcpy(hdr, MAN_MAGIC, 8);
    shoal_wr_le32(hdr + 8, MANIFEST_VERSION);
    rc = shoal_buf_append(out, hdr, sizeof hdr);
    rc = rc ? rc : encode_body(m, out);
    if (rc == 0) {
        body = out->len - start - MAN_HDR_SIZE;
        shoal_wr_le64(out->data + start + 16, body);
        rc = shoal_buf_append_le64(out, XXH64(out->data + start, out->len - start, 0));
    }
    if (rc == 0 && out->len - start > MANIFEST_ENCODED_MAX)
        rc = SHOAL_ETOOBIG;
    if (rc) {
        out->len = start;
        return shoal_err_set(err, rc, "encoding the manifest: %s", shoal_strerror(rc));
    }
    return 0;
}

/* A bounds-checked reader over the body. */
typedef struct cur {
    const uint8_t *p;
    size_t         left;
    int            bad;
} cur;

static const uint8_t *take(cur *c, size_t n)
{
    const uint8_t *p;
    if (c->bad || n > c->left) {
        c->bad = 1;
        return NULL;
    }
    p = c->p;
    c->p += n;
    c->left -= n;
    return p;
}

static uint32_t get32(cur *c)
{
    const uint8_t *p = take(c, 4);
    return p ? shoal_rd_le32(p) : 0;
}

static uint64_t get64(cur *c)
{
    const uint8_t *p = take(c, 8);
    return p ? shoal_rd_le64(p) : 0;
}

/* A string of at most max bytes, NUL-terminated copy (caller frees). */
static char *get_str(cur *c, size_t max)
{
    uint32_t n = get32(c);
    const uint8_t *p;
    char *s;
    if (n > max) {
        c->bad = 1;
        return NULL;
    }
    p = take(c, n);
    if (!p)
        return NULL;
    if (memchr(p, 0, n)) {
        c->bad = 1;
        return NULL;
    }
    s = malloc((size_t)n + 1);
    if (!s) {
        c->bad = 1;
        return NULL;
    }
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* Reserve room for count entries of min_bytes each, refusing counts the
 * remaining input cannot hold (so a hostile count cannot force a huge
 * allocation). */
static void *get_array(cur *c, uint32_t count, size_t min_bytes, size_t elem)
{
    void *a;
    if (c->bad || (uint64_t)count * min_bytes > c->left) {
        c->bad = 1;
        return NULL;
    }
    a = calloc(count ? count : 1, elem);
    if (!a)
        c->bad = 1;
    return a;
}

static int decode_tables(cur *c, manifest *m)
{
    uint32_t n = get32(c);
    m->files = get_array(c, n, 24, sizeof *m->files);
    for (uint32_t i = 0; !c->bad && i < n; i++) {
        manifest_file *f = &m->files[i];
        f->path = get_str(c, MANIFEST_STR_MAX);
        f->etag = get_str(c, MANIFEST_ETAG_MAX);
        f->size = get64(c);
        m->nfiles = i + 1;
    }
    m->cap_files = m->nfiles;
    n = get32(c);
    m->tensors = get_array(c, n, 30, sizeof *m->tensors);
    for (uint32_t i = 0; !c->bad && i < n; i++) {
        manifest_tensor *t = &m->tensors[i];
        char *dt;
        const uint8_t *p;
        t->name = get_str(c, MANIFEST_STR_MAX);
        m->ntensors = i + 1;
        t->file = get32(c);
        t->offset = get64(c);
        t->length = get64(c);
        dt = get_str(c, MANIFEST_DTYPE_MAX - 1);
        if (dt)
            memcpy(t->dtype, dt, strlen(dt) + 1);
        free(dt);
        p = take(c, 2);
        if (!p)
            break;
        t->ndim = p[0];
        t->is_spine = p[1];
        if (t->ndim > MANIFEST_MAX_DIMS) {
            c->bad = 1;
            break;
        }
        for (uint32_t d = 0; d < t->ndim; d++)
            t->shape[d] = get64(c);
    }
    m->cap_tensors = m->ntensors;
    n = get32(c);
    m->experts = get_array(c, n, 20, sizeof *m->experts);
    for (uint32_t i = 0; !c->bad && i < n; i++) {
        manifest_expert *e = &m->experts[i];
        e->layer = get32(c);
        e->id = get32(c);
        e->file = get32(c);
        e->offset = get64(c);
        m->nexperts = i + 1;
    }
    m->cap_experts = m->nexperts;
    return c->bad ? SHOAL_EFORMAT : 0;
}

int manifest_decode(const uint8_t *p, size_t n, manifest **out, shoal_err *err)
{
    manifest *m = NULL;
    uint64_t body, sum;
    uint32_t version;
    cur c;
    int rc;

    *out = NULL;
    if (n < MAN_HDR_SIZE + MAN_TRAILER || memcmp(p, MAN_MAGIC, 8) != 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "not a shoal manifest (bad magic or too short)");
    version = shoal_rd_le32(p + 8);
    if (version != MANIFEST_VERSION)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "manifest version %" PRIu32
                             ", this build reads version %d", version, MANIFEST_VERSION);
    body = shoal_rd_le64(p + 16);
    if (shoal_rd_le32(p + 12) != 0 || shoal_rd_le64(p + 24) != 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "manifest: reserved header fields are not 0");
    if (body != n - MAN_HDR_SIZE - MAN_TRAILER)
        return shoal_err_set(err, SHOAL_EFORMAT, "manifest: body length %" PRIu64
                             " does not match the %zu bytes given", body, n);
    sum = shoal_rd_le64(p + n - MAN_TRAILER);
    if (XXH64(p, n - MAN_TRAILER, 0) != sum)
        return shoal_err_set(err, SHOAL_ECORRUPT, "manifest: checksum mismatch");
    m = calloc(1, sizeof *m);
    if (!m)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    c = (cur){ p + MAN_HDR_SIZE, (size_t)body, 0 };
    m->endpoint = get_str(&c, MANIFEST_STR_MAX);
    m->repo = get_str(&c, MANIFEST_STR_MAX);
    m->revision = get_str(&c, MANIFEST_STR_MAX);
    m->commit = get_str(&c, MANIFEST_STR_MAX);
    {
        uint32_t cl = get32(&c);
        const uint8_t *cp = cl <= MANIFEST_CONFIG_MAX ? take(&c, cl) : NULL;
        if (cp && (m->config = malloc(cl ? cl : 1)) != NULL) {
            memcpy(m->config, cp, cl);
            m->config_len = cl;
        } else {
            c.bad = 1;
        }
    }
    m->n_layers = get32(&c);
    m->experts_per_layer = get32(&c);
    m->expert_bytes = get64(&c);
    rc = decode_tables(&c, m);
    if (rc == 0 && c.left != 0)
        rc = SHOAL_EFORMAT;
    for (size_t i = 0; rc == 0 && i < m->nfiles; i++)
        if (!m->files[i].path || !m->files[i].etag)
            rc = SHOAL_EFORMAT;
    for (size_t i = 0; rc == 0 && i < m->ntensors; i++)
        if (!m->tensors[i].name)
            rc = SHOAL_EFORMAT;
    if (rc) {
        manifest_free(m);
        return shoal_err_set(err, rc, "manifest: truncated or malformed body");
    }
    rc = manifest_check(m, err);
    if (rc) {
        shoal_err_wrap(err, rc, "manifest");
        manifest_free(m);
        return rc;
    }
    *out = m;
    return 0;
}
