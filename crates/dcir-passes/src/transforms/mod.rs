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
mod fold_gelu;
mod fold_matmul_scale;
mod hoist_weights;
mod nhwc_inputs;
mod to_half;

use crate::registry::PassDef;

/// The transpose that stores an NCHW tensor NHWC (a KCRS filter KRSC): the
/// layout passes' `T`, a store the planner keeps (not a view it copies into
/// readers).
pub const TO_NHWC: [i64; 4] = [0, 2, 3, 1];
/// NHWC → NCHW: `T⁻¹`, the view convolutions read a stored NHWC value by.
pub const TO_NCHW: [i64; 4] = [0, 3, 1, 2];
/// The transpose that stores a tensor space-to-depth: `[N, C, H/s, s, W/s,
/// s]` → `[N, H/s, W/s, s, s, C]` (`nhwc-inputs`' stems), a store as
/// [`TO_NHWC`] is.
pub const SPACE_TO_DEPTH: [i64; 6] = [0, 2, 4, 3, 5, 1];

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
    fold_gelu::DEF,
    fold_matmul_scale::DEF,
    hoist_weights::DEF,
    nhwc_inputs::DEF,
    to_half::TO_BF16,
    to_half::TO_F16,
];
