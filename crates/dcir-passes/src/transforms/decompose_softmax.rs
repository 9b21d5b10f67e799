//! `decompose-softmax`: rewrites `softmax` as primitive ops.
//!
//! For `y = softmax(x) {axis = a}`, with both reductions kept
//! (`keepdims = true`) and broadcast back to `x`'s shape:
//!
//! ```text
//! e = exp(x - reduce_max(x, [a]))
//! y = e / reduce_sum(e, [a])
//! ```
//!
//! Graph bodies and `fused` regions are rewritten alike; the `softmax`, left
//! without users, is removed.

use dcir_ir::{Attr, Attrs, Graph, OpId, OpKind, Rewriter};

use super::common::{RewriteEach, replace_op};
use crate::pass::PassError;
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "decompose-softmax",
    summary: "rewrite softmax as reduce_max, sub, exp, reduce_sum, div and broadcasts",
    options: &[],
    create: |_: &PassOptions| {
        Ok(Box::new(RewriteEach {
            name: DEF.name,
            kind: OpKind::Softmax,
            rewrite: decompose,
        }))
    },
};

fn decompose(graph: &mut Graph, op: OpId) -> Result<(), PassError> {
    let d = graph.op(op);
    let x = d.operands[0];
    let result = d.results[0];
    let ty = graph.ty(x).clone();
    let axis = d
        .attrs
        .int("axis")
        .ok_or_else(|| PassError::at("softmax needs an axis", graph, op))?;
    let hint = graph.value(result).name.clone();
    let h = |s: &str| format!("{hint}.{s}");
    let none = Attrs::new;
    let reduce = Attrs::new()
        .with("axes", Attr::Ints(vec![axis]))
        .with("keepdims", Attr::Bool(true));
    let back = || Attrs::new().with("dims", Attr::Ints((0..ty.rank() as i64).collect()));

    let mut rw = Rewriter::before(graph, op);
    let max = rw.op(OpKind::ReduceMax, &[x], reduce.clone(), &h("max"))?;
    let max_b = rw.op_declared(OpKind::Broadcast, &[max], back(), ty.clone(), &h("max_b"))?;
    let shifted = rw.op(OpKind::Sub, &[x, max_b], none(), &h("shifted"))?;
    let exp = rw.op(OpKind::Exp, &[shifted], none(), &h("exp"))?;
    let sum = rw.op(OpKind::ReduceSum, &[exp], reduce, &h("sum"))?;
    let sum_b = rw.op_declared(OpKind::Broadcast, &[sum], back(), ty.clone(), &h("sum_b"))?;
    let y = rw.op(OpKind::Div, &[exp, sum_b], none(), &h("out"))?;
    replace_op(graph, op, y);
    Ok(())
}
