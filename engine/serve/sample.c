/* sample.c — turning a position's logits into the next id: the seeded
 * PRNG, penalties, log-probabilities and the sampling chain (serve.h part
 * 1 gives the order of operations; docs/server.md "Sampling").
 *
 * Owns: pure functions over logit arrays.  Does not own the generator's
 * states nor the token history (generate.c passes them in).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/serve.h"

/* ---- PRNG --------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void gen_rng_seed(gen_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t gen_rng_next(gen_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double gen_rng_double(gen_rng *r)
{
    return (double)(gen_rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- penalties ------------------------------------------------------------------- */

/* work[id]: bit 0 "in the prompt or the output", the bits above: the count
 * in the output.  One pass marks, a second applies each id once and clears
 * its entry (so work is zero again). */
void gen_penalize(float *logits, uint32_t n_vocab, const uint32_t *hist, size_t n, size_t n_out,
                  const gen_penalties *p, uint32_t *work)
{
    int rep = p->repetition > 0 && p->repetition != 1.0;
    (void)n_vocab;
    if (!rep && p->presence == 0 && p->frequency == 0)
        return;
    for (size_t i = 0; i < n; i++)
        work[hist[i]] |= 1u;
    for (size_t i = n - n_out; i < n; i++)
        work[hist[i]] += 2u;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = hist[i], w = work[id];
        double l;
        if (w == 0)
            continue;           /* applied already */
        l = logits[id];
        if (rep)
            l = l > 0 ? l / p->repetition : l * p->repetition;
        if (w >> 1)
            l -= p->frequency * (double)(w >> 1) + p->presence;
        logits[id] = (float)l;
        work[id] = 0;
    }
}

/* ---- log-probabilities ---------------------------------------------------------- */

double gen_logsumexp(const float *logits, uint32_t n)
{
    float mx = -INFINITY;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++)
        if (logits[i] > mx)
            mx = logits[i];
    if (!isfinite(mx))
        return mx;
    for (uint32_t i = 0; i < n; i++)
        sum += exp((double)logits[i] - (double)mx);
    return (double)mx + log(sum);
}

/* a before b: the higher logit, then the lower id */
static int alt_before(const float *l, uint32_t a, uint32_t b)
{
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

size_t gen_top_logprobs(const float *logits, uint32_t n, double lse, size_t k, gen_alt *top)
{
    size_t m = 0;
    if (k > GEN_TOP_LOGPROBS_MAX)
        k = GEN_TOP_LOGPROBS_MAX;
    /* insertion into a sorted list of at most k: k <= 20 */
    for (uint32_t i = 0; i < n && k > 0; i++) {
        size_t at;
        if (m == k && !alt_before(logits, i, top[m - 1].id))
            continue;
        at = m < k ? m : k - 1;
        while (at > 0 && alt_before(logits, i, top[at - 1].id)) {
            top[at] = top[at - 1];
            at--;
        }
        top[at].id = i;
        if (m < k)
            m++;
    }
    for (size_t i = 0; i < m; i++)
        top[i].logprob = (float)((double)logits[top[i].id] - lse);
    return m;
}

/* ---- sampling ---------------------------------------------------------------------- */

static uint32_t argmax(const float *l, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* Sorting context for qsort (candidates by logit, descending; ids break
 * ties so the order does not depend on qsort's). */
static _Thread_local const float *t_sort_logits;

static int by_logit_desc(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    float lx = t_sort_logits[x], ly = t_sort_logits[y];
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Restore the heap below i: the worst of ids[0..k) at the root. */
static void sift_down(const float *l, uint32_t *h, uint32_t k, uint32_t i)
{
    for (;;) {
        uint32_t w = i, a = 2 * i + 1, b = a + 1, t;
        if (a < k && alt_before(l, h[w], h[a]))
            w = a;
        if (b < k && alt_before(l, h[w], h[b]))
            w = b;
        if (w == i)
            return;
        t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Move the k best of ids[0..n) to its front (a heap of k, the worst at
 * the root: O(n log k)), so the sort that follows sorts k ids, not a flat
 * distribution's whole vocabulary. */
static void select_best(const float *l, uint32_t *ids, uint32_t n, uint32_t k)
{
    for (uint32_t i = k / 2; i-- > 0;)
        sift_down(l, ids, k, i);
    for (uint32_t i = k; i < n; i++)
        if (alt_before(l, ids[i], ids[0])) {
            ids[0] = ids[i];
            sift_down(l, ids, k, 0);
        }
}

static double weight(const float *l, uint32_t id, float best, double t)
{
    return exp((double)(l[id] - best) / t);
}

uint32_t gen_sample(const float *logits, uint32_t n, const gen_sampling *s, gen_rng *r,
                    uint32_t *scratch)
{
    double t = s->temperature, total = 0, mass = 0, u;
    uint32_t best, nc = 0;
    float cut;

    best = argmax(logits, n);
    if (t <= 0 || n == 1 || !isfinite(logits[best]))
        return best;
    /* Ids more than 40 temperatures below the best weigh < e^-40 each:
     * dropping them changes no draw a double can resolve, and keeps the
     * sort short on a 163,840-id vocabulary. */
    cut = logits[best] - (float)(40.0 * t);
    for (uint32_t i = 0; i < n; i++)
        if (logits[i] >= cut && isfinite(logits[i]))
            scratch[nc++] = i;
    if (s->top_k > 0 && s->top_k < nc) {
        select_best(logits, scratch, nc, s->top_k);
        nc = s->top_k;
    }
    t_sort_logits = logits;
    qsort(scratch, nc, sizeof *scratch, by_logit_desc);
    for (uint32_t i = 0; i < nc; i++)
        total += weight(logits, scratch[i], logits[best], t);
    if (s->top_p < 1) {   /* top_p 0 keeps the single most likely id */
        uint32_t keep = 0;
        double acc = 0;
        while (keep < nc) {
            acc += weight(logits, scratch[keep], logits[best], t) / total;
            keep++;
            if (acc >= s->top_p)
                break;
        }
        nc = keep;
    }
    if (s->min_p > 0) {   /* the first (heaviest) weighs 1 */
        uint32_t keep = 1;
        while (keep < nc && weight(logits, scratch[keep], logits[best], t) >= s->min_p)
            keep++;
        nc = keep;
    }
    total = 0;
    for (uint32_t i = 0; i < nc; i++)
        total += weight(logits, scratch[i], logits[best], t);
    u = gen_rng_double(r) * total;
    for (uint32_t i = 0; i < nc; i++) {
        mass += weight(logits, scratch[i], logits[best], t);
        if (u < mass)
            return scratch[i];
    }
    return scratch[nc - 1];
}
