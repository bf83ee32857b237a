"""Scenarios: what a run would have done under other allocator policies (what-if replays).

Sits above analysis and capture: it drives capture's allocators with a log's request stream
(``analysis.requests``) and measures the replays (``analysis.comparison``).
"""

from gpuviz.scenarios.policies import POLICY_NAMES, Policy, parse_policy
from gpuviz.scenarios.whatif import busiest_device, replay_policy, smallest_capacity, whatif

__all__ = ["whatif", "smallest_capacity", "replay_policy", "busiest_device", "Policy", "parse_policy", "POLICY_NAMES"]
