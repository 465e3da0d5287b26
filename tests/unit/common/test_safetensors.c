/* test_safetensors.c — the safetensors header parser: valid headers, and
 * every hostile header it must refuse, with the right code and a message
 * that names the tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/safetensors.h"

/* Parse `json` as the header of a file whose data are `data_size` bytes
 * (plus `extra`, which may be negative to cut the file short). */
static int parse_sized(const char *json, uint64_t data_size, int64_t extra, st_file **out,
                       shoal_err *err)
{
    size_t n = strlen(json);
    uint64_t file_size = 8 + n + data_size + (uint64_t)extra;
    shoal_err_clear(err);
    return st_parse((const uint8_t *)json, n, file_size, out, err);
}

/* Expect a refusal with `code` and a message containing `needle`. */
static void refuse(const char *json, uint64_t data_size, int code, const char *needle)
{
    st_file *f = (st_file *)1;
    shoal_err err;
    int rc = parse_sized(json, data_size, 0, &f, &err);
    if (rc != code || !strstr(err.msg, needle))
        print_error("header %s\n  -> %s (%d) \"%s\"; wanted %s with \"%s\"\n", json,
                    shoal_err_name(rc), rc, err.msg, shoal_err_name(code), needle);
    assert_int_equal(rc, code);
    assert_non_null(strstr(err.msg, needle));
    assert_null(f);
}

static void test_valid_basic(void **state)
{
    (void)state;
    /* Out of order in the JSON, contiguous once sorted by offset. */
    const char *json = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]},"
                       "\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}";
    st_file *f = NULL;
    shoal_err err;
    assert_int_equal(parse_sized(json, 32, 0, &f, &err), 0);
    assert_int_equal(st_count(f), 2);
    uint64_t base = 8 + strlen(json);
    assert_int_equal(st_data_offset(f), base);
    assert_int_equal(st_data_size(f), 32);
    const st_tensor *a = st_at(f, 0), *b = st_at(f, 1);
    assert_string_equal(a->name, "a");
    assert_int_equal(a->dtype, ST_BF16);
    assert_int_equal(a->ndim, 1);
    assert_int_equal(a->shape[0], 4);
    assert_int_equal(a->numel, 4);
    assert_int_equal(a->begin, base);
    assert_int_equal(a->end, base + 8);
    assert_string_equal(b->name, "b");
    assert_int_equal(b->dtype, ST_F32);
    assert_int_equal(b->ndim, 2);
    assert_int_equal(b->shape[1], 3);
    assert_int_equal(b->numel, 6);
    assert_int_equal(b->begin, base + 8);
    assert_int_equal(b->end, base + 32);
    assert_null(st_at(f, 2));
    assert_ptr_equal(st_find(f, "b"), b);
    assert_ptr_equal(st_find(f, "a"), a);
    assert_null(st_find(f, "c"));
    assert_null(st_find(f, ""));
    assert_int_equal(st_metadata_count(f), 0);
    assert_null(st_metadata_get(f, "format"));
    st_free(f);
    st_free(NULL);
}

static void test_valid_scalar_zero_size_padding(void **state)
{
    (void)state;
    /* Leading whitespace, trailing space padding, a scalar, zero-size
     * tensors (one at the very end, one between two others). */
    const char *json = " \n\t{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
                       "\"z\":{\"dtype\":\"U8\",\"shape\":[0,5],\"data_offsets\":[8,8]},"
                       "\"y\":{\"dtype\":\"I16\",\"shape\":[3],\"data_offsets\":[8,14]},"
                       "\"zz\":{\"dtype\":\"F4\",\"shape\":[0],\"data_offsets\":[14,14]}}      ";
    st_file *f = NULL;
    shoal_err err;
    assert_int_equal(parse_sized(json, 14, 0, &f, &err), 0);
    assert_int_equal(st_count(f), 4);
    const st_tensor *s = st_find(f, "s");
    assert_non_null(s);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->numel, 1);
    assert_int_equal(s->end - s->begin, 8);
    /* File order: s, then the zero-size z before y at the same offset. */
    assert_string_equal(st_at(f, 0)->name, "s");
    assert_string_equal(st_at(f, 1)->name, "z");
    assert_string_equal(st_at(f, 2)->name, "y");
    assert_string_equal(st_at(f, 3)->name, "zz");
    assert_int_equal(st_at(f, 1)->numel, 0);
    assert_int_equal(st_at(f, 1)->begin, st_at(f, 1)->end);
    st_free(f);
}

