//! The ONNX importer.
//!
//! - [`proto`]: prost types generated at build time from `proto/onnx.proto`;
//! - `tensor`: `TensorProto` decoding (raw, typed, external data);
//! - `canon`: translation of each op from the model's opset into kiln's canonical
//!   (opset-22) form;
//! - `expand`: ops ONNX defines as functions (the losses, the window functions,
//!   CenterCropPad, AffineGrid), imported as their bodies;
//! - `decompose`: ops without a function body that have a closed form in canonical ops
//!   (DFT and STFT as a product with a constant basis, MelWeightMatrix, MaxUnpool,
//!   TfIdfVectorizer over integers,
//!   training-mode BatchNormalization, the `ai.onnx.preview.training` optimisers, the
//!   `ai.onnx.ml` Binarizer, ArrayFeatureExtractor and TreeEnsemble), the only nodes of other domains
//!   kiln accepts;
//! - `seq`: sequences and optionals of compile-time size (a name is bound to a
//!   `seq::Val`: a tensor, a list of tensors, an optional of known presence),
//!   `SequenceMap`;
//! - `scan`: `Scan`, unrolled;
//! - `data`: sequence and optional test data, flattened as the graph takes them;
//! - this module: the driver — inputs, initializers, nodes in order (with `If`
//!   inlining and constant folding), outputs.
//!
//! **`If`.** A condition known at compile time inlines the branch it selects. A
//! condition computed at run time becomes an [`OpKind::If`] node whose branches are
//! closed graphs ([`kiln_ir::attrs::IfAttrs`]): each branch is imported into a graph of
//! its own (a [`Frame`] per enclosing graph), and a name it reads from an enclosing
//! scope is *captured*: a constant is copied into the branch (so folding works inside
//! it), any other value becomes a branch input, and the node passes it as an operand
//! after the condition. Nested branches capture through every level between.
//!
//! **`Loop`** is unrolled, one trip at a time, each trip an `If` on the loop's
//! condition whose then-branch is the body (its inputs bound to the trip number, the
//! condition and the loop-carried values) and whose else-branch passes the values
//! through: where the condition is known at compile time (a constant trip count, a
//! condition that folds), the trip is inlined or the loop ends there; where it is
//! computed at run time (an early exit on data, a trip count `M` from the data) the
//! trip becomes a run-time `If` — the plan holds every trip up to the bound and skips
//! the rest. The bound is `M` when constant, capped by `--max-trips`
//! ([`ImportOptions::max_trips`]), which a loop without a constant `M` needs. Scan
//! outputs (one slice per trip, concatenated) need every trip decided at compile time:
//! with run-time trips their length would depend on the data.

mod canon;
mod data;
mod decompose;
mod expand;
mod scan;
mod seq;
mod tensor;

pub use data::{decode_value, signature, Value, ValueKind};
pub use seq::element_name;
use seq::Val;

/// Types generated from `proto/onnx.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/kiln.onnx.rs"));
}

use crate::{ImportError, ImportOptions, UnsupportedOp};
use bytes::Bytes;
use kiln_ir::infer::InferError;
use kiln_ir::op::AttrError;
use kiln_ir::{Attr, Attrs, DType, Graph, Op, OpKind, Shape, Tensor, TensorType, ValueDef, ValueId};
use prost::Message;
use proto::{attribute_proto::AttributeType, type_proto, GraphProto, ModelProto, NodeProto};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use tensor::{tensor_from_proto, ExternalFiles};

/// The newest default-domain opset kiln understands.
pub const MAX_OPSET: i64 = 24;

/// Ops handled by the importer itself rather than mapped to an [`OpKind`].
const IMPORT_ONLY_OPS: &[&str] = &["Constant", "If", "Loop", "Identity", "Upsample", "Scatter"];

/// Most trips a `Loop` is unrolled to without `--max-trips` (each trip is a copy of
/// the body in the plan).
pub const MAX_UNROLLED_TRIPS: u64 = 4096;

/// Imports an ONNX model file (external data is read relative to its directory).
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Graph, ImportError> {
    let data = std::fs::read(path)
        .map_err(|e| ImportError::Io { path: path.display().to_string(), message: e.to_string() })?;
    let base = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    import_bytes(Bytes::from(data), base, opts)
}

/// Imports an ONNX model from memory. Tensor data stays in `data` (no copies);
/// `base_dir` is where external data files are looked up.
pub fn import_bytes(data: Bytes, base_dir: Option<&Path>, opts: &ImportOptions) -> Result<Graph, ImportError> {
    if data.is_empty() {
        return Err(ImportError::Decode("the file is empty".into()));
    }
    let model = ModelProto::decode(data).map_err(|e| ImportError::Decode(e.to_string()))?;
    import_model(&model, base_dir, opts)
}

/// Decodes one serialized `TensorProto` (the `input_*.pb` / `output_*.pb` files of
/// ONNX test data).
pub fn decode_tensor(data: Bytes) -> Result<Tensor, ImportError> {
    let t = proto::TensorProto::decode(data).map_err(|e| ImportError::Decode(e.to_string()))?;
    tensor_from_proto(&t, &mut ExternalFiles::new(None))
}

/// Names of a model's graph inputs that are not initializers, in order.
pub fn graph_input_names(data: Bytes) -> Result<Vec<String>, ImportError> {
    let model = ModelProto::decode(data).map_err(|e| ImportError::Decode(e.to_string()))?;
    let graph = model.graph.as_ref().ok_or_else(|| ImportError::Model("the model has no graph".into()))?;
    let inits: HashSet<&str> = graph.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    Ok(graph.input.iter().filter_map(|i| i.name.clone()).filter(|n| !inits.contains(n.as_str())).collect())
}

