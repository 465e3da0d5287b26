/* remote.c — bind a model through shoald (see source.h part 2).
 *
 * Connect: HELLO, OPEN (the OPEN_OK descriptor is the manifest's
 * encoding), manifest_decode: the config is known and nothing is read.
 *
 * Bind, int8 / int4 spine with the cache on (docs/engine.md "Cached
 * spine"):
 *   1. GET the derived object spine_pack_name(mode).  When it is there it
 *      is read into memory (spine_resident.c), hashed as it is read
 *      against the GET_ITEM's XXH3-128 (with a streamed part, that part is
 *      read once only to be hashed, each streamed layer's range hashed on
 *      its own for the checks of every later read: spine_stream.c), and
 *      parsed strictly.  Damaged: a warning, a REPORT (shoald removes it)
 *      and step 2.  The model takes every matrix from it and only the
 *      tensors it does not cover (vectors, norms, the embedding) are
 *      GET'd.  Nothing is quantized.
 *   2. Not there: PUT_BEGIN hands out the object's own file; the engine
 *      GETs the BF16 spine, quantizes tensor by tensor and writes each
 *      matrix straight into that file (no temporary copy, one matrix in
 *      memory at a time), commits with the hash, and reads the stored
 *      pack into memory as a second run does.  A daemon without PUT_BEGIN,
 *      or a budget too small, gets the pack through an unlinked temporary
 *      file instead (PUT, or nothing stored), read back the same way.
 * Any refusal is a warning and a fallback (quantizing in memory), never a
 * failed load.  The f32 spine, and --spine-cache off, quantize in memory
 * from the mapped BF16 tensors, exactly as from a directory.  Every
 * tensor GET'd is hashed as mapped against its GET_ITEM's XXH3-128; a
 * damaged one is reported and asked for once more (docs/engine.md
 * "Checked reads").
 */
#include "engine/source/source.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>
#include "common/xxh3.h"

#include "common/buf.h"
#include "common/client.h"
#include "common/json.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/path.h"
#include "common/platform.h"
#include "common/sys.h"
#include "engine/forward/forward.h"

struct engine_remote {
    shoal_client *client;
    shoal_model_info info;
    manifest *man;
    k3_config cfg;             /* the manifest's config, parsed */
    engine_model *model;
    expert_source *src;
    engine_remote_options ro;
    int timeout_ms;
    int opened;                /* OPEN succeeded: RELEASE on free */
    int spine_cache;           /* use and store the spine pack */
    struct spine_maps *sm;     /* spine tensors mapped (freed after the model) */
    spine_pack *pack;          /* the pack, parsed, when used */
    spine_resident res;        /* its bytes in memory */
    int stream_layers;         /* the plan's streamed layers (docs/engine.md "Smaller machines") */
    int pack_fd;               /* streamed: the pack's descriptor, kept (-1 none) */
    uint64_t pack_off, pack_filled;   /* its offset in pack_fd; bytes read at load so far */
    engine_remote_spine spine;
    /* to reconnect (engine_remote_reconnect): what to OPEN again and how
     * to reach the daemon; the expert source follows `link` */
    char *spec, *home, *socket_path;
    expert_source_shoald_link link;
};

/* The spine mappings, released after the model. */
typedef struct spine_maps {
    shoal_view *v;
    size_t n;
} spine_maps;

static void spine_maps_free(void *ctx)
{
    spine_maps *sm = ctx;
    if (!sm)
        return;
    for (size_t i = 0; i < sm->n; i++)
        if (sm->v[i].base)
            munmap(sm->v[i].base, sm->v[i].maplen);
    free(sm->v);
    free(sm);
}

int engine_remote_is_spec(const char *spec)
{
    return spec && strncmp(spec, "hf://", 5) == 0;
}

