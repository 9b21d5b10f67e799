//! Reductions, softmax, the normalizations and pooling.
//!
//! Float inputs widen to f32; sums, means, variances and the softmax
//! denominator accumulate in f64 in a fixed order (row-major over the reduced
//! elements), per-element arithmetic is in f64, and each result is rounded
//! to f32 and then to the result dtype. `reduce_max` and `maxpool2d`
//! propagate NaN. Integer sums wrap; an empty max is the dtype's minimum
//! (`-inf` for floats).

use dcir_ir::{Attrs, DType, OpKind, TensorType};
use rayon::prelude::*;

use crate::elementwise::max_nan;
use crate::eval::{KResult, bool_attr, float_attr, ints_attr, usize_attr};
use crate::layout::strided_indices;
use crate::linalg::dims4;
use crate::tensor::{Tensor, TensorData};

/// Calls `f(p, plane)` for each consecutive `len`-element plane of `out`, in parallel.
fn par_planes(out: &mut [f32], len: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if len > 0 {
        out.par_chunks_mut(len)
            .enumerate()
            .for_each(|(p, plane)| f(p, plane));
    }
}

fn float_result(ty: &TensorType, values: &[f32]) -> Tensor {
    Tensor::from_parts(ty.clone(), TensorData::from_f32(ty.dtype, values))
}

/// The smallest value of an integer dtype.
fn int_min(dtype: DType) -> i64 {
    if dtype == DType::I32 {
        i64::from(i32::MIN)
    } else {
        i64::MIN
    }
}

/// `reduce_sum`, `reduce_mean`, `reduce_max`, `reduce_prod` over `axes`.
pub(crate) fn reduce(kind: OpKind, attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let axes = ints_attr(attrs, "axes")?;
    let dims = x.dims();
    // Stride of each input dim in the output: 0 for the reduced dims.
    let mut out_strides = vec![0; dims.len()];
    let mut stride = 1;
    for d in (0..dims.len()).rev() {
        if !axes.contains(&d) {
            out_strides[d] = stride;
            stride *= dims[d];
        }
    }
    let target = strided_indices(dims, &out_strides, 0);
    let out_len = stride;
    let count: usize = axes.iter().map(|&a| dims[a]).product();
    if !ty.dtype.is_float() {
        let v = x.data().to_i64();
        let (init, f): (i64, fn(i64, i64) -> i64) = match kind {
            OpKind::ReduceMax => (int_min(ty.dtype), std::cmp::max),
            OpKind::ReduceProd => (1, i64::wrapping_mul),
            _ => (0, i64::wrapping_add),
        };
        let mut acc = vec![init; out_len];
        for (&t, &x) in target.iter().zip(v.iter()) {
            acc[t] = f(acc[t], x);
        }
        return Ok(Tensor::from_parts(
            ty.clone(),
            TensorData::from_i64(ty.dtype, &acc),
        ));
    }
    let v = x.to_f32();
    let out: Vec<f32> = if kind == OpKind::ReduceMax {
        let mut acc = vec![f32::NEG_INFINITY; out_len];
        for (&t, &x) in target.iter().zip(v.iter()) {
            acc[t] = max_nan(acc[t], x);
        }
        acc
    } else if kind == OpKind::ReduceProd {
        let mut acc = vec![1.0f64; out_len];
        for (&t, &x) in target.iter().zip(v.iter()) {
            acc[t] *= f64::from(x);
        }
        acc.iter().map(|&p| p as f32).collect()
    } else {
        let mut acc = vec![0.0f64; out_len];
        for (&t, &x) in target.iter().zip(v.iter()) {
            acc[t] += f64::from(x);
        }
        let divisor = if kind == OpKind::ReduceMean {
            count as f64
        } else {
            1.0
        };
        acc.iter().map(|&s| (s / divisor) as f32).collect()
    };
    Ok(float_result(ty, &out))
}

/// `exp(x - max) / sum(exp(x - max))` along `axis`.
pub(crate) fn softmax(attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let axis = usize_attr(attrs, "axis")?;
    let n = x.dims()[axis];
    let inner: usize = x.dims()[axis + 1..].iter().product();
    let v = x.to_f32();
    let mut out = vec![0.0f32; v.len()];
    par_planes(&mut out, n * inner, |p, o| {
        let x = &v[p * n * inner..][..n * inner];
        for j in 0..inner {
            let max = (0..n).fold(f32::NEG_INFINITY, |m, i| max_nan(m, x[i * inner + j]));
            let e = |i: usize| (f64::from(x[i * inner + j]) - f64::from(max)).exp();
            let sum: f64 = (0..n).map(e).sum();
            for i in 0..n {
                o[i * inner + j] = (e(i) / sum) as f32;
            }
        }
    });
    Ok(float_result(ty, &out))
}

/// `(x - mean) / sqrt(var + epsilon) * scale + bias` over the dims from
/// `axis` on; the variance is the population (biased) one, computed in two
/// passes.
pub(crate) fn layernorm(
    attrs: &Attrs,
    x: &Tensor,
    scale: &Tensor,
    bias: &Tensor,
    ty: &TensorType,
) -> KResult<Tensor> {
    let eps = float_attr(attrs, "epsilon")?;
    let cols = scale.len();
    let (v, scale, bias) = (x.to_f32(), scale.to_f32(), bias.to_f32());
    let mut out = vec![0.0f32; v.len()];
    par_planes(&mut out, cols, |r, o| {
        let x = &v[r * cols..][..cols];
        let mean = x.iter().map(|&a| f64::from(a)).sum::<f64>() / cols as f64;
        let var = x
            .iter()
            .map(|&a| (f64::from(a) - mean).powi(2))
            .sum::<f64>()
            / cols as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for i in 0..cols {
            let y = (f64::from(x[i]) - mean) * inv * f64::from(scale[i]) + f64::from(bias[i]);
            o[i] = y as f32;
        }
    });
    Ok(float_result(ty, &out))
}

