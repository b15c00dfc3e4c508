//! A small PTX emulator for tests: runs one entry of a module kiln wrote, thread by
//! thread, over f32 bindings on the host, so an emitter's index arithmetic,
//! predication and grid-stride loop can be checked against the kernel interpreter
//! without a GPU.
//!
//! It covers the instructions the window emitter and the element expressions of its
//! tests write (integer address arithmetic, predicates, branches, f32 arithmetic with
//! IEEE round-to-nearest, `max`/`min` with PTX's NaN rules, `selp`, scalar f32 global
//! loads and stores) and fails with the opcode on anything else. Every global access
//! must lie inside a binding (one 4-byte element of it, aligned): an access outside
//! is an error, so a test also proves that predicated-off loads are never made. It
//! does not model scheduling, caches, or approximate instructions (`ex2.approx` and
//! the like are refused): it checks what the code computes, not how fast, and a GPU
//! run remains the final word (docs/cuda.md).
#![allow(dead_code)]

use std::collections::HashMap;

use kiln_flow::{interp, Kernel};
use kiln_ir::{Shape, Tensor};

/// One operand, parsed.
#[derive(Debug, Clone)]
enum Op {
    Reg(usize),
    Imm(u64),
    Mem(usize, i64),
    Param(usize),
    Special(&'static str),
    Label(String),
}

#[derive(Debug, Clone)]
struct Inst {
    guard: Option<(usize, bool)>,
    opcode: String,
    /// The opcode's first, second and last dot-separated parts (`setp`, `lt`, `u64`).
    parts: [String; 3],
    ops: Vec<Op>,
}

/// An entry ready to run.
pub struct Entry {
    insts: Vec<Inst>,
    labels: HashMap<String, usize>,
    regs: usize,
    params: usize,
}

/// The bindings of a launch: f32 buffers (inputs, then the output).
pub struct Memory {
    pub buffers: Vec<Vec<u32>>,
}

/// Base address of binding `i` (far apart, so an access past one binding cannot land
/// in another).
fn base(i: usize) -> u64 {
    (i as u64 + 1) << 36
}

/// Parses entry `name` of `module`.
pub fn parse(module: &str, name: &str) -> Result<Entry, String> {
    let head = format!(".visible .entry {name}(");
    let start = module.find(&head).ok_or_else(|| format!("no entry {name}"))?;
    let text = &module[start..];
    let end = text.find("\n}\n").ok_or("entry without an end")?;
    let text = &text[..end];
    let mut params = Vec::new();
    let mut regs: HashMap<String, usize> = HashMap::new();
    let mut insts = Vec::new();
    let mut labels = HashMap::new();
    for line in text.lines().skip(1) {
        let l = line.trim();
        if let Some(p) = l.strip_prefix(".param .u64 ") {
            params.push(p.trim_end_matches(',').to_string());
            continue;
        }
        if l.is_empty() || l.starts_with(".reg") || l == "{" || l == ")" {
            continue;
        }
        if let Some(label) = l.strip_suffix(':') {
            labels.insert(label.to_string(), insts.len());
            continue;
        }
        let l = l.strip_suffix(';').ok_or_else(|| format!("no `;`: {l}"))?;
        let mut reg = |name: &str| {
            let n = regs.len();
            *regs.entry(name.to_string()).or_insert(n)
        };
        let (guard, rest) = match l.strip_prefix('@') {
            Some(g) => {
                let (p, rest) = g.split_once(' ').ok_or("guard without instruction")?;
                let (neg, p) = match p.strip_prefix('!') {
                    Some(p) => (true, p),
                    None => (false, p),
                };
                (Some((reg(p), neg)), rest)
            }
            None => (None, l),
        };
        let (opcode, operands) = rest.split_once(' ').unwrap_or((rest, ""));
        let mut ops = Vec::new();
        for o in split_operands(operands) {
            let o = o.trim();
            ops.push(if let Some(m) = o.strip_prefix('[').and_then(|m| m.strip_suffix(']')) {
                if let Some(i) = params.iter().position(|p| p == m) {
                    Op::Param(i)
                } else {
                    let (r, off) = match m.split_once('+') {
                        Some((r, off)) => (r, off.parse::<i64>().map_err(|e| format!("{o}: {e}"))?),
                        None => (m, 0),
                    };
                    Op::Mem(reg(r), off)
                }
            } else if let Some(s) = ["%tid.x", "%ntid.x", "%ctaid.x", "%nctaid.x"].iter().find(|s| **s == o) {
                Op::Special(s)
            } else if o.starts_with('%') {
                Op::Reg(reg(o))
            } else if o.starts_with('L') {
                Op::Label(o.to_string())
            } else {
                Op::Imm(imm(o)?)
            });
        }
        let p: Vec<&str> = opcode.split('.').collect();
        let parts = [p[0].to_string(), p.get(1).unwrap_or(&"").to_string(), p.last().unwrap_or(&"").to_string()];
        insts.push(Inst { guard, opcode: opcode.to_string(), parts, ops });
    }
    Ok(Entry { insts, labels, regs: regs.len(), params: params.len() })
}

fn split_operands(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    s.split(", ").collect()
}

fn imm(o: &str) -> Result<u64, String> {
    let bad = |e: std::num::ParseIntError| format!("immediate {o}: {e}");
    if let Some(h) = o.strip_prefix("0f") {
        return u64::from_str_radix(h, 16).map_err(bad);
    }
    if let Some(h) = o.strip_prefix("0d") {
        return u64::from_str_radix(h, 16).map_err(bad);
    }
    if let Some(h) = o.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).map_err(bad);
    }
    o.parse::<i64>().map(|v| v as u64).map_err(bad)
}

