//! The text form of the flow level: kernels and whole flow programs.
//!
//! [`Kernel`] and [`FlowProgram`] print through `Display` ([`print_kernel`],
//! [`print_program`]) and read back with [`parse_kernel`] and [`parse_program`]. For
//! every well-formed kernel and program (one the parser accepts), `parse(print(x))`
//! equals `x`, and print → parse → print gives the same text.
//!
//! # Kernels
//!
//! ```text
//! kernel @k3_0(%0: f32[2,3], %1: f32[3]) -> f32[2,3] {
//!   vars v0<2 v1<3 v2<3
//!   e0: i64 = v0
//!   e1: i64 = v1
//!   e2: f32 = load %0[e0, e1]
//!   e3: f32 = load %1[e1] pad -inf
//!   e4: f32 = add e2, e3
//!   e5: f32 = 0.5
//!   e6: f32 = mul e4, e5
//!   e7: f32 = reduce.sum [v2] e6
//!   e8: i8 = cast e6 to i4 nosat
//!   yield e6
//! }
//! ```
//!
//! - `%i: TYPE` are the inputs, numbered in order; `-> TYPE` is the output.
//! - `vars` lists every variable `vN<EXTENT` in order: first the output's index (the
//!   extents are the output's dimensions), then the reduction variables (at most
//!   2^48 iterations each, the element limit of tensors).
//! - `eN: TYPE = …` defines node `N` (in order, from `e0`) with its scalar type:
//!   a variable `vN`; a constant (below); `load %i[e…]` with an optional ` pad VALUE`
//!   (the pad value written as a constant of the load's type) or ` clamp`; a unary
//!   operation `neg eA`; a binary one `add eA, eB`; `select eC, eA, eB`;
//!   `cast eA to DTYPE` (` nosat` when it does not saturate); `reduce.OP [vN, …] eA`
//!   with OP one of `sum prod max min argmax argmax.last argmin argmin.last`.
//! - `yield eN` names the root. A scatter kernel (`crate::kernel`'s "Scatter kernels")
//!   ends with `scatter[.OP] [v0, …] eV at eP` instead: its domain variables (the first
//!   ones, in order; `[]` for a single point), the stored value, the flat output position,
//!   and the combining operation (`add`, `mul`, `min`, `max`, `and`, `or`) if any.
//!
//! # Constants
//!
//! Integers are decimal (`-3`, `255`); `bool` constants are `0` and `1` in kernels
//! (`true` and `false` are also read; so is any other byte value, which the verifier
//! lets through). Floats (`f32`, `f64`) are the shortest decimal
//! that reads back to the same bits, always with a `.` or an exponent (`1.0`, `-0.0`,
//! `1e-7`), or `inf`, `-inf`, `nan` (the quiet NaN with sign and payload clear) and
//! `nan(0x7FC00001)` (any other NaN, by its bits). So every constant reads back
//! bit-exactly.
//!
//! # Programs
//!
//! ```text
//! flow @model(%0) {
//!   %0: f32[1,3] = input 0 "x"
//!   %1: f32[3,4] = const blob(0) "w"
//!   %2: f32[4] = const [0.5, 1.0, -2.0, 0.0] "b"
//!   %3: f32[1,4] = result "y"
//!   %4: f32[4] = alias %3 "y_flat"
//!   %3 = dispatch(%0, %1, %2) class contraction sources ["MatMul mm", "Add add"]
//!     kernel @k1_0(%0: f32[1,3], %1: f32[3,4], %2: f32[4]) -> f32[1,4] {
//!       …
//!     }
//!   return %4
//! }
//! blobs {
//!   0:
//!     "AACAPwAAAEAAAEBA…"
//! }
//! ```
//!
//! - The header lists the program's inputs (buffers of kind `input K`, the `K`-th in
//!   the list). Buffers `%0`, `%1`, … are defined in order, each with its type, its
//!   kind and, when not empty, its name as a quoted string: `input K`, `result` (written
//!   by a dispatch), `alias %M` (the bytes of an earlier buffer) or a constant.
//! - A constant of at most [`INLINE_LIMIT`] elements is written inline as a flat
//!   row-major list, a larger one as `blob(N)`, referring to blob `N` of the trailing
//!   `blobs` section (base64 text, in as many strings as it takes). When the constant
//!   tensor's type differs from the buffer's, it follows `const`. Elements: floats as
//!   above (`f16` and `bf16` too, by their exact value; NaNs by their 16 bits), `bool`
//!   as `true`/`false`, integers in decimal, the 8-, 6- and 4-bit float types as their
//!   raw codes in hex (`0x3C`). Bytes with no element form (a `bool` byte other than 0
//!   or 1, a non-zero padding nibble) go to a blob.
//! - `%R = dispatch(%a, …)` runs a kernel (the block after it) on those operands,
//!   writing `%R`; `class C` names the kernel's class ([`KernelClass`]; optional when
//!   parsing, where it must be the class the kernel has); `sources [...]` lists the ops
//!   fused into it, when there are any.
//!   Dispatches run in the order written; an operand computed by a dispatch must be
//!   written by an earlier one.
//! - `return %a, …` lists the outputs.
//!
//! Strings escape `"`, `\` and control characters (`\n`, `\t`, `\r`, `\u{1F}`); names
//! that are identifiers are written bare after `@`. `//` starts a comment.
//!
//! # Errors
//!
//! A [`ParseError`] gives the 1-based line and column (in characters) of the offending
//! token and says what was expected there. Beyond the syntax the parser checks what
//! makes a kernel or program meaningful: kernels pass [`Kernel::verify`] (a type or
//! scope error points at the node's line), operands and results of dispatches match
//! the kernel's types, references resolve, aliases point backwards.

use std::collections::HashMap;
use std::fmt::{self, Write};

use kiln_ir::{DType, Tensor, TensorType};

pub use kiln_ir::text::ParseError;
// The lexer, token cursor, quoting, base64 and number forms are the tensor level's: one
// text syntax at every level.
use kiln_ir::text::syntax::{
    base64_encode, fail, fmt_f32, fmt_f64, inline_elements, int_parts, is_hex, lit_code as syntax_lit_code, parse_int,
    quote, write_name, Cursor, SResult as PResult, SyntaxError as PErr, Tok, BF16_NAN, F16_NAN, F32_NAN, F64_NAN,
};
pub use kiln_ir::text::INLINE_LIMIT;

