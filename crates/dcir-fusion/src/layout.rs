//! The layout decision: a graph with convolutions is planned as written
//! (NCHW) and in its channels-last form ([`CHANNELS_LAST_PIPELINE`]), and
//! the plan the cost model prices faster
//! (channels-last by at least [`CHANNELS_LAST_MARGIN`], or
//! [`CHANNELS_LAST_PART_MARGIN`] over the groups the two plans do not
//! share) is kept, with both
//! estimates for `--emit plan` to show. Either form is
//! planned with its shared views made one per user first
//! ([`unshare_views`]).

use std::collections::BTreeMap;

use dcir_ir::{Graph, Module, OpKind};
use dcir_passes::{Instrumentation, PassManager, PassRegistry, build_pipeline};

use crate::planner::{Plan, PlannedGroup};

/// Which layouts the planner may run a graph's activations in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LayoutMode {
    /// As written, or channels-last where the cost model prices it faster.
    #[default]
    Auto,
    /// As written (ONNX's NCHW for CNNs).
    AsWritten,
    /// Channels-last wherever the pass applies.
    ChannelsLast,
}

impl LayoutMode {
    /// The mode named `name` (`auto`, `as-written`, `channels-last`).
    pub fn parse(name: &str) -> Option<LayoutMode> {
        match name {
            "auto" => Some(LayoutMode::Auto),
            "as-written" => Some(LayoutMode::AsWritten),
            "channels-last" => Some(LayoutMode::ChannelsLast),
            _ => None,
        }
    }

    /// The names [`LayoutMode::parse`] takes.
    pub const NAMES: &[&str] = &["auto", "as-written", "channels-last"];
}

/// The pipeline that makes a graph's channels-last form: the activations
/// between convolutions, then the graph's inputs that convolutions read
/// (after `canonicalize`, which would fold those transposes away).
pub const CHANNELS_LAST_PIPELINE: &str = "channels-last,canonicalize,cse,dce,nhwc-inputs";

/// What the layout decision saw and chose for one graph.
#[derive(Clone, Debug, PartialEq)]
pub struct LayoutChoice {
    /// The plan kept runs the channels-last form.
    pub channels_last: bool,
    /// The as-written plan's estimate, seconds (`None` when not planned).
    pub as_written: Option<f64>,
    /// The channels-last plan's estimate, seconds (`None` when not planned:
    /// the mode excludes it, or the pass changes nothing).
    pub channels_last_time: Option<f64>,
    /// The part of both estimates in groups the two plans run alike,
    /// seconds (`None` unless both were planned), left out of the
    /// comparison.
    pub shared_time: Option<f64>,
}

