"""Startup of a Python process under ``gpuviz run`` (see ``gpuviz.frontends.run_child``)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _start() -> None:
    if not os.environ.get("GPUVIZ_RUN_CHILDREN"):
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if importlib.util.find_spec("gpuviz") is None:
        sys.path.append(root)  # gpuviz itself, where the parent found it
    try:
        from gpuviz.frontends.run_child import start_child

        start_child()
    except Exception as error:  # the program runs all the same, unrecorded
        print(f"gpuviz run: this process is not recorded ({type(error).__name__}: {error})", file=sys.stderr)


def _chain() -> None:
    """Run the ``sitecustomize`` this one hides (the next on ``sys.path``), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_start()
_chain()
