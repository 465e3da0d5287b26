/* test_manifest.c — common/manifest.h: building, invariants, and a strict
 * binary codec (every truncation and every flipped byte is refused). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/manifest.h"

static manifest *sample(void)
{
    manifest *m = manifest_new();
    manifest_tensor t;
    uint32_t f0, f1;
    assert_non_null(m);
    assert_int_equal(manifest_set_model(m, "https://huggingface.co", "org/m", "main",
                                        "0123456789abcdef0123456789abcdef01234567", NULL), 0);
    assert_int_equal(manifest_set_config(m, "{\"a\":1}", 7, NULL), 0);
    assert_int_equal(manifest_file_add(m, "model-00001-of-000002.safetensors", "e1", 10000, &f0,
                                       NULL), 0);
    assert_int_equal(manifest_file_add(m, "sub/model-00002-of-000002.safetensors", "e2", 5000,
                                       &f1, NULL), 0);
    memset(&t, 0, sizeof t);
    t.name = "model.norm.weight";
    t.file = f1;
    t.offset = 100;
    t.length = 512;
    snprintf(t.dtype, sizeof t.dtype, "BF16");
    t.ndim = 1;
    t.shape[0] = 256;
    t.is_spine = 1;
    assert_int_equal(manifest_tensor_add(m, &t, NULL), 0);
    t.name = "lm_head.weight";
    t.offset = 612;
    t.length = 1024;
    t.ndim = 2;
    t.shape[0] = 2;
    t.shape[1] = 256;
    assert_int_equal(manifest_tensor_add(m, &t, NULL), 0);
    m->n_layers = 4;
    m->experts_per_layer = 8;
    m->expert_bytes = 1000;
    assert_int_equal(manifest_expert_add(m, 2, 5, f0, 3000, NULL), 0);
    assert_int_equal(manifest_expert_add(m, 1, 7, f0, 1000, NULL), 0);
    assert_int_equal(manifest_expert_add(m, 1, 0, f0, 2000, NULL), 0);
    assert_int_equal(manifest_finish(m, NULL), 0);
    return m;
}

static void test_roundtrip(void **state)
{
    manifest *m = sample(), *d = NULL;
    shoal_buf b;
    const manifest_expert *e;
    const manifest_tensor *t;
    (void)state;
    shoal_buf_init(&b, 0);
    assert_int_equal(manifest_encode(m, &b, NULL), 0);
    assert_int_equal(manifest_decode(b.data, b.len, &d, NULL), 0);
    assert_string_equal(d->commit, m->commit);
    assert_string_equal(d->repo, "org/m");
    assert_int_equal(d->config_len, 7);
    assert_memory_equal(d->config, "{\"a\":1}", 7);
    assert_int_equal(d->nfiles, 2);
    assert_string_equal(d->files[1].path, "sub/model-00002-of-000002.safetensors");
    assert_int_equal(d->ntensors, 2);
    assert_string_equal(d->tensors[0].name, "lm_head.weight");   /* sorted */
    t = manifest_tensor_find(d, "language_model.model.norm.weight");
    assert_non_null(t);
    assert_int_equal(t->offset, 100);
    assert_string_equal(t->dtype, "BF16");
    assert_int_equal(t->shape[0], 256);
    assert_null(manifest_tensor_find(d, "nope"));
    assert_int_equal(d->nexperts, 3);
    assert_int_equal(d->experts[0].layer, 1);
    assert_int_equal(d->experts[0].id, 0);
    e = manifest_expert_find(d, 2, 5);
    assert_non_null(e);
    assert_int_equal(e->offset, 3000);
    assert_null(manifest_expert_find(d, 2, 6));
    manifest_free(d);
    manifest_free(m);
    shoal_buf_free(&b);
}

static void test_truncation_and_flips(void **state)
{
    manifest *m = sample(), *d = NULL;
    shoal_buf b;
    shoal_err err;
    (void)state;
    shoal_buf_init(&b, 0);
    assert_int_equal(manifest_encode(m, &b, NULL), 0);
    for (size_t n = 0; n < b.len; n++) {
        assert_int_not_equal(manifest_decode(b.data, n, &d, &err), 0);
        assert_null(d);
    }
    for (size_t i = 0; i < b.len; i++) {
        b.data[i] ^= 0x41;
        assert_int_not_equal(manifest_decode(b.data, b.len, &d, &err), 0);
        assert_null(d);
        b.data[i] ^= 0x41;
    }
    b.data[8] = 2;   /* another version */
    assert_int_equal(manifest_decode(b.data, b.len, &d, &err), SHOAL_EUNSUPPORTED);
    manifest_free(m);
    shoal_buf_free(&b);
}

