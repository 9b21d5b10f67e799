//! The `dcir-run` driver: read → verify → bind inputs → run → summarize.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use dcir_interp::{InterpError, Tensor, io, memory};
use dcir_ir::{Graph, Module, verify_module};
use dcir_reader::{Diagnostic, read_bytes};

/// Where a graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CPU reference interpreter (dcir-interp).
    Cpu,
    /// Fused CUDA kernels on GPU 0 (fuses, compiles with NVRTC, runs with dcir-runtime).
    Cuda,
}

/// What a parameter's random values depend on besides the seed, its name and
/// its type (`dcir_interp::RandomBy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RandomByArg {
    /// Also what the graph does with it: positive for sqrt, log and divisors, indices within the
    /// gathered axis, weights scaled by fan-in (docs/interp.md); the same before and after every
    /// built-in pass.
    Use,
    /// Nothing else: floats in [-1, 1), integers in [0, 8); the same across any rewrite, but a
    /// sqrt, log, divisor or gather may get values outside its domain.
    Type,
}

/// The command line of `dcir-run`.
#[derive(Debug, Parser)]
#[command(
    about = "Run a dcir graph and summarize its outputs.",
    long_about = "Read dcir IR (a .dcir file, or standard input), verify it, and run one graph \
                  on the chosen backend. Parameters take their values from the safetensors \
                  files by name; the others get seeded random values (docs/interp.md lists \
                  the distributions). Prints one line per output: name, type, mean, abs-max \
                  and checksum (the sum of the elements). The exit code is 0 on success and \
                  1 on any error.\n\n\
                  With --backend cuda the graph is fused (unless it already has fused ops), \
                  compiled with NVRTC and run on GPU 0; --check compares every output with \
                  the interpreter on the same inputs (outputs are poisoned with NaN first), \
                  --bench N times N forward passes replayed as one CUDA graph.\n\n\
                  Example: dcir-run ir-examples/resnet50_bottleneck.dcir --backend cpu --seed 1\n\
                  Example: dcir-run ir-examples/ln_gelu.dcir --backend cuda --check --bench 100"
)]
pub struct RunArgs {
    /// Input file; `-` reads standard input.
    #[arg(value_name = "FILE")]
    pub input: PathBuf,
    /// Where to run the graph.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// With the cuda backend, run every op as its own kernel (the unfused baseline).
    #[arg(long)]
    pub no_fuse: bool,
    /// With the cuda backend, run every group on dcir's own kernels: no vendor library call
    /// (cuBLASLt, cuDNN) is planned or tuned.
    #[arg(long)]
    pub no_library: bool,
    /// With the cuda backend, the layout CNN activations run in: `auto` keeps the channels-last
    /// form where the cost model prices it at least 1.1x faster (or its groups that differ from
    /// the plan as written at least 1.5x faster), else the graph as written; `as-written` and
    /// `channels-last` force one (dcir-opt --emit plan shows both estimates).
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = crate::parse_layout)]
    pub layout: dcir_fusion::LayoutMode,
    /// The graph to run, when the module has several (default: the first); `main` or `@main`.
    #[arg(long, value_name = "NAME")]
    pub graph: Option<String>,
    /// Parameter values by name, from a safetensors file.
    #[arg(long, value_name = "FILE")]
    pub weights: Option<PathBuf>,
    /// More parameter values by name, from a safetensors file (no name may be in both files).
    #[arg(long, value_name = "FILE")]
    pub inputs: Option<PathBuf>,
    /// Seed of the random values of parameters that no file provides.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// What the random values depend on besides the seed and the parameter's name and type.
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = RandomByArg::Use)]
    pub random_by: RandomByArg,
    /// Write the inputs the run used (from files or random) to this safetensors file, under the
    /// parameters' names: `--inputs FILE` replays them (to check a pass on exactly the same values).
    #[arg(long, value_name = "FILE")]
    pub save_inputs: Option<PathBuf>,
    /// Write the outputs to this safetensors file, under the returned values' names.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print the time of each phase (parse, verify, inputs, run, total) to standard error.
    #[arg(long)]
    pub timing: bool,
    /// (cuda) Compare every output with the interpreter's, within the dtype's tolerance; exit 1 on a
    /// mismatch. An f16/bf16 graph's output may instead match the graph computed in f32 and rounded
    /// once (the kernels keep a group's intermediates in f32; docs/interp.md).
    #[arg(long)]
    pub check: bool,
    /// (cuda) Time N forward passes (CUDA-graph replay, after 10 warm-up): median, min, max, peak memory.
    #[arg(long, value_name = "N")]
    pub bench: Option<usize>,
    /// (cuda) With --bench, also time every launch on its own (median per kernel), launched by the host one at a time: a library call's time there includes the host's work for it (cuDNN's fused convolution several times its time in the CUDA graph)
    #[arg(long)]
    pub per_kernel: bool,
    /// (cuda) Run the artifact in DIR (from `dcir-opt --emit artifact -o DIR`) instead of compiling FILE's graph.
    #[arg(long, value_name = "DIR")]
    pub artifact: Option<PathBuf>,
    /// (cuda) Write the artifact that ran to DIR, with the algorithm each library call (cuBLASLt, cuDNN) chose on this GPU recorded, so that --artifact DIR replays the calls without asking the libraries' heuristics again.
    #[arg(long, value_name = "DIR")]
    pub save_artifact: Option<PathBuf>,
    /// (cuda) The GPU to run on, numbered among those CUDA_VISIBLE_DEVICES leaves visible.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub gpu: usize,
    /// (cuda) The device the fusion cost model plans for: `live` (the --gpu, queried) or a preset (h200, h100, a100, v100, rtx2080).
    #[arg(long, value_name = "NAME", default_value = "live")]
    pub device: String,
    /// The most memory the run may hold, e.g. `512M`, `16G` (binary units). The interpreter
    /// (the cpu backend, and --check) refuses a graph whose values would exceed it before
    /// allocating, as the cuda backend does for the device memory its plan needs. Default:
    /// the memory available on this machine (host) and the device's free memory (GPU).
    #[arg(long, value_name = "SIZE", value_parser = dcir_interp::memory::parse_size)]
    pub memory_budget: Option<u64>,
    /// (cuda) Tuning before compiling.
    #[command(flatten)]
    pub tune: crate::gpu::TuneArgs,
}