fn f(x: u64) -> f32 {
    f32::from_bits(x as u32)
}

fn fb(x: f32) -> u64 {
    x.to_bits() as u64
}

/// PTX `max.f32`/`min.f32`: a NaN operand is ignored (both NaN: NaN); with `nan`
/// (`.NaN`), a NaN operand gives NaN.
fn minmax(a: f32, b: f32, max: bool, nan: bool) -> f32 {
    if a.is_nan() || b.is_nan() {
        if nan || (a.is_nan() && b.is_nan()) {
            return f32::NAN;
        }
        return if a.is_nan() { b } else { a };
    }
    if a == b {
        // +0 > −0.
        let pos = |x: f32| x.is_sign_positive();
        return if max == pos(a) { a } else { b };
    }
    if (a > b) == max {
        a
    } else {
        b
    }
}

fn cmp_f(c: &str, a: f32, b: f32) -> Result<bool, String> {
    let un = a.is_nan() || b.is_nan();
    Ok(match c {
        "eq" => !un && a == b,
        "ne" => !un && a != b,
        "lt" => !un && a < b,
        "le" => !un && a <= b,
        "gt" => !un && a > b,
        "ge" => !un && a >= b,
        "equ" => un || a == b,
        "neu" => un || a != b,
        "ltu" => un || a < b,
        "leu" => un || a <= b,
        "gtu" => un || a > b,
        "geu" => un || a >= b,
        "nan" => un,
        "num" => !un,
        _ => return Err(format!("setp.{c}.f32")),
    })
}

fn cmp_i<T: PartialOrd>(c: &str, a: T, b: T) -> Result<bool, String> {
    Ok(match c {
        "eq" => a == b,
        "ne" => a != b,
        "lt" | "lo" => a < b,
        "le" | "ls" => a <= b,
        "gt" | "hi" => a > b,
        "ge" | "hs" => a >= b,
        _ => return Err(format!("setp.{c}")),
    })
}

impl Entry {
    /// Runs the entry over a grid of `grid` blocks of `block` threads, thread after
    /// thread, with `mem` bound to its parameters in order. Any access outside a
    /// binding, an unknown instruction, or a thread past `budget` instructions fails.
    pub fn run(&self, mem: &mut Memory, grid: u32, block: u32, budget: u64) -> Result<(), String> {
        if mem.buffers.len() != self.params {
            return Err(format!("{} bindings for {} parameters", mem.buffers.len(), self.params));
        }
        for ctaid in 0..grid {
            for tid in 0..block {
                self.thread(mem, [tid, block, ctaid, grid], budget)?;
            }
        }
        Ok(())
    }

