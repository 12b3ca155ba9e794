#!/usr/bin/env bash
# Installs zero as a library into PREFIX (docs/library.md):
#   PREFIX/include/zero/zero.h            the umbrella header of the engine, and the public headers
#                                         it includes (zero/engine/engine.h, zero/runtime/status.h, ...)
#   PREFIX/include/zero/zero_models.h     the umbrella header of the models: the model seam, the Llama
#                                         model, Hugging Face directories (zero/models/..., zero/hf/...)
#   PREFIX/include/zero/version.h         ZERO_VERSION_MAJOR/MINOR/PATCH, ZERO_VERSION
#   PREFIX/lib/libzero.a                  static archive (PIC)
#   PREFIX/lib/libzero.so.X.Y.Z           shared library, SONAME libzero.so.X, links libzero.so.X
#                                         and libzero.so
#   PREFIX/lib/pkgconfig/zero.pc          pkg-config (shared); zero-static.pc (static)
#   PREFIX/lib/cmake/zero/                find_package(zero): zero::zero, zero::zero_static
# Builds //install:install_files with Bazel first (tools/setup.sh installs what is missing).
# The public headers are the umbrella headers' includes and everything they include, found by
# following their #include "dir/file.h" lines, which are rewritten to <zero/dir/file.h> so that
# -IPREFIX/include is the only include flag users need. Usage: tools/install.sh PREFIX
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: tools/install.sh PREFIX   (e.g. /usr/local or \$HOME/.local)" >&2
  exit 2
fi
mkdir -p "$1"
PREFIX="$(cd "$1" && pwd)"
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //install:install_files >&2

BIN=bazel-bin/install
VERSION="$(sed -n 's/^#define ZERO_VERSION "\(.*\)"$/\1/p' "$BIN/version.h")"
MAJOR="$(sed -n 's/^#define ZERO_VERSION_MAJOR \([0-9]*\)$/\1/p' "$BIN/version.h")"
SHARED="libzero.so.$VERSION"
SONAME="$(readelf -d "$BIN/$SHARED" | sed -n 's/.*Library soname: \[\(.*\)\]$/\1/p')"
if [ -z "$VERSION" ] || [ "$SONAME" != "libzero.so.$MAJOR" ]; then
  echo "install.sh: $BIN/version.h says version '$VERSION' (major '$MAJOR') but $BIN/$SHARED has" \
       "SONAME '$SONAME' (expected libzero.so.$MAJOR)" >&2
  exit 1
fi

# --- headers: the closure of the umbrella headers' includes -------------------------------------
UMBRELLAS=(zero.h zero_models.h)  # in install/; they include each other and version.h by <zero/...>
INC="$PREFIX/include/zero"
rm -rf "$INC"
mkdir -p "$INC"
queue=()
for u in "${UMBRELLAS[@]}"; do
  queue+=($(sed -n 's|^#include <zero/\(.*\)>$|\1|p' "install/$u" | grep -Fvx -e version.h "${UMBRELLAS[@]/#/-e}"))
done
declare -A seen=()
while ((${#queue[@]})); do
  h="${queue[0]}"
  queue=("${queue[@]:1}")
  [ -n "${seen[$h]:-}" ] && continue
  seen[$h]=1
  if [ ! -f "$h" ]; then
    echo "install.sh: public header $h (included by an umbrella header in install/ or a public header) does not exist" >&2
    exit 1
  fi
  for dep in $(sed -n 's|^#include "\([a-z_]*/[^"]*\.h\)"$|\1|p' "$h"); do queue+=("$dep"); done
  mkdir -p "$INC/$(dirname "$h")"
  sed 's|^#include "\([a-z_]*/[^"]*\.h\)"$|#include <zero/\1>|' "$h" > "$INC/$h"
  if grep -n '^#include "' "$INC/$h" >&2; then
    echo "install.sh: $h has an include that is not a \"dir/file.h\" path of the source tree" >&2
    exit 1
  fi
done
for u in "${UMBRELLAS[@]}"; do install -m 644 "install/$u" "$INC/$u"; done
install -m 644 "$BIN/version.h" "$INC/version.h"

# --- libraries ---------------------------------------------------------------------------------
LIB="$PREFIX/lib"
mkdir -p "$LIB/pkgconfig" "$LIB/cmake/zero"
rm -f "$LIB"/libzero.so*
install -m 644 "$BIN/libzero.a" "$LIB/libzero.a"
install -m 755 "$BIN/$SHARED" "$LIB/$SHARED"
ln -s "$SHARED" "$LIB/$SONAME"
ln -s "$SONAME" "$LIB/libzero.so"

# --- pkg-config and CMake package ------------------------------------------------------------
mapfile -t FLAGS < "$BIN/libzero.flags"
FLAGS_SPACED="${FLAGS[*]}"
FLAGS_LIST="$(IFS=';'; echo "${FLAGS[*]}")"
HAS_CUDA=FALSE
if grep -q -- 'cudart' "$BIN/libzero.flags"; then HAS_CUDA=TRUE; fi
subst() {
  sed -e "s|@ZERO_PREFIX@|$PREFIX|g" -e "s|@ZERO_VERSION@|$VERSION|g" -e "s|@ZERO_VERSION_MAJOR@|$MAJOR|g" \
      -e "s|@ZERO_SONAME@|$SONAME|g" -e "s|@ZERO_SHARED@|$SHARED|g" \
      -e "s|@ZERO_LINK_FLAGS@|$FLAGS_SPACED|g" -e "s|@ZERO_LINK_FLAGS_DOC@|$FLAGS_SPACED|g" \
      -e "s|@ZERO_LINK_FLAGS_LIST@|$FLAGS_LIST|g" -e "s|@ZERO_HAS_CUDA@|$HAS_CUDA|g" "$1" > "$2"
}
subst install/zero.pc.in "$LIB/pkgconfig/zero.pc"
subst install/zero-static.pc.in "$LIB/pkgconfig/zero-static.pc"
subst install/zeroConfig.cmake.in "$LIB/cmake/zero/zeroConfig.cmake"
subst install/zeroConfigVersion.cmake.in "$LIB/cmake/zero/zeroConfigVersion.cmake"

echo "installed zero $VERSION into $PREFIX ($(find "$INC" -name '*.h' | wc -l) headers; system libraries: $FLAGS_SPACED)"
