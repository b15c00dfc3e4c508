//! Window kernels — depthwise convolutions, max pools and average pools over channel
//! planes ([`kiln_flow::window::Depthwise`]) — with their epilogues.
//!
//! **Mapping.** The output is seen as planes `[P = N·C, OH, OW]` (a 1-D window over
//! `[N, C, L]`, and a `[K, 1]` window over a one-column plane, as a plane of one row).
//! A work item is `R` adjacent outputs of one output row, `(plane, oh, g)` with outputs
//! `ow = R·g .. R·g + R − 1`; items are numbered row-major with `g` innermost, so the
//! threads of a warp take consecutive groups of a row and their loads of each input row
//! are coalesced along W. Threads walk the `P · OH · ⌈OW / R⌉` items in the usual
//! grid-stride loop (blocks of 256, any grid is correct); an item's `(n, c, oh, g)` is
//! divided out in 32 bits where the items fit.
//!
//! For one item a thread streams each window row's input columns from left to right:
//! column `s` of the row's span (`s < sw·(R−1) + dw·(KW−1) + 1`, input column
//! `sw·R·g + pw + s`) is loaded once, at a compile-time offset from the item's first
//! address, and used by every output `j` and tap `kw` with `sw·j + dw·kw = s` (a column
//! no tap reads is not loaded). A filter value is loaded at its first use in the item
//! (again at a compile-time offset from the channel's filter row); every load is L1- or
//! broadcast-friendly, and only a few columns and filter values are live at once.
//!
//! - **Outputs per thread** `R = min(4, OW, ⌊256 / KW⌋)` (at least 1): four outputs
//!   share their overlapping columns (a 3×3 stride-1 row: 6 loads for 4 outputs);
//!   a row of more than 64 taps gets fewer so one row's code stays under 256 tap
//!   operations.
//! - **Unrolling**: the window rows are unrolled when `KH·KW ≤ 64` and
//!   `KH·KW·R ≤ 256` (every tap at a constant offset); otherwise (9×9, 13×13 pools,
//!   long 1-D rows) a counted loop runs over the window rows with each row's columns
//!   unrolled, the row address advanced by `dh·W` elements per iteration.
//! - **Interior and border**: an item whose every tap is inside the plane and whose
//!   `R` outputs all exist (the ranges `oh ∈ [oh_lo, oh_hi]`, `g ∈ [g_lo, g_hi]` are
//!   worked out at compile time, [`Geometry::interior`]) runs code without a bounds
//!   check. Any other item runs the border code: each load is predicated on its row
//!   and column being inside the plane (`ih <u H`, `iw <u W`) and otherwise yields the
//!   kernel's padding value (0 for sums, −∞ for a maximum), and outputs past `OW` are
//!   not stored. Where every item is interior (no padding, `R | OW`) or none is, only
//!   one of the two is emitted. The choice between them and the skips of missing
//!   outputs differ between the threads of a warp: plain (divergent) `bra`.
//! - **Epilogue**: the kernel's own expression above the window's reduction, evaluated
//!   by [`super::expr`] with the reduction given as the accumulator: bias, scale,
//!   clamps (Relu, Relu6/Clip), HardSwish, an average pool's divisor — whatever
//!   epilogue the flow's window form admits, with the interpreter's semantics. Values that do not read the
//!   output column (per-channel bias and scale) are evaluated once per item. An
//!   index-only value of the output position that is constant over the interior (an
//!   average pool's count of taps inside the plane) is worked out by the kernel
//!   interpreter at compile time and used as a constant in the interior code.
//! - **Stores**: where all `R` outputs of an item exist and `R | OW` (so the item's
//!   first output is a multiple of `R` elements into the output, and the binding is
//!   64-byte aligned), `R ∈ {2, 4}` outputs go out in one vector store
//!   (`st.global.v4.f32`, `st.global.v4.b16`); otherwise one store per output.
//!
//! **Half storage** (`--precision f16|bf16`: [`kiln_flow::precision`]). The image, the
//! filter and the output are each stored as f32, f16 or bf16, in any mix (the
//! narrowing pass keeps graph inputs and outputs f32). A half element is loaded as
//! 16 bits (`ld.global.b16`) and widened exactly (`cvt.f32.f16` / `cvt.f32.bf16`);
//! every tap and the epilogue then compute in f32 exactly as above, and a half output
//! is rounded once, to nearest even (`cvt.rn.f16.f32` / `cvt.rn.bf16.f32`): the
//! interpreter's *Types* (loads widen exactly, the store rounds the f32 root). The
//! conversions are [`super::expr::storage`]'s, as in every other emitter; a padded
//! tap's half register holds the padding value's half bits (0 or −∞, exact in both
//! types). **Two halves a word**: where the image's rows have an even width `W` and
//! `sw·R` is even, every item's first input column `sw·R·g + pw` has the parity of
//! `pw` and every row starts at an even element, so span column `s` lies at an even
//! element (4-byte aligned) exactly when `pw + s` is even; there, if column `s + 1` is
//! used too, both come from one `ld.global.b32`, split by `mov.b32 {lo, hi}` (the
//! lower address in the low half) and widened. In the border code such a pair needs
//! one predicate: for an even `i = iw0 + s` and an even `W`, `0 ≤ i < W` holds exactly
//! when `0 ≤ i + 1 < W` does, so both columns are inside the plane or neither is (the
//! padding value then fills both halves). Filter values are loaded one at a time (a
//! channel's filter row starts at `c·KH·KW`, of either parity).
//!
//! **Numerics.** Every output's taps are combined in the interpreter's order (window
//! rows outer, columns inner: the order of the reduction's variables, checked) and
//! with the interpreter's operations: a product and a sum each rounded to f32
//! (`mul.rn`, `add.rn`, no FMA), from an accumulator of +0; a padded tap contributes
//! `0 · w` as the interpreter's padded load does. Convolutions and average pools are
//! therefore bit-exact; a maximum uses `max.f32` from −∞, which ignores a NaN operand —
//! the interpreter's `max(acc, isnan(x) ? −∞ : x)` — and is exact (up to the sign of a
//! maximum that is a zero of both signs). Epilogues carry [`super::expr`]'s accuracy
//! (exact for arithmetic and clamps; the stated bounds of its f32 transcendentals, e.g.
//! SiLU's `exp`). With half storage the same holds of the widened values, and a half
//! output is the interpreter's f32 root rounded once: bit-exact too.
//!
//! **Declined** (to the general mapping, with the reason): kernels of the Window class
//! that are not a [`Depthwise`] (interpolating resamples), an image, filter or output
//! stored other than as f32, f16 or bf16 (which [`Depthwise::of`] does not admit
//! either), taps folded column-major, filters read at a decreasing offset, and windows
//! whose offsets do not fit a 32-bit address displacement.

