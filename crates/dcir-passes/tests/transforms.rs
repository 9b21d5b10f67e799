//! The built-in transforms on small graphs: each rewrites what it should,
//! leaves alone what it must not, keeps the IR valid, and keeps the
//! reference interpreter's results (same random inputs before and after,
//! compared with `dcir_interp::compare`).

use dcir_interp::{Tolerance, compare, random_inputs, run_graph};
use dcir_ir::{DType, Graph, Module, OpKind, ValueDef, print_module, verify_module};
use dcir_passes::{Instrumentation, PassManager, PassRegistry, PipelineFailure, build_pipeline};
use dcir_reader::parse_module;
use dcir_testgen::{arb_module_spec, build_module, proptest_config};
use proptest::prelude::*;

/// Reads and verifies `text`.
fn parse(text: &str) -> Module {
    let module = parse_module(text).unwrap_or_else(|d| panic!("bad test IR: {d:?}\n{text}"));
    verify_module(&module).unwrap_or_else(|e| panic!("test IR does not verify: {e:?}"));
    module
}

/// Runs `pipeline` on a copy of `module`, verifying after every pass.
fn try_run(pipeline: &str, module: &Module) -> Result<Module, String> {
    let registry = PassRegistry::with_builtins();
    let passes = build_pipeline(&registry, pipeline).map_err(|e| e.render(pipeline))?;
    let instrumentation = Instrumentation {
        verify_each: true,
        ..Instrumentation::default()
    };
    let mut out = module.clone();
    PassManager::new(passes, instrumentation)
        .run(&mut out, &mut std::io::sink())
        .map_err(|failure| match failure {
            PipelineFailure::Verify { pass, errors, ir } => {
                format!("`{pass}` broke the IR: {errors:?}\n{ir}")
            }
            other => other.to_string(),
        })?;
    Ok(out)
}

fn run(pipeline: &str, module: &Module) -> Module {
    try_run(pipeline, module).unwrap_or_else(|e| panic!("{pipeline}: {e}"))
}

/// The kinds of the live ops of `graph`, regions included, in pre-order.
fn kinds(graph: &Graph) -> Vec<OpKind> {
    graph
        .all_ops()
        .into_iter()
        .map(|o| graph.op(o).kind)
        .collect()
}

fn count(graph: &Graph, kind: OpKind) -> usize {
    kinds(graph).into_iter().filter(|&k| k == kind).count()
}

/// The names of the values `graph` returns.
fn outputs(graph: &Graph) -> Vec<String> {
    graph
        .outputs()
        .expect("a return")
        .iter()
        .map(|&v| graph.value(v).name.clone())
        .collect()
}