/// A failure already described to the user.
struct Reported;

/// Runs the driver named `name` over `args` (program name first) and returns
/// the process exit code. Results go to standard output, diagnostics to
/// standard error.
pub fn main_with(name: &str, args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: RunArgs = match crate::parse_args(name, args) {
        Ok(args) => args,
        Err(code) => return code,
    };
    // NVRTC's output is kept between runs (docs/cuda.md: the NVRTC cache).
    dcir_cuda::nvrtc::set_cache_dir(dcir_cuda::nvrtc::default_cache_dir());
    match run(name, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Reported) => ExitCode::FAILURE,
    }
}

fn run(name: &str, args: &RunArgs) -> Result<(), Reported> {
    let started = Instant::now();
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    let fail = |message: String| {
        crate::print_error(name, message);
        Reported
    };
    let (file_name, bytes) = read_input(&args.input).map_err(fail)?;
    let source = || String::from_utf8_lossy(&bytes);

    let t = Instant::now();
    let module = read_bytes(&bytes).map_err(|diags| report(&file_name, &source(), &diags))?;
    timings.push(("parse", t.elapsed()));

    let t = Instant::now();
    verify_module(&module).map_err(|errors| {
        let diags: Vec<Diagnostic> = errors.iter().map(Diagnostic::from).collect();
        report(&file_name, &source(), &diags)
    })?;
    timings.push(("verify", t.elapsed()));
    let graph = pick_graph(&module, args.graph.as_deref()).map_err(fail)?;
    if args.backend == Backend::Cpu
        && (args.check
            || args.bench.is_some()
            || args.per_kernel
            || args.artifact.is_some()
            || args.save_artifact.is_some()
            || args.tune.tune)
    {
        return Err(fail(
            "--check, --bench, --per-kernel, --artifact, --save-artifact and --tune need --backend cuda".to_string(),
        ));
    }
    if args.tune.tune && args.artifact.is_some() {
        return Err(fail(
            "--tune tunes a graph it compiles; an --artifact is already compiled".to_string(),
        ));
    }
    if args.per_kernel && args.bench.is_none() {
        return Err(fail("--per-kernel needs --bench N".to_string()));
    }

    // Host memory: the interpreter's values when it runs the graph (the
    // cpu backend, --check), else the inputs and outputs; before any
    // allocation.
    let (host_budget, budget_source) = match args.memory_budget {
        Some(b) => (Some(b), "--memory-budget"),
        None => (
            memory::available_memory(),
            "the memory available on this machine; --memory-budget sets another",
        ),
    };
    if let Some(budget) = host_budget {
        let (needed, what) = if args.backend == Backend::Cpu || args.check {
            (
                memory::peak_bytes(graph).bytes,
                "for its values on the interpreter",
            )
        } else {
            (
                memory::io_bytes(graph),
                "for its inputs and outputs on the host",
            )
        };
        memory::check_budget(graph, needed, what, budget, budget_source)
            .map_err(|e| fail(e.to_string()))?;
    }

    let t = Instant::now();
    let mut given = Vec::new();
    for path in [&args.weights, &args.inputs].into_iter().flatten() {
        for (tensor_name, tensor) in read_tensors(path).map_err(fail)? {
            if given.iter().any(|(n, _)| *n == tensor_name) {
                return Err(fail(format!(
                    "tensor `{tensor_name}` is in both --weights and --inputs"
                )));
            }
            given.push((tensor_name, tensor));
        }
    }
    let by = match args.random_by {
        RandomByArg::Use => dcir_interp::RandomBy::Use,
        RandomByArg::Type => dcir_interp::RandomBy::Type,
    };
    let bound = io::bind_inputs_by(graph, given, args.seed, by).map_err(|e| fail(e.to_string()))?;
    if let Some((_, from, to)) = bound.converted.first() {
        let all_alike = bound.converted.iter().all(|(_, f, t)| (f, t) == (from, to));
        let what = if all_alike {
            format!("from {} to {}", from.name(), to.name())
        } else {
            "to their parameters' float dtypes".to_string()
        };
        let n = bound.converted.len();
        let tensors = if n == 1 { "tensor" } else { "tensors" };
        eprintln!(
            "{name}: note: {n} {tensors} converted {what} on load (the graph's precision; saturated as to-f16 does)"
        );
    }
    if !bound.random.is_empty() {
        eprintln!(
            "{name}: random values (seed {}) for {} of {} parameters",
            args.seed,
            bound.random.len(),
            graph.params().len()
        );
    }
    if let Some(path) = &args.save_inputs {
        let named: Vec<(String, Tensor)> = graph
            .params()
            .iter()
            .map(|&p| graph.value(p).name.clone())
            .zip(bound.inputs.iter().cloned())
            .collect();
        let bytes = io::write_safetensors(&named).map_err(|e| fail(e.to_string()))?;
        std::fs::write(path, bytes)
            .map_err(|e| fail(format!("cannot write `{}`: {e}", path.display())))?;
    }
    timings.push(("inputs", t.elapsed()));

    let t = Instant::now();
    let outputs = match args.backend {
        Backend::Cpu => dcir_interp::run_graph(graph, &bound.inputs)
            .map_err(|e| report_run_error(name, &file_name, &source(), &e))?,
        Backend::Cuda => {
            let compile = |no_library: bool| {
                let options = crate::gpu::CompileOptions {
                    device: &args.device,
                    tune: &args.tune,
                    no_fuse: args.no_fuse,
                    no_library,
                    layout: args.layout,
                    gpu: args.gpu,
                };
                crate::gpu::compile(graph, &options)
            };
            let artifact = match &args.artifact {
                Some(dir) => crate::gpu::load(dir, graph),
                None => compile(args.no_library),
            }
            .map_err(fail)?;
            timings.push(("compile", t.elapsed()));
            let t = Instant::now();
            let bench = args.bench.map(|reps| (reps, args.per_kernel));
            let execute = |artifact: &dcir_artifact::Artifact| {
                crate::gpu::execute(
                    artifact,
                    graph,
                    &bound.inputs,
                    bench,
                    args.memory_budget,
                    args.gpu,
                )
            };
            let (mut artifact, run) = match execute(&artifact) {
                // A library that refuses a call it was planned for (a
                // pointer's alignment the planner's probe did not see) is a
                // candidate lost, not a failed run: compiled again without.
                Err(crate::gpu::ExecuteError::Library(why)) if args.artifact.is_none() => {
                    eprintln!("{name}: note: {why}; compiling again with dcir's own kernels only");
                    let artifact = compile(true).map_err(fail)?;
                    let run = execute(&artifact);
                    run.map(|run| (artifact, run))
                }
                other => other.map(|run| (artifact, run)),
            }
            .map_err(|e| fail(e.to_string()))?;
            if let Some(dir) = &args.save_artifact {
                for (kernel, call) in &run.chosen {
                    artifact.kernels[*kernel as usize].library = Some(call.clone());
                }
                artifact.write_dir(dir).map_err(|e| {
                    fail(format!(
                        "cannot write the artifact to `{}`: {e}",
                        dir.display()
                    ))
                })?;
            }
            timings.push(("run", t.elapsed()));
            report_cuda(&run);
            if args.check {
                let want = dcir_interp::run_graph(graph, &bound.inputs)
                    .map_err(|e| report_run_error(name, &file_name, &source(), &e))?;
                // An f16/bf16 reference's own rounding noise widens the bound.
                let exact = dcir_interp::f32_reference(graph, &bound.inputs)
                    .transpose()
                    .map_err(|e| report_run_error(name, &file_name, &source(), &e))?;
                check_outputs(name, graph, &want, exact.as_deref(), &run.outputs)?;
            }
            run.outputs
        }
    };
    if args.backend == Backend::Cpu {
        timings.push(("run", t.elapsed()));
    }

    let names = io::output_names(graph);
    for (output_name, tensor) in names.iter().zip(&outputs) {
        let s = tensor.summary();
        println!(
            "%{output_name} {} mean={:.6e} abs_max={:.6e} checksum={:.9e}",
            tensor.ty(),
            s.mean,
            s.abs_max,
            s.checksum
        );
    }
    if let Some(path) = &args.output {
        let named: Vec<(String, Tensor)> = names.into_iter().zip(outputs).collect();
        let bytes = io::write_safetensors(&named).map_err(|e| fail(e.to_string()))?;
        std::fs::write(path, bytes)
            .map_err(|e| fail(format!("cannot write `{}`: {e}", path.display())))?;
    }
    timings.push(("total", started.elapsed()));
    if args.timing {
        for (phase, d) in timings {
            eprintln!("timing: {phase} {:.3} ms", d.as_secs_f64() * 1e3);
        }
    }
    Ok(())
}

