/* gpuviz.scenarios._whatifcore: what-if replays of a request stream in C (optional).
 *
 * replay(kind, device, columns, upstream, free_segments, stop_at_oom, settings, tables, bfc)
 * serves a request stream (gpuviz.analysis.requests) with one policy over a simulated
 * device and returns the replay's events as columns (gpuviz.log.schema.ROW_COLUMNS, one
 * bytearray each). The policies are the Python models' decisions, restated:
 *
 *   kind 1  torch     gpuviz.capture.torch_caching.TorchCachingAllocator (no expandable segments)
 *   kind 2  rmm-pool  gpuviz.capture.pools.RmmPoolAllocator
 *   kind 3  no-pool   gpuviz.capture.pools.NoPoolAllocator
 *   kind 4  tf-bfc    gpuviz.capture.native.NativeBFCAllocator: the BFC core (_bfc_core.c) with
 *                     the growth, limit and garbage collection of native.py/bfc.py restated
 *
 * over gpuviz.capture.upstream.SimUpstream (first fit by address), recording what
 * gpuviz.log.heapbuilder.HeapBuilder records for each decision (split, alloc, free, merge,
 * segment_alloc, segment_free, oom, with the largest free chunk after each; tf-bfc: what the
 * native core records, its thread column the replaying thread). The Python
 * models stay the executable reference: tests drive both on the same streams and compare
 * the logs row by row. The replay loop is gpuviz.scenarios.whatif.replay_policy's.
 *
 * columns: (is_alloc u8, deferred u8, alloc_of i64, requested i64, time_ns i64, tag i64,
 * stack i64), one entry per request; tables: (strings, stacks), the sizes of the source's
 * tables. Events carry the request's time, and tag and stack indices numbered in order of
 * first use (as the Python replay interns them). Returns (served, processed, columns, tags,
 * stacks): requests served, requests looked at (the replay stops after the first out of
 * memory unless stop_at_oom is false), the 14 columns, and the source's tag and stack
 * indices in order of first use. Sizes and addresses are bytes, times ns. bfc: (next_segment,
 * gc, warn) for tf-bfc: TF's first segment size, garbage collection on, and the callable that
 * logs its warning (count, bytes, rounded request).
 *
 * Free blocks and free chunks are ordered sets of (size, address) in binned sorted arrays;
 * the device's free gaps a treap by address whose nodes know their subtree's largest gap
 * (first fit); blocks are found by address in an open-addressing hash table.
 * Running out of host memory unwinds with longjmp to replay(), which frees everything.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../capture/_bfc_core.h"

#ifdef Py_GIL_DISABLED
#error "rows are appended relying on the GIL; the Python replay is used instead"
#endif

enum { SEGMENT_ALLOC = 0, SEGMENT_FREE = 1, ALLOC = 2, FREE = 3, SPLIT = 4, MERGE = 5, OOM = 6 };
enum { TORCH = 1, RMM = 2, NOPOOL = 3, BFC = 4 };

#define ALIGNMENT 256
#define MIN_BLOCK 512
#define SMALL_SIZE ((int64_t)1 << 20)
#define SMALL_BUFFER ((int64_t)2 << 20)
#define LARGE_BUFFER ((int64_t)20 << 20)
#define MIN_LARGE_ALLOC ((int64_t)10 << 20)
#define ROUND_LARGE ((int64_t)2 << 20)
#define NO_MAX_SPLIT INT64_MAX

/* ------------------------------------------------------------------ context */
typedef struct {
    int64_t k1, k2, val, max; /* key (k1, k2); max: the largest val in the subtree */
    int32_t left, right;
    uint32_t priority;
} node_t;

/* An ordered set of (size, address) keys: sorted arrays in 512 bins of sizes (8 per power of
 * two, so a bin's sizes lie within 1/8 of each other), a bitmap of the non-empty bins. Best
 * fit is a binary search in one bin, or the first key of the next non-empty bin. */
#define NBINS 512
typedef struct {
    int64_t *keys; /* (size, address) pairs, sorted */
    int32_t n, cap;
} bin_t;

typedef struct {
    bin_t bins[NBINS];
    uint64_t nonempty[NBINS / 64];
} set_t;

typedef struct {
    int64_t address, size, segment, requested, age; /* requested 0: free */
    int32_t prev, next;                             /* neighbours in the segment, -1 none */
    int32_t tag, stack, pending;                    /* pending: slot in the deferred list, -1 none */
    uint8_t small;
} block_t;

typedef struct {
    jmp_buf fail;
    int failed_python; /* a Python exception is set (else: out of memory) */
    /* the replay's events: one bytearray per column of gpuviz.log.schema.ROW_COLUMNS */
    PyObject *out[14];
    char *out_at[14];
    Py_ssize_t rows, row_cap;
    int16_t device;
    int64_t now;
    node_t *nodes;
    int32_t node_cap, node_used, node_free;
    uint64_t random;
    set_t free_chunks; /* HeapBuilder's free chunks: the largest free */
    /* SimUpstream */
    int64_t capacity, device_reserved, tail;
    int32_t holes; /* keyed (address, 0), val = size */
    /* blocks by address */
    block_t *blocks;
    int32_t block_cap, block_used, block_free;
    int64_t *keys;
    int32_t *values;
    size_t map_cap, map_n;
    /* policy */
    int kind;
    int64_t reserved, in_use;
    set_t pool[2];    /* free blocks; torch: [0] large, [1] small; rmm: pool[0] */
    int64_t calls[2]; /* torch: get_free_block calls per pool (GC ages) */
    int64_t max_split, allowed, maximum; /* allowed/maximum: -1 none; BFC: maximum is the memory limit */
    double gc_threshold;
    int64_t divisions[16];
    int64_t *pending_keys; /* torch's deferred frees in order: (address, key) pairs; address -1 done */
    size_t pending_n, pending_cap, pending_live;
    uint8_t *synchronized, *waiting; /* per allocation position */
    int32_t *tag_ids, *stack_ids; /* source index -> the replay log's (-1 not used yet) */
    Py_ssize_t n_tags, n_stacks;
    PyObject *tag_order, *stack_order; /* lists of source indices in order of first use */
    /* tf-bfc */
    bfc_t bfc;
    int bfc_ready, bfc_gc;
    int64_t next_segment; /* TF's next segment size (bytes) */
    int64_t thread;       /* the thread column of BFC's events: the replaying thread, as recorded */
    PyObject *warn;       /* warn(count, bytes, rounded): garbage collection's warning */
} ctx_t;

static void *grow_array(ctx_t *c, void *p, size_t n, size_t size) {
    void *q = realloc(p, n * size);
    if (!q) longjmp(c->fail, 1);
    return q;
}

/* ------------------------------------------------------------------ treaps */
static inline int key_less(int64_t a1, int64_t a2, int64_t b1, int64_t b2) { return a1 < b1 || (a1 == b1 && a2 < b2); }

