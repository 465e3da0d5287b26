/* progress.h — the one progress display of every shoal program.
 *
 * Owns: how progress looks and when it is drawn.  On a terminal, one line
 * redrawn in place with '\r' (a bar, percent, bytes, rate, ETA, the
 * caller's extra text), at most ten times a second; anywhere else (a pipe,
 * a file, a log) no '\r' and no escape ever: one plain line every
 * interval (5 s), one when the phase changes, and one at the end.  Colour
 * (the bar's filled part) only on a terminal and never with NO_COLOR.
 * Off entirely with --quiet or HF_HUB_DISABLE_PROGRESS_BARS (the
 * command's result is still printed).  Does not own what is measured: the
 * caller hands done/total in bytes (or any unit with SHOAL_METER_COUNT).
 *
 * The environment is read at the program's edge (shoal_meter_env_capture
 * from main) into a shoal_meter_cfg that is passed down.  A meter is used
 * from one thread at a time.
 *
 *   tty:   warm [##########..........]  50.0 %  1.20 MiB / 2.40 MiB  310 KiB/s  ETA 4 s  53/106 objects
 *   plain: warm  50.0 %  1.20 MiB / 2.40 MiB  310 KiB/s  ETA 4 s  53/106 objects
 */
#ifndef SHOAL_PROGRESS_H
#define SHOAL_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct shoal_meter_cfg {
    int      off;             /* --quiet, HF_HUB_DISABLE_PROGRESS_BARS: draw nothing */
    int      no_color;        /* NO_COLOR (any value but empty) */
    int      plain;           /* plain lines even on a terminal (TERM=dumb) */
    unsigned interval_ms;     /* plain lines: one per interval (0: 5000) */
} shoal_meter_cfg;

/* For main() only: NO_COLOR, HF_HUB_DISABLE_PROGRESS_BARS, TERM into cfg
 * (zeroed first; quiet: the program's --quiet). */
void shoal_meter_env_capture(shoal_meter_cfg *cfg, int quiet);

enum { SHOAL_METER_BYTES = 0, SHOAL_METER_COUNT = 1 };

#define SHOAL_METER_WINDOW 16

typedef struct shoal_meter {
    FILE    *out;
    shoal_meter_cfg cfg;
    int      tty, unit;
    char     label[48];
    char     phase[128];
    uint64_t last_ns;         /* last line drawn */
    uint64_t done, total, now_ns;   /* the latest update */
    size_t   drawn;           /* width of the line on the terminal (to blank it) */
    int      open;            /* a tty line without its newline yet */
    /* the rate: from the oldest of these samples to the latest update */
    uint64_t t_ns[SHOAL_METER_WINDOW], v[SHOAL_METER_WINDOW];
    int      ns, head;
} shoal_meter;

/* A meter writing to out (stderr, normally).  label (may be NULL) starts
 * every line; unit: SHOAL_METER_BYTES or _COUNT. */
void shoal_meter_init(shoal_meter *m, FILE *out, const shoal_meter_cfg *cfg, const char *label,
                      int unit);

/* done of total (0: unknown) in phase (may be NULL); extra (may be NULL)
 * goes at the end of the line.  Draws when it is time to. */
void shoal_meter_update(shoal_meter *m, const char *phase, uint64_t done, uint64_t total,
                        const char *extra);
/* The same at a given time (monotonic ns): for tests. */
void shoal_meter_update_at(shoal_meter *m, uint64_t now_ns, const char *phase, uint64_t done,
                           uint64_t total, const char *extra);

/* The last line, with the figures of the last update (drawn or not) and
 * extra, then a newline.  Nothing when there was no update.  The meter
 * may be used again (a new first line). */
void shoal_meter_end(shoal_meter *m, const char *extra);

/* Blank the terminal line (before printing something else); the next
 * update draws again.  Nothing on a pipe. */
void shoal_meter_clear(shoal_meter *m);

/* Bytes per second over the recent updates (0 before two). */
double shoal_meter_rate(const shoal_meter *m);

#endif
