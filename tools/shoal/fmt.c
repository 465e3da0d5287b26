/* fmt.c — how the CLI prints numbers and tables for people: sizes in
 * binary units, rates, percentages, durations, aligned columns.  (The
 * progress display is every program's: common/progress.h.)
 */
#include "tools/shoal/shoal_int.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *fmt_size(uint64_t bytes, char *out)
{
    return shoal_size_format(bytes, out, FMT_MAX);
}

const char *fmt_rate(double bps, char *out)
{
    char s[FMT_MAX - 8];
    if (bps < 0)
        bps = 0;
    shoal_size_format((uint64_t)(bps + 0.5), s, sizeof s);
    snprintf(out, FMT_MAX, "%s/s", s);
    return out;
}

const char *fmt_pct(double r, char *out)
{
    snprintf(out, FMT_MAX, "%.1f %%", r * 100.0);
    return out;
}

const char *fmt_count(uint64_t n, char *out)
{
    char tmp[32];
    int len = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)n), o = 0;
    for (int i = 0; i < len; i++) {
        if (i > 0 && (len - i) % 3 == 0)
            out[o++] = ',';
        out[o++] = tmp[i];
    }
    out[o] = 0;
    return out;
}

const char *fmt_duration(double s, char *out)
{
    if (s < 0 || s != s)
        snprintf(out, FMT_MAX, "?");
    else if (s < 1.0)
        snprintf(out, FMT_MAX, "%.0f ms", s * 1e3);
    else if (s < 60.0)
        snprintf(out, FMT_MAX, "%.1f s", s);
    else if (s < 3600.0)
        snprintf(out, FMT_MAX, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else if (s < 86400.0 * 365)
        snprintf(out, FMT_MAX, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else
        snprintf(out, FMT_MAX, "%.1f years", s / (86400.0 * 365));
    return out;
}

const char *fmt_time(int64_t ms, char *out)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (ms <= 0 || !localtime_r(&t, &tm))
        snprintf(out, FMT_MAX, "-");
    else
        strftime(out, FMT_MAX, "%Y-%m-%d %H:%M:%S", &tm);
    return out;
}

#define KV_COL 32

void fmt_kv(FILE *f, int indent, const char *label, const char *fmt, ...)
{
    va_list ap;
    int n = fprintf(f, "%*s%s", indent, "", label);
    fprintf(f, "%*s", n < KV_COL ? KV_COL - n : 1, "");
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
}

/* ---- tables ------------------------------------------------------------------- */

struct fmt_table {
    int    ncols;
    char   align[16];
    char **cells;          /* rows * ncols, row 0 the headers */
    size_t nrows, cap;
};

static int table_add(fmt_table *t, va_list ap)
{
    if (t->nrows == t->cap) {
        size_t nc = t->cap ? t->cap * 2 : 16;
        char **p = realloc(t->cells, nc * (size_t)t->ncols * sizeof *p);
        if (!p)
            return -1;
        t->cells = p;
        t->cap = nc;
    }
    char **row = t->cells + t->nrows * (size_t)t->ncols;
    for (int i = 0; i < t->ncols; i++) {
        const char *s = va_arg(ap, const char *);
        row[i] = strdup(s ? s : "");
    }
    t->nrows++;
    return 0;
}

fmt_table *fmt_table_new(const char *align, ...)
{
    fmt_table *t = calloc(1, sizeof *t);
    va_list ap;
    if (!t)
        return NULL;
    t->ncols = (int)strlen(align);
    if (t->ncols > 15)
        t->ncols = 15;
    memcpy(t->align, align, (size_t)t->ncols);
    va_start(ap, align);
    table_add(t, ap);
    va_end(ap);
    return t;
}

void fmt_table_row(fmt_table *t, ...)
{
    va_list ap;
    if (!t)
        return;
    va_start(ap, t);
    table_add(t, ap);
    va_end(ap);
}

void fmt_table_print(const fmt_table *t, FILE *f, int indent)
{
    int w[16] = { 0 };
    if (!t)
        return;
    for (size_t r = 0; r < t->nrows; r++)
        for (int c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * (size_t)t->ncols + (size_t)c];
            int n = s ? (int)strlen(s) : 0;
            if (n > w[c])
                w[c] = n;
        }
    for (size_t r = 0; r < t->nrows; r++) {
        fprintf(f, "%*s", indent, "");
        for (int c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * (size_t)t->ncols + (size_t)c];
            int last = c == t->ncols - 1;
            if (t->align[c] == 'r')
                fprintf(f, "%*s", w[c], s ? s : "");
            else if (last)
                fprintf(f, "%s", s ? s : "");
            else
                fprintf(f, "%-*s", w[c], s ? s : "");
            if (!last)
                fputs("  ", f);
        }
        fputc('\n', f);
    }
}

void fmt_table_free(fmt_table *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
}
