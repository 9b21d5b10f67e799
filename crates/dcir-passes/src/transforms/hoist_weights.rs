//! `hoist-weights`: moves the weight-only ops of each graph body in front of
//! the ops that depend on an activation.
//!
//! A value is *activation-dependent* when it is an activation parameter or a
//! result of an op with an activation-dependent operand; every other op is
//! *weight-only* (it depends only on weight parameters and constants). The
//! body becomes a stable partition — every weight-only op in its original
//! relative order, then every other op in its original relative order, then
//! `return` — so a runtime can run the weight-only prefix once. A `fused` op
//! moves as a unit and is weight-only when all its operands are; ops never
//! move into or out of a region.
//!
//! Option `inputs` names the activation parameters (without `%`); empty means
//! the first parameter of each graph. A name that is a parameter of no graph
//! is an error.

use dcir_ir::{Graph, Module};

use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{OptionKind, PassDef, PassOptionDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "hoist-weights",
    summary: "move every op that depends only on weights and constants before the ops that \
              depend on an activation, keeping relative order",
    options: &[PassOptionDef {
        name: "inputs",
        kind: OptionKind::List,
        default: "",
        help: "activation parameters, without %; empty means the first parameter of each graph",
    }],
    create: |options: &PassOptions| {
        Ok(Box::new(HoistWeights {
            inputs: options.list("inputs").to_vec(),
        }))
    },
};

struct HoistWeights {
    inputs: Vec<String>,
}

impl Pass for HoistWeights {
    fn name(&self) -> &'static str {
        DEF.name
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        if let Some(unknown) = self.inputs.iter().find(|name| {
            !module
                .graphs
                .iter()
                .any(|g| g.params().iter().any(|&p| g.value(p).name == **name))
        }) {
            return Err(PassError::new(format!(
                "hoist-weights: no graph has a parameter %{unknown}"
            )));
        }
        let mut changed = false;
        for graph in &mut module.graphs {
            changed |= hoist(graph, &self.inputs);
        }
        Ok(PassResult::from_changed(changed))
    }
}

/// Reorders `graph`'s body; true if the order changed.
fn hoist(graph: &mut Graph, inputs: &[String]) -> bool {
    let mut activation = vec![false; graph.value_count()];
    for (i, &p) in graph.params().iter().enumerate() {
        activation[p.index()] = if inputs.is_empty() {
            i == 0
        } else {
            inputs.contains(&graph.value(p).name)
        };
    }
    let body = graph.body();
    let ops = graph.block(body).ops.clone();
    let mut weights = Vec::new();
    let mut rest = Vec::new();
    for &op in &ops {
        let d = graph.op(op);
        if d.kind.info().is_terminator {
            rest.push(op);
            continue;
        }
        let depends = d.operands.iter().any(|v| activation[v.index()]);
        for r in &d.results {
            activation[r.index()] = depends;
        }
        if depends {
            rest.push(op);
        } else {
            weights.push(op);
        }
    }
    weights.extend(rest);
    if weights == ops {
        return false;
    }
    for &op in &ops {
        graph.remove_op(op);
    }
    for op in weights {
        graph.append_op(body, op);
    }
    true
}
