//! Vendor-library calls as one more implementation of a group.
//!
//! [`gemm_call`] is the one recognizer of what cuBLASLt runs: a matmul of
//! operands read as they are, then an epilogue cuBLASLt expresses — a bias
//! along the output's columns, a tensor of the output's shape added (its C
//! operand, `beta = 1`), then ReLU or tanh-GELU. The cost model asks it
//! before pricing a library call ([`library_time`]); the emitter asks it
//! again on the `fused` op's region and records what it returns in the
//! artifact, so both sides read one answer.

use dcir_ir::{Attr, DType, Graph, OpId, OpKind, ValueDef, ValueId};

use crate::class::is_view;
use crate::cost::Bound;
use crate::device::DeviceSpec;
use crate::target::Reason;

/// Which vendor libraries the planner may call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Libraries {
    /// cuBLASLt for matmul groups.
    pub cublaslt: bool,
}

impl Libraries {
    /// Every library dcir knows.
    pub const ALL: Libraries = Libraries { cublaslt: true };
    /// None: dcir's own kernels only (`--no-library`).
    pub const NONE: Libraries = Libraries { cublaslt: false };
}

/// The `library` attribute value of a cuBLASLt call.
pub const CUBLASLT: &str = "cublaslt";

/// The activation a cuBLASLt epilogue applies last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// None.
    None,
    /// `relu`.
    Relu,
    /// `gelu {approximate = "tanh"}` (cuBLASLt's GELU is the tanh form).
    GeluTanh,
}

/// A group as one cuBLASLt matmul: `out = act(a · b + c + bias)`, every
/// matrix row-major, `batch` products of `m × k` by `k × n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmCall {
    /// The element type of every operand and of the output.
    pub dtype: DType,
    /// Independent products (the product of the leading dims).
    pub batch: u64,
    /// Output rows.
    pub m: u64,
    /// Output columns.
    pub n: u64,
    /// The contracted extent.
    pub k: u64,
    /// The A operand (`[.., m, k]`, or `[.., k, m]` when `transpose_a`),
    /// as stored (before any reshape).
    pub a: ValueId,
    /// A is stored transposed.
    pub transpose_a: bool,
    /// The B operand (`[.., k, n]`, or `[.., n, k]` when `transpose_b`),
    /// as stored.
    pub b: ValueId,
    /// B is stored transposed.
    pub transpose_b: bool,
    /// A tensor of the output's elements added before the activation.
    pub c: Option<ValueId>,
    /// A vector of `n` elements added to every row before the activation.
    pub bias: Option<ValueId>,
    /// The activation applied last.
    pub activation: Activation,
    /// The group's one result.
    pub output: ValueId,
}

impl GemmCall {
    /// The call's operands in the order the emitter binds them: a, b, then
    /// c and bias where present.
    pub fn operands(&self) -> Vec<ValueId> {
        let mut v = vec![self.a, self.b];
        v.extend(self.c);
        v.extend(self.bias);
        v
    }

    /// The epilogue, for plans and explanations (`bias + relu`).
    pub fn epilogue(&self) -> String {
        let mut parts = Vec::new();
        if self.c.is_some() {
            parts.push("add");
        }
        if self.bias.is_some() {
            parts.push("bias");
        }
        match self.activation {
            Activation::None => {}
            Activation::Relu => parts.push("relu"),
            Activation::GeluTanh => parts.push("gelu"),
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(" + ")
        }
    }
}

