//! `dcir-opt`: read dcir IR, run passes on it, print it.

use std::process::ExitCode;

/// The reader allocates per token and per value; mimalloc makes reading a
/// large graph about a sixth cheaper than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let registry = dcir_cli::default_registry();
    dcir_cli::opt::main_with("dcir-opt", &registry, std::env::args_os())
}
