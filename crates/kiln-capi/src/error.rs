//! Status codes, the thread-local last error message, and the guard every exported
//! function runs its body in (no panic crosses the C boundary).

use crate::kiln_status;
use kiln_runtime::RuntimeError;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A failure: the status returned and the message `kiln_last_error_message` gives.
#[derive(Debug)]
pub(crate) struct Error {
    pub(crate) status: kiln_status,
    pub(crate) message: String,
}

impl Error {
    pub(crate) fn new(status: kiln_status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    pub(crate) fn arg(message: impl Into<String>) -> Error {
        Error::new(kiln_status::InvalidArgument, message)
    }

    /// `context: message` with the status unchanged.
    pub(crate) fn context(self, context: impl core::fmt::Display) -> Error {
        Error { status: self.status, message: format!("{context}: {}", self.message) }
    }
}

impl From<RuntimeError> for Error {
    fn from(e: RuntimeError) -> Error {
        Error { status: status_of(&e), message: e.to_string() }
    }
}

/// The status a runtime error maps to.
pub(crate) fn status_of(e: &RuntimeError) -> kiln_status {
    use kiln_status as S;
    use RuntimeError as E;
    #[allow(unreachable_patterns)]
    match e {
        E::BadMagic | E::Checksum { .. } | E::Container(_) | E::Malformed(_) | E::Invalid(_) => S::InvalidArtifact,
        E::NoSuchEntry { .. } => S::InvalidArtifact,
        E::UnsupportedFormat { .. } | E::UnsupportedVersion { .. } => S::Unsupported,
        E::AllocatorNotRouted => S::InvalidArgument,
        E::MissingCpuFeatures { .. } | E::NoCpuVariant { .. } | E::WrongArchitecture { .. } => S::Unsupported,
        E::WeightsMissing { .. } | E::WeightsMismatch { .. } | E::WeightsNotExpected => S::Weights,
        E::ArenaAlloc { .. } => S::OutOfMemory,
        E::ArenaTooSmall { .. } | E::ArenaMisaligned { .. } => S::InvalidArgument,
        E::InputCount { .. } | E::OutputCount { .. } => S::InvalidArgument,
        E::InputSize { .. } | E::OutputSize { .. } | E::InputExtent { .. } => S::InvalidArgument,
        E::InputDtype { .. } | E::OutputDtype { .. } => S::InvalidArgument,
        E::InputShape { .. } | E::OutputShape { .. } => S::InvalidArgument,
        // Thread counts are checked before the runtime sees them: what is left is the
        // system refusing a worker.
        E::Threads { .. } | E::Load { .. } | E::WorkerLost => S::Runtime,
        E::ExtentOutOfBound { .. } => S::OverBound,
        E::ShapeCheck { .. } => S::InvalidArgument,
        // A variant added to the runtime later: reported, with its message.
        _ => S::Runtime,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn record(message: &str) {
    // A message is text from kiln or from the artifact: a NUL inside it would cut it.
    let c = CString::new(message.replace('\0', "\u{FFFD}")).unwrap_or_default();
    // `try_with`: during thread teardown there is nowhere to put it.
    let _ = LAST_ERROR.try_with(|m| *m.borrow_mut() = c);
}

/// The message of the last call on this thread that failed: what failed and where, one
/// line of UTF-8, NUL-terminated. Calls that succeed leave it as it is; before any
/// failure it is the empty string. Owned by the library: valid until the next failing
/// call on the same thread. Never NULL.
#[no_mangle]
pub extern "C" fn kiln_last_error_message() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    LAST_ERROR.try_with(|m| m.borrow().as_ptr()).unwrap_or(EMPTY.as_ptr().cast())
}

/// Runs an exported function's body: its error (prefixed with the function's name) or
/// a caught panic becomes the status returned and the thread's last error message.
pub(crate) fn guard(function: &str, body: impl FnOnce() -> Result<(), Error>) -> kiln_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => kiln_status::Ok,
        Ok(Err(e)) => {
            record(&format!("{function}: {}", e.message));
            e.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            record(&format!("{function}: internal error (a bug in kiln, please report it): {what}"));
            kiln_status::Internal
        }
    }
}

/// Runs a function's body that cannot report (the `_free` functions): a panic is
/// swallowed and recorded rather than unwinding into C.
pub(crate) fn guard_void(function: &str, body: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(body)).is_err() {
        record(&format!("{function}: internal error (a bug in kiln, please report it)"));
    }
}

/// `Err(InvalidArgument)` naming `name` when `p` is null.
pub(crate) fn non_null<T>(p: *const T, name: &str) -> Result<(), Error> {
    if p.is_null() {
        return Err(Error::arg(format!("`{name}` is NULL")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn message() -> String {
        // SAFETY: never NULL, NUL-terminated.
        unsafe { CStr::from_ptr(kiln_last_error_message()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_becomes_an_internal_error_with_its_message() {
        let s = guard("kiln_test", || -> Result<(), Error> { panic!("boom at {}", 7) });
        assert_eq!(s, kiln_status::Internal);
        assert_eq!(message(), "kiln_test: internal error (a bug in kiln, please report it): boom at 7");
        guard_void("kiln_test_void", || panic!("quiet"));
        assert_eq!(message(), "kiln_test_void: internal error (a bug in kiln, please report it)");
    }

    #[test]
    fn errors_carry_status_and_context_and_successes_keep_the_message() {
        let s = guard("kiln_test", || Err(Error::arg("bad\0thing").context("here")));
        assert_eq!(s, kiln_status::InvalidArgument);
        assert_eq!(message(), "kiln_test: here: bad\u{FFFD}thing");
        assert_eq!(guard("kiln_ok", || Ok(())), kiln_status::Ok);
        assert_eq!(message(), "kiln_test: here: bad\u{FFFD}thing");
        let e = Error::from(RuntimeError::WeightsNotExpected);
        assert_eq!(
            (e.status, e.message.as_str()),
            (kiln_status::Weights, "a weights file was given but the module embeds its weights")
        );
        assert_eq!(status_of(&RuntimeError::ArenaAlloc { bytes: 1 }), kiln_status::OutOfMemory);
        assert_eq!(status_of(&RuntimeError::BadMagic), kiln_status::InvalidArtifact);
    }
}
