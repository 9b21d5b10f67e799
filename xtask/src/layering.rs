//! The crate layering rule, its table, and the check over `cargo metadata`.
//!
//! A crate of the layer table depends (normal or build dependencies) only on
//! crates of strictly lower layers; dev-dependencies are exempt. On top of
//! that, [`ONLY`] narrows some crates further (the runtime never depends on
//! the compiler), test support is used only as a dev-dependency, xtask depends
//! on no workspace crate, and crates under `examples/` may depend on anything.
//! Every other workspace crate must be added to [`TABLE`].

use std::collections::HashSet;
use std::fmt::Write;

use anyhow::{Result, bail};
use serde_json::Value;

use Role::{Example, Layer, TestSupport, Tool};

/// What a workspace crate is, for the layering rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A crate of this layer: it depends only on crates of lower layers.
    Layer(u8),
    /// Test support: depends on crates below [`DRIVER_LAYER`], used only as a dev-dependency.
    TestSupport,
    /// Repository tooling: depends on no workspace crate.
    Tool,
    /// A downstream example under `examples/`: may depend on anything, nothing depends on it.
    Example,
}

/// The layer table: every workspace crate outside `examples/` and its role.
pub const TABLE: &[(&str, Role)] = &[
    ("dcir-ir", Layer(0)),
    ("dcir-artifact", Layer(0)),
    ("dcir-reader", Layer(1)),
    ("dcir-interp", Layer(1)),
    ("dcir-runtime", Layer(1)),
    // Passes fold constants with the interpreter, the numeric oracle, rather
    // than a second copy of every op's arithmetic.
    ("dcir-passes", Layer(2)),
    ("dcir-fusion", Layer(3)),
    ("dcir-cuda", Layer(4)),
    ("dcir-onnx", Layer(3)),
    ("dcir-tune", Layer(5)),
    ("dcir-cli", Layer(6)),
    ("dcir-testgen", TestSupport),
    ("xtask", Tool),
];

/// Crates that may depend only on the listed workspace crates, whatever their layer.
pub const ONLY: &[(&str, &[&str])] = &[("dcir-runtime", &["dcir-artifact"])];

/// The drivers' layer: test support may depend only on crates below it.
pub const DRIVER_LAYER: u8 = 6;

/// The kind of a dependency, as `cargo metadata` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DepKind {
    /// `[dependencies]`.
    Normal,
    /// `[build-dependencies]`.
    Build,
    /// `[dev-dependencies]`.
    Dev,
}

impl DepKind {
    fn describe(self) -> &'static str {
        match self {
            DepKind::Normal => "dependency",
            DepKind::Build => "build-dependency",
            DepKind::Dev => "dev-dependency",
        }
    }
}

/// The role of crate `name`: [`Example`] when it lives under `examples/`,
/// else its row of [`TABLE`], or `None` when it has none.
pub fn role(name: &str, under_examples: bool) -> Option<Role> {
    if under_examples {
        return Some(Example);
    }
    TABLE.iter().find(|(n, _)| *n == name).map(|&(_, r)| r)
}

/// Checks one dependency edge between workspace crates; `Err` says why it is forbidden.
pub fn check_edge(from: (&str, Role), to: (&str, Role), kind: DepKind) -> Result<(), String> {
    let ((from, from_role), (to, to_role)) = (from, to);
    let only = ONLY.iter().find(|(n, _)| *n == from).map(|&(_, a)| a);
    match (from_role, to_role) {
        (Example, _) => Ok(()),
        (Tool, _) => Err(format!("`{from}` must depend on no workspace crate")),
        (_, Tool | Example) => Err(format!("nothing may depend on `{to}`")),
        _ if kind == DepKind::Dev => Ok(()),
        (_, TestSupport) => Err(format!(
            "`{to}` is test support: use it only as a dev-dependency"
        )),
        _ if only.is_some_and(|a| !a.contains(&to)) => Err(format!(
            "`{from}` may depend only on {}",
            only.unwrap_or_default().join(", ")
        )),
        (TestSupport, Layer(l)) if l < DRIVER_LAYER => Ok(()),
        (TestSupport, Layer(_)) => Err(format!(
            "test support may depend only on layers below {DRIVER_LAYER}"
        )),
        (Layer(a), Layer(b)) if b < a => Ok(()),
        (Layer(a), Layer(b)) => Err(format!(
            "layer {a} may depend only on lower layers, and `{to}` is layer {b}"
        )),
    }
}

