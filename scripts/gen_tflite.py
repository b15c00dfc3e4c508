#!/usr/bin/env python3
"""Writes kiln's synthetic TFLite test models, without TensorFlow.

    gen_tflite.py --out DIR [--only NAME[,NAME...]]     write DIR/NAME.tflite and DIR/NAME.json
    gen_tflite.py --out DIR --check                      ... and check every model against LiteRT
    gen_tflite.py --out DIR --only mobilenet_v2_int8     a model of ON_REQUEST (the benchmark's)
    gen_tflite.py --out DIR --only NAME --trace [CACHE]  per int8 tensor: LiteRT vs the numpy simulation

A model is an architecture (ARCHS below: the synthetic networks kiln's ONNX tests use,
rebuilt in TFLite's NHWC layout, plus small graphs for the ops those leave out) in one of
four variants, written NAME = ARCH_VARIANT:

  f32     float32 weights and activations.
  f16     every float constant stored as FLOAT16 and followed by a DEQUANTIZE to float32
          (what TFLite's converter writes for float16 weight quantisation).
  int8    full-integer quantisation with TFLite's conventions: weights of CONV_2D,
          DEPTHWISE_CONV_2D, TRANSPOSE_CONV and FULLY_CONNECTED int8, symmetric, one scale per
          output channel (zero point 0, values in [-127, 127]); biases int32 with scale
          input scale x weight scale; activations int8, asymmetric, one scale and zero
          point per tensor, from the ranges a calibration pass over 16 inputs gives (run
          here, in numpy). The model's interface stays float32: a QUANTIZE after each input,
          a DEQUANTIZE before each output (the converter's default).
  int8io  int8 with the interface int8 too (the converter's inference_input_type=int8):
          for a few architectures (INT8IO).

Quantisation rules the converter follows and this generator copies (TFLite's
quantization spec): pooling, reshaping, slicing, padding, splitting, packing, gathering,
resizing, REDUCE_MAX and TRANSPOSE keep their input's scale and zero point; SOFTMAX and
LOGISTIC write scale 1/256, zero point -128; TANH scale 1/128, zero point 0; PACK's and
CONCATENATION's inputs are requantised to the output's parameters (a QUANTIZE int8 -> int8
where they differ); an op without an int8 kernel (DIV) runs in float between a DEQUANTIZE
and a QUANTIZE. Constant operands of elementwise ops (ADD, MUL, PRELU's alpha, GATHER's
table) are int8 per tensor, asymmetric, from their own range.

Every model has one subgraph whose tensor names equal its SignatureDef names (key
`serving_default`), so input and output names are stable. Weights are random but fixed
(numpy default_rng per architecture); the same pinned packages write the same bytes, and a
file whose bytes are unchanged is not rewritten.

Beside each model, NAME.json says how to feed it (`inputs`: per input its distribution:
`normal` with a `scale`, or `range` [lo, hi) of integers; an int8 input is fed the
quantised normal) and what it exercises (`ops`, `fused`), which scripts/tflite_reference.py
and crates/kiln-cli/tests/tflite.rs read.

--check runs every model in LiteRT (ai_edge_litert; its builtin kernels without delegates,
REFERENCE_RESOLVER, which the reference data comes from; its XNNPACK delegate and its
reference kernels are run too and their differences reported) and compares with this file's own numpy evaluation of the
same network: float models within rtol 1e-4 / atol 1e-5 of the largest output (f64
numpy vs LiteRT's f32), int8 models against a numpy simulation of the quantised network
(weights and biases dequantised, every activation rounded to its int8 grid) within
CHECK_STEPS quantisation steps of each output, and reports how far the int8 model is from
the float one. It fails on any model LiteRT does not load or run.

Needs numpy, flatbuffers, tflite and ai-edge-litert (the .venv of scripts/setup-test-data).
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

import flatbuffers
import numpy as np
import tflite

# The generator's own version: bumped when what it writes changes in a way the pinned
# packages do not show (the reference data's stamps compare it).
GENERATOR_VERSION = 1

CAL_SAMPLES = 16  # calibration inputs per model
CHECK_STEPS = 3  # --check: LiteRT's int8 output vs the numpy simulation, in steps
FLOAT_RTOL, FLOAT_ATOL = 1e-4, 1e-5

ACT = {None: "NONE", "relu": "RELU", "relu6": "RELU6", "relu_n1_to_1": "RELU_N1_TO_1"}

# TFLite op -> its builtin options table (None: the op has none).
OPTIONS = {
    "ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions", "DIV": "DivOptions",
    "CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "TRANSPOSE_CONV": "TransposeConvOptions", "FULLY_CONNECTED": "FullyConnectedOptions",
    "BATCH_MATMUL": "BatchMatMulOptions", "MAX_POOL_2D": "Pool2DOptions", "AVERAGE_POOL_2D": "Pool2DOptions",
    "MEAN": "ReducerOptions", "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions",
    "RESHAPE": "ReshapeOptions", "SQUEEZE": "SqueezeOptions", "EXPAND_DIMS": "ExpandDimsOptions",
    "TRANSPOSE": "TransposeOptions", "CONCATENATION": "ConcatenationOptions", "SPLIT": "SplitOptions",
    "SPLIT_V": "SplitVOptions", "PACK": "PackOptions", "UNPACK": "UnpackOptions", "PAD": "PadOptions",
    "PADV2": "PadV2Options", "STRIDED_SLICE": "StridedSliceOptions", "SLICE": "SliceOptions",
    "GATHER": "GatherOptions", "RESIZE_BILINEAR": "ResizeBilinearOptions",
    "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions", "SOFTMAX": "SoftmaxOptions",
    "LEAKY_RELU": "LeakyReluOptions", "HARD_SWISH": "HardSwishOptions", "QUANTIZE": "QuantizeOptions",
    "DEQUANTIZE": "DequantizeOptions", "LOGISTIC": None, "TANH": None, "RELU": None, "RELU6": None,
    "RELU_N1_TO_1": None, "PRELU": None,
}
# Ops whose int8 output keeps the (first) input's scale and zero point.
SAME_SCALE = {"MAX_POOL_2D", "AVERAGE_POOL_2D", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "SPLIT",
              "SPLIT_V", "UNPACK", "PAD", "PADV2", "STRIDED_SLICE", "SLICE", "GATHER", "RESIZE_BILINEAR",
              "RESIZE_NEAREST_NEIGHBOR", "REDUCE_MAX"}
# Ops whose int8 output has a fixed scale and zero point.
FIXED_SCALE = {"SOFTMAX": (1.0 / 256, -128), "LOGISTIC": (1.0 / 256, -128), "TANH": (1.0 / 128, 0)}
# Ops whose int8 inputs all take the output's parameters (requantised where they differ).
TIED_INPUTS = {"PACK", "CONCATENATION"}
# Ops LiteRT has no int8 kernel for: run in float inside an int8 model.
FLOAT_ONLY = {"DIV"}
# Weight operand (input index) and its per-channel axis, of the ops with per-channel weights.
WEIGHTS = {"CONV_2D": (1, 0), "DEPTHWISE_CONV_2D": (1, 3), "TRANSPOSE_CONV": (1, 0), "FULLY_CONNECTED": (1, 0)}
# Op versions written for the int8 variant: the first version of each op that takes int8
# (TFLite's op_version.cc); 1 where int8 came with the op (the rest, e.g. RESHAPE).
INT8_VERSION = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "TRANSPOSE_CONV": 3, "FULLY_CONNECTED": 4,
                **{op: 2 for op in ("ADD", "SUB", "MUL", "AVERAGE_POOL_2D", "MAX_POOL_2D", "CONCATENATION",
                                    "SOFTMAX", "LOGISTIC", "TANH", "MEAN", "SUM", "REDUCE_MAX", "TRANSPOSE",
                                    "PAD", "PADV2", "SPLIT", "SPLIT_V", "PACK", "UNPACK", "STRIDED_SLICE",
                                    "SLICE", "GATHER", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "RELU",
                                    "RELU6", "LEAKY_RELU", "BATCH_MATMUL", "QUANTIZE", "DEQUANTIZE")}}


# --- the network: tensors, ops, and their numpy semantics ----------------------------


class Net:
    """A float network in TFLite's terms, built eagerly: every op is evaluated on a probe
    input as it is added, so shapes are known while building. Tensors are ints; a tensor
    is an input, a constant (`consts`: numpy value, float32 or int32) or an op's output."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.tensors = []  # names
        self.consts = {}
        self.inputs = []  # (tensor, dtype, shape, feed spec)
        self.outputs = []
        self.ops = []  # (op, inputs, outputs, attrs)
        self.probe = {}

    def _tensor(self, name: str) -> int:
        if name in self.tensors:
            raise ValueError(f"{self.name}: duplicate tensor name {name}")
        self.tensors.append(name)
        return len(self.tensors) - 1

    def input(self, name, shape, dtype="float32", **feed):
        t = self._tensor(name)
        feed = feed or {"normal": 1.0}
        self.inputs.append((t, dtype, list(shape), feed))
        self.probe[t] = feed_value(dtype, shape, feed, np.random.default_rng(0))
        return t

    def const(self, name, value, dtype=np.float32):
        t = self._tensor(name)
        self.consts[t] = np.asarray(value, dtype=dtype)
        self.probe[t] = self.consts[t]
        return t

    def weight(self, name, shape, fan_in):
        return self.const(name, self.rng.standard_normal(shape) * math.sqrt(2.0 / fan_in))

    def bias(self, name, n):
        return self.const(name, self.rng.standard_normal([n]) * 0.05)

    def op(self, op, inputs, name, nout=1, **attrs):
        outs = [self._tensor(name if nout == 1 else f"{name}:{k}") for k in range(nout)]
        self.ops.append((op, list(inputs), outs, attrs))
        vals = evaluate(op, [self.probe[i] for i in inputs], attrs)
        for o, v in zip(outs, vals):
            self.probe[o] = v
        return outs[0] if nout == 1 else outs

    def shape(self, t):
        return list(np.shape(self.probe[t]))

    def output(self, t):
        self.outputs.append(t)

    def run(self, feeds: dict, hook=None) -> dict:
        """Every tensor's value for `feeds` (tensor -> array), in float64 for floats;
        `hook(op, tensor, value)` may replace each op output (the int8 simulation)."""
        vals = {t: (v.astype(np.float64) if v.dtype.kind == "f" else v) for t, v in self.consts.items()}
        vals.update(feeds)
        for op, ins, outs, attrs in self.ops:
            res = evaluate(op, [vals[i] for i in ins], attrs)
            for o, v in zip(outs, res):
                vals[o] = hook(op, o, v) if hook else v
        return vals


