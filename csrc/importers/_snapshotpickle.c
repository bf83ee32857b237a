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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_columns.h"

#if PY_VERSION_HEX < 0x030B0000 /* Python 3.10: the float unpacker was not public yet */
#define PyFloat_Unpack8(p, le) _PyFloat_Unpack8((const unsigned char *)(p), (le))
#endif

#define CHUNK (1 << 16) /* bytes read at a time (the buffer grows beyond it only for a longer opcode) */
#define STEP (1 << 24)  /* at most this many bytes asked of read() at once (a long string comes in steps) */

enum { HAS_ADDR = 1, HAS_SIZE = 2, HAS_TIME = 4, HAS_BLOCK_SIZE = 8 };
static const char *ACTION_NAMES[] = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                                     "segment_map", "segment_unmap", "oom", "snapshot", NULL};

static PyObject *Unsupported;  /* exception type */
static PyObject *CONSUMED;     /* memo slot of a dropped entry dict */
static PyObject *STACKREF;     /* memo slot of a dropped frames list (its stack in memo_stack) */
static PyObject *STACKREF_TAG; /* first item of the (tag, stack) tuple pushed for such a slot */
static PyObject *action_strings[16];
static PyObject *k_action, *k_addr, *k_size, *k_time_us, *k_block_size, *k_frames, *k_device_traces;

typedef struct {
    PyObject *list; /* the trace list (kept empty) */
    Buf action, flags, addr, size, time, block, stack;
    Py_ssize_t n;
} Trace;

typedef struct {
    PyObject *read; /* read_bytes(n) -> bytes */
    PyObject *stack_of;
    char *buf;
    Py_ssize_t pos, end, cap;
    Py_ssize_t received; /* bytes read() returned so far */
    Py_ssize_t limit;    /* the most bytes the input can hold; -1: not known */
    int eof;
    PyObject **stack;
    Py_ssize_t *stack_memo; /* memo index each stack slot was stored at or fetched from, -1 if none */
    Py_ssize_t sp, scap;
    Py_ssize_t *marks;
    Py_ssize_t nmarks, mcap;
    PyObject **memo;
    int32_t *memo_stack;
    Py_ssize_t memo_cap, memo_len;
    Py_ssize_t stores; /* memo stores so far (PUT, BINPUT, LONG_BINPUT, MEMOIZE) */
    PyObject *shared;  /* id(frames list) -> (the list, its stack): a list several entries share, converted once */
    PyObject *dtlist;
    PyObject *trace_ids; /* id(trace list) -> its index in traces */
    Trace *traces;
    Py_ssize_t ntraces, tcap;
    PyObject *pending; /* id(entry dict) -> memo index of its frames list */
    PyObject *strings; /* short str -> itself: one object per distinct value (the memo keeps every str it
                          stores until the end; a value repeated in every entry, e.g. "N/A", is one) */
    Py_ssize_t stackrefs_out;
} R;

static int unsupported(const char *why) {
    if (!PyErr_Occurred()) PyErr_SetString(Unsupported, why);
    return -1;
}


