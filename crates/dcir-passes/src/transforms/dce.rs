//! `dce`: removes ops whose results nobody uses.

use dcir_ir::{BlockId, Graph, Module};

use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "dce",
    summary: "remove ops whose results are unused (in graph bodies and fused regions)",
    options: &[],
    create: |_: &PassOptions| Ok(Box::new(Dce)),
};

struct Dce;

impl Pass for Dce {
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
            let mut uses = vec![0usize; graph.value_count()];
            for op in graph.all_ops() {
                for &v in &graph.op(op).operands {
                    uses[v.index()] += 1;
                }
            }
            changed |= dce_block(graph, graph.body(), &mut uses);
        }
        Ok(PassResult::from_changed(changed))
    }
}

/// Removes dead ops of `block` from the end backwards, so that an op whose
/// only users were dead goes too; recurses into surviving regions.
fn dce_block(graph: &mut Graph, block: BlockId, uses: &mut [usize]) -> bool {
    let mut changed = false;
    let ops = graph.block(block).ops.clone();
    for &op in ops.iter().rev() {
        let d = graph.op(op);
        let dead = !d.kind.info().is_terminator && d.results.iter().all(|r| uses[r.index()] == 0);
        if dead {
            let mut removed = vec![op];
            if let Some(region) = d.region {
                removed.extend(graph.walk_ops(region));
            }
            for o in removed {
                for &v in &graph.op(o).operands {
                    uses[v.index()] -= 1;
                }
            }
            graph.remove_op(op);
            changed = true;
        } else if let Some(region) = d.region {
            changed |= dce_block(graph, region, uses);
        }
    }
    changed
}
