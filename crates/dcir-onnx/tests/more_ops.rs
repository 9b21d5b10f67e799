//! Einsum, Pad, ScatterND, ReduceL2, comparisons, logic, Where, Mod and the
//! rounding functions: small models built in Rust with the
//! prost types, imported, verified, and run on the interpreter against
//! references computed here.

use dcir_interp::io::bind_inputs;
use dcir_interp::{Tensor, run_graph};
use dcir_ir::{DType, TensorType, verify_module};
use dcir_onnx::proto::AttributeProto;
use dcir_onnx::{ImportOptions, import_bytes};

mod common;
use common::*;

/// Imports `bytes`, runs it on `inputs` (f32, in graph input order) and
/// returns the single output.
fn run(bytes: &[u8], inputs: &[(&str, &[usize], Vec<f32>)]) -> Tensor {
    let imported = import_bytes(bytes, &ImportOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    verify_module(&imported.module).unwrap();
    let graph = &imported.module.graphs[0];
    let given = inputs
        .iter()
        .map(|(n, d, v)| {
            let t = Tensor::from_f32(TensorType::new(DType::F32, d.to_vec()), v).unwrap();
            (n.to_string(), t)
        })
        .collect();
    let bound = bind_inputs(graph, given, 0).unwrap();
    assert!(bound.random.is_empty(), "unbound: {:?}", bound.random);
    let mut out = run_graph(graph, &bound.inputs).unwrap();
    assert_eq!(out.len(), 1);
    out.remove(0)
}

fn import_err(bytes: &[u8]) -> String {
    import_bytes(bytes, &ImportOptions::default())
        .unwrap_err()
        .to_string()
}

fn close(actual: &Tensor, dims: &[usize], expected: &[f64]) {
    assert_eq!(actual.dims(), dims);
    let a = actual.to_f64();
    assert_eq!(a.len(), expected.len());
    for (k, (x, e)) in a.iter().zip(expected).enumerate() {
        assert!(
            (x - e).abs() <= 1e-4 + 1e-4 * e.abs(),
            "element {k}: {x} vs {e}"
        );
    }
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) * scale)
        .collect()
}

/// A naive two-operand einsum over single letters (spaces ignored).
fn einsum_ref(eq: &str, a: (&[usize], &[f32]), b: (&[usize], &[f32])) -> (Vec<usize>, Vec<f64>) {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, out) = eq.split_once("->").unwrap();
    let (ta, tb) = lhs.split_once(',').unwrap();
    let (ta, tb, to): (Vec<char>, Vec<char>, Vec<char>) = (
        ta.chars().collect(),
        tb.chars().collect(),
        out.chars().collect(),
    );
    let mut letters: Vec<(char, usize)> = Vec::new();
    for (t, d) in [(&ta, a.0), (&tb, b.0)] {
        for (c, &n) in t.iter().zip(d) {
            if !letters.iter().any(|l| l.0 == *c) {
                letters.push((*c, n));
            }
        }
    }
    let size = |c: char| letters.iter().find(|l| l.0 == c).unwrap().1;
    let odims: Vec<usize> = to.iter().map(|&c| size(c)).collect();
    let mut out = vec![0.0f64; odims.iter().product()];
    let total: usize = letters.iter().map(|l| l.1).product();
    let flat = |t: &[char], dims: &[usize], val: &dyn Fn(char) -> usize| {
        t.iter().zip(dims).fold(0, |acc, (&c, &n)| acc * n + val(c))
    };
    for mut f in 0..total {
        let mut vals = Vec::new();
        for &(c, n) in letters.iter().rev() {
            vals.push((c, f % n));
            f /= n;
        }
        let val = |c: char| vals.iter().find(|v| v.0 == c).unwrap().1;
        let ia = flat(&ta, a.0, &val);
        let ib = flat(&tb, b.0, &val);
        let io = flat(&to, &odims, &val);
        out[io] += f64::from(a.1[ia]) * f64::from(b.1[ib]);
    }
    (odims, out)
}

#[test]
fn einsum_batched_matmul_forms() {
    let cases: &[(&str, &[usize], &[usize])] = &[
        (
            "B G H I D, B G H J D -> B G H I J",
            &[2, 1, 3, 4, 5],
            &[2, 1, 3, 6, 5],
        ),
        (
            "B G H I J, B G H J D -> B G H I D",
            &[2, 1, 3, 4, 6],
            &[2, 1, 3, 6, 5],
        ),
        ("bik,bkj->bij", &[3, 4, 5], &[3, 5, 2]),
        ("bki,bkj->bij", &[3, 5, 4], &[3, 5, 2]),
        ("bik,bkj->bji", &[3, 4, 5], &[3, 5, 2]),
        ("bki,bjk->bji", &[3, 5, 4], &[3, 2, 5]),
        ("ik,kj->ij", &[4, 5], &[5, 3]),
        // Beyond matrix products: contractions over several letters, free
        // letters in any place, outer products, letters summed out of one
        // operand, a scalar result.
        ("abc,abd->cd", &[2, 3, 4], &[2, 3, 5]),
        ("bij,jk->bik", &[2, 3, 4], &[4, 5]),
        ("bhqd,bkhd->bhqk", &[2, 3, 4, 5], &[2, 6, 3, 5]),
        ("i,j->ij", &[3], &[4]),
        ("ij,kl->ik", &[2, 3], &[4, 5]),
        ("ij,ij->", &[3, 4], &[3, 4]),
        ("bn,anm->bam", &[2, 3], &[4, 3, 5]),
    ];
    for &(eq, ad, bd) in cases {
        let (na, nb) = (ad.iter().product(), bd.iter().product());
        let (va, vb) = (ramp(na, 0.25), ramp(nb, 0.5));
        let (od, want) = einsum_ref(eq, (ad, &va), (bd, &vb));
        let bytes = model(
            17,
            vec![node(
                "Einsum",
                &["a", "b"],
                "y",
                vec![a_str("equation", eq)],
            )],
            &[("a", ad), ("b", bd)],
            ("y", &od),
        );
        let got = run(&bytes, &[("a", ad, va.clone()), ("b", bd, vb.clone())]);
        close(&got, &od, &want);
    }
}

