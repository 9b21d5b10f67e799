//! What the cost model knows about a GPU.
//!
//! Presets hold datasheet figures except where a measurement on our machines
//! exists (the H200's bandwidth and matrix rates, from
//! `shared/reference/peers-h200.md`); the runtime fills a spec from the live
//! device. Snapshots pin a preset so they do not depend on the machine.

use dcir_ir::DType;

/// A GPU as the cost model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSpec {
    /// Marketing name.
    pub name: &'static str,
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
}

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
            name: "NVIDIA H200",
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
        }
    }

    /// NVIDIA H100 SXM (datasheet; bandwidth derated to 90 %).
    pub fn h100() -> DeviceSpec {
        DeviceSpec {
            name: "NVIDIA H100",
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
            name: "NVIDIA A100",
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
            ..DeviceSpec::h200()
        }
    }

    /// NVIDIA V100 SXM2 (datasheet; bandwidth derated to 90 %), DeepCuts' first GPU.
    pub fn v100() -> DeviceSpec {
        DeviceSpec {
            name: "Tesla V100",
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
            ..DeviceSpec::h200()
        }
    }

    /// NVIDIA GeForce RTX 2080 (datasheet; bandwidth derated to 90 %), DeepCuts' second GPU.
    pub fn rtx2080() -> DeviceSpec {
        DeviceSpec {
            name: "GeForce RTX 2080",
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

    /// Names accepted by [`DeviceSpec::preset`].
    pub const PRESETS: &'static [&'static str] = &["h200", "h100", "a100", "v100", "rtx2080"];
}
