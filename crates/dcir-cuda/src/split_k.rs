//! Split-K for the contraction families (`gemm`, `conv` as implicit GEMM, on
//! FMA or tensor cores): attribute `split_k = S` cuts the k loop of every
//! output tile into `S` equal runs of k-tiles, one block each, so a problem
//! with few output tiles and a long K still fills the GPU.
//!
//! Block `b` of the grid computes split `ks = b / T` of tile `b % T` (`T`
//! blocks per split: batch entries × output tiles). Every split block writes
//! its f32 accumulators to the `partials` scratch buffer, one slot per
//! (tile, split, accumulator, thread), consecutive threads at consecutive
//! addresses; then it counts itself in at the tile's entry of the `arrivals`
//! buffer (`atomicAdd` after a `__threadfence`). The block that arrives last
//! resets the entry to zero (the buffer stays zeroed between launches, so
//! CUDA-graph replays need no reset), adds the splits' partial sums in split
//! order — all read back past L1 (`__ldcg`), its own too — and runs the
//! group's epilogue alone. The sum's order does not depend on which block
//! arrives last, so results are deterministic.
//!
//! `S` is the largest divisor of the k-tile count not above the attribute
//! (each split gets the same number of k-tiles); 1 keeps the plain kernel.

use crate::kir::{
    BinOp, Builtin, Expr, Helper, Kernel, Param, Scratch, Stmt, Ty, add, array, call, div, int,
    let_int, mul, rem, var,
};

/// Name of the per-block partial sums parameter.
pub(crate) const PARTIALS: &str = "dcir_partials";
/// Name of the per-tile arrival counters parameter.
pub(crate) const ARRIVALS: &str = "dcir_arrivals";

/// Most splits of one k loop.
pub(crate) const MAX_SPLITS: usize = 32;

/// How one kernel splits its k loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitK {
    /// Splits per output tile.
    pub splits: usize,
    /// k-tiles each split runs.
    pub tiles_per_split: usize,
    /// Blocks of one split (batch entries × output tiles).
    pub blocks_per_split: usize,
}

impl SplitK {
    /// The split of `k_tiles` k-tiles for attribute value `asked` (the
    /// largest divisor of `k_tiles` at most `asked`, at most [`MAX_SPLITS`]).
    pub(crate) fn new(asked: i64, k_tiles: usize, blocks_per_split: usize) -> SplitK {
        let asked = (asked.max(1) as usize).min(MAX_SPLITS).min(k_tiles.max(1));
        let splits = (1..=asked)
            .rev()
            .find(|s| k_tiles.is_multiple_of(*s))
            .unwrap_or(1);
        SplitK {
            splits,
            tiles_per_split: k_tiles.max(1) / splits,
            blocks_per_split,
        }
    }

    /// Whether the k loop is split at all.
    pub(crate) fn is_split(&self) -> bool {
        self.splits > 1
    }

    /// Blocks of the grid.
    pub(crate) fn blocks(&self) -> usize {
        self.splits * self.blocks_per_split
    }

    /// The block's first k-tile: `k_tile0` (defined by [`SplitK::block_index`]), or 0.
    pub(crate) fn first_k_tile(&self) -> Expr {
        if self.is_split() {
            var("k_tile0")
        } else {
            int(0)
        }
    }

    /// The statements defining `blk` (the block's index within its split,
    /// in place of `blockIdx.x`), `ks` (its split) and `k_tile0`, and the
    /// block index to use: `blk`, or `blockIdx.x` without a split.
    pub(crate) fn block_index(&self) -> (Vec<Stmt>, Expr) {
        let bid = Expr::Builtin(Builtin::BlockX);
        if !self.is_split() {
            return (Vec::new(), bid);
        }
        let per = self.blocks_per_split as i64;
        let stmts = vec![
            Stmt::Comment(format!(
                "split-K: split ks of {} runs k-tiles ks*{} .. +{} of tile blk",
                self.splits, self.tiles_per_split, self.tiles_per_split
            )),
            let_int("blk", rem(bid.clone(), per)),
            let_int("ks", div(bid, per)),
            let_int("k_tile0", mul(var("ks"), int(self.tiles_per_split as i64))),
        ];
        (stmts, var("blk"))
    }

