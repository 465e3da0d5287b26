/* owner.c — an owner rank's side of expert parallelism (ranks.h part 4).
 * MPI build only.
 *
 * Owns: opening MODEL for its experts (hf://: OPEN on this rank's shoald
 * and a shoald expert source with this rank's RAM tier, no spine; a
 * directory: bound whole under the plan), the hello, and the service
 * loop: NOTE -> expert_source_request (the layer's experts, the
 * lookahead's guesses: this rank's prefetches), WORK -> expert_source_fetch
 * with each expert computed as it arrives, exactly as forward.c's
 * moe_expert_ready does (its rows in pair order, weight 1 onto zeros, the
 * session's numerics), and its outputs sent at once (MPI_Isend) while the
 * next expert is read and computed.  Does not own which experts (rank 0
 * sends them by the map) nor any sum.
 *
 * Waits have no deadline here: an owner idles as long as rank 0 runs the
 * spine (or `serve` has no request); when rank 0 dies the launcher ends
 * the owners.
 */
#include "engine/ranks/ranks.h"
#include "engine/ranks/ranks_int.h"

#include <inttypes.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/platform.h"
#include "common/sys.h"

typedef struct owner {
    const ranks_world *w;
    k3_config cfg;
    engine_remote *remote;       /* hf:// */
    engine_loaded local;         /* a directory */
    expert_source *src;          /* hf://: ours; a directory: local's */
    kernels_pool *pool;
    kernels_expert_ws *ews;
    float *ones;
    ranks_setup su;
    int *moe_ord;
    uint8_t *msg;                /* the message being received */
    size_t msg_cap;
    uint8_t *out;                /* outputs of the layer: per expert ranks_out + rows */
    size_t out_off[RANKS_MAX_EXPERTS + 1];
    size_t row_off[RANKS_MAX_EXPERTS + 1];
    MPI_Request out_req[RANKS_MAX_EXPERTS];
    int n_out;
    ranks_done done;
    MPI_Request done_req;
    char fail[RANKS_FAIL_MAX];
    MPI_Request fail_req;
    /* the WORK being served */
    const ranks_work *wh;
    const int32_t *ids, *cnt;
    const float *rows;
    shoal_err cb_err;
    /* figures */
    uint64_t layers, experts, busy_ns;
} owner;

/* ---- waiting (no deadline: see the file's comment) ------------------------- */

static int owner_wait(MPI_Request *rq, shoal_err *err)
{
    ranks_poll p;
    int flag = 0, rc;

    ranks_poll_begin(&p);
    while ((rc = MPI_Test(rq, &flag, MPI_STATUS_IGNORE)) == MPI_SUCCESS && !flag)
        ranks_poll_pause(&p);
    return ranks_mpi_check(rc, err, "send to rank 0");
}

/* The previous layer's sends must be done before their buffers are reused. */
static int sends_finish(owner *ow, shoal_err *err)
{
    int rc = 0;
    for (int j = 0; j < ow->n_out && rc == 0; j++)
        rc = owner_wait(&ow->out_req[j], err);
    if (rc == 0)
        rc = owner_wait(&ow->done_req, err);
    ow->n_out = 0;
    return rc;
}

/* Tell rank 0 why this rank cannot go on (it ends the run). */
static void send_fail(owner *ow, const shoal_err *e)
{
    shoal_err ignore;
    if (ow->fail_req != MPI_REQUEST_NULL)
        owner_wait(&ow->fail_req, &ignore);
    snprintf(ow->fail, sizeof ow->fail, "%s", e->msg[0] ? e->msg : shoal_strerror(e->code));
    MPI_Isend(ow->fail, RANKS_FAIL_MAX, MPI_BYTE, 0, RANKS_TAG_FAIL, MPI_COMM_WORLD, &ow->fail_req);
}

/* ---- opening the model ------------------------------------------------------ */

/* This rank's RAM tier: --expert-ram, else what the limit leaves after the
 * reserve, the read buffers and the expert scratch, at most the owned
 * experts' bytes. */
