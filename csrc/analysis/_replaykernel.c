/* gpuviz.analysis._replaykernel: replay's one pass over a device's heap events, in C (optional).
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
 * timeline(...) computes gpuviz.analysis.timeline's series in one pass (see below).
 *
 * Records of a snapshot are in no particular order. A chunk that an event needs but the
 * heap lacks (a malformed log) raises KeyError(address), as the Python replay does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SEGMENT_ALLOC = 0, SEGMENT_FREE = 1, ALLOC = 2, FREE = 3, SPLIT = 4, MERGE = 5, SEGMENT_MAP = 10, SEGMENT_UNMAP = 11 };

typedef struct {
    int64_t address, size, requested;
    int32_t tag, stack;
} chunk_rec;

typedef struct {
    int64_t base, size;
} segment_rec;

#define EMPTY INT64_MIN

/* address -> position in a dense array of records (swap-remove keeps it dense) */
typedef struct {
    int64_t *keys;
    int64_t *values;
    size_t capacity, count;
} map_t;

static size_t slot_of(int64_t key, size_t mask) {
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}

static int map_init(map_t *m, size_t capacity) {
    m->keys = malloc(capacity * sizeof(int64_t));
    m->values = malloc(capacity * sizeof(int64_t));
    if (m->keys == NULL || m->values == NULL) return -1;
    for (size_t i = 0; i < capacity; i++) m->keys[i] = EMPTY;
    m->capacity = capacity;
    m->count = 0;
    return 0;
}

static void map_free(map_t *m) {
    free(m->keys);
    free(m->values);
}

static int64_t *map_get(map_t *m, int64_t key) {
    size_t mask = m->capacity - 1, j = slot_of(key, mask);
    for (;;) {
        if (m->keys[j] == key) return &m->values[j];
        if (m->keys[j] == EMPTY) return NULL;
        j = (j + 1) & mask;
    }
}

static int map_put(map_t *m, int64_t key, int64_t value) {
    if ((m->count + 1) * 2 > m->capacity) {
        map_t bigger;
        if (map_init(&bigger, m->capacity * 2) < 0) return -1;
        for (size_t i = 0; i < m->capacity; i++)
            if (m->keys[i] != EMPTY) map_put(&bigger, m->keys[i], m->values[i]);
        map_free(m);
        *m = bigger;
    }
    size_t mask = m->capacity - 1, j = slot_of(key, mask);
    while (m->keys[j] != EMPTY && m->keys[j] != key) j = (j + 1) & mask;
    if (m->keys[j] == EMPTY) m->count++;
    m->keys[j] = key;
    m->values[j] = value;
    return 0;
}

static void map_remove(map_t *m, int64_t key) {
    size_t mask = m->capacity - 1, j = slot_of(key, mask);
    while (m->keys[j] != key) {
        if (m->keys[j] == EMPTY) return;
        j = (j + 1) & mask;
    }
    size_t hole = j;
    for (;;) {
        j = (j + 1) & mask;
        int64_t k = m->keys[j];
        if (k == EMPTY) break;
        size_t home = slot_of(k, mask);
        int passes = home <= j ? (home <= hole && hole < j) : (hole >= home || hole < j);
        if (passes) {
            m->keys[hole] = k;
            m->values[hole] = m->values[j];
            hole = j;
        }
    }
    m->keys[hole] = EMPTY;
    m->count--;
}

/* a growable byte buffer */
typedef struct {
    char *data;
    size_t size, capacity;
} buffer_t;

static int buffer_add(buffer_t *b, const void *data, size_t n) {
    if (b->size + n > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 4096;
        while (capacity < b->size + n) capacity *= 2;
        char *grown = realloc(b->data, capacity);
        if (grown == NULL) return -1;
        b->data = grown;
        b->capacity = capacity;
    }
    memcpy(b->data + b->size, data, n);
    b->size += n;
    return 0;
}

