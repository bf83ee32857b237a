"""A distributed run for JupyterLab: run manifests (``*.gpuviz-run``), the run's result
(``cluster_result``), and the server route answering a manifest with it, each rank's row
linked to its file. (Rendering and clicks in a real JupyterLab: test_cluster_browser.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from runs import write_leaky_run
from test_labextension import EXTENSION, get, ts_constant

from gpuviz import cluster_summary, load_run
from gpuviz.analysis.run import RUN_EXTENSION
from gpuviz.frontends.cli import main
from gpuviz.views.cluster import cluster_heatmap, cluster_result
from gpuviz.views.report import figure_json
from gpuviz.views.result import FORMAT, FORMAT_VERSION

FILES = [f"node0-rank{r}.arrow" for r in range(5)]


def test_a_run_manifest_names_its_folder_or_the_logs_it_lists(tmp_path: Path) -> None:
    assert ts_constant("RUN_EXTENSION") == RUN_EXTENSION == ".gpuviz-run"
    run = write_leaky_run(tmp_path / "run")
    (run / "run.gpuviz-run").write_text("")  # empty: the folder it lies in (manifests aside)
    assert [p.name for p in load_run(run / "run.gpuviz-run").paths] == FILES
    assert [p.name for p in load_run(run).paths] == FILES
    (tmp_path / "some.gpuviz-run").write_text(json.dumps({"logs": "run/node0-rank[13].arrow"}))
    assert [p.name for p in load_run(tmp_path / "some.gpuviz-run").paths] == [FILES[1], FILES[3]]
    (tmp_path / "bad.gpuviz-run").write_text("run/")
    with pytest.raises(ValueError, match=r'bad\.gpuviz-run: a run manifest is empty or JSON \{"logs": "DIR_OR_GLOB"\}'):
        load_run(tmp_path / "bad.gpuviz-run")
    (tmp_path / "bad.gpuviz-run").write_text('{"logs": 3}')
    with pytest.raises(ValueError, match=r'"logs" must name a directory or glob, not 3'):
        load_run(tmp_path / "bad.gpuviz-run")


def test_the_result_of_a_run_holds_its_heatmaps_and_linked_table(tmp_path: Path) -> None:
    summary = cluster_summary(load_run(write_leaky_run(tmp_path / "run")))
    links = [f"run/{name}" for name in FILES]
    data = cluster_result(summary, title="run", links=links)
    assert (data["format"], data["version"], data["title"]) == (FORMAT, FORMAT_VERSION, "run")
    assert data["summary"][0] == "run: 5 ranks on 1 hosts, 5 devices"
    assert [(f["name"], f["rows"]) for f in data["figures"]] == [("heatmap:bytes_in_use", "ranks"),
                                                                 ("heatmap:fragmentation", "ranks")]  # fmt: skip
    expected = json.loads(
        json.dumps(figure_json(cluster_heatmap(summary)), cls=__import__("plotly").utils.PlotlyJSONEncoder)
    )
    assert data["figures"][0]["figure"] == expected
    (table,) = data["tables"]
    assert table["name"] == "ranks" and table["highlight"] == [2] and table["links"] == links and table["total"] is None
    assert table["columns"] == [*summary.table.columns]
    column = table["columns"].index("peak_bytes")
    assert [row[column] for row in table["rows"]] == summary.table["peak_bytes"].tolist()
    assert table["kinds"][column] == "bytes" and table["kinds"][table["columns"].index("peak_time_ns")] == "ns"
    with pytest.raises(ValueError, match="links must give one path"):
        cluster_result(summary, links=[])
    # the CLI writes it too (without links: a saved file has no server to open ranks from)
    assert main(["report", str(tmp_path / "run"), "-o", str(tmp_path / "run.gpuviz.json")]) == 0
    saved = json.loads((tmp_path / "run.gpuviz.json").read_text())
    assert saved == cluster_result(summary, title="gpuviz run: run")
    assert not (tmp_path / "run-ranks").exists()


def test_the_server_answers_a_run_manifest_with_the_runs_result(lab_server) -> None:  # type: ignore[no-untyped-def]
    base, token, root = lab_server
    write_leaky_run(root / "jobs" / "run1")
    (root / "jobs" / "run1" / "run.gpuviz-run").write_text("")
    (root / "jobs" / "two.gpuviz-run").write_text(json.dumps({"logs": "run1/node0-rank[24].arrow"}))
    route = f"{base}/gpuviz/result?token={token}&path="

    status, body = get(route + "jobs/run1/run.gpuviz-run")
    assert status == 200
    summary = cluster_summary(load_run(root / "jobs" / "run1"))
    links = [f"jobs/run1/{name}" for name in FILES]
    assert body == cluster_result(summary, title="jobs/run1/run.gpuviz-run", links=links)
    status, body = get(route + links[2])  # what a click on rank 2's row asks for
    assert status == 200 and body["title"] == "jobs/run1/node0-rank2.arrow"
    assert "GPU:0: peak in use 14 MiB" in "\n".join(body["summary"])  # type: ignore[arg-type]

    status, body = get(route + "jobs/two.gpuviz-run")
    assert status == 200
    assert body["tables"][0]["links"] == ["jobs/run1/node0-rank2.arrow", "jobs/run1/node0-rank4.arrow"]  # type: ignore[index]

    (root / "jobs" / "empty").mkdir()
    (root / "jobs" / "empty" / "e.gpuviz-run").write_text("")
    status, body = get(route + "jobs/empty/e.gpuviz-run")
    assert (
        status == 400 and body["message"] == "jobs/empty: no log files (a run is a directory of logs or a glob pattern)"
    )
    (root / "jobs" / "bad.gpuviz-run").write_text("{")
    status, body = get(route + "jobs/bad.gpuviz-run")
    assert status == 400 and re.match(r"jobs/bad\.gpuviz-run: a run manifest is empty or JSON", str(body["message"]))
    source = (EXTENSION / "src" / "plugin.ts").read_text()
    assert "extensions: [RUN_EXTENSION]" in source
