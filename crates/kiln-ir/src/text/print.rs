//! The printer.

use super::base64;
use super::lex::{quote, write_name};
use super::INLINE_LIMIT;
use crate::dtype::DType;
use crate::entity::EntityId;
use crate::graph::{Graph, Node, ValueDef, ValueId};
use crate::op::Attr;
use crate::tensor::Tensor;
use bytes::Bytes;
use core::fmt::Write;
use half::{bf16, f16};

/// Bytes per base64 line of the `blobs` section (76 characters).
const BLOB_LINE_BYTES: usize = 57;

/// Prints `graph` in the text form (see the [module docs](super)).
///
/// The result parses back to an equal graph when the graph is well formed: every value
/// defined once (graph inputs listed once, every node result listed by its node),
/// operands defined before use. Other graphs still print, and [`super::parse`] then
/// names what is wrong.
pub fn print(graph: &Graph) -> String {
    let mut p = Printer { g: graph, out: String::new(), blobs: Vec::new() };
    p.graph();
    p.out
}

struct Printer<'a> {
    g: &'a Graph,
    out: String,
    blobs: Vec<Bytes>,
}

impl Printer<'_> {
    fn graph(&mut self) {
        let g = self.g;
        self.out.push_str("graph @");
        self.ident_or_quoted(&g.name);
        if g.quant != crate::graph::QuantSemantics::default() {
            self.out.push_str(" quant ");
            self.out.push_str(g.quant.as_str());
            self.out.push(' ');
        }
        self.out.push('(');
        for (k, &v) in g.inputs.iter().enumerate() {
            if k > 0 {
                self.out.push_str(", ");
            }
            let _ = write!(self.out, "%{}: ", v.index());
            self.typed_name(v);
        }
        self.out.push_str(") -> (");
        for (k, &v) in g.outputs.iter().enumerate() {
            if k > 0 {
                self.out.push_str(", ");
            }
            let _ = write!(self.out, "%{}", v.index());
        }
        self.out.push_str(") {\n");

        // Constants go in id order, each no later than the first node that uses it or
        // whose first result has a larger id: importers create constants as they go, so
        // this keeps them near their users.
        let consts: Vec<ValueId> =
            g.values.iter().filter(|(_, v)| matches!(v.def, ValueDef::Const(_))).map(|(id, _)| id).collect();
        let mut printed = vec![false; g.values.len()];
        let mut next_const = 0;
        for (_, node) in g.nodes.iter() {
            if let Some(first) = node.outputs.iter().min() {
                while next_const < consts.len() && consts[next_const] < *first {
                    self.constant_once(consts[next_const], &mut printed);
                    next_const += 1;
                }
            }
            for &v in node.inputs.iter().flatten() {
                if g.values.get(v).is_some_and(|v| matches!(v.def, ValueDef::Const(_))) {
                    self.constant_once(v, &mut printed);
                }
            }
            self.node(node);
        }
        for &c in &consts[next_const..] {
            self.constant_once(c, &mut printed);
        }
        self.out.push_str("}\n");

        if !self.blobs.is_empty() {
            self.out.push_str("blobs {\n");
            for (k, data) in self.blobs.iter().enumerate() {
                let _ = writeln!(self.out, "  {k}:");
                if data.is_empty() {
                    self.out.push_str("    \"\"\n");
                }
                for line in data.chunks(BLOB_LINE_BYTES) {
                    let _ = writeln!(self.out, "    \"{}\"", base64::encode(line));
                }
            }
            self.out.push_str("}\n");
        }
    }

    fn ident_or_quoted(&mut self, s: &str) {
        write_name(&mut self.out, s);
    }

    /// `TYPE "name"` of a value (the name only when not empty).
    fn typed_name(&mut self, v: ValueId) {
        match self.g.values.get(v) {
            Some(val) => {
                let _ = write!(self.out, "{}", val.ty);
                self.name_suffix(&val.name);
            }
            None => self.out.push_str("<missing value>"),
        }
    }

    fn name_suffix(&mut self, name: &str) {
        if !name.is_empty() {
            self.out.push(' ');
            quote(name, &mut self.out);
        }
    }

    fn constant_once(&mut self, v: ValueId, printed: &mut [bool]) {
        if printed[v.index()] {
            return;
        }
        printed[v.index()] = true;
        let val = &self.g.values[v];
        let ValueDef::Const(t) = &val.def else { return };
        let _ = write!(self.out, "  %{} = const ", v.index());
        self.tensor(t);
        if &val.ty != t.ty() {
            let _ = write!(self.out, " : {}", val.ty);
        }
        self.name_suffix(&val.name);
        self.out.push('\n');
    }

    fn node(&mut self, node: &Node) {
        self.out.push_str("  ");
        for (k, o) in node.outputs.iter().enumerate() {
            let _ = write!(self.out, "{}%{}", if k > 0 { ", " } else { "" }, o.index());
        }
        if !node.outputs.is_empty() {
            self.out.push_str(" = ");
        }
        self.out.push_str(node.op.kind.name());
        self.out.push('(');
        for (k, i) in node.inputs.iter().enumerate() {
            if k > 0 {
                self.out.push_str(", ");
            }
            match i {
                Some(v) => {
                    let _ = write!(self.out, "%{}", v.index());
                }
                None => self.out.push('_'),
            }
        }
        self.out.push(')');
        let attrs = node.op.to_attrs();
        if !attrs.is_empty() {
            self.out.push_str(" {");
            for (k, (name, a)) in attrs.iter().enumerate() {
                if k > 0 {
                    self.out.push_str(", ");
                }
                self.ident_or_quoted(name);
                self.out.push_str(" = ");
                self.attr(a);
            }
            self.out.push('}');
        }
        for (k, &o) in node.outputs.iter().enumerate() {
            self.out.push_str(if k > 0 { ", " } else { " : " });
            self.typed_name(o);
        }
        if !node.name.is_empty() {
            self.out.push_str(" node ");
            quote(&node.name, &mut self.out);
        }
        self.out.push('\n');
    }

    fn attr(&mut self, a: &Attr) {
        match a {
            Attr::Int(i) => {
                let _ = write!(self.out, "{i}");
            }
            Attr::Float(x) => self.out.push_str(&fmt_f32(*x)),
            Attr::String(s) => quote(s, &mut self.out),
            Attr::Ints(v) if v.is_empty() => self.out.push_str("ints []"),
            Attr::Floats(v) if v.is_empty() => self.out.push_str("floats []"),
            Attr::Strings(v) if v.is_empty() => self.out.push_str("strings []"),
            Attr::Ints(v) => self.list(v.iter().map(|i| i.to_string())),
            Attr::Floats(v) => self.list(v.iter().map(|x| fmt_f32(*x))),
            Attr::Strings(v) => {
                self.out.push('[');
                for (k, s) in v.iter().enumerate() {
                    if k > 0 {
                        self.out.push_str(", ");
                    }
                    quote(s, &mut self.out);
                }
                self.out.push(']');
            }
            Attr::Tensor(t) => self.tensor(t),
            // A subgraph (an `If` branch): `graph "TEXT"`, its own text form quoted.
            Attr::Graph(g) => {
                self.out.push_str("graph ");
                quote(&print(g), &mut self.out);
            }
        }
    }

    fn list(&mut self, items: impl Iterator<Item = String>) {
        self.out.push('[');
        for (k, s) in items.enumerate() {
            if k > 0 {
                self.out.push_str(", ");
            }
            self.out.push_str(&s);
        }
        self.out.push(']');
    }

    /// `TYPE [elements]` or `TYPE blob(N)`.
    fn tensor(&mut self, t: &Tensor) {
        let _ = write!(self.out, "{} ", t.ty());
        match inline_elements(t) {
            Some(items) => self.list(items.into_iter()),
            None => {
                let _ = write!(self.out, "blob({})", self.blobs.len());
                self.blobs.push(t.bytes().clone());
            }
        }
    }
}

