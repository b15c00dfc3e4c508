//! `kiln-run-nostd`: the minimal runner without std. It loads a `.kiln` artifact with
//! the runtime's `no_std` core and its libc code loader, runs entry point `main` (or the
//! first) on `.npy` inputs and writes the outputs as `.npy` files.
//!
//! ```text
//! kiln-run-nostd ARTIFACT [--weights FILE] [--input NAME=FILE.npy]... [--output-dir DIR]
//!                         [--iterations N]
//! ```
//!
//! Every input must be given. One line per output on stdout (`name dtype [dims]`);
//! outputs written as `DIR/<name>.npy`, characters outside `[A-Za-z0-9._-]` replaced by
//! `_`. Errors: one line on stderr, exit status 1. Single-threaded.
//!
//! Built with panic=abort (the `runner` profile, or `nostd-test` in the tests) it links
//! core, alloc and the C library only: the panic handler is below and the platform
//! layer is [`sys`]. Under an unwinding profile (`cargo test --workspace` builds every
//! binary that way) a `no_std` binary cannot link, as unwinding needs std's personality
//! routine; there std is linked for its panic runtime alone and the code is unchanged.
#![no_std]
#![no_main]

extern crate alloc;
#[cfg(panic = "unwind")]
extern crate std;

mod shared;
mod sys;

use alloc::ffi::CString;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::ffi::{c_char, c_int, CStr};
use kiln_npy::DType;
use kiln_runtime::{Instance, Module, TensorRef};
use shared::{file_name, output_tensors, read_npy, zeroed};

#[global_allocator]
static ALLOC: sys::Malloc = sys::Malloc;

const USAGE: &str =
    "usage: kiln-run-nostd ARTIFACT [--weights FILE] [--input NAME=FILE.npy]... [--output-dir DIR] [--iterations N]";

/// Writes a message and aborts: a panic is a bug in the runner or the runtime (inputs
/// are errors, not panics), so there is nothing to unwind to.
#[cfg(panic = "abort")]
#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let _ = sys::write_all(2, format!("kiln-run-nostd: internal error: {}\n", info.message()).as_bytes());
    // SAFETY: abort has no preconditions and does not return.
    unsafe { libc::abort() }
}

/// The precompiled `alloc` and `core` carry landing pads that name the unwinder's
/// resume routine and Rust's personality routine. With panic=abort nothing ever
/// unwinds, so these are never called; they exist for the link alone.
#[cfg(panic = "abort")]
mod unwind_stubs {
    /// Never called: no unwinding starts under panic=abort.
    #[no_mangle]
    pub extern "C" fn rust_eh_personality() {}

    /// Never called, as above; aborts if it ever were.
    #[no_mangle]
    pub extern "C" fn _Unwind_Resume() -> ! {
        // SAFETY: abort has no preconditions and does not return.
        unsafe { libc::abort() }
    }
}

/// The command line, borrowed from `argv`.
struct Args {
    model: &'static CStr,
    weights: Option<&'static CStr>,
    inputs: Vec<(&'static str, &'static CStr)>,
    output_dir: Option<&'static CStr>,
    iterations: u64,
}

fn text(a: &'static CStr) -> Result<&'static str, String> {
    a.to_str().map_err(|_| format!("argument {} is not UTF-8", sys::show(a)))
}

fn parse_args(argv: &[&'static CStr]) -> Result<Args, String> {
    let mut it = argv.iter().copied();
    let mut a = Args { model: c"", weights: None, inputs: Vec::new(), output_dir: None, iterations: 1 };
    let mut model = None;
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.to_bytes() {
            b"--weights" => a.weights = Some(value("--weights")?),
            b"--output-dir" => a.output_dir = Some(value("--output-dir")?),
            b"--iterations" => {
                let v = text(value("--iterations")?)?;
                a.iterations = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("--iterations {v}: need a positive integer"))?;
            }
            b"--input" => {
                let v = value("--input")?;
                let bytes = v.to_bytes_with_nul();
                let eq = bytes.iter().position(|&b| b == b'=');
                let (name, file) = match eq {
                    Some(i) => (bytes.get(..i), bytes.get(i + 1..).and_then(|f| CStr::from_bytes_with_nul(f).ok())),
                    None => (None, None),
                };
                let (Some(name), Some(file)) = (name, file) else {
                    return Err(format!("--input {}: expected NAME=FILE.npy", sys::show(v)));
                };
                let name = core::str::from_utf8(name)
                    .map_err(|_| format!("--input {}: the name is not UTF-8", sys::show(v)))?;
                a.inputs.push((name, file));
            }
            s if s.first() == Some(&b'-') => return Err(format!("unknown option {} (see --help)", sys::show(arg))),
            _ if model.is_some() => return Err(format!("unexpected argument {} (see --help)", sys::show(arg))),
            _ => model = Some(arg),
        }
    }
    a.model = model.ok_or(USAGE)?;
    Ok(a)
}