    fn thread(&self, mem: &mut Memory, special: [u32; 4], budget: u64) -> Result<(), String> {
        let mut r = vec![0u64; self.regs];
        let mut pc = 0usize;
        let mut steps = 0u64;
        while pc < self.insts.len() {
            steps += 1;
            if steps > budget {
                return Err(format!("thread {special:?}: past {budget} instructions"));
            }
            let i = &self.insts[pc];
            pc += 1;
            if let Some((p, neg)) = i.guard {
                if (r[p] != 0) == neg {
                    continue;
                }
            }
            let val = |o: &Op| -> Result<u64, String> {
                Ok(match o {
                    Op::Reg(x) => r[*x],
                    Op::Imm(v) => *v,
                    Op::Special(s) => u64::from(match *s {
                        "%tid.x" => special[0],
                        "%ntid.x" => special[1],
                        "%ctaid.x" => special[2],
                        _ => special[3],
                    }),
                    o => return Err(format!("operand {o:?} as a value")),
                })
            };
            let dst = |o: &Op| -> Result<usize, String> {
                match o {
                    Op::Reg(x) => Ok(*x),
                    o => Err(format!("operand {o:?} as a destination")),
                }
            };
            let (op, second, ty) = (i.parts[0].as_str(), i.parts[1].as_str(), i.parts[2].as_str());
            let a = |k: usize| i.ops.get(k).ok_or_else(|| format!("{}: operand {k}", i.opcode)).and_then(val);
            // The value written to the first operand, if any.
            let out: Option<u64> = match (op, i.opcode.as_str()) {
                ("ret", _) => return Ok(()),
                ("bra", _) => {
                    let Some(Op::Label(l)) = i.ops.first() else { return Err("bra without a label".into()) };
                    pc = *self.labels.get(l).ok_or_else(|| format!("label {l}"))?;
                    None
                }
                ("ld", "ld.param.u64") => {
                    let Some(Op::Param(p)) = i.ops.get(1) else { return Err("ld.param without a parameter".into()) };
                    Some(base(*p))
                }
                ("cvta", _) | ("mov", _) => Some(a(1)?),
                ("ld", "ld.global.f32") => {
                    let Some(Op::Mem(b, off)) = i.ops.get(1) else { return Err("ld without an address".into()) };
                    let addr = r[*b].wrapping_add(*off as u64);
                    Some(u64::from(load(mem, addr).map_err(|e| format!("thread {special:?}: {e}"))?))
                }
                ("st", "st.global.f32") => {
                    let Some(Op::Mem(b, off)) = i.ops.first() else { return Err("st without an address".into()) };
                    let addr = r[*b].wrapping_add(*off as u64);
                    let v = a(1)? as u32;
                    store(mem, addr, v).map_err(|e| format!("thread {special:?}: {e}"))?;
                    None
                }
                ("cvt", "cvt.u64.u32") => Some(a(1)? & 0xFFFF_FFFF),
                ("cvt", "cvt.u32.u64") => Some(a(1)? & 0xFFFF_FFFF),
                ("cvt", "cvt.s64.s32") => Some(a(1)? as u32 as i32 as i64 as u64),
                ("cvt", "cvt.rn.f32.s64") => Some(fb(a(1)? as i64 as f32)),
                ("cvt", "cvt.rn.f32.u64") => Some(fb(a(1)? as f32)),
                ("cvt", "cvt.rn.f32.s32") => Some(fb(a(1)? as u32 as i32 as f32)),
                ("mad", "mad.wide.u32") => {
                    let v = (a(1)? & 0xFFFF_FFFF) * (a(2)? & 0xFFFF_FFFF) + a(3)?;
                    Some(v)
                }
                ("mul", "mul.wide.u32") => Some((a(1)? & 0xFFFF_FFFF) * (a(2)? & 0xFFFF_FFFF)),
                ("mad", "mad.lo.s64") => Some(a(1)?.wrapping_mul(a(2)?).wrapping_add(a(3)?)),
                ("mul", "mul.lo.s64") => Some(a(1)?.wrapping_mul(a(2)?)),
                ("add", "add.s64") => Some(a(1)?.wrapping_add(a(2)?)),
                ("sub", "sub.s64") => Some(a(1)?.wrapping_sub(a(2)?)),
                ("add", "add.s32") | ("add", "add.u32") => Some((a(1)? as u32).wrapping_add(a(2)? as u32).into()),
                ("mad", "mad.lo.s32") | ("mad", "mad.lo.u32") => {
                    let v = (a(1)? as u32).wrapping_mul(a(2)? as u32).wrapping_add(a(3)? as u32);
                    Some(v.into())
                }
                ("rem", "rem.u64") | ("div", "div.u64") | ("rem", "rem.u32") | ("div", "div.u32") => {
                    let (x, y) = if ty == "u32" { (a(1)? & 0xFFFF_FFFF, a(2)? & 0xFFFF_FFFF) } else { (a(1)?, a(2)?) };
                    if y == 0 {
                        return Err(format!("{}: division by zero", i.opcode));
                    }
                    Some(if op == "rem" { x % y } else { x / y })
                }
                ("setp", _) => {
                    let c = second;
                    let (x, y) = (a(1)?, a(2)?);
                    let v = match ty {
                        "f32" => cmp_f(c, f(x), f(y))?,
                        "u64" => cmp_i(c, x, y)?,
                        "s64" => cmp_i(c, x as i64, y as i64)?,
                        "u32" => cmp_i(c, x as u32, y as u32)?,
                        "s32" => cmp_i(c, x as u32 as i32, y as u32 as i32)?,
                        _ => return Err(format!("the emulator has no `{}`", i.opcode)),
                    };
                    Some(v as u64)
                }
                ("and", "and.pred") => Some(a(1)? & a(2)?),
                ("or", "or.pred") => Some(a(1)? | a(2)?),
                ("xor", "xor.pred") => Some(a(1)? ^ a(2)?),
                ("not", "not.pred") => Some((a(1)? == 0) as u64),
                ("selp", _) => {
                    let v = if a(3)? != 0 { a(1)? } else { a(2)? };
                    Some(v)
                }
                (_, "add.rn.f32") => Some(fb(f(a(1)?) + f(a(2)?))),
                (_, "sub.rn.f32") => Some(fb(f(a(1)?) - f(a(2)?))),
                (_, "mul.rn.f32") => Some(fb(f(a(1)?) * f(a(2)?))),
                (_, "div.rn.f32") => Some(fb(f(a(1)?) / f(a(2)?))),
                (_, "fma.rn.f32") => Some(fb(f(a(1)?).mul_add(f(a(2)?), f(a(3)?)))),
                (_, "neg.f32") => Some(fb(-f(a(1)?))),
                (_, "abs.f32") => Some(fb(f(a(1)?).abs())),
                (_, "max.f32") | (_, "min.f32") | (_, "max.NaN.f32") | (_, "min.NaN.f32") => {
                    let v = minmax(f(a(1)?), f(a(2)?), op == "max", second == "NaN");
                    Some(fb(v))
                }
                _ => return Err(format!("the emulator has no `{}`", i.opcode)),
            };
            if let Some(v) = out {
                let d = dst(&i.ops[0])?;
                r[d] = v;
            }
        }
        Ok(())
    }
}

