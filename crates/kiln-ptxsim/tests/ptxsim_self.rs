//! The host PTX simulator (`ptxsim`) on hand-written PTX: shuffles give the PTX ISA's
//! lanes (`.up/.down/.bfly/.idx`, clamps and segments), barriers order shared memory,
//! and every defect it exists to catch is caught with its typed error: an access
//! outside a binding, an uninitialised shared read, a shuffle or barrier some threads
//! never reach, a `bra.uni` that is not uniform, an instruction it does not model, a
//! thread that never ends. The tensor-core instructions against the PTX ISA's tables
//! written out here: `mma.m16n8k16` of small integers against a plain matrix product,
//! `ldmatrix(.trans)` lane by lane, `cp.async`'s zero fill and groups, and its races.

use kiln_ptxsim as ptxsim;

use ptxsim::{isa, Global, Grid, Limits, SimError};

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

// ------------------------------------------------------------------------------------
// Tensor cores and asynchronous copies

/// An entry `t` of one binding (`%rd0`), with `.b16`, `.f32` registers too; `%r0`: the
/// thread, `%rd1`: the binding plus `stride · %r0`.
fn kernel(decls: &str, stride: u32, body: &str) -> String {
    format!(
        ".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry t(\n\t.param .u64 t_param_0\n)\n{{\n\
         \t.reg .pred %p<8>;\n\t.reg .b16 %h<8>;\n\t.reg .b32 %r<64>;\n\t.reg .f32 %f<16>;\n\t.reg .b64 %rd<16>;\n\
         {decls}\tld.param.u64 %rd0, [t_param_0];\n\tcvta.to.global.u64 %rd0, %rd0;\n\tmov.u32 %r0, %tid.x;\n\
         \tmul.wide.u32 %rd2, %r0, {stride};\n\tadd.s64 %rd1, %rd0, %rd2;\n{body}\tret;\n}}\n"
    )
}

/// Runs `ptx` on one block of `block` threads over the binding `bytes`; the binding after.
fn run_on(ptx: &str, block: u32, bytes: Vec<u8>) -> Result<Vec<u8>, SimError> {
    let e = ptxsim::parse(ptx, 0)?;
    let mut g = Global::new(vec![bytes]);
    ptxsim::run(&e, Grid { grid: 1, block, shared: 0 }, &mut g, Limits::default())?;
    Ok(g.bufs.pop().unwrap_or_default())
}

