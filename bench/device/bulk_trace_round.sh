#!/bin/bash
# Issue 10's bulk-copy decode attention traced, and issue 16's CPU prefill per op by threads
# (twenty-second session, 2026-12-06). bulk_attn_round.sh measured XSERV_CUDA_ATTN_BULK=1 on an
# H100 within noise of the cp.async forms everywhere, but could not show that the bulk form ran;
# a CUPTI trace names every kernel, template arguments included. From the repository root, as a
# request's run.sh (scripts/device_round.sh) or alone (~220 s):
#   OUT=... BUDGET=240 bash bench/device/bulk_trace_round.sh
# 1. Traces (bench/cupti_trace.cpp), base and bulk: serving Qwen3-1.7B 128 at once, and Qwen3-8B
#    batch-1 decode after 16384 tokens. Per trace: every decode-attention kernel's full name with
#    its launches and mean / total us (attn_*.txt), and scripts/cupti_steps.py's step table.
# 2. The CPU backend on the machine's Xeon with the same binary: generate_bench --profile (per-op
#    prefill and decode times) of GPT-2 f32 at 2, 8 and 16 threads and Qwen3-0.6B bf16 at 8,
#    pinned to cores 0..N-1: where the 8-thread prefill loses its scaling (1075 tok/s at 2
#    threads, 2642 at 8, 4842 at 16 on 2026-12-04's lease).
ROUND_TARGETS="xserv_cupti_trace serve_bench" ROUND_BUDGET=240
source bench/device/cuda_round_common.sh
S=/tmp/b/bench/serve_bench
TRACER=/tmp/b/bench/libxserv_cupti_trace.so
attn_kernels() {  # trace csv: the decode attention kernels by full name
  python3 - "$1" <<'PY'
import collections, csv, sys
stats = collections.defaultdict(lambda: [0, 0.0])
with open(sys.argv[1]) as f:
    for r in csv.DictReader(f):
        if r["kind"] == "kernel" and "attention" in r["name"]:
            s = stats[r["name"]]
            s[0] += 1
            s[1] += (int(r["end_ns"]) - int(r["start_ns"])) / 1e3
for name, (n, us) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
    print(f"{n:7d} launches {us / n:9.1f} us mean {us / 1e3:9.2f} ms total  {name[:220]}")
PY
}
trace() {  # label, env (comma-separated), then the command
  local label=$1 envs=$2; shift 2
  [ "$(left)" -ge 30 ] || { echo "$(ts) skip trace $label: $(left) s left"; return; }
  echo "== $(ts) trace $label [${envs//,/ }]"
  env ${envs//,/ } CUDA_INJECTION64_PATH=$TRACER XSERV_TRACE_OUT="$OUT/trace_$label.csv" timeout 60 "$@" \
    >"$OUT/trace_$label.txt" 2>&1 || echo "rc=$?"
  attn_kernels "$OUT/trace_$label.csv" >"$OUT/attn_$label.txt" 2>&1
  head -8 "$OUT/attn_$label.txt"
  gzip -f "$OUT/trace_$label.csv"
}
for v in base: bulk:XSERV_CUDA_ATTN_BULK=1; do
  n=${v%%:*}; e=${v#*:}
  trace "serve17_$n" "$e" "$S" --dummy-weights --config bench/configs/qwen3-1.7b.json --device cuda --concurrency 128
  zcat "$OUT/trace_serve17_$n.csv.gz" >/tmp/t.csv && python3 scripts/cupti_steps.py /tmp/t.csv --top 12 \
    >"$OUT/steps_serve17_$n.txt" 2>&1
  grep -E "decode-only|period" "$OUT/steps_serve17_$n.txt" | head -4
  trace "long8b_$n" "$e" "$G" --dummy-weights --config bench/configs/qwen3-8b.json --device cuda --batch 1 \
    --prompt-len 16384 --gen-len 16 --repeat 1
done
echo "== $(ts) CPU profiles"
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200
cpu_profile() {  # model, threads
  [ "$(left)" -ge 25 ] || { echo "$(ts) skip cpu $1 $2: $(left) s left"; return; }
  local last=$(( $2 - 1 )) f="$OUT/cpu_$1_t$2.txt"
  timeout 60 taskset -c "0-$last" "$G" --dummy-weights --config "bench/configs/$1.json" --device cpu --threads "$2" \
    --prompt-len 128 --gen-len 16 --repeat 2 --profile >"$f" 2>&1
  echo "$(ts) cpu $1 $2 threads: $(grep -E '^\| 1 ' "$f" | tr -s ' ')"
}
cpu_profile gpt2 2; cpu_profile gpt2 8; cpu_profile gpt2 16; cpu_profile qwen3-0.6b 8; cpu_profile gpt2 8
echo "== $(ts) done"