/* the heap: dense records + address index, for chunks and for segments */
typedef struct {
    chunk_rec *chunks;
    size_t n_chunks, cap_chunks;
    map_t chunk_at;
    segment_rec *segments;
    size_t n_segments, cap_segments;
    map_t segment_at;
} heap_t;

static int set_chunk(heap_t *h, int64_t address, int64_t size, int64_t requested, int32_t tag, int32_t stack) {
    chunk_rec rec = {address, size, requested, tag, stack};
    int64_t *at = map_get(&h->chunk_at, address);
    if (at) {
        h->chunks[*at] = rec;
        return 0;
    }
    if (h->n_chunks == h->cap_chunks) {
        size_t capacity = h->cap_chunks ? h->cap_chunks * 2 : 1024;
        chunk_rec *grown = realloc(h->chunks, capacity * sizeof(chunk_rec));
        if (grown == NULL) return -1;
        h->chunks = grown;
        h->cap_chunks = capacity;
    }
    h->chunks[h->n_chunks] = rec;
    if (map_put(&h->chunk_at, address, (int64_t)h->n_chunks) < 0) return -1;
    h->n_chunks++;
    return 0;
}

/* -1 with KeyError(key) set: the heap has no chunk or segment at ``key`` */
static int missing(int64_t key) {
    PyObject *value = PyLong_FromLongLong(key);
    if (value) PyErr_SetObject(PyExc_KeyError, value);
    Py_XDECREF(value);
    return -1;
}

/* 0, or -1 with KeyError set when there is no chunk at address */
static int del_chunk(heap_t *h, int64_t address) {
    int64_t *at = map_get(&h->chunk_at, address);
    if (at == NULL) {
        return missing(address);
    }
    int64_t hole = *at;
    map_remove(&h->chunk_at, address);
    h->n_chunks--;
    if ((size_t)hole != h->n_chunks) {
        h->chunks[hole] = h->chunks[h->n_chunks];
        *map_get(&h->chunk_at, h->chunks[hole].address) = hole;
    }
    return 0;
}

static int size_of_chunk(heap_t *h, int64_t address, int64_t *size) {
    int64_t *at = map_get(&h->chunk_at, address);
    if (at == NULL) {
        return missing(address);
    }
    *size = h->chunks[*at].size;
    return 0;
}

static int set_segment(heap_t *h, int64_t base, int64_t size) {
    int64_t *at = map_get(&h->segment_at, base);
    if (at) {
        h->segments[*at].size = size;
        return 0;
    }
    if (h->n_segments == h->cap_segments) {
        size_t capacity = h->cap_segments ? h->cap_segments * 2 : 64;
        segment_rec *grown = realloc(h->segments, capacity * sizeof(segment_rec));
        if (grown == NULL) return -1;
        h->segments = grown;
        h->cap_segments = capacity;
    }
    h->segments[h->n_segments] = (segment_rec){base, size};
    if (map_put(&h->segment_at, base, (int64_t)h->n_segments) < 0) return -1;
    h->n_segments++;
    return 0;
}

static int del_segment(heap_t *h, int64_t base) {
    int64_t *at = map_get(&h->segment_at, base);
    if (at == NULL) {
        return missing(base);
    }
    int64_t hole = *at;
    map_remove(&h->segment_at, base);
    h->n_segments--;
    if ((size_t)hole != h->n_segments) {
        h->segments[hole] = h->segments[h->n_segments];
        *map_get(&h->segment_at, h->segments[hole].base) = hole;
    }
    return 0;
}

/* segment_map: [a, a+n) joins the segments ending at a and starting at a+n (a scan of the
 * segments, as replay._map) */
static int map_range(heap_t *h, int64_t a, int64_t n) {
    int64_t upper = 0, *at = map_get(&h->segment_at, a + n);
    if (at) {
        upper = h->segments[*at].size;
        del_segment(h, a + n);
    }
    for (size_t j = 0; j < h->n_segments; j++)
        if (h->segments[j].base + h->segments[j].size == a) {
            h->segments[j].size += n + upper;
            return 0;
        }
    return set_segment(h, a, n + upper) < 0 ? -2 : 0;
}

