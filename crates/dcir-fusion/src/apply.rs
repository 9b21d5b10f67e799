//! Rewrites a graph into the `fused` ops of a plan.
//!
//! The graph is rebuilt in plan order. Each group becomes
//! `fused @gN(...) {kind, level, <kernel parameters>}` whose region holds
//! copies of the group's ops; values the group defines and others use become
//! the fused op's results, under their original names (inside the region the
//! copy is renamed `name.r`). Splat constants a group uses are copied into
//! its region (the emitter makes them literals); any other constant stays a
//! value of the graph, which the group reads; a group that is only a `reshape` stays a plain op (a view, no
//! kernel); a group whose results nobody uses is dropped. A view of values
//! from outside its group (a bias broadcast that CSE shared between two
//! convolutions, a reshape of the previous layer's output that three
//! projections read) is never a result: every group that reads it copies the
//! view into its region and reads the viewed value itself, so no kernel
//! materializes a view.

use dcir_ir::{Attr, Attrs, BlockId, Graph, OpId, OpKind, ValueDef, ValueId};
use dcir_passes::transforms::{SPACE_TO_DEPTH, TO_NHWC};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::planner::{Plan, PlannedGroup};
use crate::storage::{ConcatStorage, concat_storage};

struct Rebuild<'g> {
    old: &'g Graph,
    new: Graph,
    map: FxHashMap<ValueId, ValueId>,
    reserved: FxHashSet<&'g str>,
    /// Building one group alone: values from outside it become parameters.
    standalone: bool,
}

