//! A small PTX simulator for the instruction subset the contraction emitter writes, so
//! that its kernels run on the host against the kernel interpreter (no GPU here).
//!
//! Threads of a block run one after another up to each `bar.sync` (every thread must
//! reach the same barrier or all must have returned, else the simulation fails: a
//! barrier divergence). Registers hold raw bits; `.shared` is one byte array per block
//! (the symbol's address is 0); global memory is the bindings, each at its own base,
//! and every access is checked against its binding (an access outside every binding
//! fails the simulation: an out-of-range read or write). Shared accesses are checked
//! for range and for their natural alignment (16 bytes for `.v4`).
//!
//! Float arithmetic follows PTX: `.rn` operations round once (Rust's f32 operations),
//! `fma.rn.f32` is fused (`f32::mul_add`). Unknown instructions fail the simulation
//! with their text, so a kernel outside the subset is never half-simulated.
#![allow(dead_code)]

use std::collections::HashMap;

#[derive(Debug, Clone)]
enum Opnd {
    Reg(usize),
    Imm(u64),
    /// `[reg+off]`
    Addr(usize, i64),
    Vec(Vec<usize>),
    Label(String),
    Param(usize),
    Special(&'static str),
    /// A `.shared` symbol (address 0 of the shared window).
    Shared,
}

#[derive(Debug, Clone)]
struct Inst {
    guard: Option<(usize, bool)>,
    op: String,
    args: Vec<Opnd>,
    text: String,
}

/// A parsed entry.
pub struct Entry {
    insts: Vec<Inst>,
    labels: HashMap<String, usize>,
    nregs: usize,
    shared: usize,
    /// Blocks per cluster (`.reqnctapercluster`; 1 without).
    cluster: u32,
}

fn parse_imm(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0f") {
        return u32::from_str_radix(h, 16).ok().map(u64::from);
    }
    if let Some(h) = s.strip_prefix("0d") {
        return u64::from_str_radix(h, 16).ok();
    }
    if let Some(h) = s.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok();
    }
    s.parse::<i64>().ok().map(|x| x as u64)
}