static void test_valid_metadata_and_subbyte(void **state)
{
    (void)state;
    const char *json = "{\"__metadata__\":{\"format\":\"pt\",\"a\":\"1\"},"
                       "\"f4\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[0,3]},"
                       "\"f6\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[3,6]}}";
    st_file *f = NULL;
    shoal_err err;
    const char *k, *v;
    assert_int_equal(parse_sized(json, 6, 0, &f, &err), 0);
    assert_int_equal(st_count(f), 2);
    assert_int_equal(st_metadata_count(f), 2);
    assert_int_equal(st_metadata_at(f, 0, &k, &v), 0);
    assert_string_equal(k, "a");
    assert_string_equal(v, "1");
    assert_int_equal(st_metadata_at(f, 1, &k, &v), 0);
    assert_string_equal(k, "format");
    assert_string_equal(v, "pt");
    assert_int_equal(st_metadata_at(f, 2, &k, &v), SHOAL_ERANGE);
    assert_string_equal(st_metadata_get(f, "format"), "pt");
    assert_null(st_find(f, "__metadata__"));
    st_free(f);

    /* null metadata is allowed (serde reads it as "absent"). */
    json = "{\"__metadata__\":null,\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    assert_int_equal(parse_sized(json, 1, 0, &f, &err), 0);
    assert_int_equal(st_metadata_count(f), 0);
    st_free(f);

    /* No tensors at all: an empty file body. */
    assert_int_equal(parse_sized("{}", 0, 0, &f, &err), 0);
    assert_int_equal(st_count(f), 0);
    st_free(f);
}

static void test_dtypes(void **state)
{
    (void)state;
    static const struct { const char *name; unsigned bits; } all[] = {
        { "F64", 64 }, { "I64", 64 }, { "U64", 64 }, { "C64", 64 }, { "F32", 32 },
        { "I32", 32 }, { "U32", 32 }, { "F16", 16 }, { "BF16", 16 }, { "I16", 16 },
        { "U16", 16 }, { "I8", 8 }, { "U8", 8 }, { "BOOL", 8 }, { "F8_E4M3", 8 },
        { "F8_E5M2", 8 }, { "F8_E8M0", 8 }, { "F8_E4M3FNUZ", 8 }, { "F8_E5M2FNUZ", 8 },
        { "F6_E2M3", 6 }, { "F6_E3M2", 6 }, { "F4", 4 },
    };
    assert_int_equal(sizeof all / sizeof all[0], ST_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        st_dtype t = ST_DTYPE_COUNT;
        assert_int_equal(st_dtype_parse(all[i].name, &t), 0);
        assert_string_equal(st_dtype_name(t), all[i].name);
        assert_int_equal(st_dtype_bits(t), all[i].bits);
    }
    st_dtype t = ST_U8;
    assert_int_equal(st_dtype_parse("bf16", &t), SHOAL_EUNSUPPORTED);
    assert_int_equal(st_dtype_parse("F8", &t), SHOAL_EUNSUPPORTED);
    assert_int_equal(t, ST_U8);
    assert_string_equal(st_dtype_name(ST_DTYPE_COUNT), "?");
    assert_int_equal(st_dtype_bits(ST_DTYPE_COUNT), 0);
}

