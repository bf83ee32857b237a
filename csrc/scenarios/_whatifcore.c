/* gpuviz.scenarios._whatifcore: what-if replays of a request stream in C (optional).
 *
 * replay(kind, device, columns, upstream, free_segments, stop_at_oom, settings, tables, bfc)
 * serves a request stream (gpuviz.analysis.requests) with one policy over a simulated
 * device and returns the replay's events as columns (gpuviz.log.schema.ROW_COLUMNS, one
 * bytearray each). The policies are the Python models' decisions, restated:
 *
 *   kind 1  torch     gpuviz.scenarios.torch_caching.TorchCachingAllocator (no expandable segments)
 *   kind 2  rmm-pool  gpuviz.scenarios.pools.RmmPoolAllocator
 *   kind 3  no-pool   gpuviz.scenarios.pools.NoPoolAllocator
 *   kind 4  tf-bfc    gpuviz.capture.native.NativeBFCAllocator: the same BFC core (_bfc_core.c),
 *                     growth, limit and garbage collection included (bfc_grow, whose rules are
 *                     _bfc_rules.h's), over the simulated device
 *
 * over gpuviz.capture.upstream.SimUpstream (first fit by address), recording what
 * gpuviz.log.heapbuilder.HeapBuilder records for each decision (split, alloc, free, merge,
 * segment_alloc, segment_free, oom, with the largest free chunk after each; tf-bfc: what the
 * native core records, its thread column the replaying thread). The Python
 * models stay the executable reference: tests drive both on the same streams and compare
 * the logs row by row. The replay loop is gpuviz.scenarios.whatif.replay_policy's.
 *
 * columns: (is_alloc u8, deferred u8, alloc_of i64, requested i64, time_ns i64, tag i64,
 * stack i64), one entry per request; tables: (strings, stacks), the sizes of the source's
 * tables. Events carry the request's time, and tag and stack indices numbered in order of
 * first use (as the Python replay interns them). Returns (served, processed, columns, tags,
 * stacks): requests served, requests looked at (the replay stops after the first out of
 * memory unless stop_at_oom is false), the 14 columns, and the source's tag and stack
 * indices in order of first use. Sizes and addresses are bytes, times ns. bfc: (next_segment,
 * gc, warn) for tf-bfc: TF's first segment size, garbage collection on, and the callable that
 * logs its warning (count, bytes, rounded request).
 *
 * Free blocks and free chunks are ordered sets of (size, address) in binned sorted arrays;
 * the device's free gaps a treap by address whose nodes know their subtree's largest gap
 * (first fit); blocks are found by address in an open-addressing hash table
 * (_whatif_sets.h). Events, the device and the pools are _whatif_heap.h, the policies
 * _whatif_policies.h; this file holds the context, the loop and the module, and includes
 * the other parts (one translation unit).
 * Running out of host memory unwinds with longjmp to replay(), which frees everything.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../capture/_bfc_core.h"

#ifdef Py_GIL_DISABLED
#error "rows are appended relying on the GIL; the Python replay is used instead"
#endif

enum { SEGMENT_ALLOC = 0, SEGMENT_FREE = 1, ALLOC = 2, FREE = 3, SPLIT = 4, MERGE = 5, OOM = 6 };
enum { TORCH = 1, RMM = 2, NOPOOL = 3, BFC = 4 };

#define ALIGNMENT 256
#define MIN_BLOCK 512
#define SMALL_SIZE ((int64_t)1 << 20)
#define SMALL_BUFFER ((int64_t)2 << 20)
#define LARGE_BUFFER ((int64_t)20 << 20)
#define MIN_LARGE_ALLOC ((int64_t)10 << 20)
#define ROUND_LARGE ((int64_t)2 << 20)
#define NO_MAX_SPLIT INT64_MAX

/* ------------------------------------------------------------------ context */
typedef struct {
    int64_t k1, k2, val, max; /* key (k1, k2); max: the largest val in the subtree */
    int32_t left, right;
    uint32_t priority;
} node_t;

