//! Tensors known at import time: decoding `TensorProto`s, and the small
//! evaluator that folds ONNX shape arithmetic (Shape, Gather, Concat,
//! ConstantOfShape, Range, Where, ...) to constants.
//!
//! Values are kept wide (`f64` for float dtypes, `i64` for integers and
//! booleans) and tagged with the dcir dtype they stand for.

use std::path::Path;

use dcir_ir::DType;

use crate::proto::TensorProto;

/// ONNX `TensorProto.DataType` codes used here.
pub(crate) mod code {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const UINT16: i32 = 4;
    pub const INT16: i32 = 5;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const BOOL: i32 = 9;
    pub const FLOAT16: i32 = 10;
    pub const DOUBLE: i32 = 11;
    pub const UINT32: i32 = 12;
    pub const UINT64: i32 = 13;
    pub const BFLOAT16: i32 = 16;
}

/// The dcir dtype an ONNX element type becomes: doubles narrow to `f32`,
/// small integers widen to `i32`, unsigned 32/64-bit integers to `i64`.
pub(crate) fn dtype_of(onnx: i32) -> Result<DType, String> {
    use code::*;
    Ok(match onnx {
        FLOAT | DOUBLE => DType::F32,
        FLOAT16 => DType::F16,
        BFLOAT16 => DType::BF16,
        UINT8 | INT8 | UINT16 | INT16 | INT32 => DType::I32,
        INT64 | UINT32 | UINT64 => DType::I64,
        BOOL => DType::Bool,
        other => {
            return Err(format!(
                "element type {} is not supported",
                type_name(other)
            ));
        }
    })
}

/// The ONNX name of an element type code, for messages.
pub(crate) fn type_name(code: i32) -> String {
    let name = match code {
        0 => "UNDEFINED",
        1 => "FLOAT",
        2 => "UINT8",
        3 => "INT8",
        4 => "UINT16",
        5 => "INT16",
        6 => "INT32",
        7 => "INT64",
        8 => "STRING",
        9 => "BOOL",
        10 => "FLOAT16",
        11 => "DOUBLE",
        12 => "UINT32",
        13 => "UINT64",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        16 => "BFLOAT16",
        17 => "FLOAT8E4M3FN",
        18 => "FLOAT8E4M3FNUZ",
        19 => "FLOAT8E5M2",
        20 => "FLOAT8E5M2FNUZ",
        21 => "UINT4",
        22 => "INT4",
        23 => "FLOAT4E2M1",
        24 => "FLOAT8E8M0",
        25 => "UINT2",
        26 => "INT2",
        27 => "FLOAT6E2M3",
        28 => "FLOAT6E3M2",
        _ => return format!("#{code}"),
    };
    name.to_string()
}

/// Element values of a constant.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    /// Float dtypes.
    F(Vec<f64>),
    /// Integer dtypes and `bool` (0 or 1).
    I(Vec<i64>),
}

impl Data {
    pub(crate) fn len(&self) -> usize {
        match self {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
        }
    }

    fn f64_at(&self, i: usize) -> f64 {
        match self {
            Data::F(v) => v[i],
            Data::I(v) => v[i] as f64,
        }
    }

    fn i64_at(&self, i: usize) -> i64 {
        match self {
            Data::F(v) => v[i] as i64,
            Data::I(v) => v[i],
        }
    }

    /// The elements at `idx`, in order.
    fn pick(&self, idx: &[usize]) -> Data {
        match self {
            Data::F(v) => Data::F(idx.iter().map(|&i| v[i]).collect()),
            Data::I(v) => Data::I(idx.iter().map(|&i| v[i]).collect()),
        }
    }
}

/// A tensor whose value is known at import time.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Const {
    pub dtype: DType,
    pub dims: Vec<usize>,
    pub data: Data,
}

/// Largest constant the evaluator builds (elements); larger folds are refused.
const MAX_CONST: usize = 1 << 26;

pub(crate) fn count(dims: &[usize]) -> Result<usize, String> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_CONST)
        .ok_or_else(|| format!("a constant of shape {dims:?} is too large to fold"))
}

