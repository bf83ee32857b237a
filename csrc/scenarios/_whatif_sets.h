/* _whatif_sets.h: the what-if replay's containers: treaps (the device's free gaps by
 * address, first fit), binned sorted sets of (size, address) (free blocks, the largest free chunk)
 * and blocks by address (an open-addressing hash table over a block arena).
 *
 * Part of _whatifcore.c, which includes it (one translation unit: static functions over its
 * ctx_t, in the order they are used); not a header of its own.
 */
#ifndef GPUVIZ_WHATIF_SETS_H
#define GPUVIZ_WHATIF_SETS_H

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

#endif
