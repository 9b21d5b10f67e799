//! Two imports that used to be silently wrong (the ONNX node tests found
//! the first): `Dropout` in training mode was the identity, and integer
//! `Mod` ignored `fmod`. Small models built with the prost types, imported
//! and run on the interpreter.

use dcir_interp::{Tensor, run_graph};
use dcir_ir::{DType, TensorType, verify_module};
use dcir_onnx::proto::{AttributeProto, TensorProto};
use dcir_onnx::{ImportOptions, import_bytes};

mod common;
use common::{
    BOOL, FLOAT, INT64, a_float as attr_float, a_int as attr_int, constant, model_typed as model,
    node_n as node, tensor_i,
};

fn scalar(elem: i32, v: f64) -> TensorProto {
    let mut t = TensorProto {
        data_type: Some(elem),
        ..Default::default()
    };
    match elem {
        FLOAT => t.float_data = vec![v as f32],
        BOOL => t.int32_data = vec![i32::from(v != 0.0)],
        _ => t.int64_data = vec![v as i64],
    }
    t
}

fn ints(v: &[i64]) -> TensorProto {
    tensor_i(&[v.len()], v)
}

fn x_input() -> Tensor {
    let v: Vec<f32> = (0..6).map(|i| i as f32 - 2.5).collect();
    Tensor::from_f32(TensorType::new(DType::F32, vec![2, 3]), &v).unwrap()
}

