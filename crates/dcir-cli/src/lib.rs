//! The dcir drivers, as a library so downstream tools get every flag.
//!
//! [`opt::main_with`] is `dcir-opt`'s whole main: read a `.dcir` file,
//! verify it, print it canonically. A downstream tool calls it with its own
//! name (MLIR's `MlirOptMain` pattern).

pub mod import;
pub mod opt;
pub mod run;
