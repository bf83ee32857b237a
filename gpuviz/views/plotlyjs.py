"""Which plotly.js a page loads: plotly.js's own ``cartesian`` partial bundle where it draws
every trace on the page, else the full bundle that plotly.py ships.

gpuviz's figures use scatter, bar and heatmap traces only, which the cartesian bundle
(``plotly.js-cartesian-dist-min`` on npm, vendored in ``gpuviz/views/js`` by ``refresh.sh``,
1.5 MB instead of 4.8 MB) draws with every component the pages use (sliders, update menus,
shapes, annotations); a report with it loads and draws in about 0.6 of the time (README).
Two rules keep a page from drawing blank:

- a page whose figures have a trace type the cartesian bundle lacks gets the full bundle
  (callers pass the types of every trace they embed: ``trace_types``);
- the vendored bundle is used only at exactly the plotly.js version that the installed
  plotly.py ships (its figure JSON is written for that version); otherwise the full bundle,
  said once as a ``PlotlyjsVersionWarning`` and by ``gpuviz info`` (``bundle_status``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import plotly
import plotly.graph_objects as go

__all__ = ["Bundle", "CARTESIAN", "FULL", "CARTESIAN_TRACE_TYPES", "PLOTLYJS_MODES", "bundle_for", "trace_types"]
__all__ += ["check_plotlyjs", "plotlyjs_script", "vendored_version", "version_mismatch", "bundle_status"]
__all__ += ["PlotlyjsVersionWarning"]

CARTESIAN_TRACE_TYPES = frozenset({
    "bar", "box", "contour", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "image", "pie", "scatter",
    "scatterternary", "violin",
})  # fmt: skip
"""The trace types the cartesian bundle registers (a browser test reads them from the bundle)."""

PLOTLYJS_MODES = ("inline", "cdn", "directory")
"""How a page loads plotly.js: embedded, from plotly's CDN, or from a file beside the page."""

_DIRECTORY = Path(__file__).parent / "js"
_HEADER = re.compile(r"plotly\.js \(cartesian - minified\) v(\S+)")


@dataclass(frozen=True)
class Bundle:
    """One plotly.js bundle: ``file_name`` (beside a page in ``"directory"`` mode, and on the CDN
    with the version in it), the trace types it draws (None: all)."""

    name: str
    file_name: str
    cdn_name: str
    types: frozenset[str] | None

    def source(self) -> str:
        """The bundle's JavaScript (the vendored file, or plotly.py's own copy of the full one)."""
        if self.types is None:
            return str(plotly.offline.get_plotlyjs())
        return _cartesian_source()

    def cdn_url(self) -> str:
        return f"https://cdn.plot.ly/{self.cdn_name}-{plotly.offline.get_plotlyjs_version()}.min.js"

    def draws(self, types: Iterable[str]) -> bool:
        return self.types is None or set(types) <= self.types


CARTESIAN = Bundle("cartesian", "plotly-cartesian.min.js", "plotly-cartesian", CARTESIAN_TRACE_TYPES)
FULL = Bundle("full", "plotly.min.js", "plotly", None)


@cache
def _cartesian_source() -> str:
    return (_DIRECTORY / CARTESIAN.file_name).read_text(encoding="utf-8")


@cache
def vendored_version() -> str:
    """The plotly.js version of the vendored cartesian bundle, read from its license header."""
    with (_DIRECTORY / CARTESIAN.file_name).open(encoding="utf-8") as f:
        match = _HEADER.search(f.read(300))
    if match is None:
        raise ValueError(f"{_DIRECTORY / CARTESIAN.file_name} has no plotly.js cartesian header")
    return match.group(1)


class PlotlyjsVersionWarning(UserWarning):
    """The vendored cartesian bundle is not plotly.py's plotly.js version: pages get the full bundle."""


def version_mismatch() -> str | None:
    """None where the vendored cartesian bundle is the plotly.js version plotly.py ships, else
    what differs and what pages load instead, in words."""
    vendored, shipped = vendored_version(), plotly.offline.get_plotlyjs_version()
    if vendored == shipped:
        return None
    return (
        f"the vendored plotly.js cartesian bundle is v{vendored} but plotly {plotly.__version__} ships "
        f"plotly.js v{shipped}: pages load plotly.py's full bundle (4.8 MB, not 1.5 MB) until "
        "gpuviz/views/js/refresh.sh fetches the same version"
    )


_warned: set[str] = set()


def bundle_for(types: Iterable[str]) -> Bundle:
    """The smallest bundle that draws every trace type in ``types``: the cartesian one when it
    has them all and its version is plotly.py's, else the full one (a version mismatch is
    warned of once per process: ``PlotlyjsVersionWarning``)."""
    if not CARTESIAN.draws(types):
        return FULL
    mismatch = version_mismatch()
    if mismatch is None:
        return CARTESIAN
    if mismatch not in _warned:
        _warned.add(mismatch)
        warnings.warn(mismatch, PlotlyjsVersionWarning, stacklevel=2)
    return FULL


def bundle_status() -> str:
    """The bundle gpuviz's pages load, in one line (for ``gpuviz info``)."""
    mismatch = version_mismatch()
    if mismatch is None:
        return f"cartesian bundle v{vendored_version()} (plotly.py's plotly.js), the full one for other trace types"
    return mismatch


def trace_types(figures: Iterable[go.Figure | dict[str, Any]]) -> set[str]:
    """The trace types of figures (plotly.py figures, or plain ``{"data": [...]}`` dicts; a trace
    without a type is a scatter, as in plotly.js)."""
    types: set[str] = set()
    for figure in figures:
        if isinstance(figure, go.Figure):
            types.update(trace.type for trace in figure.data)
        else:
            types.update(trace.get("type", "scatter") for trace in figure.get("data", ()))
    return types


def check_plotlyjs(plotlyjs: str) -> None:
    """``ValueError`` naming the modes unless ``plotlyjs`` is one of ``PLOTLYJS_MODES``."""
    if plotlyjs not in PLOTLYJS_MODES:
        raise ValueError(f"plotlyjs must be 'inline', 'cdn' or 'directory', not {plotlyjs!r}")


def plotlyjs_script(plotlyjs: str, bundle: Bundle) -> str:
    """The ``<script>`` element that loads ``bundle``: embedded (``"inline"``), from plotly's CDN
    (``"cdn"``) or from its ``file_name`` in the page's folder (``"directory"``, pages sharing one
    copy)."""
    check_plotlyjs(plotlyjs)
    if plotlyjs == "inline":
        return f"<script>{bundle.source()}</script>"
    if plotlyjs == "cdn":
        return f'<script src="{bundle.cdn_url()}"></script>'
    return f'<script src="{bundle.file_name}"></script>'
