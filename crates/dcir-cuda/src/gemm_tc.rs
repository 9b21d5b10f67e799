//! The tensor-core path of the `gemm` and `conv` (`algorithm =
//! "implicit_gemm"`) families: one batched `matmul`, or one `conv2d` as an
//! implicit GEMM, with f16 or bf16 operands on `mma.sync.aligned.m16n8k16`
//! with f32 accumulators, view prologues and an elementwise epilogue (the
//! groups [`super::gemm`] takes, when `math = "tensor_core"`).
//!
//! Shape of the kernel:
//!
//! - **Block**: a `tm × tn` output tile of one batch entry; the 1-D grid is
//!   split into batch entry and tile, tiles ordered in groups of 8 tile rows
//!   so the blocks in flight share operand panels in L2.
//! - **Warps**: a `warps_m × warps_n` grid, each warp owning a `wm × wn`
//!   sub-tile as `(wm/16)·(wn/8)` m16n8 accumulator fragments (4 floats per
//!   thread each; thread `lane` holds rows `lane/4`, `lane/4 + 8` and
//!   columns `2·(lane%4) + {0, 1}` of each).
//! - **Shared memory**: a ring of `stages` buffers, each holding an A tile
//!   (`tm × tk`) and a B tile (`tn × tk`) as rows of 16-byte chunks, either
//!   k-contiguous (`rows × tk`) or row-contiguous (`tk × rows`), whichever
//!   the operand is contiguous along in memory. Chunk `c` of stored row `r`
//!   lives at chunk `c ^ swizzle(r)` so that the 8 rows an `ldmatrix` reads
//!   hit 8 different bank groups.
//! - **Loads**: an operand that is a strided view of a kernel parameter with
//!   8-element aligned contiguous runs is copied with 16-byte `cp.async`
//!   (zero-filled past M, N, K); any other operand is read element by
//!   element through the index maps ([`Operand::element`]) into registers
//!   while the tensor cores work, and stored to shared memory one step later
//!   (before the step's barrier with 2 stages).
//! - **K loop**: the first `stages - 1` k-tiles are in flight before the
//!   loop. Step `kt` walks tile `kt`'s 16-wide k slices; each slice first
//!   loads the next slice's fragments with `ldmatrix` (`.trans` for
//!   row-contiguous tiles) into the other of two register buffers, then
//!   issues the warp's mma grid on its own. The first slice also issues the
//!   copy of tile `kt + stages - 1` into the stage tile `kt - 1` used; the
//!   last waits for tile `kt + 1` (`cp.async.wait_group stages - 2`) and
//!   passes the step's one barrier before loading that tile's first
//!   fragments.
//! - **Epilogue**: each accumulator goes through the group's elementwise
//!   tail (index maps, with the matmul bound to the accumulator, rounded once
//!   to its dtype) and is stored where the views after the matmul put it,
//!   bounds-checked.
//!
//! The kernel is described by a [`Problem`] (extents and one [`Operand`] per
//! side) and an epilogue callback: [`gemm`] builds it from a matmul and its
//! views, [`conv`] from a conv's implicit-GEMM geometry (A the im2col view of
//! the input, B the weight, channel groups as batch entries).

use std::collections::BTreeSet;

use dcir_fusion::Reason;
use dcir_ir::{Attr, DType, Graph, OpId, OpKind, ValueDef, ValueId};

use super::gemm::{
    Contraction, ConvGeometry, Geometry, Lanes, check_prologue, lanes_stay_together,
    store_result_vectors, store_results,
};
use super::pool::in_range;
use super::split_k::{self, SplitK};
use super::{EmitError, Index, Lower, Reduced, attr_int, pack, params, storage_ty, yields};
use crate::kir::{
    ArrayRef, BinOp, Builtin, Expr, Helper, Kernel, Param, Stmt, Ty, add, and, array, bin, call,
    div, int, let_int, lt, mul, rem, select, sub, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// Bytes of one operand element (f16 or bf16).
const ELEM: usize = 2;
/// Elements of a 16-byte chunk.
const CHUNK: usize = 8;
/// Most accumulator floats per thread (a 64 × 64 warp tile).
const MAX_ACC: usize = 128;
/// Most accumulator floats per thread when an operand takes the element
/// path, whose per-chunk addresses and staging also live in registers.
const MAX_ACC_ELEMENT_PATH: usize = 64;
/// Most 16-byte chunks of a k-tile (A and B) per thread when an operand
/// takes the element path.
const MAX_ELEMENT_CHUNKS: usize = 8;
/// Most warps per block.
const MAX_WARPS: usize = 8;
/// Shared memory a block may use on sm_90.
const MAX_SHARED: usize = 227 * 1024;
/// Consecutive 16-bit columns one vector store of the Hopper epilogue takes (16 bytes).
const VECTOR_COLUMNS: usize = 8;
/// Tile rows per group of the block order.
const GROUP_ROWS: usize = 8;

/// Whether group `op` (`gemm` or `conv`) takes the tensor-core path
/// (`math = "tensor_core"`, its matmul's or conv2d's operands both f16 or both bf16).
pub(super) fn applies(g: &Graph, op: OpId) -> bool {
    let data = g.op(op);
    if data.attrs.get("math").and_then(Attr::as_str) != Some("tensor_core") {
        return false;
    }
    let Some(region) = data.region else {
        return false;
    };
    g.block(region).ops.iter().any(|&o| {
        let mm = g.op(o);
        let dtypes: Vec<DType> = mm.operands.iter().map(|&v| g.ty(v).dtype).collect();
        matches!(mm.kind, OpKind::Matmul | OpKind::Conv2d)
            && matches!(dtypes[..], [a, b] if a == b && matches!(a, DType::F16 | DType::BF16))
    })
}

/// The kernel's blocking, after the fallbacks of [`Config::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Config {
    tm: usize,
    tn: usize,
    tk: usize,
    warps_m: usize,
    warps_n: usize,
    stages: usize,
    /// Split-K splits of the k loop (1: none; see [`super::split_k`]).
    splits: usize,
    /// Whether an operand takes the element path (its staging chunks and
    /// addresses live in registers).
    element_path: bool,
}

impl Config {
    /// The blocking for attributes `tile`, `threads`, `stages`: tile extents
    /// rounded up to powers of two (`tm`, `tn` in 16..=256, `tk` in 16..=64);
    /// `threads / 32` warps (a power of two, at most 8) when they split the
    /// tile into warp tiles of at least 16 × 16 with at most 128
    /// accumulators per thread (64 when an operand takes the element path,
    /// `element_path`), else the nearest warp count that does (more first),
    /// else the larger of `tm`, `tn` halved; with `element_path`, `tk`
    /// halved (down to 16) while a thread would copy more than 8 chunks of a
    /// k-tile; `stages` clamped to 2..=4 and lowered while the buffers
    /// exceed 227 KiB.
    pub(super) fn new(tile: [i64; 3], threads: i64, stages: i64, element_path: bool) -> Config {
        let max_acc = if element_path {
            MAX_ACC_ELEMENT_PATH
        } else {
            MAX_ACC
        };
        let pow2 =
            |x: i64, lo: usize, hi: usize| (x.max(1) as usize).next_power_of_two().clamp(lo, hi);
        let (mut tm, mut tn, mut tk) = (
            pow2(tile[0], 16, 256),
            pow2(tile[1], 16, 256),
            pow2(tile[2], 16, 64),
        );
        let asked = pow2(threads / 32, 1, MAX_WARPS);
        let more =
            std::iter::successors(Some(asked), |w| Some(w * 2)).take_while(|&w| w <= MAX_WARPS);
        let fewer = std::iter::successors(Some(asked / 2), |w| Some(w / 2)).take_while(|&w| w >= 1);
        let warp_counts: Vec<usize> = more.chain(fewer).collect();
        let (warps_m, warps_n) = loop {
            if let Some(split) = warp_counts
                .iter()
                .find_map(|&w| warp_split(tm, tn, w, max_acc))
            {
                break split;
            }
            if tm >= tn {
                tm /= 2;
            } else {
                tn /= 2;
            }
        };
        let threads = warps_m * warps_n * 32;
        while element_path && tk > 16 && (tm + tn) * tk / CHUNK > MAX_ELEMENT_CHUNKS * threads {
            tk /= 2;
        }
        let mut stages = stages.clamp(2, 4) as usize;
        while stages > 2 && stages * (tm + tn) * tk * ELEM > MAX_SHARED {
            stages -= 1;
        }
        Config {
            tm,
            tn,
            tk,
            warps_m,
            warps_n,
            stages,
            splits: 1,
            element_path,
        }
    }

    /// The split-K of `p` under this blocking.
    fn split_k(&self, p: &Problem) -> SplitK {
        SplitK {
            splits: self.splits,
            tiles_per_split: self.k_tiles(p),
            blocks_per_split: p.blocks(self),
        }
    }

    /// This blocking with `tk` halved until it divides `n` (a multiple of 16).
    fn with_tk_dividing(self, n: usize) -> Config {
        let mut tk = self.tk;
        while !n.is_multiple_of(tk) {
            tk /= 2;
        }
        Config { tk, ..self }
    }

    /// This blocking with the k loop cut into (at most) `asked` splits.
    fn with_splits(self, asked: i64, p: &Problem) -> Config {
        let splits = SplitK::new(asked, p.k.div_ceil(self.tk), p.blocks(&self)).splits;
        Config { splits, ..self }
    }

    /// The k-tiles one block runs: all of them, or one split's.
    fn k_tiles(&self, p: &Problem) -> usize {
        p.k.div_ceil(self.tk) / self.splits
    }

    /// Global k-tile of the block's k-tile `kt` (offset by its split's first).
    fn k_tile(&self, p: &Problem, kt: Expr) -> Expr {
        add(kt, self.split_k(p).first_k_tile())
    }

    fn threads(&self) -> usize {
        self.warps_m * self.warps_n * 32
    }

    fn wm(&self) -> usize {
        self.tm / self.warps_m
    }

    fn wn(&self) -> usize {
        self.tn / self.warps_n
    }

    fn shared_bytes(&self) -> usize {
        self.stages * (self.tm + self.tn) * self.tk * ELEM
    }

    /// The blocks per SM to promise ptxas: as many as this tiling's registers
    /// leave room for — f32 accumulators (`wm·wn/32` per thread), twice the
    /// double-buffered A and B fragments, 48 for addresses and loop state, 32
    /// more for the element path's staging, 16 for split-K's sums and 48 for
    /// 64-wide k-tiles.
    /// Without a promise ptxas aims at its own occupancy target and spilled a
    /// 32×32 warp tile at 80 registers.
    fn min_blocks_per_sm(&self) -> u32 {
        let accumulators = self.wm() * self.wn() / 32;
        let fragments = 2 * (self.wm() / 16 * 4 + self.wn() / 8 * 2);
        let registers = accumulators
            + 2 * fragments
            + 48
            + if self.element_path { 32 } else { 0 }
            + if self.splits > 1 { 16 } else { 0 }
            // 64-wide k-tiles unroll four k slices of addresses (a 64x64x64
            // tile of 256 threads spilled under a 128-register promise, and
            // a 32x64x64 one of 16x16 warp tiles at 32 more).
            + if self.tk >= 64 { 48 } else { 0 };
        (65536 / (self.threads() * registers)).clamp(1, 32) as u32
    }
}

/// Splits `warps` into `warps_m × warps_n` with warp tiles of at least
/// 16 × 16 and at most `max_acc` accumulators per thread, the warp tile as
/// square as possible (taller on a tie).
fn warp_split(tm: usize, tn: usize, warps: usize, max_acc: usize) -> Option<(usize, usize)> {
    (0..=warps.trailing_zeros())
        .map(|e| (1usize << e, warps >> e))
        .filter(|&(wm_n, wn_n)| {
            let (wm, wn) = (tm / wm_n, tn / wn_n);
            tm.is_multiple_of(wm_n)
                && tn.is_multiple_of(wn_n)
                && wm >= 16
                && wn >= 16
                && wm * wn / 32 <= max_acc
        })
        .min_by_key(|&(wm_n, wn_n)| {
            let (wm, wn) = ((tm / wm_n) as i64, (tn / wn_n) as i64);
            (wm.ilog2().abs_diff(wn.ilog2()), -wm)
        })
}

/// One dim of a strided view as modes, outermost first: index `i` of the
/// dim lies `Σ_j (i / inner_j % extent_j) · stride_j` elements from the
/// view's origin, `inner_j` the product of the extents of the modes inside
/// mode `j` (CuTe's hierarchical layouts). A reshape that merges a transpose's
/// dims gives a dim of several modes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Modes(Vec<(usize, i64)>);

impl Modes {
    /// A dim of `extent` elements `stride` apart.
    pub(super) fn single(extent: usize, stride: i64) -> Modes {
        Modes(vec![(extent, stride)])
    }

    /// The stride when the dim is one mode.
    pub(super) fn stride(&self) -> Option<i64> {
        match self.0.as_slice() {
            [(_, s)] => Some(*s),
            _ => None,
        }
    }

    /// Whether every stride is a multiple of `n`.
    fn strides_multiple_of(&self, n: i64) -> bool {
        self.0.iter().all(|&(_, s)| s % n == 0)
    }

    /// Whether runs of [`CHUNK`] consecutive indices from a multiple of
    /// [`CHUNK`] are contiguous and aligned: the innermost mode of stride 1
    /// spans a multiple of [`CHUNK`], every other stride a multiple of it.
    fn chunked(&self) -> bool {
        let Some((&(extent, stride), outer)) = self.0.split_last() else {
            return false;
        };
        stride == 1
            && extent.is_multiple_of(CHUNK)
            && outer.iter().all(|&(_, s)| s % CHUNK as i64 == 0)
    }

    /// Whether the innermost mode has stride 1.
    fn unit_inner(&self) -> bool {
        self.0.last().is_some_and(|&(_, s)| s == 1)
    }

