/* safetensors.c — the strict safetensors header parser (see safetensors.h).
 *
 * Owns: turning header bytes into an st_file and every validation rule
 * listed in the header.  jansson is used here only; no jansson type leaves
 * this file.  Does not read tensor data.
 */
#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/sys.h"

struct st_file {
    st_tensor *tensors;      /* [count], in file order */
    size_t     count;
    st_tensor **by_name;     /* [count], into tensors, sorted by name */
    char     **meta_keys;    /* [meta_count], sorted */
    char     **meta_values;
    size_t     meta_count;
    uint64_t   data_offset;  /* 8 + N */
    uint64_t   data_size;
};

static const struct { const char *name; unsigned bits; } dtype_table[ST_DTYPE_COUNT] = {
    [ST_F64] = { "F64", 64 }, [ST_I64] = { "I64", 64 }, [ST_U64] = { "U64", 64 },
    [ST_C64] = { "C64", 64 },
    [ST_F32] = { "F32", 32 }, [ST_I32] = { "I32", 32 }, [ST_U32] = { "U32", 32 },
    [ST_F16] = { "F16", 16 }, [ST_BF16] = { "BF16", 16 }, [ST_I16] = { "I16", 16 },
    [ST_U16] = { "U16", 16 },
    [ST_I8] = { "I8", 8 }, [ST_U8] = { "U8", 8 }, [ST_BOOL] = { "BOOL", 8 },
    [ST_F8_E4M3] = { "F8_E4M3", 8 }, [ST_F8_E5M2] = { "F8_E5M2", 8 },
    [ST_F8_E8M0] = { "F8_E8M0", 8 }, [ST_F8_E4M3FNUZ] = { "F8_E4M3FNUZ", 8 },
    [ST_F8_E5M2FNUZ] = { "F8_E5M2FNUZ", 8 },
    [ST_F6_E2M3] = { "F6_E2M3", 6 }, [ST_F6_E3M2] = { "F6_E3M2", 6 },
    [ST_F4] = { "F4", 4 },
};

const char *st_dtype_name(st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? dtype_table[t].name : "?";
}

unsigned st_dtype_bits(st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? dtype_table[t].bits : 0;
}

int st_dtype_parse(const char *name, st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    }
    return SHOAL_EUNSUPPORTED;
}

int st_header_len(const uint8_t first8[8], uint64_t file_size, uint64_t *json_len,
                  shoal_err *err)
{
    uint64_t n = shoal_rd_le64(first8);

    if (n > ST_HEADER_MAX)
        return shoal_err_set(err, SHOAL_ETOOBIG,
                             "safetensors header length %llu exceeds the %llu-byte limit",
                             (unsigned long long)n, (unsigned long long)ST_HEADER_MAX);
    if (file_size != ST_SIZE_UNKNOWN && (file_size < 8 || n > file_size - 8))
        return shoal_err_set(err, SHOAL_ERANGE,
                             "safetensors header of %llu bytes runs past the end of the "
                             "%llu-byte file", (unsigned long long)n,
                             (unsigned long long)file_size);
    *json_len = n;
    return 0;
}

/* ---- naming the duplicate key -------------------------------------------
 * jansson reports a duplicate key without saying which.  The header is
 * otherwise valid JSON when that happens, so a small scan of the top-level
 * keys finds it; a duplicate nested inside an entry is reported by the entry
 * that holds jansson's error position. */

typedef struct key_span { size_t start, end; char *name; } key_span;

static int key_span_cmp(const void *a, const void *b)
{
    return strcmp(((const key_span *)a)->name, ((const key_span *)b)->name);
}

static char *key_decode(const uint8_t *json, const key_span *k)
{
    json_t *s = json_loadb((const char *)json + k->start, k->end - k->start,
                           JSON_DECODE_ANY, NULL);
    char *out = (s && json_is_string(s)) ? strdup(json_string_value(s)) : NULL;
    json_decref(s);
    return out;
}

