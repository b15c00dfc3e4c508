//! kiln's C API: load a `.kiln` artifact, query its inputs and outputs, instantiate it
//! (optionally in caller-provided memory or with the caller's allocator), set inputs and
//! read outputs without copies where the caller's buffers fit, and invoke it.
//!
//! Built as a static library (`libkiln_capi.a`), a shared library (`libkiln_capi.so`)
//! and an rlib; the C header `include/kiln.h` is generated from this crate by cbindgen
//! (`tests/header.rs` checks that the committed header is current; `KILN_BLESS=1`
//! rewrites it). The crate links the runtime only, never compiler code.
//!
//! ```text
//! kiln_module_load_file / _load_bytes / _load_bytes_nocopy   → kiln_module*   (verified, code placed)
//! kiln_module_input_count / _input_info / _input_index ...   signature queries
//! kiln_instance_create / _create_in / _create_with_allocator → kiln_instance* (arena, workers)
//! kiln_instance_set_input / _bind_input / _input_buffer      inputs: copied, or read in place
//! kiln_instance_invoke                                        runs the module's main entry point
//! kiln_instance_output / _bind_output                         outputs: read in place, or written to the caller's buffer
//! kiln_instance_output_shape                                  an output's actual shape (data-dependent extents)
//! ```
//!
//! Every function that can fail returns a `kiln_status`; `kiln_last_error_message`
//! then says what failed and where. No panic crosses the boundary: a panic (a bug in
//! kiln) is caught and reported as `kiln_status::Internal` — except in builds with
//! `panic = "abort"` (the workspace's `runner` profile), where it aborts the process.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]

mod error;
mod module;
// After `module`: cbindgen writes declarations in this order.
mod instance;

pub use error::kiln_last_error_message;
pub use instance::{
    kiln_instance, kiln_instance_bind_input, kiln_instance_bind_output, kiln_instance_create, kiln_instance_create_in,
    kiln_instance_create_with_allocator, kiln_instance_free, kiln_instance_input_buffer, kiln_instance_invoke,
    kiln_instance_output, kiln_instance_output_shape, kiln_instance_set_input, kiln_instance_threads,
};
pub use module::{
    kiln_module, kiln_module_arena_align, kiln_module_arena_size, kiln_module_free, kiln_module_input_count,
    kiln_module_input_index, kiln_module_input_info, kiln_module_load_bytes, kiln_module_load_bytes_nocopy,
    kiln_module_load_file, kiln_module_output_count, kiln_module_output_index, kiln_module_output_info,
};

use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

/// Major version of this C API: changes when a declaration of `kiln.h` changes
/// incompatibly. Compare with `kiln_capi_version() >> 16` to check that the library
/// linked is the one the header describes.
pub const KILN_CAPI_VERSION_MAJOR: u32 = 1;

/// Minor version of this C API: grows when declarations are added (1:
/// `kiln_instance_output_shape` and `KILN_STATUS_OVER_BOUND`, for data-dependent output
/// sizes).
pub const KILN_CAPI_VERSION_MINOR: u32 = 1;

/// What a call did: `KILN_STATUS_OK`, or why it failed (`kiln_last_error_message` has
/// the details).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kiln_status {
    /// Success.
    Ok = 0,
    /// An argument is wrong: a null pointer, an index out of range, a buffer of the
    /// wrong size, an input not set, a thread count out of range, a caller's arena too
    /// small or misaligned.
    InvalidArgument = 1,
    /// The artifact is not a well-formed `.kiln` module: bad magic, truncated, corrupt
    /// (checksums), malformed sections, or a plan that fails verification.
    InvalidArtifact = 2,
    /// The artifact is well formed but this runtime cannot run it: another container
    /// format or kernel ABI version, or kernels that need CPU features this machine lacks.
    Unsupported = 3,
    /// The module's external weights are missing, not the ones it was compiled with, or
    /// given for a module that embeds its weights.
    Weights = 4,
    /// A file could not be read.
    Io = 5,
    /// Memory could not be allocated (the arena, or by the caller's allocator).
    OutOfMemory = 6,
    /// The system refused something while running: executable memory for the code, a
    /// worker thread; or a worker thread stopped (make a new instance).
    Runtime = 7,
    /// A name looked up is not an input or output of the module.
    NotFound = 8,
    /// A bug in kiln (a caught panic); the message says where.
    Internal = 9,
    /// The data needed more entries in a data-dependent output (NonZero,
    /// NonMaxSuppression, …) than the bound the module was compiled for (`kiln compile
    /// --max-dim NAME=N` raises it); the outputs of that invoke are not valid.
    OverBound = 10,
}

