#!/usr/bin/env python3
"""Which int8 op semantics make a TFLite model land within one step of LiteRT's builtin
kernels (issue 23; docs/tflite-testing.md, "Where the int8 steps come from").

    tflite_int8_semantics.py --cache .cache [--per-op] [--fixed] MODEL ...

MODEL is a synthetic int8 model of scripts/gen_tflite.py (decoder_int8, encoder_int8, ...),
whose LiteRT reference (CACHE/ref/tflite/MODEL) scripts/tflite_reference.py wrote.

--per-op: runs LiteRT with every tensor kept, then per op, from LiteRT's own int8 inputs,
computes the op's float semantics requantised with round-half-to-even (what kiln's QDQ
form computes: dequantise, float op, quantise) and, for the ops where TFLite's int8
kernels compute otherwise, TFLite's integer form: fixed-point requantisation (TFLite's
QuantizeMultiplier, SaturatingRoundingDoublingHighMul, RoundingDivideByPOT: double
rounding) of the integer accumulator for CONV_2D, TRANSPOSE_CONV, FULLY_CONNECTED and
BATCH_MATMUL, MEAN as Σ(x − z_in) times the fixed-point multiplier s_in / (s_out · N),
RESIZE_BILINEAR with 10-bit fixed-point weights, ADD/SUB with the inputs shifted left 20
bits and rescaled to twice the larger scale. Prints, per op, how many elements each form
is away from LiteRT.

Default: the whole network simulated in int8 from the reference inputs (every activation
on its grid; float semantics per op, or with --fixed the integer forms above), its output
compared with LiteRT's reference output in steps.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_tflite as g  # noqa: E402


def high_mul(x, m):
    """SaturatingRoundingDoublingHighMul of int64 lanes by a positive int32 `m` (the
    saturating case, both operands −2³¹, cannot occur with m > 0)."""
    return (x * m + (1 << 30)) >> 31


def divide_by_pot(x, e):
    """RoundingDivideByPOT: x / 2^e rounded half away from zero."""
    if e <= 0:
        return x
    return (x + (1 << (e - 1)) + (x >> 63)) >> e


def quantize_multiplier(real):
    """TFLite's QuantizeMultiplier: (q in [2³⁰, 2³¹), exponent) with real = q·2^(e−31)."""
    if real == 0:
        return 0, 0
    m, e = np.frexp(real)
    q = int(round(m * (1 << 31)))
    if q == (1 << 31):
        q //= 2
        e += 1
    return q, int(e)


def multiply(x, real):
    """MultiplyByQuantizedMultiplier (double rounding) of int64 lanes."""
    q, e = quantize_multiplier(real)
    return divide_by_pot(high_mul(x * (1 << max(e, 0)), q), max(-e, 0))


