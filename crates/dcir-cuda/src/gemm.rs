//! The `gemm` and `conv` (`algorithm = "implicit_gemm"`) families: one
//! contraction with view prologues and an elementwise epilogue, as an f32
//! CUDA-core (FMA) SIMT kernel.
//!
//! Both are described by a [`Contraction`]: `C[b, m, n] = Σ_k A(b, m, k) ·
//! B(b, k, n)` with a function from GEMM indices to operand elements (the
//! coordinates in the operand, and for a conv's padding the condition under
//! which the element exists), and one from `(b, m, n)` to the contraction
//! result's coordinates. A matmul maps them to its batch dims and last two
//! dims; a conv is an implicit GEMM (`m` = output pixel, `n` = output channel,
//! `k` = (input channel, kernel row, kernel column), `b` = channel group).
//!
//! The kernel (one per group, 1-D grid split into batch, tile row and tile
//! column):
//!
//! - **Block**: a `tm × tn` output tile, `threads` threads arranged
//!   `threads_m × threads_n` (warps as 4 × 8 lanes where the grid allows,
//!   so a warp's shared reads touch few addresses). Each thread owns an
//!   `mt × nt` micro-tile of f32 accumulators in registers, as groups of
//!   `wm` (`wn`) consecutive rows (columns) spaced `threads_m · wm`
//!   (`threads_n · wn`) apart, `wm`, `wn` = 4 where the micro-tile allows: its
//!   fragment of a k step is then read from shared memory as `float4`s, with
//!   no bank conflicts, and its stores are 16-byte vectors where the output
//!   is contiguous.
//! - **k loop** over tiles of `tk`: operand tiles are staged k-major in shared
//!   memory (`As[k][m]`, `Bs[k][n]`, rows padded by 4 floats when the operand
//!   is transposed on the way so the transposing stores do not conflict).
//!   Registers carry each tile from its global loads to its shared stores;
//!   a tile's loads are issued one tile ahead, right before a barrier, so
//!   they are in flight during the FMAs of the tile before it (issued
//!   elsewhere, ptxas sinks them past those FMAs). With `stages ≥ 2` there
//!   are two shared buffers and one barrier per tile; with `stages = 1` one
//!   buffer and two barriers.
//! - **Loads**: a group input read directly whose elements run contiguously
//!   along M, N or K (row-major matmul operands, conv weights, the input of a
//!   1×1 stride-1 conv) with that extent a multiple of 4 is read as 4-element
//!   vectors (`float4`, or `uint2` of four f16/bf16); anything else (view
//!   prologues, odd extents, conv windows) element by element through the
//!   index maps. f16/bf16 widen to f32 on the way to shared memory. Elements
//!   past M, N, K or in a conv's padding are stored as zeros, so the inner
//!   loop has no bounds checks.
//! - **Epilogue**: each accumulator goes through the group's tail (elementwise
//!   math, batchnorm, casts, reshapes, transposes) by the index maps with the
//!   contraction's value bound to it, and is stored where the views put it;
//!   four at a time as one vector store (and residual operands of the same
//!   layout read as vectors) when the output runs contiguously along the
//!   micro-tile's 4-wide groups.
//!
//! The planner's `tile = [tm, tn, tk]` and `threads` are honoured when they
//! form a valid shape (see [`Tiling::planned`]); otherwise the kernel uses
//! `[64, 64, 8]` with 256 threads and says so in its summary.

use std::collections::BTreeSet;

use dcir_fusion::Reason;
use dcir_ir::{Attr, Graph, OpId, OpKind, ValueDef, ValueId};

use super::epilogue::{def_op, forward_index};
use super::simt::{Fragment, Prefetch, rank1_update};
use super::split_k::SplitK;
use super::{
    EmitError, Index, Lower, Reduced, Vectors, attr_int, pack, params, store, vector_ty, yields,
};
use crate::kir::{
    ArrayRef, BinOp, Builtin, Expr, Kernel, Param, SharedArray, Stmt, Ty, add, all, array, bin,
    div, guarded, int, let_int, lt, mul, rem, sub, unrolled, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// Most f32 accumulators one thread keeps (registers).
const MAX_ACCUMULATORS: usize = 128;
/// Most staged elements one thread holds in registers between the load and
/// the store of a tile.
const MAX_PREFETCH: usize = 32;
/// Most bytes of static shared memory.
const MAX_SHARED: usize = 48 * 1024;
/// Elements of one vector access to global memory.
const VECTOR: usize = 4;

/// One of the GEMM index dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GemmDim {
    M,
    N,
    K,
}

/// One operand of a contraction as a block reads it.
#[derive(Clone, Debug)]
pub(super) struct Operand {
    /// The contraction's operand inside the group.
    pub value: ValueId,
    /// The GEMM dimension along which consecutive elements are (mostly)
    /// adjacent in memory: threads walk it fastest, for coalescing.
    pub contiguous: GemmDim,
    /// Whether four elements along `contiguous`, from an index that is a
    /// multiple of 4, are one aligned vector in memory: the operand is a
    /// group input read directly, with that extent a multiple of 4.
    pub vector: bool,
}

