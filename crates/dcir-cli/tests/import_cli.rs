//! `dcir-import` end to end: files written, refusals reported with exit code 1.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn onnx_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dcir-onnx")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dcir-import-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn import(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dcir-import"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn writes_ir_and_weights_that_dcir_opt_accepts() {
    let dir = scratch("ok");
    let out = dir.join("model.dcir");
    let model = onnx_dir().join("tests/fixtures/conv_bias_relu.onnx");
    let o = import(&[
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--graph-name",
        "@net",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The weights get the mode the IR file gets (0666 less the umask), not
    // the temporary file's 0600.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("model.safetensors")), mode(&out));
    }
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.starts_with("graph @net(%x: f32[1,3,9,8], %w: f32[4,3,3,3], %b: f32[4])"),
        "{text}"
    );
    assert!(dir.join("model.safetensors").exists());
    let opt = Command::new(env!("CARGO_BIN_EXE_dcir-opt"))
        .args(["--pipeline", "canonicalize,cse,dce", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(opt.status.success(), "{}", stderr(&opt));
    // Deterministic output.
    let again = dir.join("again.dcir");
    assert!(
        import(&[
            model.to_str().unwrap(),
            "-o",
            again.to_str().unwrap(),
            "--graph-name",
            "net"
        ])
        .status
        .success()
    );
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        std::fs::read(dir.join("again.safetensors")).unwrap()
    );
}

#[test]
fn default_output_is_beside_the_model() {
    let dir = scratch("default");
    let model = dir.join("resnet50.onnx");
    std::fs::copy(onnx_dir().join("models/mobilenet_v2.onnx"), &model).unwrap();
    let o = import(&[model.to_str().unwrap(), "--timing"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("seeded random values"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("timing: total"), "{}", stderr(&o));
    assert!(dir.join("resnet50.dcir").exists());
    assert!(dir.join("resnet50.safetensors").exists());
}

#[test]
fn refusals_exit_with_1() {
    let fixtures = onnx_dir().join("tests/fixtures");
    let o = import(&[
        fixtures.join("unsupported.onnx").to_str().unwrap(),
        "-o",
        "/dev/null",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("NonZero (1 node, `my_nonzero`, #3 of 5)"),
        "{}",
        stderr(&o)
    );

    let dir = scratch("dyn");
    let out = dir.join("d.dcir");
    let model = fixtures.join("dynamic.onnx");
    let o = import(&[model.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--dim batch=VALUE"), "{}", stderr(&o));
    let o = import(&[
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--dim",
        "batch=4",
        "--dim",
        "x:2=2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .contains("%x: f32[4,3,2]")
    );

    let garbage = dir.join("garbage.onnx");
    std::fs::write(&garbage, b"\x0a\xff\xff\xff\xff garbage").unwrap();
    let o = import(&[garbage.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not a valid ONNX model"),
        "{}",
        stderr(&o)
    );

    let o = import(&["--dim", "nonsense", model.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn input_value_makes_an_input_a_known_constant() {
    use dcir_onnx::proto::{
        GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
        TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
    };
    use prost::Message;
    let info = |name: &str, elem: i32, dims: &[i64]| ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    // ReduceSum (opset 13) whose axes are a graph input.
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(13),
        }],
        graph: Some(GraphProto {
            name: Some("g".into()),
            node: vec![NodeProto {
                op_type: Some("ReduceSum".into()),
                input: vec!["x".into(), "axes".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![info("x", 1, &[2, 3]), info("axes", 7, &[1])],
            output: vec![info("y", 1, &[1, 3])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let dir = scratch("input-value");
    let path = dir.join("reduce.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    let axes = TensorProto {
        dims: vec![1],
        data_type: Some(7),
        int64_data: vec![0],
        ..Default::default()
    };
    let axes_path = dir.join("axes.pb");
    std::fs::write(&axes_path, axes.encode_to_vec()).unwrap();
    let out = dir.join("reduce.dcir");
    let (model, out_s) = (path.to_str().unwrap(), out.to_str().unwrap());
    // Without the value: a clear refusal naming the input.
    let o = import(&[model, "-o", out_s]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("must be known at import time"),
        "{}",
        stderr(&o)
    );
    let value = format!("axes={}", axes_path.display());
    let o = import(&[model, "-o", out_s, "--input-value", &value]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ir = std::fs::read_to_string(&out).unwrap();
    assert!(
        ir.contains("reduce_sum %x {axes = [0], keepdims = true} : f32[1,3]"),
        "{ir}"
    );
    assert!(!ir.contains("%axes"), "{ir}");
    // A malformed flag is an error naming the form.
    let o = import(&[model, "--input-value", "axes"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("expected NAME=FILE"), "{}", stderr(&o));
}
