//! Random, well-typed dcir graphs for property tests.
//!
//! A graph is described by a [`GraphSpec`]: parameter types and a list of
//! [`Step`]s, nothing but small integers, which proptest generates and
//! shrinks. [`build_graph`] interprets a spec deterministically against a
//! [`GraphBuilder`]: each step picks one op of the op table and operands among
//! the values built so far whose types fit, creating a parameter or a
//! constant where an operand of one exact type is needed (a matmul's `b`, a
//! conv2d's weights). A step that finds no fitting operand is skipped, so
//! every spec — shrunk ones included — builds a graph.
//!
//! Every choice of the generator is valid by construction; a [`BuildError`]
//! from [`build_graph`] means the generator and the IR's type rules disagree.

mod workload;

pub use workload::{Workload, arb_workload, build_workload};

use dcir_ir::{
    Attr, Attrs, BuildError, DType, Graph, GraphBuilder, Module, OpKind, TensorType, ValueId,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// Largest extent of a dim of a generated parameter or constant (the
/// property tests' [`Sizes::SMALL`]).
pub const MAX_DIM: usize = 6;

/// How large generated tensors get: dims of new parameters and constants and
/// a matmul's `n` are drawn in `1..=max_dim`, and a new type of more than
/// `max_elements` elements has its largest dims halved until it fits (a
/// broadcast's new dims and a matmul's `n` are capped likewise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Largest extent of a drawn dim.
    pub max_dim: usize,
    /// Most elements of a drawn type.
    pub max_elements: usize,
}

impl Sizes {
    /// The property tests' sizes: small graphs, quick on the interpreter.
    pub const SMALL: Sizes = Sizes {
        max_dim: MAX_DIM,
        max_elements: usize::MAX,
    };
}

/// Number of choice bytes in a [`Step`].
pub const PICKS: usize = 16;

/// One step: which op to try and the bytes its choices are read from.
#[derive(Clone, Debug)]
pub struct Step {
    /// Index into the generator table (modulo its length).
    pub op: u8,
    /// Choice bytes, read in order; 0 once used up (0 is always the simplest choice).
    pub picks: [u8; PICKS],
}

/// A whole graph: its parameter types, its steps and how many values it returns.
#[derive(Clone, Debug)]
pub struct GraphSpec {
    /// One entry per parameter: the choice bytes its type is read from.
    pub params: Vec<[u8; PICKS]>,
    /// The ops, in order.
    pub steps: Vec<Step>,
    /// Return the last two values built instead of the last one.
    pub two_outputs: bool,
}

/// The seed of the property tests under `CI=true`.
pub const CI_SEED: u64 = 0xdc1e_2026;

/// The proptest configuration of the workspace's property tests: the number
/// of cases comes from `DCIR_PROPTEST_CASES` (default 64); the seed from
/// `DCIR_PROPTEST_SEED`, else [`CI_SEED`] under `CI=true` (CI is
/// deterministic), else a random one (local runs explore).
pub fn proptest_config() -> ProptestConfig {
    let env = |name: &str| std::env::var(name).ok();
    let cases = env("DCIR_PROPTEST_CASES")
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    let seed = env("DCIR_PROPTEST_SEED")
        .and_then(|s| s.parse().ok())
        .or_else(|| (env("CI").as_deref() == Some("true")).then_some(CI_SEED));
    ProptestConfig {
        cases,
        rng_seed: seed.map_or(RngSeed::Random, RngSeed::Fixed),
        ..ProptestConfig::default()
    }
}

/// Specs of graphs with 1 to 3 parameters and 1 to 30 steps.
pub fn arb_graph_spec() -> impl Strategy<Value = GraphSpec> {
    let step = (any::<u8>(), any::<[u8; PICKS]>()).prop_map(|(op, picks)| Step { op, picks });
    (
        vec(any::<[u8; PICKS]>(), 1..=3),
        vec(step, 1..=30),
        any::<bool>(),
    )
        .prop_map(|(params, steps, two_outputs)| GraphSpec {
            params,
            steps,
            two_outputs,
        })
}

