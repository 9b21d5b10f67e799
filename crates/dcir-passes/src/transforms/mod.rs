//! dcir's own passes. Each module holds one pass and its [`PassDef`].

mod cse;
mod dce;

use crate::registry::PassDef;

/// Every built-in pass, in the order `--list-passes` documents them.
pub const BUILTIN_PASSES: &[PassDef] = &[cse::DEF, dce::DEF];
