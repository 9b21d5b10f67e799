//! Comparing an actual tensor with the expected one (the oracle's).
//!
//! Two measures, both in f64 over all elements:
//!
//! - relative L2 error `||a - e|| / ||e||` (`||a - e||` when `e` is all zeros);
//! - per-element error `|a - e|`, which must stay within
//!   `atol * max(1, rms(e)) + rtol * |e|`, where `rms(e)` is the root mean
//!   square of the expected tensor.
//!
//! The absolute part grows with the tensor's scale: a result of many
//! roundings carries errors proportional to the magnitude of the terms summed,
//! not to 1. ResNet-101's logits in f16 (rms 27) differ from the same graph in
//! f32 by up to 0.07 on the interpreter itself, which a fixed `atol` of 1e-2
//! would call a mismatch while the relative L2 error is 7e-4. A wrong element
//! (a missed tile, a bad index) is off by about the tensor's scale and still
//! fails; below a scale of 1 the bound is the plain `atol + rtol * |e|`.
//!
//! A comparison passes when the types agree, every non-finite element is
//! matched exactly (NaN where NaN is expected, an infinity of the same sign
//! where one is expected; anything else, or a non-finite element where a
//! finite one is expected, fails), the relative L2 error over the finite
//! elements is at most [`Tolerance::rel_l2`] and every finite element is
//! within its bound. An element of the runtime's poison pattern (every bit
//! set: NaN in each float dtype) is never a match, even for an expected NaN,
//! so an element no kernel wrote always fails. Defaults per dtype
//! ([`Tolerance::for_dtype`]):
//!
//! | dtype | rel_l2 | atol | rtol | why |
//! |---|---|---|---|---|
//! | f32 | 1e-5 | 1e-4 | 1e-4 | f32 epsilon 1.2e-7: allows a different summation order over thousands of terms |
//! | f16 | 2e-3 | 1e-2 | 1e-2 | epsilon 9.8e-4: a few roundings of difference per result |
//! | bf16 | 1.6e-2 | 5e-2 | 5e-2 | epsilon 7.8e-3: the same at bf16's precision |
//! | i32, i64, bool | 0 | 0 | 0 | exact |
//!
//! A float result of a graph that computes partly in f16 or bf16 (an f16
//! matmul cast to f32) carries that precision's rounding:
//! [`Tolerance::for_output_of`] takes the least precise float dtype of the
//! whole graph (regions included).
//!
//! A deep f16 network's rounding adds up past a fixed bound: EfficientNet-V2-L
//! in f16 differs from the same graph computed in f32 by a relative L2 error
//! of 2.5e-3 *on the interpreter*, over f16's 2e-3. So a checker may measure
//! the reference's own noise, the distance between the low-precision
//! reference and the graph computed in f32 ([`f32_reference`]), and widen the
//! bound to twice that ([`Tolerance::widened`]): the result under test may be
//! as far from the reference as the reference is from exact, and a wrong
//! element, off by the tensor's scale, still fails.

use std::fmt;

use dcir_ir::{DType, Graph, TensorType};

use crate::InterpError;
use crate::eval::run_graph;
use crate::tensor::{Tensor, TensorData};

/// How far an actual tensor may be from the expected one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Largest relative L2 error.
    pub rel_l2: f64,
    /// Absolute part of the per-element bound, times `max(1, rms(expected))`.
    pub atol: f64,
    /// Relative part of the per-element bound (times `|expected|`).
    pub rtol: f64,
}

impl Tolerance {
    /// Exact equality.
    pub const EXACT: Tolerance = Tolerance {
        rel_l2: 0.0,
        atol: 0.0,
        rtol: 0.0,
    };

    /// The tolerance for an output of `graph` of dtype `output`: that of the
    /// least precise float dtype among the output's and every value's of the
    /// graph (bf16, then f16); integer outputs stay exact.
    pub fn for_output_of(graph: &Graph, output: DType) -> Tolerance {
        if !output.is_float() {
            return Tolerance::EXACT;
        }
        let dtypes: Vec<DType> = graph.value_ids().map(|v| graph.ty(v).dtype).collect();
        let working = [DType::BF16, DType::F16]
            .into_iter()
            .find(|d| dtypes.contains(d))
            .unwrap_or(output);
        Tolerance::for_dtype(working)
    }

