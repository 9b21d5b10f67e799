//! Each analysis on small graphs whose answers are worked out by hand.

use dcir_ir::{Graph, Module, OpId, ValueId};
use dcir_passes::analysis::{
    Analysis, AnalysisManager, Dominance, GraphCost, InferredTypes, Interval, Liveness,
    PostDominance, TopoOrder, UseDef, op_cost,
};
use dcir_passes::{Pass, PassError, PassResult};

fn parse(text: &str) -> Module {
    dcir_reader::parse_module(text).expect("test IR reads")
}

fn value(g: &Graph, name: &str) -> ValueId {
    g.value_ids()
        .find(|&v| g.value(v).name == name)
        .unwrap_or_else(|| panic!("no value %{name}"))
}

/// The op defining `%name`.
fn def(g: &Graph, name: &str) -> OpId {
    match g.value(value(g, name)).def {
        dcir_ir::ValueDef::OpResult { op, .. } => op,
        other => panic!("%{name} is {other:?}"),
    }
}

/// x -> a -> (b, c) -> d: a diamond.
const DIAMOND: &str = "graph @diamond(%x: f32[4]) -> (f32[4]) {
  %a = relu %x : f32[4]
  %b = exp %a : f32[4]
  %c = neg %a : f32[4]
  %d = add %b, %c : f32[4]
  return %d
}
";

#[test]
fn use_def_lists_users_with_operand_positions() {
    let m = parse(DIAMOND);
    let g = &m.graphs[0];
    let ud = UseDef::compute(g);
    assert_eq!(
        ud.users(value(g, "a")),
        &[(def(g, "b"), 0), (def(g, "c"), 0)]
    );
    assert_eq!(ud.single_user(value(g, "b")), Some(def(g, "d")));
    assert_eq!(ud.users(value(g, "c")), &[(def(g, "d"), 1)]);
    assert!(!ud.is_unused(value(g, "d")), "used by return");
}

#[test]
fn topological_order_is_stable_and_reports_cycles() {
    let m = parse(DIAMOND);
    let g = &m.graphs[0];
    let order = TopoOrder::compute(g);
    assert_eq!(
        order.order,
        g.block(g.body()).ops,
        "a valid body keeps its order"
    );
    assert!(order.cyclic.is_empty());

    // Out of order (the reader accepts it; the verifier would not): sorted.
    let m = parse(
        "graph @g(%x: f32[2]) -> (f32[2]) {
  %b = neg %a : f32[2]
  %a = relu %x : f32[2]
  return %b
}
",
    );
    let g = &m.graphs[0];
    let order = TopoOrder::compute(g);
    assert_eq!(order.order[..2], [def(g, "a"), def(g, "b")]);

    let m = parse(
        "graph @g(%x: f32[2]) -> (f32[2]) {
  %a = add %x, %b : f32[2]
  %b = relu %a : f32[2]
  return %b
}
",
    );
    let g = &m.graphs[0];
    let order = TopoOrder::compute(g);
    assert_eq!(order.cyclic.len(), 3, "a, b and the return behind them");
}

#[test]
fn liveness_intervals_and_peak() {
    let m = parse(DIAMOND);
    let g = &m.graphs[0];
    let live = Liveness::compute(g);
    // Steps: 0 entry, 1 a, 2 b, 3 c, 4 d, 5 return.
    assert_eq!(
        live.interval(value(g, "x")),
        Some(Interval { start: 0, end: 1 })
    );
    assert_eq!(
        live.interval(value(g, "a")),
        Some(Interval { start: 1, end: 3 })
    );
    assert_eq!(
        live.interval(value(g, "b")),
        Some(Interval { start: 2, end: 4 })
    );
    assert_eq!(
        live.interval(value(g, "d")),
        Some(Interval { start: 4, end: 5 })
    );
    assert_eq!(live.steps(), 6);
    // At step 3, a, b and c are live: 3 x 16 bytes.
    assert_eq!(live.peak_live_bytes(g), 48);
    assert!(Interval { start: 1, end: 3 }.overlaps(Interval { start: 3, end: 4 }));
    assert!(!Interval { start: 1, end: 2 }.overlaps(Interval { start: 3, end: 4 }));
}

#[test]
fn region_values_have_no_interval() {
    let m = parse(
        "graph @g(%x: f32[2]) -> (f32[2]) {
  %y = fused @g0(%xi = %x) : f32[2] {
    %r = relu %xi : f32[2]
    yield %r
  }
  return %y
}
",
    );
    let g = &m.graphs[0];
    let live = Liveness::compute(g);
    assert_eq!(live.interval(value(g, "xi")), None);
    assert_eq!(live.interval(value(g, "r")), None);
    assert_eq!(
        live.interval(value(g, "y")),
        Some(Interval { start: 1, end: 2 })
    );
}

