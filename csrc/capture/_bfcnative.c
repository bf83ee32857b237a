/* gpuviz.capture._bfcnative: the BFC allocator's hot path as a CPython extension (optional).
 *
 * Core(device, grow, validate_size, report, invalid_free_error) holds one device's chunks,
 * segments and free index (the plain-C core in _bfc_core.c) and records every decision as
 * a row of gpuviz.log.schema.ROW_STRUCT, byte for byte what gpuviz.capture.recorder writes.
 * gpuviz.capture.native.NativeBFCAllocator wraps it with BFCAllocator's public API; growth,
 * garbage collection and out-of-memory errors (rare) are decided there, in Python, through
 * the ``grow`` callback (gpuviz.capture.bfc_pool, on the rules of gpuviz.capture.bfc_rules;
 * this file's rounding and the core's split rule are _bfc_rules.h's). The parts of this
 * extension are listed in _bfcnative.h.
 *
 * Locking: one owner at a time per Core (``owner``, ``depth``), taken by every operation and
 * changed only while holding the GIL, so taking a free allocator costs no lock call (the
 * hot path holds the GIL throughout: it is far shorter than a GIL hand-over). The owner
 * lets go of the GIL only inside calls back into Python (upstream, flush, tag and stack
 * interning, the Python-side locked regions); around those it closes ``gate``, a real
 * lock, and a thread that finds the allocator owned waits on the gate with the GIL
 * released, then looks again. A free arriving on the owner's thread meanwhile (a
 * finalizer) is deferred to the end of the operation, as in the Python allocator. This
 * relies on the GIL and a little-endian host; other builds use the Python allocator.
 */
#include "_bfcnative.h"
#include "_clock.h"

/* ------------------------------------------------------------------ rows */

static void write_row(Core *self, int kind, int64_t address, int64_t size, int64_t requested, int64_t segment,
                      int64_t largest, int32_t tag, int32_t stack) {
    if (self->sink.obj == Py_None || self->emit_failed) return;
    /* bfc.row_time, the decision's time, is set only while this thread's allocate or free decides
     * (in C, owning the core); 0 otherwise: read the clock per event */
    int64_t stamp = self->bfc.row_time;
    row_t r = {.time_ns = stamp ? stamp : clock_ns(),
               .thread = (int64_t)(stamp ? self->owner : PyThread_get_thread_ident()),
               .address = address, .size = size, .requested = requested, .segment = segment, .largest = largest,
               .tag = tag, .stack = stack, .device = self->device_index, .peer = -1, .kind = (uint8_t)kind};
    unsigned char *slot = row_sink_claim(&self->sink);
    if (slot == NULL) {
        PyErr_Clear();
        self->emit_failed = 1;
        return;
    }
    pack_row(slot, &r);
    if (row_sink_due(&self->sink, self->limit)) self->need_flush = 1;
}

/* Before a decision changes anything: room for its rows (a free and its two merges, or a split
 * and its alloc), so that the decision is either made and recorded, or not made. -1 with
 * MemoryError set ("what": the operation, for the message). */
#define DECISION_ROWS 3
static __attribute__((cold, noinline)) int rows_refused(const char *what) {
    if (PyErr_ExceptionMatches(PyExc_MemoryError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_MemoryError,
                     "gpuviz: no memory left for the event log's rows: this %s was not made (the allocator and its "
                     "log are as before it)", what);
    }
    return -1;
}

static inline int reserve_rows(Core *self, const char *what) {
    if (self->sink.obj == Py_None || row_sink_reserve(&self->sink, DECISION_ROWS * ROW_BYTES) == 0) return 0;
    return rows_refused(what);
}

/* A decision about to run: its rows get one time and this thread (the owner). */
static inline void stamp_decision(Core *self) {
    if (self->sink.obj == Py_None) return;
    self->bfc.row_time = clock_ns();
    self->bfc.row_thread = (int64_t)self->owner;
}

