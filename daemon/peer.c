/* peer.c — objects served in place from the Hugging Face cache.
 *
 * Owns: answering a GET key whose file's bytes sit in a blob of an
 * existing huggingface_hub cache that hashed to its etag (fetcher/peer.c
 * verified it when the model was opened): the blob's own descriptor goes
 * to the client with the object's offset in it — no copy in shoald's
 * cache, no byte from upstream.  The XXH3-128 of the object (GET_ITEM's
 * checksum, which engines check) is computed from the blob's bytes at
 * each GET, on the loop (one read of the object: a K3 expert's 19 MB is
 * ~10 ms from the page cache; the engine reads the same pages next).
 * Counted as disk hits.
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#define PEER_READ_CHUNK (4u << 20)

/* XXH3-128 of [off, off+len) of fd, canonical (big-endian). */
static int range_xxh(int fd, uint64_t off, uint64_t len, uint8_t out[16])
{
    XXH3_state_t *h = XXH3_createState();
    uint8_t *buf = malloc(PEER_READ_CHUNK);
    int rc = h && buf ? 0 : SHOAL_ENOMEM;

    if (rc == 0) {
        XXH3_128bits_reset(h);
        for (uint64_t done = 0; rc == 0 && done < len; ) {
            size_t n = len - done < PEER_READ_CHUNK ? (size_t)(len - done) : PEER_READ_CHUNK;
            rc = shoal_pread_all(fd, buf, n, (off_t)(off + done));
            if (rc == 0)
                XXH3_128bits_update(h, buf, n);
            done += n;
        }
    }
    if (rc == 0) {
        XXH128_canonical_t cn;
        XXH128_canonicalFromHash(&cn, XXH3_128bits_digest(h));
        memcpy(out, cn.digest, 16);
    }
    XXH3_freeState(h);
    free(buf);
    return rc;
}

int peer_has(const model *m, const objref *o)
{
    char blob[SHOAL_PATH_MAX];
    return !m->local && upstream_peer_blob(m, o->file, blob, sizeof blob) == 0;
}

int peer_serve(conn *c, model *m, getreq *g, uint16_t i, const objref *o)
{
    char blob[SHOAL_PATH_MAX];
    cache_obj obj;
    cache_req req;
    int fd;

    if (m->local || upstream_peer_blob(m, o->file, blob, sizeof blob) != 0)
        return 0;
    fd = open(blob, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        LOG_WARN("peer", "%s: %s (fetching it instead)", blob, strerror(errno));
        return 0;
    }
    memset(&obj, 0, sizeof obj);
    obj.fd = fd;
    obj.length = o->key.length;
    obj.kind = o->kind;
    if (range_xxh(fd, o->key.offset, o->key.length, obj.xxh128) != 0) {
        LOG_WARN("peer", "%s: cannot read bytes %llu+%llu (fetching them instead)", blob,
                 (unsigned long long)o->key.offset, (unsigned long long)o->key.length);
        close(fd);
        return 0;
    }
    req = (cache_req){ c->session, m->model_id, o->layer, o->expert, CACHE_TIER_DISK };
    cache_stats_add(c->d->cache, &req, CACHE_HIT, 0, o->key.length, 0);
    c->counts.hits++;
    session_item_send_at(c, g, i, SHOAL_SRC_HIT, &obj, o->key.offset);
    return 1;
}
