/*
 * xxh.h - XXH3-64, the checksum of every table, chunk and pull (libxxhash)
 * (internal).  Where the library has its run-time dispatch
 * (xxh_x86dispatch.h, found by CMakeLists.txt: ENGRAM_XXH_DISPATCH), the
 * XXH3 entry points go through it, to the widest vector unit of the CPU
 * (AVX2 or AVX-512, not the SSE2 code of the plain entry points); the
 * hashes are the same either way.
 */
#ifndef ENGRAM_XXH_H
#define ENGRAM_XXH_H

#include <xxhash.h>
#if defined(ENGRAM_XXH_DISPATCH) && ENGRAM_XXH_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#endif
