//! Lowering of `fused` groups to the kernel IR.
//!
//! Every value of a group is computed by *index maps*: to produce value `v`
//! at an index of its shape, [`Lower::value_at`] asks each operand for the
//! element the op maps that index to (the same index for elementwise math,
//! remapped coordinates for broadcast, reshape, transpose, slice, pad,
//! concat and gather) and binds the result to a local. Computed values are
//! memoized per (value, index), so a value used twice at one index is
//! computed once. Conditional views (pad, concat) read their operands at
//! clamped coordinates and select, so no load is ever out of bounds.
//!
//! Float values are `float` locals whatever their dtype: f16/bf16 loads widen
//! exactly, intermediates stay in f32 inside the kernel, and a value is
//! rounded to its dtype only where it leaves the kernel (stores narrow) or
//! is cast (`dcir_round_h`, `dcir_round_bf`): the GPU precision contract of
//! `docs/cuda.md`, within the interpreter's per-dtype tolerances.

use std::collections::{BTreeSet, HashMap};

use dcir_fusion::Reason;
use dcir_ir::shape::Rows;
use dcir_ir::{Attr, DType, Graph, OpId, OpKind, ValueDef, ValueId};

use crate::kir::{
    ArrayRef, BinOp, Builtin, Expr, Helper, Kernel, Param, SharedArray, Shuffle, Stmt, Ty, add,
    bin, call, clamp, div, int, mul, rem, select, sub, ty_bytes, var,
};
use crate::library::library_of;
use crate::print::expr as print_expr;

// The other families live in their own files but are children of this
// module, so they share the index-map machinery (`Lower`, `Index`, `Reduced`)
// privately.
#[path = "attention.rs"]
mod attention;
#[path = "attention_tc.rs"]
mod attention_tc;
#[path = "chain.rs"]
mod chain;
#[path = "depthwise.rs"]
mod depthwise;
#[path = "epilogue.rs"]
mod epilogue;
#[path = "gemm.rs"]
mod gemm;
#[path = "gemm_tc.rs"]
mod gemm_tc;
#[path = "gemm_wgmma.rs"]
mod gemm_wgmma;
#[path = "pool.rs"]
mod pool;
#[path = "simt.rs"]
mod simt;
#[path = "split_k.rs"]
mod split_k;

pub(crate) use split_k::stream_partials;

/// Why a group could not be lowered.
#[derive(Clone, Debug, PartialEq)]
pub enum EmitError {
    /// The group (or one of its ops) is of a form this emitter does not lower yet.
    Unsupported {
        /// The group's symbol.
        group: String,
        /// What is not supported.
        reason: Reason,
    },
}

impl std::fmt::Display for EmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmitError::Unsupported { group, reason } => {
                write!(
                    f,
                    "cannot emit group @{group}: {reason} is not supported yet"
                )
            }
        }
    }
}

impl std::error::Error for EmitError {}

type Result<T> = std::result::Result<T, EmitError>;

/// An index into a tensor of `dims`: a row-major linear index, coordinates, or both.
#[derive(Clone, Debug)]
struct Index {
    dims: Vec<usize>,
    linear: Option<Expr>,
    coords: Option<Vec<Expr>>,
}

impl Index {
    fn linear(dims: &[usize], linear: Expr) -> Index {
        Index {
            dims: dims.to_vec(),
            linear: Some(linear),
            coords: None,
        }
    }

    fn coords(dims: &[usize], coords: Vec<Expr>) -> Index {
        Index {
            dims: dims.to_vec(),
            linear: None,
            coords: Some(coords),
        }
    }

    /// The same element in a tensor of `dims` (a reshape of these dims): the
    /// same linear index (kept where it was given), and coordinates found
    /// group by group — the runs
    /// of old and new dims whose sizes have the same product (a dim split
    /// or merged) — so a dim the reshape keeps keeps its coordinate, a split
    /// dim divides only its own coordinate, and a broadcast or a further
    /// view reads coordinates, not remainders of the linear index.
    fn reshaped(&self, dims: &[usize]) -> Index {
        let (Some(coords), Some(groups)) = (&self.coords, reshape_groups(&self.dims, dims)) else {
            return Index::linear(dims, self.get_linear());
        };
        let mut reshaped = Vec::with_capacity(dims.len());
        for (old, new) in groups {
            if old.len() == 1 && new.len() == 1 {
                reshaped.push(coords[old.start].clone());
                continue;
            }
            let group = Index::coords(&self.dims[old.clone()], coords[old].to_vec()).get_linear();
            reshaped.extend(Index::linear(&dims[new], group).get_coords());
        }
        Index {
            dims: dims.to_vec(),
            linear: self.linear.clone(),
            coords: Some(reshaped),
        }
    }

    fn strides(&self) -> Vec<i64> {
        let mut strides = vec![1i64; self.dims.len()];
        for d in (0..self.dims.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * self.dims[d + 1] as i64;
        }
        strides
    }

    fn get_linear(&self) -> Expr {
        if let Some(l) = &self.linear {
            return l.clone();
        }
        let coords = self.coords.as_ref().expect("an index has a form");
        let strides = self.strides();
        // From the outermost dim, the longest run of coordinates that is a
        // linear index's decomposition (a view's coordinates put back
        // together, which would otherwise cost a division and a remainder
        // per dim) as one term, else one coordinate times its stride.
        let mut linear = int(0);
        let mut d = 0;
        while d < coords.len() {
            let (term, end) = (d + 1..=coords.len())
                .rev()
                .find_map(|e| {
                    let l = Index::decomposed(&self.dims[d..e], &coords[d..e])?;
                    Some((l, e))
                })
                .unwrap_or((coords[d].clone(), d + 1));
            linear = add(linear, mul(term, int(strides[end - 1])));
            d = end;
        }
        linear
    }

    /// The linear index `l` when `coords` are `l`'s row-major decomposition
    /// in `dims` (as [`Index::get_coords`] writes it: the outermost
    /// coordinate unreduced, so `l` is in range and the coordinates are all
    /// of it, not `l` modulo a prefix's size, as a broadcast from a leading
    /// dim of 1 or a prefix of a larger index would give).
    fn decomposed(dims: &[usize], coords: &[Expr]) -> Option<Expr> {
        let index = Index::coords(dims, coords.to_vec());
        let strides = index.strides();
        let last = (0..dims.len()).rev().find(|&d| dims[d] != 1)?;
        let quotient = if last == 0 {
            coords[0].clone()
        } else {
            match &coords[last] {
                Expr::Bin(BinOp::Rem, q, m) if **m == int(dims[last] as i64) => (**q).clone(),
                _ => return None,
            }
        };
        let l = if strides[last] == 1 {
            quotient
        } else {
            match quotient {
                Expr::Bin(BinOp::Div, l, s) if *s == int(strides[last]) => *l,
                _ => return None,
            }
        };
        (Index::linear(dims, l.clone()).get_coords() == coords).then_some(l)
    }

    fn get_coords(&self) -> Vec<Expr> {
        if let Some(c) = &self.coords {
            return c.clone();
        }
        let linear = self.linear.clone().expect("an index has a form");
        let strides = self.strides();
        // The linear index is in range: the outermost dim of more than one
        // element takes the whole quotient (no remainder), which is also
        // what lets `decomposed` trust a decomposition it recognizes.
        let outermost = self.dims.iter().position(|&d| d != 1);
        (0..self.dims.len())
            .map(|d| {
                if self.dims[d] == 1 {
                    int(0)
                } else if Some(d) == outermost {
                    div(linear.clone(), strides[d])
                } else {
                    rem(div(linear.clone(), strides[d]), self.dims[d] as i64)
                }
            })
            .collect()
    }
}

/// The runs of `old` and `new` dims (as index ranges) a reshape maps onto
/// each other: consecutive runs whose sizes have the same product, each as
/// short as it can be; `None` when the element counts differ or a dim is 0.
fn reshape_groups(
    old: &[usize],
    new: &[usize],
) -> Option<Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>> {
    if old.contains(&0) || new.contains(&0) {
        return None;
    }
    let (mut i, mut j) = (0, 0);
    let mut groups = Vec::new();
    while i < old.len() || j < new.len() {
        let (si, sj) = (i, j);
        let (mut a, mut b) = (1usize, 1usize);
        if i < old.len() {
            a *= old[i];
            i += 1;
        }
        if j < new.len() {
            b *= new[j];
            j += 1;
        }
        while a != b {
            if a < b && i < old.len() {
                a *= old[i];
                i += 1;
            } else if b < a && j < new.len() {
                b *= new[j];
                j += 1;
            } else {
                return None;
            }
        }
        groups.push((si..i, sj..j));
    }
    Some(groups)
}

/// The local type a value of `dtype` is computed in.
fn local_ty(dtype: DType) -> Ty {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ty::F32,
        DType::I32 => Ty::I32,
        DType::I64 => Ty::I64,
        DType::Bool => Ty::Bool,
    }
}

/// The storage type of an element of `dtype` in global memory.
pub fn storage_ty(dtype: DType) -> Ty {
    match dtype {
        DType::F32 => Ty::F32,
        DType::F16 => Ty::F16Bits,
        DType::BF16 => Ty::Bf16Bits,
        DType::I32 => Ty::I32,
        DType::I64 => Ty::I64,
        DType::Bool => Ty::Bool,
    }
}

/// A C identifier from an IR name: non-alphanumerics become `_`.
fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// How the reduction result of a reduction kernel is read back.
#[derive(Clone, Debug)]
enum Reduced {
    /// Per row: the local holding the row's result.
    Row(Expr),
    /// Per element: softmax with its row max and sum.
    Softmax { max: Expr, sum: Expr },
    /// Per element: layernorm with its mean and reciprocal standard deviation.
    Layernorm { mean: Expr, rstd: Expr },
}

struct Lower<'g> {
    g: &'g Graph,
    group: String,
    /// Region argument → kernel parameter name.
    inputs: HashMap<ValueId, String>,
    body: Vec<Stmt>,
    memo: HashMap<(ValueId, String), Expr>,
    used_names: BTreeSet<String>,
    helpers: BTreeSet<Helper>,
    /// The reduction op of a reduction kernel and how to read its result.
    reduced: Option<(ValueId, Reduced, usize)>,
    /// Vectorized access of the current loop body, if any.
    vector: Option<Vectors>,
    /// Vector loads already made: (parameter, vector index) → local.
    vector_loads: HashMap<(String, String), String>,
}

/// The vector access of a loop body: element `base + step * width + l` of
/// an array is lane `l` of its vector at `index`, for each `(base, index)`;
/// and where `aligned` (an expression the loop keeps a multiple of `width`)
/// is set, element `e + l` for any `e` built of it, multiples of `width`,
/// sums and products is lane `l` of the vector at `e / width`.
#[derive(Clone, Debug)]
struct Vectors {
    step: String,
    width: usize,
    bases: Vec<(Expr, Expr)>,
    aligned: Option<Expr>,
}

impl Vectors {
    /// The vector index and lane of the element at `linear`, if it is one.
    fn lane_of(&self, linear: &Expr) -> Option<(Expr, usize)> {
        let w = self.width as i64;
        let based = self.bases.iter().find_map(|(base, index)| {
            let step = mul(var(&self.step), int(w));
            (0..self.width)
                .find(|&l| *linear == add(base.clone(), add(step.clone(), int(l as i64))))
                .map(|l| (index.clone(), l))
        });
        based.or_else(|| {
            let aligned = self.aligned.as_ref()?;
            let (start, lane) = split_offset(linear);
            (0..w)
                .contains(&lane)
                .then_some(())
                .filter(|()| multiple_of(&start, w, aligned))
                .map(|()| (div(start, w), lane as usize))
        })
    }
}

/// `e` as `start + offset`, the offset the literal added last (0 if none),
/// looking through the right operand of sums: `a + (b + 3)` is `a + b` and 3.
fn split_offset(e: &Expr) -> (Expr, i64) {
    match e {
        Expr::Int(c) => (int(0), *c),
        Expr::Bin(BinOp::Add, a, b) => {
            let (rest, c) = split_offset(b);
            (add((**a).clone(), rest), c)
        }
        _ => (e.clone(), 0),
    }
}

