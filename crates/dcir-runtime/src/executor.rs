//! The executor: an [`Artifact`] loaded on one GPU, ready to run.
//!
//! [`Executor::new`] probes the driver, opens the device, loads every
//! kernel's PTX (once per distinct PTX text), checks each kernel's shared
//! memory and block size against the device, and allocates the inputs,
//! outputs, constants and zeroed scratch each on their own and one arena
//! for the intermediates laid out by [`crate::plan_memory`]. Runs launch in
//! the artifact's order on one stream of their own (event tracking off, as
//! CUDA-graph capture needs), either launch by launch or as one captured
//! CUDA graph.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{
    CUdevice_attribute, CUevent_flags, CUfunction_attribute, CUgraphInstantiate_flags,
    CUstreamCaptureMode, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill,
    CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use dcir_artifact::{Artifact, BufferKind, ConvCall, GemmCall, LibraryCall};

use crate::error::{RuntimeError, driver};
use crate::plan::{MemoryPlan, plan_memory};
use crate::{cudnn, library};

type Result<T> = std::result::Result<T, RuntimeError>;

/// What the runtime read off the device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// The device's name.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Shared memory a block may opt in to, bytes.
    pub max_shared_per_block: u64,
    /// Device memory, bytes.
    pub total_memory: u64,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most resident threads on one SM.
    pub max_threads_per_sm: u32,
    /// Most resident blocks on one SM.
    pub max_blocks_per_sm: u32,
    /// Shared memory per SM, bytes.
    pub shared_per_sm: u64,
    /// 32-bit registers per SM.
    pub registers_per_sm: u32,
    /// L2 cache, bytes.
    pub l2_bytes: u64,
    /// Peak SM clock, Hz.
    pub clock_hz: f64,
    /// Memory clock × bus width × 2 (DDR), bytes per second.
    pub theoretical_bandwidth: f64,
    /// The driver's CUDA version (`cuDriverGetVersion`: 13000 is 13.0).
    pub driver_version: i32,
}

/// Opens device `ordinal` and reads its properties (no artifact needed).
pub fn query_device(ordinal: usize) -> Result<DeviceInfo> {
    if !driver_present() {
        return Err(RuntimeError::NoDriver);
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| RuntimeError::NoDevice {
        ordinal,
        error: format!("{e:?}"),
    })?;
    device_info(&ctx)
}

/// Latency statistics of repeated runs, milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// Median.
    pub median_ms: f64,
    /// Fastest run.
    pub min_ms: f64,
    /// Slowest run.
    pub max_ms: f64,
}

impl Timing {
    fn of(mut ms: Vec<f64>) -> Timing {
        ms.sort_by(f64::total_cmp);
        Timing {
            median_ms: ms[ms.len() / 2],
            min_ms: ms[0],
            max_ms: ms[ms.len() - 1],
        }
    }
}

/// One launch, resolved: what it calls and the argument pointers.
struct Resolved {
    name: String,
    callee: Callee,
    args: Vec<u64>,
    /// Per argument, the TMA descriptor passed instead of the pointer
    /// (a parameter with a tensor map).
    tensor_maps: Vec<Option<CUtensorMap>>,
}

/// What a launch calls.
#[derive(Clone, Copy)]
enum Callee {
    /// Kernel `kernel` (index into `functions`) with this shape.
    Kernel { kernel: usize, config: LaunchConfig },
    /// Prepared library call `index` of `Libraries::matmuls`.
    Matmul(usize),
    /// Prepared library call `index` of `Libraries::convs`.
    Conv(usize),
}

/// The library calls of an artifact, prepared.
struct Libraries {
    /// cuBLASLt, when a call needs it.
    blas: Option<library::Handle>,
    /// cuDNN, when a call needs it.
    dnn: Option<cudnn::Handle>,
    /// One workspace all calls share (they run one after another), as
    /// large as the neediest call's.
    workspace: Option<CudaSlice<u8>>,
    matmuls: Vec<library::Matmul>,
    convs: Vec<cudnn::Conv>,
    /// Per kernel entry that is a call (its index), the call with the
    /// algorithm chosen here recorded.
    chosen: Vec<(u32, LibraryCall)>,
}

