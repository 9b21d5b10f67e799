//! The `pool` family: `maxpool2d` / `avgpool2d` with an elementwise prologue
//! and epilogue, one output element per thread.

use dcir_ir::OpId;

use super::{EmitError, Lower};
use crate::kir::Kernel;

/// Lowers a `pool` group.
pub(super) fn pool(l: &mut Lower, _op: OpId) -> Result<Kernel, EmitError> {
    Err(l.unsupported("group kind `pool`"))
}
