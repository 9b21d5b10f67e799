//! The tuner: DeepCuts' code selector over a fused graph.
//!
//! For every `fused` group of a planned graph, the cost model ranks the
//! group's parameter space by PUL (then estimated time) and the best
//! `top_k` parameter sets, plus the planner's own choice, become candidates.
//! Each candidate is the group as a graph of its own ([`group::standalone`])
//! with those parameters; the uncached ones are compiled with NVRTC in
//! parallel ([`dcir_cuda::build_artifact`]) and run by a [`Measure`]: on
//! seeded random inputs, outputs poisoned, compared with the interpreter's
//! result for the group, then timed (median of several runs, L2 flushed
//! before each). The fastest candidate that matched becomes the group's
//! parameters. Every measurement (or failure) goes into the [`Cache`], keyed
//! by the candidate's text, the device and the toolchain, so a second run
//! measures nothing, and a group that repeats another (a model's repeated
//! layers print alike) is measured once.
//!
//! [`MeasuredEstimator`] puts the same measurements under the planner, so
//! merges follow the GPU's times rather than the model's. A cuBLASLt call
//! is one more candidate of the groups it can run (`TuneOptions::libraries`).

pub mod cache;
pub mod group;
pub mod measure;
mod measured;
mod report;

use std::collections::HashSet;
use std::time::Instant;

use rayon::prelude::*;

use dcir_artifact::Artifact;
use dcir_cuda::BuildOptions;
use dcir_fusion::{CostModel, DeviceSpec, Estimator, KernelParams, Libraries};
use dcir_interp::{random_inputs, run_graph};
use dcir_ir::{Attr, Attrs, Graph, OpId, print_graph};

pub use cache::{Cache, Entry, Fingerprint};
pub use measure::{GpuMeasure, Measure};
pub use measured::MeasuredEstimator;
pub use report::{GroupReport, TuneReport, WholeGraph};

/// How to tune.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// The cost model's device: it ranks the candidates.
    pub device: DeviceSpec,
    /// Candidates per group from the cost model (the planner's choice is
    /// measured too when it is not among them).
    pub top_k: usize,
    /// Seed of the random inputs.
    pub seed: u64,
    /// NVRTC's target architecture.
    pub arch: String,
    /// The vendor libraries a group may call (measured beside our kernels).
    pub libraries: Libraries,
}

impl TuneOptions {
    /// 8 candidates a group on `device`, seed 0, `sm_90`.
    pub fn new(device: DeviceSpec) -> TuneOptions {
        TuneOptions {
            device,
            top_k: 8,
            seed: 0,
            arch: dcir_cuda::nvrtc::DEFAULT_ARCH.to_string(),
            libraries: Libraries::ALL,
        }
    }
}

/// How many of a library heuristic's algorithms the tuner measures for a
/// call (`heuristic_rank` 0 to this less one): cuBLASLt ranks many tiles
/// and split-k configurations, cuDNN a handful of algorithms.
pub fn library_ranks(library: &str) -> i64 {
    match library {
        dcir_fusion::library::CUBLASLT => 8,
        _ => 4,
    }
}

/// Ranked parameter sets the model is asked for per candidate kept.
const RANKED_PER_CANDIDATE: usize = 8;

