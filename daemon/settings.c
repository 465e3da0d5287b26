/* settings.c — shoald's settings that outlive a run: $SHOAL_HOME/shoald.conf.
 *
 * Owns: the settings table (budget, parallel transfers, the smallest part,
 * whether BF16 spine matrices stay pinned after their derived pack
 * exists, the connection limits, the low-speed limit), reading the file, putting the command line over it, writing
 * the file back when the command line gave a setting, and the settings as
 * STATS shows them.  Does not own the other flags (--log, --detach, ...:
 * they describe one run, main.c) nor what a setting does.
 *
 * The file is "key = value" lines; '#' starts a comment; keys are the
 * flags' names without "--".  A line that does not parse stops the start
 * with the file and line named: a budget read wrong is worse than none.
 * Rewritten (atomically, comments not kept) only when the command line
 * gave a setting, so a file edited by hand stays as it is otherwise.
 */
#include "daemon/daemon_int.h"
#include "common/json.h"
#include "common/sys.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SETTINGS_FILE     "shoald.conf"
#define SETTINGS_MAX_FILE (64u << 10)

typedef int (*setting_parse_fn)(const char *v, daemon_config *cfg);

static int parse_max_size(const char *v, daemon_config *cfg)
{
    if (strcasecmp(v, "auto") == 0) {
        cfg->max_size = 0;
        return 0;
    }
    return shoal_size_parse(v, &cfg->max_size);
}

static int parse_parallel(const char *v, daemon_config *cfg)
{
    long n;
    if (shoal_long_parse(v, 1, DAEMON_PARALLEL_MAX, &n) != 0)
        return SHOAL_EINVAL;
    cfg->parallel = (int)n;
    return 0;
}

static int parse_split_min(const char *v, daemon_config *cfg)
{
    if (strcasecmp(v, "never") == 0) {
        cfg->split_min = UINT64_MAX;
        return 0;
    }
    if (shoal_size_parse(v, &cfg->split_min) != 0)
        return SHOAL_EINVAL;
    if (cfg->split_min == 0)
        cfg->split_min = UINT64_MAX;   /* 0: never split */
    return 0;
}

static int parse_keep_spine(const char *v, daemon_config *cfg)
{
    static const char *const yes[] = { "yes", "true", "on", "1" }, *const no[] = { "no", "false",
                                                                                  "off", "0" };
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return cfg->keep_spine = 1, 0;
        if (strcasecmp(v, no[i]) == 0)
            return cfg->keep_spine = 0, 0;
    }
    return SHOAL_EINVAL;
}

static int parse_uint(const char *v, long lo, long hi, unsigned *out)
{
    long n;
    if (shoal_long_parse(v, lo, hi, &n) != 0)
        return SHOAL_EINVAL;
    *out = (unsigned)n;
    return 0;
}

static int parse_max_conns(const char *v, daemon_config *cfg)
{
    return parse_uint(v, 4, 65536, &cfg->lim.conns);
}

static int parse_max_conn_fds(const char *v, daemon_config *cfg)
{
    return parse_uint(v, 16, 1 << 20, &cfg->lim.conn_fds);
}

static int parse_max_fds(const char *v, daemon_config *cfg)
{
    return parse_uint(v, 16, 1 << 24, &cfg->lim.fds);
}

static int parse_max_buffered(const char *v, daemon_config *cfg)
{
    uint64_t n;
    /* one whole frame (1 MiB + 24) and a read chunk must fit */
    if (shoal_size_parse(v, &n) != 0 || n < (4u << 20))
        return SHOAL_EINVAL;
    cfg->lim.buffered = n;
    return 0;
}

static int parse_frame_timeout(const char *v, daemon_config *cfg)
{
    return parse_uint(v, 1, 3600, &cfg->lim.frame_secs);
}

/* RATE/SECS ("10K/30"), or off. */
static int parse_low_speed(const char *v, daemon_config *cfg)
{
    char rate[32];
    const char *slash = strchr(v, '/');
    uint64_t r;
    unsigned secs;
    if (strcasecmp(v, "off") == 0) {
        cfg->low_speed_rate = 0;
        return 0;
    }
    if (!slash || (size_t)(slash - v) >= sizeof rate)
        return SHOAL_EINVAL;
    memcpy(rate, v, (size_t)(slash - v));
    rate[slash - v] = '\0';
    if (shoal_size_parse(rate, &r) != 0 || r == 0 || parse_uint(slash + 1, 1, 3600, &secs) != 0)
        return SHOAL_EINVAL;
    cfg->low_speed_rate = r;
    cfg->low_speed_secs = secs;
    return 0;
}

