/* map.c — the in-memory hash index of the cache (see cache_int.h).
 *
 * Owns: an open-addressing multimap with linear probing and backward-shift
 * deletion (no tombstones, so lookups stay short after many evictions).
 * Keys are 64-bit hashes; values index arrays the caller owns.  Rejected:
 * a chained table (one allocation per entry on the lookup hot path).
 */
#include "cache/cache_int.h"

#include <stdlib.h>
#include <string.h>

uint64_t cmap_fix(uint64_t h)
{
    return h ? h : 0x9E3779B97F4A7C15ull;
}

static int cmap_grow(cmap *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 64;
    uint64_t *nh = calloc(ncap, sizeof *nh);
    uint32_t *nv = malloc(ncap * sizeof *nv);

    if (!nh || !nv) {
        free(nh);
        free(nv);
        return SHOAL_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->hash[i])
            continue;
        size_t j = (size_t)m->hash[i] & (ncap - 1);
        while (nh[j])
            j = (j + 1) & (ncap - 1);
        nh[j] = m->hash[i];
        nv[j] = m->val[i];
    }
    free(m->hash);
    free(m->val);
    m->hash = nh;
    m->val = nv;
    m->cap = ncap;
    return 0;
}

int cmap_put(cmap *m, uint64_t h, uint32_t v)
{
    h = cmap_fix(h);
    /* Keep the load under 1/2 so probes stay short. */
    if ((m->n + 1) * 2 > m->cap) {
        int rc = cmap_grow(m);
        if (rc)
            return rc;
    }
    size_t j = (size_t)h & (m->cap - 1);
    while (m->hash[j])
        j = (j + 1) & (m->cap - 1);
    m->hash[j] = h;
    m->val[j] = v;
    m->n++;
    return 0;
}

uint32_t cmap_find(const cmap *m, uint64_t h, cmap_eq_fn eq, const void *ctx)
{
    if (!m->cap)
        return CMAP_NONE;
    h = cmap_fix(h);
    for (size_t j = (size_t)h & (m->cap - 1); m->hash[j]; j = (j + 1) & (m->cap - 1))
        if (m->hash[j] == h && (!eq || eq(ctx, m->val[j])))
            return m->val[j];
    return CMAP_NONE;
}

static size_t cmap_slot(const cmap *m, uint64_t h, uint32_t v)
{
    if (!m->cap)
        return SIZE_MAX;
    for (size_t j = (size_t)h & (m->cap - 1); m->hash[j]; j = (j + 1) & (m->cap - 1))
        if (m->hash[j] == h && m->val[j] == v)
            return j;
    return SIZE_MAX;
}

int cmap_del(cmap *m, uint64_t h, uint32_t v)
{
    h = cmap_fix(h);
    size_t i = cmap_slot(m, h, v), mask = m->cap - 1;
    if (i == SIZE_MAX)
        return SHOAL_ENOTFOUND;
    /* Backward shift: move later members of the cluster into the hole when
     * their home slot is not between the hole and themselves. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->hash[j])
            break;
        size_t home = (size_t)m->hash[j] & mask;
        int between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (between)
            continue;
        m->hash[i] = m->hash[j];
        m->val[i] = m->val[j];
        i = j;
    }
    m->hash[i] = 0;
    m->n--;
    return 0;
}

int cmap_set(cmap *m, uint64_t h, uint32_t old, uint32_t v)
{
    size_t i = cmap_slot(m, cmap_fix(h), old);
    if (i == SIZE_MAX)
        return SHOAL_ENOTFOUND;
    m->val[i] = v;
    return 0;
}

void cmap_clear(cmap *m)
{
    if (m->cap)
        memset(m->hash, 0, m->cap * sizeof *m->hash);
    m->n = 0;
}

void cmap_free(cmap *m)
{
    if (!m)
        return;
    free(m->hash);
    free(m->val);
    memset(m, 0, sizeof *m);
}
