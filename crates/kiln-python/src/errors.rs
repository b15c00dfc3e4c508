//! kiln's Python exception classes and how compile and runtime errors map to them.
//!
//! ```text
//! Exception
//! └── kiln.KilnError                        every error kiln raises
//!     ├── kiln.InvalidInputError (ValueError)  the caller fixes the input: a model, an
//!     │   │                                    artifact, an option, a tensor's name/shape
//!     │   └── kiln.InputTypeError (TypeError)  a tensor of the wrong dtype or Python type
//!     ├── kiln.UnsupportedError                valid, but kiln cannot do it (yet)
//!     └── kiln.InternalError                   a bug in kiln
//! ```
//!
//! The mixed-in built-ins let code written for ONNX Runtime or numpy (`except
//! ValueError`) catch them too. The classes are made at import with `type(...)`:
//! PyO3's `create_exception!` takes one base only.

use kiln_compiler::{CompileError, ErrorKind};
use kiln_runtime::RuntimeError;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// The exception classes, made once at import.
pub(crate) struct Classes {
    pub(crate) base: Py<PyType>,
    pub(crate) invalid: Py<PyType>,
    pub(crate) input_type: Py<PyType>,
    pub(crate) unsupported: Py<PyType>,
    pub(crate) internal: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// Which class an error is raised as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// `kiln.KilnError` itself: a failure that is nobody's input nor a bug (the
    /// system refused memory or a thread).
    Base,
    /// `kiln.InvalidInputError`.
    Invalid,
    /// `kiln.InputTypeError`.
    InputType,
    /// `kiln.UnsupportedError`.
    Unsupported,
    /// `kiln.InternalError`.
    Internal,
}

/// An error on its way to Python: its class and its message.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) class: Class,
    pub(crate) message: String,
}

impl Error {
    pub(crate) fn new(class: Class, message: impl Into<String>) -> Error {
        Error { class, message: message.into() }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Class::Invalid, message)
    }

    pub(crate) fn input_type(message: impl Into<String>) -> Error {
        Error::new(Class::InputType, message)
    }

    /// `message (note)`, the class unchanged.
    pub(crate) fn context_after(self, note: impl std::fmt::Display) -> Error {
        Error { class: self.class, message: format!("{} ({note})", self.message) }
    }

    /// `context: message`, the class unchanged.
    pub(crate) fn context(self, context: impl std::fmt::Display) -> Error {
        Error { class: self.class, message: format!("{context}: {}", self.message) }
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        Python::attach(|py| match CLASSES.get(py) {
            Some(c) => {
                let ty = match e.class {
                    Class::Base => &c.base,
                    Class::Invalid => &c.invalid,
                    Class::InputType => &c.input_type,
                    Class::Unsupported => &c.unsupported,
                    Class::Internal => &c.internal,
                };
                PyErr::from_type(ty.bind(py).clone(), e.message)
            }
            // Only before the module finished importing.
            None => PyException::new_err(e.message),
        })
    }
}

/// The class of a compile error ([`CompileError::kind`]).
pub(crate) fn compile_class(e: &CompileError) -> Class {
    match e.kind() {
        ErrorKind::InvalidInput => Class::Invalid,
        ErrorKind::Unsupported => Class::Unsupported,
        ErrorKind::Internal => Class::Internal,
    }
}

/// The class of a runtime error (as the C API's `status_of` sorts them).
pub(crate) fn runtime_class(e: &RuntimeError) -> Class {
    use RuntimeError as E;
    #[allow(unreachable_patterns)]
    match e {
        E::BadMagic | E::Checksum { .. } | E::Container(_) | E::Malformed(_) | E::Invalid(_) => Class::Invalid,
        E::NoSuchEntry { .. } => Class::Invalid,
        E::UnsupportedFormat { .. } | E::UnsupportedVersion { .. } => Class::Unsupported,
        E::AllocatorNotRouted => Class::Invalid,
        E::MissingCpuFeatures { .. } | E::NoCpuVariant { .. } | E::WrongArchitecture { .. } => Class::Unsupported,
        E::WeightsMissing { .. } | E::WeightsMismatch { .. } | E::WeightsNotExpected => Class::Invalid,
        E::ArenaTooSmall { .. } | E::ArenaMisaligned { .. } => Class::Invalid,
        E::InputCount { .. } | E::OutputCount { .. } | E::InputSize { .. } | E::OutputSize { .. } => Class::Invalid,
        E::InputShape { .. } | E::OutputShape { .. } | E::InputExtent { .. } => Class::Invalid,
        E::InputDtype { .. } | E::OutputDtype { .. } => Class::InputType,
        // Data past the bound compiled for, or run-time dims other than the compiled ones:
        // the input does not fit this module (the C API's OVER_BOUND and INVALID_ARGUMENT).
        E::ExtentOutOfBound { .. } | E::ShapeCheck { .. } => Class::Invalid,
        // The system refused memory or a worker thread, or a worker died.
        E::ArenaAlloc { .. } | E::Threads { .. } | E::Load { .. } | E::WorkerLost => Class::Base,
        // A variant added to the runtime later: reported with its message.
        _ => Class::Base,
    }
}

impl From<RuntimeError> for Error {
    fn from(e: RuntimeError) -> Error {
        Error::new(runtime_class(&e), e.to_string())
    }
}

/// Makes the classes and adds them to module `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let make = |name: &str, bases: Bound<'_, PyTuple>, doc: &str| -> PyResult<Py<PyType>> {
        let ns = PyDict::new(py);
        ns.set_item("__module__", "kiln")?;
        ns.set_item("__doc__", doc)?;
        let t = py.get_type::<PyType>().call1((name, bases, ns))?;
        Ok(t.cast_into::<PyType>()?.unbind())
    };
    let base = make(
        "KilnError",
        PyTuple::new(py, [py.get_type::<PyException>()])?,
        "Base class of every error kiln raises; its message is the one the kiln command line prints.",
    )?;
    let invalid = make(
        "InvalidInputError",
        PyTuple::new(py, [base.bind(py).clone(), py.get_type::<PyValueError>()])?,
        "The input is malformed or does not fit: a model or artifact that cannot be read, an option, \
         a tensor's name or shape. Also a ValueError.",
    )?;
    let input_type = make(
        "InputTypeError",
        PyTuple::new(py, [invalid.bind(py).clone(), py.get_type::<PyTypeError>()])?,
        "A tensor of the wrong dtype, or an argument of the wrong Python type. Also a TypeError.",
    )?;
    let unsupported = make(
        "UnsupportedError",
        PyTuple::new(py, [base.bind(py).clone()])?,
        "The input is valid but uses an op, a form of an op, a dtype or a CPU feature kiln does not support (yet).",
    )?;
    let internal = make(
        "InternalError",
        PyTuple::new(py, [base.bind(py).clone()])?,
        "A bug in kiln: please report it with the model that triggers it.",
    )?;
    // A second import of the extension in one process keeps the first classes.
    let _ = CLASSES.set(py, Classes { base, invalid, input_type, unsupported, internal });
    if let Some(c) = CLASSES.get(py) {
        for (name, t) in [
            ("KilnError", &c.base),
            ("InvalidInputError", &c.invalid),
            ("InputTypeError", &c.input_type),
            ("UnsupportedError", &c.unsupported),
            ("InternalError", &c.internal),
        ] {
            m.add(name, t.bind(py))?;
        }
    }
    Ok(())
}
