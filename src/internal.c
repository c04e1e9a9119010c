/*
 * internal.c - engram_internal_v1(): the table of libengram's functions
 * that its other libraries call (internal.h).
 */
#include "common.h"
#include "internal.h"

static const engram__internal table = {
    .size = sizeof(engram__internal),
    .verr = engram__verr,
    .errmsg = engram_errmsg,
    .lookup = engram_lookup,
    .table_memory = engram_table_memory,
    .out_layout = engram__out_layout_resolve,
};

const engram__internal *engram_internal_v1(void)
{
    return &table;
}
