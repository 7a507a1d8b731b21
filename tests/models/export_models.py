#!/usr/bin/env python3
"""Exports the whole-model test models to ONNX with PyTorch, with a seeded input and PyTorch's
output, so that sparsecol_model_tests can compare the engine against PyTorch.

    /usr/bin/python3 tests/models/export_models.py --out DIR [--models small_cnn,resnet50] [--batch 2]

For each model NAME it writes DIR/NAME.onnx (opset 13, input "input" and output "output" with a
dynamic batch axis), DIR/NAME.input.npy, DIR/NAME.output.npy and DIR/NAME.activations.npz (a few
intermediate activations keyed by PyTorch module name, for debugging a mismatch).

Weights are random (no downloads) and seeded, so every run writes the same files. A model whose
files exist, are newer than this script and have the requested batch is skipped: ctest runs the
script before every model test run, and exporting BERT-base takes a while.

Why the BatchNorm statistics are set the way they are: with torchvision's default statistics
(mean 0, var 1) BatchNorm is an identity and folding it proves nothing; with statistics drawn
independently of the activations (say mean ~ N(0, 0.1), var ~ U(0.5, 2)) a deep random network
washes the signal out (measured here: MobileNetV2's output then differs by ~5e-8 between two
inputs while its magnitude is 0.2, so any engine output "matches"). So each BatchNorm gets the
statistics of the activations it actually sees in eval mode (computed in forward order, so each
layer sees its perturbed predecessors), perturbed per channel (mean + N(0, 0.1) * std, var *
U(0.5, 2)), and random affine parameters: folding matters and the output still depends on the
input. The tests check that dependence too.
"""

import argparse
import collections
import os
import sys
import tempfile
import time
import zlib

import numpy as np
import onnx
import torch
import torchvision
from torch import nn

OPSET = 13
SEED = 1234


# ---- models ----


class SmallCnn(nn.Module):
    """conv-bn-relu x2 + residual add + global pool + linear: the fast default model. Exported
    with its BatchNormalization nodes kept, so that the engine's own BN folding is exercised."""

    def __init__(self, channels=16, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(channels)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(x)))
        y = y + x
        return self.fc(torch.flatten(self.pool(y), 1))


class BertLayer(nn.Module):
    """One post-LN transformer encoder layer, written out like BERT's."""

    def __init__(self, hidden, heads, ffn, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_dropout = nn.Dropout(dropout)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.ffn_in = nn.Linear(hidden, ffn)
        self.gelu = nn.GELU()  # the erf form, as in BERT
        self.ffn_out = nn.Linear(ffn, hidden)
        self.ffn_dropout = nn.Dropout(dropout)
        self.ffn_norm = nn.LayerNorm(hidden, eps=1e-12)

    def split_heads(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        b, s, hidden = x.shape
        q = self.split_heads(self.query(x))
        k = self.split_heads(self.key(x))
        v = self.split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / (self.head_dim**0.5)
        probs = self.attn_dropout(torch.softmax(scores, dim=-1))
        context = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, hidden)
        x = self.attn_norm(x + self.attn_dropout(self.attn_out(context)))
        h = self.ffn_out(self.gelu(self.ffn_in(x)))
        return self.ffn_norm(x + self.ffn_dropout(h))


class BertEncoder(nn.Module):
    """BERT-base's encoder stack (no embeddings): N x seq x hidden floats in and out."""

    def __init__(self, layers=12, hidden=768, heads=12, ffn=3072):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


# ---- random parameters that keep the signal alive ----


def randomize_batchnorm(model, calibration_input, gen):
    """Gives every BatchNorm2d perturbed statistics of its real eval-mode input (see the module
    docstring for why) and random affine parameters."""

    def set_stats(bn, inputs):
        act = inputs[0].detach()
        mean = act.mean(dim=(0, 2, 3))
        var = act.var(dim=(0, 2, 3), unbiased=False)
        c = bn.num_features
        with torch.no_grad():
            bn.running_mean.copy_(mean + 0.1 * torch.randn(c, generator=gen) * var.sqrt())
            bn.running_var.copy_(var * (0.5 + 1.5 * torch.rand(c, generator=gen)))
            bn.weight.copy_(0.75 + 0.5 * torch.rand(c, generator=gen))
            bn.bias.copy_(0.1 * torch.randn(c, generator=gen))

    # Pre-hooks fire in execution order during one eval pass, so each BatchNorm sees the
    # activations its already-randomized predecessors produce.
    hooks = [m.register_forward_pre_hook(set_stats) for m in model.modules()
             if isinstance(m, nn.BatchNorm2d)]
    model.eval()
    with torch.no_grad():
        model(calibration_input)
    for hook in hooks:
        hook.remove()


def randomize_bert(model, gen):
    """BERT's initialization (weights ~ N(0, 0.02)) so that the output is not saturated, with
    small random biases and LayerNorm affine parameters so that they matter."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(0.02 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.02 * torch.randn(m.bias.shape, generator=gen))
            elif isinstance(m, nn.LayerNorm):
                m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
    model.eval()


def build_cnn(factory, input_shape):
    def build(gen):
        model = factory()
        randomize_batchnorm(model, make_input(4, input_shape, gen), gen)
        return model

    return build


def make_input(batch, sample_shape, gen):
    """N(0, 1) noise, plus for images a random offset per sample and channel: global pooling
    averages i.i.d. noise away, and without a component that survives it the outputs of two
    samples barely differ (small_cnn: 2% of their magnitude)."""
    x = torch.randn((batch, *sample_shape), generator=gen)
    if len(sample_shape) == 3:
        x += torch.randn((batch, sample_shape[0], 1, 1), generator=gen)
    return x


def build_bert(gen):
    model = BertEncoder()
    randomize_bert(model, gen)
    return model


# name -> (builder, per-sample input shape, keep BatchNormalization nodes, modules to record)
MODELS = {
    "small_cnn": (build_cnn(SmallCnn, (3, 32, 32)), (3, 32, 32), True,
                  ["bn1", "bn2", "pool"]),
    "resnet50": (build_cnn(lambda: torchvision.models.resnet50(weights=None), (3, 224, 224)),
                 (3, 224, 224), False, ["layer1", "layer2", "layer3", "layer4", "avgpool"]),
    "mobilenet_v2": (build_cnn(lambda: torchvision.models.mobilenet_v2(weights=None),
                               (3, 224, 224)),
                     (3, 224, 224), False,
                     ["features.3", "features.7", "features.14", "features.18"]),
    "bert": (build_bert, (128, 768), False, ["layers.0", "layers.5", "layers.11"]),
}


# ---- files ----


def paths(out, name):
    return {
        "onnx": os.path.join(out, f"{name}.onnx"),
        "input": os.path.join(out, f"{name}.input.npy"),
        "output": os.path.join(out, f"{name}.output.npy"),
        "activations": os.path.join(out, f"{name}.activations.npz"),
    }


def up_to_date(files, batch):
    script_time = os.path.getmtime(__file__)
    for path in files.values():
        if not os.path.exists(path) or os.path.getmtime(path) < script_time:
            return False
    return np.load(files["input"], mmap_mode="r").shape[0] == batch


def write_atomically(path, write):
    """Writes through a temporary file in the same folder, so that an interrupted export never
    leaves a truncated file that looks up to date."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-",
                               suffix=os.path.splitext(path)[1])
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def op_histogram(onnx_path):
    model = onnx.load(onnx_path)
    counts = collections.Counter(node.op_type for node in model.graph.node)
    return counts, sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


