//! `dcir-run --backend cuda`: compile a graph to an artifact (or load one),
//! run it with dcir-runtime, check it against the interpreter, time it.

use std::path::{Path, PathBuf};

use dcir_artifact::Artifact;
use dcir_fusion::library::{LibraryProbe, Probe};
use dcir_fusion::{
    CostModel, DeviceSpec, LayoutMode, Libraries, LiveDevice, apply_plan, plan_graph, plan_layout,
    plan_unfused,
};
use dcir_interp::Tensor;
use dcir_interp::memory::human_bytes;
use dcir_ir::{Graph, Module, OpKind, verify_module};
use dcir_passes::{Instrumentation, PassManager, build_pipeline};
use dcir_runtime::Executor;

/// What `--bench` measured.
pub(crate) struct Bench {
    /// Forward passes timed.
    pub reps: usize,
    /// Latency of one forward pass (CUDA-graph replay).
    pub timing: dcir_runtime::Timing,
    /// Per launch: kernel name and median milliseconds (launched one by one).
    pub per_launch: Option<Vec<(String, f64)>>,
}

/// Why a compiled graph did not run.
#[derive(Debug)]
pub(crate) enum ExecuteError {
    /// A vendor library on this machine refused one of its calls (an
    /// unsupported shape or alignment): compiling without libraries runs.
    Library(String),
    /// Anything else.
    Other(String),
}

impl From<String> for ExecuteError {
    fn from(e: String) -> Self {
        ExecuteError::Other(e)
    }
}

impl std::fmt::Display for ExecuteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecuteError::Library(e) | ExecuteError::Other(e) => f.write_str(e),
        }
    }
}

/// What a CUDA run produced.
pub(crate) struct CudaRun {
    /// The graph's outputs.
    pub outputs: Vec<Tensor>,
    /// The device's name.
    pub device: String,
    /// The planned device bytes and the bytes without a plan.
    pub memory: (u64, u64),
    /// Kernels launched per forward pass.
    pub launches: usize,
    /// Timing, with `--bench`.
    pub bench: Option<Bench>,
    /// The library calls as prepared, algorithms recorded (kernel entry
    /// index, call): [`dcir_runtime::Executor::chosen_calls`].
    pub chosen: Vec<(u32, dcir_artifact::LibraryCall)>,
}

/// The tuning flags `dcir-run` and `dcir-opt` share.
#[derive(Clone, Debug, clap::Args)]
pub struct TuneArgs {
    /// Tune every fused group on GPU 0: measure the cost model's best parameter sets and keep the fastest that matches the interpreter (a report goes to standard error; docs/tuning.md).
    #[arg(long)]
    pub tune: bool,
    /// With --tune, parameter sets measured per group besides the planner's.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub tune_top_k: usize,
    /// With --tune, the tuning cache (default: $DCIR_TUNE_CACHE, else ~/.cache/dcir/tune.json); `none` keeps it in memory.
    #[arg(long, value_name = "FILE")]
    pub tune_cache: Option<PathBuf>,
    /// With --tune, fuse with measured times: every merge the planner considers is compiled and timed, and kept only when the GPU says it pays (slower; shares the cache).
    #[arg(long, requires = "tune")]
    pub tune_fusion: bool,
    /// With --tune, write the report as JSON to FILE: every candidate's estimate and measured time, and the cost model's fit per group kind (docs/cost-model.md).
    #[arg(long, value_name = "FILE", requires = "tune")]
    pub tune_report: Option<PathBuf>,
}

/// Timed runs per tuning candidate (the median is kept).
const TUNE_REPS: usize = 20;

/// How `dcir-run` compiles a graph for the GPU.
pub(crate) struct CompileOptions<'a> {
    /// The cost model's device (`live`, or a preset).
    pub device: &'a str,
    /// The tuning flags.
    pub tune: &'a TuneArgs,
    /// Every op its own kernel.
    pub no_fuse: bool,
    /// No vendor library call.
    pub no_library: bool,
    /// The layouts the planner may choose from.
    pub layout: LayoutMode,
    /// The GPU's ordinal.
    pub gpu: usize,
}

