//! Live intervals of the body's values over the topological order.

use dcir_ir::{Graph, ValueId};

use super::{Analysis, TopoOrder};

/// Steps at which a value is live, inclusive: step 0 is the graph's entry
/// (parameters are defined there), step `k + 1` is the `k`-th op of
/// [`TopoOrder`]. The `return` is the last step, so outputs live to the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// Step that defines the value.
    pub start: usize,
    /// Last step that uses it (`start` if none does).
    pub end: usize,
}

impl Interval {
    /// True when the two intervals share a step.
    pub fn overlaps(self, other: Interval) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

/// Live intervals of the body's values (parameters and the results of body
/// ops). Values inside `fused` regions are a kernel's business and have none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Liveness {
    intervals: Vec<Option<Interval>>,
    steps: usize,
}

impl Liveness {
    /// The interval of `value`, if it is a body value.
    pub fn interval(&self, value: ValueId) -> Option<Interval> {
        self.intervals.get(value.index()).copied().flatten()
    }

    /// Number of steps (ops in the order, plus the entry).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// The largest total size, in bytes, of values live at one step: what any
    /// memory plan needs at least (views such as reshape counted as buffers).
    pub fn peak_live_bytes(&self, graph: &Graph) -> usize {
        let mut delta = vec![0i128; self.steps + 1];
        for (v, interval) in graph.value_ids().zip(&self.intervals) {
            if let Some(iv) = interval {
                let bytes = graph.ty(v).size_bytes().unwrap_or(0) as i128;
                delta[iv.start] += bytes;
                delta[iv.end + 1] -= bytes;
            }
        }
        let mut live = 0i128;
        let mut peak = 0i128;
        for d in delta {
            live += d;
            peak = peak.max(live);
        }
        usize::try_from(peak).unwrap_or(usize::MAX)
    }
}

impl Analysis for Liveness {
    fn compute(graph: &Graph) -> Liveness {
        let order = TopoOrder::compute(graph);
        let mut intervals = vec![None; graph.value_count()];
        for &p in graph.params() {
            intervals[p.index()] = Some(Interval { start: 0, end: 0 });
        }
        for (k, &op) in order.order.iter().enumerate() {
            let step = k + 1;
            for &r in &graph.op(op).results {
                intervals[r.index()] = Some(Interval {
                    start: step,
                    end: step,
                });
            }
            for &v in &graph.op(op).operands {
                if let Some(iv) = intervals[v.index()].as_mut() {
                    iv.end = iv.end.max(step);
                }
            }
        }
        Liveness {
            intervals,
            steps: order.order.len() + 1,
        }
    }
}
