/* bench/checkread/spine.c — what checking the spine costs (docs/engine.md
 * "Checked reads"), next to the experts' figure in main.c:
 *   checkread.spine_load_ratio    a spine pack read into memory as the load
 *                                 reads it (spine_resident.c: 8 MiB parts,
 *                                 READERS threads, O_DIRECT where the file
 *                                 system takes it) hashed against its
 *                                 XXH3-128 as it is read / the same read
 *                                 unchecked (lower is better)
 *   checkread.spine_stream_ratio  streamed layers read pass after pass as
 *                                 spine_stream.c reads them in place (one
 *                                 reader, O_DIRECT, 4 MiB parts with a hasher
 *                                 thread a part behind, the layer's hash
 *                                 compared at its end) / the same reads
 *                                 unchecked (lower is better; no compute
 *                                 hides the reads: the worst case).  The
 *                                 stream is private to engine/forward/, so
 *                                 its read-and-hash loop is restated here;
 *                                 tests/unit/forward/test_spine_stream_check.c
 *                                 tests the real one.
 * Rounds alternate which goes first; the median pair is reported.  The
 * ISA (libxxhash's own vector code, and the CPU's) is named in the
 * baselines.
 */
#include "bench/lib/bench.h"
#include "common/platform.h"
#include "engine/kernels/kernels.h"
#include "engine/source/source.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include "common/xxh3.h"

#define READERS 4
#define LAYERS 4

void bench_spine(int quick, int rounds);

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median pair of rounds (index). */
static int median(const double *ratio, int rounds)
{
    double s[16];
    int med = 0;
    memcpy(s, ratio, (size_t)rounds * sizeof *s);
    qsort(s, (size_t)rounds, sizeof *s, cmp_d);
    for (int r = 0; r < rounds; r++)
        if (ratio[r] == s[rounds / 2])
            med = r;
    return med;
}

static double load_once(int fd, uint64_t len, const uint8_t want[16], int *direct)
{
    spine_resident r;
    shoal_err e = { 0 };
    double t0 = bench_now();
    if (spine_resident_read(fd, 0, len, SPINE_LOAD_READ, READERS, want, &r, &e) != 0) {
        fprintf(stderr, "checkread: %s\n", e.msg);
        exit(1);
    }
    t0 = bench_now() - t0;
    if (want && spine_resident_check(&r) != 1) {
        fprintf(stderr, "checkread: the pack does not match its hash\n");
        exit(1);
    }
    *direct = r.direct;
    spine_resident_free(&r);
    return t0;
}

#define HASH_PART ((size_t)4 << 20)

/* spine_stream.c's checked read: the reader hands each part to a hasher
 * thread that follows it; the verdict waits for the last part's hash. */
typedef struct hasher {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    XXH3_state_t *st;
    const uint8_t *base;
    size_t avail, done;
    int quit;
    uint64_t ns;
} hasher;