/// Runs every graph of `before` and `after` on the same random inputs and
/// compares the results with `tol` (the dtype's default when `None`).
fn assert_same_results(before: &Module, after: &Module, tol: Option<Tolerance>) {
    for (b, a) in before.graphs.iter().zip(&after.graphs) {
        for seed in [1, 2] {
            let inputs = random_inputs(b, seed);
            let expected = run_graph(b, &inputs).expect("the input graph runs");
            let actual = run_graph(a, &inputs).expect("the rewritten graph runs");
            for (i, (e, x)) in expected.iter().zip(&actual).enumerate() {
                let tol = tol.unwrap_or_else(|| Tolerance::for_dtype(e.dtype()));
                if let Err(m) = compare(e, x, &tol) {
                    panic!(
                        "@{} output {i}, seed {seed}: {m}\nafter:\n{}",
                        b.name(),
                        print_module(after)
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------- canonicalize

const IDENTITIES: &str = "
graph @g(%x: f32[2,3], %i: i64[4]) -> (f32[2,3], i64[4]) {
  %zero = constant {value = 0.0} : f32[]
  %z = broadcast %zero {dims = []} : f32[2,3]
  %one = constant {value = 1.0} : f32[2,3]
  %a = add %z, %x : f32[2,3]
  %s = sub %a, %z : f32[2,3]
  %m = mul %one, %s : f32[2,3]
  %d = div %m, %one : f32[2,3]
  %r = relu %d : f32[2,3]
  %izero = constant {value = 0} : i64[4]
  %ione = constant {value = 1} : i64[4]
  %ia = add %i, %izero : i64[4]
  %im = mul %ia, %ione : i64[4]
  return %r, %im
}";

#[test]
fn canonicalize_removes_identity_arithmetic() {
    let before = parse(IDENTITIES);
    let after = run("canonicalize,dce", &before);
    let g = &after.graphs[0];
    assert_eq!(kinds(g), [OpKind::Relu, OpKind::Return]);
    let relu = g.all_ops()[0];
    assert_eq!(g.value(g.op(relu).operands[0]).name, "x");
    assert_eq!(outputs(g), ["r", "i"]);
    assert_same_results(&before, &after, Some(Tolerance::EXACT));
}

#[test]
fn canonicalize_leaves_dead_ops_to_dce() {
    let before = parse(IDENTITIES);
    let after = run("canonicalize", &before);
    // Uses are redirected, but every op is still there.
    assert_eq!(
        after.graphs[0].all_ops().len(),
        before.graphs[0].all_ops().len()
    );
    assert_eq!(outputs(&after.graphs[0]), ["r", "i"]);
    assert_same_results(&before, &after, Some(Tolerance::EXACT));
}

#[test]
fn canonicalize_keeps_non_identities() {
    let before = parse(
        "graph @g(%x: f32[2]) -> (f32[2], f32[2], f32[2], f32[2], f32[2]) {
          %half = constant {value = 0.5} : f32[2]
          %a = add %x, %half : f32[2]
          %list = constant {value = [0.0, 0.0]} : f32[2]
          %b = add %x, %list : f32[2]
          %zero = constant {value = 0.0} : f32[2]
          %c = sub %zero, %x : f32[2]
          %one = constant {value = 1.0} : f32[2]
          %d = div %one, %x : f32[2]
          %e = add %x, %one : f32[2]
          return %a, %b, %c, %d, %e
        }",
    );
    let after = run("canonicalize,dce", &before);
    assert_eq!(after, before);
}

#[test]
fn canonicalize_composes_transposes() {
    let before = parse(
        "graph @g(%x: f32[2,3,4]) -> (f32[4,2,3], f32[2,3,4], f32[2,3,4]) {
          %t1 = transpose %x {perm = [1, 0, 2]} : f32[3,2,4]
          %t2 = transpose %t1 {perm = [2, 1, 0]} : f32[4,2,3]
          %t3 = transpose %t1 {perm = [1, 0, 2]} : f32[2,3,4]
          %t4 = transpose %x {perm = [0, 1, 2]} : f32[2,3,4]
          return %t2, %t3, %t4
        }",
    );
    let after = run("canonicalize,dce", &before);
    let g = &after.graphs[0];
    assert_eq!(kinds(g), [OpKind::Transpose, OpKind::Return]);
    let t = g.op(g.all_ops()[0]);
    assert_eq!(g.value(t.operands[0]).name, "x");
    assert_eq!(t.attrs.ints("perm"), Some(&[2, 0, 1][..]));
    assert_eq!(outputs(g), ["t2", "x", "x"]);
    assert_same_results(&before, &after, Some(Tolerance::EXACT));
}

#[test]
fn canonicalize_merges_reshapes_and_drops_no_op_broadcasts() {
    let before = parse(
        "graph @g(%x: f32[2,6]) -> (f32[3,4], f32[2,6], f32[2,6]) {
          %r1 = reshape %x : f32[12]
          %r2 = reshape %r1 : f32[4,3]
          %r3 = reshape %r2 : f32[3,4]
          %back = reshape %r1 : f32[2,6]
          %b = broadcast %x {dims = [0, 1]} : f32[2,6]
          return %r3, %back, %b
        }",
    );
    let after = run("canonicalize,dce", &before);
    let g = &after.graphs[0];
    assert_eq!(kinds(g), [OpKind::Reshape, OpKind::Return]);
    assert_eq!(g.value(g.op(g.all_ops()[0]).operands[0]).name, "x");
    assert_eq!(outputs(g), ["r3", "x", "x"]);
    assert_same_results(&before, &after, Some(Tolerance::EXACT));
}

#[test]
fn canonicalize_folds_last_two_dims_transposes_into_matmul() {
    let before = parse(
        "graph @g(%a: f32[2,3,4], %b: f32[2,5,4], %c: f32[3,2,4]) -> (f32[2,3,5], f32[2,4,4], f32[2,3,5]) {
          %bt = transpose %b {perm = [0, 2, 1]} : f32[2,4,5]
          %m1 = matmul %a, %bt : f32[2,3,5]
          %at = transpose %a {perm = [0, 2, 1]} : f32[2,4,3]
          %m2 = matmul %at, %at {transpose_b = true} : f32[2,4,4]
          %ct = transpose %c {perm = [1, 0, 2]} : f32[2,3,4]
          %m3 = matmul %ct, %bt : f32[2,3,5]
          return %m1, %m2, %m3
        }",
    );
    let after = run("canonicalize,dce", &before);
    let g = &after.graphs[0];
    // Only the batch-moving transpose stays.
    assert_eq!(count(g, OpKind::Transpose), 1);
    let flags: Vec<(bool, bool)> = g
        .all_ops()
        .into_iter()
        .filter(|&o| g.op(o).kind == OpKind::Matmul)
        .map(|o| {
            let attrs = &g.op(o).attrs;
            (
                attrs.bool("transpose_a").unwrap(),
                attrs.bool("transpose_b").unwrap(),
            )
        })
        .collect();
    assert_eq!(flags, [(false, true), (true, false), (false, true)]);
    assert_same_results(&before, &after, None);
}

#[test]
fn canonicalize_stops_at_max_iterations() {
    // Each sweep peels one transpose pair off the matmul's operand.
    let text = "graph @g(%a: f32[3,3], %b: f32[3,3]) -> (f32[3,3]) {
          %t1 = transpose %b {perm = [1, 0]} : f32[3,3]
          %t2 = transpose %t1 {perm = [1, 0]} : f32[3,3]
          %t3 = transpose %t2 {perm = [1, 0]} : f32[3,3]
          %m = matmul %a, %t3 : f32[3,3]
          return %m
        }";
    let before = parse(text);
    let full = run("canonicalize,dce", &before);
    assert_eq!(
        kinds(&full.graphs[0]),
        [OpKind::Matmul, OpKind::Return],
        "{}",
        print_module(&full)
    );
    assert_same_results(&before, &full, None);
    let err = try_run("canonicalize{max-iterations=0}", &before).unwrap_err();
    assert!(err.contains("max-iterations"), "{err}");
}

#[test]
fn canonicalize_rewrites_inside_fused_regions() {
    let before = parse(
        "graph @g(%x: f32[4,4]) -> (f32[4,4]) {
          %y = fused @g0(%xi = %x) {kind = \"elementwise\"} : f32[4,4] {
            %one = constant {value = 1.0} : f32[]
            %ob = broadcast %one {dims = []} : f32[4,4]
            %t = transpose %xi {perm = [1, 0]} : f32[4,4]
            %m = mul %t, %ob : f32[4,4]
            %tt = transpose %m {perm = [1, 0]} : f32[4,4]
            %r = relu %tt : f32[4,4]
            yield %r
          }
          return %y
        }",
    );
    let after = run("canonicalize,dce", &before);
    let g = &after.graphs[0];
    assert_eq!(
        kinds(g),
        [OpKind::Fused, OpKind::Relu, OpKind::Yield, OpKind::Return]
    );
    assert_same_results(&before, &after, Some(Tolerance::EXACT));
}

