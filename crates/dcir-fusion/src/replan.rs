//! The plan of an already fused graph, read back from its `fused` ops: what
//! `dcir-opt --emit plan|dot` prints for fused input.
//!
//! The graph is flattened (each region's ops inlined in place of its `fused`
//! op) and each region becomes a group of the flat graph, of the kind and
//! level its ops form. A group is estimated with the parameters its `fused`
//! op records when the cost model enumerates them, else with the model's own
//! choice; ops outside any `fused` op are groups of their own.

use dcir_ir::{Attrs, Graph, GraphBuilder, OpId, OpKind, ValueDef, ValueId};
use rustc_hash::FxHashMap;

use crate::cost::{CostModel, Estimate, Estimator};
use crate::group::Group;
use crate::legality::check_group;
use crate::planner::{Plan, PlannedGroup};

/// The attributes of a `fused` op that are not kernel parameters (the
/// group's kind and fusion level); the others are.
pub const GROUP_ATTRS: [&str; 2] = ["kind", "level"];

/// The flat form of fused `graph` and its plan: one group per `fused` op
/// (and per op outside one that does work), in body order.
pub fn fused_plan(graph: &Graph, model: &CostModel) -> Result<(Graph, Plan), String> {
    let text = |e: dcir_ir::BuildError| e.to_string();
    let mut b = GraphBuilder::new(graph.name());
    let mut map: FxHashMap<ValueId, ValueId> = FxHashMap::default();
    for &p in graph.params() {
        let v = b
            .param(&graph.value(p).name, graph.ty(p).clone())
            .map_err(text)?;
        map.insert(p, v);
    }
    // Per group: the flat values its ops define, and the fused op's attributes.
    let mut groups: Vec<(Vec<ValueId>, Option<Attrs>)> = Vec::new();
    let mut outputs = Vec::new();
    for &op in &graph.block(graph.body()).ops {
        let d = graph.op(op);
        let operands: Vec<ValueId> = d.operands.iter().map(|v| map[v]).collect();
        match (d.kind, d.region) {
            (OpKind::Return, _) => outputs = operands,
            (OpKind::Fused, Some(region)) => {
                let block = graph.block(region);
                for (&arg, &outer) in block.args.iter().zip(&operands) {
                    map.insert(arg, outer);
                }
                let mut defined = Vec::new();
                for &inner in &block.ops {
                    let id = graph.op(inner);
                    let args: Vec<ValueId> = id.operands.iter().map(|v| map[v]).collect();
                    if id.kind == OpKind::Yield {
                        for (&r, &y) in d.results.iter().zip(&args) {
                            map.insert(r, y);
                        }
                        continue;
                    }
                    let ty = graph.ty(id.results[0]).clone();
                    let v = b
                        .op_declared(id.kind, &args, id.attrs.clone(), ty)
                        .map_err(text)?;
                    map.insert(id.results[0], v);
                    defined.push(v);
                }
                groups.push((defined, Some(d.attrs.clone())));
            }
            _ => {
                let ty = graph.ty(d.results[0]).clone();
                let v = b
                    .op_declared(d.kind, &operands, d.attrs.clone(), ty)
                    .map_err(text)?;
                map.insert(d.results[0], v);
                if d.kind != OpKind::Constant {
                    groups.push((vec![v], None));
                }
            }
        }
    }
    let flat = b.finish(&outputs).map_err(text)?;
    let op_of = |v: &ValueId| match flat.value(*v).def {
        ValueDef::OpResult { op, .. } => op,
        ValueDef::BlockArg { .. } => unreachable!("a defined value"),
    };
    let mut planned = Vec::new();
    for (values, attrs) in groups {
        let ops: Vec<OpId> = values.iter().map(op_of).collect();
        if ops.is_empty() {
            continue;
        }
        let (kind, level) = check_group(&flat, &ops)?;
        let group = Group { ops, kind, level };
        let estimate = match attrs {
            Some(attrs) => recorded_estimate(model, &flat, &group, &attrs)?,
            None => model.estimate(&flat, &group)?,
        };
        let unfused_time = model.separate_time(&flat, &group.ops)?;
        planned.push(PlannedGroup {
            group,
            estimate,
            unfused_time,
            adapted: Vec::new(),
        });
    }
    Ok((
        flat,
        Plan {
            groups: planned,
            rejections: Vec::new(),
        },
    ))
}

/// The estimate of `group` with the kernel parameters `attrs` record, when
/// the model enumerates them; else the model's own choice. A library call's
/// `heuristic_rank` (which the model does not tell apart) is kept as
/// recorded.
fn recorded_estimate(
    model: &CostModel,
    graph: &Graph,
    group: &Group,
    attrs: &Attrs,
) -> Result<Estimate, String> {
    let mut estimate = model.estimate(graph, group)?;
    let recorded = attrs
        .iter()
        .filter(|(name, _)| !GROUP_ATTRS.contains(name) && *name != "heuristic_rank")
        .count();
    let matching = model.candidates(graph, group)?.into_iter().find(|c| {
        c.params.0.len() == recorded
            && c.params
                .0
                .iter()
                .all(|(name, value)| attrs.get(name) == Some(value))
    });
    if let Some(c) = matching {
        estimate.time = c.time;
        estimate.pul = c.factors.pul();
        estimate.bound = c.bound;
        estimate.params = c.params;
        if let Some(rank) = attrs.get("heuristic_rank") {
            estimate.params.0.push(("heuristic_rank", rank.clone()));
        }
    }
    Ok(estimate)
}
