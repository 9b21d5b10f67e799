//! Running the drivers as a user does, for the CLI tests.

#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs the binary at `exe` from the repository root with `args`, feeding
/// `stdin` (nothing if `None`), and waits for it.
pub fn run_tool(exe: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(exe)
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{exe} starts: {e}"));
    let mut pipe = child.stdin.take().expect("stdin is piped");
    // A tool that fails before reading standard input closes the pipe early.
    if let Err(e) = pipe.write_all(stdin.unwrap_or_default()) {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "stdin accepts input: {e}"
        );
    }
    drop(pipe);
    child.wait_with_output().expect("the tool finishes")
}

/// Bytes as text, lossily.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether NVRTC is here for a test step that compiles (`what`); without it
/// the step prints `SKIP: ...` and the caller returns, except under
/// `DCIR_REQUIRE_NVRTC=1` (CI), where a missing NVRTC fails the test.
pub fn nvrtc_or_skip(what: &str) -> bool {
    let Some(reason) = dcir_cuda::nvrtc::unavailable_reason() else {
        return true;
    };
    assert!(
        std::env::var("DCIR_REQUIRE_NVRTC").as_deref() != Ok("1"),
        "DCIR_REQUIRE_NVRTC=1 but {reason}"
    );
    println!("SKIP: {what}: {reason}");
    false
}

/// GPU 0's context, held by the caller so that runs in this process share it;
/// or `None` after printing `SKIP: no GPU: <reason>` (no driver, no NVRTC,
/// no device).
pub fn gpu_or_skip() -> Option<std::sync::Arc<cudarc::driver::CudaContext>> {
    if !dcir_runtime::driver_present() || dcir_cuda::nvrtc::unavailable_reason().is_some() {
        println!("SKIP: no GPU: no CUDA driver or no NVRTC on this machine");
        return None;
    }
    match cudarc::driver::CudaContext::new(0) {
        Ok(context) => Some(context),
        Err(e) => {
            println!("SKIP: no GPU: {e:?}");
            None
        }
    }
}
