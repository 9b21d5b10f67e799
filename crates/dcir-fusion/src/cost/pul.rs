//! Occupancy, the DeepCuts factors and the time estimate of one candidate.
//! Derivations: `docs/cost-model.md`.

use super::shape::GroupInfo;
use super::space::Cand;
use super::{Bound, Launch};
use crate::device::DeviceSpec;

/// Shared memory the driver reserves per resident block (sm_80 and later), bytes.
const RESERVED_SHARED_PER_BLOCK: u32 = 1024;
/// Replays per shared-memory load. The emitter pads shared tiles by one
/// 16-byte vector per row, which makes the tile loads conflict-free.
const BANK_CONFLICT: f64 = 1.0;
/// Resident warps at which an SM's throughput saturates (two per
/// scheduler): fewer leave issue slots idle while warps wait on memory.
pub const SATURATING_WARPS: u32 = 8;

/// The DeepCuts performance-upper-limit factors of one candidate, each in [0, 1].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Factors {
    /// Global-memory ratio: `min(1, OI_TB / ridge)`.
    pub gm: f64,
    /// Shared-memory ratio: how well compute between shared loads covers
    /// their latency.
    pub sm: f64,
    /// Wave (load-balance) ratio: useful fraction of the block slots the
    /// grid occupies over its waves, times the lanes with work.
    pub wb: f64,
    /// Latency ratio: the fraction of the time spent on throughput rather
    /// than waiting out the blocks' chains of dependent loads (a departure
    /// from DeepCuts; docs/cost-model.md, "Latency chains").
    pub lat: f64,
    /// 1 when the block fits the SM (threads, shared memory, registers), else 0.
    pub coef_r: f64,
}

impl Factors {
    /// The performance upper limit: the product of the factors.
    pub fn pul(&self) -> f64 {
        self.gm * self.sm * self.wb * self.lat * self.coef_r
    }
}

fn round_up(x: u32, to: u32) -> u32 {
    x.div_ceil(to) * to
}

/// Blocks of `threads` threads, `shared` bytes of shared memory and
/// `registers` registers per thread that fit on one SM at once; 0 when one
/// block does not fit at all.
pub fn blocks_per_sm(dev: &DeviceSpec, threads: u32, shared: u32, registers: u32) -> u32 {
    if threads == 0
        || threads > dev.max_threads_per_block
        || shared > dev.shared_per_block
        || registers > dev.max_registers_per_thread
    {
        return 0;
    }
    let by_threads = dev.max_threads_per_sm / threads;
    let by_shared = if shared == 0 {
        u32::MAX
    } else {
        dev.shared_per_sm / (shared + RESERVED_SHARED_PER_BLOCK)
    };
    // Registers are allocated per warp in units of 256 (8 per thread).
    let per_block = round_up(threads, dev.warp_size) * round_up(registers.max(1), 8);
    let by_registers = dev.registers_per_sm / per_block;
    by_threads
        .min(by_shared)
        .min(by_registers)
        .min(dev.max_blocks_per_sm)
}

/// Wave efficiency: the fraction of block slots the grid uses over the
/// waves it takes, `blocks / (ceil(blocks / S) · S)` with
/// `S = sm_count · blocks_per_sm`. 1 for a whole number of waves; 0 when no
/// block fits.
pub fn wave_efficiency(blocks: u64, blocks_per_sm: u32, sm_count: u32) -> f64 {
    let slots = blocks_per_sm as u64 * sm_count as u64;
    if slots == 0 {
        return 0.0;
    }
    if blocks == 0 {
        return 1.0;
    }
    let waves = blocks.div_ceil(slots);
    blocks as f64 / (waves as f64 * slots as f64)
}

/// A scored candidate.
#[derive(Clone, Debug)]
pub(crate) struct Scored {
    pub launch: Launch,
    pub factors: Factors,
    pub time: f64,
    pub bound: Bound,
    pub dram_bytes: f64,
}

/// Round-trip latency of a device-memory load under load, seconds. Fitted to
/// two H200 measurements of scalar elementwise chains with all 2048 threads
/// of every SM resident (docs/cost-model.md, "Latency-bound bandwidth"):
/// 12 B in flight per thread ran at 3.27 TB/s, 6 B at 1.65 TB/s, both
/// `132 · 2048 · bytes / 1.0 µs` within 2 %. (The unloaded round trip is
/// about 0.6 µs; queueing at full bandwidth adds the rest.)
const DRAM_LATENCY_S: f64 = 1.0e-6;

