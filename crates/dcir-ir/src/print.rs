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
use crate::types::TensorType;

/// Prints a module.
pub fn print_module(module: &Module) -> String {
    let mut out = String::new();
    for (i, g) in module.graphs.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        write_graph(&mut out, g);
    }
    out
}

/// Prints one graph.
pub fn print_graph(graph: &Graph) -> String {
    let mut out = String::new();
    write_graph(&mut out, graph);
    out
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
        f.write_str(&print_module(self))
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print_graph(self))
    }
}

// The writers append to a `String` directly: printing is on the path of every
// `dcir-opt` run, and `fmt` machinery per token costs more than the text.

fn write_type(out: &mut String, ty: &TensorType) {
    out.push_str(ty.dtype.name());
    out.push('[');
    for (i, d) in ty.dims().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{d}");
    }
    out.push(']');
}

fn write_graph(out: &mut String, g: &Graph) {
    out.push_str("graph @");
    out.push_str(g.name());
    out.push('(');
    for (i, &p) in g.params().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('%');
        out.push_str(&g.value(p).name);
        out.push_str(": ");
        write_type(out, g.ty(p));
    }
    out.push_str(") -> (");
    for (i, t) in g.result_types().iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_type(out, t);
    }
    out.push_str(") {\n");
    write_block(out, g, g.body(), 1);
    out.push_str("}\n");
}

fn write_values(out: &mut String, g: &Graph, values: &[ValueId]) {
    for (i, &v) in values.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('%');
        out.push_str(&g.value(v).name);
    }
}

fn write_block(out: &mut String, g: &Graph, block: BlockId, depth: usize) {
    for &op in &g.block(block).ops {
        write_op(out, g, g.op(op), depth);
    }
}

fn write_indent(out: &mut String, depth: usize) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn write_op(out: &mut String, g: &Graph, op: &OpData, depth: usize) {
    write_indent(out, depth);
    if !op.results.is_empty() {
        write_values(out, g, &op.results);
        out.push_str(" = ");
    }
    out.push_str(op.kind.name());
    if op.kind == OpKind::Fused {
        out.push_str(" @");
        out.push_str(op.symbol.as_deref().unwrap_or(""));
        out.push('(');
        let args = op.region.map(|r| g.block(r).args.as_slice()).unwrap_or(&[]);
        for (i, &operand) in op.operands.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push('%');
            out.push_str(args.get(i).map_or("?", |&a| g.value(a).name.as_str()));
            out.push_str(" = %");
            out.push_str(&g.value(operand).name);
        }
        out.push(')');
    } else if !op.operands.is_empty() {
        out.push(' ');
        write_values(out, g, &op.operands);
    }
    write_attrs(out, op);
    if !op.results.is_empty() {
        out.push_str(" : ");
        for (i, &r) in op.results.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            write_type(out, g.ty(r));
        }
    }
    match op.region {
        Some(region) => {
            out.push_str(" {\n");
            write_block(out, g, region, depth + 1);
            write_indent(out, depth);
            out.push_str("}\n");
        }
        None => out.push('\n'),
    }
}

fn write_attrs(out: &mut String, op: &OpData) {
    let mut first = true;
    for (name, value) in op.attrs.iter() {
        let default = op.kind.attr_spec(name).and_then(|s| s.default);
        if default.is_some_and(|d| d.matches(value)) {
            continue;
        }
        out.push_str(if first { " {" } else { ", " });
        first = false;
        out.push_str(name);
        out.push_str(" = ");
        out.push_str(&format_attr(value));
    }
    if !first {
        out.push('}');
    }
}
