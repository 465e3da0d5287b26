/* xxh3.c — the dispatcher of xxh3.h: the best variant the CPU runs,
 * picked once. */
#include "common/xxh3.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const shoal_xxh3_impl *impl;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void pick(void)
{
    const shoal_xxh3_impl *p = shoal_xxh3_impl_avx512();
    if (!p)
        p = shoal_xxh3_impl_avx2();
    impl = p ? p : shoal_xxh3_impl_baseline();
}

static const shoal_xxh3_impl *get(void)
{
    pthread_once(&once, pick);
    return impl;
}

XXH3_state_t *shoal_xxh3_new(void)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, sizeof(XXH3_state_t)) != 0)
        return NULL;
    memset(p, 0, sizeof(XXH3_state_t));
    return p;
}

void shoal_xxh3_free(XXH3_state_t *st) { free(st); }
int shoal_xxh3_reset(XXH3_state_t *st)
{
    get()->reset(st);
    return 0;
}
void shoal_xxh3_update(XXH3_state_t *st, const void *p, size_t n) { get()->update(st, p, n); }

static void canonical(uint64_t high, uint64_t low, uint8_t out[16])
{
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(high >> (56 - 8 * i));
        out[8 + i] = (uint8_t)(low >> (56 - 8 * i));
    }
}

void shoal_xxh3_digest(const XXH3_state_t *st, uint8_t out[16])
{
    uint64_t h, l;
    get()->digest(st, &h, &l);
    canonical(h, l, out);
}

void shoal_xxh3_once(const void *p, size_t n, uint8_t out[16])
{
    uint64_t h, l;
    get()->once(p, n, &h, &l);
    canonical(h, l, out);
}
const char *shoal_xxh3_isa(void) { return get()->isa; }
