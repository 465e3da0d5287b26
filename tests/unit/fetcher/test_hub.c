/* test_hub.c — fetcher/hub.h without a network: upstream specs, resolve URL
 * encoding (specs/hf-hub.md §1), the origin rule that decides where the
 * token may go, and client creation.  HTTP behaviour is covered by
 * tests/integration/test_hubget.sh against hubmock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fetcher/hub.h"

static void test_spec_parse(void **state)
{
    hub_spec s;
    shoal_err err;
    (void)state;

    assert_int_equal(hub_spec_parse("hf://moonshotai/Kimi-K3", &s, &err), 0);
    assert_string_equal(s.repo, "moonshotai/Kimi-K3");
    assert_string_equal(s.revision, "main");
    assert_int_equal(hub_spec_parse("hf://org/name.v2_x@refs/pr/1", &s, &err), 0);
    assert_string_equal(s.repo, "org/name.v2_x");
    assert_string_equal(s.revision, "refs/pr/1");
    assert_int_equal(hub_spec_parse("hf://o/n@0123456789abcdef0123456789abcdef01234567", &s, &err), 0);
    assert_string_equal(s.revision, "0123456789abcdef0123456789abcdef01234567");

    memset(&s, 'x', sizeof s);
    assert_int_equal(hub_spec_parse("https://huggingface.co/o/n", &s, &err), SHOAL_EINVAL);
    assert_int_equal(s.repo[0], 'x');   /* unchanged on failure */
    assert_int_equal(hub_spec_parse("hf://justname", &s, &err), SHOAL_EINVAL);
    assert_non_null(strstr(err.msg, "org/name"));
    assert_int_equal(hub_spec_parse("hf://a/b/c", &s, &err), SHOAL_EINVAL);
    assert_int_equal(hub_spec_parse("hf:///b", &s, &err), SHOAL_EINVAL);
    assert_int_equal(hub_spec_parse("hf://a/", &s, &err), SHOAL_EINVAL);
    assert_int_equal(hub_spec_parse("hf://a/b@", &s, &err), SHOAL_EINVAL);
    assert_int_equal(hub_spec_parse("hf://a/b@has space", &s, &err), SHOAL_EINVAL);
    assert_int_equal(hub_spec_parse("hf://a b/c", &s, &err), SHOAL_EINVAL);
    assert_int_equal(hub_spec_parse("hf://datasets/a/b", &s, &err), SHOAL_EINVAL);
    assert_int_equal(hub_spec_parse(NULL, &s, NULL), SHOAL_EINVAL);
}

static void test_url_resolve(void **state)
{
    char url[HUB_URL_MAX], small[40];
    (void)state;

    assert_int_equal(hub_url_resolve("https://huggingface.co/", "o/n", "main", "config.json",
                                     url, sizeof url), 0);
    assert_string_equal(url, "https://huggingface.co/o/n/resolve/main/config.json");
    /* revision: '/' encoded too; file: '/' kept, space and others encoded */
    assert_int_equal(hub_url_resolve("http://127.0.0.1:8080", "o/n", "refs/pr/1",
                                     "sub dir/a+b~c_d-e.f", url, sizeof url), 0);
    assert_string_equal(url,
        "http://127.0.0.1:8080/o/n/resolve/refs%2Fpr%2F1/sub%20dir/a%2Bb~c_d-e.f");
    assert_int_equal(hub_url_resolve("http://h", "o/n", "v1", "caf\xc3\xa9.txt", url, sizeof url), 0);
    assert_string_equal(url, "http://h/o/n/resolve/v1/caf%C3%A9.txt");
    assert_int_equal(hub_url_resolve("http://h", "o/n", "main", "a-very-long-file-name.json",
                                     small, sizeof small), SHOAL_ETOOBIG);
}

static void test_same_origin(void **state)
{
    (void)state;
    assert_true(hub_url_same_origin("https://huggingface.co", "https://huggingface.co/o/n/x"));
    assert_true(hub_url_same_origin("https://HuggingFace.co", "https://huggingface.co:443/x"));
    assert_true(hub_url_same_origin("http://127.0.0.1:5000", "http://127.0.0.1:5000/a?b=c"));
    /* another port, scheme or host is another origin: no token there */
    assert_false(hub_url_same_origin("http://127.0.0.1:5000", "http://127.0.0.1:5001/a"));
    assert_false(hub_url_same_origin("https://huggingface.co", "http://huggingface.co/a"));
    assert_false(hub_url_same_origin("https://huggingface.co", "https://cas-bridge.xethub.hf.co/a"));
    assert_false(hub_url_same_origin("https://huggingface.co", "https://huggingface.co.evil.com/"));
    assert_false(hub_url_same_origin("https://huggingface.co", "not a url"));
}

static void test_client_new(void **state)
{
    hub_client *c = NULL;
    hub_options o;
    shoal_err err;
    (void)state;

    memset(&o, 0, sizeof o);
    assert_int_equal(hub_client_new(&o, &c, &err), 0);
    assert_non_null(c);
    assert_int_equal(hub_client_last_status(c), 0);
    assert_int_equal(hub_client_retry_after(c), -1);
    hub_client_free(c);
    hub_client_free(NULL);
    o.endpoint = "///";
    c = NULL;
    assert_int_equal(hub_client_new(&o, &c, &err), SHOAL_EINVAL);
    assert_null(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_parse),
        cmocka_unit_test(test_url_resolve),
        cmocka_unit_test(test_same_origin),
        cmocka_unit_test(test_client_new),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
