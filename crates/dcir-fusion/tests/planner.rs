//! The planner and the rewrite, with a simple stand-in estimator so these
//! tests check the search and the rewrite, not the cost model: every kernel
//! costs a launch plus its compulsory bytes over bandwidth.

mod common;

use std::cell::RefCell;

use common::{Roofline, fuse_and_check, read};
use dcir_fusion::{Accepted, Estimate, Estimator, Group, GroupKind, Refusal, plan_graph};
use dcir_ir::{Graph, Module, OpKind};

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

/// [`Roofline`] answering only in batches, recording each batch's size.
struct Batched(RefCell<Vec<usize>>);

impl Estimator for Batched {
    fn estimate(&self, _: &Graph, _: &Group) -> Result<Estimate, String> {
        panic!("the planner asks in batches")
    }

    fn estimate_all(&self, graph: &Graph, groups: &[Group]) -> Vec<Result<Estimate, String>> {
        self.0.borrow_mut().push(groups.len());
        groups.iter().map(|g| Roofline.estimate(graph, g)).collect()
    }
}

#[test]
fn the_planner_asks_for_each_rounds_groups_at_once_and_plans_alike() {
    for path in [
        "ir-examples/resnet50_bottleneck.dcir",
        "ir-examples/bert_encoder_layer.dcir",
    ] {
        let module = read(path);
        let graph = &module.graphs[0];
        let batched = Batched(RefCell::new(Vec::new()));
        let plan = plan_graph(graph, &batched, &dcir_fusion::AnyGroup).expect("plans");
        let alone = plan_graph(graph, &Roofline, &dcir_fusion::AnyGroup).expect("plans");
        let ops = |p: &dcir_fusion::Plan| {
            p.groups
                .iter()
                .map(|g| g.group.ops.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ops(&plan), ops(&alone), "{path}");
        let batches = batched.0.into_inner();
        // Each set once: the batches hold no more than the distinct sets the
        // planner considered, and the first round asks for many at once.
        assert!(
            batches[0] > 2 && batches.iter().all(|&n| n > 0),
            "{path}: {batches:?}"
        );
    }
}

/// A target that lowers every group but runs each conv group's parameters
/// otherwise than planned.
struct AdaptsConvs;

impl dcir_fusion::Target for AdaptsConvs {
    fn accept(&self, graph: &Graph, fused: dcir_ir::OpId) -> Result<Accepted, Refusal> {
        let conv = graph.op(fused).attrs.str("kind") == Some("conv");
        Ok(Accepted {
            adapted: if conv {
                vec!["stages = 4 runs as 2".to_string()]
            } else {
                Vec::new()
            },
        })
    }
}

#[test]
fn the_plan_keeps_what_the_target_says_it_runs_otherwise() {
    let module = read("ir-examples/resnet50_bottleneck.dcir");
    let graph = &module.graphs[0];
    let plan = plan_graph(graph, &Roofline, &AdaptsConvs).expect("plans");
    assert_eq!(plan.groups.len(), 3);
    for g in &plan.groups {
        assert_eq!(g.adapted, ["stages = 4 runs as 2"]);
    }
    let table = dcir_fusion::explain::plan_table(graph, &plan, "test");
    assert!(
        table.contains("note: @g0: stages = 4 runs as 2\n"),
        "{table}"
    );
    let rows = dcir_fusion::explain::plan_rows(graph, &plan);
    assert_eq!(rows[2].adapted, ["stages = 4 runs as 2"]);
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

#[test]
fn every_group_kind_is_a_fused_kind_of_the_ir_schema() {
    use dcir_fusion::GroupKind::*;
    for kind in [
        Elementwise,
        Reduction,
        Pool,
        Gemm,
        Conv,
        DepthwisePointwise,
        ContractionChain,
        Attention,
    ] {
        assert!(
            dcir_ir::fused::fused_kind(kind.name()).is_some(),
            "`{}` is not in dcir_ir::fused::FUSED_KINDS",
            kind.name()
        );
    }
}
