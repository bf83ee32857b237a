/* gpuviz's BFC allocator core in plain C: see _bfc_core.h. */
#include "_bfc_core.h"
#include "../log/_rows.h"

#include <stdlib.h>
#include <string.h>

#define BFC_EMPTY INT64_MIN
#define C(slot) (b->chunks[(slot)])

/* ------------------------------------------------------------------ slots */
static int32_t slot_new(bfc_t *b) {
    if (b->free_slot < 0) {
        int32_t capacity = b->capacity ? b->capacity * 2 : 1024;
        bfc_chunk *grown = realloc(b->chunks, (size_t)capacity * sizeof(bfc_chunk));
        if (grown == NULL) return -1;
        b->chunks = grown;
        for (int32_t i = capacity - 1; i >= b->capacity; i--) {
            grown[i].next = b->free_slot;
            b->free_slot = i;
        }
        b->capacity = capacity;
    }
    int32_t slot = b->free_slot;
    b->free_slot = C(slot).next;
    b->live++;
    /* xorshift64: deterministic priorities, so addresses never depend on a seed */
    uint64_t x = b->random;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b->random = x;
    bfc_chunk *c = &C(slot);
    memset(c, 0, sizeof(*c));
    c->tag_id = -1;
    c->prev = c->next = c->left = c->right = -1;
    c->priority = (uint32_t)(x >> 32);
    return slot;
}

static void slot_delete(bfc_t *b, int32_t slot) {
    C(slot).next = b->free_slot;
    b->free_slot = slot;
    b->live--;
}

/* ------------------------------------------------------------- hash table */
static size_t hash_of(int64_t address, size_t mask) {
    return (size_t)(((uint64_t)address * 0x9E3779B97F4A7C15ull) >> 17) & mask;
}

static int hash_resize(bfc_t *b, size_t capacity) {
    int64_t *keys = malloc(capacity * sizeof(int64_t));
    int32_t *values = malloc(capacity * sizeof(int32_t));
    if (keys == NULL || values == NULL) {
        free(keys);
        free(values);
        return -1;
    }
    for (size_t i = 0; i < capacity; i++) keys[i] = BFC_EMPTY;
    size_t mask = capacity - 1;
    for (size_t i = 0; i < b->hash_capacity; i++) {
        if (b->hash_keys[i] == BFC_EMPTY) continue;
        size_t j = hash_of(b->hash_keys[i], mask);
        while (keys[j] != BFC_EMPTY) j = (j + 1) & mask;
        keys[j] = b->hash_keys[i];
        values[j] = b->hash_values[i];
    }
    free(b->hash_keys);
    free(b->hash_values);
    b->hash_keys = keys;
    b->hash_values = values;
    b->hash_capacity = capacity;
    return 0;
}

static int hash_put(bfc_t *b, int64_t address, int32_t slot) {
    if ((b->hash_count + 1) * 2 > b->hash_capacity && hash_resize(b, b->hash_capacity * 2) < 0) return -1;
    size_t mask = b->hash_capacity - 1;
    size_t j = hash_of(address, mask);
    while (b->hash_keys[j] != BFC_EMPTY && b->hash_keys[j] != address) j = (j + 1) & mask;
    if (b->hash_keys[j] == BFC_EMPTY) b->hash_count++;
    b->hash_keys[j] = address;
    b->hash_values[j] = slot;
    return 0;
}

static void hash_remove(bfc_t *b, int64_t address) {
    size_t mask = b->hash_capacity - 1;
    size_t j = hash_of(address, mask);
    while (b->hash_keys[j] != address) {
        if (b->hash_keys[j] == BFC_EMPTY) return;
        j = (j + 1) & mask;
    }
    /* backward-shift deletion keeps every probe sequence unbroken */
    size_t hole = j;
    for (;;) {
        j = (j + 1) & mask;
        int64_t key = b->hash_keys[j];
        if (key == BFC_EMPTY) break;
        size_t home = hash_of(key, mask);
        /* move the entry into the hole when its probe path from home to j passes the hole */
        int passes = home <= j ? (home <= hole && hole < j) : (hole >= home || hole < j);
        if (passes) {
            b->hash_keys[hole] = key;
            b->hash_values[hole] = b->hash_values[j];
            hole = j;
        }
    }
    b->hash_keys[hole] = BFC_EMPTY;
    b->hash_count--;
}

