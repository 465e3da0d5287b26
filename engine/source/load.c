/* load.c — a model loaded under the memory plan (see source.h part 3).
 *
 * Order: the machine's limits (common/platform.h), the config (the
 * directory's config.json, or the manifest shoald sends; no weight is read
 * yet), plan_make, the plan printed; a refusal stops here with the
 * plan's message.  Then the model is bound in the plan's spine mode
 * (engine_model_open, or engine_remote_bind with the plan's RAM tier), the
 * plan REPORTed to shoald, and the session options carry the plan's
 * context so no session grows past what the plan counted.
 */
#include "engine/source/source.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/client.h"
#include "common/json.h"
#include "common/log.h"
#include "common/path.h"
#include "common/platform.h"
#include "common/sys.h"

void engine_load_options_default(engine_load_options *o)
{
    memset(o, 0, sizeof *o);
    plan_options_default(&o->plan);
    o->page_cache = -1;
    o->experts = -1;
    o->alog = ENGINE_ALOG_PER_HEAD;
    o->l2 = ENGINE_L2_FLA;
    o->mla_eps = 1e-6;
}

static engine_remote_options remote_options(const engine_load_options *o)
{
    return (engine_remote_options){
        .home = o->home, .timeout_ms = o->timeout_ms,
        .page_cache = o->page_cache >= 0 ? (expert_page_cache)o->page_cache : EXPERT_PC_KEEP,
        .page_cache_set = o->page_cache >= 0, .spine_cache_off = o->spine_cache_off,
        .read_part = o->read_part, .spine_load = o->spine_load,
        .progress = o->progress, .progress_ctx = o->progress_ctx,
    };
}

/* Limits, config and plan; *remote connected for hf:// (else NULL). */
static int plan_for(const char *spec, const engine_load_options *o, plan *p, k3_config *cfg,
                    engine_remote **remote, shoal_err *err)
{
    shoal_mem_limits lim;
    plan_options po = o->plan;
    int rc;

    *remote = NULL;
    if ((rc = shoal_mem_limits_read(NULL, &lim, err)) != 0)
        return rc;
    po.remote = engine_remote_is_spec(spec);
    if (po.remote) {
        engine_remote_options ro = remote_options(o);
        if ((rc = engine_remote_connect(spec, &ro, remote, err)) != 0)
            return rc;
        const uint8_t *bytes;
        size_t len;
        shoal_json *root;
        engine_remote_config(*remote, &bytes, &len);
        root = shoal_json_parse((const char *)bytes, len, err);
        rc = root ? k3_config_parse(root, cfg, err) : SHOAL_EFORMAT;
        shoal_json_free(root);
    } else {
        char path[SHOAL_PATH_MAX];
        if (shoal_path_join(path, sizeof path, spec, "config.json") != 0)
            return shoal_err_set(err, SHOAL_EINVAL, "%s: path too long", spec);
        if ((rc = k3_config_load(path, cfg, err)) != 0)
            shoal_err_wrap(err, rc, "%s", path);
    }
    if (rc == 0)
        rc = plan_make(cfg, &lim, &po, p, err);
    return rc;
}

int engine_load_plan(const char *spec, const engine_load_options *o, plan *p, k3_config *cfg,
                     shoal_err *err)
{
    engine_remote *r = NULL;
    int rc = plan_for(spec, o, p, cfg, &r, err);
    engine_remote_free(r);
    return rc;
}

/* The plan to shoald (REPORT), so `shoal stats` shows what this engine
 * planned; a daemon that does not know the field ignores it. */
static void plan_report(engine_loaded *l)
{
    shoal_json *j = shoal_json_object(), *pj = plan_to_json(&l->plan);
    shoal_buf b;

    shoal_buf_init(&b, 0);
    if (j && pj && shoal_json_set_str(j, "tier", "ram") == 0 &&
        shoal_json_set_int(j, "hits", 0) == 0 && shoal_json_set_int(j, "misses", 0) == 0 &&
        shoal_json_set_int(j, "handle", engine_remote_handle(l->remote)) == 0 &&
        shoal_json_set_take(j, "plan", pj) == 0) {
        pj = NULL;
        if (shoal_json_dump(j, SHOAL_JSON_COMPACT, &b) == 0 && shoal_buf_append_u8(&b, 0) == 0 &&
            shoal_client_report(engine_remote_client(l->remote), (const char *)b.data, NULL) != 0)
            LOG_DEBUG("load", "shoald did not take the plan's REPORT");
    }
    shoal_json_free(pj);
    shoal_json_free(j);
    shoal_buf_free(&b);
}

/* The plan is made from the limit, not from what is free now: say so when
 * other processes hold more than the reserve leaves them. */
