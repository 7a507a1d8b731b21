#!/usr/bin/env bash
# The main job, from nothing: install dependencies, build, export a default model (torchvision
# ResNet-50 with random weights, via Debian's PyTorch) and score a batch of inputs with it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
/usr/bin/python3 tests/models/export_models.py --out build/models --models resnet50
# 16 seeded random images, scored in batches of 8.
/usr/bin/python3 -c "import numpy as np; np.save('build/demo_images.npy', \
  np.random.default_rng(0).standard_normal((16, 3, 224, 224), dtype=np.float32))"
./build/sparsecol run build/models/resnet50.onnx --input build/demo_images.npy \
  --output build/demo_scores.npy --batch 8
