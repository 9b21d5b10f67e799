//! The type and shape rule of every op.
//!
//! [`infer_types`] computes result types for ops whose results are inferred;
//! [`check_types`] checks written result types against the rule, for every
//! op but the structural ones (`fused`, `return`, `yield`), whose types the
//! verifier checks against the region or graph signature. Both check the
//! attributes' values (ranges, lengths, permutations) as part of the rule.
//! Axes and dims in attributes are non-negative; importers normalize.

use crate::attr::{Attr, Attrs};
use crate::op::{OpKind, ResultTypes};
use crate::types::{DType, TensorType};

/// A type-rule violation, as a message for the user.
pub type TypeError = String;

/// Result types of an op whose results are inferred.
pub fn infer_types(
    kind: OpKind,
    attrs: &Attrs,
    operands: &[&TensorType],
) -> Result<Vec<TensorType>, TypeError> {
    if kind.info().result_types == ResultTypes::Declared {
        return Err(format!(
            "the result type of `{}` is declared, not inferred",
            kind.name()
        ));
    }
    if !kind.info().operands.accepts(operands.len()) {
        return Err(format!(
            "`{}` takes {} operands, found {}",
            kind.name(),
            kind.info().operands.describe(),
            operands.len()
        ));
    }
    infer(kind, attrs, operands)
}

/// Checks the written result types of an op against its rule.
pub fn check_types(
    kind: OpKind,
    attrs: &Attrs,
    operands: &[&TensorType],
    results: &[&TensorType],
) -> Result<(), TypeError> {
    use OpKind::*;
    let info = kind.info();
    if !info.operands.accepts(operands.len()) || !info.results.accepts(results.len()) {
        return Err(format!(
            "`{}` takes {} operands and has {} results, found {} and {}",
            kind.name(),
            info.operands.describe(),
            info.results.describe(),
            operands.len(),
            results.len()
        ));
    }
    match kind {
        Fused | Return | Yield => Ok(()),
        Broadcast => check_broadcast(attrs, operands[0], results[0]),
        Reshape => {
            same_dtype(operands[0], results[0], "reshape")?;
            if operands[0].num_elements() != results[0].num_elements() {
                return Err(format!(
                    "reshape must keep the element count: {} has {} elements, {} has {}",
                    operands[0],
                    show_count(operands[0]),
                    results[0],
                    show_count(results[0])
                ));
            }
            Ok(())
        }
        Cast => {
            if operands[0].shape != results[0].shape {
                return Err(format!(
                    "cast keeps the shape: {} to {}",
                    operands[0], results[0]
                ));
            }
            Ok(())
        }
        Constant => check_constant(attrs, results[0]),
        _ => {
            let inferred = infer(kind, attrs, operands)?;
            if inferred.iter().ne(results.iter().copied()) {
                return Err(format!(
                    "`{}` produces {}, but the written type is {}",
                    kind.name(),
                    join(inferred.iter()),
                    join(results.iter().copied())
                ));
            }
            Ok(())
        }
    }
}

fn show_count(t: &TensorType) -> String {
    t.num_elements()
        .map_or("too many".to_string(), |n| n.to_string())
}

