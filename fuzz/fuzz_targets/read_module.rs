//! Fuzz target: arbitrary bytes as a `.kiln` module. Parsing must return Ok or a
//! typed error, and sections handed out must lie inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = kiln_module::Module::parse(data) {
        for s in m.sections() {
            let start = s.bytes.as_ptr() as usize - data.as_ptr() as usize;
            assert!(start + s.bytes.len() <= data.len());
        }
    }
});