/* ---------------------------------------------------------------- input */
static int need(R *r, Py_ssize_t n) {
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

static inline const unsigned char *take(R *r, Py_ssize_t n) {
    if (r->end - r->pos < n && need(r, n) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)r->buf + r->pos;
    r->pos += n;
    return p;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---------------------------------------------------------------- stack and memo */
static int push(R *r, PyObject *o, Py_ssize_t memo_index) { /* steals o */
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

static Py_ssize_t region_start(R *r) { return r->nmarks ? r->marks[r->nmarks - 1] : 0; }

static int memo_put(R *r, Py_ssize_t idx) {
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

/* The trace whose list is ``o``, or NULL (an error set where the lookup failed). A trace list is
 * kept empty, so only an empty list is looked up, and in a dict: found in constant time however
 * many device traces a file declares. */
static Trace *trace_of(R *r, PyObject *o) {
    if (!PyList_CheckExact(o) || PyList_GET_SIZE(o) != 0 || r->ntraces == 0) return NULL;
    PyObject *id = PyLong_FromVoidPtr(o);
    if (!id) return NULL;
    PyObject *index = PyDict_GetItemWithError(r->trace_ids, id); /* borrowed */
    Py_DECREF(id);
    return index ? &r->traces[PyLong_AsSsize_t(index)] : NULL;
}

static int memo_get(R *r, Py_ssize_t idx) {
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

/* ---------------------------------------------------------------- trace entries */
static int exact_i64(PyObject *v, int64_t *out) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)x;
    return 1;
}

/* The stack of the frames list ``v`` of ``entry``: from ``shared`` when another entry had the same list,
 * else through stack_of. A list memoized in the entry itself becomes STACKREF in the memo (later
 * references read the stack from there); one that is still referenced elsewhere (by the memo, or
 * by entries not yet converted) goes into ``shared``, which keeps it alive: so its address is its own. */
static int frames_stack(R *r, PyObject *entry, PyObject *v, int32_t *stack) {
    PyObject *id = PyLong_FromVoidPtr(v);
    if (!id) return -1;
    PyObject *known = PyDict_GetItemWithError(r->shared, id); /* borrowed */
    if (known) {
        *stack = (int32_t)PyLong_AsLong(PyTuple_GET_ITEM(known, 1));
        Py_DECREF(id);
        return 0;
    }
    if (PyErr_Occurred()) goto fail;
    PyObject *s = PyObject_CallOneArg(r->stack_of, v);
    if (!s) goto fail;
    long x = PyLong_AsLong(s);
    if (x == -1 && PyErr_Occurred()) {
        Py_DECREF(s);
        goto fail;
    }
    *stack = (int32_t)x;
    PyObject *key = PyLong_FromVoidPtr(entry);
    PyObject *slot = key ? PyDict_GetItemWithError(r->pending, key) : NULL;
    Py_XDECREF(key);
    if (slot) {
        Py_ssize_t idx = PyLong_AsSsize_t(slot);
        if (idx >= 0 && idx < r->memo_cap && r->memo[idx] == v) {
            Py_DECREF(r->memo[idx]);
            r->memo[idx] = STACKREF;
            r->memo_stack[idx] = *stack;
        }
    }
    if (PyErr_Occurred()) {
        Py_DECREF(s);
        goto fail;
    }
    if (Py_REFCNT(v) > 1) { /* the entry holds one reference; someone else the others */
        PyObject *pair = PyTuple_Pack(2, v, s);
        int err = !pair || PyDict_SetItem(r->shared, id, pair) < 0;
        Py_XDECREF(pair);
        if (err) {
            Py_DECREF(s);
            goto fail;
        }
    }
    Py_DECREF(s);
    Py_DECREF(id);
    return 0;
fail:
    Py_DECREF(id);
    return -1;
}

static int entry_row(R *r, Trace *t, PyObject *entry, Py_ssize_t entry_memo) {
    if (!PyDict_CheckExact(entry)) return unsupported("a trace entry that is not a dict");
    uint8_t action = 255, flags = 0;
    int64_t addr = 0, size = 0, time = 0, block = 0;
    int32_t stack = -1;
    PyObject *v = PyDict_GetItemWithError(entry, k_action);
    if (v && PyUnicode_CheckExact(v)) {
        for (int i = 0; ACTION_NAMES[i]; i++)
            if (PyUnicode_Compare(v, action_strings[i]) == 0) action = (uint8_t)i;
    }
    if (action == 255) return unsupported("a trace entry without a known action");
    if ((v = PyDict_GetItemWithError(entry, k_addr))) {
        if (!exact_i64(v, &addr)) return unsupported("addr");
        flags |= HAS_ADDR;
    }
    if ((v = PyDict_GetItemWithError(entry, k_size))) {
        if (!exact_i64(v, &size)) return unsupported("size");
        flags |= HAS_SIZE;
    }
    if ((v = PyDict_GetItemWithError(entry, k_time_us))) {
        if (!exact_i64(v, &time)) return unsupported("time_us");
        flags |= HAS_TIME;
    }
    if ((v = PyDict_GetItemWithError(entry, k_block_size))) {
        if (!exact_i64(v, &block)) return unsupported("block_size");
        flags |= HAS_BLOCK_SIZE;
    }
    if ((v = PyDict_GetItemWithError(entry, k_frames))) {
        if (PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) == 2 && PyTuple_GET_ITEM(v, 0) == STACKREF_TAG) {
            stack = (int32_t)PyLong_AsLong(PyTuple_GET_ITEM(v, 1));
            r->stackrefs_out--;
        } else {
            if (!PyList_CheckExact(v)) return unsupported("frames that are not a list");
            if (frames_stack(r, entry, v, &stack) < 0) return -1;
        }
    }
    if (PyErr_Occurred()) return -1;
    if (PyDict_GET_SIZE(r->pending)) {
        PyObject *key = PyLong_FromVoidPtr(entry);
        if (!key) return -1;
        int found = PyDict_Contains(r->pending, key);
        if (found > 0) found = PyDict_DelItem(r->pending, key);
        Py_DECREF(key);
        if (found < 0) return -1;
    }
    if (entry_memo >= 0 && entry_memo < r->memo_cap && r->memo[entry_memo] == entry) {
        Py_DECREF(entry);
        r->memo[entry_memo] = CONSUMED;
    }
    if (buf_put(&t->action, &action, 1) || buf_put(&t->flags, &flags, 1) || buf_put(&t->addr, &addr, 8) ||
        buf_put(&t->size, &size, 8) || buf_put(&t->time, &time, 8) || buf_put(&t->block, &block, 8) ||
        buf_put(&t->stack, &stack, 4))
        return -1;
    t->n++;
    return 0;
}

/* Append stack[from:] to the list at stack[from-1] (APPEND/APPENDS), or turn them into rows. */
static int appends(R *r, Py_ssize_t from) {
    if (from - 1 < region_start(r) || from > r->sp) return unsupported("append without a list");
    PyObject *target = r->stack[from - 1];
    if (!PyList_CheckExact(target)) return unsupported("append to something that is not a list");
    Trace *t = trace_of(r, target);
    if (!t && PyErr_Occurred()) return -1;
    for (Py_ssize_t i = from; i < r->sp; i++) {
        if (t) {
            if (entry_row(r, t, r->stack[i], r->stack_memo[i]) < 0) return -1;
        } else if (PyList_Append(target, r->stack[i]) < 0) {
            return -1;
        }
    }
    for (Py_ssize_t i = from; i < r->sp; i++) Py_DECREF(r->stack[i]);
    r->sp = from;
    return 0;
}

static int setitems(R *r, Py_ssize_t from) {
    if (from - 1 < region_start(r) || from > r->sp || (r->sp - from) % 2) return unsupported("setitems without a dict");
    PyObject *target = r->stack[from - 1];
    if (!PyDict_CheckExact(target)) return unsupported("setitems on something that is not a dict");
    for (Py_ssize_t i = from; i < r->sp; i += 2) {
        PyObject *key = r->stack[i], *value = r->stack[i + 1];
        if (PyDict_SetItem(target, key, value) < 0) return -1;
        if (PyList_CheckExact(value) && r->stack_memo[i + 1] >= 0 && PyUnicode_CheckExact(key) &&
            PyUnicode_Compare(key, k_frames) == 0) {
            PyObject *id = PyLong_FromVoidPtr(target), *slot = PyLong_FromSsize_t(r->stack_memo[i + 1]);
            int err = (!id || !slot) ? -1 : PyDict_SetItem(r->pending, id, slot);
            Py_XDECREF(id);
            Py_XDECREF(slot);
            if (err < 0) return -1;
        }
    }
    for (Py_ssize_t i = from; i < r->sp; i++) Py_DECREF(r->stack[i]);
    r->sp = from;
    return 0;
}

/* A new list: the root's "device_traces", or one device's trace inside it. */
static int new_list(R *r) {
    PyObject *list = PyList_New(0);
    if (!list) return -1;
    if (r->dtlist == NULL && r->sp >= 2 && PyDict_CheckExact(r->stack[0]) && (r->sp - 2) % 2 == 0 &&
        (r->nmarks == 0 || (r->nmarks == 1 && r->marks[0] == 1)) && PyUnicode_CheckExact(r->stack[r->sp - 1]) &&
        PyUnicode_Compare(r->stack[r->sp - 1], k_device_traces) == 0) {
        r->dtlist = Py_NewRef(list);
    } else if (r->dtlist != NULL &&
               ((r->sp >= 1 && r->stack[r->sp - 1] == r->dtlist) ||
                (r->nmarks && region_start(r) >= 1 && r->stack[region_start(r) - 1] == r->dtlist))) {
        if (r->ntraces == r->tcap) {
            Py_ssize_t cap = r->tcap ? r->tcap * 2 : 8;
            Trace *t = PyMem_Realloc(r->traces, cap * sizeof(Trace));
            if (!t) {
                Py_DECREF(list);
                return PyErr_NoMemory(), -1;
            }
            r->traces = t;
            r->tcap = cap;
        }
        memset(&r->traces[r->ntraces], 0, sizeof(Trace));
        PyObject *id = PyLong_FromVoidPtr(list), *index = PyLong_FromSsize_t(r->ntraces);
        int err = !id || !index || PyDict_SetItem(r->trace_ids, id, index) < 0;
        Py_XDECREF(id);
        Py_XDECREF(index);
        if (err) {
            Py_DECREF(list);
            return -1;
        }
        r->traces[r->ntraces].list = Py_NewRef(list);
        r->ntraces++;
    }
    return push(r, list, -1);
}

static int pop_mark(R *r, Py_ssize_t *from) {
    if (!r->nmarks) return unsupported("no mark");
    *from = r->marks[--r->nmarks];
    return 0;
}

static PyObject *tuple_from(R *r, Py_ssize_t from) {
    PyObject *t = PyTuple_New(r->sp - from);
    if (!t) return NULL;
    for (Py_ssize_t i = from; i < r->sp; i++) PyTuple_SET_ITEM(t, i - from, r->stack[i]);
    r->sp = from;
    return t;
}

#define SHARED_STRING_MAX 64 /* bytes: longer strings are not shared */

static PyObject *string(R *r, Py_ssize_t n) {
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
