//! Compiling kernels to PTX with NVRTC (no GPU needed).
//!
//! The NVRTC library is loaded at run time; [`available`] probes for it
//! first, so a machine without it gets an error, never a panic. Tests print
//! `SKIP: <reason>` when it is missing, unless `DCIR_REQUIRE_NVRTC=1`.

use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts};

/// The default target architecture.
pub const DEFAULT_ARCH: &str = "sm_90";

/// Whether the NVRTC library can be loaded.
pub fn available() -> bool {
    // SAFETY: the probe only tries to dlopen the library by its candidate
    // names and drops it; it calls no NVRTC function.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::nvrtc::sys::is_culib_present()
    }
}

/// Why NVRTC is unusable here, or `None` when it is available.
pub fn unavailable_reason() -> Option<String> {
    if available() {
        None
    } else {
        Some(
            "libnvrtc not found (pip install nvidia-cuda-nvrtc==13.0.88 and put \
             site-packages/nvidia/cu13/lib on LD_LIBRARY_PATH)"
                .to_string(),
        )
    }
}

/// Compiles one translation unit to PTX for `arch` (`sm_90` by default).
pub fn compile(source: &str, name: &str, arch: &'static str) -> Result<String, String> {
    if let Some(reason) = unavailable_reason() {
        return Err(reason);
    }
    if source.contains('\0') {
        return Err("the source contains a NUL byte".into());
    }
    let options = CompileOptions {
        arch: Some(arch),
        name: Some(format!("{name}.cu")),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(source, options).map_err(|e| match e {
        CompileError::CompileError { log, .. } => {
            format!("NVRTC failed on {name}:\n{}", log.to_string_lossy())
        }
        other => format!("NVRTC failed on {name}: {other:?}"),
    })?;
    Ok(ptx.to_src())
}
