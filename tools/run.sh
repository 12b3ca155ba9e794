#!/usr/bin/env bash
# The main job: installs what is missing, builds zero_train and runs it (default: CPU, 2 ranks,
# ZeRO stage 3, the byte-level LM on /usr/share/common-licenses/GPL-3). Arguments go to zero_train.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //examples:zero_train //tools:launch //tools:zero_to_fp32
exec bazel-bin/examples/zero_train "$@"