static void test_header_len(void **state)
{
    (void)state;
    uint8_t b[8];
    uint64_t n = 0;
    shoal_err err;

    shoal_wr_le64(b, 1000);
    assert_int_equal(st_header_len(b, 2000, &n, &err), 0);
    assert_int_equal(n, 1000);
    assert_int_equal(st_header_len(b, 1008, &n, &err), 0);    /* empty data */
    assert_int_equal(st_header_len(b, 1007, &n, &err), SHOAL_ERANGE);
    assert_non_null(strstr(err.msg, "past the end"));
    assert_int_equal(st_header_len(b, ST_SIZE_UNKNOWN, &n, &err), 0);
    shoal_wr_le64(b, ST_HEADER_MAX);
    assert_int_equal(st_header_len(b, ST_SIZE_UNKNOWN, &n, &err), 0);
    shoal_wr_le64(b, ST_HEADER_MAX + 1);
    n = 7;
    assert_int_equal(st_header_len(b, ST_SIZE_UNKNOWN, &n, &err), SHOAL_ETOOBIG);
    assert_int_equal(n, 7);
    shoal_wr_le64(b, UINT64_MAX);
    assert_int_equal(st_header_len(b, UINT64_MAX - 1, &n, &err), SHOAL_ETOOBIG);
}

static void test_refuse_framing(void **state)
{
    (void)state;
    st_file *f = (st_file *)1;
    shoal_err err;
    const char *ok = "{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";

    refuse("[1,2]", 0, SHOAL_EFORMAT, "start with '{'");
    refuse("  x{}", 0, SHOAL_EFORMAT, "start with '{'");
    refuse("", 0, SHOAL_EFORMAT, "start with '{'");
    refuse("    ", 0, SHOAL_EFORMAT, "start with '{'");
    refuse("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},}", 1, SHOAL_EFORMAT,
           "not valid JSON");
    refuse("{} {}", 0, SHOAL_EFORMAT, "not valid JSON");
    /* Invalid UTF-8 in a name. */
    refuse("{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
           SHOAL_EFORMAT, "not valid JSON");
    /* An escaped NUL would make a name that C cannot hold. */
    refuse("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
           SHOAL_EFORMAT, "not valid JSON");
    /* NUL padding is not whitespace. */
    {
        char buf[80];
        size_t n = strlen(ok);
        memcpy(buf, ok, n);
        memset(buf + n, 0, 8);
        f = (st_file *)1;
        assert_int_equal(st_parse((const uint8_t *)buf, n + 8, 8 + n + 8 + 1, &f, &err),
                         SHOAL_EFORMAT);
        assert_null(f);
    }
    /* The JSON itself longer than the file. */
    assert_int_equal(st_parse((const uint8_t *)ok, strlen(ok), strlen(ok) + 7, &f, &err),
                     SHOAL_ERANGE);
    assert_null(f);
    /* Data past the end of the file, and trailing bytes after the data. */
    assert_int_equal(parse_sized(ok, 1, -1, &f, &err), SHOAL_ERANGE);
    assert_non_null(strstr(err.msg, "'t'"));
    assert_non_null(strstr(err.msg, "past the end"));
    assert_int_equal(parse_sized(ok, 1, 3, &f, &err), SHOAL_ERANGE);
    assert_non_null(strstr(err.msg, "3 bytes after"));
    /* Size unknown: the end checks are skipped. */
    assert_int_equal(st_parse((const uint8_t *)ok, strlen(ok), ST_SIZE_UNKNOWN, &f, &err), 0);
    st_free(f);
}

