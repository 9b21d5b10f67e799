//! The `dcir-opt` driver: read → verify → passes → print, with the debugging flags.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use dcir_fusion::{
    CostModel, DeviceSpec, FUSE_NAME, LayoutChoice, LayoutMode, Libraries, apply_plan, explain,
    plan_graph, plan_layout, plan_unfused,
};
use dcir_ir::{Module, OpKind, print_module, verify_module};
use dcir_passes::{Instrumentation, PassManager, PassRegistry, PipelineFailure, build_pipeline};
use dcir_reader::{Diagnostic, read_bytes};

/// The command line of `dcir-opt` and of every tool built on [`main_with`].
#[derive(Debug, Parser)]
#[command(
    about = "Read dcir IR, run a pass pipeline on it, and print the result.",
    long_about = "Read dcir IR (a .dcir file, or standard input), verify it, run the passes \
                  of --pipeline, and print the canonical text. Diagnostics name \
                  file:line:col, coloured on a terminal (NO_COLOR=1 turns colour off, \
                  CLICOLOR_FORCE=1 on); the exit code is 0 on success and 1 on any error.\n\n\
                  Examples:\n  \
                  dcir-opt ir-examples/conv_bias_relu.dcir\n  \
                  dcir-opt --pipeline 'canonicalize,cse,dce' model.dcir -o out.dcir\n  \
                  dcir-opt --list-passes"
)]
pub struct OptArgs {
    /// Input file; `-` or nothing reads standard input.
    #[arg(value_name = "FILE", default_value = "-")]
    pub input: PathBuf,
    /// Write the output here instead of standard output (a directory for `--emit artifact`).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Passes to run, comma-separated, options in braces: 'cse,fold-constants{max-elems=64}'.
    #[arg(long, value_name = "PIPELINE")]
    pub pipeline: Option<String>,
    /// Fuse ops into kernels after the pipeline (default pipeline: canonicalize,fold-matmul-scale,fold-gelu,canonicalize,cse,dce).
    #[arg(long)]
    pub fuse: bool,
    /// Plan every op as its own kernel (the unfused baseline); implies --fuse.
    #[arg(long, conflicts_with = "tune_fusion")]
    pub no_fuse: bool,
    /// Plan every group on dcir's own kernels: no vendor library call (cuBLASLt, cuDNN), which the
    /// cost model otherwise picks where it prices the call faster.
    #[arg(long)]
    pub no_library: bool,
    /// The layout CNN activations run in: `auto` plans the graph as written and in its
    /// channels-last form (the `channels-last` pass) and keeps channels-last where the cost
    /// model prices it at least 1.1x faster, or its groups that differ from the plan as written
    /// at least 1.5x faster than those they replace; `as-written` and `channels-last` force one.
    /// `--emit plan` shows both estimates.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = crate::parse_layout)]
    pub layout: LayoutMode,
    /// What to print: the IR, the fusion plan (a table per graph), Graphviz of the plan, or CUDA.
    #[arg(long, value_enum, default_value_t = Emit::Ir)]
    pub emit: Emit,
    /// The form of `--emit plan`: markdown tables, or one JSON document (the device, and per
    /// graph its groups with ops, kind, level, parameters, bytes and estimates).
    #[arg(long, value_enum, default_value_t = PlanFormat::Markdown)]
    pub format: PlanFormat,
    /// GPU architecture NVRTC compiles for with `--emit artifact` (default: the --device
    /// preset's, e.g. sm_90 for h200, sm_80 for a100).
    #[arg(long, value_name = "ARCH")]
    pub arch: Option<String>,
    /// Device preset the fusion cost model uses (h200, h100, a100, v100, rtx2080).
    #[arg(long, value_name = "NAME", default_value = "h200")]
    pub device: String,
    /// Say, for each merge fusion rejected, which rule or estimate rejected it (to standard error).
    #[arg(long)]
    pub explain_fusion: bool,
    /// Tuning after fusing (needs a GPU; with --emit ir, cuda or artifact).
    #[command(flatten)]
    pub tune: crate::gpu::TuneArgs,
    /// List the registered passes with their options, and exit.
    #[arg(long)]
    pub list_passes: bool,
    /// Print the IR (to standard error) before each run of this pass; repeatable.
    #[arg(long, value_name = "PASS")]
    pub print_ir_before: Vec<String>,
    /// Print the IR after each run of this pass; repeatable.
    #[arg(long, value_name = "PASS")]
    pub print_ir_after: Vec<String>,
    /// Print the IR after every pass.
    #[arg(long)]
    pub print_ir_after_all: bool,
    /// Print the IR after every pass that changed it.
    #[arg(long)]
    pub print_ir_after_change: bool,
    /// Verify the IR after every pass, naming the pass that broke it (on by default;
    /// `--verify-each=false` turns it off, `--verify-each` alone keeps it on).
    #[arg(
        long,
        value_name = "BOOL",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub verify_each: bool,
    /// Report the time each pass took (to standard error).
    #[arg(long)]
    pub time_passes: bool,
    /// Write the input and the IR after each pass to DIR, one numbered file each.
    #[arg(long, value_name = "DIR")]
    pub dump_dir: Option<PathBuf>,
    /// Run only the first N passes that are not required (bisecting a miscompile); log each decision.
    #[arg(long, value_name = "N")]
    pub opt_bisect_limit: Option<usize>,
    /// Also print the result, read it back and check both agree (a printer/reader test).
    #[arg(long)]
    pub verify_roundtrip: bool,
    /// Print the time of each phase (parse, verify, passes, print, total) to standard error.
    #[arg(long)]
    pub timing: bool,
}