def feed_value(dtype, shape, feed, rng):
    if "range" in feed:
        lo, hi = feed["range"]
        return rng.integers(lo, hi, size=shape).astype(dtype)
    return (rng.standard_normal(shape) * feed["normal"]).astype(np.float32)


def act(x, a):
    if a == "relu":
        return np.maximum(x, 0)
    if a == "relu6":
        return np.clip(x, 0, 6)
    if a == "relu_n1_to_1":
        return np.clip(x, -1, 1)
    return x


def same_pads(size, k, stride, dil=1):
    """TFLite's SAME padding: (output size, padding before)."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dil + 1 - size, 0)
    return out, total // 2


def window(x, kh, kw, stride, padding, dil=1, fill=0.0):
    """x [N,H,W,C] padded as `padding` says: yields ((i, j), slab [N,OH,OW,C]) per tap."""
    n, h, w, c = x.shape
    if padding == "SAME":
        oh, ph = same_pads(h, kh, stride, dil)
        ow, pw = same_pads(w, kw, stride, dil)
    else:
        oh, ph = (h - (kh - 1) * dil - 1) // stride + 1, 0
        ow, pw = (w - (kw - 1) * dil - 1) // stride + 1, 0
    xp = np.full((n, max(h + 2 * ph + kh * dil, (oh - 1) * stride + kh * dil + ph),
                  max(w + 2 * pw + kw * dil, (ow - 1) * stride + kw * dil + pw), c), fill, dtype=x.dtype)
    xp[:, ph:ph + h, pw:pw + w, :] = x
    for i in range(kh):
        for j in range(kw):
            yield (i, j), xp[:, i * dil:i * dil + stride * (oh - 1) + 1:stride, j * dil:j * dil + stride * (ow - 1) + 1:stride, :]


def resize_index(out_size, in_size, align, half):
    scale = (in_size - 1) / (out_size - 1) if align and out_size > 1 else in_size / out_size
    return np.arange(out_size), scale


def evaluate(op, x, a):
    """The op's outputs (a list) for inputs `x`: TFLite's float semantics."""
    f = a.get("act")
    if op in ("ADD", "SUB", "MUL", "DIV"):
        r = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide}[op](x[0], x[1])
        return [act(r, f)]
    if op == "CONV_2D":
        inp, w, b = x
        out = 0
        for (i, j), s in window(inp, w.shape[1], w.shape[2], a["stride"], a["padding"], a.get("dilation", 1)):
            out = out + s @ w[:, i, j, :].T
        return [act(out + b, f)]
    if op == "DEPTHWISE_CONV_2D":
        inp, w, b = x
        inp = np.repeat(inp, a.get("multiplier", 1), axis=3)
        out = 0
        for (i, j), s in window(inp, w.shape[1], w.shape[2], a["stride"], a["padding"], a.get("dilation", 1)):
            out = out + s * w[0, i, j, :]
        return [act(out + b, f)]
    if op == "TRANSPOSE_CONV":
        shape, w, inp = x[0], x[1], x[2]
        n, h, wd, _ = inp.shape
        o, kh, kw, _ = w.shape
        s = a["stride"]
        oh, ow = int(shape[1]), int(shape[2])
        fh, fw = (h - 1) * s + kh, (wd - 1) * s + kw
        full = np.zeros((n, max(fh, oh), max(fw, ow), o), dtype=np.result_type(inp, w))
        for i in range(kh):
            for j in range(kw):
                full[:, i:i + s * (h - 1) + 1:s, j:j + s * (wd - 1) + 1:s, :] += inp @ w[:, i, j, :].T
        ph = max((h - 1) * s + kh - oh, 0) // 2 if a["padding"] == "SAME" else 0
        pw = max((wd - 1) * s + kw - ow, 0) // 2 if a["padding"] == "SAME" else 0
        out = full[:, ph:ph + oh, pw:pw + ow, :]
        if len(x) > 3:
            out = out + x[3]
        return [act(out, f)]
    if op == "FULLY_CONNECTED":
        inp, w, b = x
        y = inp.reshape(-1, w.shape[1]) @ w.T + b
        if a.get("keep_num_dims"):
            y = y.reshape(*inp.shape[:-1], w.shape[0])
        return [act(y, f)]
    if op == "BATCH_MATMUL":
        l, r = x
        if a.get("adj_x"):
            l = np.swapaxes(l, -1, -2)
        if a.get("adj_y"):
            r = np.swapaxes(r, -1, -2)
        return [l @ r]
    if op in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        k, s, p = a["filter"], a["stride"], a["padding"]
        if op == "MAX_POOL_2D":
            out = None
            for _, sl in window(x[0], k, k, s, p, fill=-np.inf):
                out = sl if out is None else np.maximum(out, sl)
            return [act(out, f)]
        tot, cnt = 0, 0
        ones = np.ones(x[0].shape[:3] + (1,))
        for (_, sl), (_, c) in zip(window(x[0], k, k, s, p), window(ones, k, k, s, p)):
            tot, cnt = tot + sl, cnt + c
        return [act(tot / cnt, f)]
    if op in ("MEAN", "SUM", "REDUCE_MAX"):
        fn = {"MEAN": np.mean, "SUM": np.sum, "REDUCE_MAX": np.max}[op]
        return [fn(x[0], axis=tuple(int(i) for i in x[1].ravel()), keepdims=a.get("keep_dims", False))]
    if op == "RESHAPE":
        return [x[0].reshape([int(d) for d in x[1]])]
    if op == "SQUEEZE":
        return [np.squeeze(x[0], axis=tuple(a["dims"]))]
    if op == "EXPAND_DIMS":
        return [np.expand_dims(x[0], int(x[1]))]
    if op == "TRANSPOSE":
        return [np.transpose(x[0], [int(p) for p in x[1]])]
    if op == "CONCATENATION":
        return [act(np.concatenate(x, axis=a["axis"]), f)]
    if op == "SPLIT":
        return list(np.split(x[1], a["num"], axis=int(x[0])))
    if op == "SPLIT_V":
        cuts = np.cumsum([int(s) for s in x[1]])[:-1]
        return list(np.split(x[0], cuts, axis=int(x[2])))
    if op == "PACK":
        return [np.stack(x, axis=a["axis"])]
    if op == "UNPACK":
        return [np.take(x[0], k, axis=a["axis"]) for k in range(x[0].shape[a["axis"]])]
    if op in ("PAD", "PADV2"):
        v = x[2].ravel()[0] if op == "PADV2" else 0
        return [np.pad(x[0], [(int(p[0]), int(p[1])) for p in x[1]], constant_values=v)]
    if op == "STRIDED_SLICE":
        sl = []
        for d, (b, e, s) in enumerate(zip(x[1], x[2], x[3])):
            b = None if a.get("begin_mask", 0) >> d & 1 else int(b)
            e = None if a.get("end_mask", 0) >> d & 1 else int(e)
            sl.append(slice(b, e, int(s)))
        return [x[0][tuple(sl)]]
    if op == "SLICE":
        return [x[0][tuple(slice(int(b), int(b) + int(s)) for b, s in zip(x[1], x[2]))]]
    if op == "GATHER":
        return [np.take(x[0], x[1].astype(np.int64), axis=a.get("axis", 0))]
    if op == "RESIZE_BILINEAR":
        inp = x[0]
        (oh, ow), align, half = [int(v) for v in x[1]], a.get("align_corners", False), a.get("half_pixel_centers", False)

        def axis(out, size):
            scale = (size - 1) / (out - 1) if align and out > 1 else size / out
            v = (np.arange(out) + 0.5) * scale - 0.5 if half else np.arange(out) * scale
            lo = np.maximum(np.floor(v).astype(int), 0)
            hi = np.minimum(np.ceil(v).astype(int), size - 1)
            return v, lo, hi

        yv, y0, y1 = axis(oh, inp.shape[1])
        xv, x0, x1 = axis(ow, inp.shape[2])
        dy = (yv - y0)[None, :, None, None]
        dx = (xv - x0)[None, None, :, None]
        g = lambda ys, xs: inp[:, ys][:, :, xs]
        return [g(y0, x0) * (1 - dy) * (1 - dx) + g(y1, x0) * dy * (1 - dx) + g(y0, x1) * (1 - dy) * dx + g(y1, x1) * dy * dx]
    if op == "RESIZE_NEAREST_NEIGHBOR":
        inp = x[0]
        (oh, ow), align, half = [int(v) for v in x[1]], a.get("align_corners", False), a.get("half_pixel_centers", False)

        def idx(out, size):
            scale = (size - 1) / (out - 1) if align and out > 1 else size / out
            off = 0.5 if half else 0.0
            v = np.round((np.arange(out) + off) * scale) if align else np.floor((np.arange(out) + off) * scale)
            v = np.minimum(v.astype(int), size - 1)
            return np.maximum(v, 0) if half else v

        return [inp[:, idx(oh, inp.shape[1])][:, :, idx(ow, inp.shape[2])]]
    if op == "SOFTMAX":
        z = x[0] * a.get("beta", 1.0)
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return [e / e.sum(axis=-1, keepdims=True)]
    if op == "LOGISTIC":
        return [1 / (1 + np.exp(-x[0]))]
    if op == "TANH":
        return [np.tanh(x[0])]
    if op in ("RELU", "RELU6", "RELU_N1_TO_1"):
        return [act(x[0], op.lower())]
    if op == "LEAKY_RELU":
        return [np.where(x[0] >= 0, x[0], x[0] * a["alpha"])]
    if op == "PRELU":
        return [np.where(x[0] >= 0, x[0], x[0] * x[1])]
    if op == "HARD_SWISH":
        return [x[0] * np.clip(x[0] + 3, 0, 6) / 6]
    raise ValueError(f"no numpy semantics for {op}")


# --- architectures -------------------------------------------------------------------


def conv(n, x, name, cout, k, stride=1, padding="SAME", act_=None, dilation=1):
    cin = n.shape(x)[-1]
    w = n.weight(f"{name}.weight", [cout, k, k, cin], k * k * cin)
    return n.op("CONV_2D", [x, w, n.bias(f"{name}.bias", cout)], name, stride=stride, padding=padding,
                act=act_, dilation=dilation)


def depthwise(n, x, name, k, stride=1, padding="SAME", act_=None, multiplier=1, dilation=1):
    c = n.shape(x)[-1] * multiplier
    w = n.weight(f"{name}.weight", [1, k, k, c], k * k)
    return n.op("DEPTHWISE_CONV_2D", [x, w, n.bias(f"{name}.bias", c)], name, stride=stride, padding=padding,
                act=act_, multiplier=multiplier, dilation=dilation)


def dense(n, x, name, dout, act_=None, keep=False):
    din = n.shape(x)[-1]
    w = n.weight(f"{name}.weight", [dout, din], din)
    return n.op("FULLY_CONNECTED", [x, w, n.bias(f"{name}.bias", dout)], name, act=act_, keep_num_dims=keep)


def i32(n, name, v):
    return n.const(name, v, np.int32)


def mlp():
    """gen_models.py's mlp: 784-512-256-10, ReLU fused, a final SOFTMAX."""
    n = Net("mlp", 1)
    x = n.input("input", [1, 784])
    for i, d in enumerate([512, 256]):
        x = dense(n, x, f"fc{i}", d, "relu")
    n.output(n.op("SOFTMAX", [dense(n, x, "fc2", 10)], "output", beta=1.0))
    return n


