//! The partition planner: DeepCuts' Algorithm 1 as a greedy best-merge search.
//!
//! Every op that does work starts as its own group (constants are data, not
//! kernels), but a broadcast with one one-to-one user starts in its user's.
//! Each round considers every pair of groups joined by a
//! producer → consumer edge, asks whether their union is legal (each edge
//! passes [`edge_rule`], the union forms a kernel shape ([`group_kind`]), and
//! merging creates no cycle through a third group), and asks the estimator
//! for the union's time. The merge that saves the most time is applied
//! (savings within `SAVING_TIE` are ties, the earliest producer's first); the
//! search stops when no legal merge saves time. Estimates are cached per op
//! set, so a round re-estimates only pairs that touch the last merge, and a
//! round's new sets go to the estimator together ([`Estimator::estimate_all`]).
//! Rejections are kept for `--explain-fusion`.
//!
//! The backend ([`Target`]) has the last word: a round's merges are tried
//! best first, and the first the target accepts is made. The final plan is
//! checked group by group the same way; a group refused there is banned and
//! the search runs again, and an op the target lowers alone in no way is an
//! error naming it.

use dcir_ir::{Graph, OpId, OpKind, ValueDef};
use rustc_hash::FxHashMap;

use crate::apply::{apply_plan_indexed, is_view_group, reads_stored, standalone_group};
use crate::class::{Mapping, mapping};
use crate::cost::{Estimate, Estimator};
use crate::group::Group;
use crate::legality::check_group;
use crate::storage::{ConcatStorage, concat_storage};
use crate::target::{Refusal, Target};

/// Searches after a final check refused a group, at most.
const MAX_SEARCHES: usize = 16;

/// Merge savings closer than this (seconds) are ties.
const SAVING_TIE: f64 = 1e-8;

/// One group of the plan with its estimate.
#[derive(Clone, Debug)]
pub struct PlannedGroup {
    /// The ops and their kernel shape.
    pub group: Group,
    /// The estimator's answer for it.
    pub estimate: Estimate,
    /// Sum of the estimates of its ops run one kernel each, seconds.
    pub unfused_time: f64,
    /// The estimate's parameters the target does not run as written
    /// ([`crate::Accepted`]): where any are, the estimate priced a kernel
    /// other than the one that runs.
    pub adapted: Vec<String>,
}

/// A merge the planner considered and did not make.
#[derive(Clone, Debug, PartialEq)]
pub struct Rejection {
    /// The producer group's first op.
    pub producer: OpId,
    /// The consumer group's first op.
    pub consumer: OpId,
    /// The rule, estimate or target that decided.
    pub reason: Rejected,
}

/// Why the planner did not merge two groups.
#[derive(Clone, Debug, PartialEq)]
pub enum Rejected {
    /// A legality rule (`E4: ...`) or the cost model refused the merged group.
    Illegal(String),
    /// The consumer also depends on the producer through another group.
    Cycle,
    /// One side is a concat stored in place (its producers write into its buffer).
    StoredConcat,
    /// The merged kernel is estimated slower than the two apart (seconds).
    Slower {
        /// The merged group's time.
        merged: f64,
        /// The two groups' times together.
        apart: f64,
    },
    /// The target does not lower the merged group.
    Target(Refusal),
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejected::Illegal(why) => f.write_str(why),
            Rejected::Cycle => f.write_str(
                "cycle: the consumer also depends on the producer through another group",
            ),
            Rejected::StoredConcat => {
                f.write_str("the concat is stored in place: its producers write into its buffer")
            }
            Rejected::Slower { merged, apart } => write!(
                f,
                "slower: {:.2} us merged vs {:.2} us apart",
                merged * 1e6,
                apart * 1e6
            ),
            Rejected::Target(refusal) => write!(f, "target: {refusal}"),
        }
    }
}

/// The partition of one graph body into kernels.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Groups in an order where producers come before consumers.
    pub groups: Vec<PlannedGroup>,
    /// Merges considered in the last round and rejected, with the reason.
    pub rejections: Vec<Rejection>,
}

