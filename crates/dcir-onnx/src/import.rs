//! The translation of an ONNX graph into a dcir graph, node by node.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;

use dcir_ir::{Attr, Attrs, BuildError, DType, GraphBuilder, OpKind, TensorType, ValueId};

use crate::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};
use crate::random::{Role, seeded_weight};
use crate::tensor::{self, Bin, Const, Data};
use crate::{ImportError, ImportOptions, Imported, NodeRef, Weight};

mod composite;

/// Every ONNX op type (default domain) the importer knows. Some of them fold
/// only when their inputs are constants (see `docs/onnx.md`).
pub const SUPPORTED_OPS: &[&str] = &[
    "Abs",
    "Add",
    "And",
    "ArgMax",
    "ArgMin",
    "Attention",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "CastLike",
    "Ceil",
    "Celu",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "ConvTranspose",
    "Cos",
    "CumSum",
    "Div",
    "Dropout",
    "Einsum",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Floor",
    "Gather",
    "GatherElements",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "GroupNormalization",
    "HardSigmoid",
    "HardSwish",
    "Hardmax",
    "Identity",
    "InstanceNormalization",
    "IsInf",
    "IsNaN",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "LpNormalization",
    "LpPool",
    "MatMul",
    "Max",
    "MaxPool",
    "Mean",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "Not",
    "OneHot",
    "Or",
    "PRelu",
    "Pad",
    "Pow",
    "RMSNormalization",
    "Range",
    "Reciprocal",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "Resize",
    "RotaryEmbedding",
    "Round",
    "ScatterND",
    "Selu",
    "Shape",
    "Sigmoid",
    "Sign",
    "Sin",
    "Size",
    "Slice",
    "Softmax",
    "Softplus",
    "Softsign",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tanh",
    "ThresholdedRelu",
    "Tile",
    "Transpose",
    "Trilu",
    "Unsqueeze",
    "Upsample",
    "Where",
    "Xor",
];

/// Most elements of one initializer given random values (2^31, 8 GiB of f32).
const MAX_SEEDED: usize = 1 << 31;

/// What an ONNX value name stands for during import.
#[derive(Clone, Debug)]
enum Val {
    /// A dcir value.
    Ir(ValueId),
    /// A tensor known at import time, materialized as `constant` on use.
    Const(std::rc::Rc<Const>),
}

type R<T> = Result<T, String>;

fn b(e: BuildError) -> String {
    e.to_string()
}

/// Replaces every character outside `[A-Za-z0-9_.]` with `_`.
pub fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "_".to_string() } else { s }
}

/// A graph name: an identifier (`[A-Za-z_][A-Za-z0-9_.]*`).
fn graph_ident(name: &str) -> String {
    let s = sanitize(name);
    if s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        s
    } else {
        format!("_{s}")
    }
}

struct Importer<'m> {
    b: GraphBuilder,
    vals: HashMap<&'m str, Val>,
    /// `constant` ops already made: (value name, dtype, dims) to the value.
    materialized: HashMap<(String, DType, Vec<usize>), ValueId>,
    opset: i64,
    /// Value names some node or the graph output reads.
    used: HashSet<&'m str>,
}

/// Translates `model` (whose external data files are relative to `base`).
pub(crate) fn import(
    model: &ModelProto,
    base: Option<&Path>,
    opts: &ImportOptions,
) -> Result<Imported, ImportError> {
    let graph = model.graph.as_ref().ok_or_else(|| ImportError::Invalid {
        message: "the model has no graph".to_string(),
    })?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
        .unwrap_or(13);
    check_supported(graph)?;

    let name = opts
        .graph_name
        .clone()
        .or_else(|| graph.name.clone().filter(|n| !n.is_empty()))
        .map_or_else(|| "main".to_string(), |n| graph_ident(&n));
    let mut used: HashSet<&str> = HashSet::new();
    for n in &graph.node {
        used.extend(n.input.iter().map(String::as_str));
    }
    used.extend(graph.output.iter().filter_map(|o| o.name.as_deref()));
    let mut imp = Importer {
        b: GraphBuilder::new(name),
        vals: HashMap::new(),
        materialized: HashMap::new(),
        opset,
        used,
    };
    let weights = imp.params(graph, base, opts)?;
    for (index, node) in graph.node.iter().enumerate() {
        imp.node(node).map_err(|message| ImportError::Node {
            node: node_ref(node, index, graph.node.len()),
            message: bounded(message),
        })?;
    }
    let mut outputs = Vec::new();
    for o in &graph.output {
        let name = o.name.as_deref().unwrap_or("");
        let v = imp
            .vals
            .get(name)
            .cloned()
            .ok_or_else(|| ImportError::Invalid {
                message: format!("graph output `{name}` is produced by no node"),
            })?;
        let v = imp.ir(name, &v).map_err(|message| ImportError::Invalid {
            message: format!("graph output `{name}`: {message}"),
        })?;
        if let Some(dims) = declared_dims(o.r#type.as_ref()) {
            let got = imp.b.ty(v).dims();
            let agrees = dims.len() == got.len()
                && dims.iter().zip(got).all(|(d, &g)| d.is_none_or(|d| d == g));
            if !agrees {
                return Err(ImportError::Invalid {
                    message: format!(
                        "graph output `{name}` is declared with shape {}, but the import computed {}",
                        show_dims(&dims),
                        imp.b.ty(v)
                    ),
                });
            }
        }
        outputs.push((v, name));
    }
    // Each output takes the model's name for it (sanitized), where it is a
    // value this import computed and no other value has that name.
    let mut named = Vec::with_capacity(outputs.len());
    for (v, name) in outputs {
        let computed = !imp.b.graph().params().contains(&v) && !named.contains(&v);
        if computed {
            let _ = imp.b.rename_value(v, &sanitize(name));
        }
        named.push(v);
    }
    let outputs = named;
    let graph = imp.b.finish(&outputs).map_err(|e| ImportError::Invalid {
        message: format!("internal error: {e}"),
    })?;
    let mut module = dcir_ir::Module::new();
    module.graphs.push(graph);
    Ok(Imported { module, weights })
}

/// The `--dim INPUT:INDEX` keys of `opts` that name a dim of input `name`.
fn dims_of_input(opts: &ImportOptions, name: &str) -> Vec<String> {
    opts.dims
        .iter()
        .filter(|(k, _)| {
            k.rsplit_once(':')
                .is_some_and(|(input, i)| input == name && i.parse::<usize>().is_ok())
        })
        .map(|(k, _)| k.clone())
        .collect()
}

fn show_dims(d: &[Option<usize>]) -> String {
    let parts: Vec<String> = d
        .iter()
        .map(|x| x.map_or("?".to_string(), |v| v.to_string()))
        .collect();
    format!("[{}]", parts.join(","))
}

/// The static dims a value info declares (`None` for a symbolic dim), if it declares a shape.
fn declared_dims(t: Option<&crate::proto::TypeProto>) -> Option<Vec<Option<usize>>> {
    use crate::proto::tensor_shape_proto::dimension::Value as Dv;
    use crate::proto::type_proto::Value;
    let Some(Value::TensorType(tt)) = t?.value.as_ref() else {
        return None;
    };
    let shape = tt.shape.as_ref()?;
    Some(
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(Dv::DimValue(v)) => usize::try_from(*v).ok(),
                _ => None,
            })
            .collect(),
    )
}

fn node_ref(node: &NodeProto, index: usize, total: usize) -> NodeRef {
    NodeRef {
        op_type: op_label(node),
        name: node.name.clone().unwrap_or_default(),
        index,
        total,
    }
}

fn op_label(node: &NodeProto) -> String {
    let op = node.op_type.as_deref().unwrap_or("");
    match node.domain.as_deref() {
        None | Some("") | Some("ai.onnx") => op.to_string(),
        Some(d) => format!("{d}.{op}"),
    }
}

/// Refuses a model with any op outside [`SUPPORTED_OPS`], naming them all.
fn check_supported(graph: &GraphProto) -> Result<(), ImportError> {
    let total = graph.node.len();
    let bad: Vec<NodeRef> = graph
        .node
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            let default_domain = matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx"));
            !(default_domain && SUPPORTED_OPS.contains(&n.op_type.as_deref().unwrap_or("")))
        })
        .map(|(i, n)| node_ref(n, i, total))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(ImportError::Unsupported(bad))
    }
}

/// Normalizes a possibly negative axis against `rank`.
fn axis(a: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    let n = if a < 0 { a + r } else { a };
    if (0..r).contains(&n) {
        Ok(n as usize)
    } else {
        Err(format!("axis {a} is out of range for rank {rank}"))
    }
}

fn axes_sorted(raw: &[i64], rank: usize) -> R<Vec<usize>> {
    // More axes than dims repeat one (found by fuzzing: 33 M axes from an
    // `Expand`, printed whole, took seconds).
    if raw.len() > rank {
        return Err(format!("{} axes for a rank-{rank} tensor", raw.len()));
    }
    let mut v = raw.iter().map(|&a| axis(a, rank)).collect::<R<Vec<_>>>()?;
    v.sort_unstable();
    if v.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("axes {raw:?} repeat a dim"));
    }
    Ok(v)
}

/// Longest message of a node's error, in bytes; the rest is cut (a
/// message may quote a constant of millions of values).
const MAX_MESSAGE: usize = 2000;

/// `message`, cut to [`MAX_MESSAGE`] bytes (at a character boundary).
fn bounded(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let cut = (0..=MAX_MESSAGE)
            .rev()
            .find(|&i| message.is_char_boundary(i))
            .unwrap_or(0);
        let rest = message.len() - cut;
        message.truncate(cut);
        message.push_str(&format!("… ({rest} more bytes)"));
    }
    message
}

fn ints(v: &[usize]) -> Attr {
    Attr::Ints(v.iter().map(|&x| x as i64).collect())
}

/// Element count, saturating (an overflowing shape then fails a later check).
fn product(d: &[usize]) -> usize {
    d.iter()
        .try_fold(1usize, |a, &x| a.checked_mul(x))
        .unwrap_or(usize::MAX)
}

/// Largest value of a window attribute (kernel, stride, dilation, pad).
const MAX_WINDOW: i64 = 1 << 20;

fn check_window(v: &[i64], name: &str, min: i64) -> R<()> {
    match v.iter().find(|&&x| !(min..=MAX_WINDOW).contains(&x)) {
        Some(x) => Err(format!(
            "`{name}` entry {x} is out of range ({min}..={MAX_WINDOW})"
        )),
        None => Ok(()),
    }
}

/// Attribute access on a node.
struct At<'a>(&'a [AttributeProto]);

impl<'a> At<'a> {
    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.0.iter().find(|a| a.name.as_deref() == Some(name))
    }
    fn int(&self, name: &str) -> Option<i64> {
        self.get(name).and_then(|a| a.i)
    }
    fn int_or(&self, name: &str, d: i64) -> i64 {
        self.int(name).unwrap_or(d)
    }
    fn floats(&self, name: &str) -> Option<&'a [f32]> {
        self.get(name).map(|a| a.floats.as_slice())
    }
    fn float(&self, name: &str) -> Option<f32> {
        self.get(name).and_then(|a| a.f)
    }
    fn ints(&self, name: &str) -> Option<&'a [i64]> {
        self.get(name).map(|a| a.ints.as_slice())
    }
    fn string(&self, name: &str) -> Option<String> {
        self.get(name)
            .and_then(|a| a.s.as_ref())
            .map(|s| String::from_utf8_lossy(s).into_owned())
    }
    fn tensor(&self, name: &str) -> Option<&'a TensorProto> {
        self.get(name).and_then(|a| a.t.as_ref())
    }
}

