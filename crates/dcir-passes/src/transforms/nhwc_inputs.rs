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
//! [`MIN_CHANNELS`] input channels (a strided one of fewer, a stem, reads
//! space-to-depth instead: below), and to graphs without `fused` ops.
//!
//! A convolution that reads its input NHWC (so stored by `channels-last` or
//! by this pass) and an f16 or bf16 filter parameter `w` `[K, C, R, S]` of
//! at least [`MIN_CHANNELS`] input channels, ungrouped, reads the filter as
//! `T⁻¹(T(w))` too: `T(w)` stores it `[K, R, S, C]` (KRSC), the channels
//! contiguous, as the Hopper mainloop's implicit GEMM reads a filter (one
//! weight-only transpose kernel). An f32 filter stays as stored (cuDNN and
//! dcir's f32 kernels read it so).
//!
//! A strided f16/bf16 convolution of fewer channels (a stem: an image's
//! three) reads its input space-to-depth instead: with stride `s` in both
//! dims, each `s × s` block of pixels becomes one pixel of `s²·C'` channels
//! (`C'` the channels zero-padded so `s²·C'` is a multiple of 16), stored
//! NHWC, and the filter, zero-padded to whole blocks and stored KRSC the
//! same way, makes the convolution a stride-1 one over a window of
//! `⌈(a + R) / s⌉` blocks (`a` aligns the window's first row to a block).
//! The sums are the same (each extra term is a zero weight times a
//! zero-padded or real input), the contraction becomes tensor-core shaped
//! (16-channel taps, tap-major k; ResNet-50's 7×7 stem: 147 → 256), and a
//! patchify convolution (stride equal to its window, ViT's 16×16) becomes a
//! pointwise one. It applies where the blocks cover the output exactly
//! ([`SpaceToDepth::of`]).
//!
//! `canonicalize` folds `T⁻¹(T(x))` back to `x`, so the pass runs after it
//! (`dcir_fusion::layout`'s pipeline).

use dcir_ir::{Attr, Attrs, DType, Graph, Module, OpId, OpKind, TensorType, ValueDef, ValueId};

use super::{SPACE_TO_DEPTH, TO_NCHW, TO_NHWC};
use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "nhwc-inputs",
    summary: "store each NCHW graph input that a convolution of 16 or more input channels \
              reads NHWC once, and such a convolution's f16/bf16 filter parameter KRSC, the \
              convolution reading each through a transpose; a strided f16/bf16 convolution of \
              fewer channels (a stem) reads its input and filter space-to-depth, stored so \
              (run after canonicalize, which would fold the pairs)",
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