/// The geometry of a convolution as an implicit GEMM.
///
/// With `G = groups`, `Cg = C / G`, `Og = O / G`: batch entry `g` (a channel
/// group) computes `C[g, m, n] = Σ_k A(m, k) · B(k, n)` where
/// `m = (img, oh, ow)` (row-major over `[N, OH, OW]`), `n` is the output
/// channel `g·Og + n` and `k = (c, kh, kw)` (row-major over `[Cg, KH, KW]`,
/// the weight's own layout). `A(m, k) = x[img, g·Cg + c, oh·sh − pad_top +
/// kh·dh, ow·sw − pad_left + kw·dw]`, zero outside the image;
/// `B(k, n) = w[g·Og + n, c, kh, kw]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ConvGeometry {
    /// Input `[N, C, H, W]`.
    pub input: [usize; 4],
    /// Weight `[O, C / groups, KH, KW]`.
    pub weight: [usize; 4],
    /// Output `[N, O, OH, OW]`.
    pub output: [usize; 4],
    /// `[sh, sw]`.
    pub stride: [usize; 2],
    /// `[top, left, bottom, right]`.
    pub pad: [usize; 4],
    /// `[dh, dw]`.
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl ConvGeometry {
    /// `conv IN * W -> OUT, stride .., pad .., dilation .., groups G: B x
    /// [M x K] @ [K x N]`, for a kernel's summary (`c`: the contraction).
    pub(super) fn describe(&self, c: &Contraction) -> String {
        format!(
            "conv {:?} * {:?} -> {:?}, stride {:?}, pad {:?}, dilation {:?}, groups {}: {} x [{} x {}] @ [{} x {}]",
            self.input,
            self.weight,
            self.output,
            self.stride,
            self.pad,
            self.dilation,
            self.groups,
            c.batch,
            c.m,
            c.k,
            c.k,
            c.n
        )
    }

    /// Reads the attributes of conv op `op`.
    fn of(l: &Lower, op: OpId) -> Result<ConvGeometry> {
        let g = l.g;
        let data = g.op(op);
        let dims4 = |v: ValueId| -> Result<[usize; 4]> {
            g.ty(v)
                .dims()
                .try_into()
                .map_err(|_| l.unsupported("a conv that is not 2-D NCHW"))
        };
        let ints = |name: &str, default: &[i64]| -> Vec<usize> {
            data.attrs
                .get(name)
                .and_then(Attr::as_ints)
                .unwrap_or(default)
                .iter()
                .map(|&x| x.max(0) as usize)
                .collect()
        };
        let (stride, pad, dilation) = (
            ints("stride", &[1, 1]),
            ints("pad", &[0, 0, 0, 0]),
            ints("dilation", &[1, 1]),
        );
        let groups = attr_int(g, op, "groups", 1).max(1) as usize;
        let (input, weight, output) = (
            dims4(data.operands[0])?,
            dims4(data.operands[1])?,
            dims4(data.results[0])?,
        );
        if stride.len() != 2 || pad.len() != 4 || dilation.len() != 2 {
            return Err(l.unsupported("conv attributes of the wrong length"));
        }
        if input[1] % groups != 0 || weight[0] % groups != 0 || input[1] / groups != weight[1] {
            return Err(l.unsupported("conv channels that do not split into the groups"));
        }
        Ok(ConvGeometry {
            input,
            weight,
            output,
            stride: [stride[0], stride[1]],
            pad: [pad[0], pad[1], pad[2], pad[3]],
            dilation: [dilation[0], dilation[1]],
            groups,
        })
    }

    /// GEMM rows: output pixels of all images.
    pub fn m(&self) -> usize {
        self.output[0] * self.output[2] * self.output[3]
    }

    /// GEMM columns: output channels per group.
    pub fn n(&self) -> usize {
        self.weight[0] / self.groups
    }

    /// GEMM depth: `C / groups · KH · KW`.
    pub fn k(&self) -> usize {
        self.weight[1] * self.weight[2] * self.weight[3]
    }

    /// Whether the conv is a plain GEMM over the input viewed as `[C, H·W]`
    /// per image: 1×1, stride 1, no padding.
    pub fn is_pointwise(&self) -> bool {
        self.weight[2] == 1 && self.weight[3] == 1 && self.stride == [1, 1] && self.pad == [0; 4]
    }

    /// `(img, oh, ow)` of output pixel `m`.
    pub fn pixel(&self, m: Expr) -> [Expr; 3] {
        let [_, _, oh, ow] = self.output;
        [
            div(m.clone(), (oh * ow) as i64),
            rem(div(m.clone(), ow as i64), oh as i64),
            rem(m, ow as i64),
        ]
    }

    /// `(c, kh, kw)` of GEMM depth `k` (row-major over `[Cg, KH, KW]`).
    pub fn tap(&self, k: Expr) -> [Expr; 3] {
        let [_, _, kh, kw] = self.weight;
        [
            div(k.clone(), (kh * kw) as i64),
            rem(div(k.clone(), kw as i64), kh as i64),
            rem(k, kw as i64),
        ]
    }

    /// Whether some window starts before the input and whether some ends
    /// past it, along rows and columns: only padding (or a window
    /// overhanging the far edge) lets it leave the image.
    pub fn window_leaves(&self) -> [(bool, bool); 2] {
        let [_, _, h, w] = self.input;
        let [_, _, kh, kw] = self.weight;
        let [_, _, out_h, out_w] = self.output;
        let far_h = (out_h - 1) * self.stride[0] + (kh - 1) * self.dilation[0];
        let far_w = (out_w - 1) * self.stride[1] + (kw - 1) * self.dilation[1];
        [
            (self.pad[0] > 0, far_h >= h + self.pad[0]),
            (self.pad[1] > 0, far_w >= w + self.pad[1]),
        ]
    }

    /// The input element `A(m, k)` of group `g`. Its coordinates refer to
    /// locals `{prefix}_img`, `_ch`, `_ih`, `_iw` that [`Element::lets`] defines.
    pub fn a_at(&self, prefix: &str, g: &Expr, m: Expr, k: Expr) -> Element {
        let [_, _, h, w] = self.input;
        let cg = self.weight[1];
        let name = |s: &str| format!("{prefix}_{s}");
        let [img, oh, ow] = self.pixel(m);
        let [c, r, s] = self.tap(k);
        let ih = add(
            sub(mul(oh, int(self.stride[0] as i64)), int(self.pad[0] as i64)),
            mul(r, int(self.dilation[0] as i64)),
        );
        let iw = add(
            sub(mul(ow, int(self.stride[1] as i64)), int(self.pad[1] as i64)),
            mul(s, int(self.dilation[1] as i64)),
        );
        let lets = vec![
            (name("img"), img),
            (name("ch"), add(mul(g.clone(), int(cg as i64)), c)),
            (name("ih"), ih),
            (name("iw"), iw),
        ];
        let coords: Vec<Expr> = lets.iter().map(|(n, _)| var(n)).collect();
        let (ih, iw) = (coords[2].clone(), coords[3].clone());
        let [(top, bottom), (left, right)] = self.window_leaves();
        let conds = [
            top.then(|| bin(BinOp::Ge, ih.clone(), int(0))),
            bottom.then(|| lt(ih.clone(), int(h as i64))),
            left.then(|| bin(BinOp::Ge, iw.clone(), int(0))),
            right.then(|| lt(iw.clone(), int(w as i64))),
        ];
        Element {
            index: Index::coords(&self.input, coords),
            inside: conds.into_iter().flatten().collect(),
            lets,
        }
    }

    /// The linear index in the weight of `B(k, n)` of group `g`.
    pub fn b_at(&self, g: &Expr, k: Expr, n: Expr) -> Expr {
        let oc = add(mul(g.clone(), int(self.n() as i64)), n);
        add(mul(oc, int(self.k() as i64)), k)
    }

    /// [`ConvGeometry::b_at`] with k ordered tap-major: `k = tap·Cg + c`.
    pub fn b_at_tap_major(&self, g: &Expr, k: Expr, n: Expr) -> Expr {
        let [_, cg, kh, kw] = self.weight;
        let oc = add(mul(g.clone(), int(self.n() as i64)), n);
        let c = rem(k.clone(), cg as i64);
        let tap = div(k, cg as i64);
        add(
            mul(add(mul(oc, int(cg as i64)), c), int((kh * kw) as i64)),
            tap,
        )
    }

    /// The output coordinates of `C[g, m, n]`.
    pub fn out_at(&self, g: &Expr, m: Expr, n: Expr) -> Vec<Expr> {
        let [img, oh, ow] = self.pixel(m);
        let oc = add(mul(g.clone(), int(self.n() as i64)), n);
        vec![img, oc, oh, ow]
    }
}

/// How the GEMM indices map to the operands and the result.
#[derive(Clone, Debug)]
pub(super) enum Geometry {
    /// A batched matmul: batch entry `b` is the row-major index over `batch`.
    Matmul {
        batch: Vec<usize>,
        transpose_a: bool,
        transpose_b: bool,
    },
    /// A convolution as an implicit GEMM; batch entry `b` is the channel group.
    Conv(ConvGeometry),
}

/// One contraction of a group as a batched GEMM `C[b, m, n] = Σ_k A(b, m, k) · B(b, k, n)`.
#[derive(Clone, Debug)]
pub(super) struct Contraction {
    /// Its result inside the group.
    pub result: ValueId,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Operand,
    pub b: Operand,
    pub geometry: Geometry,
}

/// An element of an operand: where it is, and when it exists (else it is zero).
pub(super) struct Element {
    /// Its index in the operand.
    pub index: Index,
    /// Conditions that it exists (a conv window inside the image), all to hold.
    pub inside: Vec<Expr>,
    /// `int` locals `index` and `inside` refer to, to define first, in order.
    pub lets: Vec<(String, Expr)>,
}

impl Contraction {
    /// The single matmul of a `gemm` group.
    pub(super) fn of_matmul(l: &Lower, op: OpId) -> Result<Contraction> {
        let g = l.g;
        let mm_op = only_op(l, op, OpKind::Matmul)?;
        let data = g.op(mm_op);
        let (a, b, result) = (data.operands[0], data.operands[1], data.results[0]);
        let flag = |name: &str| {
            matches!(data.attrs.get(name), Some(Attr::Bool(true)))
                || data.attrs.get(name).and_then(Attr::as_int) == Some(1)
        };
        let (ta, tb) = (flag("transpose_a"), flag("transpose_b"));
        let out = g.ty(result).dims().to_vec();
        let rank = out.len();
        if rank < 2 {
            return Err(l.unsupported("a matmul of rank < 2"));
        }
        let (m, n) = (out[rank - 2], out[rank - 1]);
        let k = g.ty(a).dims()[if ta { rank - 2 } else { rank - 1 }];
        let batch = out[..rank - 2].to_vec();
        let operand = |value: ValueId, contiguous: GemmDim, extent: usize| Operand {
            value,
            contiguous,
            vector: is_input(l, value) && extent.is_multiple_of(VECTOR),
        };
        Ok(Contraction {
            result,
            batch: batch.iter().product(),
            m,
            n,
            k,
            a: if ta {
                operand(a, GemmDim::M, m)
            } else {
                operand(a, GemmDim::K, k)
            },
            b: if tb {
                operand(b, GemmDim::K, k)
            } else {
                operand(b, GemmDim::N, n)
            },
            geometry: Geometry::Matmul {
                batch,
                transpose_a: ta,
                transpose_b: tb,
            },
        })
    }