use crate::class::KernelClass;
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, KernelError, Node, ReduceOp, ScalarType, UnaryOp, VarId};
use crate::program::{Buffer, BufferId, BufferKind, Dispatch, FlowProgram};

/// Bytes per base64 line of the `blobs` section (76 characters).
const BLOB_LINE_BYTES: usize = 57;

/// The longest loop the parser accepts for a variable (the element limit of tensors).
const MAX_EXTENT: u64 = kiln_ir::shape::MAX_ELEMENTS as u64;

/// The text of a kernel (its `Display`).
pub fn print_kernel(k: &Kernel) -> String {
    k.to_string()
}

/// The text of a flow program, blobs included, ending in a newline (its `Display`
/// plus `\n`).
pub fn print_program(p: &FlowProgram) -> String {
    format!("{p}\n")
}

// ---------------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------------

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        write_kernel(&mut out, self, "");
        f.write_str(&out)
    }
}

impl fmt::Display for FlowProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let mut blobs: Vec<&[u8]> = Vec::new();
        out.push_str("flow @");
        write_name(&mut out, &self.name);
        out.push('(');
        write_refs(&mut out, &self.inputs);
        out.push_str(") {\n");
        for (i, b) in self.buffers.iter().enumerate() {
            let _ = write!(out, "  %{i}: {} = ", b.ty);
            match &b.kind {
                BufferKind::Input(k) => {
                    let _ = write!(out, "input {k}");
                }
                BufferKind::Result => out.push_str("result"),
                BufferKind::Alias(x) => {
                    let _ = write!(out, "alias %{}", x.0);
                }
                BufferKind::Const(t) => {
                    out.push_str("const ");
                    if *t.ty() != b.ty {
                        let _ = write!(out, "{} ", t.ty());
                    }
                    match inline_elements(t) {
                        Some(items) => {
                            out.push('[');
                            out.push_str(&items.join(", "));
                            out.push(']');
                        }
                        None => {
                            let _ = write!(out, "blob({})", blobs.len());
                            blobs.push(t.bytes());
                        }
                    }
                }
            }
            if !b.name.is_empty() {
                out.push(' ');
                quote(&b.name, &mut out);
            }
            out.push('\n');
        }
        for d in &self.dispatches {
            let _ = write!(out, "  %{} = dispatch(", d.result.0);
            write_refs(&mut out, &d.operands);
            out.push(')');
            let _ = write!(out, " class {}", d.class);
            for &(c, truth) in &d.guard {
                let _ = write!(out, " {} %{}", if truth { "when" } else { "unless" }, c.0);
            }
            if !d.sources.is_empty() {
                out.push_str(" sources [");
                for (k, s) in d.sources.iter().enumerate() {
                    if k > 0 {
                        out.push_str(", ");
                    }
                    quote(s, &mut out);
                }
                out.push(']');
            }
            out.push('\n');
            write_kernel(&mut out, &d.kernel, "    ");
            out.push('\n');
        }
        out.push_str("  return");
        if !self.outputs.is_empty() {
            out.push(' ');
            write_refs(&mut out, &self.outputs);
        }
        out.push_str("\n}");
        if !blobs.is_empty() {
            out.push_str("\nblobs {\n");
            for (k, data) in blobs.iter().enumerate() {
                let _ = writeln!(out, "  {k}:");
                if data.is_empty() {
                    out.push_str("    \"\"\n");
                }
                for line in data.chunks(BLOB_LINE_BYTES) {
                    let _ = writeln!(out, "    \"{}\"", base64_encode(line));
                }
            }
            out.push('}');
        }
        f.write_str(&out)
    }
}

fn write_refs(out: &mut String, ids: &[BufferId]) {
    for (k, b) in ids.iter().enumerate() {
        let _ = write!(out, "{}%{}", if k > 0 { ", " } else { "" }, b.0);
    }
}

/// A kernel, every line prefixed with `ind`, without a final newline.
fn write_kernel(out: &mut String, k: &Kernel, ind: &str) {
    let _ = write!(out, "{ind}kernel @");
    write_name(out, &k.name);
    out.push('(');
    for (i, t) in k.inputs.iter().enumerate() {
        let _ = write!(out, "{}%{i}: {t}", if i > 0 { ", " } else { "" });
    }
    let _ = writeln!(out, ") -> {} {{", k.output);
    let _ = write!(out, "{ind}  vars");
    for (i, e) in k.vars.iter().enumerate() {
        let _ = write!(out, " v{i}<{e}");
    }
    out.push('\n');
    let ids = |v: &[ExprId]| v.iter().map(|e| format!("e{}", e.0)).collect::<Vec<_>>().join(", ");
    for (i, n) in k.nodes.iter().enumerate() {
        let _ = write!(out, "{ind}  e{i}: {} = ", n.ty);
        let _ = match &n.expr {
            Expr::Var(v) => write!(out, "v{}", v.0),
            Expr::Const(bits) => write!(out, "{}", scalar_text(n.ty, *bits)),
            Expr::Load { input, index, bounds } => {
                let _ = write!(out, "load %{input}[{}]", ids(index));
                match bounds {
                    Bounds::InBounds => Ok(()),
                    Bounds::Pad(bits) => write!(out, " pad {}", scalar_text(n.ty, *bits)),
                    Bounds::Clamp => write!(out, " clamp"),
                }
            }
            Expr::Unary(op, a) => write!(out, "{} e{}", op.name(), a.0),
            Expr::Binary(op, a, b) => write!(out, "{} e{}, e{}", op.name(), a.0, b.0),
            Expr::Select(c, a, b) => write!(out, "select e{}, e{}, e{}", c.0, a.0, b.0),
            Expr::Cast { value, to, saturate } => {
                write!(out, "cast e{} to {}{}", value.0, to.name(), if *saturate { "" } else { " nosat" })
            }
            Expr::Reduce { op, vars, body } => {
                let vs = vars.iter().map(|v| format!("v{}", v.0)).collect::<Vec<_>>().join(", ");
                write!(out, "reduce.{} [{vs}] e{}", op.name(), body.0)
            }
        };
        out.push('\n');
    }
    match &k.scatter {
        None => {
            let _ = write!(out, "{ind}  yield e{}\n{ind}}}", k.root.0);
        }
        Some(sc) => {
            let op = sc.combine.map_or(String::new(), |o| format!(".{}", o.name()));
            let vs = (0..sc.rank).map(|v| format!("v{v}")).collect::<Vec<_>>().join(", ");
            let _ = write!(out, "{ind}  scatter{op} [{vs}] e{} at e{}\n{ind}}}", k.root.0, sc.at.0);
        }
    }
}