/// Specs of modules of 1 to 3 graphs.
pub fn arb_module_spec() -> impl Strategy<Value = Vec<GraphSpec>> {
    vec(arb_graph_spec(), 1..=3)
}

/// Random well-typed graphs named `@g`.
///
/// Panics if the generator builds a graph the IR refuses; tests that want
/// such a failure shrunk use [`arb_graph_spec`] and [`build_graph`].
pub fn arb_graph() -> impl Strategy<Value = Graph> {
    arb_graph_spec()
        .prop_map(|spec| build_graph("g", &spec).expect("the generated graph is well-typed"))
}

/// Random well-typed modules of graphs `@g0`, `@g1`, ... (see [`arb_graph`]).
pub fn arb_module() -> impl Strategy<Value = Module> {
    arb_module_spec()
        .prop_map(|specs| build_module(&specs).expect("the generated module is well-typed"))
}

/// Builds the module whose graph `i` is `@g{i}` built from `specs[i]`.
pub fn build_module(specs: &[GraphSpec]) -> Result<Module, BuildError> {
    let graphs = specs
        .iter()
        .enumerate()
        .map(|(i, spec)| build_graph(&format!("g{i}"), spec))
        .collect::<Result<_, _>>()?;
    Ok(Module { graphs })
}

/// Builds (and verifies, through [`GraphBuilder::finish`]) the graph `spec`
/// describes, at [`Sizes::SMALL`].
pub fn build_graph(name: &str, spec: &GraphSpec) -> Result<Graph, BuildError> {
    build_graph_sized(name, spec, Sizes::SMALL)
}

/// [`build_graph`] with tensors as large as `sizes` allows (odd extents past
/// kernel tiles, for checking kernels on a GPU).
pub fn build_graph_sized(name: &str, spec: &GraphSpec, sizes: Sizes) -> Result<Graph, BuildError> {
    let mut g = Generator {
        b: GraphBuilder::new(name),
        values: Vec::new(),
        groups: 0,
        sizes,
    };
    for bytes in &spec.params {
        g.param(random_type(&mut Picks(bytes), sizes))?;
    }
    for step in &spec.steps {
        let kind = GENERATORS[usize::from(step.op) % GENERATORS.len()];
        let built = g.step(kind, &mut Picks(&step.picks))?;
        g.values.extend(built);
    }
    let outputs = if spec.two_outputs { 2 } else { 1 };
    let first = g.values.len().saturating_sub(outputs);
    let outputs = g.values[first..].to_vec();
    g.b.finish(&outputs)
}

/// The choices one step has left to read.
struct Picks<'a>(&'a [u8]);