/// The elements of a small tensor in their exact text form; `None` when the tensor is
/// large or its bytes have no exact element form (they then go to a blob).
pub fn inline_elements(t: &Tensor) -> Option<Vec<String>> {
    let n = t.numel();
    let d: &[u8] = t.bytes();
    let dtype = t.dtype();
    if n > INLINE_LIMIT || d.len() != dtype.storage_bytes(n) {
        return None;
    }
    let w = |k: usize| -> u64 {
        let size = dtype.bits() / 8;
        let mut v = 0u64;
        for (j, &b) in d[k * size..(k + 1) * size].iter().enumerate() {
            v |= u64::from(b) << (8 * j);
        }
        v
    };
    let nibble = |k: usize| (d[k / 2] >> ((k % 2) * 4)) & 0xF;
    if dtype.is_packed() && n % 2 == 1 && d[n / 2] >> 4 != 0 {
        return None;
    }
    let items = (0..n).map(|k| match dtype {
        DType::F32 => Some(fmt_f32(f32::from_bits(w(k) as u32))),
        DType::F64 => Some(fmt_f64(f64::from_bits(w(k)))),
        DType::F16 => Some(fmt_f16(w(k) as u16)),
        DType::BF16 => Some(fmt_bf16(w(k) as u16)),
        DType::I8 => Some((w(k) as u8 as i8).to_string()),
        DType::I16 => Some((w(k) as u16 as i16).to_string()),
        DType::I32 => Some((w(k) as u32 as i32).to_string()),
        DType::I64 => Some((w(k) as i64).to_string()),
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => Some(w(k).to_string()),
        DType::Bool => match d[k] {
            0 => Some("false".to_string()),
            1 => Some("true".to_string()),
            _ => None,
        },
        DType::I4 => Some((((nibble(k) << 4) as i8) >> 4).to_string()),
        DType::U4 => Some(nibble(k).to_string()),
        DType::F4E2M1FN => Some(format!("0x{:X}", nibble(k))),
        DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0FNU
        | DType::F6E3M2FN => Some(format!("0x{:02X}", d[k])),
    });
    items.collect()
}

