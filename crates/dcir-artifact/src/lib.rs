//! A compiled dcir program, loadable without the compiler.
//!
//! An [`Artifact`] lists the kernels (CUDA source, PTX when compiled, launch
//! dimensions, parameters), the launches in execution order with the buffers
//! each binds, the buffers with their sizes and liveness (enough for a memory
//! plan), and the graph's input/output signature. It serializes to
//! `artifact.json`; [`Artifact::write_dir`] also writes each kernel's source
//! and PTX as `<name>.cu` / `<name>.ptx` beside it, for reading and diffing.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file name of the JSON part of an artifact directory.
pub const ARTIFACT_JSON: &str = "artifact.json";

/// A compiled program: kernels, launches, buffers and signature.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    /// The source graph's name.
    pub graph: String,
    /// The GPU architecture the PTX targets (`sm_90`).
    pub arch: String,
    /// The kernels, referenced by index from [`Launch::kernel`].
    pub kernels: Vec<KernelEntry>,
    /// The launches, in execution order.
    pub launches: Vec<Launch>,
    /// Every device buffer, referenced by [`Buffer::id`].
    pub buffers: Vec<Buffer>,
    /// The graph's parameters, in order: buffer ids.
    pub inputs: Vec<u32>,
    /// The graph's results, in order: buffer ids.
    pub outputs: Vec<u32>,
}

/// One kernel: its entry point, source, PTX and launch shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelEntry {
    /// The `extern "C"` entry point.
    pub name: String,
    /// CUDA C source (header-free; compiles with NVRTC alone).
    pub source: String,
    /// PTX from NVRTC, when the compiler was available.
    pub ptx: Option<String>,
    /// Machine code for the artifact's `arch`, kept in memory only (never
    /// written: a directory carries PTX): the runtime loads it first, which
    /// spares the driver's compilation of the PTX.
    #[serde(skip)]
    pub cubin: Option<Vec<u8>>,
    /// Threads per block (x, y, z).
    pub block: [u32; 3],
    /// Blocks per grid (x, y, z).
    pub grid: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub dynamic_shared: u32,
    /// The kernel's pointer parameters, in order.
    pub params: Vec<KernelParam>,
    /// A vendor library call instead of a CUDA kernel: the runtime calls the
    /// library with the bound buffers; `source` is empty, `ptx` absent and
    /// the launch shape zero.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<LibraryCall>,
    /// What it computes, in one line (`gemm (f16, tensor cores): ...`,
    /// `cuBLASLt f16 4096×3072×768, bias`), for reports such as
    /// `dcir-run --per-kernel`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub summary: String,
    /// The one architecture the kernel's machine code runs on, when it uses
    /// instructions of an architecture-specific target (`sm_90a`: `wgmma`,
    /// `setmaxnreg`); the runtime refuses it on any other GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_arch: Option<String>,
}

/// A call of a vendor library, bound like a kernel: its parameters are its
/// operands in [`LibraryCall::operands`] order, then its output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "library", rename_all = "snake_case")]
pub enum LibraryCall {
    /// A cuBLASLt matmul (`cublasLtMatmul`).
    Cublaslt(GemmCall),
    /// A cuDNN convolution (`cudnnConvolutionForward`, or with a bias
    /// `cudnnConvolutionBiasActivationForward`).
    Cudnn(ConvCall),
}

/// `out = act(conv(x, w) + z + bias)`, NCHW: `x` of `input`, `w` of
/// `filter` (`[k, c / groups, r, s]`), `out` and `z` of `output`, `bias` of
/// the `k` output channels; padding `pad` on both sides. f16 and bf16
/// accumulate in f32; f32 computes in strict f32 (no TF32).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvCall {
    /// Element dtype of every operand and of the output.
    pub dtype: String,
    /// `[n, c, h, w]`.
    pub input: [u64; 4],
    /// `[k, c / groups, r, s]`.
    pub filter: [u64; 4],
    /// `[n, k, oh, ow]`.
    pub output: [u64; 4],
    /// `[pad_h, pad_w]`, each on both sides.
    pub pad: [u64; 2],
    /// `[stride_h, stride_w]`.
    pub stride: [u64; 2],
    /// `[dilation_h, dilation_w]`.
    pub dilation: [u64; 2],
    /// Channel groups.
    pub groups: u64,
    /// A `z` operand of the output's shape is bound (after `x` and `w`).
    pub z: bool,
    /// A `bias` operand is bound (after `z`).
    pub bias: bool,
    /// The activation applied last: `none` or `relu`.
    pub activation: String,
    /// `x`, `z` and the output lie NHWC in memory (their dims above stay in
    /// NCHW order); the filter stays `[k, c / groups, r, s]` unless `krsc`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nhwc: bool,
    /// The filter lies `[k, r, s, c / groups]` in memory (KRSC; its dims
    /// above stay in KCRS order). Only with `nhwc`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub krsc: bool,
    /// cuDNN's forward algorithm (`cudnnConvolutionFwdAlgo_t`, 0 to 7)
    /// chosen on a GPU, replayed when cuDNN accepts it there; absent, the
    /// runtime asks cuDNN's heuristic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<u32>,
    /// Without a recorded `algorithm`, the heuristic's algorithm of this
    /// rank (0: its first choice; the tuner measures several).
    #[serde(default, skip_serializing_if = "is_first")]
    pub heuristic_rank: u32,
}

/// The ranks of a library heuristic's algorithms a call may name: its first
/// sixteen (the IR's `heuristic_rank` has the same range).
pub const HEURISTIC_RANKS: u32 = 16;

