"""The staging arena's pool: a chunk no longer used (its log dropped, or its rows split into
columns) is kept mapped and the next chunk of its size comes from there, warm, instead of fresh
pages the kernel zeroes first. Each test runs in a fresh interpreter: the pool is the process's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("gpuviz.log._staging", reason="built only where a C compiler exists")


def run(script: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, check=True, timeout=120
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_dropped_arenas_chunks_are_the_next_arenas_same_memory() -> None:
    result = run(
        """
        import json
        import numpy as np
        from gpuviz.log import _staging as staging

        def address(view):
            return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)

        first = staging.Arena()
        first.extend(b"a" * (400 << 10))
        one = first.take()                   # the first chunk, 512 KiB, held by this view
        first.extend(b"a" * (400 << 10))     # does not fit: the next chunk, 2 MiB
        two = first.take()
        addresses = [address(one), address(two)]
        del first, one, two                  # nothing holds either chunk: both go to the pool
        pooled = staging.pool()
        second = staging.Arena()
        second.extend(b"b" * (400 << 10))
        one = second.take()
        second.extend(b"b" * (400 << 10))
        two = second.take()
        print(json.dumps({"pooled": pooled, "after": staging.pool(), "same": [address(one), address(two)] == addresses,
                          "rows": bytes(one) + bytes(two) == b"b" * (800 << 10)}))
        """
    )
    assert result["pooled"] == {"chunks": 2, "bytes": (512 << 10) + (2 << 20), "reused": 0, "mapped": 2}
    assert result["after"] == {"chunks": 0, "bytes": 0, "reused": 2, "mapped": 2}
    assert result["same"] is True and result["rows"] is True


def test_a_log_recorded_after_another_was_read_records_into_warm_chunks() -> None:
    """The first log's blocks are split into columns when it is read, which releases the chunks it
    filled (the one it writes into stays its own until it is dropped); the second log's rows go
    where the first log's were."""
    result = run(
        """
        import json
        from gpuviz import EventLog
        from gpuviz.log import _staging as staging

        def record(log):
            for i in range(20_000):              # 1.5 MB of rows: the chunks of 512 KiB and 2 MiB
                log.append((i, 0, 0, 0, -1, 1, 4096 * i, 256, 256, -1, -1, 0, -1, -1))
            log.flush()

        first = EventLog()
        record(first)
        before = staging.pool()
        sizes = first["size"]                    # read: the blocks become columns, the full chunk is free
        released = staging.pool()
        del first                                # and its current chunk too
        dropped = staging.pool()
        second = EventLog()
        record(second)
        same = bool((second["size"] == sizes).all()) and len(second) == 20_000
        after = staging.pool()
        print(json.dumps({"before": before, "released": released, "dropped": dropped, "after": after, "same": same}))
        """
    )
    assert result["before"] == {"chunks": 0, "bytes": 0, "reused": 0, "mapped": 2}
    assert result["released"] == {"chunks": 1, "bytes": 512 << 10, "reused": 0, "mapped": 2}
    assert result["dropped"] == {"chunks": 2, "bytes": (512 << 10) + (2 << 20), "reused": 0, "mapped": 2}
    # both of the second log's chunks were the first's (and reading it released its first chunk)
    assert result["after"] == {"chunks": 1, "bytes": 512 << 10, "reused": 2, "mapped": 2}
    assert result["same"] is True