static inline void update(ctx_t *c, int32_t t) {
    node_t *x = &c->nodes[t];
    int64_t m = x->val;
    if (x->left >= 0 && c->nodes[x->left].max > m) m = c->nodes[x->left].max;
    if (x->right >= 0 && c->nodes[x->right].max > m) m = c->nodes[x->right].max;
    x->max = m;
}

static void split(ctx_t *c, int32_t t, int64_t k1, int64_t k2, int32_t *l, int32_t *r) {
    if (t < 0) {
        *l = *r = -1;
        return;
    }
    node_t *x = &c->nodes[t];
    if (key_less(x->k1, x->k2, k1, k2)) {
        split(c, x->right, k1, k2, &x->right, r);
        *l = t;
    } else {
        split(c, x->left, k1, k2, l, &x->left);
        *r = t;
    }
    update(c, t);
}

static int32_t join(ctx_t *c, int32_t l, int32_t r) {
    if (l < 0) return r;
    if (r < 0) return l;
    if (c->nodes[l].priority > c->nodes[r].priority) {
        c->nodes[l].right = join(c, c->nodes[l].right, r);
        update(c, l);
        return l;
    }
    c->nodes[r].left = join(c, l, c->nodes[r].left);
    update(c, r);
    return r;
}

/* put node x into the tree t: below the nodes of higher priority, splitting what it lands on */
static int32_t insert_at(ctx_t *c, int32_t t, int32_t x) {
    if (t < 0) return x;
    node_t *n = &c->nodes[x];
    if (n->priority > c->nodes[t].priority) {
        split(c, t, n->k1, n->k2, &n->left, &n->right);
        update(c, x);
        return x;
    }
    if (key_less(n->k1, n->k2, c->nodes[t].k1, c->nodes[t].k2))
        c->nodes[t].left = insert_at(c, c->nodes[t].left, x);
    else
        c->nodes[t].right = insert_at(c, c->nodes[t].right, x);
    update(c, t);
    return t;
}

/* give the node keyed (k1, k2) the key (to1, k2) and val: its place in the order must not change */
static void tree_modify(ctx_t *c, int32_t t, int64_t k1, int64_t k2, int64_t to1, int64_t val) {
    node_t *x = &c->nodes[t];
    if (x->k1 == k1 && x->k2 == k2) {
        x->k1 = to1;
        x->val = val;
    } else {
        tree_modify(c, key_less(k1, k2, x->k1, x->k2) ? x->left : x->right, k1, k2, to1, val);
    }
    update(c, t);
}

static void tree_insert(ctx_t *c, int32_t *root, int64_t k1, int64_t k2, int64_t val) {
    int32_t t = c->node_free;
    if (t >= 0) {
        c->node_free = c->nodes[t].left;
    } else {
        if (c->node_used == c->node_cap) {
            c->node_cap = c->node_cap ? 2 * c->node_cap : 1024;
            c->nodes = grow_array(c, c->nodes, (size_t)c->node_cap, sizeof(node_t));
        }
        t = c->node_used++;
    }
    c->random ^= c->random << 13; /* xorshift64: deterministic priorities */
    c->random ^= c->random >> 7;
    c->random ^= c->random << 17;
    c->nodes[t] = (node_t){k1, k2, val, val, -1, -1, (uint32_t)(c->random >> 32)};
    *root = insert_at(c, *root, t);
}

static int32_t erase_at(ctx_t *c, int32_t t, int64_t k1, int64_t k2) {
    if (t < 0) return -1; /* not there: callers only erase what they inserted */
    node_t *x = &c->nodes[t];
    if (x->k1 == k1 && x->k2 == k2) {
        int32_t rest = join(c, x->left, x->right);
        c->nodes[t].left = c->node_free;
        c->node_free = t;
        return rest;
    }
    if (key_less(k1, k2, x->k1, x->k2))
        x->left = erase_at(c, x->left, k1, k2);
    else
        x->right = erase_at(c, x->right, k1, k2);
    update(c, t);
    return t;
}

static void tree_erase(ctx_t *c, int32_t *root, int64_t k1, int64_t k2) { *root = erase_at(c, *root, k1, k2); }

/* the smallest key >= (k1, k2), -1 none */
static int32_t lower_bound(const ctx_t *c, int32_t t, int64_t k1, int64_t k2) {
    int32_t best = -1;
    while (t >= 0) {
        const node_t *x = &c->nodes[t];
        if (key_less(x->k1, x->k2, k1, k2)) {
            t = x->right;
        } else {
            best = t;
            t = x->left;
        }
    }
    return best;
}

/* the largest key < (k1, k2), -1 none */
static int32_t before(const ctx_t *c, int32_t t, int64_t k1, int64_t k2) {
    int32_t best = -1;
    while (t >= 0) {
        const node_t *x = &c->nodes[t];
        if (key_less(x->k1, x->k2, k1, k2)) {
            best = t;
            t = x->right;
        } else {
            t = x->left;
        }
    }
    return best;
}

/* the lowest key whose val >= need (first fit over gaps by address), -1 none */
static int32_t first_fit(const ctx_t *c, int32_t t, int64_t need) {
    while (t >= 0 && c->nodes[t].max >= need) {
        const node_t *x = &c->nodes[t];
        if (x->left >= 0 && c->nodes[x->left].max >= need)
            t = x->left;
        else if (x->val >= need)
            return t;
        else
            t = x->right;
    }
    return -1;
}

/* ------------------------------------------------------------------ binned sets */
static inline int bin_of(int64_t size) {
    if (size < 8) return size < 0 ? 0 : (int)size;
    int msb = 63 - __builtin_clzll((unsigned long long)size);
    return msb * 8 + (int)((size >> (msb - 3)) & 7);
}

/* index of the first key >= (size, address) in bin b */
static int32_t bin_lower(const bin_t *b, int64_t size, int64_t address) {
    int32_t lo = 0, hi = b->n;
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        if (key_less(b->keys[2 * mid], b->keys[2 * mid + 1], size, address))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void set_insert(ctx_t *c, set_t *s, int64_t size, int64_t address) {
    int i = bin_of(size);
    bin_t *b = &s->bins[i];
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 4;
        b->keys = grow_array(c, b->keys, 2 * (size_t)b->cap, sizeof(int64_t));
    }
    int32_t at = bin_lower(b, size, address);
    memmove(&b->keys[2 * at + 2], &b->keys[2 * at], 2 * (size_t)(b->n - at) * sizeof(int64_t));
    b->keys[2 * at] = size;
    b->keys[2 * at + 1] = address;
    b->n++;
    s->nonempty[i / 64] |= (uint64_t)1 << (i % 64);
}