impl Const {
    /// A constant from values, checking the count.
    pub(crate) fn new(dtype: DType, dims: Vec<usize>, data: Data) -> Result<Const, String> {
        let n = count(&dims)?;
        if data.len() != n {
            return Err(format!(
                "a tensor of shape {dims:?} needs {n} values, found {}",
                data.len()
            ));
        }
        let data = match (dtype.is_float(), data) {
            (true, Data::I(v)) => Data::F(v.into_iter().map(|x| x as f64).collect()),
            (false, Data::F(v)) => Data::I(v.into_iter().map(|x| x as i64).collect()),
            (_, d) => d,
        };
        Ok(Const { dtype, dims, data })
    }

    /// A rank-1 `i64` constant.
    pub(crate) fn ints(v: Vec<i64>) -> Const {
        Const {
            dtype: DType::I64,
            dims: vec![v.len()],
            data: Data::I(v),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.data.len()
    }

    /// Every value as `i64` (floats truncated).
    pub(crate) fn to_i64(&self) -> Vec<i64> {
        (0..self.len()).map(|i| self.data.i64_at(i)).collect()
    }

    /// Every value as `f64`.
    pub(crate) fn to_f64(&self) -> Vec<f64> {
        (0..self.len()).map(|i| self.data.f64_at(i)).collect()
    }

    /// The single value, when there is exactly one.
    pub(crate) fn scalar_f64(&self) -> Option<f64> {
        (self.len() == 1).then(|| self.data.f64_at(0))
    }

    /// The value every element has, if they all have one (and there is one).
    pub(crate) fn splat(&self) -> Option<f64> {
        let first = (self.len() > 0).then(|| self.data.f64_at(0))?;
        (1..self.len())
            .all(|i| self.data.f64_at(i).to_bits() == first.to_bits())
            .then_some(first)
    }

    /// Converts to `dtype` (floats truncate toward zero into integers; any
    /// non-zero becomes `true`).
    pub(crate) fn cast(&self, dtype: DType) -> Const {
        let data = if dtype.is_float() {
            Data::F(self.to_f64())
        } else if dtype == DType::Bool {
            Data::I(self.to_f64().iter().map(|&x| i64::from(x != 0.0)).collect())
        } else {
            Data::I(self.to_i64())
        };
        Const {
            dtype,
            dims: self.dims.clone(),
            data,
        }
    }

    /// The same values in another shape of equal element count.
    pub(crate) fn reshaped(&self, dims: Vec<usize>) -> Result<Const, String> {
        Const::new(self.dtype, dims, self.data.clone())
    }
}

/// Row-major strides of `dims`.
pub(crate) fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Numpy broadcasting of two shapes.
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for (i, o) in out.iter_mut().enumerate() {
        let da = (i + a.len()).checked_sub(r).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(r).map_or(1, |j| b[j]);
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(format!("shapes {a:?} and {b:?} do not broadcast"));
        };
    }
    Ok(out)
}

/// For each element of a tensor of shape `out`, the flat index of the element
/// of `x` (shape `dims`, numpy-broadcast to `out`) it reads.
fn broadcast_index(dims: &[usize], out: &[usize]) -> Result<Vec<usize>, String> {
    let n = count(out)?;
    let off = out.len() - dims.len();
    let xs = strides(dims);
    let os = strides(out);
    let mut idx = Vec::with_capacity(n);
    for flat in 0..n {
        let mut src = 0;
        for (j, &d) in dims.iter().enumerate() {
            let coord = (flat / os[j + off]) % out[j + off];
            if d != 1 {
                src += coord * xs[j];
            }
        }
        idx.push(src);
    }
    Ok(idx)
}

/// `x` broadcast (numpy rules) to `out`.
pub(crate) fn expand(x: &Const, out: &[usize]) -> Result<Const, String> {
    let full = broadcast_shapes(&x.dims, out)?;
    if full != out {
        return Err(format!("cannot expand {:?} to {out:?}", x.dims));
    }
    let idx = broadcast_index(&x.dims, out)?;
    Ok(Const {
        dtype: x.dtype,
        dims: out.to_vec(),
        data: x.data.pick(&idx),
    })
}

/// An elementwise binary op of the constant evaluator.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
    /// ONNX `Mod`: with `fmod` the remainder has the dividend's sign (C
    /// `fmod`, truncating division), without it the divisor's (Python `%`,
    /// integers only).
    Mod {
        fmod: bool,
    },
    Equal,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
    And,
    Or,
    Xor,
}

