//! The tuning loop with a stand-in for the GPU: candidates compiled with
//! NVRTC, "measured" by a deterministic function of their launch shape.

use dcir_artifact::Artifact;
use dcir_fusion::DeviceSpec;
use dcir_interp::Tensor;
use dcir_ir::Graph;
use std::sync::atomic::{AtomicUsize, Ordering};

use dcir_fusion::{CostModel, apply_plan, plan_graph};
use dcir_tune::{
    Cache, Fingerprint, Measure, MeasuredEstimator, Progress, TuneOptions, group, tune_graph,
};

/// The fingerprint of the stand-ins for the GPU.
fn stand_in() -> Fingerprint {
    Fingerprint {
        device: "fake (9.0)".into(),
        toolchain: "none".into(),
    }
}

/// True (after printing `SKIP`) when NVRTC is missing: candidates are
/// compiled. A failure instead under `DCIR_REQUIRE_NVRTC` (CI).
fn nvrtc_missing() -> bool {
    let Some(reason) = dcir_cuda::nvrtc::unavailable_reason() else {
        return false;
    };
    assert!(std::env::var("DCIR_REQUIRE_NVRTC").is_err(), "{reason}");
    println!("SKIP: {reason}");
    true
}

/// Times a candidate as grid + block / 100 (ms); the first candidate of
/// each group (the model's best) "does not match".
struct Fake {
    runs: usize,
    groups_seen: Vec<String>,
}

impl Measure for Fake {
    fn fingerprint(&self) -> Fingerprint {
        stand_in()
    }

    fn measure(
        &mut self,
        g: &Graph,
        a: &Artifact,
        inputs: &[Tensor],
        expected: &[Tensor],
    ) -> Result<f64, String> {
        self.runs += 1;
        assert!(!inputs.is_empty() && !expected.is_empty());
        // The header: every candidate of a group has the same.
        let header = dcir_ir::print_graph(g)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        if !self.groups_seen.contains(&header) {
            self.groups_seen.push(header);
            return Err("output 0 does not match the interpreter".into());
        }
        let k = &a.kernels[0];
        Ok(k.grid[0] as f64 + k.block[0] as f64 / 100.0)
    }

    /// Every whole graph alike: the tuned one is kept.
    fn time_graph(&mut self, _: &Graph, _: &Artifact, inputs: &[Tensor]) -> Result<f64, String> {
        assert!(!inputs.is_empty());
        Ok(1.0)
    }
}

const GRAPH: &str = "graph @g(%x: f32[64,256], %w: f32[256,128], %b: f32[128]) -> (f32[64,128]) {
  %m = matmul %x, %w : f32[64,128]
  %bb = broadcast %b {dims = [1]} : f32[64,128]
  %s = add %m, %bb : f32[64,128]
  %y = relu %s : f32[64,128]
  %n = layernorm %y, %b, %b {axis = 1} : f32[64,128]
  return %n
}
";

/// Two layers alike: the second one's candidates are the first one's.
const TWIN_LAYERS: &str = "graph @g(%x: f32[64,256], %z: f32[64,256], %w: f32[256,128], %v: f32[256,128]) -> (f32[64,128], f32[64,128]) {
  %m = matmul %x, %w : f32[64,128]
  %y = relu %m : f32[64,128]
  %n = matmul %z, %v : f32[64,128]
  %u = relu %n : f32[64,128]
  return %y, %u
}
";

fn planned(text: &str) -> Graph {
    let g = dcir_reader::parse_module(text)
        .expect("parses")
        .graphs
        .remove(0);
    let model = dcir_fusion::CostModel::new(DeviceSpec::preset("h200").expect("preset"));
    let plan = dcir_fusion::plan_graph(&g, &model, &dcir_cuda::CudaTarget).expect("plans");
    dcir_fusion::apply_plan(&g, &plan).expect("applies")
}

