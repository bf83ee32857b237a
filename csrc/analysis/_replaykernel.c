/* gpuviz.analysis._replaykernel: replay's pass over a device's heap events and the
 * allocation table's pairing, in C (optional). The heap itself is in _replayheap.c.
 *
 * checkpoints(kinds, addresses, sizes, requested, tags, stacks, every[, positions]) applies the
 * events (columns as contiguous uint8 / int64 / int64 / int64 / int32 / int32 buffers; with
 * ``positions``, an int64 buffer of row numbers, only those rows, in that order: one device's
 * events read in place from the whole log's columns) exactly as gpuviz.analysis.replay._apply
 * does and snapshots the heap after every ``every`` events:
 *
 *   returns (chunks, chunk_offsets, segments, segment_offsets), all bytes:
 *     chunks           records of 32 bytes: address, size, requested (int64), tag, stack (int32)
 *     segments         records of 16 bytes: base, size (int64)
 *     *_offsets        int64 record offsets of each snapshot, snapshot k = after k*every events
 *                      (k = 0: the empty heap), one more offset than snapshots
 *
 * Records of a snapshot are in no particular order. A chunk that an event needs but the
 * heap lacks (a malformed log) raises KeyError(address), as the Python replay does.
 */
#include "_replayheap.h"

#include <stdlib.h>
#include <string.h>

/* the six event columns a heap pass reads (kind, address, size, requested, tag, stack) */
static void release_columns(Py_buffer *kinds, Py_buffer *addresses, Py_buffer *sizes, Py_buffer *requested,
                            Py_buffer *tags, Py_buffer *stacks) {
    PyBuffer_Release(kinds);
    PyBuffer_Release(addresses);
    PyBuffer_Release(sizes);
    PyBuffer_Release(requested);
    PyBuffer_Release(tags);
    PyBuffer_Release(stacks);
}

/* a growable bytes object: the records are written where Python reads them (no copy at the end) */
typedef struct {
    PyObject *bytes; /* NULL until the first write */
    size_t size;
} bytes_buffer_t;

/* 0, or -1 when out of memory (MemoryError set) */
static int bytes_add(bytes_buffer_t *b, const void *data, size_t n) {
    size_t capacity = b->bytes ? (size_t)PyBytes_GET_SIZE(b->bytes) : 0;
    if (b->size + n > capacity) {
        size_t grown = capacity ? capacity : 4096;
        while (grown < b->size + n) grown *= 2;
        if (b->bytes == NULL) b->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)grown);
        else _PyBytes_Resize(&b->bytes, (Py_ssize_t)grown); /* on failure: NULL, the old one released */
        if (b->bytes == NULL) return -1;
    }
    memcpy(PyBytes_AS_STRING(b->bytes) + b->size, data, n);
    b->size += n;
    return 0;
}

/* the buffer's bytes, exactly as long as what was written (a new reference; the buffer is emptied),
 * or NULL with an exception set */
static PyObject *bytes_take(bytes_buffer_t *b) {
    PyObject *bytes = b->bytes;
    b->bytes = NULL;
    if (bytes == NULL) return PyBytes_FromStringAndSize("", 0);
    if (_PyBytes_Resize(&bytes, (Py_ssize_t)b->size) < 0) return NULL;
    return bytes;
}

/* the event columns a replay reads (``position``: indices into them, or NULL for rows in order) */
typedef struct {
    const int64_t *position;
    const uint8_t *kind;
    const int64_t *address, *size, *requested;
    const int32_t *tag, *stack;
    Py_ssize_t rows;
} events_t;

/* apply events [from, to) (indices into ``position``, or rows) to the heap: 0, or -1 with an
 * exception set (an IndexError for a position outside the columns, MemoryError, or apply_event's) */
