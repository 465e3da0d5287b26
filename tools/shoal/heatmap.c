/* heatmap.c — `shoal heatmap`: a model's layer x expert request counts
 * (what reached the disk cache) as an SVG a person reads at a glance —
 * axes, a legend, each layer's hit rate — or as ASCII in the terminal.
 *
 * Colour: zero requests are light grey; a cell with c > 0 requests, when
 * the busiest cell has m, gets palette[round(7 * ln c / ln m)] (the top
 * colour when m = 1): a log scale, because expert popularity spans orders
 * of magnitude and a linear one shows a few hot cells on a blank page.
 */
#include "tools/shoal/shoal_int.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define HM_ZERO "#eeeeee"
static const char *const palette[8] = {
    "#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c", "#b10026"
};

typedef struct grid {
    int64_t   layers, experts;
    int64_t  *req, *hits;      /* layers * experts */
    double   *layer_rate;      /* disk hit rate per layer, -1: never asked */
    int64_t  *layer_req;
    int64_t   max;
    char      name[512];
} grid;

static int bin_of(int64_t c, int64_t max)
{
    if (c <= 0)
        return -1;
    double t = max > 1 ? log((double)c) / log((double)max) : 1.0;
    int b = (int)floor(t * 7.0 + 0.5);
    return b < 0 ? 0 : b > 7 ? 7 : b;
}

static const char *colour_of(int64_t c, int64_t max)
{
    int b = bin_of(c, max);
    return b < 0 ? HM_ZERO : palette[b];
}

/* The smallest count that lands in bin b (for the legend). */
static int64_t bin_floor(int b, int64_t max)
{
    if (max <= 1)
        return 1;
    int64_t c = (int64_t)ceil(exp(((double)b - 0.5) / 7.0 * log((double)max)));
    while (c > 1 && bin_of(c - 1, max) >= b)
        c--;
    while (bin_of(c, max) < b)
        c++;
    return c < 1 ? 1 : c;
}

static int grid_build(const shoal_json *j, grid *g, shoal_err *err)
{
    shoal_json *ms = shoal_json_get(j, "models"), *m, *ex, *ls;
    int64_t id;

    memset(g, 0, sizeof *g);
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
        g->layer_req[l] = jint(r, "disk.requests", 0);
    }
    return 0;
}

static void grid_free(grid *g)
{
    free(g->req);
    free(g->hits);
    free(g->layer_rate);
    free(g->layer_req);
}

static int64_t nice_step(int64_t n, int64_t want)
{
    static const int64_t steps[] = { 1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000 };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
        if (n / steps[i] <= want)
            return steps[i];
    return 1000;
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
    fprintf(f, "<g id=\"legend\" font-size=\"11\">\n<text x=\"%d\" y=\"%d\">requests per "
               "expert (log scale)</text>\n", x, y - 6);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"28\" height=\"14\" fill=\"%s\" stroke=\"#999\"/>"
               "<text x=\"%d\" y=\"%d\">0</text>\n", x, y, HM_ZERO, x + 10, y + 27);
    for (int b = 0, k = 0; b < 8; b++) {
        int bx = x + 34 + k * 52;
        int64_t lo = bin_floor(b, g->max);
        if (g->max <= 0 || bin_of(lo, g->max) != b)
            continue;     /* no count lands in this bin */
        k++;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"48\" height=\"14\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"%d\">&#8805;%lld</text>\n", bx, y, palette[b], bx, y + 27,
                (long long)lo);
    }
    fprintf(f, "</g>\n");
}

