#!/usr/bin/env bash
# The Debian packages, tested as a user gets them: build a CPU-only Release tree configured for
# /usr, `cpack` it into libxserv0 / libxserv-dev / xserv-tools, install those with
# `apt-get install ./*.deb` (apt resolves their Debian dependencies), then build
# examples/consumer through find_package(xserv) and examples/c/generate.c through pkg-config
# against the installed files only, run both and xserv-cli on the embedded model, and remove
# the packages again (also on failure). xserv-server, when built, must be in xserv-tools and
# find its libraries (libxserv.so.0 from libxserv0).
# It changes the system (installs into /usr), so it runs only as root with apt-get present; else
# it says so and exits 0 (scripts/test.sh runs it; CI runs as root).
# Usage: scripts/test-packages.sh [BUILD_DIR]     (default build/packages)
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
build=$(realpath -m "${1:-build/packages}")
packages=(libxserv0 libxserv-dev xserv-tools)
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "test-packages: skipped (needs root and apt-get to install the packages)"
  exit 0
fi
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    echo "test-packages: $p is already installed; remove it first (apt-get purge $p)" >&2
    exit 1
  fi
done

echo "== build and cpack ($build)"
cmake --preset release -B "$build" -DXSERV_CUDA=OFF -DXSERV_BUILD_TESTS=OFF \
      -DXSERV_BUILD_BENCH=OFF -DCMAKE_INSTALL_PREFIX=/usr > /dev/null
cmake --build "$build" -j"$(nproc)"
rm -rf "$build/packages"
(cd "$build" && cpack -G DEB > cpack.log) || { cat "$build/cpack.log"; exit 1; }
debs=("$build"/packages/*.deb)
ls -l "${debs[@]}"
for p in "${packages[@]}"; do
  ls "$build"/packages/"${p}"_*.deb > /dev/null || { echo "no $p package"; exit 1; }
done
# Listings are read whole before grep: `dpkg-deb -c | grep -q` under pipefail fails at random
# when grep exits on its first match and dpkg-deb dies of the broken pipe.
list=$(dpkg-deb -c "$build"/packages/libxserv0_*.deb)
grep -q 'libxserv\.so\.0 ->' <<<"$list" || { echo "libxserv0 lacks libxserv.so.0"; exit 1; }
server=no
if [ -f "$build/examples/server/xserv-server" ]; then  # built when its dependencies are there
  server=yes
  list=$(dpkg-deb -c "$build"/packages/xserv-tools_*.deb)
  grep -q 'usr/bin/xserv-server$' <<<"$list" || { echo "xserv-tools lacks xserv-server"; exit 1; }
fi

work=$(mktemp -d /tmp/xserv-packages-test.XXXXXX)
apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -q "$@"; }
cleanup() {
  apt_get purge "${packages[@]}" > "$work/purge.log" 2>&1 || cat "$work/purge.log"
  rm -rf "$work"
}
trap cleanup EXIT
echo "== apt-get install ${debs[*]}"
apt_get install --no-install-recommends "${debs[@]}" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log"; exit 1; }

echo "== installed files"
test -f /usr/include/xserv.h
test -f /usr/include/xserv/xserv.hpp
xserv-cli --version
if [ $server = yes ] && ldd /usr/bin/xserv-server | grep 'not found' >/dev/null; then
  echo "xserv-server misses a library:"; ldd /usr/bin/xserv-server; exit 1
fi
model=$src/examples/models/shakespeare

echo "== find_package(xserv) consumer against the package"
cmake -S "$src/examples/consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$work/consumer" -j2
"$work/consumer/consumer" --version

echo "== pkg-config: examples/c/generate.c against the package"
pkg-config --modversion xserv
# shellcheck disable=SC2046
cc -std=c99 -Wall -Wextra -pedantic -Werror "$src/examples/c/generate.c" \
  $(pkg-config --cflags --libs xserv) -o "$work/generate"
# No rpath: the library is found in the system's library path.
if readelf -d "$work/generate" | grep 'RUNPATH\|RPATH' >/dev/null; then echo "unexpected rpath"; exit 1; fi

echo "== run on $model"
"$work/consumer/consumer" "$model" "ROMEO:"
"$work/generate" "$model" "JULIET:"
xserv-cli generate -m "$model" -p "ROMEO:" -n 8 --seed 1 --quiet
echo "test-packages: ok (${debs[*]##*/})"
