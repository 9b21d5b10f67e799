//! Concat as storage: a `concat` whose operands are contiguous slices of its
//! result (every dim before `axis` is 1, as for a channel concat at batch 1)
//! copies nothing. Each operand's producer writes straight into its slice of
//! the concat's buffer, and the concat is a view, as TensorRT's and
//! Inductor's concat elimination do.
//!
//! [`concat_storage`] is the one decision, made on a graph body: which
//! concats are stored in place and where each placed value lives. The
//! planner leaves those concats alone (never merged, no kernel, like a lone
//! `reshape`), `apply_plan` keeps them as plain ops, and the CUDA artifact
//! builder makes each placed value's buffer a view of its root at the byte
//! offset given here. Fusion keeps every concat operand the result of some
//! op, so the decision on the fused graph is the one made before fusion.
//!
//! Concats are visited last first. A concat is stored when
//! - its slices are contiguous (the dims before `axis` multiply to 1), and
//! - every operand is *placeable* — the result of an op that computes (not a
//!   parameter, constant or view: broadcast, reshape, transpose and slice
//!   are read through by their consumers, and placed they would become copy
//!   kernels), not returned by the graph, not repeated in the concat — and
//!   either not placed yet or already placed exactly where this concat
//!   needs it;
//!
//! or, when its result is not placed, when its operands already lie side by
//! side in order in one root: DenseNet's `concat(x0, x1)` is then the prefix
//! of the block's last `concat(x0, x1, x2, ...)`, a view of it at offset 0.

use std::collections::BTreeSet;

use dcir_ir::{Graph, OpId, OpKind, ValueDef, ValueId};

use crate::class::is_view;
use rustc_hash::FxHashMap;

/// Where a placed value lives: inside the buffer of `root` (a value that is
/// not placed itself), `offset` bytes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// The value owning the buffer.
    pub root: ValueId,
    /// Byte offset of the placed value's first element.
    pub offset: u64,
}

/// The concats of a graph body stored in place, and every value's slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConcatStorage {
    /// The concat ops that are views (no kernel).
    pub concats: BTreeSet<OpId>,
    /// The slot of each value that lives inside another value's buffer
    /// (concat operands, and stored concats' results placed in a bigger one).
    pub slots: FxHashMap<ValueId, Slot>,
}

impl ConcatStorage {
    /// True when `op` is a concat stored in place.
    pub fn is_stored(&self, op: OpId) -> bool {
        self.concats.contains(&op)
    }
}

/// Decides which concats of `graph`'s body are stored in place (module doc).
pub fn concat_storage(graph: &Graph) -> ConcatStorage {
    let mut storage = ConcatStorage::default();
    let returned: Vec<ValueId> = graph.outputs().map(<[ValueId]>::to_vec).unwrap_or_default();
    // A value a kernel computes anyway and no one else owns: not a
    // parameter, constant or view (a slice or transpose placed in a slot
    // would become a copy kernel where a consumer reads through it for free).
    let placeable = |v: ValueId| match graph.value(v).def {
        ValueDef::OpResult { op, .. } => {
            let kind = graph.op(op).kind;
            kind != OpKind::Constant && !is_view(kind) && !returned.contains(&v)
        }
        ValueDef::BlockArg { .. } => false,
    };
    let body = &graph.block(graph.body()).ops;
    for &op in body.iter().rev() {
        let d = graph.op(op);
        if d.kind != OpKind::Concat {
            continue;
        }
        let result = d.results[0];
        let ty = graph.ty(result);
        let axis = d.attrs.int("axis").unwrap_or(0);
        let Ok(axis) = usize::try_from(axis) else {
            continue;
        };
        let dims = ty.dims();
        let contiguous = axis <= dims.len() && dims[..axis].iter().product::<usize>() == 1;
        let element = ty.dtype.size_bytes() as u64;
        let mut distinct = d.operands.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if !contiguous || distinct.len() != d.operands.len() {
            continue;
        }
        // Each operand's byte offset within the concat's result.
        let mut offsets = Vec::with_capacity(d.operands.len());
        let mut at = 0u64;
        for &v in &d.operands {
            offsets.push(at);
            at += graph.ty(v).num_elements().unwrap_or(0) as u64 * element;
        }
        // The result's own slot, or its own buffer (a root).
        let base = storage.slots.get(&result).copied().unwrap_or(Slot {
            root: result,
            offset: 0,
        });
        let fits = |base: Slot| {
            d.operands.iter().zip(&offsets).all(|(&v, &o)| {
                let want = Slot {
                    root: base.root,
                    offset: base.offset + o,
                };
                placeable(v) && storage.slots.get(&v).is_none_or(|&s| s == want)
            })
        };
        if fits(base) {
            for (&v, &o) in d.operands.iter().zip(&offsets) {
                let slot = Slot {
                    root: base.root,
                    offset: base.offset + o,
                };
                storage.slots.insert(v, slot);
            }
            storage.concats.insert(op);
            continue;
        }
        // Unplaced result over operands already side by side: a view of them.
        if storage.slots.contains_key(&result) || !placeable(result) {
            continue;
        }
        let Some(&first) = d.operands.first().and_then(|v| storage.slots.get(v)) else {
            continue;
        };
        let side_by_side = d.operands.iter().zip(&offsets).all(|(v, &o)| {
            storage.slots.get(v)
                == Some(&Slot {
                    root: first.root,
                    offset: first.offset + o,
                })
        });
        if side_by_side {
            storage.slots.insert(result, first);
            storage.concats.insert(op);
        }
    }
    storage
}
