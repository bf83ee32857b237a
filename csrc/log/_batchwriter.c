/* gpuviz.log._batchwriter: the batches of an event-log file being recorded, written by a
 * thread of their own (optional: without it gpuviz/log/fileio.py writes the same batches with
 * pyarrow on the flushing thread).
 *
 * BatchWriter(fd, chunk_rows) appends Arrow IPC record-batch messages of the log's columns
 * (gpuviz.log.schema.COLUMNS: 15 fixed-width columns without nulls) to the open file descriptor
 * ``fd``, after the schema message fileio.py wrote there; the caller closes ``fd``.
 *
 *   submit(block, first_seq, delta, delta_digest) hands a flushed block of packed rows
 *     (_rows.h) to the writer's thread and returns. The thread, holding no GIL, splits the rows
 *     into columns (seq from first_seq), makes the batch's checksum record (checksums.py's
 *     batch_checksum: the XXH3-64 of each chunk of chunk_rows rows over all columns' bytes,
 *     _hash.h, upstream xxHash; ``delta_digest`` is the digest of ``delta``) and writes the batch with its custom
 *     metadata gpuviz.delta = delta and gpuviz.checksum, in the order submitted. Up to DEPTH
 *     (2) blocks are in flight: a submit that finds DEPTH still to be written waits for the
 *     oldest, the GIL released, which keeps eventlog.py's crash bound (rows not yet written:
 *     at most flush_rows, flushed every flush_rows // 3). Two rather than one: a block's write
 *     that outlasts the next flush (the writer's thread kept off its core for a while) no
 *     longer holds the recording thread up.
 *   write(columns, metadata) writes one batch of the 15 given column buffers (equal lengths,
 *     each of its column's width) with the given custom metadata, a sequence of (key, value)
 *     bytes pairs, on the calling thread (GIL released), after the blocks in flight.
 *   wait() returns once nothing is in flight.
 *   Each of them first raises OSError(errno, strerror) if a write failed; a writer that failed
 *   writes nothing more (the file ends after the last batch written whole, as a crash leaves
 *   it). In a child forked from the process that made the writer they raise OSError (the
 *   thread stayed in the parent: the log goes on in memory there, fileio.py). ``events`` and
 *   ``batches`` count what was written whole.
 *
 * The message (the Arrow IPC record-batch message, as pyarrow writes it) is built by
 * _ipcmessage.h. tests/test_batchwriter.py reads what this writes with pyarrow and compares it
 * with pyarrow's own batches.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "_ipcmessage.h" /* span_t, PAD8, message_bound, build_message */
#include "_hash.h" /* gv_xxh3_64 */
#include "_rows.h"

static const size_t widths[SPLIT_COLUMNS] = SPLIT_WIDTHS;
#define SEQ_ROW_BYTES (ROW_BYTES + 8) /* one row of all columns (seq added), bytes */
#define MAX_PAIRS 8

/* ------------------------------------------------------------ the writer */
#define DEPTH 2 /* blocks in flight at most */

typedef struct { /* a block handed over by submit(), kept (GIL needed to let go) until written */
    Py_buffer block;
    int holding; /* block and delta held */
    PyObject *delta;
    char delta_digest[16];
    int64_t first_seq;
} slot_t;

typedef struct {
    PyObject_HEAD
    int fd;
    size_t chunk_rows;
    pthread_t thread;
    int started;
    pthread_mutex_t mutex;
    pthread_cond_t job;  /* submit() to the thread: a block to write (or stop) */
    pthread_cond_t done; /* the thread (or write()) to the callers: a block written, or write() done */
    int sleeping;        /* the thread waits on ``job`` (it is writing a block otherwise) */
    /* slots[(head + i) % DEPTH] for i < queued are in flight, oldest first: 0 <= queued <= DEPTH */
    slot_t slots[DEPTH];
    int head, queued;
    int claimed; /* a submit() fills the next slot, or write() writes on its caller's thread */
    int stop;
    int failed;     /* errno of the write that failed, 0 while none has */
    pid_t owner;    /* the process that made it: a fork's child has the object, not the thread */
    int64_t events; /* written whole */
    int64_t batches;
    int64_t waits; /* calls that had to wait: DEPTH blocks in flight (any, for wait() and write()) */
    int64_t waited_ns; /* how long they waited in all (CLOCK_MONOTONIC) */
    /* the thread's scratch: the columns of a block back to back, a chunk's bytes, the message */
    unsigned char *columns, *chunk, *message;
    size_t columns_size, chunk_size, message_size;
} BatchWriter;

