//! The cost model on hand-built groups: sanity and monotonicity of the
//! estimates, the factors at their edges, and a snapshot of the chosen
//! parameters for one group of every kind on the H200 preset.

use std::fmt::Write;

use dcir_fusion::cost::{Candidate, wave_efficiency};
use dcir_fusion::{
    Bound, CostModel, DeviceSpec, Estimator, Group, GroupKind, HopperBlocking, Level, group_kind,
    hopper_conv_steps,
};
use dcir_ir::{Attr, Graph, OpId, OpKind, verify_module};

fn graph(text: &str) -> Graph {
    let module = dcir_reader::parse_module(text).expect("reads");
    verify_module(&module).expect("verifies");
    module.graphs.into_iter().next().expect("one graph")
}

fn example(name: &str) -> Graph {
    let path = format!(
        "{}/../../ir-examples/{name}.dcir",
        env!("CARGO_MANIFEST_DIR")
    );
    graph(&std::fs::read_to_string(path).expect("example exists"))
}

/// The body ops defining the named values, in body order.
fn ops(g: &Graph, names: &[&str]) -> Vec<OpId> {
    g.block(g.body())
        .ops
        .iter()
        .copied()
        .filter(|&o| {
            g.op(o)
                .results
                .first()
                .is_some_and(|&r| names.contains(&g.value(r).name.as_str()))
        })
        .collect()
}

fn group(g: &Graph, names: &[&str], kind: GroupKind, level: Level) -> Group {
    let ops = ops(g, names);
    assert_eq!(ops.len(), names.len(), "every name is an op result");
    assert_eq!(group_kind(g, &ops), Ok(kind), "{names:?}");
    Group { ops, kind, level }
}

fn h200() -> CostModel {
    CostModel::new(DeviceSpec::h200())
}

fn gemm_graph(m: usize, n: usize, k: usize, dtype: &str) -> Graph {
    graph(&format!(
        "graph @g(%a: {dtype}[{m},{k}], %b: {dtype}[{k},{n}]) -> ({dtype}[{m},{n}]) {{\n  %c = matmul %a, %b : {dtype}[{m},{n}]\n  return %c\n}}"
    ))
}

fn elementwise_graph(rows: usize, cols: usize) -> Graph {
    graph(&format!(
        "graph @e(%x: f32[{rows},{cols}], %r: f32[{rows},{cols}]) -> (f32[{rows},{cols}]) {{\n  %s = add %x, %r : f32[{rows},{cols}]\n  %y = relu %s : f32[{rows},{cols}]\n  return %y\n}}"
    ))
}

fn attr_str(a: Option<&Attr>) -> Option<&str> {
    a.and_then(|a| a.as_str())
}

#[test]
fn elementwise_time_is_bytes_over_bandwidth() {
    let model = h200();
    let g = elementwise_graph(32 * 128, 4096);
    let e = model
        .estimate(
            &g,
            &group(&g, &["s", "y"], GroupKind::Elementwise, Level::Register),
        )
        .unwrap();
    // Two inputs read, one output written.
    assert_eq!(e.bytes, 3 * 32 * 128 * 4096 * 4);
    assert_eq!(e.bound, Bound::Memory);
    let ideal = e.bytes as f64 / model.device.bandwidth;
    assert!(e.time >= ideal, "{} < {ideal}", e.time);
    assert!(
        e.time - ideal <= model.device.launch_overhead + 0.02 * ideal,
        "{} vs {ideal}",
        e.time
    );
}

#[test]
fn an_input_only_sliced_is_read_at_the_slices_size() {
    // Through views into slices: a third each, both thirds read.
    let g = graph(
        "graph @s(%x: f32[256,3,512]) -> (f32[512,256], f32[256,512]) {\n  %t = transpose %x {perm = [1, 0, 2]} : f32[3,256,512]\n  %a = slice %t {ends = [1, 256, 512], starts = [0, 0, 0]} : f32[1,256,512]\n  %ar = reshape %a : f32[256,512]\n  %at = transpose %ar {perm = [1, 0]} : f32[512,256]\n  %ya = relu %at : f32[512,256]\n  %b = slice %t {ends = [3, 256, 512], starts = [2, 0, 0]} : f32[1,256,512]\n  %br = reshape %b : f32[256,512]\n  %yb = neg %br : f32[256,512]\n  return %ya, %yb\n}",
    );
    let names = ["t", "a", "ar", "at", "ya", "b", "br", "yb"];
    let e = h200()
        .estimate(
            &g,
            &group(&g, &names, GroupKind::Elementwise, Level::Register),
        )
        .unwrap();
    assert_eq!(e.bytes, 4 * 256 * 512 * 4);
    // A view the group also stores reads the whole input.
    let g = graph(
        "graph @s(%x: f32[3,512]) -> (f32[1,512], f32[3,512]) {\n  %t = reshape %x : f32[3,512]\n  %a = slice %t {ends = [1, 512], starts = [0, 0]} : f32[1,512]\n  %y = relu %a : f32[1,512]\n  return %y, %t\n}",
    );
    let e = h200()
        .estimate(
            &g,
            &group(
                &g,
                &["t", "a", "y"],
                GroupKind::Elementwise,
                Level::Register,
            ),
        )
        .unwrap();
    assert_eq!(e.bytes, (3 * 512 + 512 + 3 * 512) * 4);
}

