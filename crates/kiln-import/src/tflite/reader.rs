//! Decoding a `.tflite` flatbuffer into plain structs.
//!
//! The planus-generated accessors ([`super::schema`]) check every offset they follow
//! and report a malformed buffer as a `planus::Error`; this module walks the parts kiln
//! uses once, up front, and turns any such error into [`ImportError::TfliteDecode`]
//! naming where it was found (so the importer itself never sees a half-valid model).
//! Constant tensor data stays in the model buffer (`Bytes` slices, no copies), also
//! for buffers stored after the flatbuffer (`offset`/`size`, models above 2 GiB).

use super::schema::tflite as fb;
use crate::ImportError;
use bytes::Bytes;
use planus::ReadAsRoot;

/// A decoded model: what the importer reads of it.
#[derive(Debug)]
pub(crate) struct Model {
    /// Schema version.
    pub version: u32,
    /// The operator code table (`Operator::opcode_index` indexes it).
    pub opcodes: Vec<OpCode>,
    /// Every subgraph (0 is the main one unless a signature says otherwise).
    pub subgraphs: Vec<Subgraph>,
    /// Signatures: named inputs and outputs of a subgraph.
    pub signatures: Vec<Signature>,
}

/// One entry of the operator code table.
#[derive(Debug, Clone)]
pub(crate) enum OpCode {
    /// A builtin operator (`BuiltinOperator` value).
    Builtin(i32),
    /// A custom operator, by its name.
    Custom(String),
}

/// A subgraph.
#[derive(Debug)]
pub(crate) struct Subgraph {
    /// Its tensors.
    pub tensors: Vec<TensorDesc>,
    /// Indices of its input tensors.
    pub inputs: Vec<i32>,
    /// Indices of its output tensors.
    pub outputs: Vec<i32>,
    /// Its operators, in execution order.
    pub operators: Vec<Operator>,
}

/// Per-tensor or per-axis affine quantisation: `real = scale · (q − zero_point)`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Quant {
    /// Scales (one, or one per slice along `axis`).
    pub scale: Vec<f32>,
    /// Zero points (as many as scales; absent ones are 0).
    pub zero_point: Vec<i64>,
    /// The quantised dimension (meaningful with more than one scale).
    pub axis: usize,
}

/// A tensor's declaration.
#[derive(Debug)]
pub(crate) struct TensorDesc {
    /// Its name (may be empty).
    pub name: String,
    /// Element type.
    pub dtype: fb::TensorType,
    /// Declared shape (`-1` never appears here: `shape` holds the static extents; the
    /// free ones are in `shape_signature`, which kiln does not need).
    pub shape: Vec<i32>,
    /// Constant contents, when the tensor has a non-empty buffer.
    pub data: Option<Bytes>,
    /// Affine quantisation parameters, when present.
    pub quant: Option<Quant>,
    /// Whether the tensor is sparse (not supported).
    pub sparse: bool,
    /// Whether it is a variable (state; not supported).
    pub variable: bool,
}

/// One operator application.
#[derive(Debug)]
pub(crate) struct Operator {
    /// Index into [`Model::opcodes`].
    pub opcode: usize,
    /// Input tensor indices (`-1`: an absent optional input).
    pub inputs: Vec<i32>,
    /// Output tensor indices.
    pub outputs: Vec<i32>,
    /// The builtin options, decoded.
    pub options: Option<fb::BuiltinOptions>,
}

/// A signature of a subgraph.
#[derive(Debug)]
pub(crate) struct Signature {
    /// Which subgraph.
    pub subgraph: usize,
    /// `(name, tensor index)` of the inputs.
    pub inputs: Vec<(String, u32)>,
    /// `(name, tensor index)` of the outputs.
    pub outputs: Vec<(String, u32)>,
}

/// The file identifier of a TFLite flatbuffer, at bytes 4..8.
pub const MAGIC: &[u8; 4] = b"TFL3";

/// Whether `data` starts like a TFLite flatbuffer.
pub fn has_magic(data: &[u8]) -> bool {
    data.get(4..8) == Some(&MAGIC[..])
}

fn bad(at: impl std::fmt::Display, e: impl std::fmt::Display) -> ImportError {
    ImportError::TfliteDecode(format!("{at}: {e}"))
}

