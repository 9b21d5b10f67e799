//! Pass definitions, their typed options, and the explicit registry.

use indexmap::IndexMap;

use crate::pass::Pass;

/// The type of a pass option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionKind {
    /// A signed integer.
    Int,
    /// `true` or `false` (a bare `name` means `true`).
    Bool,
    /// A string without spaces, braces or commas.
    Str,
    /// Comma-separated strings.
    List,
}

impl OptionKind {
    /// The name used in help and errors.
    pub fn describe(self) -> &'static str {
        match self {
            OptionKind::Int => "integer",
            OptionKind::Bool => "bool",
            OptionKind::Str => "string",
            OptionKind::List => "list",
        }
    }
}

/// One option of a pass: name, type, default (as text) and help.
#[derive(Clone, Copy, Debug)]
pub struct PassOptionDef {
    /// Option name (`max-elems`).
    pub name: &'static str,
    /// Its type.
    pub kind: OptionKind,
    /// Its default, written as a user would write it.
    pub default: &'static str,
    /// One line of help.
    pub help: &'static str,
}

/// A parsed option value.
#[derive(Clone, Debug, PartialEq)]
pub enum OptionValue {
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
    /// A list of strings.
    List(Vec<String>),
}

impl OptionValue {
    /// Parses `text` as a value of `kind`.
    pub fn parse(kind: OptionKind, text: &str) -> Result<OptionValue, String> {
        match kind {
            OptionKind::Int => text
                .parse()
                .map(OptionValue::Int)
                .map_err(|_| format!("`{text}` is not an integer")),
            OptionKind::Bool => match text {
                "true" => Ok(OptionValue::Bool(true)),
                "false" => Ok(OptionValue::Bool(false)),
                _ => Err(format!("`{text}` is not `true` or `false`")),
            },
            OptionKind::Str => Ok(OptionValue::Str(text.to_string())),
            OptionKind::List => Ok(OptionValue::List(
                text.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            )),
        }
    }
}

/// The options of one pass instance: every declared option, defaults filled in.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassOptions(IndexMap<&'static str, OptionValue>);

impl PassOptions {
    /// The integer option `name` (declared as [`OptionKind::Int`]).
    pub fn int(&self, name: &str) -> i64 {
        match self.0.get(name) {
            Some(OptionValue::Int(i)) => *i,
            other => panic!("option `{name}` is not a declared integer: {other:?}"),
        }
    }

    /// The boolean option `name`.
    pub fn bool(&self, name: &str) -> bool {
        match self.0.get(name) {
            Some(OptionValue::Bool(b)) => *b,
            other => panic!("option `{name}` is not a declared bool: {other:?}"),
        }
    }

    /// The string option `name`.
    pub fn str(&self, name: &str) -> &str {
        match self.0.get(name) {
            Some(OptionValue::Str(s)) => s,
            other => panic!("option `{name}` is not a declared string: {other:?}"),
        }
    }

    /// The list option `name`.
    pub fn list(&self, name: &str) -> &[String] {
        match self.0.get(name) {
            Some(OptionValue::List(v)) => v,
            other => panic!("option `{name}` is not a declared list: {other:?}"),
        }
    }

    pub(crate) fn set(&mut self, name: &'static str, value: OptionValue) {
        self.0.insert(name, value);
    }
}

/// Creates a pass from its options.
pub type PassFactory = fn(&PassOptions) -> Result<Box<dyn Pass>, String>;

/// A registered pass: what `--list-passes` shows and how to create it.
#[derive(Clone, Copy, Debug)]
pub struct PassDef {
    /// Name used in pipelines.
    pub name: &'static str,
    /// One-line summary.
    pub summary: &'static str,
    /// Options, in the order they are documented.
    pub options: &'static [PassOptionDef],
    /// Creates an instance.
    pub create: PassFactory,
}

impl PassDef {
    /// The options with their defaults.
    pub fn default_options(&self) -> PassOptions {
        let mut options = PassOptions::default();
        for o in self.options {
            let value = OptionValue::parse(o.kind, o.default).unwrap_or_else(|e| {
                panic!(
                    "pass `{}` option `{}` has a bad default: {e}",
                    self.name, o.name
                )
            });
            options.set(o.name, value);
        }
        options
    }
}

/// The passes a tool knows, by name, in registration order. Nothing is
/// registered implicitly: a tool builds its registry (usually from
/// [`PassRegistry::with_builtins`]) and adds its own passes.
#[derive(Clone, Debug, Default)]
pub struct PassRegistry {
    passes: IndexMap<&'static str, PassDef>,
}

impl PassRegistry {
    /// An empty registry.
    pub fn new() -> PassRegistry {
        PassRegistry::default()
    }

    /// A registry of dcir's own passes.
    pub fn with_builtins() -> PassRegistry {
        let mut registry = PassRegistry::new();
        for def in crate::transforms::BUILTIN_PASSES {
            registry
                .register(*def)
                .expect("builtin pass names are unique");
        }
        registry
    }

    /// Adds a pass; an error if its name is taken.
    pub fn register(&mut self, def: PassDef) -> Result<(), String> {
        if self.passes.contains_key(def.name) {
            return Err(format!("a pass named `{}` is already registered", def.name));
        }
        self.passes.insert(def.name, def);
        Ok(())
    }

    /// The pass named `name`.
    pub fn get(&self, name: &str) -> Option<&PassDef> {
        self.passes.get(name)
    }

    /// Every pass, sorted by name.
    pub fn sorted(&self) -> Vec<&PassDef> {
        let mut defs: Vec<&PassDef> = self.passes.values().collect();
        defs.sort_by_key(|d| d.name);
        defs
    }

    /// Names of all passes, in registration order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.passes.keys().copied()
    }

    /// The help for a `name` no pass has: the nearest name (within two
    /// edits), and where the list is.
    pub fn unknown_name_help(&self, name: &str) -> String {
        match crate::pipeline::closest(name, self.names()) {
            Some(near) => format!("did you mean `{near}`? (`--list-passes` lists them all)"),
            None => "`--list-passes` lists the passes".to_string(),
        }
    }
}
