//! The `contraction_chain` family: GEMM → GEMM (or 1×1 conv → 1×1 conv) with
//! the intermediate kept in shared memory; also the contraction helpers the
//! `attention` family shares ([`Contraction`], the epilogue checks and
//! stores). Staging and the rank-1 update are the SIMT kind's (`simt.rs`).
//!
//! Both contractions are seen as GEMMs over rows (matmul rows, or the pixels
//! of every image for a 1×1 conv over NCHW). The second takes its rows from
//! the first's epilogue and its weights from outside, so a block owns
//! `tile[0]` whole rows of the intermediate (`blockIdx.x` = batch entry, row
//! tile, split):
//!
//! 1. for every chunk of `tile[1]` intermediate columns, the first contraction
//!    in `tile[2]` steps (operand tiles staged through the index maps into
//!    shared memory, FMA micro-tiles in registers, as the gemm family), then
//!    its epilogue per accumulator; the value the second contraction reads
//!    (in f32) goes to the shared array
//!    `Xs` (k-major, the block's rows × all intermediate columns);
//! 2. a barrier, then the second contraction reads its rows from `Xs` and
//!    stages only its weights, over its `N2 / split_n` output columns in
//!    chunks of `tile[1]`; epilogue and bounds-checked stores.
//!
//! With `split_n` = s the grid has s blocks per row tile, each recomputing the
//! intermediate and storing a different column range of the output. For 1×1
//! convs consecutive threads take consecutive pixels (contiguous in NCHW),
//! so loads and stores coalesce.
//! Results of the first epilogue are stored by split 0 only, results that use
//! no contraction (views of inputs the planner shares with other groups) by a
//! grid-stride loop, so every element is written exactly once. f16/bf16 widen
//! to f32 on load, accumulate in f32 and narrow on store.
//! `stages` and `math` are not honoured: single-stage f32 FMA whatever they say.

use std::collections::BTreeSet;

use dcir_fusion::Reason;
use dcir_ir::{Graph, OpId, OpKind, ValueDef, ValueId};

use super::epilogue::{
    self, Output, check_elementwise_path, classify_outputs, derived, forward_index, store_derived,
    store_independent,
};
use super::simt::{Fragment, Tile, crossing, rank1_update, stage};
use super::{EmitError, Index, Lower, Reduced, attr_int, params, thread_grid};
use crate::kir::{
    BinOp, Builtin, Expr, Kernel, Param, Stmt, Ty, add, at, bin, call, counted, div, f32_array,
    guarded, int, let_float, let_int, lt, mul, rem, unrolled, var,
};

type Result<T> = std::result::Result<T, EmitError>;

/// Most bytes of shared memory one block may have on sm_90 (227 KiB).
pub(super) const MAX_SHARED: usize = 227 * 1024;

/// Locals of the chain kernel, reserved before the parameters are named.
const CHAIN_NAMES: [&str; 23] = [
    "tile_r", "split", "bz", "r0", "tx", "ty", "c0", "k0", "kk", "i", "j", "e", "acc", "a_frag",
    "b_frag", "row", "col", "n_begin", "n_end", "x1", "Xs", "As", "Bs",
];

/// A chain group: its two contractions, the values derived from each, and
/// which results each stage stores.
struct Chain {
    first: Contraction,
    second: Contraction,
    /// Values derived from the first contraction (not looking past the
    /// second) and from the second.
    t1: BTreeSet<ValueId>,
    t2: BTreeSet<ValueId>,
    /// Results of the first epilogue, of the second, and of neither.
    stage1_out: Vec<Output>,
    stage2_out: Vec<Output>,
    independent: Vec<Output>,
}

impl Chain {
    fn find(l: &Lower, op: OpId, params: &[Param]) -> Result<Chain> {
        let g = l.g;
        let anchors = anchors(g, op);
        let [op1, op2] = anchors[..] else {
            let kinds: Vec<&str> = anchors.iter().map(|&o| g.op(o).kind.name()).collect();
            return Err(l.unsupported(format!(
                "a chain of {} (two contractions)",
                kinds.join(" + ")
            )));
        };
        let first = Contraction::of(l, op1)?;
        let second = Contraction::of(l, op2)?;
        if first.is_matmul() != second.is_matmul() {
            return Err(l.unsupported("a chain mixing matmul and conv2d"));
        }
        let t1 = derived(g, op, first.result, &[op2]);
        let t2 = derived(g, op, second.result, &[]);
        check_elementwise_path(
            l,
            &t1,
            first.result,
            second.a,
            "the rows of the second contraction",
        )?;
        if t1.contains(&second.b) || second.transposes_a() {
            return Err(l.unsupported(
                "a second contraction that does not take its rows from the first (untransposed) and its weights from outside",
            ));
        }
        if g.ty(second.a).dims() != g.ty(first.result).dims()
            || second.batch_dims != first.batch_dims
            || second.rows != first.rows
            || second.k != first.cols
        {
            return Err(l.unsupported("a chain whose second contraction reads other rows"));
        }
        epilogue::check(l, op, &t1, &[op2], "the first contraction", false)?;
        epilogue::check(l, op, &t2, &[], "the second contraction", false)?;
        let (mut stage1_out, mut stage2_out, mut independent) =
            (Vec::new(), Vec::new(), Vec::new());
        for (out, from) in classify_outputs(l, op, params, &[&t1, &t2])? {
            match from {
                Some(0) => stage1_out.push(out),
                Some(_) => stage2_out.push(out),
                None => independent.push(out),
            }
        }
        Ok(Chain {
            first,
            second,
            t1,
            t2,
            stage1_out,
            stage2_out,
            independent,
        })
    }
}