/// The libraries a run on this machine may call, and a note naming those
/// missing (`--no-library` asks for none, silently).
pub(crate) fn run_libraries(no_library: bool) -> (Libraries, Option<String>) {
    if no_library {
        return (Libraries::NONE, None);
    }
    let found = Libraries {
        cublaslt: dcir_runtime::cublaslt_present(),
        cudnn: dcir_runtime::cudnn_present(),
        probe: None,
    };
    let mut missing = Vec::new();
    if !found.cublaslt {
        missing.push("cuBLASLt (libcublasLt.so)");
    }
    if !found.cudnn {
        missing.push("cuDNN (libcudnn.so.9)");
    }
    let note = (!missing.is_empty()).then(|| {
        format!(
            "note: {} not on the library path; the groups it would run use dcir's own kernels (README, \"Prerequisites\")",
            missing.join(" and ")
        )
    });
    (found, note)
}

/// The planner's [`LibraryProbe`] on a GPU: a call described as the
/// artifact records it ([`dcir_cuda::library`]) and prepared by the runtime.
struct DeviceProbe(dcir_runtime::LibraryProbe);

impl LibraryProbe for DeviceProbe {
    fn gemm(&self, _: &Graph, call: &dcir_fusion::GemmCall) -> Result<(), String> {
        let call = dcir_cuda::library::gemm_description(call, 0);
        self.0.check(&dcir_artifact::LibraryCall::Cublaslt(call))
    }

    fn conv(&self, _: &Graph, call: &dcir_fusion::library::ConvCall) -> Result<(), String> {
        let call = dcir_cuda::library::conv_description(call, 0);
        self.0.check(&dcir_artifact::LibraryCall::Cudnn(call))
    }
}

/// [`run_libraries`] with GPU `gpu`'s libraries asked about every call
/// before the planner offers it.
fn probed_libraries(no_library: bool, gpu: usize) -> (Libraries, Option<String>) {
    let (mut libraries, note) = run_libraries(no_library);
    if libraries.cublaslt || libraries.cudnn {
        libraries.probe = dcir_runtime::LibraryProbe::new(gpu)
            .ok()
            .map(|probe| Probe(std::sync::Arc::new(DeviceProbe(probe))));
    }
    (libraries, note)
}

/// Fuses `graph` (cleanup pipeline, then the planner with `device`'s cost
/// model, or with measured times under `--tune-fusion`; every op its own
/// kernel with `no_fuse`) unless it already has `fused` ops, tunes it under
/// `--tune`, and builds its artifact with NVRTC for GPU `gpu`'s architecture.
/// Groups may call the vendor libraries found on the machine unless
/// `no_library`.
pub(crate) fn compile(graph: &Graph, options: &CompileOptions<'_>) -> Result<Artifact, String> {
    let CompileOptions {
        device,
        tune,
        no_fuse,
        no_library,
        layout,
        gpu,
    } = *options;
    // The driver first: without a GPU nothing else matters.
    let info = dcir_runtime::query_device(gpu).map_err(|e| e.to_string())?;
    if let Some(reason) = dcir_cuda::nvrtc::unavailable_reason() {
        return Err(format!("the cuda backend compiles with NVRTC: {reason}"));
    }
    let arch = format!(
        "sm_{}{}",
        info.compute_capability.0, info.compute_capability.1
    );
    dcir_cuda::nvrtc::check_arch(&arch)?;
    let (libraries, note) = probed_libraries(no_library, gpu);
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let mut session = match tune.tune {
        true => Some(TuneSession::open(device, tune, gpu, libraries.clone())?),
        false => None,
    };
    let mut module = Module::new();
    module.graphs.push(graph.clone());
    let fused = graph
        .all_ops()
        .iter()
        .any(|&o| graph.op(o).kind == OpKind::Fused);
    if !fused {
        let registry = crate::default_registry();
        let passes = build_pipeline(&registry, dcir_passes::FUSION_PIPELINE)
            .map_err(|e| e.render(dcir_passes::FUSION_PIPELINE))?;
        PassManager::new(passes, Instrumentation::default())
            .run(&mut module, &mut std::io::sink())
            .map_err(|e| e.to_string())?;
        let g = &mut module.graphs[0];
        let name = g.name().to_string();
        let model = CostModel {
            libraries,
            ..CostModel::new(device_spec(device, gpu)?)
        };
        let (laid_out, plan, _) = plan_layout(g, layout, |g| match &mut session {
            Some(s) if s.fusion && !no_fuse => s.plan(g),
            _ => {
                let plan = if no_fuse { plan_unfused } else { plan_graph };
                plan(g, &model, &dcir_cuda::CudaTarget)
                    .map_err(|e| format!("cannot fuse @{name}: {e}"))
            }
        })?;
        *g = apply_plan(&laid_out, &plan).map_err(|e| format!("cannot fuse @{name}: {e}"))?;
        verify_module(&module)
            .map_err(|e| format!("the fused IR does not verify (a fusion bug): {e:?}"))?;
    }
    if let Some(s) = &mut session {
        let g = &mut module.graphs[0];
        *g = s.tune(g)?;
    }
    let options = dcir_cuda::BuildOptions {
        arch,
        compile: true,
    };
    dcir_cuda::build_artifact(&module.graphs[0], &options)
}