static int write_svg(const grid *g, const char *path, shoal_err *err)
{
    FILE *f = fopen(path, "w");
    int cw = (int)fmin(28.0, fmax(2.0, 1000.0 / (double)g->experts));
    int ch = (int)fmin(24.0, fmax(3.0, 700.0 / (double)g->layers));
    int left = 70, top = 56, right = 150, legend_h = 90;
    int gw = cw * (int)g->experts, gh = ch * (int)g->layers;
    int W = left + gw + right < 640 ? 640 : left + gw + right, H = top + gh + legend_h;
    int64_t xs = nice_step(g->experts, 16), ys = nice_step(g->layers, (int64_t)(gh / 14 + 1));
    int titles = g->layers * g->experts <= 20000;

    if (!f)
        return shoal_err_set(err, SHOAL_EIO, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H, W, H);
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"16\" font-weight=\"bold\">", left);
    svg_escape(f, g->name);
    fprintf(f, ": expert requests by layer</text>\n<text x=\"%d\" y=\"40\" font-size=\"11\" "
               "fill=\"#555\">busiest expert: %lld requests; right: each layer's disk hit rate"
               "</text>\n", left, (long long)g->max);
    fprintf(f, "<g id=\"cells\" shape-rendering=\"crispEdges\">\n");
    for (int64_t l = 0; l < g->layers; l++)
        for (int64_t e = 0; e < g->experts; e++) {
            int64_t c = g->req[l * g->experts + e], h = g->hits[l * g->experts + e];
            fprintf(f, "<rect class=\"cell\" x=\"%lld\" y=\"%lld\" width=\"%d\" height=\"%d\" "
                       "fill=\"%s\" data-layer=\"%lld\" data-expert=\"%lld\" data-requests=\"%lld\" "
                       "data-hits=\"%lld\"", (long long)(left + e * cw), (long long)(top + l * ch),
                    cw, ch, colour_of(c, g->max), (long long)l, (long long)e, (long long)c,
                    (long long)h);
            if (titles)
                fprintf(f, "><title>layer %lld expert %lld: %lld requests, %lld hits</title></rect>\n",
                        (long long)l, (long long)e, (long long)c, (long long)h);
            else
                fputs("/>\n", f);
        }
    fprintf(f, "</g>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"#666\"/>\n", left, top, gw, gh);
    /* Axes. */
    fprintf(f, "<g id=\"x-axis\" font-size=\"10\" text-anchor=\"middle\">\n");
    for (int64_t e = 0; e < g->experts; e += xs)
        fprintf(f, "<line x1=\"%lld\" y1=\"%d\" x2=\"%lld\" y2=\"%d\" stroke=\"#666\"/>"
                   "<text x=\"%lld\" y=\"%d\">%lld</text>\n",
                (long long)(left + e * cw + cw / 2), top + gh, (long long)(left + e * cw + cw / 2),
                top + gh + 4, (long long)(left + e * cw + cw / 2), top + gh + 15, (long long)e);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\">expert</text>\n</g>\n",
            left + gw / 2, top + gh + 30);
    fprintf(f, "<g id=\"y-axis\" font-size=\"10\" text-anchor=\"end\">\n");
    for (int64_t l = 0; l < g->layers; l += ys)
        fprintf(f, "<text x=\"%d\" y=\"%lld\">%lld</text>\n", left - 4,
                (long long)(top + l * ch + ch / 2 + 4), (long long)l);
    fprintf(f, "<text x=\"14\" y=\"%d\" font-size=\"12\" transform=\"rotate(-90 14 %d)\" "
               "text-anchor=\"middle\">layer</text>\n</g>\n", top + gh / 2, top + gh / 2);
    /* Per-layer hit rates: a bar (full = 100 %) and, when rows are tall
     * enough to read, the figure. */
    fprintf(f, "<g id=\"hit-rates\" font-size=\"%d\">\n<text x=\"%d\" y=\"%d\" font-size=\"11\">"
               "disk hit rate</text>\n", ch >= 9 && ch < 12 ? ch - 1 : 11, left + gw + 8, top - 4);
    for (int64_t l = 0; l < g->layers; l++) {
        double r = g->layer_rate[l];
        if (r < 0)
            continue;
        fprintf(f, "<rect x=\"%d\" y=\"%lld\" width=\"60\" height=\"%d\" fill=\"#e4e4e4\"/>",
                left + gw + 8, (long long)(top + l * ch + (ch > 3 ? 1 : 0)), ch > 3 ? ch - 2 : ch);
        fprintf(f, "<rect class=\"rate\" data-layer=\"%lld\" data-hit-rate=\"%.4f\" x=\"%d\" "
                   "y=\"%lld\" width=\"%.1f\" height=\"%d\" fill=\"#4a90d9\"/>",
                (long long)l, r, left + gw + 8, (long long)(top + l * ch + (ch > 3 ? 1 : 0)),
                60.0 * r, ch > 3 ? ch - 2 : ch);
        if (ch >= 9)
            fprintf(f, "<text x=\"%d\" y=\"%lld\">%.1f %%</text>", left + gw + 74,
                    (long long)(top + l * ch + ch - 2), 100.0 * r);
        fputc('\n', f);
    }
    /* The bars' scale, for rows too thin to carry their figure. */
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">0</text><text x=\"%d\" y=\"%d\" "
               "font-size=\"10\" text-anchor=\"end\">100 %%</text>\n</g>\n", left + gw + 8,
            top + gh + 15, left + gw + 68, top + gh + 15);
    svg_legend(f, g, left, top + gh + 56);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return shoal_err_set(err, SHOAL_EIO, "writing %s failed", path);
    return 0;
}

