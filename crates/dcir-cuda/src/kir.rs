//! The kernel IR: a small structured language for one CUDA kernel.
//!
//! A [`Kernel`] has pointer parameters, optional static shared arrays and a
//! body of [`Stmt`]s (lets, assignments, stores, counted loops, `if`s,
//! barriers). Expressions ([`Expr`]) are typed by their context: index
//! arithmetic is `int`, element arithmetic is `float` (f16/bf16 values are
//! widened to f32 on load and narrowed on store), plus warp shuffles,
//! vector loads and calls to math functions or the emitter's helpers.
//! [`crate::print`] turns it into CUDA C; the builders here fold trivial
//! index arithmetic (`x * 1`, `x + 0`) so the printed code stays readable.

use std::collections::BTreeSet;

/// A C type of a local variable or an array element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ty {
    /// `float`
    F32,
    /// `unsigned short` holding an IEEE half.
    F16Bits,
    /// `unsigned short` holding a bfloat16.
    Bf16Bits,
    /// `int`
    I32,
    /// `long long`
    I64,
    /// `bool`
    Bool,
    /// `float4`: four f32 (16 bytes).
    Float4,
    /// `float2`: two f32 (8 bytes).
    Float2,
    /// `unsigned int`: two 16-bit floats (4 bytes).
    U32,
    /// `uint2`: four 16-bit floats (8 bytes).
    Uint2,
    /// `uint4`: eight 16-bit floats (16 bytes).
    Uint4,
}

/// A global (kernel parameter) or shared array an expression reads or a store writes.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayRef {
    /// The array's name.
    pub name: String,
    /// The element type the access is made with (a vector type for vector access).
    pub ty: Ty,
    /// How the access views the array's storage when `ty` differs from the declaration.
    pub reinterpret: bool,
}

/// A builtin index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    /// `threadIdx.x`
    ThreadX,
    /// `blockIdx.x`
    BlockX,
    /// `blockDim.x`
    BlockDimX,
    /// `gridDim.x`
    GridDimX,
}

/// A binary operator, printed infix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Rem,
    /// `<`
    Lt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `||`
    Or,
    /// `&&`
    And,
    /// `|`
    BitOr,
    /// `&`
    BitAnd,
    /// `^`
    BitXor,
    /// `<<`
    Shl,
    /// `>>`
    Shr,
}

/// An expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A local variable or parameter.
    Var(String),
    /// An integer literal.
    Int(i64),
    /// An f32 literal (printed so it reads back exactly; inf and nan via helpers).
    F32(f32),
    /// A boolean literal.
    Bool(bool),
    /// A builtin index.
    Builtin(Builtin),
    /// `a op b`.
    Bin(BinOp, Box<Expr>, Box<Expr>),
    /// `-a`.
    Neg(Box<Expr>),
    /// `!a`.
    Not(Box<Expr>),
    /// `c ? a : b`.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `(ty)a`.
    Cast(Ty, Box<Expr>),
    /// `f(args..)`: a CUDA math function or a helper of [`Helper`].
    Call(String, Vec<Expr>),
    /// `array[index]`.
    Load(ArrayRef, Box<Expr>),
    /// `v.x` etc.: a component of a vector value.
    Field(Box<Expr>, &'static str),
    /// A warp shuffle of `v` over the full warp: `__shfl_xor_sync`,
    /// `__shfl_up_sync` or `__shfl_down_sync(0xffffffff, v, offset)`.
    Shfl(Shuffle, Box<Expr>, u32),
}

/// Which lane a [`Expr::Shfl`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shuffle {
    /// Lane `lane ^ offset`.
    Xor,
    /// Lane `lane - offset` (a lane below `offset` reads its own value).
    Up,
    /// Lane `lane + offset` (a lane at `32 - offset` or above reads its own value).
    Down,
}