fn word(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// One warp's `mma.m16n8k16` of small integers (exact in every type), fragments placed
/// by the host from the ISA's tables ([`ptxsim::isa`]), against a plain matrix product.
#[test]
fn mma_m16n8k16_multiplies_the_fragments_the_isa_lays_out() {
    let at = |(r, c): (u32, u32)| (r as usize, c as usize);
    for (ty, enc) in [("f16", ptxsim::to_f16 as fn(f64) -> u16), ("bf16", ptxsim::to_bf16)] {
        let mut s = 7u64;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % 9) as f64 - 4.0
        };
        let a: Vec<Vec<f64>> = (0..16).map(|_| (0..16).map(|_| next()).collect()).collect();
        let b: Vec<Vec<f64>> = (0..16).map(|_| (0..8).map(|_| next()).collect()).collect();
        let c: Vec<Vec<f64>> = (0..16).map(|_| (0..8).map(|_| next() * 0.5).collect()).collect();
        // Per lane 10 words in: a (4), b (2), c (4); then 4 words out per lane.
        let mut bytes = vec![0u8; 32 * 40 + 32 * 16];
        for lane in 0..32 {
            let mut w = [0u32; 10];
            for i in 0..8 {
                let (r, k) = at(isa::a(lane as u32, i as u32));
                w[i / 2] |= u32::from(enc(a[r][k])) << (16 * (i % 2));
            }
            for i in 0..4 {
                let (k, n) = at(isa::b(lane as u32, i as u32));
                w[4 + i / 2] |= u32::from(enc(b[k][n])) << (16 * (i % 2));
            }
            for i in 0..4 {
                let (r, n) = at(isa::c(lane as u32, i as u32));
                w[6 + i] = (c[r][n] as f32).to_bits();
            }
            for (j, x) in w.iter().enumerate() {
                bytes[lane * 40 + 4 * j..lane * 40 + 4 * j + 4].copy_from_slice(&x.to_le_bytes());
            }
        }
        let mut body = String::new();
        for j in 0..6 {
            body += &format!("\tld.global.b32 %r{}, [%rd1+{}];\n", j + 1, 4 * j);
        }
        for j in 0..4 {
            body += &format!("\tld.global.f32 %f{j}, [%rd1+{}];\n", 24 + 4 * j);
        }
        body += &format!(
            "\tmma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%f4, %f5, %f6, %f7}}, {{%r1, %r2, %r3, %r4}}, \
             {{%r5, %r6}}, {{%f0, %f1, %f2, %f3}};\n\tmul.wide.u32 %rd3, %r0, 16;\n\tadd.s64 %rd3, %rd3, %rd0;\n"
        );
        for j in 0..4 {
            body += &format!("\tst.global.f32 [%rd3+{}], %f{};\n", 1280 + 4 * j, 4 + j);
        }
        let out = run_on(&kernel("", 40, &body), 32, bytes).unwrap_or_else(|e| panic!("{ty}: {e}"));
        for lane in 0..32 {
            for i in 0..4 {
                let (r, n) = at(isa::c(lane as u32, i as u32));
                let want = c[r][n] + (0..16).map(|k| a[r][k] * b[k][n]).sum::<f64>();
                let got = f32::from_bits(word(&out, 320 + lane * 4 + i));
                assert_eq!(f64::from(got), want, "{ty}: lane {lane} d{i} = D[{r}][{n}]");
            }
        }
    }
    // Other shapes are refused by name, not guessed.
    let body = "\tmma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%f4, %f5, %f6, %f7}, {%r1, %r2}, {%r5}, \
                {%f0, %f1, %f2, %f3};\n";
    let e = run_on(&kernel("", 4, body), 32, vec![0; 128]).expect_err("m16n8k8");
    assert!(matches!(&e, SimError::Unsupported(s) if s.contains("m16n8k8")), "{e}");
}

/// `ldmatrix.x4` and `.x4.trans` of a shared array of distinct values, each lane giving
/// a permuted row address, against the ISA's distribution written out here: lane `l`
/// gets, in register `i`, row `l / 4`, columns `2(l % 4)` and `+1` of matrix `i`
/// (transposed: rows `2(l % 4)` and `+1` of column `l / 4`); matrix `i`'s row `j` is
/// the row lane `8i + j` addressed.
#[test]
fn ldmatrix_gives_each_lane_the_isa_elements() {
    let decls = "\t.shared .align 16 .b8 t_s[512];\n";
    // Stored row `s` (0..32) holds the halves 8s + c; lane l addresses stored row
    // `stored(l)`.
    let stored = |l: usize| 8 * (3 - l / 8) + (3 * (l % 8)) % 8;
    let mut bytes = vec![0u8; 128 + 2 * 512];
    for l in 0..32 {
        bytes[4 * l..4 * l + 4].copy_from_slice(&(16 * stored(l) as u32).to_le_bytes());
    }
    let mut body = String::from("\tmov.u32 %r1, t_s;\n\tmul.lo.u32 %r2, %r0, 16;\n\tadd.u32 %r3, %r1, %r2;\n");
    for c in 0..8 {
        body += &format!(
            "\tmul.lo.u32 %r4, %r0, 8;\n\tadd.u32 %r4, %r4, {c};\n\tcvt.u16.u32 %h0, %r4;\n\
             \tst.shared.b16 [%r3+{}], %h0;\n",
            2 * c
        );
    }
    body += "\tbar.sync 0;\n\tld.global.u32 %r5, [%rd1];\n\tadd.u32 %r6, %r1, %r5;\n\
             \tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r10, %r11, %r12, %r13}, [%r6];\n\
             \tldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%r14, %r15, %r16, %r17}, [%r6];\n\
             \tmul.wide.u32 %rd3, %r0, 16;\n\tadd.s64 %rd3, %rd3, %rd0;\n";
    for j in 0..8 {
        body += &format!("\tst.global.b32 [%rd3+{}], %r{};\n", 128 + 512 * (j / 4) + 4 * (j % 4), 10 + j);
    }
    let out = run_on(&kernel(decls, 4, &body), 32, bytes).unwrap_or_else(|e| panic!("{e}"));
    let elem = |i: usize, row: usize, col: usize| (8 * stored(8 * i + row) + col) as u32;
    for l in 0..32 {
        for i in 0..4 {
            let (r, c) = (l / 4, 2 * (l % 4));
            let plain = elem(i, r, c) | elem(i, r, c + 1) << 16;
            let trans = elem(i, c, r) | elem(i, c + 1, r) << 16;
            assert_eq!(word(&out, 32 + l * 4 + i), plain, "lane {l} r{i}");
            assert_eq!(word(&out, 32 + 128 + l * 4 + i), trans, "lane {l} r{i} .trans");
        }
    }
}

