/*
 * hostpath.c - the CPU half of the host path: gathers staged ids into
 * staged rows with the core library (engram_lookup() through its internal
 * interface, internal.h), inside a cudaLaunchHostFunc node.
 *
 * It runs on a CUDA driver thread, between a device-to-host copy of the
 * ids and a host-to-device copy of the rows on the lookup's stream.  It
 * must not call the CUDA API, and it cannot fail the lookup: a failure is
 * handed to the context's error sink, which engram_cuda_check() reads.
 */
#include "common.h"
#include "cuda_internal.h"
#include "ids.h"
#include "internal.h"

int engram__cuda_host_gather(const engram__cuda_host *h, size_t T)
{
    const engram__internal *core = engram_internal_v1(); /* libengram (internal.h) */
    engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
    int err;

    /* A bad id would fail the whole CPU lookup; the GPU path skips it
     * instead, and the kernel that moves these rows to the output reports
     * it from its own copy of the ids.  Make it dead here so the CPU
     * gathers every good row. */
    for (size_t t = 0; t < T; t++) {
        for (size_t k = 0; k < h->K; k++) {
            int64_t *id = &h->ids[t * h->K + k];
            uint64_t row;
            if (*id != ENGRAM_DEAD_ID && !engram__id_row(*id, h->offsets[k], h->spans[k], &row))
                *id = ENGRAM_DEAD_ID;
        }
    }
    a.num_tokens = T;
    a.num_cols = h->K;
    a.tables = h->tables;
    a.offsets = h->offsets;
    a.ids = h->ids;
    a.id_type = ENGRAM_ID_INT64;
    a.out = h->rows;
    err = core->lookup(h->store, &a);
    /* engram_errmsg() is this thread's: read it here, before returning to
     * the driver. */
    if (err && h->on_error)
        h->on_error(h->ud, err, core->errmsg());
    return err;
}
