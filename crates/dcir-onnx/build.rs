//! Generates the ONNX protobuf types: `protox` compiles `proto/onnx.proto`
//! into a descriptor set (no `protoc`), `prost-build` turns it into Rust.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let fds = protox::compile(["onnx.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