/// A constant of a kernel: `bits` in type `ty`.
fn scalar_text(ty: ScalarType, bits: u64) -> String {
    match ty {
        ScalarType::F32 => fmt_f32(f32::from_bits(bits as u32)),
        ScalarType::F64 => fmt_f64(f64::from_bits(bits)),
        t => t.to_i128(bits).to_string(),
    }
}

/// The exact value of an `f16` (any bits but a NaN's).
fn f16_to_f32(h: u16) -> f32 {
    let exp = u32::from((h >> 10) & 0x1F);
    let man = u32::from(h & 0x3FF);
    let mag = match exp {
        0 => man as f32 * f32::from_bits(0x3380_0000), // man · 2^-24, exact
        31 => f32::INFINITY,
        e => f32::from_bits(((e + 112) << 23) | (man << 13)),
    };
    if h & 0x8000 != 0 {
        -mag
    } else {
        mag
    }
}

/// The `f16` whose value is exactly `x`, if there is one.
fn f32_to_f16_exact(x: f32) -> Option<u16> {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a.is_nan() {
        return None;
    }
    // Non-NaN f16 magnitudes 0x0000..=0x7C00 are ordered like their values.
    let (mut lo, mut hi) = (0u16, 0x7C00u16);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if f16_to_f32(mid) < a {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    (f16_to_f32(lo) == a).then_some(lo | sign)
}

// ---------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------

/// Parses a kernel (see the [module docs](self)); the kernel is verified.
///
/// Never panics; every error names the line and column of the offending token.
pub fn parse_kernel(src: &str) -> Result<Kernel, ParseError> {
    run_parser(src, |p| {
        let k = p.kernel()?;
        p.end()?;
        Ok(k)
    })
}

/// Parses a flow program (see the [module docs](self)); every kernel is verified and
/// the program is checked (see the module docs).
///
/// Never panics; every error names the line and column of the offending token.
pub fn parse_program(src: &str) -> Result<FlowProgram, ParseError> {
    run_parser(src, |p| p.program())
}

fn run_parser<T>(src: &str, f: impl FnOnce(&mut Parser) -> PResult<T>) -> Result<T, ParseError> {
    kiln_ir::text::syntax::run(src, |cur| f(&mut Parser(cur)))
}

/// One literal as written, before its type gives it a value.
enum Lit {
    Num(String),
    Inf { neg: bool },
    Nan { bits: Option<(u64, usize)> },
    Bool(bool),
}

/// The parser: a cursor over the tokens, with the flow level's grammar as methods.
struct Parser<'c>(&'c mut Cursor);

impl std::ops::Deref for Parser<'_> {
    type Target = Cursor;
    fn deref(&self) -> &Cursor {
        self.0
    }
}

impl std::ops::DerefMut for Parser<'_> {
    fn deref_mut(&mut self) -> &mut Cursor {
        self.0
    }
}

/// A constant of a program before blobs are resolved.
enum PConst {
    Ready(Tensor),
    Blob { ty: TensorType, index: u64, pos: usize },
}

struct PDispatch {
    pos: usize,
    result: (u32, usize),
    operands: Vec<(u32, usize)>,
    sources: Vec<String>,
    /// The class written, and where.
    class: Option<(KernelClass, usize)>,
    /// `when %N` / `unless %N`, in order.
    guard: Vec<((u32, usize), bool)>,
    kernel: Kernel,
}