static int grow(unsigned char **buffer, size_t *size, size_t needed) {
    if (*size >= needed) return 0;
    unsigned char *bigger = realloc(*buffer, needed);
    if (bigger == NULL) return ENOMEM;
    *buffer = bigger, *size = needed;
    return 0;
}

static void count_batch(BatchWriter *self, int64_t rows) { /* read without the mutex: BatchWriter_count */
    __atomic_fetch_add(&self->events, rows, __ATOMIC_RELAXED);
    __atomic_fetch_add(&self->batches, 1, __ATOMIC_RELAXED);
}

/* Writes all of iov (changed on the way); 0, or the errno of the failed write. */
static int write_all(int fd, struct iovec *iov, int count) {
    while (count > 0) {
        ssize_t done = writev(fd, iov, count > IOV_MAX ? IOV_MAX : count);
        if (done < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        while (count > 0 && (size_t)done >= iov->iov_len) done -= (ssize_t)iov->iov_len, iov++, count--;
        if (count > 0) iov->iov_base = (char *)iov->iov_base + done, iov->iov_len -= (size_t)done;
    }
    return 0;
}

static const unsigned char zeros[8];

/* One batch: its message and its columns (``rows`` values each), padded. 0 or an errno. */
static int write_batch(BatchWriter *self, int64_t rows, const void *const columns[SPLIT_COLUMNS], const span_t *keys,
                       const span_t *values, int pairs) {
    size_t lens[SPLIT_COLUMNS];
    for (int k = 0; k < SPLIT_COLUMNS; k++) lens[k] = (size_t)rows * widths[k];
    int failed = grow(&self->message, &self->message_size, 8 + message_bound(keys, values, pairs));
    if (failed) return failed;
    int64_t body;
    struct iovec iov[1 + 2 * SPLIT_COLUMNS];
    int count = 0;
    iov[count].iov_base = self->message;
    iov[count++].iov_len = build_message(self->message, rows, lens, keys, values, pairs, &body);
    for (int k = 0; k < SPLIT_COLUMNS; k++) {
        if (lens[k] == 0) continue;
        iov[count].iov_base = (void *)columns[k];
        iov[count++].iov_len = lens[k];
        if (PAD8(lens[k]) != lens[k]) iov[count].iov_base = (void *)zeros, iov[count++].iov_len = PAD8(lens[k]) - lens[k];
    }
    return write_all(self->fd, iov, count);
}

/* A block in flight, written (on the writer's thread, no GIL). 0 or an errno. */
static int write_block(BatchWriter *self, const slot_t *slot) {
    size_t n = (size_t)slot->block.len / ROW_BYTES;
    int failed = grow(&self->columns, &self->columns_size, n * SEQ_ROW_BYTES + 1);
    if (failed) return failed;
    void *columns[SPLIT_COLUMNS];
    size_t at = 0;
    for (int k = 0; k < SPLIT_COLUMNS; k++) columns[k] = self->columns + at, at += n * widths[k];
    split_rows_into(columns, slot->block.buf, n, slot->first_seq);
    /* the checksum record, as checksums.batch_checksum's json.dumps writes it */
    size_t chunks = (n + self->chunk_rows - 1) / self->chunk_rows;
    size_t record_size = 128 + chunks * 20;
    char *record = malloc(record_size);
    if (record == NULL) return ENOMEM;
    int written = snprintf(record, record_size, "{\"rows\": %zu, \"chunk_rows\": %zu, \"chunks\": [", n, self->chunk_rows);
    for (size_t c = 0; c < chunks && !failed; c++) {
        size_t start = c * self->chunk_rows, end = start + self->chunk_rows < n ? start + self->chunk_rows : n;
        const unsigned char *bytes = self->columns; /* one chunk of all rows: the columns as they lie */
        if (chunks > 1) {
            if ((failed = grow(&self->chunk, &self->chunk_size, (end - start) * SEQ_ROW_BYTES + 1))) break;
            size_t to = 0;
            for (int k = 0; k < SPLIT_COLUMNS; k++) {
                memcpy(self->chunk + to, (unsigned char *)columns[k] + start * widths[k], (end - start) * widths[k]);
                to += (end - start) * widths[k];
            }
            bytes = self->chunk;
        }
        uint64_t digest = gv_xxh3_64(bytes, (end - start) * SEQ_ROW_BYTES); /* as xxh3_64_hexdigest prints it */
        written += snprintf(record + written, record_size - (size_t)written, "%s\"%016" PRIx64 "\"", c ? ", " : "", digest);
    }
    written += snprintf(record + written, record_size - (size_t)written, "], \"delta\": \"%.16s\"}", slot->delta_digest);
    if (!failed) {
        const span_t keys[2] = {{"gpuviz.delta", 12}, {"gpuviz.checksum", 15}};
        const span_t values[2] = {{PyBytes_AS_STRING(slot->delta), (size_t)PyBytes_GET_SIZE(slot->delta)},
                                  {record, (size_t)written}};
        failed = write_batch(self, (int64_t)n, (const void *const *)columns, keys, values, 2);
    }
    free(record);
    return failed;
}

/* The writer's thread: no Python, no GIL. It waits on ``job`` until submit() hands a block
 * over (or the writer stops): no wake-up while nothing is submitted. Waking it costs the
 * recording thread one futex call per block (flush_rows // 3 rows), measured in
 * docs/architecture.md, "The recording path". */
static void *run(void *arg) {
    BatchWriter *self = arg;
#ifdef __linux__
    (void)pthread_setname_np(pthread_self(), "gpuviz-writer"); /* as top -H and py-spy show it */
#endif
    pthread_mutex_lock(&self->mutex);
    for (;;) {
        if (!self->queued && !self->stop) {
            self->sleeping = 1;
            while (!self->queued && !self->stop) pthread_cond_wait(&self->job, &self->mutex);
            self->sleeping = 0;
        }
        if (!self->queued) break; /* stopped, after every block handed over */
        const slot_t *slot = &self->slots[self->head];
        pthread_mutex_unlock(&self->mutex);
        int failed = write_block(self, slot);
        pthread_mutex_lock(&self->mutex);
        if (failed) { /* nothing more is written: the blocks still queued stay held until released */
            self->failed = failed;
            self->queued = 0;
        } else {
            count_batch(self, slot->block.len / ROW_BYTES);
            self->head = (self->head + 1) % DEPTH;
            self->queued--;
        }
        pthread_cond_broadcast(&self->done);
    }
    pthread_mutex_unlock(&self->mutex);
    return NULL;
}

/* Lets go of the blocks written (GIL held): every held slot not in flight when head and
 * queued were read (the thread only ever moves head on, never back to such a slot). */
static void release_written(BatchWriter *self, int head, int queued) {
    for (int i = queued; i < DEPTH; i++) { /* the slots after the queued ones, in ring order */
        slot_t *slot = &self->slots[(head + i) % DEPTH];
        if (slot->holding) {
            PyBuffer_Release(&slot->block);
            Py_CLEAR(slot->delta);
            slot->holding = 0;
        }
    }
}

/* Waits (GIL released) until at most ``room`` blocks are in flight (DEPTH - 1: room for one
 * more; 0: none) and no other caller holds the claim, then lets go of the blocks written (GIL
 * held). With ``claim``, takes the claim (released with unclaim): the next slot, or the file for
 * write(). -1 with OSError set when a write failed. */
static int settle(BatchWriter *self, int room, int claim) {
    if (getpid() != self->owner) { /* its thread, and maybe its mutex's holder, stayed in the parent */
        PyErr_Format(PyExc_OSError, "this event-log file is written by process %ld (this one is a child forked from it)",
                     (long)self->owner);
        return -1;
    }
    pthread_mutex_lock(&self->mutex);
    if (self->queued > room || self->claimed) { /* wait for it without the GIL */
        __atomic_fetch_add(&self->waits, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&self->mutex);
        struct timespec from, to;
        clock_gettime(CLOCK_MONOTONIC, &from);
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mutex);
        while (self->queued > room || self->claimed) pthread_cond_wait(&self->done, &self->mutex);
        Py_END_ALLOW_THREADS
        clock_gettime(CLOCK_MONOTONIC, &to);
        __atomic_fetch_add(&self->waited_ns, (int64_t)(to.tv_sec - from.tv_sec) * 1000000000 + (to.tv_nsec - from.tv_nsec),
                           __ATOMIC_RELAXED);
    }
    if (claim && !self->failed) self->claimed = 1;
    int head = self->head, queued = self->queued;
    pthread_mutex_unlock(&self->mutex);
    release_written(self, head, queued);
    if (self->failed) {
        errno = self->failed;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

/* Lets the claim go; with a filled slot (submit), hands it to the thread. */
static void unclaim(BatchWriter *self, int submitted) {
    pthread_mutex_lock(&self->mutex); /* the thread holds it only to wait or to hand back */
    self->claimed = 0;
    if (submitted) {
        self->queued++;
        if (self->sleeping) pthread_cond_signal(&self->job);
    }
    pthread_cond_broadcast(&self->done); /* callers waiting for the claim */
    pthread_mutex_unlock(&self->mutex);
}

static PyObject *BatchWriter_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    int fd;
    Py_ssize_t chunk_rows;
    static char *names[] = {"fd", "chunk_rows", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "in", names, &fd, &chunk_rows)) return NULL;
    if (fd < 0 || chunk_rows <= 0) {
        PyErr_Format(PyExc_ValueError, "BatchWriter: a file descriptor >= 0 and chunk_rows > 0, got %d and %zd", fd,
                     chunk_rows);
        return NULL;
    }
    BatchWriter *self = (BatchWriter *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->fd = fd;
    self->owner = getpid();
    self->chunk_rows = (size_t)chunk_rows;
    pthread_mutex_init(&self->mutex, NULL);
    pthread_cond_init(&self->job, NULL);
    pthread_cond_init(&self->done, NULL);
    if (pthread_create(&self->thread, NULL, run, self) != 0) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_RuntimeError, "BatchWriter: the writer's thread could not be started");
        return NULL;
    }
    self->started = 1;
    return (PyObject *)self;
}