/// Decodes `data`.
pub(crate) fn read(data: &Bytes) -> Result<Model, ImportError> {
    if data.len() < 8 {
        return Err(ImportError::TfliteDecode(format!("the file has {} bytes, too few for a flatbuffer", data.len())));
    }
    if !has_magic(data) {
        return Err(ImportError::TfliteDecode("the file identifier at bytes 4..8 is not `TFL3`".into()));
    }
    let m = fb::ModelRef::read_as_root(data).map_err(|e| bad("model", e))?;
    let version = m.version().map_err(|e| bad("model version", e))?;
    let mut buffers: Vec<Option<Bytes>> = Vec::new();
    if let Some(bs) = m.buffers().map_err(|e| bad("buffers", e))? {
        for (i, b) in bs.iter().enumerate() {
            let b = b.map_err(|e| bad(format_args!("buffer {i}"), e))?;
            let offset = b.offset().map_err(|e| bad(format_args!("buffer {i}"), e))?;
            let size = b.size().map_err(|e| bad(format_args!("buffer {i}"), e))?;
            let inline = b.data().map_err(|e| bad(format_args!("buffer {i}"), e))?;
            let bytes = if offset > 1 {
                let (o, s) = (offset as usize, size as usize);
                let end = o.checked_add(s).filter(|&e| e <= data.len()).ok_or_else(|| {
                    bad(
                        format_args!("buffer {i}"),
                        format!("bytes {offset}..+{size} lie outside the file ({} bytes)", data.len()),
                    )
                })?;
                Some(data.slice(o..end))
            } else {
                inline.filter(|d| !d.is_empty()).map(|d| data.slice_ref(d))
            };
            buffers.push(bytes.filter(|b| !b.is_empty()));
        }
    }
    let mut opcodes = Vec::new();
    if let Some(cs) = m.operator_codes().map_err(|e| bad("operator codes", e))? {
        for (i, c) in cs.iter().enumerate() {
            let c = c.map_err(|e| bad(format_args!("operator code {i}"), e))?;
            let dep = c.deprecated_builtin_code().map_err(|e| bad(format_args!("operator code {i}"), e))?;
            // `builtin_code` is an enum: a value newer than the schema is kept as a
            // number (and reported as an unsupported op), not refused.
            let code = match c.builtin_code() {
                Ok(b) => b as i32,
                Err(e) => match e.error_kind {
                    planus::errors::ErrorKind::UnknownEnumTag { source } => source.tag as i32,
                    _ => return Err(bad(format_args!("operator code {i}"), e)),
                },
            };
            let code = code.max(dep as i32);
            if code == fb::BuiltinOperator::Custom as i32 {
                let name = c.custom_code().map_err(|e| bad(format_args!("operator code {i}"), e))?.unwrap_or("");
                opcodes.push(OpCode::Custom(name.to_string()));
            } else {
                opcodes.push(OpCode::Builtin(code));
            }
        }
    }
    let mut subgraphs = Vec::new();
    let sgs = m
        .subgraphs()
        .map_err(|e| bad("subgraphs", e))?
        .ok_or_else(|| ImportError::TfliteDecode("the model has no subgraphs".into()))?;
    for (si, sg) in sgs.iter().enumerate() {
        let at = |what: &str| format!("subgraph {si} {what}");
        let sg = sg.map_err(|e| bad(at(""), e))?;
        let mut tensors = Vec::new();
        if let Some(ts) = sg.tensors().map_err(|e| bad(at("tensors"), e))? {
            for (ti, t) in ts.iter().enumerate() {
                let tat = || format!("subgraph {si} tensor {ti}");
                let t = t.map_err(|e| bad(tat(), e))?;
                let name = t.name().map_err(|e| bad(tat(), e))?.unwrap_or("").to_string();
                let dtype = t.type_().map_err(|e| bad(tat(), e))?;
                let shape: Vec<i32> = match t.shape().map_err(|e| bad(tat(), e))? {
                    Some(v) => v.iter().collect(),
                    None => Vec::new(),
                };
                let b = t.buffer().map_err(|e| bad(tat(), e))? as usize;
                let data = if b == 0 {
                    None
                } else {
                    buffers
                        .get(b)
                        .ok_or_else(|| bad(tat(), format!("buffer {b} does not exist ({} buffers)", buffers.len())))?
                        .clone()
                };
                let quant = match t.quantization().map_err(|e| bad(tat(), e))? {
                    None => None,
                    Some(q) => {
                        let scale: Vec<f32> =
                            q.scale().map_err(|e| bad(tat(), e))?.map(|v| v.iter().collect()).unwrap_or_default();
                        let zp: Vec<i64> =
                            q.zero_point().map_err(|e| bad(tat(), e))?.map(|v| v.iter().collect()).unwrap_or_default();
                        let axis = q.quantized_dimension().map_err(|e| bad(tat(), e))?;
                        if scale.is_empty() {
                            None
                        } else {
                            if axis < 0 || (!zp.is_empty() && zp.len() != scale.len()) {
                                return Err(bad(
                                    tat(),
                                    format!(
                                        "quantisation with {} scales, {} zero points, axis {axis}",
                                        scale.len(),
                                        zp.len()
                                    ),
                                ));
                            }
                            let zero_point = if zp.is_empty() { vec![0; scale.len()] } else { zp };
                            Some(Quant { scale, zero_point, axis: axis as usize })
                        }
                    }
                };
                let sparse = t.sparsity().map_err(|e| bad(tat(), e))?.is_some();
                let variable = t.is_variable().map_err(|e| bad(tat(), e))?;
                tensors.push(TensorDesc { name, dtype, shape, data, quant, sparse, variable });
            }
        }
        let ints = |v: Option<planus::Vector<'_, i32>>| v.map(|v| v.iter().collect::<Vec<i32>>()).unwrap_or_default();
        let inputs = ints(sg.inputs().map_err(|e| bad(at("inputs"), e))?);
        let outputs = ints(sg.outputs().map_err(|e| bad(at("outputs"), e))?);
        let mut operators = Vec::new();
        if let Some(os) = sg.operators().map_err(|e| bad(at("operators"), e))? {
            for (oi, o) in os.iter().enumerate() {
                let oat = || format!("subgraph {si} operator {oi}");
                let o = o.map_err(|e| bad(oat(), e))?;
                let opcode = o.opcode_index().map_err(|e| bad(oat(), e))? as usize;
                if opcode >= opcodes.len() {
                    return Err(bad(oat(), format!("operator code {opcode} does not exist ({} codes)", opcodes.len())));
                }
                let inputs = ints(o.inputs().map_err(|e| bad(oat(), e))?);
                let outputs = ints(o.outputs().map_err(|e| bad(oat(), e))?);
                // Options of an op kiln maps are read when the op is imported; an
                // unknown union tag (a newer schema's options) is left as none.
                let options = match o.builtin_options() {
                    Ok(Some(r)) => Some(fb::BuiltinOptions::try_from(r).map_err(|e| bad(oat(), e))?),
                    Ok(None) => None,
                    Err(e) if matches!(e.error_kind, planus::errors::ErrorKind::UnknownUnionTag { .. }) => None,
                    Err(e) => return Err(bad(oat(), e)),
                };
                for &t in inputs.iter().chain(&outputs) {
                    if t < -1 || t >= tensors.len() as i32 || (t == -1 && outputs.contains(&t)) {
                        return Err(bad(oat(), format!("tensor index {t} out of range ({} tensors)", tensors.len())));
                    }
                }
                operators.push(Operator { opcode, inputs, outputs, options });
            }
        }
        for &t in inputs.iter().chain(&outputs) {
            if t < 0 || t >= tensors.len() as i32 {
                return Err(bad(at("signature"), format!("tensor index {t} out of range ({} tensors)", tensors.len())));
            }
        }
        subgraphs.push(Subgraph { tensors, inputs, outputs, operators });
    }
    if subgraphs.is_empty() {
        return Err(ImportError::TfliteDecode("the model has no subgraphs".into()));
    }
    let mut signatures = Vec::new();
    if let Some(ss) = m.signature_defs().map_err(|e| bad("signatures", e))? {
        for (i, s) in ss.iter().enumerate() {
            let sat = || format!("signature {i}");
            let s = s.map_err(|e| bad(sat(), e))?;
            let subgraph = s.subgraph_index().map_err(|e| bad(sat(), e))? as usize;
            let maps = |v: Option<planus::Vector<'_, planus::Result<fb::TensorMapRef<'_>>>>| -> Result<Vec<(String, u32)>, ImportError> {
                let mut out = Vec::new();
                for t in v.iter().flat_map(|v| v.iter()) {
                    let t = t.map_err(|e| bad(sat(), e))?;
                    let name = t.name().map_err(|e| bad(sat(), e))?.unwrap_or("").to_string();
                    out.push((name, t.tensor_index().map_err(|e| bad(sat(), e))?));
                }
                Ok(out)
            };
            let inputs = maps(s.inputs().map_err(|e| bad(sat(), e))?)?;
            let outputs = maps(s.outputs().map_err(|e| bad(sat(), e))?)?;
            signatures.push(Signature { subgraph, inputs, outputs });
        }
    }
    Ok(Model { version, opcodes, subgraphs, signatures })
}