impl Bin {
    fn is_comparison(self) -> bool {
        use Bin::*;
        matches!(
            self,
            Equal | Less | LessOrEqual | Greater | GreaterOrEqual | And | Or | Xor
        )
    }
}

/// The refusal of a float `Mod` without `fmod`, which ONNX leaves undefined.
pub(crate) const FLOAT_MOD_NEEDS_FMOD: &str =
    "Mod of floating-point values needs fmod = 1 (ONNX defines fmod = 0 for integers only)";

/// Evaluates `a op b` with numpy broadcasting.
pub(crate) fn binary(op: Bin, a: &Const, b: &Const) -> Result<Const, String> {
    if matches!(op, Bin::Mod { fmod: false }) && (a.dtype.is_float() || b.dtype.is_float()) {
        return Err(FLOAT_MOD_NEEDS_FMOD.to_string());
    }
    let out = broadcast_shapes(&a.dims, &b.dims)?;
    let ia = broadcast_index(&a.dims, &out)?;
    let ib = broadcast_index(&b.dims, &out)?;
    let float = a.dtype.is_float() || (matches!(op, Bin::Pow) && b.dtype.is_float());
    let dtype = if op.is_comparison() {
        DType::Bool
    } else {
        a.dtype
    };
    let data = if float || (op.is_comparison() && (a.dtype.is_float() || b.dtype.is_float())) {
        let mut v = Vec::with_capacity(ia.len());
        for (&i, &j) in ia.iter().zip(&ib) {
            let (x, y) = (a.data.f64_at(i), b.data.f64_at(j));
            v.push(match op {
                Bin::Add => x + y,
                Bin::Sub => x - y,
                Bin::Mul => x * y,
                Bin::Div => x / y,
                Bin::Pow => x.powf(y),
                Bin::Max => x.max(y),
                Bin::Min => x.min(y),
                // Rust's `%` on floats is C's `fmod`: the dividend's sign.
                Bin::Mod { .. } => x % y,
                Bin::Equal => f64::from(u8::from(x == y)),
                Bin::Less => f64::from(u8::from(x < y)),
                Bin::LessOrEqual => f64::from(u8::from(x <= y)),
                Bin::Greater => f64::from(u8::from(x > y)),
                Bin::GreaterOrEqual => f64::from(u8::from(x >= y)),
                Bin::And => f64::from(u8::from(x != 0.0 && y != 0.0)),
                Bin::Or => f64::from(u8::from(x != 0.0 || y != 0.0)),
                Bin::Xor => f64::from(u8::from((x != 0.0) != (y != 0.0))),
            });
        }
        Data::F(v)
    } else {
        let mut v = Vec::with_capacity(ia.len());
        for (&i, &j) in ia.iter().zip(&ib) {
            let (x, y) = (a.data.i64_at(i), b.data.i64_at(j));
            v.push(match op {
                Bin::Add => x.wrapping_add(y),
                Bin::Sub => x.wrapping_sub(y),
                Bin::Mul => x.wrapping_mul(y),
                Bin::Div => x
                    .checked_div(y)
                    .ok_or("integer division by zero in a constant")?,
                Bin::Mod { fmod } => {
                    if y == 0 {
                        return Err("integer modulo by zero in a constant".to_string());
                    }
                    // Truncating remainder: the dividend's sign (`i64::MIN % -1` is 0).
                    let r = x.wrapping_rem(y);
                    if !fmod && r != 0 && (r < 0) != (y < 0) {
                        // Python's `%`: the divisor's sign.
                        r + y
                    } else {
                        r
                    }
                }
                Bin::Pow => u32::try_from(y).map_or(0, |e| x.wrapping_pow(e)),
                Bin::Max => x.max(y),
                Bin::Min => x.min(y),
                Bin::Equal => i64::from(x == y),
                Bin::Less => i64::from(x < y),
                Bin::LessOrEqual => i64::from(x <= y),
                Bin::Greater => i64::from(x > y),
                Bin::GreaterOrEqual => i64::from(x >= y),
                Bin::And => i64::from(x != 0 && y != 0),
                Bin::Or => i64::from(x != 0 || y != 0),
                Bin::Xor => i64::from((x != 0) != (y != 0)),
            });
        }
        Data::I(v)
    };
    Const::new(dtype, out, data)
}