// -------------------------------------------------------------- fold-batchnorm

#[test]
fn fold_batchnorm_folds_plain_grouped_and_depthwise_convs() {
    for (x, w, groups, out) in [
        ("f32[2,3,6,6]", "f32[4,3,3,3]", 1, "f32[2,4,4,4]"),
        ("f32[1,4,6,6]", "f32[6,2,3,3]", 2, "f32[1,6,4,4]"),
        ("f32[1,5,6,6]", "f32[5,1,3,3]", 5, "f32[1,5,4,4]"),
    ] {
        let c = &w[4..w.find(',').unwrap()];
        let text = format!(
            "graph @g(%x: {x}, %w: {w}, %s: f32[{c}], %b: f32[{c}], %m: f32[{c}], %v: f32[{c}]) -> ({out}) {{
              %y = conv2d %x, %w {{groups = {groups}}} : {out}
              %n = batchnorm %y, %s, %b, %m, %v {{epsilon = 0.01}} : {out}
              %r = relu %n : {out}
              return %r
            }}"
        );
        let before = parse(&text);
        let after = run("fold-batchnorm", &before);
        let g = &after.graphs[0];
        assert_eq!(count(g, OpKind::Batchnorm), 0, "{}", print_module(&after));
        let conv = g
            .all_ops()
            .into_iter()
            .find(|&o| g.op(o).kind == OpKind::Conv2d)
            .unwrap();
        let w_folded = g.op(conv).operands[1];
        let ValueDef::OpResult { op: mul, .. } = g.value(w_folded).def else {
            panic!("the conv's weight is computed");
        };
        assert_eq!(g.op(mul).kind, OpKind::Mul);
        // Every new op before the conv is weight-only: it reads no %x.
        let x = g.params()[0];
        let body = &g.block(g.body()).ops;
        let conv_pos = body.iter().position(|&o| o == conv).unwrap();
        assert!(
            body[..conv_pos]
                .iter()
                .all(|&o| !g.op(o).operands.contains(&x))
        );
        assert_same_results(&before, &after, None);
    }
}

#[test]
fn fold_batchnorm_skips_shared_convs_and_non_convs() {
    let before = parse(
        "graph @g(%x: f32[1,2,4,4], %w: f32[2,2,1,1], %s: f32[2], %b: f32[2], %m: f32[2], %v: f32[2]) -> (f32[1,2,4,4], f32[1,2,4,4], f32[1,2,4,4]) {
          %c = conv2d %x, %w : f32[1,2,4,4]
          %n = batchnorm %c, %s, %b, %m, %v : f32[1,2,4,4]
          %r = relu %x : f32[1,2,4,4]
          %n2 = batchnorm %r, %s, %b, %m, %v : f32[1,2,4,4]
          return %n, %c, %n2
        }",
    );
    let after = run("fold-batchnorm", &before);
    assert_eq!(after, before);
}

#[test]
fn fold_batchnorm_moves_the_conv_below_late_parameters() {
    let before = parse(
        "graph @g(%x: f32[1,2,4,4], %w: f32[2,2,1,1], %s: f32[2], %b: f32[2], %m: f32[2], %v: f32[2]) -> (f32[1,2,4,4]) {
          %c = conv2d %x, %w : f32[1,2,4,4]
          %v2 = abs %v : f32[2]
          %n = batchnorm %c, %s, %b, %m, %v2 : f32[1,2,4,4]
          return %n
        }",
    );
    let after = run("fold-batchnorm", &before);
    assert_eq!(count(&after.graphs[0], OpKind::Batchnorm), 0);
    assert_same_results(&before, &after, None);
}

#[test]
fn fold_batchnorm_on_mobilenet_block() {
    let text = include_str!("../../../ir-examples/mobilenet_v2_inverted_residual.dcir");
    let before = parse(text);
    let after = run("fold-batchnorm,hoist-weights", &before);
    let g = &after.graphs[0];
    assert_eq!(count(g, OpKind::Batchnorm), 0);
    assert_eq!(count(g, OpKind::Conv2d), 3);
    // The folded weights and biases come first: the first op reading %x is a conv.
    let x = g.params()[0];
    let body = &g.block(g.body()).ops;
    let first = body
        .iter()
        .position(|&o| g.op(o).operands.contains(&x))
        .unwrap();
    assert_eq!(g.op(body[first]).kind, OpKind::Conv2d);
    assert!(
        body[..first]
            .iter()
            .all(|&o| g.op(o).kind != OpKind::Conv2d)
    );
    assert_same_results(&before, &after, None);
}

