//! cuDNN convolutions of an artifact, prepared once per executor
//! (descriptors, the algorithm, the workspace it needs, at most
//! [`WORKSPACE_LIMIT`]) and enqueued on its stream like a kernel, inside a captured CUDA
//! graph too.
//!
//! NCHW tensors, or NHWC ones (`ConvCall::nhwc`) with the filter
//! `[k, c / groups, r, s]` or KRSC (`ConvCall::krsc`); f16 and bf16 compute in f32 (cuDNN's pseudo-half
//! configurations, tensor-core math), f32 in strict f32 (`CUDNN_FMA_MATH`:
//! never TF32). With a bias the call is `cudnnConvolutionBiasActivationForward`
//! (`act(conv + z + bias)`, identity or ReLU; identity runs only with
//! `IMPLICIT_PRECOMP_GEMM`), without one `cudnnConvolutionForward`.

use std::ffi::c_void;

use cudarc::cudnn::sys;
use dcir_artifact::ConvCall;

/// Whether cuDNN can be loaded (`libcudnn.so.9` on the library path).
pub fn cudnn_present() -> bool {
    // SAFETY: only tries to open the shared library by its names.
    #[allow(unsafe_code)]
    unsafe {
        sys::is_culib_present()
    }
}

/// The cuDNN version (`cudnnGetVersion`: 91900 is 9.19.0), if loaded.
pub fn cudnn_version() -> Option<usize> {
    // SAFETY: the library is present, so the symbol lookup cannot panic.
    #[allow(unsafe_code)]
    cudnn_present().then(|| unsafe { sys::cudnnGetVersion() })
}

fn check(status: sys::cudnnStatus_t, what: &str) -> Result<(), String> {
    if status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {status:?}"))
    }
}

/// A cuDNN handle bound to one stream.
pub(crate) struct Handle(sys::cudnnHandle_t);