/* segment_unmap: [a, a+n) leaves its segment (as replay._unmap); -1 with KeyError when no
 * segment holds a, -2 when out of memory */
static int unmap_range(heap_t *h, int64_t a, int64_t n) {
    for (size_t j = 0; j < h->n_segments; j++) {
        int64_t base = h->segments[j].base, end = base + h->segments[j].size;
        if (base <= a && a < end) {
            if (a > base) h->segments[j].size = a - base;
            else if (del_segment(h, base) < 0) return -1;
            if (a + n < end && set_segment(h, a + n, end - a - n) < 0) return -2;
            return 0;
        }
    }
    return missing(a);
}

static void heap_free(heap_t *h) {
    free(h->chunks);
    free(h->segments);
    map_free(&h->chunk_at);
    map_free(&h->segment_at);
}

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

static int snapshot(heap_t *h, buffer_t *chunks, buffer_t *chunk_offsets, buffer_t *segments,
                    buffer_t *segment_offsets) {
    if (buffer_add(chunks, h->chunks, h->n_chunks * sizeof(chunk_rec)) < 0 ||
        buffer_add(segments, h->segments, h->n_segments * sizeof(segment_rec)) < 0)
        return -1;
    int64_t c = (int64_t)(chunks->size / sizeof(chunk_rec)), s = (int64_t)(segments->size / sizeof(segment_rec));
    if (buffer_add(chunk_offsets, &c, sizeof c) < 0 || buffer_add(segment_offsets, &s, sizeof s) < 0) return -1;
    return 0;
}

/* Apply one heap event to ``h`` with replay's rules: 0, or -1 with an exception set (an event
 * that contradicts the heap), or -2 when out of memory (no exception set yet). */
static int apply_event(heap_t *h, int kind, int64_t a, int64_t s, int64_t requested, int32_t tag, int32_t stack) {
    int64_t old;
    int failed = 0;
    switch (kind) {
    case ALLOC:
        return set_chunk(h, a, s, requested, tag, stack) < 0 ? -2 : 0;
    case FREE:
        return set_chunk(h, a, s, 0, -1, -1) < 0 ? -2 : 0;
    case SPLIT:
        if (size_of_chunk(h, a, &old) < 0) return -1;
        return (set_chunk(h, a, s, 0, -1, -1) < 0 || set_chunk(h, a + s, old - s, 0, -1, -1) < 0) ? -2 : 0;
    case MERGE:
        if (size_of_chunk(h, a, &old) < 0 || del_chunk(h, a + old) < 0) return -1;
        return set_chunk(h, a, s, 0, -1, -1) < 0 ? -2 : 0;
    case SEGMENT_ALLOC:
        return (set_segment(h, a, s) < 0 || set_chunk(h, a, s, 0, -1, -1) < 0) ? -2 : 0;
    case SEGMENT_MAP:
        failed = map_range(h, a, s);
        if (!failed) failed = set_chunk(h, a, s, 0, -1, -1) < 0 ? -2 : 0;
        return failed;
    case SEGMENT_UNMAP:
        failed = unmap_range(h, a, s);
        if (failed) return failed;
        return del_chunk(h, a) < 0 ? -1 : 0;
    default: /* segment_free */
        return (del_segment(h, a) < 0 || del_chunk(h, a) < 0) ? -1 : 0;
    }
}

