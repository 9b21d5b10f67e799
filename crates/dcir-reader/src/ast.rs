//! The syntax tree the grammar produces: the text's structure with a span on
//! every name, type and statement, before any name is resolved.
//!
//! The tree is shallow by construction: a `fused` region holds only
//! [`OpStmt`]s (the grammar rejects nested groups), so nothing walks or drops
//! it recursively.

use dcir_ir::Span;

/// A name as written, without its sigil (`%`, `@`), with its span.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Name<'a> {
    /// The text.
    pub text: &'a str,
    /// Where it is.
    pub span: Span,
}

/// One `graph`.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphDecl<'a> {
    /// `@name`.
    pub name: Name<'a>,
    /// Parameters and their types.
    pub params: Vec<(Name<'a>, TypeExpr<'a>)>,
    /// Declared result types.
    pub results: Vec<TypeExpr<'a>>,
    /// The body's statements.
    pub body: Vec<Stmt<'a>>,
    /// The header, `graph` to the closing `)` of the result types.
    pub span: Span,
}

/// A tensor type, `f32[1,3]`.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeExpr<'a> {
    /// The dtype's name.
    pub dtype: Name<'a>,
    /// The extents, each with its span.
    pub dims: Vec<(i64, Span)>,
    /// The whole type.
    pub span: Span,
}

/// A statement of a graph body. Boxed, so that the parser's stack entries
/// stay small (they are moved on every shift and reduce).
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt<'a> {
    /// An ordinary op or a terminator.
    Op(Box<OpStmt<'a>>),
    /// A `fused` group.
    Fused(Box<FusedStmt<'a>>),
}

impl<'a> From<Box<OpStmt<'a>>> for Stmt<'a> {
    fn from(op: Box<OpStmt<'a>>) -> Stmt<'a> {
        Stmt::Op(op)
    }
}

/// `%r = op %a, %b {attrs} : types`, or `op %a, %b` without results.
#[derive(Clone, Debug, PartialEq)]
pub struct OpStmt<'a> {
    /// Result names (empty for the form without results).
    pub results: Vec<Name<'a>>,
    /// The op's name.
    pub op: Name<'a>,
    /// Operand names.
    pub operands: Vec<Name<'a>>,
    /// Attributes as written.
    pub attrs: Vec<AttrEntry<'a>>,
    /// Result types (empty for the form without results).
    pub types: Vec<TypeExpr<'a>>,
    /// The whole statement.
    pub span: Span,
}

/// `%r = fused @g(%arg = %operand, ...) {attrs} : types { region }`.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedStmt<'a> {
    /// Result names.
    pub results: Vec<Name<'a>>,
    /// The `fused` keyword.
    pub keyword: Span,
    /// The group's symbol.
    pub symbol: Name<'a>,
    /// Region arguments and the outer values they bind, in order.
    pub bindings: Vec<(Name<'a>, Name<'a>)>,
    /// Attributes as written.
    pub attrs: Vec<AttrEntry<'a>>,
    /// Result types.
    pub types: Vec<TypeExpr<'a>>,
    /// The region's statements.
    pub body: Vec<OpStmt<'a>>,
    /// The header, first result to last type.
    pub span: Span,
}

/// `name = value` inside `{...}`.
#[derive(Clone, Debug, PartialEq)]
pub struct AttrEntry<'a> {
    /// The attribute's name.
    pub name: Name<'a>,
    /// Its value.
    pub value: AttrValue,
    /// Where the value is.
    pub value_span: Span,
}

/// An attribute value as written.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// An integer.
    Int(i64),
    /// A float (`nan`, `inf`, `-inf` included).
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
    /// A string, escapes decoded.
    Str(String),
    /// `[n, ...]`: integers and floats.
    List(Vec<Number>),
}

/// An element of a list attribute.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
}
