#!/usr/bin/env python3
"""Odd-shape models of the ops kiln imports as compositions of canonical ops (DFT, STFT,
MelWeightMatrix, MaxUnpool, training-mode BatchNormalization, Adagrad/Adam/Momentum,
Binarizer, ArrayFeatureExtractor, TreeEnsemble, TfIdfVectorizer, com.microsoft's
DynamicQuantizeLSTM), with expected outputs from an independent source.

    ref_decomposed_ops.py --cache .cache

Writes CACHE/decomposed/NAME.onnx, CACHE/decomposed/NAME.in_K.npy / NAME.out_K.npy and
CACHE/decomposed/manifest.json (per model: file, inputs, outputs, and `source`: which
engine made the outputs). The outputs come from ONNX Runtime (CPU, graph optimisations
off) where it runs the op, else from ONNX's reference evaluator (the training ops, which
ONNX Runtime's inference build lacks; MaxUnpool, whose `output_shape` ONNX Runtime
reads differently from ONNX's reference and node tests; the complex STFT, where ONNX
Runtime returns uninitialised values). Float
operands are graph inputs (run-time data); integer operands (axes, lengths, steps,
shapes) are initializers, as kiln needs them at compile time.
`crates/kiln-cli/tests/decomposed_ops.rs` reads the manifest.
"""

import argparse
import sys
import json
from pathlib import Path

import numpy as np
import onnx

# Before onnxruntime loads: its int8 products stay exact on AMX machines (see the module).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ort_exact_int8 import deny_amx, unsaturated  # noqa: E402

deny_amx()
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from refio import cache_arg, ort_session, save_arrays, write_json

RNG = np.random.default_rng(24)


def vi(name, a):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))


def model(name, node, feeds, consts, out_names, opsets):
    inputs = [vi(k, v) for k, v in feeds.items()]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in out_names]
    g = helper.make_graph([node], name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], producer_name="kiln-decomposed")
    m.ir_version = 8 if all(v < 21 for d, v in opsets if d == "") else 10
    return m


def typed(m, feeds):
    """`m` with its outputs typed from a run of ONNX's reference evaluator."""
    try:
        got = ReferenceEvaluator(m).run(None, feeds)
    except Exception:
        # ONNX's reference cannot run it (TfIdfVectorizer with per-n-gram weights, as the
        # spec has them): the results are float, of any shape.
        del m.graph.output[:]
        for o in m.graph.node[0].output:
            m.graph.output.append(helper.make_tensor_value_info(o, TensorProto.FLOAT, None))
        return m
    del m.graph.output[:]
    wide = any(np.asarray(v).dtype == np.float64 for v in feeds.values())
    for o, v in zip(m.graph.node[0].output, got):
        v = np.asarray(v)
        # The reference's optimisers promote to f64 through Python floats; the ops'
        # results have their inputs' type.
        if v.dtype == np.float64 and not wide:
            v = v.astype(np.float32)
        m.graph.output.append(vi(o, v))
    return m