/// Applies `f` to every element (in `f64`) and keeps the dtype.
pub(crate) fn unary(x: &Const, f: impl Fn(f64) -> f64) -> Const {
    let data = match &x.data {
        Data::F(v) => Data::F(v.iter().map(|&a| f(a)).collect()),
        Data::I(v) => Data::I(v.iter().map(|&a| f(a as f64) as i64).collect()),
    };
    Const {
        dtype: x.dtype,
        dims: x.dims.clone(),
        data,
    }
}

/// `Where(cond, a, b)` with broadcasting.
pub(crate) fn select(cond: &Const, a: &Const, b: &Const) -> Result<Const, String> {
    let out = broadcast_shapes(&broadcast_shapes(&cond.dims, &a.dims)?, &b.dims)?;
    let ic = broadcast_index(&cond.dims, &out)?;
    let ia = broadcast_index(&a.dims, &out)?;
    let ib = broadcast_index(&b.dims, &out)?;
    let data = match (&a.data, &b.cast(a.dtype).data) {
        (Data::F(x), Data::F(y)) => Data::F(
            (0..ic.len())
                .map(|k| {
                    if cond.data.f64_at(ic[k]) != 0.0 {
                        x[ia[k]]
                    } else {
                        y[ib[k]]
                    }
                })
                .collect(),
        ),
        (Data::I(x), Data::I(y)) => Data::I(
            (0..ic.len())
                .map(|k| {
                    if cond.data.f64_at(ic[k]) != 0.0 {
                        x[ia[k]]
                    } else {
                        y[ib[k]]
                    }
                })
                .collect(),
        ),
        _ => return Err("Where branches of different kinds".to_string()),
    };
    Const::new(a.dtype, out, data)
}

/// `Gather(data, indices, axis)`; negative indices count from the end.
pub(crate) fn gather(x: &Const, indices: &Const, axis: usize) -> Result<Const, String> {
    let extent = x.dims[axis];
    let idx = indices
        .to_i64()
        .into_iter()
        .map(|i| norm_index(i, extent))
        .collect::<Result<Vec<_>, _>>()?;
    let outer: usize = x.dims[..axis].iter().product();
    let inner: usize = x.dims[axis + 1..].iter().product();
    let mut dims = x.dims[..axis].to_vec();
    dims.extend_from_slice(&indices.dims);
    dims.extend_from_slice(&x.dims[axis + 1..]);
    count(&dims)?;
    let mut pick = Vec::new();
    for o in 0..outer {
        for &i in &idx {
            for n in 0..inner {
                pick.push((o * extent + i) * inner + n);
            }
        }
    }
    Ok(Const {
        dtype: x.dtype,
        dims,
        data: x.data.pick(&pick),
    })
}

/// `GatherElements(data, indices, axis)`.
pub(crate) fn gather_elements(x: &Const, indices: &Const, axis: usize) -> Result<Const, String> {
    if indices.dims.len() != x.dims.len() {
        return Err("GatherElements needs data and indices of one rank".to_string());
    }
    let xs = strides(&x.dims);
    let is = strides(&indices.dims);
    let idx = indices.to_i64();
    let mut pick = Vec::with_capacity(idx.len());
    for (flat, &i) in idx.iter().enumerate() {
        let mut src = 0;
        for d in 0..x.dims.len() {
            let coord = if d == axis {
                norm_index(i, x.dims[d])?
            } else {
                let c = (flat / is[d]) % indices.dims[d];
                if c >= x.dims[d] {
                    return Err("GatherElements indices exceed the data's shape".to_string());
                }
                c
            };
            src += coord * xs[d];
        }
        pick.push(src);
    }
    Ok(Const {
        dtype: x.dtype,
        dims: indices.dims.clone(),
        data: x.data.pick(&pick),
    })
}

fn norm_index(i: i64, extent: usize) -> Result<usize, String> {
    let e = extent as i64;
    let j = if i < 0 { i + e } else { i };
    if (0..e).contains(&j) {
        Ok(j as usize)
    } else {
        Err(format!("index {i} is out of range for extent {extent}"))
    }
}

