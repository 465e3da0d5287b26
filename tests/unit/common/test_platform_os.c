/* test_platform_os.c — the platform layer's descriptors, memory hints and
 * process facts, as this build has them: the Linux paths in `make test`,
 * the POSIX paths macOS takes in `make test PORTABLE=1` (the same checks
 * hold for both; where they differ, the build's own path is asserted). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/platform.h"
#include "common/sys.h"

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/shoal-platos.XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return rmdir(dir);
}

static int dir_entries(void)
{
    char cmd[128];
    FILE *p;
    int n = -1;
    snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
    if ((p = popen(cmd, "r"))) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

static void test_name(void **state)
{
    (void)state;
#ifdef SHOAL_PORTABLE
    assert_int_equal(SHOAL_PLATFORM_LINUX, 0);
    assert_string_equal(shoal_platform_name(), "linux-portable");
#else
    assert_int_equal(SHOAL_PLATFORM_LINUX, 1);
    assert_string_equal(shoal_platform_name(), "linux");
#endif
}

/* anonymous, sealed and temporary files: read, write, mmap, no name left */
static void test_files(void **state)
{
    char buf[16] = { 0 };
    int fd;
    (void)state;

    fd = shoal_anon_file("t");
    assert_true(fd >= 0);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    assert_int_equal(shoal_write_all(fd, "hello", 5), 0);
    assert_int_equal(shoal_pread_all(fd, buf, 5, 0), 0);
    assert_memory_equal(buf, "hello", 5);
    assert_int_equal(ftruncate(fd, 8192), 0);
    char *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    m[4096] = 'x';
    assert_int_equal(shoal_pread_all(fd, buf, 1, 4096), 0);
    assert_int_equal(buf[0], 'x');
    munmap(m, 8192);
    close(fd);

    fd = shoal_sealed_file("s", "sealed!", 7);
    assert_true(fd >= 0);
    assert_int_equal(lseek(fd, 0, SEEK_CUR), 0);
    memset(buf, 0, sizeof buf);
    assert_int_equal(read(fd, buf, sizeof buf), 7);
    assert_string_equal(buf, "sealed!");
    assert_true(write(fd, "x", 1) < 0);          /* sealed, or read-only */
    assert_true(ftruncate(fd, 0) != 0);
    close(fd);

    fd = shoal_tmpfile(dir);
    assert_true(fd >= 0);
    assert_int_equal(dir_entries(), 0);          /* unlinked from the start */
    assert_int_equal(shoal_write_all(fd, "abc", 3), 0);
    assert_int_equal(shoal_pread_all(fd, buf, 3, 0), 0);
    assert_memory_equal(buf, "abc", 3);
    close(fd);
    assert_true(shoal_tmpfile("/nonexistent-shoal-dir") < 0);
}

/* the uncached descriptor reads the same bytes, aligned, and leaves the
 * first descriptor's offset alone; the advice and hints never fail */
static void test_uncached(void **state)
{
    char path[128];
    void *b;
    unsigned char *data = malloc(3 * 4096);
    int fd, ufd;
    (void)state;

    for (int i = 0; i < 3 * 4096; i++)
        data[i] = (unsigned char)(i * 7);
    snprintf(path, sizeof path, "%s/f", dir);
    assert_int_equal(shoal_write_file_atomic(path, data, 3 * 4096, NULL), 0);
    fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(lseek(fd, 100, SEEK_SET), 100);
    ufd = shoal_fd_open_uncached(fd);
    if (ufd < 0) {       /* a file system without O_DIRECT (tmpfs): the callers' fallback */
        assert_true(errno == EINVAL || errno == EOPNOTSUPP);
        ufd = dup(fd);
    }
    assert_int_equal(posix_memalign(&b, 4096, 2 * 4096), 0);
    assert_int_equal(pread(ufd, b, 2 * 4096, 4096), 2 * 4096);
    assert_memory_equal(b, data + 4096, 2 * 4096);
    assert_int_equal(lseek(fd, 0, SEEK_CUR), 100);
    shoal_cache_drop(fd, 0, 0);
    assert_int_equal(shoal_populate_read(b, 2 * 4096), 0);
    assert_int_equal(shoal_populate_read((char *)b + 1, 10), 0);
    shoal_hugepage_hint(b, 2 * 4096);
    free(b);
    close(ufd);
    close(fd);
    unlink(path);
    free(data);
}

/* fallocate grows (mode 0) or keeps the size; fdatasync; copy_range copies
 * or says ENOSYS (the callers then read and write) */
