//! Dominators of the body's dataflow graph.
//!
//! The nodes are the body's ops. Op `a` dominates op `b` when every dataflow
//! path from the graph's entry (parameters, constants) to `b` passes through
//! `a`; `a` post-dominates `b` when every path from `b` to the graph's exit
//! (the `return`, and ops whose results nobody uses) passes through `a`.
//! Fusion uses both: a group's single exit is a post-dominator of its ops.

use dcir_ir::{Graph, OpId, ValueDef};
use petgraph::algo::dominators::simple_fast;
use petgraph::graph::{DiGraph, NodeIndex};
use rustc_hash::FxHashMap;

use super::Analysis;

/// Immediate dominators, from the entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dominance {
    idom: FxHashMap<OpId, Option<OpId>>,
}

/// Immediate post-dominators, towards the exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostDominance {
    ipdom: FxHashMap<OpId, Option<OpId>>,
}

fn walk(tree: &FxHashMap<OpId, Option<OpId>>, a: OpId, mut b: OpId) -> bool {
    loop {
        if a == b {
            return true;
        }
        match tree.get(&b).copied().flatten() {
            Some(up) => b = up,
            None => return false,
        }
    }
}

impl Dominance {
    /// The immediate dominator of `op` (`None` when only the entry dominates it).
    pub fn immediate(&self, op: OpId) -> Option<OpId> {
        self.idom.get(&op).copied().flatten()
    }

    /// True when `a` dominates `b` (every op dominates itself).
    pub fn dominates(&self, a: OpId, b: OpId) -> bool {
        walk(&self.idom, a, b)
    }
}

impl PostDominance {
    /// The immediate post-dominator of `op` (`None` when only the exit does).
    pub fn immediate(&self, op: OpId) -> Option<OpId> {
        self.ipdom.get(&op).copied().flatten()
    }

    /// True when `a` post-dominates `b` (every op post-dominates itself).
    pub fn post_dominates(&self, a: OpId, b: OpId) -> bool {
        walk(&self.ipdom, a, b)
    }
}

/// The body's dataflow graph with a virtual source (node 0) feeding the ops
/// without op-defined operands and a virtual sink (node 1) fed by the ops
/// whose results nobody uses.
fn dataflow(graph: &Graph) -> (DiGraph<Option<OpId>, ()>, NodeIndex, NodeIndex) {
    let ops = &graph.block(graph.body()).ops;
    let mut g = DiGraph::new();
    let source = g.add_node(None);
    let sink = g.add_node(None);
    let nodes: FxHashMap<OpId, NodeIndex> = ops.iter().map(|&o| (o, g.add_node(Some(o)))).collect();
    let mut has_user = FxHashMap::default();
    for &op in ops {
        let mut fed = false;
        for &v in &graph.op(op).operands {
            if let ValueDef::OpResult { op: def, .. } = graph.value(v).def
                && let Some(&from) = nodes.get(&def)
            {
                g.add_edge(from, nodes[&op], ());
                has_user.insert(def, ());
                fed = true;
            }
        }
        if !fed {
            g.add_edge(source, nodes[&op], ());
        }
    }
    for &op in ops {
        if !has_user.contains_key(&op) {
            g.add_edge(nodes[&op], sink, ());
        }
    }
    (g, source, sink)
}

fn tree(g: &DiGraph<Option<OpId>, ()>, root: NodeIndex) -> FxHashMap<OpId, Option<OpId>> {
    let doms = simple_fast(g, root);
    g.node_indices()
        .filter_map(|n| {
            let op = g[n]?;
            let up = doms.immediate_dominator(n).and_then(|d| g[d]);
            Some((op, up))
        })
        .collect()
}

impl Analysis for Dominance {
    fn compute(graph: &Graph) -> Dominance {
        let (g, source, _) = dataflow(graph);
        Dominance {
            idom: tree(&g, source),
        }
    }
}

impl Analysis for PostDominance {
    fn compute(graph: &Graph) -> PostDominance {
        let (mut g, _, sink) = dataflow(graph);
        g.reverse();
        PostDominance {
            ipdom: tree(&g, sink),
        }
    }
}
