//! `kiln.Module`: a loaded artifact, one instance of it, and the ways to run it with
//! numpy arrays.
//!
//! Inputs are read in place: `run` hands the runtime a pointer into each numpy array
//! (after checking its dtype, shape and C-contiguity), no copy. Outputs are new numpy
//! arrays every call (allocated zeroed by numpy, so that the runtime writes into
//! initialised memory), which the runtime writes directly: the arrays returned own
//! their data, and a later call never changes them.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use kiln_module::program::{Command, Constants, CpuFeature};
use kiln_runtime::fs::AlignedBytes;
use kiln_runtime::{Instance, LoadedModule, OwnedModule};
use numpy::npyffi::npy_intp;
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods, PY_ARRAY_API};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::dtype;
use crate::errors::{Class, Error};

/// One tensor of the entry point's signature.
pub(crate) struct Tensor {
    pub(crate) name: String,
    pub(crate) code: u32,
    pub(crate) dims: Vec<u64>,
    /// numpy's dims (the same numbers).
    npy_dims: Vec<npy_intp>,
    pub(crate) bytes: usize,
    /// A bounded input dimension: its axis, which takes any extent `min..=bound` (the
    /// dims are the bound's; the runtime checks the extent).
    pub(crate) bounded: Option<usize>,
}

impl Tensor {
    fn new(t: &kiln_module::sections::TensorView<'_>) -> Result<Tensor, Error> {
        let too_large = || Error::invalid(format!("tensor `{}` is too large for this machine", t.name));
        // Verified at load: the byte size fits the address space.
        let bytes = usize::try_from(t.bytes).map_err(|_| too_large())?;
        let npy_dims =
            t.dims.iter().map(|&d| npy_intp::try_from(d).map_err(|_| too_large())).collect::<Result<_, _>>()?;
        Ok(Tensor { name: t.name.to_string(), code: t.dtype, dims: t.dims.clone(), npy_dims, bytes, bounded: None })
    }

    /// `float32 (1, 784)`, as messages show it.
    fn ty(&self) -> String {
        format!("{} {}", dtype::of(self.code).name, shape_str(&self.dims))
    }
}