fn join<'a>(types: impl Iterator<Item = &'a TensorType>) -> String {
    types.map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

fn same_dtype(a: &TensorType, b: &TensorType, what: &str) -> Result<(), TypeError> {
    if a.dtype != b.dtype {
        return Err(format!(
            "{what} keeps the dtype: {} to {}",
            a.dtype, b.dtype
        ));
    }
    Ok(())
}

fn need_float(t: &TensorType, op: OpKind) -> Result<(), TypeError> {
    if !t.dtype.is_float() {
        return Err(format!(
            "`{}` needs a float operand, found {}",
            op.name(),
            t
        ));
    }
    Ok(())
}

fn need_numeric(t: &TensorType, op: OpKind) -> Result<(), TypeError> {
    if t.dtype == DType::Bool {
        return Err(format!(
            "`{}` needs a numeric operand, found {}",
            op.name(),
            t
        ));
    }
    Ok(())
}

fn need_bool(t: &TensorType, op: OpKind) -> Result<(), TypeError> {
    if t.dtype != DType::Bool {
        return Err(format!("`{}` needs a bool operand, found {}", op.name(), t));
    }
    Ok(())
}

fn same_operands(op: OpKind, a: &TensorType, b: &TensorType) -> Result<(), TypeError> {
    if a != b {
        return Err(format!(
            "`{}` needs operands of one type (broadcast explicitly), found {a} and {b}",
            op.name()
        ));
    }
    Ok(())
}

fn need_rank(t: &TensorType, rank: usize, op: OpKind, what: &str) -> Result<(), TypeError> {
    if t.rank() != rank {
        return Err(format!(
            "`{}` needs {what} of rank {rank}, found {}",
            op.name(),
            t
        ));
    }
    Ok(())
}

/// The list attribute `name` (normalized attrs always have it).
fn ints<'a>(attrs: &'a Attrs, name: &str) -> Result<&'a [i64], TypeError> {
    attrs
        .ints(name)
        .ok_or_else(|| format!("missing list attribute `{name}`"))
}

fn int(attrs: &Attrs, name: &str) -> Result<i64, TypeError> {
    attrs
        .int(name)
        .ok_or_else(|| format!("missing integer attribute `{name}`"))
}

fn list_len(v: &[i64], len: usize, name: &str) -> Result<(), TypeError> {
    if v.len() != len {
        return Err(format!("`{name}` needs {len} entries, found {}", v.len()));
    }
    Ok(())
}

fn all_positive(v: &[i64], name: &str) -> Result<(), TypeError> {
    if let Some(x) = v.iter().find(|&&x| x <= 0) {
        return Err(format!("every entry of `{name}` must be > 0, found {x}"));
    }
    Ok(())
}

fn all_non_negative(v: &[i64], name: &str) -> Result<(), TypeError> {
    if let Some(x) = v.iter().find(|&&x| x < 0) {
        return Err(format!("every entry of `{name}` must be >= 0, found {x}"));
    }
    Ok(())
}

fn axis_in(value: i64, rank: usize, name: &str) -> Result<usize, TypeError> {
    usize::try_from(value)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| format!("`{name}` = {value} is out of range for rank {rank} (0..{rank})"))
}

/// Output extent of a sliding window: floor((in + pads - dil*(k-1) - 1) / stride) + 1.
fn window_out(
    input: usize,
    pad_lo: i64,
    pad_hi: i64,
    kernel: i64,
    stride: i64,
    dilation: i64,
) -> Option<usize> {
    if kernel <= 0 {
        return None;
    }
    let span = dilation.checked_mul(kernel - 1)?.checked_add(1)?;
    let padded = i64::try_from(input)
        .ok()?
        .checked_add(pad_lo)?
        .checked_add(pad_hi)?;
    if padded < span {
        return None;
    }
    usize::try_from((padded - span) / stride + 1).ok()
}

