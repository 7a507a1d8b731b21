#!/usr/bin/env python3
"""Exports the whole-model test models to ONNX with PyTorch, with a seeded input and PyTorch's
output, so that sparsecol_model_tests can compare the engine against PyTorch.

    /usr/bin/python3 tests/models/export_models.py --out DIR [--models small_cnn,resnet50] [--batch 2]

For each model NAME it writes DIR/NAME.onnx (opset 13, input "input" and output "output" with a
dynamic batch axis), DIR/NAME.input.npy, DIR/NAME.output.npy and DIR/NAME.activations.npz (a few
intermediate activations keyed by ONNX value name, see below).

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

Pruned models (NAME_sSS: SS% of the weights of every Conv2d and Linear exactly zero, by
magnitude, per layer; the first convolution and depthwise convolutions left dense, as
`sparsecol prune` does by default) start from the dense model of the same seed. Pruning shrinks
each layer's output, so BatchNorm statistics measured before pruning no longer normalize it and
the network washes the signal out again (DESIGN.md, "How we know it is right"); so after pruning
every BatchNorm's statistics are measured again the same way, with the same perturbation.
BERT has no BatchNorm to re-calibrate: its pruned twin is made by the C++ pruner in the model
tests (tests/models/model_test.cc), which use the reference executor as its oracle.

Activations are keyed by the ONNX value that holds the recorded module's output (the output of
the last node in the module's scope, as torch.onnx names nodes "/layer1/layer1.2/relu/Relu"), so
that the tests can ask the engine for the same value and compare intermediate results, not only
the final output.
"""

import argparse
import collections
import inspect
import os
import sys
import tempfile
import time
import zlib

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.shape_inference
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


class SmallSegmenter(nn.Module):
    """A segmentation net in miniature: a stride-4 conv encoder, a 1x1 classifier upsampled to
    stride 2 by a transposed convolution (ConvTranspose) and added to a skip from there, then
    bilinear upsampling to the input's size (ONNX Resize, its sizes computed from the input's
    shape as torch exports F.interpolate(size=...))."""

    def __init__(self, classes=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Conv2d(32, classes, 1)
        self.skip = nn.Conv2d(16, classes, 1)
        self.up = nn.ConvTranspose2d(classes, classes, 4, stride=2, padding=1)

    def forward(self, x):
        a = torch.relu(self.bn1(self.conv1(x)))
        b = torch.relu(self.bn2(self.conv2(a)))
        y = self.up(self.head(b)) + self.skip(a)
        return nn.functional.interpolate(y, size=x.shape[-2:], mode="bilinear",
                                         align_corners=False)


class SmallSeq(nn.Module):
    """A sequence classifier: two bidirectional LSTM layers, a GRU, attention pooling over the
    steps written with torch.einsum, a linear head (ONNX LSTM, GRU and Einsum nodes; batch first,
    which torch exports as layout 0 between Transposes)."""

    def __init__(self, features=32, hidden=48, classes=10):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.query = nn.Parameter(torch.randn(hidden))
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x):
        y, _ = self.lstm(x)
        y, _ = self.gru(y)
        weights = torch.einsum("bth,h->bt", y, self.query).softmax(-1)
        return self.fc(torch.einsum("bt,bth->bh", weights, y))


class VitTiny(nn.Module):
    """torchvision's VisionTransformer in miniature (96x96 images, 8x8 patches: 145 tokens, enough
    for the depth-wise plan's token columns; 2 layers): its class token is expanded to the batch
    (Expand to a shape computed from Shape(x))."""

    def __init__(self):
        super().__init__()
        self.vit = torchvision.models.vision_transformer.VisionTransformer(
            image_size=96, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128,
            num_classes=10)

    def forward(self, x):
        # With autograd off (as main() sets it) nn.MultiheadAttention takes its fused fast path,
        # which PyTorch 1.13 cannot export; with it on, the exportable one.
        with torch.enable_grad():
            return self.vit(x)


def build_vit(gen):
    """VitTiny, its head random: torchvision zero-initializes it, so every output would be 0."""
    model = VitTiny()
    with torch.no_grad():
        head = model.vit.heads.head.weight
        head.copy_(0.1 * torch.randn(head.shape, generator=gen))
        model.vit.class_token.copy_(torch.randn(model.vit.class_token.shape, generator=gen))
    model.eval()
    return model


def randomize_batchnorm(model, calibration_input, gen):
    """Gives every BatchNorm2d perturbed statistics of its real eval-mode input (see the module
    docstring for why) and random affine parameters."""
    calibrate_batchnorm(model, calibration_input, gen, randomize_affine=True)


