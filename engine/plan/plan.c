/* plan.c — the memory plan (see plan.h; docs/engine.md "The memory plan"
 * argues every number).
 *
 *   limit   = min(MemTotal, cgroup memory.max / memory.high /
 *             memory.limit_in_bytes, RLIMIT_AS, RLIMIT_DATA, --ram)
 *   reserve = max(2 GiB, 6 % of the limit)
 *   fixed   = reserve + spine(mode) + scratch(chunk) + expert pool
 *   context = the largest of max_position_embeddings and the powers of two
 *             below it whose KV and state take at most a quarter of
 *             limit - fixed (never below 4096), or --context
 *   tier    = limit - fixed - KV and state(context)
 *   auto    = int8 when its tier holds one decode token's experts, else
 *             int4 when it fits at all, else int4 with the last layers
 *             streamed (all their matrices but the routers), as long as
 *             the streamed part is no more than one token's experts'
 *             bytes; else refused, naming the limit at which that floor
 *             is met.
 */
#include "engine/plan/plan.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/path.h"

#define MAXU(a, b) ((a) > (b) ? (a) : (b))

void plan_options_default(plan_options *o)
{
    *o = (plan_options){ .spine = -1, .chunk = 16, .threads = 1, .copies = 2, .remote = 1 };
}

/* forward.c's ws_alloc, kernels_act, kernels_expert_ws and lookahead.c's
 * scratch, term by term (tests/unit/forward/test_plan_bytes.c holds the
 * two to within 10 %). */
uint64_t plan_scratch_bytes(const k3_config *c, size_t chunk, int threads)
{
    uint64_t n = chunk, d = (uint64_t)c->hidden, hk = (uint64_t)c->kda_heads;
    uint64_t dk = (uint64_t)c->kda_head_dim, p = hk * dk, h = (uint64_t)c->n_heads;
    uint64_t ql = (uint64_t)c->q_lora_rank, kl = (uint64_t)c->kv_lora_rank;
    uint64_t rope = (uint64_t)c->qk_rope_dim, nope = (uint64_t)c->qk_nope_dim;
    uint64_t vd = (uint64_t)c->v_head_dim, ne = (uint64_t)c->n_experts;
    uint64_t k = (uint64_t)c->n_experts_per_token, lat = (uint64_t)c->latent;
    uint64_t mi = (uint64_t)c->moe_intermediate, nl = (uint64_t)c->n_layers;
    uint64_t inter = MAXU((uint64_t)c->intermediate, (uint64_t)c->n_shared_experts * mi);
    uint64_t cols = MAXU(MAXU(MAXU(d, p), MAXU(inter, lat)), MAXU(MAXU(ql, kl), MAXU(nope, h * vd)));
    uint64_t anchors = 0, f;

    for (int64_t i = 0; i < c->n_layers; i++)
        anchors += (uint64_t)c->layers[i].snapshot;
    f = 4 * n * d + anchors * n * d + 6 * n * p + n * dk + n * hk +
        n * ql + n * h * (nope + rope) + n * (kl + rope) + 2 * n * h * kl + 2 * n * h * vd +
        n * MAXU(kl, nope) + n * MAXU(kl, vd) + 2 * n * inter +
        n * ne + 2 * n * k + n * lat + n * k * lat + 2 * n * lat + n + n * lat +
        2 * ne + 1 + 2 * n * k + (uint64_t)threads * MAXU(dk, d);
    f *= 4;
    cols = (cols + 31) / 32 * 32;
    f += cols * n * 2 + cols / 32 * n * 4;                        /* kernels_act */
    if (c->n_moe_layers > 0) {
        f += n * (3 * mi + lat) * 4 + n * (mi + lat) * 3;        /* kernels_expert_ws */
        f += (n * d + 2 * n * ne + 2 * ne) * 4 + 2 * nl * ne + nl * 64;   /* lookahead */
    }
    return f;
}

static uint64_t reserve_for(uint64_t limit)
{
    return MAXU(PLAN_RESERVE_MIN, limit / 100 * PLAN_RESERVE_PCT);
}

/* The smallest limit whose reserve leaves `need`. */
static uint64_t limit_for(uint64_t need)
{
    uint64_t a = need + PLAN_RESERVE_MIN;
    uint64_t b = need / (100 - PLAN_RESERVE_PCT) * 100 + 100;
    return MAXU(a, b);
}

