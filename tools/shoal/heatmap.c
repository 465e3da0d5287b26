/* heatmap.c — `shoal heatmap`: a model's layer x expert request counts
 * (what reached the disk cache) as an SVG a person reads at a glance —
 * axes, a legend, each layer's hit rate — as ASCII in the terminal, or as
 * JSON with the numbers the picture shows.
 *
 * Cells.  One row per layer; a layer's experts go into at most --columns
 * cells (128), each of a power-of-two number of experts (K3's 896 experts
 * become 112 cells of 8), so the picture has the same shape whatever the
 * model and stays small: an SVG of 93 x 112 cells is about 0.3 MB.
 *
 * Colour.  A cell's requests per expert divided by its layer's mean, on a
 * log scale centred on 1 (white), blue below, red above, clamped at
 * 1/--range and --range (4): K3 routes almost evenly (every expert near
 * its layer's mean), so an absolute scale paints it one colour, while the
 * ratio shows how flat a layer is and which experts stand out.  Zero
 * requests are grey.
 *
 * SVG form.  Up to SMALL_CELLS cells: one <rect class="cell"> per cell
 * with data-* attributes and a tooltip.  Larger maps draw each layer as a
 * few <path> elements (one per colour, adjacent cells of a colour merged)
 * under a <g> whose tooltip summarises the layer: a browser opens it at
 * once, where one element per expert (82,432 for K3) made a 12 MB file.
 * The exact counts are `--json` (cells) and `shoal stats --by expert
 * --json` (experts).
 */
#include "tools/shoal/shoal_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define HM_ZERO      "#c8c8c8"
#define HM_BINS      11
#define HM_MID       5            /* the bin of ratio 1 */
#define SMALL_CELLS  4096         /* above this, paths instead of a rect per cell */
#define MAX_COLUMNS  256

/* ColorBrewer RdBu, reversed: cold blue, white at the mean, hot red. */
static const char *const palette[HM_BINS] = {
    "#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7",
    "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f"
};
/* The same scale in the terminal: '=' is the layer's mean. */
static const char ascii_ramp[HM_BINS + 1] = "_.,:-=+*#%@";

typedef struct grid {
    int64_t   layers, experts;
    int64_t  *req, *hits;      /* layers * experts */
    double   *layer_rate;      /* disk hit rate per layer, -1: never asked */
    int64_t  *layer_req;       /* requests per layer (sum over its experts) */
    int64_t   max;             /* busiest expert */
    char      name[512];
    /* cells */
    int64_t   per, cols;       /* experts per cell, cells per row */
    int64_t  *cell_req, *cell_hits;   /* layers * cols */
    double    range;
} grid;

/* ---- the scale --------------------------------------------------------------------------- */

/* The colour bin of a ratio to the layer mean; -1 for no requests. */
static int ratio_bin(double ratio, double range)
{
    if (!(ratio > 0))
        return -1;
    int b = (int)floor(log(ratio) / log(range) * HM_MID + 0.5) + HM_MID;
    return b < 0 ? 0 : b >= HM_BINS ? HM_BINS - 1 : b;
}

/* Requests of cell (l, c) per expert, over the layer's mean per expert. */
static double cell_ratio(const grid *g, int64_t l, int64_t c)
{
    int64_t first = c * g->per, n = g->experts - first < g->per ? g->experts - first : g->per;
    double mean = (double)g->layer_req[l] / (double)g->experts;
    if (mean <= 0 || n <= 0)
        return 0;
    return (double)g->cell_req[l * g->cols + c] / (double)n / mean;
}

static const char *cell_colour(const grid *g, int64_t l, int64_t c)
{
    int b = ratio_bin(cell_ratio(g, l, c), g->range);
    return b < 0 ? HM_ZERO : palette[b];
}

/* ---- the grid ------------------------------------------------------------------------------ */

