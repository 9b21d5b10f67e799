//! Every built-in pass, on random well-typed graphs, keeps the module valid
//! (verified after each pass, as `--verify-each` does).

use dcir_interp::random_inputs;
use dcir_passes::{Instrumentation, PassManager, PassRegistry, PipelineFailure, build_pipeline};
use dcir_testgen::{arb_module_spec, build_module, proptest_config};
use proptest::prelude::*;

fn run_pass(name: &str, module: &mut dcir_ir::Module) -> Result<(), String> {
    let registry = PassRegistry::with_builtins();
    let passes = build_pipeline(&registry, name).map_err(|e| e.to_string())?;
    let instrumentation = Instrumentation {
        verify_each: true,
        ..Instrumentation::default()
    };
    PassManager::new(passes, instrumentation)
        .run(module, &mut std::io::sink())
        .map(|_| ())
        .map_err(|failure| match failure {
            PipelineFailure::Verify { pass, errors, ir } => format!(
                "`{pass}` broke the IR: {}\n{ir}",
                errors
                    .iter()
                    .map(|e| e.message.clone())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            other => other.to_string(),
        })
}

proptest! {
    #![proptest_config(proptest_config())]

    #[test]
    fn every_pass_keeps_random_graphs_valid(specs in arb_module_spec()) {
        let module = build_module(&specs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for name in PassRegistry::with_builtins().names() {
            let mut m = module.clone();
            run_pass(name, &mut m).map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
        }
        // And all of them in a row, twice (passes must be idempotent enough to chain).
        let all: Vec<&str> = PassRegistry::with_builtins().names().collect();
        let mut m = module.clone();
        let pipeline = format!("{0},{0}", all.join(","));
        run_pass(&pipeline, &mut m).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(proptest_config())]

    /// `--seed` checks a pass: a parameter that is still used after a pass
    /// (same name, same type) gets the same random values before and after,
    /// for every built-in pass.
    #[test]
    fn every_pass_keeps_the_random_values_of_the_parameters(specs in arb_module_spec()) {
        let module = build_module(&specs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for name in PassRegistry::with_builtins().names() {
            let mut m = module.clone();
            run_pass(name, &mut m).map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
            for (before, after) in module.graphs.iter().zip(&m.graphs) {
                let used: Vec<bool> = after
                    .params()
                    .iter()
                    .map(|&p| after.all_ops().iter().any(|&o| after.op(o).operands.contains(&p)))
                    .collect();
                let (vb, va) = (random_inputs(before, 7), random_inputs(after, 7));
                for (i, &p) in after.params().iter().enumerate() {
                    let pname = &after.value(p).name;
                    let Some(j) = before.params().iter().position(|&q| before.value(q).name == *pname)
                    else {
                        continue;
                    };
                    if used[i] && after.ty(p) == before.ty(before.params()[j]) {
                        prop_assert!(
                            va[i] == vb[j],
                            "{name}: %{pname} draws other values after the pass\n{}\n{}",
                            dcir_ir::print_graph(before),
                            dcir_ir::print_graph(after)
                        );
                    }
                }
            }
        }
    }
}
