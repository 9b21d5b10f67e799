//! `matmul` and `conv2d` on the shared GEMM core ([`crate::gemm`]).
//!
//! Float operands widen to f32, every dot product accumulates in f32, and
//! the result is rounded once to the result dtype. Integer `matmul`
//! accumulates in i64 with wrapping and wraps to the result dtype.
//! `conv2d` is im2col + GEMM per image, group and tile of output pixels.

use dcir_ir::{Attrs, TensorType};
use rayon::prelude::*;

use crate::eval::{KResult, bool_attr, ints_attr, usize_attr};
use crate::gemm::{Mat, gemm};
use crate::tensor::{Tensor, TensorData};

/// Output pixels per conv2d task (one im2col tile and one GEMM).
const PIXEL_TILE: usize = 256;

/// A `rows × cols` operand stored row-major, or stored as its transpose.
fn operand(data: &[f32], rows: usize, cols: usize, transposed: bool) -> Mat<'_> {
    if transposed {
        Mat::row_major(data, cols, rows).t()
    } else {
        Mat::row_major(data, rows, cols)
    }
}

/// Batched matrix multiply over the last two dims.
pub(crate) fn matmul(attrs: &Attrs, a: &Tensor, b: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let (ta, tb) = (
        bool_attr(attrs, "transpose_a")?,
        bool_attr(attrs, "transpose_b")?,
    );
    let r = ty.rank();
    let (m, n) = (ty.dims()[r - 2], ty.dims()[r - 1]);
    let k = a.dims()[if ta { r - 2 } else { r - 1 }];
    let batch: usize = ty.dims()[..r - 2].iter().product();
    if m * n == 0 {
        return Ok(Tensor::from_parts(
            ty.clone(),
            TensorData::from_f32(ty.dtype, &[]),
        ));
    }
    if !ty.dtype.is_float() {
        let (x, y) = (a.data().to_i64(), b.data().to_i64());
        let at =
            |bi: usize, i: usize, p: usize| x[bi * m * k + if ta { p * m + i } else { i * k + p }];
        let bt =
            |bi: usize, p: usize, j: usize| y[bi * k * n + if tb { j * k + p } else { p * n + j }];
        let mut out = Vec::with_capacity(batch * m * n);
        for bi in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    out.push((0..k).fold(0i64, |acc, p| {
                        acc.wrapping_add(at(bi, i, p).wrapping_mul(bt(bi, p, j)))
                    }));
                }
            }
        }
        return Ok(Tensor::from_parts(
            ty.clone(),
            TensorData::from_i64(ty.dtype, &out),
        ));
    }
    let (x, y) = (a.to_f32(), b.to_f32());
    let mut out = vec![0.0f32; batch * m * n];
    out.par_chunks_mut(m * n).enumerate().for_each(|(bi, c)| {
        let am = operand(&x[bi * m * k..(bi + 1) * m * k], m, k, ta);
        let bm = operand(&y[bi * k * n..(bi + 1) * k * n], k, n, tb);
        gemm(am, bm, c);
    });
    Ok(Tensor::from_parts(
        ty.clone(),
        TensorData::from_f32(ty.dtype, &out),
    ))
}

/// The geometry of one conv2d: NCHW input, OIHW weights, output extents.
struct ConvShape {
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    ow: usize,
    groups: usize,
    stride: [usize; 2],
    dilation: [usize; 2],
    pad_top: usize,
    pad_left: usize,
}

impl ConvShape {
    /// Input channels per group.
    fn cg(&self) -> usize {
        self.c / self.groups
    }

    /// Fills `col` (row-major, `cg*kh*kw` rows × `pixels.len()` columns)
    /// with the input patches of image `x` (`c*h*w` values), group `g`,
    /// for the output pixels `pixels`; padding reads as 0.
    fn im2col(&self, x: &[f32], g: usize, pixels: std::ops::Range<usize>, col: &mut [f32]) {
        let width = pixels.len();
        for ci in 0..self.cg() {
            let plane = &x[(g * self.cg() + ci) * self.h * self.w..][..self.h * self.w];
            for ki in 0..self.kh {
                for kj in 0..self.kw {
                    let row = (ci * self.kh + ki) * self.kw + kj;
                    let dst = &mut col[row * width..(row + 1) * width];
                    for (d, p) in dst.iter_mut().zip(pixels.clone()) {
                        let (oy, ox) = (p / self.ow, p % self.ow);
                        let iy = (oy * self.stride[0] + ki * self.dilation[0])
                            .wrapping_sub(self.pad_top);
                        let ix = (ox * self.stride[1] + kj * self.dilation[1])
                            .wrapping_sub(self.pad_left);
                        // A position in the padding wrapped around to a huge index.
                        *d = if iy < self.h && ix < self.w {
                            plane[iy * self.w + ix]
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }
}

/// 2-D convolution (stride, padding, dilation, groups), NCHW × OIHW.
pub(crate) fn conv2d(attrs: &Attrs, x: &Tensor, w: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let (stride, pad, dilation) = (
        ints_attr(attrs, "stride")?,
        ints_attr(attrs, "pad")?,
        ints_attr(attrs, "dilation")?,
    );
    let [n, c, h, wd] = dims4(x.dims());
    let [o, _, kh, kw] = dims4(w.dims());
    let [_, _, oh, ow] = dims4(ty.dims());
    let s = ConvShape {
        c,
        h,
        w: wd,
        kh,
        kw,
        ow,
        groups: usize_attr(attrs, "groups")?,
        stride: [stride[0], stride[1]],
        dilation: [dilation[0], dilation[1]],
        pad_top: pad[0],
        pad_left: pad[1],
    };
    let og = o / s.groups;
    let kdim = s.cg() * kh * kw;
    let pixels = oh * ow;
    let (xs, ws) = (x.to_f32(), w.to_f32());
    let tasks: Vec<(usize, usize, usize)> = (0..n)
        .flat_map(|ni| (0..s.groups).map(move |g| (ni, g)))
        .flat_map(|(ni, g)| (0..pixels).step_by(PIXEL_TILE).map(move |p| (ni, g, p)))
        .collect();
    let tiles: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(ni, g, p0)| {
            let range = p0..(p0 + PIXEL_TILE).min(pixels);
            let width = range.len();
            let mut col = vec![0.0f32; kdim * width];
            s.im2col(&xs[ni * c * h * wd..][..c * h * wd], g, range, &mut col);
            let weights = Mat::row_major(&ws[g * og * kdim..][..og * kdim], og, kdim);
            let mut tile = vec![0.0f32; og * width];
            gemm(weights, Mat::row_major(&col, kdim, width), &mut tile);
            tile
        })
        .collect();
    let mut out = vec![0.0f32; n * o * pixels];
    for (&(ni, g, p0), tile) in tasks.iter().zip(&tiles) {
        let width = (pixels - p0).min(PIXEL_TILE);
        for r in 0..og {
            let start = (ni * o + g * og + r) * pixels + p0;
            out[start..start + width].copy_from_slice(&tile[r * width..(r + 1) * width]);
        }
    }
    Ok(Tensor::from_parts(
        ty.clone(),
        TensorData::from_f32(ty.dtype, &out),
    ))
}

/// The four extents of a rank-4 shape.
pub(crate) fn dims4(d: &[usize]) -> [usize; 4] {
    [d[0], d[1], d[2], d[3]]
}
