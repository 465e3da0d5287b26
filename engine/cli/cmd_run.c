/* cmd_run.c — `shoal-engine run MODEL --tokens IDS --max-tokens N`: greedy
 * generation from a prompt of token ids.
 *
 * Owns: option parsing, the generation loop (prefill in chunks, then one
 * decode step per token, argmax with ties to the lowest id), and the
 * outputs: ids line, --json, --dump-logits, --dump-hidden (.npy), --stats.
 * Does not own the forward pass nor the model (engine/forward/).
 *
 * Dump formats match tests/reference/k3_ref.py:
 *   --dump-logits  raw little-endian float32, vocab_size values for each
 *                  generated token: the distribution it was taken from
 *                  (position prompt-1, then each decode step);
 *   --dump-hidden  .npy float64 [positions, layers, hidden], the output of
 *                  every layer for every position run through the stack
 *                  (prompt + max_tokens - 1: the last token is not fed back).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/json.h"
#include "common/log.h"
#include "common/path.h"
#include "common/sys.h"
#include "engine/cli/cli_int.h"
#include "engine/forward/forward.h"
#include "engine/ranks/ranks.h"
#include "engine/source/source.h"

typedef struct run_opts {
    cli_opts c;                  /* MODEL and every shared option */
    int32_t *tokens;
    size_t n_tokens;
    long max_tokens;
    int json, stop_at_eos;
    const char *dump_logits, *dump_hidden;
    const char *toks;            /* --tokens as given */
    int over_ranks;              /* --experts-over-ranks (docs/mpi.md) */
    cli_ranks ranks;             /* rank 0 of such a run: the lead once bound */
} run_opts;

enum { RUN_TOKENS = CLI_OWN, RUN_MAX_TOKENS, RUN_STOP_EOS, RUN_JSON, RUN_DUMP_LOGITS,
       RUN_DUMP_HIDDEN, RUN_EXPERTS, RUN_ALOG, RUN_MLA_EPS, RUN_L2, RUN_RANKS };

static const cli_option RUN_OPTS[] = {
    { "tokens", 1, RUN_TOKENS }, { "max-tokens", 1, RUN_MAX_TOKENS },
    { "stop-at-eos", 0, RUN_STOP_EOS }, { "json", 0, RUN_JSON },
    { "dump-logits", 1, RUN_DUMP_LOGITS }, { "dump-hidden", 1, RUN_DUMP_HIDDEN },
    { "experts", 1, RUN_EXPERTS }, { "alog", 1, RUN_ALOG }, { "mla-eps", 1, RUN_MLA_EPS },
    { "l2", 1, RUN_L2 }, { "experts-over-ranks", 0, RUN_RANKS }, { NULL, 0, 0 },
};

static void usage(FILE *f)
{
    fputs("usage: shoal-engine run MODEL --tokens IDS [--max-tokens N] [options]\n"
          "       shoal-engine run MODEL --prompt TEXT [options]   (run --prompt --help)\n"
          "\n"
          "Greedy generation from comma-separated token ids; prints the generated\n"
          "ids space-separated as the last line of stdout.  The memory plan is printed\n"
          "on stderr first (`shoal-engine plan MODEL` prints it alone).\n"
          "\n"
          "  MODEL               a local model directory, or hf://org/name[@rev]\n"
          "                      read through a running shoald\n"
          "  --tokens IDS        prompt, e.g. 1,2,3 (no BOS is added)\n"
          "  --max-tokens N      tokens to generate (default 16)\n"
          "  --stop-at-eos       stop after eos_token_id\n"
          "  --json              print one JSON object instead of the ids line\n"
          "                      (with --stats, the plan and the counters too)\n"
          "  --dump-logits FILE  float32 LE, vocab_size values per generated token\n"
          "  --dump-hidden FILE  .npy float64 [positions, layers, hidden]\n"
          "  --experts fast|exact  routed experts: int8 or f32 activations\n"
          "                      (default fast, exact with --spine f32)\n"
          "  --alog per-head|per-channel   KDA A_log indexing (default per-head)\n"
          "  --mla-eps E         MLA latent RMSNorm epsilon (default 1e-6)\n"
          "  --l2 fla|max        KDA L2 norm form (default fla)\n"
          "  --experts-over-ranks  under mpirun -np N (a `make MPI=1` build): rank 0\n"
          "                      runs the model, ranks 1..N-1 own its routed experts,\n"
          "                      each with its own shoald (%r in --home or SHOAL_HOME\n"
          "                      is the rank); docs/mpi.md\n", f);
}

