/* test_progress.c — the shared progress display (common/progress.h): a
 * pipe or file never gets a carriage return or an escape sequence and
 * gets one line per interval, one per phase and one at the end; a
 * terminal (a pseudo-terminal here) gets the bar redrawn with '\r', in
 * colour unless NO_COLOR; off means nothing at all; the rate and ETA come
 * from the updates' times (given, so nothing here depends on the clock). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "common/progress.h"

#define MS 1000000ull

/* Everything written to f, NUL-terminated (caller frees). */
static char *slurp(FILE *f)
{
    long n;
    char *s;
    fflush(f);
    n = ftell(f);
    s = calloc(1, (size_t)n + 1);
    rewind(f);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    return s;
}

static int count(const char *s, char c)
{
    int n = 0;
    for (; *s; s++)
        n += *s == c;
    return n;
}

static void test_pipe_lines(void **state)
{
    FILE *f = tmpfile();
    shoal_meter m;
    shoal_meter_cfg cfg = { 0, 0, 0, 5000 };
    char *out;
    (void)state;

    shoal_meter_init(&m, f, &cfg, "warm", SHOAL_METER_BYTES);
    /* 100 updates 100 ms apart: 10 s, so lines at 0 s, 5 s (and the end) */
    for (int i = 0; i <= 100; i++)
        shoal_meter_update_at(&m, 1000 * MS + (uint64_t)i * 100 * MS, NULL,
                              (uint64_t)i << 20, 100u << 20, "3/9 objects");
    shoal_meter_end(&m, "9/9 objects");
    out = slurp(f);
    assert_null(strchr(out, '\r'));
    assert_null(strchr(out, '\033'));
    assert_int_equal(count(out, '\n'), 4);   /* 0 s, 5 s, 10 s, the end */
    assert_non_null(strstr(out, "warm    0.0 %  0 B / 100 MiB"));
    /* 1 MiB per 100 ms = 10 MiB/s over the window; nothing left at the end */
    assert_non_null(strstr(out, "100.0 %  100 MiB / 100 MiB  10.0 MiB/s  ETA 0 s  9/9 objects\n"));
    assert_non_null(strstr(out, " 50.0 %  50.0 MiB / 100 MiB  10.0 MiB/s  ETA 5 s  3/9 objects\n"));
    free(out);
    fclose(f);
}

static void test_pipe_phase_change(void **state)
{
    FILE *f = tmpfile();
    shoal_meter m;
    char *out;
    (void)state;

    shoal_meter_init(&m, f, NULL, "spine:", SHOAL_METER_BYTES);
    shoal_meter_update_at(&m, 1 * MS, "reading", 10, 100, NULL);
    shoal_meter_update_at(&m, 2 * MS, "reading", 20, 100, NULL);     /* too soon: no line */
    shoal_meter_update_at(&m, 3 * MS, "packing", 5, 50, NULL);       /* new phase: a line */
    shoal_meter_end(&m, NULL);
    out = slurp(f);
    assert_int_equal(count(out, '\n'), 3);
    assert_non_null(strstr(out, "spine: reading   10.0 %"));
    assert_non_null(strstr(out, "spine: packing   10.0 %"));
    free(out);
    fclose(f);
}

static void test_off(void **state)
{
    FILE *f = tmpfile();
    shoal_meter m;
    shoal_meter_cfg cfg = { 1, 0, 0, 0 };
    char *out;
    (void)state;

    shoal_meter_init(&m, f, &cfg, "x", SHOAL_METER_COUNT);
    shoal_meter_update_at(&m, 1 * MS, NULL, 1, 2, NULL);
    shoal_meter_end(&m, NULL);
    out = slurp(f);
    assert_string_equal(out, "");
    free(out);
    fclose(f);
}

static void test_env(void **state)
{
    shoal_meter_cfg cfg;
    (void)state;

    setenv("NO_COLOR", "1", 1);
    setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1", 1);
    shoal_meter_env_capture(&cfg, 0);
    assert_true(cfg.no_color);
    assert_true(cfg.off);
    setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0", 1);
    unsetenv("NO_COLOR");
    shoal_meter_env_capture(&cfg, 0);
    assert_false(cfg.off);
    assert_false(cfg.no_color);
    shoal_meter_env_capture(&cfg, 1);   /* --quiet */
    assert_true(cfg.off);
    unsetenv("HF_HUB_DISABLE_PROGRESS_BARS");
}

/* Read what the pty's master end holds (the slave's output). */
static void drain(int master, char *buf, size_t cap)
{
    size_t got = 0;
    ssize_t n;
    while (got + 1 < cap && (n = read(master, buf + got, cap - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = '\0';
}

static void tty_run(int no_color, char *buf, size_t cap)
{
    int master, slave;
    struct winsize ws = { 24, 100, 0, 0 };
    FILE *f;
    shoal_meter m;
    shoal_meter_cfg cfg = { 0, no_color, 0, 0 };

    assert_int_equal(openpty(&master, &slave, NULL, NULL, &ws), 0);
    f = fdopen(slave, "w");
    assert_non_null(f);
    shoal_meter_init(&m, f, &cfg, "fetch", SHOAL_METER_BYTES);
    for (int i = 0; i <= 10; i++)
        shoal_meter_update_at(&m, (uint64_t)i * 200 * MS, NULL, (uint64_t)i * 10, 100, NULL);
    shoal_meter_end(&m, NULL);
    fclose(f);
    fcntl(master, F_SETFL, O_NONBLOCK);
    drain(master, buf, cap);
    close(master);
}

static void test_tty_bar(void **state)
{
    char buf[16384];
    (void)state;

    tty_run(0, buf, sizeof buf);
    assert_true(count(buf, '\r') >= 11);          /* redrawn in place */
    assert_non_null(strstr(buf, "\033[32m"));     /* the bar's colour */
    assert_non_null(strstr(buf, "##############################"));   /* 30: full */
    assert_non_null(strstr(buf, "100.0 %"));
    tty_run(1, buf, sizeof buf);                   /* NO_COLOR */
    assert_null(strchr(buf, '\033'));
    assert_true(count(buf, '\r') >= 11);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipe_lines),
        cmocka_unit_test(test_pipe_phase_change),
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_tty_bar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
