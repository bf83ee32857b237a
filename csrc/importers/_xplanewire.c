/* gpuviz.importers._xplanewire: the memory events of an XSpace decoded in C (optional).
 *
 * decode(data, planes, drop_behind) walks the lines of each plane and turns every MemoryAllocation /
 * MemoryDeallocation event into one row of columns, in plane, line and event order, exactly as
 * gpuviz/importers/xplane.py's Python decoder does (that decoder is the reference; the field
 * numbers are listed there). ``data`` is any buffer (bytes, mmap); ``planes`` is a list of
 * (memory, slots, ref_names, lines): memory = {event metadata id: is_alloc}, slots = {stat
 * metadata id: slot} with slots numbered as SLOT_NAMES, ref_names = {stat metadata id: UTF-8
 * name} (what a ref_value names), lines = [(start, end)] of the plane's XLine payloads.
 * ``drop_behind`` (a memory-mapped file, Linux): the pages read are handed back to the kernel as
 * the decoding passes them (madvise MADV_DONTNEED), so the file is never wholly resident.
 *
 * Returns (columns, keys): columns a tuple of bytes in COLUMN_NAMES order (int64 each but
 * flags uint8, fragmentation float64, texts int32); keys a list (texts indexes it) of the
 * distinct values of the text slots (the first N_TEXT of SLOT_NAMES), each a tuple of what the
 * Python decoder reads for each slot: Ellipsis where the event has no such stat, None for a stat
 * without a value, else its str (UTF-8, errors replaced; equal texts are one str), int or float
 * -- for the caller to turn into (allocator, op, dtype, shape, region type) as that decoder does
 * (``index_on_host``, a TPU core, is one of them: it names the allocator of events without one).
 *
 * Anything the Python decoder would treat in an unusual way -- a malformed or truncated message,
 * a field of an unexpected wire type, a number that does not fit an int64 column, a double that
 * is not finite -- raises ``Unsupported``; the caller then decodes with the Python decoder,
 * which gives the same columns or the same error.
 */
#include "_xplanewire.h"

#include <math.h>
#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

static const char *SLOT_NAMES[] = {"allocator_name", "tf_op", "data_type", "shape", "tensor_shape", "region_type",
                                   "index_on_host",
                                   "addr", "requested_bytes", "allocation_bytes", "bytes_allocated",
                                   "peak_bytes_in_use", "fragmentation", "group_id", NULL};
static const char *COLUMN_NAMES[] = {"time_ns", "address", "requested", "size", "bytes_in_use", "peak_bytes_in_use",
                                     "step", "thread", "flags", "fragmentation", "texts", NULL};

PyObject *Unsupported; /* exception type */

int unsupported(const char *why) {
    if (!PyErr_Occurred()) PyErr_SetString(Unsupported, why);
    return -1;
}

/* ---------------------------------------------------------------- decoding */
typedef struct {
    Buf columns[N_COLUMNS];
    Keys keys;
    const uint8_t *base; /* the data */
    Py_ssize_t dropped;  /* drop_behind: pages of data before this offset were handed back */
    int drop_behind;
} D;

#define DROP_STEP (4 << 20)

/* drop_behind: hand back the whole pages of data between the last drop and p (every DROP_STEP bytes) */
static void behind(D *d, const uint8_t *p, int force) {
#if defined(__linux__) && defined(MADV_DONTNEED)
    if (!d->drop_behind) return;
    Py_ssize_t at = p - d->base;
    if (at - d->dropped < (force ? 1 : DROP_STEP)) return;
    Py_ssize_t page = (Py_ssize_t)sysconf(_SC_PAGESIZE);
    Py_ssize_t end = at / page * page;
    if (end > d->dropped) madvise((void *)(d->base + d->dropped), (size_t)(end - d->dropped), MADV_DONTNEED);
    d->dropped = end > d->dropped ? end : d->dropped;
#else
    (void)d, (void)p, (void)force;
#endif
}