/// A Python-style shape: `(1, 784)`, `(3,)`, `()`.
fn shape_str<T: std::fmt::Display>(dims: &[T]) -> String {
    match dims {
        [d] => format!("({d},)"),
        _ => format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

/// A loaded module (with the bytes it reads) and its default entry point's signature.
pub(crate) struct Loaded {
    owned: OwnedModule,
    /// The entry point run: `main`, else the first.
    entry: usize,
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) outputs: Vec<Tensor>,
}

impl Loaded {
    /// Loads `artifact` (and `weights`), taking the buffers.
    fn new(artifact: AlignedBytes, weights: Option<AlignedBytes>) -> Result<Loaded, Error> {
        let owned = OwnedModule::load(artifact, weights).map_err(|e| match e {
            kiln_runtime::RuntimeError::WeightsMissing { .. } => {
                Error::from(e).context_after("kiln.load(artifact, weights=PATH) names the file")
            }
            e => Error::from(e),
        })?;
        let sig = owned.module().signature();
        let entry = sig.default_entry().ok_or_else(|| Error::invalid("the module has no entry points"))?;
        let mut inputs = entry.inputs.iter().map(Tensor::new).collect::<Result<Vec<_>, _>>()?;
        for b in entry.bounded {
            if let Some(t) = inputs.get_mut(b.input as usize) {
                t.bounded = Some(b.axis as usize);
            }
        }
        let outputs = entry.outputs.iter().map(Tensor::new).collect::<Result<Vec<_>, _>>()?;
        let entry = entry.index;
        Ok(Loaded { owned, entry, inputs, outputs })
    }
}

/// The instance and its argument lists: used by one thread at a time, behind the
/// module's mutex.
struct Runner {
    // Fields drop in declaration order: `inst` borrows `module.owned`, so it comes
    // first and the `Arc` last.
    /// The runtime's instance, its lifetime erased to `'static`.
    ///
    /// SAFETY (of the erasure): it borrows `module.owned`'s module, which lives in the `Arc`
    /// this runner holds (`module`, dropped after `inst`; never modified), and an arena
    /// the instance allocated and owns. No reference with the erased lifetime leaves
    /// this struct.
    inst: Instance<'static>,
    /// Argument lists for the runtime, filled and emptied within each invoke (capacity
    /// kept between calls): empty between calls, so the `'static` is never observed.
    in_args: Vec<&'static [u8]>,
    out_args: Vec<&'static mut [u8]>,
    module: Arc<Loaded>,
}

// SAFETY: a runner is used by one thread at a time (it lives in a `Mutex`), and nothing
// in it is tied to the thread that made it: the instance's raw pointers point into its
// own arena and tables and into the module (which is `Sync`), its worker threads are
// reached through the runtime's `Send + Sync` shared state, and the argument lists are
// empty between calls. (The C API lets an instance move between threads the same way.)
unsafe impl Send for Runner {}

impl Runner {
    fn new(module: Arc<Loaded>, threads: usize) -> Result<Runner, Error> {
        // SAFETY: see `Runner::inst`: the module stays in the `Arc` this runner holds
        // until after the instance is dropped.
        let loaded: &'static LoadedModule<'static> = unsafe { &*std::ptr::from_ref(module.owned.module()).cast() };
        let mut inst = Instance::with_threads(loaded, threads)?;
        // The plan's instantiation prologue (what it computes from constants alone) runs
        // here, not in the first call.
        if let Some(main) = loaded.signature().find("main") {
            inst.prepare(main.index)?;
        }
        Ok(Runner {
            inst,
            in_args: Vec::with_capacity(module.inputs.len()),
            out_args: Vec::with_capacity(module.outputs.len()),
            module,
        })
    }

    /// One invoke of the entry point on `args`.
    ///
    /// # Safety
    ///
    /// Every pointer of `args` is valid for its length (reads for inputs, writes for
    /// outputs) for the whole call, no output overlaps another argument, and nothing
    /// else writes the inputs or touches the outputs meanwhile.
    unsafe fn invoke(&mut self, args: &Args) -> Result<(), Error> {
        self.in_args.clear();
        self.out_args.clear();
        for &(p, len) in &args.ins {
            // SAFETY: the caller's contract; a zero-length input needs no pointer.
            self.in_args.push(if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(p, len) } });
        }
        for &(p, len) in &args.outs {
            // SAFETY: as above, and exclusive by the contract.
            self.out_args.push(if len == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(p, len) } });
        }
        let r = self.inst.invoke_entry(self.module.entry, &self.in_args, &mut self.out_args);
        self.in_args.clear();
        self.out_args.clear();
        r.map_err(Error::from)
    }

    /// The outputs of the last invoke whose actual dims are not their signature's (a
    /// bounded input's extent or a data-dependent extent sized them; their elements are
    /// at the front of the buffer): index and dims.
    fn resized(&self) -> Vec<(usize, Vec<u64>)> {
        let sig = &self.module.outputs;
        (0..sig.len())
            .filter_map(|k| self.inst.output_dims(k).filter(|d| *d != sig[k].dims.as_slice()).map(|d| (k, d.to_vec())))
            .collect()
    }
}

/// The address of the first element of `a`.
///
/// # Safety
///
/// The GIL is held (`a` is a live array).
unsafe fn array_data(a: &Bound<'_, PyUntypedArray>) -> *mut u8 {
    // SAFETY: `a` is a live numpy array; its fields are read with the GIL held.
    unsafe { (*numpy::npyffi::objects::_PyArray_GET_ITEM_DATA(a.as_array_ptr())).data.cast::<u8>() }
}

/// An input's address and byte length.
type InputArg = (*const u8, usize);

/// Raw argument pointers carried across the GIL release.
struct Args {
    ins: Vec<InputArg>,
    outs: Vec<(*mut u8, usize)>,
}

// SAFETY: the pointers are plain addresses of numpy buffers (or the bench's own), which
// the thread that made them keeps alive (holding the arrays) while another part of
// the same call reads them with the GIL released; nothing thread-local is involved.
unsafe impl Send for Args {}