/// `Concat` along `axis`.
pub(crate) fn concat(parts: &[&Const], axis: usize) -> Result<Const, String> {
    let first = parts[0];
    let mut dims = first.dims.clone();
    dims[axis] = 0;
    for p in parts {
        if p.dims.len() != first.dims.len()
            || (0..dims.len()).any(|d| d != axis && p.dims[d] != first.dims[d])
        {
            return Err(format!(
                "Concat along axis {axis} of shapes {:?} and {:?}",
                first.dims, p.dims
            ));
        }
        dims[axis] += p.dims[axis];
    }
    let outer: usize = dims[..axis].iter().product();
    let float = first.dtype.is_float();
    let mut fv = Vec::new();
    let mut iv = Vec::new();
    for o in 0..outer {
        for p in parts {
            let chunk: usize = p.dims[axis..].iter().product();
            let p = p.cast(first.dtype);
            match &p.data {
                Data::F(v) if float => fv.extend_from_slice(&v[o * chunk..(o + 1) * chunk]),
                Data::I(v) => iv.extend_from_slice(&v[o * chunk..(o + 1) * chunk]),
                Data::F(_) => unreachable_kind()?,
            }
        }
    }
    let data = if float { Data::F(fv) } else { Data::I(iv) };
    Const::new(first.dtype, dims, data)
}

fn unreachable_kind() -> Result<(), String> {
    Err("internal: constant of mixed kinds".to_string())
}

/// `Transpose` by `perm` (already checked to be a permutation).
pub(crate) fn transpose(x: &Const, perm: &[usize]) -> Result<Const, String> {
    let dims: Vec<usize> = perm.iter().map(|&p| x.dims[p]).collect();
    let n = count(&dims)?;
    let xs = strides(&x.dims);
    let os = strides(&dims);
    let pick: Vec<usize> = (0..n)
        .map(|flat| {
            (0..dims.len())
                .map(|d| ((flat / os[d]) % dims[d]) * xs[perm[d]])
                .sum()
        })
        .collect();
    Ok(Const {
        dtype: x.dtype,
        dims,
        data: x.data.pick(&pick),
    })
}

/// A slice: per dim, a start and a (possibly negative) step, and the count.
pub(crate) fn slice(x: &Const, ranges: &[(i64, i64, usize)]) -> Result<Const, String> {
    let dims: Vec<usize> = ranges.iter().map(|r| r.2).collect();
    let n = count(&dims)?;
    let xs = strides(&x.dims);
    let os = strides(&dims);
    let pick: Vec<usize> = (0..n)
        .map(|flat| {
            (0..dims.len())
                .map(|d| {
                    let k = ((flat / os[d]) % dims[d]) as i64;
                    (ranges[d].0 + k * ranges[d].1) as usize * xs[d]
                })
                .sum()
        })
        .collect();
    Ok(Const {
        dtype: x.dtype,
        dims,
        data: x.data.pick(&pick),
    })
}

/// Reads a little-endian buffer of ONNX element type `ty` into values.
fn from_le(ty: i32, bytes: &[u8]) -> Result<Data, String> {
    use code::*;
    fn chunks<const N: usize>(b: &[u8]) -> Result<impl Iterator<Item = [u8; N]> + '_, String> {
        if !b.len().is_multiple_of(N) {
            return Err(format!(
                "raw data of {} bytes is not a whole number of {N}-byte elements",
                b.len()
            ));
        }
        Ok(b.chunks_exact(N).map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            a
        }))
    }
    Ok(match ty {
        FLOAT => Data::F(
            chunks::<4>(bytes)?
                .map(|c| f32::from_le_bytes(c) as f64)
                .collect(),
        ),
        DOUBLE => Data::F(chunks::<8>(bytes)?.map(f64::from_le_bytes).collect()),
        FLOAT16 => Data::F(
            chunks::<2>(bytes)?
                .map(|c| half::f16::from_le_bytes(c).to_f64())
                .collect(),
        ),
        BFLOAT16 => Data::F(
            chunks::<2>(bytes)?
                .map(|c| half::bf16::from_le_bytes(c).to_f64())
                .collect(),
        ),
        INT64 => Data::I(chunks::<8>(bytes)?.map(i64::from_le_bytes).collect()),
        UINT64 => Data::I(
            chunks::<8>(bytes)?
                .map(|c| u64::from_le_bytes(c) as i64)
                .collect(),
        ),
        INT32 => Data::I(
            chunks::<4>(bytes)?
                .map(|c| i64::from(i32::from_le_bytes(c)))
                .collect(),
        ),
        UINT32 => Data::I(
            chunks::<4>(bytes)?
                .map(|c| i64::from(u32::from_le_bytes(c)))
                .collect(),
        ),
        INT16 => Data::I(
            chunks::<2>(bytes)?
                .map(|c| i64::from(i16::from_le_bytes(c)))
                .collect(),
        ),
        UINT16 => Data::I(
            chunks::<2>(bytes)?
                .map(|c| i64::from(u16::from_le_bytes(c)))
                .collect(),
        ),
        INT8 => Data::I(bytes.iter().map(|&b| i64::from(b as i8)).collect()),
        UINT8 => Data::I(bytes.iter().map(|&b| i64::from(b)).collect()),
        BOOL => Data::I(bytes.iter().map(|&b| i64::from(b != 0)).collect()),
        other => {
            return Err(format!(
                "element type {} is not supported",
                type_name(other)
            ));
        }
    })
}

