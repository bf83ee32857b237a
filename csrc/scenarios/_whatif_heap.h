/* _whatif_heap.h: the what-if replay's events (columns, HeapBuilder's rows), the
 * simulated device (SimUpstream's first fit) and the pools of free blocks that torch and rmm share.
 *
 * Part of _whatifcore.c, which includes it (one translation unit: static functions over its
 * ctx_t, in the order they are used); not a header of its own.
 */
#ifndef GPUVIZ_WHATIF_HEAP_H
#define GPUVIZ_WHATIF_HEAP_H

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

#endif
