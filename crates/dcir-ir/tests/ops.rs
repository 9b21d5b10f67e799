//! Every op: a valid case through the builder, and an invalid case per rule
//! of the type rules (`shape.rs`) and the verifier (`verify.rs`), built with
//! the low-level graph API and checked by the message `verify_graph` gives.

// `&[x.clone()]` reads better than `std::slice::from_ref(&x)` in these tables.
#![allow(clippy::cloned_ref_to_slice_refs)]

use dcir_ir::{
    Attr, Attrs, BuildError, DType, Graph, GraphBuilder, Module, OpKind, TensorType, ValueId,
    print_graph, verify_graph, verify_module,
};

use DType::{BF16, Bool, F16, F32, I32, I64};

fn t(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims.to_vec())
}

fn attrs<const N: usize>(pairs: [(&str, Attr); N]) -> Attrs {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn ints<const N: usize>(v: [i64; N]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// Builds `@t(%p0, ..)` with the builder, `body` adding the op under test,
/// and returns the type of the value it returns (the graph verified).
fn build(
    params: &[TensorType],
    body: impl FnOnce(&mut GraphBuilder, &[ValueId]) -> Result<ValueId, BuildError>,
) -> TensorType {
    let mut b = GraphBuilder::new("t");
    let ps: Vec<ValueId> = (params.iter())
        .map(|ty| b.param("p", ty.clone()).unwrap())
        .collect();
    let out = body(&mut b, &ps).unwrap();
    let ty = b.ty(out).clone();
    let graph = b.finish(&[out]).unwrap();
    assert_eq!(verify_graph(&graph), Ok(()));
    ty
}

/// The inferred type of `kind` over parameters of `params` (built and verified).
fn infer<const N: usize>(kind: OpKind, params: &[TensorType], a: [(&str, Attr); N]) -> TensorType {
    build(params, |b, ps| b.op(kind, ps, attrs(a)))
}

/// Checks a declared op of type `ty` over parameters of `params` builds and verifies.
fn declared<const N: usize>(
    kind: OpKind,
    params: &[TensorType],
    a: [(&str, Attr); N],
    ty: TensorType,
) {
    assert_eq!(
        build(params, |b, ps| b.op_declared(
            kind,
            ps,
            attrs(a),
            ty.clone()
        )),
        ty
    );
}

/// `@t(%p0, ..) -> (result) { %r = kind %p0, .. {attrs} : result; return %r }`
/// made without any check; the attributes are normalized when they fit the
/// schema and kept as given otherwise.
fn single<const N: usize>(
    kind: OpKind,
    params: &[TensorType],
    a: [(&str, Attr); N],
    result: TensorType,
) -> Graph {
    let raw = attrs(a);
    let a = kind.normalize_attrs(raw.clone()).unwrap_or(raw);
    let mut g = Graph::new("t");
    let ps: Vec<ValueId> = (params.iter().enumerate())
        .map(|(i, ty)| g.add_param(format!("p{i}"), ty.clone()).unwrap())
        .collect();
    let op = g
        .create_op(kind, ps, a, vec![("r".into(), result.clone())])
        .unwrap();
    g.append_op(g.body(), op);
    let r = g.op(op).results[0];
    finish(&mut g, &[r]);
    g
}

/// Appends `return values` and declares their types.
fn finish(g: &mut Graph, values: &[ValueId]) {
    let types = values.iter().map(|&v| g.ty(v).clone()).collect();
    g.set_result_types(types);
    let ret = g
        .create_op(OpKind::Return, values.to_vec(), Attrs::new(), Vec::new())
        .unwrap();
    g.append_op(g.body(), ret);
}

/// Appends an op with one result named `name` to `block`.
fn push(
    g: &mut Graph,
    block: dcir_ir::BlockId,
    kind: OpKind,
    operands: &[ValueId],
    name: &str,
    ty: TensorType,
) -> ValueId {
    let op = g
        .create_op(
            kind,
            operands.to_vec(),
            Attrs::new(),
            vec![(name.into(), ty)],
        )
        .unwrap();
    g.append_op(block, op);
    g.op(op).results[0]
}

#[track_caller]
fn assert_invalid(g: &Graph, needle: &str) {
    let errors = verify_graph(g).expect_err("the graph should not verify");
    assert!(
        errors.iter().any(|e| e.message.contains(needle)),
        "no error contains {needle:?}: {errors:#?}\n{}",
        print_graph(g)
    );
}

#[track_caller]
fn assert_valid(g: &Graph) {
    assert_eq!(verify_graph(g), Ok(()), "{}", print_graph(g));
}

#[test]
fn elementwise_binary() {
    for kind in [
        OpKind::Add,
        OpKind::Sub,
        OpKind::Mul,
        OpKind::Div,
        OpKind::Max,
        OpKind::Min,
    ] {
        for dtype in [F32, F16, BF16, I32, I64] {
            let x = t(dtype, &[2, 3]);
            assert_eq!(infer(kind, &[x.clone(), x.clone()], []), x);
        }
        let bool_ty = t(Bool, &[2]);
        let g = single(kind, &[bool_ty.clone(), bool_ty.clone()], [], bool_ty);
        assert_invalid(&g, "needs a numeric operand, found bool[2]");
    }
    let x = t(BF16, &[4]);
    assert_eq!(infer(OpKind::Pow, &[x.clone(), x.clone()], []), x);
    let i = t(I32, &[4]);
    assert_eq!(infer(OpKind::Pow, &[i.clone(), i.clone()], []), i);
    let p = t(Bool, &[4]);
    let g = single(OpKind::Pow, &[p.clone(), p.clone()], [], p);
    assert_invalid(&g, "`pow` needs a numeric operand, found bool[4]");

    let (a, b) = (t(F32, &[2, 3]), t(F32, &[3, 2]));
    let g = single(OpKind::Add, &[a.clone(), b], [], a.clone());
    assert_invalid(&g, "needs operands of one type (broadcast explicitly)");
    let g = single(OpKind::Add, &[a.clone(), a.with_dtype(F16)], [], a.clone());
    assert_invalid(&g, "needs operands of one type");
    let g = single(OpKind::Add, &[a.clone(), a.clone()], [], t(F32, &[6]));
    assert_invalid(
        &g,
        "`add` produces f32[2,3], but the written type is f32[6]",
    );
    let g = single(OpKind::Mul, &[a.clone()], [], a.clone());
    assert_invalid(&g, "`mul` takes exactly 2 operands, found 1");
    let g = single(
        OpKind::Sub,
        &[a.clone(), a.clone()],
        [("alpha", Attr::Int(1))],
        a,
    );
    assert_invalid(&g, "`sub` takes no attributes, found `alpha`");
}

#[test]
fn elementwise_unary() {
    let float_only = [
        OpKind::Gelu,
        OpKind::Erf,
        OpKind::Tanh,
        OpKind::Sigmoid,
        OpKind::Exp,
        OpKind::Log,
        OpKind::Sqrt,
        OpKind::Rsqrt,
    ];
    for kind in float_only {
        for dtype in [F32, F16, BF16] {
            assert_eq!(infer(kind, &[t(dtype, &[3])], []), t(dtype, &[3]));
        }
        let g = single(kind, &[t(I64, &[3])], [], t(I64, &[3]));
        assert_invalid(&g, &format!("`{}` needs a float operand", kind.name()));
    }
    for kind in [OpKind::Relu, OpKind::Neg, OpKind::Abs] {
        assert_eq!(infer(kind, &[t(I32, &[])], []), t(I32, &[]));
        assert_eq!(infer(kind, &[t(F16, &[1, 2])], []), t(F16, &[1, 2]));
        let g = single(kind, &[t(Bool, &[3])], [], t(Bool, &[3]));
        assert_invalid(&g, "needs a numeric operand");
    }
    let g = single(OpKind::Relu, &[t(F32, &[3])], [], t(F32, &[4]));
    assert_invalid(&g, "`relu` produces f32[3], but the written type is f32[4]");
    let g = single(
        OpKind::Relu,
        &[t(F32, &[3]), t(F32, &[3])],
        [],
        t(F32, &[3]),
    );
    assert_invalid(&g, "`relu` takes exactly 1 operands, found 2");
}

#[test]
fn clip() {
    let x = t(I32, &[2]);
    let bounds = |lo: f64, hi: f64| [("min", Attr::Float(lo)), ("max", Attr::Float(hi))];
    assert_eq!(infer(OpKind::Clip, &[x.clone()], bounds(0.0, 6.0)), x);
    assert_eq!(infer(OpKind::Clip, &[x.clone()], bounds(1.0, 1.0)), x);
    // Integer literals are accepted where floats are wanted.
    let int_bounds = [("min", Attr::Int(0)), ("max", Attr::Int(6))];
    assert_eq!(infer(OpKind::Clip, &[x.clone()], int_bounds), x);

    let g = single(OpKind::Clip, &[x.clone()], bounds(6.0, 0.0), x.clone());
    assert_invalid(&g, "clip needs min <= max, found min = 6.0, max = 0.0");
    let g = single(OpKind::Clip, &[x.clone()], bounds(f64::NAN, 0.0), x.clone());
    assert_invalid(&g, "clip needs min <= max");
    let g = single(
        OpKind::Clip,
        &[t(Bool, &[2])],
        bounds(0.0, 1.0),
        t(Bool, &[2]),
    );
    assert_invalid(&g, "needs a numeric operand");
    let g = single(
        OpKind::Clip,
        &[x.clone()],
        [("min", Attr::Float(0.0))],
        x.clone(),
    );
    assert_invalid(&g, "`clip` requires attribute `max`");
    let g = single(
        OpKind::Clip,
        &[x.clone()],
        [("min", Attr::Str("0".into())), ("max", Attr::Float(1.0))],
        x,
    );
    assert_invalid(&g, "attribute `min` of `clip` must be a float");
}

#[test]
fn gelu() {
    let x = t(F32, &[2]);
    let tanh = [("approximate", Attr::Str("tanh".into()))];
    assert_eq!(infer(OpKind::Gelu, &[x.clone()], tanh), x);
    let fast = [("approximate", Attr::Str("fast".into()))];
    let g = single(OpKind::Gelu, &[x.clone()], fast, x.clone());
    assert_invalid(&g, "gelu's `approximate` must be \"none\" or \"tanh\"");
    let g = single(
        OpKind::Gelu,
        &[x.clone()],
        [("approximate", Attr::Int(1))],
        x,
    );
    assert_invalid(&g, "attribute `approximate` of `gelu` must be a string");
}

#[test]
fn conv2d() {
    let x = t(F32, &[1, 4, 5, 5]);
    let strided = [
        ("stride", ints([2, 2])),
        ("pad", ints([1, 1, 1, 1])),
        ("groups", Attr::Int(2)),
    ];
    let w = t(F32, &[8, 2, 3, 3]);
    assert_eq!(
        infer(OpKind::Conv2d, &[x.clone(), w.clone()], strided),
        t(F32, &[1, 8, 3, 3])
    );
    let depthwise = [("groups", Attr::Int(4)), ("dilation", ints([2, 1]))];
    let dw = t(F32, &[4, 1, 2, 3]);
    assert_eq!(
        infer(OpKind::Conv2d, &[x.clone(), dw], depthwise),
        t(F32, &[1, 4, 3, 3])
    );
    let asymmetric = [("pad", ints([0, 1, 2, 0])), ("stride", ints([1, 3]))];
    let b = t(BF16, &[2, 4, 1, 1]);
    assert_eq!(
        infer(OpKind::Conv2d, &[x.with_dtype(BF16), b], asymmetric),
        t(BF16, &[1, 2, 7, 2])
    );

    let conv = |x: &TensorType, w: &TensorType, a: Attrs| {
        let a = OpKind::Conv2d.normalize_attrs(a.clone()).unwrap_or(a);
        let mut g = Graph::new("t");
        let px = g.add_param("x", x.clone()).unwrap();
        let pw = g.add_param("w", w.clone()).unwrap();
        let out = t(x.dtype, &[1, 8, 3, 3]);
        let op = g
            .create_op(OpKind::Conv2d, vec![px, pw], a, vec![("r".into(), out)])
            .unwrap();
        g.append_op(g.body(), op);
        let r = g.op(op).results[0];
        finish(&mut g, &[r]);
        g
    };
    let w1 = t(F32, &[8, 4, 3, 3]);
    let cases: Vec<(TensorType, TensorType, Attrs, &str)> = vec![
        (
            x.with_dtype(I32),
            w1.with_dtype(I32),
            Attrs::new(),
            "`conv2d` needs a float operand",
        ),
        (
            t(F32, &[4, 5, 5]),
            w1.clone(),
            Attrs::new(),
            "`conv2d` needs x of rank 4",
        ),
        (
            x.clone(),
            t(F32, &[8, 4, 3]),
            Attrs::new(),
            "`conv2d` needs w of rank 4",
        ),
        (
            x.clone(),
            w1.with_dtype(F16),
            Attrs::new(),
            "conv2d needs x and w of one dtype",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("stride", ints([-1, 1]))]),
            "every entry of `stride` must be > 0, found -1",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("stride", ints([1]))]),
            "`stride` needs 2 entries, found 1",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("pad", ints([0, -1, 0, 0]))]),
            "every entry of `pad` must be >= 0, found -1",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("pad", ints([1, 1]))]),
            "`pad` needs 4 entries, found 2",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("dilation", ints([1, 0]))]),
            "every entry of `dilation` must be > 0, found 0",
        ),
        (
            x.clone(),
            t(F32, &[6, 1, 3, 3]),
            attrs([("groups", Attr::Int(3))]),
            "`groups` = 3 must be > 0 and divide the input channels (4)",
        ),
        (
            x.clone(),
            t(F32, &[3, 2, 3, 3]),
            attrs([("groups", Attr::Int(2))]),
            "and output channels (3)",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("groups", Attr::Int(0))]),
            "`groups` = 0 must be > 0",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("groups", Attr::Int(-2))]),
            "`groups` = -2 must be > 0",
        ),
        (
            x.clone(),
            t(F32, &[8, 4, 3, 3]),
            attrs([("groups", Attr::Int(2))]),
            "needs dim 1 = input channels / groups = 4 / 2 = 2, found 4",
        ),
        (
            x.clone(),
            t(F32, &[8, 4, 6, 3]),
            Attrs::new(),
            "the dilated 6x3 kernel does not fit the padded 5x5 input",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("dilation", ints([3, 1]))]),
            "the dilated 3x3 kernel does not fit",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("groups", Attr::Float(1.0))]),
            "attribute `groups` of `conv2d` must be an integer",
        ),
        (
            x.clone(),
            w1.clone(),
            attrs([("stride", ints([2, 2]))]),
            "`conv2d` produces f32[1,8,2,2], but the written type is f32[1,8,3,3]",
        ),
    ];
    for (x, w, a, needle) in cases {
        assert_invalid(&conv(&x, &w, a), needle);
    }
    // The control: the same construction with fitting attributes verifies.
    let fitting = attrs([("pad", ints([1, 1, 1, 1])), ("stride", ints([2, 2]))]);
    assert_valid(&conv(&x, &w1, fitting));
}

