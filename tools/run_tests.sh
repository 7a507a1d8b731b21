#!/usr/bin/env bash
# The whole test suite, from nothing: install dependencies, build, run every test with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
bash tools/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
