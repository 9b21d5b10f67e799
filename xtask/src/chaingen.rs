//! A generator of large, valid `.dcir` graphs for benchmarks.
//!
//! [`chain`] emits one graph: a chain of hybrid CNN/transformer units
//! (MobileNetV2-style inverted residual with squeeze-excite on a
//! `f32[4,256,8,16]` feature map, then a pre-LN transformer block on the same
//! data as `f32[4,128,256]` tokens), topped up with elementwise ops to the
//! exact op count. Every unit has its own weights (graph parameters), every
//! value is used, broadcasts are explicit, and the output is deterministic.

use std::fmt::Write;

/// Batch.
const B: usize = 4;
/// Tokens per sequence (= feature-map height × width).
const S: usize = 128;
/// Model width (= feature-map channels).
const D: usize = 256;
/// Attention heads.
const HEADS: usize = 4;
/// Feed-forward width.
const FF: usize = 1024;
/// Feature-map height.
const IH: usize = 8;
/// Feature-map width (height × width = tokens).
const IW: usize = S / IH;
/// Expanded channels of the inverted residual.
const E: usize = 512;
/// Squeeze-excite bottleneck.
const SE: usize = 128;

/// The `f32` tensor type of `dims`.
fn ty(dims: &[usize]) -> String {
    let dims: Vec<String> = dims.iter().map(usize::to_string).collect();
    format!("f32[{}]", dims.join(","))
}

/// The graph under construction.
struct Gen {
    /// Graph parameters: name and type.
    params: Vec<(String, String)>,
    /// The ops, one line each.
    body: String,
    /// Ops emitted so far.
    ops: usize,
    /// The unit being emitted (names its weights).
    unit: usize,
}

impl Gen {
    /// An empty graph.
    fn new() -> Gen {
        Gen {
            params: Vec::new(),
            body: String::new(),
            ops: 0,
            unit: 0,
        }
    }

    /// A new weight of the current unit.
    fn param(&mut self, role: &str, dims: &[usize]) -> String {
        let name = format!("%u{}.{role}", self.unit);
        self.params.push((name.clone(), ty(dims)));
        name
    }

    /// Emits `%N = rhs : f32[dims]` and returns `%N`.
    fn op(&mut self, rhs: &str, dims: &[usize]) -> String {
        let name = format!("%{}", self.ops);
        let _ = writeln!(self.body, "  {name} = {rhs} : {}", ty(dims));
        self.ops += 1;
        name
    }

    /// `x[B,S,K] @ w[K,N] + b` with the weight broadcast over the batch (4 ops).
    fn dense_batched(&mut self, x: &str, k: usize, n: usize, role: &str) -> String {
        let w = self.param(&format!("{role}.w"), &[k, n]);
        let b = self.param(&format!("{role}.b"), &[n]);
        let wb = self.op(&format!("broadcast {w} {{dims = [1, 2]}}"), &[B, k, n]);
        let y = self.op(&format!("matmul {x}, {wb}"), &[B, S, n]);
        let bb = self.op(&format!("broadcast {b} {{dims = [2]}}"), &[B, S, n]);
        self.op(&format!("add {y}, {bb}"), &[B, S, n])
    }

    /// `x[B,S,K] @ w[K,N] + b` through a 2-D matmul on `[B*S, K]` (5 ops).
    fn dense_flat(&mut self, x: &str, k: usize, n: usize, role: &str) -> String {
        let w = self.param(&format!("{role}.w"), &[k, n]);
        let b = self.param(&format!("{role}.b"), &[n]);
        let x2 = self.op(&format!("reshape {x}"), &[B * S, k]);
        let y = self.op(&format!("matmul {x2}, {w}"), &[B * S, n]);
        let bb = self.op(&format!("broadcast {b} {{dims = [1]}}"), &[B * S, n]);
        let y = self.op(&format!("add {y}, {bb}"), &[B * S, n]);
        self.op(&format!("reshape {y}"), &[B, S, n])
    }

    /// Layer normalization over the model width (1 op).
    fn layernorm(&mut self, x: &str, role: &str) -> String {
        let g = self.param(&format!("{role}.g"), &[D]);
        let b = self.param(&format!("{role}.b"), &[D]);
        self.op(&format!("layernorm {x}, {g}, {b} {{axis = 2}}"), &[B, S, D])
    }

