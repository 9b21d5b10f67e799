//! Building the [`Artifact`] of a fused graph: every `fused` op becomes a
//! kernel and a launch, in body order; every value a buffer.
//!
//! Buffers: one per graph parameter (`input`), one per group result
//! (`intermediate`, or `output` when returned). A top-level `reshape` (the
//! planner leaves a lone reshape as a view) gets a buffer that is a view of
//! its operand's root buffer (`view_of`): same bytes, no launch. A top-level
//! `concat` stored in place (`dcir_fusion::concat_storage`) launches nothing:
//! each value it places is a view of the root's buffer at its byte offset,
//! so the producers' kernels write the concat's elements. A top-level
//! `constant` (one too large and too varied to inline into kernels, such as
//! BERT's position ids) is a `constant` buffer carrying its bytes. Liveness is
//! per root buffer: the first and last launch that reads or writes it or any
//! view of it; graph outputs live to the end. Launch arguments follow the
//! kernel's parameter order: the group's operands, then its results, then
//! the kernel's scratch (split-K's partial sums, an intermediate live for
//! the one launch, and its arrival counters, a `zeroed` buffer).
//! Groups that lower to the same kernel up to the names it declares (BERT's
//! twelve layers) share one kernel entry: compiled once, loaded once.
//! A group with `library` is a library call: an entry with the recorded
//! call and no source, bound to the call's operands then its output.

use std::collections::{HashMap, HashSet};

use dcir_artifact::{Artifact, Buffer, BufferKind, KernelEntry, KernelParam, Launch};
use dcir_ir::{Graph, OpKind, ValueId};