/// A statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `// text`
    Comment(String),
    /// `#pragma text` (before a loop: `unroll 1` keeps it rolled).
    Pragma(String),
    /// `ty name = value;` (`const` when `constant`).
    Let {
        /// The variable.
        name: String,
        /// Its type.
        ty: Ty,
        /// Its initial value.
        value: Expr,
        /// Whether it is never reassigned.
        constant: bool,
    },
    /// `name = value;`
    Assign(String, Expr),
    /// `array[index] = value;`
    Store(ArrayRef, Expr, Expr),
    /// `f(args..);`: a call for its effect (a `void` helper of [`Helper`],
    /// whose reference parameters may write the lvalues passed).
    Call(String, Vec<Expr>),
    /// `for (int var = start; var < end; var += step) { body }`
    For {
        /// The induction variable.
        var: String,
        /// First value.
        start: Expr,
        /// Exclusive bound.
        end: Expr,
        /// Increment.
        step: Expr,
        /// Whether to ask for `#pragma unroll`.
        unroll: bool,
        /// The body.
        body: Vec<Stmt>,
    },
    /// `if (cond) { body }`
    If(Expr, Vec<Stmt>),
    /// `if (cond) { then } else { otherwise }` (warp-specialized roles, each
    /// one branch, as `setmaxnreg` needs).
    IfElse(Expr, Vec<Stmt>, Vec<Stmt>),
    /// `__syncthreads();`
    Barrier,
    /// `ty name[len];`: a per-thread array (registers when indexed by constants).
    LocalArray {
        /// The array.
        name: String,
        /// Element type.
        ty: Ty,
        /// Number of elements.
        len: usize,
    },
    /// `ty* const name = reinterpret_cast<ty*>(dcir_smem + offset);`: an
    /// array in the kernel's dynamic shared memory from byte `offset` (a
    /// multiple of 16), indexed like any other array.
    SharedView {
        /// The array.
        name: String,
        /// Element type.
        ty: Ty,
        /// Byte offset into `dcir_smem`.
        offset: usize,
    },
}

impl Stmt {
    /// Whether the statement (or one nested in it) reads variable `name`.
    pub fn reads(&self, name: &str) -> bool {
        match self {
            Stmt::Comment(_)
            | Stmt::Pragma(_)
            | Stmt::LocalArray { .. }
            | Stmt::SharedView { .. }
            | Stmt::Barrier => false,
            Stmt::Let { value, .. } | Stmt::Assign(_, value) => value.reads(name),
            Stmt::Store(array, index, value) => {
                array.name == name || index.reads(name) || value.reads(name)
            }
            Stmt::For {
                start,
                end,
                step,
                body,
                ..
            } => {
                start.reads(name)
                    || end.reads(name)
                    || step.reads(name)
                    || body.iter().any(|s| s.reads(name))
            }
            Stmt::If(cond, body) => cond.reads(name) || body.iter().any(|s| s.reads(name)),
            Stmt::IfElse(cond, a, b) => {
                cond.reads(name) || a.iter().chain(b).any(|s| s.reads(name))
            }
            Stmt::Call(_, args) => args.iter().any(|a| a.reads(name)),
        }
    }

    /// Whether the statement (or one nested in it) stores into array `name`.
    pub fn writes(&self, name: &str) -> bool {
        match self {
            Stmt::Store(array, ..) => array.name == name,
            Stmt::For { body, .. } | Stmt::If(_, body) => body.iter().any(|s| s.writes(name)),
            Stmt::IfElse(_, a, b) => a.iter().chain(b).any(|s| s.writes(name)),
            _ => false,
        }
    }