    /// The scratch parameters (appended to `params`) and their sizes for
    /// `acc_len` accumulators per thread and `threads` threads.
    pub(crate) fn scratch(
        &self,
        params: &mut Vec<Param>,
        acc_len: usize,
        threads: usize,
    ) -> Vec<Scratch> {
        if !self.is_split() {
            return Vec::new();
        }
        params.push(Param {
            name: PARTIALS.into(),
            ty: Ty::F32,
            dtype: "f32",
            output: true,
            tensor_map: None,
        });
        params.push(Param {
            name: ARRIVALS.into(),
            ty: Ty::U32,
            dtype: "u32",
            output: true,
            tensor_map: None,
        });
        let slots = self.blocks() * acc_len * threads;
        vec![
            Scratch {
                param: PARTIALS.into(),
                bytes: slots * 4,
                zeroed: false,
            },
            Scratch {
                param: ARRIVALS.into(),
                bytes: self.blocks_per_split * 4,
                zeroed: true,
            },
        ]
    }

    /// Statements after the k loop: store this split's `acc_len`
    /// accumulators (`acc[i]`), arrive, and in the last block to arrive add
    /// every split's partial sums into `acc` in split order; then `epilogue`
    /// (in that block only).
    pub(crate) fn finish(
        &self,
        helpers: &mut std::collections::BTreeSet<Helper>,
        acc_len: usize,
        threads: usize,
        epilogue: Vec<Stmt>,
    ) -> Vec<Stmt> {
        if !self.is_split() {
            return epilogue;
        }
        helpers.insert(Helper::SplitK);
        let t = threads as i64;
        let tid = Expr::Builtin(Builtin::ThreadX);
        let slot = |split: Expr, i: Expr| {
            add(
                mul(
                    add(
                        mul(
                            add(mul(var("blk"), int(self.splits as i64)), split),
                            int(acc_len as i64),
                        ),
                        i,
                    ),
                    int(t),
                ),
                tid.clone(),
            )
        };
        let acc = |i: Expr| Expr::Load(array("acc", Ty::F32), Box::new(i));
        // `for i < acc_len` (unrolled) over one store.
        let each_acc = |store: Stmt| Stmt::For {
            var: "i".into(),
            start: int(0),
            end: int(acc_len as i64),
            step: int(1),
            unroll: true,
            body: vec![store],
        };
        let store = each_acc(Stmt::Store(
            array(PARTIALS, Ty::F32),
            slot(var("ks"), var("i")),
            acc(var("i")),
        ));
        // acc[i] = Σ_s partial[s][i], in split order (this block's own
        // partial read back too, so the order never depends on which block
        // arrives last); the split loop stays rolled, 32 loads in flight a step.
        let zero = each_acc(Stmt::Store(array("acc", Ty::F32), var("i"), Expr::F32(0.0)));
        let add_split = each_acc(Stmt::Store(
            array("acc", Ty::F32),
            var("i"),
            add(
                acc(var("i")),
                call("dcir_ldcg", vec![var(PARTIALS), slot(var("s"), var("i"))]),
            ),
        ));
        let sum = vec![
            zero,
            Stmt::Pragma("unroll 1".into()),
            Stmt::For {
                var: "s".into(),
                start: int(0),
                end: int(self.splits as i64),
                step: int(1),
                unroll: false,
                body: vec![add_split],
            },
        ];
        let mut last = sum;
        last.extend(epilogue);
        vec![
            Stmt::Comment(format!(
                "split-K: this split's partial sums out; the last of the {} splits to arrive adds them in split order and runs the epilogue",
                self.splits
            )),
            store,
            Stmt::If(
                call(
                    "dcir_split_arrive",
                    vec![var(ARRIVALS), var("blk"), int(self.splits as i64)],
                ),
                last,
            ),
        ]
    }
}

