//! The CUDA emitter as the planner's [`Target`]: a group is accepted when it
//! lowers (or, with `library`, when the library's recognizer reads it as a
//! call), so the planner's contract and the emitter are one predicate.

use dcir_fusion::{FUSE_NAME, FUSE_OPTIONS, FUSE_SUMMARY, Refusal, Target, fuse_pass};
use dcir_ir::{Attr, Graph, OpId};
use dcir_passes::PassDef;

use crate::library::{library_call, library_of};
use crate::lower::{EmitError, lower_fused};

/// The CUDA backend: accepts the `fused` ops [`lower_fused`] lowers and the
/// library calls [`library_call`] reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaTarget;

impl Target for CudaTarget {
    fn accept(&self, graph: &Graph, fused: OpId) -> Result<(), Refusal> {
        let lowered = match library_of(graph, fused) {
            Some(_) => library_call(graph, fused).map(|_| ()),
            None => lower_fused(graph, fused).map(|_| ()),
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
