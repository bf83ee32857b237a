/* Where a C recorder puts an EventLog's rows: the log's staging object, EventLog.row_sink(),
 * for _bfcnative.c and _heapcore.c. It is one of
 *
 *   - a gpuviz.log._staging.Arena (a log with the arena, the default): a row is written in
 *     place, straight into the chunk that keeps it, where the arena's window (_window.h) says,
 *     and Arena.take() (the log's flush) hands [start, write) out as a read-only view without
 *     copying it. Why in place: rows written into a small staging buffer and copied into the
 *     chunk at every flush cost a recorded allocate+free pair about twice what writing them once
 *     where they stay does (benchmarks/bench_core.py; README, "Native core").
 *   - a bytearray (a log without the arena: an import, or no compiler): rows are appended to it
 *     (bytearray_room, below) and copied out at every flush.
 *
 * Both hold the GIL throughout: a row is claimed and written within one C call, so rows from
 * several threads never interleave. The arena's C entry points come from the capsule
 * GV_STAGING_API, imported the first time an Arena is seen.
 */
#ifndef GPUVIZ_ROWSINK_H
#define GPUVIZ_ROWSINK_H

#ifndef Py_PYTHON_H
#error "include Python.h first"
#endif
#include <string.h>

#include "_window.h" /* the arena's window over its current chunk (see above), GV_ROW_BYTES */

#define GV_ROWS_MIN_ROOM (256 * GV_ROW_BYTES) /* first allocation of a staging bytearray, bytes */
#define GV_STAGING_API "gpuviz.log._staging._api"

typedef struct {
    PyTypeObject *arena_type;
    gv_window *(*window)(PyObject *arena);
    /* room for nbytes more at write (staged rows may move: re-read the window); -1 with an exception set */
    int (*make_room)(PyObject *arena, Py_ssize_t nbytes);
} gv_staging_api;

/* A recorder's handle on the staging object. */
typedef struct {
    PyObject *obj;      /* the bytearray or Arena, a strong reference; NULL or None: recording off */
    gv_window *window;  /* the arena's, NULL for a bytearray */
    int (*make_room)(PyObject *, Py_ssize_t);
} row_sink;

/* Room for ``nbytes`` more in the bytearray ``staged`` without another allocation: grown
 * geometrically where it lacks it (PyByteArray_Resize re-fits a buffer whose contents are below
 * half its allocation, so growing it row by row would copy it about every eighth of its size).
 * Touches only the public fields of PyByteArrayObject, keeping its invariants: ob_start[size] == 0
 * and size + (ob_start - ob_bytes) < ob_alloc. 0, or -1 with an exception set (out of memory, or
 * the buffer is exported). */
static inline int bytearray_room(PyObject *staged, Py_ssize_t nbytes) {
    PyByteArrayObject *b = (PyByteArrayObject *)staged;
    Py_ssize_t n = Py_SIZE(b);
    if (b->ob_exports == 0 && n + nbytes + (b->ob_start - b->ob_bytes) < b->ob_alloc) return 0;
    Py_ssize_t room = n + nbytes > 2 * n ? n + nbytes : 2 * n;
    if (room < GV_ROWS_MIN_ROOM) room = GV_ROWS_MIN_ROOM;
    if (PyByteArray_Resize(staged, room) < 0) return -1; /* keeps the first n bytes */
    Py_SET_SIZE(b, n);
    b->ob_start[n] = '\0';
    return 0;
}

/* Point ``sink`` at ``obj`` (a bytearray, an Arena, or None: nowhere). 0, or -1 with TypeError. */
static inline int row_sink_set(row_sink *sink, PyObject *obj) {
    gv_window *window = NULL;
    int (*make_room)(PyObject *, Py_ssize_t) = NULL;
    if (obj != Py_None && !PyByteArray_CheckExact(obj)) {
        static const gv_staging_api *api = NULL;
        if (api == NULL) {
            api = (const gv_staging_api *)PyCapsule_Import(GV_STAGING_API, 0);
            if (api == NULL) PyErr_Clear();
        }
        if (api == NULL || Py_TYPE(obj) != api->arena_type) {
            PyErr_Format(PyExc_TypeError, "rows go to a bytearray or a gpuviz.log._staging.Arena, not %.100s",
                         Py_TYPE(obj)->tp_name);
            return -1;
        }
        window = api->window(obj);
        make_room = api->make_room;
    }
    Py_INCREF(obj);
    Py_XSETREF(sink->obj, obj);
    sink->window = window;
    sink->make_room = make_room;
    return 0;
}

/* Room for ``nbytes`` more without another allocation, made now: a recorder reserves the rows
 * of a decision before it changes anything, so that running out of memory for the log leaves
 * the decision undone instead of done and unrecorded. 0, or -1 with MemoryError (or BufferError:
 * an exported bytearray) set. */
static inline int row_sink_reserve(row_sink *sink, Py_ssize_t nbytes) {
    gv_window *w = sink->window;
    if (w == NULL) return bytearray_room(sink->obj, nbytes);
    return w->end - w->write >= nbytes ? 0 : sink->make_room(sink->obj, nbytes);
}

/* A slot for one row, counted as staged; the caller writes the row into it before anything else
 * runs (the GIL held). NULL with an exception set where no room can be made. */
static inline unsigned char *row_sink_claim(row_sink *sink) {
    if (row_sink_reserve(sink, GV_ROW_BYTES) < 0) return NULL;
    gv_window *w = sink->window;
    unsigned char *slot;
    if (w == NULL) { /* a bytearray: one row longer */
        PyByteArrayObject *b = (PyByteArrayObject *)sink->obj;
        Py_ssize_t n = Py_SIZE(b);
        Py_SET_SIZE(b, n + GV_ROW_BYTES);
        b->ob_start[n + GV_ROW_BYTES] = '\0';
        slot = (unsigned char *)b->ob_start + n;
    } else {
        slot = (unsigned char *)w->write;
        w->write += GV_ROW_BYTES;
    }
    return slot;
}

/* Bytes staged (written since the last flush). */
static inline Py_ssize_t row_sink_staged(const row_sink *sink) {
    return sink->window != NULL ? sink->window->write - sink->window->start : PyByteArray_GET_SIZE(sink->obj);
}

/* Whether the staged rows are due for a flush: where the arena's window says (it knows whether
 * the log records to a file and where its chunk ends), or, for a bytearray, once ``limit`` bytes
 * (EventLog.row_sink()'s threshold) are staged. */
static inline int row_sink_due(const row_sink *sink, Py_ssize_t limit) {
    const gv_window *w = sink->window;
    return w != NULL ? w->write >= w->due : PyByteArray_GET_SIZE(sink->obj) >= limit;
}

#endif