/* After it: is a flush due (the arena's window says; the callback path checks per row)? */
static inline void decision_done(Core *self) {
    self->bfc.row_time = 0;
    const gv_window *w = self->bfc.rows; /* the sink's window, when the core writes its rows itself */
    if (w != NULL && w->write >= w->due) self->need_flush = 1;
}

static void emit_cb(void *ctx, int kind, int64_t address, int64_t size, int64_t requested, int64_t segment,
                    int64_t largest, int32_t tag, int32_t stack) {
    write_row((Core *)ctx, kind, address, size, requested, segment, largest, tag, stack);
}

/* ------------------------------------------------------------- helpers */
static int call_index(Core *self, PyObject *fn, PyObject *arg, int32_t *out) {
    PyObject *r = call_out(self, fn, arg);
    if (r == NULL) return -1;
    long v = PyLong_AsLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "table index does not fit a 32-bit column");
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int stack_id(Core *self, int32_t *stack) {
    *stack = -1;
    return self->stack_fn == Py_None ? 0 : call_index(self, self->stack_fn, NULL, stack);
}

/* address as int64; 0 with *ok = 0 when it is not an int that fits */
int bfcn_do_free(Core *self, PyObject *address) {
    int ok;
    int64_t a = bfcn_as_address(address, &ok);
    int32_t slot = ok ? bfc_find(&self->bfc, a) : -1;
    if (slot < 0 || !bfc_at(&self->bfc, slot)->in_use) {
        bfcn_bad_free(self, address, slot);
        return -1;
    }
    int32_t stack;
    if (stack_id(self, &stack) < 0) return -1;
    void *tag;
    if (reserve_rows(self, "free") < 0) return -1;
    stamp_decision(self); /* a free and its merges: one time */
    bfc_release_chunk(&self->bfc, slot, stack, &tag);
    decision_done(self);
    Py_XDECREF((PyObject *)tag);
    return 0;
}

static int is_zero(PyObject *obj) {
    if (PyLong_CheckExact(obj)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        return !overflow && v == 0;
    }
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) return -1;
    int r = PyObject_RichCompareBool(obj, zero, Py_EQ);
    Py_DECREF(zero);
    return r;
}