    /// This tolerance, every bound scaled by `max(1, 2 · noise / rel_l2)`,
    /// where `noise` is the relative L2 distance of the reference from the
    /// same graph computed in f32 (see the module doc); unchanged for exact
    /// tolerances.
    pub fn widened(self, noise: f64) -> Tolerance {
        if self.rel_l2 == 0.0 || !noise.is_finite() {
            return self;
        }
        let k = (2.0 * noise / self.rel_l2).max(1.0);
        Tolerance {
            rel_l2: self.rel_l2 * k,
            atol: self.atol * k,
            rtol: self.rtol * k,
        }
    }

    /// The default tolerance for results of `dtype` (table in the module doc).
    pub fn for_dtype(dtype: DType) -> Tolerance {
        let t = |rel_l2, atol, rtol| Tolerance { rel_l2, atol, rtol };
        match dtype {
            DType::F32 => t(1e-5, 1e-4, 1e-4),
            DType::F16 => t(2e-3, 1e-2, 1e-2),
            DType::BF16 => t(1.6e-2, 5e-2, 5e-2),
            DType::I32 | DType::I64 | DType::Bool => Tolerance::EXACT,
        }
    }
}

/// The measured difference of a comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    /// Relative L2 error.
    pub rel_l2: f64,
    /// Largest `|actual - expected|`.
    pub max_abs: f64,
    /// Row-major index of the element with the largest error.
    pub max_abs_index: usize,
    /// Root mean square of the expected tensor (the scale of the absolute bound).
    pub rms: f64,
}

