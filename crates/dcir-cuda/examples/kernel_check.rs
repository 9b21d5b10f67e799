//! GPU correctness and timing of the kernels dcir-cuda emits.
//!
//! ```sh
//! kernel_check [--reps N] [--seed S] [--no-gpu] [--no-check] FILE.dcir...
//! ```
//!
//! `--no-gpu` does everything but the device steps (fusion, lowering, NVRTC,
//! the interpreter's reference); its rows read `built`. `--no-check` skips
//! the interpreter (for sizes it would take minutes on): every value gets
//! seeded random contents and the rows read `timed`.
//!
//! For every graph of every file (a line `// -----` splits a file into
//! independent modules, as in the filetests):
//!
//! 1. read and verify it, fuse it with the H200 cost model unless it already
//!    has `fused` ops, lower every group with dcir-cuda and compile it with
//!    NVRTC (`sm_90`);
//! 2. evaluate the fused graph on the CPU interpreter, op by op, from seeded
//!    random inputs, keeping every group's operand and result tensors;
//! 3. per kernel: upload the group's inputs, fill its outputs with 0xFF bytes
//!    (NaN for f32/f16/bf16, so an unwritten element fails), launch with the
//!    kernel's grid and block, copy back and compare with the interpreter
//!    under the dtype's default tolerance;
//! 4. time it: warm-up, then `--reps` launches (default 200) each between two
//!    CUDA events; the median is reported. Launches rotate among enough copies
//!    of the inputs and outputs that the set is 3x the L2 (capped at 512
//!    copies), so memory-bound kernels are not timed out of the cache;
//!    bandwidth = (input bytes + output bytes) / median time;
//!    TFLOP/s = the group's matmul/conv flops (2 per multiply-add) / median;
//! 5. print a markdown table (with ptxas's registers per thread), also
//!    written to `$OUT/kernel_check.md` when `OUT` is set.
//!
//! Exit code 0 only when every kernel compiled, ran and matched. A group of a
//! kind dcir-cuda does not lower yet is listed as `skip` (not a failure).
//! Without a CUDA driver the program says so and exits 1.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use dcir_cuda::kir::Kernel;
use dcir_fusion::{CostModel, DeviceSpec, apply_plan, plan_graph};
use dcir_interp::{Tensor, TensorData, Tolerance, compare, eval_op, random_inputs, run_graph};
use dcir_ir::{DType, Graph, OpId, OpKind, TensorType, ValueId, verify_module};
use half::{bf16, f16};

/// Timing launches before the measured ones.
const WARMUP: usize = 10;
/// Most copies of a kernel's buffers to rotate among.
const MAX_COPIES: usize = 512;

/// Command-line options.
struct Options {
    reps: usize,
    seed: u64,
    no_gpu: bool,
    no_check: bool,
    files: Vec<String>,
}

/// One line of the report.
struct Row {
    kernel: String,
    kind: String,
    dtype: String,
    shape: String,
    elements: usize,
    /// `PASS`, `FAIL`, `ERROR`, `skip`, `built` (`--no-gpu`) or `timed` (`--no-check`).
    check: &'static str,
    rel_l2: Option<f64>,
    max_abs: Option<f64>,
    median_us: Option<f64>,
    /// Bytes of inputs plus outputs, each counted once.
    bytes: usize,
    /// Flops of the group's contractions (matmul, conv2d).
    flops: f64,
    /// Registers per thread (ptxas).
    registers: Option<u32>,
    /// Copies of the buffers the timing rotated among.
    copies: usize,
    /// Whether the rotated set still fits in L2 (bandwidth then is L2's).
    fits_l2: bool,
}

impl Row {
    fn failed(&self) -> bool {
        matches!(self.check, "FAIL" | "ERROR")
    }
}

fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("kernel_check: {e}");
            eprintln!(
                "usage: kernel_check [--reps N] [--seed S] [--no-gpu] [--no-check] FILE.dcir..."
            );
            return ExitCode::from(2);
        }
    };
    // Probe both libraries before any call that would panic without them.
    if !options.no_gpu && !driver_present() {
        eprintln!(
            "kernel_check: error: no CUDA driver (libcuda.so not found); \
             run this on a machine with an NVIDIA GPU and driver"
        );
        return ExitCode::from(1);
    }
    if let Some(reason) = dcir_cuda::nvrtc::unavailable_reason() {
        eprintln!(
            "kernel_check: error: {reason} (on the GPU machine: LD_LIBRARY_PATH=/usr/local/cuda/lib64)"
        );
        return ExitCode::from(1);
    }
    let ctx = if options.no_gpu {
        None
    } else {
        match CudaContext::new(0) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("kernel_check: error: cannot open CUDA device 0: {e:?}");
                return ExitCode::from(1);
            }
        }
    };
    let device = match &ctx {
        Some(c) => c.name().unwrap_or_else(|_| "?".into()),
        None => "none (--no-gpu)".to_string(),
    };
    println!(
        "device 0: {device}; reps {}, seed {}",
        options.reps, options.seed
    );

    let spec = DeviceSpec::h200();
    let mut rows = Vec::new();
    let mut errors = 0usize;
    for file in &options.files {
        if let Err(e) = check_file(ctx.as_ref(), &spec, &options, file, &mut rows) {
            eprintln!("{file}: error: {e}");
            errors += 1;
        }
    }
    let table = markdown_table(&rows, &spec, &device, &options);
    println!("\n{table}");
    if let Ok(dir) = std::env::var("OUT") {
        let path = std::path::Path::new(&dir).join("kernel_check.md");
        if let Err(e) = std::fs::write(&path, &table) {
            eprintln!("kernel_check: cannot write {}: {e}", path.display());
            errors += 1;
        }
    }
    let failed = rows.iter().filter(|r| r.failed()).count();
    if failed + errors > 0 {
        eprintln!("kernel_check: {failed} kernel(s) failed, {errors} file error(s)");
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        reps: 200,
        seed: 1,
        no_gpu: false,
        no_check: false,
        files: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" | "--seed" => {
                let v = args.next().ok_or(format!("{a} needs a value"))?;
                let n: u64 = v.parse().map_err(|_| format!("{a}: not a number: {v}"))?;
                if a == "--reps" {
                    options.reps = (n as usize).max(1);
                } else {
                    options.seed = n;
                }
            }
            "--no-gpu" => options.no_gpu = true,
            "--no-check" => options.no_check = true,
            "-h" | "--help" => return Err("help".into()),
            f if f.starts_with('-') => return Err(format!("unknown option {f}")),
            f => options.files.push(f.to_string()),
        }
    }
    if options.files.is_empty() {
        return Err("no input files".into());
    }
    Ok(options)
}