impl Picks<'_> {
    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        let (&first, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        usize::from(first) % n
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    fn flag(&mut self) -> bool {
        self.below(2) == 1
    }

    fn item<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// Float literals, including the awkward ones for printing and equality.
const FLOATS: &[f64] = &[
    0.0,
    1.0,
    -1.0,
    0.5,
    0.1,
    1e-7,
    -0.0,
    -3.75,
    1e6,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
];
const INTS: &[i64] = &[0, 1, -1, 2, 7, -128, 2_147_483_647];
/// Finite floats for clip bounds.
const BOUNDS: &[f64] = &[-1.0, -0.0, 0.0, 1e-7, 0.5, 6.0];
const EPSILONS: &[f64] = &[1e-5, 1e-6, 1e-12, 0.001];

/// What one step tries to build.
#[derive(Clone, Copy, Debug)]
enum Gen {
    Elementwise(OpKind),
    Conv2d,
    Matmul,
    Broadcast,
    Reshape,
    Transpose,
    Slice,
    Concat,
    Pad,
    Gather,
    Reduce(OpKind),
    Softmax,
    Layernorm,
    Batchnorm,
    Pool(OpKind),
    GlobalAvgpool,
    Cast,
    Constant,
    Param,
    Fused,
    Select,
}

/// The elementwise ops a `fused` group is made of.
const ELEMENTWISE: &[OpKind] = &[
    OpKind::Add,
    OpKind::Sub,
    OpKind::Mul,
    OpKind::Div,
    OpKind::Max,
    OpKind::Min,
    OpKind::Pow,
    OpKind::Relu,
    OpKind::Clip,
    OpKind::Gelu,
    OpKind::Erf,
    OpKind::Tanh,
    OpKind::Sigmoid,
    OpKind::Exp,
    OpKind::Log,
    OpKind::Sqrt,
    OpKind::Rsqrt,
    OpKind::Neg,
    OpKind::Abs,
];

const GENERATORS: &[Gen] = {
    use Gen::*;
    use OpKind as K;
    &[
        Elementwise(K::Add),
        Elementwise(K::Sub),
        Elementwise(K::Mul),
        Elementwise(K::Div),
        Elementwise(K::Max),
        Elementwise(K::Min),
        Elementwise(K::Pow),
        Elementwise(K::Relu),
        Elementwise(K::Clip),
        Elementwise(K::Gelu),
        Elementwise(K::Erf),
        Elementwise(K::Tanh),
        Elementwise(K::Sigmoid),
        Elementwise(K::Exp),
        Elementwise(K::Log),
        Elementwise(K::Sqrt),
        Elementwise(K::Rsqrt),
        Elementwise(K::Neg),
        Elementwise(K::Abs),
        Elementwise(K::Mod),
        Elementwise(K::Floor),
        Elementwise(K::Ceil),
        Elementwise(K::Round),
        Elementwise(K::Sign),
        Elementwise(K::Sin),
        Elementwise(K::Cos),
        Elementwise(K::IsNan),
        Elementwise(K::IsInf),
        Elementwise(K::Equal),
        Elementwise(K::Less),
        Elementwise(K::LessEqual),
        Elementwise(K::Greater),
        Elementwise(K::GreaterEqual),
        Elementwise(K::And),
        Elementwise(K::Or),
        Elementwise(K::Xor),
        Elementwise(K::Not),
        Select,
        Conv2d,
        Matmul,
        Broadcast,
        Reshape,
        Transpose,
        Slice,
        Concat,
        Pad,
        Gather,
        Reduce(K::ReduceSum),
        Reduce(K::ReduceMean),
        Reduce(K::ReduceMax),
        Reduce(K::ReduceProd),
        Softmax,
        Layernorm,
        Batchnorm,
        Pool(K::Maxpool2d),
        Pool(K::Avgpool2d),
        GlobalAvgpool,
        Cast,
        Constant,
        Param,
        Fused,
    ]
};

/// True when the elementwise op `kind` accepts operands of `dtype`.
fn takes(kind: OpKind, dtype: DType) -> bool {
    use OpKind::*;
    match kind {
        Gelu | Erf | Tanh | Sigmoid | Exp | Log | Sqrt | Rsqrt | Floor | Ceil | Round | Sin
        | Cos | IsNan | IsInf => dtype.is_float(),
        Equal => true,
        And | Or | Xor | Not => dtype == DType::Bool,
        _ => dtype != DType::Bool,
    }
}

/// Any dtype, rank 0 to 4, dims 1 to `sizes.max_dim`, at most
/// `sizes.max_elements` elements.
fn random_type(p: &mut Picks, sizes: Sizes) -> TensorType {
    let dtype = p.item(&DType::ALL);
    let rank = p.below(5);
    let mut dims: Vec<usize> = (0..rank).map(|_| p.range(1, sizes.max_dim)).collect();
    fit(&mut dims, &vec![true; rank], sizes.max_elements);
    TensorType::new(dtype, dims)
}

/// Halves the largest of the dims marked `free` until `dims` has at most
/// `max` elements (or no free dim is above 1).
fn fit(dims: &mut [usize], free: &[bool], max: usize) {
    while dims.iter().product::<usize>() > max {
        let largest = (0..dims.len())
            .filter(|&i| free[i] && dims[i] > 1)
            .max_by_key(|&i| (dims[i], std::cmp::Reverse(i)));
        let Some(i) = largest else { break };
        dims[i] = dims[i].div_ceil(2);
    }
}

/// Attributes of an elementwise op (`clip`'s bounds, `gelu`'s approximation).
fn elementwise_attrs(kind: OpKind, p: &mut Picks) -> Attrs {
    match kind {
        OpKind::Clip => {
            let (a, b) = (p.item(BOUNDS), p.item(BOUNDS));
            Attrs::new()
                .with("min", Attr::Float(a.min(b)))
                .with("max", Attr::Float(a.max(b)))
        }
        OpKind::Gelu if p.flag() => Attrs::new().with("approximate", Attr::Str("tanh".into())),
        OpKind::Mod if p.flag() => Attrs::new().with("fmod", Attr::Bool(true)),
        _ => Attrs::new(),
    }
}

/// A literal for a constant of type `ty`: one value (splat) or, for at most
/// 8 elements, sometimes one per element.
fn literal(p: &mut Picks, ty: &TensorType) -> Attr {
    let n = ty.num_elements().unwrap_or(0);
    let count = if n <= 8 && p.flag() { n } else { 1 };
    let dense = count != 1 || p.flag();
    if ty.dtype.is_float() {
        let v: Vec<f64> = (0..count).map(|_| p.item(FLOATS)).collect();
        if dense {
            Attr::Floats(v)
        } else {
            Attr::Float(v[0])
        }
    } else {
        let pool = if ty.dtype == DType::Bool {
            &[0, 1]
        } else {
            INTS
        };
        let v: Vec<i64> = (0..count).map(|_| p.item(pool)).collect();
        if dense {
            Attr::Ints(v)
        } else {
            Attr::Int(v[0])
        }
    }
}

fn ints(v: impl IntoIterator<Item = usize>) -> Attr {
    Attr::Ints(v.into_iter().map(|x| x as i64).collect())
}

fn prime_factors(mut n: usize) -> Vec<usize> {
    let mut factors = Vec::new();
    let mut f = 2;
    while n > 1 {
        while n.is_multiple_of(f) {
            factors.push(f);
            n /= f;
        }
        f += 1;
    }
    factors
}

/// One spatial dim of a sliding window (conv2d, pools).
struct Window {
    kernel: usize,
    lo: usize,
    hi: usize,
    stride: usize,
    dilation: usize,
}

/// A window over `extent` with padding smaller than the kernel; a kernel
/// that would not fit the padded extent becomes 1.
fn window(p: &mut Picks, extent: usize) -> Window {
    let kernel = p.range(1, 3);
    let (lo, hi) = (p.below(kernel), p.below(kernel));
    let stride = p.range(1, 2);
    let dilation = p.range(1, 2);
    if extent + lo + hi < dilation * (kernel - 1) + 1 {
        return Window {
            kernel: 1,
            lo: 0,
            hi: 0,
            stride,
            dilation,
        };
    }
    Window {
        kernel,
        lo,
        hi,
        stride,
        dilation,
    }
}

/// The builder and the values of the graph body built so far.
struct Generator {
    b: GraphBuilder,
    values: Vec<ValueId>,
    groups: usize,
    sizes: Sizes,
}

/// The values a step built; empty when the step was skipped.
type Built = Result<Vec<ValueId>, BuildError>;

impl Generator {
    fn ty(&self, v: ValueId) -> TensorType {
        self.b.ty(v).clone()
    }

    /// One of the values whose type `fits`, if any.
    fn choose(&self, p: &mut Picks, fits: impl Fn(&TensorType) -> bool) -> Option<ValueId> {
        let fitting: Vec<ValueId> = (self.values.iter().copied())
            .filter(|&v| fits(self.b.ty(v)))
            .collect();
        (!fitting.is_empty()).then(|| p.item(&fitting))
    }

    /// A value of type `ty`: an existing one, else a new parameter or constant.
    fn operand(&mut self, p: &mut Picks, ty: &TensorType) -> Result<ValueId, BuildError> {
        let source = p.below(4);
        match self.choose(p, |t| t == ty) {
            Some(v) if source < 2 => Ok(v),
            _ if source.is_multiple_of(2) => self.param(ty.clone()),
            _ => self.constant(p, ty.clone()),
        }
    }

    fn param(&mut self, ty: TensorType) -> Result<ValueId, BuildError> {
        let v = self.b.param("p", ty)?;
        self.values.push(v);
        Ok(v)
    }

    fn constant(&mut self, p: &mut Picks, ty: TensorType) -> Result<ValueId, BuildError> {
        let value = literal(p, &ty);
        let v = self.b.constant(ty, value)?;
        self.values.push(v);
        Ok(v)
    }

    fn op(&mut self, kind: OpKind, operands: &[ValueId], attrs: Attrs) -> Built {
        Ok(vec![self.b.op(kind, operands, attrs)?])
    }

    fn step(&mut self, step: Gen, p: &mut Picks) -> Built {
        match step {
            Gen::Elementwise(kind) => self.elementwise(kind, p),
            Gen::Conv2d => self.conv2d(p),
            Gen::Matmul => self.matmul(p),
            Gen::Broadcast => self.broadcast(p),
            Gen::Reshape => self.reshape(p),
            Gen::Transpose => self.transpose(p),
            Gen::Slice => self.slice(p),
            Gen::Concat => self.concat(p),
            Gen::Pad => self.pad(p),
            Gen::Gather => self.gather(p),
            Gen::Reduce(kind) => self.reduce(kind, p),
            Gen::Softmax => self.softmax(p),
            Gen::Layernorm => self.layernorm(p),
            Gen::Batchnorm => self.batchnorm(p),
            Gen::Pool(kind) => self.pool(kind, p),
            Gen::GlobalAvgpool => match self.choose(p, |t| t.rank() == 4 && t.dtype.is_float()) {
                Some(x) => self.op(OpKind::GlobalAvgpool, &[x], Attrs::new()),
                None => Ok(Vec::new()),
            },
            Gen::Cast => match self.choose(p, |_| true) {
                Some(x) => Ok(vec![self.b.cast(x, p.item(&DType::ALL))?]),
                None => Ok(Vec::new()),
            },
            Gen::Constant => {
                let ty = random_type(p, self.sizes);
                Ok(vec![self.constant(p, ty)?])
            }
            Gen::Param => Ok(vec![self.param(random_type(p, self.sizes))?]),
            Gen::Fused => self.fused(p),
            Gen::Select => self.select(p),
        }
    }

    /// `select` of a bool condition and two operands of its shape.
    fn select(&mut self, p: &mut Picks) -> Built {
        let Some(cond) = self.choose(p, |t| t.dtype == DType::Bool) else {
            return Ok(Vec::new());
        };
        let dims = self.ty(cond).dims().to_vec();
        let a = match self.choose(p, |t| t.dims() == dims.as_slice()) {
            Some(a) => a,
            None => self.param(TensorType::new(DType::F32, dims))?,
        };
        let ty = self.ty(a);
        let b = self.operand(p, &ty)?;
        self.op(OpKind::Select, &[cond, a, b], Attrs::new())
    }

    fn elementwise(&mut self, kind: OpKind, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |t| takes(kind, t.dtype)) else {
            return Ok(Vec::new());
        };
        let mut operands = vec![x];
        if kind.is_elementwise_binary() {
            let ty = self.ty(x);
            operands.extend(self.choose(p, |t| *t == ty));
        }
        let attrs = elementwise_attrs(kind, p);
        self.op(kind, &operands, attrs)
    }

    fn conv2d(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |t| t.rank() == 4 && t.dtype.is_float()) else {
            return Ok(Vec::new());
        };
        let xt = self.ty(x);
        let [_, c, h, w] = [xt.dims()[0], xt.dims()[1], xt.dims()[2], xt.dims()[3]];
        let groups = if p.below(3) == 0 {
            c // depthwise
        } else {
            let divisors: Vec<usize> = (1..=c).filter(|&g| c.is_multiple_of(g)).collect();
            p.item(&divisors)
        };
        let out = groups * p.range(1, 3);
        let (wh, ww) = (window(p, h), window(p, w));
        let wt = TensorType::new(xt.dtype, vec![out, c / groups, wh.kernel, ww.kernel]);
        let weights = self.operand(p, &wt)?;
        let attrs = Attrs::new()
            .with("stride", ints([wh.stride, ww.stride]))
            .with("pad", ints([wh.lo, ww.lo, wh.hi, ww.hi]))
            .with("dilation", ints([wh.dilation, ww.dilation]))
            .with("groups", Attr::Int(groups as i64));
        self.op(OpKind::Conv2d, &[x, weights], attrs)
    }

    fn matmul(&mut self, p: &mut Picks) -> Built {
        let Some(a) = self.choose(p, |t| t.rank() >= 2 && t.dtype != DType::Bool) else {
            return Ok(Vec::new());
        };
        let at = self.ty(a);
        let r = at.rank();
        let (ta, tb) = (p.flag(), p.flag());
        let k = at.dims()[if ta { r - 2 } else { r - 1 }];
        // The result has `n` columns per row of `a`: capped to `max_elements`.
        let rows = at.num_elements().unwrap_or(1) / k.max(1);
        let n_max = (self.sizes.max_elements / rows.max(1)).clamp(1, self.sizes.max_dim);
        let n = p.range(1, n_max);
        let mut b_dims = at.dims()[..r - 2].to_vec();
        b_dims.extend(if tb { [n, k] } else { [k, n] });
        let b = self.operand(p, &TensorType::new(at.dtype, b_dims))?;
        let attrs = Attrs::new()
            .with("transpose_a", Attr::Bool(ta))
            .with("transpose_b", Attr::Bool(tb));
        self.op(OpKind::Matmul, &[a, b], attrs)
    }

    fn broadcast(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |t| t.rank() <= 3) else {
            return Ok(Vec::new());
        };
        let xt = self.ty(x);
        let extra = p.range(0, 4 - xt.rank());
        let out_rank = xt.rank() + extra;
        let mut map: Vec<usize> = (0..out_rank).collect();
        for _ in 0..extra {
            map.remove(p.below(map.len()));
        }
        let mut dims: Vec<usize> = (0..out_rank)
            .map(|_| p.range(1, self.sizes.max_dim))
            .collect();
        let mut free = vec![true; out_rank];
        for (&from, &to) in xt.dims().iter().zip(&map) {
            if from != 1 {
                dims[to] = from;
                free[to] = false;
            }
        }
        fit(&mut dims, &free, self.sizes.max_elements);
        let map: Vec<i64> = map.iter().map(|&d| d as i64).collect();
        Ok(vec![self.b.broadcast(x, &map, &dims)?])
    }

    fn reshape(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |_| true) else {
            return Ok(Vec::new());
        };
        let n = self.ty(x).num_elements().unwrap_or(1);
        let rank = p.below(5).max(usize::from(n > 1));
        let mut dims = vec![1; rank];
        for f in prime_factors(n) {
            dims[p.below(rank)] *= f;
        }
        Ok(vec![self.b.reshape(x, &dims)?])
    }

    fn transpose(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |_| true) else {
            return Ok(Vec::new());
        };
        let mut perm: Vec<usize> = (0..self.ty(x).rank()).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, p.below(i + 1));
        }
        self.op(
            OpKind::Transpose,
            &[x],
            Attrs::new().with("perm", ints(perm)),
        )
    }

    fn slice(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |_| true) else {
            return Ok(Vec::new());
        };
        let (mut starts, mut ends) = (Vec::new(), Vec::new());
        for &extent in self.ty(x).dims() {
            let start = p.below(extent);
            starts.push(start);
            ends.push(p.range(start + 1, extent));
        }
        let mut attrs = Attrs::new()
            .with("starts", ints(starts))
            .with("ends", ints(ends));
        if p.flag() {
            let steps: Vec<usize> = (0..self.ty(x).rank()).map(|_| p.range(1, 2)).collect();
            attrs.set("steps", ints(steps));
        }
        self.op(OpKind::Slice, &[x], attrs)
    }

    fn concat(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |t| t.rank() >= 1) else {
            return Ok(Vec::new());
        };
        let xt = self.ty(x);
        let axis = p.below(xt.rank());
        let fits = |t: &TensorType| {
            t.dtype == xt.dtype
                && t.rank() == xt.rank()
                && (0..t.rank()).all(|d| d == axis || t.dims()[d] == xt.dims()[d])
        };
        let mut operands = vec![x];
        for _ in 0..p.below(3) {
            operands.extend(self.choose(p, fits));
        }
        let attrs = Attrs::new().with("axis", Attr::Int(axis as i64));
        self.op(OpKind::Concat, &operands, attrs)
    }

    fn pad(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |_| true) else {
            return Ok(Vec::new());
        };
        let xt = self.ty(x);
        let low: Vec<usize> = (0..xt.rank()).map(|_| p.below(2)).collect();
        let high: Vec<usize> = (0..xt.rank()).map(|_| p.below(2)).collect();
        let value = match xt.dtype {
            d if d.is_float() => p.item(FLOATS),
            DType::Bool => p.item(&[0.0, 1.0]),
            _ => p.item(&[0.0, 1.0, -1.0]),
        };
        let attrs = Attrs::new()
            .with("low", ints(low))
            .with("high", ints(high))
            .with("value", Attr::Float(value));
        self.op(OpKind::Pad, &[x], attrs)
    }

    /// `gather` with an index parameter or an in-range index constant.
    fn gather(&mut self, p: &mut Picks) -> Built {
        let Some(data) = self.choose(p, |t| t.rank() >= 1) else {
            return Ok(Vec::new());
        };
        let dt = self.ty(data);
        let axis = p.below(dt.rank());
        let extent = dt.dims()[axis];
        let rank = p.below(3);
        let dims: Vec<usize> = (0..rank).map(|_| p.range(1, 3)).collect();
        let ty = TensorType::new(p.item(&[DType::I32, DType::I64]), dims);
        let indices = if p.flag() {
            self.param(ty)?
        } else {
            let n = ty.num_elements().unwrap_or(1);
            let value = if n <= 8 && p.flag() {
                ints((0..n).map(|_| p.below(extent)))
            } else {
                Attr::Int(p.below(extent) as i64)
            };
            let v = self.b.constant(ty, value)?;
            self.values.push(v);
            v
        };
        let attrs = Attrs::new().with("axis", Attr::Int(axis as i64));
        self.op(OpKind::Gather, &[data, indices], attrs)
    }

    fn reduce(&mut self, kind: OpKind, p: &mut Picks) -> Built {
        let float_only = kind == OpKind::ReduceMean;
        let fits = |t: &TensorType| {
            t.rank() >= 1 && t.dtype != DType::Bool && (t.dtype.is_float() || !float_only)
        };
        let Some(x) = self.choose(p, fits) else {
            return Ok(Vec::new());
        };
        let rank = self.ty(x).rank();
        let mut axes: Vec<usize> = (0..rank).filter(|_| p.flag()).collect();
        if axes.is_empty() {
            axes.push(p.below(rank));
        }
        let attrs = Attrs::new()
            .with("axes", ints(axes))
            .with("keepdims", Attr::Bool(p.flag()));
        self.op(kind, &[x], attrs)
    }

    fn softmax(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |t| t.rank() >= 1 && t.dtype.is_float()) else {
            return Ok(Vec::new());
        };
        let axis = p.below(self.ty(x).rank());
        let attrs = Attrs::new().with("axis", Attr::Int(axis as i64));
        self.op(OpKind::Softmax, &[x], attrs)
    }

    fn layernorm(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |t| t.rank() >= 1 && t.dtype.is_float()) else {
            return Ok(Vec::new());
        };
        let xt = self.ty(x);
        let axis = p.below(xt.rank());
        let norm = TensorType::new(xt.dtype, xt.dims()[axis..].to_vec());
        let scale = self.operand(p, &norm)?;
        let bias = self.operand(p, &norm)?;
        let attrs = Attrs::new()
            .with("axis", Attr::Int(axis as i64))
            .with("epsilon", Attr::Float(p.item(EPSILONS)));
        self.op(OpKind::Layernorm, &[x, scale, bias], attrs)
    }

    fn batchnorm(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |t| t.rank() >= 2 && t.dtype.is_float()) else {
            return Ok(Vec::new());
        };
        let xt = self.ty(x);
        let channel = TensorType::new(xt.dtype, vec![xt.dims()[1]]);
        let mut operands = vec![x];
        for _ in 0..4 {
            operands.push(self.operand(p, &channel)?);
        }
        let attrs = Attrs::new().with("epsilon", Attr::Float(p.item(EPSILONS)));
        self.op(OpKind::Batchnorm, &operands, attrs)
    }

    fn pool(&mut self, kind: OpKind, p: &mut Picks) -> Built {
        let max = kind == OpKind::Maxpool2d;
        let fits = |t: &TensorType| {
            t.rank() == 4
                && if max {
                    t.dtype != DType::Bool
                } else {
                    t.dtype.is_float()
                }
        };
        let Some(x) = self.choose(p, fits) else {
            return Ok(Vec::new());
        };
        let xt = self.ty(x);
        let (wh, ww) = (window(p, xt.dims()[2]), window(p, xt.dims()[3]));
        let mut attrs = Attrs::new()
            .with("kernel", ints([wh.kernel, ww.kernel]))
            .with("stride", ints([wh.stride, ww.stride]))
            .with("pad", ints([wh.lo, ww.lo, wh.hi, ww.hi]))
            .with("dilation", ints([wh.dilation, ww.dilation]));
        if !max {
            attrs.set("count_include_pad", Attr::Bool(p.flag()));
        }
        self.op(kind, &[x], attrs)
    }

    /// A `fused` group of 1 to 3 elementwise ops over one value and a value
    /// of its type, yielding the last op's result and sometimes an argument.
    fn fused(&mut self, p: &mut Picks) -> Built {
        let Some(x) = self.choose(p, |t| t.dtype != DType::Bool) else {
            return Ok(Vec::new());
        };
        let ty = self.ty(x);
        let y = self.choose(p, |t| *t == ty).unwrap_or(x);
        let kinds: Vec<OpKind> = (ELEMENTWISE.iter().copied())
            .filter(|&k| takes(k, ty.dtype))
            .collect();
        let plan: Vec<(OpKind, Attrs)> = (0..p.range(1, 3))
            .map(|_| {
                let kind = p.item(&kinds);
                (kind, elementwise_attrs(kind, p))
            })
            .collect();
        let yield_arg = p.flag();
        let mut attrs = Attrs::new();
        // Kernel parameters follow dcir_ir::fused's schema: none without a kind.
        if p.flag() {
            attrs.set("kind", Attr::Str("elementwise".into()));
            if p.flag() {
                attrs.set("level", Attr::Str("register".into()));
                attrs.set("threads", Attr::Int(p.item(&[64, 128, 256])));
                attrs.set("vector", Attr::Int(p.item(&[1, 2, 4])));
            }
        }
        let symbol = format!("g{}", self.groups);
        self.groups += 1;
        self.b.fused(&symbol, &[x, y], attrs, |b, args| {
            let mut last = args[0];
            for (kind, attrs) in plan {
                let operands = if kind.is_elementwise_binary() {
                    vec![last, args[1]]
                } else {
                    vec![last]
                };
                last = b.op(kind, &operands, attrs)?;
            }
            Ok(if yield_arg {
                vec![last, args[1]]
            } else {
                vec![last]
            })
        })
    }
}