    /// The statement with every expression in it replaced by `f` of it
    /// (see [`Expr::map`]).
    pub fn map_exprs(self, f: &mut impl FnMut(Expr) -> Expr) -> Stmt {
        match self {
            Stmt::Let {
                name,
                ty,
                value,
                constant,
            } => Stmt::Let {
                name,
                ty,
                value: value.map(f),
                constant,
            },
            Stmt::Assign(name, value) => Stmt::Assign(name, value.map(f)),
            Stmt::Store(array, index, value) => Stmt::Store(array, index.map(f), value.map(f)),
            Stmt::Call(name, args) => {
                Stmt::Call(name, args.into_iter().map(|a| a.map(f)).collect())
            }
            Stmt::For {
                var,
                start,
                end,
                step,
                unroll,
                body,
            } => Stmt::For {
                var,
                start: start.map(f),
                end: end.map(f),
                step: step.map(f),
                unroll,
                body: body.into_iter().map(|s| s.map_exprs(f)).collect(),
            },
            Stmt::If(cond, body) => Stmt::If(
                cond.map(f),
                body.into_iter().map(|s| s.map_exprs(f)).collect(),
            ),
            Stmt::IfElse(cond, a, b) => Stmt::IfElse(
                cond.map(f),
                a.into_iter().map(|s| s.map_exprs(f)).collect(),
                b.into_iter().map(|s| s.map_exprs(f)).collect(),
            ),
            s @ (Stmt::Comment(_)
            | Stmt::Pragma(_)
            | Stmt::Barrier
            | Stmt::LocalArray { .. }
            | Stmt::SharedView { .. }) => s,
        }
    }
}

impl Expr {
    /// The expression with every subexpression (innermost first) and then
    /// itself replaced by `f` of it.
    pub fn map(self, f: &mut impl FnMut(Expr) -> Expr) -> Expr {
        let mapped = match self {
            Expr::Bin(op, a, b) => Expr::Bin(op, Box::new(a.map(f)), Box::new(b.map(f))),
            Expr::Neg(a) => Expr::Neg(Box::new(a.map(f))),
            Expr::Not(a) => Expr::Not(Box::new(a.map(f))),
            Expr::Cast(ty, a) => Expr::Cast(ty, Box::new(a.map(f))),
            Expr::Field(a, c) => Expr::Field(Box::new(a.map(f)), c),
            Expr::Shfl(s, a, o) => Expr::Shfl(s, Box::new(a.map(f)), o),
            Expr::Select(c, a, b) => {
                Expr::Select(Box::new(c.map(f)), Box::new(a.map(f)), Box::new(b.map(f)))
            }
            Expr::Call(name, args) => {
                Expr::Call(name, args.into_iter().map(|a| a.map(f)).collect())
            }
            Expr::Load(array, i) => Expr::Load(array, Box::new(i.map(f))),
            e @ (Expr::Var(_) | Expr::Int(_) | Expr::F32(_) | Expr::Bool(_) | Expr::Builtin(_)) => {
                e
            }
        };
        f(mapped)
    }

    /// Whether `f` holds for the expression or any of its subexpressions.
    pub fn any(&self, f: &mut impl FnMut(&Expr) -> bool) -> bool {
        if f(self) {
            return true;
        }
        match self {
            Expr::Var(_) | Expr::Int(_) | Expr::F32(_) | Expr::Bool(_) | Expr::Builtin(_) => false,
            Expr::Bin(_, a, b) => a.any(f) || b.any(f),
            Expr::Neg(a) | Expr::Not(a) | Expr::Cast(_, a) | Expr::Field(a, _) => a.any(f),
            Expr::Shfl(_, a, _) => a.any(f),
            Expr::Select(c, a, b) => c.any(f) || a.any(f) || b.any(f),
            Expr::Call(_, args) => args.iter().any(|a| a.any(f)),
            Expr::Load(_, index) => index.any(f),
        }
    }

    /// Whether the expression reads variable (or array) `name`.
    pub fn reads(&self, name: &str) -> bool {
        match self {
            Expr::Var(v) => v == name,
            Expr::Int(_) | Expr::F32(_) | Expr::Bool(_) | Expr::Builtin(_) => false,
            Expr::Bin(_, a, b) => a.reads(name) || b.reads(name),
            Expr::Neg(a) | Expr::Not(a) | Expr::Cast(_, a) | Expr::Field(a, _) => a.reads(name),
            Expr::Shfl(_, a, _) => a.reads(name),
            Expr::Select(c, a, b) => c.reads(name) || a.reads(name) || b.reads(name),
            Expr::Call(_, args) => args.iter().any(|a| a.reads(name)),
            Expr::Load(array, index) => array.name == name || index.reads(name),
        }
    }
}

