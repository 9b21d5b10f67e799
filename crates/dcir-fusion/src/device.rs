//! What the cost model knows about a GPU.
//!
//! Presets hold datasheet figures except where a measurement on our machines
//! exists (the H200's bandwidth and matrix rates, from
//! `shared/reference/peers-h200.md`); the runtime fills a spec from the live
//! device ([`DeviceSpec::from_live`]). Snapshots pin a preset so they do not
//! depend on the machine.

use dcir_ir::DType;

/// What the runtime reads off a live device (driver attributes).
#[derive(Clone, Debug, PartialEq)]
pub struct LiveDevice {
    /// The device's name.
    pub name: String,
    /// Compute capability, major * 10 + minor.
    pub compute_capability: u32,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most resident threads on one SM.
    pub max_threads_per_sm: u32,
    /// Most resident blocks on one SM.
    pub max_blocks_per_sm: u32,
    /// Opt-in shared memory per block, bytes.
    pub shared_per_block: u32,
    /// Shared memory per SM, bytes.
    pub shared_per_sm: u32,
    /// Registers per SM.
    pub registers_per_sm: u32,
    /// L2 cache, bytes.
    pub l2_bytes: u64,
    /// SM clock, Hz.
    pub clock_hz: f64,
    /// Memory clock × bus width × 2 (DDR), bytes per second.
    pub theoretical_bandwidth: f64,
}

/// A GPU as the cost model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSpec {
    /// The device's name.
    pub name: String,
    /// Compute capability, major * 10 + minor (90 for Hopper).
    pub compute_capability: u32,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Threads in a warp.
    pub warp_size: u32,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most resident threads on one SM.
    pub max_threads_per_sm: u32,
    /// Most resident blocks on one SM.
    pub max_blocks_per_sm: u32,
    /// Most shared memory one block may use (opt-in maximum), bytes.
    pub shared_per_block: u32,
    /// Shared memory of one SM, bytes.
    pub shared_per_sm: u32,
    /// 32-bit registers of one SM.
    pub registers_per_sm: u32,
    /// Most registers one thread may use.
    pub max_registers_per_thread: u32,
    /// L2 cache, bytes.
    pub l2_bytes: u64,
    /// Sustained device-memory bandwidth, bytes per second (read + written).
    pub bandwidth: f64,
    /// Peak rate of plain fp32 arithmetic (no tensor cores), flop/s.
    pub fp32_rate: f64,
    /// Peak rate of f16 matrix math on tensor cores (f32 accumulation), flop/s.
    pub f16_tensor_rate: f64,
    /// Peak rate of bf16 matrix math on tensor cores, flop/s.
    pub bf16_tensor_rate: f64,
    /// SM clock, Hz (turns cycle counts into time).
    pub clock_hz: f64,
    /// Cycles for a shared-memory load to return.
    pub shared_latency_cycles: f64,
    /// Cost of one kernel launch in a CUDA graph replay, seconds.
    pub launch_overhead: f64,
    /// Fraction of its roofline time (the matrix rate or the bandwidth,
    /// whichever binds) that dcir's own tensor-core GEMM kernels
    /// (`mma.sync`) reach as they run inside a model: 1 where no data says
    /// otherwise. The cost model ranks our candidates at the full roofline
    /// (which orders them alike) and applies it where it weighs a kernel of
    /// ours against a library call and in plan totals (docs/cost-model.md,
    /// "Fitted efficiencies").
    pub mma_sync_fraction: f64,
    /// The same for those GEMM kernels where the matrix rate binds: large
    /// products reach less of it than small ones reach of the bandwidth.
    pub mma_sync_compute_fraction: f64,
    /// The same for dcir's GEMM kernels on Hopper's mainloop (`mainloop =
    /// "wgmma"`; candidates only where `compute_capability` is 90).
    pub wgmma_fraction: f64,
    /// The same for dcir's implicit-GEMM convolutions on tensor cores.
    pub mma_sync_conv_fraction: f64,
    /// The same for dcir's attention kernels on FMA (online softmax).
    pub fma_attention_fraction: f64,
    /// The same for dcir's attention kernels on tensor cores.
    pub mma_sync_attention_fraction: f64,
    /// The same for dcir's depthwise → pointwise kernels on FMA.
    pub fma_depthwise_pointwise_fraction: f64,
    /// The same for dcir's contraction chains (GEMM → GEMM, 1×1 conv → 1×1
    /// conv) on FMA.
    pub fma_chain_fraction: f64,
    /// The same for dcir's GEMM kernels on FMA (f32, no tensor cores) where
    /// the FMA rate binds.
    pub simt_gemm_compute_fraction: f64,
}

