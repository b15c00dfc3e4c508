//! The runtime's CPU pieces this code generator relies on: the helper table (order,
//! f16 conversions checked exhaustively against an independent oracle) and the loader
//! (relocations, bounds errors, W^X, entry points).

mod common;

use common::f16_value;
use kiln_module::abi::{Helper, HELPER_COUNT};
use kiln_module::program::{Reloc, RelocKind};
use kiln_runtime::cpu::helpers::{f16_to_f32, f32_to_f16, HELPERS, HELPER_NAMES};
use kiln_runtime::cpu::loader::{LoadError, LoadedCode};

#[test]
fn helper_table_order() {
    assert_eq!(HELPERS.len(), HELPER_COUNT);
    for (i, h) in Helper::ALL.iter().enumerate() {
        assert_eq!(*h as usize, i);
        assert_eq!(HELPER_NAMES[i], h.name(), "entry {i}");
    }
    // Spot-check that entries point at what their names say.
    let call1 = |h: Helper, x: f64| -> f64 {
        let f = HELPERS[h as usize];
        // SAFETY (test): entries documented as fn(f64) -> f64.
        let f: extern "C" fn(f64) -> f64 = unsafe { std::mem::transmute(f) };
        f(x)
    };
    assert!((call1(Helper::ExpF64, 1.0) - std::f64::consts::E).abs() < 1e-15);
    assert!((call1(Helper::AtanF64, 1.0) - std::f64::consts::FRAC_PI_4).abs() < 1e-15);
    assert!((call1(Helper::SinhF64, 1.0) - (std::f64::consts::E - 1.0 / std::f64::consts::E) / 2.0).abs() < 1e-15);
    let f = HELPERS[Helper::PowF32 as usize];
    // SAFETY (test): documented as fn(f32, f32) -> f32.
    let pow: extern "C" fn(f32, f32) -> f32 = unsafe { std::mem::transmute(f) };
    assert_eq!(pow(2.0, 10.0), 1024.0);
    let f = HELPERS[Helper::FmodF32 as usize];
    // SAFETY (test): documented as fn(f32, f32) -> f32.
    let fmod: extern "C" fn(f32, f32) -> f32 = unsafe { std::mem::transmute(f) };
    assert_eq!(fmod(7.5, 2.0), 1.5);
    assert_eq!(fmod(-7.5, 2.0), -1.5);
}

/// Every finite non-negative f16, by value, for the rounding oracle.
fn f16_table() -> Vec<(f64, u16)> {
    (0u16..0x7c00).map(|h| (f16_value(h), h)).collect()
}

/// Round `x` to f16 by searching the table: nearest, ties to the even encoding,
/// beyond 65520 (halfway to 2^16) infinity.
fn oracle_f16(table: &[(f64, u16)], x: f64) -> u16 {
    if x.is_nan() {
        return 0x7e00;
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a >= 65520.0 {
        return sign | 0x7c00;
    }
    let i = table.partition_point(|&(v, _)| v < a);
    if i == table.len() {
        // Between the largest finite value and the overflow threshold.
        return sign | table[i - 1].1;
    }
    if i < table.len() && table[i].0 == a {
        return sign | table[i].1;
    }
    let (lo, hi) = (table[i - 1], table[i]);
    let (dl, dh) = (a - lo.0, hi.0 - a);
    let pick = if dl < dh || (dl == dh && lo.1 % 2 == 0) { lo.1 } else { hi.1 };
    sign | pick
}

#[test]
fn f16_widening_exhaustive() {
    for h in 0..=u16::MAX {
        let got = f16_to_f32(h as u32);
        let want = f16_value(h);
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#x}");
        } else {
            assert_eq!(got.to_bits(), (want as f32).to_bits(), "{h:#x}");
        }
    }
}