impl Plan {
    /// Estimated time of the whole plan, seconds.
    pub fn total_time(&self) -> f64 {
        self.groups.iter().map(|g| g.estimate.time).sum()
    }

    /// Estimated time with every op its own kernel, seconds.
    pub fn unfused_time(&self) -> f64 {
        self.groups.iter().map(|g| g.unfused_time).sum()
    }
}

/// True for ops that are not kernels: constants (data) and terminators.
fn is_free(kind: OpKind) -> bool {
    matches!(kind, OpKind::Constant | OpKind::Return | OpKind::Yield)
}

struct State<'g> {
    graph: &'g Graph,
    /// Group index of each op that is in a group.
    group_of: FxHashMap<OpId, usize>,
    /// Groups by index; merged-away groups are empty.
    members: Vec<Vec<OpId>>,
    /// Position of each body op (for ordering).
    position: FxHashMap<OpId, usize>,
    /// The body ops using each value.
    users: FxHashMap<dcir_ir::ValueId, Vec<OpId>>,
    cache: FxHashMap<Vec<OpId>, Result<Estimate, String>>,
    /// The target's answer for each op set asked about.
    verdicts: FxHashMap<Vec<OpId>, Result<(), Refusal>>,
    /// The concats stored in place: never merged, no kernel.
    storage: ConcatStorage,
}

impl State<'_> {
    /// The groups that consume a value produced by group `g`.
    fn consumers(&self, g: usize) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for &op in &self.members[g] {
            for r in &self.graph.op(op).results {
                for user in self.users.get(r).map_or(&[][..], Vec::as_slice) {
                    if let Some(&ug) = self.group_of.get(user)
                        && ug != g
                        && !out.contains(&ug)
                    {
                        out.push(ug);
                    }
                }
            }
        }
        out.sort_unstable();
        out
    }

    fn sorted(&self, mut ops: Vec<OpId>) -> Vec<OpId> {
        ops.sort_by_key(|o| self.position[o]);
        ops
    }

    /// The group formed by `ops` (sorted), or why it is illegal.
    fn form(&self, ops: &[OpId]) -> Result<Group, String> {
        let (kind, level) = check_group(self.graph, ops)?;
        Ok(Group {
            ops: ops.to_vec(),
            kind,
            level,
        })
    }

    /// Estimates every op set of `sets` not yet cached in one call to the
    /// model (illegal sets are cached with their reason).
    fn prefetch(&mut self, model: &dyn Estimator, sets: Vec<Vec<OpId>>) {
        let mut legal: Vec<(Vec<OpId>, Group)> = Vec::new();
        for ops in sets {
            if self.cache.contains_key(&ops) || legal.iter().any(|(o, _)| *o == ops) {
                continue;
            }
            match self.form(&ops) {
                Ok(group) => legal.push((ops, group)),
                Err(reason) => {
                    self.cache.insert(ops, Err(reason));
                }
            }
        }
        if legal.is_empty() {
            return;
        }
        let groups: Vec<Group> = legal.iter().map(|(_, g)| g.clone()).collect();
        let estimates = model.estimate_all(self.graph, &groups);
        for ((ops, _), estimate) in legal.into_iter().zip(estimates) {
            self.cache.insert(ops, estimate);
        }
    }

    /// The target's answer for merging a consumer into group `p`, making
    /// `merged` (legal and estimated), built as the plan would build it.
    fn verdict(
        &mut self,
        model: &dyn Estimator,
        target: &dyn Target,
        p: usize,
        merged: &[OpId],
    ) -> Result<Result<(), Refusal>, String> {
        if let Some(hit) = self.verdicts.get(merged) {
            return Ok(hit.clone());
        }
        let planned = PlannedGroup {
            group: self.form(merged)?,
            estimate: self.estimate(model, merged)?,
            unfused_time: 0.0,
            adapted: Vec::new(),
        };
        // The partition with the merge made (a lone reshape is no group).
        let group_of = |op: OpId| {
            if merged.contains(&op) {
                return Some(p);
            }
            let g = *self.group_of.get(&op)?;
            (!is_view_group(self.graph, &self.members[g], &self.storage)).then_some(g)
        };
        // Which groups call a library (and so read their inputs stored), as
        // estimated so far.
        let stored_reader = |g: usize| {
            if g == p {
                return reads_stored(&planned);
            }
            self.cache
                .get(&self.members[g])
                .is_some_and(|e| e.as_ref().is_ok_and(|e| e.params.get("library").is_some()))
        };
        let alone = standalone_group(
            self.graph,
            &planned,
            p,
            &self.users,
            &group_of,
            &stored_reader,
        )?;
        let verdict = match alone {
            Some((alone, fused)) => target.accept(&alone, fused).map(|_| ()),
            None => Ok(()),
        };
        self.verdicts.insert(merged.to_vec(), verdict.clone());
        Ok(verdict)
    }

    fn estimate(&mut self, model: &dyn Estimator, ops: &[OpId]) -> Result<Estimate, String> {
        if let Some(hit) = self.cache.get(ops) {
            return hit.clone();
        }
        let result = self
            .form(ops)
            .and_then(|group| model.estimate(self.graph, &group));
        self.cache.insert(ops.to_vec(), result.clone());
        result
    }
}

