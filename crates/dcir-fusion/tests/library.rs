//! The cuBLASLt recognizer and its price: which groups a library call runs
//! (with the reason for those it does not), what the call reads, and when
//! the cost model prefers it to a kernel of ours.

use std::sync::Arc;

use dcir_fusion::library::{Activation, LibraryProbe, Probe, gemm_call};
use dcir_fusion::{
    CostModel, DeviceSpec, Estimator, Group, GroupKind, Level, Libraries, LibraryVerdict, Reason,
};
use dcir_ir::{Attr, Graph, OpId, ValueId, verify_module};

fn graph(text: &str) -> Graph {
    let module = dcir_reader::parse_module(text).expect("reads");
    verify_module(&module).expect("verifies");
    module.graphs.into_iter().next().expect("one graph")
}

/// The body ops of `g` but the return, and the values the return reads.
fn whole(g: &Graph) -> (Vec<OpId>, Vec<ValueId>) {
    let body = &g.block(g.body()).ops;
    let (ret, ops) = body.split_last().expect("a return");
    (ops.to_vec(), g.op(*ret).operands.clone())
}

fn value(g: &Graph, name: &str) -> ValueId {
    g.value_ids()
        .find(|&v| g.value(v).name == name)
        .unwrap_or_else(|| panic!("no value {name}"))
}

fn linear(dtype: &str, m: usize, epilogue: &str) -> String {
    format!(
        "graph @linear(%x: {dtype}[{m},768], %w: {dtype}[768,3072], %b: {dtype}[3072], %r: {dtype}[{m},3072]) -> ({dtype}[{m},3072]) {{\n\
         \x20 %h = matmul %x, %w : {dtype}[{m},3072]\n\
         \x20 %bb = broadcast %b {{dims = [1]}} : {dtype}[{m},3072]\n\
         \x20 %a = add %h, %bb : {dtype}[{m},3072]\n\
         {epilogue}\
         }}\n"
    )
}

#[test]
fn bias_residual_and_activations_are_one_call() {
    let g = graph(&linear(
        "f16",
        128,
        "  %c = add %r, %a : f16[128,3072]\n  %y = relu %c : f16[128,3072]\n  return %y\n",
    ));
    let (ops, outputs) = whole(&g);
    let call = gemm_call(&g, &ops, &outputs).expect("one call");
    assert_eq!((call.batch, call.m, call.n, call.k), (1, 128, 3072, 768));
    assert_eq!(call.a, value(&g, "x"));
    assert_eq!(call.b, value(&g, "w"));
    assert_eq!(call.bias, Some(value(&g, "b")));
    assert_eq!(call.c, Some(value(&g, "r")));
    assert_eq!(call.activation, Activation::Relu);
    assert_eq!(call.epilogue(), "add + bias + relu");

    let tanh = graph(&linear(
        "bf16",
        64,
        "  %y = gelu %a {approximate = \"tanh\"} : bf16[64,3072]\n  return %y\n",
    ));
    let (ops, outputs) = whole(&tanh);
    assert_eq!(
        gemm_call(&tanh, &ops, &outputs).unwrap().activation,
        Activation::GeluTanh
    );
}

