#!/usr/bin/env bash
# The layering check (bazel/layers.bzl): Bazel visibility lets a package depend on its own layer
# and the layers below, so a dependency pointing up the stack fails to build. Three checks:
#   layers_lower_ok     zero/layering_probe's target on comm/, runtime/ and zero/ builds (analysis)
#   layers_higher_fails its target on //engine fails with Bazel's "is not visible" error
#   layers_declared     every BUILD file outside third_party/, docs/ and testing/ takes its
#                       default_visibility from layer(...), so no package is public by accident
# Prints PASS/FAIL per check; --add-to F adds them to F's last line ("N passed, N failed...") as
# tools/check_consumer.sh does.
set -uo pipefail
cd "$(dirname "$0")/.."
add_to=""
if [ "${1:-}" = "--add-to" ]; then add_to="$2"; fi
pass=0
fail=0
check() {  # check NAME OK(0|1) DETAIL
  if [ "$2" = 0 ]; then echo "PASS: $1"; pass=$((pass + 1)); else echo "FAIL: $1: $3"; fail=$((fail + 1)); fi
}

log=$(mktemp)
bazel build --nobuild //zero/layering_probe:depends_on_a_lower_layer > "$log" 2>&1
rc=$?
check layers_lower_ok $rc "bazel build --nobuild //zero/layering_probe:depends_on_a_lower_layer failed: $(grep -m3 ERROR "$log")"

bazel build --nobuild //zero/layering_probe:depends_on_a_higher_layer > "$log" 2>&1
rc=$?
ok=1
if [ $rc -ne 0 ] && grep -q "is not visible from target '//zero/layering_probe:depends_on_a_higher_layer'" "$log"; then ok=0; fi
check layers_higher_fails $ok "zero/ depending on //engine was not refused as invisible (exit $rc): $(grep -m3 ERROR "$log")"
rm -f "$log"

undeclared=()
for b in $(git ls-files '*BUILD' | grep -v -E '^(third_party|docs|testing)/|^BUILD$|^bazel/BUILD$'); do
  grep -q 'package(default_visibility = layer("' "$b" || undeclared+=("$b")
done
check layers_declared ${#undeclared[@]} "BUILD files without package(default_visibility = layer(...)): ${undeclared[*]:-}"

if [ -n "$add_to" ]; then
  python3 - "$add_to" "$pass" "$fail" <<'PY'
import re, sys
path, p, f = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lines = open(path).read().rstrip("\n").split("\n")
m = re.match(r"^(\d+) passed, (\d+) failed(.*)$", lines[-1])
if m:
    lines[-1] = "%d passed, %d failed%s" % (int(m.group(1)) + p, int(m.group(2)) + f, m.group(3))
else:
    lines.append("%d passed, %d failed" % (p, f))
open(path, "w").write("\n".join(lines) + "\n")
PY
fi
[ $fail -eq 0 ]
