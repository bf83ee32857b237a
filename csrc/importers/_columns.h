/* Buf: a column of fixed-size values written into a bytes object that grows in place
 * (_PyBytes_Resize, by half its size, from 16 KiB) and is shrunk to its length when taken. The
 * importers' C readers (_snapshotpickle.c, _xplanewire.c) write their columns with it. */
#ifndef GPUVIZ_IMPORTER_COLUMNS_H
#define GPUVIZ_IMPORTER_COLUMNS_H

#ifndef Py_PYTHON_H
#error "include Python.h first"
#endif
#include <string.h>

typedef struct {
    PyObject *bytes; /* NULL until the first value */
    Py_ssize_t len, cap;
} Buf;

/* append n bytes; 0, or -1 with MemoryError set */
static inline int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap + b->cap / 2 : 1 << 14;
        while (cap < b->len + n) cap += cap / 2;
        if (!b->bytes) {
            b->bytes = PyBytes_FromStringAndSize(NULL, cap);
            if (!b->bytes) return -1;
        } else if (_PyBytes_Resize(&b->bytes, cap) < 0) {
            return -1;
        }
        b->cap = cap;
    }
    memcpy(PyBytes_AS_STRING(b->bytes) + b->len, src, n);
    b->len += n;
    return 0;
}

/* the bytes written (a new reference), leaving b empty */
static inline PyObject *buf_take(Buf *b) {
    if (!b->bytes) return PyBytes_FromStringAndSize("", 0);
    PyObject *out = b->bytes;
    b->bytes = NULL;
    if (_PyBytes_Resize(&out, b->len) < 0) return NULL;
    b->len = b->cap = 0;
    return out;
}

#endif