#[test]
fn einsum_diagonals_and_mismatched_extents_are_refused_by_name() {
    for (eq, ad, bd, why) in [
        ("ii,ij->ij", [3, 3], [3, 4], "diagonal"),
        ("ij,jk->ik", [2, 3], [4, 5], "extents 3 and 4"),
        ("ij,jk,kl->il", [2, 3], [3, 4], "one or two are supported"),
    ] {
        let bytes = model(
            17,
            vec![node(
                "Einsum",
                &["a", "b"],
                "y",
                vec![a_str("equation", eq)],
            )],
            &[("a", &ad), ("b", &bd)],
            ("y", &[2, 5]),
        );
        let msg = import_err(&bytes);
        assert!(msg.contains("Einsum") && msg.contains(eq), "{eq}: {msg}");
        assert!(msg.contains(why), "{eq}: {msg}");
    }
}

#[test]
fn einsum_of_one_operand_and_implicit_outputs() {
    // (equation, input dims, output dims, reference from the input).
    type Reference = fn(&[f32]) -> Vec<f64>;
    let cases: &[(&str, &[usize], &[usize], Reference)] = &[
        ("ij->ji", &[2, 3], &[3, 2], |x| {
            (0..6).map(|k| f64::from(x[(k % 2) * 3 + k / 2])).collect()
        }),
        ("ij->i", &[2, 3], &[2], |x| {
            (0..2)
                .map(|i| (0..3).map(|j| f64::from(x[i * 3 + j])).sum())
                .collect()
        }),
        // Implicit output: the letters used once, sorted (`ji` -> `ij`).
        ("ji", &[2, 3], &[3, 2], |x| {
            (0..6).map(|k| f64::from(x[(k % 2) * 3 + k / 2])).collect()
        }),
        ("...ij->...j", &[2, 2, 3], &[2, 3], |x| {
            (0..6)
                .map(|k| {
                    (0..2)
                        .map(|i| f64::from(x[(k / 3) * 6 + i * 3 + k % 3]))
                        .sum()
                })
                .collect()
        }),
    ];
    for &(eq, xd, od, reference) in cases {
        let xv = ramp(xd.iter().product(), 0.5);
        let bytes = model(
            17,
            vec![node("Einsum", &["x"], "y", vec![a_str("equation", eq)])],
            &[("x", xd)],
            ("y", od),
        );
        let got = run(&bytes, &[("x", xd, xv.clone())]);
        close(&got, od, &reference(&xv));
    }
}

fn pad_ref(x: &[f32], dims: &[usize], low: &[usize], high: &[usize], v: f64) -> Vec<f64> {
    let od: Vec<usize> = (0..dims.len())
        .map(|d| dims[d] + low[d] + high[d])
        .collect();
    let n: usize = od.iter().product();
    (0..n)
        .map(|mut f| {
            let mut src = 0;
            let mut inside = true;
            let mut mul = 1;
            for d in (0..od.len()).rev() {
                let c = f % od[d];
                f /= od[d];
                match c.checked_sub(low[d]).filter(|&c| c < dims[d]) {
                    Some(c) => src += c * mul,
                    None => inside = false,
                }
                mul *= dims[d];
            }
            if inside { f64::from(x[src]) } else { v }
        })
        .collect()
}

#[test]
fn pad_constant_mode() {
    let dims = [1usize, 2, 3, 3];
    let x = ramp(18, 1.0);
    // Opset 13: pads for every dim, a constant_value.
    let bytes = model(
        13,
        vec![
            constant("p", tensor_i(&[8], &[0, 0, 1, 2, 0, 0, 2, 1])),
            constant("v", tensor_f(&[], &[1.5])),
            node(
                "Pad",
                &["x", "p", "v"],
                "y",
                vec![a_str("mode", "constant")],
            ),
        ],
        &[("x", &dims)],
        ("y", &[1, 2, 6, 6]),
    );
    let got = run(&bytes, &[("x", &dims, x.clone())]);
    close(
        &got,
        &[1, 2, 6, 6],
        &pad_ref(&x, &dims, &[0, 0, 1, 2], &[0, 0, 2, 1], 1.5),
    );
    // Opset 18: axes [-1, 1] (pads: begin of each, then end of each),
    // constant_value left out (zero).
    let bytes = model(
        18,
        vec![
            constant("p", tensor_i(&[4], &[1, 0, 0, 2])),
            constant("ax", tensor_i(&[2], &[-1, 1])),
            node("Pad", &["x", "p", "", "ax"], "y", vec![]),
        ],
        &[("x", &dims)],
        ("y", &[1, 4, 3, 4]),
    );
    let got = run(&bytes, &[("x", &dims, x.clone())]);
    close(
        &got,
        &[1, 4, 3, 4],
        &pad_ref(&x, &dims, &[0, 0, 0, 1], &[0, 2, 0, 0], 0.0),
    );
    // Opset 2: pads and value as attributes.
    let bytes = model(
        2,
        vec![node(
            "Pad",
            &["x"],
            "y",
            vec![a_ints("pads", &[0, 1, 0, 0, 0, 0, 1, 1])],
        )],
        &[("x", &dims)],
        ("y", &[1, 3, 4, 4]),
    );
    let got = run(&bytes, &[("x", &dims, x.clone())]);
    close(
        &got,
        &[1, 3, 4, 4],
        &pad_ref(&x, &dims, &[0, 1, 0, 0], &[0, 0, 1, 1], 0.0),
    );
}

