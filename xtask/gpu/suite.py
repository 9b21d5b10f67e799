"""The benchmark suite on the GPU machine: dcir and PyTorch on the same
workloads, in the same call, one table of ratios.

    python3 target/gpu/suite.py [--compile] [--out FILE.md]

dcir: `dcir-run FILE --backend cuda --bench 100` (fused kernels, memory plan,
one CUDA graph per forward pass; the median of 100 replays). PyTorch (our own
definitions of the same computations, random weights, eval mode, TF32 off):
eager, and with `--compile` also torch.compile default and
mode="reduce-overhead" (CUDA graphs), each the median of 5 x 50 event-timed
calls after warm-up. JAX/XLA (jax.jit, matmul precision "highest") for the
workloads defined in JAX here (ln_gelu, convblock, the BERT layer), the
median of 5 x 50 calls timed to block_until_ready. With --tune-cache FILE,
dcir tunes every graph first (dcir-run --tune; the cache makes a second
call measure nothing, so carry FILE between calls), and with --tune-fusion
fuses with measured times too; the tuning's time is printed per graph. f16 graphs are the f32
ones with every f32 made f16; batch 32 runs the ONNX models exported at
batch 32 and the BERT layer on 32 sequences. Two passes: dcir, eager and JAX
for every workload, then torch.compile (the slow part) in the same order
until --deadline. Writes the table (with date, GPU, driver and versions) to
--out after every measurement and a bar chart of dcir's speedup over the best
peer to --chart.
"""
import argparse, os, re, statistics, subprocess, sys, tempfile, time

# JAX would otherwise take 75 % of the GPU's memory at its first call.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.benchmark = True
HERE = os.path.dirname(os.path.abspath(__file__))
DEV = "cuda"


def timed_ms(fn, warm=10, iters=50, rounds=5):
    with torch.no_grad():
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / iters)
    return statistics.median(samples)


class LnGelu(nn.Module):
    """ir-examples/ln_gelu.dcir: gelu(layernorm(x + r)) * 1.5 over rows of 4096."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(4096)

    def forward(self, x, r):
        return F.gelu(self.ln(x + r)) * 1.5


class ConvBlock(nn.Module):
    """ir-examples/convblock_c64_56.dcir: conv3x3+bias+relu, conv1x1+bias+relu."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(64, 64, 3, padding=1)
        self.c2 = nn.Conv2d(64, 64, 1)

    def forward(self, x):
        return F.relu(self.c2(F.relu(self.c1(x))))


