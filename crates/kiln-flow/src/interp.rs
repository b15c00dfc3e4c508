//! A direct evaluator of [`Kernel`]s: the executable specification that lowerings and
//! code generators are tested against. It follows the module docs of [`crate::kernel`]
//! literally (f32 arithmetic in f32, transcendentals from `libm`), one element at a time.

use kiln_ir::{lowp, DType, Shape, Tensor, TensorType};

use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, KernelError, ReduceOp, ScalarType, UnaryOp};

/// Why a kernel cannot be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// The kernel is malformed.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// Inputs do not match the kernel's signature.
    #[error("kernel {kernel}: input {input} is {got}, the kernel takes {want}")]
    Input {
        /// Kernel name.
        kernel: String,
        /// Input number.
        input: usize,
        /// What was passed.
        got: String,
        /// What the kernel declares.
        want: String,
    },
}

/// Evaluates `kernel` on `inputs`.
pub fn run(kernel: &Kernel, inputs: &[&Tensor]) -> Result<Tensor, InterpError> {
    kernel.verify()?;
    if inputs.len() != kernel.inputs.len() {
        return Err(InterpError::Input {
            kernel: kernel.name.clone(),
            input: inputs.len(),
            got: format!("{} inputs", inputs.len()),
            want: format!("{} inputs", kernel.inputs.len()),
        });
    }
    let mut data = Vec::with_capacity(inputs.len());
    for (i, (t, want)) in inputs.iter().zip(&kernel.inputs).enumerate() {
        if t.ty() != want {
            return Err(InterpError::Input {
                kernel: kernel.name.clone(),
                input: i,
                got: t.ty().to_string(),
                want: want.to_string(),
            });
        }
        data.push(decode(t));
    }
    let n = kernel.nodes.len();
    // Nodes that depend on each reduce's own variables, re-evaluated per iteration.
    let free = kernel.free_vars();
    let mut ev = Eval { k: kernel, data, env: vec![0; kernel.vars.len()], cache: vec![None; n], free };
    if let Some(sc) = &kernel.scatter {
        // The output starts as input 0 (the verifier checked their types); the points
        // store in row-major order, a position outside the output storing nothing.
        let mut out = ev.data[0].clone();
        let domain: Vec<usize> = kernel.vars[..sc.rank].iter().map(|&d| d as usize).collect();
        let ct = ev.k.node(kernel.root).ty;
        let points: usize = domain.iter().product();
        let mut idx = vec![0usize; domain.len()];
        for _ in 0..points {
            for (d, &i) in idx.iter().enumerate() {
                ev.env[d] = i as i64;
            }
            ev.cache.iter_mut().for_each(|c| *c = None);
            let p = ev.eval(sc.at) as i64;
            if p >= 0 && (p as u64) < out.len() as u64 {
                let v = ev.eval(kernel.root);
                let p = p as usize;
                out[p] = match sc.combine {
                    Some(op) => binary(op, ct, out[p], v),
                    None => v,
                };
            }
            for d in (0..domain.len()).rev() {
                idx[d] += 1;
                if idx[d] < domain[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        return Ok(encode(&kernel.output, &out));
    }
    let shape = kernel.output.shape.dims().to_vec();
    let numel: usize = shape.iter().product();
    let mut out = Vec::with_capacity(numel);
    let mut idx = vec![0usize; shape.len()];
    // From one element to the next (row-major) the output variables from some axis `d`
    // on change: forget only the nodes that read one of them (`stale[d]`), so a value
    // that depends on the row alone (an attention row's maximum and sum over its keys)
    // is computed once a row, not once an element. (The same values: nodes are pure.)
    let rank = shape.len();
    let stale: Vec<Vec<usize>> = (0..rank)
        .map(|d| (0..n).filter(|&i| ev.free[i].iter().any(|&v| (v as usize) >= d && (v as usize) < rank)).collect())
        .collect();
    let mut from = 0;
    for _ in 0..numel {
        for (d, &i) in idx.iter().enumerate().skip(from) {
            ev.env[d] = i as i64;
        }
        if let Some(nodes) = stale.get(from) {
            for &i in nodes {
                ev.cache[i] = None;
            }
        }
        out.push(ev.eval(kernel.root));
        for d in (0..rank).rev() {
            idx[d] += 1;
            from = d;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(encode(&kernel.output, &out))
}

/// A node of a kernel evaluated at chosen values of the kernel's variables (those of
/// reductions inside it are iterated as usual): what a code generator tabulates at
/// compile time. Only nodes that read no input are taken.
pub struct NodeEval<'a> {
    ev: Eval<'a>,
    e: ExprId,
}

impl<'a> NodeEval<'a> {
    /// Node `e` of `k`, or `None` when it reads an input.
    pub fn new(k: &'a Kernel, e: ExprId) -> Option<NodeEval<'a>> {
        if e.index() >= k.nodes.len() || k.reads_an_input(e) {
            return None;
        }
        let n = k.nodes.len();
        let ev = Eval { k, data: Vec::new(), env: vec![0; k.vars.len()], cache: vec![None; n], free: k.free_vars() };
        Some(NodeEval { ev, e })
    }

    /// The node's value, as bits of its type, where variable `v` holds `env[v]` (those
    /// past `env`'s end hold 0).
    pub fn at(&mut self, env: &[i64]) -> u64 {
        for (i, slot) in self.ev.env.iter_mut().enumerate() {
            *slot = env.get(i).copied().unwrap_or(0);
        }
        self.ev.cache.iter_mut().for_each(|c| *c = None);
        self.ev.eval(self.e)
    }
}

/// Values of a tensor as bits of its compute type.
/// The elements of `t` as bits of their compute type ([`ScalarType::of_storage`]): what
/// a kernel's load of `t` reads.
pub fn decode(t: &Tensor) -> Vec<u64> {
    let ct = ScalarType::of_storage(t.dtype());
    match ct {
        ScalarType::F32 => t.to_f64_vec().into_iter().map(|x| (x as f32).to_bits() as u64).collect(),
        ScalarType::F64 => t.to_f64_vec().into_iter().map(f64::to_bits).collect(),
        _ => t.to_i64_vec().unwrap_or_default().into_iter().map(|x| ct.wrap(x as u64)).collect(),
    }
}

fn encode(ty: &TensorType, v: &[u64]) -> Tensor {
    let ct = ScalarType::of_storage(ty.dtype);
    let shape: Shape = ty.shape.clone();
    let r = match ct {
        // A stored value rounds to the 8-bit float without saturating: an infinity or a
        // NaN that a non-saturating cast produced stays one.
        ScalarType::F32 if ty.dtype.is_low_precision_float() && ty.dtype.storage_bytes(1) == 1 => {
            let codes: Vec<u8> = v.iter().map(|&b| lowp::encode(ty.dtype, f32::from_bits(b as u32), false)).collect();
            Tensor::from_codes(ty.dtype, shape, &codes)
        }
        ScalarType::F32 => {
            let f: Vec<f64> = v.iter().map(|&b| f32::from_bits(b as u32) as f64).collect();
            Tensor::from_f64(ty.dtype, shape, &f)
        }
        ScalarType::F64 => {
            let f: Vec<f64> = v.iter().map(|&b| f64::from_bits(b)).collect();
            Tensor::from_f64(ty.dtype, shape, &f)
        }
        _ => {
            let i: Vec<i64> = v.iter().map(|&b| ct.to_i128(b) as i64).collect();
            Tensor::from_i64(ty.dtype, shape, &i)
        }
    };
    // The element count matches the shape by construction.
    r.unwrap_or_else(|_| Tensor::zeros(ty.clone()))
}

struct Eval<'a> {
    k: &'a Kernel,
    data: Vec<Vec<u64>>,
    env: Vec<i64>,
    cache: Vec<Option<u64>>,
    free: Vec<Vec<u32>>,
}

fn f32v(b: u64) -> f32 {
    f32::from_bits(b as u32)
}

fn f32b(x: f32) -> u64 {
    x.to_bits() as u64
}

impl Eval<'_> {
    fn eval(&mut self, e: ExprId) -> u64 {
        if let Some(v) = self.cache[e.index()] {
            return v;
        }
        let node = &self.k.nodes[e.index()];
        let ty = node.ty;
        let v = match &node.expr {
            Expr::Var(v) => self.env[v.0 as usize] as u64,
            Expr::Const(b) => *b,
            Expr::Load { input, index, bounds } => {
                let t = &self.k.inputs[*input as usize];
                let dims = t.shape.dims();
                let mut flat: usize = 0;
                let mut outside = false;
                for (d, &ie) in index.iter().enumerate() {
                    let mut i = self.eval(ie) as i64;
                    let n = dims[d] as i64;
                    if i < 0 || i >= n {
                        match bounds {
                            Bounds::Clamp => i = i.clamp(0, (n - 1).max(0)),
                            _ => outside = true,
                        }
                    }
                    if !outside {
                        flat = flat * dims[d] + i as usize;
                    }
                }
                let empty = dims.contains(&0);
                match bounds {
                    Bounds::Pad(p) if outside => *p,
                    _ if empty => 0,
                    // InBounds loads are proved in range by the verifier.
                    _ => self.data[*input as usize][flat],
                }
            }
            Expr::Unary(op, a) => {
                let at = self.k.nodes[a.index()].ty;
                let a = self.eval(*a);
                unary(*op, at, a)
            }
            Expr::Binary(op, a, b) => {
                let at = self.k.nodes[a.index()].ty;
                let (a, b) = (self.eval(*a), self.eval(*b));
                binary(*op, at, a, b)
            }
            Expr::Select(c, a, b) => {
                if self.eval(*c) != 0 {
                    self.eval(*a)
                } else {
                    self.eval(*b)
                }
            }
            Expr::Cast { value, to, saturate } => {
                let from = self.k.nodes[value.index()].ty;
                let v = self.eval(*value);
                cast(from, v, *to, *saturate)
            }
            Expr::Reduce { op, vars, body } => self.reduce(*op, ty, vars, *body),
        };
        self.cache[e.index()] = Some(v);
        v
    }

    fn reduce(&mut self, op: ReduceOp, ty: ScalarType, vars: &[crate::kernel::VarId], body: ExprId) -> u64 {
        let extents: Vec<u64> = vars.iter().map(|v| self.k.vars[v.0 as usize]).collect();
        let total: u64 = extents.iter().product();
        let bt = self.k.nodes[body.index()].ty;
        // Nodes to forget at every step: those reading any of these variables.
        let mine: Vec<usize> =
            (0..self.k.nodes.len()).filter(|&i| self.free[i].iter().any(|v| vars.iter().any(|w| w.0 == *v))).collect();
        let mut acc = match op {
            ReduceOp::Sum => zero(bt),
            ReduceOp::Prod => one(bt),
            ReduceOp::Max => lowest(bt),
            ReduceOp::Min => highest(bt),
            ReduceOp::ArgMax { .. } | ReduceOp::ArgMin { .. } => 0,
        };
        let mut best: Option<u64> = None;
        let mut pos = vec![0u64; vars.len()];
        for step in 0..total {
            for (v, &p) in vars.iter().zip(&pos) {
                self.env[v.0 as usize] = p as i64;
            }
            for &i in &mine {
                self.cache[i] = None;
            }
            let x = self.eval(body);
            match op {
                ReduceOp::Sum => acc = binary(BinaryOp::Add, bt, acc, x),
                ReduceOp::Prod => acc = binary(BinaryOp::Mul, bt, acc, x),
                ReduceOp::Max => acc = binary(BinaryOp::Max, bt, acc, x),
                ReduceOp::Min => acc = binary(BinaryOp::Min, bt, acc, x),
                ReduceOp::ArgMax { last } | ReduceOp::ArgMin { last } => {
                    let better = match best {
                        None => true,
                        Some(b) => {
                            let cmp = if matches!(op, ReduceOp::ArgMax { .. }) { BinaryOp::Gt } else { BinaryOp::Lt };
                            binary(cmp, bt, x, b) != 0 || (last && binary(BinaryOp::Eq, bt, x, b) != 0)
                        }
                    };
                    if better {
                        best = Some(x);
                        acc = step;
                    }
                }
            }
            for d in (0..pos.len()).rev() {
                pos[d] += 1;
                if pos[d] < extents[d] {
                    break;
                }
                pos[d] = 0;
            }
        }
        for &i in &mine {
            self.cache[i] = None;
        }
        ty.wrap(acc)
    }
}

fn zero(t: ScalarType) -> u64 {
    t.bits_of_i64(0)
}

fn one(t: ScalarType) -> u64 {
    t.bits_of_i64(1)
}

fn lowest(t: ScalarType) -> u64 {
    match t {
        ScalarType::F32 => f32b(f32::NEG_INFINITY),
        ScalarType::F64 => f64::NEG_INFINITY.to_bits(),
        _ => t.wrap(t.int_range().0 as u64),
    }
}

fn highest(t: ScalarType) -> u64 {
    match t {
        ScalarType::F32 => f32b(f32::INFINITY),
        ScalarType::F64 => f64::INFINITY.to_bits(),
        _ => t.wrap(t.int_range().1 as u64),
    }
}

fn float_unary(op: UnaryOp, x: f64, single: bool) -> f64 {
    macro_rules! pick {
        ($f32:ident, $f64:ident) => {
            if single {
                libm::$f32(x as f32) as f64
            } else {
                libm::$f64(x)
            }
        };
    }
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Exp => pick!(expf, exp),
        UnaryOp::Log => pick!(logf, log),
        UnaryOp::Tanh => pick!(tanhf, tanh),
        UnaryOp::Erf => pick!(erff, erf),
        UnaryOp::Sin => pick!(sinf, sin),
        UnaryOp::Cos => pick!(cosf, cos),
        UnaryOp::Tan => pick!(tanf, tan),
        UnaryOp::Asin => pick!(asinf, asin),
        UnaryOp::Acos => pick!(acosf, acos),
        UnaryOp::Atan => pick!(atanf, atan),
        UnaryOp::Sinh => pick!(sinhf, sinh),
        UnaryOp::Cosh => pick!(coshf, cosh),
        UnaryOp::Asinh => pick!(asinhf, asinh),
        // libm's acosh is finite below 1 for some inputs; the function is not defined there.
        UnaryOp::Acosh if x < 1.0 => f64::NAN,
        UnaryOp::Acosh => pick!(acoshf, acosh),
        UnaryOp::Atanh => pick!(atanhf, atanh),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Trunc => x.trunc(),
        UnaryOp::Not | UnaryOp::IsNan => f64::NAN,
    }
}

/// `op(a)` on bits of type `t` (the kernel docs' semantics).
pub fn unary(op: UnaryOp, t: ScalarType, a: u64) -> u64 {
    if op == UnaryOp::IsNan {
        return match t {
            ScalarType::F32 => f32v(a).is_nan() as u64,
            ScalarType::F64 => f64::from_bits(a).is_nan() as u64,
            _ => 0,
        };
    }
    match t {
        ScalarType::F32 => {
            let x = f32v(a);
            // Exact-in-f32 operations computed in f32; the rest through libm's f32 versions.
            let r = match op {
                UnaryOp::Neg => -x,
                UnaryOp::Abs => x.abs(),
                UnaryOp::Sqrt => x.sqrt(),
                _ => float_unary(op, x as f64, true) as f32,
            };
            f32b(r)
        }
        ScalarType::F64 => float_unary(op, f64::from_bits(a), false).to_bits(),
        ScalarType::Bool => match op {
            UnaryOp::Not => (a == 0) as u64,
            _ => a,
        },
        _ => {
            let x = t.to_i128(a);
            let r = match op {
                UnaryOp::Neg => x.wrapping_neg(),
                UnaryOp::Abs => x.abs(),
                UnaryOp::Not => !x,
                _ => x,
            };
            t.wrap(r as u64)
        }
    }
}

/// `op(a, b)` on bits of type `t`.
pub fn binary(op: BinaryOp, t: ScalarType, a: u64, b: u64) -> u64 {
    use BinaryOp as B;
    if t.is_float() {
        let (x, y) = if t == ScalarType::F32 {
            (f32v(a) as f64, f32v(b) as f64)
        } else {
            (f64::from_bits(a), f64::from_bits(b))
        };
        let single = t == ScalarType::F32;
        let cmp = |c: bool| c as u64;
        let r = match op {
            B::Eq => return cmp(x == y),
            B::Ne => return cmp(x != y),
            B::Lt => return cmp(x < y),
            B::Le => return cmp(x <= y),
            B::Gt => return cmp(x > y),
            B::Ge => return cmp(x >= y),
            B::Min | B::Max if x.is_nan() || y.is_nan() => f64::NAN,
            B::Min => x.min(y),
            B::Max => x.max(y),
            // f32 arithmetic: the f64 result of one operation on f32 operands rounds
            // to the correctly rounded f32 result for + - * / (f64 has > 2·24+2 bits).
            B::Add => x + y,
            B::Sub => x - y,
            B::Mul => x * y,
            B::Div => x / y,
            B::Rem => {
                if single {
                    libm::fmodf(x as f32, y as f32) as f64
                } else {
                    libm::fmod(x, y)
                }
            }
            B::Pow => {
                if single {
                    libm::powf(x as f32, y as f32) as f64
                } else {
                    libm::pow(x, y)
                }
            }
            B::And | B::Or | B::Xor | B::Shl | B::Shr => f64::NAN,
        };
        return if single { f32b(r as f32) } else { r.to_bits() };
    }
    let (x, y) = (t.to_i128(a), t.to_i128(b));
    let bits = t.bits() as i128;
    let r: i128 = match op {
        B::Add => x + y,
        B::Sub => x - y,
        B::Mul => x.wrapping_mul(y),
        B::Div => {
            if y == 0 {
                0
            } else {
                x / y
            }
        }
        B::Rem => {
            if y == 0 {
                0
            } else {
                x % y
            }
        }
        B::Min => x.min(y),
        B::Max => x.max(y),
        B::Eq => return (x == y) as u64,
        B::Ne => return (x != y) as u64,
        B::Lt => return (x < y) as u64,
        B::Le => return (x <= y) as u64,
        B::Gt => return (x > y) as u64,
        B::Ge => return (x >= y) as u64,
        B::And => x & y,
        B::Or => x | y,
        B::Xor => x ^ y,
        B::Shl => {
            if (0..bits).contains(&y) {
                x << y
            } else {
                0
            }
        }
        B::Shr => {
            if (0..bits).contains(&y) {
                x >> y
            } else if x < 0 {
                // Arithmetic shift of a negative value by the width or more.
                -1
            } else {
                0
            }
        }
        B::Pow => 0,
    };
    if t == ScalarType::Bool {
        return (r != 0) as u64;
    }
    t.wrap(r as u64)
}

/// Converts bits of type `from` to the values of dtype `to` (as bits of its compute type).
pub fn cast(from: ScalarType, v: u64, to: DType, saturate: bool) -> u64 {
    let ct = ScalarType::of_storage(to);
    // Wide integers round to odd on the way to f64, so the one rounding to a narrower
    // float below is correct.
    let as_f64 = |v: u64| -> f64 {
        match from {
            ScalarType::F32 => f32v(v) as f64,
            ScalarType::F64 => f64::from_bits(v),
            _ => lowp::int_to_f64_odd(from.to_i128(v)),
        }
    };
    match to {
        DType::F32 => match from {
            ScalarType::F32 => v,
            ScalarType::F64 => f32b(f64::from_bits(v) as f32),
            ScalarType::U64 => f32b(v as f32),
            _ => f32b(from.to_i128(v) as i64 as f32),
        },
        DType::F64 => match from {
            ScalarType::F32 => (f32v(v) as f64).to_bits(),
            ScalarType::F64 => v,
            ScalarType::U64 => (v as f64).to_bits(),
            _ => (from.to_i128(v) as i64 as f64).to_bits(),
        },
        DType::Bool => match from {
            ScalarType::F32 => (f32v(v) != 0.0) as u64,
            ScalarType::F64 => (f64::from_bits(v) != 0.0) as u64,
            _ => (v != 0) as u64,
        },
        // Rounded once, to nearest even, in the target format; the result is exact in f32.
        DType::F16 => f32b(lowp::round_binary(as_f64(v), 11, -14, 65504.0) as f32),
        DType::BF16 => f32b(lowp::round_binary(as_f64(v), 8, -126, lowp::BF16_MAX) as f32),
        d if d.is_low_precision_float() || matches!(d, DType::I4 | DType::U4) => {
            let x = lowp::f64_to_f32_odd(as_f64(v));
            let code = lowp::encode(d, x, saturate);
            let y = lowp::decode(d, code);
            if ct.is_float() {
                f32b(y)
            } else {
                ct.bits_of_i64(y as i64)
            }
        }
        _ => {
            // To an 8..64-bit integer.
            let r: i128 = match from {
                ScalarType::F32 | ScalarType::F64 => {
                    // Truncate to 64 bits (saturating; NaN gives 0), then wrap; a
                    // non-negative value bound for u64 saturates at u64's range.
                    let x = as_f64(v);
                    if ct == ScalarType::U64 && x >= 0.0 {
                        x as u64 as i128
                    } else {
                        x as i64 as i128
                    }
                }
                _ => from.to_i128(v),
            };
            ct.wrap(r as u64)
        }
    }
}
