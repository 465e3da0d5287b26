/* bench/engine — slice decode with every expert in the page cache.
 *
 * Model: the K3-dimension slice (tools/mkmodel --preset slice --experts 20:
 * 4 layers, three of them MoE, 17,547,264-byte experts, top-16), generated
 * once into $SHOAL_BENCH_SLICE (default /tmp/shoal-bench-slice-20) and read
 * through once so its shards sit in the page cache.
 *
 * Figures, each against a baseline measured in the same run:
 *   engine.moe_layer_time   one MoE layer of a decode step (router, latent
 *                           projections, 16 routed experts from the
 *                           mapping, shared experts) vs the kernel time
 *                           alone for the same 16 experts' bytes
 *                           (kernels_expert_apply on the mapped spans) + a
 *                           plain page-cache pread of those bytes.  Target
 *                           <= 1.3x.
 *   engine.decode_tokens_per_s  vs the rate if a token cost only its MoE
 *                           layers' baseline (kernel + read).
 *   engine.time_{spine,experts,attention,waiting}  shares of decode time.
 *   engine.rss_anon_peak    peak anonymous RSS (RssAnon: the mapped shards
 *                           are file-backed page cache, not the engine's
 *                           memory) vs spine + session state + one expert
 *                           span in flight.  Target <= 1.1x.
 * Rounds of (decode, baseline) are interleaved; the median round is kept.
 * SHOAL_BENCH_QUICK=1: fewer tokens and rounds.
 */
#include "bench/lib/bench.h"
#include "engine/forward/forward.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/path.h"
#include "common/platform.h"

#define THREADS 2
#define EXPERTS_PER_LAYER 16
#define MAX_ROUNDS 5

static uint64_t rss_anon(void)
{
    uint64_t rss, anon, peak;
    return shoal_proc_mem(0, &rss, &anon, &peak) == 0 ? anon : 0;
}

/* Read every file of dir once (page-cache warm-up). */
static void warm(const char *dir)
{
    static char buf[1 << 20];
    char path[4096];
    for (int i = 1; i <= 5; i++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-000005.safetensors", dir, i);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        while (read(fd, buf, sizeof buf) > 0)
            ;
        close(fd);
    }
}

