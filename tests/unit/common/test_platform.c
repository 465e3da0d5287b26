/* test_platform.c — memory limits read from fake /proc and /sys trees:
 * cgroup v2 (memory.max, memory.high, an ancestor's limit), v1
 * (memory.limit_in_bytes), both at once, a container whose mount shows its
 * own group as the root, "max" and v1's unlimited value, and no cgroup. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/path.h"
#include "common/platform.h"
#include "common/sys.h"

static char root[256];

static void put(const char *rel, const char *text)
{
    char path[SHOAL_PATH_MAX], dir[SHOAL_PATH_MAX];
    snprintf(path, sizeof path, "%s%s", root, rel);
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    assert_int_equal(shoal_mkdir_p(dir, 0755, NULL), 0);
    assert_int_equal(shoal_write_file_atomic(path, text, strlen(text), NULL), 0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/shoal-platform.XXXXXX");
    assert_non_null(mkdtemp(root));
    put("/proc/meminfo", "MemTotal:       65536000 kB\nMemFree: 1 kB\nMemAvailable:   60000000 kB\n");
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];
    (void)state;
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    return system(cmd) == 0 ? 0 : -1;
}

#define MI_V2 "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
#define MI_V1 "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" \
              "36 31 0:33 / /sys/fs/cgroup/cpu\\040x rw,relatime - cgroup cgroup rw,cpu\n"

static void test_no_cgroup(void **state)
{
    shoal_mem_limits l;
    (void)state;
    put("/proc/self/mountinfo", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n");
    put("/proc/self/cgroup", "0::/\n");
    assert_int_equal(shoal_mem_limits_read(root, &l, NULL), 0);
    assert_int_equal(l.mem_total, 65536000ull * 1024);
    assert_int_equal(l.mem_available, 60000000ull * 1024);
    assert_int_equal(l.cgroup_max, 0);
    assert_int_equal(l.cgroup_version, 0);
    if (!l.rlimit_as && !l.rlimit_data) {
        assert_int_equal(l.limit, l.mem_total);
        assert_string_equal(l.limit_by, "MemTotal");
    }
}

static void test_v2_max_high_ancestor(void **state)
{
    shoal_mem_limits l;
    (void)state;
    put("/proc/self/mountinfo", MI_V2);
    put("/proc/self/cgroup", "0::/user.slice/app.scope\n");
    put("/sys/fs/cgroup/user.slice/app.scope/memory.max", "max\n");
    put("/sys/fs/cgroup/user.slice/app.scope/memory.high", "34359738368\n");
    put("/sys/fs/cgroup/user.slice/memory.max", "17179869184\n");     /* the parent's: smaller */
    assert_int_equal(shoal_mem_limits_read(root, &l, NULL), 0);
    assert_int_equal(l.cgroup_version, 2);
    assert_int_equal(l.cgroup_max, 17179869184ull);
    assert_int_equal(l.cgroup_high, 34359738368ull);
    assert_string_equal(l.cgroup_file, "/sys/fs/cgroup/user.slice/memory.max");
    assert_int_equal(l.limit, 17179869184ull);
    assert_string_equal(l.limit_by, "cgroup memory.max");
    /* memory.high below memory.max is the limit that throttles first */
    put("/sys/fs/cgroup/user.slice/app.scope/memory.high", "8589934592\n");
    assert_int_equal(shoal_mem_limits_read(root, &l, NULL), 0);
    assert_int_equal(l.limit, 8589934592ull);
    assert_string_equal(l.limit_by, "cgroup memory.high");
}

static void test_v1_and_hybrid(void **state)
{
    shoal_mem_limits l;
    (void)state;
    /* v1 memory controller beside a v2 mount without it (this machine's kind) */
    put("/proc/self/mountinfo", MI_V1 "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
    put("/proc/self/cgroup", "4:memory:/job/7\n1:cpu:/\n0::/\n");
    put("/sys/fs/cgroup/memory/job/7/memory.limit_in_bytes", "3221225472\n");
    put("/sys/fs/cgroup/memory/job/memory.limit_in_bytes", "9223372036854771712\n");
    put("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    assert_int_equal(shoal_mem_limits_read(root, &l, NULL), 0);
    assert_int_equal(l.cgroup_version, 1);
    assert_int_equal(l.cgroup_max, 3221225472ull);
    assert_string_equal(l.limit_by, "cgroup memory.limit_in_bytes");
    assert_string_equal(l.cgroup_file, "/sys/fs/cgroup/memory/job/7/memory.limit_in_bytes");
    /* unlimited everywhere */
    put("/sys/fs/cgroup/memory/job/7/memory.limit_in_bytes", "9223372036854771712\n");
    assert_int_equal(shoal_mem_limits_read(root, &l, NULL), 0);
    assert_int_equal(l.cgroup_max, 0);
}

static void test_container_mount_root(void **state)
{
    shoal_mem_limits l;
    (void)state;
    /* the container sees its own group as the mount's root */
    put("/proc/self/mountinfo",
        "500 400 0:26 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n");
    put("/proc/self/cgroup", "0::/docker/abc\n");
    put("/sys/fs/cgroup/memory.max", "2147483648\n");
    assert_int_equal(shoal_mem_limits_read(root, &l, NULL), 0);
    assert_int_equal(l.cgroup_max, 2147483648ull);
    assert_string_equal(l.cgroup_file, "/sys/fs/cgroup/memory.max");
}

static void test_errors(void **state)
{
    shoal_mem_limits l;
    shoal_err e = { 0 };
    (void)state;
    assert_int_equal(shoal_mem_limits_read("/nonexistent-shoal", &l, &e), SHOAL_EIO);
    assert_non_null(strstr(e.msg, "meminfo"));
    /* the real machine: something sensible */
    assert_int_equal(shoal_mem_limits_read(NULL, &l, NULL), 0);
    assert_true(l.mem_total > 0 && l.limit > 0 && l.limit <= l.mem_total);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_cgroup),
        cmocka_unit_test(test_v2_max_high_ancestor),
        cmocka_unit_test(test_v1_and_hybrid),
        cmocka_unit_test(test_container_mount_root),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests_name("platform", tests, setup, teardown);
}
