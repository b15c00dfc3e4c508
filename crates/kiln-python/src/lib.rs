//! kiln's Python package, `kiln`: compile ONNX models to `.kiln` artifacts and run
//! them with numpy arrays.
//!
//! ```python
//! import kiln, numpy as np
//! m = kiln.load(kiln.compile("mlp.onnx"))
//! y = m.run({"x": np.zeros((1, 784), np.float32)})
//! ```
//!
//! - [`compile`] goes through kiln-compiler's pipeline ([`kiln_compiler::Compilation`]),
//!   with the GIL released.
//! - [`load`] verifies the artifact and makes one runtime instance: a
//!   [`module::Module`], whose `run` reads numpy inputs in place and writes new numpy
//!   arrays (see `module.rs`).
//! - [`session::InferenceSession`] has ONNX Runtime's shape for code written for it.
//! - Errors are `kiln.KilnError` and its subclasses (`errors.rs`), with the messages
//!   the command line prints.
//!
//! Built with maturin (`pyproject.toml`) as an abi3 wheel (CPython ≥ 3.9); tested
//! from Python (`tests/`, run by `scripts/test`). The type stubs are `kiln.pyi`.

mod dtype;
mod errors;
mod module;
mod session;

use std::path::{Path, PathBuf};

use kiln_compiler::{Compilation, CpuTarget, ImportOptions, Input, Options, Stage};
use kiln_runtime::fs::AlignedBytes;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict};

use errors::Error;

/// The compiler's error as the command line prints it: import errors name the file
/// themselves, later ones get the model's path in front.
fn compile_message(model: Option<&Path>, e: &kiln_compiler::CompileError) -> String {
    match (e.stage(), model) {
        (Stage::Import, _) | (_, None) => e.to_string(),
        (_, Some(m)) => format!("{}: {e}", m.display()),
    }
}

/// Bytes from a `bytes` or `bytearray` object, `None` for anything else.
fn bytes_of(obj: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Some(b.as_bytes().to_vec());
    }
    obj.cast::<PyByteArray>().ok().map(|b| b.to_vec())
}

/// A path from a `str` or `os.PathLike`, else an `InputTypeError` naming `what`.
fn path_of(obj: &Bound<'_, PyAny>, what: &str) -> Result<PathBuf, Error> {
    obj.extract::<PathBuf>().map_err(|_| {
        let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        Error::input_type(format!("{what}: expected a path (str or os.PathLike) or bytes, got {ty}"))
    })
}

fn target(name: &str) -> Result<CpuTarget, Error> {
    match name {
        "host" => Ok(CpuTarget::Host),
        "x86-64" => Ok(CpuTarget::X86_64),
        "x86-64-v2" => Ok(CpuTarget::X86_64V2),
        "x86-64-v3" => Ok(CpuTarget::X86_64V3),
        "x86-64-v4" => Ok(CpuTarget::X86_64V4),
        t => Err(Error::invalid(format!("target `{t}`: expected host, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4"))),
    }
}

