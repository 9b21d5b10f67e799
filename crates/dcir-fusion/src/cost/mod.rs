//! The performance model: for a group and a choice of kernel parameters, the
//! DeepCuts upper-limit factors and a roofline time estimate.
//!
//! - `shape`: what a group reads, writes and computes (compulsory traffic,
//!   flops, the problem shape of its anchor ops);
//! - `space`: the kernel parameters each [`crate::GroupKind`] may take, and
//!   per candidate the per-block quantities the factors need;
//! - `pul`: occupancy, the four factors (GMRatio, SMRatio, WBRatio, COEF_r)
//!   and the time estimate.
//!
//! Every formula, its units and its derivation are in `docs/cost-model.md`.
//! The model is deterministic: candidates are enumerated in a fixed order and
//! ties are broken by that order.

mod pul;
mod shape;
mod space;

use dcir_ir::{Attr, Graph, OpId, OpKind};

use crate::device::DeviceSpec;
use crate::group::Group;
use crate::legality::{GroupKind, Level, group_kind};
use crate::library::{self, Libraries, LibraryCost};
use crate::target::Reason;

use shape::GroupInfo;

pub use pul::{Factors, SATURATING_WARPS, blocks_per_sm, wave_efficiency};

/// Implementation parameters of one kernel, as the attributes the emitter
/// reads (`tile = [128, 64, 32]`, `threads = 256`, ...), in a fixed order.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelParams(pub Vec<(&'static str, Attr)>);

impl KernelParams {
    /// The parameter `name`, if present.
    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, a)| a)
    }

    /// `name = value, ...` in order, for explanations and snapshots.
    pub fn describe(&self) -> String {
        self.0
            .iter()
            .map(|(n, a)| {
                let v = match a {
                    Attr::Int(i) => i.to_string(),
                    Attr::Float(f) => f.to_string(),
                    Attr::Bool(b) => b.to_string(),
                    Attr::Str(s) => format!("{s:?}"),
                    Attr::Ints(v) => format!("{v:?}"),
                    Attr::Floats(v) => format!("{v:?}"),
                };
                format!("{n} = {v}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What limits a kernel, by the roofline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Moving bytes through device memory.
    Memory,
    /// Arithmetic.
    Compute,
    /// Launch overhead (tiny kernels).
    Launch,
    /// A block's chain of dependent loads (few blocks, each waiting on
    /// round trips to memory one after another).
    Latency,
}

/// The model's answer for one group with its best parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Chosen parameters (best by PUL, then by time).
    pub params: KernelParams,
    /// Estimated time, seconds.
    pub time: f64,
    /// Performance upper limit of the chosen parameters, in (0, 1].
    pub pul: f64,
    /// Arithmetic of the group, flop.
    pub flops: u64,
    /// Bytes the group must move through device memory (inputs once, outputs once).
    pub bytes: u64,
    /// What limits it.
    pub bound: Bound,
    /// Parameter sets for measurement: the chosen one, then the best by
    /// PUL and the fastest by estimated time in turn (at most `2·top_k`).
    pub candidates: Vec<KernelParams>,
    /// How a library call compared, for a group one could run (`None` when
    /// no library was considered).
    pub library: Option<LibraryVerdict>,
}

/// A library call weighed against a kernel of ours, for explanations.
#[derive(Clone, Debug, PartialEq)]
pub enum LibraryVerdict {
    /// The library can run the group: its estimate and our best kernel's,
    /// seconds.
    Priced {
        /// The library (`cublaslt`, `cudnn`).
        library: &'static str,
        /// The call's estimated time.
        library_time: f64,
        /// Our best kernel's.
        kernel_time: f64,
    },
    /// The library cannot run the group, and why.
    Refused {
        /// The library.
        library: &'static str,
        /// Why not.
        reason: crate::target::Reason,
    },
}

/// Estimates the time of a group. The planner asks it for every group it
/// considers; the tuner replaces it with measured times.
pub trait Estimator {
    /// The estimate for `group` of `graph`, or why it cannot run as one kernel
    /// (no parameters fit the device).
    fn estimate(&self, graph: &Graph, group: &Group) -> Result<Estimate, String>;

    /// The estimates for several groups, in order. The planner asks for each
    /// round's groups at once, so an estimator that measures can compile them
    /// together; by default they are estimated one by one.
    fn estimate_all(&self, graph: &Graph, groups: &[Group]) -> Vec<Result<Estimate, String>> {
        groups.iter().map(|g| self.estimate(graph, g)).collect()
    }
}

/// The analytic model over a device.
#[derive(Clone, Debug)]
pub struct CostModel {
    /// The device modelled.
    pub device: DeviceSpec,
    /// How many parameter sets to keep for measurement.
    pub top_k: usize,
    /// The vendor libraries a group may call instead of a kernel of ours.
    pub libraries: Libraries,
}

/// The launch shape of one candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Thread blocks in the grid.
    pub blocks: u64,
    /// Threads per block.
    pub threads: u32,
    /// Shared memory per block, bytes.
    pub shared_bytes: u32,
    /// Registers per thread (estimated).
    pub registers: u32,
    /// Blocks resident on one SM at once (0: the block does not fit).
    pub blocks_per_sm: u32,
}

/// One parameter set of a group, fully scored.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The parameters.
    pub params: KernelParams,
    /// Grid, block and resource use.
    pub launch: Launch,
    /// The DeepCuts factors; `factors.pul()` ranks candidates.
    pub factors: Factors,
    /// Estimated time, seconds (infinite when `coef_r` is 0).
    pub time: f64,
    /// What limits it.
    pub bound: Bound,
    /// Bytes moved through device memory with these parameters (compulsory
    /// traffic plus modelled re-reads).
    pub dram_bytes: f64,
}

