#!/usr/bin/env bash
# The installed-library check (docs/library.md): installs zero into a temporary prefix with
# tools/install.sh, then checks the install as a user outside the source tree would see it:
#   headers       every installed header compiles on its own with only -IPREFIX/include
#   soname        libzero.so.X.Y.Z has SONAME libzero.so.X (X = ZERO_VERSION_MAJOR)
#   symbols       libzero.so exports namespace zero only (plus libstdc++'s own weak string
#                 members), its vtables and typeinfo included; libzero.a defines no strong global
#                 outside namespace zero
#   pkgconfig     pkg-config --modversion zero is ZERO_VERSION
#   cmake_*       examples/cmake_consumer built with CMake (find_package(zero)): the shared and the
#                 static executable each train 2 thread ranks and exit 0 (loss must fall)
#   make_*        the same with its Makefile (pkg-config), plus the 2-process run (RANK/WORLD_SIZE)
#   llama_*       examples/llama_consumer (<zero/zero_models.h>) built with CMake and with make:
#                 llama_init writes a Hugging Face directory of the "tiny" preset; each run loads
#                 it, trains ZeRO stage 3 on 2 thread ranks (loss must halve), exports the trained
#                 model and reads it back bit for bit; llama_same_bits: the shared and the static
#                 build export the same files
# Prints PASS/FAIL per check and ends with "N passed, N failed". With --add-to FILE (a file whose
# last line is tools/count_tests.py's "N passed, N failed[, N skipped]"), prints FILE with these
# checks added to its count instead: tools/test.sh folds them into the suite's total that way.
# Logs of failed steps go to stderr. Exit status 1 if a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

add_to=""
if [ "${1:-}" = "--add-to" ]; then add_to="$2"; fi

WORK="$(mktemp -d /tmp/zero_consumer.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
PREFIX="$WORK/prefix"
LOG="$WORK/log"
passed=0
failed=0
results=()

# check NAME COMMAND...: runs COMMAND with output to $LOG; a failure shows the log on stderr.
check() {
  local name="$1"
  shift
  if "$@" > "$LOG" 2>&1; then
    passed=$((passed + 1))
    results+=("PASS: consumer/$name")
  else
    failed=$((failed + 1))
    results+=("FAILED: consumer/$name")
    echo "--- consumer/$name failed: $*" >&2
    tail -n 40 "$LOG" >&2
  fi
}

check_headers() {
  local n=0
  if grep -rn '^#include "' "$PREFIX/include/zero"; then
    echo "installed headers include a quoted path (expected <zero/...> only)"
    return 1
  fi
  for h in $(cd "$PREFIX/include" && find zero -name '*.h' | sort); do
    echo "#include <$h>" > "$WORK/one_header.cc"
    (cd "$WORK" && g++ -std=c++20 -fsyntax-only -Wall -Wextra -I"$PREFIX/include" one_header.cc) ||
      { echo "$h does not compile on its own with -I$PREFIX/include"; return 1; }
    n=$((n + 1))
  done
  echo "$n headers compile alone"
}

version_field() { sed -n "s/^#define $1 \"*\([^\"]*\)\"*\$/\1/p" "$PREFIX/include/zero/version.h"; }

check_soname() {
  local so="$PREFIX/lib/libzero.so.$(version_field ZERO_VERSION)"
  local want="libzero.so.$(version_field ZERO_VERSION_MAJOR)"
  local got
  got="$(readelf -d "$so" | sed -n 's/.*Library soname: \[\(.*\)\]$/\1/p')"
  [ "$got" = "$want" ] || { echo "$so has SONAME '$got', expected '$want'"; return 1; }
  [ "$(readlink "$PREFIX/lib/libzero.so")" = "$want" ] || { echo "libzero.so does not link to $want"; return 1; }
}

ZERO_SYMBOL='^(zero::|(vtable|typeinfo|typeinfo name|VTT|guard variable) for zero::|(non-virtual|virtual) thunk to zero::)'
check_symbols() {
  local so="$PREFIX/lib/libzero.so.$(version_field ZERO_VERSION)"
  # Exported: zero's, the version node, and weak std:: members libstdc++ exports itself.
  local stray
  stray="$(nm -DC --defined-only "$so" | cut -c18- |
           grep -Ev "^[WV] std::|^A ZERO_[0-9]+\$" | cut -c3- | grep -Ev "$ZERO_SYMBOL")"
  [ -z "$stray" ] || { echo "libzero.so exports symbols outside namespace zero:"; echo "$stray" | head; return 1; }
  # ... and zero's vtables and typeinfo (a user's object of a zero class needs them at -O0).
  local what exported
  exported="$(nm -DC --defined-only "$so")"
  for what in "vtable for zero::examples::EngineGrads" "typeinfo for zero::Device"; do
    grep -qF " $what@@ZERO_0" <<< "$exported" || { echo "libzero.so does not export $what"; return 1; }
  done
  # Archive: strong globals only (weak ones are template and inline instances, merged at link);
  # nvcc's host stubs of zero's kernels are named __device_stub__ZN4zero...
  stray="$(nm -C --defined-only -g "$PREFIX/lib/libzero.a" 2>/dev/null | awk 'NF >= 3 && $2 ~ /^[TDBRGS]$/' |
           cut -c20- | grep -Ev "$ZERO_SYMBOL|^__device_stub__ZN4zero")"
  [ -z "$stray" ] || { echo "libzero.a defines globals outside namespace zero:"; echo "$stray" | head; return 1; }
}