/// How a chain kernel is tiled: `tm` rows per block, columns in chunks of
/// `tn`, k in steps of `tk`, a `threads_m × threads_n` thread grid of
/// `mt × nt` micro-tiles, `split` blocks per row tile.
struct Plan {
    tm: usize,
    tn: usize,
    tk: usize,
    threads: usize,
    split: usize,
    threads_m: usize,
    threads_n: usize,
    mt: usize,
    nt: usize,
    /// Rows (intermediate columns) of `Xs`: whole `tk` steps, zero past N1.
    xs_rows: usize,
    /// Output columns per split.
    n_split: usize,
}

impl Plan {
    fn new(l: &Lower, op: OpId, chain: &Chain) -> Result<Plan> {
        let g = l.g;
        let tile = g
            .op(op)
            .attrs
            .ints("tile")
            .unwrap_or(&[64, 32, 16])
            .to_vec();
        let [tm, tn, tk] = tile[..] else {
            return Err(l.unsupported(Reason::Parameters(format!("tile = {tile:?}"))));
        };
        let (tm, tn, tk) = (tm.max(1) as usize, tn.max(1) as usize, tk.max(1) as usize);
        let threads = attr_int(g, op, "threads", 256).clamp(1, 1024) as usize;
        let split = attr_int(g, op, "split_n", 1).max(1) as usize;
        let Some((threads_m, threads_n)) = thread_grid(tm, tn, threads) else {
            return Err(l.unsupported(Reason::Parameters(format!(
                "tile [{tm}, {tn}] with {threads} threads (no even split)"
            ))));
        };
        let (mt, nt) = (tm / threads_m, tn / threads_n);
        if mt * nt > 128 {
            return Err(l.unsupported(Reason::Parameters(format!("a {mt}x{nt} micro-tile"))));
        }
        let (first, second) = (&chain.first, &chain.second);
        let (rows, k1, n1, n2) = (first.rows, first.k, first.cols, second.cols);
        let largest = (rows * n1.max(n2).max(k1)).max(k1 * n1).max(n1 * n2);
        if first.batch() * largest >= i32::MAX as usize {
            return Err(l.unsupported(Reason::TooLarge));
        }
        Ok(Plan {
            tm,
            tn,
            tk,
            threads,
            split,
            threads_m,
            threads_n,
            mt,
            nt,
            xs_rows: n1.next_multiple_of(tk),
            n_split: n2.div_ceil(split),
        })
    }

    /// `Xs` (the intermediate, k-major), `As`, `Bs` (operand tiles) in dynamic shared memory.
    fn shared(&self) -> (Vec<Stmt>, usize) {
        let mut smem = SharedLayout::default();
        smem.add("Xs", self.xs_rows * (self.tm + 1));
        smem.add("As", self.tk * (self.tm + 1));
        smem.add("Bs", self.tk * (self.tn + 1));
        smem.finish()
    }

    /// `acc[i·nt + j]`, this thread's accumulator `(i, j)`.
    fn acc(&self) -> Expr {
        at("acc", add(mul(var("i"), int(self.nt as i64)), var("j")))
    }

    /// This thread's row `i` in the block: `ty + i·threads_m`.
    fn row_in_block(&self) -> Expr {
        add(var("ty"), mul(var("i"), int(self.threads_m as i64)))
    }

    /// `body` for each accumulator `(i, j)`, with `row` and `col` (global)
    /// defined where it reads them.
    fn each_accumulator(&self, body: Vec<Stmt>) -> Stmt {
        let lets = vec![
            let_int("row", add(var("r0"), self.row_in_block())),
            let_int(
                "col",
                add(
                    add(var("c0"), var("tx")),
                    mul(var("j"), int(self.threads_n as i64)),
                ),
            ),
        ];
        unrolled(
            "i",
            self.mt,
            vec![unrolled("j", self.nt, with_lets(lets, body))],
        )
    }