#[test]
fn matmul() {
    let (a, b) = (t(F32, &[2, 3, 4]), t(F32, &[2, 4, 5]));
    assert_eq!(infer(OpKind::Matmul, &[a, b], []), t(F32, &[2, 3, 5]));
    let transposed = [
        ("transpose_a", Attr::Bool(true)),
        ("transpose_b", Attr::Bool(true)),
    ];
    let (a, b) = (t(I64, &[4, 3]), t(I64, &[5, 4]));
    assert_eq!(infer(OpKind::Matmul, &[a, b], transposed), t(I64, &[3, 5]));

    let mm = |a: TensorType, b: TensorType, needle: &str| {
        let g = single(OpKind::Matmul, &[a, b], [], t(F32, &[3, 5]));
        assert_invalid(&g, needle);
    };
    mm(
        t(Bool, &[3, 4]),
        t(Bool, &[4, 5]),
        "`matmul` needs a numeric operand",
    );
    mm(
        t(F32, &[3, 4]),
        t(F16, &[4, 5]),
        "matmul needs a and b of one dtype",
    );
    mm(
        t(F32, &[4]),
        t(F32, &[4]),
        "matmul needs operands of one rank >= 2",
    );
    mm(
        t(F32, &[1, 3, 4]),
        t(F32, &[4, 5]),
        "matmul needs operands of one rank >= 2",
    );
    mm(
        t(F32, &[2, 3, 4]),
        t(F32, &[3, 4, 5]),
        "matmul needs equal batch dims",
    );
    mm(
        t(F32, &[3, 4]),
        t(F32, &[3, 5]),
        "matmul contraction dims differ: 4",
    );
}

