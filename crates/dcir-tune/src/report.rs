//! What tuning did: per group, the candidates, the choice and the model's error.
//!
//! Every candidate that ran is a [`Trial`] (its estimate and its measured
//! time), so a report also says how well the cost model predicts
//! ([`TuneReport::model_fit`], per group kind): measured/estimated as a
//! geometric mean over all trials, the rank correlation of estimate and
//! measurement within each group (Spearman, the mean over groups of three or
//! more trials), and how often the model's first choice is within 10 % of the
//! measured best (DeepCuts' claim is that the model prunes well).
//! `--tune-report FILE` writes the whole report as JSON for fitting the model.

use std::fmt::Write;

use serde::Serialize;

/// One candidate that compiled, ran and matched the interpreter.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trial {
    /// Its parameters, `name = value, ...`.
    pub params: String,
    /// The cost model's estimate, milliseconds.
    pub estimate_ms: f64,
    /// Its measured median, milliseconds.
    pub ms: f64,
}

/// The candidate a group kept.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Chosen {
    /// Its parameters, `name = value, ...`.
    pub params: String,
    /// Its measured median, milliseconds.
    pub ms: f64,
    /// The cost model's estimate for it, milliseconds.
    pub estimate_ms: f64,
    /// The library it calls (`cublaslt`, `cudnn`); `None`: dcir's own kernel.
    pub library: Option<String>,
}

/// What tuning one group did.
#[derive(Clone, Debug, PartialEq, Serialize)]
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
    /// Every candidate that ran, in candidate order.
    pub trials: Vec<Trial>,
}

/// How well the cost model predicted one group kind's candidates.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FamilyFit {
    /// The group kind.
    pub kind: String,
    /// Groups with at least one trial.
    pub groups: usize,
    /// Trials over those groups.
    pub trials: usize,
    /// Geometric mean of measured / estimated over the trials.
    pub ratio: f64,
    /// Mean Spearman rank correlation of estimate and measurement over the
    /// groups of three or more trials (`None` when there are none).
    pub spearman: Option<f64>,
    /// Groups whose lowest-estimate trial measured within 10 % of their fastest.
    pub first_choice_within_10pct: usize,
}

/// Spearman's rank correlation of `a` and `b` (average ranks for ties);
/// `None` for fewer than three pairs or a constant side.
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    fn ranks(v: &[f64]) -> Vec<f64> {
        let mut order: Vec<usize> = (0..v.len()).collect();
        order.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
        let mut r = vec![0.0; v.len()];
        let mut i = 0;
        while i < order.len() {
            let mut j = i;
            while j + 1 < order.len() && v[order[j + 1]] == v[order[i]] {
                j += 1;
            }
            for &k in &order[i..=j] {
                r[k] = (i + j) as f64 / 2.0;
            }
            i = j + 1;
        }
        r
    }
    if a.len() != b.len() || a.len() < 3 {
        return None;
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let mean = (n - 1.0) / 2.0;
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (x, y) in ra.iter().zip(&rb) {
        cov += (x - mean) * (y - mean);
        va += (x - mean) * (x - mean);
        vb += (y - mean) * (y - mean);
    }
    (va > 0.0 && vb > 0.0).then(|| cov / (va * vb).sqrt())
}

/// The whole graph timed with the planner's and with the tuned parameters:
/// each group was measured alone with a cold cache, and a graph of choices
/// each faster alone can run slower together, so the faster whole graph is
/// the one kept.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WholeGraph {
    /// The planned graph's median, milliseconds (the best of the rounds).
    pub planned_ms: f64,
    /// The tuned graph's median, milliseconds (the best of the rounds).
    pub tuned_ms: f64,
    /// Whether the tuned parameters were kept.
    pub kept_tuned: bool,
}

