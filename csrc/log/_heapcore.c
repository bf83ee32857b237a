/* gpuviz.log._heapcore: HeapBuilder's heap in C (optional).
 *
 * Core(staged, limit, flush, device, conflict) keeps one device's segments and chunks exactly
 * as gpuviz.log.heapbuilder.PythonHeapBuilder does -- same decisions, same rows, same
 * HeapConflict messages, nothing changed when one is raised -- and appends each event as a
 * row laid out as gpuviz.log.schema.ROW_STRUCT ("<qBbhhqqqqqqqii", 78 bytes) to ``staged``,
 * the log's staging bytearray or Arena (_rowsink.h), calling ``flush()`` once the rows are due
 * (row_sink_due: where an Arena's window says; a bytearray once it holds ``limit`` bytes).
 * ``conflict`` is the HeapConflict class. Tests hold the two builders together.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifdef Py_GIL_DISABLED
#error "the heap core appends rows relying on the GIL; the Python HeapBuilder is used instead"
#endif
#include "_heapcore_heap.h" /* Core, its containers (_heapcore_tables.h), emit() and the row layout */

/* ------------------------------------------------------------ operations */
static int split(Core *c, int64_t time_ns, int64_t address, int64_t first, int64_t thread) {
    Chunk *ch = chunk_get(c, address);
    int64_t size = ch->size, segment = ch->segment;
    free_remove(c, size);
    if (set_free(c, address, first, segment) < 0 || set_free(c, address + first, size - first, segment) < 0)
        return -1;
    Segment *s = segment_at(c, segment);
    if (vec_insert(&s->starts, bisect_right(s->starts.v, s->starts.n, address + first), address + first) < 0)
        return -1;
    return emit(c, time_ns, SPLIT, thread, address, first, 0, segment, 0, -1, -1);
}

static int merge(Core *c, int64_t time_ns, int64_t address, int64_t thread) {
    Chunk *ch = chunk_get(c, address);
    int64_t size = ch->size, segment = ch->segment, upper = address + size;
    int64_t upper_size = chunk_get(c, upper)->size;
    if (chunk_drop(c, upper) < 0) return -1;
    Segment *s = segment_at(c, segment);
    vec_remove(&s->starts, bisect_right(s->starts.v, s->starts.n, upper) - 1);
    free_remove(c, size);
    free_remove(c, upper_size);
    if (set_free(c, address, size + upper_size, segment) < 0) return -1;
    return emit(c, time_ns, MERGE, thread, address, size + upper_size, 0, segment, 0, -1, -1);
}

/* Where a new range [address, address+size) goes among the sorted segments, or -1 with
 * HeapConflict set (``what`` names the operation) when it is empty or overlaps a segment. */
static Py_ssize_t place(Core *c, int64_t address, int64_t size, const char *what) {
    Py_ssize_t i = bisect_right(c->bases.v, c->bases.n, address);
    int64_t other = 0;
    if (size > 0 && i > 0 && c->segs[i - 1].base + c->segs[i - 1].size > address) other = c->segs[i - 1].base;
    else if (size > 0 && i < c->nsegs && address + size > c->segs[i].base) other = c->segs[i].base;
    else if (size > 0) return i;
    PyObject *ha = hex(address), *ho = size > 0 ? hex(other) : NULL, *msg = NULL;
    if (ha && size <= 0) msg = PyUnicode_FromFormat("%s at %U has size %lld", what, ha, (long long)size);
    else if (ha && ho)
        msg = PyUnicode_FromFormat("%s [%U, +%lld) overlaps the segment at %U", what, ha, (long long)size, ho);
    Py_XDECREF(ha);
    Py_XDECREF(ho);
    raise_conflict(c, msg);
    return -1;
}

/* a new segment [base, base+size) at index i of the sorted segments, with no chunks yet */
static Segment *segment_insert(Core *c, Py_ssize_t i, int64_t base, int64_t size) {
    if (c->nsegs == c->segcap) {
        Py_ssize_t cap = c->segcap ? c->segcap * 2 : 8;
        Segment *p = PyMem_Realloc(c->segs, cap * sizeof(Segment));
        if (!p) return PyErr_NoMemory(), NULL;
        c->segs = p;
        c->segcap = cap;
    }
    if (vec_insert(&c->bases, i, base) < 0) return NULL;
    memmove(c->segs + i + 1, c->segs + i, (c->nsegs - i) * sizeof(Segment));
    c->nsegs++;
    Segment *s = &c->segs[i];
    memset(s, 0, sizeof *s);
    s->base = base;
    s->size = size;
    return s;
}

