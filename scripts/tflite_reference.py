#!/usr/bin/env python3
"""Computes LiteRT's outputs for kiln's TFLite test models, the oracle kiln's TFLite front
end is checked against (crates/kiln-cli/tests/tflite.rs).

    tflite_reference.py --cache .cache [--force]

For each CACHE/tflite/synthetic/NAME.tflite (scripts/gen_tflite.py writes them, with a
NAME.json beside each): picks deterministic inputs (numpy default_rng seeded from the
model name; see `make_inputs`), runs LiteRT's interpreter (ai_edge_litert) on one thread
with TFLite's builtin kernels and no delegate (`REFERENCE_RESOLVER`: the fixed-point
arithmetic of TFLite's reference kernels; the default XNNPACK delegate requantises in its
own way), and writes

    CACHE/ref/tflite/NAME/in_K.npy, out_K.npy    (subgraph input / output order)
    CACHE/ref/tflite/NAME/entry.json             (the entry below, with a stamp)
    CACHE/ref/tflite/manifest.json               (every model's entry)

An entry gives the model's path (relative to CACHE), its architecture, variant and the
TFLite ops it holds (`ops`, `fused`), and per input and output the tensor name, the
SignatureDef name, dtype, shape, file, and for a quantised value its `quant` (scale, zero
point): an int8 tensor's own, or for a float output made by a DEQUANTIZE, the int8 input
of that DEQUANTIZE (one step of that output is then `scale`), and `litert_spread`: how
many steps LiteRT's XNNPACK delegate and its reference kernels land from this reference
at most (how far two of LiteRT's own kernel sets disagree). `rtol`/`atol` are the
float tolerance (as in ref/manifest.json); `kind` is `float` or `int8`.

A model is skipped when its results are newer than the model file, its NAME.json and this
script and were made by the same ai-edge-litert and numpy versions.

Inputs (make_inputs; NAME.json's `inputs` give each one's distribution): float32 standard
normal times `normal`; int32 uniform in `range` [lo, hi); int8 the quantised normal (with
the input tensor's scale and zero point). Without a NAME.json (any .tflite, as
scripts/bench-tflite uses it): floats standard normal, int8 quantised standard normal,
integers zeros. Needs the .venv of scripts/setup-test-data.
"""

import json
import sys
import zlib
from pathlib import Path

import numpy as np

import refio
from refio import save_npy, write_json

try:
    import ai_edge_litert
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
except ImportError:  # pragma: no cover
    sys.exit("ai_edge_litert is missing: run scripts/setup-test-data (it installs scripts/requirements.txt)")

REFERENCE_RESOLVER = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
# The tolerance of float outputs (|kiln - LiteRT| <= atol * max|LiteRT| + rtol * |LiteRT|),
# the one ref/manifest.json gives the ONNX models; int8 outputs are compared in steps.
RTOL, ATOL = 1e-4, 1e-5


def litert_version() -> str:
    return getattr(ai_edge_litert, "__version__", None) or _dist_version("ai-edge-litert")


def _dist_version(name: str) -> str:
    from importlib.metadata import version
    return version(name)


def interpreter(model: Path, resolver=REFERENCE_RESOLVER, threads: int = 1) -> Interpreter:
    it = Interpreter(model_path=str(model), num_threads=threads, experimental_op_resolver_type=resolver)
    it.allocate_tensors()
    return it


def signature_names(it: Interpreter):
    """{tensor index: SignatureDef name} of the first signature's inputs and outputs."""
    names = {}
    for key in it.get_signature_list():
        runner = it.get_signature_runner(key)
        for n, d in {**runner.get_input_details(), **runner.get_output_details()}.items():
            names.setdefault(d["index"], n)
        break
    return names


def quant_of(d: dict):
    """A tensor detail's per-tensor (scale, zero point), or None when not quantised."""
    q = d.get("quantization_parameters") or {}
    scales, zps = q.get("scales", []), q.get("zero_points", [])
    if len(scales) == 1:
        return {"scale": float(scales[0]), "zero_point": int(zps[0])}
    return None


def output_quant(it: Interpreter, index: int):
    """The quantisation that sets output `index`'s step: its own, or, for a float output a
    DEQUANTIZE makes, that DEQUANTIZE's input's."""
    details = {d["index"]: d for d in it.get_tensor_details()}
    own = quant_of(details[index])
    if own is not None and details[index]["dtype"] != np.float32:
        return own
    for op in it._get_ops_details():  # noqa: SLF001: LiteRT's one way to see the graph
        if index in list(op["outputs"]) and op["op_name"] == "DEQUANTIZE":
            src = details[int(op["inputs"][0])]
            if src["dtype"] in (np.int8, np.uint8, np.int16):
                return quant_of(src)
    return None