/// What `dcir-opt` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Emit {
    /// The IR after the pipeline (and fusion, with `--fuse`).
    Ir,
    /// The fusion plan: one row per kernel with its estimate, and totals.
    Plan,
    /// The fusion plan as Graphviz, groups as clusters.
    Dot,
    /// The CUDA source of every kernel (fusing first unless the input is already fused).
    Cuda,
    /// The compiled program, written to the directory `-o DIR`: `artifact.json`
    /// (kernels, launches, buffers with liveness, I/O) and each kernel's `.cu`
    /// and `.ptx` (NVRTC); one subdirectory per graph when the module has several.
    Artifact,
}

/// The form of `--emit plan`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    /// A markdown table per graph.
    Markdown,
    /// One JSON document for the module.
    Json,
}

/// A failure already described to the user.
struct Reported;

/// Runs the driver named `name`, with the passes of `registry`, over `args`
/// (program name first), and returns the process exit code. Diagnostics and
/// instrumentation go to standard error.
pub fn main_with(
    name: &str,
    registry: &PassRegistry,
    args: impl IntoIterator<Item = OsString>,
) -> ExitCode {
    let args: OptArgs = match crate::parse_args(name, args) {
        Ok(args) => args,
        Err(code) => return code,
    };
    if args.list_passes {
        print!("{}", list_passes(registry));
        return ExitCode::SUCCESS;
    }
    // NVRTC's output is kept between runs (docs/cuda.md: the NVRTC cache).
    dcir_cuda::nvrtc::set_cache_dir(dcir_cuda::nvrtc::default_cache_dir());
    match run(name, registry, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Reported) => ExitCode::FAILURE,
    }
}

/// `--list-passes`: every pass with its summary and options.
pub fn list_passes(registry: &PassRegistry) -> String {
    let mut out = String::from("Passes:\n");
    for def in registry.sorted() {
        out.push_str(&format!("  {:<22} {}\n", def.name, def.summary));
        for o in def.options {
            out.push_str(&format!(
                "      {}=<{}>  {} (default: {})\n",
                o.name,
                o.kind.describe(),
                o.help,
                if o.default.is_empty() {
                    "none"
                } else {
                    o.default
                }
            ));
        }
    }
    out
}