/// A helper function the printer defines before the kernel when used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Helper {
    /// f16 bits ↔ f32 (inline PTX `cvt`).
    Half,
    /// bf16 bits ↔ f32.
    Bfloat16,
    /// NaN-propagating `dcir_max`, `dcir_min`, `dcir_relu`.
    NanMinMax,
    /// `dcir_gelu` (erf form) and `dcir_gelu_tanh`.
    Gelu,
    /// `dcir_sigmoid`.
    Sigmoid,
    /// `dcir_exp2`: 2^x by `ex2.approx.ftz.f32` (2 ulp; -inf gives 0), for
    /// a softmax that scales its exponents by log2 e itself.
    Exp2,
    /// `dcir_ipow`: integer `a ^ b` (wrapping; the truncated real result for `b < 0`).
    IntPow,
    /// Shared-memory addressing and asynchronous copies (inline PTX):
    /// `dcir_smem_u32` (a shared pointer's 32-bit address), `dcir_st_shared16`
    /// (a 16-byte store at one), `dcir_cp_async16` (`cp.async.cg` of 16 bytes,
    /// zero-filled when not `full`), `dcir_cp_async_commit` and
    /// `dcir_cp_async_wait<N>` (commit and wait on groups of copies).
    CpAsync,
    /// `dcir_st_shared2`: a 16-bit store at a shared address (inline PTX).
    SharedStore16Bit,
    /// `dcir_ldmatrix_x4` and `dcir_ldmatrix_x4_trans`: four 8x8 b16 matrices
    /// from shared memory into a warp's fragments (`ldmatrix.sync`).
    Ldmatrix,
    /// `dcir_mma_f16`: `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`.
    MmaF16,
    /// `dcir_mma_bf16`: the same with bf16 operands.
    MmaBf16,
    /// Split-K: `dcir_split_arrive` (count a block in at its tile; true in
    /// the last to arrive, which resets the count) and `dcir_ldcg` (a load
    /// past L1 of another block's partial sum).
    SplitK,
    /// `dcir_split_sum`: one accumulator slot's partial sums over the
    /// splits, in split order, loaded past L1.
    SplitSum,
    /// Hopper's asynchronous machinery (sm_90; `setmaxnreg` sm_90a): the
    /// `dcir_tensor_map` parameter type, `mbarrier` init, arrive, expected
    /// transaction bytes and parity wait, TMA tile loads (`dcir_tma_load2` to
    /// `4`, `dcir_tma_load_im2col4`), register reallocation between warpgroup roles and
    /// `wgmma`'s fence, commit, wait and shared-memory descriptor.
    Hopper,
    /// `dcir_wgmma_<shape>`: one `wgmma.mma_async` of this shape.
    Wgmma(WgmmaShape),
}

/// One `wgmma.mma_async.sync.aligned.m64nNk16` with f32 accumulators and
/// both operands in shared memory (128-byte swizzled, described by 64-bit
/// descriptors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WgmmaShape {
    /// N: 8 to 256, a multiple of 8.
    pub n: u16,
    /// bf16 operands (else f16).
    pub bf16: bool,
    /// A is M-major in shared memory (else K-major).
    pub a_m_major: bool,
    /// B is N-major in shared memory (else K-major).
    pub b_n_major: bool,
}

impl WgmmaShape {
    /// The helper's name, `dcir_wgmma_m64n<N>_<dtype>_<a><b>` (`k`: K-major,
    /// `m`/`n`: M-/N-major).
    pub fn helper_name(&self) -> String {
        format!(
            "dcir_wgmma_m64n{}_{}_{}{}",
            self.n,
            if self.bf16 { "bf16" } else { "f16" },
            if self.a_m_major { "m" } else { "k" },
            if self.b_n_major { "n" } else { "k" },
        )
    }
}

