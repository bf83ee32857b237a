"""The traces engineer's sniffers on every real file in shared/data/traces: each accepts its own and no other."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuviz.importers import rmm_csv, tf_placement, torch_memory_timeline, torch_profiler
from gpuviz.importers.source import Source

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
FIXTURES = Path(__file__).parent / "fixtures"
SNIFFERS = {module.NAME: module.sniff for module in (torch_profiler, torch_memory_timeline, tf_placement, rmm_csv)}
OWN = {
    "pt_memory_timeline_raw_hta.json.gz": "pytorch-memory-timeline",
    "pt_profiler_cuda_v100_hta_df_index_resolver.json.gz": "pytorch-profiler",
    "pt_profiler_cuda_v100_kineto_resnet50_2021_oldschema.json.gz": "pytorch-profiler",
    "tf_placement_colab_gpu_guide.ipynb": "tf-placement",
    "tf_placement_colab_gpu_guide.outputs.txt": "tf-placement",
    "tf_placement_colab_xla_gpu_seq2seq.ipynb": "tf-placement",
    "tf_placement_colab_xla_gpu_seq2seq.outputs.txt": "tf-placement",
}


@pytest.mark.parametrize("path", sorted(p for p in TRACES.iterdir() if p.name != "SOURCES.md"), ids=lambda p: p.name)
def test_each_real_file_is_accepted_by_its_own_sniffer_only(path: Path) -> None:
    head = Source(path).head
    accepted = {name for name, sniff in SNIFFERS.items() if sniff(head)}
    assert accepted == ({OWN[path.name]} if path.name in OWN else set())


@pytest.mark.parametrize("path", sorted(FIXTURES.iterdir()), ids=lambda p: p.name)
def test_fixtures_are_accepted_by_their_own_sniffer_only(path: Path) -> None:
    head = Source(path).head
    accepted = {name for name, sniff in SNIFFERS.items() if sniff(head)}
    expected = (
        "rmm-csv" if path.name.startswith("rmm") else "pytorch-profiler" if "torch_profiler" in path.name else None
    )
    assert accepted == ({expected} if expected else set())
