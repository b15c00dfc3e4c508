#!/usr/bin/env python3
"""Writes kiln's synthetic test models as ONNX files (opset 17, f32).

    gen_models.py --out DIR [--only NAME[,NAME...]] [--batch N]

Models: mlp, lenet, mobilenet_v2, bert_tiny, matmul1024, eltwise (see the builders
below). On request only (`--only`; scripts/gpu-test builds them on the GPU machine, and
the CPU test suite leaves them out): gemm4096, one 4096x4096x4096 MatMul of two inputs,
gemm4096_bf16, the same product with both operands cast to bf16 in the graph, and
tune_check_f32 / tune_check_bf16, smaller products of the same graphs that
scripts/cuda-tune-sweep.sh checks each kernel variant on with `kiln gpu-check`, and
bert_large_layer, one encoder layer of hidden 1024 (16 heads, FFN 4096, 16 positions)
that the sharding tests split over simulated devices (scripts/test builds it).
`--batch N` writes mobilenet_v2 and bert_tiny with a batch dimension of N instead of 1,
as NAME_bN.onnx (the same weights; batch 1 is the file above, byte for byte).

Weights are random but fixed: each model draws from its own numpy
`default_rng(seed)`, weights He-style normal (std sqrt(2/fan_in)), biases normal with
std 0.01. The output is deterministic: the same pinned packages give byte-identical
files, and each model is built twice here and the two serialisations compared.
A file whose bytes are unchanged is not rewritten (its mtime stays, so reference
outputs computed from it stay valid).

The repository ships `models/lenet.onnx`, made by
    scripts/gen_models.py --out models --only lenet
and scripts/test regenerates it into .cache/models and checks the two are identical.
Needs onnx and numpy (the .venv that scripts/setup-test-data makes).
"""

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17


