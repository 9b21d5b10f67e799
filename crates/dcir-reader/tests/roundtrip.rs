//! Reading canonical text and printing it back, and printing built modules
//! and reading them back.

use dcir_ir::{
    Attr, Attrs, DType, GraphBuilder, Module, OpKind, TensorType, print_module, verify_module,
};
use dcir_reader::parse_module;

const ALL_OPS: &str = include_str!("data/all_ops.dcir");

#[test]
fn every_op_reads_and_prints_back() {
    let module = parse_module(ALL_OPS).expect("all_ops.dcir reads");
    verify_module(&module).expect("all_ops.dcir verifies");
    assert_eq!(print_module(&module), ALL_OPS);
    for kind in OpKind::ALL {
        let used = module
            .graphs
            .iter()
            .any(|g| g.all_ops().iter().any(|&op| g.op(op).kind == *kind));
        assert!(used, "all_ops.dcir has no `{}`", kind.name());
    }
}

#[test]
fn text_with_comments_and_odd_spacing_reads_to_canonical() {
    let messy = "// a comment\ngraph   @g ( %x :f32 [ 2 , 2 ] )->( f32[2,2] ){ // trailing\n%y=relu %x:f32[2,2]\n\n  return   %y }";
    let module = parse_module(messy).expect("reads");
    let canonical =
        "graph @g(%x: f32[2,2]) -> (f32[2,2]) {\n  %y = relu %x : f32[2,2]\n  return %y\n}\n";
    assert_eq!(print_module(&module), canonical);
}

#[test]
fn default_attributes_and_integer_literals_are_canonicalized() {
    let text = "graph @g(%x: f32[1,1,4,4], %w: f32[1,1,1,1]) -> (f32[1,1,4,4]) {\n  %y = conv2d %x, %w {groups = 1, dilation = [1, 1]} : f32[1,1,4,4]\n  %k = constant {value = 2} : f32[]\n  return %y\n}\n";
    let module = parse_module(text).expect("reads");
    let printed = print_module(&module);
    assert!(
        printed.contains("%y = conv2d %x, %w : f32[1,1,4,4]"),
        "{printed}"
    );
    assert!(
        printed.contains("%k = constant {value = 2.0} : f32[]"),
        "{printed}"
    );
}

fn built_module() -> Module {
    let f32_ = |dims: &[usize]| TensorType::new(DType::F32, dims.to_vec());
    let mut b = GraphBuilder::new("built");
    let x = b.param("x", f32_(&[2, 3])).unwrap();
    let bias = b.param("bias", f32_(&[3])).unwrap();
    let bb = b.broadcast(bias, &[1], &[2, 3]).unwrap();
    let k = b.constant(f32_(&[]), Attr::Int(2)).unwrap();
    let kb = b.broadcast(k, &[], &[2, 3]).unwrap();
    let fused = b
        .fused(
            "g0",
            &[x, bb, kb],
            Attrs::new().with("kind", Attr::Str("elementwise".into())),
            |b, args| {
                let s = b.op(OpKind::Add, &[args[0], args[1]], Attrs::new())?;
                let m = b.op(OpKind::Mul, &[s, args[2]], Attrs::new())?;
                let r = b.op(OpKind::Relu, &[m], Attrs::new())?;
                Ok(vec![r, s])
            },
        )
        .unwrap();
    let sm = b
        .op(
            OpKind::Softmax,
            &[fused[0]],
            Attrs::new().with("axis", Attr::Int(1)),
        )
        .unwrap();
    let t = b
        .op(
            OpKind::Transpose,
            &[fused[1]],
            Attrs::new().with("perm", Attr::Ints(vec![1, 0])),
        )
        .unwrap();
    let g = b.finish(&[sm, t]).unwrap();

    let mut b = GraphBuilder::new("second");
    let i = b.param("i", TensorType::new(DType::I64, vec![4])).unwrap();
    let c = b.cast(i, DType::F16).unwrap();
    let g2 = b.finish(&[c]).unwrap();
    Module {
        graphs: vec![g, g2],
    }
}

#[test]
fn built_module_reads_back_equal() {
    let module = built_module();
    let text = print_module(&module);
    let read = parse_module(&text).unwrap_or_else(|e| panic!("{text}\n{e:?}"));
    assert_eq!(read, module, "{text}");
    assert_eq!(print_module(&read), text);
    verify_module(&read).expect("verifies");
}

#[test]
fn locations_point_at_statements() {
    let module = parse_module(ALL_OPS).expect("reads");
    let g = &module.graphs[0];
    let span = g.loc.0.expect("graph location");
    assert!(ALL_OPS[span.range()].starts_with("graph @all_ops("));
    assert!(ALL_OPS[span.range()].ends_with("-> (f32[2,4])"));
    for op in g.all_ops() {
        let span = g.op(op).loc.0.expect("op location");
        let text = &ALL_OPS[span.range()];
        assert!(text.contains(g.op(op).kind.name()), "{text}");
        assert!(
            !text.contains('\n') || g.op(op).kind != OpKind::Fused,
            "{text}"
        );
    }
}

mod random_graphs {
    use dcir_ir::print_module;
    use dcir_reader::parse_module;
    use dcir_testgen::{arb_module_spec, build_module, proptest_config};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(proptest_config())]

        /// print → parse gives back the same module, and printing is a fixpoint.
        #[test]
        fn print_parse_print(specs in arb_module_spec()) {
            let module = build_module(&specs).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let text = print_module(&module);
            let reread = parse_module(&text)
                .map_err(|d| TestCaseError::fail(format!("{:?}\n{text}", d)))?;
            prop_assert_eq!(&reread, &module, "{}", text);
            prop_assert_eq!(print_module(&reread), text);
        }
    }
}
