"""ViT-B/16 f32 b32's GEMMs (strict f32) through PyTorch: cuBLAS against
cuBLASLt, the weight as [k, n] (what the ONNX export stores, cuBLASLt 'nn'
for dcir) against [n, k] ('tn'), with and without the bias; median ms of
CUDA-event-timed runs."""
import torch, statistics
torch.backends.cuda.matmul.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
def t(fn, reps=30):
    for _ in range(5): fn()
    s = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); s.append(a.elapsed_time(b))
    return statistics.median(s)
m = 6304
for (k, n, name) in [(768, 2304, "qkv"), (768, 768, "out"), (768, 3072, "mlp1"), (3072, 768, "mlp2")]:
    x = torch.randn(m, k, device="cuda")
    w_kn = torch.randn(k, n, device="cuda")
    w_nk = w_kn.t().contiguous()
    bias = torch.randn(n, device="cuda")
    res = torch.randn(m, n, device="cuda")
    row = []
    for lib in ["cublas", "cublaslt"]:
        torch.backends.cuda.preferred_blas_library(lib)
        row.append(f"{lib}: kn {t(lambda: x @ w_kn):.4f} nk {t(lambda: x @ w_nk.t()):.4f} "
                   f"kn+bias {t(lambda: torch.addmm(bias, x, w_kn)):.4f} nk+bias {t(lambda: torch.addmm(bias, x, w_nk.t())):.4f} "
                   f"nk+res {t(lambda: torch.addmm(res, x, w_nk.t())):.4f}")
    print(name, m, k, n, " | ".join(row), flush=True)
torch.backends.cuda.preferred_blas_library("cublas")
from torch.profiler import profile, ProfilerActivity
x = torch.randn(m, 768, device="cuda"); w_kn = torch.randn(768, 2304, device="cuda"); bias = torch.randn(2304, device="cuda")
for lib in ["cublas", "cublaslt"]:
    torch.backends.cuda.preferred_blas_library(lib)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        x @ w_kn; x @ w_kn.t().contiguous().t(); torch.addmm(bias, x, w_kn); torch.cuda.synchronize()
    print(lib, [e.key[:110] for e in prof.key_averages() if e.device_time_total > 0])
