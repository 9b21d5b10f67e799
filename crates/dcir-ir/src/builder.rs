//! A builder for programs that construct graphs: types are inferred,
//! attributes normalized, names made fresh, and the result verified.

use crate::attr::{Attr, Attrs};
use crate::graph::{BlockId, Graph, GraphError, ValueId};
use crate::op::{AttrError, OpKind};
use crate::shape::{check_types, infer_types};
use crate::types::{DType, TensorType};
use crate::verify::{VerifyError, verify_graph};

/// Why the builder refused an op.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Attributes do not fit the op's schema.
    #[error(transparent)]
    Attr(#[from] AttrError),
    /// Operand or result types break the op's rule.
    #[error("`{op}`: {message}")]
    Type {
        /// The op.
        op: &'static str,
        /// The rule's message.
        message: String,
    },
    /// A name is taken.
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The finished graph does not verify.
    #[error("the built graph does not verify: {}", .0.iter().map(|e| e.message.clone()).collect::<Vec<_>>().join("; "))]
    Verify(Vec<VerifyError>),
}

/// Normalized attributes and the inferred result type of a new op.
fn inferred(
    graph: &Graph,
    kind: OpKind,
    operands: &[ValueId],
    attrs: Attrs,
) -> Result<(Attrs, TensorType), BuildError> {
    let attrs = kind.normalize_attrs(attrs)?;
    let types: Vec<&TensorType> = operands.iter().map(|&v| graph.ty(v)).collect();
    let type_error = |message| BuildError::Type {
        op: kind.name(),
        message,
    };
    let ty = infer_types(kind, &attrs, &types)
        .map_err(type_error)?
        .into_iter()
        .next()
        .ok_or_else(|| type_error("produces no value".to_string()))?;
    Ok((attrs, ty))
}

/// Normalized attributes of a new op whose result type `ty` is declared,
/// checked against the op's rule (a `constant`'s value made canonical for `ty`).
fn declared(
    graph: &Graph,
    kind: OpKind,
    operands: &[ValueId],
    attrs: Attrs,
    ty: &TensorType,
) -> Result<Attrs, BuildError> {
    let mut attrs = kind.normalize_attrs(attrs)?;
    if kind == OpKind::Constant
        && let Some(value) = attrs.remove("value")
    {
        attrs.set("value", value.literal_for(ty.dtype));
    }
    let types: Vec<&TensorType> = operands.iter().map(|&v| graph.ty(v)).collect();
    check_types(kind, &attrs, &types, &[ty]).map_err(|message| BuildError::Type {
        op: kind.name(),
        message,
    })?;
    Ok(attrs)
}

/// Builds one graph op by op, appending at an insertion block.
pub struct GraphBuilder {
    graph: Graph,
    block: BlockId,
}

impl GraphBuilder {
    /// Starts a graph named `name` with an empty body.
    pub fn new(name: impl Into<String>) -> GraphBuilder {
        let graph = Graph::new(name);
        let block = graph.body();
        GraphBuilder { graph, block }
    }

