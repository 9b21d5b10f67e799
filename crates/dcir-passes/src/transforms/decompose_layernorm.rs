//! `decompose-layernorm`: rewrites `layernorm` as primitive ops.
//!
//! For `y = layernorm(x, scale, bias) {axis = a, epsilon = e}`, with `N` the
//! normalized dims `a..rank` and every reduction kept (`keepdims = true`) and
//! broadcast back to `x`'s shape:
//!
//! ```text
//! mean = reduce_mean(x, N)
//! d    = x - mean
//! var  = reduce_mean(d * d, N)
//! y    = d * rsqrt(var + e) * broadcast(scale) + broadcast(bias)
//! ```
//!
//! The constant `e` has `x`'s dtype. Graph bodies and `fused` regions are
//! rewritten alike; the `layernorm`, left without users, is removed.

use dcir_ir::{Attr, Attrs, Graph, OpId, OpKind, Rewriter};

use super::common::{RewriteEach, replace_op};
use crate::pass::PassError;
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "decompose-layernorm",
    summary: "rewrite layernorm as reduce_mean, sub, mul, add, rsqrt and broadcasts",
    options: &[],
    create: |_: &PassOptions| {
        Ok(Box::new(RewriteEach {
            name: DEF.name,
            kind: OpKind::Layernorm,
            rewrite: decompose,
        }))
    },
};

fn decompose(graph: &mut Graph, op: OpId) -> Result<(), PassError> {
    let d = graph.op(op);
    let [x, scale, bias] = d.operands[..] else {
        return Err(PassError::at("layernorm needs 3 operands", graph, op));
    };
    let epsilon = d.attrs.float("epsilon").unwrap_or(1e-5);
    let result = d.results[0];
    let ty = graph.ty(x).clone();
    let rank = ty.rank();
    let axis = d
        .attrs
        .int("axis")
        .and_then(|a| usize::try_from(a).ok())
        .filter(|&a| a < rank)
        .ok_or_else(|| PassError::at("layernorm axis out of range", graph, op))?;
    let hint = graph.value(result).name.clone();
    let h = |s: &str| format!("{hint}.{s}");
    let none = Attrs::new;
    let dims = |v: Vec<i64>| Attrs::new().with("dims", Attr::Ints(v));
    let normalized: Vec<i64> = (axis as i64..rank as i64).collect();
    let identity: Vec<i64> = (0..rank as i64).collect();
    let reduce = Attrs::new()
        .with("axes", Attr::Ints(normalized.clone()))
        .with("keepdims", Attr::Bool(true));

    let mut rw = Rewriter::before(graph, op);
    let mean = rw.op(OpKind::ReduceMean, &[x], reduce.clone(), &h("mean"))?;
    let kept = rw.ty(mean).clone();
    let mean_b = rw.op_declared(
        OpKind::Broadcast,
        &[mean],
        dims(identity.clone()),
        ty.clone(),
        &h("mean_b"),
    )?;
    let centered = rw.op(OpKind::Sub, &[x, mean_b], none(), &h("centered"))?;
    let square = rw.op(OpKind::Mul, &[centered, centered], none(), &h("square"))?;
    let var = rw.op(OpKind::ReduceMean, &[square], reduce, &h("var"))?;
    let eps = rw.splat(ty.dtype, epsilon, kept.dims(), &h("eps"))?;
    let var_eps = rw.op(OpKind::Add, &[var, eps], none(), &h("var_eps"))?;
    let inv_std = rw.op(OpKind::Rsqrt, &[var_eps], none(), &h("inv_std"))?;
    let inv_std_b = rw.op_declared(
        OpKind::Broadcast,
        &[inv_std],
        dims(identity),
        ty.clone(),
        &h("inv_std_b"),
    )?;
    let norm = rw.op(OpKind::Mul, &[centered, inv_std_b], none(), &h("norm"))?;
    let scale_b = rw.op_declared(
        OpKind::Broadcast,
        &[scale],
        dims(normalized.clone()),
        ty.clone(),
        &h("scale_b"),
    )?;
    let scaled = rw.op(OpKind::Mul, &[norm, scale_b], none(), &h("scaled"))?;
    let bias_b = rw.op_declared(
        OpKind::Broadcast,
        &[bias],
        dims(normalized),
        ty,
        &h("bias_b"),
    )?;
    let y = rw.op(OpKind::Add, &[scaled, bias_b], none(), &h("out"))?;
    replace_op(graph, op, y);
    Ok(())
}