    /// The element offset of index `i` (in range).
    fn at(&self, i: Expr) -> Expr {
        let mut inner = 1usize;
        let mut terms = Vec::new();
        for (j, &(extent, stride)) in self.0.iter().enumerate().rev() {
            if stride != 0 {
                let mut x = if inner == 1 {
                    i.clone()
                } else {
                    div(i.clone(), inner as i64)
                };
                // The outermost mode needs no wrap: `i` is in range.
                if j > 0 {
                    x = rem(x, extent as i64);
                }
                terms.push(if stride == 1 { x } else { mul(x, int(stride)) });
            }
            inner *= extent;
        }
        terms.into_iter().rev().reduce(add).unwrap_or(int(0))
    }

    /// The modes with adjacent ones that step evenly merged and extent-1
    /// modes dropped.
    fn coalesced(mut self) -> Modes {
        self.0.retain(|&(e, _)| e != 1);
        let mut out: Vec<(usize, i64)> = Vec::new();
        for (e, s) in self.0 {
            match out.last_mut() {
                Some((oe, os)) if *os == s * e as i64 => {
                    *oe *= e;
                    *os = s;
                }
                _ => out.push((e, s)),
            }
        }
        if out.is_empty() {
            out.push((1, 0));
        }
        Modes(out)
    }
}

/// An operand read as `param[offset + r_at(r) + k_at(k)]` for element
/// `(r, k)` of batch entry `bz` (`offset` may read `bz`), where `r` and `k`
/// are [`Modes`]. One of them is [`Modes::chunked`]; [`emit`] copies along
/// it in 16-byte chunks.
pub(super) struct Strided {
    /// The kernel parameter.
    pub param: String,
    /// Element offset of the batch entry's `(0, 0)`.
    pub offset: Expr,
    /// The dim along M (for A) or N (for B).
    pub r: Modes,
    /// The dim along K.
    pub k: Modes,
    /// The element offset of batch entry 0's `(0, 0)`.
    pub base: i64,
    /// The element stride between consecutive batch entries when one stride
    /// steps them all (0: one entry, or all alike); `offset` is then
    /// `base + bz · stride`.
    pub batch_stride: Option<i64>,
}

impl Strided {
    /// Both strides, when each dim is one mode (the copy then steps its
    /// source offset by constants).
    fn linear(&self) -> Option<(i64, i64)> {
        Some((self.r.stride()?, self.k.stride()?))
    }

    /// The element offset of `(r, k)`.
    pub(super) fn at(&self, r: Expr, k: Expr) -> Expr {
        add(self.offset.clone(), add(self.r.at(r), self.k.at(k)))
    }
}

/// Computes element `(r, k)` of an operand (both in range) as an f32 local,
/// emitting its loads into `l.body`.
pub(super) type ElementFn<'a> = Box<dyn Fn(&mut Lower, Expr, Expr) -> Result<Expr> + 'a>;

/// How the kernel reads one operand: element `(r, k)` of the current batch
/// entry, `r` along M (operand A) or N (operand B).
pub(super) struct Operand<'a> {
    /// Extent along M or N.
    pub rows: usize,
    /// The `cp.async` path: `Some` only when the contiguous dim's extent, the
    /// other strides and the offset are multiples of 8 elements, so every
    /// 16-byte chunk is aligned and entirely in or out of range.
    pub strided: Option<Strided>,
    /// Whether the shared tile keeps k contiguous (else r); k must then be
    /// the contiguous dim of `strided`.
    pub k_inner: bool,
    /// The pixel path of a conv's A operand (rows contiguous, `strided`
    /// `None`): consecutive threads load consecutive output pixels' elements
    /// of one k straight from the input parameter (see [`PixelMapped`]).
    pub pixels: Option<PixelMapped>,
    /// The element path, used when `strided` is `None`.
    pub element: ElementFn<'a>,
}

/// A conv's im2col operand read from its input parameter with consecutive
/// threads on consecutive output pixels: each thread keeps its pixels' input
/// offset and window origin from the start (`a_pb`, `a_ph`, `a_pw`), so an
/// element costs the decomposition of its k, a bounds check, a 16-bit load
/// (coalesced across the warp) and a 16-bit shared store; no conversions.
///
/// With `tap_major` the problem's k runs over the window's taps outside and
/// the channels inside (`k = tap·Cg + c`, B read to match) and every k-tile
/// lies within one tap (`tk` divides `Cg`): the tap, its bounds check and
/// the pixel's address are computed once per k-tile, and an element costs
/// an add, its load and its store.
pub(super) struct PixelMapped {
    /// The input parameter.
    pub param: String,
    /// The conv.
    pub geo: ConvGeometry,
    /// The channel group of the batch entry (`bz`, or 0).
    pub group: Expr,
    /// Whether k is ordered tap-major.
    pub tap_major: bool,
}

impl PixelMapped {
    /// Whether a conv's k may be ordered tap-major: a window of several taps
    /// over channel groups of a multiple of 16 (so 16-wide k-tiles fit a tap).
    fn tap_major_fits(geo: &ConvGeometry) -> bool {
        let [_, cg, kh, kw] = geo.weight;
        kh * kw > 1 && cg.is_multiple_of(16)
    }
}

/// One batched contraction `C[bz] (M × N) = A[bz] (M × K) · B[bz] (K × N)`.
pub(super) struct Problem<'a> {
    /// Batch entries.
    pub batch: usize,
    /// Output rows.
    pub m: usize,
    /// Output columns.
    pub n: usize,
    /// Contraction extent.
    pub k: usize,
    /// Operand dtype (f16 or bf16).
    pub dtype: DType,
    /// A: `rows` = M.
    pub a: Operand<'a>,
    /// B: `rows` = N.
    pub b: Operand<'a>,
    /// A convolution's views of its input and filter (the Hopper
    /// mainloop's im2col copies read them); `None` for a matmul.
    pub conv: Option<ConvViews>,
}

/// A 2-D convolution's input and filter as strided views, where they keep
/// one stride per dim and the channels contiguous (NHWC input, KRSC
/// filter), as [`super::gemm_wgmma`]'s im2col and filter copies read them:
/// problem row `m` is output pixel `m` (images, rows, columns), column `n`
/// output channel `n`, and the k steps run over the window's taps and
/// 64-channel slices.
pub(super) struct ConvViews {
    pub geo: ConvGeometry,
    /// The input as `[N, C, H, W]` (C's stride 1).
    pub input: Option<StridedTensor>,
    /// The filter as `[O, C, KH, KW]` (C's stride 1).
    pub filter: Option<StridedTensor>,
}

/// A 4-D tensor read from a kernel parameter: its name, element offset and
/// per-dim element strides.
pub(super) type StridedTensor = (String, i64, [i64; 4]);

impl ConvViews {
    /// The views of `geo`'s conv reading input `x` and filter `w`.
    fn of(l: &Lower, geo: &ConvGeometry, x: ValueId, w: ValueId) -> ConvViews {
        let view = |v: ValueId| {
            let (param, modes, offset) = strided_view(l, v)?;
            let strides: Vec<i64> = modes.iter().map(Modes::stride).collect::<Option<_>>()?;
            let strides: [i64; 4] = strides.try_into().ok()?;
            (strides[1] == 1).then_some((param, offset, strides))
        };
        ConvViews {
            geo: geo.clone(),
            input: view(x),
            filter: view(w),
        }
    }
}

impl Problem<'_> {
    /// Blocks of the grid for blocking `c`.
    pub(super) fn blocks(&self, c: &Config) -> usize {
        self.batch * self.m.div_ceil(c.tm) * self.n.div_ceil(c.tn)
    }
}

/// Emits the stores of output element `(row, col)` of batch entry `bz`
/// (both in range) whose f32 accumulator is the given expression; given
/// several, of as many consecutive columns from `col`, which is then a
/// multiple of their count.
pub(super) type EpilogueFn<'a> = dyn Fn(&mut Lower, Expr, Expr, &[Expr]) -> Result<()> + 'a;

/// Names the kernel body declares; reserved before the parameters are named.
const LOCALS: &[&str] = &[
    "tile",
    "bz",
    "group",
    "group_rows",
    "tile_m",
    "tile_n",
    "m0",
    "n0",
    "warp",
    "lane",
    "warp_m0",
    "warp_n0",
    "smem",
    "acc",
    "kt",
    "fetch",
    "i",
    "j",
    "h",
    "e",
    "s",
    "row",
    "col",
];
/// Per-operand names, each prefixed by `a_` and `b_`.
const OPERAND_LOCALS: &[&str] = &[
    "row", "col", "src", "dst", "ld_row", "ld_chunk", "ld_sw", "ld", "stage", "frag0", "frag1",
    "first", "tile", "next", "wtile", "r", "k", "tap", "c0", "dr", "ds",
];

/// Reserves the kernel's local names (call before [`params`]).
pub(super) fn reserve_names(l: &mut Lower) {
    for &n in LOCALS
        .iter()
        .chain(split_k::LOCALS)
        .chain(super::gemm_wgmma::LOCALS)
    {
        l.used_names.insert(n.into());
    }
    for p in ["a", "b"] {
        for n in OPERAND_LOCALS {
            l.used_names.insert(format!("{p}_{n}"));
        }
        for e in 0..CHUNK {
            l.used_names.insert(format!("{p}_v{e}"));
        }
    }
}

fn let_bool(name: &str, value: Expr) -> Stmt {
    Stmt::Let {
        name: name.into(),
        ty: Ty::Bool,
        value,
        constant: true,
    }
}

fn let_u32(name: &str, value: Expr) -> Stmt {
    Stmt::Let {
        name: name.into(),
        ty: Ty::U32,
        value,
        constant: true,
    }
}

fn xor(a: Expr, b: Expr) -> Expr {
    match b {
        Expr::Int(0) => a,
        b => bin(BinOp::BitXor, a, b),
    }
}

fn load_as(name: &str, ty: Ty, index: Expr) -> Expr {
    Expr::Load(array(name, ty), Box::new(index))
}

/// `for (int v = 0; v < n; v += 1)`, unrolled; just `body` (with `v` = 0) when `n` is 1.
fn unrolled_over(v: &str, n: usize, body: impl Fn(Expr) -> Vec<Stmt>) -> Vec<Stmt> {
    if n == 1 {
        return body(int(0));
    }
    vec![Stmt::For {
        var: v.into(),
        start: int(0),
        end: int(n as i64),
        step: int(1),
        unroll: true,
        body: body(var(v)),
    }]
}

/// One 16-byte chunk of a tile a thread copies with `cp.async`: the
/// statements that name its place, its shared byte address, its element
/// offset in the source parameter, whether it is in range (zeros and no
/// read where not) and whether this thread has it at all (threads past a
/// tile smaller than the block).
pub(super) struct Chunk {
    pub lets: Vec<Stmt>,
    pub dst: Expr,
    pub src: Expr,
    pub full: Option<Expr>,
    pub present: Option<Expr>,
}

/// The `cp.async` copy of a tile from a strided view, the one every
/// tensor-core family issues: each thread's `per_thread` chunks `s`
/// (unrolled), `chunk(s)` saying where each goes and comes from in
/// `param`.
pub(super) fn copy_chunks(
    param: &str,
    per_thread: usize,
    chunk: impl Fn(Expr) -> Chunk,
) -> Vec<Stmt> {
    unrolled_over("s", per_thread, |s| {
        let c = chunk(s);
        let (src, full) = match c.full {
            Some(full) => (select(full.clone(), c.src, int(0)), full),
            None => (c.src, Expr::Bool(true)),
        };
        let copy = Stmt::Call(
            "dcir_cp_async16".into(),
            vec![c.dst, add(var(param), src), full],
        );
        let mut out = c.lets;
        match c.present {
            Some(present) => out.push(Stmt::If(present, vec![copy])),
            None => out.push(copy),
        }
        out
    })
}

/// Where one operand's tiles live in shared memory and which chunks each thread copies.
struct TileLayout {
    /// Operand prefix: `a` or `b`.
    p: &'static str,
    k_inner: bool,
    /// Rows of the stored tile (`rows` when k-inner, else `tk`).
    stored_rows: usize,
    /// 16-byte chunks per stored row.
    row_chunks: usize,
    /// Byte offset of stage 0.
    base: usize,
    /// Bytes per stage.
    stage_bytes: usize,
    /// Chunks each thread copies per tile.
    per_thread: usize,
    /// Stored rows between a thread's consecutive chunks.
    row_step: usize,
    /// Whether some threads copy nothing (fewer chunks than threads).
    guard: bool,
}

impl TileLayout {
    fn new(p: &'static str, k_inner: bool, rows: usize, c: &Config, base: usize) -> TileLayout {
        let (stored_rows, row_len) = if k_inner { (rows, c.tk) } else { (c.tk, rows) };
        let row_chunks = row_len / CHUNK;
        let total = stored_rows * row_chunks;
        let threads = c.threads();
        TileLayout {
            p,
            k_inner,
            stored_rows,
            row_chunks,
            base,
            stage_bytes: rows * c.tk * ELEM,
            per_thread: total.div_ceil(threads),
            row_step: threads / row_chunks,
            guard: total < threads,
        }
    }

    fn name(&self, n: &str) -> String {
        format!("{}_{n}", self.p)
    }

    fn row_bytes(&self) -> usize {
        self.row_chunks * 16
    }

    /// The xor applied to the chunk index in stored row `row`: consecutive
    /// groups of rows sharing a 128-byte line get different values, so any 8
    /// consecutive rows at one logical chunk fall in 8 distinct bank groups.
    /// It has period 8 in `row`.
    fn swizzle(&self, row: Expr) -> Expr {
        let (rows_per_line, values) = swizzle_shape(self.row_chunks);
        rem(div(row, rows_per_line as i64), values as i64)
    }

    /// Byte offset within a stage of chunk `chunk` of stored row `row`.
    fn offset(&self, row: Expr, chunk: Expr) -> Expr {
        let sw = self.swizzle(row.clone());
        add(
            mul(row, int(self.row_bytes() as i64)),
            bin(BinOp::Shl, xor(chunk, sw), int(4)),
        )
    }
}