#[test]
fn pad_of_a_constant_folds() {
    let c = ramp(6, 1.0);
    let bytes = model(
        13,
        vec![
            constant("c", tensor_f(&[2, 3], &c)),
            constant("p", tensor_i(&[4], &[1, 0, 0, 1])),
            constant("v", tensor_f(&[], &[-2.0])),
            node("Pad", &["c", "p", "v"], "cp", vec![]),
            node("Add", &["x", "cp"], "y", vec![]),
        ],
        &[("x", &[3, 4])],
        ("y", &[3, 4]),
    );
    let imported = import_bytes(&bytes, &ImportOptions::default()).unwrap();
    let g = &imported.module.graphs[0];
    assert!(
        g.all_ops().iter().all(|&o| g.op(o).kind.name() != "pad"),
        "the pad of a constant should fold"
    );
    let x = ramp(12, 0.5);
    let got = run(&bytes, &[("x", &[3, 4], x.clone())]);
    let padded = pad_ref(&c, &[2, 3], &[1, 0], &[0, 1], -2.0);
    let want: Vec<f64> = x
        .iter()
        .zip(&padded)
        .map(|(a, b)| f64::from(*a) + b)
        .collect();
    close(&got, &[3, 4], &want);
}

#[test]
fn pad_refusals() {
    let dims = [2usize, 3];
    let reflect = model(
        13,
        vec![
            constant("p", tensor_i(&[4], &[1, 1, 1, 1])),
            node("Pad", &["x", "p"], "y", vec![a_str("mode", "reflect")]),
        ],
        &[("x", &dims)],
        ("y", &[4, 5]),
    );
    let msg = import_err(&reflect);
    assert!(msg.contains("mode `reflect`"), "{msg}");
    let dynamic = model(
        13,
        vec![node("Pad", &["x", "p"], "y", vec![])],
        &[("x", &dims), ("p", &[4])],
        ("y", &[4, 5]),
    );
    let msg = import_err(&dynamic);
    assert!(msg.contains("known at import time"), "{msg}");
    let negative = model(
        13,
        vec![
            constant("p", tensor_i(&[4], &[-1, 0, 0, 0])),
            node("Pad", &["x", "p"], "y", vec![]),
        ],
        &[("x", &dims)],
        ("y", &[1, 3]),
    );
    let msg = import_err(&negative);
    assert!(msg.contains("negative"), "{msg}");
}

#[test]
fn scatter_nd_of_constants_folds() {
    // data [3, 4] ramp; rows 2 and 0 replaced (swin builds masks this way).
    let data = ramp(12, 1.0);
    let upd: Vec<f32> = (0..8).map(|i| 10.0 + i as f32).collect();
    let bytes = model(
        16,
        vec![
            constant("d", tensor_f(&[3, 4], &data)),
            constant("i", tensor_i(&[2, 1], &[2, 0])),
            constant("u", tensor_f(&[2, 4], &upd)),
            node("ScatterND", &["d", "i", "u"], "s", vec![]),
            // And single elements of a 3-D tensor, one with a negative index.
            constant("i2", tensor_i(&[2, 2], &[1, -1, 0, 1])),
            constant("u2", tensor_f(&[2], &[100.0, 200.0])),
            node("Add", &["x", "s"], "y", vec![]),
            node("ScatterND", &["y", "i2", "u2"], "z", vec![]),
        ],
        &[("x", &[3, 4])],
        ("z", &[3, 4]),
    );
    // The second ScatterND sets single elements of a run-time value: refused.
    let msg = import_err(&bytes);
    assert!(msg.contains("ScatterND"), "{msg}");
    assert!(msg.contains("rows of dim 0"), "{msg}");

    let bytes = model(
        16,
        vec![
            constant("d", tensor_f(&[3, 4], &data)),
            constant("i", tensor_i(&[2, 1], &[2, 0])),
            constant("u", tensor_f(&[2, 4], &upd)),
            node("ScatterND", &["d", "i", "u"], "s", vec![]),
            constant("i2", tensor_i(&[2, 2], &[1, -1, 0, 1])),
            constant("u2", tensor_f(&[2], &[100.0, 200.0])),
            node("ScatterND", &["s", "i2", "u2"], "t", vec![]),
            node("Add", &["x", "t"], "z", vec![]),
        ],
        &[("x", &[3, 4])],
        ("z", &[3, 4]),
    );
    let mut want: Vec<f64> = data.iter().map(|&v| f64::from(v)).collect();
    for c in 0..4 {
        want[2 * 4 + c] = f64::from(upd[c]);
        want[c] = f64::from(upd[4 + c]);
    }
    want[4 + 3] = 100.0;
    want[1] = 200.0;
    let x = ramp(12, 0.5);
    for (w, &xv) in want.iter_mut().zip(&x) {
        *w += f64::from(xv);
    }
    let got = run(&bytes, &[("x", &[3, 4], x.clone())]);
    close(&got, &[3, 4], &want);
}