static int parse_tokens(const char *s, run_opts *o)
{
    size_t cap = 16;
    o->tokens = malloc(cap * sizeof *o->tokens);
    if (!o->tokens)
        return -1;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < INT32_MIN || v > INT32_MAX || (*end && *end != ','))
            return -1;
        if (o->n_tokens == cap) {
            int32_t *nt = realloc(o->tokens, 2 * cap * sizeof *nt);
            if (!nt)
                return -1;
            o->tokens = nt;
            cap *= 2;
        }
        o->tokens[o->n_tokens++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return o->n_tokens ? 0 : -1;
}

static int run_own(void *ctx, int id, const char *val)
{
    run_opts *o = ctx;
    engine_load_options *l = &o->c.load;
    double v;

    switch (id) {
    case RUN_TOKENS: o->toks = val; return 0;
    case RUN_MAX_TOKENS: return shoal_long_parse(val, 0, 1L << 20, &o->max_tokens);
    case RUN_STOP_EOS: o->stop_at_eos = 1; return 0;
    case RUN_JSON: o->json = 1; return 0;
    case RUN_DUMP_LOGITS: o->dump_logits = val; return 0;
    case RUN_DUMP_HIDDEN: o->dump_hidden = val; return 0;
    case RUN_RANKS: o->over_ranks = 1; return 0;
    case RUN_EXPERTS:
        if (strcmp(val, "fast") == 0) l->experts = KERNELS_FAST;
        else if (strcmp(val, "exact") == 0) l->experts = KERNELS_EXACT;
        else return -1;
        return 0;
    case RUN_ALOG:
        if (strcmp(val, "per-head") == 0) l->alog = ENGINE_ALOG_PER_HEAD;
        else if (strcmp(val, "per-channel") == 0) l->alog = ENGINE_ALOG_PER_CHANNEL;
        else return -1;
        return 0;
    case RUN_L2:
        if (strcmp(val, "fla") == 0) l->l2 = ENGINE_L2_FLA;
        else if (strcmp(val, "max") == 0) l->l2 = ENGINE_L2_MAX;
        else return -1;
        return 0;
    case RUN_MLA_EPS:
        if (cli_number(val, 1e-30, 1, &v) != 0)
            return -1;
        l->mla_eps = v;
        return 0;
    }
    return -1;
}

/* 0, 1 after --help/--version, or 2 after printing a usage error. */
static int parse_args(int argc, char **argv, run_opts *o)
{
    int rc;

    cli_opts_init(&o->c);
    o->c.load.plan.copies = 1;           /* run --tokens holds one sequence */
    o->max_tokens = 16;
    if ((rc = cli_parse("run", argc, argv, RUN_OPTS, run_own, o, usage, &o->c)) != 0)
        return rc;
    if (!o->toks || parse_tokens(o->toks, o) != 0) {
        fprintf(stderr, "run: --tokens needs comma-separated integer ids\n");
        return 2;
    }
    /* --chunk auto: the prompt through each layer at once if the plan allows */
    o->c.load.plan.chunk_max = o->n_tokens;
    return 0;
}

/* ---- --dump-hidden ----------------------------------------------------------- */

typedef struct hidden_sink {
    double *data;      /* [positions][layers][dim] */
    int64_t positions;
    int layers;
    size_t dim;
} hidden_sink;

static void hidden_store(void *ctx, int64_t pos, int layer, const float *h, size_t dim)
{
    hidden_sink *hs = ctx;
    if (pos < 0 || pos >= hs->positions || dim != hs->dim)
        return;
    double *dst = hs->data + ((size_t)pos * (size_t)hs->layers + (size_t)layer) * dim;
    for (size_t i = 0; i < dim; i++)
        dst[i] = h[i];
}