#[test]
fn a_pool_reading_through_a_layout_transpose_pays_a_sector_per_element() {
    // The same pool over the same NCHW elements: read as stored, and read
    // out of an NHWC tensor through the channels-last transpose.
    let g = graph(
        "graph @p(%x: f16[32,64,112,112], %h: f16[32,112,112,64]) -> (f16[32,64,56,56], f16[32,64,56,56]) {\n  %a = maxpool2d %x {kernel = [3, 3], pad = [1, 1, 1, 1], stride = [2, 2]} : f16[32,64,56,56]\n  %t = transpose %h {perm = [0, 3, 1, 2]} : f16[32,64,112,112]\n  %b = maxpool2d %t {kernel = [3, 3], pad = [1, 1, 1, 1], stride = [2, 2]} : f16[32,64,56,56]\n  return %a, %b\n}",
    );
    let model = CostModel::new(DeviceSpec::h100());
    let stored = model
        .estimate(&g, &group(&g, &["a"], GroupKind::Pool, Level::Register))
        .unwrap();
    let gathered = model
        .estimate(
            &g,
            &group(&g, &["t", "b"], GroupKind::Pool, Level::Register),
        )
        .unwrap();
    assert_eq!(stored.bytes, gathered.bytes);
    // f16: 16 elements a sector, one used.
    assert!(
        gathered.time > 8.0 * stored.time,
        "{} vs {}",
        gathered.time,
        stored.time
    );
}

#[test]
fn a_splat_constant_is_a_literal_not_a_read() {
    let g = graph(
        "graph @c(%x: f32[1024,1024]) -> (f32[1024,1024]) {\n  %c = constant {value = 0.5} : f32[1024,1024]\n  %y = mul %x, %c : f32[1024,1024]\n  return %y\n}",
    );
    let e = h200()
        .estimate(
            &g,
            &group(&g, &["y"], GroupKind::Elementwise, Level::Register),
        )
        .unwrap();
    assert_eq!(e.bytes, 2 * 1024 * 1024 * 4);
}

#[test]
fn broadcast_input_is_read_at_its_own_size() {
    let g = graph(
        "graph @b(%x: f32[1024,1024], %b: f32[1024]) -> (f32[1024,1024]) {\n  %bb = broadcast %b {dims = [1]} : f32[1024,1024]\n  %y = add %x, %bb : f32[1024,1024]\n  return %y\n}",
    );
    let e = h200()
        .estimate(
            &g,
            &group(&g, &["bb", "y"], GroupKind::Elementwise, Level::Register),
        )
        .unwrap();
    assert_eq!(e.bytes, (2 * 1024 * 1024 + 1024) * 4);
    assert_eq!(e.flops, 1024 * 1024);
}

#[test]
fn bigger_problems_take_longer() {
    let model = h200();
    let mut last = 0.0;
    for rows in [1, 16, 256, 4096, 65536] {
        let g = elementwise_graph(rows, 1024);
        let t = model
            .estimate(
                &g,
                &group(&g, &["s", "y"], GroupKind::Elementwise, Level::Register),
            )
            .unwrap()
            .time;
        assert!(t >= last, "{rows} rows: {t} < {last}");
        last = t;
    }
    let mut last = 0.0;
    for m in [64, 256, 1024, 4096, 16384] {
        let g = gemm_graph(m, 1024, 1024, "f32");
        let t = model
            .estimate(&g, &group(&g, &["c"], GroupKind::Gemm, Level::Register))
            .unwrap()
            .time;
        assert!(t >= last, "m = {m}: {t} < {last}");
        last = t;
    }
}

#[test]
fn big_f32_gemm_is_compute_bound_near_the_measured_rate() {
    let g = gemm_graph(4096, 4096, 4096, "f32");
    let model = CostModel::kernels_only(DeviceSpec::h200());
    let e = model
        .estimate(&g, &group(&g, &["c"], GroupKind::Gemm, Level::Register))
        .unwrap();
    assert_eq!(e.bound, Bound::Compute);
    // Our FMA kernels at the fraction of the FMA rate they were measured to
    // reach.
    let ideal = e.flops as f64 / 51.1e12 / model.device.simt_gemm_compute_fraction;
    assert!(
        e.time >= ideal && e.time <= 2.0 * ideal,
        "{} vs {ideal}",
        e.time
    );
    assert_eq!(attr_str(e.params.get("math")), Some("fma"));
    // With libraries, strict-f32 cuBLASLt (0.85 of the rate) runs it.
    let e = h200()
        .estimate(&g, &group(&g, &["c"], GroupKind::Gemm, Level::Register))
        .unwrap();
    assert_eq!(attr_str(e.params.get("library")), Some("cublaslt"));
}

