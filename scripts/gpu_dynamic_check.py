#!/usr/bin/env python3
"""Run-time control flow and data-dependent extents on the GPU, against ONNX Runtime.

    python3 scripts/gpu_dynamic_check.py KILN CACHE [--device cuda|cpu]

For every model of CACHE/control-flow and CACHE/dynamic (written by
scripts/ref_control_flow.py and scripts/ref_dynamic.py: each case's inputs
`CASE.in_K.npy` and ONNX Runtime's outputs `CASE.out_K.npy`; the manifests' bounds,
`--max-dim` and `--max-trips`), compiles the model for the device (`kiln compile
--target cuda`), runs every case (`kiln run --device cuda`) and
compares each output with ONNX Runtime's: the same shape (a data-dependent extent gives
the actual one) and |kiln - ORT| <= 1e-5 * max|ORT| + 1e-4 * |ORT| per element (integers
exactly). Prints one line per case and a closing 'N passed, N failed' line; exits 1 on a
failure. `--device cpu` runs the same on the CPU runtime (a dry run).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from refio import file_stem


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("cache")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    passed = failed = 0
    manifests = {}
    for group in ("control-flow", "dynamic"):
        path = os.path.join(a.cache, group, "manifest.json")
        if os.path.exists(path):
            manifests[group] = {m["name"]: m for m in json.load(open(path))["models"]}
    for group in ("control-flow", "dynamic"):
        for model in sorted(glob.glob(os.path.join(a.cache, group, "*.onnx"))):
            name = os.path.splitext(os.path.basename(model))[0]
            cases_dir = os.path.join(a.cache, group, name)
            cases = sorted({os.path.basename(p).split(".in_")[0] for p in glob.glob(os.path.join(cases_dir, "*.in_*.npy"))})
            if not cases:
                continue
            # The manifest's compile bounds (`--max-dim`) and the cases that must fail
            # with an extent past its bound.
            entry = manifests.get(group, {}).get(name, {})
            max_dims = [x for k, v in entry.get("max_dims", {}).items() for x in ("--max-dim", f"{k}={v}")]
            if "max_trips" in entry:
                max_dims += ["--max-trips", str(entry["max_trips"])]
            refused = {c["name"] for c in entry.get("cases", []) if c.get("error") == "bound"}
            g = onnx.load(model).graph
            inits = {i.name for i in g.initializer}
            inputs = [i.name for i in g.input if i.name not in inits]
            outputs = [o.name for o in g.output]
            art = os.path.join(tmp, name + ".kiln")
            target = ["--target", "cuda"] if a.device == "cuda" else []
            c = subprocess.run([a.kiln, "compile", model, "-o", art, *target, *max_dims], capture_output=True, text=True)
            if c.returncode != 0:
                print(f"{group}/{name}: compile failed: {c.stderr.strip()[-300:]}")
                failed += len(cases)
                continue
            for case in cases:
                out = os.path.join(tmp, name, case)
                cmd = [a.kiln, "run", art, "--output-dir", out]
                if a.device == "cuda":
                    cmd += ["--device", "cuda"]
                for k, n in enumerate(inputs):
                    cmd += ["--input", f"{n}={os.path.join(cases_dir, f'{case}.in_{k}.npy')}"]
                r = subprocess.run(cmd, capture_output=True, text=True)
                why = None
                if case in refused:
                    if r.returncode == 0 or "bound" not in r.stderr:
                        why = f"expected the run to fail with an extent past its bound; got rc {r.returncode}: {r.stderr.strip()[-200:]}"
                elif r.returncode != 0:
                    why = f"run failed: {r.stderr.strip()[-300:]}"
                else:
                    for k, n in enumerate(outputs):
                        want = np.load(os.path.join(cases_dir, f"{case}.out_{k}.npy"))
                        files = [f for f in os.listdir(out) if f.endswith(".npy")]
                        path = os.path.join(out, file_stem(n) + ".npy")
                        if not os.path.exists(path):
                            why = f"no output file for {n} (have {files})"
                            break
                        got = np.load(path)
                        if got.shape != want.shape:
                            why = f"{n}: shape {got.shape}, ONNX Runtime {want.shape}"
                            break
                        if want.dtype.kind == "f":
                            scale = float(np.max(np.abs(want))) if want.size else 0.0
                            err = np.abs(got.astype(np.float64) - want.astype(np.float64))
                            if np.any(err > 1e-5 * scale + 1e-4 * np.abs(want)):
                                why = f"{n}: max abs error {float(err.max()):.3g}"
                                break
                        elif not np.array_equal(got, want):
                            why = f"{n}: values differ"
                            break
                status = "ok" if why is None else f"FAIL: {why}"
                print(f"{group}/{name}/{case}: {status}", flush=True)
                passed += why is None
                failed += why is not None
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