/// Prints what the GPU run measured, to standard error.
fn report_cuda(run: &crate::gpu::CudaRun) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "cuda: {} launches on {}; device memory {:.1} MiB planned ({:.1} MiB if every tensor had its own buffer)",
        run.launches,
        run.device,
        mib(run.memory.0),
        mib(run.memory.1)
    );
    if let Some(b) = &run.bench {
        println!(
            "bench: {} runs (CUDA graph): median {:.4} ms, min {:.4} ms, max {:.4} ms",
            b.reps, b.timing.median_ms, b.timing.min_ms, b.timing.max_ms
        );
        if let Some(per) = &b.per_launch {
            let total: f64 = per.iter().map(|(_, ms)| ms).sum();
            println!("per kernel (launched one by one, median ms; sum {total:.4} ms):");
            for (kernel, ms) in per {
                println!(
                    "  {ms:9.4}  {:5.1}%  {kernel}",
                    100.0 * ms / total.max(1e-12)
                );
            }
        }
    }
}

/// Compares the GPU's outputs with the interpreter's; prints one line per
/// output and fails on any mismatch. With `exact` (the graph computed in f32,
/// for a graph with f16 or bf16 values), each float output's tolerance is
/// widened by the reference's own distance from it
/// ([`dcir_interp::Tolerance::widened`]).
fn check_outputs(
    name: &str,
    graph: &Graph,
    want: &[Tensor],
    exact: Option<&[Tensor]>,
    got: &[Tensor],
) -> Result<(), Reported> {
    let mut failed = false;
    for (i, ((output_name, w), g)) in io::output_names(graph)
        .iter()
        .zip(want)
        .zip(got)
        .enumerate()
    {
        let mut tolerance = dcir_interp::Tolerance::for_output_of(graph, w.dtype());
        let noise = exact.map_or(0.0, |e| dcir_interp::rel_l2(&e[i], w));
        if tolerance.rel_l2 > 0.0 && noise > tolerance.rel_l2 / 2.0 {
            tolerance = tolerance.widened(noise);
            println!(
                "check %{output_name}: the reference is {noise:.3e} (rel_l2) from the graph computed in f32; bound widened to {:.3e}",
                tolerance.rel_l2
            );
        }
        // The kernels keep a group's f16/bf16 intermediates in f32 and round
        // where they store (docs/cuda.md): where rounding every op as the
        // reference does tips a comparison, a floor or a singularity, the
        // output is right when it is the graph computed in f32, rounded once.
        let in_f32 = || {
            let e = &exact?[i];
            let rounded = match e.dtype() == w.dtype() {
                true => e.clone(),
                false => Tensor::from_f32(w.ty().clone(), &e.to_f32()).ok()?,
            };
            dcir_interp::compare(&rounded, g, &tolerance).ok()
        };
        match dcir_interp::compare(w, g, &tolerance) {
            Ok(s) => println!(
                "check %{output_name}: PASS rel_l2={:.3e} max_abs={:.3e}",
                s.rel_l2, s.max_abs
            ),
            Err(m) => match in_f32() {
                Some(s) => println!(
                    "check %{output_name}: PASS against the graph computed in f32, rel_l2={:.3e} max_abs={:.3e} (the op-by-op {} reference: {m})",
                    s.rel_l2,
                    s.max_abs,
                    w.dtype()
                ),
                None => {
                    println!("check %{output_name}: FAIL {m}");
                    failed = true;
                }
            },
        }
    }
    if failed {
        eprintln!("{name}: error: the cuda outputs differ from the interpreter's");
        return Err(Reported);
    }
    Ok(())
}

