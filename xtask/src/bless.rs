//! `cargo xtask bless`: re-bless every snapshot, then list what changed for review.

use std::process::Command;

use anyhow::{Context, Result, bail};

/// Runs the whole test suite in bless mode and prints the changed snapshot files.
pub fn run() -> Result<()> {
    // insta writes `.snap` files in place; the filetest harness reads DCIR_BLESS.
    let tests = crate::cargo()
        .args(["test", "--workspace"])
        .env("INSTA_UPDATE", "always")
        .env("DCIR_BLESS", "1")
        .status()
        .context("cannot run cargo test")?;
    let changed = Command::new("git")
        .current_dir(crate::workspace_root())
        .args(["status", "--porcelain", "--untracked-files=all", "--"])
        .args(["*.snap", "tests/"])
        .output()
        .context("cannot run git status")?;
    let changed = String::from_utf8_lossy(&changed.stdout);
    if changed.trim().is_empty() {
        println!("bless: no snapshot changed");
    } else {
        println!("bless: changed files (review them before committing):\n{changed}");
    }
    if !tests.success() {
        bail!("cargo test failed even in bless mode (see above)");
    }
    Ok(())
}