def calibrate_batchnorm(model, calibration_input, gen, randomize_affine=False):
    """Sets every BatchNorm2d's running statistics to those of the input it sees in eval mode,
    perturbed per channel (mean + N(0, 0.1) * std, var * U(0.5, 2)).

    Pre-hooks fire in execution order during one eval pass, so each BatchNorm sees the
    activations its already-calibrated predecessors produce: exactly what it sees at inference.
    (A train-mode pass would estimate each layer's statistics on inputs normalized by its
    predecessors' batch statistics instead, and momentum would mix in the old ones.)"""

    def set_stats(bn, inputs):
        act = inputs[0].detach()
        mean = act.mean(dim=(0, 2, 3))
        var = act.var(dim=(0, 2, 3), unbiased=False)
        c = bn.num_features
        with torch.no_grad():
            bn.running_mean.copy_(mean + 0.1 * torch.randn(c, generator=gen) * var.sqrt())
            bn.running_var.copy_(var * (0.5 + 1.5 * torch.rand(c, generator=gen)))
            if randomize_affine:
                bn.weight.copy_(0.75 + 0.5 * torch.rand(c, generator=gen))
                bn.bias.copy_(0.1 * torch.randn(c, generator=gen))

    hooks = [m.register_forward_pre_hook(set_stats) for m in model.modules()
             if isinstance(m, nn.BatchNorm2d)]
    model.eval()
    with torch.no_grad():
        model(calibration_input)
    for hook in hooks:
        hook.remove()


def prune_weights(model, sparsity):
    """Sets exactly round(sparsity * n) of the n weights of every Conv2d and Linear to zero,
    smallest magnitudes first, except the first convolution (it sees the raw image) and
    depthwise convolutions (9 weights per channel, run dense by the engine): what `sparsecol
    prune --sparsity S` does by default."""
    first_conv = True
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                is_first, first_conv = first_conv, False
                if is_first or (m.groups > 1 and m.groups == m.in_channels):
                    continue
            elif not isinstance(m, nn.Linear):
                continue
            w = m.weight.view(-1)
            k = round(sparsity * w.numel())
            w[torch.topk(w.abs(), k, largest=False).indices] = 0


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


def build_cnn(factory, input_shape, sparsity=0.0):
    def build(gen):
        model = factory()
        randomize_batchnorm(model, make_input(4, input_shape, gen), gen)
        if sparsity > 0:
            prune_weights(model, sparsity)
            calibrate_batchnorm(model, make_input(4, input_shape, gen), gen)
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


class Spec(collections.namedtuple(
        "Spec", "builder sample_shape keep_bn recorded seed_name", defaults=[None])):
    """builder(gen) -> model; per-sample input shape; keep BatchNormalization nodes in the
    export; modules whose outputs are recorded; the name the seed derives from (a pruned model
    shares its dense original's, so that it is that model pruned)."""


RESNET50 = lambda: torchvision.models.resnet50(weights=None)  # noqa: E731
MOBILENET_V2 = lambda: torchvision.models.mobilenet_v2(weights=None)  # noqa: E731
IMAGE = (3, 224, 224)
RESNET_RECORDED = ["layer1", "layer2", "layer3", "layer4", "avgpool"]
MOBILENET_RECORDED = ["features.3", "features.7", "features.14", "features.18"]

MODELS = {
    "small_cnn": Spec(build_cnn(SmallCnn, (3, 32, 32)), (3, 32, 32), True,
                      ["bn1", "bn2", "pool"]),
    "resnet50": Spec(build_cnn(RESNET50, IMAGE), IMAGE, False, RESNET_RECORDED),
    "mobilenet_v2": Spec(build_cnn(MOBILENET_V2, IMAGE), IMAGE, False, MOBILENET_RECORDED),
    "bert": Spec(build_bert, (128, 768), False, ["layers.0", "layers.5", "layers.11"]),
    "resnet50_s90": Spec(build_cnn(RESNET50, IMAGE, 0.90), IMAGE, False, RESNET_RECORDED,
                         "resnet50"),
    "resnet50_s95": Spec(build_cnn(RESNET50, IMAGE, 0.95), IMAGE, False, RESNET_RECORDED,
                         "resnet50"),
    "mobilenet_v2_s80": Spec(build_cnn(MOBILENET_V2, IMAGE, 0.80), IMAGE, False,
                             MOBILENET_RECORDED, "mobilenet_v2"),
    "vit_tiny": Spec(build_vit, (3, 96, 96), False,
                     ["vit.conv_proj", "vit.encoder.layers.encoder_layer_0"]),
    "small_segmenter": Spec(build_cnn(SmallSegmenter, (3, 64, 64)), (3, 64, 64), False,
                            ["head", "up"]),
    "small_seq": Spec(lambda gen: SmallSeq(), (20, 32), False, ["fc"]),
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


def summarize(onnx_path):
    """(op -> node count, sorted histogram, fraction of exact zeros over the Conv/Gemm/MatMul
    weight initializers), from one load of the model."""
    model = onnx.load(onnx_path)
    counts = collections.Counter(node.op_type for node in model.graph.node)
    weights = {i.name: i for i in model.graph.initializer}
    zeros = total = 0
    for node in model.graph.node:
        if node.op_type in ("Conv", "Gemm", "MatMul") and node.input[1] in weights:
            w = onnx.numpy_helper.to_array(weights[node.input[1]])
            zeros += int((w == 0).sum())
            total += w.size
    return counts, sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])), zeros / max(total, 1)


# ---- export ----