use crate::kir::{Kernel, Stmt};
use crate::library::{library_call, library_of};
use crate::{kernel_name, lower_fused, nvrtc, print_kernel};

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
    // A kernel's source with its declared names canonical → its index in `a.kernels`.
    let mut kernel_of: HashMap<String, u32> = HashMap::new();
    let new_buffer = |a: &mut Artifact, v: ValueId, kind: BufferKind, view: Option<(u32, u64)>| {
        let ty = g.ty(v);
        let shape = ty.dims().iter().map(|&d| d as u64).collect();
        let bytes = ty.size_bytes().unwrap_or(0) as u64;
        let (name, dtype) = (g.value(v).name.clone(), ty.dtype.name());
        push_buffer(a, name, bytes, dtype, shape, kind, view)
    };
    let storage = dcir_fusion::concat_storage(g);
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
    // The buffer of an op's result: its own, or, for a value a stored concat
    // places, a view of the root's buffer at its slot (the root's buffer is
    // made by the first value placed in it).
    let result_buffer =
        |a: &mut Artifact, buffer_of: &mut HashMap<ValueId, u32>, r: ValueId| -> u32 {
            if let Some(&id) = buffer_of.get(&r) {
                return id;
            }
            let id = match storage.slots.get(&r) {
                Some(slot) => {
                    let root = match buffer_of.get(&slot.root) {
                        Some(&root) => root,
                        None => {
                            let root = new_buffer(a, slot.root, result_kind(slot.root), None);
                            buffer_of.insert(slot.root, root);
                            root
                        }
                    };
                    new_buffer(a, r, result_kind(r), Some((root, slot.offset)))
                }
                None => new_buffer(a, r, result_kind(r), None),
            };
            buffer_of.insert(r, id);
            id
        };
    for &op in &g.block(g.body()).ops {
        let data = g.op(op);
        match data.kind {
            OpKind::Return => {}
            OpKind::Fused if library_of(g, op).is_some() => {
                let bound = library_call(g, op).map_err(|e| e.to_string())?;
                let name = kernel_name(g, op);
                // One entry per distinct call; launches of it differ by name.
                let key = format!("library {:?}", bound.call);
                let index = match kernel_of.get(&key) {
                    Some(&i) => i,
                    None => {
                        let i = a.kernels.len() as u32;
                        kernel_of.insert(key, i);
                        a.kernels.push(KernelEntry {
                            name: name.clone(),
                            source: String::new(),
                            ptx: None,
                            cubin: None,
                            block: [0; 3],
                            grid: [0; 3],
                            dynamic_shared: 0,
                            params: bound.params,
                            library: Some(bound.call),
                            summary: bound.summary,
                            requires_arch: None,
                        });
                        i
                    }
                };
                let mut args: Vec<u32> = bound.operands.iter().map(|v| buffer_of[v]).collect();
                args.push(result_buffer(&mut a, &mut buffer_of, data.results[0]));
                a.launches.push(Launch {
                    name,
                    kernel: index,
                    args,
                });
            }
            OpKind::Fused => {
                let kernel = lower_fused(g, op).map_err(|e| e.to_string())?;
                let source = print_kernel(&kernel);
                let key = canonical_source(&kernel, &source);
                let index = match kernel_of.get(&key) {
                    Some(&i) => i,
                    None => {
                        let i = a.kernels.len() as u32;
                        kernel_of.insert(key, i);
                        a.kernels.push(kernel_entry(&kernel, source, options)?);
                        i
                    }
                };
                let mut args: Vec<u32> = data.operands.iter().map(|v| buffer_of[v]).collect();
                for &r in &data.results {
                    args.push(result_buffer(&mut a, &mut buffer_of, r));
                }
                // Scratch (split-K) binds the kernel's trailing parameters.
                for s in &kernel.scratch {
                    let kind = if s.zeroed {
                        BufferKind::Zeroed
                    } else {
                        BufferKind::Intermediate
                    };
                    let (name, bytes) = (format!("{}.{}", kernel.name, s.param), s.bytes as u64);
                    args.push(push_buffer(
                        &mut a,
                        name,
                        bytes,
                        "u8",
                        vec![bytes],
                        kind,
                        None,
                    ));
                }
                a.launches.push(Launch {
                    name: kernel.name.clone(),
                    kernel: index,
                    args,
                });
            }
            OpKind::Constant => {
                let r = data.results[0];
                let bytes = constant_bytes(g, op)?;
                let id = new_buffer(&mut a, r, BufferKind::Constant, None);
                a.buffers[id as usize].data = Some(bytes);
                buffer_of.insert(r, id);
            }
            OpKind::Reshape => {
                let source = &a.buffers[buffer_of[&data.operands[0]] as usize];
                let view = (source.view_of.unwrap_or(source.id), source.view_offset);
                let r = data.results[0];
                let id = new_buffer(&mut a, r, result_kind(r), Some(view));
                buffer_of.insert(r, id);
            }
            OpKind::Concat if storage.is_stored(op) => {
                // Its operands' kernels wrote its elements; nothing to launch.
                result_buffer(&mut a, &mut buffer_of, data.results[0]);
            }
            other => {
                let named = data
                    .results
                    .first()
                    .map(|&r| format!(" %{}", g.value(r).name))
                    .unwrap_or_default();
                let partly_fused = g
                    .block(g.body())
                    .ops
                    .iter()
                    .any(|&o| g.op(o).kind == OpKind::Fused);
                let advice = match partly_fused {
                    // The planner fuses only graphs with no group (it keeps hand-made ones).
                    true => {
                        "the graph is partly fused, and dcir fuses only graphs with no `fused` op: \
                             put it in a group, or inline the groups and let dcir fuse the whole graph"
                    }
                    false => "fuse the graph first",
                };
                return Err(format!(
                    "graph @{}: top-level `{}`{named} is neither a fused group nor a view; {advice}",
                    g.name(),
                    other.name()
                ));
            }
        }
    }
    a.outputs = returned.iter().map(|v| buffer_of[v]).collect();
    set_liveness(&mut a);
    // What the loader checks holds of what the builder writes.
    a.validate().map_err(|e| {
        format!(
            "graph @{}: the artifact is invalid (a builder bug): {e}",
            g.name()
        )
    })?;
    Ok(a)
}

/// Appends a buffer (no uses yet, no data) to `a`, a view of `(root,
/// byte offset)` when given; returns its id.
fn push_buffer(
    a: &mut Artifact,
    name: String,
    bytes: u64,
    dtype: &str,
    shape: Vec<u64>,
    kind: BufferKind,
    view: Option<(u32, u64)>,
) -> u32 {
    let id = a.buffers.len() as u32;
    a.buffers.push(Buffer {
        id,
        name,
        bytes,
        dtype: dtype.to_string(),
        shape,
        view_of: view.map(|(root, _)| root),
        view_offset: view.map_or(0, |(_, offset)| offset),
        first_use: None,
        last_use: None,
        kind,
        data: None,
    });
    id
}

