//! Seeded random inputs.
//!
//! Each parameter is drawn from SplitMix64 streams seeded from the run's seed
//! and the FNV-1a hash of the parameter's name (one stream per block of
//! 65,536 elements, so blocks fill in parallel), so a parameter's values
//! depend only on (seed, name, type, role): adding, removing or reordering
//! other parameters changes nothing. The role is the constraint the graph's
//! meaning puts on the values, read from the parameter's uses that reach the
//! graph's outputs (dead uses count for nothing): through a `fused` op from
//! the uses of the region argument it binds; through a view (`transpose`,
//! `reshape`, `slice`, `cast`, and a `broadcast`, which passes a weight role
//! only when it adds leading axes) from the uses of the view; through
//! arithmetic that keeps the constraint (`add`, `mul`, `max`, `min` of
//! same-typed operands, the first operand of `sub` and `div`) and through
//! `gelu` and `layernorm` (what `decompose-*` expand them into) from the uses
//! of the result. So the rewrites of the built-in passes move no parameter
//! to another role — `log(x + 0)` and `log(x)`, a variance and `var + eps`,
//! a weight and `w * k` read the same — and `--seed` draws the same values
//! before and after every built-in pass
//! (`crates/dcir-passes/tests/properties.rs`). [`RandomBy::Type`] drops the
//! role (floats uniform in `[-1, 1)`, integers in `[0, 8)`); `dcir-run
//! --save-inputs` and `--inputs` replay exact values. First match wins:
//!
//! | role | values |
//! |---|---|
//! | indices of a `gather` (operand 1) | integers uniform in `[0, extent)` of the gathered axis (the smallest extent when several gathers use it) |
//! | must be positive: `batchnorm` var, operand of `sqrt`/`rsqrt`/`log`, `div` and `mod` divisor, `pow` base | floats uniform in `[0.5, 1.5)`; integers uniform in `[1, 8]` |
//! | weights: operand 1 of `conv2d`, operand 1 of `matmul` | uniform in `[-a, a)`, `a = sqrt(3 / fan_in)` (variance `1 / fan_in`: activations keep their scale through deep stacks); fan_in = `C/groups * KH * KW` or the contraction extent |
//! | any other float | uniform in `[-1, 1)` |
//! | any other integer | uniform in `[0, 8)` |
//! | bool | true or false, each with probability 1/2 |
//!
//! Floats are drawn as f64 from 53 random bits, rounded to f32 and then to the
//! parameter's dtype (f16/bf16 values may round to the interval's end).

use dcir_ir::{BlockId, DType, Graph, OpId, OpKind, TensorType, ValueId};
use rayon::prelude::*;

use crate::tensor::{Tensor, TensorData};

/// Elements per random stream (and per parallel task).
const BLOCK: usize = 1 << 16;

