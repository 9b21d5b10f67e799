//! Human-readable views of a plan: the table of `--emit plan`, the Graphviz
//! of `--emit dot`, and the rejected merges of `--explain-fusion`.

use std::fmt::Write;

use dcir_ir::{Attr, Graph, OpId, ValueId};
use dcir_passes::analysis::op_cost;
use rustc_hash::FxHashMap;

use crate::cost::{Bound, KernelParams, LibraryVerdict};
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

/// One group of a plan as the plan table and its JSON show it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRow {
    /// The group's symbol in the fused graph (`g0`).
    pub symbol: String,
    /// Its ops' kinds, in body order.
    pub ops: Vec<&'static str>,
    /// Kernel shape and fusion level.
    pub kind: &'static str,
    /// The deepest level an internal edge needs.
    pub level: &'static str,
    /// The chosen kernel parameters.
    pub params: KernelParams,
    /// Arithmetic, flop.
    pub flops: u64,
    /// Bytes of the values it reads and writes.
    pub bytes_in: u64,
    /// Bytes of the values it writes.
    pub bytes_out: u64,
    /// What limits it: `memory`, `compute`, `launch` or `latency`.
    pub bound: &'static str,
    /// Estimated time, seconds.
    pub time: f64,
    /// The estimate with each op its own kernel, seconds.
    pub unfused_time: f64,
    /// Device-memory bytes fusion saves (the ops' traffic apart, less the group's).
    pub saved: u64,
    /// The planned parameters the target runs otherwise ([`crate::Accepted`]).
    pub adapted: Vec<String>,
}

/// The rows of `plan` over `graph`, in plan order.
pub fn plan_rows(graph: &Graph, plan: &Plan) -> Vec<PlanRow> {
    let users = users(graph);
    plan.groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let inputs = g.group.inputs(graph);
            let outputs = g
                .group
                .outputs(graph, |v| users.get(&v).cloned().unwrap_or_default());
            let (bytes_in, bytes_out) = (bytes_of(graph, &inputs), bytes_of(graph, &outputs));
            let unfused_bytes: u64 = g
                .group
                .ops
                .iter()
                .map(|&o| {
                    let c = op_cost(graph, o, None);
                    c.bytes_read + c.bytes_written
                })
                .sum();
            PlanRow {
                symbol: format!("g{i}"),
                ops: g
                    .group
                    .ops
                    .iter()
                    .map(|&o| graph.op(o).kind.name())
                    .collect(),
                kind: g.group.kind.name(),
                level: g.group.level.name(),
                params: g.estimate.params.clone(),
                flops: g.estimate.flops,
                bytes_in,
                bytes_out,
                bound: match g.estimate.bound {
                    Bound::Memory => "memory",
                    Bound::Compute => "compute",
                    Bound::Launch => "launch",
                    Bound::Latency => "latency",
                },
                time: g.estimate.time,
                unfused_time: g.unfused_time,
                saved: unfused_bytes.saturating_sub(bytes_in + bytes_out),
                adapted: g.adapted.clone(),
            }
        })
        .collect()
}

/// One row per group and a totals row, under a title naming the graph and
/// the device (`device`) the estimates are for: ops, kind, level, flops,
/// bytes in/out, intensity, bound, estimated time, the unfused estimate, and
/// the bytes fusion keeps out of device memory; then a note for each planned
/// parameter a kernel does not run as written.
pub fn plan_table(graph: &Graph, plan: &Plan, device: &str) -> String {
    let rows = plan_rows(graph, plan);
    let mut out = format!("plan for @{} on {device}\n", graph.name());
    out.push_str("| group | ops | kind | level | GFLOP | in | out | flop/B | bound | est us | unfused us | saved |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &rows {
        let moved = r.bytes_in + r.bytes_out;
        let intensity = if moved == 0 {
            0.0
        } else {
            r.flops as f64 / moved as f64
        };
        // A library call shows in the kind: `gemm (cublaslt)`, with the
        // heuristic's rank where tuning chose another than its first
        // (`gemm (cublaslt, rank 1)`).
        let kind = match r.params.get("library").and_then(Attr::as_str) {
            Some(library) => match r.params.get("heuristic_rank") {
                Some(Attr::Int(rank)) if *rank > 0 => {
                    format!("{} ({library}, rank {rank})", r.kind)
                }
                _ => format!("{} ({library})", r.kind),
            },
            None => r.kind.to_string(),
        };
        let _ = writeln!(
            out,
            "| @{} | {} | {} | {} | {:.3} | {} | {} | {intensity:.1} | {} | {:.2} | {:.2} | {} |",
            r.symbol,
            r.ops.join("+"),
            kind,
            r.level,
            r.flops as f64 / 1e9,
            human_bytes(r.bytes_in),
            human_bytes(r.bytes_out),
            r.bound,
            r.time * 1e6,
            r.unfused_time * 1e6,
            human_bytes(r.saved),
        );
    }
    let ops: usize = rows.iter().map(|r| r.ops.len()).sum();
    let _ = writeln!(
        out,
        "| total | {ops} ops in {} kernels | | | {:.3} | | | | | {:.2} | {:.2} | {} |",
        rows.len(),
        rows.iter().map(|r| r.flops).sum::<u64>() as f64 / 1e9,
        plan.total_time() * 1e6,
        plan.unfused_time() * 1e6,
        human_bytes(rows.iter().map(|r| r.saved).sum()),
    );
    // A kernel that does not run the parameters its estimate priced.
    for r in &rows {
        for adapted in &r.adapted {
            let _ = writeln!(out, "note: @{}: {adapted}", r.symbol);
        }
    }
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
    for (i, g) in plan.groups.iter().enumerate() {
        let line = match &g.estimate.library {
            None => continue,
            Some(LibraryVerdict::Priced {
                library,
                library_time,
                kernel_time,
            }) => {
                let (verb, than) = if g.estimate.params.get("library").is_some() {
                    ("calls", "against")
                } else {
                    ("runs our kernel, not", "for the call against")
                };
                format!(
                    "@g{i} {verb} {library}: estimated {:.2} us {than} {:.2} us for our kernel",
                    library_time * 1e6,
                    kernel_time * 1e6
                )
            }
            Some(LibraryVerdict::Refused { library, reason }) => {
                format!("@g{i} cannot call {library}: {reason}")
            }
        };
        let _ = writeln!(out, "  {line}");
    }
    out
}
