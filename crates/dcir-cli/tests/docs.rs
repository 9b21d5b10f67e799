//! Every ```dcir code block of `README.md` and `docs/*.md` reads and verifies,
//! so the examples in the documentation stay true.

use std::path::Path;

use dcir_ir::verify_module;
use dcir_reader::{parse_module, render};

fn dcir_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_start() == "```dcir" => current = Some(String::new()),
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
        for block in dcir_blocks(&text) {
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
