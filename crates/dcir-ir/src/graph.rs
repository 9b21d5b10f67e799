//! Modules, graphs, blocks, ops and values.
//!
//! A [`Graph`] owns three arenas (values, ops, blocks) addressed by typed ids.
//! The graph's body is a block whose arguments are the graph parameters and
//! whose last op is `return`; a `fused` op owns one more block whose arguments
//! bind the op's operands and whose last op is `yield`. Blocks list their ops
//! in execution order; an op removed from every block is dead and is not
//! printed. Value names are unique within a graph.

use rustc_hash::FxHashSet as HashSet;
use std::fmt;

use crate::attr::Attrs;
use crate::op::OpKind;
use crate::types::TensorType;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u32);

        impl $name {
            /// The arena index.
            pub fn index(self) -> usize {
                self.0 as usize
            }

            fn from_index(index: usize) -> $name {
                $name(u32::try_from(index).expect("arena larger than u32::MAX"))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// A value of a graph (block argument or op result).
    ValueId,
    "v"
);
id_type!(
    /// An op of a graph.
    OpId,
    "op"
);
id_type!(
    /// A block of a graph (the body, or a `fused` op's region).
    BlockId,
    "block"
);

/// A byte range in the source text an op or graph was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    /// First byte.
    pub start: u32,
    /// One past the last byte.
    pub end: u32,
}

impl Span {
    /// A span from byte offsets (saturating at `u32::MAX`).
    pub fn new(start: usize, end: usize) -> Span {
        let clamp = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        Span {
            start: clamp(start),
            end: clamp(end),
        }
    }

    /// The byte range.
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// Where an op or graph came from: debug information only (graph equality
/// ignores it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Location(pub Option<Span>);

/// What defines a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// Argument `index` of `block` (a graph parameter or a fused-region argument).
    BlockArg {
        /// The block.
        block: BlockId,
        /// Position among the block's arguments.
        index: usize,
    },
    /// Result `index` of `op`.
    OpResult {
        /// The op.
        op: OpId,
        /// Position among the op's results.
        index: usize,
    },
}

/// A value: its printed name, type and definition.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueData {
    /// Name without the `%`, unique in the graph.
    pub name: String,
    /// Type.
    pub ty: TensorType,
    /// Definition.
    pub def: ValueDef,
}

/// An op: kind, operands, results, attributes and (for `fused`) a region.
#[derive(Clone, Debug, PartialEq)]
pub struct OpData {
    /// What the op does.
    pub kind: OpKind,
    /// Operands, in order.
    pub operands: Vec<ValueId>,
    /// Results, in order.
    pub results: Vec<ValueId>,
    /// Attributes, canonical (see [`OpKind::normalize_attrs`]).
    pub attrs: Attrs,
    /// The region's block, for `fused`.
    pub region: Option<BlockId>,
    /// The group's symbol (`@g0`), for `fused`.
    pub symbol: Option<String>,
    /// The block this op is listed in, or `None` once removed.
    pub parent: Option<BlockId>,
    /// Source location.
    pub loc: Location,
}

/// A block: arguments and ops in execution order, the terminator last.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct BlockData {
    /// Block arguments.
    pub args: Vec<ValueId>,
    /// Ops in order.
    pub ops: Vec<OpId>,
    /// The op owning this block as its region, `None` for a graph body.
    pub owner: Option<OpId>,
}

/// One computational graph: a named function from parameters to results.
///
/// Equality is structural: the name, the signature, and block by block the
/// arguments (name, type) and live ops (kind, operand names, results' names
/// and types, attributes, symbol, region) in order. Arena layout, removed
/// ops and locations do not count, so a graph equals its own printed text
/// read back.
#[derive(Clone, Debug)]
pub struct Graph {
    name: String,
    values: Vec<ValueData>,
    ops: Vec<OpData>,
    blocks: Vec<BlockData>,
    body: BlockId,
    result_types: Vec<TensorType>,
    names: HashSet<String>,
    next_fresh: usize,
    /// Source location of the graph header.
    pub loc: Location,
}

impl PartialEq for Graph {
    fn eq(&self, other: &Graph) -> bool {
        self.name == other.name
            && self.result_types == other.result_types
            && blocks_equal(self, self.body, other, other.body)
    }
}

fn blocks_equal(a: &Graph, ab: BlockId, b: &Graph, bb: BlockId) -> bool {
    let values_equal = |x: &[ValueId], y: &[ValueId]| {
        x.len() == y.len()
            && x.iter().zip(y).all(|(&u, &v)| {
                let (u, v) = (a.value(u), b.value(v));
                u.name == v.name && u.ty == v.ty
            })
    };
    let (ab, bb) = (a.block(ab), b.block(bb));
    values_equal(&ab.args, &bb.args)
        && ab.ops.len() == bb.ops.len()
        && ab.ops.iter().zip(&bb.ops).all(|(&x, &y)| {
            let (x, y) = (a.op(x), b.op(y));
            x.kind == y.kind
                && x.attrs == y.attrs
                && x.symbol == y.symbol
                && values_equal(&x.operands, &y.operands)
                && values_equal(&x.results, &y.results)
                && match (x.region, y.region) {
                    (Some(xr), Some(yr)) => blocks_equal(a, xr, b, yr),
                    (None, None) => true,
                    _ => false,
                }
        })
}