/* .npy version 1.0: magic, u16 LE header length, a Python dict literal
 * padded with spaces and '\n' so the data start at a multiple of 64. */
static int npy_write(const char *path, const hidden_sink *hs, shoal_err *err)
{
    shoal_buf b;
    char dict[256];
    int rc;
    size_t n = (size_t)hs->positions * (size_t)hs->layers * hs->dim;
    int len = snprintf(dict, sizeof dict,
                       "{'descr': '<f8', 'fortran_order': False, 'shape': (%lld, %d, %zu), }",
                       (long long)hs->positions, hs->layers, hs->dim);
    size_t hlen = (size_t)len + 1;
    while ((10 + hlen) % 64)
        hlen++;
    shoal_buf_init(&b, 0);
    rc = shoal_buf_append(&b, "\x93NUMPY\x01\x00", 8);
    if (rc == 0) rc = shoal_buf_append_le16(&b, (uint16_t)hlen);
    if (rc == 0) rc = shoal_buf_append(&b, dict, (size_t)len);
    for (size_t i = (size_t)len; rc == 0 && i + 1 < hlen; i++)
        rc = shoal_buf_append_u8(&b, ' ');
    if (rc == 0) rc = shoal_buf_append_u8(&b, '\n');
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint64_t bits;
        memcpy(&bits, &hs->data[i], 8);
        rc = shoal_buf_append_le64(&b, bits);
    }
    if (rc == 0)
        rc = shoal_write_file_atomic(path, b.data, b.len, err);
    else
        shoal_err_set(err, SHOAL_ENOMEM, "%s: out of memory", path);
    shoal_buf_free(&b);
    return rc;
}

/* ---- generation ------------------------------------------------------------- */

typedef struct gen_out {
    int32_t *ids;
    size_t n;
    float *logits;       /* [n][V] when dumping */
    double prefill_ms, load_ms;
    double *step_ms;     /* [n]: prefill for 0, decode after */
    double *wait_ms;     /* [n]: of which waiting for experts */
    uint64_t prefill_loads, prefill_uses;
    uint64_t *layer_loads;  /* [n_layers] distinct experts the prefill fetched */
    uint64_t prefill_chunks;
    uint64_t majflt_load, majflt_run;   /* major page faults: at load, while generating */
} gen_out;

static int32_t argmax(const float *x, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* Per-layer distinct loads: before the prefill (0: remember them), after
 * it (1: keep the difference). */
static void layer_loads_take(const engine_session *s, const engine_model *m, uint64_t *v,
                             int after)
{
    if (!v)
        return;
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        uint64_t now = engine_session_layer_loads(s, (int)l);
        v[l] = after ? now - v[l] : now;
    }
}

static int generate(const run_opts *o, engine_session *s, const engine_model *m, gen_out *g,
                    shoal_err *err)
{
    size_t v = (size_t)m->cfg.vocab;
    float *logits = malloc(v * sizeof *logits);
    int rc = 0;

    if (!logits)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (long step = 0; step < o->max_tokens; step++) {
        uint64_t t0 = shoal_now_ns();
        engine_session_stats b, a;
        engine_session_stats_get(s, &b);
        if (step == 0)
            layer_loads_take(s, m, g->layer_loads, 0);
        if (step == 0)
            rc = engine_session_run(s, o->tokens, o->n_tokens, logits, err);
        else
            rc = engine_session_run(s, &g->ids[g->n - 1], 1, logits, err);
        if (rc != 0)
            break;
        g->step_ms[g->n] = (double)(shoal_now_ns() - t0) / 1e6;
        engine_session_stats_get(s, &a);
        g->wait_ms[g->n] = (double)(a.wait_ns - b.wait_ns) / 1e6;
        if (step == 0) {
            g->prefill_ms = g->step_ms[0];
            g->prefill_loads = a.expert_loads - b.expert_loads;
            g->prefill_uses = a.expert_uses - b.expert_uses;
            g->prefill_chunks = a.chunks - b.chunks;
            layer_loads_take(s, m, g->layer_loads, 1);
        }
        if (g->logits)
            memcpy(g->logits + g->n * v, logits, v * sizeof *logits);
        g->ids[g->n++] = argmax(logits, v);
        if (o->stop_at_eos && g->ids[g->n - 1] == m->cfg.eos_id)
            break;
    }
    if (rc == 0 && o->max_tokens == 0) {
        uint64_t t0 = shoal_now_ns();
        rc = engine_session_run(s, o->tokens, o->n_tokens, NULL, err);
        g->prefill_ms = (double)(shoal_now_ns() - t0) / 1e6;
    }
    free(logits);
    return rc;
}