/// `mma` and `ldmatrix` need the whole warp (`.aligned`): a lane that exited first is
/// divergence.
#[test]
fn warp_matrix_instructions_need_every_lane() {
    let decls = "\t.shared .align 16 .b8 t_s[512];\n";
    let body = "\tmov.u32 %r1, t_s;\n\tsetp.ge.u32 %p0, %r0, 16;\n\t@%p0 bra END;\n\
                \tldmatrix.sync.aligned.m8n8.x1.shared.b16 {%r10}, [%r1];\nEND:\n";
    let e = run_on(&kernel(decls, 4, body), 32, vec![0; 128]).expect_err("half a warp");
    assert!(matches!(e, SimError::Divergence(_)), "{e}");
    let body = "\tsetp.ge.u32 %p0, %r0, 16;\n\t@%p0 bra END;\n\
                \tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f4, %f5, %f6, %f7}, {%r1, %r2, %r3, %r4}, \
                {%r5, %r6}, {%f0, %f1, %f2, %f3};\nEND:\n";
    let e = run_on(&kernel("", 4, body), 32, vec![0; 128]).expect_err("half a warp");
    assert!(matches!(e, SimError::Divergence(_)), "{e}");
}

/// `cp.async` with src-size 16, 1..15 and 0 (zero-filled; a src-size-0 copy reads
/// nothing, so its null source is never dereferenced), landed by `wait_group`.
#[test]
fn cp_async_copies_zero_fills_and_lands_at_the_wait() {
    let decls = "\t.shared .align 16 .b8 t_s[512];\n";
    // Thread t copies input bytes 16t.. with src-size t % 17 (thread 0: 0, from null).
    let body = "\tmov.u32 %r1, t_s;\n\tmul.lo.u32 %r2, %r0, 16;\n\tadd.u32 %r3, %r1, %r2;\n\
                \trem.u32 %r4, %r0, 17;\n\tsetp.eq.u32 %p0, %r4, 0;\n\tmov.u64 %rd4, 0;\n\
                \tselp.b64 %rd5, %rd4, %rd1, %p0;\n\
                \tcp.async.cg.shared.global [%r3], [%rd5], 16, %r4;\n\tcp.async.commit_group;\n\
                \tcp.async.wait_group 0;\n\tbar.sync 0;\n\
                \tld.shared.v4.b32 {%r10, %r11, %r12, %r13}, [%r3];\n\
                \tst.global.v4.b32 [%rd1+512], {%r10, %r11, %r12, %r13};\n";
    let bytes: Vec<u8> = (0..1024).map(|i| (i % 251 + 1) as u8).collect();
    let out = run_on(&kernel(decls, 16, body), 32, bytes.clone()).unwrap_or_else(|e| panic!("{e}"));
    for t in 0..32 {
        let n = t % 17;
        for b in 0..16 {
            let want = if b < n { bytes[16 * t + b] } else { 0 };
            assert_eq!(out[512 + 16 * t + b], want, "thread {t} byte {b} (src-size {n})");
        }
    }
    // src-size 16 from an address out of the binding is an error.
    let body = "\tmov.u32 %r1, t_s;\n\tcp.async.cg.shared.global [%r1], [%rd1+4096], 16, 16;\n";
    let e = run_on(&kernel(decls, 16, body), 1, vec![0; 1024]).expect_err("out of range");
    assert!(matches!(e, SimError::OutOfBounds(_)), "{e}");
}

