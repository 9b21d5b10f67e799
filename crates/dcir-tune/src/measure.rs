//! Running one candidate kernel: checked against the interpreter, then timed.

use dcir_artifact::Artifact;
use dcir_interp::{Tensor, Tolerance, compare, io};
use dcir_ir::Graph;
use dcir_runtime::{DeviceInfo, Executor};

use crate::cache::Fingerprint;

/// Timing launches before the measured ones.
const WARMUP: usize = 3;

/// Where candidates run and how they are timed.
pub trait Measure {
    /// What measurements depend on besides the kernel (cache keys).
    fn fingerprint(&self) -> Fingerprint;

    /// Runs `artifact` (compiled from `group`, a standalone one-group
    /// graph) on `inputs` and compares its outputs with `expected`; on a
    /// match, times it and returns the median milliseconds.
    fn measure(
        &mut self,
        group: &Graph,
        artifact: &Artifact,
        inputs: &[Tensor],
        expected: &[Tensor],
    ) -> Result<f64, String>;

    /// Runs `artifact` (compiled from the whole graph `graph`) on `inputs`
    /// the way a forward pass runs in an application: CUDA-graph replays
    /// back to back, caches as the previous pass left them. The median
    /// milliseconds.
    fn time_graph(
        &mut self,
        graph: &Graph,
        artifact: &Artifact,
        inputs: &[Tensor],
    ) -> Result<f64, String>;
}

/// Candidates on one GPU through dcir-runtime: outputs poisoned before the
/// checked run, then `reps` timed replays of the candidate captured as a
/// CUDA graph, each after an L2 flush, so a group reads its operands from
/// device memory and pays its launches as it does inside a model's graph
/// (a library call launched by the host one at a time ran up to 7× its
/// replayed time: cuDNN's fused convolution 137 µs against ~20 in the
/// graph; an H100, 2026-12-07).
pub struct GpuMeasure {
    device: DeviceInfo,
    ordinal: usize,
    reps: usize,
}

impl GpuMeasure {
    /// Opens GPU `ordinal` (among the visible ones); `reps` timed runs per
    /// candidate (the median is kept).
    pub fn new(reps: usize, ordinal: usize) -> Result<GpuMeasure, String> {
        let device = dcir_runtime::query_device(ordinal).map_err(|e| e.to_string())?;
        Ok(GpuMeasure {
            device,
            ordinal,
            reps: reps.max(1),
        })
    }

    /// The device measured on.
    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }
}

/// How a candidate is timed, part of its cache key: entries timed another
/// way are not reused.
const TIMING: &str = "cold graph replays";

impl Measure for GpuMeasure {
    fn fingerprint(&self) -> Fingerprint {
        let (cc_major, cc_minor) = self.device.compute_capability;
        let nvrtc = dcir_cuda::nvrtc::version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|| "none".into());
        // A library call's time is the library's: their versions key the entry.
        let version = |v: Option<usize>| v.map_or_else(|| "none".into(), |v| v.to_string());
        let (cublaslt, cudnn) = (
            version(dcir_runtime::cublaslt_version()),
            version(dcir_runtime::cudnn_version()),
        );
        Fingerprint {
            device: format!("{} ({cc_major}.{cc_minor})", self.device.name),
            toolchain: format!(
                "driver {}, nvrtc {nvrtc}, cublaslt {cublaslt}, cudnn {cudnn}, {TIMING}",
                self.device.driver_version
            ),
        }
    }

    fn measure(
        &mut self,
        group: &Graph,
        artifact: &Artifact,
        inputs: &[Tensor],
        expected: &[Tensor],
    ) -> Result<f64, String> {
        let mut ex = Executor::new(artifact, self.ordinal).map_err(|e| e.to_string())?;
        let outputs = run_outputs(&mut ex, group, inputs)?;
        for (i, (want, got)) in expected.iter().zip(&outputs).enumerate() {
            let tolerance = Tolerance::for_output_of(group, want.dtype());
            compare(want, got, &tolerance)
                .map_err(|m| format!("output {i} does not match the interpreter: {m}"))?;
        }
        ex.capture_graph().map_err(|e| e.to_string())?;
        let flush = 2 * self.device.l2_bytes as usize;
        let timing = ex
            .bench_cold(WARMUP, self.reps, flush)
            .map_err(|e| e.to_string())?;
        Ok(timing.median_ms)
    }

    fn time_graph(
        &mut self,
        graph: &Graph,
        artifact: &Artifact,
        inputs: &[Tensor],
    ) -> Result<f64, String> {
        let mut ex = Executor::new(artifact, self.ordinal).map_err(|e| e.to_string())?;
        run_outputs(&mut ex, graph, inputs)?;
        ex.capture_graph().map_err(|e| e.to_string())?;
        let timing = ex.bench(WARMUP, self.reps).map_err(|e| e.to_string())?;
        Ok(timing.median_ms)
    }
}

/// One checked run of `ex` (loaded from `graph`'s artifact) on `inputs`,
/// outputs poisoned first: the outputs, as tensors of `graph`'s result types.
pub fn run_outputs(
    ex: &mut Executor,
    graph: &Graph,
    inputs: &[Tensor],
) -> Result<Vec<Tensor>, String> {
    let bytes: Vec<Vec<u8>> = inputs.iter().map(io::tensor_bytes).collect();
    let results = ex.run_once(&bytes).map_err(|e| e.to_string())?;
    graph
        .outputs()
        .unwrap_or_default()
        .iter()
        .zip(results)
        .map(|(&v, b)| io::tensor_from_bytes(graph.ty(v).clone(), &b).map_err(|e| e.to_string()))
        .collect()
}
