/* The pickle machine of the snapshot reader (see _snapshotpickle.h): its input, read in blocks
 * and bounded by the input's size, its stack and marks, and its memo. */
#include "_snapshotpickle.h"

int unsupported(const char *why) {
    if (!PyErr_Occurred()) PyErr_SetString(Unsupported, why);
    return -1;
}

/* ---------------------------------------------------------------- input */
int need(R *r, Py_ssize_t n) {
    if (r->limit >= 0 && n - (r->end - r->pos) > r->limit - r->received)
        return unsupported("a length past the end of the input");
    while (r->end - r->pos < n) {
        if (r->eof) return unsupported("the pickle ends early");
        Py_ssize_t have = r->end - r->pos;
        if (r->pos > 0) {
            memmove(r->buf, r->buf + r->pos, have);
            r->pos = 0;
            r->end = have;
        }
        Py_ssize_t want = n - have < CHUNK ? CHUNK : n - have > STEP ? STEP : n - have;
        if (r->cap < have + want) { /* doubling: a long value costs its bytes, not one copy per step */
            Py_ssize_t cap = r->cap > PY_SSIZE_T_MAX / 2 || r->cap * 2 < have + want ? have + want : r->cap * 2;
            char *p = PyMem_Realloc(r->buf, cap);
            if (!p) {
                PyErr_NoMemory();
                return -1;
            }
            r->buf = p;
            r->cap = cap;
        }
        PyObject *chunk = PyObject_CallFunction(r->read, "n", want);
        if (!chunk) return -1;
        if (!PyBytes_Check(chunk)) {
            Py_DECREF(chunk);
            return unsupported("read() did not return bytes");
        }
        Py_ssize_t got = PyBytes_GET_SIZE(chunk);
        if (got > want) {
            Py_DECREF(chunk);
            return unsupported("read() returned more than asked");
        }
        if (got == 0) r->eof = 1;
        memcpy(r->buf + r->end, PyBytes_AS_STRING(chunk), got);
        r->end += got;
        r->received += got;
        Py_DECREF(chunk);
    }
    return 0;
}

/* ---------------------------------------------------------------- stack and memo */
int push(R *r, PyObject *o, Py_ssize_t memo_index) { /* steals o */
    if (!o) return -1;
    if (r->sp == r->scap) {
        Py_ssize_t cap = r->scap ? r->scap * 2 : 256;
        PyObject **s = PyMem_Realloc(r->stack, cap * sizeof(PyObject *));
        if (!s) {
            Py_DECREF(o);
            PyErr_NoMemory();
            return -1;
        }
        r->stack = s;
        Py_ssize_t *m = PyMem_Realloc(r->stack_memo, cap * sizeof(Py_ssize_t));
        if (!m) {
            Py_DECREF(o);
            PyErr_NoMemory();
            return -1;
        }
        r->stack_memo = m;
        r->scap = cap;
    }
    r->stack[r->sp] = o;
    r->stack_memo[r->sp] = memo_index;
    r->sp++;
    return 0;
}

int memo_put(R *r, Py_ssize_t idx) {
    if (r->sp <= region_start(r)) return unsupported("memo store with an empty stack");
    if (idx < 0 || idx > r->stores) return unsupported("a memo index past the memo stores before it");
    r->stores++;
    if (idx >= r->memo_cap) {
        Py_ssize_t cap = r->memo_cap ? r->memo_cap : 1024;
        while (cap <= idx) cap *= 2;
        PyObject **m = PyMem_Realloc(r->memo, cap * sizeof(PyObject *));
        if (!m) return PyErr_NoMemory(), -1;
        r->memo = m;
        int32_t *s = PyMem_Realloc(r->memo_stack, cap * sizeof(int32_t));
        if (!s) return PyErr_NoMemory(), -1;
        r->memo_stack = s;
        for (Py_ssize_t i = r->memo_cap; i < cap; i++) r->memo[i] = NULL;
        r->memo_cap = cap;
    }
    PyObject *top = r->stack[r->sp - 1];
    if (r->memo[idx]) {
        if (r->memo[idx] == CONSUMED || r->memo[idx] == STACKREF) return unsupported("memo slot of a dropped entry reused");
        Py_DECREF(r->memo[idx]);
    } else {
        r->memo_len++;
    }
    Py_INCREF(top);
    r->memo[idx] = top;
    r->stack_memo[r->sp - 1] = idx;
    return 0;
}

int memo_get(R *r, Py_ssize_t idx) {
    if (idx < 0 || idx >= r->memo_cap || !r->memo[idx]) return unsupported("memo fetch of a missing slot");
    PyObject *o = r->memo[idx];
    if (o == CONSUMED) return unsupported("a reference to a trace entry");
    if (o == STACKREF) {
        r->stackrefs_out++;
        PyObject *stack = PyLong_FromLong(r->memo_stack[idx]);
        if (!stack) return -1;
        PyObject *ref = PyTuple_Pack(2, STACKREF_TAG, stack);
        Py_DECREF(stack);
        return push(r, ref, idx);
    }
    if (o == r->dtlist || trace_of(r, o)) return unsupported("a second reference to the device traces");
    if (PyErr_Occurred()) return -1;
    Py_INCREF(o);
    return push(r, o, idx);
}

int pop_mark(R *r, Py_ssize_t *from) {
    if (!r->nmarks) return unsupported("no mark");
    *from = r->marks[--r->nmarks];
    return 0;
}

PyObject *tuple_from(R *r, Py_ssize_t from) {
    PyObject *t = PyTuple_New(r->sp - from);
    if (!t) return NULL;
    for (Py_ssize_t i = from; i < r->sp; i++) PyTuple_SET_ITEM(t, i - from, r->stack[i]);
    r->sp = from;
    return t;
}

#define SHARED_STRING_MAX 64 /* bytes: longer strings are not shared */

PyObject *string(R *r, Py_ssize_t n) {
    if (n < 0) return unsupported("string length"), NULL;
    const unsigned char *p = take(r, n);
    if (!p) return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "surrogatepass");
    if (!s || n > SHARED_STRING_MAX) return s;
    PyObject *shared = PyDict_SetDefault(r->strings, s, s); /* borrowed */
    Py_XINCREF(shared);
    Py_DECREF(s);
    return shared;
}
