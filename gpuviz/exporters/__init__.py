"""Exporters: gpuviz event logs written in other tools' formats (they replay the log, so they sit beside views)."""