/// A tuning session on GPU 0: the measurer, the cache and the progress
/// display, for planning with measured times and for tuning.
pub(crate) struct TuneSession {
    measure: dcir_tune::GpuMeasure,
    cache: dcir_tune::Cache,
    path: Option<PathBuf>,
    options: dcir_tune::TuneOptions,
    /// Plan with measured times (`--tune-fusion`).
    pub fusion: bool,
    /// Where the report goes as JSON (`--tune-report`).
    report_path: Option<PathBuf>,
    display: Display,
}

impl TuneSession {
    /// Opens GPU `gpu` and the cache `tune` names, the candidates ranked by
    /// `device`'s cost model (`live`: that GPU, or a preset) and compiled
    /// for that GPU's architecture.
    pub(crate) fn open(
        device: &str,
        tune: &TuneArgs,
        gpu: usize,
        libraries: Libraries,
    ) -> Result<TuneSession, String> {
        let measure = dcir_tune::GpuMeasure::new(TUNE_REPS, gpu)?;
        let mut options = dcir_tune::TuneOptions::new(device_spec(device, gpu)?);
        options.libraries = libraries;
        options.top_k = tune.tune_top_k.max(1);
        let (major, minor) = measure.device().compute_capability;
        options.arch = format!("sm_{major}{minor}");
        let path = match &tune.tune_cache {
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) => Some(p.clone()),
            None => default_cache(),
        };
        let cache = match &path {
            Some(p) => {
                let (cache, note) = dcir_tune::Cache::open(p);
                if let Some(note) = note {
                    eprintln!("tune: {note}");
                }
                cache
            }
            None => dcir_tune::Cache::in_memory(),
        };
        Ok(TuneSession {
            measure,
            cache,
            path,
            options,
            fusion: tune.tune_fusion,
            report_path: tune.tune_report.clone(),
            display: Display::new(),
        })
    }

    /// The plan of `graph` with every group the planner considers measured.
    pub(crate) fn plan(&mut self, graph: &Graph) -> Result<dcir_fusion::Plan, String> {
        let started = std::time::Instant::now();
        self.display.stage(&format!("fusing @{}", graph.name()));
        let display = &self.display;
        let hear = |p: dcir_tune::Progress<'_>| display.hear(p);
        let estimator = dcir_tune::MeasuredEstimator::new(
            self.options.clone(),
            &mut self.measure,
            &mut self.cache,
            &hear,
        );
        let plan = plan_graph(graph, &estimator, &dcir_cuda::CudaTarget);
        let measured = estimator.measured();
        self.cache.save()?;
        let plan =
            plan.map_err(|e| format!("cannot fuse @{} with measured times: {e}", graph.name()))?;
        self.display.line(&format!(
            "tune: fused @{} with measured times: {} groups, {measured} candidates measured, {:.1} s",
            graph.name(),
            plan.groups.len(),
            started.elapsed().as_secs_f64()
        ));
        Ok(plan)
    }

    /// `graph` (fused) with every group's parameters measured; the report
    /// table on standard error.
    pub(crate) fn tune(&mut self, graph: &Graph) -> Result<Graph, String> {
        self.display.stage(&format!("tuning @{}", graph.name()));
        let groups = dcir_tune::group::fused_ops(graph).len();
        let done = std::sync::atomic::AtomicUsize::new(0);
        let (tuned, report) = dcir_tune::tune_graph(
            graph,
            &self.options,
            &mut self.measure,
            &mut self.cache,
            &|p| {
                if let dcir_tune::Progress::Tuned(g) = p {
                    let done = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    self.display.line(&format!(
                        "tune: [{done}/{groups}] @{} ({}): {} candidates, {} measured -> {}",
                        g.symbol,
                        g.kind,
                        g.candidates,
                        g.measured,
                        g.chosen
                            .as_ref()
                            .map_or("none matched".to_string(), |c| format!(
                                "{:.4} ms on {}",
                                c.ms,
                                c.library.as_deref().unwrap_or("dcir")
                            ))
                    ));
                }
                self.display.hear(p);
            },
        )?;
        self.cache.save()?;
        self.display.clear();
        eprint!("{}", report.table());
        if let Some(p) = &self.report_path {
            std::fs::write(p, report.to_json())
                .map_err(|e| format!("cannot write the tuning report {}: {e}", p.display()))?;
        }
        if let Some(p) = &self.path {
            eprintln!("tune: cache {} ({} entries)", p.display(), self.cache.len());
        }
        Ok(tuned)
    }
}

