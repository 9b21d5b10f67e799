//! The kernel parameters of `fused` ops: one typed schema, written by the
//! fusion planner and the tuner, checked by the verifier (through
//! [`crate::OpKind::normalize_attrs`]) and read by the emitter.
//!
//! A `fused` op without `kind` is an unplanned group and carries no
//! parameter. With `kind`, it may carry `level` and the parameters its kind
//! lists in [`FUSED_KINDS`], each of the type and within the range
//! [`FUSED_PARAMS`] gives it; anything else (a misspelt name, a parameter of
//! another kind, a string outside its values, `threads = 7`) is an error,
//! never a silent default. What a family's emitter needs beyond the range
//! (a tile its threads divide) it checks, and refuses with the reason.
//!
//! `library` names a vendor library that runs the group instead of a
//! generated kernel; such a group carries no other kernel parameter but
//! `heuristic_rank`, which of the library heuristic's ranked algorithms it
//! runs (the tuner measures several), and only such a group carries it.

use crate::attr::{Attr, Attrs};
use crate::op::AttrError;

/// The type of a kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    /// An integer in the range.
    Int(IntRange),
    /// A list of integers, each in the range.
    Ints(IntRange),
    /// One of these strings.
    Str(&'static [&'static str]),
}

/// The integers a parameter may take: `min..=max`, multiples of `step`, and
/// powers of two when `power_of_two`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntRange {
    /// The least value.
    pub min: i64,
    /// The greatest value.
    pub max: i64,
    /// Every value is a multiple of it.
    pub step: i64,
    /// Every value is a power of two.
    pub power_of_two: bool,
}

impl IntRange {
    /// Whether `v` is in the range.
    pub fn contains(&self, v: i64) -> bool {
        (self.min..=self.max).contains(&v)
            && v % self.step == 0
            && (!self.power_of_two || (v > 0 && (v as u64).is_power_of_two()))
    }
}

impl std::fmt::Display for IntRange {
    /// `a multiple of 32 in [32, 1024]`, `a power of two in [1, 8]`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.power_of_two {
            write!(f, "a power of two in [{}, {}]", self.min, self.max)
        } else if self.step > 1 {
            write!(
                f,
                "a multiple of {} in [{}, {}]",
                self.step, self.min, self.max
            )
        } else {
            write!(f, "in [{}, {}]", self.min, self.max)
        }
    }
}

const fn range(min: i64, max: i64) -> IntRange {
    IntRange {
        min,
        max,
        step: 1,
        power_of_two: false,
    }
}

const fn pow2(max: i64) -> IntRange {
    IntRange {
        min: 1,
        max,
        step: 1,
        power_of_two: true,
    }
}

/// Threads per block: whole warps, at most the 1,024 CUDA allows.
const THREADS: IntRange = IntRange {
    min: 32,
    max: 1024,
    step: 32,
    power_of_two: false,
};

/// One kernel parameter.
#[derive(Clone, Copy, Debug)]
pub struct ParamSpec {
    /// Its attribute name.
    pub name: &'static str,
    /// Its type.
    pub ty: ParamType,
    /// What it sets, for documentation.
    pub summary: &'static str,
}

/// A group kind and the parameters it takes.
#[derive(Clone, Copy, Debug)]
pub struct FusedKind {
    /// The `kind` attribute's value.
    pub name: &'static str,
    /// Its parameters (names in [`FUSED_PARAMS`]), besides `kind` and `level`.
    pub params: &'static [&'static str],
}

const fn p(name: &'static str, ty: ParamType, summary: &'static str) -> ParamSpec {
    ParamSpec { name, ty, summary }
}

/// Every kernel parameter, `kind` and `level` first.
pub const FUSED_PARAMS: &[ParamSpec] = &[
    p(
        "kind",
        ParamType::Str(&[
            "elementwise",
            "reduction",
            "pool",
            "gemm",
            "conv",
            "depthwise_pointwise",
            "contraction_chain",
            "attention",
        ]),
        "the kernel family",
    ),
    p(
        "level",
        ParamType::Str(&["register", "shared"]),
        "where intermediate values live",
    ),
    p("threads", ParamType::Int(THREADS), "threads per block"),
    p(
        "vector",
        ParamType::Int(pow2(8)),
        "elements per vector access",
    ),
    p(
        "items",
        ParamType::Int(range(1, 64)),
        "elements per thread per step",
    ),
    p(
        "threads_per_row",
        ParamType::Int(pow2(1024)),
        "threads reducing one row",
    ),
    p(
        "rows_per_block",
        ParamType::Int(range(1, 1024)),
        "rows a block reduces",
    ),
    p(
        "row_cache",
        ParamType::Str(&["registers", "shared", "none"]),
        "where a reduction keeps its row between passes",
    ),
    p(
        "algorithm",
        ParamType::Str(&["implicit_gemm", "direct"]),
        "how a convolution is computed",
    ),
    p(
        "tile",
        ParamType::Ints(range(1, 4096)),
        "block tile extents",
    ),
    p(
        "tile_n",
        ParamType::Int(range(1, 4096)),
        "the pointwise stage's output columns per block",
    ),
    p(
        "block",
        ParamType::Ints(range(1, 4096)),
        "query and key rows per block",
    ),
    p(
        "stages",
        ParamType::Int(range(1, 8)),
        "shared-memory buffers of the k loop",
    ),
    p(
        "math",
        ParamType::Str(&["fma", "tensor_core"]),
        "the arithmetic units",
    ),
    p(
        "mainloop",
        ParamType::Str(&["mma_sync", "wgmma"]),
        "with `math = \"tensor_core\"`: the k loop's instructions (`wgmma`: Hopper's, with TMA loads and a persistent grid; sm_90a)",
    ),
    p(
        "split_k",
        ParamType::Int(range(1, 256)),
        "blocks sharing one tile's k loop",
    ),
    p(
        "split_n",
        ParamType::Int(range(1, 256)),
        "blocks sharing one row tile's output columns",
    ),
    p(
        "library",
        ParamType::Str(&["cublaslt", "cudnn"]),
        "a vendor library call instead of a generated kernel (takes no other parameter but `heuristic_rank`)",
    ),
    p(
        "heuristic_rank",
        ParamType::Int(range(0, 15)),
        "with `library`: the library heuristic's algorithm of this rank (0, the default, is its first choice)",
    ),
];

