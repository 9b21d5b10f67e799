//! The planner's estimator with measured times: DeepCuts' Algorithm 1 with
//! the GPU, not only the model, deciding which merges pay.
//!
//! For every group the planner considers, the cost model's best few
//! parameter sets (and its choice) are compiled and measured like a tuned
//! group's candidates; the group's time is the fastest that matched the
//! interpreter, its parameters that candidate's. A group no candidate of
//! which runs is refused (the planner does not form it); a lone `reshape`
//! is a view, not a kernel, and keeps the model's estimate. Measurements go to
//! the same cache as the tuner's, so the tuning after planning finds most of
//! its candidates measured already.

use std::cell::RefCell;

use dcir_fusion::{CostModel, Estimate, Estimator, Group};
use dcir_ir::{Graph, OpKind};

use crate::{
    Cache, CandidateSet, Entry, Fingerprint, Measure, ProgressFn, RANKED_PER_CANDIDATE,
    TuneOptions, group, measure_sets,
};

/// Parameter sets of the model's ranking measured per group the planner
/// considers (with the model's choice): enough to judge a merge; the groups
/// kept are tuned afterwards with the full `top_k`.
const PLAN_CANDIDATES: usize = 2;

/// An [`Estimator`] that measures: pass it to [`dcir_fusion::plan_graph`].
pub struct MeasuredEstimator<'a> {
    model: CostModel,
    options: TuneOptions,
    progress: ProgressFn<'a>,
    fingerprint: Fingerprint,
    state: RefCell<State<'a>>,
}

struct State<'a> {
    measure: &'a mut dyn Measure,
    cache: &'a mut Cache,
    measured: usize,
}

impl<'a> MeasuredEstimator<'a> {
    /// Measures the model's best parameter sets (at most `options.top_k`
    /// and [`PLAN_CANDIDATES`]) and its choice per group considered, with
    /// `measure`, caching in `cache`.
    pub fn new(
        options: TuneOptions,
        measure: &'a mut dyn Measure,
        cache: &'a mut Cache,
        progress: ProgressFn<'a>,
    ) -> MeasuredEstimator<'a> {
        MeasuredEstimator {
            model: CostModel {
                device: options.device.clone(),
                top_k: options.top_k * RANKED_PER_CANDIDATE,
                libraries: options.libraries.clone(),
            },
            fingerprint: measure.fingerprint(),
            options,
            progress,
            state: RefCell::new(State {
                measure,
                cache,
                measured: 0,
            }),
        }
    }

    /// Candidates compiled and measured so far (not taken from the cache).
    pub fn measured(&self) -> usize {
        self.state.borrow().measured
    }

    /// The model's estimate of `group` and its candidates; none for a lone
    /// `reshape`, which the rewrite leaves a view (no kernel to measure).
    fn modelled(
        &self,
        graph: &Graph,
        group: &Group,
    ) -> Result<(Estimate, Option<CandidateSet>), String> {
        let estimate = self.model.estimate(graph, group)?;
        if let [op] = group.ops[..]
            && graph.op(op).kind == OpKind::Reshape
        {
            return Ok((estimate, None));
        }
        let standalone = group::planned_standalone(graph, group, &estimate)?;
        let planned_ms = estimate.time * 1e3;
        let set = CandidateSet::new(
            standalone,
            &estimate.candidates,
            self.options.top_k.min(PLAN_CANDIDATES),
            &self.fingerprint,
            &|p| p.map_or(planned_ms, |_| f64::NAN),
        )?;
        Ok((estimate, Some(set)))
    }
}

impl Estimator for MeasuredEstimator<'_> {
    fn estimate(&self, graph: &Graph, group: &Group) -> Result<Estimate, String> {
        self.estimate_all(graph, std::slice::from_ref(group))
            .pop()
            .expect("one estimate per group")
    }

    fn estimate_all(&self, graph: &Graph, groups: &[Group]) -> Vec<Result<Estimate, String>> {
        let modelled: Vec<Result<(Estimate, Option<CandidateSet>), String>> =
            groups.iter().map(|g| self.modelled(graph, g)).collect();
        let sets: Vec<&CandidateSet> = modelled
            .iter()
            .filter_map(|m| m.as_ref().ok().and_then(|(_, set)| set.as_ref()))
            .collect();
        let mut state = self.state.borrow_mut();
        let State {
            measure,
            cache,
            measured,
        } = &mut *state;
        let mut now = 0;
        let run = measure_sets(
            &sets,
            &self.options,
            &mut **measure,
            cache,
            self.progress,
            &mut |_, n, _| {
                now += n;
                Ok(())
            },
        );
        *measured += now;
        if let Err(e) = run {
            return groups.iter().map(|_| Err(e.clone())).collect();
        }
        modelled
            .into_iter()
            .map(|m| {
                let (mut estimate, set) = m?;
                let Some(set) = set else {
                    return Ok(estimate);
                };
                let mut failures = Vec::new();
                let mut fastest = None;
                for c in &set.candidates {
                    match cache.get(&c.key) {
                        Some(Entry::Time(ms)) if fastest.is_none_or(|(_, f)| *ms < f) => {
                            fastest = Some((c, *ms));
                        }
                        Some(Entry::Time(_)) => {}
                        Some(Entry::Failed(why)) => failures.push(format!("{}: {why}", c.params)),
                        None => failures.push(format!("{}: not measured", c.params)),
                    }
                }
                let (c, ms) = fastest.ok_or_else(|| {
                    format!("no candidate ran on the GPU: {}", failures.join("; "))
                })?;
                estimate.time = ms * 1e-3;
                if let Some(params) = &c.kernel {
                    estimate.params = params.clone();
                }
                Ok(estimate)
            })
            .collect()
    }
}
