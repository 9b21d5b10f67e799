//! One fused group as a graph of its own, and its kernel parameters.

use std::collections::{HashMap, HashSet};

use dcir_fusion::{
    Estimate, GROUP_ATTRS, Group, KernelParams, Plan, PlannedGroup, apply_plan, check_group,
};
use dcir_ir::print::format_attr;
use dcir_ir::{Attrs, BuildError, Graph, GraphBuilder, OpId, OpKind, ValueDef, ValueId};

/// The `fused` ops of `graph`'s body, in body order.
pub fn fused_ops(graph: &Graph) -> Vec<OpId> {
    graph
        .block(graph.body())
        .ops
        .iter()
        .copied()
        .filter(|&o| graph.op(o).kind == OpKind::Fused)
        .collect()
}

/// The group's symbol (`g0` of `@g0`).
pub fn symbol(graph: &Graph, op: OpId) -> String {
    graph.op(op).symbol.clone().unwrap_or_default()
}

/// The ops of fused `op`'s region (its `yield` excluded) as a [`Group`],
/// the unit the cost model scores.
pub fn region_group(graph: &Graph, op: OpId) -> Result<Group, String> {
    let region = graph
        .op(op)
        .region
        .ok_or_else(|| format!("@{} has no region", symbol(graph, op)))?;
    let ops: Vec<OpId> = graph
        .block(region)
        .ops
        .iter()
        .copied()
        .filter(|&o| graph.op(o).kind != OpKind::Yield)
        .collect();
    let (kind, level) = check_group(graph, &ops)?;
    Ok(Group { ops, kind, level })
}

/// A graph of fused `op` alone: one parameter per operand, the group with
/// its attributes, its results returned. Kernels of it are those of `op`.
/// Its text names nothing of `graph` (`@group`, `@g`, `%in0`, ...), so two
/// groups that compute alike on alike shapes — the repeated layers of a
/// model — print the same and share their measurements.
pub fn standalone(graph: &Graph, op: OpId) -> Result<Graph, String> {
    let data = graph.op(op);
    let sym = symbol(graph, op);
    let region = data.region.ok_or_else(|| format!("@{sym} has no region"))?;
    let mut b = GraphBuilder::new("group");
    let mut params = Vec::with_capacity(data.operands.len());
    for (i, &v) in data.operands.iter().enumerate() {
        let p = b
            .param(&format!("in{i}"), graph.ty(v).clone())
            .map_err(|e| e.to_string())?;
        params.push(p);
    }
    let results = b
        .fused("g", &params, data.attrs.clone(), |b, args| {
            let block = graph.block(region);
            let mut map: HashMap<ValueId, ValueId> = block
                .args
                .iter()
                .copied()
                .zip(args.iter().copied())
                .collect();
            for &o in &block.ops {
                let od = graph.op(o);
                let operands: Vec<ValueId> = od.operands.iter().map(|v| map[v]).collect();
                if od.kind == OpKind::Yield {
                    return Ok(operands);
                }
                let ty = graph.ty(od.results[0]).clone();
                let r = b.op_declared(od.kind, &operands, od.attrs.clone(), ty)?;
                map.insert(od.results[0], r);
            }
            Ok(Vec::new())
        })
        .map_err(|e| e.to_string())?;
    b.finish(&results).map_err(|e| e.to_string())
}

/// What [`standalone`] gives for `group`, a set of unfused ops of `graph`,
/// once a plan makes it one `fused` op with `estimate`'s parameters: the
/// group's inputs become parameters (constants are copied, as the plan's
/// rewrite copies the small ones into the region), the values it defines
/// that other ops read or the graph returns become its results.
pub fn planned_standalone(
    graph: &Graph,
    group: &Group,
    estimate: &Estimate,
) -> Result<Graph, String> {
    let text = |e: BuildError| e.to_string();
    let mut b = GraphBuilder::new("group");
    let mut map: HashMap<ValueId, ValueId> = HashMap::new();
    for (i, v) in group.inputs(graph).into_iter().enumerate() {
        let ty = graph.ty(v).clone();
        let copy = match graph.value(v).def {
            ValueDef::OpResult { op, .. } if graph.op(op).kind == OpKind::Constant => Some(
                b.op_declared(
                    OpKind::Constant,
                    &[],
                    graph.op(op).attrs.clone(),
                    ty.clone(),
                )
                .map_err(text)?,
            ),
            _ => None,
        };
        let new = match copy {
            Some(c) => c,
            None => b.param(&format!("in{i}"), ty).map_err(text)?,
        };
        map.insert(v, new);
    }
    let inside: HashSet<OpId> = group.ops.iter().copied().collect();
    let mut ops = Vec::with_capacity(group.ops.len());
    let mut outputs = Vec::new();
    for &op in &group.ops {
        let d = graph.op(op);
        let operands: Vec<ValueId> = d.operands.iter().map(|v| map[v]).collect();
        let r = b
            .op_declared(
                d.kind,
                &operands,
                d.attrs.clone(),
                graph.ty(d.results[0]).clone(),
            )
            .map_err(text)?;
        map.insert(d.results[0], r);
        if let ValueDef::OpResult { op: copy, .. } = b.graph().value(r).def {
            ops.push(copy);
        }
        let read_outside = graph
            .block(graph.body())
            .ops
            .iter()
            .any(|&u| !inside.contains(&u) && graph.op(u).operands.contains(&d.results[0]));
        if read_outside {
            outputs.push(r);
        }
    }
    let sub = b.finish(&outputs).map_err(text)?;
    let (kind, level) = check_group(&sub, &ops)?;
    let plan = Plan {
        groups: vec![PlannedGroup {
            group: Group { ops, kind, level },
            estimate: estimate.clone(),
            unfused_time: estimate.time,
            adapted: Vec::new(),
        }],
        rejections: Vec::new(),
    };
    let fused = apply_plan(&sub, &plan)?;
    let op = *fused_ops(&fused)
        .first()
        .ok_or("the group became no kernel (a lone view)")?;
    standalone(&fused, op)
}

