/* cli.c — parsing a program's option table with getopt_long, its help
 * text and version line, and the exit code of an error (common/cli.h).
 *
 * Owns: the messages of a usage error (one wording for every program),
 * the built-in options (-h/--help, --version and the hidden --help-man /
 * --help-completion the build uses), the help layout.  Does not own the
 * man page and completion text (cli_doc.c) nor any option's meaning.
 *
 * getopt_long is told `:` first (a missing value comes back as ':' rather
 * than a message of its own) and opterr = 0, so every message is ours and
 * names the program as the user typed it ("shoal warm", not "warm").
 */
#include "common/cli.h"

#include <stdarg.h>
#include <string.h>

#include "common/err.h"
#include "common/version.h"

enum {
    ID_HELP = SHOAL_CLI_ID_RESERVED, ID_VERSION, ID_MAN, ID_COMPLETION, ID_SECTION, ID_ARM,
};
#define VAL_BASE 0x100   /* getopt's val for table[i]: VAL_BASE + i */

static const shoal_cli_opt BUILTIN[] = {
    { "help", 'h', NULL, ID_HELP, "this help" },
    { "version", 0, NULL, ID_VERSION, "print the version and exit" },
    { "help-man", 0, NULL, ID_MAN, NULL },
    { "help-completion", 0, NULL, ID_COMPLETION, NULL },
    { "help-man-section", 0, NULL, ID_SECTION, NULL },
    { "help-completion-arm", 0, NULL, ID_ARM, NULL },
    { NULL, 0, NULL, 0, NULL },
};

int shoal_exit_for(int rc)
{
    switch (rc) {
    case SHOAL_OK:        return SHOAL_EXIT_OK;
    case SHOAL_EINVAL:    return SHOAL_EXIT_USAGE;
    case SHOAL_ENOTFOUND: return SHOAL_EXIT_NOTFOUND;
    case SHOAL_ECORRUPT:  return SHOAL_EXIT_DAMAGED;
    case SHOAL_ELOCKED:
    case SHOAL_EBUSY:     return SHOAL_EXIT_BUSY;
    case SHOAL_ENET:
    case SHOAL_ETIMEOUT:
    case SHOAL_EOFFLINE:
    case SHOAL_EAUTH:     return SHOAL_EXIT_UPSTREAM;
    case SHOAL_ENOSPC:    return SHOAL_EXIT_NOSPACE;
    case SHOAL_ECANCELED: return SHOAL_EXIT_INTERRUPTED;
    default:              return SHOAL_EXIT_FAIL;
    }
}

static void table_add(shoal_cli_parser *p, const shoal_cli_opt *t)
{
    for (; t && t->name && p->n < SHOAL_CLI_MAX_OPTS; t++) {
        size_t k = strlen(p->shorts);
        p->table[p->n] = t;
        p->longs[p->n] = (struct option){ t->name, t->arg ? required_argument : no_argument,
                                          NULL, VAL_BASE + p->n };
        if (t->short_name && k + 3 < sizeof p->shorts) {
            p->shorts[k++] = (char)t->short_name;
            if (t->arg)
                p->shorts[k++] = ':';
            p->shorts[k] = '\0';
        }
        p->n++;
    }
}

void shoal_cli_begin(shoal_cli_parser *p, const shoal_cli_spec *spec, int argc, char **argv)
{
    memset(p, 0, sizeof *p);
    p->spec = spec;
    p->argc = argc;
    p->argv = argv;
    p->optind = 1;
    /* '+': stop at the first argument (the command); ':': a missing value
     * is reported as ':' so the message is ours. */
    snprintf(p->shorts, sizeof p->shorts, "%s:", spec->command_first ? "+" : "");
    table_add(p, spec->opts);
    table_add(p, spec->shared);
    table_add(p, BUILTIN);
    p->longs[p->n] = (struct option){ NULL, 0, NULL, 0 };
    opterr = 0;
    optind = 0;   /* glibc: 0 re-initialises (a second parse, another optstring) */
}