static void print_recall(const engine_session *s, const engine_model *m,
                         const expert_source_stats *es)
{
    fprintf(stderr, "stats: prefetch: %" PRIu64 " experts guessed, %" PRIu64 " used (%" PRIu64
            " in before their layer asked); RAM tier %" PRIu64 " experts resident (%.1f MiB, "
            "quota %" PRIu64 " per layer)\n", es->prefetch_sent, es->prefetch_used,
            es->prefetch_early, es->ram_resident, (double)es->ram_bytes / 1048576.0, es->ram_quota);
    if (es->read_bytes)
        fprintf(stderr, "stats: reads: %.1f MiB (%.1f MiB as guesses), some read running for "
                "%.1f ms\n", (double)es->read_bytes / 1048576.0,
                (double)es->read_guess_bytes / 1048576.0, (double)es->read_busy_ns / 1e6);
    if (es->pool_max)
        fprintf(stderr, "stats: expert buffers outside the RAM tier: at most %" PRIu64 " held "
                "(the pool: %" PRIu64 ")\n", es->pool_peak, es->pool_max);
    fprintf(stderr, "stats: recall per MoE layer (lookahead / previous token; sent):");
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        engine_layer_recall r;
        static const char *pick[] = { "none", "lookahead", "previous" };
        if (!m->cfg.layers[l].moe)
            continue;
        engine_session_recall(s, (int)l, &r);
        fprintf(stderr, " L%lld %.2f/%.2f %s;", (long long)l,
                r.look_total ? (double)r.look_hits / (double)r.look_total : 0.0,
                r.prev_total ? (double)r.prev_hits / (double)r.prev_total : 0.0,
                r.look_total || r.prev_total ? pick[r.predictor] : "-");
    }
    fputc('\n', stderr);
}

/* The prefill's distinct experts per MoE layer against the bound: one
 * chunk of T tokens needs at most min(T x top-k, experts) of a layer. */
static void print_layer_loads(const run_opts *o, const gen_out *g, const engine_model *m)
{
    uint64_t k = (uint64_t)m->cfg.n_experts_per_token, e = (uint64_t)m->cfg.n_experts;
    uint64_t bound = (uint64_t)o->n_tokens * k < e ? (uint64_t)o->n_tokens * k : e;

    if (!g->layer_loads || m->cfg.n_moe_layers == 0)
        return;
    fprintf(stderr, "\nstats: prefill of %zu tokens in %" PRIu64 " chunk%s: distinct experts read "
            "per MoE layer / bound min(tokens x top-k, experts) = %" PRIu64 ":", o->n_tokens,
            g->prefill_chunks, g->prefill_chunks == 1 ? "" : "s", bound);
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        if (m->cfg.layers[l].moe)
            fprintf(stderr, " L%lld %" PRIu64 "/%" PRIu64 ";", (long long)l, g->layer_loads[l],
                    bound);
}

