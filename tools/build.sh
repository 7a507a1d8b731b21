#!/usr/bin/env bash
# Configures and builds sparsecol in ./build (Release). Extra arguments go to CMake.
# Prints only warnings and errors.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)" 2>&1 |
  { grep -vE '^\[[0-9]+/[0-9]+\] |^ninja: no work to do' || true; }
