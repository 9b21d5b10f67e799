//! The ONNX backend node tests, as a conformance harness: every test of the
//! `onnx` wheel's `backend/test/data/node/` (one model of one op, its inputs
//! and expected outputs as serialized `TensorProto`s) is imported with
//! dcir-onnx, run on the interpreter and compared with the expected outputs;
//! each one that passes is fused for the CUDA target and lowered, and every
//! distinct kernel text compiles with NVRTC.
//!
//! Each test is one of: `pass`; `wrong` (it ran, but an output differs: a
//! bug); `crash` (a panic); `refused` (a clear error from the importer or
//! the interpreter); `emit-fail` (it passed, but planning, lowering or NVRTC
//! failed). The test fails on any `wrong`, `crash` or `emit-fail`, naming
//! them all, and keeps the generated part of `docs/onnx-node-tests.md` (the
//! totals and a table per ONNX op, between marker lines; the rest is
//! written by hand) up to date: stale is a failure, `DCIR_BLESS=1` (`cargo
//! xtask bless`) rewrites it.
//!
//! A model that needs an input known at import (the axes, sizes, scales or
//! bounds many node tests feed as graph inputs) is imported again with that
//! input, which the refusal names, as a known value
//! (`ImportOptions::known_inputs`, the library side of `dcir-import
//! --input-value`); the other inputs stay run-time parameters.
//!
//! The tests are found at `DCIR_ONNX_NODE_TESTS`, else in the installed
//! `onnx` package (`python3 -c "import onnx"`); without them the test prints
//! `SKIP: ...`, and fails under `CI=true` or `DCIR_REQUIRE_ONNX_TESTS=1`.
//! `DCIR_ONNX_NODE_ONLY=substring` runs only the tests whose name contains it
//! (a quicker look; the document is then not checked).
//!
//! `DCIR_ONNX_NODE_EXPORT=DIR` also writes each passing test's graph as
//! `DIR/NAME.dcir` and its parameters' values (the test's inputs and the
//! model's initializers) as `DIR/NAME.safetensors`, for the GPU machine's
//! `run.sh onnx-node` step (`dcir-run NAME.dcir --inputs NAME.safetensors
//! --backend cuda --check`); `cargo xtask gpu-bundle` sets it.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use dcir_fusion::{CostModel, DeviceSpec, apply_plan, plan_graph};
use dcir_interp::Tensor;
use dcir_interp::io::tensor_from_bytes;
use dcir_ir::Graph;
use dcir_onnx::{ImportOptions, TensorFile, decode_model, decode_tensor, import_model};

/// The `onnx` release whose node tests `docs/onnx-node-tests.md` describes
/// (`.ci/run` installs it).
const ONNX_VERSION: &str = "1.20.0";

/// Float outputs: `|actual - expected| <= ATOL + RTOL * |expected|`.
const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-4;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn env_is(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == value)
}

/// What became of one node test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Pass,
    Wrong,
    Crash,
    Refused,
    EmitFail,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Wrong => "wrong",
            Outcome::Crash => "crash",
            Outcome::Refused => "refused",
            Outcome::EmitFail => "emit-fail",
        }
    }
}

/// One node test's result.
struct Case {
    /// The test's folder name (`test_add_bcast`).
    name: String,
    /// The table row it counts in: its node's op type, or `Op, expanded`
    /// for a test whose model is an op's function body.
    op: String,
    outcome: Outcome,
    /// Why, for anything but a pass (one line for a refusal).
    detail: String,
    /// A refusal's reason with the test's own names left out (the table's key).
    reason: String,
}

