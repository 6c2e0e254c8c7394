#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of tests/fuzz (clang + ASan/UBSan, the `fuzz` preset).
#
# Usage:
#   scripts/fuzz.sh ci [SECONDS]               every target SECONDS (default 20) from its
#                                              committed corpus; the fuzz stage of scripts/test.sh
#   scripts/fuzz.sh long [SECONDS] [TARGET...] each target (default: all) SECONDS (default 600)
#                                              in turn, its corpus growing in build/fuzz/corpus/<t>
#                                              and its log in build/fuzz/logs/<t>.log (the runs
#                                              docs/fuzzing.md records; use `nice -n 19`)
#   scripts/fuzz.sh build                      only build the targets
# A crash, sanitizer report, leak, timeout (-timeout=25 s per input: generous, since a starved
# machine stretches ASan's own bookkeeping; a real hang still trips it) or memory past 2 GB fails
# the run; the input that did it is saved as build/fuzz/artifacts/<target>-crash-<sha1>, and
# `build/fuzz/tests/fuzz/fuzz_<target> <file>` replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-ci}
[ $# -gt 0 ] && shift

cmake --preset fuzz >/dev/null
build=build/fuzz
read -r -a targets <<<"$(tr ';' ' ' <"$build/tests/fuzz/targets.txt")"
cmake --build --preset fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
[ "$mode" = build ] && exit 0

seconds=${1:-}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] && targets=("$@")
mkdir -p "$build/artifacts" "$build/logs"
common=(-timeout=25 -rss_limit_mb=2048 -print_final_stats=1)
# CI fuzzes from a fixed seed, so a run repeats the same mutations (up to the time limit) and a
# red CI is reproducible; long runs take a fresh seed each time to explore further.
[ "$mode" = ci ] && common+=(-seed=1)

# run_target TARGET SECONDS WORK_CORPUS LOG: new inputs go to WORK_CORPUS; the committed corpus
# is read only.
run_target() {
  local t=$1 secs=$2 work=$3 log=$4
  "$build/tests/fuzz/fuzz_$t" "${common[@]}" -max_total_time="$secs" \
    -artifact_prefix="$build/artifacts/$t-" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
}

# One line per target: executions, coverage, corpus size (from libFuzzer's final stats).
summarize() {
  local t=$1 log=$2 status=$3
  local execs cov units
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  units=$(grep -Eo 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 || true)
  printf 'fuzz %-20s %s: %s executions, %s, %s\n' "$t" "$status" "${execs:-?}" "${cov:-cov ?}" "${units:-corp ?}"
}

failed=()
for t in "${targets[@]}"; do
  case $mode in
    ci)
      work=$(mktemp -d)
      log=$(mktemp)
      if run_target "$t" "${seconds:-20}" "$work" "$log"; then
        summarize "$t" "$log" ok
      else
        summarize "$t" "$log" FAILED
        tail -60 "$log" >&2
        failed+=("$t")
      fi
      rm -rf "$work" "$log"
      ;;
    long)
      mkdir -p "$build/corpus/$t"
      log="$build/logs/$t.log"
      if run_target "$t" "${seconds:-600}" "$build/corpus/$t" "$log"; then
        summarize "$t" "$log" ok
      else
        summarize "$t" "$log" FAILED
        failed+=("$t")
      fi
      ;;
    *)
      echo "usage: scripts/fuzz.sh ci|long|build [SECONDS] [TARGET...]" >&2
      exit 2
      ;;
  esac
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "scripts/fuzz.sh: findings in ${failed[*]} (inputs in $build/artifacts)" >&2
  exit 1
fi
echo "scripts/fuzz.sh: ${#targets[@]} targets clean"