    /// The k loop of one chunk: per `tk` step, `staged` (then a barrier),
    /// the rank-1 updates from `a` (row stride `tm + 1`, at k offset `a_k`)
    /// and `Bs`, and a barrier before the tiles are overwritten.
    fn k_loop(&self, k: usize, staged: Vec<Stmt>, a: &str, a_k: Expr) -> Stmt {
        let (tm, tn) = (self.tm as i64 + 1, self.tn as i64 + 1);
        let mut step = staged;
        step.push(Stmt::Barrier);
        step.push(unrolled(
            "kk",
            self.tk,
            rank1_update(
                "acc",
                &Fragment::scalar(
                    a,
                    add(mul(a_k, int(tm)), var("ty")),
                    self.threads_m,
                    self.mt,
                ),
                &Fragment::scalar(
                    "Bs",
                    add(mul(var("kk"), int(tn)), var("tx")),
                    self.threads_n,
                    self.nt,
                ),
            ),
        ));
        step.push(Stmt::Barrier);
        counted("k0", int(0), int(k as i64), self.tk, step)
    }
}

/// Lowers a `contraction_chain` group.
pub(super) fn chain(l: &mut Lower, op: OpId) -> Result<Kernel> {
    let g = l.g;
    for n in CHAIN_NAMES {
        l.used_names.insert(n.into());
    }
    let params = params(l, op);
    let chain = Chain::find(l, op, &params)?;
    let plan = Plan::new(l, op, &chain)?;
    let (views, shared_bytes) = plan.shared();
    if shared_bytes > MAX_SHARED {
        return Err(l.unsupported(Reason::SharedMemory {
            bytes: shared_bytes,
            detail: format!(
                "tile {:?}, {} intermediate columns",
                [plan.tm, plan.tn, plan.tk],
                chain.first.cols
            ),
        }));
    }
    let (first, second) = (&chain.first, &chain.second);
    let (rows, n1, n2) = (first.rows, first.cols, second.cols);
    let (tm, threads, split) = (plan.tm, plan.threads, plan.split);
    let batch = first.batch();
    let grid_r = rows.div_ceil(tm);

    let bid = Expr::Builtin(Builtin::BlockX);
    let mut body = vec![
        Stmt::Comment(format!(
            "{tm} rows per block, all {n1} intermediate columns in shared memory, then {} of the {n2} output columns; chunks of {} columns, k steps of {}; {}x{} threads, each a {}x{} micro-tile",
            plan.n_split, plan.tn, plan.tk, plan.threads_m, plan.threads_n, plan.mt, plan.nt
        )),
        let_int("tile_r", rem(bid.clone(), grid_r as i64)),
    ];
    if split > 1 {
        body.push(let_int(
            "split",
            rem(div(bid.clone(), grid_r as i64), split as i64),
        ));
    }
    let bz = if batch > 1 {
        body.push(let_int("bz", div(bid, (grid_r * split) as i64)));
        var("bz")
    } else {
        int(0)
    };
    body.push(let_int("r0", mul(var("tile_r"), int(tm as i64))));
    // NCHW keeps a channel's pixels (the rows) contiguous: consecutive
    // threads then take consecutive rows, so stores coalesce.
    body.extend(thread_coords(
        plan.threads_m,
        plan.threads_n,
        second.rows_contiguous(),
    ));
    body.extend(views);
    let batch_coords = batch_coords(&first.batch_dims, bz);
    if plan.xs_rows > n1 {
        body.push(Stmt::Comment(format!(
            "zero the intermediate's rows {n1}..{} (read by the last k step)",
            plan.xs_rows
        )));
        body.push(Stmt::For {
            var: "e".into(),
            start: Expr::Builtin(Builtin::ThreadX),
            end: int(((plan.xs_rows - n1) * (tm + 1)) as i64),
            step: int(threads as i64),
            unroll: false,
            body: vec![Stmt::Store(
                f32_array("Xs"),
                add(int((n1 * (tm + 1)) as i64), var("e")),
                Expr::F32(0.0),
            )],
        });
    }
    body.extend(filled("acc", plan.mt * plan.nt, 0.0));
    body.push(Stmt::Comment(
        "stage 1: the first contraction over all intermediate columns, into Xs".into(),
    ));
    body.push(stage1(l, &chain, &plan, &batch_coords)?);
    body.push(Stmt::Barrier);
    body.push(Stmt::Comment(
        "stage 2: the second contraction from Xs over this block's output columns".into(),
    ));
    let columns = if split > 1 {
        body.push(let_int(
            "n_begin",
            mul(var("split"), int(plan.n_split as i64)),
        ));
        body.push(let_int(
            "n_end",
            call(
                "min",
                vec![
                    add(var("n_begin"), int(plan.n_split as i64)),
                    int(n2 as i64),
                ],
            ),
        ));
        [var("n_begin"), var("n_end")]
    } else {
        [int(0), int(n2 as i64)]
    };
    body.push(stage2(l, &chain, &plan, &batch_coords, columns)?);
    body.extend(store_independent(l, &chain.independent)?);

    let kind = if first.is_matmul() {
        "gemm"
    } else {
        "1x1 conv"
    };
    let summary = format!(
        "contraction chain ({kind} -> {kind}, {}): {batch} x {rows} rows, {} -> {n1} -> {n2}, tile [{tm}, {}, {}], split {split}, {threads} threads, {}x{} per thread, fma",
        g.ty(first.a).dtype.name(),
        first.k,
        plan.tn,
        plan.tk,
        plan.mt,
        plan.nt,
    );
    Ok(Kernel {
        dynamic_shared: shared_bytes,
        min_blocks_per_sm: 1,
        adapted: super::adapted_single_stage(l.g, op, "contraction chain"),
        ..l.kernel(op, summary, params, body, [threads, batch * grid_r * split])
    })
}

