//! The `contraction_chain` family: GEMM → GEMM (or 1×1 conv → 1×1 conv) with
//! the intermediate tile kept in shared memory.

use dcir_ir::OpId;

use super::{EmitError, Lower};
use crate::kir::Kernel;

/// Lowers a `contraction_chain` group.
pub(super) fn chain(l: &mut Lower, _op: OpId) -> Result<Kernel, EmitError> {
    Err(l.unsupported("group kind `contraction_chain`"))
}