/* ------------------------------------------------------------- methods */
static PyObject *Core_free(Core *self, PyObject *address) {
    if (!PyLong_CheckExact(address) && (PyBool_Check(address) || !PyIndex_Check(address))) {
        /* the words of gpuviz.capture.arguments.address_argument; nothing has changed */
        PyObject *text = PyObject_Repr(address);
        if (text == NULL) return NULL;
        const char *name = Py_TYPE(address)->tp_name, *dot = strrchr(name, '.');
        PyErr_Format(PyExc_TypeError, "free: the address must be an integer (the value allocate returned), not %s (%.40U)",
                     dot ? dot + 1 : name, text);
        Py_DECREF(text);
        return NULL;
    }
    int zero = is_zero(address);
    if (zero < 0) return NULL;
    if (zero) Py_RETURN_NONE;
    if (held_here(self)) { /* a free arriving inside an operation of this thread */
        if (PyList_Append(self->pending, address) < 0) return NULL;
        Py_RETURN_NONE;
    }
    enter(self);
    int failed = bfcn_do_free(self, address);
    if (bfcn_leave(self) < 0 || failed) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_allocate(Core *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *tag = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs != 1 || nkw > 1 ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "tag") != 0)) {
        PyErr_SetString(PyExc_TypeError, "allocate(nbytes, *, tag=None)");
        return NULL;
    }
    if (nkw == 1) tag = args[1];
    if (tag != Py_None && !PyUnicode_CheckExact(tag)) { /* checked first, as the Python allocator does */
        PyErr_Format(PyExc_TypeError, "tag must be a string or None, not %s", Py_TYPE(tag)->tp_name);
        return NULL;
    }
    PyObject *nbytes = args[0];
    Py_INCREF(nbytes);
    int overflow = 0;
    long long requested = 0;
    if (PyLong_CheckExact(nbytes)) requested = PyLong_AsLongLongAndOverflow(nbytes, &overflow);
    if (!PyLong_CheckExact(nbytes) || requested <= 0 || overflow) {
        PyObject *checked = PyObject_CallOneArg(self->validate_size, nbytes);
        Py_DECREF(nbytes);
        if (checked == NULL) return NULL;
        nbytes = checked;
        requested = PyLong_AsLongLongAndOverflow(nbytes, &overflow);
        if (requested == -1 && PyErr_Occurred()) {
            Py_DECREF(nbytes);
            return NULL;
        }
        if (!overflow && requested == 0) {
            Py_DECREF(nbytes);
            return PyLong_FromLong(0);
        }
    }
    if (held_here(self)) {
        Py_DECREF(nbytes);
        PyErr_SetString(PyExc_RuntimeError,
                        "re-entrant allocate from inside the allocator (a finalizer allocating memory)");
        return NULL;
    }
    /* a request whose rounded size is beyond int64 cannot fit: the grow callback raises the OOM */
    if (!overflow && requested > INT64_MAX - 255) overflow = 1;
    int64_t rounded = overflow ? INT64_MAX : bfc_rounded(requested);
    PyObject *result = NULL;
    enter(self);
    int32_t stack, tag_id = -1;
    if (stack_id(self, &stack) < 0) goto done;
    int32_t slot = overflow ? -1 : bfc_take_best_fit(&self->bfc, rounded);
    if (slot < 0) {
        PyObject *stack_obj = PyLong_FromLong(stack);
        if (stack_obj == NULL) goto done;
        gate_close(self);
        PyObject *r = PyObject_CallFunctionObjArgs(self->grow, nbytes, stack_obj, NULL);
        gate_open(self);
        Py_DECREF(stack_obj);
        if (r == NULL) goto done;
        Py_DECREF(r);
        slot = bfc_take_best_fit(&self->bfc, rounded);
        if (slot < 0) {
            PyErr_SetString(PyExc_RuntimeError, "gpuviz: the pool grew but holds no chunk for the request");
            goto done;
        }
    }
    if (tag != Py_None && self->tag_fn != Py_None && call_index(self, self->tag_fn, tag, &tag_id) < 0) {
        bfc_put_back(&self->bfc, slot);
        goto done;
    }
    if (reserve_rows(self, "allocation") < 0) {
        bfc_put_back(&self->bfc, slot);
        goto done;
    }
    stamp_decision(self); /* a split and its alloc: one time */
    int split = bfc_split(&self->bfc, slot, rounded, stack);
    if (split < 0) {
        decision_done(self);
        bfc_put_back(&self->bfc, slot);
        PyErr_NoMemory();
        goto done;
    }
    Py_INCREF(tag);
    bfc_mark_allocated(&self->bfc, slot, requested, tag == Py_None ? NULL : tag, tag_id, stack);
    decision_done(self);
    if (tag == Py_None) Py_DECREF(tag);
    result = PyLong_FromLongLong(bfc_at(&self->bfc, slot)->address);
done:
    Py_DECREF(nbytes);
    if (bfcn_leave(self) < 0) Py_CLEAR(result);
    return result;
}

static PyObject *Core_emit(Core *self, PyObject *const *args, Py_ssize_t nargs) {
    long long v[8];
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "emit(kind, address, size, requested, segment, largest_free, tag, stack)");
        return NULL;
    }
    for (int i = 0; i < 8; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    if (v[0] < 0 || v[0] > 255 || v[6] < INT32_MIN || v[6] > INT32_MAX || v[7] < INT32_MIN || v[7] > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "kind, tag or stack out of range");
        return NULL;
    }
    write_row(self, (int)v[0], v[1], v[2], v[3], v[4], v[5], (int32_t)v[6], (int32_t)v[7]);
    Py_RETURN_NONE;
}

