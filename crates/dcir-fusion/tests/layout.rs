//! The layout decision (`plan_layout`): a CNN is planned as written and
//! channels-last and the faster plan kept; in the channels-last form each
//! convolution forms one kernel with its layout transposes (the graph's
//! input stored NHWC and its f16 filters KRSC first): an NHWC cuDNN call, or
//! on Hopper the wgmma mainloop reading both stored operands; a shared
//! broadcast fuses into each of its users.

use dcir_fusion::{
    AnyGroup, CHANNELS_LAST_MARGIN, CHANNELS_LAST_PART_MARGIN, CostModel, DeviceSpec, LayoutMode,
    Plan, plan_graph, plan_layout, unshare_views,
};
use dcir_ir::{Graph, OpKind, verify_module};

fn graph(text: &str) -> Graph {
    let module = dcir_reader::parse_module(text).expect("reads");
    verify_module(&module).expect("verifies");
    module.graphs.into_iter().next().expect("one graph")
}

/// Four 3×3 convolutions with bias and ReLU in a chain, f16 at batch 32,
/// 56×56×64: the two inside begin and end in the channels-last layout.
fn conv_chain() -> Graph {
    let t = "f16[32,64,56,56]";
    let params: Vec<String> = (0..4)
        .map(|i| format!("%w{i}: f16[64,64,3,3], %b{i}: f16[64]"))
        .collect();
    let mut text = format!("graph @chain(%x: {t}, {}) -> ({t}) {{\n", params.join(", "));
    let mut prev = "%x".to_string();
    for i in 0..4 {
        text += &format!(
            "  %c{i} = conv2d {prev}, %w{i} {{pad = [1, 1, 1, 1]}} : {t}\n\
             \x20 %bb{i} = broadcast %b{i} {{dims = [1]}} : {t}\n\
             \x20 %a{i} = add %c{i}, %bb{i} : {t}\n\
             \x20 %r{i} = relu %a{i} : {t}\n"
        );
        prev = format!("%r{i}");
    }
    graph(&(text + &format!("  return {prev}\n}}\n")))
}

fn planner(model: &CostModel) -> impl FnMut(&Graph) -> Result<Plan, String> + '_ {
    move |g: &Graph| plan_graph(g, model, &AnyGroup)
}

/// The library each group of `plan` calls, in plan order (`-` for ours).
fn libraries(plan: &Plan) -> Vec<String> {
    plan.groups
        .iter()
        .map(|g| {
            g.estimate
                .params
                .get("library")
                .and_then(dcir_ir::Attr::as_str)
                .unwrap_or("-")
                .to_string()
        })
        .collect()
}

/// The H100's figures without Hopper's mainloop (an Ampere-like device):
/// cuDNN's NHWC calls are the fastest convolutions there.
fn without_wgmma() -> DeviceSpec {
    DeviceSpec {
        compute_capability: 80,
        ..DeviceSpec::h100()
    }
}

/// The groups of `plan` holding a convolution.
fn conv_groups<'p>(graph: &Graph, plan: &'p Plan) -> Vec<&'p dcir_fusion::PlannedGroup> {
    plan.groups
        .iter()
        .filter(|p| {
            p.group
                .ops
                .iter()
                .any(|&o| graph.op(o).kind == OpKind::Conv2d)
        })
        .collect()
}

/// The convolution of a group that holds one.
fn conv_of(graph: &Graph, p: &dcir_fusion::PlannedGroup) -> dcir_ir::OpId {
    p.group
        .ops
        .iter()
        .copied()
        .find(|&o| graph.op(o).kind == OpKind::Conv2d)
        .expect("a conv")
}

/// The groups of `plan` that are one transpose (a layout copy).
fn layout_copies(graph: &Graph, plan: &Plan) -> usize {
    plan.groups
        .iter()
        .filter(|p| p.group.ops.len() == 1 && graph.op(p.group.ops[0]).kind == OpKind::Transpose)
        .count()
}

