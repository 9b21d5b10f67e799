//! What can go wrong on the device, each naming what it concerns.

use cudarc::driver::DriverError;

/// A runtime failure. Every variant is an error for the caller to report;
/// the runtime never panics on a missing driver, device or resource.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// libcuda could not be loaded.
    #[error(
        "no CUDA driver (libcuda.so not found); run on a machine with an NVIDIA GPU and driver"
    )]
    NoDriver,
    /// The driver loaded but device `ordinal` could not be opened.
    #[error("cannot open CUDA device {ordinal}: {error}")]
    NoDevice {
        /// The device index.
        ordinal: usize,
        /// The driver's error.
        error: String,
    },
    /// A kernel has no PTX (the artifact was built without NVRTC).
    #[error("kernel {kernel} has no PTX: build the artifact with NVRTC available")]
    NoPtx {
        /// The kernel's name.
        kernel: String,
    },
    /// The driver rejected a kernel's PTX (e.g. a PTX ISA newer than the driver).
    #[error("cannot load kernel {kernel}: {error}")]
    Load {
        /// The kernel's name.
        kernel: String,
        /// The driver's error.
        error: String,
    },
    /// A kernel built for one architecture (`sm_90a`) on a GPU of another.
    #[error(
        "kernel {kernel} runs only on {needs} (it uses that architecture's own instructions); device {ordinal} is sm_{major}{minor}: compile for it without those kernels"
    )]
    Architecture {
        /// The kernel's name.
        kernel: String,
        /// The architecture it needs.
        needs: String,
        /// The device index.
        ordinal: usize,
        /// The device's compute capability, major.
        major: i32,
        /// The device's compute capability, minor.
        minor: i32,
    },
    /// A kernel needs more shared memory per block than the device gives.
    #[error(
        "kernel {kernel} needs {needed} bytes of shared memory per block; the device allows {limit}"
    )]
    SharedMemory {
        /// The kernel's name.
        kernel: String,
        /// Bytes it needs.
        needed: u64,
        /// Bytes the device allows (opt-in maximum).
        limit: u64,
    },
    /// The planned run needs more device memory than is free.
    #[error(
        "the compiled graph needs {needed} bytes of device memory (the intermediates' arena, inputs, outputs and constants); device {ordinal} has {free} bytes free"
    )]
    DeviceMemory {
        /// The device index.
        ordinal: usize,
        /// Bytes the memory plan holds.
        needed: u64,
        /// Bytes the driver reports free.
        free: u64,
    },
    /// An allocation failed (usually out of memory).
    #[error("cannot allocate {bytes} bytes for {what}: {error}")]
    Alloc {
        /// What the allocation was for.
        what: String,
        /// Its size.
        bytes: u64,
        /// The driver's error.
        error: String,
    },
    /// A launch (or the work before it on the stream) failed.
    #[error("launch of kernel {kernel} failed: {error}")]
    Launch {
        /// The kernel's name.
        kernel: String,
        /// The driver's error.
        error: String,
    },
    /// A library call could not be prepared: the library is missing, or it
    /// refused the call (an unsupported shape or alignment).
    #[error("library call {launch}: {error}")]
    Library {
        /// The launch's name.
        launch: String,
        /// Why.
        error: String,
    },
    /// Host data does not fit the artifact's signature.
    #[error("{0}")]
    Signature(String),
    /// Any other driver call failed.
    #[error("{what}: {error}")]
    Driver {
        /// What was being done.
        what: String,
        /// The driver's error.
        error: String,
    },
}

/// Wraps a driver error with what was being done.
pub(crate) fn driver(what: impl Into<String>) -> impl FnOnce(DriverError) -> RuntimeError {
    let what = what.into();
    move |e| RuntimeError::Driver {
        what,
        error: format!("{e:?}"),
    }
}
