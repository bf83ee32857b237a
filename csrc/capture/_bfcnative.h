/* _bfcnative.h: the parts of gpuviz.capture._bfcnative (see _bfcnative.c) share this: the Core
 * object, its ownership (who holds the allocator; inline: the hot path takes it), and what each
 * part gives the others. Not a header for other extensions.
 *
 *   _bfcnative.c        the type, allocate and free (the hot path), rows, segments in and out
 *   _bfcnative_owner.c  the end of an operation (deferred frees, flushes, reports), lock/unlock
 *   _bfcnative_views.c  what Python reads: segments, chunks, stats, the invariant check, the
 *                       InvalidFreeError's words, and the rules of _bfc_rules.h as functions
 */
#ifndef GPUVIZ_BFCNATIVE_H
#define GPUVIZ_BFCNATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <string.h>

#include "_bfc_core.h"
#include "../log/_rows.h"
#include "../log/_rowsink.h"

#ifdef Py_GIL_DISABLED
#error "the native allocator relies on the GIL; the Python allocator is used instead"
#endif

typedef struct {
    PyObject_HEAD
    bfc_t bfc;
    /* recording sink: sink.obj is None when recording is off */
    row_sink sink;
    PyObject *flush, *tag_fn, *stack_fn;
    Py_ssize_t limit;
    int16_t device_index;
    int need_flush, emit_failed;
    /* callbacks and names */
    PyObject *device, *grow, *validate_size, *report, *invalid_free_error;
    /* ownership (see the top of this file) */
    PyThread_type_lock gate;
    unsigned long owner;
    int depth, gate_depth;
    PyObject *pending; /* list of deferred free addresses */
} Core;


/* ------------------------------------------------------------------ ownership */
static inline int held_here(Core *self) { return self->depth > 0 && self->owner == PyThread_get_thread_ident(); }

static inline void enter(Core *self) {
    if (held_here(self)) {
        self->depth++;
        return;
    }
    while (self->depth > 0) { /* another thread owns it and is calling into Python: wait */
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(self->gate, WAIT_LOCK);
        PyThread_release_lock(self->gate);
        Py_END_ALLOW_THREADS
    }
    self->owner = PyThread_get_thread_ident();
    self->depth = 1;
}

/* around code that may let go of the GIL while this thread owns the allocator */
static inline void gate_close(Core *self) {
    if (self->gate_depth++ == 0 && !PyThread_acquire_lock(self->gate, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS /* a waiter holds it for an instant */
        PyThread_acquire_lock(self->gate, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static inline void gate_open(Core *self) {
    if (--self->gate_depth == 0) PyThread_release_lock(self->gate);
}

static inline PyObject *call_out(Core *self, PyObject *fn, PyObject *arg) {
    gate_close(self);
    PyObject *r = arg ? PyObject_CallOneArg(fn, arg) : PyObject_CallNoArgs(fn);
    gate_open(self);
    return r;
}

/* _bfcnative_owner.c */
int bfcn_report_after(Core *self, const char *what);
int bfcn_leave(Core *self);
PyObject *Core_lock(Core *self, PyObject *unused);
PyObject *Core_unlock(Core *self, PyObject *unused);

/* _bfcnative.c */
int bfcn_do_free(Core *self, PyObject *address);

/* _bfcnative_views.c */
int64_t bfcn_as_address(PyObject *obj, int *ok);
void bfcn_bad_free(Core *self, PyObject *address, int32_t slot);
PyObject *Core_segments(Core *self, PyObject *unused);
PyObject *Core_chunks(Core *self, PyObject *base_obj);
PyObject *Core_lookup(Core *self, PyObject *address);
PyObject *Core_set_tag_id(Core *self, PyObject *args);
PyObject *Core_free_chunks(Core *self, PyObject *unused);
PyObject *Core_stats(Core *self, PyObject *unused);
PyObject *Core_clear_stats(Core *self, PyObject *unused);
PyObject *Core_largest_free(Core *self, PyObject *unused);
PyObject *Core_check_links(Core *self, PyObject *unused);
extern PyMethodDef bfcn_rule_functions[];

#endif
