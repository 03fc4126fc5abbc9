#!/usr/bin/env bash
# The whole path of a language-model user, text to trained model to text, in C++ (issue 47): the
# commands docs/gpt.md shows first, on a small text with a tokenizer this test makes:
#   cohort tokenize (a .jsonl of documents) -> cohortrun 2 workers cohort train (--tokenizer takes the
#   vocab; --eval-every, --sample-every) -> cohort export --format hf -> cohort generate --prompt TEXT.
# Each step's output is checked: the shards, evaluations at step 0 and every N steps with the loss
# falling, samples as text, the export's files, and a greedy continuation in the corpus's words.
set -euo pipefail
cohort="$PWD/cli/cohort"
cohortrun="$PWD/launcher/cohortrun"
make_tokenizer="$PWD/tests/cli/make_bpe_tokenizer.py"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/lm_whole_path.XXXXXX")"
export COHORT_SHM_DIR="$work/shm"
mkdir -m 700 "$COHORT_SHM_DIR"
cd "$work"

fail() {
  echo "lm_whole_path_test: $*" >&2
  exit 1
}
expect() {  # expect FILE REGEX WHAT
  grep -Eq "$2" "$1" || { cat "$1" >&2; fail "$3: no line matches '$2' in $1"; }
}

# 400 documents of short sentences, as the "text" of JSON lines (FineWeb's and TinyStories' form).
/usr/bin/python3 - <<'PY'
import json, random
random.seed(1)
subjects = ["the cat", "a dog", "my friend", "the old man", "our teacher"]
verbs = ["sees", "likes", "follows", "finds"]
objects = ["the river", "a red ball", "the garden", "an open door"]
with open("corpus.jsonl", "w") as f:
    for _ in range(400):
        text = " ".join(f"{random.choice(subjects)} {random.choice(verbs)} {random.choice(objects)}."
                        for _ in range(random.randint(3, 8)))
        f.write(json.dumps({"id": len(text), "text": text[0].upper() + text[1:]}) + "\n")
PY
vocab=$(/usr/bin/python3 "$make_tokenizer" corpus.jsonl tokenizer.tiktoken 40)

# 1. Text to token shards.
"$cohort" tokenize --tokenizer tokenizer.tiktoken corpus.jsonl --out-dir data/stories --val-tokens 3000 >tokenize.log
expect tokenize.log '^val: [0-9]+ tokens in 1 shard: data/stories/stories_val_000000.bin$' "tokenize"
expect tokenize.log '^train: [0-9]+ tokens in 1 shard: data/stories/stories_train_000001.bin$' "tokenize"

# 2. Train on 2 workers, evaluating every 40 steps and sampling every 80.
"$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode allreduce \
  --model gpt:layers=2,heads=2,dim=64,ctx=32 --tokenizer tokenizer.tiktoken \
  --data 'tokens:data/stories/stories_train_*.bin' --test-data 'tokens:data/stories/stories_val_*.bin' \
  --optimizer adamw --lr 0.003 --batch-size 8 --max-steps 160 \
  --eval-every 40 --eval-batches 2 --sample-every 80 --sample-prompt "The cat" --log-every-steps 40 \
  --checkpoint out/stories.st --metrics out/metrics.jsonl --progress-every 0 >train.log 2>&1 ||
  { cat train.log >&2; fail "cohort train failed"; }
expect train.log "gpt:layers=2,heads=2,dim=64,ctx=32,vocab=$vocab " "the vocab from --tokenizer"
for step in 0 40 80 120 160; do
  expect train.log "^\[rank 0\] eval step $step \(epoch [0-9]+\): test_loss [0-9.]+ " "an evaluation at step $step"
done
expect train.log '^\[rank 0\] sample at step 80 \(32 tokens\): ' "a sample at step 80"
expect train.log '^\[rank 0\] sample at step 160 \(32 tokens\): .*(sees|likes|follows|finds)' "a sample in words"
expect train.log '^\[rank 0\] step 160/160 \| loss [0-9.]+ \| lr [0-9.e-]+ \| norm [0-9.]+ \| [0-9.]+ ms/step \| [0-9]+ tokens/s \| MFU [0-9.]+%$' \
  "the step line"
first=$(sed -nE 's/^\[rank 0\] eval step 0 .*test_loss ([0-9.]+) .*/\1/p' train.log)
last=$(sed -nE 's/^\[rank 0\] eval step 160 .*test_loss ([0-9.]+) .*/\1/p' train.log)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 1.5 && b < a / 3) }' || fail "the test loss went from $first to $last"
expect out/metrics.jsonl '"type":"eval"' "the evaluations in the metrics"

# 3. Take it to HuggingFace's format.
"$cohort" export out/stories.st out/hf --format hf >export.log
[ -s out/hf/model.safetensors ] && [ -s out/hf/config.json ] || fail "export wrote no model.safetensors and config.json"

# 4. Text in, text out: a greedy continuation of a prompt, in the corpus's words, with no warning
#    (the tokenizer is the one the checkpoint records).
"$cohort" generate --checkpoint out/hf --tokenizer tokenizer.tiktoken --prompt "The old man" --tokens 24 --top-k 1 \
  >generate.out 2>generate.err || { cat generate.err >&2; fail "cohort generate failed"; }
[ ! -s generate.err ] || { cat generate.err >&2; fail "generate wrote to stderr"; }
text=$(cat generate.out)
[[ "$text" == "The old man "* ]] || fail "the continuation does not start with the prompt: '$text'"
grep -Eq '^The old man (sees|likes|follows|finds) (the river|a red ball|the garden|an open door)\.' generate.out ||
  fail "the continuation is not the corpus's kind of sentence: '$text'"
echo "lm_whole_path_test: passed (vocab $vocab, test loss $first -> $last): $text"
rm -rf "$work"