/// Whether a rank is the default, left out of the JSON.
fn is_first(rank: &u32) -> bool {
    *rank == 0
}

impl ConvCall {
    /// Why the call contradicts itself, if it does: extents outside
    /// `[1, 2^31)`, groups that do not divide the channels, an output that
    /// is not the convolution's, an epilogue cuDNN's fused call lacks.
    fn check(&self) -> Result<(), String> {
        let [n, c, h, w] = self.input;
        let [k, cg, r, s] = self.filter;
        let fits = |x: u64| (1..=i32::MAX as u64).contains(&x);
        let all = self.input.iter().chain(&self.filter).chain(&self.output);
        if !all.copied().all(fits) || !fits(self.groups) {
            return Err(format!(
                "a cuDNN call of extents {:?} {:?} {:?}",
                self.input, self.filter, self.output
            ));
        }
        let counted = [self.input, self.filter, self.output].iter().all(|d| {
            d.iter()
                .try_fold(1u64, |acc, &x| acc.checked_mul(x))
                .is_some()
        });
        if !counted {
            return Err("a cuDNN call of more elements than a u64 counts".into());
        }
        if self.algorithm.is_some_and(|a| a >= 8) {
            return Err(format!(
                "cuDNN forward algorithm {} (cudnnConvolutionFwdAlgo_t is 0 to 7)",
                self.algorithm.unwrap_or_default()
            ));
        }
        if self.heuristic_rank >= HEURISTIC_RANKS {
            return Err(format!(
                "cuDNN heuristic rank {} (at most {})",
                self.heuristic_rank,
                HEURISTIC_RANKS - 1
            ));
        }
        if c % self.groups != 0 || k % self.groups != 0 || cg * self.groups != c {
            return Err(format!(
                "a cuDNN call of {} groups over {c} and {k} channels",
                self.groups
            ));
        }
        let side = |size: u64, pad: u64, taps: u64, dilation: u64, stride: u64| {
            let span = dilation.checked_mul(taps - 1)?.checked_add(1)?;
            let padded = size.checked_add(pad.checked_mul(2)?)?;
            (padded >= span && stride > 0).then(|| (padded - span) / stride + 1)
        };
        let oh = side(h, self.pad[0], r, self.dilation[0], self.stride[0]);
        let ow = side(w, self.pad[1], s, self.dilation[1], self.stride[1]);
        if self.output != [n, k, oh.unwrap_or(0), ow.unwrap_or(0)] {
            return Err(format!(
                "a cuDNN call whose output {:?} is not its convolution's",
                self.output
            ));
        }
        if !matches!(self.activation.as_str(), "none" | "relu") {
            return Err(format!(
                "a cuDNN call with activation `{}`",
                self.activation
            ));
        }
        if !self.bias && (self.z || self.activation != "none") {
            return Err("a cuDNN call with an epilogue but no bias".into());
        }
        if self.krsc && !self.nhwc {
            return Err("a cuDNN call with a KRSC filter and NCHW tensors".into());
        }
        Ok(())
    }

    /// The elements of each bound buffer, in parameter order: x, w, then z
    /// and bias where bound, then the output.
    pub fn operand_elements(&self) -> Vec<u64> {
        let count = |d: &[u64; 4]| d.iter().product::<u64>();
        let mut v = vec![count(&self.input), count(&self.filter)];
        if self.z {
            v.push(count(&self.output));
        }
        if self.bias {
            v.push(self.output[1]);
        }
        v.push(count(&self.output));
        v
    }
}

/// `out = act(a · b + c + bias)` over row-major matrices: `batch` products
/// of `m × k` by `k × n` (`a` stored `k × m` when `transpose_a`, `b` stored
/// `n × k` when `transpose_b`), `c` of the output's shape, `bias` of `n`
/// elements added to every row. f16 and bf16 accumulate in f32; f32 computes
/// in strict f32 (never TF32).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmCall {
    /// Element dtype of every operand and of the output (`f32`, `f16`, `bf16`).
    pub dtype: String,
    /// Independent products.
    pub batch: u64,
    /// Output rows.
    pub m: u64,
    /// Output columns.
    pub n: u64,
    /// The contracted extent.
    pub k: u64,
    /// `a` is stored transposed.
    pub transpose_a: bool,
    /// `b` is stored transposed.
    pub transpose_b: bool,
    /// A `c` operand is bound (after `a` and `b`).
    pub c: bool,
    /// A `bias` operand is bound (after `c`).
    pub bias: bool,
    /// The activation applied last: `none`, `relu` or `gelu_tanh`.
    pub activation: String,
    /// cuBLASLt's algorithm chosen on a GPU (`cublasLtMatmulAlgo_t`'s
    /// opaque words), replayed when the library on the machine accepts it;
    /// absent, the runtime asks the library's heuristic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<Vec<u64>>,
    /// Without a recorded `algorithm`, the heuristic's algorithm of this
    /// rank (0: its first choice; the tuner measures several).
    #[serde(default, skip_serializing_if = "is_first")]
    pub heuristic_rank: u32,
}

impl GemmCall {
    /// The elements of each bound buffer, in parameter order: a, b, then c
    /// and bias where bound, then the output.
    pub fn operand_elements(&self) -> Vec<u64> {
        let (b, m, n, k) = (self.batch, self.m, self.n, self.k);
        let mut v = vec![b * m * k, b * k * n];
        if self.c {
            v.push(b * m * n);
        }
        if self.bias {
            v.push(n);
        }
        v.push(b * m * n);
        v
    }
}

