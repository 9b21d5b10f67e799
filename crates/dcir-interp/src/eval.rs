//! Evaluation: [`eval_op`] for one op on tensors, [`run_graph`] for a graph
//! walked in block order (a `fused` op evaluates its region with the region's
//! arguments bound to its operands).
//!
//! A value is dropped after its last use in its block, so a whole model
//! holds only the live activations (and the caller's inputs).

use std::borrow::Cow;

use dcir_ir::shape::check_types;
use dcir_ir::{Attr, Attrs, BlockId, Graph, OpData, OpKind, TensorType, ValueId};

use crate::tensor::{Tensor, TensorData};
use crate::{InterpError, elementwise, layout, linalg, nn};

/// What a kernel returns: a message on failure, located by the caller.
pub(crate) type KResult<T> = Result<T, String>;

fn missing(name: &str) -> String {
    format!("missing attribute `{name}`")
}

/// A list attribute of non-negative integers.
pub(crate) fn ints_attr(attrs: &Attrs, name: &str) -> KResult<Vec<usize>> {
    attrs
        .ints(name)
        .ok_or_else(|| missing(name))?
        .iter()
        .map(|&v| usize::try_from(v).map_err(|_| format!("`{name}` holds negative {v}")))
        .collect()
}

/// A non-negative integer attribute.
pub(crate) fn usize_attr(attrs: &Attrs, name: &str) -> KResult<usize> {
    let v = attrs.int(name).ok_or_else(|| missing(name))?;
    usize::try_from(v).map_err(|_| format!("`{name}` is negative: {v}"))
}

/// A float attribute.
pub(crate) fn float_attr(attrs: &Attrs, name: &str) -> KResult<f64> {
    attrs.float(name).ok_or_else(|| missing(name))
}

/// A boolean attribute.
pub(crate) fn bool_attr(attrs: &Attrs, name: &str) -> KResult<bool> {
    attrs.bool(name).ok_or_else(|| missing(name))
}

/// Evaluates one op on `operands`, producing tensors of `result_types`.
///
/// The op's type rule ([`check_types`]) is checked first, so operands that
/// do not fit the op are an error, never a panic; attributes are normalized
/// (defaults filled in) when they are not already. `fused`, `return` and
/// `yield` need their graph: evaluate those with [`run_graph`].
pub fn eval_op(
    kind: OpKind,
    attrs: &Attrs,
    operands: &[&Tensor],
    result_types: &[TensorType],
) -> Result<Vec<Tensor>, InterpError> {
    let fail = |message: String| InterpError::Op {
        op: kind.name(),
        value: None,
        loc: Default::default(),
        message,
    };
    if kind.info().has_region || kind.info().is_terminator {
        return Err(fail(
            "a structural op is evaluated with its graph (run_graph)".to_string(),
        ));
    }
    let attrs = if kind.attrs_are_canonical(attrs) {
        Cow::Borrowed(attrs)
    } else {
        Cow::Owned(
            kind.normalize_attrs(attrs.clone())
                .map_err(|e| fail(e.message))?,
        )
    };
    let operand_types: Vec<&TensorType> = operands.iter().map(|t| t.ty()).collect();
    let result_refs: Vec<&TensorType> = result_types.iter().collect();
    check_types(kind, &attrs, &operand_types, &result_refs).map_err(fail)?;
    kernel(kind, &attrs, operands, &result_types[0])
        .map(|t| vec![t])
        .map_err(fail)
}

/// Dispatches a single-result op to its kernel (operands already checked).
fn kernel(kind: OpKind, attrs: &Attrs, ops: &[&Tensor], ty: &TensorType) -> KResult<Tensor> {
    use OpKind::*;
    match kind {
        k if k.is_comparison() => Ok(elementwise::compare(k, ops[0], ops[1], ty)),
        k if k.is_logic() => Ok(elementwise::logic(k, ops, ty)),
        IsNan | IsInf => Ok(elementwise::classify(kind, ops[0], ty)),
        Select => Ok(elementwise::select(ops[0], ops[1], ops[2], ty)),
        Mod => elementwise::modulo(attrs, ops[0], ops[1], ty),
        k if k.is_elementwise_binary() => elementwise::binary(k, ops[0], ops[1], ty),
        k if k.is_elementwise_unary() => elementwise::unary(k, attrs, ops[0], ty),
        Conv2d => linalg::conv2d(attrs, ops[0], ops[1], ty),
        Matmul => linalg::matmul(attrs, ops[0], ops[1], ty),
        Broadcast => layout::broadcast(attrs, ops[0], ty),
        Reshape => Ok(layout::reshape(ops[0], ty)),
        Transpose => layout::transpose(attrs, ops[0], ty),
        Slice => layout::slice(attrs, ops[0], ty),
        Concat => layout::concat(attrs, ops, ty),
        Pad => layout::pad(attrs, ops[0], ty),
        Gather => layout::gather(attrs, ops[0], ops[1], ty),
        ReduceSum | ReduceMean | ReduceMax | ReduceProd => nn::reduce(kind, attrs, ops[0], ty),
        Softmax => nn::softmax(attrs, ops[0], ty),
        Layernorm => nn::layernorm(attrs, ops[0], ops[1], ops[2], ty),
        Batchnorm => nn::batchnorm(attrs, ops, ty),
        Maxpool2d | Avgpool2d => nn::pool(kind, attrs, ops[0], ty),
        GlobalAvgpool => nn::global_avgpool(ops[0], ty),
        Cast => Ok(Tensor::from_parts(ty.clone(), ops[0].data().cast(ty.dtype))),
        Constant => constant(attrs, ty),
        _ => Err(format!("`{}` has no kernel", kind.name())),
    }
}

