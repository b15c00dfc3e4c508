#!/usr/bin/env python3
"""kiln on a GPU beside ONNX Runtime (correctness) and PyTorch (speed), in one run.

Three steps, each a subcommand (scripts/gpu-test wraps them):

    gpu_test.py prepare [--set core|corpus] [--part K] [--models A,B] [--bundle .gpu]
        here: gathers what the GPU machine needs into one folder (the bundle): the kiln
        binary (gzip), this script, gen_models.py, ref_outputs.py, refio.py and ort_exact_int8.py (which ref_outputs.py imports), the ONNX models
        that fit the device tool's 64 MiB, the corpus listing, onnx2torch's wheel, and
        run.sh. Synthetic models are not carried: gen_models.py builds them there.
    gpu_test.py run [--only CASE,...] [--budget-s S]
        there, from the repository root (`bash .gpu/run.sh`): every case (a model at a
        precision and batch) compiled for the GPU, run and compared with ONNX Runtime
        (CPU) on seeded inputs, timed with `kiln bench`, and the same model converted by
        onnx2torch timed in PyTorch (eager and CUDA-graph replay). Writes
        $OUT/gpu-results.json (every number), $OUT/gpu-log.txt (every command and its
        output) and $OUT/gpu-check.txt (kiln gpu-check, when this kiln has it); prints a
        summary table last. KILN_GPU_TEST_DEVICE=cpu runs the same steps on the CPU
        (a dry run of this half on a machine without a GPU).
    gpu_test.py report RESULTS.json [--out docs/benchmarks-gpu.md]
        here: the results as a page, the issue's targets beside them.

The device half needs python3 with numpy, onnx and onnxruntime; PyTorch (and the
carried onnx2torch) only for the peer columns, which say "not available" without it.
One case failing (compile, run, mismatch, timeout) never stops the others: its error is
recorded and the run goes on. Every step has a timeout, and the whole run a time budget
(--budget-s, default 480 s; the device tool stops a command at 600 s): cases not reached
are recorded as such, never dropped.
"""

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent

# --- what is measured ---------------------------------------------------------------

# Synthetic models (built on the GPU machine by gen_models.py): name -> (--only, --batch).
SYNTHETIC = {
    "mlp": ("mlp", 1),
    "lenet": ("lenet", 1),
    "mobilenet_v2": ("mobilenet_v2", 1),
    "bert_tiny": ("bert_tiny", 1),
    "matmul1024": ("matmul1024", 1),
    "eltwise": ("eltwise", 1),
    "mobilenet_v2_b32": ("mobilenet_v2", 32),
    "bert_tiny_b32": ("bert_tiny", 32),
    "gemm4096": ("gemm4096", 1),
    "gemm4096_bf16": ("gemm4096_bf16", 1),
}

# The synthetic cases, most important first (the run's budget cuts from the end): the
# issue's must-show rows, then the other precisions and batches.
SYNTHETIC_CASES = [
    ("mlp", "f32"),
    ("lenet", "f32"),
    ("mobilenet_v2", "f32"),
    ("mobilenet_v2_b32", "f32"),
    ("bert_tiny", "f16"),
    ("bert_tiny_b32", "f16"),
    ("gemm4096_bf16", "f32"),
    ("matmul1024", "f32"),
    ("eltwise", "f32"),
    ("bert_tiny", "f32"),
    ("mobilenet_v2", "f16"),
    ("mobilenet_v2", "bf16"),
    ("bert_tiny", "bf16"),
    ("bert_tiny_b32", "f32"),
    ("mobilenet_v2_b32", "f16"),
]
# Run after the carried models (least important: long and covered by gemm4096_bf16).
LATE_CASES = [("gemm4096", "f32")]

# The targets (issue 21, "Must show"), per case id: per-call median in ms, or
# for gemm4096_bf16 a rate in TFLOP/s (≥ 400 with mma.sync, ≥ 600 with wgmma). `torch`
# is the issue's own PyTorch figure (eager + CUDA graph), where it gives one.
TARGETS = {
    "mlp": {"ms": 0.020, "torch": 0.022},
    "lenet": {"ms": 0.030, "torch": 0.040},
    "mobilenet_v2": {"ms": 0.66, "torch": 0.66},
    "mobilenet_v2_b32": {"ms": 3.0, "torch": 3.03},
    "bert_tiny:f16": {"ms": 0.135, "torch": 0.135},
    "bert_tiny_b32:f16": {"ms": 0.34, "torch": 0.34},
    "matmul1024": {"ms": 0.064},
    "eltwise": {"ms": 0.030},
    "gemm4096_bf16": {"tflops": (400, 600), "flop": 2 * 4096**3},
}
FLOP = {"matmul1024": 2 * 1024**3, "gemm4096": 2 * 4096**3, "gemm4096_bf16": 2 * 4096**3}

# Models ONNX Runtime's CPU provider cannot run (no bf16 MatMul kernel): their reference
# is computed here with numpy instead, from the same inputs (see numpy_reference).
NUMPY_REFERENCE = {"gemm4096_bf16"}

# Half-precision criterion (relative L2 error against ONNX Runtime's f32 outputs) until
# the precision work states its own: f16 keeps 11 significant bits, bf16 8; a deep
# model rounds at every layer, so these are a few times one rounding's error. f32
# cases use the repository's per-element rule (ref_outputs.py's rtol/atol, as
# crates/kiln-cli/tests/models.rs applies them).
HALF_REL_L2 = {"f16": 1e-2, "bf16": 4e-2}

ITERATIONS = 300  # timed calls per engine (at least 200 unless a call is too slow, see CALL_CAP_S)
WARMUP = 30
CALL_CAP_S = 20.0  # the most seconds one engine's timed calls of one case may take

STEP_TIMEOUT = {"compile": 180, "run": 120, "bench": 120, "check": 90}


def warmup_calls(one_s: float) -> int:
    """WARMUP untimed calls, fewer (at least 3) where they would take over 2 s."""
    return WARMUP if one_s * WARMUP <= 2.0 else max(3, int(2.0 / max(one_s, 1e-9)))


def case_id(model: str, precision: str) -> str:
    return model if precision == "f32" else f"{model}:{precision}"


# --- prepare (here) -----------------------------------------------------------------

LIMIT = 64 * 2**20  # the device tool's limit for the working tree plus carried paths


def tree_bytes(root: Path) -> int:
    """Bytes of what the device tool sends: tracked files and untracked files git does not ignore."""
    r = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       cwd=root, capture_output=True, check=True)
    total = 0
    for name in r.stdout.decode().split("\0"):
        p = root / name
        if name and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def corpus_entries(root: Path) -> list:
    return json.loads((root / "corpus" / "models.json").read_text())["models"]


def candidates(root: Path, cache: Path) -> dict:
    """Every carried-model candidate: {name: {file, bytes, source}} (synthetic models are built there)."""
    found = {}
    for p in sorted((cache / "models").glob("*.onnx")):
        if p.stem not in SYNTHETIC:
            found[p.stem] = {"file": p, "bytes": p.stat().st_size, "source": "repo"}
    for m in corpus_entries(root):
        p = cache / "corpus" / m["dest"]
        if m["format"] == "onnx" and p.is_file():
            found[m["name"]] = {"file": p, "bytes": p.stat().st_size, "source": "corpus"}
    return found


def pack(items: list, budget: int) -> list:
    """First-fit decreasing: items (name, bytes) into bins of BUDGET bytes; an item over
    the budget gets no bin."""
    bins = []
    for name, size in sorted(items, key=lambda x: -x[1]):
        if size > budget:
            continue
        for b in bins:
            if b["bytes"] + size <= budget:
                b["names"].append(name)
                b["bytes"] += size
                break
        else:
            bins.append({"names": [name], "bytes": size})
    return bins


