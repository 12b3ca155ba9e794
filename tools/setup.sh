#!/usr/bin/env bash
# Installs what zero needs to build, if missing: Debian's packages, and where the CUDA toolkit is
# present cuDNN's C++ frontend headers (header-only, PyPI's nvidia-cudnn-frontend wheel, unpacked
# into .deps/cudnn_frontend; without them the transformer uses its own attention kernels).
# Idempotent; quiet when everything is present. Needs root (or sudo) the first time.
set -euo pipefail

PACKAGES=(bazel-bootstrap bazel-platforms g++ libaio-dev nlohmann-json3-dev libgtest-dev libgmock-dev
          libgloo-dev libnuma-dev libssl-dev python3 cmake pkg-config)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "zero setup: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" ]; then
  echo "zero setup: no CUDA toolkit found (nvcc); building the CPU engine only" >&2
fi

# cuDNN's graph API frontend (models/llama's fused attention): headers only, pinned.
CUDNN_FE_VERSION=1.32.0
cuda_home=${CUDA_PATH:-/usr/local/cuda}
fe_dir="$(cd "$(dirname "$0")/.." && pwd)/.deps/cudnn_frontend"
if [ -x "$cuda_home/bin/nvcc" ] && [ "${ZERO_DISABLE_CUDNN:-0}" != 1 ] &&
   ! grep -qs "CUDNN_FRONTEND_MINOR_VERSION 32" "$fe_dir/include/cudnn_frontend_version.h"; then
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
       "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" >&2 &&
     rm -rf "$fe_dir.new" && mkdir -p "$fe_dir.new" &&
     python3 -c 'import sys, zipfile, glob
z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])' "$tmp" "$fe_dir.new" &&
     grep -qs "CUDNN_FRONTEND_MINOR_VERSION 32" "$fe_dir.new/include/cudnn_frontend_version.h"; then
    rm -rf "$fe_dir" && mv "$fe_dir.new" "$fe_dir"
    echo "zero setup: cuDNN frontend $CUDNN_FE_VERSION headers in $fe_dir" >&2
  else
    rm -rf "$fe_dir.new"
    echo "zero setup: could not fetch nvidia-cudnn-frontend==$CUDNN_FE_VERSION from PyPI; building without" \
         "cuDNN attention (the transformer uses its own kernels)" >&2
  fi
  rm -rf "$tmp"
fi
