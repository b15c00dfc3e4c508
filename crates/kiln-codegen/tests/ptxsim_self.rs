//! The host PTX simulator (`ptxsim`) on hand-written PTX: shuffles give the PTX ISA's
//! lanes (`.up/.down/.bfly/.idx`, clamps and segments), barriers order shared memory,
//! and every defect it exists to catch is caught with its typed error: an access
//! outside a binding, an uninitialised shared read, a shuffle or barrier some threads
//! never reach, a `bra.uni` that is not uniform, an instruction it does not model, a
//! thread that never ends.

mod ptxsim;

use ptxsim::{Global, Grid, Limits, SimError};

/// An entry `t` of one binding with `body` between the prologue (`%rd0`: the binding,
/// `%r0`: the thread, `%rd1`: its 4-byte slot's address) and `ret`.
fn entry(decls: &str, body: &str) -> String {
    format!(
        ".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry t(\n\t.param .u64 t_param_0\n)\n{{\n\
         \t.reg .pred %p<8>;\n\t.reg .b32 %r<32>;\n\t.reg .b64 %rd<16>;\n{decls}\
         \tld.param.u64 %rd0, [t_param_0];\n\tcvta.to.global.u64 %rd0, %rd0;\n\tmov.u32 %r0, %tid.x;\n\
         \tmul.wide.u32 %rd2, %r0, 4;\n\tadd.s64 %rd1, %rd0, %rd2;\n{body}\tret;\n}}\n"
    )
}

