"""Set-up and file writing shared by the reference scripts (ref_*.py, tflite_reference.py).

Not a script: the others import it (Python puts a script's own folder on the path). What
is here changes no number: it builds and checks ONNX models, opens ONNX Runtime the one
way every reference is taken (CPU, graph optimisations disabled, one thread), and writes
.npy and JSON files atomically (a temporary file, then a rename), so an interrupted run
leaves no half-written reference behind.
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np


def file_stem(name: str) -> str:
    """The file name (without `.npy`) `kiln run` and `kiln-run` write output `name` to:
    every character outside [A-Za-z0-9._-] becomes `_`, and a name left empty or all dots
    gets an `output_` prefix (kiln-cli's `file_stem`)."""
    s = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in name)
    return f"output_{s}" if s.strip(".") == "" else s


def command_line(description=None, force=False):
    """The command line of a reference script: `--cache DIR` (a Path), and with `force`
    also `--force` (recompute every model instead of reusing fresh entries)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, required=True)
    if force:
        ap.add_argument("--force", action="store_true", help="recompute every model")
    return ap.parse_args()


def cache_arg(description=None) -> Path:
    """The `--cache` folder of a script's command line."""
    return command_line(description).cache


def ort_generator() -> dict:
    """The `generator` record of a manifest of ONNX Runtime references."""
    import onnx
    import onnxruntime as ort

    return {"onnxruntime": ort.__version__, "onnx": onnx.__version__}


def const(name, a):
    """An initializer holding `a`."""
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(a), name)


def checked_model(nodes, inputs, outputs, inits, name, producer, opset):
    """A one-graph model of the default domain at `opset` (IR version 8), fully checked."""
    import onnx
    from onnx import helper

    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name=producer)
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def ort_session(model):
    """ONNX Runtime on the CPU, graph optimisations disabled, one thread. `model` is a
    path (str) or a serialized model (bytes)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def save_npy(path: Path, a) -> None:
    """`a` as an .npy file at `path`, written atomically."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, a, allow_pickle=False)
    os.replace(tmp, path)


def save_arrays(cache: Path, stem: str, arrays) -> list:
    """Every array as `STEM_K.npy` under `cache` (K its position); the files' names,
    relative to `cache`."""
    files = []
    for k, a in enumerate(arrays):
        f = f"{stem}_{k}.npy"
        save_npy(cache / f, np.asarray(a))
        files.append(f)
    return files


def write_json(path: Path, value, end: str = "\n") -> None:
    """`value` as JSON (indent 1) followed by `end`, written atomically."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1) + end)
    os.replace(tmp, path)


def cached_entry(cache: Path, stamp: Path, versions: dict, sources: list, model: Path):
    """The manifest entry recorded in `stamp` for `model` if it is still valid, else
    None. Valid: recorded with these tool `versions`, newer than every existing file in
    `sources`, for a model of the same size, and every input and output file it names
    (float_outputs too) is still under `cache`."""
    try:
        rec = json.loads(stamp.read_text())
        t = stamp.stat().st_mtime
    except (OSError, ValueError):
        return None
    if any(rec.get(k) != v for k, v in versions.items()):
        return None
    if any(p.is_file() and t <= p.stat().st_mtime for p in sources):
        return None
    e = rec.get("entry", {})
    files = [x["file"] for x in e.get("inputs", []) + e.get("outputs", []) + e.get("float_outputs", [])]
    if e.get("size_bytes") != model.stat().st_size or not all((cache / f).is_file() for f in files):
        return None
    return e


def ort_suite(out: Path, sub: str, models: dict, max_trips: dict):
    """Writes every model of `models` (name → a function returning the model and its
    cases) as `out/NAME.onnx`, makes its case folder `out/NAME`, and yields (name, its
    manifest entry so far, its cases, a function running ONNX Runtime on a list of
    feeds in graph-input order). `sub` is `out`'s name under the cache; `max_trips`
    gives the models compiled with --max-trips."""
    for name, make in models.items():
        m, cases = make()
        path = out / f"{name}.onnx"
        path.write_bytes(m.SerializeToString())
        sess = ort_session(str(path))
        (out / name).mkdir(exist_ok=True)
        entry = {"name": name, "file": f"{sub}/{name}.onnx", "cases": []}
        if name in max_trips:
            entry["max_trips"] = max_trips[name]
        names = [i.name for i in sess.get_inputs()]
        yield name, entry, cases, lambda feeds, sess=sess, names=names: sess.run(None, dict(zip(names, feeds)))