#[test]
fn f16_gemm_runs_on_tensor_cores() {
    // Our kernels only: with libraries, cuBLASLt runs this GEMM
    // (tests/library.rs).
    let model = CostModel::kernels_only(DeviceSpec::h200());
    let g = gemm_graph(4096, 4096, 4096, "f16");
    let e = model
        .estimate(&g, &group(&g, &["c"], GroupKind::Gemm, Level::Register))
        .unwrap();
    assert_eq!(attr_str(e.params.get("math")), Some("tensor_core"));
    let flops = e.flops as f64;
    // At the fraction of the roofline our `mma.sync` kernels reach, still
    // well ahead of f32 FMA.
    let rate = model.device.f16_tensor_rate * model.device.mma_sync_fraction;
    assert!(e.time < flops / model.device.fp32_rate / 2.0);
    assert!(e.time <= 2.0 * flops / rate, "{}", e.time);
    // Every tile of a tensor-core candidate is a multiple of 16.
    for c in model
        .candidates(&g, &group(&g, &["c"], GroupKind::Gemm, Level::Register))
        .unwrap()
    {
        let tile = c
            .params
            .get("tile")
            .and_then(|a| a.as_ints())
            .unwrap()
            .to_vec();
        assert!(tile.iter().all(|t| t % 16 == 0), "{tile:?}");
    }
}

#[test]
fn oversized_shared_memory_is_never_chosen() {
    let model = h200();
    let g = gemm_graph(4096, 4096, 4096, "f32");
    let grp = group(&g, &["c"], GroupKind::Gemm, Level::Register);
    let all = model.candidates(&g, &grp).unwrap();
    let too_big: Vec<&Candidate> = all
        .iter()
        .filter(|c| c.launch.shared_bytes > model.device.shared_per_block)
        .collect();
    assert!(!too_big.is_empty());
    for c in &too_big {
        assert_eq!(c.factors.coef_r, 0.0);
        assert_eq!(c.factors.pul(), 0.0);
        assert_eq!(c.launch.blocks_per_sm, 0);
        assert!(c.time.is_infinite());
    }
    let e = model.estimate(&g, &grp).unwrap();
    for p in std::iter::once(&e.params).chain(&e.candidates) {
        assert!(too_big.iter().all(|c| &c.params != p), "{}", p.describe());
    }
    // So are register tiles over the per-thread budget.
    for c in all
        .iter()
        .filter(|c| c.launch.registers > model.device.max_registers_per_thread)
    {
        assert_eq!(c.factors.coef_r, 0.0);
    }
}

#[test]
fn wave_efficiency_penalizes_partial_waves() {
    assert_eq!(wave_efficiency(132, 1, 132), 1.0);
    assert_eq!(wave_efficiency(2 * 264, 2, 132), 1.0);
    let partial = wave_efficiency(265, 2, 132);
    assert!(partial < 1.0);
    assert!((partial - 265.0 / 528.0).abs() < 1e-12);
    assert!(wave_efficiency(66, 1, 132) < 1.0);
    assert_eq!(wave_efficiency(10, 0, 132), 0.0);
}

#[test]
fn unfused_time_of_every_example_op() {
    let model = h200();
    for name in [
        "bert_encoder_layer",
        "conv_bias_relu",
        "convblock_c64_56",
        "ln_gelu",
        "mlp_chain",
        "mobilenet_v2_inverted_residual",
        "resnet50_bottleneck",
    ] {
        let g = example(name);
        for &op in &g.block(g.body()).ops {
            let kind = g.op(op).kind;
            if kind == OpKind::Return {
                continue;
            }
            let t = model.unfused_time(&g, op).unwrap();
            if kind == OpKind::Constant {
                assert_eq!(t, 0.0);
            } else {
                assert!(
                    t >= model.device.launch_overhead && t.is_finite(),
                    "{name}: {t}"
                );
            }
        }
        // Deterministic.
        let op = g.block(g.body()).ops[0];
        assert_eq!(model.unfused(&g, op), model.unfused(&g, op));
    }
}

#[test]
fn fusing_an_epilogue_saves_time() {
    let model = h200();
    let g = example("conv_bias_relu");
    let grp = group(&g, &["c", "bb", "s", "y"], GroupKind::Conv, Level::Register);
    let fused = model.estimate(&g, &grp).unwrap().time;
    let separate = model.separate_time(&g, &grp.ops).unwrap();
    assert!(fused < separate, "{fused} vs {separate}");
}

#[test]
fn mismatched_kind_is_an_error() {
    let g = gemm_graph(64, 64, 64, "f32");
    let grp = Group {
        ops: ops(&g, &["c"]),
        kind: GroupKind::Reduction,
        level: Level::Register,
    };
    assert!(h200().estimate(&g, &grp).is_err());
    let empty = Group {
        ops: vec![],
        kind: GroupKind::Elementwise,
        level: Level::Register,
    };
    assert!(h200().estimate(&g, &empty).is_err());
}

fn report(out: &mut String, model: &CostModel, title: &str, g: &Graph, grp: &Group) {
    match model.estimate(g, grp) {
        Ok(e) => {
            let chosen = model
                .candidates(g, grp)
                .unwrap()
                .into_iter()
                .find(|c| c.params == e.params)
                .expect("chosen is a candidate");
            let f = chosen.factors;
            let l = chosen.launch;
            writeln!(
                out,
                "{title} [{}]\n  params: {}\n  time: {:.2} us  bound: {:?}  pul: {:.3} (gm {:.3} sm {:.3} wb {:.3} lat {:.3} coef_r {})\n  flops: {}  bytes: {}  dram: {:.0}\n  launch: {} blocks x {} threads, {} B shared, {} regs, {} blocks/SM\n  top {}: {}",
                grp.kind.name(),
                e.params.describe(),
                e.time * 1e6,
                e.bound,
                e.pul,
                f.gm,
                f.sm,
                f.wb,
                f.lat,
                f.coef_r,
                e.flops,
                e.bytes,
                chosen.dram_bytes,
                l.blocks,
                l.threads,
                l.shared_bytes,
                l.registers,
                l.blocks_per_sm,
                e.candidates.len(),
                e.candidates
                    .iter()
                    .map(|p| format!("{{{}}}", p.describe()))
                    .collect::<Vec<_>>()
                    .join(" "),
            )
            .unwrap();
        }
        Err(err) => writeln!(out, "{title} [{}]\n  error: {err}", grp.kind.name()).unwrap(),
    }
}

