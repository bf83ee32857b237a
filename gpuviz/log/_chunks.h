/* The memory under gpuviz.log._staging's chunks (included by _staging.c only; no Python here).
 *
 * A Region is one anonymous mapping, aligned to and advised as huge pages:
 *
 *     base % HUGE_PAGE == 0, size % 4096 == 0        (bytes)
 *     holders >= 1 while mapped                      (the chunk that wraps it, a Request that
 *                                                     still hands it out, the thread populating it)
 *
 * The last holder to let go unmaps it (an atomic count: the maker thread holds no GIL).
 *
 * The maker: one thread per process that maps and populates the next chunk of every arena, so
 * that the recording thread never waits for mmap, munmap, madvise or a thread's creation (on this
 * project's VM mapping and aligning took 15-50 us and starting a populating thread 30-75 us,
 * once per chunk, inside a flush: benchmarks/bench_core.py; README, "Native core"). An arena asks
 * for its next chunk with request_region(size) once its current chunk is half written, and takes
 * it with request_claim() when it needs it: the Region if the maker has mapped it by then (mapped
 * regions are handed out at once; populating them -- madvise MADV_POPULATE_WRITE, Linux 5.14+,
 * pages faulted in without touching their contents -- goes on while rows are written), else NULL
 * and the arena maps one itself. A Request:
 *
 *     state: 0 queued, 1 mapped (region set), 2 failed (no memory)
 *     holders: the arena until it claims or drops the request, the maker until it is done with it
 *     region != NULL only in state 1, until claimed; the last holder releases an unclaimed one
 *
 * The maker runs at SCHED_IDLE (Linux): populating 8 MiB keeps a core busy for milliseconds on
 * this project's VM, and at normal priority it held off the file's batch writer
 * (_batchwriter.c) on the other vCPU, which made the recording thread wait for the writer
 * (2-15 ms a run of 200,000 pairs, the waits of LogWriter.waited_ns; ~0 at SCHED_IDLE). Where
 * it gets no core in time, the arena maps a chunk itself and the rows fault its pages in.
 *
 * A forked child has no maker thread (only the thread that forked runs there): the first request
 * in a new process starts a maker of its own; requests left from the parent stay unanswered
 * (claimed as NULL) and their few bytes are not reclaimed.
 */
#ifndef GPUVIZ_CHUNKS_H
#define GPUVIZ_CHUNKS_H

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20) /* bytes; regions are aligned to it */

typedef struct {
    char *base;  /* HUGE_PAGE-aligned anonymous mapping */
    size_t size; /* bytes */
    int holders; /* see above */
} Region;

static void region_release(Region *region) {
    if (__atomic_sub_fetch(&region->holders, 1, __ATOMIC_ACQ_REL) == 0) {
        munmap(region->base, region->size);
        free(region);
    }
}

/* A region of ``size`` bytes (a multiple of 4 KiB) with ``holders`` holders, or NULL (no memory). */
static Region *region_map(size_t size, int holders) {
    size_t span = size + HUGE_PAGE; /* room to align the start */
    char *map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return NULL;
    char *base = (char *)(((uintptr_t)map + HUGE_PAGE - 1) & ~((uintptr_t)HUGE_PAGE - 1));
    if (base > map) munmap(map, (size_t)(base - map));
    if (base + size < map + span) munmap(base + size, (size_t)(map + span - (base + size)));
#ifdef MADV_HUGEPAGE
    if (size >= HUGE_PAGE) (void)madvise(base, size, MADV_HUGEPAGE); /* plain pages where refused */
#endif
    Region *region = malloc(sizeof *region);
    if (region == NULL) {
        munmap(base, size);
        return NULL;
    }
    *region = (Region){.base = base, .size = size, .holders = holders};
    return region;
}

/* ------------------------------------------------------------------ the maker */
typedef struct Request {
    size_t size;
    Region *region;
    int state, holders;
    struct Request *queued; /* the next in the maker's queue */
} Request;

typedef struct {
    pid_t pid; /* the process whose thread this is */
    pthread_mutex_t mutex;
    pthread_cond_t wake, idle; /* idle: signalled when the queue is empty and nothing is in hand */
    Request *head, *tail;      /* queued, oldest first */
    int busy;                  /* a request taken off the queue and not yet done with */
} Maker;

static Maker *maker; /* this process's, or NULL (none started, or the parent's after a fork) */

