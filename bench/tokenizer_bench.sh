#!/usr/bin/env bash
# GPT-2's tokenizer, Cohort's (nn::Tokenizer, bench/tokenizer_bench.cc) against npm's tiktoken (WASM,
# run by Node: tests/nn/tiktoken_gpt2.js), encoding the same text on one core (taskset -c $CORE) in
# one run (issue 47: Cohort must reach 1.5x tiktoken's MB/s). Both read GPT-2's ranks from npm's
# package (scripts/setup installs it), both encode the whole text (encode_ordinary) again and again
# for SECONDS; the token counts must agree. Prints both MB/s and the ratio. TEXT: the text (default:
# every file of /usr/share/common-licenses, 8 times over, about 2 MB of English).
#
#   bench/tokenizer_bench.sh
#   TEXT=corpus.txt SECONDS_EACH=10 CORE=1 BAZEL_ARGS=--disk_cache=DIR bench/tokenizer_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${SECONDS_EACH:-5}
CORE=${CORE:-0}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck disable=SC2086  # BAZEL_ARGS: flags for the build (e.g. a --disk_cache), split on spaces
nice -n 10 bazel build ${BAZEL_ARGS:-} //bench:tokenizer_bench >"$work/build.log" 2>&1 ||
  { tail -n 20 "$work/build.log" >&2; echo "tokenizer_bench.sh: build failed" >&2; exit 1; }
node tests/nn/tiktoken_gpt2.js ranks "$work/gpt2.tiktoken"
text=${TEXT:-}
if [ -z "$text" ]; then
  text=$work/licenses.txt
  for _ in 1 2 3 4 5 6 7 8; do cat /usr/share/common-licenses/*; done >"$text"
fi
echo "text: $text, $(stat -c %s "$text") bytes; one core ($CORE), $SECONDS_EACH s each"
cohort_line=$(taskset -c "$CORE" bazel-bin/bench/tokenizer_bench "$work/gpt2.tiktoken" "$text" "$SECONDS_EACH")
tiktoken_line=$(taskset -c "$CORE" node tests/nn/tiktoken_gpt2.js bench "$text" "$SECONDS_EACH")
echo "$cohort_line"
echo "$tiktoken_line"
read -r _ _ cohort_mbs _ cohort_tokens <<<"$cohort_line"
read -r _ _ tiktoken_mbs _ tiktoken_tokens <<<"$tiktoken_line"
if [ "$cohort_tokens" != "$tiktoken_tokens" ]; then
  echo "tokenizer_bench.sh: token counts differ: cohort $cohort_tokens, tiktoken $tiktoken_tokens" >&2
  exit 1
fi
awk -v c="$cohort_mbs" -v t="$tiktoken_mbs" 'BEGIN { printf "ratio cohort/tiktoken %.2f\n", c / t }'
