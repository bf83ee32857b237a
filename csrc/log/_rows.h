/* One event row as gpuviz.log.schema.ROW_STRUCT lays it out ("<qBbhhqqqqqqqii": 78 bytes,
 * little-endian, packed), written by every C recorder (csrc/capture/_bfcnative.c,
 * _pluggable.c, csrc/log/_heapcore.c) through pack_row and read back into
 * columns by csrc/log/_staging.c through unpack_row, so the layout is written down once on
 * the C side: the field order of ROW_FIELDS. Where the rows go (an EventLog's staging arena or
 * bytearray) is csrc/log/_rowsink.h.
 */
#ifndef GPUVIZ_ROWS_H
#define GPUVIZ_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rows are written as native little-endian integers"
#endif

#include "_window.h"

#define ROW_BYTES GV_ROW_BYTES

typedef struct {
    int64_t time_ns, thread, address, size, requested, segment, largest, duration;
    int32_t tag, stack;
    int16_t device, peer;
    uint8_t kind;
    int8_t flags;
} row_t;

/* The fields in row order (X: a macro applied to each). */
#define ROW_FIELDS(X) \
    X(time_ns) X(kind) X(flags) X(device) X(peer) X(thread) X(address) X(size) X(requested) X(segment) \
    X(largest) X(duration) X(tag) X(stack)

static inline void pack_row(unsigned char out[ROW_BYTES], const row_t *r) {
    unsigned char *p = out;
#define PUT(f) (memcpy(p, &r->f, sizeof(r->f)), p += sizeof(r->f));
    ROW_FIELDS(PUT)
#undef PUT
}

static inline void unpack_row(row_t *r, const unsigned char in[ROW_BYTES]) {
    const unsigned char *p = in;
#define GET(f) (memcpy(&r->f, p, sizeof(r->f)), p += sizeof(r->f));
    ROW_FIELDS(GET)
#undef GET
}

/* The rows of ``in`` (n whole rows) into the 15 columns of gpuviz.log.schema.DTYPES, in order:
 * seq (first_seq, +1 per row), then the row's fields. ``out[k]`` holds n values of column k's
 * width (SPLIT_WIDTHS). One read of each row: csrc/log/_staging.c's split() and the file
 * writer (csrc/log/_batchwriter.c) both split through it. */
#define SPLIT_COLUMNS 15
#define SPLIT_WIDTHS {8, 8, 1, 1, 2, 2, 8, 8, 8, 8, 8, 8, 8, 4, 4}

static inline void split_rows_into(void *const out[SPLIT_COLUMNS], const unsigned char *in, size_t n, int64_t first_seq) {
    int64_t *seq = out[0], *time_ns = out[1], *thread = out[6], *address = out[7], *size = out[8],
            *requested = out[9], *segment = out[10], *largest = out[11], *duration = out[12];
    uint8_t *kind = out[2];
    int8_t *flags = out[3];
    int16_t *device = out[4], *peer = out[5];
    int32_t *tag = out[13], *stack = out[14];
    const unsigned char *p = in;
    for (size_t i = 0; i < n; i++, p += ROW_BYTES) {
        row_t r;
        unpack_row(&r, p);
        seq[i] = first_seq + (int64_t)i;
        time_ns[i] = r.time_ns, kind[i] = r.kind, flags[i] = r.flags, device[i] = r.device, peer[i] = r.peer;
        thread[i] = r.thread, address[i] = r.address, size[i] = r.size, requested[i] = r.requested;
        segment[i] = r.segment, largest[i] = r.largest, duration[i] = r.duration, tag[i] = r.tag, stack[i] = r.stack;
    }
}

#endif
