#!/usr/bin/env bash
# bench/tokenize_bench.sh on tiny inputs (2 MB for speed, 1 MB and 3 MB for memory, one run each), so
# that the script keeps working: it must finish and print every figure. The figures themselves are the
# bench's to judge on a quiet machine (docs/gpt.md, "Tokenizing a corpus"); only the memory limit,
# which the script enforces itself, is checked here too.
set -euo pipefail
out=$(COHORT="$PWD/cli/cohort" SPEED_MB=2 SMALL_MB=1 LARGE_MB=3 REPS=1 bench/tokenize_bench.sh)
echo "$out"
for pattern in '^threads 1: [0-9.]+ MB/s' '^threads 2: [0-9.]+ MB/s' '^ratio 2/1 threads [0-9.]+$' \
  '^peak RSS 1 MB input: [0-9.]+ MB$' '^peak RSS 3 MB input: [0-9.]+ MB$' '^RSS difference [0-9.]+ MB'; do
  if ! grep -Eq "$pattern" <<<"$out"; then
    echo "tokenize_bench_test: no line matches '$pattern'" >&2
    exit 1
  fi
done