fn infer(kind: OpKind, attrs: &Attrs, ops: &[&TensorType]) -> Result<Vec<TensorType>, TypeError> {
    use OpKind::*;
    let one = |t: TensorType| Ok(vec![t]);
    match kind {
        Add | Sub | Mul | Div | Max | Min | Pow => {
            same_operands(kind, ops[0], ops[1])?;
            need_numeric(ops[0], kind)?;
            one(ops[0].clone())
        }
        Mod => {
            same_operands(kind, ops[0], ops[1])?;
            need_numeric(ops[0], kind)?;
            one(ops[0].clone())
        }
        Equal | Less | LessEqual | Greater | GreaterEqual => {
            same_operands(kind, ops[0], ops[1])?;
            if kind != Equal {
                need_numeric(ops[0], kind)?;
            }
            one(TensorType::new(DType::Bool, ops[0].dims().to_vec()))
        }
        And | Or | Xor => {
            same_operands(kind, ops[0], ops[1])?;
            need_bool(ops[0], kind)?;
            one(ops[0].clone())
        }
        Not => {
            need_bool(ops[0], kind)?;
            one(ops[0].clone())
        }
        Select => {
            need_bool(ops[0], kind)?;
            same_operands(kind, ops[1], ops[2])?;
            if ops[0].dims() != ops[1].dims() {
                return Err(format!(
                    "`select` needs a condition of the operands' shape (broadcast explicitly), found {} and {}",
                    ops[0], ops[1]
                ));
            }
            one(ops[1].clone())
        }
        Relu | Neg | Abs | Sign => {
            need_numeric(ops[0], kind)?;
            one(ops[0].clone())
        }
        Floor | Ceil | Round | Sin | Cos => {
            need_float(ops[0], kind)?;
            one(ops[0].clone())
        }
        IsNan | IsInf => {
            need_float(ops[0], kind)?;
            one(TensorType::new(DType::Bool, ops[0].dims().to_vec()))
        }
        Clip => {
            need_numeric(ops[0], kind)?;
            let (lo, hi) = (
                attrs.float("min").unwrap_or(0.0),
                attrs.float("max").unwrap_or(0.0),
            );
            if lo.is_nan() || hi.is_nan() || lo > hi {
                return Err(format!(
                    "clip needs min <= max, found min = {lo:?}, max = {hi:?}"
                ));
            }
            one(ops[0].clone())
        }
        Gelu => {
            need_float(ops[0], kind)?;
            match attrs.str("approximate") {
                Some("none" | "tanh") => one(ops[0].clone()),
                other => Err(format!(
                    "gelu's `approximate` must be \"none\" or \"tanh\", found {other:?}"
                )),
            }
        }
        Erf | Tanh | Sigmoid | Exp | Log | Sqrt | Rsqrt => {
            need_float(ops[0], kind)?;
            one(ops[0].clone())
        }
        Conv2d => infer_conv2d(attrs, ops[0], ops[1]),
        Matmul => infer_matmul(attrs, ops[0], ops[1]),
        Transpose => {
            let perm = ints(attrs, "perm")?;
            let rank = ops[0].rank();
            list_len(perm, rank, "perm")?;
            let mut seen = vec![false; rank];
            for &p in perm {
                let p = axis_in(p, rank, "perm entry")?;
                if std::mem::replace(&mut seen[p], true) {
                    return Err(format!("`perm` {perm:?} is not a permutation: {p} repeats"));
                }
            }
            let dims: Vec<usize> = perm.iter().map(|&p| ops[0].dims()[p as usize]).collect();
            one(TensorType::new(ops[0].dtype, dims))
        }
        Slice => infer_slice(attrs, ops[0]),
        Concat => {
            let first = ops[0];
            let axis = axis_in(int(attrs, "axis")?, first.rank(), "axis")?;
            let mut dims = first.dims().to_vec();
            for t in &ops[1..] {
                let compatible = t.dtype == first.dtype
                    && t.rank() == first.rank()
                    && (0..first.rank()).all(|d| d == axis || t.dims()[d] == first.dims()[d]);
                if !compatible {
                    return Err(format!(
                        "concat along axis {axis} needs equal dtypes and equal dims off the axis, found {first} and {t}"
                    ));
                }
                dims[axis] = dims[axis]
                    .checked_add(t.dims()[axis])
                    .ok_or("concat result extent overflows")?;
            }
            one(TensorType::new(first.dtype, dims))
        }
        Pad => {
            let (low, high) = (ints(attrs, "low")?, ints(attrs, "high")?);
            let rank = ops[0].rank();
            list_len(low, rank, "low")?;
            list_len(high, rank, "high")?;
            all_non_negative(low, "low")?;
            all_non_negative(high, "high")?;
            let dims = (0..rank)
                .map(|d| {
                    // Non-negative, so the casts are exact; only the sum can overflow.
                    (ops[0].dims()[d].checked_add(low[d] as usize))
                        .and_then(|n| n.checked_add(high[d] as usize))
                        .ok_or_else(|| format!("padding dim {d} of {} overflows", ops[0]))
                })
                .collect::<Result<Vec<_>, _>>()?;
            one(TensorType::new(ops[0].dtype, dims))
        }
        Gather => {
            let (data, idx) = (ops[0], ops[1]);
            if !idx.dtype.is_int() {
                return Err(format!("gather indices must be i32 or i64, found {idx}"));
            }
            let axis = axis_in(int(attrs, "axis")?, data.rank(), "axis")?;
            let mut dims = data.dims()[..axis].to_vec();
            dims.extend_from_slice(idx.dims());
            dims.extend_from_slice(&data.dims()[axis + 1..]);
            one(TensorType::new(data.dtype, dims))
        }
        ReduceSum | ReduceMean | ReduceMax | ReduceProd => {
            need_numeric(ops[0], kind)?;
            if kind == ReduceMean {
                need_float(ops[0], kind)?;
            }
            let axes = ints(attrs, "axes")?;
            let rank = ops[0].rank();
            if axes.is_empty() {
                return Err("`axes` must name at least one dim".to_string());
            }
            for w in axes.windows(2) {
                if w[0] >= w[1] {
                    return Err(format!(
                        "`axes` must be strictly increasing, found {axes:?}"
                    ));
                }
            }
            for &a in axes {
                axis_in(a, rank, "axes entry")?;
            }
            let keep = attrs.bool("keepdims").unwrap_or(false);
            let mut dims = Vec::new();
            for (d, &e) in ops[0].dims().iter().enumerate() {
                if axes.contains(&(d as i64)) {
                    if keep {
                        dims.push(1);
                    }
                } else {
                    dims.push(e);
                }
            }
            one(TensorType::new(ops[0].dtype, dims))
        }
        Softmax => {
            need_float(ops[0], kind)?;
            axis_in(int(attrs, "axis")?, ops[0].rank(), "axis")?;
            one(ops[0].clone())
        }
        Layernorm => {
            let x = ops[0];
            need_float(x, kind)?;
            let axis = axis_in(int(attrs, "axis")?, x.rank(), "axis")?;
            positive_epsilon(attrs)?;
            let norm = TensorType::new(x.dtype, x.dims()[axis..].to_vec());
            for (t, what) in [(ops[1], "scale"), (ops[2], "bias")] {
                if *t != norm {
                    return Err(format!(
                        "layernorm {what} must be {norm} (x's dims from axis {axis}), found {t}"
                    ));
                }
            }
            one(x.clone())
        }
        Batchnorm => {
            let x = ops[0];
            need_float(x, kind)?;
            if x.rank() < 2 {
                return Err(format!(
                    "batchnorm needs x of rank >= 2 (channels at dim 1), found {x}"
                ));
            }
            positive_epsilon(attrs)?;
            let channel = TensorType::new(x.dtype, vec![x.dims()[1]]);
            for (t, what) in ops[1..].iter().zip(["scale", "bias", "mean", "var"]) {
                if **t != channel {
                    return Err(format!("batchnorm {what} must be {channel}, found {t}"));
                }
            }
            one(x.clone())
        }
        Maxpool2d | Avgpool2d => infer_pool(kind, attrs, ops[0]),
        GlobalAvgpool => {
            need_float(ops[0], kind)?;
            need_rank(ops[0], 4, kind, "x")?;
            let d = ops[0].dims();
            one(TensorType::new(ops[0].dtype, vec![d[0], d[1], 1, 1]))
        }
        Broadcast | Reshape | Cast | Constant | Fused => Err(format!(
            "the result type of `{}` is declared, not inferred",
            kind.name()
        )),
        Return | Yield => Ok(Vec::new()),
    }
}

