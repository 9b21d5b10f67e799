#!/usr/bin/env python3
"""PyTorch eager, or with --compile torch.compile (mode reduce-overhead), on
the zoo models at batch 1 (or --batch N), f32 (TF32 off) and f16: one line per model and
dtype, `name dtype eager_ms compile_ms` (nan for the one not measured),
medians of CUDA-event timed runs after warm-up. Random weights, as
dcir-run's. Run by `run.sh zoo-peers`.

    python3 zoo_peers.py [--compile] [--jobs N] [--only a,b] [--dtypes f32,f16] [--deadline S] [--batch N]

Eager runs one model at a time (eager at batch 1 is bound by the CPU's
launches, so nothing else may run beside it). torch.compile spends its time
compiling on the CPU: --jobs worker processes compile side by side and take
one lock around the warm-up and the timing, so no two models time at once;
the replay of a CUDA graph does not depend on the CPU. Past --deadline
seconds no new model starts.
"""

import argparse
import fcntl
import multiprocessing
import os
import sys
import time

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "dcir-onnx", "scripts")
LOCK = "/tmp/zoo_peers.lock"


def median_ms(torch, fn, reps=20, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def measure(task):
    """One model in one dtype: its line."""
    name, dtype_name, compile_, start, deadline, batch = task
    if deadline and time.time() - start > deadline:
        return f"{name} {dtype_name} SKIP past the deadline"
    import torch

    sys.path.insert(0, SCRIPTS)
    from export_zoo import build

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = {"f32": torch.float32, "f16": torch.float16}[dtype_name]
    c = None
    try:
        torch.manual_seed(0)
        model, inputs, _ = build(name, batch)
        model = model.eval().cuda().to(dtype)
        inputs = [x.cuda().to(dtype) if x.is_floating_point() else x.cuda() for x in inputs]
        eager = compiled = float("nan")
        with torch.no_grad():
            if compile_:
                c = torch.compile(model, mode="reduce-overhead")
                for _ in range(3):  # compile and record the CUDA graph outside the lock
                    c(*inputs)
                torch.cuda.synchronize()
                with open(LOCK, "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    compiled = median_ms(torch, lambda: c(*inputs))
            else:
                eager = median_ms(torch, lambda: model(*inputs))
        line = f"{name} {dtype_name} {eager:.4f} {compiled:.4f}"
    except Exception as e:  # one model's failure is one line
        line = f"{name} {dtype_name} ERROR {type(e).__name__}: {str(e)[:120]}"
    # A worker measures many models: free this one's compiled code and graphs.
    model = c = None
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return line


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--compile", action="store_true")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--only", default="")
    p.add_argument("--dtypes", default="f32,f16")
    p.add_argument("--deadline", type=float, default=0)
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args()
    if args.only:
        names = args.only.split(",")
    else:
        import torchvision

        names = sorted(torchvision.models.list_models(module=torchvision.models)) + ["bert_base"]
    start = time.time()
    tasks = [(n, d, args.compile, start, args.deadline, args.batch) for n in names for d in args.dtypes.split(",")]
    if not args.compile:
        for task in tasks:  # one at a time, in this process
            print(measure(task), flush=True)
        return
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for line in pool.imap_unordered(measure, tasks):
            print(line, flush=True)


if __name__ == "__main__":
    main()
