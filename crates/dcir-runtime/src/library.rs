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
        let (m, n, k) = (call.n, call.m, call.k); // cuBLASLt's, swapped
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
        // cuBLASLt's A is our b: [n, k] column-major with ld n, or stored
        // transposed ([k, n], ld k). Its B is our a: [k, m] with ld k, or
        // [m, k] with ld m.
        let (op_a, rows_a, cols_a) = if call.transpose_b {
            (1i32, k, m)
        } else {
            (0i32, m, k)
        };
        let (op_b, rows_b, cols_b) = if call.transpose_a {
            (1i32, n, k)
        } else {
            (0i32, k, n)
        };
        let shapes = [
            (rows_a, cols_a, m * k),
            (rows_b, cols_b, k * n),
            (m, n, m * n),
            (m, n, m * n),
        ];
        // SAFETY (this block): each attribute is written from a live value
        // of the type and size cuBLASLt documents for it; the layouts and
        // descriptors are this value's own, destroyed in `drop`.
        #[allow(unsafe_code)]
        unsafe {
            for (i, &(rows, cols, stride)) in shapes.iter().enumerate() {
                let layout = lt::create_matrix_layout(ty, rows, cols, rows as i64)
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
    /// the heuristic's first within the workspace and the pointers'
    /// alignment.
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
                lt::get_matmul_algo_heuristic(handle.0, self.desc, la, lb, lc, ld, pref)
            }
        })();
        // SAFETY: created above, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        chosen
            .map(|h| h.algo)
            .map_err(|err| format!("cuBLASLt has no algorithm for this call: {err}"))
    }

    /// The algorithm's opaque words (what an artifact records).
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