/// `source` (the printed `kernel`) with every name the kernel declares — its
/// entry point, parameters, shared arrays, locals and loop variables —
/// replaced by `$n` in order of first appearance: equal for two groups that
/// compute the same thing on values named differently.
fn canonical_source(kernel: &Kernel, source: &str) -> String {
    fn declared(body: &[Stmt], names: &mut HashSet<String>) {
        for s in body {
            match s {
                Stmt::Let { name, .. } | Stmt::LocalArray { name, .. } => {
                    names.insert(name.clone());
                }
                Stmt::For { var, body, .. } => {
                    names.insert(var.clone());
                    declared(body, names);
                }
                Stmt::If(_, body) => declared(body, names),
                Stmt::IfElse(_, a, b) => {
                    declared(a, names);
                    declared(b, names);
                }
                _ => {}
            }
        }
    }
    let mut names: HashSet<String> = kernel.params.iter().map(|p| p.name.clone()).collect();
    names.extend(kernel.shared.iter().map(|a| a.name.clone()));
    names.insert(kernel.name.clone());
    declared(&kernel.body, &mut names);
    let mut renamed: HashMap<&str, usize> = HashMap::new();
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        let (before, from) = rest.split_at(start);
        // An identifier glued to a number (`1.0e5f`) is not a name.
        let in_number = before.ends_with(|c: char| c.is_ascii_digit() || c == '.');
        let end = from
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(from.len());
        let (word, after) = from.split_at(end);
        out.push_str(before);
        if !in_number && names.contains(word) {
            let next = renamed.len();
            out.push_str(&format!("${}", *renamed.entry(word).or_insert(next)));
        } else {
            out.push_str(word);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The elements of constant op `op`, little-endian in its result's dtype.
fn constant_bytes(g: &Graph, op: dcir_ir::OpId) -> Result<Vec<u8>, String> {
    use dcir_ir::{Attr, DType};
    /// One literal element: integers stay exact (an i64 past 2^53 too).
    #[derive(Clone, Copy)]
    enum Literal {
        Float(f64),
        Int(i64),
    }
    let d = g.op(op);
    let ty = g.ty(d.results[0]);
    let n = ty.num_elements().unwrap_or(0);
    // One value, or a list of one, is a splat (as the interpreter reads it).
    let splat = |len: usize| if len == 1 { n } else { 1 };
    let values: Vec<Literal> = match d.attrs.get("value") {
        Some(Attr::Float(x)) => vec![Literal::Float(*x); n],
        Some(Attr::Int(x)) => vec![Literal::Int(*x); n],
        Some(Attr::Floats(xs)) => xs
            .repeat(splat(xs.len()))
            .into_iter()
            .map(Literal::Float)
            .collect(),
        Some(Attr::Ints(xs)) => xs
            .repeat(splat(xs.len()))
            .into_iter()
            .map(Literal::Int)
            .collect(),
        other => return Err(format!("constant with value {other:?} has no bytes")),
    };
    if values.len() != n {
        return Err(format!(
            "constant of {n} elements has {} values",
            values.len()
        ));
    }
    Ok(values
        .iter()
        .flat_map(|&v| {
            let x = match v {
                Literal::Float(x) => x,
                Literal::Int(i) => i as f64,
            };
            match (ty.dtype, v) {
                (DType::I32, Literal::Int(i)) => (i as i32).to_le_bytes().to_vec(),
                (DType::I64, Literal::Int(i)) => i.to_le_bytes().to_vec(),
                (DType::F32, _) => (x as f32).to_le_bytes().to_vec(),
                (DType::F16, _) => half::f16::from_f64(x).to_le_bytes().to_vec(),
                (DType::BF16, _) => half::bf16::from_f64(x).to_le_bytes().to_vec(),
                (DType::I32, _) => (x as i32).to_le_bytes().to_vec(),
                (DType::I64, _) => (x as i64).to_le_bytes().to_vec(),
                (DType::Bool, _) => vec![u8::from(x != 0.0)],
            }
        })
        .collect())
}

/// The artifact entry of `kernel`, compiled when `options` ask for it.
fn kernel_entry(
    kernel: &Kernel,
    source: String,
    options: &BuildOptions,
) -> Result<KernelEntry, String> {
    let (source, ptx, cubin) = if options.compile {
        let (source, compiled) = compile_kernel(kernel, &options.arch)?;
        (source, Some(compiled.ptx), compiled.cubin)
    } else {
        (source, None, None)
    };
    Ok(KernelEntry {
        name: kernel.name.clone(),
        source,
        ptx,
        cubin,
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
                tensor_map: p.tensor_map.clone(),
            })
            .collect(),
        library: None,
        summary: kernel.summary.clone(),
        requires_arch: kernel.requires_arch.map(str::to_string),
    })
}

