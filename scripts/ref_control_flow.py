#!/usr/bin/env python3
"""Synthetic control-flow models and ONNX Runtime's outputs on inputs that take each path.

    ref_control_flow.py --cache .cache

Writes, for every model in MODELS,

    CACHE/control-flow/NAME.onnx
    CACHE/control-flow/NAME/CASE.in_K.npy, CASE.out_K.npy   (graph input / output order)
    CACHE/control-flow/manifest.json                        (models, cases, the path each takes)

Each model's inputs are built per case so that a run-time condition goes one way or the
other (a case's `path` says which branches it takes, checked here against ONNX Runtime
through a probe output, so a case cannot quietly take another path). ONNX Runtime runs
on the CPU with graph optimisations disabled and one thread. Needs the .venv of
setup-test-data. `crates/kiln-cli/tests/control_flow.rs` reads the manifest.
"""

import numpy as np
from onnx import TensorProto, helper

from refio import cache_arg, checked_model, const, ort_generator, ort_suite, save_arrays, write_json

OPSET = 17


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def model(nodes, inputs, outputs, inits, name):
    return checked_model(nodes, inputs, outputs, inits, name, "kiln-control-flow", OPSET)


def branch(nodes, outputs, name, inits=()):
    """A branch graph: no inputs, reads outer values by name."""
    return helper.make_graph(nodes, name, [], outputs, list(inits))