impl<'m> Importer<'m> {
    /// Graph inputs, then initializers in file order, become parameters;
    /// integer initializers and float scalars become known constants.
    fn params(
        &mut self,
        graph: &'m GraphProto,
        base: Option<&Path>,
        opts: &ImportOptions,
    ) -> Result<Vec<Weight>, ImportError> {
        use crate::proto::tensor_shape_proto::dimension::Value as Dv;
        use crate::proto::type_proto::Value;
        let inits: HashSet<&str> = graph
            .initializer
            .iter()
            .filter_map(|t| t.name.as_deref())
            .collect();
        let mut missing = Vec::new();
        // The `--dim` keys some input's dim took, and each input's dims as
        // the model has them (for the error naming what a key could match).
        let mut matched = std::collections::BTreeSet::new();
        let mut shapes = Vec::new();
        for input in &graph.input {
            let name = input.name.as_deref().unwrap_or("");
            if inits.contains(name) {
                matched.extend(dims_of_input(opts, name));
                continue;
            }
            let invalid = |m: String| ImportError::Invalid {
                message: format!("graph input `{name}`: {m}"),
            };
            // A value the caller knows: a constant, as an integer initializer.
            if let Some((_, t)) = opts.known_inputs.iter().find(|(n, _)| n == name) {
                matched.extend(dims_of_input(opts, name));
                let c = tensor::decode(t, None)
                    .map_err(invalid)?
                    .ok_or_else(|| invalid("the known value has no data".to_string()))?;
                self.vals.insert(name, Val::Const(c.into()));
                continue;
            }
            let Some(Value::TensorType(tt)) = input.r#type.as_ref().and_then(|t| t.value.as_ref())
            else {
                return Err(ImportError::NotSupported {
                    message: format!(
                        "graph input `{name}` is not a tensor (sequences, maps and optionals are not supported)"
                    ),
                });
            };
            let dtype = tensor::dtype_of(tt.elem_type.unwrap_or(0)).map_err(|m| {
                ImportError::NotSupported {
                    message: format!("graph input `{name}`: {m}"),
                }
            })?;
            let Some(shape) = &tt.shape else {
                return Err(ImportError::NotSupported {
                    message: format!("graph input `{name}` has no shape; dcir needs static shapes"),
                });
            };
            let mut dims = Vec::new();
            let mut shown = Vec::new();
            for (i, d) in shape.dim.iter().enumerate() {
                let by_index = format!("{name}:{i}");
                let mut lookup = |key: &str| {
                    let found = opts.dims.iter().find(|(k, _)| k == key).map(|x| x.1);
                    if found.is_some() {
                        matched.insert(key.to_string());
                    }
                    found
                };
                match &d.value {
                    Some(Dv::DimValue(v)) if *v >= 0 => {
                        // A fixed dim takes only its own value (the ONNX
                        // node tests give every input dim).
                        if opts
                            .dims
                            .iter()
                            .any(|(k, n)| *k == by_index && *n as i64 == *v)
                        {
                            matched.insert(by_index.clone());
                        }
                        dims.push(*v as usize);
                        shown.push(v.to_string());
                    }
                    Some(Dv::DimParam(p)) if !p.is_empty() => {
                        match lookup(p).or_else(|| lookup(&by_index)) {
                            Some(v) => dims.push(v),
                            None => missing.push((name.to_string(), i, Some(p.clone()))),
                        }
                        shown.push(p.clone());
                    }
                    _ => {
                        match lookup(&by_index) {
                            Some(v) => dims.push(v),
                            None => missing.push((name.to_string(), i, None)),
                        }
                        shown.push(format!("{by_index}?"));
                    }
                }
            }
            shapes.push(format!("`{name}` [{}]", shown.join(", ")));
            if missing.is_empty() {
                let v = self
                    .b
                    .param(&sanitize(name), TensorType::new(dtype, dims))
                    .map_err(|e| invalid(e.to_string()))?;
                self.vals.insert(name, Val::Ir(v));
            }
        }
        let unmatched: Vec<&str> = opts
            .dims
            .iter()
            .map(|(k, _)| k.as_str())
            .filter(|k| !matched.contains(*k))
            .collect();
        if !unmatched.is_empty() {
            return Err(ImportError::UnmatchedDims {
                unmatched: unmatched.iter().map(|k| k.to_string()).collect(),
                inputs: shapes,
            });
        }
        if !missing.is_empty() {
            return Err(ImportError::DynamicDims(missing));
        }

        let roles = self.roles(graph);
        let mut weights = Vec::new();
        for t in &graph.initializer {
            let name = t.name.as_deref().unwrap_or("");
            let invalid = |m: String| ImportError::Invalid {
                message: format!("initializer `{name}`: {m}"),
            };
            let ty = t.data_type.unwrap_or(0);
            let dtype = tensor::dtype_of(ty).map_err(|m| ImportError::NotSupported {
                message: format!("initializer `{name}`: {m}"),
            })?;
            let dims = tensor::dims_of(t).map_err(invalid)?;
            let numel = product(&dims);
            if !dtype.is_float() || numel <= 1 {
                match tensor::decode(t, base).map_err(invalid)? {
                    Some(c) => {
                        self.vals.insert(name, Val::Const(c.into()));
                        continue;
                    }
                    None if !dtype.is_float() => {
                        return Err(invalid(
                            "an integer initializer without data: its values are needed at import"
                                .to_string(),
                        ));
                    }
                    None => {}
                }
            }
            if !self.used.contains(name) {
                continue;
            }
            if numel > MAX_SEEDED
                && matches!(tensor::payload(t, base), Ok(tensor::Payload::Missing))
            {
                return Err(invalid(format!(
                    "has no data and {numel} elements, more than the {MAX_SEEDED} the importer fills with random values"
                )));
            }
            let ty_ir = TensorType::new(dtype, dims);
            let pname = sanitize(name);
            let v = self
                .b
                .param(&pname, ty_ir.clone())
                .map_err(|e| invalid(e.to_string()))?;
            let pname = self.b.graph().value(v).name.clone();
            self.vals.insert(name, Val::Ir(v));
            let (bytes, seeded) =
                match tensor::weight_bytes(t, dtype, numel, base).map_err(invalid)? {
                    Some(bytes) => (bytes, false),
                    None => {
                        let role = roles.get(name).copied().unwrap_or(Role::Generic);
                        (seeded_weight(&pname, &ty_ir, role, opts.seed), true)
                    }
                };
            weights.push(Weight {
                name: pname,
                ty: ty_ir,
                bytes,
                seeded,
            });
        }
        Ok(weights)
    }

    /// How each initializer is first used, to give data-less ones sensible random values.
    fn roles(&self, graph: &'m GraphProto) -> HashMap<&'m str, Role> {
        let mut alias: HashMap<&str, &str> = HashMap::new();
        let mut roles = HashMap::new();
        for n in &graph.node {
            let op = n.op_type.as_deref().unwrap_or("");
            if matches!(op, "Identity" | "Cast") {
                if let (Some(i), Some(o)) = (n.input.first(), n.output.first()) {
                    let root = alias.get(i.as_str()).copied().unwrap_or(i.as_str());
                    alias.insert(o.as_str(), root);
                }
                continue;
            }
            let at = At(&n.attribute);
            for (k, input) in n.input.iter().enumerate() {
                let root = alias.get(input.as_str()).copied().unwrap_or(input.as_str());
                let role = match (op, k) {
                    ("BatchNormalization", 1) | ("LayerNormalization", 1) => Role::Scale,
                    ("BatchNormalization", 4) => Role::Variance,
                    ("BatchNormalization" | "LayerNormalization", _) => Role::Shift,
                    ("Conv", 1) => Role::Fan {
                        axis: None,
                        gain: 6.0,
                    },
                    ("MatMul", 1) => Role::Fan {
                        axis: Some(0),
                        gain: 3.0,
                    },
                    ("Gemm", 1) => Role::Fan {
                        axis: Some(if at.int_or("transB", 0) != 0 { 1 } else { 0 }),
                        gain: 3.0,
                    },
                    _ => Role::Generic,
                };
                roles.entry(root).or_insert(role);
            }
        }
        roles
    }

    // ---------------------------------------------------------------- values

    fn get(&self, node: &NodeProto, i: usize) -> R<Option<Val>> {
        match node.input.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(name) => self
                .vals
                .get(name)
                .cloned()
                .map(Some)
                .ok_or_else(|| format!("input `{name}` is not defined before this node")),
        }
    }

    fn req(&self, node: &NodeProto, i: usize) -> R<Val> {
        self.get(node, i)?
            .ok_or_else(|| format!("input {i} is required"))
    }

    fn in_name(node: &NodeProto, i: usize) -> &str {
        node.input.get(i).map_or("", String::as_str)
    }

    /// Input `i` as a dcir value (constants materialized).
    fn ir_in(&mut self, node: &NodeProto, i: usize) -> R<ValueId> {
        let v = self.req(node, i)?;
        self.ir(Self::in_name(node, i), &v)
    }

    /// Input `i`'s value known at import time.
    fn const_in(&self, node: &NodeProto, i: usize) -> R<Option<std::rc::Rc<Const>>> {
        match self.get(node, i)? {
            None => Ok(None),
            Some(Val::Const(c)) => Ok(Some(c)),
            Some(Val::Ir(_)) => Err(format!(
                "input {i} (`{}`) must be known at import time (a constant or shape arithmetic), but it is computed at run time",
                Self::in_name(node, i)
            )),
        }
    }

    fn dims_of(&self, v: &Val) -> Vec<usize> {
        match v {
            Val::Ir(id) => self.b.ty(*id).dims().to_vec(),
            Val::Const(c) => c.dims.clone(),
        }
    }

    fn dtype_of(&self, v: &Val) -> DType {
        match v {
            Val::Ir(id) => self.b.ty(*id).dtype,
            Val::Const(c) => c.dtype,
        }
    }

    fn ir(&mut self, name: &str, v: &Val) -> R<ValueId> {
        match v {
            Val::Ir(id) => Ok(*id),
            Val::Const(c) => self.materialize(name, c, c.dtype, &c.dims.clone()),
        }
    }

    /// A `constant` op holding `c` as `dtype`, broadcast to `dims`.
    fn materialize(&mut self, name: &str, c: &Const, dtype: DType, dims: &[usize]) -> R<ValueId> {
        let key = (name.to_string(), dtype, dims.to_vec());
        if let Some(&v) = self.materialized.get(&key) {
            return Ok(v);
        }
        let c = c.cast(dtype);
        let v = if let Some(x) = c.splat() {
            self.b
                .constant(TensorType::new(dtype, dims.to_vec()), literal(dtype, x))
                .map_err(b)?
        } else if c.len() == 0 {
            let own = self
                .b
                .constant(TensorType::new(dtype, c.dims.clone()), literal(dtype, 0.0));
            let own = own.map_err(b)?;
            self.broadcast_to(own, dims)?
        } else {
            let value = match &c.data {
                Data::F(v) => Attr::Floats(v.clone()),
                Data::I(v) => Attr::Ints(v.clone()),
            };
            let own = self
                .b
                .constant(TensorType::new(dtype, c.dims.clone()), value)
                .map_err(b)?;
            self.broadcast_to(own, dims)?
        };
        self.materialized.insert(key, v);
        Ok(v)
    }

    /// `v` broadcast (numpy rules) to `out`: size-1 dims that grow are
    /// dropped by a `reshape`, then one `broadcast` maps the rest in order.
    fn broadcast_to(&mut self, v: ValueId, out: &[usize]) -> R<ValueId> {
        let dims = self.b.ty(v).dims().to_vec();
        if dims == out {
            return Ok(v);
        }
        if dims.len() > out.len() {
            return Err(format!("cannot broadcast {dims:?} to {out:?}"));
        }
        let off = out.len() - dims.len();
        let mut kept = Vec::new();
        let mut map = Vec::new();
        for (i, &d) in dims.iter().enumerate() {
            let o = out[off + i];
            if d == o {
                kept.push(d);
                map.push((off + i) as i64);
            } else if d != 1 {
                return Err(format!("cannot broadcast {dims:?} to {out:?}"));
            }
        }
        let src = if kept.len() == dims.len() {
            v
        } else {
            self.b.reshape(v, &kept).map_err(b)?
        };
        self.b.broadcast(src, &map, out).map_err(b)
    }

    /// A value of `v` as `dtype` broadcast to `out`.
    fn operand(&mut self, name: &str, v: &Val, dtype: DType, out: &[usize]) -> R<ValueId> {
        match v {
            Val::Const(c) => self.materialize(name, c, dtype, out),
            Val::Ir(id) => {
                if self.b.ty(*id).dtype != dtype {
                    return Err(format!(
                        "operand `{name}` is {}, expected {dtype}",
                        self.b.ty(*id)
                    ));
                }
                self.broadcast_to(*id, out)
            }
        }
    }

    fn splat(&mut self, dtype: DType, x: f64, dims: &[usize]) -> R<ValueId> {
        self.b
            .constant(TensorType::new(dtype, dims.to_vec()), literal(dtype, x))
            .map_err(b)
    }

    fn set(&mut self, node: &'m NodeProto, k: usize, v: Val) -> R<()> {
        match node.output.get(k).map(String::as_str) {
            None | Some("") => Ok(()),
            Some(name) => {
                self.vals.insert(name, v);
                Ok(())
            }
        }
    }

    fn out(&mut self, node: &'m NodeProto, v: ValueId) -> R<()> {
        for extra in node.output.iter().skip(1) {
            if !extra.is_empty() && self.used.contains(extra.as_str()) {
                return Err(format!(
                    "only the first output is supported, but output `{extra}` is used"
                ));
            }
        }
        self.set(node, 0, Val::Ir(v))
    }