// ------------------------------------------------------------------ decompose

#[test]
fn decompose_layernorm_uses_only_primitives() {
    let before = parse(
        "graph @g(%x: f32[2,3,8], %s1: f32[8], %b1: f32[8], %s2: f32[3,8], %b2: f32[3,8]) -> (f32[2,3,8], f32[2,3,8]) {
          %y = layernorm %x, %s1, %b1 {axis = 2} : f32[2,3,8]
          %z = layernorm %x, %s2, %b2 {axis = 1, epsilon = 1e-3} : f32[2,3,8]
          return %y, %z
        }",
    );
    let after = run("decompose-layernorm", &before);
    let g = &after.graphs[0];
    assert_eq!(count(g, OpKind::Layernorm), 0);
    assert_eq!(count(g, OpKind::ReduceMean), 4);
    assert_eq!(count(g, OpKind::Rsqrt), 2);
    assert_same_results(&before, &after, None);
}

#[test]
fn decompose_layernorm_keeps_half_dtypes_in_regions() {
    let before = parse(
        "graph @g(%x: f16[4,16], %s: f16[16], %b: f16[16]) -> (f16[4,16]) {
          %y = fused @g0(%xi = %x, %si = %s, %bi = %b) {kind = \"reduction\"} : f16[4,16] {
            %n = layernorm %xi, %si, %bi {axis = 1} : f16[4,16]
            yield %n
          }
          return %y
        }",
    );
    let after = run("decompose-layernorm", &before);
    let g = &after.graphs[0];
    assert_eq!(count(g, OpKind::Layernorm), 0);
    // Everything new lives in the region and is f16.
    assert_eq!(g.block(g.body()).ops.len(), 2);
    for op in g.all_ops() {
        for &r in &g.op(op).results {
            assert_eq!(g.ty(r).dtype, DType::F16);
        }
    }
    assert_same_results(&before, &after, None);
}

#[test]
fn decompose_softmax_uses_only_primitives() {
    let before = parse(
        "graph @g(%x: f32[2,4,8], %h: bf16[10]) -> (f32[2,4,8], f32[2,4,8], bf16[10]) {
          %a = softmax %x {axis = 2} : f32[2,4,8]
          %b = softmax %x {axis = 0} : f32[2,4,8]
          %c = softmax %h {axis = 0} : bf16[10]
          return %a, %b, %c
        }",
    );
    let after = run("decompose-softmax", &before);
    let g = &after.graphs[0];
    assert_eq!(count(g, OpKind::Softmax), 0);
    assert_eq!(count(g, OpKind::ReduceMax), 3);
    assert_eq!(count(g, OpKind::ReduceSum), 3);
    assert_eq!(count(g, OpKind::Exp), 3);
    assert_same_results(&before, &after, None);
}

#[test]
fn decompose_gelu_both_forms() {
    let before = parse(
        "graph @g(%x: f32[4,8], %h: f16[6], %s: f32[]) -> (f32[4,8], f32[4,8], f16[6], f32[]) {
          %e = gelu %x : f32[4,8]
          %t = gelu %x {approximate = \"tanh\"} : f32[4,8]
          %he = gelu %h : f16[6]
          %st = gelu %s {approximate = \"tanh\"} : f32[]
          return %e, %t, %he, %st
        }",
    );
    let after = run("decompose-gelu", &before);
    let g = &after.graphs[0];
    assert_eq!(count(g, OpKind::Gelu), 0);
    assert_eq!(count(g, OpKind::Erf), 2);
    assert_eq!(count(g, OpKind::Tanh), 2);
    // Constants have the dtype of the value they scale.
    for op in g.all_ops() {
        if g.op(op).kind == OpKind::Constant {
            let dtype = g.ty(g.op(op).results[0]).dtype;
            assert!(matches!(dtype, DType::F32 | DType::F16));
        }
    }
    assert_same_results(&before, &after, None);
}

#[test]
fn fold_matmul_scale_moves_the_factors_after_the_product() {
    // Attention as torch.onnx.export writes it: Q and Kᵀ each scaled by
    // d^-1/4 (a full-shape constant on one side, a broadcast scalar on the
    // other), in f16 where the factor is the product of the rounded constants.
    let before = parse(
        "graph @g(%q: f16[2,8,16], %k: f16[2,16,8], %v: f16[2,8,16]) -> (f16[2,8,16], f16[2,16,8]) {
          %cq = constant {value = 0.5} : f16[2,8,16]
          %qs = mul %q, %cq : f16[2,8,16]
          %c = constant {value = 0.25} : f16[]
          %cb = broadcast %c {dims = []} : f16[2,16,8]
          %ks = mul %cb, %k : f16[2,16,8]
          %s = matmul %qs, %ks : f16[2,8,8]
          %p = softmax %s {axis = 2} : f16[2,8,8]
          %o = matmul %p, %v : f16[2,8,16]
          return %o, %ks
        }",
    );
    let after = run("fold-matmul-scale,dce", &before);
    let g = &after.graphs[0];
    // The scores' matmul reads Q and K themselves; %ks stays for its other use.
    let scores = g
        .all_ops()
        .into_iter()
        .find(|&o| g.op(o).kind == OpKind::Matmul && g.value(g.op(o).operands[0]).name == "q")
        .expect("the scores read %q");
    assert_eq!(g.value(g.op(scores).operands[1]).name, "k");
    assert_eq!(count(g, OpKind::Mul), 2);
    let printed = print_module(&after);
    assert!(printed.contains("value = 0.125"), "{printed}");
    assert_same_results(&before, &after, None);
}