/// Parses entry `name` of `ptx`.
pub fn parse(ptx: &str, name: &str) -> Entry {
    let start = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("no entry {name}"));
    let body = &ptx[start..];
    let body = &body[body.find('{').expect("body")..];
    let end = body.find("\n}").expect("end of entry");
    let body = &body[1..end];
    let mut regs: HashMap<String, usize> = HashMap::new();
    let mut params: Vec<String> = Vec::new();
    let head = &ptx[start..start + ptx[start..].find(')').expect("params")];
    let directives = &ptx[start + head.len()..start + ptx[start..].find('{').expect("body")];
    let cluster = directives
        .split(".reqnctapercluster")
        .nth(1)
        .and_then(|d| d.split(',').next())
        .map_or(1, |n| n.trim().parse().expect("cluster size"));
    for l in head.lines() {
        if let Some(p) = l.trim().strip_prefix(".param .u64 ") {
            params.push(p.trim_end_matches(',').to_string());
        }
    }
    let reg = |s: &str, regs: &mut HashMap<String, usize>| -> usize {
        let n = regs.len();
        *regs.entry(s.to_string()).or_insert(n)
    };
    let mut insts = Vec::new();
    let mut labels = HashMap::new();
    let mut shared = 0;
    let mut shared_name = String::new();
    for line in body.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with(".reg") {
            continue;
        }
        if let Some(rest) = l.strip_prefix(".shared") {
            let b = rest.rfind('[').expect("shared size");
            shared = rest[b + 1..rest.len() - 2].parse().expect("shared bytes");
            let nm = rest[..b].split_whitespace().last().expect("shared name");
            shared_name = nm.to_string();
            continue;
        }
        if let Some(lab) = l.strip_suffix(':') {
            labels.insert(lab.to_string(), insts.len());
            continue;
        }
        let l = l.strip_suffix(';').unwrap_or_else(|| panic!("no ';': {l}"));
        let (guard, rest) = if let Some(g) = l.strip_prefix('@') {
            let sp = g.find(' ').expect("guard");
            let (neg, p) = match g[..sp].strip_prefix('!') {
                Some(p) => (true, p),
                None => (false, &g[..sp]),
            };
            (Some((reg(p, &mut regs), neg)), g[sp + 1..].trim())
        } else {
            (None, l)
        };
        let (op, ops) = match rest.find(' ') {
            Some(i) => (&rest[..i], rest[i + 1..].trim()),
            None => (rest, ""),
        };
        let mut args = Vec::new();
        let mut cur = String::new();
        let mut depth = 0;
        let mut parts = Vec::new();
        for ch in ops.chars() {
            match ch {
                '{' | '[' => {
                    depth += 1;
                    cur.push(ch)
                }
                '}' | ']' => {
                    depth -= 1;
                    cur.push(ch)
                }
                ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
                _ => cur.push(ch),
            }
        }
        if !cur.trim().is_empty() {
            parts.push(cur);
        }
        for p in parts {
            let p = p.trim();
            let a = if let Some(v) = p.strip_prefix('{') {
                Opnd::Vec(v.trim_end_matches('}').split(',').map(|r| reg(r.trim(), &mut regs)).collect())
            } else if let Some(a) = p.strip_prefix('[') {
                let a = a.trim_end_matches(']');
                if let Some(i) = params.iter().position(|x| x == a) {
                    Opnd::Param(i)
                } else if let Some((r, off)) = a.split_once('+') {
                    Opnd::Addr(reg(r, &mut regs), off.parse().expect("offset"))
                } else {
                    Opnd::Addr(reg(a, &mut regs), 0)
                }
            } else if p.starts_with('%') {
                match p {
                    "%tid.x" => Opnd::Special("tid"),
                    "%ctaid.x" => Opnd::Special("ctaid"),
                    "%ntid.x" => Opnd::Special("ntid"),
                    "%nctaid.x" => Opnd::Special("nctaid"),
                    "%cluster_ctarank" => Opnd::Special("rank"),
                    _ => Opnd::Reg(reg(p, &mut regs)),
                }
            } else if p == shared_name {
                Opnd::Shared
            } else if p.starts_with('L') && op.starts_with("bra") {
                Opnd::Label(p.to_string())
            } else {
                Opnd::Imm(parse_imm(p).unwrap_or_else(|| panic!("operand {p} in {l}")))
            };
            args.push(a);
        }
        insts.push(Inst { guard, op: op.to_string(), args, text: l.to_string() });
    }
    Entry { insts, labels, nregs: regs.len(), shared, cluster }
}

/// Global memory: the bindings, each at its own base address.
pub struct Global {
    /// `(base, bytes)` per binding.
    pub bufs: Vec<(u64, Vec<u8>)>,
}

impl Global {
    /// Bindings with the given contents.
    pub fn new(data: Vec<Vec<u8>>) -> Global {
        Global { bufs: data.into_iter().enumerate().map(|(i, d)| (((i as u64) + 1) << 32, d)).collect() }
    }

    fn at(&mut self, addr: u64, n: usize, what: &str) -> &mut [u8] {
        for (base, d) in &mut self.bufs {
            if addr >= *base && addr + n as u64 <= *base + d.len() as u64 {
                let o = (addr - *base) as usize;
                return &mut d[o..o + n];
            }
        }
        panic!("{what}: global access of {n} bytes at {addr:#x} outside every binding");
    }
}

struct Thread {
    regs: Vec<u64>,
    pc: usize,
    done: bool,
}

fn f(x: u64) -> f32 {
    f32::from_bits(x as u32)
}

fn fb(x: f32) -> u64 {
    u64::from(x.to_bits())
}

/// Where a thread stopped.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stop {
    /// At `bar.sync` (its block's barrier).
    Block,
    /// At `barrier.cluster.wait` (its cluster's barrier).
    Cluster,
    /// Returned.
    Exit,
}

/// Distributed shared memory addresses (`mapa`): the rank above this bit.
const RANK_SHIFT: u32 = 24;

