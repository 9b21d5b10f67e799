//! ONNX import: an ONNX model (as PyTorch exports it) becomes a verified
//! dcir [`Module`] plus its weights.
//!
//! The protobuf types in [`proto`] are generated at build time from the
//! official `onnx.proto` (prost + protox, no `protoc`). [`import_file`] and
//! [`import_bytes`] decode a model and translate it node by node:
//!
//! - graph inputs, then the initializers in file order, become the graph's
//!   parameters (names sanitized to `[A-Za-z0-9_.]`); integer initializers
//!   and one-element float initializers are constants instead;
//! - shape arithmetic (Shape, Gather of shapes, Concat, ConstantOfShape,
//!   Range, Equal/Where/Expand on constants, ...) is evaluated at import and
//!   only materialized as a `constant` op where a real op consumes it;
//! - numpy broadcasting becomes explicit `reshape` + `broadcast` ops, and
//!   negative axes are normalized;
//! - an initializer without data (a stripped model) gets seeded random
//!   values ([`Weight::seeded`]).
//!
//! Any input bytes give a value or an [`ImportError`], never a panic. The
//! mapping of every ONNX op is documented in `docs/onnx.md`.

use std::fmt;
use std::path::{Path, PathBuf};

use dcir_ir::{DType, Module, TensorType};
use prost::Message;

mod import;
mod random;
mod tensor;

pub use import::{SUPPORTED_OPS, sanitize};

/// The ONNX protobuf messages, generated from `proto/onnx.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

/// The seed of [`ImportOptions::default`].
pub const DEFAULT_SEED: u64 = 0x5eed;

/// How to import.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    /// Values of dynamic dims: a `dim_param` name, or `INPUT:INDEX` for an
    /// unnamed dim, to its extent.
    pub dims: Vec<(String, usize)>,
    /// The graph's name; by default the ONNX graph's (sanitized) or `main`.
    pub graph_name: Option<String>,
    /// Seed of the random values given to initializers without data.
    pub seed: u64,
    /// Graph inputs whose values are known at import: each becomes a known
    /// constant, as an integer initializer does, instead of a parameter (a
    /// static-shape compiler needs the axes, sizes and repeats an input
    /// may carry).
    pub known_inputs: Vec<(String, proto::TensorProto)>,
}

impl Default for ImportOptions {
    fn default() -> ImportOptions {
        ImportOptions {
            dims: Vec::new(),
            graph_name: None,
            seed: DEFAULT_SEED,
            known_inputs: Vec::new(),
        }
    }
}

/// One parameter's value, as the weight file stores it.
#[derive(Clone, Debug, PartialEq)]
pub struct Weight {
    /// The parameter's name in the dcir graph (without `%`).
    pub name: String,
    /// Its type.
    pub ty: TensorType,
    /// Little-endian element bytes of `ty.dtype`.
    pub bytes: Vec<u8>,
    /// True when the model had no data for it and the values are seeded random.
    pub seeded: bool,
}

/// A translated model.
#[derive(Clone, Debug)]
pub struct Imported {
    /// One verified graph.
    pub module: Module,
    /// Values of the parameters that come from initializers, in parameter
    /// order (graph inputs have none).
    pub weights: Vec<Weight>,
}

/// A node of the ONNX graph, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRef {
    /// The op type, prefixed by its domain when that is not the default one.
    pub op_type: String,
    /// The node's name (may be empty).
    pub name: String,
    /// Position in the graph's node list, from 0.
    pub index: usize,
    /// Number of nodes in the graph.
    pub total: usize,
}

impl fmt::Display for NodeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.name.is_empty() {
            "<unnamed>"
        } else {
            &self.name
        };
        write!(
            f,
            "`{}` (node `{name}`, #{} of {})",
            self.op_type, self.index, self.total
        )
    }
}

