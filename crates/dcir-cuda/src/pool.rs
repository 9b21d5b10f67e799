//! The `pool` family: one `maxpool2d` or `avgpool2d` with an elementwise
//! prologue (computed per loaded element through the index maps) and an
//! elementwise epilogue.
//!
//! Each thread computes one output element per step of a grid-stride loop
//! over the output (`items` steps per thread); consecutive threads take
//! consecutive output columns, so the window loads of a warp coalesce and the
//! overlap of neighbouring windows is served by L1/L2. Where the group
//! stores the pooled value channels-last (its one use a transpose to NHWC,
//! the `channels-last` form, whose input is then an NHWC value read through
//! the inverse), the loop walks the NHWC order: consecutive threads take
//! consecutive channels, and loads and stores coalesce along them. The window is two
//! `#pragma unroll` loops over `ki`, `kj`; a tap that may fall into the
//! padding is loaded at clamped coordinates (always in bounds) and masked:
//! `-inf` for max (padding never wins), `0` for the average's sum. Max
//! propagates NaN (`dcir_max`), as the interpreter's. The average divides by
//! the taps inside the image (the window clipped to it) or, with
//! `count_include_pad`, by the whole window; the sum is in f32 (the
//! interpreter's in f64, within tolerance). An integer max is taken in
//! `long long`. The epilogue is applied to the
//! pooled value as in the elementwise family.
//!
//! The window geometry ([`Window`]) and the checks and helpers of per-output
//! epilogues here are shared with the direct convolutions (`depthwise.rs`).

use std::collections::BTreeSet;

use dcir_fusion::Reason;
use dcir_ir::{Attr, Attrs, OpId, OpKind, ValueId};