impl CostModel {
    /// The model of `device`, keeping 4 candidates for measurement, with
    /// every library it knows.
    pub fn new(device: DeviceSpec) -> CostModel {
        CostModel {
            device,
            top_k: 4,
            libraries: Libraries::ALL,
        }
    }

    /// The model of `device` for dcir's own kernels only: no library call
    /// is priced or chosen (what tests of the emitter's families plan with).
    pub fn kernels_only(device: DeviceSpec) -> CostModel {
        CostModel {
            libraries: Libraries::NONE,
            ..CostModel::new(device)
        }
    }

    /// `time` of a kernel of ours of `kind` with `params` and `bound`, as it
    /// runs: a tensor-core kernel, a compute-bound GEMM on FMA, or an
    /// attention, contraction-chain or depthwise → pointwise kernel on FMA, at the fraction of
    /// its roofline such kernels were measured to reach (candidates are
    /// ranked at the full roofline, which orders them alike;
    /// docs/cost-model.md, "Fitted efficiencies").
    fn as_run(&self, kind: GroupKind, params: &KernelParams, bound: Bound, time: f64) -> f64 {
        let tensor_core = params.get("math").and_then(Attr::as_str) == Some("tensor_core");
        let wgmma = params.get("mainloop").and_then(Attr::as_str) == Some("wgmma");
        let fraction = match (kind, tensor_core) {
            (_, true) if wgmma => self.device.wgmma_fraction,
            (GroupKind::Conv, true) => self.device.mma_sync_conv_fraction,
            (GroupKind::Attention, true) => self.device.mma_sync_attention_fraction,
            (_, true) if bound == Bound::Compute => self.device.mma_sync_compute_fraction,
            (_, true) => self.device.mma_sync_fraction,
            (GroupKind::Attention, false) => self.device.fma_attention_fraction,
            (GroupKind::DepthwisePointwise, false) => self.device.fma_depthwise_pointwise_fraction,
            (GroupKind::ContractionChain, false) => self.device.fma_chain_fraction,
            (GroupKind::Gemm, false) if bound == Bound::Compute => {
                self.device.simt_gemm_compute_fraction
            }
            _ => return time,
        };
        let launch = self.device.launch_overhead;
        launch + (time - launch).max(0.0) / fraction
    }

    /// The library call that could run `group` and its cost, or why none
    /// can (`None` when no library this model may call runs its kind).
    fn library(
        &self,
        graph: &Graph,
        group: &Group,
        info: &GroupInfo,
    ) -> Option<(&'static str, Result<PricedCall, Reason>)> {
        match group.kind {
            GroupKind::Gemm if self.libraries.cublaslt => Some((
                library::CUBLASLT,
                library::offered_gemm(&self.libraries, graph, &group.ops, &info.outputs).map(
                    |call| {
                        let cost = library::library_cost(&self.device, graph, &call);
                        (library_params(library::CUBLASLT), cost)
                    },
                ),
            )),
            GroupKind::Conv if self.libraries.cudnn => Some((
                library::CUDNN,
                library::offered_conv(&self.libraries, graph, &group.ops, &info.outputs).map(
                    |call| {
                        let cost = library::conv_cost(&self.device, graph, &call);
                        (library_params(library::CUDNN), cost)
                    },
                ),
            )),
            _ => None,
        }
    }