class BertLayer(nn.Module):
    """ir-examples/bert_encoder_layer.dcir: post-LN BERT-base layer, 12 heads,
    on `batch` sequences of 128 tokens given as (batch * 128, 768)."""

    def __init__(self, batch=1, h=768, heads=12, ff=3072):
        super().__init__()
        self.batch, self.heads = batch, heads
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(h, eps=1e-12), nn.LayerNorm(h, eps=1e-12)
        self.f1, self.f2 = nn.Linear(h, ff), nn.Linear(ff, h)

    def forward(self, x):
        t, h = x.shape
        split = lambda y: y.view(self.batch, t // self.batch, self.heads, -1).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        a = torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1) @ v
        x = self.ln1(self.o(a.transpose(1, 2).reshape(t, h)) + x)
        return self.ln2(self.f2(F.gelu(self.f1(x))) + x)


def jax_workload(name, batch, dtype):
    """A jitted JAX function and its inputs for workload `name`, or None."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_default_matmul_precision", "highest")
    dt = jnp.float32 if dtype == "f32" else jnp.float16
    key = iter(jax.random.split(jax.random.PRNGKey(0), 32))
    rand = lambda *shape: jax.random.normal(next(key), shape, dt)

    def layernorm(x, g, b, eps):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + eps) * g + b

    if name == "ln_gelu_4096":
        rows = 128 * batch
        g, b = rand(4096), rand(4096)
        fn = lambda x, r: jax.nn.gelu(layernorm(x + r, g, b, 1e-5), approximate=False) * 1.5
        return jax.jit(fn), [rand(rows, 4096), rand(rows, 4096)]
    if name == "convblock_c64_56":
        w1, b1, w2, b2 = rand(64, 64, 3, 3), rand(64), rand(64, 64, 1, 1), rand(64)
        dn = ("NCHW", "OIHW", "NCHW")
        conv = lambda x, w, p: jax.lax.conv_general_dilated(x, w, (1, 1), p, dimension_numbers=dn)
        fn = lambda x: jax.nn.relu(conv(jax.nn.relu(conv(x, w1, "SAME") + b1[:, None, None]), w2, "VALID")
                                   + b2[:, None, None])
        return jax.jit(fn), [rand(batch, 64, 56, 56)]
    if name == "bert_layer_s128":
        h, ff, t = 768, 3072, 128 * batch
        wq, wk, wv, wo = (rand(h, h) for _ in range(4))
        bq, bk, bv, bo = (rand(h) for _ in range(4))
        w1, b1, w2, b2 = rand(h, ff), rand(ff), rand(ff, h), rand(h)
        g1, c1, g2, c2 = rand(h), rand(h), rand(h), rand(h)

        def fn(x):
            split = lambda y: y.reshape(batch, 128, 12, 64).transpose(0, 2, 1, 3)
            q, k, v = split(x @ wq + bq), split(x @ wk + bk), split(x @ wv + bv)
            a = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) * 0.125, -1) @ v
            x = layernorm(a.transpose(0, 2, 1, 3).reshape(t, h) @ wo + bo + x, g1, c1, 1e-12)
            return layernorm(jax.nn.gelu(x @ w1 + b1, approximate=False) @ w2 + b2 + x, g2, c2, 1e-12)
        return jax.jit(fn), [rand(t, h)]
    return None


def jax_ms(job, warm=10, iters=50, rounds=5):
    import time
    fn, inputs = job
    for _ in range(warm):
        fn(*inputs).block_until_ready()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            out = fn(*inputs)
        out.block_until_ready()
        samples.append((time.perf_counter() - start) * 1e3 / iters)
    return statistics.median(samples)


def torchvision_model(name):
    """A torchvision model by its name under torchvision.models
    (`segmentation.deeplabv3_resnet50` for one of a submodule)."""
    import torchvision
    module = torchvision.models
    *path, last = name.split(".")
    for part in path:
        module = getattr(module, part)
    # No pretrained weights (the machine has no network), backbone included.
    kwargs = {"weights_backbone": None} if path else {}
    return getattr(module, last)(weights=None, **kwargs)


def workloads():
    """(name, batch, dcir file (f32), torch module factory, input shapes)."""
    data = "crates/dcir-cuda/examples/data"
    yield "ln_gelu_4096", 1, "ir-examples/ln_gelu.dcir", LnGelu, [(128, 4096), (128, 4096)]
    yield "ln_gelu_4096", 32, f"{data}/ln_gelu_b32.dcir#ln_gelu_b32_{{dtype}}", LnGelu, [(4096, 4096), (4096, 4096)]
    yield "convblock_c64_56", 1, "ir-examples/convblock_c64_56.dcir", ConvBlock, [(1, 64, 56, 56)]
    yield "convblock_c64_56", 32, "convblock_b32", ConvBlock, [(32, 64, 56, 56)]
    yield "bert_layer_s128", 1, "ir-examples/bert_encoder_layer.dcir", BertLayer, [(128, 768)]
    yield "bert_layer_s128", 32, "bert_b32", lambda: BertLayer(32), [(4096, 768)]
    yield "mobilenet_v2", 1, "onnx:mobilenet_v2", lambda: torchvision_model("mobilenet_v2"), [(1, 3, 224, 224)]
    yield "mobilenet_v2", 32, "onnx:mobilenet_v2_b32", lambda: torchvision_model("mobilenet_v2"), [(32, 3, 224, 224)]
    yield "resnet50", 1, "onnx:resnet50", lambda: torchvision_model("resnet50"), [(1, 3, 224, 224)]
    yield "resnet50", 32, "onnx:resnet50_b32", lambda: torchvision_model("resnet50"), [(32, 3, 224, 224)]
    yield "vit_b_16", 32, "export:vit_b_16:32", lambda: torchvision_model("vit_b_16"), [(32, 3, 224, 224)]
    yield ("deeplabv3_resnet50", 1, "export:segmentation.deeplabv3_resnet50:1:520",
           lambda: torchvision_model("segmentation.deeplabv3_resnet50"), [(1, 3, 520, 520)])


def dcir_graph(spec, dtype, scratch):
    """The .dcir file of a workload in `dtype` (f32 text, f32 -> f16 for f16),
    and the graph to run (`file#graph`: a file holding each dtype's graph)."""
    if "#" in spec:
        path, graph = spec.split("#")
        return path, graph.format(dtype=dtype)
    if spec.startswith("onnx:"):
        model = spec[5:]
        path = os.path.join(scratch, f"{model}.dcir")
        if not os.path.exists(path):
            subprocess.run([f"{HERE}/dcir-import", f"crates/dcir-onnx/models/{model}.onnx",
                            "-o", path, "--no-weights"], check=True, capture_output=True)
        text = open(path).read()
    elif spec.startswith("export:"):
        # A torchvision model exported here the way users export
        # (torch.onnx.export's TorchScript exporter), then imported:
        # `export:MODEL:BATCH[:SIZE]`, square images of SIZE (224).
        _, model, batch, *size = spec.split(":")
        size = int(size[0]) if size else 224
        path = os.path.join(scratch, f"{model}_b{batch}.dcir")
        if not os.path.exists(path):
            onnx_path = os.path.join(scratch, f"{model}_b{batch}.onnx")
            torch.onnx.export(torchvision_model(model).eval(), (torch.randn(int(batch), 3, size, size),),
                              onnx_path, dynamo=False, opset_version=17)
            subprocess.run([f"{HERE}/dcir-import", onnx_path, "-o", path, "--no-weights"],
                           check=True, capture_output=True)
        text = open(path).read()
    elif spec == "convblock_b32":
        text = open("ir-examples/convblock_c64_56.dcir").read().replace("[1,64,56,56]", "[32,64,56,56]")
    elif spec == "bert_b32":
        text = bert_layer_text(32)
    else:
        text = open(spec).read()
    if dtype == "f16":
        text = text.replace("f32", "f16")
    out = os.path.join(scratch, f"{abs(hash((spec, dtype)))}.dcir")
    open(out, "w").write(text)
    return out, None


def bert_layer_text(batch):
    """ir-examples/bert_encoder_layer.dcir on `batch` sequences of 128 tokens:
    the projections over all tokens, attention per (sequence, head)."""
    t, b = 128 * batch, batch
    text = open("ir-examples/bert_encoder_layer.dcir").read()
    for old, new in [("@bert_encoder_layer(", f"@bert_encoder_layer_b{b}("),
                     ("f32[128,768]", f"f32[{t},768]"), ("f32[128,3072]", f"f32[{t},3072]"),
                     ("f32[128,12,64]", f"f32[{b},128,12,64]"), ("f32[12,128,64]", f"f32[{b},12,128,64]"),
                     ("f32[12,128,128]", f"f32[{b},12,128,128]"), ("{perm = [1, 0, 2]}", "{perm = [0, 2, 1, 3]}"),
                     ("softmax %scaled {axis = 2}", "softmax %scaled {axis = 3}")]:
        text = text.replace(old, new)
    return text


def dcir_ms(path, graph, tune_cache=None, tune_fusion=False):
    """dcir's median ms on `path` (graph `graph`); tuned first with the cache
    file `tune_cache` when given (a warm cache measures nothing), fused with
    measured times too with `tune_fusion`. Prints the tuning's time."""
    args = [f"{HERE}/dcir-run", path, "--backend", "cuda", "--bench", "100"]
    if graph:
        args += ["--graph", graph]
    if tune_cache:
        args += ["--tune", "--tune-cache", tune_cache] + (["--tune-fusion"] if tune_fusion else [])
    started = time.time()
    run = subprocess.run(args, capture_output=True, text=True)
    if tune_cache:
        lines = [l for l in run.stderr.splitlines()
                 if "with measured times" in l or "candidates measured" in l]
        print(f"tune {os.path.basename(path)}: {time.time() - started:.1f} s in all; "
              + " | ".join(lines), flush=True)
    found = re.search(r"median ([0-9.]+) ms", run.stdout)
    if run.returncode != 0 or not found:
        print(f"dcir failed on {path}: {run.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return float(found.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true", help="also time torch.compile (default, reduce-overhead)")
    ap.add_argument("--only", help="run only these workloads (comma-separated names)")
    ap.add_argument("--batch", type=int, help="run only this batch size")
    ap.add_argument("--dtypes", default="f32,f16", help="the dtypes to run (comma-separated)")
    ap.add_argument("--tune-cache", help="tune dcir's groups first (dcir-run --tune) with this cache file")
    ap.add_argument("--tune-fusion", action="store_true",
                    help="with --tune-cache, also fuse with measured times (dcir-run --tune-fusion)")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="seconds after which torch.compile of further workloads is skipped (0: none)")
    ap.add_argument("--chart", default=os.path.join(os.environ.get("OUT", "/tmp"), "suite.png"))
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "suite.md"))
    args = ap.parse_args()
    try:
        import jax
        jax_version = f"JAX {jax.__version__}"
    except ImportError:
        jax_version = "no JAX"
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.strip()
    date = subprocess.run(["date", "-u", "+%Y-%m-%d"], capture_output=True, text=True).stdout.strip()
    title = (f"{date}, {torch.cuda.get_device_name()}, driver {driver}, torch {torch.__version__}, "
             f"cuDNN {torch.backends.cudnn.version()}, {jax_version}")
    print(f"# {title}", flush=True)
    systems = ["eager"] + (["inductor", "inductor+CG"] if args.compile else []) + ["JAX"]
    header = "| workload | dtype | batch | dcir ms | " + " | ".join(f"{s} ms" for s in systems) + \
             " | best peer ms | dcir vs best |"
    rows = [f"{title}", "", header, "|" + "---|" * (header.count("|") - 1)]
    # SUITE_SCRATCH keeps the imported graphs where the caller can fetch them.
    scratch = os.environ.get("SUITE_SCRATCH") or tempfile.mkdtemp()
    os.makedirs(scratch, exist_ok=True)
    started = time.time()
    # Pass 1: dcir, eager and JAX for every workload; pass 2: torch.compile
    # (both modes), the slow part, in the same order until --deadline, so a
    # short call still gives every dcir figure against the eager peers.
    results = []  # (name, dtype, batch, dcir ms or None, {system: ms})
    jobs = []
    for name, batch, spec, make, shapes in workloads():
        if args.only and name not in args.only.split(","):
            continue
        if args.batch and batch != args.batch:
            continue
        for dtype, tdtype in [("f32", torch.float32), ("f16", torch.float16)]:
            if dtype not in args.dtypes.split(","):
                continue
            dcir = dcir_ms(*dcir_graph(spec, dtype, scratch), args.tune_cache, args.tune_fusion)
            module = make().to(DEV).eval().to(tdtype)
            inputs = [torch.randn(*s, device=DEV, dtype=tdtype) for s in shapes]
            peers = {"eager": timed_ms(lambda: module(*inputs))}
            job = jax_workload(name, batch, dtype)
            if job is not None:
                peers["JAX"] = jax_ms(job)
            results.append((name, dtype, batch, dcir, peers))
            jobs.append((module, inputs))
            print(f"{name} {dtype} b{batch}: dcir {dcir} peers {peers}", flush=True)
            write(args.out, rows, results, systems)
    if args.compile:
        for (name, dtype, batch, dcir, peers), (module, inputs) in zip(results, jobs):
            if args.deadline and time.time() - started > args.deadline:
                print(f"deadline: no torch.compile for {name} {dtype} b{batch}", flush=True)
                continue
            for label, mode in [("inductor", "default"), ("inductor+CG", "reduce-overhead")]:
                torch._dynamo.reset()
                compiled = torch.compile(module, mode=mode)
                peers[label] = timed_ms(lambda: compiled(*inputs))
            print(f"{name} {dtype} b{batch}: peers {peers}", flush=True)
            write(args.out, rows, results, systems)
    for line in write(args.out, rows, results, systems):
        print(line, flush=True)
    speedups = [(f"{n} {d} b{b}", min(p.values()) / t) for n, d, b, t, p in results if t is not None]
    chart(speedups, title, args.chart)


def write(path, head, results, systems):
    """The table so far (head lines, then one row per result) to `path`; returns the rows."""
    rows = []
    for name, dtype, batch, dcir, peers in results:
        best = min(peers.values())
        ratio = "-" if dcir is None else (f"{best / dcir:.2f}x faster" if dcir <= best
                                          else f"{dcir / best:.2f}x slower")
        rows.append(f"| {name} | {dtype} | {batch} | " + ("FAIL" if dcir is None else f"{dcir:.4f}") + " | " +
                    " | ".join(f"{peers[s]:.4f}" if s in peers else "—" for s in systems) +
                    f" | {best:.4f} | {ratio} |")
    open(path, "w").write("\n".join(head + rows) + "\n")
    return rows


def chart(speedups, title, path):
    """A horizontal bar per workload: best peer time / dcir time (log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels, values = [s[0] for s in speedups], [s[1] for s in speedups]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(labels) + 1.5))
    ax.barh(labels, values, color=["tab:green" if v >= 1 else "tab:red" for v in values])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("speedup of dcir over the best peer (best peer time / dcir time)")
    ax.set_title(title, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
