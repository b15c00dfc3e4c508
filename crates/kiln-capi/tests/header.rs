//! The committed header, `include/kiln.h`, is what cbindgen generates from the crate
//! now. `KILN_BLESS=1` rewrites it (review the diff: a changed declaration may need a
//! new KILN_CAPI_VERSION_MAJOR/MINOR).

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen: {e}"));
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = dir.join("include/kiln.h");
    if std::env::var_os("KILN_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is not what cbindgen generates from the crate now; rerun with KILN_BLESS=1 and review the diff",
        path.display()
    );
}

#[test]
fn header_carries_the_api() {
    // The check above means something only if the header holds the declarations.
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/kiln.h")).expect("header");
    for needle in [
        "#define KILN_CAPI_VERSION_MAJOR 1",
        "#define KILN_CAPI_VERSION_MINOR 1",
        "KILN_STATUS_OVER_BOUND = 10",
        "kiln_status kiln_instance_output_shape(",
        "typedef struct kiln_module kiln_module;",
        "typedef struct kiln_instance kiln_instance;",
        "KILN_STATUS_INVALID_ARGUMENT = 1",
        "KILN_DTYPE_F32 = 1",
        "kiln_status kiln_module_load_bytes(",
        "kiln_status kiln_instance_invoke(kiln_instance *inst);",
        "const char *kiln_last_error_message(void);",
    ] {
        assert!(text.contains(needle), "kiln.h lacks {needle:?}");
    }
}
