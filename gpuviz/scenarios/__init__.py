"""Scenarios: what a run would have done under other allocator policies (what-if replays).

Sits above analysis and capture: it drives capture's allocators with a log's request stream
(``analysis.requests``) and measures the replays (``analysis.comparison``). The names below
are imported when first used, so that importing the package (as the C replay's parent) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuviz.scenarios.policies import POLICY_NAMES, Policy, parse_policy
    from gpuviz.scenarios.whatif import busiest_device, replay_policy, smallest_capacity, whatif

__all__ = ["whatif", "smallest_capacity", "replay_policy", "busiest_device", "Policy", "parse_policy", "POLICY_NAMES"]

_WHERE = {
    name: "gpuviz.scenarios.whatif" for name in ("whatif", "smallest_capacity", "replay_policy", "busiest_device")
}
_WHERE.update({name: "gpuviz.scenarios.policies" for name in ("Policy", "parse_policy", "POLICY_NAMES")})


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'gpuviz.scenarios' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