/// The races `cp.async` allows are caught: a read before the wait (the copy may not
/// have landed), a read of another thread's landed copy with no barrier after its
/// wait, and a read of a group `wait_group 1` leaves outstanding.
#[test]
fn cp_async_races_are_errors() {
    let decls = "\t.shared .align 16 .b8 t_s[1024];\n";
    let head = "\tmov.u32 %r1, t_s;\n\tmul.lo.u32 %r2, %r0, 16;\n\tadd.u32 %r3, %r1, %r2;\n\
                \tcp.async.cg.shared.global [%r3], [%rd1], 16;\n\tcp.async.commit_group;\n";
    let own = "\tld.shared.b32 %r10, [%r3];\n\tst.global.b32 [%rd1], %r10;\n";
    let ok = |body: &str| run_on(&kernel(decls, 16, body), 32, vec![1; 1024]);
    // Before the wait.
    let e = ok(&format!("{head}{own}")).expect_err("no wait");
    assert!(matches!(&e, SimError::Divergence(s) if s.contains("outstanding")), "{e}");
    // Own bytes after the wait: fine.
    ok(&format!("{head}\tcp.async.wait_all;\n{own}")).unwrap_or_else(|e| panic!("{e}"));
    // The previous thread's bytes after the wait, without and with a barrier.
    let other = "\tsetp.eq.u32 %p0, %r0, 0;\n\t@%p0 bra END;\n\tld.shared.b32 %r10, [%r3+-16];\n\
                 \tst.global.b32 [%rd1], %r10;\nEND:\n";
    let e = ok(&format!("{head}\tcp.async.wait_all;\n{other}")).expect_err("no barrier");
    assert!(matches!(&e, SimError::Divergence(s) if s.contains("no barrier")), "{e}");
    ok(&format!("{head}\tcp.async.wait_all;\n\tbar.sync 0;\n{other}")).unwrap_or_else(|e| panic!("{e}"));
    // Two groups; `wait_group 1` lands the first only.
    let two = format!(
        "{head}\tcp.async.cg.shared.global [%r3+256], [%rd1], 16;\n\tcp.async.commit_group;\n\
         \tcp.async.wait_group 1;\n\tld.shared.b32 %r10, [%r3];\n"
    );
    ok(&two).unwrap_or_else(|e| panic!("{e}"));
    let e = ok(&format!("{two}\tld.shared.b32 %r11, [%r3+256];\n")).expect_err("second group outstanding");
    assert!(matches!(&e, SimError::Divergence(s) if s.contains("outstanding")), "{e}");
    // A store into bytes a copy still writes races too.
    let e = ok(&format!("{head}\tst.shared.b32 [%r3], %r0;\n")).expect_err("store over a pending copy");
    assert!(matches!(&e, SimError::Divergence(s) if s.contains("outstanding")), "{e}");
}