#[test]
fn reduce_l2_axes_attribute_and_input() {
    let dims = [2usize, 3, 4];
    let x = ramp(24, 0.5);
    let l2 = |keep_axis: usize| -> Vec<f64> {
        // Reduce over `keep_axis`'s complement is not needed: one axis here.
        let strides = [12usize, 4, 1];
        let mut out = Vec::new();
        let others: Vec<usize> = (0..3).filter(|&d| d != keep_axis).collect();
        for i in 0..dims[others[0]] {
            for j in 0..dims[others[1]] {
                let s: f64 = (0..dims[keep_axis])
                    .map(|k| {
                        let idx = i * strides[others[0]]
                            + j * strides[others[1]]
                            + k * strides[keep_axis];
                        f64::from(x[idx]).powi(2)
                    })
                    .sum();
                out.push(s.sqrt());
            }
        }
        out
    };
    // Opset 17: axes attribute, keepdims default 1.
    let bytes = model(
        17,
        vec![node("ReduceL2", &["x"], "y", vec![a_ints("axes", &[-1])])],
        &[("x", &dims)],
        ("y", &[2, 3, 1]),
    );
    close(&run(&bytes, &[("x", &dims, x.clone())]), &[2, 3, 1], &l2(2));
    // Opset 18: axes input, keepdims 0.
    let bytes = model(
        18,
        vec![
            constant("ax", tensor_i(&[1], &[1])),
            node("ReduceL2", &["x", "ax"], "y", vec![a_int("keepdims", 0)]),
        ],
        &[("x", &dims)],
        ("y", &[2, 4]),
    );
    close(&run(&bytes, &[("x", &dims, x.clone())]), &[2, 4], &l2(1));
}

#[test]
fn scatter_nd_rows_of_a_run_time_value() {
    // swin_v2: `qkv_bias[C:2C] = 0` on a weight; here rows 1, 2 and 4 of 5.
    let upd: Vec<f32> = (0..9).map(|i| 10.0 + i as f32).collect();
    let bytes = model(
        16,
        vec![
            constant("i", tensor_i(&[3, 1], &[4, 1, -3])),
            constant("u", tensor_f(&[3, 3], &upd)),
            node("ScatterND", &["x", "i", "u"], "y", vec![]),
        ],
        &[("x", &[5, 3])],
        ("y", &[5, 3]),
    );
    let x = ramp(15, 0.5);
    let mut want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for (u, row) in [4usize, 1, 2].iter().enumerate() {
        for c in 0..3 {
            want[row * 3 + c] = f64::from(upd[u * 3 + c]);
        }
    }
    close(&run(&bytes, &[("x", &[5, 3], x.clone())]), &[5, 3], &want);
    let dynamic = model(
        16,
        vec![
            constant("i", tensor_i(&[1, 1], &[0])),
            node("ScatterND", &["x", "i", "u"], "y", vec![]),
        ],
        &[("x", &[5, 3]), ("u", &[1, 3])],
        ("y", &[5, 3]),
    );
    let msg = import_err(&dynamic);
    assert!(msg.contains("updates known at import time"), "{msg}");
}

#[test]
fn comparisons_logic_and_where_run_on_run_time_values() {
    // where(x < y or x is NaN, x, y) with y broadcast: a NaN-keeping minimum,
    // then round, sign, mod (fmod) and floor on the result.
    let x = vec![-2.5f32, 1.5, f32::NAN, 0.5, 3.0, -7.25];
    let nodes = vec![
        node("Less", &["x", "y"], "lt", vec![]),
        node("IsNaN", &["x"], "nan", vec![]),
        node("Or", &["lt", "nan"], "pick", vec![]),
        node("Where", &["pick", "x", "y"], "m", vec![]),
        node("Round", &["m"], "r", vec![]),
        node("Sign", &["m"], "s", vec![]),
        node("Add", &["r", "s"], "rs", vec![]),
        constant("two", tensor_f(&[], &[2.0])),
        node("Mod", &["m", "two"], "md", vec![a_int("fmod", 1)]),
        node("Add", &["rs", "md"], "sum", vec![]),
        node("Floor", &["sum"], "out", vec![]),
    ];
    let bytes = model(17, nodes, &[("x", &[2, 3]), ("y", &[3])], ("out", &[2, 3]));
    let y = vec![0.0f32, 1.0, 2.0];
    let out = run(&bytes, &[("x", &[2, 3], x.clone()), ("y", &[3], y.clone())]);
    let expected: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &xv)| {
            let yv = y[i % 3];
            let m = if xv < yv || xv.is_nan() { xv } else { yv } as f64;
            let sign = if m > 0.0 {
                1.0
            } else if m < 0.0 {
                -1.0
            } else {
                m
            };
            (m.round_ties_even() + sign + m % 2.0).floor()
        })
        .collect();
    assert_eq!(out.dims(), &[2, 3]);
    for (k, (a, e)) in out.to_f64().iter().zip(&expected).enumerate() {
        assert!(
            a == e || (a.is_nan() && e.is_nan()),
            "element {k}: {a} vs {e}"
        );
    }
}