    /// The graph so far.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.graph.ty(v)
    }

    /// Renames value `v` to `name`, which no other value may have.
    pub fn rename_value(&mut self, v: ValueId, name: &str) -> Result<(), String> {
        self.graph.rename_value(v, name)
    }

    /// Adds a parameter named `name`.
    pub fn param(&mut self, name: &str, ty: TensorType) -> Result<ValueId, BuildError> {
        let name = self.graph.fresh_name(name);
        Ok(self.graph.add_param(name, ty)?)
    }

    /// Appends an op whose result type is inferred; its result is named from `hint`.
    pub fn op(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        attrs: Attrs,
    ) -> Result<ValueId, BuildError> {
        let (attrs, ty) = inferred(&self.graph, kind, operands, attrs)?;
        self.push(kind, operands, attrs, ty)
    }

    /// Appends an op whose result type is declared (`reshape`, `broadcast`,
    /// `cast`, `constant`), checking it against the op's rule.
    pub fn op_declared(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        attrs: Attrs,
        ty: TensorType,
    ) -> Result<ValueId, BuildError> {
        let attrs = declared(&self.graph, kind, operands, attrs, &ty)?;
        self.push(kind, operands, attrs, ty)
    }

    fn push(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        attrs: Attrs,
        ty: TensorType,
    ) -> Result<ValueId, BuildError> {
        let name = self.graph.fresh_name("");
        let op = self
            .graph
            .create_op(kind, operands.to_vec(), attrs, vec![(name, ty)])?;
        self.graph.append_op(self.block, op);
        Ok(self.graph.op(op).results[0])
    }

    /// `reshape` of `x` to `dims`.
    pub fn reshape(&mut self, x: ValueId, dims: &[usize]) -> Result<ValueId, BuildError> {
        let ty = TensorType::new(self.ty(x).dtype, dims.to_vec());
        self.op_declared(OpKind::Reshape, &[x], Attrs::new(), ty)
    }

    /// `broadcast` of `x` to `dims`, operand dim i going to result dim `map[i]`.
    pub fn broadcast(
        &mut self,
        x: ValueId,
        map: &[i64],
        dims: &[usize],
    ) -> Result<ValueId, BuildError> {
        let ty = TensorType::new(self.ty(x).dtype, dims.to_vec());
        self.op_declared(
            OpKind::Broadcast,
            &[x],
            Attrs::new().with("dims", Attr::Ints(map.to_vec())),
            ty,
        )
    }

    /// `cast` of `x` to `dtype`.
    pub fn cast(&mut self, x: ValueId, dtype: DType) -> Result<ValueId, BuildError> {
        let ty = self.ty(x).with_dtype(dtype);
        self.op_declared(OpKind::Cast, &[x], Attrs::new(), ty)
    }

    /// A `constant` of type `ty` holding `value` (one number, or one per element).
    pub fn constant(&mut self, ty: TensorType, value: Attr) -> Result<ValueId, BuildError> {
        self.op_declared(OpKind::Constant, &[], Attrs::new().with("value", value), ty)
    }

    /// Appends a `fused` group `@symbol` over `operands`. `body` receives the
    /// builder (now inserting into the region) and the region arguments, and
    /// returns the values to yield; the group's results have their types.
    pub fn fused(
        &mut self,
        symbol: &str,
        operands: &[ValueId],
        attrs: Attrs,
        body: impl FnOnce(&mut GraphBuilder, &[ValueId]) -> Result<Vec<ValueId>, BuildError>,
    ) -> Result<Vec<ValueId>, BuildError> {
        let attrs = OpKind::Fused.normalize_attrs(attrs)?;
        let region = self.graph.create_block();
        let mut args = Vec::with_capacity(operands.len());
        for &v in operands {
            let hint = format!("{}.in", self.graph.value(v).name);
            let name = self.graph.fresh_name(&hint);
            let ty = self.graph.ty(v).clone();
            args.push(self.graph.add_block_arg(region, name, ty)?);
        }
        let outer = std::mem::replace(&mut self.block, region);
        let yielded = body(self, &args);
        self.block = outer;
        let yielded = yielded?;
        let y = self
            .graph
            .create_op(OpKind::Yield, yielded.clone(), Attrs::new(), Vec::new())?;
        self.graph.append_op(region, y);
        let mut results = Vec::with_capacity(yielded.len());
        for &v in &yielded {
            let name = self.graph.fresh_name("");
            results.push((name, self.graph.ty(v).clone()));
        }
        let op = self
            .graph
            .create_op(OpKind::Fused, operands.to_vec(), attrs, results)?;
        self.graph.set_region(op, region, symbol);
        self.graph.append_op(self.block, op);
        Ok(self.graph.op(op).results.clone())
    }

    /// Appends `return outputs`, declares their types as the graph's results,
    /// verifies and returns the graph.
    pub fn finish(mut self, outputs: &[ValueId]) -> Result<Graph, BuildError> {
        let types = outputs.iter().map(|&v| self.graph.ty(v).clone()).collect();
        self.graph.set_result_types(types);
        let ret =
            self.graph
                .create_op(OpKind::Return, outputs.to_vec(), Attrs::new(), Vec::new())?;
        self.graph.append_op(self.graph.body(), ret);
        verify_graph(&self.graph).map_err(BuildError::Verify)?;
        Ok(self.graph)
    }
}

