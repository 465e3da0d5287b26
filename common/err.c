/* err.c — error code descriptions and the shoal_err record. */
#include "common/err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct { const char *name, *text; } err_table[SHOAL_ERR_COUNT_] = {
    { "OK",          "success" },
    { "ENOMEM",      "out of memory" },
    { "EIO",         "input/output error" },
    { "EINVAL",      "invalid argument" },
    { "ENOTFOUND",   "not found" },
    { "EFORMAT",     "malformed data" },
    { "ENOSPC",      "no space left (disk full or budget exceeded)" },
    { "ELOCKED",     "locked by another process" },
    { "EPROTO",      "protocol error" },
    { "ENET",        "network error" },
    { "EAUTH",       "authentication or authorization failed" },
    { "ETOOBIG",     "too large" },
    { "ETIMEOUT",    "timed out" },
    { "ECANCELED",   "cancelled" },
    { "EEXIST",      "already exists" },
    { "ERANGE",      "out of range" },
    { "ECORRUPT",    "data corrupt (checksum mismatch)" },
    { "EUNSUPPORTED","not supported" },
    { "EBUSY",       "busy, try again later" },
    { "EINTERNAL",   "internal error" },
    { "EOFFLINE",    "offline: not in the cache and the Hub is not reachable" },
};

static int err_index(int code)
{
    if (code > 0 || code <= -SHOAL_ERR_COUNT_)
        return -1;
    return -code;
}

const char *shoal_strerror(int code)
{
    int i = err_index(code);
    return i < 0 ? "unknown error" : err_table[i].text;
}

const char *shoal_err_name(int code)
{
    int i = err_index(code);
    return i < 0 ? "EUNKNOWN" : err_table[i].name;
}

int shoal_err_from_errno(int e)
{
    switch (e) {
    case 0:          return SHOAL_OK;
    case ENOMEM:     return SHOAL_ENOMEM;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:      return SHOAL_ENOSPC;
    case ENOENT:     return SHOAL_ENOTFOUND;
    case EINVAL:     return SHOAL_EINVAL;
    case EEXIST:     return SHOAL_EEXIST;
    case EACCES:
    case EPERM:      return SHOAL_EAUTH;
    case EAGAIN:
    case EBUSY:      return SHOAL_EBUSY;
    case ETIMEDOUT:  return SHOAL_ETIMEOUT;
    case ECANCELED:  return SHOAL_ECANCELED;
    case ERANGE:
    case EOVERFLOW:  return SHOAL_ERANGE;
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
    case ENETUNREACH:
    case EHOSTUNREACH: return SHOAL_ENET;
    default:         return SHOAL_EIO;
    }
}

int shoal_err_set(shoal_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

int shoal_err_wrap(shoal_err *err, int code, const char *fmt, ...)
{
    char prefix[SHOAL_ERR_MSG_MAX], old[SHOAL_ERR_MSG_MAX];
    va_list ap;

    if (!err)
        return code;
    if (err->code == 0)
        err->code = code;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    old[sizeof old - 1] = '\0';
    {
        /* Build into a larger scratch and cut to the record's size. */
        char joined[2 * SHOAL_ERR_MSG_MAX + 4];
        snprintf(joined, sizeof joined, "%s: %s", prefix,
                 old[0] ? old : shoal_strerror(err->code));
        memcpy(err->msg, joined, sizeof err->msg - 1);
        err->msg[sizeof err->msg - 1] = '\0';
    }
    return err->code;
}

void shoal_err_clear(shoal_err *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}
