"""Writing a whole log to a file: gpuviz's own format (``save``) and Parquet (``to_parquet``).

``save`` writes the random-access form of the event-log file (``arrowfile.py``), the form
``files.load`` memory-maps; ``to_parquet`` writes the events with their names decoded, for
big-data tools. ``gpuviz.log.files`` is where users find these with ``load``; a log's own
``save`` and ``to_parquet`` methods call them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gpuviz.log.arrowfile import devices_json, write_random_access
from gpuviz.log.logdata import LogData
from gpuviz.log.schema import COLUMNS, DTYPES, FORMAT_MAGIC, FORMAT_VERSION, KIND_NAMES

__all__ = ["save", "to_parquet", "PARQUET_SCHEMA"]


def save(log: LogData, path: str | Path) -> None:
    """Write ``log`` to ``path`` (replacing it) in the random-access form."""
    write_random_access(log, log.columns, path)


_NAME_INDEX: dict[str, Any] = {"kind": pa.int8(), "device": pa.int16(), "peer": pa.int16(), "tag": pa.int32()}
PARQUET_SCHEMA = pa.schema(
    [
        pa.field(name, pa.dictionary(_NAME_INDEX[name], pa.string()))
        if name in _NAME_INDEX
        else pa.field(name, pa.from_numpy_dtype(DTYPES[name]))
        for name, _ in COLUMNS
    ]
)
"""The columns of ``to_parquet``: those of the log, with ``kind``, ``device``, ``peer`` and ``tag``
decoded to their names (dictionary-encoded strings; null where the log has -1). The same for
every log, so the files of many logs form one dataset."""


def _decoded(codes: np.ndarray, names: Sequence[str], index: pa.DataType) -> pa.Array[Any]:
    indices = codes.astype(np.dtype(index.to_pandas_dtype()))
    return pa.DictionaryArray.from_arrays(indices, pa.array(list(names), type=pa.string()), mask=codes < 0)


def to_parquet(log: LogData, path: str | Path) -> None:
    """Write the events as Parquet (``PARQUET_SCHEMA``: names decoded), with the devices and
    format version as metadata."""
    import pyarrow.parquet as pq

    cols = log.columns
    tables = {"kind": KIND_NAMES, "device": log.device_names, "peer": log.device_names, "tag": log.strings}
    arrays = [
        _decoded(cols[field.name], tables[field.name], field.type.index_type)
        if field.name in tables
        else pa.array(cols[field.name], type=field.type)
        for field in PARQUET_SCHEMA
    ]
    extra = {
        "gpuviz.magic": FORMAT_MAGIC,
        "gpuviz.format_version": str(FORMAT_VERSION),
        "gpuviz.devices": json.dumps(devices_json(log.devices), default=str),
    }
    table = pa.Table.from_arrays(arrays, schema=PARQUET_SCHEMA.with_metadata(extra))
    pq.write_table(table, path)
