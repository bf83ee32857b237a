/* gpuviz.importers._snapshotpickle: a streaming reader of PyTorch snapshot pickles (optional).
 *
 * read(read_bytes, stack_of, limit=-1) runs the pickle opcode stream of a snapshot (protocol 2-5) over
 * the plain-data subset a snapshot uses: dict, list, tuple, str, int, float, bool, None and
 * the memo. Every trace entry (a dict appended to one of the lists of the root dict's
 * "device_traces") becomes one row of columns as soon as it is complete and its dict is
 * dropped, so the snapshot is never whole in memory; its frames list becomes a stack index
 * through ``stack_of(frames)`` and is dropped too (a later reference to the same list reuses
 * the index). Everything else (segments, settings, annotations) is built as pickle.loads
 * builds it.
 *
 * Bounded work: ``limit`` is the most bytes the input can hold (the file's size; for a gzip file
 * its decompression limit), and a length that reaches past it (a string, a frame) is not read;
 * a long value is read in steps, so memory follows the bytes that arrive, never a length
 * declared. A memo index is at most the number of memo stores before it (the order every
 * pickler gives them), so the memo grows with the stores, never to an index named. A frames list
 * that several entries share becomes a stack once.
 *
 * Returns (root, traces): ``root`` as pickle.loads would return it except that each trace list
 * is empty, and ``traces`` = [(trace list, columns)] with columns a tuple of bytes:
 * action (uint8 codes, see ACTION_NAMES), flags (uint8, HAS_* bits), addr, size, time_us,
 * block_size (int64 each) and stack (int32).
 *
 * Whatever lies outside that subset -- any other opcode (GLOBAL, STACK_GLOBAL, REDUCE, BUILD,
 * INST, OBJ, NEWOBJ, PERSID, ...), a truncated or malformed stream, an entry whose values are
 * not the plain types gpuviz's converter reads the same way, a reference to a dropped entry --
 * a length past ``limit``, a memo index past the stores before it --
 * raises ``Unsupported`` before anything of the pickle is run; the caller then reads the file
 * with its restricted Unpickler, which gives the same result or the same error.
 */
#include "_snapshotpickle.h"

#if PY_VERSION_HEX < 0x030B0000 /* Python 3.10: the float unpacker was not public yet */
#define PyFloat_Unpack8(p, le) _PyFloat_Unpack8((const unsigned char *)(p), (le))
#endif

const char *ACTION_NAMES[] = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                              "segment_map", "segment_unmap", "oom", "snapshot", NULL};

PyObject *Unsupported;  /* exception type */
PyObject *CONSUMED;     /* memo slot of a dropped entry dict */
PyObject *STACKREF;     /* memo slot of a dropped frames list (its stack in memo_stack) */
PyObject *STACKREF_TAG; /* first item of the (tag, stack) tuple pushed for such a slot */
PyObject *action_strings[16];
PyObject *k_action, *k_addr, *k_size, *k_time_us, *k_block_size, *k_frames, *k_device_traces;