#[test]
fn integer_mod_on_run_time_values_follows_fmod() {
    // The ONNX operator document's example, on run-time values (the folded
    // form is in dropout_mod.rs).
    let int_model = |fmod: i64| {
        let nodes = vec![node("Mod", &["x", "y"], "out", vec![a_int("fmod", fmod)])];
        let io = [("x", INT64, &[6][..]), ("y", INT64, &[6][..])];
        model_typed(17, nodes, &io, &[("out", INT64, &[6])])
    };
    for (fmod, expected) in [(0, [0, -2, 5, 0, 2, 3]), (1, [0, 1, 5, 0, -1, 3])] {
        let imported = import_bytes(&int_model(fmod), &ImportOptions::default()).unwrap();
        let graph = &imported.module.graphs[0];
        let t = |v: &[i64]| Tensor::from_i64(TensorType::new(DType::I64, vec![6]), v).unwrap();
        let given = vec![
            ("x".to_string(), t(&[-4, 7, 5, 4, -7, 8])),
            ("y".to_string(), t(&[2, -3, 8, -2, 3, 5])),
        ];
        let bound = bind_inputs(graph, given, 0).unwrap();
        let out = run_graph(graph, &bound.inputs).unwrap();
        assert_eq!(out[0].data().to_i64().as_ref(), &expected, "fmod = {fmod}");
    }
}

#[test]
fn activations_follow_their_onnx_formulas() {
    let x = ramp(12, 0.75);
    let softplus = |x: f64| (x.exp() + 1.0).ln();
    type Case = (&'static str, Vec<AttributeProto>, Box<dyn Fn(f64) -> f64>);
    let cases: Vec<Case> = vec![
        (
            "LeakyRelu",
            vec![],
            Box::new(|x| if x < 0.0 { 0.01 * x } else { x }),
        ),
        (
            "LeakyRelu",
            vec![a_float("alpha", 0.2)],
            Box::new(|x| if x < 0.0 { 0.2 * x } else { x }),
        ),
        (
            "Elu",
            vec![],
            Box::new(|x: f64| if x < 0.0 { x.exp() - 1.0 } else { x }),
        ),
        (
            "Selu",
            vec![],
            Box::new(|x: f64| {
                let (a, g) = (1.673_263_192_176_818_8, 1.050_701_022_148_132_3);
                if x <= 0.0 {
                    g * (a * x.exp() - a)
                } else {
                    g * x
                }
            }),
        ),
        (
            "Celu",
            vec![a_float("alpha", 2.0)],
            Box::new(|x: f64| x.max(0.0) + (2.0 * ((x / 2.0).exp() - 1.0)).min(0.0)),
        ),
        ("Softplus", vec![], Box::new(softplus)),
        ("Softsign", vec![], Box::new(|x: f64| x / (1.0 + x.abs()))),
        (
            "Mish",
            vec![],
            Box::new(move |x: f64| x * softplus(x).tanh()),
        ),
        (
            "ThresholdedRelu",
            vec![a_float("alpha", 1.5)],
            Box::new(|x| if x > 1.5 { x } else { 0.0 }),
        ),
    ];
    for (op, attrs, f) in cases {
        let bytes = model(
            17,
            vec![node(op, &["x"], "out", attrs)],
            &[("x", &[3, 4])],
            ("out", &[3, 4]),
        );
        let out = run(&bytes, &[("x", &[3, 4], x.clone())]);
        let expected: Vec<f64> = x.iter().map(|&v| f(f64::from(v))).collect();
        close(&out, &[3, 4], &expected);
    }
    // PRelu: a slope per channel, broadcast from [4] to [3, 4].
    let slope = [0.5f32, -1.0, 0.0, 2.0];
    let nodes = vec![
        constant("slope", tensor_f(&[4], &slope)),
        node("PRelu", &["x", "slope"], "out", vec![]),
    ];
    let bytes = model(17, nodes, &[("x", &[3, 4])], ("out", &[3, 4]));
    let out = run(&bytes, &[("x", &[3, 4], x.clone())]);
    let expected: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let v = f64::from(v);
            if v < 0.0 {
                f64::from(slope[i % 4]) * v
            } else {
                v
            }
        })
        .collect();
    close(&out, &[3, 4], &expected);
}