static PyObject *checkpoints(PyObject *module, PyObject *args) {
    Py_buffer kinds, addresses, sizes, requested, tags, stacks, picked = {0};
    Py_ssize_t every;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*n|y*", &kinds, &addresses, &sizes, &requested, &tags, &stacks, &every,
                          &picked))
        return NULL;
    PyObject *result = NULL;
    heap_t h = {0};
    buffer_t chunks = {0}, chunk_offsets = {0}, segments = {0}, segment_offsets = {0};
    Py_ssize_t rows = kinds.len, n = picked.buf ? picked.len / 8 : rows;
    if (every < 1 || addresses.len != rows * 8 || sizes.len != rows * 8 || requested.len != rows * 8 ||
        tags.len != rows * 4 || stacks.len != rows * 4 || (picked.buf && picked.len % 8)) {
        PyErr_SetString(PyExc_ValueError, "columns of unequal length or wrong item size, or every < 1");
        goto done;
    }
    const int64_t *position = picked.buf; /* the events to apply, in order; NULL: every row */
    for (Py_ssize_t i = 0; position && i < n; i++)
        if (position[i] < 0 || position[i] >= rows) {
            PyErr_SetString(PyExc_IndexError, "an event position is outside the columns");
            goto done;
        }
    const uint8_t *kind_of = kinds.buf;
    const int64_t *address_of = addresses.buf, *size_of = sizes.buf, *req_of = requested.buf;
    const int32_t *tag_of = tags.buf, *stack_of = stacks.buf;
    if (map_init(&h.chunk_at, 1024) < 0 || map_init(&h.segment_at, 64) < 0) goto nomem;
    int64_t zeros[2] = {0, 0}; /* snapshot 0, the empty heap: records [0, 0) */
    if (buffer_add(&chunk_offsets, zeros, sizeof zeros) < 0 || buffer_add(&segment_offsets, zeros, sizeof zeros) < 0)
        goto nomem;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t e = position ? position[i] : i;
        int failed = apply_event(&h, kind_of[e], address_of[e], size_of[e], req_of[e], tag_of[e], stack_of[e]);
        if (failed == -1) goto done;
        if (failed) goto nomem;
        if ((i + 1) % every == 0 && snapshot(&h, &chunks, &chunk_offsets, &segments, &segment_offsets) < 0) goto nomem;
    }
    result = Py_BuildValue("(y#y#y#y#)", chunks.data ? chunks.data : "", (Py_ssize_t)chunks.size, chunk_offsets.data,
                           (Py_ssize_t)chunk_offsets.size, segments.data ? segments.data : "",
                           (Py_ssize_t)segments.size, segment_offsets.data, (Py_ssize_t)segment_offsets.size);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    heap_free(&h);
    free(chunks.data);
    free(chunk_offsets.data);
    free(segments.data);
    free(segment_offsets.data);
    release_columns(&kinds, &addresses, &sizes, &requested, &tags, &stacks);
    if (picked.buf) PyBuffer_Release(&picked);
    return result;
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
    const int64_t *position = picked.buf;
    const uint8_t *kind_of = kinds.buf;
    const int64_t *address_of = addresses.buf, *size_of = sizes.buf, *req_of = requested.buf;
    const int32_t *tag_of = tags.buf, *stack_of = stacks.buf;
    const chunk_rec *c = chunk_recs.buf;
    const segment_rec *g = segment_recs.buf;
    size_t n_chunks = chunk_recs.len / sizeof(chunk_rec), n_segments = segment_recs.len / sizeof(segment_rec);
    if (map_init(&h.chunk_at, 1024) < 0 || map_init(&h.segment_at, 64) < 0) goto nomem;
    for (size_t j = 0; j < n_segments; j++)
        if (set_segment(&h, g[j].base, g[j].size) < 0) goto nomem;
    for (size_t j = 0; j < n_chunks; j++)
        if (set_chunk(&h, c[j].address, c[j].size, c[j].requested, c[j].tag, c[j].stack) < 0) goto nomem;
    for (Py_ssize_t i = start; i < stop; i++) {
        Py_ssize_t e = position ? position[i] : i;
        if (e < 0 || e >= rows) {
            PyErr_SetString(PyExc_IndexError, "an event position is outside the columns");
            goto done;
        }
        int failed = apply_event(&h, kind_of[e], address_of[e], size_of[e], req_of[e], tag_of[e], stack_of[e]);
        if (failed == -1) goto done;
        if (failed) goto nomem;
    }
    result = Py_BuildValue("(y#y#)", h.chunks ? (const char *)h.chunks : "", (Py_ssize_t)(h.n_chunks * sizeof(chunk_rec)),
                           h.segments ? (const char *)h.segments : "", (Py_ssize_t)(h.n_segments * sizeof(segment_rec)));
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