/// Partitions the body of `graph` into kernels with `model`'s estimates,
/// every kernel one `target` lowers. A graph that already holds `fused` ops
/// is refused, and so is an op `target` lowers in no group.
pub fn plan_graph(
    graph: &Graph,
    model: &dyn Estimator,
    target: &dyn Target,
) -> Result<Plan, String> {
    plan_with(graph, model, target, true)
}

/// The op-by-op plan: every op that does work its own kernel (the unfused
/// baseline, `--no-fuse`), each checked with `target` as [`plan_graph`]'s.
pub fn plan_unfused(
    graph: &Graph,
    model: &dyn Estimator,
    target: &dyn Target,
) -> Result<Plan, String> {
    plan_with(graph, model, target, false)
}

fn plan_with(
    graph: &Graph,
    model: &dyn Estimator,
    target: &dyn Target,
    merge: bool,
) -> Result<Plan, String> {
    let body = &graph.block(graph.body()).ops;
    if body.iter().any(|&o| graph.op(o).kind == OpKind::Fused) {
        return Err("the graph is already fused".to_string());
    }
    let mut state = State {
        graph,
        group_of: FxHashMap::default(),
        members: Vec::new(),
        position: body.iter().enumerate().map(|(i, &o)| (o, i)).collect(),
        users: FxHashMap::default(),
        cache: FxHashMap::default(),
        verdicts: FxHashMap::default(),
        storage: concat_storage(graph),
    };
    for &op in body {
        for &v in &graph.op(op).operands {
            let list = state.users.entry(v).or_default();
            if !list.contains(&op) {
                list.push(op);
            }
        }
    }
    for _ in 0..MAX_SEARCHES {
        let mut plan = search(&mut state, model, target, merge)?;
        let (fused, groups) = apply_plan_indexed(graph, &plan)?;
        let mut refused = false;
        for (op, index) in groups {
            match target.accept(&fused, op) {
                Ok(accepted) => plan.groups[index].adapted = accepted.adapted,
                Err(refusal) => {
                    let ops = &plan.groups[index].group.ops;
                    if let [single] = ops.as_slice() {
                        return Err(no_kernel(graph, *single, &refusal));
                    }
                    state.verdicts.insert(ops.clone(), Err(refusal));
                    refused = true;
                }
            }
        }
        if !refused {
            return Ok(plan);
        }
    }
    Err(format!(
        "the target refused groups of {MAX_SEARCHES} plans in a row (a planner bug)"
    ))
}

