/* json.h — a thin JSON layer so no jansson type crosses a component boundary.
 *
 * Owns: parsing (with a size cap), typed lookups by dotted path that fail
 * with a message naming the path, a small builder and serialisation.
 * Values are reference-counted underneath; shoal_json_free() drops the
 * caller's reference.  Lookups return *borrowed* pointers that live as long
 * as the root they came from.
 */
#ifndef SHOAL_JSON_H
#define SHOAL_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"

typedef struct shoal_json shoal_json;

typedef enum shoal_json_type {
    SHOAL_JSON_NULL, SHOAL_JSON_BOOL, SHOAL_JSON_INT, SHOAL_JSON_REAL,
    SHOAL_JSON_STRING, SHOAL_JSON_ARRAY, SHOAL_JSON_OBJECT
} shoal_json_type;

/* Parse text (need not be NUL-terminated).  Caller frees.  NULL on error,
 * with the line and column in err (SHOAL_EFORMAT). */
shoal_json *shoal_json_parse(const char *text, size_t len, shoal_err *err);

/* Read and parse a file of at most max_bytes (SHOAL_ETOOBIG past it). */
shoal_json *shoal_json_load_file(const char *path, size_t max_bytes, shoal_err *err);

void shoal_json_free(shoal_json *j);

shoal_json_type shoal_json_typeof(const shoal_json *j);

/* Borrowed member of an object, or NULL (missing key or not an object). */
shoal_json *shoal_json_get(const shoal_json *obj, const char *key);

/* Borrowed value at a dotted path ("text_config.linear_attn_config.num_heads"),
 * or NULL.  Keys containing dots cannot be reached this way; use _get. */
shoal_json *shoal_json_path(const shoal_json *root, const char *path);

/* Typed lookups at a dotted path.  0, or SHOAL_ENOTFOUND / SHOAL_EFORMAT
 * with a message naming the path; *out is unchanged on failure. */
int shoal_json_int(const shoal_json *root, const char *path, int64_t *out, shoal_err *err);
int shoal_json_num(const shoal_json *root, const char *path, double *out, shoal_err *err);
int shoal_json_bool(const shoal_json *root, const char *path, int *out, shoal_err *err);
/* *out is borrowed from root. */
int shoal_json_str(const shoal_json *root, const char *path, const char **out, shoal_err *err);
/* Integers of an array into out[0..cap); *n gets the count (SHOAL_ETOOBIG
 * if more than cap). */
int shoal_json_int_array(const shoal_json *root, const char *path, int64_t *out,
                         size_t cap, size_t *n, shoal_err *err);

/* Direct accessors on a value (0 / NULL when of another type). */
int64_t     shoal_json_int_value(const shoal_json *j);
double      shoal_json_num_value(const shoal_json *j);   /* int or real */
const char *shoal_json_str_value(const shoal_json *j);
size_t      shoal_json_str_len(const shoal_json *j);

size_t      shoal_json_array_size(const shoal_json *arr);
shoal_json *shoal_json_array_at(const shoal_json *arr, size_t i);   /* borrowed */

/* Object iteration in insertion order.  The callback returns 0 to go on;
 * any other value stops the walk and is returned. */
typedef int (*shoal_json_member_fn)(const char *key, shoal_json *value, void *ctx);
int shoal_json_object_foreach(const shoal_json *obj, shoal_json_member_fn fn, void *ctx);
size_t shoal_json_object_size(const shoal_json *obj);

/* Builders.  New values are owned by the caller until handed over with a
 * _take function, which takes ownership even when it fails. */
shoal_json *shoal_json_object(void);
shoal_json *shoal_json_array(void);
shoal_json *shoal_json_new_int(int64_t v);
shoal_json *shoal_json_new_num(double v);
shoal_json *shoal_json_new_str(const char *s);
shoal_json *shoal_json_new_strn(const char *s, size_t n);
shoal_json *shoal_json_new_bool(int v);
shoal_json *shoal_json_new_null(void);
int shoal_json_set_take(shoal_json *obj, const char *key, shoal_json *value);
int shoal_json_append_take(shoal_json *arr, shoal_json *value);
int shoal_json_set_int(shoal_json *obj, const char *key, int64_t v);
int shoal_json_set_num(shoal_json *obj, const char *key, double v);
int shoal_json_set_str(shoal_json *obj, const char *key, const char *s);
int shoal_json_set_bool(shoal_json *obj, const char *key, int v);

/* Serialise.  Flags below; appends to out.  0 or SHOAL_ENOMEM. */
enum { SHOAL_JSON_COMPACT = 0, SHOAL_JSON_PRETTY = 1, SHOAL_JSON_SORTED = 2 };
int shoal_json_dump(const shoal_json *j, int flags, shoal_buf *out);

#endif
