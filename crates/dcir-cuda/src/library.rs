//! Groups a vendor library runs (`library = "cublaslt"`): the `fused` op's
//! region read by the fusion crate's recognizer ([`dcir_fusion::library`],
//! the same answer the cost model priced) and recorded as the artifact's
//! [`LibraryCall`], bound like a kernel.

use dcir_artifact::{GemmCall, KernelParam, LibraryCall};
use dcir_fusion::library::{Activation, gemm_call};
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
    /// What the call computes, for plans (`cuBLASLt f16 768×3072×768, bias + relu`).
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
    if name != library::CUBLASLT || data.attrs.str("kind") != Some("gemm") {
        return Err(unsupported(Reason::Parameters(format!(
            "library = \"{name}\" on a group of kind `{}` (cuBLASLt runs `gemm` groups)",
            data.attrs.str("kind").unwrap_or("none")
        ))));
    }
    let block = g.block(region);
    let (body, terminator) = match block.ops.split_last() {
        Some((&t, body)) if g.op(t).kind == OpKind::Yield => (body, t),
        _ => return Err(unsupported(Reason::Form("a region without `yield`".into()))),
    };
    let outputs = g.op(terminator).operands.clone();
    let call = gemm_call(g, body, &outputs).map_err(unsupported)?;
    // Region argument i is the fused op's operand i.
    let outer = |v: ValueId| {
        let i = block
            .args
            .iter()
            .position(|&a| a == v)
            .expect("the recognizer's operands are region arguments");
        data.operands[i]
    };
    let dtype = call.dtype.name();
    let param = |name: &str, output| KernelParam {
        name: name.into(),
        dtype: dtype.into(),
        output,
    };
    let mut params = vec![param("a", false), param("b", false)];
    if call.c.is_some() {
        params.push(param("c", false));
    }
    if call.bias.is_some() {
        params.push(param("bias", false));
    }
    params.push(param("out", true));
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
    );
    Ok(BoundCall {
        call: LibraryCall::Cublaslt(GemmCall {
            dtype: dtype.into(),
            batch: call.batch,
            m: call.m,
            n: call.n,
            k: call.k,
            transpose_a: call.transpose_a,
            transpose_b: call.transpose_b,
            c: call.c.is_some(),
            bias: call.bias.is_some(),
            activation: match call.activation {
                Activation::None => "none",
                Activation::Relu => "relu",
                Activation::GeluTanh => "gelu_tanh",
            }
            .into(),
            algorithm: None,
        }),
        operands: call.operands().into_iter().map(outer).collect(),
        params,
        summary,
    })
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
