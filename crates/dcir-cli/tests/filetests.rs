//! Data-driven filetests: every `.dcir` file under `tests/filetests/<stage>/`
//! and every file of `ir-examples/`.
//!
//! A filetest starts with a header of commands, one per line:
//!
//! ```text
//! // test verify      read and verify; snapshot the canonical IR (or the diagnostics)
//! // test roundtrip   print, read back, and check the module and text agree
//! // test pass P      run pipeline P (verifying after each pass); snapshot the
//! //                  unified diff of the printed IR, before → after
//! // test fuse        plan every graph with the H200 cost model; snapshot the
//! //                  plan table, the rejected merges and the fused IR, and
//! //                  check the fused graph computes what the original did
//! // test run [seed=N] run every graph on the interpreter (random inputs from
//! //                  seed N, default 0, or `// input: %p = [..]`); snapshot a
//! //                  summary of each output; check `// expect: %v = [..]`; with
//! //                  `test pass`, also check the outputs agree before and after
//! // test cuda        fuse (unless already fused) and snapshot the CUDA source of
//! //                  every kernel; compile each with NVRTC (prints `SKIP:` when
//! //                  NVRTC is missing, fails instead with DCIR_REQUIRE_NVRTC=1)
//! ```
//!
//! Expected diagnostics are written on the offending line as a trailing
//! `// error: <part of the message>`; every diagnostic must be expected and
//! every expectation met. A line `// -----` splits a file into independent
//! cases (MLIR's split-input-file), keeping line numbers. Snapshots live in
//! `tests/filetests/<stage>/snapshots/`; re-bless with `cargo xtask bless`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use dcir_fusion::{CostModel, DeviceSpec, apply_plan, explain, plan_graph};
use dcir_interp::{Tensor, Tolerance, compare, random_inputs, run_graph};
use dcir_ir::{Module, print_module, verify_module};
use dcir_passes::{Instrumentation, PassManager, PassRegistry, PipelineFailure, build_pipeline};
use dcir_reader::{Diagnostic, parse_module, read_bytes, render};

const SPLIT: &str = "// -----";
const EXPECT_ERROR: &str = "// error: ";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The commands a filetest's header asks for.
#[derive(Debug, Default)]
struct Commands {
    verify: bool,
    roundtrip: bool,
    pipeline: Option<String>,
    run_seed: Option<u64>,
    fuse: bool,
    cuda: bool,
}

fn parse_header(source: &str) -> Result<Commands, String> {
    let mut commands = Commands::default();
    for line in source.lines().take_while(|l| l.starts_with("//")) {
        let Some(cmd) = line.strip_prefix("// test ") else {
            continue;
        };
        match cmd.trim() {
            "verify" => commands.verify = true,
            "roundtrip" => commands.roundtrip = true,
            "run" => commands.run_seed = Some(0),
            "fuse" => commands.fuse = true,
            "cuda" => commands.cuda = true,
            other => {
                if let Some(pipeline) = other.strip_prefix("pass ") {
                    commands.pipeline = Some(pipeline.trim().to_string());
                } else if let Some(seed) = other.strip_prefix("run seed=") {
                    let seed = seed
                        .trim()
                        .parse()
                        .map_err(|_| format!("bad seed in `test {other}`"))?;
                    commands.run_seed = Some(seed);
                } else {
                    return Err(format!("unknown filetest command `test {other}`"));
                }
            }
        }
    }
    if !commands.verify
        && !commands.roundtrip
        && !commands.fuse
        && !commands.cuda
        && commands.pipeline.is_none()
        && commands.run_seed.is_none()
    {
        return Err("no `// test <command>` line in the header".to_string());
    }
    Ok(commands)
}

