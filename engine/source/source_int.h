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
} spine_resident;

/* Bring [off, off+len) of fd into memory per `mode`, reading with
 * `threads` threads in parts (READ).  fd stays the caller's. */
int spine_resident_read(int fd, uint64_t off, uint64_t len, spine_load_mode mode, int threads,
                        spine_resident *out, shoal_err *err);
void spine_resident_free(spine_resident *r);

#endif
