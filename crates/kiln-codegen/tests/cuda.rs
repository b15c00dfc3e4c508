//! The CUDA target's PTX, kernel by kernel: every scalar type, every unary and binary
//! operation a type accepts, select, every cast between the types the emitters store,
//! loads under each bounds mode, every reduction, and both the vector (Elementwise,
//! Movement) and the general mappings — each kernel assembled by NVIDIA's
//! `ptxas -arch=sm_90a`.
//!
//! `ptxas` is `$KILN_PTXAS`, else `$KILN_TEST_DATA/tools/ptxas` (extracted by
//! scripts/setup-test-data from the `nvidia-cuda-nvcc` wheel); a missing one fails the
//! test. These tests check that the PTX is valid for Hopper and which emitter takes a
//! kernel; no GPU runs them (docs/cuda.md).

mod ptxas;
use kiln_ptxsim as ptxsim;

use ptxas::assemble_ptx;

use kiln_codegen::cuda;
use kiln_codegen::CodegenError;
use kiln_flow::class::{classify, KernelClass};
use kiln_flow::{BinaryOp, Bounds, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, TensorType};

/// Compiles `kernels` into one module and assembles it; panics with ptxas's complaint.
fn assemble(tag: &str, kernels: &[Kernel]) -> cuda::CudaModule {
    let with_class: Vec<(&Kernel, KernelClass)> = kernels.iter().map(|k| (k, classify(k))).collect();
    let m = cuda::compile(&with_class).unwrap_or_else(|e| panic!("{tag}: {e}"));
    if let Err(e) = assemble_ptx("cuda-test", tag, m.ptx()) {
        panic!("{tag}: ptxas refused the module:\n{e}");
    }
    assert_eq!(m.launches.len(), kernels.len());
    simulate(tag, kernels, &m);
    m
}

/// Runs every entry of `m` in the host PTX simulator against the kernel interpreter,
/// on plain random inputs and on inputs with NaN, ±∞ and −0: integers exactly, floats
/// within `2⁻¹⁸·|want| + (1 + L)·2⁻²⁰` (`L`: the kernel's reduction length; the
/// transcendentals use `ex2/lg2/sin/cos.approx`, simulated exactly, and the emitters'
/// own range reductions and polynomials, and sums are reassociated).
fn simulate(tag: &str, kernels: &[Kernel], m: &cuda::CudaModule) {
    for (i, k) in kernels.iter().enumerate() {
        let l = ptxsim::reduction_length(k);
        let launch = m.launches[i];
        let c = ptxsim::Check {
            tol: ptxsim::Tol::Rel { rel: 2f64.powi(-18), abs: (1 + l) as f64 * 2f64.powi(-20) },
            max_blocks: Some(3),
            ..ptxsim::Check::exact(i as u64 + 1)
        };
        let launch = ptxsim::Grid::of(launch.grid, launch.block, launch.shared);
        if let Err(e) = c.plain_and_specials(k, m.ptx(), i, launch) {
            panic!("{tag}: {e}");
        }
    }
}

fn ty(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).expect("shape"))
}

const DIMS: [usize; 2] = [3, 8];

