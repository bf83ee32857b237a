"""What a profile shows (``ViewOptions``) and the choices its options take: light to import,
so that front-ends build their parsers without importing the analysis (pandas)."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["ViewOptions", "COLOR_BY", "GROUP_BY"]

COLOR_BY = ("state", "tag", "dtype")
GROUP_BY = ("auto", "tag", "dtype", "call site", "category")


@dataclass(frozen=True)
class ViewOptions:
    """What to show.

    device: the device for single-device views (default: the first GPU with allocations).
    points: the most points a timeline draws (min/max per bucket beyond that).
    scrub_points: how many instants the time scrubber offers.
    color_by: color used chunks by ``"state"`` (used/waste/free), ``"tag"`` or ``"dtype"``.
    group_by: group the top allocations at the peak by ``"tag"``, ``"dtype"``, ``"call site"`` (the
        user's line) or ``"category"``; ``"auto"``: by tag where allocations carry tags, else by call site.
    user_code: a regular expression naming the user's own files (``callsites.call_sites``).
    max_rectangles: the most rectangles a fragmentation map draws before aggregating.
    top: rows in the "top allocations at the peak" table.
    """

    device: str | None = None
    points: int = 2000
    scrub_points: int = 40
    color_by: str = "state"
    group_by: str = "auto"
    user_code: str | None = None
    max_rectangles: int = 20_000
    top: int = 10

    def __post_init__(self) -> None:
        if self.color_by not in COLOR_BY:
            raise ValueError(f"color_by must be one of {', '.join(COLOR_BY)}, not {self.color_by!r}")
        if self.group_by not in GROUP_BY:
            raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, not {self.group_by!r}")
        if self.user_code is not None:
            import re

            try:
                re.compile(self.user_code)
            except re.error as exc:
                raise ValueError(f"user_code {self.user_code!r} is not a regular expression: {exc}") from None
        for name in ("points", "scrub_points", "max_rectangles", "top"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def with_(self, **changes: object) -> ViewOptions:
        return replace(self, **changes)  # type: ignore[arg-type]