fn run(name: &str, registry: &PassRegistry, args: &OptArgs) -> Result<(), Reported> {
    let started = Instant::now();
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    let fusing =
        args.fuse || args.no_fuse || args.emit != Emit::Ir || args.explain_fusion || args.tune.tune;
    if args.tune.tune && !args.tune.tune_fusion && matches!(args.emit, Emit::Plan | Emit::Dot) {
        eprintln!(
            "{name}: error: --tune chooses kernel parameters; use it with --emit ir, cuda or artifact (or add --tune-fusion for the plan with measured times)"
        );
        return Err(Reported);
    }
    let model = match fusing {
        true => Some(cost_model(name, &args.device, args.no_library)?),
        false => None,
    };
    if args.format == PlanFormat::Json && args.emit != Emit::Plan {
        eprintln!("{name}: error: --format json is a form of --emit plan");
        return Err(Reported);
    }
    let printed = (args
        .print_ir_before
        .iter()
        .map(|p| ("--print-ir-before", p)))
    .chain(args.print_ir_after.iter().map(|p| ("--print-ir-after", p)));
    for (flag, pass) in printed {
        if registry.get(pass).is_none() {
            crate::print_error(
                name,
                format!(
                    "{flag} {pass}: no pass is named `{pass}`; {}",
                    registry.unknown_name_help(pass)
                ),
            );
            return Err(Reported);
        }
    }
    if args.emit == Emit::Artifact {
        dcir_cuda::nvrtc::check_arch(&artifact_arch(args)).map_err(|e| {
            crate::print_error(name, e);
            Reported
        })?;
    }
    let pipeline = match (&args.pipeline, fusing) {
        (Some(text), _) => Some(text.as_str()),
        (None, true) => Some(dcir_passes::FUSION_PIPELINE),
        (None, false) => None,
    };
    let mut manager = match pipeline {
        Some(text) => Some(PassManager::new(
            build_pipeline(registry, text).map_err(|e| {
                eprint!("{name}: {}", e.render(text));
                Reported
            })?,
            instrumentation(args),
        )),
        None => None,
    };
    let (file_name, bytes) = read_input(name, &args.input)?;
    let source = || String::from_utf8_lossy(&bytes);

    let t = Instant::now();
    let mut module = read_bytes(&bytes).map_err(|diags| report(&file_name, &source(), &diags))?;
    timings.push(("parse", t.elapsed()));

    let t = Instant::now();
    check(&module, &file_name, source)?;
    timings.push(("verify", t.elapsed()));

    let mut log = std::io::stderr().lock();
    let instrumentation_failed = |failure| report_failure(name, &file_name, &source(), failure);
    if let Some(manager) = &mut manager {
        let t = Instant::now();
        manager
            .run_passes(&mut module, &mut log)
            .map_err(instrumentation_failed)?;
        timings.push(("passes", t.elapsed()));
    }

    // Fusion runs as a step of the pass manager: `--print-ir-after fuse`,
    // `--time-passes`, `--dump-dir` and `--verify-each` see it like a pass.
    let mut emitted = None;
    if let Some(model) = &model {
        let t = Instant::now();
        let mut step = |m: &mut Module| {
            emitted = fuse(args, model, m)?;
            // Planning (--emit plan, dot) leaves the IR as it is.
            Ok::<bool, String>(!matches!(args.emit, Emit::Plan | Emit::Dot))
        };
        let fused = match &mut manager {
            Some(manager) => manager
                .run_step(FUSE_NAME, &mut module, &mut log, step)
                .map_err(instrumentation_failed)?,
            None => step(&mut module).map(|_| ()),
        };
        fused.map_err(|e| {
            crate::print_error(name, e);
            Reported
        })?;
        timings.push(("fuse", t.elapsed()));
    }
    if let Some(manager) = &mut manager {
        manager.finish(&mut log).map_err(instrumentation_failed)?;
    }
    drop(log);

    if args.emit == Emit::Artifact {
        let t = Instant::now();
        write_artifacts(name, args, &module)?;
        timings.push(("artifact", t.elapsed()));
    } else {
        let text = match emitted {
            Some(text) => text,
            None => {
                let t = Instant::now();
                let text = print_module(&module);
                timings.push(("print", t.elapsed()));
                if args.verify_roundtrip {
                    let t = Instant::now();
                    verify_roundtrip(name, &module, &text)?;
                    timings.push(("roundtrip", t.elapsed()));
                }
                text
            }
        };
        write_output(name, args.output.as_ref(), &text)?;
    }
    timings.push(("total", started.elapsed()));
    if args.timing {
        for (phase, d) in timings {
            eprintln!("timing: {phase} {:.3} ms", d.as_secs_f64() * 1e3);
        }
    }
    Ok(())
}