/// The swizzle of a tile with `row_chunks` 16-byte chunks per row is
/// `(row / rows_per_line) % values`: rows sharing a 128-byte line
/// (`rows_per_line` of them) differ in the line's half or quarter, the next
/// ones in the xor.
fn swizzle_shape(row_chunks: usize) -> (usize, usize) {
    ((8 / row_chunks).max(1), row_chunks.min(8))
}

/// Emits the kernel for `p` with blocking `c`; returns its body. The
/// kernel wants [`Config::threads`] threads, [`Problem::blocks`] blocks and
/// [`Config::shared_bytes`] of dynamic shared memory; call [`reserve_names`]
/// before naming its parameters.
pub(super) fn emit(
    l: &mut Lower,
    p: &Problem,
    c: &Config,
    epilogue: &EpilogueFn,
) -> Result<Vec<Stmt>> {
    let a = TileLayout::new("a", p.a.k_inner, c.tm, c, 0);
    let b = TileLayout::new("b", p.b.k_inner, c.tn, c, c.stages * a.stage_bytes);
    l.helpers.extend([Helper::CpAsync, Helper::Ldmatrix]);
    if p.a.pixels.is_some() || p.b.pixels.is_some() {
        l.helpers.insert(Helper::SharedStore16Bit);
    }
    let mma = if p.dtype == DType::BF16 {
        l.helpers.insert(Helper::MmaBf16);
        "dcir_mma_bf16"
    } else {
        l.helpers.insert(Helper::MmaF16);
        "dcir_mma_f16"
    };
    let split = c.split_k(p);
    let mut body = block_setup(p, c, &split);
    for (t, op, r0, warp_r0) in [(&a, &p.a, "m0", "warp_m0"), (&b, &p.b, "n0", "warp_n0")] {
        body.extend(thread_setup(t, op, var(r0), c, p.m));
        body.extend(ldmatrix_setup(t, warp_r0));
    }
    body.extend(registers(p, c, &a, &b));
    body.extend(prologue(l, p, c, &a, &b)?);
    body.push(main_loop(l, p, c, &a, &b, mma)?);
    let epilogue = epilogue_loops(l, p, c, epilogue)?;
    let acc_len = c.wm() * c.wn() / 32;
    body.extend(split.finish(&mut l.helpers, acc_len, c.threads(), epilogue));
    Ok(body)
}

/// The block's batch entry and tile origin (`bz`, `m0`, `n0`), the warp's
/// sub-tile origin (`warp_m0`, `warp_n0`), `lane`, and the shared base `smem`.
fn block_setup(p: &Problem, c: &Config, split: &SplitK) -> Vec<Stmt> {
    let (grid_m, grid_n) = (p.m.div_ceil(c.tm), p.n.div_ceil(c.tn));
    let tiles = (grid_m * grid_n) as i64;
    let (split_setup, bid) = split.block_index();
    let tid = Expr::Builtin(Builtin::ThreadX);
    let mut out = vec![
        Stmt::Comment(format!(
            "block tile {}x{}x{}: {}x{} warps of {}x{} ({}x{} mma.m16n8k16 each), {} shared-memory stages",
            c.tm,
            c.tn,
            c.tk,
            c.warps_m,
            c.warps_n,
            c.wm(),
            c.wn(),
            c.wm() / 16,
            c.wn() / 8,
            c.stages
        )),
        let_int("tile", rem(bid.clone(), tiles)),
        let_int("bz", div(bid, tiles)),
    ];
    out.splice(0..0, split_setup);
    out.extend(block_order(grid_m, grid_n));
    out.extend([
        let_int("m0", mul(var("tile_m"), int(c.tm as i64))),
        let_int("n0", mul(var("tile_n"), int(c.tn as i64))),
        let_int("warp", div(tid.clone(), 32)),
        let_int("lane", rem(tid, 32)),
        let_int(
            "warp_m0",
            mul(div(var("warp"), c.warps_n as i64), int(c.wm() as i64)),
        ),
        let_int(
            "warp_n0",
            mul(rem(var("warp"), c.warps_n as i64), int(c.wn() as i64)),
        ),
        let_u32("smem", call("dcir_smem_u32", vec![var("dcir_smem")])),
    ]);
    out
}

/// The thread's register arrays: accumulators (zeroed), the element path's
/// staging chunks, two buffers of A and B fragments.
fn registers(p: &Problem, c: &Config, a: &TileLayout, b: &TileLayout) -> Vec<Stmt> {
    let acc_len = c.wm() * c.wn() / 32;
    let mut out = vec![Stmt::LocalArray {
        name: "acc".into(),
        ty: Ty::F32,
        len: acc_len,
    }];
    out.extend(unrolled_over("i", acc_len, |i| {
        vec![Stmt::Store(array("acc", Ty::F32), i, Expr::F32(0.0))]
    }));
    for (t, op) in [(a, &p.a), (b, &p.b)] {
        if op.pixels.is_some() {
            out.push(Stmt::LocalArray {
                name: t.name("el"),
                ty: storage_ty(p.dtype),
                len: PixelPlan::new(t, c).elements,
            });
        } else if op.strided.is_none() {
            out.push(Stmt::LocalArray {
                name: t.name("stage"),
                ty: Ty::Uint4,
                len: t.per_thread,
            });
        }
    }
    for (t, blocks) in [(a, c.wm() / 16), (b, c.wn() / 16)] {
        for buf in 0..2 {
            out.push(Stmt::LocalArray {
                name: format!("{}{buf}", t.name("frag")),
                ty: Ty::U32,
                len: 4 * blocks,
            });
        }
    }
    out
}

/// The first `stages - 1` k-tiles in flight, one commit group each (empty
/// groups past the last tile keep the count), then tile 0's first fragments.
fn prologue(
    l: &mut Lower,
    p: &Problem,
    c: &Config,
    a: &TileLayout,
    b: &TileLayout,
) -> Result<Vec<Stmt>> {
    let kt_count = c.k_tiles(p);
    let ahead = c.stages - 1;
    let loaded = ahead.min(kt_count);
    let mut out = vec![Stmt::Comment(format!(
        "{kt_count} k-tile(s) of {} ({} slice(s) of 16); the first {loaded} in flight before the loop",
        c.tk,
        c.tk / 16
    ))];
    let mut copies = Vec::new();
    for (t, op) in [(a, &p.a), (b, &p.b)] {
        let copy = copy_tile(l, t, op, p, c, var("kt"), var("kt"))?;
        copies.push(copy.wtile);
        copies.extend(copy.issue);
        copies.extend(copy.deferred);
    }
    copies.push(Stmt::Call("dcir_cp_async_commit".into(), vec![]));
    if loaded > 0 {
        out.push(Stmt::For {
            var: "kt".into(),
            start: int(0),
            end: int(loaded as i64),
            step: int(1),
            unroll: true,
            body: copies,
        });
    }
    for _ in loaded..ahead {
        out.push(Stmt::Call("dcir_cp_async_commit".into(), vec![]));
    }
    out.push(Stmt::Call(
        format!("dcir_cp_async_wait<{}>", c.stages - 2),
        vec![],
    ));
    out.push(Stmt::Barrier);
    for (t, blocks) in [(a, c.wm() / 16), (b, c.wn() / 16)] {
        out.push(tile_address(t, "first", int(0), c));
        out.extend(load_fragments(t, "first", blocks, 0, 0));
    }
    Ok(out)
}

/// The loop over k-tiles ([`main_step`] each). With an odd number of k
/// slices per tile (one), the fragment buffers alternate between tiles, so
/// the loop takes two tiles a step.
fn main_loop(
    l: &mut Lower,
    p: &Problem,
    c: &Config,
    a: &TileLayout,
    b: &TileLayout,
    mma: &str,
) -> Result<Stmt> {
    let kt_count = c.k_tiles(p);
    let slices = c.tk / 16;
    let per_step = if slices % 2 == 1 { 2 } else { 1 };
    let mut step = Vec::new();
    for parity in 0..per_step {
        let kt = add(var("kt"), int(parity as i64));
        let tile_step = main_step(l, p, c, a, b, kt, parity * slices, mma)?;
        if parity == 0 {
            step.extend(tile_step);
        } else {
            step.push(Stmt::If(
                lt(add(var("kt"), int(1)), int(kt_count as i64)),
                tile_step,
            ));
        }
    }
    Ok(Stmt::For {
        var: "kt".into(),
        start: int(0),
        end: int(kt_count as i64),
        step: int(per_step as i64),
        unroll: false,
        body: step,
    })
}

/// The epilogue: for every accumulator of the thread, in range, the
/// stores of `epilogue`. Accumulator `(i, j, h, e)` (fragment `(i, j)` of
/// the warp tile, register `2h + e`) is row `lane/4 + 8h`, column
/// `2(lane%4) + e` of the fragment.
fn epilogue_loops(
    l: &mut Lower,
    p: &Problem,
    c: &Config,
    epilogue: &EpilogueFn,
) -> Result<Vec<Stmt>> {
    let (frag_m, frag_n) = (c.wm() / 16, c.wn() / 8);
    let acc = load_as(
        "acc",
        Ty::F32,
        add(
            mul(
                add(
                    mul(add(mul(var("i"), int(frag_n as i64)), var("j")), int(2)),
                    var("h"),
                ),
                int(2),
            ),
            var("e"),
        ),
    );
    let stores = l.scoped(|l| epilogue(l, var("row"), var("col"), &[acc]))?;
    let element = vec![
        let_int(
            "row",
            add(
                add(add(var("m0"), var("warp_m0")), div(var("lane"), 4)),
                add(mul(var("i"), int(16)), mul(var("h"), int(8))),
            ),
        ),
        let_int(
            "col",
            add(
                add(
                    add(var("n0"), var("warp_n0")),
                    mul(rem(var("lane"), 4), int(2)),
                ),
                add(mul(var("j"), int(8)), var("e")),
            ),
        ),
        Stmt::If(
            and(
                lt(var("row"), int(p.m as i64)),
                lt(var("col"), int(p.n as i64)),
            ),
            stores,
        ),
    ];
    let mut nest = element;
    for (v, n) in [("e", 2), ("h", 2), ("j", frag_n), ("i", frag_m)] {
        nest = vec![Stmt::For {
            var: v.into(),
            start: int(0),
            end: int(n as i64),
            step: int(1),
            unroll: true,
            body: nest,
        }];
    }
    let mut out = vec![Stmt::Comment(
        "epilogue: accumulator (i, j, h, e) is row lane/4 + 8h, column 2(lane%4) + e of fragment (i, j)"
            .into(),
    )];
    out.extend(nest);
    Ok(out)
}

/// `tile_m`, `tile_n` of block-in-batch `tile`: tile rows fastest, in
/// groups of [`GROUP_ROWS`] tile rows, so the blocks in flight share the A
/// panels of a group and the B panel of a tile column.
pub(super) fn block_order(grid_m: usize, grid_n: usize) -> Vec<Stmt> {
    let g = GROUP_ROWS as i64;
    if grid_m <= GROUP_ROWS {
        return vec![
            Stmt::Comment("tile rows fastest: consecutive blocks share a B panel".into()),
            let_int("tile_m", rem(var("tile"), grid_m as i64)),
            let_int("tile_n", div(var("tile"), grid_m as i64)),
        ];
    }
    let per_group = g * grid_n as i64;
    let mut out = vec![
        Stmt::Comment(format!(
            "tile rows fastest within groups of {g} tile rows: the blocks in flight share A and B panels"
        )),
        let_int("group", div(var("tile"), per_group)),
    ];
    let rows = if grid_m.is_multiple_of(GROUP_ROWS) {
        int(g)
    } else {
        out.push(let_int(
            "group_rows",
            call(
                "min",
                vec![
                    bin(BinOp::Sub, int(grid_m as i64), mul(var("group"), int(g))),
                    int(g),
                ],
            ),
        ));
        var("group_rows")
    };
    let in_group = rem(var("tile"), per_group);
    out.push(let_int(
        "tile_m",
        add(
            mul(var("group"), int(g)),
            bin(BinOp::Rem, in_group.clone(), rows.clone()),
        ),
    ));
    out.push(let_int("tile_n", bin(BinOp::Div, in_group, rows)));
    out
}

/// Per-thread constants of the tile copy: the stored row and chunk of the
/// thread's first chunk (`X_row`, `X_col`), its byte offset in a stage
/// (`X_dst`), and for `cp.async` its element offset at k-tile 0 (`X_src`).
fn thread_setup(t: &TileLayout, op: &Operand, r0: Expr, c: &Config, m: usize) -> Vec<Stmt> {
    if let Some(px) = &op.pixels {
        return PixelPlan::new(t, c).setup(t, px, m);
    }
    let tid = Expr::Builtin(Builtin::ThreadX);
    let mut out = vec![Stmt::Comment(format!(
        "{}: {} x {} per stage, {}, {} 16-byte chunk(s) per thread by {}",
        t.p.to_uppercase(),
        t.stored_rows,
        t.row_chunks * CHUNK,
        if t.k_inner {
            "k contiguous"
        } else {
            "rows contiguous"
        },
        t.per_thread,
        if op.strided.is_some() {
            "cp.async"
        } else {
            "index maps"
        },
    ))];
    out.push(let_int(
        &t.name("row"),
        div(tid.clone(), t.row_chunks as i64),
    ));
    out.push(let_int(&t.name("col"), rem(tid, t.row_chunks as i64)));
    out.push(let_u32(
        &t.name("dst"),
        t.offset(var(t.name("row")), var(t.name("col"))),
    ));
    if let Some((s, (stride_r, stride_k))) =
        op.strided.as_ref().and_then(|s| Some((s, s.linear()?)))
    {
        let chunk0 = mul(var(t.name("col")), int(CHUNK as i64));
        let src = if t.k_inner {
            add(mul(add(r0, var(t.name("row"))), int(stride_r)), chunk0)
        } else {
            add(mul(var(t.name("row")), int(stride_k)), add(r0, chunk0))
        };
        out.push(let_int(&t.name("src"), add(s.offset.clone(), src)));
    }
    out
}

