//! The `gemm` family: one batched `matmul` with view prologues and an
//! elementwise epilogue, as an f32 CUDA-core (FMA) SIMT kernel.
//!
//! Each block computes a `tm × tn` output tile of one batch entry (the grid is
//! one-dimensional: `blockIdx.x` is split into batch, tile row and tile
//! column, since [`Kernel::grid`] has one dimension). Per `tk` step the block
//! stages an `A` tile (`tk × tm`, k-major) and a `B` tile (`tk × tn`) in
//! shared memory, loading through the operands' index maps (so reshape,
//! transpose and broadcast prologues cost nothing) with zeros past `M`, `N`,
//! `K`; then every thread accumulates its `TM × TN` micro-tile in registers
//! (rows `ty + i·threads_m`, columns `tx + j·threads_n`: conflict-free shared
//! reads, coalesced stores). The epilogue runs per accumulator through the
//! same index maps as the elementwise family, with the matmul's value bound
//! to the accumulator. f16/bf16 operands widen to f32 on load, accumulate in
//! f32 and round once at the end. `stages > 1` (cp.async multi-buffering) is
//! not honoured yet: the kernel is single-stage whatever the attribute says.

use std::collections::BTreeSet;

use dcir_ir::{Attr, OpId, OpKind, ValueId};

