#!/usr/bin/env python3
"""Checks architectures beyond the test models against PyTorch: exports each (random weights,
seeded, BatchNorm statistics calibrated as export_models.py does), writes PyTorch's output as
ONNX test data, and runs `sparsecol check` on every CPU schedule; then prunes the model to 90%
(`sparsecol prune`) and compares the schedules with each other on it (`sparsecol bench
--strict`, the reference schedule the baseline). Not part of ctest: exporting and checking all of
them takes ~10 minutes on 2 cores. docs/RELIABILITY.md ("Models beyond the test set") has the
last results.

    /usr/bin/python3 tests/models/check_architectures.py --sparsecol build/sparsecol --out DIR \\
        [--models resnet18,swin_t]

A check passes when every output element is within --atol + --rtol * |expected| (sparsecol
check's rule), or, for outputs that reach large magnitudes, within 1e-4 of the largest |expected|
(reported as "pass (to max)"): float32 rounding through a deep random network grows with the
activations, and EfficientNet's or Inception's random logits reach 400-1000.
"""

import argparse
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torchvision
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models  # noqa: E402  (the BatchNorm calibration and input recipe)

tv = torchvision.models


class Segmentation(nn.Module):
    """LRASPP returns a dict; ONNX wants a tensor."""

    def __init__(self):
        super().__init__()
        self.m = tv.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None)

    def forward(self, x):
        return self.m(x)["out"]


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(256, 4, 512, batch_first=True, activation="gelu")
        self.m = nn.TransformerEncoder(layer, 2)

    def forward(self, x):
        return self.m(x)


def dcgan_generator():
    """DCGAN's generator (Radford et al. 2016): a 100-value code to a 64x64 image through
    transposed convolutions."""
    layers = []
    channels = [100, 512, 256, 128, 64]
    for i in range(4):
        layers += [nn.ConvTranspose2d(channels[i], channels[i + 1], 4, 1 if i == 0 else 2,
                                      0 if i == 0 else 1, bias=False),
                   nn.BatchNorm2d(channels[i + 1]), nn.ReLU()]
    layers += [nn.ConvTranspose2d(64, 3, 4, 2, 1, bias=False), nn.Tanh()]
    return nn.Sequential(*layers)


def vit_b_16():
    m = tv.vit_b_16()
    # torchvision zero-initializes the head: every output would be 0 and any engine would match.
    nn.init.normal_(m.heads.head.weight, std=0.02)
    return m


IMAGE = (3, 224, 224)
ARCHITECTURES = {
    "resnet18": (tv.resnet18, IMAGE),
    "squeezenet1_1": (tv.squeezenet1_1, IMAGE),
    "shufflenet_v2": (tv.shufflenet_v2_x1_0, IMAGE),
    "efficientnet_b0": (tv.efficientnet_b0, IMAGE),
    "densenet121": (tv.densenet121, IMAGE),
    "googlenet": (lambda: tv.googlenet(aux_logits=False, init_weights=True), IMAGE),
    "mnasnet1_0": (tv.mnasnet1_0, IMAGE),
    "regnet_y_400mf": (tv.regnet_y_400mf, IMAGE),
    "alexnet": (tv.alexnet, IMAGE),
    "mobilenet_v3_small": (tv.mobilenet_v3_small, IMAGE),
    "convnext_tiny": (tv.convnext_tiny, IMAGE),
    "resnext50": (tv.resnext50_32x4d, IMAGE),
    "inception_v3": (lambda: tv.inception_v3(aux_logits=False, init_weights=True), (3, 299, 299)),
    "swin_t": (tv.swin_t, IMAGE),
    "vit_b_16": (vit_b_16, IMAGE),
    "lraspp": (Segmentation, IMAGE),
    "transformer_encoder": (Encoder, (64, 256)),
    "dcgan_generator": (dcgan_generator, (100, 1, 1)),
}


def export(name, folder):
    factory, shape = ARCHITECTURES[name]
    torch.manual_seed(1)
    gen = torch.Generator().manual_seed(1)
    model = factory()
    if len(shape) == 3:
        export_models.randomize_batchnorm(model, export_models.make_input(2, shape, gen), gen)
    model.eval()
    x = export_models.make_input(2, shape, gen)
    with torch.no_grad():
        y = model(x)
    data = os.path.join(folder, "test_data_set_0")
    os.makedirs(data, exist_ok=True)
    torch.onnx.export(model, x, os.path.join(folder, "model.onnx"), opset_version=13,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    onnx.save_tensor(onnx.numpy_helper.from_array(x.numpy(), "input"),
                     os.path.join(data, "input_0.pb"))
    onnx.save_tensor(onnx.numpy_helper.from_array(y.numpy(), "output"),
                     os.path.join(data, "output_0.pb"))
    return float(np.abs(y.numpy()).max())


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def check(sparsecol, folder, schedule, largest, atol, rtol):
    rc, out = run([sparsecol, "check", os.path.join(folder, "model.onnx"), folder,
                   "--schedule", schedule, "--atol", str(atol), "--rtol", str(rtol)])
    if rc == 0:
        return "pass"
    m = re.search(r"max abs ([0-9.e+-]+)", out)
    if rc == 4 and m and float(m.group(1)) <= 1e-4 * largest:
        return f"pass (to max: {float(m.group(1)) / largest:.0e})"
    return "FAIL: " + out.strip().splitlines()[-1][:200]


def compare_pruned(sparsecol, folder):
    pruned = os.path.join(folder, "s90.onnx")
    rc, out = run([sparsecol, "prune", os.path.join(folder, "model.onnx"), pruned,
                   "--sparsity", "0.9"])
    if rc != 0 and "nothing to prune" in out:
        return "agree (nothing to prune: no Conv, ConvTranspose, Gemm or MatMul weights)"
    if rc != 0:
        return "prune FAIL: " + out.strip().splitlines()[-1][:200]
    rc, out = run([sparsecol, "bench", pruned, "-s", "reference,layerwise,depthwise,onednn",
                   "-b", "3", "--time", "1", "--min-reps", "1", "--warmup", "1", "-q", "--strict"])
    diffs = re.findall(r"^\S+\s+(layerwise|depthwise|onednn)\s.*\s(\S+)$", out, re.M)
    summary = ", ".join(f"{path} {diff}" for path, diff in diffs)
    return ("agree: " if rc == 0 else "DISAGREE: ") + summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sparsecol", required=True, help="the sparsecol binary")
    parser.add_argument("--out", required=True, help="folder for the exported models")
    parser.add_argument("--models", default=",".join(ARCHITECTURES),
                        help="comma-separated names (default: all)")
    parser.add_argument("--atol", type=float, default=1e-5)
    parser.add_argument("--rtol", type=float, default=1e-3)
    args = parser.parse_args()
    failed = False
    for name in args.models.split(","):
        if name not in ARCHITECTURES:
            parser.error(f"unknown model '{name}' (known: {', '.join(ARCHITECTURES)})")
        folder = os.path.join(args.out, name)
        largest = export(name, folder)
        results = {s: check(args.sparsecol, folder, s, largest, args.atol, args.rtol)
                   for s in ("reference", "layerwise", "depthwise", "onednn")}
        pruned = compare_pruned(args.sparsecol, folder)
        failed = failed or any(r.startswith("FAIL") for r in results.values())
        failed = failed or not pruned.startswith("agree")
        print(f"{name}: largest |output| {largest:.3g}; " +
              "; ".join(f"{s} {r}" for s, r in results.items()) + f"; pruned 90%: {pruned}",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