/// A `cp.async` into bytes another thread read since the last barrier races with that
/// read (the copy may land first): an error, fine after a barrier.
#[test]
fn cp_async_over_bytes_others_still_read_is_an_error() {
    let decls = "\t.shared .align 16 .b8 t_s[1024];\n";
    let head = "\tmov.u32 %r1, t_s;\n\tmul.lo.u32 %r2, %r0, 16;\n\tadd.u32 %r3, %r1, %r2;\n\
                \tst.shared.v4.b32 [%r3], {%r0, %r0, %r0, %r0};\n\tbar.sync 0;\n\
                \tadd.u32 %r4, %r0, 1;\n\tand.b32 %r4, %r4, 31;\n\tmul.lo.u32 %r4, %r4, 16;\n\
                \tadd.u32 %r5, %r1, %r4;\n\tld.shared.b32 %r10, [%r5];\n";
    let copy = "\tcp.async.cg.shared.global [%r3], [%rd1], 16;\n\tcp.async.wait_all;\n";
    let run = |body: &str| run_on(&kernel(decls, 16, body), 32, vec![1; 1024]);
    let e = run(&format!("{head}{copy}")).expect_err("a copy over a chunk thread t − 1 read");
    assert!(matches!(&e, SimError::Divergence(s) if s.contains("overwrites")), "{e}");
    run(&format!("{head}\tbar.sync 0;\n{copy}")).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn prmt_picks_the_bytes_the_isa_names() {
    // a = 0x88112233 (bytes 33 22 11 88), b = 0x445566F7 (bytes F7 66 55 44); the eight
    // bytes {b, a} are numbered 0..7 from a's lowest. Expected words written out by hand
    // from the PTX ISA's `prmt` table (default mode).
    let cases: [(u32, u32); 7] = [
        (0x3210, 0x8811_2233),
        (0x7654, 0x4455_66F7),
        (0x0040, 0x3333_F733),
        (0x5410, 0x66F7_2233),
        // Selector msb: the picked byte's sign, replicated (88 → FF, F7 → FF, 33 → 00).
        (0x8C3B, 0x00FF_88FF),
        // Only the selector's low 16 bits count.
        (0xFFFF_0123, 0x3322_1188),
        (0x4567, 0xF766_5544),
    ];
    let mut body = String::from("\tmov.b32 %r1, 0x88112233;\n\tmov.b32 %r2, 0x445566F7;\n");
    for (k, (sel, _)) in cases.iter().enumerate() {
        body.push_str(&format!("\tprmt.b32 %r3, %r1, %r2, {sel:#X};\n\tst.global.u32 [%rd1+{}], %r3;\n", 4 * k));
    }
    let out = run(&entry("", &body), 1, 4 * cases.len(), Limits::default()).expect("runs");
    for (k, (sel, want)) in cases.iter().enumerate() {
        assert_eq!(out[k], *want, "prmt selector {sel:#06X}: got {:#010X}", out[k]);
    }
}

/// Bytes of the shared image: A's 8 KiB, then B's 16 KiB.
const IMG: usize = 8192 + 16384;

/// The binding of one warpgroup's `wgmma … m64n128k16` (see
/// [`wgmma_multiplies_the_operands_the_descriptors_lay_out`]): the shared image (A at
/// offset 0 of a 1024-aligned array, B at 8192, each placed by the ISA's canonical
/// 128-byte swizzle layouts, [`isa::sw128_k_major`], [`isa::sw128_mn_major`],
/// [`isa::swizzle128`]; a K-major operand's 16 `k` in the second 32 bytes of its rows:
/// a start inside the swizzle atom), the descriptors' high bits and start offsets, and
/// room for D.
fn wgmma_case(ta: bool, tb: bool, a: &[Vec<f64>], b: &[Vec<f64>], enc: fn(f64) -> u16) -> Vec<u8> {
    let mut bytes = vec![0u8; IMG + 24 + 128 * 256];
    let mut put = |off: u32, v: f64| {
        let at = isa::swizzle128(off) as usize;
        bytes[at..at + 2].copy_from_slice(&enc(v).to_le_bytes());
    };
    // (start offset, leading, stride) per operand.
    let (a_start, a_lbo, a_sbo) = if ta { (0, 8192, 1024) } else { (32, 16, 1024) };
    let (b_start, b_lbo, b_sbo) = if tb { (8192, 2048, 1024) } else { (8192 + 32, 16, 1024) };
    for (m, row) in a.iter().enumerate() {
        for (k, &v) in row.iter().enumerate() {
            let (m, k) = (m as u32, k as u32);
            let o = if ta { isa::sw128_mn_major(m, k, a_lbo, a_sbo) } else { isa::sw128_k_major(m, k, a_sbo) };
            put(a_start + o, v);
        }
    }
    for (k, row) in b.iter().enumerate() {
        for (n, &v) in row.iter().enumerate() {
            let (n, k) = (n as u32, k as u32);
            let o = if tb { isa::sw128_mn_major(n, k, b_lbo, b_sbo) } else { isa::sw128_k_major(n, k, b_sbo) };
            put(b_start + o, v);
        }
    }
    let hi = |lbo: u64, sbo: u64| ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (1u64 << 62);
    bytes[IMG..IMG + 8].copy_from_slice(&hi(a_lbo.into(), a_sbo.into()).to_le_bytes());
    bytes[IMG + 8..IMG + 16].copy_from_slice(&hi(b_lbo.into(), b_sbo.into()).to_le_bytes());
    bytes[IMG + 16..IMG + 20].copy_from_slice(&a_start.to_le_bytes());
    bytes[IMG + 20..IMG + 24].copy_from_slice(&b_start.to_le_bytes());
    bytes
}

/// The kernel of [`wgmma_case`]: copies the image into shared memory, fences it for the
/// async proxy, builds the descriptors, runs one `wgmma` from zero accumulators and
/// stores thread `x`'s 64 registers at `IMG + 24 + 256x`. `edit` rewrites the body (to
/// take a synchronisation step out).
fn wgmma_kernel(ty: &str, ta: bool, tb: bool, edit: &dyn Fn(String) -> String) -> String {
    let decls = format!("\t.reg .f32 %g<64>;\n\t.shared .align 1024 .b8 t_s[{IMG}];\n");
    let mut body = format!(
        "\tmov.u32 %r1, t_s;\n\tmov.u32 %r2, 0;\nCOPY:\n\tmad.lo.u32 %r3, %r2, 128, %r0;\n\
         \tmul.wide.u32 %rd3, %r3, 4;\n\tadd.s64 %rd4, %rd0, %rd3;\n\tld.global.b32 %r4, [%rd4];\n\
         \tshl.b32 %r5, %r3, 2;\n\tadd.u32 %r5, %r5, %r1;\n\tst.shared.b32 [%r5], %r4;\n\
         \tadd.u32 %r2, %r2, 1;\n\tsetp.lt.u32 %p0, %r2, {};\n\t@%p0 bra COPY;\n\
         \tfence.proxy.async.shared::cta;\n\tbar.sync 0;\n\
         \tld.global.u64 %rd5, [%rd0+{IMG}];\n\tld.global.u64 %rd6, [%rd0+{}];\n\
         \tld.global.u32 %r6, [%rd0+{}];\n\tld.global.u32 %r7, [%rd0+{}];\n\
         \tadd.u32 %r6, %r6, %r1;\n\tshr.u32 %r6, %r6, 4;\n\tcvt.u64.u32 %rd7, %r6;\n\tor.b64 %rd7, %rd7, %rd5;\n\
         \tadd.u32 %r7, %r7, %r1;\n\tshr.u32 %r7, %r7, 4;\n\tcvt.u64.u32 %rd8, %r7;\n\tor.b64 %rd8, %rd8, %rd6;\n",
        IMG / 4 / 128,
        IMG + 8,
        IMG + 16,
        IMG + 20
    );
    for j in 0..64 {
        body += &format!("\tmov.f32 %g{j}, 0f00000000;\n");
    }
    let regs: Vec<String> = (0..64).map(|j| format!("%g{j}")).collect();
    body += &format!(
        "\twgmma.fence.sync.aligned;\n\tsetp.ne.u32 %p1, %r0, 4096;\n\
         \twgmma.mma_async.sync.aligned.m64n128k16.f32.{ty}.{ty} {{{}}}, %rd7, %rd8, %p1, 1, 1, {}, {};\n\
         \twgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;\n\
         \tmul.wide.u32 %rd9, %r0, 256;\n\tadd.s64 %rd9, %rd9, %rd0;\n",
        regs.join(", "),
        u8::from(ta),
        u8::from(tb)
    );
    for j in 0..64 {
        body += &format!("\tst.global.f32 [%rd9+{}], %g{j};\n", IMG + 24 + 4 * j);
    }
    kernel(&decls, 4, &edit(body))
}

/// One warpgroup's `wgmma.mma_async … m64n128k16` of small integers (exact in every
/// type), A and B placed in shared memory by the ISA's canonical 128-byte swizzle
/// layouts (K-major and MN-major each, the MN-major B over two 64-column groups apart
/// by the leading byte offset), D read back through the ISA's fragment
/// ([`isa::wgmma_d`]), against a plain matrix product.
#[test]
fn wgmma_multiplies_the_operands_the_descriptors_lay_out() {
    for (ty, enc) in [("f16", ptxsim::to_f16 as fn(f64) -> u16), ("bf16", ptxsim::to_bf16)] {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let mut s = 11u64 + u64::from(ta) + 2 * u64::from(tb);
            let mut next = || {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) % 9) as f64 - 4.0
            };
            let a: Vec<Vec<f64>> = (0..64).map(|_| (0..16).map(|_| next()).collect()).collect();
            let b: Vec<Vec<f64>> = (0..16).map(|_| (0..128).map(|_| next()).collect()).collect();
            let bytes = wgmma_case(ta, tb, &a, &b, enc);
            let ptx = wgmma_kernel(ty, ta, tb, &|b| b);
            let out = run_on(&ptx, 128, bytes).unwrap_or_else(|e| panic!("{ty} {ta} {tb}: {e}"));
            for x in 0..128u32 {
                for i in 0..64u32 {
                    let (r, n) = isa::wgmma_d(x, i);
                    let (r, n) = (r as usize, n as usize);
                    let want: f64 = (0..16).map(|k| a[r][k] * b[k][n]).sum();
                    let got = f32::from_bits(word(&out, IMG / 4 + 6 + 64 * x as usize + i as usize));
                    assert_eq!(f64::from(got), want, "{ty} trans {ta} {tb}: thread {x} d{i} = D[{r}][{n}]");
                }
            }
        }
    }
}