#[test]
fn snapshot_of_one_group_per_kind() {
    let model = h200();
    let mut out = String::new();

    let g = elementwise_graph(128, 4096);
    report(
        &mut out,
        &model,
        "add+relu 128x4096 f32",
        &g,
        &group(&g, &["s", "y"], GroupKind::Elementwise, Level::Register),
    );

    let g = example("ln_gelu");
    let grp = group(
        &g,
        &["s", "n", "g", "c", "cb", "y"],
        GroupKind::Reduction,
        Level::Register,
    );
    report(&mut out, &model, "ln_gelu 128x4096 f32", &g, &grp);

    let g = graph(
        "graph @p(%x: f32[1,64,112,112]) -> (f32[1,64,56,56]) {\n  %r = relu %x : f32[1,64,112,112]\n  %y = maxpool2d %r {kernel = [3, 3], stride = [2, 2], pad = [1, 1, 1, 1]} : f32[1,64,56,56]\n  return %y\n}",
    );
    report(
        &mut out,
        &model,
        "relu+maxpool3x3s2 64x112x112",
        &g,
        &group(&g, &["r", "y"], GroupKind::Pool, Level::Register),
    );

    let g = example("bert_encoder_layer");
    report(
        &mut out,
        &model,
        "BERT FFN1 128x3072x768 + bias + gelu f32",
        &g,
        &group(
            &g,
            &["f0", "b1b", "f1", "f2"],
            GroupKind::Gemm,
            Level::Register,
        ),
    );
    report(
        &mut out,
        &model,
        "BERT FFN1 matmul alone f32",
        &g,
        &group(&g, &["f0"], GroupKind::Gemm, Level::Register),
    );
    report(
        &mut out,
        &model,
        "BERT attention 12x128x128x64 f32",
        &g,
        &group(
            &g,
            &["scores", "scaleb", "scaled", "probs", "ctx"],
            GroupKind::Attention,
            Level::Shared,
        ),
    );

    let g = gemm_graph(4096, 4096, 4096, "f32");
    report(
        &mut out,
        &model,
        "gemm 4096^3 f32",
        &g,
        &group(&g, &["c"], GroupKind::Gemm, Level::Register),
    );
    let g = gemm_graph(4096, 4096, 4096, "f16");
    report(
        &mut out,
        &model,
        "gemm 4096^3 f16",
        &g,
        &group(&g, &["c"], GroupKind::Gemm, Level::Register),
    );

    let g = example("convblock_c64_56");
    report(
        &mut out,
        &model,
        "conv3x3 64->64 56x56 + bias + relu",
        &g,
        &group(
            &g,
            &["c1", "b1b", "a1", "r1"],
            GroupKind::Conv,
            Level::Register,
        ),
    );

    let g = example("mobilenet_v2_inverted_residual");
    report(
        &mut out,
        &model,
        "depthwise 3x3 144x56x56 + bn + relu6",
        &g,
        &group(&g, &["d", "dn", "dr"], GroupKind::Conv, Level::Register),
    );
    report(
        &mut out,
        &model,
        "depthwise 3x3 -> pointwise 144->24 56x56",
        &g,
        &group(
            &g,
            &["d", "dn", "dr", "p", "pn"],
            GroupKind::DepthwisePointwise,
            Level::Shared,
        ),
    );

    let g = graph(
        "graph @chain(%x: f32[256,512], %w1: f32[512,512], %w2: f32[512,256]) -> (f32[256,256]) {\n  %h = matmul %x, %w1 : f32[256,512]\n  %r = relu %h : f32[256,512]\n  %y = matmul %r, %w2 : f32[256,256]\n  return %y\n}",
    );
    report(
        &mut out,
        &model,
        "gemm chain 256x512x512 -> 256",
        &g,
        &group(
            &g,
            &["h", "r", "y"],
            GroupKind::ContractionChain,
            Level::Shared,
        ),
    );

    let g = example("mlp_chain");
    report(
        &mut out,
        &model,
        "mlp chain 256x4096x4096 (intermediate too big)",
        &g,
        &group(
            &g,
            &["h2", "b2b", "a2", "g2", "h3"],
            GroupKind::ContractionChain,
            Level::Shared,
        ),
    );

    insta::assert_snapshot!(out);
}

/// `(accumulators, A elements staged per k-tile)` per thread of each FMA
/// candidate of group `name` of `g`.
fn fma_tiles(model: &CostModel, g: &Graph, name: &str, kind: GroupKind) -> Vec<(i64, i64)> {
    model
        .candidates(g, &group(g, &[name], kind, Level::Register))
        .unwrap()
        .iter()
        .filter(|c| c.params.get("library").is_none())
        .map(|c| {
            let ints = |k: &str| c.params.get(k).and_then(|a| a.as_ints()).unwrap().to_vec();
            let tile = ints("tile");
            let threads = c.params.get("threads").and_then(|a| a.as_int()).unwrap();
            (tile[0] * tile[1] / threads, tile[0] * tile[2] / threads)
        })
        .collect()
}