use std::collections::HashMap;

use kiln_flow::interp::NodeEval;
use kiln_flow::window::{Depthwise, WindowOp, MAX_POSITIONS};
use kiln_flow::{Expr, ExprId, Kernel};
use kiln_ir::DType;

use super::expr::{storage, Eval};
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::{decompose, internal, launch, Entry, Skeleton};
use crate::CodegenError;

/// Most outputs a thread computes along a row.
pub const MAX_OUTPUTS: u64 = 4;
/// Most tap operations (taps × outputs) of one unrolled block of code: a whole window
/// when unrolled, one window row in the row loop.
pub const MAX_UNROLLED: u64 = 256;
/// Most taps of a window whose rows are unrolled (its filter values are all live in
/// registers at worst).
pub const MAX_UNROLLED_TAPS: u64 = 64;
/// Most interior positions over which an index-only epilogue value is checked for
/// being constant at compile time (larger planes keep the value computed per output).
pub const MAX_CONSTANT_CHECK: u64 = 4 * MAX_POSITIONS;

/// A window's geometry over the plane view (see the module docs), and the thread
/// mapping chosen for it. All plain integers: the index arithmetic the emitter relies
/// on is tested on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Planes `N·C`.
    pub planes: u64,
    /// Output rows and columns of a plane.
    pub out: [u64; 2],
    /// Input rows and columns of a plane.
    pub input: [u64; 2],
    /// Window rows and columns.
    pub window: [u64; 2],
    /// Strides (rows, columns).
    pub stride: [i64; 2],
    /// Dilations (rows, columns).
    pub dilation: [i64; 2],
    /// Offsets: input row `stride·o + dilation·t + offset`.
    pub offset: [i64; 2],
    /// Outputs per thread along a row (`R`).
    pub per_thread: u64,
    /// Whether the window rows are unrolled (else a loop over them).
    pub unrolled: bool,
}

/// Inclusive ranges of output rows and groups whose items are interior; `None` where
/// there are none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interior {
    /// Output rows `[lo, hi]`.
    pub rows: (u64, u64),
    /// Groups `[lo, hi]`.
    pub groups: (u64, u64),
}

impl Geometry {
    /// The geometry of `d` and the mapping's choices (module docs).
    pub fn of(d: &Depthwise) -> Geometry {
        let [n, c, oh, ow] = d.out_dims;
        let [_, _, h, w] = d.in_dims;
        let kw = d.window[1].max(1);
        let per_thread = MAX_OUTPUTS.min(ow).min(MAX_UNROLLED / kw).max(1);
        let taps = d.window[0] * d.window[1];
        let unrolled = taps <= MAX_UNROLLED_TAPS && taps * per_thread <= MAX_UNROLLED;
        Geometry {
            planes: n * c,
            out: [oh, ow],
            input: [h, w],
            window: d.window,
            stride: d.stride,
            dilation: d.dilation,
            offset: d.offset,
            per_thread,
            unrolled,
        }
    }

    /// Groups of `R` outputs per output row (the last one may be partial).
    pub fn groups(&self) -> u64 {
        self.out[1].div_ceil(self.per_thread)
    }

    /// Work items: `planes · OH · groups`.
    pub fn items(&self) -> u64 {
        self.planes * self.out[0] * self.groups()
    }

    /// Input columns a thread's row span covers: `sw·(R−1) + dw·(KW−1) + 1`.
    pub fn span(&self) -> u64 {
        (self.stride[1] * (self.per_thread as i64 - 1) + self.dilation[1] * (self.window[1] as i64 - 1) + 1) as u64
    }

    /// The `(output, tap)` pairs that read span column `s`, outputs ascending.
    pub fn users(&self, s: u64) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        for j in 0..self.per_thread {
            let rest = s as i64 - self.stride[1] * j as i64;
            if rest >= 0 && rest % self.dilation[1] == 0 && ((rest / self.dilation[1]) as u64) < self.window[1] {
                v.push((j, (rest / self.dilation[1]) as u64));
            }
        }
        v
    }

    /// First input row of output row `oh`, first input column of group `g`.
    pub fn origin(&self, oh: u64, g: u64) -> (i64, i64) {
        (self.stride[0] * oh as i64 + self.offset[0], self.stride[1] * (self.per_thread * g) as i64 + self.offset[1])
    }

    /// The items whose taps are all inside the plane and whose `R` outputs all exist:
    /// `0 ≤ s·o + off` and `s·o + off + dl·(K−1) ≤ extent − 1` along rows (per output
    /// row) and columns (for the group's first and last output), and `R·g + R − 1 < OW`.
    pub fn interior(&self) -> Option<Interior> {
        let axis = |step: i64, off: i64, reach: i64, extent: i64, count: i64| -> Option<(u64, u64)> {
            // step·i + off ≥ 0 and step·i + off + reach ≤ extent − 1, 0 ≤ i < count.
            let lo = if off >= 0 { 0 } else { ceil_div(-off, step) };
            let top = extent - 1 - off - reach;
            if top < 0 {
                return None;
            }
            let hi = (top / step).min(count - 1);
            (lo <= hi).then_some((lo as u64, hi as u64))
        };
        let rows = axis(
            self.stride[0],
            self.offset[0],
            self.dilation[0] * (self.window[0] as i64 - 1),
            self.input[0] as i64,
            self.out[0] as i64,
        )?;
        let r = self.per_thread as i64;
        let full = self.out[1] as i64 / r; // groups whose R outputs all exist
        let groups = axis(
            self.stride[1] * r,
            self.offset[1],
            self.stride[1] * (r - 1) + self.dilation[1] * (self.window[1] as i64 - 1),
            self.input[1] as i64,
            full,
        )?;
        Some(Interior { rows, groups })
    }
}