def lenet():
    """gen_models.py's lenet in NHWC: two 5x5 convolutions (SAME, VALID) with fused ReLU and
    2x2 max pools, a RESHAPE, three FULLY_CONNECTED."""
    n = Net("lenet", 2)
    x = n.input("input", [1, 28, 28, 1])
    x = conv(n, x, "conv1", 6, 5, act_="relu")
    x = n.op("MAX_POOL_2D", [x], "pool1", filter=2, stride=2, padding="VALID")
    x = conv(n, x, "conv2", 16, 5, padding="VALID", act_="relu")
    x = n.op("MAX_POOL_2D", [x], "pool2", filter=2, stride=2, padding="VALID")
    x = n.op("RESHAPE", [x, i32(n, "flatten.shape", [1, 400])], "flatten")
    x = dense(n, x, "fc0", 120, "relu")
    x = dense(n, x, "fc1", 84, "relu")
    n.output(dense(n, x, "output", 10))
    return n


def mobilenet_block():
    """A MobileNetV2/V3-style network: a strided stem with RELU6, an inverted residual
    (expand, dilated depthwise, HARD_SWISH, squeeze-excite with MEAN/LOGISTIC/MUL, project,
    residual ADD), an explicitly PADded stride-2 depthwise with multiplier 2, AVERAGE_POOL,
    a global MEAN and a SOFTMAX head."""
    n = Net("mobilenet_block", 3)
    x = n.input("input", [1, 32, 32, 3])
    x = conv(n, x, "stem", 16, 3, stride=2, act_="relu6")
    h = conv(n, x, "expand", 48, 1, act_="relu6")
    h = depthwise(n, h, "depthwise", 3, dilation=2)
    h = n.op("HARD_SWISH", [h], "depthwise.hswish")
    s = n.op("MEAN", [h, i32(n, "se.axes", [1, 2])], "se.pool", keep_dims=True)
    s = conv(n, s, "se.reduce", 12, 1, act_="relu")
    s = n.op("LOGISTIC", [conv(n, s, "se.expand", 48, 1)], "se.gate")
    h = n.op("MUL", [h, s], "se.scale")
    h = conv(n, h, "project", 16, 1)
    x = n.op("ADD", [x, h], "residual")
    x = n.op("PAD", [x, i32(n, "down.pads", [[0, 0], [1, 1], [1, 1], [0, 0]])], "down.pad")
    x = depthwise(n, x, "down", 3, stride=2, padding="VALID", act_="relu6", multiplier=2)
    x = n.op("HARD_SWISH", [conv(n, x, "mix", 32, 1)], "mix.hswish")
    x = n.op("AVERAGE_POOL_2D", [x], "pool", filter=2, stride=2, padding="VALID")
    x = n.op("MEAN", [x, i32(n, "head.axes", [1, 2])], "head.pool", keep_dims=False)
    n.output(n.op("SOFTMAX", [dense(n, x, "classifier", 10)], "output", beta=1.0))
    return n