typedef struct fit {
    uint64_t spine, fixed, left, kv, tier;
    int64_t context;
    int ok;
} fit;

static uint64_t kv_for(const plan *p, int64_t ctx)
{
    return p->state_bytes + (uint64_t)ctx * p->kv_per_token;
}

static int64_t context_min(const k3_config *c)
{
    return c->max_positions < PLAN_CONTEXT_MIN ? c->max_positions : PLAN_CONTEXT_MIN;
}

/* The context for `left` bytes after the fixed parts (see the top), the
 * tier keeping at least `keep` of them. */
static int64_t context_choose(const plan *p, const k3_config *c, uint64_t left, uint64_t keep)
{
    int64_t max = c->max_positions, min = context_min(c);
    int64_t ctx = max;
    uint64_t share = left / PLAN_CONTEXT_SHARE;

    if (left > keep && left - keep < share)
        share = left - keep;
    while (ctx > min && kv_for(p, ctx) > share) {
        int64_t pow2 = 1;
        while (pow2 * 2 < ctx)
            pow2 *= 2;
        ctx = pow2 < min ? min : pow2;
    }
    return ctx;
}

/* The whole spine of `mode` resident, the tier keeping `keep` when the
 * context is the plan's to choose. */
static fit fit_resident(const plan *p, const k3_config *c, const plan_options *o,
                        k3_spine_mode mode, uint64_t keep)
{
    k3_spine_sizes sz;
    fit f = { 0 };

    k3_spine_sizes_get(c, mode, &sz);
    f.spine = sz.matrices + sz.vectors;
    f.fixed = p->reserve + f.spine + p->scratch + p->pool;
    if (f.fixed >= p->limit)
        return f;
    f.left = p->limit - f.fixed;
    f.context = o->context ? o->context : context_choose(p, c, f.left, keep);
    f.kv = kv_for(p, f.context);
    if (f.kv > f.left)
        return f;
    f.tier = f.left - f.kv;
    f.ok = 1;
    return f;
}

/* ---- the streamed part (item 3) -----------------------------------------
 *
 * What streams: every derived matrix of a layer but its router (the router
 * lookahead multiplies layer L2's router while layer L runs, so routers
 * stay resident wherever their layer is) and the lm_head.  Which layers: a
 * suffix [j, n); layers [0, j) stay whole.  Every streamed byte costs the
 * same disk time per token and every resident byte saves the same, so by
 * benefit per byte all matrices are equal; a prefix of whole layers makes
 * each streamed layer one contiguous O_DIRECT read and bounds the buffer
 * at two layers (the one computing, the next one reading). */
int plan_part_streamed(k3_part part)
{
    return part != K3_PART_ROUTER && part != K3_PART_HEAD;
}

uint64_t plan_stream_mat_bytes(k3_fmt fmt, uint64_t rows, uint64_t cols)
{
    uint64_t w = fmt == K3_FMT_F32 ? 4 * rows * cols : fmt == K3_FMT_INT8 ? rows * cols
                 : rows * cols / 2;
    uint64_t sc = fmt == K3_FMT_F32 ? 0 : fmt == K3_FMT_INT8 ? 4 * rows
                  : rows * (cols / 32) * 2;
    return (w + PLAN_STREAM_ALIGN - 1) / PLAN_STREAM_ALIGN * PLAN_STREAM_ALIGN +
           (sc + PLAN_STREAM_ALIGN - 1) / PLAN_STREAM_ALIGN * PLAN_STREAM_ALIGN;
}

typedef struct stream_walk {
    uint64_t stream[K3_MAX_LAYERS];   /* a layer's streamed region, rounded to 4 KiB */
    uint64_t keep[K3_MAX_LAYERS];     /* its matrices that stay resident anyway (copied) */
} stream_walk;

static int stream_add(void *ctx, const k3_spine_mat *m)
{
    stream_walk *w = ctx;
    if (m->layer < 0)
        return 0;
    /* the region is the layer's every matrix: through shoald it is read in
     * place from the pack, where the router sits among them (a directory's
     * stream file leaves the router out: fewer bytes than counted) */
    w->stream[m->layer] += plan_stream_mat_bytes(m->fmt, m->rows, m->cols);
    if (!plan_part_streamed(m->part))
        w->keep[m->layer] += k3_mat_bytes(m);
    return 0;
}