/// Stage 1: for each chunk of intermediate columns, the first contraction
/// (A and B tiles staged), its epilogue per accumulator, the rows of the
/// second contraction into `Xs` and the first epilogue's results (split 0).
fn stage1(l: &mut Lower, chain: &Chain, plan: &Plan, batch: &[Expr]) -> Result<Stmt> {
    let g = l.g;
    let (first, second) = (&chain.first, &chain.second);
    let (rows, k1, n1) = (first.rows, first.k, first.cols);
    let (tm, tn, tk) = (plan.tm, plan.tn, plan.tk);
    let a_tile = stage(
        l,
        &Tile {
            value: first.a,
            shared: "As",
            rows: tm,
            cols: tk,
            origin: [var("r0"), var("k0")],
            bounds: [crossing(rows, tm, true), crossing(k1, tk, true)],
            index: &|r, k| first.a_index(g, batch, r, k),
            slot: &|r, k| add(mul(k, int((tm + 1) as i64)), r),
            cols_inner: first.a_k_contiguous(g),
        },
        plan.threads,
    )?;
    let b_tile = stage(
        l,
        &Tile {
            value: first.b,
            shared: "Bs",
            rows: tk,
            cols: tn,
            origin: [var("k0"), var("c0")],
            bounds: [crossing(k1, tk, true), crossing(n1, tn, true)],
            index: &|k, c| first.b_index(g, batch, k, c),
            slot: &|k, c| add(mul(k, int((tn + 1) as i64)), c),
            cols_inner: first.b_cols_contiguous(g),
        },
        plan.threads,
    )?;
    // Per accumulator: x1 = the second contraction's row value (0 past the
    // rows), stored to Xs; the first epilogue's results stored by split 0.
    let row_check = crossing(rows, tm, true).map(|r| lt(var("row"), int(r as i64)));
    let epilogue = l.scoped(|l| {
        l.reduced = Some((first.result, Reduced::Row(plan.acc()), 0));
        let idx = first.out_index(g, batch, var("row"), var("col"));
        let values = l.scoped(|l| {
            let x1 = forward_index(g, &chain.t1, first.result, second.a, &idx)
                .expect("the rows derive elementwise from the first contraction");
            let v = l.value_at(second.a, &x1)?;
            l.body.push(Stmt::Assign("x1".into(), v));
            if !chain.stage1_out.is_empty() {
                let stores = l.scoped(|l| {
                    store_derived(l, &chain.t1, first.result, &idx, &chain.stage1_out)
                })?;
                let first_split = (plan.split > 1).then(|| bin(BinOp::Eq, var("split"), int(0)));
                l.body.extend(guarded(vec![first_split], stores));
            }
            Ok(())
        });
        l.reduced = None;
        l.body.push(let_float("x1", Expr::F32(0.0), false));
        l.body.extend(guarded(vec![row_check], values?));
        l.body.push(Stmt::Store(
            f32_array("Xs"),
            add(mul(var("col"), int((tm + 1) as i64)), plan.row_in_block()),
            var("x1"),
        ));
        Ok(())
    })?;
    let col_check = crossing(n1, tn, true).map(|n| lt(var("col"), int(n as i64)));
    let chunk = vec![
        unrolled(
            "i",
            plan.mt * plan.nt,
            vec![Stmt::Store(f32_array("acc"), var("i"), Expr::F32(0.0))],
        ),
        plan.k_loop(k1, vec![a_tile, b_tile], "As", var("kk")),
        plan.each_accumulator(guarded(vec![col_check], epilogue)),
    ];
    Ok(counted("c0", int(0), int(n1 as i64), tn, chunk))
}

/// Stage 2: for each chunk of this block's output `columns` (begin, end),
/// the second contraction with its rows from `Xs` (only the weights staged),
/// its epilogue and bounds-checked stores.
fn stage2(
    l: &mut Lower,
    chain: &Chain,
    plan: &Plan,
    batch: &[Expr],
    columns: [Expr; 2],
) -> Result<Stmt> {
    let g = l.g;
    let second = &chain.second;
    let (rows, n1, n2) = (second.rows, second.k, second.cols);
    let (tn, tk) = (plan.tn, plan.tk);
    let b_tile = stage(
        l,
        &Tile {
            value: second.b,
            shared: "Bs",
            rows: tk,
            cols: tn,
            origin: [var("k0"), var("c0")],
            bounds: [crossing(n1, tk, true), crossing(n2, tn, plan.split == 1)],
            index: &|k, c| second.b_index(g, batch, k, c),
            slot: &|k, c| add(mul(k, int((tn + 1) as i64)), c),
            cols_inner: second.b_cols_contiguous(g),
        },
        plan.threads,
    )?;
    let stores = l.scoped(|l| {
        l.reduced = Some((second.result, Reduced::Row(plan.acc()), 0));
        let idx = second.out_index(g, batch, var("row"), var("col"));
        let result = store_derived(l, &chain.t2, second.result, &idx, &chain.stage2_out);
        l.reduced = None;
        result
    })?;
    let [begin, end] = columns;
    let row_check = crossing(rows, plan.tm, true).map(|r| lt(var("row"), int(r as i64)));
    // A split's column range ends anywhere; a whole range only past N2.
    let col_check = (plan.split > 1 || !n2.is_multiple_of(tn)).then(|| lt(var("col"), end.clone()));
    let chunk = vec![
        unrolled(
            "i",
            plan.mt * plan.nt,
            vec![Stmt::Store(f32_array("acc"), var("i"), Expr::F32(0.0))],
        ),
        plan.k_loop(n1, vec![b_tile], "Xs", add(var("k0"), var("kk"))),
        plan.each_accumulator(guarded(vec![row_check, col_check], stores)),
    ];
    Ok(counted("c0", begin, end, tn, chunk))
}

