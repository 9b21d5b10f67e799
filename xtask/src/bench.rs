//! `cargo xtask bench`: time the compiler on generated graphs and print
//! markdown table rows for `docs/benchmarks.md`.
//!
//! Each benchmark is a function returning a [`Row`]; [`run`] lists them.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::chaingen;

/// Runs of each measured command; the row reports medians.
const RUNS: usize = 20;

/// One benchmark's result.
struct Row {
    /// The benchmarked graph.
    graph: String,
    /// Its op count.
    ops: usize,
    /// Median milliseconds of each phase, in the order the tool printed them.
    phases: Vec<(String, f64)>,
}

/// Every benchmark, given the release `dcir-opt`; a new one is a function and a line here.
const BENCHES: &[fn(&Path) -> Result<Row>] = &[chain10k];

/// Runs every benchmark and prints a markdown table for each.
pub fn run() -> Result<()> {
    let opt = crate::build_dcir_opt()?;
    let machine = machine()?;
    let date = capture(Command::new("date").args(["-u", "+%Y-%m-%d"]))?;
    for bench in BENCHES {
        print_row(&bench(&opt)?, &date, &machine);
    }
    Ok(())
}

/// Parse, verify and print of a 10,000-op graph with `dcir-opt --timing`.
fn chain10k(opt: &Path) -> Result<Row> {
    let ops = 10_000;
    let dir = crate::target_dir()?.join("bench");
    fs::create_dir_all(&dir)?;
    let file = dir.join("chain10k.dcir");
    fs::write(&file, chaingen::chain(ops))?;
    println!("bench: {} ({ops} ops), {RUNS} runs", file.display());
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        let out = Command::new(opt)
            .arg("--timing")
            .arg(&file)
            .args(["-o", "/dev/null"])
            .output()
            .with_context(|| format!("cannot run {}", opt.display()))?;
        let wall = start.elapsed().as_secs_f64() * 1e3;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!("dcir-opt failed on {}:\n{stderr}", file.display());
        }
        let mut phases = parse_timing(&stderr);
        phases.push(("wall".to_string(), wall));
        runs.push(phases);
    }
    Ok(Row {
        graph: "chain10k".to_string(),
        ops,
        phases: medians(&runs),
    })
}

/// The phase lines `timing: <phase> <ms> ms` of a `--timing` run.
fn parse_timing(stderr: &str) -> Vec<(String, f64)> {
    stderr
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("timing: ")?.strip_suffix(" ms")?;
            let (phase, ms) = rest.rsplit_once(' ')?;
            Some((phase.trim().to_string(), ms.parse().ok()?))
        })
        .collect()
}

/// The median of each phase over `runs`, phases in the first run's order.
fn medians(runs: &[Vec<(String, f64)>]) -> Vec<(String, f64)> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|(phase, _)| {
            let mut ms: Vec<f64> = runs
                .iter()
                .flat_map(|run| run.iter().filter(|(p, _)| p == phase).map(|&(_, t)| t))
                .collect();
            ms.sort_by(f64::total_cmp);
            let mid = ms.len() / 2;
            let median = if ms.len().is_multiple_of(2) {
                (ms[mid - 1] + ms[mid]) / 2.0
            } else {
                ms[mid]
            };
            (phase.clone(), median)
        })
        .collect()
}

/// `uname -m` and the CPU count, e.g. `x86_64, 2 cpus`.
fn machine() -> Result<String> {
    let arch = capture(Command::new("uname").arg("-m"))?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    Ok(format!("{arch}, {cpus} cpus"))
}

/// The trimmed stdout of a command that must succeed.
fn capture(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Prints a markdown header and `row` under it.
fn print_row(row: &Row, date: &str, machine: &str) {
    let names: Vec<String> = row.phases.iter().map(|(p, _)| format!("{p} ms")).collect();
    let values: Vec<String> = row.phases.iter().map(|(_, t)| format!("{t:.3}")).collect();
    println!("\n| date | machine | graph | ops | {} |", names.join(" | "));
    println!("|{}", "---|".repeat(4 + names.len()));
    println!(
        "| {date} | {machine} | {} | {} | {} |",
        row.graph,
        row.ops,
        values.join(" | ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_lines_are_parsed() {
        let stderr =
            "warning: x\ntiming: parse 12.345 ms\ntiming: verify 1.5 ms\ntiming: total 16.000 ms\n";
        let phases = parse_timing(stderr);
        let names: Vec<&str> = phases.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["parse", "verify", "total"]);
        assert_eq!(phases[0].1, 12.345);
    }

    #[test]
    fn medians_per_phase() {
        let run = |a: f64, b: f64| vec![("parse".to_string(), a), ("wall".to_string(), b)];
        let runs = [
            run(3.0, 10.0),
            run(1.0, 30.0),
            run(2.0, 20.0),
            run(9.0, 40.0),
        ];
        assert_eq!(
            medians(&runs),
            [("parse".to_string(), 2.5), ("wall".to_string(), 25.0)]
        );
        assert_eq!(medians(&runs[..3])[0].1, 2.0);
    }
}
