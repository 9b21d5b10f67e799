//! Vendor-library calls as one more implementation of a group.
//!
//! [`gemm_call`] is the one recognizer of what cuBLASLt runs: a matmul of
//! operands read as they are, then an epilogue cuBLASLt expresses — a bias
//! along the output's columns, a tensor of the output's shape added (its C
//! operand, `beta = 1`), then ReLU or tanh-GELU. [`conv_call`] is cuDNN's:
//! an NCHW `conv2d` with equal padding on opposite sides, then a bias along
//! the channels, an added tensor and ReLU (`cudnnConvolutionBiasActivation-
//! Forward`). The cost model asks them, and the machine's libraries through
//! a [`LibraryProbe`], before pricing a library call ([`library_cost`],
//! [`conv_cost`]); the emitter asks them again on the
//! `fused` op's region and records what they return in the artifact, so
//! both sides read one answer.

use dcir_ir::{Attr, DType, Graph, OpId, OpKind, ValueDef, ValueId};

use crate::class::is_view;
use crate::cost::Bound;
use crate::device::DeviceSpec;
use crate::target::Reason;

/// Which vendor libraries the planner may call, and who says whether they
/// run a given call on this machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Libraries {
    /// cuBLASLt for matmul groups.
    pub cublaslt: bool,
    /// cuDNN for convolution groups.
    pub cudnn: bool,
    /// Asks the libraries of the machine that will run the plan (`None`:
    /// every call the recognizers accept is offered, as when planning for
    /// a preset device).
    pub probe: Option<Probe>,
}

impl Libraries {
    /// Every library dcir knows.
    pub const ALL: Libraries = Libraries {
        cublaslt: true,
        cudnn: true,
        probe: None,
    };
    /// None: dcir's own kernels only (`--no-library`).
    pub const NONE: Libraries = Libraries {
        cublaslt: false,
        cudnn: false,
        probe: None,
    };

    /// `Ok` unless the probe says cuBLASLt refuses `call` here.
    fn accepts_gemm(&self, graph: &Graph, call: &GemmCall) -> Result<(), Reason> {
        match &self.probe {
            Some(probe) => probe.0.gemm(graph, call).map_err(|why| {
                Reason::Form(format!("cuBLASLt refuses the call on this machine: {why}"))
            }),
            None => Ok(()),
        }
    }

    /// `Ok` unless the probe says cuDNN refuses `call` here.
    fn accepts_conv(&self, graph: &Graph, call: &ConvCall) -> Result<(), Reason> {
        match &self.probe {
            Some(probe) => probe.0.conv(graph, call).map_err(|why| {
                Reason::Form(format!("cuDNN refuses the call on this machine: {why}"))
            }),
            None => Ok(()),
        }
    }
}

/// Asks the libraries of a machine whether they prepare a call (its
/// descriptors, an algorithm within the workspace limit). A call they
/// refuse is a candidate lost with the library's reason, never a failed run.
pub trait LibraryProbe: Send + Sync {
    /// `Ok` when cuBLASLt runs `call` of `graph`; else what it said.
    fn gemm(&self, graph: &Graph, call: &GemmCall) -> Result<(), String>;
    /// `Ok` when cuDNN runs `call` of `graph`; else what it said.
    fn conv(&self, graph: &Graph, call: &ConvCall) -> Result<(), String>;
}

/// A shared [`LibraryProbe`] (equal to itself only).
#[derive(Clone)]
pub struct Probe(pub std::sync::Arc<dyn LibraryProbe>);

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe")
    }
}

