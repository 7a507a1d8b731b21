#!/usr/bin/env bash
# Installs the Debian 12 packages sparsecol needs to build, test and export its test models.
# Idempotent and quiet: does nothing (and prints nothing) when everything is installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev ocl-icd-opencl-dev  # oneDNN's CMake config requires OpenCL (a Recommends of libdnnl-dev)
  libhwloc-dev hwloc-nox libeigen3-dev
  libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata
  libcli11-dev nlohmann-json3-dev libfmt-dev libzip-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-onnx python3-torch python3-torchvision python3-numpy
  clang-14 libclang-rt-14-dev libomp-14-dev  # .ci/run: libFuzzer, and TSan with OpenMP
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