def decoder():
    """A small U-Net-style decoder: a strided encoder conv, two TRANSPOSE_CONV upsamplings
    (3x3 SAME with bias, 2x2 VALID without) summed, RELU, a skip CONCATENATION,
    RESIZE_BILINEAR (half-pixel centres), TANH, a conv, RESIZE_NEAREST_NEIGHBOR."""
    # TANH sits before the last conv, not at the end: its int8 output grid (1/128) is
    # finer than its input's, so a step of difference before it would be several after.
    n = Net("decoder", 4)
    inp = n.input("input", [1, 16, 16, 8])
    e = conv(n, inp, "encode", 16, 3, stride=2, act_="relu")
    oshape = i32(n, "up.shape", [1, 16, 16, 8])
    w1 = n.weight("up1.weight", [8, 3, 3, 16], 9 * 16)
    u1 = n.op("TRANSPOSE_CONV", [oshape, w1, e, n.bias("up1.bias", 8)], "up1", stride=2, padding="SAME")
    w2 = n.weight("up2.weight", [8, 2, 2, 16], 4 * 16)
    u2 = n.op("TRANSPOSE_CONV", [oshape, w2, e], "up2", stride=2, padding="VALID")
    u = n.op("RELU", [n.op("ADD", [u1, u2], "up.sum")], "up.relu")
    c = n.op("CONCATENATION", [u, inp], "skip", axis=3)
    c = n.op("RESIZE_BILINEAR", [c, i32(n, "resize1.size", [32, 32])], "resize1", half_pixel_centers=True)
    c = conv(n, n.op("TANH", [c], "tanh"), "head", 4, 3)
    n.output(n.op("RESIZE_NEAREST_NEIGHBOR", [c, i32(n, "resize2.size", [64, 64])], "output"))
    return n


def encoder():
    """A one-layer transformer encoder over 16 int32 token ids: GATHER from an embedding
    table, a position ADD, FULLY_CONNECTED (keep_num_dims) projections, RESHAPE/TRANSPOSE
    into 4 heads, BATCH_MATMUL (adj_y) scores, a MUL by 1/sqrt(d), SOFTMAX, BATCH_MATMUL,
    a fused-ReLU feed-forward, residual ADDs, a MEAN over positions and a classifier."""
    n = Net("encoder", 5)
    vocab, seq, hid, heads = 64, 16, 32, 4
    dh = hid // heads
    ids = n.input("input_ids", [1, seq], "int32", range=[0, vocab])
    emb = n.const("embedding", n.rng.standard_normal([vocab, hid]) * math.sqrt(0.5))
    x = n.op("GATHER", [emb, ids], "embed", axis=0)
    x = n.op("ADD", [x, n.const("position", n.rng.standard_normal([1, seq, hid]) * math.sqrt(0.5))], "embed.pos")
    split = i32(n, "heads.shape", [1, seq, heads, dh])
    perm = i32(n, "heads.perm", [0, 2, 1, 3])

    def heads_of(t, name):
        return n.op("TRANSPOSE", [n.op("RESHAPE", [t, split], f"{name}.split"), perm], f"{name}.heads")

    q = heads_of(dense(n, x, "query", hid, keep=True), "query")
    k = heads_of(dense(n, x, "key", hid, keep=True), "key")
    v = heads_of(dense(n, x, "value", hid, keep=True), "value")
    s = n.op("BATCH_MATMUL", [q, k], "scores", adj_y=True)
    s = n.op("MUL", [s, n.const("scores.scale", [1.0 / math.sqrt(dh)])], "scores.scaled")
    p = n.op("SOFTMAX", [s], "probs", beta=1.0)
    c = n.op("BATCH_MATMUL", [p, v], "context")
    c = n.op("TRANSPOSE", [c, perm], "context.t")
    c = n.op("RESHAPE", [c, i32(n, "merge.shape", [1, seq, hid])], "context.merge")
    x = n.op("ADD", [x, dense(n, c, "attn_out", hid, keep=True)], "attn.residual")
    f = dense(n, dense(n, x, "ffn_in", 2 * hid, "relu", keep=True), "ffn_out", hid, keep=True)
    x = n.op("ADD", [x, f], "ffn.residual")
    x = n.op("MEAN", [x, i32(n, "pool.axes", [1])], "pool", keep_dims=False)
    n.output(dense(n, x, "output", 4))
    return n


def shapes():
    """The data-movement ops: SPLIT, SPLIT_V, UNPACK, PACK, GATHER on the channel axis, SUB,
    PADV2, STRIDED_SLICE (strides and masks), SLICE, SUM, SQUEEZE, EXPAND_DIMS, REDUCE_MAX,
    DIV by a constant, MEAN; three outputs."""
    n = Net("shapes", 6)
    x = n.input("input", [1, 8, 8, 6])
    a, b = n.op("SPLIT", [i32(n, "split.axis", 3), x], "split", nout=2, num=2)
    c1, c2, c3 = n.op("SPLIT_V", [x, i32(n, "splitv.sizes", [1, 2, 3]), i32(n, "splitv.axis", 3)], "splitv",
                      nout=3, num=3)
    d = n.op("SUB", [a, b], "diff")
    u = n.op("UNPACK", [c3], "unpack", nout=3, num=3, axis=3)
    p = n.op("PACK", [u[0], u[2], u[1]], "pack", axis=3, count=3)
    g = n.op("GATHER", [x, i32(n, "gather.index", [5, 0, 3])], "gather", axis=3)
    y = n.op("ADD", [n.op("MUL", [d, p], "mul"), g], "sum")
    y = n.op("PADV2", [y, i32(n, "pad.pads", [[0, 0], [1, 2], [2, 1], [0, 0]]), n.const("pad.value", 0.5)], "pad")
    y = n.op("STRIDED_SLICE", [y, i32(n, "ss.begin", [0, 1, 0, 0]), i32(n, "ss.end", [1, 11, 11, 3]),
                               i32(n, "ss.strides", [1, 2, 2, 1])], "strided", begin_mask=0b0001, end_mask=0b1000)
    y = n.op("SLICE", [y, i32(n, "slice.begin", [0, 0, 1, 0]), i32(n, "slice.size", [1, 4, 4, 3])], "slice")
    y = n.op("SUM", [y, i32(n, "sum.axes", [3])], "channel_sum", keep_dims=True)
    y = n.op("SQUEEZE", [y], "squeeze", dims=[0, 3])
    n.output(n.op("EXPAND_DIMS", [y, i32(n, "expand.axis", 0)], "output"))
    n.output(n.op("REDUCE_MAX", [c2, i32(n, "max.axes", [1, 2])], "output_max", keep_dims=False))
    q = n.op("DIV", [c1, n.const("div.by", [2.5])], "div")
    n.output(n.op("MEAN", [q, i32(n, "mean.axes", [1, 2])], "output_mean", keep_dims=False))
    return n


def activations():
    """Every activation op on one input, concatenated: RELU, RELU6, RELU_N1_TO_1,
    LEAKY_RELU, PRELU (per-channel alpha), HARD_SWISH, LOGISTIC, TANH, and a SUB with fused
    RELU_N1_TO_1."""
    n = Net("activations", 7)
    x = n.input("input", [1, 4, 16], normal=3.0)
    outs = [
        n.op("RELU", [x], "relu"),
        n.op("RELU6", [x], "relu6"),
        n.op("RELU_N1_TO_1", [x], "relu_n1_to_1"),
        n.op("LEAKY_RELU", [x], "leaky_relu", alpha=0.2),
        n.op("PRELU", [x, n.const("prelu.alpha", n.rng.uniform(0.05, 0.5, [1, 1, 16]))], "prelu"),
        n.op("HARD_SWISH", [x], "hard_swish"),
        n.op("LOGISTIC", [x], "logistic"),
        n.op("TANH", [x], "tanh"),
        n.op("SUB", [x, n.const("shift", n.rng.standard_normal([16]))], "sub_clamped", act="relu_n1_to_1"),
    ]
    n.output(n.op("CONCATENATION", outs, "output", axis=2))
    return n


def fc():
    """One FULLY_CONNECTED, 64 -> 48 over 16 rows: the single-op model the requantisation
    reference is checked on (crates/kiln-ref/tests/tflite_requant.rs)."""
    n = Net("fc", 8)
    n.output(dense(n, n.input("input", [16, 64]), "output", 48))
    return n


