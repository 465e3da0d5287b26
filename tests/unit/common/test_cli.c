/* test_cli.c — the one option grammar (common/cli.h): --opt=value and
 * --opt value, bundled short flags, arguments anywhere (or options ending
 * at the command), the messages and exit 2 of every usage error, --help
 * and --version (exit 0), the exit code of each error code, and the man
 * page and completion built from the same table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/err.h"

enum { O_HOME = 1, O_JSON, O_VERBOSE, O_OUT, O_LEVEL, O_LEVER };

static const shoal_cli_opt OPTS[] = {
    { "home", 0, "DIR", O_HOME, "the cache directory" },
    { "json", 0, NULL, O_JSON, "as JSON" },
    { "verbose", 'v', NULL, O_VERBOSE, "more" },
    { "output", 'o', "FILE", O_OUT, "where\nsecond line" },
    { "level", 0, "a|b", O_LEVEL, "a level" },
    { "lever", 0, NULL, O_LEVER, "a lever" },
    { "secret", 0, NULL, 99, NULL },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec SPEC = {
    .prog = "tool sub", .summary = "a test", .synopsis = "tool sub [options] ARG",
    .about = "About it.\n\n  kept as it is\nfilled", .opts = OPTS,
};

typedef struct got {
    const char *home, *out, *level;
    int json, verbose, lever, secret, rc, first;
    char err[512], out_text[8192];
} got;

/* Run one parse of the words in `line` with stdout and stderr caught. */
static void parse(const shoal_cli_spec *spec, const char *line, got *g)
{
    static char buf[1024];
    char *argv[32];
    int argc = 0, id, o1 = dup(1), o2 = dup(2);
    FILE *fo = tmpfile(), *fe = tmpfile();
    shoal_cli_parser p;
    const char *v;

    memset(g, 0, sizeof *g);
    snprintf(buf, sizeof buf, "%s", line);
    for (char *t = buf; *t && argc < 31;) {
        argv[argc++] = t;
        t += strcspn(t, " ");
        if (*t)
            *t++ = '\0';
    }
    argv[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    shoal_cli_begin(&p, spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case O_HOME:    g->home = v; break;
        case O_JSON:    g->json = 1; break;
        case O_VERBOSE: g->verbose++; break;
        case O_OUT:     g->out = v; break;
        case O_LEVEL:   g->level = v; break;
        case O_LEVER:   g->lever = 1; break;
        case 99:        g->secret = 1; break;
        }
    }
    g->rc = id < 0 ? p.exit : -1;
    g->first = id < 0 ? -1 : p.optind;
    fflush(stdout);
    fflush(stderr);
    dup2(o1, 1);
    dup2(o2, 2);
    close(o1);
    close(o2);
    rewind(fe);
    g->err[fread(g->err, 1, sizeof g->err - 1, fe)] = '\0';
    rewind(fo);
    g->out_text[fread(g->out_text, 1, sizeof g->out_text - 1, fo)] = '\0';
    fclose(fo);
    fclose(fe);
}

static void test_forms(void **state)
{
    got g;
    (void)state;

    parse(&SPEC, "sub --home=/a --json -vv -o x ARG", &g);
    assert_int_equal(g.rc, -1);
    assert_string_equal(g.home, "/a");
    assert_true(g.json);
    assert_int_equal(g.verbose, 2);
    assert_string_equal(g.out, "x");
    parse(&SPEC, "sub ARG --home /b -ofile --level=b --secret", &g);
    assert_int_equal(g.rc, -1);
    assert_string_equal(g.home, "/b");
    assert_string_equal(g.out, "file");
    assert_string_equal(g.level, "b");
    assert_true(g.secret);
    assert_int_equal(g.first, 6);   /* permuted: the argument comes last */
    parse(&SPEC, "sub -- --json", &g);   /* after --, an argument */
    assert_int_equal(g.rc, -1);
    assert_false(g.json);
}

static void test_errors(void **state)
{
    got g;
    (void)state;

    parse(&SPEC, "sub --bogus", &g);
    assert_int_equal(g.rc, SHOAL_EXIT_USAGE);
    assert_string_equal(g.err, "tool sub: unrecognized option '--bogus' (see tool sub --help)\n");
    parse(&SPEC, "sub --bogus=3", &g);
    assert_non_null(strstr(g.err, "unrecognized option '--bogus'"));
    parse(&SPEC, "sub -x", &g);
    assert_int_equal(g.rc, SHOAL_EXIT_USAGE);
    assert_non_null(strstr(g.err, "unrecognized option '-x'"));
    parse(&SPEC, "sub --home", &g);
    assert_int_equal(g.rc, SHOAL_EXIT_USAGE);
    assert_non_null(strstr(g.err, "option '--home' needs a value (DIR)"));
    parse(&SPEC, "sub -o", &g);
    assert_non_null(strstr(g.err, "option '-o' needs a value (FILE)"));
    parse(&SPEC, "sub --json=1", &g);
    assert_int_equal(g.rc, SHOAL_EXIT_USAGE);
    assert_non_null(strstr(g.err, "option '--json' takes no value"));
    parse(&SPEC, "sub --lev", &g);
    assert_int_equal(g.rc, SHOAL_EXIT_USAGE);
    assert_non_null(strstr(g.err, "option '--lev' is ambiguous (--level, --lever)"));
    parse(&SPEC, "sub --js", &g);   /* an unambiguous prefix is the option */
    assert_int_equal(g.rc, -1);
    assert_true(g.json);
}

