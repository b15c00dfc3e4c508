//! The C API called as C calls it (through the exported functions), on lenet: every
//! failure returns its status and a message naming the function and what is wrong, no
//! pointer argument is trusted to be non-null, and every way in and out (copies,
//! bindings, in-place buffers, caller's arena, caller's allocator) gives the outputs the
//! runtime's own Rust invoke gives.

mod common;

use common::{compile_lenet, f32_bytes, f32_values, pattern_f32, rust_invoke, scratch};
use kiln_capi::*;
use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

fn lenet() -> &'static kiln_compiler::Compiled {
    static C: OnceLock<kiln_compiler::Compiled> = OnceLock::new();
    C.get_or_init(|| compile_lenet(None))
}

fn lenet_external() -> &'static kiln_compiler::Compiled {
    static C: OnceLock<kiln_compiler::Compiled> = OnceLock::new();
    C.get_or_init(|| compile_lenet(Some("lenet.weights")))
}

fn message() -> String {
    // SAFETY: never NULL, NUL-terminated, valid until the next failing call here.
    unsafe { CStr::from_ptr(kiln_last_error_message()) }.to_string_lossy().into_owned()
}

/// `status` is `want`, and the thread's message starts with `function: ` and holds
/// `text`.
#[track_caller]
fn assert_fails(status: kiln_status, want: kiln_status, function: &str, text: &str) {
    let m = message();
    assert_eq!(status, want, "message: {m}");
    assert!(m.starts_with(&format!("{function}: ")), "message {m:?} does not start with {function}");
    assert!(m.contains(text), "message {m:?} lacks {text:?}");
}

#[track_caller]
fn ok(status: kiln_status) {
    assert_eq!(status, kiln_status::Ok, "{}", message());
}

fn load(bytes: &[u8], weights: Option<&[u8]>) -> *mut kiln_module {
    let mut m = null_mut();
    let (w, wl) = weights.map_or((null(), 0), |w| (w.as_ptr(), w.len()));
    // SAFETY: valid slices and a writable out-pointer.
    ok(unsafe { kiln_module_load_bytes(bytes.as_ptr(), bytes.len(), w, wl, &mut m) });
    assert!(!m.is_null());
    m
}

fn instance(m: *const kiln_module, threads: usize) -> *mut kiln_instance {
    let mut i = null_mut();
    // SAFETY: a live module, a writable out-pointer.
    ok(unsafe { kiln_instance_create(m, threads, &mut i) });
    i
}

/// The output's bytes as the instance's own buffer holds them (read in place).
fn output(inst: *mut kiln_instance, index: usize) -> &'static [u8] {
    let (mut p, mut len) = (null(), 0);
    // SAFETY: a live instance, writable out-pointers.
    ok(unsafe { kiln_instance_output(inst, index, &mut p, &mut len) });
    // SAFETY: the instance's buffer of `len` bytes, alive while the test uses it.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

fn info(m: *const kiln_module, input: bool, index: usize) -> kiln_tensor_info {
    // SAFETY: plain old data; overwritten below.
    let mut t: kiln_tensor_info = unsafe { std::mem::zeroed() };
    // SAFETY: a live module, a writable out-pointer.
    ok(unsafe {
        if input {
            kiln_module_input_info(m, index, &mut t)
        } else {
            kiln_module_output_info(m, index, &mut t)
        }
    });
    t
}

/// The module's arena size and alignment (`kiln_module_arena_size`, `_align`).
fn arena(m: *const kiln_module) -> (usize, usize) {
    let (mut size, mut align) = (0, 0);
    // SAFETY: a live module, writable out-pointers.
    ok(unsafe { kiln_module_arena_size(m, &mut size) });
    // SAFETY: as above.
    ok(unsafe { kiln_module_arena_align(m, &mut align) });
    (size, align)
}

fn input_bytes() -> Vec<u8> {
    f32_bytes(&pattern_f32(0, 28 * 28))
}

fn want() -> Vec<u8> {
    rust_invoke(&lenet().artifact, None, &[input_bytes()]).remove(0)
}

