//! The planner → emitter property: for random well-typed graphs
//! (dcir-testgen), every op lowers alone (the `--no-fuse` plan), every group
//! of a plan made for [`CudaTarget`] lowers, and the fused graph computes
//! what the original does on the interpreter.
//! (NVRTC compiles the kernels of the zoo and the examples elsewhere; the
//! H200 runs check the lowered programs against the interpreter.)

use dcir_cuda::{CudaTarget, lower_graph};
use dcir_fusion::{CostModel, DeviceSpec, apply_plan, plan_graph, plan_unfused};
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
            // Every op has a kernel of its own (`--no-fuse`)...
            let unfused = plan_unfused(graph, &model, &CudaTarget).map_err(|e| {
                TestCaseError::fail(format!("{e}\n{}", dcir_ir::print_graph(graph)))
            })?;
            let alone = apply_plan(graph, &unfused).map_err(TestCaseError::fail)?;
            lower_graph(&alone).map_err(|e| {
                TestCaseError::fail(format!("{e}\n{}", dcir_ir::print_graph(&alone)))
            })?;
            // ... and every group the planner forms lowers.
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

/// The kernels of random plans compile with NVRTC for sm_90 with no spill or
/// stack frame (one NVRTC program per case; a quarter of the cases of the
/// property above). Without
/// NVRTC: `SKIP`, or a failure under `DCIR_REQUIRE_NVRTC=1`.
#[test]
fn the_kernels_of_random_plans_compile() {
    use dcir_cuda::nvrtc;
    if let Some(reason) = nvrtc::unavailable_reason() {
        let required = std::env::var("DCIR_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        assert!(!required, "DCIR_REQUIRE_NVRTC=1 but {reason}");
        println!("SKIP: NVRTC compile of random plans' kernels: {reason}");
        return;
    }
    let mut config = proptest_config();
    config.cases = (config.cases / 4).max(16);
    let model = CostModel::new(DeviceSpec::h200());
    proptest!(config, |(specs in arb_module_spec())| {
        let module = build_module(&specs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut kernels = Vec::new();
        // One program for all: the architecture-specific target where a kernel needs it.
        let mut arch = nvrtc::DEFAULT_ARCH;
        for graph in &module.graphs {
            if graph.block(graph.body()).ops.iter().any(|&o| graph.op(o).kind == OpKind::Fused) {
                continue;
            }
            let plan = plan_graph(graph, &model, &CudaTarget).map_err(TestCaseError::fail)?;
            let fused = apply_plan(graph, &plan).map_err(TestCaseError::fail)?;
            for kernel in lower_graph(&fused).map_err(|e| TestCaseError::fail(e.to_string()))? {
                let source = dcir_cuda::print_kernel(&kernel);
                if let Some(needs) = kernel.requires_arch {
                    arch = needs;
                }
                kernels.push((kernel.name, source, kernel.block));
            }
        }
        if kernels.is_empty() {
            return Ok(());
        }
        let named: Vec<(&str, &str)> =
            kernels.iter().map(|(n, s, _)| (n.as_str(), s.as_str())).collect();
        let reports = nvrtc::compile_batch(&named, arch).map_err(|e| {
            TestCaseError::fail(format!("{e}\n{}", dcir_ir::print_module(&module)))
        })?;
        for ((name, _, threads), report) in kernels.iter().zip(reports) {
            if let Some(why) = report.violation(*threads) {
                return Err(TestCaseError::fail(format!(
                    "kernel {name}: {why}\n{}",
                    dcir_ir::print_module(&module)
                )));
            }
        }
    });
}

/// Workload-shaped graphs (attention, GEMM epilogues, conv blocks,
/// layernorm + residual at odd sizes, every float dtype): the plan lowers,
/// its kernels compile with NVRTC with no spill (where NVRTC is present: in
/// CI), and the fused graph computes what the original does on the
/// interpreter. A
/// quarter of the cases of the properties above (each runs the interpreter
/// on tensors of up to a few hundred thousand elements).
#[test]
fn workload_plans_lower_and_keep_their_values() {
    let mut config = proptest_config();
    config.cases = (config.cases / 4).max(8);
    let model = CostModel::new(DeviceSpec::h200());
    proptest!(config, |(w in dcir_testgen::arb_workload())| {
        let graph = dcir_testgen::build_workload("w", &w).map_err(|e| TestCaseError::fail(format!("{w:?}: {e}")))?;
        let plan = plan_graph(&graph, &model, &CudaTarget).map_err(TestCaseError::fail)?;
        let fused = apply_plan(&graph, &plan).map_err(TestCaseError::fail)?;
        let kernels = lower_graph(&fused).map_err(|e| {
            TestCaseError::fail(format!("{e}\n{}", dcir_ir::print_graph(&fused)))
        })?;
        // With NVRTC: the kernels compile with no spill or stack frame.
        if dcir_cuda::nvrtc::available() {
            let sources: Vec<(String, String)> = kernels
                .iter()
                .map(|k| (k.name.clone(), dcir_cuda::print_kernel(k)))
                .collect();
            let named: Vec<(&str, &str)> =
                sources.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect();
            let arch = dcir_cuda::batch_arch(&kernels, dcir_cuda::nvrtc::DEFAULT_ARCH)
                .map_err(|e| TestCaseError::fail(format!("{w:?}: {e}")))?;
            let reports = dcir_cuda::nvrtc::compile_batch(&named, arch)
                .map_err(|e| TestCaseError::fail(format!("{w:?}: {e}")))?;
            for (k, report) in kernels.iter().zip(reports) {
                if let Some(why) = report.violation(k.block) {
                    return Err(TestCaseError::fail(format!("{w:?}: kernel {}: {why}", k.name)));
                }
            }
        }
        let inputs = random_inputs(&graph, 5);
        let want = run_graph(&graph, &inputs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got = run_graph(&fused, &inputs)
            .map_err(|e| TestCaseError::fail(format!("fused graph fails: {e}")))?;
        prop_assert_eq!(want, got, "outputs differ after fusion: {:?}", w);
    });
}
