//! Every kind of error the reader reports: its position (line:col), its
//! message, and its rendering (snapshots).

use dcir_ir::verify_module;
use dcir_reader::{Diagnostic, parse_module, read_bytes, render};

/// The diagnostics of reading `source`, which must fail.
fn errors(source: &str) -> Vec<Diagnostic> {
    match parse_module(source) {
        Ok(_) => panic!("read without error:\n{source}"),
        Err(diags) => diags,
    }
}

/// Line, column and message of the first diagnostic, and the rendering of all.
fn first(source: &str) -> ((usize, usize), String, String) {
    let diags = errors(source);
    let pos = diags[0].line_col(source).expect("a span");
    (
        pos,
        diags[0].message.clone(),
        render("input.dcir", source, &diags),
    )
}

const HEAD: &str = "graph @g(%x: f32[4]) -> (f32[4]) {\n";

fn body(lines: &str) -> String {
    format!("{HEAD}{lines}}}\n")
}

#[test]
fn unknown_character() {
    let (pos, msg, out) = first(&body("  %y = relu %x : f32[4]\n  return $y\n"));
    assert_eq!(pos, (3, 10));
    assert_eq!(msg, "unexpected character '$'");
    insta::assert_snapshot!(out);
}

#[test]
fn integer_overflow() {
    let (pos, msg, _) = first("graph @g(%x: f32[99999999999999999999]) -> () {\n  return\n}\n");
    assert_eq!(pos, (1, 18));
    assert_eq!(
        msg,
        "integer `99999999999999999999` does not fit in 64 bits"
    );
}

#[test]
fn bad_escape() {
    let src = body(
        "  %y = fused @g0(%a = %x) {kind = \"ab\\qc\"} : f32[4] {\n    yield %a\n  }\n  return %y\n",
    );
    let (pos, msg, out) = first(&src);
    assert_eq!(pos, (2, 38));
    assert!(msg.starts_with("invalid escape in string"), "{msg}");
    insta::assert_snapshot!(out);
}

#[test]
fn bad_unicode_escape() {
    let src = body(
        "  %y = fused @g0(%a = %x) {kind = \"\\u{d800}\"} : f32[4] {\n    yield %a\n  }\n  return %y\n",
    );
    let (pos, msg, _) = first(&src);
    assert_eq!(pos, (2, 36));
    assert!(msg.starts_with("invalid escape in string"), "{msg}");
}

#[test]
fn unterminated_string() {
    let src = body(
        "  %y = fused @g0(%a = %x) {kind = \"abc} : f32[4] {\n    yield %a\n  }\n  return %y\n",
    );
    let (pos, msg, _) = first(&src);
    assert_eq!(pos, (2, 35));
    assert_eq!(msg, "unterminated string");
}

#[test]
fn syntax_error() {
    let (pos, msg, out) = first(&body("  %y = relu %x f32[4]\n  return %y\n"));
    assert_eq!(pos, (2, 16));
    assert_eq!(msg, "expected one of `{`, `,`, `:`, found `f32`");
    insta::assert_snapshot!(out);
}

#[test]
fn unexpected_end() {
    let (pos, msg, _) = first("graph @g(%x: f32[4]) -> (f32[4]) {\n  return %x\n");
    assert_eq!(pos, (2, 12));
    assert!(msg.starts_with("unexpected end of file, expected"), "{msg}");
}

#[test]
fn terminator_in_the_middle() {
    // A bare `return` followed by a definition is a syntax error.
    let (pos, _, _) = first(&body("  return\n  %y = relu %x : f32[4]\n  return %y\n"));
    assert_eq!(pos, (3, 6));
}

#[test]
fn undefined_value() {
    let (pos, msg, out) = first(&body("  %y = relu %z : f32[4]\n  return %y\n"));
    assert_eq!(pos, (2, 13));
    assert_eq!(msg, "undefined value %z");
    insta::assert_snapshot!(out);
}

#[test]
fn duplicate_definition() {
    let src = body("  %y = relu %x : f32[4]\n  %y = neg %x : f32[4]\n  return %y\n");
    let diags = errors(&src);
    assert_eq!(diags.len(), 1);
    assert_eq!(diags[0].line_col(&src), Some((3, 3)));
    assert_eq!(diags[0].message, "value %y is defined twice");
    assert_eq!(diags[0].notes.len(), 1);
    assert_eq!(&src[diags[0].notes[0].0.range()], "%y");
    assert_eq!(diags[0].notes[0].0.start, 37);
    insta::assert_snapshot!(render("input.dcir", &src, &diags));
}

#[test]
fn duplicate_parameter_and_region_argument() {
    let src = "graph @g(%x: f32[4], %x: f32[4]) -> (f32[4]) {\n  %y = fused @g0(%x = %x) : f32[4] {\n    yield %x\n  }\n  return %y\n}\n";
    let diags = errors(src);
    let positions: Vec<_> = diags.iter().map(|d| d.line_col(src)).collect();
    assert_eq!(positions, [Some((1, 22)), Some((2, 18))]);
}

