/* gpuviz.capture._bfcnative, its part: what Python reads of the allocator (segments, chunks,
 * the free index, stats, the invariant check, the words of an invalid free), and TensorFlow's
 * rules of _bfc_rules.h as module functions, for the test that holds them equal to
 * gpuviz.capture.bfc_rules (tests/test_bfc_rules.py). See _bfcnative.h for the parts. */
#include "_bfcnative.h"

int64_t bfcn_as_address(PyObject *obj, int *ok) {
    /* as the Python allocator's dict lookup: ints and integers that say so (NumPy's) */
    *ok = 0;
    PyObject *index = PyLong_Check(obj) ? Py_NewRef(obj) : PyIndex_Check(obj) ? PyNumber_Index(obj) : NULL;
    if (index == NULL) {
        PyErr_Clear();
        return 0;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *ok = 1;
    return (int64_t)v;
}


static PyObject *hex_of(PyObject *obj) {
    PyObject *spec = PyUnicode_FromString("#x");
    if (spec == NULL) return NULL;
    PyObject *text = PyObject_Format(obj, spec);
    Py_DECREF(spec);
    return text;
}

/* InvalidFreeError with the Python allocator's words */
void bfcn_bad_free(Core *self, PyObject *address, int32_t slot) {
    PyObject *where = hex_of(address);
    if (where == NULL) return;
    PyObject *message = NULL;
    if (slot >= 0) {
        message = PyUnicode_FromFormat("%U: cannot free %U: it is not allocated (freed twice?)", self->device, where);
    } else {
        int ok;
        int64_t a = bfcn_as_address(address, &ok);
        bfc_t *b = &self->bfc;
        for (size_t i = 0; ok && message == NULL && i < b->hash_capacity; i++) {
            if (b->hash_keys[i] == INT64_MIN) continue;
            bfc_chunk *other = bfc_at(b, b->hash_values[i]);
            if (other->address < a && a < other->address + other->size) {
                PyObject *start = PyLong_FromLongLong(other->address);
                PyObject *start_hex = start ? hex_of(start) : NULL;
                Py_XDECREF(start);
                if (start_hex == NULL) {
                    Py_DECREF(where);
                    return;
                }
                message = PyUnicode_FromFormat("%U: cannot free %U: it points inside the chunk at %U, not to its start",
                                               self->device, where, start_hex);
                Py_DECREF(start_hex);
                if (message == NULL) {
                    Py_DECREF(where);
                    return;
                }
            }
        }
        if (message == NULL)
            message = PyUnicode_FromFormat("%U: cannot free %U: this allocator never allocated it", self->device, where);
    }
    Py_DECREF(where);
    if (message == NULL) return;
    PyErr_SetObject(self->invalid_free_error, message);
    Py_DECREF(message);
}

/* free with the lock held; -1 with an exception set on error */
PyObject *Core_segments(Core *self, PyObject *unused) {
    /* [(base, size, wholly_free)] in the order the segments were added */
    bfc_t *b = &self->bfc;
    PyObject *list = PyList_New((Py_ssize_t)b->segments);
    if (list == NULL) return NULL;
    for (size_t i = 0; i < b->segments; i++) {
        PyObject *item = Py_BuildValue("(LLO)", (long long)b->segment_bases[i], (long long)b->segment_sizes[i],
                                       bfc_segment_wholly_free(b, i) ? Py_True : Py_False);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static PyObject *chunk_tuple(const bfc_chunk *c) {
    return Py_BuildValue("(LLLOOi)", (long long)c->address, (long long)c->size, (long long)c->requested,
                         c->in_use ? Py_True : Py_False, c->tag ? (PyObject *)c->tag : Py_None, (int)c->tag_id);
}

PyObject *Core_chunks(Core *self, PyObject *base_obj) {
    /* the chunks of the segment at base, in address order: (address, size, requested, in_use, tag, tag_id) */
    long long base = PyLong_AsLongLong(base_obj);
    if (base == -1 && PyErr_Occurred()) return NULL;
    bfc_t *b = &self->bfc;
    int32_t slot = bfc_find(b, base);
    if (slot < 0) {
        PyErr_Format(PyExc_KeyError, "no chunk at %lld", base);
        return NULL;
    }
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    for (; slot >= 0; slot = bfc_at(b, slot)->next) {
        PyObject *item = chunk_tuple(bfc_at(b, slot));
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}

PyObject *Core_lookup(Core *self, PyObject *address) {
    /* the chunk starting at address as a chunk tuple, or None */
    int ok;
    int64_t a = bfcn_as_address(address, &ok);
    int32_t slot = ok ? bfc_find(&self->bfc, a) : -1;
    if (slot < 0) Py_RETURN_NONE;
    return chunk_tuple(bfc_at(&self->bfc, slot));
}

PyObject *Core_set_tag_id(Core *self, PyObject *args) {
    long long address;
    int tag_id;
    if (!PyArg_ParseTuple(args, "Li", &address, &tag_id)) return NULL;
    int32_t slot = bfc_find(&self->bfc, address);
    if (slot < 0) {
        PyErr_Format(PyExc_KeyError, "no chunk at %lld", address);
        return NULL;
    }
    bfc_at(&self->bfc, slot)->tag_id = tag_id;
    Py_RETURN_NONE;
}

static int append_free(void *ctx, const bfc_chunk *c) {
    PyObject *item = Py_BuildValue("(LL)", (long long)c->size, (long long)c->address);
    if (item == NULL) return -1;
    int r = PyList_Append((PyObject *)ctx, item);
    Py_DECREF(item);
    return r;
}

PyObject *Core_free_chunks(Core *self, PyObject *unused) {
    /* (size, address) of every free chunk, in index order */
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    if (bfc_visit_free(&self->bfc, append_free, list)) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

PyObject *Core_stats(Core *self, PyObject *unused) {
    bfc_t *b = &self->bfc;
    return Py_BuildValue("(LLLLLLL)", (long long)b->num_allocs, (long long)b->bytes_in_use,
                         (long long)b->peak_bytes_in_use, (long long)b->largest_alloc_size, (long long)b->pool_bytes,
                         (long long)b->peak_pool_bytes, (long long)bfc_largest_free(b));
}

PyObject *Core_clear_stats(Core *self, PyObject *unused) {
    self->bfc.num_allocs = 0;
    self->bfc.peak_bytes_in_use = self->bfc.bytes_in_use;
    self->bfc.largest_alloc_size = 0;
    Py_RETURN_NONE;
}

PyObject *Core_largest_free(Core *self, PyObject *unused) {
    return PyLong_FromLongLong(bfc_largest_free(&self->bfc));
}

typedef struct {
    const bfc_t *b;
    const bfc_chunk *last;
    int32_t count;
    const char *error;
} index_check;

static int check_free(void *ctx, const bfc_chunk *c) {
    index_check *k = ctx;
    if (c->in_use) k->error = "an allocated chunk is in the free index";
    else if (k->last && !(k->last->size < c->size || (k->last->size == c->size && k->last->address < c->address)))
        k->error = "the free index is out of order";
    else if ((c->left >= 0 && k->b->chunks[c->left].priority > c->priority) ||
             (c->right >= 0 && k->b->chunks[c->right].priority > c->priority))
        k->error = "the free index breaks its heap order";
    k->last = c;
    k->count++;
    return k->error != NULL;
}

PyObject *Core_check_links(Core *self, PyObject *unused) {
    /* None, or a description of the first broken link, order or count of the core's structures */
    bfc_t *b = &self->bfc;
    int32_t chunks = 0, free_chunks = 0;
    for (size_t i = 0; i < b->segments; i++) {
        int32_t slot = bfc_find(b, b->segment_bases[i]), previous = -1;
        if (slot < 0 || bfc_at(b, slot)->prev != -1) return PyUnicode_FromString("a segment does not start with a chunk");
        for (; slot >= 0; previous = slot, slot = bfc_at(b, slot)->next) {
            const bfc_chunk *c = bfc_at(b, slot);
            chunks++;
            free_chunks += !c->in_use;
            if (c->prev != previous || c->segment != b->segment_bases[i] || bfc_find(b, c->address) != slot)
                return PyUnicode_FromFormat("the chunk list of segment %lld is broken at %lld",
                                            (long long)b->segment_bases[i], (long long)c->address);
        }
    }
    if (chunks != b->live || (size_t)chunks != b->hash_count)
        return PyUnicode_FromFormat("%d chunks in segments, %d slots, %zu addresses", chunks, b->live, b->hash_count);
    index_check k = {b, NULL, 0, NULL};
    bfc_visit_free(b, check_free, &k);
    if (k.error) return PyUnicode_FromString(k.error);
    if (k.count != free_chunks || k.count != b->free_count)
        return PyUnicode_FromFormat("%d free chunks, %d in the free index", free_chunks, k.count);
    if (k.last != (b->largest < 0 ? NULL : bfc_at(b, b->largest))) /* the cached largest: the index's last */
        return PyUnicode_FromString("the free index's largest chunk is not its last");
    if (b->largest_size != (b->largest < 0 ? 0 : bfc_at(b, b->largest)->size))
        return PyUnicode_FromString("the free index's largest size is not its largest chunk's");
    if (PyList_GET_SIZE(self->pending))
        return PyUnicode_FromFormat("%zd deferred frees were never applied", PyList_GET_SIZE(self->pending));
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the rules, as functions */
static PyObject *rule_rounded_bytes(PyObject *unused, PyObject *args) {
    long long n;
    if (!PyArg_ParseTuple(args, "L", &n)) return NULL;
    if (n > INT64_MAX - 255) return PyErr_Format(PyExc_OverflowError, "%lld bytes round beyond int64", n);
    return PyLong_FromLongLong(bfc_rounded(n));
}

static PyObject *rule_bin_for_size(PyObject *unused, PyObject *args) {
    long long n;
    if (!PyArg_ParseTuple(args, "L", &n)) return NULL;
    return PyLong_FromLong(bfc_bin_for_size(n));
}

static PyObject *rule_should_split(PyObject *unused, PyObject *args) {
    long long chunk, rounded;
    if (!PyArg_ParseTuple(args, "LL", &chunk, &rounded)) return NULL;
    return PyBool_FromLong(bfc_should_split(chunk, rounded));
}

static PyObject *rule_first_segment_bytes(PyObject *unused, PyObject *args) {
    int growth;
    long long limit;
    if (!PyArg_ParseTuple(args, "pL", &growth, &limit)) return NULL;
    return PyLong_FromLongLong(bfc_first_segment(growth, limit));
}

static PyObject *rule_available_bytes(PyObject *unused, PyObject *args) {
    long long limit, pool;
    if (!PyArg_ParseTuple(args, "LL", &limit, &pool)) return NULL;
    return PyLong_FromLongLong(bfc_available(limit, pool));
}

static PyObject *rule_grow_step(PyObject *unused, PyObject *args) {
    long long rounded, step;
    if (!PyArg_ParseTuple(args, "LL", &rounded, &step)) return NULL;
    int64_t s = step;
    int increased = bfc_grow_step(rounded, &s);
    return Py_BuildValue("(LO)", (long long)s, increased ? Py_True : Py_False);
}

static PyObject *rule_step_after(PyObject *unused, PyObject *args) {
    long long step;
    int increased;
    if (!PyArg_ParseTuple(args, "Lp", &step, &increased)) return NULL;
    return PyLong_FromLongLong(bfc_step_after(step, increased));
}

static PyObject *rule_backpedal(PyObject *unused, PyObject *args) {
    long long n;
    if (!PyArg_ParseTuple(args, "L", &n)) return NULL;
    return PyLong_FromLongLong(bfc_backpedal(n));
}

static PyObject *rule_gc_helps(PyObject *unused, PyObject *args) {
    long long rounded, limit, pool, free_bytes;
    if (!PyArg_ParseTuple(args, "LLLL", &rounded, &limit, &pool, &free_bytes)) return NULL;
    return PyBool_FromLong(bfc_gc_helps(rounded, limit, pool, free_bytes));
}

/* extend(rounded, limit, pool, step, device_free): bfc_grow's Extend on a fresh core holding
 * pool bytes, over a device that refuses any reservation above device_free bytes: ((base, size)
 * or None, the step after) as gpuviz.capture.bfc_rules.extend answers */
typedef struct {
    int64_t device_free;
} refusing_device;

static int refuse_above(void *ctx, int64_t nbytes, int64_t *base) {
    *base = (int64_t)1 << 40;
    return nbytes > ((refusing_device *)ctx)->device_free ? -1 : 0;
}

static void give_back(void *ctx, int64_t base, int64_t size) {
    (void)ctx, (void)base, (void)size;
}

static PyObject *rule_extend(PyObject *unused, PyObject *args) {
    long long rounded, limit, pool, step, device_free;
    if (!PyArg_ParseTuple(args, "LLLLL", &rounded, &limit, &pool, &step, &device_free)) return NULL;
    bfc_t b;
    if (bfc_init(&b) < 0) return PyErr_NoMemory();
    b.pool_bytes = pool; /* as if segments of pool bytes were held */
    refusing_device device = {device_free};
    const bfc_upstream up = {refuse_above, give_back, NULL, &device};
    int64_t s = step;
    int grown = bfc_grow(&b, rounded, limit, 0, &s, &up, -1);
    int64_t size = grown > 0 ? b.pool_bytes - pool : 0;
    bfc_destroy(&b);
    if (grown < 0) return PyErr_NoMemory();
    if (grown == 0) return Py_BuildValue("(OL)", Py_None, (long long)s);
    return Py_BuildValue("((LL)L)", (long long)1 << 40, (long long)size, (long long)s);
}

PyMethodDef bfcn_rule_functions[] = {
    {"rounded_bytes", rule_rounded_bytes, METH_VARARGS, "_bfc_rules.h's bfc_rounded (RoundedBytes)"},
    {"bin_for_size", rule_bin_for_size, METH_VARARGS, "bfc_bin_for_size (BinNumForSize)"},
    {"should_split", rule_should_split, METH_VARARGS, "bfc_should_split(chunk_size, rounded)"},
    {"first_segment_bytes", rule_first_segment_bytes, METH_VARARGS, "bfc_first_segment(growth, memory_limit)"},
    {"available_bytes", rule_available_bytes, METH_VARARGS, "bfc_available(memory_limit, pool_bytes)"},
    {"grow_step", rule_grow_step, METH_VARARGS, "bfc_grow_step(rounded, step) -> (step, increased)"},
    {"step_after", rule_step_after, METH_VARARGS, "bfc_step_after(step, increased)"},
    {"backpedal", rule_backpedal, METH_VARARGS, "bfc_backpedal(nbytes)"},
    {"gc_helps", rule_gc_helps, METH_VARARGS, "bfc_gc_helps(rounded, memory_limit, pool_bytes, free_bytes)"},
    {"extend", rule_extend, METH_VARARGS,
     "extend(rounded, limit, pool, step, device_free) -> ((base, size) | None, step): the core's Extend over a "
     "device refusing more than device_free bytes"},
    {NULL, NULL, 0, NULL},
};
