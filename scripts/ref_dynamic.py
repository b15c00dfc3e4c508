#!/usr/bin/env python3
"""Synthetic models with data-dependent output sizes and ONNX Runtime's outputs.

    ref_dynamic.py --cache .cache

Writes, for every model in MODELS,

    CACHE/dynamic/NAME.onnx
    CACHE/dynamic/NAME/CASE.in_K.npy, CASE.out_K.npy   (graph input / output order)
    CACHE/dynamic/manifest.json                        (models, --max-dim bounds, cases)

`detector` is a small SSD-style head (a convolution backbone from random weights,
box and score heads, NonMaxSuppression, a Gather of the selected boxes) whose
max_output_boxes_per_class, IoU and score thresholds are run-time inputs; its cases
select 0, 1, several and exactly the declared bound of boxes, and one case needs more
than the bound (`"error": "bound"`: kiln must refuse it at run time). The other models
put NonZero, Compress, a run-time-K TopK and Unique (with and without an axis, sorted
and in order of first occurrence, all four results) on odd shapes with ops after them.
ONNX Runtime runs on the CPU with graph optimisations disabled and one thread. Needs
the .venv of setup-test-data. `crates/kiln-cli/tests/dynamic.rs` reads the manifest.
"""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from refio import cache_arg, checked_model, const, ort_session, save_arrays, write_json

OPSET = 17


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def model(nodes, inputs, outputs, inits, name):
    return checked_model(nodes, inputs, outputs, inits, name, "kiln-dynamic", OPSET)


def detector():
    """image [1,3,16,16] → conv 3→8 (stride 2, ReLU) → conv 8→8 (ReLU) → box head
    (1×1 conv → 4 per cell, added to a grid of anchors) and score head (1×1 conv → 2
    classes, Sigmoid) → NonMaxSuppression over 64 boxes → Gather of the selected boxes."""
    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.4).astype(np.float32)
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32)
    wb = (rng.standard_normal((4, 8, 1, 1)) * 0.05).astype(np.float32)
    ws = (rng.standard_normal((2, 8, 1, 1)) * 0.8).astype(np.float32)
    ys, xs = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    anchors = np.stack([ys / 8, xs / 8, ys / 8 + 0.3, xs / 8 + 0.3], -1).reshape(1, 64, 4).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["image", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "wb"], ["db"]),
        helper.make_node("Reshape", ["db", "s_b"], ["db2"]),
        helper.make_node("Transpose", ["db2"], ["db3"], perm=[0, 2, 1]),
        helper.make_node("Add", ["db3", "anchors"], ["boxes"]),
        helper.make_node("Conv", ["r2", "ws"], ["ds"]),
        helper.make_node("Reshape", ["ds", "s_s"], ["ds2"]),
        helper.make_node("Sigmoid", ["ds2"], ["scores"]),
        helper.make_node(
            "NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_min"], ["selected"], name="nms"
        ),
        helper.make_node("Gather", ["selected", "two"], ["box_index"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero_axis"], ["boxes0"]),
        helper.make_node("Gather", ["boxes0", "box_index"], ["selected_boxes"], axis=0),
    ]
    m = model(
        nodes,
        [
            vi("image", TensorProto.FLOAT, [1, 3, 16, 16]),
            vi("max_out", TensorProto.INT64, [1]),
            vi("iou", TensorProto.FLOAT, [1]),
            vi("score_min", TensorProto.FLOAT, [1]),
        ],
        [
            vi("selected", TensorProto.INT64, ["n", 3]),
            vi("selected_boxes", TensorProto.FLOAT, ["n", 4]),
            vi("scores", TensorProto.FLOAT, [1, 2, 64]),
        ],
        [
            const("w1", w1),
            const("w2", w2),
            const("wb", wb),
            const("ws", ws),
            const("anchors", anchors),
            const("s_b", np.array([1, 4, 64], np.int64)),
            const("s_s", np.array([1, 2, 64], np.int64)),
            const("two", np.array(2, np.int64)),
            const("zero_axis", np.array([0], np.int64)),
        ],
        "detector",
    )
    image = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    i64 = lambda v: np.array([v], np.int64)
    f = lambda v: np.array([v], np.float32)
    # A score threshold between the two highest scores selects exactly one box.
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    scores = sess.run(["scores"], {"image": image, "max_out": i64(1), "iou": f(0.5), "score_min": f(0.0)})[0]
    top = np.sort(scores.ravel())[::-1]
    between = float((top[0] + top[1]) / 2)
    # (case, inputs: image, max_out, iou, score_min; expected count or "bound")
    cases = [
        ("none", [image, i64(5), f(0.5), f(1.0)], 0),
        ("one", [image, i64(3), f(0.5), f(between)], 1),
        ("several", [image, i64(5), f(0.3), f(0.5)], None),
        ("bound", [image, i64(6), f(1.0), f(0.0)], 12),
        ("over", [image, i64(7), f(1.0), f(0.0)], "bound"),
    ]
    return m, {"selected": 12}, cases


def nonzero_odd():
    """NonZero of an odd 3-D shape with a unit axis, then a Cast and an Add."""
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("Cast", ["nz"], ["nzf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["nzf", "half"], ["y"]),
    ]
    m = model(
        nodes,
        [vi("x", TensorProto.FLOAT, [3, 1, 5])],
        [vi("nz", TensorProto.INT64, [3, "n"]), vi("y", TensorProto.FLOAT, [3, "n"])],
        [const("half", np.float32(0.5))],
        "nonzero_odd",
    )
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 1, 5)).astype(np.float32)
    x[rng.random((3, 1, 5)) < 0.4] = 0
    return m, {}, [("mixed", [x], None), ("zeros", [np.zeros((3, 1, 5), np.float32)], 0), ("full", [x + 10], 15)]


