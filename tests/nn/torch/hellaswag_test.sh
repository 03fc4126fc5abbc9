#!/usr/bin/env bash
# Runs tests/nn/torch/hellaswag.py: `cohort eval --task hellaswag` equals a PyTorch reference of llm.c's
# scoring (acc and acc_norm counts), on one worker and on two under cohortrun.
set -euo pipefail
here=tests/nn/torch
work="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$here" && exec /usr/bin/python3 hellaswag.py "$OLDPWD/cli/cohort" "$OLDPWD/launcher/cohortrun" "$work"