/* OPEN_OK's descriptor: the manifest's encoding. */
static int manifest_read(engine_remote *r, const char *spec, shoal_err *err)
{
    uint8_t *buf;
    int rc;

    if (r->info.manifest_fd < 0 || r->info.manifest_len == 0 ||
        r->info.manifest_len > MANIFEST_ENCODED_MAX)
        return shoal_err_set(err, SHOAL_EPROTO, "%s: shoald sent no usable manifest", spec);
    if (!(buf = malloc((size_t)r->info.manifest_len)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    rc = shoal_pread_all(r->info.manifest_fd, buf, (size_t)r->info.manifest_len, 0);
    if (rc != 0)
        rc = shoal_err_set(err, SHOAL_EIO, "%s: reading the manifest from shoald failed", spec);
    else if ((rc = manifest_decode(buf, (size_t)r->info.manifest_len, &r->man, err)) != 0)
        shoal_err_wrap(err, rc, "%s: manifest from shoald", spec);
    free(buf);
    close(r->info.manifest_fd);
    r->info.manifest_fd = -1;
    return rc;
}

/* GET keys[0..n) (n <= SHOAL_PROTO_MAX_KEYS) and map each into views[i]
 * (those already mapped are not asked for), hashing each object's bytes
 * against the item's XXH3-128: bad[i] set (and views[i] unmapped) for
 * one that does not match. */
static int get_mapped_once(engine_remote *r, const shoal_key *keys, size_t n, shoal_view *views,
                           uint8_t *bad, shoal_err *err)
{
    uint64_t request;
    size_t got = 0;
    int rc = shoal_client_get_send(r->client, r->info.handle, 0, keys, n, &request, err);

    while (rc == 0 && got < n) {
        shoal_item it;
        if ((rc = shoal_client_next(r->client, r->timeout_ms, &it, err)) != 0)
            return shoal_err_wrap(err, rc, "shoald: %zu of %zu objects received", got, n);
        if (it.request != request) {
            shoal_item_release(&it, NULL);
            continue;
        }
        got++;
        if (it.status != 0 || it.index >= n)
            rc = shoal_err_set(err, it.status ? it.status : SHOAL_EPROTO,
                               "shoald could not deliver %.*s: %s",
                               it.index < n ? (int)keys[it.index].name_len : 1,
                               it.index < n ? keys[it.index].name : "?", shoal_strerror(it.status));
        else if (views[it.index].base)
            rc = shoal_err_set(err, SHOAL_EPROTO, "shoald sent item %u twice", it.index);
        else
            rc = shoal_item_map(&it, 0, &views[it.index], err);
        if (rc == 0) {
            /* checked as mapped (docs/engine.md "Checked reads"): the first
             * touch of the pages is the hash's, the use after finds them cached */
            XXH128_canonical_t can;
            shoal_view *v = &views[it.index];
            shoal_xxh3_once(v->data, (size_t)v->length, can.digest);
            bad[it.index] = memcmp(can.digest, it.xxh128, 16) != 0;
            if (bad[it.index]) {
                munmap(v->base, v->maplen);
                memset(v, 0, sizeof *v);
            }
        }
        shoal_item_release(&it, NULL);     /* closes the descriptor; the mapping stays */
        if (rc != 0 && !it.last)
            shoal_client_cancel(r->client, request, NULL);
    }
    return rc;
}

/* get_mapped_once, and for each object that read back damaged: a
 * warning, a REPORT (shoald removes it), one more GET (fetched again);
 * still damaged is an error that says what to do. */
static int get_mapped(engine_remote *r, const shoal_key *keys, size_t n, shoal_view *views,
                      shoal_err *err)
{
    uint8_t bad[SHOAL_PROTO_MAX_KEYS] = { 0 };
    shoal_key again[SHOAL_PROTO_MAX_KEYS];
    size_t idx[SHOAL_PROTO_MAX_KEYS], m = 0;
    shoal_view v2[SHOAL_PROTO_MAX_KEYS];
    int rc;

    if (n > SHOAL_PROTO_MAX_KEYS)
        return shoal_err_set(err, SHOAL_EINTERNAL, "get_mapped: %zu keys", n);
    if ((rc = get_mapped_once(r, keys, n, views, bad, err)) != 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        const char *kind = keys[i].kind == SHOAL_KEY_FILE ? "file" : "tensor";
        char name[SHOAL_PROTO_MAX_STR + 1];
        shoal_err re = { 0 };
        if (!bad[i])
            continue;
        snprintf(name, sizeof name, "%.*s", (int)keys[i].name_len, keys[i].name);
        LOG_WARN("remote", "%s: %s %s read back damaged from shoald's cache (its XXH3-128 does "
                 "not match the index's): reported, fetching it again", r->spec, kind, name);
        if (checked_read_report_object(r->client, r->info.handle, kind, name, &re) != 0)
            LOG_WARN("remote", "%s: REPORT of the damaged %s %s failed: %s", r->spec, kind, name,
                     re.msg);
        again[m] = keys[i];
        idx[m++] = i;
    }
    if (m == 0)
        return 0;
    memset(v2, 0, sizeof v2);
    memset(bad, 0, sizeof bad);
    rc = get_mapped_once(r, again, m, v2, bad, err);
    for (size_t j = 0; j < m; j++) {
        views[idx[j]] = v2[j];
        if (rc == 0 && bad[j])
            rc = shoal_err_set(err, SHOAL_ECORRUPT, "%.*s read back damaged from shoald's cache "
                               "twice (fetched again after the REPORT, still not its XXH3-128): "
                               "check the disk under shoald's cache and run `shoal verify "
                               "--deep %s`", (int)again[j].name_len, again[j].name, r->spec);
    }
    if (rc == 0)
        LOG_INFO("remote", "%s: %zu damaged object%s fetched again, checked", r->spec, m,
                 m == 1 ? "" : "s");
    return rc;
}

/* GET every spine tensor not mapped yet that the pack (when set) does not
 * cover, and fill tv with every mapped one the pack does not cover.  *nv:
 * views filled. */
static int spine_fetch(engine_remote *r, engine_tensor_view *tv, size_t *nv, uint64_t *bytes,
                       shoal_err *err)
{
    const manifest *man = r->man;
    shoal_key *keys = calloc(SHOAL_PROTO_MAX_KEYS, sizeof *keys);
    size_t *idx = calloc(SHOAL_PROTO_MAX_KEYS, sizeof *idx);
    shoal_view *v = calloc(SHOAL_PROTO_MAX_KEYS, sizeof *v);
    size_t n = 0;
    int rc = 0;

    if (!keys || !idx || !v)
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i <= man->ntensors; i++) {
        if (i < man->ntensors) {
            const manifest_tensor *t = &man->tensors[i];
            if (r->sm->v[i].base || (r->pack && spine_pack_covers(r->pack, t->name)))
                continue;
            keys[n] = (shoal_key){ .kind = SHOAL_KEY_TENSOR, .name = t->name,
                                   .name_len = (uint16_t)strlen(t->name) };
            idx[n++] = i;
        }
        if (n == 0 || (n < SHOAL_PROTO_MAX_KEYS && i < man->ntensors))
            continue;
        memset(v, 0, n * sizeof *v);
        rc = get_mapped(r, keys, n, v, err);
        for (size_t j = 0; j < n; j++)   /* mapped ones are kept, also on failure */
            r->sm->v[idx[j]] = v[j];
        n = 0;
    }
    *nv = 0;
    *bytes = 0;
    for (size_t i = 0; rc == 0 && i < man->ntensors; i++) {
        const manifest_tensor *t = &man->tensors[i];
        if (!r->sm->v[i].base)
            continue;
        if (r->pack && spine_pack_covers(r->pack, t->name)) {
            /* the BF16 bytes of a matrix the pack holds: not needed any more */
            munmap(r->sm->v[i].base, r->sm->v[i].maplen);
            memset(&r->sm->v[i], 0, sizeof r->sm->v[i]);
            continue;
        }
        if (r->sm->v[i].length != t->length) {
            rc = shoal_err_set(err, SHOAL_EPROTO, "tensor %s: shoald sent %llu bytes, the "
                               "manifest says %llu", t->name,
                               (unsigned long long)r->sm->v[i].length,
                               (unsigned long long)t->length);
            break;
        }
        tv[*nv] = (engine_tensor_view){ .name = t->name, .dtype = t->dtype, .ndim = t->ndim,
                                        .data = r->sm->v[i].data, .length = t->length };
        memcpy(tv[*nv].shape, t->shape, sizeof tv[*nv].shape);
        (*nv)++;
        *bytes += t->length;
    }
    free(keys);
    free(idx);
    free(v);
    return rc;
}

/* ---- the cached spine (docs/engine.md, "Cached spine") -------------------- */

static void progress(engine_remote *r, const char *phase, uint64_t done, uint64_t total)
{
    if (r->ro.progress)
        r->ro.progress(r->ro.progress_ctx, phase, done, total);
}

/* PROGRESS frames of shoald's work on the pack (hashing it at commit). */
static void on_daemon_progress(const shoal_progress *p, void *ctx)
{
    progress(ctx, "storing", p->done, p->total);
}

/* Bring [off, off+len) of fd into memory, hashing it against `xxh` (the
 * index's), and parse it as the pack of `mode`: 0 with r->pack, or a
 * negative code with e filled (SHOAL_ECORRUPT: the bytes do not match).
 * A streamed pack's hash is known only once its streamed part went by
 * (pack_stream checks it). */
static int pack_take(engine_remote *r, int fd, uint64_t off, uint64_t len, engine_spine mode,
                     const uint8_t xxh[16], shoal_err *e)
{
    uint64_t fill = len;
    uint8_t head[64];
    int rc;

    /* streamed: only the header and table now; the resident part once the
     * model says where the streamed part begins (spine_load) */
    if (r->stream_layers > 0 && r->ro.spine_load == SPINE_LOAD_READ &&
        pread(fd, head, sizeof head, (off_t)off) == (ssize_t)sizeof head) {
        fill = shoal_rd_le64(head + 40);
        if (fill > len)
            fill = len;
        if (r->pack_fd < 0)
            r->pack_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        r->pack_off = off;
    }
    rc = spine_resident_read_part(fd, off, len, fill, r->ro.spine_load,
                                  r->ro.io_threads > 0 ? r->ro.io_threads : 8, xxh, &r->res, e);
    r->pack_filled = fill;
    if (rc == 0 && fill == len && spine_resident_check(&r->res) < 0)
        rc = shoal_err_set(e, SHOAL_ECORRUPT, "its %llu bytes do not hash to the XXH3-128 "
                           "shoald's index holds for it", (unsigned long long)len);
    if (rc == 0)
        rc = spine_pack_open(r->res.data, r->res.length, mode, r->man->config,
                             r->man->config_len, &r->pack, e);
    if (rc != 0) {
        spine_resident_free(&r->res);
        return rc;
    }
    r->spine.pack_bytes = len;
    r->spine.direct = r->res.direct;
    r->spine.mapped = r->res.mapped;
    r->spine.locked = r->res.locked;
    r->spine.read_ms = r->res.ms;
    return 0;
}

static void pack_drop(engine_remote *r)
{
    spine_pack_free(r->pack);
    r->pack = NULL;
    spine_resident_free(&r->res);
    if (r->pack_fd >= 0)
        close(r->pack_fd);
    r->pack_fd = -1;
}

/* The cached pack read back damaged (why): a warning, a REPORT (shoald
 * removes it, so the next PUT_BEGIN stores a fresh one), and it is
 * dropped; the caller builds it again from the BF16 tensors. */
static void pack_damaged(engine_remote *r, const char *name, const char *why)
{
    shoal_err re = { 0 };

    LOG_WARN("remote", "%s: cached spine pack %s read back damaged (%s): reported to shoald, "
             "building it again from the BF16 tensors", r->spec, name, why);
    if (checked_read_report_object(r->client, r->info.handle, "derived", name, &re) != 0)
        LOG_WARN("remote", "%s: REPORT of the damaged pack %s failed: %s", r->spec, name, re.msg);
    r->spine.damaged++;
    pack_drop(r);
}

/* GET the pack shoald keeps for this model and take it.  0 with r->pack;
 * 1: not there (or damaged: reported, dropped); -1: there but refused
 * (warned). */
static int pack_get(engine_remote *r, engine_spine mode)
{
    const char *name = spine_pack_name(mode);
    shoal_key k = { .kind = SHOAL_KEY_DERIVED, .name = name, .name_len = (uint16_t)strlen(name) };
    shoal_err e = { 0 };
    uint64_t request;
    shoal_item it = { .fd = -1 };
    int rc = shoal_client_get_send(r->client, r->info.handle, 0, &k, 1, &request, &e);

    while (rc == 0) {
        if ((rc = shoal_client_next(r->client, r->timeout_ms, &it, &e)) != 0)
            break;
        if (it.request == request)
            break;
        shoal_item_release(&it, NULL);
    }
    if (rc == 0 && it.status == SHOAL_ENOTFOUND) {
        shoal_item_release(&it, NULL);
        return 1;
    }
    if (rc == 0 && it.status != 0)
        rc = shoal_err_set(&e, it.status, "%s", shoal_strerror(it.status));
    if (rc == 0)
        rc = pack_take(r, it.fd, it.offset, it.length, mode, it.xxh128, &e);
    shoal_item_release(&it, NULL);
    if (rc == SHOAL_ECORRUPT) {
        pack_damaged(r, name, e.msg);
        return 1;
    }
    if (rc != 0) {
        LOG_WARN("remote", "%s: cached spine pack %s refused: %s; quantizing instead", r->spec,
                 name, e.msg);
        r->spine.refused = 1;
        return -1;
    }
    return 0;
}

/* An unlinked file for a pack shoald will not take directly: on disk
 * (/var/tmp is disk-backed by convention), so its pages are reclaimable;
 * a memfd would hold a second copy of the spine in RAM.  memfd where that
 * fails. */
static int tmp_fd(void)
{
    int fd = shoal_tmpfile("/var/tmp");
    return fd >= 0 ? fd : shoal_anon_file("shoal-spine-pack");
}

/* Quantize the BF16 spine (the views tv[0..nv)) into writer w (begun on
 * its file) through a build-only model, and finish. */
static int pack_fill(engine_remote *r, const engine_model_options *mo, spine_pack_writer *w,
                     const engine_tensor_view *tv, size_t nv, uint8_t xxh[16], shoal_err *err)
{
    engine_model_options o = *mo;
    engine_model *bm = NULL;
    int rc;

    o.pack = NULL;
    o.pack_out = w;
    o.stream_layers = 0;
    o.progress = r->ro.progress;
    o.progress_ctx = r->ro.progress_ctx;
    rc = engine_model_open_views(r->spec, r->man->config, r->man->config_len, tv, nv, NULL, NULL,
                                 &o, &bm, err);
    engine_model_free(bm);
    return rc ? rc : spine_pack_writer_finish(w, xxh, err);
}

/* Store through PUT_BEGIN / PUT_COMMIT, or through a temporary file (PUT,
 * or not stored at all when the budget refused it), then take the pack
 * from those bytes.  0 with r->pack; 2: another engine stored it first
 * (GET it); a negative code: quantize in memory instead (warned). */
static int pack_build(engine_remote *r, const engine_model_options *mo)
{
    const char *name = spine_pack_name(mo->spine);
    spine_pack_writer *w = NULL;
    shoal_put put = { .fd = -1 };
    shoal_err e = { 0 }, pe = { 0 };
    uint8_t xxh[16];
    uint64_t len = 0, t0 = shoal_now_ns(), bytes;
    engine_tensor_view *tv = calloc(r->man->ntensors + 1, sizeof *tv);
    size_t nv = 0;
    int fd = -1, keep = -1, direct = 0, store = 1, rc, prc;

    /* the BF16 spine first: shoald's budget must hold it before the pack */
    rc = tv ? spine_fetch(r, tv, &nv, &bytes, &e) : shoal_err_set(&e, SHOAL_ENOMEM, "out of memory");
    if (rc == 0)
        rc = spine_pack_writer_new(&r->cfg, mo->spine, r->man->config, r->man->config_len, &w, &e);
    if (rc == 0) {
        len = spine_pack_writer_length(w);
        prc = shoal_client_put_begin(r->client, r->info.handle, name, len, &put, &pe);
        if (prc == SHOAL_EEXIST) {
            spine_pack_writer_free(w);
            free(tv);
            return 2;
        }
        if (prc == 0) {
            fd = put.fd;
            direct = 1;
        } else {
            store = prc != SHOAL_ENOSPC;
            if (store)
                LOG_INFO("remote", "%s: shoald cannot take the pack directly (%s): building "
                         "it in a temporary file and PUTting that", r->spec, pe.msg);
            else
                LOG_WARN("remote", "%s: could not store the spine pack (%s); building it in a "
                         "temporary file, the next load builds it again", r->spec, pe.msg);
            if ((fd = tmp_fd()) < 0)
                rc = shoal_err_set(&e, SHOAL_EIO, "no temporary file for the spine pack");
        }
    }
    if (rc == 0 && (rc = spine_pack_writer_begin(w, fd, &e)) == 0)
        rc = pack_fill(r, mo, w, tv, nv, xxh, &e);
    free(tv);
    r->spine.built = rc == 0;
    if (rc == 0 && direct) {
        /* commit closes put.fd: a copy of it to read the pack back from */
        keep = dup(fd);
        shoal_client_on_progress(r->client, on_daemon_progress, r);
        prc = shoal_client_put_commit(r->client, &put, xxh, &pe);
        shoal_client_on_progress(r->client, NULL, NULL);
        r->spine.stored = r->spine.put_direct = prc == 0;
        if (prc != 0)
            LOG_WARN("remote", "%s: could not store the spine pack (%s); the next load "
                     "builds it again", r->spec, pe.msg);
        fd = keep;
    } else if (rc == 0 && store) {
        prc = shoal_client_put(r->client, r->info.handle, name, fd, len, xxh, &pe);
        r->spine.stored = prc == 0;
        if (prc != 0 && prc != SHOAL_EEXIST)
            LOG_WARN("remote", "%s: could not store the spine pack (%s); the next load "
                     "quantizes again", r->spec, pe.msg);
    } else if (direct) {
        shoal_client_put_abort(r->client, &put, NULL);
        fd = -1;
    }
    if (rc == 0 && fd < 0)
        rc = shoal_err_set(&e, SHOAL_EIO, "spine pack: no descriptor to read it back");
    if (rc == 0)
        rc = pack_take(r, fd, 0, len, mo->spine, xxh, &e);
    if (fd >= 0)
        close(fd);
    spine_pack_writer_free(w);
    if (rc != 0) {
        LOG_WARN("remote", "%s: building the spine pack failed: %s; quantizing in memory", r->spec,
                 e.msg);
        return rc;
    }
    LOG_INFO("remote", "%s: spine pack %s built (%.1f MiB) in %.1f ms%s", r->spec, name,
             (double)len / 1048576.0, (double)(shoal_now_ns() - t0) / 1e6,
             r->spine.stored ? ", stored in shoald's cache" : "");
    return 0;
}

/* A streamed layer read back damaged at run time (spine_stream.c, on
 * the thread running the pass): REPORT the pack, so the next load builds
 * it again; the pass fails with the layer named. */
static void on_stream_damaged(void *ctx, int layer)
{
    engine_remote *r = ctx;
    const char *name = spine_pack_name(r->spine.mode);
    shoal_err re = { 0 };

    LOG_ERROR("remote", "%s: layer %d of the streamed spine read back damaged from the pack %s "
              "in shoald's cache: reported; this engine cannot run a pass until it is restarted "
              "(the next load builds the pack again)", r->spec, layer, name);
    if (checked_read_report_object(r->client, r->info.handle, "derived", name, &re) != 0)
        LOG_WARN("remote", "%s: REPORT of the damaged pack %s failed: %s", r->spec, name, re.msg);
}

/* The plan's streamed layers from the pack: streamed in place, and the
 * resident part (the header and table are in) read now; then the
 * streamed part read once only to finish the pack's hash, each streamed
 * layer's range hashed on the way for the check of every later read.
 * SHOAL_ECORRUPT: the pack does not match its index hash. */
static int pack_stream(engine_remote *r, shoal_err *err)
{
    uint64_t end, t0;
    int n = (int)r->model->cfg.n_layers, first = n - r->stream_layers, rc;
    int threads = r->ro.io_threads > 0 ? r->ro.io_threads : 8;
    spine_resident_range *rg = NULL;
    uint8_t (*xxh)[16] = NULL;

    if (r->pack_fd < 0)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "a streamed spine needs --spine-load read");
    rc = engine_model_stream_pack(r->model, first, r->pack_fd, r->pack_off,
                                  (uint8_t *)r->res.data, &end, err);
    if (rc == 0)
        rc = spine_resident_fill(&r->res, r->pack_fd, r->pack_filled, end, threads, err);
    if (rc == 0 && (!(rg = calloc((size_t)r->stream_layers, sizeof *rg)) ||
                    !(xxh = calloc((size_t)r->stream_layers, sizeof *xxh))))
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (int l = first; rc == 0 && l < n; l++)
        rc = engine_model_stream_region(r->model, l, &rg[l - first].off, &rg[l - first].len);
    t0 = shoal_now_ns();
    if (rc == 0)
        rc = spine_resident_hash_rest(&r->res, r->pack_fd, rg, (size_t)r->stream_layers, xxh,
                                      threads, err);
    if (rc == 0 && spine_resident_check(&r->res) < 0)
        rc = shoal_err_set(err, SHOAL_ECORRUPT, "its %llu bytes do not hash to the XXH3-128 "
                           "shoald's index holds for it", (unsigned long long)r->res.length);
    if (rc == 0) {
        for (int l = first; l < n; l++)
            engine_model_stream_expect(r->model, l, xxh[l - first]);
        engine_model_stream_on_damaged(r->model, on_stream_damaged, r);
        LOG_INFO("remote", "%s: spine pack: %.1f MiB resident, layers %d-%d streamed from it "
                 "from byte %llu (checked: %.1f MiB of them read once to hash in %.1f ms)",
                 r->spec, (double)end / 1048576.0, first, n - 1, (unsigned long long)end,
                 (double)(r->res.length - end) / 1048576.0,
                 (double)(shoal_now_ns() - t0) / 1e6);
    }
    free(rg);
    free(xxh);
    return rc;
}