    /// Every parameter set of `group`'s kind, scored, in enumeration order
    /// (those that do not fit the device included, with `coef_r = 0`).
    pub fn candidates(&self, graph: &Graph, group: &Group) -> Result<Vec<Candidate>, String> {
        let info = shape::analyze(graph, group)?;
        let cands = space::enumerate(&self.device, &info);
        let mut all: Vec<Candidate> = cands
            .iter()
            .map(|c| {
                let s = pul::score(&self.device, &info, c);
                let params = c.params.to_params();
                Candidate {
                    time: self.as_run(group.kind, &params, s.bound, s.time),
                    params,
                    launch: s.launch,
                    factors: s.factors,
                    bound: s.bound,
                    dram_bytes: s.dram_bytes,
                }
            })
            .collect();
        // A library call last: it has no launch shape of ours.
        if let Some((_, Ok((params, cost)))) = self.library(graph, group, &info) {
            all.push(Candidate {
                params,
                launch: Launch {
                    blocks: 0,
                    threads: 0,
                    shared_bytes: 0,
                    registers: 0,
                    blocks_per_sm: 0,
                },
                factors: Factors {
                    gm: 1.0,
                    sm: 1.0,
                    wb: cost.fill,
                    lat: 1.0,
                    coef_r: 1.0,
                },
                time: cost.time,
                bound: cost.bound,
                dram_bytes: cost.bytes,
            });
        }
        Ok(all)
    }

    /// The estimate for `op` run alone as its own kernel (group kind from
    /// [`group_kind`]). A `constant` alone costs nothing: it is materialized
    /// where it is used.
    pub fn unfused(&self, graph: &Graph, op: OpId) -> Result<Estimate, String> {
        let kind = group_kind(graph, &[op])?;
        let group = Group {
            ops: vec![op],
            kind,
            level: Level::Register,
        };
        self.estimate(graph, &group)
    }

    /// The estimated time of `op` alone, seconds (see [`CostModel::unfused`]).
    pub fn unfused_time(&self, graph: &Graph, op: OpId) -> Result<f64, String> {
        self.unfused(graph, op).map(|e| e.time)
    }

    /// The estimated time of running each op of `ops` as its own kernel,
    /// summed: the "separate" side of a merge decision.
    pub fn separate_time(&self, graph: &Graph, ops: &[OpId]) -> Result<f64, String> {
        ops.iter().map(|&o| self.unfused_time(graph, o)).sum()
    }
}

/// A library call's parameters and its estimate.
type PricedCall = (KernelParams, LibraryCost);

/// The parameters of a call of `library`.
fn library_params(library: &str) -> KernelParams {
    KernelParams(vec![("library", Attr::Str(library.into()))])
}

/// A ranked candidate: enumeration index, score, parameters, block intensity.
type Ranked = (usize, pul::Scored, space::P, f64);

/// How much faster than the PUL ranking's choice a candidate must be
/// estimated to replace it: closer than this, the estimates do not tell
/// the two apart.
const CLEARLY_FASTER: f64 = 1.1;