/// Runs `grid` blocks of `block` threads of `e` over `g` (parameters: the bindings'
/// bases in order), a cluster at a time: every live thread of the cluster runs to its
/// next barrier; a block whose live threads all wait at `bar.sync` goes on, a cluster
/// whose live threads all wait at `barrier.cluster.wait` goes on; anything else (some
/// threads of a block at a barrier that others never reach) fails.
pub fn run(e: &Entry, grid: u32, block: u32, g: &mut Global) {
    let params: Vec<u64> = g.bufs.iter().map(|b| b.0).collect();
    let cs = e.cluster;
    assert_eq!(grid % cs, 0, "a grid of {grid} blocks in clusters of {cs}");
    for cluster in 0..grid / cs {
        let mut shared: Vec<Vec<u8>> = (0..cs).map(|_| vec![0xA5u8; e.shared]).collect();
        let mut threads: Vec<Vec<Thread>> = (0..cs)
            .map(|_| (0..block).map(|_| Thread { regs: vec![0; e.nregs], pc: 0, done: false }).collect())
            .collect();
        let mut stop: Vec<Vec<Option<Stop>>> = vec![vec![None; block as usize]; cs as usize];
        loop {
            for r in 0..cs as usize {
                for tid in 0..block as usize {
                    if stop[r][tid].is_none() {
                        let cx = Cx { tid: tid as u32, ctaid: cluster * cs + r as u32, rank: r as u32, block, grid };
                        let st = step_to_barrier(e, &mut threads[r][tid], &cx, &params, &mut shared, g);
                        stop[r][tid] = Some(st);
                    }
                }
            }
            let live = |s: &Option<Stop>| *s != Some(Stop::Exit);
            if stop.iter().flatten().all(|s| !live(s)) {
                break;
            }
            if stop.iter().flatten().filter(|s| live(s)).all(|s| *s == Some(Stop::Cluster)) {
                for s in stop.iter_mut().flatten().filter(|s| live(s)) {
                    *s = None;
                }
                continue;
            }
            let mut moved = false;
            for (r, b) in stop.iter_mut().enumerate() {
                let at: Vec<Stop> = b.iter().flatten().copied().filter(|&s| s != Stop::Exit).collect();
                if !at.is_empty() && at.iter().all(|&s| s == Stop::Block) {
                    assert_eq!(
                        at.len(),
                        block as usize,
                        "cluster {cluster} block {r}: bar.sync after some threads returned"
                    );
                    for s in b.iter_mut() {
                        *s = None;
                    }
                    moved = true;
                }
            }
            assert!(moved, "cluster {cluster}: threads wait at different barriers: {stop:?}");
        }
    }
}

/// A thread's coordinates.
struct Cx {
    tid: u32,
    ctaid: u32,
    rank: u32,
    block: u32,
    grid: u32,
}

