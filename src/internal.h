/*
 * internal.h - the one interface libengram offers its own other
 * libraries: libengram_cuda and the GPU module of the Python package
 * (internal; never installed, not an API).
 *
 * libengram.so exports the public functions of include/engram.h and one
 * more symbol, engram_internal_v1(): a table of what libengram_cuda needs
 * from libengram.  libengram_cuda calls libengram through this table
 * only, public functions included, and imports no other symbol of it, so
 *  - nothing else of libengram is exported (cmake/libengram.map; the test
 *    abi_exports checks both libraries' symbols), and
 *  - the Python package's GPU module (python/src/cuda.c), which links
 *    libengram_cuda's code but no libengram, defines engram_internal_v1()
 *    itself, returning the table of the libengram inside
 *    engramstore._engram that that module hands it when it loads it: one
 *    library, one set of stores, one per-thread error message.
 *
 * The table's size comes first; fields are only ever appended, so a
 * reader checks that the size covers the fields it knows
 * (engram__internal_ok()).  A change of meaning is a new function,
 * engram_internal_v2().
 */
#ifndef ENGRAM_INTERNAL_H
#define ENGRAM_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "engram.h"
#include "outlayout.h"

typedef struct engram__internal {
    uint32_t size; /* sizeof(engram__internal) of the libengram that made it */
    uint32_t reserved;
    /* Records this thread's error message (engram_errmsg()) from `fmt`
     * and `ap`; returns `code` (common.h: engram__err()). */
    int (*verr)(int code, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
    /* The public functions libengram_cuda calls. */
    const char *(*errmsg)(void);
    int (*lookup)(engram_store *st, const engram_lookup_args *args);
    int (*table_memory)(engram_store *st, engram_table_id id, const void **base,
                        engram_table_spec *spec);
    /* A lookup's output layout (outlayout.h). */
    int (*out_layout)(size_t R, size_t T, size_t K, ptrdiff_t ost, ptrdiff_t osk,
                      engram__out_layout *res);
} engram__internal;

/* The table of this libengram (static: the same pointer every call). */
ENGRAM_API const engram__internal *engram_internal_v1(void);

/* 1 if table `t` has every field this build knows. */
static inline int engram__internal_ok(const engram__internal *t)
{
    return t && t->size >= sizeof *t;
}

#endif
