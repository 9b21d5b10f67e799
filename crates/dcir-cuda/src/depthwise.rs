//! Direct convolution kernels: depthwise `conv` groups (`algorithm =
//! "direct"`) and `depthwise_pointwise` groups (depthwise conv → 1×1 conv).
//!
//! A depthwise conv2d reads x[N, C, H, W] with weights w[C·m, 1, KH, KW]
//! (`groups = C`, channel multiplier m) into [N, C·m, OH, OW]; output channel
//! `k` reads input channel `k / m`.
//!
//! **direct**: register strips, no shared memory and no barrier. Each thread
//! owns `tile = [rows, cols]` outputs of one (image, channel) — `rows`
//! consecutive output rows × `cols` consecutive columns — with threads on
//! consecutive column groups, then strips, channels and images, so a warp's
//! loads cover whole input rows. The thread keeps its channel's `kh·kw`
//! weights and `rows·cols` accumulators in registers and walks the
//! `(rows-1)·sh + (kh-1)·dh + 1` input rows its strip reads: each row's
//! span of `(cols-1)·sw + (kw-1)·dw + 1` columns goes into registers and is
//! added, with the right taps, into every output row whose window holds it.
//! Loads have no branches (clamped coordinates, zero selected outside the
//! image), so all of a thread's rows are in flight at once. Where the conv
//! reads a group input directly with stride 1, no dilation and rows a
//! multiple of `cols`, the span's `cols`-aligned middle is one vector load
//! (`float4`, or f16 in a `uint2`/`uint4`) and its ends come from the
//! neighbouring lanes' vectors by warp shuffles (loaded only at the warp's
//! edges); otherwise every element comes through the index maps (so view
//! prologues such as `pad` work). Threads of a partial last block redo the
//! last strip and store nothing, so every lane takes part in the shuffles.
//! The elementwise epilogue (batchnorm, bias, clip ...) runs per output and
//! the results are stored `cols` at a time when the output row is a
//! multiple of `cols`, else per element with bounds checks.
//!
//! **depthwise_pointwise**: a block owns a `tile = [th, tw]` output tile of
//! one image and `tile_n` output channels of the pointwise conv (capped at
//! its channel count). It walks the depthwise channels in chunks of `kc`
//! (chosen so the chunk's buffers fit 48 KiB of static shared memory, at most
//! 32): stage the chunk's input patches and both weight slices, barrier;
//! compute the depthwise result with its epilogue (in f32) for every (channel, pixel)
//! into `mid[kc][th·tw]`, barrier; accumulate the 1×1 conv as a small GEMM
//! (`th·tw × tile_n × kc`, register micro-tiles as in the gemm family)
//! from shared memory, barrier. The pointwise epilogue (bias, batchnorm,
//! residual add) runs per accumulator. Channels past the last chunk's end
//! are zeros in both `mid` and the weights. `math = "tensor_core"` is served
//! by the same f32 SIMT kernel (f16/bf16 widen to f32).

use dcir_fusion::Reason;
use dcir_ir::{DType, OpId, OpKind, ValueId};

