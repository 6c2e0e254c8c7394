#!/usr/bin/env bash
# Issue 16, h/cpu3 round 2 on the GPU machine's Xeon: the one-row decode GEMV that reads its W
# rows one after the other (XSERV_CPU_GEMV_SEQ: one sequential stream per thread, as
# stream_read_bench reads, instead of four rows in step) and the GEMV piece heads prefetched into
# L2 (XSERV_CPU_GEMV_HEAD), both the defaults since (HEAD on Intel), against the rules before
# (=0), interleaved in one CPU-only build: GPT-2 f32 at 8 threads (also with the L2 prefetch 64 KB
# ahead, and with 4-column groups of <= 64 KB: round 1's profile had GPT-2's down projection, 192
# KB groups, the slowest GEMV), Qwen3-0.6B bf16 at 8, Qwen3-0.6B and GPT-2 at 2, one per-op
# profile of Qwen3-0.6B's 2-thread decode step each way. The [cpu] and [golden] tests first with
# the rules before. (Round 2 ran it when both were off by default, with SEQ=1 / HEAD=1 as the
# variants: docs/benchmarks.md, issue 16, 2026-12-04.)
#   OUT=... bash bench/device/cpu_seq_round.sh        (from the repository root; BUDGET s, 170)
export BUDGET=${BUDGET:-170} B=${B:-/tmp/bcpu}
OLD=XSERV_CPU_GEMV_SEQ=0,XSERV_CPU_GEMV_HEAD=0 NOSEQ=XSERV_CPU_GEMV_SEQ=0 NOHEAD=XSERV_CPU_GEMV_HEAD=0
export ALL_ON="XSERV_CPU_GEMV_SEQ=0 XSERV_CPU_GEMV_HEAD=0"
plan() {
  for n in 2 8; do stream $n --mb 1024 --repeat 5 --prefetch both:32; done
  RUNS=4 probe g8 "$(block gpt2:8 "old:$OLD noseq:$NOSEQ nohead:$NOHEAD pf64:XSERV_CPU_GEMV_PREFETCH=both:64 g64:XSERV_CPU_GEMV_GROUP_KB=64")" 46
  RUNS=3 probe q8 "$(block qwen3-0.6b:8 "old:$OLD nohead:$NOHEAD")" 28
  RUNS=3 probe q2 "$(block qwen3-0.6b:2 "old:$OLD")" 48
  profile q2_new "" qwen3-0.6b 2
  profile q2_old "${OLD/,/ }" qwen3-0.6b 2
  RUNS=3 probe g2 "$(block gpt2:2 "old:$OLD")" 30
}
source bench/device/cpu_decode_round.sh