#[test]
fn fold_matmul_scale_leaves_what_it_cannot_move() {
    // Not a splat, an integer matmul, a zero factor and one past f32's
    // range: unchanged.
    let before = parse(
        "graph @g(%a: f32[4,4], %w: f32[4,4], %i: i32[4,4], %j: i32[4,4]) -> (f32[4,4], i32[4,4], f32[4,4], f32[4,4]) {
          %as = mul %a, %w : f32[4,4]
          %x = matmul %as, %w : f32[4,4]
          %two = constant {value = 2} : i32[4,4]
          %is = mul %i, %two : i32[4,4]
          %y = matmul %is, %j : i32[4,4]
          %zero = constant {value = 0.0} : f32[4,4]
          %az = mul %a, %zero : f32[4,4]
          %z = matmul %az, %w : f32[4,4]
          %inf = constant {value = 1e40} : f32[4,4]
          %ai = mul %a, %inf : f32[4,4]
          %u = matmul %ai, %w : f32[4,4]
          return %x, %y, %z, %u
        }",
    );
    let after = run("fold-matmul-scale", &before);
    assert_eq!(print_module(&after), print_module(&before));
}

#[test]
fn fold_matmul_scale_drops_a_unit_product() {
    let before = parse(
        "graph @g(%a: f32[4,4], %w: f32[4,4]) -> (f32[4,4]) {
          %two = constant {value = 2.0} : f32[4,4]
          %half = constant {value = 0.5} : f32[4,4]
          %as = mul %a, %two : f32[4,4]
          %ws = mul %w, %half : f32[4,4]
          %x = matmul %as, %ws {transpose_b = true} : f32[4,4]
          return %x
        }",
    );
    let after = run("fold-matmul-scale,dce", &before);
    let g = &after.graphs[0];
    assert_eq!(count(g, OpKind::Mul), 0);
    assert!(print_module(&after).contains("transpose_b = true"));
    assert_same_results(&before, &after, None);
}

#[test]
fn fold_gelu_finds_the_exact_gelu_as_exporters_write_it() {
    // torch.onnx.export's nn.GELU (full-shape splat constants), HF's
    // `x * 0.5 * (1 + erf(x / sqrt(2)))` (broadcast scalars, 1 + erf), and
    // x · (1/√2) with the factors grouped as x · (0.5 · a); in f16, whose
    // √2 is 1.4140625.
    let before = parse(
        "graph @g(%x: f32[4,8], %y: f32[4,8], %z: f16[4,8]) -> (f32[4,8], f32[4,8], f16[4,8]) {
          %r2 = constant {value = 1.4142135381698608} : f32[4,8]
          %d = div %x, %r2 : f32[4,8]
          %e = erf %d : f32[4,8]
          %one = constant {value = 1.0} : f32[4,8]
          %a = add %e, %one : f32[4,8]
          %m = mul %x, %a : f32[4,8]
          %half = constant {value = 0.5} : f32[4,8]
          %gx = mul %m, %half : f32[4,8]
          %h = constant {value = 0.5} : f32[]
          %hb = broadcast %h {dims = []} : f32[4,8]
          %yh = mul %y, %hb : f32[4,8]
          %s = constant {value = 1.4142135623730951} : f32[]
          %sb = broadcast %s {dims = []} : f32[4,8]
          %yd = div %y, %sb : f32[4,8]
          %ye = erf %yd : f32[4,8]
          %o = constant {value = 1.0} : f32[]
          %ob = broadcast %o {dims = []} : f32[4,8]
          %ya = add %ob, %ye : f32[4,8]
          %gy = mul %yh, %ya : f32[4,8]
          %ir2 = constant {value = 0.7071067811865476} : f16[4,8]
          %zd = mul %ir2, %z : f16[4,8]
          %ze = erf %zd : f16[4,8]
          %one16 = constant {value = 1.0} : f16[4,8]
          %za = add %ze, %one16 : f16[4,8]
          %half16 = constant {value = 0.5} : f16[4,8]
          %zh = mul %half16, %za : f16[4,8]
          %gz = mul %z, %zh : f16[4,8]
          return %gx, %gy, %gz
        }",
    );
    let after = run("fold-gelu,dce", &before);
    let g = &after.graphs[0];
    assert_eq!(count(g, OpKind::Gelu), 3, "{}", print_module(&after));
    for kind in [OpKind::Erf, OpKind::Mul, OpKind::Div, OpKind::Add] {
        assert_eq!(
            count(g, kind),
            0,
            "{kind:?} left:\n{}",
            print_module(&after)
        );
    }
    assert_same_results(&before, &after, None);
}