    /// Projects `x` to heads: `[B, HEADS, S, D / HEADS]` (6 ops).
    fn heads(&mut self, x: &str, role: &str) -> String {
        let y = self.dense_batched(x, D, D, role);
        let y = self.op(&format!("reshape {y}"), &[B, S, HEADS, D / HEADS]);
        self.op(
            &format!("transpose {y} {{perm = [0, 2, 1, 3]}}"),
            &[B, HEADS, S, D / HEADS],
        )
    }

    /// A pre-LN transformer block on `h: f32[B,S,D]` (46 ops).
    fn transformer(&mut self, h: &str) -> String {
        let hd = D / HEADS;
        let x = self.layernorm(h, "ln1");
        let q = self.heads(&x, "q");
        let k = self.heads(&x, "k");
        let v = self.heads(&x, "v");
        let s = self.op(
            &format!("matmul {q}, {k} {{transpose_b = true}}"),
            &[B, HEADS, S, S],
        );
        let c = self.op(
            &format!("constant {{value = {}}}", 1.0 / (hd as f64).sqrt()),
            &[],
        );
        let c = self.op(&format!("broadcast {c} {{dims = []}}"), &[B, HEADS, S, S]);
        let s = self.op(&format!("mul {s}, {c}"), &[B, HEADS, S, S]);
        let p = self.op(&format!("softmax {s} {{axis = 3}}"), &[B, HEADS, S, S]);
        let o = self.op(&format!("matmul {p}, {v}"), &[B, HEADS, S, hd]);
        let o = self.op(
            &format!("transpose {o} {{perm = [0, 2, 1, 3]}}"),
            &[B, S, HEADS, hd],
        );
        let o = self.op(&format!("reshape {o}"), &[B, S, D]);
        let o = self.dense_flat(&o, D, D, "o");
        let h = self.op(&format!("add {h}, {o}"), &[B, S, D]);
        let x = self.layernorm(&h, "ln2");
        let f = self.dense_flat(&x, D, FF, "ff1");
        let approx = if self.unit.is_multiple_of(2) {
            ""
        } else {
            r#" {approximate = "tanh"}"#
        };
        let f = self.op(&format!("gelu {f}{approx}"), &[B, S, FF]);
        let f = self.dense_flat(&f, FF, D, "ff2");
        self.op(&format!("add {h}, {f}"), &[B, S, D])
    }

    /// Inference batchnorm over `channels` (1 op).
    fn batchnorm(&mut self, x: &str, channels: usize, role: &str) -> String {
        let stats: Vec<String> = ["scale", "bias", "mean", "var"]
            .iter()
            .map(|s| self.param(&format!("{role}.{s}"), &[channels]))
            .collect();
        self.op(
            &format!("batchnorm {x}, {}", stats.join(", ")),
            &[B, channels, IH, IW],
        )
    }

    /// An inverted residual with squeeze-excite on `x: f32[B,D,IH,IW]` (18 ops).
    fn inverted_residual(&mut self, x: &str) -> String {
        let map = [B, E, IH, IW];
        let w = self.param("expand.w", &[E, D, 1, 1]);
        let y = self.op(&format!("conv2d {x}, {w}"), &map);
        let y = self.batchnorm(&y, E, "bn1");
        let y = self.op(&format!("clip {y} {{min = 0.0, max = 6.0}}"), &map);
        let w = self.param("dw.w", &[E, 1, 3, 3]);
        let y = self.op(
            &format!("conv2d {y}, {w} {{pad = [1, 1, 1, 1], groups = {E}}}"),
            &map,
        );
        let y = self.batchnorm(&y, E, "bn2");
        let y = self.op(&format!("clip {y} {{min = 0.0, max = 6.0}}"), &map);
        let g = self.op(&format!("global_avgpool {y}"), &[B, E, 1, 1]);
        let g = self.op(&format!("reshape {g}"), &[B, E]);
        let w = self.param("se1.w", &[E, SE]);
        let g = self.op(&format!("matmul {g}, {w}"), &[B, SE]);
        let g = self.op(&format!("relu {g}"), &[B, SE]);
        let w = self.param("se2.w", &[SE, E]);
        let g = self.op(&format!("matmul {g}, {w}"), &[B, E]);
        let g = self.op(&format!("sigmoid {g}"), &[B, E]);
        let g = self.op(&format!("reshape {g}"), &[B, E, 1, 1]);
        let g = self.op(&format!("broadcast {g} {{dims = [0, 1, 2, 3]}}"), &map);
        let y = self.op(&format!("mul {y}, {g}"), &map);
        let w = self.param("project.w", &[D, E, 1, 1]);
        let y = self.op(&format!("conv2d {y}, {w}"), &[B, D, IH, IW]);
        let y = self.batchnorm(&y, D, "bn3");
        self.op(&format!("add {x}, {y}"), &[B, D, IH, IW])
    }

