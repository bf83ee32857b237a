"""When the live dashboard's updates are due (``Pacer``): the rate, the CPU budget, and one dear
update that does not postpone the next."""

from __future__ import annotations

import pytest

from gpuviz.widgets.dashboard import BURST_S, Pacer


def _run(costs: list[float], *, rate_hz: float = 5.0, budget: float = 0.05) -> list[float]:
    """The start times (s) of updates that cost ``costs`` (CPU seconds, run at once when due)."""
    pacer = Pacer(rate_hz=rate_hz, budget=budget, now=0.0)
    starts, now = [], 0.0
    for cost in costs:
        now = max(now, pacer.due)
        starts.append(now)
        now += cost
        pacer.spent(cost, now)
    return starts


def test_cheap_updates_keep_the_rate_on_a_fixed_schedule() -> None:
    assert _run([0.004] * 10) == pytest.approx([0.2 * i for i in range(10)])


def test_one_dear_update_spends_saved_budget_and_does_not_postpone_the_next() -> None:
    costs = [0.004] * 30 + [0.030] + [0.004] * 5  # a map redraw of 30 ms after 6 s of cheap updates
    starts = _run(costs)
    assert starts == pytest.approx([0.2 * i for i in range(len(costs))])
    # the old rule (the next update not before cost / budget after this one) waited 0.6 s


def test_dear_updates_all_along_are_held_to_the_budget() -> None:
    costs = [0.030] * 200
    starts = _run(costs)
    end = starts[-1] + costs[-1]
    assert sum(costs) <= 0.05 * end + 0.05 * BURST_S + 0.030  # the budget, what was saved, one update
    gaps = [b - a for a, b in zip(starts[-50:], starts[-49:], strict=False)]
    assert gaps == pytest.approx([0.030 / 0.05] * 49)  # in the long run, one update per cost / budget


def test_any_stretch_spends_at_most_its_budget_and_one_burst() -> None:
    costs = [0.002, 0.050, 0.001, 0.020] * 40
    starts = _run(costs)
    for first in range(len(costs)):
        for last in range(first, len(costs)):
            wall = starts[last] + costs[last] - starts[first]
            assert sum(costs[first : last + 1]) <= 0.05 * wall + 0.05 * BURST_S + max(costs) + 1e-9
