"""The kiln Python package: compile and run against ONNX Runtime's outputs, the
zero-copy input path, InferenceSession against onnxruntime, errors, inspect and
bench."""

import threading

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import kiln


def model_case(data_dir, manifest, name):
    """(model path, {input: array}, [(output name, array)], rtol, atol) from the manifest."""
    e = manifest[name]
    ins = {i["name"]: np.load(data_dir / i["file"]) for i in e["inputs"]}
    outs = [(o["name"], np.load(data_dir / o["file"])) for o in e["outputs"]]
    return data_dir / e["model"], ins, outs, e.get("rtol", 1e-4), e.get("atol", 1e-5)


def assert_close(what, got, want, rtol, atol):
    """|kiln − ORT| ≤ atol·max|ORT| + rtol·|ORT| per element (as crates/kiln-cli/tests/models.rs);
    integers and bools exact."""
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, ORT {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, ORT {want.shape}"
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = max(np.abs(w).max(initial=0.0), np.finfo(np.float64).tiny)
    tol = atol * scale + rtol * np.abs(w)
    bad = np.abs(g - w) > tol
    assert not bad.any(), f"{what}: {bad.sum()} elements out of tolerance, first at {np.argwhere(bad)[0]}"


# ---------------------------------------------------------------- compile and run


# mlp and lenet (f32), bert_tiny (int64 token ids), silero_vad (three inputs, one bound by
# `input_values`, two outputs), eltwise (three 16 MiB inputs).
@pytest.mark.parametrize("name", ["mlp", "lenet", "bert_tiny", "silero_vad", "eltwise"])
def test_compile_and_run_match_onnx_runtime(data_dir, manifest, name):
    path, ins, outs, rtol, atol = model_case(data_dir, manifest, name)
    e = manifest[name]
    artifact = kiln.compile(str(path), input_shapes=e.get("input_shapes"), input_values=e.get("input_values"))
    assert isinstance(artifact, bytes) and artifact[:8] == b"KILNMOD\0"
    # Inputs bound to values at compile time are no longer inputs.
    ins = {k: v for k, v in ins.items() if k not in e.get("input_values", {})}
    for threads in (1, 2):
        m = kiln.load(artifact, threads=threads)
        assert m.threads == threads
        assert [i.name for i in m.inputs] == list(ins)
        got = m.run(ins)
        assert list(got) == [n for n, _ in outs]
        for n, want in outs:
            assert_close(f"{name}/{n} ({threads} threads)", got[n], want, rtol, atol)


@pytest.mark.parametrize("precision,bound", [("f16", 1e-2), ("bf16", 6e-2)])
def test_half_precision_matches_onnx_runtime_within_its_tolerance(data_dir, manifest, precision, bound):
    """``precision=`` stores the weights half (the artifact about halves) and keeps the
    API f32; the relative L2 error against ORT is within docs/precision.md's bound."""
    path, ins, outs, *_ = model_case(data_dir, manifest, "mlp")
    f32 = kiln.compile(path)
    half = kiln.compile(path, precision=precision)
    assert len(half) < 0.55 * len(f32)
    got = kiln.load(half).run(ins)
    for n, want in outs:
        assert got[n].dtype == np.float32
        err = np.linalg.norm(got[n].astype(np.float64) - want) / np.linalg.norm(want.astype(np.float64))
        assert err <= bound, f"{n}: relative L2 error {err:.2e}"
    with pytest.raises(kiln.InvalidInputError, match="precision `fp16`"):
        kiln.compile(path, precision="fp16")


def test_compile_from_bytes_and_path_give_the_same_artifact(data_dir, manifest, tmp_path):
    path, *_ = model_case(data_dir, manifest, "mlp")
    from_path = kiln.compile(path)  # os.PathLike
    from_bytes = kiln.compile(path.read_bytes())
    m1, m2 = kiln.load(from_path), kiln.load(from_bytes)
    assert [(i.name, i.dtype, i.shape) for i in m1.inputs] == [(i.name, i.dtype, i.shape) for i in m2.inputs]
    # Loading from a file gives the same module as from bytes.
    f = tmp_path / "mlp.kiln"
    f.write_bytes(from_path)
    x = np.random.default_rng(0).random((1, 784), dtype=np.float32)
    np.testing.assert_array_equal(kiln.load(f).run({"input": x})["output"], m1.run({"input": x})["output"])
    np.testing.assert_array_equal(kiln.load(str(f)).run({"input": x})["output"], m2.run({"input": x})["output"])


def test_external_weights_round_trip(data_dir, manifest, tmp_path):
    path, ins, outs, rtol, atol = model_case(data_dir, manifest, "mlp")
    w = tmp_path / "mlp.weights"
    artifact = kiln.compile(path, external_weights=w, opt="size", strip=True)
    assert w.stat().st_size > 0
    info = kiln.load(artifact, weights=w).inspect()
    assert info["constants"] == {"embedded": False, "bytes": w.stat().st_size, "file": "mlp.weights"}
    assert len(artifact) < w.stat().st_size
    # Beside the artifact, the weights are found by name.
    a = tmp_path / "mlp.kiln"
    a.write_bytes(artifact)
    got = kiln.load(a).run(ins)["output"]
    assert_close("mlp (external weights)", got, outs[0][1], rtol, atol)
    assert_close("mlp (weights as bytes)", kiln.load(artifact, weights=w.read_bytes()).run(ins)["output"], outs[0][1], rtol, atol)
    # From bytes there is nothing to look beside.
    with pytest.raises(kiln.InvalidInputError, match="mlp.weights"):
        kiln.load(artifact)


def test_outputs_are_new_arrays_that_own_their_data(data_dir, manifest):
    path, ins, outs, *_ = model_case(data_dir, manifest, "mlp")
    m = kiln.load(kiln.compile(path), threads=1)
    a = m.run(ins)["output"]
    kept = a.copy()
    b = m.run({"input": np.zeros((1, 784), np.float32)})["output"]
    assert not np.shares_memory(a, b)
    np.testing.assert_array_equal(a, kept)  # a later run leaves earlier outputs alone
    assert a.flags.c_contiguous and a.flags.owndata and a.flags.writeable


def test_inputs_are_read_in_place_and_other_layouts_are_refused(data_dir, manifest):
    """Inputs are not copied: the module reads the caller's buffer. A layout it cannot
    read in place (not C-contiguous) is refused with the fix, never silently copied."""
    path, ins, *_ = model_case(data_dir, manifest, "mlp")
    m = kiln.load(kiln.compile(path), threads=1)
    x = np.ascontiguousarray(ins["input"])
    # A read-only view of another buffer is accepted as it is (no copy to writable memory).
    ro = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(1, 784)
    assert not ro.flags.writeable
    np.testing.assert_array_equal(m.run({"input": ro})["output"], m.run({"input": x})["output"])
    # A view into a larger array at an offset is read at that offset.
    big = np.zeros((3, 784), np.float32)
    big[1] = x[0]
    np.testing.assert_array_equal(m.run({"input": big[1:2]})["output"], m.run({"input": x})["output"])
    # Not C-contiguous: refused, naming the input and the fix.
    strided = np.zeros((2, 784), np.float32)[::2]
    assert strided.shape == (1, 784) and strided.flags.c_contiguous  # a one-row stride is still contiguous
    fortran = np.asfortranarray(np.zeros((784, 1), np.float32)).T  # (1, 784), contiguous
    assert fortran.flags.c_contiguous
    every_other = np.zeros((1, 1568), np.float32)[:, ::2]
    assert not every_other.flags.c_contiguous
    with pytest.raises(kiln.InvalidInputError, match=r"input `input` is not C-contiguous.*np.ascontiguousarray"):
        m.run({"input": every_other})
    m.run({"input": np.ascontiguousarray(every_other)})


# ---------------------------------------------------------------- signature, inspect, bench


def test_signature(data_dir, manifest):
    path, *_ = model_case(data_dir, manifest, "lenet")
    m = kiln.load(kiln.compile(path))
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [(i.name, i.dtype, i.shape) for i in m.inputs] == [
        (i.name, "float32", tuple(i.shape)) for i in want.get_inputs()
    ]
    assert [i.name for i in m.outputs] == [o.name for o in want.get_outputs()]
    assert repr(m.inputs[0]).startswith("TensorInfo(name='")
    assert "kiln.Module" in repr(m)


def test_inspect(data_dir, manifest):
    path, *_ = model_case(data_dir, manifest, "lenet")
    artifact = kiln.compile(path)
    info = kiln.load(artifact, threads=1).inspect()
    assert info["bytes"] == len(artifact)
    # A static model is written in the format before bounded input dimensions.
    assert info["format"] == kiln.STATIC_FORMAT_VERSION
    kinds = [s["kind"] for s in info["sections"]]
    assert {"signature", "plan", "executables", "constants"} <= set(kinds), kinds
    assert sum(s["bytes"] for s in info["sections"]) <= len(artifact)
    assert info["entry"] == "main"
    (e,) = info["entries"]
    assert e["name"] == "main" and 0 < e["dispatches"] <= e["commands"]
    assert e["inputs"][0]["dtype"] == "float32" and isinstance(e["inputs"][0]["shape"], tuple)
    assert e["arena_bytes"] > 0 and e["arena_align"] & (e["arena_align"] - 1) == 0
    assert info["constants"]["embedded"] and info["constants"]["bytes"] > 0
    assert info["kernels"] >= e["dispatches"] > 0 and info["code_bytes"] > 0
    assert "sse2" in info["cpu_features"] and info["threads"] == 1


def test_bench(data_dir, manifest):
    path, ins, *_ = model_case(data_dir, manifest, "mlp")
    m = kiln.load(kiln.compile(path), threads=1)
    b = m.bench(iterations=50, warmup=5)
    assert set(b) == {"median_ms", "p99_ms", "stddev_ms", "min_ms", "mean_ms", "iterations", "warmup", "threads"}
    assert (b["iterations"], b["warmup"], b["threads"]) == (50, 5, 1)
    assert 0 < b["min_ms"] <= b["median_ms"] <= b["p99_ms"] < 1e4 and b["stddev_ms"] >= 0
    b = m.bench(iterations=3, warmup=0, inputs=ins)
    assert b["iterations"] == 3
    with pytest.raises(kiln.InvalidInputError, match="iterations"):
        m.bench(iterations=0)
    with pytest.raises(kiln.InputTypeError, match="input `input`"):
        m.bench(inputs={"input": ins["input"].astype(np.float64)})


def test_runs_from_several_threads(data_dir, manifest):
    path, ins, outs, *_ = model_case(data_dir, manifest, "mlp")
    m = kiln.load(kiln.compile(path), threads=1)
    want = m.run(ins)["output"]
    errors = []

    def work():
        try:
            for _ in range(50):
                np.testing.assert_array_equal(m.run(ins)["output"], want)
        except Exception as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


# ---------------------------------------------------------------- InferenceSession


@pytest.mark.parametrize("name", ["mlp", "lenet", "bert_tiny"])
def test_inference_session_matches_onnxruntime(data_dir, manifest, name):
    path, ins, outs, rtol, atol = model_case(data_dir, manifest, name)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    shapes = manifest[name].get("input_shapes")
    ks = kiln.InferenceSession(str(path), providers=["CPUExecutionProvider"], input_shapes=shapes)
    for a, b in [(ks.get_inputs(), ref.get_inputs()), (ks.get_outputs(), ref.get_outputs())]:
        assert [(x.name, x.type) for x in a] == [(x.name, x.type) for x in b]
        for x, y in zip(a, b):
            # ONNX Runtime shows free dimensions by name; kiln's are bound at compile time.
            assert len(x.shape) == len(y.shape) and all(
                isinstance(d, str) or d is None or d == k for k, d in zip(x.shape, y.shape)
            ), (x.name, x.shape, y.shape)
    want = ref.run(None, ins)
    got = ks.run(None, ins)
    assert isinstance(got, list) and len(got) == len(want)
    for n, g, w in zip([o.name for o in ref.get_outputs()], got, want):
        assert_close(f"{name}/{n} (InferenceSession)", g, w, rtol, atol)
    first = ref.get_outputs()[0].name
    assert_close(name, ks.run([first], ins)[0], ref.run([first], ins)[0], rtol, atol)
    assert ks.get_providers() and isinstance(ks.module, kiln.Module)


def test_inference_session_loads_artifacts(data_dir, manifest, tmp_path):
    path, ins, *_ = model_case(data_dir, manifest, "mlp")
    artifact = kiln.compile(path)
    f = tmp_path / "mlp.kiln"
    f.write_bytes(artifact)
    want = kiln.load(artifact).run(ins)["output"]
    for s in (kiln.InferenceSession(artifact), kiln.InferenceSession(str(f), threads=1)):
        np.testing.assert_array_equal(s.run(None, ins)[0], want)
    with pytest.raises(kiln.InvalidInputError, match=r"no output named `nope`; its outputs are: `output`"):
        kiln.InferenceSession(artifact).run(["nope"], ins)


# ---------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def mlp(data_dir, manifest):
    path, ins, *_ = model_case(data_dir, manifest, "mlp")
    return kiln.load(kiln.compile(path), threads=1), ins["input"]


def test_error_classes():
    assert issubclass(kiln.InvalidInputError, kiln.KilnError) and issubclass(kiln.InvalidInputError, ValueError)
    assert issubclass(kiln.InputTypeError, kiln.InvalidInputError) and issubclass(kiln.InputTypeError, TypeError)
    assert issubclass(kiln.UnsupportedError, kiln.KilnError) and issubclass(kiln.InternalError, kiln.KilnError)
    assert not issubclass(kiln.UnsupportedError, ValueError)
    assert kiln.KilnError.__module__ == "kiln"


def test_bad_paths(tmp_path):
    missing = tmp_path / "missing.onnx"
    with pytest.raises(kiln.InvalidInputError, match="missing.onnx"):
        kiln.compile(missing)
    with pytest.raises(kiln.InvalidInputError, match=r"cannot read `.*missing.kiln`"):
        kiln.load(tmp_path / "missing.kiln")
    with pytest.raises(kiln.InputTypeError, match="model: expected a path"):
        kiln.compile(42)


def test_corrupt_artifacts(tmp_path, mlp):
    with pytest.raises(kiln.InvalidInputError):
        kiln.load(b"not a kiln file at all, not even close")
    f = tmp_path / "bad.kiln"
    f.write_bytes(b"\0" * 64)
    with pytest.raises(kiln.InvalidInputError, match=r"^.*bad.kiln: "):
        kiln.load(f)


def test_bad_input_name(mlp):
    m, x = mlp
    with pytest.raises(kiln.InvalidInputError, match=r"no input named `nope`; its inputs are: `input` \(float32 \(1, 784\)\)"):
        m.run({"input": x, "nope": x})
    with pytest.raises(kiln.InvalidInputError, match=r"input `input` \(float32 \(1, 784\)\) is missing"):
        m.run({"nope": x})
    with pytest.raises(kiln.InputTypeError, match="dict of input name"):
        m.run([x])


def test_wrong_dtype(mlp):
    m, x = mlp
    with pytest.raises(kiln.InputTypeError, match=r"input `input`: expected float32 \(1, 784\), got float64 \(1, 784\)"):
        m.run({"input": x.astype(np.float64)})
    with pytest.raises(TypeError, match=r"input `input`: expected a numpy.ndarray of float32 \(1, 784\), got list"):
        m.run({"input": x.tolist()})
    # Same dtype, other byte order: not the module's layout.
    with pytest.raises(kiln.InputTypeError, match="input `input`"):
        m.run({"input": x.astype(">f4")})


def test_wrong_shape(mlp):
    m, x = mlp
    with pytest.raises(kiln.InvalidInputError, match=r"input `input`: expected float32 \(1, 784\), got shape \(784,\)"):
        m.run({"input": x.reshape(784)})
    with pytest.raises(ValueError, match=r"got shape \(2, 784\)"):
        m.run({"input": np.zeros((2, 784), np.float32)})


def test_unsupported_op():
    # Bernoulli draws random numbers: kiln refuses it (docs/onnx-coverage.md).
    g = oh.make_graph(
        [oh.make_node("Bernoulli", ["p"], ["draws"], name="rnd0")],
        "g",
        [oh.make_tensor_value_info("p", onnx.TensorProto.FLOAT, [1, 4])],
        [oh.make_tensor_value_info("draws", onnx.TensorProto.FLOAT, [1, 4])],
    )
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    with pytest.raises(kiln.UnsupportedError, match=r"Bernoulli .*node `rnd0`"):
        kiln.compile(model.SerializeToString())


def test_bad_options(data_dir, manifest):
    path, *_ = model_case(data_dir, manifest, "mlp")
    with pytest.raises(kiln.InvalidInputError, match="target `arm`: expected host"):
        kiln.compile(path, target="arm")
    with pytest.raises(kiln.InvalidInputError, match="opt `fast`: expected speed or size"):
        kiln.compile(path, opt="fast")
    with pytest.raises(kiln.InvalidInputError, match="threads=0"):
        kiln.load(kiln.compile(path), threads=0)
    with pytest.raises(kiln.InvalidInputError, match="nope"):
        kiln.compile(path, input_shapes={"nope": (1, 2)})


def relu_with_free_batch():
    """A Relu over `x` of dims [batch, 3], `batch` free (bound at compile time)."""
    g = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3])],
    )
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]).SerializeToString()


