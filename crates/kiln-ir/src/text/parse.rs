//! The parser.

use super::lex::{
    fail, int_parts, is_hex, lex, lit_code as syntax_lit_code, parse_int, Cursor, SResult as PResult,
    SyntaxError as PErr, Tok,
};
use super::print::{BF16_NAN, F16_NAN, F32_NAN, F64_NAN};
use super::ParseError;
use crate::dtype::DType;
use crate::entity::EntityId;
use crate::graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
use crate::op::{Attr, Attrs, Op, OpKind};
use crate::shape::TensorType;
use crate::tensor::Tensor;
use bytes::Bytes;
use half::{bf16, f16};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Parses the text form (see the [module docs](super)) into a graph.
///
/// Never panics; every error names the line and column of the offending token.
pub fn parse(src: &str) -> Result<Graph, ParseError> {
    let (toks, lex_error) = lex(src);
    let mut p = Parser { cur: Cursor::new(toks), values: BTreeMap::new(), nodes: Vec::new() };
    // The scan stopped at a lexing error: report it unless the parser failed before it.
    let result = match (p.file(), lex_error) {
        (Err(e), Some(l)) if l.pos <= e.pos => Err((l.pos, l.message)),
        (Err(e), _) => Err((e.pos, e.message)),
        (Ok(_), Some(l)) => Err((l.pos, l.message)),
        (Ok(parsed), None) => p.finish(parsed).map_err(|e| (e.pos, e.message)),
    };
    result.map_err(|(pos, message)| ParseError::at(src, pos, message))
}

/// A tensor literal before blobs are resolved.
enum TLit {
    Ready(Tensor),
    Blob { ty: TensorType, index: u64, pos: usize },
}

enum PDef {
    Input,
    Const(TLit),
    Node { node: usize, index: usize },
}

struct PValue {
    ty: TensorType,
    name: String,
    def: PDef,
    pos: usize,
}

enum PAttr {
    Ready(Attr),
    Tensor(TLit),
}

struct PNode {
    /// Offset of the op name (for attribute errors).
    pos: usize,
    name: String,
    kind: OpKind,
    attrs: Vec<(String, PAttr)>,
    inputs: Vec<Option<ValueId>>,
    outputs: Vec<ValueId>,
}

/// One element or scalar literal, with the offset of its first token.
enum Lit {
    /// A number token as written.
    Num(String),
    Inf {
        neg: bool,
    },
    /// `nan`, `-nan`, `nan(0x…)`.
    Nan {
        neg: bool,
        bits: Option<(u64, usize)>,
    },
    Bool(bool),
    Str(String),
}

/// What [`Parser::file`] returns besides the values and nodes it collects.
struct Parsed {
    name: String,
    quant: crate::graph::QuantSemantics,
    inputs: Vec<ValueId>,
    outputs: Vec<(u32, usize)>,
    blobs: HashMap<u64, Bytes>,
}

struct Parser {
    cur: Cursor,
    values: BTreeMap<u32, PValue>,
    nodes: Vec<PNode>,
}

impl core::ops::Deref for Parser {
    type Target = Cursor;
    fn deref(&self) -> &Cursor {
        &self.cur
    }
}

impl core::ops::DerefMut for Parser {
    fn deref_mut(&mut self) -> &mut Cursor {
        &mut self.cur
    }
}

impl Parser {
    /// An identifier or a quoted string (graph and attribute names).
    fn name(&mut self, what: &str) -> PResult<String> {
        match self.bump() {
            (Tok::Ident(s) | Tok::Str(s), _) => Ok(s),
            (t, pos) => fail(pos, format!("expected {what}, found {t}")),
        }
    }