static const struct {
    const char *key;
    setting_parse_fn parse;
    const char *hint;              /* what a good value looks like */
} settings[DSET_COUNT] = {
    [DSET_MAX_SIZE] = { "max-size", parse_max_size, "a size such as 200G, or auto" },
    [DSET_PARALLEL] = { "parallel", parse_parallel, "1..64" },
    [DSET_SPLIT_MIN] = { "split-min", parse_split_min, "a size such as 4M, or never" },
    [DSET_KEEP_SPINE] = { "keep-spine", parse_keep_spine, "yes or no" },
    [DSET_MAX_CONNS] = { "max-conns", parse_max_conns, "4..65536" },
    [DSET_MAX_CONN_FDS] = { "max-conn-fds", parse_max_conn_fds, "16..1048576" },
    [DSET_MAX_FDS] = { "max-fds", parse_max_fds, "16..16777216" },
    [DSET_MAX_BUFFERED] = { "max-buffered", parse_max_buffered, "a size of 4M or more" },
    [DSET_FRAME_TIMEOUT] = { "frame-timeout", parse_frame_timeout, "seconds, 1..3600" },
    [DSET_LOW_SPEED] = { "low-speed", parse_low_speed, "RATE/SECS such as 10K/30, or off" },
};

static const char *const from_names[] = { "default", SETTINGS_FILE, "command line" };

