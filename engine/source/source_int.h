/* source_int.h — what remote.c (the spine through shoald),
 * spine_resident.c (reading it into memory), checked_read.c and the
 * expert source share.  Private to engine/source/. */
#ifndef SHOAL_ENGINE_SOURCE_INT_H
#define SHOAL_ENGINE_SOURCE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "common/client.h"
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

/* An object's XXH3-128 hashed as its nparts parts are read, by whichever
 * threads read them (checked_read.c).  NULL: out of memory. */
typedef struct checked_read checked_read;
checked_read *checked_read_new(const uint8_t want[16], uint32_t nparts);
void checked_read_free(checked_read *r);
/* Part `part` ([p, p+n), in the object's order) has been read.  Any
 * thread; returns at once unless this caller takes the next parts' hash.
 * Once every part's call has returned, checked_read_result is final. */
int  checked_read_part(checked_read *r, uint32_t part, const uint8_t *p, size_t n);
/* 1 the bytes match, -1 they do not, 0 not every part hashed yet. */
int  checked_read_result(checked_read *r);
/* Tell shoald that layer's expert read back damaged (REPORT "damaged"):
 * it removes the object, so the next GET fetches it again. */
int  checked_read_report(shoal_client *c, uint32_t handle, int layer, int32_t expert,
                         shoal_err *err);

#endif
