/* lead.c — rank 0's side of expert parallelism (ranks.h part 3).  MPI
 * build only.
 *
 * Owns: the owners' hellos and setup; the expert source the session asks
 * (its requests become NOTE messages to the owners of the ids; it never
 * fetches); the applier: per MoE layer, each owner's WORK (its experts,
 * their rows of latent inputs) sent with MPI_Isend after the latent down
 * projection, the receives of every expert's outputs posted first so they
 * land without a copy; the wait after the shared experts, which polls
 * every request (MPI_Testsome) with a deadline and scatters each expert's
 * rows into their routing slots as they come.  Does not own the sums
 * (forward.c adds the slots in routing order, as in a single process).
 *
 * Failure: an owner's FAIL message, an MPI error, or an owner silent for
 * the timeout is the error of the layer, naming the rank; the caller
 * prints it and ends the run (ranks_abort).  A rank that dies is usually
 * seen by the launcher first: Open MPI ends the others with SIGTERM, and
 * ranks_lead_doing() says what rank 0 was waiting for (docs/mpi.md).
 */
#include "engine/ranks/ranks.h"
#include "engine/ranks/ranks_int.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "common/sys.h"

#define NOTE_RING 8

typedef struct note_slot {
    int32_t *buf;                /* layer, prefetch, n, ids[E] */
    MPI_Request req;
} note_slot;

typedef struct lead_owner {
    uint8_t *work;               /* the WORK being sent */
    MPI_Request work_req;
    int32_t ids[RANKS_MAX_EXPERTS];
    size_t n;                    /* this layer's experts of this owner */
    size_t rows;
    uint8_t *in;                 /* outputs: per expert a ranks_out and its rows */
    size_t in_off[RANKS_MAX_EXPERTS];
    MPI_Request *out_req;        /* [E] */
    ranks_done done;
    MPI_Request done_req;
    char fail[RANKS_FAIL_MAX];
    MPI_Request fail_req;
    note_slot notes[NOTE_RING];
    unsigned note_next;
} lead_owner;

struct ranks_lead {
    const engine_model *m;
    int size, timeout_ms;
    size_t lat, k, chunk, ne;
    int *moe_ord;                /* [n_layers]: ordinal among MoE layers, -1 dense */
    lead_owner *o;               /* [size]; o[0] unused */
    expert_source *src;
    engine_expert_applier ap;
    int32_t seq;
    uint64_t t_send;
    ranks_stats st;
    /* the wait's request table: every active request and what it is */
    MPI_Request *reqs;
    int *what;                   /* owner << 16 | kind (0 work, 1 done, 2 fail, 3 + j out) */
    int *idx;
    MPI_Status *sts;
    int nreq_cap;
    uint64_t guessed;            /* ids sent in prefetch notes as guesses */
    int broken;                  /* a failure: free sends no END (the run is aborted) */
    char doing[192];
};

/* ---- waiting ------------------------------------------------------------ */

