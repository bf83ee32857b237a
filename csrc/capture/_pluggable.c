/* gpuviz.capture._pluggable: the BFC core as a shared library with malloc/free entry points,
 * for allocator hooks of other frameworks (PyTorch's CUDAPluggableAllocator loads it by path):
 *
 *   void *gpuviz_malloc(ssize_t size, int device, cudaStream_t stream);
 *   void gpuviz_free(void *ptr, ssize_t size, int device, cudaStream_t stream);
 *
 * Each device has its own BFC allocator (the core of _bfc_core.c) with TensorFlow's growth
 * (2 MiB, doubling, 10 % float32 backpedal), memory limit and optional garbage collection
 * (bfc_grow; the rules are _bfc_rules.h's),
 * over cudaMalloc/cudaFree (libcudart, found with dlopen at the first growth, so building
 * needs no CUDA) or, for tests and machines without a GPU, a simulated device placed
 * first-fit like gpuviz.SimUpstream. Every decision becomes a row of
 * gpuviz.log.schema.ROW_STRUCT in a buffer that Python drains into an EventLog
 * (``drain()``; gpuviz.torch does it). Time is CLOCK_MONOTONIC (time.perf_counter_ns on
 * Linux), thread pthread_self() (threading.get_ident()).
 *
 * The entry points never touch Python: they run on whatever thread the framework calls
 * from, each device behind its own mutex; the row buffer has its own. POSIX only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "_bfc_core.h"
#include "../log/_rows.h"

#define MAX_DEVICES 64

typedef int (*cuda_malloc_fn)(void **, size_t);
typedef int (*cuda_free_fn)(void *);
typedef int (*cuda_mem_info_fn)(size_t *, size_t *);

typedef struct {
    int configured;
    pthread_mutex_t mutex;
    bfc_t bfc;
    int16_t log_device;
    int64_t memory_limit, next_segment_bytes;
    int growth, garbage_collection;
    /* simulated upstream (capacity > 0): first-fit regions sorted by address */
    int64_t sim_base, sim_capacity, sim_reserved;
    int64_t *sim_starts, *sim_sizes;
    size_t sim_count, sim_room;
    int64_t invalid_frees;
} device_t;

static device_t devices[MAX_DEVICES];
static pthread_mutex_t configure_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t rows_mutex = PTHREAD_MUTEX_INITIALIZER;
static char *rows;
static size_t rows_size, rows_room;
static size_t rows_lost; /* rows that found no host memory since the last drain (the allocation stood) */
static cuda_malloc_fn cuda_malloc;
static cuda_free_fn cuda_free;
static cuda_mem_info_fn cuda_mem_info;

/* ------------------------------------------------------------------- rows */
static void emit_row(void *ctx, int kind, int64_t address, int64_t size, int64_t requested, int64_t segment,
                     int64_t largest, int32_t tag, int32_t stack) {
    device_t *d = ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t time_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    row_t r = {.time_ns = time_ns, .thread = (int64_t)(uintptr_t)pthread_self(), .address = address, .size = size,
               .requested = requested, .segment = segment, .largest = largest, .tag = tag, .stack = stack,
               .device = d->log_device, .peer = -1, .kind = (uint8_t)kind};
    unsigned char row[ROW_BYTES];
    pack_row(row, &r);
    pthread_mutex_lock(&rows_mutex);
    if (rows_size + ROW_BYTES > rows_room) {
        size_t room = rows_room ? rows_room * 2 : 1 << 20;
        char *grown = realloc(rows, room);
        if (grown == NULL) { /* out of host memory: the row is lost and counted, the allocation stands */
            rows_lost++;
            pthread_mutex_unlock(&rows_mutex);
            return;
        }
        rows = grown;
        rows_room = room;
    }
    memcpy(rows + rows_size, row, ROW_BYTES);
    rows_size += ROW_BYTES;
    pthread_mutex_unlock(&rows_mutex);
}