/* drop the segment at index i (its chunks are the caller's business) */
static void segment_remove(Core *c, Py_ssize_t i) {
    PyMem_Free(c->segs[i].starts.v);
    memmove(c->segs + i, c->segs + i + 1, (c->nsegs - i - 1) * sizeof(Segment));
    c->nsegs--;
    vec_remove(&c->bases, i);
}

static PyObject *Core_segment_alloc(Core *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"time_ns", "base", "size", "thread", "stack", NULL};
    long long time_ns, base, size, thread = 0;
    int stack = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLL|$Li", names, &time_ns, &base, &size, &thread, &stack))
        return NULL;
    Py_ssize_t i = place(c, base, size, "segment");
    if (i < 0) return NULL;
    Segment *s = segment_insert(c, i, base, size);
    if (!s || vec_insert(&s->starts, 0, base) < 0 || set_free(c, base, size, base) < 0) return NULL;
    if (emit(c, time_ns, SEGMENT_ALLOC, thread, base, size, 0, base, 0, -1, stack) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_segment_free(Core *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"time_ns", "base", "thread", "stack", NULL};
    long long time_ns, base, thread = 0;
    int stack = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LL|$Li", names, &time_ns, &base, &thread, &stack)) return NULL;
    Segment *s = segment_at(c, base);
    if (!s) return conflict(c, "no segment at %U", base);
    Chunk *ch = chunk_get(c, base);
    int64_t size = s->size;
    if (ch->size != size || ch->requested) return conflict(c, "segment at %U is not wholly free", base);
    segment_remove(c, s - c->segs);
    if (chunk_drop(c, base) < 0) return NULL;
    free_remove(c, size);
    if (emit(c, time_ns, SEGMENT_FREE, thread, base, size, 0, base, 0, -1, stack) < 0) return NULL;
    Py_RETURN_NONE;
}

/* the chunks of starts[from:] now belong to the segment at base */
static void rebase_chunks(Core *c, const Vec *starts, Py_ssize_t from, int64_t base) {
    for (Py_ssize_t j = from; j < starts->n; j++) chunk_get(c, starts->v[j])->segment = base;
}

static int vec_reserve(Vec *a, Py_ssize_t n) {
    if (n <= a->cap) return 0;
    Py_ssize_t cap = a->cap ? a->cap : 8;
    while (cap < n) cap *= 2;
    int64_t *v = PyMem_Realloc(a->v, cap * sizeof(int64_t));
    if (!v) return PyErr_NoMemory(), -1;
    a->v = v;
    a->cap = cap;
    return 0;
}