// The contraction helpers below are shared with the attention family.

/// A contraction seen as a batched GEMM, `out[b, r, c] = Σ_k a[b, r, k] · w[b, k, c]`:
/// a `matmul`, or a 1×1 `conv2d` whose rows are the pixels of every image.
pub(super) struct Contraction {
    /// The contraction's result.
    pub result: ValueId,
    /// The operand the rows come from (matmul A, the conv input).
    pub a: ValueId,
    /// The other operand (matmul B, the conv weights).
    pub b: ValueId,
    /// Leading dims of a matmul (none for a conv: its rows span the images).
    pub batch_dims: Vec<usize>,
    /// Rows per batch entry.
    pub rows: usize,
    /// The reduction length.
    pub k: usize,
    /// Columns (output channels of a conv).
    pub cols: usize,
    form: Form,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    Matmul {
        ta: bool,
        tb: bool,
    },
    /// A 1×1 conv over NCHW: row `r` is pixel `r % pixels` of image `r / pixels`.
    Pointwise {
        images: usize,
        pixels: usize,
        width: usize,
    },
}

impl Contraction {
    /// The contraction `op` (a matmul, or a 1×1 conv with stride 1, no padding, one group).
    pub(super) fn of(l: &Lower, op: OpId) -> Result<Contraction> {
        let g = l.g;
        let d = g.op(op);
        let (a, b, result) = (d.operands[0], d.operands[1], d.results[0]);
        if !g.ty(result).dtype.is_float() {
            return Err(l.unsupported(Reason::DType {
                op: d.kind,
                dtype: g.ty(result).dtype,
            }));
        }
        let out = g.ty(result).dims().to_vec();
        match d.kind {
            OpKind::Matmul => {
                let flag =
                    |name: &str| d.attrs.bool(name) == Some(true) || d.attrs.int(name) == Some(1);
                let (ta, tb) = (flag("transpose_a"), flag("transpose_b"));
                let rank = out.len();
                if rank < 2 {
                    return Err(l.unsupported("a matmul of rank < 2"));
                }
                let a_dims = g.ty(a).dims();
                Ok(Contraction {
                    result,
                    a,
                    b,
                    batch_dims: out[..rank - 2].to_vec(),
                    rows: out[rank - 2],
                    k: a_dims[if ta { rank - 2 } else { rank - 1 }],
                    cols: out[rank - 1],
                    form: Form::Matmul { ta, tb },
                })
            }
            OpKind::Conv2d => {
                let ones = |name: &str, v: i64| {
                    d.attrs
                        .ints(name)
                        .is_none_or(|xs| xs.iter().all(|&x| x == v))
                };
                let w = g.ty(b).dims();
                if w[2..] != [1, 1]
                    || !ones("stride", 1)
                    || !ones("pad", 0)
                    || d.attrs.int("groups").unwrap_or(1) != 1
                {
                    return Err(l.unsupported(
                        "a conv2d in a chain that is not 1x1 with stride 1, no padding and one group",
                    ));
                }
                let x = g.ty(a).dims();
                Ok(Contraction {
                    result,
                    a,
                    b,
                    batch_dims: Vec::new(),
                    rows: x[0] * x[2] * x[3],
                    k: x[1],
                    cols: out[1],
                    form: Form::Pointwise {
                        images: x[0],
                        pixels: x[2] * x[3],
                        width: x[3],
                    },
                })
            }
            other => Err(l.unsupported(format!("`{}` as a contraction", other.name()))),
        }
    }

    /// Whether it is a matmul (else a 1×1 conv).
    pub(super) fn is_matmul(&self) -> bool {
        matches!(self.form, Form::Matmul { .. })
    }

    /// Whether operand A is read transposed (its rows are its last dim).
    pub(super) fn transposes_a(&self) -> bool {
        matches!(self.form, Form::Matmul { ta: true, .. })
    }

