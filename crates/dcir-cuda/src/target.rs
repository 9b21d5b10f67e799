//! The CUDA emitter as the planner's [`Target`]: a group is accepted when it
//! lowers (or, with `library`, when the library's recognizer reads it as a
//! call), so the planner's contract and the emitter are one predicate; the
//! answer carries the planned parameters the kernel adapted
//! (`Kernel::adapted`).

use dcir_fusion::{Accepted, FUSE_NAME, FUSE_OPTIONS, FUSE_SUMMARY, Refusal, Target, fuse_pass};
use dcir_ir::{Attr, Graph, OpId};
use dcir_passes::PassDef;

use crate::library::{library_call, library_of};
use crate::lower::{EmitError, lower_fused};

/// The CUDA backend: accepts the `fused` ops [`lower_fused`] lowers and the
/// library calls [`library_call`] reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaTarget;

impl Target for CudaTarget {
    fn accept(&self, graph: &Graph, fused: OpId) -> Result<Accepted, Refusal> {
        let lowered = match library_of(graph, fused) {
            Some(_) => library_call(graph, fused).map(|_| Accepted::default()),
            None => lower_fused(graph, fused).map(|kernel| Accepted {
                adapted: kernel.adapted,
            }),
        };
        lowered.map_err(|e| {
            let family = graph
                .op(fused)
                .attrs
                .get("kind")
                .and_then(Attr::as_str)
                .unwrap_or("CUDA")
                .to_string();
            match e {
                EmitError::Unsupported { reason, .. } => Refusal { family, reason },
            }
        })
    }
}

/// The `fuse` pass planning for the CUDA emitter.
pub const FUSE: PassDef = PassDef {
    name: FUSE_NAME,
    summary: FUSE_SUMMARY,
    options: FUSE_OPTIONS,
    create: |options| fuse_pass(options, Box::new(CudaTarget)),
};

#[cfg(test)]
mod tests {
    use dcir_ir::OpKind;

    use super::*;

    /// `CudaTarget`'s answer for the one group of a graph: an FMA matmul
    /// 512×256×512 planned with `attrs`.
    fn accept_matmul(attrs: &str) -> Accepted {
        let src = format!(
            "graph @g(%a: f32[512,256], %b: f32[256,512]) -> (f32[512,512]) {{\n  \
             %y = fused @g0(%a.in = %a, %b.in = %b) {{kind = \"gemm\", level = \"register\", math = \"fma\", {attrs}}} : f32[512,512] {{\n    \
             %y.r = matmul %a.in, %b.in : f32[512,512]\n    yield %y.r\n  }}\n  return %y\n}}\n"
        );
        let module = dcir_reader::parse_module(&src).expect("parses");
        let g = &module.graphs[0];
        let fused = g.block(g.body()).ops[0];
        assert_eq!(g.op(fused).kind, OpKind::Fused);
        CudaTarget.accept(g, fused).expect("lowers")
    }

    #[test]
    fn accept_names_the_planned_parameters_a_kernel_runs_otherwise() {
        let as_planned = accept_matmul("tile = [128, 128, 8], threads = 256, stages = 2");
        assert_eq!(as_planned.adapted, Vec::<String>::new());
        // 128 + 256 rows of k = 64 would prefetch 96 elements a thread, and
        // two buffers of k = 16 take 49 KiB; the FMA mainloop double-buffers
        // at most.
        let adapted = accept_matmul("tile = [128, 256, 64], threads = 256, stages = 4").adapted;
        assert_eq!(adapted.len(), 2, "{adapted:?}");
        assert!(
            adapted[0].starts_with("tile = [128, 256, 64] runs as [128, 256, 8]"),
            "{adapted:?}"
        );
        assert!(
            adapted[1].starts_with("stages = 4 runs as 2"),
            "{adapted:?}"
        );
    }
}