impl Libraries {
    /// Records kernel entry `kernel`'s call as prepared (the first launch of
    /// an entry decides).
    fn record(&mut self, kernel: u32, call: LibraryCall) {
        if !self.chosen.iter().any(|(k, _)| *k == kernel) {
            self.chosen.push((kernel, call));
        }
    }
}

/// An artifact loaded on a device.
pub struct Executor {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    plan: MemoryPlan,
    kernel_names: Vec<String>,
    /// Per kernel entry: its function (`None` for a library call).
    functions: Vec<Option<CudaFunction>>,
    launches: Vec<Resolved>,
    libraries: Option<Libraries>,
    /// Own allocations of inputs and outputs, by buffer id.
    owned: Vec<Option<CudaSlice<u8>>>,
    arena: CudaSlice<u8>,
    inputs: Vec<(u32, u64)>,
    outputs: Vec<OutputSlot>,
    graph: Option<CudaGraph>,
}

/// Where a graph output's bytes are: a graph output may be a buffer of its
/// own, a view into the arena or another buffer (a reshape, a concat's
/// slice), or a graph input or constant itself (nothing computes it).
struct OutputSlot {
    /// The root buffer's own allocation (its id), or `None` for the arena.
    owned: Option<usize>,
    /// Byte offset in that allocation.
    offset: u64,
    bytes: u64,
    /// Whether launches write it (so poisoning covers it); an input or
    /// constant returned as an output keeps its bytes.
    computed: bool,
}

/// Whether libcuda can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: the probe only dlopens the library by its candidate names and
    // drops it; it calls no driver function.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::driver::sys::is_culib_present()
    }
}

/// The CUDA version the installed driver supports, `(major, minor)`; `None`
/// without a driver.
pub fn driver_version() -> Option<(i32, i32)> {
    if !driver_present() {
        return None;
    }
    driver_version_code()
        .ok()
        .map(|v| (v / 1000, v % 1000 / 10))
}

