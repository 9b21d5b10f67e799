//! The contract between the planner and a backend.
//!
//! A backend says which `fused` ops it lowers through [`Target::accept`];
//! the planner asks before it forms a group (the group built exactly as
//! [`crate::apply_plan`] would build it, alone in a graph of its own), and
//! checks every group of its final plan the same way. A group no backend
//! family accepts is therefore never formed, and the emitter never meets a
//! group it refuses.

use dcir_ir::{DType, Graph, OpId, OpKind};

/// Why a backend does not lower a group: the kernel family asked and what
/// it met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The kernel family that was asked (`gemm`, `elementwise`, ...).
    pub family: String,
    /// What the family does not lower.
    pub reason: Reason,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the {} kernels do not lower {} yet",
            self.family, self.reason
        )
    }
}

/// What a kernel family does not lower, in words a user reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// An op where it stands in the group.
    Op {
        /// The op.
        op: OpKind,
        /// Where it stands (`after the contraction (only elementwise
        /// epilogues)`, `in this group`).
        place: String,
    },
    /// An op on elements of a dtype the family has no code for.
    DType {
        /// The op.
        op: OpKind,
        /// Its elements' dtype.
        dtype: DType,
    },
    /// Several ops where the family lowers one.
    Count {
        /// The ops, plural (`reductions`, `matmuls`).
        what: &'static str,
        /// How many the group holds.
        found: usize,
    },
    /// A tensor of 2^31 elements or more (kernels index with `int`).
    TooLarge,
    /// Nothing to compute: a tensor with no elements.
    Empty,
    /// Kernel parameters the family cannot honour, as written.
    Parameters(String),
    /// More shared memory than a block may have.
    SharedMemory {
        /// The bytes the kernel would need.
        bytes: usize,
        /// What needs them (the tile, the head dims).
        detail: String,
    },
    /// A shape, layout or structure of the group the family does not lower.
    Form(String),
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Op { op, place } => write!(f, "`{}` {place}", op.name()),
            Reason::DType { op, dtype } => write!(f, "`{}` on {}", op.name(), dtype.name()),
            Reason::Count { what, found } => write!(f, "a group with {found} {what}"),
            Reason::TooLarge => f.write_str("more than 2^31 elements"),
            Reason::Empty => f.write_str("a group with no elements"),
            Reason::Parameters(p) => write!(f, "the parameters {p}"),
            Reason::SharedMemory { bytes, detail } => {
                write!(f, "{bytes} bytes of shared memory ({detail})")
            }
            Reason::Form(what) => f.write_str(what),
        }
    }
}

impl From<&str> for Reason {
    fn from(what: &str) -> Reason {
        Reason::Form(what.to_string())
    }
}

impl From<String> for Reason {
    fn from(what: String) -> Reason {
        Reason::Form(what)
    }
}

/// A backend's answer for a group it lowers: which of the planned
/// parameters it runs otherwise than written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    /// Each planned parameter the kernel does not run as written, in words
    /// (`tile = [128, 64, 32] runs as [128, 64, 16]`); empty when it runs
    /// the parameters the cost model priced.
    pub adapted: Vec<String>,
}

/// A backend the planner plans for.
pub trait Target {
    /// What the backend makes of `fused`, a `fused` op of `graph`: the
    /// parameters it honours, or why it does not lower the group.
    fn accept(&self, graph: &Graph, fused: OpId) -> Result<Accepted, Refusal>;
}

/// A target that accepts every group the legality rules form: for testing
/// the planner apart from any backend. Plans for it may not lower.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnyGroup;

impl Target for AnyGroup {
    fn accept(&self, _: &Graph, _: OpId) -> Result<Accepted, Refusal> {
        Ok(Accepted::default())
    }
}

