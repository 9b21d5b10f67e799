//! The Hopper mainloop of the tensor-core contraction family (`mainloop =
//! "wgmma"`, sm_90a): the same [`Problem`] and epilogue as [`super::gemm_tc`],
//! with operand tiles brought in by the tensor memory accelerator (TMA) and
//! multiplied by `wgmma.mma_async`.
//!
//! Shape of the kernel:
//!
//! - **Warpgroups**: one producer and `tm / 64` consumers (128 threads
//!   each; `tm` 64, 128 or 192). The producer gives its registers up
//!   (`setmaxnreg.dec` to 40) and one of its threads issues every copy; each
//!   consumer takes what the block has left (`setmaxnreg.inc`: 232 for one
//!   or two consumers, 152 for three; [`HopperBlocking::registers`]) and
//!   owns 64 rows of the block tile, its `tn / 2` f32 accumulators per thread
//!   in registers.
//! - **Persistent grid**: [`PERSISTENT_BLOCKS`] blocks (or fewer tiles) walk
//!   the `batch × ⌈M/tm⌉ × ⌈N/tn⌉` output tiles in the order of
//!   [`super::gemm_tc`]'s block order; the producer runs ahead across tile
//!   boundaries, so the next tile's loads overlap a tile's epilogue.
//! - **Shared memory**: a ring of `stages` buffers, each an A tile (`tm × 64`)
//!   and a B tile (`tn × 64`) in 128-byte swizzled rows: a K-major operand
//!   (k contiguous in memory) as `rows × 64` (one TMA box), an M- or N-major
//!   one as `rows / 64` boxes of `64 (k) × 64 (rows)`. Two `mbarrier`s per
//!   stage: *full* (the producer's expected bytes, completed by the copies)
//!   and *empty* (one arrival per consumer once its `wgmma`s have read it).
//!   The base is aligned to 1024 bytes (the swizzle's repeat); the
//!   epilogue's staging tile (`tm × (tn + 8)` 16-bit elements) follows.
//! - **K loop**: step `it` (counted across tiles) uses stage `it % stages`
//!   at parity `(it / stages) % 2`; a consumer waits on *full*, issues four
//!   `m64nTNk16` (one per 16-wide k slice, descriptors advanced inside the
//!   swizzle row or by 16 k rows) and commits them as a group, then waits
//!   until one group is left in flight and arrives on the previous step's
//!   *empty* (the tensor cores never wait for the issue of the next step;
//!   after the loop, the last group and its stage); the producer waits on
//!   *empty* (parity flipped: a fresh barrier counts as released) before
//!   refilling a stage.
//! - **Edges**: TMA fills zeros outside the tensor, so M, N and K need not be
//!   multiples of the tile; the epilogue checks rows and columns.
//! - **Epilogue**: accumulator `4j + 2h + e` of thread `(warp, lane)` of a
//!   consumer is row `16·warp + lane/4 + 8h`, column `8j + 2(lane%4) + e` of
//!   its 64 rows (the `mma.sync` fragment layout). Stored from there, a warp
//!   would write 8 rows × 16 bytes per instruction; instead each consumer
//!   rounds its accumulators to the product's dtype into its rows of a
//!   staging tile in shared memory (padded rows, two columns a word; a named
//!   barrier per warpgroup before and after), then each warp walks every
//!   fourth row of them with its lanes on consecutive columns, each element
//!   through the group's elementwise tail as in [`super::gemm_tc`] and
//!   stored: a warp writes 64 contiguous bytes of one row, with no division
//!   in its indexing. Without a k split, where a block has several tiles
//!   and the tail reads no residual, those stores are deferred: a tile's
//!   staged results go out during the next tile's k loop, one pass of rows
//!   a step, the first consumer's after its `wgmma`s are issued and the
//!   others' before (a warpgroup is held at issue while the tensor cores
//!   work through earlier products, so each one's math runs during the
//!   other's products; what the loop leaves after it, the last tile's after
//!   the work loop).
//!
//! The operands' tensor maps are kernel parameters (`__grid_constant__`),
//! described in the artifact and encoded by the runtime over the bound
//! buffers; the kernel needs sm_90a and says so (`Kernel::requires_arch`).

use dcir_artifact::{Im2col, TensorMap};
use dcir_fusion::{
    HOPPER_RING_ALIGN, HOPPER_TK, HopperBlocking, HopperConvSteps, Reason, hopper_conv_steps,
};
use dcir_ir::{DType, Graph, OpId};

use super::gemm::ConvGeometry;
use super::gemm_tc::{EpilogueFn, Problem, Strided, StridedTensor, block_order};
use super::simt::crossing;
use super::split_k;
use super::{EmitError, Lower, attr_int, storage_ty, vector_lane};
use crate::kir::{
    ArrayRef, BinOp, Builtin, Expr, Helper, Kernel, Param, Scratch, Stmt, Ty, WgmmaShape, add,
    array, bin, call, clamp, div, guarded, int, let_int, lt, mul, rem, sub, unrolled, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// Blocks of the persistent grid: the SMs of an H100 SXM and an H200.
pub(super) const PERSISTENT_BLOCKS: usize = 132;
/// The k extent of a stage (the blocking's, [`HopperBlocking`]).
const TK: usize = HOPPER_TK;
/// Bytes of one 16-bit element.
const ELEM: usize = 2;
/// Shared memory a block may use on sm_90.
const MAX_SHARED: usize = 227 * 1024;
/// Slack for aligning the ring to the swizzle's 1024-byte repeat.
const ALIGN: usize = HOPPER_RING_ALIGN;
/// Bytes of one 64-row, 64-wide box (an M- or N-major operand's unit).
const BOX_BYTES: usize = 64 * TK * ELEM;

/// Names the kernel body declares besides [`super::gemm_tc`]'s.
pub(super) const LOCALS: &[&str] = &[
    "bars",
    "role",
    "wt",
    "work",
    "it",
    "phase",
    "lr",
    "lc",
    "staged",
    "staged_v",
    "vidx",
    "out_tile",
    "out_pairs",
    "k0",
    "k_tap",
    "k_c0",
    "k_r",
    "k_s",
    "px_img",
    "px_h",
    "px_w",
    "tw",
    "kt0",
    "kt1",
    "split_flags",
];

/// Whether group `op` asks for the Hopper mainloop.
pub(super) fn asked(g: &Graph, op: OpId) -> bool {
    g.op(op)
        .attrs
        .get("mainloop")
        .and_then(dcir_ir::Attr::as_str)
        == Some("wgmma")
}

/// How an operand's tiles are copied.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Copy {
    /// Boxes of a 2-D view (3-D with a batch, its third coordinate `bz`):
    /// k contiguous in memory (K-major) one `rows × 64` box, else (M- or
    /// N-major) `rows / 64` boxes of `64 (k) × 64 (rows)`. The k step's
    /// origin is local `k0`.
    Box { k_major: bool, batched: bool },
    /// A convolution's NHWC input in im2col mode: a column of `rows` output
    /// pixels' window elements at one tap, a box of channels each, from the
    /// tile's first pixel's window origin (locals `px_w`, `px_h`, `px_img`)
    /// offset by the tap (`k_s`, `k_r`) from channel `k_c0`; with several
    /// boxes a step ([`HopperConvSteps`]), box `j` at tap `k_tap{j}` from
    /// channel `k_c{j}` ([`KSteps::locals`]), the boxes side by side in k.
    Im2col {
        dilation: [usize; 2],
        steps: HopperConvSteps,
        kw: usize,
    },
    /// A convolution's KRSC filter: a `channels × 1 × 1 × rows` box at tap
    /// `(k_r, k_s)` from channel `k_c0`; with several boxes a step, one per
    /// box as for [`Copy::Im2col`].
    Filter { steps: HopperConvSteps, kw: usize },
}

