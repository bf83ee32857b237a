/* _whatif_policies.h: the what-if replay's policies: torch (PyTorch's caching allocator),
 * rmm-pool, no-pool and tf-bfc (the BFC core, _bfc_core.c, with its growth, limit and garbage
 * collection: bfc_grow over the simulated device).
 *
 * Part of _whatifcore.c, which includes it (one translation unit: static functions over its
 * ctx_t, in the order they are used); not a header of its own.
 */
#ifndef GPUVIZ_WHATIF_POLICIES_H
#define GPUVIZ_WHATIF_POLICIES_H

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

/* the simulated device as the BFC core's upstream */
static int reserve_device(void *ctx, int64_t nbytes, int64_t *base) {
    *base = device_allocate(ctx, nbytes);
    return *base < 0 ? -1 : 0;
}

static void release_device(void *ctx, int64_t base, int64_t size) { device_free(ctx, base, size); }

/* a garbage collection is about to run: the allocator's warning, in its words */
static int collecting(void *ctx, size_t count, int64_t bytes, int64_t rounded) {
    ctx_t *c = ctx;
    PyObject *r = PyObject_CallFunction(c->warn, "nLL", (Py_ssize_t)count, (long long)bytes, (long long)rounded);
    if (r == NULL) {
        c->failed_python = 1;
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* NativeBFCAllocator.allocate(nbytes, tag=...) with recording on and stacks off: 0 for 0 bytes
 * (nothing recorded), -1 after recording an out of memory */
static int64_t bfc_allocate(ctx_t *c, int64_t nbytes, int64_t source_tag) {
    if (nbytes == 0) return 0;
    int64_t rounded = bfc_rounded(nbytes);
    int32_t slot = bfc_take_best_fit(&c->bfc, rounded);
    if (slot < 0) {
        /* TF's growth, limit and garbage collection: the core's one statement of them */
        const bfc_upstream up = {reserve_device, release_device, collecting, c};
        int grown = bfc_grow(&c->bfc, rounded, c->maximum, c->bfc_gc, &c->next_segment, &up, -1);
        if (grown < 0) longjmp(c->fail, 1);
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

#endif
