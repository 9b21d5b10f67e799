//! Elementwise ops: the binary arithmetic ops and the unary functions.
//!
//! Floats: operands widen to f32; `+ - * /`, `%`, `max`, `min`, `relu`,
//! `neg`, `abs`, `floor`, `ceil`, `round`, `sign` are computed in f32,
//! every other function in f64 and rounded to
//! f32; the result is then rounded to the result dtype. `max`, `min`,
//! `relu` and `clip` propagate NaN.
//!
//! Integers: computed in i64 with two's complement wrapping and wrapped to
//! the result dtype (the same as wrapping i32 arithmetic for `i32`);
//! division truncates toward zero and a zero divisor is an error; so is a
//! zero divisor of `mod`.
//!
//! Comparisons compare the operands' values (floats widened to f32 exactly,
//! so NaN compares unequal and unordered) and give bools; the logic ops and
//! `select` work on bools.

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

/// `equal`, `less`, `less_equal`, `greater`, `greater_equal`: bools.
pub(crate) fn compare(kind: OpKind, a: &Tensor, b: &Tensor, ty: &TensorType) -> Tensor {
    use OpKind::*;
    let out: Vec<bool> = if a.dtype().is_float() {
        let f: fn(f32, f32) -> bool = match kind {
            Equal => |x, y| x == y,
            Less => |x, y| x < y,
            LessEqual => |x, y| x <= y,
            Greater => |x, y| x > y,
            GreaterEqual => |x, y| x >= y,
            _ => unreachable!("{kind:?} is not a comparison"),
        };
        zip_map(&a.to_f32(), &b.to_f32(), f)
    } else {
        let f: fn(i64, i64) -> bool = match kind {
            Equal => |x, y| x == y,
            Less => |x, y| x < y,
            LessEqual => |x, y| x <= y,
            Greater => |x, y| x > y,
            GreaterEqual => |x, y| x >= y,
            _ => unreachable!("{kind:?} is not a comparison"),
        };
        zip_map(&a.data().to_i64(), &b.data().to_i64(), f)
    };
    Tensor::from_parts(ty.clone(), TensorData::Bool(out))
}

/// `and`, `or`, `xor` of two bool tensors, `not` of one.
pub(crate) fn logic(kind: OpKind, ops: &[&Tensor], ty: &TensorType) -> Tensor {
    use OpKind::*;
    let bools = |t: &Tensor| -> Vec<bool> { t.data().to_i64().iter().map(|&x| x != 0).collect() };
    let a = bools(ops[0]);
    let out = match kind {
        Not => map(&a, |x| !x),
        _ => {
            let f: fn(bool, bool) -> bool = match kind {
                And => |x, y| x && y,
                Or => |x, y| x || y,
                Xor => |x, y| x != y,
                _ => unreachable!("{kind:?} is not a logic op"),
            };
            zip_map(&a, &bools(ops[1]), f)
        }
    };
    Tensor::from_parts(ty.clone(), TensorData::Bool(out))
}

/// `is_nan` or `is_inf` of a float tensor: bools.
pub(crate) fn classify(kind: OpKind, x: &Tensor, ty: &TensorType) -> Tensor {
    let f: fn(f32) -> bool = if kind == OpKind::IsNan {
        f32::is_nan
    } else {
        f32::is_infinite
    };
    Tensor::from_parts(ty.clone(), TensorData::Bool(map(&x.to_f32(), f)))
}

