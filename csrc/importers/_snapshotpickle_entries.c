/* Trace entries turned into rows (see _snapshotpickle.h): each dict appended to a device's
 * trace list becomes one row of columns and is dropped, its frames list a stack index. */
#include "_snapshotpickle.h"

/* The trace whose list is ``o``, or NULL (an error set where the lookup failed). A trace list is
 * kept empty, so only an empty list is looked up, and in a dict: found in constant time however
 * many device traces a file declares. */
Trace *trace_of(R *r, PyObject *o) {
    if (!PyList_CheckExact(o) || PyList_GET_SIZE(o) != 0 || r->ntraces == 0) return NULL;
    PyObject *id = PyLong_FromVoidPtr(o);
    if (!id) return NULL;
    PyObject *index = PyDict_GetItemWithError(r->trace_ids, id); /* borrowed */
    Py_DECREF(id);
    return index ? &r->traces[PyLong_AsSsize_t(index)] : NULL;
}

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
int appends(R *r, Py_ssize_t from) {
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

int setitems(R *r, Py_ssize_t from) {
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
int new_list(R *r) {
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
