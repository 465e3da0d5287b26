/* faults.c — fault settings, their key=value syntax, and the seeded PRNG.
 *
 * Owns: the table of fault keys (shared by the command line, where `--key-name
 * V` sets `key_name`, and POST /_mock/faults?key=V), their JSON dump, the
 * draws that decide which requests get a fault, and the faults every answer
 * gets (latency, hub_stall, huge_header).  Does not apply body faults: the
 * CDN handler decides them and http.c carries them out.
 */
#include "tools/hubmock/hubmock_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/path.h"

typedef enum { K_RATE, K_U64, K_SIZE, K_SECS, K_ON, K_WHERE, K_MODE } key_kind;

static const struct fault_key {
    const char *name;
    key_kind    kind;
    size_t      off;
} fault_keys[] = {
    { "rate_429",          K_RATE, offsetof(hm_faults, rate_429) },
    { "rate_503",          K_RATE, offsetof(hm_faults, rate_503) },
    { "status_on",         K_ON,   offsetof(hm_faults, status_on) },
    { "retry_after",       K_U64,  offsetof(hm_faults, retry_after) },
    { "rate_reset",        K_RATE, offsetof(hm_faults, rate_reset) },
    { "reset_after",       K_SIZE, offsetof(hm_faults, reset_after) },
    { "rate_truncate",     K_RATE, offsetof(hm_faults, rate_truncate) },
    { "truncate_after",    K_SIZE, offsetof(hm_faults, truncate_after) },
    { "rate_ignore_range", K_RATE, offsetof(hm_faults, rate_ignore_range) },
    { "rate_stall",        K_RATE, offsetof(hm_faults, rate_stall) },
    { "stall_secs",        K_SECS, offsetof(hm_faults, stall_secs) },
    { "stall_at",          K_WHERE, offsetof(hm_faults, stall_at) },
    { "bw",                K_SIZE, offsetof(hm_faults, bw) },
    { "cdn_ttl",           K_U64,  offsetof(hm_faults, cdn_ttl) },
    { "seed",              K_U64,  offsetof(hm_faults, seed) },
    { "latency",           K_U64,  offsetof(hm_faults, latency) },
    { "hub_stall",         K_SECS, offsetof(hm_faults, hub_stall) },
    { "rate_corrupt",      K_RATE, offsetof(hm_faults, rate_corrupt) },
    { "corrupt_mode",      K_MODE, offsetof(hm_faults, corrupt_mode) },
    { "corrupt_count",     K_U64,  offsetof(hm_faults, corrupt_count) },
    { "drip_secs",         K_SECS, offsetof(hm_faults, drip_secs) },
    { "huge_header",       K_SIZE, offsetof(hm_faults, huge_header) },
};

static const char *const corrupt_modes[] = { "none", "one", "all", "drift" };

/* The largest extra header: far past any client's limit, still bounded. */
#define HUGE_HEADER_MAX ((uint64_t)64 << 20)

void hm_faults_defaults(hm_faults *f)
{
    memset(f, 0, sizeof *f);
    f->retry_after = 1;
    f->stall_secs = 2;
    f->stall_at = HM_STALL_BEFORE;
    f->cdn_ttl = 3600;
    f->seed = 1;
    f->corrupt_mode = HM_CORRUPT_ONE;
}

void hm_faults_clear(hm_faults *f)
{
    uint64_t ttl = f->cdn_ttl, seed = f->seed;
    hm_faults_defaults(f);
    f->cdn_ttl = ttl;
    f->seed = seed;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || v < lo || v > hi)
        return SHOAL_EINVAL;
    *out = v;
    return 0;
}

int hm_faults_set(hm_faults *f, const char *key, const char *value, shoal_err *err)
{
    char *p = (char *)f;
    for (size_t i = 0; i < sizeof fault_keys / sizeof *fault_keys; i++) {
        const struct fault_key *k = &fault_keys[i];
        int rc = 0;
        if (strcmp(k->name, key) != 0)
            continue;
        switch (k->kind) {
        case K_RATE:
            rc = parse_double(value, 0, 1, (double *)(p + k->off));
            break;
        case K_SECS:
            rc = parse_double(value, 0, 3600, (double *)(p + k->off));
            break;
        case K_U64: {
            char *end;
            unsigned long long v;
            errno = 0;
            v = strtoull(value, &end, 10);
            if (errno || end == value || *end || value[0] == '-')
                rc = SHOAL_EINVAL;
            else
                *(uint64_t *)(p + k->off) = v;
            break;
        }
        case K_SIZE:
            rc = shoal_size_parse(value, (uint64_t *)(p + k->off));
            break;
        case K_ON:
            if (strcmp(value, "both") == 0)
                f->status_on = HM_ON_BOTH;
            else if (strcmp(value, "hub") == 0)
                f->status_on = HM_ON_HUB;
            else if (strcmp(value, "cdn") == 0)
                f->status_on = HM_ON_CDN;
            else
                rc = SHOAL_EINVAL;
            break;
        case K_WHERE:
            if (strcmp(value, "before") == 0)
                f->stall_at = HM_STALL_BEFORE;
            else if (strcmp(value, "mid") == 0)
                f->stall_at = HM_STALL_MID;
            else
                rc = SHOAL_EINVAL;
            break;
        case K_MODE:
            rc = SHOAL_EINVAL;
            for (int m = HM_CORRUPT_ONE; m <= HM_CORRUPT_DRIFT; m++)
                if (strcmp(value, corrupt_modes[m]) == 0) {
                    f->corrupt_mode = m;
                    rc = 0;
                }
            break;
        }
        if (rc == 0 && k->off == offsetof(hm_faults, huge_header) && f->huge_header > HUGE_HEADER_MAX)
            rc = SHOAL_EINVAL;
        if (rc)
            return shoal_err_set(err, SHOAL_EINVAL, "bad value for fault %s: '%s'", key, value);
        return 0;
    }
    return shoal_err_set(err, SHOAL_EINVAL, "unknown fault key '%s'", key);
}

