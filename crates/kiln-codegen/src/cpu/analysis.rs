//! What the emitter needs to know about a kernel before it writes a single instruction:
//! which nodes are needed, the loop each one is evaluated in, the address chains of
//! loads and the store, and which loops can run four lanes at a time.
//!
//! ## Scopes
//! Every index variable owns one loop; scope `v + 1` is the body of variable `v`'s loop
//! and scope 0 is the function body outside every loop. The output's loops nest in
//! order (`v0` outermost); a reduce evaluated in scope `s` nests its own loops (its
//! variables, outermost first) inside `s`. A node is evaluated in the scope of its
//! innermost free variable — the deepest loop whose variable it reads — which is
//! loop-invariant code motion by construction: a softmax's row maximum reads no
//! column variable and is computed once per row.
//!
//! ## Addresses
//! The element offset of an `InBounds` load (and of the store) is decomposed by
//! `kiln_flow::affine` (its address mode: wrapping, opaque nodes kept as terms) into an
//! affine form `c + Σ k·atom` over index variables and opaque i64 nodes. The terms are
//! grouped by the scope they vary in and summed scope by scope, outermost first, into a
//! chain of partial addresses ([`AddrItem`]); each link is evaluated in its own scope
//! and shared by every access with the same prefix. The innermost loop therefore adds
//! one scaled counter to a hoisted base per access (an addressing-mode add on x86), and
//! the constant `c` becomes the load's displacement.

use std::collections::HashMap;

pub(crate) use kiln_flow::affine::Atom;
use kiln_flow::affine::{Affine, AffineCx, Mode};
use kiln_flow::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::DType;

/// What an address chain link adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AddrBase {
    /// The start of binding `b`.
    Binding(u32),
    /// Another link.
    Item(usize),
}

/// One link of an address chain: `base + Σ bytes·atom` over the terms that vary in
/// `scope`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct AddrItem {
    pub base: AddrBase,
    pub terms: Vec<(Atom, i64)>,
    pub scope: u32,
}

/// An access to memory: the last link of its chain plus a constant byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access {
    pub base: AddrBase,
    pub offset: i64,
}

/// Something the emitter evaluates in a scope, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item {
    Node(u32),
    Addr(usize),
}

/// The analysis of one kernel.
#[derive(Debug)]
pub(crate) struct Analysis {
    /// Nodes whose value is computed (index nodes folded into addresses are not).
    pub needed: Vec<bool>,
    /// Free variables of every node, sorted.
    pub free: Vec<Vec<u32>>,
    /// Address of every needed `InBounds` load.
    pub access: Vec<Option<Access>>,
    /// Address of the output element.
    pub store: Access,
    /// The address chain links.
    pub addrs: Vec<AddrItem>,
    /// What each scope evaluates, in order.
    pub items: Vec<Vec<Item>>,
    /// Scopes directly nested in each scope (reduce loops and the next output loop).
    pub children: Vec<Vec<u32>>,
}

/// Row-major strides of `dims`, in elements.
pub(crate) fn strides(dims: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1].wrapping_mul(dims[d + 1] as i64);
    }
    s
}

/// Bytes of one element of a storage dtype the CPU backend handles.
pub(crate) fn elem_bytes(d: DType) -> Option<i64> {
    Some(match d {
        DType::Bool | DType::I8 | DType::U8 => 1,
        DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F8E8M0FNU => 1,
        // One code a byte, in its low six bits.
        DType::F6E3M2FN => 1,
        // Two to a byte: addresses are computed in elements (binding + element index)
        // and the emitter turns them into a byte and a nibble (see `emit::packed_addr`).
        DType::I4 | DType::U4 | DType::F4E2M1FN => 1,
        DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
        DType::I32 | DType::U32 | DType::F32 => 4,
        DType::I64 | DType::U64 | DType::F64 => 8,
    })
}

