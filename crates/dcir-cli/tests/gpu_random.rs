//! Differential testing on the GPU: random well-typed graphs (dcir-testgen,
//! every dtype; half of them workload-shaped: attention, GEMM epilogues,
//! conv blocks, layernorm + residual at odd sizes) through `dcir-run --backend cuda --check` (fuse, compile with
//! NVRTC, run on NaN-poisoned outputs, compare with the interpreter), in this
//! process on worker threads (one CUDA context: a process per graph spends
//! most of its time starting the driver). A failure is confirmed in a
//! `dcir-run` process of its own (a kernel fault leaves a context unusable)
//! and shrunk there (proptest's value tree) to a small graph, written to
//! `$DCIR_RANDOM_OUT/fail_<case>.dcir` with the run's output beside it, to be
//! committed as a filetest once fixed. Graphs the generator made with
//! `fused` ops (hand-fused input, which dcir compiles as written and does not
//! plan) are counted and skipped. Without a GPU or NVRTC it prints
//! `SKIP: no GPU: ...` and passes.
//!
//! Environment: `DCIR_PROPTEST_CASES` graphs (default 64), `DCIR_PROPTEST_SEED`
//! (default [`dcir_testgen::CI_SEED`]; case `i` draws from seed and `i`, so a
//! case is reproducible alone), `DCIR_RANDOM_JOBS` runs at once (default: the
//! CPUs), `DCIR_RUN` the `dcir-run` binary (default: the one cargo built),
//! `DCIR_RANDOM_OUT` where failures go (default: a temporary folder),
//! `DCIR_RANDOM_DEADLINE_S` seconds after which no new case starts and
//! shrinking stops (the summary counts the cases that ran),
//! `DCIR_RANDOM_MAX_DIM` the largest drawn extent (default 160: odd sizes
//! past the kernels' tiles; at most 65,536 elements per drawn type).
//! `run.sh random` runs it on the GPU machine (docs/testing.md).

mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use dcir_ir::OpKind;
use dcir_testgen::{
    CI_SEED, GraphSpec, Sizes, Workload, arb_graph_spec, arb_workload, build_graph_sized,
    build_workload,
};

/// One case: a random graph of dcir-testgen's ops, or a workload-shaped one
/// (attention, GEMM epilogue, conv block, layernorm + residual), half each.
#[derive(Clone, Debug)]
enum Case {
    Random(GraphSpec),
    Workload(Workload),
}

fn arb_case() -> impl Strategy<Value = Case> {
    prop_oneof![
        arb_graph_spec().prop_map(Case::Random),
        arb_workload().prop_map(Case::Workload),
    ]
}
use proptest::prelude::prop_oneof;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Shrinking steps tried per failing graph (each one a `dcir-run`).
const MAX_SHRINK_STEPS: usize = 300;
/// Seconds one `dcir-run` may take before it counts as a failure (a hang).
const RUN_TIMEOUT_S: &str = "120";

/// What one graph did.
enum Outcome {
    /// The GPU's outputs match the interpreter's.
    Pass,
    /// The interpreter itself refuses the graph on these inputs (nothing to compare).
    NoReference,
    /// The generator made `fused` ops (hand-fused input, which dcir compiles
    /// as it is and does not plan): not what this test checks.
    PreFused,
    /// `dcir-run` failed: its exit code and output.
    Fail(String),
}

/// The harness's fixed settings, shared by the workers.
struct Harness {
    dcir_run: PathBuf,
    scratch: PathBuf,
    /// No new case starts, and shrinking stops, past it.
    deadline: Option<std::time::Instant>,
    /// How large the graphs' tensors get.
    sizes: Sizes,
}

impl Harness {
    /// Runs the graph `spec` describes through `dcir-run --check`, in this
    /// process or in a process of its own.
    /// The graph of `case`.
    fn build(&self, case: &Case) -> Result<dcir_ir::Graph, dcir_ir::BuildError> {
        match case {
            Case::Random(spec) => build_graph_sized("g", spec, self.sizes),
            Case::Workload(w) => build_workload("g", w),
        }
    }