#[test]
fn gathered_conv_tiles_past_the_register_file_are_never_candidates() {
    // RegNet-X-32GF's grouped 3x3 conv: a 16x8 tile over 16 staged im2col
    // elements per thread spilled at 255 registers.
    let model = h200();
    let g = graph(
        "graph @g(%x: f32[1,1344,28,28], %w: f32[1344,168,3,3]) -> (f32[1,1344,14,14]) {\n  %c = conv2d %x, %w {stride = [2, 2], pad = [1, 1, 1, 1], groups = 8} : f32[1,1344,14,14]\n  return %c\n}",
    );
    let conv = fma_tiles(&model, &g, "c", GroupKind::Conv);
    assert!(!conv.is_empty());
    assert!(
        conv.iter().all(|&(acc, staged)| acc < 128 || staged < 14),
        "{conv:?}"
    );
    // A matmul's operands are not gathered: its 128-accumulator tiles stay.
    let mm = fma_tiles(
        &model,
        &gemm_graph(1024, 768, 256, "f32"),
        "c",
        GroupKind::Gemm,
    );
    assert!(
        mm.iter().any(|&(acc, staged)| acc == 128 && staged >= 14),
        "{mm:?}"
    );
}

/// ViT's attention at batch 2 as the ONNX exporter writes it (Q, K and V
/// sliced out of one projection; the scale after the scores, where
/// `fold-matmul-scale` puts it), in `dtype`.
fn exporter_attention(dtype: &str) -> Graph {
    graph(&format!(
        "graph @vit(%qkv: {d}[3,197,2,768]) -> ({d}[394,768]) {{
          %qs = slice %qkv {{ends = [1, 197, 2, 768], starts = [0, 0, 0, 0]}} : {d}[1,197,2,768]
          %q = reshape %qs : {d}[197,24,64]
          %qt = transpose %q {{perm = [1, 0, 2]}} : {d}[24,197,64]
          %ks = slice %qkv {{ends = [2, 197, 2, 768], starts = [1, 0, 0, 0]}} : {d}[1,197,2,768]
          %k = reshape %ks : {d}[197,24,64]
          %kt = transpose %k {{perm = [1, 0, 2]}} : {d}[24,197,64]
          %vs = slice %qkv {{ends = [3, 197, 2, 768], starts = [2, 0, 0, 0]}} : {d}[1,197,2,768]
          %v = reshape %vs : {d}[197,24,64]
          %vt = transpose %v {{perm = [1, 0, 2]}} : {d}[24,197,64]
          %scores = matmul %qt, %kt {{transpose_b = true}} : {d}[24,197,197]
          %scale = constant {{value = 0.125}} : {d}[]
          %scaleb = broadcast %scale {{dims = []}} : {d}[24,197,197]
          %scaled = mul %scores, %scaleb : {d}[24,197,197]
          %probs = softmax %scaled {{axis = 2}} : {d}[24,197,197]
          %ctx = matmul %probs, %vt : {d}[24,197,64]
          %ctxr = reshape %ctx : {d}[2,12,197,64]
          %ctxt = transpose %ctxr {{perm = [2, 0, 1, 3]}} : {d}[197,2,12,64]
          %y = reshape %ctxt : {d}[394,768]
          return %y
        }}",
        d = dtype
    ))
}

#[test]
fn half_attention_is_one_tensor_core_kernel_reading_the_projection() {
    for dtype in ["f16", "bf16"] {
        let g = exporter_attention(dtype);
        let model = CostModel::new(DeviceSpec::h100());
        let plan = dcir_fusion::plan_graph(&g, &model, &dcir_fusion::AnyGroup).expect("plans");
        let attention: Vec<_> = plan
            .groups
            .iter()
            .filter(|p| p.group.kind == GroupKind::Attention)
            .collect();
        assert_eq!(attention.len(), 1, "{dtype}");
        let a = attention[0];
        assert_eq!(
            a.estimate.params.get("math").and_then(Attr::as_str),
            Some("tensor_core"),
            "{dtype}: {}",
            a.estimate.params.describe()
        );
        // Whole, with the slices of Q, K and V and the output's views: the
        // plan's only kernel.
        let slices = a
            .group
            .ops
            .iter()
            .filter(|&&o| g.op(o).kind == OpKind::Slice)
            .count();
        assert_eq!(slices, 3, "{dtype}");
        let kernels = plan
            .groups
            .iter()
            .filter(|p| !matches!(p.group.ops.as_slice(), [o] if g.op(*o).kind == OpKind::Reshape))
            .count();
        assert_eq!(kernels, 1, "{dtype}");
    }
    // Strict f32 has no tensor-core attention.
    let g = exporter_attention("f32");
    let model = CostModel::new(DeviceSpec::h100());
    let plan = dcir_fusion::plan_graph(&g, &model, &dcir_fusion::AnyGroup).expect("plans");
    assert!(
        plan.groups
            .iter()
            .all(|p| p.estimate.params.get("math").and_then(Attr::as_str) != Some("tensor_core"))
    );
}