static void stream_sizes(const k3_config *c, k3_spine_mode mode, stream_walk *w)
{
    memset(w, 0, sizeof *w);
    k3_spine_walk(c, mode, stream_add, w);
    for (int64_t i = 0; i < c->n_layers; i++)
        w->stream[i] = (w->stream[i] + 4095) / 4096 * 4096;
}

uint64_t plan_stream_layer_bytes(const k3_config *c, k3_spine_mode mode, int layer)
{
    stream_walk w;
    if (layer < 0 || layer >= (int)c->n_layers)
        return 0;
    stream_sizes(c, mode, &w);
    return w.stream[layer];
}

/* The spine's bytes with layers [j, n) streamed: *resident (with the
 * vectors), *streamed, *buffers (two of the largest streamed layer's
 * region, each as plan_stream_buffer_bytes rounds it). */
static void stream_split(const k3_config *c, const k3_spine_sizes *sz, const stream_walk *w,
                         int j, uint64_t *resident, uint64_t *streamed, uint64_t *buffers)
{
    uint64_t res = sz->vectors + sz->globals, st = 0, big = 0;
    for (int i = 0; i < (int)c->n_layers; i++) {
        if (i < j) {
            res += sz->layer[i];
            continue;
        }
        res += w->keep[i];
        st += w->stream[i];
        big = MAXU(big, w->stream[i]);
    }
    *resident = res;
    *streamed = st;
    *buffers = 2 * plan_stream_buffer_bytes(big);
}

uint64_t plan_stream_buffer_bytes(uint64_t region)
{
    uint64_t a = region >= PLAN_HUGE_PAGE ? PLAN_HUGE_PAGE : 4096;
    return (region + a - 1) / a * a;
}

/* The floor: the fewest leading layers to keep whole so that the streamed
 * rest is at most `most` bytes. */
static int floor_layers(const k3_config *c, const stream_walk *w, uint64_t most)
{
    uint64_t suffix = 0;
    int j = 0;

    for (int i = 0; i < (int)c->n_layers; i++)
        suffix += w->stream[i];
    while (j < (int)c->n_layers && suffix > most)
        suffix -= w->stream[j++];
    return j;
}

/* Item 3's plan: layers [j, n) streamed, j as large as fits.  0 when it
 * fits and (with `floor`) the streamed part is within the floor. */
static int fit_streamed(plan *p, const k3_config *c, const plan_options *o, k3_spine_mode mode,
                        int floor)
{
    k3_spine_sizes sz;
    stream_walk w;
    int64_t ctx = o->context ? o->context : context_min(c);
    uint64_t kv = kv_for(p, ctx), base = p->reserve + kv + p->scratch + p->pool;
    int n = (int)c->n_layers;

    k3_spine_sizes_get(c, mode, &sz);
    stream_sizes(c, mode, &w);
    p->spine = mode;
    p->spine_bytes = sz.matrices + sz.vectors;
    p->context = ctx;
    p->kv_bytes = kv;
    for (int j = n - 1; j >= 0; j--) {
        uint64_t res, st, buf;
        stream_split(c, &sz, &w, j, &res, &st, &buf);
        if (base + res + buf > p->limit)
            continue;
        p->first_streamed_layer = j;
        p->spine_resident = res;
        p->spine_streamed = st;
        p->stream_buffers = buf;
        p->stream_s_per_token = (double)st / PLAN_DISK_RATE;
        p->tier = p->tier_planned = p->limit - base - res - buf;
        return !floor || j >= floor_layers(c, &w, p->tier_useful) ? 0 : -1;
    }
    return -1;
}

/* The limits at which int8 (with a useful tier) and int4 become
 * resident, and the floor of `mode` streamed, at the smallest context. */
