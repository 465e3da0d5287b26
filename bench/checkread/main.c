/* bench/checkread — what the engine's checked reads cost (docs/engine.md
 * "Checked reads"): K3-sized experts (3·I·L·17/32 = 17.5 MB) read in 1 MiB
 * parts by READERS threads, as the shoald expert source's readers do,
 * without and with each part hashed into the object's XXH3-128
 * (checked_read.c), and the hashes checked.  The file is in the page
 * cache, so the reads run at memory speed: the worst case for the check
 * (against a disk's 1-3 GB/s it is a smaller share).  Figures:
 *   checkread.ratio       time with the check / without (lower is better;
 *                         target 1.4 at page-cache speed: 1.25 measured on
 *                         this 2-core VM, 3.8 against 3.1 GB/s), rounds
 *                         alternating, median pair
 *   checkread.xxh3_gbps   XXH3-128 on one core, against a STREAM read
 *   checkread.spine_*     the spine pack's load and its streamed layers,
 *                         checked against unchecked (spine.c)
 * The ISA is named in the figure's baseline: the best one the CPU has
 * (kernels_init) and the XXH3 variant common/xxh3.c picked (avx512,
 * avx2 or baseline: 14.8, 9.4 and 5.5 GB/s on one core of a 2-core
 * AVX-512 VM; libxxhash's shared library is the baseline).  SHOAL_BENCH_QUICK=1: fewer,
 * smaller rounds.
 */
#include "bench/lib/bench.h"
#include "engine/kernels/kernels.h"
#include "engine/source/source.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include "common/xxh3.h"

#define SPAN ((size_t)3 * 3072 * 3584 * 17 / 32)
#define PART ((size_t)1 << 20)
#define READERS 4

void bench_spine(int quick, int rounds);

typedef struct job {
    int fd;
    size_t nobj, nparts;
    uint8_t *buf;                 /* nobj * SPAN */
    checked_read **chk;           /* NULL: unchecked */
    atomic_size_t next;
} job;

static void *reader(void *arg)
{
    job *j = arg;
    for (;;) {
        size_t k = atomic_fetch_add(&j->next, 1);
        if (k >= j->nobj * j->nparts)
            return NULL;
        size_t o = k / j->nparts, p = k % j->nparts;
        size_t off = p * PART, n = SPAN - off < PART ? SPAN - off : PART;
        uint8_t *dst = j->buf + o * SPAN + off;
        size_t got = 0;
        while (got < n) {
            ssize_t r = pread(j->fd, dst + got, n - got, (off_t)(o * SPAN + off + got));
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (j->chk)
            checked_read_part(j->chk[o], (uint32_t)p, dst, n);
    }
}

static double run_once(job *j, const uint8_t (*want)[16], int checked)
{
    pthread_t th[READERS];
    double t0;
    j->chk = NULL;
    if (checked) {
        j->chk = calloc(j->nobj, sizeof *j->chk);
        for (size_t o = 0; o < j->nobj; o++)
            j->chk[o] = checked_read_new(want[o], (uint32_t)j->nparts);
    }
    atomic_store(&j->next, 0);
    t0 = bench_now();
    for (int i = 0; i < READERS; i++)
        pthread_create(&th[i], NULL, reader, j);
    for (int i = 0; i < READERS; i++)
        pthread_join(th[i], NULL);
    t0 = bench_now() - t0;
    if (checked) {
        for (size_t o = 0; o < j->nobj; o++) {
            if (checked_read_result(j->chk[o]) != 1) {
                fprintf(stderr, "checkread: object %zu does not match its hash\n", o);
                exit(1);
            }
            checked_read_free(j->chk[o]);
        }
        free(j->chk);
        j->chk = NULL;
    }
    return t0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    int quick = getenv("SHOAL_BENCH_QUICK") != NULL;
    size_t nobj = quick ? 2 : 8;
    int rounds = quick ? 3 : 7;
    char path[] = "/tmp/shoal-checkread.XXXXXX";
    int fd = mkstemp(path);
    uint8_t *buf = malloc(nobj * SPAN);
    uint8_t (*want)[16] = calloc(nobj, 16);
    double ratio[16], with[16], without[16];
    char isa[128];
    job j;

    if (fd < 0 || !buf || !want) {
        perror("checkread");
        return 1;
    }
    unlink(path);
    for (size_t i = 0; i < nobj * SPAN; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t o = 0; o < nobj; o++) {
        XXH128_canonical_t can;
        shoal_xxh3_once(buf + o * SPAN, SPAN, can.digest);
        memcpy(want[o], can.digest, 16);
    }
    if (write(fd, buf, nobj * SPAN) != (ssize_t)(nobj * SPAN)) {
        perror("checkread: write");
        return 1;
    }
    memset(&j, 0, sizeof j);
    j.fd = fd;
    j.nobj = nobj;
    j.nparts = (SPAN + PART - 1) / PART;
    j.buf = buf;
    run_once(&j, (const uint8_t (*)[16])want, 0);   /* warm the page cache */
    for (int r = 0; r < rounds; r++) {
        /* alternate which goes first, so drift does not favour one */
        if (r % 2) {
            with[r] = run_once(&j, (const uint8_t (*)[16])want, 1);
            without[r] = run_once(&j, (const uint8_t (*)[16])want, 0);
        } else {
            without[r] = run_once(&j, (const uint8_t (*)[16])want, 0);
            with[r] = run_once(&j, (const uint8_t (*)[16])want, 1);
        }
        ratio[r] = with[r] / without[r];
    }
    double sorted[16];
    memcpy(sorted, ratio, sizeof sorted);
    qsort(sorted, (size_t)rounds, sizeof *sorted, cmp_d);
    int med = 0;
    for (int r = 0; r < rounds; r++)
        if (ratio[r] == sorted[rounds / 2])
            med = r;
    snprintf(isa, sizeof isa, "reads without the check (%d readers, 1 MiB parts, page cache; "
             "XXH3 %s, CPU %s)", READERS, shoal_xxh3_isa(), kernels_isa_name(kernels_init()));
    printf("checked read: %.3f s with, %.3f s without (%.2f GB/s vs %.2f GB/s): x%.3f\n",
           with[med], without[med], (double)(nobj * SPAN) / with[med] / 1e9,
           (double)(nobj * SPAN) / without[med] / 1e9, ratio[med]);
    bench_record("checkread.ratio", with[med], "s", isa, without[med], "lower", 1.4);

    /* XXH3-128 on one core against a STREAM read of the same bytes */
    double best = 1e9;
    volatile uint64_t sink = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = bench_now();
        uint8_t h[16];
        shoal_xxh3_once(buf, nobj * SPAN, h);
        t0 = bench_now() - t0;
        sink ^= h[0];
        if (t0 < best)
            best = t0;
    }
    (void)sink;
    double gbps = (double)(nobj * SPAN) / best / 1e9;
    double stream = bench_stream_read_gbps(nobj * SPAN, 1, rounds);
    printf("XXH3-128 (%s): %.2f GB/s on one core; STREAM read %.2f GB/s\n", shoal_xxh3_isa(),
           gbps, stream);
    snprintf(isa, sizeof isa, "STREAM read, 1 thread; XXH3 %s", shoal_xxh3_isa());
    bench_record("checkread.xxh3_gbps", gbps, "GB/s", isa, stream, "higher", 0);
    close(fd);
    free(buf);
    free(want);
    bench_spine(quick, rounds);
    return 0;
}