/* The spine in the mode of mo: from the cached pack, built into the
 * cache, or quantized in memory. */
static int spine_load(engine_remote *r, const engine_model_options *mo, shoal_err *err)
{
    const manifest *man = r->man;
    engine_tensor_view *tv = calloc(man->ntensors + 1, sizeof *tv);
    engine_model_options o = *mo;
    uint64_t t0 = shoal_now_ns(), bytes = 0;
    size_t nv = 0;
    int rc = 0;

    r->sm = calloc(1, sizeof *r->sm);
    if (!tv || !r->sm || !(r->sm->v = calloc(man->ntensors + 1, sizeof *r->sm->v))) {
        free(tv);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    r->sm->n = man->ntensors;
    r->spine.mode = mo->spine;
    r->stream_layers = mo->stream_layers;
    o.pack = NULL;
    o.pack_out = NULL;
    for (int attempt = 0;; attempt++) {
        if (r->spine_cache && spine_pack_name(mo->spine)) {
            int got = pack_get(r, mo->spine);
            if (got == 1) {
                LOG_INFO("remote", "%s: no cached %s spine yet: building it", r->spec,
                         k3_spine_mode_name((k3_spine_mode)mo->spine));
                int b = pack_build(r, mo);
                got = b == 2 ? pack_get(r, mo->spine) : b;
            }
            if (got == 0)
                o.pack = r->pack;
        }
        if (o.pack)
            o.stream_layers = 0;      /* streamed in place from the pack, below */
        rc = spine_fetch(r, tv, &nv, &bytes, err);
        if (rc == 0) {
            LOG_INFO("remote", "%s: %zu spine tensors (%.1f MiB) from shoald in %.1f ms%s",
                     r->spec, nv, (double)bytes / 1048576.0,
                     (double)(shoal_now_ns() - t0) / 1e6, o.pack ? " beside the spine pack" : "");
            rc = engine_model_open_views(r->spec, man->config, man->config_len, tv, nv, NULL,
                                         NULL, &o, &r->model, err);
            if (rc == 0 && o.pack && r->stream_layers > 0)
                rc = pack_stream(r, err);
        }
        if (rc != SHOAL_ECORRUPT || !o.pack || attempt > 0)
            break;
        /* the streamed pack's hash, known once all of it went by, does not
         * match: built again from the BF16 tensors, once */
        engine_model_free(r->model);      /* before the pack it views (and streams into) */
        r->model = NULL;
        pack_damaged(r, spine_pack_name(mo->spine), err ? err->msg : "?");
        o.pack = NULL;
        o.stream_layers = mo->stream_layers;
        if (err)
            shoal_err_clear(err);
    }
    if (rc != 0 && o.pack) {
        /* a pack that parses but does not fit this model's config */
        LOG_WARN("remote", "%s: cached spine pack refused: %s; quantizing instead", r->spec,
                 err ? err->msg : "?");
        r->spine.refused = 1;
        engine_model_free(r->model);      /* before the pack it views (and streams into) */
        r->model = NULL;
        pack_drop(r);
        o.pack = NULL;
        o.stream_layers = mo->stream_layers;
        rc = spine_fetch(r, tv, &nv, &bytes, err);
        if (rc == 0)
            rc = engine_model_open_views(r->spec, man->config, man->config_len, tv, nv, NULL,
                                         NULL, &o, &r->model, err);
    }
    free(tv);
    if (rc != 0)
        return rc;
    r->spine.from_pack = o.pack != NULL;
    r->spine.load_ms = (double)(shoal_now_ns() - t0) / 1e6;
    LOG_INFO("remote", "%s: spine ready in %.1f ms (%s)", r->spec, r->spine.load_ms,
             o.pack ? "from the spine pack in memory, nothing quantized" : "quantized in memory");
    return 0;
}

void engine_remote_spine_info(const engine_remote *r, engine_remote_spine *out)
{
    *out = r->spine;
}

/* Say so when shoald resolved the model without its Hub: a branch is then
 * its last known commit, and only what the cache holds serves. */
static void upstream_notice(const char *spec, const shoal_model_info *mi)
{
    const char *at = strchr(spec + 5, '@');
    const char *rev = at ? at + 1 : "main";
    char what[160];

    if (mi->upstream != SHOAL_UPSTREAM_OFFLINE && mi->upstream != SHOAL_UPSTREAM_UNREACHABLE)
        return;
    if (strcmp(rev, mi->commit) == 0)
        snprintf(what, sizeof what, "commit %.12s", mi->commit);
    else
        snprintf(what, sizeof what, "%s resolved to its last known commit %.12s", rev, mi->commit);
    LOG_WARN("remote", "%s: %s: %s; only what shoald's cache holds serves", spec,
             mi->upstream == SHOAL_UPSTREAM_OFFLINE ? "offline (HF_HUB_OFFLINE)"
                                                    : "the Hub cannot be reached",
             what);
}

int engine_remote_connect(const char *spec, const engine_remote_options *ro,
                          engine_remote **out, shoal_err *err)
{
    engine_remote *r = calloc(1, sizeof *r);
    shoal_client_opts co = { 0 };
    shoal_json *root = NULL;
    int rc;

    *out = NULL;
    if (!r)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    r->info.manifest_fd = -1;
    r->pack_fd = -1;
    if (ro)
        r->ro = *ro;
    r->timeout_ms = r->ro.timeout_ms > 0 ? r->ro.timeout_ms : 60000;
    r->spine_cache = !r->ro.spine_cache_off;
    /* owned copies: reconnection needs them long after the caller's are gone */
    if (!(r->spec = strdup(spec)) || (r->ro.home && !(r->home = strdup(r->ro.home))) ||
        (r->ro.socket_path && !(r->socket_path = strdup(r->ro.socket_path)))) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto fail;
    }
    r->ro.home = r->home;
    r->ro.socket_path = r->socket_path;
    co.home = r->home;
    co.socket_path = r->socket_path;
    co.name = "shoal-engine";
    co.call_timeout_ms = r->timeout_ms;
    if ((rc = shoal_client_connect(&co, &r->client, err)) != 0)
        goto fail;
    if ((rc = shoal_client_open(r->client, spec, &r->info, err)) != 0) {
        shoal_err_wrap(err, rc, "shoald could not open %s", spec);
        goto fail;
    }
    r->opened = 1;
    upstream_notice(spec, &r->info);
    if ((rc = manifest_read(r, spec, err)) != 0)
        goto fail;
    root = shoal_json_parse((const char *)r->man->config, r->man->config_len, err);
    rc = root ? k3_config_parse(root, &r->cfg, err) : SHOAL_EFORMAT;
    shoal_json_free(root);
    if (rc != 0) {
        shoal_err_wrap(err, rc, "%s: config.json", spec);
        goto fail;
    }
    *out = r;
    return 0;
fail:
    engine_remote_free(r);
    return rc;
}