/// Whether libcuda can be loaded.
#[allow(unsafe_code)]
fn driver_present() -> bool {
    // SAFETY: the probe only tries to dlopen the driver library by its
    // candidate names and drops it; it calls no driver function.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Reads, fuses and checks every graph of `file`, appending a row per kernel.
fn check_file(
    ctx: Option<&Arc<CudaContext>>,
    spec: &DeviceSpec,
    options: &Options,
    file: &str,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let source = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    let model = CostModel::kernels_only(spec.clone());
    for case in split_cases(&source) {
        let mut module =
            dcir_reader::parse_module(&case).map_err(|d| dcir_reader::render(file, &case, &d))?;
        verify_module(&module).map_err(|e| format!("does not verify: {e:?}"))?;
        for graph in &mut module.graphs {
            let fused = graph
                .all_ops()
                .iter()
                .any(|&o| graph.op(o).kind == OpKind::Fused);
            if !fused {
                let plan = plan_graph(graph, &model, &dcir_cuda::CudaTarget)?;
                *graph = apply_plan(graph, &plan)?;
            }
        }
        verify_module(&module).map_err(|e| format!("the fused IR does not verify: {e:?}"))?;
        for graph in &module.graphs {
            println!("== {file} @{}", graph.name());
            check_graph(ctx, spec, options, graph, rows)?;
        }
    }
    Ok(())
}

/// The parts of `source` between `// -----` lines.
fn split_cases(source: &str) -> Vec<String> {
    let mut cases = vec![String::new()];
    for line in source.split_inclusive('\n') {
        if line.trim_end() == "// -----" {
            cases.push(String::new());
        } else {
            cases.last_mut().expect("one case at least").push_str(line);
        }
    }
    cases
        .into_iter()
        .filter(|c| c.lines().any(|l| l.trim_start().starts_with("graph")))
        .collect()
}

/// Interprets `graph` op by op and returns every value it computed (the
/// graph's parameters included), so each group's operands and results are known.
fn reference_values(graph: &Graph, seed: u64) -> Result<HashMap<ValueId, Tensor>, String> {
    let mut env: HashMap<ValueId, Tensor> = HashMap::new();
    for (&p, t) in graph.params().iter().zip(random_inputs(graph, seed)) {
        env.insert(p, t);
    }
    for &op in &graph.block(graph.body()).ops {
        let data = graph.op(op);
        if data.kind.info().is_terminator {
            break;
        }
        let results = if let Some(region) = data.region {
            // A fused op: bind its region arguments to its operands, walk the
            // region, and take the yielded values. Region values live in a
            // separate map that is dropped afterwards.
            let mut inner: HashMap<ValueId, Tensor> = HashMap::new();
            for (&arg, v) in graph.block(region).args.iter().zip(&data.operands) {
                inner.insert(arg, env[v].clone());
            }
            let mut yielded = None;
            for &o in &graph.block(region).ops {
                let d = graph.op(o);
                if d.kind.info().is_terminator {
                    yielded = Some(d.operands.iter().map(|v| inner[v].clone()).collect());
                    break;
                }
                let out = eval(graph, o, &inner)?;
                inner.extend(d.results.iter().copied().zip(out));
            }
            yielded.ok_or("a fused region without yield")?
        } else {
            eval(graph, op, &env)?
        };
        env.extend(data.results.iter().copied().zip(results));
    }
    Ok(env)
}

/// Self-check of [`reference_values`] (`--no-gpu` only, it costs a second
/// interpretation): the graph's outputs must equal `run_graph`'s exactly.
fn check_reference(
    graph: &Graph,
    seed: u64,
    values: &HashMap<ValueId, Tensor>,
) -> Result<(), String> {
    let want = run_graph(graph, &random_inputs(graph, seed)).map_err(|e| e.to_string())?;
    let outputs = graph.outputs().ok_or("the graph has no return")?;
    for (w, v) in want.iter().zip(outputs) {
        compare(w, &values[v], &Tolerance::EXACT)
            .map_err(|m| format!("op-by-op reference differs from run_graph: {m}"))?;
    }
    Ok(())
}

/// One non-structural op on values of `env`.
fn eval(graph: &Graph, op: OpId, env: &HashMap<ValueId, Tensor>) -> Result<Vec<Tensor>, String> {
    let d = graph.op(op);
    let operands: Vec<&Tensor> = d.operands.iter().map(|v| &env[v]).collect();
    let types: Vec<TensorType> = d.results.iter().map(|&r| graph.ty(r).clone()).collect();
    eval_op(d.kind, &d.attrs, &operands, &types).map_err(|e| e.to_string())
}

/// Lowers, runs, checks and times every group of a fused graph.
fn check_graph(
    ctx: Option<&Arc<CudaContext>>,
    spec: &DeviceSpec,
    options: &Options,
    graph: &Graph,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let values = if options.no_check {
        placeholder_values(graph, options.seed)
    } else {
        reference_values(graph, options.seed)?
    };
    if options.no_gpu && !options.no_check {
        check_reference(graph, options.seed, &values)?;
    }
    let groups: Vec<OpId> = graph
        .block(graph.body())
        .ops
        .iter()
        .copied()
        .filter(|&o| graph.op(o).kind == OpKind::Fused)
        .collect();
    for op in groups {
        let data = graph.op(op);
        let results = &data.results;
        let out_ty = graph.ty(results[0]);
        let mut row = Row {
            kernel: dcir_cuda::kernel_name(graph, op),
            kind: data
                .attrs
                .get("kind")
                .and_then(dcir_ir::Attr::as_str)
                .unwrap_or("?")
                .to_string(),
            dtype: out_ty.dtype.name().to_string(),
            shape: format!("{:?}", out_ty.dims()),
            elements: out_ty.num_elements().unwrap_or(0),
            check: "ERROR",
            rel_l2: None,
            max_abs: None,
            median_us: None,
            bytes: data
                .operands
                .iter()
                .chain(results)
                .map(|&v| graph.ty(v).size_bytes().unwrap_or(0))
                .sum(),
            flops: group_flops(graph, op),
            registers: None,
            copies: 0,
            fits_l2: false,
        };
        let kernel = match dcir_cuda::lower_fused(graph, op) {
            Ok(k) => k,
            Err(e) => {
                println!("  {}: skip ({e})", row.kernel);
                row.check = "skip";
                rows.push(row);
                continue;
            }
        };
        let inputs: Vec<&Tensor> = data.operands.iter().map(|v| &values[v]).collect();
        let expected: Vec<&Tensor> = results.iter().map(|v| &values[v]).collect();
        let outcome = match ctx {
            Some(ctx) => {
                let expected = Expected {
                    tensors: &expected,
                    graph,
                };
                run_kernel(ctx, spec, options, &kernel, &inputs, &expected, &mut row)
            }
            None => compile(&kernel).map(|c| {
                row.registers = c.resources.map(|r| r.registers);
                row.check = "built";
            }),
        };
        if let Err(e) = outcome {
            println!("  {}: ERROR {e}", row.kernel);
            row.check = "ERROR";
        }
        if row.check == "built" {
            println!(
                "  {} [{}] {} {}: built",
                row.kernel, row.kind, row.dtype, row.shape
            );
            rows.push(row);
            continue;
        }
        println!(
            "  {} [{}] {} {}: {} rel-L2 {} max-abs {} median {} us, {:.3} TB/s, {:.1} TFLOP/s, {} regs ({} copies{})",
            row.kernel,
            row.kind,
            row.dtype,
            row.shape,
            row.check,
            fmt_opt(row.rel_l2, "e"),
            fmt_opt(row.max_abs, "e"),
            fmt_opt(row.median_us, "f"),
            tbps(&row).unwrap_or(0.0),
            tflops(&row).unwrap_or(0.0),
            row.registers.map_or("?".into(), |r| r.to_string()),
            row.copies,
            if row.fits_l2 { ", set fits in L2" } else { "" }
        );
        rows.push(row);
    }
    Ok(())
}

/// The PTX of `kernel` and ptxas's report (NVRTC, `sm_90`); a spill or a
/// stack frame is an error.
fn compile(kernel: &Kernel) -> Result<dcir_cuda::nvrtc::Compiled, String> {
    let source = dcir_cuda::print_kernel(kernel);
    let arch = dcir_cuda::kernel_arch(kernel, dcir_cuda::nvrtc::DEFAULT_ARCH)?;
    let c = dcir_cuda::nvrtc::compile(&source, &kernel.name, arch)?;
    if let Some(why) = c.resources.and_then(|r| r.violation(kernel.block)) {
        return Err(format!("ptxas: {why}"));
    }
    Ok(c)
}

/// Flops of the matmuls and convolutions inside group `op` (2 per multiply-add).
fn group_flops(graph: &Graph, op: OpId) -> f64 {
    let Some(region) = graph.op(op).region else {
        return 0.0;
    };
    let mut flops = 0.0;
    for &o in &graph.block(region).ops {
        let d = graph.op(o);
        let outputs = || graph.ty(d.results[0]).num_elements().unwrap_or(0) as f64;
        match d.kind {
            OpKind::Matmul => {
                let a = graph.ty(d.operands[0]).dims();
                let transposed =
                    matches!(d.attrs.get("transpose_a"), Some(dcir_ir::Attr::Bool(true)));
                let k = if transposed {
                    a[a.len() - 2]
                } else {
                    a[a.len() - 1]
                };
                flops += 2.0 * outputs() * k as f64;
            }
            // Weight [OC, C/groups, KH, KW]: each output sums C/groups*KH*KW products.
            OpKind::Conv2d => {
                let w = graph.ty(d.operands[1]).dims();
                flops += 2.0 * outputs() * w[1..].iter().product::<usize>() as f64;
            }
            _ => {}
        }
    }
    flops
}

/// Every value of `graph` filled with seeded random contents, without
/// interpreting anything (`--no-check`): parameters as `random_inputs`
/// draws them, every op result uniform in [-1, 1).
fn placeholder_values(graph: &Graph, seed: u64) -> HashMap<ValueId, Tensor> {
    let mut env: HashMap<ValueId, Tensor> = graph
        .params()
        .iter()
        .copied()
        .zip(random_inputs(graph, seed))
        .collect();
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    for &op in &graph.block(graph.body()).ops {
        for &r in &graph.op(op).results {
            let ty = graph.ty(r).clone();
            let n = ty.num_elements().unwrap_or(0);
            let mut next = || {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
            };
            let data = match ty.dtype {
                DType::F32 => TensorData::F32((0..n).map(|_| next() as f32).collect()),
                DType::F16 => TensorData::F16((0..n).map(|_| f16::from_f64(next())).collect()),
                DType::BF16 => TensorData::BF16((0..n).map(|_| bf16::from_f64(next())).collect()),
                DType::I32 => TensorData::I32(vec![0; n]),
                DType::I64 => TensorData::I64(vec![0; n]),
                DType::Bool => TensorData::Bool(vec![false; n]),
            };
            if let Ok(t) = Tensor::new(ty, data) {
                env.insert(r, t);
            }
        }
    }
    env
}

/// Compiles and loads `kernel`, checks it against `expected`, and times it.
/// A group's reference results, and the graph whose dtypes set their tolerance.
struct Expected<'a> {
    tensors: &'a [&'a Tensor],
    graph: &'a Graph,
}

