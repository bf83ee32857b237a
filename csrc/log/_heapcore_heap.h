/* The heap of gpuviz.log._heapcore (included by _heapcore.c only): one device's segments and
 * chunks (Core), the free sizes (counts and a lazily cleaned max-heap), HeapConflict errors,
 * and emit(), which appends one event as a row to the log's staging object (_rowsink.h). The
 * operations on it, and the Python type, are in _heapcore.c. */
#ifndef GPUVIZ_HEAPCORE_HEAP_H
#define GPUVIZ_HEAPCORE_HEAP_H

#include "_heapcore_tables.h"
#include "_rows.h" /* the row layout, pack_row (and its little-endian check) */
#include "_rowsink.h"

enum { SEGMENT_ALLOC = 0, SEGMENT_FREE = 1, ALLOC = 2, FREE = 3, SPLIT = 4, MERGE = 5, OOM = 6, SEGMENT_MAP = 10,
       SEGMENT_UNMAP = 11 };

/* ------------------------------------------------------------ the heap */
typedef struct {
    int64_t base, size;
    Vec starts; /* sorted chunk addresses */
} Segment;

typedef struct {
    int64_t size, requested, segment;
    int32_t tag, stack;
} Chunk;

typedef struct {
    PyObject_HEAD
    row_sink sink; /* the log's staging bytearray or Arena (_rowsink.h) */
    PyObject *flush, *conflict;
    Py_ssize_t limit;
    int16_t device;
    Segment *segs; /* sorted by base */
    Py_ssize_t nsegs, segcap;
    Vec bases; /* the segments' bases, for bisection */
    Map chunk_index; /* address -> index into chunks */
    Chunk *chunks;
    Py_ssize_t nchunks, chunkcap;
    Vec spare; /* unused indices of chunks */
    Map free_counts; /* free chunk size -> count */
    Vec free_heap;   /* max-heap of sizes, lazily cleaned */
} Core;

static PyObject *hex(int64_t x) {
    PyObject *n = PyLong_FromLongLong(x), *s = n ? PyNumber_ToBase(n, 16) : NULL;
    Py_XDECREF(n);
    return s;
}

/* NULL, with HeapConflict(msg) set (msg NULL: the error of making it stays set); steals msg */
static PyObject *raise_conflict(Core *c, PyObject *msg) {
    if (msg) {
        PyErr_SetObject(c->conflict, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

/* HeapConflict(format % hex(a)): format holds one %U */
static PyObject *conflict(Core *c, const char *format, int64_t a) {
    PyObject *ha = hex(a), *msg = ha ? PyUnicode_FromFormat(format, ha) : NULL;
    Py_XDECREF(ha);
    return raise_conflict(c, msg);
}

/* free-size multiset */
static void heap_push(Vec *h, int64_t x) {
    Py_ssize_t i = h->n;
    h->v[h->n++] = x;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (h->v[p] >= h->v[i]) break;
        int64_t t = h->v[p];
        h->v[p] = h->v[i];
        h->v[i] = t;
        i = p;
    }
}

static void heap_pop(Vec *h) {
    h->v[0] = h->v[--h->n];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->v[l] > h->v[m]) m = l;
        if (r < h->n && h->v[r] > h->v[m]) m = r;
        if (m == i) return;
        int64_t t = h->v[m];
        h->v[m] = h->v[i];
        h->v[i] = t;
        i = m;
    }
}

/* rebuild the max-heap from the free sizes present: stale entries would otherwise pile up (one per
 * size that came and went) and the heap grow with the trace rather than with the heap */
static void compact_free_heap(Core *c) {
    Vec *h = &c->free_heap;
    h->n = 0;
    for (Py_ssize_t i = 0; i < c->free_counts.cap; i++)
        if (c->free_counts.used[i]) heap_push(h, c->free_counts.keys[i]);
}