/// Each form cuBLASLt's epilogue cannot express is refused with its reason.
#[test]
fn what_cublaslt_cannot_run_is_refused_with_the_reason() {
    let refused = |epilogue: &str, says: &str| {
        let g = graph(&linear("f16", 128, epilogue));
        let (ops, outputs) = whole(&g);
        let why = gemm_call(&g, &ops, &outputs).expect_err(says).to_string();
        assert!(why.contains(says), "{says}: {why}");
    };
    refused(
        "  %y = gelu %a : f16[128,3072]\n  return %y\n",
        "tanh form; this one is exact",
    );
    refused(
        "  %y0 = relu %a : f16[128,3072]\n  %y = add %y0, %r : f16[128,3072]\n  return %y\n",
        "cuBLASLt's epilogue: bias, add, then relu",
    );
    refused(
        "  %y = mul %a, %r : f16[128,3072]\n  return %y\n",
        "cuBLASLt's epilogue",
    );
    let g = graph(
        "graph @g(%x: f16[16,32], %w: f16[32,8]) -> (f16[16,8], f16[16,8]) {\n\
         \x20 %h = matmul %x, %w : f16[16,8]\n\
         \x20 %y = relu %h : f16[16,8]\n\
         \x20 return %y, %h\n}\n",
    );
    let (ops, outputs) = whole(&g);
    let why = gemm_call(&g, &ops, &outputs).unwrap_err().to_string();
    assert!(why.contains("intermediate value is used outside"), "{why}");
    // f32 output of f16 operands (the GEMM keeps f16 elements).
    let g = graph(
        "graph @g(%x: f16[16,32], %w: f16[32,8]) -> (f32[16,8]) {\n\
         \x20 %h = matmul %x, %w : f16[16,8]\n\
         \x20 %y = cast %h : f32[16,8]\n\
         \x20 return %y\n}\n",
    );
    let (ops, outputs) = whole(&g);
    assert!(matches!(
        gemm_call(&g, &ops, &outputs),
        Err(Reason::Op { .. })
    ));
    // An operand transposed by an op, not by the matmul's flag.
    let g = graph(
        "graph @g(%x: f16[32,16], %w: f16[32,8]) -> (f16[16,8]) {\n\
         \x20 %xt = transpose %x {perm = [1, 0]} : f16[16,32]\n\
         \x20 %y = matmul %xt, %w : f16[16,8]\n\
         \x20 return %y\n}\n",
    );
    let (ops, outputs) = whole(&g);
    let why = gemm_call(&g, &ops, &outputs).unwrap_err().to_string();
    assert!(why.contains("operands as stored"), "{why}");
    // Integers.
    let g = graph(
        "graph @g(%x: i32[4,4], %w: i32[4,4]) -> (i32[4,4]) {\n\
         \x20 %y = matmul %x, %w : i32[4,4]\n\
         \x20 return %y\n}\n",
    );
    let (ops, outputs) = whole(&g);
    assert!(matches!(
        gemm_call(&g, &ops, &outputs),
        Err(Reason::DType { .. })
    ));
}

/// Reshapes are the same bytes: read through on the operands and kept on
/// the chain while the last dim stays the output's columns.
#[test]
fn reshapes_are_read_through() {
    let g = graph(
        "graph @g(%x: f16[2,64,768], %w: f16[768,768], %b: f16[768], %r: f16[2,64,768]) -> (f16[2,64,768]) {\n\
         \x20 %x2 = reshape %x : f16[128,768]\n\
         \x20 %h = matmul %x2, %w : f16[128,768]\n\
         \x20 %bb = broadcast %b {dims = [1]} : f16[128,768]\n\
         \x20 %a = add %h, %bb : f16[128,768]\n\
         \x20 %a3 = reshape %a : f16[2,64,768]\n\
         \x20 %y = add %a3, %r : f16[2,64,768]\n\
         \x20 return %y\n}\n",
    );
    let (ops, outputs) = whole(&g);
    let call = gemm_call(&g, &ops, &outputs).expect("one call");
    assert_eq!(call.a, value(&g, "x"));
    assert_eq!(call.c, Some(value(&g, "r")));
    assert_eq!(call.output, value(&g, "y"));
}

fn group_of(g: &Graph) -> Group {
    let (ops, _) = whole(g);
    Group {
        ops,
        kind: GroupKind::Gemm,
        level: Level::Register,
    }
}

fn library_param(e: &dcir_fusion::Estimate) -> Option<&str> {
    e.params.get("library").and_then(Attr::as_str)
}