#[test]
fn f16_rounding_against_oracle() {
    let table = f16_table();
    // Every f16, every midpoint between neighbours, and one f32 ulp either side.
    let mut xs: Vec<f32> = Vec::new();
    for w in table.windows(2) {
        let (a, b) = (w[0].0 as f32, w[1].0 as f32);
        let mid = ((w[0].0 + w[1].0) / 2.0) as f32;
        xs.extend([a, mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1), b]);
    }
    xs.extend([65504.0, 65519.99, 65520.0, 65536.0, 1e10, f32::INFINITY, f32::MAX, 1e-10, 2.9e-8, 2.99e-8, 3e-8]);
    let mut r = common::Rng(99);
    for _ in 0..200_000 {
        xs.push(f32::from_bits((r.next() >> 32) as u32 & 0x7fff_ffff));
    }
    for x in xs {
        for s in [x, -x] {
            let got = f32_to_f16(s) as u16;
            if s.is_nan() {
                assert!(got & 0x7c00 == 0x7c00 && got & 0x3ff != 0, "{s:e}: {got:#x}");
                continue;
            }
            let want = oracle_f16(&table, s as f64);
            assert_eq!(got, want, "{s:e} ({:#x})", s.to_bits());
        }
    }
    assert!(f16_value(f32_to_f16(f32::NAN) as u16).is_nan());
    assert!(f16_value(f32_to_f16(f32::from_bits(0x7f80_0001)) as u16).is_nan());
}

/// Hand-assembled code: `movabs rax, imm64; ret` (Abs64 at 2) and
/// `lea rax, [rip + disp32]; ret` (Pc32 at 13), both pointing at offset 0.
fn two_functions() -> (Vec<u8>, Vec<Reloc>) {
    let mut code = vec![0x48, 0xb8];
    code.extend_from_slice(&[0; 8]);
    code.push(0xc3); // ret (offset 10)
    code.extend_from_slice(&[0x48, 0x8d, 0x05]); // lea rax, [rip+disp32] at 11
    code.extend_from_slice(&[0; 4]); // disp at 14
    code.push(0xc3);
    let relocs = vec![
        Reloc { offset: 2, kind: RelocKind::Abs64, target: 0, addend: 5 },
        Reloc { offset: 14, kind: RelocKind::Pc32, target: 0, addend: -4 },
    ];
    (code, relocs)
}

#[test]
fn loader_applies_relocations() {
    let (code, relocs) = two_functions();
    let loaded = LoadedCode::load(&code, &relocs).unwrap();
    assert_eq!(loaded.len(), code.len());
    let f0 = loaded.entry(0).unwrap();
    let f1 = loaded.entry(11).unwrap();
    // SAFETY (test): both functions take no arguments (extra ones are ignored) and
    // return a value in rax; read as u64 through an ABI-compatible signature.
    let (a, b) = unsafe {
        let f0: extern "C" fn() -> u64 = std::mem::transmute(f0);
        let f1: extern "C" fn() -> u64 = std::mem::transmute(f1);
        (f0(), f1())
    };
    // Abs64 gives base + 5; Pc32 gives base.
    assert_eq!(a, b + 5);
    assert_eq!(b, f0 as usize as u64);
    // The mapping is read-execute, not writable.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| {
            let r = l.split_whitespace().next().unwrap();
            let (lo, hi) = r.split_once('-').unwrap();
            let (lo, hi) = (u64::from_str_radix(lo, 16).unwrap(), u64::from_str_radix(hi, 16).unwrap());
            (lo..hi).contains(&b)
        })
        .unwrap();
    assert!(line.split_whitespace().nth(1).unwrap().starts_with("r-x"), "{line}");
}

#[test]
fn loader_rejects_bad_relocations() {
    let (code, _) = two_functions();
    let n = code.len();
    let r = |offset, kind, target, addend| vec![Reloc { offset, kind, target, addend }];
    assert!(matches!(
        LoadedCode::load(&code, &r(n as u64 - 2, RelocKind::Pc32, 0, 0)),
        Err(LoadError::RelocOutside { .. })
    ));
    assert!(matches!(
        LoadedCode::load(&code, &r(n as u64 - 4, RelocKind::Abs64, 0, 0)),
        Err(LoadError::RelocOutside { .. })
    ));
    assert!(matches!(
        LoadedCode::load(&code, &r(u64::MAX - 1, RelocKind::Pc32, 0, 0)),
        Err(LoadError::RelocOutside { .. })
    ));
    assert!(matches!(
        LoadedCode::load(&code, &r(2, RelocKind::Abs64, n as u64 + 1, 0)),
        Err(LoadError::TargetOutside { .. })
    ));
    assert!(matches!(
        LoadedCode::load(&code, &r(14, RelocKind::Pc32, 0, 1 << 40)),
        Err(LoadError::Pc32Overflow { .. })
    ));
    let loaded = LoadedCode::load(&code, &[]).unwrap();
    assert!(matches!(loaded.entry(n as u64), Err(LoadError::EntryOutside { .. })));
    // Empty code loads (and has no entries).
    let empty = LoadedCode::load(&[], &[]).unwrap();
    assert!(empty.is_empty() && empty.entry(0).is_err());
}
