//! Vector instructions of either width, for the machine-code kernels that run the same
//! algorithm eight lanes at a time (AVX2, `ymm`) or sixteen (AVX-512 F, `zmm`): row
//! kernels ([`super::rows`]) and the inline transcendentals ([`super::math`]).
//!
//! A register is a number ([`V`]); [`Vx`] writes each operation in the width it was made
//! for. The two widths differ in three places, all hidden here:
//! - **constants**: a `ymm` operand reads eight copies from the kernel's vector table; a
//!   `zmm` operand broadcasts one copy (`{1to16}`); and a kernel may hold constants in
//!   registers for its whole run ([`Vx::held`]), which is what most of the time saving
//!   of the wide form comes from (a polynomial's coefficients are otherwise a load each);
//! - **lane masks** ([`Mask`]): a `ymm` register of all-ones lanes used by `vmaskmovps`
//!   and `vblendvps`, or an opmask register `k1`–`k7` used by masked moves and
//!   `vblendmps`;
//! - **bitwise operations**: `vandps`/`vorps`/`vxorps` on `ymm`, `vpandd`/`vpord`/
//!   `vpxord` on `zmm` (AVX-512 F alone; the `ps` forms need DQ).

use std::collections::HashMap;

use iced_x86::code_asm::*;
use kiln_flow::ExprId;

use super::asm::{under_mask, Tables, YMM, ZMM};
use super::gemm::R;

/// A vector register by number (0–15 for `ymm`, 0–31 for `zmm`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub(crate) struct V(pub u8);

/// A register for the result of a node whose operands are `ops`, in an evaluation of
/// expression nodes into registers that counts each node's remaining `uses` and keeps
/// the free registers in `pool`: an operand's own register where this is its last use
/// and `release(operand)` gives it up, else a free one (`None`: none is left). Every
/// operand's use is counted off; other registers released at once go back to the pool.
/// The register allocation of the contraction epilogues and of the row kernels.
pub(crate) fn result_reg(
    ops: &[ExprId],
    uses: &mut HashMap<u32, u32>,
    pool: &mut Vec<V>,
    mut release: impl FnMut(u32) -> Option<V>,
) -> Option<V> {
    let mut dst = None;
    for &o in ops {
        let left = uses.get_mut(&o.0).map(|u| {
            *u = u.saturating_sub(1);
            *u
        });
        if left == Some(0) {
            if let Some(r) = release(o.0) {
                if dst.is_none() {
                    dst = Some(r);
                } else if dst != Some(r) {
                    pool.push(r);
                }
            }
        }
    }
    dst.or_else(|| pool.pop())
}

/// A lane mask: a vector register (`ymm`) or an opmask register (`zmm`), by number.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Mask(pub u8);

/// A second operand: a register, a constant (f32 or i32 bits, the same in every lane),
/// or `len` lanes of memory.
#[derive(Clone, Copy)]
pub(crate) enum Src {
    R(V),
    C(u32),
    M(AsmMemoryOperand),
}

/// Two-operand arithmetic, `d = x op y`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    And,
    Or,
    Xor,
    /// 32-bit integer add.
    AddI,
    /// 32-bit integer subtract.
    SubI,
    /// 32-bit signed integer maximum.
    MaxI,
    /// `d = d·x + y` (`vfmadd213ps`).
    Fma213,
    /// `d = x·y + d` (`vfmadd231ps`).
    Fma231,
    /// `d = x·2^⌊y⌋` (`vscalefps`, AVX-512 only).
    Scalef,
}

/// Writes vector instructions of one width.
pub(crate) struct Vx<'a> {
    pub a: &'a mut CodeAssembler,
    pub t: &'a mut Tables,
    /// 16 lanes (`zmm`, AVX-512 F) rather than 8.
    pub wide: bool,
    /// Constants held in registers for the whole kernel: (bits, register).
    pub held: &'a [(u32, V)],
}

/// `$vx.a.$ins` with the vector registers `$v…` in the width `$vx` emits (`zmm` when
/// wide, else `ymm`), then the other operands `$rest…`: an instruction both widths have
/// in the same form.
macro_rules! either_width {
    ($vx:ident . $ins:ident ( $($v:expr),+ ; $($rest:expr),* )) => {
        if $vx.wide {
            $vx.a.$ins($(z($v)),+ $(, $rest)*)?;
        } else {
            $vx.a.$ins($(y($v)),+ $(, $rest)*)?;
        }
    };
}

pub(crate) fn y(v: V) -> AsmRegisterYmm {
    YMM[v.0 as usize]
}

pub(crate) fn z(v: V) -> AsmRegisterZmm {
    ZMM[v.0 as usize]
}

pub(crate) fn k(m: Mask) -> AsmRegisterK {
    [k0, k1, k2, k3, k4, k5, k6, k7][m.0 as usize]
}

