//! The kernel parameters each group kind may take, and for each candidate
//! the per-block quantities the factors of `super::pul` need.
//!
//! Enumeration order is fixed (outer loop first in each table of
//! `docs/cost-model.md`); ties in the ranking keep it.

use dcir_ir::{Attr, DType};

use super::KernelParams;
use super::shape::{Body, Depthwise, GemmShape, GroupInfo, RowLayout};
use crate::device::DeviceSpec;
use crate::target::{HOPPER_TK, HopperBlocking};

/// The memory system's access granule (an L2 sector), bytes.
const SECTOR_BYTES: f64 = 32.0;

/// Elementwise and pool block sizes.
const THREADS_FLAT: [u32; 3] = [128, 256, 512];
/// Vector widths (elements per load).
const VECTORS: [u32; 3] = [4, 2, 1];
/// Elements (or vectors) per thread.
const ITEMS: [u32; 3] = [1, 2, 4];
/// GEMM tile extents in M and N.
const TILES_MN: [u32; 4] = [32, 64, 128, 256];
/// GEMM tile extents in K.
const TILES_K: [u32; 4] = [8, 16, 32, 64];
/// Threads of a contraction block.
const THREADS_GEMM: [u32; 3] = [64, 128, 256];
/// Pipeline depths offered to the SIMT contraction mainloop. The emitter
/// double-buffers at most, so 3 and 4 run as 2 (`--emit plan` notes each
/// such kernel). Offering only 1 and 2 changed most f32 plans and ran them
/// slower (an H100, batch 1: DenseNet-121 1.44×, MnasNet 1.09×, geomean
/// 1.035× over eight models; docs/benchmarks.md, 2026-12-07): the price of
/// a two-buffer mainloop is what is off, so the deeper offers stay.
const STAGES_FMA: [u32; 4] = [1, 2, 3, 4];
/// Pipeline depths of the `mma.sync` mainloop: 2 to 4 `cp.async` stages
/// (the emitter's blocking clamps to those).
const STAGES_TENSOR_CORE: [u32; 3] = [2, 3, 4];
/// Values a reduction thread may keep in registers across passes. The
/// emitter takes up to 64, but on the H200 rows of 4096 ran 5 % (f32) and
/// 15 % (f16) faster at 32 per thread than at 64 (more resident warps), and
/// with f32 intermediates f16 rows ran 2-4 % faster at 16 than at 32 (29.3
/// against 30.0 µs; f32 tied at 52.4; docs/cost-model.md, "Parameter spaces").
/// 24 admits three 8-wide reads: ViT-B/16's f16 rows of 768 at 32 threads a
/// row ran 8 % faster than at 64 with 16 held (an H100, 2026-12-07).
const ROW_REGISTER_CACHE: f64 = 24.0;
/// Registers every thread needs besides its data (indices, addresses, loop state).
const BASE_REGISTERS: f64 = 24.0;
/// Registers a SIMT conv thread holds per im2col element it stages: the
/// value, its 64-bit address and its bounds.
const GATHERED_REGISTERS: f64 = 4.0;
/// Operand elements an FMA contraction thread stages per k-tile at most
/// (the emitter halves `tk` past it).
const MAX_STAGED: f64 = 32.0;

/// The row of a reduction that is re-read between passes lives in...
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowCache {
    /// ...each thread's registers;
    Registers,
    /// ...shared memory;
    Shared,
    /// ...nowhere: it is read again from memory.
    None,
}

/// A parameter set, compact (converted to [`KernelParams`] only for output).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum P {
    Elementwise {
        threads: u32,
        vector: u32,
        items: u32,
    },
    Reduction {
        threads_per_row: u32,
        rows_per_block: u32,
        vector: u32,
        cache: RowCache,
    },
    Pool {
        threads: u32,
        items: u32,
    },
    /// Matmul, or a conv as implicit GEMM; `split` blocks share each output
    /// tile's k loop (split-K); `wgmma`: Hopper's mainloop (TMA, `wgmma`,
    /// warp-specialized, persistent).
    Gemm {
        conv: bool,
        tile: [u32; 3],
        threads: u32,
        stages: u32,
        split: u32,
        tensor_core: bool,
        wgmma: bool,
    },
    /// Depthwise conv, direct: `tile` = output rows × columns per thread.
    Direct {
        tile: [u32; 2],
        threads: u32,
    },
    DwPw {
        tile: [u32; 2],
        tile_n: u32,
        threads: u32,
        tensor_core: bool,
    },
    Chain {
        tile: [u32; 3],
        threads: u32,
        split: u32,
        stages: u32,
        tensor_core: bool,
    },
    Attention {
        block: [u32; 2],
        threads: u32,
        stages: u32,
        tensor_core: bool,
    },
}

fn math(tc: bool) -> Attr {
    Attr::Str(if tc { "tensor_core" } else { "fma" }.into())
}

fn list<const N: usize>(v: [u32; N]) -> Attr {
    Attr::Ints(v.iter().map(|&x| x as i64).collect())
}

impl P {
    /// Whether these are parameters of Hopper's mainloop (`wgmma`).
    pub(crate) fn is_wgmma(&self) -> bool {
        matches!(self, P::Gemm { wgmma: true, .. })
    }

