#!/usr/bin/env bash
# Takes every figure of docs/BENCHMARKS.md in one go, on an otherwise idle machine:
#   bash bench/run_figures.sh [OUT_DIR]        (default: build/figures)
# Needs a Release build with benchmarks (tools/build.sh, then `cmake --build build --target
# sparsecol_bench`) and the exported models in build/models (ctest -R export_models, which also
# makes the pruned ones; bert_s90 comes from the model tests or `sparsecol prune`).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/figures}
mkdir -p "$out"
cli=build/sparsecol
models=build/models
{ date; uptime; git log --oneline -1; } >"$out/when.txt"
# Kernels: one pinned thread, dense GEMM per ISA tier (a tier this CPU lacks reports an error
# row), sparse vs dense on the same shapes (the active tier).
taskset -c 1 build/bench/sparsecol_bench \
  --benchmark_filter='BM_PeakFlops/|gemm/.*__(avx512|avx2|portable)$|spmm_(conv|linear)/.*/(dense|sparse90|sparse95)$|dwconv/' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_min_time=0.2 \
  --benchmark_out="$out/kernels.json" --benchmark_out_format=json >"$out/kernels.txt" 2>&1
# End to end: every CPU path side by side, 2 threads (model, batches, seconds per point);
# depthwise:halo is the depth-wise schedule with halo recomputation instead of rolling buffers.
for spec in "resnet50 1,16 40" "mobilenet_v2 1,16 20" "bert 1,8 40" "resnet50_s90 1,16 40" \
            "resnet50_s95 1,16 30" "mobilenet_v2_s80 1,16 20" "bert_s90 1,8 40"; do
  set -- $spec
  "$cli" bench "$models/$1.onnx" --schedule onednn,layerwise,depthwise,depthwise:halo --batch "$2" \
    --threads 2 --time "$3" --quiet --json "$out/$1.json" >"$out/$1.txt" 2>&1
done
# The depth-wise plans: bytes of intermediates to memory vs layer by layer.
for model in resnet50 mobilenet_v2 resnet50_s90; do
  for batch in 1 16; do
    "$cli" inspect "$models/$model.onnx" --plan --batch "$batch" >"$out/$model.b$batch.plan.txt" 2>&1
  done
done
date >>"$out/when.txt"