/// `⌈a / b⌉` for `a ≥ 0`, `b > 0`.
fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// How output variables of the kernel map onto the plane view.
struct Vars {
    /// The kernel variable of the plane's row (`None`: a plane of one row).
    row: Option<usize>,
    /// The kernel variable of the plane's column.
    col: usize,
    /// A kernel output variable that is always 0 (a `[K, 1]` window's column).
    zero: Option<usize>,
}

/// The entry of `k`, or why this emitter declines it.
pub fn emit(k: &Kernel) -> Result<Result<Entry, String>, CodegenError> {
    let Some(d) = Depthwise::of(k) else {
        return Ok(Err("not a depthwise window or pool (an interpolating resample)".into()));
    };
    // The image, the filter and the output: f32 words or f16/bf16 halves (widened in
    // the load, rounded once in the store).
    let filter_input = match &d.op {
        WindowOp::Conv { w, .. } => Some(*w as usize),
        _ => None,
    };
    let elem = |t: Option<&kiln_ir::TensorType>| t.and_then(|t| Elem::of(t.dtype));
    let (Some(x_elem), Some(out_elem)) = (elem(k.inputs.get(d.x as usize)), Elem::of(k.output.dtype)) else {
        return Ok(Err("image or output not stored as f32, f16 or bf16".into()));
    };
    let w_elem = match filter_input {
        Some(i) => match elem(k.inputs.get(i)) {
            Some(e) => Some(e),
            None => return Ok(Err("filter not stored as f32, f16 or bf16".into())),
        },
        None => None,
    };
    let g = Geometry::of(&d);
    // The reduction's variables, outermost first: taps must fold row-major.
    let Expr::Reduce { vars: rvars, .. } = &k.node(d.reduce).expr else {
        return Err(CodegenError::Internal { kernel: k.name.clone(), what: "window reduction is not a fold".into() });
    };
    let pos = |t: Option<u32>| t.and_then(|t| rvars.iter().position(|v| v.0 == t));
    if let (Some(r), Some(c)) = (pos(d.taps[0]), pos(d.taps[1])) {
        if r > c {
            return Ok(Err("taps folded column-major".into()));
        }
    }
    let rank = k.out_rank();
    let x_dims = k.inputs[d.x as usize].shape.dims();
    let vars = match rank {
        3 => Vars { row: None, col: 2, zero: None },
        _ if x_dims[2] as u64 != d.in_dims[2] => Vars { row: None, col: 2, zero: Some(3) },
        _ => Vars { row: Some(2), col: 3, zero: None },
    };
    // The filter: its channel row and tap offsets (elements), all non-negative.
    let filter = match &d.op {
        WindowOp::Conv { w, w_offset } => {
            let coef = |t: Option<u32>| t.map_or(0, |t| w_offset.coef[t as usize]);
            let (ch, cw) = (coef(d.taps[0]), coef(d.taps[1]));
            let c_coef = if d.out_dims[1] > 1 { w_offset.coef[1] } else { 0 };
            if ch < 0 || cw < 0 || w_offset.c < 0 || c_coef < 0 {
                return Ok(Err("filter read at a decreasing offset".into()));
            }
            Some(Filter { input: *w as usize, base: w_offset.c, channel: c_coef, row: ch, col: cw })
        }
        _ => None,
    };
    // Byte displacements from an item's first address must fit 32 bits.
    let (xb, wb) = (x_elem.bytes, w_elem.map_or(4, |e| e.bytes));
    let row_bytes = g.dilation[0] * g.input[1] as i64 * xb;
    let span_bytes = g.span() as i64 * xb;
    let full_reach = row_bytes * (g.window[0] as i64 - 1) + span_bytes;
    let filter_reach =
        filter.as_ref().map_or(0, |f| (f.row * (g.window[0] as i64 - 1) + f.col * (g.window[1] as i64 - 1) + 1) * wb);
    let g = Geometry { unrolled: g.unrolled && full_reach < i32::MAX as i64, ..g };
    if span_bytes >= i32::MAX as i64 || filter_reach >= i32::MAX as i64 {
        return Ok(Err("window offsets past a 32-bit displacement".into()));
    }
    // Two halves of a row in one 32-bit word: where every row starts at an even element
    // (W even) and every item's first column has the parity of the offset (`sw·R`
    // even), span column `s` is at an even element exactly when `pw + s` is (module
    // docs, *Half storage*).
    let pairs = x_elem.half.is_some() && g.input[1].is_multiple_of(2) && (g.stride[1] * g.per_thread as i64) % 2 == 0;
    let e = Emitter { k, d: &d, g, vars, filter, x: x_elem, w: w_elem.unwrap_or(x_elem), out: out_elem, pairs };
    e.emit().map(Ok)
}

/// How the image, the filter or the output is stored: f32 words, or 16-bit halves
/// whose loads widen to f32 exactly and whose stores round the f32 value once, to
/// nearest even (the kernel interpreter's *Types*).
#[derive(Debug, Clone, Copy)]
struct Elem {
    /// Bytes of one element.
    bytes: i64,
    /// The half type's PTX name (`f16`, `bf16`), or `None` for f32.
    half: Option<&'static str>,
}

impl Elem {
    /// The storage of dtype `d`, where it is f32, f16 or bf16 ([`storage`] gives the
    /// conversions, as for every other emitter).
    fn of(d: DType) -> Option<Elem> {
        let (_, half) = storage(d)?;
        matches!(d, DType::F32 | DType::F16 | DType::BF16).then_some(Elem { bytes: d.storage_bytes(1) as i64, half })
    }

