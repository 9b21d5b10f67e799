//! `nhwc-inputs`: the graph's NCHW inputs that convolutions read, stored
//! NHWC once at the edge.
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
//! ops. `canonicalize` folds `T⁻¹(T(x))` back to `x`, so the pass runs after
//! it (`dcir_fusion::layout`'s pipeline).

use dcir_ir::{Attr, Attrs, Graph, Module, OpKind, ValueDef, ValueId};

use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "nhwc-inputs",
    summary: "store each NCHW graph input that a convolution of 16 or more input channels \
              reads NHWC once, the convolution reading it through a transpose (run after \
              canonicalize, which would fold the pair)",
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
fn applies(graph: &Graph, op: dcir_ir::OpId) -> bool {
    let d = graph.op(op);
    if d.kind != OpKind::Conv2d || d.attrs.int("groups").unwrap_or(1) != 1 {
        return false;
    }
    let x = d.operands[0];
    let is_param = matches!(graph.value(x).def, ValueDef::BlockArg { .. });
    let (xd, wd) = (graph.ty(x).dims(), graph.ty(d.operands[1]).dims());
    let pointwise = wd.len() == 4 && wd[2] == 1 && wd[3] == 1;
    is_param && xd.len() == 4 && xd[1] >= MIN_CHANNELS && !pointwise
}

/// Rewrites the body of `graph`; true when anything changed.
fn rewrite(graph: &mut Graph) -> Result<bool, String> {
    let body = graph.body();
    // One NHWC copy per input, made before the body's first op.
    let mut stored: Vec<(ValueId, ValueId)> = Vec::new();
    for op in graph.block(body).ops.clone() {
        if !applies(graph, op) {
            continue;
        }
        let x = graph.op(op).operands[0];
        let nhwc = match stored.iter().find(|(v, _)| *v == x) {
            Some(&(_, n)) => n,
            None => {
                let hint = format!("{}.nhwc", graph.value(x).name);
                let n = dcir_ir::Rewriter::at(graph, body, stored.len())
                    .op(OpKind::Transpose, &[x], perm([0, 2, 3, 1]), &hint)
                    .map_err(|e| e.to_string())?;
                stored.push((x, n));
                n
            }
        };
        let hint = format!("{}.nchw", graph.value(x).name);
        let view = dcir_ir::Rewriter::before(graph, op)
            .op(OpKind::Transpose, &[nhwc], perm([0, 3, 1, 2]), &hint)
            .map_err(|e| e.to_string())?;
        graph.op_mut(op).operands[0] = view;
    }
    Ok(!stored.is_empty())
}