/// `out[i, j] = f(a[i, j], b[i, j])` with inputs of dtype `d`.
fn pointwise(
    name: &str,
    d: DType,
    out: DType,
    f: impl Fn(&mut KernelBuilder, kiln_flow::ExprId, kiln_flow::ExprId) -> kiln_flow::ExprId,
) -> Kernel {
    let mut b = KernelBuilder::new(name, vec![ty(d, &DIMS), ty(d, &DIMS)], ty(out, &DIMS));
    let idx = b.out_index();
    let x = b.load(0, idx.clone());
    let y = b.load(1, idx);
    let r = f(&mut b, x, y);
    let r = b.cast(r, out, true);
    b.finish(r).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_unary_op_on_every_type_assembles() {
    let mut kernels = Vec::new();
    let mut declined = Vec::new();
    for t in ScalarType::ALL {
        for op in UnaryOp::ALL {
            if (op.float_only() && !t.is_float()) || (op == UnaryOp::Neg && t == ScalarType::Bool) {
                continue;
            }
            let name = format!("u_{}_{}", op.name(), t.name());
            let k =
                pointwise(&name, t.dtype(), if op == UnaryOp::IsNan { DType::Bool } else { t.dtype() }, |b, x, _| {
                    b.unary(op, x)
                });
            // f64 transcendentals but exp and log have no inline sequence yet: a typed
            // refusal.
            match cuda::compile(&[(&k, classify(&k))]) {
                Err(CodegenError::Unsupported { .. }) => declined.push(name),
                Err(e) => panic!("{name}: {e}"),
                Ok(_) => kernels.push(k),
            }
        }
    }
    for n in &declined {
        assert!(n.ends_with("_f64"), "{n} declined");
    }
    // Every f32 operation has its sequence; f64 exp and log too.
    for op in UnaryOp::ALL {
        let name = format!("u_{}_f32", op.name());
        assert!(kernels.iter().any(|k| k.name == name), "{name}");
    }
    for name in ["u_exp_f64", "u_log_f64"] {
        assert!(kernels.iter().any(|k| k.name == name), "{name}");
    }
    assemble("unary", &kernels);
}

#[test]
fn every_binary_op_on_every_type_assembles() {
    let mut kernels = Vec::new();
    for t in ScalarType::ALL {
        for op in BinaryOp::ALL {
            let ok = op.accepts(t);
            if !ok {
                continue;
            }
            let out = if op.is_comparison() { DType::Bool } else { t.dtype() };
            kernels.push(pointwise(&format!("b_{}_{}", op.name(), t.name()), t.dtype(), out, |b, x, y| {
                b.binary(op, x, y)
            }));
        }
    }
    assemble("binary", &kernels);
}

#[test]
fn every_cast_and_select_assembles() {
    let mut targets: Vec<DType> = ScalarType::ALL.iter().map(|t| t.dtype()).collect();
    targets.extend([DType::F16, DType::BF16]);
    let mut kernels = Vec::new();
    for &from in &targets {
        for &to in &targets {
            kernels
                .push(pointwise(&format!("c_{}_{}", from.name(), to.name()), from, to, |b, x, _| b.cast(x, to, true)));
        }
        let k = pointwise(&format!("s_{}", from.name()), from, from, |b, x, y| {
            let c = b.binary(BinaryOp::Lt, x, y);
            b.select(c, x, y)
        });
        kernels.push(k);
    }
    assemble("cast", &kernels);
}

#[test]
fn loads_under_every_bounds_mode_assemble() {
    let mut kernels = Vec::new();
    for d in [DType::F32, DType::F64, DType::I8, DType::U16, DType::I64, DType::Bool, DType::F16, DType::BF16] {
        let t = ScalarType::of_storage(d);
        for (bn, bounds) in [("pad", Bounds::Pad(t.bits_of_i64(1))), ("clamp", Bounds::Clamp)] {
            // out[i, j] = in[i - 1, j + 2]: reads past both ends of both axes.
            let mut b = KernelBuilder::new(format!("l_{bn}_{}", d.name()), vec![ty(d, &[2, 5])], ty(d, &DIMS));
            let idx = b.out_index();
            let one = b.index(1);
            let two = b.index(2);
            let i = b.sub(idx[0], one);
            let j = b.add(idx[1], two);
            let v = b.load_with(0, vec![i, j], bounds);
            let v = b.cast(v, d, true);
            kernels.push(b.finish(v).expect("bounds kernel"));
        }
    }
    // An empty input reads 0 under Clamp.
    let mut b = KernelBuilder::new("l_empty", vec![ty(DType::F32, &[0, 4])], ty(DType::F32, &DIMS));
    let idx = b.out_index();
    let v = b.load_with(0, idx, Bounds::Clamp);
    kernels.push(b.finish(v).expect("empty kernel"));
    assemble("bounds", &kernels);
}

#[test]
fn every_reduction_assembles_under_the_general_mapping() {
    let mut kernels = Vec::new();
    for t in [ScalarType::F32, ScalarType::F64, ScalarType::I32, ScalarType::U8, ScalarType::I64] {
        for op in ReduceOp::ALL {
            // out[i] = op over (j, k) of in[i, j, k] (one variable for the arg-reductions).
            let d = t.dtype();
            let out = if op.is_arg() { DType::I64 } else { d };
            let mut b = KernelBuilder::new(
                format!("r_{}_{}", op.name().replace('.', "_"), t.name()),
                vec![ty(d, &[3, 5, 7])],
                ty(out, &[3]),
            );
            let idx = b.out_index();
            let j = b.new_var(5);
            let k = b.new_var(7);
            let (jv, kv) = (b.var(j), b.var(k));
            let vars = if op.is_arg() { vec![j] } else { vec![j, k] };
            let kk = if op.is_arg() { b.index(0) } else { kv };
            let x = b.load(0, vec![idx[0], jv, kk]);
            let r = b.reduce(op, vars, x);
            kernels.push(b.finish(r).expect("reduce kernel"));
        }
    }
    // A reduction inside a reduction, and a value hoisted out of the inner loop.
    let mut b = KernelBuilder::new("r_nested", vec![ty(DType::F32, &[4, 6])], ty(DType::F32, &[4]));
    let idx = b.out_index();
    let j = b.new_var(6);
    let jv = b.var(j);
    let k = b.new_var(6);
    let kv = b.var(k);
    let x = b.load(0, vec![idx[0], kv]);
    let y = b.load(0, vec![idx[0], jv]);
    let inner = b.reduce(ReduceOp::Max, vec![k], x);
    let d = b.sub(y, inner);
    let e = b.unary(UnaryOp::Exp, d);
    let r = b.reduce(ReduceOp::Sum, vec![j], e);
    kernels.push(b.finish(r).expect("nested kernel"));
    let m = assemble("reduce", &kernels);
    // The nested one's reductions each vary along their own variable: the Rows
    // emitter's form for General kernels (`cuda::rows::emit_general`) takes it.
    let (last, others) = m.notes.split_last().expect("notes");
    assert!(others.iter().all(|n| n.starts_with("general")), "{:?}", m.notes);
    assert!(last.starts_with("rows ("), "{last}");
}

#[test]
fn elementwise_kernels_take_the_vector_form_where_rows_allow() {
    let mk = |name: &str, d: DType, row: usize| {
        let dims = [3, row];
        let mut b = KernelBuilder::new(name, vec![ty(d, &dims), ty(d, &[1, row])], ty(d, &dims));
        let idx = b.out_index();
        let zero = b.index(0);
        let x = b.load(0, idx.clone());
        let y = b.load(1, vec![zero, idx[1]]);
        let r = b.binary(BinaryOp::Mul, x, y);
        b.finish(r).expect("elementwise kernel")
    };
    // A vector load beside a scalar load at the innermost index plus 4: each lane's
    // scalar load reads its own element (the simulator in `assemble` compares them).
    let shifted = {
        let mut b = KernelBuilder::new(
            "e_shifted",
            vec![ty(DType::F32, &[3, 8]), ty(DType::F32, &[3, 12])],
            ty(DType::F32, &[3, 8]),
        );
        let idx = b.out_index();
        let four = b.index(4);
        let j4 = b.add(idx[1], four);
        let x = b.load(0, idx.clone());
        let y = b.load(1, vec![idx[0], j4]);
        let r = b.binary(BinaryOp::Add, x, y);
        b.finish(r).expect("elementwise kernel")
    };
    let kernels = vec![
        mk("e_f32_8", DType::F32, 8),
        mk("e_f32_7", DType::F32, 7),
        mk("e_f64_6", DType::F64, 6),
        mk("e_i8_8", DType::I8, 8),
        shifted,
    ];
    let m = assemble("vector", &kernels);
    assert_eq!(m.notes[0], "elementwise (v4 store, 2 vector loads)");
    assert!(m.notes[1].starts_with("general (rows of 7 elements"), "{}", m.notes[1]);
    assert_eq!(m.notes[2], "elementwise (v2 store, 2 vector loads)");
    // One-byte lanes: the widest group of whole words that tiles a row of 8 is 8 bytes.
    assert_eq!(m.notes[3], "elementwise (8 lanes, v2.b32 store, 2 vector loads)");
    assert_eq!(m.notes[4], "elementwise (v4 store, 1 vector loads)");
    assert!(m.ptx().contains("ld.global.v4.f32") && m.ptx().contains("st.global.v4.f32"));
    // Groups, not elements, are what the vector form's grid walks.
    assert_eq!(m.launches[0], cuda::Launch { grid: 1, block: cuda::BLOCK, shared: 0, params: 3 });
}