/// The copy of k-tile `kt` into stage `stage` of operand `t`.
struct TileCopy {
    /// `X_wtile`: the stage's shared address, which `issue` and `deferred` read.
    wtile: Stmt,
    /// Statements to run now: the `cp.async`s, or the element path's loads into `X_stage`.
    issue: Vec<Stmt>,
    /// Statements to run after the step's mma: the element path's stores to
    /// shared memory (empty for `cp.async`).
    deferred: Vec<Stmt>,
}

fn copy_tile(
    l: &mut Lower,
    t: &TileLayout,
    op: &Operand,
    p: &Problem,
    c: &Config,
    kt: Expr,
    stage: Expr,
) -> Result<TileCopy> {
    let wtile = let_u32(
        &t.name("wtile"),
        add(
            add(var("smem"), int(t.base as i64)),
            mul(stage, int(t.stage_bytes as i64)),
        ),
    );
    let row_of = |s: &Expr| add(var(t.name("row")), mul(s.clone(), int(t.row_step as i64)));
    // Shared address of chunk `s`: a constant step from `X_dst` when the
    // swizzle (period 8 rows) repeats every `row_step` rows.
    let dst_of = |s: &Expr| {
        let offset = if t.row_step.is_multiple_of(8) {
            add(
                var(t.name("dst")),
                mul(s.clone(), int((t.row_step * t.row_bytes()) as i64)),
            )
        } else {
            t.offset(row_of(s), var(t.name("col")))
        };
        add(var(t.name("wtile")), offset)
    };
    let guard = |s: &Expr, stmts: Vec<Stmt>| {
        if t.guard {
            vec![Stmt::If(lt(row_of(s), int(t.stored_rows as i64)), stmts)]
        } else {
            stmts
        }
    };
    let r0 = if t.p == "a" { var("m0") } else { var("n0") };
    let k0 = mul(c.k_tile(p, kt), int(c.tk as i64));
    let chunk0 = mul(var(t.name("col")), int(CHUNK as i64));
    // (r, k) of the first element of chunk `s`; the chunk runs along k when
    // the tile is k-inner, else along r.
    let first = |s: &Expr| {
        if t.k_inner {
            (add(r0.clone(), row_of(s)), add(k0.clone(), chunk0.clone()))
        } else {
            (add(r0.clone(), chunk0.clone()), add(k0.clone(), row_of(s)))
        }
    };
    let in_range = |r: Expr, k: Expr| and(lt(r, int(op.rows as i64)), lt(k, int(p.k as i64)));

    if let Some(px) = &op.pixels {
        let plan = PixelPlan::new(t, c);
        return Ok(TileCopy {
            wtile,
            issue: plan.loads(t, px, p.k, k0),
            deferred: plan.stores(t),
        });
    }
    if let Some(sv) = &op.strided {
        let issue = copy_chunks(&sv.param, t.per_thread, |s| {
            let (r, k) = first(&s);
            let full = in_range(r.clone(), k.clone());
            let src = match sv.linear() {
                // `X_src` is the element offset of the thread's first chunk
                // at k-tile 0; chunk `s` of k-tile `kt` is a constant step on.
                Some((stride_r, stride_k)) => {
                    let rows_on = mul(s.clone(), int(t.row_step as i64));
                    let step = if t.k_inner {
                        add(mul(rows_on, int(stride_r)), k0.clone())
                    } else {
                        mul(add(rows_on, k0.clone()), int(stride_k))
                    };
                    add(var(t.name("src")), step)
                }
                // A dim of several modes: each chunk's offset through them.
                None => sv.at(r, k),
            };
            Chunk {
                lets: Vec::new(),
                dst: dst_of(&s),
                src,
                full: Some(full),
                present: t.guard.then(|| lt(row_of(&s), int(t.stored_rows as i64))),
            }
        });
        return Ok(TileCopy {
            wtile,
            issue,
            deferred: Vec::new(),
        });
    }

    // Element path: the 8 elements of each chunk through the index maps into
    // `X_stage[s]` (zero out of range), stored to shared memory later.
    let stage_arr = t.name("stage");
    let chunk = |l: &mut Lower, s: Expr| -> Result<Vec<Stmt>> {
        let (r, k) = first(&s);
        let mut out = vec![let_int(&t.name("r"), r), let_int(&t.name("k"), k)];
        let mut lanes = Vec::new();
        for e in 0..CHUNK {
            let (r, k) = if t.k_inner {
                (var(t.name("r")), add(var(t.name("k")), int(e as i64)))
            } else {
                (add(var(t.name("r")), int(e as i64)), var(t.name("k")))
            };
            let v = format!("{}_v{e}", t.p);
            let load = l.scoped(|l| {
                let x = (op.element)(l, r.clone(), k.clone())?;
                l.body.push(Stmt::Assign(v.clone(), x));
                Ok(())
            })?;
            out.push(Stmt::Let {
                name: v.clone(),
                ty: Ty::F32,
                value: Expr::F32(0.0),
                constant: false,
            });
            out.push(Stmt::If(in_range(r, k), load));
            lanes.push(l.narrow(p.dtype, var(v)));
        }
        out.push(Stmt::Store(
            array(&stage_arr, Ty::Uint4),
            s.clone(),
            pack(p.dtype, lanes),
        ));
        Ok(guard(&s, out))
    };
    let issue = if t.per_thread == 1 {
        chunk(l, int(0))?
    } else {
        vec![Stmt::For {
            var: "s".into(),
            start: int(0),
            end: int(t.per_thread as i64),
            step: int(1),
            unroll: true,
            body: chunk(l, var("s"))?,
        }]
    };
    let deferred = unrolled_over("s", t.per_thread, |s| {
        guard(
            &s,
            vec![Stmt::Call(
                "dcir_st_shared16".into(),
                vec![dst_of(&s), load_as(&stage_arr, Ty::Uint4, s.clone())],
            )],
        )
    });
    Ok(TileCopy {
        wtile,
        issue,
        deferred,
    })
}

/// How the threads of a block share the pixel path's `tk × tm` tile
/// (element `q = tid + i·threads` is pixel `q % tm` of stored row `q / tm`):
/// with at least `tm` threads a thread keeps one pixel and walks rows
/// `tid / tm + i·(threads / tm)`; with fewer it keeps `tm / threads` pixels
/// `tid + j·threads` and walks rows `i / (tm / threads)`.
struct PixelPlan {
    tm: usize,
    tk: usize,
    threads: usize,
    /// Elements each thread copies per k-tile.
    elements: usize,
    /// Pixels each thread keeps.
    pixels: usize,
}

impl PixelPlan {
    fn new(t: &TileLayout, c: &Config) -> PixelPlan {
        let (tm, tk, threads) = (t.row_chunks * CHUNK, t.stored_rows, c.threads());
        PixelPlan {
            tm,
            tk,
            threads,
            elements: (tm * tk).div_ceil(threads),
            pixels: (tm / threads).max(1),
        }
    }

    /// Pixel slot and stored row of element `i`.
    fn element(&self, t: &TileLayout, i: usize) -> (usize, Expr) {
        let j = i % self.pixels;
        let row = if self.threads > self.tm {
            add(
                var(t.name("kr")),
                int((i * (self.threads / self.tm)) as i64),
            )
        } else if self.threads == self.tm {
            int(i as i64)
        } else {
            int((i / self.pixels) as i64)
        };
        (j, row)
    }

    /// Whether element `i`'s row may be past the tile (more threads than elements).
    fn guarded(&self) -> bool {
        self.threads > self.tm * self.tk
    }

    fn pixel(&self, t: &TileLayout, j: usize) -> Expr {
        var(format!("{}_pix{j}", t.p))
    }

    /// The thread's row base `X_kr` and, per pixel, its index in the tile
    /// (`X_pix`), input offset of channel 0 at the window origin (`X_pb`) and
    /// window origin (`X_ph`, `X_pw`); a pixel past M gets an origin row no
    /// tap reaches, so every load of it is skipped (zero).
    fn setup(&self, t: &TileLayout, px: &PixelMapped, m: usize) -> Vec<Stmt> {
        let tid = Expr::Builtin(Builtin::ThreadX);
        let geo = &px.geo;
        let [_, c, h, w] = geo.input;
        let cg = geo.weight[1];
        let mut out = vec![Stmt::Comment(format!(
            "{}: {} x {} per stage, rows contiguous, {} element(s) per thread by pixels ({} per thread, consecutive threads on consecutive pixels)",
            t.p.to_uppercase(),
            self.tk,
            self.tm,
            self.elements,
            self.pixels
        ))];
        if self.threads > self.tm {
            out.push(let_int(&t.name("kr"), div(tid.clone(), self.tm as i64)));
        }
        let r0 = if t.p == "a" { var("m0") } else { var("n0") };
        for j in 0..self.pixels {
            let pix = if self.threads >= self.tm {
                rem(tid.clone(), self.tm as i64)
            } else {
                add(tid.clone(), int((j * self.threads) as i64))
            };
            out.push(let_int(&format!("{}_pix{j}", t.p), pix));
            let mj = format!("{}_m{j}", t.p);
            out.push(let_int(&mj, add(r0.clone(), self.pixel(t, j))));
            let [img, oh, ow] = geo.pixel(var(&mj));
            let ih0 = sub(mul(oh, int(geo.stride[0] as i64)), int(geo.pad[0] as i64));
            let iw0 = sub(mul(ow, int(geo.stride[1] as i64)), int(geo.pad[1] as i64));
            let ph = format!("{}_ph{j}", t.p);
            let pw = format!("{}_pw{j}", t.p);
            out.push(let_int(&ph, ih0));
            out.push(let_int(&pw, iw0));
            let plane = add(
                mul(img, int(c as i64)),
                mul(px.group.clone(), int(cg as i64)),
            );
            out.push(let_int(
                &format!("{}_pb{j}", t.p),
                add(
                    mul(add(mul(plane, int(h as i64)), var(&ph)), int(w as i64)),
                    var(&pw),
                ),
            ));
            if !m.is_multiple_of(self.tm) {
                out.push(let_int(
                    &format!("{}_pv{j}", t.p),
                    select(lt(var(&mj), int(m as i64)), var(&ph), int(-(1 << 24))),
                ));
            }
        }
        out
    }

    /// The window row of pixel slot `j` (`X_pv` where pixels may be past M).
    fn origin_row(&self, t: &TileLayout, j: usize, guarded_m: bool) -> Expr {
        if guarded_m {
            var(format!("{}_pv{j}", t.p))
        } else {
            var(format!("{}_ph{j}", t.p))
        }
    }

    /// The loads of k-tile `k0` (its first k) into `X_el`: per element its
    /// k's channel and tap, the bounds of the tap's input pixel (and of K),
    /// a 16-bit load or zero.
    fn loads(&self, t: &TileLayout, px: &PixelMapped, k: usize, k0: Expr) -> Vec<Stmt> {
        if px.tap_major {
            return self.tap_loads(t, px, k0);
        }
        let geo = &px.geo;
        let [_, _, h, w] = geo.input;
        let m_partial = !geo.m().is_multiple_of(self.tm);
        let el = t.name("el");
        let storage = ArrayRef {
            name: px.param.clone(),
            ty: Ty::F16Bits,
            reinterpret: false,
        };
        // A pixel past M has an origin row below the image: the top check catches it.
        let [(top, bottom), cols] = geo.window_leaves();
        let rows = (top || m_partial, bottom);
        let mut out = Vec::new();
        for i in 0..self.elements {
            let (j, row) = self.element(t, i);
            let kname = format!("{}_k{i}", t.p);
            let mut body = vec![let_int(&kname, add(k0.clone(), row.clone()))];
            let kv = var(&kname);
            let [ch, r, sc] = geo.tap(kv.clone());
            let dr = mul(r, int(geo.dilation[0] as i64));
            let ds = mul(sc, int(geo.dilation[1] as i64));
            let ih = add(self.origin_row(t, j, m_partial), dr.clone());
            let iw = add(var(format!("{}_pw{j}", t.p)), ds.clone());
            let conds = [
                (!k.is_multiple_of(self.tk)).then(|| lt(kv.clone(), int(k as i64))),
                in_range(&ih, h, rows),
                in_range(&iw, w, cols),
            ];
            let offset = add(
                add(var(format!("{}_pb{j}", t.p)), mul(ch, int((h * w) as i64))),
                add(mul(dr, int(w as i64)), ds),
            );
            // Out of bounds the load reads element 0 and the value is zero:
            // selects, not branches.
            let value = match conds.into_iter().flatten().reduce(and) {
                Some(cond) => {
                    let inside = format!("{}_in{i}", t.p);
                    body.push(let_bool(&inside, cond));
                    let read = select(var(&inside), offset, int(0));
                    let raw = format!("{}_x{i}", t.p);
                    body.push(Stmt::Let {
                        name: raw.clone(),
                        ty: Ty::F16Bits,
                        value: Expr::Load(storage.clone(), Box::new(read)),
                        constant: true,
                    });
                    select(var(&inside), var(&raw), int(0))
                }
                None => Expr::Load(storage.clone(), Box::new(offset)),
            };
            body.push(Stmt::Store(array(&el, Ty::F16Bits), int(i as i64), value));
            out.extend(self.guard(&row, body));
        }
        out
    }

