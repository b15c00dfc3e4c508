//! `kiln.InferenceSession`: ONNX Runtime's `InferenceSession` shape over a compiled
//! module, for code written for ONNX Runtime.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::errors::Error;
use crate::module::{Module, TensorInfo};

/// A model compiled and loaded in one step, used as ONNX Runtime's
/// ``onnxruntime.InferenceSession`` is.
///
/// ``path_or_bytes`` is an ONNX model (a path or its bytes), compiled with
/// ``input_shapes``, ``input_values``, ``target`` and ``opt`` as :func:`compile` takes
/// them, or a ``.kiln`` artifact (a path ending in ``.kiln``, or bytes that start with
/// the artifact's magic), loaded as it is. ``sess_options`` and ``providers`` are
/// accepted so that ONNX Runtime code runs unchanged, and ignored: kiln runs on the
/// CPU it compiled for, with ``threads`` threads (default one per core).
#[pyclass(frozen, module = "kiln", name = "InferenceSession")]
pub(crate) struct InferenceSession {
    module: Py<Module>,
}

#[pymethods]
impl InferenceSession {
    #[new]
    #[pyo3(signature = (path_or_bytes, sess_options=None, providers=None, *, input_shapes=None, input_values=None, threads=None, target="host", opt="speed"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path_or_bytes: &Bound<'_, PyAny>,
        sess_options: Option<&Bound<'_, PyAny>>,
        providers: Option<&Bound<'_, PyAny>>,
        input_shapes: Option<&Bound<'_, PyDict>>,
        input_values: Option<&Bound<'_, PyDict>>,
        threads: Option<usize>,
        target: &str,
        opt: &str,
    ) -> PyResult<InferenceSession> {
        let _ = (sess_options, providers);
        let is_artifact = match path_or_bytes.cast::<PyBytes>() {
            Ok(b) => b.as_bytes().starts_with(&kiln_module::format::MAGIC),
            Err(_) => {
                path_or_bytes.extract::<std::path::PathBuf>().is_ok_and(|p| p.extension().is_some_and(|e| e == "kiln"))
            }
        };
        let kiln = py.import("kiln")?;
        let module = if is_artifact {
            kiln.getattr("load")?.call((path_or_bytes, py.None(), threads), None)?
        } else {
            let kw = PyDict::new(py);
            kw.set_item("input_shapes", input_shapes)?;
            kw.set_item("input_values", input_values)?;
            kw.set_item("target", target)?;
            kw.set_item("opt", opt)?;
            let artifact = kiln.getattr("compile")?.call((path_or_bytes,), Some(&kw))?;
            kiln.getattr("load")?.call((artifact, py.None(), threads), None)?
        };
        Ok(InferenceSession { module: module.cast_into::<Module>()?.unbind() })
    }

    /// Runs the model: ``input_feed`` maps input names to numpy arrays (checked and
    /// read in place as :meth:`Module.run` does); returns a list of new arrays, one per
    /// name of ``output_names`` in that order (``None``: every output, in the model's
    /// order). ``run_options`` is accepted and ignored.
    #[pyo3(signature = (output_names, input_feed, run_options=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        output_names: Option<Vec<String>>,
        input_feed: &Bound<'py, PyAny>,
        run_options: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let _ = run_options;
        let m = self.module.get();
        let feed = input_feed
            .cast::<PyDict>()
            .map_err(|_| Error::input_type("input_feed: expected a dict of input name to numpy array"))?;
        // Names first: a wrong one fails before anything runs.
        let order: Option<Vec<usize>> = match &output_names {
            None => None,
            Some(names) => Some(
                names
                    .iter()
                    .map(|n| {
                        m.output_names().position(|o| o == n).ok_or_else(|| {
                            let all: Vec<String> = m.output_names().map(|o| format!("`{o}`")).collect();
                            Error::invalid(format!(
                                "the model has no output named `{n}`; its outputs are: {}",
                                all.join(", ")
                            ))
                        })
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
        let outs = m.run_arrays(py, feed, None)?;
        match order {
            None => PyList::new(py, outs),
            Some(order) => PyList::new(py, order.iter().map(|&i| outs[i].clone())),
        }
    }

    /// The inputs: a list of :class:`TensorInfo` (``.name``, ``.shape``, ``.type``, as
    /// ONNX Runtime's ``NodeArg``).
    fn get_inputs(&self, py: Python<'_>) -> Vec<Py<TensorInfo>> {
        self.module.get().input_info(py)
    }

    /// The outputs: a list of :class:`TensorInfo`.
    fn get_outputs(&self, py: Python<'_>) -> Vec<Py<TensorInfo>> {
        self.module.get().output_info(py)
    }

    /// The execution providers: kiln's code for this CPU only.
    fn get_providers(&self) -> Vec<&'static str> {
        vec!["KilnCPUExecutionProvider"]
    }

    /// The :class:`Module` behind the session.
    #[getter]
    fn module(&self, py: Python<'_>) -> Py<Module> {
        self.module.clone_ref(py)
    }
}
