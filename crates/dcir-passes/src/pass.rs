//! The pass trait and what a pass returns.

use std::any::TypeId;

use dcir_ir::{Location, Module};

use crate::analysis::AnalysisManager;

/// A transformation of a module.
///
/// A pass is created from its [`crate::PassDef`] with parsed options, runs on
/// the whole module, and says whether it changed anything and which cached
/// analyses stay valid.
pub trait Pass {
    /// The registered name (`cse`).
    fn name(&self) -> &'static str;

    /// True for a pass that must run even past an opt-bisect limit (one that
    /// later stages rely on for correctness rather than speed).
    fn is_required(&self) -> bool {
        false
    }

    /// Runs on `module`; analyses come from `analyses`.
    fn run(
        &mut self,
        module: &mut Module,
        analyses: &mut AnalysisManager,
    ) -> Result<PassResult, PassError>;
}

/// What a pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassResult {
    /// True when the module changed.
    pub changed: bool,
    /// Analyses that stay valid although the module changed.
    pub preserved: Vec<TypeId>,
}

impl PassResult {
    /// Nothing changed; every analysis stays valid.
    pub fn unchanged() -> PassResult {
        PassResult {
            changed: false,
            preserved: Vec::new(),
        }
    }

    /// The module changed; no analysis is preserved unless added with [`PassResult::preserving`].
    pub fn changed() -> PassResult {
        PassResult {
            changed: true,
            preserved: Vec::new(),
        }
    }

    /// `changed` as given.
    pub fn from_changed(changed: bool) -> PassResult {
        PassResult {
            changed,
            preserved: Vec::new(),
        }
    }

    /// Declares analysis `A` still valid after the change.
    pub fn preserving<A: 'static>(mut self) -> PassResult {
        self.preserved.push(TypeId::of::<A>());
        self
    }
}

/// A pass failure: a message, and where in the IR when an op is to blame.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct PassError {
    /// What went wrong.
    pub message: String,
    /// The graph involved, if one.
    pub graph: Option<String>,
    /// The op's location, if one is to blame.
    pub loc: Location,
}

impl PassError {
    /// An error with no location.
    pub fn new(message: impl Into<String>) -> PassError {
        PassError {
            message: message.into(),
            graph: None,
            loc: Location::default(),
        }
    }

    /// An error pointing at an op of `graph`.
    pub fn at(message: impl Into<String>, graph: &dcir_ir::Graph, op: dcir_ir::OpId) -> PassError {
        PassError {
            message: message.into(),
            graph: Some(graph.name().to_string()),
            loc: graph.op(op).loc,
        }
    }
}

impl From<dcir_ir::BuildError> for PassError {
    fn from(e: dcir_ir::BuildError) -> PassError {
        PassError::new(e.to_string())
    }
}