#[test]
fn the_fastest_matching_candidate_wins_and_a_warm_cache_measures_nothing() {
    if nvrtc_missing() {
        return;
    }
    let graph = planned(GRAPH);
    let options = TuneOptions::new(DeviceSpec::preset("h200").expect("preset"));
    let mut fake = Fake {
        runs: 0,
        groups_seen: Vec::new(),
    };
    let mut cache = Cache::in_memory();
    let heard = AtomicUsize::new(0);
    let count = |p: Progress<'_>| {
        if let Progress::Tuned(_) = p {
            heard.fetch_add(1, Ordering::Relaxed);
        }
    };
    let (tuned, report) =
        tune_graph(&graph, &options, &mut fake, &mut cache, &count).expect("tunes");
    assert_eq!(heard.into_inner(), report.groups.len());
    assert_eq!(report.groups.len(), group::fused_ops(&graph).len());
    assert_eq!(fake.runs, report.measured());
    for (g, op) in report.groups.iter().zip(group::fused_ops(&tuned)) {
        assert!(g.candidates >= 2 && g.measured == g.candidates, "{g:?}");
        let chosen = g
            .chosen
            .as_ref()
            .unwrap_or_else(|| panic!("no candidate matched: {g:?}"));
        // The model's best "failed": reported, not chosen.
        assert_eq!(g.failures.len(), 1, "{g:?}");
        assert!(
            !g.failures[0].starts_with(&format!("{}:", chosen.params)),
            "{g:?}"
        );
        assert_eq!(group::describe_params(&tuned, op), chosen.params);
    }
    // A second run takes every measurement from the cache.
    let runs = fake.runs;
    let (again, report) =
        tune_graph(&graph, &options, &mut fake, &mut cache, &|_| {}).expect("tunes");
    assert_eq!((fake.runs, report.measured()), (runs, 0));
    assert_eq!(dcir_ir::print_graph(&again), dcir_ir::print_graph(&tuned));
    assert!(report.table().contains("| @g0 |"), "{}", report.table());
}

#[test]
fn a_repeated_layer_is_measured_once() {
    if nvrtc_missing() {
        return;
    }
    let graph = planned(TWIN_LAYERS);
    let options = TuneOptions::new(DeviceSpec::preset("h200").expect("preset"));
    let mut fake = Fake {
        runs: 0,
        groups_seen: Vec::new(),
    };
    let mut cache = Cache::in_memory();
    let (tuned, report) =
        tune_graph(&graph, &options, &mut fake, &mut cache, &|_| {}).expect("tunes");
    let [first, second] = report.groups.as_slice() else {
        panic!("two groups: {report:?}");
    };
    assert!(
        first.measured == first.candidates && first.measured >= 2,
        "{first:?}"
    );
    assert_eq!((second.measured, second.candidates), (0, first.candidates));
    assert_eq!(fake.runs, first.candidates);
    assert_eq!(second.chosen, first.chosen);
    let ops = group::fused_ops(&tuned);
    assert_eq!(
        group::describe_params(&tuned, ops[0]),
        group::describe_params(&tuned, ops[1])
    );
}

/// Times a candidate by how many ops its group has: `per_op(n)` ms.
struct ByOps {
    per_op: fn(usize) -> f64,
    runs: usize,
}

impl Measure for ByOps {
    fn fingerprint(&self) -> Fingerprint {
        stand_in()
    }

    fn measure(
        &mut self,
        g: &Graph,
        _: &Artifact,
        _: &[Tensor],
        _: &[Tensor],
    ) -> Result<f64, String> {
        self.runs += 1;
        let op = group::fused_ops(g)[0];
        let region = g.op(op).region.expect("a region");
        Ok((self.per_op)(g.block(region).ops.len() - 1))
    }

    fn time_graph(&mut self, _: &Graph, _: &Artifact, _: &[Tensor]) -> Result<f64, String> {
        Ok(1.0)
    }
}

/// The groups of `plan` as their ops' count each.
fn sizes(plan: &dcir_fusion::Plan) -> Vec<usize> {
    plan.groups.iter().map(|g| g.group.ops.len()).collect()
}

