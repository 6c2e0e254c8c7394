#!/usr/bin/env bash
# Installs xserv from a build tree into a temporary prefix, then uses it the two ways users do:
# examples/consumer through find_package(xserv) (CMake) and examples/c/generate.c through
# pkg-config. Both are run on the embedded model when it is there.
# The README's own commands are run, not a copy of them: its `cmake --install` line and its
# pkg-config block (the blocks after the README comments naming this script), with this test's
# prefix for /opt/xserv and build folder for build/release, and `cc` meaning this build's C
# compiler and flags (a sanitizer build needs them at the link) with warnings as errors.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR CC CXX CFLAGS CXXFLAGS LDFLAGS
set -euo pipefail
build=$1 src=$2 cc=$3 cxx=$4 cflags=$5 cxxflags=$6 ldflags=$7
work=$(mktemp -d /tmp/xserv-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
model=$src/examples/models/shakespeare

# readme_block N: the sh block after the README's Nth comment naming install_test.sh.
readme_block() {
  awk -v n="$1" '/<!-- tests\/capi\/install_test.sh/ { seen++; next }
                 seen == n && /^```sh/ { inside = 1; next }
                 inside && /^```/ { exit }
                 inside { print }' "$src/README.md"
}
# As the README's commands would run for a user, but in $work with this test's prefix/build.
readme_commands() { sed -e "s|/opt/xserv|$prefix|g" -e "s|build/release|$build|g"; }
install_cmd=$(readme_block 1 | grep '^cmake --install' | readme_commands)
pkgconfig_cmds=$(readme_block 2 | readme_commands)
test -n "$install_cmd" || { echo "README: no cmake --install line found"; exit 1; }
test -n "$pkgconfig_cmds" || { echo "README: no pkg-config block found"; exit 1; }

echo "== README: $install_cmd"
bash -euo pipefail -c "$install_cmd" > "$work/install.log"
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

echo "== README's pkg-config commands"
printf '%s\n' "$pkgconfig_cmds"
ln -s "$src/examples" "$work/examples"
if [ ! -f "$model/model.safetensors" ]; then  # built but not run
  pkgconfig_cmds=$(printf '%s\n' "$pkgconfig_cmds" | grep -v '^\./generate')
fi
# shellcheck disable=SC2016
(cd "$work" && env -u LD_LIBRARY_PATH CC_BIN="$cc" CFLAGS_ALL="$cflags" LDFLAGS_ALL="$ldflags" bash -euo pipefail -c '
  cc() { "$CC_BIN" -Wall -Wextra -pedantic -Werror $CFLAGS_ALL "$@" $LDFLAGS_ALL; }
  '"$pkgconfig_cmds")
# The library was found through the rpath alone (no LD_LIBRARY_PATH above, no ldconfig).
readelf -d "$work/generate" | grep "R.*PATH.*$prefix" >/dev/null || { echo "generate has no rpath to $prefix"; exit 1; }

echo "== version"
"$work/consumer/consumer" --version
if [ -f "$model/model.safetensors" ]; then
  echo "== run on $model"
  "$work/consumer/consumer" "$model" "ROMEO:"
  env -u LD_LIBRARY_PATH "$work/generate" "$model" "JULIET:"
else
  echo "install_test: $model/model.safetensors missing; built but not run"
fi
echo "install_test: ok ($libdir)"
