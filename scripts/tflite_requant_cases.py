#!/usr/bin/env python3
"""Writes the data that kiln-ref's TFLite requantisation reference is checked on
(crates/kiln-ref/tests/tflite_requant.rs): single int8 FULLY_CONNECTED and CONV_2D ops run
in LiteRT, with everything needed to recompute them in integers.

    tflite_requant_cases.py --cache .cache

For each op of the single-op models fc_int8io and conv1_int8io (scripts/gen_tflite.py,
int8 input and output, per-channel int8 weights, int32 bias), in
CACHE/ref/tflite-requant/MODEL/OUTPUT/:

    input.npy     int8, the model's input (tflite_reference.py's deterministic one)
    weights.npy   int8, [out, in] (FULLY_CONNECTED) or [out, kh, kw, in] (CONV_2D)
    wscale.npy    float32 [out], the weights' per-channel scales (zero points 0)
    bias.npy      int32 [out]
    params.npy    float64 [kind (0 FULLY_CONNECTED, 1 CONV_2D), input scale, input zero point,
                  output scale, output zero point, stride, SAME padding (1) or VALID (0)];
                  the scales are the model's float32 values, exactly
    builtin.npy   int8, LiteRT's output with its builtin kernels (the test data's reference)
    reference.npy int8, LiteRT's output with its reference kernels (BUILTIN_REF)

Rewritten whenever run (it takes a second); setup-test-data runs it with the others.
"""

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_tflite as gen  # noqa: E402
import tflite_reference as ref  # noqa: E402
from ai_edge_litert.interpreter import Interpreter, OpResolverType  # noqa: E402

MODELS = ["fc_int8io", "conv1_int8io"]


def run(data: bytes, feeds: dict, resolver):
    it = Interpreter(model_content=data, num_threads=1, experimental_op_resolver_type=resolver)
    return it.get_signature_runner("serving_default")(**feeds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path)
    args = ap.parse_args()
    for name in MODELS:
        net, quant, data, side = gen.build(name)
        it = Interpreter(model_content=data)
        it.allocate_tensors()
        inputs = ref.make_inputs(name, it, side)
        feeds = {d["name"]: a for d, a in inputs}
        builtin = run(data, feeds, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        spec = run(data, feeds, OpResolverType.BUILTIN_REF)
        (x_t,) = [t for t, *_ in net.inputs]
        for op, ins, outs, attrs in net.ops:
            (o,) = outs
            oname = net.tensors[o]
            d = args.cache / "ref" / "tflite-requant" / name / oname
            d.mkdir(parents=True, exist_ok=True)
            q, s, _ = quant.weights[ins[1]]
            (xs, xz), (ys, yz) = quant.params[ins[0]], quant.params[o]
            kind = {"FULLY_CONNECTED": 0, "CONV_2D": 1}[op]
            params = [kind, xs, xz, ys, yz, attrs.get("stride", 1), int(attrs.get("padding") == "SAME")]
            arrays = {"input": feeds[net.tensors[x_t]], "weights": q, "wscale": s.astype(np.float32),
                      "bias": quant.biases[ins[2]].astype(np.int32), "params": np.asarray(params, np.float64),
                      "builtin": builtin[oname], "reference": spec[oname]}
            for k, a in arrays.items():
                tmp = d / f"{k}.npy.tmp"
                with open(tmp, "wb") as f:
                    np.save(f, np.ascontiguousarray(a), allow_pickle=False)
                os.replace(tmp, d / f"{k}.npy")
            print(f"{d}: {op}, {builtin[oname].size} outputs", file=sys.stderr)


if __name__ == "__main__":
    main()
