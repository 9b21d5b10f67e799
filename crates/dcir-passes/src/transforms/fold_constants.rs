//! `fold-constants`: evaluates ops whose operands are all constants.
//!
//! An op (not `constant`, `fused` or a terminator) whose every operand is the
//! result of a `constant` op, and whose result has at most `max-elems`
//! elements, is evaluated with the CPU reference interpreter
//! ([`dcir_interp::eval_op`], so each op's arithmetic is defined in one
//! place) and becomes a `constant` holding the values: a splat when every
//! element is the same, else one number per element. The op is rewritten in
//! place, so its result keeps its name; operand constants left without users
//! are `dce`'s. Ops are visited in block order, so a chain of foldable ops
//! folds in one run. Graph bodies and `fused` regions are folded alike.
//!
//! An op the interpreter refuses (an integer division by zero, an
//! out-of-range gather index) is left as it is; so is an op with an operand
//! of more than 2^24 elements, which would be too costly to materialize.

use dcir_interp::{Tensor, TensorData, eval_op};
use dcir_ir::{Attr, Attrs, DType, Graph, Module, OpId, OpKind, TensorType};

use super::common::{all_blocks, def_op};
use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{OptionKind, PassDef, PassOptionDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "fold-constants",
    summary: "evaluate ops whose operands are all constants with the reference interpreter and \
              replace them with a constant (leaves the operands to `dce`)",
    options: &[PassOptionDef {
        name: "max-elems",
        kind: OptionKind::Int,
        default: "4096",
        help: "largest result, in elements, that is folded",
    }],
    create: |options: &PassOptions| {
        let max_elems = options.int("max-elems");
        let max_elems = usize::try_from(max_elems)
            .map_err(|_| format!("max-elems must be at least 0, found {max_elems}"))?;
        Ok(Box::new(FoldConstants { max_elems }))
    },
};

/// Operands larger than this are not materialized.
const MAX_OPERAND_ELEMS: usize = 1 << 24;

struct FoldConstants {
    max_elems: usize,
}

impl Pass for FoldConstants {
    fn name(&self) -> &'static str {
        DEF.name
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        let mut changed = false;
        for graph in &mut module.graphs {
            for block in all_blocks(graph) {
                for op in graph.block(block).ops.clone() {
                    if let Some(value) = self.fold(graph, op) {
                        let d = graph.op_mut(op);
                        d.kind = OpKind::Constant;
                        d.operands.clear();
                        d.attrs = Attrs::new().with("value", value);
                        changed = true;
                    }
                }
            }
        }
        Ok(PassResult::from_changed(changed))
    }
}

impl FoldConstants {
    /// The `value` literal of the constant `op` folds to, if it folds.
    fn fold(&self, graph: &Graph, op: OpId) -> Option<Attr> {
        let d = graph.op(op);
        let info = d.kind.info();
        if d.kind == OpKind::Constant || info.has_region || info.is_terminator {
            return None;
        }
        let result_types: Vec<TensorType> =
            d.results.iter().map(|&r| graph.ty(r).clone()).collect();
        if result_types.len() != 1 || result_types[0].num_elements()? > self.max_elems {
            return None;
        }
        let operands = d
            .operands
            .iter()
            .map(|&v| {
                let c = graph.op(def_op(graph, v)?);
                let ty = graph.ty(v);
                let small = ty.num_elements().is_some_and(|n| n <= MAX_OPERAND_ELEMS);
                if c.kind != OpKind::Constant || !small {
                    return None;
                }
                eval_op(OpKind::Constant, &c.attrs, &[], std::slice::from_ref(ty))
                    .ok()?
                    .pop()
            })
            .collect::<Option<Vec<Tensor>>>()?;
        let refs: Vec<&Tensor> = operands.iter().collect();
        let result = eval_op(d.kind, &d.attrs, &refs, &result_types)
            .ok()?
            .pop()?;
        Some(literal(result.data()))
    }
}

/// The `constant` literal holding `data`: one number when all elements are
/// the same (bit for bit), else one per element.
fn literal(data: &TensorData) -> Attr {
    if data.dtype().is_float() {
        let values = data.to_f64();
        match values.split_first() {
            Some((first, rest)) if rest.iter().all(|v| v.to_bits() == first.to_bits()) => {
                Attr::Float(*first)
            }
            _ => Attr::Floats(values),
        }
    } else {
        debug_assert!(data.dtype().is_int() || data.dtype() == DType::Bool);
        let values = data.to_i64().into_owned();
        match values.split_first() {
            Some((first, rest)) if rest.iter().all(|v| v == first) => Attr::Int(*first),
            _ => Attr::Ints(values),
        }
    }
}