fn cost_model(name: &str, device: &str, no_library: bool) -> Result<CostModel, Reported> {
    match DeviceSpec::preset(device) {
        Some(device) => Ok(CostModel {
            device,
            top_k: 8,
            libraries: if no_library {
                Libraries::NONE
            } else {
                Libraries::ALL
            },
        }),
        None => {
            eprintln!(
                "{name}: error: unknown device `{device}` (presets: {})",
                DeviceSpec::PRESETS.join(", ")
            );
            Err(Reported)
        }
    }
}

/// Plans every graph; explains rejections if asked; returns the plan text
/// for `--emit plan|dot`, the kernels' source for `--emit cuda` (a graph that
/// already has `fused` ops is emitted as it is), or rewrites the module into
/// fused ops for `--emit ir`. An error is the message to print.
fn fuse(args: &OptArgs, model: &CostModel, module: &mut Module) -> Result<Option<String>, String> {
    // Per graph, its plan as printed (a JSON value under --format json).
    let mut plans: Vec<PlanText> = Vec::new();
    let mut session = match args.tune.tune {
        true => Some(crate::gpu::TuneSession::open(
            &args.device,
            &args.tune,
            0,
            model.libraries.clone(),
        )?),
        false => None,
    };
    for graph in &mut module.graphs {
        let already_fused = graph
            .all_ops()
            .iter()
            .any(|&o| graph.op(o).kind == OpKind::Fused);
        if already_fused {
            // Left as it is (as the `fuse` pass does); its plan is read back
            // from its `fused` ops.
            match args.emit {
                Emit::Plan | Emit::Dot => {
                    let (flat, plan) = dcir_fusion::fused_plan(graph, model)
                        .map_err(|e| format!("cannot read the plan of @{}: {e}", graph.name()))?;
                    let layout = LayoutChoice {
                        channels_last: false,
                        as_written: Some(plan.total_time()),
                        channels_last_time: None,
                        shared_time: None,
                    };
                    plans.push(show_plan(args, model, &flat, &plan, &layout));
                }
                Emit::Ir | Emit::Cuda | Emit::Artifact => {}
            }
            continue;
        }
        let name = graph.name().to_string();
        let (laid_out, plan, layout) = plan_layout(graph, args.layout, |g| match &mut session {
            Some(s) if s.fusion => s.plan(g),
            _ => {
                let plan = if args.no_fuse {
                    plan_unfused
                } else {
                    plan_graph
                };
                plan(g, model, &dcir_cuda::CudaTarget)
                    .map_err(|e| format!("cannot fuse @{name}: {e}"))
            }
        })?;
        if args.explain_fusion {
            if layout.channels_last_time.is_some() {
                eprintln!("{layout} for @{name}");
            }
            eprint!("{}", explain::explain(&laid_out, &plan));
        }
        match args.emit {
            Emit::Plan | Emit::Dot => {
                plans.push(show_plan(args, model, &laid_out, &plan, &layout));
            }
            Emit::Ir | Emit::Cuda | Emit::Artifact => {
                *graph = apply_plan(&laid_out, &plan)
                    .map_err(|e| format!("cannot fuse @{name}: {e}"))?;
            }
        }
    }
    if matches!(args.emit, Emit::Plan | Emit::Dot) {
        return Ok(Some(join_plans(model, plans)));
    }
    if matches!(args.emit, Emit::Ir | Emit::Cuda | Emit::Artifact) {
        verify_module(module).map_err(|errors| {
            let listed: Vec<String> = errors.iter().map(|e| format!("  {e}")).collect();
            format!(
                "the fused IR does not verify (a fusion bug):\n{}",
                listed.join("\n")
            )
        })?;
        if let Some(s) = &mut session {
            for graph in &mut module.graphs {
                *graph = s.tune(graph)?;
            }
        }
        if matches!(args.emit, Emit::Ir | Emit::Artifact) {
            return Ok(None);
        }
        return dcir_cuda::emit_module_source(module)
            .map(Some)
            .map_err(|e| e.to_string());
    }
    Ok(None)
}

