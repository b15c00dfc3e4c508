//! Fuzz target: arbitrary bytes as a `.kiln` artifact, through section decoding and the
//! runtime's load-time verification (everything up to, not including, placing code).
//! Each input is tried as given and resealed (checksums and length rewritten), so that
//! mutations reach the section decoders and the verifier rather than dying at a CRC.
//! Variant conditions (format 1.5) are evaluated for a host of every feature and for an
//! x86-64-v3 host, which must never be given a variant needing more than it has.
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
        // An x86-64-v3 host: the variant conditions (format 1.5) are evaluated against
        // features it lacks, and no variant that needs one of them is taken.
        let v3 = kiln_module::program::CpuFeature::LEVELS[2];
        if let Ok(v) = kiln_runtime::Module::verify(bytes, None, v3) {
            for (k, &i) in v.program().kernels.iter().zip(v.variants()) {
                let needs = kiln_runtime::verify::cpu_needs(v.program(), &k.variants[i]);
                assert_eq!(needs.map(|n| n & !v3), Some(0), "a variant needing more than the host was taken");
            }
        }
    }
});
