//! What a group reads, writes and computes: compulsory traffic, flops, and
//! the problem shape of its anchor ops, computed once per estimate.

use dcir_ir::shape::Rows;
use dcir_ir::{Attr, DType, Graph, OpId, OpKind, TensorType, ValueDef, ValueId};
use dcir_passes::analysis::op_cost;
use rustc_hash::FxHashSet;

use crate::class::{Role, role};
use crate::group::Group;
use crate::legality::GroupKind;

/// Largest tensor the model accepts, elements (keeps every product of two
/// counts inside `u64`/`f64` exact enough and free of overflow).
const MAX_ELEMENTS: usize = 1 << 40;

/// A GEMM view of a contraction: `batch` independent `m × n × k` products.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmShape {
    pub batch: f64,
    pub m: f64,
    pub n: f64,
    pub k: f64,
    /// A convolution's window taps (`k` is its channels per group times
    /// them); 1 for a matmul.
    pub taps: f64,
    /// Bytes of the A operand (the activation; for a conv, the input image).
    pub a_bytes: f64,
    /// Bytes of the B operand (the weights).
    pub b_bytes: f64,
    /// For a conv: input channels per group times stride area, the distinct
    /// input elements one output row of the implicit GEMM touches; for a
    /// matmul: `k`.
    pub a_row_elems: f64,
    /// Flops of prologue ops feeding operand A / B, recomputed per reuse.
    pub prologue: [f64; 2],
    /// Instructions a tensor-core conv spends staging one element of A / B
    /// through registers (0 for a matmul, whose operands `cp.async` copies).
    pub gather: [f64; 2],
    /// Whether the FMA kernels load A element by element (a conv's im2col
    /// other than a 1x1 stride-1 unpadded conv over a multiple of 4 pixels,
    /// as dcir-cuda's `gemm` decides).
    pub a_gathered: bool,
    /// A convolution the Hopper mainloop's im2col copies read: one channel
    /// group, its input a transpose of an NHWC value and its filter of a
    /// KRSC one (channels contiguous, a multiple of 8), strides at most 8.
    pub channels_last: bool,
}

impl GemmShape {
    /// The 64-wide k steps of the Hopper mainloop: a matmul's `⌈k / 64⌉`, a
    /// convolution's as its im2col copies walk them
    /// ([`crate::hopper_conv_steps`]).
    pub fn hopper_k_steps(&self) -> f64 {
        if self.taps > 1.0 || self.channels_last {
            let channels = (self.k / self.taps) as usize;
            crate::hopper_conv_steps(channels, self.taps as usize).steps as f64
        } else {
            (self.k / 64.0).ceil()
        }
    }
}

/// Instructions to stage one im2col element on the tensor-core pixel path:
/// with one tap or k tap-major an add, a load, a select and a shared store;
/// with k channel-major over several taps also k's channel and tap and the
/// window's bounds check.
const GATHER_ONE_TAP: f64 = 4.0;
const GATHER_CHANNEL_MAJOR: f64 = 14.0;
/// Instructions to stage one weight element through the index maps (its
/// index, a load, two conversions, its share of the pack and the store).
const GATHER_INDEX_MAP: f64 = 8.0;

/// Geometry of a depthwise convolution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Depthwise {
    pub n: f64,
    pub channels: f64,
    pub oh: f64,
    pub ow: f64,
    pub kh: f64,
    pub kw: f64,
    pub stride: [f64; 2],
    pub dilation: [f64; 2],
}

/// Where a reduction's rows lie in memory ([`Rows::contiguous`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowLayout {
    /// Each row is contiguous (the reduced dims are innermost).
    Contiguous,
    /// The innermost dim is kept: consecutive rows are adjacent, so one
    /// thread per row reads coalesced.
    Interleaved,
    /// Neither: rows and their elements are both strided.
    Strided,
}

