#!/usr/bin/env python3
"""Export the model zoo: every torchvision classification model, plus BERT-base,
as graph-only ONNX files (weights stripped) at batch 1 (or --batch N).

    python3 export_zoo.py OUTDIR [--jobs N] [--only NAME,NAME...] [--batch N]

`cargo xtask export-zoo` runs this into crates/dcir-onnx/zoo/. Needs torch,
torchvision, transformers and onnx; no network: every model is built with
`weights=None` (random initialization), so nothing is downloaded.

The models are `torchvision.models.list_models(module=torchvision.models)`
(the classification models; detection, segmentation, video and optical-flow
models live in submodules and are not listed there). Each is exported as
`export_models.py` exports its three (TorchScript exporter, opset 17, eval
mode, constant folding) with a 224x224 image (299x299 for Inception-v3),
then every float initializer of more than one element loses its data. A
model whose weights exceed protobuf's 2 GB is exported with external data,
which is dropped with the rest. The files are a few hundred KB each;
`dcir-import` gives stripped parameters seeded random values.

Models are exported in parallel, each in a process of its own (`--jobs`,
default the number of CPUs / 2; two torch threads each), so a process that
dies (out of memory on the largest models) fails only its model. One line
per model is printed (`name: bytes, nodes, ops`), or `name: FAILED ...`;
the exit code is 1 when any failed.
"""

import argparse
import os
import shutil
import sys
import tempfile
import subprocess
from concurrent.futures import ThreadPoolExecutor, as_completed

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

OPSET = 17


def build(name, batch=1):
    """The model `name` in eval mode and its example inputs (of `batch`
    entries) and input names."""
    import torch

    if name == "bert_base":
        from export_models import bert_encoder

        model, ids = bert_encoder(batch)
        return model, (ids,), ["input_ids"]
    import torchvision

    kwargs = {"weights": None}
    size = 224
    if name == "inception_v3":
        kwargs.update(aux_logits=False, init_weights=False)
        size = 299
    elif name == "googlenet":
        kwargs.update(aux_logits=False, init_weights=False)
    model = torchvision.models.get_model(name, **kwargs)
    return model, (torch.randn(batch, 3, size, size),), ["input"]


def export_one(name, outdir, batch):
    import onnx
    import torch

    from export_models import strip_weights

    torch.set_num_threads(2)
    # nn.MultiheadAttention's inference fast path is one fused aten op
    # (`_native_multi_head_attention`, ViT) the exporter cannot write.
    torch.backends.mha.set_fastpath_enabled(False)
    torch.manual_seed(0)
    model, args, input_names = build(name, batch)
    model.eval()
    # Tracing runs the model once: on the GPU where there is one (a batch-32
    # ViT-H forward takes minutes on two CPU threads); the graph is the same.
    if torch.cuda.is_available():
        model = model.cuda()
        args = tuple(a.cuda() for a in args)
    tmpdir = tempfile.mkdtemp(prefix=f"zoo_{name}_")
    try:
        tmp = os.path.join(tmpdir, f"{name}.onnx")
        with torch.no_grad():
            torch.onnx.export(
                model,
                args,
                tmp,
                opset_version=OPSET,
                input_names=input_names,
                output_names=["output"],
                do_constant_folding=True,
                dynamo=False,
            )
        m = onnx.load(tmp, load_external_data=False)
        strip_weights(m)
        m.producer_name = "dcir export_zoo.py (weights stripped)"
        path = os.path.join(outdir, f"{name}.onnx")
        onnx.save(m, path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    ops = {}
    for node in m.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return f"{name}: {os.path.getsize(path)} bytes, {len(m.graph.node)} nodes; ops {dict(sorted(ops.items()))}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--batch", type=int, default=1, help="the input's batch (1)")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)

    import torchvision

    names = sorted(torchvision.models.list_models(module=torchvision.models)) + ["bert_base"]
    if args.only:
        wanted = args.only.split(",")
        unknown = [n for n in wanted if n not in names]
        if unknown:
            sys.exit(f"unknown model(s): {', '.join(unknown)}")
        names = wanted
    if args.in_process:
        print(export_one(names[0], args.outdir, args.batch), flush=True)
        return
    failed = 0

    def run(name):
        cmd = [sys.executable, os.path.abspath(__file__), args.outdir, "--only", name, "--batch", str(args.batch)]
        done = subprocess.run(cmd + ["--in-process"], capture_output=True, text=True)
        if done.returncode == 0:
            return True, done.stdout.strip()
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return False, f"{name}: FAILED {last}"

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in as_completed([pool.submit(run, n) for n in names]):
            ok, line = future.result()
            failed += not ok
            print(line, flush=True)
    print(f"{len(names) - failed} of {len(names)} exported to {args.outdir}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