/// Tuning's progress bar on standard error (hidden when that is not a
/// terminal; the per-group lines are printed either way).
struct Display {
    bar: indicatif::ProgressBar,
}

impl Display {
    fn new() -> Display {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix} {msg:>9} {wide_bar} {pos}/{len} [{elapsed}]",
            )
            .expect("a valid template"),
        );
        Display { bar }
    }

    /// A new stage (`fusing @g`, `tuning @g`): the bar starts over.
    fn stage(&self, what: &str) {
        self.bar.reset();
        self.bar.set_prefix(what.to_string());
    }

    /// A line above the bar.
    fn line(&self, text: &str) {
        self.bar.suspend(|| eprintln!("{text}"));
    }

    /// Takes the bar off the screen.
    fn clear(&self) {
        self.bar.finish_and_clear();
    }

    fn hear(&self, p: dcir_tune::Progress<'_>) {
        use dcir_tune::Progress;
        match p {
            Progress::Compiling(n) | Progress::Measuring(n) => {
                let what = if matches!(p, Progress::Compiling(_)) {
                    "compiled"
                } else {
                    "measured"
                };
                self.bar.set_message(what);
                self.bar.set_length(n as u64);
                self.bar.set_position(0);
            }
            Progress::Compiled | Progress::Measured => self.bar.inc(1),
            Progress::Tuned(_) => {}
        }
    }
}

/// `$DCIR_TUNE_CACHE`, else `~/.cache/dcir/tune.json`, else none.
fn default_cache() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DCIR_TUNE_CACHE") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dcir/tune.json"))
}

/// The cost model's device: `live` reads GPU 0 (`DeviceSpec::from_live`),
/// anything else names a preset.
fn device_spec(device: &str, gpu: usize) -> Result<DeviceSpec, String> {
    if device == "live" {
        let d = dcir_runtime::query_device(gpu).map_err(|e| e.to_string())?;
        let live = LiveDevice {
            name: d.name.clone(),
            compute_capability: (d.compute_capability.0 * 10 + d.compute_capability.1) as u32,
            sm_count: d.sm_count,
            max_threads_per_block: d.max_threads_per_block,
            max_threads_per_sm: d.max_threads_per_sm,
            max_blocks_per_sm: d.max_blocks_per_sm,
            shared_per_block: d.max_shared_per_block as u32,
            shared_per_sm: d.shared_per_sm as u32,
            registers_per_sm: d.registers_per_sm,
            l2_bytes: d.l2_bytes,
            clock_hz: d.clock_hz,
            theoretical_bandwidth: d.theoretical_bandwidth,
        };
        return DeviceSpec::from_live(&live).ok_or_else(|| {
            format!(
                "{} (compute capability {}.{}) has no cost-model preset of its architecture; pass --device with one of {}",
                d.name,
                d.compute_capability.0,
                d.compute_capability.1,
                DeviceSpec::PRESETS.join(", ")
            )
        });
    }
    DeviceSpec::preset(device).ok_or_else(|| {
        format!(
            "unknown device `{device}` (live or a preset: {})",
            DeviceSpec::PRESETS.join(", ")
        )
    })
}