/// Name, dtype and shape of an input or output of a module.
///
/// `name` is the tensor's name in the model, `dtype` numpy's name of its dtype
/// (`"float32"`), `shape` its dimensions as a tuple, and `type` ONNX Runtime's
/// spelling of the dtype (`"tensor(float)"`, as `NodeArg.type` has it).
#[pyclass(frozen, module = "kiln", name = "TensorInfo")]
pub(crate) struct TensorInfo {
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    dtype: &'static str,
    #[pyo3(get)]
    shape: Py<PyTuple>,
    #[pyo3(get, name = "type")]
    ort: &'static str,
}

#[pymethods]
impl TensorInfo {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "TensorInfo(name={}, dtype='{}', shape={})",
            PyString::new(py, &self.name).repr()?,
            self.dtype,
            self.shape.bind(py).repr()?
        ))
    }
}

fn info(py: Python<'_>, t: &Tensor) -> PyResult<Py<TensorInfo>> {
    let d = dtype::of(t.code);
    let shape = PyTuple::new(py, t.dims.iter().copied())?.unbind();
    Py::new(py, TensorInfo { name: t.name.clone(), dtype: d.name, shape, ort: d.ort })
}

/// A loaded, verified artifact and an instance of it, ready to run.
///
/// Made by :func:`kiln.load`. Calls to :meth:`run` and :meth:`bench` release the GIL
/// while kiln computes; calls from several Python threads take turns on the module's
/// one instance (load the artifact once per thread to run in parallel).
#[pyclass(frozen, module = "kiln", name = "Module")]
pub(crate) struct Module {
    runner: Mutex<Runner>,
    shared: Arc<Loaded>,
    threads: usize,
    label: String,
    in_names: Vec<Py<PyString>>,
    in_descr: Vec<Option<Py<PyArrayDescr>>>,
    out_names: Vec<Py<PyString>>,
    out_descr: Vec<Option<Py<PyArrayDescr>>>,
    in_info: Vec<Py<TensorInfo>>,
    out_info: Vec<Py<TensorInfo>>,
}

impl Module {
    /// Loads `artifact` and makes its instance on `threads` threads. `label` (the file,
    /// or empty) goes in front of error messages, as `kiln run` puts it.
    pub(crate) fn new(
        py: Python<'_>,
        artifact: AlignedBytes,
        weights: Option<AlignedBytes>,
        threads: usize,
        label: String,
    ) -> PyResult<Module> {
        let at = |e: Error| if label.is_empty() { e } else { e.context(&label) };
        let shared = Arc::new(py.detach(|| Loaded::new(artifact, weights)).map_err(at)?);
        let runner = Runner::new(Arc::clone(&shared), threads).map_err(at)?;
        let names = |ts: &[Tensor]| ts.iter().map(|t| PyString::intern(py, &t.name).unbind()).collect::<Vec<_>>();
        let descrs = |ts: &[Tensor]| ts.iter().map(|t| dtype::descr(py, t.code).map(Bound::unbind)).collect::<Vec<_>>();
        let infos = |ts: &[Tensor]| ts.iter().map(|t| info(py, t)).collect::<PyResult<Vec<_>>>();
        Ok(Module {
            in_names: names(&shared.inputs),
            in_descr: descrs(&shared.inputs),
            out_names: names(&shared.outputs),
            out_descr: descrs(&shared.outputs),
            in_info: infos(&shared.inputs)?,
            out_info: infos(&shared.outputs)?,
            runner: Mutex::new(runner),
            shared,
            threads,
            label,
        })
    }

    /// The output names in order (for `InferenceSession`).
    pub(crate) fn output_names(&self) -> impl Iterator<Item = &str> {
        self.shared.outputs.iter().map(|t| t.name.as_str())
    }

    /// The inputs' `TensorInfo`s in call order.
    pub(crate) fn input_info(&self, py: Python<'_>) -> Vec<Py<TensorInfo>> {
        self.in_info.iter().map(|i| i.clone_ref(py)).collect()
    }

    /// The outputs' `TensorInfo`s in order.
    pub(crate) fn output_info(&self, py: Python<'_>) -> Vec<Py<TensorInfo>> {
        self.out_info.iter().map(|i| i.clone_ref(py)).collect()
    }