static PyObject *Core_segment_map(Core *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"time_ns", "address", "size", "thread", "stack", NULL};
    long long time_ns, address, size, thread = 0;
    int stack = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLL|$Li", names, &time_ns, &address, &size, &thread, &stack))
        return NULL;
    Py_ssize_t i = place(c, address, size, "mapping");
    if (i < 0) return NULL;
    int joins_above = i < c->nsegs && c->segs[i].base == address + size;
    Segment *s;
    if (i > 0 && c->segs[i - 1].base + c->segs[i - 1].size == address) {
        s = &c->segs[i - 1];
        s->size += size;
        if (vec_insert(&s->starts, s->starts.n, address) < 0) return NULL;
    } else {
        s = segment_insert(c, i, address, size);
        if (!s || vec_insert(&s->starts, 0, address) < 0) return NULL;
        i++; /* the segment above (if any) is now at i */
    }
    int64_t base = s->base;
    if (set_free(c, address, size, base) < 0) return NULL;
    if (joins_above) { /* the segment above joins this one */
        Segment *above = &c->segs[i];
        Py_ssize_t from = s->starts.n;
        if (vec_reserve(&s->starts, s->starts.n + above->starts.n) < 0) return NULL;
        memcpy(s->starts.v + s->starts.n, above->starts.v, above->starts.n * sizeof(int64_t));
        s->starts.n += above->starts.n;
        s->size += above->size;
        rebase_chunks(c, &s->starts, from, base);
        segment_remove(c, i);
        s = segment_at(c, base);
    }
    if (emit(c, time_ns, SEGMENT_MAP, thread, address, size, 0, base, 0, -1, stack) < 0) return NULL;
    int64_t end = address + size;
    if (end < base + s->size && chunk_get(c, end)->requested == 0 && merge(c, time_ns, address, thread) < 0)
        return NULL;
    if (address > base) {
        s = segment_at(c, base);
        int64_t previous = s->starts.v[bisect_right(s->starts.v, s->starts.n, address) - 2];
        if (chunk_get(c, previous)->requested == 0 && merge(c, time_ns, previous, thread) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

static int cut_out(Core *c, int64_t time_ns, int64_t address, int64_t size, int64_t thread, const char *what);

static PyObject *Core_segment_unmap(Core *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"time_ns", "address", "size", "thread", "stack", NULL};
    long long time_ns, address, size, thread = 0;
    int stack = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLL|$Li", names, &time_ns, &address, &size, &thread, &stack))
        return NULL;
    if (cut_out(c, time_ns, address, size, thread, "unmapping") < 0) return NULL;
    int64_t base = chunk_get(c, address)->segment;
    if (chunk_drop(c, address) < 0) return NULL;
    free_remove(c, size);
    Segment *s = segment_at(c, base);
    Py_ssize_t i = s - c->segs;
    int64_t end = base + s->size, upper = address + size;
    Py_ssize_t k = bisect_right(s->starts.v, s->starts.n, address) - 1;
    Vec upper_starts = {0};
    if (upper < end) {
        if (vec_reserve(&upper_starts, s->starts.n - k - 1) < 0) return NULL;
        memcpy(upper_starts.v, s->starts.v + k + 1, (s->starts.n - k - 1) * sizeof(int64_t));
        upper_starts.n = s->starts.n - k - 1;
    }
    s->starts.n = k;
    if (address > base) {
        s->size = address - base;
        i++;
    } else {
        segment_remove(c, i);
    }
    if (upper < end) {
        Segment *u = segment_insert(c, i, upper, end - upper);
        if (!u) return PyMem_Free(upper_starts.v), NULL;
        u->starts = upper_starts;
        rebase_chunks(c, &u->starts, 0, upper);
    }
    if (emit(c, time_ns, SEGMENT_UNMAP, thread, address, size, 0, base, 0, -1, stack) < 0) return NULL;
    Py_RETURN_NONE;
}

/* the chunk containing address: its start, or -1 (with *segment set to the holding segment or NULL) */
static Chunk *containing(Core *c, int64_t address, int64_t *start) {
    Segment *s = segment_holding(c, address);
    if (!s) return NULL;
    *start = s->starts.v[bisect_right(s->starts.v, s->starts.n, address) - 1];
    Chunk *ch = chunk_get(c, *start);
    return address < *start + ch->size ? ch : NULL;
}

/* Split the free chunk holding [address, address+size) so that the range is one free chunk; -1
 * with HeapConflict set (nothing changed) when it is not inside one free chunk. ``what`` names
 * the operation in the messages, as PythonHeapBuilder._cut_out words them. */
static int cut_out(Core *c, int64_t time_ns, int64_t address, int64_t size, int64_t thread, const char *what) {
    int64_t start = 0;
    Chunk *found = size > 0 ? containing(c, address, &start) : NULL;
    PyObject *ha = hex(address), *hs = NULL, *msg = NULL;
    if (!ha) return -1;
    if (size <= 0) {
        msg = PyUnicode_FromFormat("%s at %U has size %lld", what, ha, (long long)size);
    } else if (!found) {
        msg = PyUnicode_FromFormat("%s [%U, +%lld) lies outside every segment", what, ha, (long long)size);
    } else if (found->requested || address + size > start + found->size) {
        hs = hex(start);
        if (hs && found->requested)
            msg = PyUnicode_FromFormat("%s at %U overlaps the live allocation at %U", what, ha, hs);
        else if (hs)
            msg = PyUnicode_FromFormat("%s [%U, +%lld) runs past the free chunk at %U", what, ha, (long long)size, hs);
    } else {
        Py_DECREF(ha);
        if (address > start && split(c, time_ns, start, address - start, thread) < 0) return -1;
        if (size < chunk_get(c, address)->size && split(c, time_ns, address, size, thread) < 0) return -1;
        return 0;
    }
    Py_DECREF(ha);
    Py_XDECREF(hs);
    raise_conflict(c, msg);
    return -1;
}

static PyObject *Core_alloc(Core *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"time_ns", "address", "size", "requested", "thread", "tag", "stack", NULL};
    long long time_ns, address, size, requested, thread = 0;
    int tag = -1, stack = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLLL|$Lii", names, &time_ns, &address, &size, &requested, &thread,
                                     &tag, &stack))
        return NULL;
    if (cut_out(c, time_ns, address, size, thread, "allocation") < 0) return NULL;
    Chunk *ch = chunk_get(c, address);
    free_remove(c, size);
    ch->requested = requested > 1 ? requested : 1;
    ch->tag = tag;
    ch->stack = stack;
    if (emit(c, time_ns, ALLOC, thread, address, size, ch->requested, ch->segment, 0, tag, stack) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_free(Core *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"time_ns", "address", "thread", "duration_ns", "stack", NULL};
    long long time_ns, address, thread = 0, duration_ns = 0;
    PyObject *stack_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LL|$LLO", names, &time_ns, &address, &thread, &duration_ns,
                                     &stack_arg))
        return NULL;
    Chunk *ch = chunk_get(c, address);
    if (!ch || ch->requested == 0) return conflict(c, "free of %U, which is not a live allocation", address);
    int32_t stack = ch->stack;
    if (stack_arg != Py_None) {
        long s = PyLong_AsLong(stack_arg);
        if (s == -1 && PyErr_Occurred()) return NULL;
        stack = (int32_t)s;
    }
    int64_t size = ch->size, requested = ch->requested, segment = ch->segment;
    int32_t tag = ch->tag;
    if (set_free(c, address, size, segment) < 0) return NULL;
    if (emit(c, time_ns, FREE, thread, address, size, requested, segment, duration_ns, tag, stack) < 0) return NULL;
    Segment *s = segment_at(c, segment);
    int64_t end = segment + s->size, next = address + size;
    if (next < end && chunk_get(c, next)->requested == 0 && merge(c, time_ns, address, thread) < 0) return NULL;
    Py_ssize_t i = bisect_right(s->starts.v, s->starts.n, address) - 1;
    if (i > 0) {
        int64_t previous = s->starts.v[i - 1];
        if (chunk_get(c, previous)->requested == 0 && merge(c, time_ns, previous, thread) < 0) return NULL;
    }
    return PyLong_FromLongLong(size);
}