/// [`DeviceSpec::mma_sync_fraction`] on Hopper: the geomean over the 183
/// tensor-core GEMM groups of ResNet-50 (channels-last), the BERT layer and
/// ViT-B/16, f16 batch 32, with and without libraries (`run.sh library`,
/// fit.py; an H100, 2026-12-06): 0.28, range 0.13–1.1. cuBLASLt's `wgmma`
/// GEMMs reach about 1.8× that.
pub const MMA_SYNC_FRACTION_SM90: f64 = 0.28;

/// [`DeviceSpec::mma_sync_compute_fraction`] on Hopper: the geomean over the
/// 24 compute-bound tensor-core GEMM groups of ViT-B/16 f16 batch 32 (its
/// projections, 6304 rows; an H100, 2026-12-06), 0.17 (0.13–0.22), where
/// they ran 89–137 TFLOP/s and cuBLASLt's 576–619 on the same card.
pub const MMA_SYNC_COMPUTE_FRACTION_SM90: f64 = 0.17;

/// [`DeviceSpec::wgmma_fraction`] on Hopper: cuBLASLt's fitted efficiency
/// (0.49, `library.rs`) times the speed of dcir's wgmma GEMM relative to
/// cuBLASLt's on the f16 GEMMs 4096×3072×768, 4096×768×3072 and 4096×768×768
/// on their fastest tiles (128 × 192 with the staged epilogue), 0.99 (0.96,
/// 0.99 and 1.01; an H100, 2026-12-06, dcir-run --bench): the two are priced
/// on the same footing, so the planner keeps the library where it is faster
/// and the tuner decides by measurement.
pub const WGMMA_FRACTION_SM90: f64 = 0.48;

/// [`DeviceSpec::mma_sync_conv_fraction`] on Hopper: the geomean over 89
/// implicit-GEMM convolution groups of the same runs, 0.20 (0.07–0.49).
pub const MMA_SYNC_CONV_FRACTION_SM90: f64 = 0.20;

/// [`DeviceSpec::fma_attention_fraction`] on Hopper: the BERT layer's
/// attention group (f16, batch 32, same runs), 0.27.
pub const FMA_ATTENTION_FRACTION_SM90: f64 = 0.27;

/// [`DeviceSpec::mma_sync_attention_fraction`] on Hopper: the geomean over
/// twelve hand-set variants of ViT-B/16's attention (f16, batch 32, 384
/// heads of 197 tokens; `variants_attention_tc.dcir`, an H100, 2026-12-06),
/// 0.41 (0.32–0.74): 58–84 µs where the traffic alone is 13 µs.
pub const MMA_SYNC_ATTENTION_FRACTION_SM90: f64 = 0.41;

/// [`DeviceSpec::fma_depthwise_pointwise_fraction`] on Hopper: the geomean
/// over MobileNetV2's seven depthwise → pointwise groups (f16, batch 32; an
/// H100, 2026-12-06), 0.12 (0.07–0.34).
pub const FMA_DEPTHWISE_POINTWISE_FRACTION_SM90: f64 = 0.12;

/// [`DeviceSpec::fma_chain_fraction`] on Hopper: the geomean over
/// DeepLabV3-ResNet-50's three 1×1 → 1×1 chains (f16, 520×520, batch 1;
/// 65×65 pixels, 64 → 256 → 64 or 128 channels; an H100, 2026-12-06),
/// 0.23 (0.23–0.23): 101–143 µs where 23–33 µs were estimated.
pub const FMA_CHAIN_FRACTION_SM90: f64 = 0.23;

/// [`DeviceSpec::simt_gemm_compute_fraction`] on Hopper: the geomean over
/// ViT-B/16's four projections (strict f32, batch 32, 6304 rows; an H100,
/// 2026-12-06), 0.48 (0.33–0.63): 21.6–41.6 TFLOP/s, where cuBLAS reaches
/// 40.5–46.9.
pub const SIMT_GEMM_COMPUTE_FRACTION_SM90: f64 = 0.48;

impl DeviceSpec {
    /// The rate matrix math of `dtype` runs at, flop/s.
    pub fn matrix_rate(&self, dtype: DType) -> f64 {
        match dtype {
            DType::F16 => self.f16_tensor_rate,
            DType::BF16 => self.bf16_tensor_rate,
            _ => self.fp32_rate,
        }
    }

    /// The rate elementwise arithmetic runs at, flop/s (CUDA cores; f16 and
    /// bf16 are computed in f32).
    pub fn scalar_rate(&self) -> f64 {
        self.fp32_rate
    }

    /// Flop per byte at which matrix math of `dtype` stops being memory-bound.
    pub fn ridge_point(&self, dtype: DType) -> f64 {
        self.matrix_rate(dtype) / self.bandwidth
    }