/// Whether `e` is a multiple of `w` for every value of its variables, given
/// that `aligned` is: literal multiples, `aligned` itself, sums of
/// multiples and products with a multiple.
fn multiple_of(e: &Expr, w: i64, aligned: &Expr) -> bool {
    if e == aligned {
        return true;
    }
    match e {
        Expr::Int(c) => c % w == 0,
        Expr::Bin(BinOp::Add, a, b) => multiple_of(a, w, aligned) && multiple_of(b, w, aligned),
        Expr::Bin(BinOp::Mul, a, b) => multiple_of(a, w, aligned) || multiple_of(b, w, aligned),
        _ => false,
    }
}

impl<'g> Lower<'g> {
    /// Group `op`'s kernel: `body` on `grid` blocks of `block` threads with
    /// the helpers this lowering used, and nothing else (no shared arrays,
    /// dynamic shared memory, occupancy promise, scratch or architecture):
    /// a family sets those by struct update.
    fn kernel(
        &mut self,
        op: OpId,
        summary: String,
        params: Vec<Param>,
        body: Vec<Stmt>,
        [block, grid]: [usize; 2],
    ) -> Kernel {
        Kernel {
            name: kernel_name(self.g, op),
            summary,
            params,
            shared: Vec::new(),
            body,
            helpers: std::mem::take(&mut self.helpers),
            block: block as u32,
            grid: grid as u32,
            dynamic_shared: 0,
            min_blocks_per_sm: 0,
            scratch: Vec::new(),
            requires_arch: None,
            adapted: Vec::new(),
        }
    }

    fn unsupported(&self, reason: impl Into<Reason>) -> EmitError {
        EmitError::Unsupported {
            group: self.group.clone(),
            reason: reason.into(),
        }
    }

    fn fresh(&mut self, hint: &str) -> String {
        let base = format!("v_{}", sanitize(hint));
        let mut name = base.clone();
        let mut n = 1;
        while !self.used_names.insert(name.clone()) {
            name = format!("{base}_{n}");
            n += 1;
        }
        name
    }

    fn bind(&mut self, hint: &str, ty: Ty, value: Expr) -> Expr {
        if matches!(
            value,
            Expr::Var(_) | Expr::Int(_) | Expr::F32(_) | Expr::Bool(_)
        ) {
            return value;
        }
        let name = self.fresh(hint);
        self.body.push(Stmt::Let {
            name: name.clone(),
            ty,
            value,
            constant: true,
        });
        var(name)
    }

    /// Runs `f` with a fresh statement list and memo scope; returns the statements.
    fn scoped(&mut self, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<Vec<Stmt>> {
        let body = std::mem::take(&mut self.body);
        let memo = self.memo.clone();
        let vector_loads = self.vector_loads.clone();
        let result = f(self);
        self.memo = memo;
        self.vector_loads = vector_loads;
        let inner = std::mem::replace(&mut self.body, body);
        result.map(|()| inner)
    }

    /// `e` rounded to `dtype` (f16, bf16; other dtypes unchanged).
    fn round(&mut self, dtype: DType, e: Expr) -> Expr {
        match dtype {
            DType::F16 => {
                self.helpers.insert(Helper::Half);
                call("dcir_round_h", vec![e])
            }
            DType::BF16 => {
                self.helpers.insert(Helper::Bfloat16);
                call("dcir_round_bf", vec![e])
            }
            _ => e,
        }
    }

    fn widen(&mut self, dtype: DType, e: Expr) -> Expr {
        match dtype {
            DType::F16 => {
                self.helpers.insert(Helper::Half);
                call("dcir_h2f", vec![e])
            }
            DType::BF16 => {
                self.helpers.insert(Helper::Bfloat16);
                call("dcir_bf2f", vec![e])
            }
            _ => e,
        }
    }

    fn narrow(&mut self, dtype: DType, e: Expr) -> Expr {
        match dtype {
            DType::F16 => {
                self.helpers.insert(Helper::Half);
                call("dcir_f2h", vec![e])
            }
            DType::BF16 => {
                self.helpers.insert(Helper::Bfloat16);
                call("dcir_f2bf", vec![e])
            }
            _ => e,
        }
    }

    /// A float literal of `dtype` (rounded to it once).
    fn float_const(dtype: DType, v: f64) -> Expr {
        let v = match dtype {
            DType::F16 => half::f16::from_f64(v).to_f32(),
            DType::BF16 => half::bf16::from_f64(v).to_f32(),
            _ => v as f32,
        };
        Expr::F32(v)
    }

    fn constant(&self, dtype: DType, v: f64) -> Expr {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => Self::float_const(dtype, v),
            DType::I32 | DType::I64 => int(v as i64),
            DType::Bool => Expr::Bool(v != 0.0),
        }
    }

    /// The element of `v` at `idx`, as a local or literal.
    fn value_at(&mut self, v: ValueId, idx: &Index) -> Result<Expr> {
        let key = (v, print_expr(&idx.get_linear()));
        if let Some(e) = self.memo.get(&key) {
            return Ok(e.clone());
        }
        let e = self.compute(v, idx)?;
        self.memo.insert(key, e.clone());
        Ok(e)
    }

    fn compute(&mut self, v: ValueId, idx: &Index) -> Result<Expr> {
        let data = self.g.value(v);
        let dtype = data.ty.dtype;
        let hint = data.name.clone();
        let (op, result) = match data.def {
            ValueDef::BlockArg { .. } => return self.load_input(v, idx),
            ValueDef::OpResult { op, index } => (op, index),
        };
        if result != 0 {
            return Err(self.unsupported("an op with several results"));
        }
        if let Some((rv, how, row)) = self.reduced.clone()
            && rv == v
        {
            let e = self.reduced_value(op, how, row, idx)?;
            if !dtype.is_float() && dtype != DType::I64 {
                // Accumulated in `long long`: the value as its dtype.
                let e = Expr::Cast(local_ty(dtype), Box::new(e));
                return Ok(self.bind(&hint, local_ty(dtype), e));
            }
            return Ok(self.bind(&hint, Ty::F32, e));
        }
        let op_data = self.g.op(op);
        let kind = op_data.kind;
        let operands = op_data.operands.clone();
        let attrs = op_data.attrs.clone();
        let ints = |name: &str| attrs.get(name).and_then(Attr::as_ints).map(<[i64]>::to_vec);
        let operand_dims = |i: usize| self.g.ty(operands[i]).dims().to_vec();
        let operand_dtype = |i: usize| self.g.ty(operands[i]).dtype;
        let own = self.g.ty(v).dims().to_vec();
        let reindexed;
        let idx = if idx.dims == own {
            idx
        } else if idx.dims.iter().product::<usize>() == own.iter().product::<usize>() {
            // Read through a view of the same elements (a reshape epilogue):
            // the same row-major position in this value's own shape.
            reindexed = idx.reshaped(&own);
            &reindexed
        } else {
            // An op of another size than the kernel's index space (a dead
            // branch planned into the group).
            return Err(self.unsupported(format!(
                "`{}` of shape {own:?} read at an index of shape {:?}",
                kind.name(),
                idx.dims
            )));
        };
        let coords = idx.get_coords();
        let e = match kind {
            OpKind::Mod => {
                let a = self.value_at(operands[0], idx)?;
                let b = self.value_at(operands[1], idx)?;
                let fmod = attrs.get("fmod").and_then(Attr::as_bool) == Some(true);
                self.modulo(dtype, fmod, a, b)
            }
            OpKind::Select => {
                let c = self.value_at(operands[0], idx)?;
                let a = self.value_at(operands[1], idx)?;
                let b = self.value_at(operands[2], idx)?;
                select(c, a, b)
            }
            _ if kind.is_elementwise_binary() => {
                let a = self.value_at(operands[0], idx)?;
                let b = self.value_at(operands[1], idx)?;
                self.binary(kind, operand_dtype(0), a, b)?
            }
            _ if kind.is_elementwise_unary() => {
                let a = self.value_at(operands[0], idx)?;
                self.unary(kind, operand_dtype(0), a, &attrs)?
            }
            // Integers exactly (an i64 past 2^53 is no f64), as a
            // `long long` for i64 (`2147483647 * 2147483647` of two `int`
            // literals would wrap at 32 bits).
            OpKind::Constant if matches!(dtype, DType::I32 | DType::I64) => {
                let exact = match attrs.get("value") {
                    Some(Attr::Int(i)) => Some(*i),
                    Some(Attr::Ints(xs)) => {
                        xs.first().filter(|&&x| xs.iter().all(|&y| y == x)).copied()
                    }
                    other => other.and_then(Attr::splat).map(|x| x as i64),
                };
                match exact {
                    Some(v) if dtype == DType::I64 => Expr::Cast(Ty::I64, Box::new(int(v))),
                    Some(v) => int(v),
                    None => return Err(self.unsupported("a constant with several distinct values")),
                }
            }
            OpKind::Constant => match attrs.get("value").and_then(Attr::splat) {
                Some(x) => self.constant(dtype, x),
                // `apply_plan` copies only splats into regions.
                None => return Err(self.unsupported("a constant with several distinct values")),
            },
            OpKind::Broadcast => {
                let dims = ints("dims").unwrap_or_default();
                let od = operand_dims(0);
                let c = od
                    .iter()
                    .zip(&dims)
                    .map(|(&e, &d)| {
                        if e == 1 {
                            int(0)
                        } else {
                            coords[d as usize].clone()
                        }
                    })
                    .collect();
                self.value_at(operands[0], &Index::coords(&od, c))?
            }
            OpKind::Reshape => {
                let od = operand_dims(0);
                self.value_at(operands[0], &idx.reshaped(&od))?
            }
            OpKind::Transpose => {
                let perm = ints("perm").unwrap_or_default();
                let od = operand_dims(0);
                let mut c = vec![int(0); od.len()];
                for (i, &p) in perm.iter().enumerate() {
                    c[p as usize] = coords[i].clone();
                }
                self.value_at(operands[0], &Index::coords(&od, c))?
            }
            OpKind::Slice => {
                let starts = ints("starts").unwrap_or_default();
                let steps = ints("steps").unwrap_or_default();
                let od = operand_dims(0);
                if starts.iter().any(|&s| s < 0) {
                    return Err(self.unsupported("a slice with negative starts"));
                }
                let c = (0..od.len())
                    .map(|d| {
                        let step = steps.get(d).copied().unwrap_or(1);
                        add(int(starts[d]), mul(coords[d].clone(), int(step)))
                    })
                    .collect();
                self.value_at(operands[0], &Index::coords(&od, c))?
            }
            OpKind::Pad => {
                let low = ints("low").unwrap_or_default();
                let value = attrs.get("value").and_then(Attr::as_float).unwrap_or(0.0);
                let od = operand_dims(0);
                let mut inside: Option<Expr> = None;
                let mut c = Vec::new();
                for d in 0..od.len() {
                    let shifted = sub(coords[d].clone(), int(low[d]));
                    if low[d] != 0 || od[d] != idx.dims[d] {
                        let cond = bin(
                            BinOp::And,
                            bin(BinOp::Ge, shifted.clone(), int(0)),
                            bin(BinOp::Lt, shifted.clone(), int(od[d] as i64)),
                        );
                        inside = Some(match inside {
                            None => cond,
                            Some(prev) => bin(BinOp::And, prev, cond),
                        });
                        c.push(clamp(shifted, 0, od[d] as i64 - 1));
                    } else {
                        c.push(shifted);
                    }
                }
                let x = self.value_at(operands[0], &Index::coords(&od, c))?;
                match inside {
                    Some(cond) => select(cond, x, self.constant(dtype, value)),
                    None => x,
                }
            }
            OpKind::Concat => {
                let axis = attrs.get("axis").and_then(Attr::as_int).unwrap_or(0) as usize;
                let mut parts = Vec::new();
                let mut offset = 0i64;
                for (i, &operand) in operands.iter().enumerate() {
                    let od = operand_dims(i);
                    let ext = od[axis] as i64;
                    let mut c = coords.clone();
                    c[axis] = clamp(sub(coords[axis].clone(), int(offset)), 0, ext - 1);
                    let x = self.value_at(operand, &Index::coords(&od, c))?;
                    offset += ext;
                    parts.push((offset, x));
                }
                let (_, mut e) = parts.pop().expect("concat has an operand");
                while let Some((end, x)) = parts.pop() {
                    e = select(bin(BinOp::Lt, coords[axis].clone(), int(end)), x, e);
                }
                e
            }
            OpKind::Gather => {
                let axis = attrs.get("axis").and_then(Attr::as_int).unwrap_or(0) as usize;
                let dd = operand_dims(0);
                let id = operand_dims(1);
                let ic = coords[axis..axis + id.len()].to_vec();
                let raw = self.value_at(operands[1], &Index::coords(&id, ic))?;
                let ext = dd[axis] as i64;
                let raw = Expr::Cast(Ty::I32, Box::new(raw));
                let wrapped = select(
                    bin(BinOp::Lt, raw.clone(), int(0)),
                    add(raw.clone(), int(ext)),
                    raw,
                );
                let wrapped = self.bind(&format!("{hint}_index"), Ty::I32, wrapped);
                let mut c = coords[..axis].to_vec();
                c.push(clamp(wrapped, 0, ext - 1));
                c.extend_from_slice(&coords[axis + id.len()..]);
                self.value_at(operands[0], &Index::coords(&dd, c))?
            }
            OpKind::Cast => {
                let x = self.value_at(operands[0], idx)?;
                self.cast(operand_dtype(0), dtype, x)
            }
            OpKind::Batchnorm => {
                let eps = attrs
                    .get("epsilon")
                    .and_then(Attr::as_float)
                    .unwrap_or(1e-5);
                let x = self.value_at(operands[0], idx)?;
                let channel = Index::coords(&operand_dims(1), vec![coords[1].clone()]);
                let mut p = Vec::new();
                for &o in &operands[1..5] {
                    p.push(self.value_at(o, &channel)?);
                }
                let norm = bin(
                    BinOp::Mul,
                    bin(BinOp::Sub, x, p[2].clone()),
                    call(
                        "rsqrtf",
                        vec![bin(BinOp::Add, p[3].clone(), Expr::F32(eps as f32))],
                    ),
                );
                bin(
                    BinOp::Add,
                    bin(BinOp::Mul, norm, p[0].clone()),
                    p[1].clone(),
                )
            }
            OpKind::Matmul if dtype.is_int() => {
                let ta = attrs.get("transpose_a").and_then(Attr::as_bool) == Some(true);
                let tb = attrs.get("transpose_b").and_then(Attr::as_bool) == Some(true);
                self.dot(&hint, dtype, [operands[0], operands[1]], [ta, tb], &coords)?
            }
            other => {
                return Err(self.unsupported(Reason::Op {
                    op: other,
                    place: "in this group".into(),
                }));
            }
        };
        Ok(self.bind(&hint, local_ty(dtype), e))
    }

