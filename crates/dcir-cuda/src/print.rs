//! The CUDA C printer: a [`Kernel`] to header-free source NVRTC compiles alone.
//!
//! Output is a pure function of the kernel: helpers in a fixed order, two-space
//! indentation, parentheses only where C precedence needs them, floats printed
//! so they read back exactly.

use std::borrow::Cow;
use std::fmt::Write;

use crate::kir::{ArrayRef, BinOp, Builtin, Expr, Helper, Kernel, Shuffle, Stmt, Ty, WgmmaShape};

/// The C spelling of a type.
pub fn c_type(ty: Ty) -> &'static str {
    match ty {
        Ty::F32 => "float",
        Ty::F16Bits | Ty::Bf16Bits => "unsigned short",
        Ty::I32 => "int",
        Ty::I64 => "long long",
        Ty::Bool => "bool",
        Ty::Float4 => "float4",
        Ty::Float2 => "float2",
        Ty::U32 => "unsigned int",
        Ty::Uint2 => "uint2",
        Ty::Uint4 => "uint4",
    }
}

fn helper_source(helper: Helper) -> Cow<'static, str> {
    match helper {
        Helper::Hopper => HOPPER_HELPERS.into(),
        Helper::Wgmma(shape) => wgmma_source(shape).into(),
        _ => fixed_helper_source(helper).into(),
    }
}

/// Hopper's asynchronous machinery ([`Helper::Hopper`]).
const HOPPER_HELPERS: &str = r#"// A TMA descriptor (CUtensorMap), passed by value as a __grid_constant__ parameter.
struct alignas(64) dcir_tensor_map { unsigned long long opaque[16]; };
__device__ __forceinline__ unsigned dcir_smem_base(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void dcir_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
// Makes the barriers' initialization visible to the copy engine.
__device__ __forceinline__ void dcir_mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Arrives and adds `bytes` of copies the phase waits for.
__device__ __forceinline__ void dcir_mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void dcir_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void dcir_mbar_wait(unsigned bar, unsigned parity) {
  asm volatile("{\n .reg .pred done;\n dcir_wait_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra dcir_wait_%=;\n}"
               :: "r"(bar), "r"(parity) : "memory");
}
// Brings a tensor map's descriptor into the cache ahead of the copies that read it.
__device__ __forceinline__ void dcir_prefetch_tensor_map(const dcir_tensor_map& map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<unsigned long long>(&map)) : "memory");
}
// A box of `map` at element coordinates (c0 innermost, ..) into shared memory at
// `dst`, counted on barrier `bar`; zeros outside the tensor.
__device__ __forceinline__ void dcir_tma_load2(unsigned dst, const dcir_tensor_map& map, unsigned bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
               :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
__device__ __forceinline__ void dcir_tma_load3(unsigned dst, const dcir_tensor_map& map, unsigned bar, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
               :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
__device__ __forceinline__ void dcir_tma_load4(unsigned dst, const dcir_tensor_map& map, unsigned bar, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];"
               :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
// A column of pixels of an NHWC im2col map: channels from `c` of the pixels
// whose window origins walk from (`w`, `h`) of image `n`, at tap (`ow`, `oh`).
__device__ __forceinline__ void dcir_tma_load_im2col4(unsigned dst, const dcir_tensor_map& map, unsigned bar, int c, int w, int h, int n, int ow, int oh) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8};"
               :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(c), "r"(w), "r"(h), "r"(n),
                  "h"((unsigned short)ow), "h"((unsigned short)oh) : "memory");
}
// setmaxnreg: a producer thread's registers shrink to N, a consumer's grow to N.
template <unsigned N> __device__ __forceinline__ void dcir_producer_registers() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(N)); }
template <unsigned N> __device__ __forceinline__ void dcir_consumer_registers() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(N)); }
// Four 8x8 blocks of 16-bit pairs (a warp's mma accumulator fragments, r0..r3)
// into shared memory transposed: lanes 8q..8q+8 give the addresses of block q's rows.
__device__ __forceinline__ void dcir_stmatrix_x4_trans(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
// Waits for the 128 threads of warpgroup `id` (named barrier `id`; 0 is __syncthreads').
__device__ __forceinline__ void dcir_warpgroup_barrier(int id) { asm volatile("bar.sync %0, 128;" :: "r"(id) : "memory"); }
// Split-K: counts warpgroup `role`'s split in at `arrivals[slot]`; true in the last
// of `splits` to arrive (which resets the entry), once every split's partial sums are
// visible. `flag`: the warpgroup's word of shared memory.
__device__ __forceinline__ bool dcir_split_arrive_wg(unsigned* arrivals, int slot, int splits, int role, volatile unsigned* flag) {
  __threadfence();
  dcir_warpgroup_barrier(role);
  if ((threadIdx.x & 127) == 0) {
    const unsigned last = atomicAdd(arrivals + slot, 1u) == (unsigned)(splits - 1);
    if (last) arrivals[slot] = 0u;
    *flag = last;
  }
  dcir_warpgroup_barrier(role);
  const bool last = *flag != 0u;
  if (last) __threadfence();
  return last;
}
__device__ __forceinline__ void dcir_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void dcir_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void dcir_wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void dcir_wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// The descriptor of a swizzled operand tile at shared address `addr`, `lbo`
// and `sbo` its leading- and stride-dimension byte offsets, `swizzle` the
// mode (1: 128-byte rows, 2: 64, 3: 32).
__device__ __forceinline__ unsigned long long dcir_wgmma_desc(unsigned addr, unsigned lbo, unsigned sbo, unsigned swizzle) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16)
       | ((unsigned long long)(sbo >> 4) << 32) | ((unsigned long long)swizzle << 62);
}
"#;