def prepare(args) -> None:
    root = Path(args.root).resolve()
    cache = Path(os.environ.get("KILN_CACHE", root / ".cache"))
    bundle = root / args.bundle
    kiln = Path(args.kiln)
    if not kiln.is_file():
        sys.exit(f"no kiln binary at {kiln}; build it (cargo build --release --locked -p kiln-cli)")
    if bundle.exists():
        shutil.rmtree(bundle)
    (bundle / "models").mkdir(parents=True)
    (bundle / "whl").mkdir()
    # The fixed part: the binary (gzip: a third of its size), scripts, listing, wheel.
    with open(kiln, "rb") as f, gzip.open(bundle / "kiln.gz", "wb", compresslevel=9) as g:
        shutil.copyfileobj(f, g)
    for s in ("gpu_test.py", "gen_models.py", "ref_outputs.py", "refio.py", "ort_exact_int8.py"):
        shutil.copy2(HERE / s, bundle / s)
    shutil.copy2(root / "corpus" / "models.json", bundle / "corpus-models.json")
    wheel = fetch_wheel(bundle / "whl")
    (bundle / "run.sh").write_text(
        "#!/usr/bin/env bash\n"
        "# Written by scripts/gpu-test prepare: the GPU machine's half, from the repository root.\n"
        f"#   bash {args.bundle}/run.sh [--only CASE,...] [--budget-s S]\n"
        "here=\"$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\"\n"
        "cd \"$here/..\" || exit 1\n"
        "export PYTHONUNBUFFERED=1\n"
        "exec python3 \"$here/gpu_test.py\" run \"$@\"\n")
    (bundle / "run.sh").chmod(0o755)

    # What is left for models: the limit, less the tree, the fixed part and a margin
    # (files the tree may gain before the call).
    fixed = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    tree = tree_bytes(root)
    margin = 2 * 2**20
    budget = LIMIT - tree - fixed - margin
    if args.max_mb is not None:
        budget = min(budget, int(args.max_mb * 2**20))
    cand = candidates(root, cache)
    left_out = {}
    if args.models:
        wanted = [n for n in args.models.split(",") if n]
        unknown = [n for n in wanted if n not in cand and n not in SYNTHETIC]
        if unknown:
            sys.exit(f"unknown model(s) {', '.join(unknown)}; carried candidates: {', '.join(cand)}")
        chosen = [n for n in wanted if n in cand]
        synthetic = [n for n in wanted if n in SYNTHETIC]
        size = sum(cand[n]["bytes"] for n in chosen)
        if size > budget:
            sys.exit(f"the models given need {size / 2**20:.1f} MiB; {budget / 2**20:.1f} MiB are left under the 64 MiB limit")
    else:
        # core: the synthetic models, the repository's other models, then the smallest
        # corpus models while they fit. corpus: the corpus models core leaves out,
        # packed into parts that each fit (--part K picks one).
        repo = [n for n, c in cand.items() if c["source"] == "repo"]
        corpus = sorted((n for n, c in cand.items() if c["source"] == "corpus"), key=lambda n: cand[n]["bytes"])
        core, used = [], 0
        for n in sorted(repo, key=lambda n: cand[n]["bytes"]) + corpus:
            if used + cand[n]["bytes"] <= budget:
                core.append(n)
                used += cand[n]["bytes"]
        if args.set == "core":
            chosen, synthetic = core, list(SYNTHETIC)
            rest = [n for n in cand if n not in core]
            for n in rest:
                left_out[n] = f"{cand[n]['bytes'] / 2**20:.1f} MiB does not fit beside the rest ({cand[n]['source']})"
        else:
            rest = [(n, cand[n]["bytes"]) for n in corpus + repo if n not in core]
            parts = pack(rest, budget)
            for n, size in rest:
                if size > budget:
                    left_out[n] = f"{size / 2**20:.1f} MiB is over the {budget / 2**20:.1f} MiB left for models in one call"
            if not parts:
                sys.exit("every corpus model fits in --set core; nothing is left for --set corpus")
            if not 1 <= args.part <= len(parts):
                sys.exit(f"--part {args.part}: the corpus set has parts 1..{len(parts)}")
            for k, p in enumerate(parts, 1):
                print(f"corpus part {k}: {p['bytes'] / 2**20:.1f} MiB: {', '.join(p['names'])}", file=sys.stderr)
            chosen, synthetic = parts[args.part - 1]["names"], []
            for k, p in enumerate(parts, 1):
                if k != args.part:
                    for n in p["names"]:
                        left_out[n] = f"in corpus part {k} (scripts/gpu-test prepare --set corpus --part {k})"
            for n in core:
                left_out[n] = "in --set core"
    carried = []
    for n in chosen:
        c = cand[n]
        shutil.copy2(c["file"], bundle / "models" / f"{n}.onnx")
        carried.append({"name": n, "source": c["source"], "bytes": c["bytes"]})
    manifest = {
        "set": "models" if args.models else args.set,
        "part": args.part if args.set == "corpus" and not args.models else None,
        "prepared": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        # "+changes": the binary may hold code the commit does not (crates or
        # Cargo files changed and not committed when the bundle was gathered).
        "commit": git(root, "rev-parse", "--short", "HEAD")
        + ("+changes" if git(root, "status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock") else ""),
        "kiln_version": subprocess.run([str(kiln), "--version"], capture_output=True, text=True).stdout.strip(),
        "glibc_needed": glibc_needed(kiln),
        "known_gaps": known_gaps(root),
        "onnx2torch_wheel": wheel,
        "synthetic": synthetic,
        "carried": carried,
        "left_out": left_out,
    }
    (bundle / "bundle.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    print(f"{args.bundle}: {total / 2**20:.1f} MiB ({fixed / 2**20:.1f} fixed, "
          f"{sum(c['bytes'] for c in carried) / 2**20:.1f} models: {len(carried)} carried, "
          f"{len(synthetic)} synthetic built there); tree {tree / 2**20:.1f} MiB; "
          f"{(tree + total) / 2**20:.1f} of 64 MiB", file=sys.stderr)
    for n, why in left_out.items():
        print(f"  not carried: {n}: {why}", file=sys.stderr)
    print(f"  the binary needs {manifest['glibc_needed'] or 'an unknown glibc'} (the GPU image's Ubuntu 24.04 has 2.39)",
          file=sys.stderr)


def known_gaps(root: Path) -> dict:
    """The corpus models the CPU suite expects to fail (crates/kiln-cli/tests/models.rs
    KNOWN_GAPS), so the page can say a failure there is not new."""
    try:
        text = (root / "crates" / "kiln-cli" / "tests" / "models.rs").read_text()
        block = text[text.index("const KNOWN_GAPS"):]
        block = block[:block.index("];")]
    except (OSError, ValueError):
        return {}
    return dict(re.findall(r'\("([^"]+)",\s*"([^"]+)"\)', block))


def glibc_needed(binary: Path):
    """The newest GLIBC_x.y symbol version the binary needs (None without objdump)."""
    try:
        r = subprocess.run(["objdump", "-T", str(binary)], capture_output=True, text=True)
    except OSError:
        return None
    vs = {tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", r.stdout)}
    return "glibc " + ".".join(map(str, max(vs))) if vs else None


def git(root: Path, *a) -> str:
    r = subprocess.run(["git", *a], cwd=root, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "unknown"


ONNX2TORCH = "onnx2torch==1.5.15"


def fetch_wheel(dest: Path):
    """onnx2torch's wheel (pure Python; needs torch, torchvision, onnx and numpy, all on the
    device image): $KILN_ONNX2TORCH_WHEEL if set, else pip download. None when neither works
    (the peer columns then say why)."""
    given = os.environ.get("KILN_ONNX2TORCH_WHEEL")
    if given:
        shutil.copy2(given, dest)
        return Path(given).name
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", str(dest), ONNX2TORCH], capture_output=True, text=True)
    wheels = list(dest.glob("onnx2torch-*.whl"))
    if r.returncode != 0 or not wheels:
        print(f"warning: no onnx2torch wheel ({r.stderr.strip().splitlines()[-1:] or r.returncode}); "
              "the PyTorch columns will say why", file=sys.stderr)
        return None
    return wheels[0].name


# --- run (there) --------------------------------------------------------------------


class Log:
    """Everything to $OUT/gpu-log.txt; progress lines to stderr as well."""

    def __init__(self, path: Path):
        self.f = open(path, "w")
        self.lock = threading.Lock()  # the compile phase writes from several threads

    def write(self, text: str, echo=False):
        with self.lock:
            self.f.write(text if text.endswith("\n") else text + "\n")
            self.f.flush()
        if echo:
            print(text.rstrip("\n"), file=sys.stderr, flush=True)


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self, step: float) -> float:
        return max(1.0, min(step, self.left()))


class Runner:
    def __init__(self, log: Log, budget: Budget):
        self.log, self.budget = log, budget

    def __call__(self, args, timeout, env=None, cwd=None):
        """(returncode, stdout, stderr, seconds); returncode None on timeout."""
        t = self.budget.timeout(timeout)
        t0 = time.monotonic()
        try:
            r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=t, env=env, cwd=cwd)
            rc, out, err = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            rc = None
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")) + \
                f"\n(timed out after {t:.0f} s)"
        dt = time.monotonic() - t0
        entry = ["$ " + " ".join(map(str, args)), f"  exit {rc} after {dt:.2f} s"]
        for label, text in (("stdout", out), ("stderr", err)):
            if text.strip():
                entry.append(f"  {label}:\n" + "\n".join("    " + l for l in text.rstrip().splitlines()[-60:]))
        self.log.write("\n".join(entry))
        return rc, out, err, dt


def last_line(text: str, rc) -> str:
    lines = [l for l in text.strip().splitlines() if l.strip()]
    if rc is None:
        return "timed out" + (f": {lines[-2]}" if len(lines) > 1 else "")
    return lines[-1] if lines else f"exit status {rc}"


def file_stem(name: str) -> str:
    """kiln's output file name for an output (crates/kiln-cli/src/main.rs `file_stem`)."""
    s = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)
    return f"output_{s}" if not s or set(s) == {"."} else s