    /// The element at `coords` of the integer matmul of `a` and `b` (their
    /// last two dims transposed where `transposed` says): a loop over the
    /// contraction dim accumulating in `long long`, wrapping as the
    /// interpreter does, then narrowed to `dtype`.
    fn dot(
        &mut self,
        hint: &str,
        dtype: DType,
        [a, b]: [ValueId; 2],
        transposed: [bool; 2],
        coords: &[Expr],
    ) -> Result<Expr> {
        let (ad, bd) = (self.g.ty(a).dims().to_vec(), self.g.ty(b).dims().to_vec());
        let r = ad.len();
        let k = if transposed[0] { ad[r - 2] } else { ad[r - 1] };
        let acc = self.fresh(&format!("{hint}_acc"));
        let kv = self.fresh(&format!("{hint}_k"));
        let (row, col) = (coords[r - 2].clone(), coords[r - 1].clone());
        let at = |batch: &[Expr], i: Expr, j: Expr, t: bool| {
            let mut c = batch.to_vec();
            c.extend(if t { [j, i] } else { [i, j] });
            c
        };
        let batch = &coords[..r - 2];
        let body = self.scoped(|l| {
            let x = l.value_at(
                a,
                &Index::coords(&ad, at(batch, row, var(&kv), transposed[0])),
            )?;
            let y = l.value_at(
                b,
                &Index::coords(&bd, at(batch, var(&kv), col, transposed[1])),
            )?;
            let product = bin(
                BinOp::Mul,
                Expr::Cast(Ty::I64, Box::new(x)),
                Expr::Cast(Ty::I64, Box::new(y)),
            );
            l.body.push(Stmt::Assign(
                acc.clone(),
                bin(BinOp::Add, var(&acc), product),
            ));
            Ok(())
        })?;
        self.body.push(Stmt::Let {
            name: acc.clone(),
            ty: Ty::I64,
            value: int(0),
            constant: false,
        });
        self.body.push(Stmt::For {
            var: kv,
            start: int(0),
            end: int(k as i64),
            step: int(1),
            unroll: false,
            body,
        });
        Ok(Expr::Cast(local_ty(dtype), Box::new(var(acc))))
    }

    fn load_input(&mut self, v: ValueId, idx: &Index) -> Result<Expr> {
        let ty = self.g.ty(v).clone();
        let param = self.inputs[&v].clone();
        let linear = idx.get_linear();
        // A vector never reads past the tensor: its elements are a multiple
        // of the width, so a vector holding one of them lies inside it.
        if let Some(vectors) = self.vector.clone()
            && let Some((index, lane)) = vectors.lane_of(&linear)
            && ty.dtype.is_float()
            && ty.dtype.size_bytes() * vectors.width <= 16
            && ty.num_elements().is_some_and(|n| n % vectors.width == 0)
        {
            let width = vectors.width;
            let vec_var = self.vector_load(&param, ty.dtype, index, width);
            let e = vector_lane(vec_var, ty.dtype, width, lane);
            let e = self.widen(ty.dtype, e);
            return Ok(self.bind(&self.g.value(v).name.clone(), Ty::F32, e));
        }
        let array = ArrayRef {
            name: param,
            ty: storage_ty(ty.dtype),
            reinterpret: false,
        };
        let e = Expr::Load(array, Box::new(linear));
        let e = self.widen(ty.dtype, e);
        Ok(self.bind(&self.g.value(v).name.clone(), local_ty(ty.dtype), e))
    }

    fn vector_load(&mut self, param: &str, dtype: DType, index: Expr, width: usize) -> String {
        let key = (param.to_string(), print_expr(&index));
        if let Some(v) = self.vector_loads.get(&key) {
            return v.clone();
        }
        let ty = vector_ty(dtype, width);
        let name = self.fresh(&format!("{param}_vec"));
        let array = ArrayRef {
            name: param.to_string(),
            ty,
            reinterpret: true,
        };
        self.body.push(Stmt::Let {
            name: name.clone(),
            ty,
            value: Expr::Load(array, Box::new(index)),
            constant: true,
        });
        self.vector_loads.insert(key, name.clone());
        name
    }

    /// `a kind b` for operands of `dtype`.
    fn binary(&mut self, kind: OpKind, dtype: DType, a: Expr, b: Expr) -> Result<Expr> {
        match kind {
            OpKind::Equal => return Ok(bin(BinOp::Eq, a, b)),
            OpKind::Less => return Ok(bin(BinOp::Lt, a, b)),
            OpKind::LessEqual => return Ok(bin(BinOp::Ge, b, a)),
            OpKind::Greater => return Ok(bin(BinOp::Lt, b, a)),
            OpKind::GreaterEqual => return Ok(bin(BinOp::Ge, a, b)),
            OpKind::And => return Ok(bin(BinOp::And, a, b)),
            OpKind::Or => return Ok(bin(BinOp::Ne, bin(BinOp::BitOr, a, b), Expr::Bool(false))),
            OpKind::Xor => return Ok(bin(BinOp::Ne, a, b)),
            _ => {}
        }
        let float = dtype.is_float();
        if !float && !dtype.is_int() {
            return Err(self.unsupported(Reason::DType { op: kind, dtype }));
        }
        let op = |o| Ok(bin(o, a.clone(), b.clone()));
        match kind {
            OpKind::Add => op(BinOp::Add),
            OpKind::Sub => op(BinOp::Sub),
            OpKind::Mul => op(BinOp::Mul),
            // In a 16-bit dtype, by a constant: times its reciprocal (within
            // an f32 ulp, far below the dtype's rounding; an IEEE division
            // costs a check and a slow path per element). f32 stays exact.
            OpKind::Div if matches!(dtype, DType::F16 | DType::BF16) => match b {
                Expr::F32(c) if c != 0.0 && c.is_finite() && (1.0 / c).is_finite() => {
                    Ok(bin(BinOp::Mul, a, Expr::F32(1.0 / c)))
                }
                _ => op(BinOp::Div),
            },
            OpKind::Div => op(BinOp::Div),
            OpKind::Max | OpKind::Min if float => {
                self.helpers.insert(Helper::NanMinMax);
                let f = if kind == OpKind::Max {
                    "dcir_max"
                } else {
                    "dcir_min"
                };
                Ok(call(f, vec![a, b]))
            }
            // Both operands of the dtype's type, so that one overload fits
            // (a literal `0` is an `int` beside a `long long`).
            OpKind::Max | OpKind::Min => {
                let ty = local_ty(dtype);
                let name = if kind == OpKind::Max { "max" } else { "min" };
                let typed = |e: Expr| match e {
                    Expr::Int(_) => Expr::Cast(ty, Box::new(e)),
                    e => e,
                };
                Ok(call(name, vec![typed(a), typed(b)]))
            }
            OpKind::Pow if float => Ok(call("powf", vec![a, b])),
            OpKind::Pow => {
                self.helpers.insert(Helper::IntPow);
                Ok(call("dcir_ipow", vec![a, b]))
            }
            other => Err(self.unsupported(Reason::DType { op: other, dtype })),
        }
    }

    fn unary(
        &mut self,
        kind: OpKind,
        dtype: DType,
        a: Expr,
        attrs: &dcir_ir::Attrs,
    ) -> Result<Expr> {
        match kind {
            OpKind::Not => return Ok(Expr::Not(Box::new(a))),
            OpKind::IsNan => return Ok(bin(BinOp::Ne, a.clone(), a)),
            OpKind::IsInf => {
                return Ok(bin(
                    BinOp::Eq,
                    call("fabsf", vec![a]),
                    Expr::F32(f32::INFINITY),
                ));
            }
            _ => {}
        }
        if !dtype.is_float() {
            // Integer literals are cast to the operand's type: `max(long
            // long, int)` is ambiguous among CUDA's overloads.
            let ty = local_ty(dtype);
            let lit = |v: i64| Expr::Cast(ty, Box::new(int(v)));
            let a = match a {
                Expr::Int(v) => lit(v),
                a => a,
            };
            return match kind {
                OpKind::Neg => Ok(Expr::Neg(Box::new(a))),
                OpKind::Abs if dtype == DType::I64 => Ok(call("llabs", vec![a])),
                OpKind::Abs => Ok(call("abs", vec![a])),
                OpKind::Relu => Ok(call("max", vec![a, lit(0)])),
                OpKind::Sign => Ok(Expr::Cast(
                    ty,
                    Box::new(bin(
                        BinOp::Sub,
                        bin(BinOp::Lt, lit(0), a.clone()),
                        bin(BinOp::Lt, a, lit(0)),
                    )),
                )),
                OpKind::Clip => {
                    // As the interpreter: bounds round inward and saturate
                    // at the dtype's range (an infinite bound clips nothing).
                    let (type_lo, type_hi) = match dtype {
                        DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
                        _ => (i64::MIN, i64::MAX),
                    };
                    let bound = |name: &str, round: fn(f64) -> f64| {
                        let v = round(attrs.get(name).and_then(Attr::as_float).unwrap_or(0.0));
                        (v as i64).clamp(type_lo, type_hi)
                    };
                    let (lo, hi) = (bound("min", f64::ceil), bound("max", f64::floor));
                    Ok(call("min", vec![call("max", vec![a, lit(lo)]), lit(hi)]))
                }
                other => Err(self.unsupported(Reason::DType { op: other, dtype })),
            };
        }
        let f = |name: &str| Ok(call(name, vec![a.clone()]));
        match kind {
            OpKind::Relu => {
                self.helpers.insert(Helper::NanMinMax);
                f("dcir_relu")
            }
            OpKind::Clip => {
                self.helpers.insert(Helper::NanMinMax);
                let lo = attrs.get("min").and_then(Attr::as_float).unwrap_or(0.0);
                let hi = attrs.get("max").and_then(Attr::as_float).unwrap_or(0.0);
                Ok(call(
                    "dcir_min",
                    vec![
                        call("dcir_max", vec![a, Expr::F32(lo as f32)]),
                        Expr::F32(hi as f32),
                    ],
                ))
            }
            OpKind::Gelu => {
                self.helpers.insert(Helper::Gelu);
                match attrs.get("approximate").and_then(Attr::as_str) {
                    Some("tanh") => f("dcir_gelu_tanh"),
                    _ => f("dcir_gelu"),
                }
            }
            OpKind::Sigmoid => {
                self.helpers.insert(Helper::Sigmoid);
                f("dcir_sigmoid")
            }
            OpKind::Erf => f("erff"),
            OpKind::Floor => f("floorf"),
            OpKind::Ceil => f("ceilf"),
            // Round to nearest even, the default rounding mode.
            OpKind::Round => f("rintf"),
            OpKind::Sin => f("sinf"),
            OpKind::Cos => f("cosf"),
            // NaN and ±0 stay as they are.
            OpKind::Sign => Ok(select(
                bin(BinOp::Lt, Expr::F32(0.0), a.clone()),
                Expr::F32(1.0),
                select(
                    bin(BinOp::Lt, a.clone(), Expr::F32(0.0)),
                    Expr::F32(-1.0),
                    a,
                ),
            )),
            OpKind::Tanh => f("tanhf"),
            OpKind::Exp => f("expf"),
            OpKind::Log => f("logf"),
            OpKind::Sqrt => f("sqrtf"),
            OpKind::Rsqrt => f("rsqrtf"),
            OpKind::Abs => f("fabsf"),
            OpKind::Neg => Ok(Expr::Neg(Box::new(a))),
            other => Err(self.unsupported(Reason::DType { op: other, dtype })),
        }
    }

