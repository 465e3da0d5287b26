/* reqlog.c — hubmock's request log: one JSON object per answered request.
 *
 * Owns: the log file.  Each line is written and flushed at once so a test can
 * read the log while hubmock runs:
 *   {"port":"hub"|"cdn","method":"GET","path":"/...","range":"bytes=0-9"|null,
 *    "status":206,"bytes":10,"auth":false,"fault":"truncate"|null}
 * `bytes` counts body bytes actually handed to the kernel.  With
 * --log-times each line also has "t0_us" and "t1_us" (monotonic
 * microseconds): when the answer started and ended, so a test can count
 * the responses in flight at once (connections used together).
 */
#include "tools/hubmock/hubmock_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"

struct hm_reqlog {
    FILE *f;
    int   times;
};

int hm_reqlog_open(const char *path, int times, hm_reqlog **out, shoal_err *err)
{
    hm_reqlog *l = calloc(1, sizeof *l);
    if (!l)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    l->times = times;
    l->f = fopen(path, "a");
    if (!l->f) {
        int e = errno;
        free(l);
        return shoal_err_set(err, shoal_err_from_errno(e), "open log %s: %s", path, strerror(e));
    }
    *out = l;
    return 0;
}

void hm_reqlog_close(hm_reqlog *l)
{
    if (!l)
        return;
    fclose(l->f);
    free(l);
}

void hm_reqlog_write(hm_reqlog *l, const char *port, const char *method, const char *target,
                     const char *range, int status, uint64_t bytes, int auth, const char *fault,
                     uint64_t t0_us, uint64_t t1_us)
{
    shoal_json *o;
    shoal_buf line;
    int rc;

    if (!l)
        return;
    o = shoal_json_object();
    if (!o)
        return;
    shoal_buf_init(&line, 0);
    rc = shoal_json_set_str(o, "port", port);
    rc = rc ? rc : shoal_json_set_str(o, "method", method);
    rc = rc ? rc : shoal_json_set_str(o, "path", target);
    rc = rc ? rc : shoal_json_set_take(o, "range", range ? shoal_json_new_str(range)
                                                        : shoal_json_new_null());
    rc = rc ? rc : shoal_json_set_int(o, "status", status);
    rc = rc ? rc : shoal_json_set_int(o, "bytes", (int64_t)bytes);
    rc = rc ? rc : shoal_json_set_bool(o, "auth", auth);
    rc = rc ? rc : shoal_json_set_take(o, "fault", fault && fault[0] ? shoal_json_new_str(fault)
                                                                    : shoal_json_new_null());
    if (l->times) {
        rc = rc ? rc : shoal_json_set_int(o, "t0_us", (int64_t)t0_us);
        rc = rc ? rc : shoal_json_set_int(o, "t1_us", (int64_t)t1_us);
    }
    rc = rc ? rc : shoal_json_dump(o, SHOAL_JSON_COMPACT, &line);
    rc = rc ? rc : shoal_buf_append(&line, "\n", 1);
    if (rc == 0) {
        fwrite(line.data, 1, line.len, l->f);
        fflush(l->f);
    } else {
        LOG_WARN("hubmock", "request log: %s", shoal_strerror(rc));
    }
    shoal_buf_free(&line);
    shoal_json_free(o);
}
