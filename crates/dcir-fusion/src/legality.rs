//! When two ops may share a kernel, and how.
//!
//! Two levels of fusion, after DeepCuts. **Register level**: the consumer
//! uses only values the same thread produced (or recomputes them from
//! indices), so the producer's result never leaves registers. **Shared-memory
//! level**: the consumer needs values other threads of the block produced (a
//! row reduction after a GEMM tile, a second GEMM on the first one's tile),
//! so the producer stores its tile to shared memory and the block
//! synchronizes before the consumer reads it.
//!
//! [`edge_rule`] is the table for one producer → consumer edge, by role
//! ([`crate::class::Role`]); [`group_kind`] checks that a whole set of ops
//! forms one of the kernel shapes the emitter knows. Each rule has an id that
//! `--explain-fusion` prints.

use dcir_ir::{Graph, OpId, OpKind};

use crate::class::{Role, role};

/// How a fused edge is realized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// The consumer reads the producer's value from registers.
    Register,
    /// The producer's tile goes through shared memory and a barrier.
    Shared,
}

impl Level {
    /// `register` or `shared`, as printed in the `level` attribute.
    pub fn name(self) -> &'static str {
        match self {
            Level::Register => "register",
            Level::Shared => "shared",
        }
    }
}

/// The verdict of the rule table on one edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeRule {
    /// Rule id, for explanations (`E1`...).
    pub id: &'static str,
    /// `None` when the edge cannot be fused.
    pub level: Option<Level>,
    /// Why, in a few words.
    pub reason: &'static str,
}

/// The rule for a producer → consumer edge inside one group.
///
/// | id | producer | consumer | level | why |
/// |---|---|---|---|---|
/// | E1 | any | injective | register | one-to-one after anything: the thread that holds the value applies the op (epilogue) |
/// | E2 | injective | reduction, pool | register | prologue: the consumer computes its inputs as it loads them |
/// | E3 | injective | contraction | register | prologue on the operand loads; arithmetic is recomputed per load, which the cost model charges |
/// | E4 | contraction | reduction | shared | the row spans threads: the GEMM tile goes to shared memory, then the block reduces it (GEMM + softmax) |
/// | E5 | reduction | contraction | shared | attention's softmax feeding the second GEMM through shared memory |
/// | E6 | contraction | contraction | shared | GEMM→GEMM / conv→conv chains when the intermediate tile fits the block |
/// | E7 | contraction | pool | shared | pooling needs neighbouring outputs of the conv tile |
/// | X1 | reduction | reduction, pool | — | two reductions over different rows need two passes over the data |
/// | X2 | pool | reduction, pool, contraction | — | a window of windows: recompute cost grows with both windows |
/// | C1 | constant | any | register | a literal is materialized where it is used |
pub fn edge_rule(producer: OpKind, consumer: OpKind) -> EdgeRule {
    use Role::*;
    let rule = |id, level, reason| EdgeRule { id, level, reason };
    match (role(producer), role(consumer)) {
        (Constant, _) => rule(
            "C1",
            Some(Level::Register),
            "literal materialized at its use",
        ),
        (_, Injective) => rule(
            "E1",
            Some(Level::Register),
            "elementwise epilogue on the producer's registers",
        ),
        (Injective, Reduction | Pool) => {
            rule("E2", Some(Level::Register), "prologue computed on load")
        }
        (Injective, Contraction) => rule(
            "E3",
            Some(Level::Register),
            "prologue on operand loads (recomputed per load)",
        ),
        (Contraction, Reduction) => rule(
            "E4",
            Some(Level::Shared),
            "contraction tile reduced through shared memory",
        ),
        (Reduction, Contraction) => rule(
            "E5",
            Some(Level::Shared),
            "reduction result feeds a contraction through shared memory",
        ),
        (Contraction, Contraction) => rule(
            "E6",
            Some(Level::Shared),
            "chained contraction on a tile in shared memory",
        ),
        (Contraction, Pool) => rule(
            "E7",
            Some(Level::Shared),
            "pooling over a contraction tile in shared memory",
        ),
        (Reduction, Reduction | Pool) => {
            rule("X1", None, "two reductions need two passes over the data")
        }
        (Pool, _) => rule("X2", None, "a pool feeding another windowed op"),
        (Structural, _) | (_, Structural) | (_, Constant) => rule("X0", None, "structural op"),
    }
}