#[test]
fn channels_last_convolutions_are_nhwc_cudnn_calls_with_their_epilogue() {
    let model = CostModel::new(without_wgmma());
    let g = conv_chain();
    let (laid_out, plan, choice) =
        plan_layout(&g, LayoutMode::ChannelsLast, planner(&model)).expect("plans");
    assert!(choice.channels_last);
    assert_eq!(choice.as_written, None);
    // Each convolution with its three layout transposes (input and filter
    // read NCHW, result to NHWC), bias and ReLU: one call.
    let convs = conv_groups(&laid_out, &plan);
    assert_eq!(convs.len(), 4);
    // The graph's 64-channel input is stored NHWC once and each f16 filter
    // KRSC (`nhwc-inputs`), and the output NCHW, each a transpose kernel of
    // its own; every convolution is an NHWC call with its whole epilogue.
    assert_eq!(layout_copies(&laid_out, &plan), 1 + 4 + 1);
    for p in &convs {
        let kinds: Vec<OpKind> = p.group.ops.iter().map(|&o| laid_out.op(o).kind).collect();
        assert_eq!(
            kinds.iter().filter(|&&k| k == OpKind::Transpose).count(),
            3,
            "{kinds:?}"
        );
        assert!(kinds.contains(&OpKind::Relu), "{kinds:?}");
        assert_eq!(
            p.estimate
                .params
                .get("library")
                .and_then(dcir_ir::Attr::as_str),
            Some("cudnn")
        );
        let users = |v: dcir_ir::ValueId| {
            let body = &laid_out.block(laid_out.body()).ops;
            body.iter()
                .copied()
                .filter(|&o| laid_out.op(o).operands.contains(&v))
                .collect()
        };
        let outputs = p.group.outputs(&laid_out, users);
        let call = dcir_fusion::library::conv_call(&laid_out, &p.group.ops, &outputs)
            .expect("a cuDNN call");
        assert!(call.nhwc && call.krsc, "{call:?}");
    }
}

/// On Hopper each convolution of the chain reads its input and its filter
/// stored channels-last (NHWC, KRSC) through its group's views, so the
/// Hopper mainloop's TMA copies can read them; the filter's transpose to
/// KRSC stays a kernel of its own.
#[test]
fn hopper_convolutions_read_stored_channels_last_operands() {
    let model = CostModel::new(DeviceSpec::h100());
    let g = conv_chain();
    let (laid_out, plan, _) =
        plan_layout(&g, LayoutMode::ChannelsLast, planner(&model)).expect("plans");
    let convs = conv_groups(&laid_out, &plan);
    assert_eq!(convs.len(), 4);
    // The input stored NHWC and the four filters KRSC, at least.
    let stores = 1 + 4;
    assert!(layout_copies(&laid_out, &plan) >= stores);
    for p in &convs {
        let conv = conv_of(&laid_out, p);
        for &operand in &laid_out.op(conv).operands {
            let dcir_ir::ValueDef::OpResult { op: view, .. } = laid_out.value(operand).def else {
                panic!("the conv reads a view");
            };
            assert!(p.group.ops.contains(&view));
            let stored = laid_out.op(view).operands[0];
            match laid_out.value(stored).def {
                dcir_ir::ValueDef::OpResult { op, .. } => assert!(!p.group.ops.contains(&op)),
                dcir_ir::ValueDef::BlockArg { .. } => {}
            }
        }
        let ours = p
            .estimate
            .params
            .get("mainloop")
            .and_then(dcir_ir::Attr::as_str);
        let library = p
            .estimate
            .params
            .get("library")
            .and_then(dcir_ir::Attr::as_str);
        assert!(
            ours == Some("wgmma") || library == Some("cudnn"),
            "{:?}",
            p.estimate.params
        );
    }
}