/// Recognizes the group of `ops` (topological order) whose results used
/// outside it are `outputs` as one cuBLASLt call, or says why not.
///
/// The call reads stored tensors: graph parameters, region arguments and
/// results of other kernels, through `reshape`s (the same bytes), never a
/// value an op of the group, a view or a constant computes (the planner
/// copies views and splat constants into the group's region, so they are
/// refused on both sides of the contract alike).
pub fn gemm_call(graph: &Graph, ops: &[OpId], outputs: &[ValueId]) -> Result<GemmCall, Reason> {
    let matmuls: Vec<OpId> = ops
        .iter()
        .copied()
        .filter(|&o| graph.op(o).kind == OpKind::Matmul)
        .collect();
    if matmuls.len() != 1 {
        return Err(Reason::Count {
            what: "matmuls",
            found: matmuls.len(),
        });
    }
    let mm = graph.op(matmuls[0]);
    let (Some(a), Some(b)) = (
        stored(graph, ops, mm.operands[0]),
        stored(graph, ops, mm.operands[1]),
    ) else {
        return Err(Reason::Form(
            "cuBLASLt reads the matmul's operands as stored (no prologue op but reshapes)".into(),
        ));
    };
    let dtype = graph.ty(a).dtype;
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(Reason::DType {
            op: OpKind::Matmul,
            dtype,
        });
    }
    let out_dims = graph.ty(mm.results[0]).dims().to_vec();
    let rank = out_dims.len();
    let (m, n) = (out_dims[rank - 2] as u64, out_dims[rank - 1] as u64);
    let a_dims = graph.ty(mm.operands[0]).dims();
    let transpose_a = mm.attrs.bool("transpose_a").unwrap_or(false);
    let transpose_b = mm.attrs.bool("transpose_b").unwrap_or(false);
    let k = a_dims[if transpose_a { rank - 2 } else { rank - 1 }] as u64;
    let batch: u64 = out_dims[..rank - 2].iter().map(|&d| d as u64).product();
    if [m, n, k, batch]
        .iter()
        .any(|&x| x == 0 || x > i32::MAX as u64)
    {
        return Err(Reason::Form(format!(
            "cuBLASLt takes extents in [1, 2^31): batch {batch}, m {m}, n {n}, k {k}"
        )));
    }

    // The epilogue: a chain of single-use values from the matmul's result;
    // views and constants off the chain are operands' prologues, checked
    // where the chain reads them.
    let mut call = GemmCall {
        dtype,
        batch,
        m,
        n,
        k,
        a,
        transpose_a,
        b,
        transpose_b,
        c: None,
        bias: None,
        activation: Activation::None,
        output: mm.results[0],
    };
    let mut current = mm.results[0];
    for &op in ops.iter().filter(|&&o| o != matmuls[0]) {
        let d = graph.op(op);
        if !d.operands.contains(&current) {
            if is_view(d.kind) || d.kind == OpKind::Constant {
                continue;
            }
            return Err(Reason::Form(
                "cuBLASLt's epilogue is one chain from the matmul's result".into(),
            ));
        }
        if outputs.contains(&current) {
            return Err(Reason::Form(
                "cuBLASLt writes one result (an intermediate value is used outside the group)"
                    .into(),
            ));
        }
        let late = call.activation != Activation::None;
        let place = |what: &str| Reason::Op {
            op: d.kind,
            place: what.into(),
        };
        match d.kind {
            OpKind::Reshape
                if !late && graph.ty(d.results[0]).dims().last() == Some(&(n as usize)) => {}
            OpKind::Add if !late => {
                let other = if d.operands[0] == current {
                    d.operands[1]
                } else {
                    d.operands[0]
                };
                if other == current {
                    return Err(place("adding the product to itself (cuBLASLt epilogue)"));
                }
                if let Some(bias) = bias_vector(graph, ops, other, n)
                    && call.bias.is_none()
                {
                    call.bias = Some(bias);
                } else if let Some(c) = stored(graph, ops, other)
                    && call.c.is_none()
                {
                    call.c = Some(c);
                } else {
                    return Err(place(
                        "after the matmul (cuBLASLt adds one bias vector and one stored tensor)",
                    ));
                }
            }
            OpKind::Relu if !late => call.activation = Activation::Relu,
            OpKind::Gelu if !late && d.attrs.str("approximate") == Some("tanh") => {
                call.activation = Activation::GeluTanh
            }
            OpKind::Gelu if !late => {
                return Err(place(
                    "after the matmul (cuBLASLt's GELU is the tanh form; this one is exact)",
                ));
            }
            _ => {
                return Err(place(
                    "after the matmul (cuBLASLt's epilogue: bias, add, then relu or tanh-gelu)",
                ));
            }
        }
        current = d.results[0];
    }
    if outputs != [current] {
        return Err(Reason::Form(
            "cuBLASLt writes one result, the end of its epilogue".into(),
        ));
    }
    if graph.ty(current).dtype != dtype {
        return Err(Reason::Form("cuBLASLt writes its operands' dtype".into()));
    }
    call.output = current;
    Ok(call)
}