/// Where the node tests are, and the `onnx` version when it is known.
fn locate() -> Result<(PathBuf, Option<String>), String> {
    if let Some(dir) = std::env::var_os("DCIR_ONNX_NODE_TESTS") {
        let dir = PathBuf::from(dir);
        // .../onnx/backend/test/data/node -> .../onnx/version.py
        let version = dir
            .ancestors()
            .nth(4)
            .and_then(|onnx| std::fs::read_to_string(onnx.join("version.py")).ok())
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("version = "))
                    .map(|v| v.trim().trim_matches('"').to_string())
            });
        return if dir.is_dir() {
            Ok((dir, version))
        } else {
            Err(format!(
                "DCIR_ONNX_NODE_TESTS={} is not a folder",
                dir.display()
            ))
        };
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import onnx, os; print(os.path.dirname(onnx.__file__)); print(onnx.__version__)",
        ])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the `onnx` Python package is missing (python3 -m pip install onnx=={ONNX_VERSION}, \
             or set DCIR_ONNX_NODE_TESTS): {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let root = PathBuf::from(lines.next().unwrap_or_default());
    let version = lines.next().map(str::to_string);
    let dir = root.join("backend/test/data/node");
    if dir.is_dir() {
        Ok((dir, version))
    } else {
        Err(format!(
            "the installed onnx package has no node tests at {}",
            dir.display()
        ))
    }
}

/// The test folders, sorted by name.
fn test_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// `prefix_0.pb`, `prefix_1.pb`, ... of `dir`, in index order.
fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    (0..)
        .map(|k| dir.join(format!("{prefix}_{k}.pb")))
        .take_while(|p| p.is_file())
        .collect()
}

/// The op type of each single-node test (to name the rows of the expanded ones).
fn op_label(node: &dcir_onnx::proto::NodeProto) -> String {
    let op = node.op_type.clone().unwrap_or_default();
    match node.domain.as_deref() {
        None | Some("") | Some("ai.onnx") => op,
        Some(d) => format!("{d}.{op}"),
    }
}

/// The first line of a message.
fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

/// A tensor of a `.pb` file for the interpreter.
fn to_tensor(t: &TensorFile) -> Result<Tensor, String> {
    tensor_from_bytes(t.ty.clone(), &t.bytes).map_err(|e| e.to_string())
}

/// Whether float `actual` matches `expected`: NaN matches NaN, an infinity
/// the same infinity, a finite value within `ATOL + RTOL * |expected|`.
fn close(expected: f64, actual: f64) -> bool {
    (expected.is_nan() && actual.is_nan())
        || expected == actual
        || (expected.is_finite() && (actual - expected).abs() <= ATOL + RTOL * expected.abs())
}

/// Compares `actual` with the expected tensor: dtype and shape equal;
/// floats [`close`], integers and bools exactly. `None` when they agree.
fn differs(expected: &Tensor, actual: &Tensor) -> Option<String> {
    if expected.ty() != actual.ty() {
        return Some(format!("expected {}, got {}", expected.ty(), actual.ty()));
    }
    // Integers compare exactly as i64 (every dcir integer fits), floats as f64.
    let bad: Vec<(usize, String, String)> = if expected.dtype().is_float() {
        let (e, a) = (expected.to_f64(), actual.to_f64());
        e.iter()
            .zip(&a)
            .enumerate()
            .filter(|&(_, (&x, &y))| !close(x, y))
            .map(|(i, (x, y))| (i, x.to_string(), y.to_string()))
            .collect()
    } else {
        let (e, a) = (expected.data().to_i64(), actual.data().to_i64());
        e.iter()
            .zip(a.iter())
            .enumerate()
            .filter(|(_, (x, y))| x != y)
            .map(|(i, (x, y))| (i, x.to_string(), y.to_string()))
            .collect()
    };
    let (i, x, y) = bad.first()?;
    Some(format!(
        "{} of {} elements differ; element {i}: expected {x}, got {y}",
        bad.len(),
        expected.len()
    ))
}

/// A kernel to compile, with its source.
struct Kernel {
    kernel: dcir_cuda::kir::Kernel,
    source: String,
}

/// What running one test gives: its outcome and detail, and for a pass the
/// kernels its fused graph lowers to.
type Ran = (Outcome, String, Vec<Kernel>);

