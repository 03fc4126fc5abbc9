#!/usr/bin/env bash
# What --trace costs (issue 18 asks for throughput within 2% of the run without it, local and 2-worker
# allreduce): bench/compare_flags.sh with `--trace FILE` (every rank's spans, the epoch's time
# report, the merged trace written at the end, inside the measured wall time but not the epoch's
# samples/s) against the same run without it. `step_ms`, `comm_ms` and `barrier_ms` of the traced
# side's report are printed beside the figures. What the flag costs when off is compare_commits.sh's.
#
#   REPS=5 bench/compare_trace.sh             # MODES="local allreduce" unless given
MODES=${MODES:-"local allreduce"} FLAGS="--trace {work}/trace.json" LABEL=traced SHOW="step_ms comm_ms barrier_ms" \
  exec "$(dirname "$0")/compare_flags.sh"
