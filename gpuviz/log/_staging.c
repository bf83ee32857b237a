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
 * faults, one per 4 KiB: on this project's VM most of a recorded allocate+free pair's
 * recording cost. Chunks are anonymous memory: the first 512 KiB (a log that records to a
 * file, or a small one, never needs more), then 2 MiB doubling to 8 MiB, aligned to and
 * advised as transparent huge pages (MADV_HUGEPAGE; where the kernel gives none, plain
 * pages as before), so they fault once per 2 MiB. A chunk lives while any view of it does
 * (buffer exports); once none does (the log split its blocks into columns, as a log
 * recording to a file does at every flush), the arena rewinds and reuses it: warm memory.
 *
 * Even so, a page the process never touched costs the kernel (and, in a VM, the host) its
 * zeroing and mapping. Once the current chunk is half full, the arena maps the next one
 * and a short-lived thread of its own populates it (madvise MADV_POPULATE_WRITE, Linux 5.14+:
 * pages faulted in without touching their contents, so it is safe while rows are written),
 * off the recording thread. The mapping outlives whichever of the chunk and that thread
 * lets go of it last (a count, atomic: the thread holds no GIL). Where populating is not
 * supported the rows fault the pages in themselves, as before.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#ifdef Py_GIL_DISABLED
#error "take relies on the GIL; EventLog empties the buffer in Python instead"
#endif

#define HUGE_PAGE ((Py_ssize_t)2 << 20)     /* bytes; chunks are aligned to it */
#define CHUNK_FIRST ((Py_ssize_t)512 << 10) /* the first chunk of an arena (plain pages), bytes */
#define CHUNK_LARGEST ((Py_ssize_t)8 << 20) /* then 2 MiB, doubling up to this, bytes */

/* ------------------------------------------------------------------ Region */
typedef struct {
    char *base;   /* HUGE_PAGE-aligned anonymous mapping */
    size_t size;  /* bytes */
    int holders;  /* the chunk, and the populating thread while it runs */
} Region;

static void region_release(Region *region) {
    if (__atomic_sub_fetch(&region->holders, 1, __ATOMIC_ACQ_REL) == 0) {
        munmap(region->base, region->size);
        free(region);
    }
}

static void *populate(void *arg) { /* the populating thread: no Python, no GIL */
    Region *region = arg;
#if defined(MADV_POPULATE_WRITE)
    (void)madvise(region->base, region->size, MADV_POPULATE_WRITE); /* unsupported: the rows fault them */
#endif
    region_release(region);
    return NULL;
}

