"""ViT-B/16 f32 b32's GEMMs (strict f32) through PyTorch: cuBLAS against
cuBLASLt, the weight as [k, n] (what the ONNX export stores, cuBLASLt 'nn'
for dcir) against [n, k] ('tn'), with and without the bias; then cuBLASLt
called as dcir calls it, the heuristic's first eight algorithms each timed.
Median ms of CUDA-event-timed runs."""
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

# cuBLASLt as dcir calls it (library.rs: f32 compute, 32 MiB workspace, the
# row-major product as the column-major outᵀ = bᵀ·aᵀ), through ctypes: the
# heuristic's first eight algorithms for each projection, weight [k, n] ('nn')
# and [n, k] ('tn'), bare and with the bias epilogue, each timed; the rank the
# heuristic gave it, its config words (algorithm id, tile id, split-k) and ms.
import ctypes, glob, os

def _cublaslt():
    for d in ["/usr/local/cuda/lib64"] + [os.path.join(p, "nvidia/cu13/lib") for p in __import__("site").getsitepackages()]:
        for f in sorted(glob.glob(os.path.join(d, "libcublasLt.so*"))):
            try:
                return ctypes.CDLL(f)
            except OSError:
                pass
    raise OSError("no libcublasLt.so")

class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]

class Heuristic(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]

def lt_probe():
    lt = _cublaslt()
    vp = ctypes.c_void_p
    def ok(status, what):
        if status != 0:
            raise RuntimeError(f"{what}: cuBLAS status {status}")
    handle = vp(); ok(lt.cublasLtCreate(ctypes.byref(handle)), "create")
    ws_bytes = 32 << 20
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
    stream = vp(torch.cuda.current_stream().cuda_stream)
    COMPUTE_32F, R_32F = 68, 0
    TRANSA, TRANSB, EPILOGUE, BIAS_POINTER = 3, 4, 7, 8
    EPI_BIAS = 4
    PREF_MAX_WORKSPACE = 1
    ALGO_ID, TILE_ID, SPLITK = 0, 1, 2
    def layout(rows, cols, ld):
        l = vp(); ok(lt.cublasLtMatrixLayoutCreate(ctypes.byref(l), R_32F, ctypes.c_uint64(rows), ctypes.c_uint64(cols), ctypes.c_int64(ld)), "layout"); return l
    def config(algo, attr):
        v = ctypes.c_int32(-1); w = ctypes.c_size_t()
        lt.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(v), 4, ctypes.byref(w))
        return v.value
    for (k, n, name) in [(768, 2304, "qkv"), (768, 768, "out"), (768, 3072, "mlp1"), (3072, 768, "mlp2")]:
        a = torch.randn(m, k, device="cuda")
        bias = torch.randn(n, device="cuda")
        d = torch.empty(m, n, device="cuda")
        for form in ["nn", "tn"]:
            b = torch.randn(k, n, device="cuda") if form == "nn" else torch.randn(n, k, device="cuda")
            for epi in ["bare", "bias"]:
                desc = vp(); ok(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F), "desc")
                op_a = ctypes.c_int32(0 if form == "nn" else 1); op_b = ctypes.c_int32(0)
                ok(lt.cublasLtMatmulDescSetAttribute(desc, TRANSA, ctypes.byref(op_a), 4), "transa")
                ok(lt.cublasLtMatmulDescSetAttribute(desc, TRANSB, ctypes.byref(op_b), 4), "transb")
                if epi == "bias":
                    e = ctypes.c_int32(EPI_BIAS); p = vp(bias.data_ptr())
                    ok(lt.cublasLtMatmulDescSetAttribute(desc, EPILOGUE, ctypes.byref(e), 4), "epilogue")
                    ok(lt.cublasLtMatmulDescSetAttribute(desc, BIAS_POINTER, ctypes.byref(p), 8), "bias")
                la = layout(n, k, n) if form == "nn" else layout(k, n, k)
                lb = layout(k, m, k)
                ld = layout(n, m, n)
                pref = vp(); ok(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
                wsz = ctypes.c_uint64(ws_bytes)
                ok(lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(wsz), 8), "pref ws")
                results = (Heuristic * 8)(); count = ctypes.c_int(0)
                ok(lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 8, results, ctypes.byref(count)), "heuristic")
                alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
                row = []
                for i in range(count.value):
                    algo = results[i].algo
                    def call():
                        ok(lt.cublasLtMatmul(handle, desc, ctypes.byref(alpha), vp(b.data_ptr()), la, vp(a.data_ptr()), lb,
                                             ctypes.byref(beta), vp(d.data_ptr()), ld, vp(d.data_ptr()), ld,
                                             ctypes.byref(algo), vp(ws.data_ptr()), ctypes.c_size_t(ws_bytes), stream), "matmul")
                    try:
                        ms = t(call, reps=20)
                        row.append(f"#{i} id{config(algo, ALGO_ID)}/tile{config(algo, TILE_ID)}/sk{config(algo, SPLITK)}/waves{results[i].wavesCount:.2f} {ms:.4f}")
                    except RuntimeError as err:
                        row.append(f"#{i} {err}")
                print(f"lt {name} {form} {epi}: " + " | ".join(row), flush=True)
                for h in (la, lb, ld):
                    lt.cublasLtMatrixLayoutDestroy(h)
                lt.cublasLtMatmulPreferenceDestroy(pref)
                lt.cublasLtMatmulDescDestroy(desc)

try:
    lt_probe()
except Exception as err:  # the PyTorch half above stands on its own
    print(f"lt probe failed: {err}")
