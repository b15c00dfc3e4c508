#!/usr/bin/env python3
"""Runs kiln's synthetic models compiled for other CPU architectures under qemu-user.

For every model of scripts/gen_models.py's default set (the synthetic models) this
compiles the model three ways with the host's `kiln`: for this x86-64 machine, and with
`--target-triple` for each architecture asked for (aarch64, riscv64); runs the x86-64
artifact with the host's `kiln-run` and each other artifact with the `kiln-run` built
for that architecture, under `qemu-<arch> -L <sysroot>` (loader and C library both from
the sysroot), each with one thread and with two, on the inputs of ONNX Runtime's
reference (.cache/ref/manifest.json); and compares every output of every architecture
and thread count with the x86-64 one-thread run's, and with ONNX Runtime's, under the model's tolerance (the
manifest's rtol/atol as crates/kiln-cli/tests/models.rs applies them: |got - want| <=
atol * max|want| + rtol * |want| per element; integer and bool outputs exact).

It also checks that the artifact records its architecture: the host's kiln-run must
refuse the first model's aarch64 (or riscv64) artifact, naming both architectures.

A model missing from the manifest, an output missing from a run, or any mismatch is a
failure (exit status 1). Used by scripts/cross-test, which builds what it needs.
"""

import argparse
import json
import os
import concurrent.futures
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
from gen_models import MODELS  # noqa: E402  (the synthetic models: the generator's default set)
from refio import file_stem  # noqa: E402

TRIPLES = {"aarch64": "aarch64-unknown-linux-gnu", "riscv64": "riscv64gc-unknown-linux-gnu"}


def run(cmd, timeout=None, **kw):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        p = subprocess.CompletedProcess(cmd, 124, "", f"did not finish in {timeout:.0f} s (hung?)")
    return p, time.monotonic() - t0


def must(cmd, what):
    p, dt = run(cmd)
    if p.returncode != 0:
        sys.exit(f"error: {what} failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stderr.strip()}")
    return dt


def file_name(name):
    """The runner's file name for an output."""
    return file_stem(name) + ".npy"