#[test]
fn auto_keeps_the_plan_estimated_clearly_faster_and_says_both() {
    let model = CostModel::new(without_wgmma());
    let g = conv_chain();
    let (_, plan, choice) = plan_layout(&g, LayoutMode::Auto, planner(&model)).expect("plans");
    let (written, nhwc) = (
        choice.as_written.expect("planned"),
        choice.channels_last_time.expect("planned"),
    );
    // Channels-last only where it is estimated clearly faster (every group
    // differs: the part rule says the same).
    assert_eq!(choice.shared_time, Some(0.0));
    assert_eq!(choice.channels_last, nhwc * CHANNELS_LAST_MARGIN < written);
    let kept = if choice.channels_last { nhwc } else { written };
    assert_eq!(plan.total_time(), kept);
    // NHWC cuDNN calls beat the NCHW ones (fitted efficiencies).
    assert!(choice.channels_last, "{choice}");
    let calls = libraries(&plan);
    assert_eq!(
        calls.iter().filter(|l| *l == "cudnn").count(),
        4,
        "{calls:?}"
    );
    assert!(
        choice
            .to_string()
            .starts_with("layout: channels-last (estimated ")
    );

    // As written is as written; a graph without convolutions has one plan.
    let (same, _, choice) = plan_layout(&g, LayoutMode::AsWritten, planner(&model)).expect("plans");
    assert!(!choice.channels_last && choice.channels_last_time.is_none());
    assert_eq!(
        same.block(same.body()).ops.len(),
        g.block(g.body()).ops.len()
    );
}

#[test]
fn a_shared_broadcast_is_one_per_user() {
    let t = "f32[64,256]";
    let g = graph(&format!(
        "graph @shared(%x: {t}, %y: {t}, %b: f32[256]) -> ({t}, {t}) {{\n\
         \x20 %bb = broadcast %b {{dims = [1]}} : {t}\n\
         \x20 %u = add %x, %bb : {t}\n\
         \x20 %v = mul %y, %bb : {t}\n\
         \x20 return %u, %v\n}}\n"
    ));
    let split = unshare_views(&g);
    let mut module = dcir_ir::Module::new();
    module.graphs.push(split.clone());
    verify_module(&module).expect("verifies");
    let body = &split.block(split.body()).ops;
    let broadcasts = body
        .iter()
        .filter(|&&o| split.op(o).kind == OpKind::Broadcast)
        .count();
    assert_eq!(broadcasts, 2);
    // Each fuses into its user: two kernels, no lone broadcast.
    let model = CostModel::new(DeviceSpec::h100());
    let (_, plan, _) = plan_layout(&g, LayoutMode::Auto, planner(&model)).expect("plans");
    assert_eq!(plan.groups.len(), 2);
    assert!(plan.groups.iter().all(|p| p.group.ops.len() == 2));
}

/// Two convolutions reading one NHWC tensor through one shared `T⁻¹` (as
/// `cse` leaves the `channels-last` pass's views; DeepLabV3's ASPP
/// branches): the view is made one per convolution, and each forms its
/// NHWC cuDNN call.
#[test]
fn a_shared_layout_transpose_is_one_per_convolution() {
    let (x, y) = ("f16[32,56,56,64]", "f16[32,64,56,56]");
    let g = graph(&format!(
        "graph @branches(%x: {x}, %w1: f16[64,64,3,3], %w2: f16[64,64,3,3]) -> ({x}, {x}) {{\n\
         \x20 %t = transpose %x {{perm = [0, 3, 1, 2]}} : {y}\n\
         \x20 %c1 = conv2d %t, %w1 {{pad = [1, 1, 1, 1]}} : {y}\n\
         \x20 %c2 = conv2d %t, %w2 {{pad = [2, 2, 2, 2], dilation = [2, 2]}} : {y}\n\
         \x20 %n1 = transpose %c1 {{perm = [0, 2, 3, 1]}} : {x}\n\
         \x20 %n2 = transpose %c2 {{perm = [0, 2, 3, 1]}} : {x}\n\
         \x20 return %n1, %n2\n}}\n"
    ));
    let split = unshare_views(&g);
    let body = &split.block(split.body()).ops;
    let transposes = body
        .iter()
        .filter(|&&o| split.op(o).kind == OpKind::Transpose)
        .count();
    assert_eq!(transposes, 4);
    let model = CostModel::new(DeviceSpec::h100());
    let (_, plan, _) = plan_layout(&g, LayoutMode::AsWritten, planner(&model)).expect("plans");
    assert_eq!(libraries(&plan), ["cudnn", "cudnn"]);
}

