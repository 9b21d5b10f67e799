#!/usr/bin/env python3
"""Export the real models dcir-import is tested on, with the weights left out.

    python3 export_models.py OUTDIR          # resnet50, mobilenet_v2, bert_base
    python3 export_models.py OUTDIR --all    # also densenet121, inception_v3, efficientnet_b0
    python3 export_models.py OUTDIR --batch 32   # the three at batch 32, as <name>_b32.onnx

Needs torch, torchvision, transformers and onnx (the GPU machine has them); no
network: every model is built from its config with random initialization.

Each model is exported with the TorchScript-based exporter (`dynamo=False`,
more predictable than the dynamo exporter) at opset 17, in eval mode, batch 1
(or `--batch N`: the shapes are static, so each batch is its own file).
Then the weights are stripped: every floating-point initializer with more than
one element keeps its name, dims and data type but loses its data (no
raw_data, no typed data fields). Integer initializers (shape arithmetic,
indices) and float scalars (folded literals) keep their values. dcir-import
treats an initializer without data as a parameter and gives it seeded random
values (docs/onnx.md, "Weights"). The stripped files are a few hundred KB.
"""

import os
import sys

import onnx
import torch
from onnx import TensorProto

OPSET = 17
FLOAT_TYPES = {
    TensorProto.FLOAT,
    TensorProto.FLOAT16,
    TensorProto.BFLOAT16,
    TensorProto.DOUBLE,
}


def strip_weights(model: onnx.ModelProto) -> int:
    """Clears the data of float initializers with more than one element; returns how many."""
    stripped = 0
    for init in model.graph.initializer:
        numel = 1
        for d in init.dims:
            numel *= d
        if init.data_type in FLOAT_TYPES and numel > 1:
            init.ClearField("raw_data")
            init.ClearField("float_data")
            init.ClearField("double_data")
            init.ClearField("int32_data")
            init.ClearField("external_data")
            init.ClearField("data_location")
            stripped += 1
    return stripped


def export(name, model, args, input_names, outdir):
    model.eval()
    path = os.path.join(outdir, f"{name}.onnx")
    tmp = path + ".full"
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
    m = onnx.load(tmp)
    n = strip_weights(m)
    m.producer_name = "dcir export_models.py (weights stripped)"
    onnx.save(m, path)
    os.remove(tmp)
    ops = {}
    for node in m.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    print(
        f"{name}: {os.path.getsize(path)} bytes, {len(m.graph.node)} nodes, "
        f"{n} initializers stripped; ops {dict(sorted(ops.items()))}",
        flush=True,
    )


def bert_encoder(batch):
    """BERT-base (12 layers, hidden 768, 12 heads; random weights) without the
    pooler, returning the last hidden state, and a batch of 128 token ids."""
    from transformers import BertConfig, BertModel

    config = BertConfig()
    config.attn_implementation = "eager"
    try:
        config._attn_implementation = "eager"
    except Exception:
        pass

    class BertEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(config, add_pooling_layer=False)

        def forward(self, input_ids):
            return self.bert(input_ids=input_ids, return_dict=False)[0]

    ids = torch.randint(0, config.vocab_size, (batch, 128), dtype=torch.int64)
    return BertEncoder(), ids


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    outdir = sys.argv[1]
    everything = "--all" in sys.argv[2:]
    batch = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 1
    suffix = "" if batch == 1 else f"_b{batch}"
    os.makedirs(outdir, exist_ok=True)
    torch.manual_seed(0)

    import torchvision

    image = torch.randn(batch, 3, 224, 224)
    export(
        "resnet50" + suffix, torchvision.models.resnet50(weights=None), (image,), ["input"], outdir
    )
    export(
        "mobilenet_v2" + suffix,
        torchvision.models.mobilenet_v2(weights=None),
        (image,),
        ["input"],
        outdir,
    )

    model, ids = bert_encoder(batch)
    export("bert_base" + suffix, model, (ids,), ["input_ids"], outdir)

    if everything and batch == 1:
        export(
            "densenet121", torchvision.models.densenet121(weights=None), (image,), ["input"], outdir
        )
        export(
            "inception_v3",
            torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False),
            (torch.randn(1, 3, 299, 299),),
            ["input"],
            outdir,
        )
        export(
            "efficientnet_b0",
            torchvision.models.efficientnet_b0(weights=None),
            (image,),
            ["input"],
            outdir,
        )


if __name__ == "__main__":
    main()
