//! Groups a vendor library runs (`library = "cublaslt"` on `gemm`,
//! `"cudnn"` on `conv`): the `fused` op's region read by the fusion crate's
//! recognizers ([`dcir_fusion::library`],
//! the same answer the cost model priced) and recorded as the artifact's
//! [`LibraryCall`], bound like a kernel.

use dcir_artifact::{ConvCall, GemmCall, KernelParam, LibraryCall};
use dcir_fusion::library::{Activation, conv_call, gemm_call};
use dcir_fusion::{Reason, library};
use dcir_ir::{Attr, Graph, OpId, OpKind, ValueId};

use crate::lower::EmitError;

/// A library call with what it binds.
#[derive(Clone, Debug, PartialEq)]
pub struct BoundCall {
    /// The call.
    pub call: LibraryCall,
    /// The `fused` op's operands the call reads, in parameter order (its
    /// one result is the last parameter).
    pub operands: Vec<ValueId>,
    /// The parameters: the operands, then the output.
    pub params: Vec<KernelParam>,
    /// What the call computes, for `--emit cuda` (`cuBLASLt f16 768×3072×768, bias + relu`).
    pub summary: String,
}

/// The library `fused` op `op` names, if any.
pub fn library_of(g: &Graph, op: OpId) -> Option<&str> {
    g.op(op).attrs.get("library").and_then(Attr::as_str)
}

/// The call `fused` op `op` (with a `library` attribute) makes, or why the
/// library cannot run its group.
pub fn library_call(g: &Graph, op: OpId) -> Result<BoundCall, EmitError> {
    let data = g.op(op);
    let unsupported = |reason: Reason| EmitError::Unsupported {
        group: data.symbol.clone().unwrap_or_default(),
        reason,
    };
    let Some(region) = data.region else {
        return Err(unsupported(Reason::Form(
            "a `fused` op without a region".into(),
        )));
    };
    let name = library_of(g, op).unwrap_or_default();
    let kind = data.attrs.str("kind").unwrap_or("none");
    let rank = heuristic_rank(g, op);
    if !matches!(
        (name, kind),
        (library::CUBLASLT, "gemm") | (library::CUDNN, "conv")
    ) {
        return Err(unsupported(Reason::Parameters(format!(
            "library = \"{name}\" on a group of kind `{kind}` (cuBLASLt runs `gemm` groups, cuDNN `conv` groups)"
        ))));
    }
    let block = g.block(region);
    let (body, terminator) = match block.ops.split_last() {
        Some((&t, body)) if g.op(t).kind == OpKind::Yield => (body, t),
        _ => return Err(unsupported(Reason::Form("a region without `yield`".into()))),
    };
    let outputs = g.op(terminator).operands.clone();
    // Region argument i is the fused op's operand i.
    let outer = |v: ValueId| {
        let i = block
            .args
            .iter()
            .position(|&a| a == v)
            .expect("the recognizer's operands are region arguments");
        data.operands[i]
    };
    let params = |dtype: &str, names: &[&str]| -> Vec<KernelParam> {
        names
            .iter()
            .map(|name| KernelParam {
                name: (*name).into(),
                dtype: dtype.into(),
                output: *name == "out",
                tensor_map: None,
            })
            .collect()
    };
    if name == library::CUDNN {
        let call = conv_call(g, body, &outputs).map_err(unsupported)?;
        let dtype = call.dtype.name();
        let mut names = vec!["x", "w"];
        names.extend(call.z.map(|_| "z"));
        names.extend(call.bias.map(|_| "bias"));
        names.push("out");
        let conv = conv_description(&call, rank);
        let mut epilogue: Vec<&str> = Vec::new();
        epilogue.extend(call.z.map(|_| "add"));
        epilogue.extend(call.bias.map(|_| "bias"));
        if call.activation == Activation::Relu {
            epilogue.push("relu");
        }
        let summary = format!(
            "cuDNN {dtype} conv{} {:?} * {:?} -> {:?}, pad {:?}, stride {:?}, dilation {:?}, groups {}, {}",
            match (conv.nhwc, conv.krsc) {
                (true, true) => " (NHWC, KRSC filter)",
                (true, false) => " (NHWC)",
                _ => "",
            },
            conv.input,
            conv.filter,
            conv.output,
            conv.pad,
            conv.stride,
            conv.dilation,
            conv.groups,
            if epilogue.is_empty() {
                "none".to_string()
            } else {
                epilogue.join(" + ")
            }
        ) + &ranked(rank);
        return Ok(BoundCall {
            call: LibraryCall::Cudnn(conv),
            operands: call.operands().into_iter().map(outer).collect(),
            params: params(dtype, &names),
            summary,
        });
    }
    let call = gemm_call(g, body, &outputs).map_err(unsupported)?;
    let dtype = call.dtype.name();
    let mut names = vec!["a", "b"];
    names.extend(call.c.map(|_| "c"));
    names.extend(call.bias.map(|_| "bias"));
    names.push("out");
    let summary = format!(
        "cuBLASLt {dtype} {}{}×{}×{}, {}",
        if call.batch > 1 {
            format!("{}× ", call.batch)
        } else {
            String::new()
        },
        call.m,
        call.n,
        call.k,
        call.epilogue()
    ) + &ranked(rank);
    Ok(BoundCall {
        call: LibraryCall::Cublaslt(gemm_description(&call, rank)),
        operands: call.operands().into_iter().map(outer).collect(),
        params: params(dtype, &names),
        summary,
    })
}

