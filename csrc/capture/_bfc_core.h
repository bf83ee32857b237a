/* gpuviz's BFC allocator core in plain C (no Python): chunks, segments, the free index.
 *
 * The policy is TensorFlow's BFC, its rules stated once in _bfc_rules.h (rounding, split,
 * growth, back-off, limit, garbage collection): best fit over one index of free chunks ordered
 * by (size, address), split by bfc_should_split, coalesce on free with the next then the
 * previous chunk. bfc_grow is the one C statement of what happens when no free chunk fits
 * (Extend, then DeallocateFreeRegions and Extend again), over the caller's upstream; the
 * native Python-facing allocator (gpuviz.capture.native) decides the same in Python with
 * gpuviz.capture.bfc_rules, and the what-if replay and PyTorch's pluggable allocator call
 * bfc_grow.
 *
 * Every decision is reported through the emit callback with the columns of
 * gpuviz.log.schema (kind, address, size, requested, segment, largest_free, tag, stack);
 * the caller stamps time and thread. Or, while the caller has set ``rows`` and ``row_time``,
 * the core writes each decision's row itself, in place, into an EventLog's staging arena
 * (csrc/log/_window.h; no call per row). All sizes are bytes. Not thread-safe: the caller
 * holds a lock around every call.
 *
 * The free index is a treap (a binary search tree, heap-ordered by a deterministic
 * pseudo-random priority) of the free chunks; live and free chunks are found by address
 * in an open-addressing hash table.
 */
#ifndef GPUVIZ_BFC_CORE_H
#define GPUVIZ_BFC_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "../log/_window.h"
#include "_bfc_rules.h"

/* event kinds: gpuviz.log.schema.Kind */
enum { BFC_SEGMENT_ALLOC = 0, BFC_SEGMENT_FREE = 1, BFC_ALLOC = 2, BFC_FREE = 3, BFC_SPLIT = 4, BFC_MERGE = 5, BFC_OOM = 6 };

typedef struct {
    int64_t address;
    int64_t size;
    int64_t requested; /* 0 when free */
    int64_t segment;   /* base address of the segment holding the chunk */
    void *tag;         /* owned by the caller (a Python str in the extension), NULL when none */
    int32_t tag_id;    /* index into the log's string table, -1 none */
    int32_t prev, next; /* neighbours in the segment (chunk slots), -1 none */
    int32_t left, right; /* treap children (free chunks only), -1 none */
    uint32_t priority;
    uint8_t in_use;
} bfc_chunk;

typedef void (*bfc_emit_fn)(void *ctx, int kind, int64_t address, int64_t size, int64_t requested, int64_t segment,
                            int64_t largest_free, int32_t tag, int32_t stack);

typedef struct {
    bfc_chunk *chunks; /* slots; a free slot links to the next free one through .next */
    int32_t capacity, free_slot, live; /* live: slots in use (chunks) */
    int32_t root;                    /* treap of free chunks */
    int32_t largest;                 /* its rightmost (largest) chunk, -1 when empty */
    int64_t largest_size;            /* that chunk's size (a free chunk's size changes only out of the treap), 0 */
    int32_t free_count;              /* chunks in the treap */
    int64_t *hash_keys;              /* address, or BFC_EMPTY */
    int32_t *hash_values;            /* slot */
    size_t hash_capacity, hash_count;
    int64_t *segment_bases, *segment_sizes;
    size_t segments, segment_capacity;
    uint64_t random;
    /* stats (bytes) */
    int64_t num_allocs, bytes_in_use, peak_bytes_in_use, largest_alloc_size, pool_bytes, peak_pool_bytes;
    bfc_emit_fn emit; /* NULL: decisions are not reported (nothing is recorded) */
    void *emit_ctx;
    /* rows written in place while rows != NULL and row_time != 0 (the running decision's time, ns,
     * and thread); the caller has made room for the decision's rows beforehand, and a row that
     * finds none is not written (rows_failed is set) */
    gv_window *rows;
    int64_t row_time, row_thread;
    int16_t row_device;
    int rows_failed;
} bfc_t;

int bfc_init(bfc_t *b); /* 0, or -1 when out of memory */
void bfc_destroy(bfc_t *b);

static inline bfc_chunk *bfc_at(bfc_t *b, int32_t slot) { return &b->chunks[slot]; }

int32_t bfc_find(const bfc_t *b, int64_t address); /* slot of the chunk at address, -1 none */
int64_t bfc_largest_free(const bfc_t *b);          /* size of the largest free chunk, 0 none */

/* Remove and return the smallest free chunk >= rounded (lowest address on ties), -1 none. */
int32_t bfc_take_best_fit(bfc_t *b, int64_t rounded);
/* Put a taken chunk back into the free index (an operation that could not finish). */
void bfc_put_back(bfc_t *b, int32_t slot);
/* Split a taken chunk if the rules say so (emits split). -1 when out of memory. */
int bfc_split(bfc_t *b, int32_t slot, int64_t rounded, int32_t stack);
/* Hand out a taken (and maybe split) chunk (emits alloc). */
void bfc_mark_allocated(bfc_t *b, int32_t slot, int64_t requested, void *tag, int32_t tag_id, int32_t stack);
/* Return a live chunk (emits free, then merge for each coalesced neighbour). The chunk's
 * tag is stored in *tag for the caller to release. */
void bfc_release_chunk(bfc_t *b, int32_t slot, int32_t stack, void **tag);

/* A new segment from upstream becomes one free chunk (emits segment_alloc). -1 when out of memory. */
int bfc_add_segment(bfc_t *b, int64_t base, int64_t size, int32_t stack);
/* Whether the segment at index i is wholly free. */
int bfc_segment_wholly_free(const bfc_t *b, size_t i);
/* Take out the wholly free segment at base (emits segment_free); -1 when it is not one. */
int bfc_release_segment(bfc_t *b, int64_t base, int32_t stack);

/* Where segments come from: reserve(ctx, nbytes, &base) < 0 when the device refuses; release
 * gives a segment back; collecting (may be NULL) hears of a garbage collection before it
 * happens (count segments, bytes in all, the request) and aborts it by returning < 0. */
typedef struct {
    int (*reserve)(void *ctx, int64_t nbytes, int64_t *base);
    void (*release)(void *ctx, int64_t base, int64_t size);
    int (*collecting)(void *ctx, size_t count, int64_t bytes, int64_t rounded);
    void *ctx;
} bfc_upstream;

/* No free chunk holds ``rounded`` bytes (TF's AllocateRawInternal after FindChunkPtr fails):
 * Extend (a segment sized by the growth step, the limit and the back-off, *step updated),
 * else, with gc, DeallocateFreeRegions (every wholly free segment back upstream, in the order
 * they were added, when that makes the request fit) and Extend again. 1 when a segment was
 * added (emits segment_free rows, then segment_alloc), 0 when nothing fits under ``limit``, -1
 * when the core ran out of memory (the reservation is given back and *step restored) or the
 * collecting callback aborted. */
int bfc_grow(bfc_t *b, int64_t rounded, int64_t limit, int gc, int64_t *step, const bfc_upstream *up, int32_t stack);

/* Free chunks in index order: calls visit(ctx, chunk) for each; stops when it returns nonzero. */
int bfc_visit_free(const bfc_t *b, int (*visit)(void *ctx, const bfc_chunk *chunk), void *ctx);

#endif