void engine_remote_config(const engine_remote *r, const uint8_t **config, size_t *len)
{
    *config = r->man->config;
    *len = r->man->config_len;
}

int engine_remote_bind(engine_remote *r, const engine_model_options *mo, uint64_t expert_ram,
                       shoal_err *err)
{
    int rc;

    if ((rc = spine_load(r, mo, err)) != 0)
        return rc;
    if (r->model->cfg.expert_bytes != r->info.expert_bytes)
        return shoal_err_set(err, SHOAL_EPROTO, "%s: shoald's expert span is %llu bytes, the "
                             "config's %llu", r->spec, (unsigned long long)r->info.expert_bytes,
                             (unsigned long long)r->model->cfg.expert_bytes);
    expert_source_shoald_options so = {
        .expert_bytes = r->info.expert_bytes, .n_layers = (int)r->model->cfg.n_layers,
        .experts_per_layer = (int)r->model->cfg.n_experts, .ram_bytes = expert_ram,
        .page_cache = r->ro.page_cache, .timeout_ms = r->timeout_ms,
        .read_part = r->ro.read_part,
    };
    for (int64_t i = 0; i < r->model->cfg.n_layers; i++)
        so.moe_layers += r->model->cfg.layers[i].moe != 0;
    if (!r->ro.page_cache_set) {
        /* docs/performance.md: when every expert fits the RAM tier, cached
         * pages are free re-reads (keep); when they do not, the page cache
         * cannot hold the working set either, and expert pages would only
         * push out the embedding and the spine blobs.  Of the two reads
         * that leave no pages behind, O_DIRECT into huge pages was the
         * faster (0.9 of the disk bound against 1.3-1.5 for dontneed), and
         * falls back to read + DONTNEED where O_DIRECT is refused. */
        uint64_t all = (uint64_t)so.moe_layers * (uint64_t)so.experts_per_layer * so.expert_bytes;
        so.page_cache = all > so.ram_bytes ? EXPERT_PC_DIRECT : EXPERT_PC_KEEP;
    }
    LOG_INFO("remote", "%s: RAM tier %.1f MiB, page cache policy %s", r->spec,
             (double)so.ram_bytes / 1048576.0,
             so.page_cache == EXPERT_PC_KEEP ? "keep"
             : so.page_cache == EXPERT_PC_DONTNEED ? "dontneed" : "direct");
    /* the layer-major prefill reads a layer's set in upstream file order
     * (the source copies the keys) */
    size_t nslots = (size_t)so.n_layers * (size_t)so.experts_per_layer;
    uint64_t *order = calloc(nslots ? nslots : 1, sizeof *order);
    if (!order)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; i < r->man->nexperts; i++) {
        const manifest_expert *me = &r->man->experts[i];
        if (me->layer < (uint32_t)so.n_layers && me->id < (uint32_t)so.experts_per_layer)
            order[(size_t)me->layer * (size_t)so.experts_per_layer + me->id] =
                ((uint64_t)me->file << 40) | (me->offset & (((uint64_t)1 << 40) - 1));
    }
    so.file_order = order;
    r->link = (expert_source_shoald_link){ .client = r->client, .handle = r->info.handle };
    r->src = expert_source_shoald_new_link(&r->link, &so);
    free(order);
    if (!r->src)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    return 0;
}