class Builder:
    """Accumulates nodes and initializers of one graph; every name is unique."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self.names = set()
        self.shared = {}

    def _unique(self, name: str) -> str:
        if name in self.names:
            raise ValueError(f"duplicate name {name}")
        self.names.add(name)
        return name

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, self._unique(name)))
        return name

    def const(self, name: str, value, dtype=np.float32) -> str:
        """A constant initializer, created once per name and shared by every user."""
        if name not in self.shared:
            self.shared[name] = self.init(name, np.asarray(value, dtype=dtype))
        return self.shared[name]

    def normal(self, shape, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def weight(self, name: str, shape, fan_in: int) -> str:
        return self.init(name, self.normal(shape, math.sqrt(2.0 / fan_in)))

    def bias(self, name: str, n: int) -> str:
        return self.init(name, self.normal([n], 0.01))

    def node(self, op: str, inputs, name: str, **attrs) -> str:
        """Adds a one-output node named NAME; its output value is NAME too."""
        self.nodes.append(helper.make_node(op, list(inputs), [self._unique(name)], name=name, **attrs))
        return name

    def model(self, graph_name: str, inputs, outputs, doc: str) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, graph_name, inputs, outputs, initializer=self.inits)
        m = helper.make_model(
            g,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="kiln scripts/gen_models.py",
            producer_version="1",
            doc_string=doc,
        )
        m.ir_version = IR_VERSION
        return m


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


# --- builders -----------------------------------------------------------------------


def mlp() -> onnx.ModelProto:
    b = Builder(seed=1)
    b.names.add("input")
    x = "input"
    dims = [784, 512, 256, 10]
    for i, (din, dout) in enumerate(zip(dims, dims[1:])):
        w = b.weight(f"fc{i}.weight", [dout, din], din)
        x = b.node("Gemm", [x, w, b.bias(f"fc{i}.bias", dout)], f"fc{i}", transB=1)
        if i < len(dims) - 2:
            x = b.node("Relu", [x], f"fc{i}.relu")
    b.node("Softmax", [x], "output", axis=-1)
    return b.model("mlp", [f32("input", [1, 784])], [f32("output", [1, 10])],
                   "MLP 784-512-256-10 with ReLU and a final Softmax")


def lenet() -> onnx.ModelProto:
    b = Builder(seed=2)
    b.names.add("input")
    x = "input"
    # conv1: 1 -> 6, 5x5, pad 2 (28x28 stays 28x28); pool -> 14x14
    x = b.node("Conv", [x, b.weight("conv1.weight", [6, 1, 5, 5], 25), b.bias("conv1.bias", 6)],
               "conv1", kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    x = b.node("Relu", [x], "conv1.relu")
    x = b.node("MaxPool", [x], "pool1", kernel_shape=[2, 2], strides=[2, 2])
    # conv2: 6 -> 16, 5x5, no pad (14 -> 10); pool -> 5x5
    x = b.node("Conv", [x, b.weight("conv2.weight", [16, 6, 5, 5], 150), b.bias("conv2.bias", 16)],
               "conv2", kernel_shape=[5, 5])
    x = b.node("Relu", [x], "conv2.relu")
    x = b.node("MaxPool", [x], "pool2", kernel_shape=[2, 2], strides=[2, 2])
    x = b.node("Flatten", [x], "flatten", axis=1)
    dims = [400, 120, 84, 10]
    for i, (din, dout) in enumerate(zip(dims, dims[1:])):
        last = i == len(dims) - 2
        w = b.weight(f"fc{i}.weight", [dout, din], din)
        x = b.node("Gemm", [x, w, b.bias(f"fc{i}.bias", dout)], "output" if last else f"fc{i}", transB=1)
        if not last:
            x = b.node("Relu", [x], f"fc{i}.relu")
    return b.model("lenet", [f32("input", [1, 1, 28, 28])], [f32("output", [1, 10])],
                   "LeNet-5 style CNN for 28x28 grey images, 10 classes")


# MobileNetV2 inverted-residual stages: expansion t, output channels c, repeats n, stride s.
MOBILENET_V2_STAGES = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def mobilenet_v2(batch: int = 1) -> onnx.ModelProto:
    b = Builder(seed=3)
    b.names.add("input")
    lo, hi = b.const("relu6.min", 0.0), b.const("relu6.max", 6.0)

    def conv(x, name, cin, cout, k, stride=1, group=1, relu6=True):
        # Batch normalisation is taken as folded into these weights and bias.
        w = b.weight(f"{name}.weight", [cout, cin // group, k, k], (cin // group) * k * k)
        p = k // 2
        y = b.node("Conv", [x, w, b.bias(f"{name}.bias", cout)], name,
                   kernel_shape=[k, k], strides=[stride, stride], pads=[p, p, p, p], group=group)
        return b.node("Clip", [y, lo, hi], f"{name}.relu6") if relu6 else y

    x = conv("input", "stem", 3, 32, 3, stride=2)
    cin = 32
    block = 0
    for t, c, n, s in MOBILENET_V2_STAGES:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            name = f"block{block}"
            h = x
            if t != 1:
                h = conv(h, f"{name}.expand", cin, hidden, 1)
            h = conv(h, f"{name}.depthwise", hidden, hidden, 3, stride=stride, group=hidden)
            h = conv(h, f"{name}.project", hidden, c, 1, relu6=False)
            if stride == 1 and cin == c:
                h = b.node("Add", [x, h], f"{name}.residual")
            x, cin = h, c
            block += 1
    x = conv(x, "head", cin, 1280, 1)
    x = b.node("GlobalAveragePool", [x], "pool")
    x = b.node("Flatten", [x], "flatten", axis=1)
    b.node("Gemm", [x, b.weight("classifier.weight", [1000, 1280], 1280), b.bias("classifier.bias", 1000)],
           "output", transB=1)
    return b.model("mobilenet_v2", [f32("input", [batch, 3, 224, 224])], [f32("output", [batch, 1000])],
                   "MobileNetV2 (width 1.0) with batch normalisation folded into the convolutions"
                   + batch_note(batch))


BERT = dict(vocab=8192, seq=128, hidden=256, heads=4, ffn=1024, layers=2)
# One encoder layer at BERT-large's width (hidden 1024, 16 heads, FFN 4096) over 16
# positions and a small vocabulary: the larger transformer the sharding tests split over
# 2 and 4 simulated devices (crates/kiln-cli/tests/shard.rs). On request only.
BERT_LARGE_LAYER = dict(vocab=512, seq=16, hidden=1024, heads=16, ffn=4096, layers=1)


def bert_tiny(batch: int = 1) -> onnx.ModelProto:
    return encoder("bert_tiny", BERT, 4, batch)


def bert_large_layer() -> onnx.ModelProto:
    return encoder("bert_large_layer", BERT_LARGE_LAYER, 5, 1)


def encoder(name: str, cfg: dict, seed: int, batch: int) -> onnx.ModelProto:
    """A BERT-style encoder of `cfg`'s sizes (bert_tiny's graph, node for node)."""
    vocab, seq, hid, heads, ffn = (cfg[k] for k in ("vocab", "seq", "hidden", "heads", "ffn"))
    dh = hid // heads
    b = Builder(seed=seed)
    b.names.add("input_ids")
    # Word and position embeddings each with variance 1/2, so their sum has variance 1.
    emb = b.init("embeddings.word", b.normal([vocab, hid], math.sqrt(0.5)))
    pos = b.init("embeddings.position", b.normal([seq, hid], math.sqrt(0.5)))
    x = b.node("Gather", [emb, "input_ids"], "embeddings.gather", axis=0)
    x = b.node("Add", [x, pos], "embeddings.add_position")
    split_shape = b.const("shape.split_heads", [batch, seq, heads, dh], np.int64)
    merge_shape = b.const("shape.merge_heads", [batch, seq, hid], np.int64)
    scale = b.const("attention.scale", math.sqrt(dh))
    sqrt2 = b.const("gelu.sqrt2", math.sqrt(2.0))
    one = b.const("gelu.one", 1.0)
    half = b.const("gelu.half", 0.5)

    def linear(x, name, din, dout):
        y = b.node("MatMul", [x, b.weight(f"{name}.weight", [din, dout], din)], f"{name}.matmul")
        return b.node("Add", [y, b.bias(f"{name}.bias", dout)], f"{name}.add")

    def layer_norm(x, name, out=None):
        g = b.init(f"{name}.scale", (1.0 + b.normal([hid], 0.05)).astype(np.float32))
        return b.node("LayerNormalization", [x, g, b.bias(f"{name}.bias", hid)], out or name,
                      axis=-1, epsilon=1e-5)

    for l in range(cfg["layers"]):
        p = f"layer{l}"
        q = linear(x, f"{p}.query", hid, hid)
        k = linear(x, f"{p}.key", hid, hid)
        v = linear(x, f"{p}.value", hid, hid)
        # [B,seq,hid] -> [B,seq,heads,dh] -> [B,heads,seq,dh]; K goes to [B,heads,dh,seq].
        q = b.node("Transpose", [b.node("Reshape", [q, split_shape], f"{p}.query.split")],
                   f"{p}.query.heads", perm=[0, 2, 1, 3])
        kt = b.node("Transpose", [b.node("Reshape", [k, split_shape], f"{p}.key.split")],
                    f"{p}.key.heads_t", perm=[0, 2, 3, 1])
        v = b.node("Transpose", [b.node("Reshape", [v, split_shape], f"{p}.value.split")],
                   f"{p}.value.heads", perm=[0, 2, 1, 3])
        s = b.node("MatMul", [q, kt], f"{p}.scores")
        s = b.node("Div", [s, scale], f"{p}.scores.scaled")
        s = b.node("Softmax", [s], f"{p}.probs", axis=-1)
        ctx = b.node("MatMul", [s, v], f"{p}.context")
        ctx = b.node("Transpose", [ctx], f"{p}.context.t", perm=[0, 2, 1, 3])
        ctx = b.node("Reshape", [ctx, merge_shape], f"{p}.context.merge")
        o = linear(ctx, f"{p}.attn_out", hid, hid)
        x = layer_norm(b.node("Add", [x, o], f"{p}.attn_residual"), f"{p}.attn_norm")
        # FFN with GELU written out: x * 0.5 * (1 + erf(x / sqrt(2))).
        f = linear(x, f"{p}.ffn_in", hid, ffn)
        e = b.node("Erf", [b.node("Div", [f, sqrt2], f"{p}.gelu.div")], f"{p}.gelu.erf")
        e = b.node("Add", [e, one], f"{p}.gelu.add")
        g = b.node("Mul", [b.node("Mul", [f, half], f"{p}.gelu.half"), e], f"{p}.gelu")
        f = linear(g, f"{p}.ffn_out", ffn, hid)
        last = l == cfg["layers"] - 1
        x = layer_norm(b.node("Add", [x, f], f"{p}.ffn_residual"), f"{p}.ffn_norm", "output" if last else None)
    layers = cfg["layers"]
    return b.model(
        name,
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq])],
        [f32("output", [batch, seq, hid])],
        f"BERT-style encoder: vocab {vocab}, {seq} positions, hidden {hid}, {heads} heads, FFN {ffn}, "
        f"{layers} layer{'s' if layers != 1 else ''}"
        + batch_note(batch),
    )


def product(name: str, seed: int, m: int, k: int, n: int, bf16: bool = False) -> onnx.ModelProto:
    """One [m, k] x [k, n] MatMul of the two inputs `a` and `b`; with `bf16`, both cast to
    bf16 in the graph and the product cast back to f32 (f32 at the API)."""
    b = Builder(seed=seed)
    b.names.update(["a", "b"])
    if bf16:
        a16 = b.node("Cast", ["a"], "a_bf16", to=TensorProto.BFLOAT16)
        b16 = b.node("Cast", ["b"], "b_bf16", to=TensorProto.BFLOAT16)
        y = b.node("MatMul", [a16, b16], "product")
        b.node("Cast", [y], "output", to=TensorProto.FLOAT)
    else:
        b.node("MatMul", ["a", "b"], "output")
    what = f"one {m}x{k}x{n} MatMul of two inputs" + (" cast to bf16" if bf16 else "")
    return b.model(name, [f32("a", [m, k]), f32("b", [k, n])], [f32("output", [m, n])], what)


def matmul1024() -> onnx.ModelProto:
    return product("matmul1024", 5, 1024, 1024, 1024)


def gemm4096() -> onnx.ModelProto:
    # The GPU's matrix-unit benchmark (scripts/gpu-test compiles it with --precision bf16
    # too); too large for the CPU test suite's reference evaluator, so built on request.
    return product("gemm4096", 7, 4096, 4096, 4096)


def gemm4096_bf16() -> onnx.ModelProto:
    # The bf16 GEMM of the GPU's target (>= 400 TFLOP/s): f32 at the API, both operands
    # cast to bf16 in the graph, one bf16 MatMul (f32 accumulation on the tensor cores),
    # its result cast back. The product is the one dispatch the rate is measured on.
    return product("gemm4096_bf16", 8, 4096, 4096, 4096, bf16=True)


def tune_check_f32() -> onnx.ModelProto:
    # A check of the f32 contraction's variants (scripts/cuda-tune-sweep.sh runs
    # `kiln gpu-check` on it, whose interpreter could not check matmul1024 per variant
    # in time): partial tiles in both directions, K not a multiple of any split's part.
    return product("tune_check_f32", 9, 520, 1000, 264)


def tune_check_bf16() -> onnx.ModelProto:
    # gemm4096_bf16's graph at a size the interpreter checks in seconds: K and N multiples
    # of 8 (both operands cp.async, as at 4096), K = 1032 not a multiple of 64 and M, N
    # leaving partial tiles of every tile size.
    return product("tune_check_bf16", 10, 520, 1032, 392, bf16=True)


def eltwise() -> onnx.ModelProto:
    n = 4194304
    b = Builder(seed=6)
    b.names.update(["a", "b", "c"])
    x = b.node("Mul", ["a", "b"], "mul")
    x = b.node("Add", [x, "c"], "add")
    b.node("Relu", [x], "output")
    return b.model("eltwise", [f32("a", [n]), f32("b", [n]), f32("c", [n])], [f32("output", [n])],
                   "Relu(a*b + c) on 4M-element vectors")


def batch_note(batch: int) -> str:
    """The doc string's addition for a batch other than 1 (none for 1, so that file stays as it was)."""
    return "" if batch == 1 else f"; batch {batch}"


