/* checked_read.c — an object's XXH3-128 computed while several reader
 * threads read its parts, and checked against the hash shoald's index
 * holds for it (the GET_ITEM's), so a damaged blob is an error and a
 * re-fetch, not wrong numbers (docs/engine.md "Checked reads").
 *
 * Owns: hashing the parts in order as they complete: the reader that
 * completes the part the hash waits for hashes it and every later part
 * already read, while the others go on reading (one hasher at a time, so
 * a part is hashed by whichever reader is free, next to the read it
 * made: the bytes are still in its cache).  And the REPORT that tells
 * shoald which object was damaged (an expert; a spine tensor, a small
 * file or the spine pack: remote.c).  Does not own the reads (the expert
 * source's readers) nor the slots.
 *
 * Cost (make bench: bench/checkread): XXH3-128 runs at 10-30 GB/s per
 * core against a disk's 1-3 GB/s, and is spread over the readers.
 */
#include "engine/source/source.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "common/xxh3.h"

#include "common/client.h"

struct checked_read {
    pthread_mutex_t mu;
    XXH3_state_t *st;
    uint8_t want[16];
    uint32_t nparts, next;     /* parts hashed: [0, next) */
    int hashing;               /* a reader is hashing now */
    int result;                /* 0 pending, 1 match, -1 mismatch */
    const uint8_t **ptr;       /* per part, once read */
    size_t *len;
};

checked_read *checked_read_new(const uint8_t want[16], uint32_t nparts)
{
    checked_read *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    r->st = shoal_xxh3_new();
    r->ptr = calloc(nparts ? nparts : 1, sizeof *r->ptr);
    r->len = calloc(nparts ? nparts : 1, sizeof *r->len);
    if (!r->st || !r->ptr || !r->len) {
        checked_read_free(r);
        return NULL;
    }
    shoal_xxh3_reset(r->st);
    memcpy(r->want, want, 16);
    r->nparts = nparts;
    return r;
}

void checked_read_free(checked_read *r)
{
    if (!r)
        return;
    if (r->st)
        shoal_xxh3_free(r->st);
    pthread_mutex_destroy(&r->mu);
    free(r->ptr);
    free(r->len);
    free(r);
}

int checked_read_part(checked_read *r, uint32_t part, const uint8_t *p, size_t n)
{
    if (part >= r->nparts)
        return -1;
    pthread_mutex_lock(&r->mu);
    r->ptr[part] = p ? p : (const uint8_t *)"";
    r->len[part] = n;
    /* hash from where the hash stands while the next part is there; a
     * reader already hashing picks up this part itself */
    while (!r->hashing && r->next < r->nparts && r->ptr[r->next]) {
        uint32_t k = r->next;
        r->hashing = 1;
        pthread_mutex_unlock(&r->mu);
        shoal_xxh3_update(r->st, r->ptr[k], r->len[k]);
        pthread_mutex_lock(&r->mu);
        r->hashing = 0;
        r->next = k + 1;
        if (r->next == r->nparts) {
            XXH128_canonical_t can;
            shoal_xxh3_digest(r->st, can.digest);
            r->result = memcmp(can.digest, r->want, 16) == 0 ? 1 : -1;
        }
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int checked_read_result(checked_read *r)
{
    int v;
    pthread_mutex_lock(&r->mu);
    v = r->result;
    pthread_mutex_unlock(&r->mu);
    return v;
}

int checked_read_report(shoal_client *c, uint32_t handle, int layer, int32_t expert,
                        shoal_err *err)
{
    char json[160];
    snprintf(json, sizeof json, "{\"tier\":\"ram\",\"handle\":%" PRIu32 ",\"damaged\":"
             "[{\"layer\":%d,\"expert\":%" PRId32 "}]}", handle, layer, expert);
    return shoal_client_report(c, json, err);
}

int checked_read_report_object(shoal_client *c, uint32_t handle, const char *kind,
                               const char *name, shoal_err *err)
{
    char json[512];
    int n;

    for (const char *q = name; *q; q++)   /* names are plain: nothing to escape */
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 0x20)
            return shoal_err_set(err, SHOAL_EINVAL, "%s: a name REPORT cannot carry", name);
    n = snprintf(json, sizeof json, "{\"tier\":\"ram\",\"handle\":%" PRIu32 ",\"damaged\":"
                 "[{\"%s\":\"%s\"}]}", handle, kind, name);
    if (n < 0 || (size_t)n >= sizeof json)
        return shoal_err_set(err, SHOAL_ETOOBIG, "%s: name too long to REPORT", name);
    return shoal_client_report(c, json, err);
}