    /// `a mod b` of `dtype`: the remainder with the sign of `b` (Python's
    /// `%`), or with `fmod` of `a` (C's `%` and `fmodf`, truncated).
    fn modulo(&mut self, dtype: DType, fmod: bool, a: Expr, b: Expr) -> Expr {
        let (rem_ab, zero) = if dtype.is_float() {
            (call("fmodf", vec![a, b.clone()]), Expr::F32(0.0))
        } else {
            (bin(BinOp::Rem, a, b.clone()), int(0))
        };
        if fmod {
            return rem_ab;
        }
        let r = self.bind("rem", local_ty(dtype), rem_ab);
        let signs_differ = bin(
            BinOp::Ne,
            bin(BinOp::Lt, r.clone(), zero.clone()),
            bin(BinOp::Lt, b.clone(), zero.clone()),
        );
        select(
            bin(BinOp::And, bin(BinOp::Ne, r.clone(), zero), signs_differ),
            bin(BinOp::Add, r.clone(), b),
            r,
        )
    }

    /// `x` (of dtype `from`) as `to`. Its dtype is observable here, so a
    /// float operand is first rounded to `from` (intermediates are f32).
    fn cast(&mut self, from: DType, to: DType, x: Expr) -> Expr {
        let x_float = from.is_float();
        let x = self.round(from, x);
        match to {
            DType::Bool if x_float => bin(BinOp::Ne, x, Expr::F32(0.0)),
            DType::Bool => bin(BinOp::Ne, x, int(0)),
            DType::F32 | DType::F16 | DType::BF16 => {
                let e = if x_float {
                    x
                } else {
                    Expr::Cast(Ty::F32, Box::new(x))
                };
                self.round(to, e)
            }
            DType::I32 if x_float => call("__float2int_rz", vec![x]),
            DType::I64 if x_float => call("__float2ll_rz", vec![x]),
            DType::I32 => Expr::Cast(Ty::I32, Box::new(x)),
            DType::I64 => Expr::Cast(Ty::I64, Box::new(x)),
        }
    }

    fn reduced_value(&mut self, op: OpId, how: Reduced, row: usize, idx: &Index) -> Result<Expr> {
        let operands = self.g.op(op).operands.clone();
        match how {
            Reduced::Row(acc) => Ok(acc),
            Reduced::Softmax { max, sum } => {
                let x = self.value_at(operands[0], idx)?;
                Ok(bin(
                    BinOp::Div,
                    call("expf", vec![bin(BinOp::Sub, x, max)]),
                    sum,
                ))
            }
            Reduced::Layernorm { mean, rstd } => {
                let x = self.value_at(operands[0], idx)?;
                // The column: `c` of `row * row_len + c`, else from the linear index.
                let linear = idx.get_linear();
                let row_start = mul(var("row"), int(row as i64));
                let col = match linear {
                    Expr::Bin(BinOp::Add, start, c) if *start == row_start => *c,
                    linear => rem(linear, row as i64),
                };
                let pdims = self.g.ty(operands[1]).dims().to_vec();
                let scale = self.value_at(operands[1], &Index::linear(&pdims, col.clone()))?;
                let bias = self.value_at(operands[2], &Index::linear(&pdims, col))?;
                let norm = bin(BinOp::Mul, bin(BinOp::Sub, x, mean), rstd);
                Ok(bin(BinOp::Add, bin(BinOp::Mul, norm, scale), bias))
            }
        }
    }
}

/// Elements per vector access when vectors are asked for: 16 bytes of the
/// widest parameter (float4, or 8 f16/bf16 in a uint4), halved until the
/// width divides `len`; 1 (scalar) when a parameter is not a float.
fn wide_vector(params: &[Param], len: usize) -> usize {
    let all_float = params
        .iter()
        .all(|p| matches!(p.ty, Ty::F32 | Ty::F16Bits | Ty::Bf16Bits));
    if !all_float {
        return 1;
    }
    let widest = params.iter().map(|p| ty_bytes(p.ty)).max().unwrap_or(4);
    dcir_fusion::vector_access_width(widest, len)
}

/// The vector type of `width` elements of `dtype`.
fn vector_ty(dtype: DType, width: usize) -> Ty {
    match (dtype, width) {
        (DType::F32, 4) => Ty::Float4,
        (DType::F32, _) => Ty::Float2,
        (_, 8) => Ty::Uint4,
        (_, 4) => Ty::Uint2,
        _ => Ty::U32,
    }
}

/// Element `lane` of a vector local.
fn vector_lane(v: String, dtype: DType, width: usize, lane: usize) -> Expr {
    const F: [&str; 4] = ["x", "y", "z", "w"];
    if dtype == DType::F32 {
        return Expr::Field(Box::new(var(v)), F[lane]);
    }
    let word = if width > 2 {
        Expr::Field(Box::new(var(v)), F[lane / 2])
    } else {
        var(v)
    };
    let bits = if lane.is_multiple_of(2) {
        bin(BinOp::BitAnd, word, Expr::Int(0xffff))
    } else {
        bin(BinOp::Shr, word, int(16))
    };
    Expr::Cast(storage_ty(dtype), Box::new(bits))
}

/// The group's kernel parameters: region arguments (inputs), then results.
fn params(l: &mut Lower, op: OpId) -> Vec<Param> {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    let mut params = Vec::new();
    for &arg in &g.block(region).args {
        let name = param_name(&g.value(arg).name, "_in");
        let name = unique(&mut l.used_names, name);
        l.inputs.insert(arg, name.clone());
        let dtype = g.ty(arg).dtype;
        params.push(Param {
            name,
            ty: storage_ty(dtype),
            dtype: dtype.name(),
            output: false,
            tensor_map: None,
        });
    }
    for &r in &g.op(op).results {
        let name = unique(&mut l.used_names, param_name(&g.value(r).name, "_out"));
        let dtype = g.ty(r).dtype;
        params.push(Param {
            name,
            ty: storage_ty(dtype),
            dtype: dtype.name(),
            output: true,
            tensor_map: None,
        });
    }
    params
}

/// A kernel parameter's C name: the IR name sanitized, ending in `suffix`
/// (`_in` for inputs, `_out` for outputs), so that no value name (`i`,
/// `int`, `and`, `threadIdx`) collides with a C++ keyword, a CUDA builtin or
/// one of the kernel's own locals, none of which end so.
fn param_name(name: &str, suffix: &str) -> String {
    let base = sanitize(name);
    // `x_in` and a renamed copy of it, `x_in_2`, already end so.
    let numbered = base.rsplit_once('_').is_some_and(|(head, n)| {
        !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) && head.ends_with(suffix)
    });
    if base.ends_with(suffix) || numbered {
        base
    } else {
        base + suffix
    }
}

fn unique(used: &mut BTreeSet<String>, base: String) -> String {
    let mut name = base.clone();
    let mut n = 1;
    while !used.insert(name.clone()) {
        name = format!("{base}_{n}");
        n += 1;
    }
    name
}

fn attr_int(g: &Graph, op: OpId, name: &str, default: i64) -> i64 {
    g.op(op)
        .attrs
        .get(name)
        .and_then(Attr::as_int)
        .unwrap_or(default)
}

/// The planned `stages` of group `op` a single-stage FMA kernel (`family`)
/// does not run as written, and its `math = "tensor_core"`
/// (`Kernel::adapted`).
fn adapted_single_stage(g: &Graph, op: OpId, family: &str) -> Vec<String> {
    let mut adapted = Vec::new();
    let stages = attr_int(g, op, "stages", 1);
    if stages > 1 {
        adapted.push(format!(
            "stages = {stages} runs as 1 (the {family} kernel is single-stage)"
        ));
    }
    if g.op(op).attrs.get("math").and_then(Attr::as_str) == Some("tensor_core") {
        adapted.push(format!(
            "math = \"tensor_core\" runs on FMA (the {family} kernel's only math)"
        ));
    }
    adapted
}

/// Splits `threads` into `threads_m × threads_n` dividing `tm × tn`, the
/// micro-tile as square as possible (wider than tall on a tie).
/// (The register-tiled SIMT families that stage tiles in shared memory:
/// depthwise_pointwise and contraction chains; the GEMM family has its own
/// vector-aware split.)
fn thread_grid(tm: usize, tn: usize, threads: usize) -> Option<(usize, usize)> {
    (1..=threads)
        .filter(|&tn_t| {
            threads.is_multiple_of(tn_t)
                && tn.is_multiple_of(tn_t)
                && tm.is_multiple_of(threads / tn_t)
        })
        .map(|tn_t| (threads / tn_t, tn_t))
        .min_by_key(|&(tm_t, tn_t)| {
            let (mm, nn) = ((tm / tm_t) as i64, (tn / tn_t) as i64);
            ((mm - nn).abs(), -nn)
        })
}

/// The kernel name of group `op` of graph `g`: `<graph>_<symbol>`.
pub fn kernel_name(g: &Graph, op: OpId) -> String {
    let symbol = g.op(op).symbol.clone().unwrap_or_else(|| "g".into());
    sanitize(&format!("{}_{}", g.name(), symbol))
}

