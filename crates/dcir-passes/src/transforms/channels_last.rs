//! `channels-last`: keeps a CNN's 4-D activations NHWC in memory between the
//! graph's edges.
//!
//! `conv2d` and the pooling ops stay NCHW by definition; what changes is how
//! the data between them lies. Write `T` for `transpose {perm = [0, 2, 3, 1]}`
//! (NCHW to NHWC) and `T⁻¹` for its inverse. Walking the body in order:
//!
//! - a `conv2d` result `y` gets its NHWC form `y' = T(y)`, and every other
//!   use of `y` reads `T⁻¹(y')` (a view of `y'`);
//! - a 1×1 stride-1 unpadded ungrouped `conv2d` becomes a matmul over the
//!   NHWC rows: `y' = reshape(reshape(x', [N·H·W, C]) · reshape(w, [K, C])ᵀ)`;
//! - an elementwise op (or `cast`) on 4-D values of which one is `T⁻¹(v')`
//!   runs on the NHWC forms (a `broadcast` along channels is re-aimed at
//!   dim 3, any other operand is read through `T`), and so does a `concat`
//!   along the channels (along dim 3) and a `global_avgpool` (a
//!   `reduce_mean` over dims 1 and 2, in two steps over large windows);
//! - every other op reads `T⁻¹(v')`, a view the fused kernels read through.
//!
//! The graph computes the same values (the interpreter's outputs do not
//! change; `tests/zoo.rs` checks every zoo CNN), and after `canonicalize` a
//! `T⁻¹(T(y))` nobody rewrote is `y` again. Graphs with `fused` ops are left
//! as they are.

use dcir_ir::{Attr, Attrs, Graph, Module, OpId, OpKind, TensorType, ValueId};

use super::common::{def_op, use_counts};
use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "channels-last",
    summary: "keep 4-D activations NHWC in memory between the graph's edges: conv results \
              transposed once, elementwise ops, channel concats and global pools on the NHWC \
              forms, 1x1 convolutions as matmuls over NHWC rows",
    options: &[],
    create: |_: &PassOptions| Ok(Box::new(ChannelsLast)),
};

struct ChannelsLast;

