/* source_int.h — what remote.c (the spine through shoald) and
 * spine_resident.c (reading it into memory) share.  Private to
 * engine/source/. */
#ifndef SHOAL_ENGINE_SOURCE_INT_H
#define SHOAL_ENGINE_SOURCE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/source/source.h"

/* A spine pack held in the engine's memory: the bytes of an object,
 * read into anonymous memory (SPINE_LOAD_READ) or mapped, populated and
 * locked where allowed (SPINE_LOAD_MAP). */
typedef struct spine_resident {
    const uint8_t *data;       /* the object's first byte */
    uint64_t length;
    void *base;                /* the buffer or the mapping underneath */
    size_t maplen;
    int mapped;                /* 1: a file mapping (munmap), 0: anonymous (free) */
    int locked;                /* MAP: mlock succeeded */
    int direct;                /* READ: O_DIRECT worked (else buffered reads) */
    double ms;
    uint64_t file_start;       /* READ: the file offset of base[0] (a 4 KiB multiple) */
    size_t lead;               /* READ: data - base */
    /* checked: the object's XXH3-128 as its bytes went by, up to file
     * offset hash_pos; want is the index's (the GET_ITEM's) */
    struct XXH3_state_s *hash; /* NULL: unchecked */
    uint64_t hash_pos;
    uint8_t want[16];
    double hash_ms;            /* reading the streamed part only to hash it */
} spine_resident;

/* A file range hashed on its own as the rest of the object goes by
 * (a streamed layer's, for its per-pass check). */
typedef struct spine_resident_range {
    uint64_t off, len;         /* file offsets */
} spine_resident_range;

/* Bring [off, off+len) of fd into memory per `mode`, reading with
 * `threads` threads in parts (READ).  fd stays the caller's.  want (NULL:
 * unchecked): the object's XXH3-128, canonical; the bytes are hashed as
 * they are read, spine_resident_check says whether they match. */
int spine_resident_read(int fd, uint64_t off, uint64_t len, spine_load_mode mode, int threads,
                        const uint8_t want[16], spine_resident *out, shoal_err *err);
void spine_resident_free(spine_resident *r);
/* READ only the first `fill` bytes of the object now (the buffer spans
 * all `len`; the rest stays untouched anonymous memory, no RAM until
 * written); spine_resident_fill reads [from, to) of the object later.
 * MAP maps and populates everything. */
int spine_resident_read_part(int fd, uint64_t off, uint64_t len, uint64_t fill,
                             spine_load_mode mode, int threads, const uint8_t want[16],
                             spine_resident *out, shoal_err *err);
int spine_resident_fill(spine_resident *r, int fd, uint64_t from, uint64_t to, int threads,
                        shoal_err *err);
/* Checked: the bytes after the last filled one (the streamed part, which
 * stays on disk) read once into small buffers only to be hashed, with
 * the ranges rg[0..nrg) (file offsets, each within what is read) hashed
 * on their own into xxh[i] (canonical).  Unchecked: nothing. */
int spine_resident_hash_rest(spine_resident *r, int fd, const spine_resident_range *rg,
                             size_t nrg, uint8_t (*xxh)[16], int threads, shoal_err *err);
/* 1: every byte was hashed and matches want; -1: it does not; 0:
 * unchecked, or not every byte read yet. */
int spine_resident_check(const spine_resident *r);

#endif
