"""The compact string table (gpuviz/log/strings.py) behind ``EventLog.strings``."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from array import array

import pytest

from gpuviz.log import strings as strings_module
from gpuviz.log.eventlog import NO_INDEX, EventLog
from gpuviz.log.strings import StringTable


def test_intern_numbers_new_strings_in_order_and_finds_known_ones() -> None:
    table = StringTable()
    assert [table.intern(t) for t in ("a", "bb", "a", "", "bb", "ccc")] == [0, 1, 0, 2, 1, 3]
    assert list(table) == ["a", "bb", "", "ccc"]
    assert (len(table), table[0], table[-1], table[1:3]) == (4, "a", "ccc", ["bb", ""])
    assert (table.find("ccc"), table.find("zz"), table.index("")) == (3, -1, 2)
    assert ("bb" in table, "b" in table, 1 in table) == (True, False, False)


def test_append_keeps_repeats_in_place_and_lookups_find_the_first() -> None:
    table = StringTable(["x", "y", "x"])
    assert list(table) == ["x", "y", "x"] and len(table) == 3
    assert (table.find("x"), table.intern("x"), table.index("x", 1)) == (0, 0, 2)
    table.append("y")
    assert (table[3], table.find("y"), len(table)) == ("y", 1, 4)


def test_texts_round_trip_exactly_unicode_and_lone_surrogates() -> None:
    texts = ["ascii", "défaut", "张量", "🔥/MatMul:float32[8]", "nul\x00inside", "\udcff", "a\ud800b"]
    table = StringTable(texts)
    assert list(table) == texts
    assert [table.find(t) for t in texts] == list(range(len(texts)))
    assert table.nbytes == sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) + 8 * 8 + 8 * 7 + 4 * 16


def test_many_strings_grow_the_index_and_every_one_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(strings_module, "_RECENT", 16)  # lookups past the recent dict probe the index
    table = StringTable()
    texts = [f"l{i % 97}/MatMul:float32[{i}]" for i in range(20_000)]
    assert [table.intern(t) for t in texts] == list(range(20_000))
    assert [table.find(t) for t in reversed(texts)] == list(range(19_999, -1, -1))
    assert len(table._slots) == 65_536 and len(table.recent) <= 16
    assert table.find("l0/MatMul:float32[20000]") == -1


def test_equality_with_tables_and_lists() -> None:
    assert StringTable(["a", "b"]) == StringTable(["a", "b"]) == ["a", "b"]
    assert StringTable(["a", "b"]) != StringTable(["ab"])
    assert StringTable(["a"]) != ["a", "b"] and StringTable(["a"]) != "a"
    assert json.loads(json.dumps(StringTable(["a", "é"])[:])) == ["a", "é"]


def test_bad_use_is_refused_naming_the_problem() -> None:
    table = StringTable(["a"])
    with pytest.raises(TypeError, match="a string table holds str, not bytes"):
        table.append(b"b")  # type: ignore[arg-type]
    with pytest.raises(IndexError, match="string 1 of a table of 1"):
        table[1]
    with pytest.raises(ValueError, match="'b' is not in the string table"):
        table.index("b")
    assert list(table) == ["a"]


def test_the_log_interns_into_its_table() -> None:
    log = EventLog()
    assert [log.intern_string(t) for t in ("w", "g", "w")] == [0, 1, 0]
    assert log.strings.recent == {"w": 0}  # found by a lookup (a new string is not remembered)
    assert (log.string_id("g"), log.string_id("nope"), log.strings[1]) == (1, NO_INDEX, "g")
    view = log[0:0]
    assert view.strings is log.strings and view.string_id("w") == 0


def test_growing_places_every_string_where_linear_probing_finds_it_also_past_the_last_slot() -> None:
    table = StringTable(f"s{i}" for i in range(3))  # 8 slots
    table._hashes = array("q", [7, 7, 6])  # homes at the end: placed at 6, 7 and, wrapped, 0 ... of 16 after
    table._slots = array("i", [0, 1, 2, -1, -1, -1, -1, -1])
    table._grow()
    assert list(table._slots) == [-1] * 6 + [2, 0, 1] + [-1] * 7  # homes 7, 7, 6 of 16 slots
    table._hashes = array("q", [15, 15, 14])
    table._slots = array("i", [0, 1, 2, -1, -1, -1, -1, -1])
    table._grow()
    assert list(table._slots) == [1] + [-1] * 13 + [2, 0]  # 14: s2; 15: s0; s1 wrapped to 0


def test_a_pickled_table_finds_its_strings_in_another_process() -> None:
    table = StringTable(["a", "b", "a", "é"])
    code = (
        "import pickle, sys; t = pickle.loads(sys.stdin.buffer.read()); "
        "print([t.find(x) for x in ('a', 'b', 'é', 'z')], t.intern('b'), t.intern('c'), list(t))"
    )
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # other str hashes than here
    env = {**os.environ, "PYTHONHASHSEED": seed}
    data = pickle.dumps(table)
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, check=True, env=env)
    assert out.stdout.decode().strip() == "[0, 1, 3, -1] 1 4 ['a', 'b', 'a', 'é', 'c']"
    assert copy.deepcopy(table) == table and copy.deepcopy(table) is not table
