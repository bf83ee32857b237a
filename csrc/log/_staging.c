/* gpuviz.log._staging: where an EventLog's rows are written and kept (optional; the log
 * stages rows in a bytearray and keeps flushed ones as bytes objects otherwise).
 *
 * Arena() is a log's staging object (EventLog.row_sink()): recorders write rows in place at the
 * end of its current chunk (the window of csrc/log/_rowsink.h: C recorders through the capsule
 * _api, Python ones with extend()), and take() -- the log's flush -- returns the rows staged
 * since the last take as a read-only view of the chunk, without copying them. len() is the
 * bytes staged. Holding the GIL throughout, each call is one step for the recorders.
 *
 * Why chunks: a log recorded in memory keeps every row, so each of its pages is touched
 * fresh once. One bytes object per flush (~160 KB) is one mmap by malloc and ~40 page
 * faults, one per 4 KiB: on this project's VM most of a recorded allocate+free pair's
 * recording cost. Chunks are anonymous memory: the first 512 KiB (a small log never needs
 * more), then 2 MiB doubling to 8 MiB, aligned to and advised as transparent huge pages
 * (MADV_HUGEPAGE; where the kernel gives none, plain pages), so they fault once per 2 MiB. A
 * chunk lives while any view of it does (buffer exports); once none does (the log split its
 * blocks into columns when it was read), the arena rewinds and reuses it (the staged rows, at
 * most one flush's worth, move to its start): warm memory. When the current chunk is full the
 * arena takes the next one on the recording thread, and the staged rows move there.
 *
 * Why a pool: even faulted once per 2 MiB, a fresh page is one the kernel zeroes first, and
 * that zeroing was most of what recording in memory cost (an allocate+free pair records ~3
 * rows, ~230 bytes: ~1 GB/s of fresh memory at full speed). So a chunk no longer used (its
 * log dropped, or its rows split into columns) is not unmapped but kept in a small pool
 * (POOL_BYTES in all), and the next chunk of that size any arena needs comes from there,
 * its pages warm: no fault and no zeroing. Only past the pool is a chunk mapped (mmap and
 * munmap to align it: 15-50 us on this project's VM, once per chunk, against the 1-20 ms of
 * rows a chunk holds). No other thread is involved, so recording costs the same
 * on a machine whose cores are all busy (docs/architecture.md, "The recording path").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "_rows.h"
#include "_rowsink.h"

#ifdef Py_GIL_DISABLED
#error "the arena relies on the GIL; EventLog stages rows in a bytearray instead"
#endif

#define HUGE_PAGE ((Py_ssize_t)2 << 20)     /* bytes; chunks are aligned to it */
#define CHUNK_FIRST ((Py_ssize_t)512 << 10) /* the first chunk of an arena (plain pages), bytes */
#define CHUNK_LARGEST ((Py_ssize_t)8 << 20) /* then 2 MiB, doubling up to this, bytes */
#define POOL_BYTES ((Py_ssize_t)32 << 20)   /* chunks kept for reuse, bytes in all */
#define POOL_SLOTS 64

/* Released chunks' memory, kept mapped for the next chunk (all under the GIL). */
static struct {
    char *base;
    Py_ssize_t size;
} pool[POOL_SLOTS];
static int pool_count;
static Py_ssize_t pool_bytes;
static unsigned long long pool_reused, pool_mapped; /* chunks taken from the pool / mapped fresh */

/* Keep [base, base + size) for reuse; 0 when the pool is full (the caller unmaps it). */
static int pool_put(char *base, Py_ssize_t size) {
    if (pool_count == POOL_SLOTS || pool_bytes + size > POOL_BYTES) return 0;
    pool[pool_count].base = base;
    pool[pool_count].size = size;
    pool_count++;
    pool_bytes += size;
    return 1;
}

/* A pooled chunk of exactly ``size`` bytes (chunks come in a few sizes: an arena's are the same
 * whether mapped or reused), taken out, or NULL. */