static void mins_compute(plan *p, const k3_config *c, const plan_options *o, k3_spine_mode mode)
{
    int64_t ctx = o->context ? o->context : context_min(c);
    uint64_t base = p->scratch + p->pool + kv_for(p, ctx), res, st, buf;
    k3_spine_sizes s8, s4, sm;
    stream_walk w;

    k3_spine_sizes_get(c, K3_SPINE_INT8, &s8);
    k3_spine_sizes_get(c, K3_SPINE_INT4, &s4);
    k3_spine_sizes_get(c, mode, &sm);
    stream_sizes(c, mode, &w);
    p->min_int8 = limit_for(base + s8.matrices + s8.vectors + p->tier_useful);
    p->min_int4 = limit_for(base + s4.matrices + s4.vectors);
    stream_split(c, &sm, &w, floor_layers(c, &w, p->tier_useful), &res, &st, &buf);
    p->min_floor = limit_for(base + res + buf);
    p->min_run = UINT64_MAX;
    for (int j = 0; j < (int)c->n_layers; j++) {         /* the least any suffix needs */
        stream_split(c, &sm, &w, j, &res, &st, &buf);
        if (limit_for(base + res + buf) < p->min_run)
            p->min_run = limit_for(base + res + buf);
    }
    if (p->min_run > p->min_floor)
        p->min_run = p->min_floor;
}

static void fmt_size(uint64_t v, char *out, size_t cap)
{
    shoal_size_format(v, out, cap);
}

/* Fill the plan's common inputs: limit, reserve, state, scratch, pool. */
static int plan_inputs(const k3_config *c, const shoal_mem_limits *lim, const plan_options *o,
                       plan *p, shoal_err *err)
{
    uint64_t ebuf = ((uint64_t)c->expert_bytes + 4096 + PLAN_HUGE_PAGE - 1) / PLAN_HUGE_PAGE *
                    PLAN_HUGE_PAGE;

    memset(p, 0, sizeof *p);
    if (lim)
        p->machine = *lim;
    p->limit = p->machine.limit;
    snprintf(p->limit_by, sizeof p->limit_by, "%s", p->machine.limit_by);
    if (o->ram && (o->ram_replace || !p->limit || o->ram < p->limit)) {
        p->limit = o->ram;
        snprintf(p->limit_by, sizeof p->limit_by, o->ram_replace ? "--ram: a machine of that size"
                                                                 : "--ram");
    }
    p->remote = o->remote;
    if (!p->limit)
        return shoal_err_set(err, SHOAL_EINVAL, "plan: the machine's memory is unknown "
                             "(no MemTotal): give --ram SIZE");
    if (o->context < 0 || o->context > c->max_positions)
        return shoal_err_set(err, SHOAL_EINVAL, "--context %" PRId64 " is past the model's "
                             "max_position_embeddings %" PRId64, o->context, c->max_positions);
    p->reserve = reserve_for(p->limit);
    p->copies = o->copies > 0 ? o->copies : 1;
    p->state_bytes = k3_kda_state_bytes(c) * (uint64_t)p->copies;
    p->kv_per_token = (k3_mla_bytes_per_token(c) + 4 * (uint64_t)(o->threads > 0 ? o->threads : 1)) *
                      (uint64_t)p->copies;
    p->scratch = plan_scratch_bytes(c, o->chunk ? o->chunk : 16, o->threads > 0 ? o->threads : 1);
    if (o->remote && c->n_moe_layers > 0) {
        p->pool_buffers = PLAN_EXPERT_POOL;
        p->pool_buffer_bytes = ebuf;
        p->pool = p->pool_buffers * ebuf;
    }
    p->tier_useful = (uint64_t)c->n_experts_per_token * (uint64_t)c->n_moe_layers * c->expert_bytes;
    p->first_streamed_layer = (int)c->n_layers;
    return 0;
}

static void take_fit(plan *p, const k3_config *c, const fit *f, k3_spine_mode mode)
{
    p->verdict = PLAN_RESIDENT;
    p->spine = mode;
    p->spine_bytes = p->spine_resident = f->spine;
    p->context = f->context;
    p->kv_bytes = f->kv;
    p->tier = p->tier_planned = f->tier;
    p->first_streamed_layer = (int)c->n_layers;
}

