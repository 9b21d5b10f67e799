//! The dcir CUDA emitter: `fused` groups to CUDA C and PTX.
//!
//! [`lower::lower_fused`] turns one group into a [`kir::Kernel`] (the kernel
//! IR) following the group's attributes (`kind`, `threads`, `vector`,
//! `items`, `threads_per_row`, `rows_per_block`); [`print::print_kernel`]
//! prints it as header-free CUDA C; [`nvrtc::compile`] makes PTX and reads
//! ptxas's resource report; [`artifact::build_artifact`] makes the compiled
//! program the runtime loads. Every kind the planner forms is lowered:
//! `elementwise`, `reduction`, `pool`, `gemm` (FMA, or `mma.sync` for
//! f16/bf16), `conv` (implicit GEMM, or direct for depthwise),
//! `depthwise_pointwise`, `contraction_chain`, `attention`; a form a family
//! does not handle is an [`EmitError::Unsupported`] naming it. A group with
//! `library = "cublaslt"` is no kernel but a recorded call
//! ([`library::library_call`]).
//! [`CudaTarget`] hands that verdict to the planner, which forms no group
//! the emitter refuses; [`FUSE`] is the `fuse` pass planning for it.
//! See `docs/cuda.md`.

pub mod artifact;
pub mod kir;
pub mod library;
pub mod lower;
pub mod nvrtc;
pub mod print;
pub mod target;

use dcir_ir::Module;

pub use artifact::{
    BuildOptions, batch_arch, build_artifact, compile_kernel, kernel_arch, relaxed_promise,
};
pub use lower::{EmitError, kernel_name, lower_fused, lower_graph};
pub use print::print_kernel;
pub use target::{CudaTarget, FUSE};

/// The CUDA source of every kernel of every graph of `module` as one
/// translation unit (what `dcir-opt --emit cuda` prints): the helpers any
/// kernel uses, once, then each kernel under a `// ===== kernel <name> =====`
/// line, then one comment line per library call. It compiles with NVRTC as
/// one program.
pub fn emit_module_source(module: &Module) -> Result<String, EmitError> {
    let mut kernels = Vec::new();
    let mut calls = Vec::new();
    for graph in &module.graphs {
        kernels.extend(lower_graph(graph)?);
        calls.extend(library::library_call_lines(graph)?);
    }
    let helpers: std::collections::BTreeSet<kir::Helper> = kernels
        .iter()
        .flat_map(|k| k.helpers.iter().copied())
        .collect();
    let mut out = print::print_helpers(&helpers);
    for kernel in &kernels {
        out.push_str(&format!("// ===== kernel {} =====\n", kernel.name));
        out.push_str(&print::print_kernel_only(kernel));
        out.push('\n');
    }
    out.extend(calls);
    Ok(out)
}