    /// [`PixelPlan::loads`] of a tap-major k: the k-tile's tap and first
    /// channel, per pixel its bounds check and address at that tap, then per
    /// element an offset of whole channel planes, a 16-bit load or zero.
    fn tap_loads(&self, t: &TileLayout, px: &PixelMapped, k0: Expr) -> Vec<Stmt> {
        let geo = &px.geo;
        let [_, cg, _, kw] = geo.weight;
        let [_, _, h, w] = geo.input;
        let plane = (h * w) as i64;
        let m_partial = !geo.m().is_multiple_of(self.tm);
        let name = |s: &str| t.name(s);
        let mut out = vec![
            let_int(&name("tap"), div(k0.clone(), cg as i64)),
            let_int(&name("c0"), rem(k0, cg as i64)),
            let_int(
                &name("dr"),
                mul(
                    div(var(name("tap")), kw as i64),
                    int(geo.dilation[0] as i64),
                ),
            ),
            let_int(
                &name("ds"),
                mul(
                    rem(var(name("tap")), kw as i64),
                    int(geo.dilation[1] as i64),
                ),
            ),
        ];
        // A pixel past M has an origin row below the image: the top check catches it.
        let [(top, bottom), cols] = geo.window_leaves();
        let rows = (top || m_partial, bottom);
        let mut inside = Vec::new();
        for j in 0..self.pixels {
            let ih = add(self.origin_row(t, j, m_partial), var(name("dr")));
            let iw = add(var(format!("{}_pw{j}", t.p)), var(name("ds")));
            let cond = [in_range(&ih, h, rows), in_range(&iw, w, cols)]
                .into_iter()
                .flatten()
                .reduce(and);
            if let Some(cond) = cond {
                let flag = format!("{}_tin{j}", t.p);
                out.push(let_bool(&flag, cond));
                inside.push(Some(var(flag)));
            } else {
                inside.push(None);
            }
            // Outside the image the pixel reads from 0: its channel planes stay in bounds.
            let base = add(
                add(
                    var(format!("{}_pb{j}", t.p)),
                    mul(var(name("c0")), int(plane)),
                ),
                add(mul(var(name("dr")), int(w as i64)), var(name("ds"))),
            );
            let base = match inside.last().cloned().flatten() {
                Some(flag) => select(flag, base, int(0)),
                None => base,
            };
            out.push(let_int(&format!("{}_tb{j}", t.p), base));
        }
        let storage = ArrayRef {
            name: px.param.clone(),
            ty: Ty::F16Bits,
            reinterpret: false,
        };
        for i in 0..self.elements {
            let (j, row) = self.element(t, i);
            let offset = add(var(format!("{}_tb{j}", t.p)), mul(row.clone(), int(plane)));
            let load = Expr::Load(storage.clone(), Box::new(offset));
            let value = match &inside[j] {
                Some(flag) => select(flag.clone(), load, int(0)),
                None => load,
            };
            let store = Stmt::Store(array(&t.name("el"), Ty::F16Bits), int(i as i64), value);
            out.extend(self.guard(&row, vec![store]));
        }
        out
    }

    /// The 16-bit shared stores of `X_el` into the stage at `X_wtile`.
    fn stores(&self, t: &TileLayout) -> Vec<Stmt> {
        let mut out = Vec::new();
        for i in 0..self.elements {
            let (j, row) = self.element(t, i);
            let pix = self.pixel(t, j);
            let addr = add(
                add(
                    var(t.name("wtile")),
                    t.offset(row.clone(), div(pix.clone(), CHUNK as i64)),
                ),
                mul(rem(pix, CHUNK as i64), int(ELEM as i64)),
            );
            let store = Stmt::Call(
                "dcir_st_shared2".into(),
                vec![addr, load_as(&t.name("el"), Ty::F16Bits, int(i as i64))],
            );
            out.extend(self.guard(&row, vec![store]));
        }
        out
    }

    fn guard(&self, row: &Expr, body: Vec<Stmt>) -> Vec<Stmt> {
        if self.guarded() {
            vec![Stmt::If(lt(row.clone(), int(self.tk as i64)), body)]
        } else {
            body
        }
    }
}

/// Per-lane constants of the `ldmatrix` addresses. An x4 load covers a
/// 16 (r) × 16 (k) block as four 8 × 8 matrices; lane `l` addresses row
/// `l % 8` of matrix `l / 8`, whose (r, k) offset is, in fragment order,
/// A: (0, 0), (8, 0), (0, 8), (8, 8) (registers a0..a3 of the mma) and
/// B: (0, 0), (0, 8), (8, 0), (8, 8) (b0, b1 of two n8 tiles).
fn ldmatrix_setup(t: &TileLayout, warp_r0: &str) -> Vec<Stmt> {
    let lane = || var("lane");
    // The lane's matrix offsets in units of 8 rows / 8 k.
    let (r_off, k_off) = if t.p == "a" {
        (rem(div(lane(), 8), 2), div(lane(), 16))
    } else {
        (div(lane(), 16), rem(div(lane(), 8), 2))
    };
    // The lane's stored row and 16-byte chunk at (i, kk) = (0, 0).
    let (row, chunk) = if t.k_inner {
        (
            add(add(var(warp_r0), mul(r_off, int(8))), rem(lane(), 8)),
            k_off,
        )
    } else {
        (
            add(mul(k_off, int(8)), rem(lane(), 8)),
            add(div(var(warp_r0), CHUNK as i64), r_off),
        )
    };
    vec![
        let_int(&t.name("ld_row"), row),
        let_int(&t.name("ld_chunk"), chunk),
        let_int(&t.name("ld_sw"), t.swizzle(var(t.name("ld_row")))),
        let_int(
            &t.name("ld"),
            mul(var(t.name("ld_row")), int(t.row_bytes() as i64)),
        ),
    ]
}

/// `X_<name>`: the shared address of operand `t`'s stage holding k-tile `kt`.
fn tile_address(t: &TileLayout, name: &str, kt: Expr, c: &Config) -> Stmt {
    let stage = rem(kt, c.stages as i64);
    let_u32(
        &t.name(name),
        add(
            add(var("smem"), int(t.base as i64)),
            mul(stage, int(t.stage_bytes as i64)),
        ),
    )
}

/// The x4 `ldmatrix`s of k slice `kk` of the tile at `X_<tile>` into
/// fragment buffer `buf`: one per 16-row block of the warp tile (for A the
/// mma's a0..a3; for B b0, b1 of two n8 tiles). The swizzle of the lane's
/// row is the same for every block and slice: they move it by multiples of
/// 16 rows.
fn load_fragments(t: &TileLayout, tile: &str, blocks: usize, kk: usize, buf: usize) -> Vec<Stmt> {
    let frag = format!("{}{buf}", t.name("frag"));
    let f = if t.k_inner {
        "dcir_ldmatrix_x4"
    } else {
        "dcir_ldmatrix_x4_trans"
    };
    let rb = t.row_bytes() as i64;
    unrolled_over("i", blocks, |i| {
        let (rows_on, chunk) = if t.k_inner {
            (
                mul(i.clone(), int(16 * rb)),
                add(int(2 * kk as i64), var(t.name("ld_chunk"))),
            )
        } else {
            (
                int(16 * kk as i64 * rb),
                add(var(t.name("ld_chunk")), mul(i.clone(), int(2))),
            )
        };
        let addr = add(
            add(var(t.name(tile)), var(t.name("ld"))),
            add(
                rows_on,
                bin(BinOp::Shl, xor(chunk, var(t.name("ld_sw"))), int(4)),
            ),
        );
        let mut args: Vec<Expr> = (0..4)
            .map(|q| load_as(&frag, Ty::U32, add(mul(i.clone(), int(4)), int(q))))
            .collect();
        args.push(addr);
        vec![Stmt::Call(f.into(), args)]
    })
}

/// The warp's mma grid on fragment buffer `buf`.
fn mma_slice(c: &Config, buf: usize, mma: &str) -> Vec<Stmt> {
    let (frag_m, frag_n) = (c.wm() / 16, c.wn() / 8);
    let (a_frag, b_frag) = (format!("a_frag{buf}"), format!("b_frag{buf}"));
    unrolled_over("i", frag_m, |i| {
        unrolled_over("j", frag_n, |j| {
            let tile = add(mul(i.clone(), int(frag_n as i64)), j.clone());
            let mut args: Vec<Expr> = (0..4)
                .map(|q| load_as("acc", Ty::F32, add(mul(tile.clone(), int(4)), int(q))))
                .collect();
            args.extend(
                (0..4).map(|q| load_as(&a_frag, Ty::U32, add(mul(i.clone(), int(4)), int(q)))),
            );
            args.extend(
                (0..2).map(|q| load_as(&b_frag, Ty::U32, add(mul(j.clone(), int(2)), int(q)))),
            );
            vec![Stmt::Call(mma.into(), args)]
        })
    })
}

/// One k-tile `kt` of the main loop, its slice `s` using fragment buffer
/// `(first_slice + s) % 2`. Each slice loads the next slice's fragments
/// (past the last, the next tile's first, after waiting for that tile and a
/// barrier) and then issues its own mma, so `ldmatrix` latency hides behind
/// tensor-core work. The first slice also issues the copy of tile
/// `kt + stages - 1` into the stage tile `kt - 1` used, which the previous
/// step's barrier freed. Element-path loads are stored to shared memory one
/// step later (the tile is first read `stages - 2` steps after that), or
/// before the barrier with 2 stages.
#[allow(clippy::too_many_arguments)]
fn main_step(
    l: &mut Lower,
    p: &Problem,
    c: &Config,
    a: &TileLayout,
    b: &TileLayout,
    kt: Expr,
    first_slice: usize,
    mma: &str,
) -> Result<Vec<Stmt>> {
    let kt_count = c.k_tiles(p) as i64;
    let slices = c.tk / 16;
    let frag_blocks = [(a, c.wm() / 16), (b, c.wn() / 16)];
    let ahead = (c.stages - 1) as i64;
    let mut out = vec![let_int("fetch", add(kt.clone(), int(ahead)))];
    let mut issue = Vec::new();
    let mut deferred = Vec::new();
    for (t, op) in [(a, &p.a), (b, &p.b)] {
        let copy = copy_tile(
            l,
            t,
            op,
            p,
            c,
            var("fetch"),
            rem(var("fetch"), c.stages as i64),
        )?;
        if op.strided.is_some() {
            issue.push(copy.wtile.clone());
        }
        issue.extend(copy.issue);
        if !copy.deferred.is_empty() {
            // The stage of the tile being stored (fetched a step earlier with 3+ stages).
            let stored = if c.stages > 2 {
                bin(BinOp::Sub, var("fetch"), int(1))
            } else {
                var("fetch")
            };
            deferred.push(let_u32(
                &t.name("wtile"),
                add(
                    add(var("smem"), int(t.base as i64)),
                    mul(rem(stored, c.stages as i64), int(t.stage_bytes as i64)),
                ),
            ));
            deferred.extend(copy.deferred);
        }
    }
    let fetching = lt(var("fetch"), int(kt_count));
    if c.stages > 2 && !deferred.is_empty() {
        out.push(Stmt::Comment(
            "element path: the loads of the previous step (tile fetch - 1) to shared memory".into(),
        ));
        out.push(Stmt::If(
            and(
                bin(BinOp::Ge, kt.clone(), int(1)),
                lt(bin(BinOp::Sub, var("fetch"), int(1)), int(kt_count)),
            ),
            deferred.clone(),
        ));
    }
    if slices > 1 {
        for (t, _) in frag_blocks {
            out.push(tile_address(t, "tile", kt.clone(), c));
        }
    }
    for s in 0..slices {
        let (cur, next) = ((first_slice + s) % 2, (first_slice + s + 1) % 2);
        out.push(Stmt::Comment(if s + 1 < slices {
            format!(
                "k slice {s} (fragments in buffer {cur}); slice {} into buffer {next}",
                s + 1
            )
        } else {
            format!(
                "k slice {s} (fragments in buffer {cur}); tile kt + 1's slice 0 into buffer {next}"
            )
        }));
        if s + 1 < slices {
            for (t, blocks) in frag_blocks {
                out.extend(load_fragments(t, "tile", blocks, s + 1, next));
            }
        }
        if s == 0 {
            out.push(Stmt::If(fetching.clone(), issue.clone()));
            out.push(Stmt::Call("dcir_cp_async_commit".into(), vec![]));
        }
        if s + 1 == slices {
            if c.stages == 2 && !deferred.is_empty() {
                out.push(Stmt::If(fetching.clone(), deferred.clone()));
            }
            out.push(Stmt::Comment(
                "tile kt + 1 has landed; after the barrier no thread reads tile kt's stage again"
                    .into(),
            ));
            out.push(Stmt::Call(
                format!("dcir_cp_async_wait<{}>", c.stages - 2),
                vec![],
            ));
            out.push(Stmt::Barrier);
            for (t, blocks) in frag_blocks {
                out.push(tile_address(t, "next", add(kt.clone(), int(1)), c));
                out.extend(load_fragments(t, "next", blocks, 0, next));
            }
        }
        out.extend(mma_slice(c, cur, mma));
    }
    Ok(out)
}

/// Lowers a tensor-core `gemm` group: its matmul as a [`Problem`] whose
/// operands read through the prologue views, its tail as the epilogue.
pub(super) fn gemm(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    reserve_names(l);
    let params = params(l, op);
    let region = g.op(op).region.expect("a fused op has a region");
    let matmuls: Vec<OpId> = g
        .block(region)
        .ops
        .iter()
        .copied()
        .filter(|&o| g.op(o).kind == OpKind::Matmul)
        .collect();
    let [mm_op] = matmuls[..] else {
        return Err(l.unsupported(Reason::Count {
            what: "matmuls",
            found: matmuls.len(),
        }));
    };
    let mm_data = g.op(mm_op);
    let (a, b) = (mm_data.operands[0], mm_data.operands[1]);
    let mm = mm_data.results[0];
    let flag = |name: &str| {
        matches!(mm_data.attrs.get(name), Some(Attr::Bool(true)))
            || mm_data.attrs.get(name).and_then(Attr::as_int) == Some(1)
    };
    let (ta, tb) = (flag("transpose_a"), flag("transpose_b"));
    check_prologue(l, a, "A")?;
    check_prologue(l, b, "B")?;
    let tainted = super::epilogue::derived(g, op, mm, &[]);
    super::epilogue::check(l, op, &tainted, &[], "the contraction", true)?;

    let out_dims = g.ty(mm).dims().to_vec();
    let rank = out_dims.len();
    if rank < 2 {
        return Err(l.unsupported("a matmul of rank < 2"));
    }
    let (m, n) = (out_dims[rank - 2], out_dims[rank - 1]);
    let k = g.ty(a).dims()[if ta { rank - 2 } else { rank - 1 }];
    let batch_dims = out_dims[..rank - 2].to_vec();
    let batch: usize = batch_dims.iter().product();
    let largest = [m * n, m * k, k * n].into_iter().max().unwrap_or(0);
    if batch * largest >= i32::MAX as usize {
        return Err(l.unsupported(Reason::TooLarge));
    }
    if batch * m * n == 0 {
        return Err(l.unsupported(Reason::Empty));
    }
    let batch_coords = Index::linear(&batch_dims, var("bz")).get_coords();
    // A is [.., M, K] ([.., K, M] with transpose_a); B is [.., K, N] ([.., N, K] with transpose_b).
    let problem = Problem {
        batch,
        m,
        n,
        k,
        dtype: g.ty(a).dtype,
        a: matmul_operand(l, a, !ta, m, &batch_coords),
        b: matmul_operand(l, b, tb, n, &batch_coords),
        conv: None,
    };
    let what = format!(
        "gemm ({}, tensor cores): {batch} x [{m} x {k}]{} @ [{k} x {n}]{}",
        problem.dtype.name(),
        if ta { "^T" } else { "" },
        if tb { "^T" } else { "" },
    );
    let out_at = |row: Expr, col: Expr| {
        let mut coords = batch_coords.clone();
        coords.extend([row, col]);
        coords
    };
    lower_problem(
        l,
        op,
        params,
        &problem,
        (mm, &tainted),
        (&out_at, Some(rank - 1)),
        what,
    )
}

