//! Analyses: facts computed from a graph on demand and cached until a pass
//! changes the module without declaring them preserved.

mod cost;
mod dominance;
mod liveness;
mod shapes;
mod topo;
mod usedef;

use std::any::{Any, TypeId};
use std::rc::Rc;

use dcir_ir::Graph;
use rustc_hash::FxHashMap;

pub use cost::{GraphCost, OpCost, op_cost};
pub use dominance::{Dominance, PostDominance};
pub use liveness::{Interval, Liveness};
pub use shapes::InferredTypes;
pub use topo::TopoOrder;
pub use usedef::UseDef;

/// A fact about one graph.
pub trait Analysis: Sized + 'static {
    /// Computes it.
    fn compute(graph: &Graph) -> Self;
}

/// Caches analyses per graph (by graph name) and analysis type.
#[derive(Default)]
pub struct AnalysisManager {
    cache: FxHashMap<(String, TypeId), Rc<dyn Any>>,
    computed: usize,
}

impl AnalysisManager {
    /// An empty cache.
    pub fn new() -> AnalysisManager {
        AnalysisManager::default()
    }

    /// Analysis `A` of `graph`, computed now or taken from the cache.
    pub fn get<A: Analysis>(&mut self, graph: &Graph) -> Rc<A> {
        let key = (graph.name().to_string(), TypeId::of::<A>());
        if let Some(cached) = self.cache.get(&key) {
            return Rc::clone(cached)
                .downcast::<A>()
                .expect("the key's type id matches");
        }
        self.computed += 1;
        let fresh = Rc::new(A::compute(graph));
        self.cache.insert(key, fresh.clone());
        fresh
    }

    /// Drops every cached analysis but those in `keep`.
    pub fn invalidate_except(&mut self, keep: &[TypeId]) {
        self.cache.retain(|(_, ty), _| keep.contains(ty));
    }

    /// How many analyses were computed (not served from the cache) so far.
    pub fn computed_count(&self) -> usize {
        self.computed
    }
}