static int grid_build(const shoal_json *j, grid *g, shoal_err *err)
{
    shoal_json *ms = shoal_json_get(j, "models"), *m, *ex, *ls;
    int64_t id;

    if (!ms || shoal_json_array_size(ms) != 1)
        return shoal_err_set(err, SHOAL_EINVAL, "the model spec matches %zu models; name one "
                             "(`shoal ls` lists them, e.g. org/name@revision)",
                             ms ? shoal_json_array_size(ms) : 0);
    m = shoal_json_array_at(ms, 0);
    id = jint(m, "id", 0);
    stats_model_name(m, g->name, sizeof g->name);
    g->layers = jint(m, "coverage.layers", 0);
    g->experts = jint(m, "coverage.experts_per_layer", 0);
    ex = shoal_json_get(j, "experts");
    ls = shoal_json_get(j, "layers");
    /* Without a cached manifest the counters alone give the extent. */
    for (size_t i = 0; ex && i < shoal_json_array_size(ex); i++) {
        const shoal_json *r = shoal_json_array_at(ex, i);
        if (jint(r, "model", 0) != id)
            continue;
        if (jint(r, "layer", 0) + 1 > g->layers)
            g->layers = jint(r, "layer", 0) + 1;
        if ((int64_t)shoal_json_array_size(shoal_json_get(r, "requests")) > g->experts)
            g->experts = (int64_t)shoal_json_array_size(shoal_json_get(r, "requests"));
    }
    if (g->layers <= 0 || g->experts <= 0 || g->layers > 4096 || g->experts > 65536)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "no expert requests counted for %s yet, and "
                             "its manifest is not cached: nothing to draw", g->name);
    size_t n = (size_t)(g->layers * g->experts);
    g->req = calloc(n, sizeof *g->req);
    g->hits = calloc(n, sizeof *g->hits);
    g->layer_rate = malloc((size_t)g->layers * sizeof *g->layer_rate);
    g->layer_req = calloc((size_t)g->layers, sizeof *g->layer_req);
    if (!g->req || !g->hits || !g->layer_rate || !g->layer_req)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (int64_t l = 0; l < g->layers; l++)
        g->layer_rate[l] = -1;
    for (size_t i = 0; ex && i < shoal_json_array_size(ex); i++) {
        const shoal_json *r = shoal_json_array_at(ex, i);
        int64_t l = jint(r, "layer", -1);
        shoal_json *rq = shoal_json_get(r, "requests"), *hs = shoal_json_get(r, "hits");
        if (jint(r, "model", 0) != id || l < 0 || l >= g->layers)
            continue;
        for (size_t e = 0; e < shoal_json_array_size(rq) && (int64_t)e < g->experts; e++) {
            int64_t c = shoal_json_int_value(shoal_json_array_at(rq, e));
            g->req[l * g->experts + (int64_t)e] = c;
            g->hits[l * g->experts + (int64_t)e] = shoal_json_int_value(shoal_json_array_at(hs, e));
            g->layer_req[l] += c;
            if (c > g->max)
                g->max = c;
        }
    }
    for (size_t i = 0; ls && i < shoal_json_array_size(ls); i++) {
        const shoal_json *r = shoal_json_array_at(ls, i);
        int64_t l = jint(r, "layer", -1);
        if (jint(r, "model", 0) != id || l < 0 || l >= g->layers || !jint(r, "disk.requests", 0))
            continue;
        g->layer_rate[l] = jnum(r, "disk.hit_rate", 0);
    }
    return 0;
}

/* Gather experts into at most max_cols cells per row, a power of two each. */
static int grid_cells(grid *g, int64_t max_cols, shoal_err *err)
{
    g->per = 1;
    while ((g->experts + g->per - 1) / g->per > max_cols)
        g->per *= 2;
    g->cols = (g->experts + g->per - 1) / g->per;
    g->cell_req = calloc((size_t)(g->layers * g->cols), sizeof *g->cell_req);
    g->cell_hits = calloc((size_t)(g->layers * g->cols), sizeof *g->cell_hits);
    if (!g->cell_req || !g->cell_hits)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (int64_t l = 0; l < g->layers; l++)
        for (int64_t e = 0; e < g->experts; e++) {
            g->cell_req[l * g->cols + e / g->per] += g->req[l * g->experts + e];
            g->cell_hits[l * g->cols + e / g->per] += g->hits[l * g->experts + e];
        }
    return 0;
}

