//! safetensors in and out, binding inputs by name, random inputs, comparison.

use dcir_interp::io::{bind_inputs, output_names, read_safetensors, write_safetensors};
use dcir_interp::{Mismatch, Tensor, TensorData, Tolerance, compare, random_inputs};
use dcir_ir::{DType, Graph, TensorType};
use half::{bf16, f16};

fn parse(src: &str) -> Graph {
    let module = dcir_reader::parse_module(src).expect("parses");
    dcir_ir::verify_module(&module).expect("verifies");
    module.graphs.into_iter().next().expect("one graph")
}

fn t(dtype: DType, dims: &[usize], data: TensorData) -> Tensor {
    Tensor::new(TensorType::new(dtype, dims.to_vec()), data).expect("fits")
}

fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    t(DType::F32, dims, TensorData::F32(v.to_vec()))
}

#[test]
fn safetensors_round_trip_every_dtype() {
    let tensors = vec![
        (
            "a".to_string(),
            f32s(&[2, 2], &[1.0, -2.5, f32::MIN_POSITIVE, 3e38]),
        ),
        (
            "b".to_string(),
            t(
                DType::F16,
                &[3],
                TensorData::F16(vec![f16::ONE, f16::NEG_ONE, f16::MAX]),
            ),
        ),
        (
            "c".to_string(),
            t(
                DType::BF16,
                &[1],
                TensorData::BF16(vec![bf16::from_f32(0.1)]),
            ),
        ),
        (
            "d".to_string(),
            t(DType::I32, &[2], TensorData::I32(vec![i32::MIN, 7])),
        ),
        (
            "e".to_string(),
            t(DType::I64, &[], TensorData::I64(vec![i64::MAX])),
        ),
        (
            "f".to_string(),
            t(DType::Bool, &[2, 1], TensorData::Bool(vec![true, false])),
        ),
        ("g".to_string(), f32s(&[0, 3], &[])),
    ];
    let bytes = write_safetensors(&tensors).expect("writes");
    assert_eq!(read_safetensors(&bytes).expect("reads"), tensors);
}

#[test]
fn bad_files_are_errors() {
    let err = read_safetensors(b"not a file").unwrap_err();
    assert!(
        err.to_string().starts_with("not a valid safetensors file"),
        "{err}"
    );
    // A U8 tensor: a dtype dcir does not have.
    let header = br#"{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&[1, 2]);
    let err = read_safetensors(&bytes).unwrap_err();
    assert!(
        err.to_string()
            .contains("tensor `x` has dtype U8, which dcir does not have"),
        "{err}"
    );
}

const G: &str = "graph @g(%x: f32[2,3], %w: f32[3,4]) -> (f32[2,4]) {
  %y = matmul %x, %w : f32[2,4]
  return %y
}";

#[test]
fn inputs_bind_by_name_and_the_rest_is_random() {
    let g = parse(G);
    let x = f32s(&[2, 3], &[1.0; 6]);
    let bound = bind_inputs(&g, vec![("x".to_string(), x.clone())], 9).expect("binds");
    assert_eq!(bound.inputs[0], x);
    assert_eq!(bound.random, ["w"]);
    assert_eq!(bound.inputs[1], random_inputs(&g, 9)[1]);
    assert_eq!(output_names(&g), ["y"]);
}

/// Weights of an f32 model bound to its half form (`to-f16`, `to-bf16`)
/// are converted on load, saturating as the passes do, and listed.
#[test]
fn float_tensors_convert_to_their_parameters_dtype() {
    let g = parse(&G.replace("f32", "f16"));
    let x = f32s(&[2, 3], &[1e-9, 70000.0, -1.5, 0.0, f32::INFINITY, 2.0]);
    let bound = bind_inputs(&g, vec![("x".to_string(), x)], 9).expect("binds");
    assert_eq!(bound.converted, [("x".to_string(), DType::F32, DType::F16)]);
    let got: Vec<f32> = bound.inputs[0].data().to_f32().to_vec();
    assert_eq!(
        got,
        [6.103_515_6e-5, 65504.0, -1.5, 0.0, f32::INFINITY, 2.0]
    );
    assert_eq!(bound.random, ["w"]);

    let g = parse(&G.replace("f32", "bf16"));
    let x = t(DType::F16, &[2, 3], TensorData::F16(vec![f16::ONE; 6]));
    let bound = bind_inputs(&g, vec![("x".to_string(), x)], 9).expect("binds");
    assert_eq!(
        bound.converted,
        [("x".to_string(), DType::F16, DType::BF16)]
    );
    assert_eq!(bound.inputs[0].data().to_f32().to_vec(), [1.0; 6]);
}

