//! Lowering of the recurrent layers: RNN, GRU and LSTM (forward, reverse,
//! bidirectional; either layout; `sequence_lens`, initial states, peepholes, `clip`,
//! GRU's `linear_before_reset`, LSTM's `input_forget`, every ONNX activation with its
//! alpha and beta).
//!
//! ## Form: the recurrence unrolled into the static plan, every step on fast classes
//! A recurrence is sequential in time, and a flow kernel is a pure function of its
//! output index, so a time step cannot be a loop inside one kernel. kiln's plans are
//! static and the sequence length is known at compile time, so the recurrence is
//! unrolled: each time step is a few dispatches, and each of those is a kernel of an
//! existing fast class rather than one general kernel per step:
//!
//! 1. **Input projection, once for all steps** (a [`Contraction`]): `P[d, t, b, q] =
//!    Σᵢ X[t, b, i]·W[d, q, i] + Wb[d, q]` over `[num_dir, seq, batch, gates·hidden]`, a
//!    matrix product whose rows are the time steps (a batch of 1; with a larger batch,
//!    the batch rows, one product per time step). `W` is read transposed (`[q, i]`); the
//!    flow level's constant relayout copies it to `[d, i, q]` at compile time and weight
//!    packing lays it out in the target's panels, so the product runs on the matrix
//!    microkernel. An embedding Gather in front of `X` stays its own dispatch: fusion
//!    keeps a contraction's operands plain loads.
//! 2. **The recurrent product of each step and direction** (a [`Contraction`]):
//!    `S[0, b, q] = Σₖ H[0, b, k]·R[d, g₀·hidden + q, k] + Rb[d, g₀·hidden + q]` over
//!    the gates `g₀..` the step needs from the previous state (all of them, but for GRU
//!    without `linear_before_reset`: z and r here, h from `r ⊙ H` in a second product).
//!    `R[d]` is relaid to `[k, q]` once at compile time and shared by every step's
//!    product of that direction. Skipped where the state is zero (the first step
//!    without an initial state, or with one that is a constant of positive zeros).
//! 3. **The gates** (Elementwise; General only where `sequence_lens` is run-time data,
//!    whose time index of a reverse pass is read from data): `act(clip(P + S))` per
//!    gate, and the state update — RNN 1 kernel (H), GRU 1 with `linear_before_reset`
//!    (`h̃ = g(P_h + r·S_h)`) and 2 without (`r ⊙ H`, then H), LSTM 2 (C, then H from
//!    the new C). The reverse direction walks time backwards. A row past its length
//!    keeps its state.
//!
//!    Each direction is a chain of its own, its states `[1, batch, hidden]`: the two
//!    chains of a bidirectional layer share nothing after the projection, so a step's
//!    two directions are dispatches of one wave (two threads run them at once), and a
//!    state is one contiguous block of Y.
//! 4. **Y** is the per-step states side by side. Where each `(time, direction)` block of
//!    Y is one contiguous range (time-major Y, or batch 1) and no `sequence_lens` is
//!    read, Y is a concatenation of the states along its flattened `[seq·num_dir]`
//!    axis ([`kiln_flow::concat::Concat`]'s form), viewed as Y's shape: the stream level
//!    then places every state inside Y's bytes, each step's gate kernel writes its
//!    block of Y directly, and no Y kernel runs (unless Y is a graph output, when it
//!    is one copy). Otherwise Y gathers the states (a select over the step that wrote
//!    each time position: a Movement kernel whose inputs grow with the sequence), zero
//!    past a row's length. Y_h and Y_c are the last states (a kernel only where the
//!    directions, the layout or the dtype differ from a last state's, and for Y_h where
//!    the last state is a block of Y: a state inside Y cannot also be a graph output).
//!
//! So a step costs one small matrix product (a matrix-vector product at batch 1) whose
//! weights stream from cache, plus one or two vectorised elementwise kernels; the plan
//! grows by about 2–4 dispatches per time step and direction. The alternative — a new
//! kernel class whose code is a time loop around the product and the gates, keeping the
//! state in registers and the weights resident — saves those dispatches but
//! needs a loop-carrying kernel form at the flow level, an interpreter for it and an
//! emitter per target; it is the next step if the per-dispatch cost shows up on long
//! sequences (it does not on the corpus: see `docs/architecture.md`).
//!
//! Non-f32 layers (f16, bf16, f64) lower to the same kernels, which the contraction
//! recogniser does not take (it is f32-only): they run on the general path.
//!
//! [`Contraction`]: kiln_flow::contraction::Contraction

use kiln_ir::attrs as ka;
use kiln_ir::{DType, OpKind, TensorType};

use super::norm::{build, clamp, dims, float_x, ld, lit, out_ty, result_name, sel, tensor_ty};
use super::{LowerError, Lowered, OpCx, Operand, Output, Step};
use kiln_flow::kernel::{BinaryOp as B, Bounds, ExprId, KernelBuilder, ReduceOp, ScalarType as S, UnaryOp as U};

type R<T> = Result<T, LowerError>;

/// Lowers the ops of this family; `None` for ops of other families.
pub(super) fn lower(cx: &OpCx<'_>) -> Option<Result<Lowered, LowerError>> {
    match cx.op.kind {
        OpKind::RNN | OpKind::GRU | OpKind::LSTM => Some(recurrent(cx)),
        _ => None,
    }
}

/// An activation function of the recurrent layers, with its alpha and beta.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Relu,
    Tanh,
    Sigmoid,
    Affine(f64, f64),
    LeakyRelu(f64),
    ThresholdedRelu(f64),
    ScaledTanh(f64, f64),
    HardSigmoid(f64, f64),
    Elu(f64),
    Softsign,
    Softplus,
}