/* --------------------------------------------------------------- upstream */
static int load_cuda(void) {
    if (cuda_malloc) return 0;
    /* first the runtime the process has loaded (PyTorch's own, found by its soname: a CUDA 13
     * build loads libcudart.so.13), then one on the library path */
    const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so", NULL};
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; names[i]; i++) {
            void *lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL | (pass == 0 ? RTLD_NOLOAD : 0));
            if (lib == NULL) continue;
            cuda_mem_info = (cuda_mem_info_fn)dlsym(lib, "cudaMemGetInfo");
            cuda_free = (cuda_free_fn)dlsym(lib, "cudaFree");
            cuda_malloc = (cuda_malloc_fn)dlsym(lib, "cudaMalloc");
            if (cuda_malloc && cuda_free) return 0;
        }
    }
    return -1;
}

/* 0 and *base, or -1 when the device cannot provide nbytes */
static int upstream_allocate(device_t *d, int64_t nbytes, int64_t *base) {
    if (d->sim_capacity > 0) {
        if (d->sim_reserved + nbytes > d->sim_capacity) return -1;
        int64_t address = d->sim_base;
        size_t i = 0;
        for (; i < d->sim_count; i++) {
            if (d->sim_starts[i] - address >= nbytes) break;
            int64_t end = d->sim_starts[i] + d->sim_sizes[i];
            if (end > address) address = end;
        }
        if (d->sim_count == d->sim_room) {
            size_t room = d->sim_room ? d->sim_room * 2 : 16;
            int64_t *starts = realloc(d->sim_starts, room * sizeof(int64_t));
            if (starts == NULL) return -1;
            d->sim_starts = starts;
            int64_t *sizes = realloc(d->sim_sizes, room * sizeof(int64_t));
            if (sizes == NULL) return -1;
            d->sim_sizes = sizes;
            d->sim_room = room;
        }
        size_t at = 0; /* insertion point by address */
        while (at < d->sim_count && d->sim_starts[at] < address) at++;
        memmove(d->sim_starts + at + 1, d->sim_starts + at, (d->sim_count - at) * sizeof(int64_t));
        memmove(d->sim_sizes + at + 1, d->sim_sizes + at, (d->sim_count - at) * sizeof(int64_t));
        d->sim_starts[at] = address;
        d->sim_sizes[at] = nbytes;
        d->sim_count++;
        d->sim_reserved += nbytes;
        *base = address;
        return 0;
    }
    void *ptr = NULL;
    if (load_cuda() < 0 || cuda_malloc(&ptr, (size_t)nbytes) != 0 || ptr == NULL) return -1;
    *base = (int64_t)(uintptr_t)ptr;
    return 0;
}

static void upstream_free(device_t *d, int64_t base) {
    if (d->sim_capacity > 0) {
        for (size_t i = 0; i < d->sim_count; i++) {
            if (d->sim_starts[i] != base) continue;
            d->sim_reserved -= d->sim_sizes[i];
            memmove(d->sim_starts + i, d->sim_starts + i + 1, (d->sim_count - i - 1) * sizeof(int64_t));
            memmove(d->sim_sizes + i, d->sim_sizes + i + 1, (d->sim_count - i - 1) * sizeof(int64_t));
            d->sim_count--;
            return;
        }
        return;
    }
    if (cuda_free) cuda_free((void *)(uintptr_t)base);
}

/* ------------------------------------- the device as the BFC core's upstream (bfc_grow) */
static int reserve_upstream(void *ctx, int64_t nbytes, int64_t *base) { return upstream_allocate(ctx, nbytes, base); }

static void release_upstream(void *ctx, int64_t base, int64_t size) {
    (void)size;
    upstream_free(ctx, base);
}

/* ------------------------------------------------------------ entry points */
static int configure_device(int device, int16_t log_device, int64_t memory_limit, int growth, int garbage_collection,
                            int64_t sim_capacity, int64_t sim_base) {
    device_t *d = &devices[device];
    if (d->configured) {
        if (d->bfc.segments) return -1; /* reconfigure only an empty allocator */
        bfc_destroy(&d->bfc);
        free(d->sim_starts);
        free(d->sim_sizes);
        pthread_mutex_destroy(&d->mutex);
    }
    memset(d, 0, sizeof(*d));
    if (bfc_init(&d->bfc) < 0) return -2;
    pthread_mutex_init(&d->mutex, NULL);
    d->bfc.emit = emit_row;
    d->bfc.emit_ctx = d;
    d->log_device = log_device;
    d->sim_capacity = sim_capacity;
    d->sim_base = sim_base;
    if (memory_limit <= 0) { /* the device's capacity */
        size_t free_bytes = 0, total = 0;
        if (sim_capacity > 0) memory_limit = sim_capacity;
        else if (load_cuda() == 0 && cuda_mem_info && cuda_mem_info(&free_bytes, &total) == 0) memory_limit = (int64_t)total;
        else return -3;
    }
    d->memory_limit = memory_limit;
    d->growth = growth;
    d->garbage_collection = garbage_collection;
    d->next_segment_bytes = bfc_first_segment(growth, memory_limit);
    d->configured = 1;
    return 0;
}

