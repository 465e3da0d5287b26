/* progress.c — the progress display (common/progress.h): when to draw,
 * the bar on a terminal, the plain lines elsewhere, the rate and ETA.
 *
 * A line on a terminal is kept narrower than the terminal (a line that
 * wraps cannot be redrawn with '\r'): the bar shrinks first, then the
 * extra text is cut.  It is blanked with spaces, not an escape sequence,
 * so a dumb terminal shows it right too.
 */
#include "common/progress.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "common/path.h"
#include "common/sys.h"

#define TTY_MIN_NS   100000000ull    /* a terminal line: at most 10 redraws a second */
#define DEFAULT_MS   5000u
#define BAR_MAX      30
#define LINE_MAX_    512

void shoal_meter_env_capture(shoal_meter_cfg *cfg, int quiet)
{
    /* The program's edge: main() calls this once.  lint: allow getenv */
    const char *nc = getenv("NO_COLOR");                          /* lint: allow */
    const char *hf = getenv("HF_HUB_DISABLE_PROGRESS_BARS");      /* lint: allow */
    const char *term = getenv("TERM");                            /* lint: allow */

    memset(cfg, 0, sizeof *cfg);
    cfg->no_color = nc && nc[0];
    /* huggingface_hub's reading: set to anything but "", "0", "false" */
    cfg->off = quiet || (hf && hf[0] && strcmp(hf, "0") != 0 && strcasecmp(hf, "false") != 0);
    cfg->plain = term && strcmp(term, "dumb") == 0;
}

void shoal_meter_init(shoal_meter *m, FILE *out, const shoal_meter_cfg *cfg, const char *label,
                      int unit)
{
    memset(m, 0, sizeof *m);
    m->out = out;
    if (cfg)
        m->cfg = *cfg;
    if (!m->cfg.interval_ms)
        m->cfg.interval_ms = DEFAULT_MS;
    m->tty = out && !m->cfg.plain && isatty(fileno(out));
    m->unit = unit;
    snprintf(m->label, sizeof m->label, "%s", label ? label : "");
}

double shoal_meter_rate(const shoal_meter *m)
{
    int oldest = (m->head + SHOAL_METER_WINDOW - m->ns) % SHOAL_METER_WINDOW;
    double dt;

    if (m->ns == 0 || m->done < m->v[oldest])
        return 0.0;
    dt = (double)(m->now_ns - m->t_ns[oldest]) / 1e9;
    return dt >= 0.05 ? (double)(m->done - m->v[oldest]) / dt : 0.0;
}

/* The rate runs from the oldest sample kept to the latest update: one
 * sample per 250 ms, so the window spans ~4 s however often updates come. */
static void sample(shoal_meter *m, uint64_t now, uint64_t done)
{
    int last = (m->head + SHOAL_METER_WINDOW - 1) % SHOAL_METER_WINDOW;

    m->now_ns = now;
    if (m->ns && now - m->t_ns[last] < 250000000ull)
        return;
    m->t_ns[m->head] = now;
    m->v[m->head] = done;
    m->head = (m->head + 1) % SHOAL_METER_WINDOW;
    if (m->ns < SHOAL_METER_WINDOW)
        m->ns++;
}

static void amount(const shoal_meter *m, uint64_t v, char *out, size_t cap)
{
    if (m->unit == SHOAL_METER_BYTES)
        shoal_size_format(v, out, cap);
    else
        snprintf(out, cap, "%llu", (unsigned long long)v);
}

