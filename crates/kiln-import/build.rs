//! Compiles `proto/onnx.proto` with protox (a pure-Rust protobuf compiler, so no
//! `protoc` binary is needed) and generates prost types whose `bytes` fields are
//! `bytes::Bytes`, so tensor data is sliced out of the model buffer, not copied.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let fds = protox::compile(["proto/onnx.proto"], ["proto"])?;
    prost_build::Config::new().bytes(["."]).compile_fds(fds)?;
    Ok(())
}
