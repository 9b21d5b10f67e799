//! What tuning did: per group, the candidates, the choice and the model's error.

use std::fmt::Write;

/// The candidate a group kept.
#[derive(Clone, Debug, PartialEq)]
pub struct Chosen {
    /// Its parameters, `name = value, ...`.
    pub params: String,
    /// Its measured median, milliseconds.
    pub ms: f64,
    /// The cost model's estimate for it, milliseconds.
    pub estimate_ms: f64,
}

/// What tuning one group did.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupReport {
    /// The group's symbol.
    pub symbol: String,
    /// Its kind (`gemm`, `conv`, ...).
    pub kind: String,
    /// Candidates considered (the model's best and the planner's choice).
    pub candidates: usize,
    /// Of those, compiled and measured now (the others came from the cache).
    pub measured: usize,
    /// The planner's parameters.
    pub planned: String,
    /// The planner's parameters' measured median, milliseconds, if they ran.
    pub planned_ms: Option<f64>,
    /// The fastest candidate that matched the interpreter; `None` when none
    /// did (the group keeps the planner's parameters).
    pub chosen: Option<Chosen>,
    /// `params: why` for each candidate that failed to compile, run or match.
    pub failures: Vec<String>,
}

/// What tuning a graph did.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneReport {
    /// Per group, in body order.
    pub groups: Vec<GroupReport>,
    /// Wall time of the tuning, seconds.
    pub seconds: f64,
}

impl TuneReport {
    /// Candidates compiled and measured now (not from the cache).
    pub fn measured(&self) -> usize {
        self.groups.iter().map(|g| g.measured).sum()
    }

    /// Geometric mean of measured / estimated time over the chosen
    /// candidates: how far the cost model is off, as a factor.
    pub fn model_error(&self) -> Option<f64> {
        let ratios: Vec<f64> = self
            .groups
            .iter()
            .filter_map(|g| g.chosen.as_ref())
            .filter(|c| c.estimate_ms > 0.0 && c.ms > 0.0)
            .map(|c| (c.ms / c.estimate_ms).ln())
            .collect();
        (!ratios.is_empty()).then(|| (ratios.iter().sum::<f64>() / ratios.len() as f64).exp())
    }

    /// A markdown table: per group the candidates, the planner's and the
    /// chosen parameters with their times and the model's estimate.
    pub fn table(&self) -> String {
        let ms = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.4}", v));
        let mut out = String::from(
            "| group | kind | candidates | measured | planned ms | chosen ms | estimate ms | speedup | chosen |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for g in &self.groups {
            let chosen_ms = g.chosen.as_ref().map(|c| c.ms);
            let speedup = match (g.planned_ms, chosen_ms) {
                (Some(p), Some(c)) if c > 0.0 => format!("{:.2}x", p / c),
                _ => "-".into(),
            };
            let _ = writeln!(
                out,
                "| @{} | {} | {} | {} | {} | {} | {} | {} | {} |",
                g.symbol,
                g.kind,
                g.candidates,
                g.measured,
                ms(g.planned_ms),
                ms(chosen_ms),
                ms(g.chosen.as_ref().map(|c| c.estimate_ms)),
                speedup,
                g.chosen
                    .as_ref()
                    .map_or("(none matched: planned kept)".to_string(), |c| c
                        .params
                        .clone()),
            );
        }
        let planned: f64 = self.groups.iter().filter_map(|g| g.planned_ms).sum();
        let chosen: f64 = self
            .groups
            .iter()
            .filter_map(|g| g.chosen.as_ref().map(|c| c.ms))
            .sum();
        let _ = writeln!(
            out,
            "\n{} groups, {} candidates measured, {:.1} s; kernel time {:.4} ms as planned, {:.4} ms tuned{}",
            self.groups.len(),
            self.measured(),
            self.seconds,
            planned,
            chosen,
            self.model_error().map_or(String::new(), |e| format!(
                "; measured/estimated {e:.2}x (geomean)"
            )),
        );
        for g in &self.groups {
            for f in &g.failures {
                let _ = writeln!(out, "@{}: {f}", g.symbol);
            }
        }
        out
    }
}
