//! A pass written outside dcir: `pow-to-mul` rewrites `pow(x, n)` with a
//! small whole exponent `n` into multiplications, which are cheaper than the
//! `pow` a GPU library call would do.
//!
//! This crate is the worked example of `docs/writing-a-pass.md`.

use dcir_ir::{Attr, Attrs, Graph, Module, OpId, OpKind, Rewriter, ValueDef, ValueId};
use dcir_passes::analysis::AnalysisManager;
use dcir_passes::{OptionKind, Pass, PassDef, PassError, PassOptionDef, PassOptions, PassResult};

/// The registry entry of `pow-to-mul`.
pub const POW_TO_MUL: PassDef = PassDef {
    name: "pow-to-mul",
    summary: "rewrite pow(x, n) with a constant whole n in 1..=max-exponent as multiplications",
    options: &[PassOptionDef {
        name: "max-exponent",
        kind: OptionKind::Int,
        default: "4",
        help: "largest exponent rewritten",
    }],
    create: |options: &PassOptions| {
        let max_exponent = options.int("max-exponent");
        if max_exponent < 1 {
            return Err(format!(
                "max-exponent must be at least 1, found {max_exponent}"
            ));
        }
        Ok(Box::new(PowToMul { max_exponent }))
    },
};

struct PowToMul {
    max_exponent: i64,
}

impl Pass for PowToMul {
    fn name(&self) -> &'static str {
        POW_TO_MUL.name
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        let mut changed = false;
        for graph in &mut module.graphs {
            for op in graph.all_ops() {
                if let Some(n) = self.whole_exponent(graph, op) {
                    rewrite(graph, op, n)?;
                    changed = true;
                }
            }
        }
        // The old `pow` ops are now unused: `dce` removes them.
        Ok(PassResult::from_changed(changed))
    }
}

impl PowToMul {
    /// `n` when `op` is `pow(x, c)` with `c` a splat constant (or a broadcast
    /// of one) holding a whole number in `1..=max_exponent`.
    fn whole_exponent(&self, graph: &Graph, op: OpId) -> Option<i64> {
        let d = graph.op(op);
        if d.kind != OpKind::Pow {
            return None;
        }
        let value = splat_value(graph, d.operands[1])?;
        let n = value as i64;
        (n as f64 == value && (1..=self.max_exponent).contains(&n)).then_some(n)
    }
}

/// The value of a splat constant, looking through a broadcast.
fn splat_value(graph: &Graph, v: ValueId) -> Option<f64> {
    let ValueDef::OpResult { op, .. } = graph.value(v).def else {
        return None;
    };
    let d = graph.op(op);
    match d.kind {
        OpKind::Broadcast => splat_value(graph, d.operands[0]),
        OpKind::Constant => match d.attrs.get("value")? {
            Attr::Float(x) => Some(*x),
            Attr::Floats(xs) if xs.windows(2).all(|w| w[0] == w[1]) => xs.first().copied(),
            _ => None,
        },
        _ => None,
    }
}

/// Replaces the uses of `pow(x, n)` by `x * x * ... * x` built before it.
fn rewrite(graph: &mut Graph, op: OpId, n: i64) -> Result<(), PassError> {
    let x = graph.op(op).operands[0];
    let old = graph.op(op).results[0];
    let mut rw = Rewriter::before(graph, op);
    let mut acc = x;
    for _ in 1..n {
        acc = rw.op(OpKind::Mul, &[acc, x], Attrs::new(), "pow")?;
    }
    graph.replace_all_uses(old, acc);
    Ok(())
}