static const char *self(const shoal_cli_spec *s)
{
    return s->prog ? s->prog : "shoal";
}

/* The long option argv[optind - 1] named ("--xy=1" -> "--xy"). */
static const char *written(shoal_cli_parser *p)
{
    const char *a = optind - 1 < p->argc && optind >= 1 ? p->argv[optind - 1] : "?";
    size_t n = strcspn(a, "=");
    snprintf(p->namebuf, sizeof p->namebuf, "%.*s", (int)(n < 64 ? n : 64), a);
    return p->namebuf;
}

/* An unknown long option: ambiguous (a prefix of several) or unrecognized. */
static void unknown_long(shoal_cli_parser *p, const char *arg)
{
    const char *name = arg + 2;
    size_t n = strlen(name), hits = 0;
    char list[256] = "";

    for (int i = 0; i < p->n; i++) {
        if (p->table[i]->help && strncmp(p->table[i]->name, name, n) == 0) {
            size_t k = strlen(list);
            hits++;
            snprintf(list + k, sizeof list - k, "%s--%s", k ? ", " : "", p->table[i]->name);
        }
    }
    if (n && hits > 1)
        fprintf(stderr, "%s: option '%s' is ambiguous (%s) (see %s --help)\n", self(p->spec), arg,
                list, self(p->spec));
    else
        fprintf(stderr, "%s: unrecognized option '%s' (see %s --help)\n", self(p->spec), arg,
                self(p->spec));
}

static const shoal_cli_opt *by_val(const shoal_cli_parser *p, int v)
{
    if (v >= VAL_BASE && v < VAL_BASE + p->n)
        return p->table[v - VAL_BASE];
    for (int i = 0; i < p->n; i++)
        if (v > 0 && p->table[i]->short_name == v)
            return p->table[i];
    return NULL;
}

static int usage_exit(shoal_cli_parser *p)
{
    p->exit = SHOAL_EXIT_USAGE;
    return -1;
}

/* A '?' or ':' from getopt: say what was wrong. */
static int bad_option(shoal_cli_parser *p, int c)
{
    const shoal_cli_opt *o = optopt ? by_val(p, optopt) : NULL;
    const char *prog = self(p->spec);

    if (c == ':') {
        if (o && optopt >= VAL_BASE)
            fprintf(stderr, "%s: option '--%s' needs a value (%s) (see %s --help)\n", prog,
                    o->name, o->arg, prog);
        else
            fprintf(stderr, "%s: option '-%c' needs a value (%s) (see %s --help)\n", prog,
                    optopt, o && o->arg ? o->arg : "?", prog);
    } else if (o && optopt >= VAL_BASE) {
        fprintf(stderr, "%s: option '--%s' takes no value (see %s --help)\n", prog, o->name,
                prog);
    } else if (optopt) {
        fprintf(stderr, "%s: unrecognized option '-%c' (see %s --help)\n", prog, optopt, prog);
    } else {
        unknown_long(p, written(p));
    }
    return usage_exit(p);
}

int shoal_cli_next(shoal_cli_parser *p, const char **val)
{
    const shoal_cli_opt *o;
    int li = -1, c;

    *val = NULL;
    c = getopt_long(p->argc, p->argv, p->shorts, p->longs, &li);
    if (c == -1) {
        p->optind = optind;
        return 0;
    }
    if (c == '?' || c == ':')
        return bad_option(p, c);
    if (!(o = by_val(p, c)))
        return bad_option(p, '?');
    if (li >= 0)
        snprintf(p->namebuf, sizeof p->namebuf, "--%s", o->name);
    else
        snprintf(p->namebuf, sizeof p->namebuf, "-%c", o->short_name);
    p->name = p->namebuf;
    *val = optarg;
    switch (o->id) {
    case ID_HELP:       shoal_cli_help(p->spec, stdout); break;
    case ID_VERSION:    shoal_cli_version(p->spec, stdout); break;
    case ID_MAN:        shoal_cli_man(p->spec, stdout); break;
    case ID_COMPLETION: shoal_cli_completion(p->spec, stdout); break;
    case ID_SECTION:    shoal_cli_man_section(p->spec, stdout); break;
    case ID_ARM:
        shoal_cli_completion_arm(p->spec->prog + strcspn(p->spec->prog, " ") +
                                 (p->spec->prog[strcspn(p->spec->prog, " ")] ? 1 : 0),
                                 p->spec, stdout);
        break;
    default:            return o->id;
    }
    p->exit = fflush(stdout) == 0 ? SHOAL_EXIT_OK : SHOAL_EXIT_FAIL;
    return -1;
}

