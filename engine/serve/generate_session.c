/* generate_session.c — the generator's backend over engine sessions
 * (engine/forward/forward.h part 5): states are engine_sessions, runs are engine_session_run, and
 * a snapshot is a copy of a session's decode state (engine_session_copy).
 *
 * Owns: the adapter.  Does not own the forward pass or the state layout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/forward/forward.h"
#include "engine/serve/serve.h"
#include "engine/kernels/kernels.h"
#include "engine/source/source.h"

typedef struct sess_backend {
    const engine_model *m;
    engine_session_options opt;
    int32_t *tmp;          /* ids as the session takes them */
    size_t   tmp_cap;
} sess_backend;

static int sb_new(void *impl, void **state, shoal_err *err)
{
    sess_backend *b = impl;
    engine_session *s = NULL;
    int rc = engine_session_new(b->m, &b->opt, &s, err);
    *state = s;
    return rc;
}

static void sb_free(void *impl, void *state)
{
    (void)impl;
    engine_session_free(state);
}

static int sb_copy(void *impl, void *dst, const void *src, shoal_err *err)
{
    (void)impl;
    return engine_session_copy(dst, src, err);
}

static int sb_run(void *impl, void *state, const uint32_t *ids, size_t n, float *logits,
                  shoal_err *err)
{
    sess_backend *b = impl;
    if (n > b->tmp_cap) {
        int32_t *t = realloc(b->tmp, n * sizeof *t);
        if (!t)
            return shoal_err_set(err, SHOAL_ENOMEM, "generate: out of memory");
        b->tmp = t;
        b->tmp_cap = n;
    }
    for (size_t i = 0; i < n; i++)
        b->tmp[i] = (int32_t)ids[i];
    return engine_session_run(state, b->tmp, n, logits, err);
}

static const gen_backend_ops SESSION_OPS = {
    .state_new = sb_new, .state_free = sb_free, .state_copy = sb_copy, .run = sb_run,
};

int gen_backend_session_new(const engine_model *m, const engine_session_options *opt,
                            gen_backend *out, shoal_err *err)
{
    sess_backend *b;

    memset(out, 0, sizeof *out);
    if (m->cfg.vocab <= 0 || m->cfg.max_positions <= 1 || opt->max_positions == 1)
        return shoal_err_set(err, SHOAL_EINVAL, "generate: the model has no vocabulary or context");
    if (!(b = calloc(1, sizeof *b)))
        return shoal_err_set(err, SHOAL_ENOMEM, "generate: out of memory");
    b->m = m;
    b->opt = *opt;
    out->ops = &SESSION_OPS;
    out->impl = b;
    out->n_vocab = (uint32_t)m->cfg.vocab;
    out->chunk = opt->chunk;
    /* the memory plan's context when it caps the model's */
    out->n_ctx = (size_t)(opt->max_positions > 0 && opt->max_positions < m->cfg.max_positions
                              ? opt->max_positions : m->cfg.max_positions);
    return 0;
}

void gen_backend_session_free(gen_backend *b)
{
    sess_backend *sb;
    if (!b || !b->impl)
        return;
    sb = b->impl;
    free(sb->tmp);
    free(sb);
    b->impl = NULL;
}

/* ---- gen_model ------------------------------------------------------------------ */

/* The tokenizer reads a directory: write the model's tokenizer files,
 * fetched through shoald, into a private temporary one. */
static int remote_tokenizer(gen_model *gm, shoal_err *err)
{
    static const char *const files[] = { "config.json", "tiktoken.model",
                                         "tokenizer_config.json" };
    char dir[] = "/tmp/shoal-engine-tok-XXXXXX", path[sizeof dir + 32];
    int rc;

    if (!mkdtemp(dir))
        return shoal_err_set(err, SHOAL_EIO, "cannot create a temporary directory for the "
                             "tokenizer files");
    rc = engine_remote_write_files(gm->remote, files, 3, dir, err);
    if (rc == 0)
        rc = tokenizer_model_open(&gm->tok, dir, err);
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
    return rc;
}

void gen_model_load_options(const gen_model_options *o, engine_load_options *out)
{
    if (o->load) {
        *out = *o->load;
        return;
    }
    engine_load_options_default(out);
    out->plan.threads = o->threads > 0 ? o->threads : 1;
    out->plan.chunk = o->chunk;            /* 0: the largest the plan allows */
    out->plan.spine = o->spine_f32 ? K3_SPINE_F32 : -1;
    out->home = o->home;
}

/* A step of the load without a measure (gen_model_options.load). */
static void step(const engine_load_options *lo, const char *what)
{
    if (lo->progress)
        lo->progress(lo->progress_ctx, what, 0, 0);
}

int gen_model_open(const char *dir, const gen_model_options *o, gen_model *out, shoal_err *err)
{
    engine_load_options lo;
    int rc;

    memset(out, 0, sizeof *out);
    gen_model_load_options(o, &lo);
    lo.plan.copies = 2;                    /* live and snapshot (Reuse above) */
    if (!(out->load = calloc(1, sizeof *out->load))) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = engine_load_open(dir, &lo, out->load, err)) != 0)
        goto fail;
    out->pool = out->load->pool;
    out->model = out->load->model;
    out->src = out->load->src;
    out->remote = out->load->remote;
    step(&lo, "loading the tokenizer");
    if ((rc = out->remote ? remote_tokenizer(out, err) : tokenizer_model_open(&out->tok, dir, err)))
        goto fail;
    if ((rc = gen_backend_session_new(out->model, &out->load->session, &out->backend, err)) != 0)
        goto fail;
    if ((rc = generator_new(&out->backend, &out->gen, err)) != 0)
        goto fail;
    if (tokenizer_special_id(out->tok, "<|end_of_msg|>", &out->eos) != 0)
        out->eos = (uint32_t)out->model->cfg.eos_id;
    return 0;
fail:
    gen_model_close(out);
    return rc;
}

int gen_model_ping(gen_model *gm, shoal_err *err)
{
    return gm->remote ? engine_remote_ping(gm->remote, err) : 0;
}

int gen_model_reconnect(gen_model *gm, shoal_err *err)
{
    return gm->remote ? engine_remote_reconnect(gm->remote, err) : 0;
}

void gen_model_close(gen_model *gm)
{
    if (!gm)
        return;
    generator_free(gm->gen);
    gen_backend_session_free(&gm->backend);
    tokenizer_free(gm->tok);
    engine_load_close(gm->load);            /* owns pool, model, source, remote */
    free(gm->load);
    memset(gm, 0, sizeof *gm);
}
