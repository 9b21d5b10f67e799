//! The planner → emitter property: for random well-typed graphs
//! (dcir-testgen), every group of a plan made for [`CudaTarget`] lowers, and
//! the fused graph computes what the original does on the interpreter.
//! (NVRTC compiles the kernels of the zoo and the examples elsewhere; the
//! H200 runs check the lowered programs against the interpreter.)

use dcir_cuda::{CudaTarget, lower_graph};
use dcir_fusion::{CostModel, DeviceSpec, apply_plan, plan_graph};
use dcir_interp::{random_inputs, run_graph};
use dcir_ir::OpKind;
use dcir_testgen::{arb_module_spec, build_module, proptest_config};
use proptest::prelude::*;

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn every_plan_for_the_cuda_target_lowers(specs in arb_module_spec()) {
        let module = build_module(&specs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let model = CostModel::new(DeviceSpec::h200());
        for graph in &module.graphs {
            let body = &graph.block(graph.body()).ops;
            if body.iter().any(|&o| graph.op(o).kind == OpKind::Fused) {
                continue; // already fused: the planner refuses it
            }
            let plan = plan_graph(graph, &model, &CudaTarget).map_err(|e| {
                TestCaseError::fail(format!("{e}\n{}", dcir_ir::print_graph(graph)))
            })?;
            let fused = apply_plan(graph, &plan).map_err(TestCaseError::fail)?;
            lower_graph(&fused).map_err(|e| {
                TestCaseError::fail(format!("{e}\n{}", dcir_ir::print_graph(&fused)))
            })?;
            let inputs = random_inputs(graph, 5);
            let Ok(want) = run_graph(graph, &inputs) else { continue };
            let got = run_graph(&fused, &inputs)
                .map_err(|e| TestCaseError::fail(format!("fused graph fails: {e}")))?;
            for (w, g) in want.iter().zip(&got) {
                let same = w.ty() == g.ty()
                    && w.to_f64()
                        .iter()
                        .zip(g.to_f64())
                        .all(|(a, b)| *a == b || (a.is_nan() && b.is_nan()));
                prop_assert!(same, "outputs differ after fusion");
            }
        }
    }
}