/// What a summary adds for a call of rank `rank`: nothing for the
/// heuristic's first choice.
fn ranked(rank: u32) -> String {
    if rank == 0 {
        String::new()
    } else {
        format!(", the heuristic's algorithm of rank {rank}")
    }
}

/// The rank of the library heuristic's algorithm `fused` op `op` runs
/// (`heuristic_rank`, 0 when absent: the heuristic's first choice).
pub fn heuristic_rank(g: &Graph, op: OpId) -> u32 {
    match g.op(op).attrs.get("heuristic_rank") {
        Some(&Attr::Int(rank)) => u32::try_from(rank).unwrap_or(0),
        _ => 0,
    }
}

/// The artifact's record of a cuBLASLt call the recognizer found (no
/// algorithm chosen yet): the heuristic's algorithm of rank `rank`.
pub fn gemm_description(call: &library::GemmCall, rank: u32) -> GemmCall {
    GemmCall {
        dtype: call.dtype.name().into(),
        batch: call.batch,
        m: call.m,
        n: call.n,
        k: call.k,
        transpose_a: call.transpose_a,
        transpose_b: call.transpose_b,
        c: call.c.is_some(),
        bias: call.bias.is_some(),
        activation: activation_name(call.activation).into(),
        algorithm: None,
        heuristic_rank: rank,
    }
}

/// The artifact's record of a cuDNN call the recognizer found (no
/// algorithm chosen yet): the heuristic's algorithm of rank `rank`.
pub fn conv_description(call: &library::ConvCall, rank: u32) -> ConvCall {
    ConvCall {
        dtype: call.dtype.name().into(),
        input: call.input,
        filter: call.filter,
        output: call.out,
        nhwc: call.nhwc,
        krsc: call.krsc,
        pad: call.pad,
        stride: call.stride,
        dilation: call.dilation,
        groups: call.groups,
        z: call.z.is_some(),
        bias: call.bias.is_some(),
        activation: activation_name(call.activation).into(),
        algorithm: None,
        heuristic_rank: rank,
    }
}

/// The artifact's name of an epilogue activation.
fn activation_name(a: Activation) -> &'static str {
    match a {
        Activation::None => "none",
        Activation::Relu => "relu",
        Activation::GeluTanh => "gelu_tanh",
    }
}

/// One line per library call of `g`, in body order, as `--emit cuda`
/// prints them: `// ===== library call <name>: <summary> =====`.
pub fn library_call_lines(g: &Graph) -> Result<Vec<String>, EmitError> {
    let mut lines = Vec::new();
    for &op in &g.block(g.body()).ops {
        if library_of(g, op).is_some() {
            let call = library_call(g, op)?;
            lines.push(format!(
                "// ===== library call {}: {} =====\n",
                crate::kernel_name(g, op),
                call.summary
            ));
        }
    }
    Ok(lines)
}