/// Where a tensor's data lives.
pub(crate) enum Payload<'a> {
    /// No data at all (a stripped initializer).
    Missing,
    /// Little-endian bytes of the ONNX element type.
    Raw(std::borrow::Cow<'a, [u8]>),
    /// Values from the typed fields.
    Values(Data),
}

/// Checked element count of an ONNX dims list.
pub(crate) fn dims_of(t: &TensorProto) -> Result<Vec<usize>, String> {
    let dims = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dim {d}")))
        .collect::<Result<Vec<_>, _>>()?;
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(8))
        .ok_or_else(|| format!("shape {dims:?} is too large"))?;
    Ok(dims)
}

/// The data of `t`: raw bytes, typed values, external data (read relative to
/// `base`), or nothing.
pub(crate) fn payload<'a>(t: &'a TensorProto, base: Option<&Path>) -> Result<Payload<'a>, String> {
    use code::*;
    if t.data_location == Some(1) {
        return external(t, base).map(|b| Payload::Raw(b.into()));
    }
    if let Some(raw) = &t.raw_data
        && !raw.is_empty()
    {
        return Ok(Payload::Raw(raw.as_slice().into()));
    }
    let ty = t.data_type.unwrap_or(0);
    let data = match ty {
        FLOAT if !t.float_data.is_empty() => {
            Data::F(t.float_data.iter().map(|&x| x as f64).collect())
        }
        DOUBLE if !t.double_data.is_empty() => Data::F(t.double_data.clone()),
        FLOAT16 | BFLOAT16 if !t.int32_data.is_empty() => {
            let bits = t.int32_data.iter().map(|&x| x as u16);
            Data::F(if ty == FLOAT16 {
                bits.map(|b| half::f16::from_bits(b).to_f64()).collect()
            } else {
                bits.map(|b| half::bf16::from_bits(b).to_f64()).collect()
            })
        }
        INT32 | INT16 | INT8 | UINT16 | UINT8 if !t.int32_data.is_empty() => {
            Data::I(t.int32_data.iter().map(|&x| i64::from(x)).collect())
        }
        BOOL if !t.int32_data.is_empty() => {
            Data::I(t.int32_data.iter().map(|&x| i64::from(x != 0)).collect())
        }
        INT64 if !t.int64_data.is_empty() => Data::I(t.int64_data.clone()),
        UINT32 | UINT64 if !t.uint64_data.is_empty() => {
            Data::I(t.uint64_data.iter().map(|&x| x as i64).collect())
        }
        _ => return Ok(Payload::Missing),
    };
    Ok(Payload::Values(data))
}