impl Estimator for CostModel {
    fn estimate(&self, graph: &Graph, group: &Group) -> Result<Estimate, String> {
        if !group.ops.is_empty()
            && group
                .ops
                .iter()
                .all(|&o| graph.op(o).kind == OpKind::Constant)
        {
            return Ok(Estimate {
                params: KernelParams(Vec::new()),
                time: 0.0,
                pul: 1.0,
                flops: 0,
                bytes: 0,
                bound: Bound::Launch,
                candidates: Vec::new(),
                library: None,
            });
        }
        let info = shape::analyze(graph, group)?;
        // The top k by PUL: best PUL first; equal PUL by time, then by the
        // block's operational intensity (less traffic through L2), then
        // enumeration order. Beside it the top k by estimated time (ties
        // the same way). Both kept by insertion while enumerating (k is small).
        let k = self.top_k.max(1);
        let by_pul = |a: &Ranked, b: &Ranked| {
            b.1.factors
                .pul()
                .total_cmp(&a.1.factors.pul())
                .then(a.1.time.total_cmp(&b.1.time))
                .then(b.3.total_cmp(&a.3))
                .then(a.0.cmp(&b.0))
                .is_lt()
        };
        let by_time = |a: &Ranked, b: &Ranked| {
            a.1.time
                .total_cmp(&b.1.time)
                .then(b.1.factors.pul().total_cmp(&a.1.factors.pul()))
                .then(b.3.total_cmp(&a.3))
                .then(a.0.cmp(&b.0))
                .is_lt()
        };
        let keep =
            |list: &mut Vec<Ranked>, item: &Ranked, before: &dyn Fn(&Ranked, &Ranked) -> bool| {
                if list.len() == k && !before(item, &list[k - 1]) {
                    return;
                }
                let pos = list.partition_point(|x| before(x, item));
                list.insert(pos, item.clone());
                list.truncate(k);
            };
        // One ranking per mainloop family (Hopper's `wgmma` and the rest):
        // within a family the roofline ranks candidates; between families
        // their times as run (each one's fitted fraction of the roofline)
        // decide, below.
        let mut scored: [Vec<Ranked>; 2] = Default::default();
        let mut fastest: [Vec<Ranked>; 2] = Default::default();
        let mut index = 0;
        space::for_each(&self.device, &info, &mut |c| {
            let i = index;
            index += 1;
            let s = pul::score(&self.device, &info, &c);
            if s.factors.coef_r == 0.0 {
                return;
            }
            let family = usize::from(c.params.is_wgmma());
            let item = (i, s, c.params, c.oi);
            keep(&mut scored[family], &item, &by_pul);
            keep(&mut fastest[family], &item, &by_time);
        });
        if scored.iter().all(Vec::is_empty) {
            return Err(format!(
                "no {} kernel parameters fit {}",
                group.kind.name(),
                self.device.name
            ));
        }
        // In each family, the fastest of the PUL top k, unless a candidate
        // is estimated clearly faster: near ties go to PUL, which sees L2
        // traffic and intensity the time does not; a latency-bound group,
        // where those terms do not bind, takes the fastest
        // (docs/cost-model.md, "Ranking and choice").
        let choice = |family: usize| -> Option<(&Ranked, f64)> {
            let best_of_pul = scored[family]
                .iter()
                .enumerate()
                .min_by(|(ra, a), (rb, b)| a.1.time.total_cmp(&b.1.time).then(ra.cmp(rb)))
                .map(|(_, r)| r)?;
            let chosen = match fastest[family].first() {
                Some(f) if f.1.time * CLEARLY_FASTER < best_of_pul.1.time => f,
                _ => best_of_pul,
            };
            let params = chosen.2.to_params();
            Some((
                chosen,
                self.as_run(group.kind, &params, chosen.1.bound, chosen.1.time),
            ))
        };
        // Between the families, the faster as run (a tie to the first).
        let chosen = [choice(0), choice(1)]
            .into_iter()
            .flatten()
            .reduce(|a, b| if b.1 < a.1 { b } else { a })
            .expect("a family has candidates");
        // For measurement: the choice, then each family's PUL and time
        // rankings in turn.
        let mut candidates = vec![chosen.0.2.to_params()];
        for i in 0..k {
            for list in scored.iter().chain(&fastest) {
                if let Some(item) = list.get(i) {
                    let p = item.2.to_params();
                    if !candidates.contains(&p) {
                        candidates.push(p);
                    }
                }
            }
        }
        let ((_, bs, bp, _), time) = chosen;
        let params = bp.to_params();
        let own = Estimate {
            time,
            params,
            pul: bs.factors.pul(),
            flops: info.flops,
            bytes: info.bytes,
            bound: bs.bound,
            candidates,
            library: None,
        };
        // A library call is one more candidate: chosen when estimated
        // clearly faster, measured beside ours either way.
        let own_time = own.time;
        Ok(match self.library(graph, group, &info) {
            Some((library, Ok((params, cost)))) => {
                let verdict = Some(LibraryVerdict::Priced {
                    library,
                    library_time: cost.time,
                    kernel_time: own_time,
                });
                // Near ties go to our kernel, which fuses with its neighbours
                // where a call cannot (the ranking's own margin).
                if cost.time * CLEARLY_FASTER < own_time {
                    let mut candidates = vec![params.clone()];
                    candidates.extend(own.candidates);
                    Estimate {
                        params,
                        time: cost.time,
                        pul: cost.fill,
                        bound: cost.bound,
                        candidates,
                        library: verdict,
                        ..own
                    }
                } else {
                    let mut own = own;
                    own.candidates.insert(1, params);
                    own.library = verdict;
                    own
                }
            }
            Some((library, Err(reason))) => Estimate {
                library: Some(LibraryVerdict::Refused { library, reason }),
                ..own
            },
            None => own,
        })
    }
}
