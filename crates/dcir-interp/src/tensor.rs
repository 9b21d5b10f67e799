//! Tensors: a static type and the row-major elements of that type.
//!
//! The element conversions here are the interpreter's single definition of
//! how one dtype becomes another (the `cast` op, constants, pad values and
//! the rounding of every float result go through them):
//!
//! - float → float: round to nearest, ties to even; overflow gives ±inf.
//! - float → int: truncate toward zero and saturate at the type's range;
//!   NaN gives 0 (Rust's `as`, CUDA's `cvt.rzi.sat`).
//! - int → float: round to nearest even (exact below 2^24 for f32).
//! - int → int: keep the low bits (two's complement wrap, like C and NumPy).
//! - anything → bool: `x != 0` (NaN is true); bool → number: 0 or 1.
//!
//! A precision change of a whole model (the `to-f16` and `to-bf16` passes,
//! weights converted on load) saturates instead ([`saturate_to`]), as ONNX's
//! float16 converters do with initializers.

use std::borrow::Cow;

use dcir_ir::{DType, TensorType};
use half::{bf16, f16};

use crate::InterpError;

/// The elements of a tensor, one vector per dtype, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f16` elements.
    F16(Vec<f16>),
    /// `bf16` elements.
    BF16(Vec<bf16>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `bool` elements.
    Bool(Vec<bool>),
}

/// Applies `$body` to the vector of any variant and wraps the result in the
/// same variant (the vector's element type is generic in `$body`).
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            TensorData::F32($v) => TensorData::F32($body),
            TensorData::F16($v) => TensorData::F16($body),
            TensorData::BF16($v) => TensorData::BF16($body),
            TensorData::I32($v) => TensorData::I32($body),
            TensorData::I64($v) => TensorData::I64($body),
            TensorData::Bool($v) => TensorData::Bool($body),
        }
    };
}

impl TensorData {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::I32(_) => DType::I32,
            TensorData::I64(_) => DType::I64,
            TensorData::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::Bool(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements at `indices`, in that order (every index must be < len).
    pub(crate) fn take(&self, indices: &[usize]) -> TensorData {
        map_data!(self, v => indices.iter().map(|&i| v[i]).collect())
    }

    /// These elements followed by `other`'s, which must be of the same dtype.
    pub(crate) fn append(&self, other: &TensorData) -> TensorData {
        fn join<T: Copy>(a: &[T], b: &[T]) -> Vec<T> {
            [a, b].concat()
        }
        match (self, other) {
            (TensorData::F32(a), TensorData::F32(b)) => TensorData::F32(join(a, b)),
            (TensorData::F16(a), TensorData::F16(b)) => TensorData::F16(join(a, b)),
            (TensorData::BF16(a), TensorData::BF16(b)) => TensorData::BF16(join(a, b)),
            (TensorData::I32(a), TensorData::I32(b)) => TensorData::I32(join(a, b)),
            (TensorData::I64(a), TensorData::I64(b)) => TensorData::I64(join(a, b)),
            (TensorData::Bool(a), TensorData::Bool(b)) => TensorData::Bool(join(a, b)),
            (a, b) => unreachable!("append of {} to {}", b.dtype(), a.dtype()),
        }
    }

    /// The elements as f32 (borrowed for `f32`, converted for the others).
    pub fn to_f32(&self) -> Cow<'_, [f32]> {
        match self {
            TensorData::F32(v) => Cow::Borrowed(v),
            TensorData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| f32::from(u8::from(x))).collect(),
        }
    }

    /// The elements as f64: exact for every dtype but `i64` beyond 2^53.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            TensorData::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            TensorData::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            TensorData::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            TensorData::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
        }
    }

    /// The elements as i64 (floats truncate toward zero and saturate).
    pub fn to_i64(&self) -> Cow<'_, [i64]> {
        match self {
            TensorData::I64(v) => Cow::Borrowed(v),
            TensorData::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            TensorData::Bool(v) => v.iter().map(|&x| i64::from(x)).collect(),
            float => float.to_f32().iter().map(|&x| x as i64).collect(),
        }
    }

    /// f32 values converted to `dtype` by the rules of the module doc.
    pub fn from_f32(dtype: DType, values: &[f32]) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(values.to_vec()),
            DType::F16 => TensorData::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::BF16 => TensorData::BF16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::I32 => TensorData::I32(values.iter().map(|&x| x as i32).collect()),
            DType::I64 => TensorData::I64(values.iter().map(|&x| x as i64).collect()),
            DType::Bool => TensorData::Bool(values.iter().map(|&x| x != 0.0).collect()),
        }
    }

    /// i64 values converted to `dtype` by the rules of the module doc.
    pub fn from_i64(dtype: DType, values: &[i64]) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(values.iter().map(|&x| x as f32).collect()),
            // |x| >= 2^24 overflows f16 anyway, so rounding through f32 is exact.
            DType::F16 => {
                TensorData::F16(values.iter().map(|&x| f16::from_f32(x as f32)).collect())
            }
            // Through f64 (exact below 2^53), then one rounding.
            DType::BF16 => {
                TensorData::BF16(values.iter().map(|&x| bf16::from_f64(x as f64)).collect())
            }
            DType::I32 => TensorData::I32(values.iter().map(|&x| x as i32).collect()),
            DType::I64 => TensorData::I64(values.to_vec()),
            DType::Bool => TensorData::Bool(values.iter().map(|&x| x != 0).collect()),
        }
    }

    /// f64 values (attribute literals) converted to `dtype` with one rounding.
    pub fn from_f64(dtype: DType, values: &[f64]) -> TensorData {
        match dtype {
            DType::F32 => TensorData::F32(values.iter().map(|&x| x as f32).collect()),
            DType::F16 => TensorData::F16(values.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => TensorData::BF16(values.iter().map(|&x| bf16::from_f64(x)).collect()),
            DType::I32 => TensorData::I32(values.iter().map(|&x| x as i32).collect()),
            DType::I64 => TensorData::I64(values.iter().map(|&x| x as i64).collect()),
            DType::Bool => TensorData::Bool(values.iter().map(|&x| x != 0.0).collect()),
        }
    }

    /// The elements converted to `dtype` (the `cast` op).
    pub fn cast(&self, dtype: DType) -> TensorData {
        if self.dtype() == dtype {
            return self.clone();
        }
        match self {
            TensorData::I32(_) | TensorData::I64(_) | TensorData::Bool(_) => {
                TensorData::from_i64(dtype, &self.to_i64())
            }
            // f16 and bf16 widen to f32 exactly.
            float => TensorData::from_f32(dtype, &float.to_f32()),
        }
    }
}