def if_score():
    """A two-stage classifier: the second stage (a product, a bias and a ReLU) runs only
    when the first stage's score is positive; else a cheap pointwise path. An op after
    the If reads its result, and the result is also an output (written in place)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 8)).astype(np.float32) * 0.5
    b = rng.standard_normal((8,)).astype(np.float32)
    then = branch(
        [
            helper.make_node("MatMul", ["x", "w"], ["t0"]),
            helper.make_node("Add", ["t0", "b"], ["t1"]),
            helper.make_node("Relu", ["t1"], ["y_then"]),
        ],
        [f32("y_then", [4, 8])],
        "then",
    )
    els = branch(
        [
            helper.make_node("Mul", ["x", "three"], ["e0"]),
            helper.make_node("Sigmoid", ["e0"], ["y_else"]),
        ],
        [f32("y_else", [4, 8])],
        "else",
        [const("three", np.float32(3.0))],
    )
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["score"], keepdims=0),
        helper.make_node("Greater", ["score", "zero"], ["fire"]),
        helper.make_node("If", ["fire"], ["y"], then_branch=then, else_branch=els, name="stage2"),
        helper.make_node("Add", ["y", "x"], ["z"]),
        helper.make_node("Cast", ["fire"], ["probe"], to=TensorProto.INT32),
    ]
    m = model(
        nodes,
        [f32("x", [4, 8])],
        [f32("z", [4, 8]), f32("y", [4, 8]), helper.make_tensor_value_info("probe", TensorProto.INT32, [])],
        [const("w", w), const("b", b), const("zero", np.float32(0.0))],
        "if_score",
    )
    base = rng.standard_normal((4, 8)).astype(np.float32)
    base -= base.mean()
    cases = [
        ("fires", "then", [base + 0.5], 1),
        ("quiet", "else", [base - 0.5], 0),
    ]
    return m, cases


def if_nested():
    """A nested If: the inner one (in the outer then-branch) reads `x` from two levels
    out and a value of the outer branch; three paths."""
    inner_then = branch(
        [helper.make_node("Mul", ["x", "h"], ["it"])],
        [f32("it", [2, 6])],
        "inner_then",
    )
    inner_else = branch(
        [helper.make_node("Sub", ["h", "x"], ["ie"])],
        [f32("ie", [2, 6])],
        "inner_else",
    )
    outer_then = branch(
        [
            helper.make_node("Tanh", ["x"], ["h"]),
            helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
            helper.make_node("Greater", ["mx", "one"], ["c2"]),
            helper.make_node("If", ["c2"], ["ot"], then_branch=inner_then, else_branch=inner_else, name="inner"),
        ],
        [f32("ot", [2, 6])],
        "outer_then",
    )
    outer_else = branch(
        [helper.make_node("Neg", ["x"], ["oe"])],
        [f32("oe", [2, 6])],
        "outer_else",
    )
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0),
        helper.make_node("Greater", ["mean", "zero"], ["c1"]),
        helper.make_node("If", ["c1"], ["y"], then_branch=outer_then, else_branch=outer_else, name="outer"),
    ]
    m = model(
        nodes,
        [f32("x", [2, 6])],
        [f32("y", [2, 6])],
        [const("zero", np.float32(0.0)), const("one", np.float32(1.0))],
        "if_nested",
    )
    rng = np.random.default_rng(2)
    small = (rng.uniform(0.05, 0.9, (2, 6))).astype(np.float32)  # mean > 0, max < 1
    big = small.copy()
    big[1, 3] = 2.5  # mean > 0, max > 1
    neg = -small  # mean < 0
    cases = [
        ("then-then", "then/then", [big], None),
        ("then-else", "then/else", [small], None),
        ("else", "else", [neg], None),
    ]
    return m, cases


def if_mixed():
    """Branches with different op mixes and two results: then a product and a softmax
    (contraction, rows) and `x` itself (a captured value returned as it is); else a
    transpose, reshape and exp (movement, elementwise) and a constant."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 8)).astype(np.float32) * 0.3
    k = rng.standard_normal((4, 8)).astype(np.float32)
    then = branch(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Softmax", ["m"], ["s"], axis=-1),
            helper.make_node("Identity", ["x"], ["xi"]),
        ],
        [f32("s", [4, 8]), f32("xi", [4, 8])],
        "then",
    )
    els = branch(
        [
            helper.make_node("Transpose", ["x"], ["tr"], perm=[1, 0]),
            helper.make_node("Reshape", ["tr", "shape"], ["rs"]),
            helper.make_node("Mul", ["rs", "half"], ["hm"]),
            helper.make_node("Exp", ["hm"], ["ex"]),
        ],
        [f32("ex", [4, 8]), f32("kk", [4, 8])],
        "else",
        [const("shape", np.array([4, 8], dtype=np.int64)), const("half", np.float32(0.5)), const("kk", k)],
    )
    nodes = [
        helper.make_node("Less", ["sel", "zero"], ["c"]),
        helper.make_node("Squeeze", ["c"], ["cs"]),
        helper.make_node("If", ["cs"], ["a", "b"], then_branch=then, else_branch=els, name="mixed"),
        helper.make_node("Mul", ["a", "b"], ["ab"]),
    ]
    m = model(
        nodes,
        [f32("x", [4, 8]), f32("sel", [1])],
        [f32("ab", [4, 8]), f32("a", [4, 8]), f32("b", [4, 8])],
        [const("w", w), const("zero", np.float32(0.0))],
        "if_mixed",
    )
    x = rng.standard_normal((4, 8)).astype(np.float32)
    cases = [
        ("then", "then", [x, np.array([-1.0], dtype=np.float32)], None),
        ("else", "else", [x, np.array([1.0], dtype=np.float32)], None),
    ]
    return m, cases


def loop_body(nodes, n):
    """A Loop body carrying `v` (f32 [n]) and the trip counter `n` (i64)."""
    i64 = TensorProto.INT64
    b = TensorProto.BOOL
    inputs = [
        helper.make_tensor_value_info("iter", i64, []),
        helper.make_tensor_value_info("cond_in", b, []),
        f32("v_in", [n]),
        helper.make_tensor_value_info("n_in", i64, []),
    ]
    outputs = [helper.make_tensor_value_info("cond_out", b, []), f32("v_out", [n]), helper.make_tensor_value_info("n_out", i64, [])]
    return helper.make_graph(nodes, "body", inputs, outputs)