#[test]
fn fold_gelu_leaves_what_is_not_the_exact_gelu() {
    // √3 for √2, 2 + erf, a factor of 0.25, and the product of erf's
    // argument with another value: unchanged. A shared `1 + erf` stays for
    // its other use while its product folds.
    let before = parse(
        "graph @g(%x: f32[4,8], %w: f32[4,8]) -> (f32[4,8], f32[4,8], f32[4,8], f32[4,8], f32[4,8], f32[4,8]) {
          %r3 = constant {value = 1.7320508075688772} : f32[4,8]
          %r2 = constant {value = 1.4142135381698608} : f32[4,8]
          %one = constant {value = 1.0} : f32[4,8]
          %two = constant {value = 2.0} : f32[4,8]
          %half = constant {value = 0.5} : f32[4,8]
          %quarter = constant {value = 0.25} : f32[4,8]
          %d3 = div %x, %r3 : f32[4,8]
          %e3 = erf %d3 : f32[4,8]
          %a3 = add %e3, %one : f32[4,8]
          %m3 = mul %x, %a3 : f32[4,8]
          %g3 = mul %m3, %half : f32[4,8]
          %d = div %x, %r2 : f32[4,8]
          %e = erf %d : f32[4,8]
          %a2 = add %e, %two : f32[4,8]
          %m2 = mul %x, %a2 : f32[4,8]
          %g2 = mul %m2, %half : f32[4,8]
          %a = add %e, %one : f32[4,8]
          %mq = mul %x, %a : f32[4,8]
          %gq = mul %mq, %quarter : f32[4,8]
          %mw = mul %w, %a : f32[4,8]
          %gw = mul %mw, %half : f32[4,8]
          %m = mul %x, %a : f32[4,8]
          %g = mul %m, %half : f32[4,8]
          return %g3, %g2, %gq, %gw, %g, %a
        }",
    );
    let after = run("fold-gelu,dce", &before);
    let g = &after.graphs[0];
    assert_eq!(count(g, OpKind::Gelu), 1, "{}", print_module(&after));
    assert_eq!(count(g, OpKind::Erf), 2, "{}", print_module(&after));
    assert_eq!(outputs(g)[5], "a");
    assert_same_results(&before, &after, None);
}

#[test]
fn decompositions_on_ln_gelu_and_a_small_attention() {
    let before = parse(
        "graph @attn(%x: f32[8,16], %wq: f32[16,16], %wk: f32[16,16], %s: f32[16], %b: f32[16]) -> (f32[8,16]) {
          %n = layernorm %x, %s, %b {axis = 1} : f32[8,16]
          %q = matmul %n, %wq : f32[8,16]
          %k = matmul %n, %wk : f32[8,16]
          %kt = transpose %k {perm = [1, 0]} : f32[16,8]
          %sc = matmul %q, %kt : f32[8,8]
          %p = softmax %sc {axis = 1} : f32[8,8]
          %o = matmul %p, %q : f32[8,16]
          %g = gelu %o : f32[8,16]
          return %g
        }",
    );
    let after = run(
        "decompose-layernorm,decompose-softmax,decompose-gelu,canonicalize,cse,dce",
        &before,
    );
    let g = &after.graphs[0];
    for k in [
        OpKind::Layernorm,
        OpKind::Softmax,
        OpKind::Gelu,
        OpKind::Transpose,
    ] {
        assert_eq!(count(g, k), 0, "{k:?} left:\n{}", print_module(&after));
    }
    assert_same_results(&before, &after, None);
}

// --------------------------------------------------------------- hoist-weights

/// Checks that `g`'s body is a stable partition: weight-only ops, then the
/// rest, each in `before`'s relative order.
fn assert_partitioned(before: &Graph, g: &Graph, activations: &[&str]) {
    let mut act = vec![false; g.value_count()];
    for &p in g.params() {
        act[p.index()] = activations.contains(&g.value(p).name.as_str());
    }
    let mut seen_activation_op = false;
    for &op in &g.block(g.body()).ops {
        let d = g.op(op);
        let depends = d.operands.iter().any(|v| act[v.index()]);
        for r in &d.results {
            act[r.index()] = depends;
        }
        if depends {
            seen_activation_op = true;
        } else if !d.kind.info().is_terminator {
            assert!(
                !seen_activation_op,
                "a weight-only op after an activation op"
            );
        }
    }
    let order = |graph: &Graph, weight: bool| -> Vec<String> {
        let mut act = vec![false; graph.value_count()];
        for &p in graph.params() {
            act[p.index()] = activations.contains(&graph.value(p).name.as_str());
        }
        let mut names = Vec::new();
        for &op in &graph.block(graph.body()).ops {
            let d = graph.op(op);
            let depends = d.operands.iter().any(|v| act[v.index()]);
            for r in &d.results {
                act[r.index()] = depends;
            }
            if depends != weight && !d.results.is_empty() {
                names.push(graph.value(d.results[0]).name.clone());
            }
        }
        names
    };
    assert_eq!(order(before, true), order(g, true));
    assert_eq!(order(before, false), order(g, false));
}

