/* The streaming reader of PyTorch snapshot pickles (gpuviz.importers._snapshotpickle), shared
 * by its parts: _snapshotpickle.c (the opcode loop and the module), _snapshotpickle_memo.c (the
 * input, the stack and the memo of the pickle machine) and _snapshotpickle_entries.c (trace
 * entries turned into rows of columns). setup.py's EXTRA_SOURCES compiles them into one extension. */
#ifndef GPUVIZ_SNAPSHOTPICKLE_H
#define GPUVIZ_SNAPSHOTPICKLE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_columns.h"

#define CHUNK (1 << 16) /* bytes read at a time (the buffer grows beyond it only for a longer opcode) */
#define STEP (1 << 24)  /* at most this many bytes asked of read() at once (a long string comes in steps) */

enum { HAS_ADDR = 1, HAS_SIZE = 2, HAS_TIME = 4, HAS_BLOCK_SIZE = 8 };
extern const char *ACTION_NAMES[]; /* the action codes' names, NULL-terminated */

extern PyObject *Unsupported;  /* exception type */
extern PyObject *CONSUMED;     /* memo slot of a dropped entry dict */
extern PyObject *STACKREF;     /* memo slot of a dropped frames list (its stack in memo_stack) */
extern PyObject *STACKREF_TAG; /* first item of the (tag, stack) tuple pushed for such a slot */
extern PyObject *action_strings[16];
extern PyObject *k_action, *k_addr, *k_size, *k_time_us, *k_block_size, *k_frames, *k_device_traces;

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

/* -1 with Unsupported(why) set, unless an exception is set already */
int unsupported(const char *why);

/* ---- the input (_snapshotpickle_memo.c): at least n bytes buffered, 0 or -1 */
int need(R *r, Py_ssize_t n);

/* the next n bytes of the input, or NULL with an exception set */
static inline const unsigned char *take(R *r, Py_ssize_t n) {
    if (r->end - r->pos < n && need(r, n) < 0) return NULL;
    const unsigned char *p = (const unsigned char *)r->buf + r->pos;
    r->pos += n;
    return p;
}

/* an n-byte little-endian unsigned integer */
static inline uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---- the stack and the memo (_snapshotpickle_memo.c) */
static inline Py_ssize_t region_start(R *r) { return r->nmarks ? r->marks[r->nmarks - 1] : 0; }
int push(R *r, PyObject *o, Py_ssize_t memo_index); /* steals o */
int memo_put(R *r, Py_ssize_t idx);
int memo_get(R *r, Py_ssize_t idx);
int pop_mark(R *r, Py_ssize_t *from);
PyObject *tuple_from(R *r, Py_ssize_t from);
PyObject *string(R *r, Py_ssize_t n); /* a str of the next n bytes (UTF-8), short ones shared */

/* ---- trace entries (_snapshotpickle_entries.c) */
Trace *trace_of(R *r, PyObject *o);
int appends(R *r, Py_ssize_t from);
int setitems(R *r, Py_ssize_t from);
int new_list(R *r);

#endif