/// How one operand reaches shared memory: its tensor map and its layout there.
struct TmaOperand {
    /// The kernel parameter.
    param: String,
    copy: Copy,
    map: TensorMap,
}

impl TmaOperand {
    /// The operand's tensor map for tiles of `rows` rows, when its view is one
    /// a TMA box can read: one mode per dim, k or the rows contiguous, a
    /// linear batch, 16-byte aligned.
    fn new(s: &Strided, rows: usize, extent: usize, k: usize, batch: usize) -> Option<TmaOperand> {
        let (r_stride, k_stride) = (s.r.stride()?, s.k.stride()?);
        let batch_stride = if batch > 1 { s.batch_stride? } else { 0 };
        let k_major = k_stride == 1;
        let (inner, outer, outer_stride) = if k_major {
            (k, extent, r_stride)
        } else if r_stride == 1 {
            (extent, k, k_stride)
        } else {
            return None;
        };
        if !aligned(outer_stride) || !aligned(s.base) {
            return None;
        }
        let mut dims = vec![inner as u64, outer as u64];
        let mut strides = vec![(outer_stride as usize * ELEM) as u64];
        let mut box_dims = if k_major {
            vec![TK as u32, rows as u32]
        } else {
            vec![64, TK as u32]
        };
        let batched = batch_stride != 0;
        if batched {
            if !aligned(batch_stride) {
                return None;
            }
            dims.push(batch as u64);
            strides.push((batch_stride as usize * ELEM) as u64);
            box_dims.push(1);
        }
        Some(TmaOperand {
            param: s.param.clone(),
            copy: Copy::Box { k_major, batched },
            map: TensorMap {
                offset: (s.base as usize * ELEM) as u64,
                dims,
                strides,
                box_dims,
                swizzle: 128,
                im2col: None,
            },
        })
    }

    /// The im2col map of the conv's NHWC `input` (rows: output pixels) in
    /// boxes of `steps.channel_box` channels, when its strides are 16-byte
    /// aligned and its window fits the map's ranges.
    fn im2col(
        geo: &ConvGeometry,
        input: &StridedTensor,
        steps: HopperConvSteps,
    ) -> Option<TmaOperand> {
        let (param, offset, [sn, _, sh, sw]) = input.clone();
        let [n, c, h, w] = geo.input;
        let [_, _, oh, ow] = geo.output;
        if ![offset, sn, sh, sw].into_iter().all(aligned) || geo.stride.iter().any(|&s| s > 8) {
            return None;
        }
        // The window origins run from minus the padding, a stride apart.
        let (top, left) = (geo.pad[0] as i64, geo.pad[1] as i64);
        let upper = |out: usize, stride: usize, pad: i64, extent: usize| {
            ((out as i64 - 1) * stride as i64 - pad - (extent as i64 - 1)) as i32
        };
        Some(TmaOperand {
            param,
            copy: Copy::Im2col {
                dilation: geo.dilation,
                steps,
                kw: geo.weight[3],
            },
            map: TensorMap {
                offset: (offset as usize * ELEM) as u64,
                dims: vec![c as u64, w as u64, h as u64, n as u64],
                strides: [sw, sh, sn].map(|s| (s as usize * ELEM) as u64).to_vec(),
                box_dims: vec![steps.channel_box as u32, 128],
                swizzle: (steps.channel_box * ELEM) as u32,
                im2col: Some(Im2col {
                    lower: vec![-left as i32, -top as i32],
                    upper: vec![
                        upper(ow, geo.stride[1], left, w),
                        upper(oh, geo.stride[0], top, h),
                    ],
                    element_strides: vec![1, geo.stride[1] as u32, geo.stride[0] as u32, 1],
                }),
            },
        })
        .filter(|o| o.map.check(ELEM as u64, u64::MAX).is_ok())
    }

    /// The 4-D map of the conv's KRSC `filter` (rows: output channels) in
    /// boxes of `steps.channel_box` channels, when its strides are 16-byte
    /// aligned.
    fn filter(
        geo: &ConvGeometry,
        filter: &StridedTensor,
        steps: HopperConvSteps,
    ) -> Option<TmaOperand> {
        let (param, offset, [so, _, sr, ss]) = filter.clone();
        let [o, c, r, s] = geo.weight;
        if ![offset, so, sr, ss].into_iter().all(aligned) {
            return None;
        }
        Some(TmaOperand {
            param,
            copy: Copy::Filter { steps, kw: s },
            map: TensorMap {
                offset: (offset as usize * ELEM) as u64,
                dims: vec![c as u64, s as u64, r as u64, o as u64],
                strides: [ss, sr, so].map(|s| (s as usize * ELEM) as u64).to_vec(),
                box_dims: vec![steps.channel_box as u32, 1, 1, 256],
                swizzle: (steps.channel_box * ELEM) as u32,
                im2col: None,
            },
        })
    }

    /// Whether k is contiguous in the shared tile.
    fn k_major(&self) -> bool {
        !matches!(self.copy, Copy::Box { k_major: false, .. })
    }

    /// Bytes of a row of a box in shared memory, the swizzle's width: 128
    /// (64 k), or a narrow box's channels.
    fn row_bytes(&self) -> usize {
        self.map.swizzle as usize
    }

    /// Rows of the tile ([`TmaOperand::set_rows`]).
    fn rows(&self) -> usize {
        match self.copy {
            Copy::Box { .. } | Copy::Im2col { .. } => self.map.box_dims[1] as usize,
            Copy::Filter { .. } => self.map.box_dims[3] as usize,
        }
    }