static void write_ascii(const grid *g, FILE *f, int width)
{
    static const char ramp[] = " .:-=+*#%@";
    int cols = (int)(g->experts < width ? g->experts : width);
    int64_t per = (g->experts + cols - 1) / cols;
    cols = (int)((g->experts + per - 1) / per);
    int64_t *sum = calloc((size_t)(g->layers * cols), sizeof *sum), max = 0;

    if (!sum)
        return;
    for (int64_t l = 0; l < g->layers; l++)
        for (int64_t e = 0; e < g->experts; e++) {
            int64_t *s = &sum[l * cols + e / per];
            *s += g->req[l * g->experts + e];
            if (*s > max)
                max = *s;
        }
    fprintf(f, "%s: expert requests by layer (%lld experts per column; log scale \"%s\" up to "
               "%lld)\n", g->name, (long long)per, ramp + 1, (long long)max);
    fprintf(f, "layer +%.*s+ disk hit\n", cols, "------------------------------------------------"
               "------------------------------------------------------------------------------------");
    for (int64_t l = 0; l < g->layers; l++) {
        fprintf(f, "%5lld |", (long long)l);
        for (int c = 0; c < cols; c++) {
            int64_t v = sum[l * cols + c];
            int k = v <= 0 ? 0 : 1 + (max > 1 ? (int)floor(8.0 * log((double)v) / log((double)max) + 0.5) : 8);
            fputc(ramp[k > 9 ? 9 : k], f);
        }
        if (g->layer_rate[l] >= 0)
            fprintf(f, "| %5.1f %%\n", 100.0 * g->layer_rate[l]);
        else
            fprintf(f, "|       -\n");
    }
    fprintf(f, "      +%.*s+\n       expert 0 .. %lld\n", cols, "------------------------------"
               "------------------------------------------------------------------------------------"
               "----------------------------------------", (long long)(g->experts - 1));
    free(sum);
}

static const char heatmap_help[] =
    "usage: shoal heatmap MODEL -o FILE.svg\n"
    "       shoal heatmap MODEL --ascii [--width N]\n"
    "\n"
    "Request counts per (layer, expert) — what reached the disk cache — as an SVG\n"
    "heat map with axes, a legend (log colour scale) and each layer's hit rate, or\n"
    "drawn in the terminal.  Live from shoald, or from the index.\n";

int cmd_heatmap(shoal_cli *cli, int argc, char **argv)
{
    static const struct option opts[] = {
        { "output", required_argument, NULL, 'o' }, { "ascii", no_argument, NULL, 'a' },
        { "width", required_argument, NULL, 'W' }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 } };
    const char *out = NULL;
    int ascii = 0, width = 96, c, rc, live = 0;
    char spec[SHOAL_PATH_MAX];
    shoal_err err = { 0, "" };
    shoal_json *j = NULL;
    grid g;

    memset(&g, 0, sizeof g);
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'a': ascii = 1; break;
        case 'W':
            width = (int)strtol(optarg, NULL, 10);
            if (width < 8 || width > 400) {
                fprintf(stderr, "shoal heatmap: --width takes 8..400 columns\n");
                return EXIT_USAGE;
            }
            break;
        case 'h': fputs(heatmap_help, stdout); return EXIT_OK_;
        default: fputs(heatmap_help, stderr); return EXIT_USAGE;
        }
    }
    if (optind != argc - 1 || (!out && !ascii)) {
        fputs(heatmap_help, stderr);
        return EXIT_USAGE;
    }
    cli_model_spec(argv[optind], spec, sizeof spec);
    rc = stats_fetch(cli, spec, CACHE_REPORT_BY_EXPERT, &j, &live, &err);
    if (rc == 0)
        rc = grid_build(j, &g, &err);
    shoal_json_free(j);
    if (rc == 0 && out)
        rc = write_svg(&g, out, &err);
    if (rc == 0 && ascii)
        write_ascii(&g, stdout, width);
    if (rc == 0 && out)
        fprintf(ascii ? stderr : stdout, "Wrote %s: %lld layers x %lld experts, busiest %lld "
                "requests (%s)\n", out, (long long)g.layers, (long long)g.experts,
                (long long)g.max, live ? "live from shoald" : "from the index");
    grid_free(&g);
    return rc ? cli_fail(rc, &err) : EXIT_OK_;
}
