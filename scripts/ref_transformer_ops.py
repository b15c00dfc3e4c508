#!/usr/bin/env python3
"""Small models built on opset 23's Attention and RotaryEmbedding, with ONNX Runtime's
outputs.

    ref_transformer_ops.py --cache .cache

Writes CACHE/transformer/NAME.onnx, CACHE/transformer/NAME.in_K.npy / NAME.out_K.npy and
CACHE/transformer/manifest.json (per model: file, inputs, outputs, in graph order).
ONNX Runtime runs on the CPU with graph optimisations disabled and one thread; weights
come from numpy's `default_rng` with a fixed seed per model.

- `decoder_layer`: RMSNormalization, the Q/K/V products, RotaryEmbedding of 3-D Q and K
  through `position_ids` (a run-time input), causal grouped-query Attention on 3-D
  operands (4 query heads over 2 key/value heads), the output product and the residual.
- `cached_step`: one decoding step of three queries over a cache of five keys: 4-D
  operands, interleaved RotaryEmbedding of the first 8 of 16 elements without
  `position_ids`, Attention with `past_key`/`past_value` and a float mask (`−∞` at a
  fifth of the keys), every result (Y and the present keys and values) a graph output.
- `masked_softcap`: 4-D Attention with a boolean mask, an explicit scale, a softcap and
  `qk_matmul_output` after the softmax (mode 3), both results graph outputs.

`crates/kiln-cli/tests/transformer_ops.rs` reads the manifest.
"""

import numpy as np
from onnx import TensorProto, helper

from refio import cache_arg, const, ort_generator, ort_session, save_arrays, write_json

OPSET = 23


def model(nodes, inputs, outputs, inits, name):
    """A one-graph model at opset 23 (IR version 10). The venv's onnx (1.17) predates
    these ops, so its checker cannot check it; ONNX Runtime checks it when it loads."""
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="kiln-transformer")
    m.ir_version = 10
    return m


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def caches(rng, positions, half):
    """cos/sin caches of the usual rotary frequencies (base 10000) at `positions`."""
    inv = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) / half))
    ang = np.asarray(positions, np.float64)[..., None] * inv
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def decoder_layer():
    rng = np.random.default_rng(23)
    s, hidden, hq, hkv, d = 12, 64, 4, 2, 16
    w = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
    cos, sin = caches(rng, np.arange(32), d // 2)
    nodes = [
        helper.make_node("RMSNormalization", ["x", "gamma"], ["n"], axis=-1, epsilon=1e-6),
        helper.make_node("MatMul", ["n", "wq"], ["q"]),
        helper.make_node("MatMul", ["n", "wk"], ["k"]),
        helper.make_node("MatMul", ["n", "wv"], ["v"]),
        helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["qr"], num_heads=hq),
        helper.make_node("RotaryEmbedding", ["k", "cos", "sin", "pos"], ["kr"], num_heads=hkv),
        helper.make_node("Attention", ["qr", "kr", "v"], ["a"], is_causal=1, q_num_heads=hq, kv_num_heads=hkv),
        helper.make_node("MatMul", ["a", "wo"], ["o"]),
        helper.make_node("Add", ["x", "o"], ["y"]),
    ]
    inits = [
        const("gamma", (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)),
        const("wq", w(hidden, hq * d)),
        const("wk", w(hidden, hkv * d)),
        const("wv", w(hidden, hkv * d)),
        const("wo", w(hq * d, hidden)),
        const("cos", cos),
        const("sin", sin),
    ]
    inputs = [vi("x", TensorProto.FLOAT, [1, s, hidden]), vi("pos", TensorProto.INT64, [1, s])]
    outputs = [vi("y", TensorProto.FLOAT, [1, s, hidden])]
    feeds = {
        "x": rng.standard_normal((1, s, hidden)).astype(np.float32),
        "pos": (np.arange(s, dtype=np.int64) + 7)[None, :],
    }
    return model(nodes, inputs, outputs, inits, "decoder_layer"), feeds


def cached_step():
    rng = np.random.default_rng(24)
    b, h, s, past, d, rot = 1, 4, 3, 5, 16, 8
    cos, sin = caches(rng, np.arange(past, past + s)[None, :], rot // 2)
    nodes = [
        helper.make_node("RotaryEmbedding", ["q", "cos", "sin"], ["qr"], interleaved=1, rotary_embedding_dim=rot),
        helper.make_node("RotaryEmbedding", ["k", "cos", "sin"], ["kr"], interleaved=1, rotary_embedding_dim=rot),
        helper.make_node("Attention", ["qr", "kr", "v", "mask", "past_k", "past_v"], ["y", "present_k", "present_v"]),
    ]
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    inits = [const("cos", cos), const("sin", sin)]
    shapes = {"q": [b, h, s, d], "k": [b, h, s, d], "v": [b, h, s, d], "mask": [s, past + s],
              "past_k": [b, h, past, d], "past_v": [b, h, past, d]}
    inputs = [vi(n, TensorProto.FLOAT, sh) for n, sh in shapes.items()]
    outputs = [vi("y", TensorProto.FLOAT, [b, h, s, d]), vi("present_k", TensorProto.FLOAT, [b, h, past + s, d]),
               vi("present_v", TensorProto.FLOAT, [b, h, past + s, d])]
    feeds = {n: f(*sh) for n, sh in shapes.items()}
    feeds["mask"] = np.where(rng.random(shapes["mask"]) < 0.2, -np.inf, 0.5 * f(*shapes["mask"])).astype(np.float32)
    feeds["mask"][:, 0] = 0.0
    return model(nodes, inputs, outputs, inits, "cached_step"), feeds


def masked_softcap():
    rng = np.random.default_rng(25)
    b, h, s, t, d, dv = 2, 3, 5, 7, 8, 6
    nodes = [helper.make_node("Attention", ["q", "k", "v", "mask"], ["y", "", "", "p"], scale=0.3, softcap=4.0,
                              qk_matmul_output_mode=3)]
    shapes = {"q": [b, h, s, d], "k": [b, h, t, d], "v": [b, h, t, dv]}
    inputs = [vi(n, TensorProto.FLOAT, sh) for n, sh in shapes.items()] + [vi("mask", TensorProto.BOOL, [b, 1, s, t])]
    outputs = [vi("y", TensorProto.FLOAT, [b, h, s, dv]), vi("p", TensorProto.FLOAT, [b, h, s, t])]
    feeds = {n: (2.0 * rng.standard_normal(sh)).astype(np.float32) for n, sh in shapes.items()}
    mask = rng.random((b, 1, s, t)) < 0.7
    mask[..., 0] = True
    feeds["mask"] = mask
    return model(nodes, inputs, outputs, [], "masked_softcap"), feeds


def main():
    cache = cache_arg()
    out = cache / "transformer"
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for make in [decoder_layer, cached_step, masked_softcap]:
        m, feeds = make()
        name = m.graph.name
        path = out / f"{name}.onnx"
        path.write_bytes(m.SerializeToString())
        got = ort_session(m.SerializeToString()).run(None, feeds)
        ins = save_arrays(cache, f"transformer/{name}.in", feeds.values())
        outs = save_arrays(cache, f"transformer/{name}.out", got)
        manifest.append({"name": name, "file": f"transformer/{name}.onnx", "inputs": ins, "outputs": outs})
        print(f"{name}: {len(got)} outputs")
    write_json(out / "manifest.json", {"generator": ort_generator(), "models": manifest}, end="")


if __name__ == "__main__":
    main()