/// Imports a decoded model.
pub fn import_model(model: &ModelProto, base_dir: Option<&Path>, opts: &ImportOptions) -> Result<Graph, ImportError> {
    let graph = model.graph.as_ref().ok_or_else(|| ImportError::Model("the model has no graph".into()))?;
    let mut opsets: HashMap<String, i64> = HashMap::new();
    for o in &model.opset_import {
        let d = o.domain.clone().unwrap_or_default();
        let d = if d == "ai.onnx" { String::new() } else { d };
        opsets.insert(d, o.version.unwrap_or(0));
    }
    let opset = match opsets.get("") {
        Some(&v) => v,
        None if model.opset_import.is_empty() => {
            return Err(ImportError::Model("the model imports no opset".into()));
        }
        None => 0,
    };
    if opset < 1 {
        // Only nodes of the default domain are supported, so there must be one.
        let uses_default = graph.node.iter().any(|n| matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx")));
        if uses_default {
            return Err(ImportError::Model(format!(
                "the model uses ai.onnx operators but imports ai.onnx opset {opset}; expected a version from 1 to {MAX_OPSET}"
            )));
        }
    }
    if opset > MAX_OPSET {
        return Err(ImportError::Model(format!(
            "the model uses ai.onnx opset {opset}; kiln supports opsets up to {MAX_OPSET}"
        )));
    }
    check_supported(graph, &opsets)?;

    let mut used = HashSet::new();
    collect_used(graph, &mut used);
    let mut imp =
        Importer {
            opset,
            g: Graph::new(graph.name.clone().unwrap_or_default()),
            scopes: vec![HashMap::new()],
            used,
            opsets: opsets.clone(),
            names: HashSet::new(),
            next_suffix: HashMap::new(),
            reserved: graph.output.iter().filter_map(|o| o.name.clone()).collect(),
            ext: ExternalFiles::new(base_dir.map(Path::to_path_buf)),
            parents: Vec::new(),
            captures: Vec::new(),
            max_trips: opts.max_trips,
            max_dims: opts.max_dims.iter().map(|(n, b)| (n.clone(), *b, false)).collect(),
            declared_shapes: opts
                .output_shapes
                .iter()
                .map(|(n, d)| (n.clone(), d.clone(), true, false))
                .chain(
                    graph.output.iter().chain(&graph.value_info).filter_map(|v| {
                        Some((v.name.clone().filter(|n| !n.is_empty())?, static_dims(v)?, false, false))
                    }),
                )
                .collect(),
        };
    imp.import_signature(graph, opts)?;
    imp.import_body(graph)?;
    imp.import_outputs(graph)?;
    if let Some((name, _, _)) = imp.max_dims.iter().find(|(_, _, used)| !used) {
        return Err(ImportError::Model(format!(
            "--max-dim {name}: no result of a data-dependent op (NonZero, Compress, Unique, \
             NonMaxSuppression, TopK with a run-time K) is named `{name}`"
        )));
    }
    if let Some((name, _, _, _)) = imp.declared_shapes.iter().find(|(_, _, given, used)| *given && !used) {
        return Err(ImportError::Model(format!(
            "--output-shape {name}: no result whose dims depend on run-time data (a Resize with \
             run-time `scales`, a OneHot with a run-time `depth`, a Range of run-time floats) is named `{name}`"
        )));
    }
    let mut g = imp.g.without_dead_code();
    // A QDQ model stands for what ONNX Runtime computes on integers (see
    // `kiln_ir::QuantSemantics`); graphs without QuantizeLinear are unaffected.
    if g.nodes.iter().any(|(_, n)| n.op.kind == OpKind::QuantizeLinear) {
        g.quant = kiln_ir::QuantSemantics::OnnxRuntimeCpu;
    }
    kiln_ir::verify::verify(&g).map_err(|e| ImportError::Verify(e.to_string()))?;
    Ok(g)
}

/// Lists every node whose op kiln cannot import: in `graph` and in the subgraphs
/// of its nodes, except `If` branches, which are checked when one is inlined (an
/// unsupported op in the branch a constant condition discards does no harm).
fn check_supported(graph: &GraphProto, opsets: &HashMap<String, i64>) -> Result<(), ImportError> {
    fn walk(g: &GraphProto, opsets: &HashMap<String, i64>, found: &mut Vec<UnsupportedOp>) {
        for (index, n) in g.node.iter().enumerate() {
            let op = n.op_type.clone().unwrap_or_default();
            let domain = n.domain.clone().unwrap_or_default();
            let domain = if domain == "ai.onnx" { String::new() } else { domain };
            let known = (domain.is_empty()
                && (IMPORT_ONLY_OPS.contains(&op.as_str())
                    || seq::handles(&op)
                    || expand::is_expanded(&op)
                    || op.parse::<OpKind>().is_ok()))
                || decompose::domain_of(&op) == Some(domain.as_str());
            if !known {
                if let Some(u) = found.iter_mut().find(|u| u.op_type == op && u.domain == domain) {
                    u.count += 1;
                } else {
                    found.push(UnsupportedOp {
                        op_type: op,
                        opset: opsets.get(&domain).copied().unwrap_or(0),
                        domain,
                        node: node_label(n, index),
                        count: 1,
                    });
                }
            }
            if known && n.op_type.as_deref() == Some("If") {
                continue;
            }
            for a in &n.attribute {
                for sub in a.g.iter().chain(&a.graphs) {
                    walk(sub, opsets, found);
                }
            }
        }
    }
    let mut found = Vec::new();
    walk(graph, opsets, &mut found);
    if found.is_empty() {
        Ok(())
    } else {
        Err(ImportError::Unsupported(found))
    }
}

/// Every value name some node (in any subgraph) reads, and every graph output.
fn collect_used(g: &GraphProto, used: &mut HashSet<String>) {
    for n in &g.node {
        used.extend(n.input.iter().filter(|s| !s.is_empty()).cloned());
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                collect_used(sub, used);
            }
        }
    }
    used.extend(g.output.iter().filter_map(|o| o.name.clone()));
}

/// The nodes of `g` in a topological order: the file's order where it already is
/// one (ONNX requires it, not every exporter complies). A cycle is an error that
/// names the nodes on it.
fn topological_order(g: &GraphProto) -> Result<Vec<usize>, ImportError> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if let Some(j) = producer.insert(o.as_str(), i) {
                return Err(ImportError::Model(format!(
                    "value {:?} is produced by two nodes: `{}` and `{}`",
                    o,
                    node_label(&g.node[j], j),
                    node_label(n, i)
                )));
            }
        }
    }
    // Operands of node i produced by other nodes of this graph, including names
    // its subgraphs read from this scope.
    let deps: Vec<Vec<usize>> = g
        .node
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut names: HashSet<String> = n.input.iter().filter(|s| !s.is_empty()).cloned().collect();
            for a in &n.attribute {
                for sub in a.g.iter().chain(&a.graphs) {
                    free_names(sub, &mut names);
                }
            }
            let mut d: Vec<usize> =
                names.iter().filter_map(|s| producer.get(s.as_str()).copied()).filter(|&p| p != i).collect();
            d.sort_unstable();
            d.dedup();
            d
        })
        .collect();
    let n = g.node.len();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut pending: Vec<usize> = vec![0; n];
    for (i, d) in deps.iter().enumerate() {
        pending[i] = d.len();
        for &p in d {
            users[p].push(i);
        }
    }
    // Smallest ready index first, so a sorted file keeps its order.
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> =
        (0..n).filter(|&i| pending[i] == 0).map(std::cmp::Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &u in &users[i] {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.push(std::cmp::Reverse(u));
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Walk back from a stuck node along stuck dependencies until a node repeats.
    let stuck = |i: usize| pending[i] > 0;
    let mut path: Vec<usize> = Vec::new();
    let mut cur = (0..n).find(|&i| stuck(i)).unwrap_or(0);
    while !path.contains(&cur) {
        path.push(cur);
        match deps[cur].iter().copied().find(|&d| stuck(d)) {
            Some(d) => cur = d,
            None => break,
        }
    }
    let start = path.iter().position(|&p| p == cur).unwrap_or(0);
    let mut cycle: Vec<String> =
        path[start..].iter().rev().map(|&i| format!("`{}`", node_label(&g.node[i], i))).collect();
    if let Some(first) = cycle.first().cloned() {
        cycle.push(first);
    }
    Err(ImportError::Model(format!("the graph has a cycle: {}", cycle.join(" -> "))))
}

/// Names a subgraph reads from enclosing scopes: what its nodes (and nested
/// subgraphs) read, less what it defines itself.
fn free_names(g: &GraphProto, out: &mut HashSet<String>) {
    let mut defined: HashSet<&str> = HashSet::new();
    defined.extend(g.initializer.iter().filter_map(|t| t.name.as_deref()));
    defined.extend(g.input.iter().filter_map(|i| i.name.as_deref()));
    for n in &g.node {
        defined.extend(n.output.iter().map(String::as_str));
    }
    let mut read: HashSet<String> = HashSet::new();
    for n in &g.node {
        read.extend(n.input.iter().filter(|s| !s.is_empty()).cloned());
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                free_names(sub, &mut read);
            }
        }
    }
    read.extend(g.output.iter().filter_map(|o| o.name.clone()));
    out.extend(read.into_iter().filter(|r| !defined.contains(r.as_str())));
}

fn node_label(n: &NodeProto, index: usize) -> String {
    match n.name.as_deref() {
        // Control characters are escaped so an error stays one line.
        Some(s) if !s.is_empty() => s.chars().flat_map(char::escape_debug).collect(),
        _ => format!("#{index}"),
    }
}