/// `zmm{k}`: register `v` written under opmask `m` (1–7).
pub(crate) fn zk(v: V, m: Mask) -> AsmRegisterZmm {
    under_mask!(z(v), m.0)
}

/// An operand resolved for one width.
enum Operand {
    R(V),
    M(AsmMemoryOperand),
}

impl Vx<'_> {
    /// Lanes per vector.
    pub fn lanes(&self) -> u64 {
        if self.wide {
            16
        } else {
            8
        }
    }

    /// Bytes per vector.
    pub fn bytes(&self) -> i32 {
        4 * self.lanes() as i32
    }

    /// The register holding constant `bits`, if the kernel holds it.
    pub fn held(&self, bits: u32) -> Option<V> {
        self.held.iter().find(|h| h.0 == bits).map(|h| h.1)
    }

    fn operand(&mut self, s: Src) -> Operand {
        match s {
            Src::R(v) => Operand::R(v),
            Src::M(m) => Operand::M(m),
            Src::C(bits) => match self.held(bits) {
                Some(v) => Operand::R(v),
                None if self.wide => Operand::M(dword_bcst(self.t.scalar(self.a, bits))),
                None => Operand::M(ymmword_ptr(self.t.vector(self.a, bits))),
            },
        }
    }

    /// `d = s` (a register copy, a load, or a constant's lanes).
    pub fn mov(&mut self, d: V, s: Src) -> R<()> {
        match (s, self.wide) {
            (Src::C(bits), true) if self.held(bits).is_none() => {
                let l = self.t.scalar(self.a, bits);
                self.a.vbroadcastss(z(d), dword_ptr(l))?;
                return Ok(());
            }
            _ => {}
        }
        match (self.operand(s), self.wide) {
            (Operand::R(x), _) if x == d => {}
            (Operand::R(x), true) => self.a.vmovaps(z(d), z(x))?,
            (Operand::R(x), false) => self.a.vmovaps(y(d), y(x))?,
            (Operand::M(m), true) => self.a.vmovups(z(d), m)?,
            (Operand::M(m), false) => self.a.vmovups(y(d), m)?,
        }
        Ok(())
    }

    /// `d = x op s`.
    pub fn op(&mut self, op: Op, d: V, x: V, s: Src) -> R<()> {
        let o = self.operand(s);
        macro_rules! emit {
            ($($op:ident => $ins_y:ident / $ins_z:ident),* $(,)?) => {
                match (op, o, self.wide) {
                    $(
                        (Op::$op, Operand::R(r), false) => self.a.$ins_y(y(d), y(x), y(r))?,
                        (Op::$op, Operand::M(m), false) => self.a.$ins_y(y(d), y(x), m)?,
                        (Op::$op, Operand::R(r), true) => self.a.$ins_z(z(d), z(x), z(r))?,
                        (Op::$op, Operand::M(m), true) => self.a.$ins_z(z(d), z(x), m)?,
                    )*
                    (Op::Scalef, Operand::R(r), true) => self.a.vscalefps(z(d), z(x), z(r))?,
                    (Op::Scalef, Operand::M(m), true) => self.a.vscalefps(z(d), z(x), m)?,
                    (Op::Scalef, _, false) => return Err(super::gemm::NotHere("vscalefps without AVX-512".into())),
                }
            };
        }
        emit! {
            Add => vaddps / vaddps,
            Sub => vsubps / vsubps,
            Mul => vmulps / vmulps,
            Div => vdivps / vdivps,
            Max => vmaxps / vmaxps,
            Min => vminps / vminps,
            And => vandps / vpandd,
            Or => vorps / vpord,
            Xor => vxorps / vpxord,
            AddI => vpaddd / vpaddd,
            SubI => vpsubd / vpsubd,
            MaxI => vpmaxsd / vpmaxsd,
            Fma213 => vfmadd213ps / vfmadd213ps,
            Fma231 => vfmadd231ps / vfmadd231ps,
        }
        Ok(())
    }

    /// `d = x >> n` (arithmetic, 32-bit lanes).
    pub fn sra(&mut self, d: V, x: V, n: i32) -> R<()> {
        either_width!(self.vpsrad(d, x; n));
        Ok(())
    }

    /// `d = x << n` (32-bit lanes).
    pub fn sll(&mut self, d: V, x: V, n: i32) -> R<()> {
        either_width!(self.vpslld(d, x; n));
        Ok(())
    }

    /// `d = √x`.
    pub fn sqrt(&mut self, d: V, x: V) -> R<()> {
        either_width!(self.vsqrtps(d, x;));
        Ok(())
    }

    /// `m = x pred s` (a `vcmpps` predicate: 3 UNORD_Q, 0x11 LT_OQ, …).
    pub fn cmp(&mut self, m: Mask, x: V, s: Src, pred: i32) -> R<()> {
        match (self.operand(s), self.wide) {
            (Operand::R(r), false) => self.a.vcmpps(y(V(m.0)), y(x), y(r), pred)?,
            (Operand::M(mem), false) => self.a.vcmpps(y(V(m.0)), y(x), mem, pred)?,
            (Operand::R(r), true) => self.a.vcmpps(k(m), z(x), z(r), pred)?,
            (Operand::M(mem), true) => self.a.vcmpps(k(m), z(x), mem, pred)?,
        }
        Ok(())
    }

    /// `d = m ? t : f`, lane by lane.
    pub fn blend(&mut self, d: V, m: Mask, f: V, t: V) -> R<()> {
        if self.wide {
            self.a.vblendmps(zk(d, m), z(f), z(t))?;
        } else {
            self.a.vblendvps(y(d), y(f), y(t), y(V(m.0)))?;
        }
        Ok(())
    }

    /// `d = m ? d : 0`, lane by lane.
    pub fn zero_unmasked(&mut self, d: V, m: Mask) -> R<()> {
        if self.wide {
            self.a.vmovaps(zk(d, m).z(), z(d))?;
        } else {
            self.a.vandps(y(d), y(d), y(V(m.0)))?;
        }
        Ok(())
    }

    /// Sets `m` to the first `n` lanes (1 to `lanes() − 1`); `scratch` may be clobbered
    /// (the opmask form goes through it).
    pub fn first_lanes(&mut self, m: Mask, n: u64, scratch: AsmRegister32) -> R<()> {
        if self.wide {
            self.a.mov(scratch, ((1u32 << n) - 1) as i32)?;
            self.a.kmovw(k(m), scratch)?;
        } else {
            let l = self.t.lanes(self.a, n);
            self.a.vmovups(y(V(m.0)), ymmword_ptr(l))?;
        }
        Ok(())
    }

    /// `d = mem` (lanes outside `mask` read nothing and are 0).
    pub fn load(&mut self, d: V, mem: AsmMemoryOperand, mask: Option<Mask>) -> R<()> {
        match (mask, self.wide) {
            (None, false) => self.a.vmovups(y(d), mem)?,
            (None, true) => self.a.vmovups(z(d), mem)?,
            (Some(m), false) => self.a.vmaskmovps(y(d), y(V(m.0)), mem)?,
            (Some(m), true) => self.a.vmovups(zk(d, m).z(), mem)?,
        }
        Ok(())
    }

    /// `mem = x` (lanes outside `mask` are not written).
    pub fn store(&mut self, mem: AsmMemoryOperand, x: V, mask: Option<Mask>) -> R<()> {
        match (mask, self.wide) {
            (None, false) => self.a.vmovups(mem, y(x))?,
            (None, true) => self.a.vmovups(mem, z(x))?,
            (Some(m), false) => self.a.vmaskmovps(mem, y(V(m.0)), y(x))?,
            (Some(m), true) => self.a.vmovups(mem.k1_mask(m.0), z(x))?,
        }
        Ok(())
    }

    /// `d` = the f32 at `mem` in every lane.
    pub fn broadcast(&mut self, d: V, mem: AsmMemoryOperand) -> R<()> {
        either_width!(self.vbroadcastss(d; mem));
        Ok(())
    }

    /// `d` = `x` with its lanes permuted so that a fold with `x` combines lanes
    /// `step` apart: `step` is half the vector first, then a quarter, down to 1.
    pub fn swap_lanes(&mut self, d: V, x: V, step: u64) -> R<()> {
        match (step, self.wide) {
            (8, true) => self.a.vshuff32x4(z(d), z(x), z(x), 0x4E)?,
            (4, true) => self.a.vshuff32x4(z(d), z(x), z(x), 0xB1)?,
            (2, true) => self.a.vpermilps(z(d), z(x), 0x4E)?,
            (1, true) => self.a.vpermilps(z(d), z(x), 0xB1)?,
            (4, false) => self.a.vperm2f128(y(d), y(x), y(x), 0x01)?,
            (2, false) => self.a.vpermilps(y(d), y(x), 0x4E)?,
            (1, false) => self.a.vpermilps(y(d), y(x), 0xB1)?,
            _ => return Err(super::gemm::NotHere(format!("a lane swap of {step}"))),
        }
        Ok(())
    }
}

/// The opmask form of a masked store: `mem {k}`.
trait MaskedMem {
    fn k1_mask(self, k: u8) -> AsmMemoryOperand;
}

impl MaskedMem for AsmMemoryOperand {
    fn k1_mask(self, n: u8) -> AsmMemoryOperand {
        match n {
            1 => self.k1(),
            2 => self.k2(),
            3 => self.k3(),
            4 => self.k4(),
            5 => self.k5(),
            6 => self.k6(),
            _ => self.k7(),
        }
    }
}
