//! `cargo xtask`: repository chores behind a cargo alias (see `.cargo/config.toml`).
//!
//! A thin orchestrator: it runs cargo, git and the release `dcir-opt`, and
//! depends on no dcir crate (the layering check enforces that too).

mod bench;
mod bless;
mod chaingen;
mod gpu;
mod layering;
mod pipeline;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use clap::Parser;

/// The subcommands.
#[derive(Parser)]
#[command(bin_name = "cargo xtask", about = "Repository chores for dcir")]
enum Cli {
    /// Fail on any dependency between workspace crates that the layer table forbids.
    Layering,
    /// Run FILE through every compiler stage, writing one numbered file per stage.
    Pipeline {
        /// The input graph.
        file: PathBuf,
        /// Where the stage files go (default: target/pipeline/<stem>/).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Re-bless every snapshot (insta and filetests), then list the changed files.
    Bless,
    /// Generate the benchmark graphs, time release dcir-opt on them, print markdown rows.
    Bench,
    /// Compile every kernel of the CUDA snapshots with NVRTC; report registers,
    /// shared memory and spills; fail on a spill or a compile error.
    ValidateCuda,
    /// Build the release drivers and kernel_check, stripped, with the GPU scripts, into target/gpu/.
    GpuBundle,
    /// Export the model zoo (every torchvision classification model and BERT-base,
    /// weights stripped) into crates/dcir-onnx/zoo/ with scripts/export_zoo.py.
    /// Needs a Python with torch, torchvision, transformers and onnx.
    ExportZoo {
        /// The Python interpreter to run.
        #[arg(long, default_value = "python3")]
        python: PathBuf,
        /// Only these models (comma-separated names).
        #[arg(long)]
        only: Option<String>,
        /// Models exported at once (default: the CPUs / 2).
        #[arg(long)]
        jobs: Option<usize>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse() {
        Cli::Layering => layering::run(),
        Cli::Pipeline { file, out } => pipeline::run(&file, out),
        Cli::Bless => bless::run(),
        Cli::Bench => bench::run(),
        Cli::ValidateCuda => validate_cuda(),
        Cli::GpuBundle => gpu::run(),
        Cli::ExportZoo { python, only, jobs } => export_zoo(&python, only, jobs),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask validate-cuda`: the `validate_cuda` example of dcir-cuda over
/// every snapshot of `tests/filetests/cuda/snapshots/`.
fn validate_cuda() -> Result<()> {
    let dir = workspace_root().join("tests/filetests/cuda/snapshots");
    let mut snaps: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "snap"))
        .collect();
    snaps.sort();
    run_checked(
        cargo()
            .args([
                "run",
                "--release",
                "-q",
                "-p",
                "dcir-cuda",
                "--example",
                "validate_cuda",
                "--",
            ])
            .args(&snaps),
    )
}

/// `cargo xtask export-zoo`: `export_zoo.py` into `crates/dcir-onnx/zoo/`.
fn export_zoo(python: &Path, only: Option<String>, jobs: Option<usize>) -> Result<()> {
    let root = workspace_root();
    let mut cmd = Command::new(python);
    cmd.current_dir(root)
        .arg("crates/dcir-onnx/scripts/export_zoo.py")
        .arg("crates/dcir-onnx/zoo");
    if let Some(only) = only {
        cmd.args(["--only", &only]);
    }
    if let Some(jobs) = jobs {
        cmd.args(["--jobs", &jobs.to_string()]);
    }
    run_checked(&mut cmd)
}

/// The workspace root: xtask lives one directory below it.
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
}

/// A `cargo` command (the cargo running us, from `$CARGO`), run in the workspace root.
fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root());
    cmd
}

/// Runs `cmd` with inherited stdio and fails unless it succeeds.
fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

/// `cargo metadata --format-version 1 --no-deps`, parsed.
fn metadata() -> Result<serde_json::Value> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("cannot run cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("cargo metadata printed invalid JSON")
}

/// The cargo target directory (honours `CARGO_TARGET_DIR` and config).
fn target_dir() -> Result<PathBuf> {
    let meta = metadata()?;
    let dir = meta["target_directory"]
        .as_str()
        .context("cargo metadata has no target_directory")?;
    Ok(PathBuf::from(dir))
}

/// Builds the release `dcir-opt` and returns the path of the binary.
fn build_dcir_opt() -> Result<PathBuf> {
    build_release_bin("dcir-opt")
}

/// Builds the release binary `name` of the workspace and returns its path.
fn build_release_bin(name: &str) -> Result<PathBuf> {
    run_checked(cargo().args(["build", "--release", "--bin", name]))?;
    Ok(target_dir()?
        .join("release")
        .join(format!("{name}{}", env::consts::EXE_SUFFIX)))
}