#[test]
fn derived_reductions() {
    let x = ramp(12, 0.5); // [3, 4], negative and positive values
    let rows: Vec<Vec<f64>> = x
        .chunks(4)
        .map(|r| r.iter().map(|&v| f64::from(v)).collect())
        .collect();
    type Case = (&'static str, fn(&[f64]) -> f64);
    let cases: [Case; 6] = [
        ("ReduceMin", |r| {
            r.iter().copied().fold(f64::INFINITY, f64::min)
        }),
        ("ReduceL1", |r| r.iter().map(|v| v.abs()).sum()),
        ("ReduceL2", |r| r.iter().map(|v| v * v).sum::<f64>().sqrt()),
        ("ReduceSumSquare", |r| r.iter().map(|v| v * v).sum()),
        ("ReduceLogSumExp", |r| {
            r.iter().map(|v| v.exp()).sum::<f64>().ln()
        }),
        ("ReduceLogSum", |r| {
            r.iter().map(|v| v.abs() + 1.0).sum::<f64>().ln()
        }),
    ];
    for (op, f) in cases {
        let axes = constant("axes", tensor_i(&[1], &[1]));
        let keep = vec![a_int("keepdims", 0)];
        let nodes = if op == "ReduceLogSum" {
            // Positive sums only: log of |x| + 1.
            vec![
                axes,
                node("Abs", &["x"], "a", vec![]),
                constant("one", tensor_f(&[], &[1.0])),
                node("Add", &["a", "one"], "p", vec![]),
                node(op, &["p", "axes"], "out", keep),
            ]
        } else {
            vec![axes, node(op, &["x", "axes"], "out", keep)]
        };
        let bytes = model(18, nodes, &[("x", &[3, 4])], ("out", &[3]));
        let out = run(&bytes, &[("x", &[3, 4], x.clone())]);
        let expected: Vec<f64> = rows.iter().map(|r| f(r)).collect();
        close(&out, &[3], &expected);
    }
    // An integer minimum keeps the dtype's minimum (no overflow on the way).
    let nodes = vec![node("ReduceMin", &["x"], "out", vec![a_int("keepdims", 0)])];
    let bytes = model_typed(18, nodes, &[("x", INT64, &[4])], &[("out", INT64, &[])]);
    let imported = import_bytes(&bytes, &ImportOptions::default()).unwrap();
    let g = &imported.module.graphs[0];
    let xs = Tensor::from_i64(TensorType::new(DType::I64, vec![4]), &[5, i64::MIN, 7, -3]).unwrap();
    let bound = bind_inputs(g, vec![("x".to_string(), xs)], 0).unwrap();
    let out = run_graph(g, &bound.inputs).unwrap();
    assert_eq!(out[0].data().to_i64().as_ref(), &[i64::MIN]);
}

#[test]
fn split_tile_trilu() {
    let x = ramp(12, 1.0); // [3, 4]
    let at = |r: usize, c: usize| f64::from(x[r * 4 + c]);
    // Split into [1, 3] columns, joined back in reverse order.
    let mut split = node("Split", &["x", "sizes"], "a", vec![a_int("axis", 1)]);
    split.output.push("b".to_string());
    let nodes = vec![
        constant("sizes", tensor_i(&[2], &[1, 3])),
        split,
        node("Concat", &["b", "a"], "out", vec![a_int("axis", 1)]),
    ];
    let out = run(
        &model(13, nodes, &[("x", &[3, 4])], ("out", &[3, 4])),
        &[("x", &[3, 4], x.clone())],
    );
    let expected: Vec<f64> = (0..3)
        .flat_map(|r| [at(r, 1), at(r, 2), at(r, 3), at(r, 0)])
        .collect();
    close(&out, &[3, 4], &expected);
    // Equal chunks (`num_outputs`, opset 18): 3 rows as 2 + 1.
    let mut split = node(
        "Split",
        &["x"],
        "a",
        vec![a_int("axis", 0), a_int("num_outputs", 2)],
    );
    split.output.push("b".to_string());
    let nodes = vec![
        split,
        node("Concat", &["b", "a"], "out", vec![a_int("axis", 0)]),
    ];
    let out = run(
        &model(18, nodes, &[("x", &[3, 4])], ("out", &[3, 4])),
        &[("x", &[3, 4], x.clone())],
    );
    let expected: Vec<f64> = [2, 0, 1]
        .iter()
        .flat_map(|&r| (0..4).map(move |c| at(r, c)))
        .collect();
    close(&out, &[3, 4], &expected);
    // Tile [3, 4] by [2, 1] -> [6, 4].
    let nodes = vec![
        constant("reps", tensor_i(&[2], &[2, 1])),
        node("Tile", &["x", "reps"], "out", vec![]),
    ];
    let out = run(
        &model(13, nodes, &[("x", &[3, 4])], ("out", &[6, 4])),
        &[("x", &[3, 4], x.clone())],
    );
    let expected: Vec<f64> = (0..6)
        .flat_map(|r| (0..4).map(move |c| at(r % 3, c)))
        .collect();
    close(&out, &[6, 4], &expected);
    // Trilu: the upper triangle from diagonal 1, and the lower one.
    for (upper, keep) in [
        (1, (|d: i64| d >= 1) as fn(i64) -> bool),
        (0, |d: i64| d <= 1),
    ] {
        let nodes = vec![
            constant("k", tensor_i(&[], &[1])),
            node("Trilu", &["x", "k"], "out", vec![a_int("upper", upper)]),
        ];
        let out = run(
            &model(14, nodes, &[("x", &[3, 4])], ("out", &[3, 4])),
            &[("x", &[3, 4], x.clone())],
        );
        let expected: Vec<f64> = (0..3)
            .flat_map(|r| (0..4).map(move |c| (r, c)))
            .map(|(r, c)| {
                if keep(c as i64 - r as i64) {
                    at(r, c)
                } else {
                    0.0
                }
            })
            .collect();
        close(&out, &[3, 4], &expected);
    }
}

#[test]
fn instance_and_group_normalization() {
    // x [2, 4, 3]: per (n, group) mean and variance over the group's channels and positions.
    let x = ramp(24, 0.7);
    let scale = [1.5f32, -0.5, 2.0, 0.25];
    let bias = [0.1f32, 0.2, -0.3, 0.4];
    let reference = |groups: usize, per_group: bool| -> Vec<f64> {
        let per = 4 / groups * 3;
        let mut out = vec![0.0; 24];
        for n in 0..2 {
            for g in 0..groups {
                let base = n * 12 + g * per;
                let v: Vec<f64> = x[base..base + per].iter().map(|&e| f64::from(e)).collect();
                let mean = v.iter().sum::<f64>() / per as f64;
                let var = v.iter().map(|e| (e - mean) * (e - mean)).sum::<f64>() / per as f64;
                for (i, e) in v.iter().enumerate() {
                    let c = (g * per + i) / 3;
                    let k = if per_group { g } else { c };
                    out[base + i] =
                        (e - mean) / (var + 1e-5).sqrt() * f64::from(scale[k]) + f64::from(bias[k]);
                }
            }
        }
        out
    };
    let nodes = vec![
        constant("s", tensor_f(&[4], &scale)),
        constant("b", tensor_f(&[4], &bias)),
        node("InstanceNormalization", &["x", "s", "b"], "out", vec![]),
    ];
    let out = run(
        &model(13, nodes, &[("x", &[2, 4, 3])], ("out", &[2, 4, 3])),
        &[("x", &[2, 4, 3], x.clone())],
    );
    close(&out, &[2, 4, 3], &reference(4, false));
    // Opset 21: scale and bias per channel; opset 18: per group.
    for (opset, len, per_group) in [(21, 4, false), (18, 2, true)] {
        let nodes = vec![
            constant("s", tensor_f(&[len], &scale[..len])),
            constant("b", tensor_f(&[len], &bias[..len])),
            node(
                "GroupNormalization",
                &["x", "s", "b"],
                "out",
                vec![a_int("num_groups", 2)],
            ),
        ];
        let out = run(
            &model(opset, nodes, &[("x", &[2, 4, 3])], ("out", &[2, 4, 3])),
            &[("x", &[2, 4, 3], x.clone())],
        );
        close(&out, &[2, 4, 3], &reference(2, per_group));
    }
}

#[test]
fn variadic_arg_extremes_and_cumsum() {
    let x = vec![
        3.0f32,
        -1.0,
        3.0,
        0.5,
        2.0,
        2.0,
        -4.0,
        2.0,
        f32::NAN,
        1.0,
        1.0,
        0.0,
    ];
    // Sum, Mean and Max of three inputs broadcast together.
    let nodes = vec![
        constant("b", tensor_f(&[4], &[1.0, 2.0, 3.0, 4.0])),
        constant("c", tensor_f(&[3, 1], &[10.0, 20.0, 30.0])),
        node("Sum", &["x", "b", "c"], "s", vec![]),
        node("Mean", &["x", "b", "c"], "m", vec![]),
        node("Max", &["x", "b", "c"], "mx", vec![]),
        node("Add", &["s", "m"], "sm", vec![]),
        node("Add", &["sm", "mx"], "out", vec![]),
    ];
    let out = run(
        &model(13, nodes, &[("x", &[3, 4])], ("out", &[3, 4])),
        &[("x", &[3, 4], x.clone())],
    );
    let expected: Vec<f64> = (0..12)
        .map(|i| {
            let (v, b, c) = (
                f64::from(x[i]),
                (i % 4 + 1) as f64,
                ((i / 4 + 1) * 10) as f64,
            );
            let s = v + b + c;
            let max = if v.is_nan() { v } else { v.max(b).max(c) };
            s + s / 3.0 + max
        })
        .collect();
    for (k, (a, e)) in out.to_f64().iter().zip(&expected).enumerate() {
        assert!(
            (a - e).abs() < 1e-4 || (a.is_nan() && e.is_nan()),
            "element {k}: {a} vs {e}"
        );
    }
    // ArgMax / ArgMin along the columns: the first extreme (the last with
    // select_last_index); a NaN wins, as in numpy.
    let arg = |op: &str, last: i64| {
        let attrs = vec![
            a_int("axis", 1),
            a_int("keepdims", 0),
            a_int("select_last_index", last),
        ];
        let bytes = model(
            13,
            vec![node(op, &["x"], "out", attrs)],
            &[("x", &[3, 4])],
            ("out", &[3]),
        );
        run(&bytes, &[("x", &[3, 4], x.clone())])
            .data()
            .to_i64()
            .to_vec()
    };
    assert_eq!(arg("ArgMax", 0), [0, 0, 0]);
    assert_eq!(arg("ArgMax", 1), [2, 3, 0]);
    assert_eq!(arg("ArgMin", 0), [1, 2, 0]);
    assert_eq!(arg("ArgMin", 1), [1, 2, 0]);
    // CumSum along the rows, in each mode.
    for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let nodes = vec![
            constant("axis", tensor_i(&[], &[0])),
            node(
                "CumSum",
                &["x", "axis"],
                "out",
                vec![a_int("exclusive", exclusive), a_int("reverse", reverse)],
            ),
        ];
        let bytes = model(14, nodes, &[("x", &[3, 4])], ("out", &[3, 4]));
        let y: Vec<f32> = x
            .iter()
            .map(|v| if v.is_nan() { 5.0 } else { *v })
            .collect();
        let out = run(&bytes, &[("x", &[3, 4], y.clone())]);
        let get = |r: usize, c: usize| f64::from(y[r * 4 + c]);
        let expected: Vec<f64> = (0..3)
            .flat_map(|r| (0..4).map(move |c| (r, c)))
            .map(|(r, c)| {
                (0..3)
                    .filter(|&k| match (reverse, exclusive) {
                        (0, 0) => k <= r,
                        (0, _) => k < r,
                        (_, 0) => k >= r,
                        _ => k > r,
                    })
                    .map(|k| get(k, c))
                    .sum()
            })
            .collect();
        close(&out, &[3, 4], &expected);
    }
}