/// One graph's plan as `--emit plan|dot` print it.
enum PlanText {
    Text(String),
    Json(serde_json::Value),
}

/// The plan of `graph` in the form `args` ask for.
fn show_plan(
    args: &OptArgs,
    model: &CostModel,
    graph: &dcir_ir::Graph,
    plan: &dcir_fusion::Plan,
    layout: &LayoutChoice,
) -> PlanText {
    match (args.emit, args.format) {
        (Emit::Dot, _) => PlanText::Text(explain::plan_dot(graph, plan)),
        (_, PlanFormat::Markdown) => {
            let mut table = explain::plan_table(graph, plan, &model.device.name);
            // A graph the layout decision weighed says what it chose, under the title.
            if layout.channels_last_time.is_some()
                && let Some(end) = table.find('\n')
            {
                table.insert_str(end + 1, &format!("{layout}\n"));
            }
            PlanText::Text(table)
        }
        (_, PlanFormat::Json) => {
            let mut doc = plan_json(graph, plan);
            doc["layout"] = serde_json::json!({
                "chosen": if layout.channels_last { "channels-last" } else { "as-written" },
                "as_written_us": layout.as_written.map(|t| t * 1e6),
                "channels_last_us": layout.channels_last_time.map(|t| t * 1e6),
            });
            PlanText::Json(doc)
        }
    }
}

/// The printed plans of a module: texts one after the other, or one JSON
/// document `{"device": .., "graphs": [..]}`.
fn join_plans(model: &CostModel, plans: Vec<PlanText>) -> String {
    let mut texts = String::new();
    let mut graphs = Vec::new();
    for p in plans {
        match p {
            PlanText::Text(t) => texts.push_str(&t),
            PlanText::Json(j) => graphs.push(j),
        }
    }
    if graphs.is_empty() {
        return texts;
    }
    let doc = serde_json::json!({
        "device": model.device.name,
        "graphs": graphs,
    });
    format!(
        "{}\n",
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    )
}

/// One graph's plan as JSON: its groups (the plan table's rows, times in
/// microseconds, parameters by name) and totals.
fn plan_json(graph: &dcir_ir::Graph, plan: &dcir_fusion::Plan) -> serde_json::Value {
    use serde_json::{Value, json};
    let attr = |a: &dcir_ir::Attr| match a {
        dcir_ir::Attr::Int(i) => json!(i),
        dcir_ir::Attr::Float(f) => json!(f),
        dcir_ir::Attr::Bool(b) => json!(b),
        dcir_ir::Attr::Str(s) => json!(s),
        dcir_ir::Attr::Ints(v) => json!(v),
        dcir_ir::Attr::Floats(v) => json!(v),
    };
    let groups: Vec<Value> = explain::plan_rows(graph, plan)
        .iter()
        .map(|r| {
            let params: serde_json::Map<String, Value> = r
                .params
                .0
                .iter()
                .map(|(name, a)| (name.to_string(), attr(a)))
                .collect();
            json!({
                "symbol": r.symbol,
                "ops": r.ops,
                "kind": r.kind,
                "level": r.level,
                "params": params,
                "flops": r.flops,
                "bytes_in": r.bytes_in,
                "bytes_out": r.bytes_out,
                "bound": r.bound,
                "estimate_us": r.time * 1e6,
                "unfused_us": r.unfused_time * 1e6,
                "saved_bytes": r.saved,
                "adapted": r.adapted,
            })
        })
        .collect();
    json!({
        "graph": graph.name(),
        "kernels": groups.len(),
        "estimate_us": plan.total_time() * 1e6,
        "unfused_us": plan.unfused_time() * 1e6,
        "groups": groups,
    })
}