/// Replaces the kernel parameters of fused `op` with `params` (its `kind`
/// and `level` stay).
pub fn set_params(graph: &mut Graph, op: OpId, params: &KernelParams) -> Result<(), String> {
    let old = &graph.op(op).attrs;
    let mut attrs = Attrs::new();
    for name in GROUP_ATTRS {
        if let Some(a) = old.get(name) {
            attrs.set(name, a.clone());
        }
    }
    for (name, value) in &params.0 {
        attrs.set(*name, value.clone());
    }
    graph.op_mut(op).attrs = OpKind::Fused
        .normalize_attrs(attrs)
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The kernel parameters of fused `op` as they stand, `name = value, ...`
/// in canonical order.
pub fn describe_params(graph: &Graph, op: OpId) -> String {
    graph
        .op(op)
        .attrs
        .iter()
        .filter(|(n, _)| !GROUP_ATTRS.contains(n))
        .map(|(n, a)| format!("{n} = {}", format_attr(a)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use dcir_fusion::{CostModel, DeviceSpec, Estimator};
    use dcir_ir::print_graph;

    use super::*;

    const FUSED: &str = "graph @g(%x: f32[8,64], %w: f32[64,32], %b: f32[32]) -> (f32[8,32]) {
  %y = fused @g0(%x.in = %x, %w.in = %w, %b.in = %b) {kind = \"gemm\", level = \"register\", math = \"fma\", split_k = 2, stages = 2, threads = 64, tile = [32, 32, 8]} : f32[8,32] {
    %m = matmul %x.in, %w.in : f32[8,32]
    %bb = broadcast %b.in {dims = [1]} : f32[8,32]
    %s = add %m, %bb : f32[8,32]
    %y.r = relu %s : f32[8,32]
    yield %y.r
  }
  %z = relu %y : f32[8,32]
  return %z
}
";

    fn graph() -> Graph {
        dcir_reader::parse_module(FUSED)
            .expect("parses")
            .graphs
            .remove(0)
    }

    #[test]
    fn a_group_stands_alone_with_its_attributes() {
        let g = graph();
        let op = fused_ops(&g)[0];
        let s = standalone(&g, op).expect("extracts");
        let text = print_graph(&s);
        assert!(
            text.starts_with(
                "graph @group(%in0: f32[8,64], %in1: f32[64,32], %in2: f32[32]) -> (f32[8,32])"
            ),
            "{text}"
        );
        assert!(
            text.contains("split_k = 2") && text.contains("matmul") && text.contains("relu"),
            "{text}"
        );
        // The outer relu is not part of it.
        assert_eq!(text.matches("relu").count(), 1, "{text}");
        assert_eq!(
            describe_params(&s, fused_ops(&s)[0]),
            describe_params(&g, op)
        );
    }

    #[test]
    fn parameters_are_replaced_whole() {
        let mut g = graph();
        let op = fused_ops(&g)[0];
        let region = region_group(&g, op).expect("a group");
        let model = CostModel::new(DeviceSpec::preset("h200").expect("preset"));
        let estimate = model.estimate(&g, &region).expect("estimates");
        assert!(!estimate.candidates.is_empty());
        let best = &estimate.candidates[0];
        set_params(&mut g, op, best).expect("sets");
        // The same pairs, in the IR's canonical (name) order.
        let sorted = |s: String| {
            let mut v: Vec<String> = s.split(", ").map(str::to_string).collect();
            v.sort();
            v
        };
        assert_eq!(sorted(describe_params(&g, op)), sorted(best.describe()));
        // Kind and level stay; the old split_k is gone unless the candidate has one.
        let attrs = &g.op(op).attrs;
        assert_eq!(attrs.get("kind").and_then(|a| a.as_str()), Some("gemm"));
        assert_eq!(
            attrs.get("split_k").is_some(),
            best.get("split_k").is_some()
        );
    }
}