int shoal_cli_bad_value(const shoal_cli_parser *p, const char *val, const char *want)
{
    const char *prog = self(p->spec);
    fprintf(stderr, "%s: bad value for %s: %s%s%s%s (see %s --help)\n", prog,
            p->name ? p->name : "an option", val ? val : "", want ? " (" : "", want ? want : "",
            want ? ")" : "", prog);
    return SHOAL_EXIT_USAGE;
}

int shoal_cli_usage_error(const shoal_cli_spec *spec, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: ", self(spec));
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see %s --help)\n", self(spec));
    return SHOAL_EXIT_USAGE;
}

void shoal_cli_version(const shoal_cli_spec *spec, FILE *f)
{
    const char *prog = self(spec);
    fprintf(f, "%.*s %s\n", (int)strcspn(prog, " "), prog, SHOAL_VERSION);
}

/* ---- help ------------------------------------------------------------------------ */

#define HELP_COL 24

/* Lines of s, each after `indent` spaces but the first after `first`. */
static void lines(FILE *f, const char *s, int first, int indent)
{
    int pad = first;
    while (s && *s) {
        size_t n = strcspn(s, "\n");
        fprintf(f, "%*s%.*s\n", n ? pad : 0, "", (int)n, s);
        pad = indent;
        s += n;
        if (*s)
            s++;
    }
}

static void help_opts(FILE *f, const shoal_cli_opt *t)
{
    for (; t && t->name; t++) {
        char left[96];
        int n;
        if (!t->help || !t->help[0])
            continue;
        if (t->short_name)
            n = snprintf(left, sizeof left, "  -%c, --%s%s%s", t->short_name, t->name,
                         t->arg ? " " : "", t->arg ? t->arg : "");
        else
            n = snprintf(left, sizeof left, "      --%s%s%s", t->name, t->arg ? " " : "",
                         t->arg ? t->arg : "");
        if (n + 2 > HELP_COL) {
            fprintf(f, "%s\n", left);
            lines(f, t->help, HELP_COL, HELP_COL);
        } else {
            fprintf(f, "%-*s", HELP_COL, left);
            lines(f, t->help, 0, HELP_COL);
        }
    }
}

void shoal_cli_help(const shoal_cli_spec *spec, FILE *f)
{
    const char *s = spec->synopsis ? spec->synopsis : self(spec);
    int first = 1;

    while (*s) {
        size_t n = strcspn(s, "\n");
        fprintf(f, "%s%.*s\n", first ? "usage: " : "       ", (int)n, s);
        first = 0;
        s += n;
        if (*s)
            s++;
    }
    if (spec->about) {
        fputc('\n', f);
        lines(f, spec->about, 0, 0);
    }
    if (spec->cmds) {
        fprintf(f, "\nCommands:\n");
        for (const shoal_cli_cmd *c = spec->cmds; c->name; c++)
            fprintf(f, "  %-12s %s\n", c->name, c->summary ? c->summary : "");
    }
    fprintf(f, "\nOptions:\n");
    help_opts(f, spec->opts);
    help_opts(f, BUILTIN);
    if (spec->shared) {
        fprintf(f, "\n%s:\n", spec->shared_title ? spec->shared_title : "Shared options");
        help_opts(f, spec->shared);
    }
    if (spec->notes) {
        fputc('\n', f);
        lines(f, spec->notes, 0, 0);
    }
}
