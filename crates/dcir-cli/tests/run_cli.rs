//! `dcir-run` as a user runs it: summaries, seeds, files in and out, errors.

mod common;

use common::{run_tool, text};
use std::path::{Path, PathBuf};
use std::process::Output;

use dcir_interp::io::{read_safetensors, write_safetensors};
use dcir_interp::{Tensor, TensorData};
use dcir_ir::{DType, TensorType};

fn dcir_run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    run_tool(env!("CARGO_BIN_EXE_dcir-run"), args, stdin)
}

/// A fresh directory for one test's files.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dcir-run-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The mean of the first output a run printed (`%name type mean=... `).
fn first_mean(out: &Output) -> f64 {
    let stdout = text(&out.stdout);
    let line = stdout.lines().next().unwrap_or("");
    line.split("mean=")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no mean in {line:?}"))
}

fn f32_tensor(dims: &[usize], value: f32) -> Tensor {
    let ty = TensorType::new(DType::F32, dims.to_vec());
    let n = ty.num_elements().expect("small");
    Tensor::new(ty, TensorData::F32(vec![value; n])).expect("fits")
}

fn write_tensors(path: &Path, tensors: &[(&str, Tensor)]) {
    let named: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    std::fs::write(path, write_safetensors(&named).expect("serializes")).expect("writes");
}

const ADD: &[u8] = b"graph @g(%x: f32[2,3], %w: f32[2,3]) -> (f32[2,3]) {\n  %y = add %x, %w : f32[2,3]\n  return %y\n}\n\
graph @h(%x: f32[4]) -> (f32[4], f32[4]) {\n  %y = neg %x : f32[4]\n  return %y, %x\n}\n";