/* Populate the region's pages on a thread of its own (nothing where no thread can start). */
static void populate_behind(Region *region) {
#if defined(MADV_POPULATE_WRITE)
    pthread_attr_t attr;
    pthread_t thread;
    if (pthread_attr_init(&attr) != 0) return;
    (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    (void)pthread_attr_setstacksize(&attr, 64 << 10);
    __atomic_add_fetch(&region->holders, 1, __ATOMIC_ACQ_REL);
    if (pthread_create(&thread, &attr, populate, region) != 0) region_release(region);
    pthread_attr_destroy(&attr);
#else
    (void)region;
#endif
}

/* ------------------------------------------------------------------ Chunk */
typedef struct {
    PyObject_HEAD
    Region *region;
    Py_ssize_t exports;  /* buffer views alive */
} Chunk;

static int Chunk_getbuffer(PyObject *obj, Py_buffer *view, int flags) {
    Chunk *self = (Chunk *)obj;
    Region *region = self->region;
    if (PyBuffer_FillInfo(view, obj, region->base, (Py_ssize_t)region->size, 1, flags) < 0) return -1; /* read-only */
    self->exports++;
    return 0;
}

static void Chunk_releasebuffer(PyObject *obj, Py_buffer *view) {
    (void)view;
    ((Chunk *)obj)->exports--;
}

static void Chunk_dealloc(PyObject *obj) {
    Chunk *self = (Chunk *)obj;
    if (self->region != NULL) region_release(self->region);
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

/* A chunk of ``size`` bytes (a multiple of 4 KiB), or NULL with MemoryError set. */
static Chunk *chunk_new(Py_ssize_t size) {
    size_t span = (size_t)(size + HUGE_PAGE); /* room to align the start */
    char *map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return (Chunk *)PyErr_NoMemory();
    char *base = (char *)(((uintptr_t)map + (uintptr_t)HUGE_PAGE - 1) & ~((uintptr_t)HUGE_PAGE - 1));
    if (base > map) munmap(map, (size_t)(base - map));
    if (base + size < map + span) munmap(base + size, (size_t)(map + span - (base + size)));
#ifdef MADV_HUGEPAGE
    if (size >= HUGE_PAGE) (void)madvise(base, (size_t)size, MADV_HUGEPAGE); /* plain pages where refused */
#endif
    Region *region = malloc(sizeof *region);
    Chunk *chunk = region != NULL ? PyObject_New(Chunk, &ChunkType) : (Chunk *)PyErr_NoMemory();
    if (chunk == NULL) {
        free(region);
        munmap(base, (size_t)size);
        return NULL;
    }
    *region = (Region){.base = base, .size = (size_t)size, .holders = 1};
    chunk->region = region;
    chunk->exports = 0;
    return chunk;
}

#define CHUNK_BASE(c) ((c)->region->base)
#define CHUNK_SIZE(c) ((Py_ssize_t)(c)->region->size)

/* ------------------------------------------------------------------ Arena */
typedef struct {
    PyObject_HEAD
    Chunk *chunk; /* the chunk being filled, or NULL */
    Chunk *next;  /* the one after it, being populated, or NULL */
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
    Py_CLEAR(((Arena *)obj)->next);
    Py_TYPE(obj)->tp_free(obj);
}

static void arena_grow(Arena *self) { /* the size of the chunk after the next */
    Py_ssize_t size = self->next_size < HUGE_PAGE ? HUGE_PAGE : 2 * self->next_size;
    self->next_size = size < CHUNK_LARGEST ? size : CHUNK_LARGEST;
}

/* Room for nbytes more in the current chunk (rewound when no view of it is alive), or the next. */
static int arena_reserve(Arena *self, Py_ssize_t nbytes) {
    if (self->chunk != NULL && self->chunk->exports == 0) self->used = 0;
    if (self->chunk != NULL && nbytes <= CHUNK_SIZE(self->chunk) - self->used) return 0;
    Chunk *chunk = self->next;
    self->next = NULL;
    if (chunk == NULL || CHUNK_SIZE(chunk) < nbytes) {
        Py_XDECREF(chunk);
        Py_ssize_t size = self->next_size;
        if (nbytes > size) size = (nbytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        chunk = chunk_new(size);
        if (chunk == NULL) return -1;
        arena_grow(self);
    }
    Py_XSETREF(self->chunk, chunk); /* the old one lives on in its views */
    self->used = 0;
    return 0;
}

/* Once the current chunk is half full, map the next one and populate it behind. */
static void arena_prepare(Arena *self) {
    if (self->next != NULL || self->used < CHUNK_SIZE(self->chunk) / 2) return;
    Chunk *next = chunk_new(self->next_size);
    if (next == NULL) { /* no room now: arena_reserve tries again when it is needed */
        PyErr_Clear();
        return;
    }
    arena_grow(self);
    populate_behind(next->region);
    self->next = next;
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
    memcpy(CHUNK_BASE(self->chunk) + self->used, b->ob_start, (size_t)nbytes);
    self->used += nbytes;
    arena_prepare(self);
    memmove(b->ob_bytes, b->ob_start + nbytes, (size_t)(size - nbytes));
    b->ob_start = b->ob_bytes;
    Py_SET_SIZE(b, size - nbytes);
    b->ob_start[size - nbytes] = '\0';
    return view;
}

static PyObject *Arena_chunk_bytes(PyObject *obj, PyObject *unused) {
    (void)unused;
    Arena *self = (Arena *)obj;
    return Py_BuildValue("nnn", self->chunk ? CHUNK_SIZE(self->chunk) : 0, self->used,
                         self->next ? CHUNK_SIZE(self->next) : 0);
}

static PyMethodDef Arena_methods[] = {
    {"take", (PyCFunction)(void (*)(void))Arena_take, METH_FASTCALL,
     "take(staged, nbytes) -> memoryview: remove the first nbytes of the bytearray staged (keeping its "
     "allocation) and return a read-only view of them, copied into the arena"},
    {"chunk_bytes", Arena_chunk_bytes, METH_NOARGS,
     "chunk_bytes() -> (size, used, next): the current chunk's size, the bytes of it handed out, "
     "and the size of the next one (0: none prepared yet)"},
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