impl Pass for ChannelsLast {
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

use super::{TO_NCHW, TO_NHWC};
/// Where NCHW dim `d` lies in NHWC.
const NHWC_POSITION: [i64; 4] = [0, 3, 1, 2];

fn perm_attrs(perm: [i64; 4]) -> Attrs {
    Attrs::new().with("perm", Attr::Ints(perm.to_vec()))
}

fn nhwc_dims(dims: &[usize]) -> Vec<usize> {
    vec![dims[0], dims[2], dims[3], dims[1]]
}

/// `v'` when `v` is `T⁻¹(v')`.
fn nhwc_source(graph: &Graph, v: ValueId) -> Option<ValueId> {
    let d = graph.op(def_op(graph, v)?);
    (d.kind == OpKind::Transpose && d.attrs.ints("perm") == Some(&TO_NCHW[..]))
        .then(|| d.operands[0])
}

/// Rewrites the body of `graph`; true when anything changed.
fn rewrite(graph: &mut Graph) -> Result<bool, String> {
    let mut changed = false;
    for op in graph.block(graph.body()).ops.clone() {
        let d = graph.op(op);
        let four_d = d.results.len() == 1 && graph.ty(d.results[0]).rank() == 4;
        if !four_d {
            continue;
        }
        changed |= match d.kind {
            OpKind::Conv2d if is_pointwise(graph, op) => conv_as_matmul(graph, op)?,
            OpKind::Conv2d => conv(graph, op)?,
            OpKind::Concat if d.attrs.int("axis") == Some(1) => on_nhwc(graph, op)?,
            OpKind::GlobalAvgpool => global_avgpool(graph, op)?,
            k if k.is_elementwise() || k == OpKind::Cast => on_nhwc(graph, op)?,
            _ => false,
        };
    }
    // The views the rewrite left unread (NCHW views, re-aimed broadcasts'
    // originals), last first so that chains of them go too.
    let mut uses = use_counts(graph);
    for op in graph.block(graph.body()).ops.clone().into_iter().rev() {
        let d = graph.op(op);
        let view = matches!(d.kind, OpKind::Transpose | OpKind::Broadcast);
        if view && uses[d.results[0].index()] == 0 {
            for v in d.operands.clone() {
                uses[v.index()] -= 1;
            }
            graph.remove_op(op);
        }
    }
    Ok(changed)
}

/// A 1×1, stride-1, unpadded, undilated, ungrouped convolution.
fn is_pointwise(graph: &Graph, op: OpId) -> bool {
    let d = graph.op(op);
    let all = |name: &str, want: i64| {
        d.attrs
            .get(name)
            .and_then(Attr::as_ints)
            .is_none_or(|v| v.iter().all(|&x| x == want))
    };
    let w = graph.ty(d.operands[1]).dims();
    w.len() == 4
        && w[2] == 1
        && w[3] == 1
        && all("stride", 1)
        && all("pad", 0)
        && all("dilation", 1)
        && d.attrs.int("groups").unwrap_or(1) == 1
}

/// Position just after `op` in its block.
fn after(graph: &Graph, op: OpId) -> usize {
    let block = graph.op(op).parent.expect("a body op");
    graph
        .block(block)
        .ops
        .iter()
        .position(|&o| o == op)
        .expect("listed")
        + 1
}

/// Redirects every use of `op`'s result to `T⁻¹(y')`, `y'` (computed by the
/// caller from the result or standing in for it) inserted right after `op`.
/// `keep` is the op that must go on reading the result itself.
fn redirect(
    graph: &mut Graph,
    result: ValueId,
    nhwc: ValueId,
    keep: Option<OpId>,
) -> Result<(), String> {
    let at = after(graph, def_op(graph, nhwc).expect("an op result"));
    let hint = graph.value(result).name.clone();
    let body = graph.body();
    let back = dcir_ir::Rewriter::at(graph, body, at)
        .op(
            OpKind::Transpose,
            &[nhwc],
            perm_attrs(TO_NCHW),
            &format!("{hint}.nchw"),
        )
        .map_err(|e| e.to_string())?;
    graph.replace_all_uses(result, back);
    if let Some(keep) = keep {
        for v in &mut graph.op_mut(keep).operands {
            if *v == back {
                *v = result;
            }
        }
    }
    Ok(())
}

/// `conv2d` stays; its result gets its NHWC form.
fn conv(graph: &mut Graph, op: OpId) -> Result<bool, String> {
    let y = graph.op(op).results[0];
    let hint = graph.value(y).name.clone();
    let at = after(graph, op);
    let body = graph.body();
    let y_nhwc = dcir_ir::Rewriter::at(graph, body, at)
        .op(
            OpKind::Transpose,
            &[y],
            perm_attrs(TO_NHWC),
            &format!("{hint}.nhwc"),
        )
        .map_err(|e| e.to_string())?;
    let t = def_op(graph, y_nhwc).expect("an op result");
    redirect(graph, y, y_nhwc, Some(t))?;
    Ok(true)
}

/// The NHWC form of 4-D NCHW value `v`, inserted before `op`: the source of
/// `T⁻¹(v')`, a `broadcast` re-aimed, or `T(v)`.
fn nhwc_of(graph: &mut Graph, op: OpId, v: ValueId) -> Result<ValueId, String> {
    if let Some(src) = nhwc_source(graph, v) {
        return Ok(src);
    }
    let hint = format!("{}.nhwc", graph.value(v).name);
    let ty = graph.ty(v).clone();
    if let Some(b) = def_op(graph, v).filter(|&b| graph.op(b).kind == OpKind::Broadcast) {
        let d = graph.op(b);
        let dims: Vec<i64> = d
            .attrs
            .ints("dims")
            .unwrap_or(&[])
            .iter()
            .map(|&x| NHWC_POSITION[x as usize])
            .collect();
        if dims.windows(2).all(|w| w[0] < w[1]) {
            let src = d.operands[0];
            return dcir_ir::Rewriter::before(graph, op)
                .op_declared(
                    OpKind::Broadcast,
                    &[src],
                    Attrs::new().with("dims", Attr::Ints(dims)),
                    TensorType::new(ty.dtype, nhwc_dims(ty.dims())),
                    &hint,
                )
                .map_err(|e| e.to_string());
        }
    }
    dcir_ir::Rewriter::before(graph, op)
        .op(OpKind::Transpose, &[v], perm_attrs(TO_NHWC), &hint)
        .map_err(|e| e.to_string())
}

/// An elementwise op, `cast` or channel `concat` on the NHWC forms of its
/// operands, when one of them is NHWC already.
fn on_nhwc(graph: &mut Graph, op: OpId) -> Result<bool, String> {
    let d = graph.op(op).clone();
    let rank4 = d.operands.iter().all(|&v| graph.ty(v).rank() == 4);
    if !rank4 || !d.operands.iter().any(|&v| nhwc_source(graph, v).is_some()) {
        return Ok(false);
    }
    let mut operands = Vec::with_capacity(d.operands.len());
    for &v in &d.operands {
        operands.push(nhwc_of(graph, op, v)?);
    }
    let result = d.results[0];
    let ty = graph.ty(result).clone();
    let hint = format!("{}.nhwc", graph.value(result).name);
    let mut attrs = d.attrs.clone();
    if d.kind == OpKind::Concat {
        attrs = attrs.with("axis", Attr::Int(3));
    }
    let nhwc_ty = TensorType::new(ty.dtype, nhwc_dims(ty.dims()));
    let mut rw = dcir_ir::Rewriter::before(graph, op);
    let y = if d.kind == OpKind::Cast {
        rw.op_declared(OpKind::Cast, &operands, attrs, nhwc_ty, &hint)
    } else {
        rw.op(d.kind, &operands, attrs, &hint)
    }
    .map_err(|e| e.to_string())?;
    redirect(graph, result, y, None)?;
    graph.remove_op(op);
    Ok(true)
}

/// Windows of at least this many pixels are averaged in two steps.
const TWO_STEP_POOL: usize = 256;

/// `global_avgpool` of an NHWC value as a `reduce_mean` over its dims 1, 2;
/// over a window of [`TWO_STEP_POOL`] pixels or more, as a `reduce_mean`
/// over dim 2 (the columns of each row) then one over dim 1. Either way a
/// thread reduces one output element across rows that lie `C` elements
/// apart (neighbouring threads read neighbouring channels); in one step
/// that leaves `N·C` threads for the whole tensor (DeepLabV3's ASPP pool:
/// 2048 threads over 65×65×2048, 437 µs on an H100), in two `N·H·C` for
/// the large step.
fn global_avgpool(graph: &mut Graph, op: OpId) -> Result<bool, String> {
    let x = graph.op(op).operands[0];
    let Some(src) = nhwc_source(graph, x) else {
        return Ok(false);
    };
    let result = graph.op(op).results[0];
    let hint = format!("{}.nhwc", graph.value(result).name);
    let dims = graph.ty(src).dims().to_vec();
    let mean = |axes: Vec<i64>| {
        Attrs::new()
            .with("axes", Attr::Ints(axes))
            .with("keepdims", Attr::Bool(true))
    };
    let mut rw = dcir_ir::Rewriter::before(graph, op);
    let e = |e: dcir_ir::BuildError| e.to_string();
    let y = if dims[1] * dims[2] >= TWO_STEP_POOL {
        let rows = rw
            .op(
                OpKind::ReduceMean,
                &[src],
                mean(vec![2]),
                &format!("{hint}.rows"),
            )
            .map_err(e)?;
        rw.op(OpKind::ReduceMean, &[rows], mean(vec![1]), &hint)
            .map_err(e)?
    } else {
        rw.op(OpKind::ReduceMean, &[src], mean(vec![1, 2]), &hint)
            .map_err(e)?
    };
    redirect(graph, result, y, None)?;
    graph.remove_op(op);
    Ok(true)
}

/// A pointwise `conv2d` as a matmul of the NHWC rows by the weight's
/// transpose.
fn conv_as_matmul(graph: &mut Graph, op: OpId) -> Result<bool, String> {
    let d = graph.op(op).clone();
    let (x, w, y) = (d.operands[0], d.operands[1], d.results[0]);
    let x_nhwc = nhwc_of(graph, op, x)?;
    let (ty, w_dims) = (graph.ty(y).clone(), graph.ty(w).dims().to_vec());
    let [n, k, h, wd] = [ty.dims()[0], ty.dims()[1], ty.dims()[2], ty.dims()[3]];
    let c = w_dims[1];
    let hint = graph.value(y).name.clone();
    let h_ = |s: &str| format!("{hint}.{s}");
    let mut rw = dcir_ir::Rewriter::before(graph, op);
    let e = |e: dcir_ir::BuildError| e.to_string();
    let rows = rw
        .op_declared(
            OpKind::Reshape,
            &[x_nhwc],
            Attrs::new(),
            TensorType::new(ty.dtype, vec![n * h * wd, c]),
            &h_("rows"),
        )
        .map_err(e)?;
    let w2 = rw
        .op_declared(
            OpKind::Reshape,
            &[w],
            Attrs::new(),
            TensorType::new(ty.dtype, vec![k, c]),
            &h_("w"),
        )
        .map_err(e)?;
    let prod = rw
        .op(
            OpKind::Matmul,
            &[rows, w2],
            Attrs::new().with("transpose_b", Attr::Bool(true)),
            &h_("mm"),
        )
        .map_err(e)?;
    let y_nhwc = rw
        .op_declared(
            OpKind::Reshape,
            &[prod],
            Attrs::new(),
            TensorType::new(ty.dtype, vec![n, h, wd, k]),
            &h_("nhwc"),
        )
        .map_err(e)?;
    redirect(graph, y, y_nhwc, None)?;
    graph.remove_op(op);
    Ok(true)
}
