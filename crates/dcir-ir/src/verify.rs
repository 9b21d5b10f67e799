//! The verifier: the invariants every pass may rely on and must preserve.
//!
//! [`verify_module`] checks, and reports every violation it finds:
//!
//! 1. **Names.** Graph names are non-empty identifiers, unique in the module;
//!    value names are non-empty, made of `[A-Za-z0-9_.]`, unique in their graph;
//!    attribute names are identifiers. Every value's size in bytes is at
//!    most [`MAX_TENSOR_BYTES`] (its element count and byte size never
//!    overflow).
//! 2. **Blocks.** Every block is non-empty and ends in its terminator — `return`
//!    for a graph body, `yield` for a `fused` region — and holds no other
//!    terminator. Every listed op names that block as its parent.
//! 3. **Arity and regions.** Operand and result counts follow the op table; an
//!    op has a region exactly when the table says so (`fused`), a `fused` op
//!    has a symbol, and regions hold no `fused` op (groups do not nest).
//! 4. **Attributes.** Each op's attributes are those of its schema, of the
//!    schema's kinds and in canonical order ([`OpKind::normalize_attrs`]).
//! 5. **SSA.** Every operand is defined before its use in the same block, or is
//!    an argument of that block; a `fused` region is isolated — its ops use
//!    only its arguments and its own results. Uses of values whose op was
//!    removed are reported. Uses before definition that close a dependence
//!    cycle are reported once, as the cycle, naming the values on it.
//! 6. **Types.** Each op's result types follow its type rule
//!    ([`crate::shape::check_types`]), which also checks attribute ranges
//!    (strides > 0, pads >= 0, `groups` divides the channels, `perm` is a
//!    permutation, axes in range, ...).
//! 7. **Signatures.** `return` operands have the graph's declared result types;
//!    a `fused` region has one argument per operand, of the operand's type, and
//!    its `yield` operands have the op's result types.

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fmt;

use petgraph::graph::DiGraph;

use crate::graph::{BlockId, Graph, Location, Module, OpId, ValueDef, ValueId};
use crate::op::OpKind;
use crate::shape::check_types;
use crate::types::TensorType;

/// One violated invariant.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyError {
    /// The graph it was found in.
    pub graph: String,
    /// The offending op, when one is to blame.
    pub op: Option<OpId>,
    /// Where to point the user.
    pub loc: Location,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in graph @{}: {}", self.graph, self.message)
    }
}

impl std::error::Error for VerifyError {}