fn step_to_barrier(
    e: &Entry,
    t: &mut Thread,
    cx: &Cx,
    params: &[u64],
    shareds: &mut [Vec<u8>],
    g: &mut Global,
) -> Stop {
    let (tid, ctaid, block, grid) = (cx.tid, cx.ctaid, cx.block, cx.grid);
    loop {
        let shared = &mut shareds[cx.rank as usize];
        let Some(i) = e.insts.get(t.pc) else {
            t.done = true;
            return Stop::Exit;
        };
        t.pc += 1;
        if let Some((p, neg)) = i.guard {
            if (t.regs[p] != 0) == neg {
                continue;
            }
        }
        let r = |o: &Opnd, t: &Thread| -> u64 {
            match o {
                Opnd::Reg(x) => t.regs[*x],
                Opnd::Imm(v) => *v,
                Opnd::Special("tid") => u64::from(tid),
                Opnd::Special("ctaid") => u64::from(ctaid),
                Opnd::Special("ntid") => u64::from(block),
                Opnd::Special("nctaid") => u64::from(grid),
                Opnd::Special("rank") => u64::from(cx.rank),
                Opnd::Shared => 0,
                other => panic!("operand {other:?} in {}", i.text),
            }
        };
        let dst = |o: &Opnd| match o {
            Opnd::Reg(x) => *x,
            other => panic!("destination {other:?} in {}", i.text),
        };
        let a = &i.args;
        let op = i.op.as_str();
        let u32s = |t: &Thread, k: usize| r(&a[k], t) as u32;
        match op {
            "ret" => {
                t.done = true;
                return Stop::Exit;
            }
            "bar.sync" => return Stop::Block,
            "barrier.cluster.arrive" => {}
            "barrier.cluster.wait" => return Stop::Cluster,
            "mapa.shared::cluster.u32" => {
                let (x, rank) = (r(&a[1], t), r(&a[2], t));
                assert!(x < 1 << RANK_SHIFT && rank < u64::from(e.cluster), "{}", i.text);
                t.regs[dst(&a[0])] = x | rank << RANK_SHIFT;
            }
            "ld.shared::cluster.v4.f32" => {
                let Opnd::Addr(base, off) = a[1] else { panic!("{}", i.text) };
                let Opnd::Vec(ds) = &a[0] else { panic!("{}", i.text) };
                let full = (t.regs[base] as i64 + off) as u64;
                let (rank, addr) = ((full >> RANK_SHIFT) as usize, (full & ((1 << RANK_SHIFT) - 1)) as usize);
                let sh = &shareds[rank];
                assert!(addr.is_multiple_of(16) && addr + 16 <= sh.len(), "{}: cluster load at {addr}", i.text);
                for (j, &d) in ds.iter().enumerate() {
                    let o = addr + 4 * j;
                    t.regs[d] = u64::from(u32::from_le_bytes([sh[o], sh[o + 1], sh[o + 2], sh[o + 3]]));
                }
            }
            "bra" | "bra.uni" => {
                let Opnd::Label(l) = &a[0] else { panic!("{}", i.text) };
                t.pc = e.labels[l];
            }
            "ld.param.u64" => {
                let Opnd::Param(p) = a[1] else { panic!("{}", i.text) };
                t.regs[dst(&a[0])] = params[p];
            }
            "cvta.to.global.u64" | "mov.u32" | "mov.u64" | "mov.s64" | "mov.b32" | "mov.f32" | "mov.b64" => {
                let v = r(&a[1], t);
                t.regs[dst(&a[0])] = if op.ends_with("32") { v & 0xFFFF_FFFF } else { v };
            }
            "and.b32" | "shr.u32" | "shl.b32" | "add.u32" | "mul.lo.u32" | "rem.u32" | "div.u32" | "sub.u32"
            | "min.u32" | "max.u32" => {
                let (x, y) = (u32s(t, 1), u32s(t, 2));
                let v = match op {
                    "and.b32" => x & y,
                    "shr.u32" => x.checked_shr(y).unwrap_or(0),
                    "shl.b32" => x.checked_shl(y).unwrap_or(0),
                    "add.u32" => x.wrapping_add(y),
                    "sub.u32" => x.wrapping_sub(y),
                    "mul.lo.u32" => x.wrapping_mul(y),
                    "rem.u32" => x % y,
                    "min.u32" => x.min(y),
                    "max.u32" => x.max(y),
                    _ => x / y,
                };
                t.regs[dst(&a[0])] = u64::from(v);
            }
            "mad.lo.u32" => {
                let v = u32s(t, 1).wrapping_mul(u32s(t, 2)).wrapping_add(u32s(t, 3));
                t.regs[dst(&a[0])] = u64::from(v);
            }
            "setp.lt.u32" | "setp.ge.u32" | "setp.le.u32" | "setp.gt.u32" => {
                let (x, y) = (u32s(t, 1), u32s(t, 2));
                let v = match op {
                    "setp.lt.u32" => x < y,
                    "setp.ge.u32" => x >= y,
                    "setp.le.u32" => x <= y,
                    _ => x > y,
                };
                t.regs[dst(&a[0])] = u64::from(v);
            }
            "setp.lt.f32" | "setp.gt.f32" | "setp.le.f32" | "setp.ge.f32" | "setp.ne.f32" | "setp.eq.f32"
            | "setp.nan.f32" => {
                let (x, y) = (f(r(&a[1], t)), f(r(&a[2], t)));
                let v = match op {
                    "setp.lt.f32" => x < y,
                    "setp.gt.f32" => x > y,
                    "setp.le.f32" => x <= y,
                    "setp.ge.f32" => x >= y,
                    "setp.ne.f32" => x != y && !x.is_nan() && !y.is_nan(),
                    "setp.eq.f32" => x == y,
                    _ => x.is_nan() || y.is_nan(),
                };
                t.regs[dst(&a[0])] = u64::from(v);
            }
            "and.pred" | "or.pred" => {
                let (x, y) = (r(&a[1], t) != 0, r(&a[2], t) != 0);
                t.regs[dst(&a[0])] = u64::from(if op == "and.pred" { x && y } else { x || y });
            }
            "not.pred" => t.regs[dst(&a[0])] = u64::from(r(&a[1], t) == 0),
            "mul.wide.s32" => {
                let v = i64::from(r(&a[1], t) as u32 as i32).wrapping_mul(r(&a[2], t) as i64);
                t.regs[dst(&a[0])] = v as u64;
            }
            "add.s64" => t.regs[dst(&a[0])] = r(&a[1], t).wrapping_add(r(&a[2], t)),
            "mul.lo.s64" => t.regs[dst(&a[0])] = r(&a[1], t).wrapping_mul(r(&a[2], t)),
            "mad.lo.s64" => t.regs[dst(&a[0])] = r(&a[1], t).wrapping_mul(r(&a[2], t)).wrapping_add(r(&a[3], t)),
            "cvt.u64.u32" => t.regs[dst(&a[0])] = r(&a[1], t) & 0xFFFF_FFFF,
            "cvt.rn.f32.s32" => t.regs[dst(&a[0])] = fb(r(&a[1], t) as u32 as i32 as f32),
            "ld.global.f32" | "ld.global.s8" | "ld.global.u8" | "ld.global.s16" | "ld.global.b32" => {
                let Opnd::Addr(base, off) = a[1] else { panic!("{}", i.text) };
                let addr = t.regs[base].wrapping_add(off as u64);
                let n = match op {
                    "ld.global.s8" | "ld.global.u8" => 1,
                    "ld.global.s16" => 2,
                    _ => 4,
                };
                let b = g.at(addr, n, &i.text);
                let v = match op {
                    "ld.global.s8" => b[0] as i8 as i32 as u32,
                    "ld.global.u8" => u32::from(b[0]),
                    "ld.global.s16" => i16::from_le_bytes([b[0], b[1]]) as i32 as u32,
                    _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                };
                t.regs[dst(&a[0])] = u64::from(v);
            }
            "st.global.f32" | "st.global.b32" => {
                let Opnd::Addr(base, off) = a[0] else { panic!("{}", i.text) };
                let addr = t.regs[base].wrapping_add(off as u64);
                let v = r(&a[1], t) as u32;
                g.at(addr, 4, &i.text).copy_from_slice(&v.to_le_bytes());
            }
            "st.global.v4.f32" => {
                let Opnd::Addr(base, off) = a[0] else { panic!("{}", i.text) };
                let Opnd::Vec(vs) = &a[1] else { panic!("{}", i.text) };
                let addr = t.regs[base].wrapping_add(off as u64);
                assert!(addr.is_multiple_of(16), "{}: unaligned vector store at {addr:#x}", i.text);
                let b = g.at(addr, 16, &i.text);
                for (j, &v) in vs.iter().enumerate() {
                    b[4 * j..4 * j + 4].copy_from_slice(&(t.regs[v] as u32).to_le_bytes());
                }
            }
            "st.shared.v4.f32" => {
                let Opnd::Addr(base, off) = a[0] else { panic!("{}", i.text) };
                let Opnd::Vec(vs) = &a[1] else { panic!("{}", i.text) };
                let addr = (t.regs[base] as i64 + off) as usize;
                assert!(addr.is_multiple_of(16) && addr + 16 <= shared.len(), "{}: shared store at {addr}", i.text);
                for (j, &v) in vs.iter().enumerate() {
                    shared[addr + 4 * j..addr + 4 * j + 4].copy_from_slice(&(t.regs[v] as u32).to_le_bytes());
                }
            }
            "st.shared.f32" => {
                let Opnd::Addr(base, off) = a[0] else { panic!("{}", i.text) };
                let addr = (t.regs[base] as i64 + off) as usize;
                assert!(addr.is_multiple_of(4) && addr + 4 <= shared.len(), "{}: shared store at {addr}", i.text);
                shared[addr..addr + 4].copy_from_slice(&(r(&a[1], t) as u32).to_le_bytes());
            }
            "ld.shared.v4.f32" => {
                let Opnd::Addr(base, off) = a[1] else { panic!("{}", i.text) };
                let Opnd::Vec(ds) = &a[0] else { panic!("{}", i.text) };
                let addr = (t.regs[base] as i64 + off) as usize;
                assert!(addr.is_multiple_of(16) && addr + 16 <= shared.len(), "{}: shared load at {addr}", i.text);
                for (j, &d) in ds.iter().enumerate() {
                    let o = addr + 4 * j;
                    t.regs[d] = u64::from(u32::from_le_bytes([shared[o], shared[o + 1], shared[o + 2], shared[o + 3]]));
                }
            }
            "fma.rn.f32" => {
                let v = f(r(&a[1], t)).mul_add(f(r(&a[2], t)), f(r(&a[3], t)));
                t.regs[dst(&a[0])] = fb(v);
            }
            "add.rn.f32" | "sub.rn.f32" | "mul.rn.f32" | "div.rn.f32" | "max.f32" | "min.f32" | "max.NaN.f32"
            | "min.NaN.f32" => {
                let (x, y) = (f(r(&a[1], t)), f(r(&a[2], t)));
                let v = match op {
                    "add.rn.f32" => x + y,
                    "sub.rn.f32" => x - y,
                    "mul.rn.f32" => x * y,
                    "div.rn.f32" => x / y,
                    "max.f32" => x.max(y),
                    "min.f32" => x.min(y),
                    _ if x.is_nan() || y.is_nan() => f32::NAN,
                    "max.NaN.f32" => x.max(y),
                    _ => x.min(y),
                };
                t.regs[dst(&a[0])] = fb(v);
            }
            "abs.f32" | "neg.f32" | "ex2.approx.f32" | "lg2.approx.f32" => {
                // The approximations as their exact values (the test's tolerance covers
                // the hardware's few ulp).
                let x = f(r(&a[1], t));
                let v = match op {
                    "abs.f32" => x.abs(),
                    "neg.f32" => -x,
                    "ex2.approx.f32" => x.exp2(),
                    _ => x.log2(),
                };
                t.regs[dst(&a[0])] = fb(v);
            }
            "copysign.f32" => {
                // copysign.f32 d, a, b: |b| with a's sign.
                let (x, y) = (f(r(&a[1], t)), f(r(&a[2], t)));
                t.regs[dst(&a[0])] = fb(y.copysign(x));
            }
            "cvt.rni.s32.f32" => {
                let x = f(r(&a[1], t));
                let v = if x.is_nan() { 0 } else { x.round_ties_even().clamp(i32::MIN as f32, i32::MAX as f32) as i32 };
                t.regs[dst(&a[0])] = u64::from(v as u32);
            }
            "add.s32" | "sub.s32" | "max.s32" | "min.s32" | "shr.s32" => {
                let (x, y) = (r(&a[1], t) as u32 as i32, r(&a[2], t) as u32 as i32);
                let v = match op {
                    "add.s32" => x.wrapping_add(y),
                    "sub.s32" => x.wrapping_sub(y),
                    "max.s32" => x.max(y),
                    "min.s32" => x.min(y),
                    _ => x >> (y.clamp(0, 31)),
                };
                t.regs[dst(&a[0])] = u64::from(v as u32);
            }
            "selp.f32" | "selp.b32" | "selp.u32" => {
                let v = if r(&a[3], t) != 0 { r(&a[1], t) } else { r(&a[2], t) };
                t.regs[dst(&a[0])] = v & 0xFFFF_FFFF;
            }
            _ => panic!("the simulator has no `{}` ({})", op, i.text),
        }
    }
}