/// The projection before `exporter_attention`'s slices, with its bias, as
/// ViT's exported `MultiheadAttention` writes it (sequence first).
fn exporter_attention_with_projection(dtype: &str) -> Graph {
    graph(&format!(
        "graph @vit(%x: {d}[394,768], %w: {d}[768,2304], %b: {d}[2304]) -> ({d}[394,768]) {{
          %proj = matmul %x, %w : {d}[394,2304]
          %bb = broadcast %b {{dims = [1]}} : {d}[394,2304]
          %biased = add %proj, %bb : {d}[394,2304]
          %split = reshape %biased : {d}[197,2,3,768]
          %qkv = transpose %split {{perm = [2, 0, 1, 3]}} : {d}[3,197,2,768]
          %qs = slice %qkv {{ends = [1, 197, 2, 768], starts = [0, 0, 0, 0]}} : {d}[1,197,2,768]
          %q = reshape %qs : {d}[197,24,64]
          %qt = transpose %q {{perm = [1, 0, 2]}} : {d}[24,197,64]
          %ks = slice %qkv {{ends = [2, 197, 2, 768], starts = [1, 0, 0, 0]}} : {d}[1,197,2,768]
          %k = reshape %ks : {d}[197,24,64]
          %kt = transpose %k {{perm = [1, 0, 2]}} : {d}[24,197,64]
          %vs = slice %qkv {{ends = [3, 197, 2, 768], starts = [2, 0, 0, 0]}} : {d}[1,197,2,768]
          %v = reshape %vs : {d}[197,24,64]
          %vt = transpose %v {{perm = [1, 0, 2]}} : {d}[24,197,64]
          %scores = matmul %qt, %kt {{transpose_b = true}} : {d}[24,197,197]
          %scale = constant {{value = 0.125}} : {d}[]
          %scaleb = broadcast %scale {{dims = []}} : {d}[24,197,197]
          %scaled = mul %scores, %scaleb : {d}[24,197,197]
          %probs = softmax %scaled {{axis = 2}} : {d}[24,197,197]
          %ctx = matmul %probs, %vt : {d}[24,197,64]
          %ctxr = reshape %ctx : {d}[2,12,197,64]
          %ctxt = transpose %ctxr {{perm = [2, 0, 1, 3]}} : {d}[197,2,12,64]
          %y = reshape %ctxt : {d}[394,768]
          return %y
        }}",
        d = dtype
    ))
}

#[test]
fn the_projection_takes_its_bias_and_the_head_split_needs_no_copy_kernel() {
    // Two kernels: the projection with its bias (an epilogue), and the
    // attention; the head split's views live in one of them (the attention
    // reading Q, K and V through them, or, on the Hopper mainloop, the
    // projection writing them head-major), never in a copy kernel between.
    let g = exporter_attention_with_projection("f16");
    let model = CostModel::new(DeviceSpec::h100());
    let plan = dcir_fusion::plan_graph(&g, &model, &dcir_fusion::AnyGroup).expect("plans");
    let kinds: Vec<Vec<&str>> = plan
        .groups
        .iter()
        .map(|p| p.group.ops.iter().map(|&o| g.op(o).kind.name()).collect())
        .collect();
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    assert_eq!(plan.groups[0].group.kind, GroupKind::Gemm, "{kinds:?}");
    assert_eq!(kinds[0][..3], ["matmul", "broadcast", "add"], "{kinds:?}");
    assert_eq!(plan.groups[1].group.kind, GroupKind::Attention, "{kinds:?}");
}

#[test]
fn the_tensor_core_attention_contract() {
    use dcir_fusion::attention_tensor_core as tc;
    use dcir_ir::DType::{BF16, F16, F32};
    assert!(tc(F16, 64, 64, [64, 64], 128).is_ok());
    assert!(tc(BF16, 32, 48, [16, 16], 32).is_ok());
    assert!(tc(F16, 128, 128, [128, 128], 256).is_ok());
    for (dtype, d, dv, block, threads, why) in [
        (F32, 64, 64, [64, 64], 128, "on f32"),
        (F16, 24, 64, [64, 64], 128, "head dims 24/64"),
        (F16, 64, 256, [64, 64], 128, "head dims 64/256"),
        (F16, 64, 64, [64, 64], 256, "threads = 256"),
        (F16, 64, 64, [144, 64], 288, "block = [144, 64]"),
        (F16, 64, 64, [64, 24], 128, "block = [64, 24]"),
        (F16, 64, 64, [64, 256], 128, "block = [64, 256]"),
    ] {
        let e = tc(dtype, d, dv, block, threads).expect_err(why).to_string();
        assert!(e.contains(why), "{why}: {e}");
    }
}