/// Every group kind with its parameters.
pub const FUSED_KINDS: &[FusedKind] = &[
    FusedKind {
        name: "elementwise",
        params: &["threads", "vector", "items"],
    },
    FusedKind {
        name: "reduction",
        params: &[
            "threads",
            "threads_per_row",
            "rows_per_block",
            "vector",
            "row_cache",
        ],
    },
    FusedKind {
        name: "pool",
        params: &["threads", "items"],
    },
    FusedKind {
        name: "gemm",
        params: &[
            "tile",
            "threads",
            "stages",
            "math",
            "mainloop",
            "split_k",
            "library",
            "heuristic_rank",
        ],
    },
    FusedKind {
        name: "conv",
        params: &[
            "algorithm",
            "tile",
            "threads",
            "stages",
            "math",
            "mainloop",
            "split_k",
            "library",
            "heuristic_rank",
        ],
    },
    FusedKind {
        name: "depthwise_pointwise",
        params: &["tile", "tile_n", "threads", "math"],
    },
    FusedKind {
        name: "contraction_chain",
        params: &["tile", "threads", "split_n", "stages", "math"],
    },
    FusedKind {
        name: "attention",
        params: &["block", "threads", "stages", "math"],
    },
];

/// The kind named `name`.
pub fn fused_kind(name: &str) -> Option<&'static FusedKind> {
    FUSED_KINDS.iter().find(|k| k.name == name)
}

/// The parameter named `name`.
pub fn fused_param(name: &str) -> Option<&'static ParamSpec> {
    FUSED_PARAMS.iter().find(|p| p.name == name)
}

fn error(attr: &str, message: String) -> AttrError {
    AttrError {
        attr: Some(attr.to_string()),
        message,
    }
}

/// Checks the attributes of a `fused` op against the schema (module doc).
pub fn check_fused_attrs(attrs: &Attrs) -> Result<(), AttrError> {
    let kind = match attrs.get("kind") {
        None => None,
        Some(Attr::Str(name)) => Some(fused_kind(name).ok_or_else(|| {
            let known: Vec<&str> = FUSED_KINDS.iter().map(|k| k.name).collect();
            error(
                "kind",
                format!("`fused` has no kind `{name}` (kinds: {})", known.join(", ")),
            )
        })?),
        Some(_) => return Err(error("kind", "`fused`'s `kind` must be a string".into())),
    };
    let library = attrs.get("library").is_some();
    for (name, value) in attrs.iter() {
        if name == "kind" {
            continue;
        }
        if library && !matches!(name, "level" | "library" | "heuristic_rank") {
            return Err(error(
                name,
                format!(
                    "a `fused` op with `library` calls the library and takes no kernel parameter but `heuristic_rank`, found `{name}`"
                ),
            ));
        }
        if !library && name == "heuristic_rank" {
            return Err(error(
                name,
                "`heuristic_rank` picks a library's algorithm: it needs `library`".into(),
            ));
        }
        let allowed = match kind {
            None => {
                return Err(error(
                    name,
                    format!(
                        "a `fused` op without `kind` takes no kernel parameters, found `{name}`"
                    ),
                ));
            }
            Some(k) => name == "level" || k.params.contains(&name),
        };
        let kind = kind.expect("checked above");
        if !allowed {
            return Err(error(
                name,
                format!(
                    "`fused` of kind `{}` has no parameter `{name}` (it has: level, {})",
                    kind.name,
                    kind.params.join(", ")
                ),
            ));
        }
        let spec = fused_param(name).expect("every listed parameter is in FUSED_PARAMS");
        let fits = match (spec.ty, value) {
            (ParamType::Int(r), Attr::Int(v)) => r.contains(*v),
            (ParamType::Ints(r), Attr::Ints(vs)) => vs.iter().all(|&v| r.contains(v)),
            (ParamType::Str(values), Attr::Str(s)) => values.contains(&s.as_str()),
            _ => false,
        };
        if !fits {
            let wanted = match spec.ty {
                ParamType::Int(r) => format!("an integer, {r}"),
                ParamType::Ints(r) => format!("a list of integers, each {r}"),
                ParamType::Str(values) => format!("one of \"{}\"", values.join("\", \"")),
            };
            return Err(error(
                name,
                format!("`fused` parameter `{name}` must be {wanted}"),
            ));
        }
    }
    Ok(())
}