static int dup_report(const uint8_t *json, size_t len, size_t err_pos, shoal_err *err)
{
    key_span *keys = NULL;
    size_t n = 0, cap = 0, depth = 0, entry = (size_t)-1;
    int expect_key = 0, rc = SHOAL_EFORMAT;

    for (size_t i = 0; i < len; i++) {
        uint8_t c = json[i];
        if (c == '"') {
            size_t start = i++;
            while (i < len && json[i] != '"')
                i += json[i] == '\\' ? 2 : 1;
            if (depth == 1 && expect_key) {
                if (n == cap) {
                    size_t ncap = cap ? cap * 2 : 64;
                    key_span *nk = realloc(keys, ncap * sizeof *nk);
                    if (!nk) { rc = SHOAL_ENOMEM; goto out; }
                    keys = nk;
                    cap = ncap;
                }
                keys[n] = (key_span){ start, i + 1 < len ? i + 1 : len, NULL };
                if (start < err_pos)
                    entry = n;
                n++;
                expect_key = 0;
            }
        } else if (c == '{' || c == '[') {
            if (++depth == 1)
                expect_key = 1;
        } else if (c == '}' || c == ']') {
            depth--;
        } else if (c == ',' && depth == 1) {
            expect_key = 1;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (!(keys[i].name = key_decode(json, &keys[i]))) { rc = SHOAL_ENOMEM; goto out; }
    {
        char *last = entry != (size_t)-1 ? strdup(keys[entry].name) : NULL;
        qsort(keys, n, sizeof *keys, key_span_cmp);
        for (size_t i = 1; i < n; i++) {
            if (strcmp(keys[i - 1].name, keys[i].name) == 0) {
                shoal_err_set(err, SHOAL_EFORMAT, "duplicate tensor name '%s'", keys[i].name);
                free(last);
                goto out;
            }
        }
        shoal_err_set(err, SHOAL_EFORMAT, "duplicate key inside the entry of tensor '%s'",
                      last ? last : "?");
        free(last);
    }
out:
    if (rc == SHOAL_ENOMEM)
        shoal_err_set(err, rc, "out of memory naming a duplicate key");
    for (size_t i = 0; i < n; i++)
        free(keys[i].name);
    free(keys);
    return rc;
}

/* ---- one entry ------------------------------------------------------------ */

static int entry_parse(const char *name, json_t *v, st_tensor *t, shoal_err *err)
{
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offs = json_object_get(v, "data_offsets");
    uint64_t numel = 1, bits, nbits, nbytes;

    if (!json_is_object(v))
        return shoal_err_set(err, SHOAL_EFORMAT, "tensor '%s': entry is not an object", name);
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "tensor '%s': needs a string \"dtype\" and arrays \"shape\" and "
                             "\"data_offsets\"", name);
    if (st_dtype_parse(json_string_value(dt), &t->dtype))
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "tensor '%s': unknown dtype '%s'",
                             name, json_string_value(dt));
    if (json_array_size(shape) > ST_MAX_DIMS)
        return shoal_err_set(err, SHOAL_EFORMAT, "tensor '%s': %zu dimensions (at most %d)",
                             name, json_array_size(shape), ST_MAX_DIMS);
    t->ndim = (unsigned)json_array_size(shape);
    for (unsigned d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(shape, d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "tensor '%s': dimension %u is not a non-negative integer",
                                 name, d);
        t->shape[d] = (uint64_t)json_integer_value(x);
        if (__builtin_mul_overflow(numel, t->shape[d], &numel))
            return shoal_err_set(err, SHOAL_ERANGE, "tensor '%s': shape overflows 64 bits",
                                 name);
    }
    t->numel = numel;
    bits = st_dtype_bits(t->dtype);
    if (__builtin_mul_overflow(numel, bits, &nbits))
        return shoal_err_set(err, SHOAL_ERANGE, "tensor '%s': byte size overflows 64 bits",
                             name);
    if (nbits % 8)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "tensor '%s': %llu %s elements do not end on a byte boundary",
                             name, (unsigned long long)numel, st_dtype_name(t->dtype));
    nbytes = nbits / 8;
    if (json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)) ||
        json_integer_value(json_array_get(offs, 0)) < 0 ||
        json_integer_value(json_array_get(offs, 1)) < json_integer_value(json_array_get(offs, 0)))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "tensor '%s': data_offsets must be [begin, end] with "
                             "0 <= begin <= end", name);
    t->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
    t->end = (uint64_t)json_integer_value(json_array_get(offs, 1));
    if (t->end - t->begin != nbytes)
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "tensor '%s': data_offsets span %llu bytes but %s%s needs %llu",
                             name, (unsigned long long)(t->end - t->begin),
                             st_dtype_name(t->dtype), t->ndim ? " of its shape" : " scalar",
                             (unsigned long long)nbytes);
    return 0;
}

