/* gpuviz.log._staging: emptying an EventLog's staging bytearray without giving up its
 * allocation (optional; see gpuviz/capture/_rows.h for why).
 *
 * take(staged, nbytes) -> bytes: the first nbytes of ``staged``, removed from it; the rest
 * (rows appended meanwhile) moves to the front. Holding the GIL throughout, it is one step
 * for the recorders, as ``bytes(staged[:n]); del staged[:n]`` is not.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#ifdef Py_GIL_DISABLED
#error "take relies on the GIL; EventLog empties the buffer in Python instead"
#endif

static PyObject *take(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyByteArray_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "take(staged: bytearray, nbytes: int)");
        return NULL;
    }
    PyByteArrayObject *b = (PyByteArrayObject *)args[0];
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[1]);
    if (nbytes == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t size = Py_SIZE(b);
    if (nbytes < 0 || nbytes > size) {
        PyErr_Format(PyExc_ValueError, "cannot take %zd bytes of %zd", nbytes, size);
        return NULL;
    }
    if (b->ob_exports > 0) {
        PyErr_SetString(PyExc_BufferError, "the staging buffer is exported");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(b->ob_start, nbytes);
    if (out == NULL) return NULL;
    memmove(b->ob_bytes, b->ob_start + nbytes, (size_t)(size - nbytes));
    b->ob_start = b->ob_bytes;
    Py_SET_SIZE(b, size - nbytes);
    b->ob_start[size - nbytes] = '\0';
    return out;
}

static PyMethodDef methods[] = {
    {"take", (PyCFunction)(void (*)(void))take, METH_FASTCALL,
     "take(staged, nbytes) -> bytes: remove and return the first nbytes, keeping the allocation"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuviz.log._staging",
    .m_doc = "Emptying an EventLog's staging buffer in place (optional).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__staging(void) { return PyModule_Create(&module); }