static void grid_free(grid *g)
{
    free(g->req);
    free(g->hits);
    free(g->layer_rate);
    free(g->layer_req);
    free(g->cell_req);
    free(g->cell_hits);
}

/* The busiest expert of layer l (-1 when the layer has no requests). */
static int64_t layer_hottest(const grid *g, int64_t l)
{
    int64_t best = -1, n = 0;
    for (int64_t e = 0; e < g->experts; e++)
        if (g->req[l * g->experts + e] > n) {
            n = g->req[l * g->experts + e];
            best = e;
        }
    return best;
}

/* ---- SVG ------------------------------------------------------------------------------------ */

typedef struct layout {
    int cw, ch, left, top, gw, gh, W, H;
} layout;

static layout layout_of(const grid *g)
{
    layout y;
    y.cw = (int)fmin(28.0, fmax(4.0, 1000.0 / (double)g->cols));
    y.ch = (int)fmin(24.0, fmax(3.0, 700.0 / (double)g->layers));
    y.left = 70;
    y.top = 56;
    y.gw = y.cw * (int)g->cols;
    y.gh = y.ch * (int)g->layers;
    y.W = y.left + y.gw + 150 < 760 ? 760 : y.left + y.gw + 150;
    y.H = y.top + y.gh + 96;
    return y;
}

static int64_t nice_step(int64_t n, int64_t want)
{
    static const int64_t steps[] = { 1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200,
                                     250, 256, 500, 512, 1000, 1024, 2048, 4096 };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
        if (n / steps[i] <= want)
            return steps[i];
    return 8192;
}

static void svg_escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

static void svg_legend(FILE *f, const grid *g, int x, int y)
{
    fprintf(f, "<g id=\"legend\" font-size=\"11\">\n<text x=\"%d\" y=\"%d\">requests per expert "
               "&#247; the layer's mean (log scale; a cell is %lld expert%s)</text>\n", x, y - 6,
            (long long)g->per, g->per > 1 ? "s" : "");
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"28\" height=\"14\" fill=\"%s\" stroke=\"#999\"/>"
               "<text x=\"%d\" y=\"%d\">0</text>\n", x, y, HM_ZERO, x + 10, y + 27);
    for (int b = 0; b < HM_BINS; b++) {
        int bx = x + 36 + b * 52;
        double lo = pow(g->range, ((double)b - HM_MID - 0.5) / HM_MID);
        double hi = pow(g->range, ((double)b - HM_MID + 0.5) / HM_MID);
        double mid = pow(g->range, ((double)b - HM_MID) / HM_MID);
        fprintf(f, "<rect class=\"key\" data-bin=\"%d\" x=\"%d\" y=\"%d\" width=\"48\" "
                   "height=\"14\" fill=\"%s\" stroke=\"#999\"/>", b, bx, y, palette[b]);
        if (b == 0)
            fprintf(f, "<text x=\"%d\" y=\"%d\">&lt;%.2g&#215;</text>\n", bx, y + 27, hi);
        else if (b == HM_BINS - 1)
            fprintf(f, "<text x=\"%d\" y=\"%d\">&gt;%.2g&#215;</text>\n", bx, y + 27, lo);
        else
            fprintf(f, "<text x=\"%d\" y=\"%d\">%.2g&#215;</text>\n", bx, y + 27, mid);
    }
    fprintf(f, "</g>\n");
}

/* One <rect> per cell, with its numbers (small maps). */
static void svg_cells_rects(FILE *f, const grid *g, const layout *y)
{
    for (int64_t l = 0; l < g->layers; l++)
        for (int64_t c = 0; c < g->cols; c++) {
            int64_t n = g->cell_req[l * g->cols + c], h = g->cell_hits[l * g->cols + c];
            int64_t first = c * g->per;
            int64_t last = first + g->per - 1 < g->experts - 1 ? first + g->per - 1 : g->experts - 1;
            double r = cell_ratio(g, l, c);
            fprintf(f, "<rect class=\"cell\" x=\"%lld\" y=\"%lld\" width=\"%d\" height=\"%d\" "
                       "fill=\"%s\" data-layer=\"%lld\" data-expert=\"%lld\" data-experts=\"%lld\" "
                       "data-requests=\"%lld\" data-hits=\"%lld\" data-ratio=\"%.4f\"><title>layer "
                       "%lld expert%s %lld%s", (long long)(y->left + c * y->cw),
                    (long long)(y->top + l * y->ch), y->cw, y->ch, cell_colour(g, l, c),
                    (long long)l, (long long)first, (long long)(last - first + 1), (long long)n,
                    (long long)h, r, (long long)l, last > first ? "s" : "", (long long)first,
                    last > first ? "" : "");
            if (last > first)
                fprintf(f, "-%lld", (long long)last);
            fprintf(f, ": %lld requests (%.2f&#215; the layer's mean), %lld hits</title></rect>\n",
                    (long long)n, r, (long long)h);
        }
}

