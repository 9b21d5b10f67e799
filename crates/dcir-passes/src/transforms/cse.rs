//! `cse`: merges ops that compute the same value.

use dcir_ir::print::format_attr;
use dcir_ir::{BlockId, Graph, Module, OpId};
use rustc_hash::FxHashMap;

use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "cse",
    summary: "merge ops of one block with the same kind, operands, attributes and result types",
    options: &[],
    create: |_: &PassOptions| Ok(Box::new(Cse)),
};

struct Cse;

impl Pass for Cse {
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
            let mut blocks = vec![graph.body()];
            blocks.extend(
                graph
                    .all_ops()
                    .into_iter()
                    .filter_map(|o| graph.op(o).region),
            );
            for block in blocks {
                changed |= cse_block(graph, block);
            }
        }
        Ok(PassResult::from_changed(changed))
    }
}

/// Everything that makes two ops compute the same value, as text (ops are
/// pure; a `fused` op is left alone, its region is visited on its own).
fn key(graph: &Graph, op: OpId) -> Option<String> {
    let d = graph.op(op);
    if d.region.is_some() || d.kind.info().is_terminator {
        return None;
    }
    let mut key = d.kind.name().to_string();
    for v in &d.operands {
        key.push_str(&format!(" {v}"));
    }
    for (name, value) in d.attrs.iter() {
        key.push_str(&format!(" {name}={}", format_attr(value)));
    }
    for &r in &d.results {
        key.push_str(&format!(" :{}", graph.ty(r)));
    }
    Some(key)
}

fn cse_block(graph: &mut Graph, block: BlockId) -> bool {
    let mut seen: FxHashMap<String, OpId> = FxHashMap::default();
    let mut changed = false;
    for op in graph.block(block).ops.clone() {
        let Some(k) = key(graph, op) else { continue };
        match seen.get(&k) {
            Some(&first) => {
                let pairs: Vec<_> = graph
                    .op(op)
                    .results
                    .iter()
                    .copied()
                    .zip(graph.op(first).results.clone())
                    .collect();
                for (dup, kept) in pairs {
                    graph.replace_all_uses(dup, kept);
                }
                graph.remove_op(op);
                changed = true;
            }
            None => {
                seen.insert(k, op);
            }
        }
    }
    changed
}
