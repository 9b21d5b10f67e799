//! The canonical printer.
//!
//! Output is a pure function of the module: attributes in schema order with
//! defaults left out (sorted by name for `fused`), values under their stored
//! names, floats in the shortest form that reads back to the same bits, two
//! spaces of indent per region. Reading the text back gives an equal module.

use std::fmt::{self, Write};

use crate::attr::Attr;
use crate::graph::{BlockId, Graph, Module, OpData, ValueId};
use crate::op::OpKind;

/// Prints a module.
pub fn print_module(module: &Module) -> String {
    module.to_string()
}

/// Prints one graph.
pub fn print_graph(graph: &Graph) -> String {
    graph.to_string()
}

/// Prints a float so that it reads back to the same `f64`: `1.0`, `1e-5`, `nan`, `inf`, `-inf`.
pub fn format_float(x: f64) -> String {
    if x.is_nan() {
        "nan".to_string()
    } else if x.is_infinite() {
        if x > 0.0 {
            "inf".to_string()
        } else {
            "-inf".to_string()
        }
    } else {
        format!("{x:?}")
    }
}

/// Prints a string literal with `\"`, `\\`, `\n`, `\t` and `\u{..}` escapes.
pub fn format_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Prints one attribute value.
pub fn format_attr(attr: &Attr) -> String {
    fn list<T>(v: &[T], f: impl Fn(&T) -> String) -> String {
        format!("[{}]", v.iter().map(f).collect::<Vec<_>>().join(", "))
    }
    match attr {
        Attr::Int(i) => i.to_string(),
        Attr::Float(x) => format_float(*x),
        Attr::Bool(b) => b.to_string(),
        Attr::Str(s) => format_string(s),
        Attr::Ints(v) => list(v, |i| i.to_string()),
        Attr::Floats(v) => list(v, |x| format_float(*x)),
    }
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.graphs.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{g}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "graph @{}(", self.name())?;
        for (i, &p) in self.params().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "%{}: {}", self.value(p).name, self.ty(p))?;
        }
        f.write_str(") -> (")?;
        for (i, t) in self.result_types().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{t}")?;
        }
        f.write_str(") {\n")?;
        write_block(f, self, self.body(), 1)?;
        f.write_str("}\n")
    }
}

fn write_values(f: &mut fmt::Formatter<'_>, g: &Graph, values: &[ValueId]) -> fmt::Result {
    for (i, &v) in values.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "%{}", g.value(v).name)?;
    }
    Ok(())
}

fn write_block(f: &mut fmt::Formatter<'_>, g: &Graph, block: BlockId, depth: usize) -> fmt::Result {
    for &op in &g.block(block).ops {
        write_op(f, g, g.op(op), depth)?;
    }
    Ok(())
}

fn write_op(f: &mut fmt::Formatter<'_>, g: &Graph, op: &OpData, depth: usize) -> fmt::Result {
    let indent = "  ".repeat(depth);
    f.write_str(&indent)?;
    if !op.results.is_empty() {
        write_values(f, g, &op.results)?;
        f.write_str(" = ")?;
    }
    f.write_str(op.kind.name())?;
    if op.kind == OpKind::Fused {
        write!(f, " @{}(", op.symbol.as_deref().unwrap_or(""))?;
        let args = op.region.map(|r| g.block(r).args.as_slice()).unwrap_or(&[]);
        for (i, &operand) in op.operands.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let arg = args.get(i).map_or("?", |&a| g.value(a).name.as_str());
            write!(f, "%{arg} = %{}", g.value(operand).name)?;
        }
        f.write_str(")")?;
    } else if !op.operands.is_empty() {
        f.write_str(" ")?;
        write_values(f, g, &op.operands)?;
    }
    write_attrs(f, op)?;
    if !op.results.is_empty() {
        f.write_str(" : ")?;
        for (i, &r) in op.results.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", g.ty(r))?;
        }
    }
    match op.region {
        Some(region) => {
            f.write_str(" {\n")?;
            write_block(f, g, region, depth + 1)?;
            writeln!(f, "{indent}}}")
        }
        None => f.write_str("\n"),
    }
}

fn write_attrs(f: &mut fmt::Formatter<'_>, op: &OpData) -> fmt::Result {
    let shown: Vec<(&str, &Attr)> = op
        .attrs
        .iter()
        .filter(|(name, value)| {
            let default = op.kind.attr_spec(name).and_then(|s| s.default);
            default.is_none_or(|d| d.to_attr() != **value)
        })
        .collect();
    if shown.is_empty() {
        return Ok(());
    }
    f.write_str(" {")?;
    for (i, (name, value)) in shown.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{name} = {}", format_attr(value))?;
    }
    f.write_str("}")
}
