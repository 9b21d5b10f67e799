//! The epilogue of a kernel's anchor (a contraction's, a softmax's result),
//! recognized and stored the same way for every family that has one: the
//! values the group computes from the anchor ([`derived`]), which ops may
//! compute them per accumulator ([`check`]), where each result's element lands
//! ([`forward_index`]) and its stores ([`store_derived`]); results that derive
//! from no anchor are stored by grid-stride loops ([`store_independent`]).

use std::collections::BTreeSet;

use dcir_fusion::Reason;
use dcir_ir::{DType, Graph, OpId, OpKind, ValueDef, ValueId};

use super::{EmitError, Index, Lower, global_thread, grid_stride, store, yields};
use crate::kir::{Param, Stmt, int, var};

type Result<T> = std::result::Result<T, EmitError>;

/// The op defining `v`, if `v` is an op result.
pub(super) fn def_op(g: &Graph, v: ValueId) -> Option<OpId> {
    match g.value(v).def {
        ValueDef::OpResult { op, .. } => Some(op),
        ValueDef::BlockArg { .. } => None,
    }
}

/// The values of group `op` computed from `seed` (itself included), not
/// looking past the ops in `stop`.
pub(super) fn derived(g: &Graph, op: OpId, seed: ValueId, stop: &[OpId]) -> BTreeSet<ValueId> {
    let region = g.op(op).region.expect("a fused op has a region");
    let mut set = BTreeSet::from([seed]);
    for &o in &g.block(region).ops {
        let d = g.op(o);
        if d.kind != OpKind::Yield
            && !stop.contains(&o)
            && d.operands.iter().any(|v| set.contains(v))
        {
            set.extend(d.results.iter().copied());
        }
    }
    set
}

fn is_elementwise(kind: OpKind) -> bool {
    kind.is_elementwise() || kind == OpKind::Cast
}

/// Checks that `to` is computed from `from` by elementwise ops and casts only
/// (the same index all the way), so it can be evaluated per accumulator of
/// `from`; `set` holds the values derived from `from`.
pub(super) fn check_elementwise_path(
    l: &Lower,
    set: &BTreeSet<ValueId>,
    from: ValueId,
    to: ValueId,
    what: &str,
) -> Result<()> {
    if to == from {
        return Ok(());
    }
    let op = match def_op(l.g, to) {
        Some(op) if set.contains(&to) => op,
        _ => return Err(l.unsupported(format!("{what}, not computed from the contraction"))),
    };
    let d = l.g.op(op);
    if !is_elementwise(d.kind) {
        return Err(l.unsupported(Reason::Op {
            op: d.kind,
            place: format!("in {what} (only elementwise ops and casts)"),
        }));
    }
    for &v in &d.operands {
        if set.contains(&v) {
            check_elementwise_path(l, set, from, v, what)?;
        }
    }
    Ok(())
}

/// Checks that every op reading a value of `set` (except the ops in `skip`)
/// is one an epilogue computes per accumulator and stores where the views
/// put it: elementwise math, a cast, a reshape or a transpose, and with
/// `batchnorm` a batchnorm whose statistics come from outside `set`. `what`
/// names the anchor in the refusal (`the contraction`, `the softmax`).
pub(super) fn check(
    l: &Lower,
    op: OpId,
    set: &BTreeSet<ValueId>,
    skip: &[OpId],
    what: &str,
    batchnorm: bool,
) -> Result<()> {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    for &o in &g.block(region).ops {
        let d = g.op(o);
        if d.kind == OpKind::Yield
            || skip.contains(&o)
            || !d.operands.iter().any(|v| set.contains(v))
        {
            continue;
        }
        let per_element = is_elementwise(d.kind)
            || matches!(d.kind, OpKind::Reshape | OpKind::Transpose)
            || (batchnorm
                && d.kind == OpKind::Batchnorm
                && !d.operands[1..].iter().any(|v| set.contains(v)));
        if !per_element {
            let allowed = if batchnorm {
                "elementwise, batchnorm, reshape and transpose"
            } else {
                "elementwise, reshape and transpose"
            };
            return Err(l.unsupported(Reason::Op {
                op: d.kind,
                place: format!("after {what} (only {allowed} epilogues)"),
            }));
        }
    }
    Ok(())
}