/// The problem of a group, by kind.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Body {
    /// `n` elements in the iteration space; `inner` its innermost extent.
    Elementwise { n: f64, inner: usize },
    /// `rows` rows of `len` elements laid out as `layout`; the row is read
    /// `passes` times unless cached on chip; `input_bytes` is the reduced
    /// tensor's size.
    Reduction {
        rows: f64,
        len: f64,
        passes: f64,
        input_bytes: f64,
        layout: RowLayout,
    },
    /// `outputs` output elements, each reading a window of its input;
    /// `gathered_bytes` of the inputs reach the pool through a transpose
    /// that moves their innermost axis (each element its own sector).
    Pool { outputs: f64, gathered_bytes: f64 },
    /// Matmul or implicit-GEMM conv (`conv` true).
    Gemm { g: GemmShape, conv: bool },
    /// Depthwise conv, direct kernel.
    Depthwise(Depthwise),
    /// Depthwise conv feeding a pointwise conv with `out` output channels.
    DwPw { dw: Depthwise, out: f64 },
    /// `rows × k1` times `k1 × n1`, then times `n1 × n2`.
    Chain {
        batch: f64,
        rows: f64,
        k1: f64,
        n1: f64,
        n2: f64,
        weight_bytes: f64,
    },
    /// Scores `m × nk` over head dim `d`, output head dim `dv`, `batch` heads.
    Attention {
        batch: f64,
        m: f64,
        nk: f64,
        d: f64,
        dv: f64,
        kv_bytes: f64,
    },
}

/// Everything the model needs about one group.
#[derive(Clone, Debug)]
pub(crate) struct GroupInfo {
    /// The dtype the main arithmetic runs in (the anchor's operand dtype).
    pub dtype: DType,
    /// Bytes per element of `dtype`.
    pub elem: f64,
    /// Flops of all ops (op_cost), unpadded.
    pub flops: u64,
    /// Flops of the contraction ops (run at the matrix rate).
    pub matrix_flops: f64,
    /// Flops of every other op (CUDA cores).
    pub scalar_flops: f64,
    /// Compulsory traffic: inputs read once, outputs written once, bytes.
    pub bytes: u64,
    /// The values the group defines that are used outside it.
    pub outputs: Vec<ValueId>,
    /// The problem.
    pub body: Body,
}

fn check(t: &TensorType) -> Result<f64, String> {
    match t.num_elements() {
        Some(n) if n <= MAX_ELEMENTS => Ok(n as f64),
        _ => Err(format!("tensor {t} is too large for the cost model")),
    }
}

fn size(graph: &Graph, v: ValueId) -> f64 {
    // Checked by `analyze` before any call.
    graph.ty(v).num_elements().unwrap_or(0) as f64 * graph.ty(v).dtype.size_bytes() as f64
}

/// Bytes a group made of `ops` reads of its input `v`: the whole tensor,
/// unless every use inside the group reaches it only through reshapes and
/// transposes into slices (none of those views among the group's `outputs`);
/// then the slices' elements (at most the tensor). ViT's attention reads each
/// of Q, K and V as a third of the projection.
fn read_size(graph: &Graph, ops: &[OpId], outputs: &[ValueId], v: ValueId) -> f64 {
    if is_literal(graph, ops, v) {
        return 0.0;
    }
    let full = size(graph, v);
    let mut sliced = 0.0;
    let mut frontier = vec![v];
    while let Some(w) = frontier.pop() {
        let mut used = false;
        for &op in ops {
            let d = graph.op(op);
            if !d.operands.contains(&w) {
                continue;
            }
            used = true;
            match d.kind {
                OpKind::Slice => sliced += size(graph, d.results[0]),
                OpKind::Reshape | OpKind::Transpose => frontier.push(d.results[0]),
                _ => return full,
            }
        }
        // A view the group stores: the whole tensor.
        if !used || (w != v && outputs.contains(&w)) {
            return full;
        }
    }
    f64::min(sliced, full)
}

/// Bytes of the group's inputs that reach pool `op`'s first operand read
/// across their innermost axis, each element in its own 32-byte sector:
/// walked in NCHW order, those read through a transpose moving their
/// innermost axis (an NHWC tensor viewed as NCHW); walked in NHWC order
/// ([`crate::pool_walks_nhwc`]), those read through none.
fn gathered_bytes(graph: &Graph, inside: &FxHashSet<OpId>, outputs: &[ValueId], op: OpId) -> f64 {
    let pooled = graph.op(op).results[0];
    let users: Vec<OpId> = inside
        .iter()
        .copied()
        .filter(|&o| graph.op(o).operands.contains(&pooled))
        .collect();
    let nhwc = crate::pool_walks_nhwc(graph, &users, outputs.contains(&pooled));
    let mut bytes = 0.0;
    let mut seen: Vec<ValueId> = Vec::new();
    let mut stack = vec![(graph.op(op).operands[0], false)];
    while let Some((v, crossed)) = stack.pop() {
        match graph.value(v).def {
            ValueDef::OpResult { op: def, .. } if inside.contains(&def) => {
                let d = graph.op(def);
                let moves = d.kind == OpKind::Transpose
                    && d.attrs
                        .ints("perm")
                        .is_some_and(|p| p.last().is_some_and(|&l| l + 1 != p.len() as i64));
                for &o in &d.operands {
                    stack.push((o, crossed || moves));
                }
            }
            _ if crossed != nhwc && !seen.contains(&v) => {
                seen.push(v);
                bytes += size(graph, v);
            }
            _ => {}
        }
    }
    bytes
}

