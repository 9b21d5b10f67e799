//! The planner and the rewrite, with a simple stand-in estimator so these
//! tests check the search and the rewrite, not the cost model: every kernel
//! costs a launch plus its compulsory bytes over bandwidth.

mod common;

use common::{fuse_and_check, read};
use dcir_fusion::GroupKind;
use dcir_ir::{Module, OpKind};

fn kinds(module: &Module) -> Vec<String> {
    let g = &module.graphs[0];
    g.block(g.body())
        .ops
        .iter()
        .filter(|&&o| g.op(o).kind == OpKind::Fused)
        .map(|&o| {
            let d = g.op(o);
            let region = d.region.expect("fused has a region");
            let ops: Vec<&str> = g
                .block(region)
                .ops
                .iter()
                .map(|&r| g.op(r).kind.name())
                .filter(|&k| k != "yield")
                .collect();
            format!("{}: {}", d.attrs.str("kind").unwrap_or("?"), ops.join("+"))
        })
        .collect()
}

#[test]
fn conv_bias_relu_is_one_conv_kernel() {
    let fused = fuse_and_check(&read("ir-examples/conv_bias_relu.dcir"));
    assert_eq!(kinds(&fused), ["conv: conv2d+broadcast+add+relu"]);
}

#[test]
fn resnet_block_groups_each_conv_with_its_epilogue() {
    let fused = fuse_and_check(&read("ir-examples/resnet50_bottleneck.dcir"));
    assert_eq!(
        kinds(&fused),
        [
            "conv: conv2d+batchnorm+relu",
            "conv: conv2d+batchnorm+relu",
            "conv: conv2d+batchnorm+add+relu"
        ]
    );
}

#[test]
fn ln_gelu_is_one_reduction_kernel() {
    let fused = fuse_and_check(&read("ir-examples/ln_gelu.dcir"));
    assert_eq!(
        kinds(&fused),
        ["reduction: constant+add+layernorm+gelu+broadcast+mul"]
    );
}

#[test]
fn every_example_fuses_verifies_and_computes_the_same() {
    for name in [
        "bert_encoder_layer",
        "mlp_chain",
        "mobilenet_v2_inverted_residual",
        "convblock_c64_56",
    ] {
        let fused = fuse_and_check(&read(&format!("ir-examples/{name}.dcir")));
        assert!(!kinds(&fused).is_empty(), "{name}");
    }
}

#[test]
fn group_kinds_name_themselves() {
    assert_eq!(GroupKind::Attention.name(), "attention");
}

#[test]
#[ignore = "prints the fused examples for a look"]
fn show() {
    for name in [
        "bert_encoder_layer",
        "mobilenet_v2_inverted_residual",
        "resnet50_bottleneck",
    ] {
        let fused = fuse_and_check(&read(&format!("ir-examples/{name}.dcir")));
        println!("{name}: {:#?}", kinds(&fused));
    }
    let fused = fuse_and_check(&read("ir-examples/conv_bias_relu.dcir"));
    println!("{}", dcir_ir::print_module(&fused));
}