/// Why a model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// The bytes are not an ONNX model (malformed or truncated protobuf).
    #[error("not a valid ONNX model (malformed or truncated protobuf): {0}")]
    Decode(String),
    /// Ops the importer does not support: every such node of the model.
    #[error("{}", unsupported_message(.0))]
    Unsupported(Vec<NodeRef>),
    /// Dynamic dims with no value given: (input, dim index, `dim_param`).
    #[error("{}", dynamic_message(.0))]
    DynamicDims(Vec<(String, usize, Option<String>)>),
    /// `--dim` keys that name no dynamic dim of the model.
    #[error("{}", unmatched_message(.unmatched, .inputs))]
    UnmatchedDims {
        /// The keys no input dim took.
        unmatched: Vec<String>,
        /// Each graph input's dims: values, `dim_param` names, `INPUT:INDEX?` for unnamed dynamic dims.
        inputs: Vec<String>,
    },
    /// A node could not be translated.
    #[error("cannot import {node}: {message}")]
    Node {
        /// The node.
        node: NodeRef,
        /// What is wrong.
        message: String,
    },
    /// A valid model uses what dcir does not support (an element type
    /// such as `FLOAT8E4M3FN` or `STRING`).
    #[error("not supported: {message}")]
    NotSupported {
        /// What, and where.
        message: String,
    },
    /// The model is inconsistent (missing graph, bad initializer, ...).
    #[error("invalid model: {message}")]
    Invalid {
        /// What is wrong.
        message: String,
    },
}

/// One node: `unsupported ONNX op `TopK` (node `a`, #1 of 5)`. Several:
/// `unsupported ONNX ops: TopK (2 nodes, the first `a`, #1 of 5), NonZero
/// (1 node, `b`, #3 of 5)`, op types in order of first use.
fn unsupported_message(nodes: &[NodeRef]) -> String {
    match nodes {
        [] => "unsupported ops".to_string(),
        [one] => format!("unsupported ONNX op {one}"),
        _ => {
            let mut types: Vec<(&str, usize, &NodeRef)> = Vec::new();
            for n in nodes {
                match types.iter_mut().find(|(t, _, _)| *t == n.op_type) {
                    Some((_, count, _)) => *count += 1,
                    None => types.push((&n.op_type, 1, n)),
                }
            }
            let parts: Vec<String> = types
                .iter()
                .map(|(t, count, first)| {
                    let name = if first.name.is_empty() {
                        "<unnamed>"
                    } else {
                        &first.name
                    };
                    let place = format!("`{name}`, #{} of {}", first.index, first.total);
                    if *count == 1 {
                        format!("{t} (1 node, {place})")
                    } else {
                        format!("{t} ({count} nodes, the first {place})")
                    }
                })
                .collect();
            format!("unsupported ONNX ops: {}", parts.join(", "))
        }
    }
}

fn unmatched_message(unmatched: &[String], inputs: &[String]) -> String {
    let keys: Vec<String> = unmatched.iter().map(|k| format!("`--dim {k}`")).collect();
    format!(
        "{} {} no dynamic dim of the model (a `dim_param` name, or INPUT:INDEX of a dim without a value; a fixed dim cannot be changed); its inputs: {}",
        keys.join(", "),
        if keys.len() == 1 { "matches" } else { "match" },
        inputs.join(", ")
    )
}

fn dynamic_message(dims: &[(String, usize, Option<String>)]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .map(|(input, i, p)| match p {
            Some(p) => {
                format!("input `{input}` dim {i} is the dynamic dim `{p}`: pass --dim {p}=VALUE")
            }
            None => format!("input `{input}` dim {i} has no value: pass --dim {input}:{i}=VALUE"),
        })
        .collect();
    format!("dcir needs static shapes; {}", parts.join("; "))
}

/// Decodes an ONNX model.
pub fn decode_model(bytes: &[u8]) -> Result<proto::ModelProto, ImportError> {
    proto::ModelProto::decode(bytes).map_err(|e| ImportError::Decode(e.to_string()))
}

/// A tensor read from a serialized ONNX `TensorProto` (the `.pb` files of
/// the ONNX backend tests hold their inputs and expected outputs so).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorFile {
    /// The tensor's name in the file (may be empty).
    pub name: String,
    /// The ONNX element type's name (`FLOAT`, `UINT8`, ...).
    pub onnx_type: String,
    /// Its dcir type: the element type mapped as the importer maps a graph
    /// input's (doubles narrow to `f32`, small integers widen to `i32`, ...).
    pub ty: TensorType,
    /// Little-endian element bytes of `ty.dtype` (bool: one byte each).
    pub bytes: Vec<u8>,
}

/// A serialized `TensorProto` (a `.pb` file, as [`ImportOptions::known_inputs`]
/// takes), undecoded data and all; bytes that are no tensor are an error.
pub fn decode_tensor_proto(bytes: &[u8]) -> Result<proto::TensorProto, ImportError> {
    proto::TensorProto::decode(bytes)
        .map_err(|e| ImportError::Decode(format!("not a valid TensorProto: {e}")))
}

