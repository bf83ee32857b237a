/* The lookups of the XSpace decoder (see _xplanewire.h): each plane's metadata ids, sorted for
 * binary search, and the table of the distinct text keys (the text stats of an event, encoded),
 * so that a million events with a few hundred distinct ops make a few hundred Python tuples. */
#include "_xplanewire.h"

#include <stdlib.h>

static int pair_order(const void *a, const void *b) {
    int64_t x = ((const Pair *)a)->id, y = ((const Pair *)b)->id;
    return (x > y) - (x < y);
}

int pairs_of(PyObject *dict, Pair **out, Py_ssize_t *n) {
    if (!PyDict_Check(dict)) return unsupported("expected a dict");
    *n = PyDict_Size(dict);
    *out = PyMem_Malloc(sizeof(Pair) * (*n + 1));
    if (!*out) return PyErr_NoMemory(), -1;
    PyObject *k, *v;
    Py_ssize_t pos = 0, i = 0;
    while (PyDict_Next(dict, &pos, &k, &v)) {
        long long id = PyLong_AsLongLong(k);
        long value = PyLong_AsLong(v);
        if (PyErr_Occurred()) return -1;
        (*out)[i].id = id;
        (*out)[i].value = (int)value;
        i++;
    }
    qsort(*out, (size_t)*n, sizeof(Pair), pair_order); /* the ids are a dict's keys: distinct */
    return 0;
}

int find(const Pair *pairs, Py_ssize_t n, int64_t id) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (pairs[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && pairs[lo].id == id ? pairs[lo].value : -1;
}

static uint64_t fnv1a(const char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

static int scratch_put(Keys *k, const void *src, Py_ssize_t n) {
    if (k->scratch_len + n > k->scratch_cap) {
        Py_ssize_t cap = (k->scratch_len + n) * 2 + 64;
        char *grown = PyMem_Realloc(k->scratch, cap);
        if (!grown) return PyErr_NoMemory(), -1;
        k->scratch = grown;
        k->scratch_cap = cap;
    }
    memcpy(k->scratch + k->scratch_len, src, n);
    k->scratch_len += n;
    return 0;
}

static int table_grow(Keys *k) {
    Py_ssize_t cap = k->table_cap ? k->table_cap * 2 : 256;
    Slot *table = PyMem_Malloc(sizeof(Slot) * cap);
    if (!table) return PyErr_NoMemory(), -1;
    for (Py_ssize_t i = 0; i < cap; i++) table[i].index = -1;
    for (Py_ssize_t i = 0; i < k->table_cap; i++) {
        if (k->table[i].index < 0) continue;
        Py_ssize_t j = (Py_ssize_t)(k->table[i].hash & (uint64_t)(cap - 1));
        while (table[j].index >= 0) j = (j + 1) & (cap - 1);
        table[j] = k->table[i];
    }
    PyMem_Free(k->table);
    k->table = table;
    k->table_cap = cap;
    return 0;
}

Py_ssize_t key_index(Keys *k) {
    if ((k->count + 1) * 2 > k->table_cap && table_grow(k) < 0) return -1;
    uint64_t h = fnv1a(k->scratch, k->scratch_len);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(k->table_cap - 1));
    const char *arena = k->arena.bytes ? PyBytes_AS_STRING(k->arena.bytes) : NULL;
    while (k->table[j].index >= 0) {
        Py_ssize_t i = k->table[j].index;
        if (k->table[j].hash == h && k->offsets[i + 1] - k->offsets[i] == k->scratch_len &&
            memcmp(arena + k->offsets[i], k->scratch, k->scratch_len) == 0)
            return i;
        j = (j + 1) & (k->table_cap - 1);
    }
    if (k->count + 2 > k->offsets_cap) {
        Py_ssize_t cap = k->offsets_cap * 2 + 64;
        Py_ssize_t *grown = PyMem_Realloc(k->offsets, sizeof(Py_ssize_t) * cap);
        if (!grown) return PyErr_NoMemory(), -1;
        k->offsets = grown;
        k->offsets_cap = cap;
    }
    if (k->count == 0) k->offsets[0] = 0;
    if (buf_put(&k->arena, k->scratch, k->scratch_len) < 0) return -1;
    k->offsets[k->count + 1] = k->arena.len;
    k->table[j].hash = h;
    k->table[j].index = k->count;
    return k->count++;
}

int put_text_key(Keys *k, const Value *values) {
    k->scratch_len = 0;
    for (int s = 0; s < N_TEXT; s++) {
        const Value *v = &values[s];
        uint8_t tag = (uint8_t)v->type;
        if (scratch_put(k, &tag, 1) < 0) return -1;
        if (v->type == V_TEXT) {
            uint32_t n = (uint32_t)v->len;
            if ((Py_ssize_t)n != v->len) return unsupported("a text over 4 GB");
            if (scratch_put(k, &n, 4) < 0 || scratch_put(k, v->text, v->len) < 0) return -1;
        } else if (v->type == V_INT) {
            if (scratch_put(k, &v->i, 8) < 0) return -1;
        } else if (v->type == V_UINT) {
            if (scratch_put(k, &v->u, 8) < 0) return -1;
        } else if (v->type == V_DOUBLE) {
            if (scratch_put(k, &v->d, 8) < 0) return -1;
        }
    }
    return 0;
}

PyObject *key_values(const char *p, PyObject *texts) {
    PyObject *out = PyTuple_New(N_TEXT);
    if (!out) return NULL;
    for (int s = 0; s < N_TEXT; s++) {
        int type = (uint8_t)*p++;
        PyObject *v = NULL;
        if (type == V_ABSENT) {
            v = Py_NewRef(Py_Ellipsis);
        } else if (type == V_NONE) {
            v = Py_NewRef(Py_None);
        } else if (type == V_TEXT) {
            uint32_t n;
            memcpy(&n, p, 4);
            PyObject *text = PyUnicode_DecodeUTF8(p + 4, n, "replace");
            p += 4 + n;
            if (text) {
                v = PyDict_SetDefault(texts, text, text);
                Py_XINCREF(v);
                Py_DECREF(text);
            }
        } else {
            int64_t i;
            uint64_t u;
            double x;
            if (type == V_INT) memcpy(&i, p, 8), v = PyLong_FromLongLong(i);
            else if (type == V_UINT) memcpy(&u, p, 8), v = PyLong_FromUnsignedLongLong(u);
            else memcpy(&x, p, 8), v = PyFloat_FromDouble(x);
            p += 8;
        }
        if (!v) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, s, v);
    }
    return out;
}
