/* test_common.c — unit tests for common/: errors, buffers, JSON, paths,
 * sizes, logging and whole-file I/O. */
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
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/hfenv.h"
#include "common/err.h"
#include "common/json.h"
#include "common/log.h"
#include "common/path.h"
#include "common/sys.h"
#include "common/utf8.h"

static void test_err_codes(void **state)
{
    shoal_err e;
    (void)state;
    shoal_err_clear(&e);
    assert_int_equal(e.code, 0);
    assert_string_equal(shoal_err_name(SHOAL_ENOSPC), "ENOSPC");
    assert_string_equal(shoal_strerror(SHOAL_OK), "success");
    assert_string_equal(shoal_strerror(12345), "unknown error");
    assert_int_equal(shoal_err_from_errno(ENOSPC), SHOAL_ENOSPC);
    assert_int_equal(shoal_err_from_errno(ENOENT), SHOAL_ENOTFOUND);
    assert_int_equal(shoal_err_set(&e, SHOAL_EIO, "write %s", "x"), SHOAL_EIO);
    assert_int_equal(e.code, SHOAL_EIO);
    assert_string_equal(e.msg, "write x");
    assert_int_equal(shoal_err_wrap(&e, SHOAL_EINVAL, "commit %d", 7), SHOAL_EIO);
    assert_string_equal(e.msg, "commit 7: write x");
    /* NULL records are allowed and still return the code. */
    assert_int_equal(shoal_err_set(NULL, SHOAL_ENOMEM, "x"), SHOAL_ENOMEM);
    /* Every code in range has a distinct name. */
    for (int c = 0; c > -SHOAL_ERR_COUNT_; c--)
        assert_string_not_equal(shoal_err_name(c), "EUNKNOWN");
}

static void test_buf_basic(void **state)
{
    shoal_buf b;
    size_t n;
    uint8_t *p;
    (void)state;
    shoal_buf_init(&b, 0);
    assert_int_equal(shoal_buf_append_str(&b, "hello"), 0);
    assert_int_equal(shoal_buf_appendf(&b, " %d-%s", 42, "x"), 0);
    assert_int_equal(b.len, 10);
    assert_string_equal((char *)b.data, "hello 42-x");
    shoal_buf_consume(&b, 6);
    assert_string_equal((char *)b.data, "42-x");
    assert_int_equal(shoal_buf_append_le32(&b, 0x01020304u), 0);
    assert_int_equal(shoal_rd_le32(b.data + 4), 0x01020304u);
    assert_int_equal(shoal_buf_append_le64(&b, 0x1122334455667788ull), 0);
    assert_true(shoal_rd_le64(b.data + 8) == 0x1122334455667788ull);
    p = shoal_buf_take(&b, &n);
    assert_non_null(p);
    assert_int_equal(n, 16);
    assert_null(b.data);
    free(p);
    shoal_buf_free(&b);
    shoal_buf_free(NULL);
}

static void test_buf_limit(void **state)
{
    shoal_buf b;
    char big[100];
    (void)state;
    memset(big, 'a', sizeof big);
    shoal_buf_init(&b, 64);
    assert_int_equal(shoal_buf_append(&b, big, 60), 0);
    /* Over the limit: refused, and the buffer is unchanged. */
    assert_int_equal(shoal_buf_append(&b, big, 10), SHOAL_ETOOBIG);
    assert_int_equal(b.len, 60);
    assert_int_equal(shoal_buf_append(&b, big, 4), 0);
    assert_int_equal(b.len, 64);
    assert_int_equal(shoal_buf_reserve(&b, SIZE_MAX), SHOAL_ETOOBIG);
    shoal_buf_free(&b);
}

