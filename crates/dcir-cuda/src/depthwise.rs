//! Direct convolution kernels: depthwise `conv` groups (`algorithm =
//! "direct"`) and `depthwise_pointwise` groups (depthwise conv → 1×1 conv).

use dcir_ir::OpId;

use super::{EmitError, Lower};
use crate::kir::Kernel;

/// Lowers a `conv` group whose `algorithm` is `direct`.
pub(super) fn direct(l: &mut Lower, _op: OpId) -> Result<Kernel, EmitError> {
    Err(l.unsupported("a direct conv"))
}

/// Lowers a `depthwise_pointwise` group.
pub(super) fn depthwise_pointwise(l: &mut Lower, _op: OpId) -> Result<Kernel, EmitError> {
    Err(l.unsupported("group kind `depthwise_pointwise`"))
}