    /// Whether the matmul reads B transposed (`[.., N, K]`).
    pub(super) fn transposes_b(&self) -> bool {
        matches!(self.form, Form::Matmul { tb: true, .. })
    }

    /// Whether consecutive rows of the result are consecutive in memory.
    pub(super) fn rows_contiguous(&self) -> bool {
        match self.form {
            Form::Matmul { .. } => self.cols == 1,
            Form::Pointwise { pixels, .. } => pixels > 1,
        }
    }

    /// The batch entries.
    pub(super) fn batch(&self) -> usize {
        self.batch_dims.iter().product()
    }

    /// The index of A at row `r`, reduction index `k`.
    pub(super) fn a_index(&self, g: &Graph, batch: &[Expr], r: Expr, k: Expr) -> Index {
        let dims = g.ty(self.a).dims();
        match self.form {
            Form::Matmul { ta, .. } => matmul_index(dims, batch, if ta { [k, r] } else { [r, k] }),
            Form::Pointwise { .. } => self.pixel_index(dims, r, k),
        }
    }

    /// The index of B at reduction index `k`, column `c`.
    pub(super) fn b_index(&self, g: &Graph, batch: &[Expr], k: Expr, c: Expr) -> Index {
        let dims = g.ty(self.b).dims();
        match self.form {
            Form::Matmul { tb, .. } => matmul_index(dims, batch, if tb { [c, k] } else { [k, c] }),
            Form::Pointwise { .. } => Index::coords(dims, vec![c, k, int(0), int(0)]),
        }
    }

    /// The index of the result at row `r`, column `c`.
    pub(super) fn out_index(&self, g: &Graph, batch: &[Expr], r: Expr, c: Expr) -> Index {
        let dims = g.ty(self.result).dims();
        match self.form {
            Form::Matmul { .. } => matmul_index(dims, batch, [r, c]),
            Form::Pointwise { .. } => self.pixel_index(dims, r, c),
        }
    }

    /// The axes of A along the rows and along k.
    fn a_axes(&self, rank: usize) -> [usize; 2] {
        match self.form {
            Form::Matmul { ta: false, .. } => [rank - 2, rank - 1],
            Form::Matmul { ta: true, .. } => [rank - 1, rank - 2],
            Form::Pointwise { .. } => [3, 1],
        }
    }

    /// The axes of B along k and along the columns.
    fn b_axes(&self, rank: usize) -> [usize; 2] {
        match self.form {
            Form::Matmul { tb: false, .. } => [rank - 2, rank - 1],
            Form::Matmul { tb: true, .. } => [rank - 1, rank - 2],
            Form::Pointwise { .. } => [1, 0],
        }
    }

    /// Whether consecutive reduction indices of A are consecutive in memory.
    pub(super) fn a_k_contiguous(&self, g: &Graph) -> bool {
        unit_stride(g, self.a, self.a_axes(g.ty(self.a).dims().len())[1])
    }

    /// Whether consecutive reduction indices of B are consecutive in memory.
    pub(super) fn b_k_contiguous(&self, g: &Graph) -> bool {
        unit_stride(g, self.b, self.b_axes(g.ty(self.b).dims().len())[0])
    }

    /// Whether consecutive columns of B are consecutive in memory.
    pub(super) fn b_cols_contiguous(&self, g: &Graph) -> bool {
        unit_stride(g, self.b, self.b_axes(g.ty(self.b).dims().len())[1])
    }

    /// NCHW index of channel `ch` at row (image pixel) `r` of a pointwise conv
    /// tensor, with a linear form that keeps the pixel whole.
    fn pixel_index(&self, dims: &[usize], r: Expr, ch: Expr) -> Index {
        let Form::Pointwise {
            images,
            pixels,
            width,
        } = self.form
        else {
            unreachable!("pixel_index of a matmul")
        };
        let (n, p) = if images == 1 {
            (int(0), r)
        } else {
            (div(r.clone(), pixels as i64), rem(r, pixels as i64))
        };
        let channels = dims[1] as i64;
        let linear = add(
            add(
                mul(n.clone(), int(channels * pixels as i64)),
                mul(ch.clone(), int(pixels as i64)),
            ),
            p.clone(),
        );
        let coords = vec![n, ch, div(p.clone(), width as i64), rem(p, width as i64)];
        Index {
            dims: dims.to_vec(),
            linear: Some(linear),
            coords: Some(coords),
        }
    }
}

/// The coordinates of batch entry `bz` (< the product of `dims`), row-major.
pub(super) fn batch_coords(dims: &[usize], bz: Expr) -> Vec<Expr> {
    Index::linear(dims, bz).get_coords()
}

/// `batch ++ last` as an index of a tensor of `dims`.
fn matmul_index(dims: &[usize], batch: &[Expr], last: [Expr; 2]) -> Index {
    let mut c = batch.to_vec();
    c.extend(last);
    Index::coords(dims, c)
}