static void BatchWriter_dealloc(PyObject *obj) {
    BatchWriter *self = (BatchWriter *)obj;
    if (self->started && getpid() == self->owner) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->mutex);
        self->stop = 1;
        pthread_cond_signal(&self->job);
        pthread_mutex_unlock(&self->mutex);
        pthread_join(self->thread, NULL); /* after the block in flight, if any */
        Py_END_ALLOW_THREADS
    }
    release_written(self, 0, 0); /* the thread is done with them all (or never started) */
    free(self->columns);
    free(self->chunk);
    free(self->message);
    if (getpid() == self->owner) {
        pthread_mutex_destroy(&self->mutex);
        pthread_cond_destroy(&self->job);
        pthread_cond_destroy(&self->done);
    }
    Py_TYPE(obj)->tp_free(obj);
}

static PyObject *BatchWriter_submit(PyObject *obj, PyObject *const *args, Py_ssize_t nargs) {
    BatchWriter *self = (BatchWriter *)obj;
    if (nargs != 4 || !PyBytes_Check(args[2]) || !PyBytes_Check(args[3]) || PyBytes_GET_SIZE(args[3]) != 16) {
        PyErr_SetString(PyExc_TypeError, "submit(block, first_seq, delta: bytes, delta_digest: 16 bytes)");
        return NULL;
    }
    long long first_seq = PyLong_AsLongLong(args[1]);
    if (first_seq == -1 && PyErr_Occurred()) return NULL;
    Py_buffer block;
    if (PyObject_GetBuffer(args[0], &block, PyBUF_SIMPLE) < 0) return NULL;
    if (block.len % ROW_BYTES != 0) {
        PyErr_Format(PyExc_ValueError, "submit: %zd bytes are not whole rows of %d bytes", block.len, ROW_BYTES);
        PyBuffer_Release(&block);
        return NULL;
    }
    if (settle(self, DEPTH - 1, 1) < 0) {
        PyBuffer_Release(&block);
        return NULL;
    }
    pthread_mutex_lock(&self->mutex); /* head + queued: the same before and after the thread writes one */
    slot_t *slot = &self->slots[(self->head + self->queued) % DEPTH]; /* not in flight, let go of by settle */
    pthread_mutex_unlock(&self->mutex);
    slot->block = block;
    slot->holding = 1;
    Py_INCREF(args[2]);
    slot->delta = args[2];
    memcpy(slot->delta_digest, PyBytes_AS_STRING(args[3]), 16);
    slot->first_seq = first_seq;
    unclaim(self, 1);
    Py_RETURN_NONE;
}

