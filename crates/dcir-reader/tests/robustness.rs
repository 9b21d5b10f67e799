//! The reader never panics and never overflows the stack: random bytes,
//! token soups, mutated valid text, deep nesting and very large files.

use std::time::Instant;

use dcir_reader::{parse_module, read_bytes, render};
use proptest::prelude::*;

const ALL_OPS: &str = include_str!("data/all_ops.dcir");

/// Token strings of every kind the lexer knows, valid and malformed.
const TOKENS: &[&str] = &[
    "graph",
    "fused",
    "true",
    "false",
    "nan",
    "inf",
    "-inf",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    "=",
    "->",
    "%x",
    "%0",
    "%a.b",
    "@g",
    "@g0",
    "relu",
    "add",
    "return",
    "yield",
    "f32",
    "i64",
    "bool",
    "axis",
    "value",
    "0",
    "-3",
    "4",
    "99999999999999999999",
    "1.5",
    "-2.0e-3",
    "1e10",
    "\"s\"",
    "\"a\\n\\u{41}\"",
    "\"bad\\q\"",
    "\"open",
    "// c\n",
    "\n",
    "$",
    "é",
    "\\",
];

/// Reads `bytes`, and renders what went wrong, without panicking.
fn read_and_render(bytes: &[u8]) {
    if let Err(diags) = read_bytes(bytes) {
        assert!(!diags.is_empty());
        let text = String::from_utf8_lossy(bytes);
        let out = render("fuzz.dcir", &text, &diags);
        assert!(out.starts_with("error: "), "{out}");
        for d in &diags {
            d.line_col(&text);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..dcir_testgen::proptest_config() })]

    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        read_and_render(&bytes);
    }

    #[test]
    fn token_soup(tokens in proptest::collection::vec(proptest::sample::select(TOKENS), 0..96)) {
        read_and_render(tokens.join(" ").as_bytes());
    }

    #[test]
    fn mutated_valid_text(
        at in 0..ALL_OPS.len(),
        cut in 0usize..16,
        tokens in proptest::collection::vec(proptest::sample::select(TOKENS), 0..4),
    ) {
        let mut bytes = ALL_OPS.as_bytes()[..at].to_vec();
        bytes.extend_from_slice(tokens.join(" ").as_bytes());
        bytes.extend_from_slice(&ALL_OPS.as_bytes()[(at + cut).min(ALL_OPS.len())..]);
        read_and_render(&bytes);
    }
}

#[test]
fn deeply_nested_braces() {
    let source = format!("graph @g() -> () {}", "{".repeat(100_000));
    let diags = parse_module(&source).expect_err("not valid");
    assert_eq!(diags[0].line_col(&source), Some((1, 19)));
}

#[test]
fn deeply_nested_attribute_lists() {
    let source = format!(
        "graph @g(%x: f32[]) -> () {{\n  %y = relu %x {{a = {}",
        "[".repeat(100_000)
    );
    parse_module(&source).expect_err("not valid");
}

#[test]
fn deeply_nested_groups() {
    let mut source = String::from("graph @g(%x: f32[]) -> (f32[]) {\n");
    for i in 0..100_000 {
        source.push_str(&format!("%r{i} = fused @g{i}(%a{i} = %x) : f32[] {{\n"));
    }
    source.push_str(&"}\n".repeat(100_000));
    let diags = parse_module(&source).expect_err("groups do not nest");
    assert_eq!(diags[0].message, "`fused` groups cannot be nested");
}

/// A valid module of about `bytes` bytes: chains of elementwise ops with a
/// fused group every hundred ops.
fn large_module(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 4096);
    let mut graph = 0;
    while s.len() < bytes {
        s.push_str(&format!(
            "graph @g{graph}(%x: f32[8,16], %y: f32[8,16]) -> (f32[8,16]) {{\n  %v0 = add %x, %y : f32[8,16]\n"
        ));
        let mut last = 0;
        for i in 1..100_000 {
            if i % 100 == 0 {
                s.push_str(&format!(
                    "  %v{i} = fused @f{i}(%a{i} = %v{last}, %b{i} = %y) {{kind = \"elementwise\"}} : f32[8,16] {{\n    %m{i} = mul %a{i}, %b{i} : f32[8,16]\n    %n{i} = relu %m{i} : f32[8,16]\n    yield %n{i}\n  }}\n"
                ));
            } else {
                s.push_str(&format!("  %v{i} = sub %v{last}, %x : f32[8,16]\n"));
            }
            last = i;
        }
        s.push_str(&format!("  return %v{last}\n}}\n\n"));
        graph += 1;
    }
    s.pop();
    s
}

/// About 25 s in a debug build, 5 s in release: run with
/// `cargo test --release -p dcir-reader -- --ignored`.
#[test]
#[ignore = "slow in debug builds; run with --release"]
fn fifty_megabytes() {
    let source = large_module(50 << 20);
    let start = Instant::now();
    let module = parse_module(&source).expect("valid");
    let elapsed = start.elapsed();
    assert_eq!(dcir_ir::print_module(&module), source);
    eprintln!(
        "read {} MB ({} ops) in {elapsed:?}",
        source.len() >> 20,
        module.op_count()
    );
}