/* timeline(kinds, sizes, requested, largest_free, in_use, in_req, pool, largest, fragmentation):
 * gpuviz.analysis.timeline's series in one pass, written into the last five (writable,
 * contiguous int64 / float64) buffers. */
static PyObject *timeline(PyObject *module, PyObject *args) {
    Py_buffer kinds, sizes, requested, largest_free, in_use, in_req, pool, largest, fragmentation;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*w*w*", &kinds, &sizes, &requested, &largest_free, &in_use, &in_req,
                          &pool, &largest, &fragmentation))
        return NULL;
    Py_ssize_t n = kinds.len;
    Py_buffer *columns[] = {&sizes, &requested, &largest_free, &in_use, &in_req, &pool, &largest, &fragmentation};
    int ok = 1;
    for (int i = 0; i < 8; i++) ok &= columns[i]->len == n * 8;
    if (ok) {
        const uint8_t *kind = kinds.buf;
        const int64_t *size = sizes.buf, *req = requested.buf, *lf = largest_free.buf;
        int64_t *use = in_use.buf, *rq = in_req.buf, *pl = pool.buf, *lg = largest.buf;
        double *frag = fragmentation.buf;
        int64_t u = 0, r = 0, p = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            switch (kind[i]) {
            case ALLOC: u += size[i]; r += req[i]; break;
            case FREE: u -= size[i]; r -= req[i]; break;
            case SEGMENT_ALLOC: p += size[i]; break;
            case SEGMENT_FREE: p -= size[i]; break;
            case SEGMENT_MAP: p += size[i]; break;
            case SEGMENT_UNMAP: p -= size[i]; break;
            default: break;
            }
            int64_t l = lf[i] > 0 ? lf[i] : 0, free_bytes = p - u;
            use[i] = u;
            rq[i] = r;
            pl[i] = p;
            lg[i] = l;
            frag[i] = free_bytes > 0 ? ((double)free_bytes - (double)l) / (double)free_bytes : 0.0;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&kinds);
    for (int i = 0; i < 8; i++) PyBuffer_Release(columns[i]);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "timeline columns of unequal length or wrong item size");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* free_of(kinds, addresses) -> bytes: for one device's alloc and free events in log order
 * (uint8 / int64 buffers), int64 per event: for an alloc, the event number of the free that
 * ends it (the next event at its address, when that is a free), else -1; -1 for a free.
 * gpuviz.analysis.tables.allocation_table's pairing, in one pass with a hash map. */
static PyObject *free_of(PyObject *module, PyObject *args) {
    Py_buffer kinds, addresses;
    if (!PyArg_ParseTuple(args, "y*y*", &kinds, &addresses)) return NULL;
    PyObject *result = NULL;
    map_t open = {0};
    Py_ssize_t n = kinds.len;
    if (addresses.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "columns of unequal length or wrong item size");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, n * 8);
    if (result == NULL) goto done;
    int64_t *out = (int64_t *)PyBytes_AS_STRING(result);
    const uint8_t *kind = kinds.buf;
    const int64_t *address = addresses.buf;
    if (map_init(&open, 1024) < 0) goto nomem;
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = -1;
        if (kind[i] == ALLOC) {
            if (map_put(&open, address[i], i) < 0) goto nomem;
        } else {
            int64_t *made = map_get(&open, address[i]);
            if (made != NULL) {
                out[*made] = i;
                map_remove(&open, address[i]);
            }
        }
    }
    goto done;
nomem:
    Py_CLEAR(result);
    PyErr_NoMemory();
done:
    map_free(&open);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&addresses);
    return result;
}