#[test]
fn resize_nearest_and_linear() {
    let x = ramp(12, 1.0); // [1, 1, 3, 4]
    let at = |r: i64, c: i64| f64::from(x[(r.clamp(0, 2) * 4 + c.clamp(0, 3)) as usize]);
    let f32s = |name: &str, v: &[f32]| constant(name, tensor_f(&[v.len()], v));
    // Bilinear by sizes, half_pixel (the default) and align_corners.
    for align in [false, true] {
        let mut attrs = vec![a_str("mode", "linear")];
        if align {
            attrs.push(a_str("coordinate_transformation_mode", "align_corners"));
        }
        let nodes = vec![
            constant("sizes", tensor_i(&[4], &[1, 1, 5, 7])),
            node("Resize", &["x", "", "", "sizes"], "out", attrs),
        ];
        let out = run(
            &model(13, nodes, &[("x", &[1, 1, 3, 4])], ("out", &[1, 1, 5, 7])),
            &[("x", &[1, 1, 3, 4], x.clone())],
        );
        let source = |o: usize, len_in: f64, len_out: f64| {
            if align {
                o as f64 * (len_in - 1.0) / (len_out - 1.0)
            } else {
                (o as f64 + 0.5) * len_in / len_out - 0.5
            }
        };
        let expected: Vec<f64> = (0..5)
            .flat_map(|r| (0..7).map(move |c| (r, c)))
            .map(|(r, c)| {
                let (y, xx) = (source(r, 3.0, 5.0), source(c, 4.0, 7.0));
                let (y0, x0) = (y.floor(), xx.floor());
                let (wy, wx) = (y - y0, xx - x0);
                let (y0, x0) = (y0 as i64, x0 as i64);
                (1.0 - wy) * ((1.0 - wx) * at(y0, x0) + wx * at(y0, x0 + 1))
                    + wy * ((1.0 - wx) * at(y0 + 1, x0) + wx * at(y0 + 1, x0 + 1))
            })
            .collect();
        close(&out, &[1, 1, 5, 7], &expected);
    }
    // Nearest, asymmetric with floor, scales 2 and 1.5 (Upsample's rule).
    let nodes = vec![
        f32s("scales", &[1.0, 1.0, 2.0, 1.5]),
        node("Upsample", &["x", "scales"], "out", vec![]),
    ];
    let out = run(
        &model(9, nodes, &[("x", &[1, 1, 3, 4])], ("out", &[1, 1, 6, 6])),
        &[("x", &[1, 1, 3, 4], x.clone())],
    );
    let expected: Vec<f64> = (0..6)
        .flat_map(|r| (0..6).map(move |c| (r, c)))
        .map(|(r, c)| {
            at(
                (r as f64 / 2.0).floor() as i64,
                (c as f64 / 1.5).floor() as i64,
            )
        })
        .collect();
    close(&out, &[1, 1, 6, 6], &expected);
}

