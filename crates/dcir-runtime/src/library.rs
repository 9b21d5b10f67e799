//! Library calls of an artifact: cuBLASLt matmuls prepared once per
//! executor (descriptors, layouts, the algorithm) and enqueued on its stream
//! like a kernel, inside a captured CUDA graph too.
//!
//! dcir's matrices are row-major and cuBLASLt's column-major, so the row-major
//! `out[m, n] = a[m, k] · b[k, n]` is computed as the column-major
//! `outᵀ[n, m] = bᵀ[n, k] · aᵀ[k, m]`: the operands swap, `m` and `n` swap,
//! and a bias along the output's columns becomes cuBLASLt's per-row bias.
//! Every call computes in f32 (`CUBLAS_COMPUTE_32F`: f16 and bf16 accumulate
//! in f32, f32 stays strict, never TF32).

use std::ffi::c_void;

use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;
use dcir_artifact::GemmCall;

/// Workspace every call may use, bytes (what cuBLAS asks for on Hopper).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

/// Whether cuBLASLt can be loaded (`libcublasLt.so` on the library path).
pub fn cublaslt_present() -> bool {
    // SAFETY: only tries to open the shared library by its names.
    #[allow(unsafe_code)]
    unsafe {
        sys::is_culib_present()
    }
}

/// The cuBLASLt version (`cublasLtGetVersion`: 130000 is 13.0.0), if loaded.
pub fn cublaslt_version() -> Option<usize> {
    // SAFETY: the library is present, so the symbol lookup cannot panic;
    // the call takes no argument.
    #[allow(unsafe_code)]
    cublaslt_present().then(|| unsafe { sys::cublasLtGetVersion() })
}

/// A cuBLASLt handle.
pub(crate) struct Handle(sys::cublasLtHandle_t);

impl Handle {
    /// Opens cuBLASLt; `Err` says why (not installed, or it failed).
    pub(crate) fn new() -> Result<Handle, String> {
        if !cublaslt_present() {
            return Err("cuBLASLt (libcublasLt.so) is not on the library path".into());
        }
        lt::create_handle()
            .map(Handle)
            .map_err(|e| format!("cublasLtCreate: {e}"))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once.
        #[allow(unsafe_code)]
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

/// One matmul ready to enqueue: its descriptors, algorithm and pointers.
pub(crate) struct Matmul {
    desc: sys::cublasLtMatmulDesc_t,
    /// cuBLASLt's A, B, C and D (our b, a, c and out).
    layouts: [sys::cublasLtMatrixLayout_t; 4],
    algo: sys::cublasLtMatmulAlgo_t,
    alpha: f32,
    beta: f32,
    /// Device pointers of cuBLASLt's A, B, C and D.
    pointers: [u64; 4],
}

// SAFETY: the descriptors are plain host objects owned by this value alone;
// cuBLASLt allows them to be used from any thread, one call at a time.
#[allow(unsafe_code)]
unsafe impl Send for Matmul {}
// SAFETY: as above; the handle is used by one thread at a time (the
// executor's methods take `&mut self` to run).
#[allow(unsafe_code)]
unsafe impl Send for Handle {}

fn data_type(dtype: &str) -> Result<sys::cudaDataType, String> {
    match dtype {
        "f32" => Ok(sys::cudaDataType::CUDA_R_32F),
        "f16" => Ok(sys::cudaDataType::CUDA_R_16F),
        "bf16" => Ok(sys::cudaDataType::CUDA_R_16BF),
        other => Err(format!("cuBLASLt has no dtype `{other}` here")),
    }
}

/// One column-major matrix as cuBLASLt reads it: `rows × cols` with the
/// leading dimension `rows`, batch entries `batch_stride` elements apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Matrix {
    rows: u64,
    cols: u64,
    batch_stride: u64,
}

/// A row-major [`GemmCall`] as cuBLASLt's column-major problem
/// `D = op(A) · op(B) (+ C)` with `D` of `m × n`: A is our `b`, B our `a`,
/// `m` and `n` swap, and our bias along the output's columns is cuBLASLt's
/// per-row bias of D (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ColumnMajor {
    /// cuBLASLt's m (our n), n (our m) and k.
    m: u64,
    n: u64,
    k: u64,
    /// `op(A)` is Aᵀ (our `b` is stored transposed).
    transpose_a: bool,
    /// `op(B)` is Bᵀ (our `a` is stored transposed).
    transpose_b: bool,
    /// A, B, C and D.
    matrices: [Matrix; 4],
}

