//! The `attention` family: GEMM → softmax → GEMM with online softmax.

use dcir_ir::OpId;

use super::{EmitError, Lower};
use crate::kir::Kernel;

/// Lowers an `attention` group.
pub(super) fn attention(l: &mut Lower, _op: OpId) -> Result<Kernel, EmitError> {
    Err(l.unsupported("group kind `attention`"))
}
