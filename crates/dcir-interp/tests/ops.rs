//! Each op against a naive reference loop written here (independent code),
//! at awkward sizes (3, 17, 783), for floats, integers and the half types.

use dcir_interp::{Tensor, TensorData, eval_op};
use dcir_ir::{Attr, Attrs, DType, OpKind, TensorType, shape::infer_types};
use half::{bf16, f16};

/// A 64-bit LCG (Knuth's MMIX constants): test data independent of the crate's PRNG.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

fn ty(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims.to_vec())
}

fn tensor(dtype: DType, dims: &[usize], values: &[f64]) -> Tensor {
    Tensor::from_f64(ty(dtype, dims), values).expect("values fit")
}

fn random(dims: &[usize], seed: u64) -> Tensor {
    let mut rng = Lcg(seed);
    let n: usize = dims.iter().product();
    let values: Vec<f64> = (0..n).map(|_| rng.next()).collect();
    tensor(DType::F32, dims, &values)
}

fn attrs(kind: OpKind, pairs: &[(&'static str, Attr)]) -> Attrs {
    let raw: Attrs = pairs.iter().cloned().collect();
    kind.normalize_attrs(raw).expect("valid attributes")
}

/// Evaluates an op whose result type is inferred.
fn run(kind: OpKind, pairs: &[(&'static str, Attr)], operands: &[&Tensor]) -> Tensor {
    let a = attrs(kind, pairs);
    let types: Vec<&TensorType> = operands.iter().map(|t| t.ty()).collect();
    let result = infer_types(kind, &a, &types).expect("well typed");
    eval_op(kind, &a, operands, &result)
        .expect("evaluates")
        .remove(0)
}

/// Evaluates an op whose result type is declared.
fn run_as(
    kind: OpKind,
    pairs: &[(&'static str, Attr)],
    operands: &[&Tensor],
    result: TensorType,
) -> Tensor {
    eval_op(kind, &attrs(kind, pairs), operands, &[result])
        .expect("evaluates")
        .remove(0)
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_f64()
}

/// Every element within `rel` of the reference, relative to the reference's largest magnitude.
fn assert_close(actual: &[f64], expected: &[f64], rel: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    let scale = expected.iter().fold(1e-30f64, |m, x| m.max(x.abs()));
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (a - e).abs() <= rel * scale,
            "{what}: element {i}: {a} vs {e}"
        );
    }
}

fn f32_bits(t: &Tensor) -> Vec<u32> {
    match t.data() {
        TensorData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        other => panic!("not f32: {:?}", other.dtype()),
    }
}

/// An op and the f32 operation it must be.
type BinaryCase = (OpKind, fn(f32, f32) -> f32);

#[test]
fn binary_float_ops_are_the_f32_operations() {
    let (a, b) = (random(&[783], 1), random(&[783], 2));
    let (x, y) = (a.to_f32().into_owned(), b.to_f32().into_owned());
    let cases: [BinaryCase; 6] = [
        (OpKind::Add, |x, y| x + y),
        (OpKind::Sub, |x, y| x - y),
        (OpKind::Mul, |x, y| x * y),
        (OpKind::Div, |x, y| x / y),
        (OpKind::Max, f32::max),
        (OpKind::Min, f32::min),
    ];
    for (kind, f) in cases {
        let out = run(kind, &[], &[&a, &b]);
        let expected: Vec<u32> = x.iter().zip(&y).map(|(&p, &q)| f(p, q).to_bits()).collect();
        assert_eq!(f32_bits(&out), expected, "{kind:?}");
    }
    let base = tensor(DType::F32, &[3], &[2.0, 0.5, 9.0]);
    let exp = tensor(DType::F32, &[3], &[10.0, -2.0, 0.5]);
    assert_eq!(
        values(&run(OpKind::Pow, &[], &[&base, &exp])),
        [1024.0, 4.0, 3.0]
    );
}

/// erf by its Maclaurin series, fine in f64 for |x| <= 3.
fn erf_series(x: f64) -> f64 {
    let (mut sum, mut term, mut n) = (0.0, x, 0.0);
    while term.abs() > 1e-17 || n < 5.0 {
        sum += term / (2.0 * n + 1.0);
        n += 1.0;
        term *= -x * x / n;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn unary_float_ops_match_their_formulas() {
    let x = random(&[783], 3);
    let v = values(&x);
    let check = |kind: OpKind, pairs: &[(&'static str, Attr)], f: &dyn Fn(f64) -> f64| {
        let out = values(&run(kind, pairs, &[&x]));
        let expected: Vec<f64> = v.iter().map(|&a| f(a)).collect();
        assert_close(&out, &expected, 1e-6, kind.name());
    };
    check(OpKind::Relu, &[], &|a| a.max(0.0));
    check(OpKind::Neg, &[], &|a| -a);
    check(OpKind::Abs, &[], &|a| a.abs());
    check(
        OpKind::Clip,
        &[("min", Attr::Float(-0.25)), ("max", Attr::Float(0.5))],
        &|a| a.clamp(-0.25, 0.5),
    );
    check(OpKind::Erf, &[], &erf_series);
    check(OpKind::Tanh, &[], &|a| {
        (a.exp() - (-a).exp()) / (a.exp() + (-a).exp())
    });
    check(OpKind::Sigmoid, &[], &|a| 1.0 / (1.0 + (-a).exp()));
    check(OpKind::Exp, &[], &|a| a.exp());
    check(OpKind::Gelu, &[], &|a| {
        0.5 * a * (1.0 + erf_series(a / 2f64.sqrt()))
    });
    let positive = tensor(DType::F32, &[3], &[0.25, 4.0, 17.0]);
    assert_close(
        &values(&run(OpKind::Sqrt, &[], &[&positive])),
        &[0.5, 2.0, 17f64.sqrt()],
        1e-7,
        "sqrt",
    );
    assert_close(
        &values(&run(OpKind::Rsqrt, &[], &[&positive])),
        &[2.0, 0.5, 1.0 / 17f64.sqrt()],
        1e-7,
        "rsqrt",
    );
    assert_close(
        &values(&run(OpKind::Log, &[], &[&positive])),
        &[0.25f64.ln(), 4f64.ln(), 17f64.ln()],
        1e-7,
        "log",
    );
}

#[test]
fn ieee_special_values_and_nan_propagation() {
    let x = tensor(DType::F32, &[3], &[f64::NAN, -1.0, 0.0]);
    let one = tensor(DType::F32, &[3], &[1.0, 1.0, 1.0]);
    let zero = tensor(DType::F32, &[3], &[0.0, 0.0, 0.0]);
    assert!(values(&run(OpKind::Max, &[], &[&x, &one]))[0].is_nan());
    assert!(values(&run(OpKind::Min, &[], &[&one, &x]))[0].is_nan());
    assert!(values(&run(OpKind::Relu, &[], &[&x]))[0].is_nan());
    let clipped = run(
        OpKind::Clip,
        &[("min", Attr::Float(0.0)), ("max", Attr::Float(1.0))],
        &[&x],
    );
    assert!(values(&clipped)[0].is_nan());
    let logs = values(&run(OpKind::Log, &[], &[&x]));
    assert!(logs[1].is_nan() && logs[2] == f64::NEG_INFINITY);
    let q = values(&run(OpKind::Div, &[], &[&one, &zero]));
    assert_eq!(q[0], f64::INFINITY);
    let m = run(OpKind::ReduceMax, &[("axes", ints(&[0]))], &[&x]);
    assert!(values(&m)[0].is_nan());
}

#[test]
fn integer_elementwise_wraps_and_truncates() {
    let a = tensor(DType::I32, &[4], &[2147483647.0, -7.0, 7.0, -2147483648.0]);
    let b = tensor(DType::I32, &[4], &[1.0, 2.0, -2.0, -1.0]);
    assert_eq!(
        values(&run(OpKind::Add, &[], &[&a, &b])),
        [-2147483648.0, -5.0, 5.0, 2147483647.0]
    );
    assert_eq!(
        values(&run(OpKind::Div, &[], &[&a, &b])),
        [2147483647.0, -3.0, -3.0, -2147483648.0]
    );
    assert_eq!(
        values(&run(OpKind::Mul, &[], &[&a, &b])),
        [2147483647.0, -14.0, -14.0, -2147483648.0]
    );
    assert_eq!(
        values(&run(OpKind::Max, &[], &[&a, &b])),
        [2147483647.0, 2.0, 7.0, -1.0]
    );
    assert_eq!(
        values(&run(OpKind::Neg, &[], &[&a])),
        [-2147483647.0, 7.0, -7.0, -2147483648.0]
    );
    assert_eq!(values(&run(OpKind::Abs, &[], &[&b])), [1.0, 2.0, 2.0, 1.0]);
    assert_eq!(values(&run(OpKind::Relu, &[], &[&b])), [1.0, 2.0, 0.0, 0.0]);
    let clip = [("min", Attr::Float(-1.5)), ("max", Attr::Float(2.5))];
    assert_eq!(
        values(&run(OpKind::Clip, &clip, &[&a])),
        [2.0, -1.0, 2.0, -1.0]
    );
    let big = tensor(DType::I64, &[2], &[9.0e15, -3.0]);
    let two = tensor(DType::I64, &[2], &[2.0, 2.0]);
    assert_eq!(
        values(&run(OpKind::Sub, &[], &[&big, &two])),
        [9.0e15 - 2.0, -5.0]
    );

    let zero = tensor(DType::I32, &[4], &[1.0, 1.0, 0.0, 1.0]);
    let a_attrs = Attrs::new();
    let err = eval_op(OpKind::Div, &a_attrs, &[&a, &zero], &[a.ty().clone()]).unwrap_err();
    assert!(
        err.to_string()
            .contains("division by zero (divisor element 2)"),
        "{err}"
    );
}

/// Element (i, j) of a `rows × cols` matrix stored row-major, or stored transposed.
fn at(m: &[f64], rows: usize, cols: usize, transposed: bool, i: usize, j: usize) -> f64 {
    if transposed {
        m[j * rows + i]
    } else {
        m[i * cols + j]
    }
}

#[test]
fn matmul_with_every_transpose_at_awkward_sizes() {
    for (batch, m, k, n) in [
        (vec![], 3, 17, 5),
        (vec![], 17, 783, 3),
        (vec![2, 3], 3, 17, 1),
        (vec![], 1, 1, 1),
    ] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let dims = |r: usize, c: usize, t: bool| {
                let mut d = batch.clone();
                d.extend(if t { [c, r] } else { [r, c] });
                d
            };
            let a = random(&dims(m, k, ta), 11);
            let b = random(&dims(k, n, tb), 12);
            let out = run(
                OpKind::Matmul,
                &[
                    ("transpose_a", Attr::Bool(ta)),
                    ("transpose_b", Attr::Bool(tb)),
                ],
                &[&a, &b],
            );
            let (av, bv) = (values(&a), values(&b));
            let batches: usize = batch.iter().product();
            let mut expected = Vec::new();
            for bi in 0..batches {
                let (am, bm) = (&av[bi * m * k..][..m * k], &bv[bi * k * n..][..k * n]);
                for i in 0..m {
                    for j in 0..n {
                        expected.push(
                            (0..k)
                                .map(|p| at(am, m, k, ta, i, p) * at(bm, k, n, tb, p, j))
                                .sum::<f64>(),
                        );
                    }
                }
            }
            assert_close(
                &values(&out),
                &expected,
                1e-6,
                &format!("matmul {m}x{k}x{n} {ta} {tb}"),
            );
        }
    }
}

#[test]
fn integer_matmul_is_exact_and_wraps() {
    let a = tensor(DType::I64, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = tensor(DType::I64, &[3, 1], &[7.0, 8.0, 9.0]);
    assert_eq!(values(&run(OpKind::Matmul, &[], &[&a, &b])), [50.0, 122.0]);
    let big = tensor(DType::I32, &[1, 2], &[2147483647.0, 1.0]);
    let ones = tensor(DType::I32, &[2, 1], &[1.0, 1.0]);
    assert_eq!(
        values(&run(OpKind::Matmul, &[], &[&big, &ones])),
        [-2147483648.0]
    );
}

struct Conv {
    x: [usize; 4],
    o: usize,
    k: [usize; 2],
    stride: [usize; 2],
    pad: [usize; 4],
    dilation: [usize; 2],
    groups: usize,
}

#[test]
fn conv2d_matches_the_seven_loop_definition() {
    let cases = [
        Conv {
            x: [1, 3, 17, 13],
            o: 5,
            k: [3, 3],
            stride: [1, 1],
            pad: [1, 1, 1, 1],
            dilation: [1, 1],
            groups: 1,
        },
        Conv {
            x: [2, 4, 17, 9],
            o: 6,
            k: [3, 2],
            stride: [2, 3],
            pad: [0, 1, 2, 0],
            dilation: [2, 1],
            groups: 2,
        },
        Conv {
            x: [1, 6, 9, 17],
            o: 6,
            k: [3, 3],
            stride: [1, 2],
            pad: [2, 2, 2, 2],
            dilation: [2, 2],
            groups: 6,
        },
        Conv {
            x: [1, 17, 3, 3],
            o: 3,
            k: [1, 1],
            stride: [1, 1],
            pad: [0, 0, 0, 0],
            dilation: [1, 1],
            groups: 1,
        },
        Conv {
            x: [1, 2, 5, 5],
            o: 4,
            k: [5, 5],
            stride: [1, 1],
            pad: [0, 0, 0, 0],
            dilation: [1, 1],
            groups: 1,
        },
        Conv {
            x: [1, 3, 27, 29],
            o: 2,
            k: [7, 7],
            stride: [2, 2],
            pad: [3, 3, 3, 3],
            dilation: [1, 1],
            groups: 1,
        },
    ];
    for (ci, c) in cases.iter().enumerate() {
        let [n, ch, h, w] = c.x;
        let cg = ch / c.groups;
        let og = c.o / c.groups;
        let x = random(&c.x, 20 + ci as u64);
        let wt = random(&[c.o, cg, c.k[0], c.k[1]], 40 + ci as u64);
        let out = run(
            OpKind::Conv2d,
            &[
                ("stride", ints(&[c.stride[0] as i64, c.stride[1] as i64])),
                ("pad", ints(&c.pad.map(|p| p as i64))),
                (
                    "dilation",
                    ints(&[c.dilation[0] as i64, c.dilation[1] as i64]),
                ),
                ("groups", Attr::Int(c.groups as i64)),
            ],
            &[&x, &wt],
        );
        let (xv, wv) = (values(&x), values(&wt));
        let [_, _, oh, ow] = [out.dims()[0], out.dims()[1], out.dims()[2], out.dims()[3]];
        let mut expected = vec![0.0; n * c.o * oh * ow];
        for b in 0..n {
            for oc in 0..c.o {
                let g = oc / og;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut sum = 0.0;
                        for icg in 0..cg {
                            for ky in 0..c.k[0] {
                                for kx in 0..c.k[1] {
                                    let iy = (oy * c.stride[0] + ky * c.dilation[0]) as i64
                                        - c.pad[0] as i64;
                                    let ix = (ox * c.stride[1] + kx * c.dilation[1]) as i64
                                        - c.pad[1] as i64;
                                    if iy < 0 || ix < 0 || iy >= h as i64 || ix >= w as i64 {
                                        continue;
                                    }
                                    let ic = g * cg + icg;
                                    sum += xv[((b * ch + ic) * h + iy as usize) * w + ix as usize]
                                        * wv[((oc * cg + icg) * c.k[0] + ky) * c.k[1] + kx];
                                }
                            }
                        }
                        expected[((b * c.o + oc) * oh + oy) * ow + ox] = sum;
                    }
                }
            }
        }
        assert_close(&values(&out), &expected, 1e-6, &format!("conv case {ci}"));
    }
}

#[test]
fn pooling_matches_the_window_definition() {
    let x = random(&[2, 3, 17, 13], 7);
    let xv = values(&x);
    let (h, w) = (17usize, 13usize);
    for (kernel, stride, pad, dilation, include) in [
        ([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], false),
        ([2, 3], [1, 2], [1, 0, 0, 2], [2, 1], true),
        ([5, 1], [3, 1], [4, 0, 2, 0], [1, 1], false),
    ] {
        let mut common = vec![
            ("kernel", ints(&kernel)),
            ("stride", ints(&stride)),
            ("pad", ints(&pad)),
        ];
        let avg = run(
            OpKind::Avgpool2d,
            &[
                common.clone(),
                vec![("count_include_pad", Attr::Bool(include))],
            ]
            .concat(),
            &[&x],
        );
        common.push(("dilation", ints(&dilation)));
        let max = run(OpKind::Maxpool2d, &common, &[&x]);
        let window = |dil: [i64; 2], oy: usize, ox: usize, plane: usize| -> Vec<f64> {
            let mut taps = Vec::new();
            for ky in 0..kernel[0] {
                for kx in 0..kernel[1] {
                    let iy = oy as i64 * stride[0] + ky * dil[0] - pad[0];
                    let ix = ox as i64 * stride[1] + kx * dil[1] - pad[1];
                    if iy >= 0 && ix >= 0 && iy < h as i64 && ix < w as i64 {
                        taps.push(xv[plane * h * w + iy as usize * w + ix as usize]);
                    }
                }
            }
            taps
        };
        let (mh, mw) = (max.dims()[2], max.dims()[3]);
        let mut expected = Vec::new();
        for plane in 0..6 {
            for oy in 0..mh {
                for ox in 0..mw {
                    let taps = window(dilation, oy, ox, plane);
                    expected.push(taps.iter().copied().fold(f64::NEG_INFINITY, f64::max));
                }
            }
        }
        assert_eq!(values(&max), expected, "maxpool {kernel:?} {pad:?}");
        let (ah, aw) = (avg.dims()[2], avg.dims()[3]);
        let mut expected = Vec::new();
        for plane in 0..6 {
            for oy in 0..ah {
                for ox in 0..aw {
                    let taps = window([1, 1], oy, ox, plane);
                    let count = if include {
                        (kernel[0] * kernel[1]) as f64
                    } else {
                        taps.len() as f64
                    };
                    expected.push(taps.iter().sum::<f64>() / count);
                }
            }
        }
        assert_close(&values(&avg), &expected, 1e-6, "avgpool");
    }
    let ix = tensor(
        DType::I32,
        &[1, 1, 3, 3],
        &[-5.0, -4.0, -3.0, -2.0, -1.0, -6.0, -7.0, -8.0, -9.0],
    );
    let m = run(
        OpKind::Maxpool2d,
        &[
            ("kernel", ints(&[2, 2])),
            ("pad", ints(&[1, 1, 1, 1])),
            ("stride", ints(&[2, 2])),
        ],
        &[&ix],
    );
    assert_eq!(values(&m), [-5.0, -3.0, -2.0, -1.0]);
    let g = run(OpKind::GlobalAvgpool, &[], &[&x]);
    let expected: Vec<f64> = (0..6)
        .map(|p| xv[p * h * w..(p + 1) * h * w].iter().sum::<f64>() / (h * w) as f64)
        .collect();
    assert_close(&values(&g), &expected, 1e-6, "global_avgpool");
}

#[test]
fn reductions_over_any_axes() {
    let x = random(&[3, 17, 5], 8);
    let xv = values(&x);
    let idx = |a: usize, b: usize, c: usize| xv[(a * 17 + b) * 5 + c];
    let sum02 = run(OpKind::ReduceSum, &[("axes", ints(&[0, 2]))], &[&x]);
    assert_eq!(sum02.dims(), [17]);
    let expected: Vec<f64> = (0..17)
        .map(|b| {
            (0..3)
                .flat_map(|a| (0..5).map(move |c| (a, c)))
                .map(|(a, c)| idx(a, b, c))
                .sum()
        })
        .collect();
    assert_close(&values(&sum02), &expected, 1e-6, "reduce_sum [0,2]");
    let mean1 = run(
        OpKind::ReduceMean,
        &[("axes", ints(&[1])), ("keepdims", Attr::Bool(true))],
        &[&x],
    );
    assert_eq!(mean1.dims(), [3, 1, 5]);
    let expected: Vec<f64> = (0..3)
        .flat_map(|a| (0..5).map(move |c| (a, c)))
        .map(|(a, c)| (0..17).map(|b| idx(a, b, c)).sum::<f64>() / 17.0)
        .collect();
    assert_close(&values(&mean1), &expected, 1e-6, "reduce_mean [1]");
    let max_all = run(OpKind::ReduceMax, &[("axes", ints(&[0, 1, 2]))], &[&x]);
    assert_eq!(
        values(&max_all),
        [xv.iter().copied().fold(f64::NEG_INFINITY, f64::max)]
    );
    let xi = tensor(DType::I64, &[2, 3], &[1.0, -2.0, 3.0, 4.0, 5.0, -6.0]);
    assert_eq!(
        values(&run(OpKind::ReduceSum, &[("axes", ints(&[1]))], &[&xi])),
        [2.0, 3.0]
    );
    assert_eq!(
        values(&run(OpKind::ReduceMax, &[("axes", ints(&[0]))], &[&xi])),
        [4.0, 5.0, 3.0]
    );
}

#[test]
fn softmax_on_every_axis_and_large_logits() {
    let x = random(&[3, 17, 5], 9);
    let xv = values(&x);
    for axis in 0..3usize {
        let out = values(&run(
            OpKind::Softmax,
            &[("axis", Attr::Int(axis as i64))],
            &[&x],
        ));
        let dims = [3, 17, 5];
        let inner: usize = dims[axis + 1..].iter().product();
        let n = dims[axis];
        for (i, &o) in out.iter().enumerate() {
            let base = i - (i / inner % n) * inner;
            let row: Vec<f64> = (0..n).map(|j| xv[base + j * inner]).collect();
            let denominator: f64 = row.iter().map(|r| r.exp()).sum();
            assert!(
                (o - xv[i].exp() / denominator).abs() < 1e-7,
                "axis {axis} element {i}"
            );
        }
    }
    let big = tensor(
        DType::F32,
        &[1, 783],
        &(0..783)
            .map(|i| 1000.0 + i as f64 * 0.01)
            .collect::<Vec<_>>(),
    );
    let out = values(&run(OpKind::Softmax, &[("axis", Attr::Int(1))], &[&big]));
    assert!(out.iter().all(|v| v.is_finite() && *v > 0.0));
    assert!((out.iter().sum::<f64>() - 1.0).abs() < 1e-5);
}

#[test]
fn layernorm_and_batchnorm_match_their_formulas() {
    let x = random(&[3, 783], 10);
    let (scale, bias) = (random(&[783], 11), random(&[783], 12));
    let out = values(&run(
        OpKind::Layernorm,
        &[("axis", Attr::Int(1)), ("epsilon", Attr::Float(1e-3))],
        &[&x, &scale, &bias],
    ));
    let (xv, sv, bv) = (values(&x), values(&scale), values(&bias));
    let mut expected = Vec::new();
    for row in xv.chunks(783) {
        let mean = row.iter().sum::<f64>() / 783.0;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / 783.0;
        expected.extend(
            row.iter()
                .enumerate()
                .map(|(i, v)| (v - mean) / (var + 1e-3).sqrt() * sv[i] + bv[i]),
        );
    }
    assert_close(&out, &expected, 1e-6, "layernorm");

    let x = random(&[2, 3, 17], 13);
    let p: Vec<Tensor> = (0..4).map(|i| random(&[3], 14 + i)).collect();
    let var = tensor(
        DType::F32,
        &[3],
        &values(&p[3])
            .iter()
            .map(|v| v.abs() + 0.1)
            .collect::<Vec<_>>(),
    );
    let out = values(&run(
        OpKind::Batchnorm,
        &[("epsilon", Attr::Float(1e-5))],
        &[&x, &p[0], &p[1], &p[2], &var],
    ));
    let (xv, s, b, m, v) = (
        values(&x),
        values(&p[0]),
        values(&p[1]),
        values(&p[2]),
        values(&var),
    );
    let expected: Vec<f64> = xv
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let c = i / 17 % 3;
            (a - m[c]) / (v[c] + 1e-5).sqrt() * s[c] + b[c]
        })
        .collect();
    assert_close(&out, &expected, 1e-6, "batchnorm");
}

#[test]
fn data_movement_ops_copy_the_right_elements() {
    let x = random(&[3, 17, 5], 15);
    let xv = values(&x);
    let t = values(&run(
        OpKind::Transpose,
        &[("perm", ints(&[2, 0, 1]))],
        &[&x],
    ));
    for c in 0..5 {
        for a in 0..3 {
            for b in 0..17 {
                assert_eq!(t[(c * 3 + a) * 17 + b], xv[(a * 17 + b) * 5 + c]);
            }
        }
    }
    let s = run(
        OpKind::Slice,
        &[
            ("starts", ints(&[1, 2, 0])),
            ("ends", ints(&[3, 17, 5])),
            ("steps", ints(&[1, 5, 2])),
        ],
        &[&x],
    );
    assert_eq!(s.dims(), [2, 3, 3]);
    let sv = values(&s);
    for (i, a) in (1..3).enumerate() {
        for (j, b) in (2..17).step_by(5).enumerate() {
            for (k, c) in (0..5).step_by(2).enumerate() {
                assert_eq!(sv[(i * 3 + j) * 3 + k], xv[(a * 17 + b) * 5 + c]);
            }
        }
    }
    let col = tensor(DType::I64, &[3, 1], &[1.0, 2.0, 3.0]);
    let b = run_as(
        OpKind::Broadcast,
        &[("dims", ints(&[0, 2]))],
        &[&col],
        ty(DType::I64, &[3, 2, 4]),
    );
    assert_eq!(
        values(&b),
        (0..24).map(|i| (i / 8 + 1) as f64).collect::<Vec<_>>()
    );
    let r = run_as(OpKind::Reshape, &[], &[&x], ty(DType::F32, &[17, 15]));
    assert_eq!(values(&r), xv);

    let parts = [
        random(&[2, 1, 3], 16),
        random(&[2, 4, 3], 17),
        random(&[2, 2, 3], 18),
    ];
    let c = values(&run(
        OpKind::Concat,
        &[("axis", Attr::Int(1))],
        &[&parts[0], &parts[1], &parts[2]],
    ));
    let mut expected = Vec::new();
    for o in 0..2 {
        for p in &parts {
            let slab = p.dims()[1] * 3;
            expected.extend_from_slice(&values(p)[o * slab..(o + 1) * slab]);
        }
    }
    assert_eq!(c, expected);

    let small = tensor(DType::I32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let p = run(
        OpKind::Pad,
        &[
            ("low", ints(&[1, 0])),
            ("high", ints(&[0, 2])),
            ("value", Attr::Float(-7.9)),
        ],
        &[&small],
    );
    assert_eq!(
        values(&p),
        [
            -7.0, -7.0, -7.0, -7.0, 1.0, 2.0, -7.0, -7.0, 3.0, 4.0, -7.0, -7.0
        ]
    );

    let data = tensor(DType::F32, &[2, 3], &[0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
    let idx = tensor(DType::I64, &[2, 2], &[2.0, 0.0, -1.0, 1.0]);
    let g = run(OpKind::Gather, &[("axis", Attr::Int(1))], &[&data, &idx]);
    assert_eq!(g.dims(), [2, 2, 2]);
    assert_eq!(values(&g), [2.0, 0.0, 2.0, 1.0, 12.0, 10.0, 12.0, 11.0]);
    let bad = tensor(DType::I32, &[2], &[0.0, 3.0]);
    let a = attrs(OpKind::Gather, &[("axis", Attr::Int(1))]);
    let err = eval_op(
        OpKind::Gather,
        &a,
        &[&data, &bad],
        &[ty(DType::F32, &[2, 2])],
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("index 3 (element 1 of the indices) is out of range for axis 1 of extent 3"),
        "{err}"
    );
}

#[test]
fn casts_round_truncate_saturate_and_wrap() {
    let x = tensor(
        DType::F32,
        &[8],
        &[
            3.7,
            -3.7,
            1e10,
            -1e10,
            f64::NAN,
            0.5,
            65520.0,
            1.0 + 1.0 / 2048.0,
        ],
    );
    let to = |t: &Tensor, d: DType| run_as(OpKind::Cast, &[], &[t], t.ty().with_dtype(d));
    assert_eq!(
        values(&to(&x, DType::I32)),
        [
            3.0,
            -3.0,
            2147483647.0,
            -2147483648.0,
            0.0,
            0.0,
            65520.0,
            1.0
        ]
    );
    let h = values(&to(&x, DType::F16));
    // 65520 is halfway between f16's max and the next power of two: it rounds to inf;
    // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even gives 1.
    assert_eq!(h[6], f64::INFINITY);
    assert_eq!(h[7], 1.0);
    assert_eq!(
        values(&to(&x, DType::Bool)),
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    );
    let big = tensor(DType::I64, &[3], &[4294967297.0, -1.0, 16777217.0]);
    assert_eq!(values(&to(&big, DType::I32)), [1.0, -1.0, 16777217.0]);
    assert_eq!(
        values(&to(&big, DType::F32)),
        [4294967296.0, -1.0, 16777216.0]
    );
    let b = tensor(DType::Bool, &[2], &[1.0, 0.0]);
    assert_eq!(values(&to(&b, DType::BF16)), [1.0, 0.0]);
    let bf = to(
        &tensor(DType::F32, &[1], &[1.0 + 1.0 / 256.0 + 1.0 / 65536.0]),
        DType::BF16,
    );
    assert_eq!(
        bf.data(),
        &TensorData::BF16(vec![bf16::from_f32(1.0 + 1.0 / 128.0)])
    );
}

#[test]
fn constants_splat_or_list_in_every_dtype() {
    let c = run_as(
        OpKind::Constant,
        &[("value", Attr::Float(0.1))],
        &[],
        ty(DType::F16, &[2]),
    );
    assert_eq!(c.data(), &TensorData::F16(vec![f16::from_f64(0.1); 2]));
    let c = run_as(
        OpKind::Constant,
        &[("value", ints(&[1, 0, 1]))],
        &[],
        ty(DType::Bool, &[3]),
    );
    assert_eq!(c.data(), &TensorData::Bool(vec![true, false, true]));
    let c = run_as(
        OpKind::Constant,
        &[("value", Attr::Int(-3))],
        &[],
        ty(DType::I32, &[]),
    );
    assert_eq!(c.data(), &TensorData::I32(vec![-3]));
    let c = run_as(
        OpKind::Constant,
        &[("value", Attr::Floats(vec![0.5, 1.5]))],
        &[],
        ty(DType::F32, &[2, 1]),
    );
    assert_eq!(values(&c), [0.5, 1.5]);
}

/// The half-precision contract: compute in f32, round once at the result.
#[test]
fn half_types_compute_in_f32_and_round_once() {
    for dtype in [DType::F16, DType::BF16] {
        let half = |t: &Tensor| run_as(OpKind::Cast, &[], &[t], t.ty().with_dtype(dtype));
        let widen = |t: &Tensor| run_as(OpKind::Cast, &[], &[t], t.ty().with_dtype(DType::F32));
        let (a, b) = (half(&random(&[17, 783], 30)), half(&random(&[783, 3], 31)));
        let x = half(&random(&[1, 3, 17, 13], 32));
        let w = half(&random(&[4, 3, 3, 3], 33));
        let conv = [("pad", ints(&[1, 1, 1, 1]))];
        let cases: Vec<(Tensor, Tensor)> = vec![
            (
                run(OpKind::Matmul, &[], &[&a, &b]),
                half(&run(OpKind::Matmul, &[], &[&widen(&a), &widen(&b)])),
            ),
            (
                run(OpKind::Conv2d, &conv, &[&x, &w]),
                half(&run(OpKind::Conv2d, &conv, &[&widen(&x), &widen(&w)])),
            ),
            (
                run(OpKind::Softmax, &[("axis", Attr::Int(1))], &[&a]),
                half(&run(
                    OpKind::Softmax,
                    &[("axis", Attr::Int(1))],
                    &[&widen(&a)],
                )),
            ),
            (
                run(OpKind::Add, &[], &[&a, &a]),
                half(&run(OpKind::Add, &[], &[&widen(&a), &widen(&a)])),
            ),
            (
                run(OpKind::Gelu, &[], &[&x]),
                half(&run(OpKind::Gelu, &[], &[&widen(&x)])),
            ),
        ];
        for (i, (actual, expected)) in cases.iter().enumerate() {
            assert_eq!(actual.dtype(), dtype);
            assert_eq!(actual.data(), expected.data(), "{dtype} case {i}");
        }
    }
}

#[test]
fn bad_operands_are_errors_not_panics() {
    let a = random(&[3, 17], 1);
    let b = random(&[17, 3], 2);
    let none = Attrs::new();
    let err = eval_op(OpKind::Add, &none, &[&a, &b], &[a.ty().clone()]).unwrap_err();
    assert!(err.to_string().starts_with("`add`: "), "{err}");
    let err = eval_op(OpKind::Matmul, &none, &[&a, &b], &[ty(DType::F32, &[3, 4])]).unwrap_err();
    assert!(err.to_string().contains("written type"), "{err}");
    assert!(eval_op(OpKind::Relu, &none, &[], &[a.ty().clone()]).is_err());
    assert!(eval_op(OpKind::Fused, &none, &[&a], &[a.ty().clone()]).is_err());
    let unknown = Attrs::new().with("bogus", Attr::Int(1));
    assert!(eval_op(OpKind::Relu, &unknown, &[&a], &[a.ty().clone()]).is_err());
    assert!(Tensor::new(ty(DType::F32, &[2]), TensorData::F32(vec![1.0])).is_err());
    assert!(Tensor::new(ty(DType::F32, &[1]), TensorData::I32(vec![1])).is_err());
}

#[test]
fn comparisons_logic_and_select() {
    use DType::{Bool, F32, I64};
    let nan = f64::NAN;
    let x = tensor(F32, &[6], &[1.0, -2.0, nan, 0.0, -0.0, f64::INFINITY]);
    let y = tensor(F32, &[6], &[1.0, 3.0, 1.0, -0.0, 0.0, 1.0]);
    let bools = |t: &Tensor| -> Vec<bool> { values(t).iter().map(|&v| v != 0.0).collect() };
    // NaN compares unequal and unordered; -0 equals 0.
    let cases = [
        (OpKind::Equal, [true, false, false, true, true, false]),
        (OpKind::Less, [false, true, false, false, false, false]),
        (OpKind::LessEqual, [true, true, false, true, true, false]),
        (OpKind::Greater, [false, false, false, false, false, true]),
        (OpKind::GreaterEqual, [true, false, false, true, true, true]),
    ];
    for (kind, want) in cases {
        let r = run(kind, &[], &[&x, &y]);
        assert_eq!(r.dtype(), Bool, "{kind:?}");
        assert_eq!(bools(&r), want, "{kind:?}");
    }
    let i = tensor(I64, &[3], &[-5.0, 7.0, 7.0]);
    let j = tensor(I64, &[3], &[-5.0, 6.0, 8.0]);
    assert_eq!(
        bools(&run(OpKind::Less, &[], &[&i, &j])),
        [false, false, true]
    );
    let a = tensor(Bool, &[4], &[0.0, 0.0, 1.0, 1.0]);
    let b = tensor(Bool, &[4], &[0.0, 1.0, 0.0, 1.0]);
    assert_eq!(
        bools(&run(OpKind::And, &[], &[&a, &b])),
        [false, false, false, true]
    );
    assert_eq!(
        bools(&run(OpKind::Or, &[], &[&a, &b])),
        [false, true, true, true]
    );
    assert_eq!(
        bools(&run(OpKind::Xor, &[], &[&a, &b])),
        [false, true, true, false]
    );
    assert_eq!(
        bools(&run(OpKind::Not, &[], &[&a])),
        [true, true, false, false]
    );
    let cond = tensor(Bool, &[6], &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
    let s = values(&run(OpKind::Select, &[], &[&cond, &x, &y]));
    assert_eq!(s[..2], [1.0, 3.0]);
    assert!(s[2].is_nan());
    assert_eq!(
        bools(&run(OpKind::IsNan, &[], &[&x])),
        [false, false, true, false, false, false]
    );
    assert_eq!(
        bools(&run(OpKind::IsInf, &[], &[&x])),
        [false, false, false, false, false, true]
    );
}

#[test]
fn mod_signs_and_rounding_functions() {
    use DType::{F32, I32};
    // The ONNX operator document's example: fmod = 0 takes the divisor's
    // sign, fmod = 1 the dividend's.
    let x = tensor(I32, &[6], &[-4.0, 7.0, 5.0, 4.0, -7.0, 8.0]);
    let y = tensor(I32, &[6], &[2.0, -3.0, 8.0, -2.0, 3.0, 5.0]);
    let fmod = |on: bool| ("fmod", Attr::Bool(on));
    assert_eq!(
        values(&run(OpKind::Mod, &[fmod(false)], &[&x, &y])),
        [0.0, -2.0, 5.0, 0.0, 2.0, 3.0]
    );
    assert_eq!(
        values(&run(OpKind::Mod, &[fmod(true)], &[&x, &y])),
        [0.0, 1.0, 5.0, 0.0, -1.0, 3.0]
    );
    let zero = tensor(I32, &[6], &[1.0, 1.0, 0.0, 1.0, 1.0, 1.0]);
    let a = attrs(OpKind::Mod, &[]);
    let err = eval_op(OpKind::Mod, &a, &[&x, &zero], &[ty(I32, &[6])]).unwrap_err();
    assert!(err.to_string().contains("by zero"), "{err}");
    let fx = tensor(F32, &[4], &[-4.5, 7.5, 5.25, -1.0]);
    let fy = tensor(F32, &[4], &[2.0, -3.0, 2.5, 4.0]);
    assert_eq!(
        values(&run(OpKind::Mod, &[fmod(false)], &[&fx, &fy])),
        [1.5, -1.5, 0.25, 3.0]
    );
    assert_eq!(
        values(&run(OpKind::Mod, &[fmod(true)], &[&fx, &fy])),
        [-0.5, 1.5, 0.25, -1.0]
    );
    let r = tensor(F32, &[7], &[0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6]);
    assert_eq!(
        values(&run(OpKind::Round, &[], &[&r])),
        [0.0, 2.0, 2.0, -0.0, -2.0, 2.0, -3.0]
    );
    assert_eq!(
        values(&run(OpKind::Floor, &[], &[&r])),
        [0.0, 1.0, 2.0, -1.0, -2.0, 2.0, -3.0]
    );
    assert_eq!(
        values(&run(OpKind::Ceil, &[], &[&r])),
        [1.0, 2.0, 3.0, -0.0, -1.0, 3.0, -2.0]
    );
    assert_eq!(
        values(&run(OpKind::Sign, &[], &[&r])),
        [1.0, 1.0, 1.0, -1.0, -1.0, 1.0, -1.0]
    );
    assert_eq!(
        values(&run(OpKind::Sign, &[], &[&x])),
        [-1.0, 1.0, 1.0, 1.0, -1.0, 1.0]
    );
    let angles = tensor(F32, &[3], &[0.0, 1.0, -2.0]);
    let sin = values(&run(OpKind::Sin, &[], &[&angles]));
    let cos = values(&run(OpKind::Cos, &[], &[&angles]));
    assert_close(&sin, &[0.0, 1f64.sin(), (-2f64).sin()], 1e-6, "sin");
    assert_close(&cos, &[1.0, 1f64.cos(), (-2f64).cos()], 1e-6, "cos");
}