impl ColumnMajor {
    fn of(call: &GemmCall) -> ColumnMajor {
        let (m, n, k) = (call.n, call.m, call.k);
        // Our b is [k, n] row-major, i.e. [n, k] column-major with ld n
        // (op N); stored transposed it is [n, k] row-major, [k, n]
        // column-major with ld k (op T). Our a likewise with m.
        let a = if call.transpose_b { (k, m) } else { (m, k) };
        let b = if call.transpose_a { (n, k) } else { (k, n) };
        let matrix = |(rows, cols): (u64, u64)| Matrix {
            rows,
            cols,
            batch_stride: rows * cols,
        };
        ColumnMajor {
            m,
            n,
            k,
            transpose_a: call.transpose_b,
            transpose_b: call.transpose_a,
            matrices: [matrix(a), matrix(b), matrix((m, n)), matrix((m, n))],
        }
    }
}

/// The largest power of two (at most 256) dividing `ptr`: the alignment
/// the algorithm may assume.
fn alignment(ptr: u64) -> u32 {
    1 << ptr.trailing_zeros().min(8)
}

impl Matmul {
    /// Prepares `call` over the buffers at `args` (a, b, [c], [bias], out):
    /// descriptors, layouts and an algorithm — the recorded one when this
    /// cuBLASLt accepts it, else its heuristic's first. `Err` says why the
    /// library refused.
    pub(crate) fn new(handle: &Handle, call: &GemmCall, args: &[u64]) -> Result<Matmul, String> {
        let ty = data_type(&call.dtype)?;
        let (a, b) = (args[0], args[1]);
        let mut next = 2;
        let c = call.c.then(|| {
            next += 1;
            args[next - 1]
        });
        let bias = call.bias.then(|| {
            next += 1;
            args[next - 1]
        });
        let d = args[next];
        let e = |what: &'static str| move |err: CublasError| format!("{what}: {err}");
        let plan = ColumnMajor::of(call);
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(e("cublasLtMatmulDescCreate"))?;
        let mut this = Matmul {
            desc,
            layouts: [std::ptr::null_mut(); 4],
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
            alpha: 1.0,
            beta: if c.is_some() { 1.0 } else { 0.0 },
            pointers: [b, a, c.unwrap_or(d), d],
        };
        let (op_a, op_b) = (i32::from(plan.transpose_a), i32::from(plan.transpose_b));
        // SAFETY (this block): each attribute is written from a live value
        // of the type and size cuBLASLt documents for it; the layouts and
        // descriptors are this value's own, destroyed in `drop`.
        #[allow(unsafe_code)]
        unsafe {
            for (i, m) in plan.matrices.iter().enumerate() {
                let (rows, stride) = (m.rows, m.batch_stride);
                let layout = lt::create_matrix_layout(ty, rows, m.cols, rows as i64)
                    .map_err(e("cublasLtMatrixLayoutCreate"))?;
                this.layouts[i] = layout;
                if call.batch > 1 {
                    let count = call.batch as i32;
                    let stride = stride as i64;
                    lt::set_matrix_layout_attribute(
                        layout,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&count as *const i32).cast(),
                        4,
                    )
                    .map_err(e("setting the batch count"))?;
                    lt::set_matrix_layout_attribute(
                        layout,
                        sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&stride as *const i64).cast(),
                        8,
                    )
                    .map_err(e("setting the batch stride"))?;
                }
            }
            use sys::cublasLtMatmulDescAttributes_t as D;
            lt::set_matmul_desc_attribute(
                desc,
                D::CUBLASLT_MATMUL_DESC_TRANSA,
                (&op_a as *const i32).cast(),
                4,
            )
            .map_err(e("setting TRANSA"))?;
            lt::set_matmul_desc_attribute(
                desc,
                D::CUBLASLT_MATMUL_DESC_TRANSB,
                (&op_b as *const i32).cast(),
                4,
            )
            .map_err(e("setting TRANSB"))?;
            use sys::cublasLtEpilogue_t as Ep;
            let epilogue = match (call.activation.as_str(), bias.is_some()) {
                ("none", false) => Ep::CUBLASLT_EPILOGUE_DEFAULT,
                ("none", true) => Ep::CUBLASLT_EPILOGUE_BIAS,
                ("relu", false) => Ep::CUBLASLT_EPILOGUE_RELU,
                ("relu", true) => Ep::CUBLASLT_EPILOGUE_RELU_BIAS,
                ("gelu_tanh", false) => Ep::CUBLASLT_EPILOGUE_GELU,
                ("gelu_tanh", true) => Ep::CUBLASLT_EPILOGUE_GELU_BIAS,
                (other, _) => return Err(format!("no cuBLASLt epilogue `{other}`")),
            };
            lt::set_matmul_desc_attribute(
                desc,
                D::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&epilogue as *const Ep).cast(),
                std::mem::size_of::<Ep>(),
            )
            .map_err(e("setting the epilogue"))?;
            if let Some(bias) = bias {
                let ptr = bias as *const c_void;
                lt::set_matmul_desc_attribute(
                    desc,
                    D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&ptr as *const *const c_void).cast(),
                    std::mem::size_of::<*const c_void>(),
                )
                .map_err(e("setting the bias"))?;
            }
            this.algo = this.algorithm(handle, call)?;
        }
        Ok(this)
    }

    /// The recorded algorithm when cuBLASLt accepts it for this call, else
    /// the heuristic's algorithm of the call's rank (0: its first) within
    /// the workspace and the pointers' alignment.
    #[allow(unsafe_code)]
    unsafe fn algorithm(
        &self,
        handle: &Handle,
        call: &GemmCall,
    ) -> Result<sys::cublasLtMatmulAlgo_t, String> {
        let [la, lb, lc, ld] = self.layouts;
        if let Some(words) = &call.algorithm {
            let mut algo = sys::cublasLtMatmulAlgo_t { data: [0; 8] };
            algo.data.copy_from_slice(&words[..8]);
            let mut result =
                std::mem::MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::zeroed();
            // SAFETY: live descriptors; `result` is written by the call.
            let status = unsafe {
                sys::cublasLtMatmulAlgoCheck(
                    handle.0,
                    self.desc,
                    la,
                    lb,
                    lc,
                    ld,
                    &algo,
                    result.as_mut_ptr(),
                )
            };
            // SAFETY: zero-initialized, then written by a successful check.
            let result = unsafe { result.assume_init() };
            if status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                && result.workspaceSize <= WORKSPACE_BYTES
            {
                return Ok(algo);
            }
        }
        let e = |what: &'static str| move |err: CublasError| format!("{what}: {err}");
        let pref = lt::create_matmul_pref().map_err(e("cublasLtMatmulPreferenceCreate"))?;
        let chosen = (|| {
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            let workspace = WORKSPACE_BYTES as u64;
            // SAFETY: attributes written from live values of their types.
            unsafe {
                lt::set_matmul_pref_attribute(
                    pref,
                    P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&workspace as *const u64).cast(),
                    8,
                )?;
                let aligned = [
                    (
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                        self.pointers[0],
                    ),
                    (
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                        self.pointers[1],
                    ),
                    (
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                        self.pointers[2],
                    ),
                    (
                        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                        self.pointers[3],
                    ),
                ];
                for (attr, ptr) in aligned {
                    let bytes = alignment(ptr);
                    lt::set_matmul_pref_attribute(pref, attr, (&bytes as *const u32).cast(), 4)?;
                }
                let wanted = call.heuristic_rank as usize + 1;
                let mut results = vec![
                    std::mem::MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::zeroed()
                        .assume_init();
                    wanted
                ];
                let mut returned = 0i32;
                sys::cublasLtMatmulAlgoGetHeuristic(
                    handle.0,
                    self.desc,
                    la,
                    lb,
                    lc,
                    ld,
                    pref,
                    wanted as i32,
                    results.as_mut_ptr(),
                    &mut returned,
                )
                .result()?;
                results.truncate(usize::try_from(returned).unwrap_or(0));
                Ok(results)
            }
        })();
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        let results = chosen.map_err(|err: CublasError| {
            format!("cuBLASLt has no algorithm for this call: {err}")
        })?;
        match results.get(call.heuristic_rank as usize) {
            Some(h) if h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(h.algo),
            Some(h) => Err(format!(
                "cuBLASLt's algorithm of rank {} for this call is not usable: {:?}",
                call.heuristic_rank, h.state
            )),
            None if results.is_empty() => Err("cuBLASLt has no algorithm for this call".into()),
            None => Err(format!(
                "cuBLASLt's heuristic offers {} algorithm{} for this call, not one of rank {}",
                results.len(),
                if results.len() == 1 { "" } else { "s" },
                call.heuristic_rank
            )),
        }
    }

    /// The chosen algorithm's words, as the artifact records them.
    pub(crate) fn algorithm_words(&self) -> Vec<u64> {
        self.algo.data.to_vec()
    }

    /// Enqueues the matmul on `stream` with the workspace at `workspace`.
    pub(crate) fn enqueue(
        &self,
        handle: &Handle,
        workspace: u64,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), String> {
        let [a, b, c, d] = self.pointers;
        let [la, lb, lc, ld] = self.layouts;
        // SAFETY: the pointers are live buffers of the executor holding the
        // elements the artifact's validated call reads and writes; the
        // workspace is a live allocation of WORKSPACE_BYTES; the algorithm
        // was checked or chosen for these descriptors and that workspace.
        #[allow(unsafe_code)]
        unsafe {
            lt::matmul(
                handle.0,
                self.desc,
                (&self.alpha as *const f32).cast(),
                (&self.beta as *const f32).cast(),
                a as *const c_void,
                la,
                b as *const c_void,
                lb,
                c as *const c_void,
                lc,
                d as *mut c_void,
                ld,
                &self.algo,
                workspace as *mut c_void,
                WORKSPACE_BYTES,
                stream as sys::cudaStream_t,
            )
        }
        .map_err(|e| format!("cublasLtMatmul: {e}"))
    }
}

