//! safetensors files: tensors by name in, a graph's outputs out.
//!
//! A graph's parameters are bound by name ([`bind_inputs`]); a tensor whose
//! dtype or shape differs from its parameter's, or that names no parameter,
//! is an error. Outputs are written under the names of the returned values
//! ([`output_names`]).

use dcir_ir::{DType, Graph, TensorType};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::InterpError;
use crate::random::{RandomBy, Sampler};
use crate::tensor::{Tensor, TensorData};

fn data_error(message: String) -> InterpError {
    InterpError::Data(message)
}

fn to_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn from_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    }
}

/// Little-endian elements of `N` bytes each, converted by `f`.
fn decode<const N: usize, T>(bytes: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| f(c.try_into().expect("chunks of N bytes")))
        .collect()
}

fn to_tensor(name: &str, view: &TensorView<'_>) -> Result<Tensor, InterpError> {
    let dtype = to_dtype(view.dtype()).ok_or_else(|| {
        data_error(format!(
            "tensor `{name}` has dtype {:?}, which dcir does not have (it has f32, f16, bf16, i32, i64, bool)",
            view.dtype()
        ))
    })?;
    tensor_from_bytes(TensorType::new(dtype, view.shape().to_vec()), view.data())
        .map_err(|e| data_error(format!("tensor `{name}`: {e}")))
}

/// A tensor of type `ty` from its elements in row-major order, each
/// little-endian (bool: one byte, nonzero is true) — the layout of
/// safetensors files and of device buffers.
pub fn tensor_from_bytes(ty: TensorType, b: &[u8]) -> Result<Tensor, InterpError> {
    let data = match ty.dtype {
        DType::F32 => TensorData::F32(decode(b, f32::from_le_bytes)),
        DType::F16 => TensorData::F16(decode(b, f16::from_le_bytes)),
        DType::BF16 => TensorData::BF16(decode(b, bf16::from_le_bytes)),
        DType::I32 => TensorData::I32(decode(b, i32::from_le_bytes)),
        DType::I64 => TensorData::I64(decode(b, i64::from_le_bytes)),
        DType::Bool => TensorData::Bool(decode(b, |[x]: [u8; 1]| x != 0)),
    };
    Tensor::new(ty, data)
}

/// The elements of `t` in the layout [`tensor_from_bytes`] reads.
pub fn tensor_bytes(t: &Tensor) -> Vec<u8> {
    encode(t.data())
}

/// Every tensor of a safetensors file, sorted by name.
pub fn read_safetensors(bytes: &[u8]) -> Result<Vec<(String, Tensor)>, InterpError> {
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| data_error(format!("not a valid safetensors file: {e}")))?;
    let mut out = file
        .iter()
        .map(|(name, view)| Ok((name.to_string(), to_tensor(name, &view)?)))
        .collect::<Result<Vec<_>, InterpError>>()?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn encode(data: &TensorData) -> Vec<u8> {
    match data {
        TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        TensorData::Bool(v) => v.iter().map(|&x| u8::from(x)).collect(),
    }
}

/// A safetensors file holding `tensors` under their names (which must be
/// unique).
pub fn write_safetensors(tensors: &[(String, Tensor)]) -> Result<Vec<u8>, InterpError> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, t)| encode(t.data())).collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, t), b)| {
            TensorView::new(from_dtype(t.dtype()), t.dims().to_vec(), b)
                .map(|v| (name.as_str(), v))
                .map_err(|e| data_error(format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None)
        .map_err(|e| data_error(format!("cannot write safetensors: {e}")))
}

/// A graph's inputs, bound from named tensors and random values.
#[derive(Clone, Debug)]
pub struct Bound {
    /// One tensor per parameter, in parameter order.
    pub inputs: Vec<Tensor>,
    /// The parameters that got random values, in parameter order.
    pub random: Vec<String>,
    /// The tensors converted to their parameter's float dtype on load
    /// (weights of an f32 model bound to its f16 or bf16 form): name, the
    /// file's dtype, the parameter's.
    pub converted: Vec<(String, DType, DType)>,
}

/// Binds `given` tensors to the parameters of the same name; the other
/// parameters get the seeded random values of [`crate::random_inputs`].
/// A float tensor of the parameter's dims in another float dtype is
/// converted to the parameter's, saturating as a precision change does
/// ([`crate::tensor::saturate_to`]), and listed in [`Bound::converted`].
/// A name that is no parameter, given twice, or a tensor whose type
/// otherwise differs from its parameter's is an error.
pub fn bind_inputs(
    graph: &Graph,
    given: Vec<(String, Tensor)>,
    seed: u64,
) -> Result<Bound, InterpError> {
    bind_inputs_by(graph, given, seed, RandomBy::Use)
}

/// [`bind_inputs`], the random values drawn `by` use or by type only.
pub fn bind_inputs_by(
    graph: &Graph,
    given: Vec<(String, Tensor)>,
    seed: u64,
    by: RandomBy,
) -> Result<Bound, InterpError> {
    let params = graph.params();
    let mut slots: Vec<Option<Tensor>> = vec![None; params.len()];
    let mut converted = Vec::new();
    for (name, tensor) in given {
        let Some(index) = params.iter().position(|&p| graph.value(p).name == name) else {
            let names: Vec<String> = params
                .iter()
                .map(|&p| format!("%{}", graph.value(p).name))
                .collect();
            return Err(data_error(format!(
                "tensor `{name}` names no parameter of @{} (its parameters: {})",
                graph.name(),
                names.join(", ")
            )));
        };
        let expected = graph.ty(params[index]);
        let tensor = if tensor.ty() != expected
            && tensor.dims() == expected.dims()
            && tensor.dtype().is_float()
            && expected.dtype.is_float()
        {
            converted.push((name.clone(), tensor.dtype(), expected.dtype));
            Tensor::new(expected.clone(), tensor.data().narrowed(expected.dtype))?
        } else {
            tensor
        };
        if tensor.ty() != expected {
            return Err(data_error(format!(
                "tensor `{name}` is {} but parameter %{name} of @{} is {expected}",
                tensor.ty(),
                graph.name()
            )));
        }
        if slots[index].replace(tensor).is_some() {
            return Err(data_error(format!("tensor `{name}` is given twice")));
        }
    }
    let sampler = Sampler::new(graph, seed, by);
    let mut random = Vec::new();
    let inputs = slots
        .into_iter()
        .enumerate()
        .map(|(i, slot)| {
            slot.unwrap_or_else(|| {
                random.push(graph.value(params[i]).name.clone());
                sampler.sample(i)
            })
        })
        .collect();
    Ok(Bound {
        inputs,
        random,
        converted,
    })
}

/// The names under which a graph's outputs are written: the returned
/// values' names, with `.N` (N the output position) added to a repeat.
pub fn output_names(graph: &Graph) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (i, &v) in graph.outputs().unwrap_or_default().iter().enumerate() {
        let name = &graph.value(v).name;
        names.push(if names.contains(name) {
            format!("{name}.{i}")
        } else {
            name.clone()
        });
    }
    names
}