#[test]
fn runs_an_example_and_prints_one_summary_per_output() {
    let out = dcir_run(
        &["ir-examples/conv_bias_relu.dcir", "--backend", "cpu"],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let fields: Vec<&str> = lines[0].split(' ').collect();
    assert_eq!(fields[..2], ["%y", "f32[1,64,112,112]"]);
    for (field, key) in fields[2..].iter().zip(["mean=", "abs_max=", "checksum="]) {
        let value: f64 = field
            .strip_prefix(key)
            .unwrap_or_else(|| panic!("{field} starts with {key}"))
            .parse()
            .expect("a number");
        assert!(value.is_finite() && value != 0.0, "{field}");
    }
    assert!(
        text(&out.stderr).contains("random values (seed 0) for 3 of 3 parameters"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn results_are_deterministic_for_a_seed() {
    let run = |seed: &str| {
        let out = dcir_run(&["ir-examples/ln_gelu.dcir", "--seed", seed], None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    assert_eq!(run("5"), run("5"));
    assert_ne!(run("5"), run("6"));
}

#[test]
fn values_come_from_files_and_outputs_go_to_one() {
    let dir = temp_dir("files");
    let (weights, inputs, output) = (
        dir.join("w.safetensors"),
        dir.join("in.safetensors"),
        dir.join("out.safetensors"),
    );
    write_tensors(&weights, &[("w", f32_tensor(&[2, 3], 2.0))]);
    write_tensors(&inputs, &[("x", f32_tensor(&[2, 3], 1.5))]);
    let args = [
        "-",
        "--weights",
        weights.to_str().expect("utf-8"),
        "--inputs",
        inputs.to_str().expect("utf-8"),
        "-o",
        output.to_str().expect("utf-8"),
    ];
    let out = dcir_run(&args, Some(ADD));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "%y f32[2,3] mean=3.500000e0 abs_max=3.500000e0 checksum=2.100000000e1\n"
    );
    assert!(
        !text(&out.stderr).contains("random"),
        "{}",
        text(&out.stderr)
    );
    let written = read_safetensors(&std::fs::read(&output).expect("written")).expect("reads");
    assert_eq!(written, [("y".to_string(), f32_tensor(&[2, 3], 3.5))]);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn picks_a_graph_by_name() {
    let out = dcir_run(&["-", "--graph", "h"], Some(ADD));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("%y f32[4] ") && stdout.contains("\n%x f32[4] "),
        "{stdout}"
    );
    // `@h`, as the IR writes it, names the same graph.
    let at = dcir_run(&["-", "--graph", "@h"], Some(ADD));
    assert!(at.status.success(), "{}", text(&at.stderr));
    assert_eq!(at.stdout, out.stdout);
    let out = dcir_run(&["-", "--graph", "nope"], Some(ADD));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "dcir-run: error: the module has no graph @nope (it has: @g, @h)\n"
    );
}

#[test]
fn file_mismatches_are_clear_errors() {
    let dir = temp_dir("mismatch");
    let (w, other) = (dir.join("w.safetensors"), dir.join("x.safetensors"));
    write_tensors(&w, &[("w", f32_tensor(&[3, 2], 1.0))]);
    write_tensors(&other, &[("w", f32_tensor(&[2, 3], 1.0))]);
    let w_arg = w.to_str().expect("utf-8");
    let cases: [(Vec<&str>, &str); 4] = [
        (
            vec!["-", "--weights", w_arg],
            "dcir-run: error: tensor `w` is f32[3,2] but parameter %w of @g is f32[2,3]",
        ),
        (
            vec![
                "-",
                "--weights",
                w_arg,
                "--inputs",
                other.to_str().expect("utf-8"),
            ],
            "dcir-run: error: tensor `w` is in both --weights and --inputs",
        ),
        (
            vec!["-", "--weights", "no/such.safetensors"],
            "cannot read `no/such.safetensors`",
        ),
        (
            vec!["-", "--inputs", "ir-examples/ln_gelu.dcir"],
            "not a valid safetensors file",
        ),
    ];
    for (args, expected) in cases {
        let out = dcir_run(&args, Some(ADD));
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            text(&out.stderr).contains(expected),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn op_errors_point_at_the_op() {
    let dir = temp_dir("gather");
    let indices = dir.join("i.safetensors");
    let ty = TensorType::new(DType::I64, vec![2]);
    let bad = Tensor::new(ty, TensorData::I64(vec![0, 9])).expect("fits");
    write_tensors(&indices, &[("i", bad)]);
    let src = b"graph @g(%t: f32[4,2], %i: i64[2]) -> (f32[2,2]) {\n  %e = gather %t, %i : f32[2,2]\n  return %e\n}\n";
    let out = dcir_run(
        &["-", "--inputs", indices.to_str().expect("utf-8")],
        Some(src),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("<stdin>:2:3"), "{err}");
    assert!(
        err.contains("`gather` defining %e: index 9 (element 1 of the indices) is out of range"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn bad_ir_backends_and_flags_are_errors() {
    let out = dcir_run(
        &["-"],
        Some(b"graph @g(%x: f32[2]) -> (f32[3]) {\n  return %x\n}\n"),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("<stdin>:2:3"),
        "{}",
        text(&out.stderr)
    );
    let out = dcir_run(&["ir-examples/ln_gelu.dcir", "--backend", "tpu"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("invalid value 'tpu'"),
        "{}",
        text(&out.stderr)
    );
    let out = dcir_run(&["--help"], None);
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("--weights"));
}

#[test]
fn cuda_flags_need_the_cuda_backend() {
    for flags in [
        &["--check"][..],
        &["--bench", "5"],
        &["--artifact", "/tmp"],
        &["--tune"],
    ] {
        let mut args = vec!["ir-examples/ln_gelu.dcir"];
        args.extend_from_slice(flags);
        let out = dcir_run(&args, None);
        assert_eq!(out.status.code(), Some(1), "{flags:?}");
        assert!(
            text(&out.stderr).contains("need --backend cuda"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = dcir_run(
        &[
            "ir-examples/ln_gelu.dcir",
            "--backend",
            "cuda",
            "--per-kernel",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--per-kernel needs --bench"));
    let out = dcir_run(
        &[
            "ir-examples/ln_gelu.dcir",
            "--backend",
            "cuda",
            "--tune",
            "--artifact",
            "/tmp",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("already compiled"));
}

/// Tuning needs a GPU: without one it is a clean error, never a panic; with
/// one the tuned graph must pass `--check` (a cache in memory only), with the
/// planner's merges decided by the model or by measured times.
#[test]
fn tuning_errors_cleanly_or_passes_the_check() {
    for fusion in [&[][..], &["--tune-fusion"]] {
        let mut args = vec![
            "ir-examples/ln_gelu.dcir",
            "--backend",
            "cuda",
            "--tune",
            "--tune-top-k",
            "2",
            "--tune-cache",
            "none",
            "--check",
        ];
        args.extend_from_slice(fusion);
        let out = dcir_run(&args, None);
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        if out.status.success() {
            assert!(stderr.contains("tune: [1/"), "{stderr}");
            if !fusion.is_empty() {
                assert!(stderr.contains("with measured times"), "{stderr}");
            }
            assert!(text(&out.stdout).contains("check %y: PASS"));
        } else {
            assert_eq!(out.status.code(), Some(1));
            assert!(
                stderr.contains("NVRTC") || stderr.contains("no CUDA driver"),
                "{stderr}"
            );
            println!("SKIP: no GPU: {}", stderr.lines().last().unwrap_or(""));
        }
    }
    // Measured fusion is a way of tuning.
    let out = dcir_run(
        &[
            "ir-examples/ln_gelu.dcir",
            "--backend",
            "cuda",
            "--tune-fusion",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("required arguments were not provided:\n  --tune"),
        "{}",
        text(&out.stderr)
    );
}

/// Without a GPU (CI, this dev VM) the cuda backend is a clean error, never a
/// panic; with one it must pass `--check`.
#[test]
fn cuda_backend_errors_cleanly_or_passes_the_check() {
    let out = dcir_run(
        &["ir-examples/ln_gelu.dcir", "--backend", "cuda", "--check"],
        None,
    );
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if out.status.success() {
        assert!(
            text(&out.stdout).contains("check %y: PASS"),
            "{}",
            text(&out.stdout)
        );
    } else {
        assert_eq!(out.status.code(), Some(1));
        assert!(
            stderr.contains("NVRTC")
                || stderr.contains("no CUDA driver")
                || stderr.contains("device"),
            "{stderr}"
        );
        println!("SKIP: no GPU: {}", stderr.lines().last().unwrap_or(""));
    }
}

/// A graph whose input and output are `ty`.
fn relu_of(ty: &str) -> Vec<u8> {
    format!("graph @g(%x: {ty}) -> ({ty}) {{\n  %y = relu %x : {ty}\n  return %y\n}}\n")
        .into_bytes()
}

#[test]
fn a_shape_whose_size_overflows_is_a_verifier_error() {
    let started = std::time::Instant::now();
    let big = relu_of("f32[4294967296,4294967296,4294967296]");
    let out = dcir_run(&["-"], Some(&big));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("value %x of type f32[4294967296,4294967296,4294967296] is too large")
            && err.contains("<stdin>:1:1"),
        "{err}"
    );
    assert!(started.elapsed().as_secs() < 5);
}

#[test]
fn a_graph_larger_than_the_memory_budget_is_refused_before_allocating() {
    let started = std::time::Instant::now();
    // 3.6 PiB an input: more than any machine's memory, the default budget.
    let big = relu_of("f32[100000,100000,100000]");
    let out = dcir_run(&["-"], Some(&big));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("@g needs 7.1 PiB of memory for its values on the interpreter")
            && err.contains("the largest value is %x: f32[100000,100000,100000] (3.6 PiB)"),
        "{err}"
    );
    // A set budget: 2 × 4 KiB fit 8K, not 6K.
    let small = relu_of("f32[1024]");
    let out = dcir_run(&["-", "--memory-budget", "6K"], Some(&small));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("more than the budget of 6.0 KiB (--memory-budget)"),
        "{err}"
    );
    let out = dcir_run(&["-", "--memory-budget", "8K"], Some(&small));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = dcir_run(&["-", "--memory-budget", "lots"], Some(&small));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("`lots` is not a size"));
    assert!(started.elapsed().as_secs() < 10);
}

#[test]
fn without_a_driver_the_cuda_backend_says_so_first() {
    if dcir_runtime::driver_present() {
        println!("SKIP: a CUDA driver is present");
        return;
    }
    for extra in [&[][..], &["--gpu", "1"], &["--tune"]] {
        let mut args = vec!["ir-examples/ln_gelu.dcir", "--backend", "cuda"];
        args.extend_from_slice(extra);
        let out = dcir_run(&args, None);
        assert_eq!(out.status.code(), Some(1));
        let stderr = text(&out.stderr);
        let error = stderr.lines().find(|l| l.contains("error:")).unwrap_or("");
        assert!(
            error.contains("no CUDA driver (libcuda.so not found)"),
            "{stderr}"
        );
    }
}

#[test]
fn saved_inputs_replay_a_run_after_a_rewrite() {
    let dir = temp_dir("save-inputs");
    let saved = dir.join("in.safetensors");
    let before = b"graph @g(%x: f32[8], %v: f32[8]) -> (f32[8]) {\n  %l = log %v : f32[8]\n  %y = add %x, %l : f32[8]\n  return %y\n}\n";
    // The same function after a rewrite that changes how %v is used.
    let after = b"graph @g(%x: f32[8], %v: f32[8]) -> (f32[8]) {\n  %s = sqrt %v : f32[8]\n  %s2 = mul %s, %s : f32[8]\n  %l = log %s2 : f32[8]\n  %y = add %x, %l : f32[8]\n  return %y\n}\n";
    let out = dcir_run(
        &["-", "--seed", "3", "--save-inputs", saved.to_str().unwrap()],
        Some(before),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let values = read_safetensors(&std::fs::read(&saved).expect("written")).expect("reads");
    let mut names: Vec<&str> = values.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["v", "x"]);
    let replayed = dcir_run(&["-", "--inputs", saved.to_str().unwrap()], Some(after));
    assert!(replayed.status.success(), "{}", text(&replayed.stderr));
    // The same output summary (the sqrt-square round trip is within f32).
    assert!(text(&out.stdout).starts_with("%y f32[8] mean="));
    let (a, b) = (first_mean(&out), first_mean(&replayed));
    assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A truncated or edited `artifact.json` is a clear error with exit code 1,
/// before any GPU is asked for.
#[test]
fn a_corrupt_artifact_is_a_clear_error() {
    use dcir_fusion::{CostModel, DeviceSpec, apply_plan, plan_graph};
    let dir = temp_dir("corrupt-artifact");
    let source = "graph @g(%x: f32[4]) -> (f32[4]) {\n  %y = relu %x : f32[4]\n  return %y\n}\n";
    let file = dir.join("g.dcir");
    std::fs::write(&file, source).expect("writes");
    let module = dcir_reader::parse_module(source).expect("parses");
    let model = CostModel::new(DeviceSpec::h200());
    let plan = plan_graph(&module.graphs[0], &model, &dcir_cuda::CudaTarget).expect("plans");
    let fused = apply_plan(&module.graphs[0], &plan).expect("fuses");
    let options = dcir_cuda::BuildOptions {
        compile: false,
        ..dcir_cuda::BuildOptions::default()
    };
    let artifact = dcir_cuda::build_artifact(&fused, &options).expect("builds");
    let json = artifact.to_json();
    let art = dir.join("art");
    let cases = [
        (json[..json.len() / 2].to_string(), "bad artifact JSON"),
        (
            json.replacen("\"args\": [\n        0,", "\"args\": [\n        99,", 1),
            "invalid artifact: launch 0 binds buffer 99, of 2",
        ),
    ];
    for (text_of_json, says) in cases {
        // A fresh directory: writing over an unreadable artifact is refused.
        let _ = std::fs::remove_dir_all(&art);
        artifact.write_dir(&art).expect("writes");
        std::fs::write(art.join(dcir_artifact::ARTIFACT_JSON), &text_of_json).expect("edits");
        let out = dcir_run(
            &[
                file.to_str().expect("utf-8"),
                "--backend",
                "cuda",
                "--artifact",
                art.to_str().expect("utf-8"),
            ],
            None,
        );
        assert_eq!(out.status.code(), Some(1), "{says}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(says) && !stderr.contains("panicked"),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--seed` checks a pass: `fold-batchnorm` (a weight becomes `w * k`, a
/// variance `var + eps`) and `canonicalize` (`log(u + 0)` becomes
/// `log(u)`) leave every parameter's random values as they were, and
/// `--random-by type` draws them from the name, type and seed alone.
#[test]
fn a_seed_draws_the_same_values_before_and_after_a_pass() {
    let dir = temp_dir("seed-pass");
    let before = dir.join("before.dcir");
    let after = dir.join("after.dcir");
    std::fs::write(
        &before,
        "graph @g(%x: f32[1,4,6,6], %w: f32[8,4,3,3], %s: f32[8], %b: f32[8], %m: f32[8], %v: f32[8], %u: f32[8]) -> (f32[1,8,4,4], f32[8]) {
  %c = conv2d %x, %w : f32[1,8,4,4]
  %n = batchnorm %c, %s, %b, %m, %v : f32[1,8,4,4]
  %z = constant {value = 0.0} : f32[8]
  %a = add %u, %z : f32[8]
  %l = log %a : f32[8]
  return %n, %l
}
",
    )
    .expect("writes");
    let opt = run_tool(
        env!("CARGO_BIN_EXE_dcir-opt"),
        &[
            before.to_str().unwrap(),
            "--pipeline",
            "fold-batchnorm,canonicalize,dce",
            "-o",
            after.to_str().unwrap(),
        ],
        None,
    );
    assert!(opt.status.success(), "{}", text(&opt.stderr));
    let rewritten = std::fs::read_to_string(&after).expect("written");
    assert!(
        !rewritten.contains("batchnorm") && rewritten.contains("log %u"),
        "{rewritten}"
    );
    for by in ["use", "type"] {
        let saved = |file: &Path, tag: &str| {
            let path = dir.join(format!("{tag}-{by}.safetensors"));
            let out = dcir_run(
                &[
                    file.to_str().unwrap(),
                    "--seed",
                    "11",
                    "--random-by",
                    by,
                    "--save-inputs",
                    path.to_str().unwrap(),
                ],
                None,
            );
            assert!(out.status.success(), "{}", text(&out.stderr));
            (
                read_safetensors(&std::fs::read(&path).expect("saved")).expect("reads"),
                out,
            )
        };
        let (a, run_a) = saved(&before, "before");
        let (b, run_b) = saved(&after, "after");
        assert_eq!(a, b, "--random-by {by}: the same values before and after");
        if by == "use" {
            // Valid values, so both runs compute the same function.
            let (a, b) = (first_mean(&run_a), first_mean(&run_b));
            assert!(a.is_finite() && (a - b).abs() < 1e-4, "{a} vs {b}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The weights of an f32 model run its f16 and bf16 forms (`dcir-opt
/// --pipeline to-f16` or `to-bf16`): converted on load with one note.
#[test]
fn f32_weights_run_the_half_precision_forms() {
    let dir = temp_dir("half-weights");
    let w = dir.join("w.safetensors");
    write_tensors(&w, &[("w", f32_tensor(&[2, 3], 0.5))]);
    let w_arg = w.to_str().expect("utf-8");
    for (pass, dtype) in [("to-f16", "f16"), ("to-bf16", "bf16")] {
        let half = dir.join(format!("{dtype}.dcir"));
        let opt = run_tool(
            env!("CARGO_BIN_EXE_dcir-opt"),
            &["--pipeline", pass, "-", "-o", half.to_str().expect("utf-8")],
            Some(b"graph @g(%x: f32[4,2], %w: f32[2,3]) -> (f32[4,3]) {\n  %y = matmul %x, %w : f32[4,3]\n  return %y\n}\n"),
        );
        assert!(opt.status.success(), "{}", text(&opt.stderr));
        let out = dcir_run(&[half.to_str().expect("utf-8"), "--weights", w_arg], None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let note = text(&out.stderr);
        assert!(
            note.contains(&format!(
                "note: 1 tensor converted from f32 to {dtype} on load"
            )),
            "{note}"
        );
        assert!(text(&out.stdout).starts_with(&format!("%y {dtype}[4,3] ")));
    }
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
