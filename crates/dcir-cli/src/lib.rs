//! The dcir drivers, as a library so downstream tools get every flag.
//!
//! [`opt::main_with`] is `dcir-opt`'s whole main: read a `.dcir` file,
//! verify it, print it canonically. A downstream tool calls it with its own
//! name (MLIR's `MlirOptMain` pattern).

/// Every pass `dcir-opt` knows: the pass library's and `fuse`.
pub fn default_registry() -> dcir_passes::PassRegistry {
    let mut registry = dcir_passes::PassRegistry::with_builtins();
    registry
        .register(dcir_fusion::FUSE)
        .expect("`fuse` is not a builtin name");
    registry
}

pub mod import;
pub mod opt;
pub mod run;