    /// The single conv2d of a `conv` group.
    pub(super) fn of_conv(l: &Lower, op: OpId) -> Result<Contraction> {
        let g = l.g;
        let conv_op = only_op(l, op, OpKind::Conv2d)?;
        let data = g.op(conv_op);
        let geo = ConvGeometry::of(l, conv_op)?;
        let (x, w) = (data.operands[0], data.operands[1]);
        let [_, _, oh, ow] = geo.output;
        Ok(Contraction {
            result: data.results[0],
            batch: geo.groups,
            m: geo.m(),
            n: geo.n(),
            k: geo.k(),
            a: Operand {
                value: x,
                contiguous: GemmDim::M,
                vector: is_input(l, x) && geo.is_pointwise() && (oh * ow).is_multiple_of(VECTOR),
            },
            b: Operand {
                value: w,
                contiguous: GemmDim::K,
                vector: is_input(l, w) && geo.k().is_multiple_of(VECTOR),
            },
            geometry: Geometry::Conv(geo),
        })
    }

    /// The row-major coordinates of batch entry `b` over a matmul's batch dims.
    fn batch_coords(batch: &[usize], b: &Expr) -> Vec<Expr> {
        Index::linear(batch, b.clone()).get_coords()
    }

    /// `A(b, m, k)`.
    pub(super) fn a_at(&self, l: &Lower, b: &Expr, m: Expr, k: Expr) -> Element {
        let dims = l.g.ty(self.a.value).dims();
        match &self.geometry {
            Geometry::Matmul {
                batch, transpose_a, ..
            } => {
                let mut c = Self::batch_coords(batch, b);
                c.extend(if *transpose_a { [k, m] } else { [m, k] });
                Element {
                    index: Index::coords(dims, c),
                    inside: Vec::new(),
                    lets: Vec::new(),
                }
            }
            Geometry::Conv(geo) => geo.a_at("a", b, m, k),
        }
    }

    /// `B(b, k, n)`.
    pub(super) fn b_at(&self, l: &Lower, b: &Expr, k: Expr, n: Expr) -> Element {
        let dims = l.g.ty(self.b.value).dims();
        match &self.geometry {
            Geometry::Matmul {
                batch, transpose_b, ..
            } => {
                let mut c = Self::batch_coords(batch, b);
                c.extend(if *transpose_b { [n, k] } else { [k, n] });
                Element {
                    index: Index::coords(dims, c),
                    inside: Vec::new(),
                    lets: Vec::new(),
                }
            }
            Geometry::Conv(geo) => Element {
                index: Index::linear(dims, geo.b_at(b, k, n)),
                inside: Vec::new(),
                lets: Vec::new(),
            },
        }
    }

    /// The coordinates in the result of `C[b, m, n]`.
    pub(super) fn out_at(&self, b: &Expr, m: Expr, n: Expr) -> Vec<Expr> {
        match &self.geometry {
            Geometry::Matmul { batch, .. } => {
                let mut c = Self::batch_coords(batch, b);
                c.extend([m, n]);
                c
            }
            Geometry::Conv(geo) => geo.out_at(b, m, n),
        }
    }

    /// The GEMM dimension along which four results from an index that is a
    /// multiple of 4 are one aligned vector of the result's row-major layout.
    pub(super) fn out_vector(&self) -> Option<GemmDim> {
        match &self.geometry {
            Geometry::Matmul { .. } => self.n.is_multiple_of(VECTOR).then_some(GemmDim::N),
            Geometry::Conv(geo) => {
                let [_, _, oh, ow] = geo.output;
                (oh * ow).is_multiple_of(VECTOR).then_some(GemmDim::M)
            }
        }
    }

    /// Checks what the kernel needs of the group: the contraction's operands
    /// come through views only, the result is a float, the epilogue keeps one
    /// element per accumulator and every index fits an `int`. Returns the
    /// values derived from the result.
    pub(super) fn check(&self, l: &Lower, group: OpId) -> Result<BTreeSet<ValueId>> {
        let g = l.g;
        let dtype = g.ty(self.result).dtype;
        if !dtype.is_float() {
            let op = match self.geometry {
                Geometry::Matmul { .. } => OpKind::Matmul,
                Geometry::Conv(_) => OpKind::Conv2d,
            };
            return Err(l.unsupported(Reason::DType { op, dtype }));
        }
        check_prologue(l, self.a.value, "A")?;
        check_prologue(l, self.b.value, "B")?;
        let sizes = [self.a.value, self.b.value, self.result]
            .map(|v| g.ty(v).num_elements().unwrap_or(usize::MAX));
        if sizes.iter().any(|&s| s >= i32::MAX as usize) {
            return Err(l.unsupported(Reason::TooLarge));
        }
        if self.batch * self.m * self.n * self.k == 0 {
            return Err(l.unsupported(Reason::Empty));
        }
        let derived = super::epilogue::derived(l.g, group, self.result, &[]);
        super::epilogue::check(l, group, &derived, &[], "the contraction", true)?;
        Ok(derived)
    }
}

/// The one op of `kind` in group `op`.
fn only_op(l: &Lower, op: OpId, kind: OpKind) -> Result<OpId> {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    let found: Vec<OpId> = g
        .block(region)
        .ops
        .iter()
        .copied()
        .filter(|&o| g.op(o).kind == kind)
        .collect();
    match found[..] {
        [o] => Ok(o),
        _ => Err(l.unsupported(Reason::Count {
            what: if kind == OpKind::Matmul {
                "matmuls"
            } else {
                "convs"
            },
            found: found.len(),
        })),
    }
}

/// Whether `v` is a group input of a float dtype (read straight from its parameter).
fn is_input(l: &Lower, v: ValueId) -> bool {
    matches!(l.g.value(v).def, ValueDef::BlockArg { .. }) && l.g.ty(v).dtype.is_float()
}

/// Checks that `v` is a view (reshape, transpose, broadcast, slice) of a group input.
pub(super) fn check_prologue(l: &Lower, v: ValueId, which: &str) -> Result<()> {
    let mut v = v;
    while let Some(op) = def_op(l.g, v) {
        let data = l.g.op(op);
        if !matches!(
            data.kind,
            OpKind::Reshape | OpKind::Transpose | OpKind::Broadcast | OpKind::Slice
        ) {
            return Err(l.unsupported(Reason::Op {
                op: data.kind,
                place: format!(
                    "feeding operand {which} of the contraction (only reshape, transpose, broadcast and slice prologues)"
                ),
            }));
        }
        v = data.operands[0];
    }
    Ok(())
}

/// Stores every result of the group at the element derived from the
/// contraction's element at `coords` (the accumulator bound as its value):
/// `ys` are the yielded values, `outputs` their kernel parameters and
/// `results` the fused op's results, in the same order.
pub(super) fn store_results(
    l: &mut Lower,
    tainted: &BTreeSet<ValueId>,
    result: ValueId,
    coords: &[Expr],
    outputs: &[&Param],
    ys: &[ValueId],
    results: &[ValueId],
) -> Result<()> {
    let g = l.g;
    let anchor = Index::coords(g.ty(result).dims(), coords.to_vec());
    for ((p, &y), &res) in outputs.iter().zip(ys).zip(results) {
        let Some(idx) = forward_index(g, tainted, result, y, &anchor) else {
            return Err(l.unsupported("a result that does not derive from the contraction"));
        };
        let v = l.value_at(y, &idx)?;
        store(l, p, g.ty(res).dtype, idx.get_linear(), v);
    }
    Ok(())
}

