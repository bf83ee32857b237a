/* gpuviz.analysis._livekernel: LiveFollower.update's pass over the new rows, in C (optional).
 *
 * scan(pieces, start, layout, roles, totals, points) reads packed rows (schema.ROW_DTYPE records, as
 * EventLog.row_pieces_since gives them: the flushed blocks themselves, not joined) in one pass,
 * with no per-field gathers:
 *   pieces   a sequence of buffers, each whole records; together the rows from ``start`` on
 *   start    the log position of the first row
 *   layout   (itemsize, then the byte offsets of time_ns, kind, device, address, size,
 *            requested, tag): int64, uint8, int16, int64, int64, int64, int32, little-endian
 *   roles    256 bytes, the role of each kind code: NONE (not an allocator event), OTHER (an
 *            allocator event that moves no bytes: split, merge, oom), ALLOC, FREE, SEGMENT_ALLOC,
 *            SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP (values below)
 *   totals   a writable int64 buffer of n_devices x 4 (bytes in use, bytes requested, pool
 *            bytes, allocator events seen): each device's running totals before these rows,
 *            updated in place; n_devices = len(totals) / 32 bytes
 *   points   a writable buffer of at least 40 bytes a row (the caller's, reused from call to
 *            call, so that no fresh memory is touched): int64 records of 5, one per allocator
 *            event: log position, time_ns, bytes in use, bytes requested, pool bytes after it;
 *            by device, in row order within
 * returns (rows, first_time_ns, last_time_ns, offsets, chunk_offsets, chunks, segments):
 *   rows           the number of rows read; first/last_time_ns their first and last time_ns
 *   offsets        bytes, int64 x (n_devices + 1): device d's points are [offsets[d], offsets[d + 1])
 *   chunk_offsets  bytes, int64 x (n_devices + 1), into chunks as offsets is into points
 *   chunks         bytes, int64 records of 6: device, role, address, size, requested, tag: the
 *                  last alloc or free at each (device, address), by device, in order of first
 *                  occurrence
 *   segments       bytes, int64 records of 4: device, role, address, size: every segment event,
 *                  in row order
 * A row whose device is not in [0, n_devices) raises ValueError, leaving totals unchanged.
 *
 * apply_chunks(chunks, lo, hi, heap) applies records [lo, hi) of chunks to the dict heap:
 * an alloc sets heap[address] = (size, requested, tag), a free does heap.pop(address, None).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { NONE = 0, OTHER = 1, ALLOC = 2, FREE = 3, SEGMENT_ALLOC = 4, SEGMENT_FREE = 5, SEGMENT_MAP = 6, SEGMENT_UNMAP = 7 };
enum { TIME, KIND, DEVICE, ADDRESS, SIZE, REQUESTED, TAG, FIELDS };

static int64_t read64(const char *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

static int64_t add64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); } /* wraps as NumPy */

typedef struct {
    int64_t device, address;
    const char *row; /* the last chunk event at this (device, address) */
} entry_t;

/* (device, address) -> index into a growing array of entries */
typedef struct {
    int32_t *slots;
    entry_t *entries;
    size_t capacity, count, room;
} last_t;

static size_t slot_of(int64_t device, int64_t address, size_t mask) {
    uint64_t key = (uint64_t)address ^ ((uint64_t)device * 0xC2B2AE3D27D4EB4Full);
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}

static int last_grow(last_t *m) {
    size_t capacity = m->capacity ? 2 * m->capacity : 1024;
    int32_t *slots = malloc(capacity * sizeof(int32_t));
    entry_t *entries = realloc(m->entries, capacity / 2 * sizeof(entry_t));
    if (slots == NULL || entries == NULL) {
        free(slots);
        if (entries != NULL) m->entries = entries;
        return -1;
    }
    memset(slots, 0xff, capacity * sizeof(int32_t));
    for (size_t e = 0; e < m->count; e++) {
        size_t slot = slot_of(entries[e].device, entries[e].address, capacity - 1);
        while (slots[slot] >= 0) slot = (slot + 1) & (capacity - 1);
        slots[slot] = (int32_t)e;
    }
    free(m->slots);
    m->slots = slots, m->entries = entries, m->capacity = capacity, m->room = capacity / 2;
    return 0;
}

