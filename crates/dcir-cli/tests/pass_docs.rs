//! `docs/passes.md` is generated from the registry; this test fails when it
//! is stale and rewrites it under `DCIR_BLESS=1` (`cargo xtask bless`).

fn render() -> String {
    let mut out = String::from(
        "# Passes\n\n\
         <!-- Generated from `dcir_cli::default_registry()` by crates/dcir-cli/tests/pass_docs.rs; \
         edit the pass definitions, then run `cargo xtask bless`. -->\n\n\
         Run them with `dcir-opt --pipeline 'a,b{option=value},c'`; `dcir-opt --list-passes` \
         prints this list. Options go in braces after the pass name, separated by spaces; list \
         values are comma-separated. See [writing-a-pass.md](writing-a-pass.md) to add your own.\n\n\
         | pass | what it does | options |\n|---|---|---|\n",
    );
    for def in dcir_cli::default_registry().sorted() {
        let options: Vec<String> = def
            .options
            .iter()
            .map(|o| {
                let default = if o.default.is_empty() {
                    "empty".to_string()
                } else {
                    format!("`{}`", o.default)
                };
                format!(
                    "`{}` ({}, default {default}): {}",
                    o.name,
                    o.kind.describe(),
                    o.help
                )
            })
            .collect();
        let options = if options.is_empty() {
            "—".to_string()
        } else {
            options.join("<br>")
        };
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            def.name, def.summary, options
        ));
    }
    out
}

#[test]
fn passes_doc_is_current() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/passes.md");
    let wanted = render();
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != wanted {
        if std::env::var_os("DCIR_BLESS").is_some() {
            std::fs::write(&path, wanted).expect("docs/passes.md is writable");
        } else {
            panic!("docs/passes.md is stale: run `cargo xtask bless`");
        }
    }
}