#[test]
fn dominators_of_a_diamond() {
    let m = parse(DIAMOND);
    let g = &m.graphs[0];
    let (a, b, c, d) = (def(g, "a"), def(g, "b"), def(g, "c"), def(g, "d"));
    let dom = Dominance::compute(g);
    assert_eq!(dom.immediate(a), None);
    assert_eq!(dom.immediate(b), Some(a));
    assert_eq!(dom.immediate(d), Some(a), "both paths to d pass through a");
    assert!(dom.dominates(a, d) && !dom.dominates(b, d));
    let pdom = PostDominance::compute(g);
    assert_eq!(
        pdom.immediate(a),
        Some(d),
        "both paths from a pass through d"
    );
    assert_eq!(pdom.immediate(b), Some(d));
    assert!(pdom.post_dominates(d, a) && !pdom.post_dominates(b, a));
    assert!(dom.dominates(c, c) && pdom.post_dominates(c, c));
}

#[test]
fn inferred_types_flag_wrong_written_types() {
    let m = parse(DIAMOND);
    assert!(InferredTypes::compute(&m.graphs[0]).mismatches.is_empty());
    let m = parse(
        "graph @g(%x: f32[2]) -> (f32[3]) {
  %y = relu %x : f32[3]
  return %y
}
",
    );
    let g = &m.graphs[0];
    let inferred = InferredTypes::compute(g);
    assert_eq!(inferred.mismatches.len(), 1);
    assert_eq!(
        inferred.ty(value(g, "y")).map(|t| t.to_string()).as_deref(),
        Some("f32[2]")
    );
}

#[test]
fn cost_counters() {
    let m = parse(
        "graph @g(%a: f32[2,8,16], %b: f32[2,16,4], %x: f32[1,3,8,8], %w: f32[6,3,3,3]) -> (f32[2,8,4], f32[1,6,6,6]) {
  %mm = matmul %a, %b : f32[2,8,4]
  %conv = conv2d %x, %w : f32[1,6,6,6]
  %r = relu %mm : f32[2,8,4]
  %t = transpose %r {perm = [0, 2, 1]} : f32[2,4,8]
  return %mm, %conv
}
",
    );
    let g = &m.graphs[0];
    let mm = op_cost(g, def(g, "mm"), None);
    assert_eq!(mm.flops, 2 * 2 * 8 * 4 * 16);
    assert_eq!(mm.bytes_read, (2 * 8 * 16 + 2 * 16 * 4) * 4);
    assert_eq!(mm.bytes_written, 2 * 8 * 4 * 4);
    let half = op_cost(g, def(g, "mm"), Some(dcir_ir::DType::F16));
    assert_eq!(half.bytes_written * 2, mm.bytes_written);
    let conv = op_cost(g, def(g, "conv"), None);
    assert_eq!(conv.flops, 2 * 6 * 6 * 6 * 3 * 3 * 3);
    assert_eq!(op_cost(g, def(g, "r"), None).flops, 64);
    assert_eq!(op_cost(g, def(g, "t"), None).flops, 0);
    let total = GraphCost::compute(g).total;
    assert_eq!(total.flops, mm.flops + conv.flops + 64);
    assert!(mm.intensity() > 1.0);
}

/// A pass that changes nothing but asks for an analysis twice.
struct Probe;

impl Pass for Probe {
    fn name(&self) -> &'static str {
        "probe"
    }

    fn run(
        &mut self,
        module: &mut Module,
        analyses: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        let g = &module.graphs[0];
        let first = analyses.get::<UseDef>(g);
        let second = analyses.get::<UseDef>(g);
        assert!(
            std::rc::Rc::ptr_eq(&first, &second),
            "served from the cache"
        );
        Ok(PassResult::unchanged())
    }
}

#[test]
fn analyses_are_cached_until_invalidated() {
    let mut m = parse(DIAMOND);
    let mut am = AnalysisManager::new();
    Probe.run(&mut m, &mut am).expect("probe runs");
    assert_eq!(am.computed_count(), 1);
    am.invalidate_except(&[std::any::TypeId::of::<UseDef>()]);
    am.get::<UseDef>(&m.graphs[0]);
    assert_eq!(am.computed_count(), 1, "preserved analyses survive");
    am.invalidate_except(&[]);
    am.get::<UseDef>(&m.graphs[0]);
    assert_eq!(am.computed_count(), 2);
}