    /// The boxes of the step's copies, each `(r, s, c0)`: its tap's row and
    /// column and its first channel, from the step's locals
    /// ([`KSteps::locals`]).
    fn boxes(steps: HopperConvSteps, kw: usize) -> Vec<(Expr, Expr, Expr)> {
        if steps.boxes_per_step == 1 {
            return vec![(var("k_r"), var("k_s"), var("k_c0"))];
        }
        (0..steps.boxes_per_step)
            .map(|j| {
                let tap = var(format!("k_tap{j}"));
                let c0 = if KSteps::box_channel_varies(steps, j) {
                    var(format!("k_c{j}"))
                } else {
                    int(0)
                };
                (div(tap.clone(), kw as i64), rem(tap, kw as i64), c0)
            })
            .collect()
    }

    /// Sets the rows of a tile (the box extent along them, for copies that
    /// bring a whole tile at once).
    fn set_rows(&mut self, rows: usize) {
        match self.copy {
            Copy::Box { k_major: true, .. } => self.map.box_dims[1] = rows as u32,
            Copy::Box { k_major: false, .. } => {}
            Copy::Im2col { .. } => self.map.box_dims[1] = rows as u32,
            Copy::Filter { .. } => self.map.box_dims[3] = rows as u32,
        }
    }

    /// The copies of the current k step of the tile at row `r0` into shared
    /// address `dst`, counted on barrier `bar` (the step's locals: [`Copy`]).
    fn loads(&self, rows: usize, r0: Expr, dst: Expr, bar: Expr) -> Vec<Stmt> {
        let head = |dst: Expr| vec![dst, var(&self.param), bar.clone()];
        match self.copy {
            Copy::Box { k_major, batched } => {
                let boxes: Vec<(Expr, Expr, Expr)> = if k_major {
                    vec![(dst, var("k0"), r0)]
                } else {
                    (0..rows / 64)
                        .map(|c| {
                            (
                                add(dst.clone(), int((c * BOX_BYTES) as i64)),
                                add(r0.clone(), int(64 * c as i64)),
                                var("k0"),
                            )
                        })
                        .collect()
                };
                boxes
                    .into_iter()
                    .map(|(dst, c0, c1)| {
                        let mut args = head(dst);
                        args.extend([c0, c1]);
                        let f = if batched {
                            args.push(var("bz"));
                            "dcir_tma_load3"
                        } else {
                            "dcir_tma_load2"
                        };
                        Stmt::Call(f.into(), args)
                    })
                    .collect()
            }
            Copy::Im2col {
                dilation: [dh, dw],
                steps,
                kw,
            } => {
                let box_bytes = (rows * self.row_bytes()) as i64;
                let at = |j: usize| add(dst.clone(), int(j as i64 * box_bytes));
                Self::boxes(steps, kw)
                    .into_iter()
                    .enumerate()
                    .map(|(j, (r, s, c0))| {
                        let mut args = head(if j == 0 { dst.clone() } else { at(j) });
                        args.extend([
                            c0,
                            var("px_w"),
                            var("px_h"),
                            var("px_img"),
                            mul(s, int(dw as i64)),
                            mul(r, int(dh as i64)),
                        ]);
                        Stmt::Call("dcir_tma_load_im2col4".into(), args)
                    })
                    .collect()
            }
            Copy::Filter { steps, kw } => {
                let box_bytes = (rows * self.row_bytes()) as i64;
                Self::boxes(steps, kw)
                    .into_iter()
                    .enumerate()
                    .map(|(j, (r, s, c0))| {
                        let dst = if j == 0 {
                            dst.clone()
                        } else {
                            add(dst.clone(), int(j as i64 * box_bytes))
                        };
                        let mut args = head(dst);
                        args.extend([c0, s, r, r0.clone()]);
                        Stmt::Call("dcir_tma_load4".into(), args)
                    })
                    .collect()
            }
        }
    }

    /// The `wgmma` descriptor of 16-wide k slice `kk` of the tile at shared
    /// address `base`: a K-major slice is 32 bytes into each swizzled row
    /// (rows 1024 bytes per 8) or, in narrow boxes, into the box that holds
    /// it (a whole tile of rows a box, 8 rows 8 × the row's bytes); an
    /// M/N-major one 16 k rows further (boxes [`BOX_BYTES`] apart).
    fn descriptor(&self, base: Expr, kk: usize) -> Expr {
        let w = self.row_bytes();
        let (offset, lbo) = if self.k_major() {
            let at = kk * 32;
            ((at / w) * self.rows() * w + at % w, 16)
        } else {
            (kk * 16 * TK * ELEM, BOX_BYTES)
        };
        // The descriptor's swizzle mode: 1 for 128-byte rows, 2 for 64, 3 for 32.
        let mode = match w {
            128 => 1,
            64 => 2,
            _ => 3,
        };
        call(
            "dcir_wgmma_desc",
            vec![
                add(base, int(offset as i64)),
                int(lbo as i64),
                int(8 * w as i64),
                int(mode),
            ],
        )
    }
}

/// Whether an element offset or stride is a positive multiple of 16 bytes
/// (offsets may be 0).
fn aligned(x: i64) -> bool {
    x >= 0 && x % 8 == 0
}

/// How the k loop steps: over 64-wide slices of K, or over a convolution's
/// window (`kw` taps a row) as [`hopper_conv_steps`] says (a tap's
/// 64-channel box a step, or several narrower boxes).
enum KSteps {
    Gemm { k: usize },
    Conv { kw: usize, steps: HopperConvSteps },
}

impl KSteps {
    fn count(&self) -> usize {
        match *self {
            KSteps::Gemm { k } => k.div_ceil(TK),
            KSteps::Conv { steps, .. } => steps.steps,
        }
    }