/// The kernel shapes the CUDA emitter implements, one per group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    /// Injective ops only: a vectorized grid-stride loop.
    Elementwise,
    /// One row reduction with injective prologue and epilogue (softmax,
    /// layernorm, reduce, global pooling).
    Reduction,
    /// One pooling op with injective prologue and epilogue.
    Pool,
    /// One GEMM with prologue on its operands and an epilogue chain.
    Gemm,
    /// One convolution (implicit GEMM, or direct for depthwise) with prologue
    /// and epilogue.
    Conv,
    /// A depthwise convolution feeding a pointwise (1x1) one.
    DepthwisePointwise,
    /// A GEMM feeding a GEMM, or a 1x1 conv feeding a 1x1 conv.
    ContractionChain,
    /// GEMM → (scale, mask) → softmax → GEMM, with online softmax.
    Attention,
}

impl GroupKind {
    /// The name printed in the `kind` attribute.
    pub fn name(self) -> &'static str {
        match self {
            GroupKind::Elementwise => "elementwise",
            GroupKind::Reduction => "reduction",
            GroupKind::Pool => "pool",
            GroupKind::Gemm => "gemm",
            GroupKind::Conv => "conv",
            GroupKind::DepthwisePointwise => "depthwise_pointwise",
            GroupKind::ContractionChain => "contraction_chain",
            GroupKind::Attention => "attention",
        }
    }
}

fn is_depthwise(graph: &Graph, op: OpId) -> bool {
    let d = graph.op(op);
    d.kind == OpKind::Conv2d
        && d.attrs.int("groups").unwrap_or(1) > 1
        && d.attrs.int("groups").unwrap_or(1) as usize == graph.ty(d.operands[0]).dims()[1]
}

fn is_pointwise(graph: &Graph, op: OpId) -> bool {
    let d = graph.op(op);
    d.kind == OpKind::Conv2d
        && d.attrs.int("groups").unwrap_or(1) == 1
        && graph.ty(d.operands[1]).dims()[2..] == [1, 1]
        && d.attrs.ints("stride").is_some_and(|s| s == [1, 1])
}

/// The kind of kernel `ops` (in topological order) would form, or why they
/// cannot form one. Edge rules are checked separately by the planner.
pub fn group_kind(graph: &Graph, ops: &[OpId]) -> Result<GroupKind, String> {
    let anchors: Vec<OpId> = ops
        .iter()
        .copied()
        .filter(|&o| !matches!(role(graph.op(o).kind), Role::Injective | Role::Constant))
        .collect();
    let roles: Vec<Role> = anchors.iter().map(|&o| role(graph.op(o).kind)).collect();
    let kinds: Vec<OpKind> = anchors.iter().map(|&o| graph.op(o).kind).collect();
    match (roles.as_slice(), kinds.as_slice()) {
        ([], _) => Ok(GroupKind::Elementwise),
        ([Role::Reduction], _) => Ok(GroupKind::Reduction),
        ([Role::Pool], _) => Ok(GroupKind::Pool),
        ([Role::Contraction], [OpKind::Matmul]) => Ok(GroupKind::Gemm),
        ([Role::Contraction], [OpKind::Conv2d]) => Ok(GroupKind::Conv),
        (_, [OpKind::Conv2d, OpKind::Conv2d])
            if is_depthwise(graph, anchors[0]) && is_pointwise(graph, anchors[1]) =>
        {
            Ok(GroupKind::DepthwisePointwise)
        }
        (_, [OpKind::Conv2d, OpKind::Conv2d])
            if is_pointwise(graph, anchors[0]) && is_pointwise(graph, anchors[1]) =>
        {
            Ok(GroupKind::ContractionChain)
        }
        (_, [OpKind::Matmul, OpKind::Matmul]) => Ok(GroupKind::ContractionChain),
        (_, [OpKind::Matmul, OpKind::Softmax, OpKind::Matmul]) => Ok(GroupKind::Attention),
        _ => Err(format!(
            "no kernel shape holds {}",
            kinds
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(" + ")
        )),
    }
}