/// Lowers one `fused` op of `g` to a kernel.
pub fn lower_fused(g: &Graph, op: OpId) -> Result<Kernel> {
    let data = g.op(op);
    let group = data.symbol.clone().unwrap_or_default();
    let kind = data
        .attrs
        .get("kind")
        .and_then(Attr::as_str)
        .unwrap_or("none")
        .to_string();
    let mut l = Lower {
        g,
        group: group.clone(),
        inputs: HashMap::new(),
        body: Vec::new(),
        memo: HashMap::new(),
        used_names: BTreeSet::new(),
        helpers: BTreeSet::new(),
        reduced: None,
        vector: None,
        vector_loads: HashMap::new(),
    };
    if data.kind != OpKind::Fused || data.region.is_none() {
        return Err(l.unsupported("an op that is not `fused`"));
    }
    if let Some(library) = data.attrs.get("library").and_then(Attr::as_str) {
        return Err(l.unsupported(Reason::Parameters(format!(
            "library = \"{library}\": the group is a library call, not a kernel (crate::library)"
        ))));
    }
    let tensor_cores = data.attrs.get("math").and_then(Attr::as_str) == Some("tensor_core");
    if tensor_cores
        && matches!(kind.as_str(), "gemm" | "conv")
        && !integer_matmul(g, op)
        && !gemm_tc::applies(g, op)
    {
        return Err(l.unsupported(Reason::Parameters(
            "math = \"tensor_core\" on a contraction whose operands are not both f16 or both bf16 (strict f32 runs on FMA)".into(),
        )));
    }
    match kind.as_str() {
        "elementwise" => elementwise(&mut l, op),
        // An integer matmul: a loop over k per output element.
        "gemm" if integer_matmul(g, op) => elementwise(&mut l, op),
        "reduction" => reduction(&mut l, op),
        "gemm" if gemm_tc::applies(g, op) => gemm_tc::gemm(&mut l, op),
        "gemm" => gemm::gemm(&mut l, op),
        "conv" if data.attrs.get("algorithm").and_then(Attr::as_str) == Some("direct") => {
            depthwise::direct(&mut l, op)
        }
        "conv" if gemm_tc::applies(g, op) => gemm_tc::conv(&mut l, op),
        "conv" => gemm::conv(&mut l, op),
        "pool" => pool::pool(&mut l, op),
        "depthwise_pointwise" => depthwise::depthwise_pointwise(&mut l, op),
        "contraction_chain" => chain::chain(&mut l, op),
        "attention" => attention::attention(&mut l, op),
        other => Err(l.unsupported(format!("group kind `{other}`"))),
    }
}

/// Whether group `op` holds a matmul of integers.
fn integer_matmul(g: &Graph, op: OpId) -> bool {
    let region = g.op(op).region.expect("a fused op has a region");
    g.block(region)
        .ops
        .iter()
        .any(|&o| g.op(o).kind == OpKind::Matmul && g.ty(g.op(o).results[0]).dtype.is_int())
}

/// The yielded values of a group, in result order.
fn yields(g: &Graph, op: OpId) -> Vec<ValueId> {
    let region = g.op(op).region.expect("a fused op has a region");
    g.block(region)
        .ops
        .last()
        .map(|&y| g.op(y).operands.clone())
        .unwrap_or_default()
}

fn store(l: &mut Lower, param: &Param, dtype: DType, index: Expr, value: Expr) {
    let value = l.narrow(dtype, value);
    l.body.push(Stmt::Store(
        ArrayRef {
            name: param.name.clone(),
            ty: param.ty,
            reinterpret: false,
        },
        index,
        value,
    ));
}

fn global_thread() -> Expr {
    add(
        mul(
            Expr::Builtin(Builtin::BlockX),
            Expr::Builtin(Builtin::BlockDimX),
        ),
        Expr::Builtin(Builtin::ThreadX),
    )
}

fn grid_stride() -> Expr {
    mul(
        Expr::Builtin(Builtin::BlockDimX),
        Expr::Builtin(Builtin::GridDimX),
    )
}

/// A vectorized grid-stride loop over the output elements; results of
/// different shapes get a scalar loop each.
fn elementwise(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    let params = params(l, op);
    let results = g.op(op).results.clone();
    let out_dims = g.ty(results[0]).dims().to_vec();
    let n = g.ty(results[0]).num_elements().unwrap_or(0);
    let largest = results
        .iter()
        .map(|&r| g.ty(r).num_elements().unwrap_or(usize::MAX))
        .max()
        .unwrap_or(0);
    if largest >= i32::MAX as usize {
        return Err(l.unsupported(Reason::TooLarge));
    }
    let threads = attr_int(g, op, "threads", 256).clamp(32, 1024) as usize;
    let items = attr_int(g, op, "items", 1).clamp(1, 64) as usize;
    if results
        .iter()
        .any(|&r| g.ty(r).dims() != out_dims.as_slice())
    {
        return elementwise_shapes(l, op, params, threads, items);
    }
    let vector = attr_int(g, op, "vector", 1) as usize;
    let all_float = params
        .iter()
        .all(|p| p.dtype != "i32" && p.dtype != "i64" && p.dtype != "bool");
    let all_16bit = params
        .iter()
        .all(|p| matches!(p.ty, Ty::F16Bits | Ty::Bf16Bits));
    let width = if vector > 1 && all_16bit {
        // Only f16/bf16: 16-byte vectors, as the reduction family does.
        wide_vector(&params, n)
    } else if matches!(vector, 2 | 4) && n.is_multiple_of(vector) && all_float {
        vector
    } else {
        1
    };
    let yields = yields(g, op);
    let outputs: Vec<(Param, DType)> = params
        .iter()
        .filter(|p| p.output)
        .cloned()
        .zip(results.iter().map(|&r| g.ty(r).dtype))
        .collect();
    let count = n / width;
    let body = l.scoped(|l| {
        if width == 1 {
            let idx = Index::linear(&out_dims, var("i"));
            for ((param, dtype), &y) in outputs.iter().zip(&yields) {
                let v = l.value_at(y, &idx)?;
                store(l, param, *dtype, var("i"), v);
            }
            return Ok(());
        }
        l.vector = Some(Vectors {
            step: "i".into(),
            width,
            bases: vec![(int(0), var("i"))],
            aligned: None,
        });
        let mut lanes: Vec<Vec<Expr>> = vec![Vec::new(); outputs.len()];
        for lane in 0..width {
            let linear = add(mul(var("i"), int(width as i64)), int(lane as i64));
            let idx = Index::linear(&out_dims, linear);
            for (k, &y) in yields.iter().enumerate() {
                let v = l.value_at(y, &idx)?;
                let v = l.narrow(outputs[k].1, v);
                lanes[k].push(v);
            }
        }
        for ((param, dtype), lanes) in outputs.iter().zip(lanes) {
            let value = pack(*dtype, lanes);
            l.body.push(Stmt::Store(
                ArrayRef {
                    name: param.name.clone(),
                    ty: vector_ty(*dtype, width),
                    reinterpret: true,
                },
                var("i"),
                value,
            ));
        }
        Ok(())
    })?;
    let per_block = threads * items;
    let grid = count.div_ceil(per_block).max(1);
    let summary = format!(
        "elementwise: {n} elements, {} per thread per step, {items} steps per thread",
        width
    );
    let body = vec![Stmt::For {
        var: "i".into(),
        start: global_thread(),
        end: int(count as i64),
        step: grid_stride(),
        unroll: false,
        body,
    }];
    Ok(l.kernel(op, summary, params, body, [threads, grid]))
}