/* Per layer, one <path> per colour: runs of adjacent cells of one colour
 * become one rectangle (large maps). */
static void svg_cells_paths(FILE *f, const grid *g, const layout *y)
{
    char a[FMT_MAX], b[FMT_MAX];
    for (int64_t l = 0; l < g->layers; l++) {
        int64_t hot = layer_hottest(g, l);
        double mean = (double)g->layer_req[l] / (double)g->experts;
        fprintf(f, "<g class=\"row\" data-layer=\"%lld\" data-requests=\"%lld\"><title>layer %lld: "
                   "%s requests", (long long)l, (long long)g->layer_req[l], (long long)l,
                fmt_count((uint64_t)g->layer_req[l], a));
        if (hot >= 0)
            fprintf(f, ", %s per expert on average; busiest expert %lld: %s (%.2f&#215;)",
                    fmt_count((uint64_t)(mean + 0.5), b), (long long)hot,
                    fmt_count((uint64_t)g->req[l * g->experts + hot], a),
                    (double)g->req[l * g->experts + hot] / mean);
        if (g->layer_rate[l] >= 0)
            fprintf(f, "; disk hit rate %.1f %%", 100.0 * g->layer_rate[l]);
        fputs("</title>\n", f);
        for (int bin = -1; bin < HM_BINS; bin++) {
            int open = 0;
            for (int64_t c = 0; c < g->cols;) {
                int64_t run = 1;
                if (ratio_bin(cell_ratio(g, l, c), g->range) != bin) {
                    c++;
                    continue;
                }
                while (c + run < g->cols && ratio_bin(cell_ratio(g, l, c + run), g->range) == bin)
                    run++;
                if (!open)
                    fprintf(f, "<path fill=\"%s\" d=\"", bin < 0 ? HM_ZERO : palette[bin]);
                open = 1;
                fprintf(f, "M%lld %lldh%lldv%dh-%lldz", (long long)(y->left + c * y->cw),
                        (long long)(y->top + l * y->ch), (long long)(run * y->cw), y->ch,
                        (long long)(run * y->cw));
                c += run;
            }
            if (open)
                fputs("\"/>\n", f);
        }
        fputs("</g>\n", f);
    }
}

static void svg_axes(FILE *f, const grid *g, const layout *y)
{
    int64_t xs = nice_step(g->experts, 16), ys = nice_step(g->layers, (int64_t)(y->gh / 14 + 1));
    if (xs < g->per)
        xs = g->per;
    fprintf(f, "<g id=\"x-axis\" font-size=\"10\" text-anchor=\"middle\">\n");
    for (int64_t e = 0; e < g->experts; e += xs) {
        double x = y->left + (double)e / (double)g->per * y->cw + (g->per == 1 ? y->cw / 2.0 : 0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#666\"/>"
                   "<text x=\"%.1f\" y=\"%d\">%lld</text>\n", x, y->top + y->gh, x,
                y->top + y->gh + 4, x, y->top + y->gh + 15, (long long)e);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">expert</text>\n</g>\n",
            y->left + y->gw / 2, y->top + y->gh + 30);
    fprintf(f, "<g id=\"y-axis\" font-size=\"10\" text-anchor=\"end\">\n");
    for (int64_t l = 0; l < g->layers; l += ys)
        fprintf(f, "<text x=\"%d\" y=\"%lld\">%lld</text>\n", y->left - 4,
                (long long)(y->top + l * y->ch + y->ch / 2 + 4), (long long)l);
    fprintf(f, "<text x=\"14\" y=\"%d\" font-size=\"12\" transform=\"rotate(-90 14 %d)\" "
               "text-anchor=\"middle\">layer</text>\n</g>\n", y->top + y->gh / 2,
            y->top + y->gh / 2);
}