static PyObject *Core_oom(Core *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"time_ns", "requested", "rounded", "thread", "tag", "stack", NULL};
    long long time_ns, requested, rounded, thread = 0;
    int tag = -1, stack = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LLL|$Lii", names, &time_ns, &requested, &rounded, &thread, &tag,
                                     &stack))
        return NULL;
    if (emit(c, time_ns, OOM, thread, 0, rounded, requested, -1, 0, tag, stack) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_segment_of(Core *c, PyObject *arg) {
    long long address = PyLong_AsLongLong(arg);
    if (address == -1 && PyErr_Occurred()) return NULL;
    Segment *s = segment_holding(c, address);
    if (!s) Py_RETURN_NONE;
    return PyLong_FromLongLong(s->base);
}

static PyObject *Core_chunk_at(Core *c, PyObject *arg) {
    long long address = PyLong_AsLongLong(arg);
    if (address == -1 && PyErr_Occurred()) return NULL;
    int64_t start = 0;
    Chunk *ch = containing(c, address, &start);
    if (!ch) Py_RETURN_NONE;
    return Py_BuildValue("(LLL)", (long long)start, (long long)ch->size, (long long)ch->requested);
}

static PyObject *Core_is_live(Core *c, PyObject *arg) {
    long long address = PyLong_AsLongLong(arg);
    if (address == -1 && PyErr_Occurred()) return NULL;
    Chunk *ch = chunk_get(c, address);
    return PyBool_FromLong(ch && ch->requested > 0);
}

static PyObject *Core_live_size(Core *c, PyObject *arg) {
    long long address = PyLong_AsLongLong(arg);
    if (address == -1 && PyErr_Occurred()) return NULL;
    Chunk *ch = chunk_get(c, address);
    if (!ch || ch->requested == 0) return conflict(c, "no live allocation at %U", address);
    return PyLong_FromLongLong(ch->size);
}

static PyObject *Core_largest(Core *c, PyObject *Py_UNUSED(ignored)) { return PyLong_FromLongLong(largest(c)); }

/* [(base, size, [(address, size, requested, tag, stack), ...]), ...] in address order */
static PyObject *Core_layout(Core *c, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New(c->nsegs);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < c->nsegs; i++) {
        Segment *s = &c->segs[i];
        PyObject *chunks = PyList_New(s->starts.n);
        if (!chunks) return Py_DECREF(out), NULL;
        for (Py_ssize_t j = 0; j < s->starts.n; j++) {
            Chunk *ch = chunk_get(c, s->starts.v[j]);
            PyObject *t = Py_BuildValue("(LLLii)", (long long)s->starts.v[j], (long long)ch->size,
                                        (long long)ch->requested, ch->tag, ch->stack);
            if (!t) return Py_DECREF(chunks), Py_DECREF(out), NULL;
            PyList_SET_ITEM(chunks, j, t);
        }
        PyObject *seg = Py_BuildValue("(LLN)", (long long)s->base, (long long)s->size, chunks);
        if (!seg) return Py_DECREF(out), NULL;
        PyList_SET_ITEM(out, i, seg);
    }
    return out;
}