impl Handle {
    /// Opens cuDNN on `stream`; `Err` says why (not installed, or it failed).
    pub(crate) fn new(stream: cudarc::driver::sys::CUstream) -> Result<Handle, String> {
        if !cudnn_present() {
            return Err("cuDNN (libcudnn.so.9) is not on the library path".into());
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: the library is present; `handle` is written by the call and
        // destroyed once in `drop`; the stream outlives the executor's calls.
        #[allow(unsafe_code)]
        unsafe {
            check(sys::cudnnCreate(&mut handle), "cudnnCreate")?;
            let this = Handle(handle);
            check(
                sys::cudnnSetStream(handle, stream as sys::cudaStream_t),
                "cudnnSetStream",
            )?;
            Ok(this)
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        #[allow(unsafe_code)]
        unsafe {
            sys::cudnnDestroy(self.0);
        }
    }
}

/// The most workspace one convolution may use, bytes: an algorithm needing
/// more is not chosen. The executor allocates what its calls need, not this.
pub(crate) const WORKSPACE_LIMIT: usize = 256 << 20;

/// One convolution ready to enqueue.
pub(crate) struct Conv {
    x_desc: sys::cudnnTensorDescriptor_t,
    y_desc: sys::cudnnTensorDescriptor_t,
    bias_desc: sys::cudnnTensorDescriptor_t,
    w_desc: sys::cudnnFilterDescriptor_t,
    conv_desc: sys::cudnnConvolutionDescriptor_t,
    act_desc: sys::cudnnActivationDescriptor_t,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    workspace_bytes: usize,
    /// x, w, z (the output when absent), bias (null when absent), out.
    pointers: [u64; 5],
    fused: bool,
    alpha2: f32,
}

// SAFETY: the descriptors are host objects owned by this value alone; the
// executor uses them from one thread at a time.
#[allow(unsafe_code)]
unsafe impl Send for Conv {}
// SAFETY: as above.
#[allow(unsafe_code)]
unsafe impl Send for Handle {}

fn data_type(dtype: &str) -> Result<sys::cudnnDataType_t, String> {
    match dtype {
        "f32" => Ok(sys::cudnnDataType_t::CUDNN_DATA_FLOAT),
        "f16" => Ok(sys::cudnnDataType_t::CUDNN_DATA_HALF),
        "bf16" => Ok(sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        other => Err(format!("cuDNN has no dtype `{other}` here")),
    }
}

/// The forward algorithm the artifact records as `index`.
fn algorithm(index: u32) -> Option<sys::cudnnConvolutionFwdAlgo_t> {
    use sys::cudnnConvolutionFwdAlgo_t as A;
    Some(match index {
        0 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
        1 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        2 => A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
        3 => A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
        4 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
        5 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
        6 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
        7 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
        _ => return None,
    })
}

fn int(x: u64) -> i32 {
    // The artifact's validation keeps every extent below 2^31.
    x.min(i32::MAX as u64) as i32
}

impl Conv {
    /// Prepares `call` over the buffers at `args` (x, w, [z], [bias], out):
    /// descriptors and the recorded algorithm where cuDNN accepts it, else
    /// the first its heuristic offers that fits the workspace limit (`IMPLICIT_PRECOMP_GEMM` for a fused call without
    /// ReLU, the one cuDNN runs with an identity activation).
    pub(crate) fn new(handle: &Handle, call: &ConvCall, args: &[u64]) -> Result<Conv, String> {
        let ty = data_type(&call.dtype)?;
        let mut next = 2;
        let z = call.z.then(|| {
            next += 1;
            args[next - 1]
        });
        let bias = call.bias.then(|| {
            next += 1;
            args[next - 1]
        });
        let out = args[next];
        let mut this = Conv {
            x_desc: std::ptr::null_mut(),
            y_desc: std::ptr::null_mut(),
            bias_desc: std::ptr::null_mut(),
            w_desc: std::ptr::null_mut(),
            conv_desc: std::ptr::null_mut(),
            act_desc: std::ptr::null_mut(),
            algo: sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
            workspace_bytes: 0,
            pointers: [args[0], args[1], z.unwrap_or(out), bias.unwrap_or(0), out],
            fused: call.bias,
            alpha2: if z.is_some() { 1.0 } else { 0.0 },
        };
        let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        // The tensors' and the filter's layouts in memory (dims are given in
        // NCHW and KCRS order either way).
        let tensors = if call.nhwc {
            sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
        } else {
            nchw
        };
        let filter = if call.krsc {
            sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
        } else {
            nchw
        };
        let [n, c, h, w] = call.input;
        let [k, cg, r, s] = call.filter;
        let [_, _, oh, ow] = call.output;
        // SAFETY (this block): every descriptor is created here, owned by
        // `this` and destroyed in `drop` (null ones skipped); every value
        // passed is a live local of the type cuDNN documents.
        #[allow(unsafe_code)]
        unsafe {
            check(
                sys::cudnnCreateTensorDescriptor(&mut this.x_desc),
                "creating a tensor descriptor",
            )?;
            check(
                sys::cudnnSetTensor4dDescriptor(
                    this.x_desc,
                    tensors,
                    ty,
                    int(n),
                    int(c),
                    int(h),
                    int(w),
                ),
                "describing the input",
            )?;
            check(
                sys::cudnnCreateTensorDescriptor(&mut this.y_desc),
                "creating a tensor descriptor",
            )?;
            check(
                sys::cudnnSetTensor4dDescriptor(
                    this.y_desc,
                    tensors,
                    ty,
                    int(n),
                    int(k),
                    int(oh),
                    int(ow),
                ),
                "describing the output",
            )?;
            check(
                sys::cudnnCreateTensorDescriptor(&mut this.bias_desc),
                "creating a tensor descriptor",
            )?;
            check(
                sys::cudnnSetTensor4dDescriptor(this.bias_desc, tensors, ty, 1, int(k), 1, 1),
                "describing the bias",
            )?;
            check(
                sys::cudnnCreateFilterDescriptor(&mut this.w_desc),
                "creating a filter descriptor",
            )?;
            check(
                sys::cudnnSetFilter4dDescriptor(
                    this.w_desc,
                    ty,
                    filter,
                    int(k),
                    int(cg),
                    int(r),
                    int(s),
                ),
                "describing the filter",
            )?;
            check(
                sys::cudnnCreateConvolutionDescriptor(&mut this.conv_desc),
                "creating a convolution descriptor",
            )?;
            check(
                sys::cudnnSetConvolution2dDescriptor(
                    this.conv_desc,
                    int(call.pad[0]),
                    int(call.pad[1]),
                    int(call.stride[0]),
                    int(call.stride[1]),
                    int(call.dilation[0]),
                    int(call.dilation[1]),
                    sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                ),
                "describing the convolution",
            )?;
            check(
                sys::cudnnSetConvolutionGroupCount(this.conv_desc, int(call.groups)),
                "setting the groups",
            )?;
            let math = if call.dtype == "f32" {
                sys::cudnnMathType_t::CUDNN_FMA_MATH
            } else {
                sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
            };
            check(
                sys::cudnnSetConvolutionMathType(this.conv_desc, math),
                "setting the math type",
            )?;
            check(
                sys::cudnnCreateActivationDescriptor(&mut this.act_desc),
                "creating an activation descriptor",
            )?;
            let relu = call.activation == "relu";
            let mode = if relu {
                sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU
            } else {
                sys::cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY
            };
            check(
                sys::cudnnSetActivationDescriptor(
                    this.act_desc,
                    mode,
                    sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                    0.0,
                ),
                "describing the activation",
            )?;
            let forced = this.fused && !relu;
            if forced && call.heuristic_rank > 0 {
                return Err(format!(
                    "cuDNN's fused call without relu runs one algorithm (implicit precomputed GEMM), not one of rank {}",
                    call.heuristic_rank
                ));
            }
            this.algo = match (forced, call.algorithm.and_then(algorithm)) {
                (true, _) => {
                    sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
                }
                (false, Some(recorded)) if this.accepts(handle, recorded) => recorded,
                (false, _) => this.heuristic(handle, call.heuristic_rank)?,
            };
            let mut bytes = 0usize;
            check(
                sys::cudnnGetConvolutionForwardWorkspaceSize(
                    handle.0,
                    this.x_desc,
                    this.w_desc,
                    this.conv_desc,
                    this.y_desc,
                    this.algo,
                    &mut bytes,
                ),
                "sizing the workspace",
            )?;
            if bytes > WORKSPACE_LIMIT {
                return Err(format!(
                    "cuDNN's {:?} needs {bytes} bytes of workspace, more than {WORKSPACE_LIMIT}",
                    this.algo
                ));
            }
            this.workspace_bytes = bytes;
        }
        Ok(this)
    }

    /// The chosen algorithm as the artifact records it.
    pub(crate) fn algorithm_index(&self) -> u32 {
        self.algo as u32
    }

    /// Whether cuDNN runs `algo` for these descriptors within the workspace
    /// limit.
    #[allow(unsafe_code)]
    unsafe fn accepts(&self, handle: &Handle, algo: sys::cudnnConvolutionFwdAlgo_t) -> bool {
        let mut bytes = 0usize;
        // SAFETY: live descriptors; `bytes` is written by the call.
        let status = unsafe {
            sys::cudnnGetConvolutionForwardWorkspaceSize(
                handle.0,
                self.x_desc,
                self.w_desc,
                self.conv_desc,
                self.y_desc,
                algo,
                &mut bytes,
            )
        };
        status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && bytes <= WORKSPACE_LIMIT
    }

    /// Workspace the chosen algorithm needs, bytes.
    pub(crate) fn workspace_bytes(&self) -> usize {
        self.workspace_bytes
    }

    /// The algorithm of rank `rank` (0: the first) among those of cuDNN's
    /// heuristic that succeed within the workspace limit.
    #[allow(unsafe_code)]
    unsafe fn heuristic(
        &self,
        handle: &Handle,
        rank: u32,
    ) -> Result<sys::cudnnConvolutionFwdAlgo_t, String> {
        const WANTED: usize = 8;
        let mut perf =
            [std::mem::MaybeUninit::<sys::cudnnConvolutionFwdAlgoPerf_t>::zeroed(); WANTED];
        let mut returned = 0;
        // SAFETY: live descriptors; `perf` holds WANTED entries, of which the
        // call writes `returned`.
        unsafe {
            check(
                sys::cudnnGetConvolutionForwardAlgorithm_v7(
                    handle.0,
                    self.x_desc,
                    self.w_desc,
                    self.conv_desc,
                    self.y_desc,
                    WANTED as i32,
                    &mut returned,
                    perf.as_mut_ptr().cast(),
                ),
                "cudnnGetConvolutionForwardAlgorithm_v7",
            )?;
        }
        let usable: Vec<_> = (0..(returned.max(0) as usize).min(WANTED))
            // SAFETY: zero-initialized, the first `returned` written by cuDNN.
            .map(|i| unsafe { perf[i].assume_init() })
            .filter(|p| {
                p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS && p.memory <= WORKSPACE_LIMIT
            })
            .map(|p| p.algo)
            .collect();
        match usable.get(rank as usize) {
            Some(&algo) => Ok(algo),
            None if usable.is_empty() => {
                Err("cuDNN's heuristic has no algorithm for this convolution".into())
            }
            None => Err(format!(
                "cuDNN's heuristic offers {} algorithm{} for this convolution, not one of rank {rank}",
                usable.len(),
                if usable.len() == 1 { "" } else { "s" }
            )),
        }
    }

    /// Enqueues the convolution on the handle's stream with the workspace
    /// at `workspace`.
    pub(crate) fn enqueue(&self, handle: &Handle, workspace: u64) -> Result<(), String> {
        let [x, w, z, bias, out] = self.pointers;
        let (one, alpha2, zero) = (1.0f32, self.alpha2, 0.0f32);
        let ptr = |p: u64| p as *const c_void;
        // SAFETY: the pointers are live buffers of the executor holding the
        // elements the artifact's validated call reads and writes; the
        // workspace is a live allocation of at least `workspace_bytes`; the
        // descriptors and algorithm were prepared for them.
        #[allow(unsafe_code)]
        let status = unsafe {
            if self.fused {
                sys::cudnnConvolutionBiasActivationForward(
                    handle.0,
                    (&one as *const f32).cast(),
                    self.x_desc,
                    ptr(x),
                    self.w_desc,
                    ptr(w),
                    self.conv_desc,
                    self.algo,
                    workspace as *mut c_void,
                    self.workspace_bytes,
                    (&alpha2 as *const f32).cast(),
                    self.y_desc,
                    ptr(z),
                    self.bias_desc,
                    ptr(bias),
                    self.act_desc,
                    self.y_desc,
                    out as *mut c_void,
                )
            } else {
                sys::cudnnConvolutionForward(
                    handle.0,
                    (&one as *const f32).cast(),
                    self.x_desc,
                    ptr(x),
                    self.w_desc,
                    ptr(w),
                    self.conv_desc,
                    self.algo,
                    workspace as *mut c_void,
                    self.workspace_bytes,
                    (&zero as *const f32).cast(),
                    self.y_desc,
                    out as *mut c_void,
                )
            }
        };
        check(status, "cuDNN convolution")
    }
}

impl Drop for Conv {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `new` (null where creation
        // stopped early) and is destroyed once.
        #[allow(unsafe_code)]
        unsafe {
            for d in [self.x_desc, self.y_desc, self.bias_desc] {
                if !d.is_null() {
                    sys::cudnnDestroyTensorDescriptor(d);
                }
            }
            if !self.w_desc.is_null() {
                sys::cudnnDestroyFilterDescriptor(self.w_desc);
            }
            if !self.conv_desc.is_null() {
                sys::cudnnDestroyConvolutionDescriptor(self.conv_desc);
            }
            if !self.act_desc.is_null() {
                sys::cudnnDestroyActivationDescriptor(self.act_desc);
            }
        }
    }
}
