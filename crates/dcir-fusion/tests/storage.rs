//! Concat as storage (`concat_storage`): which concats are views, where their
//! operands live, and that the planner and `apply_plan` leave them alone.

use dcir_fusion::{
    AnyGroup, ConcatStorage, CostModel, DeviceSpec, Rejected, Slot, apply_plan, concat_storage,
    plan_graph,
};
use dcir_ir::{Graph, OpKind, verify_module};

fn graph(text: &str) -> Graph {
    let module = dcir_reader::parse_module(text).expect("reads");
    verify_module(&module).expect("verifies");
    module.graphs.into_iter().next().expect("one graph")
}

/// The stored concats' result names, and each placed value's `(name, root, offset)`.
fn describe(g: &Graph, s: &ConcatStorage) -> (Vec<String>, Vec<(String, String, u64)>) {
    let name = |v| g.value(v).name.clone();
    let concats = s
        .concats
        .iter()
        .map(|&op| name(g.op(op).results[0]))
        .collect();
    let mut slots: Vec<(String, String, u64)> = s
        .slots
        .iter()
        .map(|(&v, &Slot { root, offset })| (name(v), name(root), offset))
        .collect();
    slots.sort();
    (concats, slots)
}

/// DenseNet's block at batch 1: every layer reads the concat of all the
/// features before it; the last concat is the root, the others its prefixes.
const DENSE_BLOCK: &str = "graph @dense(%x: f32[1,2,4,4]) -> (f32[1,1,4,4]) {
  %x0 = relu %x : f32[1,2,4,4]
  %x1 = neg %x0 : f32[1,2,4,4]
  %c1 = concat %x0, %x1 {axis = 1} : f32[1,4,4,4]
  %x2 = abs %c1 : f32[1,4,4,4]
  %c2 = concat %x0, %x1, %x2 {axis = 1} : f32[1,8,4,4]
  %s = reduce_sum %c2 {axes = [1], keepdims = true} : f32[1,1,4,4]
  return %s
}";

#[test]
fn a_dense_block_concats_into_one_buffer() {
    let g = graph(DENSE_BLOCK);
    let (concats, slots) = describe(&g, &concat_storage(&g));
    assert_eq!(concats, ["c1", "c2"]);
    let slot = |v: &str, root: &str, at: u64| (v.to_string(), root.to_string(), at);
    // f32[1,2,4,4] is 128 bytes.
    assert_eq!(
        slots,
        [
            slot("c1", "c2", 0),
            slot("x0", "c2", 0),
            slot("x1", "c2", 128),
            slot("x2", "c2", 256),
        ]
    );
}

#[test]
fn concats_that_cannot_be_views_copy() {
    // Not contiguous (batch 2 along axis 1), a parameter operand, an operand
    // twice, a returned operand: each stays a kernel. Along axis 0 the
    // slices are contiguous whatever the batch.
    let g = graph(
        "graph @g(%x: f32[2,3], %p: f32[1,3]) -> (f32[2,6], f32[4,3], f32[1,6], f32[1,6], f32[1,3], f32[1,6]) {
  %a = relu %x : f32[2,3]
  %b = neg %x : f32[2,3]
  %rows = concat %a, %b {axis = 1} : f32[2,6]
  %a2 = abs %x : f32[2,3]
  %b2 = exp %x : f32[2,3]
  %stack = concat %a2, %b2 {axis = 0} : f32[4,3]
  %q = relu %p : f32[1,3]
  %param = concat %q, %p {axis = 1} : f32[1,6]
  %twice = concat %q, %q {axis = 1} : f32[1,6]
  %r = neg %p : f32[1,3]
  %ret = concat %r, %q {axis = 1} : f32[1,6]
  return %rows, %stack, %param, %twice, %r, %ret
}",
    );
    let s = concat_storage(&g);
    let (concats, slots) = describe(&g, &s);
    assert_eq!(concats, ["stack"]);
    assert_eq!(
        slots,
        [
            ("a2".to_string(), "stack".to_string(), 0),
            ("b2".to_string(), "stack".to_string(), 24)
        ]
    );
}

#[test]
fn a_value_in_two_unrelated_concats_is_placed_once() {
    // Inception-like: %b feeds two concats that are not prefixes of each
    // other; the later is stored, the earlier copies.
    let g = graph(
        "graph @g(%x: f32[1,2]) -> (f32[1,4], f32[1,4]) {
  %a = relu %x : f32[1,2]
  %b = neg %x : f32[1,2]
  %c = abs %x : f32[1,2]
  %first = concat %a, %b {axis = 1} : f32[1,4]
  %second = concat %b, %c {axis = 1} : f32[1,4]
  %o1 = relu %first : f32[1,4]
  %o2 = relu %second : f32[1,4]
  return %o1, %o2
}",
    );
    let (concats, slots) = describe(&g, &concat_storage(&g));
    assert_eq!(concats, ["second"]);
    assert_eq!(slots.len(), 2);
}

#[test]
fn the_planner_leaves_stored_concats_unfused() {
    let g = graph(DENSE_BLOCK);
    let plan = plan_graph(&g, &CostModel::new(DeviceSpec::h200()), &AnyGroup).expect("plans");
    let fused = apply_plan(&g, &plan).expect("applies");
    let concats = fused
        .block(fused.body())
        .ops
        .iter()
        .filter(|&&o| fused.op(o).kind == OpKind::Concat)
        .count();
    assert_eq!(concats, 2, "both concats stay plain ops");
    assert!(
        plan.rejections
            .iter()
            .any(|r| r.reason == Rejected::StoredConcat),
        "merges into a stored concat are rejected with the reason"
    );
    // The same decision on the fused graph.
    let (concats, _) = describe(&fused, &concat_storage(&fused));
    assert_eq!(concats, ["c1", "c2"]);
}

#[test]
fn a_view_operand_is_read_through_not_placed() {
    // ShuffleNet's `concat(slice(x), branch(x))`: placing the slice would
    // turn it into a copy kernel; the concat stays one kernel reading both.
    let g = graph(
        "graph @g(%x: f32[1,4,2]) -> (f32[1,4,2]) {
  %a = relu %x : f32[1,4,2]
  %half = slice %a {starts = [0, 0, 0], ends = [1, 2, 2]} : f32[1,2,2]
  %b = neg %half : f32[1,2,2]
  %c = concat %half, %b {axis = 1} : f32[1,4,2]
  %y = abs %c : f32[1,4,2]
  return %y
}",
    );
    let storage = concat_storage(&g);
    assert!(storage.concats.is_empty() && storage.slots.is_empty());
}