    fn lock(&self) -> MutexGuard<'_, Runner> {
        // A panic while running leaves nothing half-changed that the next call relies
        // on (the argument lists are refilled every call).
        self.runner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks `feed` against the signature: each input's pointer and byte length, in
    /// signature order, and the arrays (a reference each, which keeps them alive while
    /// the GIL is released even if another thread empties `feed`).
    fn inputs_of<'py>(
        &self,
        py: Python<'py>,
        feed: &Bound<'py, PyDict>,
    ) -> Result<(Vec<InputArg>, Vec<Bound<'py, PyUntypedArray>>), Error> {
        let mut ins = Vec::with_capacity(self.shared.inputs.len());
        let mut arrays = Vec::with_capacity(self.shared.inputs.len());
        for (i, t) in self.shared.inputs.iter().enumerate() {
            let value = feed.get_item(self.in_names[i].bind(py)).map_err(|e| Error::input_type(e.to_string()))?;
            let Some(value) = value else {
                return Err(Error::invalid(format!(
                    "input `{}` ({}) is missing; the module's inputs are: {}",
                    t.name,
                    t.ty(),
                    self.names(&self.shared.inputs)
                )));
            };
            let a = check_array(py, "input", t, self.in_descr[i].as_ref(), &value)?;
            // A bounded input's extent is the array's (the runtime checks its range).
            let len = match t.bounded {
                Some(axis) => t.bytes / t.dims[axis].max(1) as usize * a.shape()[axis],
                None => t.bytes,
            };
            // SAFETY: `a` is a live numpy array (the GIL is held).
            ins.push((unsafe { array_data(&a) }.cast_const(), len));
            arrays.push(a);
        }
        if feed.len() != ins.len() {
            for key in feed.keys() {
                let known = self.in_names.iter().any(|n| n.bind(py).as_any().eq(&key).unwrap_or(false));
                if !known {
                    let key = key.str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into());
                    return Err(Error::invalid(format!(
                        "the module has no input named `{key}`; its inputs are: {}",
                        self.names(&self.shared.inputs)
                    )));
                }
            }
        }
        Ok((ins, arrays))
    }

    fn names(&self, ts: &[Tensor]) -> String {
        ts.iter().map(|t| format!("`{}` ({})", t.name, t.ty())).collect::<Vec<_>>().join(", ")
    }

    /// The outputs to write: the caller's arrays given in `out` (checked as inputs
    /// are, and writable), new arrays for the others.
    fn outputs_of<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
        let Some(out) = out else { return self.new_outputs(py, &[]) };
        let mut given = Vec::with_capacity(self.shared.outputs.len());
        for (i, t) in self.shared.outputs.iter().enumerate() {
            let a = match out.get_item(self.out_names[i].bind(py))? {
                None => None,
                Some(v) => {
                    let a = check_array(py, "output", t, self.out_descr[i].as_ref(), &v)?;
                    // SAFETY: a live numpy array (the GIL is held).
                    let flags = unsafe { (*numpy::npyffi::objects::_PyArray_GET_ITEM_DATA(a.as_array_ptr())).flags };
                    if flags & numpy::npyffi::NPY_ARRAY_WRITEABLE == 0 {
                        return Err(Error::invalid(format!("output `{}`: the array given is read-only", t.name)).into());
                    }
                    Some(a)
                }
            };
            given.push(a);
        }
        if out.len() != given.iter().flatten().count() {
            for key in out.keys() {
                if !self.out_names.iter().any(|n| n.bind(py).as_any().eq(&key).unwrap_or(false)) {
                    let key = key.str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into());
                    return Err(Error::invalid(format!(
                        "the module has no output named `{key}`; its outputs are: {}",
                        self.names(&self.shared.outputs)
                    ))
                    .into());
                }
            }
        }
        self.new_outputs(py, &given)
    }

    /// The arrays of `given` (one per output, or none), and a new zeroed, C-contiguous
    /// numpy array for each output without one.
    fn new_outputs<'py>(
        &self,
        py: Python<'py>,
        given: &[Option<Bound<'py, PyUntypedArray>>],
    ) -> Result<Vec<Bound<'py, PyUntypedArray>>, PyErr> {
        let mut outs = Vec::with_capacity(self.shared.outputs.len());
        for (i, (t, descr)) in self.shared.outputs.iter().zip(&self.out_descr).enumerate() {
            if let Some(Some(a)) = given.get(i) {
                outs.push(a.clone());
                continue;
            }
            let Some(descr) = descr else {
                return Err(Error::new(
                    Class::Unsupported,
                    format!("output `{}` has dtype {}, which numpy has no dtype for", t.name, dtype::of(t.code).name),
                )
                .into());
            };
            let nd = i32::try_from(t.npy_dims.len()).map_err(|_| Error::invalid("too many dimensions"))?;
            // SAFETY: `PyArray_Zeros` reads `nd` dims (it does not write them, whatever
            // its signature says) and steals the reference to the descriptor it is
            // given, which `into_dtype_ptr` hands over.
            let p = unsafe {
                PY_ARRAY_API.PyArray_Zeros(
                    py,
                    nd,
                    t.npy_dims.as_ptr().cast_mut(),
                    descr.bind(py).clone().into_dtype_ptr(),
                    0,
                )
            };
            // SAFETY: a new reference to an ndarray, or null with the error set.
            let a = unsafe { Bound::from_owned_ptr_or_err(py, p)? };
            outs.push(a.cast_into::<PyUntypedArray>()?);
        }
        Ok(outs)
    }

    /// Runs the module on `feed`, into the arrays of `out` where given: the output
    /// arrays in signature order (for `run` and `InferenceSession.run`).
    pub(crate) fn run_arrays<'py>(
        &self,
        py: Python<'py>,
        feed: &Bound<'py, PyDict>,
        out: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
        let (ins, _held) = self.inputs_of(py, feed)?;
        let outs = self.outputs_of(py, out)?;
        let args = Args {
            ins,
            outs: outs
                .iter()
                .zip(&self.shared.outputs)
                // SAFETY: live arrays (the GIL is held).
                .map(|(a, t)| (unsafe { array_data(a) }, t.bytes))
                .collect(),
        };
        if out.is_some() {
            self.check_overlaps(&args)?;
        }
        // SAFETY: the inputs point into the arrays of `feed` and the outputs into
        // `outs`, all alive (referenced by `_held` and `outs`) for the whole call, each of its byte
        // length (shape, dtype and contiguity checked); the outputs overlap nothing
        // (new arrays, or the caller's checked just above). Python code on another
        // thread touching these arrays meanwhile is the caller's race, as with any
        // buffer lent to native code.
        let resized = py
            .detach(move || unsafe {
                let mut r = self.lock();
                r.invoke(&args)?;
                Ok::<_, Error>(r.resized())
            })
            .map_err(|e| self.at(e))?;
        if resized.is_empty() {
            return Ok(outs);
        }
        // Outputs at their actual shape: views of the front of the bound-sized arrays.
        let mut outs = outs;
        for (k, dims) in resized {
            let numel: u64 = dims.iter().product();
            let flat = outs[k].call_method1("reshape", (-1i64,))?;
            let front = flat.get_item(pyo3::types::PySlice::new(py, 0, numel as isize, 1))?;
            let shaped = front.call_method1("reshape", (PyTuple::new(py, dims)?,))?;
            outs[k] = shaped.cast_into::<PyUntypedArray>()?;
        }
        Ok(outs)
    }

    /// No output's bytes overlap another output's or an input's (the caller's arrays
    /// given as outputs may be views of anything).
    fn check_overlaps(&self, args: &Args) -> Result<(), Error> {
        let ins =
            args.ins.iter().map(|&(p, len)| (p as usize, len)).zip(&self.shared.inputs).map(|(r, t)| (r, "input", t));
        let outs = args
            .outs
            .iter()
            .map(|&(p, len)| (p as usize, len))
            .zip(&self.shared.outputs)
            .map(|(r, t)| (r, "output", t));
        let all: Vec<_> = ins.chain(outs).collect();
        let first_output = args.ins.len();
        for (k, &((a, alen), _, ot)) in all.iter().enumerate().skip(first_output) {
            for (j, &((b, blen), what, t)) in all.iter().enumerate() {
                let overlap = alen > 0 && blen > 0 && a < b.saturating_add(blen) && b < a.saturating_add(alen);
                if j != k && overlap {
                    return Err(Error::invalid(format!(
                        "the array given for output `{}` overlaps the array of {what} `{}`",
                        ot.name, t.name
                    )));
                }
            }
        }
        Ok(())
    }

    fn at(&self, e: Error) -> Error {
        if self.label.is_empty() {
            e
        } else {
            e.context(&self.label)
        }
    }
}

