//! Element types and static tensor types.

use std::fmt;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Boolean, one byte per element.
    Bool,
}

impl DType {
    /// Every dtype, in canonical order.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// The textual name (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Parses a textual name; `None` if it names no dtype.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// True for the integer types (not `bool`).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A static shape: the extent of every dimension, outermost first.
///
/// Every dimension is known at compile time today. The representation is
/// private so that a symbolic dimension can be added later without changing
/// the callers that only ask for static extents.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape from its extents.
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }

    /// The shape of a scalar (rank 0).
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// The extents, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar), or `None` on overflow.
    pub fn num_elements(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The type of a value: a dtype and a static shape, printed `f32[1,3,224,224]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Extents.
    pub shape: Shape,
}

impl TensorType {
    /// A tensor type from a dtype and extents.
    pub fn new(dtype: DType, dims: impl Into<Vec<usize>>) -> TensorType {
        TensorType {
            dtype,
            shape: Shape::new(dims),
        }
    }

    /// The extents, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// Number of elements, or `None` on overflow.
    pub fn num_elements(&self) -> Option<usize> {
        self.shape.num_elements()
    }

    /// Size in bytes, or `None` on overflow.
    pub fn size_bytes(&self) -> Option<usize> {
        self.num_elements()?.checked_mul(self.dtype.size_bytes())
    }

    /// The same shape with another dtype.
    pub fn with_dtype(&self, dtype: DType) -> TensorType {
        TensorType {
            dtype,
            shape: self.shape.clone(),
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}
