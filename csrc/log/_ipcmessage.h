/* The Arrow IPC record-batch message of an event-log batch, built by hand for
 * csrc/log/_batchwriter.c (no Python here; included by it only).
 *
 * The message is what pyarrow writes for the same batch (format.rst of Arrow's IPC format):
 * 0xFFFFFFFF, the metadata's length, a Message flatbuffer (version V5, a RecordBatch header, its
 * field nodes and buffers, the custom metadata), padded to 8 bytes, then the body: per column an
 * empty validity buffer and the values, each padded to 8 bytes. tests/test_batchwriter.py reads
 * what it writes with pyarrow and compares it with pyarrow's own batches.
 */
#ifndef GPUVIZ_IPCMESSAGE_H
#define GPUVIZ_IPCMESSAGE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_rows.h" /* SPLIT_COLUMNS */

#define PAD8(n) (((n) + 7) & ~(size_t)7)

typedef struct {
    const char *data;
    size_t len;
} span_t;

/* ------------------------------------------------------------ the message */
static void put16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(unsigned char *p, int64_t v) { memcpy(p, &v, 8); }

/* Bytes the flatbuffer of a batch with these metadata pairs can take (an upper bound). */
static size_t message_bound(const span_t *keys, const span_t *values, int pairs) {
    size_t bound = 1024 + 32 * (size_t)pairs;
    for (int i = 0; i < pairs; i++) bound += keys[i].len + values[i].len + 16;
    return bound;
}

/* The encapsulated metadata of a batch of ``rows`` rows whose columns hold ``lens`` bytes:
 * written to ``out`` (message_bound + 8 bytes) as 0xFFFFFFFF, length, flatbuffer, padding.
 * Returns its length in bytes (a multiple of 8). Positions are fixed up to the custom
 * metadata: Message's table at 20 (vtable at 6), RecordBatch's at 60 (vtable at 50), the
 * field nodes at 84, the buffers at 332; every table, vector and string after the field that
 * refers to it (flatbuffers' offsets point forward), every 8-byte value 8-aligned. */
static size_t build_message(unsigned char *out, int64_t rows, const size_t lens[SPLIT_COLUMNS], const span_t *keys,
                            const span_t *values, int pairs, int64_t *body_length) {
    unsigned char *fb = out + 8;
    size_t bound = message_bound(keys, values, pairs);
    memset(fb, 0, bound);
    int64_t offset = 0;
    put32(fb + 84, SPLIT_COLUMNS);
    put32(fb + 332, 2 * SPLIT_COLUMNS);
    for (int k = 0; k < SPLIT_COLUMNS; k++) {
        put64(fb + 88 + 16 * k, rows); /* FieldNode {length, null_count = 0} */
        unsigned char *validity = fb + 336 + 32 * k, *data = validity + 16;
        put64(validity, offset); /* Buffer {offset, length = 0}: no nulls */
        put64(data, offset);
        put64(data + 8, (int64_t)lens[k]);
        offset += (int64_t)PAD8(lens[k]);
    }
    *body_length = offset;
    /* Message {version, header_type, header, bodyLength, custom_metadata} */
    put32(fb, 20);
    const uint16_t message_vtable[7] = {14, 24, 20, 22, 12, 4, 16};
    for (int i = 0; i < 7; i++) put16(fb + 6 + 2 * i, message_vtable[i]);
    put32(fb + 20, 14);
    put64(fb + 24, offset);
    put32(fb + 32, 60 - 32);
    put32(fb + 36, 816 - 36);
    put16(fb + 40, 4); /* MetadataVersion V5 */
    fb[42] = 3;        /* MessageHeader RecordBatch */
    /* RecordBatch {length, nodes, buffers} */
    const uint16_t batch_vtable[5] = {10, 20, 4, 12, 16};
    for (int i = 0; i < 5; i++) put16(fb + 50 + 2 * i, batch_vtable[i]);
    put32(fb + 60, 10);
    put64(fb + 64, rows);
    put32(fb + 72, 84 - 72);
    put32(fb + 76, 332 - 76);
    /* custom_metadata: [KeyValue {key, value}] */
    size_t vector = 816, vtable = vector + 4 + 4 * (size_t)pairs, table = vtable + 8;
    size_t text = table + 12 * (size_t)pairs;
    put32(fb + vector, (uint32_t)pairs);
    const uint16_t pair_vtable[4] = {8, 12, 4, 8};
    for (int i = 0; i < 4; i++) put16(fb + vtable + 2 * i, pair_vtable[i]);
    for (int i = 0; i < pairs; i++, table += 12) {
        put32(fb + vector + 4 + 4 * (size_t)i, (uint32_t)(table - (vector + 4 + 4 * (size_t)i)));
        put32(fb + table, (uint32_t)(table - vtable));
        const span_t *strings[2] = {&keys[i], &values[i]};
        for (int s = 0; s < 2; s++) {
            put32(fb + table + 4 + 4 * (size_t)s, (uint32_t)(text - (table + 4 + 4 * (size_t)s)));
            put32(fb + text, (uint32_t)strings[s]->len);
            memcpy(fb + text + 4, strings[s]->data, strings[s]->len); /* then a NUL (memset) */
            text = (text + 4 + strings[s]->len + 1 + 3) & ~(size_t)3;
        }
    }
    size_t length = PAD8(text);
    put32(out, 0xFFFFFFFFu);
    put32(out + 4, (uint32_t)length);
    return 8 + length;
}

#endif