    fn opt_string(&mut self) -> Option<String> {
        match self.peek() {
            Tok::Str(_) => match self.bump() {
                (Tok::Str(s), _) => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    /// The whole file up to end of input; blob references and id density are checked
    /// afterwards by [`Parser::finish`].
    fn file(&mut self) -> PResult<Parsed> {
        self.expect_kw("graph", "at the start of the file")?;
        self.expect(&Tok::At, "before the graph name")?;
        let name = self.name("the graph name (an identifier or a string)")?;
        let mut quant = crate::graph::QuantSemantics::default();
        if self.is_kw("quant") {
            self.bump();
            let pos = self.pos();
            let s = self.name("the quantization semantics after `quant`")?;
            quant = crate::graph::QuantSemantics::from_name(&s).ok_or_else(|| PErr {
                pos,
                message: format!("unknown quantization semantics `{s}` (integer, onnxruntime_cpu)"),
            })?;
        }
        self.expect(&Tok::LParen, "before the graph inputs")?;
        let mut inputs = Vec::new();
        self.separated(&Tok::RParen, "a graph input", |p| {
            let (id, pos) = p.value_token("a graph input")?;
            p.check_new(id, pos)?;
            p.expect(&Tok::Colon, "after the input's value")?;
            let ty = p.tensor_type()?;
            let name = p.opt_string().unwrap_or_default();
            p.values.insert(id, PValue { ty, name, def: PDef::Input, pos });
            inputs.push(ValueId::new(id as usize));
            Ok(())
        })?;
        self.expect(&Tok::Arrow, "after the graph inputs")?;
        self.expect(&Tok::LParen, "before the graph outputs")?;
        let mut outputs = Vec::new();
        self.separated(&Tok::RParen, "a graph output", |p| {
            outputs.push(p.value_token("a graph output")?);
            Ok(())
        })?;
        self.expect(&Tok::LBrace, "before the graph body")?;
        while !self.eat(&Tok::RBrace) {
            self.statement()?;
        }
        let blobs = if self.is_kw("blobs") { self.blobs()? } else { HashMap::new() };
        if *self.peek() != Tok::Eof {
            return fail(self.pos(), format!("expected `blobs` or end of input, found {}", self.peek()));
        }
        Ok(Parsed { name, quant, inputs, outputs, blobs })
    }

    fn value_token(&mut self, what: &str) -> PResult<(u32, usize)> {
        match self.bump() {
            (Tok::Ref(v), pos) => Ok((v, pos)),
            (t, pos) => fail(pos, format!("expected {what} (`%N`), found {t}")),
        }
    }

    fn check_new(&self, id: u32, pos: usize) -> PResult<()> {
        if self.values.contains_key(&id) {
            return fail(pos, format!("value %{id} defined twice"));
        }
        Ok(())
    }

    fn statement(&mut self) -> PResult<()> {
        let start = self.pos();
        let mut results = Vec::new();
        if let Tok::Ref(_) = self.peek() {
            loop {
                let (id, pos) = self.value_token("a result")?;
                self.check_new(id, pos)?;
                if results.iter().any(|&(r, _)| r == id) {
                    return fail(pos, format!("value %{id} defined twice"));
                }
                results.push((id, pos));
                if self.eat(&Tok::Eq) {
                    break;
                }
                self.expect(&Tok::Comma, "or `=` after a result")?;
            }
            if self.is_kw("const") {
                self.bump();
                if results.len() != 1 {
                    return fail(start, "a constant defines exactly one value");
                }
                let (id, pos) = results[0];
                let lit = self.tensor_lit()?;
                let ty = if self.eat(&Tok::Colon) {
                    self.tensor_type()?
                } else {
                    match &lit {
                        TLit::Ready(t) => t.ty().clone(),
                        TLit::Blob { ty, .. } => ty.clone(),
                    }
                };
                let name = self.opt_string().unwrap_or_default();
                self.values.insert(id, PValue { ty, name, def: PDef::Const(lit), pos });
                return Ok(());
            }
        }
        let (tok, op_pos) = self.bump();
        let kind: OpKind = match &tok {
            Tok::Ident(s) => s.parse().map_err(|_| PErr { pos: op_pos, message: format!("unknown op `{s}`") })?,
            t if results.is_empty() => {
                return fail(op_pos, format!("expected a statement (`%N = …`, an op, or `}}`), found {t}"))
            }
            t => return fail(op_pos, format!("expected an op name or `const` after `=`, found {t}")),
        };
        self.expect(&Tok::LParen, &format!("after the op name `{}`", kind.name()))?;
        let mut inputs = Vec::new();
        self.separated(&Tok::RParen, "operand", |p| {
            let (t, pos) = p.bump();
            match t {
                Tok::Ident(s) if s == "_" => inputs.push(None),
                Tok::Ref(v) => {
                    if !p.values.contains_key(&v) {
                        return fail(pos, format!("value %{v} used before definition"));
                    }
                    inputs.push(Some(ValueId::new(v as usize)));
                }
                t => return fail(pos, format!("expected an operand (`%N` or `_`), found {t}")),
            }
            Ok(())
        })?;
        let mut attrs: Vec<(String, PAttr)> = Vec::new();
        if self.eat(&Tok::LBrace) {
            let mut seen = HashSet::new();
            self.separated(&Tok::RBrace, "an attribute", |p| {
                let pos = p.pos();
                let name = p.name("an attribute name")?;
                if !seen.insert(name.clone()) {
                    return fail(pos, format!("attribute `{name}` given twice"));
                }
                p.expect(&Tok::Eq, &format!("after attribute name `{name}`"))?;
                let a = p.attr_value()?;
                attrs.push((name, a));
                Ok(())
            })?;
        }
        let mut types = Vec::new();
        if !results.is_empty() && *self.peek() != Tok::Colon {
            return fail(
                self.pos(),
                format!("expected `:` and the result types after `{}(…)`, found {}", kind.name(), self.peek()),
            );
        }
        if self.eat(&Tok::Colon) {
            loop {
                let pos = self.pos();
                if types.len() == results.len() {
                    return fail(pos, format!("more result types than results (the node defines {})", results.len()));
                }
                let ty = self.tensor_type()?;
                let name = self.opt_string().unwrap_or_default();
                types.push((ty, name));
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        if types.len() != results.len() {
            return fail(
                self.pos(),
                format!("expected {} result type(s) after `:`, found {}", results.len(), types.len()),
            );
        }
        let name = if self.is_kw("node") {
            self.bump();
            match self.bump() {
                (Tok::Str(s), _) => s,
                (t, pos) => return fail(pos, format!("expected the node name (a string) after `node`, found {t}")),
            }
        } else {
            String::new()
        };
        let node = self.nodes.len();
        let mut outputs = Vec::new();
        for (index, ((id, pos), (ty, vname))) in results.into_iter().zip(types).enumerate() {
            self.values.insert(id, PValue { ty, name: vname, def: PDef::Node { node, index }, pos });
            outputs.push(ValueId::new(id as usize));
        }
        self.nodes.push(PNode { pos: op_pos, name, kind, attrs, inputs, outputs });
        Ok(())
    }

    /// The elements of a comma-separated list closed by `close` (its opening token already
    /// taken; none when `close` comes first): `item` reads each, `what` names one in the error
    /// for a missing separator.
    fn separated(&mut self, close: &Tok, what: &str, mut item: impl FnMut(&mut Self) -> PResult<()>) -> PResult<()> {
        if self.eat(close) {
            return Ok(());
        }
        loop {
            item(self)?;
            if self.eat(close) {
                return Ok(());
            }
            self.expect(&Tok::Comma, &format!("or {close} after {what}"))?;
        }
    }

    /// `TYPE [elements]` or `TYPE blob(N)`.
    fn tensor_lit(&mut self) -> PResult<TLit> {
        let ty = self.tensor_type()?;
        if let Some((index, pos)) = self.blob_ref()? {
            return Ok(TLit::Blob { ty, index, pos });
        }
        let open = self.expect(&Tok::LBrack, "(the elements) or `blob(N)` after the constant's type")?;
        let lits = self.lit_list()?;
        let n = ty.shape.numel();
        if lits.len() != n {
            return fail(open, format!("constant has {} elements, type {ty} needs {n}", lits.len()));
        }
        let bytes = encode_elements(ty.dtype, &lits)?;
        Tensor::new(ty, Bytes::from(bytes)).map(TLit::Ready).map_err(|e| PErr { pos: open, message: e.to_string() })
    }

    /// Literals up to and including `]` (the `[` is already consumed).
    fn lit_list(&mut self) -> PResult<Vec<(Lit, usize)>> {
        let mut lits = Vec::new();
        if self.eat(&Tok::RBrack) {
            return Ok(lits);
        }
        loop {
            lits.push(self.lit()?);
            if self.eat(&Tok::RBrack) {
                return Ok(lits);
            }
            if *self.peek() != Tok::Comma {
                return fail(self.pos(), format!("expected `,` or `]` after a list element, found {}", self.peek()));
            }
            self.bump();
        }
    }

    fn lit(&mut self) -> PResult<(Lit, usize)> {
        let (t, pos) = self.bump();
        let lit = match t {
            Tok::Num(s) => Lit::Num(s),
            Tok::Str(s) => Lit::Str(s),
            Tok::Minus => match self.bump() {
                (Tok::Ident(s), _) if s == "inf" => Lit::Inf { neg: true },
                (Tok::Ident(s), _) if s == "nan" => Lit::Nan { neg: true, bits: self.nan_bits()? },
                (t, pos) => return fail(pos, format!("expected a number, `inf` or `nan` after `-`, found {t}")),
            },
            Tok::Ident(s) => match s.as_str() {
                "inf" => Lit::Inf { neg: false },
                "nan" => Lit::Nan { neg: false, bits: self.nan_bits()? },
                "true" => Lit::Bool(true),
                "false" => Lit::Bool(false),
                _ => return fail(pos, format!("expected a literal, found `{s}`")),
            },
            t => return fail(pos, format!("expected a literal, found {t}")),
        };
        Ok((lit, pos))
    }

    fn attr_value(&mut self) -> PResult<PAttr> {
        let pos = self.pos();
        if let Tok::Ident(s) = self.peek() {
            let s = s.clone();
            if let "ints" | "floats" | "strings" = s.as_str() {
                self.bump();
                self.expect(&Tok::LBrack, &format!("after `{s}` (an empty list is written `{s} []`)"))?;
                self.expect(&Tok::RBrack, &format!("after `{s} [` (only empty lists name their kind)"))?;
                return Ok(PAttr::Ready(match s.as_str() {
                    "ints" => Attr::Ints(Vec::new()),
                    "floats" => Attr::Floats(Vec::new()),
                    _ => Attr::Strings(Vec::new()),
                }));
            }
            if s == "graph" {
                // A subgraph (an `If` branch): `graph "TEXT"`, the branch's own text form.
                self.bump();
                let (l, p) = self.lit()?;
                let Lit::Str(text) = l else {
                    return fail(p, "expected the subgraph's text (a string) after `graph`");
                };
                let g = parse(&text).map_err(|e| PErr { pos: p, message: format!("in this subgraph: {e}") })?;
                return Ok(PAttr::Ready(Attr::Graph(Box::new(g))));
            }
            if s.parse::<DType>().is_ok() {
                return match self.tensor_lit()? {
                    TLit::Ready(t) => Ok(PAttr::Ready(Attr::Tensor(t))),
                    blob => Ok(PAttr::Tensor(blob)),
                };
            }
        }
        if self.eat(&Tok::LBrack) {
            let lits = self.lit_list()?;
            let Some((first, _)) = lits.first() else {
                return fail(pos, "an empty list must name its kind: `ints []`, `floats []` or `strings []`");
            };
            return Ok(PAttr::Ready(if let Lit::Str(_) = first {
                let mut v = Vec::new();
                for (l, p) in lits {
                    match l {
                        Lit::Str(s) => v.push(s),
                        _ => return fail(p, "expected a string in a list of strings"),
                    }
                }
                Attr::Strings(v)
            } else if lits.iter().any(|(l, _)| is_float_lit(l)) {
                let mut v = Vec::new();
                for (l, p) in &lits {
                    if !is_float_lit(l) {
                        let msg = "expected a float (with `.` or an exponent, `inf` or `nan`) in a list of floats";
                        return fail(*p, msg);
                    }
                    v.push(lit_f32(l, *p)?);
                }
                Attr::Floats(v)
            } else {
                let mut v = Vec::new();
                for (l, p) in &lits {
                    v.push(lit_i64(l, *p)?);
                }
                Attr::Ints(v)
            }));
        }
        let (l, p) = self.lit()?;
        Ok(PAttr::Ready(match &l {
            Lit::Str(s) => Attr::String(s.clone()),
            l if is_float_lit(l) => Attr::Float(lit_f32(l, p)?),
            Lit::Num(_) => Attr::Int(lit_i64(&l, p)?),
            _ => return fail(p, "expected an attribute value (int, float, string, list or tensor)"),
        }))
    }

    /// `blobs { N: "base64" "base64" … }`.
    fn blobs(&mut self) -> PResult<HashMap<u64, Bytes>> {
        Ok(self.cur.blobs()?.into_iter().map(|(index, (data, _))| (index, Bytes::from(data))).collect())
    }

    /// Resolves blobs and builds the graph.
    fn finish(&mut self, parsed: Parsed) -> PResult<Graph> {
        let Parsed { name, quant, inputs, outputs, blobs } = parsed;
        let resolve = |lit: TLit| -> PResult<Tensor> {
            match lit {
                TLit::Ready(t) => Ok(t),
                TLit::Blob { ty, index, pos } => {
                    let Some(data) = blobs.get(&index) else {
                        return fail(pos, format!("blob {index} not defined"));
                    };
                    let need = ty.storage_bytes();
                    if data.len() != need {
                        return fail(pos, format!("blob {index} has {} bytes, type {ty} needs {need}", data.len()));
                    }
                    Tensor::new(ty, data.clone()).map_err(|e| PErr { pos, message: e.to_string() })
                }
            }
        };
        let mut g = Graph::new(name);
        g.quant = quant;
        for &(id, pos) in &outputs {
            if !self.values.contains_key(&id) {
                return fail(pos, format!("value %{id} is never defined"));
            }
        }
        let values = core::mem::take(&mut self.values);
        for (expected, (id, v)) in values.into_iter().enumerate() {
            if id as usize != expected {
                return fail(v.pos, format!("value ids must be dense: %{expected} is never defined (found %{id})"));
            }
            let def = match v.def {
                PDef::Input => ValueDef::Input,
                PDef::Const(lit) => ValueDef::Const(resolve(lit)?),
                PDef::Node { node, index } => ValueDef::Node { node: NodeId::new(node), index },
            };
            g.values.push(Value { ty: v.ty, name: v.name, def });
        }
        for n in core::mem::take(&mut self.nodes) {
            let mut attrs = Attrs::new();
            for (name, a) in n.attrs {
                let a = match a {
                    PAttr::Ready(a) => a,
                    PAttr::Tensor(lit) => Attr::Tensor(resolve(lit)?),
                };
                attrs.set(name, a);
            }
            let op = Op::parse(n.kind, &attrs).map_err(|e| {
                let node = if n.name.is_empty() { String::new() } else { format!(" (node \"{}\")", n.name) };
                PErr { pos: n.pos, message: format!("{}{node}: {e}", n.kind) }
            })?;
            g.nodes.push(Node { name: n.name, op, inputs: n.inputs, outputs: n.outputs });
        }
        g.inputs = inputs;
        g.outputs = outputs.into_iter().map(|(id, _)| ValueId::new(id as usize)).collect();
        Ok(g)
    }
}

/// True if `s` is written as an integer (whatever its size).
fn is_int_syntax(s: &str) -> bool {
    int_parts(s).is_some()
}

/// True for literals that can only be floats: `1.5`, `1e3`, `inf`, `nan`.
fn is_float_lit(l: &Lit) -> bool {
    match l {
        Lit::Num(s) => !is_hex(s) && s.contains(['.', 'e', 'E']),
        Lit::Inf { .. } | Lit::Nan { .. } => true,
        _ => false,
    }
}

fn lit_int(l: &Lit, pos: usize, dtype: DType, lo: i128, hi: i128) -> PResult<i128> {
    let Lit::Num(s) = l else {
        return fail(pos, format!("expected an integer for {dtype}"));
    };
    if is_float_lit(l) {
        return fail(pos, format!("expected an integer for {dtype}, found `{s}`"));
    }
    match parse_int(s) {
        Some(v) if (lo..=hi).contains(&v) => Ok(v),
        Some(_) => fail(pos, format!("`{s}` is out of range for {dtype} ({lo} to {hi})")),
        None if is_int_syntax(s) => fail(pos, format!("`{s}` is out of range for {dtype} ({lo} to {hi})")),
        None => fail(pos, format!("invalid integer `{s}`")),
    }
}

fn lit_i64(l: &Lit, pos: usize) -> PResult<i64> {
    let v = lit_int(l, pos, DType::I64, i128::from(i64::MIN), i128::from(i64::MAX))?;
    i64::try_from(v).map_err(|_| PErr { pos, message: "integer out of range".to_string() })
}

/// A float literal as `f32` bits, `f64` bits, or a 16-bit float's bits, by `width`.
/// Decimal text is read as `f32` (`f64` for width 64) with correct rounding; 16-bit
/// floats round that `f32` (exact for every value the printer writes).
fn lit_float_bits(l: &Lit, pos: usize, dtype: DType) -> PResult<u64> {
    let (width, quiet_nan) = match dtype {
        DType::F64 => (64, F64_NAN),
        DType::F16 => (16, u64::from(F16_NAN)),
        DType::BF16 => (16, u64::from(BF16_NAN)),
        _ => (32, u64::from(F32_NAN)),
    };
    let sign = 1u64 << (width - 1);
    let from_f32 = |x: f32| -> u64 {
        match dtype {
            DType::F16 => u64::from(f16::from_f32(x).to_bits()),
            DType::BF16 => u64::from(bf16::from_f32(x).to_bits()),
            _ => u64::from(x.to_bits()),
        }
    };
    match l {
        Lit::Num(s) => {
            if is_hex(s) {
                return fail(
                    pos,
                    format!("hex literal `{s}` is not a {dtype} value (NaN bits are written `nan(0x…)`)"),
                );
            }
            if width == 64 {
                s.parse::<f64>().map(f64::to_bits).map_err(|_| PErr { pos, message: format!("invalid number `{s}`") })
            } else {
                s.parse::<f32>().map(from_f32).map_err(|_| PErr { pos, message: format!("invalid number `{s}`") })
            }
        }
        Lit::Inf { neg } => {
            let inf = if width == 64 { f64::INFINITY.to_bits() } else { from_f32(f32::INFINITY) };
            Ok(if *neg { inf | sign } else { inf })
        }
        Lit::Nan { neg, bits } => {
            let b = match bits {
                None => quiet_nan,
                Some((b, bpos)) => {
                    let exp_mask = match dtype {
                        DType::F64 => 0x7FF0_0000_0000_0000,
                        DType::F16 => 0x7C00,
                        DType::BF16 => 0x7F80,
                        _ => 0x7F80_0000,
                    };
                    let mant_mask = (sign - 1) & !exp_mask;
                    if width < 64 && *b >> width != 0 {
                        return fail(*bpos, format!("NaN bits 0x{b:X} do not fit in {dtype}"));
                    }
                    if *b & exp_mask != exp_mask || *b & mant_mask == 0 {
                        return fail(*bpos, format!("0x{b:X} is not a NaN of {dtype}"));
                    }
                    *b
                }
            };
            Ok(if *neg { b ^ sign } else { b })
        }
        _ => fail(pos, format!("expected a number for {dtype}")),
    }
}

fn lit_f32(l: &Lit, pos: usize) -> PResult<f32> {
    lit_float_bits(l, pos, DType::F32).map(|b| f32::from_bits(b as u32))
}

/// The little-endian bytes of a tensor of `dtype` holding `lits`.
fn encode_elements(dtype: DType, lits: &[(Lit, usize)]) -> PResult<Vec<u8>> {
    let mut out = Vec::with_capacity(dtype.storage_bytes(lits.len()));
    let mut codes = Vec::new();
    let int_range = |bits: u32, signed: bool| -> (i128, i128) {
        if signed {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        } else {
            (0, (1i128 << bits) - 1)
        }
    };
    for (l, pos) in lits {
        let pos = *pos;
        match dtype {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {
                let bits = lit_float_bits(l, pos, dtype)?;
                out.extend_from_slice(&bits.to_le_bytes()[..dtype.bits() / 8]);
            }
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U8 | DType::U16 | DType::U32 | DType::U64 => {
                let bits = dtype.bits();
                let (lo, hi) = int_range(bits as u32, dtype.is_signed_int());
                let v = lit_int(l, pos, dtype, lo, hi)?;
                out.extend_from_slice(&(v as u128).to_le_bytes()[..bits / 8]);
            }
            DType::I4 | DType::U4 => {
                let (lo, hi) = int_range(4, dtype == DType::I4);
                let v = lit_int(l, pos, dtype, lo, hi)?;
                codes.push((v as u8) & 0xF);
            }
            DType::Bool => match l {
                Lit::Bool(b) => out.push(u8::from(*b)),
                _ => return fail(pos, "expected `true` or `false` for bool"),
            },
            DType::F4E2M1FN => {
                codes.push(lit_code(l, pos, dtype, 0xF)?);
            }
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0FNU
            | DType::F6E3M2FN => out.push(lit_code(l, pos, dtype, 0xFF)?),
        }
    }
    if dtype.is_packed() {
        out.extend(codes.chunks(2).map(|c| (c[0] & 0xF) | (c.get(1).copied().unwrap_or(0) << 4)));
    }
    Ok(out)
}

/// A raw code of a low-precision float type.
fn lit_code(l: &Lit, pos: usize, dtype: DType, max: u8) -> PResult<u8> {
    syntax_lit_code(if let Lit::Num(s) = l { Some(s) } else { None }, pos, dtype, max)
}