/// FNV-1a of `text`: the module cache's key.
fn content_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Executor {
    /// Loads `artifact` on device `ordinal`.
    pub fn new(artifact: &Artifact, ordinal: usize) -> Result<Executor> {
        if !driver_present() {
            return Err(RuntimeError::NoDriver);
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| RuntimeError::NoDevice {
            ordinal,
            error: format!("{e:?}"),
        })?;
        // SAFETY: everything this executor allocates and launches uses its one
        // stream, so no cross-stream ordering is left to the events.
        #[allow(unsafe_code)]
        unsafe {
            ctx.disable_event_tracking();
        }
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let info = device_info(&ctx)?;

        let mut modules: HashMap<u64, Arc<CudaModule>> = HashMap::new();
        let mut functions = Vec::with_capacity(artifact.kernels.len());
        for k in &artifact.kernels {
            if k.library.is_some() {
                functions.push(None);
                continue;
            }
            if let Some(needs) = &k.requires_arch {
                let (major, minor) = info.compute_capability;
                if *needs != format!("sm_{major}{minor}a") {
                    return Err(RuntimeError::Architecture {
                        kernel: k.name.clone(),
                        needs: needs.clone(),
                        ordinal,
                        major,
                        minor,
                    });
                }
            }
            let ptx = k.ptx.as_ref().ok_or_else(|| RuntimeError::NoPtx {
                kernel: k.name.clone(),
            })?;
            let load_error = |e| RuntimeError::Load {
                kernel: k.name.clone(),
                error: format!("{e:?}"),
            };
            let module = match modules.get(&content_hash(ptx)) {
                Some(m) => m.clone(),
                None => {
                    // Machine code first (no JIT); the PTX if the device rejects it.
                    let binary = k
                        .cubin
                        .as_ref()
                        .and_then(|c| ctx.load_module(Ptx::from_binary(c.clone())).ok());
                    let m = match binary {
                        Some(m) => m,
                        None => ctx
                            .load_module(Ptx::from_src(ptx.clone()))
                            .map_err(load_error)?,
                    };
                    modules.insert(content_hash(ptx), m.clone());
                    m
                }
            };
            let f = module.load_function(&k.name).map_err(load_error)?;
            check_function(&f, k, &info)?;
            functions.push(Some(f));
        }

        let plan = plan_memory(artifact);
        // Refused before the first allocation, rather than failing halfway.
        let (free, _) = ctx
            .mem_get_info()
            .map_err(driver("reading the free memory"))?;
        if plan.peak_bytes() > free as u64 {
            return Err(RuntimeError::DeviceMemory {
                ordinal,
                needed: plan.peak_bytes(),
                free: free as u64,
            });
        }
        let alloc = |what: &str, bytes: u64| {
            stream
                .alloc_zeros::<u8>(bytes.max(1) as usize)
                .map_err(|e| RuntimeError::Alloc {
                    what: what.to_string(),
                    bytes,
                    error: format!("{e:?}"),
                })
        };
        let arena = alloc("the intermediates' arena", plan.arena_bytes)?;
        let mut owned: Vec<Option<CudaSlice<u8>>> = Vec::with_capacity(artifact.buffers.len());
        for b in &artifact.buffers {
            owned.push(match (b.view_of, plan.offsets[b.id as usize]) {
                (None, None) => Some(alloc(&format!("buffer {}", b.name), b.bytes)?),
                _ => None,
            });
        }
        for b in artifact.buffers.iter().filter(|b| b.data.is_some()) {
            let bytes = b.data.as_deref().unwrap_or_default();
            let dst = owned[b.id as usize].as_mut().ok_or_else(|| {
                RuntimeError::Signature(format!("constant {} is not a buffer of its own", b.name))
            })?;
            if bytes.len() as u64 != b.bytes {
                return Err(RuntimeError::Signature(format!(
                    "constant {} has {} bytes of data for {} bytes",
                    b.name,
                    bytes.len(),
                    b.bytes
                )));
            }
            stream
                .memcpy_htod(bytes, dst)
                .map_err(driver(format!("uploading constant {}", b.name)))?;
        }
        let arena_base = ptr_of(&arena, &stream);
        let pointer = |id: u32| -> u64 {
            let b = &artifact.buffers[id as usize];
            let root = b.view_of.unwrap_or(id) as usize;
            b.view_offset
                + match plan.offsets[root] {
                    Some(offset) => arena_base + offset,
                    None => ptr_of(
                        owned[root].as_ref().expect("unplanned roots are owned"),
                        &stream,
                    ),
                }
        };
        // Library calls: one handle and workspace, each call prepared once
        // (descriptors and algorithm) over the buffers it binds.
        let mut libraries: Option<Libraries> = None;
        let mut workspace_bytes = 0usize;
        let mut launches = Vec::with_capacity(artifact.launches.len());
        for l in &artifact.launches {
            let k = &artifact.kernels[l.kernel as usize];
            let name = if l.name.is_empty() {
                k.name.clone()
            } else {
                l.name.clone()
            };
            let args: Vec<u64> = l.args.iter().map(|&a| pointer(a)).collect();
            let tensor_maps = k
                .params
                .iter()
                .zip(&l.args)
                .map(|(p, &a)| {
                    let Some(map) = &p.tensor_map else {
                        return Ok(None);
                    };
                    let dtype = &artifact.buffers[a as usize].dtype;
                    encode_tensor_map(map, dtype, pointer(a))
                        .map(Some)
                        .map_err(|error| RuntimeError::Launch {
                            kernel: name.clone(),
                            error: format!("encoding the tensor map of `{}`: {error}", p.name),
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            let callee = match &k.library {
                None => Callee::Kernel {
                    kernel: l.kernel as usize,
                    config: LaunchConfig {
                        grid_dim: (k.grid[0], k.grid[1], k.grid[2]),
                        block_dim: (k.block[0], k.block[1], k.block[2]),
                        shared_mem_bytes: k.dynamic_shared,
                    },
                },
                Some(call) => {
                    let failed = |error: String| RuntimeError::Library {
                        launch: name.clone(),
                        error,
                    };
                    if libraries.is_none() {
                        // The libraries run on the context current on this thread.
                        ctx.bind_to_thread()
                            .map_err(driver("binding the context for the libraries"))?;
                        libraries = Some(Libraries {
                            blas: None,
                            dnn: None,
                            workspace: None,
                            matmuls: Vec::new(),
                            convs: Vec::new(),
                            chosen: Vec::new(),
                        });
                    }
                    let libs = libraries.as_mut().expect("made above");
                    match call {
                        LibraryCall::Cublaslt(call) => {
                            if libs.blas.is_none() {
                                libs.blas = Some(library::Handle::new().map_err(failed)?);
                            }
                            let handle = libs.blas.as_ref().expect("made above");
                            let matmul =
                                library::Matmul::new(handle, call, &args).map_err(failed)?;
                            workspace_bytes = workspace_bytes.max(library::WORKSPACE_BYTES);
                            let recorded = GemmCall {
                                algorithm: Some(matmul.algorithm_words()),
                                ..call.clone()
                            };
                            libs.record(l.kernel, LibraryCall::Cublaslt(recorded));
                            libs.matmuls.push(matmul);
                            Callee::Matmul(libs.matmuls.len() - 1)
                        }
                        LibraryCall::Cudnn(call) => {
                            if libs.dnn.is_none() {
                                libs.dnn =
                                    Some(cudnn::Handle::new(stream.cu_stream()).map_err(failed)?);
                            }
                            let handle = libs.dnn.as_ref().expect("made above");
                            let conv = cudnn::Conv::new(handle, call, &args).map_err(failed)?;
                            workspace_bytes = workspace_bytes.max(conv.workspace_bytes());
                            let recorded = ConvCall {
                                algorithm: Some(conv.algorithm_index()),
                                ..call.clone()
                            };
                            libs.record(l.kernel, LibraryCall::Cudnn(recorded));
                            libs.convs.push(conv);
                            Callee::Conv(libs.convs.len() - 1)
                        }
                    }
                }
            };
            launches.push(Resolved {
                name,
                callee,
                args,
                tensor_maps,
            });
        }
        if let Some(libs) = &mut libraries {
            libs.workspace = Some(alloc("the library workspace", workspace_bytes as u64)?);
        }
        let inputs = artifact
            .inputs
            .iter()
            .map(|&id| (id, artifact.buffers[id as usize].bytes))
            .collect();
        let outputs = artifact
            .outputs
            .iter()
            .map(|&id| {
                let b = &artifact.buffers[id as usize];
                let root = b.view_of.unwrap_or(id) as usize;
                let (owned, base) = match plan.offsets[root] {
                    Some(offset) => (None, offset),
                    None => (Some(root), 0),
                };
                OutputSlot {
                    owned,
                    offset: base + b.view_offset,
                    bytes: b.bytes,
                    computed: !matches!(
                        artifact.buffers[root].kind,
                        BufferKind::Input | BufferKind::Constant
                    ),
                }
            })
            .collect();
        Ok(Executor {
            ctx,
            stream,
            info,
            plan,
            kernel_names: artifact.kernels.iter().map(|k| k.name.clone()).collect(),
            functions,
            launches,
            libraries,
            owned,
            arena,
            inputs,
            outputs,
            graph: None,
        })
    }

    /// The device the artifact runs on.
    pub fn device(&self) -> &DeviceInfo {
        &self.info
    }

    /// Per kernel entry that is a library call (its index), the call with
    /// the algorithm the library chose on this device recorded: written into
    /// an artifact, a later run replays it without asking again.
    pub fn chosen_calls(&self) -> &[(u32, LibraryCall)] {
        self.libraries.as_ref().map_or(&[], |l| l.chosen.as_slice())
    }

    /// The memory plan in use.
    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// The kernel names, in the artifact's order.
    pub fn kernel_names(&self) -> &[String] {
        &self.kernel_names
    }

    /// Copies `bytes` into graph input `index`.
    pub fn set_input(&mut self, index: usize, bytes: &[u8]) -> Result<()> {
        let &(id, size) = self
            .inputs
            .get(index)
            .ok_or_else(|| RuntimeError::Signature(format!("the graph has no input {index}")))?;
        if bytes.len() as u64 != size {
            return Err(RuntimeError::Signature(format!(
                "input {index} has {size} bytes, got {}",
                bytes.len()
            )));
        }
        let dst = self.owned[id as usize].as_mut().expect("inputs are owned");
        self.stream
            .memcpy_htod(bytes, dst)
            .map_err(driver(format!("uploading input {index}")))
    }

    /// Fills every computed output and the whole arena with 0xFF bytes (NaN
    /// in every float dtype), so that an element no kernel writes shows up.
    pub fn poison(&mut self) -> Result<()> {
        let mut targets: Vec<(u64, usize)> = self
            .outputs
            .iter()
            .filter(|o| o.computed)
            .filter_map(|o| {
                let slice = self.owned[o.owned?].as_ref()?;
                Some((ptr_of(slice, &self.stream) + o.offset, o.bytes as usize))
            })
            .collect();
        targets.push((ptr_of(&self.arena, &self.stream), self.arena.len()));
        for (ptr, len) in targets {
            // SAFETY: `ptr..ptr+len` is one live allocation of this executor,
            // made on `self.stream`; bytes have no validity requirement.
            #[allow(unsafe_code)]
            unsafe {
                cudarc::driver::result::memset_d8_async(ptr, 0xFF, len, self.stream.cu_stream())
            }
            .map_err(driver("poisoning the outputs"))?;
        }
        Ok(())
    }

    /// Runs every launch in order and waits; a failure names the first kernel
    /// whose launch or execution failed (each launch is followed by a wait).
    pub fn run_checked(&mut self) -> Result<()> {
        for i in 0..self.launches.len() {
            let name = &self.launches[i].name;
            let failed = |error: String| RuntimeError::Launch {
                kernel: name.clone(),
                error,
            };
            self.enqueue(i).map_err(failed)?;
            self.stream
                .synchronize()
                .map_err(|e| failed(format!("{e:?}")))?;
        }
        Ok(())
    }

    /// Enqueues one forward pass (the captured graph when there is one) and
    /// waits for it.
    pub fn run(&mut self) -> Result<()> {
        self.enqueue_all()?;
        self.stream
            .synchronize()
            .map_err(driver("running the forward pass"))
    }

    /// One checked forward pass on `inputs` (one byte string per graph
    /// input): uploads them, poisons the outputs, runs launch by launch and
    /// returns every output's bytes.
    pub fn run_once(&mut self, inputs: &[Vec<u8>]) -> Result<Vec<Vec<u8>>> {
        for (i, bytes) in inputs.iter().enumerate() {
            self.set_input(i, bytes)?;
        }
        self.poison()?;
        self.run_checked()?;
        (0..self.outputs.len())
            .map(|i| self.read_output(i))
            .collect()
    }

    /// Captures one forward pass as a CUDA graph; later runs replay it.
    pub fn capture_graph(&mut self) -> Result<()> {
        self.graph = None;
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver("beginning graph capture"))?;
        let enqueued = (0..self.launches.len()).try_for_each(|i| self.enqueue(i));
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(driver("ending graph capture"))?;
        enqueued.map_err(|error| RuntimeError::Driver {
            what: "capturing the launches".into(),
            error,
        })?;
        let graph = graph.ok_or_else(|| RuntimeError::Driver {
            what: "capturing the forward pass".into(),
            error: "the capture produced no graph".into(),
        })?;
        graph.upload().map_err(driver("uploading the graph"))?;
        self.graph = Some(graph);
        Ok(())
    }

    /// Times `reps` forward passes after `warmup`, each between two events.
    pub fn bench(&mut self, warmup: usize, reps: usize) -> Result<Timing> {
        self.timed(warmup, reps, None)
    }

    /// Like [`Executor::bench`], with the L2 cache flushed before each timed
    /// pass (a `flush_bytes` buffer is overwritten outside the events), so
    /// a pass reads its inputs from device memory as in a larger model.
    pub fn bench_cold(&mut self, warmup: usize, reps: usize, flush_bytes: usize) -> Result<Timing> {
        let mut flush = self
            .stream
            .alloc_zeros::<u8>(flush_bytes.max(1))
            .map_err(|e| RuntimeError::Alloc {
                what: "the L2 flush buffer".into(),
                bytes: flush_bytes as u64,
                error: format!("{e:?}"),
            })?;
        self.timed(warmup, reps, Some(&mut flush))
    }

    /// `reps` passes after `warmup`, each between two events, `flush`
    /// zeroed before each (outside the events).
    fn timed(
        &mut self,
        warmup: usize,
        reps: usize,
        mut flush: Option<&mut CudaSlice<u8>>,
    ) -> Result<Timing> {
        for _ in 0..warmup {
            self.enqueue_all()?;
        }
        let mut ms = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            if let Some(flush) = flush.as_deref_mut() {
                self.stream
                    .memset_zeros(flush)
                    .map_err(driver("flushing the L2 cache"))?;
            }
            let (start, end) = (self.event()?, self.event()?);
            start
                .record(&self.stream)
                .map_err(driver("recording an event"))?;
            self.enqueue_all()?;
            end.record(&self.stream)
                .map_err(driver("recording an event"))?;
            end.synchronize()
                .map_err(driver("running the forward pass"))?;
            ms.push(f64::from(
                start.elapsed_ms(&end).map_err(driver("reading an event"))?,
            ));
        }
        Ok(Timing::of(ms))
    }

    /// Median time of each launch over `reps` passes launched one by one
    /// (no graph), milliseconds, in launch order with the launch's name.
    pub fn per_launch(&mut self, reps: usize) -> Result<Vec<(String, f64)>> {
        let n = self.launches.len();
        let mut samples = vec![Vec::with_capacity(reps); n];
        for _ in 0..reps.max(1) {
            let events = (0..=n).map(|_| self.event()).collect::<Result<Vec<_>>>()?;
            events[0]
                .record(&self.stream)
                .map_err(driver("recording an event"))?;
            for i in 0..n {
                self.enqueue(i).map_err(|error| RuntimeError::Driver {
                    what: "launching".into(),
                    error,
                })?;
                events[i + 1]
                    .record(&self.stream)
                    .map_err(driver("recording an event"))?;
            }
            events[n]
                .synchronize()
                .map_err(driver("running the forward pass"))?;
            for i in 0..n {
                let t = events[i]
                    .elapsed_ms(&events[i + 1])
                    .map_err(driver("reading an event"))?;
                samples[i].push(f64::from(t));
            }
        }
        Ok(samples
            .into_iter()
            .enumerate()
            .map(|(i, s)| (self.launches[i].name.clone(), Timing::of(s).median_ms))
            .collect())
    }

    /// The bytes of graph output `index`.
    pub fn read_output(&self, index: usize) -> Result<Vec<u8>> {
        let o = self
            .outputs
            .get(index)
            .ok_or_else(|| RuntimeError::Signature(format!("the graph has no output {index}")))?;
        let mut host = vec![0u8; o.bytes as usize];
        let src = match o.owned {
            Some(root) => self.owned[root]
                .as_ref()
                .expect("unplanned roots are owned"),
            None => &self.arena,
        };
        let range = o.offset as usize..(o.offset + o.bytes) as usize;
        self.stream
            .memcpy_dtoh(&src.slice(range), &mut host)
            .map_err(driver(format!("downloading output {index}")))?;
        self.stream
            .synchronize()
            .map_err(driver(format!("downloading output {index}")))?;
        Ok(host)
    }

    fn event(&self) -> Result<cudarc::driver::CudaEvent> {
        self.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))
    }

    fn enqueue_all(&mut self) -> Result<()> {
        match &self.graph {
            Some(g) => g.launch().map_err(driver("replaying the graph")),
            None => (0..self.launches.len()).try_for_each(|i| {
                self.enqueue(i).map_err(|error| RuntimeError::Launch {
                    kernel: self.launches[i].name.clone(),
                    error,
                })
            }),
        }
    }

    /// Enqueues launch `i`; `Err` is the driver's or the library's word.
    fn enqueue(&self, i: usize) -> std::result::Result<(), String> {
        let l = &self.launches[i];
        match l.callee {
            Callee::Kernel { kernel, config } => {
                let function = self.functions[kernel]
                    .as_ref()
                    .expect("a kernel launch names a loaded function");
                let mut builder = self.stream.launch_builder(function);
                for (a, map) in l.args.iter().zip(&l.tensor_maps) {
                    match map {
                        Some(map) => builder.arg(&map.opaque),
                        None => builder.arg(a),
                    };
                }
                // SAFETY: the artifact's kernels take one parameter per launch
                // argument, in order (dcir-cuda's contract, checked when the
                // artifact was built): a pointer, or a `CUtensorMap` by value
                // where the parameter has a tensor map (encoded over the same
                // buffer, its extent checked by `Artifact::validate`); each pointer is the start of a live buffer of
                // this executor of the size the artifact gives that value (own
                // allocations, or arena offsets the memory plan keeps disjoint from
                // every buffer live at the same launch), and the kernels stay inside
                // their buffers. The launch shape passed `check_function`.
                #[allow(unsafe_code)]
                unsafe { builder.launch(config) }
                    .map(|_| ())
                    .map_err(|e| format!("{e:?}"))
            }
            Callee::Matmul(i) | Callee::Conv(i) => {
                let libs = self
                    .libraries
                    .as_ref()
                    .expect("a library launch has its libraries");
                // The libraries launch on the context current on this thread.
                self.ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
                let workspace = ptr_of(
                    libs.workspace
                        .as_ref()
                        .expect("allocated once the calls were prepared"),
                    &self.stream,
                );
                match (l.callee, &libs.blas, &libs.dnn) {
                    (Callee::Matmul(_), Some(blas), _) => {
                        libs.matmuls[i].enqueue(blas, workspace, self.stream.cu_stream())
                    }
                    (_, _, Some(dnn)) => libs.convs[i].enqueue(dnn, workspace),
                    _ => unreachable!("a prepared call has its library's handle"),
                }
            }
        }
    }
}