/// ResNet-50's stem at batch 32 in f16 (7×7 stride-2 convolution of the
/// 3-channel image with bias and ReLU, then a 3×3 stride-2 max pool) on
/// Hopper, channels-last: the convolution reads the image and its filter
/// space-to-depth (`nhwc-inputs`: 16 channels, a 4×4 window) on the wgmma
/// mainloop and stores its result NHWC; the pool reads that through its
/// group's view and stores NHWC for the 1×1 convolution after it (one
/// kernel with both transposes, walking NHWC order), so no layout copy runs
/// between them.
#[test]
fn a_stem_runs_space_to_depth_and_its_pool_channels_last() {
    let g = graph(
        "graph @stem(%x: f16[32,3,224,224], %w: f16[64,3,7,7], %b: f16[64], %v: f16[64,64,1,1]) -> (f16[32,64,56,56]) {\n\
         \x20 %c = conv2d %x, %w {stride = [2, 2], pad = [3, 3, 3, 3]} : f16[32,64,112,112]\n\
         \x20 %bb = broadcast %b {dims = [1]} : f16[32,64,112,112]\n\
         \x20 %a = add %c, %bb : f16[32,64,112,112]\n\
         \x20 %r = relu %a : f16[32,64,112,112]\n\
         \x20 %p = maxpool2d %r {kernel = [3, 3], stride = [2, 2], pad = [1, 1, 1, 1]} : f16[32,64,56,56]\n\
         \x20 %q = conv2d %p, %v : f16[32,64,56,56]\n\
         \x20 return %q\n}\n",
    );
    let model = CostModel::new(DeviceSpec::h100());
    let (laid_out, plan, _) =
        plan_layout(&g, LayoutMode::ChannelsLast, planner(&model)).expect("plans");
    let [conv] = conv_groups(&laid_out, &plan)[..] else {
        panic!("one convolution group (the 1x1 one a matmul)");
    };
    let conv_op = conv_of(&laid_out, conv);
    assert_eq!(
        laid_out.ty(laid_out.op(conv_op).operands[1]).dims(),
        [64, 16, 4, 4]
    );
    assert_eq!(
        conv.estimate
            .params
            .get("mainloop")
            .and_then(dcir_ir::Attr::as_str),
        Some("wgmma"),
        "{:?}",
        conv.estimate.params
    );
    let pool = plan
        .groups
        .iter()
        .find(|p| {
            p.group
                .ops
                .iter()
                .any(|&o| laid_out.op(o).kind == OpKind::Maxpool2d)
        })
        .expect("a pool group");
    let kinds: Vec<OpKind> = pool
        .group
        .ops
        .iter()
        .map(|&o| laid_out.op(o).kind)
        .collect();
    assert_eq!(
        kinds[..3],
        [OpKind::Transpose, OpKind::Maxpool2d, OpKind::Transpose],
        "the pool reads and writes NHWC: {kinds:?}"
    );
}

