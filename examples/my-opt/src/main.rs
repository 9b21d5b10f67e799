//! `my-opt`: every flag of `dcir-opt`, plus the `pow-to-mul` pass.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut registry = dcir_cli::default_registry();
    registry
        .register(my_opt::POW_TO_MUL)
        .expect("`pow-to-mul` is a new name");
    dcir_cli::opt::main_with("my-opt", &registry, std::env::args_os())
}