fn run_kernel(
    ctx: &Arc<CudaContext>,
    spec: &DeviceSpec,
    options: &Options,
    kernel: &Kernel,
    inputs: &[&Tensor],
    expected: &Expected,
    row: &mut Row,
) -> Result<(), String> {
    let compiled = compile(kernel)?;
    row.registers = compiled.resources.map(|r| r.registers);
    let ptx = compiled.ptx;
    let stream = &ctx.default_stream();
    let module = ctx.load_module(Ptx::from_src(ptx)).map_err(driver)?;
    let function = module.load_function(&kernel.name).map_err(driver)?;
    // Static and dynamic shared memory above the default 48 KiB need the opt-in.
    let static_shared = function
        .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
        .map_err(driver)? as usize;
    if kernel.dynamic_shared + static_shared > 48 * 1024 {
        function
            .set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                kernel.dynamic_shared as i32,
            )
            .map_err(driver)?;
    }
    let cfg = LaunchConfig {
        grid_dim: (kernel.grid, 1, 1),
        block_dim: (kernel.block, 1, 1),
        shared_mem_bytes: kernel.dynamic_shared as u32,
    };

    // Correctness: the inputs, poisoned outputs, one launch, compare.
    let bufs = upload_set(stream, inputs, expected.tensors, kernel)?;
    launch(stream, &function, cfg, kernel, &bufs)?;
    stream.synchronize().map_err(driver)?;
    if options.no_check {
        row.check = "timed";
    } else {
        check_outputs(stream, kernel, inputs.len(), expected, &bufs, row)?;
        check_scratch_zeroed(stream, kernel, &bufs, row)?;
    }
    time_kernel(ctx, spec, options, (&function, kernel), cfg, bufs, row)
}

