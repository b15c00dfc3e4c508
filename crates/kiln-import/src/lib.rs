//! Model importers: read a trained model and produce kiln's tensor-level IR
//! ([`kiln_ir::Graph`]) with fully static shapes.
//!
//! Two front ends: ONNX ([`onnx`]) and TFLite ([`tflite`]); [`import_file`] picks one
//! by the file's magic (`TFL3` at byte 4) or extension. An importer:
//! - decodes the model without copying tensor data (weights are slices of the
//!   model buffer, `bytes::Bytes`), reading external-data files next to the model;
//! - binds free input dimensions from [`ImportOptions::input_shapes`] and may bind
//!   whole inputs to constants ([`ImportOptions::input_values`]);
//! - translates each operator into kiln's canonical form (ONNX opset-22 semantics),
//!   whatever opset the model was written for;
//! - infers every result type, and folds every node whose operands are constants
//!   (shape arithmetic, `If` with a constant condition, weights built by
//!   `ConstantOfShape`) with the reference evaluator, so the graph that remains
//!   is static;
//! - verifies the result.
//!
//! Errors ([`ImportError`]) are one line and name what and where: the node, its op
//! type and opset, or the input, or the tensor.
#![deny(missing_docs)]

mod error;
pub mod onnx;
pub mod tflite;

pub use error::{FreeDims, ImportError, TfliteUnsupportedOp, UnsupportedOp};

/// The model formats kiln imports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// An ONNX `ModelProto`.
    Onnx,
    /// A TFLite flatbuffer.
    Tflite,
}

/// The format of the model file at `path`: TFLite when its bytes 4..8 are `TFL3` or
/// (when it cannot be read) its extension is `.tflite`, else ONNX.
pub fn format_of(path: &std::path::Path) -> Format {
    use std::io::Read;
    let mut head = [0u8; 8];
    let read = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head));
    match read {
        Ok(()) if tflite::has_magic(&head) => Format::Tflite,
        Ok(()) => Format::Onnx,
        Err(_) if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("tflite")) => Format::Tflite,
        Err(_) => Format::Onnx,
    }
}

/// Imports a model file in either format ([`format_of`]).
pub fn import_file(path: &std::path::Path, opts: &ImportOptions) -> Result<kiln_ir::Graph, ImportError> {
    match format_of(path) {
        Format::Tflite => tflite::import_file(path, opts),
        Format::Onnx => onnx::import_file(path, opts),
    }
}

/// How to import a model.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Shapes for graph inputs (`name`, dims): bind free dimensions, or check fixed ones.
    pub input_shapes: Vec<(String, Vec<usize>)>,
    /// Values that turn graph inputs into constants (`name`, elements in row-major
    /// order, converted to the input's dtype). The input disappears from the graph's
    /// signature; everything it feeds may fold (e.g. silero-vad's `sr`).
    pub input_values: Vec<(String, Vec<f64>)>,
    /// A declared bound on the trips of every `Loop` whose trip count is not a
    /// compile-time constant (`--max-trips`); it also caps a constant one.
    pub max_trips: Option<usize>,
    /// Element shapes of sequence inputs (`name`, one dims list per element): a
    /// sequence of known length is fed as one tensor input per element, named
    /// `name[i]` (see `docs/control-flow.md`). A sequence input needs one
    /// (`--input-sequence`).
    pub input_sequences: Vec<(String, Vec<Vec<usize>>)>,
    /// Optional inputs given as empty (`--input-absent NAME`): they take no
    /// tensor, and everything that asks whether they hold an element folds.
    pub absent_inputs: Vec<String>,
    /// Declared bounds on data-dependent extents (`--max-dim NAME=N`): `NAME` is a
    /// result of a NonZero, Compress, Unique, NonMaxSuppression or run-time-K TopK
    /// node; its extent may not exceed `N` at run time (see `kiln_ir::dynamic`).
    pub max_dims: Vec<(String, usize)>,
    /// Bounded input dimensions (`--input-shape ids=1x1..128`): (input name, axis,
    /// smallest extent). The input's shape in `input_shapes` gives the bound; the
    /// caller chooses the extent per call (see `kiln_ir::bounded`).
    pub bounded_dims: Vec<(String, usize, usize)>,
    /// Declared result shapes (`--output-shape NAME=DIMS`): the dims kiln compiles
    /// `NAME` for where run-time data decides them (a Resize with run-time `scales`);
    /// a run-time check fails the call when the data gives other dims. Without one,
    /// the shape the model declares for `NAME` (graph output or `value_info`) is used.
    pub output_shapes: Vec<(String, Vec<usize>)>,
}