    /// The locals of step `kt` its copies read ([`Copy`]): a GEMM's `k0`;
    /// a convolution's tap (`k_tap`, `k_r`, `k_s`) and first channel
    /// (`k_c0`) with one box a step, else each box `j`'s tap `k_tap{j}` and
    /// first channel `k_c{j}` where it is not 0 ([`HopperConvSteps`]: box
    /// `b` of the window is tap `b / slices`, channel `(b % slices) · box`;
    /// a box past the window's is the last tap past the channels).
    fn locals(&self) -> Vec<Stmt> {
        match *self {
            KSteps::Gemm { .. } => vec![let_int("k0", mul(var("kt"), int(TK as i64)))],
            KSteps::Conv { steps, .. } if steps.boxes_per_step > 1 => {
                let slices = steps.slices as i64;
                let mut locals = vec![let_int(
                    "k_b",
                    mul(var("kt"), int(steps.boxes_per_step as i64)),
                )];
                for j in 0..steps.boxes_per_step {
                    let b = add(var("k_b"), int(j as i64));
                    let mut tap = if slices == 1 {
                        b.clone()
                    } else {
                        div(b.clone(), slices)
                    };
                    if steps.tail() && j > 0 {
                        tap = clamp(tap, 0, steps.taps as i64 - 1);
                    }
                    locals.push(let_int(&format!("k_tap{j}"), tap));
                    if Self::box_channel_varies(steps, j) {
                        let slice = sub(b, mul(var(format!("k_tap{j}")), int(slices)));
                        locals.push(let_int(
                            &format!("k_c{j}"),
                            mul(slice, int(steps.channel_box as i64)),
                        ));
                    }
                }
                locals
            }
            KSteps::Conv { kw, steps } => {
                let slices = steps.slices as i64;
                vec![
                    let_int("k_tap", div(var("kt"), slices)),
                    let_int(
                        "k_c0",
                        mul(rem(var("kt"), slices), int(steps.channel_box as i64)),
                    ),
                    let_int("k_r", div(var("k_tap"), kw as i64)),
                    let_int("k_s", rem(var("k_tap"), kw as i64)),
                ]
            }
        }
    }

    /// Whether box `j` of a step may start past channel 0: a tap has
    /// several boxes, or the box may be past the window's.
    fn box_channel_varies(steps: HopperConvSteps, j: usize) -> bool {
        steps.slices > 1 || (steps.tail() && j > 0)
    }
}

/// Split-K on the persistent grid (`split_k = S`): work item `work` is
/// split `ks = work / T` of tile `tw = work % T` (`T` the output tiles), and
/// runs k steps `kt0 .. kt1` (`ks·K / S` to `(ks+1)·K / S` of the `K`
/// steps: the splits' sizes differ by at most one). Each consumer
/// warpgroup stores its split's f32 accumulators to the `dcir_partials`
/// scratch (one slot per tile, split, consumer, accumulator and thread,
/// consecutive threads adjacent), then counts itself in at its tile's and
/// consumer's entry of `dcir_arrivals` (`dcir_split_arrive_wg`, after a
/// fence); the last of the `S` to arrive resets the entry to zero (so
/// CUDA-graph replays need no reset), adds every split's partial sums in
/// split order (read past L1, its own too: the sum does not depend on the
/// order of arrival, so results are deterministic) and runs the epilogue.
struct Split {
    splits: usize,
    steps: usize,
    tiles: usize,
}

impl Split {
    /// Splits of `steps` k steps for attribute value `asked`: at most
    /// [`split_k::MAX_SPLITS`] and `steps`.
    fn count(asked: i64, steps: usize) -> usize {
        (asked.max(1) as usize)
            .min(split_k::MAX_SPLITS)
            .min(steps.max(1))
    }

    /// Work items of the grid.
    fn units(&self) -> usize {
        self.tiles * self.splits
    }

    /// The statements defining a work item's split, tile and k steps.
    fn locate(&self) -> Vec<Stmt> {
        if self.splits == 1 {
            return Vec::new();
        }
        let (t, k, s) = (self.tiles as i64, self.steps as i64, self.splits as i64);
        vec![
            let_int("ks", div(var("work"), t)),
            let_int("tw", rem(var("work"), t)),
            let_int("kt0", div(mul(var("ks"), int(k)), s)),
            // At least one step (true of every split, as S ≤ K); said so, ptxas
            // knows the k loop runs and keeps the `wgmma`s pipelined.
            let_int(
                "kt1",
                call(
                    "max",
                    vec![
                        div(mul(add(var("ks"), int(1)), int(k)), s),
                        add(var("kt0"), int(1)),
                    ],
                ),
            ),
        ]
    }

    /// The work item's output tile.
    fn tile_index(&self) -> Expr {
        var(if self.splits == 1 { "work" } else { "tw" })
    }

    /// The work item's first and end k step.
    fn k_range(&self) -> (Expr, Expr) {
        if self.splits == 1 {
            (int(0), int(self.steps as i64))
        } else {
            (var("kt0"), var("kt1"))
        }
    }

    /// The `dcir_partials` slot of accumulator `i` of this thread in split
    /// `split` of the work item's tile.
    fn slot(&self, c: &HopperBlocking, split: Expr, i: Expr) -> Expr {
        let unit = add(mul(var("tw"), int(self.splits as i64)), split);
        let row = add(
            mul(unit, int(c.consumers() as i64)),
            sub(var("role"), int(1)),
        );
        add(
            mul(add(mul(row, int(c.accumulators() as i64)), i), int(128)),
            var("wt"),
        )
    }

    /// Accumulator `i` as the epilogue reads it: the register, or with a
    /// split the sum of the splits' partial sums in split order (read
    /// there, not added into the registers first: an instruction other than
    /// `wgmma` defining them would make ptxas serialize the `wgmma`s).
    fn accumulator(&self, c: &HopperBlocking, i: Expr) -> Expr {
        if self.splits == 1 {
            return Expr::Load(array("acc", Ty::F32), Box::new(i));
        }
        let stride = c.consumers() * c.accumulators() * 128;
        call(
            "dcir_split_sum",
            vec![
                var(split_k::PARTIALS),
                self.slot(c, int(0), i),
                int(stride as i64),
                int(self.splits as i64),
            ],
        )
    }

    /// A consumer's statements after its k loop: with a split, its partial
    /// sums out and, in the last split to arrive, `epilogue` (reading the
    /// sums: [`Split::accumulator`]); the scratch parameters are appended to
    /// `params`, their sizes returned.
    fn finish(
        &self,
        c: &HopperBlocking,
        params: &mut Vec<Param>,
        helpers: &mut std::collections::BTreeSet<Helper>,
        epilogue: Vec<Stmt>,
    ) -> (Vec<Stmt>, Vec<Scratch>) {
        if self.splits == 1 {
            return (epilogue, Vec::new());
        }
        helpers.extend([Helper::SplitK, Helper::SplitSum]);
        let (partials, arrivals) = (split_k::PARTIALS, split_k::ARRIVALS);
        for (name, ty, dtype) in [(partials, Ty::F32, "f32"), (arrivals, Ty::U32, "u32")] {
            params.push(Param {
                name: name.into(),
                ty,
                dtype,
                output: true,
                tensor_map: None,
            });
        }
        let acc_len = c.accumulators() as i64;
        let consumer = sub(var("role"), int(1));
        let slot = |split: Expr, i: Expr| self.slot(c, split, i);
        let acc = |i: Expr| Expr::Load(array("acc", Ty::F32), Box::new(i));
        let each = |store: Stmt| unrolled("i", acc_len as usize, vec![store]);
        let last = epilogue;
        let arrival = add(mul(var("tw"), int(c.consumers() as i64)), consumer.clone());
        let stmts = vec![
            Stmt::Comment(format!(
                "split-K: this split's partial sums out; the last of the {} splits to arrive runs the epilogue on their sums in split order",
                self.splits
            )),
            each(Stmt::Store(
                array(partials, Ty::F32),
                slot(var("ks"), var("i")),
                acc(var("i")),
            )),
            Stmt::If(
                call(
                    "dcir_split_arrive_wg",
                    vec![
                        var(arrivals),
                        arrival,
                        int(self.splits as i64),
                        var("role"),
                        add(var("split_flags"), consumer),
                    ],
                ),
                last,
            ),
        ];
        let scratch = vec![
            Scratch {
                param: partials.into(),
                bytes: self.units() * c.tm * c.tn * 4,
                zeroed: false,
            },
            Scratch {
                param: arrivals.into(),
                bytes: self.tiles * c.consumers() * 4,
                zeroed: true,
            },
        ];
        (stmts, scratch)
    }
}