use super::{EmitError, Index, Lower, Reduced, attr_int, params, store, yields};
use crate::kir::{
    ArrayRef, BinOp, Builtin, Expr, Kernel, SharedArray, Stmt, Ty, add, bin, call, div, int, mul,
    rem, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// Splits `threads` into `threads_m × threads_n` dividing `tm × tn`, the
/// micro-tile as square as possible (wider than tall on a tie).
pub(super) fn thread_grid(tm: usize, tn: usize, threads: usize) -> Option<(usize, usize)> {
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

/// The op of `v`'s definition inside the group, if any.
fn def_op(l: &Lower, v: ValueId) -> Option<OpId> {
    match l.g.value(v).def {
        dcir_ir::ValueDef::OpResult { op, .. } => Some(op),
        dcir_ir::ValueDef::BlockArg { .. } => None,
    }
}

/// Checks that `v` is a view (reshape, transpose, broadcast, slice) of a group input.
fn check_prologue(l: &Lower, v: ValueId, which: &str) -> Result<()> {
    let mut v = v;
    while let Some(op) = def_op(l, v) {
        let data = l.g.op(op);
        if !matches!(
            data.kind,
            OpKind::Reshape | OpKind::Transpose | OpKind::Broadcast | OpKind::Slice
        ) {
            return Err(l.unsupported(format!(
                "`{}` feeding operand {which} of the matmul (only reshape, transpose, broadcast and slice prologues)",
                data.kind.name()
            )));
        }
        v = data.operands[0];
    }
    Ok(())
}

/// The epilogue: everything computed from the matmul result must be
/// elementwise math, casts, reshapes or transposes of it (one output element
/// per accumulator). Returns the values derived from the matmul result.
fn check_epilogue(l: &Lower, op: OpId, mm: ValueId) -> Result<BTreeSet<ValueId>> {
    let g = l.g;
    let region = g.op(op).region.expect("a fused op has a region");
    let mut tainted = BTreeSet::from([mm]);
    for &o in &g.block(region).ops {
        let data = g.op(o);
        if data.kind == OpKind::Yield || !data.operands.iter().any(|v| tainted.contains(v)) {
            continue;
        }
        let ok = data.kind.is_elementwise_binary()
            || data.kind.is_elementwise_unary()
            || matches!(
                data.kind,
                OpKind::Cast | OpKind::Reshape | OpKind::Transpose
            );
        if !ok {
            return Err(l.unsupported(format!(
                "`{}` after the matmul (only elementwise, reshape and transpose epilogues)",
                data.kind.name()
            )));
        }
        tainted.extend(data.results.iter().copied());
    }
    Ok(tainted)
}

/// Where the matmul element at `coords` (of the matmul's dims) lands in `y`:
/// follows the views between them forward. `None` when `y` does not derive
/// from the matmul result.
fn forward_coords(
    l: &Lower,
    tainted: &BTreeSet<ValueId>,
    mm: ValueId,
    y: ValueId,
    coords: Vec<Expr>,
) -> Option<Vec<Expr>> {
    if y == mm {
        return Some(coords);
    }
    let op = def_op(l, y)?;
    let data = l.g.op(op);
    let src = *data.operands.iter().find(|v| tainted.contains(v))?;
    let c = forward_coords(l, tainted, mm, src, coords)?;
    let src_dims = l.g.ty(src).dims().to_vec();
    let dims = l.g.ty(y).dims().to_vec();
    Some(match data.kind {
        OpKind::Reshape => {
            Index::linear(&dims, Index::coords(&src_dims, c).get_linear()).get_coords()
        }
        OpKind::Transpose => {
            let perm = data
                .attrs
                .get("perm")
                .and_then(Attr::as_ints)
                .unwrap_or(&[])
                .to_vec();
            perm.iter().map(|&p| c[p as usize].clone()).collect()
        }
        _ => c,
    })
}

fn let_int(name: &str, value: Expr) -> Stmt {
    Stmt::Let {
        name: name.into(),
        ty: Ty::I32,
        value,
        constant: true,
    }
}

fn array(name: &str, ty: Ty) -> ArrayRef {
    ArrayRef {
        name: name.into(),
        ty,
        reinterpret: false,
    }
}

fn lt(a: Expr, b: Expr) -> Expr {
    bin(BinOp::Lt, a, b)
}

fn and(a: Expr, b: Expr) -> Expr {
    bin(BinOp::And, a, b)
}

/// Stages one operand tile into shared memory: `rows × cols` of the operand
/// (`rows` along M or N, `cols` along K), stored k-major as `shared[k * rows + r]`.
/// `operand_coords(r, k)` gives the operand's coordinates; out-of-range
/// elements are stored as zero without being loaded.
#[allow(clippy::too_many_arguments)]
fn stage_tile(
    l: &mut Lower,
    operand: ValueId,
    shared: &str,
    rows: usize,
    tk: usize,
    threads: usize,
    row0: Expr,
    row_bound: usize,
    k_inner: bool,
    operand_coords: &dyn Fn(Expr, Expr) -> Vec<Expr>,
) -> Result<Vec<Stmt>> {
    let dims = l.g.ty(operand).dims().to_vec();
    let total = rows * tk;
    let (idx_var, r_var, k_var, g_r, g_k, val) = (
        format!("{shared}_i"),
        format!("{shared}_r"),
        format!("{shared}_k"),
        format!("{shared}_row"),
        format!("{shared}_col"),
        format!("{shared}_val"),
    );
    for n in [&idx_var, &r_var, &k_var, &g_r, &g_k, &val] {
        l.used_names.insert(n.clone());
    }
    // Walk the tile in the operand's memory order: consecutive threads read
    // consecutive addresses when K (or M/N) is the innermost dim.
    let (r, k) = if k_inner {
        (div(var(&idx_var), tk as i64), rem(var(&idx_var), tk as i64))
    } else {
        (
            rem(var(&idx_var), rows as i64),
            div(var(&idx_var), rows as i64),
        )
    };
    let load = l.scoped(|l| {
        let idx = Index::coords(&dims, operand_coords(var(&g_r), var(&g_k)));
        let v = l.value_at(operand, &idx)?;
        l.body.push(Stmt::Assign(val.clone(), v));
        Ok(())
    })?;
    let body = vec![
        let_int(&r_var, r),
        let_int(&k_var, k),
        let_int(&g_r, add(row0, var(&r_var))),
        let_int(&g_k, add(var("k0"), var(&k_var))),
        Stmt::Let {
            name: val.clone(),
            ty: Ty::F32,
            value: Expr::F32(0.0),
            constant: false,
        },
        Stmt::If(
            and(
                lt(var(&g_r), int(row_bound as i64)),
                lt(var(&g_k), var("K")),
            ),
            load,
        ),
        Stmt::Store(
            array(shared, Ty::F32),
            add(mul(var(&k_var), int(rows as i64)), var(&r_var)),
            var(&val),
        ),
    ];
    Ok(vec![Stmt::For {
        var: idx_var.clone(),
        start: Expr::Builtin(Builtin::ThreadX),
        end: int(total as i64),
        step: int(threads as i64),
        unroll: total.is_multiple_of(threads),
        body,
    }])
}

/// Lowers a `gemm` group.
pub(super) fn gemm(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    let params = params(l, op);
    let region = g.op(op).region.expect("a fused op has a region");
    let matmuls: Vec<OpId> = g
        .block(region)
        .ops
        .iter()
        .copied()
        .filter(|&o| g.op(o).kind == OpKind::Matmul)
        .collect();
    let [mm_op] = matmuls[..] else {
        return Err(l.unsupported(format!("a gemm group with {} matmuls", matmuls.len())));
    };
    let mm_data = g.op(mm_op);
    let (a, b) = (mm_data.operands[0], mm_data.operands[1]);
    let mm = mm_data.results[0];
    let flag = |name: &str| {
        matches!(mm_data.attrs.get(name), Some(Attr::Bool(true)))
            || mm_data.attrs.get(name).and_then(Attr::as_int) == Some(1)
    };
    let (ta, tb) = (flag("transpose_a"), flag("transpose_b"));
    if !g.ty(mm).dtype.is_float() {
        return Err(l.unsupported("an integer matmul"));
    }
    check_prologue(l, a, "A")?;
    check_prologue(l, b, "B")?;
    let tainted = check_epilogue(l, op, mm)?;

    let out_dims = g.ty(mm).dims().to_vec();
    let rank = out_dims.len();
    if rank < 2 {
        return Err(l.unsupported("a matmul of rank < 2"));
    }
    let (m, n) = (out_dims[rank - 2], out_dims[rank - 1]);
    let a_dims = g.ty(a).dims().to_vec();
    let k = a_dims[if ta { rank - 2 } else { rank - 1 }];
    let batch_dims = out_dims[..rank - 2].to_vec();
    let batch: usize = batch_dims.iter().product();
    if batch * m * n >= i32::MAX as usize || batch * m * k >= i32::MAX as usize {
        return Err(l.unsupported("more than 2^31 elements"));
    }
    if m * n * batch == 0 {
        return Err(l.unsupported("an empty matmul"));
    }

    let tile = g
        .op(op)
        .attrs
        .get("tile")
        .and_then(Attr::as_ints)
        .map(<[i64]>::to_vec)
        .unwrap_or_else(|| vec![64, 64, 8]);
    let [tm, tn, tk] = tile[..] else {
        return Err(l.unsupported(format!("tile = {tile:?}")));
    };
    let (tm, tn, tk) = (tm.max(1) as usize, tn.max(1) as usize, tk.max(1) as usize);
    let threads = attr_int(g, op, "threads", 256).clamp(1, 1024) as usize;
    let Some((threads_m, threads_n)) = thread_grid(tm, tn, threads) else {
        return Err(l.unsupported(format!(
            "tile [{tm}, {tn}] with {threads} threads (no even split)"
        )));
    };
    let (mt, nt) = (tm / threads_m, tn / threads_n);
    if mt * nt > 256 || (tm + tn) * tk * 4 > 48 * 1024 {
        return Err(l.unsupported(format!(
            "a {mt}x{nt} micro-tile or {} bytes of shared memory",
            (tm + tn) * tk * 4
        )));
    }
    let (grid_m, grid_n) = (m.div_ceil(tm), n.div_ceil(tn));

    for name in [
        "tile_n", "tile_m", "bz", "m0", "n0", "tx", "ty", "K", "k0", "kk", "i", "j", "acc",
        "a_frag", "b_frag", "row", "col", "As", "Bs",
    ] {
        l.used_names.insert(name.into());
    }
    let bid = Expr::Builtin(Builtin::BlockX);
    let tid = Expr::Builtin(Builtin::ThreadX);
    let mut body = vec![
        Stmt::Comment(format!(
            "block tile {tm}x{tn}x{tk}; {threads_m}x{threads_n} threads, each a {mt}x{nt} micro-tile"
        )),
        let_int("tile_n", rem(bid.clone(), grid_n as i64)),
        let_int(
            "tile_m",
            rem(div(bid.clone(), grid_n as i64), grid_m as i64),
        ),
        let_int("bz", div(bid, (grid_n * grid_m) as i64)),
        let_int("m0", mul(var("tile_m"), int(tm as i64))),
        let_int("n0", mul(var("tile_n"), int(tn as i64))),
        let_int("tx", rem(tid.clone(), threads_n as i64)),
        let_int("ty", div(tid, threads_n as i64)),
        let_int("K", int(k as i64)),
        Stmt::LocalArray {
            name: "acc".into(),
            ty: Ty::F32,
            len: mt * nt,
        },
        Stmt::For {
            var: "i".into(),
            start: int(0),
            end: int((mt * nt) as i64),
            step: int(1),
            unroll: true,
            body: vec![Stmt::Store(array("acc", Ty::F32), var("i"), Expr::F32(0.0))],
        },
    ];

    // Batch coordinates of this block, shared by both operands and the epilogue.
    let batch_coords = Index::linear(&batch_dims, var("bz")).get_coords();
    let with_batch = |last: [Expr; 2]| -> Vec<Expr> {
        let mut c = batch_coords.clone();
        c.extend(last);
        c
    };
    // A is [.., M, K] (or [.., K, M] with transpose_a); B is [.., K, N] (or [.., N, K]).
    let a_coords = |r: Expr, kk: Expr| with_batch(if ta { [kk, r] } else { [r, kk] });
    let b_coords = |c: Expr, kk: Expr| with_batch(if tb { [c, kk] } else { [kk, c] });
    let mut kloop = Vec::new();
    kloop.extend(stage_tile(
        l,
        a,
        "As",
        tm,
        tk,
        threads,
        var("m0"),
        m,
        !ta,
        &a_coords,
    )?);
    kloop.extend(stage_tile(
        l,
        b,
        "Bs",
        tn,
        tk,
        threads,
        var("n0"),
        n,
        tb,
        &b_coords,
    )?);
    kloop.push(Stmt::Barrier);
    let frag = |name: &str, shared: &str, len: usize, rows: usize, lane: &str, stride: usize| {
        vec![
            Stmt::LocalArray {
                name: name.into(),
                ty: Ty::F32,
                len,
            },
            Stmt::For {
                var: "i".into(),
                start: int(0),
                end: int(len as i64),
                step: int(1),
                unroll: true,
                body: vec![Stmt::Store(
                    array(name, Ty::F32),
                    var("i"),
                    Expr::Load(
                        array(shared, Ty::F32),
                        Box::new(add(
                            add(mul(var("kk"), int(rows as i64)), var(lane)),
                            mul(var("i"), int(stride as i64)),
                        )),
                    ),
                )],
            },
        ]
    };
    let mut inner = frag("a_frag", "As", mt, tm, "ty", threads_m);
    inner.extend(frag("b_frag", "Bs", nt, tn, "tx", threads_n));
    let acc_ij = add(mul(var("i"), int(nt as i64)), var("j"));
    inner.push(Stmt::For {
        var: "i".into(),
        start: int(0),
        end: int(mt as i64),
        step: int(1),
        unroll: true,
        body: vec![Stmt::For {
            var: "j".into(),
            start: int(0),
            end: int(nt as i64),
            step: int(1),
            unroll: true,
            body: vec![Stmt::Store(
                array("acc", Ty::F32),
                acc_ij.clone(),
                call(
                    "fmaf",
                    vec![
                        Expr::Load(array("a_frag", Ty::F32), Box::new(var("i"))),
                        Expr::Load(array("b_frag", Ty::F32), Box::new(var("j"))),
                        Expr::Load(array("acc", Ty::F32), Box::new(acc_ij.clone())),
                    ],
                ),
            )],
        }],
    });
    kloop.push(Stmt::For {
        var: "kk".into(),
        start: int(0),
        end: int(tk as i64),
        step: int(1),
        unroll: true,
        body: inner,
    });
    kloop.push(Stmt::Barrier);
    body.push(Stmt::Comment(
        "single stage: `stages` > 1 (multi-buffered loads) is not honoured yet".into(),
    ));
    body.push(Stmt::For {
        var: "k0".into(),
        start: int(0),
        end: var("K"),
        step: int(tk as i64),
        unroll: false,
        body: kloop,
    });

    // Epilogue: each accumulator through the group's elementwise tail, stored
    // where the views after the matmul put it.
    l.reduced = Some((
        mm,
        Reduced::Row(Expr::Load(array("acc", Ty::F32), Box::new(acc_ij))),
        0,
    ));
    let outputs: Vec<_> = params.iter().filter(|p| p.output).cloned().collect();
    let ys = yields(g, op);
    let mm_coords = with_batch([var("row"), var("col")]);
    let results = g.op(op).results.clone();
    let stores = l.scoped(|l| {
        for ((p, &y), &res) in outputs.iter().zip(&ys).zip(&results) {
            let Some(yc) = forward_coords(l, &tainted, mm, y, mm_coords.clone()) else {
                return Err(l.unsupported("a result that does not derive from the matmul"));
            };
            let y_dims = g.ty(y).dims().to_vec();
            let linear = Index::coords(&y_dims, yc.clone()).get_linear();
            let idx = Index {
                dims: y_dims,
                linear: Some(linear.clone()),
                coords: Some(yc),
            };
            let v = l.value_at(y, &idx)?;
            store(l, p, g.ty(res).dtype, linear, v);
        }
        Ok(())
    })?;
    body.push(Stmt::For {
        var: "i".into(),
        start: int(0),
        end: int(mt as i64),
        step: int(1),
        unroll: true,
        body: vec![Stmt::For {
            var: "j".into(),
            start: int(0),
            end: int(nt as i64),
            step: int(1),
            unroll: true,
            body: vec![
                let_int(
                    "row",
                    add(
                        add(var("m0"), var("ty")),
                        mul(var("i"), int(threads_m as i64)),
                    ),
                ),
                let_int(
                    "col",
                    add(
                        add(var("n0"), var("tx")),
                        mul(var("j"), int(threads_n as i64)),
                    ),
                ),
                Stmt::If(
                    and(lt(var("row"), int(m as i64)), lt(var("col"), int(n as i64))),
                    stores,
                ),
            ],
        }],
    });

    let in_dtype = g.ty(a).dtype;
    let summary = format!(
        "gemm ({}): {batch} x [{m} x {k}]{} @ [{k} x {n}]{}, tile [{tm}, {tn}, {tk}], {threads} threads, {mt}x{nt} per thread, fma",
        in_dtype.name(),
        if ta { "^T" } else { "" },
        if tb { "^T" } else { "" },
    );
    Ok(Kernel {
        name: super::kernel_name(g, op),
        summary,
        params,
        shared: vec![
            SharedArray {
                name: "As".into(),
                ty: Ty::F32,
                len: tm * tk,
            },
            SharedArray {
                name: "Bs".into(),
                ty: Ty::F32,
                len: tn * tk,
            },
        ],
        body,
        helpers: std::mem::take(&mut l.helpers),
        block: threads as u32,
        grid: (batch * grid_m * grid_n) as u32,
        dynamic_shared: 0,
    })
}

/// Lowers a `conv` group as an implicit GEMM.
pub(super) fn conv(l: &mut Lower, _op: OpId) -> Result<Kernel> {
    Err(l.unsupported("an implicit-GEMM conv"))
}