/// Copies the kernel's outputs back and compares them with the interpreter's.
fn check_outputs(
    stream: &Arc<CudaStream>,
    kernel: &Kernel,
    n_in: usize,
    expected: &Expected,
    bufs: &[CudaSlice<u8>],
    row: &mut Row,
) -> Result<(), String> {
    let mut worst: Option<(f64, f64)> = None;
    let mut failure = None;
    for (k, want) in expected.tensors.iter().enumerate() {
        let bytes = stream.clone_dtoh(&bufs[n_in + k]).map_err(driver)?;
        let got = from_bytes(want.ty(), &bytes)?;
        let tolerance = Tolerance::for_output_of(expected.graph, want.dtype());
        match compare(want, &got, &tolerance) {
            Ok(s) => {
                let (r, m) = worst.unwrap_or((0.0, 0.0));
                worst = Some((r.max(s.rel_l2), m.max(s.max_abs)));
            }
            Err(m) => {
                failure.get_or_insert(format!("result {k}: {m}"));
            }
        }
    }
    if let Some((r, m)) = worst {
        row.rel_l2 = Some(r);
        row.max_abs = Some(m);
    }
    row.check = if let Some(f) = &failure {
        println!("  {}: FAIL {f}", kernel.name);
        "FAIL"
    } else {
        "PASS"
    };
    Ok(())
}

