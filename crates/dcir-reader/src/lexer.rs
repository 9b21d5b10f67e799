//! The tokens of `.dcir` text, recognized by a [`logos`] lexer.
//!
//! Whitespace, `//` comments and a leading UTF-8 byte order mark are
//! skipped. Every malformed token (an
//! integer out of the `i64` range, a bad string escape, an unterminated
//! string, a character that starts no token) becomes a spanned
//! [`Diagnostic`]; the lexer never panics.

use std::fmt;

use dcir_ir::Span;
use logos::{Lexer, Logos};

use crate::diagnostic::Diagnostic;

/// One token. Names (`%x`, `@g`, identifiers) borrow the source text, without
/// their sigil.
#[derive(Logos, Clone, Debug, PartialEq)]
#[logos(error(LexError, LexError::unexpected))]
#[logos(skip r"[ \t\r\n\f]+")]
#[logos(skip(r"//[^\n]*", allow_greedy = true))]
pub enum Token<'a> {
    /// `graph`.
    #[token("graph")]
    Graph,
    /// `fused`.
    #[token("fused")]
    Fused,
    /// `true`.
    #[token("true")]
    True,
    /// `false`.
    #[token("false")]
    False,
    /// `(`.
    #[token("(")]
    LParen,
    /// `)`.
    #[token(")")]
    RParen,
    /// `[`.
    #[token("[")]
    LBracket,
    /// `]`.
    #[token("]")]
    RBracket,
    /// `{`.
    #[token("{")]
    LBrace,
    /// `}`.
    #[token("}")]
    RBrace,
    /// `,`.
    #[token(",")]
    Comma,
    /// `:`.
    #[token(":")]
    Colon,
    /// `=`.
    #[token("=")]
    Eq,
    /// `->`.
    #[token("->")]
    Arrow,
    /// `%name`, without the `%`.
    #[regex(r"%[A-Za-z0-9_.]+", |lex| &lex.slice()[1..])]
    Value(&'a str),
    /// `@name`, without the `@`.
    #[regex(r"@[A-Za-z_][A-Za-z0-9_.]*", |lex| &lex.slice()[1..])]
    Symbol(&'a str),
    /// An identifier: an op name, a dtype or an attribute name.
    #[regex(r"[A-Za-z_][A-Za-z0-9_.]*", |lex| lex.slice())]
    Ident(&'a str),
    /// An integer literal.
    #[regex(r"-?[0-9]+", integer)]
    Int(i64),
    /// A float literal, `nan`, `inf` or `-inf`.
    #[regex(r"-?[0-9]+\.[0-9]+([eE][+-]?[0-9]+)?", float)]
    #[regex(r"-?[0-9]+[eE][+-]?[0-9]+", float)]
    #[token("nan", |_| f64::NAN)]
    #[token("inf", |_| f64::INFINITY)]
    #[token("-inf", |_| f64::NEG_INFINITY)]
    Float(f64),
    /// A string literal, escapes decoded.
    #[token("\"", string)]
    Str(String),
}

impl fmt::Display for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Token::Graph => "graph",
            Token::Fused => "fused",
            Token::True => "true",
            Token::False => "false",
            Token::LParen => "(",
            Token::RParen => ")",
            Token::LBracket => "[",
            Token::RBracket => "]",
            Token::LBrace => "{",
            Token::RBrace => "}",
            Token::Comma => ",",
            Token::Colon => ":",
            Token::Eq => "=",
            Token::Arrow => "->",
            Token::Value(v) => return write!(f, "`%{v}`"),
            Token::Symbol(s) => return write!(f, "`@{s}`"),
            Token::Ident(s) => s,
            Token::Int(i) => return write!(f, "`{i}`"),
            Token::Float(x) => return write!(f, "`{}`", dcir_ir::print::format_float(*x)),
            Token::Str(s) => return write!(f, "`{}`", dcir_ir::print::format_string(s)),
        };
        write!(f, "`{text}`")
    }
}

/// A malformed token: what is wrong and where.
#[derive(Clone, Debug, PartialEq)]
pub struct LexError {
    message: String,
    span: Span,
}

/// Required by logos; every error this lexer makes has its own message.
impl Default for LexError {
    fn default() -> LexError {
        LexError::new("invalid token", 0, 0)
    }
}

impl LexError {
    fn new(message: impl Into<String>, start: usize, end: usize) -> LexError {
        LexError {
            message: message.into(),
            span: Span::new(start, end),
        }
    }