static uint64_t owner_tier(const owner *ow, const engine_load_options *lo, shoal_err *err)
{
    const k3_config *c = &ow->cfg;
    shoal_mem_limits lim;
    uint64_t owned = 0, limit, reserve, fixed, buf;
    int m = 0;

    for (int64_t i = 0; i < c->n_layers; i++)
        if (c->layers[i].moe)
            owned += (uint64_t)ranks_owned_count(m++, (int)c->n_experts, ow->w->rank,
                                                 ow->w->size) * c->expert_bytes;
    if (lo->plan.expert_ram_set)
        return lo->plan.expert_ram;
    if (shoal_mem_limits_read(NULL, &lim, err) != 0)
        return 0;
    limit = lim.limit;
    if (lo->plan.ram && (!limit || lo->plan.ram < limit))
        limit = lo->plan.ram;
    reserve = limit / 100 * PLAN_RESERVE_PCT > PLAN_RESERVE_MIN ? limit / 100 * PLAN_RESERVE_PCT
                                                                : PLAN_RESERVE_MIN;
    buf = (c->expert_bytes + PLAN_HUGE_PAGE - 1) / PLAN_HUGE_PAGE * PLAN_HUGE_PAGE;
    fixed = reserve + PLAN_EXPERT_POOL * buf + plan_scratch_bytes(c, 16, 1);
    if (limit <= fixed)
        return 0;
    return limit - fixed < owned ? limit - fixed : owned;
}

