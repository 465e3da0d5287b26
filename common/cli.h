/* cli.h — the one command-line grammar of every shoal program.
 *
 * Owns: the option table a program declares (long name, short letter,
 * value name, help), parsing it with getopt_long (`--opt=value` and
 * `--opt value`, bundled short flags, -h/--help, --version, the messages
 * "unrecognized option", "needs a value", "takes no value", "ambiguous"),
 * the help text, the man(7) page and the bash completion built from the
 * same table (so the three cannot disagree), and the exit codes every
 * program follows (docs/cli.md, "Exit codes").  Does not own what an
 * option does: the program's switch on the ids shoal_cli_next returns.
 *
 *   static const shoal_cli_opt OPTS[] = {
 *       { "home", 0, "DIR", OPT_HOME, "the cache directory" },
 *       { "json", 0, NULL,  OPT_JSON, "the result as JSON" },
 *       { NULL } };
 *   static const shoal_cli_spec SPEC = { "stinfo", "list tensors",
 *       "stinfo FILE [--json]", NULL, OPTS };
 *   shoal_cli_parser p;
 *   const char *val;
 *   int id;
 *   shoal_cli_begin(&p, &SPEC, argc, argv);
 *   while ((id = shoal_cli_next(&p, &val)) > 0)
 *       switch (id) { case OPT_JSON: ...; }
 *   if (id < 0)
 *       return p.exit;          0 after --help / --version, 2 after a usage error
 *   ... argv[p.optind .. argc) are the arguments
 *
 * Every program also answers the hidden --help-man (its man page, roff)
 * and --help-completion (a bash completion script): the build makes the
 * installed pages and completions from them (Makefile, `make man`).
 */
#ifndef SHOAL_CLI_H
#define SHOAL_CLI_H

#include <getopt.h>
#include <stdio.h>

/* Exit codes (docs/cli.md keeps the same table; `--help-man` prints it). */
enum {
    SHOAL_EXIT_OK          = 0,    /* done */
    SHOAL_EXIT_FAIL        = 1,    /* failed: the message says why and what to do */
    SHOAL_EXIT_USAGE       = 2,    /* a bad option, value or argument (a malformed name too) */
    SHOAL_EXIT_NODAEMON    = 3,    /* the command needs shoald and it is not running */
    SHOAL_EXIT_NOTFOUND    = 4,    /* no such model, revision, file, job or cache */
    SHOAL_EXIT_DAMAGED     = 5,    /* integrity: bytes that fail their checksum, etag or format */
    SHOAL_EXIT_BUSY        = 6,    /* the cache has another owner (shoald runs): go through it or stop it */
    SHOAL_EXIT_UPSTREAM    = 7,    /* the Hub or mirror failed or refused: HTTP 4xx/5xx, offline, token */
    SHOAL_EXIT_NOSPACE     = 8,    /* the cache's budget or the disk is full */
    SHOAL_EXIT_INTERRUPTED = 130   /* Ctrl-C / SIGTERM (work that belongs to shoald goes on) */
};

/* The exit code for a shoal error code (common/err.h): ENOTFOUND 4,
 * ECORRUPT 5, ELOCKED/EBUSY 6, ENET/EAUTH 7, ENOSPC 8, ECANCELED 130,
 * EINVAL 2, anything else 1.  A program that knows better (shoal: ENET
 * from its connect means "shoald is not running", 3) maps before calling. */
int shoal_exit_for(int rc);

/* One option.  id > 0 and unique in the program's table; ids from
 * SHOAL_CLI_ID_RESERVED up are the parser's own. */
typedef struct shoal_cli_opt {
    const char *name;          /* long name without "--"; NULL ends a table */
    int         short_name;    /* 'v', or 0 */
    const char *arg;           /* the value's name ("DIR", "on|off"); NULL: a flag */
    int         id;
    const char *help;          /* lines joined by '\n'; NULL: hidden; "": completed but
                                  not listed (the spec's text describes it) */
} shoal_cli_opt;

#define SHOAL_CLI_ID_RESERVED 0x7f00

struct shoal_cli_spec;

/* A subcommand, for the help list, the man page and the completion. */
typedef struct shoal_cli_cmd {
    const char *name;                    /* NULL ends a table */
    const struct shoal_cli_spec *spec;   /* its own options; may be NULL */
    const char *summary;                 /* one line */
} shoal_cli_cmd;

