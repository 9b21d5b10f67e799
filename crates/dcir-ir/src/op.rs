//! The closed set of operations and the static op table that describes them.
//!
//! Every op is a variant of [`OpKind`]; [`OpKind::info`] gives its row of the
//! table: textual name, operand and result arity, attribute schema, whether its
//! result type is inferred or declared, and a one-line summary. The type and
//! shape rule of each op lives in [`crate::shape`].

use crate::attr::{Attr, AttrKind, Attrs};

/// How many operands or results an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Exactly(usize),
    /// This many or more.
    AtLeast(usize),
}

impl Arity {
    /// True when `n` satisfies the arity.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exactly(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }

    /// "exactly 2", "at least 1".
    pub fn describe(self) -> String {
        match self {
            Arity::Exactly(k) => format!("exactly {k}"),
            Arity::AtLeast(k) => format!("at least {k}"),
        }
    }
}

/// A default value of an optional attribute (a `const`-friendly [`Attr`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AttrDefault {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(&'static str),
    /// A list of integers.
    Ints(&'static [i64]),
}

impl AttrDefault {
    /// True when `attr` is this default (no allocation).
    pub fn matches(self, attr: &Attr) -> bool {
        match (self, attr) {
            (AttrDefault::Int(a), Attr::Int(b)) => a == *b,
            (AttrDefault::Float(a), Attr::Float(b)) => a.to_bits() == b.to_bits(),
            (AttrDefault::Bool(a), Attr::Bool(b)) => a == *b,
            (AttrDefault::Str(a), Attr::Str(b)) => a == b,
            (AttrDefault::Ints(a), Attr::Ints(b)) => a == b.as_slice(),
            _ => false,
        }
    }

    /// The default as an attribute value.
    pub fn to_attr(self) -> Attr {
        match self {
            AttrDefault::Int(i) => Attr::Int(i),
            AttrDefault::Float(f) => Attr::Float(f),
            AttrDefault::Bool(b) => Attr::Bool(b),
            AttrDefault::Str(s) => Attr::Str(s.to_string()),
            AttrDefault::Ints(v) => Attr::Ints(v.to_vec()),
        }
    }
}

/// One attribute of an op's schema.
#[derive(Clone, Copy, Debug)]
pub struct AttrSpec {
    /// Attribute name.
    pub name: &'static str,
    /// Kind of value it holds.
    pub kind: AttrKind,
    /// Value when omitted; `None` means the attribute is required.
    pub default: Option<AttrDefault>,
    /// What it means, for docs and messages.
    pub doc: &'static str,
}

/// Where the types of an op's results come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultTypes {
    /// Computed from operand types and attributes; a written type is checked against it.
    Inferred,
    /// Taken from the written type and checked for consistency (reshape, cast, ...).
    Declared,
}

/// One row of the op table.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    /// Textual name, as written in `.dcir` files.
    pub name: &'static str,
    /// One-line description.
    pub summary: &'static str,
    /// Operand arity.
    pub operands: Arity,
    /// Result arity.
    pub results: Arity,
    /// Attribute schema, in canonical order.
    pub attrs: &'static [AttrSpec],
    /// True when the attributes are `fused`'s kernel parameters, checked
    /// against [`crate::fused`]'s schema and kept sorted by name.
    pub open_attrs: bool,
    /// True when the op carries a single-block region: `fused`.
    pub has_region: bool,
    /// True for block terminators: `return`, `yield`.
    pub is_terminator: bool,
    /// Where result types come from.
    pub result_types: ResultTypes,
}

/// Why a set of attributes does not fit an op's schema.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct AttrError {
    /// The offending attribute, when one is to blame.
    pub attr: Option<String>,
    /// What is wrong.
    pub message: String,
}

macro_rules! attr {
    ($name:literal, $kind:ident, $doc:literal) => {
        AttrSpec {
            name: $name,
            kind: AttrKind::$kind,
            default: None,
            doc: $doc,
        }
    };
    ($name:literal, $kind:ident = $default:expr, $doc:literal) => {
        AttrSpec {
            name: $name,
            kind: AttrKind::$kind,
            default: Some($default),
            doc: $doc,
        }
    };
}