def test_free_dimensions_are_bound_by_input_shapes():
    model = relu_with_free_batch()
    with pytest.raises(kiln.InvalidInputError, match="x"):
        kiln.compile(model)
    m = kiln.load(kiln.compile(model, input_shapes={"x": [2, 3]}))
    assert m.inputs[0].shape == (2, 3)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(m.run({"x": x})["y"], np.maximum(x, 0))


def test_input_values_make_constants():
    g = oh.make_graph(
        [oh.make_node("Add", ["x", "b"], ["y"], name="add")],
        "g",
        [
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3]),
            oh.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [3]),
        ],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
    )
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]).SerializeToString()
    m = kiln.load(kiln.compile(model, input_values={"b": np.array([1, 2, 3])}))
    assert [i.name for i in m.inputs] == ["x"]
    np.testing.assert_array_equal(m.run({"x": np.ones(3, np.float32)})["y"], np.array([2, 3, 4], np.float32))


def test_integer_and_bool_outputs():
    g = oh.make_graph(
        [
            oh.make_node("Add", ["a", "b"], ["s"], name="add"),
            oh.make_node("Greater", ["a", "b"], ["g"], name="gt"),
        ],
        "g",
        [
            oh.make_tensor_value_info("a", onnx.TensorProto.INT64, [4]),
            oh.make_tensor_value_info("b", onnx.TensorProto.INT64, [4]),
        ],
        [
            oh.make_tensor_value_info("s", onnx.TensorProto.INT64, [4]),
            oh.make_tensor_value_info("g", onnx.TensorProto.BOOL, [4]),
        ],
    )
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]).SerializeToString()
    m = kiln.load(kiln.compile(model))
    assert [(o.name, o.dtype, o.type) for o in m.outputs] == [("s", "int64", "tensor(int64)"), ("g", "bool", "tensor(bool)")]
    a, b = np.array([1, -2, 3, 4]), np.array([0, 5, 3, -4])
    out = m.run({"a": a, "b": b})
    np.testing.assert_array_equal(out["s"], a + b)
    np.testing.assert_array_equal(out["g"], a > b)
    assert out["s"].dtype == np.int64 and out["g"].dtype == np.bool_
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"a": a, "b": b})
    got = kiln.InferenceSession(model).run(None, {"a": a, "b": b})
    for g_, r in zip(got, ref):
        np.testing.assert_array_equal(g_, r)


