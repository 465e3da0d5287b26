/* main.c — shoald benchmarks, each figure a ratio to a baseline measured
 * in the same run (docs/daemon.md "Figures").
 *
 * Sets up, under a temporary directory: a k3-slice model (real 17,547,264-
 * byte experts; bin/mkmodel), hubmock serving it, and shoald on a fresh
 * home.  Then:
 *   1. daemon.warm_rss_growth: shoald's peak RSS growth while warming 200
 *      slice experts with 8 parallel transfers, against what buffering
 *      whole objects would cost (8 x 17.5 MB).  The bound we state is
 *      64 MiB, ratio 0.46: the target.
 *   2. daemon.hit_path: a cached expert reaching usable memory in a client
 *      (GET + descriptor + shoal_item_map + touch every page) against a raw pread +
 *      touch of the same blob with the page cache warm.  Target <= 1.2.
 *   3. daemon.batch16_rtt: a GET of 16 cached experts, the round trip
 *      until the 16 descriptors are in (nothing mapped), against reading
 *      the 16 experts' bytes (pread + touch): the overhead beyond the data.
 * Everything is stopped and removed at the end.  Run from the repo root
 * (BIN selects the binaries, default bin/).
 */
#include "bench/lib/bench.h"
#include "common/client.h"
#include "common/manifest.h"
#include "common/platform.h"
#include "common/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_WARM   200
#define REPS     15

static char tmp[256], bin[256];
static pid_t hub_pid = -1, daemon_pid = -1;

