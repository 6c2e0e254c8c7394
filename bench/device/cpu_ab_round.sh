#!/usr/bin/env bash
# Issue 16 on the GPU machine's CPU, one round request (scripts/device_round.sh): this tree
# against a baseline (this tree with BASE_TGZ's files unpacked over it, e.g. main's versions of
# the files a branch changes) in one call: two CPU-only builds at once, the [cpu] tests, then
# generate_bench rows of both interleaved (bench/cpu_prefill_probe.sh: ROWS, 3 runs each, min /
# median / max) and a per-op prefill profile of GPT-2 at 8 threads for each.
#   OUT=... BASE_TGZ=main_files.tgz bash bench/device/cpu_ab_round.sh   (from the repository root)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device-env.sh
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
rm -rf /tmp/base && mkdir -p /tmp/base
tar --exclude=./.devdeps --exclude=./.git -cf - . | tar -xf - -C /tmp/base
tar xzmf "${BASE_TGZ:?}" -C /tmp/base
build() {  # source dir, build dir, targets...
  local src=$1 dir=$2
  shift 2
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DXSERV_CUDA=OFF -DXSERV_BUILD_TESTS=ON \
    -DXSERV_BUILD_BENCH=ON -DXSERV_BUILD_EXAMPLES=OFF && cmake --build "$dir" -j16 --target "$@"
}
build /tmp/base /tmp/bbase generate_bench >"$OUT/build_base.log" 2>&1 &
base_pid=$!
build . /tmp/b xserv_tests generate_bench >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
stamp built
/tmp/b/tests/xserv_tests "[cpu]" >"$OUT/tests.log" 2>&1
echo "tests [cpu]: rc=$? $(tail -2 "$OUT/tests.log" | tr '\n' ' ')"
wait "$base_pid" || { tail -20 "$OUT/build_base.log"; exit 1; }
stamp "tested, base built"
ROWS=${ROWS:-"this:gpt2:8:-  base:gpt2:8:-;  this:qwen3-0.6b:8:-  base:qwen3-0.6b:8:-"} \
  BUILD=/tmp/b BASE_BUILD=/tmp/bbase RUNS=${RUNS:-3} GEN_LEN=${GEN_LEN:-8} MD="$OUT/rows.md" \
  bench/cpu_prefill_probe.sh "$OUT/probe" >/dev/null 2>"$OUT/probe_err.log"
stamp "rows measured"
for t in this base; do
  b=/tmp/b; [ $t = base ] && b=/tmp/bbase
  taskset -c 0-7 $b/bench/generate_bench --dummy-weights --config bench/configs/gpt2.json --device cpu --threads 8 \
    --prompt-len 128 --gen-len 4 --repeat 1 --profile >"$OUT/profile_gpt2_8_$t.txt" 2>&1
done
stamp profiled
(cd "$OUT" && tar czf raw.tgz probe && rm -rf probe)
cat "$OUT/rows.md"
for t in this base; do
  echo "### prefill profile, GPT-2, 8 threads, $t"
  sed -n '/^profile of the prefill/,/^| all ops/p' "$OUT/profile_gpt2_8_$t.txt" | head -16
done