impl PartialEq for Probe {
    fn eq(&self, other: &Probe) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The group of `ops` as one cuBLASLt call ([`gemm_call`]) that the
/// libraries' probe accepts, or why cuBLASLt cannot run it.
pub fn offered_gemm(
    libraries: &Libraries,
    graph: &Graph,
    ops: &[OpId],
    outputs: &[ValueId],
) -> Result<GemmCall, Reason> {
    let call = gemm_call(graph, ops, outputs)?;
    libraries.accepts_gemm(graph, &call)?;
    Ok(call)
}

/// The group of `ops` as one cuDNN call ([`conv_call`]) that the
/// libraries' probe accepts, or why cuDNN cannot run it.
pub fn offered_conv(
    libraries: &Libraries,
    graph: &Graph,
    ops: &[OpId],
    outputs: &[ValueId],
) -> Result<ConvCall, Reason> {
    let call = conv_call(graph, ops, outputs)?;
    libraries.accepts_conv(graph, &call)?;
    Ok(call)
}

/// The `library` attribute value of a cuBLASLt call.
pub const CUBLASLT: &str = "cublaslt";

/// The `library` attribute value of a cuDNN call.
pub const CUDNN: &str = "cudnn";

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

/// A group as one cuDNN convolution: `out = act(conv(x, w) + z + bias)`,
/// NCHW, symmetric padding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvCall {
    /// The element type of every operand and of the output.
    pub dtype: DType,
    /// The input `[n, c, h, w]`, as stored.
    pub x: ValueId,
    /// The filter `[k, c / groups, r, s]`, as stored.
    pub w: ValueId,
    /// The input's dims as the convolution reads them, `[n, c, h, w]`.
    pub input: [u64; 4],
    /// The filter's, `[k, c / groups, r, s]`.
    pub filter: [u64; 4],
    /// The convolution's result dims, `[n, k, oh, ow]` (NCHW order even when
    /// the call writes NHWC).
    pub out: [u64; 4],
    /// `[pad_h, pad_w]` on both sides.
    pub pad: [u64; 2],
    /// `[stride_h, stride_w]`.
    pub stride: [u64; 2],
    /// `[dilation_h, dilation_w]`.
    pub dilation: [u64; 2],
    /// Channel groups.
    pub groups: u64,
    /// A tensor of the output's shape added before the activation.
    pub z: Option<ValueId>,
    /// A vector of the output channels added before the activation.
    pub bias: Option<ValueId>,
    /// The activation applied last (`None` or `Relu`).
    pub activation: Activation,
    /// The group's one result.
    pub output: ValueId,
    /// The input, the added tensor and the result lie NHWC (the
    /// `channels-last` pass's layout): the conv reads `x` through a
    /// `transpose {perm = [0, 3, 1, 2]}` and its result goes through a
    /// `transpose {perm = [0, 2, 3, 1]}` first.
    pub nhwc: bool,
    /// The filter lies `[k, r, s, c / groups]` (KRSC, the `nhwc-inputs`
    /// pass's layout; only with `nhwc`): the conv reads `w` through a
    /// `transpose {perm = [0, 3, 1, 2]}`.
    pub krsc: bool,
}

impl ConvCall {
    /// The call's operands in the order the emitter binds them: x, w, then
    /// z and bias where present.
    pub fn operands(&self) -> Vec<ValueId> {
        let mut v = vec![self.x, self.w];
        v.extend(self.z);
        v.extend(self.bias);
        v
    }
}