    fn cst(&mut self, node: &'m NodeProto, c: Const) -> R<()> {
        self.set(node, 0, Val::Const(c.into()))
    }

    // ----------------------------------------------------------------- nodes

    fn node(&mut self, node: &'m NodeProto) -> R<()> {
        let op = node.op_type.as_deref().unwrap_or("");
        let at = At(&node.attribute);
        let all_const = (0..node.input.len())
            .all(|i| !matches!(self.get(node, i), Ok(Some(Val::Ir(_))) | Err(_)));
        match op {
            "Identity" => {
                let v = self.req(node, 0)?;
                self.set(node, 0, v)
            }
            "Dropout" => self.dropout(node, &at),
            "Constant" => {
                let c = self.constant_attr(&at)?;
                self.cst(node, c)
            }
            "Max" | "Min" if node.input.len() != 2 => self.variadic(node, op),
            "Sum" | "Mean" => self.variadic(node, op),
            "ArgMax" | "ArgMin" => self.arg_extreme(node, op, &at),
            "CumSum" => self.cumsum(node, &at),
            "Resize" | "Upsample" => self.resize(node, op, &at),
            "Attention" => self.attention(node, &at),
            "ConvTranspose" => self.conv_transpose(node, &at),
            "RotaryEmbedding" => self.rotary_embedding(node, &at),
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" | "Mod" | "Equal" | "Less"
            | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "And" | "Or" | "Xor" => {
                let bin = match op {
                    "Add" => Bin::Add,
                    "Sub" => Bin::Sub,
                    "Mul" => Bin::Mul,
                    "Div" => Bin::Div,
                    "Pow" => Bin::Pow,
                    "Max" => Bin::Max,
                    "Min" => Bin::Min,
                    "Mod" => Bin::Mod {
                        fmod: at.int_or("fmod", 0) != 0,
                    },
                    "Equal" => Bin::Equal,
                    "Less" => Bin::Less,
                    "LessOrEqual" => Bin::LessOrEqual,
                    "Greater" => Bin::Greater,
                    "GreaterOrEqual" => Bin::GreaterOrEqual,
                    "And" => Bin::And,
                    "Or" => Bin::Or,
                    _ => Bin::Xor,
                };
                if node.input.len() != 2 {
                    return Err(format!(
                        "{op} takes 2 inputs here, found {}",
                        node.input.len()
                    ));
                }
                if all_const {
                    let (x, y) = (self.const_in(node, 0)?, self.const_in(node, 1)?);
                    let (Some(x), Some(y)) = (x, y) else {
                        return Err("missing input".to_string());
                    };
                    return self.cst(node, tensor::binary(bin, &x, &y)?);
                }
                let mut attrs = Attrs::new();
                let kind = match bin {
                    Bin::Add => OpKind::Add,
                    Bin::Sub => OpKind::Sub,
                    Bin::Mul => OpKind::Mul,
                    Bin::Div => OpKind::Div,
                    Bin::Pow => OpKind::Pow,
                    Bin::Max => OpKind::Max,
                    Bin::Min => OpKind::Min,
                    Bin::Mod { fmod } => {
                        let (x, y) = (self.req(node, 0)?, self.req(node, 1)?);
                        if !fmod && (self.dtype_of(&x).is_float() || self.dtype_of(&y).is_float()) {
                            return Err(tensor::FLOAT_MOD_NEEDS_FMOD.to_string());
                        }
                        attrs.set("fmod", Attr::Bool(fmod));
                        OpKind::Mod
                    }
                    Bin::Equal => OpKind::Equal,
                    Bin::Less => OpKind::Less,
                    Bin::LessOrEqual => OpKind::LessEqual,
                    Bin::Greater => OpKind::Greater,
                    Bin::GreaterOrEqual => OpKind::GreaterEqual,
                    Bin::And => OpKind::And,
                    Bin::Or => OpKind::Or,
                    Bin::Xor => OpKind::Xor,
                };
                let v = self.binary(node, kind, attrs)?;
                self.out(node, v)
            }
            "Relu" | "Tanh" | "Sigmoid" | "Erf" | "Sqrt" | "Exp" | "Log" | "Neg" | "Abs" => {
                if all_const {
                    let x = self.const_in(node, 0)?.ok_or("missing input")?;
                    let f: fn(f64) -> f64 = match op {
                        "Relu" => |x| x.max(0.0),
                        "Tanh" => f64::tanh,
                        "Sigmoid" => |x| 1.0 / (1.0 + (-x).exp()),
                        "Sqrt" => f64::sqrt,
                        "Exp" => f64::exp,
                        "Log" => f64::ln,
                        "Neg" => |x| -x,
                        "Abs" => f64::abs,
                        _ => return self.unary_ir(node, OpKind::Erf),
                    };
                    return self.cst(node, tensor::unary(&x, f));
                }
                let kind = match op {
                    "Relu" => OpKind::Relu,
                    "Tanh" => OpKind::Tanh,
                    "Sigmoid" => OpKind::Sigmoid,
                    "Erf" => OpKind::Erf,
                    "Sqrt" => OpKind::Sqrt,
                    "Exp" => OpKind::Exp,
                    "Log" => OpKind::Log,
                    "Neg" => OpKind::Neg,
                    _ => OpKind::Abs,
                };
                self.unary_ir(node, kind)
            }
            "Floor" | "Ceil" | "Not" if all_const => {
                let x = self.const_in(node, 0)?.ok_or("missing input")?;
                let f: fn(f64) -> f64 = match op {
                    "Floor" => f64::floor,
                    "Ceil" => f64::ceil,
                    _ => |x| f64::from(u8::from(x == 0.0)),
                };
                self.cst(node, tensor::unary(&x, f))
            }
            "Floor" | "Ceil" | "Not" | "Round" | "Sign" | "Sin" | "Cos" | "IsNaN" => {
                let kind = match op {
                    "Floor" => OpKind::Floor,
                    "Ceil" => OpKind::Ceil,
                    "Not" => OpKind::Not,
                    "Round" => OpKind::Round,
                    "Sign" => OpKind::Sign,
                    "Sin" => OpKind::Sin,
                    "Cos" => OpKind::Cos,
                    _ => OpKind::IsNan,
                };
                self.unary_ir(node, kind)
            }
            "IsInf" => {
                let x = self.ir_in(node, 0)?;
                let inf = self.b.op(OpKind::IsInf, &[x], Attrs::new()).map_err(b)?;
                let (negative, positive) = (
                    at.int("detect_negative").unwrap_or(1) != 0,
                    at.int("detect_positive").unwrap_or(1) != 0,
                );
                // One sign only: the infinities on that side of zero.
                let v = match (negative, positive) {
                    (true, true) => inf,
                    (false, false) => {
                        let no = self.b.op(OpKind::Not, &[inf], Attrs::new()).map_err(b)?;
                        self.b
                            .op(OpKind::And, &[inf, no], Attrs::new())
                            .map_err(b)?
                    }
                    (negative, _) => {
                        let ty = self.b.ty(x).clone();
                        let zero = self.splat(ty.dtype, 0.0, ty.dims())?;
                        let (a, c) = if negative { (x, zero) } else { (zero, x) };
                        let side = self.b.op(OpKind::Less, &[a, c], Attrs::new()).map_err(b)?;
                        self.b
                            .op(OpKind::And, &[inf, side], Attrs::new())
                            .map_err(b)?
                    }
                };
                self.out(node, v)
            }
            "Reciprocal" => {
                if all_const {
                    let x = self.const_in(node, 0)?.ok_or("missing input")?;
                    return self.cst(node, tensor::unary(&x, |x| 1.0 / x));
                }
                let x = self.ir_in(node, 0)?;
                let ty = self.b.ty(x).clone();
                let one = self.splat(ty.dtype, 1.0, ty.dims())?;
                let v = self.b.op(OpKind::Div, &[one, x], Attrs::new()).map_err(b)?;
                self.out(node, v)
            }
            "Gelu" => {
                let approx = at
                    .string("approximate")
                    .unwrap_or_else(|| "none".to_string());
                let x = self.ir_in(node, 0)?;
                let v = self
                    .b
                    .op(
                        OpKind::Gelu,
                        &[x],
                        Attrs::new().with("approximate", Attr::Str(approx)),
                    )
                    .map_err(b)?;
                self.out(node, v)
            }
            "Clip" => self.clip(node, &at),
            "LeakyRelu" | "Elu" | "Selu" | "Celu" | "Softplus" | "Softsign" | "Mish"
            | "ThresholdedRelu" | "PRelu" => self.activation(node, op, &at),
            "Split" => self.split(node, &at),
            "Tile" => self.tile(node),
            "InstanceNormalization" | "GroupNormalization" => self.group_norm(node, op, &at),
            "Trilu" => self.trilu(node, &at),
            "HardSigmoid" | "HardSwish" => {
                // HardSigmoid: clip(alpha·x + beta, 0, 1); HardSwish: x times
                // HardSigmoid with alpha = 1/6, beta = 1/2.
                let (alpha, beta) = match op {
                    "HardSigmoid" => (
                        at.float("alpha").map_or(0.2, f64::from),
                        at.float("beta").map_or(0.5, f64::from),
                    ),
                    _ => (1.0 / 6.0, 0.5),
                };
                let x = self.ir_in(node, 0)?;
                let ty = self.b.ty(x).clone();
                let a = self.splat(ty.dtype, alpha, ty.dims())?;
                let c = self.splat(ty.dtype, beta, ty.dims())?;
                let ax = self.b.op(OpKind::Mul, &[x, a], Attrs::new()).map_err(b)?;
                let axb = self.b.op(OpKind::Add, &[ax, c], Attrs::new()).map_err(b)?;
                let clip = Attrs::new()
                    .with("min", Attr::Float(0.0))
                    .with("max", Attr::Float(1.0));
                let mut v = self.b.op(OpKind::Clip, &[axb], clip).map_err(b)?;
                if op == "HardSwish" {
                    v = self.b.op(OpKind::Mul, &[x, v], Attrs::new()).map_err(b)?;
                }
                self.out(node, v)
            }
            "Cast" | "CastLike" => {
                let to = if op == "Cast" {
                    let code = at.int("to").ok_or("Cast needs `to`")?;
                    tensor::dtype_of(code as i32)?
                } else {
                    let like = self.req(node, 1)?;
                    self.dtype_of(&like)
                };
                match self.req(node, 0)? {
                    Val::Const(c) => self.cst(node, c.cast(to)),
                    Val::Ir(x) if self.b.ty(x).dtype == to => self.out(node, x),
                    Val::Ir(x) => {
                        let v = self.b.cast(x, to).map_err(b)?;
                        self.out(node, v)
                    }
                }
            }
            "Shape" => {
                let x = self.req(node, 0)?;
                let dims: Vec<i64> = self.dims_of(&x).iter().map(|&d| d as i64).collect();
                let r = dims.len() as i64;
                let clampi = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) } as usize;
                let start = clampi(at.int_or("start", 0));
                let end = clampi(at.int_or("end", r));
                let v = dims[start..end.max(start)].to_vec();
                self.cst(node, Const::ints(v))
            }
            "Size" => {
                let x = self.req(node, 0)?;
                let n = product(&self.dims_of(&x)) as i64;
                self.cst(
                    node,
                    Const {
                        dtype: DType::I64,
                        dims: vec![],
                        data: Data::I(vec![n]),
                    },
                )
            }
            "ConstantOfShape" => {
                let shape = self.const_in(node, 0)?.ok_or("missing shape")?;
                let dims = shape
                    .to_i64()
                    .iter()
                    .map(|&d| usize::try_from(d).map_err(|_| format!("negative extent {d}")))
                    .collect::<R<Vec<_>>>()?;
                let value = match at.tensor("value") {
                    Some(t) => tensor::decode(t, None)?.ok_or("`value` has no data")?,
                    None => Const {
                        dtype: DType::F32,
                        dims: vec![1],
                        data: Data::F(vec![0.0]),
                    },
                };
                let x = value.scalar_f64().ok_or("`value` must hold one element")?;
                let n = tensor::count(&dims)?;
                let data = if value.dtype.is_float() {
                    Data::F(vec![x; n])
                } else {
                    Data::I(vec![x as i64; n])
                };
                self.cst(node, Const::new(value.dtype, dims, data)?)
            }
            "Range" => {
                let get = |i| -> R<std::rc::Rc<Const>> {
                    self.const_in(node, i)?
                        .ok_or_else(|| "missing input".to_string())
                };
                let (s, l, d) = (get(0)?, get(1)?, get(2)?);
                let (s0, l0, d0) = (
                    s.scalar_f64().ok_or("start must be a scalar")?,
                    l.scalar_f64().ok_or("limit must be a scalar")?,
                    d.scalar_f64().ok_or("delta must be a scalar")?,
                );
                if d0 == 0.0 {
                    return Err("Range with delta 0".to_string());
                }
                let n = ((l0 - s0) / d0).ceil().max(0.0);
                if n.is_nan() || n > (1u64 << 26) as f64 {
                    return Err(format!("Range of {n} elements is too large to fold"));
                }
                let n = n as usize;
                let data: Vec<f64> = (0..n).map(|k| s0 + k as f64 * d0).collect();
                let c = Const::new(s.dtype, vec![n], Data::F(data))?;
                self.cst(node, c.cast(s.dtype))
            }
            "Where" => self.where_(node),
            "Expand" => {
                let shape = self.const_in(node, 1)?.ok_or("missing shape")?;
                let x = self.req(node, 0)?;
                let want: Vec<usize> = shape.to_i64().iter().map(|&d| d.max(0) as usize).collect();
                let out = tensor::broadcast_shapes(&self.dims_of(&x), &want)?;
                match x {
                    Val::Const(c) => self.cst(node, tensor::expand(&c, &out)?),
                    Val::Ir(v) => {
                        let r = self.broadcast_to(v, &out)?;
                        self.out(node, r)
                    }
                }
            }
            "Reshape" => {
                let shape = self.const_in(node, 1)?.ok_or("missing shape")?;
                let x = self.req(node, 0)?;
                let dims = reshape_dims(
                    &self.dims_of(&x),
                    &shape.to_i64(),
                    at.int_or("allowzero", 0) != 0,
                )?;
                self.reshape_to(node, x, dims)
            }
            "Flatten" => {
                let x = self.req(node, 0)?;
                let d = self.dims_of(&x);
                let a = at.int_or("axis", 1);
                let a = if a < 0 { a + d.len() as i64 } else { a };
                if !(0..=d.len() as i64).contains(&a) {
                    return Err(format!("axis {a} is out of range for rank {}", d.len()));
                }
                let a = a as usize;
                self.reshape_to(node, x, vec![product(&d[..a]), product(&d[a..])])
            }
            "Unsqueeze" => {
                let x = self.req(node, 0)?;
                let raw = match at.ints("axes").filter(|a| !a.is_empty()) {
                    Some(a) => a.to_vec(),
                    None => self.const_in(node, 1)?.ok_or("missing axes")?.to_i64(),
                };
                let d = self.dims_of(&x);
                let axes = axes_sorted(&raw, d.len() + raw.len())?;
                let mut dims = d.clone();
                for &a in &axes {
                    dims.insert(a, 1);
                }
                self.reshape_to(node, x, dims)
            }
            "Squeeze" => {
                let x = self.req(node, 0)?;
                let d = self.dims_of(&x);
                let raw = match at.ints("axes").filter(|a| !a.is_empty()) {
                    Some(a) => Some(a.to_vec()),
                    None => self.const_in(node, 1)?.map(|c| c.to_i64()),
                };
                let axes = match raw {
                    Some(raw) => axes_sorted(&raw, d.len())?,
                    None => (0..d.len()).filter(|&i| d[i] == 1).collect(),
                };
                if let Some(&a) = axes.iter().find(|&&a| d[a] != 1) {
                    return Err(format!("cannot squeeze dim {a} of extent {}", d[a]));
                }
                let dims = (0..d.len())
                    .filter(|i| !axes.contains(i))
                    .map(|i| d[i])
                    .collect();
                self.reshape_to(node, x, dims)
            }
            "Transpose" => {
                let x = self.req(node, 0)?;
                let rank = self.dims_of(&x).len();
                let perm: Vec<usize> = match at.ints("perm") {
                    Some(p) => p.iter().map(|&a| axis(a, rank)).collect::<R<_>>()?,
                    None => (0..rank).rev().collect(),
                };
                let mut sorted = perm.clone();
                sorted.sort_unstable();
                if sorted != (0..rank).collect::<Vec<_>>() {
                    return Err(format!("perm {perm:?} is not a permutation of 0..{rank}"));
                }
                match x {
                    Val::Const(c) => self.cst(node, tensor::transpose(&c, &perm)?),
                    Val::Ir(v) if perm.iter().enumerate().all(|(i, &p)| i == p) => {
                        self.out(node, v)
                    }
                    Val::Ir(v) => {
                        let r = self
                            .b
                            .op(
                                OpKind::Transpose,
                                &[v],
                                Attrs::new().with("perm", ints(&perm)),
                            )
                            .map_err(b)?;
                        self.out(node, r)
                    }
                }
            }
            "Concat" => self.concat(node, &at, all_const),
            "Slice" => self.slice(node, &at),
            "Gather" => self.gather(node, &at),
            "GatherElements" => {
                let x = self.const_in(node, 0)?.ok_or("missing data")?;
                let i = self.const_in(node, 1)?.ok_or("missing indices")?;
                let a = axis(at.int_or("axis", 0), x.dims.len())?;
                self.cst(node, tensor::gather_elements(&x, &i, a)?)
            }
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
            | "ReduceL2" | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => {
                self.reduce(node, &at)
            }
            "Softmax" => self.softmax(node, &at),
            "LogSoftmax" | "Hardmax" => self.log_softmax_or_hardmax(node, op, &at),
            "RMSNormalization" => self.rms_norm(node, &at),
            "OneHot" => self.one_hot(node, &at),
            "LpNormalization" => self.lp_normalization(node, &at),
            "LpPool" => self.lp_pool(node, &at),
            "MatMul" => self.matmul(node),
            "Einsum" => self.einsum(node, &at),
            "Pad" => self.pad(node, &at),
            "ScatterND" => self.scatter_nd(node, &at),
            "Gemm" => self.gemm(node, &at),
            "Conv" => self.conv(node, &at),
            "MaxPool" | "AveragePool" => self.pool(node, &at),
            "GlobalAveragePool" | "GlobalMaxPool" => {
                let x = self.ir_in(node, 0)?;
                if self.b.ty(x).rank() != 4 {
                    return Err(format!("{op} supports 4-D input, found {}", self.b.ty(x)));
                }
                let v = if op == "GlobalAveragePool" {
                    self.b.op(OpKind::GlobalAvgpool, &[x], Attrs::new())
                } else {
                    self.b.op(
                        OpKind::ReduceMax,
                        &[x],
                        Attrs::new()
                            .with("axes", Attr::Ints(vec![2, 3]))
                            .with("keepdims", Attr::Bool(true)),
                    )
                }
                .map_err(b)?;
                self.out(node, v)
            }
            "BatchNormalization" => {
                if at.int_or("training_mode", 0) != 0 {
                    return Err("training_mode = 1 is not supported (inference only)".to_string());
                }
                let x = self.ir_in(node, 0)?;
                let xt = self.b.ty(x).clone();
                if xt.rank() < 2 {
                    return Err(format!("input must have rank >= 2, found {xt}"));
                }
                let mut ops = vec![x];
                for i in 1..5 {
                    let v = self.req(node, i)?;
                    ops.push(self.operand(
                        Self::in_name(node, i),
                        &v,
                        xt.dtype,
                        &[xt.dims()[1]],
                    )?);
                }
                let eps = at.float("epsilon").unwrap_or(1e-5) as f64;
                let v = self
                    .b
                    .op(
                        OpKind::Batchnorm,
                        &ops,
                        Attrs::new().with("epsilon", Attr::Float(eps)),
                    )
                    .map_err(b)?;
                self.out(node, v)
            }
            "LayerNormalization" => {
                let x = self.ir_in(node, 0)?;
                let xt = self.b.ty(x).clone();
                let a = axis(at.int_or("axis", -1), xt.rank())?;
                let norm = xt.dims()[a..].to_vec();
                let scale = self.req(node, 1)?;
                let scale = self.operand(Self::in_name(node, 1), &scale, xt.dtype, &norm)?;
                let bias = match self.get(node, 2)? {
                    Some(v) => self.operand(Self::in_name(node, 2), &v, xt.dtype, &norm)?,
                    None => self.splat(xt.dtype, 0.0, &norm)?,
                };
                let eps = at.float("epsilon").unwrap_or(1e-5) as f64;
                let v = self
                    .b
                    .op(
                        OpKind::Layernorm,
                        &[x, scale, bias],
                        Attrs::new()
                            .with("axis", Attr::Int(a as i64))
                            .with("epsilon", Attr::Float(eps)),
                    )
                    .map_err(b)?;
                self.set(node, 0, Val::Ir(v))?;
                self.layernorm_statistics(node, x, a, eps)
            }
            other => Err(format!("op `{other}` is not supported")),
        }
    }

    /// `Dropout` in inference: the identity, with an all-true mask. Training
    /// mode (the `training_mode` input from opset 12, `is_test = 0` before
    /// opset 7) with a ratio above 0 drops random elements, which an
    /// inference compiler does not do: refused, as is a `training_mode`
    /// known only at run time.
    fn dropout(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let x = self.req(node, 0)?;
        let (training, ratio) = if self.opset >= 12 {
            let training = match self.get(node, 2)? {
                None => false,
                Some(Val::Const(c)) => c.to_f64().iter().any(|&t| t != 0.0),
                Some(Val::Ir(_)) => {
                    return Err(format!(
                        "Dropout's training_mode input `{}` is computed at run time; dcir compiles \
                         inference graphs and needs it known at import time (false, or true with \
                         ratio 0)",
                        Self::in_name(node, 2)
                    ));
                }
            };
            let ratio = match self.get(node, 1)? {
                None => Some(0.5),
                Some(Val::Const(c)) => Some(
                    c.scalar_f64()
                        .ok_or("Dropout's ratio must hold one element")?,
                ),
                // Unknown, and only read in training mode.
                Some(Val::Ir(_)) => None,
            };
            (training, ratio)
        } else {
            // Before opset 7 `is_test = 0` (the default) is training mode;
            // opsets 7 to 11 define only inference.
            let training = self.opset < 7 && at.int_or("is_test", 0) == 0;
            (training, Some(at.float("ratio").map_or(0.5, f64::from)))
        };
        if training {
            match ratio {
                Some(0.0) => {}
                Some(r) => {
                    return Err(format!(
                        "Dropout in training mode with ratio {r} drops random elements; dcir \
                         compiles inference graphs only (training_mode false, or ratio 0)"
                    ));
                }
                None => {
                    return Err(format!(
                        "Dropout in training mode with the ratio `{}` computed at run time; dcir \
                         compiles inference graphs only (training_mode false, or ratio 0)",
                        Self::in_name(node, 1)
                    ));
                }
            }
        }
        if let Some(mask) = node
            .output
            .get(1)
            .filter(|m| self.used.contains(m.as_str()))
        {
            // Nothing is dropped: the mask is all true (bool from opset 10,
            // the input's type before).
            let dims = self.dims_of(&x);
            let dtype = if self.opset >= 10 {
                DType::Bool
            } else {
                self.dtype_of(&x)
            };
            let v = match &x {
                Val::Const(_) => {
                    let n = tensor::count(&dims)?;
                    let data = if dtype.is_float() {
                        Data::F(vec![1.0; n])
                    } else {
                        Data::I(vec![1; n])
                    };
                    Val::Const(Const::new(dtype, dims, data)?.into())
                }
                Val::Ir(_) => Val::Ir(self.splat(dtype, 1.0, &dims)?),
            };
            self.vals.insert(mask.as_str(), v);
        }
        self.set(node, 0, x)
    }

    fn unary_ir(&mut self, node: &'m NodeProto, kind: OpKind) -> R<()> {
        let x = self.ir_in(node, 0)?;
        let v = self.b.op(kind, &[x], Attrs::new()).map_err(b)?;
        self.out(node, v)
    }

    fn constant_attr(&self, at: &At<'_>) -> R<Const> {
        if let Some(t) = at.tensor("value") {
            return tensor::decode(t, None)?.ok_or_else(|| "`value` has no data".to_string());
        }
        if let Some(f) = at.float("value_float") {
            return Ok(Const {
                dtype: DType::F32,
                dims: vec![],
                data: Data::F(vec![f as f64]),
            });
        }
        if let Some(i) = at.int("value_int") {
            return Ok(Const {
                dtype: DType::I64,
                dims: vec![],
                data: Data::I(vec![i]),
            });
        }
        if let Some(a) = at.get("value_floats") {
            let v: Vec<f64> = a.floats.iter().map(|&x| x as f64).collect();
            return Ok(Const {
                dtype: DType::F32,
                dims: vec![v.len()],
                data: Data::F(v),
            });
        }
        if let Some(a) = at.get("value_ints") {
            return Ok(Const::ints(a.ints.clone()));
        }
        Err("Constant needs `value`, `value_float(s)` or `value_int(s)` (sparse and string values are not supported)".to_string())
    }

    fn binary(&mut self, node: &'m NodeProto, kind: OpKind, attrs: Attrs) -> R<ValueId> {
        let (x, y) = (self.req(node, 0)?, self.req(node, 1)?);
        let dtype = match (&x, &y) {
            (Val::Ir(a), _) => self.b.ty(*a).dtype,
            (_, Val::Ir(a)) if kind != OpKind::Pow => self.b.ty(*a).dtype,
            _ => self.dtype_of(&x),
        };
        let out = tensor::broadcast_shapes(&self.dims_of(&x), &self.dims_of(&y))?;
        // Pow's exponent may have another type than its base: cast to it.
        let y = match y {
            Val::Ir(e) if kind == OpKind::Pow && self.b.ty(e).dtype != dtype => {
                Val::Ir(self.b.cast(e, dtype).map_err(b)?)
            }
            y => y,
        };
        let xa = self.operand(Self::in_name(node, 0), &x, dtype, &out)?;
        let ya = self.operand(Self::in_name(node, 1), &y, dtype, &out)?;
        self.b.op(kind, &[xa, ya], attrs).map_err(b)
    }

    fn reshape_to(&mut self, node: &'m NodeProto, x: Val, dims: Vec<usize>) -> R<()> {
        match x {
            Val::Const(c) => self.cst(node, c.reshaped(dims)?),
            Val::Ir(v) if self.b.ty(v).dims() == dims => self.out(node, v),
            Val::Ir(v) => {
                let r = self.b.reshape(v, &dims).map_err(b)?;
                self.out(node, r)
            }
        }
    }

    fn clip(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let bound = |i: usize, attr: &str, d: f64| -> R<f64> {
            match self.const_in(node, i)? {
                Some(c) => c
                    .scalar_f64()
                    .ok_or_else(|| "Clip bounds must be scalars".to_string()),
                None => Ok(at.float(attr).map_or(d, |f| f as f64)),
            }
        };
        let lo = bound(1, "min", f64::NEG_INFINITY)?;
        let hi = bound(2, "max", f64::INFINITY)?;
        if let Val::Const(c) = self.req(node, 0)? {
            return self.cst(node, tensor::unary(&c, |x| x.max(lo).min(hi)));
        }
        let x = self.ir_in(node, 0)?;
        let v = if lo == 0.0 && hi == f64::INFINITY {
            self.b.op(OpKind::Relu, &[x], Attrs::new())
        } else {
            self.b.op(
                OpKind::Clip,
                &[x],
                Attrs::new()
                    .with("min", Attr::Float(lo))
                    .with("max", Attr::Float(hi)),
            )
        }
        .map_err(b)?;
        self.out(node, v)
    }

    fn where_(&mut self, node: &'m NodeProto) -> R<()> {
        let (c, x, y) = (self.req(node, 0)?, self.req(node, 1)?, self.req(node, 2)?);
        if let (Val::Const(cond), Val::Const(a), Val::Const(bb)) = (&c, &x, &y) {
            return self.cst(node, tensor::select(cond, a, bb)?);
        }
        let out = tensor::broadcast_shapes(
            &tensor::broadcast_shapes(&self.dims_of(&c), &self.dims_of(&x))?,
            &self.dims_of(&y),
        )?;
        let dtype = match (&x, &y) {
            (Val::Ir(v), _) | (_, Val::Ir(v)) => self.b.ty(*v).dtype,
            _ => self.dtype_of(&x),
        };
        // A condition known at import and the same everywhere picks a side.
        if let Val::Const(cond) = &c
            && let Some(pick) = cond.splat()
        {
            let (i, chosen) = if pick != 0.0 { (1, &x) } else { (2, &y) };
            let v = self.operand(Self::in_name(node, i), chosen, dtype, &out)?;
            return self.out(node, v);
        }
        let cv = self.operand(Self::in_name(node, 0), &c, DType::Bool, &out)?;
        let xv = self.operand(Self::in_name(node, 1), &x, dtype, &out)?;
        let yv = self.operand(Self::in_name(node, 2), &y, dtype, &out)?;
        let v = self
            .b
            .op(OpKind::Select, &[cv, xv, yv], Attrs::new())
            .map_err(b)?;
        self.out(node, v)
    }

    fn concat(&mut self, node: &'m NodeProto, at: &At<'_>, all_const: bool) -> R<()> {
        let vals: Vec<Val> = (0..node.input.len())
            .filter_map(|i| self.get(node, i).transpose())
            .collect::<R<_>>()?;
        let first = vals.first().ok_or("Concat needs at least one input")?;
        let rank = self.dims_of(first).len();
        let a = axis(at.int("axis").ok_or("Concat needs `axis`")?, rank)?;
        if all_const {
            let cs: Vec<std::rc::Rc<Const>> = vals
                .iter()
                .map(|v| match v {
                    Val::Const(c) => c.clone(),
                    Val::Ir(_) => unreachable_const(),
                })
                .collect();
            let refs: Vec<&Const> = cs.iter().map(|c| c.as_ref()).collect();
            return self.cst(node, tensor::concat(&refs, a)?);
        }
        let dtype = vals
            .iter()
            .find_map(|v| match v {
                Val::Ir(id) => Some(self.b.ty(*id).dtype),
                Val::Const(_) => None,
            })
            .unwrap_or(DType::F32);
        let mut ops = Vec::new();
        for (i, v) in vals.iter().enumerate() {
            // Zero-extent pieces add nothing; dcir values may not be empty pieces of a concat.
            let dims = self.dims_of(v);
            if dims.get(a) == Some(&0) {
                continue;
            }
            ops.push(self.operand(Self::in_name(node, i), v, dtype, &dims)?);
        }
        let v = if ops.len() == 1 {
            ops[0]
        } else {
            self.b
                .op(
                    OpKind::Concat,
                    &ops,
                    Attrs::new().with("axis", Attr::Int(a as i64)),
                )
                .map_err(b)?
        };
        self.out(node, v)
    }

    fn slice(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let x = self.req(node, 0)?;
        let dims = self.dims_of(&x);
        let rank = dims.len();
        let (starts, ends, axes, steps) = if let Some(s) = at.ints("starts") {
            (
                s.to_vec(),
                at.ints("ends").ok_or("Slice needs `ends`")?.to_vec(),
                at.ints("axes").map(<[i64]>::to_vec),
                None,
            )
        } else {
            let get =
                |i| -> R<Option<Vec<i64>>> { Ok(self.const_in(node, i)?.map(|c| c.to_i64())) };
            (
                get(1)?.ok_or("Slice needs starts")?,
                get(2)?.ok_or("Slice needs ends")?,
                get(3)?,
                get(4)?,
            )
        };
        let axes = match axes {
            Some(a) => a.iter().map(|&a| axis(a, rank)).collect::<R<Vec<_>>>()?,
            None if starts.len() <= rank => (0..starts.len()).collect(),
            None => {
                return Err(format!(
                    "Slice has {} starts for an input of rank {rank}",
                    starts.len()
                ));
            }
        };
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err("Slice starts, ends, axes and steps differ in length".to_string());
        }
        // Per dim: (first index, step, count).
        let mut ranges: Vec<(i64, i64, usize)> = dims.iter().map(|&d| (0, 1, d)).collect();
        for k in 0..starts.len() {
            let d = dims[axes[k]] as i64;
            let step = steps[k];
            if step == 0 || step == i64::MIN {
                return Err(format!("Slice step {step}"));
            }
            let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
            let (s, e) = (norm(starts[k]), norm(ends[k]));
            let (s, e) = if step > 0 {
                (s.clamp(0, d), e.clamp(0, d))
            } else {
                (s.clamp(-1, d - 1), e.clamp(-1, d - 1))
            };
            let n = if step > 0 {
                if e > s { (e - s - 1) / step + 1 } else { 0 }
            } else if s > e {
                (s - e - 1) / (-step) + 1
            } else {
                0
            };
            ranges[axes[k]] = (s, step, n as usize);
        }
        match x {
            Val::Const(c) => self.cst(node, tensor::slice(&c, &ranges)?),
            Val::Ir(v) => {
                if ranges
                    .iter()
                    .enumerate()
                    .all(|(i, r)| r.0 == 0 && r.1 == 1 && r.2 == dims[i])
                {
                    return self.out(node, v);
                }
                if ranges.iter().any(|r| r.1 < 0) {
                    return Err(
                        "Slice with a negative step on a run-time value is not supported"
                            .to_string(),
                    );
                }
                let starts: Vec<i64> = ranges.iter().map(|r| r.0).collect();
                let ends: Vec<i64> = ranges
                    .iter()
                    .map(|r| {
                        if r.2 == 0 {
                            r.0
                        } else {
                            r.0 + (r.2 as i64 - 1) * r.1 + 1
                        }
                    })
                    .collect();
                let steps: Vec<i64> = ranges.iter().map(|r| r.1).collect();
                let mut attrs = Attrs::new()
                    .with("starts", Attr::Ints(starts))
                    .with("ends", Attr::Ints(ends));
                if steps.iter().any(|&s| s != 1) {
                    attrs.set("steps", Attr::Ints(steps));
                }
                let r = self.b.op(OpKind::Slice, &[v], attrs).map_err(b)?;
                self.out(node, r)
            }
        }
    }

    fn gather(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let x = self.req(node, 0)?;
        let idx = self.req(node, 1)?;
        let rank = self.dims_of(&x).len();
        let a = axis(at.int_or("axis", 0), rank)?;
        let extent = self.dims_of(&x)[a];
        match (&x, &idx) {
            (Val::Const(c), Val::Const(i)) => self.cst(node, tensor::gather(c, i, a)?),
            // One index (a scalar): a slice of extent 1 with that dim
            // dropped, views the kernels read in place (Q, K and V out of
            // one projection, as exporters write attention).
            (_, Val::Const(i)) if i.dims.is_empty() && i.len() == 1 => {
                let raw = i.to_i64()[0];
                let j = if raw < 0 { raw + extent as i64 } else { raw };
                if !(0..extent as i64).contains(&j) {
                    return Err(format!("index {raw} is out of range for extent {extent}"));
                }
                let data = self.ir(Self::in_name(node, 0), &x)?;
                let dims = self.b.ty(data).dims().to_vec();
                let mut starts = vec![0i64; rank];
                let mut ends: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
                (starts[a], ends[a]) = (j, j + 1);
                let sliced = self
                    .b
                    .op(
                        OpKind::Slice,
                        &[data],
                        Attrs::new()
                            .with("starts", Attr::Ints(starts))
                            .with("ends", Attr::Ints(ends)),
                    )
                    .map_err(b)?;
                let mut out = dims;
                out.remove(a);
                let v = self.b.reshape(sliced, &out).map_err(b)?;
                self.out(node, v)
            }
            _ => {
                let data = self.ir(Self::in_name(node, 0), &x)?;
                let indices = match &idx {
                    Val::Ir(v) => {
                        if !self.b.ty(*v).dtype.is_int() {
                            return Err(format!(
                                "indices must be integers, found {}",
                                self.b.ty(*v)
                            ));
                        }
                        *v
                    }
                    Val::Const(c) => {
                        let mut norm = Vec::with_capacity(c.len());
                        for i in c.to_i64() {
                            let j = if i < 0 { i + extent as i64 } else { i };
                            if !(0..extent as i64).contains(&j) {
                                return Err(format!(
                                    "index {i} is out of range for extent {extent}"
                                ));
                            }
                            norm.push(j);
                        }
                        let c2 = Const {
                            dtype: DType::I64,
                            dims: c.dims.clone(),
                            data: Data::I(norm),
                        };
                        let key = format!("{}#norm", Self::in_name(node, 1));
                        self.materialize(&key, &c2, DType::I64, &c2.dims.clone())?
                    }
                };
                let v = self
                    .b
                    .op(
                        OpKind::Gather,
                        &[data, indices],
                        Attrs::new().with("axis", Attr::Int(a as i64)),
                    )
                    .map_err(b)?;
                self.out(node, v)
            }
        }
    }

    fn reduce(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let op = node.op_type.as_deref().unwrap_or("");
        let x = self.ir_in(node, 0)?;
        let rank = self.b.ty(x).rank();
        let raw = match at.ints("axes") {
            Some(a) => Some(a.to_vec()),
            None => self.const_in(node, 1)?.map(|c| c.to_i64()),
        };
        let keep = at.int_or("keepdims", 1) != 0;
        let axes = match raw {
            Some(r) if !r.is_empty() => axes_sorted(&r, rank)?,
            _ if at.int_or("noop_with_empty_axes", 0) != 0 => return self.out(node, x),
            _ => (0..rank).collect(),
        };
        if axes.is_empty() {
            return self.out(node, x);
        }
        let kind = match op {
            "ReduceMean" => OpKind::ReduceMean,
            "ReduceMax" | "ReduceMin" => OpKind::ReduceMax,
            "ReduceProd" => OpKind::ReduceProd,
            _ => OpKind::ReduceSum,
        };
        // The others as a function before and after a sum or a maximum:
        // min = -max(-x) (for integers ~max(~x), ~x = -x - 1 wrapping, which
        // reverses the order with no overflow), L1 = sum |x|, L2 = sqrt(sum x²), SumSquare =
        // sum x², LogSum = log(sum x), LogSumExp = log(sum exp x) (ONNX's
        // formulas, without a max shift). Bools reduce as 0/1 integers.
        let boolean = self.b.ty(x).dtype == DType::Bool;
        let x = if boolean {
            self.b.cast(x, DType::I32).map_err(b)?
        } else {
            x
        };
        let src = match op {
            "ReduceMin" => self.reversed(x)?,
            "ReduceL1" => self.ew(OpKind::Abs, &[x])?,
            "ReduceL2" | "ReduceSumSquare" => self.ew(OpKind::Mul, &[x, x])?,
            "ReduceLogSumExp" => self.ew(OpKind::Exp, &[x])?,
            _ => x,
        };
        let mut v = self
            .b
            .op(
                kind,
                &[src],
                Attrs::new()
                    .with("axes", ints(&axes))
                    .with("keepdims", Attr::Bool(keep)),
            )
            .map_err(b)?;
        v = match op {
            "ReduceMin" => self.reversed(v)?,
            "ReduceL2" => self.ew(OpKind::Sqrt, &[v])?,
            "ReduceLogSum" | "ReduceLogSumExp" => self.ew(OpKind::Log, &[v])?,
            _ => v,
        };
        if boolean {
            v = self.b.cast(v, DType::Bool).map_err(b)?;
        }
        self.out(node, v)
    }

    fn softmax(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let x = self.ir_in(node, 0)?;
        let dims = self.b.ty(x).dims().to_vec();
        let rank = dims.len();
        let default = if self.opset >= 13 { -1 } else { 1 };
        let a = axis(at.int_or("axis", default), rank)?;
        let softmax = |s: &mut Self, v: ValueId, a: usize| {
            s.b.op(
                OpKind::Softmax,
                &[v],
                Attrs::new().with("axis", Attr::Int(a as i64)),
            )
            .map_err(b)
        };
        let v = if self.opset >= 13 || a == rank - 1 {
            softmax(self, x, a)?
        } else {
            // Before opset 13, softmax normalizes the flattened trailing dims.
            let flat = self
                .b
                .reshape(x, &[product(&dims[..a]), product(&dims[a..])])
                .map_err(b)?;
            let s = softmax(self, flat, 1)?;
            self.b.reshape(s, &dims).map_err(b)?
        };
        self.out(node, v)
    }

    fn matmul(&mut self, node: &'m NodeProto) -> R<()> {
        let (x, y) = (self.req(node, 0)?, self.req(node, 1)?);
        let dtype = match (&x, &y) {
            (Val::Ir(v), _) | (_, Val::Ir(v)) => self.b.ty(*v).dtype,
            _ => self.dtype_of(&x),
        };
        let (ad, bd) = (self.dims_of(&x), self.dims_of(&y));
        let a = self.operand(Self::in_name(node, 0), &x, dtype, &ad)?;
        let bb = self.operand(Self::in_name(node, 1), &y, dtype, &bd)?;
        if ad.is_empty() || bd.is_empty() {
            return Err("MatMul needs operands of rank >= 1".to_string());
        }
        // Vectors become matrices, and the added dim is dropped at the end.
        let (a, a_vec) = if ad.len() == 1 {
            (self.b.reshape(a, &[1, ad[0]]).map_err(b)?, true)
        } else {
            (a, false)
        };
        let (bb, b_vec) = if bd.len() == 1 {
            (self.b.reshape(bb, &[bd[0], 1]).map_err(b)?, true)
        } else {
            (bb, false)
        };
        let (ad, bd) = (self.b.ty(a).dims().to_vec(), self.b.ty(bb).dims().to_vec());
        let (ra, rb) = (ad.len(), bd.len());
        let (m, k) = (ad[ra - 2], ad[ra - 1]);
        let n = bd[rb - 1];
        if bd[rb - 2] != k {
            return Err(format!("MatMul of {ad:?} and {bd:?}: inner dims differ"));
        }
        let batch_a = &ad[..ra - 2];
        let batch_b = &bd[..rb - 2];
        let (v, batch) = if rb == 2 && ra > 2 {
            // [.., M, K] x [K, N]: fold the batch into rows, keeping the weight unbroadcast.
            let rows = product(batch_a) * m;
            let flat = self.b.reshape(a, &[rows, k]).map_err(b)?;
            let mm = self
                .b
                .op(OpKind::Matmul, &[flat, bb], Attrs::new())
                .map_err(b)?;
            (mm, batch_a.to_vec())
        } else {
            let batch = tensor::broadcast_shapes(batch_a, batch_b)?;
            let mut sa = batch.clone();
            sa.extend([m, k]);
            let mut sb = batch.clone();
            sb.extend([k, n]);
            let a2 = self.broadcast_to(a, &sa)?;
            let b2 = self.broadcast_to(bb, &sb)?;
            let mm = self
                .b
                .op(OpKind::Matmul, &[a2, b2], Attrs::new())
                .map_err(b)?;
            (mm, batch)
        };
        let mut out = batch;
        if !a_vec {
            out.push(m);
        }
        if !b_vec {
            out.push(n);
        }
        let v = if self.b.ty(v).dims() == out {
            v
        } else {
            self.b.reshape(v, &out).map_err(b)?
        };
        self.out(node, v)
    }

    /// `Einsum` of one or two operands, with an explicit or implicit output
    /// and `...` for leading dims. A letter of one operand that is neither
    /// in the other nor in the output is summed out first; one operand is
    /// then a transpose; two are one batched matmul `[batch, free_a,
    /// contracted] × [batch, contracted, free_b]` between transposes and
    /// reshapes. A letter repeated within an operand (a diagonal) is refused.
    fn einsum(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let eq = at.string("equation").ok_or("Einsum needs `equation`")?;
        let unsupported = |why: &str| format!("Einsum equation `{eq}` is not supported: {why}");
        let compact: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match compact.split_once("->") {
            Some((l, r)) => (l.to_string(), Some(r.to_string())),
            None => (compact.clone(), None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        if !(1..=2).contains(&terms.len()) || terms.len() != node.input.len() {
            return Err(unsupported(&format!(
                "{} operand(s) in the equation, {} inputs (one or two are supported)",
                terms.len(),
                node.input.len()
            )));
        }
        let vals: Vec<Val> = (0..terms.len())
            .map(|k| self.req(node, k))
            .collect::<R<_>>()?;
        let dtype = match vals.iter().find_map(|v| match v {
            Val::Ir(v) => Some(*v),
            Val::Const(_) => None,
        }) {
            Some(v) => self.b.ty(v).dtype,
            None => self.dtype_of(&vals[0]),
        };
        // Each operand's letters, `...` spelled out as private letters
        // (aligned right across operands, as numpy broadcasts).
        let ellipsis = |k: usize| char::from_u32(0xE000 + k as u32).unwrap_or('\u{E000}');
        let spell = |term: &str, rank: usize, lead: usize| -> R<Vec<char>> {
            let letters = |t: &str| -> R<Vec<char>> {
                if let Some(c) = t.chars().find(|c| !c.is_ascii_alphabetic()) {
                    return Err(unsupported(&format!("`{c}` is not a letter")));
                }
                Ok(t.chars().collect())
            };
            match term.split_once("...") {
                None => letters(term),
                Some((before, after)) => {
                    let (before, after) = (letters(before)?, letters(after)?);
                    let e = rank
                        .checked_sub(before.len() + after.len())
                        .ok_or_else(|| unsupported("an operand has fewer dims than letters"))?;
                    let mut out = before;
                    out.extend((lead - e..lead).map(ellipsis));
                    out.extend(after);
                    Ok(out)
                }
            }
        };
        let ranks: Vec<usize> = vals.iter().map(|v| self.dims_of(v).len()).collect();
        // The most dims any `...` stands for.
        let lead = terms
            .iter()
            .zip(&ranks)
            .filter(|(t, _)| t.contains("..."))
            .map(|(t, &r)| r.saturating_sub(t.replace("...", "").len()))
            .max()
            .unwrap_or(0);
        let mut spelled = Vec::new();
        for (t, &r) in terms.iter().zip(&ranks) {
            let letters = spell(t, r, lead)?;
            if letters.len() != r {
                return Err(unsupported(&format!(
                    "term `{t}` has {} letters for an operand of rank {r}",
                    letters.len()
                )));
            }
            let mut sorted = letters.clone();
            sorted.sort_unstable();
            if sorted.windows(2).any(|w| w[0] == w[1]) {
                return Err(unsupported(
                    "a letter repeats within an operand (a diagonal)",
                ));
            }
            spelled.push(letters);
        }
        let out: Vec<char> = match &rhs {
            Some(r) => spell(r, lead + r.replace("...", "").len(), lead)?,
            None => {
                // Implicit: the `...` dims, then the letters used once, sorted.
                let all: Vec<char> = spelled.iter().flatten().copied().collect();
                let mut once: Vec<char> = all
                    .iter()
                    .copied()
                    .filter(|c| {
                        c.is_ascii_alphabetic() && all.iter().filter(|d| *d == c).count() == 1
                    })
                    .collect();
                once.sort_unstable();
                (0..lead).map(ellipsis).chain(once).collect()
            }
        };
        // Every letter's extent, the same wherever it appears.
        let mut extent: BTreeMap<char, usize> = BTreeMap::new();
        for (letters, v) in spelled.iter().zip(&vals) {
            for (&c, &d) in letters.iter().zip(&self.dims_of(v)) {
                if *extent.entry(c).or_insert(d) != d {
                    return Err(format!(
                        "Einsum `{eq}`: a letter has extents {} and {d}",
                        extent[&c]
                    ));
                }
            }
        }
        let mut seen = BTreeSet::new();
        if let Some(c) = out
            .iter()
            .find(|c| !extent.contains_key(c) || !seen.insert(**c))
        {
            return Err(unsupported(&format!(
                "output letter `{c}` is repeated or in no operand"
            )));
        }
        let mut ops = Vec::new();
        for (k, v) in vals.iter().enumerate() {
            let dims = self.dims_of(v);
            let x = self.operand(Self::in_name(node, k), v, dtype, &dims)?;
            // Sum out the letters of this operand only.
            let others: Vec<char> = spelled
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != k)
                .flat_map(|(_, l)| l.clone())
                .collect();
            let (kept, summed): (Vec<usize>, Vec<usize>) = (0..dims.len())
                .partition(|&d| out.contains(&spelled[k][d]) || others.contains(&spelled[k][d]));
            let x = if summed.is_empty() {
                x
            } else {
                let attrs = Attrs::new()
                    .with("axes", ints(&summed))
                    .with("keepdims", Attr::Bool(false));
                self.b.op(OpKind::ReduceSum, &[x], attrs).map_err(b)?
            };
            ops.push((
                x,
                kept.iter().map(|&d| spelled[k][d]).collect::<Vec<char>>(),
            ));
        }
        let v = match &ops[..] {
            [(x, letters)] => self.permute(*x, letters, &out)?,
            [a, bv] => self.einsum_product(a, bv, &out, &extent)?,
            _ => unreachable!("one or two operands"),
        };
        self.out(node, v)
    }

    /// The product of two Einsum operands (each a value and its dims'
    /// letters, every letter in the other operand or in `out`), as one
    /// `matmul` `[batch, free_a, contracted] × [batch, contracted, free_b]`.
    /// With one letter in each of free_a, free_b and contracted the operands
    /// keep their dims and a transposed one is read through `transpose_a/b`
    /// (and the operands swap when `out` ends `free_b, free_a`); otherwise
    /// each group is `reshape`d into one dim.
    fn einsum_product(
        &mut self,
        (a, la): &(ValueId, Vec<char>),
        (bv, lb): &(ValueId, Vec<char>),
        out: &[char],
        extent: &BTreeMap<char, usize>,
    ) -> R<ValueId> {
        let in_order = |keep: &dyn Fn(char) -> bool, order: &[char]| -> Vec<char> {
            order.iter().copied().filter(|&c| keep(c)).collect()
        };
        let batch = in_order(&|c| la.contains(&c) && lb.contains(&c), out);
        let contracted = in_order(&|c| lb.contains(&c) && !out.contains(&c), la);
        let free_a = in_order(&|c| la.contains(&c) && !lb.contains(&c), out);
        let free_b = in_order(&|c| lb.contains(&c) && !la.contains(&c), out);
        let joined = |parts: &[&[char]]| parts.concat();
        if free_a.len() == 1 && free_b.len() == 1 && contracted.len() == 1 {
            // out[.., i, j] = a[.., i, k] b[.., k, j]; out[.., j, i] = b[.., j, k] a[.., k, i].
            let swap = out == joined(&[&batch, &free_b, &free_a]).as_slice();
            let ((x, lx, fx), (y, ly, fy)) = if swap {
                ((*bv, lb, &free_b), (*a, la, &free_a))
            } else {
                ((*a, la, &free_a), (*bv, lb, &free_b))
            };
            let (x, tx) = self.matmul_operand(x, lx, &batch, fx, &contracted)?;
            let (y, ty) = self.matmul_operand(y, ly, &batch, &contracted, fy)?;
            let mut attrs = Attrs::new();
            if tx {
                attrs.set("transpose_a", Attr::Bool(true));
            }
            if ty {
                attrs.set("transpose_b", Attr::Bool(true));
            }
            let product = self.b.op(OpKind::Matmul, &[x, y], attrs).map_err(b)?;
            return self.permute(product, &joined(&[&batch, fx, fy]), out);
        }
        let size = |cs: &[char]| cs.iter().map(|c| extent[c]).product::<usize>();
        let (bs, m, kk, n) = (
            size(&batch),
            size(&free_a),
            size(&contracted),
            size(&free_b),
        );
        let lhs = self.permute(*a, la, &joined(&[&batch, &free_a, &contracted]))?;
        let rhs = self.permute(*bv, lb, &joined(&[&batch, &contracted, &free_b]))?;
        let (lhs, rhs) = if batch.is_empty() {
            (
                self.b.reshape(lhs, &[m, kk]).map_err(b)?,
                self.b.reshape(rhs, &[kk, n]).map_err(b)?,
            )
        } else {
            (
                self.b.reshape(lhs, &[bs, m, kk]).map_err(b)?,
                self.b.reshape(rhs, &[bs, kk, n]).map_err(b)?,
            )
        };
        let product = self
            .b
            .op(OpKind::Matmul, &[lhs, rhs], Attrs::new())
            .map_err(b)?;
        let order = joined(&[&batch, &free_a, &free_b]);
        let dims: Vec<usize> = order.iter().map(|c| extent[c]).collect();
        let product = self.b.reshape(product, &dims).map_err(b)?;
        self.permute(product, &order, out)
    }

    /// A matmul operand whose dims (`letters`) should read `[batch, rows,
    /// cols]`: itself when they do, itself read transposed (`true`) when they
    /// read `[batch, cols, rows]`, else transposed into order.
    fn matmul_operand(
        &mut self,
        x: ValueId,
        letters: &[char],
        batch: &[char],
        rows: &[char],
        cols: &[char],
    ) -> R<(ValueId, bool)> {
        let plain = [batch, rows, cols].concat();
        if letters == [batch, cols, rows].concat().as_slice() && letters != plain.as_slice() {
            return Ok((x, true));
        }
        Ok((self.permute(x, letters, &plain)?, false))
    }

    /// `x`, whose dims are named `from`, transposed so that they read `to`
    /// (the same letters); `x` itself when they already do.
    fn permute(&mut self, x: ValueId, from: &[char], to: &[char]) -> R<ValueId> {
        if from == to {
            return Ok(x);
        }
        let perm: Vec<usize> = to
            .iter()
            .map(|c| {
                from.iter()
                    .position(|d| d == c)
                    .ok_or_else(|| "Einsum: a letter is missing".to_string())
            })
            .collect::<R<_>>()?;
        self.b
            .op(
                OpKind::Transpose,
                &[x],
                Attrs::new().with("perm", ints(&perm)),
            )
            .map_err(b)
    }

    /// `ScatterND` (`reduction = none`) with known indices and updates: folded
    /// when the data is known too; on run-time data, only rows of dim 0 may be
    /// replaced (the last indices dim is 1), lowered to `slice`s of the data and
    /// known update rows joined by a `concat`.
    fn scatter_nd(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let reduction = at.string("reduction").unwrap_or_else(|| "none".to_string());
        if reduction != "none" {
            return Err(format!(
                "ScatterND reduction `{reduction}` is not supported"
            ));
        }
        let known = |i: usize, what: &str| -> R<std::rc::Rc<Const>> {
            self.const_in(node, i)
                .map_err(|e| {
                    format!("ScatterND is supported only with {what} known at import time: {e}")
                })?
                .ok_or_else(|| format!("ScatterND is missing its {what}"))
        };
        let idx = known(1, "indices")?;
        let upd = known(2, "updates")?;
        let data = self.req(node, 0)?;
        let v = match data {
            Val::Const(c) => return self.cst(node, tensor::scatter_nd(&c, &idx, &upd)?),
            Val::Ir(v) => v,
        };
        let ty = self.b.ty(v).clone();
        let dims = ty.dims().to_vec();
        if dims.is_empty() || idx.dims.last() != Some(&1) {
            return Err(format!(
                "ScatterND on a run-time value is supported only when it replaces rows of dim 0 \
                 (indices of shape [.., 1]); found indices {:?} for data {ty}",
                idx.dims
            ));
        }
        let rows = idx.len();
        let mut want = idx.dims[..idx.dims.len() - 1].to_vec();
        want.extend_from_slice(&dims[1..]);
        if upd.dims != want {
            return Err(format!(
                "ScatterND updates have shape {:?}, expected {want:?}",
                upd.dims
            ));
        }
        let mut flat_dims = vec![rows];
        flat_dims.extend_from_slice(&dims[1..]);
        let upd = upd.reshaped(flat_dims)?.cast(ty.dtype);
        // For each row of the data, the update row that replaces it.
        let mut src: Vec<Option<usize>> = vec![None; dims[0]];
        for (u, &i) in idx.to_i64().iter().enumerate() {
            let r = axis(i, dims[0]).map_err(|_| {
                format!("ScatterND index {i} is out of range for extent {}", dims[0])
            })?;
            if src[r].replace(u).is_some() {
                return Err(format!("ScatterND indices repeat row {i}"));
            }
        }
        let mut pieces = Vec::new();
        let mut a = 0;
        while a < dims[0] {
            let mut e = a + 1;
            while e < dims[0] && src[e].is_some() == src[a].is_some() {
                e += 1;
            }
            let piece = if src[a].is_some() {
                let pick: Vec<i64> = src[a..e].iter().map(|u| u.unwrap_or(0) as i64).collect();
                let c = tensor::gather(&upd, &Const::ints(pick), 0)?;
                let key = format!(
                    "{}#scatter{a}",
                    node.output.first().map_or("", String::as_str)
                );
                let cd = c.dims.clone();
                self.materialize(&key, &c, ty.dtype, &cd)?
            } else if a == 0 && e == dims[0] {
                v
            } else {
                let mut starts = vec![0i64; dims.len()];
                let mut ends: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
                starts[0] = a as i64;
                ends[0] = e as i64;
                self.b
                    .op(
                        OpKind::Slice,
                        &[v],
                        Attrs::new()
                            .with("starts", Attr::Ints(starts))
                            .with("ends", Attr::Ints(ends)),
                    )
                    .map_err(b)?
            };
            pieces.push(piece);
            a = e;
        }
        let r = if pieces.len() == 1 {
            pieces[0]
        } else {
            self.b
                .op(
                    OpKind::Concat,
                    &pieces,
                    Attrs::new().with("axis", Attr::Int(0)),
                )
                .map_err(b)?
        };
        self.out(node, r)
    }

    /// `Pad` in `constant` mode with pads known at import time.
    fn pad(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let mode = at.string("mode").unwrap_or_else(|| "constant".to_string());
        if mode != "constant" {
            return Err(format!(
                "Pad mode `{mode}` is not supported (only `constant`)"
            ));
        }
        let x = self.req(node, 0)?;
        let dims = self.dims_of(&x);
        let rank = dims.len();
        let (pads, value) = if self.opset < 11 {
            let p = at.ints("pads").ok_or("Pad needs `pads`")?.to_vec();
            (p, at.float("value").map_or(0.0, f64::from))
        } else {
            let p = self
                .const_in(node, 1)
                .map_err(|e| format!("Pad needs pads known at import time: {e}"))?
                .ok_or("Pad needs `pads`")?
                .to_i64();
            let v = match self
                .const_in(node, 2)
                .map_err(|e| format!("Pad needs a constant_value known at import time: {e}"))?
            {
                Some(c) => c
                    .scalar_f64()
                    .ok_or("Pad constant_value must hold one element")?,
                None => 0.0,
            };
            (p, v)
        };
        let axes: Vec<usize> = match self
            .const_in(node, 3)
            .map_err(|e| format!("Pad needs axes known at import time: {e}"))?
        {
            Some(c) => c
                .to_i64()
                .iter()
                .map(|&a| axis(a, rank))
                .collect::<R<_>>()?,
            None => (0..rank).collect(),
        };
        if pads.len() != 2 * axes.len() {
            return Err(format!(
                "Pad needs {} pads for {} axes, found {pads:?}",
                2 * axes.len(),
                axes.len()
            ));
        }
        let (mut low, mut high) = (vec![0usize; rank], vec![0usize; rank]);
        let n = axes.len();
        for (q, &a) in axes.iter().enumerate() {
            let (l, h) = (pads[q], pads[q + n]);
            if l < 0 || h < 0 {
                return Err(format!("Pad with negative pads {pads:?} is not supported"));
            }
            low[a] = usize::try_from(l).map_err(|_| "pad too large")?;
            high[a] = usize::try_from(h).map_err(|_| "pad too large")?;
        }
        match x {
            Val::Const(c) => self.cst(node, tensor::pad(&c, &low, &high, value)?),
            Val::Ir(v) if low.iter().chain(&high).all(|&p| p == 0) => self.out(node, v),
            Val::Ir(v) => {
                let r = self
                    .b
                    .op(
                        OpKind::Pad,
                        &[v],
                        Attrs::new()
                            .with("low", ints(&low))
                            .with("high", ints(&high))
                            .with("value", Attr::Float(value)),
                    )
                    .map_err(b)?;
                self.out(node, r)
            }
        }
    }

    fn gemm(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let a = self.ir_in(node, 0)?;
        let dtype = self.b.ty(a).dtype;
        let y = self.req(node, 1)?;
        let bd = self.dims_of(&y);
        let bb = self.operand(Self::in_name(node, 1), &y, dtype, &bd)?;
        let (ta, tb) = (at.int_or("transA", 0) != 0, at.int_or("transB", 0) != 0);
        let alpha = at.float("alpha").unwrap_or(1.0) as f64;
        let beta = at.float("beta").unwrap_or(1.0) as f64;
        let mut attrs = Attrs::new();
        if ta {
            attrs.set("transpose_a", Attr::Bool(true));
        }
        if tb {
            attrs.set("transpose_b", Attr::Bool(true));
        }
        let mut v = self.b.op(OpKind::Matmul, &[a, bb], attrs).map_err(b)?;
        let out = self.b.ty(v).dims().to_vec();
        if alpha != 1.0 {
            let s = self.splat(dtype, alpha, &out)?;
            v = self.b.op(OpKind::Mul, &[v, s], Attrs::new()).map_err(b)?;
        }
        if let Some(c) = self.get(node, 2)?
            && beta != 0.0
        {
            let mut c = self.operand(Self::in_name(node, 2), &c, dtype, &out)?;
            if beta != 1.0 {
                let s = self.splat(dtype, beta, &out)?;
                c = self.b.op(OpKind::Mul, &[c, s], Attrs::new()).map_err(b)?;
            }
            v = self.b.op(OpKind::Add, &[v, c], Attrs::new()).map_err(b)?;
        }
        self.out(node, v)
    }

    /// Pads `[begin_0, .., begin_n-1, end_0, .., end_n-1]` of an
    /// `n`-D window (`n = input.len()`) from `pads`/`auto_pad`.
    fn pads(
        at: &At<'_>,
        input: &[usize],
        kernel: &[i64],
        stride: &[i64],
        dilation: &[i64],
    ) -> R<Vec<i64>> {
        let n = input.len();
        let auto = at
            .string("auto_pad")
            .unwrap_or_else(|| "NOTSET".to_string());
        match auto.as_str() {
            "NOTSET" | "" => match at.ints("pads") {
                None => Ok(vec![0; 2 * n]),
                Some(p) if p.len() == 2 * n => Ok(p.to_vec()),
                Some(p) => Err(format!(
                    "`pads` needs {} entries for a {n}-D window, found {p:?}",
                    2 * n
                )),
            },
            "VALID" => Ok(vec![0; 2 * n]),
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut p = vec![0; 2 * n];
                for d in 0..n {
                    let i = i64::try_from(input[d])
                        .ok()
                        .filter(|&i| i <= 1 << 40)
                        .ok_or("the input is too large")?;
                    let out = (i + stride[d] - 1) / stride[d];
                    let span = dilation[d] * (kernel[d] - 1) + 1;
                    let total = ((out - 1) * stride[d] + span - i).max(0);
                    let (small, big) = (total / 2, total - total / 2);
                    if auto == "SAME_UPPER" {
                        p[d] = small;
                        p[d + n] = big;
                    } else {
                        p[d] = big;
                        p[d + n] = small;
                    }
                }
                Ok(p)
            }
            other => Err(format!("auto_pad `{other}` is not supported")),
        }
    }

    /// A per-spatial-dim attribute of an `n`-D window (`d` each when absent).
    fn window_attr(at: &At<'_>, name: &str, n: usize, d: i64) -> R<Vec<i64>> {
        match at.ints(name) {
            None | Some([]) => Ok(vec![d; n]),
            Some(v) if v.len() == n => Ok(v.to_vec()),
            Some(v) => Err(format!(
                "`{name}` needs {n} entries for a {n}-D window, found {v:?}"
            )),
        }
    }

    /// Conv over 1 or 2 spatial dims; a 1-D convolution is the 2-D op over
    /// `[N, C, 1, L]` with a `[O, C/g, 1, K]` weight.
    /// The input and weight of a convolution `node` (inputs 0 and 1): the
    /// input 3-D or 4-D (a 1-D or 2-D convolution), the weight of its rank.
    /// Returns the input, its type, the spatial rank, the weight and its dims.
    pub(super) fn conv_operands(
        &mut self,
        node: &'m NodeProto,
    ) -> R<(ValueId, TensorType, usize, ValueId, Vec<usize>)> {
        let x = self.ir_in(node, 0)?;
        let xt = self.b.ty(x).clone();
        let n = xt.rank().saturating_sub(2);
        if !(1..=2).contains(&n) {
            return Err(format!(
                "only 1-D and 2-D convolution (3-D or 4-D input) is supported, found {xt}"
            ));
        }
        let wv = self.req(node, 1)?;
        let wd = self.dims_of(&wv);
        let w = self.operand(Self::in_name(node, 1), &wv, xt.dtype, &wd)?;
        if wd.len() != n + 2 {
            return Err(format!(
                "weight must be {}-D for a {n}-D convolution, found {wd:?}",
                n + 2
            ));
        }
        Ok((x, xt, n, w, wd))
    }

    fn conv(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let (x, xt, n, w, wd) = self.conv_operands(node)?;
        let kernel: Vec<i64> = wd[2..].iter().map(|&k| k as i64).collect();
        let stride = Self::window_attr(at, "strides", n, 1)?;
        let dilation = Self::window_attr(at, "dilations", n, 1)?;
        check_window(&kernel, "kernel", 1)?;
        check_window(&stride, "strides", 1)?;
        check_window(&dilation, "dilations", 1)?;
        let pad = Self::pads(at, &xt.dims()[2..], &kernel, &stride, &dilation)?;
        check_window(&pad, "pads", 0)?;
        let (x, w, stride, pad, dilation) = if n == 1 {
            let d = xt.dims();
            (
                self.b.reshape(x, &[d[0], d[1], 1, d[2]]).map_err(b)?,
                self.b.reshape(w, &[wd[0], wd[1], 1, wd[2]]).map_err(b)?,
                vec![1, stride[0]],
                vec![0, pad[0], 0, pad[1]],
                vec![1, dilation[0]],
            )
        } else {
            (x, w, stride, pad, dilation)
        };
        let attrs = Attrs::new()
            .with("stride", Attr::Ints(stride))
            .with("pad", Attr::Ints(pad))
            .with("dilation", Attr::Ints(dilation))
            .with("groups", Attr::Int(at.int_or("group", 1)));
        let mut v = self.b.op(OpKind::Conv2d, &[x, w], attrs).map_err(b)?;
        if n == 1 {
            let d = self.b.ty(v).dims().to_vec();
            v = self.b.reshape(v, &[d[0], d[1], d[3]]).map_err(b)?;
        }
        if let Some(bias) = self.get(node, 2)? {
            let out = self.b.ty(v).dims().to_vec();
            let bias = self.operand(Self::in_name(node, 2), &bias, xt.dtype, &[out[1]])?;
            let bb = self.b.broadcast(bias, &[1], &out).map_err(b)?;
            v = self.b.op(OpKind::Add, &[v, bb], Attrs::new()).map_err(b)?;
        }
        self.out(node, v)
    }

    fn pool(&mut self, node: &'m NodeProto, at: &At<'_>) -> R<()> {
        let maxpool = node.op_type.as_deref() == Some("MaxPool");
        if maxpool && at.int_or("storage_order", 0) != 0 {
            return Err("storage_order = 1 is not supported".to_string());
        }
        let x = self.ir_in(node, 0)?;
        let include_pad = at.int_or("count_include_pad", 0) != 0;
        let v = self.pool_nd(x, at, maxpool, include_pad)?;
        self.out(node, v)
    }

    /// A max (`maxpool`) or average pool of `x` over 1, 2 or 3 spatial dims,
    /// its window from the node's `kernel_shape`, `strides`, `dilations`,
    /// `pads`/`auto_pad` and `ceil_mode`. A 1-D pool is the 2-D op over
    /// `[N, C, 1, L]`; a 3-D pool is two 2-D ops, one over (H, W) and one
    /// over D, since a max, a sum and the count of taps inside the input are
    /// all products of their per-axis parts.
    fn pool_nd(&mut self, x: ValueId, at: &At<'_>, maxpool: bool, include_pad: bool) -> R<ValueId> {
        let xt = self.b.ty(x).clone();
        let n = xt.rank().saturating_sub(2);
        if !(1..=3).contains(&n) {
            return Err(format!(
                "only 1-D, 2-D and 3-D pooling (3-D to 5-D input) is supported, found {xt}"
            ));
        }
        let spatial = &xt.dims()[2..];
        let kernel = Self::window_attr(at, "kernel_shape", n, 0)?;
        if kernel.contains(&0) {
            return Err("`kernel_shape` is required".to_string());
        }
        let stride = Self::window_attr(at, "strides", n, 1)?;
        let dilation = Self::window_attr(at, "dilations", n, 1)?;
        check_window(&kernel, "kernel_shape", 1)?;
        check_window(&stride, "strides", 1)?;
        check_window(&dilation, "dilations", 1)?;
        if spatial.iter().any(|&d| d as u64 > MAX_WINDOW as u64) {
            return Err(format!("input {xt} is too large to pool"));
        }
        let mut pad = Self::pads(at, spatial, &kernel, &stride, &dilation)?;
        check_window(&pad, "pads", 0)?;
        let ceil = at.int_or("ceil_mode", 0) != 0;
        if ceil {
            for d in 0..n {
                let i = spatial[d] as i64;
                let span = dilation[d] * (kernel[d] - 1) + 1;
                let padded = i + pad[d] + pad[d + n];
                if padded < span {
                    return Err("the window does not fit the padded input".to_string());
                }
                let floor_out = (padded - span) / stride[d] + 1;
                let mut ceil_out = (padded - span + stride[d] - 1) / stride[d] + 1;
                // The last window must start inside the input or the leading padding.
                if (ceil_out - 1) * stride[d] >= i + pad[d] {
                    ceil_out -= 1;
                }
                if ceil_out > floor_out {
                    let extra = (ceil_out - 1) * stride[d] + span - padded;
                    if !maxpool && include_pad {
                        return Err("ceil_mode = 1 that adds a partial window, with count_include_pad = 1, is not supported".to_string());
                    }
                    pad[d + n] += extra;
                }
            }
        }
        if pad.iter().enumerate().any(|(i, &p)| p >= kernel[i % n]) {
            return Err(format!(
                "pads {pad:?} must each be smaller than the kernel {kernel:?} (after ceil_mode)"
            ));
        }
        // The 2-D op over the axes `axes` of the window (the other axis of
        // the pair, if any, is a 1-wide window).
        let pool2d = |this: &mut Self, v: ValueId, axes: [Option<usize>; 2]| -> R<ValueId> {
            let pick = |d: Option<usize>, of: &[i64], none: i64| d.map_or(none, |d| of[d]);
            let pair =
                |of: &[i64], none: i64| vec![pick(axes[0], of, none), pick(axes[1], of, none)];
            let mut attrs = Attrs::new()
                .with("kernel", Attr::Ints(pair(&kernel, 1)))
                .with("stride", Attr::Ints(pair(&stride, 1)))
                .with(
                    "pad",
                    Attr::Ints(vec![
                        pick(axes[0], &pad, 0),
                        pick(axes[1], &pad, 0),
                        pick(axes[0].map(|d| d + n), &pad, 0),
                        pick(axes[1].map(|d| d + n), &pad, 0),
                    ]),
                )
                .with("dilation", Attr::Ints(pair(&dilation, 1)));
            let kind = if maxpool {
                OpKind::Maxpool2d
            } else {
                attrs.set("count_include_pad", Attr::Bool(include_pad));
                OpKind::Avgpool2d
            };
            this.b.op(kind, &[v], attrs).map_err(b)
        };
        let d = xt.dims();
        Ok(match n {
            1 => {
                let v = self.b.reshape(x, &[d[0], d[1], 1, d[2]]).map_err(b)?;
                let v = pool2d(self, v, [None, Some(0)])?;
                let l = self.b.ty(v).dims()[3];
                self.b.reshape(v, &[d[0], d[1], l]).map_err(b)?
            }
            2 => pool2d(self, x, [Some(0), Some(1)])?,
            _ => {
                let v = self
                    .b
                    .reshape(x, &[d[0], d[1] * d[2], d[3], d[4]])
                    .map_err(b)?;
                let v = pool2d(self, v, [Some(1), Some(2)])?;
                let (oh, ow) = (self.b.ty(v).dims()[2], self.b.ty(v).dims()[3]);
                let v = self
                    .b
                    .reshape(v, &[d[0] * d[1], 1, d[2], oh * ow])
                    .map_err(b)?;
                let v = pool2d(self, v, [Some(0), None])?;
                let od = self.b.ty(v).dims()[2];
                self.b.reshape(v, &[d[0], d[1], od, oh, ow]).map_err(b)?
            }
        })
    }
}