/* Wait for `req` (one request) with the run's deadline. */
static int wait_one(ranks_lead *l, MPI_Request *req, int rank, const char *what, shoal_err *err)
{
    ranks_poll p;
    int flag = 0, rc;

    ranks_poll_begin(&p);
    for (;;) {
        if ((rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            return ranks_mpi_check(rc, err, what);
        if (flag)
            return 0;
        if (shoal_now_ns() - p.start_ns > (uint64_t)l->timeout_ms * 1000000ull)
            return shoal_err_set(err, SHOAL_ETIMEOUT, "rank %d: %s: no progress in %d ms (the "
                                 "rank died, hangs, or its shoald is stuck; --timeout sets the "
                                 "limit)", rank, what, l->timeout_ms);
        ranks_poll_pause(&p);
    }
}

static void doing_set(ranks_lead *l, const char *what, int layer)
{
    snprintf(l->doing, sizeof l->doing, "%s%s%d", what, layer >= 0 ? " of layer " : " ",
             layer >= 0 ? layer : l->size - 1);
    l->doing[sizeof l->doing - 1] = '\0';
}

/* ---- the owners' hellos ------------------------------------------------- */

static int hello_check(ranks_lead *l, int r, const ranks_hello *h, shoal_err *err)
{
    const k3_config *c = &l->m->cfg;

    if (h->status != 0)
        return shoal_err_set(err, h->status, "rank %d: %.*s", r, RANKS_FAIL_MAX - 1, h->msg);
    if (h->n_layers != c->n_layers || h->n_experts != c->n_experts || h->latent != c->latent ||
        h->inter != c->moe_intermediate || h->expert_bytes != c->expert_bytes)
        return shoal_err_set(err, SHOAL_EINVAL, "rank %d opened another model (%d layers, %d "
                             "experts, latent %d) than rank 0 (%lld, %lld, %lld): every rank "
                             "must be given the same MODEL", r, h->n_layers, h->n_experts,
                             h->latent, (long long)c->n_layers, (long long)c->n_experts,
                             (long long)c->latent);
    return 0;
}

static int owners_meet(ranks_lead *l, const ranks_lead_options *o, shoal_err *err)
{
    ranks_hello h;
    ranks_setup su = { (int32_t)l->chunk, (int32_t)o->experts, l->timeout_ms, (int32_t)l->k };
    MPI_Request rq;
    int rc;

    doing_set(l, "waiting for the hellos of ranks 1 ..", -1);
    for (int r = 1; r < l->size; r++) {
        memset(&h, 0, sizeof h);
        if ((rc = ranks_mpi_check(MPI_Irecv(&h, sizeof h, MPI_BYTE, r, RANKS_TAG_HELLO,
                                            MPI_COMM_WORLD, &rq), err, "hello")) ||
            (rc = wait_one(l, &rq, r, "its hello (the model opened)", err)) ||
            (rc = hello_check(l, r, &h, err)))
            return rc;
    }
    for (int r = 1; r < l->size; r++)
        if ((rc = ranks_mpi_check(MPI_Isend(&su, sizeof su, MPI_BYTE, r, RANKS_TAG_SETUP,
                                            MPI_COMM_WORLD, &rq), err, "setup")) ||
            (rc = wait_one(l, &rq, r, "setup", err)))
            return rc;
    /* a FAIL can come at any time: one receive per owner for the run */
    for (int r = 1; r < l->size; r++)
        if ((rc = ranks_mpi_check(MPI_Irecv(l->o[r].fail, RANKS_FAIL_MAX, MPI_BYTE, r,
                                            RANKS_TAG_FAIL, MPI_COMM_WORLD, &l->o[r].fail_req),
                                  err, "fail receive")))
            return rc;
    return 0;
}

/* ---- the expert source: requests become notes --------------------------- */

static int src_fetch(void *impl, int layer, const int32_t *ids, size_t n, expert_ready_fn fn,
                     void *ctx, shoal_err *err)
{
    (void)impl;
    (void)ids;
    (void)n;
    (void)fn;
    (void)ctx;
    return shoal_err_set(err, SHOAL_EINTERNAL, "layer %d: with --experts-over-ranks the owner "
                         "ranks apply the experts; rank 0 fetches none", layer);
}

/* The guesses passed on (the owners' sources count what they used). */
static void src_stats(void *impl, expert_source_stats *out)
{
    const ranks_lead *l = impl;
    out->prefetch_sent += l->guessed;
}

static void src_free(void *impl)
{
    (void)impl;     /* the lead owns itself */
}

static int src_request_do(void *impl, int layer, const int32_t *ids, size_t n, int prefetch,
                       shoal_err *err)
{
    ranks_lead *l = impl;
    int m = layer >= 0 && layer < (int)l->m->cfg.n_layers ? l->moe_ord[layer] : -1;
    int rc;

    if (m < 0 || n == 0)
        return 0;
    for (int r = 1; r < l->size; r++) {
        lead_owner *o = &l->o[r];
        note_slot *ns = &o->notes[o->note_next++ % NOTE_RING];
        size_t cnt = 0;

        if (ns->req != MPI_REQUEST_NULL && (rc = wait_one(l, &ns->req, r, "a prefetch note", err)))
            return rc;
        for (size_t i = 0; i < n; i++)
            if (ranks_owner(m, ids[i], l->size) == r)
                ns->buf[3 + cnt++] = ids[i];
        if (cnt == 0)
            continue;
        ns->buf[0] = layer;
        ns->buf[1] = prefetch;
        ns->buf[2] = (int32_t)cnt;
        if ((rc = ranks_mpi_check(MPI_Isend(ns->buf, (int)((3 + cnt) * 4), MPI_BYTE, r,
                                            RANKS_TAG_NOTE, MPI_COMM_WORLD, &ns->req),
                                  err, "prefetch note")))
            return rc;
        l->st.notes++;
        l->st.note_bytes += (3 + cnt) * 4;
        if (prefetch)
            l->guessed += cnt;
        l->st.messages++;
    }
    return 0;
}

/* ---- the applier ---------------------------------------------------------- */

static int req_add(ranks_lead *l, int *n, MPI_Request r, int what)
{
    if (*n >= l->nreq_cap)
        return -1;
    l->reqs[*n] = r;
    l->what[*n] = what;
    (*n)++;
    return 0;
}

/* Pack owner r's WORK: its experts of the batch, their rows in pair order. */
static void work_pack(ranks_lead *l, lead_owner *o, const engine_moe_batch *b)
{
    ranks_work *wh = (ranks_work *)o->work;
    int32_t *ids = (int32_t *)(wh + 1), *cnt = ids + o->n;
    float *rows = (float *)(cnt + o->n);
    size_t lat = b->latent, row = 0;

    for (size_t j = 0; j < o->n; j++) {
        int32_t e = o->ids[j];
        ids[j] = e;
        cnt[j] = b->cnt[e];
        for (int32_t i = 0; i < b->cnt[e]; i++) {
            size_t t = (size_t)b->pairs[b->first[e] + i] / b->k;
            memcpy(rows + row++ * lat, b->z + t * lat, lat * sizeof(float));
        }
    }
    *wh = (ranks_work){ b->layer, (int32_t)o->n, (int32_t)row, l->seq };
    o->rows = row;
}

static int ap_send_do(void *ctx, const engine_moe_batch *b, shoal_err *err)
{
    ranks_lead *l = ctx;
    int m = l->moe_ord[b->layer], rc;

    l->t_send = shoal_now_ns();
    l->seq++;
    doing_set(l, "sending the inputs", b->layer);
    for (int r = 1; r < l->size; r++)
        l->o[r].n = 0;
    for (size_t i = 0; i < b->n_ids; i++) {
        lead_owner *o = &l->o[ranks_owner(m, b->ids[i], l->size)];
        o->ids[o->n++] = b->ids[i];
    }
    for (int r = 1; r < l->size; r++) {
        lead_owner *o = &l->o[r];
        size_t off = 0, bytes;
        if (o->n == 0)
            continue;
        /* the outputs' receives first, so they land in place */
        for (size_t j = 0; j < o->n; j++) {
            size_t cnt = (size_t)b->cnt[o->ids[j]];
            o->in_off[j] = off;
            bytes = sizeof(ranks_out) + cnt * b->latent * sizeof(float);
            if ((rc = ranks_mpi_check(MPI_Irecv(o->in + off, (int)bytes, MPI_BYTE, r,
                                                RANKS_TAG_OUT + (int)j, MPI_COMM_WORLD,
                                                &o->out_req[j]), err, "output receive")))
                return rc;
            off += bytes;
        }
        if ((rc = ranks_mpi_check(MPI_Irecv(&o->done, sizeof o->done, MPI_BYTE, r, RANKS_TAG_DONE,
                                            MPI_COMM_WORLD, &o->done_req), err, "done receive")))
            return rc;
        work_pack(l, o, b);
        bytes = sizeof(ranks_work) + 8 * o->n + o->rows * b->latent * sizeof(float);
        if ((rc = ranks_mpi_check(MPI_Isend(o->work, (int)bytes, MPI_BYTE, r, RANKS_TAG_WORK,
                                            MPI_COMM_WORLD, &o->work_req), err, "inputs send")))
            return rc;
        l->st.bytes_out += bytes;
        l->st.rows += o->rows;
        l->st.messages += 1;
    }
    return 0;
}

/* One completed request of the wait: an output is checked and scattered. */
static int completed(ranks_lead *l, const engine_moe_batch *b, int what, uint64_t *busy,
                     shoal_err *err)
{
    int r = what >> 16, kind = what & 0xffff;
    lead_owner *o = &l->o[r];

    if (kind == 2)
        return shoal_err_set(err, SHOAL_EIO, "rank %d: %.*s", r, RANKS_FAIL_MAX - 1, o->fail);
    if (kind == 1) {
        if (o->done.busy_ns > *busy)
            *busy = o->done.busy_ns;
        return 0;
    }
    if (kind >= 3) {
        size_t j = (size_t)(kind - 3);
        const ranks_out *h = (const ranks_out *)(o->in + o->in_off[j]);
        const float *y = (const float *)(h + 1);
        int32_t e = o->ids[j];
        if (h->layer != b->layer || h->expert != e || h->rows != b->cnt[e] || h->seq != l->seq)
            return shoal_err_set(err, SHOAL_EPROTO, "rank %d sent layer %d expert %d (%d rows) "
                                 "where layer %d expert %d (%d rows) was due", r, h->layer,
                                 h->expert, h->rows, b->layer, (int)e, (int)b->cnt[e]);
        for (int32_t i = 0; i < h->rows; i++)
            memcpy(b->slots + (size_t)b->pairs[b->first[e] + i] * b->latent,
                   y + (size_t)i * b->latent, b->latent * sizeof(float));
        l->st.bytes_in += sizeof *h + (size_t)h->rows * b->latent * sizeof(float);
        l->st.experts++;
        l->st.messages++;
    }
    return 0;
}

static int ap_wait_do(void *ctx, const engine_moe_batch *b, shoal_err *err)
{
    ranks_lead *l = ctx;
    uint64_t t0 = shoal_now_ns(), busy = 0;
    ranks_poll p;
    int n = 0, left, rc = 0, outcount;

    for (int r = 1; r < l->size; r++) {
        lead_owner *o = &l->o[r];
        if (req_add(l, &n, o->fail_req, r << 16 | 2) != 0)
            return shoal_err_set(err, SHOAL_EINTERNAL, "request table full");
        if (o->n == 0)
            continue;
        req_add(l, &n, o->work_req, r << 16 | 0);
        req_add(l, &n, o->done_req, r << 16 | 1);
        for (size_t j = 0; j < o->n; j++)
            req_add(l, &n, o->out_req[j], r << 16 | (int)(3 + j));
    }
    left = n - (l->size - 1);                 /* the FAIL receives stay open */
    doing_set(l, "waiting for the experts", b->layer);
    ranks_poll_begin(&p);
    while (left > 0) {
        rc = MPI_Testsome(n, l->reqs, &outcount, l->idx, l->sts);
        if (rc != MPI_SUCCESS) {
            rc = ranks_mpi_check(rc, err, "waiting for the experts' outputs");
            break;
        }
        if (outcount == MPI_UNDEFINED)
            outcount = 0;
        for (int i = 0; i < outcount && rc == 0; i++) {
            int what = l->what[l->idx[i]];
            if ((what & 0xffff) != 2)
                left--;
            rc = completed(l, b, what, &busy, err);
        }
        if (rc != 0)
            break;
        if (outcount > 0) {
            ranks_poll_begin(&p);
            continue;
        }
        if (shoal_now_ns() - p.start_ns > (uint64_t)l->timeout_ms * 1000000ull) {
            int late = 0;
            for (int i = 0; i < n && !late; i++)
                if (l->reqs[i] != MPI_REQUEST_NULL && (l->what[i] & 0xffff) != 2)
                    late = l->what[i] >> 16;
            rc = shoal_err_set(err, SHOAL_ETIMEOUT, "rank %d has not answered layer %d's "
                               "experts in %d ms: it died, hangs, or its shoald is stuck "
                               "(--timeout sets the limit)", late, b->layer, l->timeout_ms);
            break;
        }
        ranks_poll_pause(&p);
    }
    /* the FAIL receives stay posted: give their handles back */
    for (int i = 0; i < n; i++)
        if ((l->what[i] & 0xffff) == 2)
            l->o[l->what[i] >> 16].fail_req = l->reqs[i];
    if (rc != 0)
        return rc;
    uint64_t now = shoal_now_ns();
    l->st.layers++;
    l->st.span_ns += now - l->t_send;
    l->st.wait_ns += now - t0;
    l->st.owner_ns += busy;
    doing_set(l, "computing", b->layer);
    return 0;
}

/* Any failure breaks the lead: the run is aborted, no END is sent. */
static int ap_send(void *ctx, const engine_moe_batch *b, shoal_err *err)
{
    ranks_lead *l = ctx;
    int rc = ap_send_do(ctx, b, err);
    l->broken |= rc != 0;
    return rc;
}

static int ap_wait(void *ctx, const engine_moe_batch *b, shoal_err *err)
{
    ranks_lead *l = ctx;
    int rc = ap_wait_do(ctx, b, err);
    l->broken |= rc != 0;
    return rc;
}

static int src_request(void *impl, int layer, const int32_t *ids, size_t n, int prefetch,
                       shoal_err *err)
{
    ranks_lead *l = impl;
    int rc = src_request_do(impl, layer, ids, n, prefetch, err);
    l->broken |= rc != 0;
    return rc;
}

/* ---- the lead ------------------------------------------------------------- */

static int lead_alloc(ranks_lead *l)
{
    size_t rows_max = l->chunk * l->k, ne = l->ne;
    size_t work = sizeof(ranks_work) + 8 * ne + rows_max * l->lat * sizeof(float);
    size_t in = ne * sizeof(ranks_out) + rows_max * l->lat * sizeof(float);
    int moe = 0;

    if (!(l->moe_ord = calloc((size_t)l->m->cfg.n_layers + 1, sizeof *l->moe_ord)) ||
        !(l->o = calloc((size_t)l->size, sizeof *l->o)))
        return SHOAL_ENOMEM;
    for (int64_t i = 0; i < l->m->cfg.n_layers; i++)
        l->moe_ord[i] = l->m->cfg.layers[i].moe ? moe++ : -1;
    for (int r = 1; r < l->size; r++) {
        lead_owner *o = &l->o[r];
        o->work_req = o->done_req = o->fail_req = MPI_REQUEST_NULL;
        if (!(o->work = malloc(work)) || !(o->in = malloc(in)) ||
            !(o->out_req = calloc(ne, sizeof *o->out_req)))
            return SHOAL_ENOMEM;
        for (size_t j = 0; j < ne; j++)
            o->out_req[j] = MPI_REQUEST_NULL;
        for (int i = 0; i < NOTE_RING; i++) {
            o->notes[i].req = MPI_REQUEST_NULL;
            if (!(o->notes[i].buf = malloc((3 + ne) * sizeof(int32_t))))
                return SHOAL_ENOMEM;
        }
    }
    l->nreq_cap = (int)(l->size * 3 + ne + 8);
    if (!(l->reqs = calloc((size_t)l->nreq_cap, sizeof *l->reqs)) ||
        !(l->what = calloc((size_t)l->nreq_cap, sizeof *l->what)) ||
        !(l->idx = calloc((size_t)l->nreq_cap, sizeof *l->idx)) ||
        !(l->sts = calloc((size_t)l->nreq_cap, sizeof *l->sts)))
        return SHOAL_ENOMEM;
    return 0;
}

int ranks_lead_new(const engine_model *m, const ranks_lead_options *o, ranks_lead **out,
                   shoal_err *err)
{
    static const expert_source_ops ops = { src_fetch, src_free };
    static const expert_source_more_ops more = { src_request, src_stats, NULL };   /* order: id order */
    ranks_lead *l;
    int rc;

    *out = NULL;
    if (m->cfg.n_experts > RANKS_MAX_EXPERTS)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "--experts-over-ranks: %lld experts per "
                             "layer, at most %d", (long long)m->cfg.n_experts, RANKS_MAX_EXPERTS);
    if (!(l = calloc(1, sizeof *l)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    l->m = m;
    MPI_Comm_size(MPI_COMM_WORLD, &l->size);
    l->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 60000;
    l->lat = (size_t)m->cfg.latent;
    l->k = (size_t)m->cfg.n_experts_per_token;
    l->ne = (size_t)m->cfg.n_experts;
    l->chunk = o->chunk ? o->chunk : 1;
    l->ap = (engine_expert_applier){ ap_send, ap_wait, l };
    if ((rc = lead_alloc(l)) != 0 ||
        !(l->src = expert_source_new_more(&ops, &more, l))) {
        ranks_lead_free(l);
        return shoal_err_set(err, SHOAL_ENOMEM, "--experts-over-ranks: out of memory");
    }
    if ((rc = owners_meet(l, o, err)) != 0) {
        l->broken = 1;
        ranks_lead_free(l);
        return rc;
    }
    doing_set(l, "computing", 0);
    *out = l;
    return 0;
}

expert_source *ranks_lead_source(ranks_lead *l)
{
    return l->src;
}

const engine_expert_applier *ranks_lead_applier(ranks_lead *l)
{
    return &l->ap;
}

void ranks_lead_stats(const ranks_lead *l, ranks_stats *out)
{
    *out = l->st;
}

const char *ranks_lead_doing(const ranks_lead *l)
{
    return l ? l->doing : "";
}

void ranks_lead_free(ranks_lead *l)
{
    shoal_err err;

    if (!l)
        return;
    if (l->o) {
        for (int r = 1; r < l->size && !l->broken; r++) {
            lead_owner *o = &l->o[r];
            MPI_Request rq;
            for (int i = 0; i < NOTE_RING; i++)
                if (o->notes[i].req != MPI_REQUEST_NULL)
                    wait_one(l, &o->notes[i].req, r, "a prefetch note", &err);
            if (MPI_Isend(NULL, 0, MPI_BYTE, r, RANKS_TAG_END, MPI_COMM_WORLD, &rq) == MPI_SUCCESS)
                wait_one(l, &rq, r, "the end", &err);
        }
        for (int r = 1; r < l->size; r++) {
            lead_owner *o = &l->o[r];
            if (!l->broken && o->fail_req != MPI_REQUEST_NULL) {
                MPI_Cancel(&o->fail_req);
                MPI_Request_free(&o->fail_req);
            }
            for (int i = 0; i < NOTE_RING; i++)
                free(o->notes[i].buf);
            free(o->work);
            free(o->in);
            free(o->out_req);
        }
    }
    if (l->src) {
        expert_source *s = l->src;
        l->src = NULL;
        expert_source_free(s);      /* src_free does not free l */
    }
    free(l->moe_ord);
    free(l->o);
    free(l->reqs);
    free(l->what);
    free(l->idx);
    free(l->sts);
    free(l);
}