def conv1():
    """One CONV_2D, 3x3 SAME, 16 -> 32 channels on 16x16, and one 3x3 VALID stride-2 beside
    it: the single-op models of the requantisation reference."""
    n = Net("conv1", 9)
    x = n.input("input", [1, 16, 16, 16])
    n.output(conv(n, x, "output", 32, 3))
    n.output(conv(n, x, "output_s2", 8, 3, stride=2, padding="VALID"))
    return n


# gen_models.py's MobileNetV2 stages: expansion t, output channels c, repeats n, stride s.
MOBILENET_V2_STAGES = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]


def mobilenet_v2():
    """gen_models.py's mobilenet_v2 (width 1.0, 224x224, batch norm folded) in NHWC, as the
    converter writes it: CONV_2D and DEPTHWISE_CONV_2D with fused RELU6, residual ADDs, a
    global MEAN and a 1000-way FULLY_CONNECTED. The benchmark's model of realistic size."""
    n = Net("mobilenet_v2", 10)
    x = conv(n, n.input("input", [1, 224, 224, 3]), "stem", 32, 3, stride=2, act_="relu6")
    cin, block = 32, 0
    for t, c, reps, s in MOBILENET_V2_STAGES:
        for i in range(reps):
            stride = s if i == 0 else 1
            name = f"block{block}"
            h = conv(n, x, f"{name}.expand", cin * t, 1, act_="relu6") if t != 1 else x
            h = depthwise(n, h, f"{name}.depthwise", 3, stride=stride, act_="relu6")
            h = conv(n, h, f"{name}.project", c, 1)
            if stride == 1 and cin == c:
                h = n.op("ADD", [x, h], f"{name}.residual")
            x, cin = h, c
            block += 1
    x = conv(n, x, "head", 1280, 1, act_="relu6")
    x = n.op("MEAN", [x, i32(n, "pool.axes", [1, 2])], "pool", keep_dims=False)
    n.output(dense(n, x, "output", 1000))
    return n


ARCHS = {"mlp": mlp, "lenet": lenet, "mobilenet_block": mobilenet_block, "decoder": decoder,
         "encoder": encoder, "shapes": shapes, "activations": activations, "fc": fc, "conv1": conv1,
         "mobilenet_v2": mobilenet_v2}
VARIANTS = ["f32", "f16", "int8"]
INT8IO = ["lenet", "mobilenet_block", "fc", "conv1"]
# Written only when named with --only: the benchmark's models of realistic size
# (scripts/bench-tflite makes them into .cache/tflite/bench; not in the test set, whose
# int8 bound of one step a 50-layer int8 network cannot be held to: LiteRT's own XNNPACK
# and reference kernels land up to 7 steps from its builtin kernels on mobilenet_v2_int8).
ON_REQUEST = {"mobilenet_v2"}
# --check's int8 bound where CHECK_STEPS is too tight: mobilenet_v2_int8 measured 7 steps
# from the simulation (and from the float network), as far as LiteRT's kernels from each other.
CHECK_STEPS_OF = {"mobilenet_v2": 8}


def model_names(on_request=False):
    archs = [a for a in ARCHS if (a in ON_REQUEST) == on_request]
    names = [f"{a}_{v}" for a in archs for v in VARIANTS]
    return names + [f"{a}_int8io" for a in INT8IO if a in archs]


# --- quantisation ----------------------------------------------------------------------


