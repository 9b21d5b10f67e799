//! The downstream tool works end to end: its pass runs by name, with options,
//! next to the built-in ones, and the flags of dcir-opt work.

use std::io::Write;
use std::process::{Command, Stdio};

fn my_opt(args: &[&str], input: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_my-opt"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("my-opt starts");
    // A usage error exits before reading standard input: a closed pipe is fine.
    let written = child
        .stdin
        .take()
        .expect("piped")
        .write_all(input.as_bytes());
    if let Err(e) = written {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "input written: {e}"
        );
    }
    let out = child.wait_with_output().expect("my-opt finishes");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

const CUBE: &str = "graph @cube(%x: f32[8]) -> (f32[8]) {
  %three = constant {value = 3.0} : f32[]
  %n = broadcast %three {dims = []} : f32[8]
  %y = pow %x, %n : f32[8]
  return %y
}
";

#[test]
fn pow_to_mul_runs_with_the_builtin_passes() {
    let (code, out, err) = my_opt(&["--pipeline", "pow-to-mul,dce"], CUBE);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        // The output keeps its name (`replace_all_uses` hands it over).
        "graph @cube(%x: f32[8]) -> (f32[8]) {\n  %pow = mul %x, %x : f32[8]\n  %y = mul %pow, %x : f32[8]\n  return %y\n}\n"
    );
}

#[test]
fn options_are_typed_and_checked() {
    let (code, out, _) = my_opt(&["--pipeline", "pow-to-mul{max-exponent=2},dce"], CUBE);
    assert_eq!(code, 0);
    assert!(
        out.contains("pow %x, %n"),
        "exponent 3 is over the limit: {out}"
    );
    let (code, _, err) = my_opt(&["--pipeline", "pow-to-mul{max-exponent=0}"], CUBE);
    assert_eq!(code, 1);
    assert!(err.contains("max-exponent must be at least 1"), "{err}");
}

#[test]
fn lists_its_pass_and_keeps_dcir_opt_flags() {
    let (code, out, _) = my_opt(&["--list-passes"], "");
    assert_eq!(code, 0);
    assert!(out.contains("pow-to-mul") && out.contains("cse"), "{out}");
    let (code, _, err) = my_opt(&["--pipeline", "pow-to-mul", "--print-ir-after-all"], CUBE);
    assert_eq!(code, 0);
    assert!(err.contains("IR Dump After pow-to-mul"), "{err}");
    let (_, help, _) = my_opt(&["--help"], "");
    assert!(help.contains("Usage: my-opt"), "{help}");
}
