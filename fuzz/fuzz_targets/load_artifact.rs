//! Fuzz target: arbitrary bytes as a `.kiln` artifact, through section decoding and the
//! runtime's load-time verification (everything up to, not including, placing code).
//! Each input is tried as given and resealed (checksums and length rewritten), so that
//! mutations reach the section decoders and the verifier rather than dying at a CRC.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut resealed = data.to_vec();
    kiln_module::reseal::reseal(&mut resealed);
    for bytes in [data, &resealed[..]] {
        if let Ok(m) = kiln_module::Module::parse(bytes) {
            let _ = kiln_module::sections::read_program(&m);
        }
        // All features: variant choice never fails for lack of them, so verification runs
        // to the end; `None`: external-weights modules stop at the weights check, after
        // the plan was verified.
        let _ = kiln_runtime::Module::verify(bytes, None, u64::MAX);
    }
});
