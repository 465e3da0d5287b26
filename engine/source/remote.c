/* remote.c — bind a model through shoald (see source.h part 2).
 *
 * Load: HELLO, OPEN (the OPEN_OK descriptor is the manifest's encoding),
 * manifest_decode, then one batched GET per 1,024 spine tensors; each item
 * is mapped read-only and its descriptor closed at once (the mapping keeps
 * the blob's bytes alive even if shoald evicts it).  The views go to
 * engine_model_open_views, which quantizes the spine exactly as it does
 * from a directory, so both paths compute the same tokens.
 *
 * Cached int8 spine: before the tensors, GET the derived object
 * SPINE_PACK_NAME.  When it is there, checks out and fits the config, the
 * model takes its matrices from the mapped pack and only the tensors it
 * does not cover (vectors, norms, the embedding) are GET'd; nothing is
 * quantized.  Otherwise the load quantizes and then PUTs the pack (an unlinked file)
 * for the next load.  Any refusal is a warning and a fallback, never a
 * failed load.
 */
#include "engine/source/source.h"

#include <fcntl.h>
#include <xxhash.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/client.h"
#include "common/log.h"
#include "common/manifest.h"
#include "common/path.h"
#include "common/sys.h"
#include "engine/forward/forward.h"

struct engine_remote {
    shoal_client *client;
    shoal_model_info info;
    manifest *man;
    engine_model *model;
    expert_source *src;
    int timeout_ms;
    int opened;                /* OPEN succeeded: RELEASE on free */
    int spine_cache;           /* use and store the int8 pack */
    struct spine_maps *sm;     /* spine tensors mapped (freed after the model) */
    spine_pack *pack;          /* the cached pack, parsed, when used */
    shoal_view pack_view;      /* its mapping */
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

uint64_t engine_remote_default_ram(void)
{
    shoal_buf b;
    uint64_t kib = 0;
    shoal_buf_init(&b, 1 << 20);
    if (shoal_read_file("/proc/meminfo", 1 << 20, &b, NULL) == 0 &&
        shoal_buf_append_u8(&b, 0) == 0) {
        const char *p = strstr((const char *)b.data, "MemAvailable:");
        if (p)
            kib = strtoull(p + 13, NULL, 10);
    }
    shoal_buf_free(&b);
    return kib * 1024 / 2;
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

/* GET keys[0..n) (n <= SHOAL_PROTO_MAX_KEYS) and map each into views[i]. */
static int get_mapped(engine_remote *r, const shoal_key *keys, size_t n, shoal_view *views,
                      shoal_err *err)
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
        shoal_item_release(&it, NULL);     /* closes the descriptor; the mapping stays */
        if (rc != 0 && !it.last)
            shoal_client_cancel(r->client, request, NULL);
    }
    return rc;
}

/* ---- the cached int8 spine (docs/engine.md, "Cached int8 spine") ---------- */

/* GET the pack shoald keeps for this model, check it against the blob's
 * XXH3-128 (a damaged blob on disk) and parse it (a pack from another
 * engine version or config).  0 with r->pack, or 1: quantize instead. */
static int pack_fetch(engine_remote *r, const char *spec)
{
    shoal_key k = { .kind = SHOAL_KEY_DERIVED, .name = SPINE_PACK_NAME,
                    .name_len = (uint16_t)strlen(SPINE_PACK_NAME) };
    shoal_err e = { 0 };
    uint64_t request;
    shoal_item it = { .fd = -1 };
    XXH128_canonical_t can;
    int rc = shoal_client_get_send(r->client, r->info.handle, 0, &k, 1, &request, &e);

    while (rc == 0) {
        if ((rc = shoal_client_next(r->client, r->timeout_ms, &it, &e)) != 0)
            break;
        if (it.request == request)
            break;
        shoal_item_release(&it, NULL);
    }
    if (rc == 0 && it.status == SHOAL_ENOTFOUND) {
        LOG_INFO("remote", "%s: no cached spine pack yet: quantizing", spec);
        return 1;
    }
    if (rc == 0 && it.status != 0)
        rc = shoal_err_set(&e, it.status, "%s", shoal_strerror(it.status));
    if (rc == 0)
        rc = shoal_item_map(&it, 0, &r->pack_view, &e);
    if (rc == 0) {
        XXH128_canonicalFromHash(&can, XXH3_128bits(r->pack_view.data, r->pack_view.length));
        if (memcmp(can.digest, it.xxh128, 16) != 0)
            rc = shoal_err_set(&e, SHOAL_ECORRUPT, "its bytes do not match the cache's "
                               "XXH3-128 (damaged on disk? `shoal verify` removes it)");
    }
    if (rc == 0)
        rc = spine_pack_open(r->pack_view.data, r->pack_view.length, r->man->config,
                             r->man->config_len, &r->pack, &e);
    /* the descriptor goes; the mapping stays while the pack is used */
    shoal_item_release(&it, rc == 0 ? NULL : &r->pack_view);
    if (rc != 0) {
        LOG_WARN("remote", "%s: cached spine pack refused: %s; quantizing instead", spec, e.msg);
        r->spine.refused = 1;
        return 1;
    }
    return 0;
}