impl LibraryCall {
    /// What the call needs of its bound buffers: (dtype, elements) each, in
    /// parameter order; `Err` for a call that contradicts itself.
    pub fn operands(&self) -> Result<Vec<(&str, u64)>, String> {
        match self {
            LibraryCall::Cublaslt(g) => {
                if !matches!(g.dtype.as_str(), "f32" | "f16" | "bf16") {
                    return Err(format!("a cuBLASLt call of dtype `{}`", g.dtype));
                }
                if !matches!(g.activation.as_str(), "none" | "relu" | "gelu_tanh") {
                    return Err(format!(
                        "a cuBLASLt call with activation `{}`",
                        g.activation
                    ));
                }
                // Every extent a positive `int` and every product of two and
                // the batch inside u64 (2^31 cubed is 2^93: checked).
                let fits = |x: u64| (1..=i32::MAX as u64).contains(&x);
                let largest = g.m.max(g.n).max(g.k);
                let products_fit = g
                    .batch
                    .checked_mul(largest)
                    .and_then(|x| x.checked_mul(largest))
                    .is_some();
                if ![g.batch, g.m, g.n, g.k].into_iter().all(fits) || !products_fit {
                    return Err(format!(
                        "a cuBLASLt call of extents batch {} m {} n {} k {}",
                        g.batch, g.m, g.n, g.k
                    ));
                }
                if g.algorithm.as_ref().is_some_and(|a| a.len() != 8) {
                    return Err("a cuBLASLt algorithm of other than 8 words".into());
                }
                if g.heuristic_rank >= HEURISTIC_RANKS {
                    return Err(format!(
                        "cuBLASLt heuristic rank {} (at most {})",
                        g.heuristic_rank,
                        HEURISTIC_RANKS - 1
                    ));
                }
                Ok(g.operand_elements()
                    .into_iter()
                    .map(|e| (g.dtype.as_str(), e))
                    .collect())
            }
            LibraryCall::Cudnn(c) => {
                if !matches!(c.dtype.as_str(), "f32" | "f16" | "bf16") {
                    return Err(format!("a cuDNN call of dtype `{}`", c.dtype));
                }
                c.check()?;
                Ok(c.operand_elements()
                    .into_iter()
                    .map(|e| (c.dtype.as_str(), e))
                    .collect())
            }
        }
    }
}

/// A kernel parameter: a pointer to a buffer of one dtype.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelParam {
    /// Parameter name in the source.
    pub name: String,
    /// Element dtype (`f32`, `f16`, `bf16`, `i32`, `i64`, `bool`).
    pub dtype: String,
    /// Whether the kernel writes through it.
    pub output: bool,
    /// Passed as a TMA descriptor of the bound buffer (a `CUtensorMap` the
    /// runtime encodes at load, by value) instead of its address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_map: Option<TensorMap>,
}

/// A TMA descriptor over a buffer: the tensor at `offset` bytes into the
/// buffer, `dims` elements per dimension (innermost first) with `strides`
/// bytes between consecutive indices of every dimension but the innermost
/// (which is contiguous), copied into shared memory swizzled in
/// `swizzle`-byte rows. Tiled (`cuTensorMapEncodeTiled`): boxes of
/// `box_dims` elements. With [`Im2col`] (`cuTensorMapEncodeIm2col`): a
/// column of pixels of an `[N, (D,) H, W, C]` tensor, `box_dims` then being
/// `[channels per pixel, pixels per column]`. Reads outside `dims` fill
/// zeros.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMap {
    /// Byte offset of element 0 in the buffer (a multiple of 16).
    pub offset: u64,
    /// Elements per dimension, innermost first (1 to 5 dimensions).
    pub dims: Vec<u64>,
    /// Byte strides of dimensions 1.. (multiples of 16).
    pub strides: Vec<u64>,
    /// Box extents per dimension (1 to 256 each).
    pub box_dims: Vec<u32>,
    /// Shared-memory swizzle in bytes: 0 (none), 32, 64 or 128; the box's
    /// innermost extent spans at most that many bytes.
    pub swizzle: u32,
    /// Im2col mode: the window the pixel column walks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub im2col: Option<Im2col>,
}

/// The walk of an im2col tensor map (a convolution's input, NHWC): a copy
/// at coordinates `(c, w, h, n)` with offsets `(ow, oh)` reads `box_dims[1]`
/// pixels, `box_dims[0]` channels each, the first at `(w + ow, h + oh)` of
/// image `n`; each next pixel's window origin steps `element_strides` along
/// W, wrapping to the next row past `upper`, to the next image past the last
/// row, and starting rows and images at `lower`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Im2col {
    /// Per spatial dimension (innermost first: W, H), the first window
    /// origin relative to index 0 (minus the padding).
    pub lower: Vec<i32>,
    /// Per spatial dimension, the last window origin relative to the last
    /// index (`(out - 1) · stride - pad - (in - 1)`).
    pub upper: Vec<i32>,
    /// The traversal stride of every dimension, innermost first (the
    /// convolution's strides on the spatial ones, 1 on C and N; 1 to 8).
    pub element_strides: Vec<u32>,
}