/// Inference batchnorm over dim 1:
/// `(x - mean[c]) * (scale[c] / sqrt(var[c] + epsilon)) + bias[c]`.
pub(crate) fn batchnorm(attrs: &Attrs, ops: &[&Tensor], ty: &TensorType) -> KResult<Tensor> {
    let eps = float_attr(attrs, "epsilon")?;
    let x = ops[0];
    let channels = x.dims()[1];
    let inner: usize = x.dims()[2..].iter().product();
    let param = |i: usize| -> Vec<f64> { ops[i].to_f64() };
    let (scale, bias, mean, var) = (param(1), param(2), param(3), param(4));
    let factor: Vec<f64> = (0..channels)
        .map(|c| scale[c] / (var[c] + eps).sqrt())
        .collect();
    let v = x.to_f32();
    let mut out = vec![0.0f32; v.len()];
    par_planes(&mut out, inner, |p, o| {
        let c = p % channels;
        for (o, &a) in o.iter_mut().zip(&v[p * inner..]) {
            *o = ((f64::from(a) - mean[c]) * factor[c] + bias[c]) as f32;
        }
    });
    Ok(float_result(ty, &out))
}

/// The window geometry of a pooling op.
struct Window {
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    pad: [usize; 2],
}

impl Window {
    fn new(attrs: &Attrs) -> KResult<Window> {
        let (k, s, p, d) = (
            ints_attr(attrs, "kernel")?,
            ints_attr(attrs, "stride")?,
            ints_attr(attrs, "pad")?,
            ints_attr(attrs, "dilation")?,
        );
        Ok(Window {
            kernel: [k[0], k[1]],
            stride: [s[0], s[1]],
            dilation: [d[0], d[1]],
            pad: [p[0], p[1]],
        })
    }

    /// The input offsets (y * w + x) inside an `h × w` plane covered by the
    /// window of output pixel (oy, ox); padding positions are left out.
    fn taps(&self, oy: usize, ox: usize, h: usize, w: usize) -> impl Iterator<Item = usize> {
        let (k, s, d, p) = (self.kernel, self.stride, self.dilation, self.pad);
        (0..k[0]).flat_map(move |ki| {
            (0..k[1]).filter_map(move |kj| {
                // Positions in the padding wrap around to huge indices.
                let iy = (oy * s[0] + ki * d[0]).wrapping_sub(p[0]);
                let ix = (ox * s[1] + kj * d[1]).wrapping_sub(p[1]);
                (iy < h && ix < w).then(|| iy * w + ix)
            })
        })
    }
}

/// `maxpool2d` (padding never wins) and `avgpool2d`.
pub(crate) fn pool(kind: OpKind, attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let maxpool = kind == OpKind::Maxpool2d;
    let win = Window::new(attrs)?;
    let [_, _, h, w] = dims4(x.dims());
    let [n, c, oh, ow] = dims4(ty.dims());
    if !ty.dtype.is_float() {
        let v = x.data().to_i64();
        let mut out = Vec::with_capacity(n * c * oh * ow);
        for p in 0..n * c {
            let plane = &v[p * h * w..][..h * w];
            for oy in 0..oh {
                for ox in 0..ow {
                    let m = win.taps(oy, ox, h, w).map(|i| plane[i]).max();
                    out.push(m.unwrap_or(int_min(ty.dtype)));
                }
            }
        }
        return Ok(Tensor::from_parts(
            ty.clone(),
            TensorData::from_i64(ty.dtype, &out),
        ));
    }
    let count_pad = !maxpool && bool_attr(attrs, "count_include_pad")?;
    let full = (win.kernel[0] * win.kernel[1]) as f64;
    let v = x.to_f32();
    let mut out = vec![0.0f32; n * c * oh * ow];
    par_planes(&mut out, oh * ow, |p, o| {
        let plane = &v[p * h * w..][..h * w];
        for oy in 0..oh {
            for ox in 0..ow {
                let taps = win.taps(oy, ox, h, w).map(|i| plane[i]);
                o[oy * ow + ox] = if maxpool {
                    taps.fold(f32::NEG_INFINITY, max_nan)
                } else {
                    let (sum, count) =
                        taps.fold((0.0f64, 0usize), |(s, k), a| (s + f64::from(a), k + 1));
                    (sum / if count_pad { full } else { count as f64 }) as f32
                };
            }
        }
    });
    Ok(float_result(ty, &out))
}

/// Mean over H and W.
pub(crate) fn global_avgpool(x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let [_, _, h, w] = dims4(x.dims());
    let v = x.to_f32();
    let out: Vec<f32> = (0..ty.num_elements().unwrap_or(0))
        .map(|p| {
            let plane = &v[p * h * w..][..h * w];
            (plane.iter().map(|&a| f64::from(a)).sum::<f64>() / (h * w) as f64) as f32
        })
        .collect();
    Ok(float_result(ty, &out))
}
