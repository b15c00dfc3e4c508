//! Decoding of ONNX tensors: typed fields of every kind, raw data, external data
//! files, and the errors for malformed tensors. Expected values are written out by
//! hand from the ONNX encoding rules.

use bytes::Bytes;
use kiln_import::onnx::proto::{
    tensor_proto::DataLocation, type_proto, GraphProto, ModelProto, OperatorSetIdProto, StringStringEntryProto,
    TensorProto, TypeProto, ValueInfoProto,
};
use kiln_import::{onnx::import_bytes, ImportError, ImportOptions};
use kiln_ir::{DType, Graph};
use prost::Message;
use std::path::Path;

fn output(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(0), shape: None })),
            denotation: None,
        }),
        doc_string: None,
    }
}

/// A model whose single output is the initializer `t` itself.
fn import_tensor(t: TensorProto, base: Option<&Path>) -> Result<Graph, ImportError> {
    let name = t.name.clone().unwrap_or_default();
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto { initializer: vec![t], output: vec![output(&name)], ..Default::default() }),
        ..Default::default()
    };
    import_bytes(Bytes::from(m.encode_to_vec()), base, &ImportOptions::default())
}

fn tensor(name: &str, dtype: i32, dims: &[i64]) -> TensorProto {
    TensorProto { name: Some(name.into()), data_type: Some(dtype), dims: dims.to_vec(), ..Default::default() }
}

fn value(g: &Graph) -> kiln_ir::Tensor {
    g.constant(g.outputs[0])
        .or_else(|| {
            // The output may be an Identity of the constant.
            let n = g.nodes.values().next()?;
            g.constant(n.inputs[0]?)
        })
        .expect("constant output")
        .clone()
}

#[test]
fn typed_fields() {
    let mut t = tensor("f", 1, &[2]);
    t.float_data = vec![1.5, -2.0];
    assert_eq!(value(&import_tensor(t, None).unwrap()).to_vec::<f32>().unwrap(), vec![1.5, -2.0]);

    let mut t = tensor("i8", 3, &[3]);
    t.int32_data = vec![-1, 127, -128];
    let v = value(&import_tensor(t, None).unwrap());
    assert_eq!(v.dtype(), DType::I8);
    assert_eq!(v.bytes().as_ref(), &[0xff, 0x7f, 0x80]);

    let mut t = tensor("b", 9, &[2]);
    t.int32_data = vec![1, 0];
    assert_eq!(value(&import_tensor(t, None).unwrap()).bytes().as_ref(), &[1, 0]);

    // f16 1.0 is 0x3c00, stored as an int32 holding the bits.
    let mut t = tensor("h", 10, &[1]);
    t.int32_data = vec![0x3c00];
    assert_eq!(value(&import_tensor(t, None).unwrap()).bytes().as_ref(), &[0x00, 0x3c]);

    let mut t = tensor("u64", 13, &[1]);
    t.uint64_data = vec![u64::MAX];
    assert_eq!(value(&import_tensor(t, None).unwrap()).bytes().as_ref(), &[0xff; 8]);

    let mut t = tensor("u32", 12, &[1]);
    t.uint64_data = vec![0x0102_0304];
    assert_eq!(value(&import_tensor(t, None).unwrap()).bytes().as_ref(), &[4, 3, 2, 1]);

    let mut t = tensor("d", 11, &[1]);
    t.double_data = vec![0.1];
    assert_eq!(value(&import_tensor(t, None).unwrap()).to_vec::<f64>().unwrap(), vec![0.1]);

    // int4: three elements packed into two bytes, low nibble first.
    let mut t = tensor("i4", 22, &[3]);
    t.int32_data = vec![0x21, 0x03];
    let v = value(&import_tensor(t, None).unwrap());
    assert_eq!(v.dtype(), DType::I4);
    assert_eq!(v.codes(), vec![1, 2, 3]);

    let mut t = tensor("e", 7, &[0, 4]);
    t.int64_data = vec![];
    assert_eq!(value(&import_tensor(t, None).unwrap()).numel(), 0);
}

#[test]
fn raw_data_is_zero_copy() {
    let raw: Vec<u8> = (0..16).collect();
    let mut t = tensor("r", 1, &[4]);
    t.raw_data = Some(Bytes::from(raw.clone()));
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto { initializer: vec![t], output: vec![output("r")], ..Default::default() }),
        ..Default::default()
    };
    let file = Bytes::from(m.encode_to_vec());
    let g = import_bytes(file.clone(), None, &ImportOptions::default()).unwrap();
    let v = value(&g);
    assert_eq!(v.bytes().as_ref(), raw.as_slice());
    // The tensor's bytes point into the model buffer.
    let start = file.as_ptr() as usize;
    let p = v.bytes().as_ptr() as usize;
    assert!(p >= start && p + 16 <= start + file.len(), "raw_data was copied");
}

#[test]
fn external_data() {
    let dir = std::env::temp_dir().join(format!("kiln-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut blob = vec![0u8; 8];
    blob.extend_from_slice(&2.5f32.to_le_bytes());
    blob.extend_from_slice(&(-1.0f32).to_le_bytes());
    std::fs::write(dir.join("w.bin"), &blob).unwrap();
    let kv = |k: &str, v: &str| StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
    let mut t = tensor("w", 1, &[2]);
    t.data_location = Some(DataLocation::External as i32);
    t.external_data = vec![kv("location", "w.bin"), kv("offset", "8"), kv("length", "8")];
    let g = import_tensor(t.clone(), Some(&dir)).unwrap();
    assert_eq!(value(&g).to_vec::<f32>().unwrap(), vec![2.5, -1.0]);

    let mut bad = t.clone();
    bad.external_data = vec![kv("location", "w.bin"), kv("offset", "12"), kv("length", "8")];
    let e = import_tensor(bad, Some(&dir)).unwrap_err().to_string();
    assert!(e.contains("tensor `w`") && e.contains("past the end"), "{e}");

    let mut escape = t.clone();
    escape.external_data = vec![kv("location", "../w.bin")];
    let e = import_tensor(escape, Some(&dir)).unwrap_err().to_string();
    assert!(e.contains("relative path inside the model's directory"), "{e}");

    let mut missing = t;
    missing.external_data = vec![kv("location", "nope.bin")];
    let e = import_tensor(missing, Some(&dir)).unwrap_err().to_string();
    assert!(e.contains("cannot read external data"), "{e}");
}

#[test]
fn malformed_tensors() {
    let mut t = tensor("short", 1, &[3]);
    t.float_data = vec![1.0, 2.0];
    let e = import_tensor(t, None).unwrap_err().to_string();
    assert!(e.contains("tensor `short`") && e.contains("needs 3 values in float_data, found 2"), "{e}");

    let mut t = tensor("rawshort", 1, &[3]);
    t.raw_data = Some(Bytes::from_static(&[0; 5]));
    let e = import_tensor(t, None).unwrap_err().to_string();
    assert!(e.contains("needs 12 bytes of raw_data, found 5"), "{e}");

    let t = tensor("neg", 1, &[-2]);
    let e = import_tensor(t, None).unwrap_err().to_string();
    assert!(e.contains("negative dimension -2"), "{e}");

    let t = tensor("s", 8, &[1]);
    let e = import_tensor(t, None).unwrap_err().to_string();
    assert!(e.contains("string tensors are not supported"), "{e}");

    let t = tensor("huge", 1, &[1 << 40, 1 << 40]);
    assert!(import_tensor(t, None).is_err());
}
