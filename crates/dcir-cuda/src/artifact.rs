//! Building the [`Artifact`] of a fused graph: every `fused` op becomes a
//! kernel and a launch, in body order; every value a buffer.
//!
//! Buffers: one per graph parameter (`input`), one per group result
//! (`intermediate`, or `output` when returned). A top-level `reshape` (the
//! planner leaves a lone reshape as a view) gets a buffer that is a view of
//! its operand's root buffer (`view_of`): same bytes, no launch. Liveness is
//! per root buffer: the first and last launch that reads or writes it or any
//! view of it; graph outputs live to the end. Launch arguments follow the
//! kernel's parameter order: the group's operands, then its results.

use std::collections::HashMap;

use dcir_artifact::{Artifact, Buffer, BufferKind, KernelEntry, KernelParam, Launch};
use dcir_ir::{Graph, OpKind, ValueId};

use crate::{lower_fused, nvrtc, print_kernel};

/// How to build an artifact.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// The GPU architecture to compile for (`sm_90`).
    pub arch: String,
    /// Whether to compile every kernel with NVRTC (needs the library); without
    /// it the artifact carries sources only.
    pub compile: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            arch: nvrtc::DEFAULT_ARCH.to_string(),
            compile: true,
        }
    }
}

/// Builds the artifact of fused graph `g`.
pub fn build_artifact(g: &Graph, options: &BuildOptions) -> Result<Artifact, String> {
    let mut a = Artifact {
        graph: g.name().to_string(),
        arch: options.arch.clone(),
        ..Artifact::default()
    };
    let mut buffer_of: HashMap<ValueId, u32> = HashMap::new();
    let new_buffer = |a: &mut Artifact, v: ValueId, kind: BufferKind, view_of: Option<u32>| {
        let ty = g.ty(v);
        let id = a.buffers.len() as u32;
        a.buffers.push(Buffer {
            id,
            name: g.value(v).name.clone(),
            bytes: ty.size_bytes().unwrap_or(0) as u64,
            dtype: ty.dtype.name().to_string(),
            shape: ty.dims().iter().map(|&d| d as u64).collect(),
            view_of,
            first_use: None,
            last_use: None,
            kind,
        });
        id
    };
    for &p in g.params() {
        let id = new_buffer(&mut a, p, BufferKind::Input, None);
        buffer_of.insert(p, id);
        a.inputs.push(id);
    }
    let returned: Vec<ValueId> = g.outputs().map(<[ValueId]>::to_vec).unwrap_or_default();
    let result_kind = |v: ValueId| {
        if returned.contains(&v) {
            BufferKind::Output
        } else {
            BufferKind::Intermediate
        }
    };
    for &op in &g.block(g.body()).ops {
        let data = g.op(op);
        match data.kind {
            OpKind::Return => {}
            OpKind::Fused => {
                let kernel = lower_fused(g, op).map_err(|e| e.to_string())?;
                let source = print_kernel(&kernel);
                let ptx = if options.compile {
                    Some(nvrtc::compile(&source, &kernel.name, &options.arch)?.ptx)
                } else {
                    None
                };
                let mut args: Vec<u32> = data.operands.iter().map(|v| buffer_of[v]).collect();
                for &r in &data.results {
                    let id = new_buffer(&mut a, r, result_kind(r), None);
                    buffer_of.insert(r, id);
                    args.push(id);
                }
                a.launches.push(Launch {
                    kernel: a.kernels.len() as u32,
                    args,
                });
                a.kernels.push(KernelEntry {
                    name: kernel.name.clone(),
                    source,
                    ptx,
                    block: [kernel.block, 1, 1],
                    grid: [kernel.grid, 1, 1],
                    dynamic_shared: kernel.dynamic_shared as u32,
                    params: kernel
                        .params
                        .iter()
                        .map(|p| KernelParam {
                            name: p.name.clone(),
                            dtype: p.dtype.to_string(),
                            output: p.output,
                        })
                        .collect(),
                });
            }
            OpKind::Reshape => {
                let source = buffer_of[&data.operands[0]];
                let root = a.buffers[source as usize].view_of.unwrap_or(source);
                let r = data.results[0];
                let id = new_buffer(&mut a, r, result_kind(r), Some(root));
                buffer_of.insert(r, id);
            }
            other => {
                return Err(format!(
                    "graph @{}: top-level `{}` is neither a fused group nor a view; fuse the graph first",
                    g.name(),
                    other.name()
                ));
            }
        }
    }
    a.outputs = returned.iter().map(|v| buffer_of[v]).collect();
    set_liveness(&mut a);
    Ok(a)
}