static int metadata_parse(st_file *f, json_t *m, shoal_err *err)
{
    const char *k;
    json_t *v;
    size_t n = 0, cap;

    if (json_is_null(m))
        return 0;
    if (!json_is_object(m))
        return shoal_err_set(err, SHOAL_EFORMAT, "__metadata__ is not an object");
    cap = json_object_size(m);
    f->meta_keys = calloc(cap ? cap : 1, sizeof *f->meta_keys);
    f->meta_values = calloc(cap ? cap : 1, sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for __metadata__");
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return shoal_err_set(err, SHOAL_EFORMAT, "__metadata__ value of '%s' is not a string",
                                 k);
        f->meta_keys[n] = strdup(k);
        f->meta_values[n] = strdup(json_string_value(v));
        f->meta_count = ++n;
        if (!f->meta_keys[n - 1] || !f->meta_values[n - 1])
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for __metadata__");
    }
    /* Insertion sort of pairs: metadata maps are a handful of entries. */
    for (size_t i = 1; i < n; i++) {
        for (size_t j = i; j > 0 && strcmp(f->meta_keys[j - 1], f->meta_keys[j]) > 0; j--) {
            char *tk = f->meta_keys[j], *tv = f->meta_values[j];
            f->meta_keys[j] = f->meta_keys[j - 1];
            f->meta_values[j] = f->meta_values[j - 1];
            f->meta_keys[j - 1] = tk;
            f->meta_values[j - 1] = tv;
        }
    }
    return 0;
}

/* ---- whole-file checks ----------------------------------------------------- */

static int tensor_file_cmp(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int name_ptr_cmp(const void *a, const void *b)
{
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

/* Validations 5 and 6 on tensors already in file order. */
static int layout_check(st_file *f, uint64_t file_size, shoal_err *err)
{
    uint64_t expect = 0;

    for (size_t i = 0; i < f->count; i++) {
        const st_tensor *t = &f->tensors[i];
        if (t->begin < expect)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "tensor '%s': data_offsets [%llu, %llu) overlap tensor '%s'",
                                 t->name, (unsigned long long)t->begin,
                                 (unsigned long long)t->end, f->tensors[i - 1].name);
        if (t->begin > expect)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "tensor '%s': data begin at %llu, leaving a hole after "
                                 "offset %llu", t->name, (unsigned long long)t->begin,
                                 (unsigned long long)expect);
        expect = t->end;
    }
    f->data_size = expect;
    if (file_size == ST_SIZE_UNKNOWN)
        return 0;
    for (size_t i = 0; i < f->count; i++) {
        const st_tensor *t = &f->tensors[i];
        if (f->data_offset + t->end > file_size)
            return shoal_err_set(err, SHOAL_ERANGE,
                                 "tensor '%s': data end at byte %llu, past the end of the "
                                 "%llu-byte file", t->name,
                                 (unsigned long long)(f->data_offset + t->end),
                                 (unsigned long long)file_size);
    }
    if (f->data_offset + expect != file_size)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "%llu bytes after the last tensor's data at %llu (file size %llu)",
                             (unsigned long long)(file_size - f->data_offset - expect),
                             (unsigned long long)(f->data_offset + expect),
                             (unsigned long long)file_size);
    return 0;
}

static int tensors_parse(st_file *f, json_t *root, shoal_err *err)
{
    const char *k;
    json_t *v;
    size_t n = 0;
    int rc;

    f->tensors = calloc(json_object_size(root) + 1, sizeof *f->tensors);
    if (!f->tensors)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for %zu tensors",
                             json_object_size(root));
    json_object_foreach(root, k, v) {
        if (strcmp(k, "__metadata__") == 0) {
            if ((rc = metadata_parse(f, v, err)))
                return rc;
            continue;
        }
        st_tensor *t = &f->tensors[n];
        if (!(t->name = strdup(k)))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for tensor names");
        f->count = ++n;
        if ((rc = entry_parse(k, v, t, err)))
            return rc;
    }
    qsort(f->tensors, n, sizeof *f->tensors, tensor_file_cmp);
    return 0;
}