static PyObject *BatchWriter_write(PyObject *obj, PyObject *const *args, Py_ssize_t nargs) {
    BatchWriter *self = (BatchWriter *)obj;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "write(columns, metadata)");
        return NULL;
    }
    PyObject *columns = PySequence_Fast(args[0], "write: columns must be a sequence of buffers");
    if (columns == NULL) return NULL;
    PyObject *metadata = PySequence_Fast(args[1], "write: metadata must be a sequence of (key, value) bytes pairs");
    if (metadata == NULL) {
        Py_DECREF(columns);
        return NULL;
    }
    Py_buffer out[SPLIT_COLUMNS];
    span_t keys[MAX_PAIRS], values[MAX_PAIRS];
    int held = 0, ok = 0, pairs = (int)PySequence_Fast_GET_SIZE(metadata);
    Py_ssize_t rows = 0;
    if (PySequence_Fast_GET_SIZE(columns) != SPLIT_COLUMNS || pairs > MAX_PAIRS) {
        PyErr_Format(PyExc_ValueError, "write: %d columns and at most %d metadata pairs expected, got %zd and %d",
                     SPLIT_COLUMNS, MAX_PAIRS, PySequence_Fast_GET_SIZE(columns), pairs);
        goto done;
    }
    for (int i = 0; i < pairs; i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(metadata, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(pair, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_Format(PyExc_TypeError, "write: metadata pair %d is not a (bytes, bytes) tuple", i);
            goto done;
        }
        keys[i] = (span_t){PyBytes_AS_STRING(PyTuple_GET_ITEM(pair, 0)), (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 0))};
        values[i] = (span_t){PyBytes_AS_STRING(PyTuple_GET_ITEM(pair, 1)), (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1))};
    }
    for (; held < SPLIT_COLUMNS; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(columns, held), &out[held], PyBUF_C_CONTIGUOUS) < 0) goto release;
        if (held == 0) rows = out[0].len / (Py_ssize_t)widths[0];
        if (out[held].len != rows * (Py_ssize_t)widths[held] || (out[held].itemsize != (Py_ssize_t)widths[held] && rows > 0)) {
            PyErr_Format(PyExc_ValueError, "write: column %d holds %zd bytes of %zd-byte values, not %zd values of %zu bytes",
                         held, out[held].len, out[held].itemsize, rows, widths[held]);
            held++;
            goto release;
        }
    }
    if (settle(self, 0, 1) < 0) goto release;
    const void *data[SPLIT_COLUMNS];
    for (int k = 0; k < SPLIT_COLUMNS; k++) data[k] = out[k].buf;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = write_batch(self, rows, data, keys, values, pairs);
    pthread_mutex_lock(&self->mutex);
    if (failed) self->failed = failed;
    else count_batch(self, rows);
    pthread_mutex_unlock(&self->mutex);
    unclaim(self, 0);
    Py_END_ALLOW_THREADS
    if (failed) {
        errno = failed;
        PyErr_SetFromErrno(PyExc_OSError);
        goto release;
    }
    ok = 1;
