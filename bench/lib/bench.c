/* bench.c — shared benchmark helpers (see bench.h). */
#include "bench/lib/bench.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double bench_cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

uint64_t bench_peak_rss(int who)
{
    struct rusage ru;
    getrusage(who ? RUSAGE_CHILDREN : RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_maxrss * 1024u;
}

struct stream_part {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

static void *stream_sum(void *arg)
{
    struct stream_part *sp = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i;
    for (i = 0; i + 4 <= sp->n; i += 4) {
        s0 += sp->p[i];
        s1 += sp->p[i + 1];
        s2 += sp->p[i + 2];
        s3 += sp->p[i + 3];
    }
    for (; i < sp->n; i++)
        s0 += sp->p[i];
    sp->sum = s0 + s1 + s2 + s3;
    return NULL;
}

double bench_stream_read_gbps(size_t bytes, int threads, int reps)
{
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *buf = malloc(n * sizeof *buf);
    double best = 0;
    volatile uint64_t sink = 0;

    if (!buf || threads < 1 || threads > 64)
        return free(buf), 0;
    for (size_t i = 0; i < n; i++)
        buf[i] = i * 0x9E3779B97F4A7C15ull;
    for (int r = 0; r < reps; r++) {
        pthread_t th[64];
        struct stream_part parts[64];
        double t0 = bench_now(), dt;
        for (int t = 0; t < threads; t++) {
            size_t a = n * (size_t)t / (size_t)threads, b = n * (size_t)(t + 1) / (size_t)threads;
            parts[t] = (struct stream_part){ buf + a, b - a, 0 };
            if (t > 0)
                pthread_create(&th[t], NULL, stream_sum, &parts[t]);
        }
        stream_sum(&parts[0]);
        for (int t = 1; t < threads; t++)
            pthread_join(th[t], NULL);
        dt = bench_now() - t0;
        for (int t = 0; t < threads; t++)
            sink += parts[t].sum;
        if (dt > 0 && (double)(n * sizeof *buf) / dt / 1e9 > best)
            best = (double)(n * sizeof *buf) / dt / 1e9;
    }
    (void)sink;
    free(buf);
    return best;
}

void bench_record(const char *name, double value, const char *unit,
                  const char *baseline, double baseline_value,
                  const char *better, double target)
{
    const char *path = getenv("SHOAL_BENCH_OUT");
    double ratio = baseline_value > 0 ? value / baseline_value : 0;
    int has_ratio = baseline_value > 0;
    const char *verdict = "";
    FILE *f;

    if (has_ratio && target > 0) {
        int ok = strcmp(better, "lower") == 0 ? ratio <= target : ratio >= target;
        verdict = ok ? "  ok" : "  BELOW TARGET";
    }
    if (has_ratio) {
        char tgt[48] = "";
        if (target > 0)
            snprintf(tgt, sizeof tgt, " (target %s %.2f)", strcmp(better, "lower") == 0 ? "<=" : ">=",
                     target);
        printf("%-40s %12.4g %-6s vs %s %.4g %s  ratio %.3f%s%s\n", name, value, unit, baseline,
               baseline_value, unit, ratio, tgt, verdict);
    } else {
        printf("%-40s %12.4g %s%s%s\n", name, value, unit, baseline && baseline[0] ? "  " : "",
               baseline ? baseline : "");
    }
    fflush(stdout);

    if (!path || !path[0])
        path = "bench/out/results.jsonl";
    f = fopen(path, "a");
    if (!f) {
        mkdir("bench/out", 0755);
        f = fopen(path, "a");
    }
    if (!f)
        return;
    {
        char ratio_s[32] = "null", target_s[32] = "null";
        if (has_ratio)
            snprintf(ratio_s, sizeof ratio_s, "%.6g", ratio);
        if (target > 0)
            snprintf(target_s, sizeof target_s, "%.6g", target);
        fprintf(f, "{\"name\":\"%s\",\"value\":%.9g,\"unit\":\"%s\",\"baseline\":\"%s\","
                   "\"baseline_value\":%.9g,\"ratio\":%s,\"better\":\"%s\",\"target\":%s}\n",
                name, value, unit, baseline ? baseline : "", baseline_value, ratio_s, better,
                target_s);
    }
    fclose(f);
}