/// Imports, runs and compares one test; for a pass, plans and lowers it too.
fn run_case(dir: &Path) -> Ran {
    let refused = |why: String| (Outcome::Refused, first_line(&why), Vec::new());
    let model_bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return refused(format!("cannot read model.onnx: {e}")),
    };
    let model = match decode_model(&model_bytes) {
        Ok(m) => m,
        Err(e) => return refused(e.to_string()),
    };
    let data = dir.join("test_data_set_0");
    let decode = |p: &PathBuf| -> Result<TensorFile, String> {
        let bytes = std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        decode_tensor(&bytes).map_err(|e| format!("{}: {e}", file_name(p)))
    };
    let inputs: Vec<Result<TensorFile, String>> =
        numbered(&data, "input").iter().map(decode).collect();
    let outputs: Vec<Result<TensorFile, String>> =
        numbered(&data, "output").iter().map(decode).collect();
    let Some(graph_proto) = model.graph.as_ref() else {
        return refused("the model has no graph".to_string());
    };
    // Input k's file holds graph input k; its dims fix the input's dynamic dims.
    let mut opts = ImportOptions::default();
    for (input, file) in graph_proto.input.iter().zip(&inputs) {
        if let Ok(file) = file {
            let name = input.name.clone().unwrap_or_default();
            for (i, &d) in file.ty.dims().iter().enumerate() {
                opts.dims.push((format!("{name}:{i}"), d));
            }
        }
    }
    // An input the importer needs known (it names it) is bound to its
    // file's value and the import retried, once per graph input at most.
    let paths = numbered(&data, "input");
    let imported = loop {
        let e = match import_model(&model, Some(dir), &opts) {
            Ok(m) => break m,
            Err(e) => e.to_string(),
        };
        let needed = e
            .split_once("(`")
            .and_then(|(_, rest)| rest.split_once("`) must be known at import time"))
            .map(|(name, _)| name.to_string());
        let bound = needed.and_then(|name| {
            let k = graph_proto
                .input
                .iter()
                .position(|i| i.name.as_deref() == Some(&name))?;
            let bytes = std::fs::read(paths.get(k)?).ok()?;
            let t = dcir_onnx::decode_tensor_proto(&bytes).ok()?;
            (!opts.known_inputs.iter().any(|(n, _)| *n == name)).then_some((name, t))
        });
        match bound {
            Some(known) => opts.known_inputs.push(known),
            None => return refused(e),
        }
    };
    let known: BTreeSet<String> = opts.known_inputs.iter().map(|(n, _)| n.clone()).collect();
    let graph = &imported.module.graphs[0];
    if let Some(Err(e)) = inputs.iter().chain(&outputs).find(|r| r.is_err()) {
        return refused(e.clone());
    }
    let inputs: Vec<&TensorFile> = inputs.iter().filter_map(|r| r.as_ref().ok()).collect();
    let outputs: Vec<&TensorFile> = outputs.iter().filter_map(|r| r.as_ref().ok()).collect();
    if inputs.len() != graph_proto.input.len() {
        return refused(format!(
            "{} input files for {} graph inputs",
            inputs.len(),
            graph_proto.input.len()
        ));
    }
    // The parameters: the graph inputs without an initializer, in order,
    // then the initializers that became weights (the importer's order).
    let initializers: BTreeSet<&str> = graph_proto
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    let mut args = Vec::new();
    for (input, file) in graph_proto.input.iter().zip(&inputs) {
        let name = input.name.as_deref().unwrap_or("");
        if initializers.contains(name) || known.contains(name) {
            continue;
        }
        match to_tensor(file) {
            Ok(t) => args.push(t),
            Err(e) => return refused(e),
        }
    }
    for w in &imported.weights {
        match tensor_from_bytes(w.ty.clone(), &w.bytes) {
            Ok(t) => args.push(t),
            Err(e) => return refused(e.to_string()),
        }
    }
    let results = match dcir_interp::run_graph(graph, &args) {
        Ok(r) => r,
        // The test's inputs do not fit the imported graph: an import bug.
        Err(
            e @ (dcir_interp::InterpError::InputCount { .. }
            | dcir_interp::InterpError::InputType { .. }),
        ) => return (Outcome::Wrong, format!("inputs: {e}"), Vec::new()),
        Err(e) => return refused(format!("interpreter: {e}")),
    };
    if results.len() != outputs.len() {
        return (
            Outcome::Wrong,
            format!("{} outputs, {} expected", results.len(), outputs.len()),
            Vec::new(),
        );
    }
    for (k, (actual, expected)) in results.iter().zip(&outputs).enumerate() {
        let expected = match to_tensor(expected) {
            Ok(t) => t,
            Err(e) => return refused(e),
        };
        if let Some(why) = differs(&expected, actual) {
            return (Outcome::Wrong, format!("output {k}: {why}"), Vec::new());
        }
    }
    match lower(graph) {
        Ok(kernels) => match export(dir, &imported.module, &args) {
            Ok(()) => (Outcome::Pass, String::new(), kernels),
            Err(e) => (Outcome::Crash, format!("export: {e}"), Vec::new()),
        },
        Err(e) => (Outcome::EmitFail, e, Vec::new()),
    }
}

