//! The pass library: how dcir rewrites IR.
//!
//! - [`Pass`]: name, whether it is required, and `run` over a module;
//! - [`PassDef`] / [`PassRegistry`]: passes registered explicitly by name,
//!   with a summary and typed options ([`PassOptionDef`]);
//! - [`build_pipeline`]: textual pipelines, `canonicalize,cse,dce`;
//! - [`PassManager`]: runs a pipeline with [`Instrumentation`]
//!   (print before/after, verify each, time, dump, bisect);
//! - [`analysis`]: cached facts (users, topological order, liveness,
//!   dominance, inferred types, cost counters);
//! - [`transforms`]: dcir's own passes.
//!
//! A downstream crate defines a [`Pass`], adds a [`PassDef`] to
//! [`PassRegistry::with_builtins`], and hands the registry to
//! `dcir_cli::opt::main_with` (see `docs/writing-a-pass.md`).

pub mod analysis;
mod manager;
mod pass;
mod pipeline;
mod registry;
pub mod transforms;

pub use manager::{Instrumentation, PassManager, PassRecord, PipelineFailure};
pub use pass::{Pass, PassError, PassResult};
pub use pipeline::{PipelineEntry, PipelineError, build_pipeline, parse_pipeline};
pub use registry::{
    OptionKind, OptionValue, PassDef, PassFactory, PassOptionDef, PassOptions, PassRegistry,
};

/// What the drivers run on a graph before fusing it (`dcir-opt --fuse`
/// without `--pipeline`, `dcir-run`): local cleanups, and scale factors
/// moved off matmul operands so the operands stay views (whose transposes
/// the second `canonicalize` folds into the matmul).
pub const FUSION_PIPELINE: &str = "canonicalize,fold-matmul-scale,fold-gelu,canonicalize,cse,dce";
