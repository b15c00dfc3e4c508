#!/usr/bin/env python3
"""kiln beside LiteRT on TFLite models, interleaved in one run (scripts/bench-tflite runs
this with a release kiln; see there for the usage).

    bench_tflite.py --kiln KILN --cache CACHE [MODEL ...]

MODEL: a synthetic model's name (CACHE/tflite/synthetic/NAME.tflite, fed the inputs of
CACHE/ref/tflite/NAME, or CACHE/tflite/bench/NAME.tflite, the benchmark's larger models
that scripts/bench-tflite generates) or any .tflite path (fed scripts/tflite_reference.py's
deterministic inputs for it). Default: every synthetic and benchmark model of the int8
and f32 variants. Per model and thread count (THREADS, default "1 2"): ROUNDS rounds of (kiln
bench on the compiled artifact, then LiteRT's interpreter with its default XNNPACK
delegate and the same thread count), each at least ITER timed calls and about ROUND_S
seconds of the slower engine, after a fifth as many warm-up calls; the same counts for
both. Per engine: median, p99 (nearest rank) and stddev of every timed call of every
round, as scripts/bench reports them; ratio = kiln median / LiteRT median.

Then, for each architecture benchmarked as both NAME_int8 and NAME_f32 (or for any pair
given as INT8.tflite=F32.tflite), int8 against float: each engine's int8 median over its
f32 median, at each thread count.

kiln times `invoke` alone (kiln bench); LiteRT `Interpreter.invoke()` from Python with
the inputs set once before (a call's Python overhead is a few microseconds; it is in
LiteRT's numbers). A model kiln does not compile is timed in LiteRT alone and listed.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tflite_reference as ref  # noqa: E402
from ai_edge_litert.interpreter import Interpreter, OpResolverType  # noqa: E402


def summary(samples):
    t = sorted(samples)
    return statistics.median(t), t[-(-99 * len(t) // 100) - 1], statistics.pstdev(t)


class Model:
    """One benchmarked model: its path, its inputs as .npy files, its kiln artifact."""

    def __init__(self, spec: str, cache: Path, tmp: Path):
        p = Path(spec)
        if p.suffix == ".tflite":
            self.path, self.name = p, p.stem
        else:
            self.path, self.name = cache / "tflite" / "synthetic" / f"{spec}.tflite", spec
            if not self.path.is_file():
                self.path = cache / "tflite" / "bench" / f"{spec}.tflite"
        if not self.path.is_file():
            sys.exit(f"{spec}: no such model ({self.path}); run scripts/setup-test-data, or give a .tflite path")
        self.tmp = tmp
        entry = cache / "ref" / "tflite" / self.name / "entry.json"
        self.inputs = []  # (tensor name, signature name, .npy path, array)
        if entry.is_file() and self.path.parent == cache / "tflite" / "synthetic":
            for i in json.loads(entry.read_text())["entry"]["inputs"]:
                f = cache / i["file"]
                self.inputs.append((i["name"], i["signature_name"], f, np.load(f)))
        else:
            spec_path = self.path.with_suffix(".json")
            spec_json = json.loads(spec_path.read_text()) if spec_path.is_file() else {}
            it = ref.interpreter(self.path)
            sig = ref.signature_names(it)
            for k, (d, a) in enumerate(ref.make_inputs(self.name, it, spec_json)):
                f = tmp / f"{self.name}.in_{k}.npy"
                np.save(f, a)
                self.inputs.append((d["name"], sig.get(d["index"], d["name"]), f, a))
        self.artifact, self.why = None, None

    def compile(self, kiln: str):
        art = self.tmp / f"{self.name}.kiln"
        r = subprocess.run([kiln, "compile", str(self.path), "-o", str(art)], capture_output=True, text=True)
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines()
            self.why = lines[-1] if lines else f"kiln compile exited with status {r.returncode}"
            return
        info = json.loads(subprocess.run([kiln, "inspect", str(art), "--json"], capture_output=True, text=True,
                                         check=True).stdout.splitlines()[0])
        entry = next((e for e in info["entries"] if e["name"] == "main"), info["entries"][0])
        self.kiln_inputs = []
        for i in entry["inputs"]:
            match = [f for n, s, f, _ in self.inputs if i["name"] in (n, s)]
            if not match:
                self.why = f"kiln's input `{i['name']}` is none of the model's ({[n for n, *_ in self.inputs]})"
                return
            self.kiln_inputs.append((i["name"], match[0]))
        self.artifact = art


def kiln_round(kiln, m: Model, threads, warm, n, tmp):
    samples = tmp / "samples.txt"
    args = [kiln, "bench", str(m.artifact), "--threads", str(threads), "--warmup", str(warm), "--iterations",
            str(n), "--json", "--samples", str(samples)]
    for name, f in m.kiln_inputs:
        args += ["--input", f"{name}={f}"]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        lines = r.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"kiln bench exited with status {r.returncode}"
    k = json.loads(r.stdout)
    k["samples"] = [float(line.split()[0]) for line in open(samples)]
    return k, None


def litert(m: Model, threads):
    it = Interpreter(model_path=str(m.path), num_threads=threads,
                     experimental_op_resolver_type=OpResolverType.AUTO)
    it.allocate_tensors()
    by = {n: a for n, _, _, a in m.inputs}
    for d in it.get_input_details():
        it.set_tensor(d["index"], by[d["name"]])
    return it


def litert_round(it, warm, n):
    for _ in range(warm):
        it.invoke()
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        it.invoke()
        t.append((time.perf_counter() - t0) * 1e3)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    ap.add_argument("models", nargs="*")
    args = ap.parse_args()
    rounds = max(1, int(os.environ.get("ROUNDS", "5")))
    iters = int(os.environ.get("ITER", "100"))
    round_s = float(os.environ.get("ROUND_S", "0.3"))
    thread_counts = [int(t) for t in os.environ.get("THREADS", "1 2").split()]
    pairs = []  # (int8 name, f32 name)
    specs = []
    for s in args.models:
        if "=" in s and s.endswith(".tflite"):
            a, b = s.split("=", 1)
            specs += [a, b]
            pairs.append((Path(a).stem, Path(b).stem))
        else:
            specs.append(s)
    if not specs:
        synth = sorted(p.stem for p in (args.cache / "tflite" / "synthetic").glob("*.tflite"))
        bench = sorted(p.stem for p in (args.cache / "tflite" / "bench").glob("*.tflite"))
        specs = [n for n in synth + bench if n.endswith(("_int8", "_f32"))]
        if not specs:
            sys.exit("no synthetic TFLite models; run scripts/setup-test-data")
    names = {Path(s).stem if s.endswith(".tflite") else s for s in specs}
    for n in sorted(names):
        if n.endswith("_int8") and n[:-5] + "_f32" in names and (n, n[:-5] + "_f32") not in pairs:
            pairs.append((n, n[:-5] + "_f32"))

    tmp = Path(tempfile.mkdtemp(prefix="kiln-bench-tflite-"))
    models = [Model(s, args.cache, tmp) for s in specs]
    for m in models:
        m.compile(args.kiln)
        if m.why:
            print(f"{m.name}: {m.why}", file=sys.stderr)

    rows, medians = [], {}
    for m in models:
        for threads in thread_counts:
            it = litert(m, threads)
            t0 = time.perf_counter()
            for _ in range(20):
                it.invoke()
            l_ms = (time.perf_counter() - t0) * 1e3 / 20
            probe = kiln_round(args.kiln, m, threads, 10, 20, tmp)[0] if m.artifact else None
            slower = max(l_ms, probe["median_ms"] if probe else l_ms)
            n = int(min(max(iters, round_s * 1e3 / max(slower, 1e-6)), 50000))
            warm = max(10, n // 5)
            ks, ls = [], []
            for _ in range(rounds):
                if m.artifact:
                    k, why = kiln_round(args.kiln, m, threads, warm, n, tmp)
                    if k:
                        ks += k["samples"]
                    else:
                        print(f"{m.name}, {threads} thread(s): kiln bench: {why}", file=sys.stderr)
                ls += litert_round(it, warm, n)
                time.sleep(0.1)  # let LiteRT's pool threads go idle before kiln's next round
            lm = summary(ls)
            km = summary(ks) if ks else None
            medians[(m.name, threads)] = (km[0] if km else None, lm[0])
            fmt = lambda x: "—" if x is None else f"{x:.4f}"
            # How much of the graph XNNPACK took: its partitions, and the nodes left to
            # TFLite's own kernels (a model split into many partitions runs partly outside it).
            ops = it._get_ops_details()  # noqa: SLF001: LiteRT's one view of the execution plan
            parts = sum(o["op_name"] == "DELEGATE" for o in ops)
            rows.append([m.name, threads, *(fmt(x) for x in (km or (None,) * 3)), *(fmt(x) for x in lm),
                         f"{km[0] / lm[0]:.2f}" if km else "—", parts, f"{warm} + {n}"])
            print(" | ".join(map(str, rows[-1])), file=sys.stderr)

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.machine())
    out = [f"kiln beside LiteRT {ref.litert_version()} (XNNPACK delegate, `num_threads` = kiln's `--threads`), "
           f"{time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores; {rounds} interleaved rounds per model "
           f"and thread count. Median, p99 (nearest rank), stddev of every timed call, in ms. XNNPACK "
           "partitions: the delegate's subgraphs in LiteRT's plan (more than one: some ops run in TFLite's own "
           "kernels between them).", "",
           "| model | threads | kiln median | kiln p99 | kiln stddev | LiteRT median | LiteRT p99 | LiteRT stddev "
           "| kiln / LiteRT | XNNPACK partitions | warm-up + calls per round |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    out += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    if pairs:
        out += ["", "int8 against float32 on the same architecture (int8 median / f32 median; below 1: int8 is faster):",
                "", "| int8 model | f32 model | threads | kiln int8 / f32 | LiteRT int8 / f32 |", "|---|---|---:|---:|---:|"]
        for a, b in pairs:
            for threads in thread_counts:
                (ka, la), (kb, lb) = medians.get((a, threads), (None, None)), medians.get((b, threads), (None, None))
                if la is None or lb is None:
                    continue
                kr = f"{ka / kb:.2f}" if ka and kb else "—"
                out.append(f"| {a} | {b} | {threads} | {kr} | {la / lb:.2f} |")
    failed = [m for m in models if m.why]
    if failed:
        out += ["", "Not compiled by kiln, so timed in LiteRT alone:"] + [f"- {m.name}: {m.why}" for m in failed]
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        print(f"{args.out} written", file=sys.stderr)


if __name__ == "__main__":
    main()
