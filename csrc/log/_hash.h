/* XXH3-64 (seed 0) for the checksums of csrc/log/_batchwriter.c: upstream xxHash, vendored
 * unmodified in vendor/xxhash (see its README), the library the ``xxhash`` Python package wraps,
 * so that checksums made here and in gpuviz/log/checksums.py agree (tests/test_xxh3.py).
 *
 *   uint64_t gv_xxh3_64(const void *data, size_t len);
 *
 * On x86 the long-input kernel is picked when the extension loads (xxh_x86dispatch.c: SSE2, AVX2
 * or AVX-512, whichever the CPU and OS support), so the extension keeps its baseline compiler
 * flags: on this project's VM a 160 KiB block hashes at ~90 GB/s with AVX-512 against 5-20 GB/s
 * for the SSE2 kernel a baseline x86-64 build gets at compile time (benchmarks/bench_hash.py;
 * docs/architecture.md, "The recording path"). Elsewhere the kernel is chosen at compile time
 * (NEON on 64-bit Arm, VSX on POWER, else scalar). GV_XXH_NO_DISPATCH (tests and benchmarks
 * only) compiles the x86 dispatch out: the compile-time choice everywhere.
 */
#ifndef GPUVIZ_LOG_HASH_H
#define GPUVIZ_LOG_HASH_H

#if (defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)) && !defined(GV_XXH_NO_DISPATCH)
#include "vendor/xxhash/xxh_x86dispatch.c" /* defines XXH_INLINE_ALL and includes xxhash.h */
#define gv_xxh3_64 XXH3_64bits_dispatch
#else
#define XXH_INLINE_ALL /* every function static, in this translation unit */
#include "vendor/xxhash/xxhash.h"
#define gv_xxh3_64 XXH3_64bits
#endif

#endif