/// True for a splat constant (GELU's 0.5, an exported graph's full-shape
/// scalars) that no contraction of the group reads: the emitter writes it
/// into the kernel as a literal, so the kernel reads no memory for it.
fn is_literal(graph: &Graph, ops: &[OpId], v: ValueId) -> bool {
    let ValueDef::OpResult { op, .. } = graph.value(v).def else {
        return false;
    };
    let d = graph.op(op);
    d.kind == OpKind::Constant
        && d.attrs.get("value").and_then(Attr::splat).is_some()
        && ops.iter().all(|&o| {
            let u = graph.op(o);
            role(u.kind) != Role::Contraction || !u.operands.contains(&v)
        })
}

fn dims(graph: &Graph, v: ValueId) -> Vec<f64> {
    graph.ty(v).dims().iter().map(|&d| d as f64).collect()
}

fn ints(graph: &Graph, op: OpId, name: &str, default: &[i64]) -> Vec<f64> {
    let v = graph
        .op(op)
        .attrs
        .ints(name)
        .filter(|v| v.len() == default.len())
        .unwrap_or(default);
    v.iter().map(|&x| x.max(1) as f64).collect()
}

/// Flops of a contraction, computed in f64 (no overflow).
fn contraction_flops(graph: &Graph, op: OpId) -> f64 {
    let d = graph.op(op);
    let out = graph.ty(d.results[0]).num_elements().unwrap_or(0) as f64;
    match d.kind {
        OpKind::Matmul => {
            let a = graph.ty(d.operands[0]).dims();
            let r = a.len();
            let k = if d.attrs.bool("transpose_a").unwrap_or(false) {
                a[r - 2]
            } else {
                a[r - 1]
            };
            2.0 * out * k as f64
        }
        _ => {
            let w = graph.ty(d.operands[1]).dims();
            2.0 * out * (w[1] * w[2] * w[3]) as f64
        }
    }
}

/// Flops of the ops inside the group that (transitively) produce `v`.
fn prologue_flops(graph: &Graph, inside: &FxHashSet<OpId>, v: ValueId) -> f64 {
    let mut stack = vec![v];
    let mut seen = FxHashSet::default();
    let mut total = 0.0;
    while let Some(v) = stack.pop() {
        if let ValueDef::OpResult { op, .. } = graph.value(v).def
            && inside.contains(&op)
            && seen.insert(op)
        {
            total += op_cost(graph, op, None).flops as f64;
            stack.extend(graph.op(op).operands.iter().copied());
        }
    }
    total
}

fn gemm_of_matmul(graph: &Graph, op: OpId, inside: &FxHashSet<OpId>) -> GemmShape {
    let d = graph.op(op);
    let (a, b, r) = (d.operands[0], d.operands[1], d.results[0]);
    let rd = dims(graph, r);
    let ad = dims(graph, a);
    let rank = rd.len();
    let k = if d.attrs.bool("transpose_a").unwrap_or(false) {
        ad[rank - 2]
    } else {
        ad[rank - 1]
    };
    GemmShape {
        batch: rd[..rank - 2].iter().product(),
        m: rd[rank - 2],
        n: rd[rank - 1],
        k,
        taps: 1.0,
        a_bytes: size(graph, a),
        b_bytes: size(graph, b),
        a_row_elems: k,
        prologue: [
            prologue_flops(graph, inside, a),
            prologue_flops(graph, inside, b),
        ],
        gather: [0.0, 0.0],
        a_gathered: false,
        channels_last: false,
    }
}

