//! `dcir-opt`: read, verify and print dcir IR.

use std::process::ExitCode;

fn main() -> ExitCode {
    dcir_cli::opt::main_with("dcir-opt", std::env::args_os())
}
