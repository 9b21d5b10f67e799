//! Refusals: unsupported ops, dynamic dims, bad bytes. Every failure is an
//! error with a clear message, never a panic.

use std::path::{Path, PathBuf};

use dcir_onnx::{ImportError, ImportOptions, import_bytes, import_file};
use proptest::prelude::*;

mod common;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn unsupported_ops_are_summarized_by_type_with_the_first_node_of_each() {
    let err = import_file(&fixture("unsupported.onnx"), &ImportOptions::default()).unwrap_err();
    let msg = err.to_string();
    // Every node is in the error value; the message names each type once.
    assert!(
        matches!(err, ImportError::Unsupported(ref v) if v.len() == 3),
        "{msg}"
    );
    assert_eq!(
        msg,
        "unsupported ONNX ops: TopK (2 nodes, the first `my_topk`, #1 of 5), \
         NonZero (1 node, `my_nonzero`, #3 of 5)"
    );
}

#[test]
fn dynamic_dims_ask_for_values() {
    let err = import_file(&fixture("dynamic.onnx"), &ImportOptions::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("--dim batch=VALUE"), "{msg}");
    assert!(msg.contains("--dim x:2=VALUE"), "{msg}");
    let opts = ImportOptions {
        dims: vec![("batch".into(), 2), ("x:2".into(), 5)],
        ..Default::default()
    };
    let m = import_file(&fixture("dynamic.onnx"), &opts).unwrap();
    let g = &m.module.graphs[0];
    assert_eq!(g.ty(g.params()[0]).to_string(), "f32[2,3,5]");
}

#[test]
fn a_dim_option_that_matches_nothing_names_the_dims_the_model_has() {
    // `x` is [batch, 3, ?]: a fixed dim, a misspelt name and an input the
    // model does not have match nothing.
    for key in ["x:1", "btch", "input:0"] {
        let opts = ImportOptions {
            dims: vec![("batch".into(), 2), ("x:2".into(), 5), (key.into(), 32)],
            ..Default::default()
        };
        let err = import_file(&fixture("dynamic.onnx"), &opts).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ImportError::UnmatchedDims { ref unmatched, .. } if unmatched == &[key]),
            "{msg}"
        );
        assert!(
            msg.starts_with(&format!("`--dim {key}` matches no dynamic dim")),
            "{msg}"
        );
        assert!(msg.contains("its inputs: `x` [batch, 3, x:2?]"), "{msg}");
    }
    // A fixed dim given its own value is no change.
    let opts = ImportOptions {
        dims: vec![("batch".into(), 2), ("x:2".into(), 5), ("x:1".into(), 3)],
        ..Default::default()
    };
    assert!(import_file(&fixture("dynamic.onnx"), &opts).is_ok());
}

