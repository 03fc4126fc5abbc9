#!/usr/bin/env bash
# Runs tests/nn/torch/load_checkpoint.py: a Cohort GPT checkpoint loads into PyTorch and gives
# `cohort eval`'s test loss. The text: 20 KB of sentences written here.
set -euo pipefail
here=tests/nn/torch
work="${TEST_TMPDIR:-$(mktemp -d)}"
/usr/bin/python3 - "$work/text.txt" <<'PY'
import random, sys
random.seed(3)
words = "the a cat dog sees likes river garden door song morning small old quiet red opens finds".split()
with open(sys.argv[1], "w") as f:
    while f.tell() < 20000:
        f.write(" ".join(random.choice(words) for _ in range(random.randint(4, 9))) + ".\n")
PY
cd "$here" && exec /usr/bin/python3 load_checkpoint.py "$OLDPWD/cli/cohort" "$work/text.txt" "$work"
