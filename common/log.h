/* log.h — the one place shoal's programs write diagnostics.
 *
 * Owns: levels, component tags, the destination (stderr or a file that
 * SIGHUP can reopen).  Libraries call shoal_log()/the LOG_* macros and never
 * print; the program calls shoal_log_setup() once at its edge.
 *
 * Line format:  2026-11-29T18:40:00.123Z shoald[1234] WARN  cache: message
 * Thread-safe: each line is one write(2) under a mutex.
 */
#ifndef SHOAL_LOG_H
#define SHOAL_LOG_H

#include <stdarg.h>

typedef enum shoal_log_level {
    SHOAL_LOG_ERROR = 0,
    SHOAL_LOG_WARN  = 1,
    SHOAL_LOG_INFO  = 2,
    SHOAL_LOG_DEBUG = 3,
    SHOAL_LOG_TRACE = 4
} shoal_log_level;

/* Configure logging.  `program` names the process in each line (borrowed:
 * must outlive logging, normally a string literal).  `path` NULL means
 * stderr.  Returns 0, or a negative shoal code if the file cannot be
 * opened (logging then stays on stderr). */
int shoal_log_setup(const char *program, shoal_log_level level, const char *path);

/* Reopen the log file (after rotation; the daemon calls it on SIGHUP).
 * Returns 0, or a negative code; on failure the old descriptor is kept. */
int shoal_log_reopen(void);

void shoal_log_set_level(shoal_log_level level);
shoal_log_level shoal_log_get_level(void);

/* Parse "error|warn|info|debug|trace"; returns 0 or SHOAL_EINVAL. */
int shoal_log_level_parse(const char *s, shoal_log_level *out);

void shoal_log(shoal_log_level level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void shoal_logv(shoal_log_level level, const char *tag, const char *fmt, va_list ap);

/* Rate-limited lines, for what a hostile or broken peer can repeat at
 * will (accept failures, refused frames): at most SHOAL_LOG_LIMIT_BURST
 * lines per SHOAL_LOG_LIMIT_MS per limiter; the first line printed after
 * some were held back says how many, "... (repeated 12,345 times)".  A
 * limiter is a static zero-initialised struct per call site; thread-safe. */
#define SHOAL_LOG_LIMIT_MS    10000
#define SHOAL_LOG_LIMIT_BURST 10
typedef struct shoal_log_limit {
    long long window_ms;           /* when the current window began */
    unsigned  lines;               /* printed in it */
    unsigned long long held;       /* not printed since the last line that was */
} shoal_log_limit;

void shoal_log_limited(shoal_log_limit *l, shoal_log_level level, const char *tag,
                       const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Lines every limiter held back since the process started (a figure for
 * /metrics and STATS). */
unsigned long long shoal_log_suppressed(void);
/* "12,345" into buf (cap >= 27). */
const char *shoal_log_count(unsigned long long n, char *buf, unsigned cap);

/* Close the file (if any) and return to stderr. */
void shoal_log_close(void);

#define LOG_ERROR(tag, ...) shoal_log(SHOAL_LOG_ERROR, tag, __VA_ARGS__)
#define LOG_WARN(tag, ...)  shoal_log(SHOAL_LOG_WARN, tag, __VA_ARGS__)
#define LOG_INFO(tag, ...)  shoal_log(SHOAL_LOG_INFO, tag, __VA_ARGS__)
#define LOG_WARN_LIMITED(lim, tag, ...) shoal_log_limited(lim, SHOAL_LOG_WARN, tag, __VA_ARGS__)
#define LOG_DEBUG(tag, ...) \
    do { if (shoal_log_get_level() >= SHOAL_LOG_DEBUG) shoal_log(SHOAL_LOG_DEBUG, tag, __VA_ARGS__); } while (0)
#define LOG_TRACE(tag, ...) \
    do { if (shoal_log_get_level() >= SHOAL_LOG_TRACE) shoal_log(SHOAL_LOG_TRACE, tag, __VA_ARGS__); } while (0)

#endif
