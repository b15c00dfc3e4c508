//! `kiln_module`: a loaded artifact (the runtime's [`OwnedModule`]), and the signature
//! queries.

use crate::error::{guard, guard_void, non_null, Error};
use crate::{kiln_dtype, kiln_status, kiln_tensor_info};
use ::kiln_module::sections::TensorView;
use kiln_runtime::fs::AlignedBytes;
use kiln_runtime::OwnedModule;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A loaded, verified module whose code is placed and ready to instantiate. Opaque;
/// created by `kiln_module_load_*`, released by `kiln_module_free`. Immutable after
/// loading, so it may be queried and instantiated from several threads at once. Every
/// instance holds a reference to it: the module lives until it is freed and its last
/// instance is.
// The handle is `Arc::into_raw` of an `Arc<kiln_module>`; instances hold clones.
pub struct kiln_module {
    /// The runtime's module and the bytes it reads (copies it owns, or the caller's for
    /// `kiln_module_load_bytes_nocopy`).
    pub(crate) owned: OwnedModule,
    /// The entry point this API runs: `main`, else the first.
    pub(crate) entry: usize,
    pub(crate) inputs: Vec<Tensor>,
    pub(crate) outputs: Vec<Tensor>,
}

// Proof that sharing a module between threads (its `Arc` is cloned by instances
// created anywhere) is sound.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<kiln_module>();
};

/// A signature entry with a NUL-terminated name, for `kiln_tensor_info`.
pub(crate) struct Tensor {
    name: CString,
    dtype: u32,
    dims: Vec<u64>,
    pub(crate) bytes: usize,
    /// A bounded input dimension (format 1.6 on): its axis and the extents it takes
    /// (`min..=bound`; `dims` are the bound's).
    pub(crate) bounded: Option<(usize, u64, u64)>,
}

impl Tensor {
    fn new(t: &TensorView<'_>) -> Result<Tensor, Error> {
        // A NUL inside a recorded name would end the C string early.
        let name = CString::new(t.name.replace('\0', "\u{FFFD}")).unwrap_or_default();
        // Verified at load: the byte size fits usize.
        let bytes = usize::try_from(t.bytes)
            .map_err(|_| Error::new(kiln_status::InvalidArtifact, format!("tensor {} is too large", t.name)))?;
        Ok(Tensor { name, dtype: t.dtype, dims: t.dims.clone(), bytes, bounded: None })
    }

    /// Its dims as the signature records them.
    pub(crate) fn dims(&self) -> &[u64] {
        &self.dims
    }

    fn info(&self) -> kiln_tensor_info {
        kiln_tensor_info {
            name: self.name.as_ptr(),
            dtype: kiln_dtype::from_code(self.dtype),
            rank: self.dims.len(),
            dims: self.dims.as_ptr(),
            byte_size: self.bytes,
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.name.to_str().unwrap_or("?")
    }
}

impl kiln_module {
    /// The C API's module around a loaded one: its default entry point's signature.
    fn new(owned: OwnedModule) -> Result<Arc<kiln_module>, Error> {
        let sig = owned.module().signature();
        let entry = sig
            .default_entry()
            .ok_or_else(|| Error::new(kiln_status::InvalidArtifact, "the module has no entry points"))?;
        let mut inputs = entry.inputs.iter().map(Tensor::new).collect::<Result<Vec<_>, _>>()?;
        for b in entry.bounded {
            if let Some(t) = inputs.get_mut(b.input as usize) {
                t.bounded = Some((b.axis as usize, b.min, b.bound));
            }
        }
        let outputs = entry.outputs.iter().map(Tensor::new).collect::<Result<Vec<_>, _>>()?;
        let entry = entry.index;
        Ok(Arc::new(kiln_module { owned, entry, inputs, outputs }))
    }

    fn input(&self, index: usize) -> Result<&Tensor, Error> {
        self.inputs.get(index).ok_or_else(|| {
            Error::arg(format!("input index {index} is out of range (the module has {} inputs)", self.inputs.len()))
        })
    }

