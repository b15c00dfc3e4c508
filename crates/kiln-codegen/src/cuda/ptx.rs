//! A small PTX builder: typed virtual registers, labels and instructions, so that the
//! text an emitter writes is well-formed by construction.
//!
//! Every register is created by [`Ptx::reg`] with a [`RegClass`]; the builder declares
//! as many of each class as the kernel used (`.reg .f32 %f<12>;`) at the top of the
//! entry. An instruction is its opcode text and operands ([`Ptx::op`]); operands are
//! [`Reg`]s, immediates ([`Imm`]) or labels, all printed by the builder, so an emitter
//! never formats a register name or a float literal by hand. Labels come from
//! [`Ptx::label`] and are placed once with [`Ptx::place`]; [`Ptx::finish`] refuses an
//! entry with a label branched to but never placed.
//!
//! The module header is fixed: PTX ISA 8.0 for `sm_90a` (what the H200's driver
//! loads; 9.1 is refused by driver 580), 64-bit addresses.

use std::fmt::Write;

/// The PTX ISA version and target every module declares.
pub const HEADER: &str = ".version 8.0\n.target sm_90a\n.address_size 64\n";

/// The header of a module for `sm_80` ([`super::tune::Arch::Sm80`]): the same ISA, no
/// architecture-specific features.
pub const HEADER_SM80: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";

/// The kinds of virtual register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegClass {
    /// `.pred`, prefix `%p`.
    Pred,
    /// `.b16`, prefix `%h` (f16/bf16 bit patterns).
    B16,
    /// `.b32`, prefix `%r` (8-, 16- and 32-bit integers, kept normalised in 32 bits).
    B32,
    /// `.b64`, prefix `%rd` (64-bit integers and addresses).
    B64,
    /// `.f32`, prefix `%f`.
    F32,
    /// `.f64`, prefix `%fd`.
    F64,
}

impl RegClass {
    const ALL: [RegClass; 6] =
        [RegClass::Pred, RegClass::B16, RegClass::B32, RegClass::B64, RegClass::F32, RegClass::F64];

    fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "p",
            RegClass::B16 => "h",
            RegClass::B32 => "r",
            RegClass::B64 => "rd",
            RegClass::F32 => "f",
            RegClass::F64 => "fd",
        }
    }

    fn decl(self) -> &'static str {
        match self {
            RegClass::Pred => ".pred",
            RegClass::B16 => ".b16",
            RegClass::B32 => ".b32",
            RegClass::B64 => ".b64",
            RegClass::F32 => ".f32",
            RegClass::F64 => ".f64",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A virtual register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reg {
    /// Its class.
    pub class: RegClass,
    n: u32,
}

impl std::fmt::Display for Reg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "%{}{}", self.class.prefix(), self.n)
    }
}

/// An immediate operand.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Imm {
    /// A signed integer.
    I(i64),
    /// An unsigned integer (printed in hex).
    U(u64),
    /// f32 bits (`0fXXXXXXXX`).
    F32(u32),
    /// f64 bits (`0dXXXXXXXXXXXXXXXX`).
    F64(u64),
}

impl Imm {
    /// Zero as an operand of a register of class `c` (a float literal for the float
    /// classes, which PTX wants there).
    pub fn zero(c: RegClass) -> Imm {
        match c {
            RegClass::F32 => Imm::F32(0),
            RegClass::F64 => Imm::F64(0),
            _ => Imm::I(0),
        }
    }
}

impl std::fmt::Display for Imm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Imm::I(x) => write!(f, "{x}"),
            Imm::U(x) => write!(f, "0x{x:X}"),
            Imm::F32(b) => write!(f, "0f{b:08X}"),
            Imm::F64(b) => write!(f, "0d{b:016X}"),
        }
    }
}

/// A branch target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(u32);