static void mem_check(const plan *p)
{
    uint64_t need = p->spine_resident + p->kv_bytes + p->scratch + p->pool;
    char a[32], b[32];
    if (!p->machine.mem_available || p->machine.mem_available >= need)
        return;
    shoal_size_format(p->machine.mem_available, a, sizeof a);
    shoal_size_format(need, b, sizeof b);
    LOG_WARN("load", "MemAvailable is %s, less than the %s this plan holds before its RAM tier: "
             "other processes use memory the plan counted on; give --ram a smaller size", a, b);
}

/* A step without a measure, for a caller that shows what the load does
 * (serve's /health while it loads). */
static void step(const engine_load_options *o, const char *what)
{
    if (o->progress)
        o->progress(o->progress_ctx, what, 0, 0);
}

int engine_load_open(const char *spec, const engine_load_options *o, engine_loaded *out,
                     shoal_err *err)
{
    engine_model_options mo;
    k3_config cfg;
    uint64_t t0 = shoal_now_ns();
    int rc;

    memset(out, 0, sizeof *out);
    out->plan_out = o->plan_out;
    step(o, engine_remote_is_spec(spec) ? "opening the model through shoald"
                                        : "opening the model");
    rc = plan_for(spec, o, &out->plan, &cfg, &out->remote, err);
    if (o->plan_out && (rc == 0 || out->plan.verdict == PLAN_REFUSED) && out->plan.limit)
        plan_print(&out->plan, &cfg, o->plan_out);
    if (rc != 0)
        goto fail;
    mem_check(&out->plan);
    if (!(out->pool = kernels_pool_new(o->plan.threads > 0 ? o->plan.threads : 1))) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "cannot start %d compute threads", o->plan.threads);
        goto fail;
    }
    engine_model_options_default(&mo);
    mo.spine = (engine_spine)out->plan.spine;
    mo.alog = o->alog;
    mo.l2 = o->l2;
    mo.mla_eps = o->mla_eps;
    mo.pool = out->pool;
    if (out->plan.verdict == PLAN_STREAMED)
        mo.stream_layers = (int)cfg.n_layers - out->plan.first_streamed_layer;
    step(o, "loading the spine");
    if (out->remote) {
        if ((rc = engine_remote_bind(out->remote, &mo, out->plan.tier, err)) != 0)
            goto fail;
        out->model = engine_remote_model(out->remote);
        out->src = engine_remote_source(out->remote);
        plan_report(out);
    } else if ((rc = engine_model_open(spec, &mo, &out->model, err)) != 0) {
        goto fail;
    } else if (!(out->src = expert_source_local_new(out->model))) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto fail;
    }
    out->session = (engine_session_options){
        .experts = o->experts >= 0 ? (kernels_numerics)o->experts
                   : mo.spine == ENGINE_SPINE_F32 ? KERNELS_EXACT : KERNELS_FAST,
        /* the plan's prefill chunk: --chunk, or the largest it allows */
        .chunk = out->plan.chunk ? out->plan.chunk : o->plan.chunk ? o->plan.chunk : 16,
        .pool = out->pool, .src = out->src,
        .no_prefetch = o->no_prefetch, .prefetch_cutoff = o->prefetch_cutoff,
        .max_positions = out->plan.context,
    };
    if (o->bound && (rc = o->bound(o->bound_ctx, out, err)) != 0)
        goto fail;
    out->load_ms = (double)(shoal_now_ns() - t0) / 1e6;
    return 0;
fail:
    engine_load_close(out);
    return rc;
}

void engine_load_close(engine_loaded *l)
{
    if (!l)
        return;
    if (l->model && l->plan.verdict == PLAN_STREAMED && l->plan_out) {
        engine_stream_stats st;
        engine_model_stream_stats(l->model, &st);
        fprintf(l->plan_out, "stats: streamed spine: layers %d-%d, %.1f MiB file, %.1f MiB "
                "buffers, %" PRIu64 " layer reads (%" PRIu64 " not read ahead), %.1f MiB, %.1f ms "
                "waited%s\n",
                 st.first_layer, (int)l->model->cfg.n_layers - 1, (double)st.file_bytes / 1048576.0,
                 (double)st.buffer_bytes / 1048576.0, st.reads, st.sync_reads,
                 (double)st.bytes / 1048576.0, (double)st.wait_ns / 1e6,
                 st.direct ? ", O_DIRECT" : ", buffered (O_DIRECT refused)");
    }
    if (l->remote) {
        engine_remote_free(l->remote);     /* owns the model and the source */
    } else {
        expert_source_free(l->src);
        engine_model_free(l->model);
    }
    kernels_pool_free(l->pool);
    plan keep = l->plan;
    memset(l, 0, sizeof *l);
    l->plan = keep;                         /* a refusal's plan stays readable */
}