/// An elementwise group whose results differ in shape: one scalar
/// grid-stride loop per distinct result shape (in result order), each
/// computing its results from the group's inputs.
fn elementwise_shapes(
    l: &mut Lower,
    op: OpId,
    params: Vec<Param>,
    threads: usize,
    items: usize,
) -> Result<Kernel> {
    let g = l.g;
    let outputs: Vec<(Param, ValueId, Vec<usize>)> = params
        .iter()
        .filter(|p| p.output)
        .cloned()
        .zip(yields(g, op))
        .map(|(p, y)| (p, y, g.ty(y).dims().to_vec()))
        .collect();
    let mut shapes: Vec<&[usize]> = Vec::new();
    for (_, _, dims) in &outputs {
        if !shapes.contains(&dims.as_slice()) {
            shapes.push(dims);
        }
    }
    let mut body = Vec::new();
    let mut largest = 1;
    let summary = format!(
        "elementwise: a loop for each result shape ({})",
        shapes
            .iter()
            .map(|d| format!("{d:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for dims in shapes {
        let n: usize = dims.iter().product();
        largest = largest.max(n);
        let stores = l.scoped(|l| {
            let idx = Index::linear(dims, var("i"));
            for (param, y, _) in outputs.iter().filter(|(_, _, d)| d == dims) {
                let v = l.value_at(*y, &idx)?;
                store(l, param, g.ty(*y).dtype, var("i"), v);
            }
            Ok(())
        })?;
        body.push(Stmt::For {
            var: "i".into(),
            start: global_thread(),
            end: int(n as i64),
            step: grid_stride(),
            unroll: false,
            body: stores,
        });
    }
    let grid = largest.div_ceil(threads * items).max(1);
    Ok(l.kernel(op, summary, params, body, [threads, grid]))
}

/// `make_float4(...)` or packed 16-bit words.
fn pack(dtype: DType, lanes: Vec<Expr>) -> Expr {
    if dtype == DType::F32 {
        let f = if lanes.len() == 4 {
            "make_float4"
        } else {
            "make_float2"
        };
        return call(f, lanes);
    }
    let word = |lo: &Expr, hi: &Expr| {
        bin(
            BinOp::BitOr,
            Expr::Cast(Ty::U32, Box::new(lo.clone())),
            bin(
                BinOp::Shl,
                Expr::Cast(Ty::U32, Box::new(hi.clone())),
                int(16),
            ),
        )
    };
    let words: Vec<Expr> = lanes.chunks(2).map(|p| word(&p[0], &p[1])).collect();
    match words.len() {
        1 => words[0].clone(),
        2 => call("make_uint2", words),
        _ => call("make_uint4", words),
    }
}

/// The reduction op of a group and the rows it reduces its input into.
fn find_reduction(l: &Lower, op: OpId) -> Result<(OpId, Rows)> {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    let reductions: Vec<OpId> = g
        .block(region)
        .ops
        .iter()
        .copied()
        .filter(|&o| {
            matches!(
                g.op(o).kind,
                OpKind::Softmax
                    | OpKind::Layernorm
                    | OpKind::ReduceSum
                    | OpKind::ReduceMean
                    | OpKind::ReduceMax
                    | OpKind::ReduceProd
                    | OpKind::GlobalAvgpool
            )
        })
        .collect();
    let [r] = reductions[..] else {
        return Err(l.unsupported(Reason::Count {
            what: "reductions",
            found: reductions.len(),
        }));
    };
    let data = g.op(r);
    let dims = g.ty(data.operands[0]).dims();
    // Empty rows reduce to the identity (a mean of none is NaN, as the
    // interpreter's); no rows, no work.
    let rows = Rows::of(data.kind, &data.attrs, dims)
        .ok_or_else(|| l.unsupported(format!("`{}` as a reduction", data.kind.name())))?;
    Ok((r, rows))
}

/// How a reduction pass combines elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Combine {
    Sum,
    Max,
    Prod,
}

/// What a reduction pass accumulates over elements of `dtype`: a sum, a
/// maximum or a product, in `f32` (floats) or `long long` (integers,
/// wrapping as the interpreter does).
#[derive(Clone, Copy, Debug)]
struct Accumulator {
    combine: Combine,
    dtype: DType,
}

impl Accumulator {
    fn float(combine: Combine) -> Accumulator {
        Accumulator {
            combine,
            dtype: DType::F32,
        }
    }

    /// The accumulator's local type.
    fn ty(self) -> Ty {
        if self.dtype.is_float() {
            Ty::F32
        } else {
            Ty::I64
        }
    }

    /// The identity of the combination (an empty maximum is the dtype's
    /// lowest value, as the interpreter's).
    fn init(self) -> Expr {
        let float = self.ty() == Ty::F32;
        match self.combine {
            Combine::Max if float => Expr::F32(f32::NEG_INFINITY),
            Combine::Max if self.dtype == DType::I32 => int(i64::from(i32::MIN)),
            Combine::Max => int(i64::MIN),
            Combine::Sum if float => Expr::F32(0.0),
            Combine::Sum => int(0),
            Combine::Prod if float => Expr::F32(1.0),
            Combine::Prod => int(1),
        }
    }

    /// `a` combined with `b` (NaN-propagating for a float maximum).
    fn combine(self, l: &mut Lower, a: Expr, b: Expr) -> Expr {
        let ty = self.ty();
        let b = if ty == Ty::F32 {
            b
        } else {
            Expr::Cast(ty, Box::new(b))
        };
        match self.combine {
            Combine::Max if ty == Ty::F32 => {
                l.helpers.insert(Helper::NanMinMax);
                call("dcir_max", vec![a, b])
            }
            Combine::Max => call("max", vec![a, b]),
            Combine::Sum => bin(BinOp::Add, a, b),
            Combine::Prod => bin(BinOp::Mul, a, b),
        }
    }
}

/// The warp-shuffle and shared-memory reduction of `acc` over the threads of a row.
fn block_reduce(l: &mut Lower, acc: &str, how: Accumulator, tpr: usize) -> Vec<Stmt> {
    let mut combine = |a: Expr, b: Expr| how.combine(l, a, b);
    let mut out = Vec::new();
    let mut offset = tpr.min(32) / 2;
    while offset > 0 {
        out.push(Stmt::Assign(
            acc.into(),
            combine(
                var(acc),
                Expr::Shfl(Shuffle::Xor, Box::new(var(acc)), offset as u32),
            ),
        ));
        offset /= 2;
    }
    if tpr > 32 {
        let warps = tpr / 32;
        let name = format!("{acc}_partial");
        let shared = ArrayRef {
            name: name.clone(),
            ty: how.ty(),
            reinterpret: false,
        };
        out.push(Stmt::If(
            bin(BinOp::Eq, rem(var("lane"), 32), int(0)),
            vec![Stmt::Store(
                shared.clone(),
                div(Expr::Builtin(Builtin::ThreadX), 32),
                var(acc),
            )],
        ));
        out.push(Stmt::Barrier);
        let base = mul(var("row_in_block"), int(warps as i64));
        out.push(Stmt::Assign(
            acc.into(),
            Expr::Load(shared.clone(), Box::new(base.clone())),
        ));
        out.push(Stmt::For {
            var: "w".into(),
            start: int(1),
            end: int(warps as i64),
            step: int(1),
            unroll: true,
            body: vec![Stmt::Assign(
                acc.into(),
                combine(var(acc), Expr::Load(shared, Box::new(add(base, var("w"))))),
            )],
        });
        out.push(Stmt::Barrier);
    }
    out
}

/// Row reductions: one row per `threads_per_row` threads, `rows_per_block` rows per block.
fn reduction(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    let params = params(l, op);
    let (r, shape) = find_reduction(l, op)?;
    let (rows, row) = (shape.rows, shape.len);
    let tpr = attr_int(g, op, "threads_per_row", 256).clamp(1, 1024) as usize;
    let rpb = attr_int(g, op, "rows_per_block", 1).clamp(1, 1024) as usize;
    if !tpr.is_power_of_two() || tpr * rpb > 1024 || (tpr < 32 && 32 % tpr != 0) {
        return Err(l.unsupported(Reason::Parameters(format!(
            "threads_per_row = {tpr} with rows_per_block = {rpb}"
        ))));
    }
    if rows * row >= i32::MAX as usize {
        return Err(l.unsupported(Reason::TooLarge));
    }
    let rkind = g.op(r).kind;
    let x = g.op(r).operands[0];
    let rv = g.op(r).results[0];
    let per_row_out = !matches!(rkind, OpKind::Softmax | OpKind::Layernorm);
    let results = g.op(op).results.clone();
    let yields = yields(g, op);
    let outputs: Vec<(Param, DType, ValueId, bool)> = params
        .iter()
        .filter(|p| p.output)
        .cloned()
        .zip(&results)
        .zip(&yields)
        .map(|((p, &res), &y)| {
            let n = g.ty(res).num_elements().unwrap_or(0);
            // With one element per row, every result is stored per row
            // (after the reduction), so it may read the reduced value.
            (p, g.ty(res).dtype, y, n == rows && per_row_out)
        })
        .collect();
    for (_, _, y, per_row) in &outputs {
        let n = g.ty(*y).num_elements().unwrap_or(0);
        if !per_row && n != rows * row {
            return Err(l.unsupported("a result that is neither per row nor per element"));
        }
    }
    let x_dims = g.ty(x).dims().to_vec();
    // Rows that are not contiguous are read through their coordinates,
    // one element at a time.
    let order = (!shape.contiguous(&x_dims)).then(|| shape.order());
    let width = if order.is_none() && attr_int(g, op, "vector", 1) > 1 {
        let width = wide_vector(&params, row);
        let keep = |y: ValueId| views_keep_vectors(g, y, width);
        if outputs.iter().all(|&(_, _, y, per_row)| per_row || keep(y)) {
            width
        } else {
            1
        }
    } else {
        1
    };
    let plan = RowPlan {
        row,
        tpr,
        x,
        cache: row_cache(l, op, rkind, width, row, tpr, rpb),
        x_dims,
        order,
    };

    let mut body = vec![
        Stmt::Let {
            name: "lane".into(),
            ty: Ty::I32,
            value: rem(Expr::Builtin(Builtin::ThreadX), tpr as i64),
            constant: true,
        },
        Stmt::Let {
            name: "row_in_block".into(),
            ty: Ty::I32,
            value: div(Expr::Builtin(Builtin::ThreadX), tpr as i64),
            constant: true,
        },
        Stmt::Let {
            name: "row".into(),
            ty: Ty::I32,
            value: add(
                mul(Expr::Builtin(Builtin::BlockX), int(rpb as i64)),
                var("row_in_block"),
            ),
            constant: true,
        },
        Stmt::Let {
            name: "active".into(),
            ty: Ty::Bool,
            value: bin(BinOp::Lt, var("row"), int(rows as i64)),
            constant: true,
        },
    ];
    for n in [
        "lane",
        "row_in_block",
        "row",
        "active",
        "c",
        "w",
        "k",
        "j",
        "v",
        "row_cache",
    ] {
        l.used_names.insert(n.into());
    }
    let mut shared = Vec::new();
    match plan.cache {
        RowCache::Registers { width, steps } => body.push(Stmt::LocalArray {
            name: "v".into(),
            ty: Ty::F32,
            len: width * steps,
        }),
        RowCache::Shared => shared.push(SharedArray {
            name: "row_cache".into(),
            ty: Ty::F32,
            len: rpb * row,
        }),
        RowCache::Reread => {}
    }
    // One pass over the row accumulating `acc` from `term(x)`; per-element
    // outputs are stored in the same loop when `store_elements`. The first
    // pass reads the row from memory (and caches it), later ones the cache.
    let mut first = true;
    let mut pass = |l: &mut Lower,
                    body: &mut Vec<Stmt>,
                    acc: &str,
                    how: Accumulator,
                    term: &dyn Fn(&mut Lower, Expr) -> Expr,
                    store_elements: bool|
     -> Result<()> {
        body.push(Stmt::Let {
            name: acc.into(),
            ty: how.ty(),
            value: how.init(),
            constant: false,
        });
        l.used_names.insert(acc.into());
        let mut each = |l: &mut Lower, xs: &[Expr], idxs: &[Index]| -> Result<()> {
            for xv in xs {
                let t = term(l, xv.clone());
                let combined = how.combine(l, var(acc), t);
                l.body.push(Stmt::Assign(acc.into(), combined));
            }
            if store_elements {
                store_per_element(l, &outputs, &idxs[0])?;
            }
            Ok(())
        };
        body.push(plan.pass(l, first, &mut each)?);
        first = false;
        body.extend(block_reduce(l, acc, how, tpr));
        Ok(())
    };
    let warps_total = (tpr * rpb) / 32;
    let mut add_shared = |name: &str, ty: Ty| {
        if tpr > 32 {
            shared.push(SharedArray {
                name: format!("{name}_partial"),
                ty,
                len: warps_total,
            });
        }
    };
    let identity = |_: &mut Lower, x: Expr| x;
    let how = match rkind {
        OpKind::Softmax => {
            pass(
                l,
                &mut body,
                "row_max",
                Accumulator::float(Combine::Max),
                &identity,
                false,
            )?;
            add_shared("row_max", Ty::F32);
            let sub_exp =
                |_: &mut Lower, x: Expr| call("expf", vec![bin(BinOp::Sub, x, var("row_max"))]);
            pass(
                l,
                &mut body,
                "row_sum",
                Accumulator::float(Combine::Sum),
                &sub_exp,
                false,
            )?;
            add_shared("row_sum", Ty::F32);
            Reduced::Softmax {
                max: var("row_max"),
                sum: var("row_sum"),
            }
        }
        OpKind::Layernorm => {
            let eps = g
                .op(r)
                .attrs
                .get("epsilon")
                .and_then(Attr::as_float)
                .unwrap_or(1e-5);
            pass(
                l,
                &mut body,
                "row_sum",
                Accumulator::float(Combine::Sum),
                &identity,
                false,
            )?;
            add_shared("row_sum", Ty::F32);
            body.push(Stmt::Let {
                name: "mean".into(),
                ty: Ty::F32,
                value: bin(BinOp::Div, var("row_sum"), Expr::F32(row as f32)),
                constant: true,
            });
            l.used_names.insert("mean".into());
            let centered = |_: &mut Lower, x: Expr| {
                let d = bin(BinOp::Sub, x, var("mean"));
                bin(BinOp::Mul, d.clone(), d)
            };
            pass(
                l,
                &mut body,
                "row_sq",
                Accumulator::float(Combine::Sum),
                &centered,
                false,
            )?;
            add_shared("row_sq", Ty::F32);
            body.push(Stmt::Let {
                name: "rstd".into(),
                ty: Ty::F32,
                value: call(
                    "rsqrtf",
                    vec![bin(
                        BinOp::Add,
                        bin(BinOp::Div, var("row_sq"), Expr::F32(row as f32)),
                        Expr::F32(eps as f32),
                    )],
                ),
                constant: true,
            });
            l.used_names.insert("rstd".into());
            Reduced::Layernorm {
                mean: var("mean"),
                rstd: var("rstd"),
            }
        }
        _ => {
            let how = Accumulator {
                combine: match rkind {
                    OpKind::ReduceMax => Combine::Max,
                    OpKind::ReduceProd => Combine::Prod,
                    _ => Combine::Sum,
                },
                dtype: g.ty(x).dtype,
            };
            pass(l, &mut body, "row_acc", how, &identity, true)?;
            add_shared("row_acc", how.ty());
            let value = match rkind {
                OpKind::ReduceMean | OpKind::GlobalAvgpool => {
                    bin(BinOp::Div, var("row_acc"), Expr::F32(row as f32))
                }
                _ => var("row_acc"),
            };
            body.push(Stmt::Let {
                name: "result".into(),
                ty: how.ty(),
                value,
                constant: true,
            });
            l.used_names.insert("result".into());
            Reduced::Row(var("result"))
        }
    };
    l.reduced = Some((rv, how, row));
    check_epilogue(l, op, rv)?;
    if per_row_out {
        let rdims = g.ty(rv).dims().to_vec();
        let stores = l.scoped(|l| {
            let idx = Index::linear(&rdims, var("row"));
            for (p, dtype, y, per_row) in &outputs {
                if *per_row {
                    let v = l.value_at(*y, &idx)?;
                    store(l, p, *dtype, var("row"), v);
                }
            }
            Ok(())
        })?;
        body.push(Stmt::If(
            bin(
                BinOp::And,
                var("active"),
                bin(BinOp::Eq, var("lane"), int(0)),
            ),
            stores,
        ));
    } else {
        let mut each = |l: &mut Lower, _: &[Expr], idxs: &[Index]| -> Result<()> {
            let [idx] = idxs else {
                return store_vectors(l, &plan, &outputs, idxs);
            };
            store_per_element(l, &outputs, idx)
        };
        body.push(plan.pass(l, false, &mut each)?);
    }
    let summary = format!(
        "reduction ({}): {rows} rows of {row}, {tpr} threads per row, {rpb} rows per block, {}",
        rkind.name(),
        match plan.cache {
            RowCache::Registers { width, steps } => format!(
                "row in registers ({} per thread, {width} per access)",
                width * steps
            ),
            RowCache::Shared => "row in shared memory".into(),
            RowCache::Reread => "row read on every pass".into(),
        }
    );
    Ok(Kernel {
        shared,
        // A register-cached row holds `width · steps` values per thread for
        // the whole kernel; promise ptxas the blocks that leaves room for
        // (it otherwise aimed at 32 resident 64-thread blocks and spilled).
        min_blocks_per_sm: match plan.cache {
            RowCache::Registers { width, steps } => {
                (65536 / ((tpr * rpb) * (width * steps + 64))).clamp(1, 32) as u32
            }
            RowCache::Shared | RowCache::Reread => 0,
        },
        ..l.kernel(
            op,
            summary,
            params,
            body,
            [tpr * rpb, rows.div_ceil(rpb).max(1)],
        )
    })
}

/// Most row values one thread keeps in registers (the cost model's limit).
const MAX_REGISTER_ROW: usize = 64;
/// Most bytes of static shared memory a kernel may declare.
const MAX_STATIC_SHARED: usize = 48 * 1024;

/// Where a multi-pass reduction keeps its row between passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowCache {
    /// `float v[width * steps]` per thread: step `k` holds the `width`
    /// consecutive elements at `(lane + k * threads_per_row) * width`.
    Registers { width: usize, steps: usize },
    /// `row_cache[rows_per_block * row]` in shared memory.
    Shared,
    /// Nowhere: every pass reads (and recomputes) the row from memory.
    Reread,
}

