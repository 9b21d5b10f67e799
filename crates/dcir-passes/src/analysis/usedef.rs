//! Users of every value.

use dcir_ir::{Graph, OpId, ValueId};

use super::Analysis;

/// For every value, the live ops that use it and at which operand position,
/// in pre-order of the graph (regions included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UseDef {
    users: Vec<Vec<(OpId, usize)>>,
}

impl UseDef {
    /// The `(op, operand index)` pairs using `value`.
    pub fn users(&self, value: ValueId) -> &[(OpId, usize)] {
        &self.users[value.index()]
    }

    /// True when nothing uses `value`.
    pub fn is_unused(&self, value: ValueId) -> bool {
        self.users[value.index()].is_empty()
    }

    /// The single user of `value`, if it has exactly one use.
    pub fn single_user(&self, value: ValueId) -> Option<OpId> {
        match self.users(value) {
            [(op, _)] => Some(*op),
            _ => None,
        }
    }
}

impl Analysis for UseDef {
    fn compute(graph: &Graph) -> UseDef {
        let mut users = vec![Vec::new(); graph.value_count()];
        for op in graph.all_ops() {
            for (i, &v) in graph.op(op).operands.iter().enumerate() {
                users[v.index()].push((op, i));
            }
        }
        UseDef { users }
    }
}
