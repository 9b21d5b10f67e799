//! The planner ↔ emitter contract: planned for [`CudaTarget`], every group
//! lowers. The graphs are the small forms that once planned groups the
//! emitter refused (an anchor followed by a concat, broadcast or slice; a
//! reduction followed by a transpose; a pool followed by a concat).

use dcir_cuda::{CudaTarget, lower_graph};
use dcir_fusion::{
    AnyGroup, CostModel, DeviceSpec, Reason, Refusal, Rejected, apply_plan, plan_graph,
};
use dcir_ir::OpKind;

fn graph(src: &str) -> dcir_ir::Graph {
    let module = dcir_reader::parse_module(src).unwrap_or_else(|e| panic!("{e:?}\n{src}"));
    module.graphs.into_iter().next().expect("one graph")
}

fn model() -> CostModel {
    CostModel::new(DeviceSpec::preset("h200").expect("preset"))
}

const CASES: &[(&str, &str)] = &[
    (
        "matmul_concat",
        "graph @g(%a: f32[64,64], %b: f32[64,64], %x: f32[64,64]) -> (f32[64,128]) {
           %m = matmul %a, %b : f32[64,64]
           %c = concat %m, %x {axis = 1} : f32[64,128]
           return %c
         }",
    ),
    (
        "matmul_broadcast",
        "graph @g(%a: f32[64,64], %b: f32[64,64], %x: f32[4,64,64]) -> (f32[4,64,64]) {
           %m = matmul %a, %b : f32[64,64]
           %bb = broadcast %m {dims = [1, 2]} : f32[4,64,64]
           %y = add %bb, %x : f32[4,64,64]
           return %y
         }",
    ),
    (
        "matmul_slice",
        "graph @g(%a: f32[64,64], %b: f32[64,64]) -> (f32[32,64]) {
           %m = matmul %a, %b : f32[64,64]
           %s = slice %m {starts = [0, 0], ends = [32, 64]} : f32[32,64]
           return %s
         }",
    ),
    (
        "softmax_transpose",
        "graph @g(%x: f32[64,128]) -> (f32[128,64]) {
           %s = softmax %x {axis = 1} : f32[64,128]
           %t = transpose %s {perm = [1, 0]} : f32[128,64]
           return %t
         }",
    ),
    (
        "maxpool_concat",
        "graph @g(%x: f32[1,8,16,16], %y: f32[1,8,8,8]) -> (f32[1,16,8,8]) {
           %p = maxpool2d %x {kernel = [2, 2], stride = [2, 2]} : f32[1,8,8,8]
           %c = concat %p, %y {axis = 1} : f32[1,16,8,8]
           return %c
         }",
    ),
];

#[test]
fn every_group_planned_for_the_cuda_target_lowers() {
    for (name, src) in CASES {
        let g = graph(src);
        let plan = plan_graph(&g, &model(), &CudaTarget).unwrap_or_else(|e| panic!("{name}: {e}"));
        let fused = apply_plan(&g, &plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        let kernels = lower_graph(&fused).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!kernels.is_empty(), "{name}");
    }
}

#[test]
fn a_refused_merge_is_a_target_rejection() {
    // Planned on legality alone, the matmul and the concat share a group the
    // emitter refuses; planned for the emitter, that merge is rejected with
    // the emitter's reason.
    let (_, src) = CASES[0];
    let g = graph(src);
    let legal = plan_graph(&g, &model(), &AnyGroup).expect("plans");
    assert_eq!(legal.groups.len(), 1, "{legal:?}");
    assert!(lower_graph(&apply_plan(&g, &legal).expect("applies")).is_err());
    let plan = plan_graph(&g, &model(), &CudaTarget).expect("plans");
    assert_eq!(plan.groups.len(), 2);
    let refused_concat = plan.rejections.iter().any(|r| {
        matches!(
            &r.reason,
            Rejected::Target(Refusal { family, reason: Reason::Op { op: OpKind::Concat, .. } })
                if family == "gemm"
        )
    });
    assert!(refused_concat, "{:?}", plan.rejections);
    // `--explain-fusion` prints the refusal in words.
    let explained = dcir_fusion::explain::explain(&g, &plan);
    assert!(
        explained.contains("target: the gemm kernels do not lower `concat` after the contraction"),
        "{explained}"
    );
}
