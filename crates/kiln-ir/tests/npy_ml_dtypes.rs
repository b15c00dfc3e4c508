//! kiln's `.npy` files for the dtypes NumPy lacks against numpy + `ml_dtypes` itself: the
//! convention of `kiln_npy` (NumPy saves an `ml_dtypes` array untyped, `'<V2'`/`'<V1'`,
//! sub-byte types one element per byte) checked both ways with the real packages.
//!
//! `npy_ml_dtypes.py save` (beside this file, run with the test venv's python) saves every
//! bit pattern of each `ml_dtypes` type kiln has, and the values numpy gives them as
//! float64; kiln reads each file as the dtype a caller would expect and must get those
//! values (decoded by kiln's own conversions, `Tensor::to_f64_vec`). kiln then writes what
//! it read, and `npy_ml_dtypes.py check` loads kiln's files with `np.load(..).view(X)` and
//! compares every element's bits with numpy's originals, and each file byte for byte with
//! what `numpy.save` writes for the `ml_dtypes` array (`'<V1'` for float8_e5m2, whose
//! `'<f1'` from `numpy.save` `numpy.load` refuses).
//!
//! The venv is `<repo>/.venv` (scripts/setup-test-data makes it from
//! scripts/requirements.txt, which pins ml_dtypes); without it the test fails, as tests
//! without their data do.

use kiln_ir::{npy, DType};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kiln dtypes NumPy has no type for, each an `ml_dtypes` type (the dtype table's
/// `ml_dtypes` names; the script lists the same ten).
fn types() -> Vec<DType> {
    DType::ALL.iter().copied().filter(|d| d.ml_dtypes_name().is_some()).collect()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the numpy side; its failure fails the test with its output.
fn python(mode: &str, dir: &Path) -> String {
    let py = repo().join(".venv/bin/python");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/npy_ml_dtypes.py");
    let out = Command::new(&py).arg(&script).arg(mode).arg(dir).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {}: {e}; run scripts/setup-test-data (it makes the venv with numpy and ml_dtypes)",
            py.display()
        )
    });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "npy_ml_dtypes.py {mode} failed:\n{text}");
    text
}

/// Same value: equal bits (so -0 is not 0), or both NaN (ml_dtypes and kiln need not agree
/// on a NaN's sign after conversion).
fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn numpy_ml_dtypes_files_read_and_written_both_ways() {
    let types = types();
    assert_eq!(types.len(), 10, "bf16, five f8, f6, f4, int4, uint4: {types:?}");
    let dir = std::env::temp_dir().join(format!("kiln-npy-ml-dtypes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    python("save", &dir);
    for &dtype in &types {
        let file = |suffix: &str| dir.join(format!("{}{suffix}", dtype.name()));
        let bytes = std::fs::read(file(".npy")).expect("numpy's file");
        // Untyped: refused without the expected dtype, and as a dtype of another element
        // size or one NumPy has (the file says only the size).
        assert!(npy::read(&bytes).is_err(), "{dtype}: numpy's file does not say its type");
        let other = if dtype == DType::BF16 { DType::F8E4M3FN } else { DType::BF16 };
        for other in [other, DType::U8, DType::I16] {
            assert!(npy::read_typed(&bytes, Some(other)).is_err(), "{dtype} read as {other}");
        }
        let t = npy::read_typed(&bytes, Some(dtype)).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        let want = npy::read(&std::fs::read(file(".f64.npy")).expect("values")).expect("f64 values");
        assert_eq!((t.dtype(), t.shape()), (dtype, want.shape()), "{dtype}");
        let (got, want) = (t.to_f64_vec(), want.to_f64_vec());
        // Every bit pattern and one more (bf16: a sample of 9365).
        assert!(got.len() == want.len() && got.len() >= 17, "{dtype}: {} elements", got.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(same(*g, *w), "{dtype} element {i}: kiln reads {g}, numpy+ml_dtypes has {w}");
        }
        std::fs::write(dir.join(format!("kiln_{}.npy", dtype.name())), npy::write(&t).expect("write"))
            .expect("write kiln's file");
    }
    let report = python("check", &dir);
    assert_eq!(report.lines().filter(|l| l.starts_with("checked ")).count(), types.len(), "{report}");
    std::fs::remove_dir_all(&dir).ok();
}
