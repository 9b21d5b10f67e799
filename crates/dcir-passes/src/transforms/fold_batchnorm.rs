//! `fold-batchnorm`: folds an inference batchnorm into the convolution that
//! feeds it.
//!
//! `batchnorm(conv2d(x, w), scale, bias, mean, var)`, where the convolution's
//! result has no other user, becomes `conv2d(x, w') + broadcast(b')` with
//!
//! ```text
//! k  = scale * rsqrt(var + epsilon)        one value per output channel
//! w' = w * broadcast(k, dims = [0])         (dim 0 of w is the output channel)
//! b' = bias - mean * k
//! ```
//!
//! The ops computing `k`, `w'` and `b'` use only `w` and the batchnorm's
//! parameters, so they form a weight-only subgraph that `hoist-weights` and
//! `fold-constants` can move or evaluate. They are placed right before the
//! convolution, which is edited in place to read `w'`; when a batchnorm
//! parameter is defined after the convolution, the convolution is first moved
//! down to right before the batchnorm (it has no other user, so this is
//! safe). Grouped and depthwise convolutions fold the same way. The
//! batchnorm, whose uses all go to the new `add`, is removed. Only graph
//! bodies are rewritten, not `fused` regions.

use dcir_ir::{Attr, Attrs, BlockId, Graph, Module, OpId, OpKind, Rewriter, ValueDef, ValueId};

use super::common::{def_op, replace_op, use_counts};
use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "fold-batchnorm",
    summary: "fold batchnorm(conv2d(x, w)) into conv2d(x, w') + broadcast(b') when the conv has \
              no other user; w' and b' are computed by weight-only ops before the conv",
    options: &[],
    create: |_: &PassOptions| Ok(Box::new(FoldBatchnorm)),
};

struct FoldBatchnorm;

impl Pass for FoldBatchnorm {
    fn name(&self) -> &'static str {
        DEF.name
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        let mut changed = false;
        for graph in &mut module.graphs {
            // Folding one pair changes no other conv's use count (the new ops
            // use weights and the folded conv's own result), so one count does.
            let uses = use_counts(graph);
            let body = graph.body();
            for bn in graph.block(body).ops.clone() {
                if let Some(conv) = foldable_conv(graph, &uses, bn) {
                    fold(graph, body, conv, bn)?;
                    changed = true;
                }
            }
        }
        Ok(PassResult::from_changed(changed))
    }
}

/// The convolution feeding `op`, if `op` is a batchnorm whose input is a
/// `conv2d` result used by nothing else.
fn foldable_conv(graph: &Graph, uses: &[usize], op: OpId) -> Option<OpId> {
    let d = graph.op(op);
    if d.kind != OpKind::Batchnorm {
        return None;
    }
    let conv = def_op(graph, d.operands[0])?;
    let c = graph.op(conv);
    if c.kind != OpKind::Conv2d || c.parent != d.parent {
        return None;
    }
    (uses[c.results[0].index()] == 1).then_some(conv)
}

/// Position of `op` in `block`.
fn position(graph: &Graph, block: BlockId, op: OpId) -> Option<usize> {
    graph.block(block).ops.iter().position(|&o| o == op)
}

/// True when `v` is available before position `pos` of `block`: an argument
/// of the block or the result of an earlier op of it.
fn defined_before(graph: &Graph, block: BlockId, v: ValueId, pos: usize) -> bool {
    match graph.value(v).def {
        ValueDef::BlockArg { block: b, .. } => b == block,
        ValueDef::OpResult { op, .. } => position(graph, block, op).is_some_and(|p| p < pos),
    }
}

fn fold(graph: &mut Graph, block: BlockId, conv: OpId, bn: OpId) -> Result<(), PassError> {
    let bn_data = graph.op(bn);
    let [_, scale, bias, mean, var] = bn_data.operands[..] else {
        return Err(PassError::at("batchnorm needs 5 operands", graph, bn));
    };
    let epsilon = bn_data.attrs.float("epsilon").unwrap_or(1e-5);
    let bn_result = bn_data.results[0];
    let w = graph.op(conv).operands[1];
    let out_ty = graph.ty(bn_result).clone();
    let w_ty = graph.ty(w).clone();
    let channels = w_ty.dims()[0];
    let dtype = w_ty.dtype;

    // Move the conv down to the batchnorm if a parameter comes after it.
    let missing = || PassError::new("fold-batchnorm: an op is not listed in its block");
    let conv_pos = position(graph, block, conv).ok_or_else(missing)?;
    if ![scale, bias, mean, var]
        .iter()
        .all(|&v| defined_before(graph, block, v, conv_pos))
    {
        graph.remove_op(conv);
        let bn_pos = position(graph, block, bn).ok_or_else(missing)?;
        graph.insert_op(block, bn_pos, conv);
    }

    let hint = graph.value(w).name.clone();
    let h = |s: &str| format!("{hint}.{s}");
    let none = Attrs::new;
    let mut rw = Rewriter::before(graph, conv);
    let eps = rw.splat(dtype, epsilon, &[channels], &h("eps"))?;
    let var_eps = rw.op(OpKind::Add, &[var, eps], none(), &h("var_eps"))?;
    let inv_std = rw.op(OpKind::Rsqrt, &[var_eps], none(), &h("inv_std"))?;
    let k = rw.op(OpKind::Mul, &[scale, inv_std], none(), &h("k"))?;
    let dims0 = Attrs::new().with("dims", Attr::Ints(vec![0]));
    let kb = rw.op_declared(OpKind::Broadcast, &[k], dims0, w_ty, &h("kb"))?;
    let w_folded = rw.op(OpKind::Mul, &[w, kb], none(), &h("folded"))?;
    let mean_k = rw.op(OpKind::Mul, &[mean, k], none(), &h("mean_k"))?;
    let b_folded = rw.op(OpKind::Sub, &[bias, mean_k], none(), &h("bias"))?;
    graph.op_mut(conv).operands[1] = w_folded;

    let conv_result = graph.op(conv).results[0];
    let out_hint = graph.value(bn_result).name.clone();
    let mut rw = Rewriter::before(graph, bn);
    let dims1 = Attrs::new().with("dims", Attr::Ints(vec![1]));
    let bias_b = format!("{out_hint}.bias");
    let bb = rw.op_declared(OpKind::Broadcast, &[b_folded], dims1, out_ty, &bias_b)?;
    let folded = format!("{out_hint}.folded");
    let sum = rw.op(OpKind::Add, &[conv_result, bb], none(), &folded)?;
    replace_op(graph, bn, sum);
    Ok(())
}