/// The cases of a file: each keeps its line numbers by leading blank lines.
fn split_cases(source: &str) -> Vec<String> {
    let mut cases = Vec::new();
    let mut current = String::new();
    let mut line_no = 0;
    for line in source.split_inclusive('\n') {
        line_no += 1;
        if line.trim_end() == SPLIT {
            cases.push(std::mem::replace(&mut current, "\n".repeat(line_no)));
            continue;
        }
        current.push_str(line);
    }
    cases.push(current);
    cases
}

/// `(line, expected message part)` for every `// error:` annotation (1-based lines).
fn expectations(case: &str) -> Vec<(usize, String)> {
    case.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let at = line.find(EXPECT_ERROR)?;
            Some((i + 1, line[at + EXPECT_ERROR.len()..].trim().to_string()))
        })
        .collect()
}

/// Reads and verifies one case: the module, or every diagnostic.
fn read_and_verify(case: &str) -> Result<Module, Vec<Diagnostic>> {
    let module = read_bytes(case.as_bytes())?;
    verify_module(&module).map_err(|errs| errs.iter().map(Diagnostic::from).collect::<Vec<_>>())?;
    Ok(module)
}

/// Checks diagnostics against expectations; `Err` describes every mismatch.
fn match_expectations(case: &str, diags: &[Diagnostic]) -> Result<(), String> {
    let mut expected = expectations(case);
    let mut problems = Vec::new();
    for d in diags {
        let line = d.line_col(case).map(|(l, _)| l);
        let found = expected
            .iter()
            .position(|(l, text)| Some(*l) == line && d.message.contains(text.as_str()));
        match found {
            Some(i) => {
                expected.remove(i);
            }
            None => problems.push(format!(
                "unexpected diagnostic at line {}: {}",
                line.map_or("?".to_string(), |l| l.to_string()),
                d.message
            )),
        }
    }
    for (line, text) in expected {
        problems.push(format!(
            "line {line}: expected an error containing `{text}`, none was reported"
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

fn check_roundtrip(module: &Module) -> Result<(), String> {
    let text = print_module(module);
    let reread = parse_module(&text).map_err(|d| {
        format!(
            "printed IR does not read back:\n{}",
            render("<printed>", &text, &d)
        )
    })?;
    if &reread != module {
        return Err(format!(
            "printed IR reads back to a different module:\n{text}"
        ));
    }
    let again = print_module(&reread);
    if again != text {
        return Err(format!(
            "printing is not a fixpoint:\n--- first\n{text}--- second\n{again}"
        ));
    }
    Ok(())
}

/// Inputs and outputs of each graph of a module, in graph order.
type Runs = (Vec<Vec<Tensor>>, Vec<Vec<Tensor>>);

/// `(name, values)` of every `// <key>: %name = [v, ...]` line of a case.
fn value_lines(case: &str, key: &str) -> Result<Vec<(String, Vec<f64>)>, String> {
    let marker = format!("// {key}: %");
    let mut out = Vec::new();
    for line in case.lines() {
        let Some(at) = line.find(&marker) else {
            continue;
        };
        let rest = &line[at + marker.len()..];
        let (name, values) = rest
            .split_once('=')
            .ok_or_else(|| format!("`{}` needs `= [..]`", line.trim()))?;
        let values = values.trim().trim_start_matches('[').trim_end_matches(']');
        let parsed = values
            .split(',')
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .map_err(|_| format!("bad number `{v}` in `{}`", line.trim()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.push((name.trim().to_string(), parsed));
    }
    Ok(out)
}

fn tensor_of(ty: &dcir_ir::TensorType, values: &[f64]) -> Result<Tensor, String> {
    let n = ty.num_elements().unwrap_or(0);
    let values = if values.len() == 1 {
        vec![values[0]; n]
    } else {
        values.to_vec()
    };
    Tensor::from_f64(ty.clone(), &values).map_err(|e| e.to_string())
}

/// Runs every graph on the interpreter; appends a summary of each output and
/// checks `// expect:` lines.
fn run_module(module: &Module, case: &str, seed: u64, output: &mut String) -> Result<Runs, String> {
    let given = value_lines(case, "input")?;
    let expected = value_lines(case, "expect")?;
    let (mut all_inputs, mut all_outputs) = (Vec::new(), Vec::new());
    for graph in &module.graphs {
        let mut inputs = random_inputs(graph, seed);
        for (param, input) in graph.params().iter().zip(inputs.iter_mut()) {
            if let Some((_, values)) = given.iter().find(|(n, _)| *n == graph.value(*param).name) {
                *input = tensor_of(graph.ty(*param), values)?;
            }
        }
        let outputs = run_graph(graph, &inputs).map_err(|e| format!("@{}: {e}", graph.name()))?;
        let names = graph.outputs().unwrap_or_default();
        for (&v, out) in names.iter().zip(&outputs) {
            let name = &graph.value(v).name;
            let s = out.summary();
            output.push_str(&format!(
                "// run @{} %{name}: {} mean={:.5e} abs_max={:.5e} checksum={:.5e}\n",
                graph.name(),
                out.ty(),
                s.mean,
                s.abs_max,
                s.checksum
            ));
            if let Some((_, values)) = expected.iter().find(|(n, _)| n == name) {
                let want = tensor_of(out.ty(), values)?;
                compare(&want, out, &Tolerance::for_dtype(out.dtype())).map_err(|m| {
                    format!("@{} %{name} differs from `// expect:`: {m}", graph.name())
                })?;
            }
        }
        all_inputs.push(inputs);
        all_outputs.push(outputs);
    }
    Ok((all_inputs, all_outputs))
}

/// Runs `module` (after a pipeline) on the same inputs and checks every output
/// agrees with the one before, within the dtype's tolerance.
fn check_same_outputs(
    module: &Module,
    inputs: &[Vec<Tensor>],
    before: &[Vec<Tensor>],
    output: &mut String,
) -> Result<(), String> {
    for ((graph, inputs), before) in module.graphs.iter().zip(inputs).zip(before) {
        let after = run_graph(graph, inputs)
            .map_err(|e| format!("after the pipeline, @{}: {e}", graph.name()))?;
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            compare(b, a, &Tolerance::for_dtype(b.dtype())).map_err(|m| {
                format!(
                    "@{} output {i} changed under the pipeline: {m}",
                    graph.name()
                )
            })?;
        }
    }
    output.push_str("// run: every output agrees before and after the pipeline\n");
    Ok(())
}

/// Plans and fuses every graph with the H200 model: the plan table, the
/// rejected merges and the fused IR; the fused graph must verify and give
/// exactly the original outputs on the interpreter.
fn fuse_module(module: &Module) -> Result<String, String> {
    let model = CostModel::new(DeviceSpec::h200());
    let mut out = String::new();
    let mut fused = module.clone();
    for graph in &mut fused.graphs {
        let plan = plan_graph(graph, &model, &dcir_cuda::CudaTarget)?;
        out.push_str(&explain::plan_table(graph, &plan, &model.device.name));
        out.push_str(&explain::explain(graph, &plan));
        let after = apply_plan(graph, &plan)?;
        let inputs = random_inputs(graph, 0);
        let want = run_graph(graph, &inputs).map_err(|e| e.to_string())?;
        let got = run_graph(&after, &inputs).map_err(|e| e.to_string())?;
        for (w, g) in want.iter().zip(&got) {
            compare(w, g, &Tolerance::EXACT)
                .map_err(|m| format!("@{}: fusion changed an output: {m}", graph.name()))?;
        }
        *graph = after;
    }
    verify_module(&fused).map_err(|e| format!("the fused IR does not verify: {e:?}"))?;
    out.push_str(&print_module(&fused));
    Ok(out)
}

/// Fuses every graph that has no `fused` op yet (H200 model), emits the CUDA
/// source of every kernel and compiles each with NVRTC when it is present;
/// the graph's artifact (launches, buffers, constants' bytes) must build too.
fn cuda_module(module: &Module) -> Result<String, String> {
    let model = CostModel::kernels_only(DeviceSpec::h200());
    let mut fused = module.clone();
    for graph in &mut fused.graphs {
        let already = graph
            .all_ops()
            .iter()
            .any(|&o| graph.op(o).kind == dcir_ir::OpKind::Fused);
        if !already {
            let plan = plan_graph(graph, &model, &dcir_cuda::CudaTarget)?;
            *graph = apply_plan(graph, &plan)?;
        }
    }
    let mut out = String::new();
    for graph in &fused.graphs {
        let source_only = dcir_cuda::BuildOptions {
            compile: false,
            ..dcir_cuda::BuildOptions::default()
        };
        dcir_cuda::build_artifact(graph, &source_only)?;
        for kernel in dcir_cuda::lower_graph(graph).map_err(|e| e.to_string())? {
            let source = dcir_cuda::print_kernel(&kernel);
            let arch = dcir_cuda::kernel_arch(&kernel, dcir_cuda::nvrtc::DEFAULT_ARCH)?;
            compile_with_nvrtc(&source, &kernel.name, kernel.block, arch)?;
            out.push_str(&format!(
                "// ===== kernel {} =====\n{source}\n",
                kernel.name
            ));
        }
        for line in dcir_cuda::library::library_call_lines(graph).map_err(|e| e.to_string())? {
            out.push_str(&line);
        }
    }
    Ok(out)
}

/// Compiles one kernel with NVRTC for `arch` and fails on a spill, a stack
/// frame or more registers than `threads` per block allow (ptxas's report);
/// without NVRTC prints `SKIP:` (or fails when `DCIR_REQUIRE_NVRTC=1`).
fn compile_with_nvrtc(source: &str, name: &str, threads: u32, arch: &str) -> Result<(), String> {
    if let Some(reason) = dcir_cuda::nvrtc::unavailable_reason() {
        if std::env::var("DCIR_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
            return Err(format!("DCIR_REQUIRE_NVRTC=1 but {reason}"));
        }
        println!("SKIP: NVRTC compile of {name}: {reason}");
        return Ok(());
    }
    let compiled = dcir_cuda::nvrtc::compile(source, name, arch)?;
    let resources = compiled
        .resources
        .ok_or_else(|| format!("no ptxas report for {name}:\n{}", compiled.log))?;
    match resources.violation(threads) {
        Some(why) => Err(format!("kernel {name}: {why} ({resources})")),
        None => Ok(()),
    }
}

/// Runs `pipeline` on `module`, verifying after each pass; the unified diff
/// of the printed IR, and the module after.
fn run_pipeline(pipeline: &str, mut module: Module) -> Result<(String, Module), String> {
    let registry = PassRegistry::with_builtins();
    let passes = build_pipeline(&registry, pipeline).map_err(|e| e.render(pipeline))?;
    let instrumentation = Instrumentation {
        verify_each: true,
        ..Instrumentation::default()
    };
    let before = print_module(&module);
    PassManager::new(passes, instrumentation)
        .run(&mut module, &mut std::io::sink())
        .map_err(|failure| match failure {
            PipelineFailure::Verify { pass, errors, ir } => {
                let diags: Vec<Diagnostic> = errors.iter().map(Diagnostic::from).collect();
                format!(
                    "IR does not verify after `{pass}`:\n{}",
                    render("<after>", &ir, &diags)
                )
            }
            other => other.to_string(),
        })?;
    let after = print_module(&module);
    let diff = similar::TextDiff::from_lines(&before, &after);
    let mut out = format!("// pipeline: {pipeline}\n");
    out.push_str(
        &diff
            .unified_diff()
            .context_radius(3)
            .header("before", "after")
            .to_string(),
    );
    if before == after {
        out.push_str("// (no change)\n");
    }
    Ok((out, module))
}

/// Runs one filetest; returns the stage output to snapshot.
fn run_file(path: &Path, source: &str) -> Result<String, String> {
    let commands = parse_header(source)?;
    let file_name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let mut output = String::new();
    for (i, case) in split_cases(source).iter().enumerate() {
        if i > 0 {
            output.push_str(SPLIT);
            output.push('\n');
        }
        match read_and_verify(case) {
            Ok(module) => {
                match_expectations(case, &[])?;
                if commands.roundtrip {
                    check_roundtrip(&module)?;
                }
                if commands.verify {
                    output.push_str(&print_module(&module));
                }
                if commands.fuse {
                    output.push_str(&fuse_module(&module)?);
                }
                if commands.cuda {
                    output.push_str(&cuda_module(&module)?);
                }
                let before = match commands.run_seed {
                    Some(seed) => Some(run_module(&module, case, seed, &mut output)?),
                    None => None,
                };
                if let Some(pipeline) = &commands.pipeline {
                    let (diff, after) = run_pipeline(pipeline, module)?;
                    output.push_str(&diff);
                    if let Some((inputs, outputs)) = before {
                        check_same_outputs(&after, &inputs, &outputs, &mut output)?;
                    }
                }
            }
            Err(diags) => {
                let rendered = render(&file_name, case, &diags);
                match_expectations(case, &diags).map_err(|e| format!("{e}\n{rendered}"))?;
                output.push_str(&rendered);
            }
        }
    }
    Ok(output)
}

fn dcir_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "dcir"))
        .collect();
    files.sort();
    files
}

/// Runs every filetest of one stage directory and snapshots its output.
fn run_stage(stage: &str) {
    let dir = repo_root().join("tests/filetests").join(stage);
    let files = dcir_files(&dir);
    assert!(!files.is_empty(), "no filetests in {}", dir.display());
    let mut failures = Vec::new();
    for path in &files {
        let name = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let source =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let outcome = run_file(path, &source).and_then(|output| {
            catch_unwind(AssertUnwindSafe(|| {
                insta::with_settings!({
                    snapshot_path => dir.join("snapshots"),
                    prepend_module_to_snapshot => false,
                    description => format!("{stage}/{name}.dcir; re-bless with `cargo xtask bless`"),
                    omit_expression => true,
                }, {
                    insta::assert_snapshot!(name.clone(), output);
                });
            }))
            .map_err(|_| {
                "snapshot differs (diff above); re-bless with `cargo xtask bless`".to_string()
            })
        });
        match outcome {
            Ok(()) => println!("ok   {stage}/{name}.dcir"),
            Err(e) => failures.push(format!("FAIL {stage}/{name}.dcir\n{e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} filetests failed:\n\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}

#[test]
fn verify_stage() {
    run_stage("verify");
}

#[test]
fn errors_stage() {
    run_stage("errors");
}

#[test]
fn passes_stage() {
    run_stage("passes");
}

#[test]
fn fusion_stage() {
    run_stage("fusion");
}

#[test]
fn cuda_stage() {
    run_stage("cuda");
}

/// The fusion plan of every ir-example and of the imported ResNet-50,
/// MobileNetV2 and BERT-base, on the H200 preset.
#[test]
fn fusion_plans_of_examples_and_models() {
    let model = CostModel::new(DeviceSpec::h200());
    let mut modules: Vec<(String, Module)> = Vec::new();
    for path in dcir_files(&repo_root().join("ir-examples")) {
        let source = std::fs::read_to_string(&path).expect("readable example");
        let name = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        modules.push((
            name,
            read_and_verify(&source).expect("the example verifies"),
        ));
    }
    for model_name in ["resnet50", "mobilenet_v2", "bert_base"] {
        let path = repo_root().join(format!("crates/dcir-onnx/models/{model_name}.onnx"));
        let options = dcir_onnx::ImportOptions::default();
        let imported =
            dcir_onnx::import_file(&path, &options).unwrap_or_else(|e| panic!("{model_name}: {e}"));
        modules.push((format!("onnx_{model_name}"), imported.module));
    }
    let mut failures = Vec::new();
    for (name, module) in modules {
        let mut text = String::new();
        for graph in &module.graphs {
            match plan_graph(graph, &model, &dcir_cuda::CudaTarget) {
                Ok(plan) => text.push_str(&explain::plan_table(graph, &plan, &model.device.name)),
                Err(e) => failures.push(format!("{name}: {e}")),
            }
        }
        insta::with_settings!({
            snapshot_path => repo_root().join("tests/filetests/fusion/snapshots"),
            prepend_module_to_snapshot => false,
            description => format!("fusion plan of {name}; re-bless with `cargo xtask bless`"),
            omit_expression => true,
        }, {
            insta::assert_snapshot!(format!("plan_{name}"), text);
        });
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every ir-example (in f32 and, with every `f32` turned into `f16`, in f16)
/// and every imported model (ResNet-50, MobileNetV2, BERT-base) lowers
/// completely, and each distinct kernel compiles with NVRTC without spills.
/// The examples' kernels are snapshotted in full; the models', one line per
/// kernel (their sources repeat the families' snapshots).
#[test]
fn cuda_of_examples_and_models() {
    let model = CostModel::kernels_only(DeviceSpec::h200());
    let fuse = |name: &str, mut module: Module| -> Vec<(dcir_cuda::kir::Kernel, String)> {
        let mut kernels = Vec::new();
        for graph in &mut module.graphs {
            let plan = plan_graph(graph, &model, &dcir_cuda::CudaTarget)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            *graph = apply_plan(graph, &plan).unwrap_or_else(|e| panic!("{name}: {e}"));
            for k in dcir_cuda::lower_graph(graph).unwrap_or_else(|e| panic!("{name}: {e}")) {
                let source = dcir_cuda::print_kernel(&k);
                kernels.push((k, source));
            }
        }
        kernels
    };
    // (name, source, block, what it is) of each kernel to compile.
    let mut to_compile: Vec<(String, String, u32, String, &'static str)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut distinct = |kernels: &[(dcir_cuda::kir::Kernel, String)]| {
        for (k, source) in kernels {
            // Identical kernels under other names (BERT's 12 layers) compile once.
            if seen.insert(source.replace(&k.name, "KERNEL")) {
                let arch = k.requires_arch.unwrap_or(dcir_cuda::nvrtc::DEFAULT_ARCH);
                to_compile.push((
                    k.name.clone(),
                    source.clone(),
                    k.block,
                    k.summary.clone(),
                    arch,
                ));
            }
        }
    };
    for path in dcir_files(&repo_root().join("ir-examples")) {
        let f32_source = std::fs::read_to_string(&path).expect("readable example");
        let stem = path
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        for dtype in ["f32", "f16"] {
            let source = f32_source.replace("f32", dtype);
            let module = read_and_verify(&source).expect("the example verifies");
            let kernels = fuse(&stem, module);
            distinct(&kernels);
            let text: String = kernels
                .iter()
                .map(|(k, source)| format!("// ===== kernel {} =====\n{source}\n", k.name))
                .collect();
            insta::with_settings!({
                snapshot_path => repo_root().join("tests/filetests/cuda/snapshots"),
                prepend_module_to_snapshot => false,
                description => format!("CUDA of ir-examples/{stem}.dcir in {dtype}; re-bless with `cargo xtask bless`"),
                omit_expression => true,
            }, {
                insta::assert_snapshot!(format!("example_{stem}_{dtype}"), text);
            });
        }
    }
    for (model_name, dtype) in ["resnet50", "mobilenet_v2", "bert_base"]
        .into_iter()
        .flat_map(|m| [(m, "f32"), (m, "f16")])
    {
        let path = repo_root().join(format!("crates/dcir-onnx/models/{model_name}.onnx"));
        let imported = dcir_onnx::import_file(&path, &dcir_onnx::ImportOptions::default())
            .unwrap_or_else(|e| panic!("{model_name}: {e}"));
        // f16: the imported text with every f32 made f16, as the GPU runs check it.
        let module = if dtype == "f32" {
            imported.module
        } else {
            let text = print_module(&imported.module).replace("f32", "f16");
            read_and_verify(&text).unwrap_or_else(|e| panic!("{model_name} in f16: {e:?}"))
        };
        let snapshot = if dtype == "f32" {
            format!("model_{model_name}")
        } else {
            format!("model_{model_name}_{dtype}")
        };
        let kernels = fuse(&snapshot, module);
        distinct(&kernels);
        let text: String = kernels
            .iter()
            .map(|(k, _)| {
                let smem = if k.dynamic_shared > 0 {
                    format!(", {} B dynamic smem", k.dynamic_shared)
                } else {
                    String::new()
                };
                format!(
                    "{}: grid {}, block {}{smem}: {}\n",
                    k.name, k.grid, k.block, k.summary
                )
            })
            .collect();
        insta::with_settings!({
            snapshot_path => repo_root().join("tests/filetests/cuda/snapshots"),
            prepend_module_to_snapshot => false,
            description => format!("kernels of the imported {model_name} in {dtype}; re-bless with `cargo xtask bless`"),
            omit_expression => true,
        }, {
            insta::assert_snapshot!(snapshot, text);
        });
    }
    // NVRTC on both cores.
    let failures: Vec<String> = std::thread::scope(|scope| {
        let halves: Vec<_> = to_compile
            .chunks(to_compile.len().div_ceil(2).max(1))
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .filter_map(|(name, source, block, summary, arch)| {
                            compile_with_nvrtc(source, name, *block, arch)
                                .err()
                                .map(|e| format!("{e}\n  {summary}"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        halves
            .into_iter()
            .flat_map(|h| h.join().expect("no panic"))
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn run_stage_files() {
    run_stage("run");
}

/// The issue's reference pipeline on the ResNet-50 bottleneck block: the
/// batchnorms fold into the convolutions' weights and biases.
#[test]
fn resnet_block_reference_pipeline() {
    let path = repo_root().join("ir-examples/resnet50_bottleneck.dcir");
    let source = std::fs::read_to_string(&path).expect("the example exists");
    let module = read_and_verify(&source).expect("the example verifies");
    let (diff, _) = run_pipeline("canonicalize,cse,dce,fold-batchnorm", module)
        .unwrap_or_else(|e| panic!("{e}"));
    insta::with_settings!({
        snapshot_path => repo_root().join("tests/filetests/passes/snapshots"),
        prepend_module_to_snapshot => false,
        description => "ir-examples/resnet50_bottleneck.dcir; re-bless with `cargo xtask bless`",
        omit_expression => true,
    }, {
        insta::assert_snapshot!("resnet50_bottleneck_pipeline", diff);
    });
}

/// Every ir-example verifies, round-trips, and is already canonical: its text
/// without comment lines is exactly what the printer prints.
#[test]
fn ir_examples_are_valid_and_canonical() {
    let files = dcir_files(&repo_root().join("ir-examples"));
    assert!(files.len() >= 6, "expected the ir-examples");
    let mut failures = Vec::new();
    for path in &files {
        let source = std::fs::read_to_string(path).expect("readable example");
        let outcome = read_and_verify(&source)
            .map_err(|d| render(&path.display().to_string(), &source, &d))
            .and_then(|module| {
                check_roundtrip(&module)?;
                let code: String = source
                    .split_inclusive('\n')
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .collect();
                if print_module(&module) != code {
                    return Err(format!(
                        "not in canonical form; the printer gives:\n{}",
                        print_module(&module)
                    ));
                }
                Ok(())
            });
        match outcome {
            Ok(()) => println!("ok   {}", path.display()),
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
