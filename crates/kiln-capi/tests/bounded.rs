//! A bounded input dimension through the C API (docs/bounded-shapes.md): the MLP of
//! `scripts/ref_bounded.py` compiled with its batch `1..8` takes a shorter input from
//! `kiln_instance_set_input` and `kiln_instance_bind_input`, its outputs come back at
//! the actual batch (`kiln_instance_output_shape`, the elements at the front of the
//! output buffer) and match ONNX Runtime's (`$KILN_TEST_DATA/bounded`; missing data is
//! a failure); a length outside the range or between positions is refused at once.

use kiln_capi::*;
use std::ffi::CStr;
use std::path::PathBuf;
use std::ptr::{null, null_mut};

fn data(rel: &str) -> PathBuf {
    let root = std::env::var_os("KILN_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"));
    let p = root.join(rel);
    assert!(p.exists(), "{} is missing: run scripts/ref_bounded.py (KILN_TEST_DATA={})", p.display(), root.display());
    p
}

fn npy(rel: &str) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(data(rel)).expect("read npy");
    let a = kiln_npy::read(&bytes).expect("npy");
    let v = a.data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    (a.dims, v)
}

fn message() -> String {
    // SAFETY: never NULL, NUL-terminated.
    unsafe { CStr::from_ptr(kiln_last_error_message()) }.to_string_lossy().into_owned()
}

#[track_caller]
fn ok(status: kiln_status) {
    assert_eq!(status, kiln_status::Ok, "{}", message());
}

fn compile() -> kiln_compiler::Compiled {
    let (name, dims, ranges) = kiln_import::parse_input_shape_bounded("x=1..8x16").expect("spec");
    let opts = kiln_import::ImportOptions {
        bounded_dims: ranges.iter().map(|&(axis, min)| (name.clone(), axis, min)).collect(),
        input_shapes: vec![(name, dims)],
        ..Default::default()
    };
    let g = kiln_import::onnx::import_file(&data("bounded/mlp_batch.onnx"), &opts).expect("import");
    kiln_compiler::compile(&g, &kiln_compiler::Options::default()).expect("compile")
}

/// Output `k`'s actual shape and its elements (at the front of its buffer).
fn output(inst: *mut kiln_instance, k: usize) -> (Vec<u64>, Vec<f32>) {
    let (mut rank, mut dims) = (0usize, null());
    // SAFETY: a live instance and writable out-pointers.
    ok(unsafe { kiln_instance_output_shape(inst, k, &mut rank, &mut dims) });
    // SAFETY: `rank` dims, valid until the next call on the instance.
    let dims: Vec<u64> = unsafe { std::slice::from_raw_parts(dims, rank) }.to_vec();
    let (mut p, mut len) = (null(), 0usize);
    // SAFETY: as above.
    ok(unsafe { kiln_instance_output(inst, k, &mut p, &mut len) });
    let n = dims.iter().product::<u64>() as usize;
    assert!(n * 4 <= len, "output {k}: {dims:?} in {len} bytes");
    // SAFETY: `len` readable bytes of the instance's output buffer.
    let b = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n * 4) };
    (dims, b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
}

#[track_caller]
fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5 + 1e-4 * w.abs(), "{what}[{i}]: {g} vs ONNX Runtime {w}");
    }
}

#[test]
fn a_shorter_batch_through_the_c_api_matches_onnx_runtime() {
    let c = compile();
    let mut m = null_mut();
    // SAFETY: a valid slice and a writable out-pointer.
    ok(unsafe { kiln_module_load_bytes(c.artifact.as_ptr(), c.artifact.len(), null(), 0, &mut m) });
    for threads in [1usize, 3] {
        let mut inst = null_mut();
        // SAFETY: a live module.
        ok(unsafe { kiln_instance_create(m, threads, &mut inst) });
        // The largest first: a shorter call after it must not see its positions.
        for (case, bind) in [("n8", false), ("n3", true), ("n1", false), ("n3", false)] {
            let (in_dims, x) = npy(&format!("bounded/mlp_batch/{case}.in_0.npy"));
            let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            // SAFETY: `bytes` stays alive and unwritten until after the invoke.
            ok(unsafe {
                if bind {
                    kiln_instance_bind_input(inst, 0, bytes.as_ptr().cast(), bytes.len())
                } else {
                    kiln_instance_set_input(inst, 0, bytes.as_ptr().cast(), bytes.len())
                }
            });
            ok(unsafe { kiln_instance_invoke(inst) });
            for k in 0..2 {
                let (want_dims, want) = npy(&format!("bounded/mlp_batch/{case}.out_{k}.npy"));
                let (dims, got) = output(inst, k);
                let what = format!("{case} (batch {}) output {k} on {threads} threads", in_dims[0]);
                assert_eq!(dims, want_dims, "{what}: shape");
                close(&what, &got, &want);
            }
        }
        // A batch of 9 (bound 8), none, and a partial row: refused when set, naming the range.
        for len in [9 * 64, 0, 3 * 64 + 4] {
            let bytes = vec![0u8; len.max(4)];
            // SAFETY: `len` readable bytes.
            let st = unsafe { kiln_instance_set_input(inst, 0, bytes.as_ptr().cast(), len) };
            assert_eq!(st, kiln_status::InvalidArgument, "{len} bytes");
            let msg = message();
            assert!(msg.contains("1..=8 positions of 64 bytes") && msg.contains("axis 0"), "{msg}");
        }
        // SAFETY: a live instance, freed once.
        unsafe { kiln_instance_free(inst) };
    }
    // SAFETY: a live module, freed once.
    unsafe { kiln_module_free(m) };
}