int32_t bfc_find(const bfc_t *b, int64_t address) {
    if (address == BFC_EMPTY) return -1;
    size_t mask = b->hash_capacity - 1;
    size_t j = hash_of(address, mask);
    for (;;) {
        int64_t key = b->hash_keys[j];
        if (key == address) return b->hash_values[j];
        if (key == BFC_EMPTY) return -1;
        j = (j + 1) & mask;
    }
}

/* ------------------------------------------------------------------ treap */
static int key_less(const bfc_chunk *x, const bfc_chunk *y) {
    return x->size < y->size || (x->size == y->size && x->address < y->address);
}

/* split the subtree t into keys < node (*left) and keys > node (*right) */
static void treap_split(bfc_t *b, int32_t t, const bfc_chunk *node, int32_t *left, int32_t *right) {
    while (t >= 0) {
        if (key_less(&C(t), node)) {
            *left = t;
            left = &C(t).right;
            t = C(t).right;
        } else {
            *right = t;
            right = &C(t).left;
            t = C(t).left;
        }
    }
    *left = -1;
    *right = -1;
}

static int32_t treap_merge(bfc_t *b, int32_t left, int32_t right) {
    int32_t root = -1;
    int32_t *slot = &root;
    while (left >= 0 && right >= 0) {
        if (C(left).priority > C(right).priority) {
            *slot = left;
            slot = &C(left).right;
            left = C(left).right;
        } else {
            *slot = right;
            slot = &C(right).left;
            right = C(right).left;
        }
    }
    *slot = left >= 0 ? left : right;
    return root;
}

static void treap_insert(bfc_t *b, int32_t n) {
    int32_t *slot = &b->root;
    bfc_chunk *node = &C(n);
    while (*slot >= 0 && C(*slot).priority > node->priority)
        slot = key_less(node, &C(*slot)) ? &C(*slot).left : &C(*slot).right;
    treap_split(b, *slot, node, &node->left, &node->right);
    *slot = n;
    b->free_count++;
    if (b->largest < 0 || key_less(&C(b->largest), node)) {
        b->largest = n;
        b->largest_size = node->size;
    }
}

static void treap_remove(bfc_t *b, int32_t n) {
    int32_t *slot = &b->root;
    bfc_chunk *node = &C(n);
    while (*slot != n) slot = key_less(node, &C(*slot)) ? &C(*slot).left : &C(*slot).right;
    *slot = treap_merge(b, node->left, node->right);
    node->left = node->right = -1;
    b->free_count--;
    if (n == b->largest) { /* the next largest: the rightmost again */
        int32_t t = b->root;
        if (t >= 0)
            while (C(t).right >= 0) t = C(t).right;
        b->largest = t;
        b->largest_size = t >= 0 ? C(t).size : 0;
    }
}

static inline int64_t largest_free(const bfc_t *b) { return b->largest_size; } /* read here without a call */
int64_t bfc_largest_free(const bfc_t *b) { return largest_free(b); }

int32_t bfc_take_best_fit(bfc_t *b, int64_t rounded) {
    int32_t t = b->root, best = -1;
    while (t >= 0) {
        if (C(t).size >= rounded) {
            best = t;
            t = C(t).left;
        } else {
            t = C(t).right;
        }
    }
    if (best >= 0) treap_remove(b, best);
    return best;
}

void bfc_put_back(bfc_t *b, int32_t slot) { treap_insert(b, slot); }

static int visit_subtree(const bfc_t *b, int32_t t, int (*visit)(void *, const bfc_chunk *), void *ctx) {
    while (t >= 0) {
        int stop = visit_subtree(b, b->chunks[t].left, visit, ctx);
        if (stop) return stop;
        stop = visit(ctx, &b->chunks[t]);
        if (stop) return stop;
        t = b->chunks[t].right;
    }
    return 0;
}

int bfc_visit_free(const bfc_t *b, int (*visit)(void *ctx, const bfc_chunk *chunk), void *ctx) {
    return visit_subtree(b, b->root, visit, ctx);
}

/* ------------------------------------------------------------- lifecycle */
int bfc_init(bfc_t *b) {
    memset(b, 0, sizeof(*b));
    b->free_slot = -1;
    b->root = b->largest = -1;
    b->largest_size = 0;
    b->random = 0x2545F4914F6CDD1Dull;
    return hash_resize(b, 1024);
}

void bfc_destroy(bfc_t *b) {
    free(b->chunks);
    free(b->hash_keys);
    free(b->hash_values);
    free(b->segment_bases);
    free(b->segment_sizes);
    memset(b, 0, sizeof(*b));
}

/* ------------------------------------------------------------- decisions */
static inline int64_t at_least(int64_t a, int64_t b) { return a > b ? a : b; }

