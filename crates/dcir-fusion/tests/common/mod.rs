//! Shared by the fusion tests: a stand-in estimator, so planner tests check
//! the search and the rewrite rather than the cost model, and the
//! fuse-verify-compare check.

#![allow(dead_code)]

use dcir_fusion::{Bound, Estimate, Estimator, Group, KernelParams, apply_plan, plan_graph};
use dcir_interp::{Tolerance, compare, random_inputs, run_graph};
use dcir_ir::{Graph, Module, OpKind, verify_module};
use dcir_passes::analysis::{Analysis, UseDef, op_cost};

/// Launch overhead plus bytes in and out at 4 TB/s plus flops at 50 TFLOP/s,
/// where an op feeding a contraction in the same group (a prologue) is
/// recomputed for every reuse of its output (charged 64 times).
pub struct Roofline;

impl Estimator for Roofline {
    fn estimate(&self, graph: &Graph, group: &Group) -> Result<Estimate, String> {
        let users = UseDef::compute(graph);
        let outputs = group.outputs(graph, |v| users.users(v).iter().map(|u| u.0).collect());
        let bytes: u64 = group
            .inputs(graph)
            .iter()
            .chain(&outputs)
            .map(|&v| graph.ty(v).size_bytes().unwrap_or(0) as u64)
            .sum();
        let in_group = |o| group.ops.contains(&o);
        let feeds_contraction = |o: dcir_ir::OpId| {
            graph.op(o).results.iter().any(|&r| {
                users.users(r).iter().any(|&(u, _)| {
                    in_group(u) && matches!(graph.op(u).kind, OpKind::Matmul | OpKind::Conv2d)
                })
            })
        };
        let flops: u64 = group
            .ops
            .iter()
            .map(|&o| {
                let f = op_cost(graph, o, None).flops;
                if feeds_contraction(o)
                    && !matches!(graph.op(o).kind, OpKind::Matmul | OpKind::Conv2d)
                {
                    64 * f
                } else {
                    f
                }
            })
            .sum();
        let time = 2e-6 + bytes as f64 / 4e12 + flops as f64 / 50e12;
        Ok(Estimate {
            params: KernelParams(Vec::new()),
            time,
            pul: 1.0,
            flops,
            bytes,
            bound: Bound::Memory,
            candidates: Vec::new(),
            library: None,
        })
    }
}

pub fn read(path: &str) -> Module {
    let text = std::fs::read_to_string(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR")))
        .expect("example exists");
    dcir_reader::parse_module(&text).expect("example reads")
}

/// Plans and rewrites every graph; checks the result verifies and computes
/// the same outputs on the interpreter.
pub fn fuse_and_check(module: &Module) -> Module {
    fuse_and_check_with(module, &Roofline)
}

/// [`fuse_and_check`] with another estimator.
pub fn fuse_and_check_with(module: &Module, model: &dyn Estimator) -> Module {
    let mut fused = module.clone();
    for graph in &mut fused.graphs {
        let plan = plan_graph(graph, model, &dcir_fusion::AnyGroup).expect("plans");
        *graph = apply_plan(graph, &plan).expect("rewrites");
    }
    verify_module(&fused).unwrap_or_else(|e| panic!("{e:?}\n{}", dcir_ir::print_module(&fused)));
    for (before, after) in module.graphs.iter().zip(&fused.graphs) {
        let inputs = random_inputs(before, 1);
        let want = run_graph(before, &inputs).expect("runs before");
        let got = run_graph(after, &inputs).expect("runs after");
        for (w, g) in want.iter().zip(&got) {
            compare(w, g, &Tolerance::for_dtype(w.dtype())).expect("same outputs");
        }
    }
    fused
}