def compare(got, want, rtol, atol):
    """None when `got` matches `want`, else a description of the worst element."""
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if not np.issubdtype(want.dtype, np.floating):
        bad = np.flatnonzero(got != want)
        return None if bad.size == 0 else f"{bad.size} elements differ (first at {bad[0]})"
    g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    if w.size == 0:
        return None
    scale = max(np.max(np.abs(w[np.isfinite(w)]), initial=0.0), np.finfo(np.float64).tiny)
    nan_ok = np.isnan(g) == np.isnan(w)
    err = np.where(np.isnan(g) & np.isnan(w), 0.0, np.abs(g - w))
    tol = atol * scale + rtol * np.abs(w)
    excess = np.where(nan_ok, err / np.where(tol > 0, tol, np.inf), np.inf)
    excess = np.where(np.isnan(excess), np.inf, excess)
    worst = int(np.argmax(excess))
    if excess[worst] <= 1.0:
        return None
    return f"element {worst} is {g[worst]!r}, expected {w[worst]!r} ({excess[worst]:.2f}x the tolerance)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True, help="the test data (.cache)")
    ap.add_argument("--kiln", required=True, help="the host's kiln")
    ap.add_argument("--host-runner", required=True, help="the host's kiln-run")
    ap.add_argument(
        "--runner",
        action="append",
        default=[],
        metavar="ARCH=PATH",
        help="kiln-run built for ARCH (aarch64, riscv64); one per architecture to test",
    )
    ap.add_argument("--work", required=True, help="a directory for artifacts and outputs")
    ap.add_argument("--only", default="", help="comma-separated model names (default: every synthetic model)")
    ap.add_argument(
        "--run-timeout",
        type=float,
        default=1200.0,
        help="seconds one run may take before it counts as hung (default 1200)",
    )
    args = ap.parse_args()

    cache = Path(args.cache)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    runners = {}
    for r in args.runner:
        arch, _, path = r.partition("=")
        if arch not in TRIPLES:
            sys.exit(f"error: --runner {r}: the architecture is one of {', '.join(TRIPLES)}")
        runners[arch] = Path(path)
    if not runners:
        sys.exit("error: no --runner given")

    manifest = {m["name"]: m for m in json.loads((cache / "ref" / "manifest.json").read_text())["models"]}
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    failures = []
    checked = 0
    for name in names:
        m = manifest.get(name)
        if m is None:
            failures.append(f"{name}: not in {cache}/ref/manifest.json (run scripts/ref_outputs.py)")
            continue
        model = cache / m["model"]
        shapes = [a for k, v in m["input_shapes"].items() for a in ("--input-shape", f"{k}={'x'.join(map(str, v))}")]
        feeds = [a for i in m["inputs"] for a in ("--input", f"{i['name']}={cache / i['file']}")]
        rtol, atol = m.get("rtol", 1e-4), m.get("atol", 1e-5)
        outs = {}
        line = [name]
        def one(arch):
            artifact = work / f"{name}.{arch}.kiln"
            triple = [] if arch == "x86_64" else ["--target-triple", TRIPLES[arch]]
            dt_c = must([args.kiln, "compile", model, "-o", artifact, *shapes, *triple], f"{name}: compiling for {arch}")
            if arch == "x86_64":
                cmd = [args.host_runner]
            else:
                # The dynamic loader and the C library both from the cross sysroot: with
                # `-L` alone the sysroot's loader found the C library of dpkg's arm64
                # architecture (libc6:arm64, another build of glibc 2.36, installed with
                # libstd-rust-web-dev:arm64) through /etc/ld.so.cache, and the mixed pair
                # spun forever in the first pthread_create (a plain C program that starts
                # one thread hung the same way): two-thread runs never finished.
                sysroot = f"/usr/{arch}-linux-gnu"
                cmd = [f"qemu-{arch}", "-L", sysroot, "-E", f"LD_LIBRARY_PATH={sysroot}/lib", runners[arch]]
            notes = [f"{arch}: compile {dt_c:.1f} s"]
            dirs = {}
            # One thread, and two: the worker pool's hand-off under a weakly ordered CPU
            # (aarch64, riscv64), as qemu-user runs each guest thread on a host thread.
            for threads in (1, 2):
                out_dir = work / "out" / f"{arch}-t{threads}" / name
                out_dir.mkdir(parents=True, exist_ok=True)
                for f in out_dir.glob("*.npy"):
                    f.unlink()
                run_cmd = [*cmd, artifact, *feeds, "--output-dir", out_dir, "--threads", str(threads)]
                p, dt_r = run(run_cmd, timeout=args.run_timeout)
                if p.returncode != 0:
                    sys.exit(
                        f"error: {name}: running on {arch} with {threads} thread(s) failed ({p.returncode}): "
                        f"{' '.join(map(str, run_cmd))}\n{p.stderr.strip()}"
                    )
                dirs[threads] = out_dir
                notes.append(f"run on {threads} thread(s) {dt_r:.1f} s")
            return arch, dirs, ", ".join(notes)

        # The emulated architectures side by side (one emulator a core).
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(runners))) as pool:
            done = [one("x86_64"), *pool.map(one, list(runners))]
        for arch, dirs, note in done:
            outs[arch] = dirs
            line.append(note)
        for o in m["outputs"]:
            ort = np.load(cache / o["file"])
            x86_file = outs["x86_64"][1] / file_name(o["name"])
            if not x86_file.exists():
                failures.append(f"{name}/{o['name']}: the x86-64 run wrote no {x86_file.name}")
                continue
            x86 = np.load(x86_file)
            why = compare(x86, ort, rtol, atol)
            if why:
                failures.append(f"{name}/{o['name']} on x86_64 vs ONNX Runtime: {why}")
            for arch in ["x86_64", *runners]:
                for threads, out_dir in outs[arch].items():
                    if arch == "x86_64" and threads == 1:
                        continue
                    where = f"{arch} ({threads} thread(s))"
                    f = out_dir / file_name(o["name"])
                    if not f.exists():
                        failures.append(f"{name}/{o['name']}: the {where} run wrote no {f.name}")
                        continue
                    got = np.load(f)
                    for ref_name, ref in (("x86-64", x86), ("ONNX Runtime", ort)):
                        why = compare(got, ref, rtol, atol)
                        if why:
                            failures.append(f"{name}/{o['name']} on {where} vs {ref_name}: {why}")
                    checked += 1
        print("; ".join(line), flush=True)

    # The artifact names its architecture: the host refuses another's, with both names.
    if names and names[0] in manifest:
        arch = next(iter(runners))
        p, _ = run([args.host_runner, work / f"{names[0]}.{arch}.kiln"])
        if p.returncode == 0 or f"is {arch} code and this machine is x86_64" not in p.stderr:
            failures.append(
                f"the host's kiln-run did not refuse the {arch} artifact of {names[0]} "
                f"(exit {p.returncode}): {p.stderr.strip()}"
            )
        else:
            print(f"host refuses the {arch} artifact: {p.stderr.strip()}")

    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    if failures:
        sys.exit(1)
    print(
        f"cross test: {checked} outputs (one and two threads; x86-64's two-thread run included) of "
        f"{len(names)} models on {', '.join(runners)} match x86-64 and ONNX Runtime"
    )


if __name__ == "__main__":
    main()