def compress_odd():
    """Compress along the middle axis of [2,7,3], then ReLU and a reduction along
    another axis."""
    nodes = [
        helper.make_node("Compress", ["x", "c"], ["y"], axis=1),
        helper.make_node("Relu", ["y"], ["r"]),
        helper.make_node("ReduceSum", ["r", "ax"], ["s"], keepdims=0),
    ]
    m = model(
        nodes,
        [vi("x", TensorProto.FLOAT, [2, 7, 3]), vi("c", TensorProto.BOOL, [7])],
        [vi("y", TensorProto.FLOAT, [2, "n", 3]), vi("s", TensorProto.FLOAT, [2, "n"])],
        [const("ax", np.array([2], np.int64))],
        "compress_odd",
    )
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 7, 3)).astype(np.float32)
    pick = lambda *k: np.array([i in k for i in range(7)])
    return m, {}, [("some", [x, pick(0, 3, 6)], 3), ("none", [x, pick()], 0), ("all", [x, pick(*range(7))], 7)]


def topk_runtime_k():
    """TopK with K an input over axis 0 of [9,4], then a Transpose."""
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=0, name="topk"),
        helper.make_node("Transpose", ["v"], ["vt"], perm=[1, 0]),
    ]
    m = model(
        nodes,
        [vi("x", TensorProto.FLOAT, [9, 4]), vi("k", TensorProto.INT64, [1])],
        [vi("vt", TensorProto.FLOAT, [4, "k"]), vi("i", TensorProto.INT64, ["k", 4])],
        [],
        "topk_runtime_k",
    )
    rng = np.random.default_rng(5)
    x = rng.standard_normal((9, 4)).astype(np.float32)
    k = lambda v: np.array([v], np.int64)
    return m, {}, [("k0", [x, k(0)], 0), ("k3", [x, k(3)], 3), ("k9", [x, k(9)], 9), ("k10", [x, k(10)], "bound")]