/// The honoured `row_cache` of a reduction group: the planned one when the
/// reduction makes several passes and the row fits, else `Reread`. A
/// register-cached row is read `width` elements at a time.
fn row_cache(
    l: &Lower,
    op: OpId,
    rkind: OpKind,
    width: usize,
    row: usize,
    tpr: usize,
    rpb: usize,
) -> RowCache {
    let g = l.g;
    if !matches!(rkind, OpKind::Softmax | OpKind::Layernorm) || row == 0 {
        return RowCache::Reread;
    }
    let planned = g.op(op).attrs.get("row_cache").and_then(Attr::as_str);
    match planned {
        Some("registers") => {
            let steps = (row / width).div_ceil(tpr);
            if width * steps <= MAX_REGISTER_ROW {
                RowCache::Registers { width, steps }
            } else {
                RowCache::Reread
            }
        }
        Some("shared") if (rpb * row + 32 * 3) * 4 <= MAX_STATIC_SHARED => RowCache::Shared,
        _ => RowCache::Reread,
    }
}

/// What a reduction pass does with the row's values at one step, given their indices.
type Step<'a, 'g> = dyn FnMut(&mut Lower<'g>, &[Expr], &[Index]) -> Result<()> + 'a;

/// How a reduction kernel walks its rows.
struct RowPlan {
    row: usize,
    tpr: usize,
    x: ValueId,
    x_dims: Vec<usize>,
    /// The input's dims in row order ([`Rows::order`]) when rows are not
    /// contiguous; `None` when row `r`'s column `c` is element `r * row + c`.
    order: Option<Vec<usize>>,
    cache: RowCache,
}

impl RowPlan {
    /// The index of column `c` of this thread's row of the reduced input.
    fn elem(&self, c: Expr) -> Index {
        let linear = add(mul(var("row"), int(self.row as i64)), c);
        let Some(order) = &self.order else {
            return Index::linear(&self.x_dims, linear);
        };
        let row_dims: Vec<usize> = order.iter().map(|&d| self.x_dims[d]).collect();
        let row_coords = Index::linear(&row_dims, linear).get_coords();
        let mut coords = vec![int(0); self.x_dims.len()];
        for (&d, c) in order.iter().zip(row_coords) {
            coords[d] = c;
        }
        Index::coords(&self.x_dims, coords)
    }

    /// The vector access of a register pass: `x`-shaped arrays at
    /// `row * (row / width) + j`, row-shaped ones (scale, bias) at `j`.
    fn vectors(&self, width: usize) -> Vectors {
        let per_row = (self.row / width) as i64;
        Vectors {
            step: "j".into(),
            width,
            bases: vec![
                (
                    mul(var("row"), int(self.row as i64)),
                    add(mul(var("row"), int(per_row)), var("j")),
                ),
                (int(0), var("j")),
            ],
            aligned: None,
        }
    }

    /// One loop over this thread's elements of its row, under `if (active)`.
    /// `each` gets the row's values at one step (one, or a vector's width in
    /// registers) with their indices. The `first` pass computes the row from
    /// memory and caches it; the others read the cache (or recompute it when
    /// there is none).
    fn pass<'g>(&self, l: &mut Lower<'g>, first: bool, each: &mut Step<'_, 'g>) -> Result<Stmt> {
        let (loop_var, start, end, step, unroll, inner) = match self.cache {
            RowCache::Registers { width, steps } => {
                let vectors = (self.row / width) as i64;
                let inner = l.scoped(|l| {
                    let guarded = l.scoped(|l| {
                        l.vector = (width > 1).then(|| self.vectors(width));
                        let mut xs = Vec::new();
                        let mut idxs = Vec::new();
                        for lane in 0..width {
                            let lane = int(lane as i64);
                            let idx =
                                self.elem(add(mul(var("j"), int(width as i64)), lane.clone()));
                            let slot = add(mul(var("k"), int(width as i64)), lane);
                            xs.push(self.cached(l, first, "v", slot, &idx)?);
                            idxs.push(idx);
                        }
                        let result = each(l, &xs, &idxs);
                        l.vector = None;
                        result
                    })?;
                    let tail = steps as i64 * self.tpr as i64 != vectors;
                    if tail || guarded.iter().any(|s| s.reads("j")) {
                        l.body.push(Stmt::Let {
                            name: "j".into(),
                            ty: Ty::I32,
                            value: add(var("lane"), mul(var("k"), int(self.tpr as i64))),
                            constant: true,
                        });
                    }
                    if !tail {
                        l.body.extend(guarded);
                    } else {
                        l.body
                            .push(Stmt::If(bin(BinOp::Lt, var("j"), int(vectors)), guarded));
                    }
                    Ok(())
                })?;
                ("k", int(0), int(steps as i64), int(1), true, inner)
            }
            RowCache::Shared | RowCache::Reread => {
                let inner = l.scoped(|l| {
                    let idx = self.elem(var("c"));
                    let slot = add(mul(var("row_in_block"), int(self.row as i64)), var("c"));
                    let xv = if self.cache == RowCache::Shared {
                        self.cached(l, first, "row_cache", slot, &idx)?
                    } else {
                        l.value_at(self.x, &idx)?
                    };
                    each(l, &[xv], &[idx])
                })?;
                let step = int(self.tpr as i64);
                ("c", var("lane"), int(self.row as i64), step, false, inner)
            }
        };
        Ok(Stmt::If(
            var("active"),
            vec![Stmt::For {
                var: loop_var.into(),
                start,
                end,
                step,
                unroll,
                body: inner,
            }],
        ))
    }

    /// The row value at `idx`, cached at `array[slot]`: computed and stored
    /// there on the first pass, read back (and memoized for the epilogue) after.
    fn cached(
        &self,
        l: &mut Lower,
        first: bool,
        array: &str,
        slot: Expr,
        idx: &Index,
    ) -> Result<Expr> {
        let cache = ArrayRef {
            name: array.into(),
            ty: Ty::F32,
            reinterpret: false,
        };
        if first {
            let xv = l.value_at(self.x, idx)?;
            l.body.push(Stmt::Store(cache, slot, xv.clone()));
            return Ok(xv);
        }
        let xv = Expr::Load(cache, Box::new(slot));
        l.memo
            .insert((self.x, print_expr(&idx.get_linear())), xv.clone());
        Ok(xv)
    }
}

/// The per-element outputs of one register step: the lanes of `idxs`
/// narrowed and packed into one vector store each.
fn store_vectors(
    l: &mut Lower,
    plan: &RowPlan,
    outputs: &[(Param, DType, ValueId, bool)],
    idxs: &[Index],
) -> Result<()> {
    let width = idxs.len();
    let row_major = plan.vectors(width).bases[0].1.clone();
    for (p, dtype, y, _) in outputs {
        let mut lanes = Vec::new();
        for idx in idxs {
            let v = viewed_value(l, *y, idx)?;
            lanes.push(l.narrow(*dtype, v));
        }
        // Through views the vector starts where the first lane lands
        // (`views_keep_vectors`: a multiple of `width`).
        let index = if is_view(l.g, *y) {
            div(result_index(l.g, *y, &idxs[0]).get_linear(), width as i64)
        } else {
            row_major.clone()
        };
        l.body.push(Stmt::Store(
            ArrayRef {
                name: p.name.clone(),
                ty: vector_ty(*dtype, width),
                reinterpret: true,
            },
            index.clone(),
            pack(*dtype, lanes),
        ));
    }
    Ok(())
}

fn store_per_element(
    l: &mut Lower,
    outputs: &[(Param, DType, ValueId, bool)],
    idx: &Index,
) -> Result<()> {
    for (p, dtype, y, per_row) in outputs {
        if !per_row {
            let v = viewed_value(l, *y, idx)?;
            store(l, p, *dtype, result_index(l.g, *y, idx).get_linear(), v);
        }
    }
    Ok(())
}

/// The value of the per-element result `y` at the reduced input's element
/// `idx`: the value its views start from, at `idx` in the input's linear
/// order (so the row's cached and computed values are reused).
fn viewed_value(l: &mut Lower, y: ValueId, idx: &Index) -> Result<Expr> {
    let mut v = y;
    while let ValueDef::OpResult { op, .. } = l.g.value(v).def {
        let d = l.g.op(op);
        if !matches!(d.kind, OpKind::Reshape | OpKind::Transpose) {
            break;
        }
        v = d.operands[0];
    }
    let dims = l.g.ty(v).dims().to_vec();
    if dims == idx.dims {
        l.value_at(v, idx)
    } else {
        l.value_at(v, &Index::linear(&dims, idx.get_linear()))
    }
}

/// Whether `v` is a reshape or transpose result.
fn is_view(g: &Graph, v: ValueId) -> bool {
    matches!(
        g.value(v).def,
        ValueDef::OpResult { op, .. } if matches!(g.op(op).kind, OpKind::Reshape | OpKind::Transpose)
    )
}

/// The index of the per-element result `y` whose element derives from the
/// reduced input's element at `idx`: forward through the reshapes and
/// transposes between `y` and the value they view, which is in the input's
/// linear order.
fn result_index(g: &Graph, y: ValueId, idx: &Index) -> Index {
    let dims = g.ty(y).dims().to_vec();
    let ValueDef::OpResult { op, .. } = g.value(y).def else {
        return Index::linear(&dims, idx.get_linear());
    };
    let d = g.op(op);
    match (d.kind, d.attrs.ints("perm")) {
        (OpKind::Reshape, _) => {
            Index::linear(&dims, result_index(g, d.operands[0], idx).get_linear())
        }
        (OpKind::Transpose, Some(perm)) => {
            let c = result_index(g, d.operands[0], idx).get_coords();
            Index::coords(&dims, perm.iter().map(|&p| c[p as usize].clone()).collect())
        }
        _ if dims == idx.dims => idx.clone(),
        _ => Index::linear(&dims, idx.get_linear()),
    }
}

/// Whether `width` consecutive elements of a row, starting at a multiple of
/// `width`, stay consecutive and aligned in `y`: every transpose on the way
/// keeps the innermost axis innermost, and every value on the way (the first
/// non-view included) has an innermost extent that `width` divides.
fn views_keep_vectors(g: &Graph, y: ValueId, width: usize) -> bool {
    let innermost = g.ty(y).dims().last().copied().unwrap_or(1);
    if !innermost.is_multiple_of(width) {
        return false;
    }
    let ValueDef::OpResult { op, .. } = g.value(y).def else {
        return true;
    };
    let d = g.op(op);
    match d.kind {
        OpKind::Reshape => views_keep_vectors(g, d.operands[0], width),
        OpKind::Transpose => {
            let perm = d.attrs.ints("perm").unwrap_or_default();
            perm.last().is_some_and(|&p| p as usize + 1 == perm.len())
                && views_keep_vectors(g, d.operands[0], width)
        }
        _ => true,
    }
}

