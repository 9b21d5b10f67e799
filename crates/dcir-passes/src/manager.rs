//! Runs a pipeline of passes with the instrumentation users debug with.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use dcir_ir::{Module, VerifyError, print_module, verify_module};

use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError};

/// What to print, check and record around each pass (MLIR's flag names).
#[derive(Clone, Debug, Default)]
pub struct Instrumentation {
    /// Print the IR before these passes (by name).
    pub print_before: Vec<String>,
    /// Print the IR after these passes (by name).
    pub print_after: Vec<String>,
    /// Print the IR after every pass.
    pub print_after_all: bool,
    /// Print the IR after every pass that changed it.
    pub print_after_change: bool,
    /// Verify the module after every pass.
    pub verify_each: bool,
    /// Measure each pass.
    pub time_passes: bool,
    /// Write the input and the IR after each pass here, one numbered file each.
    pub dump_dir: Option<PathBuf>,
    /// Run only the first N passes that are not required; skip the rest.
    pub bisect_limit: Option<usize>,
}

/// One pass's record in a run.
#[derive(Clone, Debug, PartialEq)]
pub struct PassRecord {
    /// The pass.
    pub name: &'static str,
    /// False when the bisect limit skipped it.
    pub ran: bool,
    /// Whether it changed the module.
    pub changed: bool,
    /// Time it took (verification excluded).
    pub time: Duration,
}

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineFailure {
    /// A pass returned an error.
    #[error("pass `{pass}` failed: {error}")]
    Pass {
        /// The pass.
        pass: &'static str,
        /// Its error.
        error: PassError,
    },
    /// The module did not verify after a pass.
    #[error("the IR does not verify after pass `{pass}`")]
    Verify {
        /// The pass that broke it.
        pass: &'static str,
        /// The violations.
        errors: Vec<VerifyError>,
        /// The offending IR.
        ir: String,
    },
    /// Writing a dump or a log failed.
    #[error("cannot write {what}: {error}")]
    Io {
        /// What was being written.
        what: String,
        /// The I/O error.
        error: std::io::Error,
    },
}

/// A pipeline ready to run.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    instrumentation: Instrumentation,
    /// The passes and steps run so far, for the timing report.
    records: Vec<PassRecord>,
    /// Files written to the dump directory so far (the next one's number).
    dumped: usize,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PipelineFailure {
    let what = what.into();
    move |error| PipelineFailure::Io { what, error }
}

impl PassManager {
    /// A manager for `passes`, instrumented as asked.
    pub fn new(passes: Vec<Box<dyn Pass>>, instrumentation: Instrumentation) -> PassManager {
        PassManager {
            passes,
            instrumentation,
            records: Vec::new(),
            dumped: 0,
        }
    }

    /// Runs every pass on `module` in order, then writes the timing report
    /// (`time_passes`). IR dumps, bisect lines and the report go to `log`
    /// (standard error, for the drivers).
    pub fn run(
        &mut self,
        module: &mut Module,
        log: &mut dyn Write,
    ) -> Result<Vec<PassRecord>, PipelineFailure> {
        self.run_passes(module, log)?;
        self.finish(log)
    }

    /// Runs every pass on `module` in order, without the timing report: a
    /// driver that runs [`PassManager::run_step`]s after the passes calls
    /// [`PassManager::finish`] once they are done.
    pub fn run_passes(
        &mut self,
        module: &mut Module,
        log: &mut dyn Write,
    ) -> Result<(), PipelineFailure> {
        let ins = &self.instrumentation;
        let mut analyses = AnalysisManager::new();
        let records = &mut self.records;
        let mut bisect_count = 0;
        dump_input(ins, &mut self.dumped, module)?;
        for pass in self.passes.iter_mut() {
            let name = pass.name();
            if !pass.is_required() {
                bisect_count += 1;
            }
            if let Some(limit) = ins.bisect_limit {
                let runs = pass.is_required() || bisect_count <= limit;
                let verb = if runs { "running" } else { "NOT running" };
                writeln!(log, "BISECT: {verb} pass ({bisect_count}) {name}")
                    .map_err(io("the log"))?;
                if !runs {
                    records.push(PassRecord {
                        name,
                        ran: false,
                        changed: false,
                        time: Duration::ZERO,
                    });
                    continue;
                }
            }
            if ins.print_before.iter().any(|p| p == name) {
                dump(log, "Before", name, module)?;
            }
            let start = Instant::now();
            let result = pass
                .run(module, &mut analyses)
                .map_err(|error| PipelineFailure::Pass { pass: name, error })?;
            let time = start.elapsed();
            if result.changed {
                analyses.invalidate_except(&result.preserved);
            }
            records.push(PassRecord {
                name,
                ran: true,
                changed: result.changed,
                time,
            });
            after_pass(ins, &mut self.dumped, log, name, result.changed, module)?;
        }
        Ok(())
    }