/// Lowers a tensor-core `conv` group (`algorithm = "implicit_gemm"`): the
/// implicit GEMM of [`super::gemm::ConvGeometry`] as a [`Problem`], channel groups as
/// batch entries. A is the im2col view of the input, read through the index
/// maps (zero outside the padded image), or by `cp.async` for a 1×1
/// stride-1 unpadded conv of one image whose `H·W` is a multiple of 8
/// (`A(pixel, c) = x[c·H·W + pixel]`); B is the weight as `[O, C/g·KH·KW]`,
/// by `cp.async` when `K` is a multiple of 8. The group's tail (batchnorm
/// included) is the epilogue, at the output pixel's NCHW coordinates.
pub(super) fn conv(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    reserve_names(l);
    // The im2col element's locals (see `ConvGeometry::a_at`).
    for name in ["a_img", "a_ch", "a_ih", "a_iw", "a_x"] {
        l.used_names.insert(name.into());
    }
    let params = params(l, op);
    let c = Contraction::of_conv(l, op)?;
    let derived = c.check(l, op)?;
    let Geometry::Conv(geo) = &c.geometry else {
        unreachable!("of_conv describes a conv");
    };
    let (x, w) = (c.a.value, c.b.value);
    let input_param = |v: ValueId| match g.value(v).def {
        ValueDef::BlockArg { .. } => l.inputs.get(&v).cloned(),
        ValueDef::OpResult { .. } => None,
    };
    let bz = if geo.groups == 1 { int(0) } else { var("bz") };
    let pixels = geo.input[2] * geo.input[3];
    let a_strided = (geo.is_pointwise() && geo.input[0] == 1 && pixels.is_multiple_of(CHUNK))
        .then(|| input_param(x))
        .flatten()
        .map(|param| Strided {
            param,
            offset: mul(bz.clone(), int((geo.weight[1] * pixels) as i64)),
            r: Modes::single(c.m, 1),
            k: Modes::single(c.k, pixels as i64),
            base: 0,
            batch_stride: Some((geo.weight[1] * pixels) as i64),
        });
    let a_pixels = if a_strided.is_none() {
        input_param(x).map(|param| PixelMapped {
            param,
            geo: geo.clone(),
            group: bz.clone(),
            tap_major: PixelMapped::tap_major_fits(geo),
        })
    } else {
        None
    };
    let tap_major = a_pixels.as_ref().is_some_and(|px| px.tap_major);
    // A tap-major k is strided in the weight: B goes through the index maps.
    let b_strided = (c.k.is_multiple_of(CHUNK) && !tap_major)
        .then(|| input_param(w))
        .flatten()
        .map(|param| Strided {
            param,
            offset: mul(bz.clone(), int((c.n * c.k) as i64)),
            r: Modes::single(c.n, c.k as i64),
            k: Modes::single(c.k, 1),
            base: 0,
            batch_stride: Some((c.n * c.k) as i64),
        });
    let (a_bz, b_bz, a_geo, w_dims) =
        (bz.clone(), bz.clone(), geo.clone(), g.ty(w).dims().to_vec());
    let views = ConvViews::of(l, geo, x, w);
    let problem = Problem {
        conv: Some(views),
        batch: c.batch,
        m: c.m,
        n: c.n,
        k: c.k,
        dtype: g.ty(x).dtype,
        // Consecutive pixels are adjacent in NCHW: the tile keeps rows contiguous.
        a: Operand {
            rows: c.m,
            pixels: a_pixels,
            strided: a_strided,
            k_inner: false,
            element: Box::new(move |l: &mut Lower, m: Expr, k: Expr| {
                let e = a_geo.a_at("a", &a_bz, m, k);
                for (name, value) in e.lets {
                    l.body.push(let_int(&name, value));
                }
                let Some(inside) = e.inside.into_iter().reduce(and) else {
                    return l.value_at(x, &e.index);
                };
                // Loaded only inside the image: the index is out of bounds in the padding.
                l.body.push(Stmt::Let {
                    name: "a_x".into(),
                    ty: Ty::F32,
                    value: Expr::F32(0.0),
                    constant: false,
                });
                let load = l.scoped(|l| {
                    let v = l.value_at(x, &e.index)?;
                    l.body.push(Stmt::Assign("a_x".into(), v));
                    Ok(())
                })?;
                l.body.push(Stmt::If(inside, load));
                Ok(var("a_x"))
            }),
        },
        b: Operand {
            rows: c.n,
            strided: b_strided,
            k_inner: true,
            pixels: None,
            element: Box::new(move |l: &mut Lower, n: Expr, k: Expr| {
                let linear = if tap_major {
                    geo.b_at_tap_major(&b_bz, k, n)
                } else {
                    geo.b_at(&b_bz, k, n)
                };
                l.value_at(w, &Index::linear(&w_dims, linear))
            }),
        },
    };
    let what = format!(
        "conv implicit gemm ({}, tensor cores): {}",
        problem.dtype.name(),
        geo.describe(&c)
    );
    let out_at = |m: Expr, n: Expr| geo.out_at(&bz, m, n);
    // The output channel (`out_at`'s second coordinate) is the column.
    lower_problem(
        l,
        op,
        params,
        &problem,
        (c.result, &derived),
        (&out_at, Some(1)),
        what,
    )
}

/// The kernel of `problem` for group `op`, blocked by the group's `tile`,
/// `threads` and `stages` ([`Config::new`]; `[128, 128, 32]`, 256, 3 when
/// absent). Its epilogue binds the contraction `result` to the accumulator
/// and stores every output of the group through the tail (`derived`: the
/// values computed from `result`), `out_at(row, col)` being the coordinates
/// of the accumulator's element in `result`. `what` opens the summary.
fn lower_problem(
    l: &mut Lower,
    op: OpId,
    params: Vec<Param>,
    problem: &Problem,
    (result, derived): (ValueId, &BTreeSet<ValueId>),
    (out_at, col_axis): (&dyn Fn(Expr, Expr) -> Vec<Expr>, Option<usize>),
    what: String,
) -> Result<Kernel> {
    let g = l.g;
    let tile = match g.op(op).attrs.get("tile") {
        None => [128, 128, 32],
        Some(attr) => match attr.as_ints() {
            Some(&[tm, tn, tk]) => [tm, tn, tk],
            _ => {
                return Err(l.unsupported(Reason::Parameters(format!(
                    "tile = {} (a GEMM tile is [tm, tn, tk])",
                    dcir_ir::print::format_attr(attr)
                ))));
            }
        },
    };
    let cfg = Config::new(
        tile,
        attr_int(g, op, "threads", 256),
        attr_int(g, op, "stages", 3),
        problem.a.strided.is_none() || problem.b.strided.is_none(),
    );
    // A tap-major k-tile must not straddle two taps.
    let cfg = match &problem.a.pixels {
        Some(px) if px.tap_major => cfg.with_tk_dividing(px.geo.weight[1]),
        _ => cfg,
    }
    .with_splits(attr_int(g, op, "split_k", 1), problem);
    let output_params: Vec<Param> = params.iter().filter(|p| p.output).cloned().collect();
    let outputs: Vec<&Param> = output_params.iter().collect();
    let ys = yields(g, op);
    let results = g.op(op).results.clone();
    let epilogue = |l: &mut Lower, row: Expr, col: Expr, accs: &[Expr]| -> Result<()> {
        if let [acc] = accs {
            l.reduced = Some((result, Reduced::Row(acc.clone()), 0));
            let coords = out_at(row, col);
            return store_results(l, derived, result, &coords, &outputs, &ys, &results);
        }
        let lanes: Vec<(Vec<Expr>, Expr)> = accs
            .iter()
            .enumerate()
            .map(|(j, acc)| {
                (
                    out_at(row.clone(), add(col.clone(), int(j as i64))),
                    acc.clone(),
                )
            })
            .collect();
        // The lanes start at a multiple of their count (EpilogueFn).
        store_result_vectors(
            l,
            derived,
            result,
            "vidx",
            Some(&col),
            &lanes,
            &outputs,
            &ys,
            &results,
        )
    };
    // Columns one store of the Hopper epilogue may take: 16 bytes of 16-bit
    // results where every result keeps them together.
    let columns = col_axis
        .filter(|&axis| {
            problem.n.is_multiple_of(VECTOR_COLUMNS)
                && ys.iter().zip(&results).all(|(&y, &r)| {
                    matches!(g.ty(r).dtype, DType::F16 | DType::BF16)
                        && lanes_stay_together(
                            g,
                            derived,
                            (result, Lanes::Along(axis)),
                            y,
                            VECTOR_COLUMNS,
                        )
                })
        })
        .map_or(1, |_| VECTOR_COLUMNS);
    // The Hopper mainloop where asked and the problem allows, else this one,
    // saying why.
    let mut not_honoured = String::new();
    if super::gemm_wgmma::asked(g, op) {
        match super::gemm_wgmma::lower(
            l,
            op,
            params.clone(),
            problem,
            tile,
            (&epilogue, columns),
            what.clone(),
        ) {
            Ok(kernel) => return Ok(kernel),
            Err(EmitError::Unsupported { reason, .. }) => {
                not_honoured = format!("; mainloop = \"wgmma\" not honoured: {reason}");
            }
        }
    }
    let body = emit(l, problem, &cfg, &epilogue)?;
    let split = cfg.split_k(problem);
    let mut params = params;
    let scratch = split.scratch(&mut params, cfg.wm() * cfg.wn() / 32, cfg.threads());
    let path = |o: &Operand| {
        if o.strided.is_some() {
            "cp.async"
        } else if let Some(px) = &o.pixels {
            if px.tap_major {
                "pixels (k tap-major)"
            } else {
                "pixels"
            }
        } else {
            "index maps"
        }
    };
    // A plan the blocking rules adapted (module doc of `Config::new`) is
    // named beside what runs.
    let planned_stages = attr_int(g, op, "stages", 3);
    let adapted = if [cfg.tm, cfg.tn, cfg.tk].map(|x| x as i64) != tile
        || cfg.stages as i64 != planned_stages
    {
        format!(
            " (planned tile [{}, {}, {}], {planned_stages} stage{})",
            tile[0],
            tile[1],
            tile[2],
            if planned_stages == 1 { "" } else { "s" }
        )
    } else {
        String::new()
    };
    let summary = format!(
        "{what}, tile [{}, {}, {}]{adapted}, {}x{} warps of {}x{}, {} stages{}; A by {}, B by {}{not_honoured}",
        cfg.tm,
        cfg.tn,
        cfg.tk,
        cfg.warps_m,
        cfg.warps_n,
        cfg.wm(),
        cfg.wn(),
        cfg.stages,
        if split.is_split() {
            format!(", split-K {}", split.splits)
        } else {
            String::new()
        },
        path(&problem.a),
        path(&problem.b),
    );
    let mut adapted = adapted_blocking(
        g,
        op,
        [cfg.tm, cfg.tn, cfg.tk],
        cfg.stages,
        Some(cfg.threads()),
    );
    adapted.extend(
        not_honoured
            .strip_prefix("; ")
            .map(|why| format!("{why} (runs on mma.sync)")),
    );
    Ok(Kernel {
        dynamic_shared: cfg.shared_bytes(),
        min_blocks_per_sm: super::gemm::occupancy_promise(cfg.min_blocks_per_sm(), split.blocks()),
        scratch,
        adapted,
        ..l.kernel(op, summary, params, body, [cfg.threads(), split.blocks()])
    })
}

/// The planned `tile`, `stages` and `threads` of group `op` that a
/// tensor-core blocking does not run as written (`Kernel::adapted`): it runs
/// `tile`, `stages` and (where the family takes them from the plan)
/// `threads`.
pub(super) fn adapted_blocking(
    g: &Graph,
    op: OpId,
    tile: [usize; 3],
    stages: usize,
    threads: Option<usize>,
) -> Vec<String> {
    let attrs = &g.op(op).attrs;
    let mut adapted = Vec::new();
    if let Some(planned) = attrs.ints("tile")
        && planned.iter().map(|&x| x as usize).ne(tile)
    {
        adapted.push(format!("tile = {planned:?} runs as {tile:?}"));
    }
    for (name, runs) in [("stages", Some(stages)), ("threads", threads)] {
        if let (Some(planned), Some(runs)) = (attrs.get(name).and_then(Attr::as_int), runs)
            && planned as usize != runs
        {
            adapted.push(format!("{name} = {planned} runs as {runs}"));
        }
    }
    adapted
}

