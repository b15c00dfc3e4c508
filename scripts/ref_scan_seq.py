#!/usr/bin/env python3
"""Synthetic Scan and sequence models and ONNX Runtime's outputs.

    ref_scan_seq.py --cache .cache

Writes, for every model in MODELS,

    CACHE/scan-seq/NAME.onnx
    CACHE/scan-seq/NAME/CASE.in_K[_I].npy, CASE.out_K[_I].npy   (graph input / output order;
                                                                  _I: element I of a sequence)
    CACHE/scan-seq/manifest.json                                 (models, cases)

In the manifest an input or output is a list of files: one for a tensor, one per
element for a sequence (`"sequence": true`). ONNX Runtime runs on the CPU with graph
optimisations disabled and one thread. Needs the .venv of setup-test-data.
`crates/kiln-cli/tests/scan_seq.rs` reads the manifest.
"""

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from refio import cache_arg, checked_model, const, ort_generator, ort_suite, save_arrays, save_npy, write_json

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def model(nodes, inputs, outputs, inits, name, opset):
    return checked_model(nodes, inputs, outputs, inits, name, "kiln-scan-seq", opset)


def scan_rnn():
    """An Elman-style recurrence as an opset-16 Scan: two state variables, two scan
    inputs (one scanned along axis 1 and backwards), two scan outputs (one stacked
    along axis 1 and backwards). The body holds a run-time If (on the sign of the new
    state, so trips take different branches) and a nested Scan (a running sum over the
    new state's elements) and reads a weight from the enclosing graph."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((4, 4)) * 0.6).astype(np.float32)
    inner = helper.make_graph(
        [helper.make_node("Add", ["s_in", "e"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["s_scan"])],
        "cumsum",
        [vi("s_in", []), vi("e", [])],
        [vi("s_out", []), vi("s_scan", [])],
    )
    then = helper.make_graph([helper.make_node("Mul", ["h_new", "two"], ["y_then"])], "pos", [], [vi("y_then", [4])])
    els = helper.make_graph([helper.make_node("Neg", ["h_new"], ["y_else"])], "neg", [], [vi("y_else", [4])])
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h_in", "w"], ["hw"]),
            helper.make_node("Mul", ["a_t", "b_t"], ["ab"]),
            helper.make_node("Add", ["hw", "ab"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h_new"]),
            helper.make_node("ReduceSum", ["h_new"], ["hs"], keepdims=0),
            helper.make_node("Add", ["n_in", "hs"], ["n_out"]),
            helper.make_node("Greater", ["hs", "zero"], ["c"]),
            helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els),
            helper.make_node("Scan", ["zero", "h_new"], ["total", "cums"], body=inner, num_scan_inputs=1),
            helper.make_node("Identity", ["h_new"], ["h_out"]),
        ],
        "step",
        [vi("h_in", [4]), vi("n_in", []), vi("a_t", [4]), vi("b_t", [4])],
        [vi("h_out", [4]), vi("n_out", []), vi("y", [4]), vi("cums", [4])],
    )
    nodes = [
        helper.make_node(
            "Scan",
            ["h0", "n0", "a", "b"],
            ["h", "n", "ys", "cs"],
            body=body,
            num_scan_inputs=2,
            scan_input_axes=[0, 1],
            scan_input_directions=[0, 1],
            scan_output_axes=[1, 0],
            scan_output_directions=[1, 0],
            name="rnn",
        )
    ]
    m = model(
        nodes,
        [vi("h0", [4]), vi("a", [5, 4]), vi("b", [4, 5])],
        [vi("h", [4]), vi("n", []), vi("ys", [4, 5]), vi("cs", [5, 4])],
        [const("w", w), const("n0", np.float32(0.0)), const("zero", np.float32(0.0)), const("two", np.float32(2.0))],
        "scan_rnn",
        16,
    )
    cases = []
    for seed in (1, 2, 3):
        r = np.random.default_rng(seed)
        feeds = [r.standard_normal(s).astype(np.float32) for s in ([4], [5, 4], [4, 5])]
        cases.append((f"seed{seed}", feeds))
    return m, cases


def seq_ops():
    """Sequences of compile-time length: SplitToSequence (sizes, and keepdims=0 without
    sizes), SequenceMap (its body reads a weight of the enclosing graph),
    SequenceInsert / SequenceErase / SequenceAt at constant positions,
    SequenceLength, ConcatFromSequence (with and without new_axis), a sequence input,
    a sequence output, and an Optional whose presence folds an If."""
    map_body = helper.make_graph(
        [helper.make_node("Mul", ["e", "w"], ["ew"]), helper.make_node("Relu", ["ew"], ["r"])],
        "map",
        [vi("e", None)],
        [vi("r", None)],
    )
    opt_then = helper.make_graph(
        [helper.make_node("OptionalGetElement", ["opt"], ["got"]), helper.make_node("Mul", ["got", "w"], ["t_out"])],
        "has",
        [],
        [vi("t_out", [3, 6])],
    )
    opt_else = helper.make_graph([helper.make_node("Identity", ["x"], ["e_out"])], "none", [], [vi("e_out", [3, 6])])
    nodes = [
        helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),
        helper.make_node("SequenceMap", ["parts"], ["mapped"], body=map_body),
        helper.make_node("SequenceInsert", ["mapped", "t", "one"], ["ins"]),
        helper.make_node("SequenceErase", ["ins", "zero"], ["erased"]),
        helper.make_node("ConcatFromSequence", ["erased"], ["cat"], axis=1),
        helper.make_node("SequenceAt", ["erased", "minus_one"], ["last"]),
        helper.make_node("SequenceLength", ["erased"], ["len"]),
        helper.make_node("SplitToSequence", ["x"], ["rows"], axis=0, keepdims=0),
        helper.make_node("ConcatFromSequence", ["rows"], ["stacked"], axis=1, new_axis=1),
        helper.make_node("ConcatFromSequence", ["s"], ["s_cat"], axis=0),
        helper.make_node("Optional", ["x"], ["opt"]),
        helper.make_node("OptionalHasElement", ["opt"], ["has"]),
        helper.make_node("If", ["has"], ["o"], then_branch=opt_then, else_branch=opt_else),
    ]
    seq_f = helper.make_tensor_sequence_value_info("parts", F, None)
    m = model(
        nodes,
        [vi("x", [3, 6]), vi("t", [3, 2]), helper.make_tensor_sequence_value_info("s", F, [None, 3])],
        [
            vi("cat", [3, 7]),
            vi("last", [3, 3]),
            vi("len", [], I64),
            vi("stacked", [6, 3]),
            vi("s_cat", [None, 3]),
            vi("o", [3, 6]),
            seq_f,
        ],
        [
            const("sizes", np.array([1, 2, 3], dtype=np.int64)),
            const("w", np.float32(1.5)),
            const("one", np.int64(1)),
            const("zero", np.int64(0)),
            const("minus_one", np.int64(-1)),
        ],
        "seq_ops",
        17,
    )
    cases = []
    for seed in (1, 2):
        r = np.random.default_rng(seed)
        s = [r.standard_normal((k, 3)).astype(np.float32) for k in (2, 1, 3)]
        feeds = [r.standard_normal((3, 6)).astype(np.float32), r.standard_normal((3, 2)).astype(np.float32), s]
        cases.append((f"seed{seed}", feeds))
    return m, cases


def loop_seq():
    """A Loop whose trip count is an input (compiled with --max-trips 4) carrying a
    sequence of two tensors whose length stays the same: each trip is a run-time If
    whose branches give the sequence's elements (the pass-through branch captures the
    carried sequence). Cases run 0, 1, 3 and 4 trips."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("SequenceAt", ["s_in", "zero"], ["a"]),
            helper.make_node("SequenceAt", ["s_in", "one"], ["b"]),
            helper.make_node("Cast", ["iter"], ["fi"], to=F),
            helper.make_node("Add", ["a", "fi"], ["a2"]),
            helper.make_node("Mul", ["b", "half"], ["b2"]),
            helper.make_node("Add", ["b2", "a2"], ["b3"]),
            helper.make_node("SequenceConstruct", ["a2", "b3"], ["s_out"]),
        ],
        "body",
        [vi("iter", [], I64), vi("cond_in", [], B), helper.make_tensor_sequence_value_info("s_in", F, [3])],
        [vi("cond_out", [], B), helper.make_tensor_sequence_value_info("s_out", F, [3])],
    )
    nodes = [
        helper.make_node("SequenceConstruct", ["x", "y"], ["s0"]),
        helper.make_node("Loop", ["m", "", "s0"], ["s"], body=body, name="steps"),
        helper.make_node("ConcatFromSequence", ["s"], ["out"], axis=0, new_axis=1),
    ]
    m = model(
        nodes,
        [vi("x", [3]), vi("y", [3]), vi("m", [], I64)],
        [vi("out", [2, 3])],
        [const("zero", np.int64(0)), const("one", np.int64(1)), const("half", np.float32(0.5))],
        "loop_seq",
        17,
    )
    r = np.random.default_rng(5)
    x, y = r.standard_normal(3).astype(np.float32), r.standard_normal(3).astype(np.float32)
    cases = [(f"m{k}", [x, y, np.array(k, dtype=np.int64)]) for k in (0, 1, 3, 4)]
    return m, cases