fn locate(mem: &Memory, addr: u64) -> Result<(usize, usize), String> {
    let b = (addr >> 36) as usize;
    let off = addr & ((1 << 36) - 1);
    if b == 0 || b > mem.buffers.len() || !off.is_multiple_of(4) {
        return Err(format!("access at {addr:#x}: no binding there (or misaligned)"));
    }
    let i = (off / 4) as usize;
    if i >= mem.buffers[b - 1].len() {
        return Err(format!("access at element {i} of binding {} ({} elements)", b - 1, mem.buffers[b - 1].len()));
    }
    Ok((b - 1, i))
}

fn load(mem: &Memory, addr: u64) -> Result<u32, String> {
    let (b, i) = locate(mem, addr)?;
    Ok(mem.buffers[b][i])
}

fn store(mem: &mut Memory, addr: u64, v: u32) -> Result<(), String> {
    let (b, i) = locate(mem, addr)?;
    mem.buffers[b][i] = v;
    Ok(())
}

/// Random f32 values in [-2, 2), with every 13th a NaN, every 29th +∞ and every 31st
/// −∞ where `specials`.
fn random(dims: &[usize], seed: u64, specials: bool) -> Tensor {
    let n: usize = dims.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match i {
                _ if specials && i % 13 == 5 => f32::NAN,
                _ if specials && i % 29 == 3 => f32::INFINITY,
                _ if specials && i % 31 == 7 => f32::NEG_INFINITY,
                _ => ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0,
            }
        })
        .collect();
    Tensor::from_vec(Shape::new(dims.to_vec()).unwrap(), v).unwrap()
}

/// Runs `k`'s entry (f32 bindings) of `module` in the emulator (a grid of 3 blocks of 32 threads) on
/// random inputs, twice (plain values, then with NaN and infinities in the image), and
/// compares every output with the kernel interpreter's, bit for bit.
pub fn check_against_interpreter(k: &Kernel, module: &str, seed: u64) -> Result<(), String> {
    let entry = parse(module, &k.name).map_err(|e| format!("{}: {e}", k.name))?;
    for specials in [false, true] {
        let ins: Vec<Tensor> = k
            .inputs
            .iter()
            .enumerate()
            .map(|(i, t)| random(t.shape.dims(), seed * 7 + i as u64, specials && i == 0))
            .collect();
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = interp::run(k, &refs).map_err(|e| e.to_string())?.to_vec::<f32>().map_err(|e| e.to_string())?;
        let mut buffers: Vec<Vec<u32>> =
            ins.iter().map(|t| t.to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()).collect();
        // The output starts as a signalling pattern, so an element never stored shows.
        buffers.push(vec![0x7FA0_DEAD; want.len()]);
        let mut mem = Memory { buffers };
        entry.run(&mut mem, 3, 32, 1 << 32).map_err(|e| format!("{}: {e}", k.name))?;
        let got = mem.buffers.pop().unwrap_or_default();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let g = f32::from_bits(g);
            if !(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan() && g.to_bits() != 0x7FA0_DEAD)) {
                return Err(format!(
                    "{} (specials {specials}): element {i} of {:?}: emulated {g} ({:#x}), interpreter {w} ({:#x})",
                    k.name,
                    k.output.shape.dims(),
                    g.to_bits(),
                    w.to_bits()
                ));
            }
        }
    }
    Ok(())
}