/// The reach of the tensor-core attention kernel (`math = "tensor_core"` on
/// a whole GEMM → softmax → GEMM group), stated once for the cost model,
/// which offers such candidates only where this holds, and the CUDA
/// emitter, which refuses the rest: f16 or bf16 Q, K and V, head dims
/// multiples of 16 up to [`ATTENTION_TC_MAX_HEAD_DIM`], and `block = [bm,
/// bn]` with one warp per 16 query rows (`threads = 2·bm`, 1 to 8 warps) and
/// `bn` keys per step a multiple of 16 up to 128.
pub fn attention_tensor_core(
    dtype: DType,
    d: usize,
    dv: usize,
    block: [usize; 2],
    threads: usize,
) -> Result<(), Reason> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(Reason::Form(format!(
            "tensor-core attention on {} (f16 and bf16 are)",
            dtype.name()
        )));
    }
    let fits = |x: usize| x > 0 && x.is_multiple_of(16) && x <= ATTENTION_TC_MAX_HEAD_DIM;
    if !fits(d) || !fits(dv) {
        return Err(Reason::Form(format!(
            "tensor-core attention with head dims {d}/{dv} (multiples of 16 up to {ATTENTION_TC_MAX_HEAD_DIM})"
        )));
    }
    let [bm, bn] = block;
    let warps = bm / 16;
    if !bm.is_multiple_of(16)
        || !(1..=8).contains(&warps)
        || threads != 32 * warps
        || !bn.is_multiple_of(16)
        || !(16..=128).contains(&bn)
    {
        return Err(Reason::Parameters(format!(
            "block = [{bm}, {bn}], threads = {threads} (tensor-core attention: one warp per 16 query rows, keys in steps of 16 to 128)"
        )));
    }
    Ok(())
}

/// The k extent of one stage of the Hopper mainloop: one 128-byte swizzle
/// row of 16-bit elements.
pub const HOPPER_TK: usize = 64;

/// The Hopper mainloop's blocking, stated once for the cost model, which
/// offers and prices it, and the CUDA emitter, which lays its shared memory
/// out by it: `tm` (64, 128 or 192: one consumer warpgroup per 64 rows) ×
/// `tn` (32, or a multiple of 64 up to 256; at most 128 beside 192 rows)
/// output tiles, a ring of `stages` buffers of [`HOPPER_TK`]-wide k, each an
/// A and a B tile of 16-bit elements. Or, *swapped*, 256 × 64 tiles whose
/// operands trade places in the `wgmma`: the B tile's 64 rows its M, the A
/// tile's 256 its N, one consumer warpgroup (`m64n256k16`: per k step its
/// tensor cores read 40 KiB of shared memory for 2 MFLOP, where two
/// consumers of a 128 × 64 tile read 32 KiB for 1 MFLOP).
///
/// Dynamic shared memory, in order: 1024 bytes of slack to align the ring
/// to the swizzle's repeat, the ring, a full and an empty `mbarrier` per
/// stage, the epilogue's staging tile (`tm` rows of `tn + 8` elements), and
/// with split-K an arrival word per consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperBlocking {
    /// Rows of the output tile.
    pub tm: usize,
    /// Columns of the output tile.
    pub tn: usize,
    /// Buffers of the ring.
    pub stages: usize,
    /// Whether the k steps are split (the arrival words).
    pub split: bool,
    /// Whether the operands trade places in the `wgmma` (see the type).
    pub swapped: bool,
}

/// Bytes of one element the Hopper mainloop multiplies (f16 or bf16).
const HOPPER_ELEM: usize = 2;

/// Slack before the ring, which aligns it to the swizzle's 1024-byte repeat.
pub const HOPPER_RING_ALIGN: usize = 1024;