/// The operands' copies for problem `p` and its k steps, or why it cannot
/// take the Hopper mainloop.
fn operands(p: &Problem) -> std::result::Result<([TmaOperand; 2], KSteps), String> {
    if !matches!(p.dtype, DType::F16 | DType::BF16) {
        return Err(format!(
            "{} operands (wgmma takes f16 or bf16)",
            p.dtype.name()
        ));
    }
    if let Some(conv) = &p.conv {
        let refused = "a convolution of channel groups, or whose input is not NHWC or filter not KRSC in memory (channels contiguous, 16-byte aligned), or whose window an im2col map cannot walk";
        let (Some(input), Some(filter)) = (&conv.input, &conv.filter) else {
            return Err(refused.into());
        };
        let [_, c, _, _] = conv.geo.input;
        let [_, _, kh, kw] = conv.geo.weight;
        let steps = hopper_conv_steps(c, kh * kw);
        return match (
            conv.geo.groups == 1,
            TmaOperand::im2col(&conv.geo, input, steps),
            TmaOperand::filter(&conv.geo, filter, steps),
        ) {
            (true, Some(a), Some(b)) => Ok(([a, b], KSteps::Conv { kw, steps })),
            _ => Err(refused.into()),
        };
    }
    let side = |o: &super::gemm_tc::Operand, rows: usize, which: &str| {
        o.strided
            .as_ref()
            .and_then(|s| TmaOperand::new(s, rows, o.rows, p.k, p.batch))
            .ok_or_else(|| {
                format!(
                    "operand {which}, which is no view a TMA box reads (one stride per dim, k or its rows contiguous, 16-byte aligned, a linear batch)"
                )
            })
    };
    Ok((
        [side(&p.a, 192, "A")?, side(&p.b, 256, "B")?],
        KSteps::Gemm { k: p.k },
    ))
}