/* Report one decision (largest_free: the largest free chunk after it, at least ``floor`` bytes):
 * its row written in place, or through the emit callback, or not at all (no callback). */
static inline void emit(bfc_t *b, int kind, int64_t address, int64_t size, int64_t requested, int64_t segment,
                        int64_t floor, int32_t tag, int32_t stack) {
    gv_window *w = b->rows;
    if (w == NULL || b->row_time == 0) {
        if (b->emit != NULL)
            b->emit(b->emit_ctx, kind, address, size, requested, segment, at_least(floor, largest_free(b)), tag, stack);
        return;
    }
    int64_t largest = at_least(floor, largest_free(b));
    if (w->end - w->write < ROW_BYTES) { /* the caller reserved too little: refuse, never overrun */
        b->rows_failed = 1;
        return;
    }
    row_t r = {.time_ns = b->row_time, .thread = b->row_thread, .address = address, .size = size,
               .requested = requested, .segment = segment, .largest = largest, .tag = tag, .stack = stack,
               .device = b->row_device, .peer = -1, .kind = (uint8_t)kind};
    pack_row((unsigned char *)w->write, &r);
    w->write += ROW_BYTES;
}

int bfc_split(bfc_t *b, int32_t slot, int64_t rounded, int32_t stack) {
    int64_t size = C(slot).size;
    if (!bfc_should_split(size, rounded)) return 0;
    int32_t r = slot_new(b); /* may move the chunk array: index it again below */
    if (r < 0) return -1;
    bfc_chunk *chunk = &C(slot), *rest = &C(r);
    int64_t address = chunk->address;
    rest->address = address + rounded;
    rest->size = size - rounded;
    rest->segment = chunk->segment;
    rest->prev = slot;
    rest->next = chunk->next;
    if (chunk->next >= 0) C(chunk->next).prev = r;
    chunk->next = r;
    chunk->size = rounded;
    if (hash_put(b, rest->address, r) < 0) return -1;
    treap_insert(b, r);
    /* as replay sees it, the part split off stays free until the alloc event */
    emit(b, BFC_SPLIT, address, rounded, 0, C(slot).segment, rounded, -1, stack);
    return 0;
}

void bfc_mark_allocated(bfc_t *b, int32_t slot, int64_t requested, void *tag, int32_t tag_id, int32_t stack) {
    bfc_chunk *chunk = &C(slot);
    chunk->in_use = 1;
    chunk->requested = requested;
    chunk->tag = tag;
    chunk->tag_id = tag_id;
    int64_t size = chunk->size;
    b->num_allocs++;
    b->bytes_in_use += size;
    if (b->bytes_in_use > b->peak_bytes_in_use) b->peak_bytes_in_use = b->bytes_in_use;
    if (size > b->largest_alloc_size) b->largest_alloc_size = size;
    emit(b, BFC_ALLOC, chunk->address, size, requested, chunk->segment, 0, tag_id, stack);
}

void bfc_release_chunk(bfc_t *b, int32_t slot, int32_t stack, void **tag) {
    bfc_chunk *chunk = &C(slot);
    int64_t address = chunk->address, size = chunk->size, segment = chunk->segment;
    int64_t requested = chunk->requested;
    int32_t tag_id = chunk->tag_id;
    *tag = chunk->tag;
    b->bytes_in_use -= size;
    chunk->in_use = 0;
    chunk->requested = 0;
    chunk->tag = NULL;
    chunk->tag_id = -1;
    emit(b, BFC_FREE, address, size, requested, segment, size, tag_id, stack);
    int32_t following = chunk->next;
    if (following >= 0 && !C(following).in_use) {
        treap_remove(b, following);
        size = chunk->size = size + C(following).size;
        int32_t after = chunk->next = C(following).next;
        if (after >= 0) C(after).prev = slot;
        hash_remove(b, C(following).address);
        slot_delete(b, following);
        emit(b, BFC_MERGE, address, size, 0, segment, size, -1, stack);
    }
    int32_t previous = chunk->prev;
    if (previous >= 0 && !C(previous).in_use) {
        treap_remove(b, previous);
        bfc_chunk *before = &C(previous);
        size = before->size = before->size + size;
        int32_t after = before->next = chunk->next;
        if (after >= 0) C(after).prev = previous;
        hash_remove(b, address);
        slot_delete(b, slot);
        slot = previous;
        emit(b, BFC_MERGE, before->address, size, 0, segment, size, -1, stack);
    }
    treap_insert(b, slot);
}

