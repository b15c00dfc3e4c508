#!/usr/bin/env python3
"""Computes ONNX Runtime's outputs for every test model, as the oracle kiln is checked against.

    ref_outputs.py --cache .cache

For each CACHE/models/NAME.onnx: picks deterministic inputs (numpy default_rng seeded
from the model name), runs ONNX Runtime on the CPU with graph optimisations disabled
and one thread (so the numbers do not depend on the machine's core count), and writes

    CACHE/ref/NAME/in_K.npy, CACHE/ref/NAME/out_K.npy   (graph input / output order)
    CACHE/ref/manifest.json                              (every model; see docs/testing.md)

and likewise for the ONNX models of the real-model corpus (corpus/models.json, fetched
into CACHE/corpus by setup-test-data), listed in CACHE/ref/corpus.json instead.

A QDQ model listed in INTEGER_REFERENCE is run twice: at ONNX Runtime's default
optimisation level, where its QDQ groups execute as integer ops (`outputs`: the result
kiln's integer form must match), and without graph optimisations, which executes the
graph as written, a float simulation (`float_outputs`: what the reference evaluator
computes on the imported graph). The entry then says `"integer_reference": true`.

A model is skipped when its results are newer than both the model file and this
script and were made by the same onnxruntime version.

Inputs: floats standard normal; `input_ids` uniform in [0, vocab) with vocab read from
the embedding table the ids index; `attention_mask` ones; `token_type_ids` zeros;
anything else is set per model in MODELS below. Free dimensions are bound from
MODELS, or to 1 when a leading (batch) dimension. Needs the .venv of setup-test-data.
"""

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import onnx

# Before onnxruntime loads: its int8 products stay exact on AMX machines (see the module).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ort_exact_int8 import deny_amx, unsaturated  # noqa: E402

deny_amx()
import onnxruntime as ort
from onnx import helper

import refio
from refio import save_npy, write_json

RTOL = 1e-4
ATOL = 1e-5

# Per-model settings: bound shapes of inputs with free dimensions, inputs fixed to a
# value (recorded as `input_values`: the importer may fold them), inputs set to zeros,
# standard deviations of float inputs other than 1 (`scale`).
MODELS = {
    # The v6 silero VAD takes, at 16 kHz, a window of 512 new samples preceded by
    # the last 64 samples of the previous window (its Python wrapper keeps that
    # context), so `input` is [1, 576]; `state` is the LSTM state [2, batch, 128],
    # zeros at the start of a stream; `sr` picks the 16 kHz branch of the model's If.
    "silero_vad": {
        "shapes": {"input": [1, 576], "state": [2, 1, 128]},
        "values": {"sr": 16000},
        "zeros": ["state"],
        # Audio-like amplitude: standard-normal samples would saturate the LSTM
        # state at ±1 and hide errors in the recurrent path.
        "scale": {"input": 0.1},
    },
    # Sentence-embedding model (BERT, 3 layers): a 32-token sequence.
    "minilm_l3": {"shapes": {"input_ids": [1, 32], "attention_mask": [1, 32]}},
}


def np_dtype(elem_type: int):
    return helper.tensor_dtype_to_np_dtype(elem_type)


