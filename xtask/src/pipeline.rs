//! `cargo xtask pipeline FILE.dcir [--out DIR]`: every compiler stage's output, one file each
//! (the tuned IR last, where a GPU is present).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The stages after `00-input.dcir` (a copy of the input), in order: the file
/// each writes and the `dcir-opt` arguments that produce it from the input.
/// A new stage is one more line here.
pub const STAGES: &[(&str, &[&str])] = &[
    // Parse, verify, print canonical IR.
    ("01-verified.dcir", &[]),
    // The cleanup pipeline: local simplifications, batchnorms into conv weights,
    // weight-only work first.
    (
        "02-simplified.dcir",
        &[
            "--pipeline",
            "canonicalize,fold-constants,cse,fold-batchnorm,dce,hoist-weights",
        ],
    ),
    // Fusion: the plan table (H200 preset), then the fused IR.
    ("03-plan.md", &["--fuse", "--emit", "plan"]),
    ("04-fused.dcir", &["--fuse"]),
    // Emission: every kernel's CUDA source, then the compiled artifact (a
    // directory: artifact.json, .cu and .ptx per kernel; needs NVRTC).
    ("05-kernels.cu", &["--emit", "cuda"]),
    ("06-artifact", &["--emit", "artifact"]),
];

/// Runs every stage on `file`, writing into `out` (default `target/pipeline/<stem>/`).
/// An `.onnx` file is imported first (`00-input.dcir` is `dcir-import`'s output).
pub fn run(file: &Path, out: Option<PathBuf>) -> Result<()> {
    if !file.is_file() {
        bail!("{} is not a file", file.display());
    }
    let out = match out {
        Some(dir) => dir,
        None => {
            let stem = file.file_stem().context("the input has no file name")?;
            crate::target_dir()?.join("pipeline").join(stem)
        }
    };
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let opt = crate::build_dcir_opt()?;

    let input = out.join("00-input.dcir");
    if file.extension().is_some_and(|e| e == "onnx") {
        let import = crate::build_release_bin("dcir-import")?;
        let mut cmd = Command::new(import);
        cmd.arg(file).arg("-o").arg(&input).arg("--no-weights");
        let status = cmd
            .status()
            .with_context(|| format!("cannot run {cmd:?}"))?;
        if !status.success() {
            bail!("import failed: {cmd:?}");
        }
    } else {
        fs::copy(file, &input).with_context(|| format!("cannot copy {}", file.display()))?;
    }
    println!("{}", input.display());
    let file = input.as_path();
    for (name, args) in STAGES {
        let path = out.join(name);
        // Never leave a stale file (or artifact directory) behind a failing stage.
        let _ = fs::remove_file(&path);
        let _ = fs::remove_dir_all(&path);
        let mut cmd = Command::new(&opt);
        cmd.args(*args).arg(file).arg("-o").arg(&path);
        // dcir-opt's diagnostics go straight to our stderr.
        let status = cmd
            .status()
            .with_context(|| format!("cannot run {cmd:?}"))?;
        if !status.success() {
            bail!("stage {name} failed: {cmd:?}");
        }
        println!("{}", path.display());
    }
    tuned(&opt, file, &out)
}

/// The last stage, `07-tuned.dcir`: every group's parameters measured on
/// GPU 0 (`dcir-opt --fuse --tune`, a cache in memory only). It needs a GPU
/// and NVRTC; without them it is skipped with the reason, not failed.
fn tuned(opt: &Path, file: &Path, out: &Path) -> Result<()> {
    let path = out.join("07-tuned.dcir");
    let _ = fs::remove_file(&path);
    let mut cmd = Command::new(opt);
    cmd.args(["--fuse", "--tune", "--tune-cache", "none"])
        .arg(file)
        .arg("-o")
        .arg(&path);
    let output = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        eprint!("{stderr}");
        println!("{}", path.display());
        return Ok(());
    }
    let reason = stderr.lines().last().unwrap_or("").trim();
    if reason.contains("no CUDA driver") || reason.contains("NVRTC") {
        println!("07-tuned.dcir skipped: {reason}");
        return Ok(());
    }
    eprint!("{stderr}");
    bail!("stage 07-tuned.dcir failed: {cmd:?}")
}