impl Act {
    /// `f(x)` in `x`'s (float) type.
    fn apply(self, b: &mut KernelBuilder, x: ExprId) -> ExprId {
        let ct = b.ty(x);
        let zero = lit(b, ct, 0.0);
        let one = lit(b, ct, 1.0);
        match self {
            // NaN gives 0, as `f64::max(NaN, 0)` does.
            Act::Relu => {
                let pos = b.binary(B::Gt, x, zero);
                sel(b, pos, x, zero)
            }
            Act::Tanh => tanh(b, x),
            // 1 / (1 + e^−x): no select (e^−x overflows to +∞ below about −88, giving
            // 0; it underflows to 0 above about 104, giving 1), so the gate kernels stay
            // on the vector path.
            Act::Sigmoid => {
                let nx = b.unary(U::Neg, x);
                let e = b.unary(U::Exp, nx);
                let den = b.add(one, e);
                b.div(one, den)
            }
            Act::Affine(a, c) => {
                let (a, c) = (lit(b, ct, a), lit(b, ct, c));
                let t = b.mul(a, x);
                b.add(t, c)
            }
            Act::LeakyRelu(a) => {
                let a = lit(b, ct, a);
                let t = b.mul(a, x);
                let pos = b.binary(B::Ge, x, zero);
                sel(b, pos, x, t)
            }
            Act::ThresholdedRelu(a) => {
                let a = lit(b, ct, a);
                let above = b.binary(B::Gt, x, a);
                sel(b, above, x, zero)
            }
            Act::ScaledTanh(a, c) => {
                let (a, c) = (lit(b, ct, a), lit(b, ct, c));
                let t = b.mul(c, x);
                let th = tanh(b, t);
                b.mul(a, th)
            }
            Act::HardSigmoid(a, c) => {
                let (a, c) = (lit(b, ct, a), lit(b, ct, c));
                let t = b.mul(a, x);
                let t = b.add(t, c);
                clamp(b, t, zero, one)
            }
            Act::Elu(a) => {
                let a = lit(b, ct, a);
                let e = b.unary(U::Exp, x);
                let em = b.sub(e, one);
                let t = b.mul(a, em);
                let pos = b.binary(B::Ge, x, zero);
                sel(b, pos, x, t)
            }
            Act::Softsign => {
                let a = b.unary(U::Abs, x);
                let d = b.add(one, a);
                b.div(x, d)
            }
            Act::Softplus => {
                // max(x, 0) + log(1 + e^{−|x|}).
                let a = b.unary(U::Abs, x);
                let na = b.unary(U::Neg, a);
                let e = b.unary(U::Exp, na);
                let l = b.add(one, e);
                let l = b.unary(U::Log, l);
                let pos = b.binary(B::Gt, x, zero);
                let m = sel(b, pos, x, zero);
                b.add(m, l)
            }
        }
    }
}

/// `tanh x` as `1 − 2 / (1 + e^2x)`: exp, add and divide, which the vector path of the
/// gate kernels has (a `tanh` node would send each step's gates down the general path).
/// ±∞ and the overflow of `e^2x` give ±1, NaN stays NaN. The error is absolute, within
/// a few ulp of 1 (about 3e-7, from the rounding of the quotient and the subtraction),
/// where the reference's tanh is relatively exact: near 0 the relative error grows,
/// which a state in (−1, 1) summed with other terms does not notice.
fn tanh(b: &mut KernelBuilder, x: ExprId) -> ExprId {
    let ct = b.ty(x);
    let (one, two) = (lit(b, ct, 1.0), lit(b, ct, 2.0));
    let x2 = b.mul(two, x);
    let e = b.unary(U::Exp, x2);
    let den = b.add(one, e);
    let q = b.div(two, den);
    b.sub(one, q)
}

/// The activations of every direction (`defaults.len()` per direction), with the
/// alphas and betas consumed in order, as the reference evaluator reads them.
fn activations(cx: &OpCx<'_>, defaults: &[&str], nd: usize) -> R<Vec<Act>> {
    let ra = cx.attrs::<ka::RnnAttrs>()?;
    let names: Vec<String> = match &ra.activations {
        Some(v) if !v.is_empty() => v.clone(),
        _ => defaults.iter().map(|s| s.to_string()).collect(),
    };
    let per = defaults.len();
    let names: Vec<String> = if names.len() == per * nd {
        names
    } else if names.len() == per {
        names.iter().cycle().take(per * nd).cloned().collect()
    } else {
        return Err(cx.unsupported(format!("{} activations, {} expected", names.len(), per * nd)));
    };
    let (alphas, betas) = (&ra.activation_alpha, &ra.activation_beta);
    let (mut ai, mut bi) = (alphas.iter(), betas.iter());
    let mut alpha = |d: f64| ai.next().map_or(d, |&v| v as f64);
    let mut beta = |d: f64| bi.next().map_or(d, |&v| v as f64);
    names
        .iter()
        .map(|n| {
            Ok(match n.to_ascii_lowercase().as_str() {
                "relu" => Act::Relu,
                "tanh" => Act::Tanh,
                "sigmoid" => Act::Sigmoid,
                "affine" => Act::Affine(alpha(1.0), beta(0.0)),
                "leakyrelu" => Act::LeakyRelu(alpha(0.01)),
                "thresholdedrelu" => Act::ThresholdedRelu(alpha(1.0)),
                "scaledtanh" => Act::ScaledTanh(alpha(1.0), beta(1.0)),
                "hardsigmoid" => Act::HardSigmoid(alpha(0.2), beta(0.5)),
                "elu" => Act::Elu(alpha(1.0)),
                "softsign" => Act::Softsign,
                "softplus" => Act::Softplus,
                other => return Err(cx.unsupported(format!("activation {other:?}"))),
            })
        })
        .collect()
}

/// Which recurrent layer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cell {
    Lstm,
    Gru,
    Rnn,
}

/// Where one direction's state comes from.
#[derive(Clone, Copy, Debug)]
enum State {
    /// Zero (no initial state).
    Zero,
    /// An initial-state operand (every direction's, in the layout's order).
    Init(usize),
    /// The result of a step of this direction, `[1, batch, hidden]` in the compute type.
    Step(usize),
}