impl TensorMap {
    /// Checks the descriptor against the rules of `cuTensorMapEncodeTiled`
    /// (or `cuTensorMapEncodeIm2col`) for elements of `elem` bytes over a
    /// buffer of `bytes` bytes.
    pub fn check(&self, elem: u64, bytes: u64) -> Result<(), String> {
        let rank = self.dims.len();
        let boxes = if self.im2col.is_some() { 2 } else { rank };
        if !(1..=5).contains(&rank)
            || self.strides.len() != rank - 1
            || self.box_dims.len() != boxes
        {
            return Err(format!(
                "{rank} dims, {} strides and {} box extents (1 to 5 dims, one stride fewer, a box extent per dim; an im2col map's box is its channels and pixels)",
                self.strides.len(),
                self.box_dims.len()
            ));
        }
        if !self.offset.is_multiple_of(16) || self.strides.iter().any(|s| !s.is_multiple_of(16)) {
            return Err("an offset or stride that is not a multiple of 16 bytes".into());
        }
        if self.dims.contains(&0) {
            return Err("an empty dimension".into());
        }
        match &self.im2col {
            None => {
                if self.box_dims.iter().any(|&b| !(1..=256).contains(&b)) {
                    return Err("a box extent outside 1..=256".into());
                }
            }
            Some(im) => {
                let spatial = rank.saturating_sub(2);
                if !(3..=5).contains(&rank)
                    || im.lower.len() != spatial
                    || im.upper.len() != spatial
                    || im.element_strides.len() != rank
                {
                    return Err(format!(
                        "an im2col map of {rank} dims with {} lower and {} upper corners and {} element strides (3 to 5 dims, a corner per spatial dim, a stride per dim)",
                        im.lower.len(),
                        im.upper.len(),
                        im.element_strides.len(),
                    ));
                }
                // The corners' range narrows as spatial dims are added.
                let bound: i32 = match spatial {
                    1 => 1 << 15,
                    2 => 1 << 7,
                    _ => 1 << 4,
                };
                if im
                    .lower
                    .iter()
                    .chain(&im.upper)
                    .any(|&c| !(-bound..bound).contains(&c))
                {
                    return Err(format!("an im2col corner outside {}..{bound}", -bound));
                }
                if im.element_strides.iter().any(|&s| !(1..=8).contains(&s)) {
                    return Err("an element stride outside 1..=8".into());
                }
                if !(1..=256).contains(&self.box_dims[0]) || !(1..=1024).contains(&self.box_dims[1])
                {
                    return Err("im2col channels outside 1..=256 or pixels outside 1..=1024".into());
                }
            }
        }
        if !matches!(self.swizzle, 0 | 32 | 64 | 128)
            || (self.swizzle > 0 && u64::from(self.box_dims[0]) * elem > u64::from(self.swizzle))
        {
            return Err(format!(
                "swizzle {} with a box row of {} bytes",
                self.swizzle,
                u64::from(self.box_dims[0]) * elem
            ));
        }
        // One past the last byte read: every dimension at its last index.
        let mut last = (self.dims[0] - 1).checked_mul(elem);
        for (&s, &d) in self.strides.iter().zip(&self.dims[1..]) {
            last = last.and_then(|l| l.checked_add((d - 1).checked_mul(s)?));
        }
        let last = last.and_then(|l| l.checked_add(self.offset)?.checked_add(elem));
        if last.is_none_or(|end| end > bytes) {
            return Err(format!("it reaches past the buffer's {bytes} bytes"));
        }
        Ok(())
    }
}

/// One kernel launch and the buffers bound to its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// What the launch computes: the group's kernel name (launches of one
    /// shared kernel entry differ here).
    #[serde(default)]
    pub name: String,
    /// Index into [`Artifact::kernels`].
    pub kernel: u32,
    /// Buffer id of each kernel parameter, in parameter order.
    pub args: Vec<u32>,
}

/// What a buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// A graph parameter (activations and weights alike: the IR does not
    /// tell them apart).
    Input,
    /// A graph result.
    Output,
    /// A constant of the graph too large to inline into kernels; its bytes
    /// are in [`Buffer::data`] and are uploaded once.
    Constant,
    /// A value produced and consumed by launches only.
    Intermediate,
    /// Scratch of one launch that must read zero when the launch starts
    /// (split-K's arrival counters): allocated on its own and zeroed once;
    /// the kernels that use it leave it zeroed.
    Zeroed,
}

/// A device buffer with its liveness over the launches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// The id launches refer to.
    pub id: u32,
    /// The IR value's name (for scratch, `<kernel>.<parameter>`), for diagnostics.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Element dtype.
    pub dtype: String,
    /// Dims, row-major.
    pub shape: Vec<u64>,
    /// The buffer whose storage this one shares (a reshape: same bytes, other
    /// dims; a concat's operand: its slice of the concat); liveness and
    /// memory plans apply to that root buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_of: Option<u32>,
    /// Where a view starts in its root, in bytes (0 for a reshape).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub view_offset: u64,
    /// Index of the first launch that uses it (`None` if none does).
    pub first_use: Option<u32>,
    /// Index of the last launch that uses it.
    pub last_use: Option<u32>,
    /// What it holds.
    pub kind: BufferKind,
    /// A constant's contents: its elements little-endian, row-major.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Vec<u8>>,
}

/// Bytes per element of a buffer dtype (`u8` for scratch).
fn dtype_size(dtype: &str) -> Option<u64> {
    match dtype {
        "f32" | "i32" => Some(4),
        "f16" | "bf16" => Some(2),
        "i64" => Some(8),
        "bool" | "u8" => Some(1),
        _ => None,
    }
}

/// True for 0 (a reshape view's offset, left out of the JSON).
fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// Why an artifact could not be read or written.
#[derive(Debug)]
pub enum ArtifactError {
    /// A file could not be read or written.
    Io(String, std::io::Error),
    /// The JSON did not describe an artifact.
    Json(serde_json::Error),
    /// The artifact contradicts itself (an index out of range, a view past
    /// its root, sizes that disagree): an edited or corrupt file.
    Invalid(String),
}