int st_parse(const uint8_t *json, size_t json_len, uint64_t file_size, st_file **out,
             shoal_err *err)
{
    json_error_t je;
    json_t *root = NULL;
    st_file *f = NULL;
    size_t i = 0;
    int rc;

    *out = NULL;
    if (json_len > ST_HEADER_MAX)
        return shoal_err_set(err, SHOAL_ETOOBIG,
                             "safetensors header of %zu bytes exceeds the %llu-byte limit",
                             json_len, (unsigned long long)ST_HEADER_MAX);
    if (file_size != ST_SIZE_UNKNOWN && (file_size < 8 || json_len > file_size - 8))
        return shoal_err_set(err, SHOAL_ERANGE,
                             "safetensors header of %zu bytes runs past the end of the "
                             "%llu-byte file", json_len, (unsigned long long)file_size);
    while (i < json_len && (json[i] == ' ' || json[i] == '\t' || json[i] == '\n' ||
                            json[i] == '\r'))
        i++;
    if (i == json_len || json[i] != '{')
        return shoal_err_set(err, SHOAL_EFORMAT, "safetensors header does not start with '{'");
    root = json_loadb((const char *)json, json_len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (json_error_code(&je) == json_error_duplicate_key)
            return dup_report(json, json_len, (size_t)je.position, err);
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "safetensors header is not valid JSON (byte %d): %s",
                             je.position, je.text);
    }
    if (!(f = calloc(1, sizeof *f))) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto fail;
    }
    f->data_offset = 8 + (uint64_t)json_len;
    if ((rc = tensors_parse(f, root, err)) || (rc = layout_check(f, file_size, err)))
        goto fail;
    for (i = 0; i < f->count; i++) {
        f->tensors[i].begin += f->data_offset;
        f->tensors[i].end += f->data_offset;
    }
    if (!(f->by_name = malloc((f->count + 1) * sizeof *f->by_name))) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto fail;
    }
    for (i = 0; i < f->count; i++)
        f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, f->count, sizeof *f->by_name, name_ptr_cmp);
    json_decref(root);
    *out = f;
    return 0;
fail:
    json_decref(root);
    st_free(f);
    return rc;
}

int st_read_fd(int fd, st_file **out, shoal_err *err)
{
    struct stat stb;
    uint8_t first8[8], *json = NULL;
    uint64_t n;
    int rc;

    *out = NULL;
    if (fstat(fd, &stb) != 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "fstat: %s", strerror(errno));
    if ((uint64_t)stb.st_size < 8)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "file of %lld bytes is too short for a safetensors header",
                             (long long)stb.st_size);
    if ((rc = shoal_pread_all(fd, first8, 8, 0)))
        return shoal_err_set(err, rc, "reading the header length: %s", shoal_strerror(rc));
    if ((rc = st_header_len(first8, (uint64_t)stb.st_size, &n, err)))
        return rc;
    if (!(json = malloc(n ? n : 1)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for a %llu-byte header",
                             (unsigned long long)n);
    if ((rc = shoal_pread_all(fd, json, n, 8)))
        shoal_err_set(err, rc, "reading the header: %s", shoal_strerror(rc));
    else
        rc = st_parse(json, n, (uint64_t)stb.st_size, out, err);
    free(json);
    return rc;
}

int st_read_file(const char *path, st_file **out, shoal_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC), rc;

    *out = NULL;
    if (fd < 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "%s: %s", path, strerror(errno));
    rc = st_read_fd(fd, out, err);
    close(fd);
    if (rc)
        shoal_err_wrap(err, rc, "%s", path);
    return rc;
}

void st_free(st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->count; i++)
        free((char *)f->tensors[i].name);
    for (size_t i = 0; i < f->meta_count; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->tensors);
    free(f->by_name);
    free(f);
}

size_t st_count(const st_file *f) { return f->count; }

const st_tensor *st_at(const st_file *f, size_t i)
{
    return i < f->count ? &f->tensors[i] : NULL;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    size_t lo = 0, hi = f->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0)
            return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

uint64_t st_data_offset(const st_file *f) { return f->data_offset; }
uint64_t st_data_size(const st_file *f) { return f->data_size; }
size_t st_metadata_count(const st_file *f) { return f->meta_count; }

int st_metadata_at(const st_file *f, size_t i, const char **key, const char **value)
{
    if (i >= f->meta_count)
        return SHOAL_ERANGE;
    *key = f->meta_keys[i];
    *value = f->meta_values[i];
    return 0;
}

const char *st_metadata_get(const st_file *f, const char *key)
{
    for (size_t i = 0; i < f->meta_count; i++)
        if (strcmp(f->meta_keys[i], key) == 0)
            return f->meta_values[i];
    return NULL;
}
