/* One event row as gpuviz.log.schema.ROW_STRUCT lays it out ("<qBbhhqqqqqqqii": 78 bytes,
 * little-endian, packed), written by every C recorder (_rowwriter.c, _bfcnative.c,
 * _pluggable.c) through pack_row, so the layout is written down once on the C side.
 *
 * rows_append (CPython only) adds a row to an EventLog's staging bytearray. PyByteArray_Resize
 * re-fits the buffer to its contents whenever they are below half its allocation, and the
 * log empties the buffer at every flush, so growing it row by row reallocates and copies it
 * about every eighth of its size: ~600 bytes copied per 78-byte row. rows_append writes in
 * place while the allocation has room and grows it geometrically otherwise; together with
 * gpuviz.log._staging.Arena.take (which empties the buffer keeping its allocation), the buffer is
 * allocated once and rows are copied once into it. Both hold the GIL and touch only the
 * public fields of PyByteArrayObject (size, ob_alloc, ob_start, ob_exports), keeping its
 * invariants: ob_start[size] == 0 and size + (ob_start - ob_bytes) < ob_alloc.
 */
#ifndef GPUVIZ_ROWS_H
#define GPUVIZ_ROWS_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rows are written as native little-endian integers"
#endif

#define ROW_BYTES 78
#define ROWS_MIN_ROOM (256 * ROW_BYTES) /* first allocation of a staging buffer, bytes */

typedef struct {
    int64_t time_ns, thread, address, size, requested, segment, largest, duration;
    int32_t tag, stack;
    int16_t device, peer;
    uint8_t kind;
    int8_t flags;
} row_t;

static inline void pack_row(unsigned char out[ROW_BYTES], const row_t *r) {
    unsigned char *p = out;
#define PUT(v) (memcpy(p, &(v), sizeof(v)), p += sizeof(v))
    PUT(r->time_ns);
    PUT(r->kind);
    PUT(r->flags);
    PUT(r->device);
    PUT(r->peer);
    PUT(r->thread);
    PUT(r->address);
    PUT(r->size);
    PUT(r->requested);
    PUT(r->segment);
    PUT(r->largest);
    PUT(r->duration);
    PUT(r->tag);
    PUT(r->stack);
#undef PUT
}

#ifdef Py_PYTHON_H
/* Append one packed row to the bytearray ``staged``; returns its new size in bytes, or -1
 * with an exception set (out of memory, or the buffer is exported). */
static inline Py_ssize_t rows_append(PyObject *staged, const unsigned char row[ROW_BYTES]) {
    PyByteArrayObject *b = (PyByteArrayObject *)staged;
    Py_ssize_t n = Py_SIZE(b);
    if (b->ob_exports > 0 || n + ROW_BYTES + (b->ob_start - b->ob_bytes) >= b->ob_alloc) {
        Py_ssize_t room = n + ROW_BYTES > 2 * n ? n + ROW_BYTES : 2 * n;
        if (room < ROWS_MIN_ROOM) room = ROWS_MIN_ROOM;
        if (PyByteArray_Resize(staged, room) < 0) return -1; /* keeps the first n bytes */
        Py_SET_SIZE(b, n);
        b->ob_start[n] = '\0';
    }
    memcpy(b->ob_start + n, row, ROW_BYTES);
    n += ROW_BYTES;
    Py_SET_SIZE(b, n);
    b->ob_start[n] = '\0';
    return n;
}
#endif

#endif
