#!/usr/bin/env python3
"""LiteRT's outputs for the TFLite models of the real-model corpus, the oracle that
crates/kiln-cli/tests/tflite_corpus.rs checks kiln against.

    tflite_corpus_reference.py --cache .cache             # reference data
    tflite_corpus_reference.py --cache .cache --bench 30  # also LiteRT's invoke latency

For each `format: tflite` entry of corpus/models.json present under CACHE/corpus, and
each of the small models of fuzz/corpus/import_tflite that LiteRT runs (SEEDS: built by
kiln-import's unit tests; they reach int8, TRANSPOSE_CONV, resizes, RFFT2D): draws
deterministic inputs (numpy default_rng seeded from the model name; standard normal,
or the entry's `data` rule, or a rule below), runs LiteRT's interpreter with one thread
and writes

    CACHE/ref/tflite-corpus/NAME/in_K.npy, out_K.npy   (the interpreter's input / output order)
    CACHE/ref/tflite-corpus/manifest.json              (name, model, inputs, outputs by name)

A model LiteRT itself cannot run is listed with its error. Results are kept while they
are newer than the model and this script and were made by the same LiteRT version.
With --bench N it also times N invokes (after 3 warm-ups) and prints the median in ms,
the number the kiln-vs-LiteRT comparison in docs/tflite.md quotes.
"""

import argparse
import json
import os
import statistics
import time
import zlib
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter
import ai_edge_litert

# Inputs that need sensible data: BirdNET's metadata model takes (latitude, longitude,
# week of the year in 1..48).
INPUT_RULES = {
    "birdnet-v2.4-metadata-fp16": lambda rng, shape: np.array([[47.6, 9.3, 17.0]], dtype=np.float32).reshape(shape),
}
# Audio models: a waveform-like amplitude (standard normal samples overdrive nothing,
# but the spectrogram front ends expect |x| ≤ 1).
SCALE = {"birdnet-v2.4-fp32": 0.1, "star-trek-activation-kws": 0.1, "basic-pitch-nmp-tflite": 0.1}


def save_npy(path: Path, a: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, a, allow_pickle=False)
    os.replace(tmp, path)


def make_input(name, spec, detail, rng):
    shape = list(spec.get("bind_shape") or detail["shape"])
    dtype = detail["dtype"]
    if name in INPUT_RULES:
        return INPUT_RULES[name](rng, shape).astype(dtype)
    data = spec.get("data", {})
    if "value" in data:
        return np.full(shape, data["value"], dtype=dtype)
    if "range" in data:
        return rng.integers(data["range"][0], data["range"][1], size=shape).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        return (rng.standard_normal(shape) * SCALE.get(name, 1.0)).astype(dtype)
    if dtype in (np.int8, np.uint8):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)
    return rng.integers(-5, 5, size=shape).astype(dtype)


# The fuzz seeds LiteRT can run (conv_net.tflite has a depthwise convolution without a
# bias, which LiteRT refuses).
SEEDS = ["decoder", "int8_net", "rfft_signature"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--bench", type=int, default=0, help="also time this many invokes per model")
    ap.add_argument("--only", default=None, help="one model name")
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    listing = json.loads((root / "corpus" / "models.json").read_text())
    out_root = args.cache / "ref" / "tflite-corpus"
    out_root.mkdir(parents=True, exist_ok=True)
    manifest_path = out_root / "manifest.json"
    old = {}
    if manifest_path.exists():
        old = {e["name"]: e for e in json.loads(manifest_path.read_text())["models"]}
    version = ai_edge_litert.__version__ if hasattr(ai_edge_litert, "__version__") else "?"
    script_mtime = Path(__file__).stat().st_mtime
    entries = []
    todo = []
    for m in listing["models"]:
        if m["format"] == "tflite":
            todo.append((m, args.cache / "corpus" / m["dest"], {"model": f"corpus/{m['dest']}"}))
    for seed in SEEDS:
        rel = f"fuzz/corpus/import_tflite/{seed}.tflite"
        todo.append(({"name": f"seed-{seed}", "inputs": []}, root / rel, {"repo_model": rel}))
    for m, path, where in todo:
        if args.only and m["name"] != args.only:
            if m["name"] in old:
                entries.append(old[m["name"]])
            continue
        if not path.exists():
            print(f"{m['name']}: {path} missing (run scripts/setup-test-data)")
            continue
        name = m["name"]
        d = out_root / name
        prev = old.get(name)
        fresh = (
            prev is not None
            and prev.get("litert") == version
            and all((args.cache / "ref" / o["file"]).exists() for o in prev.get("outputs", []))
            and (d / "stamp").exists()
            and (d / "stamp").stat().st_mtime > max(path.stat().st_mtime, script_mtime)
        )
        if fresh and not args.bench:
            entries.append(prev)
            continue
        d.mkdir(exist_ok=True)
        interp = Interpreter(model_path=str(path), num_threads=1)
        specs = {i["name"]: i for i in m.get("inputs", [])}
        in_details = interp.get_input_details()
        for det in in_details:
            spec = specs.get(det["name"], {})
            if spec.get("bind_shape") and list(det["shape"]) != list(spec["bind_shape"]):
                interp.resize_tensor_input(det["index"], spec["bind_shape"])
        interp.allocate_tensors()
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        entry = {"name": name, **where, "litert": version, "inputs": [], "outputs": []}
        for k, det in enumerate(in_details):
            x = make_input(name, specs.get(det["name"], {}), det, rng)
            interp.set_tensor(det["index"], x)
            save_npy(d / f"in_{k}.npy", x)
            entry["inputs"].append({"name": det["name"], "file": f"tflite-corpus/{name}/in_{k}.npy"})
        try:
            interp.invoke()
        except Exception as e:  # noqa: BLE001 - recorded, the test reports it
            entry["error"] = f"LiteRT: {e}"
            entries.append(entry)
            print(f"{name}: LiteRT failed: {e}")
            continue
        for k, det in enumerate(interp.get_output_details()):
            y = interp.get_tensor(det["index"])
            save_npy(d / f"out_{k}.npy", y)
            entry["outputs"].append({"name": det["name"], "file": f"tflite-corpus/{name}/out_{k}.npy"})
        if args.bench:
            for _ in range(3):
                interp.invoke()
            times = []
            for _ in range(args.bench):
                t = time.perf_counter()
                interp.invoke()
                times.append((time.perf_counter() - t) * 1e3)
            print(f"BENCH {name}: LiteRT invoke median {statistics.median(times):.3f} ms over {args.bench} (1 thread)")
        (d / "stamp").write_text(version)
        entries.append(entry)
        print(f"{name}: {len(entry['outputs'])} outputs")
    tmp = manifest_path.with_name("manifest.json.tmp")
    tmp.write_text(json.dumps({"models": entries}, indent=1))
    os.replace(tmp, manifest_path)


if __name__ == "__main__":
    main()