/// A pointer parameter of a kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// The element's storage type.
    pub ty: Ty,
    /// The IR dtype name, for the artifact.
    pub dtype: &'static str,
    /// Whether the kernel writes it.
    pub output: bool,
    /// Passed as a TMA descriptor of the buffer (`const __grid_constant__
    /// dcir_tensor_map`), which the runtime encodes, instead of a pointer.
    pub tensor_map: Option<dcir_artifact::TensorMap>,
}

/// A statically sized shared-memory array.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedArray {
    /// Its name.
    pub name: String,
    /// Element type.
    pub ty: Ty,
    /// Number of elements.
    pub len: usize,
}

/// One kernel and how to launch it.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The `extern "C"` entry point.
    pub name: String,
    /// A one-line description printed above the kernel.
    pub summary: String,
    /// Pointer parameters, inputs first.
    pub params: Vec<Param>,
    /// Shared arrays.
    pub shared: Vec<SharedArray>,
    /// The body.
    pub body: Vec<Stmt>,
    /// Helpers the body calls.
    pub helpers: BTreeSet<Helper>,
    /// Threads per block (the `__launch_bounds__`).
    pub block: u32,
    /// Blocks per grid.
    pub grid: u32,
    /// Bytes of dynamic shared memory the launch passes (0: none). The kernel
    /// sees them as `extern __shared__ __align__(16) unsigned char dcir_smem[]`;
    /// above 48 KiB the loader must raise the function's limit first.
    pub dynamic_shared: usize,
    /// Resident blocks per SM the kernel asks ptxas to allow for (the second
    /// `__launch_bounds__` argument), or 0 to leave ptxas its occupancy
    /// heuristics. Families whose occupancy is bound by shared memory anyway
    /// say 1: ptxas then never caps registers below what the code needs (with
    /// small blocks it otherwise aims at 32 registers and may spill).
    pub min_blocks_per_sm: u32,
    /// Scratch buffers behind some of the trailing parameters (split-K's
    /// partial sums and arrival counters), which belong to no IR value.
    pub scratch: Vec<Scratch>,
    /// The architecture-specific target the kernel needs (`sm_90a` for
    /// `wgmma` and `setmaxnreg`), compiled for and recorded in the artifact.
    pub requires_arch: Option<&'static str>,
    /// The group's planned parameters this kernel does not run as written,
    /// each in words (what was planned, what runs, why); empty when it runs
    /// the plan the cost model priced. The planner's [`dcir_fusion::Target`]
    /// answer carries them.
    pub adapted: Vec<String>,
}

/// A scratch buffer a kernel needs besides its operands and results.
#[derive(Clone, Debug, PartialEq)]
pub struct Scratch {
    /// The parameter it binds to.
    pub param: String,
    /// Size in bytes.
    pub bytes: usize,
    /// Whether it must read zero when the launch starts (the kernel leaves
    /// it zeroed); otherwise its contents are never read before written.
    pub zeroed: bool,
}

impl Kernel {
    /// Bytes of static shared memory.
    pub fn shared_bytes(&self) -> usize {
        self.shared.iter().map(|s| s.len * ty_bytes(s.ty)).sum()
    }

    /// The kernel with each fully unrolled loop whose variable indexes no
    /// per-thread array (directly or through a variable derived from it)
    /// unrolled at most `times` instead: ptxas hoists the shared loads of a
    /// whole unrolled k-tile ahead of their use and can spill doing it,
    /// and such a loop's body needs no constant indices to stay in
    /// registers. Loops over a register array (accumulators, fragments,
    /// staged loads) stay fully unrolled.
    pub fn with_unroll_limit(&self, times: u32) -> Kernel {
        let mut locals = BTreeSet::new();
        collect_local_arrays(&self.body, &mut locals);
        Kernel {
            body: limit_unroll(self.body.clone(), times, &locals),
            ..self.clone()
        }
    }
}

fn collect_local_arrays(body: &[Stmt], out: &mut BTreeSet<String>) {
    for s in body {
        match s {
            Stmt::LocalArray { name, .. } => {
                out.insert(name.clone());
            }
            Stmt::For { body, .. } | Stmt::If(_, body) => collect_local_arrays(body, out),
            Stmt::IfElse(_, a, b) => {
                collect_local_arrays(a, out);
                collect_local_arrays(b, out);
            }
            _ => {}
        }
    }
}