/// The fixed facts of a recurrent lowering.
struct Rnn {
    cell: Cell,
    ct: S,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    nd: usize,
    /// `[batch, seq, …]` operands and results.
    batch_major: bool,
    /// Only direction, reversed.
    reverse_only: bool,
    acts: Vec<Act>,
    clip: Option<f64>,
    input_forget: bool,
    lbr: bool,
    has_b: bool,
    /// `sequence_lens` is bound (not absent, not all `seq`).
    has_lens: bool,
    has_p: bool,
    /// The type of one direction's state tensors, `[1, batch, hidden]`.
    sty: TensorType,
    /// The type of the projection `[num_dir, seq, batch, gates·hidden]`.
    pty: TensorType,
}

/// Kernel inputs of one kernel: bindings added once, looked up by operand.
#[derive(Default)]
struct Binds {
    list: Vec<(Operand, TensorType)>,
}

impl Binds {
    fn add(&mut self, o: Operand, ty: TensorType) -> usize {
        if let Some(i) = self.list.iter().position(|x| x.0 == o) {
            return i;
        }
        self.list.push((o, ty));
        self.list.len() - 1
    }
}

/// The recurrent part of a step's pre-activations: the product of a step
/// (`S[d, b, (g − first)·hidden + j]`, `Rb` included), or, for a zero state, `Rb`
/// alone (or nothing without a bias).
#[derive(Clone, Copy)]
enum Rec {
    /// Kernel input `input` holds the gates from `first` on.
    Product { input: usize, first: usize },
    /// No product: the bias `B` from kernel input `bias`, if any.
    Bias(Option<usize>),
}

/// A step's recurrent product: its step index and the gates it holds.
#[derive(Clone, Copy)]
struct Product {
    step: usize,
    first: usize,
    count: usize,
}

/// What a gate kernel reads (indices into its binds).
struct GateIn {
    proj: usize,
    lens: Option<usize>,
    p: Option<usize>,
}

impl Rnn {
    fn gh(&self) -> usize {
        self.cell_gates() * self.hidden
    }