/// The group input element `v` reads at `coords` through views (reshape,
/// transpose, broadcast, slice): its row-major offset, or `None` when `v`
/// is computed by other ops.
fn source_offset(g: &Graph, v: ValueId, coords: &[i64]) -> Option<i64> {
    let dims = g.ty(v).dims();
    let linear = |dims: &[usize], c: &[i64]| {
        c.iter()
            .zip(dims)
            .fold(0i64, |acc, (&c, &d)| acc * d as i64 + c)
    };
    let op = match g.value(v).def {
        ValueDef::BlockArg { .. } => return Some(linear(dims, coords)),
        ValueDef::OpResult { op, .. } => op,
    };
    let d = g.op(op);
    let src = d.operands[0];
    let sd = g.ty(src).dims();
    let c: Vec<i64> = match d.kind {
        OpKind::Reshape => {
            let mut rest = linear(dims, coords);
            let mut c = vec![0; sd.len()];
            for i in (0..sd.len()).rev() {
                c[i] = rest % sd[i] as i64;
                rest /= sd[i] as i64;
            }
            c
        }
        OpKind::Transpose => {
            let perm = d.attrs.ints("perm")?;
            let mut c = vec![0; sd.len()];
            for (i, &p) in perm.iter().enumerate() {
                c[p as usize] = coords[i];
            }
            c
        }
        OpKind::Broadcast => {
            let map = d.attrs.ints("dims")?;
            (0..sd.len())
                .map(|i| {
                    if sd[i] == 1 {
                        0
                    } else {
                        coords[map[i] as usize]
                    }
                })
                .collect()
        }
        OpKind::Slice => {
            let starts = d.attrs.ints("starts")?;
            let steps = d.attrs.ints("steps").unwrap_or(&[]);
            (0..sd.len())
                .map(|i| starts[i] + coords[i] * steps.get(i).copied().unwrap_or(1))
                .collect()
        }
        _ => return None,
    };
    source_offset(g, src, &c)
}

/// Whether a step along `axis` of `v` is a step of one element in the memory
/// of the input it views (so a tile walk along it coalesces).
fn unit_stride(g: &Graph, v: ValueId, axis: usize) -> bool {
    let dims = g.ty(v).dims();
    if dims[axis] < 2 {
        return false;
    }
    let zero = vec![0; dims.len()];
    let mut step = zero.clone();
    step[axis] = 1;
    matches!(
        (source_offset(g, v, &zero), source_offset(g, v, &step)),
        (Some(a), Some(b)) if b - a == 1
    )
}

/// The anchors of fused group `op`, in order.
pub(super) fn anchors(g: &Graph, op: OpId) -> Vec<OpId> {
    let region = g.op(op).region.expect("a fused op has a region");
    g.block(region)
        .ops
        .iter()
        .copied()
        .filter(|&o| is_anchor(g.op(o).kind))
        .collect()
}

/// Whether ops of `kind` anchor a kernel: the planner's contractions,
/// reductions and pools (`dcir_fusion::class::role`); everything else in a
/// group is computed per element through the index maps.
pub(super) fn is_anchor(kind: OpKind) -> bool {
    use OpKind::*;
    matches!(
        kind,
        Conv2d
            | Matmul
            | Softmax
            | Layernorm
            | ReduceSum
            | ReduceMean
            | ReduceMax
            | ReduceProd
            | GlobalAvgpool
            | Maxpool2d
            | Avgpool2d
    )
}

/// `lets` (index locals) followed by `body`, without the lets nothing reads.
pub(super) fn with_lets(lets: Vec<Stmt>, body: Vec<Stmt>) -> Vec<Stmt> {
    let mut out = body;
    for stmt in lets.into_iter().rev() {
        let read = match &stmt {
            Stmt::Let { name, .. } => out.iter().any(|s| s.reads(name)),
            _ => true,
        };
        if read {
            out.insert(0, stmt);
        }
    }
    out
}

/// `float name[len];` set to `value`.
pub(super) fn filled(name: &str, len: usize, value: f32) -> Vec<Stmt> {
    vec![
        Stmt::LocalArray {
            name: name.into(),
            ty: Ty::F32,
            len,
        },
        unrolled(
            "i",
            len,
            vec![Stmt::Store(f32_array(name), var("i"), Expr::F32(value))],
        ),
    ]
}

/// Dynamic shared memory carved into f32 arrays, each 16-byte aligned.
#[derive(Default)]
pub(super) struct SharedLayout {
    views: Vec<Stmt>,
    bytes: usize,
}

impl SharedLayout {
    /// Adds the f32 array `name` of `len` elements.
    pub(super) fn add(&mut self, name: &str, len: usize) {
        self.views.push(Stmt::SharedView {
            name: name.into(),
            ty: Ty::F32,
            offset: self.bytes,
        });
        self.bytes += (len * 4).next_multiple_of(16);
    }

    /// The declarations and the total bytes.
    pub(super) fn finish(self) -> (Vec<Stmt>, usize) {
        (self.views, self.bytes)
    }
}