#[test]
fn broadcast() {
    let x = t(F32, &[3]);
    declared(
        OpKind::Broadcast,
        &[x.clone()],
        [("dims", ints([1]))],
        t(F32, &[2, 3, 4]),
    );
    let y = t(Bool, &[1, 3]);
    declared(
        OpKind::Broadcast,
        &[y],
        [("dims", ints([0, 2]))],
        t(Bool, &[5, 2, 3]),
    );
    declared(
        OpKind::Broadcast,
        &[t(I32, &[])],
        [("dims", ints([]))],
        t(I32, &[2]),
    );

    let bc = |dims: Attr, out: &[usize], needle: &str| {
        let g = single(
            OpKind::Broadcast,
            &[t(F32, &[1, 3])],
            [("dims", dims)],
            t(F32, out),
        );
        assert_invalid(&g, needle);
    };
    bc(ints([0]), &[2, 3], "`dims` needs 2 entries, found 1");
    bc(
        ints([1, 0]),
        &[3, 3],
        "broadcast `dims` must be strictly increasing, found [1, 0]",
    );
    bc(ints([0, 0]), &[3, 3], "strictly increasing");
    bc(
        ints([0, 2]),
        &[2, 3],
        "`dims entry` = 2 is out of range for rank 2",
    );
    bc(ints([-1, 1]), &[2, 3], "`dims entry` = -1 is out of range");
    bc(ints([0, 1]), &[2, 4], "extents must be equal or 1");
    let g = single(
        OpKind::Broadcast,
        &[x.clone()],
        [("dims", ints([0]))],
        t(F16, &[3]),
    );
    assert_invalid(&g, "broadcast keeps the dtype: f32 to f16");
    let g = single(OpKind::Broadcast, &[x], [], t(F32, &[3]));
    assert_invalid(&g, "`broadcast` requires attribute `dims`");
}

#[test]
fn reshape() {
    declared(OpKind::Reshape, &[t(I64, &[2, 3])], [], t(I64, &[3, 1, 2]));
    declared(OpKind::Reshape, &[t(F32, &[1, 1])], [], t(F32, &[]));
    let g = single(OpKind::Reshape, &[t(F32, &[2, 3])], [], t(F32, &[5]));
    assert_invalid(
        &g,
        "reshape must keep the element count: f32[2,3] has 6 elements, f32[5] has 5",
    );
    let g = single(OpKind::Reshape, &[t(F32, &[2, 3])], [], t(I32, &[6]));
    assert_invalid(&g, "reshape keeps the dtype: f32 to i32");
    let g = single(OpKind::Reshape, &[], [], t(F32, &[6]));
    assert_invalid(&g, "`reshape` takes exactly 1 operands, found 0");
}

#[test]
fn transpose() {
    let x = t(F16, &[2, 3, 4]);
    let perm = |p: Attr| [("perm", p)];
    assert_eq!(
        infer(OpKind::Transpose, &[x.clone()], perm(ints([2, 0, 1]))),
        t(F16, &[4, 2, 3])
    );
    assert_eq!(
        infer(OpKind::Transpose, &[t(I32, &[])], perm(ints([]))),
        t(I32, &[])
    );

    let tr = |p: Attr, needle: &str| {
        let g = single(OpKind::Transpose, &[x.clone()], perm(p), x.clone());
        assert_invalid(&g, needle);
    };
    tr(
        ints([0, 0, 1]),
        "`perm` [0, 0, 1] is not a permutation: 0 repeats",
    );
    tr(ints([0, 1]), "`perm` needs 3 entries, found 2");
    tr(
        ints([0, 1, 3]),
        "`perm entry` = 3 is out of range for rank 3",
    );
    tr(ints([-1, 0, 1]), "`perm entry` = -1 is out of range");
    tr(
        ints([1, 0, 2]),
        "`transpose` produces f16[3,2,4], but the written type is f16[2,3,4]",
    );
}

#[test]
fn slice() {
    let x = t(F32, &[4, 6]);
    let range = |s: Attr, e: Attr| [("starts", s), ("ends", e)];
    let stepped = [
        ("starts", ints([1, 0])),
        ("ends", ints([3, 6])),
        ("steps", ints([1, 4])),
    ];
    assert_eq!(infer(OpKind::Slice, &[x.clone()], stepped), t(F32, &[2, 2]));
    let empty = range(ints([2, 6]), ints([2, 6]));
    assert_eq!(infer(OpKind::Slice, &[x.clone()], empty), t(F32, &[0, 0]));
    // A step larger than the extent takes the first element (no overflow).
    let huge_step = [
        ("starts", ints([1, 0])),
        ("ends", ints([3, 6])),
        ("steps", ints([1, i64::MAX])),
    ];
    assert_eq!(
        infer(OpKind::Slice, &[x.clone()], huge_step),
        t(F32, &[2, 1])
    );

    let sl = |starts: Attr, ends: Attr, needle: &str| {
        let g = single(OpKind::Slice, &[x.clone()], range(starts, ends), x.clone());
        assert_invalid(&g, needle);
    };
    sl(
        ints([0, 0]),
        ints([5, 6]),
        "slice of dim 0 needs 0 <= start <= end <= 4, found 0..5",
    );
    sl(
        ints([0, 4]),
        ints([4, 3]),
        "slice of dim 1 needs 0 <= start <= end <= 6, found 4..3",
    );
    sl(ints([-1, 0]), ints([4, 6]), "found -1..4");
    sl(ints([0]), ints([4, 6]), "`starts` needs 2 entries, found 1");
    sl(
        ints([0, 0]),
        ints([4, 6, 1]),
        "`ends` needs 2 entries, found 3",
    );
    sl(
        ints([1, 0]),
        ints([4, 6]),
        "`slice` produces f32[3,6], but the written type is f32[4,6]",
    );
    for (steps, needle) in [
        (ints([1, 0]), "every entry of `steps` must be > 0, found 0"),
        (
            ints([1, -2]),
            "every entry of `steps` must be > 0, found -2",
        ),
        (ints([1]), "`steps` needs 2 entries, found 1"),
    ] {
        let a = [
            ("starts", ints([0, 0])),
            ("ends", ints([4, 6])),
            ("steps", steps),
        ];
        let g = single(OpKind::Slice, &[x.clone()], a, x.clone());
        assert_invalid(&g, needle);
    }
}

#[test]
fn concat() {
    let axis = |a: i64| [("axis", Attr::Int(a))];
    let (a, b) = (t(I32, &[2, 3]), t(I32, &[2, 5]));
    assert_eq!(
        infer(OpKind::Concat, &[a.clone(), b.clone(), a.clone()], axis(1)),
        t(I32, &[2, 11])
    );
    assert_eq!(
        infer(OpKind::Concat, &[t(Bool, &[4])], axis(0)),
        t(Bool, &[4])
    );

    let cc = |operands: &[TensorType], a: i64, needle: &str| {
        let g = single(OpKind::Concat, operands, axis(a), t(I32, &[2, 8]));
        assert_invalid(&g, needle);
    };
    cc(
        &[a.clone(), b.clone()],
        2,
        "`axis` = 2 is out of range for rank 2",
    );
    cc(&[a.clone(), b.clone()], -1, "`axis` = -1 is out of range");
    cc(
        &[a.clone(), b.clone()],
        0,
        "concat along axis 0 needs equal dtypes and equal dims off the axis",
    );
    cc(&[a.clone(), b.with_dtype(I64)], 1, "needs equal dtypes");
    cc(
        &[a.clone(), t(I32, &[2, 3, 1])],
        1,
        "needs equal dtypes and equal dims off the axis",
    );
    cc(&[], 0, "`concat` takes at least 1 operands, found 0");
    let g = single(OpKind::Concat, &[a.clone()], [], a);
    assert_invalid(&g, "`concat` requires attribute `axis`");
}

