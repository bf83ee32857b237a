"""Every importer on damaged copies of every fixture the repository holds: cut at many offsets,
bytes flipped, decompressed and recompressed — each copy opened in a subprocess under a memory
and a time limit, and each must end cleanly: loaded (and then summarised and saved) or refused
with a gpuviz error. Deterministic: the offsets and flips come from a seeded generator."""

from __future__ import annotations

import gzip
import json
import random
import textwrap
from pathlib import Path

import pytest
from limited import cap, run_limited

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CASES_PER_FILE = 40
MAX_BYTES = 2 << 20  # fixtures above this (decompressed) are cut, not fuzzed whole

RUN = textwrap.dedent(
    f"""
    import json, sys
    import gpuviz
    from gpuviz.views.text import summary_text
    {cap()}
    outcomes = []
    for path in sys.argv[1:]:
        try:
            log = gpuviz.load(path, progress=False)
            str(log.meta)
            summary_text(log)
            log.save(path + ".arrow")
            outcomes.append("loaded")
        except (gpuviz.GpuvizError, FileNotFoundError) as error:
            outcomes.append("refused")
        except BaseException as error:
            outcomes.append(f"raw {{type(error).__name__}}: {{error}}"[:300])
    print(json.dumps(outcomes))
    """
)


def _fixtures() -> list[Path]:
    return sorted(
        p for p in FIXTURES.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".md") and p.name != "manifest.json"
    )  # fmt: skip


def _variants(data: bytes, rng: random.Random) -> list[bytes]:
    """Cuts at random offsets, single-byte flips and eight-byte overwrites with extreme values."""
    out = [data[: rng.randrange(1, len(data))] for _ in range(CASES_PER_FILE // 2)]
    for _ in range(CASES_PER_FILE // 4):
        at = rng.randrange(len(data))
        out.append(data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :])
    for _ in range(CASES_PER_FILE // 4):
        at = rng.randrange(len(data))
        junk = rng.choice([b"\xff" * 8, b"\x00" * 8, b"9" * 8, b"[[[[[[[[", b"\x7f\xff\xff\xff\xff\xff\xff\xff"])
        out.append(data[:at] + junk + data[at + 8 :])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fixture", _fixtures(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_damaged_copies_of_a_fixture_end_cleanly(tmp_path: Path, fixture: Path) -> None:
    raw = fixture.read_bytes()
    compressed = raw[:2] == b"\x1f\x8b"
    data = gzip.decompress(raw) if compressed else raw
    data = data[:MAX_BYTES]
    rng = random.Random(f"{fixture.name}:{len(data)}")
    paths = []
    for i, variant in enumerate(_variants(data, rng)):
        path = tmp_path / f"case{i}{''.join(fixture.suffixes[:-1] if compressed else fixture.suffixes)}"
        path.write_bytes(gzip.compress(variant, 1) if compressed and i % 2 else variant)
        paths.append(str(path))
    outcomes = json.loads(run_limited(RUN, paths, timeout=600).strip().splitlines()[-1])
    raw_failures = [(paths[i], o) for i, o in enumerate(outcomes) if o not in ("loaded", "refused")]
    assert raw_failures == []
    assert len(outcomes) == len(paths)
