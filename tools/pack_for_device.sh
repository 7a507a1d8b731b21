#!/usr/bin/env bash
# Packs a sparsecol build to run on a machine where nothing can be installed (a rented GPU box):
# the `sparsecol` binary, the GPU tests (others by SPARSECOL_PACK_TESTS, see below), and
# every shared library they load that such a machine lacks (protobuf, ONNX, hwloc, oneDNN,
# OpenMP, fmt, libzip, libstdc++, ...), found with ldd. The CUDA toolkit and cuDNN are NOT packed: the GPU machine has its own, matched to its
# driver (the wrappers look in $CUDA_HOME, default /usr/local/cuda, and $CUDNN_LIB_DIR).
# Neither is glibc: the target must have glibc >= this machine's (Debian 12: 2.36).
#
#   tools/pack_for_device.sh BUILD_DIR [OUT_DIR]      # OUT_DIR defaults to BUILD_DIR/device-pack
#   OUT_DIR/sparsecol bench model.onnx --schedule depthwise,cuda
#   SPARSECOL_MODEL_DIR=/path/to/models OUT_DIR/sparsecol_gpu_tests
#
# Layout: OUT_DIR/bin/ the binaries (stripped copies), OUT_DIR/lib/ the libraries, and one
# wrapper script per binary in OUT_DIR/ that sets LD_LIBRARY_PATH and runs it. The pack must
# stay within 64 MiB (what the device tool carries); the script fails, listing the largest
# files, when it does not. It then checks that every library the binaries need resolves in
# lib/ or in the excluded sets, with an environment as empty as the wrapper's.
set -euo pipefail

usage() {
  echo "usage: $0 BUILD_DIR [OUT_DIR]" >&2
  exit 1
}
[[ $# -ge 1 && $# -le 2 ]] || usage
build=$(cd "$1" && pwd)
out=${2:-$build/device-pack}
limit_bytes=$((64 * 1024 * 1024))

# The test executables to pack: by default the GPU tests (models from $SPARSECOL_MODEL_DIR);
# SPARSECOL_PACK_TESTS names others that can run away from the build tree ("gpu model", "unit").
# The 64 MiB are tight: oneDNN alone is 38 MiB, and the device tool counts the working tree it
# sends with the pack (2 MiB): with the unit tests (6.9 MiB stripped, 2026-11-26) the pack came
# to 69 MiB, with the model tests too (3.6 MiB) to 62.8. Not the CLI tests (they run the build
# tree's `sparsecol` by its compiled-in path) nor the conformance tests (Debian's ONNX test
# data): they would only fail there.
candidates=("$build/sparsecol")
for name in ${SPARSECOL_PACK_TESTS:-gpu}; do
  candidates+=("$build/tests/sparsecol_${name}_tests")
done
binaries=()
for binary in "${candidates[@]}"; do
  [[ -x $binary ]] && binaries+=("$binary")
done
if [[ ${#binaries[@]} -eq 0 ]]; then
  echo "$0: no sparsecol binary or test executable in $build (build them first)" >&2
  exit 1
fi

# Present on any Linux machine (glibc), or provided by the GPU machine's CUDA install.
system_lib='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil)\.so'
cuda_lib='^(libcuda|libcudart|libcublas|libcublasLt|libcusparse|libcudnn[a-z_]*|libnvrtc|libnvJitLink|libcufft|libcurand)\.so'

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"

# Every library ldd resolves for the binaries, as "soname path" lines.
declare -A packed=()
for binary in "${binaries[@]}"; do
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    if [[ $soname =~ $system_lib || $soname =~ $cuda_lib ]]; then continue; fi
    if [[ $path == "not" ]]; then
      echo "$0: $binary needs $soname, which is not found here" >&2
      exit 1
    fi
    packed[$soname]=$path
  done < <(ldd "$binary")
done

for soname in "${!packed[@]}"; do
  cp -L "${packed[$soname]}" "$out/lib/$soname"
done
for binary in "${binaries[@]}"; do
  name=${binary##*/}
  cp "$binary" "$out/bin/$name"
  # Symbols are not needed to run; stripping roughly halves the test executables.
  strip --strip-unneeded "$out/bin/$name" 2>/dev/null || true
  cat >"$out/$name" <<EOF
#!/bin/sh
# Made by tools/pack_for_device.sh: runs bin/$name with the packed libraries first, then the
# machine's CUDA toolkit (CUDA_HOME, default /usr/local/cuda) and cuDNN (CUDNN_LIB_DIR).
case "\$0" in */*) here=\${0%/*} ;; *) here=. ;; esac
here=\$(cd "\$here" && pwd)
cuda=\${CUDA_HOME:-/usr/local/cuda}
LD_LIBRARY_PATH="\$here/lib:\$cuda/lib64:\$cuda/lib\${CUDNN_LIB_DIR:+:\$CUDNN_LIB_DIR}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "\$here/bin/$name" "\$@"
EOF
  chmod +x "$out/$name"
done

# Check: with only the wrapper's library path, every non-system, non-CUDA library resolves to
# the pack.
for binary in "$out"/bin/*; do
  while read -r soname arrow path _; do
    [[ $arrow == "=>" ]] || continue
    if [[ $soname =~ $system_lib || $soname =~ $cuda_lib ]]; then continue; fi
    if [[ $path != "$out/lib/"* ]]; then
      echo "$0: ${binary##*/}: $soname resolves to $path, not to the pack" >&2
      exit 1
    fi
  done < <(env -i LD_LIBRARY_PATH="$out/lib" /usr/bin/ldd "$binary")
done

total=$(du -sb "$out" | cut -f1)
if ((total > limit_bytes)); then
  echo "$0: $out is $((total / 1024 / 1024)) MiB, over the 64 MiB limit; largest files:" >&2
  find "$out" -type f -printf '%s %p\n' | sort -rn | head -8 >&2
  exit 1
fi
echo "packed ${#binaries[@]} binaries and ${#packed[@]} libraries into $out" \
  "($((total / 1024 / 1024)) MiB of 64)"
echo "libraries: $(cd "$out/lib" && ls | tr '\n' ' ')"
echo "not packed (expected on the GPU machine): glibc, the CUDA toolkit and cuDNN"