/// Under `DCIR_ONNX_NODE_EXPORT=DIR`, writes the test's module to
/// `DIR/NAME.dcir` and the values of its graph's parameters (`args`, in
/// parameter order) to `DIR/NAME.safetensors`, under the parameters' names.
fn export(dir: &Path, module: &dcir_ir::Module, args: &[Tensor]) -> Result<(), String> {
    let Some(out) = std::env::var_os("DCIR_ONNX_NODE_EXPORT") else {
        return Ok(());
    };
    let out = PathBuf::from(out);
    let name = file_name(dir);
    let graph = &module.graphs[0];
    let named: Vec<(String, Tensor)> = graph
        .params()
        .iter()
        .map(|&p| graph.value(p).name.clone())
        .zip(args.iter().cloned())
        .collect();
    let values = dcir_interp::io::write_safetensors(&named).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let write = |file: PathBuf, bytes: &[u8]| {
        std::fs::write(&file, bytes).map_err(|e| format!("{}: {e}", file.display()))
    };
    write(
        out.join(format!("{name}.dcir")),
        dcir_ir::print_module(module).as_bytes(),
    )?;
    write(out.join(format!("{name}.safetensors")), &values)
}

/// Fuses `graph` for the CUDA target and lowers every group.
fn lower(graph: &Graph) -> Result<Vec<Kernel>, String> {
    let model = CostModel::new(DeviceSpec::h200());
    let plan =
        plan_graph(graph, &model, &dcir_cuda::CudaTarget).map_err(|e| format!("fuse: {e}"))?;
    let fused = apply_plan(graph, &plan).map_err(|e| format!("fuse: {e}"))?;
    let kernels = dcir_cuda::lower_graph(&fused).map_err(|e| format!("emit: {e}"))?;
    Ok(kernels
        .into_iter()
        .map(|kernel| Kernel {
            source: dcir_cuda::print_kernel(&kernel),
            kernel,
        })
        .collect())
}

/// `run_case` with a panic caught as a crash.
fn run_caught(dir: &Path) -> Ran {
    match catch_unwind(AssertUnwindSafe(|| run_case(dir))) {
        Ok(ran) => ran,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".to_string());
            (
                Outcome::Crash,
                format!("panic: {}", first_line(&msg)),
                Vec::new(),
            )
        }
    }
}

/// Runs `job(i)` for every `i < n` on two threads; results in index order.
fn on_two_threads<T: Send>(n: usize, job: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let result = job(i);
                    out.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
                }
            });
        }
    });
    out.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

/// Kernels NVRTC compiles as one program.
const BATCH: usize = 48;

/// Compiles each distinct kernel text once, in batches (each kernel alone
/// when its batch fails; a kernel that spills in its batch as the artifact
/// builder compiles it, `compile_kernel`): the failing sources with why
/// (NVRTC's first line, or the spill, stack frame or register excess
/// ptxas reports). `Err` when NVRTC is missing.
fn compile_all(kernels: &[&Kernel]) -> Result<BTreeMap<String, String>, String> {
    use dcir_cuda::nvrtc;
    if let Some(reason) = nvrtc::unavailable_reason() {
        return Err(reason);
    }
    let batches: Vec<&[&Kernel]> = kernels.chunks(BATCH).collect();
    let failures = on_two_threads(batches.len(), |i| {
        let batch = batches[i];
        let named: Vec<(&str, &str)> = batch
            .iter()
            .map(|k| (k.kernel.name.as_str(), k.source.as_str()))
            .collect();
        let reports = dcir_cuda::batch_arch(batch.iter().map(|k| &k.kernel), nvrtc::DEFAULT_ARCH)
            .and_then(|arch| nvrtc::compile_batch(&named, arch))
            .unwrap_or_default();
        let batch_failed = reports.len() != batch.len();
        batch
            .iter()
            .enumerate()
            .filter_map(|(j, k)| {
                if !batch_failed && reports[j].violation(k.kernel.block).is_none() {
                    return None;
                }
                let why = match dcir_cuda::compile_kernel(&k.kernel, nvrtc::DEFAULT_ARCH) {
                    Err(e) => first_line(&e),
                    Ok((_, compiled)) => match compiled.resources {
                        None => "no ptxas report".to_string(),
                        Some(r) => r.violation(k.kernel.block)?,
                    },
                };
                Some((k.source.clone(), why))
            })
            .collect::<Vec<_>>()
    });
    Ok(failures.into_iter().flatten().collect())
}