    fn cell_gates(&self) -> usize {
        match self.cell {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }

    /// Binds the state `s` (nothing for zero); the kernel input index.
    fn bind_state(&self, cx: &OpCx<'_>, binds: &mut Binds, s: State) -> R<Option<usize>> {
        Ok(match s {
            State::Zero => None,
            State::Init(i) => Some(binds.add(Operand::Input(i), cx.input_ty(i)?.clone())),
            State::Step(k) => Some(binds.add(Operand::Step(k), self.sty.clone())),
        })
    }

    /// The state value of direction `d` (an index expression) at `(b, k)` (compute
    /// type), from its kernel input `j`.
    fn state_at(&self, b: &mut KernelBuilder, s: State, j: Option<usize>, d: ExprId, bb: ExprId, k: ExprId) -> ExprId {
        match (s, j) {
            (State::Init(_), Some(j)) => {
                let ix = if self.batch_major { vec![bb, d, k] } else { vec![d, bb, k] };
                ld(b, j, ix, self.ct)
            }
            (State::Step(_), Some(j)) => {
                let zero = b.index(0);
                b.load(j, vec![zero, bb, k])
            }
            _ => lit(b, self.ct, 0.0),
        }
    }

    /// Binds what every gate kernel reads: the projection, `sequence_lens`, peepholes.
    fn gate_inputs(&self, cx: &OpCx<'_>, binds: &mut Binds) -> R<GateIn> {
        let proj = binds.add(Operand::Step(0), self.pty.clone());
        let lens = if self.has_lens { Some(binds.add(Operand::Input(4), cx.input_ty(4)?.clone())) } else { None };
        let p = if self.has_p { Some(binds.add(Operand::Input(7), cx.input_ty(7)?.clone())) } else { None };
        Ok(GateIn { proj, lens, p })
    }

    /// The operands every step kernel starts with: the gate inputs
    /// ([`Rnn::gate_inputs`]), then the recurrence ([`Rnn::bind_rec`] of `product`).
    fn step_binds(&self, cx: &OpCx<'_>, product: Option<Product>) -> R<(Binds, GateIn, Rec)> {
        let mut binds = Binds::default();
        let gi = self.gate_inputs(cx, &mut binds)?;
        let rec = self.bind_rec(cx, &mut binds, product)?;
        Ok((binds, gi, rec))
    }

    /// Binds the recurrent part: a step's product, or the bias where there is none.
    fn bind_rec(&self, cx: &OpCx<'_>, binds: &mut Binds, product: Option<Product>) -> R<Rec> {
        Ok(match product {
            Some(Product { step: k, first, count }) => {
                let ty = tensor_ty(cx, self.ct.dtype(), vec![1, self.batch, count * self.hidden])?;
                Rec::Product { input: binds.add(Operand::Step(k), ty), first }
            }
            None => {
                Rec::Bias(if self.has_b { Some(binds.add(Operand::Input(3), cx.input_ty(3)?.clone())) } else { None })
            }
        })
    }

    /// Whether direction `dir` runs backwards in time.
    fn reversed(&self, dir: usize) -> bool {
        if self.nd == 2 {
            dir == 1
        } else {
            self.reverse_only
        }
    }

    /// The length of batch row `bb` (i64) when `sequence_lens` is bound.
    fn len_of(&self, b: &mut KernelBuilder, lens: Option<usize>, bb: ExprId) -> Option<ExprId> {
        lens.map(|j| {
            let l = b.load(j, vec![bb]);
            b.convert(l, S::I64)
        })
    }

    /// The time index of step `s` of direction `dir` for row `bb`, and whether the row
    /// is still running (`None`: always; the time index may then be out of range).
    fn time(&self, b: &mut KernelBuilder, s: usize, dir: usize, len: Option<ExprId>) -> (ExprId, Option<ExprId>) {
        let rev = self.reversed(dir);
        match len {
            None => (b.index(if rev { (self.seq - 1 - s) as i64 } else { s as i64 }), None),
            Some(l) => {
                let se = b.index(s as i64);
                let valid = b.binary(B::Lt, se, l);
                let t = if rev {
                    let one = b.index(1);
                    let last = b.sub(l, one);
                    b.sub(last, se)
                } else {
                    se
                };
                (t, Some(valid))
            }
        }
    }

    /// `X·Wᵀ + Wb` of gate `g` at the step's time.
    fn xpart(&self, b: &mut KernelBuilder, gi: &GateIn, sc: &StepCx, g: usize) -> ExprId {
        let off = b.index((g * self.hidden) as i64);
        let q = b.add(off, sc.j);
        let ix = vec![sc.d, sc.t, sc.bb, q];
        if sc.valid.is_some() {
            b.load_with(gi.proj, ix, Bounds::Clamp)
        } else {
            b.load(gi.proj, ix)
        }
    }

    /// The recurrent part of gate `g` (`H·Rᵀ + Rb`; `None` for a zero state without a
    /// bias).
    fn rec(&self, b: &mut KernelBuilder, r: Rec, sc: &StepCx, g: usize) -> Option<ExprId> {
        match r {
            Rec::Product { input, first } => {
                let off = b.index(((g - first) * self.hidden) as i64);
                let q = b.add(off, sc.j);
                let zero = b.index(0);
                Some(b.load(input, vec![zero, sc.bb, q]))
            }
            Rec::Bias(Some(bi)) => {
                let o = b.index((self.gh() + g * self.hidden) as i64);
                let q = b.add(o, sc.j);
                Some(ld(b, bi, vec![sc.d, q], self.ct))
            }
            Rec::Bias(None) => None,
        }
    }

    /// Gate `g`'s whole pre-activation: `X·Wᵀ + Wb + H·Rᵀ + Rb`.
    fn pre(&self, b: &mut KernelBuilder, gi: &GateIn, r: Rec, sc: &StepCx, g: usize) -> ExprId {
        let x = self.xpart(b, gi, sc, g);
        let r = self.rec(b, r, sc, g);
        add_opt(b, x, r)
    }

    /// `x` clipped to `[−clip, clip]` when `clip` is set.
    fn bound(&self, b: &mut KernelBuilder, x: ExprId) -> ExprId {
        match self.clip {
            Some(c) => {
                let (lo, hi) = (lit(b, self.ct, -c), lit(b, self.ct, c));
                clamp(b, x, lo, hi)
            }
            None => x,
        }
    }

    /// Activation `i` of direction `dir` applied to `x`.
    fn act(&self, b: &mut KernelBuilder, i: usize, dir: usize, x: ExprId) -> ExprId {
        let per = self.acts.len() / self.nd;
        self.acts[dir * per + i].apply(b, x)
    }

    /// `act_i(bound(pre))` of direction `dir`.
    fn gate(&self, b: &mut KernelBuilder, i: usize, dir: usize, pre: ExprId) -> ExprId {
        let c = self.bound(b, pre);
        self.act(b, i, dir, c)
    }

    /// A step's recurrent product of direction `dir` over `count` gates from `first`
    /// on: `S[0, b, q] = Σₖ A[b, k]·R[dir, first·hidden + q, k] + Rb[dir, first·hidden +
    /// q]`, `A` the state `a` (H, or GRU's `r ⊙ H`). None for a zero state: the step then
    /// reads no product.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        cx: &OpCx<'_>,
        steps: &mut Vec<Step>,
        name: String,
        a: State,
        dir: usize,
        first: usize,
        count: usize,
    ) -> R<Option<Product>> {
        if matches!(a, State::Zero) {
            return Ok(None);
        }
        let cols = count * self.hidden;
        let ty = tensor_ty(cx, self.ct.dtype(), vec![1, self.batch, cols])?;
        let mut binds = Binds::default();
        let aj = self.bind_state(cx, &mut binds, a)?;
        let rj = binds.add(Operand::Input(2), cx.input_ty(2)?.clone());
        let bj = if self.has_b { Some(binds.add(Operand::Input(3), cx.input_ty(3)?.clone())) } else { None };
        let (ct, hidden, gh) = (self.ct, self.hidden, self.gh());
        steps.push(build(name, ty, &binds.list, |b, idx| {
            let (d, bb, q) = (b.index(dir as i64), idx[1], idx[2]);
            let k = b.new_var(hidden as u64);
            let ke = b.var(k);
            let hv = self.state_at(b, a, aj, d, bb, ke);
            let off = b.index((first * hidden) as i64);
            let row = b.add(off, q);
            let r = ld(b, rj, vec![d, row, ke], ct);
            let p = b.mul(hv, r);
            let s = b.reduce(ReduceOp::Sum, vec![k], p);
            Ok(match bj {
                Some(bj) => {
                    let o = b.index((gh + first * hidden) as i64);
                    let q = b.add(o, q);
                    let rb = ld(b, bj, vec![d, q], ct);
                    b.add(s, rb)
                }
                None => s,
            })
        })?);
        Ok(Some(Product { step: steps.len() - 1, first, count }))
    }
}

fn add_opt(b: &mut KernelBuilder, x: ExprId, y: Option<ExprId>) -> ExprId {
    match y {
        Some(y) => b.add(x, y),
        None => x,
    }
}