static char *trim(char *s)
{
    char *e;
    while (isspace((unsigned char)*s))
        s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static int setting_set(daemon_config *cfg, int k, const char *v, int from)
{
    if (settings[k].parse(v, cfg) != 0)
        return SHOAL_EINVAL;
    cfg->set[k].from = (uint8_t)from;
    snprintf(cfg->set[k].text, sizeof cfg->set[k].text, "%s", v);
    return 0;
}

/* Read the file's lines into cfg.  A missing file is no settings. */
static int settings_read(daemon_config *cfg, shoal_err *err)
{
    shoal_buf b;
    char *line, *next;
    int rc, n = 0;

    shoal_buf_init(&b, 0);
    rc = shoal_read_file(cfg->conf_path, SETTINGS_MAX_FILE, &b, NULL);
    if (rc == SHOAL_ENOTFOUND || (rc == 0 && !b.data)) {
        shoal_buf_free(&b);
        return 0;
    }
    if (rc) {
        shoal_buf_free(&b);
        return shoal_err_set(err, rc, "cannot read %s: %s", cfg->conf_path, shoal_strerror(rc));
    }
    for (line = (char *)b.data; rc == 0 && line && *line; line = next) {
        char *eq, *key, *val;
        int k = 0;
        n++;
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        if (strchr(line, '#'))
            *strchr(line, '#') = '\0';
        key = trim(line);
        if (!*key)
            continue;
        if (!(eq = strchr(key, '='))) {
            rc = shoal_err_set(err, SHOAL_EINVAL, "%s line %d: expected \"key = value\", not "
                               "\"%.80s\"", cfg->conf_path, n, key);
            break;
        }
        *eq = '\0';
        val = trim(eq + 1);
        key = trim(key);
        while (k < DSET_COUNT && strcmp(key, settings[k].key) != 0)
            k++;
        if (k == DSET_COUNT)
            rc = shoal_err_set(err, SHOAL_EINVAL, "%s line %d: unknown setting \"%.64s\" (known: "
                               "max-size, parallel, split-min, keep-spine, max-conns, "
                               "max-conn-fds, max-fds, max-buffered, frame-timeout, low-speed)",
                               cfg->conf_path, n, key);
        else if (setting_set(cfg, k, val, DSET_FILE) != 0)
            rc = shoal_err_set(err, SHOAL_EINVAL, "%s line %d: %s takes %s, not \"%.64s\" (fix "
                               "or remove the line)", cfg->conf_path, n, key, settings[k].hint, val);
    }
    shoal_buf_free(&b);
    return rc;
}

/* Every setting not at its default, as the file holds them. */
static int settings_write(const daemon_config *cfg, shoal_err *err)
{
    shoal_buf b;
    int rc = 0;

    shoal_buf_init(&b, SETTINGS_MAX_FILE);
    rc = shoal_buf_append_str(&b, "# shoald's settings, read at every start (docs/daemon.md). A "
                              "flag given on\n# shoald's command line overrides its line here "
                              "and is written back.\n");
    for (int k = 0; rc == 0 && k < DSET_COUNT; k++)
        if (cfg->set[k].from != DSET_DEFAULT)
            rc = shoal_buf_appendf(&b, "%s = %s\n", settings[k].key, cfg->set[k].text);
    if (rc == 0)
        rc = shoal_write_file_atomic(cfg->conf_path, b.data, b.len, err);
    else
        shoal_err_set(err, rc, "out of memory");
    shoal_buf_free(&b);
    return rc;
}

int settings_apply(daemon_config *cfg, const char *const args[DSET_COUNT], shoal_err *err)
{
    int rc, given = 0;

    cfg->parallel = 8;
    cfg->split_min = 0;
    cfg->max_size = 0;
    cfg->keep_spine = 0;
    cfg->lim.conns = DAEMON_DEFAULT_CONNS;
    cfg->lim.conn_fds = DAEMON_DEFAULT_CONN_FDS;
    cfg->lim.fds = DAEMON_DEFAULT_FDS;
    cfg->lim.buffered = DAEMON_DEFAULT_BUFFERED;
    cfg->lim.frame_secs = DAEMON_DEFAULT_FRAME_SECS;
    cfg->low_speed_rate = DAEMON_DEFAULT_LOW_SPEED_RATE;
    cfg->low_speed_secs = DAEMON_DEFAULT_LOW_SPEED_SECS;
    memset(cfg->set, 0, sizeof cfg->set);
    if (shoal_path_join(cfg->conf_path, sizeof cfg->conf_path, cfg->home, SETTINGS_FILE) != 0)
        return shoal_err_set(err, SHOAL_ETOOBIG, "home path too long");
    if ((rc = settings_read(cfg, err)) != 0)
        return rc;
    for (int k = 0; k < DSET_COUNT; k++) {
        if (!args[k])
            continue;
        given = 1;
        if (setting_set(cfg, k, args[k], DSET_ARGS) != 0)
            return shoal_err_set(err, SHOAL_EINVAL, "--%s takes %s, not \"%s\"", settings[k].key,
                                 settings[k].hint, args[k]);
    }
    /* Back to the default: no line (so a later default change applies). */
    if (args[DSET_MAX_SIZE] && cfg->max_size == 0)
        cfg->set[DSET_MAX_SIZE].from = DSET_DEFAULT;
    cfg->settings_given = given;
    return 0;
}

int settings_save(const daemon_config *cfg, shoal_err *err)
{
    return cfg->settings_given ? settings_write(cfg, err) : 0;
}

static const char *settings_from(const daemon_config *cfg, int k)
{
    return from_names[cfg->set[k].from < 3 ? cfg->set[k].from : 0];
}

void *settings_json(const daemon_config *cfg)
{
    shoal_json *o = shoal_json_object(), *from = shoal_json_object();
    if (!o || !from) {
        shoal_json_free(o);
        shoal_json_free(from);
        return NULL;
    }
    shoal_json_set_str(o, "file", cfg->conf_path);
    shoal_json_set_int(o, "max_size", (int64_t)cfg->max_size);
    shoal_json_set_int(o, "parallel", cfg->parallel);
    /* 0: the fetcher's default; -1: never split */
    shoal_json_set_int(o, "split_min", cfg->split_min == UINT64_MAX ? -1 : (int64_t)cfg->split_min);
    shoal_json_set_take(o, "keep_spine", shoal_json_new_bool(cfg->keep_spine));
    shoal_json_set_int(o, "max_conns", cfg->lim.conns);
    shoal_json_set_int(o, "max_conn_fds", cfg->lim.conn_fds);
    shoal_json_set_int(o, "max_fds", cfg->lim.fds);
    shoal_json_set_int(o, "max_buffered", (int64_t)cfg->lim.buffered);
    shoal_json_set_int(o, "frame_timeout", cfg->lim.frame_secs);
    shoal_json_set_int(o, "low_speed_rate", (int64_t)cfg->low_speed_rate);
    shoal_json_set_int(o, "low_speed_secs", cfg->low_speed_secs);
    for (int k = 0; k < DSET_COUNT; k++)
        shoal_json_set_str(from, settings[k].key, settings_from(cfg, k));
    shoal_json_set_take(o, "from", from);
    return o;
}