def make_inputs(name: str, it: Interpreter, spec: dict = None):
    """Deterministic inputs of model NAME, in subgraph input order: [(detail, array)]."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    by_name = {i["name"]: i for i in (spec or {}).get("inputs", [])}
    out = []
    for d in it.get_input_details():
        shape, dt = [int(x) for x in d["shape"]], np.dtype(d["dtype"])
        s = by_name.get(d["name"], {})
        if "range" in s:
            a = rng.integers(s["range"][0], s["range"][1], size=shape).astype(dt)
        elif dt.kind == "f":
            a = (rng.standard_normal(shape) * s.get("normal", 1.0)).astype(dt)
        elif dt in (np.int8, np.uint8, np.int16) and quant_of(d):
            q = quant_of(d)
            info = np.iinfo(dt)
            v = rng.standard_normal(shape) * s.get("normal", 1.0)
            a = np.clip(np.round(v / q["scale"]) + q["zero_point"], info.min, info.max).astype(dt)
        else:
            a = np.zeros(shape, dtype=dt)
        out.append((d, a))
    return out


def run(it: Interpreter, inputs):
    for d, a in inputs:
        it.set_tensor(d["index"], a)
    it.invoke()
    return [(d, it.get_tensor(d["index"]).copy()) for d in it.get_output_details()]


def reference(cache: Path, model: Path) -> dict:
    name = model.stem
    spec_path = model.with_suffix(".json")
    spec = json.loads(spec_path.read_text()) if spec_path.is_file() else {}
    it = interpreter(model)
    sig = signature_names(it)
    out_dir = cache / "ref" / "tflite" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = make_inputs(name, it, spec)
    outputs = run(it, inputs)

    def describe(kind, k, d, a, quant):
        rel = f"ref/tflite/{name}/{kind}_{k}.npy"
        save_npy(cache / rel, a)
        e = {"name": d["name"], "signature_name": sig.get(d["index"], d["name"]), "file": rel,
             "dtype": str(a.dtype), "shape": list(a.shape)}
        if quant is not None:
            e["quant"] = quant
        return e

    ins = [describe("in", k, d, a, quant_of(d) if a.dtype.kind != "f" else None) for k, (d, a) in enumerate(inputs)]
    outs = [describe("out", k, d, a, output_quant(it, d["index"])) for k, (d, a) in enumerate(outputs)]
    # How far LiteRT's other kernels land from this reference, per quantised output, in
    # steps: its XNNPACK delegate (the default) and its reference kernels. The test
    # prints it beside kiln's distance.
    others = {"xnnpack": run(interpreter(model, OpResolverType.AUTO), inputs),
              "reference_kernels": run(interpreter(model, OpResolverType.BUILTIN_REF), inputs)}
    for k, o in enumerate(outs):
        if "quant" not in o:
            continue
        want = outputs[k][1].astype(np.float64)
        unit = o["quant"]["scale"] if outputs[k][1].dtype.kind == "f" else 1.0
        o["litert_spread"] = {n: float(np.round(np.abs(r[k][1].astype(np.float64) - want).max() / unit))
                              for n, r in others.items()}
    return {
        "name": name,
        "model": model.relative_to(cache).as_posix(),
        "architecture": spec.get("architecture"),
        "variant": spec.get("variant"),
        "description": spec.get("description"),
        "ops": spec.get("ops", sorted({op["op_name"] for op in it._get_ops_details()})),  # noqa: SLF001
        "fused": spec.get("fused", []),
        "size_bytes": model.stat().st_size,
        "kind": "int8" if any("quant" in o for o in outs) else "float",
        "inputs": ins,
        "outputs": outs,
        "rtol": RTOL,
        "atol": ATOL,
    }


def cached_entry(cache: Path, model: Path):
    stamp = cache / "ref" / "tflite" / model.stem / "entry.json"
    versions = {"ai_edge_litert": litert_version(), "numpy": np.__version__}
    return refio.cached_entry(cache, stamp, versions, [model, model.with_suffix(".json"), Path(__file__)], model)


def main() -> None:
    args = refio.command_line(__doc__, force=True)
    cache = args.cache
    models = sorted((cache / "tflite" / "synthetic").glob("*.tflite"))
    if not models:
        sys.exit(f"no models in {cache / 'tflite' / 'synthetic'}; run scripts/gen_tflite.py --out that folder")
    entries = []
    for model in models:
        e = None if args.force else cached_entry(cache, model)
        if e is None:
            print(f"running {model.stem} with ai-edge-litert {litert_version()}", file=sys.stderr)
            e = reference(cache, model)
            stamp = {"ai_edge_litert": litert_version(), "numpy": np.__version__, "entry": e}
            write_json(cache / "ref" / "tflite" / model.stem / "entry.json", stamp, end="")
        entries.append(e)
    manifest = {"generator": {"ai_edge_litert": litert_version(), "numpy": np.__version__,
                              "resolver": REFERENCE_RESOLVER.name}, "models": entries}
    out = cache / "ref" / "tflite" / "manifest.json"
    write_json(out, manifest)
    print(f"{out}: {len(entries)} models", file=sys.stderr)


if __name__ == "__main__":
    main()
