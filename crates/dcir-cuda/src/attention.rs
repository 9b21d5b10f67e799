//! The `attention` family: GEMM → softmax → GEMM with online softmax
//! (FlashAttention-style), or either half of it.
//!
//! The scores `S = Q·Kᵀ` are a batched matmul `[.., M, D] × [.., D, N]`
//! (operands reached through views of the group's inputs), the ops between it
//! and the softmax (scale, additive mask) an elementwise epilogue, the
//! softmax runs over the last axis, and `P·V` is a second matmul
//! `[.., M, N] × [.., N, Dv]` followed by an epilogue (views back to the
//! model's layout, elementwise math).
//!
//! A block owns `block[0]` = `bm` query rows of one batch entry (`blockIdx.x`
//! = batch entry, row tile) and walks the keys in steps of `block[1]` = `bn`:
//!
//! - the Q tile (`D × bm`, k-major) is staged in shared memory once; per step
//!   the K tile (`D × bn`) and the V tile (`bn × Dv`) are staged through the
//!   index maps (views cost nothing, zeros past N and Dv);
//! - the threads form a `threads_m × threads_n` grid over the `bm × bn` score
//!   tile; a thread accumulates its `mt × nt` scores with FMA, then evaluates
//!   the group's ops up to the softmax's input per score with the matmul's
//!   value bound to the accumulator; scores past M or N are `-inf`;
//! - online softmax per row: the step's row max (warp shuffles over the
//!   row's `threads_n` lanes), the running max `m` and sum `l`, the O
//!   accumulator (`mt × ⌈Dv / threads_n⌉` per thread) rescaled by
//!   `exp(m_old − m_new)`, `p = exp(s − m_new)` written to shared memory;
//! - `O += P·V` from shared memory; after the last step `O / l` is bound to
//!   the second matmul's value and the epilogue stores through the views.
//!
//! Halves: a group GEMM → softmax makes the same first pass for `m` and `l`
//! and a second one that recomputes the scores and stores `exp(s − m) / l`
//! through the epilogue; a group softmax → GEMM reads its scores through
//! the index maps instead of computing them.
//!
//! Precision: f16/bf16 widen to f32 on load, all math is f32 FMA (no tensor
//! cores) and stays in f32 until the output's store (`docs/cuda.md`);
//! `P·V` uses the f32 `exp(s − m)` and divides by `l` last. `stages` is not
//! honoured; `math = "tensor_core"` is [`super::attention_tc`]'s.

use std::collections::BTreeSet;

use dcir_fusion::Reason;
use dcir_ir::{OpId, OpKind, ValueId};

