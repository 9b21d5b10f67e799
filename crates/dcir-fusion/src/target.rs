//! The contract between the planner and a backend.
//!
//! A backend says which `fused` ops it lowers through [`Target::accept`];
//! the planner asks before it forms a group (the group built exactly as
//! [`crate::apply_plan`] would build it, alone in a graph of its own), and
//! checks every group of its final plan the same way. A group no backend
//! family accepts is therefore never formed, and the emitter never meets a
//! group it refuses.

use dcir_ir::{Graph, OpId};

/// Why a backend does not lower a group: the form it meets and does not
/// support, in words a user reads (`` `concat` after the contraction ``).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The kernel family that was asked (`gemm`, `elementwise`, ...).
    pub family: String,
    /// The op or form it does not lower.
    pub what: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the {} kernels do not lower {} yet",
            self.family, self.what
        )
    }
}

/// A backend the planner plans for.
pub trait Target {
    /// `Ok` when the backend lowers `fused`, a `fused` op of `graph`.
    fn accept(&self, graph: &Graph, fused: OpId) -> Result<(), Refusal>;
}

/// A target that accepts every group the legality rules form: for testing
/// the planner apart from any backend. Plans for it may not lower.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnyGroup;

impl Target for AnyGroup {
    fn accept(&self, _: &Graph, _: OpId) -> Result<(), Refusal> {
        Ok(())
    }
}