fn external(t: &TensorProto, base: Option<&Path>) -> Result<Vec<u8>, String> {
    let mut location = None;
    let (mut offset, mut length) = (0u64, None);
    for kv in &t.external_data {
        let value = kv.value.as_deref().unwrap_or("");
        match kv.key.as_deref().unwrap_or("") {
            "location" => location = Some(value.to_string()),
            "offset" => offset = value.parse().map_err(|_| format!("bad offset `{value}`"))?,
            "length" => {
                length = Some(
                    value
                        .parse::<u64>()
                        .map_err(|_| format!("bad length `{value}`"))?,
                )
            }
            _ => {}
        }
    }
    let location = location.ok_or("external data without a `location`")?;
    let rel = Path::new(&location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(format!(
            "external data location `{location}` must be a relative path inside the model's folder"
        ));
    }
    let base = base.ok_or_else(|| {
        format!("the tensor's data is in the external file `{location}`, but the model was not read from a file")
    })?;
    let path = base.join(rel);
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&path)
        .map_err(|e| format!("cannot open external data file {}: {e}", path.display()))?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let len = match length {
        Some(l) => l,
        None => size.saturating_sub(offset),
    };
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(format!(
            "external data file {} has {size} bytes; the tensor needs {len} at offset {offset}",
            path.display()
        ));
    }
    f.seek(SeekFrom::Start(offset))
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut buf = vec![0u8; len as usize];
    f.read_exact(&mut buf)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(buf)
}

/// Decodes a tensor with its values (Constant attributes, integer
/// initializers); `None` when it carries no data.
pub(crate) fn decode(t: &TensorProto, base: Option<&Path>) -> Result<Option<Const>, String> {
    let ty = t.data_type.unwrap_or(0);
    let dtype = dtype_of(ty)?;
    let dims = dims_of(t)?;
    let data = match payload(t, base)? {
        Payload::Missing => {
            if count(&dims)? == 0 {
                Data::I(Vec::new())
            } else {
                return Ok(None);
            }
        }
        Payload::Raw(b) => from_le(ty, &b)?,
        Payload::Values(d) => d,
    };
    Const::new(dtype, dims, data).map(Some)
}

/// The little-endian bytes of `t`'s data as dcir dtype `dtype` (the weight
/// file's encoding); `None` when it carries no data.
pub(crate) fn weight_bytes(
    t: &TensorProto,
    dtype: DType,
    numel: usize,
    base: Option<&Path>,
) -> Result<Option<Vec<u8>>, String> {
    let ty = t.data_type.unwrap_or(0);
    let same_layout = matches!(
        (ty, dtype),
        (code::FLOAT, DType::F32)
            | (code::FLOAT16, DType::F16)
            | (code::BFLOAT16, DType::BF16)
            | (code::INT32, DType::I32)
            | (code::INT64, DType::I64)
            | (code::BOOL, DType::Bool)
    );
    let data = match payload(t, base)? {
        Payload::Missing if numel > 0 => return Ok(None),
        Payload::Missing => Data::I(Vec::new()),
        Payload::Raw(b) if same_layout => {
            if b.len() != numel * dtype.size_bytes() {
                return Err(format!(
                    "holds {} bytes of data, but its shape needs {}",
                    b.len(),
                    numel * dtype.size_bytes()
                ));
            }
            return Ok(Some(b.into_owned()));
        }
        Payload::Raw(b) => from_le(ty, &b)?,
        Payload::Values(d) => d,
    };
    if data.len() != numel {
        return Err(format!(
            "holds {} values, but its shape needs {numel}",
            data.len()
        ));
    }
    Ok(Some(encode(dtype, &data)))
}