/// The `wgmma` synchronisation the ISA requires, each taken out in turn, is an error:
/// no `fence.proxy.async` between the shared stores and the `wgmma` (generic-proxy
/// writes unordered with the async proxy's reads), no `wgmma.fence` before it, and a
/// shared store over its operands before `wgmma.wait_group` (a race with its
/// asynchronous reads); a warpgroup missing a thread is divergence.
#[test]
fn wgmma_synchronisation_is_checked() {
    let a = vec![vec![1.0; 16]; 64];
    let b = vec![vec![1.0; 128]; 16];
    let cases: [(&str, &dyn Fn(String) -> String); 4] = [
        ("no proxy fence", &|s: String| s.replace("\tfence.proxy.async.shared::cta;\n", "")),
        ("no wgmma.fence", &|s: String| s.replace("\twgmma.fence.sync.aligned;\n", "")),
        ("a store before the wait", &|s: String| {
            s.replace(
                "\twgmma.commit_group.sync.aligned;\n",
                "\twgmma.commit_group.sync.aligned;\n\tst.shared.b32 [%r1+32], %r4;\n",
            )
        }),
        ("a thread missing", &|s: String| {
            s.replace(
                "\twgmma.fence.sync.aligned;\n",
                "\tsetp.eq.u32 %p2, %r0, 77;\n\t@%p2 bra END;\n\twgmma.fence.sync.aligned;\n",
            ) + "END:\n"
        }),
    ];
    for (what, edit) in cases {
        let ptx = wgmma_kernel("bf16", false, true, edit);
        assert!(ptx != wgmma_kernel("bf16", false, true, &|b| b), "{what}: the edit applies");
        let e = run_on(&ptx, 128, wgmma_case(false, true, &a, &b, ptxsim::to_bf16)).expect_err(what);
        assert!(matches!(e, SimError::Divergence(_)), "{what}: {e}");
    }
}
