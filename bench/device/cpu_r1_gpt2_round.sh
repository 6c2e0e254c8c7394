#!/usr/bin/env bash
# Issue 16, thirteenth session, round 1 (h/cpu): what holds GPT-2 f32 decode at 8 threads on the
# GPU machine's Xeon below 219 tok/s. One CPU-only build; every row interleaved with main's rules.
#   - XSERV_CPU_HUGEPAGES (the round's build had default 1, so its "base" rows are huge pages on
#     and "main" sets 0; the default is 0 since, so rerunning it as is compares main with main:
#     put XSERV_CPU_HUGEPAGES=1 in the variants): host allocations of 2 MB and up on transparent
#     huge pages (CpuBackend::allocator);
#   - XSERV_CPU_GEMV_GROUP_KB=64: out_in GEMV column groups narrowed to <= 64 KB of weights
#     (GPT-2's f32 down projection: 4 columns, 48 KB, instead of 16 columns, 192 KB);
#   - XSERV_CPU_GEMV_L1_KB=12: the GEMV's L1 prefetch 12 KB ahead in its stream instead of the
#     next 4 rows (48 KB ahead for the down projection, more than the L1).
# Then the streaming-read ceiling with and without huge pages at 2, 8, 16 cores, the L3 probe with
# clflushopt, GPT-2 at 2 threads and Qwen3-0.6B at 8 against main's rules.
#   OUT=... bash bench/device/cpu_r1_gpt2_round.sh        (from the repository root, <= 150 s)
export BUDGET=${BUDGET:-140} B=${B:-/tmp/bcpu}
G64=XSERV_CPU_GEMV_GROUP_KB=64 L12=XSERV_CPU_GEMV_L1_KB=12 MAIN=XSERV_CPU_HUGEPAGES=0
export ALL_ON="XSERV_CPU_HUGEPAGES=1 $G64 $L12"
thp() { grep -h 'thp_fault_alloc\|thp_fault_fallback ' /proc/vmstat | tr '\n' ' '; }
plan() {
  for n in 8 2; do
    for h in 0 1; do stream $n --mb 1024 --repeat 5 --prefetch both:32 --huge $h; done
  done
  stream 8 --mb 480 --repeat 6 --prefetch both:32 --huge 1
  stream 8 --mb 480 --repeat 6 --prefetch both:32 --huge 1 --flush-after 200
  echo "vmstat before the decode rows: $(thp)" | tee -a "$OUT/summary.md"
  RUNS=4 probe g8 "$(block gpt2:8 "main:$MAIN group:$G64 l1:$L12 all:$G64,$L12")" 42
  echo "vmstat after g8: $(thp)" | tee -a "$OUT/summary.md"
  profile main_g8 "$MAIN" gpt2 8
  profile all_g8 "$G64 $L12" gpt2 8
  for h in 0 1; do stream 16 --mb 1024 --repeat 5 --prefetch both:32 --huge $h; done
  RUNS=3 probe g2 "$(block gpt2:2 "main:$MAIN all:$G64,$L12")" 28
  RUNS=3 probe q8 "$(block qwen3-0.6b:8 "main:$MAIN all:$G64,$L12")" 24
}
source bench/device/cpu_decode_round.sh