#[test]
fn mismatched_or_unknown_tensors_are_clear_errors() {
    let g = parse(G);
    let cases = [
        (
            vec![("w".to_string(), f32s(&[4, 3], &[0.0; 12]))],
            "tensor `w` is f32[4,3] but parameter %w of @g is f32[3,4]",
        ),
        (
            vec![(
                "x".to_string(),
                t(DType::I32, &[2, 3], TensorData::I32(vec![0; 6])),
            )],
            "tensor `x` is i32[2,3] but parameter %x of @g is f32[2,3]",
        ),
        (
            vec![(
                "x".to_string(),
                t(DType::F16, &[3, 2], TensorData::F16(vec![f16::ZERO; 6])),
            )],
            "tensor `x` is f16[3,2] but parameter %x of @g is f32[2,3]",
        ),
        (
            vec![("z".to_string(), f32s(&[1], &[0.0]))],
            "tensor `z` names no parameter of @g (its parameters: %x, %w)",
        ),
        (
            vec![
                ("x".to_string(), f32s(&[2, 3], &[0.0; 6])),
                ("x".to_string(), f32s(&[2, 3], &[0.0; 6])),
            ],
            "tensor `x` is given twice",
        ),
    ];
    for (given, message) in cases {
        assert_eq!(bind_inputs(&g, given, 0).unwrap_err().to_string(), message);
    }
}

#[test]
fn repeated_outputs_get_distinct_names() {
    let g = parse("graph @g(%x: f32[1]) -> (f32[1], f32[1], f32[1]) {\n  return %x, %x, %x\n}");
    assert_eq!(output_names(&g), ["x", "x.1", "x.2"]);
}

#[test]
fn random_inputs_follow_their_roles() {
    let g = parse(
        "graph @g(%x: f32[1,4,5,5], %w: f32[8,4,3,3], %s: f32[8], %b: f32[8], %m: f32[8], %v: f32[8], %t: bf16[16,6], %i: i32[4,2], %h: f16[300], %flag: bool[64]) -> (f32[1,8,3,3], bf16[4,2,6]) {
  %c = conv2d %x, %w : f32[1,8,3,3]
  %n = batchnorm %c, %s, %b, %m, %v : f32[1,8,3,3]
  %e = gather %t, %i : bf16[4,2,6]
  return %n, %e
}",
    );
    let inputs = random_inputs(&g, 42);
    assert_eq!(inputs, random_inputs(&g, 42), "deterministic");
    assert_ne!(inputs, random_inputs(&g, 43));
    let v = |k: usize| inputs[k].to_f64();
    let within = |k: usize, lo: f64, hi: f64| v(k).iter().all(|&a| lo <= a && a < hi);
    assert!(within(0, -1.0, 1.0));
    let a = (3.0f64 / 36.0).sqrt();
    assert!(within(1, -a, a), "conv weights scaled by fan-in");
    assert!(v(1).iter().any(|&x| x.abs() > a / 2.0));
    assert!(within(5, 0.5, 1.5), "batchnorm variance is positive");
    assert!(
        within(7, 0.0, 16.0) && v(7).iter().any(|&x| x > 7.0),
        "gather indices cover the axis"
    );
    assert!(v(8).iter().all(|&a| (-1.0..=1.0).contains(&a)));
    let flags = v(9);
    assert!(flags.contains(&0.0) && flags.contains(&1.0));
    for (k, input) in inputs.iter().enumerate() {
        assert!(
            input.to_f64().iter().any(|&x| x != 0.0),
            "input {k} is all zeros"
        );
    }
    assert_eq!(inputs[6].dtype(), DType::BF16);
    // A parameter's values depend on its name, not on its position.
    let renamed =
        parse("graph @h(%extra: f32[3], %x: f32[1,4,5,5]) -> (f32[1,4,5,5]) {\n  return %x\n}");
    assert_eq!(random_inputs(&renamed, 42)[1], inputs[0]);
}