/* drop_behind: a new pass over data from p (pages before it are handed back as it goes on) */
static void restart(D *d, const uint8_t *p) {
#if defined(__linux__) && defined(MADV_DONTNEED)
    if (!d->drop_behind) return;
    Py_ssize_t page = (Py_ssize_t)sysconf(_SC_PAGESIZE);
    d->dropped = (p - d->base) / page * page;
#else
    (void)d, (void)p;
#endif
}

static int read_stat(const Plane *plane, const uint8_t *p, const uint8_t *end, Value *values) {
    Field f;
    int rc, has_name = 0;
    int64_t name = 0;
    Value v = {V_NONE, 0, 0, 0.0, NULL, 0};
    while ((rc = next_field(&p, end, &f)) > 0) {
        switch (f.number) {
        case 1:
            if (f.wire != VARINT) return unsupported("a stat's metadata id is not a varint");
            name = (int64_t)f.value;
            has_name = 1;
            break;
        case 2:
            if (f.wire == FIXED64) {
                v.type = V_DOUBLE;
                memcpy(&v.d, &f.value, 8);
            }
            break;
        case 3:
            if (f.wire != VARINT) return unsupported("a stat's uint64 value is not a varint");
            if (f.value >> 63) {
                v.type = V_UINT;
                v.u = f.value;
            } else {
                v.type = V_INT;
                v.i = (int64_t)f.value;
            }
            break;
        case 4:
            if (f.wire != VARINT) return unsupported("a stat's int64 value is not a varint");
            v.type = V_INT;
            v.i = (int64_t)f.value;
            break;
        case 5:
        case 6:
            if (f.wire == LEN) {
                v.type = V_TEXT;
                v.text = (const char *)f.at;
                v.len = (Py_ssize_t)f.value;
            }
            break;
        case 7: {
            if (f.wire != VARINT) return unsupported("a stat's ref value is not a varint");
            PyObject *key = PyLong_FromLongLong((int64_t)f.value);
            if (!key) return -1;
            PyObject *text = PyDict_GetItemWithError(plane->ref_names, key);
            Py_DECREF(key);
            if (!text && PyErr_Occurred()) return -1;
            v.type = V_TEXT;
            v.text = "";
            v.len = 0;
            if (text) {
                if (!PyBytes_Check(text)) return unsupported("a ref name is not bytes");
                v.text = PyBytes_AS_STRING(text);
                v.len = PyBytes_GET_SIZE(text);
            }
            break;
        }
        default:
            break;
        }
    }
    if (rc < 0) return -1;
    if (has_name) {
        int slot = find(plane->slots, plane->n_slots, name);
        if (slot >= 0 && slot < N_SLOTS) values[slot] = v;
    }
    return 0;
}

/* Python's int(value) of a number stat, or ``fallback`` when it is not a number */
static int number(const Value *v, int64_t fallback, int64_t *out) {
    switch (v->type) {
    case V_INT:
        *out = v->i;
        return 0;
    case V_UINT:
        return unsupported("a number beyond int64");
    case V_DOUBLE:
        if (!isfinite(v->d) || v->d < -9223372036854775808.0 || v->d >= 9223372036854775808.0)
            return unsupported("a double that is no int64");
        *out = (int64_t)v->d;
        return 0;
    default:
        *out = fallback;
        return 0;
    }
}

