"""Loaded at the start of a test's Jupyter server (tests/test_route_hardening.py): files that
stall an analysis forever or exhaust its memory, whatever the importers' own limits."""

import os
import threading

import gpuviz
import gpuviz.importers

_load = gpuviz.importers.load


def load(path, *args, **kwargs):  # type: ignore[no-untyped-def]
    name = os.path.basename(str(path))
    if name == "stall.arrow":
        open(os.path.join(os.path.dirname(str(path)), "stalled"), "w").close()
        threading.Event().wait()
    if name == "hog.arrow":
        bytearray(1 << 40)
    return _load(path, *args, **kwargs)


gpuviz.importers.load = gpuviz.load = load