impl Rebuild<'_> {
    /// A name free in both graphs, from `hint`.
    fn fresh(&mut self, hint: &str) -> String {
        let mut n = 0;
        let mut candidate = hint.to_string();
        while self.reserved.contains(candidate.as_str()) || self.new.has_name(&candidate) {
            candidate = format!("{hint}.{n}");
            n += 1;
        }
        candidate
    }

    /// Copies `op` into `block`, reading operands through `local` then the
    /// outer map, naming each result with `name_of`.
    fn copy_op(
        &mut self,
        op: OpId,
        block: BlockId,
        local: &mut FxHashMap<ValueId, ValueId>,
        name_of: &dyn Fn(&mut Self, ValueId) -> String,
    ) -> Result<(), String> {
        let d = self.old.op(op);
        let operands = d
            .operands
            .iter()
            .map(|v| {
                local
                    .get(v)
                    .or_else(|| self.map.get(v))
                    .copied()
                    .ok_or_else(|| format!("%{} is not available", self.old.value(*v).name))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let results = d
            .results
            .iter()
            .map(|&r| (name_of(self, r), self.old.ty(r).clone()))
            .collect();
        let new_op = self
            .new
            .create_op(d.kind, operands, d.attrs.clone(), results)
            .map_err(|e| e.to_string())?;
        self.new.op_mut(new_op).loc = d.loc;
        self.new.append_op(block, new_op);
        for (&r, &n) in d.results.iter().zip(&self.new.op(new_op).results.clone()) {
            local.insert(r, n);
        }
        Ok(())
    }
}

/// The constant op defining `v` when regions should hold a copy of it: a
/// splat (every element the same value), which the emitter turns into a
/// literal, that feeds no contraction (whose kernels stage their operands
/// from memory; such a constant stays a buffer).
fn splat_constant(
    graph: &Graph,
    users: &FxHashMap<ValueId, Vec<OpId>>,
    v: ValueId,
) -> Option<OpId> {
    let ValueDef::OpResult { op, .. } = graph.value(v).def else {
        return None;
    };
    let d = graph.op(op);
    if d.kind != OpKind::Constant || d.attrs.get("value").and_then(Attr::splat).is_none() {
        return None;
    }
    (!feeds_contraction(graph, users, v)).then_some(op)
}

/// Whether `v` is an operand of a matmul or conv2d, directly or through views.
fn feeds_contraction(graph: &Graph, users: &FxHashMap<ValueId, Vec<OpId>>, v: ValueId) -> bool {
    users.get(&v).into_iter().flatten().any(|&u| {
        let d = graph.op(u);
        matches!(d.kind, OpKind::Matmul | OpKind::Conv2d)
            || (crate::class::is_view(d.kind)
                && d.results
                    .iter()
                    .any(|&r| feeds_contraction(graph, users, r)))
    })
}

/// The ops that compute `v` through views alone (innermost first) from
/// values any group can read — graph parameters, splat constants, and
/// values another group materializes — or `None` when `v` is not such a
/// view. A portable view is never materialized, so the chain follows one
/// into whichever group defines it. A transpose into channels-last
/// ([`is_channels_last_store`]) is no portable view: its group stores the
/// bytes in the order its readers want. `group_of` maps each grouped op to
/// its group.
fn portable_view(
    graph: &Graph,
    users: &FxHashMap<ValueId, Vec<OpId>>,
    group_of: &dyn Fn(OpId) -> Option<usize>,
    v: ValueId,
) -> Option<Vec<OpId>> {
    let ValueDef::OpResult { op, .. } = graph.value(v).def else {
        return None;
    };
    let d = graph.op(op);
    if !crate::class::is_view(d.kind) || is_channels_last_store(graph, op) {
        return None;
    }
    let mut chain = Vec::new();
    for &operand in &d.operands {
        let ValueDef::OpResult { op: def, .. } = graph.value(operand).def else {
            continue; // a parameter
        };
        if splat_constant(graph, users, operand).is_some() {
            continue;
        }
        match portable_view(graph, users, group_of, operand) {
            // Never materialized, wherever it is defined: copied along.
            Some(inner) => chain.extend(inner),
            // Another group's value is one of that group's results.
            None if group_of(def) != group_of(op) => {}
            None => return None,
        }
    }
    chain.push(op);
    Some(chain)
}

/// True for the transposes the layout passes store with: a 4-D tensor
/// channels-last (NHWC, or a filter KRSC: the `channels-last` and
/// `nhwc-inputs` passes' `T`), or an image space-to-depth (`nhwc-inputs`'
/// stems; ViT's patches), which a kernel's operand copies read only as
/// stored.
pub(crate) fn is_channels_last_store(graph: &Graph, op: OpId) -> bool {
    let d = graph.op(op);
    d.kind == OpKind::Transpose
        && matches!(d.attrs.ints("perm"), Some(p) if p == TO_NHWC || p == SPACE_TO_DEPTH)
}

/// True for a group that is a view, not a kernel, and stays a plain op: a
/// lone `reshape`, or a lone `concat` stored in place (`storage`).
pub(crate) fn is_view_group(graph: &Graph, ops: &[OpId], storage: &ConcatStorage) -> bool {
    matches!(ops, [op] if graph.op(*op).kind == OpKind::Reshape || storage.is_stored(*op))
}

/// True for a group whose chosen implementation is a vendor-library call: it
/// reads its inputs as stored, so it copies no view of another group's
/// value into its region, and a view it reads is materialized by the view's
/// own group.
pub(crate) fn reads_stored(planned: &PlannedGroup) -> bool {
    planned.estimate.params.get("library").is_some()
}

/// The fused op's attributes: kind, level, then the kernel parameters.
fn group_attrs(planned: &PlannedGroup) -> Attrs {
    let mut attrs = Attrs::new()
        .with("kind", Attr::Str(planned.group.kind.name().to_string()))
        .with("level", Attr::Str(planned.group.level.name().to_string()));
    for (name, value) in &planned.estimate.params.0 {
        attrs.set(*name, value.clone());
    }
    OpKind::Fused
        .normalize_attrs(attrs)
        .expect("the cost model writes parameters of dcir_ir::fused's schema")
}

/// The ops using each value of the body.
pub(crate) fn users_of(graph: &Graph) -> FxHashMap<ValueId, Vec<OpId>> {
    let mut users: FxHashMap<ValueId, Vec<OpId>> = FxHashMap::default();
    for &op in &graph.block(graph.body()).ops {
        for &v in &graph.op(op).operands {
            users.entry(v).or_default().push(op);
        }
    }
    users
}

/// The group of each grouped op, given the groups' op sets in plan order;
/// a view group ([`is_view_group`]) is no group (it stays a plain op).
pub(crate) fn partition<'a>(
    graph: &Graph,
    storage: &ConcatStorage,
    groups: impl IntoIterator<Item = &'a [OpId]>,
) -> FxHashMap<OpId, usize> {
    let mut group_of = FxHashMap::default();
    for (index, ops) in groups.into_iter().enumerate() {
        if !is_view_group(graph, ops, storage) {
            group_of.extend(ops.iter().map(|&o| (o, index)));
        }
    }
    group_of
}

impl<'g> Rebuild<'g> {
    fn new(graph: &'g Graph, standalone: bool) -> Self {
        Rebuild {
            old: graph,
            new: Graph::new(graph.name()),
            map: FxHashMap::default(),
            reserved: graph
                .value_ids()
                .map(|v| graph.value(v).name.as_str())
                .collect(),
            standalone,
        }
    }
}