static void request_release(Request *request) {
    if (__atomic_sub_fetch(&request->holders, 1, __ATOMIC_ACQ_REL) == 0) {
        if (request->region != NULL) region_release(request->region); /* mapped, never claimed */
        free(request);
    }
}

static void *maker_run(void *arg) { /* no Python, no GIL */
    Maker *m = arg;
#ifdef SCHED_IDLE /* Linux: it runs only where no other thread wants the core (see above) */
    struct sched_param idle = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
#endif
#ifdef __linux__
    (void)pthread_setname_np(pthread_self(), "gpuviz-chunks"); /* as top -H and py-spy show it */
#endif
    for (;;) {
        pthread_mutex_lock(&m->mutex);
        while (m->head == NULL) pthread_cond_wait(&m->wake, &m->mutex);
        Request *request = m->head;
        m->head = request->queued;
        if (m->head == NULL) m->tail = NULL;
        m->busy = 1;
        pthread_mutex_unlock(&m->mutex);
        Region *region = NULL;
        if (__atomic_load_n(&request->holders, __ATOMIC_ACQUIRE) > 1) /* else the arena dropped it */
            region = region_map(request->size, 2);                      /* the request's hold and ours */
        request->region = region;
        __atomic_store_n(&request->state, region != NULL ? 1 : 2, __ATOMIC_RELEASE);
        request_release(request);
        if (region != NULL) {
#if defined(MADV_POPULATE_WRITE)
            (void)madvise(region->base, region->size, MADV_POPULATE_WRITE); /* unsupported: rows fault them */
#endif
            region_release(region);
        }
        pthread_mutex_lock(&m->mutex);
        m->busy = 0;
        if (m->head == NULL) pthread_cond_broadcast(&m->idle);
        pthread_mutex_unlock(&m->mutex);
    }
    return NULL;
}

/* This process's maker, started on first use; NULL where no thread can start. */
static Maker *maker_get(void) {
    pid_t pid = getpid();
    if (maker != NULL && maker->pid == pid) return maker;
    Maker *m = calloc(1, sizeof *m); /* a parent's maker is left as it is: its lock may be held */
    if (m == NULL) return NULL;
    m->pid = pid;
    pthread_attr_t attr;
    pthread_t thread;
    int ok = pthread_mutex_init(&m->mutex, NULL) == 0 && pthread_cond_init(&m->wake, NULL) == 0 &&
             pthread_cond_init(&m->idle, NULL) == 0 && pthread_attr_init(&attr) == 0;
    if (ok) {
        (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        (void)pthread_attr_setstacksize(&attr, 64 << 10);
        ok = pthread_create(&thread, &attr, maker_run, m) == 0;
        pthread_attr_destroy(&attr);
    }
    if (!ok) {
        free(m);
        return NULL;
    }
    return maker = m;
}

/* Ask the maker for a region of ``size`` bytes; NULL where there is no maker (or no memory). */
static Request *request_region(size_t size) {
    Maker *m = maker_get();
    Request *request = m != NULL ? calloc(1, sizeof *request) : NULL;
    if (request == NULL) return NULL;
    request->size = size;
    request->holders = 2; /* the caller and the maker */
    pthread_mutex_lock(&m->mutex);
    if (m->tail != NULL) m->tail->queued = request;
    else m->head = request;
    m->tail = request;
    pthread_cond_signal(&m->wake);
    pthread_mutex_unlock(&m->mutex);
    return request;
}

/* Wait until this process's maker has mapped and populated every region asked of it so far (none
 * started: at once). For tests, which check what the maker did without racing it. */
static void maker_wait_idle(void) {
    Maker *m = maker;
    if (m == NULL || m->pid != getpid()) return;
    pthread_mutex_lock(&m->mutex);
    while (m->head != NULL || m->busy) pthread_cond_wait(&m->idle, &m->mutex);
    pthread_mutex_unlock(&m->mutex);
}

/* The requested region if the maker has mapped it (the caller holds it now), else NULL; the
 * request is let go either way. */
static Region *request_claim(Request *request) {
    Region *region = NULL;
    if (__atomic_load_n(&request->state, __ATOMIC_ACQUIRE) == 1) {
        region = request->region;
        request->region = NULL; /* before our release: the last holder must not release it too */
    }
    request_release(request);
    return region;
}

#endif