const NO_ATTRS: &[AttrSpec] = &[];
const CLIP_ATTRS: &[AttrSpec] = &[
    attr!("min", Float, "lower bound"),
    attr!("max", Float, "upper bound"),
];
const GELU_ATTRS: &[AttrSpec] = &[attr!(
    "approximate",
    Str = AttrDefault::Str("none"),
    "\"none\" (erf form) or \"tanh\""
)];
const CONV2D_ATTRS: &[AttrSpec] = &[
    attr!(
        "stride",
        Ints = AttrDefault::Ints(&[1, 1]),
        "[sh, sw], each > 0"
    ),
    attr!(
        "pad",
        Ints = AttrDefault::Ints(&[0, 0, 0, 0]),
        "[top, left, bottom, right], each >= 0"
    ),
    attr!(
        "dilation",
        Ints = AttrDefault::Ints(&[1, 1]),
        "[dh, dw], each > 0"
    ),
    attr!(
        "groups",
        Int = AttrDefault::Int(1),
        "divides input and output channels"
    ),
];
const MATMUL_ATTRS: &[AttrSpec] = &[
    attr!(
        "transpose_a",
        Bool = AttrDefault::Bool(false),
        "use the transpose of the last two dims of a"
    ),
    attr!(
        "transpose_b",
        Bool = AttrDefault::Bool(false),
        "use the transpose of the last two dims of b"
    ),
];
const BROADCAST_ATTRS: &[AttrSpec] = &[attr!(
    "dims",
    Ints,
    "result dim of each operand dim, strictly increasing"
)];
const TRANSPOSE_ATTRS: &[AttrSpec] = &[attr!("perm", Ints, "result dim i is operand dim perm[i]")];
const SLICE_ATTRS: &[AttrSpec] = &[
    attr!("starts", Ints, "first index per dim"),
    attr!("ends", Ints, "one past the last index per dim"),
    attr!(
        "steps",
        Ints = AttrDefault::Ints(&[]),
        "stride per dim, each > 0; [] means all 1"
    ),
];
const CONCAT_ATTRS: &[AttrSpec] = &[attr!("axis", Int, "the dim joined along")];
const PAD_ATTRS: &[AttrSpec] = &[
    attr!("low", Ints, "elements added before each dim, each >= 0"),
    attr!("high", Ints, "elements added after each dim, each >= 0"),
    attr!(
        "value",
        Float = AttrDefault::Float(0.0),
        "value of the added elements"
    ),
];
const GATHER_ATTRS: &[AttrSpec] = &[attr!("axis", Int = AttrDefault::Int(0), "the dim indexed")];
const REDUCE_ATTRS: &[AttrSpec] = &[
    attr!("axes", Ints, "dims reduced, strictly increasing"),
    attr!(
        "keepdims",
        Bool = AttrDefault::Bool(false),
        "keep reduced dims with extent 1"
    ),
];
const SOFTMAX_ATTRS: &[AttrSpec] = &[attr!("axis", Int, "the dim normalized")];
const LAYERNORM_ATTRS: &[AttrSpec] = &[
    attr!(
        "axis",
        Int,
        "first normalized dim; dims axis.. are normalized"
    ),
    attr!(
        "epsilon",
        Float = AttrDefault::Float(1e-5),
        "added to the variance, > 0"
    ),
];
const BATCHNORM_ATTRS: &[AttrSpec] = &[attr!(
    "epsilon",
    Float = AttrDefault::Float(1e-5),
    "added to the variance, > 0"
)];
const MAXPOOL_ATTRS: &[AttrSpec] = &[
    attr!("kernel", Ints, "[kh, kw], each > 0"),
    attr!(
        "stride",
        Ints = AttrDefault::Ints(&[1, 1]),
        "[sh, sw], each > 0"
    ),
    attr!(
        "pad",
        Ints = AttrDefault::Ints(&[0, 0, 0, 0]),
        "[top, left, bottom, right], each >= 0 and < kernel"
    ),
    attr!(
        "dilation",
        Ints = AttrDefault::Ints(&[1, 1]),
        "[dh, dw], each > 0"
    ),
];
const AVGPOOL_ATTRS: &[AttrSpec] = &[
    attr!("kernel", Ints, "[kh, kw], each > 0"),
    attr!(
        "stride",
        Ints = AttrDefault::Ints(&[1, 1]),
        "[sh, sw], each > 0"
    ),
    attr!(
        "pad",
        Ints = AttrDefault::Ints(&[0, 0, 0, 0]),
        "[top, left, bottom, right], each >= 0 and < kernel"
    ),
    attr!(
        "dilation",
        Ints = AttrDefault::Ints(&[1, 1]),
        "[dh, dw], each > 0: taps dilation apart"
    ),
    attr!(
        "count_include_pad",
        Bool = AttrDefault::Bool(false),
        "divide by the full window, padding included"
    ),
];
const MOD_ATTRS: &[AttrSpec] = &[attr!(
    "fmod",
    Bool = AttrDefault::Bool(false),
    "the remainder takes the dividend's sign (C fmod); else the divisor's (Python %)"
)];
const CONSTANT_ATTRS: &[AttrSpec] = &[attr!(
    "value",
    Literal,
    "one number (splat) or one per element, row-major"
)];

