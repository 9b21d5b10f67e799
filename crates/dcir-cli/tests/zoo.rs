//! The model zoo (`crates/dcir-onnx/zoo/`: every torchvision classification
//! model and BERT-base at batch 1, weights stripped; `cargo xtask
//! export-zoo`) compiles: each model imports, is planned for the CUDA
//! target, and lowers (`docs/zoo.md` is generated from that run: the test
//! fails when it is stale and rewrites it under `DCIR_BLESS=1`, `cargo
//! xtask bless`), and each distinct kernel of all of them compiles with
//! NVRTC with no spill or stack frame. The zoo is imported, planned and
//! lowered once for both tests; the NVRTC half (about ten thousand kernels)
//! is most of CI's time.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use dcir_fusion::{CostModel, DeviceSpec, LayoutMode, apply_plan, plan_graph, plan_layout};
use dcir_ir::OpKind;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One model's line of `docs/zoo.md`, or why it does not compile.
struct Row {
    name: String,
    ops: usize,
    kernels: usize,
    planned_us: f64,
    unfused_us: f64,
    /// The layout the plan runs in (`--layout auto`'s choice).
    layout: &'static str,
    /// Kernels that do not run the parameters their estimate priced
    /// (`PlannedGroup::adapted`).
    adapted: usize,
}

/// A kernel to compile: the kernel, its source, the model's name and its summary.
type Pending = (dcir_cuda::kir::Kernel, String, String);

/// Imports, plans and lowers one model; its row and kernels.
fn compile_model(path: &Path) -> Result<(Row, Vec<Pending>), String> {
    let name = path
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let imported = dcir_onnx::import_file(path, &dcir_onnx::ImportOptions::default())
        .map_err(|e| format!("import: {e}"))?;
    let model = CostModel::new(DeviceSpec::h200());
    let mut row = Row {
        name,
        ops: 0,
        kernels: 0,
        planned_us: 0.0,
        unfused_us: 0.0,
        layout: "as written",
        adapted: 0,
    };
    let mut kernels = Vec::new();
    for graph in &imported.module.graphs {
        row.ops += graph
            .block(graph.body())
            .ops
            .iter()
            .filter(|&&o| !matches!(graph.op(o).kind, OpKind::Constant | OpKind::Return))
            .count();
        let (laid_out, plan, layout) = plan_layout(graph, LayoutMode::Auto, |g| {
            plan_graph(g, &model, &dcir_cuda::CudaTarget)
        })
        .map_err(|e| format!("fuse: {e}"))?;
        if layout.channels_last {
            row.layout = "channels-last";
        }
        row.planned_us += plan.total_time() * 1e6;
        row.unfused_us += plan.unfused_time() * 1e6;
        row.adapted += plan.groups.iter().filter(|g| !g.adapted.is_empty()).count();
        let fused = apply_plan(&laid_out, &plan).map_err(|e| format!("fuse: {e}"))?;
        // The artifact (launches, buffers, views, constants) builds and validates.
        let source_only = dcir_cuda::BuildOptions {
            compile: false,
            ..dcir_cuda::BuildOptions::default()
        };
        dcir_cuda::build_artifact(&fused, &source_only).map_err(|e| format!("artifact: {e}"))?;
        for k in dcir_cuda::lower_graph(&fused).map_err(|e| format!("emit: {e}"))? {
            let source = dcir_cuda::print_kernel(&k);
            let summary = k.summary.clone();
            kernels.push((k, source, summary));
        }
    }
    row.kernels = kernels.len();
    Ok((row, kernels))
}

/// Kernels NVRTC compiles as one program.
const BATCH: usize = 48;

/// Compiles `kernels` with NVRTC in one program; the failures: a spill, a
/// stack frame or too many registers for a kernel's block, or, when the
/// batch does not compile, each kernel compiled alone that does not. A
/// missing NVRTC is a failure under `DCIR_REQUIRE_NVRTC=1`, a `SKIP` otherwise.
fn compile_with_nvrtc(kernels: &[&Pending]) -> Vec<String> {
    use dcir_cuda::nvrtc;
    if let Some(reason) = nvrtc::unavailable_reason() {
        if std::env::var("DCIR_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            return vec![format!("DCIR_REQUIRE_NVRTC=1 but {reason}")];
        }
        println!("SKIP: NVRTC compile of the zoo's kernels: {reason}");
        return Vec::new();
    }
    let named: Vec<(&str, &str)> = kernels
        .iter()
        .map(|(kernel, source, _)| (kernel.name.as_str(), source.as_str()))
        .collect();
    let arch = match dcir_cuda::batch_arch(kernels.iter().map(|(k, ..)| k), nvrtc::DEFAULT_ARCH) {
        Ok(arch) => arch,
        Err(e) => return vec![e],
    };
    let reports = match nvrtc::compile_batch(&named, arch) {
        Ok(reports) => reports,
        Err(_) => {
            return kernels
                .iter()
                .filter_map(|(kernel, source, summary)| {
                    nvrtc::compile(source, &kernel.name, arch)
                        .err()
                        .map(|e| format!("{e}\n  {summary}"))
                })
                .collect();
        }
    };
    // A kernel that spills in the batch is compiled as the artifact builder
    // compiles it (the occupancy promise relaxed while ptxas spills).
    kernels
        .iter()
        .zip(reports)
        .filter_map(|((kernel, _, summary), batch)| {
            batch.violation(kernel.block)?;
            let resources = match dcir_cuda::compile_kernel(kernel, nvrtc::DEFAULT_ARCH) {
                Ok((_, compiled)) => compiled.resources,
                Err(e) => return Some(format!("{e}\n  {summary}")),
            };
            let name = &kernel.name;
            match resources {
                None => Some(format!("kernel {name}: no ptxas report\n  {summary}")),
                Some(r) => r
                    .violation(kernel.block)
                    .map(|why| format!("kernel {name}: {why} ({r})\n  {summary}")),
            }
        })
        .collect()
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
                    out.lock().expect("no panic")[i] = Some(result);
                }
            });
        }
    });
    out.into_inner()
        .expect("no panic")
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