static void print_stats(const run_opts *o, const gen_out *g, const engine_session *s,
                        const expert_source *src, const engine_model *m)
{
    engine_session_stats st;
    expert_source_stats es;
    engine_session_stats_get(s, &st);
    expert_source_stats_get(src, &es);
    fprintf(stderr, "stats: load %.1f ms, prefill %zu tokens %.2f ms", g->load_ms, o->n_tokens,
            g->prefill_ms);
    for (size_t i = 1; i < g->n; i++)
        fprintf(stderr, "%s%.2f", i == 1 ? "\nstats: per-token ms: " : " ", g->step_ms[i]);
    for (size_t i = 1; i < g->n; i++)
        fprintf(stderr, "%s%.2f/%.2f", i == 1 ? "\nstats: per-token compute/waiting ms: " : " ",
                g->step_ms[i] - g->wait_ms[i], g->wait_ms[i]);
    fprintf(stderr, "\nstats: experts %" PRIu64 " loads (%" PRIu64 " token-expert uses) in %" PRIu64
            " MoE layer runs, %.1f MiB read;", st.expert_loads, st.expert_uses, st.moe_calls,
            (double)es.bytes / 1048576.0);
    for (int t = 0; t < EXPERT_TIER_COUNT; t++)
        fprintf(stderr, " %s %" PRIu64, expert_tier_name((expert_tier)t), es.hits[t]);
    fprintf(stderr, "\nstats: prefill loaded %" PRIu64 " distinct experts for %" PRIu64
            " token-expert uses (each expert of a chunk once)", g->prefill_loads, g->prefill_uses);
    print_layer_loads(o, g, m);
    double tot = (double)st.total_ns / 1e6;
    fprintf(stderr, "\nstats: time %.1f ms: spine %.1f, experts %.1f, attention %.1f, waiting %.1f, "
            "other %.1f; per MoE layer %.3f ms\n", tot, (double)st.spine_ns / 1e6,
            (double)st.expert_ns / 1e6, (double)st.attn_ns / 1e6, (double)st.wait_ns / 1e6,
            tot - (double)(st.spine_ns + st.expert_ns + st.attn_ns + st.wait_ns) / 1e6,
            st.moe_calls ? (double)st.moe_ns / 1e6 / (double)st.moe_calls : 0.0);
    if (m->cfg.n_moe_layers > 0)
        print_recall(s, m, &es);
}

/* The process's major page faults so far: each one a read from disk of a
 * page that was not in memory (a spine that stays resident has none
 * during generation). */
static uint64_t majflt_now(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (uint64_t)ru.ru_majflt : 0;
}

/* --json with --stats: the plan, the major faults and the spine's load. */
static int json_stats(shoal_json *root, const gen_out *g, const engine_loaded *l)
{
    shoal_json *pl = plan_to_json(&l->plan), *st = shoal_json_object();
    int rc = pl && st ? 0 : -1;

    if (rc == 0) {
        rc |= shoal_json_set_int(st, "majflt_load", (int64_t)g->majflt_load);
        rc |= shoal_json_set_int(st, "majflt_run", (int64_t)g->majflt_run);
        rc |= shoal_json_set_int(st, "spine_bytes", (int64_t)l->model->spine_bytes);
        if (l->remote) {
            engine_remote_spine sp;
            engine_remote_spine_info(l->remote, &sp);
            rc |= shoal_json_set_bool(st, "spine_from_pack", sp.from_pack);
            rc |= shoal_json_set_bool(st, "spine_built", sp.built);
            rc |= shoal_json_set_bool(st, "spine_stored", sp.stored);
            rc |= shoal_json_set_int(st, "spine_pack_bytes", (int64_t)sp.pack_bytes);
            rc |= shoal_json_set_num(st, "spine_load_ms", sp.load_ms);
            rc |= shoal_json_set_num(st, "spine_read_ms", sp.read_ms);
        }
    }
    if (rc == 0) { rc = shoal_json_set_take(root, "plan", pl); pl = NULL; }
    if (rc == 0) { rc = shoal_json_set_take(root, "stats", st); st = NULL; }
    shoal_json_free(pl);
    shoal_json_free(st);
    return rc;
}