static char *pool_take(Py_ssize_t size) {
    for (int i = pool_count - 1; i >= 0; i--) {
        if (pool[i].size != size) continue;
        char *base = pool[i].base;
        pool_bytes -= size;
        pool[i] = pool[--pool_count];
        return base;
    }
    return NULL;
}

/* ------------------------------------------------------------------ Chunk */
typedef struct {
    PyObject_HEAD
    char *base;         /* HUGE_PAGE-aligned anonymous mapping */
    Py_ssize_t size;    /* bytes, a multiple of 4 KiB */
    Py_ssize_t exports; /* buffer views alive */
} Chunk;

static int Chunk_getbuffer(PyObject *obj, Py_buffer *view, int flags) {
    Chunk *self = (Chunk *)obj;
    if (PyBuffer_FillInfo(view, obj, self->base, self->size, 1, flags) < 0) return -1; /* read-only */
    self->exports++;
    return 0;
}

static void Chunk_releasebuffer(PyObject *obj, Py_buffer *view) {
    (void)view;
    ((Chunk *)obj)->exports--;
}

static void Chunk_dealloc(PyObject *obj) {
    Chunk *self = (Chunk *)obj;
    if (self->base != NULL && !pool_put(self->base, self->size)) munmap(self->base, (size_t)self->size);
    Py_TYPE(obj)->tp_free(obj);
}

static PyBufferProcs Chunk_as_buffer = {Chunk_getbuffer, Chunk_releasebuffer};

static PyTypeObject ChunkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpuviz.log._staging.Chunk",
    .tp_doc = "Anonymous memory holding flushed rows (read-only as a buffer).",
    .tp_basicsize = sizeof(Chunk),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = Chunk_dealloc,
    .tp_as_buffer = &Chunk_as_buffer,
};

/* A chunk of ``size`` bytes (a multiple of 4 KiB): a pooled one, or mapped now; NULL with
 * MemoryError set. */
static Chunk *chunk_new(Py_ssize_t size) {
    char *reused = pool_take(size);
    if (reused != NULL) {
        Chunk *chunk = PyObject_New(Chunk, &ChunkType);
        if (chunk == NULL) {
            if (!pool_put(reused, size)) munmap(reused, (size_t)size);
            return NULL;
        }
        chunk->base = reused;
        chunk->size = size;
        chunk->exports = 0;
        pool_reused++;
        return chunk;
    }
    size_t span = (size_t)(size + HUGE_PAGE); /* room to align the start */
    char *map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return (Chunk *)PyErr_NoMemory();
    char *base = (char *)(((uintptr_t)map + HUGE_PAGE - 1) & ~((uintptr_t)HUGE_PAGE - 1));
    if (base > map) munmap(map, (size_t)(base - map));
    if (base + size < map + span) munmap(base + size, (size_t)(map + span - (base + size)));
#ifdef MADV_HUGEPAGE
    if (size >= HUGE_PAGE) (void)madvise(base, (size_t)size, MADV_HUGEPAGE); /* plain pages where refused */
#endif
    Chunk *chunk = PyObject_New(Chunk, &ChunkType);
    if (chunk == NULL) {
        munmap(base, (size_t)size);
        return NULL;
    }
    chunk->base = base;
    chunk->size = size;
    chunk->exports = 0;
    pool_mapped++;
    return chunk;
}

#define CHUNK_BASE(c) ((c)->base)
#define CHUNK_SIZE(c) ((c)->size)

/* ------------------------------------------------------------------ Arena */
typedef struct {
    PyObject_HEAD
    Chunk *chunk;         /* the chunk being written, or NULL */
    gv_window window;     /* rows [start, write) of chunk are staged; all NULL while chunk is */
    Py_ssize_t next_size; /* bytes of the next chunk */
    Py_ssize_t flush;     /* staged bytes due for a take (0: only near the chunk's end; see set_flush) */
} Arena;

static PyObject *Arena_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Arena() takes no arguments");
        return NULL;
    }
    Arena *self = (Arena *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->next_size = CHUNK_FIRST;
    return (PyObject *)self;
}

