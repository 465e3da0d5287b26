/* expert_source_shoald.c — the expert source backed by shoald (DESIGN.md
 * decision 9, docs/protocol.md): one batched GET per fetch, each GET_ITEM
 * mapped read-only from its descriptor and handed to the callback as it
 * arrives, so the MoE layer computes an expert while later ones are still
 * on their way.
 *
 * UNTESTED: written against common/client.h before shoald exists; no test
 * exercises it yet.  Owns the mapping of each item (unmapped and its
 * descriptor closed right after its callback).  Does not own the client
 * connection nor the model handle (both borrowed).
 */
#include "engine/expert_source.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/client.h"

typedef struct shoald_src {
    shoal_client *client;      /* borrowed */
    uint32_t handle;           /* OPEN's handle, borrowed */
    uint64_t expert_bytes;
    int timeout_ms;            /* per item: a dead daemon is an error, not a hang */
} shoald_src;

/* Map [offset, offset+length) of fd; base and maplen say what to munmap. */
static const uint8_t *item_map(const shoal_item *it, void **base, size_t *maplen)
{
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = it->offset / (uint64_t)page * (uint64_t)page;
    size_t len = (size_t)(it->offset - start + it->length);
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, it->fd, (off_t)start);
    if (p == MAP_FAILED)
        return NULL;
    *base = p;
    *maplen = len;
    return (const uint8_t *)p + (it->offset - start);
}

/* After a stop: cancel, then take the remaining items of the request so
 * their descriptors are closed and the connection stays in step. */
static void drain(shoald_src *s, uint64_t request, size_t left)
{
    shoal_item it;
    shoal_client_cancel(s->client, request, NULL);
    while (left > 0 && shoal_client_next(s->client, s->timeout_ms, &it, NULL) == 0) {
        if (it.fd >= 0)
            close(it.fd);
        if (it.request == request) {
            left--;
            if (it.last)
                break;
        }
    }
}

static int shoald_fetch(void *impl, int layer, const int32_t *ids, size_t n,
                        expert_ready_fn fn, void *ctx, shoal_err *err)
{
    shoald_src *s = impl;
    shoal_key *keys = calloc(n, sizeof *keys);
    uint64_t request;
    size_t got = 0;
    int rc;

    if (!keys)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        keys[i] = (shoal_key){ .kind = SHOAL_KEY_EXPERT, .layer = (uint16_t)layer,
                               .expert = (uint32_t)ids[i] };
    rc = shoal_client_get_send(s->client, s->handle, 0, keys, n, &request, err);
    free(keys);
    if (rc != 0)
        return shoal_err_wrap(err, rc, "shoald GET of %zu experts of layer %d: ", n, layer);
    while (got < n) {
        shoal_item it;
        rc = shoal_client_next(s->client, s->timeout_ms, &it, err);
        if (rc != 0)
            return shoal_err_wrap(err, rc, "shoald: layer %d, %zu of %zu experts received: ",
                                  layer, got, n);
        if (it.request != request) {        /* not ours (an older, cancelled GET) */
            if (it.fd >= 0)
                close(it.fd);
            continue;
        }
        got++;
        int32_t id = it.index < n ? ids[it.index] : -1;
        if (it.status != 0) {
            shoal_err d = { 0 };
            shoal_err_set(&d, it.status, "shoald could not deliver layer %d expert %d: %s",
                          layer, (int)id, shoal_strerror(it.status));
            rc = fn(ctx, layer, id, NULL, 0, EXPERT_TIER_DISK, it.status, &d);
        } else {
            void *base = NULL;
            size_t maplen = 0;
            const uint8_t *span = it.length == s->expert_bytes ? item_map(&it, &base, &maplen) : NULL;
            if (!span) {
                shoal_err d = { 0 };
                shoal_err_set(&d, SHOAL_EPROTO, "layer %d expert %d: cannot map %llu bytes",
                              layer, (int)id, (unsigned long long)it.length);
                rc = fn(ctx, layer, id, NULL, 0, EXPERT_TIER_DISK, SHOAL_EPROTO, &d);
            } else {
                expert_tier tier = it.source == SHOAL_SRC_HIT ? EXPERT_TIER_DISK : EXPERT_TIER_NETWORK;
                rc = fn(ctx, layer, id, span, (size_t)it.length, tier, 0, NULL);
                munmap(base, maplen);
            }
        }
        if (it.fd >= 0)
            close(it.fd);
        if (rc != 0) {
            if (!it.last)
                drain(s, request, n - got);
            return rc;
        }
    }
    return 0;
}

static void shoald_free(void *impl)
{
    free(impl);
}

expert_source *expert_source_shoald_new(shoal_client *client, uint32_t handle,
                                        uint64_t expert_bytes, int timeout_ms)
{
    static const expert_source_ops ops = { shoald_fetch, shoald_free };
    shoald_src *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    *s = (shoald_src){ client, handle, expert_bytes, timeout_ms > 0 ? timeout_ms : 60000 };
    return expert_source_new(&ops, s);
}