use super::chain::{
    Contraction, SharedLayout, anchors, batch_coords, filled, thread_coords, with_lets,
};
use super::epilogue::{
    self, Output, check_elementwise_path, classify_outputs, derived, store_derived,
    store_independent,
};
use super::simt::{Fragment, Tile, crossing, rank1_update, stage};
use super::{EmitError, Index, Lower, Reduced, attr_int, params};
use crate::kir::{
    BinOp, Builtin, Expr, Helper, Kernel, Shuffle, Stmt, Ty, add, at, bin, call, counted, div,
    f32_array, guarded, int, let_float, let_int, lt, mul, rem, select, unrolled, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// Locals of the attention kernel, reserved before the parameters are named.
const NAMES: [&str; 31] = [
    "tile_m", "bz", "m0", "tx", "ty", "n0", "d", "key", "i", "j", "c", "e", "row", "col", "score",
    "s_val", "out_acc", "row_max", "row_sum", "tile_max", "tile_sum", "m_new", "m_use", "alpha",
    "p", "a_frag", "b_frag", "Qs", "Ks", "Vs", "Ps",
];

/// The parts of an attention group.
pub(super) struct Parts {
    /// `Q·Kᵀ`, absent when the group starts at the softmax.
    pub(super) qk: Option<Contraction>,
    /// The softmax's input (the scores after their epilogue) and result.
    pub(super) x: ValueId,
    pub(super) p: ValueId,
    /// `P·V`, absent when the group ends after the softmax.
    pub(super) pv: Option<Contraction>,
    /// Values derived from the group's last anchor (`P·V`, else the softmax).
    pub(super) last: BTreeSet<ValueId>,
    /// Results stored by the last anchor's epilogue, and results that use no anchor.
    pub(super) stored: Vec<Output>,
    pub(super) independent: Vec<Output>,
}

impl Parts {
    pub(super) fn find(l: &Lower, op: OpId, params: &[super::Param]) -> Result<Parts> {
        let g = l.g;
        let anchors = anchors(g, op);
        let kinds: Vec<OpKind> = anchors.iter().map(|&o| g.op(o).kind).collect();
        use OpKind::{Matmul, Softmax};
        let (qk_op, softmax, pv_op) = match kinds[..] {
            [Matmul, Softmax, Matmul] => (Some(anchors[0]), anchors[1], Some(anchors[2])),
            [Matmul, Softmax] => (Some(anchors[0]), anchors[1], None),
            [Softmax, Matmul] => (None, anchors[0], Some(anchors[1])),
            _ => {
                let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
                return Err(l.unsupported(format!(
                    "an attention group of {} (matmul, softmax, matmul or either half)",
                    names.join(" + ")
                )));
            }
        };
        let qk = qk_op.map(|o| Contraction::of(l, o)).transpose()?;
        let pv = pv_op.map(|o| Contraction::of(l, o)).transpose()?;
        let (x, p) = (g.op(softmax).operands[0], g.op(softmax).results[0]);
        let dims = g.ty(x).dims().to_vec();
        let rank = dims.len();
        if rank < 2 || g.op(softmax).attrs.int("axis") != Some(rank as i64 - 1) {
            return Err(l.unsupported("softmax over a dim that is not the innermost"));
        }
        let (batch_dims, m, n) = (&dims[..rank - 2], dims[rank - 2], dims[rank - 1]);
        let scores = match &qk {
            Some(qk) => {
                if qk.batch_dims != batch_dims || qk.rows != m || qk.cols != n {
                    return Err(l.unsupported("scores of another shape than the softmax"));
                }
                let set = derived(g, op, qk.result, &[softmax]);
                check_elementwise_path(l, &set, qk.result, x, "the softmax's input")?;
                set
            }
            None => BTreeSet::new(),
        };
        let probs = derived(g, op, p, pv_op.as_slice());
        let last = match &pv {
            Some(pv) => {
                if pv.a != p || pv.transposes_a() || pv.b == p {
                    return Err(l.unsupported(
                        "a second matmul that does not take the probabilities as its rows",
                    ));
                }
                if pv.batch_dims != batch_dims || pv.rows != m || pv.k != n {
                    return Err(l.unsupported("a second matmul of another shape"));
                }
                if scores.contains(&pv.b) {
                    return Err(l.unsupported("V computed from the scores"));
                }
                let set = derived(g, op, pv.result, &[]);
                epilogue::check(l, op, &set, &[], "the second matmul", false)?;
                set
            }
            None => {
                epilogue::check(l, op, &probs, &[], "the softmax", false)?;
                probs.clone()
            }
        };
        // Stages in order; results must come from the last one (or from none).
        let mut sets = vec![&scores, &probs];
        if pv.is_some() {
            sets.push(&last);
        }
        let mut stored = Vec::new();
        let mut independent = Vec::new();
        for (out, from) in classify_outputs(l, op, params, &sets)? {
            match from {
                None => independent.push(out),
                Some(i) if i == sets.len() - 1 => stored.push(out),
                Some(_) => {
                    return Err(l.unsupported(format!(
                        "result %{} taken from the scores or probabilities (only the last stage's results)",
                        g.value(out.value).name
                    )));
                }
            }
        }
        Ok(Parts {
            qk,
            x,
            p,
            pv,
            last,
            stored,
            independent,
        })
    }
}

/// Splits `threads` into `threads_m × threads_n` over the `bm × bn` score
/// tile: `threads_n` a power of two ≤ 32 dividing `bn` (a row's threads are
/// lanes of one warp, for the shuffle reductions), `threads_m` dividing `bm`.
/// Picks the split with the fewest shared-memory reads per key step (`d`
/// rank-1 updates of the scores, `bn` of the output) whose accumulators fit.
fn score_grid(bm: usize, bn: usize, threads: usize, d: usize, dv: usize) -> Option<(usize, usize)> {
    [32, 16, 8, 4, 2, 1]
        .into_iter()
        .filter(|&tn| {
            threads.is_multiple_of(tn) && bn.is_multiple_of(tn) && bm.is_multiple_of(threads / tn)
        })
        .map(|tn| (threads / tn, tn))
        .filter(|&(tm, tn)| (bm / tm) * (bn / tn + dv.div_ceil(tn)) <= MAX_ACCUMULATORS)
        .min_by_key(|&(tm, tn)| {
            let (mt, nt, nv) = (bm / tm, bn / tn, dv.div_ceil(tn));
            d * (mt + nt) + if dv > 0 { bn * (mt + nv) } else { 0 }
        })
}

/// Most score and output accumulators per thread (registers: ≤ 255 with the
/// fragments and row statistics).
const MAX_ACCUMULATORS: usize = 192;

/// Lowers an `attention` group (on tensor cores with `math = "tensor_core"`:
/// [`super::attention_tc`]).
pub(super) fn attention(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    if g.op(op).attrs.str("math") == Some("tensor_core") {
        return super::attention_tc::attention(l, op);
    }
    for n in NAMES {
        l.used_names.insert(n.into());
    }
    let params = params(l, op);
    let parts = Parts::find(l, op, &params)?;
    let x_dims = g.ty(parts.x).dims().to_vec();
    let rank = x_dims.len();
    let batch_dims = x_dims[..rank - 2].to_vec();
    let (m, n) = (x_dims[rank - 2], x_dims[rank - 1]);
    let batch: usize = batch_dims.iter().product();
    let d = parts.qk.as_ref().map_or(0, |qk| qk.k);
    let dv = parts.pv.as_ref().map_or(0, |pv| pv.cols);

    let block = g.op(op).attrs.ints("block").unwrap_or(&[64, 64]).to_vec();
    let [bm, bn] = block[..] else {
        return Err(l.unsupported(Reason::Parameters(format!("block = {block:?}"))));
    };
    let (bm, bn) = (bm.max(1) as usize, bn.max(1) as usize);
    let threads = attr_int(g, op, "threads", 256).clamp(32, 1024) as usize;
    let grid_split = if threads.is_multiple_of(32) {
        score_grid(bm, bn, threads, d, dv)
    } else {
        None
    };
    let Some((tm_t, tn_t)) = grid_split else {
        return Err(l.unsupported(Reason::Parameters(format!(
            "block [{bm}, {bn}] with {threads} threads (no split of whole warps with at most {MAX_ACCUMULATORS} accumulators per thread)"
        ))));
    };
    let (mt, nt) = (bm / tm_t, bn / tn_t);
    let nv = dv.div_ceil(tn_t);
    let dvp = nv * tn_t;
    let mut smem = SharedLayout::default();
    if d > 0 {
        smem.add("Qs", d * (bm + 1));
        smem.add("Ks", d * (bn + 1));
    }
    if dv > 0 {
        smem.add("Vs", bn * dvp);
        smem.add("Ps", bn * (bm + 1));
    }
    let (views, shared_bytes) = smem.finish();
    if shared_bytes > super::chain::MAX_SHARED {
        return Err(l.unsupported(Reason::SharedMemory {
            bytes: shared_bytes,
            detail: format!("block [{bm}, {bn}], head dims {d} and {dv}"),
        }));
    }
    let largest = (m * n).max(m * d).max(n * d).max(n * dv).max(m * dv);
    if batch * largest >= i32::MAX as usize {
        return Err(l.unsupported(Reason::TooLarge));
    }
    let grid_m = m.div_ceil(bm);

    let bid = Expr::Builtin(Builtin::BlockX);
    let mut body = vec![Stmt::Comment(format!(
        "{bm} query rows per block, keys in steps of {bn}; {tm_t}x{tn_t} threads, each {mt}x{nt} scores{}",
        if dv > 0 {
            format!(" and {mt}x{nv} outputs")
        } else {
            String::new()
        }
    ))];
    body.push(let_int("tile_m", rem(bid.clone(), grid_m as i64)));
    let bz = if batch > 1 {
        body.push(let_int("bz", div(bid, grid_m as i64)));
        var("bz")
    } else {
        int(0)
    };
    body.push(let_int("m0", mul(var("tile_m"), int(bm as i64))));
    body.extend(thread_coords(tm_t, tn_t, false));
    body.extend(views);
    let batch_coords = batch_coords(&batch_dims, bz);
    body.extend(filled("row_max", mt, f32::NEG_INFINITY));
    body.extend(filled("row_sum", mt, 0.0));
    if dv > 0 {
        body.extend(filled("out_acc", mt * nv, 0.0));
    }
    body.push(Stmt::LocalArray {
        name: "score".into(),
        ty: Ty::F32,
        len: mt * nt,
    });
    if let Some(qk) = &parts.qk {
        body.push(Stmt::Comment("the block's queries, once".into()));
        body.push(stage(
            l,
            &Tile {
                value: qk.a,
                shared: "Qs",
                rows: bm,
                cols: d,
                origin: [var("m0"), int(0)],
                bounds: [crossing(m, bm, true), None],
                index: &|r, k| qk.a_index(g, &batch_coords, r, k),
                slot: &|r, k| add(mul(k, int((bm + 1) as i64)), r),
                cols_inner: qk.a_k_contiguous(g),
            },
            threads,
        )?);
    }
    let plan = Plan {
        parts: &parts,
        batch_coords: &batch_coords,
        m,
        n,
        d,
        bm,
        bn,
        tm_t,
        tn_t,
        mt,
        nt,
        nv,
        dvp,
        threads,
    };

    // Pass 1: the scores of every key step, online softmax, O += P·V.
    let mut step = plan.stage_kv(l)?;
    step.extend(plan.scores(l)?);
    step.push(unrolled("i", mt, plan.online_softmax(l)));
    if dv > 0 {
        step.push(Stmt::Barrier);
        step.push(plan.accumulate_pv());
    }
    step.push(Stmt::Barrier);
    body.push(Stmt::Comment(
        "online softmax over the key steps".to_string() + if dv > 0 { ", O += P·V" } else { "" },
    ));
    body.push(counted("n0", int(0), int(n as i64), bn, step));

    if let Some(pv) = &parts.pv {
        body.push(Stmt::Comment("O / l through the epilogue".into()));
        body.push(plan.store_output(l, pv)?);
    } else {
        // Pass 2: recompute the scores, store exp(s - m) / l.
        let mut step = plan.stage_kv(l)?;
        step.extend(plan.scores(l)?);
        step.push(plan.store_probabilities(l)?);
        step.push(Stmt::Barrier);
        body.push(Stmt::Comment(
            "the probabilities: the scores again, exp(s - m) / l".into(),
        ));
        body.push(counted("n0", int(0), int(n as i64), bn, step));
    }
    body.extend(store_independent(l, &parts.independent)?);

    let shape = match (&parts.qk, &parts.pv) {
        (Some(_), Some(_)) => "gemm -> softmax -> gemm",
        (Some(_), None) => "gemm -> softmax",
        _ => "softmax -> gemm",
    };
    let summary = format!(
        "attention ({shape}, {}): {batch} x [{m} queries x {n} keys], head dims {d}/{dv}, block [{bm}, {bn}], {threads} threads, online softmax, fma",
        g.ty(parts.x).dtype.name(),
    );
    Ok(Kernel {
        dynamic_shared: shared_bytes,
        min_blocks_per_sm: 1,
        adapted: super::adapted_single_stage(g, op, "FMA attention"),
        ..l.kernel(op, summary, params, body, [threads, batch * grid_m])
    })
}

/// The sizes and thread split an attention kernel is built with (`tm_t ×
/// tn_t` threads, each `mt × nt` scores and `mt × nv` outputs; `dvp` = V's
/// head dim padded to whole `tn_t` columns).
struct Plan<'a> {
    parts: &'a Parts,
    batch_coords: &'a [Expr],
    m: usize,
    n: usize,
    d: usize,
    bm: usize,
    bn: usize,
    tm_t: usize,
    tn_t: usize,
    mt: usize,
    nt: usize,
    nv: usize,
    dvp: usize,
    threads: usize,
}

