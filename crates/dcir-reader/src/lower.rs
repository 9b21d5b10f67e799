//! Lowering: syntax tree → [`dcir_ir::Module`], through the graph's low-level
//! API, in an order that makes a module read back from its printed text equal
//! to the one [`dcir_ir::GraphBuilder`] built: values, ops and blocks are
//! created in textual order, except that a `fused` op is created after its
//! region (as the builder does).
//!
//! Names are resolved over the whole graph once every value exists, so a use
//! before the definition reaches the verifier (which reports it, or the cycle
//! it closes) instead of failing here. Nothing here verifies the graph.

use rustc_hash::FxHashMap as HashMap;
use std::collections::hash_map::Entry;

use dcir_ir::{
    Arity, Attr, Attrs, BlockId, DType, Graph, Location, Module, OpId, OpKind, Span, TensorType,
    ValueId,
};

use crate::ast::{
    AttrEntry, AttrValue, FusedStmt, GraphDecl, Name, Number, OpStmt, Stmt, TypeExpr,
};
use crate::diagnostic::Diagnostic;

/// Lowers the graphs read from `source`; all errors found, in source order,
/// if any.
pub(crate) fn lower_module(
    graphs: &[GraphDecl<'_>],
    source: &str,
) -> Result<Module, Vec<Diagnostic>> {
    if graphs.is_empty() {
        // After the last comment, if any: the place where a graph was expected.
        let len = source.trim_end().len();
        let end = Span::new(len, len);
        return Err(vec![Diagnostic::error(
            "expected at least one `graph`",
            end,
        )]);
    }
    let mut errors = Vec::new();
    let mut module = Module::new();
    for decl in graphs {
        module.graphs.push(lower_graph(decl, &mut errors));
    }
    if errors.is_empty() {
        Ok(module)
    } else {
        errors.sort_by_key(|d| d.span.map(|s| s.start));
        Err(errors)
    }
}

/// A value name's definition: where, and the value once created (`None` while
/// pending, or for good when its statement had an error already reported).
struct Def {
    span: Span,
    value: Option<ValueId>,
}

/// What the text declares a name's type to be, for typing region arguments
/// whose operand may be defined further down.
enum Declared<'t, 'a> {
    Type(&'t TypeExpr<'a>),
    /// A region argument: the type of the operand it binds.
    Bound(&'a str),
}

struct Lowering<'t, 'a, 'e> {
    graph: Graph,
    errors: &'e mut Vec<Diagnostic>,
    declared: HashMap<&'a str, Declared<'t, 'a>>,
    values: HashMap<&'a str, Def>,
    /// Ops created with no operands yet, and the names of their operands.
    pending: Vec<(OpId, Vec<Name<'a>>)>,
}

fn lower_graph(decl: &GraphDecl<'_>, errors: &mut Vec<Diagnostic>) -> Graph {
    let mut cx = Lowering {
        graph: Graph::new(decl.name.text),
        errors,
        declared: declared_types(decl),
        values: HashMap::default(),
        pending: Vec::new(),
    };
    cx.graph.loc = Location(Some(decl.span));
    let body = cx.graph.body();
    for (name, ty) in &decl.params {
        let ty = cx.ty(ty);
        cx.block_arg(body, *name, ty);
    }
    let results = decl.results.iter().map(|t| cx.ty(t)).collect();
    cx.graph.set_result_types(results);
    for stmt in &decl.body {
        match stmt {
            Stmt::Op(op) => cx.op(op, body),
            Stmt::Fused(fused) => cx.fused(fused, body),
        }
    }
    cx.resolve_operands();
    cx.graph
}

/// The declared type of every name of the graph (the first definition wins).
fn declared_types<'t, 'a>(decl: &'t GraphDecl<'a>) -> HashMap<&'a str, Declared<'t, 'a>> {
    fn add<'t, 'a>(
        declared: &mut HashMap<&'a str, Declared<'t, 'a>>,
        names: &[Name<'a>],
        types: &'t [TypeExpr<'a>],
    ) {
        for (name, ty) in names.iter().zip(types) {
            declared.entry(name.text).or_insert(Declared::Type(ty));
        }
    }
    let mut declared = HashMap::default();
    for (name, ty) in &decl.params {
        declared.entry(name.text).or_insert(Declared::Type(ty));
    }
    for stmt in &decl.body {
        match stmt {
            Stmt::Op(op) => add(&mut declared, &op.results, &op.types),
            Stmt::Fused(fused) => {
                add(&mut declared, &fused.results, &fused.types);
                for op in &fused.body {
                    add(&mut declared, &op.results, &op.types);
                }
                for (arg, operand) in &fused.bindings {
                    declared
                        .entry(arg.text)
                        .or_insert(Declared::Bound(operand.text));
                }
            }
        }
    }
    declared
}

impl<'t, 'a> Lowering<'t, 'a, '_> {
    /// Lowers a type, reporting an error and standing in `f32[]` if it is bad
    /// (the module is then rejected anyway).
    fn ty(&mut self, ty: &TypeExpr<'_>) -> TensorType {
        lower_type(ty).unwrap_or_else(|d| {
            self.errors.push(d);
            TensorType::new(DType::F32, [])
        })
    }

    /// The type of the value `name` as declared in the text, following
    /// region arguments to the operands they bind.
    fn declared_type(&self, mut name: &'a str) -> Option<TensorType> {
        // Bounded: bindings may form a cycle.
        for _ in 0..=self.declared.len() {
            match self.declared.get(name)? {
                Declared::Type(ty) => return lower_type(ty).ok(),
                Declared::Bound(operand) => name = operand,
            }
        }
        None
    }

    /// Records that `names` are defined here; false (after reporting) if one
    /// of them is already defined.
    fn declare(&mut self, names: &[Name<'a>]) -> bool {
        let mut fresh = true;
        for name in names {
            match self.values.entry(name.text) {
                Entry::Occupied(first) => {
                    self.errors.push(
                        Diagnostic::error(
                            format!("value %{} is defined twice", name.text),
                            name.span,
                        )
                        .with_label("defined again here")
                        .with_note(first.get().span, "first defined here"),
                    );
                    fresh = false;
                }
                Entry::Vacant(slot) => {
                    slot.insert(Def {
                        span: name.span,
                        value: None,
                    });
                }
            }
        }
        fresh
    }

    fn block_arg(&mut self, block: BlockId, name: Name<'a>, ty: TensorType) {
        if !self.declare(&[name]) {
            return;
        }
        match self.graph.add_block_arg(block, name.text, ty) {
            Ok(v) => self.created(&[name], &[v]),
            Err(e) => self
                .errors
                .push(Diagnostic::error(e.to_string(), name.span)),
        }
    }

    /// Marks `names` as defined by `values`.
    fn created(&mut self, names: &[Name<'a>], values: &[ValueId]) {
        for (name, &v) in names.iter().zip(values) {
            if let Some(def) = self.values.get_mut(name.text) {
                def.value = Some(v);
            }
        }
    }

    fn op(&mut self, stmt: &OpStmt<'a>, block: BlockId) {
        let fresh = self.declare(&stmt.results);
        let types: Vec<TensorType> = stmt.types.iter().map(|t| self.ty(t)).collect();
        let Some(kind) = self.op_kind(stmt.op) else {
            return;
        };
        if !self.check_results(kind, stmt.op.span, &stmt.results, &stmt.types) || !fresh {
            return;
        }
        let Some(attrs) = self.attrs(kind, stmt.op.span, &stmt.attrs, types.first()) else {
            return;
        };
        let operands = stmt.operands.clone();
        if let Some(op) = self.create(kind, &stmt.results, types, attrs, operands, stmt.span) {
            self.graph.append_op(block, op);
        }
    }

    fn fused(&mut self, stmt: &FusedStmt<'a>, block: BlockId) {
        let fresh = self.declare(&stmt.results);
        let types: Vec<TensorType> = stmt.types.iter().map(|t| self.ty(t)).collect();
        let region = self.graph.create_block();
        for (arg, operand) in &stmt.bindings {
            // An undefined operand is reported when operands are resolved.
            let ty = self
                .declared_type(operand.text)
                .unwrap_or_else(|| TensorType::new(DType::F32, []));
            self.block_arg(region, *arg, ty);
        }
        for op in &stmt.body {
            self.op(op, region);
        }
        let kind = OpKind::Fused;
        if !self.check_results(kind, stmt.keyword, &stmt.results, &stmt.types) || !fresh {
            return;
        }
        let Some(attrs) = self.attrs(kind, stmt.keyword, &stmt.attrs, None) else {
            return;
        };
        let operands = stmt.bindings.iter().map(|&(_, operand)| operand).collect();
        if let Some(op) = self.create(kind, &stmt.results, types, attrs, operands, stmt.span) {
            self.graph.set_region(op, region, stmt.symbol.text);
            self.graph.append_op(block, op);
        }
    }

    /// The op named `name`, or an error with a suggestion.
    fn op_kind(&mut self, name: Name<'_>) -> Option<OpKind> {
        let kind = OpKind::from_name(name.text);
        if kind.is_none() {
            let mut d = Diagnostic::error(format!("unknown op `{}`", name.text), name.span)
                .with_label("unknown op");
            if let Some(near) = suggest(name.text, OpKind::ALL.iter().map(|k| k.name())) {
                d = d.with_help(format!("did you mean `{near}`?"));
            }
            self.errors.push(d);
        }
        kind
    }

    /// Checks the number of results against the op table and the number of
    /// types against the results; false after reporting a mismatch.
    fn check_results(
        &mut self,
        kind: OpKind,
        op_span: Span,
        results: &[Name<'_>],
        types: &[TypeExpr<'_>],
    ) -> bool {
        let info = kind.info();
        let error = match (results.first(), results.last()) {
            (None, _) if !info.results.accepts(0) => Some(
                Diagnostic::error(format!("`{}` must name its results", info.name), op_span)
                    .with_label("results missing")
                    .with_help(format!("write `%name = {} ... : type`", info.name)),
            ),
            (Some(first), Some(last)) if !info.results.accepts(results.len()) => {
                let span = Span::new(first.span.range().start, last.span.range().end);
                let message = if info.results == Arity::Exactly(0) {
                    format!("`{}` produces no results", info.name)
                } else {
                    format!(
                        "`{}` produces {} result(s), found {}",
                        info.name,
                        info.results.describe(),
                        results.len()
                    )
                };
                Some(Diagnostic::error(message, span).with_label("wrong number of results"))
            }
            _ => match (types.first(), types.last()) {
                (Some(first), Some(last)) if types.len() != results.len() => Some(
                    Diagnostic::error(
                        format!("{} result(s) but {} type(s)", results.len(), types.len()),
                        Span::new(first.span.range().start, last.span.range().end),
                    )
                    .with_label("one type per result"),
                ),
                _ => None,
            },
        };
        match error {
            Some(d) => {
                self.errors.push(d);
                false
            }
            None => true,
        }
    }

    /// The canonical attributes of an op (a `constant`'s value converted for
    /// its dtype), or `None` after reporting why they do not fit its schema.
    fn attrs(
        &mut self,
        kind: OpKind,
        op_span: Span,
        entries: &[AttrEntry<'_>],
        result_type: Option<&TensorType>,
    ) -> Option<Attrs> {
        let mut attrs = Attrs::new();
        let mut seen: HashMap<&str, Span> = HashMap::default();
        for entry in entries {
            if let Some(first) = seen.insert(entry.name.text, entry.name.span) {
                self.errors.push(
                    Diagnostic::error(
                        format!("attribute `{}` is given twice", entry.name.text),
                        entry.name.span,
                    )
                    .with_note(first, "first given here"),
                );
                return None;
            }
            // Schema names are static: only a free-form name is copied.
            let name = match kind.attr_spec(entry.name.text) {
                Some(spec) => std::borrow::Cow::Borrowed(spec.name),
                None => std::borrow::Cow::Owned(entry.name.text.to_string()),
            };
            attrs.set(name, attr_value(&entry.value));
        }
        match kind.normalize_attrs(attrs) {
            Ok(mut attrs) => {
                if kind == OpKind::Constant
                    && let Some(ty) = result_type
                    && let Some(value) = attrs.remove("value")
                {
                    attrs.set("value", value.literal_for(ty.dtype));
                }
                Some(attrs)
            }
            Err(e) => {
                let entry = e
                    .attr
                    .as_deref()
                    .and_then(|name| entries.iter().find(|a| a.name.text == name));
                let span = match entry {
                    // A known attribute has the wrong kind of value.
                    Some(a) if kind.attr_spec(a.name.text).is_some() => a.value_span,
                    Some(a) => a.name.span,
                    None => op_span,
                };
                self.errors.push(Diagnostic::error(e.message, span));
                None
            }
        }
    }

    /// Creates an op (operands are set once every name is known) with its
    /// results and location.
    fn create(
        &mut self,
        kind: OpKind,
        names: &[Name<'a>],
        types: Vec<TensorType>,
        attrs: Attrs,
        operands: Vec<Name<'a>>,
        loc: Span,
    ) -> Option<OpId> {
        let results = names
            .iter()
            .map(|n| n.text.to_string())
            .zip(types)
            .collect();
        match self.graph.create_op(kind, Vec::new(), attrs, results) {
            Ok(op) => {
                self.graph.op_mut(op).loc = Location(Some(loc));
                let values = self.graph.op(op).results.clone();
                self.created(names, &values);
                self.pending.push((op, operands));
                Some(op)
            }
            Err(e) => {
                self.errors.push(Diagnostic::error(e.to_string(), loc));
                None
            }
        }
    }

    /// Sets the operands of every created op; reports names defined nowhere.
    fn resolve_operands(&mut self) {
        for (op, names) in std::mem::take(&mut self.pending) {
            let mut operands = Vec::with_capacity(names.len());
            for name in names {
                match self.values.get(name.text) {
                    Some(def) => operands.extend(def.value),
                    None => self.errors.push(
                        Diagnostic::error(format!("undefined value %{}", name.text), name.span)
                            .with_label("not defined in this graph"),
                    ),
                }
            }
            self.graph.op_mut(op).operands = operands;
        }
    }
}

fn lower_type(ty: &TypeExpr<'_>) -> Result<TensorType, Diagnostic> {
    let dtype = DType::from_name(ty.dtype.text).ok_or_else(|| {
        let d = Diagnostic::error(format!("unknown dtype `{}`", ty.dtype.text), ty.dtype.span)
            .with_label("unknown dtype");
        match suggest(ty.dtype.text, DType::ALL.iter().map(|d| d.name())) {
            Some(near) => d.with_help(format!("did you mean `{near}`?")),
            None => d.with_help("dtypes are f32, f16, bf16, i32, i64 and bool"),
        }
    })?;
    let dims = ty
        .dims
        .iter()
        .map(|&(d, span)| {
            usize::try_from(d).map_err(|_| {
                Diagnostic::error("a dimension cannot be negative", span).with_label("negative")
            })
        })
        .collect::<Result<Vec<usize>, _>>()?;
    Ok(TensorType::new(dtype, dims))
}

fn attr_value(value: &AttrValue) -> Attr {
    match value {
        AttrValue::Int(i) => Attr::Int(*i),
        AttrValue::Float(x) => Attr::Float(*x),
        AttrValue::Bool(b) => Attr::Bool(*b),
        AttrValue::Str(s) => Attr::Str(s.clone()),
        AttrValue::List(items) => {
            let ints: Option<Vec<i64>> = items
                .iter()
                .map(|n| match n {
                    Number::Int(i) => Some(*i),
                    Number::Float(_) => None,
                })
                .collect();
            match ints {
                Some(ints) => Attr::Ints(ints),
                None => Attr::Floats(
                    items
                        .iter()
                        .map(|n| match *n {
                            Number::Int(i) => i as f64,
                            Number::Float(x) => x,
                        })
                        .collect(),
                ),
            }
        }
    }
}

/// The candidate closest to `name`, if within edit distance 2 (the first
/// such in order on a tie).
fn suggest<'n>(name: &str, candidates: impl Iterator<Item = &'n str>) -> Option<&'n str> {
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|&(d, _)| d <= 2)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = prev + usize::from(ca != cb);
            prev = row[j + 1];
            row[j + 1] = substitute.min(prev + 1).min(row[j] + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("relux", "relu"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(
            suggest("f31", DType::ALL.iter().map(|d| d.name())),
            Some("f32")
        );
        assert_eq!(suggest("zzzzzz", DType::ALL.iter().map(|d| d.name())), None);
    }
}
