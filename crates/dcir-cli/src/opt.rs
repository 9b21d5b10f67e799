//! The `dcir-opt` driver: read → verify → print, with the debugging flags.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use dcir_ir::{Module, print_module, verify_module};
use dcir_reader::{Diagnostic, read_bytes, render};

/// The command line of `dcir-opt` and of every tool built on [`main_with`].
#[derive(Debug, Parser)]
#[command(
    about = "Read dcir IR, verify it and print it in canonical form.",
    long_about = "Read dcir IR (a .dcir file, or standard input), verify every invariant \
                  of the IR, and print the canonical text. Diagnostics name file:line:col; \
                  the exit code is 0 on success and 1 on any error.\n\n\
                  Example: dcir-opt ir-examples/conv_bias_relu.dcir"
)]
pub struct OptArgs {
    /// Input file; `-` or nothing reads standard input.
    #[arg(value_name = "FILE", default_value = "-")]
    pub input: PathBuf,
    /// Write the output here instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Also print the result, read it back and check both agree (a printer/reader test).
    #[arg(long)]
    pub verify_roundtrip: bool,
    /// Print the time of each phase (parse, verify, print, total) to standard error.
    #[arg(long)]
    pub timing: bool,
}

/// A failure already described to the user.
struct Reported;

/// Runs the driver named `name` over `args` (program name first) and returns
/// the process exit code. Diagnostics go to standard error.
pub fn main_with(name: &str, args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = match OptArgs::try_parse_from(args) {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(name, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Reported) => ExitCode::FAILURE,
    }
}

fn run(name: &str, args: &OptArgs) -> Result<(), Reported> {
    let started = Instant::now();
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    let (file_name, bytes) = read_input(name, &args.input)?;
    let source = || String::from_utf8_lossy(&bytes);

    let t = Instant::now();
    let module = read_bytes(&bytes).map_err(|diags| report(&file_name, &source(), &diags))?;
    timings.push(("parse", t.elapsed()));

    let t = Instant::now();
    check(&module, &file_name, source)?;
    timings.push(("verify", t.elapsed()));

    let t = Instant::now();
    let text = print_module(&module);
    timings.push(("print", t.elapsed()));

    if args.verify_roundtrip {
        let t = Instant::now();
        verify_roundtrip(name, &module, &text)?;
        timings.push(("roundtrip", t.elapsed()));
    }

    write_output(name, args.output.as_ref(), &text)?;
    timings.push(("total", started.elapsed()));
    if args.timing {
        for (phase, d) in timings {
            eprintln!("timing: {phase} {:.3} ms", d.as_secs_f64() * 1e3);
        }
    }
    Ok(())
}

fn read_input(name: &str, input: &PathBuf) -> Result<(String, Vec<u8>), Reported> {
    let mut bytes = Vec::new();
    if input.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut bytes).map_err(|e| {
            eprintln!("{name}: error: cannot read standard input: {e}");
            Reported
        })?;
        Ok(("<stdin>".to_string(), bytes))
    } else {
        let bytes = std::fs::read(input).map_err(|e| {
            eprintln!("{name}: error: cannot read `{}`: {e}", input.display());
            Reported
        })?;
        Ok((input.display().to_string(), bytes))
    }
}

fn report(file_name: &str, source: &str, diags: &[Diagnostic]) -> Reported {
    eprint!("{}", render(file_name, source, diags));
    Reported
}

fn check<'s>(
    module: &Module,
    file_name: &str,
    source: impl FnOnce() -> std::borrow::Cow<'s, str>,
) -> Result<(), Reported> {
    verify_module(module).map_err(|errors| {
        let diags: Vec<Diagnostic> = errors.iter().map(Diagnostic::from).collect();
        report(file_name, &source(), &diags)
    })
}

fn verify_roundtrip(name: &str, module: &Module, text: &str) -> Result<(), Reported> {
    let reread = dcir_reader::parse_module(text).map_err(|diags| {
        eprintln!("{name}: error: --verify-roundtrip: the printed IR does not read back:");
        report("<printed>", text, &diags)
    })?;
    if &reread != module || print_module(&reread) != text {
        eprintln!(
            "{name}: error: --verify-roundtrip: the printed IR reads back to a different module"
        );
        return Err(Reported);
    }
    Ok(())
}

fn write_output(name: &str, output: Option<&PathBuf>, text: &str) -> Result<(), Reported> {
    let result = match output {
        Some(path) => std::fs::write(path, text).map_err(|e| (path.display().to_string(), e)),
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|e| ("standard output".to_string(), e))
        }
    };
    result.map_err(|(target, e)| {
        eprintln!("{name}: error: cannot write {target}: {e}");
        Reported
    })
}
