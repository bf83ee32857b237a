/* The containers of gpuviz.log._heapcore (included by _heapcore.c only): an int64 -> int64 hash
 * map with open addressing (Map) and a growable array of int64 (Vec), with bisection. */
#ifndef GPUVIZ_HEAPCORE_TABLES_H
#define GPUVIZ_HEAPCORE_TABLES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------ int64 -> int64 hash map */
typedef struct {
    int64_t *keys, *values;
    uint8_t *used;
    Py_ssize_t cap, n; /* cap: power of two */
} Map;

static inline Py_ssize_t slot_of(const Map *m, int64_t key) { /* splitmix64's finalizer: all bits mixed */
    uint64_t h = (uint64_t)key;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    return (Py_ssize_t)(h & (uint64_t)(m->cap - 1));
}

static Py_ssize_t map_find(const Map *m, int64_t key) {
    if (!m->cap) return -1;
    for (Py_ssize_t i = slot_of(m, key);; i = (i + 1) & (m->cap - 1)) {
        if (!m->used[i]) return -1;
        if (m->keys[i] == key) return i;
    }
}

static int map_grow(Map *m) {
    Map old = *m;
    Py_ssize_t cap = old.cap ? old.cap * 2 : 64;
    m->keys = PyMem_Calloc(cap, sizeof(int64_t));
    m->values = PyMem_Calloc(cap, sizeof(int64_t));
    m->used = PyMem_Calloc(cap, 1);
    if (!m->keys || !m->values || !m->used) {
        PyMem_Free(m->keys);
        PyMem_Free(m->values);
        PyMem_Free(m->used);
        *m = old;
        PyErr_NoMemory();
        return -1;
    }
    m->cap = cap;
    m->n = 0;
    for (Py_ssize_t i = 0; i < old.cap; i++) {
        if (!old.used[i]) continue;
        Py_ssize_t j = slot_of(m, old.keys[i]);
        while (m->used[j]) j = (j + 1) & (cap - 1);
        m->used[j] = 1;
        m->keys[j] = old.keys[i];
        m->values[j] = old.values[i];
        m->n++;
    }
    PyMem_Free(old.keys);
    PyMem_Free(old.values);
    PyMem_Free(old.used);
    return 0;
}

static int map_set(Map *m, int64_t key, int64_t value) {
    if ((m->n + 1) * 2 > m->cap && map_grow(m) < 0) return -1;
    Py_ssize_t i = slot_of(m, key);
    while (m->used[i] && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    if (!m->used[i]) {
        m->used[i] = 1;
        m->keys[i] = key;
        m->n++;
    }
    m->values[i] = value;
    return 0;
}

static void map_remove_at(Map *m, Py_ssize_t i) { /* backward-shift deletion */
    Py_ssize_t mask = m->cap - 1, j = i;
    m->used[i] = 0;
    m->n--;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->used[j]) return;
        Py_ssize_t home = slot_of(m, m->keys[j]);
        /* move j back to i when home is not cyclically in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            m->keys[i] = m->keys[j];
            m->values[i] = m->values[j];
            m->used[i] = 1;
            m->used[j] = 0;
            i = j;
        }
    }
}

static void map_free(Map *m) {
    PyMem_Free(m->keys);
    PyMem_Free(m->values);
    PyMem_Free(m->used);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------ int64 arrays */
typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} Vec;

static int vec_insert(Vec *a, Py_ssize_t at, int64_t x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? a->cap * 2 : 8;
        int64_t *v = PyMem_Realloc(a->v, cap * sizeof(int64_t));
        if (!v) return PyErr_NoMemory(), -1;
        a->v = v;
        a->cap = cap;
    }
    memmove(a->v + at + 1, a->v + at, (a->n - at) * sizeof(int64_t));
    a->v[at] = x;
    a->n++;
    return 0;
}

static void vec_remove(Vec *a, Py_ssize_t at) {
    memmove(a->v + at, a->v + at + 1, (a->n - at - 1) * sizeof(int64_t));
    a->n--;
}

static Py_ssize_t bisect_right(const int64_t *v, Py_ssize_t n, int64_t x) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < v[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

#endif