/// Element types, by their ONNX `TensorProto.DataType` code (the codes a `.kiln`
/// artifact's signature records). Packed 4-bit types store two elements a byte.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum kiln_dtype {
    /// Not a type kiln knows (never reported for a verified module).
    Undefined = 0,
    /// 32-bit IEEE float.
    F32 = 1,
    /// Unsigned 8-bit integer.
    U8 = 2,
    /// Signed 8-bit integer.
    I8 = 3,
    /// Unsigned 16-bit integer.
    U16 = 4,
    /// Signed 16-bit integer.
    I16 = 5,
    /// Signed 32-bit integer.
    I32 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
    /// Boolean, one byte (0 or 1).
    Bool = 9,
    /// 16-bit IEEE float.
    F16 = 10,
    /// 64-bit IEEE float.
    F64 = 11,
    /// Unsigned 32-bit integer.
    U32 = 12,
    /// Unsigned 64-bit integer.
    U64 = 13,
    /// bfloat16.
    Bf16 = 16,
    /// 8-bit float E4M3, finite only.
    F8e4m3fn = 17,
    /// 8-bit float E4M3, finite only, no negative zero.
    F8e4m3fnuz = 18,
    /// 8-bit float E5M2.
    F8e5m2 = 19,
    /// 8-bit float E5M2, finite only, no negative zero.
    F8e5m2fnuz = 20,
    /// Unsigned 4-bit integer (packed).
    U4 = 21,
    /// Signed 4-bit integer (packed).
    I4 = 22,
    /// 4-bit float E2M1 (packed).
    F4e2m1fn = 23,
    /// 8-bit exponent-only float E8M0.
    F8e8m0fnu = 24,
}

impl kiln_dtype {
    /// The enum value of an ONNX dtype code (`kiln_dtype::Undefined` for codes kiln
    /// does not run).
    pub fn from_code(code: u32) -> kiln_dtype {
        use kiln_dtype as D;
        match code {
            1 => D::F32,
            2 => D::U8,
            3 => D::I8,
            4 => D::U16,
            5 => D::I16,
            6 => D::I32,
            7 => D::I64,
            9 => D::Bool,
            10 => D::F16,
            11 => D::F64,
            12 => D::U32,
            13 => D::U64,
            16 => D::Bf16,
            17 => D::F8e4m3fn,
            18 => D::F8e4m3fnuz,
            19 => D::F8e5m2,
            20 => D::F8e5m2fnuz,
            21 => D::U4,
            22 => D::I4,
            23 => D::F4e2m1fn,
            24 => D::F8e8m0fnu,
            _ => D::Undefined,
        }
    }
}

/// One input or output of a module's entry point. Every pointer is owned by the module
/// and valid until the module is freed (and its last instance with it).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_tensor_info {
    /// Its name in the source model: UTF-8, NUL-terminated (a NUL inside the recorded
    /// name is replaced by U+FFFD).
    pub name: *const c_char,
    /// Element type.
    pub dtype: kiln_dtype,
    /// Number of dimensions (0 for a scalar).
    pub rank: usize,
    /// `rank` dimensions, outermost first (dense, row-major layout).
    pub dims: *const u64,
    /// Bytes the tensor occupies: what `kiln_instance_set_input` and the output
    /// functions expect.
    pub byte_size: usize,
}

/// A caller's allocator for an instance's memory (see
/// `kiln_instance_create_with_allocator`). `alloc` returns `size` bytes aligned to
/// `align` (a power of two), or NULL; `free` releases a block `alloc` returned, with the
/// same size and alignment. Both receive `ctx`. They are called from the thread that
/// creates or frees the instance, never during `kiln_instance_invoke`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kiln_allocator {
    /// Allocates `size` bytes aligned to `align`; NULL when it cannot.
    pub alloc: Option<unsafe extern "C" fn(ctx: *mut c_void, size: usize, align: usize) -> *mut c_void>,
    /// Releases a block from `alloc`.
    pub free: Option<unsafe extern "C" fn(ctx: *mut c_void, p: *mut c_void, size: usize, align: usize)>,
    /// Passed to both.
    pub ctx: *mut c_void,
}

/// The library's version, the C API's, and the artifact format and kernel ABI versions
/// it reads, as one NUL-terminated line, e.g.
/// `kiln 0.1.0 (C API 1.0, artifact format 1.1, kernel ABI 1.0)`. Static; never NULL.
#[no_mangle]
pub extern "C" fn kiln_version() -> *const c_char {
    static VERSION: OnceLock<CString> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            let s = format!(
                "kiln {} (C API {KILN_CAPI_VERSION_MAJOR}.{KILN_CAPI_VERSION_MINOR}, artifact format {}, kernel ABI {})",
                env!("CARGO_PKG_VERSION"),
                ::kiln_module::FORMAT_VERSION,
                kiln_runtime::RUNTIME_ABI,
            );
            // The pieces are version numbers: no NUL inside.
            CString::new(s).unwrap_or_default()
        })
        .as_ptr()
}

/// The C API version of the library linked: `KILN_CAPI_VERSION_MAJOR << 16 |
/// KILN_CAPI_VERSION_MINOR`. A program built against `kiln.h` should check that the
/// major part equals its header's.
#[no_mangle]
pub extern "C" fn kiln_capi_version() -> u32 {
    (KILN_CAPI_VERSION_MAJOR << 16) | KILN_CAPI_VERSION_MINOR
}