/// RNN, GRU, LSTM (see the module docs).
fn recurrent(cx: &OpCx<'_>) -> R<Lowered> {
    let cell = match cx.op.kind {
        OpKind::LSTM => Cell::Lstm,
        OpKind::GRU => Cell::Gru,
        _ => Cell::Rnn,
    };
    let (xdt, ct) = float_x(cx)?;
    let ra = cx.attrs::<ka::RnnAttrs>()?;
    let batch_major = ra.layout;
    let xd = dims(cx, 0)?;
    let rd = dims(cx, 2)?;
    if xd.len() != 3 || rd.len() != 3 {
        return Err(cx.unsupported("X and R must have rank 3"));
    }
    let (seq, batch, input) = if batch_major { (xd[1], xd[0], xd[2]) } else { (xd[0], xd[1], xd[2]) };
    let direction = ra.direction;
    let nd = match direction {
        ka::RnnDirection::Forward | ka::RnnDirection::Reverse => 1,
        ka::RnnDirection::Bidirectional => 2,
    };
    let hidden = rd[2];
    if let Some(hs) = ra.hidden_size {
        if hs != hidden as i64 {
            return Err(cx.unsupported(format!("hidden_size = {hs}, R has dims {rd:?}")));
        }
    }
    let gates = match cell {
        Cell::Lstm => 4,
        Cell::Gru => 3,
        Cell::Rnn => 1,
    };
    let gh = gates * hidden;
    let expect = |i: usize, want: &[usize], what: &str| -> R<()> {
        if let Some(t) = cx.input(i) {
            if t.ty.shape.dims() != want {
                return Err(cx.unsupported(format!("{what} has dims {:?}, {want:?} expected", t.ty.shape.dims())));
            }
            if !t.ty.dtype.is_float() {
                return Err(cx.unsupported(format!("{what} must be a float")));
            }
        }
        Ok(())
    };
    expect(1, &[nd, gh, input], "W")?;
    expect(2, &[nd, gh, hidden], "R")?;
    expect(3, &[nd, 2 * gh], "B")?;
    let state_dims = if batch_major { vec![batch, nd, hidden] } else { vec![nd, batch, hidden] };
    expect(5, &state_dims, "initial_h")?;
    let lstm = cell == Cell::Lstm;
    if lstm {
        expect(6, &state_dims, "initial_c")?;
        expect(7, &[nd, 3 * hidden], "P")?;
    }
    let has_lens = match cx.input(4) {
        None => false,
        Some(t) => {
            if t.ty.shape.dims() != [batch] || !matches!(t.ty.dtype, DType::I32 | DType::I64) {
                return Err(cx.unsupported(format!("sequence_lens has type {}", t.ty)));
            }
            // Constant lengths all equal to the sequence length change nothing.
            match t.value.map(|v| v.to_i64_vec()) {
                Some(Ok(v)) => v.iter().any(|&l| l != seq as i64),
                _ => true,
            }
        }
    };
    let acts = activations(
        cx,
        match cell {
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Rnn => &["Tanh"],
        },
        nd,
    )?;
    let clip = ra.clip.map(|c| c as f64);
    if clip.is_some_and(|c| c.is_nan() || c < 0.0) {
        return Err(cx.unsupported(format!("clip = {clip:?}")));
    }
    let input_forget = lstm && ra.input_forget;
    let lbr = cell == Cell::Gru && ra.linear_before_reset;
    let nres = cx.outputs.len();
    if nres == 0 || nres > if lstm { 3 } else { 2 } {
        return Err(cx.unsupported(format!("{nres} results")));
    }
    let y_dims = if batch_major { vec![batch, seq, nd, hidden] } else { vec![seq, nd, batch, hidden] };
    for (i, ty) in cx.outputs.iter().enumerate() {
        let want = if i == 0 { &y_dims } else { &state_dims };
        if ty.shape.dims() != want.as_slice() || ty.dtype != xdt {
            return Err(cx.unsupported(format!("result {i} has type {ty}")));
        }
    }
    let rnn = Rnn {
        cell,
        ct,
        seq,
        batch,
        input,
        hidden,
        nd,
        batch_major,
        reverse_only: direction == ka::RnnDirection::Reverse,
        acts,
        clip,
        input_forget,
        lbr,
        has_b: cx.input(3).is_some(),
        has_lens,
        has_p: lstm && cx.input(7).is_some(),
        sty: tensor_ty(cx, ct.dtype(), vec![1, batch, hidden])?,
        pty: tensor_ty(cx, ct.dtype(), vec![nd, seq, batch, gh])?,
    };
    let mut steps: Vec<Step> = Vec::new();
    // An initial state that is a constant of positive zeros (an exporter's zero state,
    // a folded `ConstantOfShape`: crnn's LSTM) is the absent one: the first step's
    // products are skipped rather than read `R` to multiply it by zero.
    let init = |i: usize| match cx.input(i) {
        Some(t) if !t.value.is_some_and(|v| v.to_f64_vec().iter().all(|&x| x == 0.0 && x.is_sign_positive())) => {
            State::Init(i)
        }
        _ => State::Zero,
    };
    let init_h = init(5);
    let init_c = if lstm { init(6) } else { State::Zero };
    // Per direction: the current states, and the steps that wrote H, in step order.
    let (mut h, mut c) = (vec![init_h; nd], vec![init_c; nd]);
    let mut hs: Vec<Vec<usize>> = vec![Vec::with_capacity(seq); nd];
    if rnn.seq > 0 && rnn.sty.shape.numel() > 0 {
        steps.push(projection(cx, &rnn)?);
        for s in 0..seq {
            for dir in 0..nd {
                let at = At { s, dir };
                match cell {
                    Cell::Rnn => {
                        let k = rnn_step(cx, &rnn, &mut steps, at, h[dir])?;
                        h[dir] = State::Step(k);
                    }
                    Cell::Gru => {
                        let k = gru_step(cx, &rnn, &mut steps, at, h[dir])?;
                        h[dir] = State::Step(k);
                    }
                    Cell::Lstm => {
                        let (kc, kh) = lstm_step(cx, &rnn, &mut steps, at, h[dir], c[dir])?;
                        c[dir] = State::Step(kc);
                        h[dir] = State::Step(kh);
                    }
                }
                if let State::Step(k) = h[dir] {
                    hs[dir].push(k);
                }
            }
        }
    }
    let mut outputs = Vec::with_capacity(nres);
    let in_place = xdt == ct.dtype() && !rnn.has_lens && (!batch_major || batch == 1);
    let y = if in_place { y_in_place(cx, &rnn, &hs)? } else { y_gather(cx, &rnn, &hs)? };
    steps.push(y);
    outputs.push(Output::Step(steps.len() - 1));
    for (r, st) in [(1, &h), (2, &c)] {
        if r >= nres {
            break;
        }
        match st.as_slice() {
            // (A state inside Y is not also a graph output: Y_h is then a copy.)
            &[State::Step(k)] if !batch_major && xdt == ct.dtype() && !(in_place && r == 1) => {
                outputs.push(Output::Step(k))
            }
            _ => {
                let mut binds = Binds::default();
                let js: Vec<Option<usize>> = st.iter().map(|&x| rnn.bind_state(cx, &mut binds, x)).collect::<R<_>>()?;
                steps.push(build(result_name(cx, r), out_ty(cx, r)?.clone(), &binds.list, |b, idx| {
                    let (d, bb, k) = if batch_major { (idx[1], idx[0], idx[2]) } else { (idx[0], idx[1], idx[2]) };
                    Ok(per_direction(b, &rnn, d, |b, dir| {
                        let de = b.index(dir as i64);
                        rnn.state_at(b, st[dir], js[dir], de, bb, k)
                    }))
                })?);
                outputs.push(Output::Step(steps.len() - 1));
            }
        }
    }
    Ok(Lowered { steps, outputs })
}