impl HopperBlocking {
    /// The blocking for attributes `tile` (`[tm, tn, _]`) and `stages` within
    /// `shared_limit` bytes of shared memory a block: `tm` 64 where it asks
    /// for 64 or less, 192 where it asks for more than 128 and `tn` is at most
    /// 128 (three consumers' accumulators fit their registers,
    /// [`Self::registers`], no wider), else 128; `tn` 32 where it asks for
    /// 32 or less and the B tile may be that narrow (`k_major[1]`: its k
    /// contiguous, one box of rows), else rounded up to a multiple of 64 in
    /// 64..=256; swapped 256 × 64 where it asks for 256 or more rows and 64
    /// or fewer columns of two K-major operands (`k_major`, A's and B's);
    /// `stages` clamped to 2..=6 and lowered while the blocking needs more
    /// than `shared_limit` (two stages may still: see [`Self::fits`]).
    pub fn new(
        tile: [i64; 3],
        stages: i64,
        split: bool,
        k_major: [bool; 2],
        shared_limit: usize,
    ) -> HopperBlocking {
        let swapped = tile[0] >= 256 && tile[1] <= 64 && k_major == [true, true];
        let tn = if swapped {
            64
        } else if tile[1] <= 32 && k_major[1] {
            32
        } else {
            (tile[1].clamp(64, 256) as usize).div_ceil(64) * 64
        };
        let tm = match tile[0] {
            _ if swapped => 256,
            ..=64 => 64,
            129.. if tn <= 128 => 192,
            _ => 128,
        };
        let mut blocking = HopperBlocking {
            tm,
            tn,
            stages: stages.clamp(2, 6) as usize,
            split,
            swapped,
        };
        while blocking.stages > 2 && !blocking.fits(shared_limit) {
            blocking.stages -= 1;
        }
        blocking
    }

    /// Whether the blocking's shared memory fits `shared_limit` bytes.
    pub fn fits(&self, shared_limit: usize) -> bool {
        self.shared_bytes() <= shared_limit
    }

    /// Consumer warpgroups: one per 64 rows, one swapped.
    pub fn consumers(&self) -> usize {
        if self.swapped { 1 } else { self.tm / 64 }
    }

    /// The N of a consumer's `wgmma`s (`m64nNk16`): `tn`, swapped `tm`.
    pub fn wgmma_n(&self) -> usize {
        if self.swapped { self.tm } else { self.tn }
    }

    /// f32 accumulators a consumer thread holds: `64 · N / 128`.
    pub fn accumulators(&self) -> usize {
        self.wgmma_n() / 2
    }

    /// Rows of the output tile a consumer stores: its 64, swapped all `tm`.
    pub fn consumer_rows(&self) -> usize {
        if self.swapped { self.tm } else { 64 }
    }

    /// Threads of a block: the producer warpgroup and the consumers.
    pub fn threads(&self) -> usize {
        128 * (1 + self.consumers())
    }

    /// Registers a thread is launched with: the register file (65,536) over
    /// the block's threads, in multiples of 8, at most 255.
    pub fn launch_registers(&self) -> usize {
        (65536 / self.threads() / 8 * 8).min(255)
    }

    /// Registers a thread of the producer and of each consumer take
    /// (`setmaxnreg`): the producer gives all but 40 up, the consumers share
    /// what the block holds, at most 232 each (multiples of 8). Launched at
    /// 65,536 / threads each, a block of two consumers splits 64,512 as 40 +
    /// 2 × 232, one of three 65,536 as 40 + 3 × 152.
    pub fn registers(&self) -> (usize, usize) {
        const PRODUCER: usize = 40;
        let block = self.launch_registers() * self.threads();
        let consumer = (block - 128 * PRODUCER) / (128 * self.consumers()) / 8 * 8;
        (PRODUCER, consumer.min(232))
    }

    /// Bytes of one stage of the ring: an A and a B tile.
    pub fn stage_bytes(&self) -> usize {
        (self.tm + self.tn) * HOPPER_TK * HOPPER_ELEM
    }

    /// Elements of a row of the epilogue's staging tile: `tn` and 8 of
    /// padding, so the 8 rows a warp's fragment stores touch differ in bank.
    pub fn staged_row_elems(&self) -> usize {
        self.tn + 8
    }

    /// Where the staging tile starts in dynamic shared memory: past the ring
    /// and its barriers wherever the alignment puts them.
    pub fn staging_offset(&self) -> usize {
        HOPPER_RING_ALIGN + self.stages * self.stage_bytes() + 16 * self.stages
    }

    /// Where the consumers' split-K arrival words start: past the staging
    /// tile.
    pub fn flags_offset(&self) -> usize {
        self.staging_offset() + self.tm * self.staged_row_elems() * HOPPER_ELEM
    }

    /// Bytes of dynamic shared memory a block takes.
    pub fn shared_bytes(&self) -> usize {
        self.flags_offset() + if self.split { 4 * self.consumers() } else { 0 }
    }
}