    /// A value `v` of this storage, as its bits: f32's, or the half type's (for the
    /// padding values 0 and −∞, which every half type holds exactly).
    fn bits(self, v: f32) -> u64 {
        match self.half {
            None => u64::from(v.to_bits()),
            Some(_) if v == 0.0 => 0,
            Some("bf16") => u64::from(v.to_bits() >> 16),
            // f16 −∞ (the only other padding value).
            Some(_) => 0xFC00,
        }
    }

    /// Loads one element at `at` into a fresh f32 register, widened where half; in the
    /// border code (`ok`) only where `ok` holds, the value `pad` otherwise.
    fn load(self, p: &mut Ptx, at: Opd, ok: Option<Reg>, pad: f32) -> Reg {
        let x = p.reg(RegClass::F32);
        let Some(h) = self.half else {
            match ok {
                Some(ok) => {
                    p.op("mov.f32", &[x.into(), Imm::F32(pad.to_bits()).into()]);
                    p.op_if(ok, false, "ld.global.f32", &[x.into(), at]);
                }
                None => p.op("ld.global.f32", &[x.into(), at]),
            }
            return x;
        };
        let raw = p.reg(RegClass::B16);
        match ok {
            Some(ok) => {
                p.op("mov.b16", &[raw.into(), Imm::U(self.bits(pad)).into()]);
                p.op_if(ok, false, "ld.global.b16", &[raw.into(), at]);
            }
            None => p.op("ld.global.b16", &[raw.into(), at]),
        }
        p.op(&format!("cvt.f32.{h}"), &[x.into(), raw.into()]);
        x
    }

    /// Loads the two halves at `at` (4-byte aligned) in one 32-bit word into two fresh
    /// f32 registers (the lower address first), each widened; in the border code only
    /// where `ok` holds, `pad` for both otherwise.
    fn load_pair(self, p: &mut Ptx, at: Opd, ok: Option<Reg>, pad: f32) -> [Reg; 2] {
        // Pairs are formed for half images only (`Emitter::pairs`).
        let h = self.half.unwrap_or("f16");
        let word = p.reg(RegClass::B32);
        match ok {
            Some(ok) => {
                let b = self.bits(pad);
                p.op("mov.b32", &[word.into(), Imm::U(b << 16 | b).into()]);
                p.op_if(ok, false, "ld.global.b32", &[word.into(), at]);
            }
            None => p.op("ld.global.b32", &[word.into(), at]),
        }
        let (lo, hi) = (p.reg(RegClass::B16), p.reg(RegClass::B16));
        p.op("mov.b32", &[Opd::Vec(vec![lo, hi]), word.into()]);
        [lo, hi].map(|r| {
            let x = p.reg(RegClass::F32);
            p.op(&format!("cvt.f32.{h}"), &[x.into(), r.into()]);
            x
        })
    }

    /// Stores the f32 values `vs` at consecutive elements from element `first` after
    /// `base`: one vector store
    /// where `vector` (the caller checked the alignment: `vs.len()` elements), else one
    /// store each; half storage rounds each value to nearest even first.
    fn store(self, p: &mut Ptx, base: Reg, first: u64, vs: &[Reg], vector: bool) {
        let (ty, vals): (&str, Vec<Reg>) = match self.half {
            None => ("f32", vs.to_vec()),
            Some(h) => (
                "b16",
                vs.iter()
                    .map(|&v| {
                        let r = p.reg(RegClass::B16);
                        p.op(&format!("cvt.rn.{h}.f32"), &[r.into(), v.into()]);
                        r
                    })
                    .collect(),
            ),
        };
        if vector && vals.len() > 1 {
            let at = Opd::Addr(base, self.bytes * first as i64);
            p.op(&format!("st.global.v{}.{ty}", vals.len()), &[at, Opd::Vec(vals)]);
        } else {
            for (j, v) in vals.into_iter().enumerate() {
                let at = Opd::Addr(base, self.bytes * (first + j as u64) as i64);
                p.op(&format!("st.global.{ty}"), &[at, v.into()]);
            }
        }
    }
}

/// A depthwise convolution's filter: input, and flat element offsets `base + channel·c
/// + row·kh + col·kw`.
struct Filter {
    input: usize,
    base: i64,
    channel: i64,
    row: i64,
    col: i64,
}

struct Emitter<'a> {
    k: &'a Kernel,
    d: &'a Depthwise,
    g: Geometry,
    vars: Vars,
    filter: Option<Filter>,
    /// Storage of the image, the filter (the image's where there is none) and the output.
    x: Elem,
    w: Elem,
    out: Elem,
    /// Whether the image's halves are loaded two to a 32-bit word where aligned.
    pairs: bool,
}

/// Registers of one item, shared by its interior and border code.
struct Item {
    /// Address of input row `ih0`, column `iw0` (may lie outside the plane).
    x0: Reg,
    /// Address of the channel's filter (tap 0, 0), where there is a filter.
    w0: Option<Reg>,
    /// First input row and column (s64).
    ih0: Reg,
    iw0: Reg,
    /// First output column (u64).
    ow0: Reg,
    /// Address of the first output.
    out0: Reg,
}

