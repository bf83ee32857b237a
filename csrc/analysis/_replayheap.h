/* The heap that replay rebuilds, event by event, in C: the part of gpuviz.analysis._replaykernel
 * that holds chunks and segments and applies one allocator event with replay's rules
 * (gpuviz.analysis.replay._apply is its Python twin). Compiled into the extension with
 * _replaykernel.c (setup.py's EXTRA_SOURCES). */
#ifndef GPUVIZ_REPLAYHEAP_H
#define GPUVIZ_REPLAYHEAP_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* gpuviz.log.schema.Kind codes of the heap events */
enum { SEGMENT_ALLOC = 0, SEGMENT_FREE = 1, ALLOC = 2, FREE = 3, SPLIT = 4, MERGE = 5, SEGMENT_MAP = 10, SEGMENT_UNMAP = 11 };

/* a chunk record (32 bytes) and a segment record (16 bytes), as replay's packed checkpoints hold them */
typedef struct {
    int64_t address, size, requested;
    int32_t tag, stack;
} chunk_rec;

typedef struct {
    int64_t base, size;
} segment_rec;

#define EMPTY INT64_MIN /* the key of an empty map slot: no address is -2**63 */

/* address -> position in a dense array of records (open addressing; swap-remove keeps the records dense) */
typedef struct {
    int64_t *keys;
    int64_t *values;
    size_t capacity, count;
} map_t;

int map_init(map_t *m, size_t capacity);  /* 0, or -1 when out of memory; capacity: a power of two */
void map_free(map_t *m);
int64_t *map_get(map_t *m, int64_t key);  /* the value's slot, or NULL */
int map_put(map_t *m, int64_t key, int64_t value);  /* 0, or -1 when out of memory */
void map_remove(map_t *m, int64_t key);

/* a growable byte buffer */
typedef struct {
    char *data;
    size_t size, capacity;
} buffer_t;

int buffer_add(buffer_t *b, const void *data, size_t n);  /* 0, or -1 when out of memory */

/* the heap: dense records + address index, for chunks and for segments */
typedef struct {
    chunk_rec *chunks;
    size_t n_chunks, cap_chunks;
    map_t chunk_at;
    segment_rec *segments;
    size_t n_segments, cap_segments;
    map_t segment_at;
} heap_t;

/* 0, or -1 when out of memory */
int set_chunk(heap_t *h, int64_t address, int64_t size, int64_t requested, int32_t tag, int32_t stack);
int set_segment(heap_t *h, int64_t base, int64_t size);
void heap_free(heap_t *h);

/* Apply one heap event to ``h`` with replay's rules: 0, or -1 with an exception set (an event
 * that contradicts the heap: KeyError(address)), or -2 when out of memory (no exception set yet). */
int apply_event(heap_t *h, int kind, int64_t a, int64_t s, int64_t requested, int32_t tag, int32_t stack);

#endif