/// The device pointer of `slice` (event tracking is off: no sync object).
fn ptr_of(slice: &CudaSlice<u8>, stream: &CudaStream) -> u64 {
    let (ptr, _sync) = slice.device_ptr(stream);
    ptr
}

fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo> {
    use CUdevice_attribute as A;
    let attr = |a| {
        ctx.attribute(a)
            .map_err(driver("reading device attributes"))
    };
    let memory_clock_hz = attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? as f64 * 1e3;
    let bus_bytes = attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)? as f64 / 8.0;
    Ok(DeviceInfo {
        name: ctx.name().map_err(driver("reading the device name"))?,
        compute_capability: ctx
            .compute_capability()
            .map_err(driver("reading the compute capability"))?,
        sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        max_shared_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
            as u64,
        total_memory: ctx.total_mem().map_err(driver("reading the memory size"))? as u64,
        max_threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)? as u32,
        max_threads_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32,
        max_blocks_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)? as u32,
        shared_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as u64,
        registers_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)? as u32,
        l2_bytes: attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
        clock_hz: attr(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? as f64 * 1e3,
        theoretical_bandwidth: memory_clock_hz * bus_bytes * 2.0,
        driver_version: driver_version_code()?,
    })
}

/// `cuDriverGetVersion` (`1000 * major + 10 * minor`).
fn driver_version_code() -> Result<i32> {
    let mut version = 0;
    // SAFETY: the driver library is loaded (callers check), the call needs no
    // context, and it writes one int through the pointer.
    #[allow(unsafe_code)]
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(driver("reading the driver version"))?;
    Ok(version)
}