static PyObject *run(R *r) {
    for (;;) {
        const unsigned char *p = take(r, 1);
        if (!p) return NULL;
        unsigned char op = *p;
        Py_ssize_t from;
        switch (op) {
        case 0x80: /* PROTO */
            if (!(p = take(r, 1))) return NULL;
            if (*p < 2 || *p > 5) return unsupported("protocol"), NULL;
            break;
        case 0x95: /* FRAME: its length is not needed, but must fit the input */
            if (!(p = take(r, 8))) return NULL;
            if (r->limit >= 0 && le(p, 8) > (uint64_t)(r->limit - (r->received - (r->end - r->pos))))
                return unsupported("a frame past the end of the input"), NULL;
            break;
        case '.': /* STOP */
            if (r->sp != 1 || r->nmarks) return unsupported("stop with a stack"), NULL;
            r->sp = 0;
            return r->stack[0];
        case '(':
            if (r->nmarks == r->mcap) {
                Py_ssize_t cap = r->mcap ? r->mcap * 2 : 64;
                Py_ssize_t *m = PyMem_Realloc(r->marks, cap * sizeof(Py_ssize_t));
                if (!m) return PyErr_NoMemory();
                r->marks = m;
                r->mcap = cap;
            }
            r->marks[r->nmarks++] = r->sp;
            break;
        case '}':
            if (push(r, PyDict_New(), -1) < 0) return NULL;
            break;
        case ']':
            if (new_list(r) < 0) return NULL;
            break;
        case ')':
            if (push(r, PyTuple_New(0), -1) < 0) return NULL;
            break;
        case 't':
            if (pop_mark(r, &from) < 0 || push(r, tuple_from(r, from), -1) < 0) return NULL;
            break;
        case 0x85:
        case 0x86:
        case 0x87: {
            Py_ssize_t n = op - 0x84;
            if (r->sp - region_start(r) < n) return unsupported("tuple"), NULL;
            if (push(r, tuple_from(r, r->sp - n), -1) < 0) return NULL;
            break;
        }
        case 's':
            if (setitems(r, r->sp - 2) < 0) return NULL;
            break;
        case 'u':
            if (pop_mark(r, &from) < 0 || setitems(r, from) < 0) return NULL;
            break;
        case 'a':
            if (appends(r, r->sp - 1) < 0) return NULL;
            break;
        case 'e':
            if (pop_mark(r, &from) < 0 || appends(r, from) < 0) return NULL;
            break;
        case 'J':
            if (!(p = take(r, 4)) || push(r, PyLong_FromLong((int32_t)le(p, 4)), -1) < 0) return NULL;
            break;
        case 'K':
            if (!(p = take(r, 1)) || push(r, PyLong_FromLong(*p), -1) < 0) return NULL;
            break;
        case 'M':
            if (!(p = take(r, 2)) || push(r, PyLong_FromLong((long)le(p, 2)), -1) < 0) return NULL;
            break;
        case 0x8a: { /* LONG1 */
            if (!(p = take(r, 1))) return NULL;
            int n = *p;
            if (n > 8) return unsupported("an int wider than 64 bits"), NULL;
            if (!(p = take(r, n))) return NULL;
            uint64_t v = le(p, n);
            if (n && n < 8 && (p[n - 1] & 0x80)) v |= ~(uint64_t)0 << (8 * n);
            if (push(r, PyLong_FromLongLong((long long)(int64_t)v), -1) < 0) return NULL;
            break;
        }
        case 'G': {
            if (!(p = take(r, 8))) return NULL;
            double d = PyFloat_Unpack8((const char *)p, 0);
            if (d == -1.0 && PyErr_Occurred()) return NULL;
            if (push(r, PyFloat_FromDouble(d), -1) < 0) return NULL;
            break;
        }
        case 'N':
            if (push(r, Py_NewRef(Py_None), -1) < 0) return NULL;
            break;
        case 0x88:
            if (push(r, Py_NewRef(Py_True), -1) < 0) return NULL;
            break;
        case 0x89:
            if (push(r, Py_NewRef(Py_False), -1) < 0) return NULL;
            break;
        case 0x8c:
            if (!(p = take(r, 1)) || push(r, string(r, *p), -1) < 0) return NULL;
            break;
        case 'X':
            if (!(p = take(r, 4)) || push(r, string(r, (Py_ssize_t)le(p, 4)), -1) < 0) return NULL;
            break;
        case 0x8d:
            if (!(p = take(r, 8))) return NULL;
            if (le(p, 8) > (uint64_t)PY_SSIZE_T_MAX) return unsupported("string length"), NULL;
            if (push(r, string(r, (Py_ssize_t)le(p, 8)), -1) < 0) return NULL;
            break;
        case 0x94: /* MEMOIZE */
            if (memo_put(r, r->memo_len) < 0) return NULL;
            break;
        case 'q':
            if (!(p = take(r, 1)) || memo_put(r, *p) < 0) return NULL;
            break;
        case 'r':
            if (!(p = take(r, 4)) || memo_put(r, (Py_ssize_t)le(p, 4)) < 0) return NULL;
            break;
        case 'h':
            if (!(p = take(r, 1)) || memo_get(r, *p) < 0) return NULL;
            break;
        case 'j':
            if (!(p = take(r, 4)) || memo_get(r, (Py_ssize_t)le(p, 4)) < 0) return NULL;
            break;
        case '0':
            if (r->sp <= region_start(r)) return unsupported("pop"), NULL;
            Py_DECREF(r->stack[--r->sp]);
            break;
        case '1':
            if (pop_mark(r, &from) < 0) return NULL;
            while (r->sp > from) Py_DECREF(r->stack[--r->sp]);
            break;
        case '2':
            if (r->sp <= region_start(r)) return unsupported("dup"), NULL;
            if (push(r, Py_NewRef(r->stack[r->sp - 1]), r->stack_memo[r->sp - 1]) < 0) return NULL;
            break;
        default:
            return unsupported("an opcode outside the plain-data subset"), NULL;
        }
    }
}

