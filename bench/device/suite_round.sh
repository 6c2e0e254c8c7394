#!/bin/bash
# Every [cuda] test case on main, nothing else (~3 min with the build): after a change that CI
# cannot run (no GPU there), e.g. the removal of opt-in kernel paths. As a request's run.sh
# (scripts/device_round.sh) or alone: OUT=... bash bench/device/suite_round.sh
ROUND_BUDGET=${ROUND_BUDGET:-240}
source bench/device/cuda_round_common.sh
tests suite 200 "[cuda]"
grep -E "^(All tests|test cases|assertions)" "$OUT/tests_suite.txt"