static void test_paths(void **state)
{
    manifest *m = manifest_new();
    shoal_err err;
    (void)state;
    assert_int_equal(manifest_path_check("a/b.safetensors", NULL), 0);
    assert_int_equal(manifest_path_check("../x", &err), SHOAL_EFORMAT);
    assert_int_equal(manifest_path_check("a/../x", NULL), SHOAL_EFORMAT);
    assert_int_equal(manifest_path_check("/etc/passwd", NULL), SHOAL_EFORMAT);
    assert_int_equal(manifest_path_check("a//b", NULL), SHOAL_EFORMAT);
    assert_int_equal(manifest_path_check("./a", NULL), SHOAL_EFORMAT);
    assert_int_equal(manifest_path_check("a\\b", NULL), SHOAL_EFORMAT);
    assert_int_equal(manifest_path_check("a\nb", NULL), SHOAL_EFORMAT);
    assert_int_equal(manifest_path_check("\xc3\x28", NULL), SHOAL_EFORMAT);   /* bad UTF-8 */
    assert_int_equal(manifest_path_check("", NULL), SHOAL_EFORMAT);
    assert_int_equal(manifest_file_add(m, "x", "e", 1, NULL, NULL), 0);
    assert_int_equal(manifest_file_add(m, "x", "e", 1, NULL, NULL), SHOAL_EEXIST);
    assert_int_equal(manifest_file_add(m, "../y", "e", 1, NULL, NULL), SHOAL_EFORMAT);
    assert_int_equal(manifest_file_add(m, "y", "", 1, NULL, NULL), SHOAL_EFORMAT);
    manifest_free(m);
}

static void test_invariants(void **state)
{
    manifest *m;
    shoal_err err;
    (void)state;
    /* overlapping expert spans */
    m = sample();
    assert_int_equal(manifest_expert_add(m, 3, 0, 0, 1500, NULL), 0);
    assert_int_equal(manifest_finish(m, &err), SHOAL_EFORMAT);
    assert_non_null(strstr(err.msg, "overlap"));
    manifest_free(m);
    /* expert past the end of its file */
    m = sample();
    assert_int_equal(manifest_expert_add(m, 3, 0, 0, 9500, NULL), 0);
    assert_int_equal(manifest_finish(m, &err), SHOAL_ERANGE);
    manifest_free(m);
    /* expert outside the config's layers */
    m = sample();
    assert_int_equal(manifest_expert_add(m, 4, 0, 0, 5000, NULL), 0);
    assert_int_equal(manifest_finish(m, &err), SHOAL_ERANGE);
    manifest_free(m);
    /* the same expert twice */
    m = sample();
    assert_int_equal(manifest_expert_add(m, 1, 7, 0, 6000, NULL), 0);
    assert_int_equal(manifest_finish(m, &err), SHOAL_EFORMAT);
    manifest_free(m);
    /* a tensor past the end, a bad dtype, a duplicate name */
    m = sample();
    m->tensors[0].length = 1u << 20;
    assert_int_equal(manifest_check(m, &err), SHOAL_ERANGE);
    m->tensors[0].length = 16;
    snprintf(m->tensors[0].dtype, sizeof m->tensors[0].dtype, "bf16");
    assert_int_equal(manifest_check(m, &err), SHOAL_EFORMAT);
    snprintf(m->tensors[0].dtype, sizeof m->tensors[0].dtype, "BF16");
    free(m->tensors[1].name);
    m->tensors[1].name = strdup(m->tensors[0].name);
    assert_int_equal(manifest_check(m, &err), SHOAL_EFORMAT);
    manifest_free(m);
    /* a stored name that kept the language_model. prefix lookups strip */
    m = sample();
    assert_int_equal(manifest_finish(m, &err), 0);
    manifest_free(m);
    m = sample();
    free(m->tensors[1].name);
    m->tensors[1].name = strdup("language_model.lm_head.weight");
    assert_int_equal(manifest_finish(m, &err), SHOAL_EFORMAT);
    assert_non_null(strstr(err.msg, "prefix"));
    manifest_free(m);
    /* no commit */
    m = sample();
    assert_int_equal(manifest_set_model(m, "", "r", "main", "", NULL), 0);
    assert_int_equal(manifest_check(m, &err), SHOAL_EFORMAT);
    manifest_free(m);
    manifest_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_truncation_and_flips),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_invariants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