const MIXED: &str = "
graph @mixed(%x: f32[4,8], %w: f32[8,8], %b: f32[8]) -> (f32[4,8]) {
  %h = matmul %x, %w : f32[4,8]
  %wt = transpose %w {perm = [1, 0]} : f32[8,8]
  %bb = broadcast %b {dims = [1]} : f32[4,8]
  %s = add %h, %bb : f32[4,8]
  %two = constant {value = 2.0} : f32[]
  %twob = broadcast %two {dims = []} : f32[8,8]
  %w2 = fused @g0(%wi = %wt, %ti = %twob) {kind = \"elementwise\"} : f32[8,8] {
    %p = mul %wi, %ti : f32[8,8]
    yield %p
  }
  %xr = fused @g1(%si = %s) {kind = \"elementwise\"} : f32[4,8] {
    %q = relu %si : f32[4,8]
    yield %q
  }
  %y = matmul %xr, %w2 : f32[4,8]
  return %y
}";

#[test]
fn hoist_weights_is_a_stable_partition() {
    let before = parse(MIXED);
    let after = run("hoist-weights", &before);
    let (b, g) = (&before.graphs[0], &after.graphs[0]);
    assert_ne!(after, before);
    assert_partitioned(b, g, &["x"]);
    let first_five: Vec<String> = g.block(g.body()).ops[..5]
        .iter()
        .map(|&o| g.value(g.op(o).results[0]).name.clone())
        .collect();
    assert_eq!(first_five, ["wt", "bb", "two", "twob", "w2"]);
    assert_same_results(&before, &after, Some(Tolerance::EXACT));
    // Idempotent.
    assert_eq!(run("hoist-weights", &after), after);
}

#[test]
fn hoist_weights_with_named_inputs() {
    let before = parse(MIXED);
    // With %w as the only activation, ops on %x and %b are the weight-only ones.
    let after = run("hoist-weights{inputs=w}", &before);
    assert_partitioned(&before.graphs[0], &after.graphs[0], &["w"]);
    assert_same_results(&before, &after, Some(Tolerance::EXACT));
    let after = run("hoist-weights{inputs=x,b}", &before);
    assert_partitioned(&before.graphs[0], &after.graphs[0], &["x", "b"]);
    let err = try_run("hoist-weights{inputs=nope}", &before).unwrap_err();
    assert!(err.contains("%nope"), "{err}");
}

// -------------------------------------------------------------- fold-constants

#[test]
fn fold_constants_folds_chains_with_the_interpreter() {
    let before = parse(
        "graph @g(%x: f32[2,3]) -> (f32[2,3], f32[3,2], i32[3], f32[2], f16[2]) {
          %two = constant {value = 2.0} : f32[]
          %twob = broadcast %two {dims = []} : f32[2,3]
          %three = constant {value = 3.0} : f32[2,3]
          %prod = mul %twob, %three : f32[2,3]
          %y = add %x, %prod : f32[2,3]
          %list = constant {value = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]} : f32[2,3]
          %t = transpose %list {perm = [1, 0]} : f32[3,2]
          %i = constant {value = [7, -7, 9]} : i32[3]
          %d = constant {value = 2} : i32[3]
          %q = div %i, %d : i32[3]
          %s = reduce_sum %list {axes = [1]} : f32[2]
          %e = exp %s : f32[2]
          %h = cast %s : f16[2]
          return %y, %t, %q, %e, %h
        }",
    );
    let after = run("fold-constants,dce", &before);
    let g = &after.graphs[0];
    assert_eq!(
        kinds(g),
        [
            OpKind::Constant,
            OpKind::Add,
            OpKind::Constant,
            OpKind::Constant,
            OpKind::Constant,
            OpKind::Constant,
            OpKind::Return
        ],
        "{}",
        print_module(&after)
    );
    let value = |name: &str| {
        let op = g
            .all_ops()
            .into_iter()
            .find(|&o| {
                g.op(o)
                    .results
                    .first()
                    .is_some_and(|&r| g.value(r).name == name)
            })
            .unwrap();
        g.op(op).attrs.get("value").cloned().unwrap()
    };
    assert_eq!(value("prod"), dcir_ir::Attr::Float(6.0));
    assert_eq!(
        value("t"),
        dcir_ir::Attr::Floats(vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0])
    );
    assert_eq!(value("q"), dcir_ir::Attr::Ints(vec![3, -3, 4]));
    assert_eq!(value("h"), dcir_ir::Attr::Floats(vec![6.0, 15.0]));
    assert_same_results(&before, &after, Some(Tolerance::EXACT));
}

#[test]
fn fold_constants_respects_max_elems_and_interpreter_errors() {
    let before = parse(
        "graph @g(%x: f32[4]) -> (f32[4], f32[64,128], i32[2], f32[3]) {
          %c = constant {value = 1.0} : f32[4]
          %a = add %x, %c : f32[4]
          %big = constant {value = 1.0} : f32[]
          %bb = broadcast %big {dims = []} : f32[64,128]
          %n = constant {value = [1, 2]} : i32[2]
          %z = constant {value = 0} : i32[2]
          %q = div %n, %z : i32[2]
          %l = constant {value = [1.0, 2.0, 3.0]} : f32[3]
          %l2 = add %l, %l : f32[3]
          return %a, %bb, %q, %l2
        }",
    );
    let after = run("fold-constants{max-elems=2}", &before);
    assert_eq!(after, before);
    let after = run("fold-constants{max-elems=8192}", &before);
    let g = &after.graphs[0];
    assert_eq!(count(g, OpKind::Broadcast), 0);
    assert_eq!(count(g, OpKind::Div), 1);
    assert_eq!(count(g, OpKind::Add), 1);
}

// --------------------------------------------------------- random graphs