/// The `wgmma` of one shape ([`Helper::Wgmma`]): `d` (N/2 accumulators per
/// thread) += A (descriptor `a`) · B (descriptor `b`).
fn wgmma_source(shape: WgmmaShape) -> String {
    let regs = usize::from(shape.n) / 2;
    let list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    let ty = if shape.bf16 { "bf16" } else { "f16" };
    format!(
        "__device__ __forceinline__ void {name}(float* d, unsigned long long a, unsigned long long b) {{\n  \
         asm volatile(\"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{list}}}, %{da}, %{db}, 1, 1, 1, {ta}, {tb};\"\n               \
         : {outs}\n               : \"l\"(a), \"l\"(b));\n}}\n",
        name = shape.helper_name(),
        n = shape.n,
        list = list.join(", "),
        outs = outs.join(", "),
        da = regs,
        db = regs + 1,
        ta = u8::from(shape.a_m_major),
        tb = u8::from(shape.b_n_major),
    )
}

fn fixed_helper_source(helper: Helper) -> &'static str {
    match helper {
        Helper::Half => {
            "__device__ __forceinline__ float dcir_h2f(unsigned short h) {\n  float f;\n  asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h));\n  return f;\n}\n\
__device__ __forceinline__ unsigned short dcir_f2h(float f) {\n  unsigned short h;\n  asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f));\n  return h;\n}\n\
__device__ __forceinline__ float dcir_round_h(float f) { return dcir_h2f(dcir_f2h(f)); }\n"
        }
        Helper::Bfloat16 => {
            "__device__ __forceinline__ float dcir_bf2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }\n\
__device__ __forceinline__ unsigned short dcir_f2bf(float f) {\n  unsigned short b;\n  asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(b) : \"f\"(f));\n  return b;\n}\n\
__device__ __forceinline__ float dcir_round_bf(float f) { return dcir_bf2f(dcir_f2bf(f)); }\n"
        }
        Helper::NanMinMax => {
            r#"// max/min/relu that propagate NaN (fmaxf/fminf do not): one instruction from sm_80.
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ float dcir_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float dcir_min(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#else
__device__ __forceinline__ float dcir_max(float a, float b) { return (a != a || b != b) ? a + b : fmaxf(a, b); }
__device__ __forceinline__ float dcir_min(float a, float b) { return (a != a || b != b) ? a + b : fminf(a, b); }
#endif
__device__ __forceinline__ float dcir_relu(float x) { return dcir_max(x, 0.0f); }
"#
        }
        Helper::Gelu => {
            r#"// gelu(x) = 0.5·x·(1 + erf(x/√2)), with erfc(|x|/√2) = 2^p(|x|) and p a degree-8
// polynomial (least-maximum fit of log2 erfc on [0, 5.6], decreasing past it):
// 0.5·x·e for x < 0 (no cancellation), 0.5·x·(2 − e) for x ≥ 0. Absolute error
// of e ≤ 7e-8 in f32 arithmetic, plus ex2.approx's 2 ulp; erff costs 8 more instructions.
__device__ __forceinline__ float dcir_gelu(float x) {
  const float a = fabsf(x);
  float p = fmaf(-2.834778570e-06f, a, 3.937612564e-05f);
  p = fmaf(p, a, -1.861730998e-04f);
  p = fmaf(p, a, -1.369527308e-04f);
  p = fmaf(p, a, 7.063440047e-03f);
  p = fmaf(p, a, -5.249619111e-02f);
  p = fmaf(p, a, -4.592081904e-01f);
  p = fmaf(p, a, -1.151105165e+00f);
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(p * a));
  return 0.5f * x * (x >= 0.0f ? 2.0f - e : e);
}
__device__ __forceinline__ float dcir_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
"#
        }
        Helper::Exp2 => {
            "__device__ __forceinline__ float dcir_exp2(float x) {\n  float e;\n  asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(e) : \"f\"(x));\n  return e;\n}\n"
        }
        Helper::Sigmoid => {
            "__device__ __forceinline__ float dcir_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }\n"
        }
        Helper::IntPow => {
            "// a ^ b by squaring, wrapping (unsigned products); for b < 0 the real result\n\
// truncated toward zero: 0 unless |a| = 1.\n\
__device__ __forceinline__ long long dcir_ipow(long long a, long long b) {\n  if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;\n  unsigned long long base = (unsigned long long)a, acc = 1;\n  while (b > 0) {\n    if (b & 1) acc *= base;\n    base *= base;\n    b >>= 1;\n  }\n  return (long long)acc;\n}\n"
        }
        Helper::CpAsync => {
            "__device__ __forceinline__ unsigned dcir_smem_u32(const void* p) {\n  unsigned a;\n  asm(\"{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }\" : \"=r\"(a) : \"l\"(p));\n  return a;\n}\n\
__device__ __forceinline__ void dcir_st_shared16(unsigned addr, uint4 v) {\n  asm volatile(\"st.shared.v4.b32 [%0], {%1, %2, %3, %4};\" :: \"r\"(addr), \"r\"(v.x), \"r\"(v.y), \"r\"(v.z), \"r\"(v.w) : \"memory\");\n}\n\
// 16 bytes global -> shared, asynchronous; zeros (and no read) when !full.\n\
__device__ __forceinline__ void dcir_cp_async16(unsigned dst, const void* src, bool full) {\n  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\" :: \"r\"(dst), \"l\"(src), \"r\"(full ? 16 : 0) : \"memory\");\n}\n\
__device__ __forceinline__ void dcir_cp_async_commit() { asm volatile(\"cp.async.commit_group;\" ::: \"memory\"); }\n\
// Waits until at most N committed groups of this thread are still in flight.\n\
template <int N> __device__ __forceinline__ void dcir_cp_async_wait() { asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(N) : \"memory\"); }\n"
        }
        Helper::Ldmatrix => {
            "// Lane l gives the address of row l % 8 of 8x8 matrix l / 8; r_i receives matrix i.\n\
__device__ __forceinline__ void dcir_ldmatrix_x4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned addr) {\n  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\" : \"=r\"(r0), \"=r\"(r1), \"=r\"(r2), \"=r\"(r3) : \"r\"(addr));\n}\n\
__device__ __forceinline__ void dcir_ldmatrix_x4_trans(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned addr) {\n  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\" : \"=r\"(r0), \"=r\"(r1), \"=r\"(r2), \"=r\"(r3) : \"r\"(addr));\n}\n"
        }
        Helper::MmaF16 => {
            "// d += a (16x16, row) * b (16x8, col), f16 operands, f32 accumulators.\n\
__device__ __forceinline__ void dcir_mma_f16(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {\n  asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\"\n               : \"+f\"(d0), \"+f\"(d1), \"+f\"(d2), \"+f\"(d3) : \"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"r\"(b0), \"r\"(b1));\n}\n"
        }
        Helper::SharedStore16Bit => {
            "__device__ __forceinline__ void dcir_st_shared2(unsigned addr, unsigned short v) {\n  asm volatile(\"st.shared.u16 [%0], %1;\" :: \"r\"(addr), \"h\"(v) : \"memory\");\n}\n"
        }
        Helper::SplitK => {
            "// Split-K: counts this block in at `tile`; true in the last of `splits` blocks to\n\
// arrive, which resets the count (so it reads zero at the next launch).\n\
__device__ __forceinline__ bool dcir_split_arrive(unsigned int* arrivals, int tile, int splits) {\n  __shared__ bool last;\n  __threadfence();\n  __syncthreads();\n  if (threadIdx.x == 0) {\n    last = atomicAdd(arrivals + tile, 1u) == (unsigned int)(splits - 1);\n    if (last) arrivals[tile] = 0u;\n  }\n  __syncthreads();\n  if (last) __threadfence();\n  return last;\n}\n\
// Another block's partial sum, read past L1.\n\
__device__ __forceinline__ float dcir_ldcg(const float* p, int i) { return __ldcg(p + i); }\n"
        }
        Helper::SplitSum => {
            "// The sum of one slot's partial sums over `splits` splits `stride` apart, in split\n\
// order, read past L1 (other blocks wrote them).\n\
__device__ __forceinline__ float dcir_split_sum(const float* p, int first, int stride, int splits) {\n  float sum = 0.0f;\n  for (int s = 0; s < splits; ++s) sum += __ldcg(p + first + s * stride);\n  return sum;\n}\n"
        }
        Helper::MmaBf16 => {
            "// d += a (16x16, row) * b (16x8, col), bf16 operands, f32 accumulators.\n\
__device__ __forceinline__ void dcir_mma_bf16(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {\n  asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\"\n               : \"+f\"(d0), \"+f\"(d1), \"+f\"(d2), \"+f\"(d3) : \"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"r\"(b0), \"r\"(b1));\n}\n"
        }
        Helper::Hopper | Helper::Wgmma(_) => unreachable!("generated by helper_source"),
    }
}

