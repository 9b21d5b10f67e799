//! Hard ops against NumPy: `tests/fixtures/ops.json` holds inputs and the
//! expected results computed in float64 by `tests/fixtures/make_fixtures.py`
//! (conv2d with stride/dilation/groups, layernorm, softmax with large
//! logits, pooling with padding, erf and tanh GELU).

use dcir_interp::{Tensor, Tolerance, compare, eval_op};
use dcir_ir::{Attr, Attrs, DType, OpKind, TensorType, shape::infer_types};
use serde_json::Value;

fn attr(v: &Value) -> Attr {
    match v {
        Value::Bool(b) => Attr::Bool(*b),
        Value::String(s) => Attr::Str(s.clone()),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Attr::Int(i),
            None => Attr::Float(n.as_f64().expect("a number")),
        },
        Value::Array(items) => {
            Attr::Ints(items.iter().map(|i| i.as_i64().expect("ints")).collect())
        }
        other => panic!("unexpected attribute {other}"),
    }
}

fn tensor(v: &Value) -> Tensor {
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("extent") as usize)
        .collect();
    let values: Vec<f64> = v["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|x| x.as_f64().expect("value"))
        .collect();
    Tensor::from_f64(TensorType::new(DType::F32, shape), &values).expect("fits")
}

#[test]
fn hard_ops_match_numpy() {
    let text = include_str!("fixtures/ops.json");
    let json: Value = serde_json::from_str(text).expect("valid JSON");
    let cases = json["cases"].as_array().expect("cases");
    assert!(cases.len() >= 13);
    // f32 results of f64 formulas: a few f32 roundings of difference at most.
    let tol = Tolerance {
        rel_l2: 1e-6,
        atol: 1e-6,
        rtol: 1e-5,
    };
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let kind = OpKind::from_name(case["op"].as_str().expect("op")).expect("known op");
        let attrs: Attrs = case["attrs"]
            .as_object()
            .expect("attrs")
            .iter()
            .map(|(k, v)| (k.clone(), attr(v)))
            .collect();
        let attrs = kind.normalize_attrs(attrs).expect("valid attributes");
        let inputs: Vec<Tensor> = case["inputs"]
            .as_array()
            .expect("inputs")
            .iter()
            .map(tensor)
            .collect();
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let types: Vec<&TensorType> = inputs.iter().map(|t| t.ty()).collect();
        let result_types = infer_types(kind, &attrs, &types).expect("well typed");
        let expected = tensor(&case["expected"]);
        let actual = eval_op(kind, &attrs, &refs, &result_types).expect("evaluates");
        match compare(&expected, &actual[0], &tol) {
            Ok(stats) => assert!(stats.rel_l2 <= 1e-6, "{name}: {stats:?}"),
            Err(m) => panic!("{name}: {m}"),
        }
    }
}