/// Import state: the graph being built and the name scopes (one per inlined subgraph).
struct Importer {
    opset: i64,
    g: Graph,
    scopes: Vec<HashMap<String, Val>>,
    used: HashSet<String>,
    /// Opset version per domain (for checking inlined branches).
    opsets: HashMap<String, i64>,
    names: HashSet<String>,
    /// Next suffix to try per base name (keeps `fresh_name` linear).
    next_suffix: HashMap<String, usize>,
    /// Graph output names: values of inlined subgraphs do not take them.
    reserved: HashSet<String>,
    ext: ExternalFiles,
    /// The enclosing graphs while an `If` branch is imported (`g` is the branch), outermost first.
    parents: Vec<Frame>,
    /// Outer values the graph being built (a branch) reads, in the order of its inputs.
    captures: Vec<ValueId>,
    /// `--max-trips`: the bound of loops whose trip count is not a constant.
    max_trips: Option<usize>,
    /// `--max-dim`: declared bounds of data-dependent results, and whether a node used
    /// each.
    max_dims: Vec<(String, usize, bool)>,
    /// Result shapes declared for values whose dims run-time data decides:
    /// `--output-shape` first, then the model's static graph-output and `value_info`
    /// shapes (name, dims, whether `--output-shape` gave it, whether a node used it).
    declared_shapes: Vec<(String, Vec<usize>, bool, bool)>,
}

/// The static dims a value info declares (`None` when a dimension is free or the
/// type is not a tensor's).
fn static_dims(v: &proto::ValueInfoProto) -> Option<Vec<usize>> {
    use proto::tensor_shape_proto::dimension::Value as D;
    let Some(type_proto::Value::TensorType(tt)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return None;
    };
    tt.shape
        .as_ref()?
        .dim
        .iter()
        .map(|d| match d.value {
            Some(D::DimValue(x)) if x >= 0 => Some(x as usize),
            _ => None,
        })
        .collect()
}

/// An enclosing graph, set aside while one of its `If` branches is imported.
struct Frame {
    g: Graph,
    scopes: Vec<HashMap<String, Val>>,
    captures: Vec<ValueId>,
}

/// Where a node being imported is, for error messages.
pub(crate) struct At<'a> {
    pub node: &'a str,
    pub op_type: &'a str,
    pub opset: i64,
}

/// A node being imported, as the importers of its op read it (`import_if`,
/// `import_loop`, and the `seq`, `scan`, `expand` and `decompose` modules).
#[derive(Clone, Copy)]
pub(crate) struct NodeCx<'a> {
    /// The node's label in names and messages.
    pub label: &'a str,
    /// Its op type.
    pub op_type: &'a str,
    /// Its attributes, but for the graph attributes.
    pub attrs: &'a Attrs,
    /// The names of the results kept (those nobody reads are dropped from the end).
    pub outputs: &'a [String],
    /// How many results the node declares, kept or not.
    pub declared_outputs: usize,
    /// Its graph attributes, by name.
    pub subgraphs: &'a HashMap<String, &'a GraphProto>,
    /// Where it is, for errors.
    pub at: &'a At<'a>,
}

impl At<'_> {
    pub fn err(&self, message: impl Into<String>) -> ImportError {
        ImportError::Node {
            node: self.node.to_string(),
            op_type: self.op_type.to_string(),
            opset: self.opset,
            message: message.into(),
        }
    }
}

impl Importer {
    /// The tensor bound to `name` in the graph being built (`None` also for a
    /// sequence or an optional).
    fn lookup(&self, name: &str) -> Option<ValueId> {
        self.lookup_val(name).and_then(|v| v.tensor())
    }

    fn lookup_val(&self, name: &str) -> Option<Val> {
        self.scopes.iter().rev().find_map(|s| s.get(name).cloned())
    }

    /// [`Importer::lookup_val`], and inside a branch also the enclosing graphs' names,
    /// each captured into every graph between (see the module docs): every tensor of
    /// a sequence or an optional is captured on its own.
    fn resolve(&mut self, name: &str) -> Option<Val> {
        self.resolve_at(self.parents.len(), name)
    }

    fn resolve_at(&mut self, level: usize, name: &str) -> Option<Val> {
        let depth = self.parents.len();
        let scopes = if level == depth { &self.scopes } else { &self.parents.get(level)?.scopes };
        if let Some(v) = scopes.iter().rev().find_map(|s| s.get(name).cloned()) {
            return Some(v);
        }
        if level == 0 {
            return None;
        }
        let outer = self.resolve_at(level - 1, name)?;
        let inner = self.capture_val(level, name, &outer)?;
        let scopes = if level == depth { &mut self.scopes } else { &mut self.parents.get_mut(level)?.scopes };
        scopes.first_mut()?.insert(name.to_string(), inner.clone());
        Some(inner)
    }

    /// `outer` (a value of the graph at `level - 1`) as seen from the graph at `level`.
    fn capture_val(&mut self, level: usize, name: &str, outer: &Val) -> Option<Val> {
        Some(match outer {
            Val::T(v) => Val::T(self.capture(level, name, *v)?),
            Val::Seq(items) => {
                let mut inner = Vec::with_capacity(items.len());
                for (i, &v) in items.iter().enumerate() {
                    inner.push(self.capture(level, &format!("{name}[{i}]"), v)?);
                }
                Val::Seq(inner)
            }
            Val::Opt(None) => Val::Opt(None),
            Val::Opt(Some(x)) => Val::Opt(Some(Box::new(self.capture_val(level, name, x)?))),
        })
    }

    /// One tensor of the graph at `level - 1` captured into the graph at `level`: a
    /// constant is copied, anything else becomes an input of the inner graph.
    fn capture(&mut self, level: usize, name: &str, outer: ValueId) -> Option<ValueId> {
        let depth = self.parents.len();
        let og = &self.parents.get(level - 1)?.g;
        let (ty, constant) = (og.ty(outer).clone(), og.constant(outer).cloned());
        let fresh = self.fresh_name(name);
        let (g, captures) = if level == depth {
            (&mut self.g, &mut self.captures)
        } else {
            let f = self.parents.get_mut(level)?;
            (&mut f.g, &mut f.captures)
        };
        Some(match constant {
            Some(t) => g.add_const(fresh, t),
            None => {
                captures.push(outer);
                g.add_input(fresh, ty)
            }
        })
    }

    fn bind(&mut self, name: &str, v: ValueId) {
        self.bind_val(name, Val::T(v));
    }

