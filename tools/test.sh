#!/usr/bin/env bash
# The whole test suite: builds every target (CUDA ones too where the toolkit is present) and runs
# every test that needs no GPU, then the formatting check (tools/check_format.sh), the layering
# check (tools/check_layers.sh) and the installed-library check (tools/check_consumer.sh). Ends
# with "N passed, N failed" counting gtest cases and the consumer checks (a test target that
# crashed or timed out without a report counts as one failure).
# Usage: tools/test.sh [extra bazel test flags]
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

bazel build --keep_going //... "$@"
build_rc=$?
bazel test --keep_going //... --test_tag_filters=-gpu --build_tests_only "$@"
test_rc=$?
# Count only the targets of this run (stale reports of removed tests are ignored).
bazel query 'tests(//...) except attr(tags, "gpu", tests(//...))' 2>/dev/null > /tmp/zero_test_targets.$$
python3 tools/count_tests.py bazel-testlogs /tmp/zero_test_targets.$$ > /tmp/zero_test_count.$$
count_rc=$?
# The formatting check (tools/check_format.sh: clang-format 14 with .clang-format), one more count.
bash tools/check_format.sh --add-to /tmp/zero_test_count.$$ > /dev/null
format_rc=$?
# The layering rules (tools/check_layers.sh: bazel/layers.bzl's visibility refuses a dependency
# that points up the stack), three more checks.
bash tools/check_layers.sh --add-to /tmp/zero_test_count.$$
layers_rc=$?
# The installed library (tools/install.sh into a temporary prefix, examples/cmake_consumer and llama_consumer built
# with CMake and make, run): its checks are added to the count, whose line stays last.
bash tools/check_consumer.sh --add-to /tmp/zero_test_count.$$
consumer_rc=$?
rm -f /tmp/zero_test_targets.$$ /tmp/zero_test_count.$$
if [ $build_rc -ne 0 ]; then echo "build of //... failed (exit $build_rc)" >&2; exit 1; fi
if [ $test_rc -ne 0 ] || [ $count_rc -ne 0 ] || [ $consumer_rc -ne 0 ] || [ $format_rc -ne 0 ] ||
   [ $layers_rc -ne 0 ]; then exit 1; fi
