//! The dcir runtime: runs a compiled [`dcir_artifact::Artifact`] on a CUDA GPU.
//!
//! It depends on the artifact format and cudarc only, never on the compiler.
//! [`plan_memory`] lays the intermediates out in one arena by liveness;
//! [`Executor`] loads the PTX, allocates, uploads inputs, poisons outputs,
//! runs launch by launch or as one CUDA graph, times runs and reads outputs
//! back. Library calls (cuBLASLt and cuDNN, loaded at run time) are launches
//! like the kernels. Missing drivers, devices or resources are [`RuntimeError`]s, never
//! panics. See `docs/runtime.md`.

mod cudnn;
mod error;
mod executor;
mod library;
mod plan;
mod probe;

pub use cudnn::{cudnn_present, cudnn_version};
pub use error::RuntimeError;
pub use executor::{
    DeviceInfo, Executor, Timing, driver_present, driver_version, encode_tensor_map, query_device,
};
pub use library::{cublaslt_present, cublaslt_version};
pub use plan::{ALIGN, MemoryPlan, plan_memory};
pub use probe::LibraryProbe;