static int apply_span(heap_t *h, const events_t *ev, Py_ssize_t from, Py_ssize_t to) {
    for (Py_ssize_t i = from; i < to; i++) {
        Py_ssize_t e = ev->position ? ev->position[i] : i;
        if (e < 0 || e >= ev->rows) {
            PyErr_SetString(PyExc_IndexError, "an event position is outside the columns");
            return -1;
        }
        int failed = apply_event(h, ev->kind[e], ev->address[e], ev->size[e], ev->requested[e], ev->tag[e], ev->stack[e]);
        if (failed == -1) return -1;
        if (failed) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* append the heap's records and their new ends: 0, or -1 when out of memory (MemoryError set) */
static int add_snapshot(heap_t *h, bytes_buffer_t *chunks, buffer_t *chunk_offsets, bytes_buffer_t *segments,
                        buffer_t *segment_offsets) {
    if (bytes_add(chunks, h->chunks, h->n_chunks * sizeof(chunk_rec)) < 0 ||
        bytes_add(segments, h->segments, h->n_segments * sizeof(segment_rec)) < 0)
        return -1;
    int64_t c = (int64_t)(chunks->size / sizeof(chunk_rec)), s = (int64_t)(segments->size / sizeof(segment_rec));
    if (buffer_add(chunk_offsets, &c, sizeof c) < 0 || buffer_add(segment_offsets, &s, sizeof s) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *checkpoints(PyObject *module, PyObject *args) {
    Py_buffer kinds, addresses, sizes, requested, tags, stacks, picked = {0};
    Py_ssize_t every;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*n|y*", &kinds, &addresses, &sizes, &requested, &tags, &stacks, &every,
                          &picked))
        return NULL;
    PyObject *result = NULL;
    heap_t h = {0};
    bytes_buffer_t chunks = {0}, segments = {0};
    buffer_t chunk_offsets = {0}, segment_offsets = {0};
    PyObject *chunk_bytes = NULL, *segment_bytes = NULL;
    Py_ssize_t rows = kinds.len, n = picked.buf ? picked.len / 8 : rows;
    if (every < 1 || addresses.len != rows * 8 || sizes.len != rows * 8 || requested.len != rows * 8 ||
        tags.len != rows * 4 || stacks.len != rows * 4 || (picked.buf && picked.len % 8)) {
        PyErr_SetString(PyExc_ValueError, "columns of unequal length or wrong item size, or every < 1");
        goto done;
    }
    /* the events to apply, in order (``picked``; NULL: every row) */
    const events_t ev = {picked.buf, kinds.buf, addresses.buf, sizes.buf, requested.buf, tags.buf, stacks.buf, rows};
    if (map_init(&h.chunk_at, 1024) < 0 || map_init(&h.segment_at, 64) < 0) goto nomem;
    int64_t zeros[2] = {0, 0}; /* snapshot 0, the empty heap: records [0, 0) */
    if (buffer_add(&chunk_offsets, zeros, sizeof zeros) < 0 || buffer_add(&segment_offsets, zeros, sizeof zeros) < 0)
        goto nomem;
    for (Py_ssize_t i = 0; i < n; i += every) { /* a snapshot after every ``every`` events */
        Py_ssize_t to = n - i < every ? n : i + every;
        if (apply_span(&h, &ev, i, to) < 0) goto done;
        if (to - i == every && add_snapshot(&h, &chunks, &chunk_offsets, &segments, &segment_offsets) < 0) goto done;
    }
    chunk_bytes = bytes_take(&chunks);
    segment_bytes = chunk_bytes ? bytes_take(&segments) : NULL;
    if (segment_bytes != NULL)
        result = Py_BuildValue("(Oy#Oy#)", chunk_bytes, chunk_offsets.data, (Py_ssize_t)chunk_offsets.size,
                               segment_bytes, segment_offsets.data, (Py_ssize_t)segment_offsets.size);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    heap_free(&h);
    Py_XDECREF(chunks.bytes);
    Py_XDECREF(segments.bytes);
    Py_XDECREF(chunk_bytes);
    Py_XDECREF(segment_bytes);
    free(chunk_offsets.data);
    free(segment_offsets.data);
    release_columns(&kinds, &addresses, &sizes, &requested, &tags, &stacks);
    if (picked.buf) PyBuffer_Release(&picked);
    return result;
}

/* heap_load: a fresh heap holding the given records (a checkpoint): 0, or -1 when out of memory */
static int heap_load(heap_t *h, const chunk_rec *c, size_t n_chunks, const segment_rec *g, size_t n_segments) {
    heap_free(h);
    *h = (heap_t){0};
    if (map_init(&h->chunk_at, 1024) < 0 || map_init(&h->segment_at, 64) < 0) return -1;
    for (size_t j = 0; j < n_segments; j++)
        if (set_segment(h, g[j].base, g[j].size) < 0) return -1;
    for (size_t j = 0; j < n_chunks; j++)
        if (set_chunk(h, c[j].address, c[j].size, c[j].requested, c[j].tag, c[j].stack) < 0) return -1;
    return 0;
}

/* the heap's records as a (chunks, segments) tuple of bytes, or NULL with an exception set */
static PyObject *heap_records(const heap_t *h) {
    return Py_BuildValue("(y#y#)", h->chunks ? (const char *)h->chunks : "", (Py_ssize_t)(h->n_chunks * sizeof(chunk_rec)),
                         h->segments ? (const char *)h->segments : "",
                         (Py_ssize_t)(h->n_segments * sizeof(segment_rec)));
}

/* state(kinds, addresses, sizes, requested, tags, stacks, chunks, segments, start, stop[, positions])
 * -> (chunks, segments): the heap after applying events [start, stop) (indices into
 * ``positions``, or rows without it) to a snapshot given as packed chunk and segment records
 * (a checkpoint of ``checkpoints``); the records of the result as bytes, in no particular order.
 * Replay.state_at's last step, without a Python object per chunk or event. */
static PyObject *state(PyObject *module, PyObject *args) {
    Py_buffer kinds, addresses, sizes, requested, tags, stacks, chunk_recs, segment_recs, picked = {0};
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*nn|y*", &kinds, &addresses, &sizes, &requested, &tags, &stacks,
                          &chunk_recs, &segment_recs, &start, &stop, &picked))
        return NULL;
    PyObject *result = NULL;
    heap_t h = {0};
    Py_ssize_t rows = kinds.len, n = picked.buf ? picked.len / 8 : rows;
    if (addresses.len != rows * 8 || sizes.len != rows * 8 || requested.len != rows * 8 || tags.len != rows * 4 ||
        stacks.len != rows * 4 || (picked.buf && picked.len % 8) || chunk_recs.len % sizeof(chunk_rec) ||
        segment_recs.len % sizeof(segment_rec) || start < 0 || stop < start || stop > n) {
        PyErr_SetString(PyExc_ValueError, "state: columns of unequal length or wrong item size, or a bad range");
        goto done;
    }
    const events_t ev = {picked.buf, kinds.buf, addresses.buf, sizes.buf, requested.buf, tags.buf, stacks.buf, rows};
    if (heap_load(&h, chunk_recs.buf, chunk_recs.len / sizeof(chunk_rec), segment_recs.buf,
                  segment_recs.len / sizeof(segment_rec)) < 0)
        goto nomem;
    if (apply_span(&h, &ev, start, stop) < 0) goto done;
    result = heap_records(&h);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    heap_free(&h);
    release_columns(&kinds, &addresses, &sizes, &requested, &tags, &stacks);
    PyBuffer_Release(&chunk_recs);
    PyBuffer_Release(&segment_recs);
    if (picked.buf) PyBuffer_Release(&picked);
    return result;
}

