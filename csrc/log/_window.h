/* The window over an EventLog's staging arena (gpuviz.log._staging.Arena) where rows are written
 * in place, in plain C (no Python), for the recorders (csrc/log/_rowsink.h) and the BFC core
 * (csrc/capture/_bfc_core.h), which writes its rows through it directly:
 *
 *     start <= write <= end        rows [start, write) are staged (written, not yet flushed)
 *     write + ROW_BYTES <= end     there is room for a row; otherwise the arena makes room first
 *                                  (the staged rows may move: read the window again after)
 *     start < due <= end           the staged rows are due for a flush once write >= due (the
 *                                  arena sets it: see Arena.set_flush in _staging.c)
 */
#ifndef GPUVIZ_WINDOW_H
#define GPUVIZ_WINDOW_H

#define GV_ROW_BYTES 78 /* gpuviz.log.schema.ROW_STRUCT.size: one row, bytes (the only C definition) */

typedef struct {
    char *start, *write, *end, *due;
} gv_window;

#endif