void *gpuviz_malloc(ssize_t size, int device, void *stream) {
    (void)stream;
    if (size <= 0 || device < 0 || device >= MAX_DEVICES) return NULL;
    device_t *d = &devices[device];
    if (!d->configured) {
        pthread_mutex_lock(&configure_mutex);
        int failed = !d->configured && configure_device(device, (int16_t)device, 0, 1, 0, 0, 0) < 0;
        pthread_mutex_unlock(&configure_mutex);
        if (failed) return NULL;
    }
    int64_t nbytes = (int64_t)size, rounded = bfc_rounded(nbytes);
    pthread_mutex_lock(&d->mutex);
    int32_t slot = bfc_take_best_fit(&d->bfc, rounded);
    if (slot < 0) {
        /* TF's growth, limit and garbage collection: the core's one statement of them */
        const bfc_upstream up = {reserve_upstream, release_upstream, NULL, d};
        int grown = bfc_grow(&d->bfc, rounded, d->memory_limit, d->garbage_collection, &d->next_segment_bytes, &up, -1);
        slot = grown > 0 ? bfc_take_best_fit(&d->bfc, rounded) : -1;
        if (slot < 0) {
            emit_row(d, BFC_OOM, 0, rounded, nbytes, -1, bfc_largest_free(&d->bfc), -1, -1);
            pthread_mutex_unlock(&d->mutex);
            return NULL;
        }
    }
    if (bfc_split(&d->bfc, slot, rounded, -1) < 0) {
        bfc_put_back(&d->bfc, slot);
        pthread_mutex_unlock(&d->mutex);
        return NULL;
    }
    bfc_mark_allocated(&d->bfc, slot, nbytes, NULL, -1, -1);
    void *ptr = (void *)(uintptr_t)bfc_at(&d->bfc, slot)->address;
    pthread_mutex_unlock(&d->mutex);
    return ptr;
}

void gpuviz_free(void *ptr, ssize_t size, int device, void *stream) {
    (void)size;
    (void)stream;
    if (ptr == NULL || device < 0 || device >= MAX_DEVICES || !devices[device].configured) return;
    device_t *d = &devices[device];
    pthread_mutex_lock(&d->mutex);
    int32_t slot = bfc_find(&d->bfc, (int64_t)(uintptr_t)ptr);
    if (slot < 0 || !bfc_at(&d->bfc, slot)->in_use) {
        d->invalid_frees++;
    } else {
        void *tag;
        bfc_release_chunk(&d->bfc, slot, -1, &tag);
    }
    pthread_mutex_unlock(&d->mutex);
}

