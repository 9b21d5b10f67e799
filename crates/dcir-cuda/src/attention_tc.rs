//! The tensor-core path of the `attention` family (`math = "tensor_core"`):
//! a whole GEMM → softmax → GEMM group with f16 or bf16 Q, K and V on
//! `mma.sync.aligned.m16n8k16` with f32 accumulators, online softmax in
//! registers (FlashAttention-2's layout). Its reach is
//! [`dcir_fusion::attention_tensor_core`], which the cost model offers
//! candidates by.
//!
//! A block owns `bm` query rows of one batch entry, one warp per 16 rows,
//! and walks the keys in steps of `bn`:
//!
//! - the Q tile is staged in shared memory once (through the index maps, as
//!   the FMA path stages it: views cost nothing, each element rounded once
//!   to the operands' dtype; rows past M zero), and each warp keeps its
//!   16 rows' A fragments in registers (`ldmatrix`);
//! - per step the K and V tiles are staged row by key (`[key][d]`, zeros
//!   past N), a barrier, then each warp computes its `16 × bn` scores as
//!   m16n8 fragments (K's B fragments by `ldmatrix`): lane `l` holds rows
//!   `l/4` and `l/4 + 8`, columns `2·(l%4) + {0, 1}` of each;
//! - the group's ops up to the softmax run per score with the matmul's value
//!   bound to the fragment element (scale, mask); scores past M or N are
//!   `-inf`;
//! - online softmax per row over the four lanes that share it (shuffles):
//!   running max `m` and sum `l`, the O fragments rescaled by
//!   `exp(m_old − m_new)`, `p = exp(s − m_new)` left in the score fragments;
//! - `O += P·V`: the score fragments of 16 keys are, packed in pairs to the
//!   operands' dtype, the A fragments of the second mma (the C layout of
//!   m16n8 is the A layout of m16k16), V's B fragments by `ldmatrix.trans`;
//! - after the last step `O / l` is bound to the second matmul's value and
//!   the epilogue stores through the views.
//!
//! Only the last key step, when N is not a multiple of `bn`, masks keys past
//! N, and it computes whole 16-key chunks up to N, not `bn` keys (ViT's 197
//! keys: 208 computed, not 224 or 256). Warps whose 16 query rows all lie
//! past M copy and wait with their block but skip the math.
//!
//! Shared rows are padded by 16 bytes, so the 8 rows an `ldmatrix` reads
//! fall in 8 different bank groups. One stage: a step's loads and its math
//! do not overlap within a block (other blocks on the SM fill the gaps).

use dcir_fusion::{Reason, attention_tensor_core};
use dcir_ir::{DType, OpId};