def resize_bilinear(x, oh, ow, align, half):
    """TFLite's integer RESIZE_BILINEAR of raw NHWC integers (10-bit fixed-point weights)."""
    n, ih, iw, c = x.shape
    x = x.astype(np.int64)

    def scale10(i, o):
        if align and o > 1:
            return ((1 << 10) * (i - 1) + (o - 1) // 2) // (o - 1)
        return ((1 << 10) * i + o // 2) // o

    def at(v, s, size):
        sv = v * s + s // 2 - (1 << 9) if half else v * s
        return sv, max(int(np.trunc(sv / (1 << 10))), 0), min(int(np.trunc((sv + (1 << 10) - 1) / (1 << 10))), size - 1)

    out = np.zeros((n, oh, ow, c), np.int64)
    hs, ws = scale10(ih, oh), scale10(iw, ow)
    for y in range(oh):
        iy, y0, y1 = at(y, hs, ih)
        for xx in range(ow):
            ix, x0, x1 = at(xx, ws, iw)
            dy, dx = iy - (1 << 10) * y0, ix - (1 << 10) * x0
            o = (x[:, y0, x0] * ((1 << 10) - dy) * ((1 << 10) - dx) + x[:, y1, x0] * dy * ((1 << 10) - dx)
                 + x[:, y0, x1] * ((1 << 10) - dy) * dx + x[:, y1, x1] * dy * dx)
            out[:, y, xx] = np.trunc((o + np.where(o > 0, 1 << 19, -(1 << 19))) / (1 << 20)).astype(np.int64)
    return out


def clamp_act(y, act, zo, so):
    lo, hi = -128, 127
    if act in ("relu", "relu6"):
        lo = max(lo, zo)
    if act == "relu6":
        hi = min(hi, zo + int(round(6 / so)))
    return np.clip(y, lo, hi)


def integer_op(net, quant, op, ins, outs, attrs, q):
    """The op's int8 output by TFLite's integer form from int8 inputs `q(t)` (raw
    integers), or None where float semantics are TFLite's."""
    if op in ("CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED") and ins[1] in quant.weights:
        xi = 2 if op == "TRANSPOSE_CONV" else 0
        sx, zx = quant.params[ins[xi]]
        wq, ws, _ = quant.weights[ins[1]]
        args = [net.consts.get(i) for i in ins]
        args[xi] = (q(ins[xi]) - zx).astype(np.float64)
        args[1] = wq.astype(np.float64)
        bi = len(ins) - 1
        if bi not in (1, xi) and ins[bi] in quant.biases:
            args[bi] = quant.biases[ins[bi]].astype(np.float64)
        a2 = {k: v for k, v in attrs.items() if k != "act"}
        acc = np.round(g.evaluate(op, args, a2)[0]).astype(np.int64)  # exact integers in f64
        so, zo = quant.params[outs[0]]
        ws = np.broadcast_to(np.asarray(ws, np.float64), (acc.shape[-1],))
        y = np.stack([multiply(acc[..., c], float(np.float64(sx) * ws[c] / np.float64(so)))
                      for c in range(acc.shape[-1])], axis=-1)
        return clamp_act(y + zo, attrs.get("act"), zo, so)
    if op == "BATCH_MATMUL" and ins[0] in quant.params:
        (sa, za), (sb, zb) = quant.params[ins[0]], quant.params[ins[1]]
        so, zo = quant.params[outs[0]]
        a, b = q(ins[0]) - za, q(ins[1]) - zb
        if attrs.get("adj_x"):
            a = np.swapaxes(a, -1, -2)
        if attrs.get("adj_y"):
            b = np.swapaxes(b, -1, -2)
        return np.clip(multiply(a @ b, float(np.float64(sa) * np.float64(sb) / np.float64(so))) + zo, -128, 127)
    if op == "MEAN" and ins[0] in quant.params:
        (si, zi), (so, zo) = quant.params[ins[0]], quant.params[outs[0]]
        axes = tuple(int(a) for a in np.atleast_1d(net.consts[ins[1]]))
        x = q(ins[0]) - zi
        n = int(np.prod([x.shape[a] for a in axes]))
        s = x.sum(axis=axes, keepdims=attrs.get("keep_dims", False))
        return np.clip(multiply(s, si / (so * n)) + zo, -128, 127)
    if op == "RESIZE_BILINEAR" and ins[0] in quant.params:
        oh, ow = [int(v) for v in net.consts[ins[1]]]
        return resize_bilinear(q(ins[0]), oh, ow, attrs.get("align_corners", False), attrs.get("half_pixel_centers", False))
    if op in ("ADD", "SUB") and all(i in quant.params for i in ins):
        (s1, z1), (s2, z2) = quant.params[ins[0]], quant.params[ins[1]]
        so, zo = quant.params[outs[0]]
        twice = 2 * max(s1, s2)
        a = multiply((q(ins[0]) - z1) * (1 << 20), s1 / twice)
        b = multiply((q(ins[1]) - z2) * (1 << 20), s2 / twice)
        y = multiply(a + b if op == "ADD" else a - b, twice / ((1 << 20) * so)) + zo
        return clamp_act(y, attrs.get("act"), zo, so)
    return None


def reference(name, cache):
    net, quant, data, side = g.build(name)
    d = cache / "ref" / "tflite" / name
    ins = [np.load(d / f"in_{k}.npy") for k in range(len(net.inputs))]
    outs = [np.load(d / f"out_{k}.npy") for k in range(len(net.outputs))]
    return net, quant, data, side, ins, outs


def per_op(name, cache):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    net, quant, data, side, ins, _ = reference(name, cache)
    it = Interpreter(model_content=data, experimental_preserve_all_tensors=True,
                     experimental_op_resolver_type=getattr(OpResolverType, g.REFERENCE_RESOLVER))
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), ins):
        it.set_tensor(d["index"], v)
    it.invoke()
    by = {d["name"]: d for d in it.get_tensor_details()}

    def lit(t):
        d = by.get(net.tensors[t] + ".quantized") or by.get(net.tensors[t])
        return d, (it.get_tensor(d["index"]) if d is not None else None)

    hook, consts = quant.fake(net)
    cv = dict(net.consts)
    cv.update({t: v for t, v in consts.items() if v is not None})
    for op, op_ins, op_outs, attrs in net.ops:
        xs = []
        for i in op_ins:
            if i in cv:
                xs.append(cv[i])
                continue
            d, v = lit(i)
            if d is None:
                break
            if d["dtype"] == np.int8:
                s, z = quant.params[i]
                xs.append((v.astype(np.float64) - z) * s)
            else:
                xs.append(v.astype(np.float64) if v.dtype.kind == "f" else v)
        else:
            res = g.evaluate(op, xs, attrs)
            for o, r in zip(op_outs, res):
                d, v = lit(o)
                if d is None or d["dtype"] != np.int8 or o not in quant.params:
                    continue
                s, z = quant.params[o]
                diff = np.abs(g.quantize(r, s, z) - v)
                line = (f"{name}: {op:24s} {net.tensors[o]:20s} float semantics: {int((diff > 0).sum())} of "
                        f"{diff.size} differ (max {int(diff.max())})")
                y = integer_op(net, quant, op, op_ins, op_outs, attrs, lambda t: lit(t)[1].astype(np.int64))
                if y is not None:
                    dd = np.abs(y - v.astype(np.int64))
                    line += f"; integer form: {int((dd > 0).sum())} differ (max {int(dd.max())})"
                print(line)