def act_params(lo, hi):
    """TFLite's asymmetric int8 parameters of the range [lo, hi] (widened to hold 0)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo < 1e-8:
        hi = lo + 1e-8
    scale = (hi - lo) / 255.0
    zp = int(np.clip(round(-128 - lo / scale), -128, 127))
    return float(np.float32(scale)), zp


def quantize(v, scale, zp, lo=-128, hi=127):
    return np.clip(np.round(v / scale) + zp, lo, hi)


def per_channel(w, axis):
    """Symmetric per-channel int8: (int8 values, scales)."""
    red = tuple(d for d in range(w.ndim) if d != axis)
    m = np.max(np.abs(w), axis=red)
    s = np.where(m > 0, m / 127.0, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / s.reshape(shape)), -127, 127).astype(np.int8)
    return q, s


class Quant:
    """The int8 plan of a network: each float tensor's (scale, zero point), from a
    calibration pass; weights' per-channel scales; biases' int32 values."""

    def __init__(self, net: Net):
        rng = np.random.default_rng(1000 + sum(map(ord, net.name)))
        lo, hi = {}, {}
        for _ in range(CAL_SAMPLES):
            feeds = {t: feed_value(dt, sh, fd, rng) for t, dt, sh, fd in net.inputs}
            for t, v in net.run(feeds).items():
                if t in net.consts or v.dtype.kind != "f":
                    continue
                lo[t] = min(lo.get(t, np.inf), float(v.min()))
                hi[t] = max(hi.get(t, -np.inf), float(v.max()))
        self.params = {}
        for t, *_ in net.inputs:
            if t in lo:
                self.params[t] = act_params(lo[t], hi[t])
        self.weights = {}  # tensor -> (int8 values, scales, axis)
        self.biases = {}  # tensor -> int32 values
        producers = {}
        for op, ins, outs, attrs in net.ops:
            for o in outs:
                producers[o] = op
            for k, i in enumerate(ins):
                if i in net.consts and net.consts[i].dtype == np.float32 and i not in self.params:
                    if op in WEIGHTS and WEIGHTS[op][0] == k:
                        q, s = per_channel(net.consts[i], WEIGHTS[op][1])
                        self.weights[i] = (q, s, WEIGHTS[op][1])
                    elif op in WEIGHTS and k == len(ins) - 1 and k >= 2:
                        continue  # a bias: below, once its input's scale is known
                    elif op == "PADV2" and k == 2:
                        self.params[i] = self.params[ins[0]]  # the pad value on its input's grid
                    elif op not in FLOAT_ONLY:
                        c = net.consts[i]
                        self.params[i] = act_params(c.min(), c.max())
            if op in FLOAT_ONLY:
                for o in outs:
                    self.params[o] = act_params(lo[o], hi[o])
                continue
            for o in outs:
                if op in SAME_SCALE:
                    self.params[o] = self.params[ins[1] if op == "SPLIT" else ins[0]]
                elif op in FIXED_SCALE:
                    self.params[o] = FIXED_SCALE[op]
                elif op in TIED_INPUTS and len({self.params[i] for i in ins}) == 1:
                    self.params[o] = self.params[ins[0]]  # no requantisation needed
                elif net.probe[o].dtype.kind == "f":
                    self.params[o] = act_params(lo[o], hi[o])
            if op in WEIGHTS and len(ins) >= 3 and not (op == "TRANSPOSE_CONV" and len(ins) == 3):
                b = ins[-1]
                x = ins[2] if op == "TRANSPOSE_CONV" else ins[0]
                s = self.params[x][0] * self.weights[ins[1]][1].astype(np.float64)
                self.biases[b] = np.round(net.consts[b] / s).astype(np.int32)

    def fake(self, net: Net):
        """The int8 network simulated in float64: constants dequantised, every activation
        rounded to its grid; returns a `hook` for `Net.run` and the constants to use."""
        consts = {}
        for t, v in net.consts.items():
            if t in self.weights:
                q, s, axis = self.weights[t]
                shape = [1] * q.ndim
                shape[axis] = -1
                consts[t] = q.astype(np.float64) * s.reshape(shape)
            elif t in self.biases:
                consts[t] = None  # filled per op below: scale depends on its input
            elif t in self.params:
                s, z = self.params[t]
                consts[t] = (quantize(v, s, z) - z) * s
        for op, ins, outs, attrs in net.ops:
            if op in WEIGHTS and ins[-1] in self.biases:
                x = ins[2] if op == "TRANSPOSE_CONV" else ins[0]
                consts[ins[-1]] = self.biases[ins[-1]] * (self.params[x][0] * self.weights[ins[1]][1].astype(np.float64))

        def hook(op, t, v):
            if t in self.params:
                s, z = self.params[t]
                return (quantize(v, s, z) - z) * s
            return v

        return hook, consts


# --- writing the flatbuffer -------------------------------------------------------------


class Writer:
    """Emits one subgraph: tensors (with buffers and quantisation), operator codes and
    operators, then the Model table with a SignatureDef."""

    def __init__(self):
        self.b = flatbuffers.Builder(1 << 16)
        self.tensors = []  # dicts
        self.names = set()
        self.buffers = [b""]
        self.codes = []  # (op, version)
        self.operators = []  # (code index, inputs, outputs, options type, options builder fn)

    def tensor(self, name, shape, ttype, data=None, quant=None):
        if name in self.names:
            raise ValueError(f"duplicate tensor {name}")
        self.names.add(name)
        buf = 0
        if data is not None:
            self.buffers.append(np.ascontiguousarray(data).tobytes())
            buf = len(self.buffers) - 1
        self.tensors.append(dict(name=name, shape=list(shape), type=ttype, buffer=buf, quant=quant))
        return len(self.tensors) - 1

    def rename(self, t, name):
        self.names.discard(self.tensors[t]["name"])
        if name in self.names:
            raise ValueError(f"duplicate tensor {name}")
        self.names.add(name)
        self.tensors[t]["name"] = name

    def op(self, op, inputs, outputs, attrs, version=1):
        key = (op, version)
        if key not in self.codes:
            self.codes.append(key)
        self.operators.append((self.codes.index(key), inputs, outputs, op, attrs))

    # flatbuffer helpers
    def _i32s(self, xs):
        return self.b.CreateNumpyVector(np.asarray(xs, dtype=np.int32))

    def _offsets(self, start, offs):
        start(self.b, len(offs))
        for o in reversed(offs):
            self.b.PrependUOffsetTRelative(o)
        return self.b.EndVector()

    def _bytes(self, data):
        # Buffer data aligned to 16 bytes, as the converter writes it.
        b = self.b
        b.StartVector(1, len(data), 16)
        b.head = b.head - len(data)
        b.Bytes[b.head:b.head + len(data)] = data
        return b.EndVector()

    def _options(self, op, a):
        name = OPTIONS[op]
        if name is None:
            return 0, 0
        b = self.b
        T = lambda field: getattr(tflite, f"{name}Add{field}")
        fused = getattr(tflite.ActivationFunctionType, ACT[a.get("act")])
        pad = lambda: getattr(tflite.Padding, a["padding"])
        vec = self._i32s(a["dims"]) if op == "SQUEEZE" else None
        getattr(tflite, f"{name}Start")(b)
        if op in ("ADD", "SUB", "MUL", "DIV", "CONCATENATION"):
            T("FusedActivationFunction")(b, fused)
            if op == "CONCATENATION":
                T("Axis")(b, a["axis"])
        elif op in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            T("Padding")(b, pad())
            T("StrideW")(b, a["stride"])
            T("StrideH")(b, a["stride"])
            T("FusedActivationFunction")(b, fused)
            T("DilationWFactor")(b, a.get("dilation", 1))
            T("DilationHFactor")(b, a.get("dilation", 1))
            if op == "DEPTHWISE_CONV_2D":
                T("DepthMultiplier")(b, a.get("multiplier", 1))
        elif op == "TRANSPOSE_CONV":
            T("Padding")(b, pad())
            T("StrideW")(b, a["stride"])
            T("StrideH")(b, a["stride"])
            T("FusedActivationFunction")(b, fused)
        elif op == "FULLY_CONNECTED":
            T("FusedActivationFunction")(b, fused)
            T("KeepNumDims")(b, bool(a.get("keep_num_dims")))
        elif op == "BATCH_MATMUL":
            T("AdjX")(b, bool(a.get("adj_x")))
            T("AdjY")(b, bool(a.get("adj_y")))
        elif name == "Pool2DOptions":
            T("Padding")(b, pad())
            T("StrideW")(b, a["stride"])
            T("StrideH")(b, a["stride"])
            T("FilterWidth")(b, a["filter"])
            T("FilterHeight")(b, a["filter"])
            T("FusedActivationFunction")(b, fused)
        elif name == "ReducerOptions":
            T("KeepDims")(b, bool(a.get("keep_dims")))
        elif op == "SQUEEZE":
            T("SqueezeDims")(b, vec)
        elif op in ("SPLIT", "SPLIT_V"):
            T("NumSplits")(b, a["num"])
        elif op == "PACK":
            T("ValuesCount")(b, a["count"])
            T("Axis")(b, a["axis"])
        elif op == "UNPACK":
            T("Num")(b, a["num"])
            T("Axis")(b, a["axis"])
        elif op == "STRIDED_SLICE":
            T("BeginMask")(b, a.get("begin_mask", 0))
            T("EndMask")(b, a.get("end_mask", 0))
        elif op == "GATHER":
            T("Axis")(b, a.get("axis", 0))
        elif op in ("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"):
            T("AlignCorners")(b, bool(a.get("align_corners")))
            T("HalfPixelCenters")(b, bool(a.get("half_pixel_centers")))
        elif op == "SOFTMAX":
            T("Beta")(b, a.get("beta", 1.0))
        elif op == "LEAKY_RELU":
            T("Alpha")(b, a["alpha"])
        return getattr(tflite.BuiltinOptions, name), getattr(tflite, f"{name}End")(b)

    def _quant(self, q):
        b = self.b
        scale = b.CreateNumpyVector(np.asarray(q["scale"], dtype=np.float32))
        zp = b.CreateNumpyVector(np.asarray(q["zero_point"], dtype=np.int64))
        tflite.QuantizationParametersStart(b)
        tflite.QuantizationParametersAddScale(b, scale)
        tflite.QuantizationParametersAddZeroPoint(b, zp)
        tflite.QuantizationParametersAddQuantizedDimension(b, q.get("axis", 0))
        return tflite.QuantizationParametersEnd(b)

    def finish(self, graph_name, inputs, outputs, description) -> bytes:
        b = self.b
        ts = []
        for t in self.tensors:
            name = b.CreateString(t["name"])
            shape = self._i32s(t["shape"])
            q = self._quant(t["quant"]) if t["quant"] else None
            tflite.TensorStart(b)
            tflite.TensorAddShape(b, shape)
            tflite.TensorAddType(b, t["type"])
            tflite.TensorAddBuffer(b, t["buffer"])
            tflite.TensorAddName(b, name)
            if q is not None:
                tflite.TensorAddQuantization(b, q)
            ts.append(tflite.TensorEnd(b))
        ops = []
        for code, ins, outs, op, attrs in self.operators:
            iv, ov = self._i32s(ins), self._i32s(outs)
            otype, opts = self._options(op, attrs)
            tflite.OperatorStart(b)
            tflite.OperatorAddOpcodeIndex(b, code)
            tflite.OperatorAddInputs(b, iv)
            tflite.OperatorAddOutputs(b, ov)
            if otype:
                tflite.OperatorAddBuiltinOptionsType(b, otype)
                tflite.OperatorAddBuiltinOptions(b, opts)
            ops.append(tflite.OperatorEnd(b))
        tv = self._offsets(tflite.SubGraphStartTensorsVector, ts)
        ov = self._offsets(tflite.SubGraphStartOperatorsVector, ops)
        iv, outv = self._i32s(inputs), self._i32s(outputs)
        gname = b.CreateString(graph_name)
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, tv)
        tflite.SubGraphAddInputs(b, iv)
        tflite.SubGraphAddOutputs(b, outv)
        tflite.SubGraphAddOperators(b, ov)
        tflite.SubGraphAddName(b, gname)
        sg = tflite.SubGraphEnd(b)
        codes = []
        for op, version in self.codes:
            code = getattr(tflite.BuiltinOperator, op)
            tflite.OperatorCodeStart(b)
            tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
            tflite.OperatorCodeAddBuiltinCode(b, code)
            tflite.OperatorCodeAddVersion(b, version)
            codes.append(tflite.OperatorCodeEnd(b))
        bufs = []
        for data in self.buffers:
            d = self._bytes(data) if data else None
            tflite.BufferStart(b)
            if d is not None:
                tflite.BufferAddData(b, d)
            bufs.append(tflite.BufferEnd(b))

        def tensor_maps(idx):
            maps = []
            for i in idx:
                n = b.CreateString(self.tensors[i]["name"])
                tflite.TensorMapStart(b)
                tflite.TensorMapAddName(b, n)
                tflite.TensorMapAddTensorIndex(b, i)
                maps.append(tflite.TensorMapEnd(b))
            return maps

        sin = self._offsets(tflite.SignatureDefStartInputsVector, tensor_maps(inputs))
        sout = self._offsets(tflite.SignatureDefStartOutputsVector, tensor_maps(outputs))
        key = b.CreateString("serving_default")
        tflite.SignatureDefStart(b)
        tflite.SignatureDefAddInputs(b, sin)
        tflite.SignatureDefAddOutputs(b, sout)
        tflite.SignatureDefAddSignatureKey(b, key)
        tflite.SignatureDefAddSubgraphIndex(b, 0)
        sig = tflite.SignatureDefEnd(b)
        sgv = self._offsets(tflite.ModelStartSubgraphsVector, [sg])
        cv = self._offsets(tflite.ModelStartOperatorCodesVector, codes)
        bv = self._offsets(tflite.ModelStartBuffersVector, bufs)
        sv = self._offsets(tflite.ModelStartSignatureDefsVector, [sig])
        desc = b.CreateString(description)
        tflite.ModelStart(b)
        tflite.ModelAddVersion(b, 3)
        tflite.ModelAddOperatorCodes(b, cv)
        tflite.ModelAddSubgraphs(b, sgv)
        tflite.ModelAddDescription(b, desc)
        tflite.ModelAddBuffers(b, bv)
        tflite.ModelAddSignatureDefs(b, sv)
        b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())


TT = tflite.TensorType


def emit(net: Net, variant: str, quant: Quant = None) -> tuple:
    """The model's bytes, and its sidecar description (inputs, outputs, ops)."""
    w = Writer()
    ids = {}  # net tensor -> written tensor holding its value in the variant's type
    int8 = variant.startswith("int8")
    used = set()
    fused = set()

    def qp(t):
        s, z = quant.params[t]
        return {"scale": [s], "zero_point": [z]}

    def op(name, ins, outs, attrs, version=1):
        used.add(name)
        w.op(name, ins, outs, attrs, version)

    def const(t, name=None):
        """The written tensor of constant `t` (created on first use)."""
        if t in ids:
            return ids[t]
        name = name or net.tensors[t]
        v = net.consts[t]
        if v.dtype != np.float32:
            ids[t] = w.tensor(name, v.shape, TT.INT32, v.astype(np.int32))
        elif variant == "f16":
            h = w.tensor(f"{name}.fp16", v.shape, TT.FLOAT16, v.astype(np.float16))
            ids[t] = w.tensor(name, v.shape, TT.FLOAT32)
            op("DEQUANTIZE", [h], [ids[t]], {})
        elif variant == "f32" or t not in quant.params and t not in quant.weights and t not in quant.biases:
            ids[t] = w.tensor(name, v.shape, TT.FLOAT32, v)
        elif t in quant.weights:
            q, s, axis = quant.weights[t]
            ids[t] = w.tensor(name, v.shape, TT.INT8, q,
                              {"scale": list(s), "zero_point": [0] * len(s), "axis": axis})
        elif t in quant.biases:
            ids[t] = None  # written by the op that uses it
        else:
            s, z = quant.params[t]
            ids[t] = w.tensor(name, v.shape, TT.INT8, quantize(v, s, z).astype(np.int8), qp(t))
        return ids[t]

    float_of = {}  # int8 tensor -> its float (dequantised) copy, for FLOAT_ONLY ops

    def as_float(t):
        if t in net.consts:
            if t not in float_of:
                float_of[t] = w.tensor(net.tensors[t] + ".f32", net.consts[t].shape, TT.FLOAT32, net.consts[t])
            return float_of[t]
        if t not in float_of:
            float_of[t] = w.tensor(net.tensors[t] + ".dequantized", net.shape(t), TT.FLOAT32)
            op("DEQUANTIZE", [ids[t]], [float_of[t]], {})
        return float_of[t]

    sig_in, sig_out = [], []
    inputs_desc = []
    for t, dtype, shape, feed in net.inputs:
        name = net.tensors[t]
        if dtype == "int32":
            ids[t] = w.tensor(name, shape, TT.INT32)
            sig_in.append(ids[t])
        elif variant == "int8io":
            ids[t] = w.tensor(name, shape, TT.INT8, quant=qp(t))
            sig_in.append(ids[t])
        elif int8:
            f = w.tensor(name, shape, TT.FLOAT32)
            sig_in.append(f)
            ids[t] = w.tensor(name + ".quantized", shape, TT.INT8, quant=qp(t))
            op("QUANTIZE", [f], [ids[t]], {})
        else:
            ids[t] = w.tensor(name, shape, TT.FLOAT32)
            sig_in.append(ids[t])
        d = {"name": name, "dtype": "int32" if dtype == "int32" else ("int8" if variant == "int8io" else "float32"),
             "shape": shape, **feed}
        if variant == "int8io" and dtype != "int32":
            d["quant"] = {"scale": quant.params[t][0], "zero_point": quant.params[t][1]}
        inputs_desc.append(d)

    out_names = {t: net.tensors[t] for t in net.outputs}
    for opname, ins, outs, attrs in net.ops:
        if attrs.get("act"):
            fused.add(ACT[attrs["act"]])
        if not int8 or opname in FLOAT_ONLY:
            ins_w = [const(i) if i in net.consts else ids[i] for i in ins] if not int8 else [as_float(i) for i in ins]
            outs_w = []
            for o in outs:
                if int8:
                    f = w.tensor(net.tensors[o] + ".float", net.shape(o), TT.FLOAT32)
                    ids[o] = w.tensor(net.tensors[o], net.shape(o), TT.INT8, quant=qp(o))
                    outs_w.append(f)
                else:
                    ids[o] = w.tensor(out_names.get(o, net.tensors[o]), net.shape(o), TT.FLOAT32)
                    outs_w.append(ids[o])
            op(opname, ins_w, outs_w, attrs)
            if int8:
                for o, f in zip(outs, outs_w):
                    op("QUANTIZE", [f], [ids[o]], {})
            continue
        # int8
        ins_w = []
        for k, i in enumerate(ins):
            if i in quant.biases:
                x = ins[2] if opname == "TRANSPOSE_CONV" else ins[0]
                s = quant.params[x][0] * quant.weights[ins[1]][1].astype(np.float64)
                ins_w.append(w.tensor(f"{net.tensors[i]}.{len(w.tensors)}", net.consts[i].shape, TT.INT32,
                                      quant.biases[i], {"scale": list(s.astype(np.float32)),
                                                        "zero_point": [0] * len(s), "axis": 0}))
            elif i in net.consts:
                ins_w.append(const(i))
            elif opname in TIED_INPUTS and quant.params[i] != quant.params[outs[0]]:
                r = w.tensor(f"{net.tensors[i]}.requantized.{len(w.tensors)}", net.shape(i), TT.INT8,
                             quant=qp(outs[0]))
                op("QUANTIZE", [ids[i]], [r], {}, 2)
                ins_w.append(r)
            else:
                ins_w.append(ids[i])
        outs_w = []
        for o in outs:
            ids[o] = w.tensor(net.tensors[o], net.shape(o), TT.INT8, quant=qp(o))
            outs_w.append(ids[o])
        op(opname, ins_w, outs_w, attrs, INT8_VERSION.get(opname, 1))

    outputs_desc = []
    for t in net.outputs:
        name = net.tensors[t]
        if int8 and variant != "int8io":
            # The quantised value under a name of its own; the output is its DEQUANTIZE.
            q = ids[t]
            w.rename(q, name + ".quantized")
            ids[t] = w.tensor(name, net.shape(t), TT.FLOAT32)
            op("DEQUANTIZE", [q], [ids[t]], {})
        sig_out.append(ids[t])
        d = {"name": name, "dtype": "int8" if variant == "int8io" else "float32", "shape": net.shape(t)}
        if int8:
            d["quant"] = {"scale": quant.params[t][0], "zero_point": quant.params[t][1]}
        outputs_desc.append(d)

    desc = f"{net.name} ({variant}): {(ARCHS[net.name].__doc__ or '').split(chr(10))[0].strip()}"
    data = w.finish(net.name, sig_in, sig_out, f"kiln scripts/gen_tflite.py: {desc}")
    side = {"generator": GENERATOR_VERSION, "architecture": net.name, "variant": variant,
            "description": " ".join((ARCHS[net.name].__doc__ or "").split()),
            "ops": sorted(used), "fused": sorted(fused), "inputs": inputs_desc, "outputs": outputs_desc}
    return data, side