static int plan_make_at(const k3_config *c, const shoal_mem_limits *lim, const plan_options *o,
                        plan *p, shoal_err *err)
{
    char a[32], b[32], d[32];
    int rc = plan_inputs(c, lim, o, p, err);

    if (rc != 0)
        return rc;
    mins_compute(p, c, o, o->spine < 0 ? K3_SPINE_INT4 : (k3_spine_mode)o->spine);
    fmt_size(p->tier_useful, b, sizeof b);
    if (o->spine < 0) {
        fit f8 = fit_resident(p, c, o, K3_SPINE_INT8, p->tier_useful);
        fit f4 = fit_resident(p, c, o, K3_SPINE_INT4, 0);
        if (f8.ok && f8.tier >= p->tier_useful) {
            take_fit(p, c, &f8, K3_SPINE_INT8);
            fmt_size(f8.tier, a, sizeof a);
            snprintf(p->why, sizeof p->why, "auto: int8 fits with a RAM tier of %s, at least "
                     "one decode token's experts (%s)", a, b);
        } else if (f4.ok) {
            take_fit(p, c, &f4, K3_SPINE_INT4);
            fmt_size(f8.ok ? f8.tier : 0, a, sizeof a);
            snprintf(p->why, sizeof p->why, "auto: int8 would leave a RAM tier of %s, less than "
                     "one decode token's experts (%s); int4 fits", f8.ok ? a : "nothing", b);
        } else {
            if (fit_streamed(p, c, o, K3_SPINE_INT4, 1) == 0) {
                p->verdict = PLAN_STREAMED;
                snprintf(p->why, sizeof p->why, "auto: not even the int4 spine fits; layers "
                         "%d-%d are read from disk every token", p->first_streamed_layer,
                         (int)c->n_layers - 1);
            } else {
                p->verdict = PLAN_REFUSED;
            }
        }
    } else {
        k3_spine_mode m = (k3_spine_mode)o->spine;
        fit f = fit_resident(p, c, o, m, 0);
        if (f.ok) {
            take_fit(p, c, &f, m);
            snprintf(p->why, sizeof p->why, "--spine %s", k3_spine_mode_name(m));
        } else if (fit_streamed(p, c, o, m, 0) == 0) {
            p->verdict = PLAN_STREAMED;
            snprintf(p->why, sizeof p->why, "--spine %s does not fit whole; layers %d-%d are "
                     "read from disk every token", k3_spine_mode_name(m),
                     p->first_streamed_layer, (int)c->n_layers - 1);
        } else {
            p->verdict = PLAN_REFUSED;
        }
    }
    if (p->verdict == PLAN_REFUSED) {
        fmt_size(p->limit, a, sizeof a);
        fmt_size(o->spine < 0 ? p->min_floor : p->min_run, b, sizeof b);
        snprintf(p->why, sizeof p->why, "the model needs at least %s of memory%s%s; this run "
                 "may use %s (%s)", b, o->context ? " at this --context" : "",
                 o->spine < 0 ? "" : " with --spine given", a, p->limit_by);
        if (o->spine >= 0)
            return shoal_err_set(err, SHOAL_ENOMEM, "%s: below it not even the resident part "
                                 "and two layers' buffers fit", p->why);
        return shoal_err_set(err, SHOAL_ENOMEM, "%s: below it more of the spine than one token's "
                             "experts would be read from disk every token (--spine int4 streams "
                             "more, from %s)", p->why, (fmt_size(p->min_run, d, sizeof d), d));
    }
    p->context_capped = p->context < c->max_positions;
    p->context_set = o->context != 0;
    if (o->expert_ram_set && p->verdict == PLAN_RESIDENT) {
        p->tier = o->expert_ram;
        p->tier_set = 1;
    }
    return 0;
}

/* chunk 0: the largest prefill chunk (most, most/2, ... above the
 * minimum) whose plan, at the minimum chunk's context, keeps its spine
 * and verdict and takes at most 1/PLAN_CONTEXT_SHARE of that plan's RAM tier
 * for its larger scratch (the share the context may take)
 * (docs/engine.md "Layer-major prefill"). */
int plan_make(const k3_config *c, const shoal_mem_limits *lim, const plan_options *o, plan *p,
              shoal_err *err)
{
    plan_options q = *o;
    size_t most = o->chunk_max && o->chunk_max < PLAN_CHUNK_MAX ? o->chunk_max : PLAN_CHUNK_MAX;
    int rc;

    /* the base plan is always chunk 16's, so a short prompt sees the same
     * verdict and floor as `plan` does */
    if (!q.chunk)
        q.chunk = PLAN_CHUNK_MIN;
    rc = plan_make_at(c, lim, &q, p, err);
    p->chunk = q.chunk;
    p->chunk_auto = o->chunk == 0;
    if (rc != 0 || o->chunk)
        return rc;
    q.context = p->context;            /* the scratch comes out of the tier, not the context */
    for (size_t n = most; n > p->chunk || (n == most && n < p->chunk); n /= 2) {
        plan t;
        shoal_err e;
        q.chunk = n;
        if (plan_make_at(c, lim, &q, &t, &e) == 0 && t.verdict == p->verdict &&
            t.spine == p->spine && t.context == p->context &&
            t.first_streamed_layer == p->first_streamed_layer &&
            (t.scratch <= p->scratch ||
             t.scratch - p->scratch <= p->tier_planned / PLAN_CONTEXT_SHARE)) {
            t.chunk = n;
            t.chunk_auto = 1;
            t.context_set = o->context != 0;
            /* the smallest machines: they run at the smaller chunk */
            t.min_int8 = p->min_int8;
            t.min_int4 = p->min_int4;
            t.min_floor = p->min_floor;
            t.min_run = p->min_run;
            *p = t;
            break;
        }
    }
    return 0;
}