/// A literal: one value repeated, or one value per element.
fn constant(attrs: &Attrs, ty: &TensorType) -> KResult<Tensor> {
    let n = ty.num_elements().ok_or("constant is too large")?;
    let splat = |len: usize| if len == 1 { n } else { 1 };
    let data = match attrs.get("value") {
        Some(Attr::Int(v)) => TensorData::from_i64(ty.dtype, &vec![*v; n]),
        Some(Attr::Float(v)) => TensorData::from_f64(ty.dtype, &vec![*v; n]),
        Some(Attr::Ints(v)) => TensorData::from_i64(ty.dtype, &v.repeat(splat(v.len()))),
        Some(Attr::Floats(v)) => TensorData::from_f64(ty.dtype, &v.repeat(splat(v.len()))),
        _ => return Err("`value` must be a number or a list of numbers".to_string()),
    };
    Ok(Tensor::from_parts(ty.clone(), data))
}

/// Runs `graph` on `inputs` (one per parameter, of the parameter's type)
/// and returns its results in `return` order.
///
/// The graph must be verified ([`dcir_ir::verify_graph`]); each op is still
/// checked against its type rule, so a malformed graph gives an error.
pub fn run_graph(graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>, InterpError> {
    let params = graph.params();
    if inputs.len() != params.len() {
        return Err(InterpError::InputCount {
            graph: graph.name().to_string(),
            expected: params.len(),
            found: inputs.len(),
        });
    }
    let mut env: Vec<Option<Cow<'_, Tensor>>> = vec![None; graph.value_count()];
    for (index, (&p, input)) in params.iter().zip(inputs).enumerate() {
        if graph.ty(p) != input.ty() {
            return Err(InterpError::InputType {
                index,
                name: graph.value(p).name.clone(),
                expected: graph.ty(p).clone(),
                found: input.ty().clone(),
            });
        }
        env[p.index()] = Some(Cow::Borrowed(input));
    }
    run_block(graph, graph.body(), env)
}

/// The value of `v`, which an earlier op of the block defined.
fn lookup<'e>(
    graph: &Graph,
    env: &'e [Option<Cow<'_, Tensor>>],
    v: ValueId,
) -> KResult<&'e Tensor> {
    env[v.index()].as_deref().ok_or_else(|| {
        format!(
            "%{} is used before it has a value (is the graph verified?)",
            graph.value(v).name
        )
    })
}

/// Runs the ops of `block` with its arguments bound in `env` and returns the
/// operands of its terminator.
fn run_block(
    graph: &Graph,
    block: BlockId,
    mut env: Vec<Option<Cow<'_, Tensor>>>,
) -> Result<Vec<Tensor>, InterpError> {
    let ops = &graph.block(block).ops;
    let mut last_use = vec![usize::MAX; graph.value_count()];
    for (pos, &op) in ops.iter().enumerate() {
        for &v in &graph.op(op).operands {
            last_use[v.index()] = pos;
        }
    }
    for (pos, &op_id) in ops.iter().enumerate() {
        let op = graph.op(op_id);
        let located = |e: InterpError| e.located(graph, op);
        if op.kind.info().is_terminator {
            return terminator_values(graph, op, &mut env).map_err(located);
        }
        let results = match op.region {
            Some(region) => {
                let mut inner: Vec<Option<Cow<'_, Tensor>>> = vec![None; graph.value_count()];
                for (&arg, &v) in graph.block(region).args.iter().zip(&op.operands) {
                    inner[arg.index()] = Some(Cow::Borrowed(
                        lookup(graph, &env, v).map_err(|m| located(op_error(op, m)))?,
                    ));
                }
                run_block(graph, region, inner).map_err(located)?
            }
            None => {
                let operands = op
                    .operands
                    .iter()
                    .map(|&v| lookup(graph, &env, v))
                    .collect::<KResult<Vec<_>>>()
                    .map_err(|m| located(op_error(op, m)))?;
                let types: Vec<TensorType> =
                    op.results.iter().map(|&r| graph.ty(r).clone()).collect();
                eval_op(op.kind, &op.attrs, &operands, &types).map_err(located)?
            }
        };
        for (&r, t) in op.results.iter().zip(&results) {
            if graph.ty(r) != t.ty() {
                let message = format!(
                    "produced {} for %{} of type {}",
                    t.ty(),
                    graph.value(r).name,
                    graph.ty(r)
                );
                return Err(located(op_error(op, message)));
            }
        }
        for &v in &op.operands {
            if last_use[v.index()] == pos {
                env[v.index()] = None;
            }
        }
        for (&r, t) in op.results.iter().zip(results) {
            env[r.index()] = Some(Cow::Owned(t));
        }
    }
    Err(InterpError::Op {
        op: "block",
        value: None,
        loc: graph.loc,
        message: "the block has no terminator (is the graph verified?)".to_string(),
    })
}

fn op_error(op: &OpData, message: String) -> InterpError {
    InterpError::Op {
        op: op.kind.name(),
        value: None,
        loc: op.loc,
        message,
    }
}

/// The operands of `return`/`yield`, moved out of `env` at their last
/// mention and cloned before.
fn terminator_values(
    graph: &Graph,
    op: &OpData,
    env: &mut [Option<Cow<'_, Tensor>>],
) -> Result<Vec<Tensor>, InterpError> {
    let mut out = Vec::with_capacity(op.operands.len());
    for (i, &v) in op.operands.iter().enumerate() {
        lookup(graph, env, v).map_err(|m| op_error(op, m))?;
        let value = if op.operands[i + 1..].contains(&v) {
            env[v.index()].as_deref().cloned()
        } else {
            env[v.index()].take().map(Cow::into_owned)
        };
        out.extend(value);
    }
    Ok(out)
}
