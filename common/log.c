/* log.c — logging to stderr or a reopenable file. */
#include "common/log.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static struct {
    pthread_mutex_t lock;
    const char     *program;
    int             level;
    int             fd;          /* 2 or an owned file descriptor */
    char            path[4096];  /* empty: stderr */
} log_state = { PTHREAD_MUTEX_INITIALIZER, "shoal", SHOAL_LOG_INFO, 2, "" };

static const char *const level_names[] = { "ERROR", "WARN", "INFO", "DEBUG", "TRACE" };

static int log_open_file(const char *path)
{
    return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

int shoal_log_setup(const char *program, shoal_log_level level, const char *path)
{
    int rc = 0;
    pthread_mutex_lock(&log_state.lock);
    if (program)
        log_state.program = program;
    log_state.level = level;
    if (log_state.fd != 2)
        close(log_state.fd);
    log_state.fd = 2;
    log_state.path[0] = '\0';
    if (path && path[0]) {
        int fd = log_open_file(path);
        if (fd < 0) {
            rc = shoal_err_from_errno(errno);
        } else {
            log_state.fd = fd;
            snprintf(log_state.path, sizeof log_state.path, "%s", path);
        }
    }
    pthread_mutex_unlock(&log_state.lock);
    return rc;
}

int shoal_log_reopen(void)
{
    int rc = 0;
    pthread_mutex_lock(&log_state.lock);
    if (log_state.path[0]) {
        int fd = log_open_file(log_state.path);
        if (fd < 0) {
            rc = shoal_err_from_errno(errno);
        } else {
            close(log_state.fd);
            log_state.fd = fd;
        }
    }
    pthread_mutex_unlock(&log_state.lock);
    return rc;
}

void shoal_log_set_level(shoal_log_level level) { log_state.level = level; }
shoal_log_level shoal_log_get_level(void) { return (shoal_log_level)log_state.level; }

int shoal_log_level_parse(const char *s, shoal_log_level *out)
{
    for (int i = 0; i <= SHOAL_LOG_TRACE; i++) {
        if (s && strcasecmp(s, level_names[i]) == 0) {
            *out = (shoal_log_level)i;
            return 0;
        }
    }
    if (s && strcasecmp(s, "warning") == 0) {
        *out = SHOAL_LOG_WARN;
        return 0;
    }
    return SHOAL_EINVAL;
}

void shoal_logv(shoal_log_level level, const char *tag, const char *fmt, va_list ap)
{
    char line[2048];
    struct timeval tv;
    struct tm tm;
    size_t n;
    int k;

    if ((int)level > log_state.level)
        return;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    k = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s[%d] %-5s %s: ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec, (int)(tv.tv_usec / 1000), log_state.program, (int)getpid(),
                 level_names[level], tag ? tag : "-");
    n = k < 0 ? 0 : (size_t)k;
    if (n < sizeof line) {
        k = vsnprintf(line + n, sizeof line - n, fmt, ap);
        if (k > 0)
            n += (size_t)k;
    }
    if (n > sizeof line - 2)
        n = sizeof line - 2;
    line[n++] = '\n';
    pthread_mutex_lock(&log_state.lock);
    /* A failed log write has nowhere better to go; the result is ignored. */
    if (write(log_state.fd, line, n) < 0) { /* nothing */ }
    pthread_mutex_unlock(&log_state.lock);
}

void shoal_log(shoal_log_level level, const char *tag, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    shoal_logv(level, tag, fmt, ap);
    va_end(ap);
}

const char *shoal_log_count(unsigned long long n, char *buf, unsigned cap)
{
    char digits[24];
    int k = snprintf(digits, sizeof digits, "%llu", n), o = 0;
    for (int i = 0; i < k && (unsigned)o + 2 < cap; i++) {
        if (i && (k - i) % 3 == 0)
            buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
    return buf;
}

static unsigned long long log_suppressed;   /* under log_state.lock */

unsigned long long shoal_log_suppressed(void)
{
    unsigned long long n;
    pthread_mutex_lock(&log_state.lock);
    n = log_suppressed;
    pthread_mutex_unlock(&log_state.lock);
    return n;
}

void shoal_log_limited(shoal_log_limit *l, shoal_log_level level, const char *tag,
                       const char *fmt, ...)
{
    struct timeval tv;
    long long now;
    unsigned long long held;
    char msg[1536], n[32];
    va_list ap;

    if ((int)level > log_state.level)
        return;
    gettimeofday(&tv, NULL);
    now = (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000;
    pthread_mutex_lock(&log_state.lock);
    if (now - l->window_ms >= SHOAL_LOG_LIMIT_MS || now < l->window_ms) {
        l->window_ms = now;
        l->lines = 0;
    }
    if (l->lines >= SHOAL_LOG_LIMIT_BURST) {
        l->held++;
        log_suppressed++;
        pthread_mutex_unlock(&log_state.lock);
        return;
    }
    l->lines++;
    held = l->held;
    l->held = 0;
    pthread_mutex_unlock(&log_state.lock);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (held)
        shoal_log(level, tag, "%s (repeated %s times)", msg, shoal_log_count(held, n, sizeof n));
    else
        shoal_log(level, tag, "%s", msg);
}

void shoal_log_close(void)
{
    pthread_mutex_lock(&log_state.lock);
    if (log_state.fd != 2)
        close(log_state.fd);
    log_state.fd = 2;
    log_state.path[0] = '\0';
    pthread_mutex_unlock(&log_state.lock);
}