fn positive_epsilon(attrs: &Attrs) -> Result<(), TypeError> {
    let eps = attrs.float("epsilon").unwrap_or(0.0);
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(format!("`epsilon` must be finite and > 0, found {eps:?}"));
    }
    Ok(())
}

fn infer_conv2d(
    attrs: &Attrs,
    x: &TensorType,
    w: &TensorType,
) -> Result<Vec<TensorType>, TypeError> {
    let k = OpKind::Conv2d;
    need_float(x, k)?;
    need_rank(x, 4, k, "x")?;
    need_rank(w, 4, k, "w")?;
    if x.dtype != w.dtype {
        return Err(format!(
            "conv2d needs x and w of one dtype, found {x} and {w}"
        ));
    }
    let (stride, pad, dilation) = (
        ints(attrs, "stride")?,
        ints(attrs, "pad")?,
        ints(attrs, "dilation")?,
    );
    list_len(stride, 2, "stride")?;
    list_len(pad, 4, "pad")?;
    list_len(dilation, 2, "dilation")?;
    all_positive(stride, "stride")?;
    all_non_negative(pad, "pad")?;
    all_positive(dilation, "dilation")?;
    let groups = int(attrs, "groups")?;
    let [n, c, h, wd] = [x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]];
    let [o, cg, kh, kw] = [w.dims()[0], w.dims()[1], w.dims()[2], w.dims()[3]];
    if groups <= 0 || c % groups as usize != 0 || o % groups as usize != 0 {
        return Err(format!(
            "`groups` = {groups} must be > 0 and divide the input channels ({c}) and output channels ({o})"
        ));
    }
    let g = groups as usize;
    if cg != c / g {
        return Err(format!(
            "conv2d weight {w} needs dim 1 = input channels / groups = {c} / {g} = {}, found {cg}",
            c / g
        ));
    }
    let oh = window_out(h, pad[0], pad[2], kh as i64, stride[0], dilation[0]);
    let ow = window_out(wd, pad[1], pad[3], kw as i64, stride[1], dilation[1]);
    match (oh, ow) {
        (Some(oh), Some(ow)) => Ok(vec![TensorType::new(x.dtype, vec![n, o, oh, ow])]),
        _ => Err(format!(
            "the dilated {kh}x{kw} kernel does not fit the padded {h}x{wd} input"
        )),
    }
}

