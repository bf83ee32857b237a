/* gpuviz.capture._rowwriter: the allocator's event recorder in C (optional).
 *
 * RowWriter(staged, limit, flush, device).emit(kind, address, size, requested, segment,
 * largest_free, tag, stack) appends one row laid out as gpuviz.log.schema.ROW_STRUCT
 * ("<qBbhhqqqqqqqii", 78 bytes, little-endian, packed) to ``staged``, the log's staging
 * bytearray or Arena (csrc/log/_rowsink.h), stamped with time.perf_counter_ns()'s clock
 * (_clock.h) and threading.get_ident(), and calls ``flush()`` once the rows are due (an Arena's
 * window says when; a bytearray once it holds ``limit`` bytes). It writes exactly the bytes that
 * the pure-Python recorder (gpuviz.capture.recorder) writes; tests hold the two together.
 *
 * The row is written in one step while holding the GIL, so concurrent appends are
 * never torn (as with the Python recorder's single bytearray.extend). Builds that cannot
 * guarantee that (free-threaded CPython) or hosts that are not little-endian do not build
 * this module; gpuviz then records with the Python recorder.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <string.h>

#ifdef Py_GIL_DISABLED
#error "the row writer relies on the GIL; the pure-Python recorder is used instead"
#endif
#include "_clock.h"
#include "../log/_rows.h"
#include "../log/_rowsink.h"

typedef struct {
    PyObject_HEAD
    row_sink sink;    /* the log's staging bytearray or Arena */
    Py_ssize_t limit; /* flush threshold of a bytearray, bytes */
    PyObject *flush;  /* callable */
    int16_t device;
} RowWriter;


static int as_i64(PyObject *value, int64_t *out) {
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 0;
}

static int as_i32(PyObject *value, int32_t *out) {
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "value does not fit a 32-bit column");
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static PyObject *RowWriter_emit(RowWriter *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "emit() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    int64_t kind, address, size, requested, segment, largest;
    int32_t tag, stack;
    if (as_i64(args[0], &kind) || as_i64(args[1], &address) || as_i64(args[2], &size) ||
        as_i64(args[3], &requested) || as_i64(args[4], &segment) || as_i64(args[5], &largest) ||
        as_i32(args[6], &tag) || as_i32(args[7], &stack))
        return NULL;
    if (kind < 0 || kind > 255) {
        PyErr_SetString(PyExc_OverflowError, "kind does not fit a byte");
        return NULL;
    }
    row_t r = {.time_ns = clock_ns(), .thread = (int64_t)PyThread_get_thread_ident(), .address = address,
               .size = size, .requested = requested, .segment = segment, .largest = largest, .tag = tag,
               .stack = stack, .device = self->device, .peer = -1, .kind = (uint8_t)kind};
    unsigned char *slot = row_sink_claim(&self->sink);
    if (slot == NULL) return NULL;
    pack_row(slot, &r);
    if (row_sink_due(&self->sink, self->limit)) return PyObject_CallNoArgs(self->flush);
    Py_RETURN_NONE;
}

static int RowWriter_init(RowWriter *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"staged", "limit", "flush", "device", NULL};
    PyObject *staged, *flush;
    Py_ssize_t limit;
    int device;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnOi", names, &staged, &limit, &flush, &device)) return -1;
    if (staged == Py_None) {
        PyErr_SetString(PyExc_TypeError, "staged must be a bytearray or an Arena, not None");
        return -1;
    }
    if (!PyCallable_Check(flush)) {
        PyErr_SetString(PyExc_TypeError, "flush must be callable");
        return -1;
    }
    if (device < INT16_MIN || device > INT16_MAX) {
        PyErr_SetString(PyExc_OverflowError, "device index does not fit 16 bits");
        return -1;
    }
    if (row_sink_set(&self->sink, staged) < 0) return -1;
    Py_INCREF(flush);
    Py_XSETREF(self->flush, flush);
    self->limit = limit;
    self->device = (int16_t)device;
    return 0;
}

static int RowWriter_traverse(RowWriter *self, visitproc visit, void *arg) {
    Py_VISIT(self->sink.obj);
    Py_VISIT(self->flush);
    return 0;
}

static int RowWriter_clear(RowWriter *self) {
    Py_CLEAR(self->sink.obj);
    self->sink.window = NULL;
    Py_CLEAR(self->flush);
    return 0;
}

static void RowWriter_dealloc(RowWriter *self) {
    PyObject_GC_UnTrack(self);
    RowWriter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef RowWriter_methods[] = {
    {"emit", (PyCFunction)(void (*)(void))RowWriter_emit, METH_FASTCALL,
     "emit(kind, address, size, requested, segment, largest_free, tag, stack): append one row"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RowWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpuviz.capture._rowwriter.RowWriter",
    .tp_basicsize = sizeof(RowWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Appends allocator events as packed rows to an EventLog's staging buffer.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RowWriter_init,
    .tp_traverse = (traverseproc)RowWriter_traverse,
    .tp_clear = (inquiry)RowWriter_clear,
    .tp_dealloc = (destructor)RowWriter_dealloc,
    .tp_methods = RowWriter_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuviz.capture._rowwriter",
    .m_doc = "The allocator's event recorder in C (optional; see gpuviz.capture.recorder).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__rowwriter(void) {
    if (PyType_Ready(&RowWriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RowWriterType);
    if (PyModule_AddObject(m, "RowWriter", (PyObject *)&RowWriterType) < 0) {
        Py_DECREF(&RowWriterType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "ROW_BYTES", ROW_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
