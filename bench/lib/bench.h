/* bench.h — what every benchmark program shares: timing, the in-run
 * baselines (STREAM-style read, raw pread, write+fsync), and recording a
 * figure as a ratio to its baseline.
 *
 * Each figure is printed as one human line and appended as one JSON object
 * to $SHOAL_BENCH_OUT (default bench/out/results.jsonl); scripts/bench.sh
 * gathers the lines into bench/out/results.json, a list of objects with
 * name, value, unit, baseline, baseline_value, ratio, better, target.
 */
#ifndef SHOAL_BENCH_H
#define SHOAL_BENCH_H

#include <stddef.h>
#include <stdint.h>

/* Seconds on the monotonic clock. */
double bench_now(void);

/* CPU seconds (user + system) used by this process so far. */
double bench_cpu_seconds(void);

/* STREAM-style read bandwidth in GB/s (1e9 bytes/s): sums a buffer of
 * `bytes` (allocated, touched once, then read `reps` times) on `threads`
 * threads and returns the best repetition. */
double bench_stream_read_gbps(size_t bytes, int threads, int reps);

/* Record one figure.
 *   name            "cache.lookup_rate"
 *   value, unit     the measured figure and its unit ("ops/s", "GB/s", "s")
 *   baseline        what it is compared with ("sqlite point lookup")
 *   baseline_value  the baseline measured in the same run (same unit), or 0
 *                   when the figure is reported without a ratio
 *   better          "higher" or "lower"
 *   target          the ratio an issue asks for, or 0 when none
 * Prints e.g. "cache.lookup_rate  512000 ops/s  vs sqlite point lookup
 * 640000 ops/s  ratio 0.80 (target >= 0.70) ok". */
void bench_record(const char *name, double value, const char *unit,
                  const char *baseline, double baseline_value,
                  const char *better, double target);

/* Peak resident set size of this process (or of children, who = 1) in bytes. */
uint64_t bench_peak_rss(int who);

#endif