/// Prints one kernel as a translation unit: its helpers, then the kernel.
pub fn print_kernel(k: &Kernel) -> String {
    let mut out = print_helpers(&k.helpers);
    out.push_str(&print_kernel_only(k));
    out
}

/// The source of `helpers` (in their fixed order), followed by a blank
/// line when there are any: what kernels that use them need above them.
pub fn print_helpers<'a>(helpers: impl IntoIterator<Item = &'a Helper>) -> String {
    let mut out = String::new();
    for h in helpers {
        out.push_str(&helper_source(*h));
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

/// Prints one kernel without its helpers (which [`print_helpers`] gives once
/// for several kernels).
pub fn print_kernel_only(k: &Kernel) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "// {}", k.summary);
    if k.dynamic_shared > 0 {
        let _ = writeln!(
            out,
            "// launch: grid {}, block {}, dynamic shared {} bytes",
            k.grid, k.block, k.dynamic_shared
        );
    } else {
        let _ = writeln!(out, "// launch: grid {}, block {}", k.grid, k.block);
    }
    let params: Vec<String> = k
        .params
        .iter()
        .map(|p| {
            if p.tensor_map.is_some() {
                return format!("const __grid_constant__ dcir_tensor_map {}", p.name);
            }
            let constness = if p.output { "" } else { "const " };
            format!("{constness}{}* __restrict__ {}", c_type(p.ty), p.name)
        })
        .collect();
    let bounds = if k.min_blocks_per_sm > 0 {
        format!("{}, {}", k.block, k.min_blocks_per_sm)
    } else {
        k.block.to_string()
    };
    let _ = writeln!(
        out,
        "extern \"C\" __global__ void __launch_bounds__({bounds}) {}({}) {{",
        k.name,
        params.join(", ")
    );
    for s in &k.shared {
        let _ = writeln!(out, "  __shared__ {} {}[{}];", c_type(s.ty), s.name, s.len);
    }
    if k.dynamic_shared > 0 {
        out.push_str("  extern __shared__ __align__(16) unsigned char dcir_smem[];\n");
    }
    print_block(&mut out, &k.body, 1);
    out.push_str("}\n");
    out
}

