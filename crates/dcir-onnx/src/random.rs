//! Seeded random values for parameters whose data the model leaves out.
//!
//! Each parameter gets its own stream, seeded from the import seed and the
//! parameter's name (FNV-1a), so values depend on neither the order nor the
//! other parameters. The distribution follows how the model first uses the
//! parameter, so a forward pass stays finite and of moderate magnitude.

use dcir_ir::{DType, TensorType};

use crate::tensor::{Data, encode};

/// How a parameter is used, which picks its distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Role {
    /// A normalization scale: uniform in [0.9, 1.1].
    Scale,
    /// A batch-norm variance: uniform in [0.5, 1.5].
    Variance,
    /// A normalization shift or running mean: uniform in [-0.1, 0.1].
    Shift,
    /// A weight with fan-in dim `axis` (all dims but the first when `None`):
    /// uniform in ±sqrt(gain / fan_in).
    Fan { axis: Option<usize>, gain: f64 },
    /// Anything else: uniform in [-0.1, 0.1] for vectors, fan-in over the
    /// trailing dims otherwise.
    Generic,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// The little-endian bytes of seeded random values for parameter `name` of type `ty`.
pub(crate) fn seeded_weight(name: &str, ty: &TensorType, role: Role, seed: u64) -> Vec<u8> {
    let n = ty.num_elements().unwrap_or(0);
    let dims = ty.dims();
    let mut rng = Rng(seed ^ fnv1a(name.as_bytes()));
    let fan = |axis: Option<usize>| -> f64 {
        let f: usize = match axis {
            Some(a) => dims.get(a).copied().unwrap_or(1),
            None => dims.iter().skip(1).product(),
        };
        f.max(1) as f64
    };
    let (center, half) = match role {
        Role::Scale => (1.0, 0.1),
        Role::Variance => (1.0, 0.5),
        Role::Shift => (0.0, 0.1),
        Role::Fan { axis, gain } => (0.0, (gain / fan(axis)).sqrt()),
        Role::Generic if dims.len() <= 1 => (0.0, 0.1),
        Role::Generic => (0.0, (3.0 / fan(None)).sqrt()),
    };
    if ty.dtype.is_float() {
        if ty.dtype == DType::F32 {
            let mut out = vec![0u8; n * 4];
            for chunk in out.chunks_exact_mut(4) {
                chunk.copy_from_slice(&((center + half * rng.unit()) as f32).to_le_bytes());
            }
            return out;
        }
        let v: Vec<f64> = (0..n).map(|_| center + half * rng.unit()).collect();
        encode(ty.dtype, &Data::F(v))
    } else {
        encode(ty.dtype, &Data::I(vec![0; n]))
    }
}
