/* The XSpace memory-event decoder (gpuviz.importers._xplanewire), shared by its parts:
 * _xplanewire.c (the walk over planes, lines, events and stats, and the module) and
 * _xplanewire_keys.c (each plane's metadata lookups and the table of distinct text keys).
 * setup.py's EXTRA_SOURCES compiles them into one extension. */
#ifndef GPUVIZ_XPLANEWIRE_H
#define GPUVIZ_XPLANEWIRE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_columns.h"

enum { VARINT = 0, FIXED64 = 1, LEN = 2, FIXED32 = 5 };
enum { S_ALLOCATOR, S_OP, S_DTYPE, S_SHAPE, S_TENSOR_SHAPE, S_REGION, S_CORE, N_TEXT,
       S_ADDR = N_TEXT, S_REQUESTED, S_SIZE, S_IN_USE, S_PEAK, S_FRAGMENTATION, S_STEP, N_SLOTS };
enum { C_TIME, C_ADDR, C_REQUESTED, C_SIZE, C_IN_USE, C_PEAK, C_STEP, C_THREAD, C_FLAGS, C_FRAGMENTATION, C_TEXTS,
       N_COLUMNS };
enum { V_ABSENT, V_NONE, V_TEXT, V_INT, V_UINT, V_DOUBLE };

extern PyObject *Unsupported; /* exception type */

/* -1 with Unsupported(why) set, unless an exception is set already */
int unsupported(const char *why);

/* ---------------------------------------------------------------- the wire format */
typedef struct {
    uint64_t number;
    int wire;
    uint64_t value;     /* VARINT/FIXED64/FIXED32: the value; LEN: the payload length */
    const uint8_t *at;  /* LEN: the payload */
} Field;

static inline int varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*p >= end) return unsupported("varint runs past the end of its message");
        uint8_t byte = *(*p)++;
        if (shift == 63 && byte > 1) return unsupported("varint beyond 64 bits");
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (byte < 0x80) {
            *out = result;
            return 0;
        }
    }
    return unsupported("varint longer than 10 bytes");
}

/* the next field of [*p, end): 1, or 0 at the end, -1 on a malformed field */
static inline int next_field(const uint8_t **p, const uint8_t *end, Field *f) {
    if (*p >= end) return 0;
    uint64_t key = 0;
    if (varint(p, end, &key) < 0) return -1;
    f->number = key >> 3;
    f->wire = (int)(key & 7);
    if (f->number == 0) return unsupported("field number 0");
    switch (f->wire) {
    case VARINT:
        return varint(p, end, &f->value) < 0 ? -1 : 1;
    case LEN:
        if (varint(p, end, &f->value) < 0) return -1;
        if (f->value > (uint64_t)(end - *p)) return unsupported("a field runs past the end of its message");
        f->at = *p;
        *p += f->value;
        return 1;
    case FIXED64:
    case FIXED32: {
        int n = f->wire == FIXED64 ? 8 : 4;
        if (end - *p < n) return unsupported("a fixed-width field runs past the end of its message");
        uint64_t v = 0;
        for (int i = n - 1; i >= 0; i--) v = v << 8 | (*p)[i];
        f->value = v;
        *p += n;
        return 1;
    }
    default:
        return unsupported("unsupported wire type");
    }
}

/* ---------------------------------------------------------------- per-plane lookups */
/* A plane's metadata ids (event and stat metadata) as pairs sorted by id: each event and stat finds
 * its metadata by binary search, so a plane with many metadata costs log(n) per lookup, not n. */
typedef struct {
    int64_t id;
    int value;
} Pair;

typedef struct {
    Pair *memory, *slots;
    Py_ssize_t n_memory, n_slots;
    PyObject *ref_names; /* borrowed */
} Plane;

/* ``dict`` {id: value} as pairs sorted by id (PyMem_Malloc'ed into *out): 0, or -1 with an exception set */
int pairs_of(PyObject *dict, Pair **out, Py_ssize_t *n);
/* the value of ``id`` among the pairs, or -1 */
int find(const Pair *pairs, Py_ssize_t n, int64_t id);

/* ---------------------------------------------------------------- text keys */
typedef struct {
    uint64_t hash;
    Py_ssize_t index; /* -1: empty */
} Slot;

typedef struct {
    Buf arena;              /* the keys, one after another */
    Py_ssize_t *offsets;    /* index -> offset in arena (count + 1 of them) */
    Py_ssize_t count, offsets_cap;
    Slot *table;
    Py_ssize_t table_cap;   /* a power of two */
    char *scratch;
    Py_ssize_t scratch_len, scratch_cap;
} Keys;

/* ---------------------------------------------------------------- decoding */
typedef struct {
    int type;
    int64_t i;
    uint64_t u;
    double d;
    const char *text;
    Py_ssize_t len;
} Value;

/* the text slots of ``values`` encoded as a key into k->scratch: 0, or -1 with an exception set */
int put_text_key(Keys *k, const Value *values);
/* the index of the key in scratch, adding it if new; -1 on error */
Py_ssize_t key_index(Keys *k);
/* the tuple of N_TEXT values a key encodes (see put_text_key); texts: str -> the same str */
PyObject *key_values(const char *p, PyObject *texts);

#endif
