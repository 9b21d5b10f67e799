#!/usr/bin/env python3
"""PyTorch eager (and with --compile, torch.compile reduce-overhead) on the
zoo models at batch 1, f32 (TF32 off) and f16: one line per model and dtype,
`name dtype eager_ms compile_ms`, medians of CUDA-event timed runs after
warm-up. Random weights, as dcir-run's. Run by `run.sh zoo-peers`.

    python3 zoo_peers.py [--compile] [--only a,b] [--deadline S]
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "dcir-onnx", "scripts"))


def median_ms(fn, reps=20, warm=5):
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--compile", action="store_true")
    p.add_argument("--only", default="")
    p.add_argument("--deadline", type=float, default=0)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from export_zoo import build
    import torchvision

    names = sorted(torchvision.models.list_models(module=torchvision.models)) + ["bert_base"]
    if args.only:
        names = args.only.split(",")
    start = time.time()
    for name in names:
        for dtype in (torch.float32, torch.float16):
            try:
                torch.manual_seed(0)
                model, inputs, _ = build(name)
                model = model.eval().cuda().to(dtype)
                inputs = [x.cuda().to(dtype) if x.is_floating_point() else x.cuda() for x in inputs]
                with torch.no_grad():
                    eager = median_ms(lambda: model(*inputs))
                    compiled = float("nan")
                    if args.compile and (not args.deadline or time.time() - start < args.deadline):
                        c = torch.compile(model, mode="reduce-overhead")
                        compiled = median_ms(lambda: c(*inputs))
                line = f"{name} {'f32' if dtype == torch.float32 else 'f16'} {eager:.4f} {compiled:.4f}"
            except Exception as e:  # one model's failure is one line
                line = f"{name} {dtype} ERROR {type(e).__name__}: {str(e)[:120]}"
            print(line, flush=True)
            del model
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
