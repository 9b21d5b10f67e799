//! `canonicalize`: local simplifications, repeated to a fixpoint.
//!
//! Every rewrite either redirects the uses of an op's result to a value that
//! already exists (the op becomes dead) or edits one op in place (its
//! operand and attributes; the result keeps its name and type). The pass
//! creates no op and removes none: what it leaves dead is `dce`'s, so the
//! usual pipeline is `canonicalize,dce`.
//!
//! | pattern | becomes |
//! |---|---|
//! | `x + 0`, `0 + x`, `x - 0`, `x * 1`, `1 * x`, `x / 1` | `x` |
//! | `transpose(transpose(x, p), q)` | `transpose(x, p∘q)`, or `x` when that is the identity |
//! | `transpose(x, identity)` | `x` |
//! | `reshape(reshape(x))` | `reshape(x)` |
//! | `reshape(x)` or `broadcast(x)` to `x`'s own type | `x` |
//! | `matmul(transpose(a, swap last two), b)` (and for `b`) | `matmul(a, b)` with the transpose flag toggled |
//!
//! The 0 or 1 is a `constant` splat (one number) or a `broadcast` of one;
//! `x + 0 → x` ignores the sign of zero (`-0 + 0` is `+0`), as is usual for
//! tensor compilers. Ops with no users are not rewritten.

use dcir_ir::{Attr, Graph, Module, OpId, OpKind, ValueId};

use super::common::{all_blocks, def_op, splat_value, use_counts};
use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{OptionKind, PassDef, PassOptionDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "canonicalize",
    summary: "local simplifications to a fixpoint: x+0, x-0, x*1, x/1 → x; transpose/reshape chains \
              merged; identity transpose, reshape and broadcast removed; matmul absorbs a \
              last-two-dims transpose. Leaves dead ops to `dce`",
    options: &[PassOptionDef {
        name: "max-iterations",
        kind: OptionKind::Int,
        default: "10",
        help: "most sweeps over the module before stopping",
    }],
    create: |options: &PassOptions| {
        let max_iterations = options.int("max-iterations");
        if max_iterations < 1 {
            return Err(format!(
                "max-iterations must be at least 1, found {max_iterations}"
            ));
        }
        Ok(Box::new(Canonicalize { max_iterations }))
    },
};

struct Canonicalize {
    max_iterations: i64,
}

impl Pass for Canonicalize {
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
            for _ in 0..self.max_iterations {
                if !sweep(graph) {
                    break;
                }
                changed = true;
            }
        }
        Ok(PassResult::from_changed(changed))
    }
}

/// What one pattern does to an op.
enum Rewrite {
    /// Every use of the op's result becomes a use of this value.
    Replace(ValueId),
    /// Operand `index` becomes `value`, and the attribute (if any) is set.
    Edit {
        index: usize,
        value: ValueId,
        attr: Option<(&'static str, Attr)>,
    },
}

/// One pass over every block; true if anything was rewritten.
fn sweep(graph: &mut Graph) -> bool {
    // Use counts, kept current as rewrites happen.
    let mut uses = use_counts(graph);
    let mut changed = false;
    for block in all_blocks(graph) {
        for op in graph.block(block).ops.clone() {
            let d = graph.op(op);
            if d.results.len() != 1 || uses[d.results[0].index()] == 0 {
                continue;
            }
            let result = d.results[0];
            let Some(rewrite) = match_op(graph, op) else {
                continue;
            };
            match rewrite {
                Rewrite::Replace(to) => {
                    graph.replace_all_uses(result, to);
                    uses[to.index()] += uses[result.index()];
                    uses[result.index()] = 0;
                }
                Rewrite::Edit { index, value, attr } => {
                    let d = graph.op_mut(op);
                    let old = std::mem::replace(&mut d.operands[index], value);
                    if let Some((name, a)) = attr {
                        d.attrs.set(name, a);
                    }
                    uses[old.index()] -= 1;
                    uses[value.index()] += 1;
                }
            }
            changed = true;
        }
    }
    changed
}

/// The first pattern that applies to `op`, if any.
fn match_op(graph: &Graph, op: OpId) -> Option<Rewrite> {
    let d = graph.op(op);
    let result = d.results[0];
    let operand = |i: usize| d.operands[i];
    let splat_is = |v: ValueId, x: f64| splat_value(graph, v) == Some(x);
    match d.kind {
        OpKind::Add if splat_is(operand(1), 0.0) => Some(Rewrite::Replace(operand(0))),
        OpKind::Add if splat_is(operand(0), 0.0) => Some(Rewrite::Replace(operand(1))),
        OpKind::Sub if splat_is(operand(1), 0.0) => Some(Rewrite::Replace(operand(0))),
        OpKind::Mul if splat_is(operand(1), 1.0) => Some(Rewrite::Replace(operand(0))),
        OpKind::Mul if splat_is(operand(0), 1.0) => Some(Rewrite::Replace(operand(1))),
        OpKind::Div if splat_is(operand(1), 1.0) => Some(Rewrite::Replace(operand(0))),
        OpKind::Transpose => {
            let perm = d.attrs.ints("perm")?;
            if is_identity(perm) {
                return Some(Rewrite::Replace(operand(0)));
            }
            let inner = graph.op(def_op(graph, operand(0))?);
            if inner.kind != OpKind::Transpose {
                return None;
            }
            let inner_perm = inner.attrs.ints("perm")?;
            // Result dim i is inner dim perm[i], which is x dim inner_perm[perm[i]].
            let composed: Vec<i64> = perm
                .iter()
                .map(|&p| {
                    usize::try_from(p)
                        .ok()
                        .and_then(|p| inner_perm.get(p).copied())
                })
                .collect::<Option<_>>()?;
            let x = inner.operands[0];
            if is_identity(&composed) {
                Some(Rewrite::Replace(x))
            } else {
                Some(Rewrite::Edit {
                    index: 0,
                    value: x,
                    attr: Some(("perm", Attr::Ints(composed))),
                })
            }
        }
        OpKind::Reshape | OpKind::Broadcast if graph.ty(operand(0)) == graph.ty(result) => {
            Some(Rewrite::Replace(operand(0)))
        }
        OpKind::Reshape => {
            let inner = graph.op(def_op(graph, operand(0))?);
            (inner.kind == OpKind::Reshape).then(|| Rewrite::Edit {
                index: 0,
                value: inner.operands[0],
                attr: None,
            })
        }
        OpKind::Matmul => (0..2).find_map(|index| {
            let inner = graph.op(def_op(graph, operand(index))?);
            let swaps_last_two = inner.kind == OpKind::Transpose
                && inner.attrs.ints("perm").is_some_and(is_last_two_swap);
            let flag = ["transpose_a", "transpose_b"][index];
            let toggled = !d.attrs.bool(flag).unwrap_or(false);
            swaps_last_two.then(|| Rewrite::Edit {
                index,
                value: inner.operands[0],
                attr: Some((flag, Attr::Bool(toggled))),
            })
        }),
        _ => None,
    }
}

/// True for `[0, 1, .., n-1]`.
fn is_identity(perm: &[i64]) -> bool {
    perm.iter().enumerate().all(|(i, &p)| p == i as i64)
}

/// True for `[0, 1, .., n-3, n-1, n-2]` with `n >= 2`.
fn is_last_two_swap(perm: &[i64]) -> bool {
    let n = perm.len();
    n >= 2
        && is_identity(&perm[..n - 2])
        && perm[n - 2] == n as i64 - 1
        && perm[n - 1] == n as i64 - 2
}