# ---------------------------------------------------------------- the package itself


def test_the_gil_is_released_while_running(data_dir, manifest):
    """Another Python thread runs in the middle of a long call: the GIL is not held
    while kiln computes. (With it held, the other thread could run only before the call
    starts or after it ends, never in the middle third of it.)"""
    import time

    path, ins, *_ = model_case(data_dir, manifest, "lenet")
    m = kiln.load(kiln.compile(path), threads=1)
    t_one = m.bench(iterations=5, warmup=1)["median_ms"]
    iterations = max(20, int(300 / max(t_one, 1e-3)))  # about 300 ms of invokes
    started, stop, stamps = threading.Event(), threading.Event(), []

    def spin():
        started.set()
        while not stop.is_set():
            stamps.append(time.perf_counter())

    t = threading.Thread(target=spin)
    t.start()
    started.wait()
    t0 = time.perf_counter()
    m.bench(iterations=iterations, warmup=0)
    t1 = time.perf_counter()
    stop.set()
    t.join()
    lo, hi = t0 + (t1 - t0) / 3, t1 - (t1 - t0) / 3
    inside = sum(lo < s < hi for s in stamps)
    assert inside > 0, f"the other thread never ran in the middle of a {1e3 * (t1 - t0):.0f} ms call"


def test_the_type_stubs_name_what_the_module_has():
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("kiln")
    stub = Path(spec.origin).with_suffix(".pyi")
    assert stub.is_file(), f"{stub} is not installed"
    tree = ast.parse(stub.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    import types

    # (Less the extension submodule the package's __init__ imports from.)
    public = {n for n in dir(kiln) if not n.startswith("_") and not isinstance(getattr(kiln, n), types.ModuleType)}
    public |= {"__version__"}
    stubbed = {n for n in names if not n.startswith("_")} | {"__version__"}
    assert stubbed == public, f"only in the stub: {stubbed - public}; only in the module: {public - stubbed}"
    for cls in ("Module", "InferenceSession", "TensorInfo"):
        (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
        members = {n.name for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
        real = {n for n in dir(getattr(kiln, cls)) if not n.startswith("_")}
        assert members == real, f"{cls}: only in the stub: {members - real}; only in the class: {real - members}"


def test_outputs_into_the_callers_arrays(mlp):
    m, x = mlp
    want = m.run({"input": x})["output"]
    out = np.full((1, 10), np.nan, np.float32)
    got = m.run({"input": x}, outputs={"output": out})
    assert got["output"] is out
    np.testing.assert_array_equal(out, want)
    # A view into a larger buffer is written in place, and nothing around it.
    big = np.zeros((3, 10), np.float32)
    m.run({"input": x}, outputs={"output": big[1:2]})
    np.testing.assert_array_equal(big[1], want[0])
    assert not big[0].any() and not big[2].any()
    # Refused: wrong dtype, shape, layout, read-only, unknown name, overlap with an input.
    with pytest.raises(kiln.InputTypeError, match=r"output `output`: expected float32 \(1, 10\), got float64"):
        m.run({"input": x}, outputs={"output": np.zeros((1, 10))})
    with pytest.raises(kiln.InvalidInputError, match=r"output `output`: expected float32 \(1, 10\), got shape \(10,\)"):
        m.run({"input": x}, outputs={"output": np.zeros(10, np.float32)})
    with pytest.raises(kiln.InvalidInputError, match="output `output` is not C-contiguous"):
        m.run({"input": x}, outputs={"output": np.zeros((1, 20), np.float32)[:, ::2]})
    ro = np.zeros((1, 10), np.float32)
    ro.flags.writeable = False
    with pytest.raises(kiln.InvalidInputError, match="output `output`: the array given is read-only"):
        m.run({"input": x}, outputs={"output": ro})
    with pytest.raises(kiln.InvalidInputError, match="no output named `y`"):
        m.run({"input": x}, outputs={"y": out})
    shared = np.zeros((1, 784), np.float32)
    with pytest.raises(kiln.InvalidInputError, match="output `output` overlaps the array of input `input`"):
        m.run({"input": shared}, outputs={"output": shared[:, :10]})


# ---------------------------------------------------------------- bounded dimensions


def bounded_manifest(data_dir):
    """The models and ONNX Runtime outputs of scripts/ref_bounded.py (bert_tiny with its
    sequence 1..128, an MLP with its batch 1..8), by name; missing data fails."""
    import json

    m = data_dir / "bounded" / "manifest.json"
    if not m.is_file():
        pytest.fail(f"{m} is missing: run scripts/ref_bounded.py (scripts/test does)")
    return {e["name"]: e for e in json.loads(m.read_text())["models"]}


@pytest.mark.parametrize("name,shape", [("bert_tiny", (1, (1, 128))), ("mlp_batch", ("1..8", 16))])
def test_bounded_inputs_take_any_extent_and_outputs_come_back_at_it(data_dir, name, shape):
    e = bounded_manifest(data_dir)[name]
    input_name = e["input_shape"].split("=")[0]
    artifact = kiln.compile(str(data_dir / e["file"]), input_shapes={input_name: shape})
    for threads in (1, 3):
        m = kiln.load(artifact, threads=threads)
        # The largest first: a shorter call after it must not see its positions.
        for case in sorted(e["cases"], key=lambda c: -c["extent"]):
            base = data_dir / "bounded" / name / case["name"]
            x = np.load(f"{base}.in_0.npy")
            got = m.run({input_name: x})
            for k, (out, arr) in enumerate(got.items()):
                want = np.load(f"{base}.out_{k}.npy")
                assert_close(f"{name}/{case['name']} {out} ({threads} threads)", arr, want, 1e-4, 1e-5)
    # Outside the range: the runtime's typed error, naming the input and the range.
    m = kiln.load(artifact)
    x = np.load(data_dir / "bounded" / name / f"{e['cases'][-1]['name']}.in_0.npy")
    axis = 1 if name == "bert_tiny" else 0
    too_long = np.concatenate([x] * (2 + 256 // x.shape[axis]), axis=axis)
    with pytest.raises(kiln.InvalidInputError, match=input_name):
        m.run({input_name: too_long})
    # The other dims stay fixed.
    with pytest.raises(kiln.InvalidInputError, match=input_name):
        m.run({input_name: np.zeros((2,) * x.ndim, x.dtype)})


def test_bounded_ranges_in_input_shapes_are_checked():
    model = relu_with_free_batch()
    with pytest.raises(kiln.InvalidInputError, match="range"):
        kiln.compile(model, input_shapes={"x": [(4, 2), 3]})
    with pytest.raises(kiln.InvalidInputError, match="input_shapes"):
        kiln.compile(model, input_shapes={"x": ["two", 3]})
    m = kiln.load(kiln.compile(model, input_shapes={"x": ["1..4", 3]}))
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    y = m.run({"x": x})["y"]
    assert y.shape == (2, 3)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
