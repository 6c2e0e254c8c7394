#!/usr/bin/env bash
# xserv-server's HTTP serving speed on the GPU machine: Qwen3-8B with random weights (real
# shapes, real tokenizer and chat template), 64 concurrent streaming chat requests through HTTP
# (bench/server_bench.py): output tok/s and TTFT p50/p99, next to the engine's own benchmark
# (bench/serve_bench, when this tree has it) on the same model and workload: 64 requests at once,
# ~128-token prompts, 128 output tokens, greedy, eos ignored. Everything in one command, because
# the GPU machine keeps nothing between calls.
#
# On the development machine first (the GPU machine reaches no package registry): fetch the
# server's Debian packages beside xserv's own into .devdeps/:
#   ../shared/device/fetch-deps.sh libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 \
#     libpcre2-posix3 libutf8proc-dev libutf8proc2 libcpp-httplib-dev libcpp-httplib0.11 \
#     nlohmann-json3-dev libssl-dev zlib1g-dev libbrotli-dev libbrotli1
# then on the GPU machine (carry .devdeps):
#   [MODEL=qwen3-8b] [SERVER_ARGS="--max-batch-tokens 512"] bash bench/server_bench.sh [CLIENTS] [GEN_TOKENS]
# (MODEL: a make_random_model.py name; SERVER_ARGS: more xserv-server options; ENGINE_BENCH=0
# skips the engine's own figure)
# Logs land in $OUT (server.txt, build.txt); the last lines printed are the result.
set -uo pipefail
clients=${1:-64}
gen=${2:-128}
name=${MODEL:-qwen3-8b}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device-env.sh
# Debian's cpp-httplib is built with OpenSSL, zlib and brotli support, so its header includes
# their headers; the carried ones live under /opt/devdeps (openssl's configuration header in the
# multiarch folder).
export CPATH=/opt/devdeps/usr/include:/opt/devdeps/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}

engine_bench=OFF targets=""
if grep -q serve_bench bench/CMakeLists.txt; then engine_bench=ON targets=serve_bench; fi
echo "== build"
t0=$(date +%s)
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DXSERV_BUILD_TESTS=OFF -DXSERV_BUILD_BENCH=$engine_bench -DXSERV_BUILD_EXAMPLES=ON >"$OUT/build.txt" 2>&1 &&
  cmake --build /tmp/b -j16 --target xserv-server $targets >>"$OUT/build.txt" 2>&1 ||
  { tail -40 "$OUT/build.txt"; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"

echo "== random $name"
model=/tmp/models/$name
[ -f "$model/config.json" ] || python3 .devdeps/tools/make_random_model.py /tmp/models "$name" || exit 1

echo "== server"
/tmp/b/examples/server/xserv-server -m "$model" --device cuda --port 0 --max-seqs "$clients" \
  --model-name "$name" ${SERVER_ARGS:-} >"$OUT/server.txt" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
port=""
ready() {  # /health answers 200 once the model is loaded
  python3 -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health')" 2>/dev/null
}
for _ in $(seq 1 600); do
  port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$OUT/server.txt" | head -1)
  [ -n "$port" ] && ready "$port" && break
  kill -0 $server 2>/dev/null || { cat "$OUT/server.txt"; exit 1; }
  sleep 1
done
grep -E "ready|listening" "$OUT/server.txt"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader

echo "== $clients concurrent streaming chat requests, $gen tokens each"
python3 bench/server_bench.py "http://127.0.0.1:$port" "$name" --clients "$clients" --gen "$gen" \
  --prompt-words 113 --rounds 2 | tee "$OUT/server_bench.txt"
kill $server; wait $server 2>/dev/null

if [ "$engine_bench" = ON ] && [ "${ENGINE_BENCH:-1}" = 1 ]; then  # ENGINE_BENCH=0: skip it
  echo "== the engine alone (bench/serve_bench): $clients requests at once, 128-token prompts, $gen out"
  /tmp/b/bench/serve_bench -m "$model" --device cuda --concurrency "$clients" --prompt-len 128 \
    --gen-len "$gen" 2>&1 | tee "$OUT/serve_bench.txt"
fi