/// Imports `bytes` and runs it on `inputs` (in graph input order).
fn run(bytes: &[u8], inputs: &[Tensor]) -> Vec<Tensor> {
    let imported = import_bytes(bytes, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    verify_module(&imported.module).unwrap();
    assert!(imported.weights.is_empty());
    run_graph(&imported.module.graphs[0], inputs).unwrap()
}

fn import_err(bytes: &[u8]) -> String {
    import_bytes(bytes, &ImportOptions::default())
        .unwrap_err()
        .to_string()
}

const X: (&str, i32, &[usize]) = ("x", FLOAT, &[2, 3]);
const Y: (&str, i32, &[usize]) = ("y", FLOAT, &[2, 3]);
const MASK: (&str, i32, &[usize]) = ("mask", BOOL, &[2, 3]);

/// Dropout (opset 12+) with the given constant ratio and training_mode.
fn dropout_12(ratio: Option<f64>, training: Option<bool>, with_mask: bool) -> Vec<u8> {
    let mut nodes = Vec::new();
    let mut inputs = vec!["x"];
    match ratio {
        Some(r) => {
            nodes.push(constant("r", scalar(FLOAT, r)));
            inputs.push("r");
        }
        None => inputs.push(""),
    }
    if let Some(t) = training {
        nodes.push(constant("t", scalar(BOOL, f64::from(u8::from(t)))));
        inputs.push("t");
    }
    let outputs: &[&str] = if with_mask { &["y", "mask"] } else { &["y"] };
    nodes.push(node("Dropout", &inputs, outputs, vec![]));
    let outs: &[(&str, i32, &[usize])] = if with_mask { &[Y, MASK] } else { &[Y] };
    model(13, nodes, &[X], outs)
}

#[test]
fn dropout_in_inference_is_the_identity_with_an_all_true_mask() {
    let x = x_input();
    for (ratio, training) in [
        (None, None),
        (Some(0.5), None),
        (Some(0.5), Some(false)),
        // Training mode that drops nothing is the identity too.
        (Some(0.0), Some(true)),
    ] {
        let out = run(&dropout_12(ratio, training, true), std::slice::from_ref(&x));
        assert_eq!(out[0], x, "ratio {ratio:?}, training {training:?}");
        assert_eq!(out[1].dtype(), DType::Bool);
        assert_eq!(out[1].dims(), [2, 3]);
        assert_eq!(out[1].to_f64(), [1.0; 6]);
    }
}

#[test]
fn dropout_in_training_mode_is_refused() {
    for with_mask in [false, true] {
        let msg = import_err(&dropout_12(Some(0.25), Some(true), with_mask));
        assert!(msg.contains("`Dropout` (node `my_dropout`"), "{msg}");
        assert!(
            msg.contains("training mode with ratio 0.25") && msg.contains("inference"),
            "{msg}"
        );
        // The default ratio is 0.5.
        let msg = import_err(&dropout_12(None, Some(true), with_mask));
        assert!(msg.contains("training mode with ratio 0.5"), "{msg}");
    }
}

#[test]
fn dropout_with_a_run_time_training_mode_is_refused() {
    let bytes = model(
        13,
        vec![node("Dropout", &["x", "r", "t"], &["y"], vec![])],
        &[X, ("r", FLOAT, &[]), ("t", BOOL, &[])],
        &[Y],
    );
    let msg = import_err(&bytes);
    assert!(
        msg.contains("training_mode input `t` is computed at run time"),
        "{msg}"
    );
    // A run-time ratio is fine when training_mode is off (it is not read).
    let bytes = model(
        13,
        vec![node("Dropout", &["x", "r"], &["y"], vec![])],
        &[X, ("r", FLOAT, &[])],
        &[Y],
    );
    let r = Tensor::from_f32(TensorType::new(DType::F32, vec![]), &[0.5]).unwrap();
    let out = run(&bytes, &[x_input(), r]);
    assert_eq!(out[0], x_input());
}

#[test]
fn dropout_before_opset_7_follows_is_test() {
    let old = |attrs: Vec<AttributeProto>, outs: &[(&str, i32, &[usize])]| {
        let names: Vec<&str> = outs.iter().map(|o| o.0).collect();
        model(6, vec![node("Dropout", &["x"], &names, attrs)], &[X], outs)
    };
    // is_test = 0 (the default) is training mode.
    let msg = import_err(&old(vec![], &[Y]));
    assert!(msg.contains("training mode with ratio 0.5"), "{msg}");
    let msg = import_err(&old(vec![attr_float("ratio", 0.2)], &[Y]));
    assert!(msg.contains("training mode with ratio 0.2"), "{msg}");
    // is_test = 1: the identity; before opset 10 the mask has the input's type.
    let out = run(
        &old(vec![attr_int("is_test", 1)], &[Y, ("mask", FLOAT, &[2, 3])]),
        &[x_input()],
    );
    assert_eq!(out[0], x_input());
    assert_eq!(out[1].dtype(), DType::F32);
    assert_eq!(out[1].to_f64(), [1.0; 6]);
    // Opsets 7 to 11 define only inference.
    let bytes = model(
        10,
        vec![node(
            "Dropout",
            &["x"],
            &["y"],
            vec![attr_float("ratio", 0.2)],
        )],
        &[X],
        &[Y],
    );
    assert_eq!(run(&bytes, &[x_input()])[0], x_input());
}

/// `Mod` of two known int64 vectors, added to a run-time zero so the result
/// is a graph output computed by the interpreter.
fn mod_model(fmod: Option<i64>, x: &[i64], y: &[i64]) -> Vec<u8> {
    let n = x.len();
    let attrs = fmod.map(|f| vec![attr_int("fmod", f)]).unwrap_or_default();
    model(
        13,
        vec![
            constant("a", ints(x)),
            constant("b", ints(y)),
            node("Mod", &["a", "b"], &["m"], attrs),
            node("Add", &["m", "zero"], &["out"], vec![]),
        ],
        &[("zero", INT64, &[n])],
        &[("out", INT64, &[n])],
    )
}

#[test]
fn integer_mod_follows_fmod() {
    let x = [-4, 7, 5, 4, -7, 8];
    let y = [2, -3, 8, -2, 3, 5];
    let zero = Tensor::from_i64(TensorType::new(DType::I64, vec![6]), &[0; 6]).unwrap();
    let run_mod = |fmod| {
        let out = run(&mod_model(fmod, &x, &y), std::slice::from_ref(&zero));
        out[0].data().to_i64().into_owned()
    };
    // fmod = 0 (the default): the divisor's sign; fmod = 1: the dividend's.
    assert_eq!(run_mod(None), [0, -2, 5, 0, 2, 3]);
    assert_eq!(run_mod(Some(0)), [0, -2, 5, 0, 2, 3]);
    assert_eq!(run_mod(Some(1)), [0, 1, 5, 0, -1, 3]);
}

#[test]
fn float_mod_needs_fmod_1() {
    let bytes = model(
        13,
        vec![
            constant("a", scalar(FLOAT, 7.5)),
            constant("b", scalar(FLOAT, -2.0)),
            node("Mod", &["a", "b"], &["out"], vec![]),
        ],
        &[],
        &[("out", FLOAT, &[])],
    );
    let msg = import_err(&bytes);
    assert!(
        msg.contains("`Mod` (node `my_mod`") && msg.contains("fmod = 1"),
        "{msg}"
    );
}