/// `input_shapes` and `input_values` as the importer takes them.
fn import_options(
    py: Python<'_>,
    input_shapes: Option<&Bound<'_, PyDict>>,
    input_values: Option<&Bound<'_, PyDict>>,
) -> PyResult<ImportOptions> {
    let mut o = ImportOptions::default();
    for (k, v) in input_shapes.into_iter().flat_map(|d| d.iter()) {
        let name: String =
            k.extract().map_err(|_| Error::input_type("input_shapes: keys must be input names (str)"))?;
        let bad = || {
            Error::input_type(format!(
                "input_shapes[`{name}`]: expected a sequence of non-negative ints, e.g. (1, 3, 224, 224), where one axis may be a range (min, max) or \"min..max\", e.g. (1, (1, 128))"
            ))
        };
        // Each dim an int, or a bounded range: `(min, max)` or `"min..max"`.
        let mut dims = Vec::new();
        for (axis, d) in v.try_iter().map_err(|_| bad())?.enumerate() {
            let d = d.map_err(|_| bad())?;
            let range = match (d.extract::<usize>(), d.extract::<(usize, usize)>(), d.extract::<String>()) {
                (Ok(n), _, _) => {
                    dims.push(n);
                    continue;
                }
                (_, Ok(r), _) => r,
                (_, _, Ok(t)) => {
                    let (lo, hi) = t.split_once("..").ok_or_else(bad)?;
                    (lo.trim().parse().map_err(|_| bad())?, hi.trim().parse().map_err(|_| bad())?)
                }
                _ => return Err(bad().into()),
            };
            if range.0 > range.1 || range.1 == 0 {
                return Err(Error::invalid(format!(
                    "input_shapes[`{name}`]: the range {}..{} of axis {axis} must have min ≤ max and max ≥ 1",
                    range.0, range.1
                ))
                .into());
            }
            dims.push(range.1);
            o.bounded_dims.push((name.clone(), axis, range.0));
        }
        o.input_shapes.push((name, dims));
    }
    let np = py.import("numpy")?;
    for (k, v) in input_values.into_iter().flat_map(|d| d.iter()) {
        let name: String =
            k.extract().map_err(|_| Error::input_type("input_values: keys must be input names (str)"))?;
        let flat = np
            .call_method1("asarray", (v, "float64"))
            .and_then(|a| a.call_method0("ravel"))
            .and_then(|a| a.call_method0("tolist"))
            .and_then(|l| l.extract::<Vec<f64>>())
            .map_err(|_| {
                Error::input_type(format!(
                    "input_values[`{name}`]: expected a number, a sequence of numbers or an array"
                ))
            })?;
        o.input_values.push((name, flat));
    }
    Ok(o)
}

/// Compiles a model into a ``.kiln`` artifact and returns its bytes.
///
/// ``model`` is a path to an ONNX model (external data is read beside it) or to kiln
/// IR text (``.kir``), or the bytes of an ONNX model. ``input_shapes`` binds free
/// dimensions (``{"x": (1, 3, 224, 224)}``); a dimension given as a range
/// ``(min, max)`` or ``"min..max"`` is bounded: compiled once for any extent up to
/// ``max``, chosen per call by the input array's shape (docs/bounded-shapes.md);
/// ``input_values`` turns inputs into
/// constants (``{"sr": 16000}``). ``target`` is the CPU the code is for: ``"host"``,
/// ``"x86-64"``, ``"x86-64-v2"``, ``"x86-64-v3"`` or ``"x86-64-v4"``; ``opt`` is
/// ``"speed"`` or ``"size"``. With ``external_weights`` (a path), the constants go to
/// that file and the artifact records its name: load it with ``weights=`` or keep the
/// file beside the artifact. ``strip`` leaves out the debug names. ``precision`` is
/// ``"f32"``, or ``"f16"``/``"bf16"``: weights and intermediates stored half, computed
/// in f32, inputs and outputs f32 (docs/precision.md).
///
/// Raises :class:`InvalidInputError`, :class:`UnsupportedError` or
/// :class:`InternalError` with the message ``kiln compile`` prints. The GIL is
/// released while compiling.
#[pyfunction]
#[pyo3(signature = (model, input_shapes=None, input_values=None, target="host", opt="speed", external_weights=None, strip=false, precision="f32"))]
// CompileError is kiln-compiler's (large, typed until printed); it is converted at once.
#[allow(clippy::too_many_arguments, clippy::result_large_err)]
fn compile<'py>(
    py: Python<'py>,
    model: &Bound<'py, PyAny>,
    input_shapes: Option<&Bound<'py, PyDict>>,
    input_values: Option<&Bound<'py, PyDict>>,
    target: &str,
    opt: &str,
    external_weights: Option<&Bound<'py, PyAny>>,
    strip: bool,
    precision: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let (input, path) = match bytes_of(model) {
        Some(b) => (Input::OnnxBytes { bytes: bytes::Bytes::from(b), base_dir: None }, None),
        None => {
            let p = path_of(model, "model")?;
            (Input::File(p.clone()), Some(p))
        }
    };
    let size = match opt {
        "speed" => false,
        "size" => true,
        o => return Err(Error::invalid(format!("opt `{o}`: expected speed or size")).into()),
    };
    let weights_path = external_weights.map(|w| path_of(w, "external_weights")).transpose()?;
    let options = Options {
        target: self::target(target)?,
        cpu_variants: Vec::new(),
        device: Default::default(),
        external_weights: weights_path
            .as_ref()
            .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        strip,
        size,
        passes: None,
        source: path.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        import: import_options(py, input_shapes, input_values)?,
        precision: kiln_compiler::Precision::from_name(precision)
            .ok_or_else(|| Error::invalid(format!("precision `{precision}`: expected f32, f16 or bf16")))?,
        ptxas: None,
        cuda_archs: Vec::new(),
        fused_attention: true,
    };
    let compiled = py
        .detach(|| Compilation::new(input, options).finish())
        .map_err(|e| Error::new(errors::compile_class(&e), compile_message(path.as_deref(), &e)))?;
    if let (Some(w), Some(bytes)) = (&weights_path, &compiled.weights) {
        std::fs::write(w, bytes).map_err(|e| Error::invalid(format!("cannot write `{}`: {e}", w.display())))?;
    }
    Ok(PyBytes::new(py, &compiled.artifact))
}

