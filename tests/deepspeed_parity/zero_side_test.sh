#!/usr/bin/env bash
# Bazel wrapper of zero_side_test.py (the zero side of the parity suite on the CPU).
set -euo pipefail
exec python3 tests/deepspeed_parity/zero_side_test.py tests/deepspeed_parity/zero_parity
