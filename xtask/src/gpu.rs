//! `cargo xtask gpu-bundle`: everything the GPU machine needs, in one folder.
//!
//! The device machine has CUDA but no Rust: this builds the release drivers
//! and `kernel_check` here, strips them (the device tool carries at most
//! 64 MiB), and copies them with the scripts of `xtask/gpu/` into
//! `target/gpu/`, with the GPU test binaries `gpu_check` and `gpu_random` and the passing ONNX
//! node tests (`onnx-node/`, graphs and inputs; needs `onnx` installed). Then, with the device tool, from the repository root:
//! `run(carry = ["target/gpu"], command = "bash target/gpu/run.sh kernels examples perf peers")`.

use std::fs;
use std::process::Command;

use anyhow::{Context, Result};

/// Release binaries of the bundle: (cargo arguments, built file under target/release).
const BINARIES: &[(&[&str], &str)] = &[
    (&["--bin", "dcir-run"], "dcir-run"),
    (&["--bin", "dcir-opt"], "dcir-opt"),
    (&["--bin", "dcir-import"], "dcir-import"),
    (
        &["-p", "dcir-cuda", "--example", "kernel_check"],
        "examples/kernel_check",
    ),
];

/// Scripts copied from `xtask/gpu/`.
const SCRIPTS: &[&str] = &[
    "run.sh",
    "family_peers.py",
    "suite.py",
    "zoo_peers.py",
    "fit.py",
    "gemm_probe.py",
    "conv_peers.py",
];

/// The GPU test targets of dcir-cli carried as binaries.
const GPU_TESTS: &[&str] = &["gpu_check", "gpu_random"];

/// Builds dcir-cli's test target `test` in release; returns its executable.
fn build_test(test: &str) -> Result<String> {
    let out = crate::cargo()
        .args([
            "test",
            "--release",
            "-p",
            "dcir-cli",
            "--test",
            test,
            "--no-run",
        ])
        .args(["--message-format", "json"])
        .output()
        .context("cannot run cargo test --no-run")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["target"]["name"] == test && m["target"]["kind"][0] == "test")
        .find_map(|m| m["executable"].as_str().map(str::to_string))
        .with_context(|| format!("cargo built no {test} test binary"))
}

pub fn run() -> Result<()> {
    let target = crate::target_dir()?;
    let bundle = target.join("gpu");
    fs::create_dir_all(&bundle).with_context(|| format!("cannot create {}", bundle.display()))?;
    for (args, built) in BINARIES {
        crate::run_checked(crate::cargo().args(["build", "--release"]).args(*args))?;
        let from = target.join("release").join(built);
        let name = from.file_name().context("a binary has a name")?;
        let to = bundle.join(name);
        fs::copy(&from, &to).with_context(|| format!("cannot copy {}", from.display()))?;
        crate::run_checked(Command::new("strip").arg(&to))?;
    }
    // The GPU test targets (`crates/dcir-cli/tests/gpu_check.rs`, `gpu_random.rs`).
    for test in GPU_TESTS {
        let to = bundle.join(test);
        fs::copy(build_test(test)?, &to).with_context(|| format!("cannot copy {test}"))?;
        crate::run_checked(Command::new("strip").arg(&to))?;
    }
    // The passing ONNX node tests, as graphs and inputs for `run.sh onnx-node`.
    let nodes = bundle.join("onnx-node");
    if nodes.exists() {
        fs::remove_dir_all(&nodes).with_context(|| format!("cannot clear {}", nodes.display()))?;
    }
    crate::run_checked(
        crate::cargo()
            .args(["test", "--release", "-p", "dcir-cli", "--test", "onnx_node"])
            .env("DCIR_ONNX_NODE_EXPORT", &nodes)
            .env("DCIR_REQUIRE_ONNX_TESTS", "1"),
    )?;
    for script in SCRIPTS {
        let from = crate::workspace_root().join("xtask/gpu").join(script);
        fs::copy(&from, bundle.join(script))
            .with_context(|| format!("cannot copy {}", from.display()))?;
    }
    println!(
        "{}: carry it to the GPU machine and run `bash target/gpu/run.sh kernels examples perf peers`",
        bundle.display()
    );
    Ok(())
}
