//! The CPU reference interpreter: dcir's numeric oracle.
//!
//! [`run_graph`] executes a verified graph — every op of the op set, `fused`
//! regions included — on [`Tensor`]s of every dtype the ops accept;
//! [`eval_op`] evaluates one op (constant folding uses it, so the arithmetic
//! of each op is defined once, here). [`random_inputs`] draws seeded inputs,
//! [`io`] reads and writes safetensors files, and [`compare()`](mod@compare) is the
//! tolerance check every later correctness test uses.
//!
//! # Precision contract
//!
//! - **Floats.** Operands widen to f32 (f16 and bf16 exactly). Each op
//!   computes its result in at least f32 and rounds it once to f32, then to
//!   the result dtype (round to nearest, ties to even), as the GPU kernels
//!   will: `+ - * /`, max/min in f32; other elementwise functions (exp, erf,
//!   tanh, pow, ...) in f64; per-element normalization arithmetic in f64.
//! - **Accumulation.** `matmul` and `conv2d` accumulate every dot product in
//!   f32 (matrixmultiply's sgemm, a fixed blocked order). Reductions, softmax
//!   denominators, layernorm/batchnorm statistics and pooling sums
//!   accumulate in f64, sequentially in row-major order.
//! - **IEEE.** Division by zero gives ±inf, log of a negative NaN, overflow
//!   inf; nothing traps. `max`, `min`, `relu`, `clip`, `reduce_max` and
//!   `maxpool2d` propagate NaN.
//! - **Integers.** Two's complement, wrapping; integer division truncates
//!   toward zero and a zero divisor is an error.
//! - **Casts.** See [`tensor`]: float → int truncates toward zero and
//!   saturates (NaN → 0); int → int wraps; → bool is `!= 0`.
//! - **Determinism.** Work is split over both cores with rayon in fixed
//!   blocks that never depend on the thread count or scheduling, and no float
//!   sum is split across threads: a graph, inputs and seed give bit-identical
//!   results on every run.
//!
//! Bad inputs (wrong count, type, an out-of-range gather index, a
//! malformed op) are errors naming the op and its location, never panics.

pub mod compare;
mod elementwise;
mod eval;
mod gemm;
pub mod io;
mod layout;
mod linalg;
pub mod memory;
mod nn;
pub mod random;
pub mod tensor;

use dcir_ir::{Graph, Location, OpData, TensorType};

pub use compare::{Mismatch, Stats, Tolerance, compare, f32_reference, rel_l2};
pub use eval::{eval_op, run_graph};
pub use random::{RandomBy, random_inputs};
pub use tensor::{Summary, Tensor, TensorData};

/// Why a graph or op cannot be evaluated, or data does not fit.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// The number of inputs differs from the graph's parameter count.
    #[error("@{graph} takes {expected} inputs, {found} were given")]
    InputCount {
        /// The graph's name.
        graph: String,
        /// Its parameter count.
        expected: usize,
        /// The number of inputs given.
        found: usize,
    },
    /// An input's type differs from its parameter's.
    #[error("input {index} (%{name}) must be {expected}, found {found}")]
    InputType {
        /// Position among the parameters.
        index: usize,
        /// The parameter's name.
        name: String,
        /// The parameter's type.
        expected: TensorType,
        /// The input's type.
        found: TensorType,
    },
    /// An op cannot be evaluated on its operands.
    #[error("`{op}`{}: {message}", defining(.value))]
    Op {
        /// The op's name.
        op: &'static str,
        /// The name of the op's first result, when evaluated in a graph.
        value: Option<String>,
        /// The op's source location, when evaluated in a graph.
        loc: Location,
        /// What went wrong.
        message: String,
    },
    /// Tensor data that does not fit its type, a graph or a file.
    #[error("{0}")]
    Data(String),
}

fn defining(value: &Option<String>) -> String {
    value
        .as_ref()
        .map(|v| format!(" defining %{v}"))
        .unwrap_or_default()
}

impl InterpError {
    /// Adds the place of `op` in `graph` to an op error that has none yet
    /// (an error from inside a `fused` region keeps the inner op's place).
    fn located(self, graph: &Graph, op: &OpData) -> InterpError {
        match self {
            InterpError::Op {
                op: name,
                value: None,
                loc,
                message,
            } => InterpError::Op {
                op: name,
                value: op.results.first().map(|&r| graph.value(r).name.clone()),
                loc: if loc.0.is_some() { loc } else { op.loc },
                message,
            },
            other => other,
        }
    }
}
