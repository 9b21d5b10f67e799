//! Small helpers shared by the transforms.

use dcir_ir::{Attr, BlockId, Graph, Module, OpId, OpKind, ValueDef, ValueId};

use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};

/// The op defining `v`, if `v` is an op result (not a block argument).
pub(crate) fn def_op(graph: &Graph, v: ValueId) -> Option<OpId> {
    match graph.value(v).def {
        ValueDef::OpResult { op, .. } => Some(op),
        ValueDef::BlockArg { .. } => None,
    }
}

/// The body and every `fused` region of the graph, in pre-order.
/// A pass that rewrites every op of one kind, in every graph and region,
/// with one function: the shape of the decomposition passes.
pub(crate) struct RewriteEach {
    /// The registered name.
    pub name: &'static str,
    /// The ops rewritten.
    pub kind: OpKind,
    /// Rewrites one op (and removes it).
    pub rewrite: fn(&mut Graph, OpId) -> Result<(), PassError>,
}

impl Pass for RewriteEach {
    fn name(&self) -> &'static str {
        self.name
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        each_op(module, true, |graph, op| {
            let ours = graph.op(op).kind == self.kind;
            if ours {
                (self.rewrite)(graph, op)?;
            }
            Ok(ours)
        })
    }
}

/// A pass that offers every op of each graph's body (not `fused` regions),
/// in order, to one function, which rewrites it and returns true, or
/// returns false: the shape of the folding passes.
pub(crate) struct FoldEach {
    /// The registered name.
    pub name: &'static str,
    /// Folds one op, or leaves it.
    pub fold: fn(&mut Graph, OpId) -> Result<bool, PassError>,
}

impl Pass for FoldEach {
    fn name(&self) -> &'static str {
        self.name
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        each_op(module, false, self.fold)
    }
}

/// Offers every op of each graph's body (and, with `regions`, of every
/// `fused` region) to `visit`, in order; changed when any visit says so.
fn each_op(
    module: &mut Module,
    regions: bool,
    mut visit: impl FnMut(&mut Graph, OpId) -> Result<bool, PassError>,
) -> Result<PassResult, PassError> {
    let mut changed = false;
    for graph in &mut module.graphs {
        let blocks = if regions {
            all_blocks(graph)
        } else {
            vec![graph.body()]
        };
        for block in blocks {
            for op in graph.block(block).ops.clone() {
                changed |= visit(graph, op)?;
            }
        }
    }
    Ok(PassResult::from_changed(changed))
}

pub(crate) fn all_blocks(graph: &Graph) -> Vec<BlockId> {
    let mut blocks = vec![graph.body()];
    blocks.extend(
        graph
            .all_ops()
            .into_iter()
            .filter_map(|o| graph.op(o).region),
    );
    blocks
}

/// The number every element of `v` holds, when `v` is a splat `constant`
/// (one number) or a `broadcast` of one.
pub(crate) fn splat_value(graph: &Graph, v: ValueId) -> Option<f64> {
    let mut v = v;
    loop {
        let op = graph.op(def_op(graph, v)?);
        match op.kind {
            OpKind::Constant => {
                return match op.attrs.get("value")? {
                    Attr::Float(f) => Some(*f),
                    Attr::Int(i) => Some(*i as f64),
                    _ => None,
                };
            }
            OpKind::Broadcast => v = op.operands[0],
            _ => return None,
        }
    }
}

/// How many operands of live ops (regions included) name each value, by value index.
pub(crate) fn use_counts(graph: &Graph) -> Vec<usize> {
    let mut uses = vec![0usize; graph.value_count()];
    for op in graph.all_ops() {
        for &v in &graph.op(op).operands {
            uses[v.index()] += 1;
        }
    }
    uses
}

/// Redirects every use of `op`'s single result to `value` and removes `op`.
pub(crate) fn replace_op(graph: &mut Graph, op: OpId, value: ValueId) {
    let result = graph.op(op).results[0];
    graph.replace_all_uses(result, value);
    graph.remove_op(op);
}