/// `a` where `cond`, else `b`.
pub(crate) fn select(cond: &Tensor, a: &Tensor, b: &Tensor, ty: &TensorType) -> Tensor {
    fn choose<T: Copy>(cond: &[i64], a: &[T], b: &[T]) -> Vec<T> {
        cond.iter()
            .zip(a.iter().zip(b))
            .map(|(&c, (&x, &y))| if c != 0 { x } else { y })
            .collect()
    }
    let c = cond.data().to_i64();
    let data = match (a.data(), b.data()) {
        (TensorData::F32(x), TensorData::F32(y)) => TensorData::F32(choose(&c, x, y)),
        (TensorData::F16(x), TensorData::F16(y)) => TensorData::F16(choose(&c, x, y)),
        (TensorData::BF16(x), TensorData::BF16(y)) => TensorData::BF16(choose(&c, x, y)),
        (TensorData::I32(x), TensorData::I32(y)) => TensorData::I32(choose(&c, x, y)),
        (TensorData::I64(x), TensorData::I64(y)) => TensorData::I64(choose(&c, x, y)),
        (TensorData::Bool(x), TensorData::Bool(y)) => TensorData::Bool(choose(&c, x, y)),
        _ => unreachable!("`select` of operands of two dtypes passed the type check"),
    };
    Tensor::from_parts(ty.clone(), data)
}

/// `mod`: the remainder of `a / b`, with the sign of `b` (Python's `%`), or
/// of `a` with `fmod` (C's `fmod`, truncated division).
pub(crate) fn modulo(attrs: &Attrs, a: &Tensor, b: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let fmod = attrs.bool("fmod").unwrap_or(false);
    if ty.dtype.is_float() {
        let out = if fmod {
            zip_map(&a.to_f32(), &b.to_f32(), |x, y| x % y)
        } else {
            zip_map(&a.to_f32(), &b.to_f32(), |x, y| {
                let r = x % y;
                if r != 0.0 && (r < 0.0) != (y < 0.0) {
                    r + y
                } else {
                    r
                }
            })
        };
        return Ok(Tensor::from_parts(
            ty.clone(),
            TensorData::from_f32(ty.dtype, &out),
        ));
    }
    let (x, y) = (a.data().to_i64(), b.data().to_i64());
    if let Some(i) = y.iter().position(|&d| d == 0) {
        return Err(format!("integer remainder by zero (divisor element {i})"));
    }
    let out = if fmod {
        zip_map(&x, &y, i64::wrapping_rem)
    } else {
        zip_map(&x, &y, |x, y| {
            let r = x.wrapping_rem(y);
            if r != 0 && (r < 0) != (y < 0) {
                r.wrapping_add(y)
            } else {
                r
            }
        })
    };
    Ok(Tensor::from_parts(
        ty.clone(),
        TensorData::from_i64(ty.dtype, &out),
    ))
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
        Pow => int_pow,
        _ => unreachable!("{kind:?} is not an integer binary op"),
    };
    // The result of i32 operands computed in i64 and wrapped to 32 bits is
    // the wrapping i32 result.
    Ok(Tensor::from_parts(
        ty.clone(),
        TensorData::from_i64(ty.dtype, &zip_map(&x, &y, f)),
    ))
}

/// `a ^ b` on integers: wrapping; with `b < 0` the real result truncated
/// toward zero (`0` unless `|a| = 1`; `0` for `a = 0`). The emitter's
/// `dcir_ipow` computes the same.
fn int_pow(a: i64, b: i64) -> i64 {
    if b < 0 {
        return match a {
            1 => 1,
            -1 if b % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        };
    }
    let (mut base, mut e, mut acc) = (a, b, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
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
        Floor => map(&v, f32::floor),
        Ceil => map(&v, f32::ceil),
        Round => map(&v, f32::round_ties_even),
        // NaN and ±0 stay as they are.
        Sign => map(&v, |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        }),
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
                Sin => f64::sin,
                Cos => f64::cos,
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

/// `relu`, `neg`, `abs`, `sign`, `clip` on integers. Clip bounds round inward
/// (`ceil(min)`, `floor(max)`) and saturate at the dtype's range.
fn unary_int(kind: OpKind, attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    use OpKind::*;
    let v = x.data().to_i64();
    let out: Vec<i64> = match kind {
        Relu => map(&v, |x| x.max(0)),
        Neg => map(&v, i64::wrapping_neg),
        Abs => map(&v, i64::wrapping_abs),
        Sign => map(&v, i64::signum),
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