typedef struct shoal_cli_spec {
    const char *prog;          /* as messages name it: "shoald", "shoal warm" */
    const char *summary;       /* one line: the man page's NAME */
    const char *synopsis;      /* usage lines without "usage: ", '\n' between */
    const char *about;         /* paragraphs after the usage ('\n\n' between), or NULL */
    const shoal_cli_opt *opts; /* the program's options; NULL: none */
    const shoal_cli_opt *shared;       /* a second group (shoal-engine's), or NULL */
    const char *shared_title;  /* its heading */
    const char *notes;         /* text after the options, or NULL */
    const shoal_cli_cmd *cmds; /* subcommands, or NULL */
    int  command_first;        /* options end at the first argument (a COMMAND
                                  with its own options follows) */
    const char *man_extra;     /* roff sections after EXIT STATUS (ENVIRONMENT,
                                  FILES, SEE ALSO ...), or NULL */
    int  man_section;          /* 0: 1 (commands); shoald's is 8 */
    /* Commands whose specs live elsewhere (shoal-engine's are built when
     * each command runs): these print the man page's COMMANDS sections and
     * the completion's per-command arms instead of walking cmds[].spec. */
    void (*man_commands)(FILE *f);
    void (*completion_commands)(FILE *f);
    /* Options its commands share (listed once in the man page, after the
     * commands, whose sections then only name the group), or NULL. */
    const shoal_cli_opt *man_shared;
} shoal_cli_spec;

#define SHOAL_CLI_MAX_OPTS 96

/* A parse in progress (getopt_long's state is global: one at a time). */
typedef struct shoal_cli_parser {
    const shoal_cli_spec *spec;
    int    argc;
    char **argv;
    int    optind;             /* after the options: the first argument */
    int    exit;               /* when shoal_cli_next returned -1 */
    const char *name;          /* the option just returned, as written ("--home", "-o") */
    /* the parser's */
    int    n;
    const shoal_cli_opt *table[SHOAL_CLI_MAX_OPTS];
    struct option longs[SHOAL_CLI_MAX_OPTS + 1];
    char   shorts[2 * SHOAL_CLI_MAX_OPTS + 4];
    char   namebuf[72];
} shoal_cli_parser;

void shoal_cli_begin(shoal_cli_parser *p, const shoal_cli_spec *spec, int argc, char **argv);

/* The next option: its id (> 0) with *val its value (NULL for a flag);
 * 0 when the options end (p->optind is the first argument); -1 when the
 * program should exit with p->exit: 0 after printing --help or
 * --version on stdout, 2 after printing a usage error on stderr. */
int shoal_cli_next(shoal_cli_parser *p, const char **val);

/* "PROG: bad value for --NAME: VAL[ (WANT)] (see PROG --help)" on
 * stderr; returns SHOAL_EXIT_USAGE.  want may be NULL. */
int shoal_cli_bad_value(const shoal_cli_parser *p, const char *val, const char *want);

/* "PROG: MESSAGE (see PROG --help)" on stderr; returns SHOAL_EXIT_USAGE. */
int shoal_cli_usage_error(const shoal_cli_spec *spec, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The help text (usage, about, commands, options, notes). */
void shoal_cli_help(const shoal_cli_spec *spec, FILE *f);
/* "NAME VERSION" (NAME: the first word of prog). */
void shoal_cli_version(const shoal_cli_spec *spec, FILE *f);
/* The man(7) page: NAME, SYNOPSIS, DESCRIPTION, OPTIONS, COMMANDS (each
 * subcommand's options), EXIT STATUS, then spec->man_extra. */
void shoal_cli_man(const shoal_cli_spec *spec, FILE *f);
/* A bash completion script for the program (complete -F): options,
 * subcommands and their options, values of the form a|b|c, files and
 * directories for FILE/DIR/PATH values. */
void shoal_cli_completion(const shoal_cli_spec *spec, FILE *f);
/* One command's parts of those (what man_commands / completion_commands
 * print per command; a command answers the hidden --help-man-section and
 * --help-completion-arm with them). */
void shoal_cli_man_section(const shoal_cli_spec *spec, FILE *f);
void shoal_cli_completion_arm(const char *name, const shoal_cli_spec *spec, FILE *f);

#endif