static int free_add(Core *c, int64_t size) {
    Py_ssize_t i = map_find(&c->free_counts, size);
    if (i >= 0) {
        c->free_counts.values[i]++;
        return 0;
    }
    if (map_set(&c->free_counts, size, 1) < 0) return -1;
    if (c->free_heap.n >= 2 * c->free_counts.n + 64) compact_free_heap(c); /* room for them all: n < cap */
    if (c->free_heap.n == c->free_heap.cap) {
        Py_ssize_t cap = c->free_heap.cap ? c->free_heap.cap * 2 : 64;
        int64_t *v = PyMem_Realloc(c->free_heap.v, cap * sizeof(int64_t));
        if (!v) return PyErr_NoMemory(), -1;
        c->free_heap.v = v;
        c->free_heap.cap = cap;
    }
    heap_push(&c->free_heap, size);
    return 0;
}

static void free_remove(Core *c, int64_t size) {
    Py_ssize_t i = map_find(&c->free_counts, size);
    if (i < 0) return;
    if (--c->free_counts.values[i] == 0) map_remove_at(&c->free_counts, i);
}

static int64_t largest(Core *c) {
    Vec *h = &c->free_heap;
    while (h->n && map_find(&c->free_counts, h->v[0]) < 0) heap_pop(h);
    return h->n ? h->v[0] : 0;
}

/* chunks */
static Chunk *chunk_get(Core *c, int64_t address) {
    Py_ssize_t i = map_find(&c->chunk_index, address);
    return i < 0 ? NULL : &c->chunks[c->chunk_index.values[i]];
}

static int set_free(Core *c, int64_t address, int64_t size, int64_t segment) {
    Chunk *ch = chunk_get(c, address);
    if (!ch) {
        Py_ssize_t index;
        if (c->spare.n) {
            index = (Py_ssize_t)c->spare.v[--c->spare.n];
        } else {
            if (c->nchunks == c->chunkcap) {
                Py_ssize_t cap = c->chunkcap ? c->chunkcap * 2 : 64;
                Chunk *p = PyMem_Realloc(c->chunks, cap * sizeof(Chunk));
                if (!p) return PyErr_NoMemory(), -1;
                c->chunks = p;
                c->chunkcap = cap;
            }
            index = c->nchunks++;
        }
        if (map_set(&c->chunk_index, address, index) < 0) return -1;
        ch = &c->chunks[index];
    }
    ch->size = size;
    ch->requested = 0;
    ch->segment = segment;
    ch->tag = -1;
    ch->stack = -1;
    return free_add(c, size);
}

static int chunk_drop(Core *c, int64_t address) {
    Py_ssize_t i = map_find(&c->chunk_index, address);
    if (i < 0) return 0;
    int64_t index = c->chunk_index.values[i];
    map_remove_at(&c->chunk_index, i);
    return vec_insert(&c->spare, c->spare.n, index);
}

static Segment *segment_holding(Core *c, int64_t address) {
    Py_ssize_t i = bisect_right(c->bases.v, c->bases.n, address) - 1;
    if (i >= 0 && address < c->segs[i].base + c->segs[i].size) return &c->segs[i];
    return NULL;
}

static Segment *segment_at(Core *c, int64_t base) {
    Py_ssize_t i = bisect_right(c->bases.v, c->bases.n, base) - 1;
    return (i >= 0 && c->segs[i].base == base) ? &c->segs[i] : NULL;
}

static int emit(Core *c, int64_t time_ns, uint8_t kind, int64_t thread, int64_t address, int64_t size,
                int64_t requested, int64_t segment, int64_t duration_ns, int32_t tag, int32_t stack) {
    row_t r = {.time_ns = time_ns, .kind = kind, .flags = 0, .device = c->device, .peer = -1, .thread = thread,
               .address = address, .size = size, .requested = requested, .segment = segment,
               .largest = largest(c), .duration = duration_ns, .tag = tag, .stack = stack};
    unsigned char *slot = row_sink_claim(&c->sink);
    if (slot == NULL) return -1;
    pack_row(slot, &r);
    if (row_sink_due(&c->sink, c->limit)) {
        PyObject *r = PyObject_CallNoArgs(c->flush);
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

#endif