/// The stored tensor `v` reads through `reshape`s (same bytes), if it is
/// one: a value no op of `ops`, no other view and no constant computes.
fn stored(graph: &Graph, ops: &[OpId], mut v: ValueId) -> Option<ValueId> {
    loop {
        let ValueDef::OpResult { op, .. } = graph.value(v).def else {
            return Some(v);
        };
        let d = graph.op(op);
        match d.kind {
            OpKind::Reshape => v = d.operands[0],
            OpKind::Constant => return None,
            kind if is_view(kind) || ops.contains(&op) => return None,
            _ => return Some(v),
        }
    }
}

/// The `n`-element stored vector `v` broadcasts along the output's last
/// dim, if it is one: `broadcast %b {dims = [last]}` with `%b` of `[n]`.
fn bias_vector(graph: &Graph, ops: &[OpId], v: ValueId, n: u64) -> Option<ValueId> {
    let ValueDef::OpResult { op, .. } = graph.value(v).def else {
        return None;
    };
    let d = graph.op(op);
    if d.kind != OpKind::Broadcast {
        return None;
    }
    let rank = graph.ty(v).dims().len() as i64;
    let src = d.operands[0];
    let along_last =
        matches!(d.attrs.get("dims"), Some(Attr::Ints(dims)) if dims.as_slice() == [rank - 1]);
    let vector = graph.ty(src).dims() == [n as usize] && graph.ty(src).dtype == graph.ty(v).dtype;
    if along_last && vector {
        stored(graph, ops, src)
    } else {
        None
    }
}

/// Fraction of the matrix rate cuBLASLt's GEMMs reach once the device is
/// full: cuBLAS f16 GEMMs of 4096×768×3072 and 4096×3072×768 ran at 608 and
/// 681 TFLOP/s of 760 on an H200, strict f32 at 40.5–46.9 of 51.1
/// (docs/cost-model.md, "Library calls").
const LIBRARY_RATE_FRACTION: f64 = 0.85;

/// Fraction of the copy bandwidth a memory-bound library GEMM (a small
/// batch against large weights) reaches.
const LIBRARY_BANDWIDTH_FRACTION: f64 = 0.8;

/// The smallest output tile a library kernel computes (cuBLASLt's Hopper
/// kernels run 64×64 up to 256×128 tiles, and split the k loop over blocks
/// when tiles are few): with fewer parallel tiles than SMs, SMs idle.
const LIBRARY_TILE: f64 = 64.0 * 64.0;

/// The k extent per split of a split-k library kernel.
const LIBRARY_SPLIT_K: f64 = 512.0;

/// The roofline estimate of a library call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LibraryCost {
    /// Seconds, one launch included.
    pub time: f64,
    /// What limits it.
    pub bound: Bound,
    /// The fraction of the SMs its tiles fill (1 once there are enough).
    pub fill: f64,
    /// Bytes it moves through device memory: operands read once, output
    /// written once.
    pub bytes: f64,
}

/// The roofline estimate of `call` on `dev`: its flops at the library's
/// fraction of the matrix rate (scaled down while its tiles, split along k,
/// do not fill the SMs), or its bytes at the library's fraction of the bandwidth,
/// whichever is longer, plus one launch.
pub fn library_cost(dev: &DeviceSpec, graph: &Graph, call: &GemmCall) -> LibraryCost {
    let (b, m, n, k) = (
        call.batch as f64,
        call.m as f64,
        call.n as f64,
        call.k as f64,
    );
    let flops = 2.0 * b * m * n * k;
    let tiles = b * (m * n / LIBRARY_TILE).max(1.0) * (k / LIBRARY_SPLIT_K).max(1.0);
    let fill = (tiles / dev.sm_count.max(1) as f64).min(1.0);
    let compute = flops / (dev.matrix_rate(call.dtype) * LIBRARY_RATE_FRACTION * fill);
    let elem = call.dtype.size_bytes() as f64;
    let size = |v: ValueId| graph.ty(v).num_elements().unwrap_or(0) as f64 * elem;
    let bytes: f64 = call.operands().into_iter().map(size).sum::<f64>() + size(call.output);
    let memory = bytes / (dev.bandwidth * LIBRARY_BANDWIDTH_FRACTION);
    let core = compute.max(memory);
    let bound = if dev.launch_overhead >= core {
        Bound::Launch
    } else if compute >= memory {
        Bound::Compute
    } else {
        Bound::Memory
    };
    LibraryCost {
        time: core + dev.launch_overhead,
        bound,
        fill,
        bytes,
    }
}