/// Recognizes the group of `ops` whose results used outside it are
/// `outputs` as one cuDNN convolution, or says why not: a `conv2d` of
/// stored operands with equal padding on opposite sides, then a bias along
/// the channels, one added stored tensor and ReLU. An input stored NHWC
/// (read through `transpose {perm = [0, 3, 1, 2]}`, the `channels-last`
/// pass's layout) makes an NHWC call: the result goes to NHWC first, and
/// the bias runs along its last dim. cuDNN's fused form
/// (`cudnnConvolutionBiasActivationForward`) needs the bias: an added
/// tensor or a ReLU without one is refused.
pub fn conv_call(graph: &Graph, ops: &[OpId], outputs: &[ValueId]) -> Result<ConvCall, Reason> {
    // An NHWC input: the conv reads a stored tensor through the layout's
    // transpose, and its result goes back to NHWC first.
    let nhwc_input = ops
        .iter()
        .find(|&&o| graph.op(o).kind == OpKind::Conv2d)
        .and_then(|&o| nhwc_source(graph, ops, graph.op(o).operands[0]));
    // With it, a filter stored KRSC (`nhwc-inputs`), read the same way.
    let krsc = |graph: &Graph, ops: &[OpId], w: ValueId| {
        nhwc_source(graph, ops, w).or_else(|| stored(graph, ops, w))
    };
    let (root, x, w, dtype) = match nhwc_input {
        Some(x) => {
            let (root, _, w, dtype) = contraction_with(
                graph,
                ops,
                OpKind::Conv2d,
                "convolutions",
                "cuDNN",
                [&nhwc_source, &krsc],
            )?;
            (root, x, w, dtype)
        }
        None => contraction(graph, ops, OpKind::Conv2d, "convolutions", "cuDNN")?,
    };
    let nhwc = nhwc_input.is_some();
    let krsc = nhwc && nhwc_source(graph, ops, graph.op(root).operands[1]).is_some();
    let conv = graph.op(root);
    let ints = |name: &str, default: &[i64]| -> Vec<u64> {
        let v = match conv.attrs.get(name) {
            Some(Attr::Ints(v)) => v.clone(),
            _ => default.to_vec(),
        };
        v.into_iter().map(|x| x.max(0) as u64).collect()
    };
    let pad = ints("pad", &[0, 0, 0, 0]);
    if pad[0] != pad[2] || pad[1] != pad[3] {
        return Err(Reason::Form(format!(
            "cuDNN pads both sides alike (pad = {pad:?})"
        )));
    }
    let (stride, dilation) = (ints("stride", &[1, 1]), ints("dilation", &[1, 1]));
    let groups = conv.attrs.int("groups").unwrap_or(1).max(1) as u64;
    let out_dims = graph.ty(conv.results[0]).dims().to_vec();
    let fits = graph
        .ty(x)
        .dims()
        .iter()
        .chain(&out_dims)
        .chain(graph.ty(w).dims())
        .all(|&d| d > 0 && d <= i32::MAX as usize);
    if !fits {
        return Err(Reason::Form("cuDNN takes extents in [1, 2^31)".into()));
    }
    let e = epilogue(
        graph,
        ops,
        outputs,
        root,
        &EpilogueRule {
            library: "cuDNN",
            bias_axis: if nhwc {
                BiasAxis::Last
            } else {
                BiasAxis::Channel
            },
            bias_len: out_dims[1] as u64,
            // An NHWC result keeps its bytes through a reshape that keeps
            // the channels last.
            reshapes: nhwc,
            gelu_tanh: false,
            to_nhwc: nhwc,
        },
    )?;
    if e.bias.is_none() && (e.c.is_some() || e.activation != Activation::None) {
        return Err(Reason::Form(
            "cuDNN's fused epilogue (an added tensor, relu) needs a bias".into(),
        ));
    }
    let dims = |v: ValueId| {
        let d = graph.ty(v).dims();
        [d[0] as u64, d[1] as u64, d[2] as u64, d[3] as u64]
    };
    Ok(ConvCall {
        dtype,
        x,
        w,
        input: dims(conv.operands[0]),
        filter: dims(conv.operands[1]),
        out: dims(conv.results[0]),
        pad: [pad[0], pad[1]],
        stride: [stride[0], stride[1]],
        dilation: [dilation[0], dilation[1]],
        groups,
        z: e.c,
        bias: e.bias,
        activation: e.activation,
        output: e.output,
        nhwc,
        krsc,
    })
}

/// NHWC → NCHW, the `channels-last` pass's view of an NHWC tensor.
const TO_NCHW: [i64; 4] = [0, 3, 1, 2];
/// NCHW → NHWC.
const TO_NHWC: [i64; 4] = [0, 2, 3, 1];