/// True when group `to` is reachable from group `from` through some third
/// group, `consumers[g]` being the groups that read group `g`.
fn reachable_through_other(consumers: &[Vec<usize>], from: usize, to: usize) -> bool {
    let mut stack: Vec<usize> = consumers[from]
        .iter()
        .copied()
        .filter(|&c| c != to)
        .collect();
    let mut seen = vec![false; consumers.len()];
    for &g in &stack {
        seen[g] = true;
    }
    while let Some(g) = stack.pop() {
        for &c in &consumers[g] {
            if c == to {
                return true;
            }
            if !std::mem::replace(&mut seen[c], true) {
                stack.push(c);
            }
        }
    }
    false
}

/// Starts two kinds of view in their one user's group, where they are
/// index arithmetic, while alone each prices as a kernel writing the whole
/// view, which makes its user look costly to merge anywhere else:
/// - a `broadcast` whose user maps elements one to one (a bias add): a
///   projection's bias would go with the views after it, not into the
///   projection's epilogue;
/// - a convolution's filter read through `transpose {perm = [0, 3, 1, 2]}`
///   (a KRSC filter, `nhwc-inputs`): it would merge with the transpose that
///   stores the filter KRSC, and the convolution would read the filter as
///   it was (the Hopper mainloop reads a stored KRSC filter).
///
/// Like any merge it must not be estimated slower than the two apart (a
/// measuring estimator may say so) and the target must accept it.
fn views_with_their_consumers(
    state: &mut State<'_>,
    model: &dyn Estimator,
    target: &dyn Target,
) -> Result<(), String> {
    let graph = state.graph;
    let mut pairs = Vec::new();
    for &op in &graph.block(graph.body()).ops {
        let d = graph.op(op);
        if !matches!(d.kind, OpKind::Broadcast | OpKind::Transpose) {
            continue;
        }
        let Some(&[user]) = state.users.get(&d.results[0]).map(Vec::as_slice) else {
            continue;
        };
        let bias = d.kind == OpKind::Broadcast && mapping(graph.op(user).kind) == Mapping::OneToOne;
        if !bias && !is_filter_view(graph, op, user) {
            continue;
        }
        if let (Some(&g), Some(&ug)) = (state.group_of.get(&op), state.group_of.get(&user)) {
            pairs.push((g, ug));
        }
    }
    // The sets as they stand before any of these merges, to the estimator at once.
    let sets = pairs
        .iter()
        .flat_map(|&(g, ug)| {
            let merged =
                state.sorted([state.members[g].clone(), state.members[ug].clone()].concat());
            [merged, state.members[g].clone(), state.members[ug].clone()]
        })
        .collect();
    state.prefetch(model, sets);
    for (g, ug) in pairs {
        let (alone, user) = (state.members[g].clone(), state.members[ug].clone());
        let merged = state.sorted([alone.clone(), user.clone()].concat());
        let time = |state: &mut State<'_>, ops: &[OpId]| state.estimate(model, ops).map(|e| e.time);
        let (Ok(together), Ok(a), Ok(b)) = (
            time(state, &merged),
            time(state, &alone),
            time(state, &user),
        ) else {
            continue;
        };
        if together > a + b || state.verdict(model, target, ug, &merged)?.is_err() {
            continue;
        }
        for &o in &merged {
            state.group_of.insert(o, ug);
        }
        state.members[ug] = merged;
        state.members[g].clear();
    }
    Ok(())
}

