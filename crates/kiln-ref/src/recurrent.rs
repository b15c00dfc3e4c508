//! Recurrent layers: LSTM, GRU and RNN, with every ONNX option: directions
//! forward/reverse/bidirectional, `activations` with `activation_alpha`/`beta`,
//! `clip`, `layout` 0/1, `sequence_lens`, initial states, LSTM peepholes and
//! `input_forget`, GRU `linear_before_reset`.
//!
//! The input projection `X·Wᵀ` of all time steps is one [`gemm_acc`] per
//! direction; each step adds `H·Rᵀ` (another product over the whole batch) and
//! applies the gate equations per batch row in `f64`.
//!
//! Choices where ONNX is loose:
//! - `activation_alpha`/`activation_beta` are consumed in order by the functions
//!   that take them (LeakyRelu, ThresholdedRelu, Elu: alpha; Affine, ScaledTanh,
//!   HardSigmoid: alpha and beta); when the lists run out, the ONNX defaults apply.
//!   An `activations` list for one direction is reused for the reverse one.
//! - `clip` bounds every gate's pre-activation (LSTM i, f, c, o; GRU z, r, h; RNN),
//!   not the cell state passed to `h`.
//! - `input_forget = 1` couples the gates as `f = 1 − i`.
//! - With `sequence_lens`, a reverse pass of batch row `b` starts at step
//!   `len_b − 1`; Y is zero past `len_b`; Y_h/Y_c hold the state after the last
//!   valid step (the initial state when `len_b = 0`).

use crate::elementwise::write_f64;
use crate::linalg::{floats, gemm_acc, transpose};
use crate::util::Cx;
use crate::EvalError;
use kiln_ir::attrs::{RnnAttrs, RnnDirection};
use kiln_ir::{OpKind, Tensor, TensorType};

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    match cx.kind() {
        OpKind::LSTM | OpKind::GRU | OpKind::RNN => run(cx),
        _ => Err(cx.unsupported("not a recurrent layer")),
    }
}

// ---------------------------------------------------------------------------
// Activation functions.
// ---------------------------------------------------------------------------

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
    fn apply(self, x: f64) -> f64 {
        match self {
            Act::Relu => x.max(0.0),
            Act::Tanh => x.tanh(),
            Act::Sigmoid => crate::elementwise::sigmoid(x),
            Act::Affine(a, b) => a * x + b,
            Act::LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            Act::ThresholdedRelu(a) => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            Act::ScaledTanh(a, b) => a * (b * x).tanh(),
            Act::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            Act::Elu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * (x.exp() - 1.0)
                }
            }
            Act::Softsign => x / (1.0 + x.abs()),
            Act::Softplus => crate::elementwise::softplus(x),
        }
    }
}

/// The activations: `per_dir` per direction, `num_dir` directions.
fn activations(cx: &Cx, defaults: &[&str], num_dir: usize) -> Result<Vec<Act>, EvalError> {
    let ra = cx.attrs::<RnnAttrs>()?;
    let names: Vec<String> = match &ra.activations {
        Some(v) if !v.is_empty() => v.clone(),
        _ => defaults.iter().map(|s| s.to_string()).collect(),
    };
    let per_dir = defaults.len();
    let names: Vec<String> = if names.len() == per_dir * num_dir {
        names
    } else if names.len() == per_dir {
        names.iter().cycle().take(per_dir * num_dir).cloned().collect()
    } else {
        return Err(cx.invalid(format!(
            "{} activations, {} expected ({per_dir} per direction)",
            names.len(),
            per_dir * num_dir
        )));
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

// ---------------------------------------------------------------------------
// Shared driver.
// ---------------------------------------------------------------------------

/// Which layer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cell {
    Lstm,
    Gru,
    Rnn,
}

impl Cell {
    /// Gates stacked in W, R (and half of B).
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }
}

/// A float operand of exactly `dims`.
fn operand(cx: &Cx, i: usize, dims: &[usize], what: &str) -> Result<Option<Vec<f64>>, EvalError> {
    let Some(t) = cx.opt_input(i) else { return Ok(None) };
    if t.shape().dims() != dims {
        return Err(cx.invalid(format!("{what} has shape {:?}, {dims:?} expected", t.shape().dims())));
    }
    Ok(Some(floats(cx, t)?))
}