static int open_remote(owner *ow, const char *spec, const engine_load_options *lo, shoal_err *err)
{
    engine_remote_options ro = {
        .home = lo->home, .timeout_ms = lo->timeout_ms,
        .page_cache = lo->page_cache >= 0 ? (expert_page_cache)lo->page_cache : EXPERT_PC_KEEP,
        .page_cache_set = lo->page_cache >= 0, .read_part = lo->read_part,
    };
    const uint8_t *bytes;
    size_t len;
    shoal_json *root;
    int rc;

    if ((rc = engine_remote_connect(spec, &ro, &ow->remote, err)) != 0)
        return rc;
    engine_remote_config(ow->remote, &bytes, &len);
    root = shoal_json_parse((const char *)bytes, len, err);
    rc = root ? k3_config_parse(root, &ow->cfg, err) : SHOAL_EFORMAT;
    shoal_json_free(root);
    if (rc != 0)
        return rc;
    shoal_err e2 = { 0 };
    expert_source_shoald_options so = {
        .expert_bytes = ow->cfg.expert_bytes, .n_layers = (int)ow->cfg.n_layers,
        .experts_per_layer = (int)ow->cfg.n_experts, .moe_layers = (int)ow->cfg.n_moe_layers,
        .ram_bytes = owner_tier(ow, lo, &e2), .page_cache = ro.page_cache,
        .timeout_ms = lo->timeout_ms, .read_part = lo->read_part,
    };
    if (!ro.page_cache_set) {       /* as engine_remote_bind decides, for the owned experts */
        uint64_t owned = 0;
        int m = 0;
        for (int64_t i = 0; i < ow->cfg.n_layers; i++)
            if (ow->cfg.layers[i].moe)
                owned += (uint64_t)ranks_owned_count(m++, (int)ow->cfg.n_experts, ow->w->rank,
                                                     ow->w->size) * ow->cfg.expert_bytes;
        so.page_cache = owned > so.ram_bytes ? EXPERT_PC_DIRECT : EXPERT_PC_KEEP;
    }
    if (!(ow->src = expert_source_shoald_new(engine_remote_client(ow->remote),
                                             engine_remote_handle(ow->remote), &so)) ||
        !(ow->pool = kernels_pool_new(lo->plan.threads > 0 ? lo->plan.threads : 1)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    return 0;
}

static int owner_open(owner *ow, const char *spec, const engine_load_options *lo, shoal_err *err)
{
    int rc;

    if (engine_remote_is_spec(spec)) {
        rc = open_remote(ow, spec, lo, err);
    } else {
        engine_load_options l2 = *lo;
        l2.plan_out = NULL;
        l2.progress = NULL;
        if ((rc = engine_load_open(spec, &l2, &ow->local, err)) == 0) {
            ow->cfg = ow->local.model->cfg;
            ow->src = ow->local.src;
            ow->pool = ow->local.pool;
        }
    }
    if (rc != 0)
        return rc;
    if (ow->cfg.n_experts > RANKS_MAX_EXPERTS)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "%lld experts per layer, at most %d",
                             (long long)ow->cfg.n_experts, RANKS_MAX_EXPERTS);
    if (!(ow->moe_ord = calloc((size_t)ow->cfg.n_layers + 1, sizeof *ow->moe_ord)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (int64_t i = 0, m = 0; i < ow->cfg.n_layers; i++)
        ow->moe_ord[i] = ow->cfg.layers[i].moe ? (int)m++ : -1;
    return 0;
}

/* After SETUP: the expert scratch for the session's chunk. */
static int owner_setup(owner *ow, shoal_err *err)
{
    const k3_config *c = &ow->cfg;
    size_t chunk = (size_t)ow->su.chunk, lat = (size_t)c->latent, k = (size_t)c->n_experts_per_token;

    if (ow->su.chunk < 1 || ow->su.chunk > 4096 || ow->su.k != (int32_t)k)
        return shoal_err_set(err, SHOAL_EPROTO, "rank 0's setup (chunk %d, top-%d) does not fit "
                             "the model (top-%zu)", ow->su.chunk, ow->su.k, k);
    ow->ews = kernels_expert_ws_new((size_t)c->moe_intermediate, lat, chunk, (float)c->situ_beta,
                                    (float)c->situ_linear_beta);
    ow->ones = malloc(chunk * sizeof *ow->ones);
    ow->out = malloc((size_t)c->n_experts * sizeof(ranks_out) + chunk * k * lat * sizeof(float));
    if (!ow->ews || !ow->ones || !ow->out)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for chunks of %zu", chunk);
    for (size_t i = 0; i < chunk; i++)
        ow->ones[i] = 1.0f;
    return 0;
}

/* ---- serving ------------------------------------------------------------------ */

static int find_id(const owner *ow, int32_t e)
{
    int lo = 0, hi = ow->wh->n_ids - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (ow->ids[mid] == e)
            return mid;
        if (ow->ids[mid] < e)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* One expert has arrived from this rank's source: forward.c's
 * moe_expert_ready on its rows, then its outputs on their way. */
static int on_expert(void *ctx, int layer, int32_t e, const uint8_t *span, size_t bytes,
                     expert_tier tier, int status, const shoal_err *detail)
{
    owner *ow = ctx;
    const k3_config *c = &ow->cfg;
    size_t lat = (size_t)c->latent;
    kernels_expert ex;
    int j = find_id(ow, e), rc;

    (void)tier;
    if (status != 0)
        return shoal_err_set(&ow->cb_err, status, "layer %d expert %d: %s", layer, (int)e,
                             detail ? detail->msg : shoal_strerror(status));
    if (j < 0 || bytes != c->expert_bytes)
        return shoal_err_set(&ow->cb_err, SHOAL_EPROTO, "layer %d expert %d: %zu bytes, "
                             "expected %llu", layer, (int)e, bytes,
                             (unsigned long long)c->expert_bytes);
    ranks_out *h = (ranks_out *)(ow->out + ow->out_off[j]);
    float *y = (float *)(h + 1);
    size_t cnt = (size_t)ow->cnt[j];
    memset(y, 0, cnt * lat * sizeof(float));
    rc = kernels_expert_view(span, (size_t)c->moe_intermediate, lat, &ex, &ow->cb_err);
    if (rc == 0)
        rc = kernels_expert_apply(ow->ews, ow->pool, &ex, ow->rows + ow->row_off[j], cnt,
                                  ow->ones, y, (kernels_numerics)ow->su.numerics, &ow->cb_err);
    if (rc != 0)
        return rc;
    *h = (ranks_out){ layer, e, (int32_t)cnt, ow->wh->seq };
    rc = MPI_Isend(h, (int)(sizeof *h + cnt * lat * sizeof(float)), MPI_BYTE, 0,
                   RANKS_TAG_OUT + j, MPI_COMM_WORLD, &ow->out_req[j]);
    ow->experts++;
    return ranks_mpi_check(rc, &ow->cb_err, "output send");
}

/* Check a WORK message of `bytes` bytes against the map and the setup. */
static int work_check(owner *ow, size_t bytes, shoal_err *err)
{
    const ranks_work *wh = (const ranks_work *)ow->msg;
    size_t lat = (size_t)ow->cfg.latent, n, rows = 0;
    int m;

    if (bytes < sizeof *wh || wh->n_ids < 1 || wh->n_ids > ow->cfg.n_experts ||
        wh->layer < 0 || wh->layer >= ow->cfg.n_layers || (m = ow->moe_ord[wh->layer]) < 0)
        return shoal_err_set(err, SHOAL_EPROTO, "a malformed WORK message from rank 0");
    n = (size_t)wh->n_ids;
    ow->wh = wh;
    ow->ids = (const int32_t *)(wh + 1);
    ow->cnt = ow->ids + n;
    ow->rows = (const float *)(ow->cnt + n);
    for (size_t j = 0; j < n; j++) {
        if (ranks_owner(m, ow->ids[j], ow->w->size) != ow->w->rank || ow->cnt[j] < 1 ||
            ow->cnt[j] > ow->su.chunk || (j > 0 && ow->ids[j] <= ow->ids[j - 1]))
            return shoal_err_set(err, SHOAL_EPROTO, "layer %d: rank 0 sent expert %d, which "
                                 "this rank does not own or which is out of order",
                                 wh->layer, (int)ow->ids[j]);
        ow->row_off[j] = rows * lat;
        ow->out_off[j] = j * sizeof(ranks_out) + rows * lat * sizeof(float);
        rows += (size_t)ow->cnt[j];
    }
    if ((int32_t)rows != wh->rows || bytes != sizeof *wh + 8 * n + rows * lat * sizeof(float))
        return shoal_err_set(err, SHOAL_EPROTO, "layer %d: a WORK message of %zu bytes for %zu "
                             "rows", wh->layer, bytes, rows);
    return 0;
}

static int serve_work(owner *ow, size_t bytes, shoal_err *err)
{
    uint64_t t0 = shoal_now_ns();
    expert_source_stats a, b;
    int rc;

    if ((rc = work_check(ow, bytes, err)) != 0)
        return rc;
    for (int j = 0; j < ow->wh->n_ids; j++)
        ow->out_req[j] = MPI_REQUEST_NULL;
    ow->n_out = ow->wh->n_ids;
    expert_source_stats_get(ow->src, &b);
    memset(&ow->cb_err, 0, sizeof ow->cb_err);
    rc = expert_source_fetch(ow->src, ow->wh->layer, ow->ids, (size_t)ow->wh->n_ids, on_expert,
                             ow, err);
    expert_source_stats_get(ow->src, &a);
    if (rc != 0) {
        if (ow->cb_err.code)
            *err = ow->cb_err;
        return rc;
    }
    ow->done = (ranks_done){ ow->wh->layer, ow->wh->seq, shoal_now_ns() - t0, a.wait_ns - b.wait_ns };
    ow->layers++;
    ow->busy_ns += ow->done.busy_ns;
    rc = MPI_Isend(&ow->done, sizeof ow->done, MPI_BYTE, 0, RANKS_TAG_DONE, MPI_COMM_WORLD,
                   &ow->done_req);
    return ranks_mpi_check(rc, err, "done send");
}

static int serve_note(owner *ow, size_t bytes, shoal_err *err)
{
    const int32_t *v = (const int32_t *)ow->msg;

    if (bytes < 12 || v[0] < 0 || v[0] >= ow->cfg.n_layers || v[2] < 0 ||
        bytes != 12 + 4 * (size_t)v[2])
        return shoal_err_set(err, SHOAL_EPROTO, "a malformed NOTE message from rank 0");
    return expert_source_request(ow->src, v[0], v + 3, (size_t)v[2], v[1], err);
}

/* Receive the next message from rank 0 into ow->msg: its tag and size. */
static int next_message(owner *ow, int *tag, size_t *bytes, shoal_err *err)
{
    MPI_Status st;
    ranks_poll p;
    int flag = 0, count = 0, rc;

    ranks_poll_begin(&p);
    while ((rc = MPI_Iprobe(0, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st)) == MPI_SUCCESS && !flag)
        ranks_poll_pause(&p);
    if (rc == MPI_SUCCESS)
        rc = MPI_Get_count(&st, MPI_BYTE, &count);
    if (rc != MPI_SUCCESS)
        return ranks_mpi_check(rc, err, "receive from rank 0");
    if ((size_t)count > ow->msg_cap) {
        uint8_t *nb = realloc(ow->msg, (size_t)count);
        if (!nb)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for a %d-byte message", count);
        ow->msg = nb;
        ow->msg_cap = (size_t)count;
    }
    rc = MPI_Recv(ow->msg, count, MPI_BYTE, 0, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    *tag = st.MPI_TAG;
    *bytes = (size_t)count;
    return ranks_mpi_check(rc, err, "receive from rank 0");
}

static int serve_loop(owner *ow, shoal_err *err)
{
    int tag, rc;
    size_t bytes;

    for (;;) {
        if ((rc = next_message(ow, &tag, &bytes, err)) != 0)
            return rc;
        if (tag == RANKS_TAG_END)
            return sends_finish(ow, err);
        if (tag == RANKS_TAG_NOTE)
            rc = serve_note(ow, bytes, err);
        else if (tag == RANKS_TAG_WORK)
            rc = (rc = sends_finish(ow, err)) != 0 ? rc : serve_work(ow, bytes, err);
        else
            rc = shoal_err_set(err, SHOAL_EPROTO, "an unexpected message (tag %d) from rank 0", tag);
        if (rc != 0) {
            send_fail(ow, err);      /* rank 0 ends the run; keep answering until then */
            memset(err, 0, sizeof *err);
        }
    }
}

static void owner_stats(const owner *ow, FILE *f)
{
    expert_source_stats es;

    if (!f || !ow->src)
        return;
    expert_source_stats_get(ow->src, &es);
    fprintf(f, "stats: rank %d: %" PRIu64 " layer runs, %" PRIu64 " experts applied, busy %.1f ms; "
            "tiers ram %" PRIu64 " local %" PRIu64 " disk %" PRIu64 " network %" PRIu64
            "; prefetch %" PRIu64 " guessed, %" PRIu64 " used; RAM tier %" PRIu64 " experts "
            "(%.1f MiB)\n", ow->w->rank, ow->layers, ow->experts, (double)ow->busy_ns / 1e6,
            es.hits[EXPERT_TIER_RAM], es.hits[EXPERT_TIER_LOCAL], es.hits[EXPERT_TIER_DISK],
            es.hits[EXPERT_TIER_NETWORK], es.prefetch_sent, es.prefetch_used, es.ram_resident,
            (double)es.ram_bytes / 1048576.0);
}

static void owner_close(owner *ow)
{
    if (ow->remote) {
        expert_source_free(ow->src);
        kernels_pool_free(ow->pool);
        engine_remote_free(ow->remote);
    } else {
        engine_load_close(&ow->local);
    }
    kernels_expert_ws_free(ow->ews);
    free(ow->ones);
    free(ow->out);
    free(ow->msg);
    free(ow->moe_ord);
}

int ranks_owner_serve(const char *spec, const ranks_owner_options *o, const ranks_world *w,
                      shoal_err *err)
{
    owner ow;
    ranks_hello h;
    MPI_Request rq;
    int rc, tag;
    size_t bytes;

    memset(&ow, 0, sizeof ow);
    memset(&h, 0, sizeof h);
    ow.w = w;
    ow.done_req = ow.fail_req = MPI_REQUEST_NULL;
    rc = owner_open(&ow, spec, o->load, err);
    h.status = rc;
    if (rc != 0) {
        snprintf(h.msg, sizeof h.msg, "%s", err->msg[0] ? err->msg : shoal_strerror(rc));
    } else {
        h = (ranks_hello){ 0, (int32_t)ow.cfg.n_layers, (int32_t)ow.cfg.n_experts,
                           (int32_t)ow.cfg.latent, (int32_t)ow.cfg.moe_intermediate, 0,
                           ow.cfg.expert_bytes, { 0 } };
    }
    int mrc = MPI_Isend(&h, sizeof h, MPI_BYTE, 0, RANKS_TAG_HELLO, MPI_COMM_WORLD, &rq);
    if (mrc == MPI_SUCCESS)
        mrc = owner_wait(&rq, err) == 0 ? MPI_SUCCESS : MPI_ERR_OTHER;
    /* rank 0 answers a failed hello by ending the run; wait for that */
    while (rc == 0 && mrc == MPI_SUCCESS) {
        if ((rc = next_message(&ow, &tag, &bytes, err)) != 0)
            break;
        if (tag == RANKS_TAG_END)
            goto done;
        if (tag != RANKS_TAG_SETUP || bytes != sizeof ow.su) {
            rc = shoal_err_set(err, SHOAL_EPROTO, "rank 0 sent tag %d before the setup", tag);
            break;
        }
        memcpy(&ow.su, ow.msg, sizeof ow.su);
        if ((rc = owner_setup(&ow, err)) != 0) {
            send_fail(&ow, err);
            break;
        }
        rc = serve_loop(&ow, err);
        break;
    }
    while (rc != 0 && next_message(&ow, &tag, &bytes, err) == 0 && tag != RANKS_TAG_END)
        ;
done:
    if (rc == 0)
        owner_stats(&ow, o->stats_out);
    if (ow.fail_req != MPI_REQUEST_NULL)
        owner_wait(&ow.fail_req, err);
    owner_close(&ow);
    return rc;
}
