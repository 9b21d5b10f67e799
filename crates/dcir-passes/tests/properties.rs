//! Every built-in pass, on random well-typed graphs, keeps the module valid
//! (verified after each pass, as `--verify-each` does).

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