/// Group `index` of a plan built exactly as [`apply_plan`] builds it, alone:
/// a graph whose parameters are the values the group reads from outside and
/// whose body is its `fused` op, or `None` when nothing outside reads the
/// group (it would be dropped). `group_of` gives the plan's group of an op
/// (as [`partition`] does; `None` for ops in no group).
pub(crate) fn standalone_group(
    graph: &Graph,
    planned: &PlannedGroup,
    index: usize,
    users: &FxHashMap<ValueId, Vec<OpId>>,
    group_of: &dyn Fn(OpId) -> Option<usize>,
    stored_reader: &dyn Fn(usize) -> bool,
) -> Result<Option<(Graph, OpId)>, String> {
    let mut rb = Rebuild::new(graph, true);
    let Some(fused) = emit_group(&mut rb, planned, index, users, group_of, stored_reader)? else {
        return Ok(None);
    };
    let results = rb.new.op(fused).results.clone();
    let types = results.iter().map(|&r| rb.new.ty(r).clone()).collect();
    rb.new.set_result_types(types);
    let ret = rb
        .new
        .create_op(OpKind::Return, results, Attrs::new(), Vec::new())
        .map_err(|e| e.to_string())?;
    let body = rb.new.body();
    rb.new.append_op(body, ret);
    Ok(Some((rb.new, fused)))
}

/// The graph with every group of `plan` as one `fused` op.
pub fn apply_plan(graph: &Graph, plan: &Plan) -> Result<Graph, String> {
    Ok(apply_plan_indexed(graph, plan)?.0)
}

/// [`apply_plan`], with each `fused` op of the result and the index of the
/// plan group it holds.
pub(crate) fn apply_plan_indexed(
    graph: &Graph,
    plan: &Plan,
) -> Result<(Graph, Vec<(OpId, usize)>), String> {
    let mut rb = Rebuild::new(graph, false);
    rb.new.loc = graph.loc;
    rb.new.set_result_types(graph.result_types().to_vec());
    for &p in graph.params() {
        let v = rb
            .new
            .add_param(graph.value(p).name.clone(), graph.ty(p).clone())
            .map_err(|e| e.to_string())?;
        rb.map.insert(p, v);
    }
    let body = rb.new.body();
    let users = users_of(graph);
    let storage = concat_storage(graph);
    let partition = partition(
        graph,
        &storage,
        plan.groups.iter().map(|g| g.group.ops.as_slice()),
    );
    let group_of = |op: OpId| partition.get(&op).copied();
    let stored_reader = |g: usize| reads_stored(&plan.groups[g]);
    // Constants stay in the body where something outside a region reads them.
    for &op in &graph.block(graph.body()).ops {
        let d = graph.op(op);
        if d.kind != OpKind::Constant {
            continue;
        }
        let needed_outside = d.results.iter().any(|r| {
            users.get(r).is_some_and(|us| {
                us.iter().any(|u| {
                    !partition.contains_key(u) || splat_constant(graph, &users, *r).is_none()
                })
            })
        });
        if needed_outside {
            let mut local = FxHashMap::default();
            rb.copy_op(op, body, &mut local, &|rb, r| rb.old.value(r).name.clone())?;
            rb.map.extend(local);
        }
    }
    let mut fused_ops = Vec::new();
    for (index, planned) in plan.groups.iter().enumerate() {
        if is_view_group(graph, &planned.group.ops, &storage) {
            let mut local = FxHashMap::default();
            let op = planned.group.ops[0];
            rb.copy_op(op, body, &mut local, &|rb, r| rb.old.value(r).name.clone())?;
            rb.map.extend(local);
            continue;
        }
        if let Some(fused) = emit_group(&mut rb, planned, index, &users, &group_of, &stored_reader)?
        {
            fused_ops.push((fused, index));
        }
    }
    let ret = graph
        .outputs()
        .ok_or("the graph body does not end in `return`")?;
    let operands = ret
        .iter()
        .map(|v| rb.map.get(v).copied().ok_or("a returned value was lost"))
        .collect::<Result<Vec<_>, _>>()?;
    let ret_op = rb
        .new
        .create_op(OpKind::Return, operands, Attrs::new(), Vec::new())
        .map_err(|e| e.to_string())?;
    rb.new.append_op(body, ret_op);
    Ok((rb.new, fused_ops))
}