/// How the Hopper mainloop's implicit GEMM walks a convolution's k in its
/// 64-wide steps ([`hopper_conv_steps`]): the window's taps, each cut into
/// `slices` boxes of `channel_box` channels, walked in (tap, slice) order
/// `boxes_per_step` boxes a step. Box `b` is tap `b / slices` from channel
/// `(b % slices) · channel_box`; a last step with fewer boxes left (where
/// `boxes_per_step` does not divide `taps · slices`) fills the rest with
/// boxes at the last tap past the channels, which read zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperConvSteps {
    /// Channels of one copy (a TMA box `channel_box` 16-bit elements wide,
    /// swizzled in rows of twice as many bytes); channels past the input's
    /// read as zeros.
    pub channel_box: usize,
    /// Boxes of one step: `64 / channel_box`, side by side in k.
    pub boxes_per_step: usize,
    /// Boxes of one tap: `⌈channels / channel_box⌉`.
    pub slices: usize,
    /// Taps of the window.
    pub taps: usize,
    /// The k steps of the whole window.
    pub steps: usize,
}

impl HopperConvSteps {
    /// Whether the last step has boxes past the window's (see the type).
    pub fn tail(&self) -> bool {
        !(self.taps * self.slices).is_multiple_of(self.boxes_per_step)
    }
}

/// The k steps of the Hopper mainloop's implicit GEMM over a window of
/// `taps` taps of `channels` input channels (a multiple of 8), stated once
/// for the cost model, which prices that many steps, and the CUDA emitter,
/// which copies and multiplies them: the box width of 64 or 32 channels (16
/// for 16 or fewer: a space-to-depth stem's, 4 taps a step) that takes the
/// fewest steps, the wider one where they tie. 64-channel boxes waste a
/// step's half on 32 channels (a tap a step) or on 96 (two steps a tap);
/// 32-channel ones take two taps a step, or three taps in two steps.
pub fn hopper_conv_steps(channels: usize, taps: usize) -> HopperConvSteps {
    let with_box = |channel_box: usize| {
        let boxes_per_step = 64 / channel_box;
        let slices = channels.div_ceil(channel_box);
        HopperConvSteps {
            channel_box,
            boxes_per_step,
            slices,
            taps,
            steps: (taps * slices).div_ceil(boxes_per_step),
        }
    };
    [64, 32, 16]
        .into_iter()
        .filter(|&b| b != 16 || channels <= 16)
        .map(with_box)
        .fold(None, |best: Option<HopperConvSteps>, s| match best {
            Some(b) if b.steps <= s.steps => Some(b),
            _ => Some(s),
        })
        .expect("a 64-channel box is always offered")
}

/// Elements one vector access of a reduction row moves, stated once for the
/// cost model, which counts a row's lanes with it, and the CUDA emitter,
/// which loads and stores that many where `vector > 1`: 16 bytes of the
/// kernel's widest element (`widest_bytes`; 8 f16, 4 f32), halved until it
/// divides the row's length `len`.
pub fn vector_access_width(widest_bytes: usize, len: usize) -> usize {
    let mut width = 16 / widest_bytes.clamp(1, 16);
    while width > 1 && !len.is_multiple_of(width) {
        width /= 2;
    }
    width
}

/// Whether the pool kernel walks a pool's output in NHWC order, stated
/// once for the cost model, which prices the pool's reads in that order,
/// and the CUDA emitter: where the group does not store the pooled value
/// itself (`stored`) and its one user in the group (`users`) is a
/// `transpose {perm = [0, 2, 3, 1]}`, the `channels-last` form storing it
/// NHWC. Consecutive threads then take consecutive channels, so an input
/// read through the inverse transpose (an NHWC activation) coalesces.
pub fn pool_walks_nhwc(graph: &Graph, users: &[OpId], stored: bool) -> bool {
    !stored
        && matches!(users, [t] if graph.op(*t).kind == OpKind::Transpose
            && graph.op(*t).attrs.ints("perm") == Some(&[0, 2, 3, 1][..]))
}

/// The largest head dim the tensor-core attention kernel takes (its
/// accumulators and fragments live in registers).
pub const ATTENTION_TC_MAX_HEAD_DIM: usize = 128;