/// Operand `v` of the matmul (`rows` × k per batch entry; its dim `rank - 2`
/// is r when `r_first`, else k), read through its views.
pub(super) fn matmul_operand<'a>(
    l: &Lower,
    v: ValueId,
    r_first: bool,
    rows: usize,
    batch_coords: &[Expr],
) -> Operand<'a> {
    let dims = l.g.ty(v).dims().to_vec();
    let rank = dims.len();
    let (r_dim, k_dim) = if r_first {
        (rank - 2, rank - 1)
    } else {
        (rank - 1, rank - 2)
    };
    let view = strided_view(l, v).map(|(param, mut modes, offset)| {
        // A dim of extent 1 is only ever read at 0.
        for (m, &d) in modes.iter_mut().zip(&dims) {
            if d == 1 {
                *m = Modes::single(1, 0);
            }
        }
        (param, modes, offset)
    });
    let k_inner = match &view {
        Some((_, m, _)) if m[k_dim].unit_inner() => true,
        Some((_, m, _)) if m[r_dim].unit_inner() => false,
        _ => k_dim == rank - 1,
    };
    let strided = view.and_then(|(param, mut m, offset)| {
        let aligned = offset % 8 == 0 && m[..rank - 2].iter().all(|x| x.strides_multiple_of(8));
        let contiguous = if k_inner {
            m[k_dim].chunked() && m[r_dim].strides_multiple_of(8)
        } else {
            m[r_dim].chunked() && m[k_dim].strides_multiple_of(8)
        };
        (aligned && contiguous).then(|| {
            let last = m.pop().expect("rank 2 or more");
            let second_last = m.pop().expect("rank 2 or more");
            let (r, k) = if r_first {
                (second_last, last)
            } else {
                (last, second_last)
            };
            Strided {
                param,
                offset: batch_coords
                    .iter()
                    .zip(&m)
                    .fold(int(offset), |acc, (c, modes)| add(acc, modes.at(c.clone()))),
                r,
                k,
                base: offset,
                batch_stride: linear_batch(&m),
            }
        })
    });
    let batch_coords = batch_coords.to_vec();
    Operand {
        rows,
        strided,
        k_inner,
        pixels: None,
        element: Box::new(move |l: &mut Lower, r: Expr, kk: Expr| {
            let mut c = batch_coords.clone();
            c.extend(if r_first { [r, kk] } else { [kk, r] });
            l.value_at(v, &Index::coords(&dims, c))
        }),
    }
}

/// The one stride that steps a batch entry through the batch dims' `modes`
/// (outermost first), if there is one (0 when they are all broadcast or of
/// extent 1).
fn linear_batch(modes: &[Modes]) -> Option<i64> {
    let all: Vec<(usize, i64)> = modes.iter().flat_map(|m| m.0.iter().copied()).collect();
    match Modes(all).coalesced().0.as_slice() {
        [(_, stride)] => Some(*stride),
        _ => None,
    }
}

/// Row-major strides of `dims`.
fn row_major(dims: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1] as i64;
    }
    strides
}

/// `dims` split off the front of `modes` (outermost first), splitting a
/// mode where a dim ends inside it; `None` when a dim ends at no divisor.
fn split_modes(mut modes: Vec<(usize, i64)>, dims: &[usize]) -> Option<Vec<Modes>> {
    modes.retain(|&(e, _)| e != 1);
    modes.reverse(); // popped from the back: the outermost first
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        let mut need = d;
        let mut dim = Vec::new();
        while need > 1 {
            let (e, s) = modes.pop()?;
            if e <= need {
                if !need.is_multiple_of(e) {
                    return None;
                }
                dim.push((e, s));
                need /= e;
            } else {
                if !e.is_multiple_of(need) {
                    return None;
                }
                // The dim takes the mode's outer `need` indices.
                dim.push((need, s * (e / need) as i64));
                modes.push((e / need, s));
                need = 1;
            }
        }
        out.push(Modes(dim).coalesced());
    }
    modes.is_empty().then_some(out)
}

