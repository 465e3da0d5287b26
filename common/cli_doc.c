/* cli_doc.c — a program's man page (man(7) roff) and bash completion,
 * written from the same option table that parses its command line
 * (common/cli.h), so the installed documentation says what the binary
 * does.  The build runs `PROG --help-man` and `PROG --help-completion`
 * (Makefile, `make man`).
 *
 * Owns: roff escaping, the EXIT STATUS section (the one exit-code table),
 * the completion script's shape.  Does not own the prose of a page: the
 * program's spec (synopsis, about, notes, man_extra).
 */
#include "common/cli.h"

#include <ctype.h>
#include <string.h>

#include "common/version.h"

static const struct {
    int code;
    const char *text;
} EXITS[] = {
    { SHOAL_EXIT_OK, "done" },
    { SHOAL_EXIT_FAIL, "failed; the message says why and what to do" },
    { SHOAL_EXIT_USAGE, "usage: a bad option, value or argument, a malformed model name" },
    { SHOAL_EXIT_NODAEMON, "the command needs shoald and it is not running" },
    { SHOAL_EXIT_NOTFOUND, "not found: no such model, revision, file, job or cache" },
    { SHOAL_EXIT_DAMAGED, "integrity: bytes that fail their checksum or etag, a malformed file" },
    { SHOAL_EXIT_BUSY, "the cache has another owner (shoald runs): go through shoald or stop it" },
    { SHOAL_EXIT_UPSTREAM, "the Hub or mirror failed or refused: an HTTP error after the retries, "
                           "unreachable, a missing or refused token" },
    { SHOAL_EXIT_NOSPACE, "no space: the cache's budget or the disk is full" },
    { SHOAL_EXIT_INTERRUPTED, "interrupted (Ctrl-C, SIGTERM); work that belongs to shoald goes on" },
};

/* ---- roff ------------------------------------------------------------------------- */

/* n bytes of s as roff text: backslashes and hyphens escaped, a line
 * that would start with a control character guarded. */
static void roff(FILE *f, const char *s, size_t n, int line_start)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (line_start && (c == '.' || c == '\''))
            fputs("\\&", f);
        line_start = c == '\n';
        if (c == '\\')
            fputs("\\e", f);
        else if (c == '-')
            fputs("\\-", f);
        else
            fputc(c, f);
    }
}

static void roff_str(FILE *f, const char *s)
{
    roff(f, s, strlen(s), 0);
}

/* Paragraphs: a blank line starts one (.PP); lines indented by two spaces
 * or more are kept as they are (.nf), the rest filled. */
static void roff_paras(FILE *f, const char *s)
{
    int nofill = 0;
    while (s && *s) {
        size_t n = strcspn(s, "\n");
        int keep = n >= 2 && s[0] == ' ' && s[1] == ' ';
        if (n == 0) {
            if (nofill)
                fputs(".fi\n", f);
            nofill = 0;
            fputs(".PP\n", f);
        } else {
            if (keep != nofill)
                fputs(keep ? ".nf\n" : ".fi\n", f);
            nofill = keep;
            roff(f, s, n, 1);
            fputc('\n', f);
        }
        s += n;
        if (*s)
            s++;
    }
    if (nofill)
        fputs(".fi\n", f);
}

static void roff_opts(FILE *f, const shoal_cli_opt *t)
{
    for (; t && t->name; t++) {
        if (!t->help || !t->help[0])
            continue;
        fputs(".TP\n", f);
        if (t->short_name)
            fprintf(f, "\\fB\\-%c\\fR, ", t->short_name);
        fputs("\\fB\\-\\-", f);
        roff_str(f, t->name);
        fputs("\\fR", f);
        if (t->arg) {
            fputs(" \\fI", f);
            roff_str(f, t->arg);
            fputs("\\fR", f);
        }
        fputc('\n', f);
        for (const char *h = t->help; *h;) {
            size_t n = strcspn(h, "\n");
            while (n && *h == ' ') {   /* the help's own indentation is for terminals */
                h++;
                n--;
            }
            roff(f, h, n, 1);
            fputc('\n', f);
            h += n;
            if (*h)
                h++;
        }
    }
}

static void roff_synopsis(FILE *f, const shoal_cli_spec *s)
{
    fputs(".nf\n", f);
    roff_str(f, s->synopsis ? s->synopsis : s->prog);
    fputs("\n.fi\n", f);
}

