//! Graphs shaped like the patterns real models fuse, at odd sizes past the
//! kernels' tiles and in every float dtype: attention (QKᵀ, scale, an
//! optional additive mask, softmax, ·V), a GEMM with its bias and activation,
//! a convolution with batchnorm and relu (grouped, depthwise, strided,
//! padded), and a layernorm with a residual. The random graphs of
//! [`crate::arb_graph_spec`] seldom form these, and never at sizes where a
//! tile has an edge; checking kernels on a GPU wants both.

use dcir_ir::{Attr, Attrs, BuildError, DType, Graph, GraphBuilder, OpKind, TensorType};
use proptest::prelude::*;

/// One workload-shaped graph.
#[derive(Clone, Debug)]
pub enum Workload {
    /// `softmax(q·kᵀ · scale (+ mask)) · v` over `[batch, heads, len, dim]`.
    Attention {
        /// Batch.
        batch: usize,
        /// Heads.
        heads: usize,
        /// Query length.
        q_len: usize,
        /// Key and value length.
        kv_len: usize,
        /// Head dim.
        head_dim: usize,
        /// Add a `[q_len, kv_len]` mask before the softmax.
        masked: bool,
        /// Element type.
        dtype: DType,
    },
    /// `act(x·w + bias)` with `x: [m, k]`, `w: [k, n]`.
    Gemm {
        /// Rows.
        m: usize,
        /// Contraction.
        k: usize,
        /// Columns.
        n: usize,
        /// 0: none, 1: relu, 2: gelu.
        act: u8,
        /// Element type.
        dtype: DType,
    },
    /// `relu(batchnorm(conv2d(x, w)))`.
    Conv {
        /// Images.
        n: usize,
        /// Input channels.
        c: usize,
        /// Height and width.
        hw: [usize; 2],
        /// Output channels per group, times the groups.
        out_per_group: usize,
        /// 1: dense, else the channels (depthwise) or a divisor of them.
        groups_pick: u8,
        /// Square kernel.
        kernel: usize,
        /// Stride (both axes).
        stride: usize,
        /// Padding (all sides), at most `kernel / 2`.
        pad: usize,
        /// Element type.
        dtype: DType,
    },
    /// `layernorm(x) + residual` over the last dim of `[rows, cols]`.
    NormResidual {
        /// Rows.
        rows: usize,
        /// Normalized length.
        cols: usize,
        /// Element type.
        dtype: DType,
    },
}

fn float() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16)]
}

/// Random workloads (sizes shrink towards 1, dtypes towards f32).
pub fn arb_workload() -> impl Strategy<Value = Workload> {
    prop_oneof![
        (
            1..3usize,
            1..5usize,
            1..200usize,
            1..200usize,
            prop::sample::select(vec![8, 16, 32, 40, 64, 80, 128]),
            any::<bool>(),
            float()
        )
            .prop_map(|(batch, heads, q_len, kv_len, head_dim, masked, dtype)| {
                Workload::Attention {
                    batch,
                    heads,
                    q_len,
                    kv_len,
                    head_dim,
                    masked,
                    dtype,
                }
            }),
        (1..300usize, 1..300usize, 1..300usize, 0..3u8, float()).prop_map(
            |(m, k, n, act, dtype)| Workload::Gemm {
                m,
                k,
                n,
                act,
                dtype
            }
        ),
        (
            1..3usize,
            1..48usize,
            (1..40usize, 1..40usize),
            1..4usize,
            0..3u8,
            prop::sample::select(vec![1, 3, 5, 7]),
            1..3usize,
            0..4usize,
            float()
        )
            .prop_map(
                |(n, c, (h, w), out_per_group, groups_pick, kernel, stride, pad, dtype)| {
                    Workload::Conv {
                        n,
                        c,
                        hw: [h.max(kernel), w.max(kernel)],
                        out_per_group,
                        groups_pick,
                        kernel,
                        stride,
                        pad: pad.min(kernel / 2),
                        dtype,
                    }
                }
            ),
        (1..300usize, 1..1100usize, float())
            .prop_map(|(rows, cols, dtype)| Workload::NormResidual { rows, cols, dtype }),
    ]
}