/* An ordered set of (size, address) keys: sorted arrays in 512 bins of sizes (8 per power of
 * two, so a bin's sizes lie within 1/8 of each other), a bitmap of the non-empty bins. Best
 * fit is a binary search in one bin, or the first key of the next non-empty bin. */
#define NBINS 512
typedef struct {
    int64_t *keys; /* (size, address) pairs, sorted */
    int32_t n, cap;
} bin_t;

typedef struct {
    bin_t bins[NBINS];
    uint64_t nonempty[NBINS / 64];
} set_t;

typedef struct {
    int64_t address, size, segment, requested, age; /* requested 0: free */
    int32_t prev, next;                             /* neighbours in the segment, -1 none */
    int32_t tag, stack, pending;                    /* pending: slot in the deferred list, -1 none */
    uint8_t small;
} block_t;

typedef struct {
    jmp_buf fail;
    int failed_python; /* a Python exception is set (else: out of memory) */
    /* the replay's events: one bytearray per column of gpuviz.log.schema.ROW_COLUMNS */
    PyObject *out[14];
    char *out_at[14];
    Py_ssize_t rows, row_cap;
    int16_t device;
    int64_t now;
    node_t *nodes;
    int32_t node_cap, node_used, node_free;
    uint64_t random;
    set_t free_chunks; /* HeapBuilder's free chunks: the largest free */
    /* SimUpstream */
    int64_t capacity, device_reserved, tail;
    int32_t holes; /* keyed (address, 0), val = size */
    /* blocks by address */
    block_t *blocks;
    int32_t block_cap, block_used, block_free;
    int64_t *keys;
    int32_t *values;
    size_t map_cap, map_n;
    /* policy */
    int kind;
    int64_t reserved, in_use;
    set_t pool[2];    /* free blocks; torch: [0] large, [1] small; rmm: pool[0] */
    int64_t calls[2]; /* torch: get_free_block calls per pool (GC ages) */
    int64_t max_split, allowed, maximum; /* allowed/maximum: -1 none; BFC: maximum is the memory limit */
    double gc_threshold;
    int64_t divisions[16];
    int64_t *pending_keys; /* torch's deferred frees in order: (address, key) pairs; address -1 done */
    size_t pending_n, pending_cap, pending_live;
    uint8_t *synchronized, *waiting; /* per allocation position */
    int32_t *tag_ids, *stack_ids; /* source index -> the replay log's (-1 not used yet) */
    Py_ssize_t n_tags, n_stacks;
    PyObject *tag_order, *stack_order; /* lists of source indices in order of first use */
    /* tf-bfc */
    bfc_t bfc;
    int bfc_ready, bfc_gc;
    int64_t next_segment; /* TF's next segment size (bytes) */
    int64_t thread;       /* the thread column of BFC's events: the replaying thread, as recorded */
    PyObject *warn;       /* warn(count, bytes, rounded): garbage collection's warning */
} ctx_t;

static void *grow_array(ctx_t *c, void *p, size_t n, size_t size) {
    void *q = realloc(p, n * size);
    if (!q) longjmp(c->fail, 1);
    return q;
}

#include "_whatif_sets.h"
#include "_whatif_heap.h"
#include "_whatif_policies.h"

/* ------------------------------------------------------------------ the replay loop */
typedef struct {
    Py_buffer is_alloc, deferred, alloc_of, requested, time_ns, tag, stack;
} columns_t;