/// What tuning a graph did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TuneReport {
    /// Per group, in body order.
    pub groups: Vec<GroupReport>,
    /// The whole graph as planned against as tuned; `None` when no group's
    /// parameters changed or the comparison could not run (`whole_graph_skipped`).
    pub whole_graph: Option<WholeGraph>,
    /// Why the whole graph was not compared, when it could not be.
    pub whole_graph_skipped: Option<String>,
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

    /// Of the GEMM and convolution groups that chose a candidate, how many
    /// run dcir's own kernel and how many a library call.
    pub fn library_share(&self) -> (usize, usize) {
        let chosen = self
            .groups
            .iter()
            .filter(|g| matches!(g.kind.as_str(), "gemm" | "conv"))
            .filter_map(|g| g.chosen.as_ref());
        let (library, ours): (Vec<&Chosen>, Vec<&Chosen>) =
            chosen.partition(|c| c.library.is_some());
        (ours.len(), library.len())
    }

    /// How well the model predicted, per group kind (sorted by kind); see
    /// the module doc.
    pub fn model_fit(&self) -> Vec<FamilyFit> {
        let mut kinds: Vec<&str> = self.groups.iter().map(|g| g.kind.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        let mut fits = Vec::new();
        for kind in kinds {
            let groups: Vec<&GroupReport> = self
                .groups
                .iter()
                .filter(|g| g.kind == kind && !g.trials.is_empty())
                .collect();
            if groups.is_empty() {
                continue;
            }
            let logs: Vec<f64> = groups
                .iter()
                .flat_map(|g| &g.trials)
                .filter(|t| t.estimate_ms > 0.0 && t.ms > 0.0)
                .map(|t| (t.ms / t.estimate_ms).ln())
                .collect();
            let rhos: Vec<f64> = groups
                .iter()
                .filter_map(|g| {
                    let (e, m): (Vec<f64>, Vec<f64>) =
                        g.trials.iter().map(|t| (t.estimate_ms, t.ms)).unzip();
                    spearman(&e, &m)
                })
                .collect();
            let within = groups
                .iter()
                .filter(|g| {
                    let best = g.trials.iter().map(|t| t.ms).fold(f64::INFINITY, f64::min);
                    let first = g
                        .trials
                        .iter()
                        .min_by(|a, b| a.estimate_ms.total_cmp(&b.estimate_ms));
                    first.is_some_and(|t| t.ms <= 1.1 * best)
                })
                .count();
            fits.push(FamilyFit {
                kind: kind.to_string(),
                groups: groups.len(),
                trials: groups.iter().map(|g| g.trials.len()).sum(),
                ratio: match logs.is_empty() {
                    true => f64::NAN,
                    false => (logs.iter().sum::<f64>() / logs.len() as f64).exp(),
                },
                spearman: (!rhos.is_empty()).then(|| rhos.iter().sum::<f64>() / rhos.len() as f64),
                first_choice_within_10pct: within,
            });
        }
        fits
    }

    /// The report as JSON (`--tune-report`): every group with its trials,
    /// and the model's fit per kind.
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Json<'a> {
            report: &'a TuneReport,
            model_fit: Vec<FamilyFit>,
        }
        serde_json::to_string_pretty(&Json {
            report: self,
            model_fit: self.model_fit(),
        })
        .expect("a report serializes")
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
        // `+ 0.0`: an empty float sum is -0.0.
        let planned: f64 = self.groups.iter().filter_map(|g| g.planned_ms).sum::<f64>() + 0.0;
        let chosen: f64 = self
            .groups
            .iter()
            .filter_map(|g| g.chosen.as_ref().map(|c| c.ms))
            .sum::<f64>()
            + 0.0;
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
        let (ours, library) = self.library_share();
        if ours + library > 0 {
            let _ = writeln!(
                out,
                "GEMM and convolution groups: {ours} on dcir's kernels, {library} on a library ({:.0} % ours)",
                100.0 * ours as f64 / (ours + library) as f64
            );
        }
        if let Some(w) = &self.whole_graph {
            let _ = writeln!(
                out,
                "whole graph (CUDA graph, back to back): {:.4} ms as planned, {:.4} ms tuned: {} kept",
                w.planned_ms,
                w.tuned_ms,
                if w.kept_tuned {
                    "the tuned parameters"
                } else {
                    "the planner's parameters"
                }
            );
        }
        if let Some(why) = &self.whole_graph_skipped {
            let _ = writeln!(out, "whole graph not compared: {why}");
        }
        let fits = self.model_fit();
        if !fits.is_empty() {
            out.push_str(
                "\n| kind | groups | trials | measured/estimated | rank correlation | first choice within 10 % |\n|---|---:|---:|---:|---:|---:|\n",
            );
            for f in &fits {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.2}x | {} | {} of {} |",
                    f.kind,
                    f.groups,
                    f.trials,
                    f.ratio,
                    f.spearman.map_or("-".to_string(), |r| format!("{r:.2}")),
                    f.first_choice_within_10pct,
                    f.groups
                );
            }
        }
        for g in &self.groups {
            for f in &g.failures {
                let _ = writeln!(out, "@{}: {f}", g.symbol);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(kind: &str, trials: &[(f64, f64)]) -> GroupReport {
        GroupReport {
            symbol: "g".into(),
            kind: kind.into(),
            candidates: trials.len(),
            measured: trials.len(),
            planned: String::new(),
            planned_ms: None,
            chosen: None,
            failures: Vec::new(),
            trials: trials
                .iter()
                .enumerate()
                .map(|(i, &(estimate_ms, ms))| Trial {
                    params: format!("p{i}"),
                    estimate_ms,
                    ms,
                })
                .collect(),
        }
    }

    #[test]
    fn spearman_ranks_with_ties() {
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]), Some(1.0));
        assert_eq!(spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]), Some(-1.0));
        assert_eq!(spearman(&[1.0, 2.0], &[1.0, 2.0]), None);
        assert_eq!(spearman(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]), None);
        let tied = spearman(&[1.0, 1.0, 2.0, 3.0], &[1.0, 2.0, 3.0, 4.0]).expect("defined");
        assert!(tied > 0.9 && tied < 1.0, "{tied}");
    }

    /// Per kind: measured/estimated over all trials, the mean rank
    /// correlation, and whether the lowest estimate ran within 10 % of the best.
    #[test]
    fn the_model_fit_per_kind() {
        let report = TuneReport {
            groups: vec![
                // The model's order is right and its times half the measured.
                group("gemm", &[(1.0, 2.0), (2.0, 4.0), (3.0, 6.0)]),
                // Its first choice is 50 % slower than the best.
                group("gemm", &[(1.0, 3.0), (2.0, 2.0), (4.0, 8.0)]),
                group("conv", &[(1.0, 1.0)]),
                group("pool", &[]),
            ],
            whole_graph: None,
            whole_graph_skipped: None,
            seconds: 1.0,
        };
        let fits = report.model_fit();
        assert_eq!(
            fits.iter().map(|f| f.kind.as_str()).collect::<Vec<_>>(),
            ["conv", "gemm"]
        );
        let gemm = &fits[1];
        assert_eq!(
            (gemm.groups, gemm.trials, gemm.first_choice_within_10pct),
            (2, 6, 1)
        );
        let expect = 48f64.powf(1.0 / 6.0);
        assert!((gemm.ratio - expect).abs() < 1e-12, "{}", gemm.ratio);
        assert!((gemm.spearman.expect("two groups of three") - 0.75).abs() < 1e-12);
        assert_eq!(
            (fits[0].spearman, fits[0].first_choice_within_10pct),
            (None, 1)
        );
        let table = report.table();
        assert!(
            table.contains("| gemm | 2 | 6 | 1.91x | 0.75 | 1 of 2 |"),
            "{table}"
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).expect("JSON");
        assert_eq!(json["model_fit"][1]["first_choice_within_10pct"], 1);
        assert_eq!(json["report"]["groups"][0]["trials"][2]["ms"], 6.0);
    }
}