impl Plan<'_> {
    /// `row < M`, unless the row tiles cover M exactly.
    fn row_in_range(&self) -> Option<Expr> {
        crossing(self.m, self.bm, true).map(|m| lt(var("row"), int(m as i64)))
    }

    /// `col < N` for a key column, unless the key steps cover N exactly.
    fn key_in_range(&self) -> Option<Expr> {
        crossing(self.n, self.bn, true).map(|n| lt(var("col"), int(n as i64)))
    }

    /// `row` = `m0 + ty + i·threads_m` (this thread's row `i`) and `col` =
    /// `col0 + step·threads_n` (its column `step`).
    fn row_col(&self, col0: Expr, step: &str) -> Vec<Stmt> {
        vec![
            let_int(
                "row",
                add(
                    var("m0"),
                    add(var("ty"), mul(var("i"), int(self.tm_t as i64))),
                ),
            ),
            let_int("col", add(col0, mul(var(step), int(self.tn_t as i64)))),
        ]
    }

    /// Stages this step's K and V tiles, then a barrier.
    fn stage_kv(&self, l: &mut Lower) -> Result<Vec<Stmt>> {
        let g = l.g;
        let mut out = Vec::new();
        if let Some(qk) = &self.parts.qk {
            out.push(stage(
                l,
                &Tile {
                    value: qk.b,
                    shared: "Ks",
                    rows: self.bn,
                    cols: self.d,
                    origin: [var("n0"), int(0)],
                    bounds: [crossing(self.n, self.bn, true), None],
                    index: &|key, k| qk.b_index(g, self.batch_coords, k, key),
                    slot: &|key, k| add(mul(k, int((self.bn + 1) as i64)), key),
                    cols_inner: qk.b_k_contiguous(g),
                },
                self.threads,
            )?);
        }
        if let Some(pv) = &self.parts.pv {
            out.push(stage(
                l,
                &Tile {
                    value: pv.b,
                    shared: "Vs",
                    rows: self.bn,
                    cols: self.dvp,
                    origin: [var("n0"), int(0)],
                    bounds: [
                        crossing(self.n, self.bn, true),
                        (self.dvp > pv.cols).then_some(pv.cols),
                    ],
                    index: &|key, c| pv.b_index(g, self.batch_coords, key, c),
                    slot: &|key, c| add(mul(key, int(self.dvp as i64)), c),
                    cols_inner: pv.b_cols_contiguous(g),
                },
                self.threads,
            )?);
        }
        out.push(Stmt::Barrier);
        Ok(out)
    }

    /// This thread's scores of the step in `score[i·nt + j]`: `Q·Kᵀ` (or the
    /// loaded scores) through the ops up to the softmax; `-inf` past M or N.
    fn scores(&self, l: &mut Lower) -> Result<Vec<Stmt>> {
        let (mt, nt) = (self.mt, self.nt);
        let mut out = Vec::new();
        if self.parts.qk.is_some() {
            out.push(unrolled(
                "i",
                mt * nt,
                vec![Stmt::Store(f32_array("score"), var("i"), Expr::F32(0.0))],
            ));
            out.push(counted(
                "d",
                int(0),
                int(self.d as i64),
                1,
                rank1_update(
                    "score",
                    &Fragment::scalar(
                        "Qs",
                        add(mul(var("d"), int((self.bm + 1) as i64)), var("ty")),
                        self.tm_t,
                        mt,
                    ),
                    &Fragment::scalar(
                        "Ks",
                        add(mul(var("d"), int((self.bn + 1) as i64)), var("tx")),
                        self.tn_t,
                        nt,
                    ),
                ),
            ));
        }
        let slot = add(mul(var("i"), int(nt as i64)), var("j"));
        let conds = vec![self.row_in_range(), self.key_in_range()];
        let in_range = conds.iter().any(Option::is_some);
        let each = l.scoped(|l| {
            if let Some(qk) = &self.parts.qk {
                l.reduced = Some((qk.result, Reduced::Row(at("score", slot.clone())), 0));
            }
            let mut coords = self.batch_coords.to_vec();
            coords.extend([var("row"), var("col")]);
            let dims = l.g.ty(self.parts.x).dims().to_vec();
            let v = l.value_at(self.parts.x, &Index::coords(&dims, coords));
            l.reduced = None;
            let v = v?;
            if in_range {
                l.body.push(Stmt::Assign("s_val".into(), v));
            } else {
                l.body
                    .push(Stmt::Store(f32_array("score"), slot.clone(), v));
            }
            Ok(())
        })?;
        let per_score = if in_range {
            let mut body = vec![let_float("s_val", Expr::F32(f32::NEG_INFINITY), false)];
            body.extend(guarded(conds, each));
            body.push(Stmt::Store(f32_array("score"), slot, var("s_val")));
            body
        } else {
            each
        };
        let per_score = with_lets(self.row_col(add(var("n0"), var("tx")), "j"), per_score);
        out.push(unrolled("i", mt, vec![unrolled("j", nt, per_score)]));
        Ok(out)
    }

    /// The online softmax update of row `i` from this step's scores; with
    /// `P·V`, rescales the row's outputs and writes `p` to `Ps`.
    fn online_softmax(&self, l: &mut Lower) -> Vec<Stmt> {
        l.helpers.insert(Helper::NanMinMax);
        let (nt, tn_t) = (self.nt, self.tn_t);
        let max = |a: Expr, b: Expr| call("dcir_max", vec![a, b]);
        let score = at("score", add(mul(var("i"), int(nt as i64)), var("j")));
        let mut out = vec![
            let_float("tile_max", Expr::F32(f32::NEG_INFINITY), false),
            unrolled(
                "j",
                nt,
                vec![Stmt::Assign(
                    "tile_max".into(),
                    max(var("tile_max"), score.clone()),
                )],
            ),
        ];
        out.extend(shuffle_reduce("tile_max", tn_t, &max));
        out.extend([
            let_float("m_new", max(at("row_max", var("i")), var("tile_max")), true),
            Stmt::Comment("a row still all -inf keeps p = 0 (not exp(-inf + inf))".into()),
            let_float(
                "m_use",
                select(
                    bin(BinOp::Eq, var("m_new"), Expr::F32(f32::NEG_INFINITY)),
                    Expr::F32(0.0),
                    var("m_new"),
                ),
                true,
            ),
            let_float(
                "alpha",
                call(
                    "expf",
                    vec![bin(BinOp::Sub, at("row_max", var("i")), var("m_use"))],
                ),
                true,
            ),
            let_float("tile_sum", Expr::F32(0.0), false),
        ]);
        let mut per_score = vec![
            let_float(
                "p",
                call("expf", vec![bin(BinOp::Sub, score, var("m_use"))]),
                true,
            ),
            Stmt::Assign(
                "tile_sum".into(),
                bin(BinOp::Add, var("tile_sum"), var("p")),
            ),
        ];
        if self.nv > 0 {
            let key = add(var("tx"), mul(var("j"), int(tn_t as i64)));
            let row = add(var("ty"), mul(var("i"), int(self.tm_t as i64)));
            per_score.push(Stmt::Store(
                f32_array("Ps"),
                add(mul(key, int((self.bm + 1) as i64)), row),
                var("p"),
            ));
        }
        out.push(unrolled("j", nt, per_score));
        let add_f = |a: Expr, b: Expr| bin(BinOp::Add, a, b);
        out.extend(shuffle_reduce("tile_sum", tn_t, &add_f));
        out.extend([
            Stmt::Store(
                f32_array("row_sum"),
                var("i"),
                call(
                    "fmaf",
                    vec![at("row_sum", var("i")), var("alpha"), var("tile_sum")],
                ),
            ),
            Stmt::Store(f32_array("row_max"), var("i"), var("m_new")),
        ]);
        if self.nv > 0 {
            let o = add(mul(var("i"), int(self.nv as i64)), var("c"));
            out.push(unrolled(
                "c",
                self.nv,
                vec![Stmt::Store(
                    f32_array("out_acc"),
                    o.clone(),
                    bin(BinOp::Mul, at("out_acc", o), var("alpha")),
                )],
            ));
        }
        out
    }

    /// `O += P·V` over this step's keys, from `Ps` and `Vs`.
    fn accumulate_pv(&self) -> Stmt {
        counted(
            "key",
            int(0),
            int(self.bn as i64),
            1,
            rank1_update(
                "out_acc",
                &Fragment::scalar(
                    "Ps",
                    add(mul(var("key"), int((self.bm + 1) as i64)), var("ty")),
                    self.tm_t,
                    self.mt,
                ),
                &Fragment::scalar(
                    "Vs",
                    add(mul(var("key"), int(self.dvp as i64)), var("tx")),
                    self.tn_t,
                    self.nv,
                ),
            ),
        )
    }

    /// After the last step: `O / l` bound to `P·V`'s value, through the epilogue.
    fn store_output(&self, l: &mut Lower, pv: &Contraction) -> Result<Stmt> {
        let g = l.g;
        let o = at("out_acc", add(mul(var("i"), int(self.nv as i64)), var("c")));
        let value = bin(BinOp::Div, o, at("row_sum", var("i")));
        let stores = l.scoped(|l| {
            l.reduced = Some((pv.result, Reduced::Row(value), 0));
            let idx = pv.out_index(g, self.batch_coords, var("row"), var("col"));
            let result = store_derived(l, &self.parts.last, pv.result, &idx, &self.parts.stored);
            l.reduced = None;
            result
        })?;
        let conds = vec![
            self.row_in_range(),
            (self.dvp > pv.cols).then(|| lt(var("col"), int(pv.cols as i64))),
        ];
        let per_output = with_lets(self.row_col(var("tx"), "c"), guarded(conds, stores));
        Ok(unrolled(
            "i",
            self.mt,
            vec![unrolled("c", self.nv, per_output)],
        ))
    }

    /// Pass 2 of GEMM → softmax: `exp(s − m) / l` bound to the softmax's value, stored.
    fn store_probabilities(&self, l: &mut Lower) -> Result<Stmt> {
        let score = at("score", add(mul(var("i"), int(self.nt as i64)), var("j")));
        let value = bin(
            BinOp::Div,
            call(
                "expf",
                vec![bin(BinOp::Sub, score, at("row_max", var("i")))],
            ),
            at("row_sum", var("i")),
        );
        let dims = l.g.ty(self.parts.p).dims().to_vec();
        let mut coords = self.batch_coords.to_vec();
        coords.extend([var("row"), var("col")]);
        let stores = l.scoped(|l| {
            l.reduced = Some((self.parts.p, Reduced::Row(value), 0));
            let idx = Index::coords(&dims, coords);
            let parts = self.parts;
            let result = store_derived(l, &parts.last, parts.p, &idx, &parts.stored);
            l.reduced = None;
            result
        })?;
        let conds = vec![self.row_in_range(), self.key_in_range()];
        let per_score = with_lets(
            self.row_col(add(var("n0"), var("tx")), "j"),
            guarded(conds, stores),
        );
        Ok(unrolled(
            "i",
            self.mt,
            vec![unrolled("j", self.nt, per_score)],
        ))
    }
}