/// Checks every workspace crate and every dependency edge between workspace
/// crates in `cargo metadata --no-deps` output; returns the violations.
pub fn violations(meta: &Value) -> Vec<String> {
    let root = meta["workspace_root"].as_str().unwrap_or_default();
    let examples = format!("{root}/examples/");
    let packages = meta["packages"].as_array().map_or(&[][..], Vec::as_slice);
    let name_of = |p: &Value| p["name"].as_str().unwrap_or_default().to_string();
    let members: HashSet<String> = packages.iter().map(name_of).collect();
    let role_of = |p: &Value| {
        let path = p["manifest_path"].as_str().unwrap_or_default();
        role(&name_of(p), path.starts_with(&examples))
    };
    let mut out = Vec::new();
    for p in packages {
        let from = name_of(p);
        let Some(from_role) = role_of(p) else {
            out.push(format!(
                "crate `{from}` ({}) is not in the layer table: add it to the layer table in xtask/src/layering.rs",
                p["manifest_path"].as_str().unwrap_or("?")
            ));
            continue;
        };
        let deps = p["dependencies"].as_array().map_or(&[][..], Vec::as_slice);
        for dep in deps {
            let to = dep["name"].as_str().unwrap_or_default();
            if !members.contains(to) {
                continue;
            }
            let Some(to_role) = packages.iter().find(|q| name_of(q) == to).and_then(role_of) else {
                continue; // reported as a crate missing from the table
            };
            let kind = match dep["kind"].as_str() {
                Some("dev") => DepKind::Dev,
                Some("build") => DepKind::Build,
                _ => DepKind::Normal,
            };
            if let Err(why) = check_edge((&from, from_role), (to, to_role), kind) {
                out.push(format!("`{from}` -> `{to}` ({}): {why}", kind.describe()));
            }
        }
    }
    out
}

/// The layer table and its rules, for error messages.
pub fn describe_table() -> String {
    let mut s = String::from(
        "A crate depends (normal or build dependencies) only on crates of strictly lower layers; dev-dependencies are exempt.\n",
    );
    for layer in 0..=DRIVER_LAYER {
        let names: Vec<&str> = TABLE
            .iter()
            .filter(|(_, r)| *r == Layer(layer))
            .map(|(n, _)| *n)
            .collect();
        let _ = writeln!(s, "  layer {layer}: {}", names.join(", "));
    }
    for (name, allowed) in ONLY {
        let _ = writeln!(s, "  {name} may depend only on: {}", allowed.join(", "));
    }
    for (name, r) in TABLE {
        match r {
            TestSupport => {
                let _ = writeln!(
                    s,
                    "  test support: {name} (dev-dependency only; depends on layers below {DRIVER_LAYER})"
                );
            }
            Tool => {
                let _ = writeln!(s, "  tooling: {name} (depends on no workspace crate)");
            }
            Layer(_) | Example => {}
        }
    }
    s.push_str("  examples/*: downstream examples, may depend on anything\n");
    s
}