fn unreachable_const() -> std::rc::Rc<Const> {
    std::rc::Rc::new(Const::ints(Vec::new()))
}

/// A `constant`'s `value` for a splat of `x`.
fn literal(dtype: DType, x: f64) -> Attr {
    if dtype.is_float() {
        Attr::Float(x)
    } else {
        Attr::Int(x as i64)
    }
}

/// Resolves a Reshape target: `0` copies the input dim (unless `allowzero`), `-1` is inferred.
fn reshape_dims(input: &[usize], shape: &[i64], allowzero: bool) -> R<Vec<usize>> {
    let total = product(input);
    let mut dims = Vec::with_capacity(shape.len());
    let mut infer = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 if infer.is_none() => {
                infer = Some(i);
                dims.push(1);
            }
            0 if !allowzero => {
                dims.push(*input.get(i).ok_or_else(|| {
                    format!("shape {shape:?}: dim {i} copies a dim the input lacks")
                })?)
            }
            s if s >= 0 => dims.push(s as usize),
            _ => return Err(format!("bad Reshape target {shape:?}")),
        }
    }
    let known = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("Reshape target {shape:?} overflows"))?;
    if let Some(i) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!("cannot reshape {input:?} to {shape:?}"));
        }
        dims[i] = total / known;
    }
    if product(&dims) != total {
        return Err(format!(
            "cannot reshape {input:?} ({total} elements) to {shape:?}"
        ));
    }
    Ok(dims)
}