/// Times `function`: warm-up, then `options.reps` launches between events.
fn time_kernel(
    ctx: &Arc<CudaContext>,
    spec: &DeviceSpec,
    options: &Options,
    (function, kernel): (&CudaFunction, &Kernel),
    cfg: LaunchConfig,
    bufs: Vec<CudaSlice<u8>>,
    row: &mut Row,
) -> Result<(), String> {
    let stream = &ctx.default_stream();

    // Timing: enough copies of the buffers that the rotated set exceeds the
    // L2 three times over, each a separate allocation.
    let set_bytes = row.bytes.max(1);
    let copies = (3 * spec.l2_bytes as usize)
        .div_ceil(set_bytes)
        .clamp(1, MAX_COPIES);
    row.copies = copies;
    row.fits_l2 = copies * set_bytes <= spec.l2_bytes as usize;
    let mut sets = vec![bufs];
    for _ in 1..copies {
        let copy: Result<Vec<_>, _> = sets[0].iter().map(|b| stream.clone_dtod(b)).collect();
        sets.push(copy.map_err(driver)?);
    }
    for i in 0..WARMUP {
        launch(stream, function, cfg, kernel, &sets[i % copies])?;
    }
    let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let starts = (0..options.reps)
        .map(|_| event())
        .collect::<Result<Vec<_>, _>>();
    let ends = (0..options.reps)
        .map(|_| event())
        .collect::<Result<Vec<_>, _>>();
    let (starts, ends) = (starts.map_err(driver)?, ends.map_err(driver)?);
    for i in 0..options.reps {
        starts[i].record(stream).map_err(driver)?;
        launch(stream, function, cfg, kernel, &sets[(WARMUP + i) % copies])?;
        ends[i].record(stream).map_err(driver)?;
    }
    stream.synchronize().map_err(driver)?;
    ctx.check_err().map_err(driver)?;
    let mut times_us = Vec::with_capacity(options.reps);
    for (s, e) in starts.iter().zip(&ends) {
        times_us.push(f64::from(s.elapsed_ms(e).map_err(driver)?) * 1e3);
    }
    times_us.sort_by(f64::total_cmp);
    row.median_us = Some(times_us[times_us.len() / 2]);
    Ok(())
}