fn check_out(cx: &Cx, ty: &TensorType, dims: &[usize]) -> Result<(), EvalError> {
    if ty.shape.dims() != dims {
        return Err(cx.invalid(format!("result shape {dims:?} expected, result type says {ty}")));
    }
    Ok(())
}

fn run(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let cell = match cx.kind() {
        OpKind::LSTM => Cell::Lstm,
        OpKind::GRU => Cell::Gru,
        _ => Cell::Rnn,
    };
    let ra = cx.attrs::<RnnAttrs>()?;
    let g = cell.gates();
    let x = cx.input(0)?;
    cx.input(1)?; // W is required (read below with its shape checked).
    let r = cx.input(2)?;
    let layout = ra.layout as usize;
    let xd = x.shape().dims();
    if xd.len() != 3 {
        return Err(cx.invalid(format!("X has shape {xd:?}, rank 3 expected")));
    }
    let (seq, batch, input) = if layout == 0 { (xd[0], xd[1], xd[2]) } else { (xd[1], xd[0], xd[2]) };
    let num_dir = match ra.direction {
        RnnDirection::Forward | RnnDirection::Reverse => 1,
        RnnDirection::Bidirectional => 2,
    };
    let reverse_only = ra.direction == RnnDirection::Reverse;
    let rd = r.shape().dims();
    if rd.len() != 3 {
        return Err(cx.invalid(format!("R has shape {rd:?}, rank 3 expected")));
    }
    let hidden = rd[2];
    if let Some(hs) = ra.hidden_size {
        if hs != hidden as i64 {
            return Err(cx.invalid(format!("hidden_size = {hs}, R has shape {rd:?}")));
        }
    }
    let gh = g * hidden;
    let wv = operand(cx, 1, &[num_dir, gh, input], "W")?.unwrap_or_default();
    let rv = operand(cx, 2, &[num_dir, gh, hidden], "R")?.unwrap_or_default();
    let bv = operand(cx, 3, &[num_dir, 2 * gh], "B")?.unwrap_or_else(|| vec![0.0; num_dir * 2 * gh]);
    let lens: Vec<usize> = match cx.opt_input(4) {
        None => vec![seq; batch],
        Some(_) => {
            let v = cx.ints(4)?;
            if v.len() != batch || v.iter().any(|&l| l < 0 || l as usize > seq) {
                return Err(cx.invalid(format!("sequence_lens {v:?} for batch {batch}, {seq} steps")));
            }
            v.into_iter().map(|l| l as usize).collect()
        }
    };
    // Initial states in [num_dir, batch, hidden] order.
    let state_dims = if layout == 0 { [num_dir, batch, hidden] } else { [batch, num_dir, hidden] };
    let to_dir_major = |v: Vec<f64>| if layout == 0 { v } else { swap01(&v, batch, num_dir, hidden) };
    let h0 = operand(cx, 5, &state_dims, "initial_h")?.map(to_dir_major);
    let (c0, peep) = if cell == Cell::Lstm {
        (operand(cx, 6, &state_dims, "initial_c")?.map(to_dir_major), operand(cx, 7, &[num_dir, 3 * hidden], "P")?)
    } else {
        (None, None)
    };
    let acts = activations(
        cx,
        match cell {
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Rnn => &["Tanh"],
        },
        num_dir,
    )?;
    let clip = ra.clip.map(|c| c as f64);
    if clip.is_some_and(|c| c.is_nan() || c < 0.0) {
        return Err(cx.invalid(format!("clip = {clip:?}")));
    }
    let (input_forget, lbr) = (ra.input_forget, ra.linear_before_reset);
    // The result types, checked before any work of their size.
    let n_out = cx.out_types.len();
    if n_out > if cell == Cell::Lstm { 3 } else { 2 } {
        return Err(cx.invalid(format!("{n_out} results requested")));
    }
    let y_dims = if layout == 0 { [seq, num_dir, batch, hidden] } else { [batch, seq, num_dir, hidden] };
    for i in 0..n_out {
        check_out(cx, cx.out_type(i)?, if i == 0 { &y_dims[..] } else { &state_dims[..] })?;
    }
    let work = [seq, batch, gh.max(num_dir * hidden)].iter().try_fold(1usize, |a, &b| a.checked_mul(b));
    if work.is_none_or(|w| w > kiln_ir::shape::MAX_ELEMENTS) {
        return Err(cx.invalid(format!("{seq} steps × batch {batch} × {gh} gates is too large")));
    }
    // X in [seq, batch, input] order.
    let xv = floats(cx, x)?;
    let xv = if layout == 0 { xv } else { swap01(&xv, batch, seq, input) };

    let mut y = vec![0.0; seq * num_dir * batch * hidden]; // [seq, num_dir, batch, hidden]
    let mut yh = vec![0.0; num_dir * batch * hidden];
    let mut yc = vec![0.0; num_dir * batch * hidden];
    let per_dir = acts.len() / num_dir;
    for d in 0..num_dir {
        let reverse = reverse_only || d == 1;
        let wt = transpose(&wv[d * gh * input..(d + 1) * gh * input], gh, input); // [input, gh]
        let rt = transpose(&rv[d * gh * hidden..(d + 1) * gh * hidden], gh, hidden); // [hidden, gh]
        let (wb, rb) = (&bv[d * 2 * gh..d * 2 * gh + gh], &bv[d * 2 * gh + gh..(d + 1) * 2 * gh]);
        // X·Wᵀ + Wb for every step and batch row: [seq·batch, gh].
        let mut xw = vec![0.0; seq * batch * gh];
        for row in xw.chunks_exact_mut(gh.max(1)) {
            row.copy_from_slice(wb);
        }
        gemm_acc(seq * batch, gh, input, &xv, input, &wt, gh, &mut xw, gh);
        let mut h = match &h0 {
            Some(v) => v[d * batch * hidden..(d + 1) * batch * hidden].to_vec(),
            None => vec![0.0; batch * hidden],
        };
        let mut c = match &c0 {
            Some(v) => v[d * batch * hidden..(d + 1) * batch * hidden].to_vec(),
            None => vec![0.0; batch * hidden],
        };
        let p = peep.as_ref().map(|p| &p[d * 3 * hidden..(d + 1) * 3 * hidden]);
        let act = &acts[d * per_dir..(d + 1) * per_dir];
        let mut hr = vec![0.0; batch * gh];
        let mut rh = vec![0.0; batch * hidden];
        let mut rh_r = vec![0.0; batch * hidden];
        for step in 0..seq {
            // H·Rᵀ for the whole batch (rows past their length are not used).
            hr.fill(0.0);
            gemm_acc(batch, gh, hidden, &h, hidden, &rt, gh, &mut hr, gh);
            if cell == Cell::Gru && !lbr {
                // (r ⊙ H)·Rhᵀ needs r first.
                for b in 0..batch {
                    let Some((_, xr, hrb)) = step_row(&xw, &hr, b, batch, lens[b], step, reverse, gh) else {
                        continue;
                    };
                    for j in 0..hidden {
                        let pre = bound(xr[hidden + j] + hrb[hidden + j] + rb[hidden + j], clip);
                        rh[b * hidden + j] = act[0].apply(pre) * h[b * hidden + j];
                    }
                }
                rh_r.fill(0.0);
                gemm_acc(batch, hidden, hidden, &rh, hidden, &rt[2 * hidden..], gh, &mut rh_r, hidden);
            }
            for b in 0..batch {
                let Some((t, xr, hrb)) = step_row(&xw, &hr, b, batch, lens[b], step, reverse, gh) else {
                    continue;
                };
                let hb = &mut h[b * hidden..(b + 1) * hidden];
                let cb = &mut c[b * hidden..(b + 1) * hidden];
                for j in 0..hidden {
                    let pre = |gate: usize| xr[gate * hidden + j] + hrb[gate * hidden + j] + rb[gate * hidden + j];
                    match cell {
                        Cell::Lstm => {
                            // Gate order i, o, f, c; peepholes i, o, f.
                            let (pi, po, pf) = p.map_or((0.0, 0.0, 0.0), |p| (p[j], p[hidden + j], p[2 * hidden + j]));
                            let i = act[0].apply(bound(pre(0) + pi * cb[j], clip));
                            let f = if input_forget { 1.0 - i } else { act[0].apply(bound(pre(2) + pf * cb[j], clip)) };
                            let ct = act[1].apply(bound(pre(3), clip));
                            let cn = f * cb[j] + i * ct;
                            let o = act[0].apply(bound(pre(1) + po * cn, clip));
                            cb[j] = cn;
                            hb[j] = o * act[2].apply(cn);
                        }
                        Cell::Gru => {
                            // Gate order z, r, h.
                            let z = act[0].apply(bound(pre(0), clip));
                            let ht = if lbr {
                                let r = act[0].apply(bound(pre(1), clip));
                                let hpart = hrb[2 * hidden + j] + rb[2 * hidden + j];
                                act[1].apply(bound(xr[2 * hidden + j] + r * hpart, clip))
                            } else {
                                act[1]
                                    .apply(bound(xr[2 * hidden + j] + rh_r[b * hidden + j] + rb[2 * hidden + j], clip))
                            };
                            hb[j] = (1.0 - z) * ht + z * hb[j];
                        }
                        Cell::Rnn => hb[j] = act[0].apply(bound(pre(0), clip)),
                    }
                }
                let dst = ((t * num_dir + d) * batch + b) * hidden;
                y[dst..dst + hidden].copy_from_slice(hb);
            }
        }
        yh[d * batch * hidden..(d + 1) * batch * hidden].copy_from_slice(&h);
        yc[d * batch * hidden..(d + 1) * batch * hidden].copy_from_slice(&c);
    }

    let mut outs = Vec::new();
    if n_out > 0 {
        let ty = cx.out_type(0)?;
        let v = if layout == 0 {
            y
        } else {
            // [seq, num_dir, batch, hidden] → [batch, seq, num_dir, hidden].
            let mut t = vec![0.0; y.len()];
            for s in 0..seq {
                for dd in 0..num_dir {
                    for b in 0..batch {
                        let src = ((s * num_dir + dd) * batch + b) * hidden;
                        let dst = ((b * seq + s) * num_dir + dd) * hidden;
                        t[dst..dst + hidden].copy_from_slice(&y[src..src + hidden]);
                    }
                }
            }
            t
        };
        outs.push(write_f64(cx, ty, &v)?);
    }
    for (i, v) in [(1, yh), (2, yc)] {
        if n_out > i {
            let ty = cx.out_type(i)?;
            let v = if layout == 0 { v } else { swap01(&v, num_dir, batch, hidden) };
            outs.push(write_f64(cx, ty, &v)?);
        }
    }
    Ok(outs)
}