int hm_faults_dump(const hm_faults *f, shoal_buf *out)
{
    static const char *const on[] = { "both", "hub", "cdn" };
    static const char *const where[] = { "before", "mid" };
    const char *p = (const char *)f;
    shoal_json *o = shoal_json_object();
    int rc = o ? 0 : SHOAL_ENOMEM;

    for (size_t i = 0; rc == 0 && i < sizeof fault_keys / sizeof *fault_keys; i++) {
        const struct fault_key *k = &fault_keys[i];
        switch (k->kind) {
        case K_RATE:
        case K_SECS:
            rc = shoal_json_set_num(o, k->name, *(const double *)(p + k->off));
            break;
        case K_U64:
        case K_SIZE:
            rc = shoal_json_set_int(o, k->name, (int64_t)*(const uint64_t *)(p + k->off));
            break;
        case K_ON:
            rc = shoal_json_set_str(o, k->name, on[f->status_on]);
            break;
        case K_WHERE:
            rc = shoal_json_set_str(o, k->name, where[f->stall_at]);
            break;
        case K_MODE:
            rc = shoal_json_set_str(o, k->name, corrupt_modes[f->corrupt_mode]);
            break;
        }
    }
    if (rc == 0)
        rc = shoal_json_dump(o, SHOAL_JSON_COMPACT, out);
    shoal_json_free(o);
    return rc;
}

void hm_faults_every(hm_server *s, hm_port port, hm_response *res)
{
    const hm_faults *f = &s->faults;

    if (f->latency > 0) {
        res->stall_before += (double)f->latency / 1000.0;
        hm_response_fault(res, "latency");
    }
    if (port == HM_PORT_HUB && f->hub_stall > 0) {
        res->stall_before += f->hub_stall;
        hm_response_fault(res, "hub_stall");
    }
    if (f->huge_header > 0) {
        /* One header line "X-Hubmock-Padding: aaa..." of huge_header bytes
         * of value, as a misbehaving proxy might add. */
        shoal_buf *h = &res->headers;
        if (shoal_buf_append_str(h, "X-Hubmock-Padding: ") == 0 &&
            shoal_buf_reserve(h, (size_t)f->huge_header + 2) == 0) {
            memset(h->data + h->len, 'a', (size_t)f->huge_header);
            h->len += (size_t)f->huge_header;
            shoal_buf_append_str(h, "\r\n");
            hm_response_fault(res, "huge_header");
        }
    }
}

void hm_rng_seed(hm_rng *r, uint64_t seed)
{
    /* splitmix64 step so that small seeds (0, 1, 2) give unrelated streams. */
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    r->s = (z ^ (z >> 31)) | 1;
}

int hm_rng_chance(hm_rng *r, double rate)
{
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    x *= 0x2545f4914f6cdd1dull;
    return (double)(x >> 11) / 9007199254740992.0 < rate;
}

int hm_faults_status(hm_server *s, hm_port port, hm_response *res)
{
    const hm_faults *f = &s->faults;
    int on = f->status_on == HM_ON_BOTH || (f->status_on == HM_ON_HUB && port == HM_PORT_HUB)
             || (f->status_on == HM_ON_CDN && port == HM_PORT_CDN);
    int r429 = hm_rng_chance(&s->rng, f->rate_429);
    int r503 = hm_rng_chance(&s->rng, f->rate_503);

    if (on && r429) {
        hm_response_error(res, 429, NULL,
                          "You have been rate-limited; you can retry this action in %llu seconds.",
                          (unsigned long long)f->retry_after);
        hm_response_header(res, "Retry-After", "%llu", (unsigned long long)f->retry_after);
        hm_response_header(res, "RateLimit", "\"resolvers\";r=0;t=%llu",
                           (unsigned long long)f->retry_after);
        hm_response_header(res, "RateLimit-Policy", "\"fixed window\";\"resolvers\";q=3000;w=300");
        hm_response_fault(res, "429");
        return 1;
    }
    if (on && r503) {
        hm_response_error(res, 503, NULL, "Service Unavailable");
        hm_response_fault(res, "503");
        return 1;
    }
    return 0;
}