/// Decodes a serialized `TensorProto` with its data (raw bytes or the typed
/// fields; external data is refused, there is no folder to read it from).
/// An element type dcir has no dtype for (strings, complex, 8-bit floats,
/// ...) and bytes that are no tensor are errors, never panics.
pub fn decode_tensor(bytes: &[u8]) -> Result<TensorFile, ImportError> {
    let t = decode_tensor_proto(bytes)?;
    let name = t.name.clone().unwrap_or_default();
    let invalid = |m: String| ImportError::Invalid {
        message: if name.is_empty() {
            format!("tensor: {m}")
        } else {
            format!("tensor `{name}`: {m}")
        },
    };
    let code = t.data_type.unwrap_or(0);
    let dtype = tensor::dtype_of(code).map_err(|m| ImportError::NotSupported {
        message: if name.is_empty() {
            format!("tensor: {m}")
        } else {
            format!("tensor `{name}`: {m}")
        },
    })?;
    let dims = tensor::dims_of(&t).map_err(invalid)?;
    let numel = dims.iter().product();
    let bytes = tensor::weight_bytes(&t, dtype, numel, None)
        .map_err(invalid)?
        .ok_or_else(|| invalid(format!("holds no data for its {numel} elements")))?;
    Ok(TensorFile {
        name: name.clone(),
        onnx_type: tensor::type_name(code),
        ty: TensorType::new(dtype, dims),
        bytes,
    })
}

/// Imports a model from its bytes; external data files are not available.
pub fn import_bytes(bytes: &[u8], opts: &ImportOptions) -> Result<Imported, ImportError> {
    let model = decode_model(bytes)?;
    import::import(&model, None, opts)
}

/// Imports the model file at `path`; external data files are read relative
/// to its folder.
pub fn import_file(path: &Path, opts: &ImportOptions) -> Result<Imported, ImportError> {
    let bytes = std::fs::read(path).map_err(|e| ImportError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let model = decode_model(&bytes)?;
    drop(bytes);
    let base = path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    });
    import::import(&model, base, opts)
}

/// Imports an already decoded model; external data files are relative to `base`.
pub fn import_model(
    model: &proto::ModelProto,
    base: Option<&Path>,
    opts: &ImportOptions,
) -> Result<Imported, ImportError> {
    import::import(model, base, opts)
}

fn st_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::I32 => safetensors::Dtype::I32,
        DType::I64 => safetensors::Dtype::I64,
        DType::Bool => safetensors::Dtype::BOOL,
    }
}

fn views(
    weights: &[Weight],
) -> Result<Vec<(String, safetensors::tensor::TensorView<'_>)>, ImportError> {
    weights
        .iter()
        .map(|w| {
            safetensors::tensor::TensorView::new(
                st_dtype(w.ty.dtype),
                w.ty.dims().to_vec(),
                &w.bytes,
            )
            .map(|v| (w.name.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ImportError::Invalid {
            message: format!("weights: {e}"),
        })
}

/// The weights as a safetensors file (tensors named after the parameters).
pub fn weights_to_safetensors(weights: &[Weight]) -> Result<Vec<u8>, ImportError> {
    safetensors::tensor::serialize(views(weights)?, None).map_err(|e| ImportError::Invalid {
        message: format!("weights: {e}"),
    })
}

/// Writes the weights as a safetensors file at `path`, streaming the data.
pub fn write_weights(weights: &[Weight], path: &Path) -> Result<(), ImportError> {
    let views = views(weights)?;
    let io = |message: String| ImportError::Io {
        path: path.to_path_buf(),
        message,
    };
    // safetensors writes a temporary file (mode 0600) and renames it over
    // `path`: give the result the permissions of the file it replaces, or
    // of a file created there (0666 less the umask), as `std::fs::write`.
    let (permissions, created) = match std::fs::metadata(path) {
        Ok(m) => (m.permissions(), false),
        Err(_) => {
            let file = std::fs::File::create(path).map_err(|e| io(e.to_string()))?;
            let permissions = file
                .metadata()
                .map_err(|e| io(e.to_string()))?
                .permissions();
            (permissions, true)
        }
    };
    let written = safetensors::tensor::serialize_to_file(views, None, path)
        .map_err(|e| io(e.to_string()))
        .and_then(|()| std::fs::set_permissions(path, permissions).map_err(|e| io(e.to_string())));
    if written.is_err() && created {
        let _ = std::fs::remove_file(path);
    }
    written
}