    /// The attributes the emitter reads.
    pub(crate) fn to_params(self) -> KernelParams {
        let int = |x: u32| Attr::Int(x as i64);
        KernelParams(match self {
            P::Elementwise {
                threads,
                vector,
                items,
            } => vec![
                ("threads", int(threads)),
                ("vector", int(vector)),
                ("items", int(items)),
            ],
            P::Reduction {
                threads_per_row,
                rows_per_block,
                vector,
                cache,
            } => vec![
                ("threads", int(threads_per_row * rows_per_block)),
                ("threads_per_row", int(threads_per_row)),
                ("rows_per_block", int(rows_per_block)),
                ("vector", int(vector)),
                (
                    "row_cache",
                    Attr::Str(
                        match cache {
                            RowCache::Registers => "registers",
                            RowCache::Shared => "shared",
                            RowCache::None => "none",
                        }
                        .into(),
                    ),
                ),
            ],
            P::Pool { threads, items } => vec![("threads", int(threads)), ("items", int(items))],
            P::Gemm {
                conv,
                tile,
                threads,
                stages,
                split,
                tensor_core,
                wgmma,
            } => {
                let mut v = Vec::new();
                if conv {
                    v.push(("algorithm", Attr::Str("implicit_gemm".into())));
                }
                v.extend([
                    ("tile", list(tile)),
                    ("threads", int(threads)),
                    ("stages", int(stages)),
                    ("math", math(tensor_core)),
                ]);
                if wgmma {
                    v.push(("mainloop", Attr::Str("wgmma".into())));
                }
                if split > 1 {
                    v.push(("split_k", int(split)));
                }
                v
            }
            P::Direct { tile, threads } => vec![
                ("algorithm", Attr::Str("direct".into())),
                ("tile", list(tile)),
                ("threads", int(threads)),
            ],
            P::DwPw {
                tile,
                tile_n,
                threads,
                tensor_core,
            } => vec![
                ("tile", list(tile)),
                ("tile_n", int(tile_n)),
                ("threads", int(threads)),
                ("math", math(tensor_core)),
            ],
            P::Chain {
                tile,
                threads,
                split,
                stages,
                tensor_core,
            } => vec![
                ("tile", list(tile)),
                ("threads", int(threads)),
                ("split_n", int(split)),
                ("stages", int(stages)),
                ("math", math(tensor_core)),
            ],
            P::Attention {
                block,
                threads,
                stages,
                tensor_core,
            } => vec![
                ("block", list(block)),
                ("threads", int(threads)),
                ("stages", int(stages)),
                ("math", math(tensor_core)),
            ],
        })
    }
}

/// The output tiles of a GEMM grid, for the model of operand re-reads
/// beyond L2 (see `docs/cost-model.md`, "DRAM traffic of contractions").
#[derive(Clone, Copy, Debug)]
pub(crate) struct Panels {
    pub grid_m: f64,
    pub grid_n: f64,
    /// Bytes of the A panel one block reads (`tile_m` rows).
    pub a_tile: f64,
    /// Bytes of the B panel one block reads (`tile_n` columns).
    pub b_tile: f64,
    /// Bytes of A and B.
    pub operands: f64,
}

impl Panels {
    /// The panels of GEMM `g` on a `grid_m × grid_n` grid of `tm × tn`
    /// tiles (`e` bytes an element), each tile's k loop split `split` ways.
    fn of(g: &GemmShape, tm: f64, tn: f64, grid: [f64; 2], split: f64, e: f64) -> Panels {
        Panels {
            grid_m: grid[0],
            grid_n: grid[1] * g.batch * split,
            a_tile: tm * g.a_row_elems * e / split,
            b_tile: tn * g.k * e / split,
            operands: g.a_bytes + g.b_bytes,
        }
    }
}

/// One candidate before scoring.
#[derive(Clone, Debug)]
pub(crate) struct Cand {
    pub params: P,
    pub blocks: f64,
    pub threads: u32,
    /// Shared memory per block, bytes.
    pub smem: f64,
    /// Registers per thread.
    pub regs: f64,
    /// Operational intensity of one block: its flops over the bytes it loads
    /// from global memory (flop/byte).
    pub oi: f64,
    /// The arithmetic rate the block's main work runs at (flop/s).
    pub rate: f64,
    /// Compute cycles per thread per round of shared-memory loads, or `None`
    /// when the kernel does not feed its arithmetic from shared memory.
    pub comp_per_load: Option<f64>,
    /// Fraction of launched lanes that hold real work (edge tiles, idle
    /// threads), in (0, 1].
    pub lane_util: f64,
    /// Flops at the matrix rate (padded to whole tiles).
    pub matrix_flops: f64,
    /// Flops at the scalar rate (prologue recomputation included).
    pub scalar_flops: f64,
    /// DRAM bytes beyond the compulsory traffic, independent of occupancy.
    pub extra_dram: f64,
    /// GEMM panels, when operand re-reads depend on the concurrent blocks.
    pub panels: Option<Panels>,
    /// True when loads and arithmetic of a block do not overlap (one stage):
    /// they serialize unless another block shares the SM.
    pub serialize: bool,
    /// Bytes of device-memory loads one thread keeps in flight, when the
    /// kernel's memory-level parallelism limits it (Little's law; see
    /// docs/cost-model.md, "Latency-bound bandwidth"); `None` elsewhere.
    pub in_flight: Option<f64>,
    /// Fraction of the time a contraction's math units are fed, given the
    /// k-steps its shared-memory pipeline keeps in flight (1 elsewhere; see
    /// docs/cost-model.md, "Pipeline depth").
    pub feed: f64,
    /// Seconds of dependent latency one block cannot hide: its k loop's
    /// round trips and split-K's reduction (docs/cost-model.md, "Latency
    /// chains"); 0 where not modelled.
    pub chain: f64,
}

fn ceil_div(a: f64, b: f64) -> f64 {
    (a / b).ceil().max(1.0)
}

/// Registers of a thread holding an `acc`-element accumulator tile with
/// double-buffered operand fragments.
fn tile_registers(acc: f64) -> f64 {
    let (rm, rn) = split(acc);
    acc + 2.0 * (rm + rn) + BASE_REGISTERS
}