#[test]
fn unknown_op_with_suggestion() {
    let (pos, msg, out) = first(&body("  %y = relux %x : f32[4]\n  return %y\n"));
    assert_eq!(pos, (2, 8));
    assert_eq!(msg, "unknown op `relux`");
    assert!(out.contains("did you mean `relu`?"), "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn unknown_op_without_suggestion() {
    let diags = errors(&body("  %y = frobnicate %x : f32[4]\n  return %y\n"));
    assert_eq!(diags[0].help, None);
}

#[test]
fn unknown_dtype_with_suggestion() {
    let src = "graph @g(%x: f31[4]) -> (f32[4]) {\n  return %x\n}\n";
    let diags = errors(src);
    assert_eq!(diags[0].line_col(src), Some((1, 14)));
    assert_eq!(diags[0].message, "unknown dtype `f31`");
    assert_eq!(diags[0].help.as_deref(), Some("did you mean `f32`?"));
}

#[test]
fn negative_dimension() {
    let (pos, msg, _) = first("graph @g(%x: f32[2,-4]) -> () {\n  return\n}\n");
    assert_eq!(pos, (1, 20));
    assert_eq!(msg, "a dimension cannot be negative");
}

#[test]
fn results_on_an_op_without_results() {
    let (pos, msg, out) = first(&body("  %r = return %x : f32[4]\n"));
    assert_eq!(pos, (2, 3));
    assert_eq!(msg, "`return` produces no results");
    insta::assert_snapshot!(out);
}

#[test]
fn missing_results() {
    let (pos, msg, out) = first(&body("  relu %x\n  return %x\n"));
    assert_eq!(pos, (2, 3));
    assert_eq!(msg, "`relu` must name its results");
    insta::assert_snapshot!(out);
}

#[test]
fn wrong_result_count() {
    let (pos, msg, _) = first(&body("  %a, %b = relu %x : f32[4], f32[4]\n  return %a\n"));
    assert_eq!(pos, (2, 3));
    assert_eq!(msg, "`relu` produces exactly 1 result(s), found 2");
}

#[test]
fn types_do_not_match_results() {
    let (pos, msg, _) = first(&body("  %a = relu %x : f32[4], f32[4]\n  return %a\n"));
    assert_eq!(pos, (2, 18));
    assert_eq!(msg, "1 result(s) but 2 type(s)");
}

#[test]
fn nested_fused() {
    let src = body(
        "  %y = fused @outer(%a = %x) : f32[4] {\n    %z = fused @inner(%b = %a) : f32[4] {\n      yield %b\n    }\n    yield %z\n  }\n  return %y\n",
    );
    let (pos, msg, out) = first(&src);
    assert_eq!(pos, (3, 10));
    assert_eq!(msg, "`fused` groups cannot be nested");
    insta::assert_snapshot!(out);
}

#[test]
fn empty_file() {
    for (src, pos) in [("", (1, 1)), ("\n// only a comment\n\n", (2, 18))] {
        let diags = errors(src);
        assert_eq!(diags.len(), 1);
        assert_eq!(diags[0].message, "expected at least one `graph`");
        assert_eq!(diags[0].line_col(src), Some(pos));
    }
}

#[test]
fn not_utf8() {
    let mut bytes = format!("{HEAD}  %y = relu %x : f32[4]\n  return %y // caf").into_bytes();
    bytes.extend_from_slice(b"\xff!\n}\n");
    let diags = read_bytes(&bytes).expect_err("not UTF-8");
    let lossy = String::from_utf8_lossy(&bytes);
    assert_eq!(diags[0].line_col(&lossy), Some((3, 19)));
    assert_eq!(diags[0].message, "the text is not UTF-8 (byte 0xff)");
    insta::assert_snapshot!(render("input.dcir", &lossy, &diags));
}

#[test]
fn unknown_attribute_points_at_its_name() {
    let (pos, msg, _) = first(&body("  %y = relu %x {alpha = 1} : f32[4]\n  return %y\n"));
    assert_eq!(pos, (2, 17));
    assert_eq!(msg, "`relu` takes no attributes, found `alpha`");
}

#[test]
fn wrong_attribute_kind_points_at_its_value() {
    let (pos, msg, out) = first(&body(
        "  %y = softmax %x {axis = [0]} : f32[4]\n  return %y\n",
    ));
    assert_eq!(pos, (2, 27));
    assert_eq!(msg, "attribute `axis` of `softmax` must be an integer");
    insta::assert_snapshot!(out);
}

#[test]
fn missing_attribute_points_at_the_op() {
    let (pos, msg, _) = first(&body("  %y = softmax %x : f32[4]\n  return %y\n"));
    assert_eq!(pos, (2, 8));
    assert!(
        msg.starts_with("`softmax` requires attribute `axis`"),
        "{msg}"
    );
}

#[test]
fn duplicate_attribute() {
    let (pos, msg, _) = first(&body(
        "  %y = softmax %x {axis = 0, axis = 0} : f32[4]\n  return %y\n",
    ));
    assert_eq!(pos, (2, 30));
    assert_eq!(msg, "attribute `axis` is given twice");
}

#[test]
fn all_lowering_errors_are_reported_in_order() {
    let src = body(
        "  %a = relux %x : f32[4]\n  %b = relu %nope : f32[4]\n  %c = neg %x : f32[-1]\n  return %b\n",
    );
    let diags = errors(&src);
    let lines: Vec<usize> = diags.iter().map(|d| d.line_col(&src).unwrap().0).collect();
    assert_eq!(lines, [2, 3, 4]);
}

#[test]
fn verifier_errors_point_at_the_op() {
    // A use before the definition reads; the verifier reports it.
    let src = body("  %y = relu %z : f32[4]\n  %z = neg %x : f32[4]\n  return %y\n");
    let module = parse_module(&src).expect("reads");
    let errs = verify_module(&module).expect_err("does not verify");
    let diags: Vec<Diagnostic> = errs.iter().map(Diagnostic::from).collect();
    assert_eq!(diags[0].line_col(&src), Some((2, 3)));
    insta::assert_snapshot!(render("input.dcir", &src, &diags));
}

#[test]
fn render_survives_spans_outside_the_text() {
    let d = Diagnostic::error("far away", dcir_ir::Span::new(1000, 2000));
    let out = render("input.dcir", "é", std::slice::from_ref(&d));
    assert!(out.contains("far away"), "{out}");
    assert_eq!(d.line_col("é"), Some((1, 2)));
}
