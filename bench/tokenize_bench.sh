#!/usr/bin/env bash
# `cohort tokenize` (cli/tokenize_command.h) on a generated .jsonl corpus (issue 47): its speed with
# --threads 1 and --threads 2 on the same input, REPS runs of each interleaved, the median MB/s of
# each (10^6 bytes of input per second, the command's own summary line: reading, JSON, encoding and
# writing the shards) and their ratio (issue 47: >= 1.7 on 2 cores; only on a machine with two cores
# free: the load average is printed beside it), and the CPU seconds each spent per 100 MB; then its peak resident memory
# (VmHWM, from the summary line) on a SMALL_MB and a LARGE_MB input, which must stay within 50 MB of
# each other (exit 1 otherwise). The corpus: every paragraph of /usr/share/common-licenses as the
# "text" of a JSON line, numbered, repeated to the size asked; the tokenizer GPT-2's ranks from npm's
# tiktoken (tests/nn/tiktoken_gpt2.js; scripts/setup installs it).
#
#   bench/tokenize_bench.sh                          # 100 MB for speed, 10 MB and 1000 MB for memory
#   SPEED_MB=20 SMALL_MB=10 LARGE_MB=200 REPS=5 BAZEL_ARGS=--disk_cache=DIR bench/tokenize_bench.sh
#   COHORT=path/to/cohort ...                        # a built binary instead of building //cli:cohort
set -euo pipefail
cd "$(dirname "$0")/.."
SPEED_MB=${SPEED_MB:-100}
SMALL_MB=${SMALL_MB:-10}
LARGE_MB=${LARGE_MB:-1000}
REPS=${REPS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cohort=${COHORT:-}
if [ -z "$cohort" ]; then
  # shellcheck disable=SC2086  # BAZEL_ARGS: flags for the build (e.g. a --disk_cache), split on spaces
  nice -n 10 bazel build ${BAZEL_ARGS:-} //cli:cohort >"$work/build.log" 2>&1 ||
    { tail -n 20 "$work/build.log" >&2; echo "tokenize_bench.sh: build failed" >&2; exit 1; }
  cohort=bazel-bin/cli/cohort
fi
node tests/nn/tiktoken_gpt2.js ranks "$work/gpt2.tiktoken"

# The licenses' paragraphs as JSON strings, one a line (backslash, quote, tab, form feed, CR escaped).
awk 'BEGIN { RS = "" } {
  gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); gsub(/\f/, "\\f"); gsub(/\r/, "\\r"); gsub(/\n/, "\\n")
  print }' /usr/share/common-licenses/* >"$work/paragraphs"

# make_corpus MB FILE: numbered documents "Copy R, part N. <paragraph>" until FILE holds MB x 10^6 bytes.
make_corpus() {
  awk -v target="$(($1 * 1000000))" '{ p[NR] = $0 } END {
    for (r = 1; written < target; r++)
      for (i = 1; i <= NR && written < target; i++) {
        line = sprintf("{\"id\": %d, \"text\": \"Copy %d, part %d. %s\"}\n", r * NR + i, r, i, p[i])
        printf "%s", line; written += length(line)
      }
  }' "$work/paragraphs" >"$2"
}

# run_tokenize THREADS INPUT [FLAGS]: the run's summary line, whose figures the bench reads.
run_tokenize() {
  rm -rf "$work/out"
  "$cohort" tokenize --tokenizer "$work/gpt2.tiktoken" --out-dir "$work/out" --threads "$1" --progress-every 0 \
    "${@:3}" "$2" | grep '^tokenized '
}

# speed THREADS INPUT: the MB/s and the CPU seconds (user + system, all threads: the work, which a
# second thread must not grow) per 100 MB of input.
speed() {
  run_tokenize "$1" "$2" --val-tokens 100000 |
    sed -n 's/.*: \([0-9.]*\) MB\/s.*; CPU \([0-9.]*\) s.*/\1 \2/p' |
    awk -v bytes="$(stat -c %s "$2")" '{ printf "%s %.2f\n", $1, $2 * 1e8 / bytes }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

make_corpus "$SPEED_MB" "$work/speed.jsonl"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "speed: $(stat -c %s "$work/speed.jsonl") bytes of .jsonl, $REPS runs per thread count, interleaved; $(nproc) CPUs"
: >"$work/t1"
: >"$work/t2"
for _ in $(seq "$REPS"); do
  speed 1 "$work/speed.jsonl" >>"$work/t1"
  speed 2 "$work/speed.jsonl" >>"$work/t2"
done
one=$(cut -d' ' -f1 "$work/t1" | median)
two=$(cut -d' ' -f1 "$work/t2" | median)
echo "threads 1: $one MB/s (runs: $(cut -d' ' -f1 "$work/t1" | tr '\n' ' ')), CPU s per 100 MB $(cut -d' ' -f2 "$work/t1" | median)"
echo "threads 2: $two MB/s (runs: $(cut -d' ' -f1 "$work/t2" | tr '\n' ' ')), CPU s per 100 MB $(cut -d' ' -f2 "$work/t2" | median)"
echo "load average before and after: $load_before / $(cut -d' ' -f1-3 /proc/loadavg)"
awk -v a="$one" -v b="$two" 'BEGIN { printf "ratio 2/1 threads %.2f\n", b / a }'
rm -f "$work/speed.jsonl"

# peak_rss MB: the peak resident memory of a run with every CPU on MB of input (the summary line's,
# the kernel's VmHWM), in MB.
peak_rss() {
  make_corpus "$1" "$work/rss.jsonl"
  run_tokenize "$(nproc)" "$work/rss.jsonl" | sed -n 's/.*peak RSS \([0-9.]*\) MB$/\1/p'
  rm -rf "$work/out" "$work/rss.jsonl"
}
small=$(peak_rss "$SMALL_MB")
large=$(peak_rss "$LARGE_MB")
echo "peak RSS ${SMALL_MB} MB input: $small MB"
echo "peak RSS ${LARGE_MB} MB input: $large MB"
awk -v s="$small" -v l="$large" 'BEGIN { d = l - s; if (d < 0) d = -d
  printf "RSS difference %.1f MB (limit 50)\n", d; exit d > 50 }'