static int run(ctx_t *c, const columns_t *cols, Py_ssize_t n, int stop_at_oom, int64_t *addresses, Py_ssize_t *served,
               Py_ssize_t *processed) {
    const uint8_t *is_alloc = cols->is_alloc.buf, *deferred = cols->deferred.buf;
    const int64_t *alloc_of = cols->alloc_of.buf, *requested = cols->requested.buf, *time_ns = cols->time_ns.buf;
    const int64_t *tag = cols->tag.buf, *stack = cols->stack.buf;
    Py_ssize_t i = 0;
    *served = 0;
    for (; i < n; i++) {
        c->now = time_ns[i];
        if (is_alloc[i]) {
            int64_t a;
            if (c->kind == BFC) { /* its tag is numbered once it fits, its stack never (stacks off) */
                a = bfc_allocate(c, requested[i], tag[i]);
            } else {
                int32_t t = local_id(c, tag[i], c->tag_ids, c->n_tags, c->tag_order);
                int32_t s = local_id(c, stack[i], c->stack_ids, c->n_stacks, c->stack_order);
                a = c->kind == TORCH ? torch_allocate(c, requested[i], t, s)
                    : c->kind == RMM ? rmm_allocate(c, requested[i], t, s)
                                     : nopool_allocate(c, requested[i], t, s);
            }
            if (a < 0) {
                if (stop_at_oom) {
                    i++;
                    break;
                }
                continue;
            }
            addresses[i] = a;
        } else {
            int64_t made = alloc_of[i];
            int64_t address = addresses[made];
            if (address < 0) continue; /* its allocation failed and was skipped */
            if (deferred[i]) {
                if (c->kind == TORCH) {
                    torch_defer(c, address, made);
                    c->waiting[made] = 1;
                }
            } else if (c->waiting[made]) {
                c->waiting[made] = 0;
                torch_complete(c, address, made);
            } else if (c->kind == NOPOOL) {
                nopool_free(c, address);
            } else if (c->kind == BFC) {
                bfc_free(c, address);
            } else {
                free_block(c, block_at(c, address));
            }
        }
        ++*served;
    }
    *processed = i;
    return 0;
}

static void ctx_free(ctx_t *c) {
    if (c->bfc_ready) bfc_destroy(&c->bfc);
    set_destroy(&c->free_chunks);
    set_destroy(&c->pool[0]);
    set_destroy(&c->pool[1]);
    free(c->nodes);
    free(c->blocks);
    free(c->keys);
    free(c->values);
    free(c->pending_keys);
    free(c->synchronized);
    free(c->waiting);
    free(c->tag_ids);
    free(c->stack_ids);
    for (int i = 0; i < 14; i++) Py_XDECREF(c->out[i]);
    Py_XDECREF(c->tag_order);
    Py_XDECREF(c->stack_order);
}

static int get_column(PyObject *columns, Py_ssize_t i, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n) {
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, i), view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len != itemsize * n) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_Format(PyExc_ValueError, "column %zd has %zd bytes, expected %zd", i, view->len, itemsize * n);
        return -1;
    }
    return 0;
}