/// Why a value cannot be created.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// The name is taken by another value of the graph.
    #[error("value %{0} is already defined in this graph")]
    DuplicateName(String),
}

impl Graph {
    /// An empty graph (body block with no parameters, no ops).
    pub fn new(name: impl Into<String>) -> Graph {
        Graph {
            name: name.into(),
            values: Vec::new(),
            ops: Vec::new(),
            blocks: vec![BlockData::default()],
            body: BlockId(0),
            result_types: Vec::new(),
            names: HashSet::default(),
            next_fresh: 0,
            loc: Location::default(),
        }
    }

    /// The graph's name (without `@`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Renames the graph.
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }

    /// The body block.
    pub fn body(&self) -> BlockId {
        self.body
    }

    /// The parameters (arguments of the body).
    pub fn params(&self) -> &[ValueId] {
        &self.blocks[self.body.index()].args
    }

    /// Declared result types.
    pub fn result_types(&self) -> &[TensorType] {
        &self.result_types
    }

    /// Sets the declared result types.
    pub fn set_result_types(&mut self, types: Vec<TensorType>) {
        self.result_types = types;
    }

    /// The values returned by the body's terminator, if it is a `return`.
    pub fn outputs(&self) -> Option<&[ValueId]> {
        let last = *self.block(self.body).ops.last()?;
        let op = self.op(last);
        (op.kind == OpKind::Return).then_some(op.operands.as_slice())
    }

    /// A value.
    pub fn value(&self, id: ValueId) -> &ValueData {
        &self.values[id.index()]
    }

    /// An op.
    pub fn op(&self, id: OpId) -> &OpData {
        &self.ops[id.index()]
    }

    /// An op, mutably. Changing `results`, `region` or `parent` by hand can
    /// break the graph's links; prefer the graph's methods.
    pub fn op_mut(&mut self, id: OpId) -> &mut OpData {
        &mut self.ops[id.index()]
    }

    /// A block.
    pub fn block(&self, id: BlockId) -> &BlockData {
        &self.blocks[id.index()]
    }

    /// The type of a value.
    pub fn ty(&self, id: ValueId) -> &TensorType {
        &self.values[id.index()].ty
    }

    /// Sets the type of a value. The ops that define and use it must stay
    /// well-typed (the verifier checks).
    pub fn set_ty(&mut self, id: ValueId, ty: TensorType) {
        self.values[id.index()].ty = ty;
    }

    /// Number of entries in the value arena (live or dead).
    pub fn value_count(&self) -> usize {
        self.values.len()
    }

    /// Every value id of the arena (live or dead), in creation order.
    pub fn value_ids(&self) -> impl Iterator<Item = ValueId> + use<> {
        (0..self.values.len()).map(ValueId::from_index)
    }

    /// Number of entries in the op arena (live or dead).
    pub fn op_count(&self) -> usize {
        self.ops.len()
    }

    /// Number of blocks.
    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    /// Renames value `v` to `name`, which no other value may have.
    pub fn rename_value(&mut self, v: ValueId, name: &str) -> Result<(), String> {
        if self.values[v.index()].name == name {
            return Ok(());
        }
        if self.names.contains(name) {
            return Err(format!("the name %{name} is taken"));
        }
        let old = std::mem::replace(&mut self.values[v.index()].name, name.to_string());
        self.names.remove(&old);
        self.names.insert(name.to_string());
        Ok(())
    }

    /// True if `name` is taken by a value of this graph.
    pub fn has_name(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// A name no value of the graph has: `hint` if free, else `hint.N`, or
    /// `N` for an empty hint.
    pub fn fresh_name(&mut self, hint: &str) -> String {
        if !hint.is_empty() && !self.names.contains(hint) {
            return hint.to_string();
        }
        loop {
            let n = self.next_fresh;
            self.next_fresh += 1;
            let candidate = if hint.is_empty() {
                n.to_string()
            } else {
                format!("{hint}.{n}")
            };
            if !self.names.contains(&candidate) {
                return candidate;
            }
        }
    }

    fn new_value(
        &mut self,
        name: String,
        ty: TensorType,
        def: ValueDef,
    ) -> Result<ValueId, GraphError> {
        if !self.names.insert(name.clone()) {
            return Err(GraphError::DuplicateName(name));
        }
        let id = ValueId::from_index(self.values.len());
        self.values.push(ValueData { name, ty, def });
        Ok(id)
    }

    /// Appends an argument named `name` to `block` (a parameter, for the body).
    pub fn add_block_arg(
        &mut self,
        block: BlockId,
        name: impl Into<String>,
        ty: TensorType,
    ) -> Result<ValueId, GraphError> {
        let index = self.blocks[block.index()].args.len();
        let id = self.new_value(name.into(), ty, ValueDef::BlockArg { block, index })?;
        self.blocks[block.index()].args.push(id);
        Ok(id)
    }

    /// Appends a parameter to the graph.
    pub fn add_param(
        &mut self,
        name: impl Into<String>,
        ty: TensorType,
    ) -> Result<ValueId, GraphError> {
        self.add_block_arg(self.body, name, ty)
    }

    /// Creates an op that is not yet in any block, with results of the given
    /// names and types. Nothing is checked but name uniqueness: run the
    /// verifier afterwards.
    pub fn create_op(
        &mut self,
        kind: OpKind,
        operands: Vec<ValueId>,
        attrs: Attrs,
        results: Vec<(String, TensorType)>,
    ) -> Result<OpId, GraphError> {
        let mut seen = HashSet::default();
        if let Some(dup) = results
            .iter()
            .map(|(n, _)| n)
            .find(|n| self.names.contains(*n) || !seen.insert(*n))
        {
            return Err(GraphError::DuplicateName(dup.clone()));
        }
        let op = OpId::from_index(self.ops.len());
        self.ops.push(OpData {
            kind,
            operands,
            results: Vec::new(),
            attrs,
            region: None,
            symbol: None,
            parent: None,
            loc: Location::default(),
        });
        for (index, (name, ty)) in results.into_iter().enumerate() {
            let v = self.new_value(name, ty, ValueDef::OpResult { op, index })?;
            self.ops[op.index()].results.push(v);
        }
        Ok(op)
    }

    /// Creates an empty block owned by no op yet; its arguments are added
    /// with [`Graph::add_block_arg`], and [`Graph::set_region`] hands it to
    /// a `fused` op once that op exists.
    pub fn create_block(&mut self) -> BlockId {
        let block = BlockId::from_index(self.blocks.len());
        self.blocks.push(BlockData::default());
        block
    }

    /// Makes `block` the region of `op`, with `symbol` naming the group.
    pub fn set_region(&mut self, op: OpId, block: BlockId, symbol: impl Into<String>) {
        assert!(block != self.body, "the graph body cannot be a region");
        self.blocks[block.index()].owner = Some(op);
        let data = &mut self.ops[op.index()];
        data.region = Some(block);
        data.symbol = Some(symbol.into());
    }

    /// Appends a parentless op at the end of `block`.
    pub fn append_op(&mut self, block: BlockId, op: OpId) {
        let len = self.blocks[block.index()].ops.len();
        self.insert_op(block, len, op);
    }

    /// Inserts a parentless op into `block` at position `pos`.
    pub fn insert_op(&mut self, block: BlockId, pos: usize, op: OpId) {
        assert!(
            self.ops[op.index()].parent.is_none(),
            "{op} is already in a block"
        );
        self.blocks[block.index()].ops.insert(pos, op);
        self.ops[op.index()].parent = Some(block);
    }

    /// Takes `op` out of its block. Its results keep their names; uses of
    /// them elsewhere are the caller's to rewrite.
    pub fn remove_op(&mut self, op: OpId) {
        if let Some(block) = self.ops[op.index()].parent.take() {
            self.blocks[block.index()].ops.retain(|&o| o != op);
        }
    }

    /// Replaces every use of `from` by `to` in the live ops of the graph.
    /// A graph output keeps its name through the rewrite: when `from` is
    /// returned and `to` is an op result the graph does not return already,
    /// the two swap names (a parameter keeps its own).
    pub fn replace_all_uses(&mut self, from: ValueId, to: ValueId) {
        let outputs = self.outputs().unwrap_or_default();
        if from != to
            && outputs.contains(&from)
            && !outputs.contains(&to)
            && matches!(self.value(to).def, ValueDef::OpResult { .. })
        {
            let (a, b) = (from.index(), to.index());
            let name = std::mem::take(&mut self.values[a].name);
            self.values[a].name = std::mem::replace(&mut self.values[b].name, name);
        }
        for op in &mut self.ops {
            if op.parent.is_some() {
                for v in &mut op.operands {
                    if *v == from {
                        *v = to;
                    }
                }
            }
        }
    }

    /// The live ops of `block` and of the regions nested in it, in pre-order.
    pub fn walk_ops(&self, block: BlockId) -> Vec<OpId> {
        let mut out = Vec::new();
        self.walk_into(block, &mut out);
        out
    }

    fn walk_into(&self, block: BlockId, out: &mut Vec<OpId>) {
        for &op in &self.block(block).ops {
            out.push(op);
            if let Some(region) = self.op(op).region {
                self.walk_into(region, out);
            }
        }
    }

    /// Every live op of the graph, in pre-order.
    pub fn all_ops(&self) -> Vec<OpId> {
        self.walk_ops(self.body)
    }
}

/// A module: graphs with unique names, in order.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Module {
    /// The graphs, in the order they are printed.
    pub graphs: Vec<Graph>,
}

impl Module {
    /// An empty module.
    pub fn new() -> Module {
        Module::default()
    }

    /// The graph named `name`.
    pub fn graph(&self, name: &str) -> Option<&Graph> {
        self.graphs.iter().find(|g| g.name() == name)
    }

    /// Number of live ops in all graphs, regions included.
    pub fn op_count(&self) -> usize {
        self.graphs.iter().map(|g| g.all_ops().len()).sum()
    }
}