static void upper(char *out, size_t cap, const char *s)
{
    size_t i = 0;
    for (; s[i] && s[i] != ' ' && i + 1 < cap; i++)
        out[i] = (char)toupper((unsigned char)s[i]);
    out[i] = '\0';
}

void shoal_cli_man_section(const shoal_cli_spec *spec, FILE *f)
{
    fputs(".SS \"", f);
    roff_str(f, spec->prog);
    fputs("\"\n", f);
    roff_synopsis(f, spec);
    if (spec->about) {
        fputs(".PP\n", f);
        roff_paras(f, spec->about);
    }
    roff_opts(f, spec->opts);
    if (spec->shared) {
        fputs(".PP\nAnd the shared options (SHARED OPTIONS below): ", f);
        roff_str(f, spec->shared_title ? spec->shared_title : "");
        fputs(".\n", f);
    }
    if (spec->notes) {
        fputs(".PP\n", f);
        roff_paras(f, spec->notes);
    }
}

void shoal_cli_man(const shoal_cli_spec *spec, FILE *f)
{
    char title[64];

    upper(title, sizeof title, spec->prog);
    fprintf(f, ".\\\" %s(%d), made by `%s --help-man` from its option table\n", spec->prog,
            spec->man_section ? spec->man_section : 1, spec->prog);
    fprintf(f, ".TH %s %d \"\" \"shoal %s\" \"shoal manual\"\n.SH NAME\n", title,
            spec->man_section ? spec->man_section : 1, SHOAL_VERSION);
    roff_str(f, spec->prog);
    fputs(" \\- ", f);
    roff_str(f, spec->summary ? spec->summary : "");
    fputs("\n.SH SYNOPSIS\n", f);
    roff_synopsis(f, spec);
    if (spec->about) {
        fputs(".SH DESCRIPTION\n", f);
        roff_paras(f, spec->about);
    }
    fputs(".SH OPTIONS\n", f);
    roff_opts(f, spec->opts);
    fputs(".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\nthis help\n"
          ".TP\n\\fB\\-\\-version\\fR\nprint the version and exit\n", f);
    if (spec->shared) {
        fputs(".SS ", f);
        roff_str(f, spec->shared_title ? spec->shared_title : "Shared options");
        fputc('\n', f);
        roff_opts(f, spec->shared);
    }
    if (spec->notes) {
        fputs(".PP\n", f);
        roff_paras(f, spec->notes);
    }
    if (spec->man_commands) {
        fputs(".SH COMMANDS\n", f);
        fflush(f);
        spec->man_commands(f);
    } else if (spec->cmds) {
        fputs(".SH COMMANDS\n", f);
        for (const shoal_cli_cmd *c = spec->cmds; c->name; c++) {
            if (c->spec) {
                shoal_cli_man_section(c->spec, f);
                continue;
            }
            fprintf(f, ".SS \"%s\"\n", c->name);
            roff_str(f, c->summary ? c->summary : "");
            fputc('\n', f);
        }
    }
    if (spec->man_shared) {
        fputs(".SH \"SHARED OPTIONS\"\n", f);
        roff_opts(f, spec->man_shared);
    }
    fputs(".SH \"EXIT STATUS\"\n", f);
    for (size_t i = 0; i < sizeof EXITS / sizeof EXITS[0]; i++) {
        fprintf(f, ".TP\n.B %d\n", EXITS[i].code);
        roff_str(f, EXITS[i].text);
        fputc('\n', f);
    }
    if (spec->man_extra)
        fputs(spec->man_extra, f);
}

/* ---- bash completion -------------------------------------------------------------- */

/* Words of an enumerated value: "layer|expert|session", or the fixed
 * starts of each ("all|top:N|layers:A-B": all top: layers:).  0 when arg
 * is not one. */
static int enum_words(const char *arg, char *out, size_t cap)
{
    size_t k = 0;
    if (!strchr(arg, '|') || strchr(arg, '['))
        return 0;
    for (const char *p = arg; *p;) {
        size_t n = 0;
        while (islower((unsigned char)p[n]) || isdigit((unsigned char)p[n]) || p[n] == '-' ||
               p[n] == '_')
            n++;
        if (p[n] == ':')
            n++;
        if (n == 0 || k + n + 2 > cap)
            return 0;
        if (k)
            out[k++] = ' ';
        memcpy(out + k, p, n);
        k += n;
        p += strcspn(p, "|");
        if (*p)
            p++;
    }
    out[k] = '\0';
    return 1;
}