/// Where a step kernel sits: its step and its direction.
#[derive(Clone, Copy)]
struct At {
    s: usize,
    dir: usize,
}

/// `value(dir)` of the direction at index `d` (a select on `d = 1` for two directions:
/// an equality, so a kernel of this form is never taken for a concatenation).
fn per_direction(
    b: &mut KernelBuilder,
    rnn: &Rnn,
    d: ExprId,
    mut value: impl FnMut(&mut KernelBuilder, usize) -> ExprId,
) -> ExprId {
    let v0 = value(b, 0);
    if rnn.nd == 1 {
        return v0;
    }
    let v1 = value(b, 1);
    let one = b.index(1);
    let rev = b.binary(B::Eq, d, one);
    sel(b, rev, v1, v0)
}

/// Step 0, the input projection of every time step and direction:
/// `P[d, t, b, q] = Σᵢ X[t, b, i]·W[d, q, i] + Wb[d, q]` (a contraction; see the
/// module docs).
fn projection(cx: &OpCx<'_>, rnn: &Rnn) -> R<Step> {
    let ct = rnn.ct;
    let mut pb = Binds::default();
    let (xj, wj) =
        (pb.add(Operand::Input(0), cx.input_ty(0)?.clone()), pb.add(Operand::Input(1), cx.input_ty(1)?.clone()));
    let bj = if rnn.has_b { Some(pb.add(Operand::Input(3), cx.input_ty(3)?.clone())) } else { None };
    build(format!("{}_xw", cx.name), rnn.pty.clone(), &pb.list, |b, idx| {
        let (d, t, bb, q) = (idx[0], idx[1], idx[2], idx[3]);
        let i = b.new_var(rnn.input as u64);
        let ie = b.var(i);
        let xix = if rnn.batch_major { vec![bb, t, ie] } else { vec![t, bb, ie] };
        let x = ld(b, xj, xix, ct);
        let w = ld(b, wj, vec![d, q, ie], ct);
        let p = b.mul(x, w);
        let s = b.reduce(ReduceOp::Sum, vec![i], p);
        Ok(match bj {
            Some(bj) => {
                let wb = ld(b, bj, vec![d, q], ct);
                b.add(s, wb)
            }
            None => s,
        })
    })
}

/// The common prologue of a gate kernel (output `[1, batch, hidden]`): the direction
/// (`dir`, and `d` its index into the operands of every direction), `(bb, j)`, the time
/// index and the running condition (whose presence also says the time index may be out
/// of range).
struct StepCx {
    dir: usize,
    d: ExprId,
    bb: ExprId,
    j: ExprId,
    t: ExprId,
    valid: Option<ExprId>,
}

fn step_cx(rnn: &Rnn, b: &mut KernelBuilder, gi: &GateIn, idx: &[ExprId], at: At) -> StepCx {
    let (bb, j) = (idx[1], idx[2]);
    let d = b.index(at.dir as i64);
    let len = rnn.len_of(b, gi.lens, bb);
    let (t, valid) = rnn.time(b, at.s, at.dir, len);
    StepCx { dir: at.dir, d, bb, j, t, valid }
}

/// `valid ? new : old`.
fn keep(b: &mut KernelBuilder, valid: Option<ExprId>, new: ExprId, old: ExprId) -> ExprId {
    match valid {
        Some(v) => sel(b, v, new, old),
        None => new,
    }
}

/// One RNN step: the product `H·Rᵀ + Rb`, then `H = f(clip(P + S))`.
fn rnn_step(cx: &OpCx<'_>, rnn: &Rnn, steps: &mut Vec<Step>, at: At, h: State) -> R<usize> {
    let n = step_name(rnn, at);
    let prod = rnn.product(cx, steps, format!("{}_hr{n}", cx.name), h, at.dir, 0, 1)?;
    gate_and_state(cx, rnn, steps, format!("{}_h{n}", cx.name), at, prod, h, 0, |b, sc, new, old| {
        keep(b, sc.valid, new, old)
    })
}

/// The kernel name suffix of a step: `s`, or `s_d` for a direction of a bidirectional
/// layer.
fn step_name(rnn: &Rnn, at: At) -> String {
    if rnn.nd == 2 {
        format!("{}_{}", at.s, at.dir)
    } else {
        at.s.to_string()
    }
}