impl std::fmt::Display for LayoutChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let chosen = if self.channels_last {
            "channels-last"
        } else {
            "as written"
        };
        write!(f, "layout: {chosen}")?;
        if let (Some(a), Some(c)) = (self.as_written, self.channels_last_time) {
            write!(
                f,
                " (estimated {:.2} us as written, {:.2} us channels-last",
                a * 1e6,
                c * 1e6
            )?;
            if let Some(s) = self.shared_time {
                write!(f, ", {:.2} us of both in groups they share", s * 1e6)?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}

/// The channels-last form of `graph`, or `None` when the pass leaves it as
/// it is (no convolution, no NCHW activation).
pub fn channels_last_form(graph: &Graph) -> Result<Option<Graph>, String> {
    let registry = PassRegistry::with_builtins();
    let passes = build_pipeline(&registry, CHANNELS_LAST_PIPELINE)
        .map_err(|e| e.render(CHANNELS_LAST_PIPELINE))?;
    let mut module = Module::new();
    module.graphs.push(graph.clone());
    let records = PassManager::new(passes, Instrumentation::default())
        .run(&mut module, &mut std::io::sink())
        .map_err(|e| format!("channels-last: {e}"))?;
    let changed = records.first().is_some_and(|r| r.changed);
    Ok(changed.then(|| module.graphs.remove(0)))
}

/// How much faster the channels-last plan must be estimated to replace the
/// plan as written: closer than this, the estimates do not tell the two
/// apart (ResNet-50 f32 at batch 1, estimated 1 % faster channels-last, ran
/// 17 % slower on an H100, 2026-12-06), and the graph as written moves no
/// data through layout transposes.
pub const CHANNELS_LAST_MARGIN: f64 = 1.1;

/// How much faster the channels-last plan's own groups (those the two plans
/// do not share: [`shared_time`]) may instead be estimated than those they
/// replace: a large gain on a small part of the graph, as a transformer's
/// one patchifying convolution (ViT-B/16 f16 at batch 32: 145 us as
/// written, 56 channels-last, of 4.1 ms; at batch 1, 1.55× over its
/// differing groups, ran 1.22× faster on an H100, 2026-12-07). Below it the
/// estimates of many convolutions err either way (ConvNeXt-S f16 at batch
/// 1, 1.18× over its differing groups, ran 1.25× slower).
pub const CHANNELS_LAST_PART_MARGIN: f64 = 1.5;

/// Plans `graph` with `plan` in the layouts `mode` allows and keeps the
/// plan estimated fastest, as written unless channels-last is estimated
/// [`CHANNELS_LAST_MARGIN`] times faster, or its own groups
/// [`CHANNELS_LAST_PART_MARGIN`] times faster than those they replace: the
/// graph the plan is of, the plan and what was chosen.
pub fn plan_layout(
    graph: &Graph,
    mode: LayoutMode,
    mut plan: impl FnMut(&Graph) -> Result<Plan, String>,
) -> Result<(Graph, Plan, LayoutChoice), String> {
    let nhwc = match mode {
        LayoutMode::AsWritten => None,
        LayoutMode::Auto | LayoutMode::ChannelsLast => {
            channels_last_form(graph)?.map(|g| unshare_views(&g))
        }
    };
    let graph = &unshare_views(graph);
    let Some(nhwc) = nhwc else {
        let p = plan(graph)?;
        let choice = LayoutChoice {
            channels_last: false,
            as_written: Some(p.total_time()),
            channels_last_time: None,
            shared_time: None,
        };
        return Ok((graph.clone(), p, choice));
    };
    let cl = plan(&nhwc)?;
    if mode == LayoutMode::ChannelsLast {
        let choice = LayoutChoice {
            channels_last: true,
            as_written: None,
            channels_last_time: Some(cl.total_time()),
            shared_time: None,
        };
        return Ok((nhwc, cl, choice));
    }
    let aw = plan(graph)?;
    let shared = shared_time(graph, &aw, &nhwc, &cl);
    let choice = LayoutChoice {
        channels_last: cl.total_time() * CHANNELS_LAST_MARGIN < aw.total_time()
            || (cl.total_time() - shared) * CHANNELS_LAST_PART_MARGIN < aw.total_time() - shared,
        as_written: Some(aw.total_time()),
        channels_last_time: Some(cl.total_time()),
        shared_time: Some(shared),
    };
    Ok(match choice.channels_last {
        true => (nhwc, cl, choice),
        false => (graph.clone(), aw, choice),
    })
}

/// The estimated time of the groups plans `a` (of graph `ag`) and `b` (of
/// `bg`) run alike: the same op kinds, arithmetic, bytes and estimate,
/// counted once per pair, seconds.
fn shared_time(ag: &Graph, a: &Plan, bg: &Graph, b: &Plan) -> f64 {
    let key = |g: &Graph, p: &PlannedGroup| {
        let kinds: Vec<&str> = p.group.ops.iter().map(|&o| g.op(o).kind.name()).collect();
        let e = &p.estimate;
        (kinds, e.flops, e.bytes, e.time.to_bits())
    };
    let mut unmatched: BTreeMap<_, usize> = BTreeMap::new();
    for p in &a.groups {
        *unmatched.entry(key(ag, p)).or_default() += 1;
    }
    let mut shared = 0.0;
    for p in &b.groups {
        if let Some(n) = unmatched.get_mut(&key(bg, p)).filter(|n| **n > 0) {
            *n -= 1;
            shared += p.estimate.time;
        }
    }
    shared
}

/// `graph` with every shared view a kernel reads for free made one per user
/// (each copy placed just before its user): a `broadcast`, and a
/// `transpose` from NHWC to NCHW (the `channels-last` pass's `T⁻¹`). A view
/// is an index map a kernel recomputes, so each copy fuses into its user's
/// kernel, where one shared view (as `cse` leaves it) would be a kernel
/// writing the whole tensor for the others to read — and a convolution's
/// input transpose shared by several convolutions (DeepLabV3's ASPP
/// branches) keeps each from forming its NHWC library call.
pub fn unshare_views(graph: &Graph) -> Graph {
    let mut g = graph.clone();
    let body = g.body();
    let ops = g.block(body).ops.clone();
    for op in ops {
        let d = g.op(op);
        let to_nchw =
            d.kind == OpKind::Transpose && d.attrs.ints("perm") == Some(&[0, 3, 1, 2][..]);
        if d.kind != OpKind::Broadcast && !to_nchw {
            continue;
        }
        let result = g.op(op).results[0];
        let users: Vec<_> = g
            .block(body)
            .ops
            .iter()
            .flat_map(|&u| {
                let operands = &g.op(u).operands;
                (0..operands.len())
                    .filter(move |&i| operands[i] == result)
                    .map(move |i| (u, i))
            })
            .filter(|&(u, _)| g.op(u).kind != OpKind::Return)
            .collect();
        for &(user, index) in users.iter().skip(1) {
            let d = g.op(op).clone();
            let name = g.fresh_name(&g.value(result).name.clone());
            let ty = g.ty(result).clone();
            let copy = g
                .create_op(d.kind, d.operands, d.attrs, vec![(name, ty)])
                .expect("a fresh name is unique");
            g.op_mut(copy).loc = d.loc;
            let at = g
                .block(body)
                .ops
                .iter()
                .position(|&o| o == user)
                .expect("the user is in the body");
            g.insert_op(body, at, copy);
            let v = g.op(copy).results[0];
            g.op_mut(user).operands[index] = v;
        }
    }
    g
}
