//! On a machine with a GPU: every ir-example, in f32 and in f16, through
//! `dcir-run --backend cuda --check` (fuse, compile with NVRTC, run with the
//! memory plan on NaN-poisoned outputs, compare with the interpreter).
//! Without a GPU or NVRTC it prints `SKIP: no GPU: ...` and passes.
//!
//! On the GPU machine (no cargo there), build the binary here with
//! `cargo test --release -p dcir-cli --test gpu_check --no-run`, carry it,
//! and run it from the repository root.

mod common;

use std::path::PathBuf;
use std::process::ExitCode;

/// The repository root: the working directory when it holds `ir-examples/`
/// (a test binary carried to another machine), else the source tree's.
fn repo_root() -> PathBuf {
    let cwd = std::env::current_dir().expect("a working directory");
    if cwd.join("ir-examples").is_dir() {
        return cwd;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn every_example_passes_check_on_the_gpu() {
    let Some(_context) = common::gpu_or_skip() else {
        return;
    };
    let root = repo_root();
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root.join("ir-examples"))
        .expect("ir-examples/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "dcir"))
        .collect();
    examples.sort();
    let scratch = std::env::temp_dir().join(format!("dcir-gpu-check-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let mut failures = Vec::new();
    for path in &examples {
        let stem = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let f32_source = std::fs::read_to_string(path).expect("readable example");
        for dtype in ["f32", "f16"] {
            let file = scratch.join(format!("{stem}_{dtype}.dcir"));
            std::fs::write(&file, f32_source.replace("f32", dtype)).expect("scratch file");
            let args = [
                "dcir-run",
                file.to_str().expect("utf-8 path"),
                "--backend",
                "cuda",
                "--check",
            ];
            println!("== {stem} {dtype}");
            let code = dcir_cli::run::main_with("dcir-run", args.iter().map(Into::into));
            if code != ExitCode::SUCCESS {
                failures.push(format!("{stem} {dtype}"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(failures.is_empty(), "--check failed: {failures:?}");
}

/// On a machine with a GPU, with `DCIR_ONNX_NODE_DIR` naming the folder the
/// node-test harness exported (`cargo xtask gpu-bundle` writes
/// `target/gpu/onnx-node/`: `<test>.dcir` and `<test>.safetensors`): every
/// test through `dcir-run --backend cuda --check` on its own inputs, in this
/// process on `DCIR_NODE_JOBS` threads (default: the CPUs), one CUDA context
/// for all. The failures are run again one at a time at the end, so their
/// output reads in order. Prints `onnx-node: P pass, F fail` and `<test> FAIL`
/// per failure. Without the folder or a GPU it prints `SKIP` and passes.
#[test]
fn onnx_node_tests_pass_check_on_the_gpu() {
    let Some(dir) = std::env::var_os("DCIR_ONNX_NODE_DIR").map(PathBuf::from) else {
        println!("SKIP: DCIR_ONNX_NODE_DIR is not set");
        return;
    };
    let Some(_context) = common::gpu_or_skip() else {
        return;
    };
    let mut tests: Vec<String> = std::fs::read_dir(&dir)
        .expect("the node-test folder")
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".dcir")
                .map(String::from)
        })
        .collect();
    tests.sort();
    let run = |name: &str| {
        let graph = dir.join(format!("{name}.dcir"));
        let inputs = dir.join(format!("{name}.safetensors"));
        let mut args = vec![std::ffi::OsString::from("dcir-run"), graph.into_os_string()];
        if inputs.exists() {
            args.extend(["--inputs".into(), inputs.into_os_string()]);
        }
        args.extend(["--backend", "cuda", "--check"].map(Into::into));
        dcir_cli::run::main_with("dcir-run", args) == ExitCode::SUCCESS
    };
    let jobs = std::env::var("DCIR_NODE_JOBS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(name) = tests.get(i) else { break };
                    if !run(name) {
                        failed.lock().expect("no worker panics").push(name.clone());
                    }
                }
            });
        }
    });
    let mut failed = failed.into_inner().expect("no worker panics");
    failed.sort();
    for name in &failed {
        println!("== {name} (again, alone)");
        run(name);
    }
    println!(
        "onnx-node: {} pass, {} fail",
        tests.len() - failed.len(),
        failed.len()
    );
    for name in &failed {
        println!("{name} FAIL");
    }
    assert!(failed.is_empty(), "--check failed: {failed:?}");
}

/// Every library call of `tests/filetests/cuda/cublaslt.dcir` (bias + relu,
/// batched with B transposed, strict f32 with A transposed, a residual in
/// bf16, tanh-GELU, odd extents) and `cudnn.dcir` (bias + relu, a residual
/// in bf16, strict f32 strided and dilated, grouped with an identity
/// activation, depthwise) through `--check`, launch by launch and replayed
/// in a CUDA graph (`--bench`); a library not installed is skipped with a
/// note.
#[test]
fn library_calls_pass_check_on_the_gpu() {
    let Some(_context) = common::gpu_or_skip() else {
        return;
    };
    let cases: [(&str, bool, &[&str]); 2] = [
        (
            "cublaslt.dcir",
            dcir_runtime::cublaslt_present(),
            &[
                "lt_bias_relu",
                "lt_batched_tb",
                "lt_f32_ta",
                "lt_residual",
                "lt_gelu_tanh",
                "lt_odd",
            ],
        ),
        (
            "cudnn.dcir",
            dcir_runtime::cudnn_present(),
            &[
                "dnn_bias_relu",
                "dnn_residual",
                "dnn_f32_strided",
                "dnn_grouped_bias",
                "dnn_depthwise",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (file, present, graphs) in cases {
        if !present {
            println!("SKIP: no GPU library for {file}: not on the library path");
            continue;
        }
        let path = repo_root().join("tests/filetests/cuda").join(file);
        let path = path.to_str().expect("utf-8 path");
        for &graph in graphs {
            let args = [
                "dcir-run",
                path,
                "--graph",
                graph,
                "--backend",
                "cuda",
                "--check",
                "--bench",
                "5",
            ];
            println!("== {graph}");
            if dcir_cli::run::main_with("dcir-run", args.iter().map(Into::into))
                != ExitCode::SUCCESS
            {
                failures.push(graph);
            }
        }
    }
    assert!(failures.is_empty(), "failed: {failures:?}");
}

/// `--save-artifact` records the algorithm each library call chose, and
/// `--artifact` replays the saved calls and still passes `--check`.
#[test]
fn saved_library_calls_record_their_algorithm_and_replay() {
    let Some(_context) = common::gpu_or_skip() else {
        return;
    };
    let cases = [
        (
            "cublaslt.dcir",
            "lt_bias_relu",
            dcir_runtime::cublaslt_present(),
        ),
        (
            "cudnn.dcir",
            "dnn_f32_strided",
            dcir_runtime::cudnn_present(),
        ),
    ];
    for (file, graph, present) in cases {
        if !present {
            println!("SKIP: no GPU library for {file}: not on the library path");
            continue;
        }
        let path = repo_root().join("tests/filetests/cuda").join(file);
        let path = path.to_str().expect("utf-8 path");
        let dir = std::env::temp_dir().join(format!("dcir-saved-{graph}-{}", std::process::id()));
        let dir_arg = dir.to_str().expect("utf-8 path");
        let run = |extra: &[&str]| {
            let mut args = vec![
                "dcir-run",
                path,
                "--graph",
                graph,
                "--backend",
                "cuda",
                "--check",
            ];
            args.extend_from_slice(extra);
            dcir_cli::run::main_with("dcir-run", args.iter().map(Into::into))
        };
        assert_eq!(
            run(&["--save-artifact", dir_arg]),
            ExitCode::SUCCESS,
            "{graph}"
        );
        let saved = dcir_artifact::Artifact::read_dir(&dir).expect("the saved artifact reads");
        let recorded =
            saved
                .kernels
                .iter()
                .filter_map(|k| k.library.as_ref())
                .all(|call| match call {
                    dcir_artifact::LibraryCall::Cublaslt(c) => c.algorithm.is_some(),
                    dcir_artifact::LibraryCall::Cudnn(c) => c.algorithm.is_some(),
                });
        assert!(recorded, "{graph}: {:?}", saved.kernels);
        assert!(
            saved.kernels.iter().any(|k| k.library.is_some()),
            "{graph}: no call"
        );
        assert_eq!(
            run(&["--artifact", dir_arg]),
            ExitCode::SUCCESS,
            "{graph} replayed"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