def graph_inputs(model: onnx.ModelProto):
    """The graph's real inputs: those not also given as initializers (old IR versions list both)."""
    inits = {i.name for i in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def bind_shape(name: str, v, cfg: dict):
    if v.name in cfg.get("shapes", {}):
        return list(cfg["shapes"][v.name])
    dims = []
    for i, d in enumerate(v.type.tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(d.dim_value)
        elif i == 0:
            dims.append(1)
        else:
            sys.exit(f"{name}: input `{v.name}` dimension {i} is free; bind it in MODELS in {__file__}")
    return dims


def vocab_size(model: onnx.ModelProto, input_name: str) -> int:
    """Rows of the initializer that a Gather indexes with INPUT_NAME."""
    inits = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == input_name and n.input[0] in inits:
            return int(inits[n.input[0]].dims[0])
    sys.exit(f"no Gather on an initializer consumes `{input_name}`; cannot tell its vocabulary")


def make_input(name: str, model, v, shape, cfg: dict, rng: np.random.Generator) -> np.ndarray:
    dtype = np_dtype(v.type.tensor_type.elem_type)
    if v.name in cfg.get("values", {}):
        return np.full(shape, cfg["values"][v.name], dtype=dtype)
    if v.name in cfg.get("fill", {}):
        return np.broadcast_to(np.asarray(cfg["fill"][v.name], dtype=dtype), shape).copy()
    if v.name in cfg.get("range", {}):
        lo, hi = cfg["range"][v.name]
        return rng.integers(lo, hi, size=shape).astype(dtype)
    if v.name in cfg.get("zeros", []) or v.name == "token_type_ids":
        return np.zeros(shape, dtype=dtype)
    if v.name == "attention_mask":
        return np.ones(shape, dtype=dtype)
    if v.name == "input_ids":
        return rng.integers(0, vocab_size(model, v.name), size=shape).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        return (rng.standard_normal(shape) * cfg.get("scale", {}).get(v.name, 1.0)).astype(dtype)
    sys.exit(f"{name}: no rule for input `{v.name}` of type {dtype}; add one to MODELS in {__file__}")


# Corpus models whose tolerance differs from the default, and why.
CORPUS_TOLERANCE = {
    # 119 convolutions deep, with 38 bilinear resizes, small sigmoid side outputs: f32
    # rounding alone moves them by more than the default tolerance. Measured: ONNX
    # Runtime with its graph optimisations differs from itself without them by up to
    # 2.9x the default (at side output 1961), the f64 reference evaluator from ONNX
    # Runtime by 1.2x. Four times the default covers that noise, not a kernel error.
    "u2netp-bgremoval": {"rtol": 4e-4, "atol": 4e-5},
}


# QDQ corpus models whose reference is ONNX Runtime's integer execution (default
# optimisation level) rather than the float simulation its disabled optimisations run.
# kiln reproduces which groups ONNX Runtime's CPU execution provider runs on integers
# and their rounding (kiln_ir::QuantSemantics::OnnxRuntimeCpu) for these.
INTEGER_REFERENCE = {"efficientword-resnet50-arc-qint8"}


def corpus_cfg(m: dict) -> dict:
    """The settings of one corpus/models.json entry: its inputs' bind shapes, fills and
    integer ranges, and its tolerance."""
    cfg = {"shapes": {}, "values": {}, "fill": {}, "range": {}, "corpus": True, **CORPUS_TOLERANCE.get(m["name"], {})}
    if m["name"] in INTEGER_REFERENCE:
        cfg["integer"] = True
    for i in m["inputs"]:
        cfg["shapes"][i["name"]] = i["bind_shape"]
        data = i.get("data", {})
        if "value" in data:
            cfg["fill"][i["name"]] = data["value"]
        if "range" in data:
            cfg["range"][i["name"]] = data["range"]
    return cfg


def corpus_models(cache: Path) -> dict:
    """The ONNX models of the real-model corpus (corpus/models.json) present under
    CACHE/corpus, as {name: (path, settings)}: each input's `bind_shape`, and its `data`
    (`value`, broadcast; `range` [lo, hi), uniform integers) where it must hold sensible
    data; other inputs are standard normal."""
    listing = json.loads((Path(__file__).resolve().parent.parent / "corpus" / "models.json").read_text())
    found = {}
    for m in listing["models"]:
        path = cache / "corpus" / m["dest"]
        if m["format"] != "onnx" or not path.is_file():
            continue
        found[m["name"]] = (path, corpus_cfg(m))
    return found


def run_model(cache: Path, path: Path, name: str = None, cfg: dict = None) -> dict:
    name = name or path.stem
    cfg = cfg if cfg is not None else MODELS.get(name, {})
    model = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    out_dir = cache / "ref" / name
    out_dir.mkdir(parents=True, exist_ok=True)

    shapes, feeds, inputs = {}, {}, []
    for k, v in enumerate(graph_inputs(model)):
        shape = bind_shape(name, v, cfg)
        a = make_input(name, model, v, shape, cfg, rng)
        shapes[v.name] = shape
        feeds[v.name] = a
        save_npy(out_dir / f"in_{k}.npy", a)
        inputs.append({"name": v.name, "file": f"ref/{name}/in_{k}.npy"})

    def run(level):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3  # errors only (not "unused initializer" warnings)
        sess = ort.InferenceSession(exact.SerializeToString() if exact else str(path), so, providers=["CPUExecutionProvider"])
        return sess.run(out_names, feeds)

    # Integer products with int8 weights given as uint8 ones (the same values), so that
    # ONNX Runtime's sums are exact on CPUs without VNNI too (ort_exact_int8.unsaturated).
    exact = unsaturated(onnx.load(str(path))) if any(
        n.op_type in ("MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM") for n in model.graph.node) else None

    out_names = [o.name for o in model.graph.output]
    levels = [("out", ort.GraphOptimizationLevel.ORT_DISABLE_ALL)]
    if cfg.get("integer"):
        levels = [("out", ort.GraphOptimizationLevel.ORT_ENABLE_ALL), ("float_out", ort.GraphOptimizationLevel.ORT_DISABLE_ALL)]
    files = {}
    for prefix, level in levels:
        files[prefix] = []
        for k, (oname, a) in enumerate(zip(out_names, run(level))):
            save_npy(out_dir / f"{prefix}_{k}.npy", np.asarray(a))
            files[prefix].append({"name": oname, "file": f"ref/{name}/{prefix}_{k}.npy"})
    outputs = files["out"]

    entry = {
        "name": name,
        "model": path.relative_to(cache).as_posix(),
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        "size_bytes": path.stat().st_size,
        "input_shapes": shapes,
    }
    if cfg.get("values"):
        entry["input_values"] = {n: [v] for n, v in cfg["values"].items()}
    if cfg.get("corpus"):
        entry["corpus"] = True
    entry.update(inputs=inputs, outputs=outputs, rtol=cfg.get("rtol", RTOL), atol=cfg.get("atol", ATOL))
    if cfg.get("integer"):
        entry.update(integer_reference=True, float_outputs=files["float_out"])
    return entry


def cached_entry(cache: Path, path: Path, name: str):
    """The recorded entry of model NAME at PATH if still valid, else None."""
    versions = {"onnxruntime": ort.__version__, "numpy": np.__version__}
    return refio.cached_entry(cache, cache / "ref" / name / "entry.json", versions, [path, Path(__file__)], path)


def main() -> None:
    args = refio.command_line(__doc__, force=True)
    cache = args.cache
    paths = sorted((cache / "models").glob("*.onnx"))
    if not paths:
        sys.exit(f"no models in {cache / 'models'}; run scripts/setup-test-data and scripts/gen_models.py")
    suites = {
        "manifest.json": [(path.stem, path, None) for path in paths],
        "corpus.json": [(name, path, cfg) for name, (path, cfg) in corpus_models(cache).items()],
    }
    for file, jobs in suites.items():
        entries = []
        for name, path, cfg in jobs:
            e = None if args.force else cached_entry(cache, path, name)
            if e is None:
                print(f"running {name} with onnxruntime {ort.__version__}", file=sys.stderr)
                e = run_model(cache, path, name, cfg)
                stamp = {"onnxruntime": ort.__version__, "numpy": np.__version__, "entry": e}
                write_json(cache / "ref" / name / "entry.json", stamp, end="")
            entries.append(e)
        manifest = {"generator": {"onnxruntime": ort.__version__, "numpy": np.__version__, "onnx": onnx.__version__},
                    "models": entries}
        out = cache / "ref" / file
        write_json(out, manifest)
        print(f"{out}: {len(entries)} models", file=sys.stderr)

if __name__ == "__main__":
    main()
