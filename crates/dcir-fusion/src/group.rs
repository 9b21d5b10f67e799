//! A candidate group: a set of body ops that would run as one kernel.

use dcir_ir::{Graph, OpId, ValueDef, ValueId};
use rustc_hash::FxHashSet;

use crate::legality::{GroupKind, Level};

/// Ops of one graph body that form one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// The ops, in body order (a topological order).
    pub ops: Vec<OpId>,
    /// The kernel shape they form.
    pub kind: GroupKind,
    /// The deepest fusion level any internal edge needs.
    pub level: Level,
}

impl Group {
    /// Values the group reads that are defined outside it, in first-use order.
    pub fn inputs(&self, graph: &Graph) -> Vec<ValueId> {
        let inside: FxHashSet<OpId> = self.ops.iter().copied().collect();
        let mut seen = FxHashSet::default();
        let mut out = Vec::new();
        for &op in &self.ops {
            for &v in &graph.op(op).operands {
                let internal = matches!(graph.value(v).def, ValueDef::OpResult { op: d, .. } if inside.contains(&d));
                if !internal && seen.insert(v) {
                    out.push(v);
                }
            }
        }
        out
    }

    /// Values the group defines that are used outside it (or returned), in
    /// definition order. `users` gives the ops using a value.
    pub fn outputs(&self, graph: &Graph, users: impl Fn(ValueId) -> Vec<OpId>) -> Vec<ValueId> {
        let inside: FxHashSet<OpId> = self.ops.iter().copied().collect();
        let mut out = Vec::new();
        for &op in &self.ops {
            for &r in &graph.op(op).results {
                if users(r).iter().any(|u| !inside.contains(u)) {
                    out.push(r);
                }
            }
        }
        out
    }
}
