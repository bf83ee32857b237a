"""A wide run's views: the 1024-rank report stays within its size budget and its heatmaps
keep a bounded height (a 24 px row per rank made a 24,700 px figure that drew slowly)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from runs import write_rank

from gpuviz import load_run
from gpuviz.analysis.cluster import ClusterSummary, RankSummary, assemble_summary, summarize_rank
from gpuviz.base.ranks import RankInfo
from gpuviz.views.cluster import cluster_heatmap, cluster_report_html
from gpuviz.views.plotlyjs import bundle_for


def wide_run(tmp_path: Path, ranks: int) -> ClusterSummary:
    """``ranks`` copies of one real rank summary (8 ranks per host; rank 1 is the real leaky one)."""
    write_rank(tmp_path, 0)
    write_rank(tmp_path, 1, leak=1 << 20)
    run = load_run(tmp_path)
    steady, leaky = summarize_rank(run, 0), summarize_rank(run, 1)
    summaries = []
    for rank in range(ranks):
        info = RankInfo(rank, rank % 8, ranks, f"node{rank // 8}")
        device = f"node{rank // 8}/rank{rank}/GPU:0"
        source = leaky if rank == 1 else steady
        row = {**source.rows[0], "rank": rank, "host": info.host, "local_rank": info.local_rank, "device": device}
        series = dataclasses.replace(source.series[0], device=device)
        summaries.append(RankSummary(info, f"{info.host}-rank{rank}.arrow", [row], [series]))
    return assemble_summary(summaries)


@pytest.mark.parametrize(("ranks", "height"), [(5, 300), (64, 24 * 64 + 150), (1024, 24 * 64 + 150)])
def test_heatmap_height_is_bounded(tmp_path: Path, ranks: int, height: int) -> None:
    summary = wide_run(tmp_path, ranks)
    figure = cluster_heatmap(summary)
    assert figure.layout.height == height
    assert len(figure.data[0].y) == ranks
    assert summary.outliers["rank"].tolist() == [1]


def test_the_1024_rank_report_stays_under_15_mb(tmp_path: Path) -> None:
    page = cluster_report_html(wide_run(tmp_path, 1024))
    size = len(page.encode("utf-8"))
    bundle = bundle_for({"heatmap"})  # cartesian (1.5 MB) where it is plotly.py's plotly.js version, else full (4.8 MB)
    assert 1_500_000 < size - len(bundle.source()) <= 13_500_000  # two 1024 x 200 heatmaps + the table
    assert f"<script>{bundle.source()}</script>" in page
    table = page[page.index("<h2>Per-rank table</h2>") :]
    assert len(re.findall(r'<tr[^>]*class="outlier"', table)) == 1 and table.count("<tr") == 1025
