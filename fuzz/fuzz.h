/*
 * fuzz.h - the entry point shared by the fuzz targets and the replay driver.
 *
 * Each fuzz target defines LLVMFuzzerTestOneInput().  Built with
 * -fsanitize=fuzzer it is driven by libFuzzer; linked with replay.c it runs
 * once per file of a stored corpus, so CI exercises every seed and every
 * past finding without libFuzzer.  Declaring the prototype once here keeps
 * the two definitions in step (and -Wmissing-prototypes quiet).
 */
#ifndef ENGRAM_FUZZ_H
#define ENGRAM_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Runs one input.  Returns 0 (libFuzzer reserves other values); a broken
 * invariant aborts the process so that both drivers report it. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