static int Core_init(Core *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"staged", "limit", "flush", "device", "conflict", NULL};
    PyObject *staged, *flush, *conflict_type;
    Py_ssize_t limit;
    int device;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnOiO", names, &staged, &limit, &flush, &device, &conflict_type))
        return -1;
    if (staged == Py_None) {
        PyErr_SetString(PyExc_TypeError, "staged must be a bytearray or an Arena, not None");
        return -1;
    }
    if (row_sink_set(&c->sink, staged) < 0) return -1;
    Py_XSETREF(c->flush, Py_NewRef(flush));
    Py_XSETREF(c->conflict, Py_NewRef(conflict_type));
    c->limit = limit;
    c->device = (int16_t)device;
    return 0;
}

static int Core_traverse(Core *c, visitproc visit, void *arg) {
    Py_VISIT(c->sink.obj);
    Py_VISIT(c->flush);
    Py_VISIT(c->conflict);
    Py_VISIT(Py_TYPE(c));
    return 0;
}

static int Core_clear(Core *c) {
    Py_CLEAR(c->sink.obj);
    c->sink.window = NULL;
    Py_CLEAR(c->flush);
    Py_CLEAR(c->conflict);
    return 0;
}

static void Core_dealloc(Core *c) {
    PyObject_GC_UnTrack(c);
    Core_clear(c);
    for (Py_ssize_t i = 0; i < c->nsegs; i++) PyMem_Free(c->segs[i].starts.v);
    PyMem_Free(c->segs);
    PyMem_Free(c->bases.v);
    map_free(&c->chunk_index);
    PyMem_Free(c->chunks);
    PyMem_Free(c->spare.v);
    map_free(&c->free_counts);
    PyMem_Free(c->free_heap.v);
    PyTypeObject *type = Py_TYPE(c);
    type->tp_free((PyObject *)c);
    Py_DECREF(type);
}

static PyMethodDef Core_methods[] = {
    {"segment_alloc", (PyCFunction)(void (*)(void))Core_segment_alloc, METH_VARARGS | METH_KEYWORDS, NULL},
    {"segment_free", (PyCFunction)(void (*)(void))Core_segment_free, METH_VARARGS | METH_KEYWORDS, NULL},
    {"segment_map", (PyCFunction)(void (*)(void))Core_segment_map, METH_VARARGS | METH_KEYWORDS, NULL},
    {"segment_unmap", (PyCFunction)(void (*)(void))Core_segment_unmap, METH_VARARGS | METH_KEYWORDS, NULL},
    {"alloc", (PyCFunction)(void (*)(void))Core_alloc, METH_VARARGS | METH_KEYWORDS, NULL},
    {"free", (PyCFunction)(void (*)(void))Core_free, METH_VARARGS | METH_KEYWORDS, NULL},
    {"oom", (PyCFunction)(void (*)(void))Core_oom, METH_VARARGS | METH_KEYWORDS, NULL},
    {"segment_of", (PyCFunction)Core_segment_of, METH_O, NULL},
    {"chunk_at", (PyCFunction)Core_chunk_at, METH_O, NULL},
    {"is_live", (PyCFunction)Core_is_live, METH_O, NULL},
    {"live_size", (PyCFunction)Core_live_size, METH_O, NULL},
    {"_largest_free", (PyCFunction)Core_largest, METH_NOARGS, NULL},
    {"_layout", (PyCFunction)Core_layout, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Core_slots[] = {
    {Py_tp_init, Core_init},           {Py_tp_dealloc, Core_dealloc}, {Py_tp_traverse, Core_traverse},
    {Py_tp_clear, Core_clear},         {Py_tp_methods, Core_methods}, {Py_tp_new, PyType_GenericNew},
    {0, NULL},
};

static PyType_Spec Core_spec = {
    "gpuviz.log._heapcore.Core", sizeof(Core), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, Core_slots,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_heapcore", NULL, -1, NULL, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__heapcore(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *type = PyType_FromSpec(&Core_spec);
    if (!type || PyModule_AddObject(m, "Core", type) < 0) {
        Py_XDECREF(type);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
