/* gpuviz.log._staging: where an EventLog's flushed rows live (optional; the log keeps them
 * as bytes objects in Python otherwise).
 *
 * Arena().take(staged, nbytes) -> memoryview: the first nbytes of the staging bytearray
 * ``staged``, removed from it (the rest, rows appended meanwhile, moves to the front; the
 * bytearray keeps its allocation, see gpuviz/capture/_rows.h) and copied into the arena's
 * current chunk; the result is a read-only view of them there. Holding the GIL throughout,
 * it is one step for the recorders, as ``bytes(staged[:n]); del staged[:n]`` is not.
 *
 * Why chunks: a log recorded in memory keeps every row, so each of its pages is touched
 * fresh once. One bytes object per flush (~160 KB) is one mmap by malloc and ~40 page
 * faults, one per 4 KiB; a recorded allocate+free pair paid ~50 ns of its ~150 ns of
 * recording in them. A chunk is anonymous memory of 2 MiB doubling to 64 MiB, aligned to
 * and advised as transparent huge pages (MADV_HUGEPAGE; where the kernel gives none, plain
 * pages as before), so it faults once per 2 MiB. A chunk lives while any view of it does
 * (buffer exports); once none does (the log split its blocks into columns, as a log
 * recording to a file does at every flush), the arena rewinds and reuses it: warm memory.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <sys/mman.h>

#ifdef Py_GIL_DISABLED
#error "take relies on the GIL; EventLog empties the buffer in Python instead"
#endif

#define HUGE_PAGE ((Py_ssize_t)2 << 20)  /* bytes; chunks are multiples of it, aligned to it */
#define CHUNK_FIRST HUGE_PAGE            /* the first chunk of an arena, bytes */
#define CHUNK_LARGEST ((Py_ssize_t)64 << 20) /* chunks double up to this, bytes */

/* ------------------------------------------------------------------ Chunk */
typedef struct {
    PyObject_HEAD
    char *base;          /* HUGE_PAGE-aligned anonymous mapping */
    Py_ssize_t size;     /* bytes */
    Py_ssize_t exports;  /* buffer views alive */
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
    if (self->base != NULL) munmap(self->base, (size_t)self->size);
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

/* A chunk of ``size`` bytes (a multiple of HUGE_PAGE), or NULL with MemoryError set. */
static Chunk *chunk_new(Py_ssize_t size) {
    size_t span = (size_t)(size + HUGE_PAGE); /* room to align the start */
    char *map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return (Chunk *)PyErr_NoMemory();
    char *base = (char *)(((uintptr_t)map + (uintptr_t)HUGE_PAGE - 1) & ~((uintptr_t)HUGE_PAGE - 1));
    if (base > map) munmap(map, (size_t)(base - map));
    if (base + size < map + span) munmap(base + size, (size_t)(map + span - (base + size)));
#ifdef MADV_HUGEPAGE
    (void)madvise(base, (size_t)size, MADV_HUGEPAGE); /* advice: plain pages where refused */
#endif
    Chunk *chunk = PyObject_New(Chunk, &ChunkType);
    if (chunk == NULL) {
        munmap(base, (size_t)size);
        return NULL;
    }
    chunk->base = base;
    chunk->size = size;
    chunk->exports = 0;
    return chunk;
}

/* ------------------------------------------------------------------ Arena */
typedef struct {
    PyObject_HEAD
    Chunk *chunk; /* the chunk being filled, or NULL */
    Py_ssize_t used; /* bytes of it handed out */
    Py_ssize_t next_size; /* bytes of the next chunk */
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

/* Room for nbytes more in the current chunk (rewound when no view of it is alive), or a new one. */
static int arena_reserve(Arena *self, Py_ssize_t nbytes) {
    if (self->chunk != NULL && self->chunk->exports == 0) self->used = 0;
    if (self->chunk != NULL && nbytes <= self->chunk->size - self->used) return 0;
    Py_ssize_t size = self->next_size;
    if (nbytes > size) size = (nbytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    Chunk *chunk = chunk_new(size);
    if (chunk == NULL) return -1;
    Py_XSETREF(self->chunk, chunk); /* the old one lives on in its views */
    self->used = 0;
    if (self->next_size < CHUNK_LARGEST) self->next_size *= 2;
    return 0;
}

static PyObject *Arena_take(PyObject *obj, PyObject *const *args, Py_ssize_t nargs) {
    Arena *self = (Arena *)obj;
    if (nargs != 2 || !PyByteArray_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "take(staged: bytearray, nbytes: int)");
        return NULL;
    }
    PyByteArrayObject *b = (PyByteArrayObject *)args[0];
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[1]);
    if (nbytes == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t size = Py_SIZE(b);
    if (nbytes < 0 || nbytes > size) {
        PyErr_Format(PyExc_ValueError, "cannot take %zd bytes of %zd", nbytes, size);
        return NULL;
    }
    if (b->ob_exports > 0) {
        PyErr_SetString(PyExc_BufferError, "the staging buffer is exported");
        return NULL;
    }
    if (arena_reserve(self, nbytes) < 0) return NULL;
    PyObject *whole = PyMemoryView_FromObject((PyObject *)self->chunk);
    if (whole == NULL) return NULL;
    PyObject *view = PySequence_GetSlice(whole, self->used, self->used + nbytes);
    Py_DECREF(whole);
    if (view == NULL) return NULL;
    memcpy(self->chunk->base + self->used, b->ob_start, (size_t)nbytes);
    self->used += nbytes;
    memmove(b->ob_bytes, b->ob_start + nbytes, (size_t)(size - nbytes));
    b->ob_start = b->ob_bytes;
    Py_SET_SIZE(b, size - nbytes);
    b->ob_start[size - nbytes] = '\0';
    return view;
}

static PyObject *Arena_chunk_bytes(PyObject *obj, PyObject *unused) {
    (void)unused;
    Arena *self = (Arena *)obj;
    return Py_BuildValue("nn", self->chunk ? self->chunk->size : 0, self->used);
}

static PyMethodDef Arena_methods[] = {
    {"take", (PyCFunction)(void (*)(void))Arena_take, METH_FASTCALL,
     "take(staged, nbytes) -> memoryview: remove the first nbytes of the bytearray staged (keeping its "
     "allocation) and return a read-only view of them, copied into the arena"},
    {"chunk_bytes", Arena_chunk_bytes, METH_NOARGS,
     "chunk_bytes() -> (size, used): the current chunk's size and the bytes of it handed out"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ArenaType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpuviz.log._staging.Arena",
    .tp_doc = "Arena(): huge-page chunks that flushed rows are copied into (see the module's doc).",
    .tp_basicsize = sizeof(Arena),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Arena_new,
    .tp_dealloc = Arena_dealloc,
    .tp_methods = Arena_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuviz.log._staging",
    .m_doc = "Where an EventLog's flushed rows live: huge-page chunks (optional).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__staging(void) {
    if (PyType_Ready(&ChunkType) < 0 || PyType_Ready(&ArenaType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ArenaType);
    if (PyModule_AddObject(m, "Arena", (PyObject *)&ArenaType) < 0) {
        Py_DECREF(&ArenaType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