    fn bind_val(&mut self, name: &str, v: Val) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name.to_string(), v);
        }
    }

    /// Binds a node's results to its output names (an empty name: an output left out).
    fn bind_outputs(&mut self, outputs: &[String], vals: impl IntoIterator<Item = ValueId>) {
        self.bind_vals(outputs, vals.into_iter().map(Val::T));
    }

    /// [`Importer::bind_outputs`] for results that may be sequences or optionals.
    fn bind_vals(&mut self, outputs: &[String], vals: impl IntoIterator<Item = Val>) {
        for (name, v) in outputs.iter().zip(vals) {
            if !name.is_empty() {
                self.bind_val(name, v);
            }
        }
    }

    /// A value name not used yet in the IR (ONNX names are unique per graph, but
    /// inlined subgraphs may repeat them).
    fn fresh_name(&mut self, name: &str) -> String {
        if name.is_empty() {
            return String::new();
        }
        if self.reserved.contains(name) && (self.scopes.len() > 1 || !self.parents.is_empty()) {
            // Inside an inlined subgraph: graph output names are kept for the outputs.
        } else if self.names.insert(name.to_string()) {
            return name.to_string();
        }
        let k = self.next_suffix.entry(name.to_string()).or_insert(1);
        loop {
            let n = format!("{name}.{k}");
            *k += 1;
            if !self.reserved.contains(&n) && self.names.insert(n.clone()) {
                return n;
            }
        }
    }

    pub(crate) fn add_const(&mut self, name: &str, t: Tensor) -> ValueId {
        let name = self.fresh_name(name);
        self.g.add_const(name, t)
    }

    /// Binds a graph's initializers as constants in the current scope.
    fn import_initializers(&mut self, graph: &GraphProto) -> Result<(), ImportError> {
        for init in &graph.initializer {
            let t = tensor_from_proto(init, &mut self.ext)?;
            let name = init.name.clone().unwrap_or_default();
            let v = self.add_const(&name, t);
            self.bind(&name, v);
        }
        Ok(())
    }

    fn import_signature(&mut self, graph: &GraphProto, opts: &ImportOptions) -> Result<(), ImportError> {
        self.import_initializers(graph)?;
        if !graph.sparse_initializer.is_empty() {
            return Err(ImportError::Model("sparse initializers are not supported".into()));
        }
        let input_names: Vec<String> =
            graph.input.iter().filter_map(|i| i.name.clone()).filter(|n| self.lookup(n).is_none()).collect();
        for (name, _) in opts
            .input_shapes
            .iter()
            .map(|(n, d)| (n, d.len()))
            .chain(opts.input_values.iter().map(|(n, v)| (n, v.len())))
        {
            if !input_names.contains(name) {
                return Err(ImportError::Input {
                    name: name.clone(),
                    message: format!("the model has no such input; its inputs are: {}", quoted_list(&input_names)),
                });
            }
        }
        // Every input with free dimensions and no --input-shape, reported at once.
        let mut free = Vec::new();
        for vi in &graph.input {
            use proto::tensor_shape_proto::dimension::Value as D;
            let name = vi.name.clone().unwrap_or_default();
            if self.lookup(&name).is_some() || opts.input_shapes.iter().any(|(n, _)| *n == name) {
                continue;
            }
            let Some(type_proto::Value::TensorType(tt)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
                continue;
            };
            let Some(s) = &tt.shape else { continue };
            let is_free = |d: &proto::tensor_shape_proto::Dimension| !matches!(d.value, Some(D::DimValue(v)) if v >= 0);
            // A dimension as declared (free ones by name, `?` unnamed), or with free ones as `fill`.
            let dim = |d: &proto::tensor_shape_proto::Dimension, fill: &str| match &d.value {
                Some(D::DimValue(v)) if *v >= 0 => v.to_string(),
                _ if !fill.is_empty() => fill.to_string(),
                Some(D::DimParam(p)) if !p.is_empty() => p.clone(),
                _ => "?".to_string(),
            };
            if s.dim.iter().any(is_free) {
                let join = |fill: &str| s.dim.iter().map(|d| dim(d, fill)).collect::<Vec<_>>().join("x");
                free.push(crate::error::FreeDims { name, declared: join(""), suggested: join("1") });
            }
        }
        if !free.is_empty() {
            return Err(ImportError::FreeDims(free));
        }
        for vi in &graph.input {
            let name = vi.name.clone().unwrap_or_default();
            if self.lookup(&name).is_some() {
                // An initializer listed as an input (IR < 4 style): a constant.
                continue;
            }
            let v = self.signature_input(&name, vi.r#type.as_ref(), opts)?;
            self.bind_val(&name, v);
        }
        self.bounded_inputs(opts)?;
        Ok(())
    }

    /// The bounded input dimensions of `opts` (`--input-shape ids=1x1..128`): each an
    /// extent input (an `i64` scalar, after every other input) and an entry of
    /// `Graph::bounded` (see `kiln_ir::bounded`).
    fn bounded_inputs(&mut self, opts: &ImportOptions) -> Result<(), ImportError> {
        for (name, axis, min) in &opts.bounded_dims {
            let ierr = |message: String| ImportError::Input { name: name.clone(), message };
            let input = self
                .g
                .inputs
                .iter()
                .position(|&v| self.g.values[v].name == *name)
                .ok_or_else(|| ierr("a bounded dimension needs a tensor input of this name".into()))?;
            let dims = self.g.ty(self.g.inputs[input]).shape.dims().to_vec();
            let bound = *dims.get(*axis).ok_or_else(|| ierr(format!("the input has no axis {axis}")))?;
            if self.g.bounded.iter().any(|b| b.input == input) {
                return Err(ierr("only one dimension of an input may be bounded".into()));
            }
            let ext_name = format!("{name}.extent{axis}");
            let extent = self.g.inputs.len();
            self.g.add_input(ext_name, kiln_ir::TensorType::new(DType::I64, kiln_ir::Shape::scalar()));
            self.g.bounded.push(kiln_ir::bounded::BoundedDim { input, axis: *axis, min: *min, bound, extent });
        }
        Ok(())
    }

    /// One tensor input of the graph's signature: its shape as declared, bound by
    /// `--input-shape`, or its value bound by `--input-value`.
    fn tensor_input(
        &mut self,
        name: &str,
        tt: &type_proto::Tensor,
        opts: &ImportOptions,
    ) -> Result<ValueId, ImportError> {
        let name = name.to_string();
        let ierr = |message: String| ImportError::Input { name: name.clone(), message };
        let code = tt.elem_type.unwrap_or(0);
        let dtype = DType::from_onnx_code(code as i64)
            .ok_or_else(|| ierr(format!("element type code {code} is not supported")))?;
        let given = opts.input_shapes.iter().find(|(n, _)| *n == name).map(|(_, d)| d.clone());
        let value = opts.input_values.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        let dims = match (&tt.shape, given) {
            (None, Some(d)) => d,
            (None, None) => match &value {
                Some(v) if v.len() == 1 => Vec::new(),
                _ => return Err(ierr("the input's rank is unknown; give its shape with --input-shape".into())),
            },
            (Some(s), given) => {
                use proto::tensor_shape_proto::dimension::Value as D;
                let declared: Vec<Option<i64>> = s
                    .dim
                    .iter()
                    .map(|d| match d.value {
                        Some(D::DimValue(v)) if v >= 0 => Some(v),
                        _ => None,
                    })
                    .collect();
                let show = || {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(D::DimValue(v)) => v.to_string(),
                            Some(D::DimParam(p)) if !p.is_empty() => p.clone(),
                            _ => "?".into(),
                        })
                        .collect::<Vec<_>>()
                        .join("x")
                };
                match given {
                    Some(g) => {
                        if g.len() != declared.len() {
                            return Err(ierr(format!(
                                "--input-shape gives rank {} ({}), but the model declares rank {} ({})",
                                g.len(),
                                dims_str(&g),
                                declared.len(),
                                show()
                            )));
                        }
                        for (i, (&gd, d)) in g.iter().zip(&declared).enumerate() {
                            if let Some(d) = d {
                                if *d as u64 != gd as u64 {
                                    return Err(ierr(format!(
                                        "dimension {i} is fixed at {d} by the model ({}), --input-shape gives {gd}",
                                        show()
                                    )));
                                }
                            }
                        }
                        g
                    }
                    None => {
                        if declared.iter().any(|d| d.is_none()) {
                            return Err(ierr(format!(
                                "the input has free dimensions ({}); bind them with --input-shape {name}=DIMS",
                                show()
                            )));
                        }
                        declared.iter().map(|d| d.unwrap_or(0) as usize).collect()
                    }
                }
            }
        };
        let shape = Shape::new(dims).map_err(|e| ierr(e.to_string()))?;
        let ty = TensorType::new(dtype, shape);
        let v = match value {
            Some(mut vals) => {
                // One value fills the whole input.
                if vals.len() == 1 {
                    vals = vec![vals[0]; ty.shape.numel()];
                }
                if vals.len() != ty.shape.numel() {
                    return Err(ierr(format!(
                        "--input-value gives {} values, type {ty} holds {}",
                        vals.len(),
                        ty.shape.numel()
                    )));
                }
                let t = Tensor::from_f64(dtype, ty.shape.clone(), &vals).map_err(|e| ierr(e.to_string()))?;
                self.add_const(&name, t)
            }
            None => {
                let n = self.fresh_name(&name);
                self.g.add_input(n, ty)
            }
        };
        Ok(v)
    }

    fn import_body(&mut self, graph: &GraphProto) -> Result<(), ImportError> {
        for i in topological_order(graph)? {
            self.import_node(&graph.node[i], i)?;
        }
        Ok(())
    }

    /// The values of a branch's or a body's `outputs` once its nodes are imported;
    /// `what` names the graph in the error for an output that is never defined.
    fn resolve_outputs(
        &mut self,
        outputs: &[proto::ValueInfoProto],
        what: &str,
        at: &At,
    ) -> Result<Vec<Val>, ImportError> {
        outputs
            .iter()
            .map(|o| {
                let name = o.name.clone().unwrap_or_default();
                self.resolve(&name).ok_or_else(|| at.err(format!("{what} output `{name}` is never defined")))
            })
            .collect()
    }

    fn import_outputs(&mut self, graph: &GraphProto) -> Result<(), ImportError> {
        let mut taken: HashSet<ValueId> = HashSet::new();
        for o in &graph.output {
            let name = o.name.clone().unwrap_or_default();
            let val = self
                .lookup_val(&name)
                .ok_or_else(|| ImportError::Model(format!("graph output `{name}` is never defined")))?;
            let declared_tensor =
                matches!(o.r#type.as_ref().and_then(|t| t.value.as_ref()), Some(type_proto::Value::TensorType(_)));
            if declared_tensor && val.tensor().is_none() {
                return Err(ImportError::Model(format!(
                    "graph output `{name}` is declared a tensor, but computes {}",
                    val.describe()
                )));
            }
            // A sequence or an optional is one output per tensor it holds (see `seq`).
            for (name, v) in val.flatten(&name) {
                self.output_tensor(&name, v, &mut taken);
            }
            let Val::T(v) = val else { continue };
            if let Some(type_proto::Value::TensorType(tt)) = o.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                let code = tt.elem_type.unwrap_or(0);
                if code != 0 && DType::from_onnx_code(code as i64) != Some(self.g.ty(v).dtype) {
                    return Err(ImportError::Model(format!(
                        "graph output `{name}` is declared with element type code {code}, but computes {}",
                        self.g.ty(v)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Makes `v` a graph output named `name`.
    fn output_tensor(&mut self, name: &str, v: ValueId, taken: &mut HashSet<ValueId>) {
        // Graph outputs carry their ONNX names. A value reached through
        // Identity (or also an input, or another output) gets an Identity node.
        let val = &self.g.values[v];
        let v = if val.name == name {
            v
        } else if matches!(val.def, ValueDef::Node { .. }) && !taken.contains(&v) && !self.g.outputs.contains(&v) {
            self.names.remove(&val.name);
            let fresh = self.fresh_name(name);
            self.g.values[v].name = fresh;
            v
        } else {
            let ty = self.g.ty(v).clone();
            let fresh = self.fresh_name(name);
            let (_, outs) = self.g.add_node(String::new(), Op::new(OpKind::Identity), vec![Some(v)], vec![(fresh, ty)]);
            outs[0]
        };
        taken.insert(v);
        self.g.outputs.push(v);
    }

    fn import_node(&mut self, n: &NodeProto, index: usize) -> Result<(), ImportError> {
        let label = node_label(n, index);
        let op_type = n.op_type.clone().unwrap_or_default();
        let at = At { node: &label, op_type: &op_type, opset: self.opset };
        let mut operands: Vec<Option<Val>> = Vec::with_capacity(n.input.len());
        for name in &n.input {
            if name.is_empty() {
                operands.push(None);
            } else {
                let v = self
                    .resolve(name)
                    .ok_or_else(|| at.err(format!("operand `{name}` is not defined before this node")))?;
                operands.push(Some(v));
            }
        }
        // Results nobody reads are dropped from the end of the list.
        let mut outputs: Vec<String> = n.output.clone();
        while outputs.len() > 1 && outputs.last().is_some_and(|o| o.is_empty() || !self.used.contains(o)) {
            outputs.pop();
        }
        let mut attrs = Attrs::default();
        let mut subgraphs: HashMap<String, &GraphProto> = HashMap::new();
        for a in &n.attribute {
            let name = a.name.clone().unwrap_or_default();
            if let Some(g) = &a.g {
                subgraphs.insert(name, g);
                continue;
            }
            if a.ref_attr_name.is_some() {
                return Err(at.err(format!("attribute `{name}` refers to a function attribute")));
            }
            if a.r#type == Some(AttributeType::TypeProto as i32) {
                // A type (`Optional`'s): values carry their own types here.
                continue;
            }
            let v = self.attr_value(a, &at)?;
            attrs.set(name, v);
        }
        let node = NodeCx {
            label: &label,
            op_type: &op_type,
            attrs: &attrs,
            outputs: &outputs,
            declared_outputs: n.output.len(),
            subgraphs: &subgraphs,
            at: &at,
        };
        if seq::handles(&op_type) {
            return seq::import(self, &node, &operands);
        }
        if op_type == "Identity" {
            let v = operands.into_iter().next().flatten().ok_or_else(|| at.err("Identity needs one operand"))?;
            self.bind_vals(&outputs, [v]);
            return Ok(());
        }
        if op_type == "Loop" {
            return self.import_loop(&node, &operands);
        }
        let inputs = seq::tensors(&operands, &n.input, &at)?;
        match op_type.as_str() {
            "Constant" => {
                let t = self.constant_value(&attrs, &at)?;
                let out = outputs.first().cloned().unwrap_or_default();
                let v = self.add_const(&out, t);
                self.bind(&out, v);
                Ok(())
            }
            "If" => self.import_if(&node, &inputs),
            t if expand::is_expanded(t) => expand::expand(self, &node, &inputs),
            t if decompose::domain_of(t).is_some() => decompose::decompose(self, &node, &inputs),
            "BatchNormalization" if decompose::is_training_batch_norm(&attrs, n.output.len()) => {
                decompose::decompose(self, &node, &inputs)
            }
            _ => {
                if let Some(k) = subgraphs.keys().next() {
                    return Err(at.err(format!("graph attribute `{k}` is not supported on this op")));
                }
                let mut c = canon::canonicalize(self, &op_type, attrs, inputs, outputs.len(), n.output.len(), &at)?;
                if let Some(results) = self.data_dependent(&c) {
                    return self.import_bounded(&label, c, results, &outputs, &at);
                }
                if self.run_time_scales(&c) {
                    return self.import_shape_checked(&label, c, &outputs, &at);
                }
                let vals = self.emit(&label, c.kind, std::mem::take(&mut c.attrs), c.inputs, &outputs, &at)?;
                self.bind_outputs(&outputs, vals);
                Ok(())
            }
        }
    }

    /// How many ONNX results a data-dependent op has (NonZero, Compress, Unique,
    /// NonMaxSuppression, TopK whose K is computed at run time); `None` for any other.
    fn data_dependent(&self, c: &canon::Canon) -> Option<usize> {
        match c.kind {
            OpKind::NonZero | OpKind::Compress | OpKind::NonMaxSuppression => Some(1),
            OpKind::Unique => Some(4),
            OpKind::TopK => {
                let k = c.inputs.get(1).copied().flatten()?;
                self.g.constant(k).is_none().then_some(2)
            }
            _ => None,
        }
    }

    /// Whether `c` is a Resize whose `scales`, a OneHot whose `depth` or a float Range
    /// whose operands are run-time data: then its result dims are declared and checked
    /// at run time (see [`Importer::import_shape_checked`]).
    fn run_time_scales(&self, c: &canon::Canon) -> bool {
        let run_time = |i: usize| {
            c.inputs
                .get(i)
                .copied()
                .flatten()
                .is_some_and(|s| self.g.constant(s).is_none() && self.g.ty(s).shape.numel() > 0)
        };
        match c.kind {
            OpKind::Resize => run_time(2),
            OpKind::OneHot => run_time(1),
            // Float operands (integer ones are shape operands to bind at compile time).
            OpKind::Range => {
                (0..3).any(run_time)
                    && c.inputs.first().copied().flatten().is_some_and(|s| self.g.ty(s).dtype.is_float())
            }
            _ => false,
        }
    }

    /// A Resize with run-time `scales` (OneHot, Range) in its shape-checked form (see
    /// `kiln_ir::dynamic`): compiled for the dims declared for its result
    /// (`--output-shape`, else the model's), with a second result the runtime checks.
    /// Without a declaration the node is imported as it is, and shape inference says
    /// what is missing.
    fn import_shape_checked(
        &mut self,
        label: &str,
        mut c: canon::Canon,
        outputs: &[String],
        at: &At,
    ) -> Result<(), ImportError> {
        let out = outputs.first().cloned().unwrap_or_default();
        let declared = self.declared_shapes.iter_mut().find(|(n, ..)| !out.is_empty() && *n == out);
        let Some(d) = declared else {
            let vals = self.emit(label, c.kind, std::mem::take(&mut c.attrs), c.inputs, outputs, at)?;
            self.bind_outputs(outputs, vals);
            return Ok(());
        };
        d.3 = true;
        let dims: Vec<i64> = d.1.iter().map(|&x| x as i64).collect();
        c.attrs.set("kiln_dims", Attr::Ints(dims));
        let names = vec![out.clone(), format!("{out}.shape_check")];
        let vals = self.emit(label, c.kind, c.attrs, c.inputs, &names, at)?;
        self.bind_outputs(outputs, vals.into_iter().take(1));
        Ok(())
    }

    /// A data-dependent op in its bounded form (see `kiln_ir::dynamic`): every ONNX
    /// result plus the extent, the bound from `--max-dim` when one names a result.
    fn import_bounded(
        &mut self,
        label: &str,
        mut c: canon::Canon,
        results: usize,
        outputs: &[String],
        at: &At,
    ) -> Result<(), ImportError> {
        let mut names: Vec<String> = outputs.to_vec();
        names.resize(results, String::new());
        if let Some(m) = self.max_dims.iter_mut().find(|(n, _, _)| !n.is_empty() && names.contains(n)) {
            m.2 = true;
            c.attrs.set("kiln_bound", Attr::Int(m.1 as i64));
        }
        let base = names.first().filter(|n| !n.is_empty()).cloned().unwrap_or_else(|| label.to_string());
        names.push(format!("{base}.extent"));
        let vals = self.emit(label, c.kind, c.attrs, c.inputs, &names, at)?;
        self.bind_outputs(outputs, vals.into_iter().take(outputs.len()));
        Ok(())
    }

    /// An `If`: inlined when its condition is a constant, else an [`OpKind::If`] node
    /// with both branches imported (see the module docs).
    fn import_if(&mut self, node: &NodeCx, inputs: &[Option<ValueId>]) -> Result<(), ImportError> {
        let NodeCx { label, outputs, declared_outputs, subgraphs, at, .. } = *node;
        let cond = inputs.first().copied().flatten().ok_or_else(|| at.err("If needs a condition"))?;
        if self.g.constant(cond).is_some() {
            return self.inline_if(inputs, outputs, subgraphs, at);
        }
        let mut branches: Vec<(Graph, Vec<ValueId>)> = Vec::with_capacity(2);
        // What each branch gives per output (a tensor, a sequence, an optional).
        let mut forms: Vec<Vec<Val>> = Vec::with_capacity(2);
        for key in ["then_branch", "else_branch"] {
            let branch = subgraphs.get(key).ok_or_else(|| at.err(format!("attribute `{key}` is missing")))?;
            check_supported(branch, &self.opsets)?;
            if branch.output.len() != declared_outputs {
                return Err(
                    at.err(format!("{key} has {} outputs, the If node has {declared_outputs}", branch.output.len()))
                );
            }
            if !branch.input.is_empty() {
                return Err(at.err(format!("{key} declares {} inputs; an If branch takes none", branch.input.len())));
            }
            let frame = Frame {
                g: std::mem::replace(&mut self.g, Graph::new(format!("{label}.{key}"))),
                scopes: std::mem::replace(&mut self.scopes, vec![HashMap::new()]),
                captures: std::mem::take(&mut self.captures),
            };
            self.parents.push(frame);
            let r = (|| {
                self.import_initializers(branch)?;
                self.import_body(branch)?;
                self.resolve_outputs(&branch.output[..outputs.len()], key, at)
            })();
            let Some(frame) = self.parents.pop() else {
                return Err(at.err("internal: the enclosing graph was lost"));
            };
            let mut g = std::mem::replace(&mut self.g, frame.g);
            self.scopes = frame.scopes;
            let captures = std::mem::replace(&mut self.captures, frame.captures);
            let vals = r?;
            g.outputs = vals.iter().flat_map(|v| v.flatten("")).map(|(_, v)| v).collect();
            branches.push((g, captures));
            forms.push(vals);
        }
        // Sequences and optionals are their tensors: both branches must give the same
        // number of them (a sequence's length, an optional's presence).
        let (Some(then_forms), Some(else_forms)) = (forms.first(), forms.get(1)) else {
            return Err(at.err("internal: a branch was lost"));
        };
        for ((name, t), e) in outputs.iter().zip(then_forms).zip(else_forms) {
            if !t.same_form(e) {
                // A trip of an unrolled Loop (`import_loop`'s internal names): then_branch
                // is the body, else_branch passes the values through.
                let what = match name.strip_prefix('\u{1}').map(|n| n.rsplit(' ').collect::<Vec<_>>()) {
                    Some(parts) if parts.len() >= 2 => format!(
                        "loop-carried value {} is {} after trip {} and {} before it; whether the trip runs",
                        parts[0].trim_start_matches("out").parse::<usize>().unwrap_or(1).saturating_sub(1),
                        t.describe(),
                        parts[1],
                        e.describe()
                    ),
                    _ => format!(
                        "output `{name}` is {} in then_branch and {} in else_branch, so its form",
                        t.describe(),
                        e.describe()
                    ),
                };
                return Err(at.err(format!(
                    "unsupported: {what} depends on run-time data (the condition); bind the inputs the condition reads with --input-value"
                )));
            }
        }
        let flat_names: Vec<String> =
            outputs.iter().zip(then_forms).flat_map(|(n, f)| f.flatten(n)).map(|(n, _)| n).collect();
        let shapes: Vec<Val> = then_forms.clone();
        // Both branches take every captured value, in one order.
        let mut union: Vec<ValueId> = Vec::new();
        for (_, caps) in &branches {
            for &c in caps {
                if !union.contains(&c) {
                    union.push(c);
                }
            }
        }
        let mut graphs = Vec::with_capacity(2);
        for (mut g, caps) in branches {
            let own = g.inputs.clone();
            g.inputs.clear();
            for &u in &union {
                let v = match caps.iter().position(|&c| c == u) {
                    Some(k) => own[k],
                    None => {
                        let ty = self.g.ty(u).clone();
                        g.values.push(kiln_ir::Value { ty, name: String::new(), def: ValueDef::Input })
                    }
                };
                g.inputs.push(v);
            }
            graphs.push(Box::new(g.without_dead_code()));
        }
        let (Some(else_branch), Some(then_branch)) = (graphs.pop(), graphs.pop()) else {
            return Err(at.err("internal: a branch was lost"));
        };
        let attrs =
            Attrs::new().with("then_branch", Attr::Graph(then_branch)).with("else_branch", Attr::Graph(else_branch));
        let mut operands = vec![Some(cond)];
        operands.extend(union.into_iter().map(Some));
        let vals = if flat_names.is_empty() {
            Vec::new()
        } else {
            self.emit(label, OpKind::If, attrs, operands, &flat_names, at)?
        };
        let mut it = vals.into_iter();
        let rebuilt: Vec<Val> = shapes
            .iter()
            .map(|f| f.rebuild(&mut it))
            .collect::<Option<_>>()
            .ok_or_else(|| at.err("internal: the If lost a result"))?;
        self.bind_vals(outputs, rebuilt);
        Ok(())
    }

    /// A `Loop`, unrolled (see the module docs).
    fn import_loop(&mut self, node: &NodeCx, inputs: &[Option<Val>]) -> Result<(), ImportError> {
        let NodeCx { label, outputs, declared_outputs, subgraphs, at, .. } = *node;
        let body = *subgraphs.get("body").ok_or_else(|| at.err("attribute `body` is missing"))?;
        let n_carried = inputs.len().saturating_sub(2);
        if body.input.len() != n_carried + 2 {
            return Err(at.err(format!(
                "the body takes {} inputs; the Loop passes {n_carried} loop-carried values, so it needs {}",
                body.input.len(),
                n_carried + 2
            )));
        }
        if body.output.len() < n_carried + 1 {
            return Err(at.err(format!(
                "the body gives {} outputs; it needs the condition and {n_carried} loop-carried values",
                body.output.len()
            )));
        }
        let n_scan = body.output.len() - 1 - n_carried;
        if declared_outputs != n_carried + n_scan {
            return Err(at.err(format!(
                "the Loop has {declared_outputs} outputs, its body gives {n_carried} loop-carried values and {n_scan} scan outputs"
            )));
        }
        let tensor_at = |k: usize| match inputs.get(k).cloned().flatten() {
            None => Ok(None),
            Some(Val::T(v)) => Ok(Some(v)),
            Some(other) => Err(at.err(format!("operand {k} must be a tensor, it is {}", other.describe()))),
        };
        let m = tensor_at(0)?;
        let m_const: Option<i64> = match m {
            Some(v) => match self.g.constant(v) {
                Some(t) => match t.to_f64_vec().as_slice() {
                    [x] => Some(*x as i64),
                    _ => return Err(at.err(format!("the trip count must hold one element, it is {}", t.ty()))),
                },
                None => None,
            },
            None => None,
        };
        let m_runtime = m.filter(|_| m_const.is_none());
        let bound = match (m_const, self.max_trips) {
            (Some(c), None) if c.max(0) as u64 > MAX_UNROLLED_TRIPS => {
                return Err(at.err(format!(
                    "the trip count is {c}, more than the {MAX_UNROLLED_TRIPS} trips kiln unrolls unasked; declare a bound with --max-trips N"
                )))
            }
            (Some(c), None) => c.max(0) as usize,
            (Some(c), Some(t)) => (c.max(0) as usize).min(t),
            (None, Some(t)) => t,
            (None, None) => {
                let why = if m.is_some() { "depends on run-time data" } else { "is not given (a while loop)" };
                return Err(at.err(format!(
                    "the trip count {why}: a static plan needs a bound; declare one with --max-trips N"
                )));
            }
        };
        let mut cond: Option<ValueId> = tensor_at(1)?;
        let mut carried: Vec<Val> = Vec::with_capacity(n_carried);
        for v in inputs.iter().skip(2) {
            carried.push(v.clone().ok_or_else(|| at.err("a loop-carried value is absent"))?);
        }
        let mut scans: Vec<Vec<ValueId>> = vec![Vec::new(); n_scan];
        let ident = |from: &str, to: &str| NodeProto {
            op_type: Some("Identity".into()),
            input: vec![from.to_string()],
            output: vec![to.to_string()],
            ..Default::default()
        };
        let named = |n: &str| proto::ValueInfoProto { name: Some(n.to_string()), ..Default::default() };
        for i in 0..bound {
            let tag = format!("{label}#{i}");
            // The trip runs when the condition holds and, with a run-time count, i < M.
            let mut c = cond;
            if let Some(mv) = m_runtime {
                let iv = self.add_const("", Tensor::scalar(i as i64));
                let lt = self.emit(&tag, OpKind::Less, Attrs::new(), vec![Some(iv), Some(mv)], &[String::new()], at)?;
                let lt = lt.first().copied().ok_or_else(|| at.err("internal: Less gave no result"))?;
                c = Some(match c {
                    None => lt,
                    Some(cv) => {
                        let a =
                            self.emit(&tag, OpKind::And, Attrs::new(), vec![Some(cv), Some(lt)], &[String::new()], at)?;
                        a.first().copied().ok_or_else(|| at.err("internal: And gave no result"))?
                    }
                });
            }
            let known = match c {
                None => Some(true),
                Some(v) => self.g.constant(v).map(|t| t.to_f64_vec().iter().any(|&x| x != 0.0)),
            };
            if known == Some(false) {
                break;
            }
            if known.is_none() && n_scan > 0 {
                return Err(at.err(
                    "unsupported: scan outputs of a Loop whose trips depend on run-time data (their length would vary); bind what the condition reads with --input-value",
                ));
            }
            // The trip's inputs under names of their own, read by the then-branch.
            let nm = |k: &str| format!("\u{1}loop {label} {i} {k}");
            let cond_v = match c {
                Some(v) => v,
                None => self.add_const("", Tensor::scalar(true)),
            };
            let iter_v = self.add_const("", Tensor::scalar(i as i64));
            self.bind(&nm("iter"), iter_v);
            self.bind(&nm("cond"), cond_v);
            let mut then = GraphProto {
                name: Some(format!("{label}.body")),
                initializer: body.initializer.clone(),
                ..Default::default()
            };
            let names_in: Vec<String> = body.input.iter().map(|x| x.name.clone().unwrap_or_default()).collect();
            then.node.push(ident(&nm("iter"), &names_in[0]));
            then.node.push(ident(&nm("cond"), &names_in[1]));
            for (k, v) in carried.iter().enumerate() {
                self.bind_val(&nm(&format!("v{k}")), v.clone());
                then.node.push(ident(&nm(&format!("v{k}")), &names_in[2 + k]));
            }
            then.node.extend(body.node.iter().cloned());
            let taken = if known.is_some() { body.output.len() } else { 1 + n_carried };
            then.output = body.output[..taken].to_vec();
            let mut els = GraphProto { name: Some(format!("{label}.pass")), ..Default::default() };
            els.output.push(named(&nm("cond")));
            for k in 0..n_carried {
                els.output.push(named(&nm(&format!("v{k}"))));
            }
            let out_names: Vec<String> = (0..taken).map(|k| nm(&format!("out{k}"))).collect();
            let subs: HashMap<String, &GraphProto> =
                [("then_branch".to_string(), &then), ("else_branch".to_string(), &els)].into_iter().collect();
            let trip = NodeCx {
                label: &tag,
                op_type: "If",
                attrs: &Attrs::default(),
                outputs: &out_names,
                declared_outputs: taken,
                subgraphs: &subs,
                at,
            };
            self.import_if(&trip, &[Some(cond_v)])?;
            let outs: Vec<Val> = out_names
                .iter()
                .map(|n| self.lookup_val(n).ok_or_else(|| at.err(format!("internal: trip {i} lost a result"))))
                .collect::<Result<_, _>>()?;
            let tensor = |v: &Val, what: &str| {
                v.tensor().ok_or_else(|| at.err(format!("the body's {what} must be a tensor, it is {}", v.describe())))
            };
            cond = Some(tensor(&outs[0], "condition")?);
            carried = outs[1..1 + n_carried].to_vec();
            for (k, s) in scans.iter_mut().enumerate() {
                s.push(tensor(&outs[1 + n_carried + k], "scan output")?);
            }
        }
        for (k, name) in outputs.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            if k < n_carried {
                self.bind_val(name, carried[k].clone());
                continue;
            }
            let v = {
                let parts = &scans[k - n_carried];
                if parts.is_empty() {
                    return Err(at.err(
                        "unsupported: a scan output of a Loop that runs no trip (an empty tensor of unknown shape)",
                    ));
                }
                let axes = self.add_const(
                    "",
                    Tensor::from_vec(Shape::new([1]).map_err(|e| at.err(e.to_string()))?, vec![0i64])
                        .map_err(|e| at.err(e.to_string()))?,
                );
                let mut rows = Vec::with_capacity(parts.len());
                for &p in parts {
                    let u = self.emit(
                        label,
                        OpKind::Unsqueeze,
                        Attrs::new(),
                        vec![Some(p), Some(axes)],
                        &[String::new()],
                        at,
                    )?;
                    rows.push(
                        u.first().copied().map(Some).ok_or_else(|| at.err("internal: Unsqueeze gave no result"))?,
                    );
                }
                let cat = self.emit(
                    label,
                    OpKind::Concat,
                    Attrs::new().with("axis", Attr::Int(0)),
                    rows,
                    std::slice::from_ref(name),
                    at,
                )?;
                cat.first().copied().ok_or_else(|| at.err("internal: Concat gave no result"))?
            };
            self.bind(name, v);
        }
        Ok(())
    }

    /// Replaces `If` by the branch its (constant) condition selects.
    fn inline_if(
        &mut self,
        inputs: &[Option<ValueId>],
        outputs: &[String],
        subgraphs: &HashMap<String, &GraphProto>,
        at: &At,
    ) -> Result<(), ImportError> {
        let cond = inputs.first().copied().flatten().ok_or_else(|| at.err("If needs a condition"))?;
        let Some(c) = self.g.constant(cond) else {
            return Err(at.err("internal: inlining an If whose condition is not constant"));
        };
        let taken = match c.to_f64_vec().as_slice() {
            [x] => *x != 0.0,
            _ => return Err(at.err(format!("the condition must hold one element, it is {}", c.ty()))),
        };
        let key = if taken { "then_branch" } else { "else_branch" };
        let branch = subgraphs.get(key).ok_or_else(|| at.err(format!("attribute `{key}` is missing")))?;
        check_supported(branch, &self.opsets)?;
        if branch.output.len() < outputs.len() {
            return Err(at.err(format!(
                "{key} has {} outputs, the If node needs {}",
                branch.output.len(),
                outputs.len()
            )));
        }
        self.scopes.push(HashMap::new());
        let r = (|| {
            self.import_initializers(branch)?;
            self.import_body(branch)?;
            self.resolve_outputs(&branch.output, key, at)
        })();
        self.scopes.pop();
        self.bind_vals(outputs, r?);
        Ok(())
    }

    fn attr_value(&mut self, a: &proto::AttributeProto, at: &At) -> Result<Attr, ImportError> {
        let name = a.name.clone().unwrap_or_default();
        let ty = a.r#type.and_then(|t| AttributeType::try_from(t).ok()).unwrap_or_else(|| {
            // Old models leave `type` unset: tell by the field that is filled.
            if a.f.is_some() {
                AttributeType::Float
            } else if a.i.is_some() {
                AttributeType::Int
            } else if a.s.is_some() {
                AttributeType::String
            } else if a.t.is_some() {
                AttributeType::Tensor
            } else if !a.floats.is_empty() {
                AttributeType::Floats
            } else if !a.ints.is_empty() {
                AttributeType::Ints
            } else if !a.strings.is_empty() {
                AttributeType::Strings
            } else {
                AttributeType::Undefined
            }
        });
        let s = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
        Ok(match ty {
            AttributeType::Float => Attr::Float(a.f.unwrap_or(0.0)),
            AttributeType::Int => Attr::Int(a.i.unwrap_or(0)),
            AttributeType::String => Attr::String(a.s.as_ref().map(s).unwrap_or_default()),
            AttributeType::Floats => Attr::Floats(a.floats.clone()),
            AttributeType::Ints => Attr::Ints(a.ints.clone()),
            AttributeType::Strings => Attr::Strings(a.strings.iter().map(s).collect()),
            AttributeType::Tensor => {
                let t = a.t.as_ref().ok_or_else(|| at.err(format!("tensor attribute `{name}` has no tensor")))?;
                Attr::Tensor(tensor_from_proto(t, &mut self.ext)?)
            }
            other => return Err(at.err(format!("attribute `{name}` has unsupported kind {other:?}"))),
        })
    }

    /// The tensor of a `Constant` node.
    fn constant_value(&self, attrs: &Attrs, at: &At) -> Result<Tensor, ImportError> {
        let (name, a) = attrs.iter().next().ok_or_else(|| at.err("Constant has no value attribute"))?;
        let bad = |e: String| at.err(e);
        match (name, a) {
            ("value", Attr::Tensor(t)) => Ok(t.clone()),
            ("value_float", Attr::Float(x)) => Ok(Tensor::scalar(*x)),
            ("value_int", Attr::Int(x)) => Ok(Tensor::scalar(*x)),
            ("value_floats", Attr::Floats(v)) => {
                Tensor::from_vec(Shape::new([v.len()]).map_err(|e| bad(e.to_string()))?, v.clone())
                    .map_err(|e| bad(e.to_string()))
            }
            ("value_ints", Attr::Ints(v)) => {
                Tensor::from_vec(Shape::new([v.len()]).map_err(|e| bad(e.to_string()))?, v.clone())
                    .map_err(|e| bad(e.to_string()))
            }
            (n, _) if n.starts_with("value_string") => Err(at.err("string constants are not supported")),
            (n, _) => Err(at.err(format!("unsupported Constant attribute `{n}`"))),
        }
    }

    /// Adds one operator application: infers its result types, and folds it into
    /// constants when its operands are known.
    pub(crate) fn emit(
        &mut self,
        node_name: &str,
        kind: OpKind,
        attrs: Attrs,
        inputs: Vec<Option<ValueId>>,
        out_names: &[String],
        at: &At,
    ) -> Result<Vec<ValueId>, ImportError> {
        // The one place ONNX attributes become typed: later stages read the struct.
        let op = Op::parse(kind, &attrs).map_err(|e| match e {
            AttrError::Unsupported { .. } => at.err(format!("unsupported: {e}")),
            e => at.err(e.to_string()),
        })?;
        let num_outputs = out_names.len().max(1);
        let tys = self.g.infer_op(&op, &inputs, num_outputs).map_err(|e| match e {
            InferError::Invalid(m) => at.err(m),
            InferError::Unsupported(m) => at.err(format!("unsupported: {m}")),
        })?;
        let name_of = |i: usize| out_names.get(i).cloned().unwrap_or_default();
        // Results that depend only on operand types (Shape, Size).
        if let (Some(Some(v)), [out]) = (inputs.first(), tys.as_slice()) {
            // A bounded dimension (kiln_ir::bounded) has no static extent to fold.
            if matches!(op.kind, kiln_ir::OpKind::Shape | kiln_ir::OpKind::Size) && !self.g.bounded.is_empty() {
                use kiln_ir::entity::EntityId;
                let axes = kiln_ir::bounded::analyse_with(&self.g, false).unwrap_or_default();
                if axes.get(v.index()).is_some_and(|a| !a.is_empty()) {
                    return Err(at.err(format!(
                        "{} reads the extent of a bounded dimension (--input-shape with a range) as data, \
                         which a static plan cannot give",
                        op.kind
                    )));
                }
            }
            if let Some(r) = kiln_opt::fold::fold_from_type(&op, self.g.ty(*v), out) {
                let t = r.map_err(|m| at.err(m))?;
                return Ok(vec![self.add_const(&name_of(0), t)]);
            }
        }
        // Nodes with constant operands fold (within kiln-opt's folding policy).
        if let Some(args) =
            kiln_opt::fold::constant_operands(&self.g, &inputs).filter(|a| kiln_opt::fold::folds_at_import(&op, a))
        {
            let folded = kiln_opt::fold::try_fold(&op, &args, &tys)
                .map_err(|e| at.err(format!("constant folding failed: {e}")))?;
            if let Some(outs) = folded {
                return Ok(outs.into_iter().enumerate().map(|(i, t)| self.add_const(&name_of(i), t)).collect());
            }
        }
        let outs: Vec<(String, TensorType)> =
            tys.into_iter().enumerate().map(|(i, ty)| (self.fresh_name(&name_of(i)), ty)).collect();
        let (_, vals) = self.g.add_node(node_name.to_string(), op, inputs, outs);
        Ok(vals)
    }
}

fn dims_str(d: &[usize]) -> String {
    if d.is_empty() {
        "scalar".into()
    } else {
        d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x")
    }
}

fn quoted_list(names: &[String]) -> String {
    if names.is_empty() {
        return "(none)".into();
    }
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}
