/* main.c — stinfo: list the tensors of a .safetensors file.
 *
 *   stinfo FILE.safetensors [--json]
 *
 * Text output: comment lines starting with '#' (sizes, metadata), then one
 * line per tensor in file order:  NAME DTYPE [D0,D1,...] BEGIN END
 * with absolute byte offsets [BEGIN, END).  --json prints one JSON object
 * instead.  A header the strict parser refuses is reported on stderr with
 * exit status 5 (2 for usage errors; docs/cli.md).  Owns only the command
 * line; parsing is common/safetensors.h.
 */
#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "common/cli.h"
#include "common/err.h"
#include "common/json.h"
#include "common/log.h"
#include "common/safetensors.h"

enum { OPT_JSON = 1 };

static const shoal_cli_opt OPTS[] = {
    { "json", 0, NULL, OPT_JSON, "one JSON object instead of the text listing" },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec SPEC = {
    .prog = "stinfo",
    .summary = "list the tensors of a safetensors file",
    .synopsis = "stinfo [--json] FILE.safetensors",
    .about = "List every tensor of a safetensors file (name, dtype, shape, begin, end: absolute\n"
             "byte offsets) after strict validation of its header.  Text: comment lines\n"
             "starting with '#' (sizes, metadata), then one line per tensor in file order.",
    .opts = OPTS,
    .notes = "A header the strict parser refuses exits 5, a file that cannot be read 4 or 1.",
};

static void print_text(const char *path, const st_file *f)
{
    printf("# %s: %zu tensors, header %llu bytes, data at %llu, %llu data bytes\n", path,
           st_count(f), (unsigned long long)(st_data_offset(f) - 8),
           (unsigned long long)st_data_offset(f), (unsigned long long)st_data_size(f));
    for (size_t i = 0; i < st_metadata_count(f); i++) {
        const char *k, *v;
        st_metadata_at(f, i, &k, &v);
        printf("# metadata %s=%s\n", k, v);
    }
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        printf("%s %s [", t->name, st_dtype_name(t->dtype));
        for (unsigned d = 0; d < t->ndim; d++)
            printf("%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
        printf("] %llu %llu\n", (unsigned long long)t->begin, (unsigned long long)t->end);
    }
}

static int print_json(const char *path, const st_file *f)
{
    shoal_json *root = shoal_json_object(), *meta = shoal_json_object();
    shoal_json *list = shoal_json_array();
    shoal_buf out;
    int rc = root && meta && list ? 0 : SHOAL_ENOMEM;

    rc = rc ? rc : shoal_json_set_str(root, "file", path);
    rc = rc ? rc : shoal_json_set_int(root, "header_len", (int64_t)(st_data_offset(f) - 8));
    rc = rc ? rc : shoal_json_set_int(root, "data_offset", (int64_t)st_data_offset(f));
    rc = rc ? rc : shoal_json_set_int(root, "data_size", (int64_t)st_data_size(f));
    for (size_t i = 0; i < st_metadata_count(f) && !rc; i++) {
        const char *k, *v;
        st_metadata_at(f, i, &k, &v);
        rc = shoal_json_set_str(meta, k, v);
    }
    for (size_t i = 0; i < st_count(f) && !rc; i++) {
        const st_tensor *t = st_at(f, i);
        shoal_json *o = shoal_json_object(), *shape = shoal_json_array();
        rc = o && shape ? 0 : SHOAL_ENOMEM;
        for (unsigned d = 0; d < t->ndim && !rc; d++)
            rc = shoal_json_append_take(shape, shoal_json_new_int((int64_t)t->shape[d]));
        rc = rc ? rc : shoal_json_set_str(o, "name", t->name);
        rc = rc ? rc : shoal_json_set_str(o, "dtype", st_dtype_name(t->dtype));
        if (!rc) {
            rc = shoal_json_set_take(o, "shape", shape);
            shape = NULL;
        }
        rc = rc ? rc : shoal_json_set_int(o, "begin", (int64_t)t->begin);
        rc = rc ? rc : shoal_json_set_int(o, "end", (int64_t)t->end);
        shoal_json_free(shape);
        if (!rc)
            rc = shoal_json_append_take(list, o);
        else
            shoal_json_free(o);
    }
    if (!rc) {
        rc = shoal_json_set_take(root, "metadata", meta);
        meta = NULL;
    }
    if (!rc) {
        rc = shoal_json_set_take(root, "tensors", list);
        list = NULL;
    }
    shoal_buf_init(&out, 0);
    rc = rc ? rc : shoal_json_dump(root, SHOAL_JSON_PRETTY, &out);
    if (!rc)
        printf("%s\n", out.data ? (const char *)out.data : "");
    shoal_buf_free(&out);
    shoal_json_free(meta);
    shoal_json_free(list);
    shoal_json_free(root);
    return rc;
}

int main(int argc, char **argv)
{
    const char *path, *val;
    int json = 0, rc, id;
    st_file *f = NULL;
    shoal_err err = { 0 };
    shoal_cli_parser p;

    shoal_log_setup("stinfo", SHOAL_LOG_WARN, NULL);
    shoal_cli_begin(&p, &SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &val)) > 0)
        if (id == OPT_JSON)
            json = 1;
    if (id < 0)
        return p.exit;
    if (argc - p.optind != 1)
        return shoal_cli_usage_error(&SPEC, "give one FILE.safetensors");
    path = argv[p.optind];
    if ((rc = st_read_file(path, &f, &err))) {
        fprintf(stderr, "stinfo: %s (%s)\n", err.msg, shoal_err_name(rc));
        return rc == SHOAL_EFORMAT || rc == SHOAL_ECORRUPT || rc == SHOAL_ERANGE ||
               rc == SHOAL_ETOOBIG ? SHOAL_EXIT_DAMAGED : shoal_exit_for(rc);
    }
    rc = json ? print_json(path, f) : (print_text(path, f), 0);
    st_free(f);
    if (rc) {
        fprintf(stderr, "stinfo: %s\n", shoal_strerror(rc));
        return SHOAL_EXIT_FAIL;
    }
    return fflush(stdout) == 0 ? SHOAL_EXIT_OK : SHOAL_EXIT_FAIL;
}
