"""PyTorch (cuBLAS/cuDNN, eager) at the shapes of crates/dcir-cuda/examples/data/perf_*.dcir.
One line per workload: median ms of 5 x 50 event-timed calls after warm-up (strict fp32: TF32 off)."""
import statistics, torch, torch.nn.functional as F
torch.backends.cudnn.benchmark = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
d = "cuda"

def bench(fn, warm=10, iters=50):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(5):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters): fn()
        e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / iters)
    return statistics.median(ts)

def r(*shape, dt): return torch.randn(*shape, device=d, dtype=dt)
rows = []
def add(name, fn, flops=None, bytes_=None):
    ms = bench(fn); extra = ""
    if flops: extra += f" {flops / ms / 1e9:.1f} TFLOP/s"
    if bytes_: extra += f" {bytes_ / ms / 1e9:.3f} TB/s"
    print(f"{name}: {ms * 1e3:.1f} us{extra}", flush=True)

f32, f16, bf16 = torch.float32, torch.float16, torch.bfloat16
for n, dt, nm in [(4096, f32, "gemm_f32_4096"), (4096, f16, "gemm_f16_4096"), (8192, f16, "gemm_f16_8192"), (8192, bf16, "gemm_bf16_8192")]:
    a, b = r(n, n, dt=dt), r(n, n, dt=dt); add(nm, lambda: a @ b, 2 * n ** 3)
for dt, nm in [(f32, "ffn_f32_b32"), (f16, "ffn_f16_b32")]:
    x, w, bb = r(4096, 768, dt=dt), r(768, 3072, dt=dt), r(3072, dt=dt)
    add(nm, lambda: F.gelu(torch.addmm(bb, x, w)), 2 * 4096 * 768 * 3072)
for dt, nm in [(f32, "conv3x3_f32_b32"), (f16, "conv3x3_f16_b32")]:
    x, w, bb = r(32, 64, 56, 56, dt=dt), r(64, 64, 3, 3, dt=dt), r(64, dt=dt)
    add(nm, lambda: F.relu(F.conv2d(x, w, bb, padding=1)), 2 * 32 * 64 * 56 * 56 * 64 * 9)
x, w, bb = r(32, 256, 56, 56, dt=f32), r(64, 256, 1, 1, dt=f32), r(64, dt=f32)
add("conv1x1_f32_b32", lambda: F.relu(F.conv2d(x, w, bb)), 2 * 32 * 64 * 56 * 56 * 256)
x, w, bb = r(32, 144, 56, 56, dt=f32), r(144, 1, 3, 3, dt=f32), r(144, dt=f32)
add("depthwise_f32_b32", lambda: F.conv2d(x, w, bb, padding=1, groups=144).clamp(0, 6), bytes_=2 * 32 * 144 * 56 * 56 * 4)
wp, bp = r(24, 144, 1, 1, dt=f32), r(24, dt=f32)
add("dwpw_f32_b32", lambda: F.conv2d(F.conv2d(x, w, bb, padding=1, groups=144).clamp(0, 6), wp, bp))
x = r(32, 64, 112, 112, dt=f32)
add("maxpool_f32_b32", lambda: F.max_pool2d(x, 3, 2, 1), bytes_=32 * 64 * (112 * 112 + 56 * 56) * 4)
for dt, nm in [(f32, "attention_f32_b32"), (f16, "attention_f16_b32")]:
    q, k, v = r(384, 128, 64, dt=dt), r(384, 128, 64, dt=dt), r(384, 128, 64, dt=dt)
    add(nm + " (matmul+softmax+matmul)", lambda: torch.softmax((q @ k.transpose(1, 2)) * 0.125, -1) @ v, 4 * 384 * 128 * 128 * 64)
    add(nm + " (sdpa)", lambda: F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), scale=0.125), 4 * 384 * 128 * 128 * 64)
for dt, nm in [(f32, "eltwise_chain_32m_f32"), (f16, "eltwise_chain_32m_f16")]:
    x, y, w = r(8192, 4096, dt=dt), r(8192, 4096, dt=dt), r(8192, 4096, dt=dt)
    add(nm, lambda: F.gelu(x + y) * w, bytes_=4 * 8192 * 4096 * x.element_size())