use super::{
    Accumulator, Combine, EmitError, Index, Lower, Reduced, attr_int, global_thread, grid_stride,
    params, store, yields,
};
use crate::kir::{
    BinOp, Expr, Kernel, Param, Stmt, Ty, add, bin, call, clamp, div, int, mul, rem, select, sub,
    unrolled, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// The geometry of a sliding window over the two innermost dims of an NCHW
/// tensor (a pooling op's, or a depthwise convolution's).
#[derive(Clone, Copy, Debug)]
pub(super) struct Window {
    /// Taps [kh, kw].
    pub kernel: [usize; 2],
    /// [sh, sw].
    pub stride: [usize; 2],
    /// Padding before the first row and column [top, left].
    pub pad: [usize; 2],
    /// [dh, dw].
    pub dilation: [usize; 2],
    /// Input [h, w].
    pub input: [usize; 2],
    /// Output [oh, ow].
    pub output: [usize; 2],
}

impl Window {
    /// The window of an op with `stride`, `pad` and `dilation` attributes
    /// (defaults where absent).
    pub fn new(attrs: &Attrs, kernel: [usize; 2], input: [usize; 2], output: [usize; 2]) -> Window {
        let pair = |name: &str, default: usize| -> [usize; 2] {
            match attrs.ints(name) {
                Some(v) if v.len() >= 2 => [v[0].max(0) as usize, v[1].max(0) as usize],
                _ => [default, default],
            }
        };
        Window {
            kernel,
            stride: pair("stride", 1),
            pad: pair("pad", 0),
            dilation: pair("dilation", 1),
            input,
            output,
        }
    }

    /// Whether some window along `axis` (0: rows, 1: columns) starts before
    /// the input, and whether some ends after it.
    pub fn leaves(&self, axis: usize) -> (bool, bool) {
        let last = (self.output[axis] as i64 - 1) * self.stride[axis] as i64
            + (self.kernel[axis] as i64 - 1) * self.dilation[axis] as i64
            - self.pad[axis] as i64;
        (self.pad[axis] > 0, last >= self.input[axis] as i64)
    }

    /// The input extent along `axis` the windows of `tile` consecutive outputs cover.
    pub fn span(&self, axis: usize, tile: usize) -> usize {
        (tile - 1) * self.stride[axis] + (self.kernel[axis] - 1) * self.dilation[axis] + 1
    }

    /// The input coordinate of tap `k` of the window of output `o` along `axis`.
    pub fn tap(&self, axis: usize, o: Expr, k: Expr) -> Expr {
        sub(
            add(
                mul(o, int(self.stride[axis] as i64)),
                mul(k, int(self.dilation[axis] as i64)),
            ),
            int(self.pad[axis] as i64),
        )
    }
}

/// `0 <= e && e < extent`, each half only where `e` may leave the range.
pub(super) fn in_range(e: &Expr, extent: usize, (low, high): (bool, bool)) -> Option<Expr> {
    let lo = low.then(|| bin(BinOp::Ge, e.clone(), int(0)));
    let hi = high.then(|| bin(BinOp::Lt, e.clone(), int(extent as i64)));
    match (lo, hi) {
        (Some(a), Some(b)) => Some(bin(BinOp::And, a, b)),
        (a, b) => a.or(b),
    }
}

/// `a && b` of optional conditions.
pub(super) fn and_opt(a: Option<Expr>, b: Option<Expr>) -> Option<Expr> {
    match (a, b) {
        (Some(a), Some(b)) => Some(bin(BinOp::And, a, b)),
        (a, b) => a.or(b),
    }
}

/// `e` clamped into `[0, extent)` on the sides where it may leave it.
pub(super) fn clamp_to(e: Expr, extent: usize, (low, high): (bool, bool)) -> Expr {
    match (low, high) {
        (true, true) => clamp(e, 0, extent as i64 - 1),
        (true, false) => call("max", vec![e, int(0)]),
        (false, true) => call("min", vec![e, int(extent as i64 - 1)]),
        (false, false) => e,
    }
}

/// The values of group `op` computed from `anchor` (itself included),
/// checking that every op on the way keeps to one element: elementwise
/// math, casts, batchnorm of it, reshapes. The results of `stop` (a later
/// anchor) are not followed. `what` names the anchor in errors.
pub(super) fn per_element_after(
    l: &Lower,
    op: OpId,
    anchor: ValueId,
    stop: Option<OpId>,
    what: &str,
) -> Result<BTreeSet<ValueId>> {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    let mut tainted = BTreeSet::from([anchor]);
    for &o in &g.block(region).ops {
        let data = g.op(o);
        if Some(o) == stop
            || data.kind == OpKind::Yield
            || !data.operands.iter().any(|v| tainted.contains(v))
        {
            continue;
        }
        let ok = data.kind.is_elementwise()
            || matches!(data.kind, OpKind::Cast | OpKind::Reshape)
            || (data.kind == OpKind::Batchnorm
                && !data.operands[1..].iter().any(|v| tainted.contains(v)));
        if !ok {
            return Err(l.unsupported(Reason::Op {
                op: data.kind,
                place: format!(
                    "after the {what} (only elementwise, batchnorm, cast and reshape epilogues)"
                ),
            }));
        }
        tainted.extend(data.results.iter().copied());
    }
    Ok(tainted)
}

/// The results of group `op`, each computed and stored at the linear index
/// of the anchor's output element a thread holds: any value with `total`
/// elements qualifies (the anchor's epilogue, a reshape of it, or a
/// broadcast parameter the group also yields).
pub(super) fn per_output_results(l: &Lower, op: OpId, total: usize) -> Result<Vec<ValueId>> {
    let ys = yields(l.g, op);
    if ys.iter().any(|&y| l.g.ty(y).num_elements() != Some(total)) {
        return Err(l.unsupported("a result with fewer or more elements than the output"));
    }
    Ok(ys)
}

/// The index of element `linear` of result `y`: with `coords` when `y` has
/// the anchor's dims `dims`, else (a reshape of it) from the linear index.
pub(super) fn result_index(
    l: &Lower,
    y: ValueId,
    dims: &[usize],
    linear: Expr,
    coords: Vec<Expr>,
) -> Index {
    let y_dims = l.g.ty(y).dims().to_vec();
    let coords = (y_dims == dims).then_some(coords);
    Index {
        dims: y_dims,
        linear: Some(linear),
        coords,
    }
}

/// Binds `value` to a new `const int name` unless it is a literal or a variable.
pub(super) fn bind_int(body: &mut Vec<Stmt>, name: &str, value: Expr) -> Expr {
    if matches!(value, Expr::Int(_) | Expr::Var(_)) {
        return value;
    }
    body.push(Stmt::Let {
        name: name.into(),
        ty: Ty::I32,
        value,
        constant: true,
    });
    var(name)
}

/// Removes the `const` lets of `names` (in this order) from `body` where no
/// later statement reads them.
fn drop_unread(body: &mut Vec<Stmt>, names: &[&str]) {
    for name in names {
        let defined = body
            .iter()
            .position(|s| matches!(s, Stmt::Let { name: n, .. } if n == name));
        if let Some(at) = defined
            && !body[at + 1..].iter().any(|s| s.reads(name))
        {
            body.remove(at);
        }
    }
}

/// Lowers a `pool` group.
pub(super) fn pool(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    for name in [
        "i", "j", "ox", "oy", "plane", "n", "c", "ki", "kj", "iy", "ix", "acc",
    ] {
        l.used_names.insert(name.into());
    }
    let params = params(l, op);
    let region = g.op(op).region.expect("a fused op has a region");
    let pools: Vec<OpId> = g
        .block(region)
        .ops
        .iter()
        .copied()
        .filter(|&o| matches!(g.op(o).kind, OpKind::Maxpool2d | OpKind::Avgpool2d))
        .collect();
    let [p] = pools[..] else {
        return Err(l.unsupported(Reason::Count {
            what: "pooling ops",
            found: pools.len(),
        }));
    };
    let data = g.op(p);
    let maxpool = data.kind == OpKind::Maxpool2d;
    let (x, pooled) = (data.operands[0], data.results[0]);
    let dtype = g.ty(pooled).dtype;
    let (x_dims, out_dims) = (g.ty(x).dims().to_vec(), g.ty(pooled).dims().to_vec());
    // Maximum over integers in `long long` (the verifier allows no integer average).
    let how = Accumulator {
        combine: if maxpool { Combine::Max } else { Combine::Sum },
        dtype,
    };
    let (&[_, c, h, w], &[n, _, oh, ow]) = (&x_dims[..], &out_dims[..]) else {
        return Err(l.unsupported("a pool whose input is not NCHW"));
    };
    let kernel = match data.attrs.ints("kernel") {
        Some(&[kh, kw]) if kh > 0 && kw > 0 => [kh as usize, kw as usize],
        _ => return Err(l.unsupported("a pool without a [kh, kw] kernel")),
    };
    let win = Window::new(&data.attrs, kernel, [h, w], [oh, ow]);
    let count_pad = !maxpool && data.attrs.get("count_include_pad") == Some(&Attr::Bool(true));
    let nhwc = channels_last_result(l, op, pooled);
    let tainted = per_element_after(l, op, nhwc.unwrap_or(pooled), None, data.kind.name())?;
    let total = n * c * oh * ow;
    // Results with an element per pooled element are stored by the pooling
    // loop; others (a prologue value the group also yields) by a loop of their own.
    let outputs: Vec<(Param, ValueId)> = params
        .iter()
        .filter(|p| p.output)
        .cloned()
        .zip(yields(g, op))
        .collect();
    let (per_pooled, others): (Vec<_>, Vec<_>) = outputs
        .into_iter()
        .partition(|(_, y)| g.ty(*y).num_elements() == Some(total));
    if others.iter().any(|(_, y)| tainted.contains(y)) {
        return Err(l.unsupported("a result of another shape computed from the pooled value"));
    }
    let largest = others
        .iter()
        .filter_map(|(_, y)| g.ty(*y).num_elements())
        .chain([total, x_dims.iter().product()])
        .max();
    if largest.unwrap_or(0) >= i32::MAX as usize {
        return Err(l.unsupported(Reason::TooLarge));
    }
    if total == 0 {
        return Err(l.unsupported(Reason::Empty));
    }
    let threads = attr_int(g, op, "threads", 256).clamp(32, 1024) as usize;
    let items = attr_int(g, op, "items", 1).clamp(1, 64) as usize;

    let mut other_loops = Vec::new();
    for (param, y) in &others {
        let dims = g.ty(*y).dims().to_vec();
        let store_y = l.scoped(|l| {
            let v = l.value_at(*y, &Index::linear(&dims, var("j")))?;
            store(l, param, g.ty(*y).dtype, var("j"), v);
            Ok(())
        })?;
        other_loops.push(Stmt::For {
            var: "j".into(),
            start: global_thread(),
            end: int(dims.iter().product::<usize>() as i64),
            step: grid_stride(),
            unroll: false,
            body: store_y,
        });
    }
    let body = l.scoped(|l| {
        let mut b = Vec::new();
        let (nn, cc, oy, ox, plane) = if nhwc.is_some() {
            let cc = bind_int(&mut b, "c", rem(var("i"), c as i64));
            let ox = bind_int(&mut b, "ox", rem(div(var("i"), c as i64), ow as i64));
            let oy = bind_int(&mut b, "oy", rem(div(var("i"), (c * ow) as i64), oh as i64));
            let nn = bind_int(&mut b, "n", div(var("i"), (c * ow * oh) as i64));
            let plane = bind_int(
                &mut b,
                "plane",
                add(mul(nn.clone(), int(c as i64)), cc.clone()),
            );
            (nn, cc, oy, ox, plane)
        } else {
            let ox = bind_int(&mut b, "ox", rem(var("i"), ow as i64));
            let oy = bind_int(&mut b, "oy", rem(div(var("i"), ow as i64), oh as i64));
            let plane = bind_int(&mut b, "plane", div(var("i"), (oh * ow) as i64));
            let nn = bind_int(
                &mut b,
                "n",
                if n == 1 {
                    int(0)
                } else {
                    div(plane.clone(), c as i64)
                },
            );
            let cc = bind_int(
                &mut b,
                "c",
                if n == 1 {
                    plane.clone()
                } else {
                    rem(plane.clone(), c as i64)
                },
            );
            (nn, cc, oy, ox, plane)
        };
        l.body.extend(b);
        let identity = how.init();
        l.body.push(Stmt::Let {
            name: "acc".into(),
            ty: how.ty(),
            value: identity.clone(),
            constant: false,
        });
        let (rows, cols) = (win.leaves(0), win.leaves(1));
        let tap = l.scoped(|l| {
            let mut b = Vec::new();
            let iy = bind_int(&mut b, "iy", win.tap(0, oy.clone(), var("ki")));
            let ix = bind_int(&mut b, "ix", win.tap(1, ox.clone(), var("kj")));
            l.body.extend(b);
            let inside = and_opt(in_range(&iy, h, rows), in_range(&ix, w, cols));
            let (cy, cx) = (clamp_to(iy, h, rows), clamp_to(ix, w, cols));
            let idx = Index {
                dims: x_dims.clone(),
                linear: Some(add(
                    mul(plane.clone(), int((h * w) as i64)),
                    add(mul(cy.clone(), int(w as i64)), cx.clone()),
                )),
                coords: Some(vec![nn.clone(), cc.clone(), cy, cx]),
            };
            let v = l.value_at(x, &idx)?;
            let v = match inside {
                Some(cond) => {
                    let cond = l.bind("inside", Ty::Bool, cond);
                    select(cond, v, identity.clone())
                }
                None => v,
            };
            let acc = how.combine(l, var("acc"), v);
            l.body.push(Stmt::Assign("acc".into(), acc));
            Ok(())
        })?;
        l.body.push(unrolled(
            "ki",
            kernel[0],
            vec![unrolled("kj", kernel[1], tap)],
        ));
        let result = if maxpool {
            var("acc")
        } else {
            let count = if count_pad {
                Expr::F32((kernel[0] * kernel[1]) as f32)
            } else {
                let r = covered(l, &win, 0, "y0", "rows", oy.clone());
                let c = covered(l, &win, 1, "x0", "cols", ox.clone());
                match (r, c) {
                    (Expr::Int(r), Expr::Int(c)) => Expr::F32((r * c) as f32),
                    (r, c) => Expr::Cast(Ty::F32, Box::new(mul(r, c))),
                }
            };
            l.bind("result", Ty::F32, bin(BinOp::Div, var("acc"), count))
        };
        l.reduced = Some((pooled, Reduced::Row(result), 0));
        let (dims, coords) = if nhwc.is_some() {
            let [n, c, oh, ow] = out_dims[..] else {
                unreachable!("a 4-D pool")
            };
            (
                vec![n, oh, ow, c],
                vec![nn.clone(), oy.clone(), ox.clone(), cc.clone()],
            )
        } else {
            (
                out_dims.clone(),
                vec![nn.clone(), cc.clone(), oy.clone(), ox.clone()],
            )
        };
        for (param, y) in &per_pooled {
            let y = *y;
            let idx = result_index(l, y, &dims, var("i"), coords.clone());
            let v = l.value_at(y, &idx)?;
            store(l, param, g.ty(y).dtype, var("i"), v);
        }
        // Each name after those computed from it.
        let unread: &[&str] = if nhwc.is_some() {
            &["plane", "n", "c"]
        } else {
            &["c", "n", "plane"]
        };
        drop_unread(&mut l.body, unread);
        Ok(())
    })?;

    let grid = total.div_ceil(threads * items).max(1);
    let summary = format!(
        "pool ({} {}{}): {n}x{c}x{h}x{w} -> {oh}x{ow}, window {}x{} stride {}x{} pad {}x{}{}, one output per thread per step, {items} steps per thread",
        data.kind.name(),
        dtype.name(),
        if nhwc.is_some() { ", NHWC order" } else { "" },
        kernel[0],
        kernel[1],
        win.stride[0],
        win.stride[1],
        win.pad[0],
        win.pad[1],
        match (maxpool || win.dilation != [1, 1], count_pad) {
            (true, false) => format!(" dilation {}x{}", win.dilation[0], win.dilation[1]),
            (true, true) => format!(
                " dilation {}x{}, padding counted",
                win.dilation[0], win.dilation[1]
            ),
            (false, true) => ", padding counted".into(),
            (false, false) => String::new(),
        },
    );
    let body = [Stmt::For {
        var: "i".into(),
        start: global_thread(),
        end: int(total as i64),
        step: grid_stride(),
        unroll: false,
        body,
    }]
    .into_iter()
    .chain(other_loops)
    .collect();
    Ok(l.kernel(op, summary, params, body, [threads, grid]))
}

/// The NHWC value the pool of group `op` walks its output for, when it
/// walks NHWC order ([`dcir_fusion::pool_walks_nhwc`]): the transpose of
/// `pooled` that is its one use.
fn channels_last_result(l: &Lower, op: OpId, pooled: ValueId) -> Option<ValueId> {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    let (mut users, mut stored) = (Vec::new(), false);
    for &o in &g.block(region).ops {
        if g.op(o).operands.contains(&pooled) {
            if g.op(o).kind == OpKind::Yield {
                stored = true;
            } else {
                users.push(o);
            }
        }
    }
    dcir_fusion::pool_walks_nhwc(g, &users, stored).then(|| g.op(users[0]).results[0])
}

/// How many taps of an (undilated) window of output `o` lie inside the
/// input along `axis`: the window's extent, clipped where it may leave.
fn covered(l: &mut Lower, win: &Window, axis: usize, start: &str, name: &str, o: Expr) -> Expr {
    let (low, high) = win.leaves(axis);
    let k = win.kernel[axis] as i64;
    if !low && !high {
        return int(k);
    }
    let d = win.dilation[axis] as i64;
    let first = l.bind(start, Ty::I32, win.tap(axis, o, int(0)));
    let (begin, end) = if d == 1 {
        // The window clamped to the input.
        let end = add(first.clone(), int(k));
        let end = if high {
            call("min", vec![end, int(win.input[axis] as i64)])
        } else {
            end
        };
        let begin = if low {
            call("max", vec![first, int(0)])
        } else {
            first
        };
        (begin, end)
    } else {
        // Taps `j` in 0..k with `0 <= first + j * d < input`: from
        // ceil(-first / d) (when first < 0) to ceil((input - first) / d) (when
        // the window ends past the input); C's truncating division gives
        // both with `d - 1` added, the low one clamped at 0.
        let end = if high {
            let past = add(sub(int(win.input[axis] as i64), first.clone()), int(d - 1));
            call("min", vec![int(k), div(past, d)])
        } else {
            int(k)
        };
        let begin = if low {
            call("max", vec![int(0), div(sub(int(d - 1), first), d)])
        } else {
            int(0)
        };
        (begin, end)
    };
    l.bind(name, Ty::I32, sub(end, begin))
}

#[cfg(test)]
mod tests {
    use crate::{emit_module_source, lower::EmitError};

    /// The CUDA source of one `pool` group over `x: f32[1,3,size,size]`.
    fn pool(size: usize, op: &str, attrs: &str, out: usize) -> Result<String, EmitError> {
        let src = format!(
            "graph @g(%x: f32[1,3,{size},{size}]) -> (f32[1,3,{out},{out}]) {{\n\
             \x20 %y = fused @g0(%x.in = %x) {{items = 1, kind = \"pool\", level = \"register\", threads = 128}} : f32[1,3,{out},{out}] {{\n\
             \x20   %r = relu %x.in : f32[1,3,{size},{size}]\n\
             \x20   %y.r = {op} %r {{{attrs}}} : f32[1,3,{out},{out}]\n\
             \x20   yield %y.r\n\
             \x20 }}\n\
             \x20 return %y\n\
             }}\n"
        );
        let module = dcir_reader::parse_module(&src).expect("parses");
        emit_module_source(&module)
    }

    #[test]
    fn windows_inside_the_image_load_without_checks() {
        let s = pool(16, "maxpool2d", "kernel = [2, 2], stride = [2, 2]", 8).expect("lowers");
        assert!(!s.contains("min(max(") && !s.contains("inside"), "{s}");
        let s = pool(16, "avgpool2d", "kernel = [2, 2], stride = [2, 2]", 8).expect("lowers");
        assert!(s.contains("acc / 4.0f"), "{s}");
    }

    #[test]
    fn padded_windows_clamp_their_loads_and_mask_the_padding() {
        let window = "kernel = [3, 3], stride = [2, 2], pad = [1, 1, 1, 1]";
        let s = pool(17, "maxpool2d", window, 9).expect("lowers");
        assert!(s.contains("min(max(iy, 0), 16)"), "{s}");
        assert!(
            s.contains("v_inside ? v_r : __int_as_float(0xff800000)"),
            "{s}"
        );
        // The average divides by the taps inside the image.
        let s = pool(17, "avgpool2d", window, 9).expect("lowers");
        assert!(s.contains("min(v_y0 + 3, 17) - max(v_y0, 0)"), "{s}");
        // ...or by the whole window, padding counted.
        let counted = format!("{window}, count_include_pad = true");
        let s = pool(17, "avgpool2d", &counted, 9).expect("lowers");
        assert!(s.contains("acc / 9.0f"), "{s}");
    }

    #[test]
    fn a_dilated_average_counts_the_taps_inside_the_image() {
        // Taps y0, y0 + 2, y0 + 4 of a 3-tap window with dilation 2: from
        // ceil(-y0 / 2) to ceil((17 - y0) / 2), at most 3.
        let window = "kernel = [3, 3], stride = [2, 2], pad = [1, 1, 1, 1], dilation = [2, 2]";
        let s = pool(17, "avgpool2d", window, 8).expect("lowers");
        assert!(
            s.contains("min(3, (17 - v_y0 + 1) / 2) - max(0, (1 - v_y0) / 2)"),
            "{s}"
        );
    }
}