fn limit_unroll(body: Vec<Stmt>, times: u32, locals: &BTreeSet<String>) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    for s in body {
        match s {
            Stmt::For {
                var,
                start,
                end,
                step,
                unroll,
                body,
            } => {
                let partial = unroll && {
                    let mut derived = BTreeSet::from([var.clone()]);
                    !indexes_local(&body, &mut derived, locals)
                };
                if partial {
                    out.push(Stmt::Pragma(format!("unroll {times}")));
                }
                out.push(Stmt::For {
                    var,
                    start,
                    end,
                    step,
                    unroll: unroll && !partial,
                    body: limit_unroll(body, times, locals),
                });
            }
            Stmt::If(cond, body) => out.push(Stmt::If(cond, limit_unroll(body, times, locals))),
            Stmt::IfElse(cond, a, b) => out.push(Stmt::IfElse(
                cond,
                limit_unroll(a, times, locals),
                limit_unroll(b, times, locals),
            )),
            s => out.push(s),
        }
    }
    out
}

/// Whether `body` indexes an array of `locals` with an expression reading
/// a variable of `derived`, which grows by the variables `body` computes
/// from them.
fn indexes_local(body: &[Stmt], derived: &mut BTreeSet<String>, locals: &BTreeSet<String>) -> bool {
    let tainted = |e: &Expr, derived: &BTreeSet<String>| derived.iter().any(|v| e.reads(v));
    let indexed = |e: &Expr, derived: &BTreeSet<String>| {
        e.any(&mut |sub| {
            matches!(sub, Expr::Load(a, i) if locals.contains(&a.name) && tainted(i, derived))
        })
    };
    for s in body {
        let hit = match s {
            Stmt::Let { name, value, .. } | Stmt::Assign(name, value) => {
                if tainted(value, derived) {
                    derived.insert(name.clone());
                }
                indexed(value, derived)
            }
            Stmt::Store(array, index, value) => {
                (locals.contains(&array.name) && tainted(index, derived))
                    || indexed(index, derived)
                    || indexed(value, derived)
            }
            Stmt::Call(_, args) => args.iter().any(|a| indexed(a, derived)),
            Stmt::For {
                start, end, body, ..
            } => {
                indexed(start, derived)
                    || indexed(end, derived)
                    || indexes_local(body, derived, locals)
            }
            Stmt::If(cond, body) => indexed(cond, derived) || indexes_local(body, derived, locals),
            Stmt::IfElse(cond, a, b) => {
                indexed(cond, derived)
                    || indexes_local(a, derived, locals)
                    || indexes_local(b, derived, locals)
            }
            Stmt::Comment(_)
            | Stmt::Pragma(_)
            | Stmt::Barrier
            | Stmt::LocalArray { .. }
            | Stmt::SharedView { .. } => false,
        };
        if hit {
            return true;
        }
    }
    false
}

/// Size of a value of `ty` in bytes.
pub fn ty_bytes(ty: Ty) -> usize {
    match ty {
        Ty::F32 | Ty::I32 | Ty::U32 => 4,
        Ty::F16Bits | Ty::Bf16Bits => 2,
        Ty::I64 | Ty::Uint2 | Ty::Float2 => 8,
        Ty::Bool => 1,
        Ty::Float4 | Ty::Uint4 => 16,
    }
}

/// A variable.
pub fn var(name: impl Into<String>) -> Expr {
    Expr::Var(name.into())
}

/// An integer literal.
pub fn int(v: i64) -> Expr {
    Expr::Int(v)
}

/// `a op b`, without folding.
pub fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::Bin(op, Box::new(a), Box::new(b))
}