/// The scope of the innermost of the free variables `fv` (0 for none); they must lie on
/// one chain of nested loops.
fn innermost(fv: &[u32], parent: &[u32], depth: &[u32]) -> Result<u32, String> {
    let mut best = 0u32;
    for &v in fv {
        let s = v + 1;
        if depth[s as usize] == u32::MAX {
            return Err(format!("v{v} is read outside its loop"));
        }
        if depth[s as usize] > depth[best as usize] {
            best = s;
        }
    }
    for &v in fv {
        let mut s = best;
        while s != v + 1 && s != 0 {
            s = parent[s as usize];
        }
        if s != v + 1 {
            return Err(format!("free variables {fv:?} do not lie on one chain of loops"));
        }
    }
    Ok(best)
}

impl Analysis {
    /// Analyses a verified kernel whose storage dtypes are all supported.
    pub(crate) fn new(k: &Kernel) -> Result<Analysis, String> {
        let n = k.nodes.len();
        let rank = k.index_rank();
        let free = k.free_vars();
        let mut aff = AffineCx::new(k, Mode::Address);

        // Needed nodes, and the affine index of every InBounds load.
        let mut needed = vec![false; n];
        let mut load_aff: Vec<Option<Affine>> = vec![None; n];
        needed[k.root.index()] = true;
        if let Some(sc) = &k.scatter {
            needed[sc.at.index()] = true;
        }
        for i in (0..n).rev() {
            if !needed[i] {
                continue;
            }
            let mut marks: Vec<usize> = Vec::new();
            let mut mark = |e: &ExprId| marks.push(e.index());
            match &k.nodes[i].expr {
                Expr::Var(_) | Expr::Const(_) => {}
                Expr::Load { input, index, bounds } => {
                    let t = &k.inputs[*input as usize];
                    if *bounds == Bounds::InBounds && t.shape.numel() > 0 {
                        let st = strides(t.shape.dims());
                        let mut flat = Affine::constant(0);
                        for (&e, &s) in index.iter().zip(&st) {
                            flat = flat.wrapping_plus(&aff.address(e).wrapping_scaled(s));
                        }
                        for &(a, _) in &flat.terms {
                            if let Atom::Node(m) = a {
                                mark(&ExprId(m));
                            }
                        }
                        load_aff[i] = Some(flat);
                    } else if t.shape.numel() > 0 {
                        index.iter().for_each(&mut mark);
                    }
                }
                Expr::Unary(_, a) | Expr::Cast { value: a, .. } => mark(a),
                Expr::Binary(_, a, b) => {
                    mark(a);
                    mark(b);
                }
                Expr::Select(c, a, b) => {
                    mark(c);
                    mark(a);
                    mark(b);
                }
                Expr::Reduce { body, .. } => mark(body),
            }
            for m in marks {
                needed[m] = true;
            }
        }

        // Scopes: output loops nest in order; each needed reduce nests its loops in
        // the scope of its innermost free variable. A reduce's free variables belong
        // to enclosing loops, whose reduces come later in the arena, so walking the
        // arena backwards meets every enclosing reduce first.
        let nscopes = k.vars.len() + 1;
        let mut parent = vec![0u32; nscopes];
        let mut depth = vec![u32::MAX; nscopes];
        depth[0] = 0;
        for l in 0..rank {
            parent[l + 1] = l as u32;
            depth[l + 1] = l as u32 + 1;
        }
        for i in (0..n).rev() {
            if let (true, Expr::Reduce { vars, .. }) = (needed[i], &k.nodes[i].expr) {
                let at = innermost(&free[i], &parent, &depth)?;
                let mut outer = at;
                for w in vars {
                    let s = w.0 as usize + 1;
                    if depth[s] != u32::MAX {
                        return Err(format!("v{} is introduced twice", w.0));
                    }
                    parent[s] = outer;
                    depth[s] = depth[outer as usize] + 1;
                    outer = s as u32;
                }
            }
        }
        let mut place = vec![0u32; n];
        for i in 0..n {
            if needed[i] {
                place[i] = innermost(&free[i], &parent, &depth)?;
            }
        }
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); nscopes];
        for s in 1..nscopes {
            if depth[s] != u32::MAX {
                children[parent[s] as usize].push(s as u32);
            }
        }

        // Address chains.
        let mut addrs: Vec<AddrItem> = Vec::new();
        let mut addr_ids: HashMap<AddrItem, usize> = HashMap::new();
        let mut ready: Vec<i64> = Vec::new();
        let scope_of = |a: Atom| -> u32 {
            match a {
                Atom::Var(v) => v + 1,
                Atom::Node(m) => place[m as usize],
            }
        };
        let mut chain = |binding: u32, flat: &Affine, size: i64| -> Access {
            let mut terms: Vec<(u32, Atom, i64)> =
                flat.terms.iter().map(|&(a, c)| (scope_of(a), a, c.wrapping_mul(size))).collect();
            terms.sort_by_key(|&(s, a, _)| (depth[s as usize], a));
            let mut base = AddrBase::Binding(binding);
            let mut at = 0;
            while at < terms.len() {
                let s = terms[at].0;
                let mut group = Vec::new();
                let mut r = -1i64;
                while at < terms.len() && terms[at].0 == s {
                    group.push((terms[at].1, terms[at].2));
                    if let Atom::Node(m) = terms[at].1 {
                        r = r.max(m as i64);
                    }
                    at += 1;
                }
                let item = AddrItem { base, terms: group, scope: s };
                let id = match addr_ids.get(&item) {
                    Some(&id) => id,
                    None => {
                        addrs.push(item.clone());
                        ready.push(r);
                        addr_ids.insert(item, addrs.len() - 1);
                        addrs.len() - 1
                    }
                };
                base = AddrBase::Item(id);
            }
            Access { base, offset: flat.c.wrapping_mul(size) }
        };
        let mut access: Vec<Option<Access>> = vec![None; n];
        for i in 0..n {
            if let (true, Some(flat)) = (needed[i], &load_aff[i]) {
                let Expr::Load { input, .. } = &k.nodes[i].expr else { continue };
                let size = elem_bytes(k.inputs[*input as usize].dtype).ok_or("unsupported input dtype")?;
                access[i] = Some(chain(*input, flat, size));
            }
        }
        let out_size = elem_bytes(k.output.dtype).ok_or("unsupported output dtype")?;
        let mut out_flat = Affine::constant(0);
        // (A scatter stores at its computed position: the output's start is its base.)
        if k.scatter.is_none() {
            for (l, s) in strides(k.output.shape.dims()).into_iter().enumerate() {
                out_flat = out_flat.wrapping_plus(&Affine::atom(Atom::Var(l as u32)).wrapping_scaled(s));
            }
        }
        let store = chain(k.inputs.len() as u32, &out_flat, out_size);

        // Items per scope: nodes in arena order; an address link right after the last
        // node it adds (it precedes every access using it, which come later in the arena
        // or in deeper scopes).
        let mut keyed: Vec<Vec<((i64, u8), Item)>> = vec![Vec::new(); nscopes];
        for i in 0..n {
            if needed[i] && !matches!(k.nodes[i].expr, Expr::Const(_)) {
                keyed[place[i] as usize].push(((i as i64, 1), Item::Node(i as u32)));
            }
        }
        for (j, a) in addrs.iter().enumerate() {
            keyed[a.scope as usize].push(((ready[j], 2), Item::Addr(j)));
        }
        let items = keyed
            .into_iter()
            .map(|mut v| {
                v.sort_by_key(|e| e.0);
                v.into_iter().map(|e| e.1).collect()
            })
            .collect();
        Ok(Analysis { needed, free, access, store, addrs, items, children })
    }

    /// Whether node `i` reads variable `u`.
    pub(crate) fn varies(&self, i: u32, u: u32) -> bool {
        self.free[i as usize].binary_search(&u).is_ok()
    }

    /// Scope `s` and every scope nested in it.
    pub(crate) fn subtree(&self, s: u32) -> Vec<u32> {
        let mut out = vec![s];
        let mut at = 0;
        while at < out.len() {
            out.extend_from_slice(&self.children[out[at] as usize]);
            at += 1;
        }
        out
    }

    /// Whether the accesses of `chain` advance contiguously (by `size` bytes) with
    /// variable `u` and depend on it through no opaque node.
    fn contiguous(&self, acc: &Access, u: u32, size: i64) -> bool {
        let mut coef = 0i64;
        let mut base = acc.base;
        while let AddrBase::Item(j) = base {
            for &(a, c) in &self.addrs[j].terms {
                match a {
                    Atom::Var(v) if v == u => coef = coef.wrapping_add(c),
                    Atom::Node(m) if self.varies(m, u) => return false,
                    _ => {}
                }
            }
            base = self.addrs[j].base;
        }
        coef == size
    }

    /// Whether the loop of variable `u` (and everything nested in it) can run four
    /// lanes at a time: every needed node that reads `u` is f32, i32, u32 or bool
    /// arithmetic the vector emitter handles, and every load reading `u` is contiguous
    /// in it. `with_store`: the scope also stores the output (the innermost output loop).
    pub(crate) fn vectorizable(&self, k: &Kernel, u: u32, with_store: bool, sse41: bool) -> bool {
        use ScalarType as S;
        let lane = |t: S| matches!(t, S::F32 | S::I32 | S::U32 | S::Bool);
        if with_store && !matches!(k.output.dtype, DType::F32 | DType::I32 | DType::U32) {
            return false;
        }
        for s in self.subtree(u + 1) {
            for item in &self.items[s as usize] {
                let Item::Node(i) = *item else { continue };
                if !self.varies(i, u) {
                    continue;
                }
                let node = &k.nodes[i as usize];
                if !lane(node.ty) {
                    return false;
                }
                let ty_of = |e: &ExprId| k.node(*e).ty;
                let ok = match &node.expr {
                    Expr::Var(_) | Expr::Const(_) => false,
                    Expr::Load { input, bounds, .. } => {
                        let d = k.inputs[*input as usize].dtype;
                        *bounds == Bounds::InBounds
                            && matches!(d, DType::F32 | DType::I32 | DType::U32)
                            && self.access[i as usize].is_some_and(|a| self.contiguous(&a, u, 4))
                    }
                    Expr::Unary(op, a) => match ty_of(a) {
                        S::F32 => {
                            !matches!(op, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc) || sse41
                        }
                        S::I32 | S::U32 => matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not),
                        S::Bool => *op == UnaryOp::Not,
                        _ => false,
                    },
                    Expr::Binary(op, a, _) => {
                        use BinaryOp as B;
                        match ty_of(a) {
                            S::F32 => !matches!(op, B::And | B::Or | B::Xor | B::Shl | B::Shr),
                            S::I32 | S::U32 => !matches!(op, B::Div | B::Rem | B::Pow | B::Shl | B::Shr),
                            S::Bool => matches!(op, B::And | B::Or | B::Xor | B::Eq | B::Ne),
                            _ => false,
                        }
                    }
                    Expr::Select(_, a, _) => lane(ty_of(a)),
                    Expr::Cast { value, to, .. } => {
                        let from = ty_of(value);
                        let to_ty = S::of_storage(*to);
                        // Only exact-width conversions between lane types.
                        to_ty.dtype() == *to
                            && matches!(
                                (from, to_ty),
                                (S::I32 | S::U32 | S::Bool, S::F32)
                                    | (S::Bool, S::I32 | S::U32)
                                    | (S::F32 | S::I32 | S::U32, S::Bool)
                                    | (S::I32 | S::U32, S::I32 | S::U32)
                                    | (S::F32, S::F32)
                            )
                    }
                    Expr::Reduce { op, body, .. } => {
                        matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min)
                            && matches!(ty_of(body), S::F32 | S::I32 | S::U32)
                    }
                };
                if !ok {
                    return false;
                }
            }
        }
        true
    }
}
