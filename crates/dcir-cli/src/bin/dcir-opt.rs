//! `dcir-opt`: read, verify and print dcir IR.

use std::process::ExitCode;

/// The reader allocates per token and per value; mimalloc makes reading a
/// large graph about a sixth cheaper than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dcir_cli::opt::main_with("dcir-opt", std::env::args_os())
}