use super::pool::{
    Window, and_opt, bind_int, clamp_to, in_range, per_element_after, per_output_results,
    result_index,
};
use super::simt::{Fragment, rank1_update};
use super::thread_grid;
use super::{
    EmitError, Index, Lower, Reduced, attr_int, pack, params, store, vector_lane, vector_ty,
};
use crate::kir::{
    ArrayRef, BinOp, Builtin, Expr, Kernel, Param, SharedArray, Shuffle, Stmt, Ty, add, at, below,
    bin, call, div, f32_array, int, mul, rem, select, sub, unrolled, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// Most bytes of static shared memory a kernel may declare.
const MAX_STATIC_SHARED: usize = 48 * 1024;
/// Most steps of a block-strided loop that are unrolled.
const MAX_UNROLLED_STEPS: usize = 16;
/// Most depthwise channels a `depthwise_pointwise` block stages at once.
const MAX_CHUNK: usize = 32;

/// A depthwise conv2d of a group.
struct Depthwise {
    x: ValueId,
    w: ValueId,
    out: ValueId,
    dtype: DType,
    n: usize,
    /// Input channels.
    c: usize,
    /// Output channels (`c · m`).
    channels: usize,
    /// Output channels per input channel.
    mult: usize,
    win: Window,
}

impl Depthwise {
    /// The depthwise conv `conv`, or why it is not one this module lowers.
    fn of(l: &Lower, conv: OpId) -> Result<Depthwise> {
        let g = l.g;
        let data = g.op(conv);
        let (x, w, out) = (data.operands[0], data.operands[1], data.results[0]);
        let (xd, wd, od) = (g.ty(x).dims(), g.ty(w).dims(), g.ty(out).dims());
        let (&[n, c, h, wi], &[k, 1, kh, kw], &[_, channels, oh, ow]) = (xd, wd, od) else {
            return Err(
                l.unsupported("a conv that is not depthwise (weights [C*m, 1, KH, KW] over NCHW)")
            );
        };
        let groups = data.attrs.int("groups").unwrap_or(1);
        if groups != c as i64 || k != channels || !channels.is_multiple_of(c) {
            return Err(
                l.unsupported("a direct conv that is not depthwise (groups = input channels)")
            );
        }
        let dtype = g.ty(out).dtype;
        if !dtype.is_float() {
            return Err(l.unsupported(Reason::DType {
                op: OpKind::Conv2d,
                dtype,
            }));
        }
        let elements = [xd, od].iter().map(|d| d.iter().product::<usize>()).max();
        if elements.unwrap_or(0) >= i32::MAX as usize {
            return Err(l.unsupported(Reason::TooLarge));
        }
        Ok(Depthwise {
            x,
            w,
            out,
            dtype,
            n,
            c,
            channels,
            mult: channels / c,
            win: Window::new(&data.attrs, [kh, kw], [h, wi], [oh, ow]),
        })
    }

    /// Taps of the window.
    fn taps(&self) -> usize {
        self.win.kernel[0] * self.win.kernel[1]
    }

    /// Output tiles of `tile` along `axis`.
    fn tiles(&self, axis: usize, tile: usize) -> usize {
        self.win.output[axis].div_ceil(tile)
    }

    /// Rows × columns of the input patch under a `th × tw` output tile.
    fn patch(&self, tile: [usize; 2]) -> [usize; 2] {
        [self.win.span(0, tile[0]), self.win.span(1, tile[1])]
    }
}

/// The conv2d ops of group `op`, in body order.
fn convs(l: &Lower, op: OpId) -> Vec<OpId> {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    g.block(region)
        .ops
        .iter()
        .copied()
        .filter(|&o| g.op(o).kind == OpKind::Conv2d)
        .collect()
}

/// `[th, tw]` of the group's `tile` attribute.
fn tile_attr(l: &Lower, op: OpId, default: [usize; 2]) -> Result<[usize; 2]> {
    match l.g.op(op).attrs.ints("tile") {
        None => Ok(default),
        Some(&[th, tw]) if th > 0 && tw > 0 => Ok([th as usize, tw as usize]),
        Some(t) => Err(l.unsupported(Reason::Parameters(format!("tile = {t:?}")))),
    }
}

/// `min(e, extent - 1)` where `e` may reach `extent`.
fn clamp_high(e: Expr, extent: usize, may_leave: bool) -> Expr {
    if may_leave {
        call("min", vec![e, int(extent as i64 - 1)])
    } else {
        e
    }
}

/// Element `s = threadIdx.x + u * threads` of `0 .. len` at each step `u`
/// (see [`strided`]): a loop of the whole block over a shared buffer.
fn block_loop(len: usize, threads: usize, body: Vec<Stmt>) -> Stmt {
    strided("s", Expr::Builtin(Builtin::ThreadX), threads, len, body)
}

/// `index = first + u * stride` below `len` at each step `u` of a loop with
/// a constant trip count, unrolled when short so that the loads of every
/// step can be in flight at once; `if (index < len)` only where the last
/// step may be partial (`first < stride` is assumed).
fn strided(index: &str, first: Expr, stride: usize, len: usize, body: Vec<Stmt>) -> Stmt {
    let steps = len.div_ceil(stride);
    let mut inner = vec![Stmt::Let {
        name: index.into(),
        ty: Ty::I32,
        value: add(first, mul(var("u"), int(stride as i64))),
        constant: true,
    }];
    if len.is_multiple_of(stride) {
        inner.extend(body);
    } else {
        inner.push(Stmt::If(below(var(index), len), body));
    }
    Stmt::For {
        var: "u".into(),
        start: int(0),
        end: int(steps as i64),
        step: int(1),
        unroll: steps <= MAX_UNROLLED_STEPS,
        body: inner,
    }
}

/// A block's output tile: its extent, its image, its first output pixel and
/// the first input pixel of its patch.
struct Tile {
    size: [usize; 2],
    n: Expr,
    oy0: Expr,
    ox0: Expr,
    iy0: Expr,
    ix0: Expr,
}

/// Splits `blockIdx.x` into (image, tile row, tile column, channel block),
/// the channel block fastest; returns the block's `tile`-sized tile and its
/// channel block.
fn block_tile(
    body: &mut Vec<Stmt>,
    dw: &Depthwise,
    tile: [usize; 2],
    channel_blocks: usize,
) -> (Tile, Expr) {
    let (ty_n, tx_n) = (dw.tiles(0, tile[0]), dw.tiles(1, tile[1]));
    let bid = Expr::Builtin(Builtin::BlockX);
    // Extents from fastest to slowest: each index is blockIdx.x / stride % extent.
    let order = [
        ("chan_block", channel_blocks),
        ("tile_x", tx_n),
        ("tile_y", ty_n),
        ("n", dw.n),
    ];
    let mut stride = 1;
    let mut found = Vec::new();
    for (i, &(name, extent)) in order.iter().enumerate() {
        let q = div(bid.clone(), stride as i64);
        let value = if i + 1 == order.len() {
            q
        } else {
            rem(q, extent as i64)
        };
        found.push((name, bind_int(body, name, value)));
        stride *= extent;
    }
    let get = |name: &str| {
        let (_, e) = found.iter().find(|(n, _)| *n == name).expect("bound");
        e.clone()
    };
    let oy0 = bind_int(body, "oy0", mul(get("tile_y"), int(tile[0] as i64)));
    let ox0 = bind_int(body, "ox0", mul(get("tile_x"), int(tile[1] as i64)));
    let iy0 = bind_int(body, "iy0", dw.win.tap(0, oy0.clone(), int(0)));
    let ix0 = bind_int(body, "ix0", dw.win.tap(1, ox0.clone(), int(0)));
    let block = Tile {
        size: tile,
        n: get("n"),
        oy0,
        ox0,
        iy0,
        ix0,
    };
    (block, get("chan_block"))
}

/// Stages the input patches of `kc` depthwise channels from `ch0` on under
/// the `block`'s tile into `shared[kc][ph][pw]`: input channel
/// `min(ch0 + k, channels - 1) / m`, zero outside the image.
fn stage_patch(
    l: &mut Lower,
    dw: &Depthwise,
    block: &Tile,
    kc: usize,
    threads: usize,
    ch0: Expr,
    shared: &ArrayRef,
) -> Result<Stmt> {
    let tile = block.size;
    let [ph, pw] = dw.patch(tile);
    let [h, w] = dw.win.input;
    let body = l.scoped(|l| {
        let mut b = Vec::new();
        let k = bind_int(&mut b, "s_ch", div(var("s"), (ph * pw) as i64));
        let iy = bind_int(
            &mut b,
            "s_y",
            add(block.iy0.clone(), rem(div(var("s"), pw as i64), ph as i64)),
        );
        let ix = bind_int(
            &mut b,
            "s_x",
            add(block.ix0.clone(), rem(var("s"), pw as i64)),
        );
        l.body.extend(b);
        l.body.push(Stmt::Let {
            name: "s_val".into(),
            ty: Ty::F32,
            value: Expr::F32(0.0),
            constant: false,
        });
        let ch = clamp_high(add(ch0, k), dw.channels, !dw.channels.is_multiple_of(kc));
        let ic = div(ch, dw.mult as i64);
        let idx = Index::coords(
            &[dw.n, dw.c, h, w],
            vec![block.n.clone(), ic, iy.clone(), ix.clone()],
        );
        let inside = and_opt(
            in_range(&iy, h, tile_leaves(dw, 0, tile[0])),
            in_range(&ix, w, tile_leaves(dw, 1, tile[1])),
        );
        let load = l.scoped(|l| {
            let v = l.value_at(dw.x, &idx)?;
            l.body.push(Stmt::Assign("s_val".into(), v));
            Ok(())
        })?;
        match inside {
            Some(cond) => l.body.push(Stmt::If(cond, load)),
            None => l.body.extend(load),
        }
        l.body
            .push(Stmt::Store(shared.clone(), var("s"), var("s_val")));
        Ok(())
    })?;
    Ok(block_loop(kc * ph * pw, threads, body))
}

/// The depthwise sum of output pixel (`py`, `px`) of the tile for the
/// channel whose patch starts at row `chan · ph` of `patch`; `weight(ki, kj)`
/// gives the tap's weight.
fn depthwise_sum(
    dw: &Depthwise,
    tile: [usize; 2],
    patch: &ArrayRef,
    acc: &str,
    (chan, py, px): (Expr, Expr, Expr),
    weight: &dyn Fn(Expr, Expr) -> Expr,
) -> Vec<Stmt> {
    let [ph, pw] = dw.patch(tile);
    let row = add(
        add(
            mul(chan, int(ph as i64)),
            mul(py, int(dw.win.stride[0] as i64)),
        ),
        mul(var("ki"), int(dw.win.dilation[0] as i64)),
    );
    let col = add(
        mul(px, int(dw.win.stride[1] as i64)),
        mul(var("kj"), int(dw.win.dilation[1] as i64)),
    );
    let x = Expr::Load(patch.clone(), Box::new(add(mul(row, int(pw as i64)), col)));
    let fma = Stmt::Assign(
        acc.into(),
        call("fmaf", vec![x, weight(var("ki"), var("kj")), var(acc)]),
    );
    vec![
        Stmt::Let {
            name: acc.into(),
            ty: Ty::F32,
            value: Expr::F32(0.0),
            constant: false,
        },
        unrolled(
            "ki",
            dw.win.kernel[0],
            vec![unrolled("kj", dw.win.kernel[1], vec![fma])],
        ),
    ]
}

/// Lowers a `conv` group whose `algorithm` is `direct`: a depthwise conv2d
/// as register strips (see the module doc).
pub(super) fn direct(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    // Locals of the kernel, so that no parameter takes their names.
    for name in
        "t t_raw lane cg strip oc ic n ox0 oy0 ix0 iy0 wk acc xr oy ox i j ki kj".split_whitespace()
    {
        l.used_names.insert(name.into());
    }
    let params = params(l, op);
    let [conv] = convs(l, op)[..] else {
        return Err(l.unsupported("a direct conv group with several convs"));
    };
    let dw = Depthwise::of(l, conv)?;
    per_element_after(l, op, dw.out, None, "conv")?;
    let out_dims = g.ty(dw.out).dims().to_vec();
    let ys = per_output_results(l, op, out_dims.iter().product())?;
    let [oh, ow] = dw.win.output;
    let [h, w] = dw.win.input;
    let [rows, cols] = tile_attr(l, op, [4, 4])?;
    let (rows, cols) = (rows.min(oh), cols.min(ow));
    if rows * cols > MAX_STRIP {
        return Err(l.unsupported(Reason::Parameters(format!(
            "a strip of {rows}x{cols} outputs per thread (at most {MAX_STRIP})"
        ))));
    }
    let threads = (attr_int(g, op, "threads", 128).clamp(32, 1024) as usize).next_multiple_of(32);
    let (kh, kw) = (dw.win.kernel[0], dw.win.kernel[1]);
    let ([sh, sw], [dh, dwl]) = (dw.win.stride, dw.win.dilation);
    let [span_rows, span_cols] = dw.patch([rows, cols]);
    let (strips, col_groups) = (oh.div_ceil(rows), ow.div_ceil(cols));
    let total = dw.n * dw.channels * strips * col_groups;
    if total >= i32::MAX as usize {
        return Err(l.unsupported(Reason::TooLarge));
    }
    // The input is read straight from its parameter, in vectors of `cols`
    // elements where each span's aligned middle allows (see the module doc).
    let x_param = l.inputs.get(&dw.x).cloned();
    let x_vector = x_param.is_some()
        && sw == 1
        && dwl == 1
        && vector_width(dw.dtype, cols)
        && w.is_multiple_of(cols);
    let y_vector = ow.is_multiple_of(cols)
        && vector_width(dw.dtype, cols)
        && ys.iter().all(|&y| g.ty(y).dims() == out_dims);

    let mut body = vec![Stmt::Comment(format!(
        "thread t: {rows} output rows x {cols} columns of one (image, channel), column groups fastest"
    ))];
    let raw_t = add(
        mul(Expr::Builtin(Builtin::BlockX), int(threads as i64)),
        Expr::Builtin(Builtin::ThreadX),
    );
    // Every thread of a partial last block computes (the span ends are warp
    // shuffles): past the last strip it redoes the last one and stores nothing.
    let partial = !total.is_multiple_of(threads);
    let t = if partial {
        bind_int(&mut body, "t_raw", raw_t);
        bind_int(
            &mut body,
            "t",
            call("min", vec![var("t_raw"), int(total as i64 - 1)]),
        )
    } else {
        bind_int(&mut body, "t", raw_t)
    };
    let mut strip = Vec::new();
    let cg = bind_int(&mut strip, "cg", rem(t.clone(), col_groups as i64));
    let st = bind_int(
        &mut strip,
        "strip",
        rem(div(t.clone(), col_groups as i64), strips as i64),
    );
    let oc = bind_int(
        &mut strip,
        "oc",
        rem(
            div(t.clone(), (col_groups * strips) as i64),
            dw.channels as i64,
        ),
    );
    let n = bind_int(
        &mut strip,
        "n",
        div(t, (col_groups * strips * dw.channels) as i64),
    );
    let ic = bind_int(&mut strip, "ic", div(oc.clone(), dw.mult as i64));
    let ox0 = bind_int(&mut strip, "ox0", mul(cg.clone(), int(cols as i64)));
    let oy0 = bind_int(&mut strip, "oy0", mul(st, int(rows as i64)));
    let ix0 = bind_int(&mut strip, "ix0", dw.win.tap(1, ox0.clone(), int(0)));
    let iy0 = bind_int(&mut strip, "iy0", dw.win.tap(0, oy0.clone(), int(0)));

    // The channel's weights and the accumulators, in registers.
    let w_dims = g.ty(dw.w).dims().to_vec();
    strip.push(Stmt::LocalArray {
        name: "wk".into(),
        ty: Ty::F32,
        len: kh * kw,
    });
    let load_w = l.scoped(|l| {
        let idx = Index::coords(&w_dims, vec![oc.clone(), int(0), var("ki"), var("kj")]);
        let v = l.value_at(dw.w, &idx)?;
        let slot = add(mul(var("ki"), int(kw as i64)), var("kj"));
        l.body.push(Stmt::Store(f32_array("wk"), slot, v));
        Ok(())
    })?;
    strip.push(unrolled("ki", kh, vec![unrolled("kj", kw, load_w)]));
    for (name, len) in [("acc", rows * cols), ("xr", span_cols)] {
        strip.push(Stmt::LocalArray {
            name: name.into(),
            ty: Ty::F32,
            len,
        });
    }
    let zero = |name: &str| Stmt::Store(f32_array(name), var("i"), Expr::F32(0.0));
    strip.push(unrolled("i", rows * cols, vec![zero("acc")]));
    if x_vector && kw > 1 {
        // The span's ends come from the neighbouring lanes.
        bind_int(&mut strip, "lane", rem(Expr::Builtin(Builtin::ThreadX), 32));
    }

    // Input rows in order; each adds into the output rows whose windows hold
    // it. Loads are unconditional (clamped coordinates, zero selected
    // outside the image), so a thread has every row's loads in flight at once.
    let (row_leaves, col_leaves) = (tile_leaves(&dw, 0, rows), tile_leaves(&dw, 1, cols));
    for r in 0..span_rows {
        let iy = add(iy0.clone(), int(r as i64));
        let name = l.fresh(&format!("row{r}"));
        let row = Row {
            y: bind_int(&mut strip, &name, clamp_to(iy.clone(), h, row_leaves)),
            inside: in_range(&iy, h, row_leaves),
        };
        let loads = l.scoped(|l| {
            if let (true, Some(param)) = (x_vector, &x_param) {
                let at = [&n, &ic, &ox0, &cg];
                load_row_vectors(
                    l,
                    &dw,
                    param,
                    [cols, col_groups, span_cols],
                    at,
                    &row,
                    col_leaves,
                )
            } else {
                load_row_elements(l, &dw, span_cols, [&n, &ic, &ix0], &row, col_leaves)
            }
        })?;
        strip.extend(loads);
        for ki in 0..kh {
            // Output row i reads input row r at tap ki when i·sh + ki·dh = r.
            let Some(off) = r.checked_sub(ki * dh).filter(|o| o.is_multiple_of(sh)) else {
                continue;
            };
            let i = (off / sh) as i64;
            if i >= rows as i64 {
                continue;
            }
            let slot = add(int(i * cols as i64), var("j"));
            let x = at(
                "xr",
                add(
                    mul(var("j"), int(sw as i64)),
                    mul(var("kj"), int(dwl as i64)),
                ),
            );
            let wt = at("wk", add(int((ki * kw) as i64), var("kj")));
            let fma = call("fmaf", vec![x, wt, at("acc", slot.clone())]);
            let taps = unrolled("kj", kw, vec![Stmt::Store(f32_array("acc"), slot, fma)]);
            strip.push(unrolled("j", cols, vec![taps]));
        }
    }

    // The epilogue per output, stored `cols` at a time where the row allows.
    let mut epilogue = Vec::new();
    for i in 0..rows {
        let oy = add(oy0.clone(), int(i as i64));
        let row = l.scoped(|l| {
            let row_start = Index::coords(
                &out_dims,
                vec![n.clone(), oc.clone(), oy.clone(), ox0.clone()],
            )
            .get_linear();
            let mut lanes: Vec<Vec<Expr>> = vec![Vec::new(); ys.len()];
            for j in 0..cols {
                let ox = add(ox0.clone(), int(j as i64));
                let acc = at("acc", int((i * cols + j) as i64));
                l.reduced = Some((dw.out, Reduced::Row(acc), 0));
                let coords = vec![n.clone(), oc.clone(), oy.clone(), ox.clone()];
                if y_vector {
                    let linear = Index::coords(&out_dims, coords.clone()).get_linear();
                    for (k, &y) in ys.iter().enumerate() {
                        let idx = result_index(l, y, &out_dims, linear.clone(), coords.clone());
                        let v = l.value_at(y, &idx)?;
                        lanes[k].push(l.narrow(g.ty(y).dtype, v));
                    }
                } else {
                    let stores = l.scoped(|l| store_outputs(l, &params, &ys, &out_dims, coords))?;
                    if ow.is_multiple_of(cols) {
                        l.body.extend(stores);
                    } else {
                        l.body.push(Stmt::If(below(ox, ow), stores));
                    }
                }
            }
            if y_vector {
                let outputs = params.iter().filter(|p| p.output);
                for ((param, &y), lanes) in outputs.zip(&ys).zip(lanes) {
                    let dtype = g.ty(y).dtype;
                    l.body.push(Stmt::Store(
                        ArrayRef {
                            name: param.name.clone(),
                            ty: vector_ty(dtype, cols),
                            reinterpret: true,
                        },
                        div(row_start.clone(), cols as i64),
                        pack(dtype, lanes),
                    ));
                }
            }
            Ok(())
        })?;
        if oh.is_multiple_of(rows) {
            epilogue.extend(row);
        } else {
            epilogue.push(Stmt::If(below(oy, oh), row));
        }
    }
    l.reduced = None;
    if partial {
        strip.push(Stmt::If(below(var("t_raw"), total), epilogue));
    } else {
        strip.extend(epilogue);
    }
    body.extend(strip);

    let summary = format!(
        "depthwise conv ({}): {}x{}x{h}x{w} -> {}x{}x{oh}x{ow}, window {kh}x{kw} stride {sh}x{sw} pad {}x{} dilation {dh}x{dwl}, {rows}x{cols} outputs per thread, {threads} threads, direct; input {}, output {}",
        dw.dtype.name(),
        dw.n,
        dw.c,
        dw.n,
        dw.channels,
        dw.win.pad[0],
        dw.win.pad[1],
        if x_vector {
            format!("in vectors of {cols}")
        } else {
            "per element".to_string()
        },
        if y_vector {
            format!("in vectors of {cols}")
        } else {
            "per element".to_string()
        },
    );
    Ok(Kernel {
        // Left alone, ptxas squeezes a strip of up to 8 outputs into 32
        // registers and may spill (2×4 outputs of a 3×3 f32 window); one
        // block per SM at least lets it take what the strip needs (a budget
        // from the cost model's estimate spilled a 2×4 strip of a 7×7 f16
        // window at 96). Larger strips keep ptxas's own choice.
        min_blocks_per_sm: u32::from(rows * cols <= SMALL_STRIP),
        ..l.kernel(
            op,
            summary,
            params,
            body,
            [threads, total.div_ceil(threads)],
        )
    })
}

/// Strips of at most this many outputs get a register budget (`direct`).
const SMALL_STRIP: usize = 8;

/// Most outputs one thread of a `direct` kernel accumulates.
const MAX_STRIP: usize = 64;

/// Whether some tile (or strip) of `extent` outputs along `axis` (edge
/// tiles past the output included) reads before the input, and whether
/// some reads past it.
fn tile_leaves(dw: &Depthwise, axis: usize, extent: usize) -> (bool, bool) {
    let padded = dw.tiles(axis, extent) * extent;
    let mut output = dw.win.output;
    output[axis] = padded;
    Window { output, ..dw.win }.leaves(axis)
}

/// One input row of a strip: its clamped coordinate, and whether it is
/// inside the image (`None`: always).
struct Row {
    y: Expr,
    inside: Option<Expr>,
}

/// `xr[j] = value`, or zero where `inside` is false.
fn set_span(body: &mut Vec<Stmt>, j: usize, inside: Option<Expr>, value: Expr) {
    let value = match inside {
        Some(cond) => select(cond, value, Expr::F32(0.0)),
        None => value,
    };
    body.push(Stmt::Store(f32_array("xr"), int(j as i64), value));
}

/// Loads span `xr[0 .. span)` of input `row` element by element through the
/// index maps, at clamped columns, zero outside the image.
fn load_row_elements(
    l: &mut Lower,
    dw: &Depthwise,
    span: usize,
    [n, ic, ix0]: [&Expr; 3],
    row: &Row,
    leaves: (bool, bool),
) -> Result<()> {
    for j in 0..span {
        let ix = add(ix0.clone(), int(j as i64));
        let value = element(l, dw, [n, ic, &row.y], &ix, leaves)?;
        let inside = and_opt(row.inside.clone(), in_range(&ix, dw.win.input[1], leaves));
        set_span(&mut l.body, j, inside, value);
    }
    Ok(())
}

/// The input at (`n`, `ic`, `y`, `ix` clamped into the row) through the index maps.
fn element(
    l: &mut Lower,
    dw: &Depthwise,
    [n, ic, y]: [&Expr; 3],
    ix: &Expr,
    leaves: (bool, bool),
) -> Result<Expr> {
    let [h, w] = dw.win.input;
    let x = clamp_to(ix.clone(), w, leaves);
    let idx = Index::coords(
        &[dw.n, dw.c, h, w],
        vec![n.clone(), ic.clone(), y.clone(), x],
    );
    l.value_at(dw.x, &idx)
}

/// Loads span `xr[0 .. span)` of input `row` of parameter `param` (stride
/// 1, no dilation, `cols`-aligned rows): the `cols`-aligned chunks the span
/// covers as vectors (each entirely inside or outside the row), the ends
/// from the neighbouring threads' chunks by warp shuffles (a load at the
/// warp's edges); zero outside the image.
fn load_row_vectors(
    l: &mut Lower,
    dw: &Depthwise,
    param: &str,
    [cols, col_groups, span]: [usize; 3],
    [n, ic, ox0, cg]: [&Expr; 4],
    row: &Row,
    leaves: (bool, bool),
) -> Result<()> {
    let [h, w] = dw.win.input;
    let pad = dw.win.pad[1] as i64;
    let (cols_i, w_i) = (cols as i64, w as i64);
    let plane = add(mul(n.clone(), int(dw.c as i64)), ic.clone());
    let row_start = add(mul(plane, int(h as i64)), row.y.clone());
    // Span element j is column ox0 - pad + j, component (j - pad) mod cols
    // of chunk q = floor((j - pad) / cols), which column group cg + q loads.
    let chunk = |j: usize| (j as i64 - pad).div_euclid(cols_i);
    let whole = |j: usize| pad + chunk(j) * cols_i == j as i64 && j + cols <= span;
    // The thread's own chunk (q = 0) is always inside the row.
    let own_loaded = whole(pad as usize);
    let mut ends = Vec::new();
    let mut j = 0;
    while j < span {
        if !whole(j) {
            ends.push(j);
            j += 1;
            continue;
        }
        let q = chunk(j);
        // Columns of chunk q over the column groups: q·cols .. (groups - 1 + q)·cols + cols.
        let col = add(ox0.clone(), int(q * cols_i));
        let low = (q < 0).then(|| bin(BinOp::Ge, col.clone(), int(0)));
        let last = (col_groups as i64 - 1 + q) * cols_i + cols_i;
        let high = (last > w_i).then(|| below(col, w));
        // A vector of the input row, which may hold more vectors than there
        // are column groups (an input wider than the output).
        let group = clamp_to(add(cg.clone(), int(q)), w / cols, (q < 0, last > w_i));
        let index = add(mul(row_start.clone(), int(w_i / cols_i)), group);
        let v = l.vector_load(param, dw.dtype, index, cols);
        let inside = and_opt(row.inside.clone(), and_opt(low, high));
        for e in 0..cols {
            let x = l.widen(dw.dtype, vector_lane(v.clone(), dw.dtype, cols, e));
            set_span(&mut l.body, j + e, inside.clone(), x);
        }
        j += cols;
    }
    for j in ends {
        let ix = add(sub(ox0.clone(), int(pad)), int(j as i64));
        let q = chunk(j);
        // Left of the own chunk a column can only fall before the row, right of it only past it.
        let leaves = (leaves.0 && q < 0, leaves.1 && q > 0);
        let inside = and_opt(row.inside.clone(), in_range(&ix, w, leaves));
        if !own_loaded || q.unsigned_abs() >= 32 {
            let value = element(l, dw, [n, ic, &row.y], &ix, leaves)?;
            set_span(&mut l.body, j, inside, value);
            continue;
        }
        // Lane + q holds the column in its own chunk, unless it is past the
        // warp or past the row's column groups (lanes run on into the next
        // strip): a column left of group 0 is left of the row, but one right
        // of the last group can still be inside it (an input wider than the
        // groups cover) and is loaded.
        let source = (j as i64 - pad).rem_euclid(cols_i) + pad;
        let (mode, past_warp) = if q < 0 {
            (Shuffle::Up, below(var("lane"), (-q) as usize))
        } else {
            let past = bin(BinOp::Ge, var("lane"), int(32 - q));
            // The first column a lane of group `col_groups - q` would take.
            let first_past_groups = (col_groups as i64 - q) * cols_i - pad + j as i64;
            let past = if first_past_groups < w_i {
                let next_strip = bin(BinOp::Ge, cg.clone(), int(col_groups as i64 - q));
                bin(BinOp::Or, past, next_strip)
            } else {
                past
            };
            (Shuffle::Down, past)
        };
        let name = l.fresh("x_end");
        let shuffled = Expr::Shfl(
            mode,
            Box::new(at("xr", int(source))),
            q.unsigned_abs() as u32,
        );
        l.body.push(Stmt::Let {
            name: name.clone(),
            ty: Ty::F32,
            value: shuffled,
            constant: false,
        });
        let fetch = l.scoped(|l| {
            let value = element(l, dw, [n, ic, &row.y], &ix, leaves)?;
            l.body.push(Stmt::Assign(name.clone(), value));
            Ok(())
        })?;
        l.body.push(Stmt::If(past_warp, fetch));
        set_span(&mut l.body, j, inside, var(&name));
    }
    Ok(())
}

/// Whether `cols` elements of `dtype` make one of the emitter's vector types.
fn vector_width(dtype: DType, cols: usize) -> bool {
    match dtype {
        DType::F32 => matches!(cols, 2 | 4),
        DType::F16 | DType::BF16 => matches!(cols, 2 | 4 | 8),
        _ => false,
    }
}

/// Lowers a `depthwise_pointwise` group.
pub(super) fn depthwise_pointwise(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    // Locals of the kernel, so that no parameter takes their names.
    for name in "tile_x tile_y chan_block n oy0 ox0 iy0 ix0 o0 tp tn k0 u s s_ch s_y s_x s_val \
         s_k s_o s_t patch dw_w mid pw_w kl kg p py px oy ox o ki kj kk i j dw_acc acc \
         a_frag b_frag"
        .split_whitespace()
    {
        l.used_names.insert(name.into());
    }
    let params = params(l, op);
    let [dconv, pconv] = convs(l, op)[..] else {
        return Err(l.unsupported("a depthwise_pointwise group without exactly two convs"));
    };
    let dw = Depthwise::of(l, dconv)?;
    let pdata = g.op(pconv);
    let (mid, wp, pw_out) = (pdata.operands[0], pdata.operands[1], pdata.results[0]);
    let [oh, ow] = dw.win.output;
    let (wp_dims, out_dims) = (g.ty(wp).dims().to_vec(), g.ty(pw_out).dims().to_vec());
    let all = |name: &str, v: i64| {
        pdata
            .attrs
            .ints(name)
            .is_none_or(|xs| xs.iter().all(|&x| x == v))
    };
    let pointwise = pdata.attrs.int("groups").unwrap_or(1) == 1
        && all("stride", 1)
        && all("pad", 0)
        && wp_dims.len() == 4
        && wp_dims[1..] == [dw.channels, 1, 1]
        && out_dims == [dw.n, wp_dims[0], oh, ow]
        && g.ty(mid).dims() == [dw.n, dw.channels, oh, ow];
    if !pointwise {
        return Err(l.unsupported("a second conv that is not a 1x1 conv of the depthwise result"));
    }
    let o_total = wp_dims[0];
    let mid_values = per_element_after(l, op, dw.out, Some(pconv), "depthwise conv")?;
    if !mid_values.contains(&mid) {
        return Err(l.unsupported("a pointwise conv that does not read the depthwise result"));
    }
    per_element_after(l, op, pw_out, None, "pointwise conv")?;
    let total = out_dims.iter().product::<usize>();
    let ys = per_output_results(l, op, total)?;
    if total >= i32::MAX as usize {
        return Err(l.unsupported(Reason::TooLarge));
    }

    let tile = tile_attr(l, op, [8, 8])?;
    let pixels = tile[0] * tile[1];
    let threads = attr_int(g, op, "threads", 256).clamp(32, 1024) as usize;
    let planned_n = attr_int(g, op, "tile_n", 32).max(1) as usize;
    // A block owns at most every output channel.
    let Some((tile_n, (threads_p, threads_n))) = [planned_n.min(o_total), planned_n]
        .into_iter()
        .find_map(|tn| thread_grid(pixels, tn, threads).map(|grid| (tn, grid)))
    else {
        return Err(l.unsupported(Reason::Parameters(format!(
            "tile [{}, {}] x {planned_n} channels with {threads} threads (no even split)",
            tile[0], tile[1]
        ))));
    };
    let (mt, nt) = (pixels / threads_p, tile_n / threads_n);
    let [ph, pw] = dw.patch(tile);
    let taps = dw.taps();
    let per_channel = (ph * pw + taps + pixels + tile_n) * 4;
    let fit = (MAX_STATIC_SHARED / per_channel)
        .min(MAX_CHUNK)
        .min(dw.channels);
    // At most half of a thread's share of the 64K registers hold accumulators.
    let max_acc = (32 * 1024 / threads).min(128);
    if fit == 0 || mt * nt > max_acc {
        return Err(l.unsupported(Reason::Parameters(format!(
            "{per_channel} bytes of shared memory per channel or a {mt}x{nt} micro-tile"
        ))));
    }
    // Chunks of equal size: the last one wastes least.
    let kc = dw.channels.div_ceil(dw.channels.div_ceil(fit));
    let partial_k = !dw.channels.is_multiple_of(kc);
    let partial_n = !o_total.is_multiple_of(tile_n);
    let (kh, kw) = (dw.win.kernel[0], dw.win.kernel[1]);

    let mut body = vec![Stmt::Comment(format!(
        "{}x{} output pixels x {tile_n} output channels per block; depthwise channels in chunks of {kc}; {threads_p}x{threads_n} threads, each a {mt}x{nt} micro-tile",
        tile[0], tile[1]
    ))];
    let (block, chan_block) = block_tile(&mut body, &dw, tile, o_total.div_ceil(tile_n));
    let o0 = bind_int(&mut body, "o0", mul(chan_block, int(tile_n as i64)));
    let tid = Expr::Builtin(Builtin::ThreadX);
    let tp = bind_int(&mut body, "tp", rem(tid.clone(), threads_p as i64));
    let tn = bind_int(&mut body, "tn", div(tid, threads_p as i64));
    body.push(Stmt::LocalArray {
        name: "acc".into(),
        ty: Ty::F32,
        len: mt * nt,
    });
    body.push(unrolled(
        "i",
        mt * nt,
        vec![Stmt::Store(f32_array("acc"), var("i"), Expr::F32(0.0))],
    ));

    // One chunk: stage, depthwise into `mid`, accumulate the pointwise conv.
    let mut chunk = vec![Stmt::Comment(format!(
        "stage the input patches and both weight slices of depthwise channels k0 .. k0 + {kc}"
    ))];
    chunk.push(stage_patch(
        l,
        &dw,
        &block,
        kc,
        threads,
        var("k0"),
        &f32_array("patch"),
    )?);
    let dw_dims = g.ty(dw.w).dims().to_vec();
    let stage_dw = l.scoped(|l| {
        let mut b = Vec::new();
        let k = bind_int(&mut b, "s_k", div(var("s"), taps as i64));
        let t = bind_int(&mut b, "s_t", rem(var("s"), taps as i64));
        l.body.extend(b);
        let ch = clamp_high(add(var("k0"), k), dw.channels, partial_k);
        let idx = Index::coords(
            &dw_dims,
            vec![ch, int(0), div(t.clone(), kw as i64), rem(t, kw as i64)],
        );
        let v = l.value_at(dw.w, &idx)?;
        l.body.push(Stmt::Store(f32_array("dw_w"), var("s"), v));
        Ok(())
    })?;
    chunk.push(block_loop(kc * taps, threads, stage_dw));
    let stage_pw = l.scoped(|l| {
        let mut b = Vec::new();
        let o = bind_int(&mut b, "s_o", div(var("s"), kc as i64));
        let k = bind_int(&mut b, "s_k", rem(var("s"), kc as i64));
        l.body.extend(b);
        let (o_g, k_g) = (add(o0.clone(), o.clone()), add(var("k0"), k.clone()));
        let guard = [
            (partial_n, below(o_g.clone(), o_total)),
            (partial_k, below(k_g.clone(), dw.channels)),
        ]
        .into_iter()
        .filter_map(|(needed, c)| needed.then_some(c))
        .reduce(|a, b| bin(BinOp::And, a, b));
        let idx = Index::coords(&wp_dims, vec![o_g, k_g, int(0), int(0)]);
        let slot = add(mul(k, int(tile_n as i64)), o);
        let value = l.scoped(|l| {
            let v = l.value_at(wp, &idx)?;
            l.body.push(Stmt::Assign("s_val".into(), v));
            Ok(())
        })?;
        l.body.push(Stmt::Let {
            name: "s_val".into(),
            ty: Ty::F32,
            value: Expr::F32(0.0),
            constant: false,
        });
        match guard {
            Some(cond) => l.body.push(Stmt::If(cond, value)),
            None => l.body.extend(value),
        }
        l.body
            .push(Stmt::Store(f32_array("pw_w"), slot, var("s_val")));
        Ok(())
    })?;
    chunk.push(block_loop(kc * tile_n, threads, stage_pw));
    chunk.push(Stmt::Barrier);

    chunk.push(Stmt::Comment(
        "the depthwise conv and its epilogue for every (channel, pixel) of the chunk".into(),
    ));
    let mid_body = l.scoped(|l| {
        let mut b = Vec::new();
        let kl = bind_int(&mut b, "kl", div(var("s"), pixels as i64));
        let p = bind_int(&mut b, "p", rem(var("s"), pixels as i64));
        let py = bind_int(&mut b, "py", div(p.clone(), tile[1] as i64));
        let px = bind_int(&mut b, "px", rem(p, tile[1] as i64));
        let kg = bind_int(&mut b, "kg", add(var("k0"), kl.clone()));
        l.body.extend(b);
        let weight = |ki: Expr, kj: Expr| {
            let tap = add(mul(ki, int(kw as i64)), kj);
            at("dw_w", add(mul(kl.clone(), int(taps as i64)), tap))
        };
        l.body.extend(depthwise_sum(
            &dw,
            tile,
            &f32_array("patch"),
            "dw_acc",
            (kl.clone(), py.clone(), px.clone()),
            &weight,
        ));
        // Pixels past the image compute (unused) values at clamped coordinates.
        l.reduced = Some((dw.out, Reduced::Row(var("dw_acc")), 0));
        let coords = vec![
            block.n.clone(),
            clamp_high(kg.clone(), dw.channels, partial_k),
            clamp_high(add(block.oy0.clone(), py), oh, !oh.is_multiple_of(tile[0])),
            clamp_high(add(block.ox0.clone(), px), ow, !ow.is_multiple_of(tile[1])),
        ];
        let v = l.value_at(mid, &Index::coords(&[dw.n, dw.channels, oh, ow], coords))?;
        let v = if partial_k {
            select(below(kg, dw.channels), v, Expr::F32(0.0))
        } else {
            v
        };
        l.body.push(Stmt::Store(f32_array("mid"), var("s"), v));
        Ok(())
    })?;
    chunk.push(block_loop(kc * pixels, threads, mid_body));
    chunk.push(Stmt::Barrier);

    chunk.push(Stmt::Comment(
        "the pointwise conv: acc += mid^T . pw_w".into(),
    ));
    let acc_ij = add(mul(var("i"), int(nt as i64)), var("j"));
    let inner = rank1_update(
        "acc",
        &Fragment::scalar(
            "mid",
            add(mul(var("kk"), int(pixels as i64)), tp.clone()),
            threads_p,
            mt,
        ),
        &Fragment::scalar(
            "pw_w",
            add(mul(var("kk"), int(tile_n as i64)), tn.clone()),
            threads_n,
            nt,
        ),
    );
    chunk.push(unrolled("kk", kc, inner));
    chunk.push(Stmt::Barrier);
    body.push(Stmt::For {
        var: "k0".into(),
        start: int(0),
        end: int(dw.channels as i64),
        step: int(kc as i64),
        unroll: false,
        body: chunk,
    });

    // Epilogue: each accumulator through the pointwise conv's elementwise tail.
    let mut pixel = Vec::new();
    let p = bind_int(
        &mut pixel,
        "p",
        add(tp.clone(), mul(var("i"), int(threads_p as i64))),
    );
    let oy = bind_int(
        &mut pixel,
        "oy",
        add(block.oy0.clone(), div(p.clone(), tile[1] as i64)),
    );
    let ox = bind_int(
        &mut pixel,
        "ox",
        add(block.ox0.clone(), rem(p, tile[1] as i64)),
    );
    let stores = l.scoped(|l| {
        let o = bind_int(
            &mut l.body,
            "o",
            add(
                add(o0.clone(), tn.clone()),
                mul(var("j"), int(threads_n as i64)),
            ),
        );
        let guard = [
            (!oh.is_multiple_of(tile[0]), below(oy.clone(), oh)),
            (!ow.is_multiple_of(tile[1]), below(ox.clone(), ow)),
            (partial_n, below(o.clone(), o_total)),
        ]
        .into_iter()
        .filter_map(|(needed, c)| needed.then_some(c))
        .reduce(|a, b| bin(BinOp::And, a, b));
        let each = l.scoped(|l| {
            l.reduced = Some((pw_out, Reduced::Row(at("acc", acc_ij.clone())), 0));
            let coords = vec![block.n.clone(), o.clone(), oy.clone(), ox.clone()];
            store_outputs(l, &params, &ys, &out_dims, coords)
        })?;
        match guard {
            Some(cond) => l.body.push(Stmt::If(cond, each)),
            None => l.body.extend(each),
        }
        Ok(())
    })?;
    pixel.push(unrolled("j", nt, stores));
    body.push(unrolled("i", mt, pixel));

    let shared = [
        ("patch", kc * ph * pw),
        ("dw_w", kc * taps),
        ("mid", kc * pixels),
        ("pw_w", kc * tile_n),
    ]
    .into_iter()
    .map(|(name, len)| SharedArray {
        name: name.into(),
        ty: Ty::F32,
        len,
    })
    .collect();
    let [h, w] = dw.win.input;
    let math = g.op(op).attrs.str("math").unwrap_or("fma").to_string();
    let summary = format!(
        "depthwise_pointwise ({}): {}x{}x{h}x{w} -> depthwise {kh}x{kw} stride {}x{} pad {}x{} dilation {}x{} -> {}x{}x{oh}x{ow} -> 1x1 -> {}x{o_total}x{oh}x{ow}, tile [{}, {}], tile_n {tile_n}, {threads} threads, math {math} served by f32 fma",
        dw.dtype.name(),
        dw.n,
        dw.c,
        dw.win.stride[0],
        dw.win.stride[1],
        dw.win.pad[0],
        dw.win.pad[1],
        dw.win.dilation[0],
        dw.win.dilation[1],
        dw.n,
        dw.channels,
        dw.n,
        tile[0],
        tile[1],
    );
    let grid = dw.n * o_total.div_ceil(tile_n) * dw.tiles(0, tile[0]) * dw.tiles(1, tile[1]);
    Ok(Kernel {
        shared,
        ..l.kernel(op, summary, params, body, [threads, grid])
    })
}

/// Stores every result of the group (`ys`, through the output `params`) at
/// the output element `coords` of `out_dims`, each read through its index
/// map with the accumulator bound as the convolution's value.
fn store_outputs(
    l: &mut Lower,
    params: &[Param],
    ys: &[ValueId],
    out_dims: &[usize],
    coords: Vec<Expr>,
) -> Result<()> {
    let linear = Index::coords(out_dims, coords.clone()).get_linear();
    let outputs = params.iter().filter(|p| p.output);
    for (param, &y) in outputs.zip(ys) {
        let idx = result_index(l, y, out_dims, linear.clone(), coords.clone());
        let v = l.value_at(y, &idx)?;
        store(l, param, l.g.ty(y).dtype, linear.clone(), v);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::kir::Kernel;
    use crate::lower::{EmitError, lower_graph};
    use crate::print::print_kernel;

    fn lower(src: &str) -> Result<Kernel, EmitError> {
        let module = dcir_reader::parse_module(src).expect("parses");
        lower_graph(&module.graphs[0]).map(|mut k| k.remove(0))
    }

    /// A direct conv group: `x: f32[1,c,17,17]`, weights `[o,cg,3,3]`, stride 2, pad 1.
    fn direct(c: usize, o: usize, groups: usize, attrs: &str) -> Result<Kernel, EmitError> {
        let cg = c / groups;
        lower(&format!(
            "graph @g(%x: f32[1,{c},17,17], %w: f32[{o},{cg},3,3]) -> (f32[1,{o},9,9]) {{\n\
             \x20 %y = fused @g0(%x.in = %x, %w.in = %w) {{algorithm = \"direct\", kind = \"conv\", level = \"register\", {attrs}}} : f32[1,{o},9,9] {{\n\
             \x20   %y.r = conv2d %x.in, %w.in {{stride = [2, 2], pad = [1, 1, 1, 1], groups = {groups}}} : f32[1,{o},9,9]\n\
             \x20   yield %y.r\n\
             \x20 }}\n\
             \x20 return %y\n\
             }}\n"
        ))
    }

    #[test]
    fn direct_checks_partial_strips_and_image_edges() {
        // 9x9 outputs in strips of 4x4: partial last strip and column group.
        let k = direct(5, 5, 5, "threads = 64, tile = [4, 4]").expect("lowers");
        let s = print_kernel(&k);
        assert!(
            s.contains("if (oy0 + 3 < 9)") && s.contains("if (ox0 + 3 < 9)"),
            "{s}"
        );
        // Stride 2: element loads only, at clamped coordinates, zero selected outside.
        assert!(s.contains("input per element, output per element"), "{s}");
        assert!(s.contains("min(max(ix0 + 8, 0), 16)"), "{s}");
        assert!(s.contains("(ix0 + 8 >= 0 && ix0 + 8 < 17) ? "), "{s}");
        // 5 channels x 3 strips x 3 column groups, one per thread; the 19
        // threads past them redo the last strip and store nothing.
        assert_eq!((k.grid, k.block, k.dynamic_shared), (1, 64, 0));
        assert!(s.contains("const int t = min(t_raw, 44);"), "{s}");
        assert!(s.contains("if (t_raw < 45)"), "{s}");
        assert!(k.shared.is_empty());
    }

    #[test]
    fn direct_loads_and_stores_aligned_rows_as_vectors() {
        let k = lower(
            "graph @g(%x: f32[2,8,16,16], %w: f32[8,1,3,3]) -> (f32[2,8,16,16]) {\n\
             \x20 %y = fused @g0(%x.in = %x, %w.in = %w) {algorithm = \"direct\", kind = \"conv\", level = \"register\", threads = 128, tile = [2, 4]} : f32[2,8,16,16] {\n\
             \x20   %y.r = conv2d %x.in, %w.in {pad = [1, 1, 1, 1], groups = 8} : f32[2,8,16,16]\n\
             \x20   yield %y.r\n\
             \x20 }\n\
             \x20 return %y\n\
             }\n",
        )
        .expect("lowers");
        let s = print_kernel(&k);
        assert!(
            s.contains("input in vectors of 4, output in vectors of 4"),
            "{s}"
        );
        // The span [ox0 - 1, ox0 + 4]: one float4 of a clamped row, and two
        // ends from the neighbouring lanes (loaded at the warp's edges).
        assert!(
            s.contains("const int v_row0 = min(max(iy0, 0), 15);"),
            "{s}"
        );
        assert!(
            s.contains(
                "reinterpret_cast<const float4*>(x_in)[((n * 8 + oc) * 16 + v_row0) * 4 + cg]"
            ),
            "{s}"
        );
        assert!(s.contains("__shfl_up_sync(0xffffffffu, xr[4], 1)"), "{s}");
        assert!(s.contains("__shfl_down_sync(0xffffffffu, xr[1], 1)"), "{s}");
        assert!(
            s.contains("if (lane < 1)") && s.contains("if (lane >= 31)"),
            "{s}"
        );
        // 256 threads, two full blocks: no clamp, no store guard.
        assert!(!s.contains("t_raw"), "{s}");
        assert!(s.contains("reinterpret_cast<float4*>(y_out)["), "{s}");
        // No bounds check on the rows: 16 is a multiple of 2.
        assert!(!s.contains("oy0 + 1 < 16"), "{s}");
    }

    #[test]
    fn direct_takes_depthwise_convs_only() {
        let e = direct(4, 4, 2, "threads = 64, tile = [4, 4]").unwrap_err();
        assert!(e.to_string().contains("not depthwise"), "{e}");
    }

    /// A depthwise_pointwise group: `c` depthwise channels at 56x56 into `o` channels.
    fn dwpw(c: usize, o: usize) -> Kernel {
        lower(&format!(
            "graph @g(%x: f32[1,{c},56,56], %w: f32[{c},1,3,3], %wp: f32[{o},{c},1,1]) -> (f32[1,{o},56,56]) {{\n\
             \x20 %y = fused @g0(%x.in = %x, %w.in = %w, %wp.in = %wp) {{kind = \"depthwise_pointwise\", level = \"shared\", math = \"fma\", threads = 256, tile = [8, 8], tile_n = 32}} : f32[1,{o},56,56] {{\n\
             \x20   %d = conv2d %x.in, %w.in {{pad = [1, 1, 1, 1], groups = {c}}} : f32[1,{c},56,56]\n\
             \x20   %r = relu %d : f32[1,{c},56,56]\n\
             \x20   %y.r = conv2d %r, %wp.in : f32[1,{o},56,56]\n\
             \x20   yield %y.r\n\
             \x20 }}\n\
             \x20 return %y\n\
             }}\n"
        ))
        .expect("lowers")
    }

    #[test]
    fn depthwise_channels_go_in_equal_chunks() {
        // 144 channels: 5 chunks of 29, the last padded with a zero channel.
        let s = print_kernel(&dwpw(144, 24));
        assert!(s.contains("k0 += 29"), "{s}");
        assert!(s.contains("mid[s] = kg < 144 ? v_r : 0.0f"), "{s}");
        // tile_n = 32 is capped at the 24 output channels: no channel check.
        assert!(s.contains("tile_n 24") && !s.contains("o < 24"), "{s}");
        // 5 channels: one chunk, no padding.
        let s = print_kernel(&dwpw(5, 24));
        assert!(s.contains("k0 += 5") && !s.contains("kg < 5"), "{s}");
    }
}