/// The first `k` of `ranked` whose block shapes differ (the parameters but
/// `stages`, and `tile`'s k extent): the model's best few pipelines of one
/// tile tell a measurement less than a few tiles do. Fills up with the
/// remaining ranked sets when there are fewer shapes than `k`.
fn diverse(ranked: &[KernelParams], k: usize) -> Vec<&KernelParams> {
    let shape = |p: &KernelParams| {
        p.0.iter()
            .filter(|(n, _)| *n != "stages")
            .map(|(n, a)| match (*n, a) {
                ("tile", dcir_ir::Attr::Ints(t)) if t.len() == 3 => format!("tile={:?}", &t[..2]),
                _ => format!("{n}={a:?}"),
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut shapes = Vec::new();
    let mut picked: Vec<&KernelParams> = Vec::new();
    for p in ranked {
        let s = shape(p);
        if !shapes.contains(&s) && picked.len() < k {
            shapes.push(s);
            picked.push(p);
        }
    }
    for p in ranked {
        if picked.len() >= k {
            break;
        }
        if !picked.contains(&p) {
            picked.push(p);
        }
    }
    picked
}

/// What tuning reports as it goes, for a progress display.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    /// This many candidates are being compiled, in parallel.
    Compiling(usize),
    /// One of them is compiled.
    Compiled,
    /// This many compiled candidates are to be measured, one by one.
    Measuring(usize),
    /// One of them is measured (or failed).
    Measured,
    /// A group of the graph is tuned: its report.
    Tuned(&'a GroupReport),
}

/// Hears [`Progress`], from any thread.
pub type ProgressFn<'a> = &'a (dyn Fn(Progress<'_>) + Sync);

/// One candidate of a group: its parameters, the standalone graph with
/// them, its cache key and the model's estimate.
struct Candidate {
    params: String,
    /// The parameter set, `None` for those the standalone graph came with.
    kernel: Option<KernelParams>,
    graph: Graph,
    key: String,
    estimate_ms: f64,
}

/// The candidates of one group, and the group alone with the planner's
/// parameters (whose interpreter run is the reference).
struct CandidateSet {
    standalone: Graph,
    candidates: Vec<Candidate>,
}

impl CandidateSet {
    /// The model's best `top_k` distinct shapes among `ranked`, then the
    /// parameters `standalone` has; `estimate_ms` gives the model's time of
    /// a parameter set, `None` the planner's own.
    fn new(
        standalone: Graph,
        ranked: &[KernelParams],
        top_k: usize,
        fingerprint: &Fingerprint,
        estimate_ms: &dyn Fn(Option<&KernelParams>) -> f64,
    ) -> Result<CandidateSet, String> {
        let mut candidates: Vec<Candidate> = Vec::new();
        let picks = diverse(ranked, top_k);
        // A library call is measured with each of its heuristic's first
        // algorithms, at the estimate of the call (the model has one).
        let mut sets: Vec<(Option<KernelParams>, Option<&KernelParams>)> = Vec::new();
        for p in picks {
            sets.push((Some(p.clone()), Some(p)));
            let library = p.get("library").and_then(Attr::as_str);
            for rank in 1..library.map_or(0, library_ranks) {
                let mut ranked = p.clone();
                ranked.0.push(("heuristic_rank", Attr::Int(rank)));
                sets.push((Some(ranked), Some(p)));
            }
        }
        sets.push((None, None));
        for (params, priced) in sets {
            let mut g = standalone.clone();
            let inner = group::fused_ops(&g)[0];
            if let Some(p) = &params {
                group::set_params(&mut g, inner, p)?;
            }
            let text = group::describe_params(&g, inner);
            if candidates.iter().any(|c| c.params == text) {
                continue;
            }
            candidates.push(Candidate {
                key: fingerprint.key(&print_graph(&g)),
                estimate_ms: estimate_ms(priced),
                kernel: params,
                params: text,
                graph: g,
            });
        }
        Ok(CandidateSet {
            standalone,
            candidates,
        })
    }
}

/// One fused group of the graph being tuned, and its candidates.
struct Work {
    op: OpId,
    symbol: String,
    kind: String,
    planned: String,
    set: CandidateSet,
}

/// Tunes every `fused` group of `graph` (a planned graph) and returns the
/// graph with each group's fastest measured parameters, and the report.
/// Every uncached candidate of the graph is compiled first, on all cores;
/// then the groups are measured in order, the cache saved after each, and
/// `progress` hears each group's report. Last, when any group changed, the
/// whole graph is timed as planned and as tuned and the faster one is
/// returned ([`WholeGraph`]): tuning never makes the forward pass slower
/// than the planner's choices.
pub fn tune_graph(
    graph: &Graph,
    options: &TuneOptions,
    measure: &mut dyn Measure,
    cache: &mut Cache,
    progress: ProgressFn<'_>,
) -> Result<(Graph, TuneReport), String> {
    let start = Instant::now();
    // A wide ranking to pick `top_k` distinct shapes from (see `diverse`).
    let model = CostModel {
        device: options.device.clone(),
        top_k: options.top_k * RANKED_PER_CANDIDATE,
        libraries: options.libraries.clone(),
    };
    let fingerprint = measure.fingerprint();
    let work = group::fused_ops(graph)
        .into_iter()
        .map(|op| prepare(graph, op, options, &model, &fingerprint))
        .collect::<Result<Vec<_>, String>>()?;
    let sets: Vec<&CandidateSet> = work.iter().map(|w| &w.set).collect();
    let mut tuned = graph.clone();
    let mut groups = Vec::new();
    measure_sets(
        &sets,
        options,
        measure,
        cache,
        progress,
        &mut |w, measured, cache| {
            let g = &work[w];
            cache
                .save()
                .map_err(|e| format!("tuning @{}: {e}", g.symbol))?;
            let (report, attrs) = choose(g, cache, measured);
            if let Some(attrs) = attrs {
                tuned.op_mut(g.op).attrs = attrs;
            }
            progress(Progress::Tuned(&report));
            groups.push(report);
            Ok(())
        },
    )?;
    let (mut whole_graph, mut whole_graph_skipped) = (None, None);
    if print_graph(&tuned) != print_graph(graph) {
        match time_whole_graphs(graph, &tuned, options, measure) {
            Ok(w) => {
                if !w.kept_tuned {
                    tuned = graph.clone();
                }
                whole_graph = Some(w);
            }
            Err(e) => whole_graph_skipped = Some(e),
        }
    }
    Ok((
        tuned,
        TuneReport {
            groups,
            whole_graph,
            whole_graph_skipped,
            seconds: start.elapsed().as_secs_f64(),
        },
    ))
}

/// Rounds of whole-graph timing, planned and tuned alternating (the best
/// median of each is compared).
const WHOLE_GRAPH_ROUNDS: usize = 2;

/// `planned` and `tuned` (the same graph with other parameters) compiled
/// and timed whole on the same seeded inputs; the tuned one is kept unless
/// the planned one ran faster.
fn time_whole_graphs(
    planned: &Graph,
    tuned: &Graph,
    options: &TuneOptions,
    measure: &mut dyn Measure,
) -> Result<WholeGraph, String> {
    let build = BuildOptions {
        arch: options.arch.clone(),
        compile: true,
    };
    let built = [planned, tuned].map(|g| dcir_cuda::build_artifact(g, &build));
    let [planned_artifact, tuned_artifact] = built;
    let planned_artifact = planned_artifact.map_err(|e| format!("the planned graph: {e}"))?;
    let tuned_artifact = tuned_artifact.map_err(|e| format!("the tuned graph: {e}"))?;
    let inputs = random_inputs(planned, options.seed);
    let (mut planned_ms, mut tuned_ms) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..WHOLE_GRAPH_ROUNDS {
        let p = measure
            .time_graph(planned, &planned_artifact, &inputs)
            .map_err(|e| format!("timing the planned graph: {e}"))?;
        let t = measure
            .time_graph(tuned, &tuned_artifact, &inputs)
            .map_err(|e| format!("timing the tuned graph: {e}"))?;
        planned_ms = planned_ms.min(p);
        tuned_ms = tuned_ms.min(t);
    }
    Ok(WholeGraph {
        planned_ms,
        tuned_ms,
        kept_tuned: tuned_ms <= planned_ms,
    })
}

/// Compiles every candidate of `sets` the cache lacks (each key once, all
/// on all cores), runs each on its group's seeded inputs against the
/// interpreter's outputs and caches its time or failure. After each set,
/// `done(set, measured now, cache)`; sets are taken in order, so a set that
/// repeats an earlier one finds the earlier one's entries.
fn measure_sets(
    sets: &[&CandidateSet],
    options: &TuneOptions,
    measure: &mut dyn Measure,
    cache: &mut Cache,
    progress: ProgressFn<'_>,
    done: &mut dyn FnMut(usize, usize, &mut Cache) -> Result<(), String>,
) -> Result<(), String> {
    let mut keys = HashSet::new();
    let uncached: Vec<(usize, &Candidate)> = sets
        .iter()
        .enumerate()
        .flat_map(|(s, set)| set.candidates.iter().map(move |c| (s, c)))
        .filter(|(_, c)| cache.get(&c.key).is_none() && keys.insert(c.key.as_str()))
        .collect();
    let build = BuildOptions {
        arch: options.arch.clone(),
        compile: true,
    };
    if !uncached.is_empty() {
        progress(Progress::Compiling(uncached.len()));
    }
    let mut artifacts: Vec<Option<Result<Artifact, String>>> = uncached
        .par_iter()
        .map(|(_, c)| {
            let built = dcir_cuda::build_artifact(&c.graph, &build);
            progress(Progress::Compiled);
            Some(built)
        })
        .collect();
    // The interpreter's outputs, for the sets with a candidate to run.
    let runs: Vec<bool> = (0..sets.len())
        .map(|s| {
            uncached
                .iter()
                .zip(&artifacts)
                .any(|((u, _), a)| *u == s && matches!(a, Some(Ok(_))))
        })
        .collect();
    let to_measure = artifacts
        .iter()
        .filter(|a| matches!(a, Some(Ok(_))))
        .count();
    if to_measure > 0 {
        progress(Progress::Measuring(to_measure));
    }
    let mut references: Vec<Option<Result<Reference, String>>> =
        (0..sets.len()).map(|_| None).collect();
    for s in 0..sets.len() {
        if runs[s] && references[s].is_none() {
            // This set's and the next ones' references, one per core.
            let batch: Vec<usize> = (s..sets.len())
                .filter(|&t| runs[t])
                .take(rayon::current_num_threads())
                .collect();
            let refs: Vec<_> = batch
                .par_iter()
                .map(|&t| reference_run(&sets[t].standalone, options.seed))
                .collect();
            for (t, r) in batch.into_iter().zip(refs) {
                references[t] = Some(r);
            }
        }
        let mut measured = 0;
        for (slot, (_, cand)) in uncached.iter().enumerate().filter(|(_, u)| u.0 == s) {
            let entry = match artifacts[slot].take().expect("one artifact per slot") {
                Err(e) => Entry::Failed(format!("compile: {e}")),
                Ok(artifact) => {
                    let result = match references[s].as_ref().expect("computed above") {
                        Err(e) => Err(format!("the interpreter: {e}")),
                        Ok((inputs, expected)) => {
                            measure.measure(&cand.graph, &artifact, inputs, expected)
                        }
                    };
                    progress(Progress::Measured);
                    match result {
                        Ok(ms) => Entry::Time(ms),
                        Err(e) => Entry::Failed(e),
                    }
                }
            };
            cache.insert(cand.key.clone(), entry);
            measured += 1;
        }
        references[s] = None;
        done(s, measured, cache)?;
    }
    Ok(())
}

/// The candidates of fused `op`: the model's best distinct shapes, then the
/// planner's own choice if it is not among them.
fn prepare(
    graph: &Graph,
    op: OpId,
    options: &TuneOptions,
    model: &CostModel,
    fingerprint: &Fingerprint,
) -> Result<Work, String> {
    let symbol = group::symbol(graph, op);
    let fail = |e: String| format!("tuning @{symbol}: {e}");
    let region = group::region_group(graph, op).map_err(fail)?;
    let estimate = model.estimate(graph, &region).map_err(fail)?;
    let scored = model.candidates(graph, &region).map_err(fail)?;
    let estimate_ms = |p: Option<&KernelParams>| match p {
        None => estimate.time * 1e3,
        Some(p) => {
            let text = p.describe();
            scored
                .iter()
                .find(|c| c.params.describe() == text)
                .map_or(f64::NAN, |c| c.time * 1e3)
        }
    };
    let standalone = group::standalone(graph, op).map_err(fail)?;
    let set = CandidateSet::new(
        standalone,
        &estimate.candidates,
        options.top_k,
        fingerprint,
        &estimate_ms,
    )
    .map_err(fail)?;
    Ok(Work {
        op,
        kind: region.kind.name().to_string(),
        planned: group::describe_params(graph, op),
        symbol,
        set,
    })
}

/// The report of group `g` from the cache, and the attributes of its
/// fastest candidate that matched; `measured` of them were measured now.
fn choose(g: &Work, cache: &Cache, measured: usize) -> (GroupReport, Option<Attrs>) {
    let mut failures = Vec::new();
    let mut times = Vec::new();
    for c in &g.set.candidates {
        match cache.get(&c.key) {
            Some(Entry::Time(ms)) => times.push((c, *ms)),
            Some(Entry::Failed(why)) => failures.push(format!("{}: {why}", c.params)),
            None => failures.push(format!("{}: not measured", c.params)),
        }
    }
    let chosen = times.iter().min_by(|a, b| a.1.total_cmp(&b.1));
    let planned_ms = times
        .iter()
        .find(|(c, _)| c.params == g.planned)
        .map(|&(_, ms)| ms);
    let attrs = chosen.map(|(c, _)| c.graph.op(group::fused_ops(&c.graph)[0]).attrs.clone());
    let report = GroupReport {
        symbol: g.symbol.clone(),
        kind: g.kind.clone(),
        candidates: g.set.candidates.len(),
        measured,
        planned: g.planned.clone(),
        planned_ms,
        chosen: chosen.map(|&(c, ms)| report::Chosen {
            params: c.params.clone(),
            ms,
            estimate_ms: c.estimate_ms,
            library: attrs
                .as_ref()
                .and_then(|a| a.get("library"))
                .and_then(Attr::as_str)
                .map(str::to_string),
        }),
        failures,
        trials: times
            .iter()
            .map(|&(c, ms)| report::Trial {
                params: c.params.clone(),
                estimate_ms: c.estimate_ms,
                ms,
            })
            .collect(),
    };
    (report, attrs)
}

/// A group's random inputs and the interpreter's outputs for them.
type Reference = (Vec<dcir_interp::Tensor>, Vec<dcir_interp::Tensor>);

/// The reference of `group` for `seed`.
fn reference_run(group: &Graph, seed: u64) -> Result<Reference, String> {
    let inputs = random_inputs(group, seed);
    let expected = run_graph(group, &inputs).map_err(|e| e.to_string())?;
    Ok((inputs, expected))
}