macro_rules! ops {
    ($(
        $(#[doc = $vdoc:literal])*
        $variant:ident = $name:literal, $operands:expr, $results:expr, $attrs:expr, $types:ident, $summary:literal;
    )*) => {
        /// Every operation of the IR (a closed set: passes match on it exhaustively).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind {
            $($(#[doc = $vdoc])* $variant,)*
        }

        impl OpKind {
            /// Every op, in table order.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$variant,)*];

            /// The op's row of the table.
            pub fn info(self) -> &'static OpInfo {
                match self {
                    $(OpKind::$variant => {
                        const INFO: OpInfo = OpInfo {
                        name: $name,
                        summary: $summary,
                        operands: $operands,
                        results: $results,
                        attrs: $attrs,
                        open_attrs: matches!(OpKind::$variant, OpKind::Fused),
                        has_region: matches!(OpKind::$variant, OpKind::Fused),
                        is_terminator: matches!(OpKind::$variant, OpKind::Return | OpKind::Yield),
                        result_types: ResultTypes::$types,
                        };
                        &INFO
                    })*
                }
            }
        }
    };
}

use Arity::{AtLeast, Exactly};

ops! {
    /// Elementwise `a + b`.
    Add = "add", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "elementwise a + b (same types)";
    /// Elementwise `a - b`.
    Sub = "sub", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "elementwise a - b (same types)";
    /// Elementwise `a * b`.
    Mul = "mul", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "elementwise a * b (same types)";
    /// Elementwise `a / b`.
    Div = "div", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "elementwise a / b (same types)";
    /// Elementwise maximum.
    Max = "max", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "elementwise max(a, b) (same types)";
    /// Elementwise minimum.
    Min = "min", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "elementwise min(a, b) (same types)";
    /// Elementwise power.
    Pow = "pow", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "elementwise a ^ b; on integers wrapping, and with b < 0 the truncated real result (0 unless |a| = 1)";
    /// `max(x, 0)`.
    Relu = "relu", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "max(x, 0)";
    /// `min(max(x, min), max)`.
    Clip = "clip", Exactly(1), Exactly(1), CLIP_ATTRS, Inferred, "min(max(x, min), max)";
    /// Gaussian error linear unit.
    Gelu = "gelu", Exactly(1), Exactly(1), GELU_ATTRS, Inferred, "x * Phi(x), exact (erf) or tanh approximation";
    /// Error function.
    Erf = "erf", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "error function";
    /// Hyperbolic tangent.
    Tanh = "tanh", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "hyperbolic tangent";
    /// Logistic sigmoid.
    Sigmoid = "sigmoid", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "1 / (1 + exp(-x))";
    /// Natural exponential.
    Exp = "exp", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "e ^ x";
    /// Natural logarithm.
    Log = "log", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "natural logarithm";
    /// Square root.
    Sqrt = "sqrt", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "square root";
    /// Reciprocal square root.
    Rsqrt = "rsqrt", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "1 / sqrt(x)";
    /// Negation.
    Neg = "neg", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "-x";
    /// Absolute value.
    Abs = "abs", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "absolute value";
    /// Remainder of a division.
    Mod = "mod", Exactly(2), Exactly(1), MOD_ATTRS, Inferred, "elementwise remainder of a / b (same types), signed as `fmod` says";
    /// Round down.
    Floor = "floor", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "largest integer <= x (float types)";
    /// Round up.
    Ceil = "ceil", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "smallest integer >= x (float types)";
    /// Round to nearest, ties to even.
    Round = "round", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "nearest integer, halves to even (float types)";
    /// Sign.
    Sign = "sign", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "-1, 0 or 1 as x is negative, zero or positive (NaN stays NaN)";
    /// Sine.
    Sin = "sin", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "sine (float types)";
    /// Cosine.
    Cos = "cos", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "cosine (float types)";
    /// NaN test.
    IsNan = "is_nan", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "true where x is NaN (float types; bool result)";
    /// Infinity test.
    IsInf = "is_inf", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "true where x is +inf or -inf (float types; bool result)";
    /// Equality.
    Equal = "equal", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "a == b (same types; bool result)";
    /// Less than.
    Less = "less", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "a < b (same numeric types; bool result)";
    /// Less than or equal.
    LessEqual = "less_equal", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "a <= b (same numeric types; bool result)";
    /// Greater than.
    Greater = "greater", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "a > b (same numeric types; bool result)";
    /// Greater than or equal.
    GreaterEqual = "greater_equal", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "a >= b (same numeric types; bool result)";
    /// Logical and.
    And = "and", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "a and b (bool)";
    /// Logical or.
    Or = "or", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "a or b (bool)";
    /// Logical exclusive or.
    Xor = "xor", Exactly(2), Exactly(1), NO_ATTRS, Inferred, "a xor b (bool)";
    /// Logical not.
    Not = "not", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "not x (bool)";
    /// Elementwise choice.
    Select = "select", Exactly(3), Exactly(1), NO_ATTRS, Inferred, "a where cond, else b (cond bool; a, b of one type; one shape)";
    /// 2-D convolution, NCHW input and OIHW weights.
    Conv2d = "conv2d", Exactly(2), Exactly(1), CONV2D_ATTRS, Inferred, "2-D convolution of x[N,C,H,W] with w[O,C/groups,KH,KW]";
    /// (Batched) matrix multiply.
    Matmul = "matmul", Exactly(2), Exactly(1), MATMUL_ATTRS, Inferred, "batched matrix multiply over the last two dims; batch dims equal";
    /// Explicit broadcast to the declared type.
    Broadcast = "broadcast", Exactly(1), Exactly(1), BROADCAST_ATTRS, Declared, "replicate x into the declared shape; operand dim i maps to result dim dims[i]";
    /// Reshape to the declared type (same element count).
    Reshape = "reshape", Exactly(1), Exactly(1), NO_ATTRS, Declared, "same elements, row-major, in the declared shape";
    /// Permutes dims.
    Transpose = "transpose", Exactly(1), Exactly(1), TRANSPOSE_ATTRS, Inferred, "permute dims: result dim i is operand dim perm[i]";
    /// Strided slice.
    Slice = "slice", Exactly(1), Exactly(1), SLICE_ATTRS, Inferred, "elements starts..ends by steps in every dim";
    /// Concatenation along one dim.
    Concat = "concat", AtLeast(1), Exactly(1), CONCAT_ATTRS, Inferred, "join operands along axis";
    /// Constant padding.
    Pad = "pad", Exactly(1), Exactly(1), PAD_ATTRS, Inferred, "add low/high elements of value around each dim";
    /// Gather along one axis (ONNX Gather).
    Gather = "gather", Exactly(2), Exactly(1), GATHER_ATTRS, Inferred, "data[.., indices, ..] along axis; result dims data[:axis] + indices + data[axis+1:]";
    /// Sum over axes.
    ReduceSum = "reduce_sum", Exactly(1), Exactly(1), REDUCE_ATTRS, Inferred, "sum over axes";
    /// Mean over axes.
    ReduceMean = "reduce_mean", Exactly(1), Exactly(1), REDUCE_ATTRS, Inferred, "mean over axes";
    /// Maximum over axes.
    ReduceMax = "reduce_max", Exactly(1), Exactly(1), REDUCE_ATTRS, Inferred, "maximum over axes";
    /// Product over axes (an integer product wraps).
    ReduceProd = "reduce_prod", Exactly(1), Exactly(1), REDUCE_ATTRS, Inferred, "product over axes";
    /// Softmax along one axis.
    Softmax = "softmax", Exactly(1), Exactly(1), SOFTMAX_ATTRS, Inferred, "exp(x - max) / sum(exp(x - max)) along axis";
    /// Layer normalization over the trailing dims.
    Layernorm = "layernorm", Exactly(3), Exactly(1), LAYERNORM_ATTRS, Inferred, "(x - mean) / sqrt(var + epsilon) * scale + bias over dims axis..; operands x, scale, bias";
    /// Batch normalization, inference form.
    Batchnorm = "batchnorm", Exactly(5), Exactly(1), BATCHNORM_ATTRS, Inferred, "inference batchnorm over dim 1; operands x, scale, bias, mean, var";
    /// 2-D max pooling.
    Maxpool2d = "maxpool2d", Exactly(1), Exactly(1), MAXPOOL_ATTRS, Inferred, "max over windows of x[N,C,H,W]; padding never wins";
    /// 2-D average pooling.
    Avgpool2d = "avgpool2d", Exactly(1), Exactly(1), AVGPOOL_ATTRS, Inferred, "mean over windows of x[N,C,H,W]";
    /// Mean over H and W.
    GlobalAvgpool = "global_avgpool", Exactly(1), Exactly(1), NO_ATTRS, Inferred, "mean over H and W of x[N,C,H,W], result [N,C,1,1]";
    /// Element type conversion.
    Cast = "cast", Exactly(1), Exactly(1), NO_ATTRS, Declared, "convert elements to the declared dtype";
    /// A literal tensor.
    Constant = "constant", Exactly(0), Exactly(1), CONSTANT_ATTRS, Declared, "a literal tensor of the declared type";
    /// A fusion group: a region executed as one kernel.
    Fused = "fused", AtLeast(0), AtLeast(1), NO_ATTRS, Declared, "a group of ops run as one kernel; its region's arguments bind the operands";
    /// Graph terminator.
    Return = "return", AtLeast(0), Exactly(0), NO_ATTRS, Inferred, "the graph's results";
    /// Fused-region terminator.
    Yield = "yield", AtLeast(0), Exactly(0), NO_ATTRS, Inferred, "the fused region's results";
}

impl OpKind {
    /// The textual name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The op named `name`, if any.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The schema entry of attribute `name`, if the op has one.
    pub fn attr_spec(self, name: &str) -> Option<&'static AttrSpec> {
        self.info().attrs.iter().find(|s| s.name == name)
    }

    /// True for the elementwise binary ops.
    pub fn is_elementwise_binary(self) -> bool {
        use OpKind::*;
        matches!(
            self,
            Add | Sub
                | Mul
                | Div
                | Max
                | Min
                | Pow
                | Mod
                | Equal
                | Less
                | LessEqual
                | Greater
                | GreaterEqual
                | And
                | Or
                | Xor
        )
    }

    /// True for the comparisons (bool results of operands of any one type).
    pub fn is_comparison(self) -> bool {
        use OpKind::*;
        matches!(self, Equal | Less | LessEqual | Greater | GreaterEqual)
    }

    /// True for the logic ops on bools.
    pub fn is_logic(self) -> bool {
        use OpKind::*;
        matches!(self, And | Or | Xor | Not)
    }

    /// True for every op that computes each result element from the
    /// operands' elements at the same index: the binary and unary ones and
    /// `select`.
    pub fn is_elementwise(self) -> bool {
        self.is_elementwise_binary() || self.is_elementwise_unary() || self == OpKind::Select
    }

    /// True for the elementwise unary ops.
    pub fn is_elementwise_unary(self) -> bool {
        use OpKind::*;
        matches!(
            self,
            Relu | Clip
                | Gelu
                | Erf
                | Tanh
                | Sigmoid
                | Exp
                | Log
                | Sqrt
                | Rsqrt
                | Neg
                | Abs
                | Floor
                | Ceil
                | Round
                | Sign
                | Sin
                | Cos
                | IsNan
                | IsInf
                | Not
        )
    }

    /// True when `attrs` are already what [`OpKind::normalize_attrs`] would
    /// return for them (checked without copying them).
    pub fn attrs_are_canonical(self, attrs: &Attrs) -> bool {
        let info = self.info();
        if info.open_attrs {
            let names: Vec<&str> = attrs.iter().map(|(n, _)| n).collect();
            return names.windows(2).all(|w| w[0] < w[1])
                && crate::fused::check_fused_attrs(attrs).is_ok();
        }
        attrs.len() == info.attrs.len()
            && attrs.iter().zip(info.attrs).all(|((name, value), spec)| {
                name == spec.name
                    && match (spec.kind, value) {
                        (AttrKind::Int, Attr::Int(_))
                        | (AttrKind::Float, Attr::Float(_))
                        | (AttrKind::Bool, Attr::Bool(_))
                        | (AttrKind::Str, Attr::Str(_))
                        | (AttrKind::Ints, Attr::Ints(_))
                        | (AttrKind::Floats, Attr::Floats(_)) => true,
                        (AttrKind::Literal, v) => {
                            matches!(
                                v,
                                Attr::Int(_) | Attr::Float(_) | Attr::Ints(_) | Attr::Floats(_)
                            )
                        }
                        _ => false,
                    }
            })
    }

    /// Checks `attrs` against the schema and returns them canonical: values
    /// converted to the schema's kinds, defaults filled in, in schema order
    /// (sorted by name for an open schema).
    pub fn normalize_attrs(self, attrs: Attrs) -> Result<Attrs, AttrError> {
        let info = self.info();
        if info.open_attrs {
            crate::fused::check_fused_attrs(&attrs)?;
            let mut entries: Vec<_> = attrs.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            return Ok(entries.into_iter().collect());
        }
        if let Some((name, _)) = attrs.iter().find(|(n, _)| self.attr_spec(n).is_none()) {
            let known: Vec<&str> = info.attrs.iter().map(|s| s.name).collect();
            let message = if known.is_empty() {
                format!("`{}` takes no attributes, found `{name}`", info.name)
            } else {
                format!(
                    "`{}` has no attribute `{name}` (it has: {})",
                    info.name,
                    known.join(", ")
                )
            };
            return Err(AttrError {
                attr: Some(name.to_string()),
                message,
            });
        }
        let mut attrs = attrs;
        let mut out = Attrs::new();
        for spec in info.attrs {
            let value = match attrs.remove(spec.name) {
                Some(v) => v.coerce(spec.kind).ok_or_else(|| AttrError {
                    attr: Some(spec.name.to_string()),
                    message: format!(
                        "attribute `{}` of `{}` must be {}",
                        spec.name,
                        info.name,
                        spec.kind.describe()
                    ),
                })?,
                None => match spec.default {
                    Some(d) => d.to_attr(),
                    None => {
                        return Err(AttrError {
                            attr: None,
                            message: format!(
                                "`{}` requires attribute `{}` ({}: {})",
                                info.name,
                                spec.name,
                                spec.kind.describe(),
                                spec.doc
                            ),
                        });
                    }
                },
            };
            out.set(spec.name, value);
        }
        Ok(out)
    }
}