MODELS = {"scan_rnn": scan_rnn, "seq_ops": seq_ops, "loop_seq": loop_seq}

# Import options a model needs (recorded in the manifest).
MAX_TRIPS = {"loop_seq": 4}


def save_value(cache: Path, stem: str, v):
    """Files for one value: one for a tensor, one per element for a sequence."""
    if isinstance(v, list):
        return {"sequence": True, "files": save_arrays(cache, stem, v)}
    f = f"{stem}.npy"
    save_npy(cache / f, np.asarray(v))
    return {"sequence": False, "files": [f]}


def main() -> None:
    cache = cache_arg(__doc__.split("\n\n")[0])
    out = cache / "scan-seq"
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"generator": ort_generator(), "models": []}
    for name, entry, cases, run in ort_suite(out, "scan-seq", MODELS, MAX_TRIPS):
        for label, feeds in cases:
            res = run(feeds)
            ins = [save_value(cache, f"scan-seq/{name}/{label}.in_{k}", a) for k, a in enumerate(feeds)]
            outs = [save_value(cache, f"scan-seq/{name}/{label}.out_{k}", a) for k, a in enumerate(res)]
            entry["cases"].append({"label": label, "inputs": ins, "outputs": outs})
        manifest["models"].append(entry)
    write_json(out / "manifest.json", manifest)
    print(f"scan and sequences: {len(MODELS)} models written to {out}")


if __name__ == "__main__":
    main()