static PyObject *replay(PyObject *Py_UNUSED(module), PyObject *args) {
    int kind, device, stop_at_oom;
    PyObject *columns, *free_segments, *divisions;
    long long capacity, base, tail, reserved, max_split, allowed, maximum;
    Py_ssize_t n_tags, n_stacks;
    double gc_threshold;
    long long next_segment;
    int bfc_gc;
    PyObject *warn;
    if (!PyArg_ParseTuple(args, "iiO!(LLLL)O!p(LLdO!L)(nn)(LpO)", &kind, &device, &PyTuple_Type, &columns, &capacity,
                          &base, &tail, &reserved, &PyList_Type, &free_segments, &stop_at_oom, &max_split, &allowed,
                          &gc_threshold, &PyTuple_Type, &divisions, &maximum, &n_tags, &n_stacks, &next_segment,
                          &bfc_gc, &warn))
        return NULL;
    if (kind < TORCH || kind > BFC || PyTuple_GET_SIZE(columns) != 7 || PyTuple_GET_SIZE(divisions) != 16 ||
        n_tags < 0 || n_stacks < 0 || base > tail) {
        PyErr_SetString(PyExc_ValueError, "replay: unknown policy kind, or not 7 columns and 16 divisions");
        return NULL;
    }
    ctx_t *c = calloc(1, sizeof(ctx_t));
    columns_t cols;
    memset(&cols, 0, sizeof(cols));
    Py_buffer *views[7] = {&cols.is_alloc, &cols.deferred, &cols.alloc_of, &cols.requested,
                           &cols.time_ns, &cols.tag, &cols.stack};
    int64_t *addresses = NULL;
    PyObject *volatile result = NULL;
    if (!c) return PyErr_NoMemory();
    Py_ssize_t n = PyObject_Length(PyTuple_GET_ITEM(columns, 0));
    if (n < 0) goto done;
    for (int i = 0; i < 7; i++)
        if (get_column(columns, i, views[i], i < 2 ? 1 : 8, n) < 0) goto done;
    for (int i = 0; i < 16; i++) c->divisions[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(divisions, i));
    if (PyErr_Occurred()) goto done;
    const int64_t *alloc_of = cols.alloc_of.buf;
    const uint8_t *is_alloc = cols.is_alloc.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!is_alloc[i] && (alloc_of[i] < 0 || alloc_of[i] >= i || !is_alloc[alloc_of[i]])) {
            PyErr_Format(PyExc_ValueError, "request %zd frees no earlier allocation of the stream", i);
            goto done;
        }
    }
    size_t room = (size_t)(n ? n : 1);
    addresses = malloc(room * sizeof(int64_t));
    c->synchronized = calloc(room, 1);
    c->waiting = calloc(room, 1);
    c->tag_ids = malloc((size_t)(n_tags + 1) * sizeof(int32_t));
    c->stack_ids = malloc((size_t)(n_stacks + 1) * sizeof(int32_t));
    if (!addresses || !c->synchronized || !c->waiting || !c->tag_ids || !c->stack_ids) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) addresses[i] = -1;
    for (Py_ssize_t i = 0; i < n_tags; i++) c->tag_ids[i] = -1;
    for (Py_ssize_t i = 0; i < n_stacks; i++) c->stack_ids[i] = -1;
    c->n_tags = n_tags;
    c->n_stacks = n_stacks;
    c->tag_order = PyList_New(0);
    c->stack_order = PyList_New(0);
    if (!c->tag_order || !c->stack_order) goto done;
    for (int i = 0; i < 14; i++)
        if (!(c->out[i] = PyByteArray_FromStringAndSize(NULL, 0))) goto done;
    c->device = (int16_t)device;
    c->kind = kind;
    c->node_free = c->block_free = -1;
    c->holes = -1;
    c->random = 0x9E3779B97F4A7C15ull;
    c->capacity = capacity;
    c->tail = tail;
    c->device_reserved = c->reserved = reserved;
    c->max_split = max_split < 0 ? NO_MAX_SPLIT : max_split;
    c->allowed = allowed;
    c->maximum = maximum;
    c->gc_threshold = gc_threshold;
    c->next_segment = next_segment;
    c->bfc_gc = bfc_gc;
    c->warn = warn;
    c->thread = (int64_t)PyThread_get_thread_ident();
    if (kind == BFC) {
        if (bfc_init(&c->bfc) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        c->bfc_ready = 1;
        c->bfc.emit = bfc_row;
        c->bfc.emit_ctx = c;
    }
    Py_ssize_t served = 0, processed = 0;
    if (setjmp(c->fail)) {
        if (!c->failed_python) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(free_segments); i++) { /* rmm's initial pool */
        long long at, size;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(free_segments, i), "LL", &at, &size)) goto done;
        set_insert(c, &c->free_chunks, size, at);
        insert_free(c, new_block(c, at, size, at, 0));
    }
    run(c, &cols, n, stop_at_oom, addresses, &served, &processed);
    resize_columns(c, c->rows);
    PyObject *out = PyTuple_New(14);
    if (!out) goto done;
    for (int i = 0; i < 14; i++) {
        PyTuple_SET_ITEM(out, i, c->out[i]);
        c->out[i] = NULL;
    }
    result = Py_BuildValue("nnNOO", served, processed, out, c->tag_order, c->stack_order);
done:
    for (int i = 0; i < 7; i++)
        if (views[i]->obj) PyBuffer_Release(views[i]);
    free(addresses);
    ctx_free(c);
    free(c);
    return result;
}

static PyMethodDef methods[] = {
    {"replay", replay, METH_VARARGS,
     "replay(kind, device, columns, (capacity, base, tail, reserved), free_segments, stop_at_oom, "
     "(max_split, allowed, gc_threshold, divisions, maximum), (strings, stacks), (next_segment, gc, warn)) -> "
     "(served, processed, columns, tags, stacks)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_whatifcore", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__whatifcore(void) { return PyModule_Create(&module); }