/// A near-square `rm × rn = x` split, both powers of two when `x` is.
fn split(x: f64) -> (f64, f64) {
    let x = x.max(1.0);
    let rm = if x <= (1u64 << 52) as f64 && x.fract() == 0.0 && (x as u64).is_power_of_two() {
        let log = (x as u64).trailing_zeros();
        (1u64 << log.div_ceil(2)) as f64
    } else {
        2f64.powf((x.log2() / 2.0).ceil())
    };
    (rm, (x / rm).max(1.0))
}

/// Compute cycles per thread per round of shared loads for a block of
/// `threads` computing a `tm × tn` tile per k step (`k_step` = 1 for FMA,
/// 16 for tensor cores).
fn tile_comp_per_load(
    dev: &DeviceSpec,
    tm: f64,
    tn: f64,
    threads: u32,
    tc: bool,
    rate: f64,
) -> f64 {
    if tc {
        // A warp computes an area of `tm·tn/warps` per k16 step with mma;
        // it loads its A and B fragments with one ldmatrix.x4 per 16×16.
        let warps = (threads as f64 / 32.0).max(1.0);
        let area = tm * tn / warps;
        let (wm, wn) = split(area);
        let per_sched = rate / (dev.sm_count as f64 * 4.0 * dev.clock_hz);
        let cycles = area * 16.0 * 2.0 / per_sched;
        cycles / ((wm / 16.0).max(1.0) + (wn / 16.0).max(1.0))
    } else {
        // An `rm × rn` micro-tile: rm·rn FMAs per k, fragments loaded as
        // 16-byte vectors.
        let acc = tm * tn / threads as f64;
        let (rm, rn) = split(acc);
        acc / ((rm / 4.0).ceil() + (rn / 4.0).ceil())
    }
}