static void test_help_version(void **state)
{
    got g;
    (void)state;

    parse(&SPEC, "sub --help", &g);
    assert_int_equal(g.rc, 0);
    assert_string_equal(g.err, "");
    assert_non_null(strstr(g.out_text, "usage: tool sub [options] ARG\n"));
    assert_non_null(strstr(g.out_text, "      --home DIR        the cache directory\n"));
    assert_non_null(strstr(g.out_text, "  -o, --output FILE     where\n"
                                       "                        second line\n"));
    assert_non_null(strstr(g.out_text, "  -h, --help            this help\n"));
    assert_null(strstr(g.out_text, "secret"));   /* hidden */
    parse(&SPEC, "sub -h", &g);
    assert_int_equal(g.rc, 0);
    parse(&SPEC, "sub --version", &g);
    assert_int_equal(g.rc, 0);
    assert_non_null(strstr(g.out_text, "tool "));   /* the program's first word */
    assert_null(strstr(g.out_text, "sub"));
}

static void test_command_first(void **state)
{
    static const shoal_cli_spec top = { .prog = "tool", .synopsis = "tool [--home DIR] CMD",
                                        .opts = OPTS, .command_first = 1 };
    got g;
    (void)state;

    parse(&top, "tool --home /h cmd --json", &g);
    assert_int_equal(g.rc, -1);
    assert_string_equal(g.home, "/h");
    assert_false(g.json);          /* cmd's, not the top level's */
    assert_int_equal(g.first, 3);
}

static void test_exit_for(void **state)
{
    (void)state;
    assert_int_equal(shoal_exit_for(0), 0);
    assert_int_equal(shoal_exit_for(SHOAL_EINVAL), 2);
    assert_int_equal(shoal_exit_for(SHOAL_ENOTFOUND), 4);
    assert_int_equal(shoal_exit_for(SHOAL_ECORRUPT), 5);
    assert_int_equal(shoal_exit_for(SHOAL_ELOCKED), 6);
    assert_int_equal(shoal_exit_for(SHOAL_ENET), 7);
    assert_int_equal(shoal_exit_for(SHOAL_EAUTH), 7);
    assert_int_equal(shoal_exit_for(SHOAL_ENOSPC), 8);
    assert_int_equal(shoal_exit_for(SHOAL_ECANCELED), 130);
    assert_int_equal(shoal_exit_for(SHOAL_EIO), 1);
}

static void test_man_completion(void **state)
{
    static const shoal_cli_cmd cmds[] = { { "sub", &SPEC, "the sub" }, { NULL, NULL, NULL } };
    static const shoal_cli_spec top = { .prog = "tool", .summary = "a tool",
                                        .synopsis = "tool CMD", .opts = OPTS, .cmds = cmds,
                                        .command_first = 1 };
    FILE *f = tmpfile();
    char buf[16384];
    size_t n;
    (void)state;

    shoal_cli_man(&top, f);
    rewind(f);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    assert_non_null(strstr(buf, ".TH TOOL 1 "));
    assert_non_null(strstr(buf, "tool \\- a tool\n"));
    assert_non_null(strstr(buf, "\\fB\\-\\-home\\fR \\fIDIR\\fR\n"));
    assert_non_null(strstr(buf, ".SS \"tool sub\"\n"));
    assert_non_null(strstr(buf, ".nf\n  kept as it is\n.fi\n"));
    assert_non_null(strstr(buf, ".SH \"EXIT STATUS\"\n"));
    assert_non_null(strstr(buf, ".B 130\n"));
    assert_null(strstr(buf, "secret"));
    fclose(f);

    f = tmpfile();
    shoal_cli_completion(&top, f);
    rewind(f);
    n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    assert_non_null(strstr(buf, "complete -F _shoal_complete_tool tool\n"));
    assert_non_null(strstr(buf, "--level) COMPREPLY=($(compgen -W \"a b\" -- \"$cur\"))"));
    assert_non_null(strstr(buf, "--home) COMPREPLY=($(compgen -d -- \"$cur\"))"));
    assert_non_null(strstr(buf, "    sub)\n"));
    fclose(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_help_version),
        cmocka_unit_test(test_command_first),
        cmocka_unit_test(test_exit_for),
        cmocka_unit_test(test_man_completion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
