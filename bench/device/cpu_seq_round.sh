#!/usr/bin/env bash
# Issue 16, h/cpu3 round 2 on the GPU machine's Xeon: the one-row decode GEMV that reads its W
# rows one after the other (XSERV_CPU_GEMV_SEQ=1: one sequential stream per thread, as
# stream_read_bench reads, instead of four rows in step) and the GEMV piece heads prefetched into
# L2 (XSERV_CPU_GEMV_HEAD=1), against the defaults, interleaved in one CPU-only build: GPT-2 f32
# at 8 threads (also SEQ with the L2 prefetch 64 KB ahead, and with 4-column groups of <= 64 KB:
# round 1's profile had GPT-2's down projection, 192 KB groups, the slowest GEMV) and Qwen3-0.6B
# bf16 at 8, Qwen3-0.6B and GPT-2 at 2 (round 1's table had Qwen3-0.6B at 2 threads at 78% of the
# 2-core streaming ceiling), one per-op profile of Qwen3-0.6B's 2-thread decode step each way.
# The [cpu] and [golden] tests first with both switches on.
#   OUT=... bash bench/device/cpu_seq_round.sh        (from the repository root; <= 188 s)
export BUDGET=${BUDGET:-188} B=${B:-/tmp/bcpu}
SEQ=XSERV_CPU_GEMV_SEQ=1 HEAD=XSERV_CPU_GEMV_HEAD=1
export ALL_ON="$SEQ $HEAD"
plan() {
  for n in 2 8; do stream $n --mb 1024 --repeat 5 --prefetch both:32; done
  RUNS=4 probe g8 "$(block gpt2:8 "seq:$SEQ head:$HEAD seq_head:$SEQ,$HEAD seq_pf64:$SEQ,XSERV_CPU_GEMV_PREFETCH=both:64 seq_g64:$SEQ,XSERV_CPU_GEMV_GROUP_KB=64")" 46
  RUNS=3 probe q8 "$(block qwen3-0.6b:8 "seq:$SEQ seq_head:$SEQ,$HEAD")" 28
  RUNS=3 probe q2 "$(block qwen3-0.6b:2 "seq:$SEQ")" 48
  profile q2_base "" qwen3-0.6b 2
  profile q2_seq "$SEQ" qwen3-0.6b 2
  RUNS=3 probe g2 "$(block gpt2:2 "seq:$SEQ")" 30
}
source bench/device/cpu_decode_round.sh