/// A step kernel `name` of one gate (block `k` of the product, the first activation)
/// and the state `h`: `combine(b, sc, gate, state)`. Its step's index.
#[allow(clippy::too_many_arguments)]
fn gate_and_state(
    cx: &OpCx<'_>,
    rnn: &Rnn,
    steps: &mut Vec<Step>,
    name: String,
    at: At,
    prod: Option<Product>,
    h: State,
    k: usize,
    combine: impl Fn(&mut KernelBuilder, &StepCx, ExprId, ExprId) -> ExprId,
) -> R<usize> {
    let (mut binds, gi, rec) = rnn.step_binds(cx, prod)?;
    let hj = rnn.bind_state(cx, &mut binds, h)?;
    steps.push(build(name, rnn.sty.clone(), &binds.list, |b, idx| {
        let sc = step_cx(rnn, b, &gi, idx, at);
        let pre = rnn.pre(b, &gi, rec, &sc, k);
        let gate = rnn.gate(b, 0, sc.dir, pre);
        let state = rnn.state_at(b, h, hj, sc.d, sc.bb, sc.j);
        Ok(combine(b, &sc, gate, state))
    })?);
    Ok(steps.len() - 1)
}

/// One GRU step (gates z, r, h). With `linear_before_reset`: the product over all
/// three gates, then `h̃ = g(clip(P_h + r·S_h))`. Without: the product over z and r,
/// `r ⊙ H`, its product with `R_h`, then `h̃ = g(clip(P_h + S'_h))`.
/// `H' = (1 − z)·h̃ + z·H`.
fn gru_step(cx: &OpCx<'_>, rnn: &Rnn, steps: &mut Vec<Step>, at: At, h: State) -> R<usize> {
    let ct = rnn.ct;
    let n = step_name(rnn, at);
    let prod = rnn.product(cx, steps, format!("{}_hr{n}", cx.name), h, at.dir, 0, if rnn.lbr { 3 } else { 2 })?;
    let mut h_prod: Option<Product> = None;
    if !rnn.lbr && prod.is_some() {
        // r ⊙ H.
        let rh =
            gate_and_state(cx, rnn, steps, format!("{}_rh{n}", cx.name), at, prod, h, 1, |b, _, r, hv| b.mul(r, hv))?;
        h_prod = rnn.product(cx, steps, format!("{}_rhr{n}", cx.name), State::Step(rh), at.dir, 2, 1)?;
    }
    let (mut binds, gi, rec) = rnn.step_binds(cx, prod)?;
    let hrec = match h_prod {
        Some(p) => Some(rnn.bind_rec(cx, &mut binds, Some(p))?),
        None => None,
    };
    let hj = rnn.bind_state(cx, &mut binds, h)?;
    steps.push(build(format!("{}_h{n}", cx.name), rnn.sty.clone(), &binds.list, |b, idx| {
        let sc = step_cx(rnn, b, &gi, idx, at);
        let pz = rnn.pre(b, &gi, rec, &sc, 0);
        let z = rnn.gate(b, 0, sc.dir, pz);
        let xh = rnn.xpart(b, &gi, &sc, 2);
        let pre = if rnn.lbr {
            let pr = rnn.pre(b, &gi, rec, &sc, 1);
            let r = rnn.gate(b, 0, sc.dir, pr);
            // xw_h (with Wb) + r·(H·R_hᵀ + Rb_h).
            match rnn.rec(b, rec, &sc, 2) {
                Some(hp) => {
                    let m = b.mul(r, hp);
                    b.add(xh, m)
                }
                None => xh,
            }
        } else {
            // xw_h + (r ⊙ H)·R_hᵀ + Rb_h (just Rb_h for a zero state).
            let hp = rnn.rec(b, hrec.unwrap_or(rec), &sc, 2);
            add_opt(b, xh, hp)
        };
        let ht = rnn.gate(b, 1, sc.dir, pre);
        let hv = rnn.state_at(b, h, hj, sc.d, sc.bb, sc.j);
        let one = lit(b, ct, 1.0);
        let omz = b.sub(one, z);
        let a = b.mul(omz, ht);
        let zh = b.mul(z, hv);
        let new = b.add(a, zh);
        Ok(keep(b, sc.valid, new, hv))
    })?);
    Ok(steps.len() - 1)
}

/// One LSTM step (gates i, o, f, c; peepholes i, o, f): the product over all four
/// gates, then C' = f·C + i·c̃ and H' = o·h(C') (o's peephole on C'), each a kernel.
fn lstm_step(cx: &OpCx<'_>, rnn: &Rnn, steps: &mut Vec<Step>, at: At, h: State, c: State) -> R<(usize, usize)> {
    let ct = rnn.ct;
    let peep = |b: &mut KernelBuilder, gi: &GateIn, d: ExprId, j: ExprId, which: usize, cv: ExprId| -> Option<ExprId> {
        gi.p.map(|pj| {
            let o = b.index((which * rnn.hidden) as i64);
            let q = b.add(o, j);
            let p = ld(b, pj, vec![d, q], ct);
            b.mul(p, cv)
        })
    };
    let n = step_name(rnn, at);
    let prod = rnn.product(cx, steps, format!("{}_hr{n}", cx.name), h, at.dir, 0, 4)?;
    // The cell state.
    let (mut binds, gi, rec) = rnn.step_binds(cx, prod)?;
    let cj = rnn.bind_state(cx, &mut binds, c)?;
    steps.push(build(format!("{}_c{n}", cx.name), rnn.sty.clone(), &binds.list, |b, idx| {
        let sc = step_cx(rnn, b, &gi, idx, at);
        let cp = rnn.state_at(b, c, cj, sc.d, sc.bb, sc.j);
        let pi = rnn.pre(b, &gi, rec, &sc, 0);
        let pih = peep(b, &gi, sc.d, sc.j, 0, cp);
        let pi = add_opt(b, pi, pih);
        let i = rnn.gate(b, 0, sc.dir, pi);
        let f = if rnn.input_forget {
            let one = lit(b, ct, 1.0);
            b.sub(one, i)
        } else {
            let pf = rnn.pre(b, &gi, rec, &sc, 2);
            let pfh = peep(b, &gi, sc.d, sc.j, 2, cp);
            let pf = add_opt(b, pf, pfh);
            rnn.gate(b, 0, sc.dir, pf)
        };
        let pc = rnn.pre(b, &gi, rec, &sc, 3);
        let cand = rnn.gate(b, 1, sc.dir, pc);
        let fc = b.mul(f, cp);
        let ic = b.mul(i, cand);
        let new = b.add(fc, ic);
        Ok(keep(b, sc.valid, new, cp))
    })?);
    let kc = steps.len() - 1;
    // The hidden state, from the new cell state.
    let (mut binds, gi, rec) = rnn.step_binds(cx, prod)?;
    let hj = rnn.bind_state(cx, &mut binds, h)?;
    let cn = binds.add(Operand::Step(kc), rnn.sty.clone());
    steps.push(build(format!("{}_h{n}", cx.name), rnn.sty.clone(), &binds.list, |b, idx| {
        let sc = step_cx(rnn, b, &gi, idx, at);
        let zero = b.index(0);
        let cv = b.load(cn, vec![zero, sc.bb, sc.j]);
        let po = rnn.pre(b, &gi, rec, &sc, 1);
        let poh = peep(b, &gi, sc.d, sc.j, 1, cv);
        let po = add_opt(b, po, poh);
        let o = rnn.gate(b, 0, sc.dir, po);
        let hc = rnn.act(b, 2, sc.dir, cv);
        let new = b.mul(o, hc);
        let old = rnn.state_at(b, h, hj, sc.d, sc.bb, sc.j);
        Ok(keep(b, sc.valid, new, old))
    })?);
    Ok((kc, steps.len() - 1))
}