def chain(name, cache, fixed):
    net, quant, data, side, ins, outs = reference(name, cache)
    hook, consts = quant.fake(net)
    vals = {t: (v.astype(np.float64) if v.dtype.kind == "f" else v) for t, v in net.consts.items()}
    vals.update({t: v for t, v in consts.items() if v is not None})
    for (t, *_), v in zip(net.inputs, ins):
        if t in quant.params:
            s, z = quant.params[t]
            qv = v.astype(np.float64) if v.dtype == np.int8 else g.quantize(v, s, z)
            vals[t] = (qv - z) * s
        else:
            vals[t] = v

    def q(t):
        s, z = quant.params[t]
        return (np.round(vals[t] / s) + z).astype(np.int64)

    for op, op_ins, op_outs, attrs in net.ops:
        y = integer_op(net, quant, op, op_ins, op_outs, attrs, q) if fixed else None
        if y is not None:
            s, z = quant.params[op_outs[0]]
            vals[op_outs[0]] = (y - z) * s
            continue
        for o, v in zip(op_outs, g.evaluate(op, [vals[i] for i in op_ins], attrs)):
            vals[o] = hook(op, o, v)
    for t, d, r in zip(net.outputs, side["outputs"], outs):
        s, z = d["quant"]["scale"], d["quant"]["zero_point"]
        mine = g.quantize(vals[t], s, z)
        theirs = r.astype(np.float64) if d["dtype"] == "int8" else np.round(r / s) + z
        dd = np.abs(mine - theirs)
        print(f"{name}/{d['name']}: {'integer forms' if fixed else 'float semantics'}: max {int(dd.max())} steps "
              f"from LiteRT, {int((dd == 1).sum())} of {dd.size} one step, {int((dd > 1).sum())} more")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--per-op", action="store_true")
    ap.add_argument("--fixed", action="store_true")
    ap.add_argument("models", nargs="+")
    args = ap.parse_args()
    for name in args.models:
        if args.per_op:
            per_op(name, args.cache)
        else:
            chain(name, args.cache, args.fixed)


if __name__ == "__main__":
    main()
