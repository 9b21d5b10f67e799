//! ONNX ops imported as compositions of dcir ops: the piecewise and smooth
//! activations, `Split`, `Tile`, instance and group normalization, `Trilu`,
//! variadic `Max`/`Min`/`Sum`/`Mean`, `ArgMax`/`ArgMin`, `CumSum`,
//! `Resize`/`Upsample` (nearest and linear), `LogSoftmax`, `Hardmax`,
//! `RMSNormalization`, `LayerNormalization`'s statistics outputs, `OneHot`,
//! `LpNormalization`, `LpPool`.
//! Each follows the formula of the ONNX operator document; the planner fuses
//! the pieces back into few kernels.

use dcir_ir::{Attr, Attrs, DType, OpKind, TensorType, ValueId};

use super::{At, Importer, R, Val, axis, b, ints};
use crate::proto::NodeProto;
use crate::tensor;

/// The largest extent a `Resize` may give one dim.
const MAX_RESIZED_DIM: usize = 1 << 24;

/// Most neighbours one output of an antialiased `Resize` reads per axis (a
/// downscale by 16 reads 32 with linear, 64 with cubic).
const MAX_RESIZE_TAPS: usize = 64;

impl<'m> Importer<'m> {
    /// `kind` of `operands` (inferred type).
    pub(super) fn ew(&mut self, kind: OpKind, operands: &[ValueId]) -> R<ValueId> {
        self.b.op(kind, operands, Attrs::new()).map_err(b)
    }

    /// A splat of `v` with the type of `like`.
    pub(super) fn splat_like(&mut self, like: ValueId, v: f64) -> R<ValueId> {
        let ty = self.b.ty(like).clone();
        self.splat(ty.dtype, v, ty.dims())
    }

    /// The piecewise and smooth activations, decomposed into elementwise
    /// ops (one fused kernel after planning), with ONNX's formulas and
    /// default attributes.
    pub(super) fn activation(&mut self, node: &'m NodeProto, op: &str, at: &At<'_>) -> R<()> {
        use OpKind as K;
        let x = self.ir_in(node, 0)?;
        let alpha = |d: f64| at.float("alpha").map_or(d, f64::from);
        // A zero of x's type and where x < 0.
        let split = |me: &mut Self| -> R<(ValueId, ValueId)> {
            let zero = me.splat_like(x, 0.0)?;
            Ok((zero, me.ew(K::Less, &[x, zero])?))
        };
        // log(exp(x) + 1), as ONNX defines it.
        let softplus = |me: &mut Self| -> R<ValueId> {
            let e = me.ew(K::Exp, &[x])?;
            let one = me.splat_like(x, 1.0)?;
            let e1 = me.ew(K::Add, &[e, one])?;
            me.ew(K::Log, &[e1])
        };
        let v = match op {
            "LeakyRelu" | "PRelu" => {
                let slope = if op == "PRelu" {
                    let s = self.req(node, 1)?;
                    let dims = self.b.ty(x).dims().to_vec();
                    let dtype = self.b.ty(x).dtype;
                    self.operand(Self::in_name(node, 1), &s, dtype, &dims)?
                } else {
                    self.splat_like(x, alpha(0.01))?
                };
                let sx = self.ew(K::Mul, &[slope, x])?;
                let (_, negative) = split(self)?;
                self.ew(K::Select, &[negative, sx, x])?
            }
            "Elu" | "Selu" => {
                let (a, gamma) = if op == "Elu" {
                    (alpha(1.0), 1.0)
                } else {
                    (
                        alpha(1.673_263_192_176_818_8),
                        at.float("gamma").map_or(1.050_701_022_148_132_3, f64::from),
                    )
                };
                // Selu: x <= 0 takes the exponential side; at 0 both are 0.
                let e = self.ew(K::Exp, &[x])?;
                let one = self.splat_like(x, 1.0)?;
                let em1 = self.ew(K::Sub, &[e, one])?;
                let a_s = self.splat_like(x, a)?;
                let neg = self.ew(K::Mul, &[a_s, em1])?;
                let (_, negative) = split(self)?;
                let picked = self.ew(K::Select, &[negative, neg, x])?;
                if gamma == 1.0 {
                    picked
                } else {
                    let g = self.splat_like(x, gamma)?;
                    self.ew(K::Mul, &[g, picked])?
                }
            }
            "Celu" => {
                // max(0, x) + min(0, alpha · (exp(x / alpha) - 1)).
                let a = alpha(1.0);
                let a_s = self.splat_like(x, a)?;
                let xa = self.ew(K::Div, &[x, a_s])?;
                let e = self.ew(K::Exp, &[xa])?;
                let one = self.splat_like(x, 1.0)?;
                let em1 = self.ew(K::Sub, &[e, one])?;
                let scaled = self.ew(K::Mul, &[a_s, em1])?;
                let zero = self.splat_like(x, 0.0)?;
                let low = self.ew(K::Min, &[zero, scaled])?;
                let high = self.ew(K::Max, &[zero, x])?;
                self.ew(K::Add, &[high, low])?
            }
            "Softplus" => softplus(self)?,
            "Softsign" => {
                let a = self.ew(K::Abs, &[x])?;
                let one = self.splat_like(x, 1.0)?;
                let d = self.ew(K::Add, &[one, a])?;
                self.ew(K::Div, &[x, d])?
            }
            "Mish" => {
                let sp = softplus(self)?;
                let t = self.ew(K::Tanh, &[sp])?;
                self.ew(K::Mul, &[x, t])?
            }
            _ => {
                // ThresholdedRelu: x where x > alpha, else 0.
                let a_s = self.splat_like(x, alpha(1.0))?;
                let above = self.ew(K::Less, &[a_s, x])?;
                let zero = self.splat_like(x, 0.0)?;
                self.ew(K::Select, &[above, x, zero])?
            }
        };
        self.out(node, v)
    }

    /// `Split`: one `slice` per output along `axis`, sized by the `split`
    /// input (opset 13+) or attribute, else `num_outputs` (opset 18) or the
    /// output count, in equal chunks (the last one smaller when they do
    /// not divide).
    pub(super) fn split(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let x = self.ir_in(node, 0)?;
        let dims = self.b.ty(x).dims().to_vec();
        let a = axis(at.int_or("axis", 0), dims.len())?;
        let given = match self.get(node, 1)? {
            Some(_) => self.const_in(node, 1)?.map(|c| c.to_i64()),
            None => at.ints("split").map(<[i64]>::to_vec),
        };
        let extent = dims[a];
        let sizes: Vec<usize> = match given {
            Some(sizes) => {
                if sizes.iter().any(|&s| s < 0) || sizes.iter().sum::<i64>() != extent as i64 {
                    return Err(format!(
                        "Split sizes {sizes:?} do not add up to the axis extent {extent}"
                    ));
                }
                sizes.iter().map(|&s| s as usize).collect()
            }
            None => {
                let n = at
                    .int("num_outputs")
                    .unwrap_or(node.output.len() as i64)
                    .max(1) as usize;
                let chunk = extent.div_ceil(n);
                (0..n)
                    .map(|k| chunk.min(extent.saturating_sub(k * chunk)))
                    .collect()
            }
        };
        if sizes.len() != node.output.len() {
            return Err(format!(
                "Split into {} pieces has {} outputs",
                sizes.len(),
                node.output.len()
            ));
        }
        let mut start = 0;
        for (k, size) in sizes.into_iter().enumerate() {
            let mut starts = vec![0; dims.len()];
            let mut ends = dims.clone();
            starts[a] = start;
            ends[a] = start + size;
            start += size;
            let v = if size == extent {
                x
            } else {
                let attrs = Attrs::new()
                    .with("starts", ints(&starts))
                    .with("ends", ints(&ends));
                self.b.op(OpKind::Slice, &[x], attrs).map_err(b)?
            };
            self.set(node, k, Val::Ir(v))?;
        }
        Ok(())
    }

    /// `Tile`: each dim `d` repeated `r` times as a `broadcast` to
    /// `[r0, d0, r1, d1, ...]` and a `reshape` to `[r0·d0, r1·d1, ...]` (views).
    pub(super) fn tile(&mut self, node: &'m NodeProto) -> R<()> {
        let x = self.ir_in(node, 0)?;
        let dims = self.b.ty(x).dims().to_vec();
        let repeats = self
            .const_in(node, 1)?
            .ok_or("Tile needs its repeats")?
            .to_i64();
        if repeats.len() != dims.len() || repeats.iter().any(|&r| r < 0) {
            return Err(format!(
                "Tile repeats {repeats:?} do not fit an input of rank {}",
                dims.len()
            ));
        }
        if repeats.iter().all(|&r| r == 1) {
            return self.out(node, x);
        }
        let mut wide = Vec::new();
        let mut map = Vec::new();
        for (&d, &r) in dims.iter().zip(&repeats) {
            wide.push(r as usize);
            map.push(wide.len() as i64);
            wide.push(d);
        }
        let spread = self.b.broadcast(x, &map, &wide).map_err(b)?;
        let tiled: Vec<usize> = wide.chunks(2).map(|p| p[0] * p[1]).collect();
        let v = self.b.reshape(spread, &tiled).map_err(b)?;
        self.out(node, v)
    }

