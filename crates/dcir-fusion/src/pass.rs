//! The `fuse` pass: plan every graph and rewrite it into `fused` ops.

use dcir_ir::{Module, OpKind};
use dcir_passes::analysis::AnalysisManager;
use dcir_passes::{OptionKind, Pass, PassDef, PassError, PassOptionDef, PassOptions, PassResult};

use crate::apply::apply_plan;
use crate::cost::CostModel;
use crate::device::DeviceSpec;
use crate::planner::plan_graph;

/// The registry entry of `fuse`.
pub const FUSE: PassDef = PassDef {
    name: "fuse",
    summary: "group ops into fused kernels (DeepCuts' partition search with the PUL cost model); graphs already fused are left alone",
    options: &[
        PassOptionDef {
            name: "device",
            kind: OptionKind::Str,
            default: "h200",
            help: "device preset the cost model uses: h200, h100, a100, v100, rtx2080",
        },
        PassOptionDef {
            name: "top-k",
            kind: OptionKind::Int,
            default: "8",
            help: "parameter sets kept per group for measurement",
        },
    ],
    create: |options: &PassOptions| {
        let name = options.str("device");
        let device = DeviceSpec::preset(name).ok_or_else(|| {
            format!(
                "unknown device `{name}` (presets: {})",
                DeviceSpec::PRESETS.join(", ")
            )
        })?;
        let top_k = usize::try_from(options.int("top-k"))
            .ok()
            .filter(|&k| k > 0)
            .ok_or("top-k must be at least 1")?;
        Ok(Box::new(Fuse {
            model: CostModel { device, top_k },
        }))
    },
};

struct Fuse {
    model: CostModel,
}

impl Pass for Fuse {
    fn name(&self) -> &'static str {
        FUSE.name
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        let mut changed = false;
        for graph in &mut module.graphs {
            let body = &graph.block(graph.body()).ops;
            if body.iter().any(|&o| graph.op(o).kind == OpKind::Fused) {
                continue;
            }
            let plan = plan_graph(graph, &self.model)
                .map_err(|e| PassError::new(format!("@{}: {e}", graph.name())))?;
            *graph = apply_plan(graph, &plan)
                .map_err(|e| PassError::new(format!("@{}: {e}", graph.name())))?;
            changed = true;
        }
        Ok(PassResult::from_changed(changed))
    }
}