static void set_erase(set_t *s, int64_t size, int64_t address) {
    int i = bin_of(size);
    bin_t *b = &s->bins[i];
    int32_t at = bin_lower(b, size, address); /* callers only erase what they inserted */
    memmove(&b->keys[2 * at], &b->keys[2 * at + 2], 2 * (size_t)(b->n - at - 1) * sizeof(int64_t));
    if (--b->n == 0) s->nonempty[i / 64] &= ~((uint64_t)1 << (i % 64));
}

/* the first non-empty bin from i up (NBINS none), the last from i down (-1 none) */
static int bin_above(const set_t *s, int i) {
    if (i >= NBINS) return NBINS;
    int w = i / 64;
    uint64_t bits = s->nonempty[w] & (~(uint64_t)0 << (i % 64));
    while (!bits) {
        if (++w == NBINS / 64) return NBINS;
        bits = s->nonempty[w];
    }
    return w * 64 + __builtin_ctzll(bits);
}

static int bin_below(const set_t *s, int i) {
    if (i < 0) return -1;
    int w = i / 64;
    uint64_t bits = s->nonempty[w] & (~(uint64_t)0 >> (63 - i % 64));
    while (!bits) {
        if (--w < 0) return -1;
        bits = s->nonempty[w];
    }
    return w * 64 + 63 - __builtin_clzll(bits);
}

/* the smallest key >= (size, address) into key[0..1]; 0 when none */
static int set_lower_bound(const set_t *s, int64_t size, int64_t address, int64_t key[2]) {
    int i = bin_of(size);
    const bin_t *b = &s->bins[i];
    int32_t at = bin_lower(b, size, address);
    if (at == b->n) {
        i = bin_above(s, i + 1);
        if (i == NBINS) return 0;
        b = &s->bins[i];
        at = 0;
    }
    key[0] = b->keys[2 * at], key[1] = b->keys[2 * at + 1];
    return 1;
}

/* the largest key < (size, address) into key[0..1]; 0 when none */
static int set_before(const set_t *s, int64_t size, int64_t address, int64_t key[2]) {
    int i = bin_of(size);
    const bin_t *b = &s->bins[i];
    int32_t at = bin_lower(b, size, address);
    if (at == 0) {
        i = bin_below(s, i - 1);
        if (i < 0) return 0;
        b = &s->bins[i];
        at = b->n;
    }
    key[0] = b->keys[2 * at - 2], key[1] = b->keys[2 * at - 1];
    return 1;
}

static int set_last(const set_t *s, int64_t key[2]) { return set_before(s, INT64_MAX, INT64_MAX, key); }

static int64_t set_largest(const set_t *s) {
    int i = bin_below(s, NBINS - 1);
    return i < 0 ? 0 : s->bins[i].keys[2 * s->bins[i].n - 2];
}

/* every key in order, as (size, address) pairs in a malloc'd array (the caller frees it) */
static int64_t *set_keys(ctx_t *c, const set_t *s, size_t *n) {
    size_t total = 0;
    for (int i = bin_above(s, 0); i < NBINS; i = bin_above(s, i + 1)) total += (size_t)s->bins[i].n;
    int64_t *keys = grow_array(c, NULL, 2 * total + 2, sizeof(int64_t));
    *n = 0;
    for (int i = bin_above(s, 0); i < NBINS; i = bin_above(s, i + 1)) {
        memcpy(&keys[2 * *n], s->bins[i].keys, 2 * (size_t)s->bins[i].n * sizeof(int64_t));
        *n += (size_t)s->bins[i].n;
    }
    return keys;
}

static void set_destroy(set_t *s) {
    for (int i = 0; i < NBINS; i++) free(s->bins[i].keys);
}

/* ------------------------------------------------------------------ blocks by address */
static inline size_t slot_of(const ctx_t *c, int64_t key) { /* splitmix64's finalizer */
    uint64_t h = (uint64_t)key;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    return (size_t)((h ^ (h >> 31)) & (c->map_cap - 1));
}

#define EMPTY INT64_MIN

static int32_t block_at(const ctx_t *c, int64_t address) {
    for (size_t i = slot_of(c, address);; i = (i + 1) & (c->map_cap - 1)) {
        if (c->keys[i] == address) return c->values[i];
        if (c->keys[i] == EMPTY) return -1;
    }
}

static void map_put(ctx_t *c, int64_t address, int32_t block) {
    if ((c->map_n + 1) * 2 > c->map_cap) {
        size_t old_cap = c->map_cap;
        int64_t *old_keys = c->keys;
        int32_t *old_values = c->values;
        c->map_cap = old_cap ? 2 * old_cap : 1024;
        c->keys = malloc(c->map_cap * sizeof(int64_t));
        c->values = malloc(c->map_cap * sizeof(int32_t));
        if (!c->keys || !c->values) {
            free(c->keys);
            free(c->values);
            c->keys = old_keys, c->values = old_values, c->map_cap = old_cap;
            longjmp(c->fail, 1);
        }
        for (size_t i = 0; i < c->map_cap; i++) c->keys[i] = EMPTY;
        for (size_t i = 0; i < old_cap; i++) {
            if (old_keys[i] == EMPTY) continue;
            size_t j = slot_of(c, old_keys[i]);
            while (c->keys[j] != EMPTY) j = (j + 1) & (c->map_cap - 1);
            c->keys[j] = old_keys[i];
            c->values[j] = old_values[i];
        }
        free(old_keys);
        free(old_values);
    }
    size_t i = slot_of(c, address);
    while (c->keys[i] != EMPTY && c->keys[i] != address) i = (i + 1) & (c->map_cap - 1);
    if (c->keys[i] == EMPTY) c->map_n++;
    c->keys[i] = address;
    c->values[i] = block;
}

static void map_remove(ctx_t *c, int64_t address) { /* linear probing: backward-shift deletion */
    size_t mask = c->map_cap - 1, i = slot_of(c, address);
    while (c->keys[i] != address) i = (i + 1) & mask;
    for (size_t j = (i + 1) & mask; c->keys[j] != EMPTY; j = (j + 1) & mask) {
        size_t home = slot_of(c, c->keys[j]);
        if (((j - home) & mask) >= ((j - i) & mask)) { /* j's entry may move back to i */
            c->keys[i] = c->keys[j];
            c->values[i] = c->values[j];
            i = j;
        }
    }
    c->keys[i] = EMPTY;
    c->map_n--;
}

static int32_t new_block(ctx_t *c, int64_t address, int64_t size, int64_t segment, uint8_t small) {
    int32_t b = c->block_free;
    if (b >= 0) {
        c->block_free = c->blocks[b].next;
    } else {
        if (c->block_used == c->block_cap) {
            c->block_cap = c->block_cap ? 2 * c->block_cap : 1024;
            c->blocks = grow_array(c, c->blocks, (size_t)c->block_cap, sizeof(block_t));
        }
        b = c->block_used++;
    }
    c->blocks[b] = (block_t){address, size, segment, 0, 0, -1, -1, -1, -1, -1, small};
    map_put(c, address, b);
    return b;
}

