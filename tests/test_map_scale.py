"""The report at scale holds what it can draw, not every segment at every moment: a map of many
segments embeds its segments at the stops nearest the opening moment within
``overview.DETAIL_ROWS`` rows, the overview's exact totals elsewhere; each segment's largest
allocation and call site for the dense map's hover; the timeline's segment markers grouped."""

from __future__ import annotations

import base64
import json
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scale_maps import USER_FILE, MiB, many_segments

import gpuviz
from gpuviz.analysis.heapcolumns import HeapColumns
from gpuviz.analysis.profile import Profile, profile
from gpuviz.views import frames as frames_module
from gpuviz.views.fragmentation import call_site
from gpuviz.views.frames import scrubber_frames
from gpuviz.views.overview import OVERVIEW_ABOVE, column_groups, segment_groups, top_allocations
from gpuviz.views.report import FRAME_RECTANGLES, report_html, scrub_positions
from gpuviz.views.timeline import MAX_SEGMENT_MARKERS, timeline

SEGMENTS = 1500


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Profile:
    path = tmp_path_factory.mktemp("scale") / "many.pickle"
    path.write_bytes(pickle.dumps(many_segments(SEGMENTS)))
    return profile(gpuviz.load(str(path), progress=False))


def _groups(p: Profile, at: int) -> list[list[Any]]:
    state = p.devices["GPU:0"].state_at(at)
    in_use = [sum(c.size for c in s.chunks if c.in_use) for s in state.segments]
    return [
        [g.name, len(g.rows), g.reserved, g.in_use] for g in segment_groups([s.size for s in state.segments], in_use)
    ]


def test_stops_far_from_the_opening_carry_the_overview_totals_only(many: Profile) -> None:
    dp = many.devices["GPU:0"]
    positions = scrub_positions(dp)
    frames = scrubber_frames(many, "GPU:0", positions, max_rectangles=FRAME_RECTANGLES, detail_rows=3 * SEGMENTS)
    detailed = [at for at, f in zip(positions, frames, strict=True) if "bases" in f.spec["layout"].get("meta", {})]
    # the opening stop and the two stops nearest it of many segments and more chunks than a map
    # draws one by one (a map of fewer chunks is bounded by them: FRAME_RECTANGLES / 2)
    by_distance = sorted(positions, key=lambda at: (abs(at - dp.opening), at))
    heaps = {at: dp.columns_at(at) for at in positions}
    big = [at for at in by_distance
           if len(heaps[at].bases) > OVERVIEW_ABOVE and len(heaps[at].address) * 2 > FRAME_RECTANGLES]  # fmt: skip
    assert big[0] == dp.opening
    assert sorted(at for at in detailed if at in big) == sorted(big[:3])
    totals_only = [(at, f) for at, f in zip(positions, frames, strict=True) if "groups" in f.spec["layout"]["meta"]]
    assert len(totals_only) == len([at for at in big if at not in detailed]) > 10
    for at, frame in totals_only:
        meta = frame.spec["layout"]["meta"]
        assert frame.spec["data"] == []
        assert [[g["name"], g["count"], g["reserved"], g["inUse"]] for g in meta["groups"]] == _groups(many, at)
        assert meta["segments"] == len(heaps[at].bases)