#[test]
fn inputs_and_outputs_keep_the_model_names() {
    // `y` is computed by the last of two nodes; `z` is an input passed through.
    let bytes = model(
        17,
        vec![
            node("Relu", &["x"], "t", vec![]),
            node("Neg", &["t"], "out.put-1", vec![]),
        ],
        &[("x", &[4])],
        ("out.put-1", &[4]),
    );
    let imported = import_bytes(&bytes, &ImportOptions::default()).unwrap();
    let graph = &imported.module.graphs[0];
    assert_eq!(graph.value(graph.params()[0]).name, "x");
    let out = graph.outputs().unwrap()[0];
    assert_eq!(graph.value(out).name, dcir_onnx::sanitize("out.put-1"));
}

#[test]
fn gather_of_one_index_is_a_slice_of_the_data() {
    // Q, K and V picked out of one projection as exporters write attention:
    // a scalar index (negative counts from the end) imports as a slice with
    // the dim dropped, a view the kernels read in place.
    let dims = [3usize, 2, 4];
    let x = ramp(24, 1.0);
    for (index, axis, out) in [(1i64, 0i64, [2usize, 4]), (-1, 1, [3, 4])] {
        let bytes = model(
            13,
            vec![
                constant("i", tensor_i(&[], &[index])),
                node("Gather", &["x", "i"], "y", vec![a_int("axis", axis)]),
            ],
            &[("x", &dims)],
            ("y", &out),
        );
        let imported = import_bytes(&bytes, &ImportOptions::default()).unwrap();
        let g = &imported.module.graphs[0];
        let kinds: Vec<&str> = g.all_ops().iter().map(|&o| g.op(o).kind.name()).collect();
        assert!(
            kinds.contains(&"slice") && !kinds.contains(&"gather"),
            "{kinds:?}"
        );
        let got = run(&bytes, &[("x", &dims, x.clone())]);
        let expected: Vec<f64> = (0..3)
            .flat_map(|a| (0..2).flat_map(move |b| (0..4).map(move |c| (a, b, c))))
            .filter(|&(a, b, _)| if axis == 0 { a == 1 } else { b == 1 })
            .map(|(a, b, c)| x[(a * 2 + b) * 4 + c] as f64)
            .collect();
        close(&got, &out, &expected);
    }
    let bytes = model(
        13,
        vec![
            constant("i", tensor_i(&[], &[3])),
            node("Gather", &["x", "i"], "y", vec![]),
        ],
        &[("x", &dims)],
        ("y", &[2, 4]),
    );
    assert!(
        import_err(&bytes).contains("index 3 is out of range for extent 3"),
        "{}",
        import_err(&bytes)
    );
}