/// Fills `first_use`/`last_use` of every buffer from the launches, on root
/// buffers (a view's uses count for its root, and the view reports its
/// root's range); outputs live to the last launch.
fn set_liveness(a: &mut Artifact) {
    let root = |a: &Artifact, id: u32| a.buffers[id as usize].view_of.unwrap_or(id);
    let mut range: HashMap<u32, (u32, u32)> = HashMap::new();
    for (i, launch) in a.launches.iter().enumerate() {
        for &arg in &launch.args {
            let r = root(a, arg);
            let e = range.entry(r).or_insert((i as u32, i as u32));
            e.1 = i as u32;
        }
    }
    if let Some(last) = a.launches.len().checked_sub(1) {
        for &o in &a.outputs {
            let r = root(a, o);
            if let Some(e) = range.get_mut(&r) {
                e.1 = last as u32;
            }
        }
    }
    for id in 0..a.buffers.len() as u32 {
        let r = root(a, id);
        if let Some(&(first, last)) = range.get(&r) {
            a.buffers[id as usize].first_use = Some(first);
            a.buffers[id as usize].last_use = Some(last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(src: &str) -> Artifact {
        let module = dcir_reader::parse_module(src).expect("parses");
        let options = BuildOptions {
            compile: false,
            ..BuildOptions::default()
        };
        build_artifact(&module.graphs[0], &options).expect("builds")
    }

    #[test]
    fn launches_buffers_views_and_liveness() {
        let a = artifact(
            "graph @g(%x: f32[4,8]) -> (f32[32]) {\n\
             \x20 %y = fused @g0(%x.in = %x) {kind = \"elementwise\", threads = 128} : f32[4,8] {\n\
             \x20   %y.r = relu %x.in : f32[4,8]\n\
             \x20   yield %y.r\n\
             \x20 }\n\
             \x20 %z = fused @g1(%y.in = %y) {kind = \"elementwise\", threads = 128} : f32[4,8] {\n\
             \x20   %z.r = neg %y.in : f32[4,8]\n\
             \x20   yield %z.r\n\
             \x20 }\n\
             \x20 %w = reshape %z : f32[32]\n\
             \x20 return %w\n\
             }\n",
        );
        assert_eq!(a.kernels.len(), 2);
        assert_eq!(a.launches[0].args, vec![0, 1]);
        assert_eq!(a.launches[1].args, vec![1, 2]);
        let names: Vec<&str> = a.buffers.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["x", "y", "z", "w"]);
        assert_eq!(a.buffers[3].view_of, Some(2));
        assert_eq!(a.buffers[3].kind, BufferKind::Output);
        assert_eq!(a.buffers[2].kind, BufferKind::Intermediate);
        assert_eq!(a.outputs, vec![3]);
        assert_eq!(
            (a.buffers[0].first_use, a.buffers[0].last_use),
            (Some(0), Some(0))
        );
        assert_eq!(
            (a.buffers[1].first_use, a.buffers[1].last_use),
            (Some(0), Some(1))
        );
        assert_eq!(
            (a.buffers[2].first_use, a.buffers[2].last_use),
            (Some(1), Some(1))
        );
        assert_eq!(
            (a.buffers[3].first_use, a.buffers[3].last_use),
            (Some(1), Some(1))
        );
        assert!(a.kernels.iter().all(|k| k.ptx.is_none()));
    }

    #[test]
    fn unfused_work_is_an_error() {
        let module = dcir_reader::parse_module(
            "graph @g(%x: f32[4]) -> (f32[4]) {\n  %y = relu %x : f32[4]\n  return %y\n}\n",
        )
        .expect("parses");
        let err = build_artifact(&module.graphs[0], &BuildOptions::default()).unwrap_err();
        assert!(err.contains("fuse the graph first"), "{err}");
    }
}