/// The passes whose rewrites are exact; the others (decompositions, folding
/// a batchnorm into the weights) change rounding.
const EXACT_PASSES: &[&str] = &[
    "canonicalize",
    "cse",
    "dce",
    "fold-constants",
    "hoist-weights",
    "nhwc-inputs",
];

/// The passes that change the graph's types on purpose (its outputs are not
/// the original's); tests/filetests/passes/to-f16.dcir and to-bf16.dcir
/// check them.
const TYPE_CHANGING_PASSES: &[&str] = &["to-bf16", "to-f16"];

/// The tolerance for a pass that changes rounding (a decomposition rounds
/// every intermediate where the fused op rounds once) on a random graph,
/// whose conditioning can amplify that: ten times the f32 default, still far
/// below the O(1) error of a wrong rewrite. `None` for f16 and bf16, where a
/// random graph's cancellations swamp any tolerance; the unit tests above
/// check those dtypes on well-conditioned graphs.
fn rounding_tolerance(dtype: DType) -> Option<Tolerance> {
    match dtype {
        DType::F16 | DType::BF16 => None,
        DType::F32 => Some(Tolerance {
            rel_l2: 1e-4,
            atol: 1e-3,
            rtol: 1e-3,
        }),
        _ => Some(Tolerance::EXACT),
    }
}

/// The least precise float dtype `graph` computes in: f16 or bf16 if any of
/// its values has that type, else `output`'s dtype.
fn working_dtype(graph: &dcir_ir::Graph, output: DType) -> DType {
    graph
        .value_ids()
        .map(|v| graph.ty(v).dtype)
        .find(|d| matches!(d, DType::F16 | DType::BF16))
        .unwrap_or(output)
}

/// True when every output of `module` on `seed`'s inputs is finite and
/// moderate, so that a comparison measures the pass and not the conditioning
/// of a random graph.
fn well_conditioned(module: &Module, seed: u64) -> bool {
    module.graphs.iter().all(|g| {
        run_graph(g, &random_inputs(g, seed)).is_ok_and(|outs| {
            outs.iter()
                .all(|t| t.to_f64().iter().all(|v| v.is_finite() && v.abs() < 1e3))
        })
    })
}

/// True when `module`'s outputs on `seed`'s inputs barely move (within the
/// f32 [`rounding_tolerance`]) when every float input is scaled by
/// `1 + 1e-6`: where they move more (a `mod`, a comparison or a `sign`
/// downstream turns a rounding difference into an O(1) one), a pass that
/// only changes rounding cannot be judged by comparing results.
fn insensitive_to_rounding(module: &Module, seed: u64) -> bool {
    let tol = rounding_tolerance(DType::F32).expect("f32 has a tolerance");
    module.graphs.iter().all(|g| {
        let inputs = random_inputs(g, seed);
        let nudged: Vec<_> = inputs
            .iter()
            .map(|t| match t.dtype() {
                DType::F32 | DType::F16 | DType::BF16 => {
                    let values: Vec<f64> = t.to_f64().iter().map(|v| v * (1.0 + 1e-6)).collect();
                    dcir_interp::Tensor::from_f64(t.ty().clone(), &values).expect("same type")
                }
                _ => t.clone(),
            })
            .collect();
        match (run_graph(g, &inputs), run_graph(g, &nudged)) {
            (Ok(a), Ok(b)) => a
                .iter()
                .zip(&b)
                .all(|(x, y)| x.dtype() != DType::F32 || compare(x, y, &tol).is_ok()),
            _ => false,
        }
    })
}

proptest! {
    #![proptest_config(proptest_config())]

    /// Every built-in pass keeps the interpreter's results of random graphs:
    /// bit for bit for the exact passes, within [`rounding_tolerance`] for the
    /// others (same type only where the graph computes in f16 or bf16, or
    /// where its results are not [`insensitive_to_rounding`]).
    #[test]
    fn passes_preserve_interpreter_results(specs in arb_module_spec()) {
        let module = build_module(&specs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if !well_conditioned(&module, 7) {
            // Not a rejection: many random graphs overflow, and that is fine.
            return Ok(());
        }
        let judge_rounding = insensitive_to_rounding(&module, 7);
        for name in PassRegistry::with_builtins().names() {
            if TYPE_CHANGING_PASSES.contains(&name) {
                continue;
            }
            let after = try_run(name, &module).map_err(TestCaseError::fail)?;
            for (b, a) in module.graphs.iter().zip(&after.graphs) {
                let inputs = random_inputs(b, 7);
                let expected = run_graph(b, &inputs).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let actual = run_graph(a, &inputs)
                    .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
                for (e, x) in expected.iter().zip(&actual) {
                    // Rounding happens where the graph computes, not only in
                    // its outputs: an f16 intermediate cast to f32 rounds as f16.
                    let tol = if EXACT_PASSES.contains(&name) {
                        Some(Tolerance::EXACT)
                    } else if judge_rounding {
                        rounding_tolerance(working_dtype(b, e.dtype()))
                    } else {
                        None
                    };
                    let Some(tol) = tol else {
                        prop_assert_eq!(e.ty(), x.ty());
                        continue;
                    };
                    compare(e, x, &tol).map_err(|m| {
                        TestCaseError::fail(format!("{name} on @{}: {m}\n{}", b.name(), print_module(&after)))
                    })?;
                }
            }
        }
    }
}
