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
} spine_resident;

/* Bring [off, off+len) of fd into memory per `mode`, reading with
 * `threads` threads in parts (READ).  fd stays the caller's. */
int spine_resident_read(int fd, uint64_t off, uint64_t len, spine_load_mode mode, int threads,
                        spine_resident *out, shoal_err *err);
void spine_resident_free(spine_resident *r);
/* READ only the first `fill` bytes of the object now (the buffer spans
 * all `len`; the rest stays untouched anonymous memory, no RAM until
 * written); spine_resident_fill reads [from, to) of the object later.
 * MAP maps and populates everything. */
int spine_resident_read_part(int fd, uint64_t off, uint64_t len, uint64_t fill,
                             spine_load_mode mode, int threads, spine_resident *out,
                             shoal_err *err);
int spine_resident_fill(spine_resident *r, int fd, uint64_t from, uint64_t to, int threads,
                        shoal_err *err);

#endif