/// `acc = combine(acc, shfl_xor(acc, o))` for `o = lanes/2 .. 1`: the
/// reduction over a row's `lanes` consecutive lanes of a warp.
pub(super) fn shuffle_reduce(
    acc: &str,
    lanes: usize,
    combine: &dyn Fn(Expr, Expr) -> Expr,
) -> Vec<Stmt> {
    let mut out = Vec::new();
    let mut offset = lanes / 2;
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
    out
}

#[cfg(test)]
mod tests {
    use crate::emit_module_source;

    /// The CUDA source of an f32 attention group over 2 heads of `seq`
    /// queries and keys and head dim `d` (the probabilities a second result
    /// when `probs`), or the emitter's error.
    fn attention(
        seq: usize,
        d: usize,
        block: [usize; 2],
        threads: usize,
        probs: bool,
    ) -> Result<String, String> {
        let s = format!("f32[2,{seq},{seq}]");
        let x = format!("f32[2,{seq},{d}]");
        let (results, yields) = if probs {
            (format!("{x}, {s}"), "%o, %p")
        } else {
            (x.clone(), "%o")
        };
        let src = format!(
            "graph @g(%q: {x}, %k: {x}, %v: {x}) -> ({results}) {{\n\
             \x20 %r0, %r1 = fused @g0(%q.in = %q, %k.in = %k, %v.in = %v) {{block = [{}, {}], kind = \"attention\", level = \"shared\", math = \"fma\", stages = 1, threads = {threads}}} : {results} {{\n\
             \x20   %s = matmul %q.in, %k.in {{transpose_b = true}} : {s}\n\
             \x20   %c = constant {{value = 0.125}} : f32[]\n\
             \x20   %cb = broadcast %c {{dims = []}} : {s}\n\
             \x20   %t = mul %s, %cb : {s}\n\
             \x20   %p = softmax %t {{axis = 2}} : {s}\n\
             \x20   %o = matmul %p, %v.in : {x}\n\
             \x20   yield {yields}\n\
             \x20 }}\n\
             \x20 return %r0{}\n\
             }}\n",
            block[0],
            block[1],
            if probs { ", %r1" } else { "" }
        );
        let src = if probs {
            src
        } else {
            src.replace("%r0, %r1 = fused", "%r0 = fused")
        };
        let module = dcir_reader::parse_module(&src).map_err(|e| format!("{e:?}"))?;
        emit_module_source(&module).map_err(|e| e.to_string())
    }

