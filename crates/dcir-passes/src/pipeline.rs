//! Textual pipelines: `canonicalize,cse,dce,fold-constants{max-elems=64}`.
//!
//! Passes are separated by commas. Options go in braces after the pass name,
//! separated by spaces, as `name=value` (a bare `name` sets a bool option);
//! a list value is comma-separated: `hoist-weights{inputs=x,r}`.

use std::ops::Range;

use crate::pass::Pass;
use crate::registry::{OptionKind, OptionValue, PassRegistry};

/// One pass of a pipeline as written.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineEntry {
    /// The pass name.
    pub name: String,
    /// Where the name is in the pipeline text.
    pub span: Range<usize>,
    /// `(option, value, span of the option)`; the value of a bare option is `None`.
    pub options: Vec<(String, Option<String>, Range<usize>)>,
}

/// A pipeline that cannot be parsed or built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct PipelineError {
    /// What is wrong.
    pub message: String,
    /// Where in the pipeline text.
    pub span: Range<usize>,
    /// A suggestion, if there is one.
    pub help: Option<String>,
}

impl PipelineError {
    fn new(message: impl Into<String>, span: Range<usize>) -> PipelineError {
        PipelineError {
            message: message.into(),
            span,
            help: None,
        }
    }

    /// The error with the pipeline text and a caret under the culprit:
    ///
    /// ```text
    /// error: unknown pass `csee`
    ///   --pipeline 'canonicalize,csee,dce'
    ///                            ^^^^
    ///   help: did you mean `cse`?
    /// ```
    pub fn render(&self, pipeline: &str) -> String {
        let prefix = "  --pipeline '";
        let start = pipeline[..self.span.start.min(pipeline.len())]
            .chars()
            .count();
        let width = pipeline
            .get(self.span.clone())
            .map_or(1, |s| s.chars().count().max(1));
        let mut out = format!(
            "error: {}\n{prefix}{pipeline}'\n{}{}\n",
            self.message,
            " ".repeat(prefix.chars().count() + start),
            "^".repeat(width)
        );
        if let Some(help) = &self.help {
            out.push_str(&format!("  help: {help}\n"));
        }
        out
    }
}

/// Splits a pipeline into entries; checks only the syntax.
pub fn parse_pipeline(text: &str) -> Result<Vec<PipelineEntry>, PipelineError> {
    let mut entries = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    loop {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        while i < bytes.len()
            && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'-' | b'_' | b'.'))
        {
            i += 1;
        }
        if start == i {
            let message = match text[i..].chars().next() {
                None | Some(',') => "missing pass name in pipeline".to_string(),
                Some(c) => format!("unexpected character `{c}` in pipeline"),
            };
            return Err(PipelineError::new(message, i..i + 1));
        }
        let mut entry = PipelineEntry {
            name: text[start..i].to_string(),
            span: start..i,
            options: Vec::new(),
        };
        if bytes.get(i) == Some(&b'{') {
            let open = i;
            let close = text[open..]
                .find('}')
                .map(|c| open + c)
                .ok_or_else(|| PipelineError::new("unclosed `{` in pipeline", open..open + 1))?;
            let mut offset = open + 1;
            for word in text[open + 1..close].split(' ') {
                let span = offset..offset + word.len();
                offset += word.len() + 1;
                if word.is_empty() {
                    continue;
                }
                let (key, value) = match word.split_once('=') {
                    Some((k, v)) => (k.to_string(), Some(v.to_string())),
                    None => (word.to_string(), None),
                };
                entry.options.push((key, value, span));
            }
            i = close + 1;
        }
        entries.push(entry);
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        match bytes.get(i) {
            None => return Ok(entries),
            Some(b',') => i += 1,
            Some(_) => return Err(PipelineError::new("expected `,` between passes", i..i + 1)),
        }
    }
}

/// Parses a pipeline and creates its passes from `registry`.
pub fn build_pipeline(
    registry: &PassRegistry,
    text: &str,
) -> Result<Vec<Box<dyn Pass>>, PipelineError> {
    let mut passes = Vec::new();
    for entry in parse_pipeline(text)? {
        let Some(def) = registry.get(&entry.name) else {
            let mut e =
                PipelineError::new(format!("unknown pass `{}`", entry.name), entry.span.clone());
            e.help = Some(registry.unknown_name_help(&entry.name));
            return Err(e);
        };
        let mut options = def.default_options();
        for (key, value, span) in &entry.options {
            let Some(o) = def.options.iter().find(|o| o.name == key) else {
                let names: Vec<&str> = def.options.iter().map(|o| o.name).collect();
                let mut e = PipelineError::new(
                    format!("pass `{}` has no option `{key}`", def.name),
                    span.clone(),
                );
                e.help = Some(if names.is_empty() {
                    format!("`{}` takes no options", def.name)
                } else {
                    format!("its options are: {}", names.join(", "))
                });
                return Err(e);
            };
            let parsed = match (value, o.kind) {
                (None, OptionKind::Bool) => Ok(OptionValue::Bool(true)),
                (None, kind) => Err(format!("needs a value: `{key}=<{}>`", kind.describe())),
                (Some(v), kind) => OptionValue::parse(kind, v),
            };
            let value = parsed.map_err(|m| {
                PipelineError::new(
                    format!("option `{key}` of pass `{}`: {m}", def.name),
                    span.clone(),
                )
            })?;
            options.set(o.name, value);
        }
        let pass = (def.create)(&options).map_err(|m| {
            PipelineError::new(format!("pass `{}`: {m}", def.name), entry.span.clone())
        })?;
        passes.push(pass);
    }
    Ok(passes)
}

/// The candidate within edit distance 2 of `name`, if any (closest first).
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|&(d, _)| d <= 2)
        .min()
        .map(|(_, c)| c)
}

/// Edits (insertions, deletions, substitutions, swaps of two neighbours)
/// from `a` to `b`: the optimal string alignment distance.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j - 1] + cost)
                .min(d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_options() {
        let entries =
            parse_pipeline(" cse , fold-constants{max-elems=64 verbose}, x{l=a,b}").unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].name, "cse");
        assert_eq!(
            entries[1].options[0],
            ("max-elems".to_string(), Some("64".to_string()), 22..34)
        );
        assert_eq!(entries[1].options[1].1, None);
        assert_eq!(entries[2].options[0].1.as_deref(), Some("a,b"));
    }

    #[test]
    fn syntax_errors_point_at_the_problem() {
        assert_eq!(parse_pipeline("cse,,dce").unwrap_err().span, 4..5);
        assert_eq!(parse_pipeline("cse dce").unwrap_err().span, 4..5);
        assert_eq!(parse_pipeline("cse{a=1").unwrap_err().span, 3..4);
        assert!(parse_pipeline("").is_err());
        assert!(parse_pipeline("cse,").is_err());
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("csee", "cse"), 1);
        assert_eq!(edit_distance("dce", "cse"), 2);
        assert_eq!(edit_distance("abc", "xyz"), 3);
        assert_eq!(
            edit_distance("fsue", "fuse"),
            1,
            "a swap of neighbours is one edit"
        );
    }
}