fn print_block(out: &mut String, body: &[Stmt], depth: usize) {
    for s in body {
        print_stmt(out, s, depth);
    }
}

fn print_stmt(out: &mut String, s: &Stmt, depth: usize) {
    let pad = "  ".repeat(depth);
    match s {
        Stmt::Comment(text) => {
            let _ = writeln!(out, "{pad}// {text}");
        }
        Stmt::Pragma(text) => {
            let _ = writeln!(out, "{pad}#pragma {text}");
        }
        Stmt::Let {
            name,
            ty,
            value,
            constant,
        } => {
            let c = if *constant { "const " } else { "" };
            let _ = writeln!(out, "{pad}{c}{} {name} = {};", c_type(*ty), expr(value));
        }
        Stmt::Assign(name, value) => {
            let _ = writeln!(out, "{pad}{name} = {};", expr(value));
        }
        Stmt::Store(array, index, value) => {
            let _ = writeln!(
                out,
                "{pad}{} = {};",
                access(array, index, true),
                expr(value)
            );
        }
        Stmt::For {
            var,
            start,
            end,
            step,
            unroll,
            body,
        } => {
            if *unroll {
                let _ = writeln!(out, "{pad}#pragma unroll");
            }
            let _ = writeln!(
                out,
                "{pad}for (int {var} = {}; {var} < {}; {var} += {}) {{",
                expr(start),
                expr(end),
                expr(step)
            );
            print_block(out, body, depth + 1);
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::If(cond, body) => {
            let _ = writeln!(out, "{pad}if ({}) {{", expr(cond));
            print_block(out, body, depth + 1);
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::IfElse(cond, then, otherwise) => {
            let _ = writeln!(out, "{pad}if ({}) {{", expr(cond));
            print_block(out, then, depth + 1);
            let _ = writeln!(out, "{pad}}} else {{");
            print_block(out, otherwise, depth + 1);
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::Barrier => {
            let _ = writeln!(out, "{pad}__syncthreads();");
        }
        Stmt::Call(f, args) => {
            let _ = writeln!(out, "{pad}{};", expr(&Expr::Call(f.clone(), args.clone())));
        }
        Stmt::LocalArray { name, ty, len } => {
            let _ = writeln!(out, "{pad}{} {name}[{len}];", c_type(*ty));
        }
        Stmt::SharedView { name, ty, offset } => {
            let t = c_type(*ty);
            let _ = writeln!(
                out,
                "{pad}{t}* const {name} = reinterpret_cast<{t}*>(dcir_smem + {offset});"
            );
        }
    }
}

fn access(array: &ArrayRef, index: &Expr, write: bool) -> String {
    if array.reinterpret {
        let constness = if write { "" } else { "const " };
        format!(
            "reinterpret_cast<{constness}{}*>({})[{}]",
            c_type(array.ty),
            array.name,
            expr(index)
        )
    } else {
        format!("{}[{}]", array.name, expr(index))
    }
}

/// Prints an expression.
pub fn expr(e: &Expr) -> String {
    let mut s = String::new();
    write_expr(&mut s, e, 0);
    s
}

/// Precedence of unary operators and casts.
const UNARY: u8 = 12;
/// Precedence of names, literals, calls, indexing and member access.
const ATOM: u8 = 13;

fn prec(e: &Expr) -> u8 {
    match e {
        Expr::Select(..) => 1,
        Expr::Bin(op, ..) => match op {
            BinOp::Or => 2,
            BinOp::And => 3,
            BinOp::BitOr => 4,
            BinOp::BitXor => 5,
            BinOp::BitAnd => 6,
            BinOp::Eq | BinOp::Ne => 7,
            BinOp::Lt | BinOp::Ge => 8,
            BinOp::Shl | BinOp::Shr => 9,
            BinOp::Add | BinOp::Sub => 10,
            BinOp::Mul | BinOp::Div | BinOp::Rem => 11,
        },
        Expr::Neg(_) | Expr::Not(_) | Expr::Cast(..) => UNARY,
        Expr::Int(v) if *v < 0 => UNARY,
        Expr::F32(v) if v.is_sign_negative() => UNARY,
        _ => ATOM,
    }
}

fn op_str(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::Rem => "%",
        BinOp::Lt => "<",
        BinOp::Ge => ">=",
        BinOp::Eq => "==",
        BinOp::Ne => "!=",
        BinOp::Or => "||",
        BinOp::And => "&&",
        BinOp::BitOr => "|",
        BinOp::BitAnd => "&",
        BinOp::BitXor => "^",
        BinOp::Shl => "<<",
        BinOp::Shr => ">>",
    }
}

/// A float literal that reads back to the same f32.
pub fn float_literal(v: f32) -> String {
    if v.is_nan() {
        "__int_as_float(0x7fc00000)".to_string()
    } else if v.is_infinite() {
        if v > 0.0 {
            "__int_as_float(0x7f800000)".to_string()
        } else {
            "__int_as_float(0xff800000)".to_string()
        }
    } else {
        let s = format!("{v:?}");
        if s.contains('e') || s.contains('.') {
            format!("{s}f")
        } else {
            format!("{s}.0f")
        }
    }
}

fn write_expr(out: &mut String, e: &Expr, min_prec: u8) {
    let p = prec(e);
    let paren = p < min_prec;
    if paren {
        out.push('(');
    }
    match e {
        Expr::Var(name) => out.push_str(name),
        // `-9223372036854775808` would negate a literal no type holds.
        Expr::Int(i64::MIN) => out.push_str("(-9223372036854775807LL - 1)"),
        Expr::Int(v) => {
            let _ = write!(out, "{v}");
        }
        Expr::F32(v) => out.push_str(&float_literal(*v)),
        Expr::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Expr::Builtin(b) => out.push_str(match b {
            Builtin::ThreadX => "threadIdx.x",
            Builtin::BlockX => "blockIdx.x",
            Builtin::BlockDimX => "blockDim.x",
            Builtin::GridDimX => "gridDim.x",
        }),
        Expr::Bin(op, a, b) => {
            // Left-associative: the right operand of `-`, `/`, `%` needs a
            // higher precedence to avoid regrouping.
            write_expr(out, a, p);
            let _ = write!(out, " {} ", op_str(*op));
            write_expr(out, b, p + 1);
        }
        Expr::Neg(a) => {
            out.push('-');
            write_expr(out, a, ATOM);
        }
        Expr::Not(a) => {
            out.push('!');
            write_expr(out, a, ATOM);
        }
        Expr::Select(c, a, b) => {
            write_expr(out, c, 2);
            out.push_str(" ? ");
            write_expr(out, a, 2);
            out.push_str(" : ");
            write_expr(out, b, 1);
        }
        Expr::Cast(ty, a) => {
            let _ = write!(out, "({})", c_type(*ty));
            write_expr(out, a, ATOM);
        }
        Expr::Call(f, args) => {
            out.push_str(f);
            out.push('(');
            for (i, a) in args.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_expr(out, a, 0);
            }
            out.push(')');
        }
        Expr::Load(array, index) => out.push_str(&access(array, index, false)),
        Expr::Field(v, f) => {
            write_expr(out, v, ATOM);
            let _ = write!(out, ".{f}");
        }
        Expr::Shfl(mode, v, offset) => {
            out.push_str(match mode {
                Shuffle::Xor => "__shfl_xor_sync(0xffffffffu, ",
                Shuffle::Up => "__shfl_up_sync(0xffffffffu, ",
                Shuffle::Down => "__shfl_down_sync(0xffffffffu, ",
            });
            write_expr(out, v, 0);
            let _ = write!(out, ", {offset})");
        }
    }
    if paren {
        out.push(')');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kir::{add, bin, int, mul, select, var};

    /// `dcir_gelu`'s polynomial, read back from the helper's text and run
    /// in f32 as the GPU runs it (`ex2` exact here), against libm's erfc.
    #[test]
    fn gelu_polynomial_is_erfc_to_f32_accuracy() {
        let src = helper_source(Helper::Gelu);
        let mut coeffs = Vec::new();
        for line in src.lines().filter(|l| l.contains("fmaf(")) {
            let args = line
                .split("fmaf(")
                .nth(1)
                .expect("call")
                .trim_end_matches(");");
            for arg in args
                .split(", ")
                .filter(|a| a.ends_with('f') && *a != "p" && *a != "a")
            {
                coeffs.push(arg.trim_end_matches('f').parse::<f32>().expect("literal"));
            }
        }
        assert_eq!(coeffs.len(), 8, "{src}");
        let mut worst = 0.0f64;
        for i in 0..=100_000 {
            let a = i as f32 * 1e-4;
            let p = coeffs[1..].iter().fold(coeffs[0], |p, &c| p.mul_add(a, c)) * a;
            let e = (p as f64).exp2();
            let exact = libm::erfc(a as f64 * std::f64::consts::FRAC_1_SQRT_2);
            worst = worst.max((e - exact).abs());
        }
        assert!(worst < 1e-7, "largest |2^p - erfc| = {worst:e}");
    }

    #[test]
    fn precedence_adds_only_needed_parentheses() {
        let e = mul(add(var("a"), var("b")), var("c"));
        assert_eq!(expr(&e), "(a + b) * c");
        let e = bin(BinOp::Sub, var("a"), bin(BinOp::Sub, var("b"), var("c")));
        assert_eq!(expr(&e), "a - (b - c)");
        let e = add(mul(var("a"), int(3)), var("b"));
        assert_eq!(expr(&e), "a * 3 + b");
        let e = select(bin(BinOp::Lt, var("i"), int(4)), var("x"), Expr::F32(-1.5));
        assert_eq!(expr(&e), "i < 4 ? x : -1.5f");
    }

    #[test]
    fn xor_binds_between_and_and_or() {
        let e = bin(
            BinOp::Shl,
            bin(BinOp::BitXor, add(var("a"), var("b")), var("c")),
            int(4),
        );
        assert_eq!(expr(&e), "(a + b ^ c) << 4");
        let e = bin(
            BinOp::BitXor,
            bin(BinOp::BitAnd, var("a"), var("b")),
            var("c"),
        );
        assert_eq!(expr(&e), "a & b ^ c");
        let e = bin(
            BinOp::BitAnd,
            bin(BinOp::BitXor, var("a"), var("b")),
            var("c"),
        );
        assert_eq!(expr(&e), "(a ^ b) & c");
        let e = bin(
            BinOp::BitOr,
            bin(BinOp::BitXor, var("a"), var("b")),
            var("c"),
        );
        assert_eq!(expr(&e), "a ^ b | c");
    }

    #[test]
    fn floats_read_back() {
        assert_eq!(float_literal(1.0), "1.0f");
        assert_eq!(float_literal(0.1), "0.1f");
        assert_eq!(float_literal(1e-5), "1e-5f");
        assert_eq!(
            float_literal(f32::NEG_INFINITY),
            "__int_as_float(0xff800000)"
        );
    }
}
