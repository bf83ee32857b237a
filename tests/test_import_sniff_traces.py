"""Every importer's sniffer on every real trace (GPUVIZ_TEST_TRACES) and every fixture: each file is
accepted by its own format's sniffer and by no other (load chooses by content, never by name)."""

from __future__ import annotations

from pathlib import Path

import pytest
from traces import trace_files

from gpuviz.importers import IMPORTERS, detect
from gpuviz.importers.source import Source

FIXTURES = Path(__file__).parent / "fixtures"
MODULES = list(map(__import__("importlib").import_module, IMPORTERS))
SNIFFERS = {module.NAME: module.sniff for module in MODULES}
KEY_SNIFFERS = {module.NAME: module.sniff_keys for module in MODULES if hasattr(module, "sniff_keys")}
OWN = {
    "pt_profiler_cuda_v100_hta_df_index_resolver.json.gz": "pytorch-profiler",
    "pt_profiler_cuda_v100_kineto_resnet50_2021_oldschema.json.gz": "pytorch-profiler",
    "tf_placement_colab_gpu_guide.ipynb": "tf-placement",
    "tf_placement_colab_gpu_guide.outputs.txt": "tf-placement",
    "tf_placement_colab_xla_gpu_seq2seq.ipynb": "tf-placement",
    "tf_placement_colab_xla_gpu_seq2seq.outputs.txt": "tf-placement",
    "pt_snapshot_assignment2_2026a.pickle": "pytorch-snapshot",
    "pt_snapshot_assignment2_2026b.pickle": "pytorch-snapshot",
    "pt_snapshot_cs336_ctx128_forward_mixed_2025.pickle": "pytorch-snapshot",
    "pt_snapshot_cs336_ctx128_fullstep_2025.pickle": "pytorch-snapshot",
    "pt_snapshot_ftcourse_2024.pickle": "pytorch-snapshot",
    "tb_xplane_gpu_multiworker.xplane.pb": "xplane",
    "tb_memory_profile_gpu_multiworker_converted_xprof2.24.2.json.gz": "xprof-memory-profile",
    "tb_memory_profile_tpu_xprof_golden.json.gz": "xprof-memory-profile",
    "pt_memory_timeline_raw_hta.json.gz": "pytorch-memory-timeline",
    "pt_snapshot_codelocation_3gpu_expandable_oom.pickle": "pytorch-snapshot",
    "pt_profiler_h100_owlv2_tracelens.json.gz": "pytorch-profiler",  # by its keys: they sit past the head
}
NOT_YET: dict[str, str] = {}  # real files gpuviz cannot open yet (strict expected failures)


FOLDER_OWNER = {
    "torch_profiler": "pytorch-profiler",
    "torch_profiler_ops": "pytorch-profiler",
    "torch_memory_timeline": "pytorch-memory-timeline",
    "jax_xplane": "xplane",
    "tf_bfc": "xplane",
    "tf_placement": "tf-placement",
    "xprof_memory": "xprof-memory-profile",
    "jax_memory_profile": "jax-memory-profile",
}


def _fixture_owner(path: Path) -> str | None:
    name = path.name
    if name.endswith((".py", ".json")) and path.parent != FIXTURES:
        return None  # generator scripts and manifests
    if path.parent.name in FOLDER_OWNER:
        return FOLDER_OWNER[path.parent.name]
    if path.parent.name == "torch_snapshot_export":
        return "gpuviz" if name.endswith(".arrow") else "pytorch-snapshot"
    if name.startswith("rmm_log"):
        return "rmm-csv"
    if "torch_profiler" in name:
        return "pytorch-profiler"
    if name.startswith("pt_snapshot_"):
        return "pytorch-snapshot"
    return None  # the legacy RMM CSV (rejected by its own reader)


def _accepted(path: Path) -> set[str]:
    """The formats whose sniffer accepts the head, and those whose key sniffer accepts a JSON object's keys."""
    source = Source(path)
    accepted = {name for name, sniff in SNIFFERS.items() if sniff(source.head)}
    if source.head.lstrip().startswith(b"{"):
        top = source.json_top()
        accepted |= {name for name, sniff_keys in KEY_SNIFFERS.items() if sniff_keys(top)}
    return accepted


@pytest.mark.parametrize("path", trace_files(OWN, pattern="*", exclude=["SOURCES.md"], xfail=NOT_YET))
def test_each_real_file_is_accepted_by_its_own_sniffer_only(path: Path) -> None:
    assert _accepted(path) == {OWN[path.name]}
    assert detect(path) == OWN[path.name]


@pytest.mark.parametrize(
    "path", sorted(p for p in FIXTURES.rglob("*") if p.is_file()), ids=lambda p: str(p.relative_to(FIXTURES))
)
def test_fixtures_are_accepted_by_their_own_sniffer_only(path: Path) -> None:
    owner = _fixture_owner(path)
    if path.name == "rmm_legacy_0.13.csv":
        assert _accepted(path) <= {"rmm-csv"}  # sniffed as RMM's CSV so that its reader can explain the old header
        return
    assert _accepted(path) == ({owner} if owner else set())