/* Per-layer hit rates: a bar (full = 100 %) and, when rows are tall
 * enough to read, the figure. */
static void svg_rates(FILE *f, const grid *g, const layout *y)
{
    int ch = y->ch, x0 = y->left + y->gw + 8;
    fprintf(f, "<g id=\"hit-rates\" font-size=\"%d\">\n<text x=\"%d\" y=\"%d\" font-size=\"11\">"
               "disk hit rate</text>\n", ch >= 9 && ch < 12 ? ch - 1 : 11, x0, y->top - 4);
    for (int64_t l = 0; l < g->layers; l++) {
        double r = g->layer_rate[l];
        long long ry = (long long)(y->top + l * ch + (ch > 3 ? 1 : 0));
        if (r < 0)
            continue;
        fprintf(f, "<rect x=\"%d\" y=\"%lld\" width=\"60\" height=\"%d\" fill=\"#e4e4e4\"/>",
                x0, ry, ch > 3 ? ch - 2 : ch);
        fprintf(f, "<rect class=\"rate\" data-layer=\"%lld\" data-hit-rate=\"%.4f\" x=\"%d\" "
                   "y=\"%lld\" width=\"%.1f\" height=\"%d\" fill=\"#4a90d9\"/>", (long long)l, r,
                x0, ry, 60.0 * r, ch > 3 ? ch - 2 : ch);
        if (ch >= 9)
            fprintf(f, "<text x=\"%d\" y=\"%lld\">%.1f %%</text>", x0 + 66,
                    (long long)(y->top + l * ch + ch - 2), 100.0 * r);
        fputc('\n', f);
    }
    /* The bars' scale, for rows too thin to carry their figure. */
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">0</text><text x=\"%d\" y=\"%d\" "
               "font-size=\"10\" text-anchor=\"end\">100 %%</text>\n</g>\n", x0,
            y->top + y->gh + 15, x0 + 60, y->top + y->gh + 15);
}