/// The stored NHWC tensor `v` is a view of, when `v` is
/// `transpose {perm = [0, 3, 1, 2]}` of one.
fn nhwc_source(graph: &Graph, ops: &[OpId], v: ValueId) -> Option<ValueId> {
    let ValueDef::OpResult { op, .. } = graph.value(v).def else {
        return None;
    };
    let d = graph.op(op);
    let is_layout = d.kind == OpKind::Transpose
        && matches!(d.attrs.get("perm"), Some(Attr::Ints(p)) if p.as_slice() == TO_NCHW);
    if is_layout {
        stored(graph, ops, d.operands[0])
    } else {
        None
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
    let (root, a, b, dtype) = contraction(graph, ops, OpKind::Matmul, "matmuls", "cuBLASLt")?;
    let mm = graph.op(root);
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

    let epilogue = epilogue(
        graph,
        ops,
        outputs,
        root,
        &EpilogueRule {
            library: "cuBLASLt",
            bias_axis: BiasAxis::Last,
            bias_len: n,
            reshapes: true,
            gelu_tanh: true,
            to_nhwc: false,
        },
    )?;
    Ok(GemmCall {
        dtype,
        batch,
        m,
        n,
        k,
        a,
        transpose_a,
        b,
        transpose_b,
        c: epilogue.c,
        bias: epilogue.bias,
        activation: epilogue.activation,
        output: epilogue.output,
    })
}

/// The group's one `kind` op (`what`, plural, for the reason), its two
/// operands as stored, and their float dtype; or why `library` cannot run it.
fn contraction(
    graph: &Graph,
    ops: &[OpId],
    kind: OpKind,
    what: &'static str,
    library: &str,
) -> Result<(OpId, ValueId, ValueId, DType), Reason> {
    contraction_with(graph, ops, kind, what, library, [&stored, &stored])
}

/// How a library call reads an operand: the stored tensor it is, if any.
type StoredRead = dyn Fn(&Graph, &[OpId], ValueId) -> Option<ValueId>;

/// [`contraction`] with each operand read by its `read` function (its
/// stored tensor, if it is one).
fn contraction_with(
    graph: &Graph,
    ops: &[OpId],
    kind: OpKind,
    what: &'static str,
    library: &str,
    read: [&StoredRead; 2],
) -> Result<(OpId, ValueId, ValueId, DType), Reason> {
    let found: Vec<OpId> = ops
        .iter()
        .copied()
        .filter(|&o| graph.op(o).kind == kind)
        .collect();
    let [root] = found[..] else {
        return Err(Reason::Count {
            what,
            found: found.len(),
        });
    };
    let d = graph.op(root);
    let (Some(a), Some(b)) = (
        read[0](graph, ops, d.operands[0]),
        read[1](graph, ops, d.operands[1]),
    ) else {
        return Err(Reason::Form(format!(
            "{library} reads the {}'s operands as stored (no prologue op but reshapes)",
            kind.name()
        )));
    };
    let dtype = graph.ty(a).dtype;
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(Reason::DType { op: kind, dtype });
    }
    Ok((root, a, b, dtype))
}

/// Where an epilogue's bias vector runs along the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BiasAxis {
    /// The last dim (a GEMM's columns).
    Last,
    /// Dim 1 (an NCHW convolution's channels).
    Channel,
}

/// What a library's epilogue expresses.
struct EpilogueRule {
    /// The library's name, for reasons.
    library: &'static str,
    bias_axis: BiasAxis,
    /// Elements of the bias vector.
    bias_len: u64,
    /// Reshapes keeping the bias axis last may stand in the chain (the
    /// output's bytes stay where the call writes them).
    reshapes: bool,
    /// tanh-GELU is an activation it has.
    gelu_tanh: bool,
    /// The chain begins with the result's `transpose` to NHWC.
    to_nhwc: bool,
}

/// A recognized epilogue: `act(x + c + bias)`, and the value it ends at.
struct Epilogue {
    c: Option<ValueId>,
    bias: Option<ValueId>,
    activation: Activation,
    output: ValueId,
}

