/* mkmodel_int.h — internal interface of tools/mkmodel (not for other folders).
 *
 * mkmodel is a thin program over synth/ (synth/synth.h): main.c parses the
 * command line and picks what to do; write.c puts a synthesized model on
 * disk (every file, or shards with their headers only), one file on stdout,
 * or the table of its digests.
 */
#ifndef SHOAL_MKMODEL_INT_H
#define SHOAL_MKMODEL_INT_H

#include <stdint.h>

#include "common/err.h"
#include "common/progress.h"
#include "synth/synth.h"

/* What a directory write shows: bytes of tensors written of the total,
 * the shard being written as the meter's phase. */
typedef struct mk_progress {
    uint64_t done, total;
    shoal_meter *meter;           /* NULL: show nothing */
    int shard, shards;            /* the one being written (1-based), of */
} mk_progress;

/* Write every file of m into dir: small files atomically, shards streamed
 * into ".NAME.partial" and renamed, the index last.  headers_only: shards
 * get their real header and their real size as a sparse file (a hole for
 * the data). */
int mk_model_write(const synth_model *m, const char *dir, int headers_only, mk_progress *pr,
                   shoal_err *err);
/* Write file `name` of m to fd (stdout). */
int mk_file_cat(const synth_model *m, const char *name, int fd, shoal_err *err);
/* Print the digest table of every file (the rows of synth/k3_etags.inc);
 * meter (may be NULL) shows the hashing. */
int mk_etags_print(const synth_model *m, int jobs, shoal_meter *meter, shoal_err *err);

#endif