/// Reads a prebuilt artifact directory and checks it against `graph`'s signature.
pub(crate) fn load(dir: &Path, graph: &Graph) -> Result<Artifact, String> {
    let artifact = Artifact::read_dir(dir).map_err(|e| e.to_string())?;
    let types = |ids: &[u32]| -> Vec<(String, Vec<u64>)> {
        ids.iter()
            .map(|&i| {
                let b = &artifact.buffers[i as usize];
                (b.dtype.clone(), b.shape.clone())
            })
            .collect()
    };
    let graph_types = |vs: &[dcir_ir::ValueId]| -> Vec<(String, Vec<u64>)> {
        vs.iter()
            .map(|&v| {
                let t = graph.ty(v);
                let dims = t.dims().iter().map(|&d| d as u64).collect();
                (t.dtype.name().to_string(), dims)
            })
            .collect()
    };
    let outputs = graph.outputs().unwrap_or_default();
    if types(&artifact.inputs) != graph_types(graph.params())
        || types(&artifact.outputs) != graph_types(outputs)
    {
        return Err(format!(
            "the artifact in `{}` (graph @{}) does not match the signature of @{}",
            dir.display(),
            artifact.graph,
            graph.name()
        ));
    }
    Ok(artifact)
}

/// Runs `artifact` on GPU 0 with `inputs`: uploads them, poisons the outputs,
/// runs launch by launch (naming a failing kernel), reads the outputs back;
/// with `bench = Some((reps, per_kernel))`, then times `reps` CUDA-graph
/// replays (and each launch).
pub(crate) fn execute(
    artifact: &Artifact,
    graph: &Graph,
    inputs: &[Tensor],
    bench: Option<(usize, bool)>,
    budget: Option<u64>,
    gpu: usize,
) -> Result<CudaRun, ExecuteError> {
    // Checked before the driver is touched: a budget the plan exceeds is
    // an error with or without a GPU (the device's free memory is checked
    // by the executor).
    let planned = dcir_runtime::plan_memory(artifact).peak_bytes();
    if let Some(budget) = budget
        && planned > budget
    {
        return Err(ExecuteError::Other(format!(
            "@{} needs {} of device memory (the intermediates' arena, inputs, outputs and constants), more than the budget of {} (--memory-budget)",
            graph.name(),
            human_bytes(u128::from(planned)),
            human_bytes(u128::from(budget))
        )));
    }
    let mut ex = Executor::new(artifact, gpu).map_err(|e| match e {
        dcir_runtime::RuntimeError::Library { .. } => ExecuteError::Library(e.to_string()),
        e => ExecuteError::Other(e.to_string()),
    })?;
    let tensors = dcir_tune::measure::run_outputs(&mut ex, graph, inputs)?;
    let bench = match bench {
        None => None,
        Some((reps, per_kernel)) => {
            let per_launch = if per_kernel {
                // Each launch named with what it computes.
                let times = ex.per_launch(reps).map_err(|e| e.to_string())?;
                let named = times
                    .into_iter()
                    .zip(&artifact.launches)
                    .map(|((name, ms), l)| {
                        let summary = &artifact.kernels[l.kernel as usize].summary;
                        match summary.is_empty() {
                            true => (name, ms),
                            false => (format!("{name}  {summary}"), ms),
                        }
                    });
                Some(named.collect())
            } else {
                None
            };
            ex.capture_graph().map_err(|e| e.to_string())?;
            let timing = ex.bench(10, reps).map_err(|e| e.to_string())?;
            Some(Bench {
                reps,
                timing,
                per_launch,
            })
        }
    };
    let plan = ex.memory_plan();
    Ok(CudaRun {
        outputs: tensors,
        device: ex.device().name.clone(),
        memory: (plan.peak_bytes(), plan.unplanned_bytes()),
        launches: artifact.launches.len(),
        bench,
        chosen: ex.chosen_calls().to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--no-library` asks for none; otherwise the libraries the machine has,
    /// with one note naming those missing (CI's machine has none).
    #[test]
    fn libraries_follow_the_machine_and_the_flag() {
        assert_eq!(run_libraries(true), (Libraries::NONE, None));
        let (libraries, note) = run_libraries(false);
        assert_eq!(libraries.cublaslt, dcir_runtime::cublaslt_present());
        assert_eq!(libraries.cudnn, dcir_runtime::cudnn_present());
        match note {
            None => assert_eq!(libraries, Libraries::ALL),
            Some(note) => {
                assert!(note.contains("not on the library path"), "{note}");
                assert_eq!(note.contains("cuBLASLt"), !libraries.cublaslt, "{note}");
                assert_eq!(note.contains("cuDNN"), !libraries.cudnn, "{note}");
            }
        }
    }
}
