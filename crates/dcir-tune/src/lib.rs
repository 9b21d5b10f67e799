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
//! measures nothing.
//!
//! Not yet here (issue 9): the planner's merges decided by measured times,
//! and cuBLAS as a candidate.

pub mod cache;
pub mod group;
pub mod measure;
mod report;

use std::collections::HashSet;
use std::time::Instant;

use dcir_artifact::Artifact;
use dcir_cuda::BuildOptions;
use dcir_fusion::{CostModel, DeviceSpec, Estimator, KernelParams};
use dcir_interp::{random_inputs, run_graph};
use dcir_ir::{Attrs, Graph, OpId, print_graph};

pub use cache::{Cache, Entry, Fingerprint};
pub use measure::{GpuMeasure, Measure};
pub use report::{GroupReport, TuneReport};

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
}

impl TuneOptions {
    /// 8 candidates a group on `device`, seed 0, `sm_90`.
    pub fn new(device: DeviceSpec) -> TuneOptions {
        TuneOptions {
            device,
            top_k: 8,
            seed: 0,
            arch: dcir_cuda::nvrtc::DEFAULT_ARCH.to_string(),
        }
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

/// One candidate of a group: its parameters, the standalone graph with
/// them, its cache key and the model's estimate.
struct Candidate {
    params: String,
    graph: Graph,
    key: String,
    estimate_ms: f64,
}

/// One group's candidates, before measurement.
struct Work {
    op: OpId,
    symbol: String,
    kind: String,
    planned: String,
    standalone: Graph,
    candidates: Vec<Candidate>,
}

/// Tunes every `fused` group of `graph` (a planned graph) and returns the
/// graph with each group's fastest measured parameters, and the report.
/// Every uncached candidate of the graph is compiled first, on all cores;
/// then the groups are measured in order, the cache saved after each, and
/// `progress` hears each group's report.
pub fn tune_graph(
    graph: &Graph,
    options: &TuneOptions,
    measure: &mut dyn Measure,
    cache: &mut Cache,
    progress: &mut dyn FnMut(&GroupReport),
) -> Result<(Graph, TuneReport), String> {
    let start = Instant::now();
    // A wide ranking to pick `top_k` distinct shapes from (see `diverse`).
    let model = CostModel {
        device: options.device.clone(),
        top_k: options.top_k * RANKED_PER_CANDIDATE,
    };
    let fingerprint = measure.fingerprint();
    let work = group::fused_ops(graph)
        .into_iter()
        .map(|op| prepare(graph, op, options, &model, &fingerprint))
        .collect::<Result<Vec<_>, String>>()?;

    // Each uncached key once: a group that repeats an earlier one (the same
    // text) finds the earlier group's measurements in the cache.
    let mut keys = HashSet::new();
    let uncached: Vec<(usize, usize)> = work
        .iter()
        .enumerate()
        .flat_map(|(w, g)| (0..g.candidates.len()).map(move |c| (w, c)))
        .filter(|&(w, c)| {
            let key = &work[w].candidates[c].key;
            cache.get(key).is_none() && keys.insert(key.as_str())
        })
        .collect();
    let build = BuildOptions {
        arch: options.arch.clone(),
        compile: true,
    };
    let graphs: Vec<&Graph> = uncached
        .iter()
        .map(|&(w, c)| &work[w].candidates[c].graph)
        .collect();
    let mut artifacts: Vec<Option<Result<Artifact, String>>> =
        compile_all(&graphs, &build).into_iter().map(Some).collect();

    let mut tuned = graph.clone();
    let mut groups = Vec::new();
    for (w, g) in work.iter().enumerate() {
        let fail = |e: String| format!("tuning @{}: {e}", g.symbol);
        let mut reference = None;
        let mut measured = 0;
        for (slot, &(_, c)) in uncached.iter().enumerate().filter(|(_, u)| u.0 == w) {
            let cand = &g.candidates[c];
            let entry = match artifacts[slot].take().expect("one artifact per slot") {
                Err(e) => Entry::Failed(format!("compile: {e}")),
                Ok(artifact) => {
                    let (inputs, expected) = match &reference {
                        Some(r) => r,
                        None => reference
                            .insert(reference_run(&g.standalone, options.seed).map_err(fail)?),
                    };
                    match measure.measure(&cand.graph, &artifact, inputs, expected) {
                        Ok(ms) => Entry::Time(ms),
                        Err(e) => Entry::Failed(e),
                    }
                }
            };
            cache.insert(cand.key.clone(), entry);
            measured += 1;
        }
        cache.save().map_err(fail)?;
        let (report, attrs) = choose(g, cache, measured);
        if let Some(attrs) = attrs {
            tuned.op_mut(g.op).attrs = attrs;
        }
        progress(&report);
        groups.push(report);
    }
    Ok((
        tuned,
        TuneReport {
            groups,
            seconds: start.elapsed().as_secs_f64(),
        },
    ))
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
    let estimate_of = |p: &KernelParams| {
        let text = p.describe();
        scored
            .iter()
            .find(|c| c.params.describe() == text)
            .map_or(f64::NAN, |c| c.time * 1e3)
    };
    let standalone = group::standalone(graph, op).map_err(fail)?;
    let mut candidates: Vec<Candidate> = Vec::new();
    let mut with_params = |params: Option<&KernelParams>| -> Result<(), String> {
        let mut g = standalone.clone();
        let inner = group::fused_ops(&g)[0];
        if let Some(p) = params {
            group::set_params(&mut g, inner, p)?;
        }
        let text = group::describe_params(&g, inner);
        if candidates.iter().any(|c| c.params == text) {
            return Ok(());
        }
        candidates.push(Candidate {
            key: fingerprint.key(&print_graph(&g)),
            estimate_ms: params.map_or_else(|| estimate.time * 1e3, estimate_of),
            params: text,
            graph: g,
        });
        Ok(())
    };
    for p in diverse(&estimate.candidates, options.top_k) {
        with_params(Some(p)).map_err(fail)?;
    }
    with_params(None).map_err(fail)?;
    Ok(Work {
        op,
        kind: region.kind.name().to_string(),
        planned: group::describe_params(graph, op),
        symbol,
        standalone,
        candidates,
    })
}

/// The report of group `g` from the cache, and the attributes of its
/// fastest candidate that matched; `measured` of them were measured now.
fn choose(g: &Work, cache: &Cache, measured: usize) -> (GroupReport, Option<Attrs>) {
    let mut failures = Vec::new();
    let mut times = Vec::new();
    for c in &g.candidates {
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
        candidates: g.candidates.len(),
        measured,
        planned: g.planned.clone(),
        planned_ms,
        chosen: chosen.map(|&(c, ms)| report::Chosen {
            params: c.params.clone(),
            ms,
            estimate_ms: c.estimate_ms,
        }),
        failures,
    };
    (report, attrs)
}

/// The group's random inputs and the interpreter's outputs for them.
fn reference_run(
    group: &Graph,
    seed: u64,
) -> Result<(Vec<dcir_interp::Tensor>, Vec<dcir_interp::Tensor>), String> {
    let inputs = random_inputs(group, seed);
    let expected = run_graph(group, &inputs).map_err(|e| e.to_string())?;
    Ok((inputs, expected))
}

/// The artifacts of `graphs`, built on all cores.
fn compile_all(graphs: &[&Graph], build: &BuildOptions) -> Vec<Result<Artifact, String>> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let per = graphs.len().div_ceil(threads).max(1);
    let mut out: Vec<Result<Artifact, String>> = graphs
        .iter()
        .map(|_| Err("not built".to_string()))
        .collect();
    std::thread::scope(|s| {
        for (chunk, slots) in graphs.chunks(per).zip(out.chunks_mut(per)) {
            s.spawn(move || {
                for (g, slot) in chunk.iter().zip(slots) {
                    *slot = dcir_cuda::build_artifact(g, build);
                }
            });
        }
    });
    out
}
