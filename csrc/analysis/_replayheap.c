/* The heap that replay rebuilds in C (see _replayheap.h): the address maps, the chunk and
 * segment records, and one event applied with gpuviz.analysis.replay's rules. */
#include "_replayheap.h"

#include <stdlib.h>
#include <string.h>

static size_t slot_of(int64_t key, size_t mask) {
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}

int map_init(map_t *m, size_t capacity) {
    m->keys = malloc(capacity * sizeof(int64_t));
    m->values = malloc(capacity * sizeof(int64_t));
    if (m->keys == NULL || m->values == NULL) return -1;
    for (size_t i = 0; i < capacity; i++) m->keys[i] = EMPTY;
    m->capacity = capacity;
    m->count = 0;
    return 0;
}

void map_free(map_t *m) {
    free(m->keys);
    free(m->values);
}

int64_t *map_get(map_t *m, int64_t key) {
    size_t mask = m->capacity - 1, j = slot_of(key, mask);
    for (;;) {
        if (m->keys[j] == key) return &m->values[j];
        if (m->keys[j] == EMPTY) return NULL;
        j = (j + 1) & mask;
    }
}

int map_put(map_t *m, int64_t key, int64_t value) {
    if ((m->count + 1) * 2 > m->capacity) {
        map_t bigger;
        if (map_init(&bigger, m->capacity * 2) < 0) return -1;
        for (size_t i = 0; i < m->capacity; i++)
            if (m->keys[i] != EMPTY) map_put(&bigger, m->keys[i], m->values[i]);
        map_free(m);
        *m = bigger;
    }
    size_t mask = m->capacity - 1, j = slot_of(key, mask);
    while (m->keys[j] != EMPTY && m->keys[j] != key) j = (j + 1) & mask;
    if (m->keys[j] == EMPTY) m->count++;
    m->keys[j] = key;
    m->values[j] = value;
    return 0;
}

void map_remove(map_t *m, int64_t key) {
    size_t mask = m->capacity - 1, j = slot_of(key, mask);
    while (m->keys[j] != key) {
        if (m->keys[j] == EMPTY) return;
        j = (j + 1) & mask;
    }
    size_t hole = j;
    for (;;) {
        j = (j + 1) & mask;
        int64_t k = m->keys[j];
        if (k == EMPTY) break;
        size_t home = slot_of(k, mask);
        int passes = home <= j ? (home <= hole && hole < j) : (hole >= home || hole < j);
        if (passes) {
            m->keys[hole] = k;
            m->values[hole] = m->values[j];
            hole = j;
        }
    }
    m->keys[hole] = EMPTY;
    m->count--;
}

int buffer_add(buffer_t *b, const void *data, size_t n) {
    if (b->size + n > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 4096;
        while (capacity < b->size + n) capacity *= 2;
        char *grown = realloc(b->data, capacity);
        if (grown == NULL) return -1;
        b->data = grown;
        b->capacity = capacity;
    }
    memcpy(b->data + b->size, data, n);
    b->size += n;
    return 0;
}

int set_chunk(heap_t *h, int64_t address, int64_t size, int64_t requested, int32_t tag, int32_t stack) {
    chunk_rec rec = {address, size, requested, tag, stack};
    int64_t *at = map_get(&h->chunk_at, address);
    if (at) {
        h->chunks[*at] = rec;
        return 0;
    }
    if (h->n_chunks == h->cap_chunks) {
        size_t capacity = h->cap_chunks ? h->cap_chunks * 2 : 1024;
        chunk_rec *grown = realloc(h->chunks, capacity * sizeof(chunk_rec));
        if (grown == NULL) return -1;
        h->chunks = grown;
        h->cap_chunks = capacity;
    }
    h->chunks[h->n_chunks] = rec;
    if (map_put(&h->chunk_at, address, (int64_t)h->n_chunks) < 0) return -1;
    h->n_chunks++;
    return 0;
}

/* -1 with KeyError(key) set: the heap has no chunk or segment at ``key`` */
static int missing(int64_t key) {
    PyObject *value = PyLong_FromLongLong(key);
    if (value) PyErr_SetObject(PyExc_KeyError, value);
    Py_XDECREF(value);
    return -1;
}

/* 0, or -1 with KeyError set when there is no chunk at address */
static int del_chunk(heap_t *h, int64_t address) {
    int64_t *at = map_get(&h->chunk_at, address);
    if (at == NULL) {
        return missing(address);
    }
    int64_t hole = *at;
    map_remove(&h->chunk_at, address);
    h->n_chunks--;
    if ((size_t)hole != h->n_chunks) {
        h->chunks[hole] = h->chunks[h->n_chunks];
        *map_get(&h->chunk_at, h->chunks[hole].address) = hole;
    }
    return 0;
}

