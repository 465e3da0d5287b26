/* json.c — the shoal_json layer over jansson.  shoal_json* is a json_t*. */
#include "common/json.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define J(x)  ((json_t *)(x))
#define SJ(x) ((shoal_json *)(x))

shoal_json *shoal_json_parse(const char *text, size_t len, shoal_err *err)
{
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        shoal_err_set(err, SHOAL_EFORMAT, "invalid JSON at line %d column %d: %s",
                      je.line, je.column, je.text);
    return SJ(j);
}

shoal_json *shoal_json_load_file(const char *path, size_t max_bytes, shoal_err *err)
{
    FILE *f = fopen(path, "rb");
    shoal_buf b;
    char chunk[65536];
    size_t n;
    shoal_json *j = NULL;

    if (!f) {
        shoal_err_set(err, shoal_err_from_errno(errno), "%s: %s", path, strerror(errno));
        return NULL;
    }
    shoal_buf_init(&b, max_bytes);
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        int rc = shoal_buf_append(&b, chunk, n);
        if (rc) {
            shoal_err_set(err, rc, "%s: larger than %zu bytes", path, max_bytes);
            goto out;
        }
    }
    if (ferror(f)) {
        shoal_err_set(err, SHOAL_EIO, "%s: read error", path);
        goto out;
    }
    j = shoal_json_parse((const char *)b.data, b.len, err);
    if (!j)
        shoal_err_wrap(err, SHOAL_EFORMAT, "%s", path);
out:
    fclose(f);
    shoal_buf_free(&b);
    return j;
}

void shoal_json_free(shoal_json *j) { json_decref(J(j)); }

shoal_json_type shoal_json_typeof(const shoal_json *j)
{
    switch (json_typeof(J(j))) {
    case JSON_OBJECT:  return SHOAL_JSON_OBJECT;
    case JSON_ARRAY:   return SHOAL_JSON_ARRAY;
    case JSON_STRING:  return SHOAL_JSON_STRING;
    case JSON_INTEGER: return SHOAL_JSON_INT;
    case JSON_REAL:    return SHOAL_JSON_REAL;
    case JSON_TRUE:
    case JSON_FALSE:   return SHOAL_JSON_BOOL;
    default:           return SHOAL_JSON_NULL;
    }
}

shoal_json *shoal_json_get(const shoal_json *obj, const char *key)
{
    if (!obj || !json_is_object(J(obj)))
        return NULL;
    return SJ(json_object_get(J(obj), key));
}

shoal_json *shoal_json_path(const shoal_json *root, const char *path)
{
    char key[256];
    const char *p = path;
    const shoal_json *cur = root;

    while (cur && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof key)
            return NULL;
        memcpy(key, p, n);
        key[n] = '\0';
        cur = shoal_json_get(cur, key);
        p += n + (dot ? 1 : 0);
    }
    return SJ(cur);
}

static json_t *json_need(const shoal_json *root, const char *path, shoal_err *err)
{
    shoal_json *v = shoal_json_path(root, path);
    if (!v)
        shoal_err_set(err, SHOAL_ENOTFOUND, "missing key \"%s\"", path);
    return J(v);
}

int shoal_json_int(const shoal_json *root, const char *path, int64_t *out, shoal_err *err)
{
    json_t *v = json_need(root, path, err);
    if (!v)
        return SHOAL_ENOTFOUND;
    if (!json_is_integer(v))
        return shoal_err_set(err, SHOAL_EFORMAT, "\"%s\" must be an integer", path);
    *out = (int64_t)json_integer_value(v);
    return 0;
}

int shoal_json_num(const shoal_json *root, const char *path, double *out, shoal_err *err)
{
    json_t *v = json_need(root, path, err);
    if (!v)
        return SHOAL_ENOTFOUND;
    if (!json_is_number(v))
        return shoal_err_set(err, SHOAL_EFORMAT, "\"%s\" must be a number", path);
    *out = json_number_value(v);
    return 0;
}

int shoal_json_bool(const shoal_json *root, const char *path, int *out, shoal_err *err)
{
    json_t *v = json_need(root, path, err);
    if (!v)
        return SHOAL_ENOTFOUND;
    if (!json_is_boolean(v))
        return shoal_err_set(err, SHOAL_EFORMAT, "\"%s\" must be true or false", path);
    *out = json_is_true(v);
    return 0;
}

int shoal_json_str(const shoal_json *root, const char *path, const char **out, shoal_err *err)
{
    json_t *v = json_need(root, path, err);
    if (!v)
        return SHOAL_ENOTFOUND;
    if (!json_is_string(v))
        return shoal_err_set(err, SHOAL_EFORMAT, "\"%s\" must be a string", path);
    *out = json_string_value(v);
    return 0;
}