/// `x` clipped to `[−c, c]` when a clip is set.
fn bound(x: f64, clip: Option<f64>) -> f64 {
    match clip {
        Some(c) => x.clamp(-c, c),
        None => x,
    }
}

/// `[a, b, n]` → `[b, a, n]`.
fn swap01(v: &[f64], a: usize, b: usize, n: usize) -> Vec<f64> {
    let mut t = vec![0.0; v.len()];
    for i in 0..a {
        for j in 0..b {
            t[(j * a + i) * n..(j * a + i + 1) * n].copy_from_slice(&v[(i * b + j) * n..(i * b + j + 1) * n]);
        }
    }
    t
}

/// What batch row `b` reads at `step`: the time it is at (counting down from its
/// sequence's end, `len`, when `reverse`), its row of X·Wᵀ + Wb there and its row of
/// H·Rᵀ (`gh` wide each); None once its sequence has ended.
#[allow(clippy::too_many_arguments)]
fn step_row<'v>(
    xw: &'v [f64],
    hr: &'v [f64],
    b: usize,
    batch: usize,
    len: usize,
    step: usize,
    reverse: bool,
    gh: usize,
) -> Option<(usize, &'v [f64], &'v [f64])> {
    if step >= len {
        return None;
    }
    let t = if reverse { len - 1 - step } else { step };
    let xr = &xw[(t * batch + b) * gh..(t * batch + b + 1) * gh];
    Some((t, xr, &hr[b * gh..(b + 1) * gh]))
}
