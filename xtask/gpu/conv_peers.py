"""cuDNN (PyTorch, channels-last, f16) at the shapes of
crates/dcir-cuda/examples/data/perf_conv_wgmma.dcir: ResNet-50's 3x3
convolutions at batch 32, no bias, and (perf_stem.dcir) its 7x7 stride-2
stem over the 3-channel image. One line per shape: the median of 5 x 50
replays of a CUDA graph of one call, event-timed, after cudnn.benchmark's
search (the same timing as dcir-run --bench: graph replays, medians)."""
import statistics, torch, torch.nn.functional as F
torch.backends.cudnn.benchmark = True
SHAPES = [("stem", 32, 224, 224, 3, 64, 2), ("l1", 32, 56, 56, 64, 64, 1), ("l2s2", 32, 56, 56, 128, 128, 2), ("l2", 32, 28, 28, 128, 128, 1),
          ("l3s2", 32, 28, 28, 256, 256, 2), ("l3", 32, 14, 14, 256, 256, 1), ("l4s2", 32, 14, 14, 512, 512, 2),
          ("l4", 32, 7, 7, 512, 512, 1)]
for name, n, h, w, c, o, s in SHAPES:
    cl = torch.channels_last
    x = torch.randn(n, c, h, w, device="cuda", dtype=torch.float16).to(memory_format=cl)
    k = 7 if name == "stem" else 3
    wt = torch.randn(o, c, k, k, device="cuda", dtype=torch.float16).to(memory_format=cl)
    fn = lambda: F.conv2d(x, wt, padding=k // 2, stride=s)
    for _ in range(10): fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): y = fn()
    for _ in range(10): g.replay()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(50): g.replay()
        b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) / 50)
    ms = statistics.median(ts)
    oh, ow = (h - 1) // s + 1, (w - 1) // s + 1
    flops = 2 * n * oh * ow * o * c * k * k
    print(f"cudnn_{name} median {ms:.4f} ms {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