/* resample(time_ns, keep, t0, width, points, in_use, in_req, pool, largest, fragmentation,
 *          out_time, 5 x out_min, 5 x out_max) -> buckets, or -1 when times go back so far that
 *          more than ``points`` entries would be needed:
 * gpuviz.analysis.timeline.resample of the events whose ``keep`` byte is set, in one pass and
 * without gathering them first. Event i goes to bucket min((time_ns[i] - t0) / width, points - 1);
 * a new output entry starts wherever the bucket changes; it holds the bucket's start time
 * (t0 + bucket * width, truncated) and each metric's min and max over its events. The four
 * integer metrics are int64, fragmentation float64; outputs have room for ``points`` entries. */
static PyObject *resample(PyObject *module, PyObject *args) {
    Py_buffer time_ns, keep, in[5], out_time, lo[5], hi[5];
    long long t0;
    double width;
    Py_ssize_t points;
    if (!PyArg_ParseTuple(args, "y*y*Ldny*y*y*y*y*w*w*w*w*w*w*w*w*w*w*w*", &time_ns, &keep, &t0, &width, &points,
                          &in[0], &in[1], &in[2], &in[3], &in[4], &out_time, &lo[0], &lo[1], &lo[2], &lo[3], &lo[4],
                          &hi[0], &hi[1], &hi[2], &hi[3], &hi[4]))
        return NULL;
    Py_ssize_t n = keep.len, count = 0;
    int ok = time_ns.len == n * 8 && points > 0 && out_time.len >= points * 8;
    for (int m = 0; m < 5; m++) ok &= in[m].len == n * 8 && lo[m].len >= points * 8 && hi[m].len >= points * 8;
    if (ok) {
        const int64_t *t = time_ns.buf;
        const uint8_t *k = keep.buf;
        int64_t *ot = out_time.buf;
        const int64_t *iv[4] = {in[0].buf, in[1].buf, in[2].buf, in[3].buf};
        int64_t *il[4] = {lo[0].buf, lo[1].buf, lo[2].buf, lo[3].buf}, *ih[4] = {hi[0].buf, hi[1].buf, hi[2].buf, hi[3].buf};
        const double *fv = in[4].buf;
        double *fl = lo[4].buf, *fh = hi[4].buf;
        int64_t current = -1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!k[i]) continue;
            int64_t bucket = (int64_t)((double)(t[i] - (int64_t)t0) / width);
            if (bucket > points - 1) bucket = points - 1;
            if (bucket != current || count == 0) {
                if (count == points) { /* only where times go back: the caller resamples otherwise */
                    count = -1;
                    break;
                }
                current = bucket;
                ot[count] = (int64_t)((double)t0 + (double)bucket * width);
                for (int m = 0; m < 4; m++) il[m][count] = ih[m][count] = iv[m][i];
                fl[count] = fh[count] = fv[i];
                count++;
                continue;
            }
            Py_ssize_t c = count - 1;
            for (int m = 0; m < 4; m++) {
                if (iv[m][i] < il[m][c]) il[m][c] = iv[m][i];
                if (iv[m][i] > ih[m][c]) ih[m][c] = iv[m][i];
            }
            if (fv[i] < fl[c]) fl[c] = fv[i];
            if (fv[i] > fh[c]) fh[c] = fv[i];
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&time_ns);
    PyBuffer_Release(&keep);
    PyBuffer_Release(&out_time);
    for (int m = 0; m < 5; m++) {
        PyBuffer_Release(&in[m]);
        PyBuffer_Release(&lo[m]);
        PyBuffer_Release(&hi[m]);
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "resample: columns of unequal length or wrong item size, or no points");
        return NULL;
    }
    return PyLong_FromSsize_t(count);
}