static PyObject *py_read(PyObject *self, PyObject *args) {
    R r;
    memset(&r, 0, sizeof r);
    r.limit = -1;
    if (!PyArg_ParseTuple(args, "OO|n", &r.read, &r.stack_of, &r.limit)) return NULL;
    PyObject *result = NULL, *root = NULL, *traces = NULL;
    r.pending = PyDict_New();
    r.strings = PyDict_New();
    r.shared = PyDict_New();
    r.trace_ids = PyDict_New();
    if (!r.pending || !r.strings || !r.shared || !r.trace_ids) {
        Py_XDECREF(r.pending);
        Py_XDECREF(r.strings);
        Py_XDECREF(r.shared);
        Py_XDECREF(r.trace_ids);
        return NULL;
    }
    root = run(&r);
    if (root && r.stackrefs_out != 0) {
        PyErr_SetString(Unsupported, "a frames list referenced outside a trace entry");
        Py_CLEAR(root);
    }
    if (root) {
        traces = PyList_New(0);
        for (Py_ssize_t i = 0; traces && i < r.ntraces; i++) {
            Trace *t = &r.traces[i];
            PyObject *item = Py_BuildValue("(O(NNNNNNN))", t->list, buf_take(&t->action), buf_take(&t->flags),
                                           buf_take(&t->addr), buf_take(&t->size), buf_take(&t->time),
                                           buf_take(&t->block), buf_take(&t->stack));
            if (!item || PyList_Append(traces, item) < 0) Py_CLEAR(traces);
            Py_XDECREF(item);
        }
        if (traces) result = Py_BuildValue("(NN)", root, traces);
        else Py_DECREF(root);
    }
    for (Py_ssize_t i = 0; i < r.sp; i++) Py_DECREF(r.stack[i]);
    for (Py_ssize_t i = 0; i < r.memo_cap; i++)
        if (r.memo[i] && r.memo[i] != CONSUMED && r.memo[i] != STACKREF) Py_DECREF(r.memo[i]);
    for (Py_ssize_t i = 0; i < r.ntraces; i++) {
        Buf *bufs[] = {&r.traces[i].action, &r.traces[i].flags, &r.traces[i].addr, &r.traces[i].size,
                       &r.traces[i].time, &r.traces[i].block, &r.traces[i].stack};
        for (int j = 0; j < 7; j++) Py_XDECREF(bufs[j]->bytes);
        Py_DECREF(r.traces[i].list);
    }
    Py_XDECREF(r.dtlist);
    PyMem_Free(r.traces);
    PyMem_Free(r.stack);
    PyMem_Free(r.stack_memo);
    PyMem_Free(r.marks);
    PyMem_Free(r.memo);
    PyMem_Free(r.memo_stack);
    PyMem_Free(r.buf);
    Py_DECREF(r.pending);
    Py_DECREF(r.strings);
    Py_DECREF(r.shared);
    Py_DECREF(r.trace_ids);
    return result;
}

static PyMethodDef methods[] = {
    {"read", py_read, METH_VARARGS,
     "read(read_bytes, stack_of, limit=-1) -> (root, [(trace list, columns)]); limit: the most bytes the input holds"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_snapshotpickle", NULL, -1, methods};

PyMODINIT_FUNC PyInit__snapshotpickle(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Unsupported = PyErr_NewException("gpuviz.importers._snapshotpickle.Unsupported", PyExc_ValueError, NULL);
    CONSUMED = PyUnicode_FromString("<consumed trace entry>");
    STACKREF = PyUnicode_FromString("<dropped frames list>");
    STACKREF_TAG = PyUnicode_FromString("<frames list stack>");
    k_action = PyUnicode_InternFromString("action");
    k_addr = PyUnicode_InternFromString("addr");
    k_size = PyUnicode_InternFromString("size");
    k_time_us = PyUnicode_InternFromString("time_us");
    k_block_size = PyUnicode_InternFromString("block_size");
    k_frames = PyUnicode_InternFromString("frames");
    k_device_traces = PyUnicode_InternFromString("device_traces");
    for (int i = 0; ACTION_NAMES[i]; i++) action_strings[i] = PyUnicode_InternFromString(ACTION_NAMES[i]);
    if (!Unsupported || !CONSUMED || !STACKREF || !STACKREF_TAG) return NULL;
    Py_INCREF(Unsupported);
    if (PyModule_AddObject(m, "Unsupported", Unsupported) < 0) return NULL;
    PyObject *names = PyTuple_New(0);
    for (int i = 0; ACTION_NAMES[i]; i++) {
        PyObject *s = PyUnicode_FromString(ACTION_NAMES[i]);
        if (_PyTuple_Resize(&names, i + 1) < 0) return NULL;
        PyTuple_SET_ITEM(names, i, s);
    }
    if (PyModule_AddObject(m, "ACTION_NAMES", names) < 0) return NULL;
    return m;
}