    /// Runs `step`, a transformation that is no registered pass (the
    /// drivers' fusion, which plans with options a pipeline cannot hold),
    /// under the instrumentation of a pass named `name`: printed before and
    /// after, verified, dumped and timed like one. `step` says whether it
    /// changed the module; its own error is the inner `Err`.
    pub fn run_step<E>(
        &mut self,
        name: &'static str,
        module: &mut Module,
        log: &mut dyn Write,
        step: impl FnOnce(&mut Module) -> Result<bool, E>,
    ) -> Result<Result<(), E>, PipelineFailure> {
        let ins = &self.instrumentation;
        dump_input(ins, &mut self.dumped, module)?;
        if ins.print_before.iter().any(|p| p == name) {
            dump(log, "Before", name, module)?;
        }
        let start = Instant::now();
        let changed = match step(module) {
            Ok(changed) => changed,
            Err(e) => return Ok(Err(e)),
        };
        self.records.push(PassRecord {
            name,
            ran: true,
            changed,
            time: start.elapsed(),
        });
        after_pass(ins, &mut self.dumped, log, name, changed, module)?;
        Ok(Ok(()))
    }

    /// Writes the timing report of every pass and step run so far (with
    /// `time_passes`) and returns their records.
    pub fn finish(&mut self, log: &mut dyn Write) -> Result<Vec<PassRecord>, PipelineFailure> {
        let records = std::mem::take(&mut self.records);
        if self.instrumentation.time_passes {
            write_timing(log, &records).map_err(io("the log"))?;
        }
        Ok(records)
    }
}

/// What follows pass (or step) `name`: verification (`verify_each`), the IR
/// printed after it when asked, and its dump.
fn after_pass(
    ins: &Instrumentation,
    dumped: &mut usize,
    log: &mut dyn Write,
    name: &'static str,
    changed: bool,
    module: &Module,
) -> Result<(), PipelineFailure> {
    if ins.verify_each
        && let Err(errors) = verify_module(module)
    {
        return Err(PipelineFailure::Verify {
            pass: name,
            errors,
            ir: print_module(module),
        });
    }
    let asked = ins.print_after_all || ins.print_after.iter().any(|p| p == name);
    if asked || (ins.print_after_change && changed) {
        dump(log, "After", name, module)?;
    }
    dump_after(ins, dumped, name, module)
}

/// Writes the input to the dump directory (`00-input.dcir`), once.
fn dump_input(
    ins: &Instrumentation,
    dumped: &mut usize,
    module: &Module,
) -> Result<(), PipelineFailure> {
    let Some(dir) = &ins.dump_dir else {
        return Ok(());
    };
    if *dumped > 0 {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(io(dir.display().to_string()))?;
    let path = dir.join("00-input.dcir");
    std::fs::write(&path, print_module(module)).map_err(io(path.display().to_string()))?;
    *dumped = 1;
    Ok(())
}

/// Writes the IR after pass `name` to the dump directory, numbered in run order.
fn dump_after(
    ins: &Instrumentation,
    dumped: &mut usize,
    name: &str,
    module: &Module,
) -> Result<(), PipelineFailure> {
    let Some(dir) = &ins.dump_dir else {
        return Ok(());
    };
    let path = dir.join(format!("{:02}-{name}.dcir", *dumped));
    std::fs::write(&path, print_module(module)).map_err(io(path.display().to_string()))?;
    *dumped += 1;
    Ok(())
}

fn dump(
    log: &mut dyn Write,
    when: &str,
    pass: &str,
    module: &Module,
) -> Result<(), PipelineFailure> {
    write!(
        log,
        "// -----// IR Dump {when} {pass} //----- //\n{}\n",
        print_module(module)
    )
    .map_err(io("the log"))
}

fn write_timing(log: &mut dyn Write, records: &[PassRecord]) -> std::io::Result<()> {
    let total: Duration = records.iter().map(|r| r.time).sum();
    writeln!(
        log,
        "===-------------------------------------------------------------------------==="
    )?;
    writeln!(
        log,
        "                         ... Pass execution timing report ..."
    )?;
    writeln!(
        log,
        "===-------------------------------------------------------------------------==="
    )?;
    writeln!(
        log,
        "  Total Execution Time: {:.4} seconds\n",
        total.as_secs_f64()
    )?;
    writeln!(log, "  ---Wall Time---  ---Name---")?;
    for r in records {
        let share = if total.is_zero() {
            0.0
        } else {
            100.0 * r.time.as_secs_f64() / total.as_secs_f64()
        };
        let note = if r.ran { "" } else { " (skipped by bisect)" };
        writeln!(
            log,
            "  {:.4} ({share:5.1}%)  {}{note}",
            r.time.as_secs_f64(),
            r.name
        )?;
    }
    writeln!(log, "  {:.4} (100.0%)  Total", total.as_secs_f64())
}
