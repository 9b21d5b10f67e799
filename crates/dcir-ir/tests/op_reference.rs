//! Keeps the generated op reference in `docs/ir.md` in step with the op table.
//! Run with `DCIR_BLESS=1` (or `cargo xtask bless`) to rewrite it.

use dcir_ir::{AttrKind, OpKind, ResultTypes, print::format_attr};

const BEGIN: &str = "<!-- BEGIN GENERATED: op reference (crates/dcir-ir/tests/op_reference.rs) -->";
const END: &str = "<!-- END GENERATED -->";

fn kind_name(kind: AttrKind) -> &'static str {
    match kind {
        AttrKind::Int => "int",
        AttrKind::Float => "float",
        AttrKind::Bool => "bool",
        AttrKind::Str => "string",
        AttrKind::Ints => "[int]",
        AttrKind::Floats => "[float]",
        AttrKind::Literal => "number or [number]",
    }
}

fn reference() -> String {
    let mut out = String::new();
    out.push_str("| op | operands | results | result type | attributes | meaning |\n");
    out.push_str("|---|---|---|---|---|---|\n");
    for &kind in OpKind::ALL {
        let info = kind.info();
        let attrs: Vec<String> = info
            .attrs
            .iter()
            .map(|a| {
                let default = a.default.map_or(String::new(), |d| {
                    format!(" = {}", format_attr(&d.to_attr()))
                });
                format!("`{}: {}{}` {}", a.name, kind_name(a.kind), default, a.doc)
            })
            .collect();
        let attrs = if info.open_attrs {
            "any (kept sorted by name)".to_string()
        } else if attrs.is_empty() {
            "—".to_string()
        } else {
            attrs.join("<br>")
        };
        let types = match info.result_types {
            ResultTypes::Inferred => "inferred",
            ResultTypes::Declared => "declared",
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            info.name,
            info.operands.describe(),
            info.results.describe(),
            types,
            attrs,
            info.summary
        ));
    }
    out
}

#[test]
fn op_reference_in_docs_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ir.md");
    let doc = std::fs::read_to_string(&path).expect("docs/ir.md exists");
    let (Some(start), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/ir.md lacks the generated-section markers");
    };
    let current = &doc[start + BEGIN.len()..end];
    let wanted = format!("\n{}", reference());
    if current != wanted {
        if std::env::var_os("DCIR_BLESS").is_some() {
            let updated = format!("{}{BEGIN}{wanted}{}", &doc[..start], &doc[end..]);
            std::fs::write(&path, updated).expect("docs/ir.md is writable");
        } else {
            panic!(
                "docs/ir.md's op reference is stale: run `cargo xtask bless` \
                 (or DCIR_BLESS=1 cargo test -p dcir-ir --test op_reference)"
            );
        }
    }
}