static void test_alloc_copy(void **state)
{
    char path[128], buf[8];
    struct stat st;
    off_t in = 2, out = 0;
    int fd, fd2;
    (void)state;

    snprintf(path, sizeof path, "%s/a", dir);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(shoal_fallocate(fd, 0, 0, 1 << 20), 0);
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, 1 << 20);
    assert_true((uint64_t)st.st_blocks * 512 >= (1u << 20));
    assert_int_equal(ftruncate(fd, 0), 0);
    if (shoal_fallocate(fd, SHOAL_FALLOC_KEEP_SIZE, 0, 1 << 20) == 0) {
        assert_int_equal(fstat(fd, &st), 0);
        assert_int_equal(st.st_size, 0);
    } else {
        assert_int_equal(errno, EOPNOTSUPP);
        assert_int_equal(SHOAL_PLATFORM_LINUX, 0);
    }
    assert_int_equal(shoal_write_all(fd, "0123456789", 10), 0);
    assert_int_equal(shoal_fdatasync(fd), 0);
    fd2 = shoal_tmpfile(dir);     /* the same file system: copy_file_range takes it */
    assert_true(fd2 >= 0);
    ssize_t k = shoal_copy_range(fd, &in, fd2, &out, 5);
    if (k < 0) {
        assert_int_equal(errno, ENOSYS);
        assert_int_equal(SHOAL_PLATFORM_LINUX, 0);
    } else {
        assert_int_equal(k, 5);
        assert_int_equal(in, 7);
        assert_int_equal(out, 5);
        assert_int_equal(shoal_pread_all(fd2, buf, 5, 0), 0);
        assert_memory_equal(buf, "23456", 5);
    }
    assert_int_equal(fstat(fd, &st), 0);
    assert_true(shoal_stat_mtime_ns(&st) / 1000000000 == (int64_t)st.st_mtime);
    close(fd);
    close(fd2);
    unlink(path);
    assert_int_equal(shoal_fs_in_ram("/nonexistent-shoal-dir"), 0);
}

static int cmp_mod(const void *a, const void *b, void *arg)
{
    int m = *(const int *)arg;
    return *(const int *)a % m - *(const int *)b % m;
}

static int cmp_nested(const void *a, const void *b, void *arg)
{
    int inner[3] = { 5, 3, 4 }, m = 10;
    shoal_qsort_r(inner, 3, sizeof *inner, cmp_mod, &m);   /* a comparator that sorts */
    assert_int_equal(inner[0], 3);
    return cmp_mod(a, b, arg);
}

static void test_process(void **state)
{
    int v[6] = { 17, 4, 12, 9, 1, 5 }, m = 8;
    uint64_t rss, anon, peak, fds;
    unsigned char r1[64] = { 0 }, r2[64] = { 0 };
    char exe[4096];
    shoal_mem_limits l;
    (void)state;

    shoal_qsort_r(v, 6, sizeof *v, cmp_nested, &m);   /* by value mod 8: 17 9 | 1 | 12 4 | 5 */
    for (int i = 1; i < 6; i++)
        assert_true(v[i - 1] % 8 <= v[i] % 8);
    assert_int_equal(v[5], 5);

    fds = shoal_fd_limit_raise();
    assert_true(fds == 0 || fds >= 64);
    assert_int_equal(shoal_proc_mem(0, &rss, &anon, &peak), 0);
    assert_true(peak > 0);
    if (SHOAL_PLATFORM_LINUX)
        assert_true(rss > 0 && anon > 0 && anon <= rss);
    else
        assert_int_equal(shoal_proc_mem(getppid(), &rss, &anon, &peak), -1);
    assert_int_equal(shoal_random(r1, sizeof r1), 0);
    assert_int_equal(shoal_random(r2, sizeof r2), 0);
    assert_memory_not_equal(r1, r2, sizeof r1);
    assert_int_equal(shoal_exe_path(exe, sizeof exe), 0);
    assert_non_null(strstr(exe, "test_platform_os"));
    if (shoal_thread_nice(0) != 0)
        assert_int_equal(errno, ENOTSUP);

    /* the real machine's memory, from /proc or (PORTABLE) sysconf */
    assert_int_equal(shoal_mem_limits_read(NULL, &l, NULL), 0);
    assert_true(l.mem_total > 0 && l.limit > 0 && l.limit <= l.mem_total);
    assert_true(l.mem_available <= l.mem_total);
    if (!SHOAL_PLATFORM_LINUX && l.limit == l.mem_total)
        assert_string_equal(l.limit_by, "physical memory");
}

static void test_fds(void **state)
{
    int p[2], s;
    (void)state;

    assert_int_equal(shoal_pipe(p, SHOAL_FD_CLOEXEC | SHOAL_FD_NONBLOCK), 0);
    assert_true(fcntl(p[0], F_GETFD) & FD_CLOEXEC);
    assert_true(fcntl(p[1], F_GETFL) & O_NONBLOCK);
    char c;
    assert_int_equal(read(p[0], &c, 1), -1);
    assert_int_equal(errno, EAGAIN);
    close(p[0]);
    close(p[1]);
    assert_int_equal(shoal_pipe(p, 0), 0);
    assert_false(fcntl(p[0], F_GETFD) & FD_CLOEXEC);
    assert_false(fcntl(p[1], F_GETFL) & O_NONBLOCK);
    close(p[0]);
    close(p[1]);

    s = shoal_socket(AF_UNIX, SOCK_STREAM, 0, SHOAL_FD_NONBLOCK);
    assert_true(s >= 0);
    assert_true(fcntl(s, F_GETFD) & FD_CLOEXEC);
    assert_true(fcntl(s, F_GETFL) & O_NONBLOCK);
    close(s);
    s = shoal_socket(AF_UNIX, SOCK_STREAM, 0, 0);
    assert_true(s >= 0);
    assert_false(fcntl(s, F_GETFL) & O_NONBLOCK);
    close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_uncached),
        cmocka_unit_test(test_alloc_copy),
        cmocka_unit_test(test_process),
        cmocka_unit_test(test_fds),
    };
    return cmocka_run_group_tests_name("platform_os", tests, setup, teardown);
}