#[test]
fn pad() {
    let x = t(F32, &[2, 3]);
    let a = [
        ("low", ints([1, 0])),
        ("high", ints([0, 2])),
        ("value", Attr::Float(-0.5)),
    ];
    assert_eq!(infer(OpKind::Pad, &[x.clone()], a), t(F32, &[3, 5]));

    let pd = |low: Attr, high: Attr, needle: &str| {
        let g = single(
            OpKind::Pad,
            &[x.clone()],
            [("low", low), ("high", high)],
            x.clone(),
        );
        assert_invalid(&g, needle);
    };
    pd(
        ints([-1, 0]),
        ints([0, 0]),
        "every entry of `low` must be >= 0, found -1",
    );
    pd(
        ints([0, 0]),
        ints([0, -3]),
        "every entry of `high` must be >= 0, found -3",
    );
    pd(ints([0]), ints([0, 0]), "`low` needs 2 entries, found 1");
    pd(
        ints([0, 0]),
        ints([0, 0, 0]),
        "`high` needs 2 entries, found 3",
    );
    pd(
        ints([1, 0]),
        ints([0, 0]),
        "`pad` produces f32[3,3], but the written type is f32[2,3]",
    );
    // Huge pads are an error, not an arithmetic overflow.
    pd(ints([i64::MAX, 0]), ints([i64::MAX, 0]), "overflow");
}

#[test]
fn gather() {
    let data = t(F32, &[5, 4]);
    let idx = t(I64, &[2, 3]);
    assert_eq!(
        infer(OpKind::Gather, &[data.clone(), idx.clone()], []),
        t(F32, &[2, 3, 4])
    );
    let scalar_idx = t(I32, &[]);
    let axis1 = [("axis", Attr::Int(1))];
    assert_eq!(
        infer(OpKind::Gather, &[data.clone(), scalar_idx], axis1),
        t(F32, &[5])
    );

    let g = single(
        OpKind::Gather,
        &[data.clone(), idx.with_dtype(F32)],
        [],
        t(F32, &[2, 3, 4]),
    );
    assert_invalid(&g, "gather indices must be i32 or i64, found f32[2,3]");
    let g = single(
        OpKind::Gather,
        &[data.clone(), idx.with_dtype(Bool)],
        [],
        t(F32, &[2, 3, 4]),
    );
    assert_invalid(&g, "gather indices must be i32 or i64");
    let axis2 = [("axis", Attr::Int(2))];
    let g = single(
        OpKind::Gather,
        &[data.clone(), idx.clone()],
        axis2,
        data.clone(),
    );
    assert_invalid(&g, "`axis` = 2 is out of range for rank 2");
    let g = single(OpKind::Gather, &[t(F32, &[]), idx], [], data);
    assert_invalid(&g, "`axis` = 0 is out of range for rank 0");
}

#[test]
fn reductions() {
    let x = t(I32, &[2, 3, 4]);
    let axes = |v: Attr, keep: bool| [("axes", v), ("keepdims", Attr::Bool(keep))];
    assert_eq!(
        infer(OpKind::ReduceSum, &[x.clone()], axes(ints([0, 2]), false)),
        t(I32, &[3])
    );
    assert_eq!(
        infer(OpKind::ReduceMax, &[x.clone()], axes(ints([0, 2]), true)),
        t(I32, &[1, 3, 1])
    );
    let all = axes(ints([0, 1, 2]), false);
    assert_eq!(
        infer(OpKind::ReduceMean, &[x.with_dtype(F16)], all),
        t(F16, &[])
    );

    let rd = |kind: OpKind, x: &TensorType, v: Attr, needle: &str| {
        let g = single(kind, &[x.clone()], axes(v, false), t(x.dtype, &[3]));
        assert_invalid(&g, needle);
    };
    rd(
        OpKind::ReduceMean,
        &x,
        ints([0, 2]),
        "`reduce_mean` needs a float operand",
    );
    rd(
        OpKind::ReduceSum,
        &x.with_dtype(Bool),
        ints([0, 2]),
        "`reduce_sum` needs a numeric operand",
    );
    rd(
        OpKind::ReduceMax,
        &x,
        ints([]),
        "`axes` must name at least one dim",
    );
    rd(
        OpKind::ReduceSum,
        &x,
        ints([2, 0]),
        "`axes` must be strictly increasing, found [2, 0]",
    );
    rd(OpKind::ReduceSum, &x, ints([1, 1]), "strictly increasing");
    rd(
        OpKind::ReduceSum,
        &x,
        ints([0, 3]),
        "`axes entry` = 3 is out of range for rank 3",
    );
    rd(
        OpKind::ReduceSum,
        &x,
        ints([-1]),
        "`axes entry` = -1 is out of range",
    );
    rd(
        OpKind::ReduceSum,
        &x,
        ints([0]),
        "`reduce_sum` produces i32[3,4], but the written type is i32[3]",
    );
}

#[test]
fn softmax() {
    let x = t(BF16, &[2, 3]);
    assert_eq!(
        infer(OpKind::Softmax, &[x.clone()], [("axis", Attr::Int(1))]),
        x
    );
    let g = single(
        OpKind::Softmax,
        &[x.clone()],
        [("axis", Attr::Int(2))],
        x.clone(),
    );
    assert_invalid(&g, "`axis` = 2 is out of range for rank 2");
    let g = single(
        OpKind::Softmax,
        &[t(F32, &[])],
        [("axis", Attr::Int(0))],
        t(F32, &[]),
    );
    assert_invalid(&g, "`axis` = 0 is out of range for rank 0");
    let g = single(
        OpKind::Softmax,
        &[t(I64, &[2])],
        [("axis", Attr::Int(0))],
        t(I64, &[2]),
    );
    assert_invalid(&g, "`softmax` needs a float operand");
    let g = single(OpKind::Softmax, &[x.clone()], [], x);
    assert_invalid(&g, "`softmax` requires attribute `axis`");
}

#[test]
fn layernorm() {
    let x = t(F32, &[2, 3, 4]);
    let norm = t(F32, &[3, 4]);
    let a = |axis: i64, eps: f64| [("axis", Attr::Int(axis)), ("epsilon", Attr::Float(eps))];
    let operands = [x.clone(), norm.clone(), norm.clone()];
    assert_eq!(infer(OpKind::Layernorm, &operands, a(1, 1e-6)), x);

    let ln = |operands: &[TensorType], axis: i64, eps: f64, needle: &str| {
        let g = single(OpKind::Layernorm, operands, a(axis, eps), x.clone());
        assert_invalid(&g, needle);
    };
    ln(
        &operands,
        1,
        0.0,
        "`epsilon` must be finite and > 0, found 0.0",
    );
    ln(&operands, 1, -1e-5, "`epsilon` must be finite and > 0");
    ln(
        &operands,
        1,
        f64::INFINITY,
        "`epsilon` must be finite and > 0, found inf",
    );
    ln(
        &operands,
        1,
        f64::NAN,
        "`epsilon` must be finite and > 0, found NaN",
    );
    ln(&operands, 3, 1e-5, "`axis` = 3 is out of range for rank 3");
    ln(
        &operands,
        2,
        1e-5,
        "layernorm scale must be f32[4] (x's dims from axis 2), found f32[3,4]",
    );
    let bad_bias = [x.clone(), norm.clone(), norm.with_dtype(F16)];
    ln(&bad_bias, 1, 1e-5, "layernorm bias must be f32[3,4]");
    let ints_x = [x.with_dtype(I32), norm.clone(), norm];
    ln(&ints_x, 1, 1e-5, "`layernorm` needs a float operand");
    ln(
        &operands[..2],
        1,
        1e-5,
        "`layernorm` takes exactly 3 operands, found 2",
    );
}

#[test]
fn batchnorm() {
    let x = t(F16, &[2, 3, 4, 4]);
    let c = t(F16, &[3]);
    let operands = [x.clone(), c.clone(), c.clone(), c.clone(), c.clone()];
    assert_eq!(infer(OpKind::Batchnorm, &operands, []), x);
    assert_eq!(
        infer(
            OpKind::Batchnorm,
            &[
                t(F32, &[5, 2]),
                t(F32, &[2]),
                t(F32, &[2]),
                t(F32, &[2]),
                t(F32, &[2])
            ],
            []
        ),
        t(F32, &[5, 2])
    );

    let bn = |operands: &[TensorType], eps: f64, needle: &str| {
        let g = single(
            OpKind::Batchnorm,
            operands,
            [("epsilon", Attr::Float(eps))],
            operands[0].clone(),
        );
        assert_invalid(&g, needle);
    };
    let scalar = t(F16, &[3]);
    bn(
        &[scalar.clone(), c.clone(), c.clone(), c.clone(), c.clone()],
        1e-5,
        "batchnorm needs x of rank >= 2 (channels at dim 1), found f16[3]",
    );
    bn(
        &[x.clone(), c.clone(), c.clone(), c.clone(), t(F16, &[4])],
        1e-5,
        "batchnorm var must be f16[3], found f16[4]",
    );
    bn(
        &[x.clone(), t(F32, &[3]), c.clone(), c.clone(), c.clone()],
        1e-5,
        "batchnorm scale must be f16[3]",
    );
    bn(&operands, f64::NAN, "`epsilon` must be finite and > 0");
    bn(
        &operands[..4],
        1e-5,
        "`batchnorm` takes exactly 5 operands, found 4",
    );
    bn(
        &[x.with_dtype(I32), c.clone(), c.clone(), c.clone(), c],
        1e-5,
        "`batchnorm` needs a float operand",
    );
}