/// `cargo xtask layering`.
pub fn run() -> Result<()> {
    let found = violations(&crate::metadata()?);
    if !found.is_empty() {
        bail!(
            "forbidden crate dependencies:\n  {}\n\n{}",
            found.join("\n  "),
            describe_table()
        );
    }
    println!("layering: ok");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Checks a made-up edge; crates named `example*` live under examples/.
    fn edge(from: &str, to: &str, kind: DepKind) -> Result<(), String> {
        let from_role = role(from, from.starts_with("example")).expect(from);
        let to_role = role(to, to.starts_with("example")).expect(to);
        check_edge((from, from_role), (to, to_role), kind)
    }

    #[test]
    fn the_workspace_is_layered() {
        let found = violations(&crate::metadata().unwrap());
        assert!(
            found.is_empty(),
            "{}\n\n{}",
            found.join("\n"),
            describe_table()
        );
    }

    #[test]
    fn layers_point_down() {
        use DepKind::*;
        assert!(edge("dcir-reader", "dcir-ir", Normal).is_ok());
        assert!(edge("dcir-cli", "dcir-tune", Normal).is_ok());
        assert!(edge("dcir-cuda", "dcir-artifact", Build).is_ok());
        assert!(edge("dcir-ir", "dcir-reader", Normal).is_err());
        assert!(edge("dcir-ir", "dcir-reader", Build).is_err());
        assert!(edge("dcir-passes", "dcir-interp", Normal).is_ok());
        assert!(edge("dcir-interp", "dcir-passes", Normal).is_err());
        assert!(edge("dcir-interp", "dcir-reader", Normal).is_err());
        assert!(edge("dcir-fusion", "dcir-fusion", Normal).is_err());
    }

    #[test]
    fn dev_dependencies_are_exempt() {
        assert!(edge("dcir-ir", "dcir-reader", DepKind::Dev).is_ok());
        assert!(edge("dcir-ir", "dcir-cli", DepKind::Dev).is_ok());
    }

    #[test]
    fn the_runtime_uses_only_the_artifact() {
        assert!(edge("dcir-runtime", "dcir-artifact", DepKind::Normal).is_ok());
        let err = edge("dcir-runtime", "dcir-ir", DepKind::Normal).unwrap_err();
        assert!(err.contains("only on dcir-artifact"), "{err}");
        assert!(edge("dcir-runtime", "dcir-ir", DepKind::Dev).is_ok());
    }

    #[test]
    fn test_support_is_dev_only() {
        assert!(edge("dcir-ir", "dcir-testgen", DepKind::Dev).is_ok());
        assert!(edge("dcir-ir", "dcir-testgen", DepKind::Normal).is_err());
        assert!(edge("dcir-cli", "dcir-testgen", DepKind::Build).is_err());
        assert!(edge("dcir-testgen", "dcir-tune", DepKind::Normal).is_ok());
        assert!(edge("dcir-testgen", "dcir-cli", DepKind::Normal).is_err());
    }

    #[test]
    fn xtask_and_examples() {
        assert!(edge("xtask", "dcir-ir", DepKind::Normal).is_err());
        assert!(edge("xtask", "dcir-ir", DepKind::Dev).is_err());
        assert!(edge("dcir-cli", "xtask", DepKind::Dev).is_err());
        assert!(edge("example-opt", "dcir-cli", DepKind::Normal).is_ok());
        assert!(edge("example-opt", "dcir-testgen", DepKind::Normal).is_ok());
        assert!(edge("dcir-cli", "example-opt", DepKind::Normal).is_err());
    }

    #[test]
    fn metadata_is_checked() {
        let pkg = |name: &str, path: &str, deps: Value| json!({"name": name, "manifest_path": path, "dependencies": deps});
        let meta = json!({
            "workspace_root": "/ws",
            "packages": [
                pkg("dcir-ir", "/ws/crates/dcir-ir/Cargo.toml", json!([
                    {"name": "dcir-reader", "kind": null},
                    {"name": "dcir-reader", "kind": "dev"},
                    {"name": "indexmap", "kind": null},
                ])),
                pkg("dcir-reader", "/ws/crates/dcir-reader/Cargo.toml", json!([
                    {"name": "dcir-ir", "kind": null},
                    {"name": "dcir-new", "kind": null},
                ])),
                pkg("dcir-new", "/ws/crates/dcir-new/Cargo.toml", json!([])),
                pkg("my-opt", "/ws/examples/my-opt/Cargo.toml", json!([
                    {"name": "dcir-reader", "kind": null},
                ])),
            ],
        });
        let found = violations(&meta);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(found[0].starts_with("`dcir-ir` -> `dcir-reader` (dependency)"));
        assert!(found[1].contains("add it to the layer table"));
    }

    #[test]
    fn the_table_lists_every_layer() {
        let table = describe_table();
        assert!(table.contains("layer 0: dcir-ir, dcir-artifact"), "{table}");
        assert!(table.contains("layer 6: dcir-cli"), "{table}");
    }
}
