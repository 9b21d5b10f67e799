//! `dcir-opt` as a user runs it: exit codes, files, standard input, flags.

mod common;

use common::{run_tool, text};
use std::process::Output;

fn dcir_opt(args: &[&str], stdin: Option<&[u8]>) -> Output {
    run_tool(env!("CARGO_BIN_EXE_dcir-opt"), args, stdin)
}

#[test]
fn prints_an_example_unchanged_but_for_comments() {
    let out = dcir_opt(&["ir-examples/conv_bias_relu.dcir"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("graph @conv_bias_relu("));
}

#[test]
fn reads_standard_input_and_roundtrips() {
    let src = b"graph @g(%x: f32[2]) -> (f32[2]) {\n  %y = relu %x : f32[2]\n  return %y\n}\n";
    let out = dcir_opt(&["--verify-roundtrip", "-"], Some(src));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, src);
}

#[test]
fn writes_the_output_file() {
    let dir = std::env::temp_dir().join(format!("dcir-opt-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let target = dir.join("out.dcir");
    let target_arg = target.to_string_lossy().into_owned();
    let out = dcir_opt(&["ir-examples/ln_gelu.dcir", "-o", &target_arg], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let written = std::fs::read_to_string(&target).expect("output written");
    assert!(written.starts_with("graph @ln_gelu("));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn diagnostics_name_file_line_and_column_and_exit_1() {
    let src = b"graph @g(%x: f32[2]) -> (f32[2]) {\n  %y = relux %x : f32[2]\n  return %y\n}\n";
    let out = dcir_opt(&[], Some(src));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("<stdin>:2:8"), "{err}");
    assert!(err.contains("did you mean `relu`?"), "{err}");
}

#[test]
fn verifier_errors_exit_1() {
    let src = b"graph @g(%x: f32[2]) -> (f32[3]) {\n  return %x\n}\n";
    let out = dcir_opt(&[], Some(src));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("<stdin>:2:3"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn bad_bytes_empty_input_and_missing_files_are_errors() {
    for (args, stdin, expected) in [
        (vec![], &b"\xff\xfe"[..], "not UTF-8"),
        (vec![], &b""[..], "expected at least one `graph`"),
        (
            vec!["no/such/file.dcir"],
            &b""[..],
            "cannot read `no/such/file.dcir`",
        ),
        (vec!["ir-examples"], &b""[..], "cannot read `ir-examples`"),
    ] {
        let out = dcir_opt(&args, Some(stdin));
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn help_explains_and_unknown_flags_fail() {
    let out = dcir_opt(&["--help"], None);
    assert!(out.status.success());
    let help = text(&out.stdout);
    assert!(
        help.contains("--verify-roundtrip") && help.contains("file:line:col"),
        "{help}"
    );
    let out = dcir_opt(&["--no-such-flag"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--no-such-flag"));
}

#[test]
fn timing_reports_each_phase() {
    let out = dcir_opt(
        &["--timing", "ir-examples/mlp_chain.dcir", "-o", "/dev/null"],
        None,
    );
    assert!(out.status.success());
    let err = text(&out.stderr);
    for phase in ["parse", "verify", "print", "total"] {
        assert!(err.contains(&format!("timing: {phase} ")), "{err}");
    }
}

#[test]
fn pipeline_errors_name_the_culprit_and_exit_1() {
    for (pipeline, expected) in [
        ("cse,dcee", "unknown pass `dcee`"),
        ("cse{x=1}", "pass `cse` has no option `x`"),
        ("cse,,dce", "missing pass name"),
        ("cse dce", "expected `,` between passes"),
    ] {
        let out = dcir_opt(&["--pipeline", pipeline, "ir-examples/ln_gelu.dcir"], None);
        assert_eq!(out.status.code(), Some(1), "{pipeline}");
        let err = text(&out.stderr);
        assert!(err.contains(expected), "{pipeline}: {err}");
        assert!(err.contains('^'), "points at the culprit: {err}");
    }
}

#[test]
fn instrumentation_flags() {
    let example = "ir-examples/bert_encoder_layer.dcir";
    let out = dcir_opt(
        &[
            "--pipeline",
            "cse,dce",
            "--print-ir-before",
            "dce",
            "--print-ir-after-all",
            "--time-passes",
            example,
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    for needle in [
        "IR Dump Before dce",
        "IR Dump After cse",
        "IR Dump After dce",
        "Pass execution timing report",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }

    let out = dcir_opt(
        &["--pipeline", "cse,dce", "--print-ir-after-change", example],
        None,
    );
    assert!(
        !text(&out.stderr).contains("IR Dump After"),
        "bert has nothing to merge or remove"
    );

    let out = dcir_opt(
        &["--pipeline", "cse,dce", "--opt-bisect-limit", "1", example],
        None,
    );
    let err = text(&out.stderr);
    assert!(err.contains("BISECT: running pass (1) cse"), "{err}");
    assert!(err.contains("BISECT: NOT running pass (2) dce"), "{err}");

    let dir = std::env::temp_dir().join(format!("dcir-dump-{}", std::process::id()));
    let dir_arg = dir.to_string_lossy().into_owned();
    let out = dcir_opt(
        &[
            "--pipeline",
            "cse,dce",
            "--dump-dir",
            &dir_arg,
            example,
            "-o",
            "/dev/null",
        ],
        None,
    );
    assert!(out.status.success());
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("dump dir written")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["00-input.dcir", "01-cse.dcir", "02-dce.dcir"]);
    std::fs::remove_dir_all(&dir).expect("cleanup");

    let out = dcir_opt(&["--list-passes"], None);
    assert!(text(&out.stdout).contains("cse"));
}

#[test]
fn fusion_flags() {
    let example = "ir-examples/resnet50_bottleneck.dcir";
    let out = dcir_opt(&["--fuse", "--verify-roundtrip", example], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ir = text(&out.stdout);
    assert_eq!(ir.matches(" = fused @g").count(), 3, "{ir}");
    assert!(ir.contains("kind = \"conv\""), "{ir}");

    let out = dcir_opt(&["--emit", "plan", example], None);
    assert!(out.status.success());
    let plan = text(&out.stdout);
    assert!(plan.contains("| total | 10 ops in 3 kernels"), "{plan}");

    let out = dcir_opt(&["--emit", "dot", example], None);
    let dot = text(&out.stdout);
    assert!(
        dot.starts_with("digraph") && dot.contains("subgraph cluster_g0"),
        "{dot}"
    );

    let out = dcir_opt(
        &["--fuse", "--explain-fusion", example, "-o", "/dev/null"],
        None,
    );
    assert!(text(&out.stderr).contains("fusion decisions for @resnet50_bottleneck"));

    let out = dcir_opt(&["--fuse", "--device", "tpu", example], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("unknown device `tpu`"));

    let out = dcir_opt(
        &["--pipeline", "canonicalize,fuse{device=v100}", example],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn emits_an_artifact_directory() {
    let out = dcir_opt(&["--emit", "artifact", "ir-examples/ln_gelu.dcir"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--emit artifact needs -o DIR"));
    if !common::nvrtc_or_skip("--emit artifact compiles with NVRTC") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("dcir-opt-artifact-{}", std::process::id()));
    let dir_arg = dir.to_string_lossy().into_owned();
    let out = dcir_opt(
        &[
            "--emit",
            "artifact",
            "-o",
            &dir_arg,
            "ir-examples/ln_gelu.dcir",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let artifact = dcir_artifact::Artifact::read_dir(&dir).expect("artifact.json reads back");
    assert_eq!(artifact.graph, "ln_gelu");
    assert_eq!(artifact.kernels.len(), artifact.launches.len());
    for kernel in &artifact.kernels {
        assert!(kernel.ptx.as_ref().is_some_and(|p| p.contains(".entry")));
        assert!(dir.join(format!("{}.cu", kernel.name)).exists());
        assert!(dir.join(format!("{}.ptx", kernel.name)).exists());
    }
    assert_eq!(artifact.inputs.len(), 4);
    assert_eq!(artifact.outputs.len(), 1);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// `--tune` needs a GPU; the plan (`--emit plan`) takes it only with
/// `--tune-fusion`, which measures the merges. Without a GPU each is a clean
/// error; with one the measured plan is a plan table.
#[test]
fn tuning_flags() {
    let out = dcir_opt(
        &["--tune", "--emit", "plan", "ir-examples/ln_gelu.dcir"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("add --tune-fusion"),
        "{}",
        text(&out.stderr)
    );
    let out = dcir_opt(
        &[
            "--tune",
            "--tune-fusion",
            "--tune-cache",
            "none",
            "--emit",
            "plan",
            "ir-examples/ln_gelu.dcir",
        ],
        None,
    );
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if out.status.success() {
        assert!(text(&out.stdout).starts_with("plan for @ln_gelu"));
        assert!(stderr.contains("with measured times"), "{stderr}");
    } else {
        assert_eq!(out.status.code(), Some(1));
        assert!(stderr.contains("no CUDA driver"), "{stderr}");
        println!("SKIP: no GPU: {}", stderr.lines().last().unwrap_or(""));
    }
}

#[test]
fn no_fuse_gives_one_kernel_per_op() {
    // ln_gelu fuses into few kernels; op by op, each op that does work is one.
    let fused = dcir_opt(&["--fuse", "ir-examples/ln_gelu.dcir"], None);
    let unfused = dcir_opt(&["--no-fuse", "ir-examples/ln_gelu.dcir"], None);
    assert!(unfused.status.success(), "{}", text(&unfused.stderr));
    let count = |out: &Output| text(&out.stdout).matches(" = fused @").count();
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../ir-examples/ln_gelu.dcir"
    );
    let source = std::fs::read_to_string(example).expect("example");
    let ops = source
        .lines()
        .filter(|l| l.contains(" = ") && !l.contains("constant"))
        .count();
    assert!(count(&fused) < count(&unfused), "{}", text(&unfused.stdout));
    assert!(count(&unfused) <= ops, "{}", text(&unfused.stdout));
    let cuda = dcir_opt(
        &["--no-fuse", "--emit", "cuda", "ir-examples/ln_gelu.dcir"],
        None,
    );
    assert!(cuda.status.success(), "{}", text(&cuda.stderr));
    assert_eq!(
        text(&cuda.stdout).matches("// ===== kernel").count(),
        count(&unfused)
    );
}

#[test]
fn verify_each_is_a_flag_or_takes_a_value_after_an_equals_sign() {
    let file = "ir-examples/conv_bias_relu.dcir";
    for args in [
        &["--verify-each", file][..],
        &[file, "--verify-each"],
        &["--verify-each=true", file],
        &["--verify-each=false", file],
    ] {
        let out = dcir_opt(args, None);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("conv2d"), "{args:?}");
    }
}

#[test]
fn every_driver_prints_its_version_and_with_v_what_it_found() {
    for (name, exe) in [
        ("dcir-opt", env!("CARGO_BIN_EXE_dcir-opt")),
        ("dcir-run", env!("CARGO_BIN_EXE_dcir-run")),
        ("dcir-import", env!("CARGO_BIN_EXE_dcir-import")),
    ] {
        for flag in ["--version", "-V"] {
            let out = run_tool(exe, &[flag], None);
            assert!(out.status.success(), "{name} {flag}");
            let stdout = text(&out.stdout);
            assert!(
                stdout.starts_with(&format!("{name} {} (", env!("CARGO_PKG_VERSION"))),
                "{stdout}"
            );
            assert_eq!(stdout.lines().count(), 1, "{stdout}");
        }
        let out = run_tool(exe, &["--version", "-v"], None);
        let stdout = text(&out.stdout);
        assert!(
            stdout.contains("\nnvrtc: ") && stdout.contains("\ncuda driver: "),
            "{stdout}"
        );
    }
}

#[test]
fn emitted_cuda_of_many_kernels_is_one_translation_unit() {
    // Unfused, the BERT layer is many kernels sharing helpers (dcir_max, ...).
    let out = dcir_opt(
        &[
            "--no-fuse",
            "--emit",
            "cuda",
            "ir-examples/bert_encoder_layer.dcir",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let source = text(&out.stdout);
    assert!(source.matches("// ===== kernel").count() > 10);
    for helper in ["// max/min/relu that propagate NaN", "float dcir_sigmoid("] {
        assert!(
            source.matches(helper).count() <= 1,
            "{helper} defined twice"
        );
    }
    if !common::nvrtc_or_skip("NVRTC") {
        return;
    }
    dcir_cuda::nvrtc::compile(&source, "bert_layer", dcir_cuda::nvrtc::DEFAULT_ARCH)
        .unwrap_or_else(|e| panic!("the emitted file does not compile: {e}"));
}

#[test]
fn fusion_is_a_pass_to_every_instrumentation_flag() {
    let file = "ir-examples/ln_gelu.dcir";
    let out = dcir_opt(&["--fuse", "--time-passes", file], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    let fuse_line = err.lines().find(|l| l.trim_end().ends_with(" fuse"));
    assert!(fuse_line.is_some(), "{err}");
    assert_eq!(
        err.matches("Pass execution timing report").count(),
        1,
        "{err}"
    );

    let out = dcir_opt(&["--fuse", "--print-ir-after", "fuse", file], None);
    let err = text(&out.stderr);
    assert!(
        err.contains("// -----// IR Dump After fuse //----- //") && err.contains("= fused @g0("),
        "{err}"
    );
    let out = dcir_opt(&["--fuse", "--print-ir-after-all", file], None);
    assert!(text(&out.stderr).contains("IR Dump After fuse"));

    let dir = std::env::temp_dir().join(format!("dcir-opt-dump-fuse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dcir_opt(&["--fuse", "--dump-dir", dir.to_str().unwrap(), file], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let fused = std::fs::read_to_string(dir.join("07-fuse.dcir")).expect("the fused IR is dumped");
    assert!(fused.contains("= fused @g0("));
    let _ = std::fs::remove_dir_all(&dir);

    for emit in ["plan", "dot", "cuda", "ir"] {
        let out = dcir_opt(&["--fuse", "--emit", emit, "--timing", file], None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("timing: fuse") && err.contains("timing: total"),
            "{emit}: {err}"
        );
    }
}

#[test]
fn the_device_preset_sets_the_artifact_architecture_and_a_bad_one_is_named() {
    let out = dcir_opt(
        &[
            "--emit",
            "artifact",
            "-o",
            "/nonexistent/x",
            "--arch",
            "sm_9x",
            "ir-examples/ln_gelu.dcir",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("`sm_9x` is not a GPU architecture"),
        "{}",
        text(&out.stderr)
    );
    if !common::nvrtc_or_skip("NVRTC") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("dcir-opt-arch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dcir_opt(
        &[
            "--device",
            "a100",
            "--emit",
            "artifact",
            "-o",
            dir.to_str().unwrap(),
            "ir-examples/ln_gelu.dcir",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("sm_80"), "{}", text(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    // CUDA 13's NVRTC no longer targets Volta.
    let out = dcir_opt(
        &[
            "--device",
            "v100",
            "--emit",
            "artifact",
            "-o",
            dir.to_str().unwrap(),
            "ir-examples/ln_gelu.dcir",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot compile for `sm_70`; it supports sm_75"),
        "{err}"
    );
    assert!(!dir.exists(), "nothing is written");
}

#[test]
fn the_plan_of_a_fused_graph_is_read_back_from_its_fused_ops() {
    let file = "ir-examples/resnet50_bottleneck.dcir";
    let direct = dcir_opt(&["--emit", "plan", file], None);
    assert!(direct.status.success(), "{}", text(&direct.stderr));
    let fused = dcir_opt(&["--fuse", file], None);
    assert!(fused.status.success());
    let total = |out: &Output| {
        text(&out.stdout)
            .lines()
            .find(|l| l.starts_with("| total"))
            .map(str::to_string)
            .unwrap_or_default()
    };
    let read_back = dcir_opt(&["--emit", "plan", "-"], Some(&fused.stdout));
    assert!(read_back.status.success(), "{}", text(&read_back.stderr));
    // The same kernels, parameters and estimates.
    assert_eq!(total(&read_back), total(&direct));
    assert!(
        total(&direct).contains("in 3 kernels"),
        "{}",
        total(&direct)
    );
    let dot = dcir_opt(&["--emit", "dot", "-"], Some(&fused.stdout));
    assert!(
        text(&dot.stdout).contains("subgraph cluster_g2"),
        "{}",
        text(&dot.stderr)
    );
    // --fuse leaves fused input as it is, as the `fuse` pass does.
    let again = dcir_opt(&["--fuse", "-"], Some(&fused.stdout));
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), text(&fused.stdout));
}

#[test]
fn the_plan_names_its_device_and_comes_as_json_too() {
    let file = "ir-examples/resnet50_bottleneck.dcir";
    let table = dcir_opt(&["--emit", "plan", "--device", "a100", file], None);
    assert!(text(&table.stdout).starts_with("plan for @resnet50_bottleneck on NVIDIA A100\n"));
    let out = dcir_opt(
        &[
            "--emit", "plan", "--format", "json", "--device", "a100", file,
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&text(&out.stdout)).expect("JSON");
    assert_eq!(doc["device"], "NVIDIA A100");
    let graph = &doc["graphs"][0];
    assert_eq!(graph["graph"], "resnet50_bottleneck");
    let groups = graph["groups"].as_array().expect("groups");
    assert_eq!(groups.len() as u64, graph["kernels"].as_u64().unwrap());
    let sum: f64 = groups
        .iter()
        .map(|g| g["estimate_us"].as_f64().unwrap())
        .sum();
    assert!((sum - graph["estimate_us"].as_f64().unwrap()).abs() < 1e-6);
    assert!(
        groups[0]["params"]
            .as_object()
            .is_some_and(|p| !p.is_empty())
    );
    assert!(
        groups[0]["ops"]
            .as_array()
            .is_some_and(|o| o.contains(&"conv2d".into()))
    );
    // The same table's numbers, and the layout decision in both forms.
    let first = text(&table.stdout)
        .lines()
        .find(|l| l.starts_with("| @g"))
        .unwrap_or_default()
        .to_string();
    let chosen = graph["layout"]["chosen"].as_str().expect("layout");
    let line = text(&table.stdout)
        .lines()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let named = if chosen == "channels-last" {
        "channels-last"
    } else {
        "as written"
    };
    assert!(
        line.starts_with(&format!("layout: {named} (estimated ")),
        "{line}"
    );
    assert!(
        first.contains(&format!(
            "{:.2}",
            groups[0]["estimate_us"].as_f64().unwrap()
        )),
        "{first}"
    );
    let bad = dcir_opt(&["--format", "json", file], None);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("--format json is a form of --emit plan"));
}

/// Without NVRTC (none on the library path), `--emit artifact` is a clear
/// error with exit code 1 and writes nothing.
#[test]
fn without_nvrtc_an_artifact_is_a_clear_error_and_nothing_is_written() {
    let out_dir = std::env::temp_dir().join(format!("dcir-opt-no-nvrtc-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dcir-opt"))
        .args([
            "ir-examples/ln_gelu.dcir",
            "--fuse",
            "--emit",
            "artifact",
            "-o",
        ])
        .arg(&out_dir)
        .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .output()
        .expect("dcir-opt starts");
    if out.status.success() {
        // NVRTC is installed where the loader looks by default.
        println!("note: NVRTC found outside LD_LIBRARY_PATH; nothing to check");
        let _ = std::fs::remove_dir_all(&out_dir);
        return;
    }
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("error: libnvrtc not found"), "{stderr}");
    assert!(!out_dir.exists(), "a half-written artifact");
}

/// The smaller items a new user met (issue 20, item 13): unknown pass names
/// in `--print-ir-*`, a UTF-8 byte order mark, control characters in a
/// diagnostic, colour, hand-edited kernel parameters out of range.
#[test]
fn small_things_a_user_meets() {
    // An unknown pass name is an error with the nearest name.
    let out = dcir_opt(
        &[
            "--print-ir-after",
            "fsue",
            "--fuse",
            "ir-examples/ln_gelu.dcir",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("--print-ir-after fsue: no pass is named `fsue`; did you mean `fuse`?"),
        "{}",
        text(&out.stderr)
    );
    let out = dcir_opt(
        &["--print-ir-before", "bogus", "ir-examples/ln_gelu.dcir"],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no pass is named `bogus`"));

    // A byte order mark is not text; the rest reads as usual.
    let plain = b"graph @g(%x: f32[2]) -> (f32[2]) {\n  %y = relu %x : f32[2]\n  return %y\n}\n";
    let bom = [b"\xef\xbb\xbf".as_slice(), plain].concat();
    let out = dcir_opt(&["-"], Some(&bom));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, plain);
    // ... and positions still count from the file's first character.
    let bad = [
        b"\xef\xbb\xbf".as_slice(),
        b"graph @g(%x: f32[2]) -> (f32[2]) {\n  %y = relux %x : f32[2]\n  return %y\n}\n",
    ]
    .concat();
    let out = dcir_opt(&["-"], Some(&bad));
    assert!(
        text(&out.stderr).contains("<stdin>:2:8"),
        "{}",
        text(&out.stderr)
    );

    // Control characters of the input never reach the terminal.
    let junk = b"graph @g(%x: f32[2]) -> (f32[2]) {\n  %y = re\x01\x1b[31mlu %x : f32[2]\n  return %y\n}\n";
    let out = dcir_opt(&["-"], Some(junk));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        !stderr.contains('\x1b') && !stderr.contains('\x01'),
        "{stderr:?}"
    );
    assert!(stderr.contains("re??[31mlu"), "{stderr}");

    // Colour: on a terminal, or forced; NO_COLOR wins.
    let colour = |vars: &[(&str, &str)]| {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dcir-opt"));
        cmd.arg("-")
            .env_remove("NO_COLOR")
            .env_remove("CLICOLOR_FORCE");
        cmd.envs(vars.iter().copied());
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("dcir-opt starts");
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(&bad)
            .expect("writes");
        text(&child.wait_with_output().expect("finishes").stderr)
    };
    assert!(!colour(&[]).contains('\x1b'), "a pipe gets no colour");
    assert!(colour(&[("CLICOLOR_FORCE", "1")]).contains("\x1b["));
    assert!(!colour(&[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")]).contains('\x1b'));

    // A hand-edited kernel parameter out of its range is an error at its
    // place, not a silent default.
    let fused = b"graph @g(%x: f32[64]) -> (f32[64]) {\n  %y = fused @g0(%x.in = %x) {kind = \"elementwise\", threads = 7} : f32[64] {\n    %r = relu %x.in : f32[64]\n    yield %r\n  }\n  return %y\n}\n";
    let out = dcir_opt(&["-", "--emit", "cuda"], Some(fused));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "`fused` parameter `threads` must be an integer, a multiple of 32 in [32, 1024]"
        ) && stderr.contains("<stdin>:2:"),
        "{stderr}"
    );
}

/// The same linear layer in f16 on the default H200: our Hopper kernel
/// (`mainloop = "wgmma"`, priced at cuBLASLt's speed) fuses the bias, and a
/// near tie goes to it rather than the call.
#[test]
fn an_f16_linear_layer_runs_our_hopper_kernel() {
    let src = b"graph @linear(%x: f16[4096,768], %w: f16[768,3072], %b: f16[3072]) -> (f16[4096,3072]) {\n\
  %h = matmul %x, %w : f16[4096,3072]\n\
  %bb = broadcast %b {dims = [1]} : f16[4096,3072]\n\
  %y = add %h, %bb : f16[4096,3072]\n\
  return %y\n}\n";
    let out = dcir_opt(&["--fuse", "-"], Some(src));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ir = text(&out.stdout);
    assert!(
        ir.contains("mainloop = \"wgmma\"") && !ir.contains("library"),
        "{ir}"
    );
}

/// A large f32 linear layer: the cost model prices cuBLASLt clearly faster
/// than our FMA kernel, so the plan calls it, says so in the plan table and
/// in `--explain-fusion`, and records the call in the artifact;
/// `--no-library` plans our kernel instead. (The same layer in f16 runs our
/// Hopper kernel on the default H200: priced at cuBLASLt's speed, a near tie
/// goes to the kernel that fuses.)
#[test]
fn library_calls_are_planned_shown_and_turned_off() {
    let src = b"graph @linear(%x: f32[4096,768], %w: f32[768,3072], %b: f32[3072]) -> (f32[4096,3072]) {\n\
  %h = matmul %x, %w : f32[4096,3072]\n\
  %bb = broadcast %b {dims = [1]} : f32[4096,3072]\n\
  %y = add %h, %bb : f32[4096,3072]\n\
  return %y\n}\n";
    let out = dcir_opt(&["--fuse", "-"], Some(src));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("library = \"cublaslt\""));

    let out = dcir_opt(
        &["--fuse", "--emit", "plan", "--explain-fusion", "-"],
        Some(src),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("| gemm (cublaslt) |"));
    let why = text(&out.stderr);
    assert!(why.contains("@g0 calls cublaslt: estimated"), "{why}");

    let out = dcir_opt(&["--fuse", "--no-library", "-"], Some(src));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ir = text(&out.stdout);
    assert!(
        !ir.contains("library") && ir.contains("math = \"fma\""),
        "{ir}"
    );
    let out = dcir_opt(
        &[
            "--fuse",
            "--no-library",
            "--emit",
            "plan",
            "--explain-fusion",
            "-",
        ],
        Some(src),
    );
    assert!(!text(&out.stderr).contains("cublaslt"));

    // The artifact records the call (no kernel source for it).
    let dir = std::env::temp_dir().join(format!("dcir-opt-lib-{}", std::process::id()));
    let dir_arg = dir.to_string_lossy().into_owned();
    let out = dcir_opt(
        &["--fuse", "--emit", "artifact", "-o", &dir_arg, "-"],
        Some(src),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = std::fs::read_to_string(dir.join("artifact.json")).expect("artifact.json");
    let artifact = dcir_artifact::Artifact::from_json(&json).expect("validates");
    let call = artifact.kernels[0]
        .library
        .as_ref()
        .expect("a library call");
    let dcir_artifact::LibraryCall::Cublaslt(g) = call else {
        panic!("a cuBLASLt call, not {call:?}");
    };
    assert_eq!((g.m, g.n, g.k, g.bias, g.c), (4096, 3072, 768, true, false));
    assert!(
        !dir.join(format!("{}.cu", artifact.kernels[0].name))
            .exists()
    );
    std::fs::remove_dir_all(&dir).expect("cleanup");

    // The verifier refuses kernel parameters beside `library`.
    let fused = b"graph @g(%x: f16[64,64], %w: f16[64,64]) -> (f16[64,64]) {\n\
  %y = fused @g0(%x.in = %x, %w.in = %w) {kind = \"gemm\", library = \"cublaslt\", threads = 128} : f16[64,64] {\n\
    %y.r = matmul %x.in, %w.in : f16[64,64]\n\
    yield %y.r\n\
  }\n\
  return %y\n}\n";
    let out = dcir_opt(&["-"], Some(fused));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("takes no kernel parameter but `heuristic_rank`, found `threads`"),
        "{}",
        text(&out.stderr)
    );
    // ... but takes the rank of the library heuristic's algorithm, which
    // nothing else takes.
    let ranked = String::from_utf8_lossy(fused).replace("threads = 128", "heuristic_rank = 3");
    let out = dcir_opt(&["-"], Some(ranked.as_bytes()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("heuristic_rank = 3"));
    // The plan read back from it shows the call and its rank.
    let out = dcir_opt(&["--emit", "plan", "-"], Some(ranked.as_bytes()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("| gemm (cublaslt, rank 3) |"),
        "{}",
        text(&out.stdout)
    );
    let unranked = ranked.replace("library = \"cublaslt\", ", "");
    let out = dcir_opt(&["-"], Some(unranked.as_bytes()));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("`heuristic_rank` picks a library's algorithm: it needs `library`"),
        "{}",
        text(&out.stderr)
    );
    // A ResNet-50 3x3 convolution at batch 32 in f16, as written (NCHW),
    // calls cuDNN (channels-last, it runs the Hopper mainloop).
    let conv = b"graph @c(%x: f16[32,64,56,56], %w: f16[64,64,3,3], %b: f16[64]) -> (f16[32,64,56,56]) {\n\
  %c = conv2d %x, %w {pad = [1, 1, 1, 1]} : f16[32,64,56,56]\n\
  %bb = broadcast %b {dims = [1]} : f16[32,64,56,56]\n\
  %a = add %c, %bb : f16[32,64,56,56]\n\
  %y = relu %a : f16[32,64,56,56]\n\
  return %y\n}\n";
    let out = dcir_opt(
        &["--fuse", "--layout", "as-written", "--emit", "cuda", "-"],
        Some(conv),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("library call c_g0: cuDNN f16 conv [32, 64, 56, 56]"),
        "{}",
        text(&out.stdout)
    );
    // A group cuBLASLt cannot run, marked as a call: a clear refusal.
    let gelu = b"graph @g(%x: f16[64,64], %w: f16[64,64]) -> (f16[64,64]) {\n\
  %y = fused @g0(%x.in = %x, %w.in = %w) {kind = \"gemm\", library = \"cublaslt\"} : f16[64,64] {\n\
    %h = matmul %x.in, %w.in : f16[64,64]\n\
    %y.r = gelu %h : f16[64,64]\n\
    yield %y.r\n\
  }\n\
  return %y\n}\n";
    let out = dcir_opt(&["--emit", "cuda", "-"], Some(gelu));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("GELU is the tanh form"),
        "{}",
        text(&out.stderr)
    );
}