/// Appends group `index` to the body as one `fused` op and returns it, or
/// `None` when nothing outside reads the group (dead code, no kernel).
fn emit_group(
    rb: &mut Rebuild<'_>,
    planned: &PlannedGroup,
    index: usize,
    users: &FxHashMap<ValueId, Vec<OpId>>,
    group_of: &dyn Fn(OpId) -> Option<usize>,
    stored_reader: &dyn Fn(usize) -> bool,
) -> Result<Option<OpId>, String> {
    let graph = rb.old;
    let copies_views = !stored_reader(index);
    let ops = &planned.group.ops;
    let inside: FxHashSet<OpId> = ops.iter().copied().collect();
    let region = rb.new.create_block();
    let mut local: FxHashMap<ValueId, ValueId> = FxHashMap::default();
    let mut operands = Vec::new();
    // Region arguments first, then splat constants and views of parameters
    // copied in (their own inputs become arguments too).
    let mut copied: Vec<OpId> = Vec::new();
    let mut arguments: Vec<ValueId> = Vec::new();
    for v in planned.group.inputs(graph) {
        if let Some(c) = splat_constant(graph, users, v) {
            copied.push(c);
        } else if let Some(chain) = portable_view(graph, users, group_of, v)
            && copies_views
        {
            for &op in &chain {
                for &operand in &graph.op(op).operands {
                    match splat_constant(graph, users, operand) {
                        Some(c) => copied.push(c),
                        None if !chain
                            .iter()
                            .any(|o| graph.op(*o).results.contains(&operand)) =>
                        {
                            arguments.push(operand)
                        }
                        None => {}
                    }
                }
                copied.push(op);
            }
        } else {
            arguments.push(v);
        }
    }
    for v in arguments {
        if local.contains_key(&v) {
            continue;
        }
        let outer = match rb.map.get(&v) {
            Some(&outer) => outer,
            None if rb.standalone => {
                let param = rb
                    .new
                    .add_param(graph.value(v).name.clone(), graph.ty(v).clone())
                    .map_err(|e| e.to_string())?;
                rb.map.insert(v, param);
                param
            }
            None => {
                return Err(format!(
                    "%{} is used before the group that defines it",
                    graph.value(v).name
                ));
            }
        };
        let name = rb.fresh(&format!("{}.in", graph.value(v).name));
        let arg = rb
            .new
            .add_block_arg(region, name, graph.ty(v).clone())
            .map_err(|e| e.to_string())?;
        local.insert(v, arg);
        operands.push(outer);
    }
    for c in copied {
        if graph.op(c).results.iter().all(|r| local.contains_key(r)) {
            continue;
        }
        rb.copy_op(c, region, &mut local, &|rb, r| {
            let hint = format!("{}.c", rb.old.value(r).name);
            rb.fresh(&hint)
        })?;
    }
    // A portable view escapes only to readers that are not groups (the
    // return, a plain reshape) or read it stored (a library call): other
    // groups copy it instead.
    let escapes = |r: ValueId| {
        let copied_by_groups = portable_view(graph, users, group_of, r).is_some();
        users.get(&r).is_some_and(|us| {
            us.iter().any(|u| {
                let copied_by_reader =
                    copied_by_groups && group_of(*u).is_some_and(|g| !stored_reader(g));
                !(inside.contains(u) || copied_by_reader)
            })
        })
    };
    let outputs: Vec<ValueId> = ops
        .iter()
        .flat_map(|&o| graph.op(o).results.clone())
        .filter(|&r| escapes(r))
        .collect();
    if outputs.is_empty() {
        // Nothing outside reads the group: it is dead code and no kernel.
        return Ok(None);
    }
    for &op in ops {
        rb.copy_op(op, region, &mut local, &|rb, r| {
            let name = &rb.old.value(r).name;
            if outputs.contains(&r) {
                rb.fresh(&format!("{name}.r"))
            } else {
                name.clone()
            }
        })?;
    }
    let yielded = outputs.iter().map(|r| local[r]).collect();
    let y = rb
        .new
        .create_op(OpKind::Yield, yielded, Attrs::new(), Vec::new())
        .map_err(|e| e.to_string())?;
    rb.new.append_op(region, y);
    let results = outputs
        .iter()
        .map(|&r| (graph.value(r).name.clone(), graph.ty(r).clone()))
        .collect();
    let fused = rb
        .new
        .create_op(OpKind::Fused, operands, group_attrs(planned), results)
        .map_err(|e| e.to_string())?;
    rb.new.op_mut(fused).loc = graph.op(ops[0]).loc;
    rb.new.set_region(fused, region, format!("g{index}"));
    let body = rb.new.body();
    rb.new.append_op(body, fused);
    for (&r, &n) in outputs.iter().zip(&rb.new.op(fused).results.clone()) {
        rb.map.insert(r, n);
    }
    Ok(Some(fused))
}