#[test]
fn signature_queries_describe_the_module() {
    let c = lenet();
    let m = load(&c.artifact, None);
    let (mut n_in, mut n_out) = (0, 0);
    // SAFETY: a live module, writable out-pointers.
    ok(unsafe { kiln_module_input_count(m, &mut n_in) });
    ok(unsafe { kiln_module_output_count(m, &mut n_out) });
    assert_eq!((n_in, n_out), (1, 1));

    let a = kiln_runtime::fs::AlignedBytes::copy_from(&c.artifact);
    let rt = kiln_runtime::Module::load(a.bytes(), None).expect("load");
    let sig = rt.entry_signature(0).expect("entry");
    for (input, t, r) in [(true, info(m, true, 0), &sig.inputs[0]), (false, info(m, false, 0), &sig.outputs[0])] {
        // SAFETY: the module's NUL-terminated name, alive with the module.
        let name = unsafe { CStr::from_ptr(t.name) }.to_str().expect("UTF-8");
        assert_eq!(name, r.name);
        assert_eq!(t.dtype, kiln_dtype::F32);
        // SAFETY: `rank` dims owned by the module.
        assert_eq!(unsafe { std::slice::from_raw_parts(t.dims, t.rank) }, &r.dims[..]);
        assert_eq!(t.byte_size as u64, r.bytes);
        let mut index = 99;
        let cname = CString::new(name).expect("name");
        // SAFETY: a live module, a NUL-terminated name, a writable out-pointer.
        ok(unsafe {
            if input {
                kiln_module_input_index(m, cname.as_ptr(), &mut index)
            } else {
                kiln_module_output_index(m, cname.as_ptr(), &mut index)
            }
        });
        assert_eq!(index, 0);
    }
    assert_eq!(info(m, true, 0).byte_size, 28 * 28 * 4);

    let nosuch = CString::new("nosuch").expect("name");
    let mut index = 0;
    // SAFETY: as above.
    let s = unsafe { kiln_module_input_index(m, nosuch.as_ptr(), &mut index) };
    assert_fails(s, kiln_status::NotFound, "kiln_module_input_index", "no input nosuch (inputs: ");
    // SAFETY: a live module; a writable out-pointer.
    let mut t: kiln_tensor_info = unsafe { std::mem::zeroed() };
    let s = unsafe { kiln_module_output_info(m, 1, &mut t) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_module_output_info", "output index 1 is out of range");

    let (size, align) = arena(m);
    assert_eq!((size as u64, align as u64), (rt.verified().limits().arena_size, rt.verified().limits().arena_align));
    assert!(size > 0 && align.is_power_of_two());
    // SAFETY: a live handle, freed once.
    unsafe { kiln_module_free(m) };
}

#[test]
fn every_way_in_and_out_gives_the_rust_invoke_outputs() {
    let c = lenet();
    let want = want();
    let x = input_bytes();
    let m = load(&c.artifact, None);

    // Copied in, read in place.
    let inst = instance(m, 1);
    // SAFETY: a live instance; `x` readable.
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
    ok(unsafe { kiln_instance_invoke(inst) });
    assert_eq!(output(inst, 0), &want[..]);
    let first = output(inst, 0).as_ptr();

    // Bound: read in place at every invoke (a change to the caller's buffer shows).
    let mut bound = f32_bytes(&vec![0.25f32; 28 * 28]);
    // SAFETY: `bound` outlives its use by the instance (rebound below before it drops).
    ok(unsafe { kiln_instance_bind_input(inst, 0, bound.as_ptr().cast(), bound.len()) });
    bound.copy_from_slice(&x);
    ok(unsafe { kiln_instance_invoke(inst) });
    assert_eq!(output(inst, 0), &want[..]);
    assert_eq!(output(inst, 0).as_ptr(), first, "the output buffer stays where it was");
    bound.copy_from_slice(&f32_bytes(&vec![0.25f32; 28 * 28]));
    ok(unsafe { kiln_instance_invoke(inst) });
    let quarter = rust_invoke(&c.artifact, None, &[bound.clone()]).remove(0);
    assert_eq!(output(inst, 0), &quarter[..]);
    assert_ne!(quarter, want, "the two inputs give different outputs");

    // The instance's own buffer, filled in place.
    let (mut p, mut len) = (null_mut(), 0);
    // SAFETY: a live instance, writable out-pointers; then `len` writable bytes at `p`.
    ok(unsafe { kiln_instance_input_buffer(inst, 0, &mut p, &mut len) });
    assert_eq!((len, p as usize % 64), (x.len(), 0));
    unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) }.copy_from_slice(&x);
    drop(bound);

    // Output bound to the caller's buffer: written there, and reported there.
    let mut y = vec![0u8; want.len()];
    // SAFETY: `y` outlives the binding (unbound below).
    ok(unsafe { kiln_instance_bind_output(inst, 0, y.as_mut_ptr().cast(), y.len()) });
    ok(unsafe { kiln_instance_invoke(inst) });
    assert_eq!(y, want);
    assert_eq!(output(inst, 0).as_ptr(), y.as_ptr());
    ok(unsafe { kiln_instance_bind_output(inst, 0, null_mut(), 0) });
    assert_eq!(output(inst, 0).as_ptr(), first, "unbound: the instance's own buffer again");
    // SAFETY: live handles, freed once.
    unsafe { kiln_instance_free(inst) };

    // Two threads.
    let inst = instance(m, 2);
    let mut threads = 0;
    ok(unsafe { kiln_instance_threads(inst, &mut threads) });
    assert_eq!(threads, 2);
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
    ok(unsafe { kiln_instance_invoke(inst) });
    assert_eq!(output(inst, 0), &want[..]);
    unsafe { kiln_instance_free(inst) };

    // Zero threads: one per core.
    let inst = instance(m, 0);
    ok(unsafe { kiln_instance_threads(inst, &mut threads) });
    assert_eq!(threads, std::thread::available_parallelism().map_or(1, |n| n.get()));
    unsafe { kiln_instance_free(inst) };
    unsafe { kiln_module_free(m) };
}