/// One set of device buffers for a kernel: the inputs' values, the
/// outputs filled with 0xFF bytes (NaN in every float dtype), then the
/// kernel's scratch: zeroed where it must read zero, else poisoned too.
fn upload_set(
    stream: &Arc<CudaStream>,
    inputs: &[&Tensor],
    outputs: &[&Tensor],
    kernel: &Kernel,
) -> Result<Vec<CudaSlice<u8>>, String> {
    let mut bufs = Vec::with_capacity(inputs.len() + outputs.len() + kernel.scratch.len());
    for t in inputs {
        bufs.push(stream.clone_htod(&to_bytes(t)).map_err(driver)?);
    }
    for t in outputs {
        let poison = vec![0xFFu8; t.ty().size_bytes().unwrap_or(0).max(1)];
        bufs.push(stream.clone_htod(&poison).map_err(driver)?);
    }
    for s in &kernel.scratch {
        let fill = if s.zeroed { 0u8 } else { 0xFF };
        bufs.push(
            stream
                .clone_htod(&vec![fill; s.bytes.max(1)])
                .map_err(driver)?,
        );
    }
    Ok(bufs)
}

/// Fails the row when a launch left a zeroed scratch buffer (split-K's
/// arrival counters) nonzero: the next launch would read it.
fn check_scratch_zeroed(
    stream: &Arc<CudaStream>,
    kernel: &Kernel,
    bufs: &[CudaSlice<u8>],
    row: &mut Row,
) -> Result<(), String> {
    let first = bufs.len() - kernel.scratch.len();
    for (s, buf) in kernel.scratch.iter().zip(&bufs[first..]) {
        if s.zeroed
            && stream
                .clone_dtoh(buf)
                .map_err(driver)?
                .iter()
                .any(|&b| b != 0)
        {
            println!(
                "  {}: FAIL scratch {} not left zeroed",
                kernel.name, s.param
            );
            row.check = "FAIL";
        }
    }
    Ok(())
}

/// Launches `function` with one device pointer per buffer, or a TMA
/// descriptor of it where `kernel`'s parameter has a tensor map.
#[allow(unsafe_code)]
fn launch(
    stream: &Arc<CudaStream>,
    function: &CudaFunction,
    cfg: LaunchConfig,
    kernel: &Kernel,
    bufs: &[CudaSlice<u8>],
) -> Result<(), String> {
    let maps = kernel
        .params
        .iter()
        .zip(bufs)
        .map(|(p, b)| {
            p.tensor_map.as_ref().map(|map| {
                let (ptr, _sync) = b.device_ptr(stream);
                dcir_runtime::encode_tensor_map(map, p.dtype, ptr)
            })
        })
        .map(Option::transpose)
        .collect::<Result<Vec<_>, String>>()?;
    let mut builder = stream.launch_builder(function);
    for (b, map) in bufs.iter().zip(maps.iter().chain(std::iter::repeat(&None))) {
        match map {
            Some(map) => builder.arg(&map.opaque),
            None => builder.arg(b),
        };
    }
    // SAFETY: every emitted kernel takes exactly one pointer parameter per
    // region argument, in region-argument order, then one per result, then
    // one per scratch buffer (`lower::params`, `Kernel::scratch`; all
    // `T* __restrict__`, no scalars), and `bufs` holds the fused op's
    // operands (in the region arguments' order), its results, each an
    // allocation of the value's full type size in the kernel's storage
    // layout (little-endian elements, bool as one byte), then the scratch
    // buffers at their declared sizes.
    // The kernel's loads and stores stay in bounds (grid-stride and row loops
    // bounded by the element/row counts; views clamp), and nothing on the
    // host touches the buffers until the stream is synchronized.
    unsafe { builder.launch(cfg) }.map_err(driver)?;
    Ok(())
}

fn driver(e: DriverError) -> String {
    format!("CUDA: {e:?}")
}