/// Lowers `problem` on the Hopper mainloop (module doc): blocking from the
/// group's `tile` and `stages` ([`HopperBlocking::new`]), its k steps split
/// `split_k` ways ([`Split`]), the epilogue as in [`super::gemm_tc`].
pub(super) fn lower(
    l: &mut Lower,
    op: OpId,
    mut params: Vec<Param>,
    p: &Problem,
    tile: [i64; 3],
    (epilogue, columns): (&EpilogueFn, usize),
    what: String,
) -> Result<Kernel> {
    let g = l.g;
    let ([mut a, mut b], steps) = operands(p).map_err(|why| l.unsupported(Reason::Form(why)))?;
    let stores = l.scoped(|l| epilogue(l, var("row"), var("col"), &[var("staged")]))?;
    // The operands' parameters become tensor maps: nothing else may read them.
    if a.param == b.param
        || stores
            .iter()
            .any(|s| s.reads(&a.param) || s.reads(&b.param))
    {
        return Err(l.unsupported(Reason::Form(
            "an operand the epilogue also reads, or one tensor as both operands (an operand's parameter becomes a tensor map)".into(),
        )));
    }
    // Whether the tail reads a tensor row by row (a residual; not a bias).
    let reads_rows = l.inputs.iter().any(|(&v, name)| {
        *name != a.param
            && *name != b.param
            && stores.iter().any(|s| s.reads(name))
            && g.ty(v).num_elements().unwrap_or(0) > p.n
    });
    let splits = Split::count(attr_int(g, op, "split_k", 1), steps.count());
    let c = HopperBlocking::new(
        tile,
        attr_int(g, op, "stages", 4),
        splits > 1,
        [a.k_major(), b.k_major()],
        MAX_SHARED,
    );
    let (producer_registers, consumer_registers) = c.registers();
    a.set_rows(c.tm);
    b.set_rows(c.tn);
    let shape = WgmmaShape {
        n: c.wgmma_n() as u16,
        bf16: p.dtype == DType::BF16,
        a_m_major: !a.k_major(),
        b_n_major: !b.k_major(),
    };
    l.helpers.extend([Helper::Hopper, Helper::Wgmma(shape)]);
    let grid_m = p.m.div_ceil(c.tm);
    let grid_n = p.n.div_ceil(c.tn);
    let tiles = p.batch * grid_m * grid_n;
    let split = Split {
        splits,
        steps: steps.count(),
        tiles,
    };
    let stage = c.stage_bytes() as i64;
    let stages = c.stages as i64;
    let full = |s: Expr| add(var("bars"), mul(s, int(8)));
    let empty = |s: Expr| add(var("bars"), mul(add(s, int(stages)), int(8)));
    let stage_base = add(var("smem"), mul(var("s"), int(stage)));
    let b_base = add(stage_base.clone(), int((c.tm * TK * ELEM) as i64));

    // The tile of work item `work` (its split, its k steps): batch entry,
    // tile row and column, origin.
    let per_batch = (grid_m * grid_n) as i64;
    let mut locate = split.locate();
    let tile_index = split.tile_index();
    if p.batch > 1 {
        locate.push(let_int("bz", div(tile_index.clone(), per_batch)));
        locate.push(let_int("tile", rem(tile_index, per_batch)));
    } else {
        locate.push(let_int("tile", tile_index));
    }
    locate.extend(block_order(grid_m, grid_n));
    locate.push(let_int("m0", mul(var("tile_m"), int(c.tm as i64))));
    locate.push(let_int("n0", mul(var("tile_n"), int(c.tn as i64))));
    let step_of_ring = vec![
        let_int("s", rem(var("it"), stages)),
        let_int("phase", bin(BinOp::BitAnd, div(var("it"), stages), int(1))),
    ];
    let work_loop = |body: Vec<Stmt>| Stmt::For {
        var: "work".into(),
        start: Expr::Builtin(Builtin::BlockX),
        end: int(split.units() as i64),
        step: Expr::Builtin(Builtin::GridDimX),
        unroll: false,
        body,
    };
    let k_loop = |body: Vec<Stmt>| {
        let mut inner = step_of_ring.clone();
        inner.extend(body);
        inner.push(Stmt::Assign("it".into(), add(var("it"), int(1))));
        let (start, end) = split.k_range();
        Stmt::For {
            var: "kt".into(),
            start,
            end,
            step: int(1),
            unroll: false,
            body: inner,
        }
    };

    // Producer: one thread fills the ring.
    let mut fill = steps.locals();
    fill.extend([
        Stmt::Call(
            "dcir_mbar_wait".into(),
            vec![empty(var("s")), bin(BinOp::BitXor, var("phase"), int(1))],
        ),
        Stmt::Call(
            "dcir_mbar_expect_tx".into(),
            vec![full(var("s")), int(stage)],
        ),
    ]);
    fill.extend(a.loads(c.tm, var("m0"), stage_base.clone(), full(var("s"))));
    fill.extend(b.loads(c.tn, var("n0"), b_base.clone(), full(var("s"))));
    let mut producer_tile = locate.clone();
    if let Some(conv) = &p.conv {
        // The window origin of the tile's first output pixel.
        let geo = &conv.geo;
        let [img, oh, ow] = geo.pixel(var("m0"));
        producer_tile.extend([
            let_int("px_img", img),
            let_int(
                "px_h",
                sub(mul(oh, int(geo.stride[0] as i64)), int(geo.pad[0] as i64)),
            ),
            let_int(
                "px_w",
                sub(mul(ow, int(geo.stride[1] as i64)), int(geo.pad[1] as i64)),
            ),
        ]);
    }
    producer_tile.push(k_loop(fill));
    let producer = vec![
        Stmt::Call(
            format!("dcir_producer_registers<{producer_registers}>"),
            vec![],
        ),
        Stmt::If(
            bin(BinOp::Eq, var("wt"), int(0)),
            vec![
                Stmt::Let {
                    name: "it".into(),
                    ty: Ty::I32,
                    value: int(0),
                    constant: false,
                },
                work_loop(producer_tile),
            ],
        ),
    ];

    // Consumers: 64 rows each.
    let a_rows = add(
        stage_base,
        mul(sub(var("role"), int(1)), int((64 * a.row_bytes()) as i64)),
    );
    let mut mma = vec![
        Stmt::Call("dcir_mbar_wait".into(), vec![full(var("s")), var("phase")]),
        Stmt::Call("dcir_wgmma_fence".into(), vec![]),
    ];
    for kk in 0..TK / 16 {
        let (a_desc, b_desc) = (
            a.descriptor(a_rows.clone(), kk),
            b.descriptor(b_base.clone(), kk),
        );
        // Swapped, B's tile is the wgmma's M and A's its N.
        let (m_desc, n_desc) = if c.swapped {
            (b_desc, a_desc)
        } else {
            (a_desc, b_desc)
        };
        mma.push(Stmt::Call(
            shape.helper_name(),
            vec![var("acc"), m_desc, n_desc],
        ));
    }
    mma.push(Stmt::Call("dcir_wgmma_commit".into(), vec![]));
    let mma_tail = vec![
        // One group stays in flight: the previous step's is done, its stage free.
        Stmt::Call("dcir_wgmma_wait1".into(), vec![]),
        Stmt::If(
            bin(
                BinOp::And,
                bin(BinOp::Eq, var("wt"), int(0)),
                bin(BinOp::Ne, var("kt"), split.k_range().0),
            ),
            vec![Stmt::Call(
                "dcir_mbar_arrive".into(),
                vec![empty(rem(add(var("it"), int(stages - 1)), stages))],
            )],
        ),
    ];
    // After the k loop: the last step's group, and its stage.
    let drain = vec![
        Stmt::Call("dcir_wgmma_wait0".into(), vec![]),
        Stmt::If(
            bin(BinOp::Eq, var("wt"), int(0)),
            vec![Stmt::Call(
                "dcir_mbar_arrive".into(),
                vec![empty(rem(add(var("it"), int(stages - 1)), stages))],
            )],
        ),
    ];
    // Epilogue, first half: the accumulators rounded to the product's dtype
    // into the consumer's rows of the staging tile, two columns a word; or,
    // swapped (the accumulators' rows are the tile's columns), by
    // `stmatrix.trans`, four 8 × 8 blocks an instruction.
    let row_elems = c.staged_row_elems() as i64;
    let consumer_row0 = if c.swapped {
        int(0)
    } else {
        mul(sub(var("role"), int(1)), int(64))
    };
    let acc = |i: Expr| split.accumulator(&c, i);
    // Accumulators `i` and `i + 1` (one row, two adjacent columns) as a word.
    let mut word = |i: Expr| {
        let (lo, hi) = (
            l.narrow(p.dtype, acc(i.clone())),
            l.narrow(p.dtype, acc(add(i, int(1)))),
        );
        bin(
            BinOp::BitOr,
            Expr::Cast(Ty::U32, Box::new(lo)),
            bin(BinOp::Shl, Expr::Cast(Ty::U32, Box::new(hi)), int(16)),
        )
    };
    let stage_out = if c.swapped {
        // Block q (lanes 8q..8q+8 address its rows) of step j: accumulator
        // columns 16j + 8(q / 2) + (0..8) (the tile's rows), accumulator rows
        // 16·warp + 8(q % 2) + (0..8) (its columns).
        let lane_row = add(mul(div(var("lane"), 16), int(8)), rem(var("lane"), 8));
        let lane_col = add(
            mul(var("warp"), int(16)),
            mul(rem(div(var("lane"), 8), 2), int(8)),
        );
        let at = add(
            add(
                call("dcir_smem_base", vec![var("dcir_smem")]),
                int(c.staging_offset() as i64),
            ),
            mul(
                add(
                    mul(add(mul(var("j"), int(16)), lane_row), int(row_elems)),
                    lane_col,
                ),
                int(ELEM as i64),
            ),
        );
        let mut args = vec![at];
        args.extend((0..4).map(|q| word(add(mul(var("j"), int(8)), int(2 * q)))));
        unrolled(
            "j",
            c.wgmma_n() / 16,
            vec![Stmt::Call("dcir_stmatrix_x4_trans".into(), args)],
        )
    } else {
        let staged_row = add(
            consumer_row0.clone(),
            add(
                add(mul(var("warp"), int(16)), div(var("lane"), 4)),
                mul(var("h"), int(8)),
            ),
        );
        let pair = add(mul(var("j"), int(4)), mul(var("h"), int(2)));
        let store = Stmt::Store(
            array("out_pairs", Ty::U32),
            add(
                mul(staged_row, int(row_elems / 2)),
                add(mul(var("j"), int(4)), rem(var("lane"), 4)),
            ),
            word(pair),
        );
        unrolled("j", c.tn / 8, vec![unrolled("h", 2, vec![store])])
    };
    // Second half, one element at a time: each warp walks every fourth row,
    // its lanes on 32 consecutive columns at a time, each element through
    // the group's tail and stored (coalesced: 64 bytes of one row per store).
    // Or, where the epilogue stores `columns` consecutive columns at once
    // (16 bytes), the consumer's threads walk its rows' vectors in order.
    let row_check = || crossing(p.m, c.tm, true).map(|m| lt(var("row"), int(m as i64)));
    let col_check = || crossing(p.n, c.tn, true).map(|n| lt(var("col"), int(n as i64)));
    let staged_at = |lc: Expr| {
        add(
            mul(add(consumer_row0.clone(), var("lr")), int(row_elems)),
            lc,
        )
    };
    let (passes, staged_row_loop) = if columns > 1 {
        let per_row = (c.tn / columns) as i64;
        let vector = add(mul(var("i"), int(128)), var("wt"));
        let staged_v = Expr::Load(
            ArrayRef {
                name: "out_tile".into(),
                ty: Ty::Uint4,
                reinterpret: true,
            },
            Box::new(div(staged_at(var("lc")), columns as i64)),
        );
        let accs: Vec<Expr> = (0..columns)
            .map(|j| l.widen(p.dtype, vector_lane("staged_v".into(), p.dtype, columns, j)))
            .collect();
        let stores = l.scoped(|l| epilogue(l, var("row"), var("col"), &accs))?;
        let mut body = vec![
            let_int("lr", div(vector.clone(), per_row)),
            let_int("lc", mul(rem(vector, per_row), int(columns as i64))),
            let_int("row", add(add(var("m0"), consumer_row0.clone()), var("lr"))),
            let_int("col", add(var("n0"), var("lc"))),
        ];
        body.extend(guarded(
            vec![row_check(), col_check()],
            std::iter::once(Stmt::Let {
                name: "staged_v".into(),
                ty: Ty::Uint4,
                value: staged_v,
                constant: true,
            })
            .chain(stores)
            .collect(),
        ));
        (c.consumer_rows() * c.tn / columns / 128, body)
    } else {
        let staged = l.widen(
            p.dtype,
            Expr::Load(
                array("out_tile", storage_ty(p.dtype)),
                Box::new(staged_at(var("lc"))),
            ),
        );
        let mut element = vec![
            let_int("lc", add(mul(var("j"), int(32)), var("lane"))),
            let_int("col", add(var("n0"), var("lc"))),
        ];
        element.extend(guarded(
            vec![col_check()],
            std::iter::once(Stmt::Let {
                name: "staged".into(),
                ty: Ty::F32,
                value: staged,
                constant: true,
            })
            .chain(stores)
            .collect(),
        ));
        let mut body = vec![
            let_int("lr", add(mul(var("i"), int(4)), var("warp"))),
            let_int("row", add(add(var("m0"), consumer_row0.clone()), var("lr"))),
        ];
        body.extend(guarded(
            vec![row_check()],
            vec![unrolled("j", c.tn / 32, element)],
        ));
        (c.consumer_rows() / 4, body)
    };
    let warpgroup_barrier = Stmt::Call("dcir_warpgroup_barrier".into(), vec![var("role")]);
    // Unrolled: the rows' loads of the tail's other operands (a residual)
    // are all in flight at once, not one row's at a time.
    let passes_from = |first: usize, body: Vec<Stmt>| Stmt::For {
        var: "i".into(),
        start: int(first as i64),
        end: int(passes as i64),
        step: int(1),
        unroll: true,
        body,
    };
    // Without a k split, where a block has several tiles and the tail
    // reads no tensor row by row, a tile's staged results are stored during
    // the next tile's k loop, one pass of rows after each step's wgmmas are
    // issued (the tensor cores multiply while the tail's math and stores
    // run), the passes left after the loop, the last tile's after the work
    // loop: the staged tile's origin (`em0`, `en0`, `ebz`) shadows the
    // current tile's. A tail that reads a residual keeps its passes
    // together after the loop, where all their loads are in flight at once
    // (one pass at a time, each pass's loads would wait alone).
    let overlapped = split.splits == 1 && tiles > PERSISTENT_BLOCKS && !reads_rows;
    let staged_tile = |mut body: Vec<Stmt>| {
        let mut shadowed = vec![let_int("m0", var("em0")), let_int("n0", var("en0"))];
        if p.batch > 1 {
            shadowed.push(let_int("bz", var("ebz")));
        }
        shadowed.append(&mut body);
        shadowed
    };
    if overlapped {
        // A warpgroup's wgmmas hold it at issue while the tensor cores work
        // through the ones before, so the second and third consumers take
        // their pass before their wgmmas, the first after: each one's math
        // runs while another's products do.
        let mut pass = vec![let_int("i", var("kt"))];
        pass.extend(staged_row_loop.clone());
        // `first`: the comparison of the consumer's role with the first's.
        let pass_of = |first: Option<BinOp>| {
            let mut cond = bin(
                BinOp::And,
                bin(BinOp::Ne, var("pending"), int(0)),
                lt(var("kt"), int(passes as i64)),
            );
            if let Some(op) = first {
                cond = bin(BinOp::And, bin(op, var("role"), int(1)), cond);
            }
            Stmt::If(cond, staged_tile(pass.clone()))
        };
        if c.consumers() > 1 {
            mma.insert(1, pass_of(Some(BinOp::Ne)));
            mma.push(pass_of(Some(BinOp::Eq)));
        } else {
            mma.push(pass_of(None));
        }
    }
    mma.extend(mma_tail);
    let mut consumer_tile = locate;
    consumer_tile.push(unrolled(
        "i",
        c.accumulators(),
        vec![Stmt::Store(array("acc", Ty::F32), var("i"), Expr::F32(0.0))],
    ));
    consumer_tile.push(k_loop(mma));
    consumer_tile.extend(drain);
    if overlapped && split.steps < passes {
        consumer_tile.push(Stmt::If(
            bin(BinOp::Ne, var("pending"), int(0)),
            staged_tile(vec![passes_from(split.steps, staged_row_loop.clone())]),
        ));
    }
    let mut tile_epilogue = vec![
        Stmt::Comment(format!(
            "epilogue: accumulator 4j + 2h + e is row 16·warp + lane/4 + 8h, column 8j + 2(lane%4) + e of the consumer's {}; staged, then stored {}{}",
            if c.swapped {
                "columns and rows (swapped), staged by stmatrix.trans"
            } else {
                "rows"
            },
            if columns > 1 {
                format!("{columns} columns a thread, the rows' vectors in order")
            } else {
                "a row at a time".to_string()
            },
            if overlapped {
                ", a pass of rows after each k step of the next tile"
            } else {
                ""
            }
        )),
        warpgroup_barrier.clone(),
        stage_out,
        warpgroup_barrier,
    ];
    if overlapped {
        tile_epilogue.extend([
            Stmt::Assign("em0".into(), var("m0")),
            Stmt::Assign("en0".into(), var("n0")),
            Stmt::Assign("pending".into(), int(1)),
        ]);
        if p.batch > 1 {
            tile_epilogue.push(Stmt::Assign("ebz".into(), var("bz")));
        }
    } else {
        tile_epilogue.push(passes_from(0, staged_row_loop.clone()));
    }
    let (finish, scratch) = split.finish(&c, &mut params, &mut l.helpers, tile_epilogue);
    consumer_tile.extend(finish);
    let mut consumer = vec![Stmt::Call(
        format!("dcir_consumer_registers<{consumer_registers}>"),
        vec![],
    )];
    if split.splits > 1 {
        consumer.push(Stmt::SharedView {
            name: "split_flags".into(),
            ty: Ty::U32,
            offset: c.flags_offset(),
        });
    }
    consumer.extend(vec![
        Stmt::SharedView {
            name: "out_tile".into(),
            ty: storage_ty(p.dtype),
            offset: c.staging_offset(),
        },
        Stmt::SharedView {
            name: "out_pairs".into(),
            ty: Ty::U32,
            offset: c.staging_offset(),
        },
        let_int("warp", div(var("wt"), 32)),
        let_int("lane", rem(var("wt"), 32)),
        Stmt::LocalArray {
            name: "acc".into(),
            ty: Ty::F32,
            len: c.accumulators(),
        },
        Stmt::Let {
            name: "it".into(),
            ty: Ty::I32,
            value: int(0),
            constant: false,
        },
    ]);
    let staged_origin = ["pending", "em0", "en0", "ebz"];
    if overlapped {
        for name in &staged_origin[..if p.batch > 1 { 4 } else { 3 }] {
            consumer.push(Stmt::Let {
                name: (*name).into(),
                ty: Ty::I32,
                value: int(0),
                constant: false,
            });
        }
    }
    consumer.push(work_loop(consumer_tile));
    if overlapped {
        consumer.push(Stmt::If(
            bin(BinOp::Ne, var("pending"), int(0)),
            staged_tile(vec![passes_from(0, staged_row_loop)]),
        ));
    }

    let mut body = vec![
        Stmt::Comment(format!(
            "ring: {} stages of A ({} x {TK}) and B ({} x {TK}), {}-byte swizzled, from a 1024-byte aligned base; full and empty barriers after it",
            c.stages,
            c.tm,
            c.tn,
            a.row_bytes()
        )),
        Stmt::Let {
            name: "smem".into(),
            ty: Ty::U32,
            value: bin(
                BinOp::Shl,
                bin(
                    BinOp::Shr,
                    add(
                        call("dcir_smem_base", vec![var("dcir_smem")]),
                        int(ALIGN as i64 - 1),
                    ),
                    int(ALIGN.trailing_zeros() as i64),
                ),
                int(ALIGN.trailing_zeros() as i64),
            ),
            constant: true,
        },
        Stmt::Let {
            name: "bars".into(),
            ty: Ty::U32,
            value: add(var("smem"), int(stages * stage)),
            constant: true,
        },
        let_int("role", div(Expr::Builtin(Builtin::ThreadX), 128)),
        let_int("wt", rem(Expr::Builtin(Builtin::ThreadX), 128)),
        Stmt::If(
            bin(BinOp::Eq, Expr::Builtin(Builtin::ThreadX), int(0)),
            vec![
                // The operands' descriptors fetched while the barriers are
                // set up, not on the first copy's path.
                Stmt::Call("dcir_prefetch_tensor_map".into(), vec![var(&a.param)]),
                Stmt::Call("dcir_prefetch_tensor_map".into(), vec![var(&b.param)]),
                unrolled(
                    "s",
                    c.stages,
                    vec![
                        Stmt::Call("dcir_mbar_init".into(), vec![full(var("s")), int(1)]),
                        Stmt::Call(
                            "dcir_mbar_init".into(),
                            vec![empty(var("s")), int(c.consumers() as i64)],
                        ),
                    ],
                ),
                Stmt::Call("dcir_mbar_init_fence".into(), vec![]),
            ],
        ),
        Stmt::Barrier,
    ];
    body.push(Stmt::Comment(
        "warpgroup 0 produces (one thread issues the copies), the others consume".into(),
    ));
    body.push(Stmt::IfElse(
        bin(BinOp::Eq, var("role"), int(0)),
        producer,
        consumer,
    ));

    for o in [&a, &b] {
        let param = params
            .iter_mut()
            .find(|q| q.name == o.param)
            .expect("a strided operand reads a kernel parameter");
        param.tensor_map = Some(o.map.clone());
    }
    let summary = format!(
        "{what}, wgmma + TMA (sm_90a), tile [{}, {}, {TK}], {} consumer warpgroup{} of {}x{}{}, {} stages, persistent over {}; A {}, B {}",
        c.tm,
        c.tn,
        c.consumers(),
        if c.consumers() == 1 { "" } else { "s" },
        64,
        c.wgmma_n(),
        if c.swapped {
            " (swapped: B's rows its M, A's its N)"
        } else {
            ""
        },
        c.stages,
        if split.splits == 1 {
            format!("{tiles} tiles")
        } else {
            format!("{tiles} tiles x {} k splits (split-K)", split.splits)
        },
        match a.copy {
            Copy::Im2col { .. } => "im2col of the NHWC input",
            _ if a.k_major() => "K-major",
            _ => "M-major",
        },
        match b.copy {
            Copy::Filter { .. } => "the KRSC filter",
            _ if b.k_major() => "K-major",
            _ => "N-major",
        },
    );
    Ok(Kernel {
        dynamic_shared: c.shared_bytes(),
        min_blocks_per_sm: 1,
        scratch,
        requires_arch: Some("sm_90a"),
        adapted: super::gemm_tc::adapted_blocking(
            g,
            op,
            [c.tm, c.tn, TK],
            c.stages,
            Some(c.threads()),
        ),
        ..l.kernel(
            op,
            summary,
            params,
            body,
            [c.threads(), split.units().min(PERSISTENT_BLOCKS)],
        )
    })
}