def build(name: str):
    arch, variant = name.rsplit("_", 1)
    net = ARCHS[arch]()
    quant = Quant(net) if variant.startswith("int8") else None
    data, side = emit(net, variant, quant)
    again = ARCHS[arch]()
    if emit(again, variant, Quant(again) if quant else None)[0] != data:
        sys.exit(f"{name}: two builds differ; generation is not deterministic")
    return net, quant, data, side


def write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.read_bytes() == data:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


# --- --check ---------------------------------------------------------------------------


# The kernels the reference outputs come from: TFLite's builtin kernels (the fixed-point
# arithmetic of its reference kernels, optimised) without the default XNNPACK delegate,
# whose int8 requantisation is its own. scripts/tflite_reference.py uses the same.
REFERENCE_RESOLVER = "BUILTIN_WITHOUT_DEFAULT_DELEGATES"


def litert_run(data: bytes, feeds: dict, resolver=REFERENCE_RESOLVER, threads=1):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    it = Interpreter(model_content=data, num_threads=threads,
                     experimental_op_resolver_type=getattr(OpResolverType, resolver))
    run = it.get_signature_runner("serving_default")
    return run(**feeds)


def check(name, net, quant, data, side) -> list:
    """Problems found with model NAME (an empty list when it is sound)."""
    problems = []
    rng = np.random.default_rng(7)
    feeds_f, feeds_l = {}, {}
    for (t, dtype, shape, feed), d in zip(net.inputs, side["inputs"]):
        v = feed_value(dtype, shape, feed, rng)
        if quant is not None and d["dtype"] == "float32":
            # The model's QUANTIZE of its input, simulated.
            s, z = quant.params[t]
            feeds_l[d["name"]] = v
            feeds_f[t] = (quantize(v, s, z) - z) * s
        elif d["dtype"] == "int8":
            q = d["quant"]
            qi = quantize(v, q["scale"], q["zero_point"])
            feeds_l[d["name"]] = qi.astype(np.int8)
            feeds_f[t] = (qi - q["zero_point"]) * q["scale"]
        else:
            feeds_l[d["name"]] = v
            feeds_f[t] = v.astype(np.float64) if v.dtype.kind == "f" else v
    try:
        ref = litert_run(data, feeds_l)
        xnn = litert_run(data, feeds_l, "AUTO")
        spec = litert_run(data, feeds_l, "BUILTIN_REF")
    except Exception as e:  # noqa: BLE001: any failure of LiteRT is what is reported
        return [f"LiteRT does not run it: {e}"]
    if side["variant"] == "f16":
        for t, v in net.consts.items():
            if v.dtype == np.float32:
                net.consts[t] = v.astype(np.float16).astype(np.float32)
    if quant is None:
        want = net.run(feeds_f)
    else:
        hook, consts = quant.fake(net)
        saved = dict(net.consts)
        net.consts.update({t: v for t, v in consts.items() if v is not None})
        want = net.run(feeds_f, hook)
        net.consts.clear()
        net.consts.update(saved)
        exact = net.run(feeds_f)
    for t, d in zip(net.outputs, side["outputs"]):
        got = ref[d["name"]]
        if list(got.shape) != d["shape"]:
            problems.append(f"{d['name']}: shape {list(got.shape)}, expected {d['shape']}")
            continue
        if quant is None:
            w = want[t]
            tol = FLOAT_ATOL * np.abs(w).max() + FLOAT_RTOL * np.abs(w)
            bad = np.abs(got - w) > tol
            worst = float(np.max(np.abs(got - w) / np.maximum(tol, 1e-30)))
            x = np.abs(xnn[d["name"]] - got).max()
            r = np.abs(spec[d["name"]] - got).max()
            print(f"  {name}/{d['name']}: LiteRT vs numpy {worst:.3f} x tolerance; vs LiteRT's XNNPACK max |diff| "
                  f"{x:.2e}, vs its reference kernels {r:.2e}", file=sys.stderr)
            if bad.any():
                problems.append(f"{d['name']}: LiteRT differs from numpy by {worst:.2f}x the tolerance")
            continue
        s, z = d["quant"]["scale"], d["quant"]["zero_point"]
        qgot = got.astype(np.float64) if d["dtype"] == "int8" else np.round(got / s) + z
        steps_of = lambda v: v.astype(np.float64) if d["dtype"] == "int8" else np.round(v / s) + z
        qx, qr = steps_of(xnn[d["name"]]), steps_of(spec[d["name"]])
        qwant = quantize(want[t], s, z)
        steps = np.abs(qgot - qwant)
        fsteps = np.abs((qgot - z) * s - exact[t]) / s
        print(f"  {name}/{d['name']}: LiteRT vs numpy int8 simulation max {int(steps.max())} steps "
              f"({int((steps == 1).sum())} of {steps.size} off by 1, {int((steps > 1).sum())} by more); "
              f"vs the float network max {fsteps.max():.1f} steps; vs LiteRT's XNNPACK max "
              f"{int(np.abs(qx - qgot).max())} steps ({int((qx != qgot).sum())} differ), vs its reference kernels "
              f"max {int(np.abs(qr - qgot).max())} ({int((qr != qgot).sum())} differ)", file=sys.stderr)
        bound = CHECK_STEPS_OF.get(net.name, CHECK_STEPS)
        if steps.max() > bound:
            problems.append(f"{d['name']}: LiteRT's int8 output is {int(steps.max())} steps from the simulation "
                            f"(bound {bound})")
    return problems