impl Parser<'_> {
    /// `@NAME` or `@"name"`.
    fn at_name(&mut self, what: &str) -> PResult<String> {
        self.expect(&Tok::At, &format!("before the {what}"))?;
        match self.bump() {
            (Tok::Ident(s) | Tok::Str(s), _) => Ok(s),
            (t, pos) => fail(pos, format!("expected the {what} (an identifier or a string) after `@`, found {t}")),
        }
    }

    fn opt_string(&mut self) -> Option<String> {
        if let Tok::Str(_) = self.peek() {
            if let (Tok::Str(s), _) = self.bump() {
                return Some(s);
            }
        }
        None
    }

    /// `%N`.
    fn reference(&mut self, what: &str) -> PResult<(u32, usize)> {
        match self.bump() {
            (Tok::Ref(v), pos) => Ok((v, pos)),
            (t, pos) => fail(pos, format!("expected {what} (`%N`), found {t}")),
        }
    }

    /// `%N, …)`: references up to the closing parenthesis (its opening one read), each
    /// one `what`.
    fn references(&mut self, what: &str) -> PResult<Vec<(u32, usize)>> {
        let mut refs = Vec::new();
        if !self.eat(&Tok::RParen) {
            loop {
                refs.push(self.reference(what)?);
                if self.eat(&Tok::RParen) {
                    break;
                }
                self.expect(&Tok::Comma, &format!("or `)` after {what}"))?;
            }
        }
        Ok(refs)
    }

    /// `PREFIX N` written as one identifier (`e3`, `v0`).
    fn numbered(&mut self, prefix: char, what: &str) -> PResult<(u32, usize)> {
        let (t, pos) = self.bump();
        if let Tok::Ident(s) = &t {
            if let Some(n) = numbered_ident(s, prefix) {
                return Ok((n, pos));
            }
        }
        fail(pos, format!("expected {what} (`{prefix}N`), found {t}"))
    }

    fn scalar_type(&mut self) -> PResult<ScalarType> {
        let (tok, pos) = self.bump();
        if let Tok::Ident(s) = &tok {
            if let Some(t) = ScalarType::ALL.iter().find(|t| t.name() == s) {
                return Ok(*t);
            }
        }
        fail(pos, format!("expected a scalar type (bool, i8…i64, u8…u64, f32, f64), found {tok}"))
    }

    fn lit(&mut self) -> PResult<(Lit, usize)> {
        let (t, pos) = self.bump();
        let lit = match t {
            Tok::Num(s) => Lit::Num(s),
            Tok::Minus => match self.bump() {
                (Tok::Ident(s), _) if s == "inf" => Lit::Inf { neg: true },
                (t, p) => return fail(p, format!("expected a number or `inf` after `-`, found {t}")),
            },
            Tok::Ident(s) => match s.as_str() {
                "inf" => Lit::Inf { neg: false },
                "nan" => Lit::Nan { bits: self.nan_bits()? },
                "true" => Lit::Bool(true),
                "false" => Lit::Bool(false),
                _ => return fail(pos, format!("expected a literal, found `{s}`")),
            },
            t => return fail(pos, format!("expected a literal, found {t}")),
        };
        Ok((lit, pos))
    }

    /// A constant of scalar type `ty`, as bits.
    fn scalar(&mut self, ty: ScalarType) -> PResult<u64> {
        let (l, pos) = self.lit()?;
        lit_scalar(&l, pos, ty)
    }

    /// `kernel @NAME(%0: T, …) -> T { vars …  eN: T = …  yield eN }`.
    fn kernel(&mut self) -> PResult<Kernel> {
        self.expect_kw("kernel", "at the start of a kernel")?;
        let name = self.at_name("kernel name")?;
        self.expect(&Tok::LParen, "before the kernel's inputs")?;
        let mut inputs = Vec::new();
        if !self.eat(&Tok::RParen) {
            loop {
                let (i, pos) = self.reference("a kernel input")?;
                if i as usize != inputs.len() {
                    return fail(
                        pos,
                        format!("expected `%{}` (inputs are numbered in order), found `%{i}`", inputs.len()),
                    );
                }
                self.expect(&Tok::Colon, "after the input number")?;
                inputs.push(self.tensor_type()?);
                if self.eat(&Tok::RParen) {
                    break;
                }
                self.expect(&Tok::Comma, "or `)` after a kernel input")?;
            }
        }
        self.expect(&Tok::Arrow, "after the kernel's inputs")?;
        let output = self.tensor_type()?;
        self.expect(&Tok::LBrace, "before the kernel body")?;
        let vpos = self.expect_kw("vars", "at the start of the kernel body")?;
        let mut vars: Vec<u64> = Vec::new();
        while let Tok::Ident(s) = self.peek() {
            if numbered_ident(s, 'v').is_none() {
                break;
            }
            let (v, pos) = self.numbered('v', "a variable")?;
            if v as usize != vars.len() {
                return fail(
                    pos,
                    format!("expected `v{}` (variables are numbered in order), found `v{v}`", vars.len()),
                );
            }
            self.expect(&Tok::Lt, "after the variable (its extent is written `v0<8`)")?;
            let (e, epos) = self.uint("the variable's extent")?;
            if e > MAX_EXTENT {
                return fail(epos, format!("extent {e} exceeds the largest loop kiln allows ({MAX_EXTENT})"));
            }
            vars.push(e);
        }
        let dims = output.shape.dims();
        let mut nodes: Vec<Node> = Vec::new();
        let mut node_pos: Vec<usize> = Vec::new();
        let ends = |t: &Tok| matches!(t, Tok::Ident(s) if s == "yield" || s == "scatter" || s.starts_with("scatter."));
        while !ends(self.peek()) {
            let (n, pos) = match self.peek() {
                Tok::Ident(s) if numbered_ident(s, 'e').is_some() => self.numbered('e', "a node")?,
                t => return fail(self.pos(), format!("expected a node `e{}: …` or `yield`, found {t}", nodes.len())),
            };
            if n as usize != nodes.len() {
                return fail(pos, format!("expected `e{}` (nodes are numbered in order), found `e{n}`", nodes.len()));
            }
            self.expect(&Tok::Colon, "after the node number")?;
            let ty = self.scalar_type()?;
            self.expect(&Tok::Eq, "after the node's type")?;
            let expr = self.expr(ty, nodes.len(), &inputs, vars.len())?;
            nodes.push(Node { ty, expr });
            node_pos.push(pos);
        }
        let ypos = self.pos();
        let end = match self.peek() {
            Tok::Ident(s) => s.clone(),
            _ => String::new(),
        };
        self.bump();
        // `scatter[.OP] [v0, …] eV at eP`: the domain's variables, the value, the position.
        let mut scatter = None;
        if end != "yield" {
            let combine = match end.strip_prefix("scatter.") {
                None => None,
                Some(o) => match BinaryOp::ALL.iter().find(|b| b.name() == o) {
                    Some(&b) => Some(b),
                    None => {
                        return fail(ypos, format!("unknown scatter combination `{o}` (add, mul, min, max, and, or)"))
                    }
                },
            };
            self.expect(&Tok::LBrack, "before the scatter's domain variables")?;
            let mut rank = 0usize;
            if !self.eat(&Tok::RBrack) {
                loop {
                    let (v, vpos) = self.numbered('v', "a domain variable")?;
                    if v as usize != rank || rank >= vars.len() {
                        return fail(vpos, format!("expected `v{rank}` (the domain is the first variables, in order)"));
                    }
                    rank += 1;
                    if self.eat(&Tok::RBrack) {
                        break;
                    }
                    self.expect(&Tok::Comma, "or `]` after a domain variable")?;
                }
            }
            scatter = Some((rank, combine));
        } else if vars.len() < dims.len() || vars.iter().zip(dims).any(|(&v, &d)| v != d as u64) {
            return fail(vpos, format!("the first variables must be the output's dimensions {:?}", dims));
        }
        let (root, rpos) = self.numbered('e', "the root node")?;
        if root as usize >= nodes.len() {
            return fail(rpos, format!("the root e{root} does not exist"));
        }
        let root = ExprId(root);
        let scatter = match scatter {
            None => None,
            Some((rank, combine)) => {
                let apos = self.pos();
                if !self.is_kw("at") {
                    return fail(apos, "expected `at eN` (the scatter's position) after its value".to_string());
                }
                self.bump();
                let (at, atpos) = self.numbered('e', "the scatter position")?;
                if at as usize >= nodes.len() {
                    return fail(atpos, format!("the position e{at} does not exist"));
                }
                Some(crate::kernel::Scatter { rank, at: ExprId(at), combine })
            }
        };
        self.expect(&Tok::RBrace, "after `yield eN` (the end of the kernel)")?;
        let k = Kernel { name, inputs, output, vars, nodes, root, scatter };
        k.verify().map_err(|e| {
            let node = match &e {
                KernelError::Type { node, .. }
                | KernelError::Structure { node, .. }
                | KernelError::OutOfBounds { node, .. } => *node as usize,
            };
            PErr { pos: node_pos.get(node).copied().unwrap_or(ypos), message: format!("invalid kernel: {e}") }
        })?;
        Ok(k)
    }

    /// `eN` that must precede node `before`.
    fn node_ref(&mut self, before: usize) -> PResult<(ExprId, usize)> {
        let (n, pos) = self.numbered('e', "a node")?;
        if n as usize >= before {
            return fail(pos, format!("e{n} is not defined before its use"));
        }
        Ok((ExprId(n), pos))
    }

    fn node_list(&mut self, before: usize) -> PResult<Vec<ExprId>> {
        let mut v = Vec::new();
        if self.eat(&Tok::RBrack) {
            return Ok(v);
        }
        loop {
            v.push(self.node_ref(before)?.0);
            if self.eat(&Tok::RBrack) {
                return Ok(v);
            }
            self.expect(&Tok::Comma, "or `]` after a node")?;
        }
    }

    /// The right-hand side of node `at`, of type `ty`.
    fn expr(&mut self, ty: ScalarType, at: usize, inputs: &[TensorType], nvars: usize) -> PResult<Expr> {
        let pos = self.pos();
        let word = match self.peek() {
            Tok::Ident(s) => s.clone(),
            Tok::Num(_) | Tok::Minus => return Ok(Expr::Const(self.scalar(ty)?)),
            t => {
                return fail(pos, format!("expected an expression (a constant, `vN`, `load`, an operation), found {t}"))
            }
        };
        if let Some(v) = numbered_ident(&word, 'v') {
            self.bump();
            if v as usize >= nvars {
                return fail(pos, format!("variable v{v} does not exist ({nvars} variables)"));
            }
            return Ok(Expr::Var(VarId(v)));
        }
        if matches!(word.as_str(), "inf" | "nan" | "true" | "false") {
            return Ok(Expr::Const(self.scalar(ty)?));
        }
        self.bump();
        if let Some(op) = UnaryOp::ALL.iter().find(|o| o.name() == word) {
            return Ok(Expr::Unary(*op, self.node_ref(at)?.0));
        }
        if let Some(op) = BinaryOp::ALL.iter().find(|o| o.name() == word) {
            let a = self.node_ref(at)?.0;
            self.expect(&Tok::Comma, "between the operands")?;
            let b = self.node_ref(at)?.0;
            return Ok(Expr::Binary(*op, a, b));
        }
        if let Some(r) = word.strip_prefix("reduce.") {
            let Some(op) = ReduceOp::ALL.iter().find(|o| o.name() == r) else {
                return fail(
                    pos,
                    format!("unknown reduction `{r}` (sum, prod, max, min, argmax[.last], argmin[.last])"),
                );
            };
            self.expect(&Tok::LBrack, "before the reduction's variables")?;
            let mut vars = Vec::new();
            loop {
                let (v, vpos) = self.numbered('v', "a variable")?;
                if v as usize >= nvars {
                    return fail(vpos, format!("variable v{v} does not exist ({nvars} variables)"));
                }
                vars.push(VarId(v));
                if self.eat(&Tok::RBrack) {
                    break;
                }
                self.expect(&Tok::Comma, "or `]` after a variable")?;
            }
            let body = self.node_ref(at)?.0;
            return Ok(Expr::Reduce { op: *op, vars, body });
        }
        match word.as_str() {
            "load" => {
                let (input, ipos) = self.reference("the input read")?;
                let Some(t) = inputs.get(input as usize) else {
                    return fail(ipos, format!("input %{input} does not exist ({} inputs)", inputs.len()));
                };
                let lpos = self.expect(&Tok::LBrack, "before the load's index")?;
                let index = self.node_list(at)?;
                if index.len() != t.shape.rank() {
                    return fail(
                        lpos,
                        format!("{} indices for input %{input} of rank {}", index.len(), t.shape.rank()),
                    );
                }
                let bounds = if self.is_kw("pad") {
                    self.bump();
                    Bounds::Pad(self.scalar(ty)?)
                } else if self.is_kw("clamp") {
                    self.bump();
                    Bounds::Clamp
                } else {
                    Bounds::InBounds
                };
                Ok(Expr::Load { input, index, bounds })
            }
            "select" => {
                let c = self.node_ref(at)?.0;
                self.expect(&Tok::Comma, "after the condition")?;
                let a = self.node_ref(at)?.0;
                self.expect(&Tok::Comma, "between the operands")?;
                let b = self.node_ref(at)?.0;
                Ok(Expr::Select(c, a, b))
            }
            "cast" => {
                let value = self.node_ref(at)?.0;
                self.expect_kw("to", "after the cast's operand")?;
                let (t, tpos) = self.bump();
                let to: DType = match &t {
                    Tok::Ident(s) => {
                        s.parse().map_err(|_| PErr { pos: tpos, message: format!("unknown dtype `{s}`") })?
                    }
                    t => return fail(tpos, format!("expected a dtype after `to`, found {t}")),
                };
                let saturate = !self.is_kw("nosat");
                if !saturate {
                    self.bump();
                }
                Ok(Expr::Cast { value, to, saturate })
            }
            _ => fail(pos, format!("unknown operation `{word}`")),
        }
    }

    /// The whole program text up to the end of input.
    fn program(&mut self) -> PResult<FlowProgram> {
        self.expect_kw("flow", "at the start of the program")?;
        let name = self.at_name("program name")?;
        self.expect(&Tok::LParen, "before the program's inputs")?;
        let inputs = self.references("a program input")?;
        self.expect(&Tok::LBrace, "before the program body")?;
        let mut buffers: Vec<(Buffer, usize)> = Vec::new();
        let mut consts: Vec<(usize, PConst)> = Vec::new();
        let mut dispatches: Vec<PDispatch> = Vec::new();
        loop {
            if self.is_kw("return") {
                break;
            }
            let pos = self.pos();
            let (id, _) = match self.peek() {
                Tok::Ref(_) => self.reference("a buffer")?,
                t => {
                    return fail(
                        pos,
                        format!(
                            "expected a buffer (`%N: TYPE = …`), a dispatch (`%N = dispatch…`) or `return`, found {t}"
                        ),
                    )
                }
            };
            if self.eat(&Tok::Colon) {
                if id as usize != buffers.len() {
                    return fail(
                        pos,
                        format!("expected `%{}` (buffers are defined in order), found `%{id}`", buffers.len()),
                    );
                }
                let ty = self.tensor_type()?;
                self.expect(&Tok::Eq, "after the buffer's type")?;
                let kpos = self.pos();
                let kind = match self.bump() {
                    (Tok::Ident(s), _) if s == "input" => {
                        let (k, kp) = self.uint("the input's position")?;
                        match usize::try_from(k) {
                            Ok(k) => BufferKind::Input(k),
                            Err(_) => return fail(kp, "input position too large"),
                        }
                    }
                    (Tok::Ident(s), _) if s == "result" => BufferKind::Result,
                    (Tok::Ident(s), _) if s == "alias" => {
                        let (x, xpos) = self.reference("the aliased buffer")?;
                        if x >= id {
                            return fail(
                                xpos,
                                format!("an alias must refer to an earlier buffer (%{x} is not before %{id})"),
                            );
                        }
                        BufferKind::Alias(BufferId(x))
                    }
                    (Tok::Ident(s), _) if s == "const" => {
                        let c = self.constant(&ty)?;
                        consts.push((buffers.len(), c));
                        BufferKind::Result // replaced once blobs are read
                    }
                    (t, _) => {
                        return fail(
                            kpos,
                            format!(
                                "expected the buffer's kind (`input K`, `const …`, `result`, `alias %N`), found {t}"
                            ),
                        )
                    }
                };
                let name = self.opt_string().unwrap_or_default();
                buffers.push((Buffer { ty, name, kind }, pos));
            } else if self.eat(&Tok::Eq) {
                self.expect_kw("dispatch", "after `%N =`")?;
                self.expect(&Tok::LParen, "before the dispatch's operands")?;
                let operands = self.references("an operand")?;
                let mut class = None;
                if self.is_kw("class") {
                    self.bump();
                    class = Some(match self.bump() {
                        (Tok::Ident(s), p) => match KernelClass::from_name(&s) {
                            Some(c) => (c, p),
                            None => {
                                let names: Vec<&str> = KernelClass::ALL.iter().map(|c| c.name()).collect();
                                return fail(p, format!("unknown kernel class `{s}` (one of {})", names.join(", ")));
                            }
                        },
                        (t, p) => return fail(p, format!("expected a kernel class after `class`, found {t}")),
                    });
                }
                let mut guard = Vec::new();
                while self.is_kw("when") || self.is_kw("unless") {
                    let truth = self.is_kw("when");
                    self.bump();
                    guard.push((self.reference("a condition")?, truth));
                }
                let mut sources = Vec::new();
                if self.is_kw("sources") {
                    self.bump();
                    self.expect(&Tok::LBrack, "after `sources`")?;
                    loop {
                        match self.bump() {
                            (Tok::Str(s), _) => sources.push(s),
                            (t, p) => return fail(p, format!("expected a source (a string), found {t}")),
                        }
                        if self.eat(&Tok::RBrack) {
                            break;
                        }
                        self.expect(&Tok::Comma, "or `]` after a source")?;
                    }
                }
                let kernel = self.kernel()?;
                dispatches.push(PDispatch { pos, result: (id, pos), operands, sources, class, guard, kernel });
            } else {
                return fail(
                    self.pos(),
                    format!("expected `:` (a buffer) or `=` (a dispatch) after `%{id}`, found {}", self.peek()),
                );
            }
        }
        self.bump();
        let mut outputs = Vec::new();
        if !matches!(self.peek(), Tok::RBrace) {
            loop {
                outputs.push(self.reference("an output")?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        self.expect(&Tok::RBrace, "after the outputs (the end of the program)")?;
        let blobs = if self.is_kw("blobs") { self.blobs()? } else { HashMap::new() };
        self.end()?;

        // Constants.
        let mut used_blobs: Vec<u64> = Vec::new();
        for (b, c) in consts {
            let t = match c {
                PConst::Ready(t) => t,
                PConst::Blob { ty, index, pos } => {
                    let Some(data) = blobs.get(&index) else {
                        return fail(pos, format!("blob {index} is not defined"));
                    };
                    let need = ty.storage_bytes();
                    if data.0.len() != need {
                        return fail(pos, format!("blob {index} has {} bytes, type {ty} needs {need}", data.0.len()));
                    }
                    used_blobs.push(index);
                    Tensor::new(ty, data.0.clone().into()).map_err(|e| PErr { pos, message: e.to_string() })?
                }
            };
            if let Some(slot) = buffers.get_mut(b) {
                slot.0.kind = BufferKind::Const(t);
            }
        }
        if let Some((index, (_, pos))) = blobs.iter().filter(|(i, _)| !used_blobs.contains(i)).min_by_key(|(_, v)| v.1)
        {
            return fail(*pos, format!("blob {index} is not used"));
        }
        let n = buffers.len() as u32;
        let exists = |(id, pos): (u32, usize)| -> PResult<BufferId> {
            if id < n {
                Ok(BufferId(id))
            } else {
                fail(pos, format!("buffer %{id} is not defined ({n} buffers)"))
            }
        };
        let storage = |mut b: BufferId| {
            while let Some(BufferKind::Alias(x)) = buffers.get(b.index()).map(|x| &x.0.kind) {
                b = *x;
            }
            b
        };
        // Inputs.
        let mut input_ids = Vec::new();
        for (k, &r) in inputs.iter().enumerate() {
            let b = exists(r)?;
            if buffers[b.index()].0.kind != BufferKind::Input(k) {
                return fail(r.1, format!("program input {k} is %{}, which is not `input {k}`", r.0));
            }
            input_ids.push(b);
        }
        for (i, (b, pos)) in buffers.iter().enumerate() {
            if let BufferKind::Input(k) = b.kind {
                if input_ids.get(k) != Some(&BufferId(i as u32)) {
                    return fail(*pos, format!("%{i} is `input {k}` but the program's input {k} is not %{i}"));
                }
            }
        }
        // Dispatches.
        let mut written = vec![false; buffers.len()];
        let mut guarded_write = vec![false; buffers.len()];
        let mut out = Vec::new();
        for d in dispatches {
            let result = exists(d.result)?;
            let rb = &buffers[result.index()].0;
            if rb.kind != BufferKind::Result {
                return fail(d.pos, format!("%{} is written by a dispatch but is not a `result` buffer", result.0));
            }
            // An `If` result is written once per branch, each write guarded.
            if written[result.index()] && (d.guard.is_empty() || !guarded_write[result.index()]) {
                return fail(d.pos, format!("%{} is written by two dispatches", result.0));
            }
            let mut guard = Vec::with_capacity(d.guard.len());
            for &(r, truth) in &d.guard {
                let b = exists(r)?;
                let s = storage(b);
                if buffers[s.index()].0.kind == BufferKind::Result && !written[s.index()] {
                    return fail(r.1, format!("%{} is read before a dispatch writes it", r.0));
                }
                guard.push((b, truth));
            }
            guarded_write[result.index()] = !d.guard.is_empty();
            if rb.ty != d.kernel.output {
                return fail(d.pos, format!("%{} is {} but the kernel writes {}", result.0, rb.ty, d.kernel.output));
            }
            if d.operands.len() != d.kernel.inputs.len() {
                return fail(
                    d.pos,
                    format!("{} operands for a kernel of {} inputs", d.operands.len(), d.kernel.inputs.len()),
                );
            }
            let mut operands = Vec::new();
            for (&r, want) in d.operands.iter().zip(&d.kernel.inputs) {
                let b = exists(r)?;
                let ob = &buffers[b.index()].0;
                if ob.ty != *want {
                    return fail(r.1, format!("%{} is {} but the kernel reads {want} there", r.0, ob.ty));
                }
                let s = storage(b);
                if buffers[s.index()].0.kind == BufferKind::Result && !written[s.index()] {
                    return fail(r.1, format!("%{} is read before a dispatch writes it", r.0));
                }
                operands.push(b);
            }
            written[result.index()] = true;
            let dispatch = Dispatch::new(d.kernel, operands, result, d.sources).guarded(guard);
            if let Some((written_class, p)) = d.class {
                if written_class != dispatch.class {
                    return fail(p, format!("class {written_class}, but the kernel is of class {}", dispatch.class));
                }
            }
            out.push(dispatch);
        }
        let mut output_ids = Vec::new();
        for &r in &outputs {
            let b = exists(r)?;
            let s = storage(b);
            if buffers[s.index()].0.kind == BufferKind::Result && !written[s.index()] {
                return fail(r.1, format!("output %{} is never written", r.0));
            }
            output_ids.push(b);
        }
        Ok(FlowProgram {
            extents: Vec::new(),
            name,
            buffers: buffers.into_iter().map(|b| b.0).collect(),
            dispatches: out,
            inputs: input_ids,
            outputs: output_ids,
        })
    }

    /// After `const`: `[TYPE] [elements]` or `[TYPE] blob(N)`; `ty` is the buffer's type.
    fn constant(&mut self, ty: &TensorType) -> PResult<PConst> {
        let ty = if let Tok::Ident(s) = self.peek() {
            if s == "blob" {
                ty.clone()
            } else {
                self.tensor_type()?
            }
        } else {
            ty.clone()
        };
        if let Some((index, pos)) = self.blob_ref()? {
            return Ok(PConst::Blob { ty, index, pos });
        }
        let open = self.expect(&Tok::LBrack, "(the elements) or `blob(N)` after `const`")?;
        let mut lits = Vec::new();
        if !self.eat(&Tok::RBrack) {
            loop {
                if lits.len() > INLINE_LIMIT.max(ty.shape.numel()) {
                    return fail(self.pos(), format!("too many elements for {ty}"));
                }
                lits.push(self.lit()?);
                if self.eat(&Tok::RBrack) {
                    break;
                }
                self.expect(&Tok::Comma, "or `]` after an element")?;
            }
        }
        let n = ty.shape.numel();
        if lits.len() != n {
            return fail(open, format!("the constant has {} elements, type {ty} needs {n}", lits.len()));
        }
        let bytes = encode_elements(ty.dtype, &lits)?;
        Tensor::new(ty, bytes.into()).map(PConst::Ready).map_err(|e| PErr { pos: open, message: e.to_string() })
    }
}

/// `N` from an identifier `PREFIXN` (digits only after the prefix).
fn numbered_ident(s: &str, prefix: char) -> Option<u32> {
    let d = s.strip_prefix(prefix)?;
    if d.is_empty() || !d.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    d.parse().ok()
}

/// An integer of a type whose values are `lo..=hi`.
fn lit_int(l: &Lit, pos: usize, what: &str, lo: i128, hi: i128) -> PResult<i128> {
    match l {
        Lit::Num(s) => match parse_int(s) {
            Some(v) if (lo..=hi).contains(&v) => Ok(v),
            Some(_) => fail(pos, format!("`{s}` is out of range for {what} ({lo} to {hi})")),
            None if int_parts(s).is_some() => fail(pos, format!("`{s}` is out of range for {what} ({lo} to {hi})")),
            None => fail(pos, format!("expected an integer for {what}, found `{s}`")),
        },
        Lit::Bool(b) if what == "bool" => Ok(i128::from(*b)),
        _ => fail(pos, format!("expected an integer for {what}")),
    }
}

/// A float literal as bits of a float of `width` bits whose exponent field is
/// `exp_mask` and whose quiet NaN is `quiet_nan`; decimals through `f32` (`f64` for 64
/// bits), narrowed exactly by `narrow`.
fn lit_float(
    l: &Lit,
    pos: usize,
    what: &str,
    width: u32,
    exp_mask: u64,
    quiet_nan: u64,
    narrow: &dyn Fn(f32) -> Option<u64>,
) -> PResult<u64> {
    let sign = 1u64 << (width - 1);
    match l {
        Lit::Num(s) => {
            if is_hex(s) {
                return fail(pos, format!("`{s}` is not a {what} value (NaN bits are written `nan(0x…)`)"));
            }
            if width == 64 {
                s.parse::<f64>().map(f64::to_bits).map_err(|_| PErr { pos, message: format!("invalid number `{s}`") })
            } else {
                let x: f32 = s.parse().map_err(|_| PErr { pos, message: format!("invalid number `{s}`") })?;
                narrow(x).ok_or_else(|| PErr { pos, message: format!("`{s}` is not exactly a {what} value") })
            }
        }
        Lit::Inf { neg } => Ok(exp_mask | if *neg { sign } else { 0 }),
        Lit::Nan { bits: None } => Ok(quiet_nan),
        Lit::Nan { bits: Some((b, bpos)) } => {
            let mant_mask = (sign - 1) & !exp_mask;
            if width < 64 && *b >> width != 0 {
                return fail(*bpos, format!("NaN bits 0x{b:X} do not fit in {what}"));
            }
            if *b & exp_mask != exp_mask || *b & mant_mask == 0 {
                return fail(*bpos, format!("0x{b:X} is not a NaN of {what}"));
            }
            Ok(*b)
        }
        Lit::Bool(_) => fail(pos, format!("expected a number for {what}")),
    }
}

/// A literal as the bits of a constant of scalar type `ty`.
fn lit_scalar(l: &Lit, pos: usize, ty: ScalarType) -> PResult<u64> {
    match ty {
        ScalarType::F32 => {
            lit_float(l, pos, "f32", 32, 0x7F80_0000, u64::from(F32_NAN), &|x| Some(u64::from(x.to_bits())))
        }
        ScalarType::F64 => lit_float(l, pos, "f64", 64, 0x7FF0_0000_0000_0000, F64_NAN, &|_| None),
        // A `bool` holds one byte: the verifier accepts any, so the text does too.
        ScalarType::Bool => lit_int(l, pos, "bool", 0, 255).map(|v| v as u64),
        t => {
            let (lo, hi) = t.int_range();
            lit_int(l, pos, t.name(), lo, hi).map(|v| t.wrap(v as u64))
        }
    }
}

/// The little-endian bytes of a tensor of `dtype` holding `lits`.
fn encode_elements(dtype: DType, lits: &[(Lit, usize)]) -> PResult<Vec<u8>> {
    let mut out = Vec::with_capacity(dtype.storage_bytes(lits.len()));
    let mut codes = Vec::new();
    let name = dtype.name();
    for (l, pos) in lits {
        let pos = *pos;
        match dtype {
            DType::F32
            | DType::F64
            | DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::U8
            | DType::U16
            | DType::U32
            | DType::U64 => {
                let bits = lit_scalar(l, pos, ScalarType::of_storage(dtype))?;
                out.extend_from_slice(&bits.to_le_bytes()[..dtype.storage_bytes(1)]);
            }
            DType::F16 => {
                let bits =
                    lit_float(l, pos, name, 16, 0x7C00, u64::from(F16_NAN), &|x| f32_to_f16_exact(x).map(u64::from))?;
                out.extend_from_slice(&(bits as u16).to_le_bytes());
            }
            DType::BF16 => {
                let narrow = |x: f32| (x.to_bits() & 0xFFFF == 0).then_some(u64::from(x.to_bits() >> 16));
                let bits = lit_float(l, pos, name, 16, 0x7F80, u64::from(BF16_NAN), &narrow)?;
                out.extend_from_slice(&(bits as u16).to_le_bytes());
            }
            DType::Bool => match l {
                Lit::Bool(b) => out.push(u8::from(*b)),
                _ => return fail(pos, "expected `true` or `false` for bool"),
            },
            DType::I4 => codes.push(lit_int(l, pos, name, -8, 7)? as u8 & 0xF),
            DType::U4 => codes.push(lit_int(l, pos, name, 0, 15)? as u8),
            DType::F4E2M1FN => codes.push(lit_code(l, pos, name, 0xF)?),
            _ => out.push(lit_code(l, pos, name, 0xFF)?),
        }
    }
    if dtype.is_packed() {
        out.extend(codes.chunks(2).map(|c| (c[0] & 0xF) | (c.get(1).copied().unwrap_or(0) << 4)));
    }
    Ok(out)
}

/// A raw code of a low-precision float type (hex).
fn lit_code(l: &Lit, pos: usize, what: &str, max: u8) -> PResult<u8> {
    syntax_lit_code(if let Lit::Num(s) = l { Some(s) } else { None }, pos, what, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_exact_conversions() {
        // 1.0 = 0x3C00, the smallest subnormal 2^-24 = 0x0001, the largest finite 65504 = 0x7BFF.
        assert_eq!(f16_to_f32(0x3C00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7BFF), 65504.0);
        assert_eq!(f16_to_f32(0xC000), -2.0);
        // Every non-NaN f16 converts back to itself.
        for h in 0..=u16::MAX {
            if h & 0x7C00 == 0x7C00 && h & 0x3FF != 0 {
                continue;
            }
            assert_eq!(f32_to_f16_exact(f16_to_f32(h)), Some(h), "{h:#06x}");
        }
        assert_eq!(f32_to_f16_exact(0.1), None);
        assert_eq!(f32_to_f16_exact(65520.0), None);
    }
}