static int size_of_chunk(heap_t *h, int64_t address, int64_t *size) {
    int64_t *at = map_get(&h->chunk_at, address);
    if (at == NULL) {
        return missing(address);
    }
    *size = h->chunks[*at].size;
    return 0;
}

int set_segment(heap_t *h, int64_t base, int64_t size) {
    int64_t *at = map_get(&h->segment_at, base);
    if (at) {
        h->segments[*at].size = size;
        return 0;
    }
    if (h->n_segments == h->cap_segments) {
        size_t capacity = h->cap_segments ? h->cap_segments * 2 : 64;
        segment_rec *grown = realloc(h->segments, capacity * sizeof(segment_rec));
        if (grown == NULL) return -1;
        h->segments = grown;
        h->cap_segments = capacity;
    }
    h->segments[h->n_segments] = (segment_rec){base, size};
    if (map_put(&h->segment_at, base, (int64_t)h->n_segments) < 0) return -1;
    h->n_segments++;
    return 0;
}

static int del_segment(heap_t *h, int64_t base) {
    int64_t *at = map_get(&h->segment_at, base);
    if (at == NULL) {
        return missing(base);
    }
    int64_t hole = *at;
    map_remove(&h->segment_at, base);
    h->n_segments--;
    if ((size_t)hole != h->n_segments) {
        h->segments[hole] = h->segments[h->n_segments];
        *map_get(&h->segment_at, h->segments[hole].base) = hole;
    }
    return 0;
}

/* segment_map: [a, a+n) joins the segments ending at a and starting at a+n (a scan of the
 * segments, as replay._map) */
static int map_range(heap_t *h, int64_t a, int64_t n) {
    int64_t upper = 0, *at = map_get(&h->segment_at, a + n);
    if (at) {
        upper = h->segments[*at].size;
        del_segment(h, a + n);
    }
    for (size_t j = 0; j < h->n_segments; j++)
        if (h->segments[j].base + h->segments[j].size == a) {
            h->segments[j].size += n + upper;
            return 0;
        }
    return set_segment(h, a, n + upper) < 0 ? -2 : 0;
}

/* segment_unmap: [a, a+n) leaves its segment (as replay._unmap); -1 with KeyError when no
 * segment holds a, -2 when out of memory */
static int unmap_range(heap_t *h, int64_t a, int64_t n) {
    for (size_t j = 0; j < h->n_segments; j++) {
        int64_t base = h->segments[j].base, end = base + h->segments[j].size;
        if (base <= a && a < end) {
            if (a > base) h->segments[j].size = a - base;
            else if (del_segment(h, base) < 0) return -1;
            if (a + n < end && set_segment(h, a + n, end - a - n) < 0) return -2;
            return 0;
        }
    }
    return missing(a);
}

void heap_free(heap_t *h) {
    free(h->chunks);
    free(h->segments);
    map_free(&h->chunk_at);
    map_free(&h->segment_at);
}

int apply_event(heap_t *h, int kind, int64_t a, int64_t s, int64_t requested, int32_t tag, int32_t stack) {
    int64_t old;
    int failed = 0;
    switch (kind) {
    case ALLOC:
        return set_chunk(h, a, s, requested, tag, stack) < 0 ? -2 : 0;
    case FREE:
        return set_chunk(h, a, s, 0, -1, -1) < 0 ? -2 : 0;
    case SPLIT:
        if (size_of_chunk(h, a, &old) < 0) return -1;
        return (set_chunk(h, a, s, 0, -1, -1) < 0 || set_chunk(h, a + s, old - s, 0, -1, -1) < 0) ? -2 : 0;
    case MERGE:
        if (size_of_chunk(h, a, &old) < 0 || del_chunk(h, a + old) < 0) return -1;
        return set_chunk(h, a, s, 0, -1, -1) < 0 ? -2 : 0;
    case SEGMENT_ALLOC:
        return (set_segment(h, a, s) < 0 || set_chunk(h, a, s, 0, -1, -1) < 0) ? -2 : 0;
    case SEGMENT_MAP:
        failed = map_range(h, a, s);
        if (!failed) failed = set_chunk(h, a, s, 0, -1, -1) < 0 ? -2 : 0;
        return failed;
    case SEGMENT_UNMAP:
        failed = unmap_range(h, a, s);
        if (failed) return failed;
        return del_chunk(h, a) < 0 ? -1 : 0;
    default: /* segment_free */
        return (del_segment(h, a) < 0 || del_chunk(h, a) < 0) ? -1 : 0;
    }
}