impl Drop for Matmul {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `new` (null where creation
        // stopped early) and is destroyed once.
        #[allow(unsafe_code)]
        unsafe {
            for &l in self.layouts.iter().filter(|l| !l.is_null()) {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(batch: u64, m: u64, n: u64, k: u64, ta: bool, tb: bool) -> GemmCall {
        GemmCall {
            dtype: "f32".into(),
            batch,
            m,
            n,
            k,
            transpose_a: ta,
            transpose_b: tb,
            c: true,
            bias: true,
            activation: "none".into(),
            algorithm: None,
            heuristic_rank: 0,
        }
    }

    /// cuBLASLt's definition over column-major buffers:
    /// `D(i, j) = Σ op(A)(i, l)·op(B)(l, j) + C(i, j) + bias(i)` per batch.
    fn column_major(p: &ColumnMajor, batch: u64, bufs: [&[f64]; 3], bias: &[f64]) -> Vec<f64> {
        let [a, b, c] = bufs;
        let [ma, mb, mc, md] = p.matrices;
        let at = |m: &Matrix, buf: &[f64], batch: u64, r: u64, col: u64| {
            buf[(batch * m.batch_stride + r + col * m.rows) as usize]
        };
        let mut d = vec![0.0; (batch * md.batch_stride) as usize];
        for z in 0..batch {
            for i in 0..p.m {
                for j in 0..p.n {
                    let mut sum = at(&mc, c, z, i, j) + bias[i as usize];
                    for l in 0..p.k {
                        let x = if p.transpose_a {
                            at(&ma, a, z, l, i)
                        } else {
                            at(&ma, a, z, i, l)
                        };
                        let y = if p.transpose_b {
                            at(&mb, b, z, j, l)
                        } else {
                            at(&mb, b, z, l, j)
                        };
                        sum += x * y;
                    }
                    d[(z * md.batch_stride + i + j * md.rows) as usize] = sum;
                }
            }
        }
        d
    }

    /// The layouts the runtime hands cuBLASLt compute dcir's row-major
    /// `out = a · b + c + bias` for every transpose and a batch, at odd sizes.
    #[test]
    fn the_column_major_problem_is_the_row_major_product() {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let (batch, m, n, k) = (2u64, 3u64, 5u64, 7u64);
            let g = call(batch, m, n, k, ta, tb);
            let value = |i: u64, salt: f64| ((i as f64 * 0.37 + salt).sin() * 4.0).round();
            let a: Vec<f64> = (0..batch * m * k).map(|i| value(i, 1.0)).collect();
            let b: Vec<f64> = (0..batch * k * n).map(|i| value(i, 2.0)).collect();
            let c: Vec<f64> = (0..batch * m * n).map(|i| value(i, 3.0)).collect();
            let bias: Vec<f64> = (0..n).map(|i| value(i, 4.0)).collect();
            // Row-major reference: a is [m, k] (or [k, m]), b [k, n] (or [n, k]).
            let mut want = vec![0.0; (batch * m * n) as usize];
            for z in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let mut sum = c[(z * m * n + i * n + j) as usize] + bias[j as usize];
                        for l in 0..k {
                            let x = if ta {
                                a[(z * m * k + l * m + i) as usize]
                            } else {
                                a[(z * m * k + i * k + l) as usize]
                            };
                            let y = if tb {
                                b[(z * k * n + j * k + l) as usize]
                            } else {
                                b[(z * k * n + l * n + j) as usize]
                            };
                            sum += x * y;
                        }
                        want[(z * m * n + i * n + j) as usize] = sum;
                    }
                }
            }
            let plan = ColumnMajor::of(&g);
            // cuBLASLt's A is our b, its B our a, C and D ours.
            let got = column_major(&plan, batch, [&b, &a, &c], &bias);
            assert_eq!(got, want, "transpose_a {ta}, transpose_b {tb}");
        }
    }

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0x1000), 256);
        assert_eq!(alignment(0x1008), 8);
        assert_eq!(alignment(0x1002), 2);
    }
}