    /// `InstanceNormalization` (one group per channel) and
    /// `GroupNormalization`: `x[N, C, ...]` viewed as `[N, G, C/G·S]`, a
    /// `layernorm` over the last dim (unit scale, zero bias), then the
    /// per-channel (or, in opset 18's form, per-group) scale and bias.
    pub(super) fn group_norm(&mut self, node: &'m NodeProto, op: &str, at: &At<'_>) -> R<()> {
        let x = self.ir_in(node, 0)?;
        let xt = self.b.ty(x).clone();
        let dims = xt.dims().to_vec();
        if dims.len() < 3 {
            return Err(format!("{op} needs an input of rank 3 or more, found {xt}"));
        }
        let (n, c) = (dims[0], dims[1]);
        let s: usize = dims[2..].iter().product();
        let groups = if op == "InstanceNormalization" {
            c
        } else {
            let g = at
                .int("num_groups")
                .ok_or("GroupNormalization needs `num_groups`")?;
            usize::try_from(g)
                .ok()
                .filter(|&g| g > 0 && c.is_multiple_of(g))
                .ok_or_else(|| format!("num_groups = {g} does not divide {c} channels"))?
        };
        let eps = f64::from(at.float("epsilon").unwrap_or(1e-5));
        let row = c / groups * s;
        let grouped = self.b.reshape(x, &[n, groups, row]).map_err(b)?;
        let ones = self.splat(xt.dtype, 1.0, &[row])?;
        let zeros = self.splat(xt.dtype, 0.0, &[row])?;
        let attrs = Attrs::new()
            .with("axis", Attr::Int(2))
            .with("epsilon", Attr::Float(eps));
        let normed = self
            .b
            .op(OpKind::Layernorm, &[grouped, ones, zeros], attrs)
            .map_err(b)?;
        // Scale and bias per channel ([C]) or per group ([G], opset 18).
        let scale = self.req(node, 1)?;
        let per_group = self.dims_of(&scale) == [groups] && groups != c;
        let (view, len) = if per_group {
            (normed, groups)
        } else {
            (self.b.reshape(normed, &[n, c, s]).map_err(b)?, c)
        };
        let target = self.b.ty(view).dims().to_vec();
        let mut affine = Vec::new();
        for i in [1, 2] {
            let v = self.req(node, i)?;
            let p = self.operand(Self::in_name(node, i), &v, xt.dtype, &[len])?;
            affine.push(self.b.broadcast(p, &[1], &target).map_err(b)?);
        }
        let scaled = self.ew(OpKind::Mul, &[view, affine[0]])?;
        let shifted = self.ew(OpKind::Add, &[scaled, affine[1]])?;
        let v = self.b.reshape(shifted, &dims).map_err(b)?;
        self.out(node, v)
    }

