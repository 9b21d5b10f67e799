//! `decompose-gelu`: rewrites `gelu` as primitive ops.
//!
//! ```text
//! approximate = "none":  y = 0.5 * x * (1 + erf(x * (1 / sqrt(2))))
//! approximate = "tanh":  y = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x * x * x)))
//! ```
//!
//! Each constant is a scalar `constant` of `x`'s dtype broadcast to `x`'s
//! shape. Graph bodies and `fused` regions are rewritten alike; the `gelu`,
//! left without users, is removed.

use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_PI};

use dcir_ir::{Attrs, Graph, OpId, OpKind, Rewriter};

use super::common::{RewriteEach, replace_op};
use crate::pass::PassError;
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "decompose-gelu",
    summary: "rewrite gelu as mul, add and erf (exact form) or tanh (approximate = \"tanh\"), \
              with splat constants",
    options: &[],
    create: |_: &PassOptions| {
        Ok(Box::new(RewriteEach {
            name: DEF.name,
            kind: OpKind::Gelu,
            rewrite: decompose,
        }))
    },
};

fn decompose(graph: &mut Graph, op: OpId) -> Result<(), PassError> {
    let d = graph.op(op);
    let x = d.operands[0];
    let result = d.results[0];
    let tanh_form = match d.attrs.str("approximate") {
        Some("tanh") => true,
        Some("none") | None => false,
        Some(other) => {
            return Err(PassError::at(
                format!("gelu approximation `{other}` is unknown"),
                graph,
                op,
            ));
        }
    };
    let ty = graph.ty(x).clone();
    let hint = graph.value(result).name.clone();
    let h = |s: &str| format!("{hint}.{s}");
    let none = Attrs::new;

    let mut rw = Rewriter::before(graph, op);
    let constant =
        |rw: &mut Rewriter, value: f64, name: &str| rw.splat(ty.dtype, value, ty.dims(), &h(name));
    let inner = if tanh_form {
        // sqrt(2 / pi) * (x + 0.044715 * x^3)
        let c = constant(&mut rw, 0.044715, "c")?;
        let root = constant(&mut rw, FRAC_2_PI.sqrt(), "sqrt_2_pi")?;
        let x2 = rw.op(OpKind::Mul, &[x, x], none(), &h("x2"))?;
        let x3 = rw.op(OpKind::Mul, &[x2, x], none(), &h("x3"))?;
        let cx3 = rw.op(OpKind::Mul, &[c, x3], none(), &h("cx3"))?;
        let poly = rw.op(OpKind::Add, &[x, cx3], none(), &h("poly"))?;
        let arg = rw.op(OpKind::Mul, &[root, poly], none(), &h("arg"))?;
        rw.op(OpKind::Tanh, &[arg], none(), &h("tanh"))?
    } else {
        let inv_sqrt2 = constant(&mut rw, FRAC_1_SQRT_2, "inv_sqrt2")?;
        let arg = rw.op(OpKind::Mul, &[x, inv_sqrt2], none(), &h("arg"))?;
        rw.op(OpKind::Erf, &[arg], none(), &h("erf"))?
    };
    let one = constant(&mut rw, 1.0, "one")?;
    let half = constant(&mut rw, 0.5, "half")?;
    let cdf = rw.op(OpKind::Add, &[one, inner], none(), &h("cdf"))?;
    let half_x = rw.op(OpKind::Mul, &[half, x], none(), &h("half_x"))?;
    let y = rw.op(OpKind::Mul, &[half_x, cdf], none(), &h("out"))?;
    replace_op(graph, op, y);
    Ok(())
}