static int emit(D *d, int is_alloc, int64_t time_ns, int64_t thread, const Value *values) {
    int64_t ints[8];
    ints[C_TIME] = time_ns;
    if (number(&values[S_ADDR], 0, &ints[C_ADDR]) < 0 || number(&values[S_REQUESTED], 0, &ints[C_REQUESTED]) < 0 ||
        number(&values[S_SIZE], 0, &ints[C_SIZE]) < 0 || number(&values[S_IN_USE], -1, &ints[C_IN_USE]) < 0 ||
        number(&values[S_PEAK], -1, &ints[C_PEAK]) < 0)
        return -1;
    const Value *step = &values[S_STEP];
    if (step->type == V_UINT) return unsupported("a step beyond int64");
    ints[C_STEP] = step->type == V_INT ? step->i : 0;
    ints[C_THREAD] = thread;
    uint8_t flags = (uint8_t)((is_alloc ? 1 : 0) | (step->type == V_INT ? 2 : 0));
    const Value *frag = &values[S_FRAGMENTATION];
    double fragmentation = -1.0;
    if (frag->type == V_INT) fragmentation = (double)frag->i;
    else if (frag->type == V_DOUBLE) fragmentation = frag->d;
    else if (frag->type == V_UINT) return unsupported("a fragmentation beyond int64");
    if (put_text_key(&d->keys, values) < 0) return -1;
    Py_ssize_t index = key_index(&d->keys);
    if (index < 0) return -1;
    int32_t texts = (int32_t)index;
    for (int c = C_TIME; c <= C_THREAD; c++)
        if (buf_put(&d->columns[c], &ints[c], 8) < 0) return -1;
    if (buf_put(&d->columns[C_FLAGS], &flags, 1) < 0 || buf_put(&d->columns[C_FRAGMENTATION], &fragmentation, 8) < 0 ||
        buf_put(&d->columns[C_TEXTS], &texts, 4) < 0)
        return -1;
    return 0;
}

static int read_event(D *d, const Plane *plane, const uint8_t *start, const uint8_t *end, int64_t line_id,
                      int64_t timestamp_ns) {
    const uint8_t *p = start;
    Field f;
    int rc, is_alloc = -1;
    int64_t offset_ps = 0;
    while ((rc = next_field(&p, end, &f)) > 0) {
        if (f.number == 1) {
            if (f.wire != VARINT) return unsupported("an event's metadata id is not a varint");
            is_alloc = find(plane->memory, plane->n_memory, (int64_t)f.value);
            if (is_alloc < 0) return 0; /* not a memory event: the rest is not read */
        } else if (f.number == 2) {
            if (f.wire != VARINT) return unsupported("an event's offset is not a varint");
            offset_ps = (int64_t)f.value;
        }
    }
    if (rc < 0) return -1;
    if (is_alloc < 0) return 0;
    Value values[N_SLOTS];
    memset(values, 0, sizeof(values)); /* V_ABSENT */
    p = start;
    while ((rc = next_field(&p, end, &f)) > 0)
        if (f.number == 4 && f.wire == LEN && read_stat(plane, f.at, f.at + f.value, values) < 0) return -1;
    if (rc < 0) return -1;
    int64_t q = offset_ps / 1000; /* Python's floor division */
    if (offset_ps % 1000 != 0 && offset_ps < 0) q -= 1;
    int64_t time_ns;
    if (__builtin_add_overflow(timestamp_ns, q, &time_ns)) return unsupported("a time beyond int64");
    return emit(d, is_alloc, time_ns, line_id, values);
}

static int read_line(D *d, const Plane *plane, const uint8_t *start, const uint8_t *end) {
    const uint8_t *p = start;
    Field f;
    int rc;
    int64_t line_id = 0, timestamp_ns = 0;
    restart(d, start);
    while ((rc = next_field(&p, end, &f)) > 0) { /* the line's id and time first (a field may repeat) */
        if (f.number == 1 && f.wire == VARINT) line_id = (int64_t)f.value;
        else if (f.number == 3 && f.wire == VARINT) timestamp_ns = (int64_t)f.value;
        behind(d, p, 0);
    }
    if (rc < 0) return -1;
    p = start;
    restart(d, start);
    while ((rc = next_field(&p, end, &f)) > 0) {
        if (f.number == 4 && f.wire == LEN && read_event(d, plane, f.at, f.at + f.value, line_id, timestamp_ns) < 0)
            return -1;
        behind(d, p, 0);
    }
    behind(d, end, 1);
    return rc;
}