#[test]
fn measured_times_decide_the_merges() {
    if nvrtc_missing() {
        return;
    }
    let g = dcir_reader::parse_module(GRAPH)
        .expect("parses")
        .graphs
        .remove(0);
    let device = DeviceSpec::preset("h200").expect("preset");
    let mut options = TuneOptions::new(device.clone());
    options.top_k = 2;
    let modelled = plan_graph(&g, &CostModel::new(device), &dcir_cuda::CudaTarget).expect("plans");
    assert!(
        sizes(&modelled).iter().any(|&n| n > 1),
        "{:?}",
        sizes(&modelled)
    );

    // A GPU on which a kernel of several ops is slower than its ops apart:
    // nothing merges.
    let mut apart = ByOps {
        per_op: |n| if n == 1 { 0.01 } else { 1.0 },
        runs: 0,
    };
    let mut cache = Cache::in_memory();
    let estimator = MeasuredEstimator::new(options.clone(), &mut apart, &mut cache, &|_| {});
    let plan = plan_graph(&g, &estimator, &dcir_cuda::CudaTarget).expect("plans");
    assert!(sizes(&plan).iter().all(|&n| n == 1), "{:?}", sizes(&plan));
    assert!(estimator.measured() > 0);

    // One on which every kernel costs the same, so each merge saves one:
    // as few groups as legality allows (two: the layernorm reduces what
    // the GEMM's epilogue computes), and the tuning after finds every
    // candidate measured.
    let mut merged = ByOps {
        per_op: |_| 0.01,
        runs: 0,
    };
    let mut cache = Cache::in_memory();
    let estimator = MeasuredEstimator::new(options.clone(), &mut merged, &mut cache, &|_| {});
    let plan = plan_graph(&g, &estimator, &dcir_cuda::CudaTarget).expect("plans");
    let measured = estimator.measured();
    assert_eq!(plan.groups.len(), 2, "{:?}", sizes(&plan));
    assert!(
        plan.groups
            .iter()
            .all(|p| (p.estimate.time - 1e-5).abs() < 1e-12)
    );
    assert_eq!(merged.runs, measured);
    let fused = apply_plan(&g, &plan).expect("applies");
    let (_, report) =
        tune_graph(&fused, &options, &mut merged, &mut cache, &|_| {}).expect("tunes");
    assert_eq!(report.measured(), 0, "{}", report.table());
    assert_eq!(merged.runs, measured);
}

/// Times cuBLASLt's algorithm of rank 3 fastest (1 ms, the others 1 ms and
/// a tenth per rank away from it) and every kernel of ours at 5 ms; a whole
/// graph as its one kernel, or at `rank3_whole_ms` when that is rank 3.
struct PrefersRank3 {
    rank3_whole_ms: f64,
}

/// The time of `a`'s first kernel as [`PrefersRank3`] measures a group.
fn rank3_fastest(a: &Artifact) -> f64 {
    match &a.kernels[0].library {
        Some(dcir_artifact::LibraryCall::Cublaslt(call)) => {
            1.0 + (f64::from(call.heuristic_rank) - 3.0).abs() / 10.0
        }
        _ => 5.0,
    }
}

impl Measure for PrefersRank3 {
    fn fingerprint(&self) -> Fingerprint {
        stand_in()
    }

    fn measure(
        &mut self,
        _: &Graph,
        a: &Artifact,
        _: &[Tensor],
        _: &[Tensor],
    ) -> Result<f64, String> {
        Ok(rank3_fastest(a))
    }

    fn time_graph(&mut self, _: &Graph, a: &Artifact, _: &[Tensor]) -> Result<f64, String> {
        Ok(match rank3_fastest(a) {
            1.0 => self.rank3_whole_ms,
            ms => ms,
        })
    }
}

