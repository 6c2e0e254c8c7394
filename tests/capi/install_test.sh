#!/usr/bin/env bash
# Installs xserv from a build tree into a temporary prefix, then uses it the two ways users do:
# examples/consumer through find_package(xserv) (CMake) and examples/c/generate.c through
# pkg-config. Both are run on the embedded model when it is there.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR CC CXX CFLAGS CXXFLAGS LDFLAGS
set -euo pipefail
build=$1 src=$2 cc=$3 cxx=$4 cflags=$5 cxxflags=$6 ldflags=$7
work=$(mktemp -d /tmp/xserv-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
model=$src/examples/models/shakespeare

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in include/xserv.h include/xserv/xserv.hpp; do
  test -f "$prefix/$f" || { echo "missing $prefix/$f"; exit 1; }
done
config=$(find "$prefix" -name xservConfig.cmake)
pc=$(find "$prefix" -name xserv.pc)
test -n "$config" || { echo "no xservConfig.cmake installed"; exit 1; }
test -n "$pc" || { echo "no xserv.pc installed"; exit 1; }
test -n "$(find "$prefix" -name xservConfigVersion.cmake)" || { echo "no version file"; exit 1; }
libdir=$(dirname "$(find "$prefix" -name 'libxserv.*' | head -n1)")
# Nothing internal may be installed as a header.
if find "$prefix/include" -name '*.hpp' ! -name xserv.hpp | grep -q .; then
  echo "internal headers installed:"; find "$prefix/include" -name '*.hpp'; exit 1
fi

echo "== find_package(xserv) consumer"
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cxxflags" -DCMAKE_EXE_LINKER_FLAGS="$ldflags" \
  > "$work/consumer.log" || { cat "$work/consumer.log"; exit 1; }
cmake --build "$work/consumer" -j2

echo "== pkg-config: examples/c/generate.c"
export PKG_CONFIG_PATH=$(dirname "$pc")
pkg-config --exists xserv
# shellcheck disable=SC2046,SC2086
"$cc" -std=c99 -Wall -Wextra -pedantic -Werror $cflags "$src/examples/c/generate.c" \
  -o "$work/generate" $(pkg-config --cflags --libs xserv) $ldflags \
  "-Wl,-rpath,$(pkg-config --variable=libdir xserv)"

echo "== version"
"$work/consumer/consumer" --version
if [ -f "$model/model.safetensors" ]; then
  echo "== run on $model"
  "$work/consumer/consumer" "$model" "ROMEO:"
  "$work/generate" "$model" "JULIET:"
else
  echo "install_test: $model/model.safetensors missing; built but not run"
fi
echo "install_test: ok ($libdir)"
