#!/usr/bin/env python3
"""Models with a bounded input dimension and ONNX Runtime's outputs at several extents.

    ref_bounded.py --cache .cache

kiln compiles a model once with `--input-shape NAME=...MIN..MAX...` and runs it at any
extent up to the bound (docs/bounded-shapes.md). The references come from ONNX
Runtime running each model with that dimension free. Writes

    CACHE/bounded/NAME.onnx                        (the model kiln compiles)
    CACHE/bounded/NAME.dynamic.onnx                (what ONNX Runtime runs, dim free)
    CACHE/bounded/NAME/CASE.in_K.npy, CASE.out_K.npy
    CACHE/bounded/manifest.json                    (models, --input-shape, cases)

- `bert_tiny`: the synthetic encoder of scripts/gen_models.py (CACHE/models/bert_tiny.onnx,
  exported at its largest length, 128 positions), compiled by kiln as it is with
  `input_ids=1x1..128`. ONNX Runtime runs the same graph with a free sequence length:
  the position table sliced to the length (Shape, Slice) and the head split/merge
  shapes with -1 for the length. Lengths 1, 7, 64, 128.
- `mlp_batch`: a two-layer MLP with a soft-max over its classes and the batch mean of
  the probabilities (a reduction over the bounded batch), batch 1..8, at 1, 3 and 8.

ONNX Runtime runs on the CPU with one thread. `crates/kiln-cli/tests/bounded.rs` reads
the manifest.
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def session(m):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def bert_dynamic(m):
    """bert_tiny with its sequence dimension free (see the module docs)."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    seq = g.input[0].type.tensor_type.shape.dim[1].dim_value
    g.input[0].type.tensor_type.shape.dim[1].dim_param = "seq"
    g.output[0].type.tensor_type.shape.dim[1].dim_param = "seq"
    for init in g.initializer:
        if init.name in ("shape.split_heads", "shape.merge_heads"):
            a = numpy_helper.to_array(init).copy()
            assert a[1] == seq, (init.name, a)
            a[1] = -1
            init.CopyFrom(numpy_helper.from_array(a, init.name))
    g.initializer.extend(
        [
            numpy_helper.from_array(np.array([0], np.int64), "bounded.zero"),
            numpy_helper.from_array(np.array([1], np.int64), "bounded.one"),
            numpy_helper.from_array(np.array([2], np.int64), "bounded.two"),
        ]
    )
    pre = [
        helper.make_node("Shape", ["input_ids"], ["bounded.shape"], name="bounded.shape"),
        helper.make_node("Slice", ["bounded.shape", "bounded.one", "bounded.two"], ["bounded.len"], name="bounded.len"),
        helper.make_node(
            "Slice",
            ["embeddings.position", "bounded.zero", "bounded.len", "bounded.zero"],
            ["bounded.position"],
            name="bounded.position",
        ),
    ]
    for n in g.node:
        if n.name == "embeddings.add_position" or (n.op_type == "Add" and "embeddings.position" in n.input):
            n.input[:] = ["bounded.position" if x == "embeddings.position" else x for x in n.input]
    nodes = pre + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    onnx.checker.check_model(m, full_check=True)
    return m


def mlp_batch():
    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((16, 32)) * 0.3).astype(np.float32)
    b1 = (rng.standard_normal(32) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((32, 4)) * 0.3).astype(np.float32)
    b2 = (rng.standard_normal(4) * 0.1).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(b1, "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(b2, "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1.bias"),
        helper.make_node("Relu", ["h1"], ["h"], name="relu"),
        helper.make_node("MatMul", ["h", "w2"], ["l0"], name="fc2"),
        helper.make_node("Add", ["l0", "b2"], ["logits"], name="fc2.bias"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
        helper.make_node("ReduceMean", ["probs"], ["mean"], name="batch_mean", axes=[0], keepdims=1),
    ]

    def build(batch):
        g = helper.make_graph(
            nodes,
            "mlp_batch",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
            [
                helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 4]),
                helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1, 4]),
            ],
            inits,
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln-bounded")
        m.ir_version = 8
        onnx.checker.check_model(m, full_check=True)
        return m

    return build(8), build("batch")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path(".cache"))
    args = ap.parse_args()
    out = args.cache / "bounded"
    out.mkdir(parents=True, exist_ok=True)
    models = []

    def write(name, static, dynamic, shape, cases, make_inputs):
        onnx.save(static, out / f"{name}.onnx")
        onnx.save(dynamic, out / f"{name}.dynamic.onnx")
        sess = session(dynamic)
        d = out / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        listed = []
        for extent in cases:
            case = f"n{extent}"
            feeds = make_inputs(extent)
            res = sess.run(None, feeds)
            for k, i in enumerate(sess.get_inputs()):
                np.save(d / f"{case}.in_{k}.npy", feeds[i.name])
            for k, r in enumerate(res):
                np.save(d / f"{case}.out_{k}.npy", r)
            listed.append({"name": case, "extent": extent, "inputs": len(feeds), "outputs": len(res)})
        models.append({"name": name, "file": f"bounded/{name}.onnx", "dynamic": f"bounded/{name}.dynamic.onnx",
                       "input_shape": shape, "cases": listed})

    bert = onnx.load(args.cache / "models" / "bert_tiny.onnx")
    rng = np.random.default_rng(24)
    write("bert_tiny", bert, bert_dynamic(bert), "input_ids=1x1..128", [1, 7, 64, 128],
          lambda n: {"input_ids": rng.integers(0, 8192, size=(1, n), dtype=np.int64)})
    static, dynamic = mlp_batch()
    rng2 = np.random.default_rng(5)
    write("mlp_batch", static, dynamic, "x=1..8x16", [1, 3, 8],
          lambda n: {"x": rng2.standard_normal((n, 16)).astype(np.float32)})
    (out / "manifest.json").write_text(json.dumps({"models": models}, indent=1) + "\n")
    print(f"wrote {sum(len(m['cases']) for m in models)} cases of {len(models)} models to {out}")


if __name__ == "__main__":
    main()