static void drop_block(ctx_t *c, int32_t b) {
    map_remove(c, c->blocks[b].address);
    c->blocks[b].next = c->block_free;
    c->block_free = b;
}

/* ------------------------------------------------------------------ rows (HeapBuilder's) */
/* bytes per value of each column, in ROW_COLUMNS order: time_ns kind flags device peer thread
 * address size requested segment largest_free duration_ns tag stack */
static const int WIDTHS[14] = {8, 1, 1, 2, 2, 8, 8, 8, 8, 8, 8, 8, 4, 4};

static void resize_columns(ctx_t *c, Py_ssize_t rows) {
    for (int i = 0; i < 14; i++) {
        if (PyByteArray_Resize(c->out[i], rows * WIDTHS[i]) < 0) {
            c->failed_python = 1;
            longjmp(c->fail, 1);
        }
        c->out_at[i] = PyByteArray_AS_STRING(c->out[i]);
    }
    c->row_cap = rows;
}

#define PUT(column, type, value)                                                  \
    do {                                                                          \
        type v_ = (type)(value);                                                  \
        memcpy(c->out_at[column] + c->rows * (Py_ssize_t)sizeof(type), &v_, sizeof(type)); \
    } while (0)

static void put_row(ctx_t *c, int kind, int64_t address, int64_t size, int64_t requested, int64_t segment,
                    int64_t largest, int32_t tag, int32_t stack, int64_t thread) {
    if (c->rows == c->row_cap) resize_columns(c, c->row_cap ? 2 * c->row_cap : 4096);
    PUT(0, int64_t, c->now);
    PUT(1, uint8_t, kind);
    PUT(2, int8_t, 0);
    PUT(3, int16_t, c->device);
    PUT(4, int16_t, -1);
    PUT(5, int64_t, thread);
    PUT(6, int64_t, address);
    PUT(7, int64_t, size);
    PUT(8, int64_t, requested);
    PUT(9, int64_t, segment);
    PUT(10, int64_t, largest);
    PUT(11, int64_t, 0);
    PUT(12, int32_t, tag);
    PUT(13, int32_t, stack);
    c->rows++;
}

/* a row of HeapBuilder's: the largest free chunk after the event, thread 0 */
static void row(ctx_t *c, int kind, int64_t address, int64_t size, int64_t requested, int64_t segment, int32_t tag,
                int32_t stack) {
    put_row(c, kind, address, size, requested, segment, set_largest(&c->free_chunks), tag, stack, 0);
}

static void heap_segment_alloc(ctx_t *c, int64_t base, int64_t size) {
    set_insert(c, &c->free_chunks, size, base);
    row(c, SEGMENT_ALLOC, base, size, 0, base, -1, -1);
}

static void heap_segment_free(ctx_t *c, int64_t base, int64_t size) {
    set_erase(&c->free_chunks, size, base);
    row(c, SEGMENT_FREE, base, size, 0, base, -1, -1);
}

/* size bytes at address handed out from the free chunk [address, +chunk) */
static void heap_alloc(ctx_t *c, const block_t *b, int64_t chunk) {
    if (b->size < chunk) {
        set_erase(&c->free_chunks, chunk, b->address);
        set_insert(c, &c->free_chunks, b->size, b->address);
        set_insert(c, &c->free_chunks, chunk - b->size, b->address + b->size);
        row(c, SPLIT, b->address, b->size, 0, b->segment, -1, -1);
    }
    set_erase(&c->free_chunks, b->size, b->address);
    row(c, ALLOC, b->address, b->size, b->requested, b->segment, b->tag, b->stack);
}

static void heap_merge(ctx_t *c, int64_t address, int64_t size, int64_t upper, int64_t segment) {
    set_erase(&c->free_chunks, size, address);
    set_erase(&c->free_chunks, upper, address + size);
    set_insert(c, &c->free_chunks, size + upper, address);
    row(c, MERGE, address, size + upper, 0, segment, -1, -1);
}

/* ------------------------------------------------------------------ SimUpstream */
static int64_t device_allocate(ctx_t *c, int64_t nbytes) {
    if (c->device_reserved + nbytes > c->capacity) return -1;
    int64_t address = c->tail;
    int32_t hole = first_fit(c, c->holes, nbytes);
    if (hole >= 0) {
        int64_t at = c->nodes[hole].k1, size = c->nodes[hole].val;
        address = at;
        if (size > nbytes) /* the rest of the gap keeps its place among the gaps */
            tree_modify(c, c->holes, at, 0, at + nbytes, size - nbytes);
        else
            tree_erase(c, &c->holes, at, 0);
    } else {
        c->tail += nbytes;
    }
    c->device_reserved += nbytes;
    return address;
}

static void device_free(ctx_t *c, int64_t address, int64_t size) {
    c->device_reserved -= size;
    int64_t end = address + size, start = address;
    int32_t p = before(c, c->holes, address, 0);
    int joined = p >= 0 && c->nodes[p].k1 + c->nodes[p].val == address; /* the gap just below */
    if (joined) start = c->nodes[p].k1, size += c->nodes[p].val;
    if (end == c->tail) { /* the free space at the top grows down */
        if (joined) tree_erase(c, &c->holes, start, 0);
        c->tail = start;
        return;
    }
    int32_t n = lower_bound(c, c->holes, end, 0);
    int above = n >= 0 && c->nodes[n].k1 == end; /* the gap just above */
    if (above) size += c->nodes[n].val;
    if (joined && above) tree_erase(c, &c->holes, end, 0);
    if (joined)
        tree_modify(c, c->holes, start, 0, start, size);
    else if (above)
        tree_modify(c, c->holes, end, 0, start, size);
    else
        tree_insert(c, &c->holes, start, 0, size);
}

/* a new segment from the device (recorded), or -1 */
static int64_t reserve(ctx_t *c, int64_t size) {
    int64_t base = device_allocate(c, size);
    if (base < 0) return -1;
    heap_segment_alloc(c, base, size);
    c->reserved += size;
    return base;
}

/* ------------------------------------------------------------------ pools (torch, rmm) */
static set_t *pool_of(ctx_t *c, const block_t *b) { return &c->pool[c->kind == TORCH ? b->small : 0]; }

static void insert_free(ctx_t *c, int32_t bi) {
    block_t *b = &c->blocks[bi];
    b->requested = 0;
    b->age = c->calls[b->small];
    set_insert(c, pool_of(c, b), b->size, b->address);
}

static void remove_free(ctx_t *c, const block_t *b) { set_erase(pool_of(c, b), b->size, b->address); }

/* split the taken free block bi at size: the rest becomes a free block after it */
static void split_block(ctx_t *c, int32_t bi, int64_t size) {
    block_t b = c->blocks[bi];
    int32_t rest = new_block(c, b.address + size, b.size - size, b.segment, b.small);
    block_t *r = &c->blocks[rest];
    r->prev = bi;
    r->next = b.next;
    if (b.next >= 0) c->blocks[b.next].prev = rest;
    c->blocks[bi].next = rest;
    c->blocks[bi].size = size;
    insert_free(c, rest);
}