/// The epilogue of the contraction `root` in the group `ops`: a chain of
/// single-use values from its result — a bias vector along `rule`'s axis,
/// one stored tensor added, then an activation; views and constants off the
/// chain are operands' prologues, checked where the chain reads them.
fn epilogue(
    graph: &Graph,
    ops: &[OpId],
    outputs: &[ValueId],
    root: OpId,
    rule: &EpilogueRule,
) -> Result<Epilogue, Reason> {
    let lib = rule.library;
    let root_op = graph.op(root);
    let dtype = graph.ty(root_op.results[0]).dtype;
    let mut e = Epilogue {
        c: None,
        bias: None,
        activation: Activation::None,
        output: root_op.results[0],
    };
    let mut current = root_op.results[0];
    for &op in ops.iter().filter(|&&o| o != root) {
        let d = graph.op(op);
        if !d.operands.contains(&current) {
            if is_view(d.kind) || d.kind == OpKind::Constant {
                continue;
            }
            return Err(Reason::Form(format!(
                "{lib}'s epilogue is one chain from the {}'s result",
                root_op.kind.name()
            )));
        }
        if outputs.contains(&current) {
            return Err(Reason::Form(format!(
                "{lib} writes one result (an intermediate value is used outside the group)"
            )));
        }
        let late = e.activation != Activation::None;
        let place = |what: String| Reason::Op {
            op: d.kind,
            place: what,
        };
        let after = root_op.kind.name();
        let first = current == root_op.results[0];
        if rule.to_nhwc && first {
            let to_nhwc = d.kind == OpKind::Transpose
                && matches!(d.attrs.get("perm"), Some(Attr::Ints(p)) if p.as_slice() == TO_NHWC);
            if !to_nhwc {
                return Err(Reason::Form(format!(
                    "{lib} writes an NHWC input's result NHWC (a transpose to NHWC first)"
                )));
            }
            current = d.results[0];
            continue;
        }
        match d.kind {
            OpKind::Reshape
                if rule.reshapes
                    && graph.ty(d.results[0]).dims().last() == Some(&(rule.bias_len as usize)) => {}
            OpKind::Add if !late => {
                let other = if d.operands[0] == current {
                    d.operands[1]
                } else {
                    d.operands[0]
                };
                if other == current {
                    return Err(place(format!(
                        "adding the {after}'s result to itself ({lib} epilogue)"
                    )));
                }
                if let Some(bias) = bias_vector(graph, ops, other, rule)
                    && e.bias.is_none()
                {
                    e.bias = Some(bias);
                } else if let Some(c) = stored(graph, ops, other)
                    && e.c.is_none()
                {
                    e.c = Some(c);
                } else {
                    return Err(place(format!(
                        "after the {after} ({lib} adds one bias vector and one stored tensor)"
                    )));
                }
            }
            OpKind::Relu if !late => e.activation = Activation::Relu,
            OpKind::Gelu
                if rule.gelu_tanh && !late && d.attrs.str("approximate") == Some("tanh") =>
            {
                e.activation = Activation::GeluTanh
            }
            OpKind::Gelu if rule.gelu_tanh && !late => {
                return Err(place(format!(
                    "after the {after} ({lib}'s GELU is the tanh form; this one is exact)"
                )));
            }
            _ => {
                let acts = if rule.gelu_tanh {
                    "relu or tanh-gelu"
                } else {
                    "relu"
                };
                return Err(place(format!(
                    "after the {after} ({lib}'s epilogue: bias, add, then {acts})"
                )));
            }
        }
        current = d.results[0];
    }
    if rule.to_nhwc && current == root_op.results[0] {
        return Err(Reason::Form(format!(
            "{lib} writes an NHWC input's result NHWC (a transpose to NHWC first)"
        )));
    }
    if outputs != [current] {
        return Err(Reason::Form(format!(
            "{lib} writes one result, the end of its epilogue"
        )));
    }
    if graph.ty(current).dtype != dtype {
        return Err(Reason::Form(format!("{lib} writes its operands' dtype")));
    }
    e.output = current;
    Ok(e)
}

/// The stored tensor `v` reads through `reshape`s (same bytes), if it is
/// one: a value no op of `ops` and no constant computes. A reshape outside
/// the group is no kernel (its result is its operand's bytes); any other op
/// outside it, a view included, is another group's kernel, which stores its
/// result.
fn stored(graph: &Graph, ops: &[OpId], mut v: ValueId) -> Option<ValueId> {
    loop {
        let ValueDef::OpResult { op, .. } = graph.value(v).def else {
            return Some(v);
        };
        let d = graph.op(op);
        match d.kind {
            OpKind::Constant => return None,
            _ if ops.contains(&op) && d.kind != OpKind::Reshape => return None,
            OpKind::Reshape => v = d.operands[0],
            _ => return Some(v),
        }
    }
}

/// The stored vector `v` broadcasts along `rule`'s axis, if it is one:
/// `broadcast %b {dims = [axis]}` with `%b` of `rule.bias_len` elements.
fn bias_vector(graph: &Graph, ops: &[OpId], v: ValueId, rule: &EpilogueRule) -> Option<ValueId> {
    let ValueDef::OpResult { op, .. } = graph.value(v).def else {
        return None;
    };
    let d = graph.op(op);
    if d.kind != OpKind::Broadcast {
        return None;
    }
    let rank = graph.ty(v).dims().len() as i64;
    let axis = match rule.bias_axis {
        BiasAxis::Last => rank - 1,
        BiasAxis::Channel => 1,
    };
    let src = d.operands[0];
    let along = matches!(d.attrs.get("dims"), Some(Attr::Ints(dims)) if dims.as_slice() == [axis]);
    let vector = graph.ty(src).dims() == [rule.bias_len as usize]
        && graph.ty(src).dtype == graph.ty(v).dtype;
    if along && vector {
        stored(graph, ops, src)
    } else {
        None
    }
}