static int ensure_model(const char *dir)
{
    char path[4096], cmd[8192];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, R_OK) == 0)
        return 0;
    snprintf(cmd, sizeof cmd, "bin/mkmodel --preset slice --experts 20 --out '%s' --force --quiet", dir);
    fprintf(stderr, "bench/engine: generating the slice in %s\n", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Baseline for one MoE layer: kernel time on 16 mapped experts + pread of
 * their bytes.  Returns seconds of each through *kern and *rd. */
static int baseline(const engine_model *m, kernels_pool *pool, kernels_expert_ws *ws,
                    const char *dir, uint8_t *buf, double *kern, double *rd)
{
    const k3_config *c = &m->cfg;
    size_t I = (size_t)c->moe_intermediate, L = (size_t)c->latent;
    const engine_moe_w *moe = &m->layers[1].moe;
    float *z = calloc(L, sizeof *z), *out = calloc(L, sizeof *out), one = 1.0f;
    char path[4096];
    int fd, rc = 0;

    for (size_t i = 0; i < L; i++)
        z[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    double t0 = bench_now();
    for (int e = 0; e < EXPERTS_PER_LAYER && rc == 0; e++) {
        kernels_expert ex;
        rc = kernels_expert_view(moe->span[e], I, L, &ex, NULL);
        if (rc == 0)
            rc = kernels_expert_apply(ws, pool, &ex, z, 1, &one, out, KERNELS_FAST, NULL);
    }
    *kern = bench_now() - t0;
    /* layer 1 lives in shard 2; its experts' file offsets are their
     * distance from the shard's mapping, which we do not see: read the
     * same number of bytes from the expert region instead (same shard,
     * page-cache resident). */
    snprintf(path, sizeof path, "%s/model-00002-of-000005.safetensors", dir);
    fd = open(path, O_RDONLY);
    if (fd < 0) {
        free(z);
        free(out);
        return -1;
    }
    struct stat sb;
    fstat(fd, &sb);
    off_t start = sb.st_size - (off_t)(c->n_experts * c->expert_bytes);
    t0 = bench_now();
    for (int e = 0; e < EXPERTS_PER_LAYER && rc == 0; e++)
        if (pread(fd, buf, c->expert_bytes, start + (off_t)e * (off_t)c->expert_bytes) !=
            (ssize_t)c->expert_bytes)
            rc = -1;
    *rd = bench_now() - t0;
    close(fd);
    free(z);
    free(out);
    return rc;
}

int main(void)
{
    const char *dir = getenv("SHOAL_BENCH_SLICE") ? getenv("SHOAL_BENCH_SLICE")
                                                  : "/tmp/shoal-bench-slice-20";
    int quick = getenv("SHOAL_BENCH_QUICK") != NULL;
    int rounds = quick ? 2 : MAX_ROUNDS, tokens = quick ? 3 : 6;
    engine_model_options mo;
    engine_model *m = NULL;
    expert_source *src = NULL;
    engine_session *s = NULL;
    kernels_pool *pool = kernels_pool_new(THREADS);
    kernels_expert_ws *ws = NULL;
    shoal_err err = { 0 };
    double moe_t[MAX_ROUNDS], base_t[MAX_ROUNDS], kern_t[MAX_ROUNDS], read_t[MAX_ROUNDS];
    double tok_t[MAX_ROUNDS], share[MAX_ROUNDS][4];
    uint64_t peak_anon = 0;
    uint8_t *buf = NULL;

    if (!pool || ensure_model(dir) != 0) {
        fprintf(stderr, "bench/engine: cannot prepare %s\n", dir);
        return 1;
    }
    warm(dir);
    engine_model_options_default(&mo);
    mo.pool = pool;
    if (engine_model_open(dir, &mo, &m, &err) != 0 || !(src = expert_source_local_new(m))) {
        fprintf(stderr, "bench/engine: %s\n", err.msg);
        return 1;
    }
    const k3_config *c = &m->cfg;
    engine_session_options so = { .experts = KERNELS_FAST, .chunk = 16, .pool = pool, .src = src };
    ws = kernels_expert_ws_new((size_t)c->moe_intermediate, (size_t)c->latent, 1,
                               (float)c->situ_beta, (float)c->situ_linear_beta);
    buf = malloc(c->expert_bytes);
    float *logits = malloc((size_t)c->vocab * sizeof *logits);
    int32_t prompt[8] = { 17, 230, 5, 600, 41, 9, 300, 77 }, tok;
    if (!ws || !buf || !logits || engine_session_new(m, &so, &s, &err) != 0 ||
        engine_session_run(s, prompt, 8, logits, &err) != 0) {
        fprintf(stderr, "bench/engine: %s\n", err.msg);
        return 1;
    }
    tok = 0;
    for (int r = 0; r < rounds; r++) {
        engine_session_stats a, b;
        engine_session_stats_get(s, &a);
        double t0 = bench_now();
        for (int i = 0; i < tokens; i++) {
            for (int32_t v = 1; v < c->vocab; v++)
                if (logits[v] > logits[tok])
                    tok = v;
            if (engine_session_run(s, &tok, 1, logits, &err) != 0) {
                fprintf(stderr, "bench/engine: %s\n", err.msg);
                return 1;
            }
            uint64_t an = rss_anon();
            peak_anon = an > peak_anon ? an : peak_anon;
        }
        double dt = bench_now() - t0;
        engine_session_stats_get(s, &b);
        moe_t[r] = (double)(b.moe_ns - a.moe_ns) / 1e9 / (double)(b.moe_calls - a.moe_calls);
        tok_t[r] = dt / tokens;
        double tot = (double)(b.total_ns - a.total_ns);
        share[r][0] = (double)(b.spine_ns - a.spine_ns) / tot;
        share[r][1] = (double)(b.expert_ns - a.expert_ns) / tot;
        share[r][2] = (double)(b.attn_ns - a.attn_ns) / tot;
        share[r][3] = (double)(b.wait_ns - a.wait_ns) / tot;
        if (baseline(m, pool, ws, dir, buf, &kern_t[r], &read_t[r]) != 0) {
            fprintf(stderr, "bench/engine: baseline failed\n");
            return 1;
        }
        base_t[r] = kern_t[r] + read_t[r];
        fprintf(stderr, "round %d: MoE layer %.2f ms vs kernel %.2f + read %.2f ms; %.1f ms/token\n",
                r, moe_t[r] * 1e3, kern_t[r] * 1e3, read_t[r] * 1e3, tok_t[r] * 1e3);
    }
    /* median round by the MoE-layer ratio */
    double ratios[MAX_ROUNDS], sorted[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        sorted[r] = ratios[r] = moe_t[r] / base_t[r];
    qsort(sorted, (size_t)rounds, sizeof *sorted, cmp_double);
    int med = 0;
    for (int r = 0; r < rounds; r++)
        if (ratios[r] == sorted[rounds / 2])
            med = r;
    bench_record("engine.moe_layer_time", moe_t[med] * 1e3, "ms",
                 "kernel time + page-cache read of the same 16 experts", base_t[med] * 1e3,
                 "lower", 1.3);
    int n_moe = (int)c->n_moe_layers;
    bench_record("engine.decode_tokens_per_s", 1.0 / tok_t[med], "tokens/s",
                 "expert-bound rate (MoE layers at kernel + read time only)",
                 1.0 / (n_moe * base_t[med]), "higher", 0);
    static const char *parts[4] = { "spine", "experts", "attention", "waiting" };
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof name, "engine.time_%s", parts[i]);
        bench_record(name, share[med][i] * tok_t[med] * 1e3, "ms/token", "decode time per token",
                     tok_t[med] * 1e3, "lower", 0);
    }
    uint64_t budget = m->spine_bytes + engine_session_bytes(s) + c->expert_bytes;
    bench_record("engine.rss_anon_peak", (double)peak_anon / 1048576.0, "MiB",
                 "spine + session state + one expert in flight", (double)budget / 1048576.0,
                 "lower", 1.1);
    free(logits);
    free(buf);
    kernels_expert_ws_free(ws);
    engine_session_free(s);
    expert_source_free(src);
    engine_model_free(m);
    kernels_pool_free(pool);
    return 0;
}