/* ----------------------------------------------------------- Python side */
static PyObject *py_configure(PyObject *module, PyObject *args, PyObject *kwds) {
    static char *names[] = {"device",           "log_device", "memory_limit", "growth", "garbage_collection",
                            "simulated_capacity", "simulated_base", NULL};
    int device, log_device, growth = 1, garbage_collection = 0;
    long long memory_limit = 0, sim_capacity = 0, sim_base = (long long)1 << 40;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ii|LppLL", names, &device, &log_device, &memory_limit, &growth,
                                     &garbage_collection, &sim_capacity, &sim_base))
        return NULL;
    if (device < 0 || device >= MAX_DEVICES || log_device < INT16_MIN || log_device > INT16_MAX) {
        PyErr_Format(PyExc_ValueError, "device must be in [0, %d) and log_device fit 16 bits", MAX_DEVICES);
        return NULL;
    }
    pthread_mutex_lock(&configure_mutex);
    int status = configure_device(device, (int16_t)log_device, memory_limit, growth, garbage_collection, sim_capacity,
                                  sim_base);
    pthread_mutex_unlock(&configure_mutex);
    if (status == -1) {
        PyErr_Format(PyExc_RuntimeError, "device %d already holds memory: it cannot be configured again", device);
        return NULL;
    }
    if (status == -3) {
        PyErr_SetString(PyExc_RuntimeError, "no memory_limit given and no CUDA runtime (libcudart) to ask");
        return NULL;
    }
    if (status < 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_drain(PyObject *module, PyObject *unused) {
    pthread_mutex_lock(&rows_mutex);
    PyObject *rows_out = PyBytes_FromStringAndSize(rows ? rows : "", (Py_ssize_t)rows_size);
    PyObject *out = rows_out ? Py_BuildValue("(Nn)", rows_out, (Py_ssize_t)rows_lost) : NULL;
    if (out) rows_size = rows_lost = 0;
    pthread_mutex_unlock(&rows_mutex);
    return out;
}

static PyObject *py_stats(PyObject *module, PyObject *arg) {
    long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred()) return NULL;
    if (device < 0 || device >= MAX_DEVICES || !devices[device].configured) {
        PyErr_Format(PyExc_ValueError, "device %ld is not configured", device);
        return NULL;
    }
    device_t *d = &devices[device];
    pthread_mutex_lock(&d->mutex);
    bfc_t *b = &d->bfc;
    PyObject *out = Py_BuildValue("{sLsLsLsLsLsLsLsLsL}", "num_allocs", (long long)b->num_allocs, "bytes_in_use",
                                  (long long)b->bytes_in_use, "peak_bytes_in_use", (long long)b->peak_bytes_in_use,
                                  "largest_alloc_size", (long long)b->largest_alloc_size, "bytes_limit",
                                  (long long)d->memory_limit, "pool_bytes", (long long)b->pool_bytes, "peak_pool_bytes",
                                  (long long)b->peak_pool_bytes, "largest_free_block_bytes",
                                  (long long)bfc_largest_free(b), "invalid_frees", (long long)d->invalid_frees);
    pthread_mutex_unlock(&d->mutex);
    return out;
}

static PyObject *py_reset(PyObject *module, PyObject *arg) {
    long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred()) return NULL;
    if (device < 0 || device >= MAX_DEVICES) {
        PyErr_Format(PyExc_ValueError, "device must be in [0, %d)", MAX_DEVICES);
        return NULL;
    }
    pthread_mutex_lock(&configure_mutex);
    device_t *d = &devices[device];
    int busy = 0;
    if (d->configured) {
        pthread_mutex_lock(&d->mutex);
        busy = d->bfc.bytes_in_use != 0;
        while (!busy && d->bfc.segments) { /* every segment is wholly free: give them back */
            int64_t base = d->bfc.segment_bases[0];
            bfc_release_segment(&d->bfc, base, -1);
            upstream_free(d, base);
        }
        pthread_mutex_unlock(&d->mutex);
        if (!busy) {
            bfc_destroy(&d->bfc);
            free(d->sim_starts);
            free(d->sim_sizes);
            pthread_mutex_destroy(&d->mutex);
            memset(d, 0, sizeof(*d));
        }
    }
    pthread_mutex_unlock(&configure_mutex);
    if (busy) {
        PyErr_Format(PyExc_RuntimeError, "device %ld still has memory in use: it cannot be reset", device);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"reset", py_reset, METH_O,
     "reset(device): return the device's (wholly free) segments upstream and forget its allocator"},
    {"configure", (PyCFunction)(void (*)(void))py_configure, METH_VARARGS | METH_KEYWORDS,
     "configure(device, log_device, memory_limit=0, growth=True, garbage_collection=False, simulated_capacity=0, "
     "simulated_base=1<<40): set up one device's allocator (memory_limit 0: the device's capacity)"},
    {"drain", py_drain, METH_NOARGS,
     "drain() -> (rows, lost): the rows recorded since the last drain, as bytes (ROW_STRUCT rows), and how many "
     "rows found no host memory meanwhile (lost; their allocations stood)"},
    {"stats", py_stats, METH_O, "stats(device): the allocator's counters (bytes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuviz.capture._pluggable",
    .m_doc = "The BFC core with gpuviz_malloc/gpuviz_free entry points (see gpuviz.torch).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__pluggable(void) { return PyModule_Create(&module); }
