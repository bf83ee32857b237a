"""What each allocation holds: parameter, gradient, optimizer state, activation, temporary,
input data or unknown.

Where the source says (PyTorch's memory timeline tags each tensor with its category) the
category is taken as it is (``basis`` ``"source"``). Otherwise it is inferred, and marked so:

- from op and scope names (``basis`` ``"op name"``; XPlane and profiler tags), the first rule
  that matches: optimizer ops, scopes and slots (``Adam``, ``optimizer``, ``ResourceApply*``,
  ``optax``, ``scale_by_*``) -> optimizer state; gradient tapes, ``gradients/``, ``*Backward``
  and JAX's ``transpose(jvp(...))`` -> gradient; input pipelines (``MakeIterator``,
  ``IteratorGetNext``, ``*Dataset``, an iterator's ``optional``, ``infeed``, ``input``
  scopes) -> input data; variables (``VarHandleOp``, ``ReadVariableOp``, ``/Variable``,
  initializers) -> parameter; a model's own scopes (Keras layers: ``sequential``, ``dense``,
  ``transformer/layer_3``, ``compile_loss``, ...) and JAX's ``jvp(...)`` -> the forward pass;
- from the stack (``basis`` ``"stack"``): an optimizer's ``step`` -> optimizer state, autograd's
  ``backward`` -> gradient, a module's ``forward`` -> activation; a module's ``__init__``,
  ``to()``/``cuda()``, ``load_state_dict`` or ``torch.load`` -> parameter; a data loader -> input data.

An allocation made in an optimizer step, a backward pass or a forward pass and freed before
that phase ended (the next allocation made in another phase) is a *temporary*. Allocations
with no stack, no tag and no source category are ``unknown`` (``basis`` ``"none"``).

``categories(log, allocations)`` returns a DataFrame aligned with ``allocations`` (an
``allocation_table``): ``category``, ``inferred`` (bool), ``basis`` and ``phase`` (``"step"``,
``"backward"``, ``"forward"`` or None: the phase an inferred category came from); cached per log.
``category_codes`` gives the same as small integer codes (``CategoryCodes``), without a string per row.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpuviz.base.tags import OP_FRAME
from gpuviz.log.eventlog import EventLog, Frame
from gpuviz.log.schema import Kind

__all__ = [
    "CATEGORIES",
    "PARAMETER",
    "GRADIENT",
    "OPTIMIZER_STATE",
    "ACTIVATION",
    "TEMPORARY",
    "INPUT_DATA",
    "UNKNOWN",
    "categories",
    "category_codes",
    "CategoryCodes",
    "BASES",
    "PHASES",
    "stack_phase",
    "OP_FRAME",
    "preexisting",
]

PARAMETER, GRADIENT, OPTIMIZER_STATE = "parameter", "gradient", "optimizer state"
ACTIVATION, TEMPORARY, INPUT_DATA, UNKNOWN = "activation", "temporary", "input data", "unknown"
CATEGORIES = (PARAMETER, GRADIENT, OPTIMIZER_STATE, ACTIVATION, TEMPORARY, INPUT_DATA, UNKNOWN)

_TIMELINE = {  # PyTorch memory timeline tags (importers.torch_memory_timeline.CATEGORIES)
    "parameter": PARAMETER, "optimizer_state": OPTIMIZER_STATE, "input": INPUT_DATA, "temporary": TEMPORARY,
    "activation": ACTIVATION, "gradient": GRADIENT, "autograd_detail": TEMPORARY, "unknown": UNKNOWN,
}  # fmt: skip

# phases a stack or op name can place an allocation in; long-lived allocations of a phase get
# its category, those freed within it are temporaries
_STEP, _BACKWARD, _FORWARD = "step", "backward", "forward"
_PHASE_CATEGORY = {_STEP: OPTIMIZER_STATE, _BACKWARD: GRADIENT, _FORWARD: ACTIVATION}

_OPTIMIZER_FILE = re.compile(r"(?:/optim/|optimi[sz]er|/optax/|/keras/.*optimizers)", re.IGNORECASE)
_BACKWARD_FILE = re.compile(r"(?:torch/autograd/|torch/_tensor\.py|autograd/graph\.py)")
_PARAMETER_FILE = re.compile(r"(?:torch/nn/init\.py|torch/nn/parameter\.py|torch/serialization\.py|safetensors/)")
_PARAMETER_FUNCTIONS = {"_apply", "to", "cuda", "load_state_dict", "_load_from_state_dict", "from_pretrained",
                        "load_checkpoint", "reset_parameters", "init_weights", "_init_weights"}  # fmt: skip
_DATA_FILE = re.compile(r"torch/utils/data/|/datasets/|pin_memory")

# a model's own scopes in op names (TensorFlow's name scopes, Keras layers): the forward pass
_MODEL_SCOPE = (
    r"(?:^|/)[a-z_]*(?:sequential|functional|model|encoder|decoder|transformer|layer|dense|conv|attention"
    r"|embedding|mlp|lstm|gru|rnn|norm|dropout|block|bert|resnet|compile_loss|loss)[a-z_0-9]*/"
)
_OP_RULES = (  # (pattern on an op/scope name, phase or category); the first that matches wins
    (re.compile(r"Optimizer\.step|optimizer|/Adam|ResourceApply|/slot|adam|sgd_update|_foreach_|optax|scale_by_",
                re.I), _STEP),
    (re.compile(r"gradient_tape|gradients/|Backward|autograd::engine|backward|transpose\(jvp\(", re.I), _BACKWARD),
    (re.compile(r"IteratorGetNext|MakeIterator|AnonymousIterator|Iterator(?:V\d)?\b|[A-Za-z]Dataset(?:V\d)?\b"
                r"|^optional:|Optional(?:HasValue|GetValue|FromValue)|RecvTensor|SameWorkerRecvDone|dataloader"
                r"|input_pipeline|data_adapter|InfeedEnqueue|infeed|(?:^|/)inputs?(?:_\d+)?(?:[/:]|$)", re.I),
     INPUT_DATA),
    (re.compile(r"VarHandleOp|AssignVariableOp|ReadVariableOp|VariableV2|variable|parameter|Initializer/", re.I),
     PARAMETER),
    (re.compile(r"forward|nn\.Module:|(?:^|/)jvp\(|" + _MODEL_SCOPE, re.I), _FORWARD),
)  # fmt: skip


def stack_phase(frames: tuple[Frame, ...]) -> str | None:
    """The phase or category a stack (innermost frame first) says: ``"step"``, ``"backward"``,
    ``"forward"``, ``PARAMETER``, ``INPUT_DATA``, or None."""
    forward = parameter = data = False
    for frame in frames:
        path = frame.filename.replace("\\", "/")
        function = frame.function
        if path == OP_FRAME:  # a profiler's op or annotation enclosing the allocation
            named = _name_phase(function)
            if named in (_STEP, _BACKWARD):
                return named
            forward = forward or named == _FORWARD
            parameter = parameter or named == PARAMETER
            data = data or named == INPUT_DATA
            continue
        if function == "step" and _OPTIMIZER_FILE.search(path):
            return _STEP
        if _OPTIMIZER_FILE.search(path) and "/optim/" in path:
            return _STEP
        if _BACKWARD_FILE.search(path) and ("backward" in function or function == "_engine_run_backward"):
            return _BACKWARD
        loads = function in _PARAMETER_FUNCTIONS and "module" in path
        if _PARAMETER_FILE.search(path) or loads or (function == "__init__" and not forward):
            parameter = True
        if function == "forward" or (function == "_call_impl" and "torch/nn/modules/module.py" in path):
            forward = True
        if _DATA_FILE.search(path):
            data = True
    if data:
        return INPUT_DATA
    if forward:
        return _FORWARD
    if parameter:
        return PARAMETER
    return None


def preexisting(log: EventLog, allocations: pd.DataFrame) -> np.ndarray:
    """Per row of ``allocations``: alive before the trace began (a PyTorch snapshot's initial
    blocks, a profiler's ``PREEXISTING`` seeds)."""
    source = log.meta.get("source")
    starts = source.get("trace_start", {}) if isinstance(source, dict) else {}
    made = allocations["alloc_index"].to_numpy()
    before = np.zeros(len(allocations), dtype=bool)
    if isinstance(starts, dict) and len(allocations):
        codes, devices = _device_codes(allocations)
        per_device = np.array([int(starts.get(d, -1)) for d in devices], dtype=np.int64)
        before = made < per_device[codes]
    seeded: np.ndarray = allocations["tag"].to_numpy() == "PREEXISTING"
    result: np.ndarray = before | seeded
    return result


def _device_codes(allocations: pd.DataFrame) -> tuple[np.ndarray, list[Any]]:
    """Each row's device as a code into the distinct devices (one device's table: no hashing)."""
    values = allocations["device"].to_numpy()
    if len(values) and bool((values == values[0]).all()):
        return np.zeros(len(values), dtype=np.intp), [values[0]]
    codes, devices = pd.factorize(values, use_na_sentinel=False)
    return codes, list(devices)


def _name_phase(name: str) -> str | None:
    for pattern, phase in _OP_RULES:
        if pattern.search(name):
            return phase
    return None


def _python_stacks(log: EventLog) -> bool:
    """Whether the log is a PyTorch snapshot whose entries keep their Python frames."""
    source = log.meta.get("source")
    columns = log.meta.get("columns", {})
    return (isinstance(source, dict) and source.get("format") == "pytorch-snapshot"
            and isinstance(columns, dict) and columns.get("stack") == "exact")  # fmt: skip


# phases as small codes (0: none), so rows are classified per distinct stack and tag, then broadcast
PHASES: tuple[str | None, ...] = (None, _STEP, _BACKWARD, _FORWARD, PARAMETER, INPUT_DATA)
_PHASE_CODE = {p: i for i, p in enumerate(PHASES)}
BASES = ("none", "stack", "op name", "source")
"""``basis`` values, in code order (``CategoryCodes.basis``); ``PHASES``: ``phase`` values (None: none)."""
_NONE, _BY_STACK, _BY_NAME, _BY_SOURCE = range(len(BASES))
_CATEGORY_CODE = {c: i for i, c in enumerate(CATEGORIES)}


@dataclass(frozen=True)
class CategoryCodes:
    """``categories`` as small integer codes, one per allocation row (what analyses use: no
    string per row)."""

    category: np.ndarray  # int8: index into ``CATEGORIES``
    basis: np.ndarray  # int8: index into ``BASES``
    phase: np.ndarray  # int8: index into ``PHASES`` (0: none)

    @property
    def inferred(self) -> np.ndarray:
        """Whether each row's category was inferred (not said by the source)."""
        inferred: np.ndarray = self.basis != _BY_SOURCE
        return inferred

    def names(self) -> np.ndarray:
        """Each row's category name (object array)."""
        names: np.ndarray = np.array(CATEGORIES, dtype=object)[self.category]
        return names

    def take(self, rows: np.ndarray) -> CategoryCodes:
        """The codes of the rows at positions (or boolean mask) ``rows``."""
        return CategoryCodes(self.category[rows], self.basis[rows], self.phase[rows])


def _compute(log: EventLog, allocations: pd.DataFrame) -> CategoryCodes:
    n = len(allocations)
    tags = allocations["tag"].to_numpy()
    source = log.meta.get("source", {}) if isinstance(log.meta.get("source"), dict) else {}
    if not n:
        empty = np.zeros(0, dtype=np.int8)
        return CategoryCodes(empty, empty, empty)
    category = np.full(n, _CATEGORY_CODE[UNKNOWN], dtype=np.int8)
    basis = np.full(n, _NONE, dtype=np.int8)
    tag_codes, tag_values = pd.factorize(tags)  # -1: a missing tag
    if source.get("format") == "pytorch-memory-timeline":
        known = np.array([t in _TIMELINE for t in tag_values.tolist()] + [False], dtype=bool)[tag_codes]
        mapped = np.array([_CATEGORY_CODE[_TIMELINE.get(t, UNKNOWN)] for t in tag_values.tolist()] + [0], dtype=np.int8)
        category[known] = mapped[tag_codes][known]
        basis[known] = _BY_SOURCE
        return CategoryCodes(category, basis, np.zeros(n, dtype=np.int8))
    # the phase each distinct stack says, then per row (ids outside the table: no frames)
    stacks = allocations["stack"].to_numpy().astype(np.int64)
    count = len(log.stacks)
    ids = np.where((stacks >= 0) & (stacks < count), stacks, count)
    present = np.zeros(count + 1, dtype=bool)
    present[ids] = True
    framed = np.zeros(count + 1, dtype=bool)
    by_stack = np.zeros(count + 1, dtype=np.int8)
    for stack in np.flatnonzero(present[:count]).tolist():
        frames = log.stacks[stack]
        if frames:
            framed[stack] = True
            by_stack[stack] = _PHASE_CODE[stack_phase(frames)]
    has = framed[ids]
    phase = by_stack[ids]
    basis[phase != 0] = _BY_STACK
    # PyTorch records the Python frames of the allocating thread: autograd's engine runs the
    # backward pass on threads of its own, with none
    if _python_stacks(log):
        frameless = ~has & ~preexisting(log, allocations)
        phase[frameless] = _PHASE_CODE[_BACKWARD]
        basis[frameless] = _BY_STACK
    # else the phase an op or scope name says
    by_name = np.array(
        [_PHASE_CODE[_name_phase(t)] if isinstance(t, str) and t != "PREEXISTING" else 0 for t in tag_values.tolist()]
        + [0],
        dtype=np.int8,
    )[tag_codes]
    named = (phase == 0) & (by_name != 0)
    phase[named] = by_name[named]
    basis[named] = _BY_NAME
    # a phase lasts until the next allocation made in another phase; what is freed before is a temporary
    made = allocations["alloc_index"].to_numpy()
    freed = allocations["free_index"].to_numpy()
    change = np.ones(n, dtype=bool)
    change[1:] = phase[1:] != phase[:-1]
    run_start = np.flatnonzero(change)
    run_of = np.cumsum(change) - 1
    next_start = np.append(run_start[1:], n)  # first row of the next run
    boundary = np.where(next_start < n, made[np.minimum(next_start, n - 1)], np.iinfo(np.int64).max)[run_of]
    # frees after a device's first OOM are the failed run unwinding, not the end of a phase
    cols = log.columns
    oom_at = {int(cols["device"][i]): int(i) for i in np.flatnonzero(cols["kind"] == Kind.OOM)[::-1].tolist()}
    names = {log.devices[d].name: i for d, i in oom_at.items()}
    never = int(np.iinfo(np.int64).max)
    device_codes, devices = _device_codes(allocations)
    cut = np.array([names.get(d, never) for d in devices], dtype=np.int64)[device_codes]
    within = (freed >= 0) & (freed < np.minimum(boundary, cut))
    # a phase's category, or a temporary; a category named directly (parameter, input data) as it is
    lasting = np.array([_CATEGORY_CODE[_PHASE_CATEGORY.get(str(p), str(p))] if p else 0 for p in PHASES], np.int8)
    phased = np.isin(phase, [_PHASE_CODE[p] for p in _PHASE_CATEGORY])
    category = np.where(phase != 0, lasting[phase], category).astype(np.int8)
    category[phased & within] = _CATEGORY_CODE[TEMPORARY]
    return CategoryCodes(category, basis, phase)


def _strings(codes: np.ndarray, values: tuple[str | None, ...]) -> object:
    """The column ``values[codes]``, typed as pandas types a column of those strings (built
    from the distinct values present, then taken per row)."""
    used = np.flatnonzero(np.bincount(codes, minlength=len(values)))
    column = pd.Series(np.array([values[i] for i in used.tolist()], dtype=object)).array
    position = np.zeros(len(values), dtype=np.int64)
    position[used] = np.arange(len(used))
    return column.take(position[codes])


def _coded_frame(codes: CategoryCodes) -> pd.DataFrame:
    if not len(codes.category):  # no rows: columns of no type
        empty = np.full(0, None, dtype=object)
        nothing: pd.DataFrame = pd.DataFrame(
            {"category": empty, "inferred": np.zeros(0, dtype=bool), "basis": empty, "phase": empty}
        )
        return nothing
    frame: pd.DataFrame = pd.DataFrame({
        "category": _strings(codes.category, CATEGORIES), "inferred": codes.inferred,
        "basis": _strings(codes.basis, BASES), "phase": _strings(codes.phase, PHASES),
    })  # fmt: skip
    return frame


class _Entry:
    """One cached result: the table it was computed for (its length, first and last
    allocation), its codes, and its DataFrame once asked for."""

    def __init__(self, key: tuple[int, int, int], codes: CategoryCodes) -> None:
        self.key, self.codes = key, codes
        self.frame: pd.DataFrame | None = None


_CACHE: weakref.WeakKeyDictionary[EventLog, dict[str, _Entry]] = weakref.WeakKeyDictionary()


def _entry(log: EventLog, allocations: pd.DataFrame) -> _Entry:
    made = allocations["alloc_index"].to_numpy()
    key = (len(allocations), int(made[0]) if len(made) else -1, int(made[-1]) if len(made) else -1)
    devices = allocations["device"]
    slot = ",".join(sorted({str(d) for d in devices.unique().tolist()})) if len(devices) else ""
    entry = _CACHE.get(log, {}).get(slot)
    if entry is None or entry.key != key:
        entry = _Entry(key, _compute(log, allocations))
        _CACHE.setdefault(log, {})[slot] = entry
    return entry


def category_codes(log: EventLog, allocations: pd.DataFrame) -> CategoryCodes:
    """``categories`` of the rows of ``allocations`` as ``CategoryCodes``, in its order (cached
    with ``categories``)."""
    return _entry(log, allocations).codes


def categories(log: EventLog, allocations: pd.DataFrame) -> pd.DataFrame:
    """``category``, ``inferred``, ``basis`` and ``phase`` of each row of ``allocations`` (an
    ``allocation_table`` of ``log``), in its order and with its index (see the module docstring).
    The latest result per log and device is kept, so asking again costs nothing."""
    entry = _entry(log, allocations)
    if entry.frame is None:
        entry.frame = _coded_frame(entry.codes)
    aligned: pd.DataFrame = entry.frame.set_axis(allocations.index)
    return aligned