static void test_refuse_entries(void **state)
{
    (void)state;
    refuse("{\"w.x\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
           SHOAL_EUNSUPPORTED, "'w.x': unknown dtype 'Q4'");
    refuse("{\"neg\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0,
           SHOAL_EFORMAT, "'neg': dimension 0");
    refuse("{\"real\":{\"dtype\":\"U8\",\"shape\":[1,2.0],\"data_offsets\":[0,2]}}", 2,
           SHOAL_EFORMAT, "'real': dimension 1");
    refuse("{\"str\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2,
           SHOAL_EFORMAT, "'str': dimension 0");
    refuse("{\"nine\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
           1, SHOAL_EFORMAT, "'nine': 9 dimensions");
    /* Eight dimensions are fine. */
    {
        st_file *f = NULL;
        shoal_err err;
        assert_int_equal(parse_sized("{\"eight\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,2],"
                                     "\"data_offsets\":[0,2]}}", 2, 0, &f, &err), 0);
        assert_int_equal(st_at(f, 0)->ndim, 8);
        st_free(f);
    }
    refuse("{\"big\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],"
           "\"data_offsets\":[0,0]}}", 0, SHOAL_ERANGE, "'big': shape overflows");
    refuse("{\"bytes\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
           "\"data_offsets\":[0,0]}}", 0, SHOAL_ERANGE, "'bytes': byte size overflows");
    refuse("{\"sz\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 4,
           SHOAL_EFORMAT, "'sz': data_offsets span 4 bytes");
    refuse("{\"sub\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
           SHOAL_EFORMAT, "'sub': 3 F4 elements do not end on a byte boundary");
    refuse("{\"sub6\":{\"dtype\":\"F6_E3M2\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
           SHOAL_EFORMAT, "'sub6'");
    refuse("{\"rev\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 0,
           SHOAL_EFORMAT, "'rev': data_offsets must be");
    refuse("{\"one\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0]}}", 0,
           SHOAL_EFORMAT, "'one': data_offsets must be");
    refuse("{\"negoff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 0,
           SHOAL_EFORMAT, "'negoff'");
    refuse("{\"nodt\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, SHOAL_EFORMAT, "'nodt'");
    refuse("{\"noshape\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, SHOAL_EFORMAT,
           "'noshape'");
    refuse("{\"arr\":[1,2]}", 0, SHOAL_EFORMAT, "'arr': entry is not an object");
    refuse("{\"__metadata__\":{\"k\":1}}", 0, SHOAL_EFORMAT, "__metadata__ value of 'k'");
    refuse("{\"__metadata__\":[\"k\"]}", 0, SHOAL_EFORMAT, "__metadata__ is not an object");
}

static void test_refuse_layout(void **state)
{
    (void)state;
    /* Not starting at 0. */
    refuse("{\"late\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4,
           SHOAL_EFORMAT, "'late': data begin at 2, leaving a hole after offset 0");
    /* A hole between two tensors. */
    refuse("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}", 5,
           SHOAL_EFORMAT, "'b': data begin at 3");
    /* Overlap. */
    refuse("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6,
           SHOAL_EFORMAT, "'b': data_offsets [2, 6) overlap tensor 'a'");
    /* Two tensors on the same bytes. */
    refuse("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"b\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4,
           SHOAL_EFORMAT, "'b': data_offsets [0, 4) overlap tensor 'a'");
    /* A zero-size tensor past the data end is a hole too. */
    refuse("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[9,9]}}", 4,
           SHOAL_EFORMAT, "'z': data begin at 9");
    /* Duplicate names: top level, long names, and a key repeated inside an entry. */
    refuse("{\"language_model.model.layers.0.input_layernorm.weight\":"
           "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
           "\"x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
           "\"language_model.model.layers.0.input_layernorm.weight\":"
           "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, SHOAL_EFORMAT,
           "duplicate tensor name 'language_model.model.layers.0.input_layernorm.weight'");
    refuse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
           "\"\\u0061\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2,
           SHOAL_EFORMAT, "duplicate tensor name 'a'");
    refuse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
           "\"b,\\\"{\":{\"dtype\":\"U8\",\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
           2, SHOAL_EFORMAT, "duplicate key inside the entry of tensor 'b,\"{'");
}