def onnx_scope(module_path, called):
    """The node-name prefix torch.onnx gives a module's nodes: one component per enclosing module
    that was called (a ModuleList is not), each its qualified name from the last non-numeric atom
    on ("layer1.0.conv1" -> "/layer1/layer1.0/conv1/"; torch/onnx/utils.py,
    _unqualified_variable_name)."""
    atoms = module_path.split(".")
    scope = ""
    for end in range(1, len(atoms) + 1):
        if ".".join(atoms[:end]) not in called:
            continue
        start = end - 1
        while start > 0 and atoms[start].isdigit():
            start -= 1
        scope += "/" + ".".join(atoms[start:end])
    return scope + "/"


def module_output_values(onnx_path, activations, called):
    """Maps each recorded module to the ONNX value holding its output: that of the last node in
    its scope (nodes are in topological order). Checked against the recorded shape, with ONNX
    shape inference, so that a change in torch's naming fails here rather than in the tests."""
    # Data propagation follows the Shape -> Gather -> Reshape chains of BERT's attention; a value
    # whose shape inference still leaves unknown is only checked to exist.
    model = onnx.shape_inference.infer_shapes(onnx.load(onnx_path), data_prop=True)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None
                       for d in v.type.tensor_type.shape.dim]
              for v in list(model.graph.value_info) + list(model.graph.output)
              if v.type.tensor_type.HasField("shape")}
    values = {}
    for module, activation in activations.items():
        scope = onnx_scope(module, called)
        nodes = [n for n in model.graph.node if n.name.startswith(scope)]
        if not nodes:
            raise RuntimeError(f"{onnx_path}: no node in the scope {scope} of module '{module}'")
        value = nodes[-1].output[0]
        shape = shapes.get(value)
        if shape is not None and shape[1:] != list(activation.shape[1:]):
            raise RuntimeError(f"{onnx_path}: value '{value}' (shape {shape}) is not the output "
                               f"of module '{module}' (shape {list(activation.shape)})")
        values[module] = value
    return values


def export(name, files, batch):
    spec = MODELS[name]
    # One seed per model, derived from its name, so that adding a model changes no other. The
    # global seed covers the modules' default initialization; `gen` covers everything else.
    seed = SEED + zlib.crc32((spec.seed_name or name).encode())
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = spec.builder(gen)
    model.eval()
    x = make_input(batch, spec.sample_shape, gen)

    activations = {}
    called = set()
    modules = dict(model.named_modules())
    hooks = [modules[m].register_forward_hook(
        lambda _mod, _inp, out, key=m: activations.__setitem__(key, out.detach().numpy()))
        for m in spec.recorded]
    hooks += [module.register_forward_pre_hook(lambda _mod, _inp, key=name: called.add(key))
              for name, module in modules.items() if name]
    with torch.no_grad():
        y = model(x)
    for hook in hooks:
        hook.remove()

    # In EVAL mode torch's exporter folds BatchNorm into the preceding Conv; PRESERVE (with the
    # model in eval mode) skips that peephole and keeps inference-mode BatchNormalization nodes.
    training = torch.onnx.TrainingMode.PRESERVE if spec.keep_bn else torch.onnx.TrainingMode.EVAL
    # PyTorch 2.9 and later export through torch.export unless told otherwise (dynamo=False); these
    # models come from the TorchScript exporter, Debian's PyTorch 1.13's only one (a GPU machine's
    # PyTorch 2.11 exported them so for docs/GPU.md).
    legacy = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    write_atomically(files["onnx"], lambda path: torch.onnx.export(
        model, x, path, opset_version=OPSET, input_names=["input"], output_names=["output"],
        dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        training=training, do_constant_folding=not spec.keep_bn, **legacy))
    onnx.checker.check_model(files["onnx"])

    values = module_output_values(files["onnx"], activations, called)
    write_atomically(files["activations"], lambda path: np.savez(
        path, **{values[m]: a for m, a in activations.items()}))
    write_atomically(files["input"], lambda path: np.save(path, x.numpy()))
    write_atomically(files["output"], lambda path: np.save(path, y.numpy()))


def output_spread(y):
    """How much the output depends on the input: max |y[0] - y[1]| / max |y|."""
    return float(np.abs(y[0] - y[1]).max() / max(np.abs(y).max(), 1e-30)) if len(y) > 1 else 0.0


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
        counts, histogram, sparsity = summarize(files["onnx"])
        x = np.load(files["input"], mmap_mode="r")
        y = np.load(files["output"])
        print(f"{name}: {status}; input {list(x.shape)} -> output {list(y.shape)}, "
              f"max |output| {np.abs(y).max():.3g}, samples differ by {output_spread(y):.3g} of "
              f"it; weight sparsity {sparsity:.3f}; "
              f"{sum(counts.values())} nodes: "
              + ", ".join(f"{op} {n}" for op, n in histogram), flush=True)
        if MODELS[name].keep_bn and counts["BatchNormalization"] == 0:
            print(f"{name}: error: the export folded BatchNormalization away, but this model "
                  "exists to test the engine's own folding", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