int shoal_json_int_array(const shoal_json *root, const char *path, int64_t *out,
                         size_t cap, size_t *n, shoal_err *err)
{
    json_t *v = json_need(root, path, err);
    size_t i;
    if (!v)
        return SHOAL_ENOTFOUND;
    if (!json_is_array(v))
        return shoal_err_set(err, SHOAL_EFORMAT, "\"%s\" must be an array", path);
    if (json_array_size(v) > cap)
        return shoal_err_set(err, SHOAL_ETOOBIG, "\"%s\" has %zu entries, at most %zu allowed",
                             path, json_array_size(v), cap);
    for (i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return shoal_err_set(err, SHOAL_EFORMAT, "\"%s\"[%zu] must be an integer", path, i);
        out[i] = (int64_t)json_integer_value(e);
    }
    *n = i;
    return 0;
}

int64_t shoal_json_int_value(const shoal_json *j) { return (int64_t)json_integer_value(J(j)); }
double shoal_json_num_value(const shoal_json *j) { return json_number_value(J(j)); }
const char *shoal_json_str_value(const shoal_json *j) { return json_string_value(J(j)); }
size_t shoal_json_str_len(const shoal_json *j) { return json_string_length(J(j)); }
size_t shoal_json_array_size(const shoal_json *arr) { return json_array_size(J(arr)); }
shoal_json *shoal_json_array_at(const shoal_json *arr, size_t i) { return SJ(json_array_get(J(arr), i)); }
size_t shoal_json_object_size(const shoal_json *obj) { return json_object_size(J(obj)); }

int shoal_json_object_foreach(const shoal_json *obj, shoal_json_member_fn fn, void *ctx)
{
    const char *key;
    json_t *value;
    if (!json_is_object(J(obj)))
        return 0;
    json_object_foreach(J(obj), key, value) {
        int rc = fn(key, SJ(value), ctx);
        if (rc)
            return rc;
    }
    return 0;
}

shoal_json *shoal_json_object(void) { return SJ(json_object()); }
shoal_json *shoal_json_array(void) { return SJ(json_array()); }
shoal_json *shoal_json_new_int(int64_t v) { return SJ(json_integer((json_int_t)v)); }
shoal_json *shoal_json_new_num(double v) { return SJ(json_real(v)); }
shoal_json *shoal_json_new_str(const char *s) { return SJ(json_string(s)); }
shoal_json *shoal_json_new_strn(const char *s, size_t n) { return SJ(json_stringn(s, n)); }
shoal_json *shoal_json_new_bool(int v) { return SJ(json_boolean(v)); }
shoal_json *shoal_json_new_null(void) { return SJ(json_null()); }

int shoal_json_set_take(shoal_json *obj, const char *key, shoal_json *value)
{
    if (!value)
        return SHOAL_ENOMEM;
    return json_object_set_new(J(obj), key, J(value)) ? SHOAL_ENOMEM : 0;
}

int shoal_json_append_take(shoal_json *arr, shoal_json *value)
{
    if (!value)
        return SHOAL_ENOMEM;
    return json_array_append_new(J(arr), J(value)) ? SHOAL_ENOMEM : 0;
}

int shoal_json_set_int(shoal_json *obj, const char *key, int64_t v)
{
    return shoal_json_set_take(obj, key, shoal_json_new_int(v));
}

int shoal_json_set_num(shoal_json *obj, const char *key, double v)
{
    return shoal_json_set_take(obj, key, shoal_json_new_num(v));
}

int shoal_json_set_str(shoal_json *obj, const char *key, const char *s)
{
    return shoal_json_set_take(obj, key, shoal_json_new_str(s));
}

int shoal_json_set_bool(shoal_json *obj, const char *key, int v)
{
    return shoal_json_set_take(obj, key, shoal_json_new_bool(v));
}

static int dump_cb(const char *buffer, size_t size, void *data)
{
    return shoal_buf_append((shoal_buf *)data, buffer, size) ? -1 : 0;
}

int shoal_json_dump(const shoal_json *j, int flags, shoal_buf *out)
{
    size_t jf = JSON_ENCODE_ANY | JSON_REAL_PRECISION(17);
    if (flags & SHOAL_JSON_PRETTY)
        jf |= JSON_INDENT(2);
    else
        jf |= JSON_COMPACT;
    if (flags & SHOAL_JSON_SORTED)
        jf |= JSON_SORT_KEYS;
    return json_dump_callback(J(j), dump_cb, out, jf) ? SHOAL_ENOMEM : 0;
}