impl Emitter<'_> {
    fn emit(&self) -> Result<Entry, CodegenError> {
        let (k, g) = (self.k, &self.g);
        let nin = k.inputs.len();
        let items = g.items();
        let mut p = Ptx::new(&k.name, nin + 1);
        let sk = Skeleton::open(&mut p, nin + 1, items);
        // (n, c, oh, g) of the item: in 32 bits where the items fit (a division by a
        // constant is a multiply-high there, a long sequence in 64 bits).
        let [n_, c_] = [self.d.out_dims[0], self.d.out_dims[1]];
        let dims = [n_ as usize, c_ as usize, g.out[0] as usize, g.groups() as usize];
        let idx = if items <= u64::from(u32::MAX) {
            decompose32(&mut p, sk.group, &dims)
        } else {
            decompose(&mut p, sk.group, &dims)
        };
        let nc = [idx[0], idx[1]];
        let (oh, grp) = (idx[2], idx[3]);
        let plane = p.reg(RegClass::B64);
        p.op("mad.lo.s64", &[plane.into(), nc[0].into(), Imm::I(c_ as i64).into(), nc[1].into()]);
        let item = self.item(&mut p, &sk.bases, plane, oh, grp, nc[1])?;
        let mut ev = Eval::new(k, &mut p, sk.bases[..nin].to_vec());
        ev.set_var(0, nc[0]);
        ev.set_var(1, nc[1]);
        if let Some(r) = self.vars.row {
            ev.set_var(r, oh);
        }
        if let Some(z) = self.vars.zero {
            let zero = ev.p.mov(RegClass::B64, "b64", Imm::I(0).into());
            ev.set_var(z, zero);
        }
        // Epilogue values that do not read the output column: once per item.
        let mut set = vec![0usize, 1];
        set.extend(self.vars.row);
        set.extend(self.vars.zero);
        let free = k.free_vars();
        hoist(&mut ev, k, k.root, self.d.reduce, &free, &set, &mut vec![false; k.nodes.len()])?;
        let interior = g.interior();
        let whole = interior.is_some_and(|i| {
            i.rows == (0, g.out[0] - 1) && i.groups == (0, g.groups() - 1) && g.out[1].is_multiple_of(g.per_thread)
        });
        let done = ev.p.label();
        match interior {
            Some(_) if whole => self.body(&mut ev, &item, false)?,
            None => self.body(&mut ev, &item, true)?,
            Some(i) => {
                let inside = ev.p.label();
                let ok_rows = in_range(ev.p, oh, i.rows);
                let ok_groups = in_range(ev.p, grp, i.groups);
                let both = ev.p.reg(RegClass::Pred);
                ev.p.op("and.pred", &[both.into(), ok_rows.into(), ok_groups.into()]);
                // Threads of a warp may take either side: a divergent branch.
                ev.p.branch(Some((both, false)), inside);
                self.body(&mut ev, &item, true)?;
                ev.p.bra(None, done);
                ev.p.place(inside);
                self.body(&mut ev, &item, false)?;
            }
        }
        ev.p.place(done);
        sk.close(&mut p);
        let text = p.finish().map_err(|e| internal(k, e))?;
        let what = match self.d.op {
            WindowOp::Conv { .. } => "depthwise",
            WindowOp::Max => "max pool",
            WindowOp::Sum => "sum pool",
        };
        let note = format!(
            "window ({what} {}x{}, {} per thread, {}{})",
            g.window[0],
            g.window[1],
            g.per_thread,
            if g.unrolled { "unrolled" } else { "row loop" },
            match (interior, whole) {
                (_, true) => ", interior only",
                (None, _) => ", border only",
                _ => ", interior/border",
            }
        );
        Ok(Entry { text, launch: launch(k, items), note })
    }

    /// The item's addresses and first indices.
    fn item(&self, p: &mut Ptx, bases: &[Reg], plane: Reg, oh: Reg, grp: Reg, c: Reg) -> Result<Item, CodegenError> {
        let g = &self.g;
        let nin = self.k.inputs.len();
        let mad = |p: &mut Ptx, a: Reg, b: Imm, c: Opd| {
            let d = p.reg(RegClass::B64);
            p.op("mad.lo.s64", &[d.into(), a.into(), b.into(), c]);
            d
        };
        let ih0 = mad(p, oh, Imm::I(g.stride[0]), Imm::I(g.offset[0]).into());
        let ow0 = p.reg(RegClass::B64);
        p.op("mul.lo.s64", &[ow0.into(), grp.into(), Imm::I(g.per_thread as i64).into()]);
        let iw0 = mad(p, ow0, Imm::I(g.stride[1]), Imm::I(g.offset[1]).into());
        // x0 = x + ((plane·H + ih0)·W + iw0)·size
        let r = mad(p, plane, Imm::I(g.input[0] as i64), ih0.into());
        let f = mad(p, r, Imm::I(g.input[1] as i64), iw0.into());
        let x0 = mad(p, f, Imm::I(self.x.bytes), bases[self.d.x as usize].into());
        // out0 = out + ((plane·OH + oh)·OW + ow0)·size
        let r = mad(p, plane, Imm::I(g.out[0] as i64), oh.into());
        let f = mad(p, r, Imm::I(g.out[1] as i64), ow0.into());
        let out0 = mad(p, f, Imm::I(self.out.bytes), bases[nin].into());
        let w0 = match &self.filter {
            Some(fl) => {
                let e = mad(p, c, Imm::I(fl.channel), Imm::I(fl.base).into());
                Some(mad(p, e, Imm::I(self.w.bytes), bases[fl.input].into()))
            }
            None => None,
        };
        Ok(Item { x0, w0, ih0, iw0, ow0, out0 })
    }

    /// The taps, epilogue and stores of one item, with bounds checks (`border`) or
    /// without.
    fn body(&self, ev: &mut Eval<'_, '_>, it: &Item, border: bool) -> Result<(), CodegenError> {
        let g = &self.g;
        ev.push_scope();
        let (pad, init) = match self.d.op {
            WindowOp::Max => (f32::NEG_INFINITY, f32::NEG_INFINITY),
            _ => (0.0, 0.0),
        };
        let accs: Vec<Reg> =
            (0..g.per_thread).map(|_| ev.p.mov(RegClass::F32, "f32", Imm::F32(init.to_bits()).into())).collect();
        let row_bytes = self.g.dilation[0] * g.input[1] as i64 * self.x.bytes;
        if g.unrolled {
            let mut weights = HashMap::new();
            for kh in 0..g.window[0] {
                let ok = if border {
                    let ih = ev.p.reg(RegClass::B64);
                    ev.p.op("add.s64", &[ih.into(), it.ih0.into(), Imm::I(g.dilation[0] * kh as i64).into()]);
                    Some(below(ev.p, ih, g.input[0]))
                } else {
                    None
                };
                let taps = RowTaps { x: it.x0, x_off: row_bytes * kh as i64, w: it.w0, w_kh: kh };
                self.row(ev.p, &taps, ok.map(|r| (r, it.iw0)), pad, &accs, &mut weights);
            }
        } else {
            // for kh in 0..KH: x, w and ih advanced per row.
            let xr = ev.p.mov(RegClass::B64, "b64", it.x0.into());
            let wr = it.w0.map(|w| ev.p.mov(RegClass::B64, "b64", w.into()));
            let ih = ev.p.mov(RegClass::B64, "b64", it.ih0.into());
            let kh = ev.p.mov(RegClass::B64, "b64", Imm::I(0).into());
            let head = ev.p.label();
            ev.p.place(head);
            let ok = border.then(|| below(ev.p, ih, g.input[0]));
            let taps = RowTaps { x: xr, x_off: 0, w: wr, w_kh: 0 };
            self.row(ev.p, &taps, ok.map(|r| (r, it.iw0)), pad, &accs, &mut HashMap::new());
            ev.p.op("add.s64", &[xr.into(), xr.into(), Imm::I(row_bytes).into()]);
            if let (Some(wr), Some(f)) = (wr, &self.filter) {
                ev.p.op("add.s64", &[wr.into(), wr.into(), Imm::I(f.row * self.w.bytes).into()]);
            }
            ev.p.op("add.s64", &[ih.into(), ih.into(), Imm::I(g.dilation[0]).into()]);
            ev.p.op("add.s64", &[kh.into(), kh.into(), Imm::I(1).into()]);
            let more = ev.p.reg(RegClass::Pred);
            ev.p.op("setp.lt.u64", &[more.into(), kh.into(), Imm::I(g.window[0] as i64).into()]);
            ev.p.bra(Some((more, false)), head);
        }
        // Interior: index-only epilogue values constant over the interior.
        if !border {
            for (e, bits) in self.interior_constants() {
                let r = ev.constant(self.k.node(e).ty, bits);
                ev.given.insert(e, r);
            }
        }
        // All R outputs exist (interior code, or R | OW) and their first is a multiple
        // of R elements into the output (R | OW): one vector store of R ∈ {2, 4}.
        let all = !border || g.out[1].is_multiple_of(g.per_thread);
        let vector = all && matches!(g.per_thread, 2 | 4) && g.out[1].is_multiple_of(g.per_thread);
        let mut vals = Vec::new();
        for (j, &acc) in accs.iter().enumerate() {
            let ow = ev.p.reg(RegClass::B64);
            ev.p.op("add.s64", &[ow.into(), it.ow0.into(), Imm::I(j as i64).into()]);
            let skip = (!all && j > 0).then(|| {
                let l = ev.p.label();
                let past = ev.p.reg(RegClass::Pred);
                ev.p.op("setp.ge.u64", &[past.into(), ow.into(), Imm::I(g.out[1] as i64).into()]);
                ev.p.branch(Some((past, false)), l);
                l
            });
            ev.push_scope();
            ev.set_var(self.vars.col, ow);
            ev.given.insert(self.d.reduce, acc);
            let v = ev.value(self.k.root)?;
            ev.given.remove(&self.d.reduce);
            ev.pop_scope();
            if vector {
                vals.push(v);
            } else {
                self.out.store(ev.p, it.out0, j as u64, &[v], false);
            }
            if let Some(l) = skip {
                ev.p.place(l);
            }
        }
        if vector {
            self.out.store(ev.p, it.out0, 0, &vals, true);
        }
        if !border {
            ev.given.clear();
        }
        ev.pop_scope();
        Ok(())
    }

    /// One window row's taps: span columns left to right, each loaded once and
    /// combined into every output that reads it, in tap order. In the border code
    /// (`border`: the row's predicate and the item's first input column) a load happens
    /// only where its row and column (`iw0 + s <u W`, worked out at the load so that few
    /// predicates are live) are inside the plane, and yields the padding value
    /// otherwise.
    fn row(
        &self,
        p: &mut Ptx,
        t: &RowTaps,
        border: Option<(Reg, Reg)>,
        pad: f32,
        accs: &[Reg],
        weights: &mut HashMap<(u64, u64), Reg>,
    ) {
        let span = self.g.span();
        let mut s = 0;
        while s < span {
            if self.g.users(s).is_empty() {
                s += 1;
                continue;
            }
            let at = Opd::Addr(t.x, t.x_off + self.x.bytes * s as i64);
            let ok = border.map(|(row_ok, iw0)| {
                let iw = p.reg(RegClass::B64);
                p.op("add.s64", &[iw.into(), iw0.into(), Imm::I(s as i64).into()]);
                let col_ok = below(p, iw, self.g.input[1]);
                let b = p.reg(RegClass::Pred);
                p.op("and.pred", &[b.into(), row_ok.into(), col_ok.into()]);
                b
            });
            // Column s at an even element and column s + 1 used too: one word holds
            // both, and both are inside the plane or neither is (module docs).
            let paired = self.pairs
                && (self.g.offset[1] + s as i64).rem_euclid(2) == 0
                && s + 1 < span
                && !self.g.users(s + 1).is_empty();
            let cols = if paired {
                let [a, b] = self.x.load_pair(p, at, ok, pad);
                vec![(s, a), (s + 1, b)]
            } else {
                vec![(s, self.x.load(p, at, ok, pad))]
            };
            s += cols.len() as u64;
            for (col, x) in cols {
                for (j, kw) in self.g.users(col) {
                    let acc = accs[j as usize];
                    match (&self.d.op, &self.filter, t.w) {
                        (WindowOp::Conv { .. }, Some(f), Some(w)) => {
                            let wv = *weights.entry((t.w_kh, kw)).or_insert_with(|| {
                                let off = self.w.bytes * (f.row * t.w_kh as i64 + f.col * kw as i64);
                                self.w.load(p, Opd::Addr(w, off), None, 0.0)
                            });
                            let prod = p.reg(RegClass::F32);
                            p.op("mul.rn.f32", &[prod.into(), x.into(), wv.into()]);
                            p.op("add.rn.f32", &[acc.into(), acc.into(), prod.into()]);
                        }
                        (WindowOp::Max, _, _) => p.op("max.f32", &[acc.into(), acc.into(), x.into()]),
                        _ => p.op("add.rn.f32", &[acc.into(), acc.into(), x.into()]),
                    }
                }
            }
        }
    }

    /// Index-only epilogue nodes of the output position (no input read, free variables
    /// among the plane's row and column) whose value is the same at every interior
    /// position, with that value (the kernel interpreter's bits); outermost such nodes
    /// only, none inside a reduction.
    fn interior_constants(&self) -> Vec<(ExprId, u64)> {
        let g = &self.g;
        let Some(i) = g.interior() else { return Vec::new() };
        let rows = i.rows.1 - i.rows.0 + 1;
        let cols = (i.groups.1 - i.groups.0 + 1) * g.per_thread;
        if rows * cols > MAX_CONSTANT_CHECK {
            return Vec::new();
        }
        let k = self.k;
        let free = k.free_vars();
        let spatial = |v: u32| Some(v as usize) == self.vars.row || v as usize == self.vars.col;
        let mut out = Vec::new();
        let mut stack = vec![k.root];
        let mut seen = vec![false; k.nodes.len()];
        while let Some(e) = stack.pop() {
            if std::mem::replace(&mut seen[e.index()], true) || e == self.d.reduce {
                continue;
            }
            let f = &free[e.index()];
            let node = &k.node(e).expr;
            if !f.is_empty() && f.iter().all(|&v| spatial(v)) && !matches!(node, Expr::Var(_)) {
                if let Some(mut ne) = NodeEval::new(k, e) {
                    let mut env = vec![0i64; k.vars.len()];
                    let mut first = None;
                    let mut same = true;
                    'all: for oh in i.rows.0..=i.rows.1 {
                        for ow in i.groups.0 * g.per_thread..(i.groups.1 + 1) * g.per_thread {
                            if let Some(r) = self.vars.row {
                                env[r] = oh as i64;
                            }
                            env[self.vars.col] = ow as i64;
                            let v = ne.at(&env);
                            if *first.get_or_insert(v) != v {
                                same = false;
                                break 'all;
                            }
                        }
                    }
                    if let (true, Some(v)) = (same, first) {
                        out.push((e, v));
                        continue;
                    }
                }
            }
            if !matches!(node, Expr::Reduce { .. }) {
                node.for_each_operand(|o| stack.push(o));
            }
        }
        out
    }
}

