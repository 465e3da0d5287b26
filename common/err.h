/* err.h — shoal's error codes and the error record that carries detail.
 *
 * Owns: the numeric codes every component returns, their one-line
 * descriptions, and shoal_err, a caller-supplied record for a message that
 * says what went wrong and what to do.  Does not own logging (log.h).
 *
 * Convention: functions return 0 (SHOAL_OK) on success and a negative code
 * on failure; when they take a `shoal_err *err` they fill it on failure
 * (err may be NULL when the caller only wants the code).
 */
#ifndef SHOAL_ERR_H
#define SHOAL_ERR_H

#include <stddef.h>

enum {
    SHOAL_OK          =   0,
    SHOAL_ENOMEM      =  -1,  /* allocation failed */
    SHOAL_EIO         =  -2,  /* read/write/fsync failed */
    SHOAL_EINVAL      =  -3,  /* bad argument or option */
    SHOAL_ENOTFOUND   =  -4,  /* no such object, file, repo, key */
    SHOAL_EFORMAT     =  -5,  /* malformed file or message */
    SHOAL_ENOSPC      =  -6,  /* disk full or budget exceeded */
    SHOAL_ELOCKED     =  -7,  /* held by another process */
    SHOAL_EPROTO      =  -8,  /* peer broke the protocol */
    SHOAL_ENET        =  -9,  /* network failure */
    SHOAL_EAUTH       = -10,  /* missing, wrong or insufficient credentials */
    SHOAL_ETOOBIG     = -11,  /* over a size limit */
    SHOAL_ETIMEOUT    = -12,  /* gave up waiting */
    SHOAL_ECANCELED   = -13,  /* cancelled on request */
    SHOAL_EEXIST      = -14,  /* already exists */
    SHOAL_ERANGE      = -15,  /* value or byte range out of bounds */
    SHOAL_ECORRUPT    = -16,  /* checksum or consistency check failed */
    SHOAL_EUNSUPPORTED = -17, /* valid but not supported */
    SHOAL_EBUSY       = -18,  /* try again later */
    SHOAL_EINTERNAL   = -19,  /* a bug: an invariant did not hold */
    SHOAL_EOFFLINE    = -20,  /* the upstream is offline (HF_HUB_OFFLINE or
                                 unreachable) and the cache lacks it */
    SHOAL_ERR_COUNT_  =  21
};

#define SHOAL_ERR_MSG_MAX 512

/* Caller-owned error record.  `code` is 0 until a failure is recorded. */
typedef struct shoal_err {
    int  code;
    char msg[SHOAL_ERR_MSG_MAX];
} shoal_err;

/* One-line description of a code ("disk full"); never NULL. */
const char *shoal_strerror(int code);

/* Short stable name of a code ("ENOSPC"); never NULL. */
const char *shoal_err_name(int code);

/* Map an errno value to a shoal code (ENOSPC -> SHOAL_ENOSPC, ...). */
int shoal_err_from_errno(int e);

/* Record `code` and a printf-style message in `err` (which may be NULL).
 * Returns `code`, so callers can write `return shoal_err_set(err, ...)`. */
int shoal_err_set(shoal_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefix the message already in `err` with more context ("open x: " + old).
 * Returns err->code (or `code` if err is NULL). */
int shoal_err_wrap(shoal_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reset to "no error". */
void shoal_err_clear(shoal_err *err);

#endif