/// Stores every result of the group for `lanes` consecutive elements of the
/// contraction's result, lane `j` at coordinates `lanes[j].0` with the
/// accumulator `lanes[j].1`, as one vector store per result: the lanes'
/// elements are consecutive in every result ([`lanes_stay_together`]).
/// The vector index of the first result is bound to `step` (a name the
/// kernel reserved), others to fresh names; the inputs read at the lanes'
/// own linear indices are read as vectors too, and so, where the caller
/// keeps `aligned` a multiple of the lanes' count (the first lane's column),
/// are inputs read at `e + j` for lane `j` with `e` built of it (a bias read
/// at the column: one 16-byte load, not eight).
#[allow(clippy::too_many_arguments)]
pub(super) fn store_result_vectors(
    l: &mut Lower,
    tainted: &BTreeSet<ValueId>,
    result: ValueId,
    step: &str,
    aligned: Option<&Expr>,
    lanes: &[(Vec<Expr>, Expr)],
    outputs: &[&Param],
    ys: &[ValueId],
    results: &[ValueId],
) -> Result<()> {
    let g = l.g;
    let width = lanes.len();
    let result_dims = g.ty(result).dims().to_vec();
    let forward = |y: ValueId, coords: &[Expr]| {
        forward_index(
            g,
            tainted,
            result,
            y,
            &Index::coords(&result_dims, coords.to_vec()),
        )
    };
    let underived = |l: &Lower| l.unsupported("a result that does not derive from the contraction");
    // Each result's vector index: its first lane's linear index over the width.
    let mut steps: Vec<(Expr, String)> = Vec::new();
    let mut named = Vec::new();
    for &y in ys {
        let Some(first) = forward(y, &lanes[0].0) else {
            return Err(underived(l));
        };
        let first = div(first.get_linear(), width as i64);
        let name = match steps.iter().find(|(e, _)| *e == first) {
            Some((_, name)) => name.clone(),
            None if steps.is_empty() => {
                l.body.push(let_int(step, first.clone()));
                step.to_string()
            }
            None => {
                let name = l.fresh(step);
                l.body.push(let_int(&name, first.clone()));
                name
            }
        };
        steps.push((first, name.clone()));
        named.push(name);
    }
    for (((p, &y), &res), step) in outputs.iter().zip(ys).zip(results).zip(named) {
        l.vector = Some(Vectors {
            step: step.clone(),
            width,
            bases: vec![(int(0), var(&step))],
            aligned: aligned.cloned(),
        });
        let dtype = g.ty(res).dtype;
        let mut values = Vec::new();
        for (j, (coords, acc)) in lanes.iter().enumerate() {
            l.reduced = Some((result, Reduced::Row(acc.clone()), 0));
            let Some(forward) = forward(y, coords) else {
                return Err(underived(l));
            };
            let idx = Index {
                linear: Some(add(mul(var(&step), int(width as i64)), int(j as i64))),
                ..forward
            };
            let v = l.value_at(y, &idx)?;
            values.push(l.narrow(dtype, v));
        }
        l.vector = None;
        l.body.push(Stmt::Store(
            ArrayRef {
                name: p.name.clone(),
                ty: vector_ty(dtype, width),
                reinterpret: true,
            },
            var(&step),
            pack(dtype, values),
        ));
    }
    Ok(())
}

/// Where a run of `width` elements of the contraction's result lies, from
/// an element whose index is a multiple of `width`: consecutive along one
/// axis, or consecutive in the row-major order only (a reshape may have
/// split them over rows).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Lanes {
    Along(usize),
    Linear,
}

/// Whether a run of `width` elements of the contraction's `result` (where
/// `lanes` says; from a multiple of `width`) is `width` consecutive elements
/// of `y`'s row-major layout from a multiple of `width`, so one vector
/// stores them: the views between carry the run to `y`'s innermost dim, a
/// multiple of `width` long, or keep it in linear order (a reshape of a run
/// along the innermost dim of a multiple of `width`, and no transpose after
/// it) — a projection's columns split into heads and moved outward keep
/// theirs; a transpose that moves the run off the innermost dim does not.
pub(super) fn lanes_stay_together(
    g: &Graph,
    tainted: &BTreeSet<ValueId>,
    (result, lanes): (ValueId, Lanes),
    y: ValueId,
    width: usize,
) -> bool {
    fn lanes_in(
        g: &Graph,
        tainted: &BTreeSet<ValueId>,
        (result, lanes): (ValueId, Lanes),
        y: ValueId,
        width: usize,
    ) -> Option<Lanes> {
        if y == result {
            return Some(lanes);
        }
        let ValueDef::OpResult { op, .. } = g.value(y).def else {
            return None;
        };
        let data = g.op(op);
        let src = *data.operands.iter().find(|v| tainted.contains(v))?;
        let at = lanes_in(g, tainted, (result, lanes), src, width)?;
        let whole_runs = |dims: &[usize]| dims.last().is_some_and(|d| d.is_multiple_of(width));
        match (data.kind, at) {
            (OpKind::Transpose, Lanes::Along(a)) => data
                .attrs
                .get("perm")
                .and_then(Attr::as_ints)?
                .iter()
                .position(|&p| p as usize == a)
                .map(Lanes::Along),
            (OpKind::Transpose, Lanes::Linear) => None,
            (OpKind::Reshape, _) => {
                let (from, to) = (g.ty(src).dims(), g.ty(y).dims());
                let in_order = match at {
                    Lanes::Linear => true,
                    Lanes::Along(a) => a + 1 == from.len() && whole_runs(from),
                };
                in_order.then(|| {
                    if whole_runs(to) {
                        Lanes::Along(to.len() - 1)
                    } else {
                        Lanes::Linear
                    }
                })
            }
            _ => Some(at),
        }
    }
    let dims = g.ty(y).dims();
    match lanes_in(g, tainted, (result, lanes), y, width) {
        Some(Lanes::Along(a)) => {
            a + 1 == dims.len() && dims.last().is_some_and(|d| d.is_multiple_of(width))
        }
        Some(Lanes::Linear) => true,
        None => false,
    }
}

/// The block's batch entry: `bz`, or 0 when there is one.
fn batch_index(c: &Contraction) -> Expr {
    if c.batch == 1 { int(0) } else { var("bz") }
}

/// The block and thread shape of one kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tiling {
    tm: usize,
    tn: usize,
    tk: usize,
    threads: usize,
    threads_m: usize,
    threads_n: usize,
    /// Rows (columns) of one of a thread's groups: 4, 2 or 1.
    wm: usize,
    wn: usize,
    /// Shared-memory buffers per operand: 2 with `stages ≥ 2`, else 1.
    buffers: usize,
}

impl Tiling {
    /// The planned shape, if valid: `tm`, `tn` multiples of 4; `threads` a
    /// multiple of 32 (at most 1024) that splits into a `threads_m ×
    /// threads_n` grid dividing the tile with at most 128 accumulators per
    /// thread. `tk` is halved (down to 8) while the prefetched elements
    /// exceed 32 per thread or the buffers 48 KiB of shared memory.
    fn planned(tile: [usize; 3], threads: usize, stages: usize, prefer_m: bool) -> Option<Tiling> {
        let [tm, tn, mut tk] = tile;
        let valid = tm.is_multiple_of(4)
            && tn.is_multiple_of(4)
            && tk > 0
            && threads.is_multiple_of(32)
            && (32..=1024).contains(&threads)
            && tm * tn / threads <= MAX_ACCUMULATORS;
        if !valid {
            return None;
        }
        let buffers = if stages >= 2 { 2 } else { 1 };
        let shared = |tk: usize| buffers * (tm + tn + 8) * tk * 4;
        while tk > 8
            && tk.is_multiple_of(2)
            && ((tm + tn) * tk > MAX_PREFETCH * threads || shared(tk) > MAX_SHARED)
        {
            tk /= 2;
        }
        if shared(tk) > MAX_SHARED {
            return None;
        }
        let (threads_m, threads_n) = thread_grid(tm, tn, threads, prefer_m)?;
        let width = |t: usize| {
            [4, 2, 1]
                .into_iter()
                .find(|w| t.is_multiple_of(*w))
                .unwrap_or(1)
        };
        Some(Tiling {
            tm,
            tn,
            tk,
            threads,
            threads_m,
            threads_n,
            wm: width(tm / threads_m),
            wn: width(tn / threads_n),
            buffers,
        })
    }

