/* TensorFlow's BFC allocator rules, stated once for gpuviz's C (no Python, no state).
 *
 * Each rule is a static inline function with its formula beside it and the names TensorFlow
 * gives it (tensorflow/core/common_runtime/bfc_allocator.{h,cc}). Every C user of the BFC
 * policy takes them from here: the core (_bfc_core.c: split, Extend, garbage collection), the
 * native allocator (_bfcnative.c: rounding), PyTorch's pluggable allocator (_pluggable.c: the
 * first segment) and the what-if replay (csrc/scenarios/_whatifcore.c, through the core).
 * gpuviz/capture/bfc_rules.py states the same rules for the Python reference; _bfcnative
 * exposes these functions so that tests/test_bfc_rules.py holds the two equal over random
 * inputs. All sizes are bytes.
 */
#ifndef GPUVIZ_BFC_RULES_H
#define GPUVIZ_BFC_RULES_H

#include <stdint.h>

#define BFC_MIN_ALLOCATION 256                                 /* kMinAllocationSize = 1 << kMinAllocationBits (8) */
#define BFC_NUM_BINS 21                                        /* kNumBins */
#define BFC_INITIAL_SEGMENT ((int64_t)2 << 20)                 /* curr_region_allocation_bytes_ with growth: 2 MiB */
#define BFC_MAX_INTERNAL_FRAGMENTATION ((int64_t)128 << 20)    /* kMaxInternalFragmentation: 128 MiB */
#define BFC_BACKPEDAL_FACTOR 0.9f                              /* kBackpedalFactor, a float */

/* rounding (RoundedBytes): max(256, n rounded up to a multiple of 256) */
static inline int64_t bfc_rounded(int64_t n) { return n <= BFC_MIN_ALLOCATION ? BFC_MIN_ALLOCATION : (n + 255) & ~(int64_t)255; }

/* bins (BinNumForSize): min(kNumBins - 1, floor(log2(max(size, 256) >> 8))); bin b holds free
 * chunks of [256·2^b, 256·2^(b+1)), the last one every size >= 256 MiB */
static inline int bfc_bin_for_size(int64_t size) {
    uint64_t v = (uint64_t)(size > BFC_MIN_ALLOCATION ? size : BFC_MIN_ALLOCATION) >> 8;
    int b = 63 - __builtin_clzll(v);
    return b < BFC_NUM_BINS - 1 ? b : BFC_NUM_BINS - 1;
}

/* split rule (AllocateChunk → SplitChunk): a chunk of chunk_size bytes taken for a request of
 * rounded bytes is split when chunk_size >= 2·rounded or chunk_size - rounded >= 128 MiB */
static inline int bfc_should_split(int64_t chunk_size, int64_t rounded) {
    return chunk_size >= rounded * 2 || chunk_size - rounded >= BFC_MAX_INTERNAL_FRAGMENTATION;
}

/* first segment step (curr_region_allocation_bytes_ at construction): 2 MiB with growth
 * (allow_growth), else RoundedBytes(memory_limit): the whole limit as one segment */
static inline int64_t bfc_first_segment(int growth, int64_t memory_limit) {
    return growth ? BFC_INITIAL_SEGMENT : bfc_rounded(memory_limit);
}

/* limit (Extend: available_bytes): what the memory limit leaves beyond the pool, rounded down
 * to 256: (memory_limit_ - total_region_allocated_bytes_) / 256 · 256 */
static inline int64_t bfc_available(int64_t memory_limit, int64_t pool_bytes) {
    return (memory_limit - pool_bytes) & ~(int64_t)255;
}

/* growth (Extend: increased_allocation): the step doubles until the request fits; 1 when it
 * doubled (then it does not double again after the segment is made) */
static inline int bfc_grow_step(int64_t rounded, int64_t *step) {
    int increased = 0;
    while (rounded > *step) {
        *step *= 2;
        increased = 1;
    }
    return increased;
}

/* growth, after a segment was made: the next step doubles unless this request doubled it */
static inline int64_t bfc_step_after(int64_t step, int increased) { return increased ? step : step * 2; }

/* first try (Extend: bytes = min(curr_region_allocation_bytes_, available_bytes)) */
static inline int64_t bfc_first_try(int64_t step, int64_t available) { return step < available ? step : available; }

/* back-off (Extend, the device refused nbytes): RoundedBytes(nbytes · 0.9) in float32, or 256
 * less when that is not smaller; the caller gives up when the result is below the request */
static inline int64_t bfc_backpedal(int64_t nbytes) {
    int64_t smaller = bfc_rounded((int64_t)((float)nbytes * BFC_BACKPEDAL_FACTOR));
    return smaller < nbytes ? smaller : nbytes - 256;
}

/* garbage collection (DeallocateFreeRegions): returning the wholly free segments (free_bytes in
 * all) is worth it when there are some and the request would then fit under the limit:
 * free_bytes > 0 and rounded <= memory_limit_ - total_region_allocated_bytes_ + free_bytes */
static inline int bfc_gc_helps(int64_t rounded, int64_t memory_limit, int64_t pool_bytes, int64_t free_bytes) {
    return free_bytes > 0 && rounded <= memory_limit - pool_bytes + free_bytes;
}

#endif