#[test]
fn maxpool2d() {
    let x = t(I64, &[1, 2, 5, 5]);
    let a = [("kernel", ints([2, 2])), ("stride", ints([2, 2]))];
    assert_eq!(
        infer(OpKind::Maxpool2d, &[x.clone()], a),
        t(I64, &[1, 2, 2, 2])
    );
    let padded = [
        ("kernel", ints([3, 2])),
        ("stride", ints([2, 1])),
        ("pad", ints([1, 0, 2, 1])),
        ("dilation", ints([1, 2])),
    ];
    assert_eq!(
        infer(OpKind::Maxpool2d, &[x.clone()], padded),
        t(I64, &[1, 2, 3, 4])
    );

    let mp = |x: &TensorType, kernel: Attr, pad: Attr, needle: &str| {
        let g = single(
            OpKind::Maxpool2d,
            &[x.clone()],
            [("kernel", kernel), ("pad", pad)],
            x.clone(),
        );
        assert_invalid(&g, needle);
    };
    let no_pad = || ints([0, 0, 0, 0]);
    mp(
        &x,
        ints([0, 2]),
        no_pad(),
        "every entry of `kernel` must be > 0, found 0",
    );
    mp(&x, ints([2]), no_pad(), "`kernel` needs 2 entries, found 1");
    mp(
        &x,
        ints([2, 2]),
        ints([0, 2, 0, 0]),
        "`pad` entry 2 must be smaller than the kernel extent 2",
    );
    mp(
        &x,
        ints([2, 2]),
        ints([0, 0, -1, 0]),
        "every entry of `pad` must be >= 0, found -1",
    );
    mp(
        &x,
        ints([6, 2]),
        no_pad(),
        "the 6x2 window does not fit the padded 5x5 input",
    );
    mp(
        &t(I64, &[2, 5, 5]),
        ints([2, 2]),
        no_pad(),
        "`maxpool2d` needs x of rank 4",
    );
    mp(
        &x.with_dtype(Bool),
        ints([2, 2]),
        no_pad(),
        "`maxpool2d` needs a numeric operand",
    );
    let g = single(
        OpKind::Maxpool2d,
        &[x.clone()],
        [("kernel", ints([2, 2])), ("stride", ints([0, 1]))],
        x.clone(),
    );
    assert_invalid(&g, "every entry of `stride` must be > 0, found 0");
    let g = single(
        OpKind::Maxpool2d,
        &[x.clone()],
        [("kernel", ints([2, 2])), ("dilation", ints([1, -1]))],
        x.clone(),
    );
    assert_invalid(&g, "every entry of `dilation` must be > 0, found -1");
    let g = single(OpKind::Maxpool2d, &[x.clone()], [], x);
    assert_invalid(&g, "`maxpool2d` requires attribute `kernel`");
}

#[test]
fn avgpool2d() {
    let x = t(F16, &[2, 3, 4, 4]);
    let a = [
        ("kernel", ints([3, 3])),
        ("pad", ints([1, 1, 1, 1])),
        ("count_include_pad", Attr::Bool(true)),
    ];
    assert_eq!(infer(OpKind::Avgpool2d, &[x.clone()], a), x);

    let g = single(
        OpKind::Avgpool2d,
        &[x.with_dtype(I32)],
        [("kernel", ints([2, 2]))],
        x.with_dtype(I32),
    );
    assert_invalid(&g, "`avgpool2d` needs a float operand");
    // Dilated: each window spans (k - 1) * d + 1 inputs.
    let dilated = [("kernel", ints([2, 2])), ("dilation", ints([2, 2]))];
    let out = t(
        F16,
        &[x.dims()[0], x.dims()[1], x.dims()[2] - 2, x.dims()[3] - 2],
    );
    assert_eq!(infer(OpKind::Avgpool2d, &[x.clone()], dilated), out);
    let g = single(
        OpKind::Avgpool2d,
        &[x.clone()],
        [("kernel", ints([2, 2])), ("dilation", ints([0, 1]))],
        out,
    );
    assert_invalid(&g, "dilation");
    let g = single(
        OpKind::Avgpool2d,
        &[x.clone()],
        [("kernel", ints([2, 2]))],
        x,
    );
    assert_invalid(
        &g,
        "`avgpool2d` produces f16[2,3,3,3], but the written type is f16[2,3,4,4]",
    );
}

#[test]
fn global_avgpool() {
    assert_eq!(
        infer(OpKind::GlobalAvgpool, &[t(BF16, &[2, 3, 4, 5])], []),
        t(BF16, &[2, 3, 1, 1])
    );
    let g = single(
        OpKind::GlobalAvgpool,
        &[t(F32, &[3, 4, 5])],
        [],
        t(F32, &[3, 1, 1]),
    );
    assert_invalid(&g, "`global_avgpool` needs x of rank 4, found f32[3,4,5]");
    let g = single(
        OpKind::GlobalAvgpool,
        &[t(I32, &[1, 3, 4, 5])],
        [],
        t(I32, &[1, 3, 1, 1]),
    );
    assert_invalid(&g, "`global_avgpool` needs a float operand");
}

#[test]
fn cast() {
    for from in DType::ALL {
        for to in DType::ALL {
            declared(OpKind::Cast, &[t(from, &[2])], [], t(to, &[2]));
        }
    }
    let g = single(OpKind::Cast, &[t(F32, &[2, 3])], [], t(I32, &[3, 2]));
    assert_invalid(&g, "cast keeps the shape: f32[2,3] to i32[3,2]");
}

#[test]
fn constant() {
    let value = |v: Attr| [("value", v)];
    declared(
        OpKind::Constant,
        &[],
        value(Attr::Float(0.5)),
        t(F32, &[2, 3]),
    );
    declared(
        OpKind::Constant,
        &[],
        value(Attr::Floats(vec![1e-7, -0.0, f64::NAN])),
        t(F16, &[3]),
    );
    declared(OpKind::Constant, &[], value(ints([1, -2, 3])), t(I32, &[3]));
    declared(OpKind::Constant, &[], value(ints([0, 1])), t(Bool, &[2]));
    declared(OpKind::Constant, &[], value(Attr::Int(7)), t(I64, &[]));
    // The builder turns an integer literal of a float constant into a float.
    let mut b = GraphBuilder::new("t");
    let c = b.constant(t(BF16, &[]), Attr::Int(2)).unwrap();
    let g = b.finish(&[c]).unwrap();
    let op = g.all_ops()[0];
    assert_eq!(g.op(op).attrs.get("value"), Some(&Attr::Float(2.0)));

    let ct = |v: Attr, ty: TensorType, needle: &str| {
        let g = single(OpKind::Constant, &[], value(v), ty);
        assert_invalid(&g, needle);
    };
    ct(
        Attr::Floats(vec![1.0, 2.0]),
        t(F32, &[2, 3]),
        "constant of type f32[2,3] needs 1 or 6 values, found 2",
    );
    ct(ints([]), t(I32, &[2]), "needs 1 or 2 values, found 0");
    ct(
        Attr::Float(0.5),
        t(I32, &[2]),
        "constant of type i32[2] needs integer values",
    );
    ct(
        Attr::Floats(vec![0.0, 1.0]),
        t(Bool, &[2]),
        "constant of type bool[2] needs integer values",
    );
    ct(Attr::Int(2), t(Bool, &[]), "holds values in 0..=1");
    ct(ints([0, -1]), t(Bool, &[2]), "holds values in 0..=1");
    ct(
        Attr::Str("1".into()),
        t(F32, &[]),
        "attribute `value` of `constant` must be a number or a list of numbers",
    );
    let g = single(OpKind::Constant, &[], [], t(F32, &[]));
    assert_invalid(&g, "`constant` requires attribute `value`");
    let g = single(
        OpKind::Constant,
        &[t(F32, &[])],
        value(Attr::Float(1.0)),
        t(F32, &[]),
    );
    assert_invalid(&g, "`constant` takes exactly 0 operands, found 1");
}