/// Where one window row's taps are: input address and byte displacement of span
/// column 0, the filter address and its window row (`w_kh`: the row whose offsets are
/// added, 0 in the row loop, where the address moves instead).
struct RowTaps {
    x: Reg,
    x_off: i64,
    w: Option<Reg>,
    w_kh: u64,
}

/// The index (one u64 register per dimension) of flat element `flat` (< 2^32) of
/// `dims`, divided in 32 bits.
fn decompose32(p: &mut Ptx, flat: Reg, dims: &[usize]) -> Vec<Reg> {
    let mut rest = p.reg(RegClass::B32);
    p.op("cvt.u32.u64", &[rest.into(), flat.into()]);
    let mut out = vec![flat; dims.len()];
    for d in (0..dims.len()).rev() {
        let v = if d == 0 {
            rest
        } else {
            let n = Imm::U(dims[d] as u64);
            let v = p.reg(RegClass::B32);
            p.op("rem.u32", &[v.into(), rest.into(), n.into()]);
            let q = p.reg(RegClass::B32);
            p.op("div.u32", &[q.into(), rest.into(), n.into()]);
            rest = q;
            v
        };
        let w = p.reg(RegClass::B64);
        p.op("cvt.u64.u32", &[w.into(), v.into()]);
        out[d] = w;
    }
    out
}