fn tensor_core(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// Every candidate of `info`'s kind, in enumeration order.
pub(crate) fn enumerate(dev: &DeviceSpec, info: &GroupInfo) -> Vec<Cand> {
    let mut all = Vec::new();
    for_each(dev, info, &mut |c| all.push(c));
    all
}

/// Calls `out` on every candidate of `info`'s kind, in enumeration order.
pub(crate) fn for_each(dev: &DeviceSpec, info: &GroupInfo, out: &mut dyn FnMut(Cand)) {
    let scalar = dev.scalar_rate();
    let oi_group = if info.bytes > 0 {
        info.flops as f64 / info.bytes as f64
    } else {
        f64::INFINITY
    };
    match info.body {
        Body::Elementwise { n, inner } => {
            for threads in THREADS_FLAT {
                for vector in VECTORS {
                    if inner % vector as usize != 0 {
                        continue;
                    }
                    for items in ITEMS {
                        let per_block = (threads * vector * items) as f64;
                        let blocks = ceil_div(n, per_block);
                        out(Cand {
                            params: P::Elementwise {
                                threads,
                                vector,
                                items,
                            },
                            blocks,
                            threads,
                            smem: 0.0,
                            regs: BASE_REGISTERS + 4.0 * (vector * items) as f64,
                            oi: oi_group,
                            rate: scalar,
                            comp_per_load: None,
                            lane_util: (n / (blocks * per_block)).min(1.0),
                            matrix_flops: 0.0,
                            scalar_flops: info.scalar_flops,
                            extra_dram: 0.0,
                            panels: None,
                            serialize: false,
                            // Each step a thread loads `vector` elements of
                            // every input at once: the bytes read per output
                            // element, times the vector width.
                            in_flight: Some(
                                vector as f64 * (info.bytes as f64 / n - info.elem).max(info.elem),
                            ),
                            feed: 1.0,
                            chain: 0.0,
                        });
                    }
                }
            }
        }
        Body::Reduction {
            rows,
            len,
            passes,
            input_bytes,
            layout,
        } => {
            let flops_per_elem = info.scalar_flops / (rows * len);
            // Contiguous rows: a row over one or more warps, in vectors.
            // Interleaved rows (the innermost dim kept): a thread per row,
            // the block's threads on consecutive rows. Strided rows: scalar.
            // Contiguous rows are read in vectors of
            // `vector_access_width` elements wherever that width is above 1
            // (the emitter's rule; `vector > 1` asks for it), else scalars:
            // at ViT-B/16's layernorms (f16 rows of 768) scalar reads were
            // 11-29 % slower than 8-wide ones (an H100, 2026-12-07).
            let width = crate::target::vector_access_width(info.elem as usize, len as usize);
            let contiguous: &[u32] = if width > 1 { &[4] } else { &[1] };
            let (tprs, rpbs, vectors): (&[u32], &[u32], &[u32]) = match layout {
                RowLayout::Contiguous => {
                    (&[32, 64, 128, 256, 512, 1024], &[1, 2, 4, 8], contiguous)
                }
                RowLayout::Interleaved => (&[1], &[32, 64, 128, 256], &[1]),
                RowLayout::Strided => (&[32, 64, 128, 256, 512, 1024], &[1, 2, 4, 8], &[1]),
            };
            for &tpr in tprs {
                for &rpb in rpbs {
                    if tpr * rpb > dev.max_threads_per_block {
                        continue;
                    }
                    for &vector in vectors {
                        // Elements per access, as the emitter reads them.
                        let access = if vector > 1 { width as u32 } else { 1 };
                        let lanes = (tpr * access) as f64;
                        let items = ceil_div(len, lanes);
                        let blocks = ceil_div(rows, rpb as f64);
                        let held = items * access as f64;
                        let row_bytes = rpb as f64 * len * info.elem;
                        let cache = if passes <= 1.0 || held <= ROW_REGISTER_CACHE {
                            RowCache::Registers
                        } else if row_bytes + 1024.0 <= dev.shared_per_block as f64 {
                            RowCache::Shared
                        } else {
                            RowCache::None
                        };
                        let partials = (rpb * (tpr / 32)) as f64 * 8.0;
                        let (smem, regs) = match cache {
                            RowCache::Registers if passes > 1.0 => {
                                (partials, BASE_REGISTERS + 8.0 + held)
                            }
                            RowCache::Shared => (partials + row_bytes, BASE_REGISTERS + 8.0),
                            _ => (partials, BASE_REGISTERS + 8.0 + access as f64),
                        };
                        let extra =
                            if cache == RowCache::None && input_bytes > dev.l2_bytes as f64 / 2.0 {
                                (passes - 1.0) * input_bytes
                            } else {
                                0.0
                            };
                        out(Cand {
                            params: P::Reduction {
                                threads_per_row: tpr,
                                rows_per_block: rpb,
                                vector,
                                cache,
                            },
                            blocks,
                            threads: tpr * rpb,
                            smem,
                            regs,
                            oi: oi_group,
                            rate: scalar,
                            // One exchange through shared memory per pass
                            // when a row spans several warps.
                            comp_per_load: (tpr > 32).then_some(held * flops_per_elem),
                            lane_util: (len / (items * lanes)) * (rows / (blocks * rpb as f64)),
                            matrix_flops: 0.0,
                            scalar_flops: info.scalar_flops,
                            extra_dram: extra,
                            panels: None,
                            serialize: false,
                            // The register-cached row is loaded in unrolled
                            // vectors, all in flight at once; the other paths
                            // load one element per thread at a time.
                            in_flight: Some(match cache {
                                RowCache::Registers => held * info.elem,
                                _ => info.elem,
                            }),
                            feed: 1.0,
                            chain: 0.0,
                        });
                    }
                }
            }
        }
        Body::Pool {
            outputs,
            gathered_bytes,
        } => {
            // A gathered element costs its whole sector.
            let gathered = gathered_bytes * (SECTOR_BYTES / info.elem.max(1.0) - 1.0).max(0.0);
            for threads in THREADS_FLAT {
                for items in ITEMS {
                    let per_block = (threads * items) as f64;
                    let blocks = ceil_div(outputs, per_block);
                    out(Cand {
                        params: P::Pool { threads, items },
                        blocks,
                        threads,
                        smem: 0.0,
                        regs: BASE_REGISTERS + 4.0 * items as f64,
                        oi: oi_group,
                        rate: scalar,
                        comp_per_load: None,
                        lane_util: (outputs / (blocks * per_block)).min(1.0),
                        matrix_flops: 0.0,
                        scalar_flops: info.scalar_flops,
                        extra_dram: gathered,
                        panels: None,
                        serialize: false,
                        in_flight: None,
                        feed: 1.0,
                        chain: 0.0,
                    });
                }
            }
        }
        Body::Gemm { g, conv } => {
            gemm(dev, info, &g, conv, out);
            if (!conv || g.channels_last) && tensor_core(info.dtype) && dev.compute_capability == 90
            {
                wgmma_gemm(dev, info, &g, conv, out);
            }
        }
        Body::Depthwise(dw) => direct(dev, info, &dw, out),
        Body::DwPw { dw, out: o } => dwpw(dev, info, &dw, o, out),
        Body::Chain {
            batch,
            rows,
            k1,
            n1,
            n2,
            weight_bytes,
        } => {
            // The emitter serves this family with f32 FMA in every dtype (docs/cuda.md).
            let (tc, rate) = (false, dev.scalar_rate());
            for tm in [32u32, 64, 128] {
                for tn in [32u32, 64, 128] {
                    for tk in [16u32, 32] {
                        for threads in [128u32, 256] {
                            for split in [1u32, 2, 4, 8] {
                                for stages in [1u32, 2] {
                                    let c = chain(
                                        dev,
                                        info,
                                        rate,
                                        tc,
                                        [tm, tn, tk],
                                        threads,
                                        split,
                                        stages,
                                        [batch, rows, k1, n1, n2, weight_bytes],
                                    );
                                    if let Some(c) = c {
                                        out(c);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Body::Attention {
            batch,
            m,
            nk,
            d,
            dv,
            kv_bytes,
        } => {
            // f16/bf16 whole attention also on tensor cores, where the
            // kernel reaches (`attention_tensor_core`): one warp per 16
            // query rows, scores and outputs as mma fragments.
            let kv_extra = |grid: f64| {
                if kv_bytes > dev.l2_bytes as f64 / 2.0 {
                    (grid - 1.0) * kv_bytes
                } else {
                    0.0
                }
            };
            // Keys in steps of 32 or 64, double-buffered: of the twelve
            // variants measured on ViT-B/16 (variants_attention_tc.dcir; an
            // H100, 2026-12-06), two stages were 4-12 % faster than one, and
            // steps of 128 (215-255 registers) 5-15 % slower than 64.
            for bm in [64u32, 128] {
                for bn in [32u32, 64] {
                    let stages = 2u32;
                    let threads = 2 * bm;
                    let (du, dvu) = (d as usize, dv as usize);
                    let block = [bm as usize, bn as usize];
                    if crate::target::attention_tensor_core(
                        info.dtype,
                        du,
                        dvu,
                        block,
                        threads as usize,
                    )
                    .is_err()
                    {
                        continue;
                    }
                    let (bmf, bnf) = (bm as f64, bn as f64);
                    let grid = ceil_div(m, bmf);
                    let blocks = batch * grid;
                    let rate = dev.matrix_rate(info.dtype);
                    let block_flops = 2.0 * bmf * nk * (d + dv);
                    let block_bytes = (bmf * d + nk * (d + dv) + bmf * dv) * info.elem;
                    // The last key step computes whole 16-key chunks up to
                    // N, not `bn` keys.
                    let keys = ceil_div(nk, 16.0) * 16.0;
                    let padded = blocks * bmf * keys * 2.0 * (d + dv);
                    out(Cand {
                        params: P::Attention {
                            block: [bm, bn],
                            threads,
                            stages,
                            tensor_core: true,
                        },
                        blocks,
                        threads,
                        // K and V double-buffered (where both copy
                        // asynchronously; the emitter runs one stage else).
                        smem: (bmf * (d + 8.0) + stages as f64 * bnf * (d + dv + 16.0)) * info.elem,
                        // Scores and outputs of 16 rows per warp and Q's
                        // fragments, half again for the unrolled epilogue
                        // (ptxas: 168 at [64, 64] with head dims 64).
                        regs: 1.5 * (bnf / 2.0 + dv / 2.0 + d / 4.0) + 48.0,
                        oi: block_flops / block_bytes,
                        rate,
                        comp_per_load: Some(tile_comp_per_load(dev, bmf, bnf, threads, true, rate)),
                        lane_util: (m / (grid * bmf)) * (nk / keys),
                        matrix_flops: padded,
                        scalar_flops: info.scalar_flops,
                        extra_dram: kv_extra(grid),
                        panels: None,
                        serialize: false,
                        in_flight: None,
                        feed: 1.0,
                        chain: 0.0,
                    });
                }
            }
            // Any dtype on f32 FMA.
            let (tc, rate) = (false, dev.scalar_rate());
            for bm in [64u32, 128] {
                for bn in [64u32, 128] {
                    for threads in [128u32, 256] {
                        for stages in [1u32, 2] {
                            let (bmf, bnf) = (bm as f64, bn as f64);
                            let grid = ceil_div(m, bmf);
                            let blocks = batch * grid;
                            let smem = (bmf * d + stages as f64 * bnf * (d + dv)) * info.elem;
                            let t = threads as f64;
                            let acc = bmf * dv / t + bmf * bnf / t;
                            let block_flops = 2.0 * bmf * nk * (d + dv);
                            let block_bytes = (bmf * d + nk * (d + dv) + bmf * dv) * info.elem;
                            let padded = blocks * bmf * ceil_div(nk, bnf) * bnf * 2.0 * (d + dv);
                            let extra = kv_extra(grid);
                            out(Cand {
                                params: P::Attention {
                                    block: [bm, bn],
                                    threads,
                                    stages,
                                    tensor_core: tc,
                                },
                                blocks,
                                threads,
                                smem,
                                regs: acc + BASE_REGISTERS + 8.0,
                                oi: block_flops / block_bytes,
                                rate,
                                comp_per_load: Some(tile_comp_per_load(
                                    dev, bmf, bnf, threads, tc, rate,
                                )),
                                lane_util: (m / (grid * bmf)) * (nk / (ceil_div(nk, bnf) * bnf)),
                                matrix_flops: padded,
                                scalar_flops: info.scalar_flops,
                                extra_dram: extra,
                                panels: None,
                                serialize: false,
                                in_flight: None,
                                feed: 1.0,
                                chain: 0.0,
                            });
                        }
                    }
                }
            }
        }
    }
}

fn gemm(dev: &DeviceSpec, info: &GroupInfo, g: &GemmShape, conv: bool, out: &mut dyn FnMut(Cand)) {
    let tc = tensor_core(info.dtype);
    let rate = dev.matrix_rate(info.dtype);
    let e = info.elem;
    // Prologue flops are in `scalar_flops` once; each further reuse of an
    // operand element recomputes them. A conv's input element is reused
    // K / a_row_elems times more by the im2col view.
    let dup = g.k / g.a_row_elems;
    for tm in TILES_MN {
        for tn in TILES_MN {
            for tk in TILES_K {
                if tc && tk % 16 != 0 {
                    continue;
                }
                for threads in THREADS_GEMM {
                    let (tmf, tnf, tkf) = (tm as f64, tn as f64, tk as f64);
                    let acc = tmf * tnf / threads as f64;
                    // A tensor-core conv stages its im2col elements (one
                    // register each) and its weight chunks (two elements a
                    // register) in registers between load and shared store.
                    let staging = if conv && tc {
                        (tmf * tkf + tnf * tkf / 2.0) / threads as f64
                    } else {
                        0.0
                    };
                    if acc < 1.0 || (tc && tmf * tnf / (threads as f64 / 32.0) < 256.0) {
                        continue;
                    }
                    // A SIMT conv stages its gathered im2col elements in
                    // registers, each beside its own address and bounds:
                    // past the register file such a tile spills whatever
                    // its promise (RegNet-X-32GF's 16x8 accumulators over
                    // 16 staged elements did at 255 registers).
                    let staged_a = (tmf * tkf / threads as f64).min(MAX_STAGED);
                    if !tc
                        && g.a_gathered
                        && tile_registers(acc) + GATHERED_REGISTERS * staged_a
                            > dev.max_registers_per_thread as f64
                    {
                        continue;
                    }
                    let (gm, gn, gk) = (ceil_div(g.m, tmf), ceil_div(g.n, tnf), ceil_div(g.k, tkf));
                    let tiles = g.batch * gm * gn;
                    // One k-step of the tile at the SM's full rate.
                    let kstep = 2.0 * tmf * tnf * tkf / (rate / dev.sm_count.max(1) as f64);
                    // ... and with its fixed cost on tensor cores.
                    let step = kstep + if tc { KSTEP_OVERHEAD_S } else { 0.0 };
                    let comp = tile_comp_per_load(dev, tmf, tnf, threads, tc, rate);
                    let padded = 2.0 * tiles * tmf * tnf * gk * tkf;
                    // Staging instructions, two flops each at the scalar rate.
                    let gather = if conv && tc {
                        2.0 * tiles * gk * tkf * (tmf * g.gather[0] + tnf * g.gather[1])
                    } else {
                        0.0
                    };
                    let scalar = info.scalar_flops
                        + g.prologue[0] * (gn * dup - 1.0).max(0.0)
                        + g.prologue[1] * (gm - 1.0)
                        + gather;
                    // A split divides a block's flops and bytes alike: same intensity.
                    let block_flops = 2.0 * tmf * tnf * g.k;
                    let block_bytes = (tmf * g.a_row_elems + tnf * g.k) * e;
                    for split in SPLITS {
                        // The emitter splits only into equal runs of k-tiles.
                        let sf = split as f64;
                        if split > 1
                            && (gk % sf != 0.0 || tiles * sf > SPLIT_BLOCKS * dev.sm_count as f64)
                        {
                            continue;
                        }
                        let blocks = tiles * sf;
                        // Each split writes its f32 tile; the last block reads them back.
                        let partials = if split > 1 {
                            2.0 * blocks * tmf * tnf * 4.0
                        } else {
                            0.0
                        };
                        let depths: &[u32] = if tc { &STAGES_TENSOR_CORE } else { &STAGES_FMA };
                        for &stages in depths {
                            out(Cand {
                                params: P::Gemm {
                                    conv,
                                    tile: [tm, tn, tk],
                                    threads,
                                    stages,
                                    split,
                                    tensor_core: tc,
                                    wgmma: false,
                                },
                                blocks,
                                threads,
                                smem: stages as f64 * (tmf + tnf) * tkf * e,
                                regs: tile_registers(acc) + staging,
                                oi: block_flops / block_bytes,
                                rate,
                                comp_per_load: Some(comp),
                                lane_util: (g.m / (gm * tmf)) * (g.n / (gn * tnf)),
                                matrix_flops: padded,
                                scalar_flops: scalar,
                                extra_dram: partials,
                                panels: Some(Panels::of(g, tmf, tnf, [gm, gn], sf, e)),
                                serialize: false,
                                in_flight: None,
                                feed: kstep / step,
                                chain: latency_chain(gk / sf, stages, step, split),
                            });
                        }
                    }
                }
            }
        }
    }
}

/// The Hopper mainloop's candidates for a matmul, or a convolution whose
/// operands its im2col copies read ([`GemmShape::channels_last`]), of f16
/// or bf16 on a device with `wgmma` (compute capability 9.0): 128 rows (two
/// consumer warpgroups; 64 and one where M is at most 64, and beside 128
/// where 128-row tiles leave SMs idle) × 64 (where N is at most 64), 128 or
/// 192 columns, k in 64-wide stages, as many stages as
/// fit beside the epilogue's staging tile ([`HopperBlocking`], the emitter's
/// blocking), a persistent grid that walks the work items in
/// waves (one latency chain per CTA: its producer loads ahead across
/// items), the k steps split where the tiles alone leave SMs idle. 192
/// columns ran fastest on the f16 GEMMs 4096×3072×768, 4096×768×3072 and
/// 4096×768×768 (35.0, 30.2 and 11.6 µs against 38.5, 40.5 and 14.9 at 128;
/// 256 slower still; an H100, 2026-12-06, with the staged epilogue); 64
/// columns are offered too, for problems whose 128- and 192-wide tiles
/// leave a wave part-filled, and 32 to convolutions of at most 32 output
/// channels (a 64-wide tile would multiply as many zeros).
/// Its operands come from shared memory by descriptor (no per-thread loads:
/// no shared-latency factor), its k-steps carry no fragment-pipeline
/// overhead, and its registers are the producer's and consumers' split. A
/// split writes its f32 tile and the last split reads them all back.
fn wgmma_gemm(
    dev: &DeviceSpec,
    info: &GroupInfo,
    g: &GemmShape,
    conv: bool,
    out: &mut dyn FnMut(Cand),
) {
    let rate = dev.matrix_rate(info.dtype);
    let e = info.elem;
    // A convolution's B, its KRSC filter, has k contiguous: it may take a
    // 32-column tile.
    let tns: &[u32] = match g.n {
        n if n <= 32.0 && conv => &[32],
        n if n <= 64.0 => &[64],
        _ => &[64, 128, 192],
    };
    for &tn in tns {
        // Two consumer warpgroups (128 rows); one (64) where a second would
        // have no rows, or where 128-row tiles leave SMs idle. (The blocking
        // also runs 192-row and swapped 256 × 64 tiles; they are offered
        // once measured on a GPU.)
        let idle = g.batch * ceil_div(g.m, 128.0) * ceil_div(g.n, tn as f64) < dev.sm_count as f64;
        let tms: &[u32] = match (g.m <= 64.0, idle) {
            (true, _) => &[64],
            (false, true) => &[128, 64],
            (false, false) => &[128],
        };
        for &tm in tms {
            let (tmf, tnf, tkf) = (tm as f64, tn as f64, HOPPER_TK as f64);
            // A conv's steps hold whole taps: channels short of a step's
            // are zeros, multiplied all the same.
            let (gm, gn, gk) = (ceil_div(g.m, tmf), ceil_div(g.n, tnf), g.hopper_k_steps());
            let tiles = g.batch * gm * gn;
            let kstep = 2.0 * tmf * tnf * tkf / (rate / dev.sm_count.max(1) as f64);
            let block_flops = 2.0 * tmf * tnf * gk * tkf;
            let block_bytes = (tmf * g.a_row_elems + tnf * g.k) * e;
            for split in SPLITS {
                let sf = split as f64;
                if split > 1 && (sf > gk || tiles * sf > SPLIT_BLOCKS * dev.sm_count as f64) {
                    continue;
                }
                // As many stages as fit beside the epilogue's staging tile.
                let limit = dev.shared_per_block as usize;
                let tile = [tm, tn, HOPPER_TK as u32].map(i64::from);
                let blocking = HopperBlocking::new(tile, 6, split > 1, [conv, conv], limit);
                if !blocking.fits(limit) {
                    continue;
                }
                let (stages, threads) = (blocking.stages as u32, blocking.threads() as u32);
                let units = tiles * sf;
                out(Cand {
                    params: P::Gemm {
                        conv,
                        tile: [tm, tn, HOPPER_TK as u32],
                        threads,
                        stages,
                        split,
                        tensor_core: true,
                        wgmma: true,
                    },
                    blocks: units,
                    threads,
                    smem: blocking.shared_bytes() as f64,
                    regs: blocking.launch_registers() as f64,
                    oi: block_flops / block_bytes,
                    rate,
                    comp_per_load: None,
                    lane_util: (g.m / (gm * tmf)) * (g.n / (gn * tnf)),
                    matrix_flops: 2.0 * tiles * tmf * tnf * gk * tkf,
                    scalar_flops: info.scalar_flops
                        + g.prologue[0] * (gn - 1.0).max(0.0)
                        + g.prologue[1] * (gm - 1.0),
                    extra_dram: if split > 1 {
                        2.0 * units * tmf * tnf * 4.0
                    } else {
                        0.0
                    },
                    panels: Some(Panels::of(g, tmf, tnf, [gm, gn], sf, e)),
                    serialize: false,
                    in_flight: None,
                    feed: 1.0,
                    // Persistent: a CTA's producer runs ahead across its work
                    // items, so it waits one latency chain, not one per item.
                    chain: latency_chain(gk / sf, stages, kstep, split)
                        / ceil_div(units, dev.sm_count as f64),
                });
            }
        }
    }
}

/// Split-K splits a contraction may take.
const SPLITS: [u32; 5] = [1, 2, 4, 8, 16];
/// Blocks per SM beyond which a split-K grid is not considered: splitting
/// pays only while output tiles alone leave SMs idle.
const SPLIT_BLOCKS: f64 = 2.0;

/// Time a tensor-core k-step loses to its barrier, the wait for the next
/// stage's copies and the restart of the fragment pipeline, seconds. Fitted
/// to two H200 measurements of the f16 4096³ GEMM with fully fed pipelines
/// (docs/cost-model.md, "Pipeline depth"): 128×256×32 (0.36 µs k-steps) ran
/// 1.14× slower than 128×256×64 (0.73 µs). FMA tiles are not calibrated
/// and keep no such term.
const KSTEP_OVERHEAD_S: f64 = 1.15e-7;

/// Seconds of dependent latency in one block of a contraction running
/// `steps` k-steps of `step` seconds with `stages` shared-memory buffers and
/// `split` split-K splits (docs/cost-model.md, "Latency chains"). One stage
/// waits a load round trip before every k-step and computes after it;
/// deeper pipelines wait one round trip per `stages − 1` k-steps (their
/// arithmetic is the throughput terms' business). A split block writes its
/// partial sums and counts itself in (a round trip each); the last one then
/// reads the `split` partial tiles one split after another, a round trip
/// each.
fn latency_chain(steps: f64, stages: u32, step: f64, split: u32) -> f64 {
    let latency = super::pul::LOAD_LATENCY_S;
    let k_loop = if stages <= 1 {
        steps * (latency + step)
    } else {
        latency * (1.0 + (steps - 1.0).max(0.0) / (stages - 1) as f64)
    };
    let reduction = if split > 1 {
        (2.0 + split as f64) * latency
    } else {
        0.0
    };
    k_loop + reduction
}

/// Rows × columns of the input patch one block reads for a `th × tw`
/// output tile.
fn halo(dw: &Depthwise, th: f64, tw: f64) -> f64 {
    ((th - 1.0) * dw.stride[0] + (dw.kh - 1.0) * dw.dilation[0] + 1.0)
        * ((tw - 1.0) * dw.stride[1] + (dw.kw - 1.0) * dw.dilation[1] + 1.0)
}

fn spatial_util(dw: &Depthwise, th: f64, tw: f64) -> f64 {
    (dw.oh * dw.ow) / (ceil_div(dw.oh, th) * th * ceil_div(dw.ow, tw) * tw)
}

fn direct(dev: &DeviceSpec, info: &GroupInfo, dw: &Depthwise, out: &mut dyn FnMut(Cand)) {
    let e = info.elem;
    let taps = dw.kh * dw.kw;
    // Rows per thread, 4 first: ties keep the first candidate, and 4 rows ran
    // fastest on the H200 (docs/cost-model.md, "Direct depthwise").
    // Columns per thread: one 16-byte vector (4 f32, 8 f16/bf16) where the
    // output row is a multiple of it, else the widest vector dividing it
    // (so rows stay vector-aligned), else 4.
    let widest = (16.0 / e) as u32;
    let cols: u32 = [widest, 4, 2]
        .into_iter()
        .find(|&c| c <= widest && dw.ow % c as f64 == 0.0)
        .unwrap_or(4);
    for rows in [4u32, 2, 8] {
        for threads in [128u32, 256] {
            let (r, c) = (rows as f64, cols as f64);
            let span = halo(dw, r, c);
            let span_cols = (c - 1.0) * dw.stride[1] + (dw.kw - 1.0) * dw.dilation[1] + 1.0;
            let strips = ceil_div(dw.oh, r) * ceil_div(dw.ow, c);
            let total = dw.n * dw.channels * strips;
            let blocks = ceil_div(total, threads as f64);
            let outputs = r * c;
            let thread_flops = 2.0 * outputs * taps;
            let thread_bytes = (span + taps + outputs) * e;
            out(Cand {
                params: P::Direct {
                    tile: [rows, cols],
                    threads,
                },
                blocks,
                threads,
                smem: 0.0,
                regs: BASE_REGISTERS + outputs + taps + span_cols,
                oi: thread_flops / thread_bytes,
                rate: dev.scalar_rate(),
                comp_per_load: None,
                lane_util: (total / (blocks * threads as f64)) * spatial_util(dw, r, c),
                matrix_flops: 0.0,
                scalar_flops: info.scalar_flops + info.matrix_flops,
                extra_dram: 0.0,
                panels: None,
                serialize: false,
                // Every load of the strip is unrolled and independent.
                in_flight: Some(span * e),
                feed: 1.0,
                chain: 0.0,
            });
        }
    }
}

fn dwpw(dev: &DeviceSpec, info: &GroupInfo, dw: &Depthwise, o: f64, out: &mut dyn FnMut(Cand)) {
    let e = info.elem;
    // The emitter serves this family with f32 FMA in every dtype (docs/cuda.md).
    let (tc, rate) = (false, dev.scalar_rate());
    let taps = dw.kh * dw.kw;
    let c = dw.channels;
    let dw_flops = 2.0 * dw.n * c * dw.oh * dw.ow * taps;
    for tile in [[4u32, 4], [4, 8], [8, 8], [8, 16]] {
        for tile_n in [32u32, 64, 128] {
            for threads in [128u32, 256] {
                let (th, tw, tn) = (tile[0] as f64, tile[1] as f64, tile_n as f64);
                let pixels = th * tw;
                let acc = pixels * tn / threads as f64;
                if acc < 1.0 || (tc && pixels * tn / (threads as f64 / 32.0) < 256.0) {
                    continue;
                }
                let blocks = dw.n * ceil_div(dw.oh, th) * ceil_div(dw.ow, tw);
                let patch = halo(dw, th, tw);
                let smem = (pixels * c + 8.0 * patch + 2.0 * tn * 16.0) * e;
                let block_flops = 2.0 * pixels * c * (taps + o);
                let block_bytes = (patch * c + c * taps + c * o + pixels * o) * e;
                let padded = 2.0 * blocks * pixels * c * ceil_div(o, tn) * tn;
                out(Cand {
                    params: P::DwPw {
                        tile,
                        tile_n,
                        threads,
                        tensor_core: tc,
                    },
                    blocks,
                    threads,
                    smem,
                    regs: tile_registers(acc),
                    oi: block_flops / block_bytes,
                    rate,
                    comp_per_load: Some(tile_comp_per_load(dev, pixels, tn, threads, tc, rate)),
                    lane_util: spatial_util(dw, th, tw) * o / (ceil_div(o, tn) * tn),
                    matrix_flops: padded,
                    scalar_flops: info.scalar_flops + dw_flops,
                    extra_dram: 0.0,
                    panels: None,
                    serialize: false,
                    in_flight: None,
                    feed: 1.0,
                    chain: 0.0,
                });
            }
        }
    }
}

/// One GEMM→GEMM chain candidate: a block holds `tile_m` rows of the
/// intermediate (all `n1` columns) in shared memory and computes `n2 / split`
/// output columns; with `split > 1` the first GEMM is recomputed per split.
#[allow(clippy::too_many_arguments)]
fn chain(
    dev: &DeviceSpec,
    info: &GroupInfo,
    rate: f64,
    tc: bool,
    tile: [u32; 3],
    threads: u32,
    split: u32,
    stages: u32,
    [batch, rows, k1, n1, n2, weight_bytes]: [f64; 6],
) -> Option<Cand> {
    let (tmf, tnf, tkf) = (tile[0] as f64, tile[1] as f64, tile[2] as f64);
    let sp = split as f64;
    let acc = tmf * tnf / threads as f64;
    if (tc && tmf * tnf / (threads as f64 / 32.0) < 256.0) || n2 / sp < tnf {
        return None;
    }
    let grid = ceil_div(rows, tmf);
    let blocks = batch * grid * sp;
    let cols = n2 / sp;
    // The emitter keeps the intermediate rows and the stage-2 weight tile as
    // f32 in shared memory whatever the dtype (docs/cuda.md, contraction_chain).
    let smem = ((ceil_div(n1, tkf) * tkf + tkf) * (tmf + 1.0) + tkf * (tnf + 1.0)) * 4.0;
    let block_flops = 2.0 * tmf * (k1 * n1 + n1 * cols);
    let block_bytes = (tmf * k1 + k1 * n1 + n1 * cols + tmf * cols) * info.elem;
    let n1p = ceil_div(n1, tnf) * tnf;
    let n2p = ceil_div(cols, tnf) * tnf * sp;
    let padded = batch
        * grid
        * tmf
        * 2.0
        * (sp * ceil_div(k1, tkf) * tkf * n1p + ceil_div(n1, tkf) * tkf * n2p);
    let extra = if weight_bytes > dev.l2_bytes as f64 / 2.0 {
        (grid - 1.0) * weight_bytes
    } else {
        0.0
    };
    Some(Cand {
        params: P::Chain {
            tile,
            threads,
            split,
            stages,
            tensor_core: tc,
        },
        blocks,
        threads,
        smem,
        regs: tile_registers(acc),
        oi: block_flops / block_bytes,
        rate,
        comp_per_load: Some(tile_comp_per_load(dev, tmf, tnf, threads, tc, rate)),
        lane_util: (rows / (grid * tmf)) * (n1 / n1p),
        matrix_flops: padded,
        scalar_flops: info.scalar_flops,
        extra_dram: extra,
        panels: None,
        serialize: stages == 1,
        in_flight: None,
        feed: 1.0,
        chain: 0.0,
    })
}