static int print_json(const run_opts *o, const gen_out *g, const engine_loaded *l)
{
    shoal_json *root = shoal_json_object(), *pt = shoal_json_array(), *tk = shoal_json_array();
    shoal_json *tm = shoal_json_object(), *per = shoal_json_array();
    shoal_buf b;
    double decode = 0;
    int rc = (root && pt && tk && tm && per) ? 0 : -1;

    for (size_t i = 0; rc == 0 && i < o->n_tokens; i++)
        rc = shoal_json_append_take(pt, shoal_json_new_int(o->tokens[i]));
    for (size_t i = 0; rc == 0 && i < g->n; i++)
        rc = shoal_json_append_take(tk, shoal_json_new_int(g->ids[i]));
    for (size_t i = 1; rc == 0 && i < g->n; i++) {
        decode += g->step_ms[i];
        rc = shoal_json_append_take(per, shoal_json_new_num(g->step_ms[i]));
    }
    if (rc == 0) {
        shoal_json_set_num(tm, "load_ms", g->load_ms);
        shoal_json_set_num(tm, "prefill_ms", g->prefill_ms);
        shoal_json_set_num(tm, "decode_ms", decode);
        shoal_json_set_num(tm, "decode_tokens_per_s", decode > 0 ? (double)(g->n - 1) * 1e3 / decode : 0);
        rc = shoal_json_set_take(tm, "per_token_ms", per);
        per = NULL;
    }
    if (rc == 0) { rc = shoal_json_set_take(root, "prompt_tokens", pt); pt = NULL; }
    if (rc == 0) { rc = shoal_json_set_take(root, "tokens", tk); tk = NULL; }
    if (rc == 0) { rc = shoal_json_set_take(root, "timings", tm); tm = NULL; }
    if (rc == 0 && o->c.stats)
        rc = json_stats(root, g, l);
    shoal_buf_init(&b, 0);
    if (rc == 0)
        rc = shoal_json_dump(root, 0, &b);
    if (rc == 0)
        printf("%.*s\n", (int)b.len, (const char *)b.data);
    shoal_buf_free(&b);
    shoal_json_free(root);
    shoal_json_free(pt);
    shoal_json_free(tk);
    shoal_json_free(tm);
    shoal_json_free(per);
    return rc;
}

/* The prompt and the tokens to generate must fit the plan's context. */
static int context_check(const run_opts *o, const engine_loaded *l, shoal_err *err)
{
    int64_t need = (int64_t)o->n_tokens + (o->max_tokens > 0 ? o->max_tokens - 1 : 0);
    int64_t ctx = l->plan.context;

    if (need <= ctx)
        return 0;
    return shoal_err_set(err, SHOAL_ERANGE, "the prompt (%zu tokens) and --max-tokens %ld need "
                         "%" PRId64 " positions; the context is %" PRId64 " tokens (%s)",
                         o->n_tokens, o->max_tokens, need, ctx,
                         l->plan.context_set ? "--context"
                         : ctx < l->model->cfg.max_positions
                             ? "the memory plan's cap: raise it with --context N, or give the "
                               "run more memory"
                             : "max_position_embeddings");
}

static void print_spine(const engine_loaded *l)
{
    engine_remote_spine sp;
    if (!l->remote)
        return;
    engine_remote_spine_info(l->remote, &sp);
    fprintf(stderr, "stats: spine %s %s in %.1f ms%s%s\n",
            k3_spine_mode_name((k3_spine_mode)sp.mode),
            sp.built ? "quantized into a pack at load"
            : sp.from_pack ? "from the cached pack (nothing quantized)" : "quantized in memory",
            sp.load_ms,
            sp.stored ? (sp.put_direct ? "; pack stored (written into shoald's file)"
                                       : "; pack stored (PUT of a temporary file)")
            : sp.refused ? "; cached pack refused" : "",
            !sp.from_pack ? "" : sp.mapped ? (sp.locked ? "; mapped and locked"
                                                        : "; mapped, not locked")
            : sp.direct ? "; read into memory with O_DIRECT" : "; read into memory");
}

/* ---- --experts-over-ranks (docs/mpi.md) -------------------------------------- */

static const ranks_lead *g_lead;

/* The launcher ends the other ranks with SIGTERM when one dies: say what
 * rank 0 was waiting for before going (async-signal-safe writes only). */