/// `0 ≤ i < n` for an s64 `i` (one unsigned comparison).
fn below(p: &mut Ptx, i: Reg, n: u64) -> Reg {
    let ok = p.reg(RegClass::Pred);
    p.op("setp.lt.u64", &[ok.into(), i.into(), Imm::U(n).into()]);
    ok
}

/// `lo ≤ v ≤ hi` for a u64 `v`.
fn in_range(p: &mut Ptx, v: Reg, (lo, hi): (u64, u64)) -> Reg {
    let d = p.reg(RegClass::B64);
    p.op("sub.s64", &[d.into(), v.into(), Imm::U(lo).into()]);
    let ok = p.reg(RegClass::Pred);
    p.op("setp.le.u64", &[ok.into(), d.into(), Imm::U(hi - lo).into()]);
    ok
}

/// Evaluates every node under `e` (not inside `reduce` or any other reduction's body)
/// whose free variables are all in `set`: once per item.
fn hoist(
    ev: &mut Eval<'_, '_>,
    k: &Kernel,
    e: ExprId,
    reduce: ExprId,
    free: &[Vec<u32>],
    set: &[usize],
    seen: &mut Vec<bool>,
) -> Result<(), CodegenError> {
    if e == reduce || std::mem::replace(&mut seen[e.index()], true) {
        return Ok(());
    }
    let node = &k.node(e).expr;
    if free[e.index()].iter().all(|&v| set.contains(&(v as usize))) {
        if !matches!(node, Expr::Const(_) | Expr::Var(_)) {
            ev.value(e)?;
        }
        return Ok(());
    }
    if matches!(node, Expr::Reduce { .. }) {
        return Ok(());
    }
    let mut ops = Vec::new();
    node.for_each_operand(|o| ops.push(o));
    for o in ops {
        hoist(ev, k, o, reduce, free, set, seen)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(
        out: [u64; 2],
        input: [u64; 2],
        window: [u64; 2],
        stride: [i64; 2],
        dil: [i64; 2],
        off: [i64; 2],
    ) -> Geometry {
        let d = Depthwise {
            x: 0,
            op: WindowOp::Max,
            out_dims: [1, 1, out[0], out[1]],
            in_dims: [1, 1, input[0], input[1]],
            taps: [None, None],
            window,
            stride,
            dilation: dil,
            offset: off,
            reduce: ExprId(0),
            epilogue: Vec::new(),
        };
        Geometry::of(&d)
    }

    /// Output extent of one axis under ONNX's rule (floor or ceil mode).
    fn extent(i: i64, k: i64, s: i64, d: i64, lo: i64, hi: i64, ceil: bool) -> i64 {
        let span = i + lo + hi - d * (k - 1) - 1;
        if ceil {
            (span + s - 1) / s + 1
        } else {
            span / s + 1
        }
    }

    /// Every geometry of a grid of widths, windows, strides, dilations, paddings and
    /// ceil modes: the items cover every output exactly once (lane `j` of group `g` is
    /// column `R·g + j`, stored when `< OW`); every interior item's taps are inside the
    /// plane and its lanes all exist; every item outside the interior ranges has a tap
    /// outside the plane or a missing lane (the split is exact); the span's users are
    /// each (output, tap) pair exactly once, outputs in tap order.
    #[test]
    fn items_cover_every_output_once_and_the_interior_is_exact() {
        let mut cases = 0;
        // Rows: (H, KH, stride, dilation, top, bottom, ceil).
        let rows = [
            (1i64, 1i64, 1i64, 1i64, 0i64, 0i64, false),
            (3, 3, 1, 1, 1, 1, false),
            (8, 3, 2, 1, 1, 1, true),
            (9, 5, 3, 2, 0, 4, true),
            (13, 13, 1, 1, 6, 6, false),
        ];
        for (h, kh, sh, dh, top, bottom, ceil_h) in rows {
            for w in [1i64, 2, 5, 7, 33, 113] {
                for kw in [1i64, 2, 3, 5, 7, 13] {
                    for s in [1i64, 2, 3] {
                        for dl in [1i64, 2] {
                            for (lo, hi) in [(0, 0), (1, 1), (0, 2), (3, 1)] {
                                for ceil in [false, true] {
                                    let ow = extent(w, kw, s, dl, lo, hi, ceil);
                                    let oh = extent(h, kh, sh, dh, top, bottom, ceil_h);
                                    if ow < 1 || oh < 1 || dl * (kw - 1) >= w + lo + hi {
                                        continue;
                                    }
                                    let g = geo(
                                        [oh as u64, ow as u64],
                                        [h as u64, w as u64],
                                        [kh as u64, kw as u64],
                                        [sh, s],
                                        [dh, dl],
                                        [-top, -lo],
                                    );
                                    check_geometry(&g);
                                    cases += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(cases > 5000, "{cases}");
    }

    fn check_geometry(g: &Geometry) {
        let r = g.per_thread;
        assert!((1..=MAX_OUTPUTS).contains(&r) && r <= g.out[1], "{g:?}");
        let mut seen = vec![0u32; (g.out[0] * g.out[1]) as usize];
        let interior = g.interior();
        for oh in 0..g.out[0] {
            for grp in 0..g.groups() {
                let (ih0, iw0) = g.origin(oh, grp);
                let mut inside = true;
                for j in 0..r {
                    let ow = r * grp + j;
                    if ow < g.out[1] {
                        seen[(oh * g.out[1] + ow) as usize] += 1;
                    } else {
                        inside = false;
                    }
                    for kh in 0..g.window[0] as i64 {
                        for kw in 0..g.window[1] as i64 {
                            let ih = ih0 + g.dilation[0] * kh;
                            let iw = iw0 + g.stride[1] * j as i64 + g.dilation[1] * kw;
                            inside &= (0..g.input[0] as i64).contains(&ih) && (0..g.input[1] as i64).contains(&iw);
                            // The emitter's address: span column s of window row kh.
                            let s = iw - iw0;
                            assert!((0..g.span() as i64).contains(&s), "{g:?}");
                        }
                    }
                }
                let claimed = interior
                    .is_some_and(|i| (i.rows.0..=i.rows.1).contains(&oh) && (i.groups.0..=i.groups.1).contains(&grp));
                assert_eq!(claimed, inside, "{g:?} oh {oh} g {grp} interior {interior:?}");
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "{g:?}");
        // Users: each (j, kw) exactly once, at s = sw·j + dw·kw.
        let mut pairs = Vec::new();
        for s in 0..g.span() {
            for (j, kw) in g.users(s) {
                assert_eq!(s as i64, g.stride[1] * j as i64 + g.dilation[1] * kw as i64);
                pairs.push((j, kw));
            }
        }
        let mut sorted = pairs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len() as u64, r * g.window[1], "{g:?}");
        assert_eq!(pairs.len(), sorted.len());
        // Per output, taps in increasing order along the stream.
        for j in 0..r {
            let taps: Vec<u64> = pairs.iter().filter(|p| p.0 == j).map(|p| p.1).collect();
            assert!(taps.windows(2).all(|w| w[0] < w[1]), "{g:?}");
        }
    }

    /// The mapping's choices: four outputs a thread where a row has them, fewer for
    /// long rows of taps; rows unrolled up to 64 taps and 256 tap operations.
    #[test]
    fn outputs_per_thread_and_unrolling_follow_the_rule() {
        let g = geo([112, 112], [112, 112], [3, 3], [1, 1], [1, 1], [-1, -1]);
        assert_eq!((g.per_thread, g.unrolled), (4, true));
        let g = geo([5, 3], [5, 3], [3, 3], [1, 1], [1, 1], [-1, -1]);
        assert_eq!((g.per_thread, g.unrolled), (3, true));
        let g = geo([20, 20], [20, 20], [13, 13], [1, 1], [1, 1], [-6, -6]);
        assert_eq!((g.per_thread, g.unrolled), (4, false));
        let g = geo([1, 300], [1, 300], [1, 169], [1, 1], [1, 1], [0, -84]);
        assert_eq!((g.per_thread, g.unrolled), (1, false));
        let g = geo([1, 300], [1, 300], [1, 64], [1, 1], [1, 1], [0, -32]);
        assert_eq!((g.per_thread, g.unrolled), (4, true));
        let g = geo([9, 9], [9, 9], [7, 7], [1, 1], [1, 1], [-3, -3]);
        assert_eq!((g.per_thread, g.unrolled), (4, true));
    }
}
