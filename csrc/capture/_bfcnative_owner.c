/* gpuviz.capture._bfcnative, its part: the end of an operation and the lock Python takes
 * (see _bfcnative.c for the ownership rules, _bfcnative.h for the parts). */
#include "_bfcnative.h"

/* Report what went wrong after an operation was decided (``report(what, error)``, logged by
 * gpuviz.capture.native): the exception set now, or a MemoryError with ``what`` when none is.
 * 0, or -1 with the report callback's own error set. */
__attribute__((cold, noinline)) int bfcn_report_after(Core *self, const char *what) {
    PyObject *t = NULL, *v = NULL, *tb = NULL;
    PyObject *text = PyUnicode_FromString(what);
    if (text == NULL) return -1;
    if (PyErr_Occurred()) {
        PyErr_Fetch(&t, &v, &tb);
        PyErr_NormalizeException(&t, &v, &tb);
    } else {
        v = PyObject_CallOneArg(PyExc_MemoryError, text);
    }
    PyObject *args = v != NULL ? PyTuple_Pack(2, text, v) : NULL;
    Py_DECREF(text);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
    if (args == NULL) return -1;
    gate_close(self);
    PyObject *r = PyObject_Call(self->report, args, NULL);
    gate_open(self);
    Py_DECREF(args);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* End of an operation: apply deferred frees, flush, drop the lock. Whatever fails here comes
 * after the operation was decided, so it never takes the operation's place (an allocation
 * made and then reported as an error would lose its address): a deferred free that could not
 * be made (no room for its rows) stays due, for the next operation; an invalid one, a failed
 * flush (tried again once rows reach the limit) and rows that could not be staged are
 * reported. The caller then sees its operation's own outcome. -1 only when reporting failed. */
int bfcn_leave(Core *self) {
    int status = 0;
    if (self->depth == 1) {
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb); /* the operation's own error, if any */
        int frees = 1;
        while (status == 0) {
            Py_ssize_t n = frees ? PyList_GET_SIZE(self->pending) : 0;
            if (n) {
                PyObject *address = PyList_GET_ITEM(self->pending, n - 1);
                Py_INCREF(address);
                PyList_SetSlice(self->pending, n - 1, n, NULL);
                if (bfcn_do_free(self, address) < 0) {
                    const char *what = "a deferred free failed";
                    if (!PyErr_ExceptionMatches(self->invalid_free_error)) { /* not made: nothing changed */
                        what = "a deferred free could not be made now; it stays due, for the next operation";
                        if (PyList_Append(self->pending, address) < 0) what = "a deferred free was lost";
                        frees = 0; /* the others wait too */
                    }
                    status = bfcn_report_after(self, what);
                }
                Py_DECREF(address);
                continue;
            }
            if (self->need_flush) {
                self->need_flush = 0;
                PyObject *r = call_out(self, self->flush, NULL);
                if (r == NULL) status = bfcn_report_after(self, "flushing the event log failed");
                Py_XDECREF(r);
                continue;
            }
            break;
        }
        if (self->bfc.rows_failed) { /* a row the core refused to write (too little reserved): never, but said */
            self->bfc.rows_failed = 0;
            self->emit_failed = 1;
        }
        if (self->emit_failed && status == 0) {
            self->emit_failed = 0;
            status = bfcn_report_after(self, "could not stage an event row: the log misses events of this operation");
        }
        if (exc_type != NULL) { /* a call per operation otherwise, for nothing */
            if (status == 0) {
                PyErr_Restore(exc_type, exc_value, exc_tb);
            } else {
                Py_XDECREF(exc_type);
                Py_XDECREF(exc_value);
                Py_XDECREF(exc_tb);
            }
        }
    }
    if (--self->depth == 0) self->owner = 0;
    return status;
}

PyObject *Core_lock(Core *self, PyObject *unused) {
    enter(self);
    gate_close(self); /* the caller runs Python code while it owns the allocator */
    Py_RETURN_NONE;
}

PyObject *Core_unlock(Core *self, PyObject *unused) {
    if (!held_here(self)) {
        PyErr_SetString(PyExc_RuntimeError, "unlock() of a lock this thread does not hold");
        return NULL;
    }
    gate_open(self);
    if (bfcn_leave(self) < 0) return NULL;
    Py_RETURN_NONE;
}