/// Why a comparison failed.
#[derive(Clone, Debug, PartialEq)]
pub enum Mismatch {
    /// The tensors differ in dtype or shape.
    Type {
        /// The expected tensor's type.
        expected: TensorType,
        /// The actual tensor's type.
        actual: TensorType,
    },
    /// A non-finite element on either side that the other does not match
    /// (see the module doc).
    NonFinite {
        /// Row-major index of the first such element.
        index: usize,
        /// The expected value.
        expected: f64,
        /// The actual value.
        actual: f64,
        /// The actual element is the poison pattern (no kernel wrote it).
        unwritten: bool,
    },
    /// The errors exceed the tolerance.
    Tolerance {
        /// The measured errors.
        stats: Stats,
        /// The tolerance they exceed.
        tolerance: Tolerance,
        /// The element furthest outside its bound, if any is.
        worst: Option<(usize, f64, f64)>,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Type { expected, actual } => {
                write!(f, "type mismatch: expected {expected}, got {actual}")
            }
            Mismatch::NonFinite {
                index,
                expected,
                actual,
                unwritten,
            } => {
                write!(f, "element {index}: expected {expected}, got {actual}")?;
                if *unwritten {
                    write!(f, " (the poison pattern: no kernel wrote it)")?;
                }
                Ok(())
            }
            Mismatch::Tolerance {
                stats,
                tolerance,
                worst,
            } => {
                write!(
                    f,
                    "out of tolerance: rel_l2 {:.3e} (limit {:.1e}), max_abs {:.3e} at element {}",
                    stats.rel_l2, tolerance.rel_l2, stats.max_abs, stats.max_abs_index
                )?;
                if let Some((i, e, a)) = worst {
                    write!(
                        f,
                        "; element {i}: expected {e}, got {a} (bound {:.1e} * max(1, rms {:.3e}) \
                         + {:.1e} * |expected|)",
                        tolerance.atol, stats.rms, tolerance.rtol
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Mismatch {}

/// Whether each element of `t` is the runtime's poison pattern (every bit
/// set); always false for integer and bool tensors, where it is a value.
fn poisoned(t: &Tensor) -> Vec<bool> {
    match t.data() {
        TensorData::F32(v) => v.iter().map(|x| x.to_bits() == u32::MAX).collect(),
        TensorData::F16(v) => v.iter().map(|x| x.to_bits() == u16::MAX).collect(),
        TensorData::BF16(v) => v.iter().map(|x| x.to_bits() == u16::MAX).collect(),
        TensorData::I32(_) | TensorData::I64(_) | TensorData::Bool(_) => vec![false; t.len()],
    }
}

/// Whether a non-finite `expected` is matched by `actual` (NaN by NaN, an
/// infinity by itself).
fn non_finite_matches(expected: f64, actual: f64) -> bool {
    (expected.is_nan() && actual.is_nan()) || expected == actual
}

/// The outputs of `graph` computed with every f16 and bf16 value (regions
/// included) made f32, on `inputs` made f32 likewise; `None` when the graph
/// has no such value. The distance of a low-precision reference from these
/// is its own rounding noise ([`Tolerance::widened`]).
pub fn f32_reference(graph: &Graph, inputs: &[Tensor]) -> Option<Result<Vec<Tensor>, InterpError>> {
    let low = |d: DType| matches!(d, DType::F16 | DType::BF16);
    let ids: Vec<_> = graph
        .value_ids()
        .filter(|&v| low(graph.ty(v).dtype))
        .collect();
    if ids.is_empty() && !graph.result_types().iter().any(|t| low(t.dtype)) {
        return None;
    }
    let mut wide = graph.clone();
    for v in ids {
        let ty = wide.ty(v).with_dtype(DType::F32);
        wide.set_ty(v, ty);
    }
    let results = wide
        .result_types()
        .iter()
        .map(|t| {
            if low(t.dtype) {
                t.with_dtype(DType::F32)
            } else {
                t.clone()
            }
        })
        .collect();
    wide.set_result_types(results);
    let inputs: Vec<Tensor> = inputs
        .iter()
        .map(|t| match low(t.dtype()) {
            true => Tensor::from_parts(
                t.ty().with_dtype(DType::F32),
                TensorData::F32(t.to_f32().into_owned()),
            ),
            false => t.clone(),
        })
        .collect();
    Some(run_graph(&wide, &inputs))
}

/// The relative L2 distance of `b` from `a` over the elements finite in
/// both (0 when `a` is all zeros there and `b` equals it).
pub fn rel_l2(a: &Tensor, b: &Tensor) -> f64 {
    let (mut diff2, mut norm2) = (0.0, 0.0);
    for (x, y) in a.to_f64().into_iter().zip(b.to_f64()) {
        if x.is_finite() && y.is_finite() {
            diff2 += (y - x) * (y - x);
            norm2 += x * x;
        }
    }
    if norm2 > 0.0 {
        (diff2 / norm2).sqrt()
    } else {
        diff2.sqrt()
    }
}

/// Compares `actual` with `expected` under `tol` (see the module doc).
pub fn compare(expected: &Tensor, actual: &Tensor, tol: &Tolerance) -> Result<Stats, Mismatch> {
    if expected.ty() != actual.ty() {
        return Err(Mismatch::Type {
            expected: expected.ty().clone(),
            actual: actual.ty().clone(),
        });
    }
    let (mut e, mut a) = (expected.to_f64(), actual.to_f64());
    let poison = poisoned(actual);
    for (index, (&x, &y)) in e.iter().zip(&a).enumerate() {
        let matched =
            !poison[index] && ((x.is_finite() && y.is_finite()) || non_finite_matches(x, y));
        if !matched {
            return Err(Mismatch::NonFinite {
                index,
                expected: x,
                actual: y,
                unwritten: poison[index],
            });
        }
    }
    // The matched non-finite elements are equal: out of the error measures.
    for (x, y) in e.iter_mut().zip(a.iter_mut()) {
        if !x.is_finite() {
            (*x, *y) = (0.0, 0.0);
        }
    }
    let norm2: f64 = e.iter().map(|x| x * x).sum();
    let mut stats = Stats {
        rel_l2: 0.0,
        max_abs: 0.0,
        max_abs_index: 0,
        rms: (norm2 / e.len().max(1) as f64).sqrt(),
    };
    let atol = tol.atol * stats.rms.max(1.0);
    let mut diff2 = 0.0;
    // The element furthest beyond its bound: (excess, index).
    let mut worst: Option<(f64, usize)> = None;
    for (i, (&x, &y)) in e.iter().zip(&a).enumerate() {
        let d = (y - x).abs();
        diff2 += d * d;
        if d > stats.max_abs {
            stats.max_abs = d;
            stats.max_abs_index = i;
        }
        let excess = d - (atol + tol.rtol * x.abs());
        if excess > 0.0 && worst.is_none_or(|(w, _)| excess > w) {
            worst = Some((excess, i));
        }
    }
    stats.rel_l2 = if norm2 > 0.0 {
        (diff2 / norm2).sqrt()
    } else {
        diff2.sqrt()
    };
    if stats.rel_l2 > tol.rel_l2 || worst.is_some() {
        return Err(Mismatch::Tolerance {
            stats,
            tolerance: *tol,
            worst: worst.map(|(_, i)| (i, e[i], a[i])),
        });
    }
    Ok(stats)
}