    fn output(&self, index: usize) -> Result<&Tensor, Error> {
        self.outputs.get(index).ok_or_else(|| {
            Error::arg(format!("output index {index} is out of range (the module has {} outputs)", self.outputs.len()))
        })
    }
}

/// A `'static` view of caller memory, checked for null.
///
/// # Safety
///
/// `data` points to `len` readable bytes that stay valid and unmodified for as long as
/// the view is used.
unsafe fn caller_bytes(data: *const u8, len: usize, name: &str) -> Result<&'static [u8], Error> {
    non_null(data, name)?;
    if len > isize::MAX as usize {
        return Err(Error::arg(format!("`{name}` length {len} is larger than any buffer")));
    }
    // SAFETY: the caller's contract above; not null; the length fits isize.
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// The external weights given from C: none for NULL with length 0 (a module that
/// embeds its weights), else a view as [`caller_bytes`] makes it.
///
/// # Safety
///
/// As [`caller_bytes`] when `weights` is not NULL.
unsafe fn caller_weights(weights: *const u8, weights_len: usize) -> Result<Option<&'static [u8]>, Error> {
    match weights.is_null() {
        true if weights_len == 0 => Ok(None),
        true => Err(Error::arg(format!("`weights` is NULL but `weights_len` is {weights_len}"))),
        // SAFETY: the caller's contract.
        false => Ok(Some(unsafe { caller_bytes(weights, weights_len, "weights")? })),
    }
}

/// Hands a new module to C through `out`.
///
/// # Safety
///
/// `out` is null-checked by the caller and writable.
unsafe fn give(out: *mut *mut kiln_module, m: Arc<kiln_module>) {
    // SAFETY: the caller checked `out`; it points to a writable pointer.
    unsafe { *out = Arc::into_raw(m).cast_mut() };
}

/// The module behind a handle, borrowed for the call.
///
/// # Safety
///
/// `m` is null or a handle from `kiln_module_load_*` not yet freed.
pub(crate) unsafe fn module_ref<'a>(m: *const kiln_module) -> Result<&'a kiln_module, Error> {
    non_null(m, "module")?;
    // SAFETY: a live handle is `Arc::into_raw` of an `Arc<kiln_module>`.
    Ok(unsafe { &*m })
}

/// Loads an artifact from memory: `data`/`len` the `.kiln` bytes, `weights`/`weights_len`
/// its external weights (NULL and 0 for a module that embeds them). Both are copied (to
/// 64-byte-aligned buffers the module owns, so that the constants are used in place);
/// the caller's buffers may be released on return. On success `*out` is the module, to
/// release with `kiln_module_free`; on failure `*out` is left as it was.
///
/// Checks the artifact completely (container, versions, sections, plan, weights, CPU
/// features) and places its code. Errors: `KILN_STATUS_INVALID_ARTIFACT`,
/// `_UNSUPPORTED`, `_WEIGHTS`, `_INVALID_ARGUMENT` (NULL pointers), `_RUNTIME`.
///
/// # Safety
///
/// `data` points to `len` readable bytes, `weights` (when not NULL) to `weights_len`;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_load_bytes(
    data: *const u8,
    len: usize,
    weights: *const u8,
    weights_len: usize,
    out: *mut *mut kiln_module,
) -> kiln_status {
    // SAFETY: the caller's contract.
    unsafe { load_caller_bytes("kiln_module_load_bytes", data, len, weights, weights_len, out, true) }
}

/// `kiln_module_load_bytes` without copies: the module reads `data` and `weights` in
/// place. The caller guarantees that both stay valid and unmodified until the module
/// and every instance made from it are freed. Put them at 64-byte-aligned addresses:
/// constants found misaligned in memory are copied once to an aligned buffer.
///
/// # Safety
///
/// As `kiln_module_load_bytes`, and the lifetime guarantee above.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_load_bytes_nocopy(
    data: *const u8,
    len: usize,
    weights: *const u8,
    weights_len: usize,
    out: *mut *mut kiln_module,
) -> kiln_status {
    // SAFETY: the caller's contract, with the lifetime guarantee.
    unsafe { load_caller_bytes("kiln_module_load_bytes_nocopy", data, len, weights, weights_len, out, false) }
}

/// The two `kiln_module_load_bytes*` (named `function` in errors): `copy` copies the
/// caller's artifact and weights to buffers the module owns, else the module borrows
/// them.
///
/// # Safety
///
/// As `kiln_module_load_bytes`; without `copy`, the bytes also stay valid and
/// unmodified while the module lives.
unsafe fn load_caller_bytes(
    function: &str,
    data: *const u8,
    len: usize,
    weights: *const u8,
    weights_len: usize,
    out: *mut *mut kiln_module,
    copy: bool,
) -> kiln_status {
    guard(function, || {
        non_null(out, "out")?;
        // SAFETY: the caller's contract; copied at once unless the caller keeps the
        // bytes valid and unmodified while the module lives.
        let artifact = unsafe { caller_bytes(data, len, "data")? };
        // SAFETY: as above.
        let weights = unsafe { caller_weights(weights, weights_len)? };
        let owned = match copy {
            true => OwnedModule::load(AlignedBytes::copy_from(artifact), weights.map(AlignedBytes::copy_from))?,
            // SAFETY: the caller keeps the bytes valid and unmodified while the module
            // lives (the nocopy contract).
            false => unsafe { OwnedModule::load_in_place(artifact, weights)? },
        };
        let m = kiln_module::new(owned)?;
        // SAFETY: `out` checked above.
        unsafe { give(out, m) };
        Ok(())
    })
}

