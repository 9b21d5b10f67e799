//! Human-readable views of a plan: the table of `--emit plan`, the Graphviz
//! of `--emit dot`, and the rejected merges of `--explain-fusion`.

use std::fmt::Write;

use dcir_ir::{Graph, OpId, ValueId};
use dcir_passes::analysis::op_cost;
use rustc_hash::FxHashMap;

use crate::cost::Bound;
use crate::planner::Plan;

fn op_label(graph: &Graph, op: OpId) -> String {
    let d = graph.op(op);
    match d.results.first() {
        Some(&r) => format!("%{} = {}", graph.value(r).name, d.kind.name()),
        None => d.kind.name().to_string(),
    }
}

fn bytes_of(graph: &Graph, values: &[ValueId]) -> u64 {
    values
        .iter()
        .map(|&v| graph.ty(v).size_bytes().unwrap_or(0) as u64)
        .sum()
}

fn users(graph: &Graph) -> FxHashMap<ValueId, Vec<OpId>> {
    let mut u: FxHashMap<ValueId, Vec<OpId>> = FxHashMap::default();
    for &op in &graph.block(graph.body()).ops {
        for &v in &graph.op(op).operands {
            u.entry(v).or_default().push(op);
        }
    }
    u
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// One row per group and a totals row:
/// ops, kind, level, flops, bytes in/out, intensity, bound, estimated time,
/// the unfused estimate, and the bytes fusion keeps out of device memory.
pub fn plan_table(graph: &Graph, plan: &Plan) -> String {
    let users = users(graph);
    let mut out = format!("plan for @{}\n", graph.name());
    out.push_str("| group | ops | kind | level | GFLOP | in | out | flop/B | bound | est us | unfused us | saved |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let (mut total_saved, mut total_flops) = (0u64, 0u64);
    for (i, g) in plan.groups.iter().enumerate() {
        let inputs = g.group.inputs(graph);
        let outputs = g
            .group
            .outputs(graph, |v| users.get(&v).cloned().unwrap_or_default());
        let (bin, bout) = (bytes_of(graph, &inputs), bytes_of(graph, &outputs));
        let unfused_bytes: u64 = g
            .group
            .ops
            .iter()
            .map(|&o| {
                let c = op_cost(graph, o, None);
                c.bytes_read + c.bytes_written
            })
            .sum();
        let saved = unfused_bytes.saturating_sub(bin + bout);
        total_saved += saved;
        total_flops += g.estimate.flops;
        let ops: Vec<&str> = g
            .group
            .ops
            .iter()
            .map(|&o| graph.op(o).kind.name())
            .collect();
        let bound = match g.estimate.bound {
            Bound::Memory => "memory",
            Bound::Compute => "compute",
            Bound::Launch => "launch",
            Bound::Latency => "latency",
        };
        let intensity = if bin + bout == 0 {
            0.0
        } else {
            g.estimate.flops as f64 / (bin + bout) as f64
        };
        let _ = writeln!(
            out,
            "| @g{i} | {} | {} | {} | {:.3} | {} | {} | {:.1} | {bound} | {:.2} | {:.2} | {} |",
            ops.join("+"),
            g.group.kind.name(),
            g.group.level.name(),
            g.estimate.flops as f64 / 1e9,
            human_bytes(bin),
            human_bytes(bout),
            intensity,
            g.estimate.time * 1e6,
            g.unfused_time * 1e6,
            human_bytes(saved),
        );
    }
    let ops: usize = plan.groups.iter().map(|g| g.group.ops.len()).sum();
    let _ = writeln!(
        out,
        "| total | {ops} ops in {} kernels | | | {:.3} | | | | | {:.2} | {:.2} | {} |",
        plan.groups.len(),
        total_flops as f64 / 1e9,
        plan.total_time() * 1e6,
        plan.unfused_time() * 1e6,
        human_bytes(total_saved),
    );
    out
}

/// Graphviz: each group a cluster, each op a node, each value an edge.
pub fn plan_dot(graph: &Graph, plan: &Plan) -> String {
    let mut out = format!(
        "digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n",
        graph.name()
    );
    let mut group_of = FxHashMap::default();
    for (i, g) in plan.groups.iter().enumerate() {
        let _ = writeln!(
            out,
            "  subgraph cluster_g{i} {{\n    label=\"@g{i} {} ({})\";",
            g.group.kind.name(),
            g.group.level.name()
        );
        for &op in &g.group.ops {
            group_of.insert(op, i);
            let _ = writeln!(
                out,
                "    op{} [label=\"{}\"];",
                op.index(),
                op_label(graph, op)
            );
        }
        out.push_str("  }\n");
    }
    for &p in graph.params() {
        let _ = writeln!(
            out,
            "  v{} [label=\"%{}\", shape=ellipse];",
            p.index(),
            graph.value(p).name
        );
    }
    for &op in &graph.block(graph.body()).ops {
        let d = graph.op(op);
        if !group_of.contains_key(&op) {
            let _ = writeln!(
                out,
                "  op{} [label=\"{}\", style=dashed];",
                op.index(),
                op_label(graph, op)
            );
        }
        for &v in &d.operands {
            let from = match graph.value(v).def {
                dcir_ir::ValueDef::OpResult { op: def, .. } => format!("op{}", def.index()),
                dcir_ir::ValueDef::BlockArg { .. } => format!("v{}", v.index()),
            };
            let _ = writeln!(out, "  {from} -> op{};", op.index());
        }
    }
    out.push_str("}\n");
    out
}

/// Every merge the planner rejected in its last round, with the rule or
/// estimate that rejected it.
pub fn explain(graph: &Graph, plan: &Plan) -> String {
    let mut out = format!(
        "fusion decisions for @{}: {} kernels\n",
        graph.name(),
        plan.groups.len()
    );
    if plan.rejections.is_empty() {
        out.push_str("  no merge was rejected\n");
    }
    for r in &plan.rejections {
        let _ = writeln!(
            out,
            "  not fused: {} -> {}: {}",
            op_label(graph, r.producer),
            op_label(graph, r.consumer),
            r.reason
        );
    }
    out
}