    /// NVIDIA H200 SXM. Bandwidth and matrix rates measured on our machines
    /// (4.24 TB/s copy; 51.1 TFLOP/s fp32, 759.5 f16, 735.2 bf16 at 8192³).
    pub fn h200() -> DeviceSpec {
        DeviceSpec {
            name: "NVIDIA H200".to_string(),
            compute_capability: 90,
            sm_count: 132,
            warp_size: 32,
            max_threads_per_block: 1024,
            max_threads_per_sm: 2048,
            max_blocks_per_sm: 32,
            shared_per_block: 227 * 1024,
            shared_per_sm: 228 * 1024,
            registers_per_sm: 65536,
            max_registers_per_thread: 255,
            l2_bytes: 60 * 1024 * 1024,
            bandwidth: 4.24e12,
            fp32_rate: 51.1e12,
            f16_tensor_rate: 759.5e12,
            bf16_tensor_rate: 735.2e12,
            clock_hz: 1.98e9,
            shared_latency_cycles: 30.0,
            launch_overhead: 2.0e-6,
            mma_sync_fraction: MMA_SYNC_FRACTION_SM90,
            mma_sync_compute_fraction: MMA_SYNC_COMPUTE_FRACTION_SM90,
            wgmma_fraction: WGMMA_FRACTION_SM90,
            mma_sync_conv_fraction: MMA_SYNC_CONV_FRACTION_SM90,
            fma_attention_fraction: FMA_ATTENTION_FRACTION_SM90,
            mma_sync_attention_fraction: MMA_SYNC_ATTENTION_FRACTION_SM90,
            fma_depthwise_pointwise_fraction: FMA_DEPTHWISE_POINTWISE_FRACTION_SM90,
            fma_chain_fraction: FMA_CHAIN_FRACTION_SM90,
            simt_gemm_compute_fraction: SIMT_GEMM_COMPUTE_FRACTION_SM90,
        }
    }

    /// NVIDIA H100 SXM (datasheet; bandwidth derated to 90 %).
    pub fn h100() -> DeviceSpec {
        DeviceSpec {
            name: "NVIDIA H100".to_string(),
            l2_bytes: 50 * 1024 * 1024,
            bandwidth: 0.9 * 3.35e12,
            fp32_rate: 67e12,
            f16_tensor_rate: 990e12,
            bf16_tensor_rate: 990e12,
            ..DeviceSpec::h200()
        }
    }

    /// NVIDIA A100 SXM 80 GB (datasheet; bandwidth derated to 90 %).
    pub fn a100() -> DeviceSpec {
        DeviceSpec {
            name: "NVIDIA A100".to_string(),
            compute_capability: 80,
            sm_count: 108,
            shared_per_block: 163 * 1024,
            shared_per_sm: 164 * 1024,
            l2_bytes: 40 * 1024 * 1024,
            bandwidth: 0.9 * 2.039e12,
            fp32_rate: 19.5e12,
            f16_tensor_rate: 312e12,
            bf16_tensor_rate: 312e12,
            clock_hz: 1.41e9,
            shared_latency_cycles: 30.0,
            mma_sync_fraction: 1.0,
            mma_sync_compute_fraction: 1.0,
            wgmma_fraction: 1.0,
            mma_sync_conv_fraction: 1.0,
            fma_attention_fraction: 1.0,
            mma_sync_attention_fraction: 1.0,
            fma_depthwise_pointwise_fraction: 1.0,
            fma_chain_fraction: 1.0,
            simt_gemm_compute_fraction: 1.0,
            ..DeviceSpec::h200()
        }
    }

    /// NVIDIA V100 SXM2 (datasheet; bandwidth derated to 90 %), DeepCuts' first GPU.
    pub fn v100() -> DeviceSpec {
        DeviceSpec {
            name: "Tesla V100".to_string(),
            compute_capability: 70,
            sm_count: 80,
            shared_per_block: 96 * 1024,
            shared_per_sm: 96 * 1024,
            l2_bytes: 6 * 1024 * 1024,
            bandwidth: 0.9 * 900e9,
            fp32_rate: 15.7e12,
            f16_tensor_rate: 125e12,
            bf16_tensor_rate: 15.7e12,
            clock_hz: 1.53e9,
            shared_latency_cycles: 28.0,
            launch_overhead: 3.0e-6,
            mma_sync_fraction: 1.0,
            mma_sync_compute_fraction: 1.0,
            wgmma_fraction: 1.0,
            mma_sync_conv_fraction: 1.0,
            fma_attention_fraction: 1.0,
            mma_sync_attention_fraction: 1.0,
            fma_depthwise_pointwise_fraction: 1.0,
            fma_chain_fraction: 1.0,
            simt_gemm_compute_fraction: 1.0,
            ..DeviceSpec::h200()
        }
    }