/// The index of `y` whose element derives from `anchor`'s element at
/// `anchor_idx`, following the views between them forward (`set`: the values
/// derived from `anchor`); `None` when `y` does not derive from it.
pub(super) fn forward_index(
    g: &Graph,
    set: &BTreeSet<ValueId>,
    anchor: ValueId,
    y: ValueId,
    anchor_idx: &Index,
) -> Option<Index> {
    if y == anchor {
        return Some(anchor_idx.clone());
    }
    let d = g.op(def_op(g, y)?);
    let src = *d.operands.iter().find(|v| set.contains(v))?;
    let idx = forward_index(g, set, anchor, src, anchor_idx)?;
    let dims = g.ty(y).dims().to_vec();
    Some(match d.kind {
        OpKind::Reshape => idx.reshaped(&dims),
        OpKind::Transpose => {
            let perm = d.attrs.ints("perm")?;
            let c = idx.get_coords();
            Index::coords(&dims, perm.iter().map(|&p| c[p as usize].clone()).collect())
        }
        _ => Index { dims, ..idx },
    })
}

/// A result of a group: its kernel parameter, dtype and yielded value.
#[derive(Clone)]
pub(super) struct Output {
    pub param: Param,
    pub dtype: DType,
    pub value: ValueId,
}

/// The group's results, each with the index of the one set of `sets` it
/// derives from, or `None` when it derives from none (math and views of the
/// inputs only).
pub(super) fn classify_outputs(
    l: &Lower,
    op: OpId,
    params: &[Param],
    sets: &[&BTreeSet<ValueId>],
) -> Result<Vec<(Output, Option<usize>)>> {
    let g = l.g;
    let outputs = params.iter().filter(|p| p.output);
    let results = &g.op(op).results;
    let mut classified = Vec::new();
    for ((param, &value), &res) in outputs.zip(&yields(g, op)).zip(results) {
        let from: Vec<usize> = (0..sets.len())
            .filter(|&i| sets[i].contains(&value))
            .collect();
        if from.len() > 1 {
            return Err(l.unsupported(format!(
                "result %{} mixes values of two stages",
                g.value(res).name
            )));
        }
        let output = Output {
            param: param.clone(),
            dtype: g.ty(res).dtype,
            value,
        };
        classified.push((output, from.first().copied()));
    }
    Ok(classified)
}

/// Stores `outputs` (derived from `anchor`, whose element at `anchor_idx` is
/// bound) where the views after `anchor` put them.
pub(super) fn store_derived(
    l: &mut Lower,
    set: &BTreeSet<ValueId>,
    anchor: ValueId,
    anchor_idx: &Index,
    outputs: &[Output],
) -> Result<()> {
    for out in outputs {
        let Some(idx) = forward_index(l.g, set, anchor, out.value, anchor_idx) else {
            return Err(l.unsupported("a result reached from its contraction through a non-view"));
        };
        let v = l.value_at(out.value, &idx)?;
        store(l, &out.param, out.dtype, idx.get_linear(), v);
    }
    Ok(())
}

/// Grid-stride loops storing `outputs` that derive from no contraction or
/// reduction (math and views of the group's inputs), each element once.
pub(super) fn store_independent(l: &mut Lower, outputs: &[Output]) -> Result<Vec<Stmt>> {
    let mut body = Vec::new();
    for out in outputs {
        let dims = l.g.ty(out.value).dims().to_vec();
        let n = l.g.ty(out.value).num_elements().unwrap_or(0);
        let stores = l.scoped(|l| {
            let v = l.value_at(out.value, &Index::linear(&dims, var("e")))?;
            store(l, &out.param, out.dtype, var("e"), v);
            Ok(())
        })?;
        body.push(Stmt::For {
            var: "e".into(),
            start: global_thread(),
            end: int(n as i64),
            step: grid_stride(),
            unroll: false,
            body: stores,
        });
    }
    Ok(body)
}
