#!/usr/bin/env bash
# The main job: installs what is missing, builds zero_llm and runs it (default: the tiny Qwen3-shaped
# transformer from scratch on the built-in corpus, CPU, 2 ranks, ZeRO stage 3; docs/llm.md).
# Arguments go to zero_llm, e.g. tools/run.sh --device cuda --preset qwen3-0.6b --seq 2048.
# The byte-level model's trainer stays available as bazel-bin/train/zero_train (docs/zero_train.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //train:zero_llm //train:zero_train //tools:launch //tools:zero_to_fp32
exec bazel-bin/train/zero_llm "$@"