/// The SplitMix64 generator (Steele, Lea and Flood, 2014): a 64-bit counter
/// stepped by the golden ratio, then mixed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `[0, 1)`.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)` (`n > 0`), by multiply-shift.
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a of `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// How a parameter is used, which decides its distribution.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Indices { extent: usize },
    Positive,
    Weight { fan_in: usize },
    Plain,
}

/// Where each value is used by an op whose result reaches the graph's
/// outputs: (op, operand position) per value index. Dead uses are left out,
/// so removing them (`dce`) changes no role.
fn uses(graph: &Graph) -> Vec<Vec<(OpId, usize)>> {
    let mut live = vec![false; graph.value_count()];
    mark_live(graph, graph.body(), &mut live);
    let mut uses = vec![Vec::new(); graph.value_count()];
    for op in graph.all_ops() {
        let d = graph.op(op);
        let reaches = d.kind == OpKind::Return
            || d.kind == OpKind::Yield
            || d.results.iter().any(|r| live[r.index()]);
        if reaches {
            for (i, v) in d.operands.iter().enumerate() {
                uses[v.index()].push((op, i));
            }
        }
    }
    uses
}

/// Marks the values of `block` that its terminator's operands depend on
/// (through a live `fused` op, its region's and then its operands).
fn mark_live(graph: &Graph, block: BlockId, live: &mut [bool]) {
    for &op in graph.block(block).ops.iter().rev() {
        let d = graph.op(op);
        let terminator = matches!(d.kind, OpKind::Return | OpKind::Yield);
        if !terminator && !d.results.iter().any(|r| live[r.index()]) {
            continue;
        }
        if let Some(region) = d.region {
            mark_live(graph, region, live);
            let args = &graph.block(region).args;
            for (arg, v) in args.iter().zip(&d.operands) {
                if live[arg.index()] {
                    live[v.index()] = true;
                }
            }
        } else {
            for v in &d.operands {
                live[v.index()] = true;
            }
        }
    }
}

/// What one use asks of the value it reads.
enum UseRole {
    /// A role of its own.
    Fixed(Role),
    /// The role of another value: the op's result (views, arithmetic that
    /// keeps the constraint, ops the decompose passes expand into such
    /// arithmetic) or a region argument (through a `fused` op). With
    /// `weight: false` a weight role stops there (a broadcast that does more
    /// than add leading axes makes no weight of its operand).
    Follows { value: ValueId, weight: bool },
}

/// What a parameter's random values depend on, besides the seed and the
/// parameter's name and type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RandomBy {
    /// Also its role in the graph (the module doc's table): valid values for
    /// every use, the same before and after every built-in pass.
    #[default]
    Use,
    /// Nothing else: floats uniform in `[-1, 1)`, integers in `[0, 8)`, bools
    /// 1/2 — the same across any rewrite, but a `sqrt`, `log`, divisor or
    /// `gather` may get values outside its domain.
    Type,
}

/// Draws parameters of one graph for one seed.
pub(crate) struct Sampler<'g> {
    graph: &'g Graph,
    by: RandomBy,
    uses: Vec<Vec<(OpId, usize)>>,
    /// Roles found so far, per value index (a value's role is read once,
    /// however many paths lead to it).
    roles: std::cell::RefCell<Vec<Option<Role>>>,
    seed: u64,
}

impl<'g> Sampler<'g> {
    pub(crate) fn new(graph: &'g Graph, seed: u64, by: RandomBy) -> Sampler<'g> {
        Sampler {
            graph,
            by,
            uses: uses(graph),
            roles: std::cell::RefCell::new(vec![None; graph.value_count()]),
            seed,
        }
    }

    /// The role of value `v` from its uses (memoized). Iterative, with an
    /// explicit stack: a role can follow a chain of uses as long as the
    /// graph is deep.
    fn role(&self, v: ValueId) -> Role {
        if self.by == RandomBy::Type {
            return Role::Plain;
        }
        let mut stack = vec![v];
        while let Some(&top) = stack.last() {
            if self.roles.borrow()[top.index()].is_some() {
                stack.pop();
                continue;
            }
            let pending: Vec<ValueId> = self.uses[top.index()]
                .iter()
                .filter_map(|&(op, i)| match self.use_role(op, i, top) {
                    UseRole::Follows { value, .. } => Some(value),
                    UseRole::Fixed(_) => None,
                })
                .filter(|d| self.roles.borrow()[d.index()].is_none())
                .collect();
            if pending.is_empty() {
                let role = self.role_of_uses(top);
                self.roles.borrow_mut()[top.index()] = Some(role);
                stack.pop();
            } else {
                stack.extend(pending);
            }
        }
        self.roles.borrow()[v.index()].unwrap_or(Role::Plain)
    }

    /// What operand `i` of `op_id`, which is `v`, asks of `v`.
    fn use_role(&self, op_id: OpId, i: usize, v: ValueId) -> UseRole {
        let graph = self.graph;
        let op = graph.op(op_id);
        let ty = |k: usize| graph.ty(op.operands[k]);
        let result = || UseRole::Follows {
            value: op.results[0],
            weight: true,
        };
        let same_type = || op.results.len() == 1 && graph.ty(op.results[0]) == graph.ty(v);
        match (op.kind, i) {
            (OpKind::Gather, 1) => {
                let axis = op.attrs.int("axis").unwrap_or(0) as usize;
                let extent = ty(0).dims().get(axis).copied().unwrap_or(0);
                UseRole::Fixed(Role::Indices { extent })
            }
            (OpKind::Batchnorm, 4)
            | (OpKind::Sqrt | OpKind::Rsqrt | OpKind::Log, 0)
            | (OpKind::Div | OpKind::Mod, 1)
            | (OpKind::Pow, 0) => UseRole::Fixed(Role::Positive),
            (OpKind::Conv2d, 1) => UseRole::Fixed(Role::Weight {
                fan_in: ty(1).dims()[1..].iter().product(),
            }),
            (OpKind::Matmul, 1) => {
                let d = ty(1).dims();
                let transposed = op.attrs.bool("transpose_b").unwrap_or(false);
                UseRole::Fixed(Role::Weight {
                    fan_in: d[d.len() - if transposed { 1 } else { 2 }],
                })
            }
            // Views: the role of what they view.
            (OpKind::Transpose | OpKind::Reshape | OpKind::Slice | OpKind::Cast, 0) => result(),
            (OpKind::Broadcast, 0) => UseRole::Follows {
                value: op.results[0],
                weight: adds_leading_axes(graph, op_id),
            },
            // Arithmetic that keeps a positive, weight or index value one
            // (`x + c`, `x * k`, `x - 0`, `x / 1`, max, min) and the ops the
            // decompose passes expand into it (gelu is `x * Phi(x)`,
            // layernorm `(x - mean) * rstd * scale + bias`): the result's
            // role, so that `canonicalize`, `fold-batchnorm` and the
            // decompositions keep every parameter's values.
            (OpKind::Add | OpKind::Mul | OpKind::Max | OpKind::Min, _)
            | (OpKind::Sub | OpKind::Div, 0)
            | (OpKind::Gelu | OpKind::Layernorm, _)
                if same_type() || op.kind == OpKind::Layernorm =>
            {
                result()
            }
            (OpKind::Fused, _) => match op.region {
                Some(region) => UseRole::Follows {
                    value: graph.block(region).args[i],
                    weight: true,
                },
                None => UseRole::Fixed(Role::Plain),
            },
            _ => UseRole::Fixed(Role::Plain),
        }
    }

    /// `v`'s role from its uses, whose followed values' roles are known.
    fn role_of_uses(&self, v: ValueId) -> Role {
        let mut indices: Option<usize> = None;
        let mut positive = false;
        let mut weight: Option<usize> = None;
        for &(op, i) in &self.uses[v.index()] {
            let role = match self.use_role(op, i, v) {
                UseRole::Fixed(role) => role,
                UseRole::Follows { value, weight } => {
                    match self.roles.borrow()[value.index()].unwrap_or(Role::Plain) {
                        Role::Weight { .. } if !weight => Role::Plain,
                        role => role,
                    }
                }
            };
            match role {
                Role::Indices { extent } => {
                    indices = Some(indices.map_or(extent, |e| e.min(extent)))
                }
                Role::Positive => positive = true,
                Role::Weight { fan_in } => weight = Some(fan_in),
                Role::Plain => {}
            }
        }
        match (indices, positive, weight) {
            (Some(extent), _, _) => Role::Indices { extent },
            (None, true, _) => Role::Positive,
            (None, false, Some(fan_in)) => Role::Weight { fan_in },
            _ => Role::Plain,
        }
    }

    /// Random values for parameter `index` (see the module doc).
    pub(crate) fn sample(&self, index: usize) -> Tensor {
        let p = self.graph.params()[index];
        let ty: &TensorType = self.graph.ty(p);
        let seed = mix(self.seed ^ fnv1a(self.graph.value(p).name.as_bytes()));
        let n = ty.num_elements().unwrap_or(0);
        let uniform = |lo: f64, hi: f64| draw(seed, n, |r| (lo + (hi - lo) * r.next_f64()) as f32);
        let data = match (ty.dtype, self.role(p)) {
            (DType::Bool, _) => TensorData::Bool(draw(seed, n, |r| r.next_u64() >> 63 == 1)),
            (DType::I32 | DType::I64, role) => {
                let (low, count) = match role {
                    Role::Indices { extent } => (0, extent.max(1) as u64),
                    Role::Positive => (1, 8),
                    _ => (0, 8),
                };
                TensorData::from_i64(ty.dtype, &draw(seed, n, |r| low + r.below(count) as i64))
            }
            (DType::F32, role) => TensorData::F32(uniform_for(role, uniform)),
            (half, role) => TensorData::from_f32(half, &uniform_for(role, uniform)),
        };
        Tensor::from_parts(ty.clone(), data)
    }
}

/// The float values for a parameter of `role`, drawn by `uniform(lo, hi)`.
fn uniform_for(role: Role, uniform: impl Fn(f64, f64) -> Vec<f32>) -> Vec<f32> {
    match role {
        Role::Positive => uniform(0.5, 1.5),
        Role::Weight { fan_in } => {
            let a = (3.0 / fan_in.max(1) as f64).sqrt();
            uniform(-a, a)
        }
        _ => uniform(-1.0, 1.0),
    }
}

/// Whether broadcast `op` only adds leading axes (a batch of copies of its
/// operand, as a batched matmul's weight), keeping every operand axis whole.
fn adds_leading_axes(graph: &Graph, op: OpId) -> bool {
    let d = graph.op(op);
    let (from, to) = (
        graph.ty(d.operands[0]).dims(),
        graph.ty(d.results[0]).dims(),
    );
    let lead = to.len().saturating_sub(from.len());
    d.attrs.ints("dims").is_some_and(|dims| {
        dims.iter()
            .enumerate()
            .all(|(k, &axis)| axis == (lead + k) as i64)
    }) && to[lead..] == *from
}

/// `n` values from `f`; block `b` of [`BLOCK`] values draws from its own
/// stream, seeded `mix(seed ^ mix(b))`, so blocks are filled in parallel.
fn draw<T: Send>(seed: u64, n: usize, f: impl Fn(&mut SplitMix64) -> T + Sync) -> Vec<T> {
    (0..n.div_ceil(BLOCK))
        .into_par_iter()
        .flat_map_iter(|b| {
            let mut rng = SplitMix64(mix(seed ^ mix(b as u64)));
            let len = BLOCK.min(n - b * BLOCK);
            (0..len).map(|_| f(&mut rng)).collect::<Vec<T>>()
        })
        .collect()
}

/// Random values for every parameter of `graph`, in parameter order (see the
/// module doc for the distributions).
pub fn random_inputs(graph: &Graph, seed: u64) -> Vec<Tensor> {
    let sampler = Sampler::new(graph, seed, RandomBy::Use);
    (0..graph.params().len())
        .map(|i| sampler.sample(i))
        .collect()
}
