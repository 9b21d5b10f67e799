//! Diagnostics: a message with a primary span, secondary notes and a help
//! line, rendered like rustc's with `codespan-reporting`.

use codespan_reporting::diagnostic::Label;
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, Config};
use dcir_ir::{Span, VerifyError};

/// One error found while reading (or verifying) a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// What is wrong, one line.
    pub message: String,
    /// Where, in bytes of the source; `None` when no place is to blame.
    pub span: Option<Span>,
    /// Text shown under the primary span (may be empty).
    pub label: String,
    /// Related places, each with its own text ("first defined here").
    pub notes: Vec<(Span, String)>,
    /// A suggestion ("did you mean `relu`?").
    pub help: Option<String>,
}

impl Diagnostic {
    /// An error at `span` with no label, note or help.
    pub fn error(message: impl Into<String>, span: Span) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            span: Some(span),
            label: String::new(),
            notes: Vec::new(),
            help: None,
        }
    }

    /// Sets the label of the primary span.
    pub fn with_label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = label.into();
        self
    }

    /// Adds a note at another place.
    pub fn with_note(mut self, span: Span, note: impl Into<String>) -> Diagnostic {
        self.notes.push((span, note.into()));
        self
    }

    /// Sets the help line.
    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    /// The 1-based line and column (in characters) where the primary span
    /// starts in `source`, if there is a span.
    pub fn line_col(&self, source: &str) -> Option<(usize, usize)> {
        let start = fit(self.span?, source).start;
        let before = &source[..start];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line = before.matches('\n').count() + 1;
        let col = source[line_start..start].chars().count() + 1;
        Some((line, col))
    }
}

impl From<&VerifyError> for Diagnostic {
    fn from(err: &VerifyError) -> Diagnostic {
        Diagnostic {
            message: match err.loc.0 {
                Some(_) => err.message.clone(),
                None => err.to_string(),
            },
            span: err.loc.0,
            label: String::new(),
            notes: Vec::new(),
            help: None,
        }
    }
}

/// The byte range of `span` clamped to `source` and widened to character
/// boundaries, so that any span can be shown against any text.
fn fit(span: Span, source: &str) -> std::ops::Range<usize> {
    let mut start = span.range().start.min(source.len());
    let mut end = span.range().end.clamp(start, source.len());
    while !source.is_char_boundary(start) {
        start -= 1;
    }
    while !source.is_char_boundary(end) {
        end += 1;
    }
    start..end
}

/// Renders `diags` against `source` (named `file_name` in the output), without
/// colours:
///
/// ```text
/// error: unknown op `relux`
///   ┌─ model.dcir:3:8
///   │
/// 3 │   %y = relux %x : f32[4]
///   │        ^^^^^ unknown op
///   │
///   = help: did you mean `relu`?
/// ```
///
/// A source that was not UTF-8 is rendered from its lossy conversion
/// ([`String::from_utf8_lossy`]); spans are clamped to the text. Control
/// characters of the source and the messages are shown as `?` (see
/// [`printable`]).
pub fn render(file_name: &str, source: &str, diags: &[Diagnostic]) -> String {
    render_styled(file_name, source, diags, Style::Plain)
}

/// How [`render_styled`] marks up its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Plain text (files, pipes).
    Plain,
    /// Coloured with ANSI escapes (a terminal).
    Ansi,
}

/// [`render`], coloured for a terminal with [`Style::Ansi`].
pub fn render_styled(file_name: &str, source: &str, diags: &[Diagnostic], style: Style) -> String {
    let source = printable(source);
    let file = SimpleFile::new(printable(file_name), source.as_ref());
    let config = Config::default();
    let mut out = String::new();
    for d in diags {
        let mut labels = Vec::new();
        if let Some(span) = d.span {
            labels.push(Label::primary((), fit(span, &source)).with_message(printable(&d.label)));
        }
        for (span, note) in &d.notes {
            labels.push(Label::secondary((), fit(*span, &source)).with_message(printable(note)));
        }
        let diagnostic = codespan_reporting::diagnostic::Diagnostic::error()
            .with_message(printable(&d.message))
            .with_labels(labels)
            .with_notes(
                d.help
                    .iter()
                    .map(|h| format!("help: {}", printable(h)))
                    .collect(),
            );
        let rendered = match style {
            Style::Plain => term::emit_into_string(&config, &file, &diagnostic).ok(),
            Style::Ansi => {
                let mut ansi = term::termcolor::Ansi::new(Vec::new());
                term::emit_to_write_style(&mut ansi, &config, &file, &diagnostic)
                    .ok()
                    .and_then(|()| String::from_utf8(ansi.into_inner()).ok())
            }
        };
        match rendered {
            Some(text) => out.push_str(&text),
            None => out.push_str(&format!("error: {}\n", printable(&d.message))),
        }
    }
    out
}

/// `text` with every control character but tab, newline and carriage return
/// (C0, DEL, C1) and every bidirectional override or isolate (which can make
/// shown text read other than it is) replaced by as many `?` as it has
/// bytes, so that a diagnostic never sends the input's escapes to a
/// terminal and every span still points at the same bytes.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| {
        (c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if hidden(c) {
            out.extend(std::iter::repeat_n('?', c.len_utf8()));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}