check_pkgconfig() {
  local got
  got="$(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --modversion zero)"
  [ "$got" = "$(version_field ZERO_VERSION)" ] || { echo "pkg-config says '$got', version.h '$(version_field ZERO_VERSION)'"; return 1; }
}

# Two processes of one executable, one rank each, over a free port.
run_two_processes() {
  local exe="$1" port
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  RANK=0 WORLD_SIZE=2 MASTER_PORT="$port" "$exe" & local pid0=$!
  RANK=1 WORLD_SIZE=2 MASTER_PORT="$port" "$exe"; local rc1=$?
  wait "$pid0"; local rc0=$?
  echo "rank 0 exit $rc0, rank 1 exit $rc1"
  [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]
}

check install tools/install.sh "$PREFIX"
if [ -f "$PREFIX/include/zero/zero.h" ]; then
  check headers check_headers
  check soname check_soname
  check symbols check_symbols
  check pkgconfig check_pkgconfig
  # CMake: an out-of-tree build of the example folder, found through CMAKE_PREFIX_PATH only.
  check cmake_build bash -c "cmake -S '$ROOT/examples/cmake_consumer' -B '$WORK/cmake' -DCMAKE_PREFIX_PATH='$PREFIX' &&
                             cmake --build '$WORK/cmake'"
  check cmake_shared_run "$WORK/cmake/linear_regression"
  check cmake_static_run "$WORK/cmake/linear_regression_static"
  # Make: a copy of the folder (nothing of the source tree nearby), pkg-config only.
  cp -r "$ROOT/examples/cmake_consumer" "$WORK/make"
  rm -rf "$WORK/make/build"
  check make_build make -C "$WORK/make" ZERO_PREFIX="$PREFIX"
  check make_shared_run "$WORK/make/linear_regression"
  check make_static_run "$WORK/make/linear_regression_static"
  check make_two_processes run_two_processes "$WORK/make/linear_regression"
  # The Llama consumer: the same two builds, over a Hugging Face directory it writes itself.
  check llama_cmake_build bash -c "cmake -S '$ROOT/examples/llama_consumer' -B '$WORK/llama_cmake' \
                                     -DCMAKE_PREFIX_PATH='$PREFIX' && cmake --build '$WORK/llama_cmake'"
  check llama_init "$WORK/llama_cmake/llama_finetune" --init tiny "$WORK/hf_tiny"
  check llama_cmake_shared_run "$WORK/llama_cmake/llama_finetune" "$WORK/hf_tiny" "$WORK/hf_shared"
  check llama_cmake_static_run "$WORK/llama_cmake/llama_finetune_static" "$WORK/hf_tiny" "$WORK/hf_static"
  check llama_same_bits cmp "$WORK/hf_shared/model.safetensors" "$WORK/hf_static/model.safetensors"
  cp -r "$ROOT/examples/llama_consumer" "$WORK/llama_make"
  rm -rf "$WORK/llama_make/build"
  check llama_make_build make -C "$WORK/llama_make" ZERO_PREFIX="$PREFIX"
  check llama_make_shared_run "$WORK/llama_make/llama_finetune" "$WORK/hf_tiny" "$WORK/hf_make"
fi

if [ -n "$add_to" ]; then
  last="$(tail -n 1 "$add_to")"
  head -n -1 "$add_to"
  printf '%s\n' "${results[@]}" | grep '^FAILED'
  if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed(.*)$ ]]; then
    echo "$((BASH_REMATCH[1] + passed)) passed, $((BASH_REMATCH[2] + failed)) failed${BASH_REMATCH[3]}"
  else
    echo "check_consumer.sh: the last line of $add_to is '$last', expected 'N passed, N failed'" >&2
    echo "$passed passed, $((failed + 1)) failed"
    exit 1
  fi
else
  printf '%s\n' "${results[@]}"
  echo "$passed passed, $failed failed"
fi
[ $failed -eq 0 ]