void plan_print(const plan *p, const k3_config *c, FILE *f)
{
    char a[32], b[32], d[32], e[32];

    fmt_size(p->limit, a, sizeof a);
    fmt_size(p->machine.mem_available, b, sizeof b);
    fprintf(f, "plan: limit %s (%s; MemAvailable %s)\n", a, p->limit_by, b);
    if (p->verdict == PLAN_REFUSED) {
        fprintf(f, "plan: refused: %s\n", p->why);
        return;
    }
    fmt_size(p->reserve, a, sizeof a);
    fprintf(f, "plan: reserve %s for the OS, shoald and the page cache (max(2 GiB, %d %%))\n", a,
            PLAN_RESERVE_PCT);
    fmt_size(p->spine_resident, a, sizeof a);
    fprintf(f, "plan: spine %s, %s resident (%s)\n", k3_spine_mode_name(p->spine), a, p->why);
    if (p->verdict == PLAN_STREAMED) {
        fmt_size(p->spine_streamed, a, sizeof a);
        fmt_size(p->stream_buffers, b, sizeof b);
        fprintf(f, "plan: streamed: %s per token from layer %d on (%.2f s/token at %.0f GB/s), "
                "through %s of buffers: layer L+1 is read with O_DIRECT while layer L computes, "
                "its router and the lm_head stay resident\n", a, p->first_streamed_layer,
                p->stream_s_per_token, PLAN_DISK_RATE / 1e9, b);
    }
    fmt_size(p->kv_bytes, a, sizeof a);
    fprintf(f, "plan: context %" PRId64 " tokens%s: KV cache and KDA state %s (%d cop%s)\n",
            p->context, p->context_set ? " (--context)" : p->context_capped ? " (capped by the plan)"
                                                                           : "", a, p->copies,
            p->copies == 1 ? "y" : "ies: live and snapshot");
    fmt_size(p->scratch, a, sizeof a);
    fmt_size(p->pool_buffer_bytes, b, sizeof b);
    fmt_size(p->pool, d, sizeof d);
    if (p->pool_buffers)
        fprintf(f, "plan: prefill chunk %zu%s, scratch %s; expert buffers %" PRIu64 " x %s = %s\n",
                p->chunk, p->chunk_auto ? " (the largest the plan allows)" : "", a,
                p->pool_buffers, b, d);
    else
        fprintf(f, "plan: prefill chunk %zu%s, scratch %s; no expert buffers (%s)\n", p->chunk,
                p->chunk_auto ? " (the largest the plan allows)" : "", a,
                p->remote ? "no MoE layers" : "a directory's experts are read from its mapping");
    fmt_size(p->tier, a, sizeof a);
    fmt_size(p->tier_planned, b, sizeof b);
    fmt_size(p->tier_useful, d, sizeof d);
    if (p->tier_set)
        fprintf(f, "plan: RAM tier %s (--expert-ram; the plan left %s)\n", a, b);
    else if (p->remote)
        fprintf(f, "plan: RAM tier %s (what is left; one token's experts are %s)\n", a, d);
    else
        fprintf(f, "plan: left for the page cache of the experts: %s (one token's are %s)\n", a,
                d);
    fmt_size(p->min_int8, a, sizeof a);
    fmt_size(p->min_int4, b, sizeof b);
    fmt_size(p->min_floor, e, sizeof e);
    fmt_size(p->min_run, d, sizeof d);
    fprintf(f, "plan: this model: int8 with a useful tier from %s, int4 whole from %s, the "
            "floor %s (%s; with --spine given, streamed from %s)\n", a, b, e,
            p->context_set ? "at this --context" : "at the smallest context", d);
    (void)c;
}