/* hand out block bi (taken from its pool, maybe split) for nbytes; records split and alloc */
static int64_t hand_out(ctx_t *c, int32_t bi, int64_t chunk, int64_t nbytes, int32_t tag, int32_t stack) {
    block_t *b = &c->blocks[bi];
    b->requested = nbytes > 1 ? nbytes : 1;
    b->tag = tag;
    b->stack = stack;
    heap_alloc(c, b, chunk);
    c->in_use += b->size;
    return b->address;
}

/* return a live block: recorded as free, then merged with a free next and previous neighbour */
static void free_block(ctx_t *c, int32_t bi) {
    block_t *b = &c->blocks[bi];
    c->in_use -= b->size;
    set_insert(c, &c->free_chunks, b->size, b->address);
    row(c, FREE, b->address, b->size, b->requested, b->segment, b->tag, b->stack);
    int32_t next = b->next, prev = b->prev;
    int64_t size = b->size;
    if (next >= 0 && c->blocks[next].requested == 0) {
        block_t *n = &c->blocks[next];
        heap_merge(c, b->address, size, n->size, b->segment);
        remove_free(c, n);
        size += n->size;
        b->next = n->next;
        if (n->next >= 0) c->blocks[n->next].prev = bi;
        drop_block(c, next);
        b = &c->blocks[bi];
    }
    b->size = size;
    if (prev >= 0 && c->blocks[prev].requested == 0) {
        block_t *p = &c->blocks[prev];
        heap_merge(c, p->address, p->size, size, b->segment);
        remove_free(c, p);
        p->size += size;
        p->next = b->next;
        if (b->next >= 0) c->blocks[b->next].prev = prev;
        drop_block(c, bi);
        bi = prev;
    }
    insert_free(c, bi);
}

/* ------------------------------------------------------------------ torch */
static int64_t next_division(int64_t size, int64_t divisions) {
    if (size <= 4 || divisions <= 1 || (size & (size - 1)) == 0) return size;
    int bits = 63 - __builtin_clzll((unsigned long long)size);
    int64_t floor = (int64_t)1 << bits;
    int dbits = 63 - __builtin_clzll((unsigned long long)divisions);
    int64_t step = floor >> dbits;
    if (step == 0) return floor << 1;
    int64_t rounded = size & ~(step - 1);
    return rounded == size ? size : rounded + step;
}