/// Everything computed from the reduction's result must keep to its row:
/// elementwise math, casts and reshapes, and transposes on the way to a
/// result (no math after them: [`result_index`] follows views forward only).
fn check_epilogue(l: &Lower, op: OpId, rv: ValueId) -> Result<()> {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    let mut tainted: BTreeSet<ValueId> = BTreeSet::from([rv]);
    // Tainted values a transpose reordered (and their reshapes).
    let mut reordered: BTreeSet<ValueId> = BTreeSet::new();
    for &o in &g.block(region).ops {
        let data = g.op(o);
        if data.kind == OpKind::Yield || !data.operands.iter().any(|v| tainted.contains(v)) {
            continue;
        }
        let view = matches!(data.kind, OpKind::Reshape | OpKind::Transpose);
        let place = if !view && data.operands.iter().any(|v| reordered.contains(v)) {
            "after a transpose of the reduction's result (only views)"
        } else if !view && !data.kind.is_elementwise() && data.kind != OpKind::Cast {
            "after the reduction (only elementwise epilogues and views)"
        } else {
            ""
        };
        if !place.is_empty() {
            return Err(l.unsupported(Reason::Op {
                op: data.kind,
                place: place.into(),
            }));
        }
        if data.kind == OpKind::Transpose
            || (view && data.operands.iter().any(|v| reordered.contains(v)))
        {
            reordered.extend(data.results.iter().copied());
        }
        tainted.extend(data.results.iter().copied());
    }
    Ok(())
}

/// Lowers every `fused` op of `g` that is a kernel (a library call is not:
/// [`crate::library`]), in body order.
pub fn lower_graph(g: &Graph) -> Result<Vec<Kernel>> {
    g.block(g.body())
        .ops
        .iter()
        .filter(|&&o| g.op(o).kind == OpKind::Fused && library_of(g, o).is_none())
        .map(|&o| lower_fused(g, o))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Index;
    use crate::emit_module_source;
    use crate::kir::{Expr, var};

    fn printed(e: &Expr) -> String {
        crate::print::expr(e)
    }

    #[test]
    fn coordinates_of_a_decomposed_prefix_are_put_back_together() {
        // NHWC coordinates of pixel `row` and channel `col`: (row·512 + col),
        // not a division and a remainder per dim.
        let pixels = Index::linear(&[32, 28, 28], var("row")).get_coords();
        let mut coords = pixels.clone();
        coords.push(var("col"));
        let nhwc = Index::coords(&[32, 28, 28, 512], coords);
        assert_eq!(printed(&nhwc.get_linear()), "row * 512 + col");
        // All of them: the linear index itself.
        assert_eq!(
            printed(&Index::coords(&[32, 28, 28], pixels).get_linear()),
            "row"
        );
        // Coordinates that are a decomposition modulo their dims' size (a
        // prefix of a larger index, a broadcast from a leading 1) are not
        // the linear index: here pixel `l` of every channel `l / 49`.
        let nchw = Index::linear(&[1, 2048, 7, 7], var("l")).get_coords();
        assert_eq!(printed(&nchw[1]), "l / 49");
        let nhwc = Index::coords(
            &[1, 7, 7, 2048],
            vec![
                nchw[0].clone(),
                nchw[2].clone(),
                nchw[3].clone(),
                nchw[1].clone(),
            ],
        );
        assert_eq!(
            printed(&nhwc.get_linear()),
            "l / 7 % 7 * 14336 + l % 7 * 2048 + l / 49"
        );
        let per_image = Index::linear(&[32, 7, 7], var("l")).get_coords();
        let broadcast = Index::coords(
            &[1, 7, 7],
            vec![
                crate::kir::int(0),
                per_image[1].clone(),
                per_image[2].clone(),
            ],
        );
        assert_eq!(printed(&broadcast.get_linear()), "l / 7 % 7 * 7 + l % 7");
        // None: the strides' sum.
        let plain = Index::coords(&[4, 8], vec![var("r"), var("c")]);
        assert_eq!(printed(&plain.get_linear()), "r * 8 + c");
    }

    #[test]
    fn a_reshape_keeps_the_trailing_coordinates_it_does_not_change() {
        let rows = Index::coords(&[100352, 256], vec![var("row"), var("col")]);
        let nhwc = rows.reshaped(&[32, 56, 56, 256]);
        assert_eq!(printed(&nhwc.get_linear()), "row * 256 + col");
        assert_eq!(printed(&nhwc.get_coords()[3]), "col");
        assert_eq!(printed(&nhwc.get_coords()[0]), "row / 3136");
        // Nothing shared: the linear index, decomposed.
        let flat = rows.reshaped(&[25690112]);
        assert_eq!(printed(&flat.get_coords()[0]), "row * 256 + col");
        // A dim split: only its own coordinate divided.
        let split = rows.reshaped(&[100352, 16, 16]);
        assert_eq!(printed(&split.get_coords()[1]), "col / 16");
        assert_eq!(printed(&split.get_coords()[2]), "col % 16");
    }

    #[test]
    fn a_reshape_and_its_inverse_through_a_transpose_give_back_the_coordinates() {
        // ViT's QKV projection: [6304, 2304] rows of 32 images × 197 tokens,
        // columns 3 × 768, stored as [3, 6304, 768]; read back, the bias's
        // column is the column, not a chain of divisions of the linear index.
        let acc = Index::coords(&[6304, 2304], vec![var("row"), var("col")]);
        let tokens = acc.reshaped(&[197, 32, 3, 768]);
        let c = tokens.get_coords();
        let moved = Index::coords(
            &[3, 197, 32, 768],
            vec![c[2].clone(), c[0].clone(), c[1].clone(), c[3].clone()],
        );
        let out = moved.reshaped(&[3, 6304, 768]);
        assert_eq!(
            printed(&out.get_linear()),
            "col / 768 * 4841472 + row * 768 + col % 768"
        );
        let back = out.reshaped(&[3, 197, 32, 768]).get_coords();
        let unmoved = Index::coords(
            &[197, 32, 3, 768],
            vec![
                back[1].clone(),
                back[2].clone(),
                back[0].clone(),
                back[3].clone(),
            ],
        );
        let rows = unmoved.reshaped(&[6304, 2304]).get_coords();
        assert_eq!(printed(&rows[0]), "row");
        assert_eq!(printed(&rows[1]), "col");
    }

    /// `e`, an index expression, evaluated with `vars` bound.
    fn eval(e: &Expr, vars: &[(String, i64)]) -> i64 {
        use crate::kir::BinOp;
        match e {
            Expr::Int(v) => *v,
            Expr::Var(n) => {
                vars.iter()
                    .find(|(m, _)| m == n)
                    .expect("a bound variable")
                    .1
            }
            Expr::Bin(op, a, b) => {
                let (a, b) = (eval(a, vars), eval(b, vars));
                match op {
                    BinOp::Add => a + b,
                    BinOp::Sub => a - b,
                    BinOp::Mul => a * b,
                    BinOp::Div => a / b,
                    BinOp::Rem => a % b,
                    other => panic!("{other:?} in an index"),
                }
            }
            other => panic!("not an index expression: {other:?}"),
        }
    }

    /// The row-major coordinates of element `linear` of `dims`.
    fn row_major(dims: &[usize], linear: i64) -> Vec<i64> {
        let mut rest = linear;
        let mut coords = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            coords[d] = rest % dims[d] as i64;
            rest /= dims[d] as i64;
        }
        coords
    }

    proptest::proptest! {
        #![proptest_config(dcir_testgen::proptest_config())]

        /// Any reshape, from coordinates or a linear index, names the same
        /// element: its linear index and row-major coordinates, there and
        /// back again.
        #[test]
        fn a_reshape_names_the_same_element(
            old in proptest::collection::vec(1usize..7, 1..5),
            picks in proptest::collection::vec(0usize..64, 0..6),
            element in 0u64..u64::MAX,
        ) {
            let total: usize = old.iter().product();
            // New dims: divisors of what is left, picked by `picks` (a 1 now and then).
            let mut new = Vec::new();
            let mut rest = total;
            for &p in &picks {
                let divisors: Vec<usize> = (1..=rest).filter(|&d| rest.is_multiple_of(d)).collect();
                let d = divisors[p % divisors.len()];
                new.push(d);
                rest /= d;
            }
            new.push(rest);
            let linear = (element % total as u64) as i64;
            let coords = row_major(&old, linear);
            let vars: Vec<(String, i64)> = coords
                .iter()
                .enumerate()
                .map(|(i, &c)| (format!("c{i}"), c))
                .chain(std::iter::once(("l".to_string(), linear)))
                .collect();
            let at = Index::coords(&old, (0..old.len()).map(|i| var(format!("c{i}"))).collect());
            let there = at.reshaped(&new);
            proptest::prop_assert_eq!(eval(&there.get_linear(), &vars), linear);
            let got: Vec<i64> = there.get_coords().iter().map(|e| eval(e, &vars)).collect();
            proptest::prop_assert_eq!(&got, &row_major(&new, linear));
            let back: Vec<i64> = there.reshaped(&old).get_coords().iter().map(|e| eval(e, &vars)).collect();
            proptest::prop_assert_eq!(&back, &coords);
            let from_linear = Index::linear(&old, var("l")).reshaped(&new);
            let got: Vec<i64> = from_linear.get_coords().iter().map(|e| eval(e, &vars)).collect();
            proptest::prop_assert_eq!(&got, &row_major(&new, linear));
        }
    }

    #[test]
    fn reshape_groups_pair_the_runs_of_equal_size() {
        let g = |a: &[usize], b: &[usize]| super::reshape_groups(a, b);
        assert_eq!(
            g(&[6304, 2304], &[197, 32, 3, 768]),
            Some(vec![(0..1, 0..2), (1..2, 2..4)])
        );
        assert_eq!(g(&[1, 6304], &[6304]), Some(vec![(0..2, 0..1)]));
        assert_eq!(
            g(&[6304], &[6304, 1]),
            Some(vec![(0..1, 0..1), (1..1, 1..2)])
        );
        assert_eq!(g(&[6, 4], &[4, 6]), Some(vec![(0..2, 0..2)]));
        assert_eq!(g(&[6, 4], &[5, 5]), None);
        assert_eq!(g(&[0, 4], &[4, 0]), None);
    }

    /// The CUDA source of `a op b` as one elementwise group of `dtype[dims]`.
    fn eltwise(dtype: &str, out: &str, dims: &str, vector: u32) -> String {
        let t = format!("{dtype}[{dims}]");
        let o = format!("{out}[{dims}]");
        let src = format!(
            "graph @g(%x: {t}, %y: {t}) -> ({o}) {{\n\
             \x20 %z = fused @g0(%x.in = %x, %y.in = %y) {{items = 1, kind = \"elementwise\", level = \"register\", threads = 256, vector = {vector}}} : {o} {{\n\
             \x20   %a = add %x.in, %y.in : {t}\n\
             \x20   %z.r = cast %a : {o}\n\
             \x20   yield %z.r\n\
             \x20 }}\n\
             \x20 return %z\n\
             }}\n"
        );
        let module = dcir_reader::parse_module(&src).expect("parses");
        emit_module_source(&module).expect("lowers")
    }

    #[test]
    fn half_elementwise_uses_16_byte_vectors() {
        for dtype in ["f16", "bf16"] {
            // 8 | n: uint4 whatever the planned width.
            for vector in [2, 4] {
                let s = eltwise(dtype, dtype, "4,784", vector);
                assert!(s.contains("uint4"), "{dtype} vector={vector}:\n{s}");
                assert!(s.contains("8 per thread per step"), "{s}");
            }
            // 4 | n, 8 ∤ n: uint2; 2 | n only: one 32-bit word; odd: scalar.
            assert!(eltwise(dtype, dtype, "3,4", 4).contains("4 per thread per step"));
            assert!(eltwise(dtype, dtype, "3,2", 4).contains("2 per thread per step"));
            assert!(eltwise(dtype, dtype, "3,17", 4).contains("1 per thread per step"));
            // Not asked for: scalar.
            assert!(eltwise(dtype, dtype, "4,784", 1).contains("1 per thread per step"));
        }
    }

    #[test]
    fn f32_and_mixed_elementwise_keep_the_planned_width() {
        let s = eltwise("f32", "f32", "4,784", 2);
        assert!(
            s.contains("2 per thread per step") && s.contains("float2"),
            "{s}"
        );
        let s = eltwise("f32", "f32", "4,784", 4);
        assert!(
            s.contains("4 per thread per step") && s.contains("float4"),
            "{s}"
        );
        let s = eltwise("f32", "f32", "3,2", 4);
        assert!(s.contains("1 per thread per step"), "{s}");
        // f16 in, f32 out: the planned width, not 16 bytes.
        let s = eltwise("f16", "f32", "4,784", 4);
        assert!(s.contains("4 per thread per step"), "{s}");
        assert!(!s.contains("uint4"), "{s}");
    }
}