fn infer_matmul(
    attrs: &Attrs,
    a: &TensorType,
    b: &TensorType,
) -> Result<Vec<TensorType>, TypeError> {
    let k = OpKind::Matmul;
    need_numeric(a, k)?;
    if a.dtype != b.dtype {
        return Err(format!(
            "matmul needs a and b of one dtype, found {a} and {b}"
        ));
    }
    if a.rank() < 2 || a.rank() != b.rank() {
        return Err(format!(
            "matmul needs operands of one rank >= 2, found {a} and {b}"
        ));
    }
    let r = a.rank();
    if a.dims()[..r - 2] != b.dims()[..r - 2] {
        return Err(format!(
            "matmul needs equal batch dims (broadcast explicitly), found {a} and {b}"
        ));
    }
    let (ta, tb) = (
        attrs.bool("transpose_a").unwrap_or(false),
        attrs.bool("transpose_b").unwrap_or(false),
    );
    let (m, ka) = if ta {
        (a.dims()[r - 1], a.dims()[r - 2])
    } else {
        (a.dims()[r - 2], a.dims()[r - 1])
    };
    let (kb, n) = if tb {
        (b.dims()[r - 1], b.dims()[r - 2])
    } else {
        (b.dims()[r - 2], b.dims()[r - 1])
    };
    if ka != kb {
        return Err(format!(
            "matmul contraction dims differ: {ka} (from {a}) and {kb} (from {b})"
        ));
    }
    let mut dims = a.dims()[..r - 2].to_vec();
    dims.extend([m, n]);
    Ok(vec![TensorType::new(a.dtype, dims)])
}

