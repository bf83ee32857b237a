"""Byte quantities: parsing user input and printing sizes.

All sizes in gpuviz are integers in bytes.
"""

from __future__ import annotations

import re

__all__ = [
    "KiB",
    "MiB",
    "GiB",
    "TiB",
    "parse_bytes",
    "format_bytes",
    "format_size",
    "format_duration",
    "binary_unit",
    "round_up",
]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "k": KiB,
    "kib": KiB,
    "m": MiB,
    "mib": MiB,
    "g": GiB,
    "gib": GiB,
    "t": TiB,
    "tib": TiB,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str, *, name: str = "size") -> int:
    """Return a byte count from an int or a string such as ``"4GiB"``, ``"512 MiB"``, ``"1.5GB"``.

    Binary units (KiB, MiB, GiB, TiB, and the bare K, M, G, T) are powers of 1024;
    decimal units (kB, MB, GB, TB) are powers of 1000. Fractions are truncated to whole bytes.
    Raises ``TypeError`` for other types and ``ValueError`` naming the bad part otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{name} must be an int or a string like '4GiB', not {type(value).__name__}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
        return value
    match = _PATTERN.match(value)
    if match is None:
        raise ValueError(f"{name}: cannot read {value!r} as a byte size (expected e.g. '4GiB' or '512MiB')")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"{name}: unknown unit {unit!r} in {value!r} (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)")
    return int(float(number) * factor) if "." in number else int(number) * factor


def format_bytes(n: int) -> str:
    """Human-readable bytes in TensorFlow's HumanReadableNumBytes format.

    ``256 -> '256B'``, ``1536 -> '1.5KiB'``, ``2097152 -> '2.00MiB'``, ``1073741824 -> '1.00GiB'``.
    """
    if n < 0:
        return "-" + format_bytes(-n)
    if n < 1024:
        return f"{n}B"
    units = "KMGTPE"
    index = 0
    while n >= 1024 * 1024 and index < len(units) - 1:
        n //= 1024
        index += 1
    unit = units[index]
    if unit == "K":
        return f"{n / 1024.0:.1f}KiB"
    return f"{n / 1024.0:.2f}{unit}iB"


_BINARY = ((TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB"))


def binary_unit(n: int | float) -> tuple[int, str]:
    """The binary unit ``(factor, name)`` that ``n`` bytes read best in: ``(1, "B")`` below 1 KiB."""
    magnitude = abs(n)
    for factor, name in _BINARY:
        if magnitude >= factor:
            return factor, name
    return 1, "B"


def format_size(n: int | float) -> str:
    """Bytes in binary units for people: ``'256 B'``, ``'1.5 KiB'``, ``'702 MiB'``, ``'3.2 GiB'``.

    One decimal below 10 units, whole units from 10 up (``10.4 MiB -> '10 MiB'``); a value
    that would round to 1024 units moves to the next unit. The same rule as the report's and the
    JupyterLab extension's ``formatSize`` (tests hold them together).
    """
    if n < 0:
        return "-" + format_size(-n)
    factor, name = binary_unit(n)
    if factor == 1:
        return f"{round(n)} B"
    value = n / factor
    text = f"{value:.1f}" if value < 9.95 else f"{value:.0f}"
    if text == "1024" and name != "TiB":
        return format_size(factor * 1024)
    return f"{text} {name}"


def format_duration(ns: int | float) -> str:
    """Nanoseconds for people: ``'850 ns'``, ``'12.5 µs'``, ``'3.20 ms'``, ``'1.25 s'``, ``'2 min 5 s'``."""
    if ns < 0:
        return "-" + format_duration(-ns)
    if ns < 1_000:
        return f"{round(ns)} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    if ns < 120e9:
        return f"{ns / 1e9:.2f} s"
    return f"{int(ns // 60e9)} min {round(ns % 60e9 / 1e9)} s"


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n``."""
    return -(-n // multiple) * multiple
