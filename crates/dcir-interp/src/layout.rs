//! Data movement: `broadcast`, `reshape`, `transpose`, `slice`, `concat`,
//! `pad`, `gather`. Each computes, for every result element, the index of the
//! operand element it copies, and then takes those elements; so every dtype
//! works the same way and no value is changed.

use dcir_ir::{Attrs, TensorType};

use crate::eval::{KResult, float_attr, ints_attr, usize_attr};
use crate::tensor::{Tensor, TensorData};

/// Row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
}

/// For every position of a row-major array of extents `dims`, in order,
/// `offset + sum(index[d] * strides[d])`.
pub(crate) fn strided_indices(dims: &[usize], strides: &[usize], offset: usize) -> Vec<usize> {
    let total: usize = dims.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut index = vec![0; dims.len()];
    let mut at = offset;
    for _ in 0..total {
        out.push(at);
        // Advance the odometer: bump the last dim, carrying into outer ones.
        for d in (0..dims.len()).rev() {
            index[d] += 1;
            at += strides[d];
            if index[d] < dims[d] {
                break;
            }
            at -= strides[d] * index[d];
            index[d] = 0;
        }
    }
    out
}

fn take(x: &Tensor, indices: &[usize], ty: &TensorType) -> Tensor {
    Tensor::from_parts(ty.clone(), x.data().take(indices))
}

/// Operand dim `i` becomes result dim `dims[i]`; extent-1 dims repeat.
pub(crate) fn broadcast(attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let map = ints_attr(attrs, "dims")?;
    let xs = strides(x.dims());
    let mut s = vec![0; ty.rank()];
    for (i, &d) in map.iter().enumerate() {
        if x.dims()[i] != 1 {
            s[d] = xs[i];
        }
    }
    Ok(take(x, &strided_indices(ty.dims(), &s, 0), ty))
}

/// The same elements under the declared type.
pub(crate) fn reshape(x: &Tensor, ty: &TensorType) -> Tensor {
    Tensor::from_parts(ty.clone(), x.data().clone())
}

/// Result dim `i` is operand dim `perm[i]`.
pub(crate) fn transpose(attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let perm = ints_attr(attrs, "perm")?;
    let xs = strides(x.dims());
    let s: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    Ok(take(x, &strided_indices(ty.dims(), &s, 0), ty))
}

/// Elements `starts..ends` by `steps` in every dim.
pub(crate) fn slice(attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let (starts, steps) = (ints_attr(attrs, "starts")?, ints_attr(attrs, "steps")?);
    let xs = strides(x.dims());
    let offset: usize = starts.iter().zip(&xs).map(|(a, s)| a * s).sum();
    let s: Vec<usize> = (0..x.dims().len())
        .map(|d| xs[d] * steps.get(d).copied().unwrap_or(1))
        .collect();
    Ok(take(x, &strided_indices(ty.dims(), &s, offset), ty))
}

/// The operands joined along `axis`.
pub(crate) fn concat(attrs: &Attrs, parts: &[&Tensor], ty: &TensorType) -> KResult<Tensor> {
    let axis = usize_attr(attrs, "axis")?;
    let outer: usize = ty.dims()[..axis].iter().product();
    let inner: usize = ty.dims()[axis + 1..].iter().product();
    // Index into the operands' elements laid end to end.
    let mut all = parts[0].data().clone();
    let mut starts = vec![0];
    for p in &parts[1..] {
        starts.push(all.len());
        all = all.append(p.data());
    }
    let mut indices = Vec::with_capacity(ty.num_elements().unwrap_or(0));
    for o in 0..outer {
        for (p, &start) in parts.iter().zip(&starts) {
            let slab = p.dims()[axis] * inner;
            indices.extend(start + o * slab..start + (o + 1) * slab);
        }
    }
    Ok(Tensor::from_parts(ty.clone(), all.take(&indices)))
}

/// `low`/`high` elements of `value` (converted to the dtype like a cast)
/// around each dim.
pub(crate) fn pad(attrs: &Attrs, x: &Tensor, ty: &TensorType) -> KResult<Tensor> {
    let low = ints_attr(attrs, "low")?;
    let fill = TensorData::from_f64(x.dtype(), &[float_attr(attrs, "value")?]);
    // The fill value sits at index len, after the operand's elements.
    let all = x.data().append(&fill);
    let (dims, xs) = (x.dims(), strides(x.dims()));
    let out_strides = strides(ty.dims());
    let indices: Vec<usize> = (0..ty.num_elements().unwrap_or(0))
        .map(|pos| {
            let mut src = 0;
            for d in 0..dims.len() {
                let i = (pos / out_strides[d]) % ty.dims()[d];
                match i.checked_sub(low[d]).filter(|&i| i < dims[d]) {
                    Some(i) => src += i * xs[d],
                    None => return x.len(),
                }
            }
            src
        })
        .collect();
    Ok(Tensor::from_parts(ty.clone(), all.take(&indices)))
}

/// `data[.., indices, ..]` along `axis`. Indices in `-extent..0` count from
/// the end (as in ONNX); any other index outside `0..extent` is an error.
pub(crate) fn gather(
    attrs: &Attrs,
    data: &Tensor,
    idx: &Tensor,
    ty: &TensorType,
) -> KResult<Tensor> {
    let axis = usize_attr(attrs, "axis")?;
    let extent = data.dims()[axis];
    let outer: usize = data.dims()[..axis].iter().product();
    let inner: usize = data.dims()[axis + 1..].iter().product();
    let rows: Vec<usize> = idx
        .data()
        .to_i64()
        .iter()
        .enumerate()
        .map(|(pos, &i)| {
            let e = extent as i64;
            let row = if i < 0 { i + e } else { i };
            usize::try_from(row)
                .ok()
                .filter(|&r| r < extent)
                .ok_or_else(|| {
                    format!(
                        "index {i} (element {pos} of the indices) is out of range for axis {axis} of extent {extent}"
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    let mut indices = Vec::with_capacity(outer * rows.len() * inner);
    for o in 0..outer {
        for &r in &rows {
            let start = (o * extent + r) * inner;
            indices.extend(start..start + inner);
        }
    }
    Ok(take(data, &indices, ty))
}
