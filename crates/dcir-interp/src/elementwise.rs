//! Elementwise ops: the binary arithmetic ops and the unary functions.
//!
//! Floats: operands widen to f32; `+ - * /`, `max`, `min`, `relu`, `neg`,
//! `abs` are computed in f32, every other function in f64 and rounded to
//! f32; the result is then rounded to the result dtype. `max`, `min`,
//! `relu` and `clip` propagate NaN.
//!
//! Integers: computed in i64 with two's complement wrapping and wrapped to
//! the result dtype (the same as wrapping i32 arithmetic for `i32`);
//! division truncates toward zero and a zero divisor is an error.

use dcir_ir::{Attrs, DType, OpKind, TensorType};
use rayon::prelude::*;

use crate::eval::{KResult, float_attr};
use crate::tensor::{Tensor, TensorData};

/// Elements per parallel task of the elementwise loops.
pub(crate) const CHUNK: usize = 1 << 14;

/// `f` applied to every element, in parallel, in order.
pub(crate) fn map<T: Copy + Sync, U: Send>(x: &[T], f: impl Fn(T) -> U + Sync) -> Vec<U> {
    x.par_iter().with_min_len(CHUNK).map(|&v| f(v)).collect()
}

/// `f` applied to every pair of elements, in parallel, in order.
fn zip_map<T: Copy + Sync, U: Send>(a: &[T], b: &[T], f: impl Fn(T, T) -> U + Sync) -> Vec<U> {
    a.par_iter()
        .zip(b.par_iter())
        .with_min_len(CHUNK)
        .map(|(&x, &y)| f(x, y))
        .collect()
}

/// The larger of two floats; NaN when either is NaN.
pub(crate) fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a >= b {
        a
    } else {
        b
    }
}

fn min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a <= b {
        a
    } else {
        b
    }
}

/// `add`, `sub`, `mul`, `div`, `max`, `min`, `pow` on operands of one type.
pub(crate) fn binary(kind: OpKind, a: &Tensor, b: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    use OpKind::*;
    if ty.dtype.is_float() {
        let (x, y) = (a.to_f32(), b.to_f32());
        let f: fn(f32, f32) -> f32 = match kind {
            Add => |x, y| x + y,
            Sub => |x, y| x - y,
            Mul => |x, y| x * y,
            Div => |x, y| x / y,
            Max => max_nan,
            Min => min_nan,
            Pow => |x, y| f64::from(x).powf(f64::from(y)) as f32,
            _ => unreachable!("{kind:?} is not binary"),
        };
        return Ok(Tensor::from_parts(
            ty.clone(),
            TensorData::from_f32(ty.dtype, &zip_map(&x, &y, f)),
        ));
    }
    let (x, y) = (a.data().to_i64(), b.data().to_i64());
    if kind == Div
        && let Some(i) = y.iter().position(|&d| d == 0)
    {
        return Err(format!("integer division by zero (divisor element {i})"));
    }
    let f: fn(i64, i64) -> i64 = match kind {
        Add => i64::wrapping_add,
        Sub => i64::wrapping_sub,
        Mul => i64::wrapping_mul,
        Div => i64::wrapping_div,
        Max => std::cmp::max,
        Min => std::cmp::min,
        _ => unreachable!("{kind:?} is not an integer binary op"),
    };
    // The result of i32 operands computed in i64 and wrapped to 32 bits is
    // the wrapping i32 result.
    Ok(Tensor::from_parts(
        ty.clone(),
        TensorData::from_i64(ty.dtype, &zip_map(&x, &y, f)),
    ))
}

/// The unary functions.
pub(crate) fn unary(kind: OpKind, attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    use OpKind::*;
    if !ty.dtype.is_float() {
        return unary_int(kind, attrs, x, ty);
    }
    let v = x.to_f32();
    let out: Vec<f32> = match kind {
        Relu => map(&v, |x| max_nan(x, 0.0)),
        Neg => map(&v, |x| -x),
        Abs => map(&v, f32::abs),
        Clip => {
            let (lo, hi) = (float_attr(attrs, "min")?, float_attr(attrs, "max")?);
            map(&v, |x| {
                if x.is_nan() {
                    x
                } else {
                    f64::from(x).clamp(lo, hi) as f32
                }
            })
        }
        Gelu => {
            let f: fn(f64) -> f64 = match attrs.str("approximate") {
                Some("tanh") => gelu_tanh,
                _ => gelu_erf,
            };
            map(&v, |x| f(f64::from(x)) as f32)
        }
        _ => {
            let f: fn(f64) -> f64 = match kind {
                Erf => libm::erf,
                Tanh => f64::tanh,
                Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
                Exp => f64::exp,
                Log => f64::ln,
                Sqrt => f64::sqrt,
                Rsqrt => |x| 1.0 / x.sqrt(),
                _ => unreachable!("{kind:?} is not unary"),
            };
            map(&v, |x| f(f64::from(x)) as f32)
        }
    };
    Ok(Tensor::from_parts(
        ty.clone(),
        TensorData::from_f32(ty.dtype, &out),
    ))
}

/// `x * Phi(x)` with the exact normal CDF.
fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// The tanh approximation `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
fn gelu_tanh(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
}

/// `relu`, `neg`, `abs`, `clip` on integers. Clip bounds round inward
/// (`ceil(min)`, `floor(max)`) and saturate at the dtype's range.
fn unary_int(kind: OpKind, attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    use OpKind::*;
    let v = x.data().to_i64();
    let out: Vec<i64> = match kind {
        Relu => map(&v, |x| x.max(0)),
        Neg => map(&v, i64::wrapping_neg),
        Abs => map(&v, i64::wrapping_abs),
        Clip => {
            let (type_lo, type_hi) = match ty.dtype {
                DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
                _ => (i64::MIN, i64::MAX),
            };
            let lo = (float_attr(attrs, "min")?.ceil() as i64).clamp(type_lo, type_hi);
            let hi = (float_attr(attrs, "max")?.floor() as i64).clamp(type_lo, type_hi);
            // With no integer in [min, max] every element becomes `hi`.
            map(&v, |x| x.max(lo).min(hi))
        }
        _ => {
            return Err(format!("`{}` is not defined on {}", kind.name(), x.dtype()));
        }
    };
    Ok(Tensor::from_parts(
        ty.clone(),
        TensorData::from_i64(ty.dtype, &out),
    ))
}