static void test_json_lookup(void **state)
{
    const char *text = "{\"text_config\":{\"hidden_size\":256,\"rms_norm_eps\":1e-5,"
                       "\"name\":\"k3\",\"flag\":true,\"list\":[1,4,8],"
                       "\"linear_attn_config\":{\"num_heads\":4}}}";
    shoal_err e = { 0 };
    shoal_json *j = shoal_json_parse(text, strlen(text), &e);
    int64_t v = 0, arr[4];
    double d = 0;
    const char *s = NULL;
    int b = 0;
    size_t n = 0;
    (void)state;
    assert_non_null(j);
    assert_int_equal(shoal_json_int(j, "text_config.hidden_size", &v, &e), 0);
    assert_int_equal(v, 256);
    assert_int_equal(shoal_json_int(j, "text_config.linear_attn_config.num_heads", &v, &e), 0);
    assert_int_equal(v, 4);
    assert_int_equal(shoal_json_num(j, "text_config.rms_norm_eps", &d, &e), 0);
    assert_true(d > 0.9e-5 && d < 1.1e-5);
    assert_int_equal(shoal_json_str(j, "text_config.name", &s, &e), 0);
    assert_string_equal(s, "k3");
    assert_int_equal(shoal_json_bool(j, "text_config.flag", &b, &e), 0);
    assert_int_equal(b, 1);
    assert_int_equal(shoal_json_int_array(j, "text_config.list", arr, 4, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(arr[2], 8);
    assert_int_equal(shoal_json_int_array(j, "text_config.list", arr, 2, &n, &e), SHOAL_ETOOBIG);
    /* Errors name the path. */
    assert_int_equal(shoal_json_int(j, "text_config.missing", &v, &e), SHOAL_ENOTFOUND);
    assert_non_null(strstr(e.msg, "text_config.missing"));
    assert_int_equal(shoal_json_int(j, "text_config.name", &v, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "integer"));
    shoal_json_free(j);
}

static void test_json_errors_and_build(void **state)
{
    shoal_err e = { 0 };
    shoal_json *o, *a;
    shoal_buf out;
    (void)state;
    assert_null(shoal_json_parse("{\"a\":", 5, &e));
    assert_int_equal(e.code, SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "line"));
    /* Duplicate keys are refused: a hostile file cannot say two things. */
    assert_null(shoal_json_parse("{\"a\":1,\"a\":2}", 13, &e));

    o = shoal_json_object();
    a = shoal_json_array();
    assert_int_equal(shoal_json_set_int(o, "n", 3), 0);
    assert_int_equal(shoal_json_set_str(o, "s", "x\"y"), 0);
    assert_int_equal(shoal_json_append_take(a, shoal_json_new_bool(1)), 0);
    assert_int_equal(shoal_json_set_take(o, "a", a), 0);
    shoal_buf_init(&out, 0);
    assert_int_equal(shoal_json_dump(o, SHOAL_JSON_SORTED, &out), 0);
    assert_string_equal((char *)out.data, "{\"a\":[true],\"n\":3,\"s\":\"x\\\"y\"}");
    shoal_buf_free(&out);
    shoal_json_free(o);
}

static void test_home_resolve(void **state)
{
    char out[256];
    shoal_env env = { 0 };
    shoal_err e = { 0 };
    (void)state;
    assert_int_equal(shoal_home_resolve(&env, NULL, out, sizeof out, &e), SHOAL_EINVAL);
    env.home = "/home/u";
    assert_int_equal(shoal_home_resolve(&env, NULL, out, sizeof out, &e), 0);
    assert_string_equal(out, "/home/u/.cache/shoal");
    env.xdg_cache_home = "/xdg";
    assert_int_equal(shoal_home_resolve(&env, NULL, out, sizeof out, &e), 0);
    assert_string_equal(out, "/xdg/shoal");
    env.shoal_home = "/sh";
    assert_int_equal(shoal_home_resolve(&env, NULL, out, sizeof out, &e), 0);
    assert_string_equal(out, "/sh");
    assert_int_equal(shoal_home_resolve(&env, "/flag", out, sizeof out, &e), 0);
    assert_string_equal(out, "/flag");
    assert_int_equal(shoal_home_resolve(&env, "/flag", out, 4, &e), SHOAL_ETOOBIG);
}

static void test_path_join_mkdir(void **state)
{
    char out[64], dir[128], tmpl[] = "/tmp/shoal-common-XXXXXX";
    shoal_err e = { 0 };
    struct stat st;
    (void)state;
    assert_int_equal(shoal_path_join(out, sizeof out, "/a", "b"), 0);
    assert_string_equal(out, "/a/b");
    assert_int_equal(shoal_path_join(out, sizeof out, "/a/", "b"), 0);
    assert_string_equal(out, "/a/b");
    assert_int_equal(shoal_path_join(out, sizeof out, "/a", "/abs"), 0);
    assert_string_equal(out, "/abs");
    assert_int_equal(shoal_path_join(out, 4, "/abc", "d"), SHOAL_ETOOBIG);

    assert_non_null(mkdtemp(tmpl));
    snprintf(dir, sizeof dir, "%s/x/y/z", tmpl);
    assert_int_equal(shoal_mkdir_p(dir, 0755, &e), 0);
    assert_int_equal(stat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(shoal_mkdir_p(dir, 0755, &e), 0);   /* exists: fine */
    snprintf(dir, sizeof dir, "%s/x/y/z", tmpl);
    rmdir(dir);
    snprintf(dir, sizeof dir, "%s/x/y", tmpl);
    rmdir(dir);
    snprintf(dir, sizeof dir, "%s/x", tmpl);
    rmdir(dir);
    rmdir(tmpl);
}

static void test_size_parse_format(void **state)
{
    uint64_t v = 0;
    char s[32];
    (void)state;
    assert_int_equal(shoal_size_parse("123", &v), 0);
    assert_true(v == 123);
    assert_int_equal(shoal_size_parse("64K", &v), 0);
    assert_true(v == 65536);
    assert_int_equal(shoal_size_parse("1.5G", &v), 0);
    assert_true(v == 1610612736ull);
    assert_int_equal(shoal_size_parse("10GiB", &v), 0);
    assert_true(v == 10737418240ull);
    assert_int_equal(shoal_size_parse("500MB", &v), 0);
    assert_true(v == 500000000ull);
    assert_int_equal(shoal_size_parse("2T", &v), 0);
    assert_true(v == 2199023255552ull);
    assert_int_equal(shoal_size_parse("", &v), SHOAL_EINVAL);
    assert_int_equal(shoal_size_parse("-1", &v), SHOAL_EINVAL);
    assert_int_equal(shoal_size_parse("12X", &v), SHOAL_EINVAL);
    assert_int_equal(shoal_size_parse("12Gx", &v), SHOAL_EINVAL);
    {
        long l = 7;
        assert_int_equal(shoal_long_parse("42", 0, 100, &l), 0);
        assert_int_equal(l, 42);
        assert_int_equal(shoal_long_parse("101", 0, 100, &l), SHOAL_EINVAL);
        assert_int_equal(shoal_long_parse("4x", 0, 100, &l), SHOAL_EINVAL);
        assert_int_equal(shoal_long_parse("", 0, 100, &l), SHOAL_EINVAL);
        assert_int_equal(l, 42);
    }
    assert_string_equal(shoal_size_format(512, s, sizeof s), "512 B");
    assert_string_equal(shoal_size_format(17547264, s, sizeof s), "16.7 MiB");
    assert_string_equal(shoal_size_format(1536ull << 20, s, sizeof s), "1.50 GiB");
}

static void test_log_to_file(void **state)
{
    char path[] = "/tmp/shoal-log-XXXXXX";
    int fd = mkstemp(path);
    shoal_buf b;
    shoal_log_level lv;
    (void)state;
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(shoal_log_setup("t", SHOAL_LOG_INFO, path), 0);
    LOG_INFO("cache", "hello %d", 5);
    LOG_DEBUG("cache", "not shown");
    LOG_ERROR("fetch", "bad");
    shoal_log_close();
    shoal_buf_init(&b, 0);
    assert_int_equal(shoal_read_file(path, 0, &b, NULL), 0);
    assert_non_null(strstr((char *)b.data, "INFO  cache: hello 5\n"));
    assert_non_null(strstr((char *)b.data, "ERROR fetch: bad\n"));
    assert_null(strstr((char *)b.data, "not shown"));
    assert_non_null(strstr((char *)b.data, " t["));
    shoal_buf_free(&b);
    {
        /* a limiter prints its first SHOAL_LOG_LIMIT_BURST lines, holds
         * back the next ones within SHOAL_LOG_LIMIT_MS and names their
         * count later */
        const char *p;
        int lines = 0;
        static shoal_log_limit lim;
        char n[32];
        assert_int_equal(shoal_log_setup("t", SHOAL_LOG_INFO, path), 0);
        for (int i = 0; i < 12346; i++)
            LOG_WARN_LIMITED(&lim, "server", "accept: %s", "Too many open files");
        lim.window_ms = 0;   /* as if the window had passed */
        LOG_WARN_LIMITED(&lim, "server", "accept: %s", "again");
        shoal_log_close();
        shoal_buf_init(&b, 0);
        assert_int_equal(shoal_read_file(path, 0, &b, NULL), 0);
        assert_non_null(strstr((char *)b.data, "server: accept: Too many open files\n"));
        assert_non_null(strstr((char *)b.data, "server: accept: again (repeated 12,336 times)\n"));
        for (p = (char *)b.data; (p = strstr(p, "Too many")) != NULL; p++)
            lines++;
        assert_int_equal(lines, SHOAL_LOG_LIMIT_BURST);
        shoal_buf_free(&b);
        assert_string_equal(shoal_log_count(1234567, n, sizeof n), "1,234,567");
        assert_string_equal(shoal_log_count(999, n, sizeof n), "999");
    }
    assert_int_equal(shoal_log_level_parse("debug", &lv), 0);
    assert_int_equal(lv, SHOAL_LOG_DEBUG);
    assert_int_equal(shoal_log_level_parse("loud", &lv), SHOAL_EINVAL);
    assert_int_not_equal(shoal_log_setup("t", SHOAL_LOG_INFO, "/nonexistent/dir/log"), 0);
    shoal_log_close();
    unlink(path);
}

static void test_files(void **state)
{
    char path[] = "/tmp/shoal-file-XXXXXX";
    int fd = mkstemp(path);
    shoal_buf b;
    shoal_err e = { 0 };
    char got[5];
    (void)state;
    close(fd);
    assert_int_equal(shoal_write_file_atomic(path, "abcdef", 6, &e), 0);
    shoal_buf_init(&b, 0);
    assert_int_equal(shoal_read_file(path, 0, &b, &e), 0);
    assert_int_equal(b.len, 6);
    assert_memory_equal(b.data, "abcdef", 6);
    shoal_buf_reset(&b);
    assert_int_equal(shoal_read_file(path, 3, &b, &e), SHOAL_ETOOBIG);
    fd = open(path, O_RDONLY);
    assert_int_equal(shoal_pread_all(fd, got, 4, 2), 0);
    assert_memory_equal(got, "cdef", 4);
    assert_int_equal(shoal_pread_all(fd, got, 5, 2), SHOAL_ERANGE);
    close(fd);
    shoal_buf_reset(&b);
    assert_int_equal(shoal_read_file("/nonexistent-shoal", 0, &b, &e), SHOAL_ENOTFOUND);
    assert_non_null(strstr(e.msg, "/nonexistent-shoal"));
    shoal_buf_free(&b);
    unlink(path);
}

/* HF_HUB_OFFLINE's true values, and the huggingface_hub cache's lookup
 * order (HF_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, HOME). */
static void test_hf_offline_and_cache(void **state)
{
    shoal_hf_env env = { 0 };
    char p[256];
    (void)state;
    assert_int_equal(shoal_hf_offline(&env), 0);
    const char *yes[] = { "1", "true", "YES", "on" }, *no[] = { "0", "false", "", "2" };
    for (int i = 0; i < 4; i++) {
        env.offline = yes[i];
        assert_int_equal(shoal_hf_offline(&env), 1);
        env.offline = no[i];
        assert_int_equal(shoal_hf_offline(&env), 0);
    }
    assert_int_equal(shoal_hf_hub_cache(&env, p, sizeof p), -1);
    env.home = "/h";
    assert_int_equal(shoal_hf_hub_cache(&env, p, sizeof p), 0);
    assert_string_equal(p, "/h/.cache/huggingface/hub");
    env.xdg_cache_home = "/x";
    assert_int_equal(shoal_hf_hub_cache(&env, p, sizeof p), 0);
    assert_string_equal(p, "/x/huggingface/hub");
    env.hf_home = "/hf";
    assert_int_equal(shoal_hf_hub_cache(&env, p, sizeof p), 0);
    assert_string_equal(p, "/hf/hub");
    env.hub_cache = "/c";
    assert_int_equal(shoal_hf_hub_cache(&env, p, sizeof p), 0);
    assert_string_equal(p, "/c");
    assert_int_equal(shoal_hf_hub_cache(&env, p, 2), -1);
}

static void test_hf_token(void **state)
{
    char dir[] = "/tmp/shoal-hf-XXXXXX", path[64];
    shoal_hf_env env = { 0 };
    char *t;
    (void)state;
    assert_non_null(mkdtemp(dir));
    assert_null(shoal_hf_token(&env));                 /* nothing to go on */
    env.home = dir;
    assert_null(shoal_hf_token(&env));                 /* no token file */
    snprintf(path, sizeof path, "%s/token", dir);
    assert_int_equal(shoal_write_file_atomic(path, "  hf_file\r\n", 11, NULL), 0);
    env.hf_home = dir;                                 /* $HF_HOME/token, trimmed */
    t = shoal_hf_token(&env);
    assert_string_equal(t, "hf_file");
    free(t);
    env.hub_token = "hf_hub ";                         /* the variables win */
    t = shoal_hf_token(&env);
    assert_string_equal(t, "hf_hub");
    free(t);
    env.token = "hf_first";
    t = shoal_hf_token(&env);
    assert_string_equal(t, "hf_first");
    free(t);
    env.disable_implicit = "1";
    assert_null(shoal_hf_token(&env));
    unlink(path);
    rmdir(dir);
}

static void test_utf8(void **state)
{
    static const struct { const char *s; size_t n, len; } c[] = {
        { "a", 1, 1 }, { "\xc3\xa9", 2, 2 }, { "\xe2\x82\xac", 3, 3 },
        { "\xf0\x9f\x98\x80", 4, 4 }, { "\xc3", 1, 0 },          /* cut short */
        { "\x80", 1, 0 }, { "\xc0\xaf", 2, 0 }, { "\xe0\x80\xaf", 3, 0 },  /* overlong */
        { "\xed\xa0\x80", 3, 0 },                                  /* surrogate */
        { "\xf4\x90\x80\x80", 4, 0 }, { "\xf5\x80\x80\x80", 4, 0 }, /* > U+10FFFF */
        { "\xe2\x82\x41", 3, 0 }, { "", 0, 0 },
    };
    (void)state;
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        assert_int_equal(shoal_utf8_char_len((const uint8_t *)c[i].s, c[i].n), c[i].len);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_codes),
        cmocka_unit_test(test_buf_basic),
        cmocka_unit_test(test_buf_limit),
        cmocka_unit_test(test_json_lookup),
        cmocka_unit_test(test_json_errors_and_build),
        cmocka_unit_test(test_home_resolve),
        cmocka_unit_test(test_path_join_mkdir),
        cmocka_unit_test(test_size_parse_format),
        cmocka_unit_test(test_log_to_file),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_hf_offline_and_cache),
        cmocka_unit_test(test_hf_token),
        cmocka_unit_test(test_utf8),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
