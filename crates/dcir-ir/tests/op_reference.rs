//! Keeps the generated op reference in `docs/ir.md` in step with the op table.
//! Run with `DCIR_BLESS=1` (or `cargo xtask bless`) to rewrite it.

use dcir_ir::fused::{FUSED_KINDS, FUSED_PARAMS, ParamType};
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
            "kernel parameters (below), sorted by name".to_string()
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
    out.push_str(
        "\n`fused` kernel parameters (`dcir_ir::fused`): without `kind` none; with it \
         `level` and its kind's, typed and in range; anything else is an error.\n\n\
         | kind | parameters |\n|---|---|\n",
    );
    for k in FUSED_KINDS {
        out.push_str(&format!("| `{}` | {} |\n", k.name, k.params.join(", ")));
    }
    out.push_str("\n| parameter | type | sets |\n|---|---|---|\n");
    for spec in FUSED_PARAMS {
        let ty = match spec.ty {
            ParamType::Int(r) => format!("int, {r}"),
            ParamType::Ints(r) => format!("[int], each {r}"),
            ParamType::Str(values) => values
                .iter()
                .map(|v| format!("`\"{v}\"`"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        out.push_str(&format!("| `{}` | {ty} | {} |\n", spec.name, spec.summary));
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