/* states(kinds, addresses, sizes, requested, tags, stacks, chunks, chunk_offsets, segments,
 * segment_offsets, every, stops[, positions]) -> [(chunks, segments), ...]: the heap after the
 * first stops[i] events (indices into ``positions``, or rows without it) for every i, given the
 * checkpoints of ``checkpoints`` (after k * every events). ``stops``: int64, ascending. One pass:
 * the events between two stops are applied once, from the earlier stop's heap, or from a later
 * checkpoint where that one holds fewer records than the events it skips. Each state's records as
 * ``state`` gives them (bytes, in no particular order). */
static PyObject *states(PyObject *module, PyObject *args) {
    Py_buffer kinds, addresses, sizes, requested, tags, stacks, ck_chunks, ck_chunk_at, ck_segments, ck_segment_at,
        wanted, picked = {0};
    Py_ssize_t every;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*ny*|y*", &kinds, &addresses, &sizes, &requested, &tags, &stacks,
                          &ck_chunks, &ck_chunk_at, &ck_segments, &ck_segment_at, &every, &wanted, &picked))
        return NULL;
    PyObject *result = NULL, *list = NULL;
    heap_t h = {0};
    Py_ssize_t rows = kinds.len, n = picked.buf ? picked.len / 8 : rows, n_stops = wanted.len / 8;
    Py_ssize_t n_checkpoints = ck_chunk_at.len / 8 - 1;
    const int64_t *stop = wanted.buf, *chunk_at = ck_chunk_at.buf, *segment_at = ck_segment_at.buf;
    int bad = every < 1 || addresses.len != rows * 8 || sizes.len != rows * 8 || requested.len != rows * 8 ||
              tags.len != rows * 4 || stacks.len != rows * 4 || (picked.buf && picked.len % 8) || wanted.len % 8 ||
              ck_chunks.len % sizeof(chunk_rec) || ck_segments.len % sizeof(segment_rec) || ck_chunk_at.len % 8 ||
              n_checkpoints < 1 || ck_segment_at.len != ck_chunk_at.len;
    for (Py_ssize_t i = 0; !bad && i < n_stops; i++)
        bad = stop[i] < 0 || stop[i] > n || (i && stop[i] < stop[i - 1]) || stop[i] / every >= n_checkpoints;
    for (Py_ssize_t k = 0; !bad && k <= n_checkpoints; k++)
        bad = chunk_at[k] < 0 || (size_t)chunk_at[k] > ck_chunks.len / sizeof(chunk_rec) || segment_at[k] < 0 ||
              (size_t)segment_at[k] > ck_segments.len / sizeof(segment_rec) ||
              (k && (chunk_at[k] < chunk_at[k - 1] || segment_at[k] < segment_at[k - 1]));
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "states: columns of unequal length or wrong item size, bad checkpoints, "
                                          "or stops out of range or not ascending");
        goto done;
    }
    const events_t ev = {picked.buf, kinds.buf, addresses.buf, sizes.buf, requested.buf, tags.buf, stacks.buf, rows};
    const chunk_rec *c = ck_chunks.buf;
    const segment_rec *g = ck_segments.buf;
    list = PyList_New(n_stops);
    if (list == NULL) goto done;
    Py_ssize_t applied = -1; /* events in h; -1: no heap yet */
    for (Py_ssize_t i = 0; i < n_stops; i++) {
        Py_ssize_t k = stop[i] / every, from = k * every;
        int64_t records = (chunk_at[k + 1] - chunk_at[k]) + (segment_at[k + 1] - segment_at[k]);
        if (applied < 0 || (from > applied && stop[i] - applied > records)) {
            if (heap_load(&h, c + chunk_at[k], (size_t)(chunk_at[k + 1] - chunk_at[k]), g + segment_at[k],
                          (size_t)(segment_at[k + 1] - segment_at[k])) < 0)
                goto nomem;
            applied = from;
        }
        if (apply_span(&h, &ev, applied, stop[i]) < 0) goto done;
        applied = stop[i];
        PyObject *records_now = heap_records(&h);
        if (records_now == NULL) goto done;
        PyList_SET_ITEM(list, i, records_now);
    }
    result = list;
    list = NULL;
    goto done;
