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

/// `--layout`'s value (dcir-opt and dcir-run).
pub(crate) fn parse_layout(name: &str) -> Result<dcir_fusion::LayoutMode, String> {
    dcir_fusion::LayoutMode::parse(name).ok_or_else(|| {
        format!(
            "unknown layout `{name}` (one of: {})",
            dcir_fusion::LayoutMode::NAMES.join(", ")
        )
    })
}

/// dcir's version and the commit it was built from (`git describe` at build
/// time; `unknown` outside a git checkout).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DCIR_COMMIT"), ")");

/// What `--version` prints: the tool and dcir's version; with `-v` (or
/// `--verbose`) also the NVRTC and CUDA driver found on this machine.
pub fn version_text(name: &str, verbose: bool) -> String {
    let mut text = format!("{name} {VERSION}\n");
    if verbose {
        let nvrtc = match dcir_cuda::nvrtc::version() {
            Some((major, minor)) => format!("{major}.{minor}"),
            None => {
                dcir_cuda::nvrtc::unavailable_reason().unwrap_or_else(|| "not found".to_string())
            }
        };
        let driver = match dcir_runtime::driver_version() {
            Some((major, minor)) => format!("supports CUDA {major}.{minor}"),
            None => "not found (no libcuda.so)".to_string(),
        };
        text.push_str(&format!("nvrtc: {nvrtc}\ncuda driver: {driver}\n"));
    }
    text
}

/// Parses a driver's command line with the tool's own `name` in usage and
/// help; on `--help`, `--version` or a usage error, prints the message and
/// gives the exit code to return (0 for help and version, 1 for an error).
pub fn parse_args<T: clap::Parser>(
    name: &str,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<T, std::process::ExitCode> {
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    let flag = |names: &[&str]| args.iter().skip(1).any(|a| names.iter().any(|n| a == n));
    if flag(&["--version", "-V"]) {
        print!("{}", version_text(name, flag(&["-v", "--verbose"])));
        return Err(std::process::ExitCode::SUCCESS);
    }
    let command = T::command()
        .name(name.to_string())
        .bin_name(name.to_string())
        .disable_version_flag(true)
        .arg(
            clap::Arg::new("version")
                .short('V')
                .long("version")
                .action(clap::ArgAction::SetTrue)
                .help("Print dcir's version and commit (with -v also the NVRTC and CUDA driver found)"),
        );
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

/// Prints `diags` against `source` to standard error: coloured when standard
/// error is a terminal, unless `NO_COLOR` is set; `CLICOLOR_FORCE=1` colours
/// a pipe too (no-color.org, bixense.com/clicolors).
pub fn print_diagnostics(file_name: &str, source: &str, diags: &[dcir_reader::Diagnostic]) {
    use std::io::IsTerminal;
    let set = |var: &str| std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0");
    let color = !set("NO_COLOR") && (set("CLICOLOR_FORCE") || std::io::stderr().is_terminal());
    let style = if color {
        dcir_reader::Style::Ansi
    } else {
        dcir_reader::Style::Plain
    };
    eprint!(
        "{}",
        dcir_reader::render_styled(file_name, source, diags, style)
    );
}

/// Prints `{name}: error: {message}` to standard error, the message's
/// control characters shown as `?` (it may quote the input).
pub(crate) fn print_error(name: &str, message: impl std::fmt::Display) {
    eprintln!(
        "{name}: error: {}",
        dcir_reader::printable(&message.to_string())
    );
}

mod gpu;
pub mod import;
pub mod opt;
pub mod run;