static PyObject *Core_set_sink(Core *self, PyObject *args) {
    PyObject *staged, *flush, *tag_fn, *stack_fn;
    Py_ssize_t limit;
    int device;
    if (!PyArg_ParseTuple(args, "OnOiOO", &staged, &limit, &flush, &device, &tag_fn, &stack_fn)) return NULL;
    if (device < INT16_MIN || device > INT16_MAX) {
        PyErr_SetString(PyExc_OverflowError, "device index does not fit 16 bits");
        return NULL;
    }
    if (row_sink_set(&self->sink, staged) < 0) return NULL;
    self->bfc.emit = staged == Py_None ? NULL : emit_cb; /* off: the core reports nothing */
    self->bfc.rows = self->sink.window; /* an arena: the core writes its rows in place */
    self->bfc.row_device = (int16_t)device;
    Py_INCREF(flush);
    Py_XSETREF(self->flush, flush);
    Py_INCREF(tag_fn);
    Py_XSETREF(self->tag_fn, tag_fn);
    Py_INCREF(stack_fn);
    Py_XSETREF(self->stack_fn, stack_fn);
    self->limit = limit;
    self->device_index = (int16_t)device;
    Py_RETURN_NONE;
}

static PyObject *Core_add_segment(Core *self, PyObject *args) {
    long long base, size;
    int stack;
    if (!PyArg_ParseTuple(args, "LLi", &base, &size, &stack)) return NULL;
    if (size <= 0 || size % 256 || bfc_find(&self->bfc, base) >= 0) {
        PyErr_Format(PyExc_ValueError, "segment at %lld of %lld bytes overlaps the pool or is not a multiple of 256",
                     base, size);
        return NULL;
    }
    if (reserve_rows(self, "segment reservation") < 0) return NULL; /* its row, before anything changes */
    if (bfc_add_segment(&self->bfc, base, size, stack) < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *Core_release_segment(Core *self, PyObject *args) {
    long long base;
    int stack;
    if (!PyArg_ParseTuple(args, "Li", &base, &stack)) return NULL;
    if (reserve_rows(self, "segment release") < 0) return NULL; /* its row, before anything changes */
    if (bfc_release_segment(&self->bfc, base, stack) < 0) {
        PyErr_Format(PyExc_ValueError, "no wholly free segment at %lld", base);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------- the type */
static int Core_init(Core *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"device", "grow", "validate_size", "report", "invalid_free_error", NULL};
    PyObject *device, *grow, *validate_size, *report, *invalid_free_error;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UOOOO", names, &device, &grow, &validate_size, &report,
                                     &invalid_free_error))
        return -1;
    if (self->gate != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Core is initialised once");
        return -1;
    }
    if (bfc_init(&self->bfc) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    self->bfc.emit = NULL; /* recording off until set_sink */
    self->bfc.emit_ctx = self;
    self->gate = PyThread_allocate_lock();
    self->pending = PyList_New(0);
    if (self->gate == NULL || self->pending == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject **slots[] = {&self->device, &self->grow, &self->validate_size, &self->report, &self->invalid_free_error};
    PyObject *values[] = {device, grow, validate_size, report, invalid_free_error};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    if (row_sink_set(&self->sink, Py_None) < 0) return -1;
    PyObject **sink[] = {&self->flush, &self->tag_fn, &self->stack_fn};
    for (int i = 0; i < 3; i++) {
        Py_INCREF(Py_None);
        Py_XSETREF(*sink[i], Py_None);
    }
    return 0;
}

static int Core_traverse(Core *self, visitproc visit, void *arg) {
    Py_VISIT(self->sink.obj);
    Py_VISIT(self->flush);
    Py_VISIT(self->tag_fn);
    Py_VISIT(self->stack_fn);
    Py_VISIT(self->device);
    Py_VISIT(self->grow);
    Py_VISIT(self->validate_size);
    Py_VISIT(self->report);
    Py_VISIT(self->invalid_free_error);
    Py_VISIT(self->pending);
    return 0;
}

static int Core_clear(Core *self) {
    Py_CLEAR(self->sink.obj);
    self->sink.window = self->bfc.rows = NULL; /* no pointer into the arena just let go of */
    self->bfc.emit = NULL;
    Py_CLEAR(self->flush);
    Py_CLEAR(self->tag_fn);
    Py_CLEAR(self->stack_fn);
    Py_CLEAR(self->device);
    Py_CLEAR(self->grow);
    Py_CLEAR(self->validate_size);
    Py_CLEAR(self->report);
    Py_CLEAR(self->invalid_free_error);
    Py_CLEAR(self->pending);
    return 0;
}

static void Core_dealloc(Core *self) {
    PyObject_GC_UnTrack(self);
    Core_clear(self);
    bfc_t *b = &self->bfc;
    for (size_t i = 0; i < b->hash_capacity; i++) /* the tags of live chunks */
        if (b->hash_keys[i] != INT64_MIN) Py_XDECREF((PyObject *)bfc_at(b, b->hash_values[i])->tag);
    bfc_destroy(b);
    if (self->gate) PyThread_free_lock(self->gate);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Core_methods[] = {
    {"allocate", (PyCFunction)(void (*)(void))Core_allocate, METH_FASTCALL | METH_KEYWORDS,
     "allocate(nbytes, *, tag=None) -> address"},
    {"free", (PyCFunction)Core_free, METH_O, "free(address)"},
    {"emit", (PyCFunction)(void (*)(void))Core_emit, METH_FASTCALL,
     "emit(kind, address, size, requested, segment, largest_free, tag, stack): record one row"},
    {"set_sink", (PyCFunction)Core_set_sink, METH_VARARGS,
     "set_sink(staged, limit, flush, device, tag_fn, stack_fn): where rows go (EventLog.row_sink()'s bytearray or "
     "Arena; None: nowhere)"},
    {"add_segment", (PyCFunction)Core_add_segment, METH_VARARGS, "add_segment(base, size, stack)"},
    {"release_segment", (PyCFunction)Core_release_segment, METH_VARARGS, "release_segment(base, stack)"},
    {"segments", (PyCFunction)Core_segments, METH_NOARGS, "[(base, size, wholly_free)] in the order added"},
    {"chunks", (PyCFunction)Core_chunks, METH_O, "chunks(base): the chunk tuples of a segment"},
    {"lookup", (PyCFunction)Core_lookup, METH_O, "lookup(address): the chunk tuple starting there, or None"},
    {"set_tag_id", (PyCFunction)Core_set_tag_id, METH_VARARGS, "set_tag_id(address, tag_id)"},
    {"free_chunks", (PyCFunction)Core_free_chunks, METH_NOARGS, "(size, address) of the free chunks in order"},
    {"stats", (PyCFunction)Core_stats, METH_NOARGS,
     "(num_allocs, bytes_in_use, peak_bytes_in_use, largest_alloc_size, pool_bytes, peak_pool_bytes, largest_free)"},
    {"clear_stats", (PyCFunction)Core_clear_stats, METH_NOARGS, "TensorFlow's ClearStats"},
    {"largest_free", (PyCFunction)Core_largest_free, METH_NOARGS, "size of the largest free chunk"},
    {"check_links", (PyCFunction)Core_check_links, METH_NOARGS, "None, or what is broken"},
    {"lock", (PyCFunction)Core_lock, METH_NOARGS, "take the allocator's lock (re-entrant)"},
    {"unlock", (PyCFunction)Core_unlock, METH_NOARGS, "drop it: deferred frees are applied, rows flushed"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpuviz.capture._bfcnative.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One device's BFC allocator state and hot path (see gpuviz.capture.native).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Core_init,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_methods = Core_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuviz.capture._bfcnative",
    .m_doc = "The BFC allocator's hot path in C (optional; see gpuviz.capture.native).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__bfcnative(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddFunctions(m, bfcn_rule_functions) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