/// Latency a contraction's shared-memory pipeline must cover per k-step
/// (operand tiles come mostly from L2 under load, some from DRAM); the
/// loaded DRAM figure, conservatively.
pub(crate) const LOAD_LATENCY_S: f64 = DRAM_LATENCY_S;

fn to_u32(x: f64) -> u32 {
    x.ceil().clamp(0.0, u32::MAX as f64) as u32
}

/// Factors and time of `c`.
pub(crate) fn score(dev: &DeviceSpec, info: &GroupInfo, c: &Cand) -> Scored {
    let (shared, registers) = (to_u32(c.smem), to_u32(c.regs));
    let bps = blocks_per_sm(dev, c.threads, shared, registers);
    let blocks = c.blocks.clamp(1.0, u64::MAX as f64) as u64;
    let coef_r = if bps >= 1 { 1.0 } else { 0.0 };

    let ridge = c.rate / dev.bandwidth;
    let gm = (c.oi / ridge).min(1.0);
    // Blocks actually resident on a busy SM, and the warps of one of its four
    // schedulers: while one waits on shared memory, the others issue.
    let warps_per_block = c.threads.div_ceil(dev.warp_size).max(1);
    let sms = dev.sm_count.max(1) as f64;
    let resident = (bps as f64).min((c.blocks / sms).ceil()).max(1.0);
    let warps_per_scheduler = (resident * warps_per_block as f64 / 4.0).max(1.0);
    let sm = match c.comp_per_load {
        None => 1.0,
        Some(comp) => {
            (warps_per_scheduler * comp / (dev.shared_latency_cycles * BANK_CONFLICT)).min(1.0)
        }
    };
    // Waves counted in the blocks that saturate an SM, not in every slot
    // the occupancy allows; an SM that cannot hold that many runs at the
    // fraction it holds (docs/cost-model.md, "WBRatio").
    let saturating = SATURATING_WARPS.div_ceil(warps_per_block).max(1);
    let occupancy = (bps as f64 * warps_per_block as f64 / SATURATING_WARPS as f64).min(1.0);
    let wb = wave_efficiency(blocks, bps.min(saturating).max(1), dev.sm_count)
        * occupancy
        * c.lane_util.clamp(0.0, 1.0);

    // DRAM traffic: compulsory, plus fixed re-reads, plus GEMM panel re-reads
    // when the operands do not stay in L2.
    let mut dram = info.bytes as f64 + c.extra_dram;
    if let Some(p) = c.panels
        && p.operands > dev.l2_bytes as f64 / 2.0
    {
        let concurrent = c.blocks.min((dev.sm_count * bps.max(1)) as f64).max(1.0);
        let rows = p.grid_m.min(concurrent.sqrt().ceil());
        let cols = p.grid_n.min((concurrent / rows).ceil());
        let waves = c.blocks / concurrent;
        let reads = waves * (rows * p.a_tile + cols * p.b_tile);
        dram += (reads - p.operands).max(0.0);
    }

    let comp = (c.matrix_flops / c.rate / c.feed.max(1e-9) + c.scalar_flops / dev.scalar_rate())
        / sm.max(1e-9);
    // Little's law: bandwidth needs bytes in flight. A kernel whose resident
    // threads keep too few loads outstanding runs below the device's rate.
    let mem = match c.in_flight {
        Some(per_thread) => {
            let threads = resident * c.threads as f64 * sms;
            let reachable = threads * per_thread / DRAM_LATENCY_S;
            dram / dev.bandwidth.min(reachable.max(1.0))
        }
        None => dram / dev.bandwidth,
    };
    let throughput = if c.serialize && bps <= 1 {
        comp + mem
    } else {
        comp.max(mem)
    } / wb.max(1e-9);
    // No wave ends before its blocks' latency chains do.
    let slots = (dev.sm_count * bps.max(1)) as f64;
    let chain = (c.blocks / slots).ceil() * c.chain;
    let core = throughput.max(chain);
    let lat = if chain > 0.0 { throughput / core } else { 1.0 };
    let factors = Factors {
        gm,
        sm,
        wb,
        lat,
        coef_r,
    };
    let time = if coef_r > 0.0 {
        core + dev.launch_overhead
    } else {
        f64::INFINITY
    };
    let bound = if dev.launch_overhead >= core {
        Bound::Launch
    } else if chain > throughput {
        Bound::Latency
    } else if comp >= mem {
        Bound::Compute
    } else {
        Bound::Memory
    };
    Scored {
        launch: Launch {
            blocks,
            threads: c.threads,
            shared_bytes: shared,
            registers,
            blocks_per_sm: bps,
        },
        factors,
        time,
        bound,
        dram_bytes: dram,
    }
}
