//! `dcir-import`: ONNX model → dcir IR and a safetensors weight file.

use std::process::ExitCode;

/// mimalloc, as in `dcir-opt`: the importer allocates per value and per op.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dcir_cli::import::main_with("dcir-import", std::env::args_os())
}