    fn unexpected<'a>(lex: &mut Lexer<'a, Token<'a>>) -> LexError {
        let span = lex.span();
        let what = lex.slice().chars().next().map_or_else(
            || "unexpected end of input".to_string(),
            |c| format!("unexpected character {c:?}"),
        );
        LexError::new(what, span.start, span.end)
    }
}

impl From<LexError> for Diagnostic {
    fn from(e: LexError) -> Diagnostic {
        Diagnostic::error(e.message, e.span)
    }
}

fn integer<'a>(lex: &mut Lexer<'a, Token<'a>>) -> Result<i64, LexError> {
    lex.slice().parse().map_err(|_| {
        let span = lex.span();
        LexError::new(
            format!("integer `{}` does not fit in 64 bits", lex.slice()),
            span.start,
            span.end,
        )
    })
}

fn float<'a>(lex: &mut Lexer<'a, Token<'a>>) -> Result<f64, LexError> {
    lex.slice().parse().map_err(|_| {
        let span = lex.span();
        LexError::new(
            format!("invalid float `{}`", lex.slice()),
            span.start,
            span.end,
        )
    })
}

/// Reads a string literal after its opening quote, decoding escapes.
fn string<'a>(lex: &mut Lexer<'a, Token<'a>>) -> Result<String, LexError> {
    let open = lex.span().start;
    let rest = lex.remainder();
    let mut out = String::new();
    let mut i = 0;
    while let Some(c) = rest[i..].chars().next() {
        match c {
            '"' => {
                lex.bump(i + 1);
                return Ok(out);
            }
            '\\' => {
                let (decoded, len) = escape(&rest[i..]);
                let Some(decoded) = decoded else {
                    lex.bump(i + len);
                    return Err(LexError::new(
                        "invalid escape in string (use \\\" \\\\ \\n \\t or \\u{hex})",
                        open + 1 + i,
                        open + 1 + i + len,
                    ));
                };
                out.push(decoded);
                i += len;
            }
            c => {
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    lex.bump(rest.len());
    Err(LexError::new("unterminated string", open, open + 1))
}

/// Decodes the escape at the start of `s` (a backslash and what follows):
/// the character (`None` if malformed) and the escape's length in bytes.
fn escape(s: &str) -> (Option<char>, usize) {
    match s[1..].chars().next() {
        Some('"') => (Some('"'), 2),
        Some('\\') => (Some('\\'), 2),
        Some('n') => (Some('\n'), 2),
        Some('t') => (Some('\t'), 2),
        Some('u') => {
            let hex = s[2..]
                .strip_prefix('{')
                .and_then(|body| body.find('}').map(|k| &body[..k]));
            match hex {
                Some(hex)
                    if (1..=6).contains(&hex.len())
                        && hex.chars().all(|c| c.is_ascii_hexdigit()) =>
                {
                    (
                        u32::from_str_radix(hex, 16).ok().and_then(char::from_u32),
                        hex.len() + 4,
                    )
                }
                _ => (None, 2),
            }
        }
        Some(c) => (None, 1 + c.len_utf8()),
        None => (None, 1),
    }
}

/// The tokens of `source` with their byte ranges, in the form the parser
/// takes; a malformed token is an error item.
pub fn tokens(source: &str) -> impl Iterator<Item = Result<(usize, Token<'_>, usize), Diagnostic>> {
    let mut lexer = Token::lexer(source);
    // A UTF-8 byte order mark at the start (editors on Windows write one) is
    // not text; spans keep counting from the file's first byte.
    if source.starts_with('\u{feff}') {
        lexer.bump('\u{feff}'.len_utf8());
    }
    lexer.spanned().map(|(token, span)| match token {
        Ok(t) => Ok((span.start, t, span.end)),
        Err(e) => Err(e.into()),
    })
}

#[cfg(test)]
mod tests {
    use super::{Token, tokens};
    use dcir_ir::print::{format_float, format_string};

    /// The literals the printer writes lex back to the same values (no IR
    /// attribute takes arbitrary strings since `fused`'s parameters are typed).
    #[test]
    fn printed_literals_lex_back() {
        let text = "a\"b\\c\nd\te\u{1}é";
        let floats = [0.5, f64::NEG_INFINITY, 1e300, f64::INFINITY, -3.0e-12];
        let source = std::iter::once(format_string(text))
            .chain(floats.iter().map(|&x| format_float(x)))
            .collect::<Vec<_>>()
            .join(" ");
        let lexed: Vec<Token> = tokens(&source).map(|t| t.expect("lexes").1).collect();
        assert_eq!(lexed[0], Token::Str(text.to_string()));
        for (token, &x) in lexed[1..].iter().zip(&floats) {
            assert_eq!(*token, Token::Float(x), "{source}");
        }
    }
}
