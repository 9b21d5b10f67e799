//! Type and shape inference over a whole graph.

use dcir_ir::shape::{check_types, infer_types};
use dcir_ir::{Graph, OpId, ResultTypes, TensorType};

use super::Analysis;

/// Every op's result types recomputed from the parameters through the type
/// rules (declared types are checked, not inferred), and every op whose
/// written types disagree with the rules.
#[derive(Clone, Debug, PartialEq)]
pub struct InferredTypes {
    types: Vec<Option<TensorType>>,
    /// Ops whose written result types break their rule, with the reason.
    pub mismatches: Vec<(OpId, String)>,
}

impl InferredTypes {
    /// The inferred type of a value (parameters and region arguments keep their declared types).
    pub fn ty(&self, value: dcir_ir::ValueId) -> Option<&TensorType> {
        self.types.get(value.index()).and_then(Option::as_ref)
    }
}

impl Analysis for InferredTypes {
    fn compute(graph: &Graph) -> InferredTypes {
        let mut types: Vec<Option<TensorType>> = vec![None; graph.value_count()];
        let mut mismatches = Vec::new();
        for v in graph.value_ids() {
            if matches!(graph.value(v).def, dcir_ir::ValueDef::BlockArg { .. }) {
                types[v.index()] = Some(graph.ty(v).clone());
            }
        }
        for op in graph.all_ops() {
            let d = graph.op(op);
            let Some(operands) = d
                .operands
                .iter()
                .map(|v| types[v.index()].as_ref())
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let inferred = match d.kind.info().result_types {
                ResultTypes::Inferred if !d.kind.info().is_terminator => {
                    infer_types(d.kind, &d.attrs, &operands)
                }
                _ => {
                    let written: Vec<&TensorType> =
                        d.results.iter().map(|&r| graph.ty(r)).collect();
                    check_types(d.kind, &d.attrs, &operands, &written)
                        .map(|()| written.into_iter().cloned().collect())
                }
            };
            match inferred {
                Ok(result_types) => {
                    for (&r, t) in d.results.iter().zip(result_types) {
                        if *graph.ty(r) != t {
                            mismatches.push((
                                op,
                                format!(
                                    "%{} is written {} but infers to {t}",
                                    graph.value(r).name,
                                    graph.ty(r)
                                ),
                            ));
                        }
                        types[r.index()] = Some(t);
                    }
                }
                Err(message) => mismatches.push((op, message)),
            }
        }
        InferredTypes { types, mismatches }
    }
}
