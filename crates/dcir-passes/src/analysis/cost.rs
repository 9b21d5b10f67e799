//! Per-op cost counters: floating-point operations and bytes moved.
//!
//! Counted as if each op ran as its own kernel: every operand is read from
//! memory once and every result written once. Flops: an add or multiply is
//! one; `matmul` and `conv2d` count a multiply-add as two; a transcendental
//! (exp, erf, tanh, ...) counts as one, like an add — the counters size work,
//! they do not model instruction latency. Data movement ops (broadcast,
//! reshape, transpose, slice, concat, pad, gather, cast) have no flops.

use dcir_ir::{DType, Graph, OpId, OpKind, TensorType};

use super::Analysis;

/// Work and traffic of one op.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCost {
    /// Floating-point (or integer) operations.
    pub flops: u64,
    /// Bytes read from memory.
    pub bytes_read: u64,
    /// Bytes written to memory.
    pub bytes_written: u64,
}

impl OpCost {
    /// Flops per byte moved (0 when nothing moves).
    pub fn intensity(&self) -> f64 {
        let bytes = self.bytes_read + self.bytes_written;
        if bytes == 0 {
            0.0
        } else {
            self.flops as f64 / bytes as f64
        }
    }

    fn add(&mut self, other: OpCost) {
        self.flops += other.flops;
        self.bytes_read += other.bytes_read;
        self.bytes_written += other.bytes_written;
    }
}

fn elems(t: &TensorType) -> u64 {
    t.num_elements().unwrap_or(usize::MAX) as u64
}

fn bytes(t: &TensorType, dtype: Option<DType>) -> u64 {
    elems(t).saturating_mul(dtype.unwrap_or(t.dtype).size_bytes() as u64)
}

/// The cost of `op`, with every float tensor counted at `dtype` when given
/// (to ask "what would this cost in f16?"). A `fused` op reads its operands,
/// writes its results, and does the flops of its region.
pub fn op_cost(graph: &Graph, op: OpId, dtype: Option<DType>) -> OpCost {
    let d = graph.op(op);
    let at = |t: &TensorType| bytes(t, dtype.filter(|_| t.dtype.is_float()));
    let bytes_read = d.operands.iter().map(|&v| at(graph.ty(v))).sum();
    let bytes_written = d.results.iter().map(|&v| at(graph.ty(v))).sum();
    OpCost {
        flops: flops(graph, op),
        bytes_read,
        bytes_written,
    }
}

fn flops(graph: &Graph, op: OpId) -> u64 {
    use OpKind::*;
    let d = graph.op(op);
    let input = |i: usize| graph.ty(d.operands[i]);
    let out = || d.results.first().map_or(0, |&r| elems(graph.ty(r)));
    match d.kind {
        Add | Sub | Mul | Div | Max | Min | Pow | Relu | Erf | Tanh | Sigmoid | Exp | Log
        | Sqrt | Rsqrt | Neg | Abs | Floor | Ceil | Round | Sign | Sin | Cos | IsNan | IsInf
        | Equal | Less | LessEqual | Greater | GreaterEqual | And | Or | Xor | Not | Select => {
            out()
        }
        // The remainder, then its sign fixed.
        Mod => 2 * out(),
        Clip => 2 * out(),
        // x * 0.5 * (1 + erf(x / sqrt 2)): five operations per element.
        Gelu => 5 * out(),
        Matmul => {
            let a = input(0);
            let r = a.rank();
            let transpose_a = d.attrs.bool("transpose_a").unwrap_or(false);
            let k = if transpose_a {
                a.dims()[r - 2]
            } else {
                a.dims()[r - 1]
            };
            2 * out() * k as u64
        }
        Conv2d => {
            let w = input(1).dims();
            2 * out() * (w[1] * w[2] * w[3]) as u64
        }
        ReduceSum | ReduceMean | ReduceMax | ReduceProd => elems(input(0)),
        // max, subtract, exp, sum, divide.
        Softmax => 5 * elems(input(0)),
        // mean, subtract, square, mean, rsqrt, multiply, scale, shift.
        Layernorm => 8 * elems(input(0)),
        // (x - mean) * scale / sqrt(var + eps) + bias, with the per-channel factor precomputed.
        Batchnorm => 2 * out(),
        Maxpool2d | Avgpool2d => {
            let k = d
                .attrs
                .ints("kernel")
                .map_or(1, |k| k.iter().product::<i64>().max(1) as u64);
            out() * k
        }
        GlobalAvgpool => elems(input(0)),
        Fused => d.region.map_or(0, |r| {
            graph.block(r).ops.iter().map(|&o| flops(graph, o)).sum()
        }),
        Broadcast | Reshape | Transpose | Slice | Concat | Pad | Gather | Cast | Constant
        | Return | Yield => 0,
    }
}

/// The cost of every body op and the total.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphCost {
    /// `(op, cost)` for each op of the body, in block order, terminator excluded.
    pub ops: Vec<(OpId, OpCost)>,
    /// The sum.
    pub total: OpCost,
}

impl Analysis for GraphCost {
    fn compute(graph: &Graph) -> GraphCost {
        let mut total = OpCost::default();
        let mut ops = Vec::new();
        for &op in &graph.block(graph.body()).ops {
            if graph.op(op).kind.info().is_terminator {
                continue;
            }
            let c = op_cost(graph, op, None);
            total.add(c);
            ops.push((op, c));
        }
        GraphCost { ops, total }
    }
}