def compare(got, want, precision: str, rtol: float, atol: float) -> dict:
    """Errors of GOT against WANT: relative L2, max abs, and the verdict. f32: the repo's
    per-element rule |got - want| <= atol*max|want| + rtol*|want| (worst ratio <= 1);
    half precisions: relative L2 under HALF_REL_L2; integers and bools exact; a NaN where
    the reference has none always fails; shapes must match."""
    import numpy as np
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return {"ok": False, "why": f"shape {list(got.shape)}, ONNX Runtime gives {list(want.shape)}"}
    if not np.issubdtype(want.dtype, np.floating):
        bad = int(np.count_nonzero(got.astype(want.dtype) != want)) if got.size else 0
        return {"ok": bad == 0, "exact": True, "mismatches": bad,
                **({} if bad == 0 else {"why": f"{bad} of {want.size} elements differ (exact)"})}
    a, b = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    both_nan = np.isnan(a) & np.isnan(b)
    finite = np.isfinite(b)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN, counted below
        d = np.where(both_nan | (a == b), 0.0, np.abs(a - b))
    # NaN or infinity where ONNX Runtime has another value (equal values and NaN against
    # NaN give 0 above).
    nan_bad = int(np.count_nonzero(~np.isfinite(d)))
    norm = float(np.sqrt(np.sum(np.where(finite, b, 0.0) ** 2)))
    dd = np.where(np.isfinite(d), d, 0.0)
    rel_l2 = float(np.sqrt(np.sum(dd**2)) / norm) if norm > 0 else float(np.sqrt(np.sum(dd**2)))
    max_abs = float(dd.max()) if dd.size else 0.0
    scale = float(np.abs(b[finite]).max()) if finite.any() else 0.0
    tol = atol * max(scale, sys.float_info.min) + rtol * np.abs(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = np.where(d == 0, 0.0, d / tol)
    excess = np.where(np.isnan(excess), np.inf, excess)
    worst = int(np.argmax(excess)) if excess.size else 0
    r = {"rel_l2": rel_l2, "max_abs": max_abs, "worst_excess": float(excess[worst]) if excess.size else 0.0}
    if nan_bad:
        r.update(ok=False, why=f"{nan_bad} elements NaN or infinite where ONNX Runtime has another value")
    elif precision == "f32":
        r["ok"] = r["worst_excess"] <= 1.0
        r["rule"] = f"per element: atol {atol}·max|ref| + rtol {rtol}·|ref|"
        if not r["ok"]:
            r["why"] = (f"element {worst}: {a[worst]:.6g} vs {b[worst]:.6g}, {r['worst_excess']:.2f}x the tolerance "
                        f"(rel L2 {rel_l2:.2e})")
    else:
        lim = HALF_REL_L2[precision]
        r["ok"] = rel_l2 <= lim
        r["rule"] = f"rel L2 <= {lim:g}"
        if not r["ok"]:
            r["why"] = f"rel L2 {rel_l2:.3e} over {lim:g}"
    return r


def merge_errors(per_output: dict) -> dict:
    """One verdict for a case from its outputs' comparisons."""
    ok = all(c.get("ok") for c in per_output.values())
    out = {"ok": ok, "outputs": per_output}
    rels = [c["rel_l2"] for c in per_output.values() if "rel_l2" in c]
    maxs = [c["max_abs"] for c in per_output.values() if "max_abs" in c]
    if rels:
        out["rel_l2"] = max(rels)
    if maxs:
        out["max_abs"] = max(maxs)
    if not ok:
        out["why"] = "; ".join(f"{n}: {c['why']}" for n, c in per_output.items() if not c.get("ok"))
    return out


def stats(samples: list) -> dict:
    """median, p99 (nearest rank, as kiln bench), stddev (population) and count, in ms."""
    t = sorted(samples)
    if not t:
        return {}
    return {"median_ms": statistics.median(t), "p99_ms": t[-(-99 * len(t) // 100) - 1],
            "stddev_ms": statistics.pstdev(t), "min_ms": t[0], "n": len(t)}


def find_ptxas():
    cands = [os.environ.get("KILN_PTXAS"), shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas"]
    cands += sorted(str(p) for p in Path("/usr/local").glob("cuda*/bin/ptxas"))
    cands += sorted(str(p) for p in Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/*/bin/ptxas"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def system_info(run: Runner, device: str) -> dict:
    info = {"python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "device": device}
    for mod in ("numpy", "onnx", "onnxruntime"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as e:  # recorded, the run needs them and stops below
            info[mod] = f"missing: {e}"
    if shutil.which("nvidia-smi"):
        rc, out, _, _ = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                             "--format=csv,noheader"], 30)
        if rc == 0 and out.strip():
            f = [x.strip() for x in out.strip().splitlines()[0].split(",")]
            info.update(gpu=f[0], driver=f[1] if len(f) > 1 else None, gpu_memory=f[2] if len(f) > 2 else None,
                        sm_clock_max=f[3] if len(f) > 3 else None)
    if device == "cpu":
        info["gpu"] = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
                           platform.machine()) + " (CPU dry run)"
    return info


def torch_setup(bundle: Path, work: Path, log: Log):
    """(torch, onnx2torch, None) or (None, None, why)."""
    try:
        import torch
    except Exception as e:
        return None, None, f"PyTorch not importable ({e})"
    try:
        import onnx2torch  # noqa: F401 (already installed)
    except Exception:
        wheels = sorted((bundle / "whl").glob("onnx2torch-*.whl"))
        if not wheels:
            return torch, None, "no onnx2torch wheel in the bundle"
        site = work / "site"
        # A pure-Python wheel is a zip of the package: unpacked onto sys.path it imports.
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(site)
        sys.path.insert(0, str(site))
        try:
            import onnx2torch
        except Exception as e:
            return torch, None, f"onnx2torch does not import ({e})"
    # f32 stays f32, as kiln's f32 (the issue: no TF32 unless asked): cuDNN's convolutions
    # would otherwise use TF32 by default.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    log.write(f"torch {torch.__version__}, onnx2torch {getattr(onnx2torch, '__version__', '?')}; TF32 off")
    return torch, onnx2torch, None


def torch_peer(torch, onnx2torch, onnx_path: Path, feeds: list, refs: dict, out_names: list, precision: str,
               device: str, iterations: int, budget: Budget, rtol, atol) -> dict:
    """PyTorch on the same model (onnx2torch) and inputs. Per call, as kiln's invoke: host
    inputs copied to the device (and cast to the precision there), the forward, outputs
    copied back to host memory; timed with perf_counter around the call, the D2H copy's
    synchronisation ending it. Eager, then a CUDA graph of the forward replayed between the
    same copies, and the graph replayed back to back with the data on the device (CUDA
    events; ms per replay)."""
    res = {}
    dtype = {"f32": None, "f16": torch.float16, "bf16": torch.bfloat16}[precision]
    dev = torch.device(device)
    hosts = [torch.from_numpy(a) for _, a in feeds]

    def build(host_shapes: bool):
        model = onnx2torch.convert(str(onnx_path)).eval().to(dev)
        if dtype is not None:
            model = model.to(dtype)  # floating-point parameters and buffers only
        if host_shapes:
            # onnx2torch's Reshape reads its shape tensor on the host (`torch.any(shape ==
            # 0)`, `torch.Size(shape)`): on the device, each is a synchronisation that
            # also breaks CUDA-graph capture. Small integer constants (shapes, axes) stay
            # in host memory, as a model written for PyTorch keeps them in Python.
            for full, buf in list(model.named_buffers()):
                if not buf.is_floating_point() and buf.numel() <= 64:
                    owner, _, leaf = full.rpartition(".")
                    (model.get_submodule(owner) if owner else model)._buffers[leaf] = buf.cpu()
        return model

    def to_dev(h):
        t = h.to(dev)
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t

    def outs(o):
        return list(o) if isinstance(o, (tuple, list)) else [o]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def host(o):
        return o.float().cpu().numpy() if o.is_floating_point() else o.cpu().numpy()

    with torch.no_grad():
        # The first placement whose forward runs (the second keeps every constant on the device).
        tried = []
        for host_shapes in ([True, False] if dev.type == "cuda" else [False]):
            try:
                model = build(host_shapes)
                got = [host(o) for o in outs(model(*[to_dev(h) for h in hosts]))]
                res["placement"] = "small integer constants on the host" if host_shapes else "all on the device"
                break
            except Exception as e:
                msg = str(e).strip().splitlines()
                tried.append(f"{type(e).__name__}: {msg[0][:200] if msg else ''}")
        else:
            raise RuntimeError("; ".join(tried))
        if tried:
            res["placement_tried"] = tried
        if len(got) != len(out_names):
            res["correct"] = {"ok": False, "why": f"{len(got)} outputs, ONNX Runtime gives {len(out_names)}"}
        else:
            res["correct"] = merge_errors({n: compare(g, refs[n], precision, rtol, atol) for n, g in zip(out_names, got)})

        def timed(call, n_warm, cap_s):
            t0 = time.perf_counter()
            call()
            one = time.perf_counter() - t0
            for _ in range(min(n_warm, warmup_calls(one))):
                call()
            sync()
            t0 = time.perf_counter()
            call()
            one = time.perf_counter() - t0
            n = iterations if one * iterations <= cap_s else max(20, int(cap_s / max(one, 1e-9)))
            n = min(n, max(20, int(budget.left() / 4 / max(one, 1e-9))))
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                call()
                ts.append((time.perf_counter() - t0) * 1e3)
            return stats(ts)

        def eager():
            return [o.cpu() for o in outs(model(*[to_dev(h) for h in hosts]))]

        res["eager"] = timed(eager, WARMUP, CALL_CAP_S)
        if dev.type != "cuda":
            res["graph_why"] = "CUDA graphs need a CUDA device"
            return res
        def capture(model):
            static_in = [to_dev(h).clone() for h in hosts]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    model(*static_in)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out = outs(model(*static_in))
            return g, static_in, static_out

        try:
            # The eager placement first; if its forward cannot be captured (a host
            # constant copied in during capture), every constant on the device.
            try:
                g, static_in, static_out = capture(model)
            except Exception as e:
                if res["placement"] == "all on the device":
                    raise
                msg = str(e).strip().splitlines()
                res["graph_placement_tried"] = f"{type(e).__name__}: {msg[0][:200] if msg else ''}"
                torch.cuda.synchronize()
                model = build(False)
                g, static_in, static_out = capture(model)
                res["graph_placement"] = "all on the device"

            def replay():
                for si, h in zip(static_in, hosts):
                    si.copy_(h)  # host to device, cast to the precision on the way
                g.replay()
                return [o.cpu() for o in static_out]

            res["graph"] = timed(replay, WARMUP, CALL_CAP_S)
            got = [host(o) for o in replay()]
            res["graph_correct"] = merge_errors({n: compare(x, refs[n], precision, rtol, atol) for n, x in zip(out_names, got)})
            # Back to back on the device (no copies): the replay's own time.
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            n = min(iterations, max(1, int(CALL_CAP_S * 1e3 / max(res["graph"]["median_ms"], 1e-6))))
            e0.record()
            for _ in range(n):
                g.replay()
            e1.record()
            e1.synchronize()
            res["graph_device_ms"] = e0.elapsed_time(e1) / n
        except Exception as e:
            msg = str(e).strip().splitlines()
            res["graph_why"] = f"{type(e).__name__}: {msg[0][:300] if msg else ''}"
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
    return res


def make_feeds(name: str, model_path: Path, cfg: dict, ref_outputs) -> tuple:
    """Seeded inputs as scripts/ref_outputs.py draws them: ([(name, array)], {name: shape})."""
    import numpy as np
    import onnx
    model = onnx.load(str(model_path), load_external_data=False)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    feeds, shapes = [], {}
    for v in ref_outputs.graph_inputs(model):
        shape = ref_outputs.bind_shape(name, v, cfg)
        feeds.append((v.name, ref_outputs.make_input(name, model, v, shape, cfg, rng)))
        shapes[v.name] = shape
    return feeds, shapes, [o.name for o in model.graph.output]


def corpus_cfg(listing: list, name: str, ref_outputs) -> dict:
    """ref_outputs.corpus_models' settings for one corpus model, from the carried listing."""
    return next((ref_outputs.corpus_cfg(m) for m in listing if m["name"] == name), {})


def ort_reference(model_path: Path, feeds: list, out_names: list) -> dict:
    import numpy as np
    import onnxruntime as ort
    so = ort.SessionOptions()
    # As ref_outputs.py: no graph rewrites, so the numbers are the model's own.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    return {n: np.asarray(a) for n, a in zip(out_names, sess.run(out_names, dict(feeds)))}


def bf16_round(x):
    """f32 values rounded to the nearest bf16 (ties to even), as f32: what ONNX's Cast to
    BFLOAT16 gives (finite inputs)."""
    import numpy as np
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def numpy_reference(name: str, feeds: list, out_names: list) -> dict:
    """The outputs of a model in NUMPY_REFERENCE, by its definition (gen_models.py):
    gemm4096_bf16 = bf16(bf16(a) @ bf16(b)), the product in f64 (exact enough to judge an
    f32 accumulation) before its rounding to bf16."""
    import numpy as np
    if name == "gemm4096_bf16":
        a, b = (bf16_round(v) for _, v in feeds)
        y = bf16_round((a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))
        return {out_names[0]: y}
    raise ValueError(f"no numpy reference for {name}")


def kiln_help(run: Runner, kiln: Path) -> dict:
    """Which flags this kiln has (the script adapts: a flag missing is a recorded reason)."""
    h = {}
    for cmd in ("compile", "run", "bench", "gpu-check"):
        rc, out, err, _ = run([kiln, cmd, "--help"], 30)
        h[cmd] = (out + err) if rc == 0 else None
    return h


def run_device(args) -> None:
    device = os.environ.get("KILN_GPU_TEST_DEVICE", "cuda")
    bundle = HERE
    out = Path(os.environ.get("OUT") or (bundle / "out"))
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "gpu-log.txt")
    budget = Budget(args.budget_s)
    run = Runner(log, budget)
    work = Path(tempfile.mkdtemp(prefix="kiln-gpu-test-"))
    sys.path.insert(0, str(bundle))
    import ref_outputs  # noqa: E402 (the carried copy: input rules and tolerances)

    manifest = json.loads((bundle / "bundle.json").read_text())
    kiln = work / "kiln"
    with gzip.open(bundle / "kiln.gz", "rb") as g, open(kiln, "wb") as f:
        shutil.copyfileobj(g, f)
    kiln.chmod(0o755)
    info = system_info(run, device)
    info["bundle"] = {k: manifest[k] for k in ("set", "part", "prepared", "commit", "kiln_version")}
    info["known_gaps"] = manifest.get("known_gaps", {})
    ptxas = find_ptxas()
    env = dict(os.environ)
    if ptxas:
        env["KILN_PTXAS"] = ptxas
        rc, o, e, _ = run([ptxas, "--version"], 30)
        info["ptxas"] = f"{ptxas}: {(o + e).strip().splitlines()[-1] if (o + e).strip() else rc}"
    else:
        info["ptxas"] = "none found (artifacts carry PTX only)"
    rc, o, e, _ = run([kiln, "--version"], 30)
    if rc != 0:  # e.g. a glibc older than the one it was linked against
        info["kiln_broken"] = f"the kiln binary does not start: {last_line(e or o, rc)}"
        print(info["kiln_broken"], file=sys.stderr)
    helps = kiln_help(run, kiln)
    on_gpu = device != "cpu"
    has = {
        "target": helps["compile"] is not None and "--target" in helps["compile"],
        "precision": helps["compile"] is not None and "--precision" in helps["compile"],
        "device": helps["run"] is not None and "--device" in helps["run"],
        "samples": helps["bench"] is not None and "--samples" in helps["bench"],
        # A bench mode with inputs and outputs left on the device, under whichever name it lands.
        "resident": next((f for f in RESIDENT_FLAGS if helps["bench"] is not None and f in helps["bench"]), None),
        "gpu_check": helps["gpu-check"] is not None,
        # `--cubin off`: PTX only, whatever ptxas kiln would find (it also looks in
        # /usr/local/cuda/bin, so hiding ptxas from the environment is not enough).
        "cubin_off": helps["compile"] is not None and "--cubin" in helps["compile"],
    }
    info["kiln_flags"] = dict(has)
    if info.get("kiln_broken"):
        has["broken"] = info["kiln_broken"]
    torch, onnx2torch, torch_why = torch_setup(bundle, work, log)
    if torch is not None:
        info["torch"] = torch.__version__
        if on_gpu and torch_why is None:
            if not torch.cuda.is_available():
                torch_why = "torch.cuda.is_available() is False"
            else:
                info["torch_gpu"] = torch.cuda.get_device_name(0)
    info["torch_why"] = torch_why
    results = {"meta": info, "cases": [], "left_out": manifest["left_out"]}

    def save():
        tmp = out / "gpu-results.json.tmp"
        tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
        os.replace(tmp, out / "gpu-results.json")

    save()
    log.write(f"device {device}; {json.dumps(info, default=str)}", echo=True)

    # 1. Synthetic models, built here.
    models = work / "models"
    models.mkdir()
    cases = []
    if manifest["synthetic"]:
        groups = {}
        for n in manifest["synthetic"]:
            only, batch = SYNTHETIC[n]
            groups.setdefault(batch, []).append(only)
        for batch, names in groups.items():
            rc, _, err, _ = run([sys.executable, bundle / "gen_models.py", "--out", models, "--only", ",".join(names),
                                 "--batch", str(batch)], 300)
            if rc != 0:
                log.write(f"gen_models.py --batch {batch}: {last_line(err, rc)}", echo=True)
        for n, p in SYNTHETIC_CASES:
            if n in manifest["synthetic"]:
                cases.append((n, p, "synthetic"))
    for c in manifest["carried"]:
        shutil.copy2(bundle / "models" / f"{c['name']}.onnx", models / f"{c['name']}.onnx")
        cases.append((c["name"], "f32", c["source"]))
    cases += [(n, p, "synthetic") for n, p in LATE_CASES if n in manifest["synthetic"]]
    if args.only:
        wanted = set(x for x in args.only.split(",") if x)
        keep = [c for c in cases if case_id(c[0], c[1]) in wanted or c[0] in wanted]
        results["not_run"] = {case_id(c[0], c[1]): f"left out by --only {args.only}" for c in cases if c not in keep}
        cases = keep
    listing = json.loads((bundle / "corpus-models.json").read_text())["models"]

    check = GpuCheck(kiln, helps["gpu-check"], device, env, run, out / "gpu-check.txt") if has["gpu_check"] else None
    compiled = compile_all(cases, models, work, kiln, env, run, log, has, on_gpu, device, listing, ref_outputs)
    refs_cache = {}
    for name, precision, source in cases:
        cid = case_id(name, precision)
        r = {"id": cid, "model": name, "precision": precision, "source": source,
             "batch": SYNTHETIC[name][1] if name in SYNTHETIC else 1}
        if budget.left() < 20:
            r["not_reached"] = "the run's time budget was spent"
            results["cases"].append(r)
            save()
            continue
        log.write(f"== {cid}", echo=True)
        t_case = time.monotonic()
        try:
            run_case(r, name, precision, source, models, work, kiln, env, run, log, budget, has, on_gpu, device,
                     listing, ref_outputs, refs_cache, torch, onnx2torch, torch_why, args.iterations, compiled)
        except (Exception, SystemExit) as e:  # nor a bug here, nor ref_outputs' exit on an input it has no rule for
            r.setdefault("errors", []).append(f"gpu_test.py: {type(e).__name__}: {e}")
        # A case whose kiln outputs are wrong (or whose run failed) is checked kernel by
        # kernel at once: that is what tells which kernel to look at.
        if check and "_check" in r and not r.get("correct", {}).get("ok"):
            check(r)
        r["seconds"] = round(time.monotonic() - t_case, 1)
        results["cases"].append(r)
        save()
        log.write(f"   {one_line(r)}", echo=True)

    # 2. kiln gpu-check, kernel by kernel, for the cases not checked yet, while time is left.
    if check:
        for r in results["cases"]:
            if "_check" in r and "gpu_check" not in r and budget.left() >= 30:
                check(r)
        check.file.close()
    else:
        results["meta"]["gpu_check"] = "this kiln has no gpu-check command"
    for r in results["cases"]:
        r.pop("_check", None)
    save()
    print_summary(results)
    shutil.rmtree(work, ignore_errors=True)


class GpuCheck:
    """`kiln gpu-check` (each kernel on the GPU against the kernel interpreter), called as its
    --help says: on the artifact where it takes one, else on the model with the case's
    bindings and precision; its whole output goes to gpu-check.txt."""

    def __init__(self, kiln, help_text: str, device: str, env: dict, run: Runner, path: Path):
        self.kiln, self.help, self.device, self.env, self.run = kiln, help_text, device, env, run
        self.file = open(path, "w")

    def __call__(self, r: dict) -> None:
        c = r["_check"]
        h = self.help
        if "ARTIFACT" in h or "MODEL" not in h:
            args = [self.kiln, "gpu-check", c["artifact"]]
        else:
            args = [self.kiln, "gpu-check", c["model"], *c["bind"]]
            if c["precision"] != "f32" and "--precision" in h:
                args += ["--precision", c["precision"]]
        if "--device" in h:
            args += ["--device", self.device]
        if "--input" in h:
            args += [x for n, p in c["inputs"] for x in ("--input", f"{n}={p}")]
        rc, o, e, dt = self.run(args, STEP_TIMEOUT["check"], env=self.env)
        self.file.write(f"== {r['id']}: {' '.join(map(str, args[1:]))}\nexit {rc} after {dt:.1f} s\n{o}{e}\n")
        self.file.flush()
        r["gpu_check"] = "passed" if rc == 0 else f"failed: {last_line(e or o, rc)}"


def case_config(name: str, source: str, listing: list, ref_outputs) -> dict:
    if source == "corpus":
        return corpus_cfg(listing, name, ref_outputs)
    return {**ref_outputs.MODELS.get(name, {}), **GPU_ONLY_TOLERANCE.get(name, {})}


# Tolerances of the models only this script builds. gemm4096_bf16's output is rounded to
# bf16: an f32 sum on either side of a rounding boundary of the f64 one moves it by one
# bf16 step (2⁻⁷ of the value at most), and the f32 sum's own error is far below
# 1e-5 of the largest output.
GPU_ONLY_TOLERANCE = {"gemm4096_bf16": {"rtol": 2.0**-7, "atol": 1e-5}}


def case_shapes(name: str, onnx_path: Path, cfg: dict, ref_outputs) -> dict:
    """The bound shape of every graph input (ref_outputs.py's rule), without drawing data."""
    import onnx
    model = onnx.load(str(onnx_path), load_external_data=False)
    return {v.name: ref_outputs.bind_shape(name, v, cfg) for v in ref_outputs.graph_inputs(model)}


def compile_command(kiln, onnx_path: Path, art: Path, shapes: dict, values: dict, precision: str, has: dict,
                    device: str, on_gpu: bool):
    """kiln compile's command for a case, or (None, why) when this kiln cannot compile it."""
    if has.get("broken"):
        return None, has["broken"]
    if on_gpu and not (has["target"] and has["device"]):
        return None, "not run: this kiln has no " + ("compile --target" if not has["target"] else "run --device")
    cmd = [kiln, "compile", onnx_path, "-o", art] + bind_args(shapes, values)
    if has["target"]:
        cmd += ["--target", device]
    if precision != "f32":
        if not has["precision"]:
            return None, f"not run: this kiln's compile has no --precision ({precision})"
        cmd += ["--precision", precision]
    return cmd, None


def no_ptxas_env(env: dict) -> dict:
    """ENV with no ptxas to be found: neither KILN_PTXAS nor a PATH entry holding one."""
    env2 = {k: v for k, v in env.items() if k != "KILN_PTXAS"}
    env2["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                   if not os.path.isfile(os.path.join(d, "ptxas")))
    return env2


def compile_all(cases, models, work, kiln, env, run, log, has, on_gpu, device, listing, ref_outputs) -> dict:
    """Every case's kiln compile (and the PTX-only compile of LOAD_CASES), several at a time
    before anything is timed: compiling is CPU work (ptxas included) that would otherwise
    sit between the GPU measurements one case at a time. {case id: result}."""
    jobs = []
    done = {}
    for name, precision, source in cases:
        cid = case_id(name, precision)
        onnx_path = models / f"{name}.onnx"
        if not onnx_path.is_file():
            continue
        try:
            cfg = case_config(name, source, listing, ref_outputs)
            shapes = case_shapes(name, onnx_path, cfg, ref_outputs)
        except BaseException as e:  # ref_outputs exits on an input it has no rule for
            done[cid] = {"why": f"inputs: {type(e).__name__}: {e}"}
            continue
        art = work / f"{cid.replace(':', '_')}.kiln"
        cmd, why = compile_command(kiln, onnx_path, art, shapes, cfg.get("values", {}), precision, has, device, on_gpu)
        if cmd is None:
            done[cid] = {"why": why}
            continue
        jobs.append((cid, "main", cmd, art, env))
        if on_gpu and env.get("KILN_PTXAS") and cid in LOAD_CASES:
            art2 = work / f"{cid.replace(':', '_')}-ptx.kiln"
            cmd2 = [art2 if x == art else x for x in cmd] + (["--cubin", "off"] if has.get("cubin_off") else [])
            jobs.append((cid, "ptx", cmd2, art2, no_ptxas_env(env)))

    def one(job):
        cid, kind, cmd, art, e = job
        rc, o, err, dt = run(cmd, STEP_TIMEOUT["compile"], env=e)
        return cid, kind, {"cmd": cmd, "art": art, "rc": rc, "stderr": err, "seconds": round(dt, 2)}

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(8, max(2, (os.cpu_count() or 2) // 2))) as pool:
        for cid, kind, res in pool.map(one, jobs):
            done.setdefault(cid, {})[kind] = res
    log.write(f"compiled {len(jobs)} artifacts in {time.monotonic() - t0:.1f} s", echo=True)
    return done


def bind_args(shapes: dict, values: dict) -> list:
    a = []
    for n, dims in shapes.items():
        if n not in values:
            a += ["--input-shape", f"{n}=" + ("x".join(map(str, dims)) or "scalar")]
    for n, v in values.items():
        a += ["--input-value", f"{n}={v}"]
    return a


def run_case(r, name, precision, source, models, work, kiln, env, run, log, budget, has, on_gpu, device, listing,
             ref_outputs, refs_cache, torch, onnx2torch, torch_why, iterations, compiled):
    import numpy as np
    errors = r.setdefault("errors", [])
    onnx_path = models / f"{name}.onnx"
    if not onnx_path.is_file():
        errors.append("model not built (gen_models.py failed: see gpu-log.txt)")
        return
    cfg = case_config(name, source, listing, ref_outputs)
    rtol, atol = cfg.get("rtol", ref_outputs.RTOL), cfg.get("atol", ref_outputs.ATOL)
    # Inputs and ONNX Runtime's outputs: once per model (shared by its precisions).
    if name not in refs_cache:
        t0 = time.monotonic()
        feeds, shapes, out_names = make_feeds(name, onnx_path, cfg, ref_outputs)
        d = work / "in" / name
        d.mkdir(parents=True, exist_ok=True)
        files = []
        for k, (n, a) in enumerate(feeds):
            p = d / f"in{k}_{file_stem(n)}.npy"  # numbered: two names may share a file stem
            np.save(p, a, allow_pickle=False)
            files.append((n, p))
        refs = numpy_reference(name, feeds, out_names) if name in NUMPY_REFERENCE else \
            ort_reference(onnx_path, feeds, out_names)
        # Kept for the model's other precisions; dropped when large (gemm4096: 192 MiB).
        size = sum(a.nbytes for _, a in feeds) + sum(a.nbytes for a in refs.values())
        if size + sum(v[5] for v in refs_cache.values()) > 2**30:
            refs_cache.clear()
        refs_cache[name] = (feeds, shapes, out_names, files, refs, size)
        r["ort_seconds"] = round(time.monotonic() - t0, 2)
    feeds, shapes, out_names, files, refs, _ = refs_cache[name]
    values = cfg.get("values", {})  # inputs bound as constants at compile time (silero_vad's sr)
    fed = [(n, p) for n, p in files if n not in values]
    r["inputs"] = {n: list(s) for n, s in shapes.items()}

    # kiln: compiled before (compile_all); run and compare, bench.
    comp = compiled.get(r["id"], {"why": "not compiled (see gpu-log.txt)"})
    main = comp.get("main")
    if main is None:
        errors.append(comp.get("why", "not compiled"))
        r["kiln_why"] = comp.get("why")
        return peer(r, torch, onnx2torch, torch_why, onnx_path, feeds, refs, out_names, precision, device,
                    iterations, budget, rtol, atol, errors)
    art = main["art"]
    r["compile_seconds"] = main["seconds"]
    if main["rc"] != 0:
        errors.append(f"kiln compile: {last_line(main['stderr'], main['rc'])}")
        r["kiln_why"] = "compile failed"
    else:
        r["artifact_bytes"] = art.stat().st_size
        r["_check"] = {"artifact": str(art), "model": str(onnx_path), "bind": bind_args(shapes, values),
                       "precision": precision, "inputs": [(n, str(p)) for n, p in fed]}
        dev_flag = ["--device", device] if has["device"] else []
        feed_args = [x for n, p in fed for x in ("--input", f"{n}={p}")]
        od = work / "out" / r["id"].replace(":", "_")
        od.mkdir(parents=True, exist_ok=True)
        rc, o, e, dt = run([kiln, "run", art, *dev_flag, *feed_args, "--output-dir", od], STEP_TIMEOUT["run"], env=env)
        r["run_process_seconds"] = round(dt, 3)  # the whole process: load, instantiate, one call, write
        if rc != 0:
            errors.append(f"kiln run: {last_line(e, rc)}")
        else:
            per = {}
            for n in out_names:
                p = od / f"{file_stem(n)}.npy"
                per[n] = compare(np.load(p), refs[n], precision, rtol, atol) if p.is_file() else \
                    {"ok": False, "why": f"kiln run wrote no {p.name}"}
            r["correct"] = merge_errors(per)
            if not r["correct"]["ok"]:
                errors.append(f"mismatch: {r['correct']['why']}")
        # Timed even when the outputs differ (the numbers say what a fix must keep).
        if rc == 0:
            bench(r, kiln, art, dev_flag, feed_args, run, env, has, work, iterations, errors)
        # Load time with PTX only: the same model compiled without ptxas, run once.
        if rc == 0 and "ptx" in comp:
            ptx_only(r, kiln, art, comp["ptx"], dev_flag, feed_args, run, env)
    peer(r, torch, onnx2torch, torch_why, onnx_path, feeds, refs, out_names, precision, device, iterations, budget,
         rtol, atol, errors)


# Names a `kiln bench` flag for device-resident inputs and outputs may have (the issue asks
# for such an API); the first one its --help shows is timed too.
RESIDENT_FLAGS = ["--device-resident", "--resident", "--on-device"]

# The cases whose artifact is also compiled without ptxas, to time loading PTX against cubin.
LOAD_CASES = {"mlp", "lenet", "mobilenet_v2", "bert_tiny:f16", "gemm4096_bf16"}


def bench(r, kiln, art, dev_flag, feed_args, run, env, has, work, iterations, errors):
    """kiln bench: a short probe for the call's length, then WARMUP + ITERATIONS calls (fewer
    when they would outlast CALL_CAP_S); every call's time with --samples."""
    base = [*dev_flag, *feed_args, "--json"]
    rc, o, e, _ = run([kiln, "bench", art, "--warmup", "3",
                       "--iterations", "5", *base], STEP_TIMEOUT["bench"], env=env)
    if rc != 0:
        errors.append(f"kiln bench: {last_line(e, rc)}")
        return
    try:
        probe = json.loads(o.strip().splitlines()[-1])
        one = probe["median_ms"] / 1e3
    except (ValueError, KeyError, IndexError) as x:
        errors.append(f"kiln bench: unreadable JSON ({x})")
        return
    n = iterations if one * iterations <= CALL_CAP_S else max(20, int(CALL_CAP_S / max(one, 1e-9)))
    warm = warmup_calls(one)
    samples = work / "samples.txt"
    extra = ["--samples", samples] if has["samples"] else []
    rc, o, e, dt = run([kiln, "bench", art, "--warmup", str(warm), "--iterations", str(n), *base,
                        *extra], STEP_TIMEOUT["bench"] + n * one * 2, env=env)
    if rc != 0:
        errors.append(f"kiln bench: {last_line(e, rc)}")
        return
    try:
        j = json.loads(o.strip().splitlines()[-1])
    except (ValueError, IndexError) as x:
        errors.append(f"kiln bench: unreadable JSON ({x})")
        return
    k = {key: v for key, v in j.items() if key != "model"}
    if has["samples"] and samples.is_file():
        k.update(stats([float(l.split()[0]) for l in samples.read_text().splitlines() if l.strip()]))
    k["iterations"], k["warmup"] = n, warm
    if n < 200:
        k["capped"] = f"{n} calls (a call takes {one * 1e3:.1f} ms; {CALL_CAP_S:.0f} s cap)"
    r["kiln"] = k
    if has["resident"]:
        rc, o, e, _ = run([kiln, "bench", art, has["resident"], "--warmup", str(warm), "--iterations", str(n), *base],
                          STEP_TIMEOUT["bench"] + n * one * 2, env=env)
        try:
            j = json.loads(o.strip().splitlines()[-1]) if rc == 0 else None
        except (ValueError, IndexError):
            j = None
        r["kiln_resident"] = {key: v for key, v in j.items() if key != "model"} if j else \
            {"why": f"kiln bench {has['resident']}: {last_line(e, rc)}"}
    # A rate target: the product's own time too (`--profile`: each command launched and
    # waited for alone; the slowest is the product), besides the whole call's.
    if "tflops" in TARGETS.get(r["id"], {}):
        rc, o, e, _ = run([kiln, "bench", art, "--profile", "--warmup", "3", "--iterations", "50", *base],
                          STEP_TIMEOUT["bench"] + 100 * one, env=env)
        try:
            rows = json.loads(o.strip().splitlines()[-1])["profile"] if rc == 0 else []
        except (ValueError, IndexError, KeyError):
            rows = []
        if rows:
            top = max(rows, key=lambda x: x["median_us"])
            r["kiln_product"] = {"what": top["what"], "median_us": top["median_us"], "commands": len(rows)}
        else:
            r["kiln_product"] = {"why": f"kiln bench --profile: {last_line(e, rc)}"}


def ptx_only(r, kiln, art, ptx, dev_flag, feed_args, run, env):
    """Load and one call of the artifact as compiled and of its PTX-only twin (compiled with
    no ptxas to be found), each a process of its own."""
    if ptx["rc"] != 0:
        r["load"] = {"why": f"PTX-only compile: {last_line(ptx['stderr'], ptx['rc'])}"}
        return
    art2 = ptx["art"]
    load = {"cubin_artifact_bytes": art.stat().st_size, "ptx_artifact_bytes": art2.stat().st_size}
    if load["cubin_artifact_bytes"] == load["ptx_artifact_bytes"]:
        load["note"] = "both artifacts have the same size: either no cubin was made at all, or kiln found a ptxas anyway"
    for label, a in (("cubin", art), ("ptx", art2)):
        rc, o, e, dt = run([kiln, "bench", a, *dev_flag, *feed_args, "--warmup", "0", "--iterations",
                            "1", "--json"], STEP_TIMEOUT["run"], env=env)
        try:
            j = json.loads(o.strip().splitlines()[-1]) if rc == 0 else {}
        except (ValueError, IndexError):
            j = {}
        # Whatever kiln bench reports about loading (field names are the runtime's).
        load[label] = {k: v for k, v in j.items() if re.search(r"load|instantiate|graph|module|cubin|ptx|variant", k)}
        # The whole process (start, load, instantiate, one call): PTX's JIT shows here
        # even where kiln bench reports no load time of its own.
        load[label]["process_s"] = round(dt, 3)
        if rc != 0:
            load[label]["why"] = last_line(e, rc)
    r["load"] = load


def peer(r, torch, onnx2torch, torch_why, onnx_path, feeds, refs, out_names, precision, device, iterations, budget,
         rtol, atol, errors):
    if torch_why:
        r["torch_why"] = torch_why
        return
    try:
        r["torch"] = torch_peer(torch, onnx2torch, onnx_path, feeds, refs, out_names, precision, device, iterations,
                                budget, rtol, atol)
    except Exception as e:
        msg = str(e).strip().splitlines()
        r["torch_why"] = f"{type(e).__name__}: {msg[0][:300] if msg else ''}"
    finally:
        if torch is not None and device != "cpu":
            try:
                torch.cuda.empty_cache()
            except Exception:
                pass


def one_line(r) -> str:
    k = r.get("kiln", {})
    t = r.get("torch", {})
    c = r.get("correct", {})
    parts = [("ok" if c.get("ok") else "MISMATCH") if c else "no check"]
    if "rel_l2" in c:
        parts.append(f"relL2 {c['rel_l2']:.1e}")
    if k:
        parts.append(f"kiln {k['median_ms']:.4f} ms")
    if t.get("graph"):
        parts.append(f"torch graph {t['graph']['median_ms']:.4f} ms")
    elif t.get("eager"):
        parts.append(f"torch eager {t['eager']['median_ms']:.4f} ms")
    if r.get("errors"):
        parts.append("errors: " + " | ".join(r["errors"])[:200])
    return "; ".join(parts)


def fmt(x, digits=4):
    return "—" if x is None else f"{x:.{digits}f}"


def verdict(r) -> tuple:
    """(measured text, target text, met) for a case with a target, else None."""
    t = TARGETS.get(r["id"])
    if not t:
        return None
    k = r.get("kiln")
    if "tflops" in t:
        lo, hi = t["tflops"]
        if not k:
            return ("not measured", f"≥ {lo} TFLOP/s (mma.sync), ≥ {hi} (wgmma)", None)
        kr = r.get("kiln_resident") or {}
        kp = r.get("kiln_product") or {}
        if "median_us" in kp:
            rate = t["flop"] / (kp["median_us"] * 1e-6) / 1e12
            whole = f"; whole call with the data on the device {t['flop'] / (kr['median_ms'] * 1e-3) / 1e12:.1f}" \
                if "median_ms" in kr else ""
            return (f"{rate:.1f} TFLOP/s (the product's kernel alone, launch and wait included{whole})",
                    f"≥ {lo} (mma.sync) / ≥ {hi} (wgmma)", rate >= lo)
        if "median_ms" in kr:
            rate = t["flop"] / (kr["median_ms"] * 1e-3) / 1e12
            return (f"{rate:.1f} TFLOP/s (data on the device)", f"≥ {lo} (mma.sync) / ≥ {hi} (wgmma)", rate >= lo)
        rate = t["flop"] / (k["median_ms"] * 1e-3) / 1e12
        return (f"{rate:.1f} TFLOP/s (copies included)", f"≥ {lo} (mma.sync) / ≥ {hi} (wgmma)", rate >= lo)
    # The latency figures are PyTorch's CUDA graph replayed on the device: kiln's
    # like figure is its graph with the data on the device (`--resident`); host to host
    # is given beside it.
    kr = r.get("kiln_resident") or {}
    if "median_ms" in kr:
        ok = kr["median_ms"] <= t["ms"] and r.get("correct", {}).get("ok", False)
        host = f"; host to host {k['median_ms']:.4f}" if k else ""
        return (f"{kr['median_ms']:.4f} ms (data on the device{host})", f"≤ {t['ms']} ms", ok)
    if not k:
        return ("not measured", f"≤ {t['ms']} ms", None)
    ok = k["median_ms"] <= t["ms"] and r.get("correct", {}).get("ok", False)
    return (f"{k['median_ms']:.4f} ms (host to host)", f"≤ {t['ms']} ms", ok)


def print_summary(results) -> None:
    """The table printed last (the device tool returns the end of the output)."""
    m = results["meta"]
    lines = ["", f"== {m['bundle'].get('kiln_version', 'kiln ?')} on {m.get('gpu', '?')} (driver {m.get('driver', '?')}), "
                 f"torch {m.get('torch', '—')}, ORT {m.get('onnxruntime', '?')}"]
    if m.get("torch_why"):
        lines.append(f"   PyTorch peer: not available ({m['torch_why']})")
    fails = [r for r in results["cases"] if r.get("errors") or r.get("torch_why") and not m.get("torch_why")]
    if fails:
        lines.append("failures:")
        for r in fails:
            msg = " | ".join(r.get("errors", []) + ([f"torch: {r['torch_why']}"] if r.get("torch_why") and not m.get("torch_why") else []))
            lines.append(f"  {r['id']}: {msg[:160]}")
    nr = [r["id"] for r in results["cases"] if r.get("not_reached")]
    if nr:
        lines.append(f"not reached (time budget): {', '.join(nr)}")
    lines.append(f"{'case':26} {'check':9} {'relL2':>8} {'kiln med':>9} {'p99':>9} {'eager':>9} {'graph':>9} "
                 f"{'k/graph':>7} {'target':>8} met")
    for r in results["cases"]:
        if r.get("not_reached"):
            continue
        c, k, t = r.get("correct", {}), r.get("kiln", {}), r.get("torch", {})
        check = ("ok" if c.get("ok") else "MISMATCH") if c else ("FAIL" if r.get("errors") else "—")
        g = (t.get("graph") or {}).get("median_ms")
        e = (t.get("eager") or {}).get("median_ms")
        ratio = f"{k['median_ms'] / g:.2f}" if k and g else "—"
        v, t_ = verdict(r), TARGETS.get(r["id"], {})
        tgt = f"<={t_['ms']}" if "ms" in t_ else (f">={t_['tflops'][0]}TF" if "tflops" in t_ else "")
        met = "" if not v else ("yes" if v[2] else ("no" if v[2] is False else "—"))
        if v and "TFLOP" in v[0]:
            met += f" ({v[0]})"
        lines.append(f"{r['id'][:26]:26} {check:9} {sci(c.get('rel_l2')):>8} {fmt(k.get('median_ms')):>9} "
                     f"{fmt(k.get('p99_ms')):>9} {fmt(e):>9} {fmt(g):>9} {ratio:>7} {tgt:>8} {met}")
    lines.append("ms per call, host to host (inputs copied in, outputs copied out); graph = PyTorch CUDA-graph replay; "
                 "full numbers: $OUT/gpu-results.json")
    print("\n".join(lines), flush=True)


# --- report (here) ------------------------------------------------------------------


def run_line(m) -> str:
    """One run's machine, versions and bundle, as the page's header says them."""
    return (f"{m.get('date', '?')}: {m.get('gpu', '?')}, driver {m.get('driver', '?')}, {m.get('cpus', '?')} host "
            f"cores; {m['bundle'].get('kiln_version', 'kiln ?')} (commit {m['bundle'].get('commit', '?')}), "
            f"PyTorch {m.get('torch', 'not available')}, ONNX Runtime {m.get('onnxruntime', '?')}, "
            f"ptxas: {m.get('ptxas', '?')}. Bundle set `{m['bundle'].get('set')}`"
            + (f" part {m['bundle']['part']}" if m["bundle"].get("part") else ""))


def merge_results(paths) -> dict:
    """The results of one or more runs (one device call each: the device tool carries
    64 MiB a call, so the corpus takes several) as one: the cases of every run, each
    marked with its run's number; a case in several runs is the last run's. What some
    run left out but another ran is not reported as left out."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    if len(runs) == 1:
        return runs[0]
    res = {"meta": dict(runs[0]["meta"]), "cases": [], "left_out": {}, "not_run": {}, "runs": []}
    gaps = {}
    by_id = {}
    for i, r in enumerate(runs, 1):
        res["runs"].append({"meta": r["meta"], "ids": [c["id"] for c in r["cases"]]})
        gaps.update(r["meta"].get("known_gaps") or {})
        for c in r["cases"]:
            by_id[c["id"]] = {**c, "run": i}
        res["left_out"].update(r.get("left_out") or {})
        res["not_run"].update(r.get("not_run") or {})
    res["cases"] = list(by_id.values())
    ran = {c["model"] for c in res["cases"]} | set(by_id)
    res["left_out"] = {n: why for n, why in res["left_out"].items() if n not in ran}
    res["not_run"] = {n: why for n, why in res["not_run"].items() if n not in ran}
    res["meta"]["known_gaps"] = gaps
    return res


def report(args) -> None:
    res = merge_results(args.results)
    m = res["meta"]
    cases = res["cases"]
    label = lambda r: f"{r['id']} ({r['run']})" if r.get("run") else r["id"]
    L = []
    w = L.append
    w("# Benchmarks on a GPU: kiln beside PyTorch\n")
    if res.get("runs"):
        w(f"Written by `scripts/gpu-test report` from {len(res['runs'])} runs of `scripts/gpu-test` (one device "
          "call each; a case's run is the number after its name in the tables):\n")
        for i, r in enumerate(res["runs"], 1):
            w(f"{i}. {run_line(r['meta'])}; cases: {', '.join(r['ids'])}.")
        w("")
    else:
        w(f"Written by `scripts/gpu-test report` from a run of `scripts/gpu-test` on {run_line(m)}.\n")
    if m.get("device") == "cpu":
        w("**This is a dry run on the CPU (`KILN_GPU_TEST_DEVICE=cpu`), not a GPU measurement.**\n")
    w("**What is timed.** Per call, host memory to host memory, for both engines: kiln's `kiln bench` times "
      "`invoke` (inputs copied to the device, the plan's graph launched, outputs copied back, one synchronisation); "
      "PyTorch (the same ONNX model converted by onnx2torch, on the same inputs) times, with `perf_counter` around "
      "each call, the inputs' copy to the device (and cast to the precision there), the forward, and the outputs' "
      "copy back (`.cpu()`, which waits for the device): eager, and a CUDA graph of the forward replayed between "
      f"the same copies. {WARMUP} warm-up calls, then {ITERATIONS} timed calls unless that would take more than "
      f"{CALL_CAP_S:.0f} s (the count is then given). Median, p99 (nearest rank) and stddev of the timed calls. "
      "'graph, device' is the graph replayed back to back with the data on the device (CUDA events), PyTorch's "
      "own floor without copies. Ratio = kiln median / PyTorch CUDA-graph median (below 1: kiln is faster). "
      "PyTorch runs f32 without TF32 (as kiln), f16/bf16 by casting the module and the float inputs; "
      "onnx2torch's small integer constants (shapes) stay in host memory where the model allows, since its "
      "Reshape reads them on the host (on the device each read is a synchronisation and breaks graph capture).\n")
    w("**Correctness.** Every case's outputs against ONNX Runtime on the CPU (no graph optimisations) on the same "
      "seeded inputs (`scripts/ref_outputs.py`'s rules; the corpus listing's `data` rules). f32: the repository's "
      "rule, |kiln − ORT| ≤ atol·max|ORT| + rtol·|ORT| per element (rtol 1e-4, atol 1e-5 unless the model states "
      f"its own); f16/bf16: relative L2 error ≤ {HALF_REL_L2['f16']:g} / {HALF_REL_L2['bf16']:g} against the f32 "
      "reference. 'rel L2' and 'max abs' are the worst over the outputs. PyTorch's own error, at the same "
      "precision, is given beside kiln's.\n")

    w("## The issue's targets\n")
    w("| target | case | kiln | PyTorch CUDA graph (this run) | PyTorch (issue) | met |")
    w("|---|---|---:|---:|---:|---|")
    by_id = {r["id"]: r for r in cases}
    for cid, t in TARGETS.items():
        r = by_id.get(cid)
        tgt = (f"≥ {t['tflops'][0]} TFLOP/s (mma.sync), ≥ {t['tflops'][1]} (wgmma)" if "tflops" in t
               else f"≤ {t['ms']} ms")
        if r is None:
            why = res.get("not_run", {}).get(cid) or f"not in this run's bundle (set {m['bundle'].get('set')})"
            w(f"| {tgt} | {cid} | not measured ({why}) | | {t.get('torch', '—')} | — |")
            continue
        v = verdict(r)
        if v[0] == "not measured":
            why = r.get("not_reached") or "; ".join(r.get("errors", [])) or "no timing"
            meas = f"not measured ({why})"
        else:
            meas = v[0]
            if r.get("correct") and not r["correct"].get("ok"):
                meas += " (outputs wrong)"
        g = (r.get("torch") or {}).get("graph")
        if "tflops" in t and g:
            gt = f"{t['flop'] / (g['median_ms'] * 1e-3) / 1e12:.1f} TFLOP/s"
            if r["torch"].get("graph_device_ms"):
                gt += f" ({t['flop'] / (r['torch']['graph_device_ms'] * 1e-3) / 1e12:.1f} on device)"
        elif g:
            gd = r["torch"].get("graph_device_ms")
            gt = (f"{gd:.4f} ms (on the device; host to host {g['median_ms']:.4f})" if gd
                  else f"{g['median_ms']:.4f} ms (host to host)")
        elif m.get("torch_why"):
            gt = "not available"
        else:
            gt = "not measured: " + (r.get("torch_why") or (r.get("torch") or {}).get("graph_why", "—"))
        met = "yes" if v[2] else ("no" if v[2] is False else "not measured")
        w(f"| {tgt} | {label(r)} | {meas} | {gt} | {t.get('torch', '—')} | {met} |")
    w("")
    w("Latency targets compare kiln's graph with the data on the device (`kiln bench --device cuda --resident`: "
      "one graph launch and one synchronisation per call) with the issue's figure, which is PyTorch's CUDA graph "
      "replayed on the device; the host-to-host figures (inputs copied in, outputs copied out) are beside them. "
      "Latency targets count as met only when the outputs also match. gemm4096_bf16's rate is 2·4096³ over the "
      "median time of its product's kernel (`kiln bench --profile`: launched and waited for alone, so a launch "
      "and a synchronisation are included; the two casts to bf16 in front of it are not), with the whole call's "
      "rate with the data on the device beside it; PyTorch's over its host-to-host call and (in brackets) its "
      "graph replayed back to back on the device, casts included.\n")

    gaps = res["meta"].get("known_gaps") or {}
    w("## Every case\n")
    if gaps:
        w("Marked †: a known gap of the CPU suite too (crates/kiln-cli/tests/models.rs `KNOWN_GAPS`: "
          + ", ".join(sorted(gaps)) + "), so a failure there is not the GPU's.\n")
    w("'load ms' is kiln's module load and graph build (`kiln bench --json`: `module_load_ms` + "
      "`graph_build_ms`) of the artifact as compiled, its code form beside it (cubin where ptxas was found at "
      "compile time); the cubin/PTX comparison is the load-time section below.\n")
    w("| case | batch | correct | rel L2 | max abs | kiln median ms | p99 | stddev | calls | PyTorch eager | "
      "PyTorch graph | graph, device | ratio | PyTorch rel L2 | load ms |")
    w("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in cases:
        if r.get("not_reached"):
            w(f"| {label(r)} | {r.get('batch', 1)} | not run: {r['not_reached']} | | | | | | | | | | | | |")
            continue
        c, k, t = r.get("correct", {}), r.get("kiln", {}), r.get("torch", {})
        corr = ("yes" if c.get("ok") else "**no**") if c else ("not checked: " + ("; ".join(r.get("errors", [])) or "—"))
        e, g = (t.get("eager") or {}).get("median_ms"), (t.get("graph") or {}).get("median_ms")
        ratio = f"{k['median_ms'] / g:.2f}" if k and g else "—"
        tc = t.get("correct", {})
        w(f"| {label(r)}{' †' if r['model'] in gaps else ''} | {r.get('batch', 1)} | {corr} | {sci(c.get('rel_l2'))} | {sci(c.get('max_abs'))} | "
          f"{fmt(k.get('median_ms'))} | {fmt(k.get('p99_ms'))} | {fmt(k.get('stddev_ms'))} | "
          f"{k.get('iterations', '—')} | {fmt(e)} | {fmt(g)} | {fmt(t.get('graph_device_ms'))} | {ratio} | "
          f"{sci(tc.get('rel_l2')) if tc else '—'} | {load_cell(k)} |")
    w("")
    resident = [r for r in cases if (r.get("kiln_resident") or {}).get("median_ms")]
    if resident:
        w("## With the data on the device\n")
        w("kiln's graph with inputs and outputs left on the device (`kiln bench --device cuda --resident`: one "
          "graph launch and one synchronisation per call) beside PyTorch's CUDA graph replayed back to back on "
          "the device (CUDA events). ms per call.\n")
        w("| case | kiln median | p99 | stddev | PyTorch graph, device | ratio |")
        w("|---|---:|---:|---:|---:|---:|")
        for r in resident:
            kr, gd = r["kiln_resident"], (r.get("torch") or {}).get("graph_device_ms")
            ratio = f"{kr['median_ms'] / gd:.2f}" if gd else "—"
            w(f"| {label(r)} | {fmt(kr['median_ms'])} | {fmt(kr.get('p99_ms'))} | {fmt(kr.get('stddev_ms'))} | "
              f"{fmt(gd)} | {ratio} |")
        w("")
    loads = [r for r in cases if r.get("load")]
    w("## Load time: cubin against PTX\n")
    if loads:
        w("The artifact as compiled (cubin beside PTX, where ptxas was found at compile time) and the same model "
          "compiled with no ptxas to be found (PTX only, compiled by the driver at load). Fields as `kiln bench "
          "--json` reports them, and process_s: the wall time of one whole `kiln bench --iterations 1` process "
          "(start, load, instantiate, one call). 'run process' is that of the case's `kiln run` (outputs "
          "written too).\n")
        w("| case | cubin artifact bytes | PTX artifact bytes | with cubin | PTX only | run process s |")
        w("|---|---:|---:|---|---|---:|")
        for r in loads:
            ld = r["load"]
            if "why" in ld:
                w(f"| {r['id']} | | | not measured: {ld['why']} | | {r.get('run_process_seconds', '—')} |")
                continue
            show = lambda d: ", ".join(f"{k} {v}" for k, v in d.items()) or "not reported by kiln bench --json"
            w(f"| {r['id']} | {ld['cubin_artifact_bytes']} | {ld['ptx_artifact_bytes']} | {show(ld['cubin'])} | "
              f"{show(ld['ptx'])} | {r.get('run_process_seconds', '—')} |")
        notes = sorted({r["load"]["note"] for r in loads if r["load"].get("note")})
        for n in notes:
            w(f"\nNote: {n}.")
    else:
        why = ("a CPU dry run has no PTX" if m.get("device") == "cpu" else
               "no ptxas was found on the device machine" if "none found" in str(m.get("ptxas")) else
               f"none of {', '.join(sorted(LOAD_CASES))} compiled and ran")
        w(f"Not measured: {why}.\n")
    w("")
    # A reason shared by every case (PyTorch missing) is said once.
    own_torch_why = lambda r: r.get("torch_why") if r.get("torch_why") != m.get("torch_why") else None
    bad = [r for r in cases if r.get("errors") or own_torch_why(r) or (r.get("torch") or {}).get("graph_why")]
    if bad or m.get("torch_why"):
        w("## Failures and gaps\n")
        if m.get("torch_why"):
            w(f"- PyTorch: not available in this run ({m['torch_why']}); its columns are empty.")
        for r in bad:
            for e in r.get("errors", []):
                w(f"- {r['id']}: {e}")
            if own_torch_why(r):
                w(f"- {r['id']}, PyTorch: {r['torch_why']}")
            if (r.get("torch") or {}).get("graph_why"):
                w(f"- {r['id']}, PyTorch CUDA graph: {r['torch']['graph_why']}")
        w("")
    if res.get("left_out") or res.get("not_run"):
        w("## Not in this run\n")
        by_why = {}
        for n, why in {**res.get("left_out", {}), **res.get("not_run", {})}.items():
            by_why.setdefault(why, []).append(n)
        for why, names in by_why.items():
            w(f"- {', '.join(names)}: {why}" if len(names) > 1 else f"- {names[0]}: {why}")
        w("")
    checked = [r for r in cases if r.get("gpu_check")]
    if checked:
        w("## kiln gpu-check\n")
        w("Each kernel on the GPU against the kernel interpreter (full output: gpu-check.txt of the run).\n")
        for r in checked:
            w(f"- {r['id']}: {r['gpu_check']}")
        w("")
    elif m.get("gpu_check"):
        w(f"kiln gpu-check: {m['gpu_check']}.\n")
    text = "\n".join(L).rstrip() + "\n"
    Path(args.out).write_text(text)
    print(f"{args.out} written", file=sys.stderr)


def load_cell(k) -> str:
    """A case's module load + graph build in ms and the code form loaded, from `kiln bench --json`."""
    ml, gb = k.get("module_load_ms"), k.get("graph_build_ms")
    if ml is None or gb is None:
        return "—"
    form = f" ({k['code']})" if k.get("code") else ""
    return f"{ml:.2f} + {gb:.2f}{form}"


def sci(x):
    return "—" if x is None else f"{x:.1e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="gather the bundle (here)")
    p.add_argument("--set", choices=["core", "corpus"], default="core")
    p.add_argument("--part", type=int, default=1, help="with --set corpus: which part (each fits one call)")
    p.add_argument("--models", help="exactly these models (synthetic names or carried ones), comma separated")
    p.add_argument("--bundle", default=".gpu", help="the bundle folder, relative to the repository root")
    p.add_argument("--root", default=str(HERE.parent))
    p.add_argument("--kiln", required=True, help="the kiln binary (a release build)")
    p.add_argument("--max-mb", type=float, help="at most this many MiB of carried models")
    p = sub.add_parser("run", help="run the cases (on the GPU machine)")
    p.add_argument("--only", help="case ids or model names, comma separated")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("GPU_TEST_BUDGET_S", 480)))
    p.add_argument("--iterations", type=int, default=ITERATIONS)
    p = sub.add_parser("report", help="write the page from a results JSON (here)")
    p.add_argument("results", nargs="+", help="gpu-results.json of one or more runs (merged: see merge_results)")
    p.add_argument("--out", default=str(HERE.parent / "docs" / "benchmarks-gpu.md"))
    args = ap.parse_args()
    {"prepare": prepare, "run": run_device, "report": report}[args.cmd](args)


if __name__ == "__main__":
    main()