MODELS = {
    "mlp": mlp,
    "lenet": lenet,
    "mobilenet_v2": mobilenet_v2,
    "bert_tiny": bert_tiny,
    "matmul1024": matmul1024,
    "eltwise": eltwise,
}
# Built only when named with --only (not part of the CPU test suite's model set).
ON_REQUEST = {
    "gemm4096": gemm4096,
    "gemm4096_bf16": gemm4096_bf16,
    "tune_check_f32": tune_check_f32,
    "tune_check_bf16": tune_check_bf16,
    "bert_large_layer": bert_large_layer,
}
# The builders that take a batch size (--batch).
BATCHED = {"mobilenet_v2", "bert_tiny"}


def build(name: str, batch: int = 1) -> bytes:
    make = {**MODELS, **ON_REQUEST}[name]
    args = (batch,) if batch != 1 else ()
    m = make(*args)
    onnx.checker.check_model(m, full_check=True)
    data = m.SerializeToString()
    if make(*args).SerializeToString() != data:
        sys.exit(f"{name}: two builds serialise differently; generation is not deterministic")
    return data


def write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--only", action="append", default=[], help="model name(s), comma separated")
    ap.add_argument("--batch", type=int, default=1,
                    help=f"batch size of {' and '.join(sorted(BATCHED))} (written as NAME_bN.onnx when not 1)")
    args = ap.parse_args()
    names = [n for arg in args.only for n in arg.split(",") if n] or list(MODELS)
    known = list(MODELS) + list(ON_REQUEST)
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if args.batch < 1:
        sys.exit(f"--batch {args.batch}: a batch size is at least 1")
    if args.batch != 1:
        unbatched = [n for n in names if n not in BATCHED]
        if unbatched:
            sys.exit(f"--batch applies to {', '.join(sorted(BATCHED))}, not to {', '.join(unbatched)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        data = build(name, args.batch)
        path = args.out / (f"{name}.onnx" if args.batch == 1 else f"{name}_b{args.batch}.onnx")
        changed = write_if_changed(path, data)
        print(f"{path}: {len(data)} bytes{'' if changed else ' (unchanged)'}", file=sys.stderr)


if __name__ == "__main__":
    main()
