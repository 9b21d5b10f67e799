//! A deterministic topological order of a graph body.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use dcir_ir::{Graph, OpId, ValueDef};
use rustc_hash::FxHashMap;

use super::Analysis;

/// The body's ops in an order where every op follows the ops it uses, ties
/// broken by position in the block (so a verified body keeps its order).
/// A `fused` op counts as one node; its region is not listed. Ops on a
/// dependence cycle are left out and listed in [`TopoOrder::cyclic`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopoOrder {
    /// Ops in order.
    pub order: Vec<OpId>,
    /// Ops that could not be ordered (on or behind a cycle).
    pub cyclic: Vec<OpId>,
}

impl TopoOrder {
    /// Position of each op of the order, by op id.
    pub fn positions(&self) -> FxHashMap<OpId, usize> {
        self.order
            .iter()
            .enumerate()
            .map(|(i, &o)| (o, i))
            .collect()
    }
}

impl Analysis for TopoOrder {
    fn compute(graph: &Graph) -> TopoOrder {
        let ops = &graph.block(graph.body()).ops;
        let position: FxHashMap<OpId, usize> =
            ops.iter().enumerate().map(|(i, &o)| (o, i)).collect();
        let mut pending = vec![0usize; ops.len()];
        let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); ops.len()];
        for (i, &op) in ops.iter().enumerate() {
            for &v in &graph.op(op).operands {
                if let ValueDef::OpResult { op: def, .. } = graph.value(v).def
                    && let Some(&j) = position.get(&def)
                {
                    pending[i] += 1;
                    consumers[j].push(i);
                }
            }
        }
        let mut ready: BinaryHeap<Reverse<usize>> = (0..ops.len())
            .filter(|&i| pending[i] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(ops.len());
        while let Some(Reverse(i)) = ready.pop() {
            order.push(ops[i]);
            for &c in &consumers[i] {
                pending[c] -= 1;
                if pending[c] == 0 {
                    ready.push(Reverse(c));
                }
            }
        }
        let cyclic = (0..ops.len())
            .filter(|&i| pending[i] > 0)
            .map(|i| ops[i])
            .collect();
        TopoOrder { order, cyclic }
    }
}