/// `v` as `param[offset + Σ_d at_d(coord_d)]` with each dim's [`Modes`],
/// when its views (transpose, broadcast, slice, reshape) allow.
fn strided_view(l: &Lower, v: ValueId) -> Option<(String, Vec<Modes>, i64)> {
    let g = l.g;
    let dims = g.ty(v).dims().to_vec();
    let ValueDef::OpResult { op, .. } = g.value(v).def else {
        let modes = dims
            .iter()
            .zip(row_major(&dims))
            .map(|(&d, s)| Modes::single(d, s))
            .collect();
        return Some((l.inputs.get(&v)?.clone(), modes, 0));
    };
    let data = g.op(op);
    let src = *data.operands.first()?;
    let (param, m, offset) = strided_view(l, src)?;
    let src_dims = g.ty(src).dims().to_vec();
    let ints = |name: &str| data.attrs.get(name).and_then(Attr::as_ints);
    match data.kind {
        OpKind::Transpose => {
            let perm = ints("perm")?;
            Some((
                param,
                perm.iter().map(|&p| m[p as usize].clone()).collect(),
                offset,
            ))
        }
        OpKind::Broadcast => {
            let mut out: Vec<Modes> = dims.iter().map(|&d| Modes::single(d, 0)).collect();
            for (j, &d) in ints("dims")?.iter().enumerate() {
                if src_dims[j] != 1 {
                    out[d as usize] = m[j].clone();
                }
            }
            Some((param, out, offset))
        }
        OpKind::Slice => {
            let starts = ints("starts")?;
            let steps = ints("steps").unwrap_or(&[]);
            let mut offset = offset;
            let mut out = m.clone();
            for d in 0..m.len() {
                let step = steps.get(d).copied().unwrap_or(1);
                if starts[d] < 0 || step < 1 {
                    return None;
                }
                if starts[d] == 0 && step == 1 && dims[d] == src_dims[d] {
                    continue;
                }
                // Only a dim of one mode is sliced.
                let s = m[d].stride()?;
                offset += starts[d] * s;
                out[d] = Modes::single(dims[d], s * step);
            }
            Some((param, out, offset))
        }
        OpKind::Reshape => {
            let flat = m.into_iter().flat_map(|d| d.0).collect();
            Some((param, split_modes(flat, &dims)?, offset))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emit_module_source;

    #[test]
    fn config_honours_valid_blockings_and_falls_back() {
        let c = Config::new([128, 256, 32], 256, 3, false);
        assert_eq!(
            (c.tm, c.tn, c.tk, c.warps_m, c.warps_n, c.stages),
            (128, 256, 32, 2, 4, 3)
        );
        assert_eq!((c.wm(), c.wn()), (64, 64));
        // The planner's small tiles: 8 warps of 32x16; one stage runs as two.
        let c = Config::new([64, 64, 16], 256, 1, false);
        assert_eq!(
            (c.warps_m, c.warps_n, c.wm(), c.wn(), c.stages),
            (2, 4, 32, 16, 2)
        );
        // 256x256 needs 256 accumulators a thread with 8 warps: tm halves.
        let c = Config::new([256, 256, 64], 256, 4, false);
        assert_eq!(
            (c.tm, c.tn, c.wm(), c.wn(), c.stages),
            (128, 256, 64, 64, 4)
        );
        // Extents round up to powers of two, tk to at least 16; too many
        // warps for the tile: fewer.
        let c = Config::new([16, 24, 8], 256, 2, false);
        assert_eq!((c.tm, c.tn, c.tk, c.threads()), (16, 32, 16, 64));
        // Too few: more, up to 8.
        let c = Config::new([128, 128, 32], 32, 3, false);
        assert_eq!((c.threads(), c.wm() * c.wn() / 32), (128, 128));
        // Shared memory past 227 KiB: fewer stages.
        let c = Config::new([128, 256, 64], 256, 4, false);
        assert_eq!(c.stages, 4);
        assert!(c.shared_bytes() <= MAX_SHARED);
        // An element-path operand: warp tiles of at most 64 accumulators.
        let c = Config::new([128, 256, 64], 256, 4, true);
        assert_eq!((c.tm, c.tn, c.tk, c.wm(), c.wn()), (128, 128, 64, 64, 32));
        // ... and at most 8 chunks of a k-tile to copy per thread.
        let c = Config::new([32, 64, 64], 32, 3, true);
        assert_eq!((c.tm, c.tn, c.tk, c.threads()), (32, 64, 16, 32));
    }

    /// The 8 rows one `ldmatrix` matrix reads (8 consecutive stored rows
    /// from a multiple of 8, one logical chunk) and the 8 chunks a quarter
    /// warp copies (8 consecutive chunks in row-major order) each hit 8
    /// distinct 16-byte bank groups.
    #[test]
    fn swizzle_is_conflict_free() {
        for row_chunks in [2usize, 4, 8, 16, 32] {
            let (per_line, values) = swizzle_shape(row_chunks);
            let group = |row: usize, chunk: usize| {
                let sw = (row / per_line) % values;
                (row * row_chunks + (chunk ^ sw)) % 8
            };
            for row0 in (0..64).step_by(8) {
                for chunk in 0..row_chunks {
                    let mut groups: Vec<usize> =
                        (row0..row0 + 8).map(|r| group(r, chunk)).collect();
                    groups.sort_unstable();
                    groups.dedup();
                    assert_eq!(
                        groups.len(),
                        8,
                        "{row_chunks} chunks a row, rows {row0}.., chunk {chunk}"
                    );
                }
            }
            for first in (0..64 * row_chunks).step_by(8) {
                let mut groups: Vec<usize> = (first..first + 8)
                    .map(|c| group(c / row_chunks, c % row_chunks))
                    .collect();
                groups.sort_unstable();
                groups.dedup();
                assert_eq!(
                    groups.len(),
                    8,
                    "{row_chunks} chunks a row, chunks {first}.."
                );
            }
        }
    }

    /// The CUDA source of `a @ b` as one gemm group.
    fn gemm_source(dtype: &str, a: &str, b: &str, out: &str, attrs: &str, math: &str) -> String {
        let body = format!("    %y.r = matmul %a.in, %b.in : {dtype}[{out}]");
        group_source(
            &format!("{dtype}[{a}]"),
            &format!("{dtype}[{b}]"),
            &format!("{dtype}[{out}]"),
            &format!("math = \"{math}\", {attrs}"),
            &body,
        )
    }

    /// The CUDA source of one fused group of `attrs` over the graph inputs
    /// `inputs` (name, type) whose `body` computes `%y.r` of type `result`.
    fn fused_source(inputs: &[(&str, &str)], result: &str, attrs: &str, body: &str) -> String {
        let params: Vec<String> = inputs.iter().map(|(n, t)| format!("%{n}: {t}")).collect();
        let args: Vec<String> = inputs
            .iter()
            .map(|(n, _)| format!("%{n}.in = %{n}"))
            .collect();
        let src = format!(
            "graph @g({}) -> ({result}) {{\n\
             \x20 %y = fused @g0({}) {{{attrs}}} : {result} {{\n\
             {body}\n\
             \x20   yield %y.r\n\
             \x20 }}\n\
             \x20 return %y\n\
             }}\n",
            params.join(", "),
            args.join(", ")
        );
        let module = dcir_reader::parse_module(&src).expect("parses");
        dcir_ir::verify_module(&module).expect("verifies");
        emit_module_source(&module).expect("lowers")
    }

    /// The CUDA source of one gemm group over `%a: a_ty`, `%b: b_ty` whose
    /// `body` computes `%y.r` of type `result`.
    fn group_source(a_ty: &str, b_ty: &str, result: &str, attrs: &str, body: &str) -> String {
        fused_source(
            &[("a", a_ty), ("b", b_ty)],
            result,
            &format!("kind = \"gemm\", level = \"register\", {attrs}"),
            body,
        )
    }

    /// The Hopper GEMM `[128, 768] · [768, 768]` whose result goes through
    /// `views` (lines ending in `%y.r` of type `result`).
    fn wgmma_through(result: &str, views: &str) -> String {
        group_source(
            "f16[128,768]",
            "f16[768,768]",
            result,
            "mainloop = \"wgmma\", math = \"tensor_core\", stages = 4, threads = 384, tile = [128, 128, 64]",
            &format!("    %mm = matmul %a.in, %b.in : f16[128,768]\n{views}"),
        )
    }

    #[test]
    fn wgmma_stores_vectors_where_the_views_keep_eight_columns_together() {
        let vectors = "stored 8 columns a thread";
        // Split into heads of 64 and the heads moved outward: 8 columns stay
        // consecutive in the result.
        let heads = wgmma_through(
            "f16[12,128,64]",
            "    %h = reshape %mm : f16[128,12,64]\n    %y.r = transpose %h {perm = [1, 0, 2]} : f16[12,128,64]",
        );
        assert!(heads.contains(vectors), "{heads}");
        // Rows of 4: a vector spans two rows of the result, still 16
        // consecutive bytes of it.
        let fours = wgmma_through("f16[128,192,4]", "    %y.r = reshape %mm : f16[128,192,4]");
        assert!(fours.contains(vectors), "{fours}");
        // Rows of 4 then moved: the run scattered.
        let scattered = wgmma_through(
            "f16[128,4,192]",
            "    %f = reshape %mm : f16[128,192,4]\n    %y.r = transpose %f {perm = [0, 2, 1]} : f16[128,4,192]",
        );
        assert!(scattered.contains("a row at a time"), "{scattered}");
        // The column moved off the innermost dim.
        let transposed = wgmma_through(
            "f16[768,128]",
            "    %y.r = transpose %mm {perm = [1, 0]} : f16[768,128]",
        );
        assert!(transposed.contains("a row at a time"), "{transposed}");
    }

    /// The Hopper GEMM `[rows, 768] · [768, 768]` with the tail `tail`
    /// (lines ending in `%y.r`; `%r.in` is a third input of the result's
    /// shape).
    fn wgmma_tail(rows: usize, tail: &str) -> String {
        let t = format!("f16[{rows},768]");
        fused_source(
            &[("a", &t), ("b", "f16[768,768]"), ("r", &t)],
            &t,
            "kind = \"gemm\", level = \"register\", mainloop = \"wgmma\", math = \"tensor_core\", stages = 4, threads = 384, tile = [128, 128, 64]",
            &format!("    %mm = matmul %a.in, %b.in : {t}\n{tail}"),
        )
    }

    #[test]
    fn wgmma_stores_a_tile_during_the_next_tiles_k_loop_where_that_pays() {
        let overlapped = "a pass of rows after each k step of the next tile";
        // 384 tiles over 132 blocks, a tail of math only: deferred.
        let math = wgmma_tail(8192, "    %y.r = tanh %mm : f16[8192,768]");
        assert!(math.contains(overlapped), "{math}");
        assert!(
            math.contains("role != 1 && (pending != 0 && kt < 8)"),
            "{math}"
        );
        assert!(
            math.contains("role == 1 && (pending != 0 && kt < 8)"),
            "{math}"
        );
        // A residual read row by row: every pass's loads in flight at once,
        // after the loop.
        let residual = wgmma_tail(8192, "    %y.r = add %mm, %r.in : f16[8192,768]");
        assert!(!residual.contains(overlapped), "{residual}");
        // One tile per block: nothing to overlap with.
        let one_wave = wgmma_tail(128, "    %y.r = tanh %mm : f16[128,768]");
        assert!(!one_wave.contains(overlapped), "{one_wave}");
    }

    #[test]
    fn wgmma_reads_a_bias_at_the_column_as_one_vector() {
        let bias = |n: usize| {
            fused_source(
                &[
                    ("a", "f16[8192,768]"),
                    ("b", "f16[768,768]"),
                    ("c", &format!("f16[{n}]")),
                ],
                "f16[8192,768]",
                "kind = \"gemm\", level = \"register\", mainloop = \"wgmma\", math = \"tensor_core\", stages = 4, threads = 384, tile = [128, 128, 64]",
                "    %mm = matmul %a.in, %b.in : f16[8192,768]\n    %cb = broadcast %c.in {dims = [1]} : f16[8192,768]\n    %y.r = add %mm, %cb : f16[8192,768]",
            )
        };
        // Eight columns from a multiple of 8: one 16-byte load of the bias.
        let per_column = bias(768);
        assert!(
            per_column.contains("reinterpret_cast<const uint4*>(c_in)[col / 8]"),
            "{per_column}"
        );
        assert!(!per_column.contains("c_in[col + 1]"), "{per_column}");
        // One element broadcast everywhere: no vector past its end.
        let scalar = bias(1);
        assert!(
            !scalar.contains("reinterpret_cast<const uint4*>(c_in)"),
            "{scalar}"
        );
    }

    #[test]
    fn aligned_operands_copy_with_cp_async() {
        let attrs = "stages = 3, threads = 256, tile = [128, 128, 32]";
        let s = gemm_source("f16", "256,64", "64,256", "256,256", attrs, "tensor_core");
        assert!(s.contains("A by cp.async, B by cp.async"), "{s}");
        assert!(
            s.contains("dcir_mma_f16(") && s.contains("dcir_cp_async_wait<1>()"),
            "{s}"
        );
        // A is k-contiguous (plain ldmatrix), B row-contiguous (transposed).
        assert!(
            s.contains("dcir_ldmatrix_x4(a_frag") && s.contains("dcir_ldmatrix_x4_trans(b_frag")
        );
        assert!(s.contains("dynamic shared 49152 bytes"), "{s}");
    }

    #[test]
    fn odd_sizes_read_through_index_maps_with_bounds() {
        let attrs = "stages = 2, threads = 128, tile = [64, 64, 16]";
        let s = gemm_source("bf16", "17,783", "783,33", "17,33", attrs, "tensor_core");
        assert!(s.contains("A by index maps, B by index maps"), "{s}");
        assert!(s.contains("dcir_mma_bf16("), "{s}");
        assert!(s.contains("if (a_r < 17 && a_k + 7 < 783)"), "{s}");
        assert!(s.contains("if (b_r + 7 < 33 && b_k < 783)"), "{s}");
        assert!(s.contains("if (row < 17 && col < 33)"), "{s}");
    }

    /// The CUDA source of one conv group `x * w` with conv attributes `attrs`.
    fn conv_source(dtype: &str, x: &str, w: &str, out: &str, attrs: &str) -> String {
        let out = format!("{dtype}[{out}]");
        fused_source(
            &[
                ("x", &format!("{dtype}[{x}]")),
                ("w", &format!("{dtype}[{w}]")),
            ],
            &out,
            "algorithm = \"implicit_gemm\", kind = \"conv\", level = \"register\", math = \"tensor_core\", stages = 3, threads = 128, tile = [64, 64, 32]",
            &format!("    %y.r = conv2d %x.in, %w.in {attrs} : {out}"),
        )
    }

    #[test]
    fn padded_convs_load_the_window_only_inside_the_image() {
        let s = conv_source(
            "f16",
            "2,3,17,17",
            "5,3,3,3",
            "2,5,17,17",
            "{pad = [1, 1, 1, 1]}",
        );
        assert!(s.contains("conv implicit gemm (f16, tensor cores)"), "{s}");
        // The input is a parameter: consecutive threads on consecutive
        // pixels; 3 channels a group keep k channel-major.
        assert!(
            s.contains("A by pixels, B by index maps") && !s.contains("a_tap"),
            "{s}"
        );
        // Pixels past M (578) get a window row no tap reaches.
        assert!(
            s.contains("const int a_pv0 = a_m0 < 578 ? a_ph0 : -16777216;"),
            "{s}"
        );
        // Each element: inside K and the image, else element 0 is read and zero kept.
        assert!(
            s.contains("const bool a_in0 = a_k0 < 27 && (a_pv0 + a_k0 / 3 % 3 >= 0 && a_pv0 + a_k0 / 3 % 3 < 17) && (a_pw0 + a_k0 % 3 >= 0 && a_pw0 + a_k0 % 3 < 17);"),
            "{s}"
        );
        assert!(s.contains("a_el[0] = a_in0 ? a_x0 : 0;"), "{s}");
        assert!(s.contains("dcir_st_shared2("), "{s}");
        assert!(s.contains("if (row < 578 && col < 5)"), "{s}");
    }

    #[test]
    fn taps_of_16_channel_groups_order_k_tap_major() {
        let s = conv_source(
            "f16",
            "2,32,17,17",
            "8,32,3,3",
            "2,8,17,17",
            "{pad = [1, 1, 1, 1]}",
        );
        assert!(
            s.contains("A by pixels (k tap-major), B by index maps"),
            "{s}"
        );
        // Per k-tile: the tap, its first channel, the window offset and one
        // bounds check per pixel ...
        assert!(s.contains("const int a_tap = kt * 32 / 32;"), "{s}");
        assert!(
            s.contains("const bool a_tin0 = a_pv0 + a_dr >= 0 && a_pv0 + a_dr < 17 && (a_pw0 + a_ds >= 0 && a_pw0 + a_ds < 17);"),
            "{s}"
        );
        assert!(
            s.contains("const int a_tb0 = a_tin0 ? a_pb0 + a_c0 * 289 + (a_dr * 17 + a_ds) : 0;"),
            "{s}"
        );
        // ... then per element a channel plane further.
        assert!(
            s.contains("a_el[1] = a_tin0 ? x_in[a_tb0 + (a_kr + 2) * 289] : 0;"),
            "{s}"
        );
        // B(k, n) = w[n, k % 32, tap]: k's channel and tap.
        assert!(
            s.contains("w_in[(b_r * 32 + b_k % 32) * 9 + b_k / 32]"),
            "{s}"
        );
    }

    #[test]
    fn a_conv_input_behind_a_view_goes_through_the_index_maps() {
        // A transposed view of the input: not a parameter read as such.
        let src = "graph @g(%x: f16[2,3,17,17], %w: f16[5,3,3,3]) -> (f16[2,5,17,17]) {\n\
             \x20 %y = fused @g0(%x.in = %x, %w.in = %w) {algorithm = \"implicit_gemm\", kind = \"conv\", level = \"register\", math = \"tensor_core\", stages = 2, threads = 128, tile = [64, 64, 32]} : f16[2,5,17,17] {\n\
             \x20   %r = transpose %x.in {perm = [0, 1, 3, 2]} : f16[2,3,17,17]\n\
             \x20   %y.r = conv2d %r, %w.in {pad = [1, 1, 1, 1]} : f16[2,5,17,17]\n\
             \x20   yield %y.r\n\
             \x20 }\n\
             \x20 return %y\n\
             }\n";
        let module = dcir_reader::parse_module(src).expect("parses");
        let s = emit_module_source(&module).expect("lowers");
        assert!(s.contains("A by index maps, B by index maps"), "{s}");
        assert!(
            s.contains("if (a_ih >= 0 && a_ih < 17 && a_iw >= 0 && a_iw < 17) {"),
            "{s}"
        );
    }

    #[test]
    fn pointwise_convs_of_one_image_copy_with_cp_async() {
        let s = conv_source("bf16", "1,64,8,8", "32,64,1,1", "1,32,8,8", "");
        assert!(s.contains("A by cp.async, B by cp.async"), "{s}");
        // Two images: the pixels of A are no longer one strided run.
        let s = conv_source("bf16", "2,64,8,8", "32,64,1,1", "2,32,8,8", "");
        assert!(s.contains("A by pixels, B by cp.async"), "{s}");
    }

    #[test]
    fn fma_groups_keep_the_simt_kernel() {
        let attrs = "stages = 1, threads = 256, tile = [64, 64, 8]";
        let s = gemm_source("f16", "64,64", "64,64", "64,64", attrs, "fma");
        assert!(!s.contains("tensor cores") && s.contains("fma"), "{s}");
    }

    /// The offset [`Modes`] give index `i`, as `Modes::at` emits it.
    fn offset_of(m: &Modes, mut i: usize) -> i64 {
        let mut off = 0;
        for &(e, st) in m.0.iter().rev() {
            off += (i % e) as i64 * st;
            i /= e;
        }
        off
    }

    /// A transpose then a reshape, split into modes, reads every element
    /// where the two views put it (brute force over the index space).
    #[test]
    fn modes_follow_a_reshape_of_a_transpose() {
        let cases: [(&[usize], &[usize], &[usize]); 5] = [
            // ViT's attention input: [B, S, E] → [S, B, E] → [S·B, E].
            (&[4, 6, 8], &[1, 0, 2], &[24, 8]),
            (&[4, 6, 8], &[0, 2, 1], &[4, 48]),
            (&[2, 3, 4, 8], &[0, 2, 1, 3], &[2, 12, 8]),
            (&[6, 4], &[1, 0], &[2, 2, 6]),
            (&[2, 3, 4], &[2, 1, 0], &[4, 6]),
        ];
        for (src, perm, dims) in cases {
            let strides = row_major(src);
            let t_dims: Vec<usize> = perm.iter().map(|&p| src[p]).collect();
            let flat = perm
                .iter()
                .map(|&p| (src[p], strides[p]))
                .collect::<Vec<_>>();
            let modes = split_modes(flat, dims).expect("splits");
            let total: usize = dims.iter().product();
            for linear in 0..total {
                // The element's coordinates in the reshaped view, then the
                // transposed view's, then the source's offset.
                let mut rest = linear;
                let mut coords = vec![0; dims.len()];
                for d in (0..dims.len()).rev() {
                    coords[d] = rest % dims[d];
                    rest /= dims[d];
                }
                let mut rest = linear;
                let mut want = 0i64;
                for d in (0..t_dims.len()).rev() {
                    want += (rest % t_dims[d]) as i64 * strides[perm[d]];
                    rest /= t_dims[d];
                }
                let got: i64 = coords
                    .iter()
                    .zip(&modes)
                    .map(|(&c, m)| offset_of(m, c))
                    .sum();
                assert_eq!(
                    got, want,
                    "{src:?} {perm:?} {dims:?} at {coords:?}: {modes:?}"
                );
            }
        }
        // Chunks of 8 stay contiguous and aligned inside heads of 64 (BERT's
        // context read back as [tokens, 768]), not inside 4-wide ones or
        // behind a stride of 12.
        assert!(Modes(vec![(12, 8192), (64, 1)]).chunked());
        assert!(!Modes(vec![(12, 8192), (4, 1)]).chunked());
        assert!(!Modes(vec![(3, 12), (8, 1)]).chunked());
        // A dim that ends inside no divisor of a mode is no strided view.
        assert_eq!(split_modes(vec![(6, 1)], &[4]), None);
        assert_eq!(
            split_modes(vec![(4, 6), (6, 1)], &[24]).unwrap(),
            vec![Modes::single(24, 1)]
        );
    }

    /// An A operand that is a reshape of a transpose (rows gathered, k
    /// contiguous) is copied with `cp.async`, each chunk's row through the modes.
    #[test]
    fn a_reshaped_transpose_copies_with_cp_async() {
        let src = "graph @g(%x: f16[32,16,64], %w: f16[64,128]) -> (f16[512,128]) {\n\
                   \x20 %t = transpose %x {perm = [1, 0, 2]} : f16[16,32,64]\n\
                   \x20 %a = reshape %t : f16[512,64]\n\
                   \x20 %y = matmul %a, %w : f16[512,128]\n\
                   \x20 return %y\n}\n";
        let module = dcir_reader::parse_module(src).unwrap();
        let g = &module.graphs[0];
        let model = dcir_fusion::CostModel::kernels_only(dcir_fusion::DeviceSpec::h100());
        let plan = dcir_fusion::plan_graph(g, &model, &crate::CudaTarget).unwrap();
        let fused = dcir_fusion::apply_plan(g, &plan).unwrap();
        let mut m = dcir_ir::Module::new();
        m.graphs.push(fused);
        let s = emit_module_source(&m).unwrap();
        assert!(s.contains("A by cp.async, B by cp.async"), "{s}");
        assert!(
            s.contains("/ 32 * 64 + ") && s.contains("% 32 * 1024"),
            "{s}"
        );
    }
}
