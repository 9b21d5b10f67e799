//! Every fixture of `tests/fixtures/` imports, verifies, and matches its
//! onnxruntime reference on the dcir interpreter within the f32 tolerance of
//! `dcir_interp::Tolerance::for_dtype` (rel L2 1e-5, |a - e| <= 1e-4 + 1e-4 |e|).

use std::path::{Path, PathBuf};

use dcir_interp::io::{bind_inputs, read_safetensors};
use dcir_interp::{Tensor, Tolerance, compare, run_graph};
use dcir_ir::verify_module;
use dcir_onnx::{ImportOptions, Imported, import_file, weights_to_safetensors};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Imports fixture `name`, runs it on its inputs and weights, and compares
/// each output with onnxruntime's.
fn check(name: &str) {
    let dir = fixtures();
    let imported = import_file(&dir.join(format!("{name}.onnx")), &ImportOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    verify_module(&imported.module).unwrap_or_else(|e| panic!("{name}: {e:?}"));
    let io = read_safetensors(&std::fs::read(dir.join(format!("{name}.io.safetensors"))).unwrap())
        .unwrap();
    let get = |key: &str| io.iter().find(|(n, _)| n == key).map(|(_, t)| t.clone());
    let outputs = run(&imported, &get);
    assert!(!outputs.is_empty());
    assert!(
        get(&format!("output.{}", outputs.len())).is_none(),
        "{name}: fewer outputs than the reference"
    );
    for (k, actual) in outputs.iter().enumerate() {
        let expected = get(&format!("output.{k}")).expect("reference output");
        let tol = Tolerance::for_dtype(expected.dtype());
        if let Err(m) = compare(&expected, actual, &tol) {
            panic!("{name}: output {k} differs from onnxruntime: {m:?}");
        }
    }
}

fn run(imported: &Imported, get: &dyn Fn(&str) -> Option<Tensor>) -> Vec<Tensor> {
    let graph = &imported.module.graphs[0];
    let weights = read_safetensors(&weights_to_safetensors(&imported.weights).unwrap()).unwrap();
    let n_inputs = graph.params().len() - imported.weights.len();
    let mut given = weights;
    for (i, &p) in graph.params()[..n_inputs].iter().enumerate() {
        let t = get(&format!("input.{i}")).expect("fixture input");
        given.push((graph.value(p).name.clone(), t));
    }
    let bound = bind_inputs(graph, given, 0).unwrap();
    assert!(
        bound.random.is_empty(),
        "unbound parameters: {:?}",
        bound.random
    );
    run_graph(graph, &bound.inputs).unwrap()
}

macro_rules! fixture_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check(stringify!($name));
            }
        )*
    };
}

fixture_tests!(
    conv_bias_relu,
    conv_depthwise_same,
    batchnorm_clip,
    binary_broadcast,
    broadcast_corners,
    pools,
    gemm_flatten,
    matmul_variants,
    reshape_transpose,
    softmax_opset11,
    layernorm,
    activations,
    concat_slice_gather,
    shape_arith,
    reductions,
    identity_cast,
    ext_weights,
);

#[test]
fn every_fixture_with_a_reference_is_tested() {
    let source = include_str!("import_fixtures.rs");
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        if let Some(name) = file.strip_suffix(".io.safetensors") {
            assert!(
                source.contains(&format!("    {name},\n")),
                "fixture {name} has a reference but no test"
            );
        }
    }
}