/// Y as a concatenation of the states in place (see the module docs): a kernel over
/// `[seq·num_dir, batch, hidden]` whose block `t·num_dir + d` is the state direction `d`
/// wrote at time `t` (a select chain on `v₀ < end`, each branch a whole state, whose
/// one position along `v₀` is `v₀ − start` = 0), which the op's result Y views with its
/// own shape (time-major, or `[1, seq, num_dir, hidden]`: the same bytes). Needs every
/// step (no `sequence_lens`).
fn y_in_place(cx: &OpCx<'_>, rnn: &Rnn, hs: &[Vec<usize>]) -> R<Step> {
    let (seq, nd) = (rnn.seq, rnn.nd);
    if hs.iter().any(|h| h.len() != seq) {
        return y_gather(cx, rnn, hs);
    }
    let ty = tensor_ty(cx, out_ty(cx, 0)?.dtype, vec![seq * nd, rnn.batch, rnn.hidden])?;
    let mut binds = Binds::default();
    // Block t·nd + d: the step of direction d at time t.
    let mut blocks: Vec<usize> = Vec::with_capacity(seq * nd);
    for t in 0..seq {
        for (dir, h) in hs.iter().enumerate() {
            let s = if rnn.reversed(dir) { seq - 1 - t } else { t };
            blocks.push(binds.add(Operand::Step(h[s]), rnn.sty.clone()));
        }
    }
    build(result_name(cx, 0), ty, &binds.list, |b, idx| {
        let (v, bb, j) = (idx[0], idx[1], idx[2]);
        let Some((&last, rest)) = blocks.split_last() else {
            return Err(cx.unsupported("no time steps for a non-empty Y"));
        };
        // (A block's one position along v₀ is 0 = v₀ − start wherever it is read.)
        let zero = b.index(0);
        let mut y = b.load(last, vec![zero, bb, j]);
        for (start, &input) in rest.iter().enumerate().rev() {
            let x = b.load(input, vec![zero, bb, j]);
            let end = b.index(start as i64 + 1);
            let here = b.binary(B::Lt, v, end);
            y = sel(b, here, x, y);
        }
        Ok(y)
    })
}

/// Y: for each time position and direction, the state of the step that wrote it (a
/// select over the steps), zero past a row's length.
fn y_gather(cx: &OpCx<'_>, rnn: &Rnn, hs: &[Vec<usize>]) -> R<Step> {
    let out = out_ty(cx, 0)?.clone();
    let mut binds = Binds::default();
    let inputs: Vec<Vec<usize>> =
        hs.iter().map(|h| h.iter().map(|&k| binds.add(Operand::Step(k), rnn.sty.clone())).collect()).collect();
    let lens = if rnn.has_lens { Some(binds.add(Operand::Input(4), cx.input_ty(4)?.clone())) } else { None };
    build(result_name(cx, 0), out, &binds.list, |b, idx| {
        let (t, d, bb, j) =
            if rnn.batch_major { (idx[1], idx[2], idx[0], idx[3]) } else { (idx[0], idx[1], idx[2], idx[3]) };
        let len = rnn.len_of(b, lens, bb);
        let zero = b.index(0);
        let mut err = None;
        let v = per_direction(b, rnn, d, |b, dir| {
            // The step that wrote time t: t forwards, len − 1 − t backwards.
            let step = if rnn.reversed(dir) {
                let last = match len {
                    Some(l) => {
                        let one = b.index(1);
                        b.sub(l, one)
                    }
                    None => b.index(rnn.seq as i64 - 1),
                };
                b.sub(last, t)
            } else {
                t
            };
            let Some((&base, rest)) = inputs[dir].split_last() else {
                err = Some(cx.unsupported("no time steps for a non-empty Y"));
                return zero;
            };
            let mut v = b.load(base, vec![zero, bb, j]);
            for (s, &k) in rest.iter().enumerate().rev() {
                let x = b.load(k, vec![zero, bb, j]);
                let se = b.index(s as i64);
                let hit = b.binary(B::Eq, step, se);
                v = sel(b, hit, x, v);
            }
            v
        });
        if let Some(e) = err {
            return Err(e);
        }
        Ok(match len {
            Some(l) => {
                let valid = b.binary(B::Lt, t, l);
                let zero = lit(b, rnn.ct, 0.0);
                sel(b, valid, v, zero)
            }
            None => v,
        })
    })
}