fn run(ptx: &str, block: u32, bytes: usize, lim: Limits) -> Result<Vec<u32>, SimError> {
    let e = ptxsim::parse(ptx, 0)?;
    let mut g = Global::new(vec![vec![0; bytes]]);
    ptxsim::run(&e, Grid { grid: 1, block, shared: 0 }, &mut g, lim)?;
    Ok(g.bufs[0].chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[test]
fn shuffles_read_the_lanes_the_isa_names() {
    let body = "\tshfl.sync.down.b32 %r1, %r0, 3, 31, 0xFFFFFFFF;\n\tst.global.u32 [%rd1], %r1;\n\
                \tshfl.sync.bfly.b32 %r2, %r0, 5, 31, 0xFFFFFFFF;\n\tst.global.u32 [%rd1+256], %r2;\n\
                \tshfl.sync.idx.b32 %r3, %r0, 2, 0x181F, 0xFFFFFFFF;\n\tst.global.u32 [%rd1+512], %r3;\n\
                \tshfl.sync.up.b32 %r4|%p1, %r0, 1, 0, 0xFFFFFFFF;\n\tselp.u32 %r5, 1, 0, %p1;\n\
                \tst.global.u32 [%rd1+768], %r4;\n\tst.global.u32 [%rd1+1024], %r5;\n";
    // Two warps: lanes are per warp.
    let out = run(&entry("", body), 64, 64 * 4 * 5, Limits::default()).expect("runs");
    // Thread t's results sit at words t + 64·k (k = the shuffle).
    for tid in 0..64usize {
        let lane = tid % 32;
        let base = tid - lane;
        let down = if lane + 3 <= 31 { lane + 3 } else { lane };
        let bfly = lane ^ 5;
        let idx = (lane & !7) | 2;
        let (up, up_ok) = if lane >= 1 { (lane - 1, 1) } else { (lane, 0) };
        let got = |k: usize| out[tid + 64 * k] as usize;
        assert_eq!(got(0), base + down, "down, thread {tid}");
        assert_eq!(got(1), base + bfly, "bfly, thread {tid}");
        assert_eq!(got(2), base + idx, "idx in segments of 8, thread {tid}");
        assert_eq!(got(3), base + up, "up, thread {tid}");
        assert_eq!(got(4), up_ok, "up's predicate, thread {tid}");
    }
}

#[test]
fn a_barrier_orders_shared_memory_and_unwritten_shared_bytes_are_refused() {
    let decls = "\t.shared .align 4 .b8 t_s[256];\n";
    let body = "\tmov.u32 %r1, t_s;\n\tshl.b32 %r2, %r0, 2;\n\tadd.u32 %r3, %r1, %r2;\n\
                \tst.shared.u32 [%r3], %r0;\n\tbar.sync 0;\n\txor.b32 %r4, %r2, 4;\n\tadd.u32 %r5, %r1, %r4;\n\
                \tld.shared.u32 %r6, [%r5];\n\tst.global.u32 [%rd1], %r6;\n";
    let out = run(&entry(decls, body), 64, 256, Limits::default()).expect("runs");
    for (t, &v) in out.iter().enumerate() {
        assert_eq!(v as usize, t ^ 1);
    }
    // Without the barrier, thread 0 reads thread 1's slot before thread 1 wrote it.
    let racy = body.replace("\tbar.sync 0;\n", "");
    let e = run(&entry(decls, &racy), 64, 256, Limits::default()).expect_err("an uninitialised read");
    assert!(matches!(e, SimError::Uninitialised(_)), "{e}");
    // Past the variable's end.
    let past = body.replace("xor.b32 %r4, %r2, 4", "add.u32 %r4, %r2, 4");
    let e = run(&entry(decls, &past), 64, 256, Limits::default()).expect_err("outside the variable");
    assert!(matches!(e, SimError::OutOfBounds(_)), "{e}");
}

#[test]
fn divergent_shuffles_and_barriers_fail() {
    let exit5 = "\tsetp.eq.u32 %p0, %r0, 5;\n\t@%p0 ret;\n";
    let shfl = "\tshfl.sync.bfly.b32 %r1, %r0, 1, 31, 0xFFFFFFFF;\n\tst.global.u32 [%rd1], %r1;\n";
    let e = run(&entry("", &format!("{exit5}{shfl}")), 32, 128, Limits::default()).expect_err("lane 5 exited");
    assert!(matches!(e, SimError::Divergence(_)), "{e}");
    // A partial mask that leaves lane 5 out is fine, as long as no lane reads lane 5.
    let part = "\tshfl.sync.bfly.b32 %r1, %r0, 16, 31, 0xFFFF0000;\n";
    let guard = "\tsetp.lt.u32 %p1, %r0, 16;\n\t@%p1 bra L0;\n";
    let ok = format!("{exit5}{guard}{part}\tst.global.u32 [%rd1], %r1;\nL0:\n");
    let out = run(&entry("", &ok), 32, 128, Limits::default());
    // Lanes 16..31 read lanes 0..15 by xor 16, which are not in the mask: an error.
    assert!(matches!(out, Err(SimError::Divergence(_))), "{out:?}");
    let ok = ok.replace("bfly.b32 %r1, %r0, 16", "bfly.b32 %r1, %r0, 1");
    let out = run(&entry("", &ok), 32, 128, Limits::default()).expect("a shuffle among lanes 16..31");
    assert_eq!(out[16], 17);
    // `bra.uni` taken by some lanes of a warp only.
    let uni = "\tsetp.lt.u32 %p2, %r0, 5;\n\t@%p2 bra.uni L1;\nL1:\n\tst.global.u32 [%rd1], %r0;\n";
    let e = run(&entry("", uni), 32, 128, Limits::default()).expect_err("a divergent bra.uni");
    assert!(matches!(&e, SimError::Divergence(s) if s.contains("bra.uni")), "{e}");
    let uni = uni.replace("%r0, 5", "%r0, 64");
    run(&entry("", &uni), 32, 128, Limits::default()).expect("a uniform bra.uni");
    let bar = "\tbar.sync 0;\n\tst.global.u32 [%rd1], %r0;\n";
    let e = run(&entry("", &format!("{exit5}{bar}")), 64, 256, Limits::default()).expect_err("barrier divergence");
    assert!(matches!(e, SimError::Divergence(_)), "{e}");
}

#[test]
fn out_of_binding_accesses_unknown_instructions_and_hangs_fail() {
    let store = "\tst.global.u32 [%rd1], %r0;\n";
    let e = run(&entry("", store), 32, 64, Limits::default()).expect_err("16 words for 32 threads");
    assert!(matches!(e, SimError::OutOfBounds(_)), "{e}");
    let e = run(&entry("", "\tst.global.u32 [%rd1+2], %r0;\n"), 32, 256, Limits::default()).expect_err("misaligned");
    assert!(matches!(e, SimError::OutOfBounds(_)), "{e}");
    let e = run(&entry("", "\tpopc.b32 %r1, %r0;\n"), 32, 128, Limits::default()).expect_err("popc");
    assert!(matches!(&e, SimError::Unsupported(s) if s.contains("popc")), "{e}");
    let e = run(&entry("", "\tadd.f32 %r1, %r0, %r0;\n"), 32, 128, Limits::default()).expect_err("no rounding");
    assert!(matches!(&e, SimError::Unsupported(s) if s.contains("add.f32")), "{e}");
    let lim = Limits { per_thread: 10_000, ..Limits::default() };
    let e = run(&entry("", "L0:\n\tbra L0;\n"), 32, 128, lim).expect_err("a hang");
    assert!(matches!(e, SimError::Budget(_)), "{e}");
    let e = run(&entry("", "\tdiv.u32 %r1, %r0, 0;\n"), 32, 128, Limits::default()).expect_err("division by zero");
    assert!(matches!(e, SimError::Undefined(_)), "{e}");
}

#[test]
fn half_conversions_round_once_to_nearest_even() {
    use ptxsim::{f16_to_f32, to_bf16, to_f16};
    assert_eq!(to_f16(65504.0), 0x7BFF);
    assert_eq!(to_f16(65519.0), 0x7BFF);
    assert_eq!(to_f16(65520.0), 0x7C00);
    assert_eq!(to_f16(2f64.powi(-24)), 0x0001);
    assert_eq!(to_f16(2f64.powi(-25)), 0x0000);
    assert_eq!(to_f16(3.0 * 2f64.powi(-25)), 0x0002);
    assert_eq!(to_f16(1.0 + 2f64.powi(-11)), 0x3C00);
    assert_eq!(to_f16(1.0 + 3.0 * 2f64.powi(-11)), 0x3C02);
    assert_eq!(to_f16(-2.0), 0xC000);
    assert_eq!(to_f16(f64::NAN), 0x7FFF);
    // Once from f64: 1 + 2⁻¹¹ + 2⁻³⁰ is above the tie (f32 would round it onto it).
    assert_eq!(to_f16(1.0 + 2f64.powi(-11) + 2f64.powi(-30)), 0x3C01);
    assert_eq!(to_bf16(1.0 + 2f64.powi(-8)), 0x3F80);
    assert_eq!(to_bf16(1.0 + 3.0 * 2f64.powi(-8)), 0x3F82);
    assert_eq!(to_bf16(f64::INFINITY), 0x7F80);
    for h in [0x0001u16, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xC000] {
        assert_eq!(to_f16(f64::from(f16_to_f32(h))), h);
    }
}