    /// The planned shape of group `op` (`[64, 64, 8]` with 256 threads when
    /// it has none), halved where a math epilogue would spill (the reason in
    /// the second value); a tile the threads cannot split is refused.
    fn of(l: &Lower, op: OpId, prefer_m: bool) -> Result<(Tiling, Option<String>)> {
        let g = l.g;
        let tile = match g.op(op).attrs.get("tile") {
            None => [64, 64, 8],
            Some(attr) => match attr.as_ints() {
                Some(&[tm, tn, tk]) if tm > 0 && tn > 0 && tk > 0 => {
                    [tm as usize, tn as usize, tk as usize]
                }
                _ => {
                    return Err(l.unsupported(Reason::Parameters(format!(
                        "tile = {} (a GEMM tile is [tm, tn, tk])",
                        dcir_ir::print::format_attr(attr)
                    ))));
                }
            },
        };
        let threads = attr_int(g, op, "threads", 256).max(0) as usize;
        let stages = attr_int(g, op, "stages", 1).max(1) as usize;
        let Some(t) = Tiling::planned(tile, threads, stages, prefer_m) else {
            return Err(l.unsupported(Reason::Parameters(format!(
                "tile {tile:?} with {threads} threads (the threads must split the tile into micro-tiles of at most 16 x 16 whose k loads they share evenly)"
            ))));
        };
        // The epilogue runs with every accumulator live: transcendental
        // math beside 128 of them spilled (BERT's FFN with GELU at 8x16 per
        // thread); halve the tile's longer side to 64.
        if t.mt() * t.nt() > 64 && heavy_epilogue(l, op) {
            let halved = if t.tn >= t.tm {
                [t.tm, t.tn / 2, t.tk]
            } else {
                [t.tm / 2, t.tn, t.tk]
            };
            if let Some(h) = Tiling::planned(halved, t.threads, stages, prefer_m)
                && h.mt() * h.nt() <= 64
            {
                let why = format!(
                    "halved: the plan's tile [{}, {}, {}] keeps {} accumulators per thread beside a math epilogue",
                    t.tm,
                    t.tn,
                    t.tk,
                    t.mt() * t.nt()
                );
                return Ok((h, Some(why)));
            }
        }
        Ok((t, None))
    }

    /// The planned parameters of group `op` this tiling does not run as
    /// written (`Kernel::adapted`), `halved` the reason [`Tiling::of`] gave.
    fn adapted(&self, g: &Graph, op: OpId, halved: Option<&str>) -> Vec<String> {
        let mut adapted = Vec::new();
        let runs = [self.tm, self.tn, self.tk];
        if let Some(planned) = g.op(op).attrs.ints("tile")
            && planned.iter().map(|&x| x as usize).ne(runs)
        {
            let why = halved.unwrap_or(
                "k narrowed while the prefetch exceeds 32 elements a thread or the buffers 48 KiB",
            );
            adapted.push(format!("tile = {planned:?} runs as {runs:?} ({why})"));
        }
        let stages = attr_int(g, op, "stages", 1);
        if stages > 2 {
            adapted.push(format!(
                "stages = {stages} runs as 2 (the FMA mainloop double-buffers at most)"
            ));
        }
        adapted
    }

    fn mt(&self) -> usize {
        self.tm / self.threads_m
    }

    fn nt(&self) -> usize {
        self.tn / self.threads_n
    }
}

/// Splits `threads` into `threads_m × threads_n` dividing `tm × tn`: micro-tile
/// sides multiples of 4 first, then as square as possible, then longer along
/// N (along M when `prefer_m`).
fn thread_grid(tm: usize, tn: usize, threads: usize, prefer_m: bool) -> Option<(usize, usize)> {
    (1..=threads)
        .filter(|&t_n| {
            threads.is_multiple_of(t_n)
                && tn.is_multiple_of(t_n)
                && tm.is_multiple_of(threads / t_n)
        })
        .map(|t_n| (threads / t_n, t_n))
        .min_by_key(|&(t_m, t_n)| {
            let (mt, nt) = (tm / t_m, tn / t_n);
            let odd = usize::from(!mt.is_multiple_of(4)) + usize::from(!nt.is_multiple_of(4));
            let along = if prefer_m { mt as i64 } else { nt as i64 };
            (odd, (mt as i64 - nt as i64).abs(), -along)
        })
}

/// The thread's position in the block's `threads_m × threads_n` grid:
/// `(ty, tx)`. Each warp covers 4 × 8 of it (or `32 / threads_n × threads_n`
/// when narrower), so its fragment reads touch 4 rows of A and 8 of B.
fn thread_position(t: &Tiling) -> (Expr, Expr) {
    let tid = Expr::Builtin(Builtin::ThreadX);
    let lanes_n = t.threads_n.min(8);
    let lanes_m = 32 / lanes_n;
    if 32 % lanes_n != 0 || !t.threads_m.is_multiple_of(lanes_m) {
        return (
            div(tid.clone(), t.threads_n as i64),
            rem(tid, t.threads_n as i64),
        );
    }
    let warps_n = (t.threads_n / lanes_n) as i64;
    let (warp, lane) = (div(tid.clone(), 32), rem(tid, 32));
    (
        add(
            mul(div(warp.clone(), warps_n), int(lanes_m as i64)),
            div(lane.clone(), lanes_n as i64),
        ),
        add(
            mul(rem(warp, warps_n), int(lanes_n as i64)),
            rem(lane, lanes_n as i64),
        ),
    )
}

/// Operand `which`'s tile of contraction `c` under tiling `t`, carried
/// one k tile ahead in registers; `element` finds its elements.
fn prefetch<'c>(
    l: &Lower,
    c: &Contraction,
    which: GemmDim,
    t: &Tiling,
    element: &'c dyn Fn(&Lower, Expr, Expr) -> Element,
) -> Prefetch<'c> {
    let (name, shared, operand, rows, extent) = match which {
        GemmDim::M => ("a", "As", &c.a, t.tm, c.m),
        _ => ("b", "Bs", &c.b, t.tn, c.n),
    };
    let k_inner = operand.contiguous == GemmDim::K;
    let fits = if k_inner {
        t.tk.is_multiple_of(VECTOR)
    } else {
        rows.is_multiple_of(VECTOR)
    };
    Prefetch {
        name,
        shared,
        value: operand.value,
        dtype: l.g.ty(operand.value).dtype,
        rows,
        extent,
        tk: t.tk,
        k_extent: c.k,
        threads: t.threads,
        width: if operand.vector && fits { VECTOR } else { 1 },
        k_inner,
        ld: rows + if k_inner { 4 } else { 0 },
        element,
    }
}

/// One k step of the inner loop: this thread's fragments of A and B from
/// shared buffer `buf`, then `mt × nt` FMAs.
fn multiply(t: &Tiling, a: &Prefetch, b: &Prefetch, buf: &Expr) -> Vec<Stmt> {
    // Group q of a fragment: `w` floats at row q·spread·w + lane·w of k row `kk`.
    let fragment = |stage: &Prefetch, len: usize, w: usize, spread: usize, lane: &str| {
        let k_row = add(mul(buf.clone(), int(stage.tk as i64)), var("kk"));
        Fragment {
            shared: stage.shared,
            declared: Ty::Float4,
            base: add(mul(k_row, int((stage.ld / w) as i64)), var(lane)),
            step: spread,
            len,
            width: w,
        }
    };
    let a = fragment(a, t.mt(), t.wm, t.threads_m, "ty");
    let b = fragment(b, t.nt(), t.wn, t.threads_n, "tx");
    vec![unrolled("kk", t.tk, rank1_update("acc", &a, &b))]
}