/// The architecture to compile `kernel` for in an artifact for `arch`: its
/// own architecture-specific target when it needs one (`sm_90a` for
/// `sm_90`), else `arch`; an error when it needs another GPU's.
pub fn kernel_arch<'a>(kernel: &'a Kernel, arch: &'a str) -> Result<&'a str, String> {
    match kernel.requires_arch {
        None => Ok(arch),
        Some(needs) if needs == arch || needs.strip_suffix('a') == Some(arch) => Ok(needs),
        Some(needs) => Err(format!(
            "kernel {} uses {needs} instructions (wgmma, TMA, setmaxnreg); the artifact targets {arch}",
            kernel.name
        )),
    }
}

/// The architecture to compile `kernels` for as one program in an artifact
/// for `arch` (`nvrtc::compile_batch`): the architecture-specific target one
/// of them needs (a superset of `arch`), else `arch`.
pub fn batch_arch<'a>(
    kernels: impl IntoIterator<Item = &'a Kernel>,
    arch: &'a str,
) -> Result<&'a str, String> {
    let mut chosen = arch;
    for k in kernels {
        let needs = kernel_arch(k, arch)?;
        if needs != arch {
            chosen = needs;
        }
    }
    Ok(chosen)
}

/// The occupancy promise to try after `promise` spilled: none → one block
/// (ptxas may then take every register a block allows), `n` → `n / 2`;
/// `None` at one block, where no promise caps registers any more.
pub fn relaxed_promise(promise: u32) -> Option<u32> {
    match promise {
        0 => Some(1),
        1 => None,
        n => Some(n / 2),
    }
}

/// Compiles `kernel` with NVRTC; while ptxas spills under its occupancy
/// promise (`min_blocks_per_sm`, a register estimate), relaxes the promise
/// ([`relaxed_promise`]) and compiles again; when it still spills with no
/// promise left, tries the reliefs in turn: a split-K epilogue on the
/// partial sums ([`crate::lower::stream_partials`]), then the loops that
/// index no register array unrolled at most [`RELIEF_UNROLL`] times
/// ([`Kernel::with_unroll_limit`]). Returns the source compiled last and
/// its output: the estimate picks occupancy, ptxas's report has the last
/// word on registers.
pub fn compile_kernel(kernel: &Kernel, arch: &str) -> Result<(String, nvrtc::Compiled), String> {
    let arch = kernel_arch(kernel, arch)?;
    let reliefs: [fn(&Kernel) -> Option<Kernel>; 2] = [crate::lower::stream_partials, |k| {
        Some(k.with_unroll_limit(RELIEF_UNROLL))
    }];
    let mut reliefs = reliefs.iter();
    let mut kernel = kernel.clone();
    loop {
        let source = print_kernel(&kernel);
        let compiled = nvrtc::compile(&source, &kernel.name, arch)?;
        let spills = compiled
            .resources
            .as_ref()
            .is_some_and(|r| r.spill_stores > 0 || r.spill_loads > 0);
        if !spills {
            return Ok((source, compiled));
        }
        if let Some(promise) = relaxed_promise(kernel.min_blocks_per_sm) {
            kernel.min_blocks_per_sm = promise;
            continue;
        }
        match reliefs.find_map(|relief| relief(&kernel)) {
            Some(relieved) => kernel = relieved,
            None => return Ok((source, compiled)),
        }
    }
}