/// Builds and writes the artifact of every graph of fused `module` into
/// `-o DIR` (`DIR/<graph>/` when there are several), saying what it wrote.
fn write_artifacts(name: &str, args: &OptArgs, module: &Module) -> Result<(), Reported> {
    let Some(dir) = &args.output else {
        eprintln!("{name}: error: --emit artifact needs -o DIR");
        return Err(Reported);
    };
    let options = dcir_cuda::BuildOptions {
        arch: artifact_arch(args),
        compile: true,
    };
    for graph in &module.graphs {
        let artifact = dcir_cuda::build_artifact(graph, &options).map_err(|e| {
            crate::print_error(name, e);
            Reported
        })?;
        let target = if module.graphs.len() == 1 {
            dir.clone()
        } else {
            dir.join(graph.name())
        };
        artifact.write_dir(&target).map_err(|e| {
            crate::print_error(name, e);
            Reported
        })?;
        eprintln!(
            "{name}: wrote {} ({} kernels, {} buffers, {})",
            target.display(),
            artifact.kernels.len(),
            artifact.buffers.len(),
            artifact.arch
        );
    }
    Ok(())
}

/// The architecture of `--emit artifact`: `--arch`, else the `--device`
/// preset's compute capability.
fn artifact_arch(args: &OptArgs) -> String {
    args.arch.clone().unwrap_or_else(|| {
        DeviceSpec::preset(&args.device).map_or_else(
            || dcir_cuda::nvrtc::DEFAULT_ARCH.to_string(),
            |d| format!("sm_{}", d.compute_capability),
        )
    })
}

fn instrumentation(args: &OptArgs) -> Instrumentation {
    Instrumentation {
        print_before: args.print_ir_before.clone(),
        print_after: args.print_ir_after.clone(),
        print_after_all: args.print_ir_after_all,
        print_after_change: args.print_ir_after_change,
        verify_each: args.verify_each,
        time_passes: args.time_passes,
        dump_dir: args.dump_dir.clone(),
        bisect_limit: args.opt_bisect_limit,
    }
}

fn report_failure(name: &str, file_name: &str, source: &str, failure: PipelineFailure) -> Reported {
    match failure {
        PipelineFailure::Pass { pass, error } => {
            let diag = Diagnostic {
                message: format!("pass `{pass}` failed: {}", error.message),
                span: error.loc.0,
                label: String::new(),
                notes: Vec::new(),
                help: None,
            };
            report(file_name, source, &[diag])
        }
        PipelineFailure::Verify { pass, errors, ir } => {
            eprintln!("{name}: error: the IR does not verify after pass `{pass}`");
            let diags: Vec<Diagnostic> = errors.iter().map(Diagnostic::from).collect();
            crate::print_diagnostics(file_name, source, &diags);
            eprintln!("// -----// IR after `{pass}` (does not verify) //----- //\n{ir}");
            Reported
        }
        other @ PipelineFailure::Io { .. } => {
            crate::print_error(name, other);
            Reported
        }
    }
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
    crate::print_diagnostics(file_name, source, diags);
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
