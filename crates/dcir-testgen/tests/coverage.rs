//! The generator reaches every op of the table, with every dtype the op allows.

use std::collections::{BTreeMap, BTreeSet};

use dcir_ir::{DType, Graph, OpKind};
use dcir_testgen::{arb_graph_spec, build_graph};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

/// Graphs from a fixed seed, so that the test is reproducible.
fn sample(count: usize) -> Vec<Graph> {
    let mut runner = TestRunner::deterministic();
    let strategy = arb_graph_spec();
    (0..count)
        .map(|i| {
            let spec = strategy.new_tree(&mut runner).unwrap().current();
            build_graph(&format!("g{i}"), &spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"))
        })
        .collect()
}

/// The dtypes the type rule of `kind` accepts for its first operand (its
/// result, for `constant`).
fn allowed(kind: OpKind) -> Vec<DType> {
    use OpKind::*;
    let float = [DType::F32, DType::F16, DType::BF16];
    match kind {
        Gelu | Erf | Tanh | Sigmoid | Exp | Log | Sqrt | Rsqrt | Conv2d | ReduceMean | Softmax
        | Layernorm | Batchnorm | Avgpool2d | GlobalAvgpool | Floor | Ceil | Round | Sin | Cos
        | IsNan | IsInf => float.to_vec(),
        // The first operand of `select` is its bool condition.
        And | Or | Xor | Not | Select => vec![DType::Bool],
        Add | Sub | Mul | Div | Max | Min | Pow | Relu | Clip | Neg | Abs | Matmul | ReduceSum
        | ReduceMax | ReduceProd | Maxpool2d | Fused | Yield | Mod | Sign | Less | LessEqual
        | Greater | GreaterEqual => DType::ALL
            .into_iter()
            .filter(|&d| d != DType::Bool)
            .collect(),
        _ => DType::ALL.to_vec(),
    }
}

#[test]
fn every_op_and_dtype_is_generated() {
    let mut seen: BTreeMap<OpKind, BTreeSet<DType>> = BTreeMap::new();
    for g in sample(1000) {
        for op in g.all_ops() {
            let data = g.op(op);
            let typed = data.operands.first().or(data.results.first());
            if let Some(&v) = typed {
                seen.entry(data.kind).or_default().insert(g.ty(v).dtype);
            }
        }
    }
    for &kind in OpKind::ALL {
        let dtypes = seen.get(&kind).cloned().unwrap_or_default();
        let missing: Vec<DType> = (allowed(kind).into_iter())
            .filter(|d| !dtypes.contains(d))
            .collect();
        assert!(
            missing.is_empty(),
            "`{}` never generated with {missing:?}",
            kind.name()
        );
    }
}

#[test]
fn graphs_are_small_and_large_and_sometimes_fused() {
    let graphs = sample(200);
    let fused = graphs
        .iter()
        .filter(|g| g.all_ops().iter().any(|&o| g.op(o).kind == OpKind::Fused))
        .count();
    assert!(fused > 10, "only {fused} of 200 graphs have a fused group");
    let sizes: Vec<usize> = graphs.iter().map(|g| g.all_ops().len()).collect();
    let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
    assert!(
        *min <= 3 && (25..=100).contains(max),
        "op counts {min}..={max}"
    );
}
