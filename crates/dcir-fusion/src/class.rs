//! How each op behaves under fusion: DeepCuts' simple/complex split and
//! DNNFusion's mapping types, derived from the op table.

use dcir_ir::OpKind;

/// DNNFusion's classification by how output elements map to input elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mapping {
    /// Each output element from the same-index input elements: add, relu,
    /// cast, batchnorm (with per-channel parameters).
    OneToOne,
    /// One input element feeds several outputs: broadcast, gather.
    OneToMany,
    /// Output elements from many input elements with reuse: conv2d, matmul,
    /// pooling, reductions, softmax, layernorm.
    ManyToMany,
    /// Same elements, another index map that keeps order or selects: reshape,
    /// slice, concat, pad.
    Reorganize,
    /// Same elements permuted: transpose.
    Shuffle,
    /// No input: constant.
    Source,
}

/// What role an op can play in a kernel (DeepCuts' simple/complex, with the
/// reductions DeepCuts folds into "simple but needs shared memory" split out).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Computes each output element from elements at known indices, with no
    /// reduction: can ride along with any kernel (TVM's "injective").
    Injective,
    /// Reduces rows: softmax, layernorm, reduce_*, global_avgpool. Threads of
    /// a block cooperate on a row.
    Reduction,
    /// Sliding-window reduction: maxpool2d, avgpool2d.
    Pool,
    /// Contraction with data reuse, tiled through shared memory: conv2d, matmul.
    Contraction,
    /// A literal, materialized where used.
    Constant,
    /// Block terminators and groups themselves.
    Structural,
}

/// The mapping type of `kind`.
pub fn mapping(kind: OpKind) -> Mapping {
    use OpKind::*;
    match kind {
        Broadcast | Gather => Mapping::OneToMany,
        Conv2d | Matmul | Maxpool2d | Avgpool2d | GlobalAvgpool | ReduceSum | ReduceMean
        | ReduceMax | ReduceProd | Softmax | Layernorm => Mapping::ManyToMany,
        Reshape | Slice | Concat | Pad => Mapping::Reorganize,
        Transpose => Mapping::Shuffle,
        Constant => Mapping::Source,
        _ => Mapping::OneToOne,
    }
}

/// The kernel role of `kind`.
pub fn role(kind: OpKind) -> Role {
    use OpKind::*;
    match kind {
        Conv2d | Matmul => Role::Contraction,
        Softmax | Layernorm | ReduceSum | ReduceMean | ReduceMax | ReduceProd | GlobalAvgpool => {
            Role::Reduction
        }
        Maxpool2d | Avgpool2d => Role::Pool,
        Constant => Role::Constant,
        Fused | Return | Yield => Role::Structural,
        _ => Role::Injective,
    }
}

/// True for ops that only move or select data (no arithmetic): a consumer
/// can read through them by index arithmetic alone.
pub fn is_view(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Broadcast | OpKind::Reshape | OpKind::Transpose | OpKind::Slice
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_a_class() {
        for &kind in OpKind::ALL {
            let (m, r) = (mapping(kind), role(kind));
            if r == Role::Contraction || r == Role::Reduction || r == Role::Pool {
                assert_eq!(m, Mapping::ManyToMany, "{kind:?}");
            }
            if r == Role::Injective {
                assert_ne!(m, Mapping::ManyToMany, "{kind:?}");
            }
        }
    }
}
