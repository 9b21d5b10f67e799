//! The real models of `models/` (torch.onnx exports, weights stripped; see
//! `scripts/export_models.py`) import, verify, survive
//! `canonicalize,cse,dce`, and run on the interpreter with seeded weights to
//! finite outputs. Op counts are printed (`--nocapture`) for docs/onnx.md.

use std::path::Path;

use dcir_interp::io::{bind_inputs, read_safetensors};
use dcir_interp::run_graph;
use dcir_ir::{Module, OpKind, verify_module};
use dcir_onnx::{ImportOptions, import_file, weights_to_safetensors};
use dcir_passes::{Instrumentation, PassManager, PassRegistry, build_pipeline};

fn op_counts(m: &Module) -> (usize, String) {
    let g = &m.graphs[0];
    let mut counts: Vec<(&str, usize)> = Vec::new();
    let ops = g.all_ops();
    for &op in &ops {
        let kind = g.op(op).kind;
        if kind == OpKind::Return {
            continue;
        }
        match counts.iter_mut().find(|(n, _)| *n == kind.name()) {
            Some(c) => c.1 += 1,
            None => counts.push((kind.name(), 1)),
        }
    }
    counts.sort();
    let total = counts.iter().map(|c| c.1).sum();
    let text = counts
        .iter()
        .map(|(n, c)| format!("{n} {c}"))
        .collect::<Vec<_>>()
        .join(", ");
    (total, text)
}

fn check(name: &str, run: bool) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("models/{name}.onnx"));
    let imported = import_file(&path, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    verify_module(&imported.module).unwrap();
    assert!(
        imported.weights.iter().all(|w| w.seeded),
        "stripped weights are seeded"
    );
    let (n, counts) = op_counts(&imported.module);
    println!("{name}: {n} ops after import: {counts}");

    let mut module = imported.module.clone();
    let registry = PassRegistry::with_builtins();
    let passes = build_pipeline(&registry, "canonicalize,cse,dce").unwrap();
    let mut manager = PassManager::new(
        passes,
        Instrumentation {
            verify_each: true,
            ..Default::default()
        },
    );
    manager
        .run(&mut module, &mut std::io::sink())
        .unwrap_or_else(|e| panic!("{name}: {e:?}"));
    verify_module(&module).unwrap();
    let (n2, counts2) = op_counts(&module);
    println!("{name}: {n2} ops after canonicalize,cse,dce: {counts2}");

    if run {
        let graph = &module.graphs[0];
        let weights =
            read_safetensors(&weights_to_safetensors(&imported.weights).unwrap()).unwrap();
        let bound = bind_inputs(graph, weights, 7).unwrap();
        let outputs = run_graph(graph, &bound.inputs).unwrap();
        for out in outputs {
            assert!(
                out.to_f64().iter().all(|x| x.is_finite()),
                "{name}: non-finite output"
            );
            println!("{name}: output {:?}", out.summary());
        }
    }
}

#[test]
fn resnet50() {
    check("resnet50", true);
}

#[test]
fn mobilenet_v2() {
    check("mobilenet_v2", true);
}

#[test]
fn bert_base() {
    check("bert_base", true);
}

#[test]
fn densenet121() {
    check("densenet121", true);
}

#[test]
fn inception_v3() {
    check("inception_v3", true);
}

#[test]
fn efficientnet_b0() {
    check("efficientnet_b0", true);
}

/// The batch-32 exports (`export_models.py --batch 32`): import and clean up
/// (not run: the interpreter at batch 32 is the GPU runs' `--check`).
#[test]
fn batch_32_exports() {
    for name in ["resnet50_b32", "mobilenet_v2_b32", "bert_base_b32"] {
        check(name, false);
    }
}
