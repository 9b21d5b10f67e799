//! The machine code of the tensor-core kernels, read back: every kernel the
//! emitter writes for a `math = "tensor_core"` group multiplies on the
//! tensor cores (`HMMA` in its SASS; `HGMMA`, Hopper's warpgroup MMA, for
//! `mainloop = "wgmma"` GEMMs and implicit-GEMM convolutions, which also copy
//! tiles with TMA, `UTMALDG`, tiled or im2col), and no
//! kernel touches local memory (`LDL`/`STL`: spilled registers or arrays the
//! compiler could not keep in registers). NVRTC compiles for `sm_90`
//! (`sm_90a` for the Hopper kernels); `nvdisasm` disassembles (the
//! `nvidia-cuda-nvdisasm` wheel CI installs, `$DCIR_NVDISASM`, or one on the
//! `PATH`). Without either the test prints `SKIP` (a failure under
//! `DCIR_REQUIRE_NVRTC`, as in CI).

use std::path::PathBuf;
use std::process::Command;

use dcir_cuda::{BuildOptions, CudaTarget, build_artifact};
use dcir_fusion::{CostModel, DeviceSpec, apply_plan, plan_graph};

/// An `nvdisasm` that runs: `$DCIR_NVDISASM`, the one in the NVIDIA wheels'
/// `cu13/bin`, or the `PATH`'s.
fn nvdisasm() -> Option<PathBuf> {
    let wheel = Command::new("python3")
        .args(["-c", "import nvidia; print(nvidia.__path__[0])"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("cu13/bin/nvdisasm")
        });
    let candidates = std::env::var_os("DCIR_NVDISASM")
        .map(PathBuf::from)
        .into_iter()
        .chain(wheel)
        .chain([PathBuf::from("nvdisasm")]);
    candidates.into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The tools this test needs, or (after printing `SKIP`) none; a failure
/// instead under `DCIR_REQUIRE_NVRTC`.
fn tools() -> Option<PathBuf> {
    let missing = match (dcir_cuda::nvrtc::unavailable_reason(), nvdisasm()) {
        (None, Some(tool)) => return Some(tool),
        (Some(reason), _) => reason,
        (None, None) => {
            "nvdisasm not found (python3 -m pip install nvidia-cuda-nvdisasm, or set DCIR_NVDISASM)"
                .to_string()
        }
    };
    assert!(std::env::var("DCIR_REQUIRE_NVRTC").is_err(), "{missing}");
    println!("SKIP: {missing}");
    None
}

/// `cubin`'s SASS, by `tool`.
fn disassemble(tool: &PathBuf, cubin: &[u8], name: &str) -> String {
    let path = std::env::temp_dir().join(format!("dcir_sass_{}_{name}.cubin", std::process::id()));
    std::fs::write(&path, cubin).expect("writes the cubin");
    let out = Command::new(tool)
        .arg(&path)
        .output()
        .expect("runs nvdisasm");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "nvdisasm {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn tensor_core_kernels_run_hmma_and_touch_no_local_memory() {
    let Some(tool) = tools() else {
        return;
    };
    let model = CostModel::kernels_only(DeviceSpec::preset("h200").expect("preset"));
    let options = BuildOptions {
        arch: "sm_90".into(),
        compile: true,
    };
    let (mut tensor_core, mut hopper) = (0, 0);
    for file in [
        "gemm_tc",
        "conv_tc",
        "attention_tc",
        "gemm_wgmma",
        "conv_wgmma",
    ] {
        let path = format!(
            "{}/../../tests/filetests/cuda/{file}.dcir",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("reads the filetest");
        let module = dcir_reader::parse_module(&text).unwrap_or_else(|e| panic!("{path}: {e:?}"));
        for graph in &module.graphs {
            // Graphs written with their `fused` ops (hand-set parameters) as they are.
            let written_fused = graph
                .all_ops()
                .iter()
                .any(|&o| graph.op(o).kind == dcir_ir::OpKind::Fused);
            let fused = match written_fused {
                true => graph.clone(),
                false => {
                    let plan = plan_graph(graph, &model, &CudaTarget).expect("plans");
                    apply_plan(graph, &plan).expect("applies")
                }
            };
            let artifact = build_artifact(&fused, &options)
                .unwrap_or_else(|e| panic!("@{}: {e}", graph.name()));
            for kernel in &artifact.kernels {
                let Some(cubin) = &kernel.cubin else {
                    continue;
                };
                let sass = disassemble(&tool, cubin, &kernel.name);
                let local: Vec<&str> = sass
                    .lines()
                    .filter(|l| l.contains(" LDL") || l.contains(" STL"))
                    .collect();
                assert!(
                    local.is_empty(),
                    "{} ({}) touches local memory:\n{}",
                    kernel.name,
                    kernel.summary,
                    local.join("\n")
                );
                if kernel.requires_arch.is_some() {
                    hopper += 1;
                    for needed in ["HGMMA", "UTMALDG", "SYNCS"] {
                        assert!(
                            sass.contains(needed),
                            "{} ({}) has no {needed}",
                            kernel.name,
                            kernel.summary
                        );
                    }
                } else if kernel.summary.contains("tensor cores") {
                    tensor_core += 1;
                    assert!(
                        sass.contains("HMMA"),
                        "{} ({}) has no HMMA",
                        kernel.name,
                        kernel.summary
                    );
                }
            }
        }
    }
    assert!(tensor_core >= 20, "{tensor_core} tensor-core kernels read");
    assert!(hopper >= 8, "{hopper} Hopper kernels read");
}