/// Integer `a + b`, folding literals and `+ 0`.
pub fn add(a: Expr, b: Expr) -> Expr {
    match (a, b) {
        (Expr::Int(x), Expr::Int(y)) => Expr::Int(x + y),
        (Expr::Int(0), e) | (e, Expr::Int(0)) => e,
        (a, b) => bin(BinOp::Add, a, b),
    }
}

/// Integer `a - b`, folding literals and `- 0`.
pub fn sub(a: Expr, b: Expr) -> Expr {
    match (a, b) {
        (Expr::Int(x), Expr::Int(y)) => Expr::Int(x - y),
        (e, Expr::Int(0)) => e,
        (a, b) => bin(BinOp::Sub, a, b),
    }
}

/// Integer `a * b`, folding literals, `* 1` and `* 0`.
pub fn mul(a: Expr, b: Expr) -> Expr {
    match (a, b) {
        (Expr::Int(x), Expr::Int(y)) => Expr::Int(x * y),
        (Expr::Int(0), _) | (_, Expr::Int(0)) => Expr::Int(0),
        (Expr::Int(1), e) | (e, Expr::Int(1)) => e,
        (a, b) => bin(BinOp::Mul, a, b),
    }
}

/// Integer `a / b` (b > 0), folding `/ 1` and literals.
pub fn div(a: Expr, b: i64) -> Expr {
    match a {
        Expr::Int(x) => Expr::Int(x / b),
        e if b == 1 => e,
        e => bin(BinOp::Div, e, Expr::Int(b)),
    }
}

/// Integer `a % b` (b > 0), folding `% 1` and literals.
pub fn rem(a: Expr, b: i64) -> Expr {
    match a {
        Expr::Int(x) => Expr::Int(x % b),
        _ if b == 1 => Expr::Int(0),
        e => bin(BinOp::Rem, e, Expr::Int(b)),
    }
}

/// `a < b`
pub fn lt(a: Expr, b: Expr) -> Expr {
    bin(BinOp::Lt, a, b)
}

/// `a && b`, a literal `true` dropped.
pub fn and(a: Expr, b: Expr) -> Expr {
    match (a, b) {
        (Expr::Bool(true), e) | (e, Expr::Bool(true)) => e,
        (a, b) => bin(BinOp::And, a, b),
    }
}

/// `a && b ..` over the conditions present (`None`: statically true);
/// `None` when none are.
pub fn all(conds: impl IntoIterator<Item = Option<Expr>>) -> Option<Expr> {
    conds.into_iter().flatten().reduce(and)
}

/// `if (a && b ..) { body }` over the conditions present, or the body alone
/// when all are statically true.
pub fn guarded(conds: impl IntoIterator<Item = Option<Expr>>, body: Vec<Stmt>) -> Vec<Stmt> {
    match all(conds) {
        Some(cond) => vec![Stmt::If(cond, body)],
        None => body,
    }
}

/// `const int name = value;`
pub fn let_int(name: &str, value: Expr) -> Stmt {
    Stmt::Let {
        name: name.into(),
        ty: Ty::I32,
        value,
        constant: true,
    }
}

/// Array `name` accessed as `ty`.
pub fn array(name: &str, ty: Ty) -> ArrayRef {
    ArrayRef {
        name: name.into(),
        ty,
        reinterpret: false,
    }
}

/// `#pragma unroll for (int var = 0; var < n; var += 1) { body }`
pub fn unrolled(var: &str, n: usize, body: Vec<Stmt>) -> Stmt {
    Stmt::For {
        var: var.into(),
        start: int(0),
        end: int(n as i64),
        step: int(1),
        unroll: true,
        body,
    }
}

/// `float name = value;` (`const` when `constant`).
pub fn let_float(name: &str, value: Expr, constant: bool) -> Stmt {
    Stmt::Let {
        name: name.into(),
        ty: Ty::F32,
        value,
        constant,
    }
}

/// An f32 array (shared or per-thread) by name.
pub fn f32_array(name: &str) -> ArrayRef {
    ArrayRef {
        name: name.into(),
        ty: Ty::F32,
        reinterpret: false,
    }
}