engine_model *engine_remote_model(engine_remote *r)
{
    return r->model;
}

expert_source *engine_remote_source(engine_remote *r)
{
    return r->src;
}

struct shoal_client *engine_remote_client(engine_remote *r)
{
    return r->client;
}

uint32_t engine_remote_handle(const engine_remote *r)
{
    return r->info.handle;
}

int engine_remote_write_files(engine_remote *r, const char *const *names, size_t n,
                              const char *dir, shoal_err *err)
{
    char path[SHOAL_PATH_MAX];
    int rc = 0;

    for (size_t i = 0; rc == 0 && i < n; i++) {
        shoal_view v = { 0 };
        const void *p;
        size_t len;
        if (strchr(names[i], '/'))
            return shoal_err_set(err, SHOAL_EINVAL, "%s: not a plain file name", names[i]);
        if (shoal_path_join(path, sizeof path, dir, names[i]) != 0)
            return shoal_err_set(err, SHOAL_ETOOBIG, "%s: path too long", dir);
        if (strcmp(names[i], "config.json") == 0) {
            p = r->man->config;
            len = r->man->config_len;
        } else if (manifest_file_find(r->man, names[i]) < 0) {
            continue;
        } else {
            shoal_key k = { .kind = SHOAL_KEY_FILE, .name = names[i],
                            .name_len = (uint16_t)strlen(names[i]) };
            if ((rc = get_mapped(r, &k, 1, &v, err)) != 0)
                break;
            p = v.data;
            len = (size_t)v.length;
        }
        rc = shoal_write_file_atomic(path, p, len, err);
        if (v.base)
            munmap(v.base, v.maplen);
    }
    return rc;
}