static void Arena_dealloc(PyObject *obj) {
    Py_CLEAR(((Arena *)obj)->chunk);
    Py_TYPE(obj)->tp_free(obj);
}

/* A take this close to the chunk's end leaves (almost) nothing staged to move to the next one. */
#define DUE_MARGIN ((Py_ssize_t)128 * ROW_BYTES)

/* Set the window's due (_window.h): the staged rows are due for a take once ``flush`` bytes are
 * staged (a log recording to a file: its crash bound), and DUE_MARGIN before the chunk's end
 * anyway (nothing left to move to the next chunk). A log recorded in memory (flush 0) is so
 * flushed once a chunk instead of every flush_rows // 3 rows: fewer calls into Python on the
 * recording thread. */
static void arena_set_due(Arena *self) {
    gv_window *w = &self->window;
    if (self->chunk == NULL) return;
    char *last = w->end - DUE_MARGIN;
    char *due = w->write < last ? last : w->end;
    if (self->flush > 0 && self->flush < due - w->start) due = w->start + self->flush;
    w->due = due;
}

/* Move the staged rows to the start of the chunk, when no view of it is alive. */
static void arena_rewind(Arena *self) {
    gv_window *w = &self->window;
    if (self->chunk == NULL || self->chunk->exports > 0 || w->start == CHUNK_BASE(self->chunk)) return;
    Py_ssize_t staged = w->write - w->start;
    memmove(CHUNK_BASE(self->chunk), w->start, (size_t)staged);
    w->start = CHUNK_BASE(self->chunk);
    w->write = w->start + staged;
}

/* Room for nbytes more at the window's write end: in the current chunk, rewound if no view of it is
 * alive, or in a new one mapped now, the staged rows moved there. 0, or -1 with MemoryError set. */
