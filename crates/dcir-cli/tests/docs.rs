//! Every ```dcir code block of `README.md` and `docs/*.md` reads and verifies,
//! so the examples in the documentation stay true.

use std::path::Path;

use dcir_ir::verify_module;
use dcir_reader::{parse_module, render};

#[test]
fn dcir_blocks_in_docs_verify() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut checked = 0;
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("readable page");
        for block in blocks_of(&text, "dcir") {
            let name = page.display().to_string();
            let module =
                parse_module(&block).unwrap_or_else(|d| panic!("{}", render(&name, &block, &d)));
            if let Err(errors) = verify_module(&module) {
                let diags: Vec<_> = errors.iter().map(Into::into).collect();
                panic!("{}", render(&name, &block, &diags));
            }
            checked += 1;
        }
    }
    assert!(checked >= 2, "expected dcir blocks in docs/ir.md");
}

/// The ```LANG code blocks of `markdown`.
fn blocks_of(markdown: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_start() == fence => current = Some(String::new()),
            Some(block) if line.trim_start() == "```" => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    blocks
}

/// `docs/writing-a-pass.md` shows compiled code: each line of each ```rust
/// block is a line of the `examples/my-opt` sources (which CI builds and
/// tests), in order, and the `path` dependencies of its ```toml block name
/// dcir's crates.
#[test]
fn writing_a_pass_shows_the_example_crate_verbatim() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page = std::fs::read_to_string(root.join("docs/writing-a-pass.md")).expect("the page");
    let source: String = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| std::fs::read_to_string(root.join("examples/my-opt/src").join(f)).expect("source"))
        .collect::<Vec<_>>()
        .join("\n");
    let rust = blocks_of(&page, "rust");
    assert!(rust.len() >= 3, "{} rust blocks", rust.len());
    for block in &rust {
        let mut lines = source.lines();
        for line in block.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                lines.any(|s| s == line),
                "this line of a block of docs/writing-a-pass.md is not in examples/my-opt (in order):\n{line}\n\nblock:\n{block}"
            );
        }
    }
    let toml = blocks_of(&page, "toml");
    assert_eq!(toml.len(), 1);
    let mut named = 0;
    for line in toml[0].lines() {
        if let Some((_, rest)) = line.split_once("path = \"../dcir/") {
            let path = rest.split('"').next().unwrap_or_default();
            assert!(
                root.join(path).join("Cargo.toml").is_file(),
                "{path} is no crate"
            );
            let krate = line.split_whitespace().next().unwrap_or_default();
            assert!(path.ends_with(krate), "{line}");
            named += 1;
        }
    }
    assert_eq!(named, 3, "{}", toml[0]);
}

/// The README's quick start runs as written, on a small ONNX model, as far
/// as this machine allows: import, plan, and the GPU run (which, without a
/// driver, must fail only for want of one).
#[test]
fn the_readme_quick_start_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let start = readme
        .find("## Quick start")
        .expect("a quick start section");
    let block = &blocks_of(&readme[start..], "sh")[0];
    let dir = std::env::temp_dir().join(format!("dcir-quick-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let model = root.join("crates/dcir-onnx/tests/fixtures/conv_bias_relu.onnx");
    let mut ran = 0;
    for line in block.lines().filter(|l| l.starts_with("target/release/")) {
        let mut words = line.split_whitespace();
        let exe = match words.next().expect("a command") {
            "target/release/dcir-import" => env!("CARGO_BIN_EXE_dcir-import"),
            "target/release/dcir-opt" => env!("CARGO_BIN_EXE_dcir-opt"),
            "target/release/dcir-run" => env!("CARGO_BIN_EXE_dcir-run"),
            other => panic!("the quick start names an unknown tool {other}"),
        };
        let args: Vec<String> = words
            .map(|w| match w {
                "model.onnx" => model.display().to_string(),
                "model.dcir" | "model.safetensors" => dir.join(w).display().to_string(),
                _ => w.to_string(),
            })
            .collect();
        let out = std::process::Command::new(exe)
            .args(&args)
            .output()
            .expect("the tool starts");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let no_gpu = stderr.contains("no CUDA driver");
        assert!(out.status.success() || no_gpu, "`{line}` failed:\n{stderr}");
        ran += 1;
    }
    assert_eq!(ran, 3, "import, plan, run");
    let _ = std::fs::remove_dir_all(&dir);
}