int engine_remote_ping(engine_remote *r, shoal_err *err)
{
    char json[96];
    snprintf(json, sizeof json, "{\"tier\":\"ram\",\"hits\":0,\"misses\":0,\"bytes\":0,"
             "\"handle\":%u}", r->info.handle);
    return shoal_client_report(r->client, json, err);
}

int engine_remote_reconnect(engine_remote *r, shoal_err *err)
{
    shoal_client_opts co = { .home = r->home, .socket_path = r->socket_path,
                             .name = "shoal-engine", .call_timeout_ms = r->timeout_ms };
    shoal_client *c = NULL;
    shoal_model_info info = { .manifest_fd = -1 };
    char pinned[SHOAL_PATH_MAX];
    size_t base = strcspn(r->spec + 5, "@") + 5;   /* hf://org/name, without @rev */
    int rc;

    /* the same commit, whatever the revision now points at */
    if (snprintf(pinned, sizeof pinned, "%.*s@%s", (int)base, r->spec, r->info.commit) >=
        (int)sizeof pinned)
        return shoal_err_set(err, SHOAL_ETOOBIG, "%s: model name too long", r->spec);
    if ((rc = shoal_client_connect(&co, &c, err)) != 0)
        return rc;
    if ((rc = shoal_client_open(c, pinned, &info, err)) != 0) {
        shoal_err_wrap(err, rc, "shoald could not open %s again", pinned);
    } else if (strcmp(info.commit, r->info.commit) != 0 || info.layers != r->info.layers ||
               info.experts_per_layer != r->info.experts_per_layer ||
               info.expert_bytes != r->info.expert_bytes) {
        rc = shoal_err_set(err, SHOAL_EPROTO, "%s: shoald now serves another model (commit %s)",
                           r->spec, info.commit);
    }
    if (info.manifest_fd >= 0)
        close(info.manifest_fd);   /* the manifest is the one we hold */
    if (rc != 0) {
        shoal_client_close(c);
        return rc;
    }
    shoal_client_close(r->client);  /* dead: its session went with the old daemon */
    r->client = c;
    r->info.handle = info.handle;
    r->link.client = c;
    r->link.handle = info.handle;
    r->link.epoch++;
    LOG_INFO("remote", "%s: reconnected to shoald (commit %s, handle %u)", r->spec,
             r->info.commit, info.handle);
    return 0;
}

void engine_remote_free(engine_remote *r)
{
    if (!r)
        return;
    expert_source_free(r->src);
    engine_model_free(r->model);
    spine_maps_free(r->sm);      /* the model viewed them: after it */
    pack_drop(r);                /* ... and the pack */
    manifest_free(r->man);
    if (r->info.manifest_fd >= 0)
        close(r->info.manifest_fd);
    if (r->client && r->opened)
        shoal_client_release(r->client, r->info.handle, NULL);
    shoal_client_close(r->client);
    free(r->spec);
    free(r->home);
    free(r->socket_path);
    free(r);
}