/// A path from C: bytes as they are on Unix, UTF-8 elsewhere.
fn path_of(p: &CStr, name: &str) -> Result<PathBuf, Error> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let _ = name;
        Ok(PathBuf::from(std::ffi::OsStr::from_bytes(p.to_bytes())))
    }
    #[cfg(not(unix))]
    {
        p.to_str().map(PathBuf::from).map_err(|_| Error::arg(format!("`{name}` is not UTF-8")))
    }
}

fn read(path: &Path) -> Result<AlignedBytes, Error> {
    AlignedBytes::read(path).map_err(|e| Error::new(kiln_status::Io, format!("cannot read {}: {e}", path.display())))
}

/// Loads an artifact from the file `path`, with its external weights from
/// `weights_path`, or — when that is NULL — from the file the artifact names, beside it
/// (as `kiln run` does; nothing is read for a module that embeds its weights). Both are
/// read into 64-byte-aligned buffers the module owns. On success `*out` is the module.
///
/// Errors: as `kiln_module_load_bytes`, and `KILN_STATUS_IO` when a file cannot be
/// read (the message names it).
///
/// # Safety
///
/// `path` (and `weights_path` when not NULL) are NUL-terminated strings; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_load_file(
    path: *const c_char,
    weights_path: *const c_char,
    out: *mut *mut kiln_module,
) -> kiln_status {
    guard("kiln_module_load_file", || {
        non_null(out, "out")?;
        non_null(path, "path")?;
        // SAFETY: a NUL-terminated string, per the contract.
        let path = path_of(unsafe { CStr::from_ptr(path) }, "path")?;
        let weights_path = match weights_path.is_null() {
            true => None,
            // SAFETY: as above.
            false => Some(path_of(unsafe { CStr::from_ptr(weights_path) }, "weights_path")?),
        };
        let load = || -> Result<Arc<kiln_module>, Error> {
            let artifact = read(&path)?;
            let (weights_path, beside) = match &weights_path {
                Some(p) => (Some(p.clone()), false),
                None => (kiln_runtime::fs::weights_beside(&path, artifact.bytes()), true),
            };
            let weights = match &weights_path {
                // Looked for beside the artifact and not there: the loader says which
                // file the module wants.
                Some(p) if beside && !p.exists() => None,
                Some(p) => Some(read(p)?),
                None => None,
            };
            let found = weights.is_some();
            OwnedModule::load(artifact, weights).map_err(Error::from).and_then(kiln_module::new).map_err(|e| {
                match (&weights_path, e.status) {
                    (Some(p), kiln_status::Weights) if found => e.context(format!("weights {}", p.display())),
                    (Some(p), kiln_status::Weights) => e.context(format!("no weights file at {}", p.display())),
                    _ => e,
                }
            })
        };
        let m = load().map_err(|e| e.context(path.display()))?;
        // SAFETY: `out` checked above.
        unsafe { give(out, m) };
        Ok(())
    })
}

/// Releases a module handle. Instances made from it keep the module alive until they
/// are freed too. NULL is ignored.
///
/// # Safety
///
/// `m` is NULL or a handle from `kiln_module_load_*`, not freed before.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_free(m: *mut kiln_module) {
    guard_void("kiln_module_free", || {
        if !m.is_null() {
            // SAFETY: a live handle is `Arc::into_raw` of an `Arc<kiln_module>`, whose
            // reference this gives back.
            drop(unsafe { Arc::from_raw(m.cast_const()) });
        }
    })
}

/// Answers a query about module `m` under `guard` (named `function` in errors): checks
/// `out` (called `name`) is not null, runs `f` on the module and writes its answer to
/// `*out`, which is left as it was on failure.
///
/// # Safety
///
/// `m` is null or a live module handle, `out` null or writable.
unsafe fn query<T: Copy>(
    function: &str,
    m: *const kiln_module,
    out: *mut T,
    name: &str,
    f: impl FnOnce(&kiln_module) -> Result<T, Error>,
) -> kiln_status {
    guard(function, || {
        non_null(out, name)?;
        // SAFETY: the caller's contract.
        let m = unsafe { module_ref(m)? };
        let v = f(m)?;
        // SAFETY: checked not null; writable per the contract.
        unsafe { *out = v };
        Ok(())
    })
}