use super::attention::{Parts, shuffle_reduce};
use super::chain::{Contraction, batch_coords, filled, with_lets};
use super::epilogue::{store_derived, store_independent};
use super::gemm::{Lanes, lanes_stay_together, store_result_vectors};
use super::gemm_tc::{Chunk, Strided, copy_chunks, matmul_operand};
use super::simt::{Tile, crossing, stage_as};
use super::{EmitError, Index, Lower, Reduced, attr_int, params, vector_lane};
use crate::kir::{
    ArrayRef, BinOp, Builtin, Expr, Helper, Kernel, Stmt, Ty, add, at, bin, call, counted, div,
    f32_array, guarded, int, let_float, let_int, lt, mul, rem, select, unrolled, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// Locals of the kernel, reserved before the parameters are named.
const NAMES: [&str; 46] = [
    "tile_m", "bz", "m0", "warp", "lane", "grp", "quad", "w0", "smem", "qf", "kf", "vf", "pa",
    "sacc", "out_acc", "row_max", "row_sum", "tile_max", "tile_sum", "m_new", "m_use", "m_log2",
    "alpha", "p", "s_val", "row", "col", "n0", "kk", "j", "jp", "e", "h", "c", "cp", "i", "Qs",
    "Ks", "Vs", "buf", "row_inv", "vidx", "s", "lr", "lc", "staged_v",
];

/// Registers beyond the fragments a thread keeps: softmax state, loop
/// indices and shared addresses (ViT-B/16's [64, 32] blocks take 96, five
/// blocks of 128 threads per SM; [64, 64] takes 158, and a promise of four
/// blocks spills and is relaxed).
const STATE_REGISTERS: usize = 24;

/// Output columns a lane stores at once where the results keep them
/// together (16 bytes of 16-bit results), staged through Q's array.
const STAGED_COLUMNS: usize = 8;

/// The shared arrays' row padding, in elements (16 bytes).
const PAD: usize = 8;

/// `bz`, the block's batch entry, or 0 with one entry.
fn bz_expr(batch: usize) -> Expr {
    if batch > 1 { var("bz") } else { int(0) }
}

/// Lowers an `attention` group on tensor cores.
pub(super) fn attention(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    for n in NAMES {
        l.used_names.insert(n.into());
    }
    let params = params(l, op);
    let parts = Parts::find(l, op, &params)?;
    let (Some(qk), Some(pv)) = (&parts.qk, &parts.pv) else {
        return Err(l.unsupported(
            "tensor-core attention of half a group (it runs GEMM → softmax → GEMM whole)",
        ));
    };
    let x_dims = g.ty(parts.x).dims().to_vec();
    let rank = x_dims.len();
    let batch_dims = x_dims[..rank - 2].to_vec();
    let (m, n) = (x_dims[rank - 2], x_dims[rank - 1]);
    let batch: usize = batch_dims.iter().product();
    let (d, dv) = (qk.k, pv.cols);
    let dtype = g.ty(qk.a).dtype;
    if [qk.b, pv.b].iter().any(|&v| g.ty(v).dtype != dtype) {
        return Err(l.unsupported("tensor-core attention with Q, K and V of different dtypes"));
    }
    let block = g.op(op).attrs.ints("block").unwrap_or(&[64, 64]).to_vec();
    let [bm, bn] = block[..] else {
        return Err(l.unsupported(Reason::Parameters(format!("block = {block:?}"))));
    };
    let (bm, bn) = (bm.max(1) as usize, bn.max(1) as usize);
    let threads = attr_int(g, op, "threads", 2 * bm as i64).max(1) as usize;
    attention_tensor_core(dtype, d, dv, [bm, bn], threads).map_err(|r| l.unsupported(r))?;
    let largest = (m * n).max(m * d).max(n * d).max(n * dv).max(m * dv);
    if batch * largest >= i32::MAX as usize {
        return Err(l.unsupported(Reason::TooLarge));
    }
    let (stored, mma) = match dtype {
        DType::BF16 => (Ty::Bf16Bits, Helper::MmaBf16),
        _ => (Ty::F16Bits, Helper::MmaF16),
    };
    for h in [
        Helper::CpAsync,
        Helper::Ldmatrix,
        Helper::NanMinMax,
        Helper::Exp2,
        mma,
    ] {
        l.helpers.insert(h);
    }
    let batch_coords = batch_coords(&batch_dims, bz_expr(batch));
    // K is read along its head dim by key, V along its head dim: copied by
    // cp.async where each is a strided view with aligned runs of 8 there.
    let k_op = matmul_operand(l, qk.b, qk.transposes_b(), n, &batch_coords);
    let v_op = matmul_operand(l, pv.b, pv.transposes_b(), dv, &batch_coords);
    let k_copy = k_op.k_inner.then_some(k_op.strided.as_ref()).flatten();
    let v_copy = (!v_op.k_inner).then_some(v_op.strided.as_ref()).flatten();
    // A ring of `stages` K/V buffers (up to one per key step; the next
    // steps' copies in flight during this one's math) where both copy
    // asynchronously and `stages` asks for two or more.
    let stages = attr_int(g, op, "stages", 1).max(1) as usize;
    let pipelined = stages >= 2 && k_copy.is_some() && v_copy.is_some();
    let (dp, dvp) = (d + PAD, dv + PAD);
    let q_bytes = bm * dp * 2;
    let k_bytes = bn * dp * 2;
    let v_bytes = bn * dvp * 2;
    let buffers = if pipelined {
        stages.min(n.div_ceil(bn)).max(2)
    } else {
        1
    };
    let shared_bytes = q_bytes + buffers * (k_bytes + v_bytes);
    let grid_m = m.div_ceil(bm);

    let shape = Shape {
        m,
        n,
        d,
        dv,
        bm,
        dp,
        dvp,
        k_base: q_bytes,
        v_base: q_bytes + k_bytes,
        kv_stride: if pipelined { k_bytes + v_bytes } else { 0 },
        mma: match dtype {
            DType::BF16 => "dcir_mma_bf16",
            _ => "dcir_mma_f16",
        },
        pack: match dtype {
            DType::BF16 => "dcir_f2bf",
            _ => "dcir_f2h",
        },
    };
    l.helpers.insert(match dtype {
        DType::BF16 => Helper::Bfloat16,
        _ => Helper::Half,
    });

    let tid = Expr::Builtin(Builtin::ThreadX);
    let bid = Expr::Builtin(Builtin::BlockX);
    let mut body = vec![Stmt::Comment(format!(
        "{bm} query rows per block (a warp per 16), keys in steps of {bn}; m16n8k16 {} mma, f32 accumulators",
        dtype.name()
    ))];
    body.push(let_int("tile_m", rem(bid.clone(), grid_m as i64)));
    if batch > 1 {
        body.push(let_int("bz", div(bid, grid_m as i64)));
    }
    body.extend([
        let_int("m0", mul(var("tile_m"), int(bm as i64))),
        let_int("warp", div(tid.clone(), 32)),
        let_int("lane", rem(tid, 32)),
        let_int("grp", div(var("lane"), 4)),
        let_int("quad", rem(var("lane"), 4)),
        let_int("w0", mul(var("warp"), int(16))),
    ]);
    for (name, offset) in [("Qs", 0), ("Ks", q_bytes), ("Vs", q_bytes + k_bytes)] {
        body.push(Stmt::SharedView {
            name: name.into(),
            ty: stored,
            offset,
        });
    }
    body.push(Stmt::Let {
        name: "smem".into(),
        ty: Ty::U32,
        value: call("dcir_smem_u32", vec![var("dcir_smem")]),
        constant: true,
    });
    body.extend(filled("row_max", 2, f32::NEG_INFINITY));
    body.extend(filled("row_sum", 2, 0.0));
    body.extend(filled("out_acc", dv / 2, 0.0));
    body.push(local("sacc", Ty::F32, bn / 2));
    body.push(local("qf", Ty::U32, d / 4));
    body.push(local("kf", Ty::U32, 4));
    body.push(local("vf", Ty::U32, 4));
    body.push(local("pa", Ty::U32, 4));

    body.push(Stmt::Comment(
        "the block's queries, once; each warp's A fragments in registers".into(),
    ));
    let q_op = matmul_operand(l, qk.a, !qk.transposes_a(), m, &batch_coords);
    let q_copy = (q_op.k_inner).then_some(q_op.strided.as_ref()).flatten();
    let (stage_q, q_async) = stage_operand(
        l,
        &Tile {
            value: qk.a,
            shared: "Qs",
            rows: bm,
            cols: d,
            origin: [var("m0"), int(0)],
            bounds: [crossing(m, bm, true), None],
            index: &|r, k| qk.a_index(g, &batch_coords, r, k),
            slot: &|r, k| add(mul(r, int(dp as i64)), k),
            cols_inner: qk.a_k_contiguous(g),
        },
        Shared {
            base: int(0),
            pitch: dp,
        },
        q_copy.map(|sv| (sv, false)),
        threads,
        stored,
    )?;
    body.extend(stage_q);
    // The warps' Q fragments once Q is in: where Q and K/V copy
    // asynchronously, after the first key steps' copies are issued too (its
    // group first, so waiting for it leaves theirs in flight).
    let mut q_frags = vec![Stmt::Barrier];
    q_frags.push(unrolled(
        "kk",
        d / 16,
        vec![ldmatrix(
            "dcir_ldmatrix_x4",
            "qf",
            mul(var("kk"), int(4)),
            // Lane l reads row l%16 and k chunk l/16 of the warp's 16 × 16 block.
            shape.a_address(
                0,
                dp,
                add(var("w0"), rem(var("lane"), 16)),
                add(mul(var("kk"), int(16)), mul(div(var("lane"), 16), int(8))),
            ),
        )],
    ));

    // The K and V tiles of the keys from `origin` into buffer `buf`.
    let stage_kv = |l: &mut Lower, origin: Expr, buf: Expr| -> Result<(Vec<Stmt>, bool)> {
        let kv = int((k_bytes + v_bytes) as i64);
        let (stage_k, k_async) = stage_operand(
            l,
            &Tile {
                value: qk.b,
                shared: "Ks",
                rows: bn,
                cols: d,
                origin: [origin.clone(), int(0)],
                bounds: [crossing(n, bn, true), None],
                index: &|key, k| qk.b_index(g, &batch_coords, k, key),
                slot: &|key, k| add(mul(key, int(dp as i64)), k),
                cols_inner: qk.b_k_contiguous(g),
            },
            Shared {
                base: add(int(q_bytes as i64), mul(buf.clone(), kv.clone())),
                pitch: dp,
            },
            k_copy.map(|sv| (sv, false)),
            threads,
            stored,
        )?;
        // V's r is its head dim: chunks along it.
        let (stage_v, v_async) = stage_operand(
            l,
            &Tile {
                value: pv.b,
                shared: "Vs",
                rows: bn,
                cols: dv,
                origin: [origin, int(0)],
                bounds: [crossing(n, bn, true), None],
                index: &|key, c| pv.b_index(g, &batch_coords, key, c),
                slot: &|key, c| add(mul(key, int(dvp as i64)), c),
                cols_inner: pv.b_cols_contiguous(g),
            },
            Shared {
                base: add(int((q_bytes + k_bytes) as i64), mul(buf, kv)),
                pitch: dvp,
            },
            v_copy.map(|sv| (sv, true)),
            threads,
            stored,
        )?;
        Ok(([stage_k, stage_v].concat(), k_async || v_async))
    };
    // One key step: where pipelined, wait for its K and V, a barrier (every
    // warp is past the previous step's math), then the copies of the step
    // `buffers − 1` ahead into the buffer that step read; else its copies
    // and a barrier. Then `keys` keys of math (fewer than `bn` on the last,
    // partial step: whole 16-key chunks up to N, the only step that masks
    // keys past N). Warps whose 16 query rows all lie past M copy and wait
    // with the block but skip the math.
    let key_step = |l: &mut Lower, keys: Keys| -> Result<Vec<Stmt>> {
        let mut step = Vec::new();
        if pipelined {
            step.push(let_int(
                "buf",
                rem(div(var("n0"), bn as i64), buffers as i64),
            ));
            step.push(Stmt::Call(
                format!("dcir_cp_async_wait<{}>", buffers - 2),
                vec![],
            ));
            step.push(Stmt::Barrier);
            let ahead = ((buffers - 1) * bn) as i64;
            let (next, _) = stage_kv(
                l,
                add(var("n0"), int(ahead)),
                rem(add(var("buf"), int(buffers as i64 - 1)), buffers as i64),
            )?;
            step.push(Stmt::Comment(format!(
                "the K and V {ahead} keys on into the buffer the step before read (past the last key, an empty group)"
            )));
            step.push(Stmt::If(
                lt(add(var("n0"), int(ahead)), int(n as i64)),
                next,
            ));
            step.push(Stmt::Call("dcir_cp_async_commit".into(), vec![]));
        } else {
            let (copies, asynchronous) = stage_kv(l, var("n0"), int(0))?;
            step.extend(copies);
            if asynchronous {
                step.extend(wait_copies());
            }
            step.push(Stmt::Barrier);
        }
        let mut math = shape.scores(keys);
        math.extend(shape.score_epilogue(l, &parts, &batch_coords, keys)?);
        math.push(unrolled("h", 2, shape.online_softmax(keys)));
        math.extend(shape.accumulate_pv(keys));
        match crossing(m, bm, true) {
            Some(m) => step.push(Stmt::If(lt(add(var("m0"), var("w0")), int(m as i64)), math)),
            None => step.extend(math),
        }
        if !pipelined {
            step.push(Stmt::Barrier);
        }
        Ok(step)
    };
    match (q_async, pipelined) {
        (true, true) => {
            body.push(Stmt::Call("dcir_cp_async_commit".into(), vec![]));
            body.push(Stmt::Comment(format!(
                "{}, then wait for Q's",
                first_steps(buffers - 1)
            )));
            for s in 0..buffers - 1 {
                body.extend(stage_kv(l, int((s * bn) as i64), int(s as i64))?.0);
                body.push(Stmt::Call("dcir_cp_async_commit".into(), vec![]));
            }
            body.push(Stmt::Call(
                format!("dcir_cp_async_wait<{}>", buffers - 1),
                vec![],
            ));
            body.extend(q_frags);
        }
        (_, true) => {
            // Q staged element by element: in place at the barrier.
            body.extend(q_frags);
            body.push(Stmt::Comment(first_steps(buffers - 1)));
            for s in 0..buffers - 1 {
                body.extend(stage_kv(l, int((s * bn) as i64), int(s as i64))?.0);
                body.push(Stmt::Call("dcir_cp_async_commit".into(), vec![]));
            }
        }
        (true, false) => {
            body.extend(wait_copies());
            body.extend(q_frags);
        }
        (false, false) => body.extend(q_frags),
    }
    body.push(Stmt::Comment(
        "online softmax over the key steps, O += P·V".into(),
    ));
    let full_steps = n / bn * bn;
    if full_steps > 0 {
        let step = key_step(
            l,
            Keys {
                count: bn,
                masked: false,
            },
        )?;
        body.push(counted("n0", int(0), int(full_steps as i64), bn, step));
    }
    if full_steps < n {
        body.push(Stmt::Comment(format!(
            "the last, partial key step: whole chunks of 16 keys, those past {n} masked"
        )));
        let count = (n - full_steps).next_multiple_of(16);
        let step = key_step(
            l,
            Keys {
                count,
                masked: true,
            },
        )?;
        body.push(counted(
            "n0",
            int(full_steps as i64),
            int(n as i64),
            bn,
            step,
        ));
    }
    body.push(Stmt::Comment("O · (1 / l) through the epilogue, adjacent columns paired where the results keep them together".into()));
    body.extend(shape.store_output(l, &parts, pv, &batch_coords)?);
    body.extend(store_independent(l, &parts.independent)?);

    let summary = format!(
        "attention (gemm -> softmax -> gemm, {}): {batch} x [{m} queries x {n} keys], head dims {d}/{dv}, block [{bm}, {bn}], {threads} threads, online softmax, tensor cores",
        dtype.name(),
    );
    // Registers: the O and score accumulators, Q's fragments, K's, V's and
    // P's, and the softmax state and addresses; ptxas's report has the last
    // word (a spilling promise is relaxed).
    let registers = dv / 2 + bn / 2 + d / 4 + 12 + STATE_REGISTERS;
    let by_registers = 65536 / (threads * registers);
    let by_shared = super::chain::MAX_SHARED / shared_bytes;
    let blocks = by_registers.min(by_shared).clamp(1, 32) as u32;
    Ok(Kernel {
        dynamic_shared: shared_bytes,
        min_blocks_per_sm: super::gemm::occupancy_promise(blocks, batch * grid_m),
        ..l.kernel(op, summary, params, body, [threads, batch * grid_m])
    })
}

/// The keys one step computes: `count` (a multiple of 16, at most the
/// block's `bn`) from `n0`, masked past N when `masked`.
#[derive(Clone, Copy)]
struct Keys {
    count: usize,
    masked: bool,
}

/// Extents and layout of one kernel.
struct Shape {
    m: usize,
    n: usize,
    d: usize,
    dv: usize,
    bm: usize,
    /// Row pitches of Q and K, and of V, in elements.
    dp: usize,
    dvp: usize,
    /// Byte offsets of K's and V's shared arrays, and between their two
    /// buffers (0: one buffer).
    k_base: usize,
    v_base: usize,
    kv_stride: usize,
    /// The mma helper, and the f32 → operand conversion of P.
    mma: &'static str,
    pack: &'static str,
}

impl Shape {
    /// The shared address of element (`row`, `col`) of the array at byte
    /// `base` with rows of `pitch` elements.
    fn a_address(&self, base: usize, pitch: usize, row: Expr, col: Expr) -> Expr {
        add(
            add(var("smem"), int(base as i64)),
            mul(add(mul(row, int(pitch as i64)), col), int(2)),
        )
    }

    /// The same in this step's K/V buffer (`buf`) of the array at `base`.
    fn kv_address(&self, base: usize, pitch: usize, row: Expr, col: Expr) -> Expr {
        let at = self.a_address(base, pitch, row, col);
        match self.kv_stride {
            0 => at,
            stride => add(at, mul(var("buf"), int(stride as i64))),
        }
    }

    /// `row < M`, unless the row tiles cover M exactly.
    fn row_in_range(&self) -> Option<Expr> {
        crossing(self.m, self.bm, true).map(|m| lt(var("row"), int(m as i64)))
    }

    /// `col < N` for a key of a masked step.
    fn key_in_range(&self, keys: Keys) -> Option<Expr> {
        keys.masked.then(|| lt(var("col"), int(self.n as i64)))
    }

    /// `row` of fragment element `e` of this lane (`grp`, `grp + 8`).
    fn row(&self) -> Stmt {
        let_int(
            "row",
            add(
                add(var("m0"), var("w0")),
                add(var("grp"), mul(div(var("e"), 2), int(8))),
            ),
        )
    }

    /// The warp's `16 × keys` scores: `sacc[j·4 + e]` of n8 tile `j`.
    fn scores(&self, keys: Keys) -> Vec<Stmt> {
        let zero = unrolled(
            "i",
            keys.count / 2,
            vec![Stmt::Store(f32_array("sacc"), var("i"), Expr::F32(0.0))],
        );
        // Lane l reads key row (l/16)·8 + l%8 and k chunk (l/8)%2 of a 16-key pair.
        let key = add(
            mul(var("jp"), int(16)),
            add(mul(div(var("lane"), 16), int(8)), rem(var("lane"), 8)),
        );
        let k = add(
            mul(var("kk"), int(16)),
            mul(rem(div(var("lane"), 8), 2), int(8)),
        );
        let pair = vec![
            ldmatrix(
                "dcir_ldmatrix_x4",
                "kf",
                int(0),
                self.kv_address(self.k_base, self.dp, key, k),
            ),
            self.mma_call(
                "sacc",
                mul(var("jp"), int(2)),
                "qf",
                mul(var("kk"), int(4)),
                "kf",
                0,
            ),
            self.mma_call(
                "sacc",
                add(mul(var("jp"), int(2)), int(1)),
                "qf",
                mul(var("kk"), int(4)),
                "kf",
                2,
            ),
        ];
        vec![
            zero,
            unrolled(
                "kk",
                self.d / 16,
                vec![unrolled("jp", keys.count / 16, pair)],
            ),
        ]
    }

    /// `mma(acc[tile·4 ..], a[a0 ..], b[b0], b[b0 + 1])`.
    fn mma_call(&self, acc: &str, tile: Expr, a: &str, a0: Expr, b: &str, b0: i64) -> Stmt {
        let mut args: Vec<Expr> = (0..4)
            .map(|q| at(acc, add(mul(tile.clone(), int(4)), int(q))))
            .collect();
        args.extend((0..4).map(|q| u32_at(a, add(a0.clone(), int(q)))));
        args.extend((0..2).map(|q| u32_at(b, int(b0 + q))));
        Stmt::Call(self.mma.into(), args)
    }

    /// The group's ops up to the softmax per score, `-inf` past M or N.
    fn score_epilogue(
        &self,
        l: &mut Lower,
        parts: &Parts,
        batch: &[Expr],
        keys: Keys,
    ) -> Result<Vec<Stmt>> {
        let qk = parts.qk.as_ref().expect("a whole attention group");
        let slot = add(mul(var("j"), int(4)), var("e"));
        let conds = vec![self.row_in_range(), self.key_in_range(keys)];
        let in_range = conds.iter().any(Option::is_some);
        let each = l.scoped(|l| {
            l.reduced = Some((qk.result, Reduced::Row(at("sacc", slot.clone())), 0));
            let mut coords = batch.to_vec();
            coords.extend([var("row"), var("col")]);
            let dims = l.g.ty(parts.x).dims().to_vec();
            let v = l.value_at(parts.x, &Index::coords(&dims, coords));
            l.reduced = None;
            l.body.push(Stmt::Assign("s_val".into(), v?));
            Ok(())
        })?;
        let mut per_score = vec![let_float("s_val", Expr::F32(f32::NEG_INFINITY), false)];
        if in_range {
            per_score.extend(guarded(conds, each));
        } else {
            per_score.extend(each);
        }
        per_score.push(Stmt::Store(f32_array("sacc"), slot, var("s_val")));
        let lets = vec![
            self.row(),
            let_int(
                "col",
                add(
                    add(var("n0"), mul(var("j"), int(8))),
                    add(mul(var("quad"), int(2)), rem(var("e"), 2)),
                ),
            ),
        ];
        Ok(vec![unrolled(
            "j",
            keys.count / 8,
            vec![unrolled("e", 4, with_lets(lets, per_score))],
        )])
    }

    /// The online softmax update of this lane's row half `h` (elements
    /// `2h`, `2h + 1` of each score tile); rescales its outputs and leaves
    /// `p` in the scores.
    fn online_softmax(&self, keys: Keys) -> Vec<Stmt> {
        let max = |a: Expr, b: Expr| call("dcir_max", vec![a, b]);
        let (tiles, outs) = (keys.count / 8, self.dv / 8);
        let elem = |tile: &str| add(add(mul(var(tile), int(4)), mul(var("h"), int(2))), var("e"));
        let mut out = vec![
            let_float("tile_max", Expr::F32(f32::NEG_INFINITY), false),
            unrolled(
                "j",
                tiles,
                vec![unrolled(
                    "e",
                    2,
                    vec![Stmt::Assign(
                        "tile_max".into(),
                        max(var("tile_max"), at("sacc", elem("j"))),
                    )],
                )],
            ),
        ];
        out.extend(shuffle_reduce("tile_max", 4, &max));
        out.extend([
            let_float("m_new", max(at("row_max", var("h")), var("tile_max")), true),
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
            Stmt::Comment("exp(x - m) as 2^(x·log2 e - m·log2 e): one fma and ex2".into()),
            let_float(
                "m_log2",
                bin(BinOp::Mul, var("m_use"), Expr::F32(LOG2_E)),
                true,
            ),
            let_float("alpha", exp2_minus(at("row_max", var("h"))), true),
            let_float("tile_sum", Expr::F32(0.0), false),
            unrolled(
                "j",
                tiles,
                vec![unrolled(
                    "e",
                    2,
                    vec![
                        let_float("p", exp2_minus(at("sacc", elem("j"))), true),
                        Stmt::Store(f32_array("sacc"), elem("j"), var("p")),
                        Stmt::Assign(
                            "tile_sum".into(),
                            bin(BinOp::Add, var("tile_sum"), var("p")),
                        ),
                    ],
                )],
            ),
        ]);
        let add_f = |a: Expr, b: Expr| bin(BinOp::Add, a, b);
        out.extend(shuffle_reduce("tile_sum", 4, &add_f));
        out.extend([
            Stmt::Store(
                f32_array("row_sum"),
                var("h"),
                call(
                    "fmaf",
                    vec![at("row_sum", var("h")), var("alpha"), var("tile_sum")],
                ),
            ),
            Stmt::Store(f32_array("row_max"), var("h"), var("m_new")),
            unrolled(
                "c",
                outs,
                vec![unrolled(
                    "e",
                    2,
                    vec![Stmt::Store(
                        f32_array("out_acc"),
                        elem("c"),
                        bin(BinOp::Mul, at("out_acc", elem("c")), var("alpha")),
                    )],
                )],
            ),
        ]);
        out
    }

    /// `O += P·V` over the step's keys: P's A fragments packed from the
    /// scores of each 16 keys, V's B fragments by `ldmatrix.trans`.
    fn accumulate_pv(&self, keys: Keys) -> Vec<Stmt> {
        let word = |tile: Expr, e: i64| {
            let lane = |k: i64| {
                Expr::Cast(
                    Ty::U32,
                    Box::new(call(
                        self.pack,
                        vec![at("sacc", add(mul(tile.clone(), int(4)), int(e + k)))],
                    )),
                )
            };
            bin(BinOp::BitOr, lane(0), bin(BinOp::Shl, lane(1), int(16)))
        };
        let (t0, t1) = (mul(var("kk"), int(2)), add(mul(var("kk"), int(2)), int(1)));
        let mut per_kk: Vec<Stmt> = [(&t0, 0), (&t0, 2), (&t1, 0), (&t1, 2)]
            .into_iter()
            .enumerate()
            .map(|(q, (tile, e))| {
                Stmt::Store(u32_array("pa"), int(q as i64), word(tile.clone(), e))
            })
            .collect();
        // Lane l reads key row l%16 and dv chunk l/16 of a 16 × 16 block.
        let key = add(mul(var("kk"), int(16)), rem(var("lane"), 16));
        let col = add(mul(var("cp"), int(16)), mul(div(var("lane"), 16), int(8)));
        per_kk.push(unrolled(
            "cp",
            self.dv / 16,
            vec![
                ldmatrix(
                    "dcir_ldmatrix_x4_trans",
                    "vf",
                    int(0),
                    self.kv_address(self.v_base, self.dvp, key, col),
                ),
                self.mma_call("out_acc", mul(var("cp"), int(2)), "pa", int(0), "vf", 0),
                self.mma_call(
                    "out_acc",
                    add(mul(var("cp"), int(2)), int(1)),
                    "pa",
                    int(0),
                    "vf",
                    2,
                ),
            ],
        ));
        vec![unrolled("kk", keys.count / 16, per_kk)]
    }

    /// After the last step: `O · (1 / l)` bound to `P·V`'s value, through
    /// the epilogue; a fragment's two adjacent columns as one 4-byte store
    /// where every stored result is 16-bit and keeps them together.
    fn store_output(
        &self,
        l: &mut Lower,
        parts: &Parts,
        pv: &Contraction,
        batch: &[Expr],
    ) -> Result<Vec<Stmt>> {
        let g = l.g;
        let mut out = vec![local("row_inv", Ty::F32, 2)];
        out.push(unrolled(
            "h",
            2,
            vec![Stmt::Store(
                f32_array("row_inv"),
                var("h"),
                bin(BinOp::Div, Expr::F32(1.0), at("row_sum", var("h"))),
            )],
        ));
        let acc = |e: Expr| {
            bin(
                BinOp::Mul,
                at("out_acc", add(mul(var("c"), int(4)), e.clone())),
                at("row_inv", div(e, 2)),
            )
        };
        let col_axis = g.ty(pv.result).dims().len() - 1;
        let together = |width: usize| {
            pv.is_matmul()
                && parts.stored.iter().all(|o| {
                    matches!(o.dtype, DType::F16 | DType::BF16)
                        && lanes_stay_together(
                            g,
                            &parts.last,
                            (pv.result, Lanes::Along(col_axis)),
                            o.value,
                            width,
                        )
                })
        };
        let params: Vec<&super::Param> = parts.stored.iter().map(|o| &o.param).collect();
        let ys: Vec<_> = parts.stored.iter().map(|o| o.value).collect();
        // One vector store per result of `width` consecutive columns of
        // `row`: lane `j`'s column and value from `lane`.
        let store_lanes = |l: &mut Lower,
                           width: usize,
                           lane: &dyn Fn(&mut Lower, usize) -> (Expr, Expr)|
         -> Result<Vec<Stmt>> {
            l.scoped(|l| {
                let lanes: Vec<(Vec<Expr>, Expr)> = (0..width)
                    .map(|j| {
                        let (col, value) = lane(l, j);
                        let mut coords = batch.to_vec();
                        coords.extend([var("row"), col]);
                        (coords, value)
                    })
                    .collect();
                let result = store_result_vectors(
                    l,
                    &parts.last,
                    pv.result,
                    "vidx",
                    None,
                    &lanes,
                    &params,
                    &ys,
                    &ys,
                );
                l.reduced = None;
                result
            })
        };
        let col = add(mul(var("c"), int(8)), mul(var("quad"), int(2)));
        if self.dv <= self.dp && together(STAGED_COLUMNS) {
            // The warp's 16 rows, rounded to the product's dtype, into its own
            // rows of Q's array (Q is in its registers), two columns a word.
            let dtype = g.ty(pv.result).dtype;
            let (lo, hi) = (
                l.narrow(dtype, acc(mul(var("h"), int(2)))),
                l.narrow(dtype, acc(add(mul(var("h"), int(2)), int(1)))),
            );
            let word = bin(
                BinOp::BitOr,
                Expr::Cast(Ty::U32, Box::new(lo)),
                bin(BinOp::Shl, Expr::Cast(Ty::U32, Box::new(hi)), int(16)),
            );
            let staged_row = add(var("w0"), add(var("grp"), mul(var("h"), int(8))));
            let q_words = ArrayRef {
                name: "Qs".into(),
                ty: Ty::U32,
                reinterpret: true,
            };
            out.push(unrolled(
                "c",
                self.dv / 8,
                vec![unrolled(
                    "h",
                    2,
                    vec![Stmt::Store(
                        q_words,
                        div(add(mul(staged_row, int(self.dp as i64)), col), 2),
                        word,
                    )],
                )],
            ));
            out.push(Stmt::Call("__syncwarp".into(), vec![]));
            // Then each lane 8 columns at a time, the rows' vectors in order.
            let per_row = (self.dv / STAGED_COLUMNS) as i64;
            let vector = add(mul(var("i"), int(32)), var("lane"));
            let staged_v = Expr::Load(
                ArrayRef {
                    name: "Qs".into(),
                    ty: Ty::Uint4,
                    reinterpret: true,
                },
                Box::new(div(
                    add(
                        mul(add(var("w0"), var("lr")), int(self.dp as i64)),
                        var("lc"),
                    ),
                    STAGED_COLUMNS as i64,
                )),
            );
            let stores = store_lanes(l, STAGED_COLUMNS, &|l, j| {
                let value = vector_lane("staged_v".into(), dtype, STAGED_COLUMNS, j);
                (add(var("lc"), int(j as i64)), l.widen(dtype, value))
            })?;
            let lets = vec![
                let_int("lr", div(vector.clone(), per_row)),
                let_int("lc", mul(rem(vector, per_row), int(STAGED_COLUMNS as i64))),
                let_int("row", add(add(var("m0"), var("w0")), var("lr"))),
            ];
            let load = Stmt::Let {
                name: "staged_v".into(),
                ty: Ty::Uint4,
                value: staged_v,
                constant: true,
            };
            let per_vector = with_lets(
                lets,
                guarded(
                    vec![self.row_in_range()],
                    std::iter::once(load).chain(stores).collect(),
                ),
            );
            out.push(Stmt::For {
                var: "i".into(),
                start: int(0),
                end: int(16 * per_row / 32),
                step: int(1),
                unroll: true,
                body: per_vector,
            });
            return Ok(out);
        }
        if together(2) {
            let stores = store_lanes(l, 2, &|_, j| {
                let j = j as i64;
                (
                    add(var("col"), int(j)),
                    acc(add(mul(var("h"), int(2)), int(j))),
                )
            })?;
            let row = add(
                add(var("m0"), var("w0")),
                add(var("grp"), mul(var("h"), int(8))),
            );
            let lets = vec![let_int("row", row), let_int("col", col)];
            let per_pair = with_lets(lets, guarded(vec![self.row_in_range()], stores));
            out.push(unrolled("c", self.dv / 8, vec![unrolled("h", 2, per_pair)]));
            return Ok(out);
        }
        let stores = l.scoped(|l| {
            l.reduced = Some((pv.result, Reduced::Row(acc(var("e"))), 0));
            let idx = pv.out_index(g, batch, var("row"), var("col"));
            let result = store_derived(l, &parts.last, pv.result, &idx, &parts.stored);
            l.reduced = None;
            result
        })?;
        let lets = vec![self.row(), let_int("col", add(col, rem(var("e"), 2)))];
        let per_output = with_lets(lets, guarded(vec![self.row_in_range()], stores));
        out.push(unrolled(
            "c",
            self.dv / 8,
            vec![unrolled("e", 4, per_output)],
        ));
        Ok(out)
    }
}

/// Where a tile lives in shared memory: byte offset and row pitch (elements).
struct Shared {
    base: Expr,
    pitch: usize,
}

/// Stages tile `t` (its global row and column from `t.origin`) into the
/// shared array at `at`: with `copy` — a strided view of a kernel parameter
/// contiguous along the tile's columns in aligned runs of 8, whose (r, k)
/// are the tile's (row, column), or (column, row) when flagged — as 16-byte
/// `cp.async` copies ([`copy_chunks`]; zeros past the row bound; true is
/// returned: the caller commits and waits), else
/// element by element through the index maps ([`stage_as`]).
fn stage_operand(
    l: &mut Lower,
    t: &Tile,
    at: Shared,
    copy: Option<(&Strided, bool)>,
    threads: usize,
    stored: Ty,
) -> Result<(Vec<Stmt>, bool)> {
    let Some((sv, swapped)) = copy else {
        return Ok((vec![stage_as(l, t, threads, stored)?], false));
    };
    let s = t.shared;
    let name = |x: &str| format!("{s}_{x}");
    for x in ["i", "r", "c", "row"] {
        l.used_names.insert(name(x));
    }
    let chunks = t.cols / 8;
    let total = t.rows * chunks;
    let copies = copy_chunks(&sv.param, total.div_ceil(threads), |step| {
        let i = add(
            Expr::Builtin(Builtin::ThreadX),
            mul(step, int(threads as i64)),
        );
        let col = add(t.origin[1].clone(), var(name("c")));
        let src = if swapped {
            sv.at(col, var(name("row")))
        } else {
            sv.at(var(name("row")), col)
        };
        let dst = add(
            add(var("smem"), at.base.clone()),
            mul(
                add(mul(var(name("r")), int(at.pitch as i64)), var(name("c"))),
                int(2),
            ),
        );
        Chunk {
            lets: vec![
                let_int(&name("i"), i),
                let_int(&name("r"), div(var(name("i")), chunks as i64)),
                let_int(&name("c"), mul(rem(var(name("i")), chunks as i64), int(8))),
                let_int(&name("row"), add(t.origin[0].clone(), var(name("r")))),
            ],
            dst,
            src,
            full: t.bounds[0].map(|b| lt(var(name("row")), int(b as i64))),
            present: (!total.is_multiple_of(threads))
                .then(|| lt(var(name("i")), int(total as i64))),
        }
    });
    Ok((copies, true))
}

/// What the copies ahead of the first key step are, in a comment.
fn first_steps(count: usize) -> String {
    match count {
        1 => "the first key step's K and V in flight".into(),
        _ => format!("the first {count} key steps' K and V in flight, a group each"),
    }
}

/// Commits this thread's copies and waits for them (a barrier follows).
/// log2 e, the factor that turns `exp` into `exp2`.
const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// `exp(x − m_use)` as `dcir_exp2(x·log2 e − m_log2)`: -inf stays 0.
fn exp2_minus(x: Expr) -> Expr {
    let scaled = call(
        "fmaf",
        vec![x, Expr::F32(LOG2_E), Expr::Neg(Box::new(var("m_log2")))],
    );
    call("dcir_exp2", vec![scaled])
}

fn wait_copies() -> [Stmt; 2] {
    [
        Stmt::Call("dcir_cp_async_commit".into(), vec![]),
        Stmt::Call("dcir_cp_async_wait<0>".into(), vec![]),
    ]
}

/// `ty name[len];`
fn local(name: &str, ty: Ty, len: usize) -> Stmt {
    Stmt::LocalArray {
        name: name.into(),
        ty,
        len,
    }
}

fn u32_array(name: &str) -> ArrayRef {
    ArrayRef {
        name: name.into(),
        ty: Ty::U32,
        reinterpret: false,
    }
}

fn u32_at(name: &str, index: Expr) -> Expr {
    Expr::Load(u32_array(name), Box::new(index))
}

/// An x4 `ldmatrix` (`f`) at shared address `addr` into `frag[first ..
/// first + 4]`.
fn ldmatrix(f: &str, frag: &str, first: Expr, addr: Expr) -> Stmt {
    let mut args: Vec<Expr> = (0..4)
        .map(|q| u32_at(frag, add(first.clone(), int(q))))
        .collect();
    args.push(addr);
    Stmt::Call(f.into(), args)
}

#[cfg(test)]
mod tests {
    use crate::emit_module_source;

    /// The CUDA source of a tensor-core attention group over 2 heads of
    /// `seq` tokens and head dim `d` in `dtype` (K stored head dim first when
    /// `k_t`), or the emitter's error.
    fn attention(
        dtype: &str,
        seq: usize,
        d: usize,
        block: [usize; 2],
        stages: usize,
        k_t: bool,
    ) -> Result<String, String> {
        let x = format!("{dtype}[2,{seq},{d}]");
        let s = format!("{dtype}[2,{seq},{seq}]");
        let (k_ty, k_flag) = if k_t {
            (format!("{dtype}[2,{d},{seq}]"), "")
        } else {
            (x.clone(), " {transpose_b = true}")
        };
        let src = format!(
            "graph @g(%q: {x}, %k: {k_ty}, %v: {x}) -> ({x}) {{\n\
             \x20 %r = fused @g0(%q.in = %q, %k.in = %k, %v.in = %v) {{block = [{}, {}], kind = \"attention\", level = \"shared\", math = \"tensor_core\", stages = {stages}, threads = {}}} : {x} {{\n\
             \x20   %s = matmul %q.in, %k.in{k_flag} : {s}\n\
             \x20   %p = softmax %s {{axis = 2}} : {s}\n\
             \x20   %o = matmul %p, %v.in : {x}\n\
             \x20   yield %o\n\
             \x20 }}\n\
             \x20 return %r\n\
             }}\n",
            block[0],
            block[1],
            2 * block[0]
        );
        let module = dcir_reader::parse_module(&src).map_err(|e| format!("{e:?}"))?;
        emit_module_source(&module).map_err(|e| e.to_string())
    }

    #[test]
    fn two_stages_keep_the_next_key_step_in_flight() {
        let s = attention("f16", 197, 64, [64, 32], 2, false).expect("lowers");
        assert!(s.contains("const int buf = n0 / 32 % 2;"), "{s}");
        assert!(s.contains("if (n0 + 32 < 197)"), "{s}");
        assert!(s.contains("dcir_cp_async_wait<1>();"), "{s}");
        assert!(
            s.contains("dcir_mma_f16(") && s.contains("dcir_ldmatrix_x4_trans("),
            "{s}"
        );
        // Q once, K and V ahead of the first step and of each next one (in
        // the full steps' loop and the last step's): 16 bytes at a time.
        assert_eq!(s.matches("dcir_cp_async16(smem").count(), 7, "{s}");
        assert!(s.contains("tensor cores"), "{s}");
    }

    /// A ring of four K/V buffers: Q's copies, then three key steps' in
    /// flight before Q is waited for; each step waits for its own group,
    /// passes one barrier and refills the buffer the step before it read.
    /// More stages than key steps take one buffer per step.
    #[test]
    fn a_ring_of_stages_keeps_key_steps_in_flight_with_one_barrier_a_step() {
        let s = attention("f16", 197, 64, [64, 32], 4, false).expect("lowers");
        assert!(s.contains("const int buf = n0 / 32 % 4;"), "{s}");
        let (prologue, steps) = s
            .split_once("// online softmax over the key steps")
            .expect("steps");
        assert_eq!(
            prologue.matches("dcir_cp_async_commit();").count(),
            4,
            "{s}"
        );
        assert!(prologue.contains("dcir_cp_async_wait<3>();"), "{s}");
        assert!(steps.contains("dcir_cp_async_wait<2>();"), "{s}");
        assert!(steps.contains("if (n0 + 96 < 197)"), "{s}");
        assert!(steps.contains("(buf + 3) % 4 * "), "{s}");
        // Q's barrier, then one in each of the two step loops.
        assert_eq!(s.matches("__syncthreads();").count(), 3, "{s}");
        let s = attention("f16", 64, 64, [64, 32], 4, false).expect("lowers");
        assert!(s.contains("const int buf = n0 / 32 % 2;"), "{s}");
    }

    /// f16 results that keep 8 output columns together: `O · (1/l)` taken
    /// once a row, rounded into the warp's own rows of Q's array, then 16
    /// bytes a store; a V wider than Q's rows (no room to stage) stores a
    /// fragment's two adjacent columns as one word.
    #[test]
    fn output_columns_store_staged_in_vectors_or_in_pairs() {
        let s = attention("f16", 197, 64, [64, 32], 2, false).expect("lowers");
        assert!(s.contains("row_inv[h] = 1.0f / row_sum[h];"), "{s}");
        assert!(!s.contains("] / row_sum"), "{s}");
        assert!(s.contains("reinterpret_cast<unsigned int*>(Qs)["), "{s}");
        assert!(s.contains("__syncwarp();"), "{s}");
        assert!(s.contains("reinterpret_cast<uint4*>(r_out)[vidx] ="), "{s}");
        let src = "graph @g(%q: f16[2,40,16], %k: f16[2,40,16], %v: f16[2,40,32]) -> (f16[2,40,32]) {\n\
                   \x20 %r = fused @g0(%q.in = %q, %k.in = %k, %v.in = %v) {block = [64, 32], kind = \"attention\", level = \"shared\", math = \"tensor_core\", stages = 2, threads = 128} : f16[2,40,32] {\n\
                   \x20   %s = matmul %q.in, %k.in {transpose_b = true} : f16[2,40,40]\n\
                   \x20   %p = softmax %s {axis = 2} : f16[2,40,40]\n\
                   \x20   %o = matmul %p, %v.in : f16[2,40,32]\n\
                   \x20   yield %o\n\
                   \x20 }\n\
                   \x20 return %r\n\
                   }\n";
        let module = dcir_reader::parse_module(src).expect("parses");
        let s = emit_module_source(&module).expect("lowers");
        assert!(!s.contains("__syncwarp();"), "{s}");
        assert!(
            s.contains("reinterpret_cast<unsigned int*>(r_out)[vidx] ="),
            "{s}"
        );
    }

    /// 197 keys in steps of 32: six full steps with no key mask, then the
    /// last 5 keys as one chunk of 16, the only step that masks; the warps
    /// of the last query tile whose rows all lie past 197 skip the math.
    #[test]
    fn the_last_partial_key_step_computes_whole_chunks_and_alone_masks() {
        let s = attention("f16", 197, 64, [64, 32], 2, false).expect("lowers");
        let (full, last) = s
            .split_once("the last, partial key step")
            .expect("a partial step");
        assert!(full.contains("for (int n0 = 0; n0 < 192; n0 += 32)"), "{s}");
        assert!(!full.contains("col < 197"), "{s}");
        assert!(
            last.contains("for (int n0 = 192; n0 < 197; n0 += 32)"),
            "{s}"
        );
        assert!(last.contains("row < 197 && col < 197"), "{s}");
        // One 16-key chunk: two n8 score tiles, one k16 slice of P·V.
        assert!(last.contains("for (int j = 0; j < 2; j += 1)"), "{s}");
        assert!(last.contains("for (int jp = 0; jp < 1; jp += 1)"), "{s}");
        assert_eq!(s.matches("if (m0 + w0 < 197)").count(), 2, "{s}");
        // Keys and queries that fill their steps: one loop, no masks.
        let s = attention("f16", 128, 64, [64, 32], 2, false).expect("lowers");
        assert!(
            !s.contains("partial key step") && !s.contains("m0 + w0 <"),
            "{s}"
        );
        assert!(!s.contains("< 128 &&") && !s.contains("row < 128"), "{s}");
    }

    #[test]
    fn one_stage_or_a_strided_operand_stages_once_per_step() {
        let s = attention("bf16", 128, 32, [128, 64], 1, false).expect("lowers");
        assert!(
            !s.contains("buf") && s.contains("dcir_cp_async_wait<0>();"),
            "{s}"
        );
        assert!(
            s.contains("dcir_mma_bf16(") && s.contains("dcir_f2bf("),
            "{s}"
        );
        // K stored head dim first: element by element, and so one stage.
        let s = attention("f16", 80, 32, [64, 32], 2, true).expect("lowers");
        assert!(s.contains("Ks[Ks_r * 40 + Ks_c] = dcir_f2h("), "{s}");
        assert!(!s.contains("buf"), "{s}");
    }

    #[test]
    fn what_the_tensor_cores_do_not_take_is_refused_by_reason() {
        let e = attention("f32", 64, 64, [64, 64], 1, false).expect_err("f32");
        assert!(e.contains("tensor-core attention on f32"), "{e}");
        let e = attention("f16", 64, 24, [64, 64], 1, false).expect_err("head dim");
        assert!(e.contains("head dims 24/24"), "{e}");
        let e = attention("f16", 64, 64, [64, 24], 1, false).expect_err("block");
        assert!(e.contains("block = [64, 24]"), "{e}");
    }
}
