//! The channels-last form (`channels-last`, then `nhwc-inputs`) changes
//! where a CNN's activations lie, never what the graph computes: for zoo CNNs that between them hold every
//! pattern it rewrites (convolutions with bias, ReLU and residual adds,
//! 1×1 convolutions as matmuls, depthwise and grouped convolutions, channel
//! concats, global and window pools, squeeze-and-excitation gates, channel
//! shuffles), the interpreter's outputs before and after the pass agree.

use std::path::Path;

use dcir_interp::{random_inputs, rel_l2, run_graph};
use dcir_ir::{OpKind, verify_module};
use dcir_passes::{Instrumentation, PassManager, build_pipeline};

/// Zoo CNNs (batch 1) covering the rewritten patterns.
const MODELS: &[&str] = &[
    "resnet18",
    "mobilenet_v2",
    "densenet121",
    "googlenet",
    "efficientnet_b0",
    "squeezenet1_0",
    "shufflenet_v2_x0_5",
    "regnet_x_400mf",
];

#[test]
fn zoo_cnns_compute_the_same_outputs_channels_last() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let registry = dcir_cli::default_registry();
    // The channels-last form as the layout decision makes it.
    let pipeline = dcir_fusion::CHANNELS_LAST_PIPELINE;
    let mut failures = Vec::new();
    for name in MODELS {
        let path = root.join(format!("crates/dcir-onnx/zoo/{name}.onnx"));
        let imported = dcir_onnx::import_file(&path, &dcir_onnx::ImportOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let before = imported.module;
        let mut after = before.clone();
        let passes = build_pipeline(&registry, pipeline).expect("the pipeline builds");
        PassManager::new(passes, Instrumentation::default())
            .run(&mut after, &mut std::io::sink())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        verify_module(&after).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let (g0, g1) = (&before.graphs[0], &after.graphs[0]);
        let rewritten = g1
            .block(g1.body())
            .ops
            .iter()
            .filter(|&&o| g1.op(o).kind == OpKind::Transpose)
            .count();
        assert!(rewritten > 0, "{name}: the pass changed nothing");
        let inputs = random_inputs(g0, 7);
        let want = run_graph(g0, &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = run_graph(g1, &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            // 1×1 convolutions become matmuls: the sums run in another order.
            let err = rel_l2(w, g);
            if err.is_nan() || err > 1e-5 {
                failures.push(format!("{name} output {i}: rel_l2 {err:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