static void pack_drop(engine_remote *r)
{
    spine_pack_free(r->pack);
    r->pack = NULL;
    if (r->pack_view.base)
        munmap(r->pack_view.base, r->pack_view.maplen);
    memset(&r->pack_view, 0, sizeof r->pack_view);
}

/* Quantized at this load: hand the pack to shoald for the next one.  Any
 * failure only costs the next load a quantization. */
static void pack_store(engine_remote *r, const char *spec)
{
    shoal_err e = { 0 };
    uint8_t xxh[16];
    uint64_t len = 0;
    /* An unlinked file on disk (/var/tmp is disk-backed by convention), so
     * the pack's pages are reclaimable: a memfd would hold a second copy of
     * the int8 spine in RAM, ~57 GB for K3.  memfd only where that fails. */
    int fd = open("/var/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    int rc;

    if (fd < 0)
        fd = memfd_create("shoal-spine-pack", MFD_CLOEXEC);
    rc = fd < 0 ? shoal_err_set(&e, SHOAL_EIO, "no temporary file for the spine pack") : 0;

    if (rc == 0)
        rc = spine_pack_write(r->model, r->man->config, r->man->config_len, fd, &len, xxh, &e);
    if (rc == 0)
        rc = shoal_client_put(r->client, r->info.handle, SPINE_PACK_NAME, fd, len, xxh, &e);
    if (fd >= 0)
        close(fd);
    if (rc == 0) {
        r->spine.stored = 1;
        LOG_INFO("remote", "%s: spine pack stored in shoald's cache (%.1f MiB)", spec,
                 (double)len / 1048576.0);
    } else if (rc == SHOAL_EEXIST) {
        LOG_INFO("remote", "%s: another engine stored the spine pack first", spec);
    } else {
        LOG_WARN("remote", "%s: could not store the spine pack (%s); the next load quantizes "
                 "again", spec, e.msg);
    }
}

/* GET every spine tensor not mapped yet that the pack (when set) does not
 * cover, and fill tv with every mapped one.  *nv: views filled. */
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

static int spine_load(engine_remote *r, const char *spec, const engine_model_options *mo,
                      shoal_err *err)
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
    o.pack = NULL;
    if (r->spine_cache && mo->spine == ENGINE_SPINE_INT8 && pack_fetch(r, spec) == 0)
        o.pack = r->pack;
    rc = spine_fetch(r, tv, &nv, &bytes, err);
    if (rc == 0) {
        LOG_INFO("remote", "%s: %zu spine tensors (%.1f MiB) from shoald in %.1f ms%s", spec, nv,
                 (double)bytes / 1048576.0, (double)(shoal_now_ns() - t0) / 1e6,
                 o.pack ? " beside the cached int8 pack" : "");
        rc = engine_model_open_views(spec, man->config, man->config_len, tv, nv, NULL, NULL, &o,
                                     &r->model, err);
    }
    if (rc != 0 && o.pack) {
        /* a pack that parses but does not fit this model's config */
        LOG_WARN("remote", "%s: cached spine pack refused: %s; quantizing instead", spec,
                 err ? err->msg : "?");
        r->spine.refused = 1;
        pack_drop(r);
        o.pack = NULL;
        rc = spine_fetch(r, tv, &nv, &bytes, err);
        if (rc == 0)
            rc = engine_model_open_views(spec, man->config, man->config_len, tv, nv, NULL, NULL,
                                         &o, &r->model, err);
    }
    free(tv);
    if (rc != 0)
        return rc;
    r->spine.from_pack = o.pack != NULL;
    r->spine.load_ms = (double)(shoal_now_ns() - t0) / 1e6;
    LOG_INFO("remote", "%s: spine ready in %.1f ms (%s)", spec, r->spine.load_ms,
             o.pack ? "mapped the cached int8 pack, nothing quantized" : "quantized at load");
    if (!o.pack && r->spine_cache && mo->spine == ENGINE_SPINE_INT8)
        pack_store(r, spec);
    return 0;
}

