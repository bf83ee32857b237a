/* One event row as gpuviz.log.schema.ROW_STRUCT lays it out ("<qBbhhqqqqqqqii": 78 bytes,
 * little-endian, packed), written by every C recorder (_rowwriter.c, _bfcnative.c,
 * _pluggable.c) through pack_row, so the layout is written down once on the C side. Where the
 * rows go (an EventLog's staging arena or bytearray) is gpuviz/log/_rowsink.h.
 */
#ifndef GPUVIZ_ROWS_H
#define GPUVIZ_ROWS_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "rows are written as native little-endian integers"
#endif

#include "../log/_window.h"

#define ROW_BYTES GV_ROW_BYTES

typedef struct {
    int64_t time_ns, thread, address, size, requested, segment, largest, duration;
    int32_t tag, stack;
    int16_t device, peer;
    uint8_t kind;
    int8_t flags;
} row_t;

static inline void pack_row(unsigned char out[ROW_BYTES], const row_t *r) {
    unsigned char *p = out;
#define PUT(v) (memcpy(p, &(v), sizeof(v)), p += sizeof(v))
    PUT(r->time_ns);
    PUT(r->kind);
    PUT(r->flags);
    PUT(r->device);
    PUT(r->peer);
    PUT(r->thread);
    PUT(r->address);
    PUT(r->size);
    PUT(r->requested);
    PUT(r->segment);
    PUT(r->largest);
    PUT(r->duration);
    PUT(r->tag);
    PUT(r->stack);
#undef PUT
}


#endif