#[test]
fn stripped_initializers_get_seeded_values() {
    let a = import_file(&fixture("stripped.onnx"), &ImportOptions::default()).unwrap();
    let b = import_file(&fixture("stripped.onnx"), &ImportOptions::default()).unwrap();
    let c = import_file(
        &fixture("stripped.onnx"),
        &ImportOptions {
            seed: 1,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(a.weights.len(), 1);
    assert!(a.weights[0].seeded);
    assert_eq!(a.weights[0].name, "w");
    assert_eq!(a.weights[0].bytes.len(), 4 * 12);
    assert_eq!(a.weights, b.weights);
    assert_ne!(a.weights[0].bytes, c.weights[0].bytes);
}

#[test]
fn external_data_needs_a_file() {
    let bytes = std::fs::read(fixture("ext_weights.onnx")).unwrap();
    let msg = import_bytes(&bytes, &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("ext_weights.data"), "{msg}");
}

#[test]
fn truncated_models_are_errors() {
    let bytes = std::fs::read(fixture("conv_bias_relu.onnx")).unwrap();
    for cut in (0..bytes.len()).step_by(7) {
        let r = import_bytes(&bytes[..cut], &ImportOptions::default());
        if let Err(e) = r {
            assert!(!e.to_string().is_empty());
        }
    }
    let err = import_bytes(&bytes[..bytes.len() - 3], &ImportOptions::default()).unwrap_err();
    assert!(matches!(err, ImportError::Decode(_)), "{err}");
    let err = import_bytes(b"\xff\xff\xff garbage", &ImportOptions::default()).unwrap_err();
    assert!(err.to_string().contains("not a valid ONNX model"), "{err}");
}

#[test]
fn an_empty_file_has_no_graph() {
    let err = import_bytes(&[], &ImportOptions::default()).unwrap_err();
    assert!(err.to_string().contains("no graph"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..dcir_testgen::proptest_config() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = import_bytes(&bytes, &ImportOptions::default());
        let _ = dcir_onnx::decode_tensor(&bytes);
    }

    #[test]
    fn corrupted_models_never_panic(
        which in 0usize..4,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let name = ["conv_bias_relu", "shape_arith", "pools", "concat_slice_gather"][which];
        let mut bytes = std::fs::read(fixture(&format!("{name}.onnx"))).unwrap();
        for (i, b) in edits {
            let i = i.index(bytes.len());
            bytes[i] = b;
        }
        let keep = cut.index(bytes.len() + 1);
        bytes.truncate(keep.max(bytes.len() / 2));
        let _ = import_bytes(&bytes, &ImportOptions::default());
    }
}

/// `decode_tensor` reads a `TensorProto` (the ONNX backend tests' `.pb`
/// files) in dcir's encoding; what dcir cannot hold is an error.
#[test]
fn decode_tensor_reads_a_tensor_proto() {
    use dcir_onnx::decode_tensor;
    use dcir_onnx::proto::TensorProto;
    use prost::Message;

    let t = TensorProto {
        name: Some("input_0".to_string()),
        dims: vec![2],
        data_type: Some(2), // UINT8, widened to i32
        raw_data: Some(vec![7, 250]),
        ..Default::default()
    };
    let d = decode_tensor(&t.encode_to_vec()).unwrap();
    assert_eq!(d.name, "input_0");
    assert_eq!(d.onnx_type, "UINT8");
    assert_eq!(d.ty.to_string(), "i32[2]");
    let mut want = 7i32.to_le_bytes().to_vec();
    want.extend(250i32.to_le_bytes());
    assert_eq!(d.bytes, want);
    // Types dcir lacks, missing data and garbage are errors.
    let fp8 = TensorProto {
        dims: vec![1],
        data_type: Some(17),
        raw_data: Some(vec![0]),
        ..Default::default()
    };
    let msg = decode_tensor(&fp8.encode_to_vec()).unwrap_err().to_string();
    assert!(msg.contains("FLOAT8E4M3FN is not supported"), "{msg}");
    let empty = TensorProto {
        dims: vec![3],
        data_type: Some(1), // FLOAT
        ..Default::default()
    };
    let msg = decode_tensor(&empty.encode_to_vec())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no data"), "{msg}");
    assert!(decode_tensor(&[0xff, 0xff, 0xff]).is_err());
}

#[test]
fn an_unsupported_element_type_is_not_an_invalid_model() {
    // Valid ONNX that dcir leaves out.
    for (elem, name) in [
        (common::FLOAT8E4M3FN, "FLOAT8E4M3FN"),
        (common::STRING, "STRING"),
    ] {
        let nodes = vec![common::node("Identity", &["x"], "y", vec![])];
        let bytes = common::model_typed(19, nodes, &[("x", elem, &[])], &[("y", elem, &[])]);
        let err = import_bytes(&bytes, &ImportOptions::default()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ImportError::NotSupported { .. }), "{msg}");
        assert!(
            msg.contains(name) && !msg.contains("invalid model"),
            "{msg}"
        );
    }
}

/// Every input the fuzzer found to crash the importer (`tests/fuzz/`, one
/// file each, named after the bug) is now an import error or a module that
/// verifies.
#[test]
fn fuzz_regressions_import_or_refuse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/fuzz")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let bytes = std::fs::read(&file).expect("readable");
        match import_bytes(&bytes, &ImportOptions::default()) {
            Ok(imported) => dcir_ir::verify_module(&imported.module)
                .unwrap_or_else(|e| panic!("{}: {e:?}", file.display())),
            // A message quotes no constant whole (one listed 33 M axes).
            Err(e) => assert!(e.to_string().len() < 4000, "{}: {e}", file.display()),
        }
    }
}