#[test]
fn an_instance_keeps_its_module_alive() {
    let c = lenet();
    let x = input_bytes();
    let m = load(&c.artifact, None);
    let inst = instance(m, 1);
    // SAFETY: the module handle is released; the instance holds its own reference.
    unsafe { kiln_module_free(m) };
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
    ok(unsafe { kiln_instance_invoke(inst) });
    assert_eq!(output(inst, 0), &want()[..]);
    unsafe { kiln_instance_free(inst) };
}

#[test]
fn loading_without_copies_and_from_files() {
    let c = lenet();
    let a = kiln_runtime::fs::AlignedBytes::copy_from(&c.artifact);
    let mut m = null_mut();
    // SAFETY: `a` outlives the module and its instance (freed below).
    ok(unsafe { kiln_module_load_bytes_nocopy(a.bytes().as_ptr(), a.bytes().len(), null(), 0, &mut m) });
    let inst = instance(m, 1);
    let x = input_bytes();
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
    ok(unsafe { kiln_instance_invoke(inst) });
    assert_eq!(output(inst, 0), &want()[..]);
    unsafe { kiln_instance_free(inst) };
    unsafe { kiln_module_free(m) };

    let dir = scratch("api-files");
    let path = dir.join("lenet.kiln");
    std::fs::write(&path, &c.artifact).expect("write");
    let p = CString::new(path.to_str().expect("UTF-8")).expect("path");
    let mut m = null_mut();
    // SAFETY: NUL-terminated path, writable out-pointer.
    ok(unsafe { kiln_module_load_file(p.as_ptr(), null(), &mut m) });
    unsafe { kiln_module_free(m) };
    let absent = CString::new(dir.join("absent.kiln").to_str().expect("UTF-8")).expect("path");
    let s = unsafe { kiln_module_load_file(absent.as_ptr(), null(), &mut m) };
    assert_fails(s, kiln_status::Io, "kiln_module_load_file", "cannot read ");
    assert!(message().contains("absent.kiln"), "{}", message());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn truncated_or_corrupt_artifacts_are_invalid_artifacts() {
    let c = lenet();
    let a = &c.artifact;
    for len in [0, 1, 8, 63, 64, 200, a.len() / 2, a.len() - 1] {
        let mut m = null_mut();
        // SAFETY: a valid slice (a dangling-free pointer even for length 0).
        let s = unsafe { kiln_module_load_bytes(a.as_ptr(), len, null(), 0, &mut m) };
        assert_fails(s, kiln_status::InvalidArtifact, "kiln_module_load_bytes", "");
        assert!(message().len() > "kiln_module_load_bytes: ".len() + 5, "message {:?} says nothing", message());
        assert!(m.is_null(), "out stays as it was on failure");
    }
    let mut m = null_mut();
    let s = unsafe { kiln_module_load_bytes(b"not a module at all".as_ptr(), 19, null(), 0, &mut m) };
    assert_fails(s, kiln_status::InvalidArtifact, "kiln_module_load_bytes", "not a .kiln module");
    // One flipped byte past the header: a checksum names the section.
    let mut bad = a.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x55;
    let s = unsafe { kiln_module_load_bytes(bad.as_ptr(), bad.len(), null(), 0, &mut m) };
    assert_fails(s, kiln_status::InvalidArtifact, "kiln_module_load_bytes", "checksum mismatch");
}

#[test]
fn weights_missing_wrong_or_unexpected() {
    let c = lenet_external();
    let w = c.weights.as_deref().expect("weights kept outside");
    let mut m = null_mut();
    // SAFETY: valid slices, writable out-pointer.
    let s = unsafe { kiln_module_load_bytes(c.artifact.as_ptr(), c.artifact.len(), null(), 0, &mut m) };
    assert_fails(s, kiln_status::Weights, "kiln_module_load_bytes", "lenet.weights");
    let mut wrong = w.to_vec();
    wrong[0] ^= 1;
    let s =
        unsafe { kiln_module_load_bytes(c.artifact.as_ptr(), c.artifact.len(), wrong.as_ptr(), wrong.len(), &mut m) };
    assert_fails(s, kiln_status::Weights, "kiln_module_load_bytes", "not the weights the module was compiled with");
    let e = lenet();
    let s = unsafe { kiln_module_load_bytes(e.artifact.as_ptr(), e.artifact.len(), w.as_ptr(), w.len(), &mut m) };
    assert_fails(s, kiln_status::Weights, "kiln_module_load_bytes", "embeds its weights");
    assert!(m.is_null());

    let m = load(&c.artifact, Some(w));
    let inst = instance(m, 1);
    let x = input_bytes();
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
    ok(unsafe { kiln_instance_invoke(inst) });
    assert_eq!(output(inst, 0), &rust_invoke(&c.artifact, Some(w), &[x])[0][..]);
    unsafe { kiln_instance_free(inst) };
    unsafe { kiln_module_free(m) };
}

#[test]
fn wrong_inputs_and_outputs_are_invalid_arguments() {
    let m = load(&lenet().artifact, None);
    let inst = instance(m, 1);
    // SAFETY (whole test): live handles and valid buffers; each call fails before use.
    let s = unsafe { kiln_instance_invoke(inst) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_invoke", "(#0) has no value");
    let x = input_bytes();
    let s = unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len() - 4) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_set_input", "must be 3136 bytes, got 3132");
    let s = unsafe { kiln_instance_bind_input(inst, 0, x.as_ptr().cast(), x.len() + 1) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_bind_input", "must be 3136 bytes, got 3137");
    let s = unsafe { kiln_instance_set_input(inst, 1, x.as_ptr().cast(), x.len()) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_set_input", "input index 1 is out of range");
    let mut y = vec![0u8; 41];
    let s = unsafe { kiln_instance_bind_output(inst, 0, y.as_mut_ptr().cast(), y.len()) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_bind_output", "must be 40 bytes, got 41");
    let s = unsafe { kiln_instance_bind_output(inst, 0, null_mut(), 40) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_bind_output", "`data` is NULL but `len` is 40");

    // An output bound over the input's bytes.
    let mut both = x.clone();
    ok(unsafe { kiln_instance_bind_input(inst, 0, both.as_ptr().cast(), x.len()) });
    ok(unsafe { kiln_instance_bind_output(inst, 0, both.as_mut_ptr().add(8).cast(), 40) });
    let s = unsafe { kiln_instance_invoke(inst) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_invoke", "overlaps the buffer of input");
    ok(unsafe { kiln_instance_bind_output(inst, 0, null_mut(), 0) });
    ok(unsafe { kiln_instance_invoke(inst) });
    drop(both);
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });

    // Thread counts past the runtime's limit.
    let mut i2 = null_mut();
    let s = unsafe { kiln_instance_create(m, kiln_runtime::MAX_THREADS + 1, &mut i2) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_create", "at most 4096");
    assert!(i2.is_null());
    unsafe { kiln_instance_free(inst) };
    unsafe { kiln_module_free(m) };
}

#[test]
fn null_pointers_are_invalid_arguments_never_crashes() {
    let c = lenet();
    let m = load(&c.artifact, None);
    let inst = instance(m, 1);
    let a = c.artifact.as_ptr();
    let n = c.artifact.len();
    let x = input_bytes();
    let (mut count, mut out_m, mut out_i) = (0usize, null_mut(), null_mut());
    let mut t: kiln_tensor_info = unsafe { std::mem::zeroed() };
    let (mut p, mut cp, mut len) = (null_mut::<c_void>(), null::<c_void>(), 0usize);
    let name = CString::new("x").expect("name");
    let path = CString::new("/nonexistent.kiln").expect("path");
    let mut arena = vec![0u8; 64];
    let hook = kiln_allocator { alloc: None, free: None, ctx: null_mut() };
    use kiln_status::InvalidArgument as E;
    // Each call gets one NULL where a pointer is required, fails before touching
    // anything, and says which argument and which function.
    macro_rules! case {
        ($function:ident($($arg:expr),*), $text:literal) => {{
            // SAFETY: the call fails on its NULL argument before using any other.
            let s = unsafe { $function($($arg),*) };
            assert_fails(s, E, stringify!($function), $text);
        }};
    }
    case!(kiln_module_load_bytes(null(), n, null(), 0, &mut out_m), "`data` is NULL");
    case!(kiln_module_load_bytes(a, n, null(), 0, null_mut()), "`out` is NULL");
    case!(kiln_module_load_bytes(a, n, null(), 5, &mut out_m), "`weights` is NULL");
    case!(kiln_module_load_bytes_nocopy(null(), n, null(), 0, &mut out_m), "`data` is NULL");
    case!(kiln_module_load_bytes_nocopy(a, n, null(), 0, null_mut()), "`out` is NULL");
    case!(kiln_module_load_file(null(), null(), &mut out_m), "`path` is NULL");
    case!(kiln_module_load_file(path.as_ptr(), null(), null_mut()), "`out` is NULL");
    case!(kiln_module_input_count(null(), &mut count), "`module` is NULL");
    case!(kiln_module_input_count(m, null_mut()), "`count` is NULL");
    case!(kiln_module_output_count(null(), &mut count), "`module` is NULL");
    case!(kiln_module_output_count(m, null_mut()), "`count` is NULL");
    case!(kiln_module_input_info(null(), 0, &mut t), "`module` is NULL");
    case!(kiln_module_input_info(m, 0, null_mut()), "`info` is NULL");
    case!(kiln_module_output_info(null(), 0, &mut t), "`module` is NULL");
    case!(kiln_module_output_info(m, 0, null_mut()), "`info` is NULL");
    case!(kiln_module_input_index(null(), name.as_ptr(), &mut count), "`module` is NULL");
    case!(kiln_module_input_index(m, null(), &mut count), "`name` is NULL");
    case!(kiln_module_input_index(m, name.as_ptr(), null_mut()), "`index` is NULL");
    case!(kiln_module_output_index(null(), name.as_ptr(), &mut count), "`module` is NULL");
    case!(kiln_module_output_index(m, null(), &mut count), "`name` is NULL");
    case!(kiln_module_output_index(m, name.as_ptr(), null_mut()), "`index` is NULL");
    case!(kiln_module_arena_size(null(), &mut count), "`module` is NULL");
    case!(kiln_module_arena_size(m, null_mut()), "`size` is NULL");
    case!(kiln_module_arena_align(null(), &mut count), "`module` is NULL");
    case!(kiln_module_arena_align(m, null_mut()), "`align` is NULL");
    case!(kiln_instance_create(null(), 1, &mut out_i), "`module` is NULL");
    case!(kiln_instance_create(m, 1, null_mut()), "`out` is NULL");
    case!(kiln_instance_create_in(null(), arena.as_mut_ptr().cast(), 64, 1, &mut out_i), "`module` is NULL");
    case!(kiln_instance_create_in(m, null_mut(), 64, 1, &mut out_i), "`arena` is NULL");
    case!(kiln_instance_create_in(m, arena.as_mut_ptr().cast(), 64, 1, null_mut()), "`out` is NULL");
    case!(kiln_instance_create_with_allocator(null(), &hook, 1, &mut out_i), "`module` is NULL");
    case!(kiln_instance_create_with_allocator(m, null(), 1, &mut out_i), "`allocator` is NULL");
    case!(kiln_instance_create_with_allocator(m, &hook, 1, null_mut()), "`out` is NULL");
    case!(kiln_instance_create_with_allocator(m, &hook, 1, &mut out_i), "`alloc` or `free` is NULL");
    case!(kiln_instance_threads(null_mut(), &mut count), "`instance` is NULL");
    case!(kiln_instance_threads(inst, null_mut()), "`threads` is NULL");
    case!(kiln_instance_set_input(null_mut(), 0, x.as_ptr().cast(), x.len()), "`instance` is NULL");
    case!(kiln_instance_set_input(inst, 0, null(), x.len()), "`data` is NULL");
    case!(kiln_instance_bind_input(null_mut(), 0, x.as_ptr().cast(), x.len()), "`instance` is NULL");
    case!(kiln_instance_bind_input(inst, 0, null(), x.len()), "`data` is NULL");
    case!(kiln_instance_input_buffer(null_mut(), 0, &mut p, &mut len), "`instance` is NULL");
    case!(kiln_instance_input_buffer(inst, 0, null_mut(), &mut len), "`data` is NULL");
    case!(kiln_instance_input_buffer(inst, 0, &mut p, null_mut()), "`len` is NULL");
    case!(kiln_instance_bind_output(null_mut(), 0, null_mut(), 0), "`instance` is NULL");
    case!(kiln_instance_output(null_mut(), 0, &mut cp, &mut len), "`instance` is NULL");
    case!(kiln_instance_output(inst, 0, null_mut(), &mut len), "`data` is NULL");
    case!(kiln_instance_output(inst, 0, &mut cp, null_mut()), "`len` is NULL");
    case!(kiln_instance_invoke(null_mut()), "`instance` is NULL");
    assert!(out_m.is_null() && out_i.is_null(), "no handle came out of a failed call");
    // SAFETY: live handles, freed once at the end.
    unsafe {
        // A success leaves the message as it was.
        ok(kiln_module_input_count(m, &mut count));
        assert_eq!(message(), "kiln_instance_invoke: `instance` is NULL");
        // NULL handles to the free functions are ignored.
        kiln_module_free(null_mut());
        kiln_instance_free(null_mut());
        kiln_instance_free(inst);
        kiln_module_free(m);
    }
}

#[test]
fn caller_arena_must_fit_and_be_aligned() {
    let m = load(&lenet().artifact, None);
    let (size, align) = arena(m);
    // SAFETY (whole test): a live module; arenas outlive the instances made in them.
    let mut mem = vec![0u8; size + 2 * align + 64];
    let base = mem.as_mut_ptr();
    let aligned = unsafe { base.add(base.align_offset(align.max(2))) };
    let mut inst = null_mut();
    let s = unsafe { kiln_instance_create_in(m, aligned.cast(), size - 1, 1, &mut inst) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_create_in", &format!("the module needs {size}"));
    if align > 1 {
        let s = unsafe { kiln_instance_create_in(m, aligned.add(1).cast(), size, 1, &mut inst) };
        assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_create_in", &format!("not aligned to {align}"));
    }
    assert!(inst.is_null());
    let x = input_bytes();
    ok(unsafe { kiln_instance_create_in(m, aligned.cast(), size, 2, &mut inst) });
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
    ok(unsafe { kiln_instance_invoke(inst) });
    assert_eq!(output(inst, 0), &want()[..]);
    unsafe { kiln_instance_free(inst) };
    unsafe { kiln_module_free(m) };
    drop(mem);
}

/// What a counting allocator saw: (size, align) of each live block, and the blocks
/// handed out in all.
#[derive(Default)]
struct Seen {
    live: Vec<(usize, usize, usize)>,
    total: usize,
    /// Return NULL once this many blocks have been handed out in all.
    fail_after: Option<usize>,
    /// Return blocks one byte past an aligned address.
    misalign: bool,
}

unsafe extern "C" fn seen_alloc(ctx: *mut c_void, size: usize, align: usize) -> *mut c_void {
    // SAFETY: `ctx` is the test's `Seen`, used by this thread only.
    let seen = unsafe { &mut *ctx.cast::<Seen>() };
    if seen.fail_after.is_some_and(|n| seen.total >= n) {
        return null_mut();
    }
    let extra = usize::from(seen.misalign);
    let layout = std::alloc::Layout::from_size_align(size + extra, align).expect("layout");
    // SAFETY: non-zero size (the API never asks for zero bytes).
    let p = unsafe { std::alloc::alloc(layout) };
    assert!(!p.is_null());
    // SAFETY: inside the block.
    let q = unsafe { p.add(extra) };
    seen.live.push((q as usize, size, align));
    seen.total += 1;
    q.cast()
}

unsafe extern "C" fn seen_free(ctx: *mut c_void, p: *mut c_void, size: usize, align: usize) {
    // SAFETY: as in `seen_alloc`.
    let seen = unsafe { &mut *ctx.cast::<Seen>() };
    let at = seen.live.iter().position(|b| *b == (p as usize, size, align)).expect("a block we gave, once");
    seen.live.remove(at);
    let extra = usize::from(seen.misalign);
    // SAFETY: the block `seen_alloc` made with this layout.
    unsafe {
        std::alloc::dealloc(
            p.cast::<u8>().sub(extra),
            std::alloc::Layout::from_size_align(size + extra, align).expect("layout"),
        )
    };
}

#[test]
fn the_callers_allocator_gets_the_arena_and_buffers_back() {
    let m = load(&lenet().artifact, None);
    let (size, align) = arena(m);
    // SAFETY (whole test): live handles; `seen` outlives every instance using it.
    // Reached only through this pointer, as the allocator reaches it.
    let seen: *mut Seen = Box::into_raw(Box::default());
    let hook = kiln_allocator { alloc: Some(seen_alloc), free: Some(seen_free), ctx: seen.cast() };
    // SAFETY: the test's one `Seen`, not borrowed across a call that reaches the hook.
    let seen = || unsafe { &mut *seen };
    let mut inst = null_mut();
    ok(unsafe { kiln_instance_create_with_allocator(m, &hook, 1, &mut inst) });
    let mut blocks: Vec<(usize, usize)> = seen().live.iter().map(|&(_, s, a)| (s, a)).collect();
    blocks.sort();
    let mut expected = vec![(size, align), (28 * 28 * 4, 64), (40, 64)];
    expected.sort();
    assert_eq!(blocks, expected, "the arena, the input buffer and the output buffer");
    let x = input_bytes();
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
    ok(unsafe { kiln_instance_invoke(inst) });
    assert_eq!(output(inst, 0), &want()[..]);
    assert_eq!(seen().total, 3, "invoke takes nothing from the allocator");
    unsafe { kiln_instance_free(inst) };
    inst = null_mut();
    assert!(seen().live.is_empty(), "every block given back: {:?}", seen().live);

    // An allocator that fails half-way (the third block): what it gave is given back.
    seen().total = 0;
    seen().fail_after = Some(2);
    let s = unsafe { kiln_instance_create_with_allocator(m, &hook, 1, &mut inst) };
    assert_fails(s, kiln_status::OutOfMemory, "kiln_instance_create_with_allocator", "the allocator returned NULL");
    assert!(inst.is_null() && seen().live.is_empty(), "{:?}", seen().live);
    // One that returns misaligned blocks.
    seen().fail_after = None;
    seen().misalign = true;
    let s = unsafe { kiln_instance_create_with_allocator(m, &hook, 1, &mut inst) };
    assert_fails(s, kiln_status::InvalidArgument, "kiln_instance_create_with_allocator", "not aligned to");
    assert!(inst.is_null() && seen().live.is_empty(), "{:?}", seen().live);
    unsafe { kiln_module_free(m) };
    // SAFETY: made by `Box::into_raw` above; no instance uses it any more.
    drop(unsafe { Box::from_raw(seen()) });
}

#[test]
fn versions() {
    // SAFETY: static NUL-terminated strings.
    let v = unsafe { CStr::from_ptr(kiln_version()) }.to_str().expect("UTF-8");
    assert_eq!(
        v,
        format!(
            "kiln {} (C API {}.{}, artifact format {}, kernel ABI {})",
            env!("CARGO_PKG_VERSION"),
            KILN_CAPI_VERSION_MAJOR,
            KILN_CAPI_VERSION_MINOR,
            ::kiln_module::FORMAT_VERSION,
            kiln_runtime::RUNTIME_ABI
        )
    );
    assert_eq!(kiln_capi_version() >> 16, KILN_CAPI_VERSION_MAJOR);
    assert_eq!(kiln_capi_version() & 0xffff, KILN_CAPI_VERSION_MINOR);
}

#[test]
fn outputs_of_the_example_input_are_plausible_logits() {
    // A guard on the reference itself: lenet's ten outputs are finite and not all equal.
    let y = f32_values(&want());
    assert_eq!(y.len(), 10);
    assert!(y.iter().all(|v| v.is_finite()));
    assert!(y.iter().any(|&v| v != y[0]));
}

#[test]
fn weights_beside_the_artifact_only_by_a_plain_file_name() {
    // An artifact that names its weights with a path: loading by file never follows it
    // out of the artifact's folder (or into a subfolder) on the artifact's word.
    let c = compile_lenet(Some("sub/lenet.weights"));
    let w = c.weights.as_deref().expect("weights kept outside");
    let dir = scratch("api-weights-path");
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    std::fs::write(dir.join("sub/lenet.weights"), w).expect("write weights");
    std::fs::write(dir.join("lenet.kiln"), &c.artifact).expect("write artifact");
    let p = CString::new(dir.join("lenet.kiln").to_str().expect("UTF-8")).expect("path");
    let mut m = null_mut();
    // SAFETY: NUL-terminated path, writable out-pointer.
    let s = unsafe { kiln_module_load_file(p.as_ptr(), null(), &mut m) };
    assert_fails(s, kiln_status::Weights, "kiln_module_load_file", "sub/lenet.weights");
    assert!(m.is_null());
    // Named by the caller, the same file loads.
    let wp = CString::new(dir.join("sub/lenet.weights").to_str().expect("UTF-8")).expect("path");
    // SAFETY: as above.
    ok(unsafe { kiln_module_load_file(p.as_ptr(), wp.as_ptr(), &mut m) });
    unsafe { kiln_module_free(m) };
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_module_serves_instances_on_several_threads() {
    /// The module handle, shared: the API documents a module as usable from any thread.
    struct Shared(*const kiln_module);
    // SAFETY: what is tested here: a module is immutable and its handle thread-safe.
    unsafe impl Sync for Shared {}
    let m = load(&lenet().artifact, None);
    let shared = Shared(m);
    let want = want();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (shared, want) = (&shared, &want);
                s.spawn(move || {
                    let x = input_bytes();
                    let inst = instance(shared.0, 1 + t % 2);
                    for _ in 0..20 {
                        // SAFETY: this thread's own instance; `x` outlives the call.
                        ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
                        ok(unsafe { kiln_instance_invoke(inst) });
                        assert_eq!(output(inst, 0), &want[..], "thread {t}");
                    }
                    // SAFETY: a live handle, freed once.
                    unsafe { kiln_instance_free(inst) };
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
    });
    // SAFETY: a live handle, freed once (every instance is gone).
    unsafe { kiln_module_free(m) };
}

/// A NonZero model (`x: f32[3,1,5]` → `nz: i64[3, n]`, bound `bound`): the C API reports
/// the actual shape and the compacted bytes; more nonzeros than the bound is
/// `OverBound`.
fn nonzero_module(bound: i64) -> Vec<u8> {
    use kiln_ir::infer::{infer, InferInput};
    use kiln_ir::{Attr, Attrs, DType, Graph, Op, OpKind, Shape, TensorType};
    let mut g = Graph::new("nz");
    let x = g.add_input("x", TensorType::new(DType::F32, Shape::new(vec![3, 1, 5]).expect("shape")));
    let op = Op::parse(OpKind::NonZero, &Attrs::new().with("kiln_bound", Attr::Int(bound))).expect("op");
    let tys = infer(&op, &[Some(InferInput { ty: g.ty(x), value: None })], 2).expect("infer");
    let (_, nz) =
        g.add_node("nz", op, vec![Some(x)], vec![("nz".into(), tys[0].clone()), ("e".into(), tys[1].clone())]);
    g.outputs.push(nz[0]);
    kiln_compiler::compile(&g, &kiln_compiler::Options::default()).expect("compile").artifact
}

#[test]
fn data_dependent_output_shapes() {
    let art = nonzero_module(4);
    let m = load(&art, None);
    let inst = instance(m, 1);
    let (mut rank, mut dims) = (0usize, null());
    // Before an invoke: the signature's (bound) shape.
    ok(unsafe { kiln_instance_output_shape(inst, 0, &mut rank, &mut dims) });
    assert_eq!(unsafe { std::slice::from_raw_parts(dims, rank) }, [3, 4]);
    // Nonzeros at flat positions 2, 7, 14 (coordinates (0,0,2), (1,0,2), (2,0,4)).
    let mut xv = [0f32; 15];
    for i in [2, 7, 14] {
        xv[i] = 1.5;
    }
    let x = f32_bytes(&xv);
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
    ok(unsafe { kiln_instance_invoke(inst) });
    ok(unsafe { kiln_instance_output_shape(inst, 0, &mut rank, &mut dims) });
    assert_eq!(unsafe { std::slice::from_raw_parts(dims, rank) }, [3, 3]);
    let got: Vec<i64> =
        output(inst, 0)[..9 * 8].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(got, [0, 1, 2, 0, 0, 0, 2, 2, 4]);
    // Five nonzeros, bound 4: a typed status, naming the bound.
    for i in [0, 1] {
        xv[i] = -1.0;
    }
    let x = f32_bytes(&xv);
    ok(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) });
    assert_fails(
        unsafe { kiln_instance_invoke(inst) },
        kiln_status::OverBound,
        "kiln_instance_invoke",
        "above the bound 4",
    );
    assert_fails(
        unsafe { kiln_instance_output_shape(inst, 1, &mut rank, &mut dims) },
        kiln_status::InvalidArgument,
        "kiln_instance_output_shape",
        "out of range",
    );
    assert_fails(
        unsafe { kiln_instance_output_shape(inst, 0, null_mut(), &mut dims) },
        kiln_status::InvalidArgument,
        "kiln_instance_output_shape",
        "rank",
    );
    unsafe {
        kiln_instance_free(inst);
        kiln_module_free(m);
    }
}