release:
    while (held > 0) PyBuffer_Release(&out[--held]);
done:
    Py_DECREF(columns);
    Py_DECREF(metadata);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *BatchWriter_wait(PyObject *obj, PyObject *unused) {
    (void)unused;
    if (settle((BatchWriter *)obj, 0, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *BatchWriter_count(PyObject *obj, void *which) {
    BatchWriter *self = (BatchWriter *)obj;
    int64_t *count = which == NULL ? &self->events : which == (void *)1 ? &self->batches : which == (void *)2 ? &self->waits : &self->waited_ns;
    int64_t value = __atomic_load_n(count, __ATOMIC_RELAXED); /* no mutex: a forked child may find it held */
    return PyLong_FromLongLong(value);
}

static PyGetSetDef BatchWriter_getset[] = {
    {"events", BatchWriter_count, NULL, "events written whole", NULL},
    {"batches", BatchWriter_count, NULL, "batches written whole", (void *)1},
    {"waits", BatchWriter_count, NULL, "calls that waited for blocks in flight (the writer fell behind)", (void *)2},
    {"waited_ns", BatchWriter_count, NULL, "how long those calls waited in all, ns", (void *)3},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef BatchWriter_methods[] = {
    {"submit", (PyCFunction)(void (*)(void))BatchWriter_submit, METH_FASTCALL,
     "submit(block, first_seq, delta, delta_digest): the block's batch, written by the writer's thread"},
    {"write", (PyCFunction)(void (*)(void))BatchWriter_write, METH_FASTCALL,
     "write(columns, metadata): one batch of these columns and (key, value) pairs, written now"},
    {"wait", BatchWriter_wait, METH_NOARGS, "wait(): until the block in flight is written"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BatchWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpuviz.log._batchwriter.BatchWriter",
    .tp_basicsize = sizeof(BatchWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "BatchWriter(fd, chunk_rows): an event-log file's batches, written off the recording thread",
    .tp_new = BatchWriter_new,
    .tp_dealloc = BatchWriter_dealloc,
    .tp_methods = BatchWriter_methods,
    .tp_getset = BatchWriter_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuviz.log._batchwriter",
    .m_doc = "An event-log file's batches, written by a thread of their own (optional).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__batchwriter(void) {
    if (PyType_Ready(&BatchWriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "BatchWriter", (PyObject *)&BatchWriterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