static void *hasher_main(void *arg)
{
    hasher *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->quit && h->done >= h->avail)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->quit)
            break;
        size_t a = h->done, b = h->avail;
        pthread_mutex_unlock(&h->mu);
        double t0 = bench_now();
        shoal_xxh3_update(h->st, h->base + a, b - a);
        t0 = bench_now() - t0;
        pthread_mutex_lock(&h->mu);
        h->ns += (uint64_t)(t0 * 1e9);
        h->done = b;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void layer_read(int rfd, uint8_t *dst, uint64_t off, size_t len, hasher *h,
                       const uint8_t want[16])
{
    size_t got = 0;
    if (h) {
        pthread_mutex_lock(&h->mu);
        shoal_xxh3_reset(h->st);
        h->base = dst;
        h->avail = h->done = 0;
        pthread_mutex_unlock(&h->mu);
    }
    while (got < len) {
        size_t n = len - got < HASH_PART ? len - got : HASH_PART;
        ssize_t r = pread(rfd, dst + got, h ? n : len - got, (off_t)(off + got));
        if (r <= 0) {
            perror("checkread: layer read");
            exit(1);
        }
        got += (size_t)r;
        if (h) {
            pthread_mutex_lock(&h->mu);
            h->avail = got;
            pthread_cond_broadcast(&h->cv);
            pthread_mutex_unlock(&h->mu);
        }
    }
    if (h) {
        XXH128_canonical_t c;
        pthread_mutex_lock(&h->mu);
        while (h->done < h->avail)
            pthread_cond_wait(&h->cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
        shoal_xxh3_digest(h->st, c.digest);
        if (memcmp(c.digest, want, 16) != 0) {
            fprintf(stderr, "checkread: a streamed layer does not match its hash\n");
            exit(1);
        }
    }
}

/* passes over LAYERS streamed layers of `layer` bytes each (layer 0 is
 * the resident part), read into one buffer */
static double stream_once(int rfd, uint8_t *dst, size_t layer, const uint8_t (*xxh)[16],
                          int passes, uint64_t *check_ns)
{
    hasher h = { .st = shoal_xxh3_new() };
    pthread_t th;
    double t0;

    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    if (xxh && pthread_create(&th, NULL, hasher_main, &h) != 0)
        exit(1);
    t0 = bench_now();
    for (int p = 0; p < passes; p++)
        for (int l = 1; l <= LAYERS; l++)
            layer_read(rfd, dst, (uint64_t)l * layer, layer, xxh ? &h : NULL, xxh ? xxh[l] : NULL);
    t0 = bench_now() - t0;
    if (xxh) {
        pthread_mutex_lock(&h.mu);
        h.quit = 1;
        pthread_cond_broadcast(&h.cv);
        pthread_mutex_unlock(&h.mu);
        pthread_join(th, NULL);
    }
    *check_ns = h.ns;
    shoal_xxh3_free(h.st);
    pthread_mutex_destroy(&h.mu);
    pthread_cond_destroy(&h.cv);
    return t0;
}

void bench_spine(int quick, int rounds)
{
    size_t layer = quick ? ((size_t)16 << 20) : ((size_t)64 << 20);
    uint64_t len = (uint64_t)(LAYERS + 1) * layer;
    char path[] = "/var/tmp/shoal-checkread-spine.XXXXXX", base[192];
    int fd = mkstemp(path), direct = 0, passes = quick ? 2 : 4;
    uint8_t *buf = NULL, want[16], xxh[LAYERS + 1][16];
    double with[16], without[16], ratio[16];
    uint64_t cns = 0, cns_sum = 0;
    int med;

    if (fd < 0 || posix_memalign((void **)&buf, 1 << 21, (size_t)len) != 0) {
        perror("checkread: spine");
        exit(1);
    }
    unlink(path);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 11);
    XXH128_canonical_t can;
    shoal_xxh3_once(buf, (size_t)len, can.digest);
    memcpy(want, can.digest, 16);
    for (int l = 1; l <= LAYERS; l++) {
        shoal_xxh3_once(buf + (size_t)l * layer, layer, can.digest);
        memcpy(xxh[l], can.digest, 16);
    }
    if (write(fd, buf, (size_t)len) != (ssize_t)len) {
        perror("checkread: spine write");
        exit(1);
    }

    load_once(fd, len, NULL, &direct);
    int rfd = shoal_fd_open_uncached(fd), sdirect = rfd >= 0;
    if (rfd < 0)
        rfd = fd;
    for (int r = 0; r < rounds; r++) {
        if (r % 2) {
            with[r] = load_once(fd, len, want, &direct);
            without[r] = load_once(fd, len, NULL, &direct);
        } else {
            without[r] = load_once(fd, len, NULL, &direct);
            with[r] = load_once(fd, len, want, &direct);
        }
        ratio[r] = with[r] / without[r];
    }
    med = median(ratio, rounds);
    snprintf(base, sizeof base, "the pack's read unchecked (%d readers, 8 MiB parts, %s; "
             "XXH3 %s, CPU %s)", READERS, direct ? "O_DIRECT" : "buffered",
             shoal_xxh3_isa(), kernels_isa_name(kernels_init()));
    printf("spine pack load: %.3f s checked, %.3f s unchecked (%.2f vs %.2f GB/s): x%.3f\n",
           with[med], without[med], (double)len / with[med] / 1e9,
           (double)len / without[med] / 1e9, ratio[med]);
    bench_record("checkread.spine_load_ratio", with[med], "s", base, without[med], "lower", 0);

    for (int r = 0; r < rounds; r++) {
        if (r % 2) {
            with[r] = stream_once(rfd, buf, layer, (const uint8_t (*)[16])xxh, passes, &cns);
            cns_sum += cns;
            without[r] = stream_once(rfd, buf, layer, NULL, passes, &cns);
        } else {
            without[r] = stream_once(rfd, buf, layer, NULL, passes, &cns);
            with[r] = stream_once(rfd, buf, layer, (const uint8_t (*)[16])xxh, passes, &cns);
            cns_sum += cns;
        }
        ratio[r] = with[r] / without[r];
    }
    med = median(ratio, rounds);
    double per_layer_ms = (double)cns_sum / 1e6 / rounds / (passes * LAYERS);
    snprintf(base, sizeof base, "streamed layers read unchecked (%zu MiB layers, one reader, "
             "%s; XXH3 %s, CPU %s)", layer >> 20, sdirect ? "O_DIRECT" : "buffered",
             shoal_xxh3_isa(), kernels_isa_name(kernels_init()));
    printf("streamed layer: %.3f s checked, %.3f s unchecked for %d passes of %d layers: x%.3f "
           "(hash %.2f ms a %zu MiB layer, %.1f GB/s)\n", with[med], without[med], passes, LAYERS,
           ratio[med], per_layer_ms, layer >> 20, (double)layer / (per_layer_ms / 1e3) / 1e9);
    bench_record("checkread.spine_stream_ratio", with[med], "s", base, without[med], "lower", 0);
    if (rfd != fd)
        close(rfd);
    close(fd);
    free(buf);
}