/// The k loop over `tiles` tiles of `tk`. Registers carry one tile from its
/// global loads to its shared stores; each tile's loads are issued right
/// before a barrier (which the compiler does not move them across) so they
/// are in flight during the next FMAs:
///
/// - two buffers: `load 0; store 0 → buf 0; load 1; sync;` then per tile
///   `kt`: `multiply buf kt&1; store kt+1 → the other buffer; load kt+2; sync`
///   (the other buffer was last read before the previous barrier);
/// - one buffer: `load 0;` then per tile: `store kt; load kt+1; sync;
///   multiply; sync`.
fn k_loop(
    l: &mut Lower,
    t: &Tiling,
    split: &SplitK,
    a: &Prefetch,
    b: &Prefetch,
) -> Result<Vec<Stmt>> {
    let tiles = split.tiles_per_split;
    let k_tile0 = split.first_k_tile();
    let (m0, n0) = (var("m0"), var("n0"));
    // The loads of tile `kt` (of this block's split), skipped past the last tile.
    let load = |l: &mut Lower, kt: Expr| -> Result<Vec<Stmt>> {
        let k0 = mul(add(kt.clone(), k_tile0.clone()), int(t.tk as i64));
        let body = vec![a.load(l, &m0, k0.clone())?, b.load(l, &n0, k0)?];
        Ok(match kt {
            Expr::Int(i) if i < tiles as i64 => body,
            Expr::Int(_) => Vec::new(),
            kt => vec![Stmt::If(lt(kt, int(tiles as i64)), body)],
        })
    };
    let store = |l: &mut Lower, buf: Expr| vec![a.store(l, &buf), b.store(l, &buf)];
    let mut out = vec![Stmt::Comment(format!(
        "k loop: {tiles} tiles of {}, {}; each tile's loads are issued before a barrier and overlap the FMAs of the one before",
        t.tk,
        if t.buffers == 2 {
            "two shared buffers"
        } else {
            "one shared buffer"
        }
    ))];
    let mut prologue = load(l, int(0))?;
    let mut body = Vec::new();
    if t.buffers == 2 {
        prologue.extend(store(l, int(0)));
        prologue.extend(load(l, int(1))?);
        prologue.push(Stmt::Barrier);
        body.push(let_int("buf", bin(BinOp::BitAnd, var("kt"), int(1))));
        body.extend(multiply(t, a, b, &var("buf")));
        if tiles > 1 {
            body.push(Stmt::If(
                lt(add(var("kt"), int(1)), int(tiles as i64)),
                store(l, sub(int(1), var("buf"))),
            ));
        }
        body.extend(load(l, add(var("kt"), int(2)))?);
    } else {
        body.extend(store(l, int(0)));
        body.extend(load(l, add(var("kt"), int(1)))?);
        body.push(Stmt::Barrier);
        body.extend(multiply(t, a, b, &int(0)));
    }
    body.push(Stmt::Barrier);
    out.extend(prologue);
    // Rolled: ptxas unrolls a loop of few k tiles whole and hoists every
    // tile's shared loads ahead of their FMAs (a 32×32 f32 tile over three k
    // tiles took 210 registers, and spilled under a two-block bound).
    out.push(Stmt::Pragma("unroll 1".into()));
    out.push(Stmt::For {
        var: "kt".into(),
        start: int(0),
        end: int(tiles as i64),
        step: int(1),
        unroll: false,
        body,
    });
    Ok(out)
}

/// The epilogue: every accumulator through the group's tail, stored where
/// the views after the contraction put it; 4-wide vectors along the
/// result's contiguous dimension where it and every output allow.
fn epilogue(
    l: &mut Lower,
    op: OpId,
    c: &Contraction,
    t: &Tiling,
    tainted: &BTreeSet<ValueId>,
    params: &[Param],
) -> Result<(Vec<Stmt>, &'static str)> {
    let g = l.g;
    let outputs: Vec<&Param> = params.iter().filter(|p| p.output).collect();
    let ys = yields(g, op);
    let results = g.op(op).results.clone();
    let (mt, nt, wm, wn) = (t.mt(), t.nt(), t.wm, t.wn);
    // A matmul's run is along its columns; a convolution's along its
    // pixels, the NCHW result's merged H and W.
    let lanes = match c.geometry {
        Geometry::Matmul { .. } => Lanes::Along(g.ty(c.result).dims().len() - 1),
        Geometry::Conv(_) => Lanes::Linear,
    };
    let vector = c.out_vector().filter(|&d| {
        let w = if d == GemmDim::M { wm } else { wn };
        w == VECTOR
            && ys.iter().zip(&results).all(|(&y, &r)| {
                g.ty(r).dtype.is_float()
                    && lanes_stay_together(g, tainted, (c.result, lanes), y, VECTOR)
            })
    });
    // Row `m0 + qm·threads_m·wm + ty·wm + em`, column likewise; accumulator
    // `(qm·wm + em)·nt + qn·wn + en`. The vector dimension's `e` is a lane
    // unrolled here, the others are loops.
    let (em, en) = (var("em"), var("en"));
    let row = |em: Expr| {
        add(
            add(
                add(var("m0"), mul(var("qm"), int((t.threads_m * wm) as i64))),
                mul(var("ty"), int(wm as i64)),
            ),
            em,
        )
    };
    let col = |en: Expr| {
        add(
            add(
                add(var("n0"), mul(var("qn"), int((t.threads_n * wn) as i64))),
                mul(var("tx"), int(wn as i64)),
            ),
            en,
        )
    };
    let acc = |em: Expr, en: Expr| {
        Expr::Load(
            array("acc", Ty::F32),
            Box::new(add(
                mul(add(mul(var("qm"), int(wm as i64)), em), int(nt as i64)),
                add(mul(var("qn"), int(wn as i64)), en),
            )),
        )
    };
    let bounds = all([
        (!c.m.is_multiple_of(t.tm)).then(|| lt(var("row"), int(c.m as i64))),
        (!c.n.is_multiple_of(t.tn)).then(|| lt(var("col"), int(c.n as i64))),
    ]);
    let bz = batch_index(c);
    let mut body = vec![];
    let stores = if let Some(dim) = vector {
        // Lane `j` is row `row + j` (along M) or column `col + j` (along N),
        // at linear index `vidx·4 + j` of every output.
        body.push(let_int(
            "row",
            row(if dim == GemmDim::M {
                int(0)
            } else {
                em.clone()
            }),
        ));
        body.push(let_int(
            "col",
            col(if dim == GemmDim::N {
                int(0)
            } else {
                en.clone()
            }),
        ));
        let lanes: Vec<(Vec<Expr>, Expr)> = (0..VECTOR)
            .map(|j| {
                let lane = int(j as i64);
                match dim {
                    GemmDim::M => (
                        c.out_at(&bz, add(var("row"), lane.clone()), var("col")),
                        acc(lane, en.clone()),
                    ),
                    _ => (
                        c.out_at(&bz, var("row"), add(var("col"), lane.clone())),
                        acc(em.clone(), lane),
                    ),
                }
            })
            .collect();
        l.scoped(|l| {
            store_result_vectors(
                l, tainted, c.result, "vidx", None, &lanes, &outputs, &ys, &results,
            )
        })?
    } else {
        body.push(let_int("row", row(em.clone())));
        body.push(let_int("col", col(en.clone())));
        l.reduced = Some((c.result, Reduced::Row(acc(em.clone(), en.clone())), 0));
        let coords = c.out_at(&bz, var("row"), var("col"));
        l.scoped(|l| store_results(l, tainted, c.result, &coords, &outputs, &ys, &results))?
    };
    body.extend(guarded([bounds], stores));
    // Loops from the outside in: qm, em, qn, en, without the vector's `e`.
    let mut nest = body;
    let loops = [
        ("en", wn, vector != Some(GemmDim::N)),
        ("qn", nt / wn, true),
        ("em", wm, vector != Some(GemmDim::M)),
        ("qm", mt / wm, true),
    ];
    for (name, end, present) in loops {
        if present {
            nest = vec![unrolled(name, end, nest)];
        }
    }
    let how = match vector {
        Some(GemmDim::M) => "4 rows per store",
        Some(_) => "4 columns per store",
        None => "scalar stores",
    };
    Ok((nest, how))
}