impl std::fmt::Display for ArtifactError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArtifactError::Io(path, e) => write!(f, "{path}: {e}"),
            ArtifactError::Json(e) => write!(f, "bad artifact JSON: {e}"),
            ArtifactError::Invalid(why) => write!(f, "invalid artifact: {why}"),
        }
    }
}

impl std::error::Error for ArtifactError {}

impl Artifact {
    /// The artifact as pretty-printed JSON (deterministic: fields in declaration order).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("an artifact always serializes")
    }

    /// Reads an artifact from its JSON and [validates](Artifact::validate) it.
    pub fn from_json(text: &str) -> Result<Artifact, ArtifactError> {
        let artifact: Artifact = serde_json::from_str(text).map_err(ArtifactError::Json)?;
        artifact.validate().map_err(ArtifactError::Invalid)?;
        Ok(artifact)
    }

    /// Checks what the runtime relies on: buffer `i` has id `i`; a view's
    /// root is a buffer that is no view and holds the view's bytes; every
    /// buffer's bytes are its shape's elements times its dtype's size, and a
    /// constant's data is that long; every launch names a kernel and binds
    /// one existing buffer per kernel parameter; inputs and outputs name
    /// existing buffers. The builder's artifacts pass; a failure names the
    /// first contradiction.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.buffers.len();
        for (i, b) in self.buffers.iter().enumerate() {
            if b.id as usize != i {
                return Err(format!("buffer {i} (`{}`) has id {}", b.name, b.id));
            }
            let size = dtype_size(&b.dtype)
                .ok_or_else(|| format!("buffer `{}` has an unknown dtype `{}`", b.name, b.dtype))?;
            let bytes = b
                .shape
                .iter()
                .try_fold(size, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| format!("buffer `{}`: the size of its shape overflows", b.name))?;
            if bytes != b.bytes {
                return Err(format!(
                    "buffer `{}` has {} bytes for {} × {:?} ({bytes})",
                    b.name, b.bytes, b.dtype, b.shape
                ));
            }
            if let Some(data) = &b.data
                && data.len() as u64 != b.bytes
            {
                return Err(format!(
                    "constant `{}` has {} bytes of data for {} bytes",
                    b.name,
                    data.len(),
                    b.bytes
                ));
            }
            if let Some(root) = b.view_of {
                let r = self
                    .buffers
                    .get(root as usize)
                    .ok_or_else(|| format!("buffer `{}` views buffer {root}, of {n}", b.name))?;
                let end = b.view_offset.checked_add(b.bytes);
                if r.view_of.is_some() || end.is_none_or(|end| end > r.bytes) {
                    return Err(format!(
                        "buffer `{}` views bytes {}.. of `{}` ({} bytes), which is a view or too small",
                        b.name, b.view_offset, r.name, r.bytes
                    ));
                }
            }
        }
        for (i, l) in self.launches.iter().enumerate() {
            let k = self.kernels.get(l.kernel as usize).ok_or_else(|| {
                format!(
                    "launch {i} names kernel {}, of {}",
                    l.kernel,
                    self.kernels.len()
                )
            })?;
            if l.args.len() != k.params.len() {
                return Err(format!(
                    "launch {i} binds {} buffers to kernel `{}` of {} parameters",
                    l.args.len(),
                    k.name,
                    k.params.len()
                ));
            }
            if let Some(&a) = l.args.iter().find(|&&a| a as usize >= n) {
                return Err(format!("launch {i} binds buffer {a}, of {n}"));
            }
            for (p, &a) in k.params.iter().zip(&l.args) {
                if let Some(map) = &p.tensor_map {
                    let b = &self.buffers[a as usize];
                    let elem = dtype_size(&b.dtype).unwrap_or(1);
                    map.check(elem, b.bytes).map_err(|e| {
                        format!(
                            "launch {i}: the tensor map of `{}` over `{}`: {e}",
                            p.name, b.name
                        )
                    })?;
                }
            }
            if let Some(call) = &k.library {
                let wanted = call
                    .operands()
                    .map_err(|e| format!("kernel `{}`: {e}", k.name))?;
                if wanted.len() != k.params.len() {
                    return Err(format!(
                        "kernel `{}` calls a library with {} operands through {} parameters",
                        k.name,
                        wanted.len(),
                        k.params.len()
                    ));
                }
                for (&a, (dtype, elements)) in l.args.iter().zip(wanted) {
                    let b = &self.buffers[a as usize];
                    let bytes = dtype_size(dtype).map(|s| s.saturating_mul(elements));
                    if b.dtype != dtype || bytes != Some(b.bytes) {
                        return Err(format!(
                            "launch {i} binds `{}` ({} bytes of {}) where its library call reads {elements} elements of {dtype}",
                            b.name, b.bytes, b.dtype
                        ));
                    }
                }
            }
        }
        for (what, ids) in [("input", &self.inputs), ("output", &self.outputs)] {
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= n) {
                return Err(format!("an {what} is buffer {id}, of {n}"));
            }
        }
        Ok(())
    }

    /// Writes `artifact.json` and each kernel's `<name>.cu` (and `<name>.ptx`
    /// when compiled; a library call has neither) into `dir`, creating it.
    pub fn write_dir(&self, dir: &Path) -> Result<(), ArtifactError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |e| ArtifactError::Io(path, e)
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        self.remove_stale_kernels(dir)?;
        for kernel in self.kernels.iter().filter(|k| k.library.is_none()) {
            let cu = dir.join(format!("{}.cu", kernel.name));
            std::fs::write(&cu, &kernel.source).map_err(io(&cu))?;
            if let Some(ptx) = &kernel.ptx {
                let file = dir.join(format!("{}.ptx", kernel.name));
                std::fs::write(&file, ptx).map_err(io(&file))?;
            }
        }
        let json = dir.join(ARTIFACT_JSON);
        std::fs::write(&json, self.to_json()).map_err(io(&json))
    }

    /// Removes the kernel files an artifact already in `dir` wrote that this
    /// one does not (an artifact owns `artifact.json` and the `.cu`/`.ptx`
    /// files its kernels name; nothing else in `dir` is touched). A
    /// `artifact.json` that cannot be read as an artifact is an error: what
    /// it owns is unknown.
    fn remove_stale_kernels(&self, dir: &Path) -> Result<(), ArtifactError> {
        let json = dir.join(ARTIFACT_JSON);
        let text = match std::fs::read_to_string(&json) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ArtifactError::Io(json.display().to_string(), e)),
        };
        // Only the kernel names are read, so an artifact of another version
        // is cleaned too.
        #[derive(Deserialize)]
        struct Named {
            name: String,
        }
        #[derive(Deserialize)]
        struct Kernels {
            kernels: Vec<Named>,
        }
        let old: Kernels = serde_json::from_str(&text).map_err(|e| {
            ArtifactError::Invalid(format!(
                "{} cannot be read as an artifact ({e}), so what it owns is unknown; remove it or write to another directory",
                json.display()
            ))
        })?;
        for name in old.kernels.iter().map(|k| &k.name) {
            if self.kernels.iter().any(|k| &k.name == name) || name.contains(['/', '\\']) {
                continue;
            }
            for ext in ["cu", "ptx"] {
                let file = dir.join(format!("{name}.{ext}"));
                match std::fs::remove_file(&file) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(ArtifactError::Io(file.display().to_string(), e));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Reads an artifact written by [`Artifact::write_dir`].
    pub fn read_dir(dir: &Path) -> Result<Artifact, ArtifactError> {
        let json = dir.join(ARTIFACT_JSON);
        let text = std::fs::read_to_string(&json)
            .map_err(|e| ArtifactError::Io(json.display().to_string(), e))?;
        Artifact::from_json(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Artifact {
        Artifact {
            graph: "g".into(),
            arch: "sm_90".into(),
            kernels: vec![KernelEntry {
                summary: String::new(),
                name: "g0".into(),
                source: "extern \"C\" __global__ void g0() {}\n".into(),
                ptx: Some(".version 9.0\n".into()),
                cubin: None,
                block: [128, 1, 1],
                grid: [4, 1, 1],
                dynamic_shared: 0,
                params: vec![KernelParam {
                    name: "x".into(),
                    dtype: "f32".into(),
                    output: false,
                    tensor_map: None,
                }],
                library: None,
                requires_arch: None,
            }],
            launches: vec![Launch {
                name: "g0".into(),
                kernel: 0,
                args: vec![0],
            }],
            buffers: vec![Buffer {
                id: 0,
                name: "x".into(),
                bytes: 64,
                dtype: "f32".into(),
                shape: vec![4, 4],
                view_of: None,
                view_offset: 0,
                first_use: Some(0),
                last_use: Some(0),
                kind: BufferKind::Input,
                data: None,
            }],
            inputs: vec![0],
            outputs: vec![],
        }
    }

    #[test]
    fn json_round_trip() {
        let a = sample();
        assert_eq!(Artifact::from_json(&a.to_json()).unwrap(), a);
    }

    #[test]
    fn dir_round_trip() {
        let dir = std::env::temp_dir().join(format!("dcir-artifact-{}", std::process::id()));
        let a = sample();
        a.write_dir(&dir).unwrap();
        assert!(dir.join("g0.cu").exists() && dir.join("g0.ptx").exists());
        assert_eq!(Artifact::read_dir(&dir).unwrap(), a);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Writing into a directory that holds an older artifact removes the
    /// kernel files only the older one had, and nothing else.
    #[test]
    fn rewriting_a_directory_removes_stale_kernels() {
        let dir = std::env::temp_dir().join(format!("dcir-artifact-stale-{}", std::process::id()));
        let mut two = sample();
        let mut other = two.kernels[0].clone();
        other.name = "g1".into();
        two.kernels.push(other);
        two.write_dir(&dir).unwrap();
        std::fs::write(dir.join("notes.txt"), "mine").unwrap();
        assert!(dir.join("g1.cu").exists() && dir.join("g1.ptx").exists());
        sample().write_dir(&dir).unwrap();
        assert!(!dir.join("g1.cu").exists() && !dir.join("g1.ptx").exists());
        assert!(dir.join("g0.cu").exists() && dir.join("notes.txt").exists());
        assert_eq!(Artifact::read_dir(&dir).unwrap(), sample());
        // A directory whose artifact.json is something else is refused.
        std::fs::write(dir.join(ARTIFACT_JSON), "{\"model\": 1}").unwrap();
        let e = sample().write_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("cannot be read as an artifact"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_json_is_an_error() {
        assert!(Artifact::from_json("{").is_err());
        let json = sample().to_json();
        let truncated = &json[..json.len() / 2];
        assert!(matches!(
            Artifact::from_json(truncated),
            Err(ArtifactError::Json(_))
        ));
    }

    /// Each edit the runtime would index past or misread is refused, naming it.
    #[test]
    fn an_edited_artifact_is_refused() {
        type Edit = fn(&mut Artifact);
        let edits: [(Edit, &str); 8] = [
            (|a| a.buffers[0].id = 3, "buffer 0 (`x`) has id 3"),
            (|a| a.buffers[0].bytes = 60, "buffer `x` has 60 bytes"),
            (|a| a.buffers[0].dtype = "f8".into(), "unknown dtype `f8`"),
            (|a| a.buffers[0].view_of = Some(7), "views buffer 7, of 1"),
            (
                |a| a.launches[0].kernel = 2,
                "launch 0 names kernel 2, of 1",
            ),
            (
                |a| a.launches[0].args = vec![0, 0],
                "binds 2 buffers to kernel `g0` of 1",
            ),
            (
                |a| a.launches[0].args = vec![5],
                "launch 0 binds buffer 5, of 1",
            ),
            (|a| a.outputs = vec![1], "an output is buffer 1, of 1"),
        ];
        for (edit, says) in edits {
            let mut a = sample();
            edit(&mut a);
            match Artifact::from_json(&a.to_json()) {
                Err(ArtifactError::Invalid(why)) => assert!(why.contains(says), "{why}"),
                other => panic!("{says}: {other:?}"),
            }
        }
        let mut a = sample();
        a.buffers[0].data = Some(vec![0; 3]);
        assert!(
            a.validate()
                .unwrap_err()
                .contains("3 bytes of data for 64 bytes")
        );
    }

    /// A tensor map that `cuTensorMapEncodeTiled` would refuse, or that reads
    /// past its buffer, is refused naming the rule.
    #[test]
    fn a_bad_tensor_map_is_refused() {
        // `x` is 4 × 4 f32 (64 bytes): rows of 16 bytes.
        let good = TensorMap {
            offset: 0,
            dims: vec![4, 4],
            strides: vec![16],
            box_dims: vec![4, 2],
            swizzle: 0,
            im2col: None,
        };
        // As an im2col map: 4 channels × 2 pixels × 2 rows, a pixel a copy.
        let im2col = TensorMap {
            dims: vec![4, 2, 2],
            strides: vec![16, 32],
            box_dims: vec![4, 1],
            im2col: Some(Im2col {
                lower: vec![-1],
                upper: vec![0],
                element_strides: vec![1, 2, 1],
            }),
            ..good.clone()
        };
        type Edit = fn(&mut TensorMap);
        let cases: [(&TensorMap, Edit, &str); 11] = [
            (&good, |_| {}, ""),
            (&good, |m| m.offset = 8, "multiple of 16 bytes"),
            (&good, |m| m.strides = vec![20], "multiple of 16 bytes"),
            (&good, |m| m.box_dims = vec![4, 300], "outside 1..=256"),
            (&good, |m| m.swizzle = 16, "swizzle 16"),
            (&good, |m| m.dims = vec![4, 5], "past the buffer's 64 bytes"),
            (&im2col, |_| {}, ""),
            (
                &im2col,
                |m| m.box_dims = vec![4, 1, 1],
                "channels and pixels",
            ),
            (
                &im2col,
                |m| m.im2col.as_mut().unwrap().upper = vec![0, 0],
                "a corner per spatial dim",
            ),
            (
                &im2col,
                |m| m.im2col.as_mut().unwrap().lower = vec![-40000],
                "corner outside",
            ),
            (
                &im2col,
                |m| m.im2col.as_mut().unwrap().element_strides[1] = 9,
                "element stride outside",
            ),
        ];
        for (good, edit, says) in cases {
            let mut a = sample();
            let mut map = good.clone();
            edit(&mut map);
            a.kernels[0].params[0].tensor_map = Some(map);
            match (a.validate(), says) {
                (Ok(()), "") => {}
                (Err(why), _) if !says.is_empty() => {
                    assert!(
                        why.contains(says) && why.contains("tensor map of `x`"),
                        "{why}"
                    )
                }
                (other, _) => panic!("{says}: {other:?}"),
            }
        }
    }

    /// `x[2,4] · w[4,3] + bias[3]` as one cuBLASLt call of f16.
    fn library_sample() -> Artifact {
        let buffer = |id: u32, name: &str, shape: Vec<u64>, kind| Buffer {
            id,
            name: name.into(),
            bytes: 2 * shape.iter().product::<u64>(),
            dtype: "f16".into(),
            shape,
            view_of: None,
            view_offset: 0,
            first_use: Some(0),
            last_use: Some(0),
            kind,
            data: None,
        };
        let param = |name: &str, output| KernelParam {
            name: name.into(),
            dtype: "f16".into(),
            output,
            tensor_map: None,
        };
        Artifact {
            graph: "linear".into(),
            arch: "sm_90".into(),
            kernels: vec![KernelEntry {
                summary: String::new(),
                name: "linear_g0".into(),
                source: String::new(),
                ptx: None,
                cubin: None,
                block: [0; 3],
                grid: [0; 3],
                dynamic_shared: 0,
                params: vec![
                    param("a", false),
                    param("b", false),
                    param("bias", false),
                    param("out", true),
                ],
                library: Some(LibraryCall::Cublaslt(GemmCall {
                    dtype: "f16".into(),
                    batch: 1,
                    m: 2,
                    n: 3,
                    k: 4,
                    transpose_a: false,
                    transpose_b: false,
                    c: false,
                    bias: true,
                    activation: "relu".into(),
                    algorithm: Some(vec![1, 2, 3, 4, 5, 6, 7, 8]),
                    heuristic_rank: 2,
                })),
                requires_arch: None,
            }],
            launches: vec![Launch {
                name: "linear_g0".into(),
                kernel: 0,
                args: vec![0, 1, 2, 3],
            }],
            buffers: vec![
                buffer(0, "x", vec![2, 4], BufferKind::Input),
                buffer(1, "w", vec![4, 3], BufferKind::Input),
                buffer(2, "b", vec![3], BufferKind::Input),
                buffer(3, "y", vec![2, 3], BufferKind::Output),
            ],
            inputs: vec![0, 1, 2],
            outputs: vec![3],
        }
    }

    #[test]
    fn a_library_call_round_trips() {
        let a = library_sample();
        assert_eq!(Artifact::from_json(&a.to_json()).unwrap(), a);
        let dir = std::env::temp_dir().join(format!("dcir-artifact-lib-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        a.write_dir(&dir).unwrap();
        assert_eq!(Artifact::read_dir(&dir).unwrap(), a);
        // A library call has no source to write.
        assert!(!dir.join("linear_g0.cu").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A library call the runtime would misread is refused, naming it.
    #[test]
    fn an_edited_library_call_is_refused() {
        type Edit = fn(&mut Artifact);
        fn call(a: &mut Artifact) -> &mut GemmCall {
            match a.kernels[0].library.as_mut().unwrap() {
                LibraryCall::Cublaslt(g) => g,
                LibraryCall::Cudnn(_) => unreachable!("the sample calls cuBLASLt"),
            }
        }
        let edits: [(Edit, &str); 7] = [
            (
                |a| call(a).k = 5,
                "binds `x` (16 bytes of f16) where its library call reads 10 elements",
            ),
            (
                |a| call(a).bias = false,
                "with 3 operands through 4 parameters",
            ),
            (
                |a| call(a).dtype = "i32".into(),
                "a cuBLASLt call of dtype `i32`",
            ),
            (
                |a| call(a).activation = "swish".into(),
                "activation `swish`",
            ),
            (|a| call(a).m = 1 << 40, "extents batch 1 m 1099511627776"),
            (|a| call(a).algorithm = Some(vec![1]), "other than 8 words"),
            (|a| call(a).heuristic_rank = 16, "heuristic rank 16"),
        ];
        for (edit, says) in edits {
            let mut a = library_sample();
            edit(&mut a);
            match Artifact::from_json(&a.to_json()) {
                Err(ArtifactError::Invalid(why)) => assert!(why.contains(says), "{says}: {why}"),
                other => panic!("{says}: {other:?}"),
            }
        }
    }

    /// A 3x3 convolution with bias, residual and ReLU as one cuDNN call:
    /// `x[2,4,8,8] * w[6,4,3,3]`, pad 1.
    fn conv_sample() -> Artifact {
        let mut a = library_sample();
        let call = ConvCall {
            dtype: "f16".into(),
            input: [2, 4, 8, 8],
            filter: [6, 4, 3, 3],
            output: [2, 6, 8, 8],
            pad: [1, 1],
            stride: [1, 1],
            dilation: [1, 1],
            groups: 1,
            z: true,
            bias: true,
            activation: "relu".into(),
            algorithm: Some(1),
            heuristic_rank: 1,
            nhwc: false,
            krsc: false,
        };
        let shapes: [Vec<u64>; 5] = [
            vec![2, 4, 8, 8],
            vec![6, 4, 3, 3],
            vec![2, 6, 8, 8],
            vec![6],
            vec![2, 6, 8, 8],
        ];
        a.buffers = shapes
            .into_iter()
            .enumerate()
            .map(|(i, shape)| Buffer {
                id: i as u32,
                name: format!("v{i}"),
                bytes: 2 * shape.iter().product::<u64>(),
                dtype: "f16".into(),
                shape,
                view_of: None,
                view_offset: 0,
                first_use: Some(0),
                last_use: Some(0),
                kind: if i == 4 {
                    BufferKind::Output
                } else {
                    BufferKind::Input
                },
                data: None,
            })
            .collect();
        let mut params = a.kernels[0].params.clone();
        params.insert(2, params[0].clone());
        a.kernels[0].params = params;
        a.kernels[0].library = Some(LibraryCall::Cudnn(call));
        a.launches[0].args = vec![0, 1, 2, 3, 4];
        a.inputs = vec![0, 1, 2, 3];
        a.outputs = vec![4];
        a
    }

    #[test]
    fn a_conv_call_round_trips_and_edits_are_refused() {
        let a = conv_sample();
        assert_eq!(Artifact::from_json(&a.to_json()).unwrap(), a);
        type Edit = fn(&mut ConvCall);
        let edits: [(Edit, &str); 9] = [
            (|c| c.algorithm = Some(8), "algorithm 8"),
            (|c| c.heuristic_rank = 16, "heuristic rank 16"),
            (
                |c| c.pad = [0, 0],
                "output [2, 6, 8, 8] is not its convolution's",
            ),
            (|c| c.groups = 3, "3 groups over 4 and 6 channels"),
            (|c| c.activation = "gelu".into(), "activation `gelu`"),
            (|c| c.bias = false, "an epilogue but no bias"),
            (|c| c.input = [1 << 40, 4, 8, 8], "extents"),
            (|c| c.dtype = "i64".into(), "dtype `i64`"),
            (|c| c.krsc = true, "a KRSC filter and NCHW tensors"),
        ];
        for (edit, says) in edits {
            let mut a = conv_sample();
            match a.kernels[0].library.as_mut().unwrap() {
                LibraryCall::Cudnn(c) => edit(c),
                LibraryCall::Cublaslt(_) => unreachable!(),
            }
            match Artifact::from_json(&a.to_json()) {
                Err(ArtifactError::Invalid(why)) => assert!(why.contains(says), "{says}: {why}"),
                other => panic!("{says}: {other:?}"),
            }
        }
    }
}