fn gemm_of_conv(graph: &Graph, op: OpId, inside: &FxHashSet<OpId>) -> GemmShape {
    let d = graph.op(op);
    let (x, w, r) = (d.operands[0], d.operands[1], d.results[0]);
    let (wd, rd) = (dims(graph, w), dims(graph, r));
    let g = graph.op(op).attrs.int("groups").unwrap_or(1).max(1) as f64;
    let s = ints(graph, op, "stride", &[1, 1]);
    // As the emitter (dcir-cuda's gemm_tc): k tap-major for several taps
    // over channel groups of a multiple of 16, the weight then through the
    // index maps; channel-major weights are copied when K is a multiple of 8.
    // A 1x1 stride-1 unpadded conv of one image copies A with `cp.async`.
    let (cg, taps) = (wd[1], wd[2] * wd[3]);
    let tap_major = taps > 1.0 && cg % 16.0 == 0.0;
    let unpadded = (d.attrs.ints("pad")).is_none_or(|p| p.iter().all(|&x| x == 0));
    let copied = taps == 1.0
        && s.iter().all(|&x| x == 1.0)
        && unpadded
        && rd[0] == 1.0
        && (rd[2] * rd[3]) % 8.0 == 0.0;
    let gather = [
        if copied {
            0.0
        } else if taps == 1.0 || tap_major {
            GATHER_ONE_TAP
        } else {
            GATHER_CHANNEL_MAJOR
        },
        if tap_major || (cg * taps) % 8.0 != 0.0 {
            GATHER_INDEX_MAP
        } else {
            0.0
        },
    ];
    let pointwise = taps == 1.0 && s.iter().all(|&x| x == 1.0) && unpadded;
    // Read as NHWC / KRSC: through a transpose [0, 3, 1, 2] in the group
    // of a value whose last dim is the channels, stored by another kernel
    // or the caller (a view computed inside the group is no such tensor:
    // `T⁻¹(T(w))` reads `w`).
    let from_channels_last = |v: ValueId| match graph.value(v).def {
        ValueDef::OpResult { op, .. } if inside.contains(&op) => {
            let t = graph.op(op);
            let stored = match graph.value(t.operands[0]).def {
                ValueDef::OpResult { op: def, .. } => !inside.contains(&def),
                ValueDef::BlockArg { .. } => true,
            };
            t.kind == OpKind::Transpose && t.attrs.ints("perm") == Some(&[0, 3, 1, 2][..]) && stored
        }
        _ => false,
    };
    GemmShape {
        channels_last: g == 1.0
            && cg % 8.0 == 0.0
            && s.iter().all(|&x| x <= 8.0)
            && from_channels_last(x)
            && from_channels_last(w),
        a_gathered: !(pointwise && (rd[2] * rd[3]) % 4.0 == 0.0),
        batch: g,
        m: rd[0] * rd[2] * rd[3],
        n: rd[1] / g,
        k: wd[1] * wd[2] * wd[3],
        taps,
        a_bytes: size(graph, x),
        b_bytes: size(graph, w),
        a_row_elems: (wd[1] * s[0] * s[1]).min(wd[1] * wd[2] * wd[3]),
        prologue: [
            prologue_flops(graph, inside, x),
            prologue_flops(graph, inside, w),
        ],
        gather,
    }
}

fn depthwise(graph: &Graph, op: OpId) -> Depthwise {
    let d = graph.op(op);
    let (wd, rd) = (dims(graph, d.operands[1]), dims(graph, d.results[0]));
    let s = ints(graph, op, "stride", &[1, 1]);
    let dl = ints(graph, op, "dilation", &[1, 1]);
    Depthwise {
        n: rd[0],
        channels: rd[1],
        oh: rd[2],
        ow: rd[3],
        kh: wd[2],
        kw: wd[3],
        stride: [s[0], s[1]],
        dilation: [dl[0], dl[1]],
    }
}

/// True for a grouped conv with one input channel per group.
pub(crate) fn is_depthwise(graph: &Graph, op: OpId) -> bool {
    let d = graph.op(op);
    d.kind == OpKind::Conv2d
        && d.attrs.int("groups").unwrap_or(1) > 1
        && graph.ty(d.operands[1]).dims().get(1) == Some(&1)
}

