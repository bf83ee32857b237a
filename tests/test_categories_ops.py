"""Categories from op and scope names: a TensorFlow XPlane made by TensorFlow itself (a Keras
``fit`` with Adam, tests/fixtures/tf_bfc/generate.py) gets parameters, gradients, optimizer
state, activations, temporaries and input data from its tensors' names, marked inferred; and
the names JAX gives its ops say forward, backward and optimizer too."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpuviz
from gpuviz.analysis.categories import categories, stack_phase
from gpuviz.analysis.tables import allocation_table
from gpuviz.base.tags import OP_FRAME
from gpuviz.log.eventlog import Frame

KERAS_FIT = Path(__file__).parent / "fixtures" / "tf_bfc" / "keras_fit.xplane.pb.gz"


def test_keras_fit_categories_from_tensor_names_with_exact_bytes() -> None:
    log = gpuviz.load(KERAS_FIT)
    table = allocation_table(log, "CPU:0")
    cats = categories(log, table)
    frame = table.assign(category=cats["category"].to_numpy(), basis=cats["basis"].to_numpy())
    totals = frame.groupby("category")["size"].agg(["count", "sum"])
    assert {k: (int(v["count"]), int(v["sum"])) for k, v in totals.iterrows()} == {
        "activation": (18, 158_720),
        "gradient": (62, 220_160),
        "input data": (465, 126_976),
        "optimizer state": (60, 31_232),
        "parameter": (104, 34_560),
        "temporary": (187, 244_480),
        "unknown": (1055, 377_344),
    }
    named = frame[frame["category"] != "unknown"]
    assert set(named["basis"]) == {"op name"} and bool(cats.loc[named.index, "inferred"].all())

    def category_of(prefix: str) -> set[str]:
        return set(frame.loc[frame["tag"].fillna("").str.startswith(prefix), "category"])

    assert category_of("MakeIterator") == {"input data"}  # the input pipeline's iterator
    assert category_of("AnonymousIteratorV3") == {"input data"}
    assert category_of("OptionalHasValue") == {"input data"}
    assert category_of("VarHandleOp") == {"parameter"}
    assert category_of("__inference_initialize_variables") == {"parameter"}
    assert category_of("StatefulPartitionedCall/sequential_1/dense_1/Relu") == {"activation"}  # kept for backward
    assert category_of("StatefulPartitionedCall/gradient_tape/sequential_1/dense_1/MatMul/MatMul") == {"gradient"}
    assert category_of("StatefulPartitionedCall/adam/AssignSubVariableOp") == {"optimizer state"}
    assert category_of("StatefulPartitionedCall/adam/Sqrt") == {"temporary"}  # freed within the step
    assert category_of("__inference_multi_step_on_iterator") == {"unknown"}  # the step function's own: not said


@pytest.mark.parametrize(
    ("name", "phase"),
    [
        ("jit(train_step)/jit(main)/transpose(jvp(MLP))/dot_general", "backward"),
        ("jit(train_step)/jit(main)/jvp(MLP)/dot_general", "forward"),
        ("jit(train_step)/jit(main)/optax/scale_by_adam/mul", "step"),
        ("input_1:float32[64,32]", "input data"),
        ("IteratorGetNext:float32[64]", "input data"),
        ("replica_4/bert_span_labeler/bert_encoder_1/transformer/layer_5/self_attention/Mul:float16[4]", "forward"),
        ("sequential/dense/Relu:float32[64,64]", "forward"),
        ("model/dense/kernel/Initializer/random_uniform:float32[32,64]", "parameter"),  # variables first
        ("aten::layer_norm", None),
        ("aten::empty", None),
    ],
)
def test_op_names_say_the_phase(name: str, phase: str | None) -> None:
    assert stack_phase((Frame(OP_FRAME, 0, name),)) == phase