/// Each `conv2d` group `c` (the convolution alone, or with its filter's
/// view), or lone pool, between two lone `transpose` groups, `p` reading
/// its input and `q` its result, as `(p, c, q)`: a convolution or pool over
/// a tensor stored in another layout (the `channels-last` pass's NHWC)
/// runs as one kernel only with both views (a library call takes the
/// layout whole; the pool kernel walks NHWC order only with the second,
/// and reads NHWC coalesced only then), and no merge of two groups forms
/// that set through a cheaper one. The conv's input comes only from `p` and its result goes
/// only to `q`, so the three merge without a cycle when `p` feeds nothing
/// else.
fn layout_views_of_convs(
    state: &State<'_>,
    consumers: &[Vec<usize>],
) -> Vec<(usize, usize, usize)> {
    let graph = state.graph;
    let lone = |g: usize, kind: OpKind| matches!(state.members[g].as_slice(), [op] if graph.op(*op).kind == kind);
    let mut triples = Vec::new();
    for (c, members) in state.members.iter().enumerate() {
        // The convolution, alone or with its filter's view.
        let conv = match *members.as_slice() {
            [conv] => conv,
            [a, b] if is_filter_view(graph, a, b) => b,
            _ => continue,
        };
        let d = graph.op(conv);
        if !matches!(
            d.kind,
            OpKind::Conv2d | OpKind::Maxpool2d | OpKind::Avgpool2d
        ) {
            continue;
        }
        let ValueDef::OpResult { op: input, .. } = graph.value(d.operands[0]).def else {
            continue;
        };
        let Some(&p) = state.group_of.get(&input) else {
            continue;
        };
        if !lone(p, OpKind::Transpose) || consumers[p] != [c] || consumers[c].len() != 1 {
            continue;
        }
        let q = consumers[c][0];
        let only_q = state.users.get(&d.results[0]).is_some_and(|u| u.len() == 1);
        if lone(q, OpKind::Transpose) && only_q {
            triples.push((p, c, q));
        }
    }
    triples
}

/// Whether `op` is `transpose {perm = [0, 3, 1, 2]}` whose result is
/// convolution `user`'s filter (a KRSC filter read as KCRS).
fn is_filter_view(graph: &Graph, op: OpId, user: OpId) -> bool {
    let (d, u) = (graph.op(op), graph.op(user));
    d.kind == OpKind::Transpose
        && d.attrs.ints("perm") == Some(&[0, 3, 1, 2][..])
        && u.kind == OpKind::Conv2d
        && u.operands[1] == d.results[0]
}

/// Each group `c` holding one softmax and no contraction between a group
/// `p` holding the matmul it reads (the scores, through any epilogue) and a
/// group `q` holding the matmul that takes its probabilities as rows, as
/// `(p, c, q)`: attention is one kernel only whole (each half prices as a
/// pass over the scores), so no merge of two groups reaches it through a
/// cheaper one. `p` feeds only `c` and `c` only `q`, so the three merge
/// without a cycle.
fn attention_triples(state: &State<'_>, consumers: &[Vec<usize>]) -> Vec<(usize, usize, usize)> {
    let graph = state.graph;
    let holds = |g: usize, kind: OpKind| {
        state.members[g]
            .iter()
            .filter(|&&o| graph.op(o).kind == kind)
            .count()
    };
    let mut triples = Vec::new();
    for (c, members) in state.members.iter().enumerate() {
        if holds(c, OpKind::Softmax) != 1
            || holds(c, OpKind::Matmul) != 0
            || consumers[c].len() != 1
        {
            continue;
        }
        let softmax = members
            .iter()
            .copied()
            .find(|&o| graph.op(o).kind == OpKind::Softmax)
            .expect("counted above");
        let probabilities = graph.op(softmax).results[0];
        let q = consumers[c][0];
        let takes_rows = state.members[q].iter().any(|&o| {
            let d = graph.op(o);
            d.kind == OpKind::Matmul && d.operands[0] == probabilities
        });
        // The groups c reads from that hold a matmul.
        let mut producers: Vec<usize> = members
            .iter()
            .flat_map(|&o| graph.op(o).operands.iter())
            .filter_map(|&v| match graph.value(v).def {
                ValueDef::OpResult { op, .. } => state.group_of.get(&op).copied(),
                ValueDef::BlockArg { .. } => None,
            })
            .filter(|&g| g != c && holds(g, OpKind::Matmul) == 1)
            .collect();
        producers.sort_unstable();
        producers.dedup();
        if let ([p], true) = (producers.as_slice(), takes_rows)
            && consumers[*p] == [c]
        {
            triples.push((*p, c, q));
        }
    }
    triples
}

