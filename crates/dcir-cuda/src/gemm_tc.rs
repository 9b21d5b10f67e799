//! The tensor-core `gemm` path: f16/bf16 operands on `mma.sync`, f32 accumulation.

use dcir_ir::{Graph, OpId};

use super::{EmitError, Lower};
use crate::kir::Kernel;

/// Whether group `op` takes the tensor-core path (`math = "tensor_core"`, f16/bf16 operands).
pub(super) fn applies(_g: &Graph, _op: OpId) -> bool {
    false
}

/// Lowers a tensor-core `gemm` group.
pub(super) fn gemm(l: &mut Lower, _op: OpId) -> Result<Kernel, EmitError> {
    Err(l.unsupported("a tensor-core gemm"))
}