static void on_term(int sig)
{
    static const char a[] = "run: rank 0: ended by a signal while ";
    static const char b[] = ": an owner rank died or the launcher stopped the run (mpirun's "
                            "message names the rank)\n";
    const char *d = ranks_lead_doing(g_lead);
    ssize_t w;

    (void)sig;
    w = write(2, a, sizeof a - 1);
    w = write(2, d[0] ? d : "loading", d[0] ? strlen(d) : 7);
    w = write(2, b, sizeof b - 1);
    (void)w;
    _exit(1);
}

static void print_ranks(const run_opts *o, const ranks_lead *l, const gen_out *g)
{
    size_t positions = o->n_tokens + (g->n ? g->n - 1 : 0);
    ranks_stats r;
    double per = 0;

    ranks_lead_stats(l, &r);
    if (!r.layers)
        return;
    per = (double)r.span_ns > (double)r.owner_ns ? (double)(r.span_ns - r.owner_ns) : 0;
    fprintf(stderr, "stats: ranks: %" PRIu64 " MoE layer runs, %" PRIu64 " experts (%" PRIu64
            " rows) applied by owners; per layer run: span %.3f ms (inputs out .. last output "
            "in), busiest owner %.3f ms, communication %.3f ms, rank 0 waiting %.3f ms\n",
            r.layers, r.experts, r.rows, (double)r.span_ns / 1e6 / (double)r.layers,
            (double)r.owner_ns / 1e6 / (double)r.layers, per / 1e6 / (double)r.layers,
            (double)r.wait_ns / 1e6 / (double)r.layers);
    fprintf(stderr, "stats: ranks: %" PRIu64 " bytes out, %" PRIu64 " bytes in, %" PRIu64
            " prefetch notes (%" PRIu64 " bytes), %" PRIu64 " messages; per token %.0f bytes "
            "over %zu tokens\n", r.bytes_out, r.bytes_in, r.notes, r.note_bytes, r.messages,
            positions ? (double)(r.bytes_out + r.bytes_in + r.note_bytes) / (double)positions
                      : 0.0, positions);
}

static int run_model(run_opts *o, shoal_err *err)
{
    engine_loaded l;
    const engine_model *m;
    engine_session *s = NULL;
    hidden_sink hs = { 0 };
    gen_out g = { 0 };
    int rc;

    o->c.load.plan_out = stderr;
    o->c.load.progress = cli_progress;
    if ((rc = engine_load_open(o->c.model, &o->c.load, &l, err)) != 0)
        return rc;
    m = l.model;
    g.load_ms = l.load_ms;
    for (size_t i = 0; i < o->n_tokens; i++)
        if (o->tokens[i] < 0 || o->tokens[i] >= m->cfg.vocab) {
            rc = shoal_err_set(err, SHOAL_ERANGE, "--tokens: %d is outside the vocabulary [0, %lld)",
                               (int)o->tokens[i], (long long)m->cfg.vocab);
            goto done;
        }
    if ((rc = context_check(o, &l, err)) != 0)
        goto done;
    engine_session_options so = l.session;
    g_lead = o->ranks.lead;
    if (o->dump_hidden) {
        hs.layers = (int)m->cfg.n_layers;
        hs.dim = (size_t)m->cfg.hidden;
        hs.positions = (int64_t)o->n_tokens + (o->max_tokens > 0 ? o->max_tokens - 1 : 0);
        hs.data = calloc((size_t)hs.positions * (size_t)hs.layers * hs.dim + 1, sizeof *hs.data);
        so.hidden = hidden_store;
        so.hidden_ctx = &hs;
    }
    g.ids = calloc((size_t)o->max_tokens + 1, sizeof *g.ids);
    g.step_ms = calloc((size_t)o->max_tokens + 1, sizeof *g.step_ms);
    g.wait_ms = calloc((size_t)o->max_tokens + 1, sizeof *g.wait_ms);
    g.layer_loads = calloc((size_t)m->cfg.n_layers + 1, sizeof *g.layer_loads);
    if (o->dump_logits)
        g.logits = calloc((size_t)o->max_tokens * (size_t)m->cfg.vocab + 1, sizeof *g.logits);
    if (!g.ids || !g.step_ms || !g.wait_ms || !g.layer_loads || (o->dump_logits && !g.logits) || (o->dump_hidden && !hs.data)) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto done;
    }
    g.majflt_load = majflt_now();
    if ((rc = engine_session_new(m, &so, &s, err)) != 0 || (rc = generate(o, s, m, &g, err)) != 0)
        goto done;
    g.majflt_run = majflt_now() - g.majflt_load;
    if (o->dump_logits) {
        size_t bytes = g.n * (size_t)m->cfg.vocab * sizeof(float);
        /* float32 little-endian: the host order on every target we build for */
        if ((rc = shoal_write_file_atomic(o->dump_logits, g.logits, bytes, err)) != 0)
            goto done;
    }
    if (o->dump_hidden) {
        hs.positions = engine_session_pos(s);
        if ((rc = npy_write(o->dump_hidden, &hs, err)) != 0)
            goto done;
    }
    if (o->c.stats) {
        print_stats(o, &g, s, so.src, m);
        if (o->ranks.lead)
            print_ranks(o, o->ranks.lead, &g);
        print_spine(&l);
        fprintf(stderr, "stats: major page faults: %" PRIu64 " while loading, %" PRIu64
                " while generating\n", g.majflt_load, g.majflt_run);
    }
    if (o->json) {
        rc = print_json(o, &g, &l) == 0 ? 0 : shoal_err_set(err, SHOAL_ENOMEM, "cannot build the JSON");
    } else {
        for (size_t i = 0; i < g.n; i++)
            printf("%s%d", i ? " " : "", (int)g.ids[i]);
        printf("\n");
    }
