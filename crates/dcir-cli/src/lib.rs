//! The dcir drivers, as a library so downstream tools get every flag.
//!
//! [`opt::main_with`] is `dcir-opt`'s whole main: read a `.dcir` file,
//! verify it, print it canonically. A downstream tool calls it with its own
//! name (MLIR's `MlirOptMain` pattern).

/// Every pass `dcir-opt` knows: the pass library's and `fuse`.
pub fn default_registry() -> dcir_passes::PassRegistry {
    let mut registry = dcir_passes::PassRegistry::with_builtins();
    registry
        .register(dcir_cuda::FUSE)
        .expect("`fuse` is not a builtin name");
    registry
}

/// Parses a driver's command line with the tool's own `name` in usage and
/// help; on `--help`, `--version` or a usage error, prints the message and
/// gives the exit code to return (0 for help, 1 for an error).
pub fn parse_args<T: clap::Parser>(
    name: &str,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<T, std::process::ExitCode> {
    let command = T::command()
        .name(name.to_string())
        .bin_name(name.to_string());
    command
        .try_get_matches_from(args)
        .and_then(|m| T::from_arg_matches(&m))
        .map_err(|e| {
            let _ = e.print();
            if e.use_stderr() {
                std::process::ExitCode::FAILURE
            } else {
                std::process::ExitCode::SUCCESS
            }
        })
}

mod gpu;
pub mod import;
pub mod opt;
pub mod run;
