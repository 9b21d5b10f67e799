//! `dcir-run --backend cuda`: compile a graph to an artifact (or load one),
//! run it with dcir-runtime, check it against the interpreter, time it.

use std::path::Path;

use dcir_artifact::Artifact;
use dcir_fusion::{CostModel, DeviceSpec, LiveDevice, apply_plan, plan_graph};
use dcir_interp::{Tensor, io};
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
}

/// Fuses `graph` (cleanup pipeline, then the planner with `device`'s cost
/// model) unless it already has `fused` ops, and builds its artifact with NVRTC.
pub(crate) fn compile(graph: &Graph, device: &str) -> Result<Artifact, String> {
    if let Some(reason) = dcir_cuda::nvrtc::unavailable_reason() {
        return Err(format!("the cuda backend compiles with NVRTC: {reason}"));
    }
    let mut module = Module::new();
    module.graphs.push(graph.clone());
    let fused = graph
        .all_ops()
        .iter()
        .any(|&o| graph.op(o).kind == OpKind::Fused);
    if !fused {
        let registry = crate::default_registry();
        let passes = build_pipeline(&registry, "canonicalize,cse,dce")
            .map_err(|e| e.render("canonicalize,cse,dce"))?;
        PassManager::new(passes, Instrumentation::default())
            .run(&mut module, &mut std::io::sink())
            .map_err(|e| e.to_string())?;
        let spec = device_spec(device)?;
        let model = CostModel::new(spec);
        let g = &mut module.graphs[0];
        let plan = plan_graph(g, &model).map_err(|e| format!("cannot fuse @{}: {e}", g.name()))?;
        *g = apply_plan(g, &plan).map_err(|e| format!("cannot fuse @{}: {e}", g.name()))?;
        verify_module(&module)
            .map_err(|e| format!("the fused IR does not verify (a fusion bug): {e:?}"))?;
    }
    dcir_cuda::build_artifact(&module.graphs[0], &dcir_cuda::BuildOptions::default())
}

/// The cost model's device: `live` reads GPU 0 (`DeviceSpec::from_live`),
/// anything else names a preset.
fn device_spec(device: &str) -> Result<DeviceSpec, String> {
    if device == "live" {
        let d = dcir_runtime::query_device(0).map_err(|e| e.to_string())?;
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
) -> Result<CudaRun, String> {
    let mut ex = Executor::new(artifact, 0).map_err(|e| e.to_string())?;
    for (i, t) in inputs.iter().enumerate() {
        ex.set_input(i, &io::tensor_bytes(t))
            .map_err(|e| e.to_string())?;
    }
    ex.poison().map_err(|e| e.to_string())?;
    ex.run_checked().map_err(|e| e.to_string())?;
    let outputs = graph.outputs().unwrap_or_default();
    let mut tensors = Vec::with_capacity(outputs.len());
    for (i, &v) in outputs.iter().enumerate() {
        let bytes = ex.read_output(i).map_err(|e| e.to_string())?;
        tensors
            .push(io::tensor_from_bytes(graph.ty(v).clone(), &bytes).map_err(|e| e.to_string())?);
    }
    let bench = match bench {
        None => None,
        Some((reps, per_kernel)) => {
            let per_launch = if per_kernel {
                Some(ex.per_launch(reps).map_err(|e| e.to_string())?)
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
    })
}