nomem:
    PyErr_NoMemory();
done:
    Py_XDECREF(list);
    heap_free(&h);
    release_columns(&kinds, &addresses, &sizes, &requested, &tags, &stacks);
    PyBuffer_Release(&ck_chunks);
    PyBuffer_Release(&ck_chunk_at);
    PyBuffer_Release(&ck_segments);
    PyBuffer_Release(&ck_segment_at);
    PyBuffer_Release(&wanted);
    if (picked.buf) PyBuffer_Release(&picked);
    return result;
}

/* alloc_pairs(kinds, devices, addresses, device) -> (rows, free_index): over a whole log
 * (uint8 / int16 / int64 buffers), the log position of every alloc event, in log order, of
 * ``device`` (-1: every device), and per alloc the position of the free that ends it (the next
 * alloc or free event at its address on its device, when that is a free), else -1 (int64
 * bytearrays each). gpuviz.analysis.tables.allocation_table's rows and pairing in one pass. */
static PyObject *alloc_pairs(PyObject *module, PyObject *args) {
    Py_buffer kinds, devices, addresses;
    int device;
    if (!PyArg_ParseTuple(args, "y*y*y*i", &kinds, &devices, &addresses, &device)) return NULL;
    PyObject *rows = NULL, *frees = NULL, *result = NULL;
    map_t *open = NULL; /* per device id: address -> row of its open alloc */
    buffer_t row_buf = {0}, free_buf = {0};
    Py_ssize_t n = kinds.len;
    if (devices.len != n * 2 || addresses.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "alloc_pairs: columns of unequal length or wrong item size");
        goto done;
    }
    open = calloc(32768, sizeof(map_t));
    if (open == NULL) goto nomem;
    const uint8_t *kind = kinds.buf;
    const int16_t *dev = devices.buf;
    const int64_t *address = addresses.buf;
    int64_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((kind[i] != ALLOC && kind[i] != FREE) || dev[i] < 0 || (device >= 0 && dev[i] != device)) continue;
        if (address[i] == EMPTY) {
            PyErr_SetString(PyExc_ValueError, "alloc_pairs: an address of -2**63");
            goto done;
        }
        map_t *m = &open[dev[i]];
        if (m->keys == NULL && map_init(m, 1024) < 0) goto nomem;
        if (kind[i] == ALLOC) {
            int64_t position = i, none = -1;
            if (buffer_add(&row_buf, &position, 8) < 0 || buffer_add(&free_buf, &none, 8) < 0) goto nomem;
            if (map_put(m, address[i], count++) < 0) goto nomem;
        } else {
            int64_t *row = map_get(m, address[i]);
            if (row != NULL) {
                ((int64_t *)free_buf.data)[*row] = i;
                map_remove(m, address[i]);
            }
        }
    }
    rows = PyByteArray_FromStringAndSize(row_buf.data, (Py_ssize_t)row_buf.size); /* writable for NumPy */
    frees = PyByteArray_FromStringAndSize(free_buf.data, (Py_ssize_t)free_buf.size);
    if (rows != NULL && frees != NULL) result = PyTuple_Pack(2, rows, frees);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    Py_XDECREF(rows);
    Py_XDECREF(frees);
    if (open != NULL) {
        for (int d = 0; d < 32768; d++)
            if (open[d].keys != NULL) map_free(&open[d]);
        free(open);
    }
    free(row_buf.data);
    free(free_buf.data);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&devices);
    PyBuffer_Release(&addresses);
    return result;
}

static PyMethodDef methods[] = {
    {"alloc_pairs", alloc_pairs, METH_VARARGS,
     "alloc_pairs(kinds, devices, addresses, device) -> (rows, free_index): allocations and their frees"},
    {"state", state, METH_VARARGS,
     "state(kinds, addresses, sizes, requested, tags, stacks, chunks, segments, start, stop[, positions]) -> "
     "(chunks, segments)"},
    {"states", states, METH_VARARGS,
     "states(kinds, addresses, sizes, requested, tags, stacks, chunks, chunk_offsets, segments, segment_offsets, "
     "every, stops[, positions]) -> [(chunks, segments), ...]"},
    {"checkpoints", checkpoints, METH_VARARGS,
     "checkpoints(kinds, addresses, sizes, requested, tags, stacks, every[, positions]) -> "
     "(chunks, chunk_offsets, segments, segment_offsets)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuviz.analysis._replaykernel",
    .m_doc = "Replay's pass over the heap events in C (optional; see gpuviz.analysis.replay).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__replaykernel(void) { return PyModule_Create(&module); }
