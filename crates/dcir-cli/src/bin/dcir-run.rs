//! `dcir-run`: run a dcir graph on the CPU reference interpreter.

use std::process::ExitCode;

/// The reader allocates per token and per value; mimalloc makes reading a
/// large graph about a sixth cheaper than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    dcir_cli::run::main_with("dcir-run", std::env::args_os())
}