/// Rewrites the body of `graph`; true when anything changed.
fn rewrite(graph: &mut Graph) -> Result<bool, String> {
    let body = graph.body();
    // One channels-last copy per parameter, made before the body's first op.
    let mut stored: Vec<(ValueId, ValueId)> = Vec::new();
    let mut blocked = false;
    for op in graph.block(body).ops.clone() {
        if let Some(s2d) = SpaceToDepth::of(graph, op) {
            s2d.rewrite(graph, op)?;
            blocked = true;
            continue;
        }
        if input_applies(graph, op) {
            read_channels_last(graph, op, 0, &mut stored)?;
        }
        if filter_applies(graph, op) {
            read_channels_last(graph, op, 1, &mut stored)?;
        }
    }
    Ok(blocked || !stored.is_empty())
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

/// How a strided convolution of few channels reads its operands
/// space-to-depth: per spatial dim (rows, then columns) of stride `s`.
#[derive(Debug, PartialEq)]
struct SpaceToDepth {
    /// The stride, the side of a block.
    s: usize,
    /// The input channels, zero-padded (`s² · channels` a multiple of 16).
    channels: usize,
    /// Per dim: the input's extent padded to whole blocks.
    padded: [usize; 2],
    /// Per dim: zero taps before the window (`a`), aligning its first row
    /// to a block.
    lead: [usize; 2],
    /// Per dim: the window in blocks.
    taps: [usize; 2],
    /// Per dim: the stride-1 convolution's padding, in blocks, before and after.
    pad: [[usize; 2]; 2],
}

impl SpaceToDepth {
    /// The rewrite of conv `op`, when it applies: ungrouped, undilated,
    /// the same stride `s ≥ 2` in both dims, fewer than [`MIN_CHANNELS`]
    /// input channels, an f16/bf16 graph parameter as input and filter,
    /// and blocks that cover the output exactly (no padding after the
    /// blocks would be negative).
    fn of(graph: &Graph, op: OpId) -> Option<SpaceToDepth> {
        if !ungrouped_conv(graph, op) {
            return None;
        }
        let d = graph.op(op);
        let (x, w) = (d.operands[0], d.operands[1]);
        let (xd, wd, od) = (
            graph.ty(x).dims(),
            graph.ty(w).dims(),
            graph.ty(d.results[0]).dims(),
        );
        let stride = d.attrs.ints("stride").unwrap_or(&[1, 1]);
        let dilation = d.attrs.ints("dilation").unwrap_or(&[1, 1]);
        let pad = d.attrs.ints("pad").unwrap_or(&[0, 0, 0, 0]);
        let half = matches!(graph.ty(x).dtype, DType::F16 | DType::BF16);
        if !(half
            && is_param(graph, x)
            && is_param(graph, w)
            && xd.len() == 4
            && xd[1] < MIN_CHANNELS
            && stride.len() == 2
            && stride[0] == stride[1]
            && stride[0] >= 2
            && dilation == [1, 1])
        {
            return None;
        }
        let s = stride[0] as usize;
        let channels = (xd[1]..=16).find(|c| (c * s * s).is_multiple_of(16))?;
        let mut out = SpaceToDepth {
            s,
            channels,
            padded: [0; 2],
            lead: [0; 2],
            taps: [0; 2],
            pad: [[0; 2]; 2],
        };
        for i in 0..2 {
            let (extent, window, before, output) =
                (xd[2 + i], wd[2 + i], pad[i] as usize, od[2 + i]);
            let blocks = extent.div_ceil(s);
            let first = before.div_ceil(s);
            let lead = first * s - before;
            let taps = (lead + window).div_ceil(s);
            // The last output's window ends at block `output - 1 - first + taps - 1`.
            let after = (output + taps).checked_sub(first + 1 + blocks)?;
            if blocks + first + after + 1 != output + taps {
                return None;
            }
            out.padded[i] = blocks * s;
            out.lead[i] = lead;
            out.taps[i] = taps;
            out.pad[i] = [first, after];
        }
        Some(out)
    }

    /// Makes conv `op` read its input and filter space-to-depth, each
    /// stored NHWC / KRSC by a pad, a reshape into blocks, a transpose that
    /// brings a block's positions beside its channels and a reshape, and
    /// read through the inverse transpose.
    fn rewrite(&self, graph: &mut Graph, op: OpId) -> Result<(), String> {
        let s = self.s;
        let (x, w) = (graph.op(op).operands[0], graph.op(op).operands[1]);
        let (xd, wd) = (graph.ty(x).dims().to_vec(), graph.ty(w).dims().to_vec());
        let x_high = [
            0,
            self.channels - xd[1],
            self.padded[0] - xd[2],
            self.padded[1] - xd[3],
        ];
        let x_view = self.blocked(graph, op, x, [0; 4], x_high, "nchw")?;
        let w_low = [0, 0, self.lead[0], self.lead[1]];
        let w_high = [
            0,
            self.channels - wd[1],
            self.taps[0] * s - wd[2] - self.lead[0],
            self.taps[1] * s - wd[3] - self.lead[1],
        ];
        let w_view = self.blocked(graph, op, w, w_low, w_high, "kcrs")?;
        let d = graph.op_mut(op);
        d.operands[0] = x_view;
        d.operands[1] = w_view;
        d.attrs.set("stride", Attr::Ints(vec![1, 1]));
        let [[top, bottom], [left, right]] = self.pad;
        d.attrs.set(
            "pad",
            Attr::Ints([top, left, bottom, right].map(|p| p as i64).to_vec()),
        );
        Ok(())
    }

    /// `v` (`[A, C, H, W]`) padded by `low`/`high`, as `[A, s²·C', H/s,
    /// W/s]`: the stored `[A, H/s, W/s, s²·C']` (channel `(dy·s + dx)·C' +
    /// c`) read through the inverse transpose, inserted before `op`.
    fn blocked(
        &self,
        graph: &mut Graph,
        op: OpId,
        v: ValueId,
        low: [usize; 4],
        high: [usize; 4],
        view: &str,
    ) -> Result<ValueId, String> {
        let s = self.s;
        let name = graph.value(v).name.clone();
        let dtype = graph.ty(v).dtype;
        let mut r = dcir_ir::Rewriter::before(graph, op);
        let ints = |a: [usize; 4]| Attr::Ints(a.map(|p| p as i64).to_vec());
        let padded = if low == [0; 4] && high == [0; 4] {
            v
        } else {
            let attrs = Attrs::new().with("low", ints(low)).with("high", ints(high));
            r.op(OpKind::Pad, &[v], attrs, &format!("{name}.pad"))
                .map_err(|e| e.to_string())?
        };
        let [a, c, h, w] = r
            .ty(padded)
            .dims()
            .try_into()
            .map_err(|_| "a 4-D operand")?;
        let (hb, wb) = (h / s, w / s);
        let split = TensorType::new(dtype, vec![a, c, hb, s, wb, s]);
        let split = r
            .op_declared(
                OpKind::Reshape,
                &[padded],
                Attrs::new(),
                split,
                &format!("{name}.blocks"),
            )
            .map_err(|e| e.to_string())?;
        let blocks_last = Attrs::new().with("perm", Attr::Ints(SPACE_TO_DEPTH.to_vec()));
        let moved = r
            .op(
                OpKind::Transpose,
                &[split],
                blocks_last,
                &format!("{name}.blocks_last"),
            )
            .map_err(|e| e.to_string())?;
        let joined = TensorType::new(dtype, vec![a, hb, wb, s * s * c]);
        let joined = r
            .op_declared(
                OpKind::Reshape,
                &[moved],
                Attrs::new(),
                joined,
                &format!("{name}.s2d"),
            )
            .map_err(|e| e.to_string())?;
        r.op(
            OpKind::Transpose,
            &[joined],
            perm(TO_NCHW),
            &format!("{name}.s2d.{view}"),
        )
        .map_err(|e| e.to_string())
    }
}
