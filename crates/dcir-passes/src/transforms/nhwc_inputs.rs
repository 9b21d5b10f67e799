//! `nhwc-inputs`: the graph's NCHW inputs that convolutions read, stored
//! NHWC once at the edge, and their f16/bf16 filters stored KRSC.
//!
//! `channels-last` turns what convolutions produce NHWC; a convolution
//! reading a graph parameter still reads it NCHW, and a library runs such a
//! call at about half the speed of an NHWC one (cuDNN, seventh session's
//! fit). With `T` the NCHW → NHWC transpose, this pass makes each such
//! convolution read `T⁻¹(T(x))`: `T(x)` is one transpose kernel at the
//! graph's edge, and the convolution reads the NHWC value through a view.
//! It applies to ungrouped, non-pointwise convolutions of at least
//! [`MIN_CHANNELS`] input channels (an image's three channels stay: a stem
//! runs faster NCHW on dcir's own kernel), and to graphs without `fused`
//! ops.
//!
//! A convolution that reads its input NHWC (so stored by `channels-last` or
//! by this pass) and an f16 or bf16 filter parameter `w` `[K, C, R, S]` of
//! at least [`MIN_CHANNELS`] input channels, ungrouped, reads the filter as
//! `T⁻¹(T(w))` too: `T(w)` stores it `[K, R, S, C]` (KRSC), the channels
//! contiguous, as the Hopper mainloop's implicit GEMM reads a filter (one
//! weight-only transpose kernel). An f32 filter stays as stored (cuDNN and
//! dcir's f32 kernels read it so).
//!
//! `canonicalize` folds `T⁻¹(T(x))` back to `x`, so the pass runs after it
//! (`dcir_fusion::layout`'s pipeline).

use dcir_ir::{Attr, Attrs, DType, Graph, Module, OpId, OpKind, ValueDef, ValueId};

use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "nhwc-inputs",
    summary: "store each NCHW graph input that a convolution of 16 or more input channels \
              reads NHWC once, and such a convolution's f16/bf16 filter parameter KRSC, the \
              convolution reading each through a transpose (run after canonicalize, which \
              would fold the pairs)",
    options: &[],
    create: |_: &PassOptions| Ok(Box::new(NhwcInputs)),
};

/// The fewest input channels of a convolution whose graph input is stored
/// NHWC.
pub const MIN_CHANNELS: usize = 16;

struct NhwcInputs;

impl Pass for NhwcInputs {
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
            let fused = graph
                .all_ops()
                .iter()
                .any(|&o| graph.op(o).kind == OpKind::Fused);
            if !fused {
                changed |= rewrite(graph).map_err(PassError::new)?;
            }
        }
        Ok(PassResult::from_changed(changed))
    }
}

fn perm(p: [i64; 4]) -> Attrs {
    Attrs::new().with("perm", Attr::Ints(p.to_vec()))
}

/// Whether convolution operand `x` of `op` is stored NHWC by this pass.
fn input_applies(graph: &Graph, op: OpId) -> bool {
    let d = graph.op(op);
    if !ungrouped_conv(graph, op) {
        return false;
    }
    let x = d.operands[0];
    let (xd, wd) = (graph.ty(x).dims(), graph.ty(d.operands[1]).dims());
    let pointwise = wd.len() == 4 && wd[2] == 1 && wd[3] == 1;
    is_param(graph, x) && xd.len() == 4 && xd[1] >= MIN_CHANNELS && !pointwise
}

/// Whether filter operand `w` of `op`, whose input is by now read NHWC or
/// not, is stored KRSC by this pass.
fn filter_applies(graph: &Graph, op: OpId) -> bool {
    if !ungrouped_conv(graph, op) {
        return false;
    }
    let d = graph.op(op);
    let w = d.operands[1];
    let wd = graph.ty(w).dims();
    is_nchw_view(graph, d.operands[0])
        && is_param(graph, w)
        && matches!(graph.ty(w).dtype, DType::F16 | DType::BF16)
        && wd.len() == 4
        && wd[1] >= MIN_CHANNELS
}

fn ungrouped_conv(graph: &Graph, op: OpId) -> bool {
    let d = graph.op(op);
    d.kind == OpKind::Conv2d && d.attrs.int("groups").unwrap_or(1) == 1
}

fn is_param(graph: &Graph, v: ValueId) -> bool {
    matches!(graph.value(v).def, ValueDef::BlockArg { .. })
}

/// Whether `v` is `T⁻¹` of a value (an NHWC or KRSC tensor read as NCHW).
fn is_nchw_view(graph: &Graph, v: ValueId) -> bool {
    let ValueDef::OpResult { op, .. } = graph.value(v).def else {
        return false;
    };
    let d = graph.op(op);
    d.kind == OpKind::Transpose
        && matches!(d.attrs.get("perm"), Some(Attr::Ints(p)) if p.as_slice() == TO_NCHW)
}

const TO_NHWC: [i64; 4] = [0, 2, 3, 1];
const TO_NCHW: [i64; 4] = [0, 3, 1, 2];

/// Rewrites the body of `graph`; true when anything changed.
fn rewrite(graph: &mut Graph) -> Result<bool, String> {
    let body = graph.body();
    // One channels-last copy per parameter, made before the body's first op.
    let mut stored: Vec<(ValueId, ValueId)> = Vec::new();
    for op in graph.block(body).ops.clone() {
        if input_applies(graph, op) {
            read_channels_last(graph, op, 0, &mut stored)?;
        }
        if filter_applies(graph, op) {
            read_channels_last(graph, op, 1, &mut stored)?;
        }
    }
    Ok(!stored.is_empty())
}

/// Makes operand `i` of `op` (a parameter) read `T⁻¹(T(p))`, `T(p)` made
/// once per parameter and recorded in `stored`.
fn read_channels_last(
    graph: &mut Graph,
    op: OpId,
    i: usize,
    stored: &mut Vec<(ValueId, ValueId)>,
) -> Result<(), String> {
    let body = graph.body();
    let p = graph.op(op).operands[i];
    let (to, back) = if i == 0 {
        ("nhwc", "nchw")
    } else {
        ("krsc", "kcrs")
    };
    let last = match stored.iter().find(|(v, _)| *v == p) {
        Some(&(_, n)) => n,
        None => {
            let hint = format!("{}.{to}", graph.value(p).name);
            let n = dcir_ir::Rewriter::at(graph, body, stored.len())
                .op(OpKind::Transpose, &[p], perm(TO_NHWC), &hint)
                .map_err(|e| e.to_string())?;
            stored.push((p, n));
            n
        }
    };
    let hint = format!("{}.{back}", graph.value(p).name);
    let view = dcir_ir::Rewriter::before(graph, op)
        .op(OpKind::Transpose, &[last], perm(TO_NCHW), &hint)
        .map_err(|e| e.to_string())?;
    graph.op_mut(op).operands[i] = view;
    Ok(())
}
