/* path.c — home resolution, joins, mkdir -p, byte sizes. */
#include "common/path.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

void shoal_env_capture(shoal_env *env)
{
    /* The program's edge: main() calls this once.  lint: allow getenv */
    env->shoal_home = getenv("SHOAL_HOME");          /* lint: allow */
    env->xdg_cache_home = getenv("XDG_CACHE_HOME");  /* lint: allow */
    env->home = getenv("HOME");                      /* lint: allow */
}

static int set(const char *s) { return s && s[0]; }

int shoal_home_resolve(const shoal_env *env, const char *flag, char *out, size_t cap,
                       shoal_err *err)
{
    int n;
    if (set(flag))
        n = snprintf(out, cap, "%s", flag);
    else if (env && set(env->shoal_home))
        n = snprintf(out, cap, "%s", env->shoal_home);
    else if (env && set(env->xdg_cache_home))
        n = snprintf(out, cap, "%s/shoal", env->xdg_cache_home);
    else if (env && set(env->home))
        n = snprintf(out, cap, "%s/.cache/shoal", env->home);
    else
        return shoal_err_set(err, SHOAL_EINVAL,
                             "cannot tell where the cache lives: set SHOAL_HOME or HOME, or pass --home");
    if (n < 0 || (size_t)n >= cap)
        return shoal_err_set(err, SHOAL_ETOOBIG, "cache directory path too long");
    return 0;
}

int shoal_path_join(char *out, size_t cap, const char *a, const char *b)
{
    int n;
    if (b[0] == '/' || !a[0])
        n = snprintf(out, cap, "%s", b);
    else if (a[strlen(a) - 1] == '/')
        n = snprintf(out, cap, "%s%s", a, b);
    else
        n = snprintf(out, cap, "%s/%s", a, b);
    return (n < 0 || (size_t)n >= cap) ? SHOAL_ETOOBIG : 0;
}

int shoal_mkdir_p(const char *path, mode_t mode, shoal_err *err)
{
    char tmp[SHOAL_PATH_MAX];
    size_t len = strlen(path);
    struct stat st;

    if (len == 0 || len >= sizeof tmp)
        return shoal_err_set(err, SHOAL_EINVAL, "bad directory path");
    memcpy(tmp, path, len + 1);
    for (char *p = tmp + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(tmp, mode) != 0 && errno != EEXIST)
                return shoal_err_set(err, shoal_err_from_errno(errno), "mkdir %s: %s", tmp,
                                     strerror(errno));
            *p = c;
            if (c == '\0')
                break;
        }
    }
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return shoal_err_set(err, SHOAL_EEXIST, "%s exists and is not a directory", path);
    return 0;
}

int shoal_size_parse(const char *s, uint64_t *out)
{
    char *end;
    double v, mult = 1;

    if (!s || !isdigit((unsigned char)*s))
        return SHOAL_EINVAL;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s)
        return SHOAL_EINVAL;
    while (*end == ' ')
        end++;
    if (*end) {
        static const char units[] = "KMGTP";
        const char *u = strchr(units, toupper((unsigned char)*end));
        int power;
        if (!u)
            return SHOAL_EINVAL;
        power = (int)(u - units) + 1;
        end++;
        if (!*end || strcasecmp(end, "iB") == 0 || strcasecmp(end, "i") == 0)
            mult = pow(1024.0, power);
        else if (strcasecmp(end, "B") == 0)
            mult = pow(1000.0, power);
        else
            return SHOAL_EINVAL;
    }
    v *= mult;
    if (v < 0 || v >= 18446744073709551616.0)
        return SHOAL_EINVAL;
    *out = (uint64_t)v;
    return 0;
}

int shoal_long_parse(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;
    if (!s)
        return SHOAL_EINVAL;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return SHOAL_EINVAL;
    *out = v;
    return 0;
}

char *shoal_size_format(uint64_t bytes, char *out, size_t cap)
{
    static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(out, cap, "%llu B", (unsigned long long)bytes);
    else
        snprintf(out, cap, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
    return out;
}