/// Parses a dims string such as `1x3x224x224` (`scalar` or empty for rank 0).
pub fn parse_dims(s: &str) -> Result<Vec<usize>, String> {
    let s = s.trim();
    if s.is_empty() || s == "scalar" {
        return Ok(Vec::new());
    }
    s.split(['x', ','])
        .map(|d| d.trim().parse::<usize>().map_err(|_| format!("`{d}` is not a dimension (expected e.g. 1x3x224x224)")))
        .collect()
}

/// Splits `NAME=REST` at its last `=` into a non-empty name and the rest; `form` describes the
/// expected form in the error.
fn split_named<'a>(s: &'a str, form: &str) -> Result<(&'a str, &'a str), String> {
    let (name, rest) = s.rsplit_once('=').ok_or_else(|| format!("`{s}`: expected {form}"))?;
    if name.is_empty() {
        return Err(format!("`{s}`: the input name is empty"));
    }
    Ok((name, rest))
}

/// Parses `NAME=DIMS` (for `--input-shape`).
pub fn parse_input_shape(s: &str) -> Result<(String, Vec<usize>), String> {
    let (name, dims) = split_named(s, "NAME=DIMS, e.g. input=1x3x224x224")?;
    Ok((name.to_string(), parse_dims(dims).map_err(|e| format!("`{s}`: {e}"))?))
}

/// Parses `NAME=DIMS` where one or more dims may be a range `MIN..MAX` (a bounded
/// dimension, chosen per call): the shape at the bounds, and each range's (axis, MIN).
pub fn parse_input_shape_bounded(s: &str) -> Result<(String, Vec<usize>, Vec<(usize, usize)>), String> {
    let (name, dims) = split_named(s, "NAME=DIMS, e.g. input=1x3x224x224 or ids=1x1..512")?;
    let dims = dims.trim();
    if dims.is_empty() || dims == "scalar" {
        return Ok((name.to_string(), Vec::new(), Vec::new()));
    }
    let mut shape = Vec::new();
    let mut ranges = Vec::new();
    for (axis, d) in dims.split(['x', ',']).enumerate() {
        let d = d.trim();
        let num = |t: &str| {
            t.trim().parse::<usize>().map_err(|_| format!("`{s}`: `{d}` is not a dimension or a range MIN..MAX"))
        };
        match d.split_once("..") {
            Some((lo, hi)) => {
                let (lo, hi) = (num(lo)?, num(hi)?);
                if lo > hi || hi == 0 {
                    return Err(format!("`{s}`: the range `{d}` must be MIN..MAX with MIN ≤ MAX and MAX ≥ 1"));
                }
                shape.push(hi);
                ranges.push((axis, lo));
            }
            None => shape.push(num(d)?),
        }
    }
    Ok((name.to_string(), shape, ranges))
}

/// Parses `NAME=DIMS;DIMS;...` (for `--input-sequence`): one shape per element of a
/// sequence input, in order; nothing after `=` is the empty sequence.
pub fn parse_input_sequence(s: &str) -> Result<(String, Vec<Vec<usize>>), String> {
    let (name, rest) = split_named(s, "NAME=DIMS;DIMS;..., e.g. frames=3x4;3x4")?;
    if rest.trim().is_empty() {
        return Ok((name.to_string(), Vec::new()));
    }
    let shapes = rest.split(';').map(|d| parse_dims(d).map_err(|e| format!("`{s}`: {e}"))).collect::<Result<_, _>>()?;
    Ok((name.to_string(), shapes))
}

/// Parses `NAME=V[,V...]` (for `--input-value`).
pub fn parse_input_value(s: &str) -> Result<(String, Vec<f64>), String> {
    let (name, vals) = split_named(s, "NAME=VALUE[,VALUE...], e.g. sr=16000")?;
    let v = vals
        .split(',')
        .map(|x| x.trim().parse::<f64>().map_err(|_| format!("`{s}`: `{x}` is not a number")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_string(), v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_syntax() {
        assert_eq!(parse_input_shape("x=1x3x224x224").unwrap(), ("x".into(), vec![1, 3, 224, 224]));
        assert_eq!(parse_input_shape("a=b=2").unwrap(), ("a=b".into(), vec![2]));
        assert_eq!(parse_input_shape("s=scalar").unwrap(), ("s".into(), vec![]));
        assert!(parse_input_shape("x").is_err());
        assert!(parse_input_shape("x=1xq").is_err());
        assert!(parse_input_shape("=1").is_err());
        assert_eq!(parse_input_value("sr=16000").unwrap(), ("sr".into(), vec![16000.0]));
        assert!(parse_input_value("sr=abc").is_err());
        assert_eq!(parse_input_sequence("s=2x3;4").unwrap(), ("s".into(), vec![vec![2, 3], vec![4]]));
        assert_eq!(parse_input_sequence("s=").unwrap(), ("s".into(), vec![]));
        assert!(parse_input_sequence("s=2;q").is_err());
    }
}