/// An artifact's bytes and weights from Python arguments, and the label for messages.
fn artifact_and_weights(
    artifact: &Bound<'_, PyAny>,
    weights: Option<&Bound<'_, PyAny>>,
) -> Result<(AlignedBytes, Option<AlignedBytes>, String), Error> {
    let weights_given = match weights {
        None => None,
        Some(w) => Some(match bytes_of(w) {
            Some(b) => (AlignedBytes::copy_from(&b), None),
            None => {
                let p = path_of(w, "weights")?;
                (module::read(&p)?, Some(p))
            }
        }),
    };
    if let Some(b) = bytes_of(artifact) {
        return Ok((AlignedBytes::copy_from(&b), weights_given.map(|w| w.0), String::new()));
    }
    let path = path_of(artifact, "artifact")?;
    let label = path.display().to_string();
    let bytes = module::read(&path)?;
    let weights = match weights_given {
        Some((w, _)) => Some(w),
        // An artifact with external weights names its file: look beside the artifact.
        None => match kiln_runtime::fs::weights_beside(&path, bytes.bytes()) {
            Some(p) if p.exists() => Some(module::read(&p)?),
            _ => None,
        },
    };
    Ok((bytes, weights, label))
}

/// Loads a ``.kiln`` artifact and makes an instance of it: a :class:`Module`.
///
/// ``artifact`` is a path or the artifact's bytes (as :func:`compile` returns them).
/// ``weights`` is the external weights file (a path or bytes) of an artifact compiled
/// with ``external_weights``; left out, the file the artifact names is looked for
/// beside it. ``threads`` is how many threads each run uses (default: one per core,
/// as ``kiln run``).
///
/// The artifact is verified completely (container, versions, sections, plan, weights,
/// CPU features). Raises :class:`InvalidInputError` (unreadable, corrupt, weights
/// missing or wrong), :class:`UnsupportedError` (another format version, CPU features
/// this machine lacks) or :class:`KilnError`.
#[pyfunction]
#[pyo3(signature = (artifact, weights=None, threads=None))]
fn load(
    py: Python<'_>,
    artifact: &Bound<'_, PyAny>,
    weights: Option<&Bound<'_, PyAny>>,
    threads: Option<usize>,
) -> PyResult<module::Module> {
    let threads = module::thread_count(threads)?;
    let (bytes, weights, label) = artifact_and_weights(artifact, weights)?;
    module::Module::new(py, bytes, weights, threads, label)
}

/// The kiln Python package.
#[pymodule]
#[pyo3(name = "kiln")]
fn kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", kiln_module::FORMAT_VERSION.to_string())?;
    // What a program without bounded input dimensions is written as.
    m.add("STATIC_FORMAT_VERSION", kiln_module::format::STATIC_FORMAT_VERSION.to_string())?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_class::<module::Module>()?;
    m.add_class::<module::TensorInfo>()?;
    m.add_class::<session::InferenceSession>()?;
    Ok(())
}