fn read_input(input: &Path) -> Result<(String, Vec<u8>), String> {
    let mut bytes = Vec::new();
    if input.as_os_str() == "-" {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        Ok(("<stdin>".to_string(), bytes))
    } else {
        let bytes =
            std::fs::read(input).map_err(|e| format!("cannot read `{}`: {e}", input.display()))?;
        Ok((input.display().to_string(), bytes))
    }
}

fn read_tensors(path: &Path) -> Result<Vec<(String, Tensor)>, String> {
    let bytes =
        std::fs::read(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    io::read_safetensors(&bytes).map_err(|e| format!("`{}`: {e}", path.display()))
}

fn pick_graph<'m>(module: &'m Module, name: Option<&str>) -> Result<&'m Graph, String> {
    // `@main` as the IR writes it, or `main`.
    match name.map(|n| n.strip_prefix('@').unwrap_or(n)) {
        None => module
            .graphs
            .first()
            .ok_or_else(|| "the module has no graph".to_string()),
        Some(name) => module.graph(name).ok_or_else(|| {
            let names: Vec<String> = module
                .graphs
                .iter()
                .map(|g| format!("@{}", g.name()))
                .collect();
            format!(
                "the module has no graph @{name} (it has: {})",
                names.join(", ")
            )
        }),
    }
}

fn report(file_name: &str, source: &str, diags: &[Diagnostic]) -> Reported {
    crate::print_diagnostics(file_name, source, diags);
    Reported
}

/// An op error points at the op in the source; others are one line.
fn report_run_error(name: &str, file_name: &str, source: &str, e: &InterpError) -> Reported {
    match e {
        InterpError::Op {
            loc: dcir_ir::Location(Some(span)),
            ..
        } => report(
            file_name,
            source,
            &[Diagnostic::error(e.to_string(), *span)],
        ),
        _ => {
            crate::print_error(name, e);
            Reported
        }
    }
}