def run(m, feeds, reference_only=False):
    if reference_only:
        return ReferenceEvaluator(m).run(None, feeds), "onnx-reference"
    try:
        # int8 weights as uint8 ones (the same products) keep ONNX Runtime's sums exact
        # on CPUs without VNNI (ort_exact_int8.unsaturated).
        exact = unsaturated(onnx.ModelProto.FromString(m.SerializeToString()))
        return ort_session((exact or m).SerializeToString()).run(None, feeds), "onnxruntime"
    except Exception:
        return ReferenceEvaluator(m).run(None, feeds), "onnx-reference"


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def cases():
    out = []
    # DFT (opset 20: axis is an input; opset 17: an attribute).
    out.append(("dft_real_pad_onesided", helper.make_node("DFT", ["x", "len", "axis"], ["y"], onesided=1),
                {"x": f32(2, 7, 3, 1)}, {"len": np.array(9, np.int64), "axis": np.array(1, np.int64)}, ["y"], [("", 20)]))
    out.append(("dft_complex_inverse", helper.make_node("DFT", ["x", "", "axis"], ["y"], inverse=1),
                {"x": f32(3, 5, 2)}, {"axis": np.array(-2, np.int64)}, ["y"], [("", 20)]))
    out.append(("dft_truncate_axis2", helper.make_node("DFT", ["x", "len", "axis"], ["y"]),
                {"x": f32(2, 6, 5, 2)}, {"len": np.array(4, np.int64), "axis": np.array(2, np.int64)}, ["y"], [("", 20)]))
    out.append(("dft_opset17_attr", helper.make_node("DFT", ["x"], ["y"], axis=2),
                {"x": f32(1, 3, 11, 1)}, {}, ["y"], [("", 17)]))
    # STFT with a run-time window, and a complex signal without one.
    hann = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 8)).astype(np.float32)
    out.append(("stft_window", helper.make_node("STFT", ["s", "step", "w"], ["y"]),
                {"s": f32(2, 37, 1), "w": hann}, {"step": np.array(5, np.int64)}, ["y"], [("", 17)]))
    out.append(("stft_complex_two_sided", helper.make_node("STFT", ["s", "step", "", "len"], ["y"], onesided=0),
                {"s": f32(1, 30, 2)}, {"step": np.array(4, np.int64), "len": np.array(6, np.int64)}, ["y"], [("", 17)]))
    # MelWeightMatrix with run-time band edges.
    out.append(("mel_weight_matrix", helper.make_node("MelWeightMatrix", ["m", "n", "sr", "lo", "hi"], ["y"]),
                {"lo": np.array(100.0, np.float32), "hi": np.array(7000.0, np.float32)},
                {"m": np.array(5, np.int64), "n": np.array(20, np.int64), "sr": np.array(16000, np.int64)}, ["y"], [("", 17)]))
    # MaxUnpool of a real MaxPool's indices (3-D, padded output shape; 2-D with pads).
    for name, xshape, k, st, pads, target in [
        ("maxunpool_3d_output_shape", (1, 2, 4, 6, 4), [2, 2, 2], [2, 2, 2], None, [1, 2, 5, 7, 5]),
        ("maxunpool_2d_pads", (2, 3, 7, 6), [3, 2], [2, 2], [1, 0, 1, 0], None),
    ]:
        x = f32(*xshape)
        kw = {"kernel_shape": k, "strides": st}
        if pads:
            kw["pads"] = pads
        pool = helper.make_node("MaxPool", ["x"], ["p", "i"], **kw)
        pm = typed(model("pool", pool, {"x": x}, {}, ["p", "i"], [("", 17)]), {"x": x})
        (p, i), _ = run(pm, {"x": x})
        ins = ["p", "i"] + (["shape"] if target else [])
        consts = {"i": i}
        if target:
            consts["shape"] = np.array(target, np.int64)
        out.append((name, helper.make_node("MaxUnpool", ins, ["y"], **kw), {"p": p}, consts, ["y"], [("", 17)]))
    # Training-mode BatchNormalization (rank 3).
    out.append(("batchnorm_training_rank3",
                helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1,
                                 momentum=0.7, epsilon=1e-3),
                {"x": f32(3, 4, 5), "s": f32(4), "b": f32(4), "m": f32(4), "v": np.abs(f32(4)) + 0.5}, {},
                ["y", "rm", "rv"], [("", 15)]))
    tr = "ai.onnx.preview.training"
    t3 = np.array(3, np.int64)
    out.append(("adagrad_two_tensors",
                helper.make_node("Adagrad", ["r", "t", "x1", "x2", "g1", "g2", "h1", "h2"], ["x1n", "x2n", "h1n", "h2n"],
                                 domain=tr, decay_factor=0.1, epsilon=1e-5, norm_coefficient=0.01),
                {"r": np.array(0.1, np.float32), "x1": f32(3, 5), "x2": f32(7), "g1": f32(3, 5), "g2": f32(7),
                 "h1": np.abs(f32(3, 5)), "h2": np.abs(f32(7))}, {"t": t3}, ["x1n", "x2n", "h1n", "h2n"], [(tr, 1)]))
    out.append(("adam_bias_correction",
                helper.make_node("Adam", ["r", "t", "x", "g", "v", "h"], ["xn", "vn", "hn"], domain=tr, alpha=0.9,
                                 beta=0.99, epsilon=1e-4, norm_coefficient=0.02, norm_coefficient_post=0.05),
                {"r": np.array(0.05, np.float32), "x": f32(2, 3, 3), "g": f32(2, 3, 3), "v": f32(2, 3, 3),
                 "h": np.abs(f32(2, 3, 3))}, {"t": t3}, ["xn", "vn", "hn"], [(tr, 1)]))
    for mode in ["standard", "nesterov"]:
        out.append((f"momentum_{mode}",
                    helper.make_node("Momentum", ["r", "t", "x", "g", "v"], ["xn", "vn"], domain=tr, alpha=0.8, beta=0.3,
                                     mode=mode, norm_coefficient=0.01),
                    {"r": np.array(0.2, np.float32), "x": f32(5, 3), "g": f32(5, 3), "v": f32(5, 3)}, {"t": t3},
                    ["xn", "vn"], [(tr, 1)]))
    ml = "ai.onnx.ml"
    out.append(("binarizer", helper.make_node("Binarizer", ["x"], ["y"], domain=ml, threshold=0.25),
                {"x": f32(3, 7, 2)}, {}, ["y"], [(ml, 1)]))
    out.append(("array_feature_extractor_3d", helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain=ml),
                {"x": f32(2, 3, 7)}, {"i": np.array([6, 0, 3, 3], np.int64)}, ["y"], [(ml, 1)]))
    out.append(("array_feature_extractor_1d", helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain=ml),
                {"x": f32(9)}, {"i": np.array([2, 8], np.int64)}, ["y"], [(ml, 1)]))
    # TreeEnsemble: two trees (LEQ, GT, NEQ, GTE; LT with NaN tracking true), each
    # aggregate but SUM (the node suite has SUM).
    x = f32(6, 3)
    x[1, 2] = np.nan
    x[2, 2] = 0.0
    x[3, 1] = 1.0
    tens = lambda n, t, v: helper.make_tensor(n, t, [len(v)], v)
    for agg, agg_name in [(0, "average"), (2, "min"), (3, "max")]:
        node = helper.make_node(
            "TreeEnsemble", ["x"], ["y"], domain=ml, aggregate_function=agg, n_targets=2, post_transform=0,
            nodes_featureids=[1, 0, 2, 1, 2], nodes_modes=tens("nodes_modes", TensorProto.UINT8, [0, 3, 5, 2, 1]),
            nodes_splits=tens("nodes_splits", TensorProto.FLOAT, [0.2, -0.5, 0.0, 1.0, 0.3]),
            nodes_truenodeids=[1, 0, 2, 3, 5], nodes_trueleafs=[0, 1, 1, 1, 1],
            nodes_falsenodeids=[2, 1, 3, 4, 6], nodes_falseleafs=[0, 1, 0, 1, 1],
            nodes_missing_value_tracks_true=[0, 0, 0, 0, 1], tree_roots=[0, 4],
            leaf_targetids=[0, 1, 0, 1, 0, 1, 0],
            leaf_weights=tens("leaf_weights", TensorProto.FLOAT, [1.5, -2.0, 0.25, 3.0, -1.0, 0.5, 2.0]))
        out.append((f"tree_ensemble_{agg_name}", node, {"x": x}, {}, ["y"], [(ml, 5)]))
    # TfIdfVectorizer: uni-, bi- and trigrams with skips, every weighting, int64 rows.
    xi = RNG.integers(0, 5, size=(3, 11)).astype(np.int64)
    pool = [1, 3, 4, 0, 1, 3, 2, 4, 1, 1, 0, 3, 1, 4, 2]  # 3 unigrams, 3 bigrams, 2 trigrams
    for mode, w in [("TF", None), ("IDF", [0.5, 2.0, 1.5, 0.25, 3.0, 1.0, 0.75, 2.5]),
                    ("TFIDF", [0.5, 2.0, 1.5, 0.25, 3.0, 1.0, 0.75, 2.5])]:
        kw = dict(max_gram_length=3, min_gram_length=1, max_skip_count=2, mode=mode, ngram_counts=[0, 3, 9],
                  ngram_indexes=[7, 0, 2, 8, 1, 4, 3, 6], pool_int64s=pool)
        if w:
            kw["weights"] = w
        out.append((f"tfidf_{mode.lower()}", helper.make_node("TfIdfVectorizer", ["x"], ["y"], **kw), {"x": xi}, {},
                    ["y"], [("", 17)]))
    # com.microsoft DynamicQuantizeLSTM: int8 weights with per-tensor scales and zero
    # points, forward, no bias or state; uint8 weights with per-gate-column scales,
    # bidirectional, with bias and initial states, every result.
    ms = "com.microsoft"
    for name, dirs, hidden, isz, seq, batch, wtype, per_col, full in [
        ("dynamic_quantize_lstm_int8", 1, 5, 3, 6, 1, np.int8, False, False),
        ("dynamic_quantize_lstm_uint8_bidirectional", 2, 4, 6, 5, 3, np.uint8, True, True),
    ]:
        consts, feeds = {}, {"x": f32(seq, batch, isz)}
        for key, rows in [("w", isz), ("r", hidden)]:
            wf = f32(dirs, rows, 4 * hidden, scale=0.6)
            lo, hi = (-127, 127) if wtype == np.int8 else (0, 255)
            if per_col:
                amax = np.abs(wf).max(axis=1)
                scale = (2 * amax / (hi - lo)).astype(np.float32)
                zp = np.full(scale.shape, (lo + hi + 1) // 2, wtype)
                q = np.clip(np.round(wf / scale[:, None, :]) + zp[:, None, :].astype(np.int32), lo, hi)
            else:
                scale = (2 * np.abs(wf).reshape(dirs, -1).max(axis=1) / (hi - lo)).astype(np.float32)
                zp = np.array([3 if wtype == np.int8 else 128] * dirs, wtype)
                q = np.clip(np.round(wf / scale[:, None, None]) + zp.astype(np.int32)[:, None, None], lo, hi)
            consts[key], consts[key + "_scale"], consts[key + "_zp"] = q.astype(wtype), scale, zp
        ins = ["x", "w", "r", "b" if full else "", "", "h0" if full else "", "c0" if full else "", "",
               "w_scale", "w_zp", "r_scale", "r_zp"]
        if full:
            feeds.update({"b": f32(dirs, 8 * hidden, scale=0.3), "h0": f32(dirs, batch, hidden, scale=0.5),
                          "c0": f32(dirs, batch, hidden, scale=0.5)})
        outs = ["y", "yh", "yc"] if full else ["y"]
        node = helper.make_node("DynamicQuantizeLSTM", ins, outs, domain=ms, hidden_size=hidden,
                                direction="bidirectional" if dirs == 2 else "forward")
        out.append((name, node, feeds, consts, outs, [("", 17), (ms, 1)]))
    return out


def main():
    cache = cache_arg()
    d = cache / "decomposed"
    d.mkdir(parents=True, exist_ok=True)
    manifest = []
    for name, node, feeds, consts, outs, opsets in cases():
        m = typed(model(name, node, feeds, consts, outs, opsets), feeds)
        # ONNX Runtime scatters MaxUnpool's indices into `output_shape` directly; ONNX's
        # reference and its node tests into the unpadded shape, then pad: follow ONNX.
        # ONNX Runtime 1.x's STFT of a complex signal returns uninitialised values
        # (±1e27); ONNX's reference agrees with NumPy's FFT there.
        got, source = run(m, feeds, reference_only=name.startswith("maxunpool") or name == "stft_complex_two_sided")
        onnx.save(m, d / f"{name}.onnx")
        declared = [helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type) for o in m.graph.output]
        got = [np.asarray(v).astype(d) for v, d in zip(got, declared)]
        ins = save_arrays(cache, f"decomposed/{name}.in", feeds.values())
        outs_files = save_arrays(cache, f"decomposed/{name}.out", got)
        manifest.append({"name": name, "file": f"decomposed/{name}.onnx", "inputs": ins, "outputs": outs_files,
                         "source": source})
        print(f"{name}: {source}")
    write_json(d / "manifest.json", {"models": manifest}, end="")


if __name__ == "__main__":
    main()