/// `value` as the array `t` needs (`what`: "input" or "output" for messages): a
/// numpy array of dtype `descr` (byte order included), of `t`'s shape, C-contiguous.
fn check_array<'py>(
    py: Python<'py>,
    what: &str,
    t: &Tensor,
    descr: Option<&Py<PyArrayDescr>>,
    value: &Bound<'py, PyAny>,
) -> Result<Bound<'py, PyUntypedArray>, Error> {
    let Ok(a) = value.cast::<PyUntypedArray>() else {
        let ty = value.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        return Err(Error::input_type(format!(
            "{what} `{}`: expected a numpy.ndarray of {}, got {ty}",
            t.name,
            t.ty()
        )));
    };
    let Some(want) = descr else {
        return Err(Error::new(
            Class::Unsupported,
            format!("{what} `{}` has dtype {}, which numpy has no dtype for", t.name, dtype::of(t.code).name),
        ));
    };
    let got = a.dtype();
    if !got.is_equiv_to(want.bind(py)) {
        let got = got.str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into());
        return Err(Error::input_type(format!(
            "{what} `{}`: expected {}, got {got} {}",
            t.name,
            t.ty(),
            shape_str(a.shape())
        )));
    }
    // (A bounded input's axis takes any extent: the runtime checks its range.)
    let fits = |(i, (&g, &w)): (usize, (&usize, &u64))| g as u64 == w || t.bounded == Some(i);
    if a.shape().len() != t.dims.len() || !a.shape().iter().zip(&t.dims).enumerate().all(fits) {
        return Err(Error::invalid(format!(
            "{what} `{}`: expected {}, got shape {}",
            t.name,
            t.ty(),
            shape_str(a.shape())
        )));
    }
    if !a.is_c_contiguous() {
        return Err(Error::invalid(format!(
            "{what} `{}` is not C-contiguous (kiln reads and writes arrays in place, without a copy): pass np.ascontiguousarray(...)",
            t.name
        )));
    }
    // SAFETY: a live numpy array (the GIL is held).
    if unsafe { array_data(a) }.is_null() && t.bytes != 0 {
        return Err(Error::new(Class::Internal, format!("{what} `{}`: the array has no data", t.name)));
    }
    Ok(a.clone())
}

