/* One event row as gpuviz.log.schema.ROW_STRUCT lays it out ("<qBbhhqqqqqqqii": 78 bytes,
 * little-endian, packed), written by every C recorder (gpuviz/capture/_rowwriter.c,
 * _bfcnative.c, _pluggable.c, gpuviz/log/_heapcore.c) through pack_row and read back into
 * columns by gpuviz/log/_staging.c through unpack_row, so the layout is written down once on
 * the C side: the field order of ROW_FIELDS. Where the rows go (an EventLog's staging arena or
 * bytearray) is gpuviz/log/_rowsink.h.
 */
#ifndef GPUVIZ_ROWS_H
#define GPUVIZ_ROWS_H

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

#endif
