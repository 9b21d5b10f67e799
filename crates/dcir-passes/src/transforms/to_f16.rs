//! `to-f16`: makes every f32 value f16, as a mixed-precision export does.
//!
//! Every value of dtype f32 (parameters, results, fused-region values) and
//! every declared result type becomes f16. The numbers that become f16
//! tensor elements are saturated into f16's range, as ONNX's float16
//! converters do with initializers: a `constant`'s values, `clip`'s bounds
//! and `pad`'s fill value. A nonzero magnitude below f16's smallest normal
//! (2^-14) becomes 2^-14, and a finite magnitude above 65504 becomes 65504;
//! zeros, infinities and NaN stay. Without that, `clip(x, min = 1e-12)` of an
//! L2 normalisation rounds its bound to 0 and `0 / 0` makes NaN.
//!
//! Attributes an op computes with internally (`eps` of `layernorm` and
//! `batchnorm`, activation slopes) are left as they are: the kernels and the
//! interpreter compute those in f32.

use dcir_ir::{Attr, DType, Graph, Module, OpKind};

use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{PassDef, PassOptions};

/// The registry entry.
pub const DEF: PassDef = PassDef {
    name: "to-f16",
    summary: "make every f32 value f16; constants, clip bounds and pad values saturate into \
              f16's range (nonzero magnitudes below 2^-14 become 2^-14, finite ones above 65504 \
              become 65504)",
    options: &[],
    create: |_: &PassOptions| Ok(Box::new(ToF16)),
};

struct ToF16;

/// Smallest positive normal f16.
const F16_MIN_NORMAL: f64 = 6.103_515_625e-5;
/// Largest finite f16.
const F16_MAX: f64 = 65504.0;

/// `x` saturated into f16's normal range (see the module doc).
fn saturate(x: f64) -> f64 {
    let magnitude = x.abs();
    if magnitude > 0.0 && magnitude < F16_MIN_NORMAL {
        F16_MIN_NORMAL.copysign(x)
    } else if magnitude.is_finite() && magnitude > F16_MAX {
        F16_MAX.copysign(x)
    } else {
        x
    }
}

/// The attributes of `kind` whose numbers become elements of its f16 result.
fn element_attrs(kind: OpKind) -> &'static [&'static str] {
    match kind {
        OpKind::Constant | OpKind::Pad => &["value"],
        OpKind::Clip => &["min", "max"],
        _ => &[],
    }
}

/// Converts `graph`; true when anything was f32.
fn convert(graph: &mut Graph) -> bool {
    let mut changed = graph.result_types().iter().any(|t| t.dtype == DType::F32);
    for v in graph.value_ids() {
        if graph.ty(v).dtype == DType::F32 {
            changed = true;
            let ty = graph.ty(v).with_dtype(DType::F16);
            graph.set_ty(v, ty);
        }
    }
    let results = graph
        .result_types()
        .iter()
        .map(|t| match t.dtype {
            DType::F32 => t.with_dtype(DType::F16),
            _ => t.clone(),
        })
        .collect();
    graph.set_result_types(results);
    for op in graph.walk_ops(graph.body()) {
        let data = graph.op(op);
        let kind = data.kind;
        let f16_result = data
            .results
            .first()
            .is_some_and(|&r| graph.ty(r).dtype == DType::F16);
        if !f16_result {
            continue;
        }
        let attrs = &mut graph.op_mut(op).attrs;
        for name in element_attrs(kind) {
            let saturated = match attrs.get(name) {
                Some(Attr::Float(x)) => Attr::Float(saturate(*x)),
                Some(Attr::Floats(xs)) => Attr::Floats(xs.iter().map(|&x| saturate(x)).collect()),
                _ => continue,
            };
            attrs.set(*name, saturated);
        }
    }
    changed
}

impl Pass for ToF16 {
    fn name(&self) -> &'static str {
        DEF.name
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        let mut changed = false;
        for graph in &mut module.graphs {
            changed |= convert(graph);
        }
        Ok(PassResult::from_changed(changed))
    }
}