    fn run(&self, spec: &Case, tag: &str, in_process: bool) -> Outcome {
        let Ok(graph) = self.build(spec) else {
            return Outcome::NoReference;
        };
        if graph
            .all_ops()
            .iter()
            .any(|&o| graph.op(o).kind == OpKind::Fused)
        {
            return Outcome::PreFused;
        }
        // `dcir-run` draws the same inputs (seed 0) for its reference.
        let inputs = dcir_interp::random_inputs(&graph, 0);
        if dcir_interp::run_graph(&graph, &inputs).is_err() {
            return Outcome::NoReference;
        }
        let file = self.scratch.join(format!("{tag}.dcir"));
        std::fs::write(&file, dcir_ir::print_graph(&graph)).expect("scratch file");
        let args = ["--backend", "cuda", "--check", "--seed", "0"];
        if in_process {
            let mut argv = vec![OsString::from("dcir-run"), file.clone().into_os_string()];
            argv.extend(args.iter().map(OsString::from));
            let code = dcir_cli::run::main_with("dcir-run", argv);
            let _ = std::fs::remove_file(&file);
            return match code == ExitCode::SUCCESS {
                true => Outcome::Pass,
                false => Outcome::Fail("failed in process".into()),
            };
        }
        let out = Command::new("timeout")
            .arg(RUN_TIMEOUT_S)
            .arg(&self.dcir_run)
            .arg(&file)
            .args(args)
            .output()
            .expect("dcir-run starts");
        let _ = std::fs::remove_file(&file);
        if out.status.success() {
            return Outcome::Pass;
        }
        Outcome::Fail(format!(
            "exit {:?}\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// Case `case`: draws its graph, runs it, and confirms and shrinks a
    /// failure in processes of their own. Returns the outcome and, for a
    /// failure, the smallest failing graph's text.
    fn case(&self, seed: u64, case: usize) -> (Outcome, Option<String>) {
        let past_deadline = || self.deadline.is_some_and(|d| std::time::Instant::now() > d);
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&(case as u64).to_le_bytes());
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &key);
        let mut runner = TestRunner::new_with_rng(Config::default(), rng);
        let mut tree = arb_case()
            .new_tree(&mut runner)
            .expect("the strategy draws");
        let tag = format!("case_{case}");
        let outcome = self.run(&tree.current(), &tag, true);
        let Outcome::Fail(_) = outcome else {
            return (outcome, None);
        };
        let Outcome::Fail(first) = self.run(&tree.current(), &tag, false) else {
            let graph = self.build(&tree.current()).expect("a failing spec builds");
            return (
                Outcome::Fail("fails in this process only (a context left unusable?)".into()),
                Some(dcir_ir::print_graph(&graph)),
            );
        };
        // proptest's shrinking loop: simplify while it still fails,
        // complicate back when a simplification passes.
        let mut smallest = (tree.current(), first);
        let mut steps = 0;
        if tree.simplify() {
            while steps < MAX_SHRINK_STEPS && !past_deadline() {
                steps += 1;
                match self.run(&tree.current(), &tag, false) {
                    Outcome::Fail(why) => {
                        smallest = (tree.current(), why);
                        if !tree.simplify() {
                            break;
                        }
                    }
                    _ => {
                        if !tree.complicate() {
                            break;
                        }
                    }
                }
            }
        }
        let graph = self.build(&smallest.0).expect("a failing spec builds");
        (
            Outcome::Fail(smallest.1),
            Some(dcir_ir::print_graph(&graph)),
        )
    }
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

#[test]
fn random_graphs_match_the_interpreter_on_the_gpu() {
    // One context for the whole run (each run retains it; none tears it down).
    let Some(_context) = common::gpu_or_skip() else {
        return;
    };
    let cases = env_number("DCIR_PROPTEST_CASES").unwrap_or(64) as usize;
    let seed = env_number("DCIR_PROPTEST_SEED").unwrap_or(CI_SEED);
    let jobs = env_number("DCIR_RANDOM_JOBS").map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |n| n.max(1) as usize,
    );
    let scratch = std::env::temp_dir().join(format!("dcir-gpu-random-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let out_dir = std::env::var_os("DCIR_RANDOM_OUT").map_or_else(
        || std::env::temp_dir().join(format!("dcir-gpu-random-failures-{}", std::process::id())),
        PathBuf::from,
    );
    std::fs::create_dir_all(&out_dir).expect("failure dir");
    let harness = Harness {
        dcir_run: std::env::var_os("DCIR_RUN").map_or_else(
            || PathBuf::from(env!("CARGO_BIN_EXE_dcir-run")),
            PathBuf::from,
        ),
        scratch: scratch.clone(),
        deadline: env_number("DCIR_RANDOM_DEADLINE_S")
            .filter(|&s| s > 0)
            .map(|s| std::time::Instant::now() + std::time::Duration::from_secs(s)),
        sizes: Sizes {
            max_dim: env_number("DCIR_RANDOM_MAX_DIM").map_or(160, |d| d.max(1) as usize),
            max_elements: 1 << 16,
        },
    };
    let next = AtomicUsize::new(0);
    let counts = Mutex::new([0usize; 4]);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let case = next.fetch_add(1, Ordering::Relaxed);
                    if case >= cases
                        || harness
                            .deadline
                            .is_some_and(|d| std::time::Instant::now() > d)
                    {
                        break;
                    }
                    let (outcome, smallest) = harness.case(seed, case);
                    let slot = match &outcome {
                        Outcome::Pass => 0,
                        Outcome::NoReference => 1,
                        Outcome::Fail(why) => {
                            record(&out_dir, case, smallest.as_deref(), why);
                            failures.lock().expect("no worker panics").push(case);
                            2
                        }
                        Outcome::PreFused => 3,
                    };
                    counts.lock().expect("no worker panics")[slot] += 1;
                }
            });
        }
    });
    let [pass, no_reference, fail, pre_fused] = *counts.lock().expect("no worker panics");
    let ran = pass + no_reference + fail + pre_fused;
    let mut failures = failures.into_inner().expect("no worker panics");
    failures.sort_unstable();
    println!(
        "random graphs (seed {seed}, dims up to {}, {ran} of {cases} cases): {pass} pass, {fail} fail, \
         {no_reference} without a reference (the interpreter refuses their inputs), \
         {pre_fused} pre-fused (skipped); failures in {}",
        harness.sizes.max_dim,
        out_dir.display()
    );
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(
        failures.is_empty(),
        "cases {failures:?} differ from the interpreter or fail (seed {seed})"
    );
}

/// Writes a failing case's smallest graph and what `dcir-run` said.
fn record(dir: &Path, case: usize, graph: Option<&str>, why: &str) {
    if let Some(text) = graph {
        let _ = std::fs::write(dir.join(format!("fail_{case}.dcir")), text);
    }
    let _ = std::fs::write(dir.join(format!("fail_{case}.log")), why);
    println!(
        "case {case}: FAIL\n{}",
        why.lines().take(12).collect::<Vec<_>>().join("\n")
    );
}