def trace(name, net, quant, data, side, inputs_dir=None) -> None:
    """Prints, per int8 tensor in op order, how many steps LiteRT's builtin kernels are from
    the numpy int8 simulation (the op where a difference starts, and how it grows), on the
    reference inputs of INPUTS_DIR (CACHE/ref/tflite/NAME) or --check's."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    rng = np.random.default_rng(7)
    feeds_l, feeds_f = {}, {}
    for k, ((t, dtype, shape, feed), d) in enumerate(zip(net.inputs, side["inputs"])):
        v = np.load(inputs_dir / f"in_{k}.npy") if inputs_dir else feed_value(dtype, shape, feed, rng)
        feeds_l[d["name"]] = v
        if t in quant.params:
            s, z = quant.params[t]
            q = v.astype(np.float64) if v.dtype == np.int8 else quantize(v, s, z)
            feeds_f[t] = (q - z) * s
        else:
            feeds_f[t] = v
    hook, consts = quant.fake(net)
    net.consts.update({t: v for t, v in consts.items() if v is not None})
    want = net.run(feeds_f, hook)
    it = Interpreter(model_content=data, experimental_preserve_all_tensors=True,
                     experimental_op_resolver_type=getattr(OpResolverType, REFERENCE_RESOLVER))
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], feeds_l[d["name"]])
    it.invoke()
    by = {d["name"]: d for d in it.get_tensor_details()}
    for op, ins, outs, attrs in net.ops:
        for o in outs:
            d = by.get(net.tensors[o] + ".quantized") or by.get(net.tensors[o])
            if d is None or d["dtype"] != np.int8:
                continue
            s, z = quant.params[o]
            steps = np.abs(it.get_tensor(d["index"]).astype(np.float64) - quantize(want[o], s, z))
            print(f"{name}: {op:24s} {net.tensors[o]:22s} max {int(steps.max())} steps, "
                  f"{int((steps == 1).sum())} of {steps.size} one step, {int((steps > 1).sum())} more")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--only", action="append", default=[], help="model name(s), comma separated")
    ap.add_argument("--check", action="store_true", help="run every model in LiteRT and compare with numpy")
    ap.add_argument("--trace", type=Path, metavar="CACHE", nargs="?", const=False,
                    help="int8 models: per tensor, LiteRT against the numpy simulation (on CACHE/ref/tflite/NAME's "
                         "inputs when CACHE is given)")
    args = ap.parse_args()
    known = model_names() + model_names(on_request=True)
    names = [n for arg in args.only for n in arg.split(",") if n] or model_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        net, quant, data, side = build(name)
        changed = write_if_changed(args.out / f"{name}.tflite", data)
        write_if_changed(args.out / f"{name}.json", (json.dumps(side, indent=1) + "\n").encode())
        print(f"{args.out / name}.tflite: {len(data)} bytes{'' if changed else ' (unchanged)'}; "
              f"ops {' '.join(side['ops'])}", file=sys.stderr)
        if args.trace is not None and quant is not None:
            trace(name, net, quant, data, side, args.trace / "ref" / "tflite" / name if args.trace else None)
        if args.check:
            for p in check(name, net, quant, data, side):
                failed.append(f"{name}: {p}")
    if failed:
        sys.exit("check failed:\n  " + "\n  ".join(failed))
    if args.check:
        print(f"check: {len(names)} models load and run in LiteRT and match the numpy evaluation", file=sys.stderr)


if __name__ == "__main__":
    main()
