//! The shared matrix-multiply core: `C = A · B` in f32 on matrixmultiply's
//! `sgemm`, split over fixed blocks of rows of C that run in parallel.
//!
//! Each element of C is one f32 dot product, accumulated by sgemm in a
//! fixed order over k (blocked, fused multiply-add where the CPU has it).
//! Row blocks depend only on the matrix size, never on the thread count or
//! scheduling, so results are deterministic.

use rayon::prelude::*;

/// Rows of C per parallel task.
const ROW_BLOCK: usize = 64;

/// A read-only strided view of a matrix: element (i, j) is
/// `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mat<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Mat<'a> {
    /// A dense row-major `rows × cols` matrix at the start of `data`.
    pub(crate) fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Mat<'a> {
        Mat {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose (no copy).
    pub(crate) fn t(self) -> Mat<'a> {
        Mat {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Rows `start..end`.
    fn rows(self, start: usize, end: usize) -> Mat<'a> {
        Mat {
            data: &self.data[(start * self.row_stride).min(self.data.len())..],
            rows: end - start,
            ..self
        }
    }

    /// True when every element lies inside `data`.
    fn in_bounds(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
                < self.data.len()
    }
}

/// Writes `a · b` into `c`, a dense row-major `a.rows × b.cols` matrix.
pub(crate) fn gemm(a: Mat, b: Mat, c: &mut [f32]) {
    assert_eq!(a.cols, b.rows, "gemm: inner dims differ");
    assert_eq!(c.len(), a.rows * b.cols, "gemm: C has the wrong size");
    let n = b.cols;
    if n == 0 {
        return;
    }
    c.par_chunks_mut(ROW_BLOCK * n)
        .enumerate()
        .for_each(|(block, c_rows)| {
            let start = block * ROW_BLOCK;
            sgemm(a.rows(start, start + c_rows.len() / n), b, c_rows);
        });
}

/// One sequential sgemm call, after checking every access it will make.
#[allow(unsafe_code)]
fn sgemm(a: Mat, b: Mat, c: &mut [f32]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(a.in_bounds() && b.in_bounds() && c.len() == m * n && b.rows == k);
    let stride = |s: usize| isize::try_from(s).expect("stride fits isize");
    // SAFETY: sgemm reads A(i, p) at a + i*rsa + p*csa for i < m, p < k, and
    // B(p, j) likewise, all inside their slices by `in_bounds`; it writes
    // C(i, j) at c + i*n + j for i < m, j < n, inside `c` (length m*n). The
    // slices do not overlap: `c` is borrowed mutably.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.data.as_ptr(),
            stride(a.row_stride),
            stride(a.col_stride),
            b.data.as_ptr(),
            stride(b.row_stride),
            stride(b.col_stride),
            0.0,
            c.as_mut_ptr(),
            stride(n),
            1,
        );
    }
}