/// ViT-B/16's patch embedding at batch 32 in f16 (a 16×16 convolution of
/// stride 16 over the 3-channel image), channels-last on Hopper: the image
/// is stored space-to-depth by a kernel of its own, and the convolution —
/// pointwise over 768 channels now — reads that stored value on the wgmma
/// mainloop. The space-to-depth transpose is a store, not a view copied
/// into the convolution's region: through it TMA could not read the image.
#[test]
fn a_patchify_convolution_reads_its_image_stored_space_to_depth() {
    let g = graph(
        "graph @patches(%x: f16[32,3,224,224], %w: f16[768,3,16,16], %b: f16[768]) -> (f16[32,768,14,14]) {\n\
         \x20 %c = conv2d %x, %w {stride = [16, 16]} : f16[32,768,14,14]\n\
         \x20 %bb = broadcast %b {dims = [1]} : f16[32,768,14,14]\n\
         \x20 %y = add %c, %bb : f16[32,768,14,14]\n\
         \x20 return %y\n}\n",
    );
    let model = CostModel::new(DeviceSpec::h100());
    let (laid_out, plan, _) =
        plan_layout(&g, LayoutMode::ChannelsLast, planner(&model)).expect("plans");
    let [conv] = conv_groups(&laid_out, &plan)[..] else {
        panic!("one convolution group");
    };
    assert_eq!(
        conv.estimate
            .params
            .get("mainloop")
            .and_then(dcir_ir::Attr::as_str),
        Some("wgmma")
    );
    let fused = dcir_fusion::apply_plan(&laid_out, &plan).expect("applies");
    let conv_op = fused
        .block(fused.body())
        .ops
        .iter()
        .copied()
        .find(|&op| {
            fused.op(op).region.is_some_and(|r| {
                fused
                    .block(r)
                    .ops
                    .iter()
                    .any(|&o| fused.op(o).kind == OpKind::Conv2d)
            })
        })
        .expect("the convolution's fused op");
    let region = fused.op(conv_op).region.expect("a region");
    let perms: Vec<Vec<i64>> = fused
        .block(region)
        .ops
        .iter()
        .filter_map(|&o| fused.op(o).attrs.ints("perm").map(<[i64]>::to_vec))
        .collect();
    assert!(
        !perms.iter().any(|p| p.len() == 6),
        "no space-to-depth transpose inside the convolution's kernel: {perms:?}"
    );
    let x = fused.params()[0];
    assert!(
        !fused.op(conv_op).operands.contains(&x),
        "the convolution reads the stored space-to-depth image, not the image"
    );
}

/// A transformer's patchifying convolution (16×16, stride 16, f16 at batch
/// 32) before twelve MLPs the layout leaves alone: channels-last is
/// estimated less than 1.1× faster over the whole graph, but far more than
/// 1.5× over the groups that differ, and is kept.
#[test]
fn a_large_gain_on_the_groups_that_differ_keeps_channels_last() {
    let mut text = String::from(
        "graph @patchify(%x: f16[32,3,224,224], %w: f16[768,3,16,16], %up: f16[768,3072], %down: f16[3072,768]) -> (f16[6272,768]) {\n\
         \x20 %c = conv2d %x, %w {stride = [16, 16]} : f16[32,768,14,14]\n\
         \x20 %r = reshape %c : f16[32,768,196]\n\
         \x20 %t = transpose %r {perm = [0, 2, 1]} : f16[32,196,768]\n\
         \x20 %h0 = reshape %t : f16[6272,768]\n",
    );
    for i in 0..12 {
        text += &format!(
            "  %u{i} = matmul %h{i}, %up : f16[6272,3072]\n\
             \x20 %r{i} = relu %u{i} : f16[6272,3072]\n\
             \x20 %h{} = matmul %r{i}, %down : f16[6272,768]\n",
            i + 1
        );
    }
    let g = graph(&(text + "  return %h12\n}\n"));
    let model = CostModel::new(DeviceSpec::h100());
    let (_, _, choice) = plan_layout(&g, LayoutMode::Auto, planner(&model)).expect("plans");
    let (written, nhwc, shared) = (
        choice.as_written.expect("planned"),
        choice.channels_last_time.expect("planned"),
        choice.shared_time.expect("planned"),
    );
    assert!(shared > 0.5 * written, "{choice}");
    assert!(nhwc * CHANNELS_LAST_MARGIN >= written, "{choice}");
    assert!(
        (nhwc - shared) * CHANNELS_LAST_PART_MARGIN < written - shared,
        "{choice}"
    );
    assert!(choice.channels_last, "{choice}");
    assert!(
        choice
            .to_string()
            .contains("us of both in groups they share")
    );
}