#[test]
fn builder_reports_bad_arity_instead_of_panicking() {
    let mut b = GraphBuilder::new("t");
    let x = b.param("x", t(F32, &[2])).unwrap();
    let r = b.op_declared(OpKind::Reshape, &[], Attrs::new(), t(F32, &[2]));
    assert!(matches!(r, Err(BuildError::Type { .. })), "{r:?}");
    let r = b.op_declared(OpKind::Add, &[x], Attrs::new(), t(F32, &[2]));
    assert!(matches!(r, Err(BuildError::Type { .. })), "{r:?}");
    let r = b.op(OpKind::Add, &[x], Attrs::new());
    assert!(matches!(r, Err(BuildError::Type { .. })), "{r:?}");
}

/// Attributes print unless equal to their default, and `-0.0` is not `0.0`.
#[test]
fn printed_attributes() {
    let mut b = GraphBuilder::new("t");
    let x = b.param("x", t(F32, &[2])).unwrap();
    let pad = |v: f64| {
        attrs([
            ("low", ints([0])),
            ("high", ints([1])),
            ("value", Attr::Float(v)),
        ])
    };
    let zero = b.op(OpKind::Pad, &[x], pad(0.0)).unwrap();
    let neg_zero = b.op(OpKind::Pad, &[x], pad(-0.0)).unwrap();
    let g = b.finish(&[zero, neg_zero]).unwrap();
    let text = print_graph(&g);
    assert!(
        text.contains("%0 = pad %x {low = [0], high = [1]} : f32[3]\n"),
        "{text}"
    );
    assert!(
        text.contains("%1 = pad %x {low = [0], high = [1], value = -0.0} : f32[3]\n"),
        "{text}"
    );
}

#[test]
fn attributes_must_be_canonical() {
    let x = t(F32, &[1, 1, 3, 3]);
    let mut g = single(OpKind::Conv2d, &[x.clone(), t(F32, &[1, 1, 1, 1])], [], x);
    assert_valid(&g);
    let conv = g.all_ops()[0];
    let canonical = g.op(conv).attrs.clone();
    // Defaults left out.
    g.op_mut(conv).attrs = attrs([("stride", ints([1, 1]))]);
    assert_invalid(&g, "the attributes of `conv2d` are not in canonical form");
    // Every attribute, in the wrong order.
    let mut reversed: Vec<(String, Attr)> = (canonical.iter())
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    reversed.reverse();
    g.op_mut(conv).attrs = reversed.into_iter().collect();
    assert_invalid(&g, "the attributes of `conv2d` are not in canonical form");
}

#[test]
fn graph_terminator() {
    let x = t(F32, &[2]);
    let mut g = Graph::new("t");
    let body = g.body();
    let p = g.add_param("x", x.clone()).unwrap();
    assert_invalid(&g, "a block must end with `return`, this one is empty");
    let r = push(&mut g, body, OpKind::Relu, &[p], "r", x.clone());
    assert_invalid(
        &g,
        "a block must end with `return`, this one ends with `relu`",
    );
    finish(&mut g, &[r]);
    assert_valid(&g);
    g.set_result_types(vec![t(F32, &[3])]);
    assert_invalid(
        &g,
        "`return` gives (f32[2]) but the graph declares (f32[3])",
    );
    g.set_result_types(vec![x.clone(), x.clone()]);
    assert_invalid(
        &g,
        "`return` gives (f32[2]) but the graph declares (f32[2], f32[2])",
    );

    // `return` not last, and `yield` ending a graph body.
    let mut g = Graph::new("t");
    let body = g.body();
    let p = g.add_param("x", x.clone()).unwrap();
    finish(&mut g, &[p]);
    push(&mut g, body, OpKind::Relu, &[p], "r", x.clone());
    assert_invalid(&g, "`return` must be the last op of its block");
    let mut g = Graph::new("t");
    let p = g.add_param("x", x).unwrap();
    let y = g
        .create_op(OpKind::Yield, vec![p], Attrs::new(), Vec::new())
        .unwrap();
    g.append_op(g.body(), y);
    assert_invalid(&g, "`yield` cannot end a graph body; use `return`");
    assert_invalid(
        &g,
        "a block must end with `return`, this one ends with `yield`",
    );
}

#[test]
fn ssa() {
    let x = t(F32, &[2]);
    // Use before definition (no cycle).
    let mut g = Graph::new("t");
    let body = g.body();
    let p = g.add_param("x", x.clone()).unwrap();
    let a = push(&mut g, body, OpKind::Relu, &[p], "a", x.clone());
    let b = push(&mut g, body, OpKind::Neg, &[a], "b", x.clone());
    finish(&mut g, &[b]);
    assert_valid(&g);
    let relu = g.all_ops()[0];
    g.remove_op(relu);
    g.append_op(g.body(), relu);
    assert_invalid(&g, "%a is used before its definition");
    // A two-op cycle: %a = relu %b; %b = neg %a.
    g.remove_op(relu);
    g.op_mut(relu).operands = vec![b];
    g.insert_op(g.body(), 0, relu);
    assert_invalid(&g, "dependence cycle through %a, %b");
    // A self-loop: %a = relu %a.
    g.op_mut(relu).operands = vec![a];
    assert_invalid(&g, "dependence cycle through %a");
    // A use of a removed op's result.
    g.op_mut(relu).operands = vec![p];
    assert_valid(&g);
    g.remove_op(relu);
    assert_invalid(&g, "%a is used, but the op that defined it was removed");
}

#[test]
fn names() {
    let x = t(F32, &[2]);
    let mut g = Graph::new("t");
    g.add_param("x", x.clone()).unwrap();
    assert!(g.add_param("x", x.clone()).is_err());
    let bad = g.add_param("a-b", x.clone()).unwrap();
    finish(&mut g, &[bad]);
    assert_invalid(&g, "value name `%a-b` is not of the form [A-Za-z0-9_.]+");

    let graph = |name: &str| {
        let mut g = Graph::new(name);
        let p = g.add_param("x", x.clone()).unwrap();
        finish(&mut g, &[p]);
        g
    };
    let module = Module {
        graphs: vec![graph("1g"), graph("ok"), graph("ok")],
    };
    let errors = verify_module(&module).unwrap_err();
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "graph name `@1g` is not an identifier",
            "graph @ok is defined twice"
        ]
    );
    let module = Module {
        graphs: vec![graph("a"), graph("_b.c")],
    };
    assert_eq!(verify_module(&module), Ok(()));
}

#[test]
fn block_links() {
    let x = t(F32, &[2]);
    let mut g = single(OpKind::Relu, &[x.clone()], [], x.clone());
    let relu = g.all_ops()[0];
    let stray = g.create_block();
    g.op_mut(relu).parent = Some(stray);
    assert_invalid(
        &g,
        "`relu` is listed in block0 but its parent is Some(BlockId(1))",
    );

    let mut g = single(OpKind::Relu, &[x.clone()], [], x);
    let relu = g.all_ops()[0];
    let region = g.create_block();
    g.set_region(relu, region, "g0");
    assert_invalid(&g, "`relu` cannot have a region");
}

/// A graph `@t(%x: f32[2], %y: f32[2])` with one `fused @g0(%xi = %x, %yi = %y)`
/// whose region adds its arguments and yields the sum; returns the graph and
/// the fused op, region, and the region's add.
fn fused_graph() -> (Graph, dcir_ir::OpId, dcir_ir::BlockId, dcir_ir::OpId) {
    let ty = t(F32, &[2]);
    let mut g = Graph::new("t");
    let x = g.add_param("x", ty.clone()).unwrap();
    let y = g.add_param("y", ty.clone()).unwrap();
    let region = g.create_block();
    let xi = g.add_block_arg(region, "xi", ty.clone()).unwrap();
    let yi = g.add_block_arg(region, "yi", ty.clone()).unwrap();
    let sum = push(&mut g, region, OpKind::Add, &[xi, yi], "s", ty.clone());
    let add = g.block(region).ops[0];
    let yld = g
        .create_op(OpKind::Yield, vec![sum], Attrs::new(), Vec::new())
        .unwrap();
    g.append_op(region, yld);
    let fused = g
        .create_op(
            OpKind::Fused,
            vec![x, y],
            Attrs::new(),
            vec![("f".into(), ty)],
        )
        .unwrap();
    g.set_region(fused, region, "g0");
    g.append_op(g.body(), fused);
    let f = g.op(fused).results[0];
    finish(&mut g, &[f]);
    assert_valid(&g);
    (g, fused, region, add)
}