/// The error for an op the target lowers in no group, not even alone.
fn no_kernel(graph: &Graph, op: OpId, refusal: &Refusal) -> String {
    let d = graph.op(op);
    let named = d
        .results
        .first()
        .map(|&r| format!(" %{}", graph.value(r).name))
        .unwrap_or_default();
    format!("`{}`{named} has no kernel: {refusal}", d.kind.name())
}

/// One greedy search from every op its own group (no merge at all unless
/// `merge`); merges the target refused (in `state.verdicts`) are not made.
fn search(
    state: &mut State<'_>,
    model: &dyn Estimator,
    target: &dyn Target,
    merge: bool,
) -> Result<Plan, String> {
    let graph = state.graph;
    state.group_of.clear();
    state.members.clear();
    for &op in &graph.block(graph.body()).ops {
        if !is_free(graph.op(op).kind) {
            state.group_of.insert(op, state.members.len());
            state.members.push(vec![op]);
        }
    }
    if !merge {
        return finish(state, model, Vec::new());
    }
    views_with_their_consumers(state, model, target)?;
    let mut rejections;
    loop {
        // The round's producer → consumer pairs, with the union of each that
        // would not close a cycle; those unions and both sides go to the
        // estimator at once.
        let mut pairs: Vec<(usize, usize, Option<Vec<OpId>>)> = Vec::new();
        let mut wanted = Vec::new();
        // Each group's consumers, found once for the round's cycle checks.
        let consumers: Vec<Vec<usize>> = (0..state.members.len())
            .map(|g| match state.members[g].is_empty() {
                true => Vec::new(),
                false => state.consumers(g),
            })
            .collect();
        for p in 0..state.members.len() {
            for &c in &consumers[p] {
                if reachable_through_other(&consumers, p, c) {
                    pairs.push((p, c, None));
                    continue;
                }
                let (pp, cc) = (state.members[p].clone(), state.members[c].clone());
                let merged = state.sorted([pp.clone(), cc.clone()].concat());
                wanted.extend([merged.clone(), pp, cc]);
                pairs.push((p, c, Some(merged)));
            }
        }
        let mut triples = layout_views_of_convs(state, &consumers);
        triples.extend(attention_triples(state, &consumers));
        for (p, c, q) in &triples {
            let merged = state.sorted(
                [*p, *c, *q]
                    .iter()
                    .flat_map(|&g| state.members[g].clone())
                    .collect(),
            );
            wanted.extend([merged, state.members[*q].clone()]);
        }
        state.prefetch(model, wanted);
        rejections = Vec::new();
        let mut saving: Vec<(f64, Vec<usize>, Vec<OpId>)> = Vec::new();
        for (p, c, q) in triples {
            let merged = state.sorted(
                [p, c, q]
                    .iter()
                    .flat_map(|&g| state.members[g].clone())
                    .collect(),
            );
            let apart: f64 = [p, c, q]
                .iter()
                .map(|&g| {
                    let ops = state.members[g].clone();
                    state
                        .estimate(model, &ops)
                        .map_or(f64::INFINITY, |e| e.time)
                })
                .sum();
            // Its failures are the pairs' to report.
            if let Ok(e) = state.estimate(model, &merged)
                && e.time < apart
            {
                saving.push((apart - e.time, vec![p, c, q], merged));
            }
        }
        for (p, c, merged) in pairs {
            let (producer, consumer) = (state.members[p][0], state.members[c][0]);
            let reject = |reason: Rejected| Rejection {
                producer,
                consumer,
                reason,
            };
            let Some(merged) = merged else {
                rejections.push(reject(Rejected::Cycle));
                continue;
            };
            if [producer, consumer]
                .iter()
                .any(|&o| state.storage.is_stored(o))
            {
                rejections.push(reject(Rejected::StoredConcat));
                continue;
            }
            let (pp, cc) = (state.members[p].clone(), state.members[c].clone());
            let separate = state
                .estimate(model, &pp)
                .map(|e| e.time)
                .unwrap_or(f64::INFINITY)
                + state
                    .estimate(model, &cc)
                    .map(|e| e.time)
                    .unwrap_or(f64::INFINITY);
            match state.estimate(model, &merged) {
                Err(reason) => rejections.push(reject(Rejected::Illegal(reason))),
                Ok(e) if e.time >= separate => rejections.push(reject(Rejected::Slower {
                    merged: e.time,
                    apart: separate,
                })),
                Ok(e) => saving.push((separate - e.time, vec![p, c], merged)),
            }
        }
        // Best saving first. Savings within SAVING_TIE are equal (a copy
        // kernel priced a few ns above an epilogue must not decide), and a
        // stable sort keeps the first of equal savings first: the earliest
        // producer's.
        let tie = |s: f64| (s / SAVING_TIE).round();
        saving.sort_by(|a, b| tie(b.0).total_cmp(&tie(a.0)));
        let mut best = None;
        for (_, joined, merged) in saving {
            let p = joined[0];
            match state.verdict(model, target, p, &merged)? {
                Ok(()) => {
                    best = Some((joined, merged));
                    break;
                }
                Err(refusal) => rejections.push(Rejection {
                    producer: state.members[p][0],
                    consumer: state.members[joined[1]][0],
                    reason: Rejected::Target(refusal),
                }),
            }
        }
        let Some((joined, merged)) = best else { break };
        let p = joined[0];
        for &op in &merged {
            state.group_of.insert(op, p);
        }
        state.members[p] = merged;
        for &g in &joined[1..] {
            state.members[g].clear();
        }
    }
    finish(state, model, rejections)
}