    /// One unit on the feature map `x: f32[B,D,IH,IW]`: conv block, optional
    /// pooling, then a transformer block on the same data as tokens (68 or 69 ops).
    fn unit(&mut self, x: &str) -> String {
        let x = self.inverted_residual(x);
        let x = if self.unit % 3 == 2 {
            let pool = "{kernel = [3, 3], pad = [1, 1, 1, 1]}";
            self.op(&format!("maxpool2d {x} {pool}"), &[B, D, IH, IW])
        } else {
            x
        };
        let t = self.op(&format!("reshape {x}"), &[B, D, S]);
        let t = self.op(&format!("transpose {t} {{perm = [0, 2, 1]}}"), &[B, S, D]);
        let t = self.transformer(&t);
        let t = self.op(&format!("transpose {t} {{perm = [0, 2, 1]}}"), &[B, D, S]);
        self.op(&format!("reshape {t}"), &[B, D, IH, IW])
    }
}

/// The most ops one [`Gen::unit`] emits.
const MAX_UNIT_OPS: usize = 69;

/// A graph `@chain` of exactly `ops` ops (the `return` not counted).
pub fn chain(ops: usize) -> String {
    let mut g = Gen::new();
    g.params.push(("%x".to_string(), ty(&[B, D, IH, IW])));
    let mut x = "%x".to_string();
    while g.ops + MAX_UNIT_OPS <= ops {
        x = g.unit(&x);
        g.unit += 1;
    }
    for unary in ["relu", "tanh", "sigmoid", "abs", "erf", "neg"]
        .iter()
        .cycle()
    {
        if g.ops == ops {
            break;
        }
        x = g.op(&format!("{unary} {x}"), &[B, D, IH, IW]);
    }
    let params: Vec<String> = g.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
    format!(
        "// {ops} ops, generated by `cargo xtask bench`.\ngraph @chain({}) -> ({}) {{\n{}  return {x}\n}}\n",
        params.join(", "),
        ty(&[B, D, IH, IW]),
        g.body
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The `%` names among the whitespace- and comma-separated words of `s`.
    fn values(s: &str) -> impl Iterator<Item = &str> {
        s.split([' ', ',', '(', ')'])
            .filter(|w| w.starts_with('%'))
            .map(|w| w.trim_end_matches(':'))
    }

    #[test]
    fn exact_op_count_and_every_value_used() {
        for n in [0, 7, 99, 100, 1000] {
            let text = chain(n);
            let (header, body) = text.split_once('{').unwrap();
            let mut defined: Vec<&str> = values(header).collect();
            let mut used = HashSet::new();
            let mut count = 0;
            for line in body.lines() {
                match line.split_once(" = ") {
                    Some((lhs, rhs)) => {
                        count += 1;
                        defined.push(lhs.trim());
                        used.extend(values(rhs.split(" : ").next().unwrap()));
                    }
                    None => used.extend(values(line)),
                }
            }
            assert_eq!(count, n);
            let unused: Vec<_> = defined.iter().filter(|v| !used.contains(*v)).collect();
            assert!(unused.is_empty(), "n = {n}: unused {unused:?}");
            let unique: HashSet<_> = defined.iter().collect();
            assert_eq!(unique.len(), defined.len(), "n = {n}: a name repeats");
        }
    }

    #[test]
    fn units_fit_the_bound() {
        let mut g = Gen::new();
        for unit in 0..6 {
            let before = g.ops;
            g.unit = unit;
            g.unit("%x");
            assert!(g.ops - before <= MAX_UNIT_OPS);
        }
    }
}