/// `name[index]` of an f32 array.
pub fn at(name: &str, index: Expr) -> Expr {
    Expr::Load(f32_array(name), Box::new(index))
}

/// `for (int var = start; var < end; var += step) { body }`, unroll left to the compiler.
pub fn counted(var: &str, start: Expr, end: Expr, step: usize, body: Vec<Stmt>) -> Stmt {
    Stmt::For {
        var: var.into(),
        start,
        end,
        step: int(step as i64),
        unroll: false,
        body,
    }
}

/// `a < n` for an integer bound.
pub fn below(a: Expr, n: usize) -> Expr {
    lt(a, int(n as i64))
}

/// `f(args..)`.
pub fn call(f: &str, args: Vec<Expr>) -> Expr {
    Expr::Call(f.to_string(), args)
}

/// `c ? a : b`.
pub fn select(c: Expr, a: Expr, b: Expr) -> Expr {
    Expr::Select(Box::new(c), Box::new(a), Box::new(b))
}

/// `min(max(e, lo), hi)` on integers, folded away when `e` is a literal in range.
pub fn clamp(e: Expr, lo: i64, hi: i64) -> Expr {
    match e {
        Expr::Int(x) => Expr::Int(x.clamp(lo, hi)),
        e => call("min", vec![call("max", vec![e, int(lo)]), int(hi)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unrolled(var: &str, body: Vec<Stmt>) -> Stmt {
        Stmt::For {
            var: var.into(),
            start: int(0),
            end: int(8),
            step: int(1),
            unroll: true,
            body,
        }
    }

    fn array(name: &str) -> ArrayRef {
        ArrayRef {
            name: name.into(),
            ty: Ty::F32,
            reinterpret: false,
        }
    }

    #[test]
    fn the_unroll_limit_keeps_loops_over_register_arrays_whole() {
        // for kk { x = smem[kk]; for i { acc[i] += x } } then for i { out[i] = acc[i] }:
        // kk indexes shared memory only; i indexes the register array acc.
        let acc = |i: Expr| Expr::Load(array("acc"), Box::new(i));
        let kk_body = vec![
            Stmt::Let {
                name: "x".into(),
                ty: Ty::F32,
                value: Expr::Load(array("smem"), Box::new(var("kk"))),
                constant: true,
            },
            unrolled(
                "i",
                vec![Stmt::Store(
                    array("acc"),
                    var("i"),
                    add(acc(var("i")), var("x")),
                )],
            ),
        ];
        // kt indexes acc through a variable derived from it.
        let kt_body = vec![
            Stmt::Let {
                name: "j".into(),
                ty: Ty::I32,
                value: mul(var("kt"), int(2)),
                constant: true,
            },
            Stmt::Store(array("acc"), var("j"), Expr::F32(0.0)),
        ];
        let kernel = Kernel {
            name: "k".into(),
            summary: String::new(),
            params: Vec::new(),
            shared: Vec::new(),
            body: vec![
                Stmt::LocalArray {
                    name: "acc".into(),
                    ty: Ty::F32,
                    len: 16,
                },
                unrolled("kk", kk_body),
                unrolled("kt", kt_body),
            ],
            helpers: BTreeSet::new(),
            block: 32,
            grid: 1,
            dynamic_shared: 0,
            min_blocks_per_sm: 0,
            scratch: Vec::new(),
            requires_arch: None,
            adapted: Vec::new(),
        };
        let limited = kernel.with_unroll_limit(4);
        let loops: Vec<(&str, bool)> = limited
            .body
            .iter()
            .filter_map(|s| match s {
                Stmt::For { var, unroll, .. } => Some((var.as_str(), *unroll)),
                _ => None,
            })
            .collect();
        assert_eq!(loops, [("kk", false), ("kt", true)]);
        assert_eq!(limited.body[1], Stmt::Pragma("unroll 4".into()));
        let Stmt::For { body, .. } = &limited.body[2] else {
            panic!("the kk loop follows its pragma")
        };
        assert!(
            matches!(body[1], Stmt::For { unroll: true, .. }),
            "{body:?}"
        );
    }
}