/// The unroll factor [`compile_kernel`]'s last relief takes (a 32-step
/// k-tile of a 4×4 SIMT tile took 255 registers and spilled fully
/// unrolled, 71 at 8).
pub const RELIEF_UNROLL: u32 = 8;

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
    fn a_stored_concat_is_its_operands_views() {
        // DenseNet's block at batch 1, fused for the CUDA target: the
        // producers write into the last concat's buffer, the first concat is
        // its prefix, and no concat launches.
        let module = dcir_reader::parse_module(
            "graph @dense(%x: f32[1,2,4,4]) -> (f32[1,8,4,1]) {
  %x0 = relu %x : f32[1,2,4,4]
  %x1 = neg %x0 : f32[1,2,4,4]
  %c1 = concat %x0, %x1 {axis = 1} : f32[1,4,4,4]
  %x2 = abs %c1 : f32[1,4,4,4]
  %c2 = concat %x0, %x1, %x2 {axis = 1} : f32[1,8,4,4]
  %s = reduce_sum %c2 {axes = [3], keepdims = true} : f32[1,8,4,1]
  return %s
}",
        )
        .expect("parses");
        let g = &module.graphs[0];
        let model = dcir_fusion::CostModel::new(dcir_fusion::DeviceSpec::h200());
        let plan = dcir_fusion::plan_graph(g, &model, &crate::CudaTarget).expect("plans");
        let fused = dcir_fusion::apply_plan(g, &plan).expect("applies");
        let options = BuildOptions {
            compile: false,
            ..BuildOptions::default()
        };
        let a = build_artifact(&fused, &options).expect("builds");
        let buffer = |name: &str| {
            a.buffers
                .iter()
                .find(|b| b.name == name)
                .unwrap_or_else(|| panic!("no buffer {name}"))
        };
        let root = buffer("c2");
        assert_eq!((root.view_of, root.bytes), (None, 512));
        for (name, offset) in [("x0", 0), ("x1", 128), ("c1", 0), ("x2", 256)] {
            let b = buffer(name);
            assert_eq!(
                (b.view_of, b.view_offset),
                (Some(root.id), offset),
                "{name}"
            );
            assert_eq!(
                (b.first_use, b.last_use),
                (root.first_use, root.last_use),
                "{name} lives as long as its root"
            );
        }
        assert!(a.launches.iter().all(|l| !l.name.contains("concat")));
        assert_eq!(a.launches.len(), plan.groups.len() - 2);
        assert!(a.to_json().contains("\"view_offset\": 128"));
    }

    #[test]
    fn relaxing_a_promise_ends_at_one_block() {
        assert_eq!(relaxed_promise(0), Some(1));
        assert_eq!(relaxed_promise(5), Some(2));
        assert_eq!(relaxed_promise(2), Some(1));
        assert_eq!(relaxed_promise(1), None);
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
    fn identical_groups_share_one_kernel() {
        let a = artifact(
            "graph @g(%x: f32[64]) -> (f32[64]) {\n\
             \x20 %y = fused @g0(%x.in = %x) {kind = \"elementwise\", threads = 128} : f32[64] {\n\
             \x20   %y.r = relu %x.in : f32[64]\n\
             \x20   yield %y.r\n\
             \x20 }\n\
             \x20 %z = fused @g1(%y.in = %y) {kind = \"elementwise\", threads = 128} : f32[64] {\n\
             \x20   %z.r = relu %y.in : f32[64]\n\
             \x20   yield %z.r\n\
             \x20 }\n\
             \x20 return %z\n\
             }\n",
        );
        assert_eq!(a.kernels.len(), 1, "{:?}", a.kernels);
        assert_eq!(a.kernels[0].name, "g_g0");
        assert_eq!(a.launches.len(), 2);
        assert_eq!(a.launches[1].kernel, 0);
        assert_eq!(a.launches[1].name, "g_g1");
        assert_eq!(a.launches[1].args, vec![1, 2]);
    }

    #[test]
    fn a_top_level_constant_is_a_buffer_with_its_bytes() {
        let a = artifact(
            "graph @g(%x: i32[65]) -> (i32[65]) {\n\
             \x20 %c = constant {value = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64]} : i32[65]\n\
             \x20 %y = fused @g0(%x.in = %x, %c.in = %c) {kind = \"elementwise\", threads = 128} : i32[65] {\n\
             \x20   %y.r = add %x.in, %c.in : i32[65]\n\
             \x20   yield %y.r\n\
             \x20 }\n\
             \x20 return %y\n\
             }\n",
        );
        let c = &a.buffers[1];
        assert_eq!((c.name.as_str(), c.kind), ("c", BufferKind::Constant));
        let data = c.data.as_ref().expect("bytes");
        assert_eq!(data.len(), 65 * 4);
        assert_eq!(&data[4..8], &1i32.to_le_bytes());
        assert_eq!(a.launches[0].args, vec![0, 1, 2]);
    }

    /// A list of one value is a splat, as the interpreter reads it (found by
    /// differential testing on the GPU: `constant {value = [-128]} : i32[5,2]`
    /// failed to build); integers keep every bit.
    #[test]
    fn a_constant_of_one_listed_value_is_a_splat() {
        let a = artifact(
            "graph @g(%x: i64[5,2]) -> (i64[5,2], i64[2]) {\n\
             \x20 %c = constant {value = [-128]} : i64[5,2]\n\
             \x20 %b = constant {value = [9007199254740993, 1]} : i64[2]\n\
             \x20 %y = fused @g0(%x.in = %x, %c.in = %c) {kind = \"elementwise\", threads = 128} : i64[5,2] {\n\
             \x20   %y.r = add %x.in, %c.in : i64[5,2]\n\
             \x20   yield %y.r\n\
             \x20 }\n\
             \x20 return %y, %b\n\
             }\n",
        );
        let c = a
            .buffers
            .iter()
            .find(|b| b.name == "c")
            .expect("the constant's buffer");
        let data = c.data.as_ref().expect("bytes");
        assert_eq!(data.len(), 10 * 8);
        assert!(data.chunks(8).all(|e| e == (-128i64).to_le_bytes()));
        let b = a
            .buffers
            .iter()
            .find(|b| b.name == "b")
            .expect("the listed constant");
        let data = b.data.as_ref().expect("bytes");
        assert_eq!(&data[..8], &9_007_199_254_740_993i64.to_le_bytes());
    }

    /// A Hopper-mainloop group: its operands become tensor maps over their
    /// buffers, the kernel records `sm_90a`, and an artifact for another
    /// architecture is refused naming the kernel.
    #[test]
    fn a_wgmma_kernel_records_its_tensor_maps_and_architecture() {
        let src = "graph @mm(%x: f16[256,128], %w: f16[128,192]) -> (f16[256,192]) {
  %y = fused @g0(%x.in = %x, %w.in = %w) {kind = \"gemm\", level = \"register\", mainloop = \"wgmma\", math = \"tensor_core\", stages = 4, threads = 384, tile = [128, 128, 64]} : f16[256,192] {
    %y.r = matmul %x.in, %w.in : f16[256,192]
    yield %y.r
  }
  return %y
}";
        let a = artifact(src);
        let k = &a.kernels[0];
        assert_eq!(k.requires_arch.as_deref(), Some("sm_90a"));
        let maps: Vec<_> = k.params.iter().map(|p| p.tensor_map.clone()).collect();
        // x: K-major, one 64 × 128 box; w: N-major, 64 × 64 boxes; y a pointer.
        assert_eq!(
            maps[0]
                .as_ref()
                .map(|m| (m.dims.clone(), m.strides.clone(), m.box_dims.clone())),
            Some((vec![128, 256], vec![256], vec![64, 128]))
        );
        assert_eq!(
            maps[1]
                .as_ref()
                .map(|m| (m.dims.clone(), m.strides.clone(), m.box_dims.clone())),
            Some((vec![192, 128], vec![384], vec![64, 64]))
        );
        assert!(maps[2].is_none());
        assert!(a.validate().is_ok());
        let module = dcir_reader::parse_module(src).expect("parses");
        let for_ampere = BuildOptions {
            arch: "sm_80".into(),
            compile: true,
        };
        let err = build_artifact(&module.graphs[0], &for_ampere).unwrap_err();
        assert!(err.contains("mm_g0 uses sm_90a instructions"), "{err}");
    }

    #[test]
    fn unfused_work_is_an_error() {
        let module = dcir_reader::parse_module(
            "graph @g(%x: f32[4]) -> (f32[4]) {\n  %y = relu %x : f32[4]\n  return %y\n}\n",
        )
        .expect("parses");
        let err = build_artifact(&module.graphs[0], &BuildOptions::default()).unwrap_err();
        assert!(
            err.contains("`relu` %y is neither a fused group nor a view; fuse the graph first"),
            "{err}"
        );
        // A graph with a group and an op outside it: the planner leaves it alone.
        let module = dcir_reader::parse_module(
            "graph @g(%x: f32[4]) -> (f32[4]) {\n\
             \x20 %y = fused @g0(%x.in = %x) {kind = \"elementwise\", level = \"register\"} : f32[4] {\n\
             \x20   %r = relu %x.in : f32[4]\n\
             \x20   yield %r\n\
             \x20 }\n\
             \x20 %z = tanh %y : f32[4]\n\
             \x20 return %z\n\
             }\n",
        )
        .expect("parses");
        let source_only = BuildOptions {
            compile: false,
            ..BuildOptions::default()
        };
        let err = build_artifact(&module.graphs[0], &source_only).unwrap_err();
        assert!(
            err.contains(
                "`tanh` %z is neither a fused group nor a view; the graph is partly fused"
            ),
            "{err}"
        );
    }
}
