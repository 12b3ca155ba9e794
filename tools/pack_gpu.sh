#!/usr/bin/env bash
# Builds the given Bazel targets and copies their binaries, runfiles data and the shared libraries
# the GPU machine may lack (Gloo and its dependencies, libnuma, libaio, OpenSSL's libcrypto) into
# .carry/ (ignored by git), for the device tool's `carry`. On the GPU machine: LD_LIBRARY_PATH=$PWD/.carry/lib .carry/bin/<name>
# Usage: tools/pack_gpu.sh //runtime:cuda_device_test //train:zero_train ...
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build "$@"
rm -rf .carry && mkdir -p .carry/bin .carry/lib
for t in "$@"; do
  pkg=${t#//}; pkg=${pkg%%:*}; name=${t##*:}
  cp -L "bazel-bin/$pkg/$name" .carry/bin/
done
for lib in /usr/lib/libgloo.so.0 $(ldd /usr/lib/libgloo.so.0 | awk '/=> \//{print $3}' | grep -E 'hiredis|ibverbs|libnl' ) \
           /usr/lib/x86_64-linux-gnu/libnuma.so.1 /usr/lib/x86_64-linux-gnu/libaio.so.1 /usr/lib/x86_64-linux-gnu/libcrypto.so.3; do
  cp -L "$lib" .carry/lib/
done
du -sh .carry