/// A large f16 GEMM goes to cuBLASLt where our kernels are `mma.sync` (about
/// half of what its `wgmma` kernels do: the H200's figures without Hopper's
/// mainloop, whose kernels are priced at the library's speed and win the near
/// tie); the library is a candidate either way, and `kernels_only` never
/// offers it.
#[test]
fn the_cost_model_prices_the_library_call() {
    let g = graph(&linear("f16", 4096, "  return %a\n"));
    let no_wgmma = DeviceSpec {
        compute_capability: 80,
        ..DeviceSpec::h200()
    };
    let model = CostModel::new(no_wgmma.clone());
    let e = model.estimate(&g, &group_of(&g)).unwrap();
    assert_eq!(library_param(&e), Some("cublaslt"));
    // 19.3 GFLOP at cuBLASLt's fitted 49 % of 759.5 TFLOP/s, plus the launch.
    let flops = 2.0 * 4096.0 * 3072.0 * 768.0;
    let roofline = flops / (0.49 * 759.5e12) + 2e-6;
    assert!((e.time / roofline - 1.0).abs() < 1e-9, "{}", e.time);
    assert!(e.candidates.len() > 1);

    let own = CostModel::kernels_only(no_wgmma)
        .estimate(&g, &group_of(&g))
        .unwrap();
    assert_eq!(library_param(&own), None);
    assert!(own.candidates.iter().all(|c| c.get("library").is_none()));
    assert!(own.time > e.time);

    // A tiny GEMM: a kernel of ours fused with its epilogue is estimated
    // no slower, and the library stays a candidate for measurement.
    let small = graph(&linear("f16", 1, "  return %a\n"));
    let e = model.estimate(&small, &group_of(&small)).unwrap();
    assert!(e.candidates.iter().any(|c| {
        c.get("library")
            .is_some_and(|a| a.as_str() == Some("cublaslt"))
    }));
}

/// A probe standing in for a machine's cuBLASLt that refuses every call.
struct RefusesAll;

impl LibraryProbe for RefusesAll {
    fn gemm(&self, _: &Graph, call: &dcir_fusion::GemmCall) -> Result<(), String> {
        Err(format!("no algorithm for {}x{}x{}", call.m, call.n, call.k))
    }
    fn conv(&self, _: &Graph, _: &dcir_fusion::library::ConvCall) -> Result<(), String> {
        Err("no algorithm".into())
    }
}

/// A call the machine's library refuses is no candidate: the group runs a
/// kernel of ours, and the estimate says why the library does not run it.
#[test]
fn a_call_the_probe_refuses_is_a_lost_candidate_with_its_reason() {
    let g = graph(&linear("f16", 4096, "  return %a\n"));
    let model = CostModel {
        libraries: Libraries {
            probe: Some(Probe(Arc::new(RefusesAll))),
            ..Libraries::ALL
        },
        ..CostModel::new(DeviceSpec::h200())
    };
    let e = model.estimate(&g, &group_of(&g)).unwrap();
    assert_eq!(library_param(&e), None);
    assert!(e.candidates.iter().all(|c| c.get("library").is_none()));
    match &e.library {
        Some(LibraryVerdict::Refused { library, reason }) => {
            assert_eq!(*library, "cublaslt");
            assert_eq!(
                reason.to_string(),
                "cuBLASLt refuses the call on this machine: no algorithm for 4096x3072x768"
            );
        }
        other => panic!("{other:?}"),
    }
}

fn conv_block(pad: &str, epilogue: &str) -> String {
    format!(
        "graph @conv(%x: f16[2,16,20,20], %w: f16[32,16,3,3], %b: f16[32], %r: f16[2,32,20,20]) -> (f16[2,32,20,20]) {{\n\
         \x20 %c = conv2d %x, %w {{pad = {pad}}} : f16[2,32,20,20]\n\
         {epilogue}\
         }}\n"
    )
}