/// `x` saturated into the normal range of the half type `dtype` (f16 or
/// bf16; any other dtype leaves it): a nonzero magnitude below the smallest
/// normal becomes that normal, a finite magnitude above the largest finite
/// becomes that; zeros, infinities and NaN stay. A model made half precision
/// keeps `clip(x, min = 1e-12)` away from 0 and its large weights finite.
pub fn saturate_to(dtype: DType, x: f64) -> f64 {
    let (min_normal, max) = match dtype {
        DType::F16 => (6.103_515_625e-5, 65504.0),
        DType::BF16 => (1.175_494_350_822_287_5e-38, 3.389_531_389_251_535_5e38),
        _ => return x,
    };
    let magnitude = x.abs();
    if magnitude > 0.0 && magnitude < min_normal {
        min_normal.copysign(x)
    } else if magnitude.is_finite() && magnitude > max {
        max.copysign(x)
    } else {
        x
    }
}

impl TensorData {
    /// The float elements as `dtype` (a float dtype) with a precision
    /// change's saturation ([`saturate_to`]), then rounded to nearest.
    pub fn narrowed(&self, dtype: DType) -> TensorData {
        let values: Vec<f64> = self
            .to_f32()
            .iter()
            .map(|&x| saturate_to(dtype, f64::from(x)))
            .collect();
        TensorData::from_f64(dtype, &values)
    }
}

/// A tensor: its static type and its elements. The element count and dtype
/// always agree with the type.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    ty: TensorType,
    data: TensorData,
}

impl Tensor {
    /// A tensor of type `ty` holding `data`; an error when the dtype or the
    /// element count differs from the type's.
    pub fn new(ty: TensorType, data: TensorData) -> Result<Tensor, InterpError> {
        if data.dtype() != ty.dtype || Some(data.len()) != ty.num_elements() {
            return Err(InterpError::Data(format!(
                "{} elements of {} do not make a tensor of type {ty}",
                data.len(),
                data.dtype()
            )));
        }
        Ok(Tensor { ty, data })
    }

    /// A tensor from values already known to fit `ty` (the kernels' results).
    pub(crate) fn from_parts(ty: TensorType, data: TensorData) -> Tensor {
        debug_assert_eq!(data.dtype(), ty.dtype);
        debug_assert_eq!(Some(data.len()), ty.num_elements());
        Tensor { ty, data }
    }

    /// A tensor of type `ty` from f32 values, each rounded (or converted)
    /// to the dtype; an error when the count differs from the type's.
    pub fn from_f32(ty: TensorType, values: &[f32]) -> Result<Tensor, InterpError> {
        Tensor::new(ty.clone(), TensorData::from_f32(ty.dtype, values))
    }

    /// A tensor of type `ty` from f64 values with one rounding to the dtype.
    pub fn from_f64(ty: TensorType, values: &[f64]) -> Result<Tensor, InterpError> {
        Tensor::new(ty.clone(), TensorData::from_f64(ty.dtype, values))
    }

    /// A tensor of type `ty` from i64 values converted to the dtype.
    pub fn from_i64(ty: TensorType, values: &[i64]) -> Result<Tensor, InterpError> {
        Tensor::new(ty.clone(), TensorData::from_i64(ty.dtype, values))
    }

    /// The type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The extents, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.ty.dims()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The elements.
    pub fn data(&self) -> &TensorData {
        &self.data
    }

    /// The elements, moved out.
    pub fn into_data(self) -> TensorData {
        self.data
    }

    /// The elements as f32 (borrowed for `f32` tensors).
    pub fn to_f32(&self) -> Cow<'_, [f32]> {
        self.data.to_f32()
    }

    /// The elements as f64.
    pub fn to_f64(&self) -> Vec<f64> {
        self.data.to_f64()
    }

    /// Mean, largest magnitude and sum of the elements, computed in f64.
    pub fn summary(&self) -> Summary {
        let values = self.to_f64();
        let checksum: f64 = values.iter().sum();
        let abs_max = values.iter().fold(0.0_f64, |m, x| {
            if x.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(x.abs())
            }
        });
        Summary {
            mean: checksum / values.len().max(1) as f64,
            abs_max,
            checksum,
        }
    }
}

/// What `dcir-run` prints per output: statistics of a tensor's elements in f64.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Arithmetic mean (0 for an empty tensor).
    pub mean: f64,
    /// Largest absolute value (NaN when any element is NaN).
    pub abs_max: f64,
    /// Sum of the elements, in row-major order.
    pub checksum: f64,
}
