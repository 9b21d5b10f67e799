//! The `fuse` pass: plan every graph for a target and rewrite it into
//! `fused` ops. A backend registers it with its own [`Target`] (the CUDA
//! emitter's is `dcir_cuda::FUSE`), so the pass forms only groups that
//! backend lowers.

use dcir_ir::{Module, OpKind};
use dcir_passes::analysis::AnalysisManager;
use dcir_passes::{OptionKind, Pass, PassError, PassOptionDef, PassOptions, PassResult};

use crate::apply::apply_plan;
use crate::cost::CostModel;
use crate::device::DeviceSpec;
use crate::layout::{LayoutMode, plan_layout};
use crate::library::Libraries;
use crate::planner::plan_graph;
use crate::target::Target;

/// The name `fuse` is registered under.
pub const FUSE_NAME: &str = "fuse";

/// The one-line summary of `fuse`.
pub const FUSE_SUMMARY: &str = "group ops into fused kernels (DeepCuts' partition search with the PUL cost model); graphs already fused are left alone";

/// The options of `fuse`.
pub const FUSE_OPTIONS: &[PassOptionDef] = &[
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
    PassOptionDef {
        name: "library",
        kind: OptionKind::Bool,
        default: "true",
        help: "let vendor library calls (cuBLASLt, cuDNN) run groups the cost model prices faster",
    },
    PassOptionDef {
        name: "layout",
        kind: OptionKind::Str,
        default: "auto",
        help: "layout of CNN activations: auto (channels-last where the cost model prices it at least 1.1x faster, or the groups that differ 1.5x, else as written), as-written, channels-last",
    },
];

/// A `fuse` pass with `options` (of [`FUSE_OPTIONS`]) planning for `target`.
pub fn fuse_pass(options: &PassOptions, target: Box<dyn Target>) -> Result<Box<dyn Pass>, String> {
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
    let layout = options.str("layout");
    let layout = LayoutMode::parse(layout).ok_or_else(|| {
        format!(
            "unknown layout `{layout}` (one of: {})",
            LayoutMode::NAMES.join(", ")
        )
    })?;
    Ok(Box::new(Fuse {
        layout,
        model: CostModel {
            device,
            top_k,
            libraries: if options.bool("library") {
                Libraries::ALL
            } else {
                Libraries::NONE
            },
        },
        target,
    }))
}

struct Fuse {
    layout: LayoutMode,
    model: CostModel,
    target: Box<dyn Target>,
}

impl Pass for Fuse {
    fn name(&self) -> &'static str {
        FUSE_NAME
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
            let name = graph.name().to_string();
            let (laid_out, plan, _) = plan_layout(graph, self.layout, |g| {
                plan_graph(g, &self.model, self.target.as_ref())
            })
            .map_err(|e| PassError::new(format!("@{name}: {e}")))?;
            *graph = apply_plan(&laid_out, &plan)
                .map_err(|e| PassError::new(format!("@{name}: {e}")))?;
            changed = true;
        }
        Ok(PassResult::from_changed(changed))
    }
}