fn render(rows: &[Row], distinct: usize) -> String {
    let mut out = String::from(
        "# The model zoo\n\n\
         <!-- Generated by crates/dcir-cli/tests/zoo.rs from crates/dcir-onnx/zoo/; \
         run `cargo xtask bless` after a change. -->\n\n\
         Every classification model of `torchvision.models.list_models(module=torchvision.models)` \
         and BERT-base, at batch 1 with weights stripped (`cargo xtask export-zoo`), imported \
         with `dcir-import`, fused for the CUDA emitter and lowered, and each distinct kernel \
         compiled with NVRTC with no spill, in CI (`cargo test -p dcir-cli --test zoo`). GPU \
         runs (`run.sh zoo`) and the timings against \
         PyTorch are in [benchmarks.md](benchmarks.md). Ops are the imported graph's (constants \
         left out); the estimates are the cost model's (H200), in µs, for the plan and for every \
         op its own kernel; the layout is the one `--layout auto` keeps (as written, or the \
         `channels-last` pass's form where the cost model prices it faster). Adapted counts the \
         kernels that run otherwise than the parameters their estimate priced (the notes of \
         `dcir-opt --emit plan`).\n\n\
         | model | ops | kernels | planned (µs) | unfused (µs) | layout | adapted |\n|---|---:|---:|---:|---:|---|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1} | {:.1} | {} | {} |\n",
            r.name, r.ops, r.kernels, r.planned_us, r.unfused_us, r.layout, r.adapted
        ));
    }
    let kernels: usize = rows.iter().map(|r| r.kernels).sum();
    let adapted: usize = rows.iter().map(|r| r.adapted).sum();
    out.push_str(&format!(
        "\n{} models, {kernels} kernels ({adapted} adapted), {distinct} distinct kernel texts; no model is refused.\n",
        rows.len()
    ));
    out
}

/// Every zoo model's row and its distinct kernels (a kernel text that
/// repeats under another name is kept once), computed once for both tests;
/// fails on any model that does not import, plan or lower.
fn zoo() -> &'static (Vec<Row>, Vec<Pending>) {
    static ZOO: std::sync::OnceLock<(Vec<Row>, Vec<Pending>)> = std::sync::OnceLock::new();
    ZOO.get_or_init(compile_zoo)
}

fn compile_zoo() -> (Vec<Row>, Vec<Pending>) {
    let dir = repo_root().join("crates/dcir-onnx/zoo");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the zoo exists")
        .map(|e| e.expect("readable").path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 81,
        "{} models in {}",
        paths.len(),
        dir.display()
    );
    let started = std::time::Instant::now();
    let results = on_two_threads(paths.len(), |i| compile_model(&paths[i]));
    println!(
        "zoo: {} models imported, planned and lowered in {:.1?}",
        paths.len(),
        started.elapsed()
    );
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    let mut seen = BTreeSet::new();
    let mut pending: Vec<Pending> = Vec::new();
    for (path, result) in paths.iter().zip(results) {
        match result {
            Ok((row, kernels)) => {
                for (kernel, source, summary) in kernels {
                    if seen.insert(source.replace(&kernel.name, "KERNEL")) {
                        let summary = format!("{}: {summary}", row.name);
                        pending.push((kernel, source, summary));
                    }
                }
                rows.push(row);
            }
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    (rows, pending)
}

#[test]
fn every_zoo_model_imports_fuses_and_lowers() {
    let (rows, pending) = zoo();
    let text = render(rows, pending.len());
    let doc = repo_root().join("docs/zoo.md");
    if std::env::var("DCIR_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&doc, &text).expect("docs/zoo.md is writable");
    } else {
        let current = std::fs::read_to_string(&doc).unwrap_or_default();
        assert!(
            current == text,
            "docs/zoo.md is stale: run `cargo xtask bless` (DCIR_BLESS=1)"
        );
    }
}

#[test]
fn every_zoo_kernel_compiles_without_spills() {
    let (_, all) = zoo();
    // DCIR_ZOO_ONLY=a,b: only those models' kernels (a quicker look).
    let only = std::env::var("DCIR_ZOO_ONLY").ok();
    let pending: Vec<&Pending> = all
        .iter()
        .filter(|(_, _, summary)| {
            only.as_ref().is_none_or(|only| {
                only.split(',')
                    .any(|m| summary.starts_with(&format!("{m}: ")))
            })
        })
        .collect();
    let started = std::time::Instant::now();
    let batches: Vec<&[&Pending]> = pending.chunks(BATCH).collect();
    let failures: Vec<String> = on_two_threads(batches.len(), |i| compile_with_nvrtc(batches[i]))
        .into_iter()
        .flatten()
        .collect();
    println!(
        "zoo: {} distinct kernels compiled in {:.1?}",
        pending.len(),
        started.elapsed()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