/// The kernel's own locals (IR names that collide are renamed).
const LOCALS: [&str; 47] = [
    "tile_m", "tile_n", "bz", "m0", "n0", "tx", "ty", "kt", "kk", "buf", "i", "j", "q", "qm", "qn",
    "em", "en", "acc", "a_frag", "b_frag", "a_frag4", "a_frag2", "b_frag4", "b_frag2", "row",
    "col", "vidx", "As", "Bs", "a_e", "a_r", "a_k", "a_row", "a_kg", "a_ld", "a_v", "b_e", "b_r",
    "b_k", "b_row", "b_kg", "b_ld", "b_v", "a_img", "a_ch", "a_ih", "a_iw",
];

/// Lowers a group whose contraction is `c`.
fn lower_contraction(l: &mut Lower, op: OpId, c: &Contraction) -> Result<Kernel> {
    let g = l.g;
    // Claimed before the parameters take their names from the IR.
    for name in LOCALS.iter().chain(super::split_k::LOCALS) {
        l.used_names.insert((*name).into());
    }
    let params = params(l, op);
    let tainted = c.check(l, op)?;
    let (t, fallback) = Tiling::of(l, op, c.out_vector() == Some(GemmDim::M))?;
    let (mt, nt) = (t.mt(), t.nt());
    let (grid_m, grid_n) = (c.m.div_ceil(t.tm), c.n.div_ceil(t.tn));
    let bz = batch_index(c);
    let (a_at, b_at) = (
        |l: &Lower, row, k| c.a_at(l, &bz, row, k),
        |l: &Lower, row, k| c.b_at(l, &bz, k, row),
    );
    let a = prefetch(l, c, GemmDim::M, &t, &a_at);
    let b = prefetch(l, c, GemmDim::N, &t, &b_at);
    let split = SplitK::new(
        attr_int(g, op, "split_k", 1),
        c.k.div_ceil(t.tk),
        c.batch * grid_m * grid_n,
    );
    let (split_setup, bid) = split.block_index();
    let (ty, tx) = thread_position(&t);
    let mut body = split_setup;
    body.extend([
        Stmt::Comment(format!(
            "block tile {}x{}x{}; {}x{} threads, each {mt}x{nt} accumulators in groups of {}x{}",
            t.tm, t.tn, t.tk, t.threads_m, t.threads_n, t.wm, t.wn
        )),
        let_int("tile_n", rem(bid.clone(), grid_n as i64)),
        let_int(
            "tile_m",
            if c.batch > 1 {
                rem(div(bid.clone(), grid_n as i64), grid_m as i64)
            } else {
                div(bid.clone(), grid_n as i64)
            },
        ),
        let_int("m0", mul(var("tile_m"), int(t.tm as i64))),
        let_int("n0", mul(var("tile_n"), int(t.tn as i64))),
    ]);
    if c.batch > 1 {
        body.push(let_int("bz", div(bid, (grid_n * grid_m) as i64)));
    }
    body.extend([
        let_int("ty", ty),
        let_int("tx", tx),
        Stmt::LocalArray {
            name: "acc".into(),
            ty: Ty::F32,
            len: mt * nt,
        },
        unrolled(
            "i",
            mt * nt,
            vec![Stmt::Store(array("acc", Ty::F32), var("i"), Expr::F32(0.0))],
        ),
        Stmt::LocalArray {
            name: "a_ld".into(),
            ty: a.slot_ty(),
            len: a.slots(),
        },
        Stmt::LocalArray {
            name: "b_ld".into(),
            ty: b.slot_ty(),
            len: b.slots(),
        },
    ]);
    body.extend(k_loop(l, &t, &split, &a, &b)?);
    let (epilogue, stores) = epilogue(l, op, c, &t, &tainted, &params)?;
    let mut tail = vec![Stmt::Comment("epilogue".into())];
    tail.extend(epilogue);
    body.extend(split.finish(&mut l.helpers, mt * nt, t.threads, tail));
    let mut params = params;
    let scratch = split.scratch(&mut params, mt * nt, t.threads);

    let shape = match &c.geometry {
        Geometry::Matmul {
            transpose_a,
            transpose_b,
            ..
        } => format!(
            "{} x [{} x {}]{} @ [{} x {}]{}",
            c.batch,
            c.m,
            c.k,
            if *transpose_a { "^T" } else { "" },
            c.k,
            c.n,
            if *transpose_b { "^T" } else { "" },
        ),
        Geometry::Conv(geo) => geo.describe(c),
    };
    let access = |s: &Prefetch| if s.width > 1 { "vector" } else { "scalar" };
    let summary = format!(
        "{} ({}): {shape}, tile [{}, {}, {}]{}, {} threads, {mt}x{nt} per thread, {} buffer(s){}, A {} B {} loads, {stores}, fma",
        if matches!(c.geometry, Geometry::Conv(_)) {
            "conv implicit gemm"
        } else {
            "gemm"
        },
        g.ty(c.a.value).dtype.name(),
        t.tm,
        t.tn,
        t.tk,
        fallback
            .as_ref()
            .map(|why| format!(" ({why})"))
            .unwrap_or_default(),
        t.threads,
        t.buffers,
        if split.is_split() {
            format!(", split-K {}", split.splits)
        } else {
            String::new()
        },
        access(&a),
        access(&b),
    );
    let shared = |name: &str, s: &Prefetch| SharedArray {
        name: name.into(),
        ty: Ty::Float4,
        len: t.buffers * t.tk * s.ld / 4,
    };
    Ok(Kernel {
        shared: vec![shared("As", &a), shared("Bs", &b)],
        min_blocks_per_sm: occupancy_promise(
            min_blocks_per_sm(&t, a.width == 1 || b.width == 1, split.is_split()),
            split.blocks(),
        ),
        scratch,
        adapted: t.adapted(g, op, fallback.as_deref()),
        ..l.kernel(op, summary, params, body, [t.threads, split.blocks()])
    })
}

/// Whether group `op` holds math beyond additions, multiplications, ReLU,
/// clipping, casts, batchnorm and views: its epilogue then needs registers
/// of its own beside the accumulators.
fn heavy_epilogue(l: &Lower, op: OpId) -> bool {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    g.block(region).ops.iter().any(|&o| {
        let kind = g.op(o).kind;
        !(matches!(
            kind,
            OpKind::Matmul
                | OpKind::Conv2d
                | OpKind::Add
                | OpKind::Sub
                | OpKind::Mul
                | OpKind::Relu
                | OpKind::Clip
                | OpKind::Cast
                | OpKind::Batchnorm
                | OpKind::Constant
                | OpKind::Yield
                | OpKind::Broadcast
                | OpKind::Reshape
                | OpKind::Transpose
                | OpKind::Slice
        ))
    })
}

/// Registers per thread besides accumulators, fragments and prefetch:
/// addresses, indices, loop state.
const OVERHEAD_REGISTERS: usize = 40;

/// The blocks per SM to promise ptxas: as many as the registers this tiling
/// needs leave room for (accumulators counted twice: the epilogue's
/// temporaries live beside them), with 24 more when an operand is loaded
/// element by element (a conv's im2col, a transposed view: an index and
/// bounds per element) and 16 for split-K's slots and sums. Without a
/// promise ptxas aims at its own occupancy target (48 registers for 256
/// threads) and spills a 4×4 micro-tile's loop; with one too tight it
/// spilled split conv tiles (64×32×32 of 128 threads at 128 registers) and
/// a 32×32 tile of transposed heads at 64.
fn min_blocks_per_sm(t: &Tiling, gathered: bool, split: bool) -> u32 {
    let prefetch = ((t.tm + t.tn) * t.tk).div_ceil(t.threads);
    let registers = 2 * t.mt() * t.nt()
        + t.mt()
        + t.nt()
        + prefetch
        + OVERHEAD_REGISTERS
        + if gathered { 24 } else { 0 }
        + if split { 16 } else { 0 };
    (65536 / (t.threads * registers)).clamp(1, 32) as u32
}