/// `tx`, `ty`: a thread's column and row in a `threads_m × threads_n` grid,
/// consecutive threads along the columns, or along the rows when `rows_fast`.
pub(super) fn thread_coords(threads_m: usize, threads_n: usize, rows_fast: bool) -> [Stmt; 2] {
    let tid = Expr::Builtin(Builtin::ThreadX);
    if rows_fast {
        [
            let_int("tx", div(tid.clone(), threads_m as i64)),
            let_int("ty", rem(tid, threads_m as i64)),
        ]
    } else {
        [
            let_int("tx", rem(tid.clone(), threads_n as i64)),
            let_int("ty", div(tid, threads_n as i64)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::emit_module_source;

    fn emit(src: &str) -> Result<String, String> {
        let module = dcir_reader::parse_module(src).map_err(|e| format!("{e:?}"))?;
        emit_module_source(&module).map_err(|e| e.to_string())
    }

    /// A 1×1 conv → 1×1 conv chain over `x` (NCHW) with `c1` then `c2`
    /// output channels, the intermediate a result too; `conv1` holds extra
    /// attributes of the first conv.
    fn conv_chain(x: [usize; 4], c1: usize, c2: usize, attrs: &str, conv1: &str) -> String {
        let [n, c0, h, w] = x;
        let t0 = format!("f32[{n},{c0},{h},{w}]");
        let (oh, ow) = if conv1.contains("stride") {
            (h.div_ceil(2), w.div_ceil(2))
        } else {
            (h, w)
        };
        let t1 = format!("f32[{n},{c1},{oh},{ow}]");
        let t2 = format!("f32[{n},{c2},{oh},{ow}]");
        format!(
            "graph @g(%x: {t0}, %w1: f32[{c1},{c0},1,1], %w2: f32[{c2},{c1},1,1]) -> ({t1}, {t2}) {{\n\
             \x20 %h, %y = fused @g0(%x.in = %x, %w1.in = %w1, %w2.in = %w2) {{kind = \"contraction_chain\", level = \"shared\", math = \"fma\", stages = 1, {attrs}}} : {t1}, {t2} {{\n\
             \x20   %c1 = conv2d %x.in, %w1.in {conv1} : {t1}\n\
             \x20   %h.r = relu %c1 : {t1}\n\
             \x20   %c2 = conv2d %h.r, %w2.in : {t2}\n\
             \x20   yield %h.r, %c2\n\
             \x20 }}\n\
             \x20 return %h, %y\n\
             }}\n"
        )
    }

    #[test]
    fn odd_sizes_check_bounds_and_split_zero_stores_the_intermediate() {
        let src = conv_chain(
            [2, 5, 7, 9],
            3,
            17,
            "split_n = 2, threads = 64, tile = [32, 16, 8]",
            "",
        );
        let s = emit(&src).expect("lowers");
        // 126 pixel rows in tiles of 32; 3 intermediate columns in chunks of 16.
        assert!(s.contains("if (col < 3)"), "{s}");
        assert!(s.contains("if (row < 126)"), "{s}");
        assert!(s.contains("if (split == 0)"), "{s}");
        assert!(s.contains("zero the intermediate's rows 3..8"), "{s}");
        assert!(s.contains("if (row < 126 && col < n_end)"), "{s}");
        // Consecutive threads on consecutive pixels.
        assert!(s.contains("const int ty = threadIdx.x % 16;"), "{s}");
    }

    #[test]
    fn whole_tiles_need_no_bounds_checks() {
        let src = conv_chain(
            [1, 32, 8, 8],
            32,
            64,
            "split_n = 1, threads = 128, tile = [64, 32, 16]",
            "",
        );
        let s = emit(&src).expect("lowers");
        assert!(!s.contains("row <") && !s.contains("col <"), "{s}");
        assert!(!s.contains("zero the intermediate"), "{s}");
        assert!(!s.contains("split ==") && !s.contains("n_end"), "{s}");
    }

    #[test]
    fn unsupported_forms_say_why() {
        let src = conv_chain(
            [1, 8, 8, 8],
            8,
            8,
            "split_n = 1, threads = 128, tile = [64, 32, 16]",
            "{stride = [2, 2]}",
        );
        let e = emit(&src).expect_err("strided");
        assert!(e.contains("not 1x1 with stride 1"), "{e}");
        let src = "graph @g(%x: f32[16,8], %w1: f32[8,16], %w2: f32[16,4]) -> (f32[16,4]) {\n\
             \x20 %y = fused @g0(%x.in = %x, %w1.in = %w1, %w2.in = %w2) {kind = \"contraction_chain\", level = \"shared\", split_n = 1, threads = 64, tile = [16, 16, 8]} : f32[16,4] {\n\
             \x20   %h = matmul %x.in, %w1.in : f32[16,16]\n\
             \x20   %ht = transpose %h {perm = [1, 0]} : f32[16,16]\n\
             \x20   %y.r = matmul %ht, %w2.in : f32[16,4]\n\
             \x20   yield %y.r\n\
             \x20 }\n\
             \x20 return %y\n\
             }\n";
        let e = emit(src).expect_err("a view between");
        assert!(
            e.contains("`transpose` in the rows of the second contraction"),
            "{e}"
        );
    }
}
