//! Whole graphs: every ir-example runs, `fused` regions, determinism, and
//! errors that name the op and its place.

use std::path::Path;

use dcir_interp::{InterpError, Tensor, TensorData, Tolerance, compare, random_inputs, run_graph};
use dcir_ir::{DType, Graph, TensorType};

fn parse(src: &str) -> Graph {
    let module = dcir_reader::parse_module(src).expect("parses");
    dcir_ir::verify_module(&module).expect("verifies");
    module.graphs.into_iter().next().expect("one graph")
}

fn example(name: &str) -> Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../ir-examples")
        .join(name);
    parse(&std::fs::read_to_string(&path).expect("example exists"))
}

fn assert_finite(name: &str, outputs: &[Tensor]) {
    for t in outputs {
        let v = t.to_f64();
        assert!(
            v.iter().all(|x| x.is_finite()),
            "{name}: NaN or inf in the output"
        );
        assert!(v.iter().any(|&x| x != 0.0), "{name}: all zeros");
    }
}

/// The small examples, run twice: finite, not all zero, bit-identical.
#[test]
fn small_examples_run_finite_and_deterministic() {
    for name in [
        "conv_bias_relu.dcir",
        "convblock_c64_56.dcir",
        "ln_gelu.dcir",
        "mobilenet_v2_inverted_residual.dcir",
        "resnet50_bottleneck.dcir",
    ] {
        let g = example(name);
        let inputs = random_inputs(&g, 7);
        let first = run_graph(&g, &inputs).expect("runs");
        assert_eq!(first.len(), g.result_types().len());
        for (t, ty) in first.iter().zip(g.result_types()) {
            assert_eq!(t.ty(), ty, "{name}");
        }
        assert_finite(name, &first);
        let again = run_graph(&g, &random_inputs(&g, 7)).expect("runs");
        assert_eq!(first, again, "{name}: not deterministic");
    }
}

/// BERT and the MLP: a few seconds each in a debug build.
#[test]
fn transformer_examples_run_finite() {
    for name in ["bert_encoder_layer.dcir", "mlp_chain.dcir"] {
        let g = example(name);
        let out = run_graph(&g, &random_inputs(&g, 3)).expect("runs");
        assert_finite(name, &out);
    }
}

#[test]
fn every_example_is_covered() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ir-examples");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("examples")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "bert_encoder_layer.dcir",
            "conv_bias_relu.dcir",
            "convblock_c64_56.dcir",
            "ln_gelu.dcir",
            "mlp_chain.dcir",
            "mobilenet_v2_inverted_residual.dcir",
            "resnet50_bottleneck.dcir",
        ],
        "a new example: add it to one of the tests above"
    );
}

const UNFUSED: &str = "graph @g(%c: f32[2,17], %b: f32[17]) -> (f32[2,17], f32[2,17]) {
  %bb = broadcast %b {dims = [1]} : f32[2,17]
  %s = add %c, %bb : f32[2,17]
  %r = relu %s : f32[2,17]
  %t = tanh %s : f32[2,17]
  return %r, %t
}";

const FUSED: &str = "graph @g(%c: f32[2,17], %b: f32[17]) -> (f32[2,17], f32[2,17]) {
  %r, %t = fused @g0(%ci = %c, %bi = %b) {kind = \"elementwise\"} : f32[2,17], f32[2,17] {
    %bb = broadcast %bi {dims = [1]} : f32[2,17]
    %s = add %ci, %bb : f32[2,17]
    %r0 = relu %s : f32[2,17]
    %t0 = tanh %s : f32[2,17]
    yield %r0, %t0
  }
  return %r, %t
}";

#[test]
fn a_fused_region_computes_what_its_ops_compute() {
    let (plain, fused) = (parse(UNFUSED), parse(FUSED));
    let inputs = random_inputs(&plain, 1);
    assert_eq!(inputs, random_inputs(&fused, 1));
    let expected = run_graph(&plain, &inputs).expect("runs");
    let actual = run_graph(&fused, &inputs).expect("runs");
    assert_eq!(expected, actual);
    for (e, a) in expected.iter().zip(&actual) {
        compare(e, a, &Tolerance::EXACT).expect("identical");
    }
}

#[test]
fn seeds_change_values_and_inputs_pass_through() {
    let g = parse(
        "graph @g(%x: f32[3], %i: i64[2]) -> (f32[3], f32[3], i64[2]) {\n  %y = neg %x : f32[3]\n  return %x, %y, %i\n}",
    );
    let a = run_graph(&g, &random_inputs(&g, 1)).expect("runs");
    let b = run_graph(&g, &random_inputs(&g, 2)).expect("runs");
    assert_ne!(a[0], b[0]);
    assert_eq!(a[0], random_inputs(&g, 1)[0]);
    let twice = parse(
        "graph @g(%x: f32[3]) -> (f32[3], f32[3]) {\n  %y = abs %x : f32[3]\n  return %y, %y\n}",
    );
    let out = run_graph(&twice, &random_inputs(&twice, 0)).expect("runs");
    assert_eq!(out[0], out[1]);
}

#[test]
fn wrong_inputs_are_errors() {
    let g = parse(
        "graph @g(%x: f32[3], %w: f32[3]) -> (f32[3]) {\n  %y = add %x, %w : f32[3]\n  return %y\n}",
    );
    let x = Tensor::new(
        TensorType::new(DType::F32, vec![3]),
        TensorData::F32(vec![1.0; 3]),
    )
    .expect("fits");
    let err = run_graph(&g, std::slice::from_ref(&x)).unwrap_err();
    assert_eq!(err.to_string(), "@g takes 2 inputs, 1 were given");
    let wrong = Tensor::new(
        TensorType::new(DType::F16, vec![3]),
        TensorData::F16(vec![half::f16::ONE; 3]),
    )
    .expect("fits");
    let err = run_graph(&g, &[x, wrong]).unwrap_err();
    assert_eq!(err.to_string(), "input 1 (%w) must be f32[3], found f16[3]");
}

#[test]
fn op_errors_name_the_value_and_point_at_the_op() {
    let src = "graph @g(%t: f32[4,8], %i: i64[3]) -> (f32[3,8]) {\n  %r = fused @g0(%ti = %t, %ii = %i) : f32[3,8] {\n    %e = gather %ti, %ii : f32[3,8]\n    yield %e\n  }\n  return %r\n}";
    let g = parse(src);
    // Random indices stay in range.
    run_graph(&g, &random_inputs(&g, 5)).expect("in range");
    let mut inputs = random_inputs(&g, 5);
    inputs[1] = Tensor::new(
        TensorType::new(DType::I64, vec![3]),
        TensorData::I64(vec![0, 4, 1]),
    )
    .expect("fits");
    let err = run_graph(&g, &inputs).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`gather` defining %e: index 4 (element 1 of the indices) is out of range for axis 0 of extent 4"
    );
    let InterpError::Op { loc, .. } = err else {
        panic!("an op error")
    };
    let span = loc.0.expect("a location");
    assert!(
        src[span.range()].contains("gather %ti, %ii"),
        "{:?}",
        &src[span.range()]
    );
}
