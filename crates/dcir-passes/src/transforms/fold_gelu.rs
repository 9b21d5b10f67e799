//! `fold-gelu`: the exact GELU written out in primitive ops becomes one
//! `gelu`, the inverse of `decompose-gelu`.
//!
//! ```text
//! y = x * (1 + erf(x / sqrt(2))) * 0.5      (torch.onnx.export of nn.GELU
//!                                            before opset 20; HF's gelu)
//! ```
//!
//! The three factors may come in any order and grouping (`(x · a) · 0.5`,
//! `(x · 0.5) · a`, `x · (0.5 · a)`), `1 + erf` either way round, and the
//! argument as `x / √2` or `x · (1/√2)`. Constants are splat constants as
//! their dtype rounds them: 0.5 and 1 exactly, √2 and 1/√2 within 1e-5 of
//! the dtype's rounding of the true value (f16's `1.4140625` is `√2`).
//! A fused kernel then evaluates GELU by one helper in f32 instead of `erf`
//! (about 12 instructions fewer per element in ViT's MLP epilogue), and the
//! graph reads as the model was written. Rounding changes: the
//! intermediates are no longer rounded to the dtype. Float values of graph
//! bodies only; the ops matched stay while anything else uses them.

use std::f64::consts::{FRAC_1_SQRT_2, SQRT_2};

use dcir_interp::TensorData;
use dcir_ir::{Attrs, DType, Graph, OpId, OpKind, Rewriter, ValueId};

use super::common::{FoldEach, def_op, replace_op, splat_value};
use crate::pass::PassError;
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "fold-gelu",
    summary: "x · (1 + erf(x / √2)) · 0.5, in any order and grouping → gelu(x) (changes \
              rounding: the intermediates are not rounded to the dtype)",
    options: &[],
    create: |_: &PassOptions| {
        Ok(Box::new(FoldEach {
            name: DEF.name,
            fold,
        }))
    },
};

/// Replaces `op` by `gelu(x)` where it computes that written out.
fn fold(graph: &mut Graph, op: OpId) -> Result<bool, PassError> {
    let Some(x) = gelu_input(graph, op) else {
        return Ok(false);
    };
    let hint = format!("{}.gelu", graph.value(graph.op(op).results[0]).name);
    let mut rw = Rewriter::before(graph, op);
    let y = rw.op(OpKind::Gelu, &[x], Attrs::new(), &hint)?;
    replace_op(graph, op, y);
    Ok(true)
}

/// `x` when `op` computes `gelu(x)` written out, its factors grouped any
/// way in two `mul`s.
fn gelu_input(graph: &Graph, op: OpId) -> Option<ValueId> {
    let d = graph.op(op);
    if d.kind != OpKind::Mul {
        return None;
    }
    let ty = graph.ty(d.results[0]);
    if !ty.dtype.is_float() {
        return None;
    }
    let dtype = ty.dtype;
    // Each side as itself or, where a `mul` defines it, as its two factors.
    let sides = |v: ValueId| {
        let mut ways = vec![vec![v]];
        if let Some(m) = def_op(graph, v).map(|o| graph.op(o))
            && m.kind == OpKind::Mul
        {
            ways.push(m.operands.clone());
        }
        ways
    };
    let (left, right) = (sides(d.operands[0]), sides(d.operands[1]));
    for l in &left {
        for r in &right {
            let leaves: Vec<ValueId> = l.iter().chain(r).copied().collect();
            if leaves.len() == 3
                && let Some(x) = three_factors(graph, dtype, &leaves)
                && graph.ty(x) == ty
            {
                return Some(x);
            }
        }
    }
    None
}

/// `x` when `leaves` are `0.5`, `1 + erf(x / √2)` and `x` in some order.
fn three_factors(graph: &Graph, dtype: DType, leaves: &[ValueId]) -> Option<ValueId> {
    let half = leaves
        .iter()
        .position(|&v| is_splat(graph, dtype, v, 0.5))?;
    (0..3).filter(|&i| i != half).find_map(|i| {
        let x = leaves[3 - half - i];
        (erf_argument_of(graph, dtype, leaves[i])? == x).then_some(x)
    })
}

/// `x` when `v = 1 + erf(x / √2)` (either sum order, `x · (1/√2)` too).
fn erf_argument_of(graph: &Graph, dtype: DType, v: ValueId) -> Option<ValueId> {
    let sum = graph.op(def_op(graph, v)?);
    if sum.kind != OpKind::Add {
        return None;
    }
    let one = sum
        .operands
        .iter()
        .position(|&o| is_splat(graph, dtype, o, 1.0))?;
    let erf = graph.op(def_op(graph, sum.operands[1 - one])?);
    if erf.kind != OpKind::Erf {
        return None;
    }
    let scaled = graph.op(def_op(graph, erf.operands[0])?);
    match scaled.kind {
        OpKind::Div if is_near(graph, dtype, scaled.operands[1], SQRT_2) => {
            Some(scaled.operands[0])
        }
        OpKind::Mul => (0..2).find_map(|i| {
            is_near(graph, dtype, scaled.operands[i], FRAC_1_SQRT_2)
                .then_some(scaled.operands[1 - i])
        }),
        _ => None,
    }
}

/// `v` is a splat constant that `dtype` rounds to `value`'s rounding.
fn is_splat(graph: &Graph, dtype: DType, v: ValueId, value: f64) -> bool {
    splat_value(graph, v).is_some_and(|c| rounded(dtype, c) == rounded(dtype, value))
}

/// `v` is a splat constant within 1e-5 (relative) of `value` once `dtype`
/// rounds both.
fn is_near(graph: &Graph, dtype: DType, v: ValueId, value: f64) -> bool {
    let target = rounded(dtype, value);
    splat_value(graph, v).is_some_and(|c| (rounded(dtype, c) - target).abs() <= 1e-5 * target)
}

fn rounded(dtype: DType, value: f64) -> f64 {
    TensorData::from_f64(dtype, &[value]).to_f64()[0]
}