static int arena_make_room(PyObject *obj, Py_ssize_t nbytes) {
    Arena *self = (Arena *)obj;
    gv_window *w = &self->window;
    if (w->end - w->write >= nbytes) return 0;
    arena_rewind(self);
    if (w->end - w->write >= nbytes) {
        arena_set_due(self);
        return 0;
    }
    Py_ssize_t staged = w->write - w->start, need = staged + nbytes, size = self->next_size;
    if (need > size) size = (need + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    Chunk *chunk = chunk_new(size);
    if (chunk == NULL) return -1;
    Py_ssize_t grown = self->next_size < HUGE_PAGE ? HUGE_PAGE : 2 * self->next_size; /* the size after it */
    self->next_size = grown < CHUNK_LARGEST ? grown : CHUNK_LARGEST;
    if (staged) memcpy(CHUNK_BASE(chunk), w->start, (size_t)staged);
    Py_XSETREF(self->chunk, chunk); /* the old one lives on in its views */
    w->start = CHUNK_BASE(chunk);
    w->write = w->start + staged;
    w->end = w->start + CHUNK_SIZE(chunk);
    arena_set_due(self);
    return 0;
}

static gv_window *arena_window(PyObject *obj) { return &((Arena *)obj)->window; }

static gv_staging_api staging_api = {NULL, arena_window, arena_make_room}; /* arena_type set at import */

static PyObject *Arena_take(PyObject *obj, PyObject *unused) {
    (void)unused;
    Arena *self = (Arena *)obj;
    gv_window *w = &self->window;
    if (self->chunk == NULL) return PyMemoryView_FromMemory((char *)"", 0, PyBUF_READ);
    arena_rewind(self); /* no view holds the chunk: these rows go to its start */
    PyObject *whole = PyMemoryView_FromObject((PyObject *)self->chunk);
    if (whole == NULL) return NULL;
    Py_ssize_t first = w->start - CHUNK_BASE(self->chunk);
    PyObject *view = PySequence_GetSlice(whole, first, w->write - CHUNK_BASE(self->chunk));
    Py_DECREF(whole);
    if (view == NULL) return NULL;
    w->start = w->write;
    arena_set_due(self);
    return view;
}

static PyObject *Arena_set_flush(PyObject *obj, PyObject *arg) {
    Py_ssize_t nbytes = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (nbytes == -1 && PyErr_Occurred()) return NULL;
    if (nbytes < 0) {
        PyErr_Format(PyExc_ValueError, "set_flush: a number of bytes >= 0, not %zd", nbytes);
        return NULL;
    }
    Arena *self = (Arena *)obj;
    self->flush = nbytes;
    arena_set_due(self);
    Py_RETURN_NONE;
}

static PyObject *Arena_due(PyObject *obj, PyObject *unused) {
    (void)unused;
    gv_window *w = &((Arena *)obj)->window;
    return PyLong_FromSsize_t(w->due - w->start);
}

static PyObject *Arena_extend(PyObject *obj, PyObject *data) {
    Arena *self = (Arena *)obj;
    Py_buffer buffer;
    if (PyObject_GetBuffer(data, &buffer, PyBUF_SIMPLE) < 0) return NULL;
    int failed = buffer.len > 0 && arena_make_room(obj, buffer.len);
    if (!failed && buffer.len > 0) {
        memcpy(self->window.write, buffer.buf, (size_t)buffer.len);
        self->window.write += buffer.len;
    }
    PyBuffer_Release(&buffer);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

static Py_ssize_t Arena_length(PyObject *obj) {
    gv_window *w = &((Arena *)obj)->window;
    return w->write - w->start;
}

static PyObject *Arena_chunk_bytes(PyObject *obj, PyObject *unused) {
    (void)unused;
    Arena *self = (Arena *)obj;
    return Py_BuildValue("nn", self->chunk ? CHUNK_SIZE(self->chunk) : 0,
                         self->chunk ? self->window.write - CHUNK_BASE(self->chunk) : 0);
}

/* None, or what breaks the window's invariants (see _window.h). */
static PyObject *Arena_check(PyObject *obj, PyObject *unused) {
    (void)unused;
    Arena *self = (Arena *)obj;
    gv_window *w = &self->window;
    if (self->chunk == NULL) {
        if (w->start || w->write || w->end || w->due) return PyUnicode_FromString("a window without a chunk");
        Py_RETURN_NONE;
    }
    char *base = CHUNK_BASE(self->chunk);
    if (w->end != base + CHUNK_SIZE(self->chunk)) return PyUnicode_FromString("the window does not end with its chunk");
    if (!(base <= w->start && w->start <= w->write && w->write <= w->end))
        return PyUnicode_FromString("the window is out of order: not base <= start <= write <= end");
    if (!(w->start <= w->due && w->due <= w->end)) return PyUnicode_FromString("the window's due is not within start..end");
    Py_RETURN_NONE;
}

static PySequenceMethods Arena_as_sequence = {.sq_length = Arena_length};

static PyMethodDef Arena_methods[] = {
    {"take", Arena_take, METH_NOARGS,
     "take() -> memoryview: the bytes staged since the last take, read-only, where they were written "
     "(no copy); len() is 0 after it"},
    {"extend", Arena_extend, METH_O, "extend(data): stage the bytes of data (a bytes-like object)"},
    {"set_flush", Arena_set_flush, METH_O,
     "set_flush(nbytes): the staged rows are due for a take (recorders call the log's flush) once nbytes are "
     "staged, and near the current chunk's end anyway; 0 (the default): only there"},
    {"due", Arena_due, METH_NOARGS, "due() -> the staged bytes at which a take is due (see set_flush)"},
    {"check", Arena_check, METH_NOARGS, "check() -> None, or what breaks the window's invariants, in words"},
    {"chunk_bytes", Arena_chunk_bytes, METH_NOARGS,
     "chunk_bytes() -> (size, used): the current chunk's size and the bytes of it written (taken or staged)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ArenaType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpuviz.log._staging.Arena",
    .tp_doc = "Arena(): an EventLog's staging object; rows are written into huge-page chunks and kept "
              "there (see the module's doc).",
    .tp_basicsize = sizeof(Arena),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Arena_new,
    .tp_dealloc = Arena_dealloc,
    .tp_methods = Arena_methods,
    .tp_as_sequence = &Arena_as_sequence,
};

/* ------------------------------------------------------------------ split */
/* split(rows, columns, first_seq): the rows (a bytes-like object of whole ROW_BYTES rows) into
 * columns, one pass: ``columns`` is a sequence of the 15 writable, C-contiguous buffers of
 * gpuviz.log.schema.DTYPES in order (seq, then the row's fields: _rows.h's ROW_FIELDS), each of
 * exactly as many values as there are rows, of the column's width; seq is first_seq, +1 per row.
 * Nothing is written unless every buffer fits. (EventLog's flush without this module does the
 * same with one NumPy copy per column; tests hold the two together.) */
static const Py_ssize_t split_widths[SPLIT_COLUMNS] = SPLIT_WIDTHS;

static PyObject *split(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "split(rows, columns, first_seq)");
        return NULL;
    }
    long long first_seq = PyLong_AsLongLong(args[2]);
    if (first_seq == -1 && PyErr_Occurred()) return NULL;
    PyObject *columns = PySequence_Fast(args[1], "split: columns must be a sequence of buffers");
    if (columns == NULL) return NULL;
    Py_buffer rows, out[SPLIT_COLUMNS];
    int held = 0, ok = 0;
    if (PySequence_Fast_GET_SIZE(columns) != SPLIT_COLUMNS) {
        PyErr_Format(PyExc_ValueError, "split: %d columns expected, got %zd", SPLIT_COLUMNS,
                     PySequence_Fast_GET_SIZE(columns));
        goto done;
    }
    if (PyObject_GetBuffer(args[0], &rows, PyBUF_SIMPLE) < 0) goto done;
    if (rows.len % ROW_BYTES != 0) {
        PyErr_Format(PyExc_ValueError, "split: %zd bytes are not whole rows of %d bytes", rows.len, ROW_BYTES);
        goto release;
    }
    Py_ssize_t n = rows.len / ROW_BYTES;
    for (; held < SPLIT_COLUMNS; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(columns, held), &out[held], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            goto release;
        if (out[held].len != n * split_widths[held] || (out[held].itemsize != split_widths[held] && n > 0)) {
            PyErr_Format(PyExc_ValueError, "split: column %d holds %zd bytes of %zd-byte values, not %zd values of %zd bytes",
                         held, out[held].len, out[held].itemsize, n, split_widths[held]);
            held++;
            goto release;
        }
    }
    void *bufs[SPLIT_COLUMNS];
    for (int k = 0; k < SPLIT_COLUMNS; k++) bufs[k] = out[k].buf;
    split_rows_into(bufs, rows.buf, (size_t)n, (int64_t)first_seq);
    ok = 1;
release:
    while (held > 0) PyBuffer_Release(&out[--held]);
    PyBuffer_Release(&rows);
done:
    Py_DECREF(columns);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *pool_stats(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return Py_BuildValue("{sisnsKsK}", "chunks", pool_count, "bytes", pool_bytes, "reused", pool_reused, "mapped",
                         pool_mapped);
}

static PyMethodDef module_methods[] = {
    {"pool", pool_stats, METH_NOARGS,
     "pool() -> {chunks, bytes: kept for reuse now; reused: chunks taken from the pool, mapped: chunks mapped fresh, "
     "since import}"},
    {"split", (PyCFunction)(void (*)(void))split, METH_FASTCALL,
     "split(rows, columns, first_seq): packed rows into the 15 column buffers (see the source)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuviz.log._staging",
    .m_doc = "Where an EventLog's flushed rows live: huge-page chunks (optional).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__staging(void) {
    if (PyType_Ready(&ChunkType) < 0 || PyType_Ready(&ArenaType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    staging_api.arena_type = &ArenaType;
    PyObject *api = PyCapsule_New(&staging_api, GV_STAGING_API, NULL);
    int failed = api == NULL || PyModule_AddObjectRef(m, "_api", api) < 0 ||
                 PyModule_AddObjectRef(m, "Arena", (PyObject *)&ArenaType) < 0;
    Py_XDECREF(api);
    if (failed) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