/// Analyzes `group`: checks its ops match its kind and every tensor is
/// sized, then computes traffic, flops and the problem shape.
pub(crate) fn analyze(graph: &Graph, group: &Group) -> Result<GroupInfo, String> {
    if group.ops.is_empty() {
        return Err("empty group".into());
    }
    let inside: FxHashSet<OpId> = group.ops.iter().copied().collect();
    let mut anchors = Vec::new();
    for &op in &group.ops {
        let d = graph.op(op);
        if role(d.kind) == Role::Structural {
            return Err(format!("{} cannot be part of a kernel", d.kind.name()));
        }
        for &v in d.operands.iter().chain(&d.results) {
            check(graph.ty(v))?;
        }
        if !matches!(role(d.kind), Role::Injective | Role::Constant) {
            anchors.push(op);
        }
    }

    // Compulsory traffic: inputs once (at their own size: a broadcast inside
    // the group reads its small operand; an input only sliced reads the
    // slices), outputs (values used outside) once.
    // Users anywhere: a group read from a `fused` op's region (the tuner's)
    // has its results used by the region's `yield`.
    let mut outputs: Vec<ValueId> = Vec::new();
    for op in graph.walk_ops(graph.body()) {
        if inside.contains(&op) {
            continue;
        }
        for &v in &graph.op(op).operands {
            if let ValueDef::OpResult { op: def, .. } = graph.value(v).def
                && inside.contains(&def)
                && !outputs.contains(&v)
            {
                outputs.push(v);
            }
        }
    }
    let mut bytes = 0.0;
    for v in group.inputs(graph) {
        bytes += read_size(graph, &group.ops, &outputs, v);
    }
    for &v in &outputs {
        bytes += size(graph, v);
    }

    // Flops.
    let mut matrix_flops = 0.0;
    let mut scalar_flops = 0.0;
    for &op in &group.ops {
        let kind = graph.op(op).kind;
        if role(kind) == Role::Contraction {
            matrix_flops += contraction_flops(graph, op);
        } else {
            scalar_flops += op_cost(graph, op, None).flops as f64;
        }
    }

    let kinds: Vec<OpKind> = anchors.iter().map(|&o| graph.op(o).kind).collect();
    let mismatch = || {
        format!(
            "group kind {} does not match its ops ({})",
            group.kind.name(),
            kinds
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(" + ")
        )
    };
    let anchor_dtype = anchors
        .first()
        .map(|&a| graph.ty(graph.op(a).operands[0]).dtype);
    let body = match (group.kind, anchors.as_slice()) {
        (GroupKind::Elementwise, []) => {
            let mut n = 0.0;
            let mut inner = 1;
            for &op in &group.ops {
                for &r in &graph.op(op).results {
                    let t = graph.ty(r);
                    let e = t.num_elements().unwrap_or(0) as f64;
                    if e > n {
                        n = e;
                        inner = t.dims().last().copied().unwrap_or(1);
                    }
                }
            }
            // Outputs of several shapes: the kernel runs a loop per shape,
            // each computing its outputs' elements.
            let mut shapes: Vec<&[usize]> = Vec::new();
            for &v in &outputs {
                if !shapes.contains(&graph.ty(v).dims()) {
                    shapes.push(graph.ty(v).dims());
                }
            }
            if shapes.len() > 1 {
                n = shapes
                    .iter()
                    .map(|d| d.iter().product::<usize>() as f64)
                    .sum();
                inner = 1;
            }
            Body::Elementwise { n, inner }
        }
        (GroupKind::Reduction, &[a]) if role(kinds[0]) == Role::Reduction => {
            let d = graph.op(a);
            let xd = graph.ty(d.operands[0]).dims();
            let rows = Rows::of(d.kind, &d.attrs, xd)
                .ok_or_else(|| format!("`{}` is not a reduction", d.kind.name()))?;
            let passes: f64 = match d.kind {
                OpKind::Softmax | OpKind::Layernorm => 2.0,
                _ => 1.0,
            };
            let layout = if rows.contiguous(xd) {
                RowLayout::Contiguous
            } else if rows.kept.last() == xd.len().checked_sub(1).as_ref() {
                RowLayout::Interleaved
            } else {
                RowLayout::Strided
            };
            let len = (rows.len as f64).max(1.0);
            // A row reduction feeding an elementwise op that rereads the
            // reduced tensor (decomposed softmax) needs a second pass too.
            let rereads = group.ops.iter().any(|&o| {
                o != a
                    && role(graph.op(o).kind) == Role::Injective
                    && graph.op(o).operands.contains(&d.operands[0])
            });
            Body::Reduction {
                rows: (rows.rows as f64).max(1.0),
                len,
                passes: if rereads { passes.max(2.0) } else { passes },
                input_bytes: size(graph, d.operands[0]),
                layout,
            }
        }
        (GroupKind::Pool, &[a]) if role(kinds[0]) == Role::Pool => Body::Pool {
            outputs: check(graph.ty(graph.op(a).results[0]))?,
            gathered_bytes: gathered_bytes(graph, &inside, &outputs, a),
        },
        (GroupKind::Gemm, &[a]) if kinds == [OpKind::Matmul] => Body::Gemm {
            g: gemm_of_matmul(graph, a, &inside),
            conv: false,
        },
        (GroupKind::Conv, &[a]) if kinds == [OpKind::Conv2d] => {
            if is_depthwise(graph, a) {
                Body::Depthwise(depthwise(graph, a))
            } else {
                Body::Gemm {
                    g: gemm_of_conv(graph, a, &inside),
                    conv: true,
                }
            }
        }
        (GroupKind::DepthwisePointwise, &[dw, pw])
            if kinds == [OpKind::Conv2d, OpKind::Conv2d] && is_depthwise(graph, dw) =>
        {
            Body::DwPw {
                dw: depthwise(graph, dw),
                out: dims(graph, graph.op(pw).results[0])[1],
            }
        }
        (GroupKind::ContractionChain, &[a1, a2]) if kinds[0] == kinds[1] => {
            let r1 = dims(graph, graph.op(a1).results[0]);
            let r2 = dims(graph, graph.op(a2).results[0]);
            let w1 = size(graph, graph.op(a1).operands[1]);
            let w2 = size(graph, graph.op(a2).operands[1]);
            if kinds[0] == OpKind::Matmul {
                let g = gemm_of_matmul(graph, a1, &inside);
                Body::Chain {
                    batch: g.batch,
                    rows: g.m,
                    k1: g.k,
                    n1: g.n,
                    n2: r2[r2.len() - 1],
                    weight_bytes: w1 + w2,
                }
            } else {
                let x = dims(graph, graph.op(a1).operands[0]);
                Body::Chain {
                    batch: 1.0,
                    rows: r1[0] * r1[2] * r1[3],
                    k1: x[1],
                    n1: r1[1],
                    n2: r2[1],
                    weight_bytes: w1 + w2,
                }
            }
        }
        (GroupKind::Attention, &[a1, _, a2])
            if kinds == [OpKind::Matmul, OpKind::Softmax, OpKind::Matmul] =>
        {
            let g1 = gemm_of_matmul(graph, a1, &inside);
            let g2 = gemm_of_matmul(graph, a2, &inside);
            let d2 = graph.op(a2);
            Body::Attention {
                batch: g1.batch,
                m: g1.m,
                nk: g1.n,
                d: g1.k,
                dv: g2.n,
                kv_bytes: g1.b_bytes + size(graph, d2.operands[1]),
            }
        }
        // The halves of attention the planner passes through on the way to
        // the whole: the scores GEMM with its softmax (no second GEMM), and a
        // softmax feeding the value GEMM (no scores GEMM).
        (GroupKind::Attention, &[a1, _]) if kinds == [OpKind::Matmul, OpKind::Softmax] => {
            let g1 = gemm_of_matmul(graph, a1, &inside);
            Body::Attention {
                batch: g1.batch,
                m: g1.m,
                nk: g1.n,
                d: g1.k,
                dv: 0.0,
                kv_bytes: g1.b_bytes,
            }
        }
        (GroupKind::Attention, &[_, a2]) if kinds == [OpKind::Softmax, OpKind::Matmul] => {
            let g2 = gemm_of_matmul(graph, a2, &inside);
            Body::Attention {
                batch: g2.batch,
                m: g2.m,
                nk: g2.k,
                d: 0.0,
                dv: g2.n,
                kv_bytes: g2.b_bytes,
            }
        }
        _ => return Err(mismatch()),
    };

    let dtype = anchor_dtype
        .or_else(|| outputs.first().map(|&v| graph.ty(v).dtype))
        .or_else(|| {
            group
                .ops
                .iter()
                .find_map(|&o| graph.op(o).results.first().map(|&r| graph.ty(r).dtype))
        })
        .unwrap_or(DType::F32);
    let flops = (matrix_flops + scalar_flops).min(u64::MAX as f64) as u64;
    Ok(GroupInfo {
        dtype,
        elem: dtype.size_bytes() as f64,
        flops,
        matrix_flops,
        scalar_flops,
        bytes: bytes.min(u64::MAX as f64) as u64,
        outputs,
        body,
    })
}
