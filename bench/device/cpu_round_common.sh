# Sourced by the CPU round requests in bench/device (scripts/device_round.sh runs them): OUT (an
# empty folder for the results, default /tmp/out) made, the device's toolchain on PATH, and
# stamp MESSAGE printing the seconds since the request began.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device-env.sh
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