def unique_axis():
    """Unique along axis 1 of [2,6,2] in order of first occurrence (all four results),
    and Unique of the flattened input sorted, then a Neg of its values."""
    nodes = [
        helper.make_node("Unique", ["x"], ["y", "idx", "inv", "cnt"], axis=1, sorted=0),
        helper.make_node("Unique", ["x"], ["fy", "fidx", "finv", "fcnt"], sorted=1),
        helper.make_node("Neg", ["fy"], ["nfy"]),
    ]
    i64 = TensorProto.INT64
    m = model(
        nodes,
        [vi("x", TensorProto.FLOAT, [2, 6, 2])],
        [
            vi("y", TensorProto.FLOAT, [2, "u", 2]),
            vi("idx", i64, ["u"]),
            vi("inv", i64, [6]),
            vi("cnt", i64, ["u"]),
            vi("nfy", TensorProto.FLOAT, ["v"]),
            vi("fidx", i64, ["v"]),
            vi("finv", i64, [24]),
            vi("fcnt", i64, ["v"]),
        ],
        [],
        "unique_axis",
    )
    rng = np.random.default_rng(6)
    base = rng.integers(-2, 3, (2, 3, 2)).astype(np.float32)
    x = base[:, [0, 1, 0, 2, 1, 0], :]
    distinct = rng.standard_normal((2, 6, 2)).astype(np.float32)
    same = np.ones((2, 6, 2), np.float32)
    return m, {}, [("repeats", [x], 3), ("distinct", [distinct], 6), ("same", [same], 1)]


def reduce_along():
    """Reductions along the data-dependent axis of a Compress (sum, mean, max, min,
    product, L2): kiln masks the padding with each reduction's identity and divides the
    mean by the extent."""
    red = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2"]
    nodes = [helper.make_node("Compress", ["x", "c"], ["y"], axis=1)]
    # (Opset 17: ReduceSum takes its axes as an input, the others as an attribute.)
    nodes += [
        helper.make_node(r, ["y", "ax"], [f"r{i}"], keepdims=0)
        if r == "ReduceSum"
        else helper.make_node(r, ["y"], [f"r{i}"], keepdims=0, axes=[1])
        for i, r in enumerate(red)
    ]
    nodes.append(helper.make_node("ReduceMean", ["y"], ["whole"], keepdims=1, axes=[0, 1, 2]))
    m = model(
        nodes,
        [vi("x", TensorProto.FLOAT, [2, 7, 3]), vi("c", TensorProto.BOOL, [7])],
        [vi(f"r{i}", TensorProto.FLOAT, [2, 3]) for i in range(len(red))] + [vi("whole", TensorProto.FLOAT, [1, 1, 1])],
        [const("ax", np.array([1], np.int64))],
        "reduce_along",
    )
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((2, 7, 3)) + 0.2).astype(np.float32)
    pick = lambda *k: np.array([i in k for i in range(7)])
    return m, {}, [("one", [x, pick(4)], None), ("some", [x, pick(0, 2, 5)], None), ("all", [x, pick(*range(7))], None)]


MODELS = [detector, nonzero_odd, compress_odd, topk_runtime_k, unique_axis, reduce_along]


def main():
    root = cache_arg() / "dynamic"
    root.mkdir(parents=True, exist_ok=True)
    manifest = {"models": []}
    for make in MODELS:
        m, bounds, cases = make()
        name = m.graph.name
        (root / f"{name}.onnx").write_bytes(m.SerializeToString())
        sess = ort_session(m.SerializeToString())
        names = [i.name for i in sess.get_inputs()]
        out = root / name
        out.mkdir(exist_ok=True)
        entries = []
        for case, ins, expect in cases:
            save_arrays(out, f"{case}.in", ins)
            entry = {"name": case, "inputs": len(ins)}
            if expect == "bound":
                entry["error"] = "bound"
            else:
                try:
                    outs = sess.run(None, dict(zip(names, ins)))
                except Exception as e:  # noqa: BLE001
                    raise SystemExit(f"{name}/{case}: ONNX Runtime failed: {e}")
                count = {"nonzero_odd": outs[0].shape[1], "compress_odd": outs[0].shape[1], "unique_axis": outs[0].shape[1]}.get(name, None)
                count = outs[1].shape[0] if name == "topk_runtime_k" else outs[0].shape[0] if count is None else count
                if expect is not None:
                    assert count == expect, f"{name}/{case}: {count} entries, {expect} meant"
                save_arrays(out, f"{case}.out", outs)
                entry["outputs"] = len(outs)
                entry["count"] = int(count)
            entries.append(entry)
        manifest["models"].append({"name": name, "file": f"dynamic/{name}.onnx", "max_dims": bounds, "cases": entries})
        print(name, [(e["name"], e.get("count", e.get("error"))) for e in entries])
    write_json(root / "manifest.json", manifest)


if __name__ == "__main__":
    main()