const ONE_MATMUL: &str = "graph @g(%x: f16[512,768], %w: f16[768,768]) -> (f16[512,768]) {
  %m = matmul %x, %w : f16[512,768]
  return %m
}
";

/// [`ONE_MATMUL`] planned, and tuned on [`PrefersRank3`] with the whole
/// graph at `rank3_whole_ms` when its call is rank 3.
fn tune_one_matmul(rank3_whole_ms: f64) -> (Graph, Graph, dcir_tune::TuneReport) {
    let graph = planned(ONE_MATMUL);
    let options = TuneOptions::new(DeviceSpec::preset("h200").expect("preset"));
    let mut cache = Cache::in_memory();
    let mut measure = PrefersRank3 { rank3_whole_ms };
    let (tuned, report) =
        tune_graph(&graph, &options, &mut measure, &mut cache, &|_| {}).expect("tunes");
    (graph, tuned, report)
}

#[test]
fn a_library_call_is_measured_with_each_of_its_heuristics_first_algorithms() {
    if nvrtc_missing() {
        return;
    }
    let (_, tuned, report) = tune_one_matmul(1.0);
    let [g] = report.groups.as_slice() else {
        panic!("one group: {report:?}");
    };
    let ranks = dcir_tune::library_ranks(dcir_fusion::library::CUBLASLT);
    assert!(g.candidates as i64 > ranks, "{g:?}");
    let chosen = g.chosen.as_ref().expect("a candidate matched");
    assert_eq!(
        chosen.params, "heuristic_rank = 3, library = \"cublaslt\"",
        "{g:?}"
    );
    // The report counts it among the groups on a library.
    assert_eq!(chosen.library.as_deref(), Some("cublaslt"));
    assert_eq!(report.library_share(), (0, 1));
    assert!(
        report
            .table()
            .contains("GEMM and convolution groups: 0 on dcir's kernels, 1 on a library"),
        "{}",
        report.table()
    );
    // The rank reaches the artifact, for the runtime to ask the heuristic for.
    let op = group::fused_ops(&tuned)[0];
    assert_eq!(dcir_cuda::library::heuristic_rank(&tuned, op), 3);
    let artifact =
        dcir_cuda::build_artifact(&tuned, &dcir_cuda::BuildOptions::default()).expect("builds");
    match &artifact.kernels[0].library {
        Some(dcir_artifact::LibraryCall::Cublaslt(call)) => assert_eq!(call.heuristic_rank, 3),
        other => panic!("a cuBLASLt call: {other:?}"),
    }
    // The whole graph ran faster tuned (rank 0 as planned: 1.3 ms).
    let whole = report.whole_graph.as_ref().expect("compared");
    assert!(
        whole.kept_tuned && whole.tuned_ms == 1.0 && (whole.planned_ms - 1.3).abs() < 1e-12,
        "{whole:?}"
    );
}

/// Each group is measured alone, with a cold cache; the forward pass runs
/// them back to back. A choice faster alone that makes the whole graph
/// slower is undone: tuning never returns a slower graph than planned.
#[test]
fn a_tuned_graph_slower_as_a_whole_keeps_the_planned_parameters() {
    if nvrtc_missing() {
        return;
    }
    let (graph, tuned, report) = tune_one_matmul(2.0);
    let chosen = report.groups[0]
        .chosen
        .as_ref()
        .expect("a candidate matched");
    assert!(chosen.params.contains("heuristic_rank = 3"), "{chosen:?}");
    assert_eq!(dcir_ir::print_graph(&tuned), dcir_ir::print_graph(&graph));
    let whole = report.whole_graph.as_ref().expect("compared");
    assert!(!whole.kept_tuned && whole.tuned_ms == 2.0, "{whole:?}");
    let table = report.table();
    assert!(
        table.contains("1.3000 ms as planned, 2.0000 ms tuned: the planner's parameters kept"),
        "{table}"
    );
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).expect("JSON");
    assert_eq!(json["report"]["whole_graph"]["kept_tuned"], false);
}