done:
    engine_session_free(s);
    if (rc == 0)
        ranks_lead_free(o->ranks.lead);   /* the owners' END; on failure the run is aborted */
    engine_load_close(&l);
    free(hs.data);
    free(g.ids);
    free(g.step_ms);
    free(g.wait_ms);
    free(g.layer_loads);
    free(g.logits);
    return rc;
}

/* `mpirun -np N shoal-engine run MODEL --experts-over-ranks ...`: every
 * rank parses the same arguments; rank 0 runs the model and prints, the
 * others serve their experts until rank 0 is done.  A failure on rank 0
 * (its own, or an owner's it was told of) is printed there and ends every
 * rank (MPI_Abort). */
static int run_over_ranks(run_opts *o, int argc, char **argv)
{
    shoal_err err = { 0 };
    struct sigaction sa;
    int rc;

    if ((rc = cli_ranks_begin("run", &o->c, &argc, &argv, &o->ranks)) >= 0) {
        free(o->tokens);
        return rc;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    rc = run_model(o, &err);
    free(o->tokens);
    if (rc != 0) {
        fprintf(stderr, "run: %s\n", err.msg[0] ? err.msg : shoal_strerror(rc));
        fflush(stderr);
        ranks_abort(1);
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
    ranks_finish();
    return rc;
}

int engine_cmd_run(int argc, char **argv)
{
    run_opts o = { 0 };
    shoal_err err = { 0 };
    int rc;

    /* text prompts are cmd_prompt.c's */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--prompt") == 0 || strncmp(argv[i], "--prompt=", 9) == 0)
            return engine_cmd_prompt(argc, argv);
    rc = parse_args(argc, argv, &o);
    if (rc == 0 && cli_home("run", &o.c, &err) != 0)
        rc = 3;
    if (rc != 0) {
        free(o.tokens);
        return rc == 1 ? 0 : rc == 3 ? 1 : rc;
    }
    if (o.over_ranks)
        return run_over_ranks(&o, argc, argv);
    rc = run_model(&o, &err);
    free(o.tokens);
    if (rc != 0) {
        fprintf(stderr, "run: %s\n", err.msg[0] ? err.msg : shoal_strerror(rc));
        return 1;
    }
    return fflush(stdout) == 0 ? 0 : 1;
}