def loop_early_exit():
    """A Loop with a constant bound (6 trips) that exits early on data: `v` grows by
    1.5x per trip while its max stays under 10; the initial condition is data too (zero
    trips when max(x) >= 10). `n` counts the trips (the probe)."""
    i64 = TensorProto.INT64
    body = loop_body(
        [
            helper.make_node("Mul", ["v_in", "growth"], ["v_out"]),
            helper.make_node("ReduceMax", ["v_out"], ["mx"], keepdims=0),
            helper.make_node("Less", ["mx", "ten"], ["cond_out"]),
            helper.make_node("Add", ["n_in", "one"], ["n_out"]),
        ],
        4,
    )
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["mx0"], keepdims=0),
        helper.make_node("Less", ["mx0", "ten"], ["cond0"]),
        helper.make_node("Loop", ["trips", "cond0", "x", "zero_n"], ["v", "probe"], body=body, name="grow"),
    ]
    m = model(
        nodes,
        [f32("x", [4])],
        [f32("v", [4]), helper.make_tensor_value_info("probe", i64, [])],
        [
            const("trips", np.int64(6)),
            const("ten", np.float32(10.0)),
            const("growth", np.float32(1.5)),
            const("one", np.int64(1)),
            const("zero_n", np.int64(0)),
        ],
        "loop_early_exit",
    )
    base = np.array([0.25, 0.5, 0.75, 1.0], dtype=np.float32)
    cases = [
        ("zero-trips", "0 trips", [base * 11.0], 0),
        ("one-trip", "1 trip", [base * 9.0], 1),
        ("four-trips", "4 trips", [base * 2.0], 4),
        ("bound", "6 trips (the bound)", [base * 0.1], 6),
    ]
    return m, cases


def loop_count():
    """A Loop whose trip count `M` is a graph input (compiled with --max-trips 5): `v`
    adds the trip number each trip; `n` counts the trips (the probe)."""
    i64 = TensorProto.INT64
    body = loop_body(
        [
            helper.make_node("Cast", ["iter"], ["fi"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["v_in", "fi"], ["v_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["n_in", "one"], ["n_out"]),
        ],
        3,
    )
    nodes = [helper.make_node("Loop", ["m", "", "x", "zero_n"], ["v", "probe"], body=body, name="count")]
    m = model(
        nodes,
        [f32("x", [3]), helper.make_tensor_value_info("m", i64, [])],
        [f32("v", [3]), helper.make_tensor_value_info("probe", i64, [])],
        [const("one", np.int64(1)), const("zero_n", np.int64(0))],
        "loop_count",
    )
    x = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    cases = [(f"m{k}", f"{k} trips", [x, np.array(k, dtype=np.int64)], k) for k in (0, 2, 5)]
    return m, cases


MODELS = {
    "if_score": if_score,
    "if_nested": if_nested,
    "if_mixed": if_mixed,
    "loop_early_exit": loop_early_exit,
    "loop_count": loop_count,
}

# Import options a model needs (recorded in the manifest).
MAX_TRIPS = {"loop_count": 5}


def main() -> None:
    cache = cache_arg(__doc__.split("\n\n")[0])
    out = cache / "control-flow"
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"generator": ort_generator(), "models": []}
    for name, entry, cases, run in ort_suite(out, "control-flow", MODELS, MAX_TRIPS):
        for label, path_taken, feeds, probe in cases:
            res = run(feeds)
            if probe is not None and int(res[-1]) != probe:
                raise SystemExit(f"{name}/{label}: takes the other branch (probe {int(res[-1])})")
            ins = save_arrays(cache, f"control-flow/{name}/{label}.in", feeds)
            outs = save_arrays(cache, f"control-flow/{name}/{label}.out", res)
            entry["cases"].append({"label": label, "path": path_taken, "inputs": ins, "outputs": outs})
        manifest["models"].append(entry)
    write_json(out / "manifest.json", manifest)
    print(f"control flow: {len(MODELS)} models written to {out}")


if __name__ == "__main__":
    main()