# ---- export ----


def export(name, files, batch):
    builder, sample_shape, keep_bn, recorded = MODELS[name]
    # One seed per model, derived from its name, so that adding a model changes no other. The
    # global seed covers the modules' default initialization; `gen` covers everything else.
    seed = SEED + zlib.crc32(name.encode())
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = builder(gen)
    model.eval()
    x = make_input(batch, sample_shape, gen)

    activations = {}
    modules = dict(model.named_modules())
    hooks = [modules[m].register_forward_hook(
        lambda _mod, _inp, out, key=m: activations.__setitem__(key, out.detach().numpy()))
        for m in recorded]
    with torch.no_grad():
        y = model(x)
    for hook in hooks:
        hook.remove()

    # In EVAL mode torch's exporter folds BatchNorm into the preceding Conv; PRESERVE (with the
    # model in eval mode) skips that peephole and keeps inference-mode BatchNormalization nodes.
    training = torch.onnx.TrainingMode.PRESERVE if keep_bn else torch.onnx.TrainingMode.EVAL
    write_atomically(files["onnx"], lambda path: torch.onnx.export(
        model, x, path, opset_version=OPSET, input_names=["input"], output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        training=training, do_constant_folding=not keep_bn))
    onnx.checker.check_model(files["onnx"])

    write_atomically(files["activations"], lambda path: np.savez(path, **activations))
    write_atomically(files["input"], lambda path: np.save(path, x.numpy()))
    write_atomically(files["output"], lambda path: np.save(path, y.numpy()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the models and their data")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated subset of {', '.join(MODELS)}")
    parser.add_argument("--batch", type=int, default=2, help="batch of the saved input")
    args = parser.parse_args()

    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    torch.set_grad_enabled(False)

    failed = False
    for name in names:
        files = paths(args.out, name)
        start = time.monotonic()
        if up_to_date(files, args.batch):
            status = "up to date"
        else:
            export(name, files, args.batch)
            status = f"exported in {time.monotonic() - start:.1f} s"
        counts, histogram = op_histogram(files["onnx"])
        x = np.load(files["input"], mmap_mode="r")
        y = np.load(files["output"])
        print(f"{name}: {status}; input {list(x.shape)} -> output {list(y.shape)}, "
              f"max |output| {np.abs(y).max():.3g}; {sum(counts.values())} nodes: "
              + ", ".join(f"{op} {n}" for op, n in histogram), flush=True)
        if MODELS[name][2] and counts["BatchNormalization"] == 0:
            print(f"{name}: error: the export folded BatchNormalization away, but this model "
                  "exists to test the engine's own folding", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