/// cuDNN's form: a bias along the channels, an added tensor, ReLU; equal
/// padding on opposite sides; the fused call needs the bias.
#[test]
fn cudnn_runs_a_convolution_with_its_epilogue() {
    use dcir_fusion::library::conv_call;
    let g = graph(&conv_block(
        "[1, 1, 1, 1]",
        "  %bb = broadcast %b {dims = [1]} : f16[2,32,20,20]\n  %a = add %c, %bb : f16[2,32,20,20]\n  %s = add %a, %r : f16[2,32,20,20]\n  %y = relu %s : f16[2,32,20,20]\n  return %y\n",
    ));
    let (ops, outputs) = whole(&g);
    let call = conv_call(&g, &ops, &outputs).expect("one call");
    assert_eq!((call.input, call.filter), ([2, 16, 20, 20], [32, 16, 3, 3]));
    assert_eq!((call.pad, call.stride, call.groups), ([1, 1], [1, 1], 1));
    assert_eq!(call.bias, Some(value(&g, "b")));
    assert_eq!(call.z, Some(value(&g, "r")));
    assert_eq!(call.activation, Activation::Relu);

    let refused = |pad: &str, epilogue: &str, says: &str| {
        let g = graph(&conv_block(pad, epilogue));
        let (ops, outputs) = whole(&g);
        let why = conv_call(&g, &ops, &outputs).expect_err(says).to_string();
        assert!(why.contains(says), "{says}: {why}");
    };
    refused(
        "[1, 1, 1, 1]",
        "  %y = relu %c : f16[2,32,20,20]\n  return %y\n",
        "needs a bias",
    );
    refused(
        "[1, 1, 1, 1]",
        "  %y = sigmoid %c : f16[2,32,20,20]\n  return %y\n",
        "cuDNN's epilogue: bias, add, then relu",
    );
    let g = graph(
        "graph @g(%x: f16[1,4,8,8], %w: f16[4,4,3,3]) -> (f16[1,4,7,7]) {\n\
         \x20 %y = conv2d %x, %w {pad = [1, 1, 0, 0]} : f16[1,4,7,7]\n\
         \x20 return %y\n}\n",
    );
    let (ops, outputs) = whole(&g);
    let why = conv_call(&g, &ops, &outputs).unwrap_err().to_string();
    assert!(why.contains("pads both sides alike"), "{why}");
}

/// A convolution reading an NHWC tensor through the `channels-last` pass's
/// transpose, its result transposed back to NHWC first, is an NHWC call:
/// the bias runs along the last dim, and the rows reshape may follow.
#[test]
fn cudnn_runs_a_channels_last_convolution() {
    use dcir_fusion::library::conv_call;
    let text = "graph @conv(%xn: f16[2,20,20,16], %w: f16[32,16,3,3], %b: f16[32], %r: f16[2,20,20,32]) -> (f16[800,32]) {\n\
                \x20 %x = transpose %xn {perm = [0, 3, 1, 2]} : f16[2,16,20,20]\n\
                \x20 %c = conv2d %x, %w {pad = [1, 1, 1, 1]} : f16[2,32,20,20]\n\
                \x20 %cn = transpose %c {perm = [0, 2, 3, 1]} : f16[2,20,20,32]\n\
                \x20 %bb = broadcast %b {dims = [3]} : f16[2,20,20,32]\n\
                \x20 %a = add %cn, %bb : f16[2,20,20,32]\n\
                \x20 %s = add %a, %r : f16[2,20,20,32]\n\
                \x20 %y = relu %s : f16[2,20,20,32]\n\
                \x20 %rows = reshape %y : f16[800,32]\n\
                \x20 return %rows\n}\n";
    let g = graph(text);
    let (ops, outputs) = whole(&g);
    let call = conv_call(&g, &ops, &outputs).expect("one NHWC call");
    assert!(call.nhwc);
    assert_eq!(call.x, value(&g, "xn"));
    assert_eq!((call.input, call.out), ([2, 16, 20, 20], [2, 32, 20, 20]));
    assert_eq!(call.bias, Some(value(&g, "b")));
    assert_eq!(call.z, Some(value(&g, "r")));
    assert_eq!(call.activation, Activation::Relu);
    assert_eq!(call.output, value(&g, "rows"));

    // An NHWC input whose result stays NCHW is no call.
    let text = "graph @conv(%xn: f16[2,20,20,16], %w: f16[32,16,3,3]) -> (f16[2,32,20,20]) {\n\
                \x20 %x = transpose %xn {perm = [0, 3, 1, 2]} : f16[2,16,20,20]\n\
                \x20 %c = conv2d %x, %w {pad = [1, 1, 1, 1]} : f16[2,32,20,20]\n\
                \x20 return %c\n}\n";
    let g = graph(text);
    let (ops, outputs) = whole(&g);
    let why = conv_call(&g, &ops, &outputs)
        .expect_err("refused")
        .to_string();
    assert!(why.contains("NHWC"), "{why}");
}