static int compare_pairs(const void *a, const void *b) {
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* by_address(addresses) -> (order, distinct): for an int64 buffer, the row numbers sorted by
 * address, rows of one address in their original order (a stable sort), and the distinct
 * addresses ascending (int64 bytes each). A counting sort over a hash map of the distinct
 * addresses: O(rows + distinct log distinct), where a comparison sort of millions of rows costs
 * O(rows log rows). */
static PyObject *by_address(PyObject *module, PyObject *args) {
    Py_buffer addresses;
    if (!PyArg_ParseTuple(args, "y*", &addresses)) return NULL;
    PyObject *order = NULL, *distinct = NULL, *result = NULL;
    map_t slots = {0};
    int64_t *slot_of_row = NULL, *pairs = NULL, *start = NULL;
    Py_ssize_t n = addresses.len / 8;
    const int64_t *address = addresses.buf;
    if (addresses.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "by_address: addresses must be int64");
        goto done;
    }
    slot_of_row = malloc((n ? n : 1) * sizeof(int64_t));
    if (slot_of_row == NULL || map_init(&slots, 1024) < 0) goto nomem;
    for (Py_ssize_t i = 0; i < n; i++) { /* each row's slot: its address's first-seen number */
        if (address[i] == EMPTY) {
            PyErr_SetString(PyExc_ValueError, "by_address: an address of -2**63");
            goto done;
        }
        int64_t *slot = map_get(&slots, address[i]);
        if (slot == NULL) {
            if (map_put(&slots, address[i], (int64_t)slots.count) < 0) goto nomem;
            slot_of_row[i] = (int64_t)slots.count - 1;
        } else {
            slot_of_row[i] = *slot;
        }
    }
    size_t k = slots.count;
    pairs = malloc((k ? k : 1) * 2 * sizeof(int64_t)); /* (address, slot) */
    start = calloc(k + 1, sizeof(int64_t));
    if (pairs == NULL || start == NULL) goto nomem;
    for (size_t j = 0; j < slots.capacity; j++)
        if (slots.keys[j] != EMPTY) {
            pairs[2 * slots.values[j]] = slots.keys[j];
            pairs[2 * slots.values[j] + 1] = slots.values[j];
        }
    for (Py_ssize_t i = 0; i < n; i++) start[slot_of_row[i] + 1]++; /* rows per slot */
    qsort(pairs, k, 2 * sizeof(int64_t), compare_pairs);
    distinct = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)k * 8);
    order = PyBytes_FromStringAndSize(NULL, n * 8);
    if (distinct == NULL || order == NULL) goto done;
    int64_t *sorted = (int64_t *)PyBytes_AS_STRING(distinct), *out = (int64_t *)PyBytes_AS_STRING(order);
    int64_t *first = malloc((k ? k : 1) * sizeof(int64_t)); /* per slot: where its rows go */
    if (first == NULL) goto nomem;
    int64_t at = 0;
    for (size_t r = 0; r < k; r++) {
        int64_t slot = pairs[2 * r + 1];
        sorted[r] = pairs[2 * r];
        first[slot] = at;
        at += start[slot + 1];
    }
    for (Py_ssize_t i = 0; i < n; i++) out[first[slot_of_row[i]]++] = i;
    free(first);
    result = PyTuple_Pack(2, order, distinct);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    Py_XDECREF(order);
    Py_XDECREF(distinct);
    map_free(&slots);
    free(slot_of_row);
    free(pairs);
    free(start);
    PyBuffer_Release(&addresses);
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
    {"timeline", timeline, METH_VARARGS,
     "timeline(kinds, sizes, requested, largest_free, in_use, in_req, pool, largest, fragmentation)"},
    {"free_of", free_of, METH_VARARGS, "free_of(kinds, addresses) -> int64 bytes: the free ending each alloc, or -1"},
    {"alloc_pairs", alloc_pairs, METH_VARARGS,
     "alloc_pairs(kinds, devices, addresses, device) -> (rows, free_index): allocations and their frees"},
    {"by_address", by_address, METH_VARARGS, "by_address(addresses) -> (order, distinct): a stable sort by address"},
    {"resample", resample, METH_VARARGS,
     "resample(time_ns, keep, t0, width, points, 5 metrics, out_time, 5 x out_min, 5 x out_max) -> buckets"},
    {"state", state, METH_VARARGS,
     "state(kinds, addresses, sizes, requested, tags, stacks, chunks, segments, start, stop[, positions]) -> "
     "(chunks, segments)"},
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