/// A row of the per-op table.
#[derive(Default)]
struct Row {
    tests: usize,
    counts: BTreeMap<Outcome, usize>,
    reasons: BTreeMap<String, usize>,
}

/// A refusal's reason without the parts that name one test's nodes and
/// values (`names`), shortened to 120 characters.
fn reason_key(detail: &str, names: &BTreeSet<String>) -> String {
    // `cannot import `Op` (node `n`, #0 of 1): why` -> `why`.
    let mut s = detail.to_string();
    if let Some(rest) = s.strip_prefix("cannot import ")
        && let Some(at) = rest.find("): ")
    {
        s = rest[at + 3..].to_string();
    }
    // The unsupported op types, without node names.
    if let Some(rest) = s.strip_prefix("unsupported ONNX op `") {
        return format!("unsupported op {}", rest.split('`').next().unwrap_or(""));
    }
    if let Some(rest) = s.strip_prefix("unsupported ONNX ops: ") {
        let types: Vec<&str> = rest
            .split("), ")
            .filter_map(|part| part.split(" (").next())
            .collect();
        return format!("unsupported op {}", types.join(", "));
    }
    let s = strip_quoted_names(&s, names);
    if s.chars().count() > 120 {
        let cut: String = s.chars().take(117).collect();
        return format!("{cut}...");
    }
    s
}

/// Replaces the backticked names of `names` (one test's values and nodes) by `…`.
fn strip_quoted_names(s: &str, names: &BTreeSet<String>) -> String {
    let mut out = String::new();
    for (i, part) in s.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        let inside = i % 2 == 1;
        out.push_str(if inside && names.contains(part) {
            "…"
        } else {
            part
        });
    }
    out
}

/// The names of a model's values and nodes, as the importer's messages
/// quote them.
fn model_names(dir: &Path) -> BTreeSet<String> {
    let Some(graph) = std::fs::read(dir.join("model.onnx"))
        .ok()
        .and_then(|b| decode_model(&b).ok())
        .and_then(|m| m.graph)
    else {
        return BTreeSet::new();
    };
    let mut names = BTreeSet::new();
    for v in graph.input.iter().chain(&graph.output) {
        names.extend(v.name.clone());
    }
    for n in &graph.node {
        names.extend(n.name.clone());
        names.extend(n.input.iter().chain(&n.output).cloned());
    }
    for t in &graph.initializer {
        names.extend(t.name.clone());
    }
    names.remove("");
    names
}

fn markdown_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The generated part of `docs/onnx-node-tests.md`: the totals and the per-op table.
fn render(cases: &[Case], version: &str) -> String {
    let total = cases.len();
    let count = |o: Outcome| cases.iter().filter(|c| c.outcome == o).count();
    let mut out = format!(
        "## Totals\n\n\
         The node tests of onnx {version}.\n\n\
         | tests | pass | wrong | crash | refused | emit-fail |\n\
         |---:|---:|---:|---:|---:|---:|\n\
         | {total} | {} | {} | {} | {} | {} |\n\n\
         ## Per op\n\n\
         One row per ONNX op type of the tests' nodes; `Op, expanded` counts the `_expanded` \
         tests, whose model is that op's function body. The last column is the most frequent \
         reason among the op's refused tests (node and value names left out) and how many \
         tests give it.\n\n\
         | op | tests | pass | refused | most common refusal |\n\
         |---|---:|---:|---:|---|\n",
        count(Outcome::Pass),
        count(Outcome::Wrong),
        count(Outcome::Crash),
        count(Outcome::Refused),
        count(Outcome::EmitFail),
    );
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    for c in cases {
        let row = rows.entry(&c.op).or_default();
        row.tests += 1;
        *row.counts.entry(c.outcome).or_default() += 1;
        if c.outcome == Outcome::Refused {
            *row.reasons.entry(c.reason.clone()).or_default() += 1;
        }
    }
    for (op, row) in &rows {
        let n = |o: Outcome| row.counts.get(&o).copied().unwrap_or(0);
        // The most frequent reason; the first in sorted order among equals.
        let reason = row
            .reasons
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(r, k)| format!("{} ({k})", markdown_cell(r)))
            .unwrap_or_default();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            markdown_cell(op),
            row.tests,
            n(Outcome::Pass),
            n(Outcome::Refused),
            reason
        ));
    }
    out
}

