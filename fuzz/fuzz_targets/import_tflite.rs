//! Fuzz target: arbitrary bytes as a TFLite model. Import must return Ok or a typed
//! error, never panic, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let opts = kiln_import::ImportOptions::default();
    let _ = kiln_import::tflite::import_bytes(bytes::Bytes::copy_from_slice(data), &opts);
});