/// A convolution whose input is a transpose of an NHWC value and filter of a
/// KRSC one gets the Hopper mainloop's candidates, its k steps split where
/// its tiles leave SMs idle (ResNet-50's last 3×3 conv at batch 32: 52
/// tiles of 128 × 128 for 132 SMs); the same convolution reading NCHW gets
/// none (no im2col map reads it).
#[test]
fn a_channels_last_convolution_gets_the_hopper_mainloop() {
    let channels_last = graph(
        "graph @c(%x: f16[32,7,7,512], %w: f16[512,3,3,512]) -> (f16[32,512,7,7]) {\n  \
         %xt = transpose %x {perm = [0, 3, 1, 2]} : f16[32,512,7,7]\n  \
         %wt = transpose %w {perm = [0, 3, 1, 2]} : f16[512,512,3,3]\n  \
         %c = conv2d %xt, %wt {pad = [1, 1, 1, 1]} : f16[32,512,7,7]\n  return %c\n}",
    );
    let nchw = graph(
        "graph @c(%x: f16[32,512,7,7], %w: f16[512,512,3,3]) -> (f16[32,512,7,7]) {\n  \
         %c = conv2d %x, %w {pad = [1, 1, 1, 1]} : f16[32,512,7,7]\n  return %c\n}",
    );
    let model = CostModel::kernels_only(DeviceSpec::h200());
    let wgmma = |g: &Graph, names: &[&str]| -> Vec<(Vec<i64>, i64)> {
        model
            .candidates(g, &group(g, names, GroupKind::Conv, Level::Register))
            .unwrap()
            .into_iter()
            .filter(|c| attr_str(c.params.get("mainloop")) == Some("wgmma"))
            .map(|c| {
                let tile = c.params.get("tile").and_then(|a| a.as_ints()).unwrap();
                let split = c.params.get("split_k").and_then(|a| a.as_int());
                (tile.to_vec(), split.unwrap_or(1))
            })
            .collect()
    };
    let offered = wgmma(&channels_last, &["xt", "wt", "c"]);
    assert!(offered.contains(&(vec![128, 128, 64], 1)), "{offered:?}");
    assert!(offered.contains(&(vec![128, 192, 64], 2)), "{offered:?}");
    assert!(offered.iter().any(|(_, split)| *split > 1), "{offered:?}");
    assert!(wgmma(&nchw, &["c"]).is_empty());
}

/// Every Hopper candidate is a blocking the emitter runs as written: the
/// stages, threads and shared memory the model prices are
/// [`HopperBlocking`]'s for the candidate's tile, stages and split (the
/// emitter lowers the stages it is given only where they overflow shared
/// memory, so a candidate whose stages it would lower is never offered).
#[test]
fn hopper_candidates_are_blockings_the_emitter_honours() {
    let g = graph(
        "graph @mm(%a: f16[6304,768], %b: f16[768,3072]) -> (f16[6304,3072]) {\n  \
         %y = matmul %a, %b : f16[6304,3072]\n  return %y\n}",
    );
    let device = DeviceSpec::h100();
    let limit = device.shared_per_block as usize;
    let model = CostModel::kernels_only(device);
    let hopper: Vec<_> = model
        .candidates(&g, &group(&g, &["y"], GroupKind::Gemm, Level::Register))
        .unwrap()
        .into_iter()
        .filter(|c| attr_str(c.params.get("mainloop")) == Some("wgmma"))
        .collect();
    assert!(hopper.len() >= 2, "{} Hopper candidates", hopper.len());
    for c in hopper {
        let tile = c.params.get("tile").and_then(|a| a.as_ints()).unwrap();
        let stages = c.params.get("stages").and_then(|a| a.as_int()).unwrap();
        let split = c
            .params
            .get("split_k")
            .and_then(|a| a.as_int())
            .unwrap_or(1);
        let blocking = HopperBlocking::new(
            [tile[0], tile[1], tile[2]],
            stages,
            split > 1,
            [false; 2],
            limit,
        );
        let what = c.params.describe();
        assert_eq!(blocking.stages as i64, stages, "{what}");
        assert_eq!(
            [blocking.tm, blocking.tn].map(|x| x as i64),
            [tile[0], tile[1]],
            "{what}"
        );
        assert!(blocking.fits(limit), "{what}");
        assert_eq!(c.launch.threads as usize, blocking.threads(), "{what}");
        assert_eq!(
            c.launch.shared_bytes as usize,
            blocking.shared_bytes(),
            "{what}"
        );
    }
}

#[test]
fn contiguous_rows_are_read_at_the_emitters_vector_width() {
    // ViT-B/16's layernorm (f16 rows of 768): the emitter reads 8 elements an
    // access, so 32 threads a row hold three vectors (24 values) in registers
    // and use every lane; scalar reads are not offered where vectors fit.
    let model = CostModel::new(DeviceSpec::h100());
    let g = graph(
        "graph @ln(%x: f16[6304,768], %s: f16[768], %b: f16[768]) -> (f16[6304,768]) {\n  %y = layernorm %x, %s, %b {axis = 1, epsilon = 1e-6} : f16[6304,768]\n  return %y\n}",
    );
    let grp = group(&g, &["y"], GroupKind::Reduction, Level::Register);
    for c in model.candidates(&g, &grp).unwrap() {
        assert_eq!(c.params.get("vector").and_then(Attr::as_int), Some(4));
    }
    let e = model.estimate(&g, &grp).unwrap();
    assert_eq!(
        e.params.get("threads_per_row").and_then(Attr::as_int),
        Some(32)
    );
    assert_eq!(attr_str(e.params.get("row_cache")), Some("registers"));
}

