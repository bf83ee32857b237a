"""The streaming JSON reader (gpuviz/importers/jsonstream.py): the same values as ``json.loads``
whatever the chunk boundaries, and an error for every document cut short."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpuviz.importers.jsonstream import JsonStream

DOCUMENT = {
    "version": 1,
    "items": [{"a": "x", "n": 12345678901234567890}, [], {}, -1.5e-3, True, None, 'é \\ " 🔥', 7],
    "empty": {},
    "tail": [1.0, 2, "3"],
}
TEXT = json.dumps(DOCUMENT, ensure_ascii=False, indent=1)


def _chunks(text: str, size: int) -> Iterator[str]:
    return (text[i : i + size] for i in range(0, len(text), size))


def _read(stream: JsonStream) -> dict[str, Any]:
    """The document, with ``items`` read element by element and ``empty`` skipped."""
    out: dict[str, Any] = {}
    for key in stream.items():
        if key == "items":
            out[key] = [stream.value() for _ in stream.elements()]
        elif key == "empty":
            stream.skip()
        else:
            out[key] = stream.value()
    stream.end()
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64, 1 << 16])
def test_values_are_those_of_json_loads_at_any_chunk_size(size: int) -> None:
    expected = {k: v for k, v in DOCUMENT.items() if k != "empty"}
    assert _read(JsonStream(_chunks(TEXT, size))) == expected


def test_skip_reads_past_nested_values_and_empty_containers() -> None:
    stream = JsonStream(_chunks('{"a": [[1, {"b": [2, [3]]}], {}], "b": [], "c": 4}', 3))
    seen = []
    for key in stream.items():
        if key == "c":
            seen.append(stream.value())
        else:
            stream.skip()
    stream.end()
    assert seen == [4]
    deep = "[" * 5000 + "]" * 5000  # members are decoded whole: json refuses this depth
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        JsonStream(iter([deep])).skip()


def test_every_prefix_of_the_document_is_an_error() -> None:
    for cut in range(len(TEXT)):
        with pytest.raises(json.JSONDecodeError):
            _read(JsonStream(_chunks(TEXT[:cut], 4)))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1 "b": 2}', "expecting ',' or '}' after an object's value, found '\"': character 8 of the document"),
        ('{"items": [1 2]}', "expecting ',' or ']' after an array's element, found '2': character 13 of the document"),
        ('{"a": [1 2]}', "Expecting ',' delimiter: character 9 of the document"),
        ('{"a": 1} x', "extra data after the document: 'x': character 9 of the document"),
        ("[1]", "expecting '{', found '\\[': character 0 of the document"),
        ("{1: 2}", "Expecting property name enclosed in double quotes|expecting an object key"),
        ('{"a": tru}', "Expecting value: character 6 of the document"),
        ("", "expecting '{': the end"),
    ],
)
def test_bad_documents_name_the_problem_and_where(text: str, message: str) -> None:
    with pytest.raises(json.JSONDecodeError, match=message):
        _read(JsonStream(_chunks(text, 3)))
