"""What-if policies by name: ``"tf-bfc"``, ``"torch"``, ``"rmm-pool"``, ``"no-pool"``, with options.

A policy is written ``name`` or ``name:key=value,key=value`` (sizes accept units, e.g.
``tf-bfc:growth=false,limit=8GiB``, ``torch:max_split_size_mb=128``,
``rmm-pool:initial=1GiB,maximum=12GiB``). Options per policy:

    tf-bfc     growth (true), limit (bytes; default the capacity), fraction (0-1),
               gc (false: garbage collection of free segments on OOM)
    torch      max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold,
               fraction (set_per_process_memory_fraction; the GC threshold needs it),
               expandable_segments (false; not with max_split_size_mb)
    rmm-pool   initial (bytes, default 0), maximum (bytes, default unlimited)
    no-pool    (none): every tensor its own cudaMalloc — the lower bound on reserved bytes
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuviz.base.torch_rules import CachingRules
from gpuviz.base.units import MiB, parse_bytes
from gpuviz.capture.bfc import ReferenceBFCAllocator
from gpuviz.capture.native import allocator_class
from gpuviz.capture.upstream import Upstream
from gpuviz.log.eventlog import EventLog
from gpuviz.scenarios.pools import NoPoolAllocator, RmmPoolAllocator
from gpuviz.scenarios.torch_caching import TorchCachingAllocator

__all__ = ["Policy", "parse_policy", "POLICY_NAMES", "PolicyAllocator"]

_ALIASES = {
    "tf-bfc": "tf-bfc", "tf": "tf-bfc", "bfc": "tf-bfc", "tensorflow": "tf-bfc",
    "torch": "torch", "pytorch": "torch", "torch-caching": "torch",
    "rmm-pool": "rmm-pool", "rmm": "rmm-pool",
    "no-pool": "no-pool", "none": "no-pool", "cudamalloc": "no-pool",
}  # fmt: skip
POLICY_NAMES = ("tf-bfc", "torch", "rmm-pool", "no-pool")
_OPTIONS: dict[str, dict[str, str]] = {  # option -> kind: bool, bytes, int, fraction
    "tf-bfc": {"growth": "bool", "limit": "bytes", "fraction": "fraction", "gc": "bool"},
    "torch": {
        "max_split_size_mb": "int",
        "roundup_power2_divisions": "int",
        "garbage_collection_threshold": "fraction",
        "fraction": "fraction",
        "expandable_segments": "bool",
    },
    "rmm-pool": {"initial": "bytes", "maximum": "bytes"},
    "no-pool": {},
}


# What a what-if replay drives. The policies other than tf-bfc take the time stamp of their next
# events (``time_ns``) and tag/stack indices; ReferenceBFCAllocator records its own clock and a tag string.
PolicyAllocator = ReferenceBFCAllocator | TorchCachingAllocator | RmmPoolAllocator | NoPoolAllocator


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _value(policy: str, key: str, kind: str, text: object) -> object:
    if not isinstance(text, str):
        return text
    try:
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError(f"{text!r} is not true or false")
            return lowered in ("true", "1", "yes", "on")
        if kind == "bytes":
            return parse_bytes(text, name=key)
        if kind == "int":
            return int(text)
        value = float(text)
        if not 0 < value <= 1:
            raise ValueError(f"{value} is not in (0, 1]")
        return value
    except ValueError as exc:
        raise ValueError(f"policy {policy!r}: option {key}={text!r}: {exc}") from None


@dataclass(frozen=True)
class Policy:
    """An allocator policy with its options; ``label`` names it in comparisons."""

    kind: str
    options: Mapping[str, object] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The policy as ``parse_policy`` reads it back (booleans written ``true``/``false``)."""
        if not self.options:
            return self.kind
        return self.kind + ":" + ",".join(f"{k}={_text(v)}" for k, v in self.options.items())

    def build(self, upstream: Upstream, *, device: str, log: EventLog) -> PolicyAllocator:
        """A fresh allocator of this policy over ``upstream`` recording into ``log``."""
        o = self.options
        if self.kind == "tf-bfc":
            return allocator_class()(  # the native core where it is built, with the same decisions
                upstream,
                memory_limit=o.get("limit"),  # type: ignore[arg-type]
                memory_fraction=o.get("fraction"),  # type: ignore[arg-type]
                growth=bool(o.get("growth", True)),
                garbage_collection=bool(o.get("gc", False)),
                device=device,
                log=log,
            )
        if self.kind == "torch":
            split = o.get("max_split_size_mb")
            settings = {
                "max_split_size": -1 if split is None else int(split) * MiB,  # type: ignore[call-overload]
                "roundup_power2_divisions": o.get("roundup_power2_divisions", 0),
                "expandable_segments": bool(o.get("expandable_segments", False)),
            }
            return TorchCachingAllocator(
                upstream,
                device=device,
                log=log,
                rules=CachingRules.from_settings(settings),
                garbage_collection_threshold=o.get("garbage_collection_threshold"),  # type: ignore[arg-type]
                memory_fraction=o.get("fraction"),  # type: ignore[arg-type]
            )
        if self.kind == "rmm-pool":
            return RmmPoolAllocator(
                upstream,
                initial_pool_size=int(o.get("initial", 0)),  # type: ignore[call-overload]
                maximum_pool_size=o.get("maximum"),  # type: ignore[arg-type]
                device=device,
                log=log,
            )
        return NoPoolAllocator(upstream, device=device, log=log)


def parse_policy(spec: str | Policy) -> Policy:
    """``"torch:max_split_size_mb=128"`` -> ``Policy("torch", {"max_split_size_mb": 128})``.

    ``ValueError`` names an unknown policy or option and lists the known ones.
    """
    if isinstance(spec, Policy):
        return spec
    name, _, rest = spec.strip().partition(":")
    kind = _ALIASES.get(name.strip().lower())
    if kind is None:
        raise ValueError(f"unknown policy {name!r}; policies are {', '.join(POLICY_NAMES)}")
    known = _OPTIONS[kind]
    options: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"policy {spec!r}: option {item!r} needs a value (key=value)")
        if key not in known:
            choices = ", ".join(known) or "none"
            raise ValueError(f"policy {kind!r} has no option {key!r}; its options are {choices}")
        options[key] = _value(kind, key, known[key], text.strip())
    return Policy(kind, options)