def test_the_reports_embedded_rows_are_bounded_by_detail_rows(many: Profile, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one stop's segments, the report embeds the rows of that stop only: its bars
    are those of one map, whatever the number of stops."""
    monkeypatch.setattr(frames_module, "DETAIL_ROWS", SEGMENTS)
    document = report_html(many)
    packed = json.loads(re.search(r'id="map0-frames">(.*?)</script>', document).group(1))  # type: ignore[union-attr]
    first = re.search(r"gpuvizScrubber\('map0', (\{.*?\}), \[", document).group(1)  # type: ignore[union-attr]
    metas = [f["layout"].get("meta", {}) for f in packed]
    aggregated = [len(m["bases"]) for f, m in zip(packed, metas, strict=True) if any("bars" in t for t in f["data"])]
    assert aggregated == [SEGMENTS]  # (other stops with segments: a map of at most FRAME_RECTANGLES / 2 chunks)
    assert all(sum(len(t.get("y", [])) for t in f["data"]) <= FRAME_RECTANGLES
               for f, m in zip(packed, metas, strict=True) if not any("bars" in t for t in f["data"]))  # fmt: skip
    assert sum("groups" in m for m in metas) > 10
    bars = json.loads(re.search(r'id="map0-bars">(.*?)</script>', document).group(1))  # type: ignore[union-attr]
    assert len(base64.b64decode(bars["y"]["data"])) // 4 <= 3 * SEGMENTS  # Int32Array rows: one map's bars
    # drawn at load: the opening stop's overview (its segments wait in the frames' JSON)
    opening = json.loads(first)
    assert opening["data"] == [] and opening["layout"]["meta"]["lazy"] is True
    assert [len(g["rows"]) for g in opening["layout"]["meta"]["groups"]] == [SEGMENTS]


def test_each_segment_names_its_largest_allocation_and_its_call_site(many: Profile) -> None:
    dp = many.devices["GPU:0"]
    heap = dp.columns_at(dp.opening)
    named = top_allocations(heap, lambda stack: call_site(many.log.stacks, stack))
    state = dp.state_at(dp.opening)
    strings = named["strings"]
    assert len(named["top"]) == len(state.segments) == SEGMENTS
    for row, (segment, (tag, site, size)) in enumerate(zip(state.segments, named["top"], strict=True)):
        largest = max((c for c in segment.chunks if c.in_use), key=lambda c: c.size)
        assert size == largest.size, row
        assert strings[tag] == (largest.tag or "(untagged)")
        assert strings[site] == call_site(many.log.stacks, largest.stack)
        assert strings[site].startswith(f"{USER_FILE}:") and strings[site].endswith("(step)")
    assert named["top"][0][2] == MiB and strings[named["top"][4][1]] == f"{USER_FILE}:11 (step)"


def test_column_groups_are_segment_groups_for_any_sizes() -> None:
    rng = np.random.default_rng(3)
    sizes = rng.choice([MiB, 2 * MiB, 2 * MiB + 1, 20 * MiB, 1 << 33, (1 << 33) + 512], size=300)
    bases = np.cumsum(np.r_[0, sizes[:-1]]).astype(np.int64) + (1 << 40)
    used = rng.random(300) < 0.6
    heap = HeapColumns.build("GPU:0", bases, sizes, bases, sizes, np.where(used, sizes, 0), used,
                             np.full(300, -1), np.full(300, -1), [])  # fmt: skip
    in_use = np.where(used, sizes, 0).tolist()
    expected = [[g.name, len(g.rows), g.reserved, g.in_use] for g in segment_groups(sizes.tolist(), in_use, [7, 9])]
    got = column_groups(heap, [7, 9])
    assert [[g["name"], g["count"], g["reserved"], g["inUse"]] for g in got] == expected


def test_the_timeline_groups_thousands_of_segment_markers(many: Profile) -> None:
    dp = many.devices["GPU:0"]
    figure = timeline(dp.series, t0_ns=many.t0_ns, segments=many.segments, peak=dp.peak)
    markers = next(t for t in figure.data if t.name == "segment reserved")
    assert 0 < len(markers.x) <= MAX_SEGMENT_MARKERS < SEGMENTS
    counts = [int(h.split()[0]) if "segments reserved here" in h else 1 for h in markers.hovertext]
    assert sum(counts) == SEGMENTS
    assert all(h.endswith(f"{int(h.split()[0]) * 2}.0 MiB in all") for h in markers.hovertext if "here" in h)


def test_a_report_of_few_segments_embeds_every_stop(tmp_path: Path) -> None:
    """Under ``OVERVIEW_ABOVE`` segments nothing changes: every stop is a whole map."""
    path = tmp_path / "few.pickle"
    path.write_bytes(pickle.dumps(many_segments(40)))
    p = profile(gpuviz.load(str(path), progress=False))
    frames = scrubber_frames(p, "GPU:0", scrub_positions(p.devices["GPU:0"]), max_rectangles=FRAME_RECTANGLES,
                             detail_rows=1)  # fmt: skip
    assert all("groups" not in f.spec["layout"].get("meta", {}) for f in frames)
