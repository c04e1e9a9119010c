/*
 * writer.h - what store.c needs of the writer (internal; the writer's
 * own API is public: engram_writer_*).
 */
#ifndef ENGRAM_WRITER_H
#define ENGRAM_WRITER_H

#include "engram.h"

/* Removes stale temporary files of dead writers from the namespace. */
void engram__clean_temps(engram_store *st);

#endif