    /// NVIDIA GeForce RTX 2080 (datasheet; bandwidth derated to 90 %), DeepCuts' second GPU.
    pub fn rtx2080() -> DeviceSpec {
        DeviceSpec {
            name: "GeForce RTX 2080".to_string(),
            compute_capability: 75,
            sm_count: 46,
            max_threads_per_sm: 1024,
            max_blocks_per_sm: 16,
            shared_per_block: 64 * 1024,
            shared_per_sm: 64 * 1024,
            l2_bytes: 4 * 1024 * 1024,
            bandwidth: 0.9 * 448e9,
            fp32_rate: 10.1e12,
            f16_tensor_rate: 40.3e12,
            bf16_tensor_rate: 10.1e12,
            clock_hz: 1.71e9,
            shared_latency_cycles: 28.0,
            launch_overhead: 3.0e-6,
            mma_sync_fraction: 1.0,
            mma_sync_compute_fraction: 1.0,
            wgmma_fraction: 1.0,
            mma_sync_conv_fraction: 1.0,
            fma_attention_fraction: 1.0,
            mma_sync_attention_fraction: 1.0,
            fma_depthwise_pointwise_fraction: 1.0,
            fma_chain_fraction: 1.0,
            simt_gemm_compute_fraction: 1.0,
            ..DeviceSpec::h200()
        }
    }

    /// The preset named `name` (`h200`, `h100`, `a100`, `v100`, `rtx2080`).
    pub fn preset(name: &str) -> Option<DeviceSpec> {
        match name {
            "h200" => Some(DeviceSpec::h200()),
            "h100" => Some(DeviceSpec::h100()),
            "a100" => Some(DeviceSpec::a100()),
            "v100" => Some(DeviceSpec::v100()),
            "rtx2080" => Some(DeviceSpec::rtx2080()),
            _ => None,
        }
    }

    /// A spec for the device the runtime found: limits as queried, rates
    /// scaled from the preset of the same architecture (per SM and per
    /// clock), bandwidth the theoretical figure derated to 90 %. Returns
    /// `None` for an architecture with no preset.
    pub fn from_live(live: &LiveDevice) -> Option<DeviceSpec> {
        let base = [
            DeviceSpec::h200(),
            DeviceSpec::a100(),
            DeviceSpec::rtx2080(),
            DeviceSpec::v100(),
        ]
        .into_iter()
        .find(|d| d.compute_capability == live.compute_capability)?;
        let scale = (live.sm_count as f64 * live.clock_hz) / (base.sm_count as f64 * base.clock_hz);
        Some(DeviceSpec {
            name: live.name.clone(),
            sm_count: live.sm_count,
            max_threads_per_block: live.max_threads_per_block,
            max_threads_per_sm: live.max_threads_per_sm,
            max_blocks_per_sm: live.max_blocks_per_sm,
            shared_per_block: live.shared_per_block,
            shared_per_sm: live.shared_per_sm,
            registers_per_sm: live.registers_per_sm,
            l2_bytes: live.l2_bytes,
            bandwidth: 0.9 * live.theoretical_bandwidth,
            fp32_rate: base.fp32_rate * scale,
            f16_tensor_rate: base.f16_tensor_rate * scale,
            bf16_tensor_rate: base.bf16_tensor_rate * scale,
            clock_hz: live.clock_hz,
            ..base
        })
    }

    /// Names accepted by [`DeviceSpec::preset`].
    pub const PRESETS: &'static [&'static str] = &["h200", "h100", "a100", "v100", "rtx2080"];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_h200_matches_its_preset() {
        let h200 = DeviceSpec::h200();
        let live = LiveDevice {
            name: "NVIDIA H200".to_string(),
            compute_capability: 90,
            sm_count: 132,
            max_threads_per_block: 1024,
            max_threads_per_sm: 2048,
            max_blocks_per_sm: 32,
            shared_per_block: 227 * 1024,
            shared_per_sm: 228 * 1024,
            registers_per_sm: 65536,
            l2_bytes: 60 * 1024 * 1024,
            clock_hz: h200.clock_hz,
            theoretical_bandwidth: 4.8e12,
        };
        let spec = DeviceSpec::from_live(&live).expect("Hopper has a preset");
        assert_eq!(spec.fp32_rate, h200.fp32_rate);
        assert!((spec.bandwidth - 4.32e12).abs() < 1e9);
        let half = DeviceSpec::from_live(&LiveDevice {
            sm_count: 66,
            ..live.clone()
        })
        .expect("preset");
        assert!((half.fp32_rate - h200.fp32_rate / 2.0).abs() < 1.0);
        assert!(
            DeviceSpec::from_live(&LiveDevice {
                compute_capability: 100,
                ..live
            })
            .is_none()
        );
    }
}