/* `case $prev in` arms for the values of t's options. */
static void comp_values(FILE *f, const shoal_cli_opt *t)
{
    for (; t && t->name; t++) {
        char words[256];
        if (!t->arg || !t->help)
            continue;
        fprintf(f, "        --%s", t->name);
        if (t->short_name)
            fprintf(f, "|-%c", t->short_name);
        if (enum_words(t->arg, words, sizeof words))
            fprintf(f, ") COMPREPLY=($(compgen -W \"%s\" -- \"$cur\")); return ;;\n", words);
        else if (strstr(t->arg, "DIR"))
            fprintf(f, ") COMPREPLY=($(compgen -d -- \"$cur\")); return ;;\n");
        else if (strstr(t->arg, "FILE") || strstr(t->arg, "PATH") || strstr(t->arg, "OUT"))
            fprintf(f, ") COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n");
        else
            fprintf(f, ") COMPREPLY=(); return ;;\n");
    }
}

static void comp_words(FILE *f, const shoal_cli_opt *t)
{
    for (; t && t->name; t++)
        if (t->help)
            fprintf(f, " --%s", t->name);
}

static void comp_block(FILE *f, const shoal_cli_spec *s)
{
    fputs("        case $prev in\n", f);
    comp_values(f, s->opts);
    comp_values(f, s->shared);
    fputs("        esac\n        opts=\"--help", f);
    comp_words(f, s->opts);
    comp_words(f, s->shared);
    fputs("\" ;;\n", f);
}

void shoal_cli_completion_arm(const char *name, const shoal_cli_spec *spec, FILE *f)
{
    fprintf(f, "    %s)\n", name);
    comp_block(f, spec);
}

void shoal_cli_completion(const shoal_cli_spec *spec, FILE *f)
{
    char fn[64];
    size_t n = strcspn(spec->prog, " ");

    snprintf(fn, sizeof fn, "_shoal_complete_%.*s", (int)n, spec->prog);
    for (char *p = fn; *p; p++)
        if (!isalnum((unsigned char)*p))
            *p = '_';
    fprintf(f, "# bash completion for %.*s %s, made by `%.*s --help-completion` from its\n"
               "# option table.\n%s() {\n"
               "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
               "    local cmd= opts= i w\n",
            (int)n, spec->prog, SHOAL_VERSION, (int)n, spec->prog, fn);
    if (spec->cmds) {
        /* the command: the first word that is neither an option nor the
         * value of one of the global options */
        fputs("    for ((i = 1; i < COMP_CWORD; i++)); do\n        w=${COMP_WORDS[i]}\n"
              "        case $w in\n", f);
        for (const shoal_cli_opt *t = spec->opts; t && t->name; t++)
            if (t->arg)
                fprintf(f, "            --%s) ((i++)) ;;\n", t->name);
        fputs("            -*) ;;\n            *) cmd=$w; break ;;\n        esac\n    done\n", f);
    }
    fputs("    case $cmd in\n    \"\")\n", f);
    comp_block(f, spec);
    if (spec->completion_commands) {
        fflush(f);
        spec->completion_commands(f);
    }
    for (const shoal_cli_cmd *c = spec->cmds; !spec->completion_commands && c && c->name; c++)
        if (c->spec)
            shoal_cli_completion_arm(c->name, c->spec, f);
    fputs("    esac\n    if [[ $cur == -* ]]; then\n"
          "        COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))\n", f);
    if (spec->cmds) {
        fputs("    elif [ -z \"$cmd\" ]; then\n        COMPREPLY=($(compgen -W \"", f);
        for (const shoal_cli_cmd *c = spec->cmds; c->name; c++)
            fprintf(f, "%s%s", c == spec->cmds ? "" : " ", c->name);
        fputs("\" -- \"$cur\"))\n", f);
    }
    fprintf(f, "    else\n        COMPREPLY=($(compgen -f -- \"$cur\"))\n    fi\n}\n"
               "complete -F %s %.*s\n", fn, (int)n, spec->prog);
}
