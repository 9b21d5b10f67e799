//! The `dcir-import` driver: ONNX model → dcir IR text plus a safetensors
//! weight file beside it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use dcir_ir::print_module;
use dcir_onnx::{ImportOptions, import_file, write_weights};

/// The command line of `dcir-import`.
#[derive(Debug, Parser)]
#[command(
    about = "Import an ONNX model as dcir IR, with its weights as safetensors.",
    long_about = "Import an ONNX model (opset 13 and up, as torch.onnx exports it) as a verified \
                  dcir graph. Shape arithmetic is folded at import, since every shape is static; \
                  initializers become parameters whose values go to <stem>.safetensors beside \
                  the output (initializers without data get seeded random values). The exit code \
                  is 0 on success and 1 on any error.\n\n\
                  Examples:\n  \
                  dcir-import resnet50.onnx                  # writes resnet50.dcir, resnet50.safetensors\n  \
                  dcir-import bert.onnx -o out/bert.dcir --dim batch=1 --dim seq=128"
)]
pub struct ImportArgs {
    /// The ONNX model (external data files are read relative to its folder).
    #[arg(value_name = "MODEL")]
    pub input: PathBuf,
    /// The IR output; default: the model's path with the extension `.dcir`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The value of a dynamic dim: its name (`dim_param`), or `INPUT:INDEX`; repeatable.
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
    pub dims: Vec<(String, usize)>,
    /// A graph input whose value is known: `NAME=FILE`, FILE a serialized
    /// ONNX `TensorProto` (`.pb`); the input becomes a constant (needed when
    /// it carries axes, sizes or repeats); repeatable.
    #[arg(long = "input-value", value_name = "NAME=FILE", value_parser = parse_input_value)]
    pub input_values: Vec<(String, PathBuf)>,
    /// The dcir graph's name (`main` or `@main`); default: the ONNX graph's name, or `main`.
    #[arg(long, value_name = "NAME")]
    pub graph_name: Option<String>,
    /// Seed of the random values given to initializers without data.
    #[arg(long, value_name = "N", default_value_t = dcir_onnx::DEFAULT_SEED)]
    pub seed: u64,
    /// Do not write the weight file.
    #[arg(long)]
    pub no_weights: bool,
    /// Print the time of each phase to standard error.
    #[arg(long)]
    pub timing: bool,
}

fn parse_dim(s: &str) -> Result<(String, usize), String> {
    let (name, value) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, found `{s}`"))?;
    let value = value
        .parse()
        .map_err(|_| format!("`{value}` is not a non-negative integer"))?;
    if name.is_empty() {
        return Err(format!("expected NAME=VALUE, found `{s}`"));
    }
    Ok((name.to_string(), value))
}

fn parse_input_value(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, file)) if !name.is_empty() && !file.is_empty() => {
            Ok((name.to_string(), PathBuf::from(file)))
        }
        _ => Err(format!("expected NAME=FILE, found `{s}`")),
    }
}

/// Runs `dcir-import` named `name` over `args` (program name first) and
/// returns the exit code. Messages go to standard error.
pub fn main_with(name: &str, args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: ImportArgs = match crate::parse_args(name, args) {
        Ok(args) => args,
        Err(code) => return code,
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            crate::print_error(name, message);
            ExitCode::FAILURE
        }
    }
}

/// `<output stem>.safetensors` beside the output.
pub fn weights_path(output: &Path) -> PathBuf {
    output.with_extension("safetensors")
}

fn run(args: &ImportArgs) -> Result<(), String> {
    let started = Instant::now();
    let mut known_inputs = Vec::new();
    for (name, file) in &args.input_values {
        let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let tensor = dcir_onnx::decode_tensor_proto(&bytes)
            .map_err(|e| format!("{}: {e}", file.display()))?;
        known_inputs.push((name.clone(), tensor));
    }
    let opts = ImportOptions {
        dims: args.dims.clone(),
        graph_name: args
            .graph_name
            .as_deref()
            .map(|n| n.strip_prefix('@').unwrap_or(n).to_string()),
        seed: args.seed,
        known_inputs,
    };
    let imported =
        import_file(&args.input, &opts).map_err(|e| format!("{}: {e}", args.input.display()))?;
    let t_import = started.elapsed();

    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.input.with_extension("dcir"));
    let t = Instant::now();
    let text = print_module(&imported.module);
    std::fs::write(&output, text).map_err(|e| format!("cannot write {}: {e}", output.display()))?;
    let t_print = t.elapsed();

    let t = Instant::now();
    let seeded = imported.weights.iter().filter(|w| w.seeded).count();
    if !args.no_weights && !imported.weights.is_empty() {
        let path = weights_path(&output);
        write_weights(&imported.weights, &path).map_err(|e| e.to_string())?;
        if seeded > 0 {
            eprintln!(
                "note: {seeded} of {} parameters had no data in the model; {} holds seeded random values for them (seed {})",
                imported.weights.len(),
                path.display(),
                args.seed
            );
        }
    }
    let t_weights = t.elapsed();
    if args.timing {
        for (phase, d) in [
            ("import", t_import),
            ("print", t_print),
            ("weights", t_weights),
            ("total", started.elapsed()),
        ] {
            eprintln!("timing: {phase} {:.3} ms", d.as_secs_f64() * 1e3);
        }
    }
    Ok(())
}
