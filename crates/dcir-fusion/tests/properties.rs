//! Fusion on random well-typed graphs: the fused module verifies, computes
//! the same outputs on the interpreter, every group obeys the legality rules,
//! and the plan's estimate never exceeds the unfused one.

mod common;

use common::Roofline;
use dcir_fusion::{CostModel, DeviceSpec, Estimator, apply_plan, check_group, plan_graph};
use dcir_interp::{random_inputs, run_graph};
use dcir_ir::{OpKind, verify_module};
use dcir_testgen::{arb_module_spec, build_module, proptest_config};
use proptest::prelude::*;

fn check(model: &dyn Estimator, specs: &[dcir_testgen::GraphSpec]) -> Result<(), TestCaseError> {
    let module = build_module(specs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    for graph in &module.graphs {
        let body = &graph.block(graph.body()).ops;
        if body.iter().any(|&o| graph.op(o).kind == OpKind::Fused) {
            continue; // already fused: the planner refuses it
        }
        let plan = plan_graph(graph, model, &dcir_fusion::AnyGroup).map_err(TestCaseError::fail)?;
        for planned in &plan.groups {
            let ops = &planned.group.ops;
            prop_assert!(
                check_group(graph, ops).is_ok(),
                "illegal group {ops:?}: {:?}",
                check_group(graph, ops)
            );
        }
        prop_assert!(
            plan.total_time() <= plan.unfused_time() * (1.0 + 1e-9),
            "{} > {}",
            plan.total_time(),
            plan.unfused_time()
        );
        let fused = apply_plan(graph, &plan).map_err(TestCaseError::fail)?;
        let mut m = dcir_ir::Module::new();
        m.graphs.push(fused);
        verify_module(&m)
            .map_err(|e| TestCaseError::fail(format!("{e:?}\n{}", dcir_ir::print_module(&m))))?;
        let inputs = random_inputs(graph, 3);
        // Random inputs can make the original fail (an integer division by
        // zero): such a graph says nothing about fusion.
        let Ok(want) = run_graph(graph, &inputs) else {
            continue;
        };
        let got = run_graph(&m.graphs[0], &inputs)
            .map_err(|e| TestCaseError::fail(format!("fused graph fails: {e}")))?;
        for (w, g) in want.iter().zip(&got) {
            // Fusion copies ops unchanged: results agree exactly, NaN for NaN.
            let same = w.ty() == g.ty()
                && w.to_f64()
                    .iter()
                    .zip(g.to_f64())
                    .all(|(a, b)| *a == b || (a.is_nan() && b.is_nan()));
            prop_assert!(same, "outputs differ after fusion");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn fusion_is_legal_valid_and_exact(specs in arb_module_spec()) {
        check(&Roofline, &specs)?;
    }

    #[test]
    fn fusion_with_the_h200_model_is_legal_valid_and_exact(specs in arb_module_spec()) {
        check(&CostModel::new(DeviceSpec::h200()), &specs)?;
    }
}
