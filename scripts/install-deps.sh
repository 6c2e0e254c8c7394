#!/usr/bin/env bash
# Installs xserv's build dependencies from Debian packages when they are missing.
# Usage: scripts/install-deps.sh [EXTRA_PACKAGE...]   (as root, or with sudo available)
# Extra packages are for optional commands (e.g. scripts/bench-plots.sh: python3-matplotlib).
set -euo pipefail
pkgs=(cmake g++ make pkg-config libsimdjson-dev libfmt-dev catch2 libbenchmark-dev
      libpcre2-dev libutf8proc-dev libopenblas-dev python3
      # clang and its runtime libraries (libFuzzer, ASan/UBSan for clang): the fuzz stage
      # (scripts/fuzz.sh, tests/fuzz)
      clang libclang-rt-14-dev)
pkgs+=(ninja-build)  # scripts/run-demo.sh: compiles xserv-cli's sources while the library's build
pkgs+=(doxygen)  # the C API reference and its CI check (scripts/api-docs.sh, ctest capi_docs)
# xserv-server (examples/server): cpp-httplib for HTTP/1.1 + SSE, nlohmann::json to read and write
# JSON (simdjson only reads). Its Node and Chromium test stages install their own packages
# (tests/server/run_node_test.sh), so CI without them still builds and runs the rest.
pkgs+=(libcpp-httplib-dev nlohmann-json3-dev)
pkgs+=("$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
