//! The memory plan: one device arena for every intermediate buffer, offsets
//! chosen so that buffers whose lifetimes overlap never share bytes.
//!
//! Lifetimes are the artifact's inclusive launch ranges `[first_use,
//! last_use]` of root buffers (views share their root's bytes). Two buffers
//! used by the same launch overlap, so a kernel never writes where it reads.
//! Placement is greedy by size (largest first, ties by id): each buffer goes
//! to the lowest 256-byte-aligned offset free of every placed buffer it
//! overlaps in time. Inputs, outputs, constants and zeroed scratch (split-K's
//! arrival counters, which must keep their zeros between launches) are not
//! planned: they are separate allocations that live across runs.

use dcir_artifact::{Artifact, BufferKind};

/// Alignment of every offset in the arena, bytes (the widest access is 16 B;
/// 256 matches the driver's allocation granularity for coalescing).
pub const ALIGN: u64 = 256;

/// Where each buffer lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of the arena holding all intermediates.
    pub arena_bytes: u64,
    /// Per buffer id: its offset in the arena (intermediates and views of
    /// them), or `None` for inputs, outputs and views of those.
    pub offsets: Vec<Option<u64>>,
    /// Bytes of all intermediates if each had its own allocation.
    pub intermediates_bytes: u64,
    /// Bytes outside the arena: inputs, outputs, constants and zeroed
    /// scratch (separate allocations).
    pub io_bytes: u64,
}

impl MemoryPlan {
    /// Device bytes the planned run holds: arena plus inputs and outputs.
    pub fn peak_bytes(&self) -> u64 {
        self.arena_bytes + self.io_bytes
    }

    /// Device bytes without a plan: every tensor its own allocation.
    pub fn unplanned_bytes(&self) -> u64 {
        self.intermediates_bytes + self.io_bytes
    }
}

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Plans the arena of `artifact`.
pub fn plan_memory(artifact: &Artifact) -> MemoryPlan {
    let root = |id: u32| artifact.buffers[id as usize].view_of.unwrap_or(id);
    let mut intermediates: Vec<u32> = artifact
        .buffers
        .iter()
        .filter(|b| b.view_of.is_none() && b.kind == BufferKind::Intermediate)
        .map(|b| b.id)
        .collect();
    // Largest first; ids break ties so the plan is deterministic.
    intermediates.sort_by_key(|&id| (std::cmp::Reverse(artifact.buffers[id as usize].bytes), id));
    let lifetime = |id: u32| {
        let b = &artifact.buffers[id as usize];
        (b.first_use.unwrap_or(0), b.last_use.unwrap_or(0))
    };
    let mut offsets: Vec<Option<u64>> = vec![None; artifact.buffers.len()];
    let mut placed: Vec<(u64, u64, u32, u32)> = Vec::new(); // (offset, end, first, last)
    let mut arena = 0u64;
    for id in intermediates {
        let size = align(artifact.buffers[id as usize].bytes.max(1));
        let (first, last) = lifetime(id);
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&(_, _, f, l)| f <= last && first <= l)
            .map(|&(o, e, _, _)| (o, e))
            .collect();
        busy.sort_unstable();
        let mut offset = 0u64;
        for (o, e) in busy {
            if offset + size <= o {
                break;
            }
            offset = offset.max(e);
        }
        placed.push((offset, offset + size, first, last));
        offsets[id as usize] = Some(offset);
        arena = arena.max(offset + size);
    }
    for b in &artifact.buffers {
        if b.view_of.is_some() {
            offsets[b.id as usize] = offsets[root(b.id) as usize];
        }
    }
    let sum = |pred: &dyn Fn(BufferKind) -> bool| {
        artifact
            .buffers
            .iter()
            .filter(|b| b.view_of.is_none() && pred(b.kind))
            .map(|b| align(b.bytes.max(1)))
            .sum()
    };
    MemoryPlan {
        arena_bytes: arena,
        offsets,
        intermediates_bytes: sum(&|k| k == BufferKind::Intermediate),
        io_bytes: sum(&|k| k != BufferKind::Intermediate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dcir_artifact::{Buffer, Launch};

    /// A chain of `n` launches, launch i reading buffer i and writing i+1,
    /// each buffer `bytes` long; buffer 0 is the input, the last the output.
    fn chain(sizes: &[u64]) -> Artifact {
        let n = sizes.len() - 1;
        let buffers = sizes
            .iter()
            .enumerate()
            .map(|(i, &bytes)| Buffer {
                id: i as u32,
                name: format!("v{i}"),
                bytes,
                dtype: "f32".into(),
                shape: vec![bytes / 4],
                view_of: None,
                view_offset: 0,
                first_use: Some(i.saturating_sub(1) as u32),
                last_use: Some(i.min(n - 1) as u32),
                data: None,
                kind: if i == 0 {
                    BufferKind::Input
                } else if i == n {
                    BufferKind::Output
                } else {
                    BufferKind::Intermediate
                },
            })
            .collect();
        Artifact {
            launches: (0..n)
                .map(|i| Launch {
                    name: format!("k{i}"),
                    kernel: 0,
                    args: vec![i as u32, i as u32 + 1],
                })
                .collect(),
            buffers,
            inputs: vec![0],
            outputs: vec![n as u32],
            ..Artifact::default()
        }
    }

    #[test]
    fn a_chain_ping_pongs_between_two_slots() {
        let a = chain(&[1024, 4096, 4096, 4096, 4096, 1024]);
        let plan = plan_memory(&a);
        // v1..v4 intermediates: v1 and v3 can share, v2 and v4 can share.
        assert_eq!(plan.arena_bytes, 8192);
        assert_eq!(plan.intermediates_bytes, 4 * 4096);
        assert_eq!(plan.offsets[1], plan.offsets[3]);
        assert_eq!(plan.offsets[2], plan.offsets[4]);
        assert_ne!(plan.offsets[1], plan.offsets[2]);
        assert_eq!(plan.offsets[0], None);
        assert!(plan.peak_bytes() < plan.unplanned_bytes());
    }

    #[test]
    fn overlapping_lifetimes_never_share_bytes() {
        let a = chain(&[100, 300, 7000, 20, 5000, 100, 100]);
        let plan = plan_memory(&a);
        for x in &a.buffers {
            for y in &a.buffers {
                let (Some(ox), Some(oy)) =
                    (plan.offsets[x.id as usize], plan.offsets[y.id as usize])
                else {
                    continue;
                };
                let live = x.first_use <= y.last_use && y.first_use <= x.last_use;
                let bytes = ox < oy + align(y.bytes) && oy < ox + align(x.bytes);
                assert!(
                    x.id == y.id || !(live && bytes),
                    "{} and {} collide",
                    x.name,
                    y.name
                );
            }
            if let Some(o) = plan.offsets[x.id as usize] {
                assert_eq!(o % ALIGN, 0);
                assert!(o + x.bytes <= plan.arena_bytes);
            }
        }
    }
}
