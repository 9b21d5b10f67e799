//! Compiles every kernel of CUDA snapshot files with NVRTC and prints
//! ptxas's resource report (what `cargo xtask validate-cuda` runs).
//!
//! ```sh
//! validate_cuda FILE.snap...
//! ```
//!
//! A snapshot holds kernels under `// ===== kernel <name> =====` lines (the
//! format of `dcir-opt --emit cuda` and of the cuda filetests); the block size
//! is read from each kernel's `__launch_bounds__`. Exit code 1 when a kernel
//! does not compile, spills, has a stack frame or uses more registers than
//! its block size allows; 2 on bad usage or a missing NVRTC.

use std::process::ExitCode;

use dcir_cuda::nvrtc;

/// One kernel's source, cut out of a snapshot.
struct Kernel {
    file: String,
    name: String,
    source: String,
}

fn main() -> ExitCode {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() || files.iter().any(|f| f.starts_with('-')) {
        eprintln!("usage: validate_cuda FILE.snap...");
        return ExitCode::from(2);
    }
    if let Some(reason) = nvrtc::unavailable_reason() {
        eprintln!("validate_cuda: error: {reason}");
        return ExitCode::from(2);
    }
    let mut kernels = Vec::new();
    for file in &files {
        match std::fs::read_to_string(file) {
            Ok(text) => kernels.extend(split_kernels(file, &text)),
            Err(e) => {
                eprintln!("validate_cuda: error: {file}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    println!("| file | kernel | threads | registers | smem bytes | stack | spills | verdict |");
    println!("|---|---|---:|---:|---:|---:|---:|---|");
    let mut failures = 0;
    for k in &kernels {
        let threads = launch_bound(&k.source);
        let file = k.file.rsplit('/').next().unwrap_or(&k.file);
        // A Hopper-mainloop kernel says in its summary line that it needs sm_90a.
        let arch = if k.source.contains("(sm_90a)") {
            "sm_90a"
        } else {
            nvrtc::DEFAULT_ARCH
        };
        let verdict = match nvrtc::compile(&k.source, &k.name, arch) {
            Err(e) => Err(e),
            Ok(c) => match c.resources {
                None => Err("no ptxas report".to_string()),
                Some(r) => {
                    println!(
                        "| {file} | {} | {threads} | {} | {} | {} | {} | {} |",
                        k.name,
                        r.registers,
                        r.shared_bytes,
                        r.stack_frame,
                        r.spill_stores + r.spill_loads,
                        r.violation(threads).as_deref().unwrap_or("ok")
                    );
                    r.violation(threads).map_or(Ok(()), Err)
                }
            },
        };
        if let Err(e) = verdict {
            failures += 1;
            eprintln!("validate_cuda: {file}: kernel {}: {e}", k.name);
        }
    }
    println!(
        "\n{} kernels in {} files, {failures} failed",
        kernels.len(),
        files.len()
    );
    if failures > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The kernels of one snapshot: text between `// ===== kernel <name> =====` lines.
fn split_kernels(file: &str, text: &str) -> Vec<Kernel> {
    let mut out: Vec<Kernel> = Vec::new();
    for line in text.split_inclusive('\n') {
        let header = line
            .trim()
            .strip_prefix("// ===== kernel ")
            .and_then(|rest| rest.strip_suffix(" ====="));
        match (header, out.last_mut()) {
            (Some(name), _) => out.push(Kernel {
                file: file.to_string(),
                name: name.to_string(),
                source: String::new(),
            }),
            (None, Some(k)) => k.source.push_str(line),
            (None, None) => {}
        }
    }
    out
}

/// The block size in the kernel's `__launch_bounds__(N)` (1024 if absent).
fn launch_bound(source: &str) -> u32 {
    source
        .split("__launch_bounds__(")
        .nth(1)
        .and_then(|rest| rest.split([')', ',']).next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(1024)
}