int bfc_add_segment(bfc_t *b, int64_t base, int64_t size, int32_t stack) {
    if (b->segments == b->segment_capacity) {
        size_t capacity = b->segment_capacity ? b->segment_capacity * 2 : 16;
        int64_t *bases = realloc(b->segment_bases, capacity * sizeof(int64_t));
        if (bases == NULL) return -1;
        b->segment_bases = bases;
        int64_t *sizes = realloc(b->segment_sizes, capacity * sizeof(int64_t));
        if (sizes == NULL) return -1;
        b->segment_sizes = sizes;
        b->segment_capacity = capacity;
    }
    int32_t slot = slot_new(b);
    if (slot < 0) return -1;
    if (hash_put(b, base, slot) < 0) {
        slot_delete(b, slot);
        return -1;
    }
    b->segment_bases[b->segments] = base;
    b->segment_sizes[b->segments] = size;
    b->segments++;
    b->pool_bytes += size;
    if (b->pool_bytes > b->peak_pool_bytes) b->peak_pool_bytes = b->pool_bytes;
    bfc_chunk *chunk = &C(slot);
    chunk->address = base;
    chunk->size = size;
    chunk->segment = base;
    treap_insert(b, slot);
    emit(b, BFC_SEGMENT_ALLOC, base, size, 0, base, 0, -1, stack);
    return 0;
}

int bfc_segment_wholly_free(const bfc_t *b, size_t i) {
    int32_t slot = bfc_find(b, b->segment_bases[i]);
    return slot >= 0 && !b->chunks[slot].in_use && b->chunks[slot].size == b->segment_sizes[i];
}

int bfc_release_segment(bfc_t *b, int64_t base, int32_t stack) {
    size_t i = 0;
    while (i < b->segments && b->segment_bases[i] != base) i++;
    if (i == b->segments || !bfc_segment_wholly_free(b, i)) return -1;
    int64_t size = b->segment_sizes[i];
    int32_t slot = bfc_find(b, base);
    treap_remove(b, slot);
    hash_remove(b, base);
    slot_delete(b, slot);
    memmove(&b->segment_bases[i], &b->segment_bases[i + 1], (b->segments - i - 1) * sizeof(int64_t));
    memmove(&b->segment_sizes[i], &b->segment_sizes[i + 1], (b->segments - i - 1) * sizeof(int64_t));
    b->segments--;
    b->pool_bytes -= size;
    emit(b, BFC_SEGMENT_FREE, base, size, 0, base, 0, -1, stack);
    return 0;
}

/* TF's Extend: one new segment that can hold rounded bytes, or 0 (-1: out of memory) */
static int extend(bfc_t *b, int64_t rounded, int64_t limit, int64_t *step, const bfc_upstream *up, int32_t stack) {
    int64_t available = bfc_available(limit, b->pool_bytes);
    if (rounded > available) return 0;
    int64_t before = *step;
    int increased = bfc_grow_step(rounded, step);
    int64_t nbytes = bfc_first_try(*step, available), base;
    while (up->reserve(up->ctx, nbytes, &base) < 0) {
        nbytes = bfc_backpedal(nbytes);
        if (nbytes < rounded) return 0;
    }
    if (bfc_add_segment(b, base, nbytes, stack) < 0) { /* as if never made */
        up->release(up->ctx, base, nbytes);
        *step = before;
        return -1;
    }
    *step = bfc_step_after(*step, increased);
    return 1;
}

int bfc_grow(bfc_t *b, int64_t rounded, int64_t limit, int gc, int64_t *step, const bfc_upstream *up, int32_t stack) {
    if (rounded > limit) return 0;
    int grown = extend(b, rounded, limit, step, up, stack);
    if (grown != 0 || !gc) return grown;
    size_t n = 0;
    int64_t total = 0;
    for (size_t i = 0; i < b->segments; i++) {
        if (!bfc_segment_wholly_free(b, i)) continue;
        n++;
        total += b->segment_sizes[i];
    }
    if (!bfc_gc_helps(rounded, limit, b->pool_bytes, total)) return 0;
    if (up->collecting != NULL && up->collecting(up->ctx, n, total, rounded) < 0) return -1;
    for (size_t i = 0; i < b->segments;) { /* releasing shifts the later segments down */
        if (!bfc_segment_wholly_free(b, i)) {
            i++;
            continue;
        }
        int64_t base = b->segment_bases[i], size = b->segment_sizes[i];
        bfc_release_segment(b, base, stack);
        up->release(up->ctx, base, size);
    }
    return extend(b, rounded, limit, step, up, stack);
}