#[test]
fn tensor_core_attention_counts_keys_in_chunks_of_16() {
    // 197 keys (ViT-B/16): the last key step computes whole 16-key chunks,
    // so steps of 64 keys pay for 208 keys, as steps of 32 do, and the wider
    // step wins (an H100: 34.8 against 35.7 us a layer at [128, 64]).
    let model = CostModel::kernels_only(DeviceSpec::h100());
    let g = graph(
        "graph @a(%q: f16[384,197,64], %k: f16[384,197,64], %v: f16[384,197,64]) -> (f16[384,197,64]) {\n  %kt = transpose %k {perm = [0, 2, 1]} : f16[384,64,197]\n  %s = matmul %q, %kt : f16[384,197,197]\n  %p = softmax %s {axis = 2} : f16[384,197,197]\n  %o = matmul %p, %v : f16[384,197,64]\n  return %o\n}",
    );
    let grp = group(
        &g,
        &["kt", "s", "p", "o"],
        GroupKind::Attention,
        Level::Register,
    );
    let e = model.estimate(&g, &grp).unwrap();
    assert_eq!(attr_str(e.params.get("math")), Some("tensor_core"));
    assert_eq!(
        e.params.get("block").and_then(Attr::as_ints).map(|b| b[1]),
        Some(64),
        "{}",
        e.params.describe()
    );
}

/// The Hopper blocking's warpgroups and register split: one consumer per 64
/// rows, 192 rows only beside at most 128 columns, and the registers the
/// consumers take no more than the block was launched with once the
/// producer's are given up (`setmaxnreg.inc` would wait forever).
#[test]
fn hopper_blockings_split_the_registers_they_hold() {
    let limit = DeviceSpec::h100().shared_per_block as usize;
    let cases = [
        ([64, 64], (64, 64, 256, (40, 232))),
        ([128, 192], (128, 192, 384, (40, 232))),
        ([192, 128], (192, 128, 512, (40, 152))),
        ([192, 64], (192, 64, 512, (40, 152))),
        ([256, 192], (128, 192, 384, (40, 232))),
    ];
    for ([tm, tn], (rows, cols, threads, registers)) in cases {
        let b = HopperBlocking::new([tm, tn, 64], 4, false, [false; 2], limit);
        assert!(!b.swapped, "{tm}x{tn}: swapped without K-major operands");
        assert_eq!(
            (b.tm, b.tn, b.threads()),
            (rows, cols, threads),
            "{tm}x{tn}"
        );
        assert_eq!(b.registers(), registers, "{tm}x{tn}");
        let (producer, consumer) = b.registers();
        assert!(
            128 * (producer + b.consumers() * consumer) <= b.launch_registers() * b.threads(),
            "{tm}x{tn}"
        );
        assert!(
            consumer >= b.tn / 2 + 24,
            "{tm}x{tn}: accumulators and addressing"
        );
        assert!(
            b.fits(limit) && b.stages == 4,
            "{tm}x{tn}: {} stages",
            b.stages
        );
    }
}

/// Swapped blockings: 256 × 64 tiles of two K-major operands, one consumer
/// whose `m64n256k16` accumulators (128 a thread) are the tile transposed,
/// storing all 256 rows.
#[test]
fn hopper_swapped_blockings_multiply_256_columns_a_consumer() {
    let limit = DeviceSpec::h100().shared_per_block as usize;
    for tile in [[256, 64, 64], [256, 32, 64], [512, 48, 64]] {
        let b = HopperBlocking::new(tile, 4, false, [true; 2], limit);
        assert!(b.swapped, "{tile:?}");
        assert_eq!((b.tm, b.tn, b.consumers(), b.threads()), (256, 64, 1, 256));
        assert_eq!(
            (b.wgmma_n(), b.accumulators(), b.consumer_rows()),
            (256, 128, 256)
        );
        assert_eq!(b.registers(), (40, 232));
        assert!(b.fits(limit) && b.stages == 4);
    }
    // Not where A is M-major, nor for more than 64 columns.
    assert!(!HopperBlocking::new([256, 64, 64], 4, false, [false, true], limit).swapped);
    assert!(!HopperBlocking::new([256, 128, 64], 4, false, [true; 2], limit).swapped);
}

/// The Hopper implicit GEMM's k steps: the box width that takes the fewest
/// steps (the wider where they tie), boxes walked in (tap, slice) order
/// across steps, a last step part past the window where the boxes do not
/// fill it.
#[test]
fn hopper_conv_steps_take_the_box_with_fewest_steps() {
    // (channels, taps) -> (box, boxes a tap, steps, tail)
    let cases = [
        ((64, 9), (64, 1, 9, false)),
        ((128, 9), (64, 2, 18, false)),
        ((16, 16), (16, 1, 4, false)),
        ((8, 4), (16, 1, 1, false)),
        ((32, 4), (32, 1, 2, false)),
        ((32, 9), (32, 1, 5, true)),
        ((96, 9), (32, 3, 14, true)),
        ((160, 7), (32, 5, 18, true)),
        ((192, 7), (64, 3, 21, false)),
        ((48, 9), (64, 1, 9, false)),
    ];
    for ((channels, taps), (channel_box, slices, steps, tail)) in cases {
        let s = hopper_conv_steps(channels, taps);
        assert_eq!(
            (s.channel_box, s.slices, s.steps, s.tail()),
            (channel_box, slices, steps, tail),
            "{channels} channels, {taps} taps"
        );
        assert_eq!(s.boxes_per_step * s.channel_box, 64);
    }
}
