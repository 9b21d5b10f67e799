//! A pass that breaks the IR or fails is reported, with exit code 1, through
//! the same `main_with` a downstream tool uses.

use std::ffi::OsString;
use std::process::ExitCode;

use dcir_ir::{Module, OpKind};
use dcir_passes::analysis::AnalysisManager;
use dcir_passes::{Pass, PassDef, PassError, PassOptions, PassRegistry, PassResult};

/// Removes the first op of each graph without rewriting its users.
struct Vandal;

impl Pass for Vandal {
    fn name(&self) -> &'static str {
        "vandal"
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        for graph in &mut module.graphs {
            let first = graph.block(graph.body()).ops[0];
            graph.remove_op(first);
        }
        Ok(PassResult::changed())
    }
}

/// Fails on the first `relu` it sees.
struct Refuser;

impl Pass for Refuser {
    fn name(&self) -> &'static str {
        "refuser"
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        let graph = &module.graphs[0];
        match graph
            .all_ops()
            .into_iter()
            .find(|&o| graph.op(o).kind == OpKind::Relu)
        {
            Some(op) => Err(PassError::at("relu is not supported here", graph, op)),
            None => Ok(PassResult::unchanged()),
        }
    }
}

fn registry() -> PassRegistry {
    let mut registry = PassRegistry::with_builtins();
    let vandal = PassDef {
        name: "vandal",
        summary: "breaks the IR",
        options: &[],
        create: |_: &PassOptions| Ok(Box::new(Vandal)),
    };
    let refuser = PassDef {
        name: "refuser",
        summary: "fails",
        options: &[],
        create: |_: &PassOptions| Ok(Box::new(Refuser)),
    };
    registry.register(vandal).expect("new name");
    registry.register(refuser).expect("new name");
    assert!(registry.register(vandal).is_err(), "names are unique");
    registry
}

fn run(args: &[&str]) -> ExitCode {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../ir-examples/conv_bias_relu.dcir"
    );
    let args = ["t"]
        .iter()
        .chain(args)
        .chain([&example])
        .map(OsString::from);
    dcir_cli::opt::main_with("t", &registry(), args)
}

#[test]
fn a_pass_that_breaks_the_ir_fails_the_run() {
    assert_eq!(
        run(&["--pipeline", "vandal", "-o", "/dev/null"]),
        ExitCode::FAILURE
    );
    assert_eq!(
        run(&[
            "--pipeline",
            "vandal",
            "--verify-each=false",
            "-o",
            "/dev/null"
        ]),
        ExitCode::SUCCESS,
        "without verification the broken IR is printed"
    );
}

#[test]
fn a_failing_pass_fails_the_run() {
    assert_eq!(
        run(&["--pipeline", "refuser", "-o", "/dev/null"]),
        ExitCode::FAILURE
    );
    assert_eq!(
        run(&["--pipeline", "cse", "-o", "/dev/null"]),
        ExitCode::SUCCESS
    );
}