    /// `Trilu`: the input where a constant mask of its last two dims keeps
    /// the upper (`upper = 1`) or lower triangle from diagonal `k`, else 0.
    pub(super) fn trilu(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let x = self.ir_in(node, 0)?;
        let xt = self.b.ty(x).clone();
        let dims = xt.dims().to_vec();
        if dims.len() < 2 {
            return Err(format!(
                "Trilu needs an input of rank 2 or more, found {xt}"
            ));
        }
        let k = match self.get(node, 1)? {
            Some(_) => self
                .const_in(node, 1)?
                .and_then(|c| c.to_i64().first().copied())
                .unwrap_or(0),
            None => 0,
        };
        let upper = at.int_or("upper", 1) != 0;
        let (rows, cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let keep: Vec<i64> = (0..rows as i64)
            .flat_map(|i| (0..cols as i64).map(move |j| (j - i, k)))
            .map(|(d, k)| i64::from(if upper { d >= k } else { d <= k }))
            .collect();
        let mask = self
            .b
            .constant(
                TensorType::new(DType::Bool, vec![rows, cols]),
                Attr::Ints(keep),
            )
            .map_err(b)?;
        let r = dims.len();
        let map: Vec<i64> = vec![(r - 2) as i64, (r - 1) as i64];
        let mask = self.b.broadcast(mask, &map, &dims).map_err(b)?;
        let zero = self.splat(xt.dtype, 0.0, &dims)?;
        let v = self.ew(OpKind::Select, &[mask, x, zero])?;
        self.out(node, v)
    }

    /// `Max`, `Min`, `Sum`, `Mean` of any number of inputs, broadcast
    /// together: a chain of the binary op (`Mean`: the sum over the count).
    pub(super) fn variadic(&mut self, node: &'m NodeProto, op: &str) -> R<()> {
        let vals: Vec<Val> = (0..node.input.len())
            .map(|i| self.req(node, i))
            .collect::<R<_>>()?;
        let Some(first) = vals.first() else {
            return Err(format!("{op} needs at least one input"));
        };
        let mut out = self.dims_of(first);
        for v in &vals[1..] {
            out = tensor::broadcast_shapes(&out, &self.dims_of(v))?;
        }
        let dtype = vals
            .iter()
            .find_map(|v| match v {
                Val::Ir(id) => Some(self.b.ty(*id).dtype),
                Val::Const(_) => None,
            })
            .unwrap_or_else(|| self.dtype_of(first));
        let kind = match op {
            "Max" => OpKind::Max,
            "Min" => OpKind::Min,
            _ => OpKind::Add,
        };
        let mut acc = self.operand(Self::in_name(node, 0), first, dtype, &out)?;
        for (i, v) in vals.iter().enumerate().skip(1) {
            let x = self.operand(Self::in_name(node, i), v, dtype, &out)?;
            acc = self.ew(kind, &[acc, x])?;
        }
        if op == "Mean" && vals.len() > 1 {
            let n = self.splat_like(acc, vals.len() as f64)?;
            acc = self.ew(OpKind::Div, &[acc, n])?;
        }
        self.out(node, acc)
    }

    /// `ArgMax`/`ArgMin` along `axis`: where the input equals its maximum
    /// (minimum; or is NaN, which the extreme then is), the index along the
    /// axis, else one past the end (`select_last_index`: -1); the smallest
    /// (largest) of those, as `i64`.
    pub(super) fn arg_extreme(&mut self, node: &'m NodeProto, op: &str, at: &At<'_>) -> R<()> {
        let x = self.ir_in(node, 0)?;
        let a = axis(at.int_or("axis", 0), self.b.ty(x).rank())?;
        let keep = at.int_or("keepdims", 1) != 0;
        let last = at.int_or("select_last_index", 0) != 0;
        // A minimum is the maximum of the reversal.
        let src = if op == "ArgMax" { x } else { self.reversed(x)? };
        let v = self.first_max_index(src, x, a, keep, last)?;
        self.out(node, v)
    }

    /// The index (`i64`) along `a` of the first (`last`: the last) maximum
    /// of `src`, where a NaN of `x` (`src` computed from it elementwise)
    /// counts as the maximum: where `src` equals its maximum, the index
    /// from a constant ramp, else one past the end (-1), then the smallest
    /// (largest) of those.
    fn first_max_index(
        &mut self,
        src: ValueId,
        x: ValueId,
        a: usize,
        keep: bool,
        last: bool,
    ) -> R<ValueId> {
        use OpKind as K;
        let dims = self.b.ty(x).dims().to_vec();
        let reduce = |me: &mut Self, v: ValueId, keep: bool| -> R<ValueId> {
            let attrs = Attrs::new()
                .with("axes", ints(&[a]))
                .with("keepdims", Attr::Bool(keep));
            me.b.op(K::ReduceMax, &[v], attrs).map_err(b)
        };
        let extreme = reduce(self, src, true)?;
        let extreme = self.broadcast_to(extreme, &dims)?;
        let mut hit = self.ew(K::Equal, &[src, extreme])?;
        if self.b.ty(x).dtype.is_float() {
            let nan = self.ew(K::IsNan, &[x])?;
            hit = self.ew(K::Or, &[hit, nan])?;
        }
        let iota = self.ramp(&dims, a)?;
        let miss = if last { -1.0 } else { dims[a] as f64 };
        let miss = self.splat(DType::I64, miss, &dims)?;
        let candidates = self.ew(K::Select, &[hit, iota, miss])?;
        if last {
            return reduce(self, candidates, keep);
        }
        // The smallest index, as -max(-index).
        let neg = self.ew(K::Neg, &[candidates])?;
        let m = reduce(self, neg, keep)?;
        self.ew(K::Neg, &[m])
    }

    /// The index along dim `a` at every element of `dims` (`i64`): a
    /// constant ramp broadcast over the other dims.
    fn ramp(&mut self, dims: &[usize], a: usize) -> R<ValueId> {
        let ramp = self
            .b
            .constant(
                TensorType::new(DType::I64, vec![dims[a]]),
                Attr::Ints((0..dims[a] as i64).collect()),
            )
            .map_err(b)?;
        self.b.broadcast(ramp, &[a as i64], dims).map_err(b)
    }

    /// `x` in reversed order: `-x` for floats, `-x - 1` (wrapping) for
    /// integers, so a maximum of it is the minimum of `x`.
    pub(super) fn reversed(&mut self, x: ValueId) -> R<ValueId> {
        let n = self.ew(OpKind::Neg, &[x])?;
        if !self.b.ty(x).dtype.is_int() {
            return Ok(n);
        }
        let one = self.splat_like(x, 1.0)?;
        self.ew(OpKind::Sub, &[n, one])
    }

    /// `CumSum` along `axis` as a matmul with a constant 0/1 triangle:
    /// the axis moved last, `[.., L] x T[L, L]` where `T[k, j]` is 1 when
    /// element `k` counts towards position `j` (`exclusive`, `reverse`),
    /// moved back.
    pub(super) fn cumsum(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let x = self.ir_in(node, 0)?;
        let xt = self.b.ty(x).clone();
        let dims = xt.dims().to_vec();
        let raw = self
            .const_in(node, 1)?
            .and_then(|c| c.to_i64().first().copied())
            .ok_or("CumSum needs its axis")?;
        let a = axis(raw, dims.len())?;
        let exclusive = at.int_or("exclusive", 0) != 0;
        let reverse = at.int_or("reverse", 0) != 0;
        let len = dims[a];
        let counts = |k: usize, j: usize| match (reverse, exclusive) {
            (false, false) => k <= j,
            (false, true) => k < j,
            (true, false) => k >= j,
            (true, true) => k > j,
        };
        let triangle: Vec<f64> = (0..len)
            .flat_map(|k| (0..len).map(move |j| f64::from(u8::from(counts(k, j)))))
            .collect();
        let literal = if xt.dtype.is_float() {
            Attr::Floats(triangle)
        } else {
            Attr::Ints(triangle.iter().map(|&v| v as i64).collect())
        };
        let t = self
            .b
            .constant(TensorType::new(xt.dtype, vec![len, len]), literal)
            .map_err(b)?;
        // Move the axis last and flatten the others into rows.
        let mut perm: Vec<usize> = (0..dims.len()).filter(|&d| d != a).collect();
        perm.push(a);
        let moved = if a + 1 == dims.len() {
            x
        } else {
            let attrs = Attrs::new().with("perm", ints(&perm));
            self.b.op(OpKind::Transpose, &[x], attrs).map_err(b)?
        };
        let moved_dims = self.b.ty(moved).dims().to_vec();
        let rows: usize = moved_dims[..moved_dims.len() - 1].iter().product();
        let flat = self.b.reshape(moved, &[rows, len]).map_err(b)?;
        let summed = self.ew(OpKind::Matmul, &[flat, t])?;
        let back = self.b.reshape(summed, &moved_dims).map_err(b)?;
        let v = if a + 1 == dims.len() {
            back
        } else {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            let attrs = Attrs::new().with("perm", ints(&inverse));
            self.b.op(OpKind::Transpose, &[back], attrs).map_err(b)?
        };
        self.out(node, v)
    }

    /// `Resize` (opset 10+) and `Upsample`, nearest, linear or cubic: one
    /// axis at a time (all are separable), a `gather` of constant source
    /// indices along it; linear and cubic gather their 2 or 4 neighbours,
    /// each weighted by a constant vector broadcast over the other dims
    /// (cubic: Keys' kernel with `cubic_coeff_a`). Source coordinates follow
    /// `coordinate_transformation_mode`, neighbours are clamped to the edge
    /// as ONNX's reference pads, and with `exclude_outside` the weights of
    /// neighbours outside the input are zeroed and the rest renormalized;
    /// `keep_aspect_ratio_policy` scales every axis by one factor that fits
    /// (`not_larger`) or covers (`not_smaller`) the sizes; antialiasing
    /// widens a downscaling filter by 1 / scale; `tf_crop_and_resize` maps
    /// outputs into a known region of interest, those outside it taking
    /// `extrapolation_value`.
    pub(super) fn resize(&mut self, node: &'m NodeProto, op: &str, at: &At<'_>) -> R<()> {
        let x = self.ir_in(node, 0)?;
        let xt = self.b.ty(x).clone();
        let dims = xt.dims().to_vec();
        let rank = dims.len();
        let mode = at.string("mode").unwrap_or_else(|| "nearest".into());
        if !matches!(mode.as_str(), "nearest" | "linear" | "bilinear" | "cubic") {
            return Err(format!(
                "{op} mode `{mode}` is not supported (nearest, linear and cubic are)"
            ));
        }
        let linear = mode != "nearest";
        if linear && !xt.dtype.is_float() {
            return Err(format!(
                "{op} `{mode}` of {xt}: interpolating needs a float input"
            ));
        }
        let cubic_a = f64::from(at.float("cubic_coeff_a").unwrap_or(-0.75));
        let exclude_outside = at.int_or("exclude_outside", 0) != 0;
        // Opset 10 and Upsample: x / scale and floor for nearest.
        let legacy = op == "Upsample" || self.opset < 11;
        let transform = if legacy {
            "asymmetric".to_string()
        } else {
            at.string("coordinate_transformation_mode")
                .unwrap_or_else(|| "half_pixel".into())
        };
        let nearest_mode = if legacy {
            "floor".to_string()
        } else {
            at.string("nearest_mode")
                .unwrap_or_else(|| "round_prefer_floor".into())
        };
        // Antialiasing widens a downscaling filter by 1 / scale (linear and cubic).
        let antialias = linear && at.int_or("antialias", 0) != 0;
        let policy = at
            .string("keep_aspect_ratio_policy")
            .unwrap_or_else(|| "stretch".into());
        if !matches!(policy.as_str(), "stretch" | "not_larger" | "not_smaller") {
            return Err(format!(
                "{op}'s keep_aspect_ratio_policy `{policy}` is not supported"
            ));
        }
        // Scales and sizes: Upsample's attribute (opset 7) or input 1;
        // Resize's input 1 (opset 10) or inputs 2 and 3, over `axes`.
        let (scales_at, sizes_at) = if legacy { (1, usize::MAX) } else { (2, 3) };
        let known = |me: &Self, i: usize| -> R<Option<Vec<f64>>> {
            if i >= node.input.len() || me.get(node, i)?.is_none() {
                return Ok(None);
            }
            Ok(me
                .const_in(node, i)?
                .map(|c| c.to_f64())
                .filter(|v| !v.is_empty()))
        };
        let axes: Vec<usize> = match at.ints("axes") {
            Some(a) => a.iter().map(|&a| axis(a, rank)).collect::<R<_>>()?,
            None => (0..rank).collect(),
        };
        let mut scales = vec![1.0; rank];
        let mut out = dims.clone();
        if let Some(sizes) = known(self, sizes_at)? {
            if sizes.len() != axes.len() {
                return Err(format!("{op} sizes {sizes:?} do not fit axes {axes:?}"));
            }
            if policy == "stretch" {
                for (&a, &s) in axes.iter().zip(&sizes) {
                    out[a] = s as usize;
                    scales[a] = s / dims[a] as f64;
                }
            } else {
                // One scale for every axis: the largest that fits the sizes
                // (`not_larger`) or the smallest that covers them.
                let ratios = axes.iter().zip(&sizes).map(|(&a, &s)| s / dims[a] as f64);
                let scale = match policy.as_str() {
                    "not_larger" => ratios.fold(f64::INFINITY, f64::min),
                    _ => ratios.fold(0.0, f64::max),
                };
                for &a in &axes {
                    out[a] = (scale * dims[a] as f64 + 0.5).floor() as usize;
                    scales[a] = scale;
                }
            }
        } else {
            let given = match known(self, scales_at)? {
                Some(s) => s,
                None => at
                    .floats("scales")
                    .map(|s| s.iter().map(|&v| f64::from(v)).collect())
                    .ok_or_else(|| format!("{op} needs scales or sizes"))?,
            };
            if given.len() != axes.len() || given.iter().any(|&s| s.is_nan() || s <= 0.0) {
                return Err(format!("{op} scales {given:?} do not fit axes {axes:?}"));
            }
            for (&a, &s) in axes.iter().zip(&given) {
                scales[a] = s;
                out[a] = (dims[a] as f64 * s).floor() as usize;
            }
        }
        // Each resized dim becomes a table of source indices: bounded, as
        // any tensor the import builds.
        if let Some(a) = (0..rank).find(|&a| out[a] > MAX_RESIZED_DIM) {
            return Err(format!(
                "{op} output dim {a} would have {} elements, more than the {MAX_RESIZED_DIM} dcir supports",
                out[a]
            ));
        }
        // tf_crop_and_resize: the region of interest (input 1, starts then
        // ends over `axes`), and the value of outputs that fall outside it.
        let crop = transform == "tf_crop_and_resize";
        let roi = match crop {
            true => known(self, 1)?
                .filter(|r| r.len() == 2 * axes.len())
                .ok_or_else(|| {
                    format!(
                        "{op} tf_crop_and_resize needs a known roi of 2 × {} values",
                        axes.len()
                    )
                })?,
            false => Vec::new(),
        };
        let extrapolation = f64::from(at.float("extrapolation_value").unwrap_or(0.0));
        let mut v = x;
        for a in 0..rank {
            if out[a] == dims[a] && scales[a] == 1.0 {
                continue;
            }
            if out[a] == 0 {
                return Err(format!("{op} to an empty dim {a}"));
            }
            // The output extent before flooring, as ONNX's formulas use it.
            let (len, len_out, scale) = (dims[a] as f64, out[a] as f64, scales[a]);
            let scaled = scale * len;
            let source = |o: f64| -> R<f64> {
                Ok(match transform.as_str() {
                    "half_pixel" => (o + 0.5) / scale - 0.5,
                    "pytorch_half_pixel" if scaled != 1.0 => (o + 0.5) / scale - 0.5,
                    "pytorch_half_pixel" => -0.5,
                    "align_corners" if scaled != 1.0 => o * (len - 1.0) / (scaled - 1.0),
                    "align_corners" => 0.0,
                    "asymmetric" => o / scale,
                    "tf_crop_and_resize" => {
                        let j = axes.iter().position(|&x| x == a).unwrap_or(0);
                        let (start, end) = (roi[j], roi[j + axes.len()]);
                        if len_out > 1.0 {
                            start * (len - 1.0) + o * (end - start) * (len - 1.0) / (len_out - 1.0)
                        } else {
                            0.5 * (start + end) * (len - 1.0)
                        }
                    }
                    "half_pixel_symmetric" => {
                        let adjustment = len_out / scaled;
                        let offset = len / 2.0 * (1.0 - adjustment);
                        offset + (o + 0.5) / scale - 0.5
                    }
                    other => {
                        return Err(format!(
                            "{op}'s coordinate_transformation_mode `{other}` is not supported"
                        ));
                    }
                })
            };
            let clamp = |i: f64| i.clamp(0.0, len - 1.0) as i64;
            let coords: Vec<f64> = (0..out[a]).map(|o| source(o as f64)).collect::<R<_>>()?;
            let mut shape = dims.clone();
            shape[..a].copy_from_slice(&out[..a]);
            shape[a] = out[a];
            let gather = |me: &mut Self, idx: Vec<i64>| -> R<ValueId> {
                let n = idx.len();
                let idx =
                    me.b.constant(TensorType::new(DType::I64, vec![n]), Attr::Ints(idx))
                        .map_err(b)?;
                let attrs = Attrs::new().with("axis", Attr::Int(a as i64));
                me.b.op(OpKind::Gather, &[v, idx], attrs).map_err(b)
            };
            v = if !linear {
                let pick = |c: f64| -> R<f64> {
                    let frac = c - c.floor();
                    Ok(match nearest_mode.as_str() {
                        "floor" => c.floor(),
                        "ceil" => c.ceil(),
                        "round_prefer_floor" if frac == 0.5 => c.floor(),
                        "round_prefer_ceil" if frac == 0.5 => c.ceil(),
                        "round_prefer_floor" | "round_prefer_ceil" => c.round(),
                        other => {
                            return Err(format!("{op}'s nearest_mode `{other}` is not supported"));
                        }
                    })
                };
                let idx = coords
                    .iter()
                    .map(|&c| Ok(clamp(pick(c)?)))
                    .collect::<R<_>>()?;
                gather(self, idx)?
            } else {
                // Neighbour k of an output sits at floor(c) + taps[k], with
                // weight kernel(s · (taps[k] - t)) where t = c - floor(c) and s
                // the scale, below 1 only when antialiasing (ONNX's reference).
                let support = if mode == "cubic" { 2.0 } else { 1.0 };
                let s = if antialias { scale.min(1.0) } else { 1.0 };
                let start = (-support / s).floor() + 1.0;
                let count = 2.0 - 2.0 * start;
                if count.is_nan() || count > MAX_RESIZE_TAPS as f64 {
                    return Err(format!(
                        "{op} with antialiasing at scale {scale} would read {count} neighbours per output, more than the {MAX_RESIZE_TAPS} dcir supports"
                    ));
                }
                let start = start as i64;
                let taps: Vec<i64> = (start..2 - start).collect();
                let a_coef = cubic_a;
                let kernel = |x: f64| -> f64 {
                    let x = x.abs();
                    if mode != "cubic" {
                        (1.0 - x).max(0.0)
                    } else if x <= 1.0 {
                        ((a_coef + 2.0) * x - (a_coef + 3.0)) * x * x + 1.0
                    } else if x < 2.0 {
                        ((a_coef * x - 5.0 * a_coef) * x + 8.0 * a_coef) * x - 4.0 * a_coef
                    } else {
                        0.0
                    }
                };
                let weights = |t: f64| -> Vec<f64> {
                    let w: Vec<f64> = taps.iter().map(|&k| kernel(s * (k as f64 - t))).collect();
                    let sum: f64 = w.iter().sum();
                    match antialias && sum != 0.0 {
                        true => w.iter().map(|x| x / sum).collect(),
                        false => w,
                    }
                };
                let mut idx = vec![Vec::with_capacity(coords.len()); taps.len()];
                let mut wts = vec![Vec::with_capacity(coords.len()); taps.len()];
                for &c in &coords {
                    let base = c.floor();
                    let mut w = weights(c - base);
                    let at_k = |k: usize| base as i64 + taps[k];
                    if exclude_outside {
                        for (k, wk) in w.iter_mut().enumerate() {
                            if at_k(k) < 0 || at_k(k) >= dims[a] as i64 {
                                *wk = 0.0;
                            }
                        }
                        let sum: f64 = w.iter().sum();
                        if sum != 0.0 {
                            w.iter_mut().for_each(|wk| *wk /= sum);
                        }
                    }
                    for k in 0..taps.len() {
                        idx[k].push(clamp(at_k(k) as f64));
                        wts[k].push(w[k]);
                    }
                }
                let weight = |me: &mut Self, w: Vec<f64>| -> R<ValueId> {
                    let c =
                        me.b.constant(TensorType::new(xt.dtype, vec![w.len()]), Attr::Floats(w))
                            .map_err(b)?;
                    me.b.broadcast(c, &[a as i64], &shape).map_err(b)
                };
                let mut sum: Option<ValueId> = None;
                for (i, w) in idx.into_iter().zip(wts) {
                    let g = gather(self, i)?;
                    let w = weight(self, w)?;
                    let term = self.ew(OpKind::Mul, &[g, w])?;
                    sum = Some(match sum {
                        Some(s) => self.ew(OpKind::Add, &[s, term])?,
                        None => term,
                    });
                }
                sum.expect("at least two neighbours")
            };
            // Outputs whose source is outside the input take the extrapolation value.
            let outside: Vec<bool> = coords
                .iter()
                .map(|&c| crop && (c < 0.0 || c > len - 1.0))
                .collect();
            if outside.contains(&true) {
                let per_axis = |me: &mut Self, w: Vec<f64>| -> R<ValueId> {
                    let c =
                        me.b.constant(TensorType::new(xt.dtype, vec![w.len()]), Attr::Floats(w))
                            .map_err(b)?;
                    me.b.broadcast(c, &[a as i64], &shape).map_err(b)
                };
                let keep = per_axis(
                    self,
                    outside.iter().map(|&o| f64::from(u8::from(!o))).collect(),
                )?;
                let extra = per_axis(
                    self,
                    outside
                        .iter()
                        .map(|&o| if o { extrapolation } else { 0.0 })
                        .collect(),
                )?;
                let kept = self.ew(OpKind::Mul, &[v, keep])?;
                v = self.ew(OpKind::Add, &[kept, extra])?;
            }
        }
        self.out(node, v)
    }

    /// `Attention` (opset 23), as ONNX's function body computes it: Q·Kᵀ
    /// scaled, plus the bias (a bool or float `attn_mask`, padded with -inf
    /// to the key length; a causal triangle with `is_causal`; -inf past a
    /// known `nonpad_kv_seqlen`), `softcap`, softmax over the keys, ·V.
    /// 3-D inputs are split into `q_num_heads`/`kv_num_heads` heads; the
    /// key and value caches (`past_key`/`past_value`) are concatenated before
    /// the new ones and returned as `present_*`; fewer key heads than query
    /// heads repeat each key head (grouped-query attention);
    /// `qk_matmul_output_mode` picks which scores the fourth output returns.
    pub(super) fn attention(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        use OpKind as K;
        let (mut q, mut k, mut v) = (
            self.ir_in(node, 0)?,
            self.ir_in(node, 1)?,
            self.ir_in(node, 2)?,
        );
        let dtype = self.b.ty(q).dtype;
        if !dtype.is_float() {
            return Err(format!(
                "Attention of {}: needs a float input",
                self.b.ty(q)
            ));
        }
        let rank = self.b.ty(q).rank();
        if [k, v].iter().any(|&x| self.b.ty(x).rank() != rank) {
            return Err(format!(
                "Attention of {}, {} and {}: Q, K and V must have one rank",
                self.b.ty(q),
                self.b.ty(k),
                self.b.ty(v)
            ));
        }
        let three_d = rank == 3;
        if three_d {
            let heads = |name: &str| {
                at.int(name)
                    .filter(|&h| h > 0)
                    .map(|h| h as usize)
                    .ok_or_else(|| format!("Attention of 3-D inputs needs `{name}`"))
            };
            let (hq, hkv) = (heads("q_num_heads")?, heads("kv_num_heads")?);
            let split = |me: &mut Self, x: ValueId, h: usize| -> R<ValueId> {
                let d = me.b.ty(x).dims().to_vec();
                if !d[2].is_multiple_of(h) {
                    return Err(format!(
                        "Attention: hidden size {} is not a multiple of {h} heads",
                        d[2]
                    ));
                }
                let r = me.b.reshape(x, &[d[0], d[1], h, d[2] / h]).map_err(b)?;
                me.b.op(
                    K::Transpose,
                    &[r],
                    Attrs::new().with("perm", ints(&[0, 2, 1, 3])),
                )
                .map_err(b)
            };
            q = split(self, q, hq)?;
            k = split(self, k, hkv)?;
            v = split(self, v, hkv)?;
        } else if rank != 4 {
            return Err(format!("Attention of rank-{rank} inputs (3-D or 4-D are)"));
        }
        // The caches, then the new keys and values.
        let mut past_len = 0;
        for (i, x) in [(4, &mut k), (5, &mut v)] {
            if self.get(node, i)?.is_some() {
                let past = self.ir_in(node, i)?;
                if self.b.ty(past).rank() != 4 {
                    return Err(format!("Attention cache {} is not 4-D", self.b.ty(past)));
                }
                if i == 4 {
                    past_len = self.b.ty(past).dims()[2];
                }
                *x = self
                    .b
                    .op(
                        K::Concat,
                        &[past, *x],
                        Attrs::new().with("axis", Attr::Int(2)),
                    )
                    .map_err(b)?;
            }
        }
        let (present_k, present_v) = (k, v);
        let qd = self.b.ty(q).dims().to_vec();
        let kd = self.b.ty(k).dims().to_vec();
        let (batch, hq, s, d) = (qd[0], qd[1], qd[2], qd[3]);
        let (hkv, t) = (kd[1], kd[2]);
        // Grouped-query attention: key head j serves query heads j·r .. j·r + r.
        if hq != hkv {
            if hkv == 0 || !hq.is_multiple_of(hkv) {
                return Err(format!("Attention: {hq} query heads over {hkv} key heads"));
            }
            let r = hq / hkv;
            for x in [&mut k, &mut v] {
                let xd = self.b.ty(*x).dims().to_vec();
                let one = self
                    .b
                    .reshape(*x, &[xd[0], xd[1], 1, xd[2], xd[3]])
                    .map_err(b)?;
                let wide = self
                    .b
                    .broadcast(one, &[0, 1, 2, 3, 4], &[xd[0], xd[1], r, xd[2], xd[3]])
                    .map_err(b)?;
                *x = self
                    .b
                    .reshape(wide, &[xd[0], hq, xd[2], xd[3]])
                    .map_err(b)?;
            }
        }
        let shape = [batch, hq, s, t];
        let scale = at.float("scale").map_or(1.0 / (d as f64).sqrt(), f64::from);
        let qk = self
            .b
            .op(
                K::Matmul,
                &[q, k],
                Attrs::new().with("transpose_b", Attr::Bool(true)),
            )
            .map_err(b)?;
        let factor = self.splat(dtype, scale, &shape)?;
        let scores = self.ew(K::Mul, &[qk, factor])?;
        // The bias: the mask (bool: 0 or -inf; padded with -inf to `t` keys),
        // the causal triangle, the padding past each batch's key count.
        let mut bias: Option<ValueId> = None;
        if self.get(node, 3)?.is_some() {
            let m = self.ir_in(node, 3)?;
            let mut m = if self.b.ty(m).dtype == DType::Bool {
                let zero = self.splat_like(m, 0.0)?;
                let zero = self.b.cast(zero, dtype).map_err(b)?;
                let dims = self.b.ty(m).dims().to_vec();
                let ninf = self.splat(dtype, f64::NEG_INFINITY, &dims)?;
                self.b
                    .op(K::Select, &[m, zero, ninf], Attrs::new())
                    .map_err(b)?
            } else {
                m
            };
            let md = self.b.ty(m).dims().to_vec();
            let last = *md.last().ok_or("Attention: a rank-0 mask")?;
            if last < t {
                let mut high = vec![0i64; md.len()];
                high[md.len() - 1] = (t - last) as i64;
                let attrs = Attrs::new()
                    .with("low", ints(&vec![0; md.len()]))
                    .with("high", Attr::Ints(high))
                    .with("value", Attr::Float(f64::NEG_INFINITY));
                m = self.b.op(K::Pad, &[m], attrs).map_err(b)?;
            }
            bias = Some(self.broadcast_to(m, &shape)?);
        }
        let mut add_bias = |me: &mut Self, extra: ValueId| -> R<()> {
            let extra = me.broadcast_to(extra, &shape)?;
            bias = Some(match bias {
                Some(bv) => me.ew(K::Add, &[bv, extra])?,
                None => extra,
            });
            Ok(())
        };
        if at.int_or("is_causal", 0) != 0 {
            let tri: Vec<f64> = (0..s)
                .flat_map(|i| {
                    (0..t).map(move |j| {
                        if j > i + past_len {
                            f64::NEG_INFINITY
                        } else {
                            0.0
                        }
                    })
                })
                .collect();
            let c = self
                .b
                .constant(TensorType::new(dtype, vec![s, t]), Attr::Floats(tri))
                .map_err(b)?;
            add_bias(self, c)?;
        }
        if self.get(node, 6)?.is_some() {
            let lens = self
                .const_in(node, 6)?
                .ok_or("Attention: nonpad_kv_seqlen")?
                .to_f64();
            if lens.len() != batch {
                return Err(format!(
                    "Attention: nonpad_kv_seqlen has {} values for {batch} batches",
                    lens.len()
                ));
            }
            let pad: Vec<f64> = lens
                .iter()
                .flat_map(|&n| {
                    (0..t).map(move |j| {
                        if (j as f64) < n {
                            0.0
                        } else {
                            f64::NEG_INFINITY
                        }
                    })
                })
                .collect();
            let c = self
                .b
                .constant(
                    TensorType::new(dtype, vec![batch, 1, 1, t]),
                    Attr::Floats(pad),
                )
                .map_err(b)?;
            add_bias(self, c)?;
        }
        let with_bias = match bias {
            Some(bv) => self.ew(K::Add, &[scores, bv])?,
            None => scores,
        };
        let capped = match at.float("softcap").map(f64::from) {
            Some(c) if c > 0.0 => {
                let inv = self.splat(dtype, 1.0 / c, &shape)?;
                let cap = self.splat(dtype, c, &shape)?;
                let x = self.ew(K::Mul, &[with_bias, inv])?;
                let x = self.ew(K::Tanh, &[x])?;
                self.ew(K::Mul, &[x, cap])?
            }
            _ => with_bias,
        };
        let p = self
            .b
            .op(
                K::Softmax,
                &[capped],
                Attrs::new().with("axis", Attr::Int(3)),
            )
            .map_err(b)?;
        let mut y = self.b.op(K::Matmul, &[p, v], Attrs::new()).map_err(b)?;
        if three_d {
            let yt = self
                .b
                .op(
                    K::Transpose,
                    &[y],
                    Attrs::new().with("perm", ints(&[0, 2, 1, 3])),
                )
                .map_err(b)?;
            let yd = self.b.ty(yt).dims().to_vec();
            y = self
                .b
                .reshape(yt, &[yd[0], yd[1], yd[2] * yd[3]])
                .map_err(b)?;
        }
        let qk_out = match at.int_or("qk_matmul_output_mode", 0) {
            0 => scores,
            1 => with_bias,
            2 => capped,
            3 => p,
            other => {
                return Err(format!(
                    "Attention qk_matmul_output_mode {other} is not one of 0..3"
                ));
            }
        };
        self.set(node, 0, Val::Ir(y))?;
        self.set(node, 1, Val::Ir(present_k))?;
        self.set(node, 2, Val::Ir(present_v))?;
        self.set(node, 3, Val::Ir(qk_out))
    }

    /// `RotaryEmbedding` (opset 23): the first `rotary_embedding_dim` dims
    /// of each head rotated by (cos, sin) pairs, gathered from the caches by
    /// `position_ids` (or given per batch and position); halves
    /// (`x1 = x[..half]`) or, `interleaved`, even and odd elements. 4-D input
    /// is `[batch, heads, seq, head]`, 3-D `[batch, seq, heads · head]` with
    /// `num_heads`.
    pub(super) fn rotary_embedding(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        use OpKind as K;
        let x = self.ir_in(node, 0)?;
        let xt = self.b.ty(x).clone();
        let dtype = xt.dtype;
        if !dtype.is_float() {
            return Err(format!("RotaryEmbedding of {xt}: needs a float input"));
        }
        let perm = |me: &mut Self, v: ValueId, p: &[usize]| -> R<ValueId> {
            me.b.op(K::Transpose, &[v], Attrs::new().with("perm", ints(p)))
                .map_err(b)
        };
        // [batch, seq, heads, head]
        let x4 = match xt.rank() {
            4 => perm(self, x, &[0, 2, 1, 3])?,
            3 => {
                let d = xt.dims();
                let heads = at
                    .int("num_heads")
                    .filter(|&h| h > 0)
                    .map(|h| h as usize)
                    .ok_or("RotaryEmbedding of a 3-D input needs `num_heads`".to_string())?;
                if !d[2].is_multiple_of(heads) {
                    return Err(format!(
                        "RotaryEmbedding: hidden size {} over {heads} heads",
                        d[2]
                    ));
                }
                self.b
                    .reshape(x, &[d[0], d[1], heads, d[2] / heads])
                    .map_err(b)?
            }
            r => {
                return Err(format!(
                    "RotaryEmbedding of a rank-{r} input (3-D or 4-D are)"
                ));
            }
        };
        let [n, s, h, d] = <[usize; 4]>::try_from(self.b.ty(x4).dims()).map_err(|_| "rank 4")?;
        let rot = match at.int_or("rotary_embedding_dim", 0) {
            0 => d,
            r if r > 0 && (r as usize) <= d && r % 2 == 0 => r as usize,
            r => {
                return Err(format!(
                    "RotaryEmbedding: rotary_embedding_dim {r} for heads of {d}"
                ));
            }
        };
        let half = rot / 2;
        let slice = |me: &mut Self, v: ValueId, lo: usize, hi: usize| -> R<ValueId> {
            let dims = me.b.ty(v).dims().to_vec();
            let last = dims.len() - 1;
            let starts: Vec<usize> = (0..dims.len())
                .map(|i| if i == last { lo } else { 0 })
                .collect();
            let ends: Vec<usize> = (0..dims.len())
                .map(|i| if i == last { hi } else { dims[i] })
                .collect();
            let attrs = Attrs::new()
                .with("starts", ints(&starts))
                .with("ends", ints(&ends));
            me.b.op(K::Slice, &[v], attrs).map_err(b)
        };
        // cos and sin: [batch, seq, half], then over the heads.
        let mut cs = Vec::new();
        for i in [1, 2] {
            let cache = self.ir_in(node, i)?;
            let c = if self.get(node, 3)?.is_some() {
                let pos = self.ir_in(node, 3)?;
                self.b
                    .op(
                        K::Gather,
                        &[cache, pos],
                        Attrs::new().with("axis", Attr::Int(0)),
                    )
                    .map_err(b)?
            } else {
                cache
            };
            if self.b.ty(c).dims() != [n, s, half] {
                return Err(format!(
                    "RotaryEmbedding: the cos/sin values are {}, expected [{n}, {s}, {half}]",
                    self.b.ty(c)
                ));
            }
            let c = self.b.reshape(c, &[n, s, 1, half]).map_err(b)?;
            cs.push(
                self.b
                    .broadcast(c, &[0, 1, 2, 3], &[n, s, h, half])
                    .map_err(b)?,
            );
        }
        let (cos, sin) = (cs[0], cs[1]);
        let x_rot = if rot == d {
            x4
        } else {
            slice(self, x4, 0, rot)?
        };
        let interleaved = at.int_or("interleaved", 0) != 0;
        let (x1, x2) = if interleaved {
            let pairs = self.b.reshape(x_rot, &[n, s, h, half, 2]).map_err(b)?;
            let even = slice(self, pairs, 0, 1)?;
            let odd = slice(self, pairs, 1, 2)?;
            (
                self.b.reshape(even, &[n, s, h, half]).map_err(b)?,
                self.b.reshape(odd, &[n, s, h, half]).map_err(b)?,
            )
        } else {
            (slice(self, x_rot, 0, half)?, slice(self, x_rot, half, rot)?)
        };
        let (c1, s2) = (self.ew(K::Mul, &[cos, x1])?, self.ew(K::Mul, &[sin, x2])?);
        let real = self.ew(K::Sub, &[c1, s2])?;
        let (s1, c2) = (self.ew(K::Mul, &[sin, x1])?, self.ew(K::Mul, &[cos, x2])?);
        let imag = self.ew(K::Add, &[s1, c2])?;
        let rotated = if interleaved {
            let r = self.b.reshape(real, &[n, s, h, half, 1]).map_err(b)?;
            let i = self.b.reshape(imag, &[n, s, h, half, 1]).map_err(b)?;
            let pairs = self
                .b
                .op(K::Concat, &[r, i], Attrs::new().with("axis", Attr::Int(4)))
                .map_err(b)?;
            self.b.reshape(pairs, &[n, s, h, rot]).map_err(b)?
        } else {
            self.b
                .op(
                    K::Concat,
                    &[real, imag],
                    Attrs::new().with("axis", Attr::Int(3)),
                )
                .map_err(b)?
        };
        let out4 = if rot == d {
            rotated
        } else {
            let rest = slice(self, x4, rot, d)?;
            self.b
                .op(
                    K::Concat,
                    &[rotated, rest],
                    Attrs::new().with("axis", Attr::Int(3)),
                )
                .map_err(b)?
        };
        let y = match xt.rank() {
            4 => perm(self, out4, &[0, 2, 1, 3])?,
            _ => self.b.reshape(out4, xt.dims()).map_err(b)?,
        };
        self.out(node, y)
    }

    /// `ConvTranspose` (1-D and 2-D) as a `conv2d`: the input spread by the
    /// strides (zeros between its elements: `reshape`, `pad`, `reshape`,
    /// `slice`), padded by `(k - 1) · dilation` on every side, convolved
    /// with the weights flipped in space and swapped in and out per group;
    /// the result is then the window `[pad_begin, pad_begin + out)` of that
    /// full output (zeros past it), `out` from `output_shape`, or the pads
    /// and `output_padding`, or `auto_pad`, as ONNX's reference computes
    /// them; the bias is added per channel.
    pub(super) fn conv_transpose(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        use OpKind as K;
        let (x, xt, n, w, wd) = self.conv_operands(node)?;
        if !xt.dtype.is_float() {
            return Err(format!(
                "ConvTranspose of {xt}: only float inputs are supported"
            ));
        }
        let group = at.int_or("group", 1).max(1) as usize;
        let c = xt.dims()[1];
        if wd[0] != c || !c.is_multiple_of(group) {
            return Err(format!(
                "ConvTranspose: weight {wd:?} for {c} channels in {group} groups"
            ));
        }
        let list = |name: &str, d: i64, len: usize| -> R<Vec<i64>> {
            let v = at.ints(name).map_or_else(|| vec![d; len], <[i64]>::to_vec);
            match v.len() == len && v.iter().all(|&x| x >= 0) {
                true => Ok(v),
                false => Err(format!("ConvTranspose `{name}` {v:?} for {n}-D")),
            }
        };
        let kernel: Vec<i64> = wd[2..].iter().map(|&k| k as i64).collect();
        let stride = list("strides", 1, n)?;
        let dilation = list("dilations", 1, n)?;
        let out_pad = list("output_padding", 0, n)?;
        if stride.contains(&0) || dilation.contains(&0) {
            return Err("ConvTranspose strides and dilations must be positive".into());
        }
        let input: Vec<i64> = xt.dims()[2..].iter().map(|&d| d as i64).collect();
        if input.contains(&0) || kernel.contains(&0) {
            return Err(format!(
                "ConvTranspose of {xt} with kernel {kernel:?}: an empty extent"
            ));
        }
        // The full output's extent per axis, and ONNX's output window.
        let full: Vec<i64> = (0..n)
            .map(|i| stride[i] * (input[i] - 1) + (kernel[i] - 1) * dilation[i] + 1)
            .collect();
        let given_shape = at
            .ints("output_shape")
            .map(|s| s[s.len().saturating_sub(n)..].to_vec());
        let auto = at.string("auto_pad").unwrap_or_default();
        let (begin, size): (Vec<i64>, Vec<i64>) = match at.ints("pads") {
            Some(p) if p.len() == 2 * n => (
                p[..n].to_vec(),
                (0..n)
                    .map(|i| {
                        given_shape
                            .as_ref()
                            .map_or(full[i] + out_pad[i] - p[i] - p[i + n], |s| s[i])
                    })
                    .collect(),
            ),
            Some(p) => return Err(format!("ConvTranspose pads {p:?} for {n}-D")),
            None if auto == "SAME_UPPER" || auto == "SAME_LOWER" => {
                let shape =
                    given_shape.unwrap_or_else(|| (0..n).map(|i| input[i] * stride[i]).collect());
                let begin = (0..n)
                    .map(|i| {
                        let total = full[i] + out_pad[i] - shape[i];
                        if auto == "SAME_UPPER" {
                            total.div_euclid(2)
                        } else {
                            total - total.div_euclid(2)
                        }
                    })
                    .collect();
                (begin, shape)
            }
            None => (
                vec![0; n],
                (0..n)
                    .map(|i| given_shape.as_ref().map_or(full[i] + out_pad[i], |s| s[i]))
                    .collect(),
            ),
        };
        if size.iter().any(|&s| s <= 0 || s > MAX_RESIZED_DIM as i64) {
            return Err(format!(
                "ConvTranspose output extents {size:?}: each must be in 1..={MAX_RESIZED_DIM}"
            ));
        }
        // As 2-D: a 1-D transposed convolution has a height of 1.
        let (x, w, kernel, stride, dilation, begin, size, full) = if n == 1 {
            let d = xt.dims();
            (
                self.b.reshape(x, &[d[0], d[1], 1, d[2]]).map_err(b)?,
                self.b.reshape(w, &[wd[0], wd[1], 1, wd[2]]).map_err(b)?,
                vec![1, kernel[0]],
                vec![1, stride[0]],
                vec![1, dilation[0]],
                vec![0, begin[0]],
                vec![1, size[0]],
                vec![1, full[0]],
            )
        } else {
            (x, w, kernel, stride, dilation, begin, size, full)
        };
        let d = self.b.ty(x).dims().to_vec();
        let (nb, h, wi) = (d[0], d[2], d[3]);
        // Spread by the strides: [N, C, H, 1, W, 1] padded to [N, C, H, sh, W, sw].
        let (sh, sw) = (stride[0] as usize, stride[1] as usize);
        let spread = if sh == 1 && sw == 1 {
            x
        } else {
            let r = self.b.reshape(x, &[nb, c, h, 1, wi, 1]).map_err(b)?;
            let attrs = Attrs::new()
                .with("low", ints(&[0, 0, 0, 0, 0, 0]))
                .with("high", ints(&[0, 0, 0, sh - 1, 0, sw - 1]))
                .with("value", Attr::Float(0.0));
            let p = self.b.op(K::Pad, &[r], attrs).map_err(b)?;
            let flat = self.b.reshape(p, &[nb, c, h * sh, wi * sw]).map_err(b)?;
            let attrs = Attrs::new()
                .with("starts", ints(&[0, 0, 0, 0]))
                .with("ends", ints(&[nb, c, (h - 1) * sh + 1, (wi - 1) * sw + 1]));
            self.b.op(K::Slice, &[flat], attrs).map_err(b)?
        };
        // Weights [C, O/g, kh, kw] → [O, C/g, kh, kw], flipped in space.
        let (cg, og) = (c / group, wd[1]);
        let (kh, kw) = (kernel[0] as usize, kernel[1] as usize);
        let wg = self.b.reshape(w, &[group, cg, og, kh, kw]).map_err(b)?;
        let wt = self
            .b
            .op(
                K::Transpose,
                &[wg],
                Attrs::new().with("perm", ints(&[0, 2, 1, 3, 4])),
            )
            .map_err(b)?;
        let mut wf = self.b.reshape(wt, &[group * og, cg, kh, kw]).map_err(b)?;
        for (axis, k) in [(2, kh), (3, kw)] {
            if k > 1 {
                let rev: Vec<i64> = (0..k as i64).rev().collect();
                let idx = self
                    .b
                    .constant(TensorType::new(DType::I64, vec![k]), Attr::Ints(rev))
                    .map_err(b)?;
                wf = self
                    .b
                    .op(
                        K::Gather,
                        &[wf, idx],
                        Attrs::new().with("axis", Attr::Int(axis)),
                    )
                    .map_err(b)?;
            }
        }
        let (ph, pw) = ((kernel[0] - 1) * dilation[0], (kernel[1] - 1) * dilation[1]);
        let attrs = Attrs::new()
            .with("stride", Attr::Ints(vec![1, 1]))
            .with("pad", Attr::Ints(vec![ph, pw, ph, pw]))
            .with("dilation", Attr::Ints(dilation.clone()))
            .with("groups", Attr::Int(group as i64));
        let mut v = self.b.op(K::Conv2d, &[spread, wf], attrs).map_err(b)?;
        // The output window [begin, begin + size) of the full output, zeros past it.
        let low: Vec<i64> = (0..2).map(|i| (-begin[i]).max(0)).collect();
        let high: Vec<i64> = (0..2)
            .map(|i| (begin[i] + size[i] - full[i]).max(0))
            .collect();
        if low.iter().chain(&high).any(|&p| p > 0) {
            let attrs = Attrs::new()
                .with("low", ints(&[0, 0, low[0] as usize, low[1] as usize]))
                .with("high", ints(&[0, 0, high[0] as usize, high[1] as usize]))
                .with("value", Attr::Float(0.0));
            v = self.b.op(K::Pad, &[v], attrs).map_err(b)?;
        }
        let o = group * og;
        let start: Vec<usize> = (0..2).map(|i| (begin[i] + low[i]) as usize).collect();
        let vd = self.b.ty(v).dims().to_vec();
        if start != [0, 0] || vd[2] != size[0] as usize || vd[3] != size[1] as usize {
            let attrs = Attrs::new()
                .with("starts", ints(&[0, 0, start[0], start[1]]))
                .with(
                    "ends",
                    ints(&[
                        nb,
                        o,
                        start[0] + size[0] as usize,
                        start[1] + size[1] as usize,
                    ]),
                );
            v = self.b.op(K::Slice, &[v], attrs).map_err(b)?;
        }
        if n == 1 {
            let d = self.b.ty(v).dims().to_vec();
            v = self.b.reshape(v, &[d[0], d[1], d[3]]).map_err(b)?;
        }
        if let Some(bias) = self.get(node, 2)? {
            let out = self.b.ty(v).dims().to_vec();
            let bias = self.operand(Self::in_name(node, 2), &bias, xt.dtype, &[out[1]])?;
            let bb = self.b.broadcast(bias, &[1], &out).map_err(b)?;
            v = self.ew(K::Add, &[v, bb])?;
        }
        self.out(node, v)
    }

    /// `LogSoftmax` as `x - max - log(sum(exp(x - max)))`; `Hardmax` as 1
    /// at the first maximum along the axis, 0 elsewhere. Before opset 13
    /// the input is seen as 2-D, the dims from `axis` flattened.
    pub(super) fn log_softmax_or_hardmax(
        &mut self,
        node: &'m NodeProto,
        op: &str,
        at: &At<'_>,
    ) -> R<()> {
        use OpKind as K;
        let x = self.ir_in(node, 0)?;
        let dims = self.b.ty(x).dims().to_vec();
        let rank = dims.len();
        let default = if self.opset >= 13 { -1 } else { 1 };
        let mut a = axis(at.int_or("axis", default), rank)?;
        let flat = self.opset < 13 && a + 1 != rank;
        let src = if flat {
            let rows = dims[..a].iter().product();
            let cols = dims[a..].iter().product();
            a = 1;
            self.b.reshape(x, &[rows, cols]).map_err(b)?
        } else {
            x
        };
        let sdims = self.b.ty(src).dims().to_vec();
        let reduce = |me: &mut Self, kind: OpKind, v: ValueId| -> R<ValueId> {
            let attrs = Attrs::new()
                .with("axes", ints(&[a]))
                .with("keepdims", Attr::Bool(true));
            let r = me.b.op(kind, &[v], attrs).map_err(b)?;
            me.broadcast_to(r, &sdims)
        };
        let v = if op == "LogSoftmax" {
            let m = reduce(self, K::ReduceMax, src)?;
            let d = self.ew(K::Sub, &[src, m])?;
            let e = self.ew(K::Exp, &[d])?;
            let s = reduce(self, K::ReduceSum, e)?;
            let l = self.ew(K::Log, &[s])?;
            self.ew(K::Sub, &[d, l])?
        } else {
            let first = self.first_max_index(src, src, a, true, false)?;
            let first = self.broadcast_to(first, &sdims)?;
            let iota = self.ramp(&sdims, a)?;
            let hot = self.ew(K::Equal, &[iota, first])?;
            let dtype = self.b.ty(src).dtype;
            let (one, zero) = (
                self.splat(dtype, 1.0, &sdims)?,
                self.splat(dtype, 0.0, &sdims)?,
            );
            self.ew(K::Select, &[hot, one, zero])?
        };
        let v = if flat {
            self.b.reshape(v, &dims).map_err(b)?
        } else {
            v
        };
        self.out(node, v)
    }

    /// `RMSNormalization`: `x / sqrt(mean(x²) + epsilon) · scale` over the
    /// dims from `axis`, the scale broadcast to them.
    pub(super) fn rms_norm(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        use OpKind as K;
        let x = self.ir_in(node, 0)?;
        let xt = self.b.ty(x).clone();
        let dims = xt.dims().to_vec();
        let a = axis(at.int_or("axis", -1), dims.len())?;
        let eps = f64::from(at.float("epsilon").unwrap_or(1e-5));
        let axes: Vec<usize> = (a..dims.len()).collect();
        let sq = self.ew(K::Mul, &[x, x])?;
        let attrs = Attrs::new()
            .with("axes", ints(&axes))
            .with("keepdims", Attr::Bool(true));
        let ms = self.b.op(K::ReduceMean, &[sq], attrs).map_err(b)?;
        let e = self.splat_like(ms, eps)?;
        let mse = self.ew(K::Add, &[ms, e])?;
        let inv = self.ew(K::Rsqrt, &[mse])?;
        let inv = self.broadcast_to(inv, &dims)?;
        let normed = self.ew(K::Mul, &[x, inv])?;
        let scale = self.req(node, 1)?;
        let scale = self.operand(Self::in_name(node, 1), &scale, xt.dtype, &dims)?;
        let v = self.ew(K::Mul, &[normed, scale])?;
        self.out(node, v)
    }

    /// `LayerNormalization`'s optional outputs, where used: the mean (1)
    /// and the reciprocal standard deviation (2) over the dims from `a`,
    /// those dims kept with extent 1.
    pub(super) fn layernorm_statistics(
        &mut self,
        node: &'m NodeProto,
        x: ValueId,
        a: usize,
        eps: f64,
    ) -> R<()> {
        use OpKind as K;
        let wanted = |k: usize| {
            node.output
                .get(k)
                .is_some_and(|n| !n.is_empty() && self.used.contains(n.as_str()))
        };
        let (mean_wanted, inv_wanted) = (wanted(1), wanted(2));
        if !mean_wanted && !inv_wanted {
            return Ok(());
        }
        let dims = self.b.ty(x).dims().to_vec();
        let axes: Vec<usize> = (a..dims.len()).collect();
        let mean_of = |me: &mut Self, v: ValueId| -> R<ValueId> {
            let attrs = Attrs::new()
                .with("axes", ints(&axes))
                .with("keepdims", Attr::Bool(true));
            me.b.op(K::ReduceMean, &[v], attrs).map_err(b)
        };
        let mean = mean_of(self, x)?;
        self.set(node, 1, Val::Ir(mean))?;
        if inv_wanted {
            let m = self.broadcast_to(mean, &dims)?;
            let d = self.ew(K::Sub, &[x, m])?;
            let d2 = self.ew(K::Mul, &[d, d])?;
            let var = mean_of(self, d2)?;
            let e = self.splat_like(var, eps)?;
            let ve = self.ew(K::Add, &[var, e])?;
            let inv = self.ew(K::Rsqrt, &[ve])?;
            self.set(node, 2, Val::Ir(inv))?;
        }
        Ok(())
    }

    /// `OneHot(indices, depth, values)`: `values[1]` where the index (negative
    /// ones counted from `depth`) equals a constant ramp along the new axis,
    /// `values[0]` elsewhere. `depth` and `values` known.
    pub(super) fn one_hot(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        use OpKind as K;
        let idx = self.ir_in(node, 0)?;
        let depth = self
            .const_in(node, 1)?
            .and_then(|c| c.scalar_f64())
            .ok_or("OneHot needs a one-element depth")?;
        let values = self.const_in(node, 2)?.ok_or("OneHot needs its values")?;
        if depth < 1.0 || values.len() != 2 {
            return Err(format!(
                "OneHot needs depth >= 1 and two values, found {depth} and {} values",
                values.len()
            ));
        }
        let depth = depth as usize;
        let it = self.b.ty(idx).clone();
        let mut dims = it.dims().to_vec();
        let a = axis(at.int_or("axis", -1), dims.len() + 1)?;
        dims.insert(a, depth);
        // Indices as i64, negative ones wrapped once.
        let idx = if it.dtype == DType::I64 {
            idx
        } else {
            self.b.cast(idx, DType::I64).map_err(b)?
        };
        let zero = self.splat_like(idx, 0.0)?;
        let negative = self.ew(K::Less, &[idx, zero])?;
        let d = self.splat_like(idx, depth as f64)?;
        let wrapped = self.ew(K::Add, &[idx, d])?;
        let idx = self.ew(K::Select, &[negative, wrapped, idx])?;
        let map: Vec<i64> = (0..dims.len() as i64).filter(|&d| d != a as i64).collect();
        let idx = self.b.broadcast(idx, &map, &dims).map_err(b)?;
        let ramp = self.ramp(&dims, a)?;
        let hot = self.ew(K::Equal, &[idx, ramp])?;
        let v = values.to_f64();
        let (off, on) = (
            self.splat(values.dtype, v[0], &dims)?,
            self.splat(values.dtype, v[1], &dims)?,
        );
        let out = self.ew(K::Select, &[hot, on, off])?;
        self.out(node, out)
    }

    /// `LpNormalization`: `x / (sum |x|^p)^(1/p)` along `axis`, `p` 1 or 2.
    pub(super) fn lp_normalization(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        use OpKind as K;
        let x = self.ir_in(node, 0)?;
        let dims = self.b.ty(x).dims().to_vec();
        let a = axis(at.int_or("axis", -1), dims.len())?;
        let p = at.int_or("p", 2);
        let term = match p {
            1 => self.ew(K::Abs, &[x])?,
            2 => self.ew(K::Mul, &[x, x])?,
            _ => {
                return Err(format!(
                    "LpNormalization with p = {p} (1 or 2 are supported)"
                ));
            }
        };
        let attrs = Attrs::new()
            .with("axes", ints(&[a]))
            .with("keepdims", Attr::Bool(true));
        let mut norm = self.b.op(K::ReduceSum, &[term], attrs).map_err(b)?;
        if p == 2 {
            norm = self.ew(K::Sqrt, &[norm])?;
        }
        let norm = self.broadcast_to(norm, &dims)?;
        let v = self.ew(K::Div, &[x, norm])?;
        self.out(node, v)
    }

    /// `LpPool` (2-D): `(sum over the window of |x|^p)^(1/p)`, the sum as an
    /// average pool that counts the padding, times the window size.
    pub(super) fn lp_pool(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        use OpKind as K;
        let x = self.ir_in(node, 0)?;
        let xt = self.b.ty(x).clone();
        let kernel = Self::window_attr(at, "kernel_shape", xt.rank().saturating_sub(2), 0)?;
        let p = at.int_or("p", 2);
        if p < 1 {
            return Err(format!("LpPool with p = {p}"));
        }
        let a = self.ew(K::Abs, &[x])?;
        let pv = self.splat_like(a, p as f64)?;
        let powered = if p == 1 {
            a
        } else {
            self.ew(K::Pow, &[a, pv])?
        };
        let mean = self.pool_nd(powered, at, false, true)?;
        let count = self.splat_like(mean, kernel.iter().product::<i64>() as f64)?;
        let sum = self.ew(K::Mul, &[mean, count])?;
        let v = if p == 1 {
            sum
        } else {
            let inv = self.splat_like(sum, 1.0 / p as f64)?;
            self.ew(K::Pow, &[sum, inv])?
        };
        self.out(node, v)
    }
}
