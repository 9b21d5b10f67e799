//! `to-f16` and `to-bf16`: make every f32 value half precision, as a
//! mixed-precision export does.
//!
//! Every value of dtype f32 (parameters, results, fused-region values) and
//! every declared result type becomes f16 (or bf16). The numbers that become
//! half tensor elements are saturated into the type's normal range
//! ([`dcir_interp::tensor::saturate_to`], the rule weights converted on load
//! follow too): a `constant`'s values, `clip`'s bounds and `pad`'s fill
//! value. For f16 a nonzero magnitude below 2^-14 becomes 2^-14, and a
//! finite magnitude above 65504 becomes 65504; zeros, infinities and NaN
//! stay. Without that, `clip(x, min = 1e-12)` of an L2 normalisation rounds
//! its bound to 0 and `0 / 0` makes NaN. bf16 has f32's exponent range, so
//! only magnitudes f32 itself barely holds change.
//!
//! Attributes an op computes with internally (`eps` of `layernorm` and
//! `batchnorm`, activation slopes) are left as they are: the kernels and the
//! interpreter compute those in f32.

use dcir_interp::tensor::saturate_to;
use dcir_ir::{Attr, DType, Graph, Module, OpKind};

use crate::analysis::AnalysisManager;
use crate::pass::{Pass, PassError, PassResult};
use crate::registry::{PassDef, PassOptions};

/// The registry entry of `to-f16`.
pub const TO_F16: PassDef = PassDef {
    name: "to-f16",
    summary: "make every f32 value f16; constants, clip bounds and pad values saturate into \
              f16's range (nonzero magnitudes below 2^-14 become 2^-14, finite ones above 65504 \
              become 65504)",
    options: &[],
    create: |_: &PassOptions| Ok(Box::new(ToHalf(DType::F16))),
};

/// The registry entry of `to-bf16`.
pub const TO_BF16: PassDef = PassDef {
    name: "to-bf16",
    summary: "make every f32 value bf16; constants, clip bounds and pad values saturate into \
              bf16's range (f32's exponents: only magnitudes below 2^-126 or above bf16's \
              largest finite change)",
    options: &[],
    create: |_: &PassOptions| Ok(Box::new(ToHalf(DType::BF16))),
};

/// Converts every f32 value to this half dtype.
struct ToHalf(DType);

/// The attributes of `kind` whose numbers become elements of its f16 result.
fn element_attrs(kind: OpKind) -> &'static [&'static str] {
    match kind {
        OpKind::Constant | OpKind::Pad => &["value"],
        OpKind::Clip => &["min", "max"],
        _ => &[],
    }
}

/// Converts `graph` to `half`; true when anything was f32.
fn convert(graph: &mut Graph, half: DType) -> bool {
    let mut changed = graph.result_types().iter().any(|t| t.dtype == DType::F32);
    for v in graph.value_ids() {
        if graph.ty(v).dtype == DType::F32 {
            changed = true;
            let ty = graph.ty(v).with_dtype(half);
            graph.set_ty(v, ty);
        }
    }
    let results = graph
        .result_types()
        .iter()
        .map(|t| match t.dtype {
            DType::F32 => t.with_dtype(half),
            _ => t.clone(),
        })
        .collect();
    graph.set_result_types(results);
    for op in graph.walk_ops(graph.body()) {
        let data = graph.op(op);
        let kind = data.kind;
        let half_result = data
            .results
            .first()
            .is_some_and(|&r| graph.ty(r).dtype == half);
        if !half_result {
            continue;
        }
        let attrs = &mut graph.op_mut(op).attrs;
        for name in element_attrs(kind) {
            let saturated = match attrs.get(name) {
                Some(Attr::Float(x)) => Attr::Float(saturate_to(half, *x)),
                Some(Attr::Floats(xs)) => {
                    Attr::Floats(xs.iter().map(|&x| saturate_to(half, x)).collect())
                }
                _ => continue,
            };
            attrs.set(*name, saturated);
        }
    }
    changed
}

impl Pass for ToHalf {
    fn name(&self) -> &'static str {
        match self.0 {
            DType::BF16 => TO_BF16.name,
            _ => TO_F16.name,
        }
    }

    fn run(
        &mut self,
        module: &mut Module,
        _: &mut AnalysisManager,
    ) -> Result<PassResult, PassError> {
        let mut changed = false;
        for graph in &mut module.graphs {
            changed |= convert(graph, self.0);
        }
        Ok(PassResult::from_changed(changed))
    }
}