/// ViT's attention input projection at batch 32: the layernorm's result
/// transposed to sequence-first, then one matmul over all tokens.
const SEQUENCE_FIRST_PROJECTION: &str = "graph @proj(%x: f16[32,197,768], %g: f16[768], %b: f16[768], %w: f16[768,2304]) -> (f16[6304,2304]) {
  %n = layernorm %x, %g, %b {axis = 2} : f16[32,197,768]
  %t = transpose %n {perm = [1, 0, 2]} : f16[197,32,768]
  %r = reshape %t : f16[6304,768]
  %y = matmul %r, %w : f16[6304,2304]
  return %y
}
";

#[test]
fn a_view_another_group_stores_is_read_by_a_library_call() {
    let g = graph(SEQUENCE_FIRST_PROJECTION);
    // The H100's figures without Hopper's mainloop, whose kernel would tie
    // cuBLASLt and keep the projection.
    let device = DeviceSpec {
        compute_capability: 80,
        ..DeviceSpec::h100()
    };
    let plan = dcir_fusion::plan_graph(&g, &CostModel::new(device), &dcir_fusion::AnyGroup)
        .expect("plans");
    let kinds: Vec<(String, Option<&str>)> = plan
        .groups
        .iter()
        .map(|p| {
            let ops: Vec<&str> = p.group.ops.iter().map(|&o| g.op(o).kind.name()).collect();
            (ops.join("+"), library_param(&p.estimate))
        })
        .collect();
    // The transpose is stored by another group (here the layernorm's, which
    // writes its rows sequence-first; the reshape goes with either side), so
    // the matmul reads stored rows and cuBLASLt runs it.
    assert!(
        kinds.iter().any(|(ops, library)| ops.contains("matmul")
            && !ops.contains("transpose")
            && *library == Some("cublaslt"))
            && kinds
                .iter()
                .any(|(ops, _)| ops.contains("transpose") && !ops.contains("matmul")),
        "{kinds:?}"
    );
    // The library group copies no view into its region; the result is
    // exactly the original graph's.
    let fused = dcir_fusion::apply_plan(&g, &plan).expect("applies");
    for &op in &fused.block(fused.body()).ops {
        let d = fused.op(op);
        if d.attrs.str("library").is_some() {
            let region = d.region.expect("a region");
            let inside: Vec<&str> = fused
                .block(region)
                .ops
                .iter()
                .map(|&o| fused.op(o).kind.name())
                .collect();
            assert!(!inside.contains(&"transpose"), "{inside:?}");
        }
    }
    let inputs = dcir_interp::random_inputs(&g, 7);
    let want = dcir_interp::run_graph(&g, &inputs).expect("runs");
    let got = dcir_interp::run_graph(&fused, &inputs).expect("the fused graph runs");
    assert_eq!(want[0].to_f64(), got[0].to_f64());
}
