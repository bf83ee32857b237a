"""Memory and CPU bombs for the readers of PyTorch snapshot pickles and XPlanes: each file is
made by the test (pickle opcodes and protobuf wire bytes written by hand), opened in a subprocess
under a memory limit and a generous time limit, with the C readers and without them, and each
ends cleanly: refused with a gpuviz error naming the problem, or loaded with the right result.

A declared length is checked against the bytes that remain before anything is allocated for it,
a memo index against the memo stores before it, and an object a file shares many times is read
once: the shared-reference cases finish in about a second where they took minutes (their cost is
shown by finishing within the time limit, never asserted as a timing)."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import pickletools
import random
import struct
import textwrap
from pathlib import Path
from typing import Any

import pytest
from limited import cap, run_limited
from protowire import field as _field
from traces import REASON

from gpuviz.importers import plainpickle, snapshot_reader, xplane

TIMEOUT_S = 120  # per subprocess: the quadratic readers took minutes on the shared-reference cases

OPEN = textwrap.dedent(
    f"""
    import json, sys
    import numpy as np
    import gpuviz
    from gpuviz.log.schema import KIND_NAMES
    {cap()}
    outcomes = []
    for path in sys.argv[1:]:
        try:
            log = gpuviz.load(path, progress=False)
        except gpuviz.GpuvizError as error:
            outcomes.append({{"refused": str(error).replace(path, "FILE")}})
        except BaseException as error:
            outcomes.append({{"raw": f"{{type(error).__name__}}: {{error}}"[:300]}})
        else:
            kinds = np.bincount(log.columns["kind"], minlength=len(KIND_NAMES)).tolist()
            outcomes.append({{"kinds": {{n: k for n, k in zip(KIND_NAMES, kinds) if k}},
                              "stacks": [len(s) for s in log.stacks],
                              "source": {{k: v for k, v in log.meta["source"].items()
                                         if k in ("initially_allocated", "initial_segments", "entries")}}}})
    print(json.dumps(outcomes))
    """
)

NATIVE = ["1", "0"]  # the C readers, then the Python readers (GPUVIZ_NATIVE=0)


def _open(*paths: Path) -> list[dict[str, Any]]:
    """The outcome of ``gpuviz.load`` of each path, in one subprocess under the limits (with the
    C readers or without, as the ``native`` fixture set ``GPUVIZ_NATIVE``)."""
    outcomes: list[dict[str, Any]] = json.loads(run_limited(OPEN, [str(p) for p in paths], timeout=TIMEOUT_S))
    assert not [o for o in outcomes if "raw" in o], outcomes
    return outcomes


@pytest.fixture(params=NATIVE, ids=["C", "Python"])
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    flag: str = request.param
    monkeypatch.setenv("GPUVIZ_NATIVE", flag)
    if flag == "1" and not (snapshot_reader.native_reader_available() and xplane.native_decoder_available()):
        pytest.skip("the C readers are not built")
    return flag


# ------------------------------------------------------------------ pickles written opcode by opcode
_START = b"\x80\x04}\x94(\x8c\x08segments\x94]\x94"  # PROTO 4, {, MEMOIZE, MARK, "segments", [, MEMOIZE
_END = b"\x8c\x0ddevice_traces\x94]\x94u."  # "device_traces": [] then SETITEMS, STOP


def _with_value(opcode: bytes) -> bytes:
    """A snapshot whose segments list gets one more item: ``opcode`` (with its argument)."""
    return _START[:-1] + b"(" + opcode + b"e" + _END  # MARK, the item, APPENDS


MEMO_INDEX = 2**30 - 1
DECLARED: dict[str, tuple[bytes, str]] = {  # name -> (pickle, what the refusal names)
    "string 2^40": (_with_value(b"\x8d" + struct.pack("<Q", 2**40) + b"abc"), "a string of 1,099,511,627,776 bytes"),
    "string 2^62": (_with_value(b"\x8d" + struct.pack("<Q", 2**62) + b"abc"),
                    "a string of 4,611,686,018,427,387,904 bytes"),
    "string 2^32-1": (_with_value(b"X" + struct.pack("<I", 2**32 - 1) + b"abc"), "a string of 4,294,967,295 bytes"),
    "bytes 2^40": (_with_value(b"\x8e" + struct.pack("<Q", 2**40) + b"abc"), "a bytes value of 1,099,511,627,776"),
    "bytearray 2^40": (_with_value(b"\x96" + struct.pack("<Q", 2**40) + b"abc"), "a bytearray of 1,099,511,627,776"),
    "long 2^31-1": (_with_value(b"\x8b" + struct.pack("<i", 2**31 - 1) + b"abc"), "an integer of 2,147,483,647 bytes"),
    "frame 2^62": (b"\x80\x04\x95" + struct.pack("<Q", 2**62) + _START[2:] + _END,
                   "a frame of 4,611,686,018,427,387,904 bytes"),
}  # fmt: skip


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_the_bounded_unpickler_reads_what_pickle_reads(protocol: int) -> None:
    """Plain data of every protocol (bytes from 3, sets from 4, bytearrays from 5: before, pickle
    writes them as globals), shared objects shared again."""
    shared: list[Any] = ["x" * 300, 2**200, -(2**70), "z" * 70_000]
    value: dict[str, Any] = {"shared": shared, "again": shared, "tuple": (1, 2.5, None, True),
                             "nested": [[shared, {"k": shared}]] * 3}  # fmt: skip
    if protocol >= 3:
        shared.append(b"\x00" * 300)
    if protocol >= 4:
        value["sets"] = [{1, 2}, frozenset({"a"})]
    if protocol >= 5:
        value["bytearray"] = bytearray(b"ab")
    data = pickle.dumps(value, protocol=protocol)
    got = plainpickle.load(io.BytesIO(data), len(data))
    assert got == value and got["again"] is got["shared"] and got["nested"][2][0] is got["shared"]
    if protocol >= 1:  # protocol 0 writes strings as lines, without a length
        with pytest.raises(plainpickle.TooLong, match="a string of 70,000 bytes declared at byte"):
            plainpickle.load(io.BytesIO(data), len(data) - 70_000)  # the 70,000-character string no longer fits


def test_a_memo_index_past_the_memo_stores_is_refused_without_allocating(tmp_path: Path, native: str) -> None:
    # a 45-byte pickle storing its segments list at memo index 2^30 - 1: an 8 GiB memo before
    path = tmp_path / "memo.pickle"
    path.write_bytes(_START[:-1] + b"r" + struct.pack("<I", MEMO_INDEX) + _END)
    (outcome,) = _open(path)
    assert outcome == {
        "refused": "FILE: the pickle is truncated or corrupt (MemoIndex: memo index 1,073,741,823 stored after 2 memo "
        "stores (a pickler numbers them in order)); a pickle is one object, so no readable prefix of it can be imported"
    }


def test_memo_indexes_in_a_pickle_of_any_protocol_load(tmp_path: Path, native: str) -> None:
    """The bound is what every pickler writes: protocols 2-3 store with BINPUT/LONG_BINPUT, 4-5 with MEMOIZE."""
    trace = [{"action": "segment_alloc", "addr": 0, "size": 1 << 20}]
    trace += [{"action": "alloc", "addr": i * 512, "size": 512} for i in range(300)]  # past 256 memo slots
    paths = []
    for protocol in (2, 3, 4, 5):
        paths.append(tmp_path / f"p{protocol}.pickle")
        paths[-1].write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=protocol))
    assert [o["kinds"] for o in _open(*paths)] == [{"segment_alloc": 1, "alloc": 300, "split": 300}] * 4


def test_a_declared_length_past_the_input_is_refused_naming_it(tmp_path: Path, native: str) -> None:
    paths = []
    for i, (data, _) in enumerate(DECLARED.values()):
        paths.append(tmp_path / f"{i}.pickle")
        paths[-1].write_bytes(data)
    for outcome, (name, (_, declared)) in zip(_open(*paths), DECLARED.items(), strict=True):
        assert "refused" in outcome, name
        assert declared in outcome["refused"] and "remain" in outcome["refused"], (name, outcome)


def test_a_gzip_pickle_is_read_as_its_bytes_arrive_not_as_declared(tmp_path: Path, native: str) -> None:
    """Past the decompression limit (1 GiB for a small file) a length is refused at once; under it,
    a string declared at 960 MiB that holds 3 bytes is cut short, never allocated whole."""
    past = tmp_path / "past.pickle.gz"
    past.write_bytes(gzip.compress(_with_value(b"\x8d" + struct.pack("<Q", 2**40) + b"abc")))
    under = tmp_path / "under.pickle.gz"
    under.write_bytes(gzip.compress(_with_value(b"\x8d" + struct.pack("<Q", 960 << 20) + b"abc")))
    refused_past, refused_under = _open(past, under)
    limit = 1 << 30  # what a small gzip file may decompress to
    want = f"a string of 1,099,511,627,776 bytes declared at byte 27, where at most {limit - 27:,} bytes remain"
    assert want in refused_past["refused"], refused_past
    assert refused_under["refused"].startswith("FILE: the pickle is truncated or corrupt"), refused_under


def _length_offsets(data: bytes) -> list[int]:
    """Where the most significant byte of each string's length and of each frame's length lies."""
    out = []
    for op, _, pos in pickletools.genops(data):
        assert pos is not None
        if op.name in ("BINUNICODE", "BINBYTES", "LONG_BINPUT", "LONG_BINGET"):
            out.append(pos + 4)
        elif op.name in ("BINUNICODE8", "FRAME"):
            out.append(pos + 8)
    return out


def _snapshot(entries: int) -> dict[str, Any]:
    frames = [{"filename": f"model{i}.py", "line": i, "name": f"{i}" * 300} for i in range(8)]  # BINUNICODE
    trace: list[dict[str, Any]] = [{"action": "segment_alloc", "addr": 0, "size": 1 << 24, "frames": frames}]
    trace += [{"action": "alloc", "addr": i * 512, "size": 512, "frames": frames[: i % 8]} for i in range(entries)]
    return {"segments": [], "device_traces": [trace], "allocator_settings": {"note": "y" * 70_000}}


def test_a_length_flipped_to_its_largest_is_refused_not_a_memory_error(tmp_path: Path, native: str) -> None:
    """Every length of a snapshot (strings, frames, memo indexes) with its top byte set: refused
    with the length named, never a MemoryError."""
    data = pickle.dumps(_snapshot(400), protocol=4)
    long = pickle.dumps(_snapshot(400), protocol=2)  # LONG_BINPUT and LONG_BINGET
    cases = [(data, at) for at in _length_offsets(data)] + [(long, at) for at in _length_offsets(long)[-20:]]
    assert len(cases) > 25
    paths = []
    for i, (whole, at) in enumerate(cases):
        paths.append(tmp_path / f"{i}.pickle")
        paths[-1].write_bytes(whole[:at] + b"\xff" + whole[at + 1 :])
    for outcome in _open(*paths):
        assert "refused" in outcome, outcome
        assert "declared at byte" in outcome["refused"] or "memo" in outcome["refused"].lower(), outcome


TRACES = os.environ.get("GPUVIZ_TEST_TRACES")
needs_traces = pytest.mark.skipif(not TRACES, reason=REASON)


@pytest.mark.slow
@needs_traces
def test_byte_flips_of_a_real_snapshot_never_raise_a_memory_error(tmp_path: Path, native: str) -> None:
    """Every length in a real snapshot with its top byte set, and 30 random single-byte flips:
    each loads or is refused with a gpuviz error (``_open`` fails on any other exception)."""
    real = Path(str(TRACES)) / "pt_snapshot_assignment2_2026b.pickle"
    whole = real.read_bytes()  # set but missing: fails
    rng = random.Random(29)
    offsets = _length_offsets(whole)
    flips = [(at, 0xFF) for at in rng.sample(offsets, 30)] + [(rng.randrange(len(whole)), rng.randrange(256))
                                                               for _ in range(30)]  # fmt: skip
    paths = []
    for i, (at, byte) in enumerate(flips):
        paths.append(tmp_path / f"{i}.pickle")
        paths[-1].write_bytes(whole[:at] + bytes([byte]) + whole[at + 1 :])
    outcomes = _open(*paths)
    assert all("declared at byte" in o.get("refused", "") or "memo" in o.get("refused", "").lower()
               for o in outcomes[:30]), outcomes[:30]  # fmt: skip


# ------------------------------------------------------------------ shared references
SHARED_ENTRIES, SHARED_FRAMES = 20_000, 100_000


def _shared_frames(first_in_segments: bool) -> bytes:
    """20,000 trace entries sharing one 100,000-frame list (2.3 MB); ``first_in_segments``: the list
    is first referenced by a block of the segments, before the trace."""
    frames = [{"filename": "train.py", "line": i, "name": "step"} for i in range(SHARED_FRAMES)]
    size = SHARED_ENTRIES * 512
    trace: list[dict[str, Any]] = [{"action": "segment_alloc", "addr": 0, "size": size}]
    trace += [{"action": "alloc", "addr": i * 512, "size": 512, "frames": frames} for i in range(SHARED_ENTRIES)]
    segments = []
    if first_in_segments:
        block = {"address": size, "size": 512, "requested_size": 512, "state": "active_allocated", "frames": frames}
        segments = [{"device": 0, "address": size, "total_size": 512, "blocks": [block]}]
    return pickle.dumps({"segments": segments, "device_traces": [trace]}, protocol=4)


@pytest.mark.slow
def test_a_frames_list_shared_by_every_entry_is_one_stack_read_once(tmp_path: Path, native: str) -> None:
    paths = [tmp_path / "trace_first.pickle", tmp_path / "segments_first.pickle"]
    for path, first_in_segments in zip(paths, (False, True), strict=True):
        path.write_bytes(_shared_frames(first_in_segments))
    trace_first, segments_first = _open(*paths)
    assert trace_first["stacks"] == [SHARED_FRAMES]  # one stack, every frame in it
    assert trace_first["kinds"] == {"segment_alloc": 1, "alloc": SHARED_ENTRIES, "split": SHARED_ENTRIES - 1}
    assert segments_first["stacks"] == [SHARED_FRAMES]
    assert segments_first["kinds"] == {"segment_alloc": 2, "alloc": SHARED_ENTRIES + 1, "split": SHARED_ENTRIES - 1}


@pytest.mark.slow
def test_a_block_list_shared_by_every_segment_is_read_once(tmp_path: Path, native: str) -> None:
    """20,000 segment records sharing one list of 20,000 blocks (1 MB): one segment, 20,000 blocks."""
    blocks = [{"address": i * 512, "size": 512, "requested_size": 512, "state": "active_allocated",
               "frames": [{"filename": "train.py", "line": 1, "name": "step"}]} for i in range(20_000)]  # fmt: skip
    segments = [{"device": 0, "address": 0, "total_size": 20_000 * 512, "blocks": blocks} for _ in range(20_000)]
    path = tmp_path / "blocks.pickle"
    path.write_bytes(pickle.dumps({"segments": segments, "device_traces": [[]]}, protocol=4))
    (outcome,) = _open(path)
    assert outcome["source"] == {"initially_allocated": 20_000, "initial_segments": 1, "entries": 0}
    assert outcome["kinds"]["alloc"] == 20_000 and outcome["stacks"] == [1]


@pytest.mark.slow
def test_many_device_traces_and_many_references_are_read_in_linear_time(tmp_path: Path, native: str) -> None:
    """50,000 device traces, then 400,000 references to one settings value (2 MB): a reference is
    told from a device trace by an index, not by scanning every trace."""
    shared = {"a": 1}
    data = {
        "device_traces": [[] for _ in range(50_000)],
        "segments": [],
        "allocator_settings": {"x": [shared] * 400_000},
    }
    path = tmp_path / "traces.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    (outcome,) = _open(path)
    assert outcome["kinds"] == {} and outcome["source"]["entries"] == 0


# ------------------------------------------------------------------ XPlanes


def _metadata(number: int, ident: int, name: bytes) -> bytes:
    return _field(number, _field(1, ident) + _field(2, _field(1, ident) + _field(2, name)))


XPLANE_IDS = 50_000


def _many_metadata() -> bytes:
    """An XSpace with 50,000 event metadata (half MemoryAllocation, half MemoryDeallocation) and
    50,000 stat metadata named ``addr``, and 25,000 allocations each freed, each event naming
    ids from anywhere in those tables (4 MB)."""
    n = XPLANE_IDS
    names = (b"MemoryAllocation", b"MemoryDeallocation")
    metadata = b"".join(_metadata(4, i, names[i % 2]) for i in range(1, n + 1))
    metadata += b"".join(_metadata(5, i, b"addr") for i in range(1, n + 1))
    metadata += _metadata(5, n + 1, b"allocation_bytes") + _metadata(5, n + 2, b"requested_bytes")
    events = []
    sizes = _field(4, _field(1, n + 1) + _field(4, 4096)) + _field(4, _field(1, n + 2) + _field(4, 4096))
    for k in range(n // 2):
        addr = _field(4, _field(1, n - k % 997) + _field(4, 4096 * k))
        for is_alloc, offset in ((True, 2 * k), (False, 2 * k + 1)):
            metadata_id = n - 2 * (k % 1000) - (0 if is_alloc else 1)  # even ids allocate (n is even)
            events.append(_field(4, _field(1, metadata_id) + _field(2, offset * 1000) + addr + sizes))
    line = _field(3, _field(1, 1) + _field(2, b"thread") + _field(3, 1000) + b"".join(events))
    return _field(1, _field(1, 0) + _field(2, b"/host:CPU") + line + metadata)


@pytest.mark.slow
def test_xplane_metadata_are_found_by_index_not_by_scanning(tmp_path: Path, native: str) -> None:
    path = tmp_path / "many.xplane.pb"
    path.write_bytes(_many_metadata())
    (outcome,) = _open(path)
    assert outcome["kinds"]["alloc"] == XPLANE_IDS // 2 and outcome["kinds"]["free"] == XPLANE_IDS // 2