/// Inserts new ops into an existing graph at a position of a block: the tool
/// of rewriting passes. Types are inferred (or checked, for ops that declare
/// them), attributes normalized, and result names made fresh from a hint.
pub struct Rewriter<'g> {
    graph: &'g mut Graph,
    block: BlockId,
    pos: usize,
}

impl<'g> Rewriter<'g> {
    /// Inserts before position `pos` of `block` (`pos` = the block's length appends).
    pub fn at(graph: &'g mut Graph, block: BlockId, pos: usize) -> Rewriter<'g> {
        Rewriter { graph, block, pos }
    }

    /// Inserts right before `op`, in `op`'s block.
    pub fn before(graph: &'g mut Graph, op: crate::OpId) -> Rewriter<'g> {
        let block = graph.op(op).parent.expect("the op is in a block");
        let pos = graph
            .block(block)
            .ops
            .iter()
            .position(|&o| o == op)
            .expect("listed in its parent");
        Rewriter { graph, block, pos }
    }

    /// The graph being rewritten.
    pub fn graph(&mut self) -> &mut Graph {
        self.graph
    }

    /// The type of a value.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.graph.ty(v)
    }

    /// Inserts an op whose result type is inferred; its result is named from `hint`.
    pub fn op(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        attrs: Attrs,
        hint: &str,
    ) -> Result<ValueId, BuildError> {
        let (attrs, ty) = inferred(self.graph, kind, operands, attrs)?;
        self.insert(kind, operands, attrs, ty, hint)
    }

    /// Inserts an op whose result type is declared (`reshape`, `broadcast`,
    /// `cast`, `constant`), checked against the op's rule.
    pub fn op_declared(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        attrs: Attrs,
        ty: TensorType,
        hint: &str,
    ) -> Result<ValueId, BuildError> {
        let attrs = declared(self.graph, kind, operands, attrs, &ty)?;
        self.insert(kind, operands, attrs, ty, hint)
    }

    /// A scalar `constant` of `dtype` named from `hint`, broadcast to `dims`
    /// and named `hint_b` (just the scalar when `dims` is empty).
    pub fn splat(
        &mut self,
        dtype: DType,
        value: f64,
        dims: &[usize],
        hint: &str,
    ) -> Result<ValueId, BuildError> {
        let scalar = self.op_declared(
            OpKind::Constant,
            &[],
            Attrs::new().with("value", Attr::Float(value)),
            TensorType::new(dtype, Vec::new()),
            hint,
        )?;
        if dims.is_empty() {
            return Ok(scalar);
        }
        self.op_declared(
            OpKind::Broadcast,
            &[scalar],
            Attrs::new().with("dims", Attr::Ints(Vec::new())),
            TensorType::new(dtype, dims.to_vec()),
            &format!("{hint}_b"),
        )
    }

    fn insert(
        &mut self,
        kind: OpKind,
        operands: &[ValueId],
        attrs: Attrs,
        ty: TensorType,
        hint: &str,
    ) -> Result<ValueId, BuildError> {
        let name = self.graph.fresh_name(hint);
        let op = self
            .graph
            .create_op(kind, operands.to_vec(), attrs, vec![(name, ty)])?;
        self.graph.insert_op(self.block, self.pos, op);
        self.pos += 1;
        Ok(self.graph.op(op).results[0])
    }
}