    #[test]
    fn odd_sizes_check_bounds_and_pad_scores_with_minus_infinity() {
        let s = attention(17, 20, [16, 16], 64, false).expect("lowers");
        assert!(s.contains("if (row < 17 && col < 17)"), "{s}");
        assert!(
            s.contains("float s_val = __int_as_float(0xff800000);"),
            "{s}"
        );
        assert!(s.contains("if (Ks_row < 17)"), "{s}");
        // 8 threads per row: V's head dim 20 is padded to 24 columns.
        assert!(
            s.contains("8x8 threads, each 2x2 scores and 2x3 outputs"),
            "{s}"
        );
        assert!(s.contains("if (Vs_row < 17 && Vs_col < 20)"), "{s}");
        assert!(s.contains("if (row < 17 && col < 20)"), "{s}");
    }

    #[test]
    fn whole_tiles_need_no_bounds_checks() {
        let s = attention(128, 64, [64, 64], 128, false).expect("lowers");
        assert!(!s.contains("row <") && !s.contains("col <"), "{s}");
        assert!(!s.contains("s_val"), "{s}");
        assert!(
            s.contains("2 x [128 queries x 128 keys], head dims 64/64"),
            "{s}"
        );
    }

    #[test]
    fn unsupported_forms_say_why() {
        let e = attention(17, 256, [16, 256], 64, false).expect_err("too big");
        assert!(e.contains("bytes of shared memory"), "{e}");
        let e = attention(17, 24, [16, 16], 1024, false).expect_err("no warp split");
        assert!(e.contains("no split of whole warps"), "{e}");
        let e = attention(17, 24, [16, 16], 64, true).expect_err("probabilities");
        assert!(e.contains("taken from the scores or probabilities"), "{e}");
    }
}