/* remember ``row`` as the last chunk event at (device, address); -1 when out of memory */
static int last_put(last_t *m, int64_t device, int64_t address, const char *row) {
    if (m->count + 1 > m->room && last_grow(m) < 0) return -1;
    size_t mask = m->capacity - 1, slot = slot_of(device, address, mask);
    for (; m->slots[slot] >= 0; slot = (slot + 1) & mask) {
        entry_t *e = &m->entries[m->slots[slot]];
        if (e->device == device && e->address == address) {
            e->row = row;
            return 0;
        }
    }
    m->slots[slot] = (int32_t)m->count;
    m->entries[m->count++] = (entry_t){device, address, row};
    return 0;
}

static PyObject *bytes_of(Py_ssize_t n_int64, int64_t **data) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, n_int64 * 8);
    if (out != NULL) *data = (int64_t *)PyBytes_AS_STRING(out);
    return out;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *pieces_arg;
    Py_buffer roles, totals, out, *pieces = NULL;
    Py_ssize_t start, layout[FIELDS + 1], n_pieces = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "On(nnnnnnnn)y*w*w*", &pieces_arg, &start, &layout[0], &layout[1], &layout[2],
                          &layout[3], &layout[4], &layout[5], &layout[6], &layout[7], &roles, &totals, &out))
        return NULL;
    PyObject *result = NULL, *sequence = NULL, *offsets_b = NULL, *chunk_offsets_b = NULL, *chunks_b = NULL,
             *segments_b = NULL;
    int64_t *counts = NULL, *chunk_counts = NULL, *before = NULL, *segments = NULL, *grouped = NULL;
    int16_t *devices = NULL;
    last_t last = {NULL, NULL, 0, 0, 0};
    const Py_ssize_t itemsize = layout[0];
    const Py_ssize_t *at = layout + 1;
    const unsigned char *role_of = roles.buf;
    if (itemsize <= 0 || roles.len != 256 || totals.len % 32 != 0) {
        PyErr_SetString(PyExc_ValueError, "scan: roles must be 256 bytes and totals n x 4 int64");
        goto done;
    }
    for (int f = 0; f < FIELDS; f++) {
        if (at[f] < 0 || at[f] + (f == KIND ? 1 : f == DEVICE ? 2 : f == TAG ? 4 : 8) > itemsize) {
            PyErr_SetString(PyExc_ValueError, "scan: a field offset lies outside the record");
            goto done;
        }
    }
    if ((sequence = PySequence_Fast(pieces_arg, "scan: pieces must be a sequence of buffers")) == NULL) goto done;
    Py_ssize_t n_rows = 0;
    if ((pieces = PyMem_Calloc((size_t)PySequence_Fast_GET_SIZE(sequence) + 1, sizeof(Py_buffer))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t p = 0; p < PySequence_Fast_GET_SIZE(sequence); p++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(sequence, p), &pieces[n_pieces], PyBUF_SIMPLE) < 0) goto done;
        n_pieces++;
        if (pieces[n_pieces - 1].len % itemsize != 0) {
            PyErr_SetString(PyExc_ValueError, "scan: a piece is not a whole number of rows");
            goto done;
        }
        n_rows += pieces[n_pieces - 1].len / itemsize;
    }
    const Py_ssize_t n_devices = totals.len / 32;
    int64_t *total = totals.buf;
    counts = calloc((size_t)n_devices + 1, sizeof(int64_t));
    chunk_counts = calloc((size_t)n_devices + 1, sizeof(int64_t));
    before = malloc(((size_t)n_devices + 1) * 4 * sizeof(int64_t));
    devices = malloc(((size_t)n_rows + 1) * sizeof(int16_t));
    if (counts == NULL || chunk_counts == NULL || before == NULL || devices == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(before, total, (size_t)n_devices * 32);
    if (out.len < n_rows * 40) { /* at most one point a row */
        PyErr_Format(PyExc_ValueError, "scan: points holds %zd bytes, %zd rows need %zd", out.len, n_rows, n_rows * 40);
        goto done;
    }
    int64_t *points = out.buf;
    Py_ssize_t n_points = 0, n_segments = 0, segment_room = 0, row_number = start;
    int64_t first_time = 0, last_time = 0;
    int mixed = 0, failure = 0; /* failure: 1 a device out of range (bad_device at row_number), 2 no memory */
    int16_t first_device = -1, bad_device = 0;
    const char *last_row = NULL;
    Py_BEGIN_ALLOW_THREADS /* the blocks never change and the rest is this call's own: the cell runs on */
    for (Py_ssize_t p = 0; p < n_pieces; p++) {
        const char *row = pieces[p].buf, *end = row + pieces[p].len;
        for (; row < end; row += itemsize, row_number++) {
            if (last_row == NULL) first_time = read64(row + at[TIME]);
            last_row = row;
            int role = role_of[(unsigned char)row[at[KIND]]];
            if (role == NONE) continue;
            int16_t device;
            memcpy(&device, row + at[DEVICE], 2);
            if (device < 0 || device >= n_devices) {
                failure = 1, bad_device = device;
                goto scanned;
            }
            int64_t *t = total + 4 * device;
            int64_t size = read64(row + at[SIZE]);
            if (role == ALLOC || role == FREE) {
                int64_t requested = read64(row + at[REQUESTED]);
                t[0] = add64(t[0], role == ALLOC ? size : -size);
                t[1] = add64(t[1], role == ALLOC ? requested : -requested);
                if (last_put(&last, device, read64(row + at[ADDRESS]), row) < 0) {
                    failure = 2;
                    goto scanned;
                }
            } else if (role >= SEGMENT_ALLOC) {
                t[2] = add64(t[2], role == SEGMENT_ALLOC || role == SEGMENT_MAP ? size : -size);
                if (n_segments == segment_room) {
                    segment_room = segment_room ? 2 * segment_room : 64;
                    int64_t *more = realloc(segments, (size_t)segment_room * 4 * sizeof(int64_t));
                    if (more == NULL) {
                        failure = 2;
                        goto scanned;
                    }
                    segments = more;
                }
                int64_t *seg = segments + 4 * n_segments++;
                seg[0] = device, seg[1] = role, seg[2] = read64(row + at[ADDRESS]), seg[3] = size;
            }
            t[3]++;
            counts[device]++;
            mixed |= n_points > 0 && device != first_device;
            first_device = n_points ? first_device : device;
            devices[n_points] = device;
            int64_t *point = points + 5 * n_points++;
            point[0] = row_number, point[1] = read64(row + at[TIME]), point[2] = t[0], point[3] = t[1], point[4] = t[2];
        }
    }
    if (last_row != NULL) last_time = read64(last_row + at[TIME]);
scanned:
    Py_END_ALLOW_THREADS
    if (failure) {
        memcpy(total, before, (size_t)n_devices * 32);
        if (failure == 1)
            PyErr_Format(PyExc_ValueError, "row %zd: allocator event of device %d, but the log has %zd devices",
                         row_number, (int)bad_device, n_devices);
        else
            PyErr_NoMemory();
        goto done;
    }
    int64_t *offsets, *chunk_offsets, *chunks, *out_segments;
    if ((offsets_b = bytes_of(n_devices + 1, &offsets)) == NULL ||
        (chunk_offsets_b = bytes_of(n_devices + 1, &chunk_offsets)) == NULL ||
        (chunks_b = bytes_of(6 * (Py_ssize_t)last.count, &chunks)) == NULL ||
        (segments_b = bytes_of(4 * n_segments, &out_segments)) == NULL)
        goto done;
    if (n_segments) memcpy(out_segments, segments, (size_t)n_segments * 32);
    offsets[0] = 0;
    for (Py_ssize_t d = 0; d < n_devices; d++) offsets[d + 1] = offsets[d] + counts[d];
    if (mixed) { /* several devices: the points grouped by device, in row order within (rare) */
        if ((grouped = malloc((size_t)n_points * 5 * sizeof(int64_t))) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t d = 0; d < n_devices; d++) counts[d] = offsets[d];
        for (Py_ssize_t k = 0; k < n_points; k++) memcpy(grouped + 5 * counts[devices[k]]++, points + 5 * k, 40);
        memcpy(points, grouped, (size_t)n_points * 40);
    }
    for (size_t e = 0; e < last.count; e++) chunk_counts[last.entries[e].device]++;
    chunk_offsets[0] = 0;
    for (Py_ssize_t d = 0; d < n_devices; d++) chunk_offsets[d + 1] = chunk_offsets[d] + chunk_counts[d];
    for (Py_ssize_t d = 0; d < n_devices; d++) chunk_counts[d] = chunk_offsets[d];
    for (size_t e = 0; e < last.count; e++) {
        const char *row = last.entries[e].row;
        int64_t *c = chunks + 6 * chunk_counts[last.entries[e].device]++;
        int32_t tag;
        memcpy(&tag, row + at[TAG], 4);
        c[0] = last.entries[e].device, c[1] = role_of[(unsigned char)row[at[KIND]]], c[2] = last.entries[e].address;
        c[3] = read64(row + at[SIZE]), c[4] = read64(row + at[REQUESTED]), c[5] = tag;
    }
    result = Py_BuildValue("(nLLOOOO)", n_rows, (long long)first_time, (long long)last_time, offsets_b,
                           chunk_offsets_b, chunks_b, segments_b);
done:
    Py_XDECREF(offsets_b);
    Py_XDECREF(chunk_offsets_b);
    Py_XDECREF(chunks_b);
    Py_XDECREF(segments_b);
    free(counts);
    free(chunk_counts);
    free(before);
    free(devices);
    free(segments);
    free(grouped);
    free(last.slots);
    free(last.entries);
    for (Py_ssize_t p = 0; p < n_pieces; p++) PyBuffer_Release(&pieces[p]);
    PyMem_Free(pieces);
    Py_XDECREF(sequence);
    PyBuffer_Release(&roles);
    PyBuffer_Release(&totals);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *apply_chunks(PyObject *self, PyObject *args) {
    Py_buffer chunks;
    Py_ssize_t lo, hi;
    PyObject *heap;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnO!", &chunks, &lo, &hi, &PyDict_Type, &heap)) return NULL;
    if (lo < 0 || hi < lo || hi * 48 > chunks.len) {
        PyBuffer_Release(&chunks);
        PyErr_SetString(PyExc_ValueError, "apply_chunks: records [lo, hi) outside chunks");
        return NULL;
    }
    const int64_t *c = (const int64_t *)chunks.buf + 6 * lo;
    int ok = 0;
    for (Py_ssize_t i = lo; i < hi; i++, c += 6) {
        PyObject *address = PyLong_FromLongLong(c[2]);
        if (address == NULL) goto done;
        if (c[1] == ALLOC) {
            PyObject *value = Py_BuildValue("(LLL)", (long long)c[3], (long long)c[4], (long long)c[5]);
            int failed = value == NULL || PyDict_SetItem(heap, address, value) < 0;
            Py_XDECREF(value);
            Py_DECREF(address);
            if (failed) goto done;
        } else {
            int failed = PyDict_DelItem(heap, address) < 0;
            Py_DECREF(address);
            if (failed && !PyErr_ExceptionMatches(PyExc_KeyError)) goto done;
            if (failed) PyErr_Clear(); /* a free of a chunk not in use: as heap.pop(address, None) */
        }
    }
    ok = 1;
done:
    PyBuffer_Release(&chunks);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "LiveFollower.update's pass over new packed rows (see the module source)."},
    {"apply_chunks", apply_chunks, METH_VARARGS, "Apply the last chunk events of scan to a dict of chunks in use."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_livekernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__livekernel(void) { return PyModule_Create(&module); }