void engine_remote_spine_info(const engine_remote *r, engine_remote_spine *out)
{
    *out = r->spine;
}

int engine_remote_open(const char *spec, const engine_remote_options *ro,
                       const engine_model_options *mo, engine_remote **out, shoal_err *err)
{
    engine_remote *r = calloc(1, sizeof *r);
    shoal_client_opts co = { 0 };
    int rc;

    *out = NULL;
    if (!r)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    r->info.manifest_fd = -1;
    r->timeout_ms = ro && ro->timeout_ms > 0 ? ro->timeout_ms : 60000;
    r->spine_cache = !(ro && ro->spine_cache_off);
    co.home = ro ? ro->home : NULL;
    co.socket_path = ro ? ro->socket_path : NULL;
    if (!(r->spec = strdup(spec)) || (co.home && !(r->home = strdup(co.home))) ||
        (co.socket_path && !(r->socket_path = strdup(co.socket_path)))) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto fail;
    }
    co.name = "shoal-engine";
    co.call_timeout_ms = r->timeout_ms;
    if ((rc = shoal_client_connect(&co, &r->client, err)) != 0)
        goto fail;
    if ((rc = shoal_client_open(r->client, spec, &r->info, err)) != 0) {
        shoal_err_wrap(err, rc, "shoald could not open %s", spec);
        goto fail;
    }
    r->opened = 1;
    if ((rc = manifest_read(r, spec, err)) != 0 || (rc = spine_load(r, spec, mo, err)) != 0)
        goto fail;
    if (r->model->cfg.expert_bytes != r->info.expert_bytes) {
        rc = shoal_err_set(err, SHOAL_EPROTO, "%s: shoald's expert span is %llu bytes, the "
                           "config's %llu", spec, (unsigned long long)r->info.expert_bytes,
                           (unsigned long long)r->model->cfg.expert_bytes);
        goto fail;
    }
    expert_source_shoald_options so = {
        .expert_bytes = r->info.expert_bytes, .n_layers = (int)r->model->cfg.n_layers,
        .experts_per_layer = (int)r->model->cfg.n_experts,
        .ram_bytes = ro && ro->expert_ram_set ? ro->expert_ram : engine_remote_default_ram(), .page_cache = ro ? ro->page_cache : EXPERT_PC_KEEP,
        .timeout_ms = r->timeout_ms, .read_part = ro ? ro->read_part : 0,
    };
    for (int64_t i = 0; i < r->model->cfg.n_layers; i++)
        so.moe_layers += r->model->cfg.layers[i].moe != 0;
    if (!ro || !ro->page_cache_set) {
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
    LOG_INFO("remote", "%s: RAM tier %.1f MiB, page cache policy %s", spec,
             (double)so.ram_bytes / 1048576.0,
             so.page_cache == EXPERT_PC_KEEP ? "keep"
             : so.page_cache == EXPERT_PC_DONTNEED ? "dontneed" : "direct");
    r->link = (expert_source_shoald_link){ .client = r->client, .handle = r->info.handle };
    r->src = expert_source_shoald_new_link(&r->link, &so);
    if (!r->src) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto fail;
    }
    *out = r;
    return 0;
fail:
    engine_remote_free(r);
    return rc;
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
    pack_drop(r);
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