fn run(args: &Args) -> Result<(), String> {
    let model = sys::read_file(args.model)?;
    let weights = args.weights.map(sys::read_file).transpose()?;
    let m = Module::load(model.bytes(), weights.as_ref().map(|w| w.bytes()))
        .map_err(|e| format!("{}: {e}", sys::show(args.model)))?;
    let sig = m.signature();
    let entry = sig.default_entry().ok_or("the module has no entry points")?;
    for (name, _) in &args.inputs {
        if !entry.inputs.iter().any(|t| t.name == *name) {
            let names: Vec<_> = entry.inputs.iter().map(|t| t.name).collect();
            return Err(format!("--input {name}: {} has no such input (inputs: {})", entry.name, names.join(", ")));
        }
    }
    let mut arrays = Vec::with_capacity(entry.inputs.len());
    for t in entry.inputs {
        let (_, path) = args
            .inputs
            .iter()
            .find(|(n, _)| *n == t.name)
            .ok_or_else(|| format!("input {} not given (--input {}=FILE.npy)", t.name, t.name))?;
        let bytes = sys::read_file(path)?;
        arrays.push(read_npy(bytes.bytes(), t.dtype).map_err(|e| format!("{}: {e}", sys::show(path)))?);
    }
    let inputs: Vec<TensorRef<'_>> =
        arrays.iter().map(|a| TensorRef { dtype: a.dtype, dims: &a.dims, data: &a.data }).collect();
    let mut out_data: Vec<Vec<u8>> =
        entry.outputs.iter().map(|t| zeroed(t.bytes, &format!("output {}", t.name))).collect::<Result<_, _>>()?;
    let mut inst = Instance::new(&m).map_err(|e| e.to_string())?;
    for _ in 0..args.iterations {
        let mut outputs = output_tensors(entry.outputs, &mut out_data);
        inst.invoke_tensors(entry.index, &inputs, &mut outputs).map_err(|e| e.to_string())?;
    }
    if let Some(dir) = args.output_dir {
        sys::make_dir(dir)?;
    }
    let mut report = String::new();
    for (t, d) in entry.outputs.iter().zip(&out_data) {
        let dtype = DType::from_code(t.dtype);
        let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
        report.push_str(&format!("{} {} [{}]\n", t.name, dtype.map_or("?", DType::name), dims.join(", ")));
        let Some(dir) = args.output_dir else { continue };
        let mut path = Vec::from(dir.to_bytes());
        path.push(b'/');
        path.extend(file_name(t.name).bytes());
        let path = CString::new(path).map_err(|_| format!("{}: the directory name holds a NUL", sys::show(dir)))?;
        match dtype.map(|dt| kiln_npy::write(dt, &t.dims, d)) {
            Some(Ok(bytes)) => sys::write_file(&path, &bytes)?,
            Some(Err(e)) => report_err(&format!("{}: not written: {e}", sys::show(&path))),
            None => report_err(&format!("{}: not written: unknown dtype code {}", sys::show(&path), t.dtype)),
        }
    }
    sys::write_all(1, report.as_bytes()).map_err(|e| format!("cannot write to stdout (os error {e})"))
}

/// One line on stderr, after the program name.
fn report_err(message: &str) {
    let _ = sys::write_all(2, format!("kiln-run-nostd: {message}\n").as_bytes());
}

/// The C entry point: the C library's start-up code calls it with the arguments.
///
/// # Safety
///
/// `argv` holds `argc` pointers to NUL-terminated strings that live until the process
/// exits, as the C start-up code passes them.
#[no_mangle]
pub unsafe extern "C" fn main(argc: c_int, argv: *const *const c_char) -> c_int {
    let n = usize::try_from(argc).unwrap_or(0);
    let mut args = Vec::with_capacity(n);
    for i in 1..n {
        // SAFETY: the C runtime passes `argc` valid pointers in `argv`, each to a
        // NUL-terminated string that lives until the process exits.
        let a: &'static CStr = unsafe { CStr::from_ptr(*argv.add(i)) };
        args.push(a);
    }
    if args.iter().any(|a| a.to_bytes() == b"-h" || a.to_bytes() == b"--help") {
        let _ = sys::write_all(1, format!("{USAGE}\n").as_bytes());
        return 0;
    }
    match parse_args(&args).and_then(|a| run(&a)) {
        Ok(()) => 0,
        Err(e) => {
            report_err(&e);
            1
        }
    }
}