/// Summary statistics of timings, in milliseconds (as `kiln bench` computes them).
fn stats(v: &mut [f64]) -> (f64, f64, f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return (0.0, 0.0, 0.0, 0.0, 0.0);
    }
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
    let mean = v.iter().sum::<f64>() / n as f64;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
    (median, v[rank - 1], var.sqrt(), v[0], mean)
}

/// Deterministic inputs for `bench` when none are given: floats uniform in [0, 1)
/// (SplitMix64), every other dtype zeros (zero is a valid index and a valid bool).
fn bench_input(t: &Tensor, seed: &mut u64) -> AlignedBytes {
    let mut b = AlignedBytes::zeroed(t.bytes);
    let mut next = || {
        *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    match t.code {
        1 => b.bytes_mut().chunks_exact_mut(4).for_each(|c| c.copy_from_slice(&(next() as f32).to_ne_bytes())),
        11 => b.bytes_mut().chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&next().to_ne_bytes())),
        _ => {}
    }
    b
}

#[pymethods]
impl Module {
    /// Runs the module on ``inputs`` (a dict of input name to numpy array) and returns
    /// a dict of output name to a new numpy array, in the signature's order.
    ///
    /// Each input must be a C-contiguous numpy array of exactly the input's dtype and
    /// shape (see :attr:`inputs`): it is read in place, without a copy. Otherwise
    /// :class:`InputTypeError` (wrong dtype or not an array) or
    /// :class:`InvalidInputError` (missing or unknown name, wrong shape, not
    /// contiguous: ``np.ascontiguousarray`` makes it so) names the input and what it
    /// expects. Outputs are new arrays each call that the runtime writes directly;
    /// ``outputs`` (a dict of output name to array) names arrays of the caller's to
    /// write instead (checked as inputs are, writable, overlapping no other argument),
    /// which the returned dict then holds.
    /// The GIL is released while the module runs; do not write the input arrays from
    /// another thread meanwhile.
    #[pyo3(signature = (inputs, outputs=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyAny>,
        outputs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let feed = inputs.cast::<PyDict>().map_err(|_| {
            Error::input_type(format!(
                "run() takes a dict of input name to numpy array, got {}",
                inputs.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ))
        })?;
        let outs = self.run_arrays(py, feed, outputs)?;
        let d = PyDict::new(py);
        for (name, a) in self.out_names.iter().zip(outs) {
            d.set_item(name.bind(py), a)?;
        }
        Ok(d)
    }

    /// The inputs in call order: a list of :class:`TensorInfo` (name, dtype, shape).
    #[getter]
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.input_info(py))
    }

    /// The outputs in order: a list of :class:`TensorInfo`.
    #[getter]
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.output_info(py))
    }

    /// Threads each run uses (the calling one included).
    #[getter]
    fn threads(&self) -> usize {
        self.threads
    }

    /// What the artifact holds, as a dict: ``bytes``, ``format`` and ``abi`` versions,
    /// ``sections`` (kind and bytes of each), ``cpu_features`` the code needs,
    /// ``code_bytes``, ``constants`` (``embedded``, ``bytes``, ``file``), ``kernels``,
    /// ``entry`` (the entry point run) and ``entries``: per entry point its ``name``,
    /// ``inputs`` and ``outputs`` (name, dtype, shape), ``commands``, ``dispatches``,
    /// ``arena_bytes`` and ``arena_align``; and ``threads``.
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = &self.shared;
        let bytes = s.owned.artifact();
        let container = kiln_module::Module::parse(bytes).map_err(|e| Error::new(Class::Internal, e.to_string()))?;
        let program = s.owned.module().verified().program();
        let d = PyDict::new(py);
        d.set_item("bytes", bytes.len())?;
        d.set_item("format", container.format().to_string())?;
        d.set_item("abi", container.abi().to_string())?;
        let sections = PyList::empty(py);
        for sec in container.sections() {
            let e = PyDict::new(py);
            e.set_item("kind", sec.kind.to_string())?;
            e.set_item("bytes", sec.bytes.len())?;
            sections.append(e)?;
        }
        d.set_item("sections", sections)?;
        let features = program.executables.iter().fold(0u64, |f, e| f | e.features);
        let names: Vec<&str> = CpuFeature::ALL.iter().filter(|f| features & f.bit() != 0).map(|f| f.name()).collect();
        d.set_item("cpu_features", names)?;
        d.set_item("code_bytes", program.executables.iter().map(|e| e.code.len()).sum::<usize>())?;
        let c = PyDict::new(py);
        match program.to_program().constants {
            Constants::Embedded(b) => {
                c.set_item("embedded", true)?;
                c.set_item("bytes", b.len())?;
                c.set_item("file", py.None())?;
            }
            Constants::External { file, size, .. } => {
                c.set_item("embedded", false)?;
                c.set_item("bytes", size)?;
                c.set_item("file", file)?;
            }
        }
        d.set_item("constants", c)?;
        d.set_item("kernels", program.kernels.len())?;
        d.set_item("entry", program.entries.get(s.entry).map(|e| e.name))?;
        let entries = PyList::empty(py);
        for e in &program.entries {
            let x = PyDict::new(py);
            x.set_item("name", e.name)?;
            let tensors = |ts: &[kiln_module::sections::TensorView<'_>]| -> PyResult<Bound<'py, PyList>> {
                let l = PyList::empty(py);
                for t in ts {
                    let td = PyDict::new(py);
                    td.set_item("name", t.name)?;
                    td.set_item("dtype", dtype::of(t.dtype).name)?;
                    td.set_item("shape", PyTuple::new(py, t.dims.iter().copied())?)?;
                    l.append(td)?;
                }
                Ok(l)
            };
            x.set_item("inputs", tensors(&e.inputs)?)?;
            x.set_item("outputs", tensors(&e.outputs)?)?;
            x.set_item("commands", e.commands.len())?;
            x.set_item("dispatches", e.commands.iter().filter(|c| matches!(c, Command::Dispatch { .. })).count())?;
            x.set_item("arena_bytes", e.arena_size)?;
            x.set_item("arena_align", e.arena_align)?;
            entries.append(x)?;
        }
        d.set_item("entries", entries)?;
        d.set_item("threads", self.threads)?;
        Ok(d)
    }

    /// Times the module's invoke alone, in Rust, with the GIL released: ``warmup``
    /// untimed calls, then ``iterations`` timed ones on buffers prepared beforehand
    /// (``inputs`` when given, checked as :meth:`run` checks them and copied once;
    /// else floats uniform in [0, 1) and zeros for other dtypes). Returns a dict of
    /// ``median_ms``, ``p99_ms``, ``stddev_ms``, ``min_ms``, ``mean_ms``,
    /// ``iterations``, ``warmup`` and ``threads``, computed as ``kiln bench`` does.
    #[pyo3(signature = (iterations=100, warmup=10, inputs=None))]
    fn bench<'py>(
        &self,
        py: Python<'py>,
        iterations: usize,
        warmup: usize,
        inputs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if iterations == 0 {
            return Err(Error::invalid("iterations must be at least 1").into());
        }
        let ins: Vec<AlignedBytes> = match inputs {
            Some(feed) => {
                let (given, _held) = self.inputs_of(py, feed)?;
                given
                    .iter()
                    .map(|&(p, len)| {
                        // SAFETY: checked by `inputs_of`: `len` readable bytes of a live
                        // array of `feed` (the GIL is held).
                        AlignedBytes::copy_from(if len == 0 {
                            &[]
                        } else {
                            unsafe { std::slice::from_raw_parts(p, len) }
                        })
                    })
                    .collect()
            }
            None => {
                let mut seed = 0u64;
                self.shared.inputs.iter().map(|t| bench_input(t, &mut seed)).collect()
            }
        };
        let mut outs: Vec<AlignedBytes> = self.shared.outputs.iter().map(|t| AlignedBytes::zeroed(t.bytes)).collect();
        let args = Args {
            ins: ins.iter().map(|b| (b.bytes().as_ptr(), b.bytes().len())).collect(),
            outs: outs.iter_mut().map(|b| (b.bytes_mut().as_mut_ptr(), b.bytes().len())).collect(),
        };
        let times = py.detach(move || -> Result<Vec<f64>, Error> {
            let mut r = self.lock();
            for _ in 0..warmup {
                // SAFETY: the buffers of `ins` and `outs`, alive for the whole call,
                // of their tensors' sizes, distinct allocations.
                unsafe { r.invoke(&args)? };
            }
            let mut ms = Vec::with_capacity(iterations);
            for _ in 0..iterations {
                let t = Instant::now();
                // SAFETY: as above.
                unsafe { r.invoke(&args)? };
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            Ok(ms)
        });
        let mut ms = times.map_err(|e| self.at(e))?;
        let (median, p99, stddev, min, mean) = stats(&mut ms);
        let d = PyDict::new(py);
        d.set_item("median_ms", median)?;
        d.set_item("p99_ms", p99)?;
        d.set_item("stddev_ms", stddev)?;
        d.set_item("min_ms", min)?;
        d.set_item("mean_ms", mean)?;
        d.set_item("iterations", iterations)?;
        d.set_item("warmup", warmup)?;
        d.set_item("threads", self.threads)?;
        drop(outs);
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let sig = |ts: &[Tensor]| ts.iter().map(|t| format!("{}: {}", t.name, t.ty())).collect::<Vec<_>>().join(", ");
        format!(
            "<kiln.Module ({}) -> ({}), {} thread{}>",
            sig(&self.shared.inputs),
            sig(&self.shared.outputs),
            self.threads,
            if self.threads == 1 { "" } else { "s" }
        )
    }
}

/// Threads for `threads` (None: one per core, as `kiln run` does).
pub(crate) fn thread_count(threads: Option<usize>) -> Result<usize, Error> {
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if n == 0 {
        return Err(Error::invalid("threads=0: at least one thread is needed"));
    }
    if n > kiln_runtime::MAX_THREADS {
        return Err(Error::invalid(format!("threads={n}: at most {} are supported", kiln_runtime::MAX_THREADS)));
    }
    Ok(n)
}

/// Reads a file into a 64-byte-aligned buffer (so that the constants are used in
/// place).
pub(crate) fn read(path: &Path) -> Result<AlignedBytes, Error> {
    AlignedBytes::read(path).map_err(|e| Error::invalid(format!("cannot read `{}`: {e}", path.display())))
}