static void test_read_file(void **state)
{
    (void)state;
    char path[] = "/tmp/shoal-test-st-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}";
    shoal_buf b;
    shoal_buf_init(&b, 0);
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    assert_int_equal(shoal_buf_append_le64(&b, padded), 0);
    assert_int_equal(shoal_buf_append(&b, json, n), 0);
    for (size_t i = n; i < padded; i++)
        assert_int_equal(shoal_buf_append_u8(&b, ' '), 0);
    assert_int_equal(shoal_buf_append(&b, "01234567", 8), 0);
    assert_int_equal(write(fd, b.data, b.len), (ssize_t)b.len);

    st_file *f = NULL;
    shoal_err err;
    assert_int_equal(st_read_file(path, &f, &err), 0);
    assert_int_equal(st_count(f), 1);
    assert_int_equal(st_at(f, 0)->begin, 8 + padded);
    assert_int_equal(st_at(f, 0)->end, b.len);
    assert_string_equal(st_metadata_get(f, "format"), "pt");
    st_free(f);

    /* One byte short: the tensor's data run past the end. */
    assert_int_equal(ftruncate(fd, (off_t)b.len - 1), 0);
    assert_int_equal(st_read_file(path, &f, &err), SHOAL_ERANGE);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "'w'"));
    assert_null(f);
    /* Cut inside the header, and inside the length prefix. */
    assert_int_equal(ftruncate(fd, 20), 0);
    assert_int_equal(st_read_fd(fd, &f, &err), SHOAL_ERANGE);
    assert_int_equal(ftruncate(fd, 5), 0);
    assert_int_equal(st_read_fd(fd, &f, &err), SHOAL_ERANGE);
    /* A header length past the cap is refused before any allocation. */
    uint8_t huge[8];
    shoal_wr_le64(huge, ST_HEADER_MAX + 1);
    assert_int_equal(pwrite(fd, huge, 8, 0), 8);
    assert_int_equal(st_read_fd(fd, &f, &err), SHOAL_ETOOBIG);
    close(fd);
    unlink(path);
    shoal_buf_free(&b);

    assert_int_equal(st_read_file("/nonexistent/x.safetensors", &f, &err), SHOAL_ENOTFOUND);
    assert_null(f);
}

/* A header of many tensors in scrambled JSON order: file order, lookup. */
static void test_many(void **state)
{
    (void)state;
    enum { N = 500 };
    shoal_buf b;
    st_file *f = NULL;
    shoal_err err;
    /* Sizes: tensor i has i%3 floats; offsets are cumulative in id order. */
    shoal_buf_init(&b, 0);
    uint64_t off[N + 1];
    off[0] = 0;
    for (int i = 0; i < N; i++)
        off[i + 1] = off[i] + 4 * (uint64_t)(i % 3);
    assert_int_equal(shoal_buf_append_str(&b, "{"), 0);
    for (int k = 0; k < N; k++) {
        int i = (k * 7919) % N;    /* a permutation of 0..N-1 */
        assert_int_equal(shoal_buf_appendf(&b, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[%d],"
                                           "\"data_offsets\":[%llu,%llu]}", k ? "," : "", i,
                                           i % 3, (unsigned long long)off[i],
                                           (unsigned long long)off[i + 1]), 0);
    }
    assert_int_equal(shoal_buf_append_str(&b, "}"), 0);
    assert_int_equal(st_parse(b.data, b.len, 8 + b.len + off[N], &f, &err), 0);
    assert_int_equal(st_count(f), N);
    for (size_t i = 1; i < st_count(f); i++)
        assert_true(st_at(f, i - 1)->end == st_at(f, i)->begin);
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        const st_tensor *t = st_find(f, name);
        assert_non_null(t);
        assert_int_equal(t->begin - st_data_offset(f), off[i]);
    }
    st_free(f);
    shoal_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_basic),
        cmocka_unit_test(test_valid_scalar_zero_size_padding),
        cmocka_unit_test(test_valid_metadata_and_subbyte),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_header_len),
        cmocka_unit_test(test_refuse_framing),
        cmocka_unit_test(test_refuse_entries),
        cmocka_unit_test(test_refuse_layout),
        cmocka_unit_test(test_read_file),
        cmocka_unit_test(test_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