static int read_plane(D *d, PyObject *job, const uint8_t *data, Py_ssize_t size) {
    PyObject *memory, *slots, *ref_names, *lines;
    if (!PyTuple_Check(job) || !PyArg_ParseTuple(job, "OOOO", &memory, &slots, &ref_names, &lines)) return -1;
    if (!PyDict_Check(ref_names) || !PyList_Check(lines)) return unsupported("a plane is (dict, dict, dict, list)");
    Plane plane = {NULL, NULL, 0, 0, ref_names};
    int rc = -1;
    if (pairs_of(memory, &plane.memory, &plane.n_memory) < 0 || pairs_of(slots, &plane.slots, &plane.n_slots) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lines); i++) {
        Py_ssize_t a, b;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(lines, i), "nn", &a, &b)) goto done;
        if (a < 0 || b < a || b > size) {
            unsupported("a line outside the data");
            goto done;
        }
        if (read_line(d, &plane, data + a, data + b) < 0) goto done;
    }
    rc = 0;
done:
    PyMem_Free(plane.memory);
    PyMem_Free(plane.slots);
    return rc;
}

static void release(D *d) {
    for (int c = 0; c < N_COLUMNS; c++) Py_CLEAR(d->columns[c].bytes);
    Py_CLEAR(d->keys.arena.bytes);
    PyMem_Free(d->keys.offsets);
    PyMem_Free(d->keys.table);
    PyMem_Free(d->keys.scratch);
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    PyObject *data, *planes;
    int drop_behind = 0;
    if (!PyArg_ParseTuple(args, "OO!|p", &data, &PyList_Type, &planes, &drop_behind)) return NULL;
    if (drop_behind && strcmp(Py_TYPE(data)->tp_name, "mmap.mmap") != 0) {
        PyErr_SetString(PyExc_TypeError, "drop_behind needs a memory-mapped file (mmap.mmap)");
        return NULL;
    }
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    D d;
    memset(&d, 0, sizeof(d));
    d.base = view.buf;
    d.drop_behind = drop_behind;
    PyObject *result = NULL, *columns = NULL, *keys = NULL, *texts = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(planes); i++)
        if (read_plane(&d, PyList_GET_ITEM(planes, i), view.buf, view.len) < 0) goto done;
    columns = PyTuple_New(N_COLUMNS);
    keys = PyList_New(d.keys.count);
    if (!columns || !keys) goto done;
    for (int c = 0; c < N_COLUMNS; c++) {
        PyObject *column = buf_take(&d.columns[c]);
        if (!column) goto done;
        PyTuple_SET_ITEM(columns, c, column);
    }
    texts = PyDict_New();
    if (!texts) goto done;
    const char *arena = d.keys.arena.bytes ? PyBytes_AS_STRING(d.keys.arena.bytes) : NULL;
    for (Py_ssize_t i = 0; i < d.keys.count; i++) {
        PyObject *key = key_values(arena + d.keys.offsets[i], texts);
        if (!key) goto done;
        PyList_SET_ITEM(keys, i, key);
    }
    result = PyTuple_Pack(2, columns, keys);
done:
    Py_XDECREF(columns);
    Py_XDECREF(keys);
    Py_XDECREF(texts);
    release(&d);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(data, planes, drop_behind=False) -> (columns, keys): the memory events of an XSpace."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_xplanewire", NULL, -1, methods};

static PyObject *names_tuple(const char **names) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int i = 0; names[i]; i++) {
        PyObject *s = PyUnicode_FromString(names[i]);
        if (!s || PyList_Append(out, s) < 0) return NULL;
        Py_DECREF(s);
    }
    PyObject *tuple = PyList_AsTuple(out);
    Py_DECREF(out);
    return tuple;
}

PyMODINIT_FUNC PyInit__xplanewire(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Unsupported = PyErr_NewException("gpuviz.importers._xplanewire.Unsupported", PyExc_ValueError, NULL);
    if (!Unsupported) return NULL;
    Py_INCREF(Unsupported);
    if (PyModule_AddObject(m, "Unsupported", Unsupported) < 0) return NULL;
    if (PyModule_AddObject(m, "SLOT_NAMES", names_tuple(SLOT_NAMES)) < 0) return NULL;
    if (PyModule_AddObject(m, "COLUMN_NAMES", names_tuple(COLUMN_NAMES)) < 0) return NULL;
    return m;
}