/// Encodes `map` over the buffer of `dtype` elements at device address
/// `base` (`cuTensorMapEncodeTiled`, every element stride 1; or
/// `cuTensorMapEncodeIm2col` for an im2col map; L2 promotion of 256 bytes,
/// zeros outside the tensor): the descriptor a kernel parameter with a
/// tensor map is passed.
pub fn encode_tensor_map(
    map: &dcir_artifact::TensorMap,
    dtype: &str,
    base: u64,
) -> std::result::Result<CUtensorMap, String> {
    use CUtensorMapDataType as T;
    let data_type = match dtype {
        "f16" => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        "bf16" => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        "f32" => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        "i32" => T::CU_TENSOR_MAP_DATA_TYPE_INT32,
        other => return Err(format!("no tensor map of {other} elements")),
    };
    let swizzle = match map.swizzle {
        0 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        32 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        64 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        128 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        other => return Err(format!("a swizzle of {other} bytes")),
    };
    let rank = map.dims.len();
    let boxes = if map.im2col.is_some() { 2 } else { rank };
    if map.strides.len() + 1 != rank || map.box_dims.len() != boxes {
        return Err("dims, strides and box extents disagree".into());
    }
    let address = (base + map.offset) as *mut std::ffi::c_void;
    let (interleave, promotion, fill) = (
        CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
        CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    );
    let mut out = CUtensorMap { opaque: [0; 16] };
    let status = match &map.im2col {
        None => {
            let element_strides = vec![1u32; rank];
            // SAFETY: every array holds `rank` entries (`strides` `rank - 1`),
            // as the driver reads them; `out` is a writable descriptor; the
            // address is a live buffer of this executor that the descriptor's
            // extent stays inside (`Artifact::validate` checked it against the
            // buffer's size).
            #[allow(unsafe_code)]
            unsafe {
                cudarc::driver::sys::cuTensorMapEncodeTiled(
                    &mut out,
                    data_type,
                    rank as u32,
                    address,
                    map.dims.as_ptr(),
                    map.strides.as_ptr(),
                    map.box_dims.as_ptr(),
                    element_strides.as_ptr(),
                    interleave,
                    swizzle,
                    promotion,
                    fill,
                )
            }
        }
        Some(im) => {
            if im.lower.len() + 2 != rank
                || im.upper.len() + 2 != rank
                || im.element_strides.len() != rank
            {
                return Err("dims, im2col corners and element strides disagree".into());
            }
            // SAFETY: as above; the corners hold `rank - 2` entries and the
            // element strides `rank`, as the driver reads them.
            #[allow(unsafe_code)]
            unsafe {
                cudarc::driver::sys::cuTensorMapEncodeIm2col(
                    &mut out,
                    data_type,
                    rank as u32,
                    address,
                    map.dims.as_ptr(),
                    map.strides.as_ptr(),
                    im.lower.as_ptr(),
                    im.upper.as_ptr(),
                    map.box_dims[0],
                    map.box_dims[1],
                    im.element_strides.as_ptr(),
                    interleave,
                    swizzle,
                    promotion,
                    fill,
                )
            }
        }
    };
    status.result().map(|()| out).map_err(|e| format!("{e:?}"))
}