/// The quiet NaN with sign and payload clear, printed as plain `nan`.
pub const F32_NAN: u32 = 0x7FC0_0000;
/// See [`F32_NAN`].
pub const F64_NAN: u64 = 0x7FF8_0000_0000_0000;
/// See [`F32_NAN`].
pub const F16_NAN: u16 = 0x7E00;
/// See [`F32_NAN`].
pub const BF16_NAN: u16 = 0x7FC0;

/// `nan` for the quiet NaN `quiet`, else `nan(0x…)` with the NaN's bits in `digits` hex
/// digits.
fn nan_text(bits: u64, quiet: u64, digits: usize) -> String {
    if bits == quiet {
        "nan".to_string()
    } else {
        format!("nan(0x{bits:0digits$X})")
    }
}

/// `inf` or `-inf`.
fn inf_text(positive: bool) -> String {
    (if positive { "inf" } else { "-inf" }).to_string()
}

/// The exact text of an `f32`: shortest decimal that reads back to the same bits (always
/// with a `.` or an exponent), `inf`, `-inf`, `nan`, or `nan(0x…)` with the NaN's bits.
pub fn fmt_f32(x: f32) -> String {
    match x {
        x if x.is_nan() => nan_text(u64::from(x.to_bits()), u64::from(F32_NAN), 8),
        x if x.is_infinite() => inf_text(x > 0.0),
        x => format!("{x:?}"),
    }
}

/// [`fmt_f32`] for `f64`.
pub fn fmt_f64(x: f64) -> String {
    match x {
        x if x.is_nan() => nan_text(x.to_bits(), F64_NAN, 16),
        x if x.is_infinite() => inf_text(x > 0.0),
        x => format!("{x:?}"),
    }
}

/// A 16-bit float by its bits: finite values and infinities through their exact `f32`
/// `value`, NaNs as bits (`quiet` prints as plain `nan`).
fn fmt_half(bits: u16, is_nan: bool, quiet: u16, value: f32) -> String {
    if is_nan {
        nan_text(u64::from(bits), u64::from(quiet), 4)
    } else {
        fmt_f32(value)
    }
}

/// An `f16` by its bits.
fn fmt_f16(bits: u16) -> String {
    let x = f16::from_bits(bits);
    fmt_half(bits, x.is_nan(), F16_NAN, x.to_f32())
}

/// A `bf16` by its bits.
fn fmt_bf16(bits: u16) -> String {
    let x = bf16::from_bits(bits);
    fmt_half(bits, x.is_nan(), BF16_NAN, x.to_f32())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_forms() {
        assert_eq!(fmt_f32(1.0), "1.0");
        assert_eq!(fmt_f32(-0.0), "-0.0");
        assert_eq!(fmt_f32(0.1), "0.1");
        assert_eq!(fmt_f32(1e-7), "1e-7");
        assert_eq!(fmt_f32(1e20), "1e20");
        assert_eq!(fmt_f32(f32::NEG_INFINITY), "-inf");
        assert_eq!(fmt_f32(f32::from_bits(0x7FC0_0000)), "nan");
        assert_eq!(fmt_f32(f32::from_bits(0xFFC0_0000)), "nan(0xFFC00000)");
        assert_eq!(fmt_f32(f32::from_bits(0x7F80_0001)), "nan(0x7F800001)");
        assert_eq!(fmt_f64(f64::from_bits(1)), "5e-324");
        assert_eq!(fmt_f64(f64::from_bits(0xFFF8_0000_0000_0001)), "nan(0xFFF8000000000001)");
        assert_eq!(fmt_f64(f64::from_bits(F64_NAN)), "nan");
        assert_eq!(fmt_f64(f64::INFINITY), "inf");
        // 0x3555 is the f16 nearest 1/3: 0.333251953125 exactly, whose shortest f32 form
        // is 0.33325195.
        assert_eq!(fmt_f16(0x3555), "0.33325195");
        assert_eq!(fmt_f16(0x7C00), "inf");
        assert_eq!(fmt_f16(0x7E00), "nan");
        assert_eq!(fmt_f16(0x7E01), "nan(0x7E01)");
        assert_eq!(fmt_bf16(0x3F80), "1.0");
        assert_eq!(fmt_bf16(0xFFC1), "nan(0xFFC1)");
    }
}