static int write_svg(const grid *g, const char *path, shoal_err *err)
{
    FILE *f = fopen(path, "w");
    layout y = layout_of(g);

    if (!f)
        return shoal_err_set(err, SHOAL_EIO, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", y.W, y.H, y.W, y.H);
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"16\" font-weight=\"bold\">", y.left);
    svg_escape(f, g->name);
    fprintf(f, ": expert requests by layer</text>\n<text x=\"%d\" y=\"40\" font-size=\"11\" "
               "fill=\"#555\">%lld layers x %lld experts, %lld per cell; busiest expert: %lld "
               "requests; right: each layer's disk hit rate</text>\n", y.left,
            (long long)g->layers, (long long)g->experts, (long long)g->per, (long long)g->max);
    fprintf(f, "<g id=\"cells\" shape-rendering=\"crispEdges\">\n");
    if (g->layers * g->cols <= SMALL_CELLS)
        svg_cells_rects(f, g, &y);
    else
        svg_cells_paths(f, g, &y);
    fprintf(f, "</g>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"#666\"/>\n", y.left, y.top, y.gw, y.gh);
    svg_axes(f, g, &y);
    svg_rates(f, g, &y);
    svg_legend(f, g, y.left, y.top + y.gh + 56);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return shoal_err_set(err, SHOAL_EIO, "writing %s failed", path);
    return 0;
}

/* ---- ASCII and JSON -------------------------------------------------------------------------- */

static void write_ascii(const grid *g, FILE *f)
{
    static const char dashes[] = "------------------------------------------------------------"
                                 "------------------------------------------------------------"
                                 "------------------------------------------------------------"
                                 "------------------------------------------------------------"
                                 "----------------";
    int cols = (int)g->cols;
    fprintf(f, "%s: expert requests by layer (%lld expert%s per column; each column's requests "
               "per expert over its layer's mean, log scale up to %gx: \"%s\", '=' the mean, ' ' "
               "none)\n", g->name, (long long)g->per, g->per > 1 ? "s" : "", g->range, ascii_ramp);
    fprintf(f, "layer +%.*s+ disk hit\n", cols, dashes);
    for (int64_t l = 0; l < g->layers; l++) {
        fprintf(f, "%5lld |", (long long)l);
        for (int64_t c = 0; c < g->cols; c++) {
            int b = ratio_bin(cell_ratio(g, l, c), g->range);
            fputc(b < 0 ? ' ' : ascii_ramp[b], f);
        }
        if (g->layer_rate[l] >= 0)
            fprintf(f, "| %5.1f %%\n", 100.0 * g->layer_rate[l]);
        else
            fprintf(f, "|       -\n");
    }
    fprintf(f, "      +%.*s+\n       expert 0 .. %lld\n", cols, dashes, (long long)(g->experts - 1));
}

/* The cells as drawn ("shoal.heatmap", docs/stats-json.md). */
static int write_json(const grid *g, const char *source)
{
    shoal_json *root = shoal_json_object(), *rows = shoal_json_array();
    int rc = root && rows ? 0 : SHOAL_ENOMEM;
    shoal_json_set_str(root, "schema", "shoal.heatmap");
    shoal_json_set_int(root, "version", 1);
    shoal_json_set_str(root, "source", source);
    shoal_json_set_str(root, "model", g->name);
    shoal_json_set_int(root, "layers", g->layers);
    shoal_json_set_int(root, "experts", g->experts);
    shoal_json_set_int(root, "experts_per_cell", g->per);
    shoal_json_set_int(root, "columns", g->cols);
    shoal_json_set_num(root, "range", g->range);
    for (int64_t l = 0; rc == 0 && l < g->layers; l++) {
        shoal_json *r = shoal_json_object(), *cells = shoal_json_array(), *hits = shoal_json_array();
        shoal_json *ratio = shoal_json_array();
        int64_t hot = layer_hottest(g, l);
        if (!r || !cells || !hits || !ratio) {
            rc = SHOAL_ENOMEM;
            break;
        }
        shoal_json_set_int(r, "layer", l);
        shoal_json_set_int(r, "requests", g->layer_req[l]);
        shoal_json_set_num(r, "mean", (double)g->layer_req[l] / (double)g->experts);
        shoal_json_set_take(r, "hit_rate", g->layer_rate[l] >= 0 ? shoal_json_new_num(g->layer_rate[l])
                                                                 : shoal_json_new_null());
        shoal_json_set_int(r, "busiest_expert", hot);
        shoal_json_set_int(r, "busiest_requests", hot >= 0 ? g->req[l * g->experts + hot] : 0);
        for (int64_t c = 0; c < g->cols; c++) {
            shoal_json_append_take(cells, shoal_json_new_int(g->cell_req[l * g->cols + c]));
            shoal_json_append_take(hits, shoal_json_new_int(g->cell_hits[l * g->cols + c]));
            shoal_json_append_take(ratio, shoal_json_new_num(round(cell_ratio(g, l, c) * 1e4) / 1e4));
        }
        shoal_json_set_take(r, "cells", cells);
        shoal_json_set_take(r, "hits", hits);
        shoal_json_set_take(r, "ratio", ratio);
        shoal_json_append_take(rows, r);
    }
    if (rc == 0) {
        shoal_json_set_take(root, "rows", rows);
        rows = NULL;
        cli_json_print(root);
    }
    shoal_json_free(rows);
    shoal_json_free(root);
    return rc;
}

/* ---- the command ------------------------------------------------------------------------------ */

enum { O_OUT = 1, O_ASCII, O_WIDTH, O_COLUMNS, O_RANGE, O_JSON };

static const shoal_cli_opt heatmap_opts[] = {
    { "output", 'o', "FILE.svg", O_OUT, "write the SVG heat map to FILE.svg" },
    { "ascii", 0, NULL, O_ASCII, "draw it in the terminal instead" },
    { "json", 0, NULL, O_JSON, "print the cells' numbers as JSON" },
    { "columns", 0, "N", O_COLUMNS, "at most N cells per layer (8..256, default 128)" },
    { "width", 0, "N", O_WIDTH, "--ascii: at most N columns (8..400, default 96)" },
    { "range", 0, "R", O_RANGE, "the colours end at 1/R and R times the layer's mean\n"
                                "(1.5..1000, default 4)" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_heatmap_spec = {
    .prog = "shoal heatmap",
    .synopsis = "shoal heatmap MODEL -o FILE.svg [--columns N] [--range R]\n"
                "shoal heatmap MODEL --ascii [--width N] [--range R]\n"
                "shoal heatmap MODEL --json [--columns N]",
    .about = "Request counts per (layer, expert), what reached the disk cache, as an SVG\n"
             "heat map: a row per layer, experts gathered into at most N cells (K3's 896\n"
             "experts: 112 cells of 8), each coloured by its requests per expert over the\n"
             "layer's mean on a log scale (white = the mean; blue below, red above), with\n"
             "axes, a legend and each layer's hit rate.  Live from shoald, or from the index.",
    .opts = heatmap_opts,
};

int cmd_heatmap(shoal_cli *cli, int argc, char **argv)
{
    const char *out = NULL, *v;
    int ascii = 0, json = 0, id, rc, live = 0;
    long width = 96, columns = 128;
    double range = 4.0;
    char spec[SHOAL_PATH_MAX], *end;
    shoal_err err = { 0, "" };
    shoal_json *j = NULL;
    grid g;
    shoal_cli_parser p;

    memset(&g, 0, sizeof g);
    shoal_cli_begin(&p, &cmd_heatmap_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case O_OUT:   out = v; break;
        case O_ASCII: ascii = 1; break;
        case O_JSON:  json = 1; break;
        case O_WIDTH: case O_COLUMNS: {
            long n;
            if (shoal_long_parse(v, 8, id == O_WIDTH ? 400 : MAX_COLUMNS, &n) != 0)
                return shoal_cli_bad_value(&p, v, id == O_WIDTH ? "8..400 columns"
                                                               : "8..256 cells");
            *(id == O_WIDTH ? &width : &columns) = n;
            break;
        }
        case O_RANGE:
            range = strtod(v, &end);
            if (*end || end == v || !(range >= 1.5 && range <= 1000))
                return shoal_cli_bad_value(&p, v, "a ratio 1.5..1000 (4: the colours end at 1/4 "
                                           "and 4 times the layer's mean)");
            break;
        }
    }
    if (id < 0)
        return p.exit;
    if (p.optind != argc - 1)
        return shoal_cli_usage_error(&cmd_heatmap_spec, "give one MODEL");
    if ((!out && !ascii && !json) || (json && ascii))
        return shoal_cli_usage_error(&cmd_heatmap_spec, "give one of -o FILE.svg, --ascii or "
                                     "--json (-o may go with either)");
    if ((rc = cli_model_arg(&cmd_heatmap_spec, argv[p.optind], spec, sizeof spec)) != 0)
        return rc;
    g.range = range;
    rc = stats_fetch(cli, spec, CACHE_REPORT_BY_EXPERT, &j, &live, &err);
    if (rc == 0)
        rc = grid_build(j, &g, &err);
    shoal_json_free(j);
    if (rc == 0 && (out || json))
        rc = grid_cells(&g, columns, &err);
    if (rc == 0 && out)
        rc = write_svg(&g, out, &err);
    if (rc == 0 && json && write_json(&g, live ? "daemon" : "index") != 0)
        rc = shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
    if (rc == 0 && ascii) {
        free(g.cell_req);
        free(g.cell_hits);
        g.cell_req = g.cell_hits = NULL;
        rc = grid_cells(&g, width, &err);
        if (rc == 0)
            write_ascii(&g, stdout);
    }
    if (rc == 0 && out)
        fprintf(ascii || json ? stderr : stdout, "Wrote %s: %lld layers x %lld experts in cells "
                "of %lld, busiest expert %lld requests (%s)\n", out, (long long)g.layers,
                (long long)g.experts, (long long)g.per, (long long)g.max,
                live ? "live from shoald" : "from the index: shoald is not running");
    grid_free(&g);
    return rc ? cli_fail(rc, &err) : EXIT_OK_;
}