/// One operand of an instruction.
#[derive(Debug, Clone)]
pub enum Opd {
    /// A register.
    R(Reg),
    /// An immediate.
    I(Imm),
    /// `[reg]` or `[reg+off]`: a memory address.
    Addr(Reg, i64),
    /// A vector of registers `{a, b, c, d}`.
    Vec(Vec<Reg>),
    /// A kernel parameter's name (`[name]` in `ld.param`).
    Param(String),
    /// A special register (`%tid.x`).
    Special(&'static str),
    /// A label.
    L(Label),
    /// A variable's name (a `.shared` array declared by [`Ptx::shared`]), for
    /// `mov.u32 %r, name` (its address in the shared window).
    Sym(String),
}

impl From<Reg> for Opd {
    fn from(r: Reg) -> Opd {
        Opd::R(r)
    }
}

impl From<Imm> for Opd {
    fn from(i: Imm) -> Opd {
        Opd::I(i)
    }
}

impl From<Label> for Opd {
    fn from(l: Label) -> Opd {
        Opd::L(l)
    }
}

/// One entry (`.visible .entry`) being built.
#[derive(Debug)]
pub struct Ptx {
    name: String,
    params: Vec<String>,
    counts: [u32; 6],
    body: String,
    labels: u32,
    placed: Vec<bool>,
    used: Vec<bool>,
    /// `.shared` arrays: name, alignment and bytes ([`Ptx::shared`]).
    shared: Vec<(String, u32, u32)>,
    /// The dynamic shared-memory array, name and alignment ([`Ptx::dynamic_shared`]).
    dynamic: Option<(String, u32)>,
    /// Entry directives ([`Ptx::directive`]).
    directives: Vec<String>,
}

/// Why an entry is malformed (a code generator bug).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxError(pub String);

impl Ptx {
    /// An entry named `name` taking `params` 64-bit parameters (`name_param_i`).
    pub fn new(name: &str, params: usize) -> Ptx {
        Ptx {
            name: name.to_string(),
            params: (0..params).map(|i| format!("{name}_param_{i}")).collect(),
            counts: [0; 6],
            body: String::new(),
            labels: 0,
            placed: Vec::new(),
            used: Vec::new(),
            shared: Vec::new(),
            dynamic: None,
            directives: Vec::new(),
        }
    }

    /// Adds a performance-tuning directive of the entry, printed between its
    /// parameter list and its body (`.reqnctapercluster 4, 1, 1`, `.maxntid 256, 1, 1`).
    pub fn directive(&mut self, d: &str) {
        self.directives.push(d.to_string());
    }

    /// Declares a statically sized `.shared` byte array of the entry (`bytes` bytes
    /// aligned to `align`) and returns its name: `mov.u32 %r, name` (with
    /// [`Opd::Sym`]) puts its shared-window address in a 32-bit register, which
    /// `ld.shared`/`st.shared` take as `[%r+off]`. Static arrays total at most 48 KiB
    /// per block (ptxas refuses more).
    pub fn shared(&mut self, tag: &str, bytes: u32, align: u32) -> String {
        let name = format!("{}_{tag}", self.name);
        self.shared.push((name.clone(), align, bytes));
        name
    }

    /// Declares the entry's dynamic shared memory (`.extern .shared`, sized at launch by
    /// [`super::Launch::shared`]; the runtime raises the entry's limit above 48 KiB) and
    /// returns its name, used as [`Ptx::shared`]'s. PTX takes `.extern .shared` at
    /// module scope only, so [`Ptx::finish`] writes the declaration just before the
    /// `.entry`; every such array of a module starts at the same address.
    pub fn dynamic_shared(&mut self, tag: &str, align: u32) -> String {
        let name = format!("{}_{tag}", self.name);
        self.dynamic = Some((name.clone(), align));
        name
    }

    /// Branch to `l` when `cond` holds (or always), where threads of a warp may
    /// disagree on `cond`: a plain `bra` (not `bra.uni`, which asserts that they
    /// agree; [`Ptx::bra`] emits that one).
    pub fn branch(&mut self, cond: Option<(Reg, bool)>, l: Label) {
        self.guarded(cond, "bra", &[l.into()]);
    }

    /// The name of parameter `i`.
    pub fn param(&self, i: usize) -> Opd {
        Opd::Param(self.params.get(i).cloned().unwrap_or_default())
    }

    /// A fresh register of class `c`.
    pub fn reg(&mut self, c: RegClass) -> Reg {
        let n = self.counts[c.index()];
        self.counts[c.index()] += 1;
        Reg { class: c, n }
    }

    /// A fresh label.
    pub fn label(&mut self) -> Label {
        self.labels += 1;
        self.placed.push(false);
        self.used.push(false);
        Label(self.labels - 1)
    }

    /// Places `l` here.
    pub fn place(&mut self, l: Label) {
        if let Some(p) = self.placed.get_mut(l.0 as usize) {
            *p = true;
        }
        let _ = writeln!(self.body, "L{}:", l.0);
    }

    /// `opcode a, b, ...;`
    pub fn op(&mut self, opcode: &str, operands: &[Opd]) {
        self.guarded(None, opcode, operands);
    }