/// Fewest SMs of the GPUs dcir models (the RTX 2080's 46): no SM receives
/// more than `⌈grid / MIN_SMS⌉` blocks of a grid.
const MIN_SMS: usize = 46;

/// The blocks per SM to promise ptxas for a grid of `grid` blocks whose
/// registers allow `by_registers`: never more than an SM can receive, so a
/// small grid leaves ptxas every register (a 3-block GEMM over transposed
/// heads took 118 and spilled under a promise of 4 blocks).
pub(super) fn occupancy_promise(by_registers: u32, grid: usize) -> u32 {
    by_registers.min(grid.div_ceil(MIN_SMS).max(1) as u32)
}

/// Lowers a `gemm` group.
pub(super) fn gemm(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let c = Contraction::of_matmul(l, op)?;
    lower_contraction(l, op, &c)
}

/// Lowers a `conv` group as an implicit GEMM.
pub(super) fn conv(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let c = Contraction::of_conv(l, op)?;
    lower_contraction(l, op, &c)
}

#[cfg(test)]
mod tests {
    use super::{Tiling, thread_grid};
    use crate::emit_module_source;

    /// The CUDA source of one explicit group `body` over `params` with `attrs`.
    fn source(params: &str, result: &str, attrs: &str, body: &str) -> String {
        let args: Vec<String> = params
            .split(", ")
            .map(|p| {
                let name = p.split(':').next().unwrap().trim_start_matches('%');
                format!("%{name}.in = %{name}")
            })
            .collect();
        let src = format!(
            "graph @g({params}) -> ({result}) {{\n\
             \x20 %y = fused @g0({}) {{{attrs}, level = \"register\", math = \"fma\"}} : {result} {{\n\
             {body}\n\
             \x20 }}\n\
             \x20 return %y\n\
             }}\n",
            args.join(", ")
        );
        let module = dcir_reader::parse_module(&src).expect("parses");
        emit_module_source(&module).expect("lowers")
    }

    fn matmul(m: usize, k: usize, n: usize, tile: &str, threads: usize, stages: usize) -> String {
        source(
            &format!("%a: f32[{m},{k}], %b: f32[{k},{n}]"),
            &format!("f32[{m},{n}]"),
            &format!("kind = \"gemm\", tile = {tile}, threads = {threads}, stages = {stages}"),
            &format!("    %y.r = matmul %a.in, %b.in : f32[{m},{n}]\n    yield %y.r"),
        )
    }

    #[test]
    fn thread_grid_prefers_square_micro_tiles_of_four() {
        assert_eq!(thread_grid(128, 128, 256, false), Some((16, 16)));
        // 8x16 rather than 16x8 or 4x32.
        assert_eq!(thread_grid(128, 256, 256, false), Some((16, 16)));
        // 4x2 or 2x4: longer along the preferred dimension.
        assert_eq!(thread_grid(64, 32, 256, false), Some((32, 8)));
        assert_eq!(thread_grid(64, 32, 256, true), Some((16, 16)));
    }

    #[test]
    fn tiling_honours_valid_plans_and_shrinks_tk() {
        let t = Tiling::planned([128, 128, 8], 256, 2, false).unwrap();
        assert_eq!((t.mt(), t.nt(), t.wm, t.wn, t.buffers), (8, 8, 4, 4, 2));
        // 128 + 256 rows of tk = 64 would be 96 registers of prefetch per thread.
        let t = Tiling::planned([128, 256, 64], 256, 1, false).unwrap();
        assert_eq!(t.tk, 16);
        // Too many accumulators, a tile not a multiple of 4, odd thread counts.
        assert_eq!(Tiling::planned([256, 256, 8], 256, 1, false), None);
        assert_eq!(Tiling::planned([30, 64, 8], 256, 1, false), None);
        assert_eq!(Tiling::planned([64, 64, 8], 100, 1, false), None);
    }

    #[test]
    fn aligned_sizes_have_vector_loads_and_no_bounds_checks() {
        let s = matmul(256, 512, 256, "[128, 128, 8]", 256, 2);
        assert!(
            s.contains("A vector B vector loads, 4 columns per store"),
            "{s}"
        );
        assert!(s.contains("reinterpret_cast<const float4*>(a_in)"), "{s}");
        assert!(
            !s.contains("if (a_row <") && !s.contains("if (row <"),
            "{s}"
        );
        assert!(s.contains("two shared buffers;"), "{s}");
    }

    #[test]
    fn odd_sizes_check_bounds_at_staging_and_store_only() {
        let s = matmul(17, 783, 33, "[64, 64, 8]", 256, 1);
        assert!(s.contains("A scalar B scalar loads, scalar stores"), "{s}");
        assert!(s.contains("if (a_row < 17 && a_kg < 783)"), "{s}");
        assert!(s.contains("if (b_row < 33 && b_kg < 783)"), "{s}");
        assert!(s.contains("if (row < 17 && col < 33)"), "{s}");
        // The inner loop reads shared memory unguarded.
        let inner = &s[s.find("for (int kk").unwrap()..s.find("// epilogue").unwrap()];
        assert!(!inner.contains("if ("), "{inner}");
    }

    #[test]
    fn invalid_plans_are_refused() {
        let src = |tile: &str| {
            format!(
                "graph @g(%a: f32[64,64], %b: f32[64,64]) -> (f32[64,64]) {{\n\
                 \x20 %y = fused @g0(%a.in = %a, %b.in = %b) {{kind = \"gemm\", level = \"register\", math = \"fma\", tile = {tile}, threads = 256}} : f32[64,64] {{\n\
                 \x20   %y.r = matmul %a.in, %b.in : f32[64,64]\n\
                 \x20   yield %y.r\n\
                 \x20 }}\n\
                 \x20 return %y\n\
                 }}\n"
            )
        };
        for (tile, why) in [
            (
                "[30, 64, 8]",
                "tile [30, 64, 8] with 256 threads (the threads must split",
            ),
            ("[64, 64]", "tile = [64, 64] (a GEMM tile is [tm, tn, tk])"),
        ] {
            let module = dcir_reader::parse_module(&src(tile)).expect("parses");
            let e = emit_module_source(&module)
                .expect_err("refused")
                .to_string();
            assert!(e.contains(why), "{e}");
        }
    }

    fn conv(x: &str, w: &str, y: &str, attrs: &str) -> String {
        source(
            &format!("%x: f32[{x}], %w: f32[{w}]"),
            &format!("f32[{y}]"),
            "algorithm = \"implicit_gemm\", kind = \"conv\", tile = [64, 64, 8], threads = 256, stages = 1",
            &format!("    %y.r = conv2d %x.in, %w.in {attrs} : f32[{y}]\n    yield %y.r"),
        )
    }

    #[test]
    fn pointwise_convs_are_plain_gemms_with_vector_loads() {
        let s = conv("2,64,14,14", "32,64,1,1", "2,32,14,14", "");
        assert!(
            s.contains("A vector B vector loads, 4 rows per store"),
            "{s}"
        );
        assert!(!s.contains("a_ih >= 0"), "{s}");
    }

    #[test]
    fn padded_windows_are_zero_outside_the_image() {
        let s = conv("1,3,17,17", "5,3,3,3", "1,5,17,17", "{pad = [1, 0, 1, 2]}");
        // Top and bottom padding; left 0 (no lower check), right 2.
        assert!(
            s.contains("if (a_row < 289 && a_kg < 27 && a_ih >= 0 && a_ih < 17 && a_iw < 17)"),
            "{s}"
        );
        assert!(
            s.contains("const int a_ih = a_row / 17 % 17 - 1 + a_kg / 3 % 3;"),
            "{s}"
        );
        assert!(s.contains("const int a_iw = a_row % 17 + a_kg % 3;"), "{s}");
    }
}
