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
/// | E3 | view (broadcast, reshape, transpose, slice) | contraction | register | the operand load goes through index arithmetic |
/// | E3s | injective after a contraction or reduction of the group | contraction | shared | a chain's epilogue, stored to the shared tile the next contraction reads |
/// | X3 | other injective | contraction | — | arithmetic before a contraction would be recomputed for every reuse of its result; it stays an epilogue of its producer |
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
        (Injective, Contraction) if crate::class::is_view(producer) => rule(
            "E3",
            Some(Level::Register),
            "operand loads through index arithmetic",
        ),
        (Injective, Contraction) => rule(
            "X3",
            None,
            "arithmetic before a contraction would be recomputed for every reuse",
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
    /// GEMM → (scale, mask) → softmax → GEMM, with online softmax; also
    /// either half (GEMM → softmax, softmax → GEMM).
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

/// True when every contraction after the first reads its row operand (A, or
/// the conv input) from inside the group and its other operand (B, or the
/// weights) from outside, directly or through views (attention's V sliced
/// out of one projection): a block then owns whole rows of the
/// intermediate, which is what keeps a chain's intermediate tile in the
/// block.
fn chained_through_rows(graph: &Graph, ops: &[OpId], anchors: &[OpId]) -> bool {
    let def = |v: dcir_ir::ValueId| match graph.value(v).def {
        dcir_ir::ValueDef::OpResult { op, .. } if ops.contains(&op) => Some(op),
        _ => None,
    };
    let from_outside = |mut v: dcir_ir::ValueId| {
        while let Some(op) = def(v) {
            if !crate::class::is_view(graph.op(op).kind) {
                return false;
            }
            v = graph.op(op).operands[0];
        }
        true
    };
    anchors[1..]
        .iter()
        .filter(|&&a| role(graph.op(a).kind) == Role::Contraction)
        .all(|&a| {
            let d = graph.op(a);
            def(d.operands[0]).is_some() && from_outside(d.operands[1])
        })
}

/// True when the row operand of every contraction after the first is computed
/// from the previous anchor without views (reshape, transpose, ...) on the
/// way: the chain kernel keeps the intermediate tile in the layout the first
/// contraction produced it in, so a view of it would need a different tile
/// (BERT's head merge between P·V and the output projection). Views of
/// other operands (a bias broadcast) are fine.
fn rows_without_views(graph: &Graph, ops: &[OpId], anchors: &[OpId]) -> bool {
    // Whether `v` depends, inside the group, on an anchor; `Err` when it does
    // through a view.
    fn from_anchor(
        graph: &Graph,
        ops: &[OpId],
        anchors: &[OpId],
        v: dcir_ir::ValueId,
    ) -> Result<bool, ()> {
        let dcir_ir::ValueDef::OpResult { op, .. } = graph.value(v).def else {
            return Ok(false);
        };
        if !ops.contains(&op) {
            return Ok(false);
        }
        if anchors.contains(&op) {
            return Ok(true);
        }
        let mut depends = false;
        for &operand in &graph.op(op).operands {
            depends |= from_anchor(graph, ops, anchors, operand)?;
        }
        if depends && crate::class::is_view(graph.op(op).kind) {
            return Err(());
        }
        Ok(depends)
    }
    anchors[1..]
        .iter()
        .all(|&a| from_anchor(graph, ops, anchors, graph.op(a).operands[0]).is_ok())
}

/// Checks a whole candidate group (`ops` in topological order): every edge
/// inside it passes [`edge_rule`] — except that injective ops between two
/// anchors of a chain (the first contraction's or reduction's epilogue) may
/// feed the next contraction at shared-memory level (rule E3s) — and the ops
/// form a kernel shape ([`group_kind`]). Returns the shape and the deepest
/// level any edge or the shape itself needs.
pub fn check_group(graph: &Graph, ops: &[OpId]) -> Result<(GroupKind, Level), String> {
    let inside = |op: OpId| ops.contains(&op);
    // Ops of the group that depend, inside it, on a contraction or reduction.
    let mut anchored: Vec<OpId> = Vec::new();
    let mut level = Level::Register;
    for &op in ops {
        let consumer = graph.op(op).kind;
        for &v in &graph.op(op).operands {
            let dcir_ir::ValueDef::OpResult { op: def, .. } = graph.value(v).def else {
                continue;
            };
            if !inside(def) {
                continue;
            }
            let producer = graph.op(def).kind;
            let from_anchor = matches!(role(producer), Role::Contraction | Role::Reduction)
                || anchored.contains(&def);
            if from_anchor && !anchored.contains(&op) {
                anchored.push(op);
            }
            let rule = edge_rule(producer, consumer);
            match rule.level {
                Some(l) => level = level.max(l),
                None if rule.id == "X3" && anchored.contains(&def) => level = Level::Shared,
                None => return Err(format!("{}: {}", rule.id, rule.reason)),
            }
        }
    }
    // X3 also holds when the arithmetic reaches the contraction through views.
    for &op in ops {
        if role(graph.op(op).kind) != Role::Contraction {
            continue;
        }
        for &v in &graph.op(op).operands {
            let mut value = v;
            while let dcir_ir::ValueDef::OpResult { op: def, .. } = graph.value(value).def {
                let kind = graph.op(def).kind;
                if !inside(def) || anchored.contains(&def) {
                    break;
                }
                if crate::class::is_view(kind) {
                    value = graph.op(def).operands[0];
                    continue;
                }
                if role(kind) == Role::Injective {
                    let rule = edge_rule(kind, graph.op(op).kind);
                    return Err(format!("{}: {} (through views)", rule.id, rule.reason));
                }
                break;
            }
        }
    }
    let kind = group_kind(graph, ops)?;
    if matches!(
        kind,
        GroupKind::DepthwisePointwise | GroupKind::ContractionChain | GroupKind::Attention
    ) {
        level = Level::Shared;
    }
    Ok((kind, level))
}

/// The kind of kernel `ops` (in topological order) would form, or why they
/// cannot form one. [`check_group`] adds the edge rules.
pub fn group_kind(graph: &Graph, ops: &[OpId]) -> Result<GroupKind, String> {
    let anchors: Vec<OpId> = ops
        .iter()
        .copied()
        .filter(|&o| !matches!(role(graph.op(o).kind), Role::Injective | Role::Constant))
        .collect();
    let roles: Vec<Role> = anchors.iter().map(|&o| role(graph.op(o).kind)).collect();
    let kinds: Vec<OpKind> = anchors.iter().map(|&o| graph.op(o).kind).collect();
    if anchors.len() > 1 && !chained_through_rows(graph, ops, &anchors) {
        return Err("a chained contraction must take its rows from the group and its other operand from outside".to_string());
    }
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
        (_, [OpKind::Matmul, OpKind::Matmul]) if rows_without_views(graph, ops, &anchors) => {
            Ok(GroupKind::ContractionChain)
        }
        (_, [OpKind::Matmul, OpKind::Matmul]) => {
            Err("a view between chained GEMMs (the chain keeps the intermediate tile as the first GEMM made it)".to_string())
        }
        // The whole of attention, or either half of it on the way there: a
        // GEMM whose rows are softmaxed in the block, or a softmax feeding a GEMM.
        (_, [OpKind::Matmul, OpKind::Softmax, OpKind::Matmul])
        | (_, [OpKind::Matmul, OpKind::Softmax])
        | (_, [OpKind::Softmax, OpKind::Matmul]) => Ok(GroupKind::Attention),
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