/// Checks a loaded kernel's shared memory and block size against the device,
/// and raises its dynamic shared-memory limit when it needs more than 48 KiB.
fn check_function(
    f: &CudaFunction,
    k: &dcir_artifact::KernelEntry,
    info: &DeviceInfo,
) -> Result<()> {
    let attr = |a| {
        f.get_attribute(a).map_err(|e| RuntimeError::Load {
            kernel: k.name.clone(),
            error: format!("{e:?}"),
        })
    };
    let static_shared = attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)? as u64;
    let needed = static_shared + u64::from(k.dynamic_shared);
    if needed > info.max_shared_per_block {
        return Err(RuntimeError::SharedMemory {
            kernel: k.name.clone(),
            needed,
            limit: info.max_shared_per_block,
        });
    }
    // Static and dynamic shared memory together above the default 48 KiB
    // need the function's opt-in (a 48 KiB ring plus split-K's flag is 48 KiB + 1).
    if needed > 48 * 1024 {
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            k.dynamic_shared as i32,
        )
        .map_err(|e| RuntimeError::Load {
            kernel: k.name.clone(),
            error: format!("raising the dynamic shared-memory limit: {e:?}"),
        })?;
    }
    let max_threads = attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)? as u32;
    let threads = k.block.iter().product::<u32>();
    if threads > max_threads {
        return Err(RuntimeError::Launch {
            kernel: k.name.clone(),
            error: format!("block of {threads} threads, the kernel allows at most {max_threads}"),
        });
    }
    Ok(())
}
