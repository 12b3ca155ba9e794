#!/usr/bin/env bash
# Installs what zero needs to build, from Debian's packages only (no other network), if missing.
# Idempotent; quiet when everything is present. Needs root (or sudo) the first time.
set -euo pipefail

PACKAGES=(bazel-bootstrap bazel-platforms g++ libaio-dev nlohmann-json3-dev libgtest-dev libgmock-dev
          libgloo-dev libnuma-dev python3 cmake pkg-config)

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
