//! Small ONNX models built in Rust with the prost types, for the importer's
//! tests: element type codes, tensors, attributes, nodes and whole models.
#![allow(dead_code)] // each test file uses some of these

use dcir_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
};
use prost::Message;

/// ONNX element type codes.
pub const FLOAT: i32 = 1;
pub const STRING: i32 = 8;
pub const INT64: i32 = 7;
pub const BOOL: i32 = 9;
pub const FLOAT8E4M3FN: i32 = 17;

/// A graph input or output of element type `elem` and static `dims`.
pub fn value_info(name: &str, elem: i32, dims: &[usize]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| tensor_shape_proto::Dimension {
            value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A float tensor of `dims`.
pub fn tensor_f(dims: &[usize], v: &[f32]) -> TensorProto {
    TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(FLOAT),
        float_data: v.to_vec(),
        ..Default::default()
    }
}

/// An int64 tensor of `dims`.
pub fn tensor_i(dims: &[usize], v: &[i64]) -> TensorProto {
    TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(INT64),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn attr(name: &str, kind: i32) -> AttributeProto {
    AttributeProto {
        name: Some(name.to_string()),
        r#type: Some(kind),
        ..Default::default()
    }
}

pub fn a_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        f: Some(v),
        ..attr(name, 1)
    }
}

pub fn a_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        i: Some(v),
        ..attr(name, 2)
    }
}

pub fn a_str(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        s: Some(v.as_bytes().to_vec()),
        ..attr(name, 3)
    }
}

pub fn a_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        ints: v.to_vec(),
        ..attr(name, 7)
    }
}

/// A node of `op` named `my_<op>` with any number of outputs.
pub fn node_n(
    op: &str,
    inputs: &[&str],
    outputs: &[&str],
    attrs: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        op_type: Some(op.to_string()),
        name: Some(format!("my_{}", op.to_lowercase())),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

/// A node of `op` with one output.
pub fn node(op: &str, inputs: &[&str], output: &str, attrs: Vec<AttributeProto>) -> NodeProto {
    node_n(op, inputs, &[output], attrs)
}

/// A `Constant` node holding `t`.
pub fn constant(output: &str, t: TensorProto) -> NodeProto {
    let value = AttributeProto {
        t: Some(t),
        ..attr("value", 4)
    };
    node("Constant", &[], output, vec![value])
}

/// The bytes of a model of `nodes` at `opset`, with graph inputs and
/// outputs given as (name, element type, dims).
pub fn model_typed(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: &[(&str, i32, &[usize])],
    outputs: &[(&str, i32, &[usize])],
) -> Vec<u8> {
    let info = |v: &[(&str, i32, &[usize])]| {
        v.iter()
            .map(|(n, t, d)| value_info(n, *t, d))
            .collect::<Vec<_>>()
    };
    let graph = GraphProto {
        name: Some("g".to_string()),
        node: nodes,
        input: info(inputs),
        output: info(outputs),
        ..Default::default()
    };
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

/// [`model_typed`] with float inputs and one float output.
pub fn model(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: &[(&str, &[usize])],
    out: (&str, &[usize]),
) -> Vec<u8> {
    let inputs: Vec<(&str, i32, &[usize])> = inputs.iter().map(|&(n, d)| (n, FLOAT, d)).collect();
    model_typed(opset, nodes, &inputs, &[(out.0, FLOAT, out.1)])
}
