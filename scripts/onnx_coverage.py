"""Writes docs/onnx-coverage.md: the ONNX 1.17 node suite per operator, through
kiln's compiled path, beside the published totals of peers on the same suite.

    .venv/bin/python scripts/onnx_coverage.py --kiln PATH/TO/kiln --cases .cache/onnx-node

Each case is attributed to the operator its name starts with (the longest ONNX
operator name, in snake case, that prefixes the case name), so `_expanded` variants
count for the operator they expand.
"""
import argparse
import collections
import re
import os
import subprocess
import sys

import onnx.defs


def snake(name):
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    s = re.sub(r"(?<=[A-Z])([A-Z][a-z])", r"_\1", s)
    return s.lower()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", default="docs/onnx-coverage.md")
    a = ap.parse_args()
    run = subprocess.run([a.kiln, "conformance", a.cases, "--engine", "compiled", "--verbose"],
                         capture_output=True, text=True, check=True)
    # The count: only integer inputs of at most 16 elements bound (shapes, axes,
    # sizes, k), every other input run-time data (conformance.rs, import_specialised).
    strict = subprocess.run([a.kiln, "conformance", a.cases, "--engine", "compiled"],
                            capture_output=True, text=True, check=True,
                            env={**os.environ, "KILN_CONFORMANCE_BINDING": "strict"})
    strict_cats = collections.Counter()
    for line in strict.stdout.splitlines():
        if line.startswith("1288 cases") or " cases (engine" in line:
            for part in line.split(": ", 1)[1].split(", "):
                k, v = part.rsplit(" ", 1)
                strict_cats[k] = int(v)
    strict_passed = strict_cats["pass"] + strict_cats["pass-specialised"]
    ops = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        for key in {snake(schema.name), schema.name.lower()}:
            ops.setdefault(key, schema.name)
    # Case names that do not start with their operator's name.
    aliases = {"and": "And", "or": "Or", "xor": "Xor", "basic_conv": "Conv",
               "basic_deform_conv": "DeformConv", "batchnorm": "BatchNormalization",
               "instancenorm": "InstanceNormalization", "edge_pad": "Pad", "reflect_pad": "Pad",
               "wrap_pad": "Pad", "loop": "Loop", "scan": "Scan", "mvn": "MeanVarianceNormalization",
               "nesterov_momentum": "Momentum", "nllloss": "NegativeLogLikelihoodLoss",
               "sce": "SoftmaxCrossEntropyLoss", "tril": "Trilu", "triu": "Trilu",
               "strnormalizer": "StringNormalizer", "training_dropout": "Dropout",
               "simple_rnn": "RNN"}
    keys = sorted(ops, key=len, reverse=True)
    alias_keys = sorted(aliases, key=len, reverse=True)
    per_op = collections.defaultdict(lambda: [0, 0])
    cats = collections.Counter()
    for line in run.stdout.splitlines():
        if not line.startswith("test_") or ": " not in line:
            continue
        name, rest = line.split(": ", 1)
        cat = rest.split(":")[0].strip()
        cats[cat] += 1
        bare = name[len("test_"):].removeprefix("ai_onnx_ml_")
        op = next((ops[k] for k in keys if bare == k or bare.startswith(k + "_")), None)
        op = op or next((aliases[k] for k in alias_keys if bare.startswith(k)), bare)
        per_op[op][1] += 1
        if cat in ("pass", "pass-specialised"):
            per_op[op][0] += 1
    total = sum(cats.values())
    passed = cats["pass"] + cats["pass-specialised"]
    out = []
    out.append("# ONNX node conformance\n")
    out.append("The 1,288 node tests of the `onnx==1.17.0` wheel through kiln's whole compiled path: "
               "import → compile → `.kiln` file → load → run, compared with ONNX's expected outputs "
               "(rtol 1e-3, atol 1e-7; integers and bools exact). Regenerate with "
               "`.venv/bin/python scripts/onnx_coverage.py --kiln target/debug/kiln --cases .cache/onnx-node`; "
               "the test `crates/kiln-cli/tests/onnx_node.rs` holds the same numbers to "
               "`crates/kiln-cli/tests/data/onnx-node.expected`.\n")
    out.append("| | passing | of |\n|---|---:|---:|")
    out.append(f"| **kiln (compiled, CPU)** | **{passed}** | {total} |")
    out.append(f"| kiln, binding only integer inputs of ≤ 16 elements | {strict_passed} | {total} |")
    out.append("| IREE 3.13 llvm-cpu (published) | 841 | 1,287 |")
    out.append("| tract (published) | about 903 | |\n")
    out.append("Categories: " + ", ".join(f"{k} {v}" for k, v in sorted(cats.items())) + ".\n")
    out.append("`pass-specialised`: the case feeds an operand kiln needs at compile time (axes, a shape, "
               "`k`) as a graph input; the harness binds the small inputs to their test values, as a user "
               "would with `--input-value`, and the case then passes. The first row binds every input "
               "of at most 64 elements (and every scalar); the second (`KILN_CONFORMANCE_BINDING=strict "
               "kiln conformance …`) binds only integer inputs of at most 16 elements, every float or "
               "bool input run-time data. Results whose dims run-time data decides (Resize and Upsample "
               "with run-time `scales`, OneHot with a run-time `depth`, Range over run-time floats) are "
               "compiled for the shape the model declares for them and checked on every call "
               "(`RuntimeError::ShapeCheck`, `--output-shape` to declare another; see "
               "`docs/dynamic-outputs.md`); a run-time `roi` needs no check. The harness passes nothing "
               "for them, so they count under both rules. The cases that pass only under the first rule "
               "are Dropout with a run-time `training_mode`, Loops whose trip count or condition is "
               "run-time data (and the expanded Range, which is such a Loop), and an If whose branches "
               "give different optional kinds.\n")
    out.append("| operator | passed | total |\n|---|---:|---:|")
    for op in sorted(per_op, key=str.lower):
        p, t = per_op[op]
        mark = "" if p == t else " ⚠" if p else " ✗"
        out.append(f"| {op}{mark} | {p} | {t} |")
    # Why the operators that do not pass every case stay so (operators not named here are
    # other engineers' work in progress or not implemented yet).
    reasons = {
        "Bernoulli": "random: ONNX's data comes from NumPy's generator, which a kernel cannot reproduce",
        "Dropout": "training mode with a non-zero ratio draws a random mask (NumPy's generator made the data); "
                   "ratio 0 and inference pass",
        "Cast": "string dtypes (kiln has no string tensors); FLOAT to BFLOAT16: ONNX's data truncates, "
                "the spec rounds to nearest even",
        "CastLike": "as Cast",
        "Equal": "string inputs",
        "StringConcat": "string tensors", "StringSplit": "string tensors",
        "StringNormalizer": "string tensors", "RegexFullMatch": "string tensors",
        "LabelEncoder": "string keys or values",
        "ImageDecoder": "decodes encoded image bytes (a codec, not tensor math)",
        "DFT": "inverse cases: ONNX's data holds f32 FFT noise (1.9e-7) where the exact value is 0, "
               "beyond atol 1e-7",
        "Adam": "adam_multiple: ONNX's data was made with epsilon 1e-2, the node has none (default 0)",
        "QLinearMatMul": "int8 cases: ONNX's data wraps to int8, the spec saturates",
        "NonZero": "data-dependent output size (work in progress elsewhere)",
        "Unique": "data-dependent output size (work in progress elsewhere)",
        "Compress": "data-dependent output size (work in progress elsewhere)",
        "NonMaxSuppression": "data-dependent output size (work in progress elsewhere)",
        "Scan": "sequences and loops (work in progress elsewhere)",
        "Loop": "sequences and optionals (work in progress elsewhere)",
        "If": "sequences and optionals (work in progress elsewhere)",
        "Identity": "sequence and optional inputs (work in progress elsewhere)",
    }
    short = [op for op in sorted(per_op, key=str.lower) if per_op[op][0] < per_op[op][1]]
    out.append("\n## Not passing, and why\n")
    out.append("| operator | failing | why |\n|---|---:|---|")
    for op in short:
        p, t = per_op[op]
        why = reasons.get(op) or ("sequences and optionals (work in progress elsewhere)"
                                  if op.startswith(("Sequence", "Optional", "SplitToSequence", "ConcatFromSequence"))
                                  else "not implemented yet")
        out.append(f"| {op} | {t - p} | {why} |")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"{a.out}: {passed} of {total} pass", file=sys.stderr)


if __name__ == "__main__":
    main()