static int64_t round_size(const ctx_t *c, int64_t size) {
    if (size < MIN_BLOCK) return MIN_BLOCK;
    int index = 63 - __builtin_clzll((unsigned long long)size) - 20;
    index = index < 0 ? 0 : index > 15 ? 15 : index;
    int64_t divisions = c->divisions[index];
    if (divisions > 1 && size > MIN_BLOCK * divisions) return next_division(size, divisions);
    return (size + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

static int64_t segment_size(int64_t rounded) {
    if (rounded <= SMALL_SIZE) return SMALL_BUFFER;
    if (rounded < MIN_LARGE_ALLOC) return LARGE_BUFFER;
    return ROUND_LARGE * ((rounded + ROUND_LARGE - 1) / ROUND_LARGE);
}

static int gc_on(const ctx_t *c) { return c->allowed >= 0 && c->gc_threshold > 0; }

static int32_t get_free_block(ctx_t *c, int small, int64_t size) {
    if (gc_on(c)) c->calls[small]++;
    int64_t key[2];
    if (!set_lower_bound(&c->pool[small], size, INT64_MIN, key)) return -1;
    int64_t block_size = key[0], address = key[1];
    if (size < c->max_split && block_size >= c->max_split) return -1;
    if (size >= c->max_split && block_size >= size + LARGE_BUFFER) return -1;
    set_erase(&c->pool[small], block_size, address);
    return block_at(c, address);
}

static int32_t alloc_segment(ctx_t *c, int small, int64_t size) {
    if (c->allowed >= 0 && c->reserved + size > c->allowed) return -1;
    int64_t base = reserve(c, size);
    return base < 0 ? -1 : new_block(c, base, size, base, (uint8_t)small);
}

/* cudaFree a wholly free segment (its block already out of its pool) */
static void release_segment(ctx_t *c, int64_t address) {
    int32_t bi = block_at(c, address);
    int64_t size = c->blocks[bi].size;
    drop_block(c, bi);
    heap_segment_free(c, address, size);
    device_free(c, address, size);
    c->reserved -= size;
}

static int whole_segment(const ctx_t *c, int64_t address) {
    const block_t *b = &c->blocks[block_at(c, address)];
    return b->prev < 0 && b->next < 0;
}

static int release_available_cached_blocks(ctx_t *c, int64_t size) {
    if (c->max_split == NO_MAX_SPLIT) return 0;
    set_t *pool = &c->pool[size > SMALL_SIZE ? 0 : 1];
    int64_t key_size = size > c->max_split ? size : c->max_split, key[2];
    if (!set_lower_bound(pool, key_size, INT64_MIN, key)) {
        int found = set_last(pool, key);
        if (!found) return 0;
        int64_t released = 0;
        while (released < key_size && found && key[0] >= c->max_split) {
            int64_t block_size = key[0], address = key[1];
            set_erase(pool, block_size, address);
            released += block_size;
            release_segment(c, address);
            found = set_before(pool, block_size, address, key);
        }
        return released >= key_size;
    }
    set_erase(pool, key[0], key[1]);
    release_segment(c, key[1]);
    return 1;
}

static void synchronize_and_free_events(ctx_t *c) {
    size_t n = c->pending_n;
    for (size_t i = 0; i < n; i++) {
        int64_t address = c->pending_keys[2 * i];
        if (address < 0) continue;
        c->synchronized[c->pending_keys[2 * i + 1]] = 1;
        int32_t bi = block_at(c, address);
        c->blocks[bi].pending = -1;
        free_block(c, bi);
    }
    c->pending_n = c->pending_live = 0;
}

static void release_cached_blocks(ctx_t *c) {
    synchronize_and_free_events(c);
    for (int small = 0; small < 2; small++) {
        size_t n;
        int64_t *keys = set_keys(c, &c->pool[small], &n);
        for (size_t i = 0; i < n; i++) {
            if (whole_segment(c, keys[2 * i + 1])) {
                set_erase(&c->pool[small], keys[2 * i], keys[2 * i + 1]);
                release_segment(c, keys[2 * i + 1]);
            }
        }
        free(keys);
    }
}

static void garbage_collect(ctx_t *c) {
    int64_t threshold = (int64_t)(c->gc_threshold * (double)c->allowed);
    if (c->reserved <= threshold) return;
    int64_t target = c->reserved - threshold;
    size_t n;
    int64_t *keys = set_keys(c, &c->pool[0], &n);
    int64_t total_age = 0, count = 0, reclaimed = 0;
    for (size_t i = 0; i < n; i++) {
        if (whole_segment(c, keys[2 * i + 1])) {
            total_age += c->calls[0] - c->blocks[block_at(c, keys[2 * i + 1])].age;
            count++;
        }
    }
    int freed = 1;
    while (count > 0 && reclaimed < target && freed) {
        double threshold_age = (double)total_age / (double)count;
        freed = 0;
        size_t m;
        int64_t *pass = set_keys(c, &c->pool[0], &m);
        for (size_t i = 0; i < m; i++) {
            int64_t address = pass[2 * i + 1];
            if (!whole_segment(c, address)) continue;
            int64_t age = c->calls[0] - c->blocks[block_at(c, address)].age;
            if ((double)age >= threshold_age) {
                freed = 1;
                reclaimed += pass[2 * i];
                total_age -= age;
                count--;
                set_erase(&c->pool[0], pass[2 * i], address);
                release_segment(c, address);
            }
        }
        free(pass);
    }
    free(keys);
}

static int64_t torch_allocate(ctx_t *c, int64_t nbytes, int32_t tag, int32_t stack) {
    int64_t size = round_size(c, nbytes);
    int small = size <= SMALL_SIZE;
    int64_t alloc_size = segment_size(size);
    int32_t bi = get_free_block(c, small, size);
    if (bi < 0) {
        if (gc_on(c)) garbage_collect(c);
        bi = alloc_segment(c, small, alloc_size);
        if (bi < 0 && release_available_cached_blocks(c, size)) bi = alloc_segment(c, small, alloc_size);
        if (bi < 0) {
            release_cached_blocks(c);
            bi = alloc_segment(c, small, alloc_size);
        }
        if (bi < 0) {
            row(c, OOM, 0, size, nbytes, -1, tag, stack);
            return -1;
        }
    }
    int64_t chunk = c->blocks[bi].size, remaining = chunk - size;
    int split_it = small ? remaining >= MIN_BLOCK : size < c->max_split && remaining > SMALL_SIZE;
    if (split_it) split_block(c, bi, size);
    return hand_out(c, bi, chunk, nbytes, tag, stack);
}

static void torch_defer(ctx_t *c, int64_t address, int64_t key) {
    if (c->pending_n == c->pending_cap) {
        if (c->pending_live * 2 < c->pending_n) { /* compact: drop completed entries */
            size_t k = 0;
            for (size_t i = 0; i < c->pending_n; i++) {
                if (c->pending_keys[2 * i] < 0) continue;
                c->pending_keys[2 * k] = c->pending_keys[2 * i];
                c->pending_keys[2 * k + 1] = c->pending_keys[2 * i + 1];
                c->blocks[block_at(c, c->pending_keys[2 * k])].pending = (int32_t)k;
                k++;
            }
            c->pending_n = k;
        } else {
            c->pending_cap = c->pending_cap ? 2 * c->pending_cap : 64;
            c->pending_keys = grow_array(c, c->pending_keys, 2 * c->pending_cap, sizeof(int64_t));
        }
    }
    c->blocks[block_at(c, address)].pending = (int32_t)c->pending_n;
    c->pending_keys[2 * c->pending_n] = address;
    c->pending_keys[2 * c->pending_n + 1] = key;
    c->pending_n++;
    c->pending_live++;
}

static void torch_complete(ctx_t *c, int64_t address, int64_t key) {
    if (c->synchronized[key]) {
        c->synchronized[key] = 0;
        return;
    }
    int32_t bi = block_at(c, address);
    c->pending_keys[2 * c->blocks[bi].pending] = -1;
    c->blocks[bi].pending = -1;
    c->pending_live--;
    free_block(c, bi);
}

/* ------------------------------------------------------------------ rmm pool, no pool */
static int64_t align(int64_t size) {
    int64_t a = (size + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
    return a > ALIGNMENT ? a : ALIGNMENT;
}

static int rmm_expand(ctx_t *c, int64_t size) {
    int64_t attempt;
    if (c->maximum >= 0) {
        int64_t remaining = c->maximum > c->reserved ? align(c->maximum - c->reserved) : 0;
        attempt = size <= remaining ? (size > remaining / 2 ? size : remaining / 2) : 0;
    } else {
        attempt = size > c->reserved ? size : c->reserved;
    }
    for (; attempt >= size; attempt /= 2) {
        int64_t base = reserve(c, attempt);
        if (base >= 0) {
            insert_free(c, new_block(c, base, attempt, base, 0));
            return 1;
        }
    }
    return 0;
}

static int64_t rmm_allocate(ctx_t *c, int64_t nbytes, int32_t tag, int32_t stack) {
    int64_t size = align(nbytes);
    int64_t key[2];
    if (!set_lower_bound(&c->pool[0], size, INT64_MIN, key)) {
        if (!rmm_expand(c, size)) {
            row(c, OOM, 0, size, nbytes, -1, tag, stack);
            return -1;
        }
        set_lower_bound(&c->pool[0], size, INT64_MIN, key);
    }
    int64_t chunk = key[0], address = key[1];
    set_erase(&c->pool[0], chunk, address);
    int32_t bi = block_at(c, address);
    if (chunk > size) split_block(c, bi, size);
    return hand_out(c, bi, chunk, nbytes, tag, stack);
}

static int64_t nopool_allocate(ctx_t *c, int64_t nbytes, int32_t tag, int32_t stack) {
    int64_t size = align(nbytes);
    int64_t base = reserve(c, size);
    if (base < 0) {
        row(c, OOM, 0, size, nbytes, -1, tag, stack);
        return -1;
    }
    return hand_out(c, new_block(c, base, size, base, 0), size, nbytes, tag, stack);
}

static void nopool_free(ctx_t *c, int64_t address) {
    int32_t bi = block_at(c, address);
    block_t *b = &c->blocks[bi];
    int64_t size = b->size;
    c->in_use -= size;
    set_insert(c, &c->free_chunks, size, address);
    row(c, FREE, address, size, b->requested, address, b->tag, b->stack);
    drop_block(c, bi);
    heap_segment_free(c, address, size);
    device_free(c, address, size);
    c->reserved -= size;
}

/* the replay log's index for source index id (-1 none), numbered in order of first use */
static int32_t local_id(ctx_t *c, int64_t id, int32_t *ids, Py_ssize_t count, PyObject *order) {
    if (id < 0 || id >= count) return -1;
    if (ids[id] < 0) {
        PyObject *index = PyLong_FromLongLong(id);
        if (!index || PyList_Append(order, index) < 0) {
            Py_XDECREF(index);
            c->failed_python = 1;
            longjmp(c->fail, 1);
        }
        Py_DECREF(index);
        ids[id] = (int32_t)(PyList_GET_SIZE(order) - 1);
    }
    return ids[id];
}

/* ------------------------------------------------------------------ tf-bfc */
static void bfc_row(void *ctx, int kind, int64_t address, int64_t size, int64_t requested, int64_t segment,
                    int64_t largest, int32_t tag, int32_t stack) {
    ctx_t *c = ctx;
    put_row(c, kind, address, size, requested, segment, largest, tag, stack, c->thread);
}

static int64_t rounded_bytes(int64_t nbytes) { return nbytes <= 256 ? 256 : (nbytes + 255) & ~(int64_t)255; }

/* TF's Extend (BFCAllocator._reserve_segment, NativeBFCAllocator._extend_pool): one new segment
 * that can hold rounded bytes; the step doubles until the request fits, is capped by what the
 * limit leaves, and backs off by 10 % (in float32) while the device refuses it */
static int bfc_extend(ctx_t *c, int64_t rounded) {
    int64_t available = (c->maximum - c->bfc.pool_bytes) & ~(int64_t)255;
    if (rounded > available) return 0;
    int increased = 0;
    while (rounded > c->next_segment) {
        c->next_segment *= 2;
        increased = 1;
    }
    int64_t nbytes = c->next_segment < available ? c->next_segment : available, base;
    while ((base = device_allocate(c, nbytes)) < 0) {
        int64_t smaller = rounded_bytes((int64_t)((float)nbytes * 0.9f));
        nbytes = smaller < nbytes ? smaller : nbytes - 256;
        if (nbytes < rounded) return 0;
    }
    if (!increased) c->next_segment *= 2;
    if (bfc_add_segment(&c->bfc, base, nbytes, -1) < 0) longjmp(c->fail, 1);
    return 1;
}

/* garbage collection (NativeBFCAllocator._collect): if returning the wholly free segments
 * makes rounded fit, return them (in the order they were added) and extend */
static int bfc_collect(ctx_t *c, int64_t rounded) {
    size_t n = 0;
    int64_t total = 0;
    int64_t *bases = grow_array(c, NULL, c->bfc.segments + 1, 2 * sizeof(int64_t));
    for (size_t i = 0; i < c->bfc.segments; i++) {
        if (!bfc_segment_wholly_free(&c->bfc, i)) continue;
        bases[2 * n] = c->bfc.segment_bases[i];
        bases[2 * n + 1] = c->bfc.segment_sizes[i];
        total += bases[2 * n + 1];
        n++;
    }
    if (total == 0 || rounded > c->maximum - c->bfc.pool_bytes + total) {
        free(bases);
        return 0;
    }
    PyObject *r = PyObject_CallFunction(c->warn, "nLL", (Py_ssize_t)n, (long long)total, (long long)rounded);
    if (r == NULL) {
        free(bases);
        c->failed_python = 1;
        longjmp(c->fail, 1);
    }
    Py_DECREF(r);
    for (size_t i = 0; i < n; i++) {
        bfc_release_segment(&c->bfc, bases[2 * i], -1);
        device_free(c, bases[2 * i], bases[2 * i + 1]);
    }
    free(bases);
    return bfc_extend(c, rounded);
}

/* NativeBFCAllocator.allocate(nbytes, tag=...) with recording on and stacks off: 0 for 0 bytes
 * (nothing recorded), -1 after recording an out of memory */
static int64_t bfc_allocate(ctx_t *c, int64_t nbytes, int64_t source_tag) {
    if (nbytes == 0) return 0;
    int64_t rounded = rounded_bytes(nbytes);
    int32_t slot = bfc_take_best_fit(&c->bfc, rounded);
    if (slot < 0) {
        int grown = rounded <= c->maximum && (bfc_extend(c, rounded) || (c->bfc_gc && bfc_collect(c, rounded)));
        if (!grown) {
            bfc_row(c, OOM, 0, rounded, nbytes, -1, bfc_largest_free(&c->bfc), -1, -1);
            return -1;
        }
        slot = bfc_take_best_fit(&c->bfc, rounded);
    }
    int32_t tag = local_id(c, source_tag, c->tag_ids, c->n_tags, c->tag_order); /* interned once it fits */
    if (bfc_split(&c->bfc, slot, rounded, -1) < 0) longjmp(c->fail, 1);
    bfc_mark_allocated(&c->bfc, slot, nbytes, NULL, tag, -1);
    return bfc_at(&c->bfc, slot)->address;
}

static void bfc_free(ctx_t *c, int64_t address) {
    if (address == 0) return; /* free(0): nothing */
    void *tag;
    bfc_release_chunk(&c->bfc, bfc_find(&c->bfc, address), -1, &tag);
}

/* ------------------------------------------------------------------ the replay loop */
typedef struct {
    Py_buffer is_alloc, deferred, alloc_of, requested, time_ns, tag, stack;
} columns_t;

static int run(ctx_t *c, const columns_t *cols, Py_ssize_t n, int stop_at_oom, int64_t *addresses, Py_ssize_t *served,
               Py_ssize_t *processed) {
    const uint8_t *is_alloc = cols->is_alloc.buf, *deferred = cols->deferred.buf;
    const int64_t *alloc_of = cols->alloc_of.buf, *requested = cols->requested.buf, *time_ns = cols->time_ns.buf;
    const int64_t *tag = cols->tag.buf, *stack = cols->stack.buf;
    Py_ssize_t i = 0;
    *served = 0;
    for (; i < n; i++) {
        c->now = time_ns[i];
        if (is_alloc[i] && c->kind == BFC) {
            int64_t a = bfc_allocate(c, requested[i], tag[i]);
            if (a < 0) {
                if (stop_at_oom) {
                    i++;
                    break;
                }
                continue;
            }
            addresses[i] = a;
        } else if (is_alloc[i]) {
            int32_t t = local_id(c, tag[i], c->tag_ids, c->n_tags, c->tag_order);
            int32_t s = local_id(c, stack[i], c->stack_ids, c->n_stacks, c->stack_order);
            int64_t a = c->kind == TORCH ? torch_allocate(c, requested[i], t, s)
                        : c->kind == RMM ? rmm_allocate(c, requested[i], t, s)
                                         : nopool_allocate(c, requested[i], t, s);
            if (a < 0) {
                if (stop_at_oom) {
                    i++;
                    break;
                }
                continue;
            }
            addresses[i] = a;
        } else {
            int64_t made = alloc_of[i];
            int64_t address = addresses[made];
            if (address < 0) continue; /* its allocation failed and was skipped */
            if (deferred[i]) {
                if (c->kind == TORCH) {
                    torch_defer(c, address, made);
                    c->waiting[made] = 1;
                }
            } else if (c->waiting[made]) {
                c->waiting[made] = 0;
                torch_complete(c, address, made);
            } else if (c->kind == NOPOOL) {
                nopool_free(c, address);
            } else if (c->kind == BFC) {
                bfc_free(c, address);
            } else {
                free_block(c, block_at(c, address));
            }
        }
        ++*served;
    }
    *processed = i;
    return 0;
}

static void ctx_free(ctx_t *c) {
    if (c->bfc_ready) bfc_destroy(&c->bfc);
    set_destroy(&c->free_chunks);
    set_destroy(&c->pool[0]);
    set_destroy(&c->pool[1]);
    free(c->nodes);
    free(c->blocks);
    free(c->keys);
    free(c->values);
    free(c->pending_keys);
    free(c->synchronized);
    free(c->waiting);
    free(c->tag_ids);
    free(c->stack_ids);
    for (int i = 0; i < 14; i++) Py_XDECREF(c->out[i]);
    Py_XDECREF(c->tag_order);
    Py_XDECREF(c->stack_order);
}

static int get_column(PyObject *columns, Py_ssize_t i, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t n) {
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(columns, i), view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len != itemsize * n) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_Format(PyExc_ValueError, "column %zd has %zd bytes, expected %zd", i, view->len, itemsize * n);
        return -1;
    }
    return 0;
}

static PyObject *replay(PyObject *Py_UNUSED(module), PyObject *args) {
    int kind, device, stop_at_oom;
    PyObject *columns, *free_segments, *divisions;
    long long capacity, base, tail, reserved, max_split, allowed, maximum;
    Py_ssize_t n_tags, n_stacks;
    double gc_threshold;
    long long next_segment;
    int bfc_gc;
    PyObject *warn;
    if (!PyArg_ParseTuple(args, "iiO!(LLLL)O!p(LLdO!L)(nn)(LpO)", &kind, &device, &PyTuple_Type, &columns, &capacity,
                          &base, &tail, &reserved, &PyList_Type, &free_segments, &stop_at_oom, &max_split, &allowed,
                          &gc_threshold, &PyTuple_Type, &divisions, &maximum, &n_tags, &n_stacks, &next_segment,
                          &bfc_gc, &warn))
        return NULL;
    if (kind < TORCH || kind > BFC || PyTuple_GET_SIZE(columns) != 7 || PyTuple_GET_SIZE(divisions) != 16 ||
        n_tags < 0 || n_stacks < 0 || base > tail) {
        PyErr_SetString(PyExc_ValueError, "replay: unknown policy kind, or not 7 columns and 16 divisions");
        return NULL;
    }
    ctx_t *c = calloc(1, sizeof(ctx_t));
    columns_t cols;
    memset(&cols, 0, sizeof(cols));
    Py_buffer *views[7] = {&cols.is_alloc, &cols.deferred, &cols.alloc_of, &cols.requested,
                           &cols.time_ns, &cols.tag, &cols.stack};
    int64_t *addresses = NULL;
    PyObject *volatile result = NULL;
    if (!c) return PyErr_NoMemory();
    Py_ssize_t n = PyObject_Length(PyTuple_GET_ITEM(columns, 0));
    if (n < 0) goto done;
    for (int i = 0; i < 7; i++)
        if (get_column(columns, i, views[i], i < 2 ? 1 : 8, n) < 0) goto done;
    for (int i = 0; i < 16; i++) c->divisions[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(divisions, i));
    if (PyErr_Occurred()) goto done;
    const int64_t *alloc_of = cols.alloc_of.buf;
    const uint8_t *is_alloc = cols.is_alloc.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!is_alloc[i] && (alloc_of[i] < 0 || alloc_of[i] >= i || !is_alloc[alloc_of[i]])) {
            PyErr_Format(PyExc_ValueError, "request %zd frees no earlier allocation of the stream", i);
            goto done;
        }
    }
    size_t room = (size_t)(n ? n : 1);
    addresses = malloc(room * sizeof(int64_t));
    c->synchronized = calloc(room, 1);
    c->waiting = calloc(room, 1);
    c->tag_ids = malloc((size_t)(n_tags + 1) * sizeof(int32_t));
    c->stack_ids = malloc((size_t)(n_stacks + 1) * sizeof(int32_t));
    if (!addresses || !c->synchronized || !c->waiting || !c->tag_ids || !c->stack_ids) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) addresses[i] = -1;
    for (Py_ssize_t i = 0; i < n_tags; i++) c->tag_ids[i] = -1;
    for (Py_ssize_t i = 0; i < n_stacks; i++) c->stack_ids[i] = -1;
    c->n_tags = n_tags;
    c->n_stacks = n_stacks;
    c->tag_order = PyList_New(0);
    c->stack_order = PyList_New(0);
    if (!c->tag_order || !c->stack_order) goto done;
    for (int i = 0; i < 14; i++)
        if (!(c->out[i] = PyByteArray_FromStringAndSize(NULL, 0))) goto done;
    c->device = (int16_t)device;
    c->kind = kind;
    c->node_free = c->block_free = -1;
    c->holes = -1;
    c->random = 0x9E3779B97F4A7C15ull;
    c->capacity = capacity;
    c->tail = tail;
    c->device_reserved = c->reserved = reserved;
    c->max_split = max_split < 0 ? NO_MAX_SPLIT : max_split;
    c->allowed = allowed;
    c->maximum = maximum;
    c->gc_threshold = gc_threshold;
    c->next_segment = next_segment;
    c->bfc_gc = bfc_gc;
    c->warn = warn;
    c->thread = (int64_t)PyThread_get_thread_ident();
    if (kind == BFC) {
        if (bfc_init(&c->bfc) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        c->bfc_ready = 1;
        c->bfc.emit = bfc_row;
        c->bfc.emit_ctx = c;
    }
    Py_ssize_t served = 0, processed = 0;
    if (setjmp(c->fail)) {
        if (!c->failed_python) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(free_segments); i++) { /* rmm's initial pool */
        long long at, size;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(free_segments, i), "LL", &at, &size)) goto done;
        set_insert(c, &c->free_chunks, size, at);
        insert_free(c, new_block(c, at, size, at, 0));
    }
    run(c, &cols, n, stop_at_oom, addresses, &served, &processed);
    resize_columns(c, c->rows);
    PyObject *out = PyTuple_New(14);
    if (!out) goto done;
    for (int i = 0; i < 14; i++) {
        PyTuple_SET_ITEM(out, i, c->out[i]);
        c->out[i] = NULL;
    }
    result = Py_BuildValue("nnNOO", served, processed, out, c->tag_order, c->stack_order);
done:
    for (int i = 0; i < 7; i++)
        if (views[i]->obj) PyBuffer_Release(views[i]);
    free(addresses);
    ctx_free(c);
    free(c);
    return result;
}

static PyMethodDef methods[] = {
    {"replay", replay, METH_VARARGS,
     "replay(kind, device, columns, (capacity, base, tail, reserved), free_segments, stop_at_oom, "
     "(max_split, allowed, gc_threshold, divisions, maximum), (strings, stacks), (next_segment, gc, warn)) -> "
     "(served, processed, columns, tags, stacks)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_whatifcore", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__whatifcore(void) { return PyModule_Create(&module); }