static void duration(double s, char *out, size_t cap)
{
    if (!(s >= 0) || s > 86400.0 * 365)
        snprintf(out, cap, "?");
    else if (s < 60)
        snprintf(out, cap, "%.0f s", s);
    else if (s < 3600)
        snprintf(out, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else
        snprintf(out, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

/* The figures after the bar: "50.0 %  1.20 MiB / 2.40 MiB  310 KiB/s  ETA 4 s". */
static void figures(const shoal_meter *m, char *out, size_t cap)
{
    char a[32], b[32], r[40], e[32];
    double rate = shoal_meter_rate(m);

    amount(m, m->done, a, sizeof a);
    amount(m, (uint64_t)(rate + 0.5), r, sizeof r);
    if (m->unit == SHOAL_METER_BYTES)
        snprintf(r + strlen(r), sizeof r - strlen(r), "/s");
    else
        snprintf(r + strlen(r), sizeof r - strlen(r), " /s");
    if (!m->total) {
        snprintf(out, cap, "%s  %s", a, r);
        return;
    }
    amount(m, m->total, b, sizeof b);
    if (m->done >= m->total)
        snprintf(e, sizeof e, "0 s");
    else if (rate > 0)
        duration((double)(m->total - m->done) / rate, e, sizeof e);
    else
        snprintf(e, sizeof e, "?");
    snprintf(out, cap, "%5.1f %%  %s / %s  %s  ETA %s",
             100.0 * (double)(m->done < m->total ? m->done : m->total) / (double)m->total, a, b,
             r, e);
}

static int term_width(const shoal_meter *m)
{
    struct winsize ws;
    if (ioctl(fileno(m->out), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 80;
}

/* The words before the figures: "label phase" (either may be empty). */
static void head(const shoal_meter *m, char *out, size_t cap)
{
    snprintf(out, cap, "%s%s%s", m->label, m->label[0] && m->phase[0] ? " " : "", m->phase);
}

static void draw_plain(shoal_meter *m, const char *extra)
{
    char h[192], fig[160];
    head(m, h, sizeof h);
    figures(m, fig, sizeof fig);
    fprintf(m->out, "%s%s%s%s%s\n", h, h[0] ? "  " : "", fig, extra && extra[0] ? "  " : "",
            extra ? extra : "");
    fflush(m->out);
}

/* A bar of width w (0: none) filled to frac, coloured unless no_color. */
static size_t bar_text(char *out, size_t cap, int w, double frac, int color)
{
    char b[BAR_MAX + 1];
    int fill;

    if (w <= 0)
        return 0;
    fill = (int)((frac > 1 ? 1 : frac) * w + 0.5);
    memset(b, '#', (size_t)fill);
    memset(b + fill, '.', (size_t)(w - fill));
    b[w] = '\0';
    return (size_t)snprintf(out, cap, "[%s%.*s%s%s] ", color ? "\033[32m" : "", fill, b,
                            color ? "\033[0m" : "", b + fill);
}

/* The terminal line: what does not fit goes in this order: the bar's
 * length past 10, the extra text, the head's end, the bar. */
static void draw_tty(shoal_meter *m, const char *extra)
{
    char h[192], fig[160], line[LINE_MAX_];
    int width = term_width(m) - 1, room, bar = 0;
    size_t len, hl, el = extra ? strlen(extra) : 0, vis;
    int color = !m->cfg.no_color;

    head(m, h, sizeof h);
    figures(m, fig, sizeof fig);
    hl = strlen(h);
    room = width - (int)strlen(fig) - 3;   /* "[" "] " */
    if (m->total) {
        if (room - (int)(hl + 1 + (el ? el + 2 : 0)) < 10)
            el = 0;
        if (room - (int)(hl + 1) < 10 && room >= 10 + 1)
            hl = (size_t)(room - 10 - 1 > 0 ? room - 10 - 1 : 0);
        bar = room - (int)(hl ? hl + 1 : 0) - (int)(el ? el + 2 : 0);
        bar = bar > BAR_MAX ? BAR_MAX : bar < 10 ? 0 : bar;
    }
    len = (size_t)snprintf(line, sizeof line, "%.*s%s", (int)hl, h, hl ? " " : "");
    len += bar_text(line + len, sizeof line - len, bar,
                    m->total ? (double)m->done / (double)m->total : 0.0, color);
    snprintf(line + len, sizeof line - len, "%s%s%.*s", fig, el ? "  " : "", (int)el,
             el ? extra : "");
    /* visible width: the colour codes take none */
    vis = strlen(line) - (bar && color ? 9 : 0);
    len = strlen(line);
    if (vis > (size_t)width) {
        len -= vis - (size_t)width;
        vis = (size_t)width;
    }
    fprintf(m->out, "\r%.*s", (int)len, line);
    if (vis < m->drawn)
        fprintf(m->out, "%*s", (int)(m->drawn - vis), "");
    m->drawn = vis;
    m->open = 1;
    fflush(m->out);
}

void shoal_meter_update_at(shoal_meter *m, uint64_t now_ns, const char *phase, uint64_t done,
                           uint64_t total, const char *extra)
{
    int changed;

    if (!m->out || m->cfg.off)
        return;
    phase = phase ? phase : "";
    changed = strncmp(phase, m->phase, sizeof m->phase - 1) != 0;
    if (changed && m->ns && m->tty && m->open) {
        /* a new phase: the last one's line stays */
        fputc('\n', m->out);
        m->open = 0;
        m->drawn = 0;
    }
    if (m->ns && (total != m->total || done < m->done)) {
        /* another piece of work (not the next step of this one): a new rate */
        m->ns = 0;
        m->head = 0;
    }
    snprintf(m->phase, sizeof m->phase, "%s", phase);
    m->done = done;
    m->total = total;
    sample(m, now_ns, done);
    if (m->tty) {
        if (!changed && m->last_ns && now_ns - m->last_ns < TTY_MIN_NS)
            return;
        m->last_ns = now_ns;
        draw_tty(m, extra);
        return;
    }
    if (!changed && m->last_ns && now_ns - m->last_ns < (uint64_t)m->cfg.interval_ms * 1000000ull)
        return;
    m->last_ns = now_ns;
    draw_plain(m, extra);
}

void shoal_meter_update(shoal_meter *m, const char *phase, uint64_t done, uint64_t total,
                        const char *extra)
{
    shoal_meter_update_at(m, shoal_now_ns(), phase, done, total, extra);
}

void shoal_meter_end(shoal_meter *m, const char *extra)
{
    if (!m->out || m->cfg.off || !m->ns)
        return;
    if (m->tty) {
        draw_tty(m, extra);
        fputc('\n', m->out);
        m->open = 0;
        m->drawn = 0;
    } else {
        draw_plain(m, extra);
    }
    fflush(m->out);
    m->ns = 0;
    m->last_ns = 0;
    m->phase[0] = '\0';
}

void shoal_meter_clear(shoal_meter *m)
{
    if (!m->out || !m->tty || !m->open)
        return;
    fprintf(m->out, "\r%*s\r", (int)m->drawn, "");
    fflush(m->out);
    m->open = 0;
    m->drawn = 0;
    m->last_ns = 0;
}