/// Builds (and verifies) the graph `w` describes, named `name`.
pub fn build_workload(name: &str, w: &Workload) -> Result<Graph, BuildError> {
    let mut b = GraphBuilder::new(name);
    let t = |dtype: DType, dims: &[usize]| TensorType::new(dtype, dims.to_vec());
    let out = match *w {
        Workload::Attention {
            batch,
            heads,
            q_len,
            kv_len,
            head_dim,
            masked,
            dtype,
        } => {
            let q = b.param("q", t(dtype, &[batch, heads, q_len, head_dim]))?;
            let k = b.param("k", t(dtype, &[batch, heads, kv_len, head_dim]))?;
            let v = b.param("v", t(dtype, &[batch, heads, kv_len, head_dim]))?;
            let scores = b.op(
                OpKind::Matmul,
                &[q, k],
                Attrs::new().with("transpose_b", Attr::Bool(true)),
            )?;
            let shape = [batch, heads, q_len, kv_len];
            let scale = b.constant(t(dtype, &[]), Attr::Float(1.0 / (head_dim as f64).sqrt()))?;
            let scale = b.broadcast(scale, &[], &shape)?;
            let mut s = b.op(OpKind::Mul, &[scores, scale], Attrs::new())?;
            if masked {
                let mask = b.param("mask", t(dtype, &[q_len, kv_len]))?;
                let mask = b.broadcast(mask, &[2, 3], &shape)?;
                s = b.op(OpKind::Add, &[s, mask], Attrs::new())?;
            }
            let p = b.op(
                OpKind::Softmax,
                &[s],
                Attrs::new().with("axis", Attr::Int(3)),
            )?;
            b.op(OpKind::Matmul, &[p, v], Attrs::new())?
        }
        Workload::Gemm {
            m,
            k,
            n,
            act,
            dtype,
        } => {
            let x = b.param("x", t(dtype, &[m, k]))?;
            let wt = b.param("w", t(dtype, &[k, n]))?;
            let bias = b.param("bias", t(dtype, &[n]))?;
            let y = b.op(OpKind::Matmul, &[x, wt], Attrs::new())?;
            let bias = b.broadcast(bias, &[1], &[m, n])?;
            let y = b.op(OpKind::Add, &[y, bias], Attrs::new())?;
            match act {
                1 => b.op(OpKind::Relu, &[y], Attrs::new())?,
                2 => b.op(OpKind::Gelu, &[y], Attrs::new())?,
                _ => y,
            }
        }
        Workload::Conv {
            n,
            c,
            hw,
            out_per_group,
            groups_pick,
            kernel,
            stride,
            pad,
            dtype,
        } => {
            let groups = match groups_pick {
                0 => 1,
                1 => c,
                _ => (1..=c).rev().find(|g| c % g == 0 && *g <= 4).unwrap_or(1),
            };
            let o = groups * out_per_group;
            let x = b.param("x", t(dtype, &[n, c, hw[0], hw[1]]))?;
            let wt = b.param("w", t(dtype, &[o, c / groups, kernel, kernel]))?;
            let s = stride as i64;
            let p = pad as i64;
            let attrs = Attrs::new()
                .with("stride", Attr::Ints(vec![s, s]))
                .with("pad", Attr::Ints(vec![p, p, p, p]))
                .with("groups", Attr::Int(groups as i64));
            let y = b.op(OpKind::Conv2d, &[x, wt], attrs)?;
            let per_channel: Vec<_> = ["scale", "shift", "mean", "var"]
                .iter()
                .map(|name| b.param(name, t(dtype, &[o])))
                .collect::<Result<_, _>>()?;
            let mut operands = vec![y];
            operands.extend(per_channel);
            let y = b.op(OpKind::Batchnorm, &operands, Attrs::new())?;
            b.op(OpKind::Relu, &[y], Attrs::new())?
        }
        Workload::NormResidual { rows, cols, dtype } => {
            let x = b.param("x", t(dtype, &[rows, cols]))?;
            let gamma = b.param("gamma", t(dtype, &[cols]))?;
            let beta = b.param("beta", t(dtype, &[cols]))?;
            let residual = b.param("residual", t(dtype, &[rows, cols]))?;
            let y = b.op(
                OpKind::Layernorm,
                &[x, gamma, beta],
                Attrs::new().with("axis", Attr::Int(1)),
            )?;
            b.op(OpKind::Add, &[y, residual], Attrs::new())?
        }
    };
    b.finish(&[out])
}