fn infer_slice(attrs: &Attrs, x: &TensorType) -> Result<Vec<TensorType>, TypeError> {
    let (starts, ends, steps) = (
        ints(attrs, "starts")?,
        ints(attrs, "ends")?,
        ints(attrs, "steps")?,
    );
    let rank = x.rank();
    list_len(starts, rank, "starts")?;
    list_len(ends, rank, "ends")?;
    if !steps.is_empty() {
        list_len(steps, rank, "steps")?;
        all_positive(steps, "steps")?;
    }
    let mut dims = Vec::with_capacity(rank);
    for d in 0..rank {
        let (s, e, extent) = (starts[d], ends[d], x.dims()[d] as i64);
        if !(0 <= s && s <= e && e <= extent) {
            return Err(format!(
                "slice of dim {d} needs 0 <= start <= end <= {extent}, found {s}..{e}"
            ));
        }
        let step = steps.get(d).copied().unwrap_or(1);
        dims.push(if e == s {
            0
        } else {
            ((e - s - 1) / step + 1) as usize
        });
    }
    Ok(vec![TensorType::new(x.dtype, dims)])
}

fn infer_pool(kind: OpKind, attrs: &Attrs, x: &TensorType) -> Result<Vec<TensorType>, TypeError> {
    need_numeric(x, kind)?;
    if kind == OpKind::Avgpool2d {
        need_float(x, kind)?;
    }
    need_rank(x, 4, kind, "x")?;
    let (kernel, stride, pad) = (
        ints(attrs, "kernel")?,
        ints(attrs, "stride")?,
        ints(attrs, "pad")?,
    );
    list_len(kernel, 2, "kernel")?;
    list_len(stride, 2, "stride")?;
    list_len(pad, 4, "pad")?;
    all_positive(kernel, "kernel")?;
    all_positive(stride, "stride")?;
    all_non_negative(pad, "pad")?;
    let dilation = ints(attrs, "dilation")?;
    list_len(dilation, 2, "dilation")?;
    all_positive(dilation, "dilation")?;
    for (i, &p) in pad.iter().enumerate() {
        if p >= kernel[i % 2] {
            return Err(format!(
                "`pad` entry {p} must be smaller than the kernel extent {}",
                kernel[i % 2]
            ));
        }
    }
    let d = x.dims();
    let oh = window_out(d[2], pad[0], pad[2], kernel[0], stride[0], dilation[0]);
    let ow = window_out(d[3], pad[1], pad[3], kernel[1], stride[1], dilation[1]);
    match (oh, ow) {
        (Some(oh), Some(ow)) => Ok(vec![TensorType::new(x.dtype, vec![d[0], d[1], oh, ow])]),
        _ => Err(format!(
            "the {}x{} window does not fit the padded {}x{} input",
            kernel[0], kernel[1], d[2], d[3]
        )),
    }
}

fn check_broadcast(attrs: &Attrs, x: &TensorType, out: &TensorType) -> Result<(), TypeError> {
    same_dtype(x, out, "broadcast")?;
    let dims = ints(attrs, "dims")?;
    list_len(dims, x.rank(), "dims")?;
    for w in dims.windows(2) {
        if w[0] >= w[1] {
            return Err(format!(
                "broadcast `dims` must be strictly increasing, found {dims:?}"
            ));
        }
    }
    for (i, &d) in dims.iter().enumerate() {
        let d = axis_in(d, out.rank(), "dims entry")?;
        let (from, to) = (x.dims()[i], out.dims()[d]);
        if from != to && from != 1 {
            return Err(format!(
                "broadcast maps dim {i} of {x} (extent {from}) to dim {d} of {out} (extent {to}): extents must be equal or 1"
            ));
        }
    }
    Ok(())
}