#[test]
fn fused() {
    let (mut g, fused, _, _) = fused_graph();
    g.op_mut(fused).symbol = Some(String::new());
    assert_invalid(&g, "`fused` needs a symbol such as @g0");
    g.op_mut(fused).symbol = None;
    assert_invalid(&g, "`fused` needs a symbol such as @g0");

    let (mut g, fused, _, _) = fused_graph();
    g.op_mut(fused).region = None;
    assert_invalid(&g, "`fused` needs a region");

    // Operands against the region's arguments.
    let (mut g, fused, _, _) = fused_graph();
    g.op_mut(fused).operands.pop();
    assert_invalid(&g, "`fused` has 1 operands but its region has 2 arguments");
    let (mut g, fused, _, _) = fused_graph();
    let z = g.add_param("z", t(F16, &[2])).unwrap();
    g.op_mut(fused).operands[1] = z;
    assert_invalid(
        &g,
        "region argument %yi is f32[2] but is bound to %z of type f16[2]",
    );

    // Results: at least one, of the yielded types.
    let (mut g, fused, region, _) = fused_graph();
    let yld = *g.block(region).ops.last().unwrap();
    let xi = g.block(region).args[0];
    g.op_mut(yld).operands = vec![xi, xi];
    assert_invalid(
        &g,
        "`yield` gives (f32[2], f32[2]) but the fused op declares (f32[2])",
    );
    g.op_mut(fused).results.clear();
    assert_invalid(&g, "`fused` has at least 1 results, found 0");

    // A missing `yield`, an empty region, `return` ending a region.
    let (mut g, _, region, add2) = fused_graph();
    let yld = *g.block(region).ops.last().unwrap();
    g.remove_op(yld);
    assert_invalid(
        &g,
        "a block must end with `yield`, this one ends with `add`",
    );
    g.remove_op(add2);
    assert_invalid(&g, "a block must end with `yield`, this one is empty");
    let (mut g, _, region, _) = fused_graph();
    let yld = *g.block(region).ops.last().unwrap();
    let operands = g.op(yld).operands.clone();
    g.remove_op(yld);
    let ret = g
        .create_op(OpKind::Return, operands, Attrs::new(), Vec::new())
        .unwrap();
    g.append_op(region, ret);
    assert_invalid(&g, "`return` cannot end a fused region; use `yield`");

    // Isolation, both ways.
    let (mut g, _, _, add3) = fused_graph();
    let x = g.params()[0];
    g.op_mut(add3).operands[1] = x;
    assert_invalid(
        &g,
        "%x is defined outside this fused region; bind it to a region argument",
    );
    let (mut g, _, _, add4) = fused_graph();
    let sum = g.op(add4).results[0];
    let ret = *g.block(g.body()).ops.last().unwrap();
    g.op_mut(ret).operands = vec![sum];
    assert_invalid(
        &g,
        "%s is defined inside a fused region and cannot be used outside it",
    );

    // Groups do not nest.
    let (mut g, _, region, _) = fused_graph();
    let xi = g.block(region).args[0];
    let inner = g.create_block();
    let a = g.add_block_arg(inner, "a", t(F32, &[2])).unwrap();
    let yld = g
        .create_op(OpKind::Yield, vec![a], Attrs::new(), Vec::new())
        .unwrap();
    g.append_op(inner, yld);
    let nested = g
        .create_op(
            OpKind::Fused,
            vec![xi],
            Attrs::new(),
            vec![("n".into(), t(F32, &[2]))],
        )
        .unwrap();
    g.set_region(nested, inner, "g1");
    g.insert_op(region, 0, nested);
    assert_invalid(&g, "`fused` groups cannot nest");

    // Kernel parameters: the kind's, typed, sorted by name.
    let (mut g, fused, _, _) = fused_graph();
    let kind = |k: &str| ("kind", Attr::Str(k.into()));
    let sorted = attrs([kind("elementwise"), ("threads", Attr::Int(128))]);
    g.op_mut(fused).attrs = sorted;
    assert_valid(&g);
    g.op_mut(fused).attrs = attrs([("threads", Attr::Int(128)), kind("elementwise")]);
    assert_invalid(&g, "the attributes of `fused` are not in canonical form");
    g.op_mut(fused).attrs = attrs([kind("elementwise"), ("thread", Attr::Int(128))]);
    assert_invalid(
        &g,
        "`fused` of kind `elementwise` has no parameter `thread` (it has: level, threads, vector, items)",
    );
    g.op_mut(fused).attrs = attrs([kind("gemm"), ("tile", Attr::Int(64))]);
    assert_invalid(&g, "`fused` parameter `tile` must be a list of integers");
    g.op_mut(fused).attrs = attrs([kind("gemm"), ("math", Attr::Str("wmma".into()))]);
    assert_invalid(&g, "`math` must be one of \"fma\", \"tensor_core\"");
    // Values outside a parameter's range are errors, not clamped.
    for (name, value, wanted) in [
        ("threads", 7, "an integer, a multiple of 32 in [32, 1024]"),
        (
            "threads",
            2048,
            "an integer, a multiple of 32 in [32, 1024]",
        ),
        ("vector", 3, "an integer, a power of two in [1, 8]"),
        ("items", 0, "an integer, in [1, 64]"),
    ] {
        g.op_mut(fused).attrs = attrs([kind("elementwise"), (name, Attr::Int(value))]);
        assert_invalid(&g, &format!("`fused` parameter `{name}` must be {wanted}"));
    }
    g.op_mut(fused).attrs = attrs([kind("gemm"), ("tile", ints([64, 0, 8]))]);
    assert_invalid(&g, "`tile` must be a list of integers, each in [1, 4096]");
    g.op_mut(fused).attrs = attrs([kind("gemm"), ("stages", Attr::Int(9))]);
    assert_invalid(&g, "`stages` must be an integer, in [1, 8]");
    g.op_mut(fused).attrs = attrs([kind("gem")]);
    assert_invalid(&g, "`fused` has no kind `gem`");
    g.op_mut(fused).attrs = attrs([("threads", Attr::Int(1))]);
    assert_invalid(&g, "a `fused` op without `kind` takes no kernel parameters");
}