/// Checks every invariant of the module doc; returns all violations found.
pub fn verify_module(module: &Module) -> Result<(), Vec<VerifyError>> {
    let mut errors = Vec::new();
    let mut seen = HashSet::default();
    for g in &module.graphs {
        if !is_identifier(g.name()) {
            errors.push(VerifyError {
                graph: g.name().to_string(),
                op: None,
                loc: g.loc,
                message: format!("graph name `@{}` is not an identifier", g.name()),
            });
        }
        if !seen.insert(g.name()) {
            errors.push(VerifyError {
                graph: g.name().to_string(),
                op: None,
                loc: g.loc,
                message: format!("graph @{} is defined twice", g.name()),
            });
        }
        if let Err(mut e) = verify_graph(g) {
            errors.append(&mut e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Checks one graph (every invariant but module-level name uniqueness).
pub fn verify_graph(graph: &Graph) -> Result<(), Vec<VerifyError>> {
    let mut v = Verifier {
        g: graph,
        errors: Vec::new(),
    };
    v.check_value_names();
    v.check_block(graph.body(), OpKind::Return);
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(v.errors)
    }
}

/// The most bytes a tensor may hold (`isize::MAX`, the most one allocation
/// can have): the verifier rejects a value whose size exceeds it or whose
/// element count overflows, so sizes computed from verified types never wrap.
pub const MAX_TENSOR_BYTES: usize = isize::MAX as usize;

/// True for `[A-Za-z_][A-Za-z0-9_.]*`.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// True for a non-empty `[A-Za-z0-9_.]+`.
pub fn is_value_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

struct Verifier<'a> {
    g: &'a Graph,
    errors: Vec<VerifyError>,
}

impl Verifier<'_> {
    fn error(&mut self, op: Option<OpId>, message: String) {
        let loc = op.map_or(self.g.loc, |o| self.g.op(o).loc);
        self.errors.push(VerifyError {
            graph: self.g.name().to_string(),
            op,
            loc,
            message,
        });
    }

    fn name(&self, v: ValueId) -> String {
        format!("%{}", self.g.value(v).name)
    }

    fn check_value_names(&mut self) {
        let mut seen = HashSet::default();
        for id in self.g.value_ids() {
            let data = self.g.value(id);
            let owner = match data.def {
                ValueDef::OpResult { op, .. } => Some(op),
                ValueDef::BlockArg { .. } => None,
            };
            if !is_value_name(&data.name) {
                self.error(
                    owner,
                    format!(
                        "value name `%{}` is not of the form [A-Za-z0-9_.]+",
                        data.name
                    ),
                );
            }
            if !seen.insert(data.name.as_str()) {
                self.error(owner, format!("value %{} is defined twice", data.name));
            }
            let ty = self.g.ty(id);
            if ty.size_bytes().is_none_or(|b| b > MAX_TENSOR_BYTES) {
                self.error(
                    owner,
                    format!(
                        "value %{} of type {ty} is too large: {} bytes, more than the {MAX_TENSOR_BYTES} bytes (2^63 - 1) a tensor may hold",
                        data.name,
                        ty.shape
                            .dims()
                            .iter()
                            .fold(ty.dtype.size_bytes() as u128, |n, &d| n.saturating_mul(d as u128))
                    ),
                );
            }
        }
    }

    fn check_block(&mut self, block: BlockId, terminator: OpKind) {
        let g = self.g;
        let data = g.block(block);
        let owner = data.owner;
        match data.ops.last() {
            None => self.error(
                owner,
                format!(
                    "a block must end with `{}`, this one is empty",
                    terminator.name()
                ),
            ),
            Some(&last) if g.op(last).kind != terminator => self.error(
                Some(last),
                format!(
                    "a block must end with `{}`, this one ends with `{}`",
                    terminator.name(),
                    g.op(last).kind.name()
                ),
            ),
            _ => {}
        }
        let mut defined: HashSet<ValueId> = data.args.iter().copied().collect();
        let mut late_uses = Vec::new();
        for (pos, &op) in data.ops.iter().enumerate() {
            let d = g.op(op);
            if d.parent != Some(block) {
                self.error(
                    Some(op),
                    format!(
                        "`{}` is listed in {block} but its parent is {:?}",
                        d.kind.name(),
                        d.parent
                    ),
                );
            }
            if d.kind.info().is_terminator && pos + 1 != data.ops.len() {
                self.error(
                    Some(op),
                    format!("`{}` must be the last op of its block", d.kind.name()),
                );
            } else if d.kind.info().is_terminator && d.kind != terminator {
                let place = if terminator == OpKind::Return {
                    "a graph body"
                } else {
                    "a fused region"
                };
                self.error(
                    Some(op),
                    format!(
                        "`{}` cannot end {place}; use `{}`",
                        d.kind.name(),
                        terminator.name()
                    ),
                );
            }
            for &operand in &d.operands {
                if defined.contains(&operand) {
                    continue;
                }
                if self.is_defined_later(op, block, operand) {
                    late_uses.push((op, operand));
                }
            }
            defined.extend(d.results.iter().copied());
            self.check_op(op, terminator);
        }
        if !late_uses.is_empty() {
            self.report_late_uses(block, &late_uses);
        }
    }

    /// Handles an operand not yet defined at its use: reports it, unless it
    /// is defined later in the same block, which is a use before definition
    /// or a cycle and is reported by [`Verifier::report_late_uses`] (true).
    fn is_defined_later(&mut self, op: OpId, block: BlockId, operand: ValueId) -> bool {
        let g = self.g;
        let name = self.name(operand);
        let def_block = match g.value(operand).def {
            ValueDef::BlockArg { block, .. } => Some(block),
            ValueDef::OpResult { op: def, .. } => g.op(def).parent,
        };
        match def_block {
            None => {
                self.error(
                    Some(op),
                    format!("{name} is used, but the op that defined it was removed"),
                );
                false
            }
            Some(b) if b == block => true,
            Some(_) if g.block(block).owner.is_some() => {
                self.error(
                    Some(op),
                    format!(
                        "{name} is defined outside this fused region; bind it to a region argument"
                    ),
                );
                false
            }
            Some(_) => {
                self.error(
                    Some(op),
                    format!(
                        "{name} is defined inside a fused region and cannot be used outside it"
                    ),
                );
                false
            }
        }
    }

    /// Reports each dependence cycle of `block` once, at its first op, and
    /// every other use before definition at the use.
    fn report_late_uses(&mut self, block: BlockId, late_uses: &[(OpId, ValueId)]) {
        let g = self.g;
        let ops = &g.block(block).ops;
        let position: HashMap<OpId, usize> = ops.iter().enumerate().map(|(i, &o)| (o, i)).collect();
        let mut dep = DiGraph::<usize, ()>::new();
        let nodes: Vec<_> = (0..ops.len()).map(|i| dep.add_node(i)).collect();
        for (i, &op) in ops.iter().enumerate() {
            for &operand in &g.op(op).operands {
                if let ValueDef::OpResult { op: def, .. } = g.value(operand).def
                    && let Some(&j) = position.get(&def)
                {
                    dep.add_edge(nodes[j], nodes[i], ());
                }
            }
        }
        let mut in_cycle = HashSet::default();
        for scc in petgraph::algo::tarjan_scc(&dep) {
            if scc.len() == 1 && !dep.contains_edge(scc[0], scc[0]) {
                continue;
            }
            let mut members: Vec<usize> = scc.iter().map(|&n| dep[n]).collect();
            members.sort_unstable();
            let names: Vec<String> = members
                .iter()
                .flat_map(|&i| g.op(ops[i]).results.iter().map(|&r| self.name(r)))
                .collect();
            self.error(
                Some(ops[members[0]]),
                format!("dependence cycle through {}", names.join(", ")),
            );
            in_cycle.extend(members.into_iter().map(|i| ops[i]));
        }
        for &(op, operand) in late_uses {
            if !in_cycle.contains(&op) {
                let name = self.name(operand);
                self.error(Some(op), format!("{name} is used before its definition"));
            }
        }
    }

    fn check_op(&mut self, op: OpId, terminator: OpKind) {
        let g = self.g;
        let d = g.op(op);
        let info = d.kind.info();
        if !info.operands.accepts(d.operands.len()) {
            self.error(
                Some(op),
                format!(
                    "`{}` takes {} operands, found {}",
                    info.name,
                    info.operands.describe(),
                    d.operands.len()
                ),
            );
            return;
        }
        if !info.results.accepts(d.results.len()) {
            self.error(
                Some(op),
                format!(
                    "`{}` has {} results, found {}",
                    info.name,
                    info.results.describe(),
                    d.results.len()
                ),
            );
            return;
        }
        if !d.kind.attrs_are_canonical(&d.attrs) {
            let message = match d.kind.normalize_attrs(d.attrs.clone()) {
                Err(e) => e.message,
                Ok(_) => format!(
                    "the attributes of `{}` are not in canonical form (built without normalize_attrs)",
                    info.name
                ),
            };
            self.error(Some(op), message);
        }
        if let Some((bad, _)) = d.attrs.iter().find(|(n, _)| !is_identifier(n)) {
            self.error(
                Some(op),
                format!("attribute name `{bad}` is not an identifier"),
            );
        }
        let operand_types: Vec<&TensorType> = d.operands.iter().map(|&v| g.ty(v)).collect();
        let result_types: Vec<&TensorType> = d.results.iter().map(|&v| g.ty(v)).collect();
        if let Err(msg) = check_types(d.kind, &d.attrs, &operand_types, &result_types) {
            self.error(Some(op), msg);
        }
        match (info.has_region, d.region) {
            (true, None) => self.error(Some(op), format!("`{}` needs a region", info.name)),
            (false, Some(_)) => {
                self.error(Some(op), format!("`{}` cannot have a region", info.name))
            }
            (true, Some(region)) => self.check_fused(op, region, terminator),
            (false, None) => {}
        }
        if d.kind == OpKind::Return {
            let declared: Vec<&TensorType> = g.result_types().iter().collect();
            if operand_types != declared {
                self.error(
                    Some(op),
                    format!(
                        "`return` gives ({}) but the graph declares ({})",
                        join(&operand_types),
                        join(&declared)
                    ),
                );
            }
        }
    }

    fn check_fused(&mut self, op: OpId, region: BlockId, outer_terminator: OpKind) {
        let g = self.g;
        let d = g.op(op);
        if outer_terminator == OpKind::Yield {
            self.error(Some(op), "`fused` groups cannot nest".to_string());
            return;
        }
        if g.block(region).owner != Some(op) {
            self.error(
                Some(op),
                format!("the region {region} of this `fused` op names another owner"),
            );
        }
        if d.symbol.as_deref().is_none_or(|s| !is_identifier(s)) {
            self.error(Some(op), "`fused` needs a symbol such as @g0".to_string());
        }
        let args = &g.block(region).args;
        if args.len() != d.operands.len() {
            self.error(
                Some(op),
                format!(
                    "`fused` has {} operands but its region has {} arguments",
                    d.operands.len(),
                    args.len()
                ),
            );
        } else {
            for (&arg, &operand) in args.iter().zip(&d.operands) {
                if g.ty(arg) != g.ty(operand) {
                    self.error(
                        Some(op),
                        format!(
                            "region argument {} is {} but is bound to {} of type {}",
                            self.name(arg),
                            g.ty(arg),
                            self.name(operand),
                            g.ty(operand)
                        ),
                    );
                }
            }
        }
        self.check_block(region, OpKind::Yield);
        if let Some(&last) = g.block(region).ops.last() {
            let y = g.op(last);
            if y.kind == OpKind::Yield {
                let given: Vec<&TensorType> = y.operands.iter().map(|&v| g.ty(v)).collect();
                let declared: Vec<&TensorType> = d.results.iter().map(|&v| g.ty(v)).collect();
                if given != declared {
                    self.error(
                        Some(last),
                        format!(
                            "`yield` gives ({}) but the fused op declares ({})",
                            join(&given),
                            join(&declared)
                        ),
                    );
                }
            }
        }
    }
}

fn join(types: &[&TensorType]) -> String {
    types
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