/// The fraction of its roofline time (the matrix rate or the bandwidth,
/// whichever binds, at full rate) a cuBLASLt call of `dtype` reaches inside
/// a model. f16 and bf16: 0.49, the geomean over the 47 cuBLASLt groups of
/// ResNet-50 (channels-last), the BERT layer and ViT-B/16 at batch 32
/// (`run.sh library`, fit.py; an H100, 2026-12-06; range 0.11–0.82). Strict
/// f32: 0.85 (cuBLAS f32 GEMMs ran 40.5–46.9 TFLOP/s of 51.1 on an H200).
fn cublaslt_efficiency(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 0.85,
        _ => 0.49,
    }
}

/// The same for a cuDNN call, by the form of the call (same runs): NHWC
/// 0.31 (17 groups, 0.22–0.55); NCHW 0.17 (40 groups, 0.08–0.24: cuDNN
/// transposes f16 NCHW operands to NHWC around its kernels); an NCHW stem
/// (ungrouped, fewer than 8 input channels) 0.04 (ResNet-50's 7×7 ran
/// 227–286 µs, ViT-B/16's 16×16 patch convolution 362–499 µs, where dcir's
/// own kernel ran 81 µs; 2026-12-06).
fn cudnn_efficiency(call: &ConvCall) -> f64 {
    if !call.nhwc && call.groups == 1 && call.input[1] < 8 {
        0.04
    } else if call.nhwc {
        0.31
    } else {
        0.17
    }
}

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

/// The roofline estimate of `call` on `dev`: its flops at the matrix rate
/// (scaled down while its tiles, split along k, do not fill the SMs) or
/// its bytes at the bandwidth, whichever is longer, over the fraction of
/// that cuBLASLt reaches ([`cublaslt_efficiency`]), plus one launch.
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
    let compute = flops / (dev.matrix_rate(call.dtype) * fill);
    let elem = call.dtype.size_bytes() as f64;
    let size = |v: ValueId| graph.ty(v).num_elements().unwrap_or(0) as f64 * elem;
    let bytes: f64 = call.operands().into_iter().map(size).sum::<f64>() + size(call.output);
    roofline(dev, compute, bytes, fill, cublaslt_efficiency(call.dtype))
}

/// A library call's estimate from its compute time and its bytes at the
/// full rates, and the fraction of that roofline the call reaches.
fn roofline(dev: &DeviceSpec, compute: f64, bytes: f64, fill: f64, efficiency: f64) -> LibraryCost {
    let memory = bytes / dev.bandwidth;
    let (compute, memory) = (compute / efficiency, memory / efficiency);
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

/// The roofline estimate of `call` on `dev`, as [`library_cost`]: the
/// convolution's flops (an implicit GEMM of `n·oh·ow × k × c/groups·r·s`)
/// at the matrix rate or its bytes at the bandwidth, over the fraction of
/// that the call's form reaches ([`cudnn_efficiency`]), plus one launch.
pub fn conv_cost(dev: &DeviceSpec, graph: &Graph, call: &ConvCall) -> LibraryCost {
    let out = call.out.map(|d| d as f64);
    let w = call.filter.map(|d| d as f64);
    let (pixels, channels, k) = (out[0] * out[2] * out[3], out[1], w[1] * w[2] * w[3]);
    let flops = 2.0 * pixels * channels * k;
    let groups = call.groups as f64;
    let tiles = groups * ((pixels * channels / groups) / LIBRARY_TILE).max(1.0);
    let fill = (tiles / dev.sm_count.max(1) as f64).min(1.0);
    // A grouped convolution (depthwise at the extreme) does little work per
    // element read: the roofline's memory side decides it.
    let compute = flops / (dev.matrix_rate(call.dtype) * fill);
    let elem = call.dtype.size_bytes() as f64;
    let size = |v: ValueId| graph.ty(v).num_elements().unwrap_or(0) as f64 * elem;
    let bytes: f64 = call.operands().into_iter().map(size).sum::<f64>() + size(call.output);
    roofline(dev, compute, bytes, fill, cudnn_efficiency(call))
}