/// The split-K kernel `kernel` with its last block's epilogue reading each
/// accumulator as the sum of its partials where it uses it
/// (`dcir_split_sum`, same split order), instead of first adding every
/// split into the accumulators; `None` for a kernel without split-K.
///
/// The accumulators are then dead during the epilogue, so its loads and
/// temporaries do not sit beside them in registers (an 8×8 tile with a
/// residual epilogue took 255 registers and spilled, 161 this way); but
/// each element's loads then wait on the stores before them, which cost
/// 8–16 % on the H200 where nothing spilled. It is a relief for a kernel
/// ptxas spills ([`crate::compile_kernel`]), not the default form.
pub(crate) fn stream_partials(kernel: &Kernel) -> Option<Kernel> {
    let mut out = kernel.clone();
    let mut done = false;
    for stmt in &mut out.body {
        let Stmt::If(Expr::Call(f, _), last) = stmt else {
            continue;
        };
        if f != "dcir_split_arrive" {
            continue;
        }
        // [zero the accumulators, `unroll 1`, for s { for i { acc[i] += ldcg(partials, slot) } }, epilogue..]
        let (acc_len, splits, slot) = match last.as_slice() {
            [
                Stmt::For {
                    end: Expr::Int(acc_len),
                    ..
                },
                Stmt::Pragma(_),
                Stmt::For {
                    end: Expr::Int(splits),
                    body: s_body,
                    ..
                },
                ..,
            ] => match s_body.as_slice() {
                [Stmt::For { body: i_body, .. }] => match i_body.as_slice() {
                    [Stmt::Store(_, _, Expr::Bin(BinOp::Add, _, sum))] => match sum.as_ref() {
                        Expr::Call(ldcg, args) if ldcg == "dcir_ldcg" && args.len() == 2 => {
                            (*acc_len, *splits, args[1].clone())
                        }
                        _ => return None,
                    },
                    _ => return None,
                },
                _ => return None,
            },
            _ => return None,
        };
        let stride = int(acc_len * kernel.block as i64);
        let first = |index: &Expr| {
            slot.clone().map(&mut |e| match e {
                Expr::Var(v) if v == "s" => int(0),
                Expr::Var(v) if v == "i" => index.clone(),
                e => e,
            })
        };
        let epilogue: Vec<Stmt> = last.drain(3..).collect();
        *last = epilogue
            .into_iter()
            .map(|s| {
                s.map_exprs(&mut |e| match e {
                    Expr::Load(array, i) if array.name == "acc" => call(
                        "dcir_split_sum",
                        vec![var(PARTIALS), first(&i), stride.clone(), int(splits)],
                    ),
                    e => e,
                })
            })
            .collect();
        done = true;
    }
    if !done {
        return None;
    }
    out.helpers.insert(Helper::SplitSum);
    Some(out)
}

/// Names the split-K code declares.
pub(crate) const LOCALS: &[&str] = &["blk", "ks", "k_tile0", "i", "s", PARTIALS, ARRIVALS];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_divide_the_k_tiles() {
        assert_eq!(SplitK::new(8, 72, 4).splits, 8);
        assert_eq!(SplitK::new(8, 36, 4).splits, 6);
        assert_eq!(SplitK::new(16, 7, 4).splits, 7);
        assert_eq!(SplitK::new(4, 7, 4).splits, 1);
        assert_eq!(SplitK::new(1, 72, 4).splits, 1);
        let s = SplitK::new(64, 128, 3);
        assert_eq!((s.splits, s.tiles_per_split, s.blocks()), (32, 4, 96));
    }

    /// The kernels of the first graph of `text`, a fused module.
    fn kernels(text: &str) -> Vec<Kernel> {
        let module = dcir_reader::parse_module(text).expect("reads");
        crate::lower_graph(&module.graphs[0]).expect("lowers")
    }

    #[test]
    fn a_streamed_epilogue_reads_the_partial_sums_and_never_the_accumulators() {
        let text = |split: u32, math: &str, dtype: &str| {
            format!(
                "graph @g(%a: {dtype}[64,4096], %b: {dtype}[4096,64], %r: {dtype}[64,64]) -> ({dtype}[64,64]) {{\n  \
                 %y = fused @g0(%a.in = %a, %b.in = %b, %r.in = %r) {{kind = \"gemm\", level = \"register\", math = \"{math}\", split_k = {split}, stages = 2, threads = 128, tile = [64, 64, 32]}} : {dtype}[64,64] {{\n    \
                 %mm = matmul %a.in, %b.in : {dtype}[64,64]\n    %s = add %mm, %r.in : {dtype}[64,64]\n    yield %s\n  }}\n  return %y\n}}"
            )
        };
        for (math, dtype) in [("fma", "f32"), ("tensor_core", "f16")] {
            let split = &kernels(&text(4, math, dtype))[0];
            let streamed = stream_partials(split).expect("a split-K kernel streams");
            let source = crate::print_kernel(&streamed);
            assert!(source.contains("dcir_split_sum(dcir_partials"), "{source}");
            // The accumulators are stored once to the partials, never read after.
            let after = source
                .split("dcir_split_arrive(dcir_arrivals")
                .nth(1)
                .unwrap();
            assert!(!after.contains("acc["), "{after}");
            assert_eq!(streamed.params, split.params);
            let plain = &kernels(&text(1, math, dtype))[0];
            assert!(stream_partials(plain).is_none());
        }
    }
}
