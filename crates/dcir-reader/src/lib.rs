//! Reads `.dcir` text into a [`dcir_ir::Module`].
//!
//! The reader is the IR's only front door from text, split like Cranelift's
//! `cranelift-reader`: a [`logos`] lexer (`lexer`), an LR grammar compiled by
//! LALRPOP into a spanned syntax tree (`grammar.lalrpop`, `ast`), and a
//! lowering to the IR through the graph's low-level API (`lower`). Every
//! problem becomes a [`Diagnostic`] with a span; [`render`] shows them like
//! rustc does. The reader never panics and never recurses on the input's
//! nesting.
//!
//! Reading does not verify: a module that reads is well-formed text with
//! every name resolved, and [`dcir_ir::verify_module`] (run by the driver)
//! checks the rest. Reading the printer's output ([`dcir_ir::print_module`])
//! gives back an equal module.
//!
//! ```
//! let text = "graph @g(%x: f32[4]) -> (f32[4]) {\n  %y = relu %x : f32[4]\n  return %y\n}\n";
//! let module = dcir_reader::parse_module(text).expect("valid text");
//! assert_eq!(dcir_ir::print_module(&module), text);
//! ```

mod ast;
mod diagnostic;
mod lexer;
mod lower;

lalrpop_util::lalrpop_mod!(
    #[allow(clippy::all, clippy::pedantic, unused_qualifications)]
    grammar
);

use dcir_ir::{Module, Span};
use lalrpop_util::ParseError;

pub use diagnostic::{Diagnostic, Style, printable, render, render_styled};

use lexer::Token;

/// Reads a module from text: the first syntax error, or every error found
/// while resolving names, ops, types and attributes.
pub fn parse_module(source: &str) -> Result<Module, Vec<Diagnostic>> {
    let graphs = grammar::ModuleParser::new()
        .parse(lexer::tokens(source))
        .map_err(|e| vec![syntax_error(e)])?;
    lower::lower_module(&graphs, source)
}

/// Reads a module from bytes: text that is not UTF-8 is an error at its first
/// bad byte; otherwise as [`parse_module`].
pub fn read_bytes(bytes: &[u8]) -> Result<Module, Vec<Diagnostic>> {
    match std::str::from_utf8(bytes) {
        Ok(source) => parse_module(source),
        Err(e) => {
            let start = e.valid_up_to();
            let len = e.error_len().unwrap_or(bytes.len() - start);
            let byte = bytes.get(start).copied().unwrap_or_default();
            let span = Span::new(start, start + len);
            Err(vec![
                Diagnostic::error(format!("the text is not UTF-8 (byte 0x{byte:02x})"), span)
                    .with_label("not UTF-8"),
            ])
        }
    }
}

fn syntax_error(e: ParseError<usize, Token<'_>, Diagnostic>) -> Diagnostic {
    match e {
        ParseError::InvalidToken { location } => {
            Diagnostic::error("invalid token", Span::new(location, location))
        }
        ParseError::UnrecognizedEof { location, expected } => Diagnostic::error(
            format!("unexpected end of file, expected {}", describe(&expected)),
            Span::new(location, location),
        ),
        ParseError::UnrecognizedToken {
            token: (start, token, end),
            expected,
        } => Diagnostic::error(
            format!("expected {}, found {token}", describe(&expected)),
            Span::new(start, end),
        )
        .with_label("unexpected token"),
        ParseError::ExtraToken {
            token: (start, token, end),
        } => Diagnostic::error(format!("unexpected {token}"), Span::new(start, end)),
        ParseError::User { error } => error,
    }
}

/// "`:`", "one of `:`, `{`": the grammar's terminal names in words.
fn describe(expected: &[String]) -> String {
    let words: Vec<String> = expected
        .iter()
        .map(|t| match t.as_str() {
            "Value" => "a value (`%name`)".to_string(),
            "Symbol" => "a symbol (`@name`)".to_string(),
            "Ident" => "a name".to_string(),
            "Int" => "an integer".to_string(),
            "Float" => "a float".to_string(),
            "Str" => "a string".to_string(),
            quoted => format!("`{}`", quoted.trim_matches('"')),
        })
        .collect();
    match words.as_slice() {
        [] => "nothing more".to_string(),
        [one] => one.clone(),
        many => format!("one of {}", many.join(", ")),
    }
}