/// Orders the groups producers-first and attaches their estimates.
fn finish(
    state: &mut State<'_>,
    model: &dyn Estimator,
    rejections: Vec<Rejection>,
) -> Result<Plan, String> {
    let live: Vec<usize> = (0..state.members.len())
        .filter(|&g| !state.members[g].is_empty())
        .collect();
    // Kahn's algorithm over groups, ties by first op position.
    let mut indegree: FxHashMap<usize, usize> = live.iter().map(|&g| (g, 0)).collect();
    let consumers: FxHashMap<usize, Vec<usize>> =
        live.iter().map(|&g| (g, state.consumers(g))).collect();
    for cs in consumers.values() {
        for c in cs {
            *indegree.get_mut(c).expect("consumer is live") += 1;
        }
    }
    let first = |g: usize, s: &State<'_>| s.position[&s.members[g][0]];
    let mut ready: Vec<usize> = live.iter().copied().filter(|g| indegree[g] == 0).collect();
    let mut order = Vec::new();
    while !ready.is_empty() {
        ready.sort_by_key(|&g| std::cmp::Reverse(first(g, state)));
        let g = ready.pop().expect("not empty");
        order.push(g);
        for &c in &consumers[&g] {
            let d = indegree.get_mut(&c).expect("live");
            *d -= 1;
            if *d == 0 {
                ready.push(c);
            }
        }
    }
    if order.len() != live.len() {
        return Err("the groups form a cycle (a planner bug)".to_string());
    }
    let mut sets: Vec<Vec<OpId>> = order.iter().map(|&g| state.members[g].clone()).collect();
    sets.extend(sets.clone().into_iter().flatten().map(|op| vec![op]));
    state.prefetch(model, sets);
    let mut groups = Vec::with_capacity(order.len());
    for g in order {
        let ops = state.members[g].clone();
        let mut estimate = state.estimate(model, &ops)?;
        if let [op] = ops.as_slice()
            && state.storage.is_stored(*op)
        {
            // A view: its producers' stores are the whole cost.
            estimate.time = 0.0;
            estimate.bytes = 0;
        }
        let group = state.form(&ops)?;
        let mut unfused_time = 0.0;
        for &op in &ops {
            unfused_time += state.estimate(model, &[op]).map(|e| e.time)?;
        }
        groups.push(PlannedGroup {
            group,
            estimate,
            unfused_time,
            adapted: Vec::new(),
        });
    }
    Ok(Plan { groups, rejections })
}