shoal_json *plan_to_json(const plan *p)
{
    static const char *const verdicts[] = { "resident", "streamed", "refused" };
    shoal_json *j = shoal_json_object(), *sp = shoal_json_object(), *pool = shoal_json_object();
    shoal_json *mins = shoal_json_object();
    int rc = j && sp && pool && mins ? 0 : -1;

    if (rc == 0) {
        rc |= shoal_json_set_str(j, "verdict", verdicts[p->verdict]);
        rc |= shoal_json_set_int(j, "limit", (int64_t)p->limit);
        rc |= shoal_json_set_str(j, "limit_by", p->limit_by);
        rc |= shoal_json_set_int(j, "mem_total", (int64_t)p->machine.mem_total);
        rc |= shoal_json_set_int(j, "mem_available", (int64_t)p->machine.mem_available);
        rc |= shoal_json_set_int(j, "cgroup_max", (int64_t)p->machine.cgroup_max);
        rc |= shoal_json_set_int(j, "cgroup_high", (int64_t)p->machine.cgroup_high);
        rc |= shoal_json_set_int(j, "reserve", (int64_t)p->reserve);
        rc |= shoal_json_set_str(sp, "mode", k3_spine_mode_name(p->spine));
        rc |= shoal_json_set_int(sp, "bytes", (int64_t)p->spine_bytes);
        rc |= shoal_json_set_int(sp, "resident", (int64_t)p->spine_resident);
        rc |= shoal_json_set_int(sp, "streamed", (int64_t)p->spine_streamed);
        rc |= shoal_json_set_int(sp, "first_streamed_layer", p->first_streamed_layer);
        rc |= shoal_json_set_int(sp, "stream_buffers", (int64_t)p->stream_buffers);
        rc |= shoal_json_set_num(sp, "stream_s_per_token", p->stream_s_per_token);
        rc |= shoal_json_set_str(j, "why", p->why);
        rc |= shoal_json_set_int(j, "context", p->context);
        rc |= shoal_json_set_bool(j, "context_capped", p->context_capped);
        rc |= shoal_json_set_int(j, "state_copies", p->copies);
        rc |= shoal_json_set_int(j, "kv_bytes", (int64_t)p->kv_bytes);
        rc |= shoal_json_set_int(j, "kv_per_token", (int64_t)p->kv_per_token);
        rc |= shoal_json_set_int(j, "state_bytes", (int64_t)p->state_bytes);
        rc |= shoal_json_set_int(j, "scratch", (int64_t)p->scratch);
        rc |= shoal_json_set_int(j, "chunk", (int64_t)p->chunk);
        rc |= shoal_json_set_int(pool, "buffers", (int64_t)p->pool_buffers);
        rc |= shoal_json_set_int(pool, "buffer_bytes", (int64_t)p->pool_buffer_bytes);
        rc |= shoal_json_set_int(pool, "bytes", (int64_t)p->pool);
        rc |= shoal_json_set_int(j, "ram_tier", (int64_t)p->tier);
        rc |= shoal_json_set_int(j, "ram_tier_planned", (int64_t)p->tier_planned);
        rc |= shoal_json_set_bool(j, "ram_tier_set", p->tier_set);
        rc |= shoal_json_set_int(j, "ram_tier_useful", (int64_t)p->tier_useful);
        rc |= shoal_json_set_int(mins, "int8", (int64_t)p->min_int8);
        rc |= shoal_json_set_int(mins, "int4", (int64_t)p->min_int4);
        rc |= shoal_json_set_int(mins, "floor", (int64_t)p->min_floor);
        rc |= shoal_json_set_int(mins, "streamed_any", (int64_t)p->min_run);
    }
    if (rc == 0) {
        rc = shoal_json_set_take(j, "spine", sp);
        sp = NULL;
    }
    if (rc == 0) {
        rc = shoal_json_set_take(j, "expert_pool", pool);
        pool = NULL;
    }
    if (rc == 0) {
        rc = shoal_json_set_take(j, "min_ram", mins);
        mins = NULL;
    }
    shoal_json_free(sp);
    shoal_json_free(pool);
    shoal_json_free(mins);
    if (rc != 0) {
        shoal_json_free(j);
        return NULL;
    }
    return j;
}