/// Little-endian bytes of `data` as `dtype`.
pub(crate) fn encode(dtype: DType, data: &Data) -> Vec<u8> {
    let n = data.len();
    let mut out = Vec::with_capacity(n * dtype.size_bytes());
    for i in 0..n {
        match dtype {
            DType::F32 => out.extend_from_slice(&(data.f64_at(i) as f32).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(data.f64_at(i)).to_le_bytes()),
            DType::BF16 => {
                out.extend_from_slice(&half::bf16::from_f64(data.f64_at(i)).to_le_bytes())
            }
            DType::I32 => out.extend_from_slice(&(data.i64_at(i) as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&data.i64_at(i).to_le_bytes()),
            DType::Bool => out.push(u8::from(data.i64_at(i) != 0)),
        }
    }
    out
}

/// Constant padding: `low[d]`/`high[d]` elements of `value` before/after dim `d`.
pub(crate) fn pad(x: &Const, low: &[usize], high: &[usize], value: f64) -> Result<Const, String> {
    let dims: Vec<usize> = (0..x.dims.len())
        .map(|d| x.dims[d] + low[d] + high[d])
        .collect();
    let n = count(&dims)?;
    let xs = strides(&x.dims);
    let os = strides(&dims);
    let mut fv = Vec::new();
    let mut iv = Vec::new();
    let float = x.dtype.is_float();
    for flat in 0..n {
        let mut src = Some(0usize);
        for d in 0..dims.len() {
            let c = (flat / os[d]) % dims[d];
            match c.checked_sub(low[d]).filter(|&c| c < x.dims[d]) {
                Some(c) => src = src.map(|s| s + c * xs[d]),
                None => src = None,
            }
        }
        match src {
            Some(s) if float => fv.push(x.data.f64_at(s)),
            Some(s) => iv.push(x.data.i64_at(s)),
            None if float => fv.push(value),
            None => iv.push(value as i64),
        }
    }
    let data = if float { Data::F(fv) } else { Data::I(iv) };
    Const::new(x.dtype, dims, data)
}

/// `ScatterND(data, indices, updates)` with `reduction = none`: a copy of
/// `data` whose slices at `indices[.., :]` are replaced by `updates`.
pub(crate) fn scatter_nd(x: &Const, indices: &Const, updates: &Const) -> Result<Const, String> {
    let r = x.dims.len();
    let q = indices.dims.len();
    let k = *indices
        .dims
        .last()
        .ok_or("ScatterND needs indices of rank >= 1")?;
    if k > r {
        return Err(format!(
            "ScatterND indices address {k} dims of a rank-{r} tensor"
        ));
    }
    let mut want: Vec<usize> = indices.dims[..q - 1].to_vec();
    want.extend_from_slice(&x.dims[k..]);
    if updates.dims != want {
        return Err(format!(
            "ScatterND updates have shape {:?}, expected {want:?}",
            updates.dims
        ));
    }
    let xs = strides(&x.dims);
    let chunk: usize = x.dims[k..].iter().product();
    let idx = indices.to_i64();
    let upd = updates.cast(x.dtype);
    let mut out = x.clone();
    let rows: usize = indices.dims[..q - 1].iter().product();
    for row in 0..rows {
        let tuple = &idx[row * k..(row + 1) * k];
        let mut base = 0;
        for d in 0..k {
            base += norm_index(tuple[d], x.dims[d])? * xs[d];
        }
        for e in 0..chunk {
            match (&mut out.data, &upd.data) {
                (Data::F(o), Data::F(u)) => o[base + e] = u[row * chunk + e],
                (Data::I(o), Data::I(u)) => o[base + e] = u[row * chunk + e],
                _ => unreachable_kind()?,
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(v: &[i64]) -> Const {
        Const::ints(v.to_vec())
    }

    #[test]
    fn integer_mod_follows_fmod() {
        let x = ints(&[-4, 7, 5, 4, -7, 8]);
        let y = ints(&[2, -3, 8, -2, 3, 5]);
        // fmod = 0: the divisor's sign (Python `%`).
        let r = binary(Bin::Mod { fmod: false }, &x, &y).unwrap();
        assert_eq!(r.to_i64(), [0, -2, 5, 0, 2, 3]);
        // fmod = 1: the dividend's sign (C `fmod`).
        let r = binary(Bin::Mod { fmod: true }, &x, &y).unwrap();
        assert_eq!(r.to_i64(), [0, 1, 5, 0, -1, 3]);
        assert_eq!(r.dtype, DType::I64);
        // No overflow at the edge of the range; a zero divisor is an error.
        let r = binary(Bin::Mod { fmod: false }, &ints(&[i64::MIN]), &ints(&[-1])).unwrap();
        assert_eq!(r.to_i64(), [0]);
        let e = binary(Bin::Mod { fmod: true }, &ints(&[3]), &ints(&[0])).unwrap_err();
        assert!(e.contains("by zero"), "{e}");
    }

    #[test]
    fn float_mod_needs_fmod() {
        let f = |v: &[f64]| Const {
            dtype: DType::F32,
            dims: vec![v.len()],
            data: Data::F(v.to_vec()),
        };
        let (x, y) = (f(&[-4.5, 7.5, 5.0]), f(&[2.0, -3.0, 8.0]));
        let r = binary(Bin::Mod { fmod: true }, &x, &y).unwrap();
        assert_eq!(r.to_f64(), [-0.5, 1.5, 5.0]);
        let e = binary(Bin::Mod { fmod: false }, &x, &y).unwrap_err();
        assert!(e.contains("fmod = 1"), "{e}");
    }
}