/// The printed text of one graph using every op (defaults omitted, fused region indented).
#[test]
fn every_op_prints() {
    let mut b = GraphBuilder::new("every_op");
    let x = b.param("x", t(F32, &[1, 2, 4, 4])).unwrap();
    let w = b.param("w", t(F32, &[2, 1, 3, 3])).unwrap();
    let m = b.param("m", t(F32, &[2, 3])).unwrap();
    let idx = b.param("idx", t(I64, &[2])).unwrap();
    let c = b.param("c", t(F32, &[2])).unwrap();
    let none = Attrs::new;
    let conv_attrs = attrs([("pad", ints([1, 1, 1, 1])), ("groups", Attr::Int(2))]);
    let conv = b.op(OpKind::Conv2d, &[x, w], conv_attrs).unwrap();
    let bn = b
        .op(OpKind::Batchnorm, &[conv, c, c, c, c], none())
        .unwrap();
    let mp = b
        .op(
            OpKind::Maxpool2d,
            &[bn],
            attrs([("kernel", ints([2, 2])), ("stride", ints([2, 2]))]),
        )
        .unwrap();
    let ap = b
        .op(
            OpKind::Avgpool2d,
            &[mp],
            attrs([
                ("kernel", ints([2, 2])),
                ("count_include_pad", Attr::Bool(true)),
            ]),
        )
        .unwrap();
    let gap = b.op(OpKind::GlobalAvgpool, &[bn], none()).unwrap();
    let flat = b.reshape(gap, &[1, 2]).unwrap();
    let mm = b.op(OpKind::Matmul, &[flat, m], none()).unwrap();
    let mt = b
        .op(OpKind::Transpose, &[mm], attrs([("perm", ints([1, 0]))]))
        .unwrap();
    let sl = b
        .op(
            OpKind::Slice,
            &[mt],
            attrs([("starts", ints([0, 0])), ("ends", ints([2, 1]))]),
        )
        .unwrap();
    let cat = b
        .op(OpKind::Concat, &[sl, sl], attrs([("axis", Attr::Int(1))]))
        .unwrap();
    let pd = b
        .op(
            OpKind::Pad,
            &[cat],
            attrs([
                ("low", ints([0, 1])),
                ("high", ints([0, 0])),
                ("value", Attr::Float(-0.0)),
            ]),
        )
        .unwrap();
    let gt = b
        .op(OpKind::Gather, &[pd, idx], attrs([("axis", Attr::Int(1))]))
        .unwrap();
    let rs = b
        .op(
            OpKind::ReduceSum,
            &[gt],
            attrs([("axes", ints([1])), ("keepdims", Attr::Bool(true))]),
        )
        .unwrap();
    let rm = b
        .op(OpKind::ReduceMean, &[gt], attrs([("axes", ints([0, 1]))]))
        .unwrap();
    let rx = b
        .op(OpKind::ReduceMax, &[gt], attrs([("axes", ints([0]))]))
        .unwrap();
    let sm = b
        .op(OpKind::Softmax, &[gt], attrs([("axis", Attr::Int(1))]))
        .unwrap();
    let ones = b.constant(t(F32, &[2]), Attr::Float(1.0)).unwrap();
    let zeros = b
        .constant(t(F32, &[2]), Attr::Floats(vec![0.1, 1e-7]))
        .unwrap();
    let ln = b
        .op(
            OpKind::Layernorm,
            &[sm, ones, zeros],
            attrs([("axis", Attr::Int(1)), ("epsilon", Attr::Float(1e-6))]),
        )
        .unwrap();
    let bc = b.broadcast(rx, &[1], &[2, 2]).unwrap();
    let e = b.op(OpKind::Add, &[ln, bc], none()).unwrap();
    let e = b.op(OpKind::Sub, &[e, bc], none()).unwrap();
    let e = b.op(OpKind::Mul, &[e, e], none()).unwrap();
    let e = b.op(OpKind::Div, &[e, e], none()).unwrap();
    let e = b.op(OpKind::Max, &[e, e], none()).unwrap();
    let e = b.op(OpKind::Min, &[e, e], none()).unwrap();
    let e = b.op(OpKind::Pow, &[e, e], none()).unwrap();
    let e = b
        .op(
            OpKind::Clip,
            &[e],
            attrs([("min", Attr::Float(0.0)), ("max", Attr::Float(6.0))]),
        )
        .unwrap();
    let e = b
        .op(
            OpKind::Gelu,
            &[e],
            attrs([("approximate", Attr::Str("tanh".into()))]),
        )
        .unwrap();
    let mut e = b.op(OpKind::Gelu, &[e], none()).unwrap();
    for kind in [
        OpKind::Erf,
        OpKind::Tanh,
        OpKind::Sigmoid,
        OpKind::Exp,
        OpKind::Log,
        OpKind::Sqrt,
        OpKind::Rsqrt,
        OpKind::Neg,
        OpKind::Abs,
    ] {
        e = b.op(kind, &[e], none()).unwrap();
    }
    let fused = b
        .fused(
            "g0",
            &[e, bc],
            attrs([("kind", Attr::Str("elementwise".into()))]),
            |b, args| {
                let s = b.op(OpKind::Add, &[args[0], args[1]], Attrs::new())?;
                Ok(vec![b.op(OpKind::Relu, &[s], Attrs::new())?])
            },
        )
        .unwrap();
    let ints_out = b.cast(fused[0], I32).unwrap();
    let flags = b.constant(t(Bool, &[2]), ints([1, 0])).unwrap();
    let g = b.finish(&[ap, rs, rm, ints_out, flags]).unwrap();
    insta::assert_snapshot!(print_graph(&g));
}

#[test]
fn comparisons_logic_select_and_the_new_unary_ops() {
    for kind in [
        OpKind::Equal,
        OpKind::Less,
        OpKind::LessEqual,
        OpKind::Greater,
        OpKind::GreaterEqual,
    ] {
        for dtype in [F32, F16, I32, I64] {
            let x = t(dtype, &[2, 3]);
            assert_eq!(
                infer(kind, &[x.clone(), x], []),
                t(Bool, &[2, 3]),
                "{kind:?}"
            );
        }
        let g = single(kind, &[t(F32, &[3]), t(F16, &[3])], [], t(Bool, &[3]));
        assert_invalid(&g, "needs operands of one type");
    }
    assert_eq!(
        infer(OpKind::Equal, &[t(Bool, &[4]), t(Bool, &[4])], []),
        t(Bool, &[4])
    );
    let g = single(
        OpKind::Less,
        &[t(Bool, &[4]), t(Bool, &[4])],
        [],
        t(Bool, &[4]),
    );
    assert_invalid(&g, "`less` needs a numeric operand");
    for kind in [OpKind::And, OpKind::Or, OpKind::Xor] {
        assert_eq!(
            infer(kind, &[t(Bool, &[4]), t(Bool, &[4])], []),
            t(Bool, &[4])
        );
        let g = single(kind, &[t(I32, &[4]), t(I32, &[4])], [], t(I32, &[4]));
        assert_invalid(&g, "needs a bool operand");
    }
    assert_eq!(infer(OpKind::Not, &[t(Bool, &[4])], []), t(Bool, &[4]));
    let cond = t(Bool, &[2, 5]);
    assert_eq!(
        infer(
            OpKind::Select,
            &[cond.clone(), t(I64, &[2, 5]), t(I64, &[2, 5])],
            []
        ),
        t(I64, &[2, 5])
    );
    let g = single(
        OpKind::Select,
        &[t(Bool, &[5]), t(F32, &[2, 5]), t(F32, &[2, 5])],
        [],
        t(F32, &[2, 5]),
    );
    assert_invalid(&g, "a condition of the operands' shape");
    let g = single(
        OpKind::Select,
        &[cond.clone(), t(F32, &[2, 5]), t(F16, &[2, 5])],
        [],
        t(F32, &[2, 5]),
    );
    assert_invalid(&g, "needs operands of one type");
    for dtype in [F32, I32] {
        let x = t(dtype, &[3]);
        assert_eq!(infer(OpKind::Mod, &[x.clone(), x.clone()], []), x);
        assert_eq!(
            infer(
                OpKind::Mod,
                &[x.clone(), x.clone()],
                [("fmod", Attr::Bool(true))]
            ),
            x
        );
        assert_eq!(infer(OpKind::Sign, &[x.clone()], []), x);
    }
    for kind in [
        OpKind::Floor,
        OpKind::Ceil,
        OpKind::Round,
        OpKind::Sin,
        OpKind::Cos,
    ] {
        assert_eq!(infer(kind, &[t(BF16, &[3])], []), t(BF16, &[3]));
        let g = single(kind, &[t(I32, &[3])], [], t(I32, &[3]));
        assert_invalid(&g, "needs a float operand");
    }
    for kind in [OpKind::IsNan, OpKind::IsInf] {
        assert_eq!(infer(kind, &[t(F16, &[3])], []), t(Bool, &[3]));
    }
}

#[test]
fn a_replaced_output_keeps_its_name_and_a_renamed_value_its_uniqueness() {
    let mut b = GraphBuilder::new("g");
    let x = b.param("x", t(F32, &[4])).unwrap();
    let y = b.op(OpKind::Relu, &[x], Attrs::new()).unwrap();
    b.rename_value(y, "y").unwrap();
    assert!(b.rename_value(y, "x").unwrap_err().contains("%x is taken"));
    let mut g = b.finish(&[y]).unwrap();
    // A rewrite puts `neg` in place of the returned `relu`.
    let ret = *g.block(g.body()).ops.last().unwrap();
    let mut rw = dcir_ir::Rewriter::before(&mut g, ret);
    let n = rw.op(OpKind::Neg, &[x], Attrs::new(), "neg").unwrap();
    g.replace_all_uses(y, n);
    assert_eq!(g.value(n).name, "y");
    assert_eq!(g.outputs().unwrap(), &[n]);
    // A parameter that replaces an output keeps its own name.
    g.replace_all_uses(n, x);
    assert_eq!(g.value(x).name, "x");
    assert_eq!(verify_graph(&g), Ok(()));
}
