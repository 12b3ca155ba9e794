#!/usr/bin/env bash
# The formatting check (issue 22): every tracked C++/CUDA source outside third_party/ (*.cc, *.h,
# *.cu, *.cuh) is as clang-format 14 writes it with the repository's .clang-format (Google style,
# 120 columns). Prints PASS, or FAIL with the files that differ and the command that fixes them.
#   tools/check_format.sh             check; exit 1 on a difference
#   tools/check_format.sh --fix       rewrite the files that differ
#   tools/check_format.sh --add-to F  check, and add the result to F's last line
#                                     ("N passed, N failed..."), in place (tools/test.sh)
# Another clang-format major version formats some constructs differently, so without clang-format
# 14 on PATH the check is reported as skipped (and counted as skipped), not failed.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-check}"
add_to=""
if [ "$mode" = "--add-to" ]; then add_to="$2"; fi

files=$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null | grep -v '^third_party/')
result=""
if ! command -v clang-format > /dev/null; then
  result="SKIPPED: format check (no clang-format on PATH)"
elif ! clang-format --version | grep -q 'version 14\.'; then
  result="SKIPPED: format check (needs clang-format 14, found: $(clang-format --version))"
elif [ "$mode" = "--fix" ]; then
  # shellcheck disable=SC2086
  clang-format -i $files
  echo "formatted $(echo "$files" | wc -l) files"
  exit 0
else
  bad=()
  for f in $files; do
    if ! clang-format --dry-run --Werror "$f" > /dev/null 2>&1; then bad+=("$f"); fi
  done
  if [ ${#bad[@]} -eq 0 ]; then
    result="PASS: format check ($(echo "$files" | wc -l) files as clang-format writes them)"
  else
    result="FAILED: format check: ${#bad[@]} file(s) differ from clang-format's output (fix: bash tools/check_format.sh --fix): ${bad[*]}"
  fi
fi
echo "$result"
if [ -n "$add_to" ]; then
  last="$(tail -n 1 "$add_to")"
  if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)?(.*)$ ]]; then
    p=${BASH_REMATCH[1]} f=${BASH_REMATCH[2]} s=${BASH_REMATCH[4]:-0} rest=${BASH_REMATCH[5]}
    sed -i '$d' "$add_to"
    case "$result" in
      PASS*) p=$((p + 1)) ;;
      FAILED*) f=$((f + 1)); echo "$result" >> "$add_to" ;;
      SKIPPED*) s=$((s + 1)) ;;
    esac
    echo "$p passed, $f failed, $s skipped$rest" >> "$add_to"
  else
    echo "check_format.sh: the last line of $add_to is '$last', expected 'N passed, N failed'" >&2
    exit 1
  fi
fi
[[ "$result" != FAILED* ]]
