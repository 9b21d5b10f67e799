//! `fold-matmul-scale`: a constant factor on a matmul operand moves to its
//! result.
//!
//! `matmul(x * c, y * d)` — either factor may be absent, `c` and `d` are
//! splat constants on either side of their `mul` — becomes
//! `matmul(x, y) * (c·d)`. Attention as `torch.onnx.export` writes it scales
//! Q and Kᵀ each by `d^-1/4` before the scores' matmul; after the move the
//! factor is an epilogue of the contraction (rule E1) and the operands are
//! views that a kernel, or a library call, reads in place, where an
//! elementwise op before a contraction is never fused into it (rule X3).
//!
//! The factor is the product of the two constants as their dtype rounds
//! them, finite and non-zero. Rounding changes: the product is scaled once
//! instead of its operands rounded after scaling (the same value in exact
//! arithmetic). Float matmuls of graph bodies only; the `mul` stays while
//! anything else uses it.

use dcir_interp::TensorData;
use dcir_ir::{Attrs, Graph, OpId, OpKind, Rewriter, ValueId};

use super::common::{FoldEach, def_op, replace_op, splat_value};
use crate::pass::PassError;
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "fold-matmul-scale",
    summary: "matmul(x * c, y * d) → matmul(x, y) * (c·d) for splat constants c, d (either may \
              be absent): the factor becomes the contraction's epilogue and its operands views \
              (changes rounding)",
    options: &[],
    create: |_: &PassOptions| {
        Ok(Box::new(FoldEach {
            name: DEF.name,
            fold,
        }))
    },
};

/// `(x, c)` when `v = x * c` or `c * x` for a splat constant `c` of `v`'s
/// type, finite and non-zero, as `v`'s dtype rounds it.
fn scaled(graph: &Graph, v: ValueId) -> Option<(ValueId, f64)> {
    let op = graph.op(def_op(graph, v)?);
    if op.kind != OpKind::Mul {
        return None;
    }
    let ty = graph.ty(v);
    (0..2).find_map(|i| {
        let (x, c) = (op.operands[1 - i], op.operands[i]);
        let c = splat_value(graph, c)?;
        let c = TensorData::from_f64(ty.dtype, &[c]).to_f64()[0];
        (graph.ty(x) == ty && c.is_finite() && c != 0.0).then_some((x, c))
    })
}

/// Folds the factors of `op`'s operands into a `mul` after it; false when
/// `op` is not a float matmul with a scaled operand.
fn fold(graph: &mut Graph, op: OpId) -> Result<bool, PassError> {
    let d = graph.op(op);
    if d.kind != OpKind::Matmul || !graph.ty(d.results[0]).dtype.is_float() {
        return Ok(false);
    }
    let (a, b) = (d.operands[0], d.operands[1]);
    let (sa, sb) = (scaled(graph, a), scaled(graph, b));
    if sa.is_none() && sb.is_none() {
        return Ok(false);
    }
    let ty = graph.ty(d.results[0]).clone();
    let factor = sa.map_or(1.0, |s| s.1) * sb.map_or(1.0, |s| s.1);
    let factor = TensorData::from_f64(ty.dtype, &[factor]).to_f64()[0];
    if !factor.is_finite() || factor == 0.0 {
        return Ok(false);
    }
    let attrs = d.attrs.clone();
    let hint = graph.value(d.results[0]).name.clone();
    let operands = [sa.map_or(a, |s| s.0), sb.map_or(b, |s| s.0)];
    let mut rw = Rewriter::before(graph, op);
    let product = rw.op(
        OpKind::Matmul,
        &operands,
        attrs,
        &format!("{hint}.unscaled"),
    )?;
    let result = if factor == 1.0 {
        product
    } else {
        let k = rw.splat(ty.dtype, factor, ty.dims(), &format!("{hint}.scale"))?;
        rw.op(
            OpKind::Mul,
            &[product, k],
            Attrs::new(),
            &format!("{hint}.scaled"),
        )?
    };
    replace_op(graph, op, result);
    Ok(true)
}
