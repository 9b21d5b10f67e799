//! dcir's own passes. Each module holds one pass and its [`PassDef`].

mod canonicalize;
mod channels_last;
mod common;
mod cse;
mod dce;
mod decompose_gelu;
mod decompose_layernorm;
mod decompose_softmax;
mod fold_batchnorm;
mod fold_constants;
mod fold_matmul_scale;
mod hoist_weights;
mod nhwc_inputs;
mod to_half;

use crate::registry::PassDef;

/// Every built-in pass, sorted by name (the order `--list-passes` documents them).
pub const BUILTIN_PASSES: &[PassDef] = &[
    canonicalize::DEF,
    channels_last::DEF,
    cse::DEF,
    dce::DEF,
    decompose_gelu::DEF,
    decompose_layernorm::DEF,
    decompose_softmax::DEF,
    fold_batchnorm::DEF,
    fold_constants::DEF,
    fold_matmul_scale::DEF,
    hoist_weights::DEF,
    nhwc_inputs::DEF,
    to_half::TO_BF16,
    to_half::TO_F16,
];