fn check_constant(attrs: &Attrs, out: &TensorType) -> Result<(), TypeError> {
    let n = out.num_elements().ok_or("constant is too large")?;
    let (count, ints_only) = match attrs.get("value") {
        Some(Attr::Int(_)) => (1, true),
        Some(Attr::Float(_)) => (1, false),
        Some(Attr::Ints(v)) => (v.len(), true),
        Some(Attr::Floats(v)) => (v.len(), false),
        _ => return Err("constant needs `value`: a number or a list of numbers".to_string()),
    };
    if count != 1 && count != n {
        return Err(format!(
            "constant of type {out} needs 1 or {n} values, found {count}"
        ));
    }
    if !out.dtype.is_float() && !ints_only {
        return Err(format!("constant of type {out} needs integer values"));
    }
    let range = match out.dtype {
        DType::Bool => Some((0, 1)),
        DType::I32 => Some((i64::from(i32::MIN), i64::from(i32::MAX))),
        _ => None,
    };
    if let Some((lo, hi)) = range {
        let values: &[i64] = match attrs.get("value") {
            Some(Attr::Int(v)) => std::slice::from_ref(v),
            Some(Attr::Ints(v)) => v,
            _ => &[],
        };
        if let Some(bad) = values.iter().find(|&&v| v < lo || v > hi) {
            return Err(format!(
                "constant of type {out} holds values in {lo}..={hi}, found {bad}"
            ));
        }
    }
    Ok(())
}

/// How a reducing op (`reduce_*`, `softmax`, `layernorm`, `global_avgpool`)
/// walks its first operand: one row per index of the kept dims, each row the
/// elements of the reduced dims. The one description the cost model and the
/// emitter both read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    /// The dims that are not reduced, in order.
    pub kept: Vec<usize>,
    /// The reduced dims, in order.
    pub reduced: Vec<usize>,
    /// Number of rows: the product of the kept extents.
    pub rows: usize,
    /// Elements per row: the product of the reduced extents.
    pub len: usize,
}

impl Rows {
    /// The rows `kind` (with `attrs`) reduces an operand of `dims` into;
    /// `None` for an op that reduces nothing.
    pub fn of(kind: OpKind, attrs: &Attrs, dims: &[usize]) -> Option<Rows> {
        let rank = dims.len();
        let index = |v: i64| usize::try_from(v).ok().filter(|&a| a < rank);
        let reduced: Vec<usize> = match kind {
            OpKind::ReduceSum | OpKind::ReduceMean | OpKind::ReduceMax | OpKind::ReduceProd => {
                attrs
                    .ints("axes")
                    .unwrap_or(&[])
                    .iter()
                    .filter_map(|&a| index(a))
                    .collect()
            }
            OpKind::Softmax => index(attrs.int("axis").unwrap_or(0)).into_iter().collect(),
            OpKind::Layernorm => {
                let axis = usize::try_from(attrs.int("axis").unwrap_or(0)).unwrap_or(0);
                (axis.min(rank)..rank).collect()
            }
            OpKind::GlobalAvgpool if rank == 4 => vec![2, 3],
            _ => return None,
        };
        let kept: Vec<usize> = (0..rank).filter(|d| !reduced.contains(d)).collect();
        let extent = |ds: &[usize]| ds.iter().map(|&d| dims[d]).product();
        Some(Rows {
            rows: extent(&kept),
            len: extent(&reduced),
            kept,
            reduced,
        })
    }

    /// Whether each row is contiguous in row-major order: the reduced dims
    /// are the innermost ones (or every dim between them has extent 1).
    pub fn contiguous(&self, dims: &[usize]) -> bool {
        let last_kept = self.kept.iter().rev().find(|&&d| dims[d] != 1);
        let first_reduced = self.reduced.iter().find(|&&d| dims[d] != 1);
        match (last_kept, first_reduced) {
            (Some(k), Some(r)) => k < r,
            _ => true,
        }
    }

    /// The operand's dims in row order: the kept dims, then the reduced ones.
    pub fn order(&self) -> Vec<usize> {
        self.kept.iter().chain(&self.reduced).copied().collect()
    }
}