/// The markers around the generated part of `docs/onnx-node-tests.md`; the
/// rest of the document is written by hand.
const BEGIN: &str = "<!-- BEGIN GENERATED by crates/dcir-cli/tests/onnx_node.rs: \
                     run `cargo xtask bless` (DCIR_BLESS=1) after a change -->\n";
const END: &str = "<!-- END GENERATED -->\n";

/// `doc` with its generated part replaced by `generated`; an error when the
/// markers are missing.
fn splice(doc: &str, generated: &str) -> Result<String, String> {
    let start = doc
        .find(BEGIN)
        .ok_or("docs/onnx-node-tests.md lacks its BEGIN GENERATED marker line")?;
    let end = doc[start..]
        .find(END)
        .map(|i| start + i)
        .ok_or("docs/onnx-node-tests.md lacks its END GENERATED marker line")?;
    Ok(format!(
        "{}{BEGIN}\n{generated}\n{}",
        &doc[..start],
        &doc[end..]
    ))
}

#[test]
fn onnx_node_tests() {
    let required = env_is("CI", "true") || env_is("DCIR_REQUIRE_ONNX_TESTS", "1");
    let (root, version) = match locate() {
        Ok(found) => found,
        Err(why) if required => panic!("the ONNX node tests are required here, but {why}"),
        Err(why) => {
            println!("SKIP: ONNX node tests: {why}");
            return;
        }
    };
    let only = std::env::var("DCIR_ONNX_NODE_ONLY").ok();
    let dirs: Vec<PathBuf> = test_dirs(&root)
        .into_iter()
        .filter(|d| {
            only.as_ref()
                .is_none_or(|o| file_name(d).contains(o.as_str()))
        })
        .collect();
    assert!(
        only.is_some() || dirs.len() > 1000,
        "only {} node tests in {}",
        dirs.len(),
        root.display()
    );

    // Row names: a single-node test's op type; an `_expanded` test (an op's
    // function body) counts under its base test's op.
    let labels: Vec<Option<(usize, String)>> = dirs
        .iter()
        .map(|d| {
            let model = decode_model(&std::fs::read(d.join("model.onnx")).ok()?).ok()?;
            let g = model.graph?;
            Some((
                g.node.len(),
                g.node.first().map(op_label).unwrap_or_default(),
            ))
        })
        .collect();
    let single: BTreeMap<String, String> = dirs
        .iter()
        .zip(&labels)
        .filter_map(|(d, l)| match l {
            Some((1, op)) => Some((file_name(d), op.clone())),
            _ => None,
        })
        .collect();
    let row_of = |d: &Path, label: &Option<(usize, String)>| -> String {
        let name = file_name(d);
        let base = name.split("_expanded").next().unwrap_or(&name);
        match (single.get(base), label) {
            (Some(op), _) if base != name => format!("{op}, expanded"),
            (_, Some((1, op))) => op.clone(),
            _ => "(several ops)".to_string(),
        }
    };

    let started = Instant::now();
    let ran = on_two_threads(dirs.len(), |i| run_caught(&dirs[i]));
    println!(
        "onnx node tests: {} imported, run and lowered in {:.1?}",
        dirs.len(),
        started.elapsed()
    );

    // Each distinct kernel text once (the entry point's name left out).
    let mut texts: BTreeMap<String, &Kernel> = BTreeMap::new();
    let mut uses: Vec<Vec<String>> = Vec::new();
    for (_, _, kernels) in &ran {
        let mut keys = Vec::new();
        for k in kernels {
            let key = k.source.replace(&k.kernel.name, "KERNEL");
            texts.entry(key.clone()).or_insert(k);
            keys.push(key);
        }
        uses.push(keys);
    }
    let started = Instant::now();
    let list: Vec<&Kernel> = texts.values().copied().collect();
    let failed: BTreeMap<String, String> = match compile_all(&list) {
        Ok(failed_sources) => {
            println!(
                "onnx node tests: {} distinct kernels compiled in {:.1?}",
                list.len(),
                started.elapsed()
            );
            texts
                .iter()
                .filter_map(|(key, k)| {
                    failed_sources
                        .get(&k.source)
                        .map(|e| (key.clone(), e.clone()))
                })
                .collect()
        }
        Err(reason) => {
            if env_is("DCIR_REQUIRE_NVRTC", "1") {
                panic!("DCIR_REQUIRE_NVRTC=1 but {reason}");
            }
            println!("SKIP: NVRTC compile of the node tests' kernels: {reason}");
            BTreeMap::new()
        }
    };

    let cases: Vec<Case> = dirs
        .iter()
        .zip(&labels)
        .zip(ran.into_iter().zip(&uses))
        .map(|((d, label), ((outcome, detail, _), keys))| {
            let compile_error = keys.iter().find_map(|k| failed.get(k));
            let (outcome, detail) = match compile_error {
                Some(e) if outcome == Outcome::Pass => (Outcome::EmitFail, format!("nvrtc: {e}")),
                _ => (outcome, detail),
            };
            let reason = if outcome == Outcome::Refused {
                reason_key(&detail, &model_names(d))
            } else {
                String::new()
            };
            Case {
                name: file_name(d),
                op: row_of(d, label),
                outcome,
                detail,
                reason,
            }
        })
        .collect();

    let mut totals: BTreeMap<Outcome, usize> = BTreeMap::new();
    for c in &cases {
        *totals.entry(c.outcome).or_default() += 1;
    }
    let summary: Vec<String> = totals
        .iter()
        .map(|(o, n)| format!("{n} {}", o.name()))
        .collect();
    println!(
        "onnx node tests: {} tests: {}",
        cases.len(),
        summary.join(", ")
    );
    if env_is("DCIR_ONNX_NODE_VERBOSE", "1") {
        for c in &cases {
            println!("{} [{}] {}: {}", c.name, c.op, c.outcome.name(), c.detail);
        }
    }

    let failures: Vec<String> = cases
        .iter()
        .filter(|c| {
            matches!(
                c.outcome,
                Outcome::Wrong | Outcome::Crash | Outcome::EmitFail
            )
        })
        .map(|c| format!("{} ({}): {}: {}", c.name, c.op, c.outcome.name(), c.detail))
        .collect();

    let doc_check = if only.is_some() {
        Some("DCIR_ONNX_NODE_ONLY is set".to_string())
    } else {
        match &version {
            Some(v) if v != ONNX_VERSION => Some(format!(
                "onnx {v} is installed, the document describes {ONNX_VERSION}"
            )),
            _ => None,
        }
    };
    let mut stale = None;
    match doc_check {
        Some(why) => println!("onnx node tests: docs/onnx-node-tests.md not checked: {why}"),
        None => {
            let path = repo_root().join("docs/onnx-node-tests.md");
            let current = std::fs::read_to_string(&path).unwrap_or_default();
            let text = splice(&current, &render(&cases, ONNX_VERSION));
            match text {
                Err(e) => stale = Some(e),
                Ok(text) if env_is("DCIR_BLESS", "1") => {
                    std::fs::write(&path, &text).expect("docs/onnx-node-tests.md is writable");
                }
                Ok(text) if text != current => {
                    stale = Some(
                        "docs/onnx-node-tests.md is stale: run `cargo xtask bless` (DCIR_BLESS=1)"
                            .to_string(),
                    );
                }
                Ok(_) => {}
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} ONNX node test(s) are wrong, crash or fail to emit:\n{}",
        failures.len(),
        failures.join("\n")
    );
    if let Some(stale) = stale {
        panic!("{stale}");
    }
}
