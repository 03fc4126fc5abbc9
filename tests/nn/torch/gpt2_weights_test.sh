#!/usr/bin/env bash
# Runs tests/nn/torch/gpt2_weights.py (Debian's python3-torch): GPT-2 weights from HuggingFace's and
# llm.c's layouts into Cohort and out again.
set -euo pipefail
here=tests/nn/torch
work="${TEST_TMPDIR:-$(mktemp -d)}"
root=$PWD
cd "$here" && exec /usr/bin/python3 gpt2_weights.py "$root/cli/cohort" "$root/$here/gpt2_weights_worker" "$work"