/// Sets `*count` to the number of inputs of the module's entry point (`main`, else its
/// first).
///
/// # Safety
///
/// `m` is a live module handle, `count` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_input_count(m: *const kiln_module, count: *mut usize) -> kiln_status {
    // SAFETY: the caller's contract.
    unsafe { query("kiln_module_input_count", m, count, "count", |m| Ok(m.inputs.len())) }
}

/// Sets `*count` to the number of outputs of the module's entry point.
///
/// # Safety
///
/// `m` is a live module handle, `count` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_output_count(m: *const kiln_module, count: *mut usize) -> kiln_status {
    // SAFETY: the caller's contract.
    unsafe { query("kiln_module_output_count", m, count, "count", |m| Ok(m.outputs.len())) }
}

/// Fills `*info` with input `index`'s name, dtype, shape and byte size (pointers owned
/// by the module).
///
/// # Safety
///
/// `m` is a live module handle, `info` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_input_info(
    m: *const kiln_module,
    index: usize,
    info: *mut kiln_tensor_info,
) -> kiln_status {
    // SAFETY: the caller's contract.
    unsafe { query("kiln_module_input_info", m, info, "info", |m| Ok(m.input(index)?.info())) }
}

/// Fills `*info` with output `index`'s name, dtype, shape and byte size.
///
/// # Safety
///
/// `m` is a live module handle, `info` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_output_info(
    m: *const kiln_module,
    index: usize,
    info: *mut kiln_tensor_info,
) -> kiln_status {
    // SAFETY: the caller's contract.
    unsafe { query("kiln_module_output_info", m, info, "info", |m| Ok(m.output(index)?.info())) }
}

/// The index of the tensor called `name` in `tensors`.
///
/// # Safety
///
/// `name` is null or NUL-terminated.
unsafe fn index_of(tensors: &[Tensor], name: *const c_char, what: &str) -> Result<usize, Error> {
    non_null(name, "name")?;
    // SAFETY: NUL-terminated per the contract.
    let name = unsafe { CStr::from_ptr(name) };
    tensors.iter().position(|t| t.name.as_c_str() == name).ok_or_else(|| {
        let names: Vec<&str> = tensors.iter().map(Tensor::name).collect();
        Error::new(
            kiln_status::NotFound,
            format!("the module has no {what} {} ({what}s: {})", name.to_string_lossy(), names.join(", ")),
        )
    })
}

/// Sets `*index` to the index of the input called `name`; `KILN_STATUS_NOT_FOUND` when
/// there is none.
///
/// # Safety
///
/// `m` is a live module handle, `name` NUL-terminated, `index` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_input_index(
    m: *const kiln_module,
    name: *const c_char,
    index: *mut usize,
) -> kiln_status {
    // SAFETY: the caller's contract (`m` live, `index` writable, `name` NUL-terminated),
    // which is also `index_of`'s.
    unsafe { query("kiln_module_input_index", m, index, "index", |m| index_of(&m.inputs, name, "input")) }
}

/// Sets `*index` to the index of the output called `name`; `KILN_STATUS_NOT_FOUND` when
/// there is none.
///
/// # Safety
///
/// `m` is a live module handle, `name` NUL-terminated, `index` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_output_index(
    m: *const kiln_module,
    name: *const c_char,
    index: *mut usize,
) -> kiln_status {
    // SAFETY: the caller's contract (`m` live, `index` writable, `name` NUL-terminated),
    // which is also `index_of`'s.
    unsafe { query("kiln_module_output_index", m, index, "index", |m| index_of(&m.outputs, name, "output")) }
}

/// Sets `*size` to the bytes of arena an instance needs (for
/// `kiln_instance_create_in`).
///
/// # Safety
///
/// `m` is a live module handle, `size` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_arena_size(m: *const kiln_module, size: *mut usize) -> kiln_status {
    // SAFETY: the caller's contract.
    unsafe {
        query("kiln_module_arena_size", m, size, "size", |m| {
            // Verified at load: the arena size fits usize.
            usize::try_from(m.owned.module().verified().limits().arena_size)
                .map_err(|_| Error::new(kiln_status::InvalidArtifact, "the arena does not fit the address space"))
        })
    }
}

/// Sets `*align` to the alignment (a power of two, at most 4096) an instance's arena
/// needs.
///
/// # Safety
///
/// `m` is a live module handle, `align` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_module_arena_align(m: *const kiln_module, align: *mut usize) -> kiln_status {
    // SAFETY: the caller's contract.
    unsafe {
        query("kiln_module_arena_align", m, align, "align", |m| {
            // Verified at load: a power of two ≤ 4096.
            Ok(m.owned.module().verified().limits().arena_align as usize)
        })
    }
}