#[test]
fn comparison_measures_and_tolerances() {
    let e = f32s(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let stats = compare(&e, &e, &Tolerance::EXACT).expect("equal");
    assert_eq!((stats.rel_l2, stats.max_abs), (0.0, 0.0));
    let a = f32s(&[4], &[1.0, 2.0, 3.0, 4.00001]);
    let stats = compare(&e, &a, &Tolerance::for_dtype(DType::F32)).expect("within f32 tolerance");
    assert_eq!(stats.max_abs_index, 3);
    assert!((stats.max_abs - 1e-5).abs() < 1e-7);
    assert!((stats.rel_l2 - stats.max_abs / 30f64.sqrt()).abs() < 1e-12);
    let far = f32s(&[4], &[1.0, 2.0, 3.1, 4.0]);
    let m = compare(&e, &far, &Tolerance::for_dtype(DType::F32)).unwrap_err();
    assert!(
        matches!(
            m,
            Mismatch::Tolerance {
                worst: Some((2, _, _)),
                ..
            }
        ),
        "{m}"
    );
    assert!(m.to_string().starts_with("out of tolerance: rel_l2"), "{m}");
    // Non-finite elements must match exactly: NaN for NaN, the same infinity.
    let nan = f32s(&[4], &[1.0, f32::NAN, f32::NEG_INFINITY, 4.0]);
    let same = compare(&nan, &nan, &Tolerance::for_dtype(DType::F32)).expect("NaN matches NaN");
    assert_eq!(same.max_abs, 0.0);
    let finite = f32s(&[4], &[1.0, 2.0, f32::NEG_INFINITY, 4.0]);
    assert!(matches!(
        compare(&nan, &finite, &Tolerance::for_dtype(DType::F32)),
        Err(Mismatch::NonFinite {
            index: 1,
            unwritten: false,
            ..
        })
    ));
    let inf = f32s(&[4], &[1.0, 2.0, f32::INFINITY, 4.0]);
    let m = compare(&e, &inf, &Tolerance::for_dtype(DType::F32)).unwrap_err();
    assert!(
        matches!(
            m,
            Mismatch::NonFinite {
                index: 2,
                unwritten: false,
                ..
            }
        ),
        "{m}"
    );
    assert_eq!(m.to_string(), "element 2: expected 3, got inf");
    let opposite = f32s(&[4], &[1.0, f32::NAN, f32::INFINITY, 4.0]);
    assert!(compare(&nan, &opposite, &Tolerance::for_dtype(DType::F32)).is_err());
    // The runtime's poison (every bit set) never matches, even an expected NaN.
    let poison = f32::from_bits(u32::MAX);
    let unwritten = f32s(&[4], &[1.0, poison, f32::NEG_INFINITY, 4.0]);
    let m = compare(&nan, &unwritten, &Tolerance::for_dtype(DType::F32)).unwrap_err();
    assert!(
        matches!(
            m,
            Mismatch::NonFinite {
                index: 1,
                unwritten: true,
                ..
            }
        ),
        "{m}"
    );
    assert!(
        m.to_string()
            .ends_with("(the poison pattern: no kernel wrote it)"),
        "{m}"
    );
    let other = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    assert!(matches!(
        compare(&e, &other, &Tolerance::EXACT),
        Err(Mismatch::Type { .. })
    ));
    let ints = t(DType::I32, &[2], TensorData::I32(vec![1, 2]));
    let off = t(DType::I32, &[2], TensorData::I32(vec![1, 3]));
    assert!(compare(&ints, &off, &Tolerance::for_dtype(DType::I32)).is_err());
    for dtype in [DType::F16, DType::BF16] {
        let tol = Tolerance::for_dtype(dtype);
        assert!(tol.rel_l2 > Tolerance::for_dtype(DType::F32).rel_l2);
    }
}

#[test]
fn the_absolute_bound_scales_with_the_expected_tensor() {
    // Logits of rms ~50: an element near 0 off by 0.2 is rounding at that
    // scale (f16: 1e-2 * 50 = 0.5), one off by 5 is a wrong element.
    let mut values: Vec<f32> = (0..100)
        .map(|i| if i % 2 == 0 { 50.0 } else { -50.0 })
        .collect();
    values[7] = 0.0;
    let e = f32s(&[100], &values);
    let f16 = Tolerance::for_dtype(DType::F16);
    let mut near = values.clone();
    near[7] = 0.2;
    let stats = compare(&e, &f32s(&[100], &near), &f16).expect("rounding at the tensor's scale");
    assert!((stats.rms - 50.0 * (99f64 / 100.0).sqrt()).abs() < 1e-9);
    let mut wrong = values.clone();
    wrong[7] = 5.0;
    let m = compare(&e, &f32s(&[100], &wrong), &f16).unwrap_err();
    assert!(m.to_string().contains("max(1, rms 4.975e1)"), "{m}");
    // Below a scale of 1 the bound is the plain atol: 0.05 off 0 fails in
    // f16 whatever the tensor's rms.
    let small = f32s(&[2], &[0.0, 0.5]);
    assert!(compare(&small, &f32s(&[2], &[0.05, 0.5]), &f16).is_err());
}

/// An f16 reference's own noise: the distance from the graph computed in f32,
/// which widens the f16 bound once it passes half of it.
#[test]
fn an_f16_reference_is_measured_against_the_graph_in_f32() {
    let f16_graph = parse(
        "graph @g(%x: f16[64]) -> (f16[64]) {\n  %e = exp %x : f16[64]\n  %y = mul %e, %e : f16[64]\n  return %y\n}\n",
    );
    let inputs = random_inputs(&f16_graph, 3);
    let low = dcir_interp::run_graph(&f16_graph, &inputs).expect("runs");
    let exact = dcir_interp::f32_reference(&f16_graph, &inputs)
        .expect("the graph has f16 values")
        .expect("runs");
    assert_eq!(exact[0].dtype(), DType::F32);
    let noise = dcir_interp::rel_l2(&exact[0], &low[0]);
    assert!(noise > 0.0 && noise < 1e-3, "{noise}");
    let f32_graph =
        parse("graph @g(%x: f32[4]) -> (f32[4]) {\n  %y = exp %x : f32[4]\n  return %y\n}\n");
    assert!(dcir_interp::f32_reference(&f32_graph, &random_inputs(&f32_graph, 0)).is_none());
    // Twice the noise, never tighter than the default; exact stays exact.
    let f16 = Tolerance::for_dtype(DType::F16);
    assert_eq!(f16.widened(1e-4), f16);
    let wide = f16.widened(2.5e-3);
    assert!((wide.rel_l2 - 5e-3).abs() < 1e-12 && (wide.atol - 2.5e-2).abs() < 1e-12);
    assert_eq!(Tolerance::EXACT.widened(0.5), Tolerance::EXACT);
}

/// Roles follow arithmetic that keeps them, so a rewrite that keeps a
/// graph's meaning keeps every parameter's values; `RandomBy::Type` drops
/// the role.
#[test]
fn random_roles_see_through_arithmetic_and_can_be_dropped() {
    use dcir_interp::RandomBy;
    use dcir_interp::io::bind_inputs_by;
    // %v reaches log through `add`, %w a matmul through `mul` by a
    // same-typed factor, %k through a broadcast that spreads a vector
    // (no weight), %g through a gelu, %p through a batch broadcast.
    let g = parse(
        "graph @g(%x: f32[2,16], %v: f32[16], %w: f32[16,4], %k: f32[16], %g: f32[16], %p: f32[16,4]) -> (f32[16], f32[2,4], f32[16], f32[3,2,4]) {
  %c = constant {value = 0.25} : f32[16]
  %s = add %v, %c : f32[16]
  %l = log %s : f32[16]
  %kb = broadcast %k {dims = [0]} : f32[16,4]
  %wk = mul %w, %kb : f32[16,4]
  %y = matmul %x, %wk : f32[2,4]
  %e = gelu %g : f32[16]
  %r = sqrt %e : f32[16]
  %pb = broadcast %p {dims = [1, 2]} : f32[3,16,4]
  %x3 = broadcast %x {dims = [1, 2]} : f32[3,2,16]
  %z = matmul %x3, %pb : f32[3,2,4]
  return %l, %y, %r, %z
}",
    );
    let inputs = random_inputs(&g, 5);
    let v = |k: usize| inputs[k].to_f64();
    let within = |k: usize, lo: f64, hi: f64| v(k).iter().all(|&a| lo <= a && a < hi);
    let a = (3.0f64 / 16.0).sqrt();
    assert!(within(1, 0.5, 1.5), "log(v + c): v positive");
    assert!(within(2, -a, a), "matmul(x, w * k): w a weight");
    assert!(
        v(3).iter().any(|&x| x.abs() > a),
        "a spread vector is no weight"
    );
    assert!(within(4, 0.5, 1.5), "sqrt(gelu(g)): g positive");
    assert!(within(5, -a, a), "a batch broadcast keeps the weight");
    let by_type = bind_inputs_by(&g, Vec::new(), 5, RandomBy::Type).unwrap();
    for (k, t) in by_type.inputs.iter().enumerate() {
        assert!(t.to_f64().iter().all(|&x| (-1.0..1.0).contains(&x)));
        assert!(t.to_f64().iter().any(|&x| x < 0.0), "input {k} is signed");
    }
    // By type, a parameter's values are those of the same name and type in
    // any other graph.
    let other =
        parse("graph @h(%v: f32[16]) -> (f32[16]) {\n  %e = exp %v : f32[16]\n  return %e\n}");
    let alone = bind_inputs_by(&other, Vec::new(), 5, RandomBy::Type).unwrap();
    assert_eq!(alone.inputs[0], by_type.inputs[1]);
    assert_eq!(random_inputs(&other, 5)[0], by_type.inputs[1]);
}