    /// `@p opcode ...;` (or `@!p` when `negate`).
    pub fn op_if(&mut self, p: Reg, negate: bool, opcode: &str, operands: &[Opd]) {
        self.guarded(Some((p, negate)), opcode, operands);
    }

    /// `mov` of an immediate or register into a new register of class `c`.
    pub fn mov(&mut self, c: RegClass, ty: &str, src: Opd) -> Reg {
        let d = self.reg(c);
        self.op(&format!("mov.{ty}"), &[d.into(), src]);
        d
    }

    /// `mov` of register `src` into `dst` (the same class).
    pub fn copy(&mut self, dst: Reg, src: Reg) {
        let ty = &dst.class.decl()[1..];
        self.op(&format!("mov.{ty}"), &[dst.into(), src.into()]);
    }

    /// A new `.b32` register holding special register `s` (`%tid.x`, `%ctaid.x`, …).
    pub fn special(&mut self, s: &'static str) -> Reg {
        let r = self.reg(RegClass::B32);
        self.op("mov.u32", &[r.into(), Opd::Special(s)]);
        r
    }

    /// The global base address of each of the entry's first `n` parameters (the
    /// bindings of the kernel ABI: one `.u64` address each), converted with `cvta`.
    pub fn binding_bases(&mut self, n: usize) -> Vec<Reg> {
        (0..n)
            .map(|i| {
                let raw = self.reg(RegClass::B64);
                self.op("ld.param.u64", &[raw.into(), self.param(i)]);
                let g = self.reg(RegClass::B64);
                self.op("cvta.to.global.u64", &[g.into(), raw.into()]);
                g
            })
            .collect()
    }

    /// Branch to `l` (when `p`, or when not `p` if `negate`).
    pub fn bra(&mut self, cond: Option<(Reg, bool)>, l: Label) {
        self.guarded(cond, "bra.uni", &[l.into()]);
    }

    fn guarded(&mut self, g: Option<(Reg, bool)>, opcode: &str, operands: &[Opd]) {
        self.body.push('\t');
        if let Some((p, neg)) = g {
            let _ = write!(self.body, "@{}{} ", if neg { "!" } else { "" }, p);
        }
        self.body.push_str(opcode);
        for (i, o) in operands.iter().enumerate() {
            self.body.push_str(if i == 0 { " " } else { ", " });
            match o {
                Opd::R(r) => {
                    let _ = write!(self.body, "{r}");
                }
                Opd::I(i) => {
                    let _ = write!(self.body, "{i}");
                }
                Opd::Addr(r, 0) => {
                    let _ = write!(self.body, "[{r}]");
                }
                Opd::Addr(r, off) => {
                    let _ = write!(self.body, "[{r}+{off}]");
                }
                Opd::Vec(rs) => {
                    let names: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
                    let _ = write!(self.body, "{{{}}}", names.join(", "));
                }
                Opd::Param(n) => {
                    let _ = write!(self.body, "[{n}]");
                }
                Opd::Special(s) => self.body.push_str(s),
                Opd::Sym(s) => self.body.push_str(s),
                Opd::L(l) => {
                    if let Some(u) = self.used.get_mut(l.0 as usize) {
                        *u = true;
                    }
                    let _ = write!(self.body, "L{}", l.0);
                }
            }
        }
        self.body.push_str(";\n");
    }

    /// The entry's text (declarations, then the body, then `ret`).
    pub fn finish(self) -> Result<String, PtxError> {
        for (i, (&u, &p)) in self.used.iter().zip(&self.placed).enumerate() {
            if u && !p {
                return Err(PtxError(format!("entry {}: label L{i} is branched to but never placed", self.name)));
            }
        }
        let mut s = String::new();
        if let Some((name, align)) = &self.dynamic {
            let _ = writeln!(s, ".extern .shared .align {align} .b8 {name}[];");
        }
        let params: Vec<String> = self.params.iter().map(|p| format!("\t.param .u64 {p}")).collect();
        let _ = writeln!(s, ".visible .entry {}(\n{}\n)", self.name, params.join(",\n"));
        for d in &self.directives {
            let _ = writeln!(s, "{d}");
        }
        s.push_str("{\n");
        for c in RegClass::ALL {
            let n = self.counts[c.index()];
            if n > 0 {
                let _ = writeln!(s, "\t.reg {} %{}<{}>;", c.decl(), c.prefix(), n);
            }
        }
        for (name, align, bytes) in &self.shared {
            let _ = writeln!(s, "\t.shared .align {align} .b8 {name}[{bytes}];");
        }
        s.push_str(&self.body);
        s.push_str("\tret;\n}\n");
        Ok(s)
    }
}
