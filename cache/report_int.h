/* report_int.h — shared by the report, deep-verify and maintenance files
 * of cache/ (report.c, deep.c, maint.c); nothing outside cache/ includes it.
 */
#ifndef SHOAL_CACHE_REPORT_INT_H
#define SHOAL_CACHE_REPORT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"
#include "common/buf.h"
#include "common/json.h"
#include "common/manifest.h"

/* The models matching a spec, in id order. */
typedef struct report_models {
    const char  *spec;             /* borrowed */
    cache_model *v;
    size_t       n, cap;
} report_models;

/* SHOAL_ENOTFOUND (with a message) when a non-empty spec matches nothing. */
int  report_models_find(cache *c, const char *spec, report_models *out, shoal_err *err);
void report_models_free(report_models *ms);
int  report_models_has(const report_models *ms, int64_t id);

/* The model's manifest from the cache (caller frees), SHOAL_ENOTFOUND if
 * it is not cached. */
int report_manifest_load(cache *c, const cache_model *m, manifest **out, shoal_err *err);

/* JSON building with a sticky error (*rc): see report.c. */
void rj_set(int *rc, shoal_json *obj, const char *key, shoal_json *v);
void rj_push(int *rc, shoal_json *arr, shoal_json *v);
shoal_json *rj_u64(uint64_t v);
shoal_json *rj_str(const char *s);
/* {schema, version 1, source, home, generated_ms}. */
shoal_json *report_header(int *jrc, const char *schema, const cache *c, const char *source);
/* Serialise root compactly into out and free it. */
int report_dump(shoal_json *root, int jrc, shoal_buf *out, shoal_err *err);

#endif
