"""Views: exact rectangles, spikes kept, escaping, tables."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import pytest

import gpuviz
from gpuviz import EventLog, SimUpstream
from gpuviz.analysis.profile import ViewOptions, profile
from gpuviz.analysis.tables import placement_table
from gpuviz.base.heapstate import ChunkState, HeapState, SegmentState
from gpuviz.base.units import MiB, format_size
from gpuviz.capture import ReferenceBFCAllocator
from gpuviz.views import fragmentation
from gpuviz.views.fragmentation import fragmentation_map
from gpuviz.views.plotlyjs import bundle_for
from gpuviz.views.report import report_html, to_script_json
from gpuviz.views.static import static_html
from gpuviz.views.tables import placement_html
from gpuviz.views.timeline import MIN_SPAN, timeline

BASE = 1 << 40


def small_state() -> HeapState:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), memory_limit="4KiB", growth=False)
    a = alloc.allocate(1000, tag="weights")  # chunk 1024, requested 1000
    alloc.allocate(512, tag="<b>bias</b>")
    alloc.free(a)
    alloc.allocate(300, tag="x")  # 300 -> 512 at BASE, split from the free 1024
    return alloc.state()


def bars(figure):  # type: ignore[no-untyped-def]
    return {t.name: list(zip(t.y, t.base, t.x, strict=True)) for t in figure.data}


def test_fragmentation_map_draws_each_chunk_to_scale() -> None:
    state = small_state()
    assert [(c.address - BASE, c.size, c.requested, c.in_use) for c in state.chunks()] == [
        (0, 512, 300, True),
        (512, 512, 0, False),
        (1024, 512, 512, True),
        (1536, 2560, 0, False),
    ]
    figure = fragmentation_map(state)
    y = f"{BASE:#x}"
    assert bars(figure) == {
        "used": [(y, 0, 300), (y, 1024, 512)],
        "waste": [(y, 300, 212)],
        "free": [(y, 512, 512), (y, 1536, 2560)],
    }
    title = figure.layout.title.text
    assert "in use 1.0 KiB" in title and "pool 4.0 KiB" in title and "largest free 2.5 KiB" in title
    assert "fragmentation 16.7%" in title  # (3072 - 2560) / 3072
    hover = " ".join(figure.data[2].hovertext)
    assert "<b>&lt;b&gt;bias&lt;/b&gt;</b><br>requested 512 B · chunk 512 B<br>address 0x10000000400" in hover
    assert "&lt;b&gt;bias&lt;/b&gt;" in hover and "<b>bias" not in hover


def test_fragmentation_map_colored_by_tag_and_dtype() -> None:
    state = small_state()
    by_tag = fragmentation_map(state, color_by="tag")
    names = [t.name for t in by_tag.data]
    assert names[:3] == ["free", "waste", "used"] and set(names[3:]) == {"x", "&lt;b&gt;bias&lt;/b&gt;"}
    assert list(by_tag.data[2].x) == []  # "used" is empty when coloring by tag


def test_fragmentation_map_aggregates_large_heaps() -> None:
    chunks = []
    for i in range(10_000):  # alternating 256 B used and free chunks
        chunks.append(ChunkState(BASE + 512 * i, 256, 256, True, None))
        chunks.append(ChunkState(BASE + 512 * i + 256, 256, 0, False, None))
    state = HeapState("GPU:0", (SegmentState(BASE, 512 * 10_000, tuple(chunks)),))
    figure = fragmentation_map(state, max_rectangles=300)
    total = sum(len(t.x) for t in figure.data)
    assert total <= 300
    used = sum(figure.data[2].x)
    free = sum(figure.data[0].x)
    assert used == pytest.approx(256 * 10_000) and free == pytest.approx(256 * 10_000)
    assert figure.data[2].name == "used (aggregated)"


def test_timeline_downsampling_keeps_spikes() -> None:
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), growth=False)
    for i in range(5000):
        alloc.free(alloc.allocate(1000 if i != 3333 else 300 * MiB))
    series = gpuviz.timeline_series(alloc.log)
    figure = timeline(series, points=100)
    in_use = next(t for t in figure.data if t.name == "bytes in use")
    assert len(in_use.y) <= 100
    assert max(in_use.y) == 300  # in MiB, the unit of the largest value
    assert figure.layout.yaxis.title.text == "memory (MiB)" and "300 MiB" in in_use.text
    assert any(t.name == "bytes in use (bucket min)" for t in figure.data)
    x = np.asarray(in_use.x)
    # seconds since the log's start, increasing, sampled after whole operations: the first is the
    # first alloc (event 2, after the segment's reservation and split), never a split
    assert x[0] == pytest.approx((series.time_ns[2] - series.time_ns[0]) / 1e9) and (np.diff(x) > 0).all()


def test_timeline_with_transfers_marks_and_peak(runtime_log: EventLog) -> None:
    gpuviz.mark("<script>alert(1)</script>")
    x = gpuviz.asarray(np.ones(1000))
    (x * 2).numpy()
    p = profile(runtime_log)
    device = p.devices["GPU:0"]
    figure = timeline(device.series, t0_ns=p.t0_ns, transfers=p.transfers, marks=p.marks, peak=device.peak)
    names = {t.name for t in figure.data}
    assert {"H2D transfers", "D2H transfers", "peak", "fragmentation"} <= names
    h2d = next(t for t in figure.data if t.name == "H2D transfers")
    # the modelled copy: 10 µs latency + 8000 B at 25 GB/s, drawn at least MIN_SPAN of the time axis wide
    duration_s = (10_000 + 8000 * 1e9 / 25e9) / 1e9
    axis_s = (int(device.series.time_ns[-1]) - p.t0_ns) / 1e9
    assert list(h2d.x) == pytest.approx([max(duration_s, MIN_SPAN * axis_s)], rel=1e-3)
    assert "in 10.3 µs" in h2d.hovertext[0]
    labels = [a.text for a in figure.layout.annotations]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in labels


def test_placement_html_highlights_soft_placement_and_totals(runtime_log: EventLog) -> None:
    with gpuviz.device("/GPU:4"):
        gpuviz.asarray([1.0]) + 1
    html = placement_html(placement_table(runtime_log))
    rows = re.findall(r"<tr( class=\"soft\")?><td class=\"text\">(\w+)</td>", html)
    assert sorted(rows) == [(' class="soft"', "AddV2"), (' class="soft"', "Const")]
    assert '<tr class="total"><td class="text">total</td><td></td><td></td><td>2</td><td>2</td>' in html


def test_report_is_self_contained_and_escapes_user_strings(runtime_log: EventLog) -> None:
    evil = "</script><script>window.pwned=1</script>"
    gpuviz.mark(evil)
    with gpuviz.span("step"):
        gpuviz.asarray(np.ones(10))
    p = profile(runtime_log, ViewOptions(scrub_points=3))
    document = report_html(p, source="<run>.arrow")
    assert "window.pwned=1</script>" not in document
    assert "&lt;run&gt;.arrow" in document
    assert document.count("<script") == document.count("</script>")  # no injected closing tags
    bundle = bundle_for({"bar", "scatter", "heatmap"})  # the cartesian one at plotly.py's plotly.js version
    assert f"<script>{bundle.source()}</script>" in document  # plotly.js is inside
    cdn = report_html(p, plotlyjs="cdn")
    assert len(cdn) < 500_000 and f'<script src="{bundle.cdn_url()}"></script>' in cdn
    with pytest.raises(ValueError, match="plotlyjs"):
        report_html(p, plotlyjs="nope")
    assert to_script_json({"a": "</script>"}) == '{"a":"\\u003c/script>"}'


def test_static_fallback_has_no_scripts(runtime_log: EventLog) -> None:
    gpuviz.asarray(np.ones(10)) * 3
    html = static_html(profile(runtime_log))
    assert "<script" not in html
    assert "<svg" in html and "Placement" in html


def test_lean_map_for_reports_uses_numeric_rows_and_customdata() -> None:
    state = small_state()
    figure = fragmentation_map(state, lean=True)
    used = figure.data[2]
    assert list(used.y) == [0, 0] and list(used.base) == [0, 1024] and list(used.x) == [300, 512]
    # [size, requested, tag, allocating event, its time in ms, call site]: the report's script words it
    custom = [list(c) for c in used.customdata]
    assert custom == [[512, 300, 0, -1, -1, -1], [512, 512, 1, -1, -1, -1]]
    assert used.meta == {"strings": ["x", "<b>bias</b>"]} and used.hovertext is None
    assert list(figure.layout.yaxis.ticktext) == [f"{BASE:#x}"]


def allocate_here(alloc: ReferenceBFCAllocator, nbytes: int) -> int:
    return alloc.allocate(nbytes, tag="x")


def test_call_sites_in_the_map_and_the_call_site_table() -> None:
    from gpuviz.analysis.tables import call_site_table
    from gpuviz.views.tables import call_site_html

    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"), stacks=True)
    allocate_here(alloc, 1000)
    allocate_here(alloc, 3000)
    keep = alloc.allocate(256)
    state = gpuviz.replay(alloc.log).state_at(-1)
    assert state == alloc.state()  # stack ids do not take part in equality
    assert [c.stack >= 0 for c in state.chunks() if c.in_use] == [True, True, True]
    figure = fragmentation_map(state, stacks=alloc.log.stacks)
    hover = " ".join(figure.data[2].hovertext)
    assert f"call site {__file__}:" in hover and "(allocate_here)" in hover
    table = call_site_table(alloc.log)
    assert table[["allocations", "bytes_allocated", "transfers"]].values.tolist() == [[2, 1024 + 3072, 0], [1, 256, 0]]
    assert table["call_site"][0].endswith("(allocate_here)")
    assert "(allocate_here)" in call_site_html(table)
    assert keep


def test_many_transfers_are_drawn_as_time_buckets_without_losing_any() -> None:
    import pandas as pd

    from gpuviz.views.timeline import MAX_TRANSFER_SPANS

    n = 3 * MAX_TRANSFER_SPANS
    transfers = pd.DataFrame(
        {
            "seq": np.arange(n), "time_ns": np.arange(n) * 1000, "duration_ns": np.full(n, 100),
            "bytes": np.full(n, 4096), "direction": ["H2D"] * n, "source": ["CPU:0"] * n,
            "destination": ["GPU:0"] * n, "reason": ["Const"] * n, "bandwidth": np.full(n, 4096e9 / 100),
        }
    )  # fmt: skip
    alloc = ReferenceBFCAllocator(SimUpstream("1GiB"))
    alloc.free(alloc.allocate(1))
    figure = timeline(gpuviz.timeline_series(alloc.log), t0_ns=0, transfers=transfers)
    spans = next(t for t in figure.data if t.name == "H2D transfers")
    assert len(spans.x) <= MAX_TRANSFER_SPANS
    counts = [int(text.split()[0]) for text in spans.hovertext]
    assert sum(counts) == n  # every transfer is in exactly one bucket
    assert spans.hovertext[0] == f"{counts[0]} H2D transfers, {counts[0] * 4} KiB in {counts[0] * 100} ns of copying"
    assert spans.base[0] == 0.0 and spans.base[-1] + spans.x[-1] >= ((n - 1) * 1000 + 100) / 1e9


def test_timeline_units_percent_pool_and_transfer_width(runtime_log: EventLog) -> None:
    gpuviz.config.set_simulated_gpus(1, "1GiB")
    x = gpuviz.asarray(np.ones(1000))  # 8000 B on a preallocated 1 GiB GPU
    instant = time.perf_counter_ns()
    for _ in range(5):  # five marks at one instant (given, so no clock makes them apart)
        runtime_log.mark("step", time_ns=instant)
    (x * 2).numpy()
    p = profile(runtime_log)
    device = p.devices["GPU:0"]
    figure = timeline(device.series, t0_ns=p.t0_ns, transfers=p.transfers, marks=p.marks, peak=device.peak)
    traces = {t.name: t for t in figure.data}
    # the y axis follows the data (KiB), the much larger pool starts hidden
    assert figure.layout.yaxis.title.text == "memory (KiB)"
    assert traces["pool (reserved)"].visible == "legendonly" and traces["bytes in use"].visible is True
    assert max(traces["bytes in use"].y) == 16  # x and x * 2: two 8192-byte chunks, in KiB
    assert "16 KiB" in traces["bytes in use"].text and "7.8 KiB" in traces["bytes requested"].text
    assert figure.layout.yaxis2.ticksuffix == "%" and max(traces["fragmentation"].y) <= 100
    # both drawn: requested dashed over bytes in use
    assert traces["bytes requested"].line.dash == "dash"
    # five marks in one instant: one label, five hover markers
    assert len(traces["marks"].x) == 5 and [a.text for a in figure.layout.annotations].count("step") == 1
    # a 10 µs copy in a longer run is drawn at least MIN_SPAN of the time axis wide
    from gpuviz.views.timeline import MIN_SPAN

    h2d = traces["H2D transfers"]
    span = (device.series.time_ns[-1] - p.t0_ns) / 1e9
    assert h2d.x[0] == pytest.approx(max(MIN_SPAN * span, (10_000 + 8000 * 1e9 / 25e9) / 1e9))


# --- the aggregated map, against its definition -------------------------------------------


def aggregated_by_chunk(state: HeapState, max_rectangles: int, texts: bool = True) -> dict[str, dict[str, list[Any]]]:
    """The aggregated map's definition, chunk by chunk and bucket by bucket (the views compute
    it with whole arrays per segment)."""
    traces: dict[str, dict[str, list[Any]]] = {
        name: {"y": [], "base": [], "x": [], "text": [], "custom": []} for name in fragmentation.COLORS
    }
    buckets = max(1, max_rectangles // (3 * max(1, len(state.segments))))
    for seg in state.segments:
        y = fragmentation._label(seg.base)
        parts: dict[str, list[tuple[int, int]]] = {"used": [], "waste": [], "free": []}
        for c in seg.chunks:
            offset = c.address - seg.base
            if c.in_use:
                parts["used"].append((offset, c.requested))
                if c.size > c.requested:
                    parts["waste"].append((offset + c.requested, c.size - c.requested))
            else:
                parts["free"].append((offset, c.size))
        edges = np.linspace(0, seg.size, buckets + 1)
        amounts = {}
        for name, intervals in parts.items():
            arr = np.array(intervals, dtype=np.int64).reshape(-1, 2)
            covered = fragmentation.coverage(arr[:, 0], arr[:, 1], edges)
            amounts[name] = np.diff(covered)
        counts = np.diff(np.searchsorted([c.address - seg.base for c in seg.chunks], edges))
        for i in range(buckets):
            start = edges[i]
            text = (  # lean traces hover from customdata instead
                f"{int(counts[i])} chunks from {seg.base + int(start):#x}<br>used {format_size(amounts['used'][i])}"
                f"<br>waste {format_size(amounts['waste'][i])}<br>free {format_size(amounts['free'][i])}"
                if texts
                else ""
            )
            for name in ("used", "waste", "free"):
                length = amounts[name][i]
                if length > 0:
                    t = traces[name]
                    t["y"].append(y)
                    t["base"].append(start)
                    t["x"].append(length)
                    t["text"].append(text)
                    t["custom"].append((seg.base + int(edges[i]), int(counts[i]), int(length)))
                    start += length
    return traces


@pytest.mark.parametrize("seed", range(6))
def test_the_aggregated_map_is_its_definition(seed: int) -> None:
    """Random heaps (many segments, chunks in use with waste, free holes), every bucket count
    from one per segment to more buckets than chunks, with and without hover texts: the same
    rectangles, in the same order, with the same hovers and customdata."""
    rng = np.random.default_rng(seed)
    alloc = ReferenceBFCAllocator(SimUpstream("8GiB"), growth=True)
    live = []
    for _ in range(int(rng.integers(50, 1500))):
        if live and rng.random() < 0.45:
            alloc.free(live.pop(int(rng.integers(len(live)))))
        else:
            live.append(alloc.allocate(int(2 ** rng.uniform(4, 26)), tag="t"))
    state = alloc.state()
    assert len(state.segments) > 1
    for max_rectangles in (1, 3 * len(state.segments), 200, 1500, 20_000):
        for texts in (True, False):
            got = fragmentation._aggregated(state, max_rectangles, texts=texts)
            expected = aggregated_by_chunk(state, max_rectangles, texts=texts)
            assert got.keys() == expected.keys()
            for name in expected:
                assert got[name]["y"] == expected[name]["y"]
                assert got[name]["text"] == expected[name]["text"]
                assert got[name]["custom"] == [tuple(int(v) for v in c) for c in expected[name]["custom"]]
                assert got[name]["base"] == [float(b) for b in expected[name]["base"]]
                assert got[name]["x"] == [float(x) for x in expected[name]["x"]]
                assert all(type(v) is float for v in got[name]["base"] + got[name]["x"])