/* Start argv with stdout on a pipe; return the read end, or -1. */
static int spawn(char *const argv[], pid_t *pid)
{
    int p[2];
    if (pipe(p) != 0)
        return -1;
    *pid = fork();
    if (*pid < 0)
        return -1;
    if (*pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(p[1], 1);
        if (null >= 0)
            dup2(null, 2);
        close(p[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    return p[0];
}

static int read_line(int fd, char *out, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        char ch;
        ssize_t r = read(fd, &ch, 1);
        if (r <= 0)
            return -1;
        if (ch == '\n')
            break;
        out[n++] = ch;
    }
    out[n] = '\0';
    return 0;
}

static int run(char *const argv[])
{
    pid_t pid;
    int st, fd = spawn(argv, &pid);
    char buf[256];
    if (fd < 0)
        return -1;
    while (read(fd, buf, sizeof buf) > 0)
        ;
    close(fd);
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static uint64_t proc_kb(pid_t pid, const char *field)
{
    uint64_t rss, anon, peak;
    if (shoal_proc_mem(pid, &rss, &anon, &peak) != 0)
        return 0;
    return (strcmp(field, "VmHWM:") == 0 ? peak : rss) / 1024;
}

static void stop(pid_t *pid)
{
    if (*pid > 0) {
        kill(*pid, SIGTERM);
        waitpid(*pid, NULL, 0);
        *pid = -1;
    }
}

static void cleanup(void)
{
    char *argv[] = { "/bin/rm", "-rf", tmp, NULL };
    stop(&daemon_pid);
    stop(&hub_pid);
    if (tmp[0])
        run(argv);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static uint64_t touch(const uint8_t *p, uint64_t n)
{
    uint64_t s = 0;
    for (uint64_t i = 0; i < n; i += 4096)
        s += p[i];
    return s + p[n - 1];
}

/* GET keys and collect the items (descriptors owned by the caller). */
static int get_items(shoal_client *c, uint32_t h, const shoal_key *keys, size_t n,
                     shoal_item *items, shoal_err *err)
{
    uint64_t req;
    int rc = shoal_client_get_send(c, h, 0, keys, n, &req, err);
    for (size_t got = 0; rc == 0 && got < n; got++) {
        shoal_item it;
        rc = shoal_client_next(c, 60000, &it, err);
        if (rc == 0 && it.status != 0)
            rc = it.status;
        if (rc == 0)
            items[it.index] = it;
    }
    return rc;
}

static int setup(shoal_client **c, shoal_model_info *mi, manifest **man, shoal_err *err)
{
    char model[300], hubdir[300], home[300], line[512], endpoint[128], repo[400];
    shoal_client_opts co = { 0 };
    uint8_t *enc;
    int fd, rc;

    snprintf(model, sizeof model, "%s/slice", tmp);
    snprintf(home, sizeof home, "%s/home", tmp);
    {
        char mk[300];
        char *argv[] = { mk, "--preset", "slice", "--layers", "8", "--experts", "32", "--out",
                         model, "--quiet", NULL };
        snprintf(mk, sizeof mk, "%s/mkmodel", bin);
        if (run(argv) != 0)
            return shoal_err_set(err, SHOAL_EIO, "mkmodel failed (is %s built?)", mk);
    }
    {
        char hm[300];
        char *argv[] = { hm, "--repo", repo, "--port", "0", "--cdn-port", "0", NULL };
        snprintf(hm, sizeof hm, "%s/hubmock", bin);
        snprintf(repo, sizeof repo, "bench/slice=%s", model);
        fd = spawn(argv, &hub_pid);
        if (fd < 0 || read_line(fd, line, sizeof line) != 0 ||
            sscanf(line, "hub %127s", endpoint) != 1)
            return shoal_err_set(err, SHOAL_EIO, "hubmock did not start");
        close(fd);
    }
    {
        char sd[300];
        char *argv[] = { sd, "--home", home, "--parallel", "8", "--no-fsync", "--log-level",
                         "warn", NULL };
        snprintf(sd, sizeof sd, "%s/shoald", bin);
        setenv("HF_ENDPOINT", endpoint, 1);
        fd = spawn(argv, &daemon_pid);
        if (fd < 0 || read_line(fd, line, sizeof line) != 0 || strncmp(line, "shoald ready", 12))
            return shoal_err_set(err, SHOAL_EIO, "shoald did not start");
        close(fd);
        (void)hubdir;
    }
    co.home = home;
    co.name = "bench-daemon";
    rc = shoal_client_connect(&co, c, err);
    rc = rc ? rc : shoal_client_open(*c, "hf://bench/slice", mi, err);
    if (rc)
        return rc;
    enc = malloc(mi->manifest_len);
    rc = enc ? shoal_pread_all(mi->manifest_fd, enc, mi->manifest_len, 0) : SHOAL_ENOMEM;
    rc = rc ? rc : manifest_decode(enc, mi->manifest_len, man, err);
    free(enc);
    close(mi->manifest_fd);
    if (rc == 0 && (*man)->nexperts < N_WARM)
        rc = shoal_err_set(err, SHOAL_EINVAL, "the slice has %zu experts", (*man)->nexperts);
    return rc;
}

static int bench_warm(shoal_client *c, uint32_t h, const manifest *man, shoal_key *keys,
                      shoal_err *err)
{
    uint64_t job, idle_kb, peak_kb;
    shoal_job_status st;
    double t0, t1;
    int rc;

    for (size_t i = 0; i < N_WARM; i++)
        keys[i] = (shoal_key){ SHOAL_KEY_EXPERT, (uint16_t)man->experts[i].layer,
                               man->experts[i].id, NULL, 0 };
    idle_kb = proc_kb(daemon_pid, "VmRSS:");
    t0 = bench_now();
    rc = shoal_client_warm_keys(c, h, keys, N_WARM, &job, err);
    do {
        usleep(20000);
        rc = rc ? rc : shoal_client_job(c, job, &st, err);
    } while (rc == 0 && st.state < 2);
    t1 = bench_now();
    if (rc == 0 && (st.state != 2 || st.errors))
        rc = shoal_err_set(err, SHOAL_EIO, "warm job: state %u, %u errors: %s", st.state,
                           st.errors, st.last_error);
    if (rc)
        return rc;
    peak_kb = proc_kb(daemon_pid, "VmHWM:");
    printf("warmed %u experts (%.2f GB) in %.2f s: %.2f GB/s; shoald RSS %llu MiB idle, "
           "peak %llu MiB\n", st.objects_done, st.bytes_done / 1e9, t1 - t0,
           st.bytes_done / 1e9 / (t1 - t0), (unsigned long long)idle_kb / 1024,
           (unsigned long long)peak_kb / 1024);
    bench_record("daemon.warm_rss_growth", (double)(peak_kb - idle_kb) * 1024 / 1e6, "MB",
                 "8 whole experts buffered", 8.0 * man->expert_bytes / 1e6, "lower", 0.46);
    return 0;
}

static int bench_hit(shoal_client *c, uint32_t h, const shoal_key *keys, shoal_err *err)
{
    double t_get[REPS], t_raw[REPS];
    shoal_item it[1];
    uint8_t *buf = NULL;
    uint64_t sink = 0;
    int rc;

    for (int r = 0; r < REPS; r++) {
        double t0 = bench_now();
        shoal_view v;
        rc = get_items(c, h, &keys[r % 8], 1, it, err);
        rc = rc ? rc : shoal_item_map(&it[0], 1, &v, err);
        if (rc)
            return rc;
        sink += touch(v.data, v.length);
        t_get[r] = bench_now() - t0;
        munmap(v.base, v.maplen);   /* keep the descriptor for the baseline */
        if (!buf && !(buf = malloc(it[0].length)))
            return SHOAL_ENOMEM;
        memset(buf, 1, it[0].length);
        t0 = bench_now();
        rc = shoal_pread_all(it[0].fd, buf, it[0].length, (off_t)it[0].offset);
        sink += touch(buf, it[0].length);
        t_raw[r] = bench_now() - t0;
        close(it[0].fd);
        if (rc)
            return rc;
    }
    free(buf);
    printf("(checksum %llu)\n", (unsigned long long)sink);
    bench_record("daemon.hit_path", median(t_get, REPS) * 1e3, "ms",
                 "raw pread + touch, page cache warm", median(t_raw, REPS) * 1e3, "lower", 1.2);
    return 0;
}

static int bench_batch(shoal_client *c, uint32_t h, const shoal_key *keys, uint64_t len,
                       shoal_err *err)
{
    double t_rtt[REPS], t_data[REPS];
    shoal_item it[16];
    uint8_t *buf = malloc(len);
    uint64_t sink = 0;
    int rc = buf ? 0 : SHOAL_ENOMEM;

    if (buf)
        memset(buf, 1, len);
    for (int r = 0; rc == 0 && r < REPS; r++) {
        double t0 = bench_now();
        rc = get_items(c, h, keys + 16 * (r % 4), 16, it, err);
        t_rtt[r] = bench_now() - t0;
        t0 = bench_now();
        for (int i = 0; rc == 0 && i < 16; i++) {
            rc = shoal_pread_all(it[i].fd, buf, it[i].length, (off_t)it[i].offset);
            sink += touch(buf, it[i].length);
        }
        t_data[r] = bench_now() - t0;
        for (int i = 0; i < 16; i++)
            close(it[i].fd);
    }
    free(buf);
    if (rc)
        return rc;
    printf("(checksum %llu)\n", (unsigned long long)sink);
    bench_record("daemon.batch16_rtt", median(t_rtt, REPS) * 1e6, "us",
                 "pread + touch of the 16 experts", median(t_data, REPS) * 1e6, "lower", 0);
    return 0;
}

int main(void)
{
    const char *b = getenv("BIN"), *td = getenv("TMPDIR");
    shoal_client *c = NULL;
    shoal_model_info mi;
    manifest *man = NULL;
    shoal_key *keys = calloc(N_WARM, sizeof *keys);
    shoal_err err = { 0 };
    int rc;

    snprintf(bin, sizeof bin, "%s", b && b[0] ? b : "bin");
    snprintf(tmp, sizeof tmp, "%s/shoal-bench-daemon.XXXXXX", td && td[0] ? td : "/tmp");
    if (!keys || !mkdtemp(tmp)) {
        fprintf(stderr, "bench daemon: cannot make a temporary directory\n");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    rc = setup(&c, &mi, &man, &err);
    rc = rc ? rc : bench_warm(c, mi.handle, man, keys, &err);
    rc = rc ? rc : bench_hit(c, mi.handle, keys, &err);
    rc = rc ? rc : bench_batch(c, mi.handle, keys, man->expert_bytes, &err);
    if (rc)
        fprintf(stderr, "bench daemon: %s\n", err.msg[0] ? err.msg : shoal_strerror(rc));
    shoal_client_close(c);
    manifest_free(man);
    free(keys);
    cleanup();
    return rc ? 1 : 0;
}