/// A tensor's elements as the kernel stores them (little-endian).
fn to_bytes(t: &Tensor) -> Vec<u8> {
    let mut out: Vec<u8> = match t.data() {
        TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        TensorData::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::Bool(v) => v.iter().map(|&b| u8::from(b)).collect(),
    };
    if out.is_empty() {
        out.push(0); // no zero-size allocations
    }
    out
}

/// A tensor of type `ty` from the bytes the kernel stored.
fn from_bytes(ty: &TensorType, bytes: &[u8]) -> Result<Tensor, String> {
    fn words<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        bytes
            .chunks_exact(N)
            .map(|c| c.try_into().expect("chunks of N bytes"))
    }
    let n = ty.num_elements().unwrap_or(0);
    let bytes = &bytes[..(n * ty.dtype.size_bytes()).min(bytes.len())];
    let data = match ty.dtype {
        DType::F32 => TensorData::F32(words::<4>(bytes).map(f32::from_le_bytes).collect()),
        DType::F16 => TensorData::F16(
            words::<2>(bytes)
                .map(|w| f16::from_bits(u16::from_le_bytes(w)))
                .collect(),
        ),
        DType::BF16 => TensorData::BF16(
            words::<2>(bytes)
                .map(|w| bf16::from_bits(u16::from_le_bytes(w)))
                .collect(),
        ),
        DType::I32 => TensorData::I32(words::<4>(bytes).map(i32::from_le_bytes).collect()),
        DType::I64 => TensorData::I64(words::<8>(bytes).map(i64::from_le_bytes).collect()),
        DType::Bool => TensorData::Bool(bytes.iter().map(|&b| b != 0).collect()),
    };
    Tensor::new(ty.clone(), data).map_err(|e| e.to_string())
}

/// Achieved contraction rate in TFLOP/s.
fn tflops(row: &Row) -> Option<f64> {
    row.median_us
        .filter(|&t| t > 0.0 && row.flops > 0.0)
        .map(|t| row.flops / (t * 1e-6) / 1e12)
}

/// Achieved bandwidth in TB/s.
fn tbps(row: &Row) -> Option<f64> {
    row.median_us
        .filter(|&t| t > 0.0)
        .map(|t| row.bytes as f64 / (t * 1e-6) / 1e12)
}

fn fmt_opt(v: Option<f64>, style: &str) -> String {
    match (v, style) {
        (None, _) => "-".to_string(),
        (Some(x), "e") => format!("{x:.2e}"),
        (Some(x), _) => format!("{x:.2}"),
    }
}

/// The report as a markdown table.
fn markdown_table(rows: &[Row], spec: &DeviceSpec, device: &str, options: &Options) -> String {
    let peak = spec.bandwidth / 1e12;
    let mut out = format!(
        "Device: {device}. Median of {} launches after {WARMUP} warm-up, CUDA events per launch; \
         seed {}. TB/s = (input + output bytes) / median; peak {peak:.2} TB/s (measured copy). \
         `L2` marks kernels whose rotated buffer set still fits in the {} MiB L2.\n\n",
        options.reps,
        options.seed,
        spec.l2_bytes >> 20
    );
    out.push_str(&format!(
        "| kernel | kind | dtype | elements | regs | check | rel-L2 | max-abs | median us | TB/s | % of {peak:.2} | TFLOP/s |\n"
    ));
    out.push_str("|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let bw = tbps(r);
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.kernel,
            r.kind,
            r.dtype,
            r.elements,
            r.registers.map_or("-".into(), |x| x.to_string()),
            r.check,
            fmt_opt(r.rel_l2, "e"),
            fmt_opt(r.max_abs, "e"),
            fmt_opt(r.median_us, "f"),
            bw.map_or("-".into(), |b| format!(
                "{b:.3}{}",
                if r.fits_l2 { " (L2)" } else { "" }
            )),
            bw.map_or("-".into(), |b| format!("{:.1}%", 100.0 * b / peak)),
            tflops(r).map_or("-".into(), |f| format!("{f:.1}")),
        ));
    }
    out
}
